//! Hostile models, round four, on `tau2 run`: a scripted endpoint plays a
//! hostile agent (or simulator), and the run must record each reply as a
//! bounded tool error or a counted failure, keep its directory readable by
//! its own reader, resume, and exit non-zero when episodes failed.

mod engine_common;
mod tau2_common;

use std::path::Path;

use engine_common::*;
use serde_json::{json, Value};
use tau2_common::*;

fn episodes(out: &Path) -> Vec<Value> {
    std::fs::read_to_string(out.join("episodes.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn succeeds(args: &[&str]) -> String {
    let o = statebench(args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "needs the τ²-bench airline data at ../shared/tau2-airline"
)]
fn hostile_arithmetic_is_a_tool_error_and_the_run_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let deep = format!("{}1{}", "(".repeat(20_000), ")".repeat(20_000));
    let minus = format!("{}1", "-".repeat(100_000));
    let min = "(-170141183460469231731687303715884105727-1)";
    let expr = |e: &str| json!({ "expression": e }).to_string();
    let calls = vec![
        ("calculate", expr(&deep)),
        ("calculate", expr(&minus)),
        ("calculate", expr(&format!("{min}//-1"))),
        ("calculate", expr(&format!("-{min}"))),
    ];
    let ep = endpoint(calls, None);
    let out = tmp.path().join("run");
    let data = data_dir();
    let args = run_args(
        &ep.url,
        out.to_str().unwrap(),
        data.to_str().unwrap(),
        "raw",
    );
    succeeds(&args);
    let lines = episodes(&out);
    assert_eq!(lines.len(), 1);
    let calls = lines[0]["calls"].as_array().unwrap();
    let errors: Vec<bool> = calls.iter().map(|c| c["error"] == true).collect();
    assert_eq!(errors, [true, true, false, false], "{calls:?}");
    let messages = lines[0]["messages"].as_array().unwrap();
    let results: Vec<&str> = messages
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(
        results,
        [
            "Error: too many nested parentheses (<string>, line 1)",
            "Error: too many nested parentheses (<string>, line 1)",
            "1.7014118346046923e+38",
            "1.7014118346046923e+38",
        ]
    );
    // The same command finds the episode done.
    let calls_before = ep.calls.load(std::sync::atomic::Ordering::SeqCst);
    succeeds(&args);
    assert_eq!(
        ep.calls.load(std::sync::atomic::Ordering::SeqCst),
        calls_before
    );
    assert_eq!(episodes(&out).len(), 1);
}

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "needs the τ²-bench airline data at ../shared/tau2-airline"
)]
fn megabyte_arguments_are_cut_when_written_and_the_run_stays_readable() {
    let tmp = tempfile::tempdir().unwrap();
    let huge = "x".repeat(1 << 20);
    let lookup = json!({ "user_id": huge }).to_string();
    let calls: Vec<(&str, String)> = (0..12)
        .map(|_| ("get_user_details", lookup.clone()))
        .collect();
    let ep = endpoint(calls, None);
    let out = tmp.path().join("run");
    let data = data_dir();
    let args = run_args(
        &ep.url,
        out.to_str().unwrap(),
        data.to_str().unwrap(),
        "raw",
    );
    // Twelve failed lookups pass the error limit (10): the episode ends
    // there, finished.
    succeeds(&args);
    let text = std::fs::read_to_string(out.join("episodes.jsonl")).unwrap();
    let line = text.lines().next().unwrap();
    assert!(
        line.len() <= statebench::tau2::record::RECORD_CAP,
        "{} bytes",
        line.len()
    );
    let v: Value = serde_json::from_str(line).unwrap();
    assert_eq!(v["termination"], "too_many_errors");
    let cut = v["cut"].as_array().expect("the cuts are listed");
    assert!(
        cut.iter()
            .any(|c| c["at"] == "calls[0].arguments.user_id" && c["bytes"] == (1 << 20)),
        "{cut:?}"
    );
    // Its own reader reads it, and a resume finds it done.
    let report = succeeds(&["tau2", "report", out.to_str().unwrap(), "--format", "json"]);
    assert!(report.contains("too_many_errors"), "{report}");
    succeeds(&args);
    assert_eq!(episodes(&out).len(), 1);
}

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "needs the τ²-bench airline data at ../shared/tau2-airline"
)]
fn a_run_whose_episodes_all_failed_exits_non_zero() {
    let tmp = tempfile::tempdir().unwrap();
    let ep = FakeEndpoint::start(
        500,
        br#"{"error":{"message":"overloaded","type":"server_error"}}"#.to_vec(),
    );
    let out = tmp.path().join("run");
    let data = data_dir();
    let args = run_args(
        &ep.url,
        out.to_str().unwrap(),
        data.to_str().unwrap(),
        "raw",
    );
    let o = statebench(&args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("1 of 1 episodes ended in a failed model call (0 finished)"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    let lines = episodes(&out);
    assert_eq!(lines[0]["termination"], "backend_error");
}

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "needs the τ²-bench airline data at ../shared/tau2-airline"
)]
fn a_simulator_reply_of_tool_calls_alone_is_a_user_error() {
    let tmp = tempfile::tempdir().unwrap();
    let opening = completion("", &[("get_user_details", "{}".to_string())]);
    let ep = endpoint(Vec::new(), Some(opening));
    let out = tmp.path().join("run");
    let data = data_dir();
    let args = run_args(
        &ep.url,
        out.to_str().unwrap(),
        data.to_str().unwrap(),
        "raw",
    );
    succeeds(&args);
    let lines = episodes(&out);
    assert_eq!(lines[0]["termination"], "user_error", "{}", lines[0]);
    assert!(
        lines[0]["error"]
            .as_str()
            .unwrap()
            .contains("1 tool call(s) and no text"),
        "{}",
        lines[0]
    );
    assert_eq!(lines[0]["reward"]["reward"], 0.0);
    // No empty user message reached the agent.
    let messages = lines[0]["messages"].as_array().unwrap();
    assert!(!messages
        .iter()
        .any(|m| m["role"] == "user" && m["content"] == ""));
}
