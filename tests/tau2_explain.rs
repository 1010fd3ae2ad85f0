//! `tau2 explain`: every rule's verdict on a proposed call with the
//! receipts it read, for a conversation file in τ²'s message format and for
//! a call recorded by `tau2 run`; exit 0 allow, 1 refuse, 2 error.

mod engine_common;
mod tau2_common;

use std::path::Path;

use engine_common::*;
use serde_json::{json, Value};
use statebench::tau2::db::FlightDb;
use statebench::tau2::tools;
use tau2_common::*;

/// A τ² conversation: chen_jackson_3290 asks to cancel 4WQ150, the agent
/// looks them up (the result as the tool returns it), asks, and the user
/// answers `answer`. Written as τ²'s simulation files write messages.
fn conversation(answer: &str) -> Value {
    let mut db = FlightDb::load(&data_dir().join("db.json")).expect("db.json");
    let lookup = json!({"user_id": "chen_jackson_3290"});
    let profile = tools::call(&mut db, "get_user_details", &lookup).expect("a known user");
    json!({"messages": [
        {"role": "assistant", "content": "Hi! How can I help you today?"},
        {"role": "user", "content": "Please cancel 4WQ150. My user id is chen_jackson_3290."},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "name": "get_user_details", "arguments": lookup, "requestor": "assistant"}]},
        {"role": "tool", "id": "call_1", "content": profile, "requestor": "assistant"},
        {"role": "assistant", "content": "Reservation 4WQ150 is in business, so it can be cancelled for a full refund. Shall I cancel it?"},
        {"role": "user", "content": answer},
    ]})
}

const CANCEL: &str = r#"{"name": "cancel_reservation", "arguments": {"reservation_id": "4WQ150"}}"#;

/// Runs explain; its exit status and stdout (stderr on failure).
fn explain(args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["tau2", "explain"];
    all.extend_from_slice(args);
    let o = statebench(&all);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!err.contains("panicked"), "{err}");
    (
        o.status.code().expect("an exit status"),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        err,
    )
}

fn rule<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["rule"] == name)
        .unwrap_or_else(|| panic!("no rule {name} in {v}"))
}

fn write(dir: &Path, name: &str, v: &Value) -> String {
    let path = dir.join(name);
    std::fs::write(&path, v.to_string()).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "needs the τ² airline data at ../shared/tau2-airline"
)]
fn a_conversation_file_is_judged_rule_by_rule_with_its_receipts() {
    let tmp = tempfile::tempdir().unwrap();
    let data = data_dir();
    let data = data.to_str().unwrap();
    let yes = write(
        tmp.path(),
        "yes.json",
        &conversation("Yes, please go ahead."),
    );
    let (code, out, err) = explain(&[
        "--tau2-data",
        data,
        "--conversation",
        &yes,
        "--call",
        CANCEL,
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    println!("{out}");
    assert_eq!(v["verdict"], "allow");
    assert_eq!(v["rules"].as_array().unwrap().len(), 12);
    let owner = rule(&v, "reservation_owner");
    assert_eq!(owner["verdict"], "allow");
    assert_eq!(owner["receipts"]["identified_user"], "chen_jackson_3290");
    assert_eq!(owner["receipts"]["lookup_result_at"], 3);
    let confirm = rule(&v, "explicit_confirmation");
    assert_eq!(confirm["verdict"], "allow");
    assert_eq!(confirm["receipts"]["answer_at"], 5);
    assert_eq!(confirm["receipts"]["answer_says_yes"], true);
    // Business: cancellable without a reason, so none was read.
    let cancel = rule(&v, "cancel_eligibility");
    assert_eq!(cancel["verdict"], "allow");
    assert_eq!(cancel["receipts"]["covered_reason"], Value::Null);
    assert_eq!(rule(&v, "baggage_allowance")["verdict"], "not_applicable");

    // A conditional yes refuses, exit 1, and the text names the rule.
    let iffy = write(
        tmp.path(),
        "if.json",
        &conversation("Sure, if the refund is full."),
    );
    let (code, out, _) = explain(&[
        "--tau2-data",
        data,
        "--conversation",
        &iffy,
        "--call",
        CANCEL,
    ]);
    println!("{out}");
    assert_eq!(code, 1);
    assert!(out.contains("verdict: refuse"), "{out}");
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("explicit_confirmation"))
        .unwrap();
    assert!(
        line.contains("refuse") && line.contains("does not say yes"),
        "{line}"
    );

    // A read is judged by no rule.
    let read =
        r#"{"name": "get_reservation_details", "arguments": "{\"reservation_id\": \"4WQ150\"}"}"#;
    let (code, out, _) = explain(&[
        "--tau2-data",
        data,
        "--conversation",
        &yes,
        "--call",
        read,
        "--json",
    ]);
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert!(v["rules"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["verdict"] == "not_applicable"));
}

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "needs the τ² airline data at ../shared/tau2-airline"
)]
fn bad_input_is_one_line_and_exit_two() {
    let tmp = tempfile::tempdir().unwrap();
    let data = data_dir();
    let data = data.to_str().unwrap();
    let yes = write(tmp.path(), "yes.json", &conversation("Yes."));
    let bad_role = write(
        tmp.path(),
        "role.json",
        &json!([{"role": "robot", "content": "hi"}]),
    );
    std::fs::write(tmp.path().join("trunc.json"), "[{\"role\": \"us").unwrap();
    let trunc = tmp.path().join("trunc.json");
    let trunc = trunc.to_str().unwrap();
    let cases: [(&[&str], &str); 7] = [
        (
            &["--conversation", "/no/such.json", "--call", CANCEL],
            "/no/such.json",
        ),
        (&["--conversation", trunc, "--call", CANCEL], "not JSON"),
        (
            &["--conversation", &bad_role, "--call", CANCEL],
            "message 0: unknown role \"robot\"",
        ),
        (
            &[
                "--conversation",
                &yes,
                "--call",
                "{\"name\": \"fly\", \"arguments\": {}}",
            ],
            "not one of the airline domain's tools",
        ),
        (
            &[
                "--conversation",
                &yes,
                "--call",
                "{\"name\": \"cancel_reservation\"}",
            ],
            "\"arguments\" must be an object",
        ),
        (
            &[
                "--conversation",
                &yes,
                "--call",
                CANCEL,
                "--rules",
                "compiled:0",
            ],
            "give it with --episode",
        ),
        (&["--episode", "/no/run:0:gate:0:0"], "/no/run"),
    ];
    for (extra, expect) in cases {
        let mut a = vec!["--tau2-data", data];
        a.extend_from_slice(extra);
        let (code, out, err) = explain(&a);
        assert_eq!(code, 2, "{a:?}: {err}");
        assert!(out.is_empty(), "{out}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(expect), "{a:?}: {err}");
    }
}

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "needs the τ² airline data at ../shared/tau2-airline"
)]
fn a_recorded_call_is_explained_as_the_gate_judged_it() {
    let tmp = tempfile::tempdir().unwrap();
    let calls = vec![
        (
            "get_user_details",
            json!({"user_id": "chen_jackson_3290"}).to_string(),
        ),
        (
            "cancel_reservation",
            json!({"reservation_id": "4WQ150"}).to_string(),
        ),
    ];
    let ep = endpoint(calls, None);
    let out = tmp.path().join("run");
    let out = out.to_str().unwrap();
    let data = data_dir();
    let data = data.to_str().unwrap();
    let mut args = run_args(&ep.url, out, data, "gate");
    args.extend(["--rules", "reference", "--receipts", "lexical"]);
    let o = statebench(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let line = std::fs::read_to_string(Path::new(out).join("episodes.jsonl")).unwrap();
    let record: Value = serde_json::from_str(line.lines().next().unwrap()).unwrap();
    assert_eq!(
        record["calls"][1]["refused_by"],
        json!(["explicit_confirmation"])
    );
    assert!(record.get("readings").is_none(), "read lexically");

    let step = format!("{out}:0:gate:0:1");
    let (code, text, err) = explain(&["--tau2-data", data, "--episode", &step, "--json"]);
    assert_eq!(code, 1, "{err}");
    let v: Value = serde_json::from_str(&text).unwrap();
    println!("{text}");
    assert_eq!(v["call"]["name"], "cancel_reservation");
    assert!(v["rule_set"].as_str().unwrap().starts_with("reference"));
    let refused: Vec<&str> = v["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["verdict"] == "refuse")
        .map(|r| r["rule"].as_str().unwrap())
        .collect();
    assert_eq!(refused, ["explicit_confirmation"], "as the gate refused it");
    assert_eq!(
        rule(&v, "reservation_owner")["receipts"]["identified_user"],
        "chen_jackson_3290"
    );
    // The lookup itself: a read.
    let first = format!("{out}:0:gate:0:0");
    let (code, _, err) = explain(&["--tau2-data", data, "--episode", &first]);
    assert_eq!(code, 0, "{err}");
    // Out of range, and a validation run has no compiles.
    let (code, _, err) = explain(&[
        "--tau2-data",
        data,
        "--episode",
        &format!("{out}:0:gate:0:7"),
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("the episode made 2 calls (STEP 0 to 1)"),
        "{err}"
    );
    let (code, _, err) = explain(&[
        "--tau2-data",
        data,
        "--episode",
        &step,
        "--rules",
        "compiled:0",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("the run holds 0 compiles"), "{err}");
}

/// The recorded gate run of 4WQ150's cancellation, its receipts read by a
/// matcher answering `reading`; the run directory.
fn matcher_run(tmp: &Path, reading: &'static str) -> String {
    let calls = vec![
        (
            "get_user_details",
            json!({"user_id": "chen_jackson_3290"}).to_string(),
        ),
        (
            "cancel_reservation",
            json!({"reservation_id": "4WQ150"}).to_string(),
        ),
    ];
    let ep = endpoint_reading(calls, None, Some(reading));
    let out = tmp.join("run").to_str().unwrap().to_string();
    let data = data_dir();
    let mut args = run_args(&ep.url, &out, data.to_str().unwrap(), "gate");
    args.extend(["--rules", "reference"]);
    let o = statebench(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out
}

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "needs the τ² airline data at ../shared/tau2-airline"
)]
fn a_call_judged_on_the_matchers_reading_is_explained_by_that_reading() {
    let tmp = tempfile::tempdir().unwrap();
    // The user only asked for a sum; a matcher reading a yes lets the
    // cancellation through, where the words would not.
    let out = matcher_run(
        tmp.path(),
        r#"{"agent_listed_this_action": true, "customer_reply": "yes", "reason": "none"}"#,
    );
    let manifest: Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(&out).join("manifest.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(manifest["config"]["receipts"], "model");
    assert_eq!(
        manifest["config"]["matcher"], manifest["model"],
        "the agent's model reads"
    );
    let line = std::fs::read_to_string(Path::new(&out).join("episodes.jsonl")).unwrap();
    let record: Value = serde_json::from_str(line.lines().next().unwrap()).unwrap();
    assert_eq!(record["calls"][1]["executed"], true, "{record}");
    assert_eq!(
        record["calls"][1]["violates"],
        json!(["explicit_confirmation"]),
        "the reference rules score it on the words"
    );
    let readings = record["readings"].as_array().unwrap();
    assert_eq!(readings.len(), 1);
    assert_eq!(readings[0]["call"], 1);
    assert_eq!(readings[0]["read"]["confirmed"], true);
    assert_eq!(readings[0]["lexical"]["confirmed"], false);
    assert!(readings[0]["prompt"].as_str().unwrap().contains("4WQ150"));

    let data = data_dir();
    let data = data.to_str().unwrap();
    let step = format!("{out}:0:gate:0:1");
    let (code, text, err) = explain(&["--tau2-data", data, "--episode", &step, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let receipts = &rule(&v, "explicit_confirmation")["receipts"];
    assert_eq!(receipts["read_by"], "matcher");
    assert_eq!(receipts["matcher_confirmed"], true);
    assert_eq!(
        v["reading"]["reply"],
        r#"{"agent_listed_this_action": true, "customer_reply": "yes", "reason": "none"}"#
    );
    let (code, text, _) = explain(&["--tau2-data", data, "--episode", &step]);
    assert_eq!(code, 0);
    assert!(
        text.contains("matcher's reading: confirmed true, reason none (lexical: confirmed false, reason none)"),
        "{text}"
    );
    // Read lexically, the same call is refused.
    let (code, text, _) = explain(&[
        "--tau2-data",
        data,
        "--episode",
        &step,
        "--receipts",
        "lexical",
        "--json",
    ]);
    assert_eq!(code, 1);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(rule(&v, "explicit_confirmation")["verdict"], "refuse");
    assert!(v.get("reading").is_none());

    // A conversation read by a matcher asked now (the same scripted one).
    let ep = endpoint_reading(
        Vec::new(),
        None,
        Some(r#"{"agent_listed_this_action": true, "customer_reply": "no", "reason": "none"}"#),
    );
    let path = write(
        tmp.path(),
        "yes.json",
        &conversation("Yes, please go ahead."),
    );
    let (code, text, err) = explain(&[
        "--tau2-data",
        data,
        "--conversation",
        &path,
        "--call",
        CANCEL,
        "--receipts",
        "model",
        "--endpoint",
        &ep.url,
        "--json",
    ]);
    assert_eq!(code, 1, "the matcher read no yes: {err}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["reading"]["read"]["confirmed"], false);
    assert_eq!(v["reading"]["lexical"]["confirmed"], true);
    let prompt = v["reading"]["prompt"].as_str().unwrap();
    assert!(
        prompt.contains("Yes, please go ahead.") && prompt.contains("Shall I cancel it?"),
        "{prompt}"
    );
}
