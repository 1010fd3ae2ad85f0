//! The τ² study's run directory and report: hand-built episode and compile
//! logs with numbers worked out by hand, the resume rules, the command
//! line's refusals, and (with the data) a run on the random-weight engine
//! fixture end to end.

mod engine_common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use statebench::backend::{Message, Role, Usage};
use statebench::rundir::log::Log;
use statebench::rundir::Identity;
use statebench::tau2::compile::Agreement;
use statebench::tau2::episode::Limits;
use statebench::tau2::reader::ReceiptReader;
use statebench::tau2::report::{self, pass_hat_k, Report};
use statebench::tau2::rules::RuleSet;
use statebench::tau2::rules::{MatcherRead, ToRead};
use statebench::tau2::study::{self, CompileRecord, Manifest, RuleSource, Tau2Config};
use statebench::tau2::task::TaskFile;
use statebench::tau2::{Arm, CallRecord, EpisodeRecord, Reading, Reward, Termination};

const TASKS: [&str; 6] = ["a", "b", "c", "d", "e", "f"];

fn config(arms: &[Arm]) -> Tau2Config {
    Tau2Config {
        task_file: TaskFile::Current,
        data_sha256: BTreeMap::from([("tasks.json".to_string(), "00".to_string())]),
        arms: arms.to_vec(),
        trials: 2,
        tasks: TASKS.iter().map(|t| t.to_string()).collect(),
        compiles: 3,
        rules: RuleSource::Compiled,
        seed: 7,
        limits: Limits::default(),
        user_model: None,
        receipts: ReceiptReader::Lexical,
        matcher: None,
        tau2_src_sha256: BTreeMap::new(),
    }
}

fn rec(task: &str, arm: Arm, trial: u32, reward: f64) -> EpisodeRecord {
    EpisodeRecord {
        task_id: task.into(),
        arm,
        trial,
        seed: 1,
        rules: arm.uses_rules().then_some(0),
        termination: Termination::UserStop,
        messages: vec![Message::new(Role::System, "policy")],
        calls: Vec::new(),
        reward: Reward {
            reward,
            db_match: Some(reward == 1.0),
            communicated: Vec::new(),
        },
        agent_usage: Usage {
            prompt_tokens: 100,
            completion_tokens: 10,
            ..Usage::default()
        },
        user_usage: Usage {
            prompt_tokens: 50,
            completion_tokens: 5,
            ..Usage::default()
        },
        agent_turns: 3,
        secs: 2.0,
        error: None,
        readings: Vec::new(),
        cut: Vec::new(),
    }
}

fn write_call(executed: bool, refused_by: &[&str], violates: &[&str]) -> CallRecord {
    CallRecord {
        name: "cancel_reservation".into(),
        arguments: serde_json::json!({"reservation_id": "ABC123"}),
        write: true,
        executed,
        error: false,
        refused_by: refused_by.iter().map(|s| s.to_string()).collect(),
        violates: violates.iter().map(|s| s.to_string()).collect(),
    }
}

/// Outcomes by task, (trial 0, trial 1): raw passes 5 of 12, gate 9 of 12;
/// on the same (task, trial) raw alone passes once (b, trial 0) and gate
/// alone five times (b/1, c/0, c/1, d/0, e/1). Shown repeats raw.
const RAW: [(u8, u8); 6] = [(1, 1), (1, 0), (0, 0), (0, 0), (0, 0), (1, 1)];
const GATE: [(u8, u8); 6] = [(1, 1), (0, 1), (1, 1), (1, 0), (0, 1), (1, 1)];

fn episodes(arm: Arm, outcomes: &[(u8, u8); 6]) -> Vec<EpisodeRecord> {
    let mut out = Vec::new();
    for (task, (t0, t1)) in TASKS.iter().zip(outcomes) {
        out.push(rec(task, arm, 0, f64::from(*t0)));
        out.push(rec(task, arm, 1, f64::from(*t1)));
    }
    out
}

/// A run directory with the hand-built logs; returns its manifest.
fn hand_built(dir: &Path) -> Manifest {
    let manifest = Manifest::new(
        study::FORMAT,
        config(&[Arm::Raw, Arm::Shown, Arm::Gate]),
        Identity::Scripted {
            agent: "hand-built".into(),
        },
    );
    manifest.create_or_check(dir, &[]).unwrap();
    let hash = manifest.config_hash();
    let mut raw = episodes(Arm::Raw, &RAW);
    // c/0 earns a partial reward: no success, but it counts in the mean.
    raw[4].reward.reward = 0.5;
    // d/0 ran a write the reference forbids; e/1 tried one that was held back.
    raw[6]
        .calls
        .push(write_call(true, &[], &["cancellation_eligibility"]));
    raw[9]
        .calls
        .push(write_call(false, &[], &["cancellation_eligibility"]));
    raw[9].termination = Termination::MaxSteps;
    let shown = episodes(Arm::Shown, &RAW);
    let mut gate = episodes(Arm::Gate, &GATE);
    gate[5].calls.push(write_call(
        false,
        &["cancellation_eligibility"],
        &["cancellation_eligibility"],
    ));
    gate[5]
        .calls
        .push(write_call(false, &["explicit_confirmation"], &[]));

    let log = Log::open(&dir.join(study::EPISODES), 1, &hash).unwrap();
    // A failed model call for gate a/0, replaced by its finished line below.
    let mut failed = rec("a", Arm::Gate, 0, 0.0);
    failed.termination = Termination::BackendError;
    failed.error = Some("the forward pass failed".into());
    log.append([&failed], false).unwrap();
    log.append(&raw, false).unwrap();
    log.append(&shown, false).unwrap();
    log.append(&gate, false).unwrap();
    // A second finished line of raw f/1 (a rerun): counted once.
    log.append([&raw[11]], false).unwrap();
    // A key that only failed.
    let mut only_failed = rec("f", Arm::Gate, 2, 0.0);
    only_failed.termination = Termination::BackendError;
    let log2 = Log::open(&dir.join(study::EPISODES), 2, &hash).unwrap();
    log2.append([&only_failed], true).unwrap();
    // A line of another configuration: raw c/1 passing. Never counted.
    let other = Log::open(&dir.join(study::EPISODES), 2, "0123456789abcdef").unwrap();
    other.append([&rec("c", Arm::Raw, 1, 1.0)], true).unwrap();
    manifest
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

#[test]
fn pass_hat_k_is_the_ratio_of_binomials() {
    assert_eq!(pass_hat_k(3, 4, 1), Some(0.75));
    // C(2,2)/C(4,2) = 1/6; C(3,2)/C(4,2) = 3/6; C(3,3)/C(4,3) = 1/4.
    assert!(close(pass_hat_k(2, 4, 2).unwrap(), 1.0 / 6.0));
    assert!(close(pass_hat_k(3, 4, 2).unwrap(), 0.5));
    assert!(close(pass_hat_k(3, 4, 3).unwrap(), 0.25));
    assert_eq!(pass_hat_k(1, 4, 2), Some(0.0));
    assert_eq!(pass_hat_k(4, 4, 4), Some(1.0));
    assert_eq!(pass_hat_k(0, 0, 1), None);
    assert_eq!(pass_hat_k(2, 3, 4), None, "fewer trials than k");
}

#[test]
fn the_report_of_a_hand_built_log_has_the_numbers_worked_out_by_hand() {
    let tmp = tempfile::tempdir().unwrap();
    hand_built(tmp.path());
    let r = Report::read(tmp.path()).unwrap();
    assert_eq!(r.finished, 36, "3 arms × 6 tasks × 2 trials");
    assert_eq!(r.unfinished, 1);
    assert_eq!(r.duplicates, 1);

    let arm = |a: Arm| r.arms.iter().find(|s| s.arm == a).unwrap();
    let raw = arm(Arm::Raw);
    assert_eq!((raw.episodes, raw.tasks), (12, 6));
    // Per task c/n: 1, 1/2, 0, 0, 0, 1 → pass^1 = 2.5/6; pass^2: 1, 0, 0, 0, 0, 1.
    assert!(close(raw.pass_hat[0].unwrap(), 2.5 / 6.0));
    assert!(close(raw.pass_hat[1].unwrap(), 2.0 / 6.0));
    assert_eq!(raw.pass_hat[2], None, "two trials: no pass^3");
    assert_eq!(raw.pass_hat[3], None);
    assert_eq!((raw.pass1.k, raw.pass1.n), (5, 12));
    let (lo, hi) = statebench::stats::wilson(5, 12);
    assert!(close(raw.pass1.lo, lo) && close(raw.pass1.hi, hi));
    // Wilson's 95% interval of 5/12, by hand: 0.1933 to 0.6805.
    assert!((raw.pass1.lo - 0.1933).abs() < 1e-3 && (raw.pass1.hi - 0.6805).abs() < 1e-3);
    assert!(close(raw.mean_reward.unwrap(), 5.5 / 12.0));
    assert_eq!((raw.wrongful_writes.k, raw.wrongful_writes.n), (1, 12));
    assert!(raw.refusals.is_empty());
    assert_eq!(raw.terminations["max_steps"], 1);
    assert_eq!(raw.terminations["user_stop"], 11);
    assert!(close(raw.agent_prompt_tokens, 100.0) && close(raw.user_completion_tokens, 5.0));
    assert!(close(raw.secs, 2.0));

    let gate = arm(Arm::Gate);
    assert!(close(gate.pass_hat[0].unwrap(), 0.75));
    assert!(close(gate.pass_hat[1].unwrap(), 0.5));
    assert_eq!((gate.pass1.k, gate.pass1.n), (9, 12));
    assert_eq!(gate.wrongful_writes.k, 0, "refused writes ran nothing");
    assert_eq!(
        gate.refusals,
        BTreeMap::from([
            ("cancellation_eligibility".to_string(), 1),
            ("explicit_confirmation".to_string(), 1)
        ])
    );

    assert_eq!(r.paired.len(), 2);
    let p = r.paired.iter().find(|p| p.arm == Arm::Gate).unwrap();
    assert_eq!((p.pairs, p.raw_only, p.arm_only), (12, 1, 5));
    // Exact McNemar, b = 1, c = 5: 2 · (C(6,0) + C(6,1)) / 2^6 = 14/64.
    assert!(close(p.mcnemar_p, 14.0 / 64.0));
    // Holm over {14/64, 1}: 2 · 14/64 for the smaller, then max(that, 1).
    assert!(close(p.holm_p, 28.0 / 64.0));
    let s = r.paired.iter().find(|p| p.arm == Arm::Shown).unwrap();
    assert_eq!((s.raw_only, s.arm_only), (0, 0));
    assert!(close(s.mcnemar_p, 1.0) && close(s.holm_p, 1.0));
    assert_eq!((s.diff, s.diff_ci), (Some(0.0), Some((0.0, 0.0))));
    let (diff, (lo, hi)) = (p.diff.unwrap(), p.diff_ci.unwrap());
    assert!(close(diff, 4.0 / 12.0));
    assert!(lo < diff && diff < hi, "{p:?}");
    assert!(lo > -1.0 && hi <= 1.0);
    assert_eq!(r.bootstrap_seed, report::BOOTSTRAP_SEED);
    assert_eq!(r.bootstrap_resamples, 10_000);

    let text = r.text();
    assert!(text.contains("5/12 = 0.417"), "{text}");
    assert!(
        text.contains(&format!("seed {}", report::BOOTSTRAP_SEED)),
        "{text}"
    );
    assert!(r.md().contains("| gate |"));
    let json: serde_json::Value = serde_json::from_str(&r.json()).unwrap();
    assert_eq!(json["arms"][2]["pass1"]["k"], 9);
    assert_eq!(json["paired"][1]["arm_only"], 5);
}

#[test]
fn the_bootstrap_resamples_tasks_and_is_seeded() {
    // Two tasks: one all +1, one all 0; the interval spans the task means.
    let groups = vec![vec![1.0, 1.0], vec![0.0, 0.0]];
    let a = report::bootstrap(&groups, 3, 2000);
    assert_eq!(a, report::bootstrap(&groups, 3, 2000));
    assert!(close(a.0, 0.0) && close(a.1, 1.0), "{a:?}");
    // One group: every resample is that group.
    let one = report::bootstrap(&[vec![1.0, 0.0, 0.0, 0.0]], 3, 100);
    assert!(close(one.0, 0.25) && close(one.1, 0.25));
}

#[test]
fn a_failed_model_call_is_not_finished_and_reruns_count_once() {
    let mut failed = rec("a", Arm::Raw, 0, 0.0);
    failed.termination = Termination::BackendError;
    let e = study::choose(vec![failed.clone()]);
    assert!(!e.is_finished("a", Arm::Raw, 0));
    assert_eq!((e.finished.len(), e.unfinished.len()), (0, 1));

    let done = rec("a", Arm::Raw, 0, 1.0);
    let e = study::choose(vec![failed.clone(), done.clone(), done.clone(), failed]);
    assert!(e.is_finished("a", Arm::Raw, 0));
    assert_eq!(e.finished, vec![done]);
    assert!(e.unfinished.is_empty());
    assert_eq!(
        e.duplicates, 1,
        "the second finished line; failures are history"
    );
}

#[test]
fn compile_variance_counts_parses_and_fields_differing() {
    let tmp = tempfile::tempdir().unwrap();
    let manifest = Manifest::new(
        study::FORMAT,
        config(&[Arm::Raw, Arm::Gate]),
        Identity::ScriptedUnnamed,
    );
    manifest.create_or_check(tmp.path(), &[]).unwrap();
    let compile = |index: usize, differing: Option<&[&str]>| CompileRecord {
        index,
        seed: index as u64,
        reply: "{}".into(),
        reply_bytes: None,
        rules: differing.map(|_| RuleSet::reference()),
        error: differing.is_none().then(|| "expected a JSON object".into()),
        backend_error: None,
        agreement: differing.map(|d| Agreement {
            fields: 12,
            agreeing: 12 - d.len(),
            differing: d.iter().map(|s| s.to_string()).collect(),
        }),
        usage: Usage::default(),
    };
    let mut lost = compile(1, None);
    lost.error = None;
    lost.backend_error = Some("connection refused".into());
    let log = Log::open(
        &tmp.path().join(study::COMPILES),
        1,
        &manifest.config_hash(),
    )
    .unwrap();
    log.append(
        &[
            compile(0, Some(&["baggage.free_bags", "cancel.hours"])),
            lost,
            compile(2, Some(&["cancel.hours"])),
            compile(1, None),
        ],
        true,
    )
    .unwrap();
    let compiles = study::read_compiles(tmp.path(), &manifest).unwrap();
    assert_eq!(
        compiles.iter().map(|c| c.index).collect::<Vec<_>>(),
        [0, 1, 2]
    );
    assert_eq!(
        study::usable(&compiles)
            .iter()
            .map(|c| c.index)
            .collect::<Vec<_>>(),
        [0, 2]
    );
    let r = Report::read(tmp.path()).unwrap();
    assert_eq!((r.compiles.asked, r.compiles.parsed), (3, 2));
    assert_eq!(
        r.compiles.differing,
        BTreeMap::from([
            ("baggage.free_bags".to_string(), 1),
            ("cancel.hours".to_string(), 2)
        ])
    );
    assert_eq!(r.compiles.rows[0].agreeing, Some((10, 12)));
    assert_eq!(
        r.compiles.rows[1].error.as_deref(),
        Some("expected a JSON object")
    );
    assert!(r.text().contains("10/12 fields"));
}

use engine_common::{refused, statebench};

#[test]
fn a_missing_data_dir_is_refused_in_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let err = refused_run(&tmp.path().join("nowhere"), &out);
    assert!(
        err.contains("not a τ²-bench airline data directory")
            && err.contains("policy.md, tasks.json, db.json"),
        "{err}"
    );
    let o = statebench(&["tau2", "report", out.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.trim().lines().count() == 1,
        "{err}"
    );
    assert!(err.contains("not a statebench run directory"), "{err}");
}

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/tau2-airline")
}

/// A copy of the airline data under `tmp`, to be spoiled.
fn copy_data(tmp: &Path) -> PathBuf {
    let data = tmp.join("airline");
    std::fs::create_dir_all(&data).unwrap();
    for e in std::fs::read_dir(data_dir()).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            let to = data.join(e.file_name());
            std::fs::copy(e.path(), &to).unwrap();
            let mut perm = std::fs::metadata(&to).unwrap().permissions();
            #[allow(clippy::permissions_set_readonly_false)]
            perm.set_readonly(false);
            std::fs::set_permissions(&to, perm).unwrap();
        }
    }
    data
}

/// Edits one JSON file of a data copy.
fn edit_json(data: &Path, name: &str, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = data.join(name);
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, v.to_string()).unwrap();
}

/// Hostile data directories: a policy too large to be a prompt, gold
/// actions that name no tool or fail to replay, a reservation of a user the
/// database lacks. Each refused in one line naming the file and what is
/// wrong, before the run directory is made.
#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "needs the τ²-bench airline data at ../shared/tau2-airline"
)]
fn hostile_data_files_are_refused_in_one_line_naming_them() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");

    let data = copy_data(&tmp.path().join("a"));
    // 200 MB, sparse: refused from its size, never read.
    std::fs::File::options()
        .write(true)
        .open(data.join("policy.md"))
        .unwrap()
        .set_len(200 << 20)
        .unwrap();
    let err = refused_run(&data, &out);
    assert!(
        err.contains("policy.md") && err.contains("above the 262144-byte cap for policy.md"),
        "{err}"
    );

    let data = copy_data(&tmp.path().join("b"));
    edit_json(&data, "tasks.json", |t| {
        t[3]["evaluation_criteria"]["actions"][0]["name"] = "refund_everything".into();
    });
    let err = refused_run(&data, &out);
    assert!(
        err.contains("tasks.json")
            && err.contains("names \"refund_everything\", which is not an airline tool"),
        "{err}"
    );

    let data = copy_data(&tmp.path().join("c"));
    let mut id = String::new();
    edit_json(&data, "tasks.json", |t| {
        let task = t
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .find(|t| {
                t["evaluation_criteria"]["actions"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|a| a["name"] == "cancel_reservation"))
            })
            .unwrap();
        id = task["id"].as_str().unwrap().to_string();
        let actions = task["evaluation_criteria"]["actions"]
            .as_array_mut()
            .unwrap();
        let cancel = actions
            .iter_mut()
            .find(|a| a["name"] == "cancel_reservation")
            .unwrap();
        cancel["arguments"]["reservation_id"] = "NOSUCH".into();
    });
    let err = refused_run(&data, &out);
    assert!(
        err.contains(&format!("task {id}: gold action"))
            && err.contains(
                "(cancel_reservation) fails on the database: Error: Reservation NOSUCH not found"
            ),
        "{err}"
    );

    let data = copy_data(&tmp.path().join("d"));
    edit_json(&data, "db.json", |db| {
        db["reservations"]["M61CQM"]["user_id"] = "nobody_0000".into();
    });
    let err = refused_run(&data, &out);
    assert!(
        err.contains(
            "db.json: reservation M61CQM names user nobody_0000, who is not in the database"
        ),
        "{err}"
    );
}

/// A truncated `db.json` is refused in one line naming the file, before the
/// run directory is made.
#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "needs the τ²-bench airline data at ../shared/tau2-airline"
)]
fn a_truncated_database_is_refused_in_one_line_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let data = copy_data(tmp.path());
    let db = std::fs::read(data.join("db.json")).unwrap();
    std::fs::write(data.join("db.json"), &db[..db.len() / 2]).unwrap();
    let err = refused_run(&data, &tmp.path().join("run"));
    assert!(
        err.contains("db.json is not a valid τ² airline file") && err.contains("EOF"),
        "{err}"
    );
}

/// `tau2 run` on `data` into `out`, which must fail in one line and create
/// nothing; the line.
fn refused_run(data: &Path, out: &Path) -> String {
    let o = statebench(&[
        "tau2",
        "run",
        "--tau2-data",
        data.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(!out.exists(), "nothing is created for a refused run");
    err
}

/// Two tasks × raw, gate × one trial on the random-weight Qwen2 fixture,
/// with short limits (random weights never stop on their own), the gate on
/// the reference rules; then the same command resumes to nothing, a second
/// process and a changed setting are refused, and the report reads it.
#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "needs the τ²-bench airline data at ../shared/tau2-airline"
)]
fn a_run_on_the_engine_resumes_to_nothing_and_reports() {
    let tmp = tempfile::tempdir().unwrap();
    let model = engine_common::tiny_copy(tmp.path(), "tiny-qwen2", 16384);
    let out = tmp.path().join("run");
    let data = data_dir();
    let (model, out_s, data) = (
        model.to_str().unwrap(),
        out.to_str().unwrap(),
        data.to_str().unwrap(),
    );
    let args = |trials: &'static str| {
        vec![
            "tau2",
            "run",
            "--tau2-data",
            data,
            "--out",
            out_s,
            "--device",
            "cpu",
            "--threads",
            "1",
            "--model",
            model,
            "--arms",
            "raw,gate",
            "--trials",
            trials,
            "--tasks",
            "0,1",
            "--rules",
            "reference",
            "--max-steps",
            "4",
            "--agent-max-tokens",
            "12",
            "--user-max-tokens",
            "12",
            "--quiet",
        ]
    };
    let o = statebench(&args("1"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("4 episodes: 4 run, 0 already finished, 0 failed"),
        "{err}"
    );
    let manifest: Manifest = Manifest::read(&out).unwrap();
    assert_eq!(manifest.config.rules, RuleSource::Reference);
    let eps = study::read_episodes(&out, &manifest).unwrap();
    assert_eq!(eps.finished.len(), 4);
    assert!(eps.unfinished.is_empty());
    for r in &eps.finished {
        assert_ne!(r.termination, Termination::BackendError, "{:?}", r.error);
        assert_eq!(r.rules.is_some(), r.arm == Arm::Gate);
        assert!(r.agent_usage.completion_tokens > 0);
    }
    // Arms of one (task, trial) share its seed.
    let seed = |arm| {
        eps.finished
            .iter()
            .find(|r| r.task_id == "1" && r.arm == arm)
            .unwrap()
            .seed
    };
    assert_eq!(seed(Arm::Raw), seed(Arm::Gate));
    assert!(
        !out.join(study::COMPILES).exists(),
        "reference rules: no compile"
    );

    let o = statebench(&args("1"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("4 episodes: 0 run, 4 already finished"),
        "{err}"
    );
    assert_eq!(study::read_episodes(&out, &manifest).unwrap(), eps);

    refused(&args("2"), "config.trials is 1 there, 2 now");
    let held = statebench::rundir::DirLock::acquire(&out).unwrap();
    refused(&args("1"), "is in use by another statebench process");
    drop(held);

    let o = statebench(&["tau2", "report", out_s, "--format", "json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["finished"], 4);
    assert_eq!(r["rules"], "reference");
    assert_eq!(r["arms"][0]["episodes"], 2);
    assert_eq!(r["paired"][0]["pairs"], 2);
    let o = statebench(&["tau2", "report", out_s]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("hand-written reference"), "{text}");
}

/// One compile by the random-weight fixture in the thinking regime, where
/// the compile is not held to the rule set's schema (a constraint would
/// forbid the thinking block), so its reply is no rule set: the compile is
/// logged with its parse error, the rule arm refuses to run in one line
/// naming it, and a rerun does not ask the model again.
#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "needs the τ²-bench airline data at ../shared/tau2-airline"
)]
fn a_compile_that_does_not_parse_keeps_the_rule_arms_from_running() {
    let tmp = tempfile::tempdir().unwrap();
    let model = engine_common::tiny_copy(tmp.path(), "tiny-qwen2", 16384);
    let out = tmp.path().join("run");
    let data = data_dir();
    let args = [
        "tau2",
        "run",
        "--tau2-data",
        data.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--device",
        "cpu",
        "--threads",
        "1",
        "--model",
        model.to_str().unwrap(),
        "--arms",
        "raw,gate",
        "--tasks",
        "0",
        "--compiles",
        "1",
        "--think",
        "--quiet",
    ];
    refused(&args, "no compile of the policy parsed (compile 0: ");
    let manifest: Manifest = Manifest::read(&out).unwrap();
    let compiles = study::read_compiles(&out, &manifest).unwrap();
    assert_eq!(compiles.len(), 1);
    assert!(!compiles[0].parsed() && compiles[0].error.is_some());
    assert_eq!(compiles[0].seed, manifest.config.compile_seed(0));
    let bytes = std::fs::read(out.join(study::COMPILES)).unwrap();
    refused(&args, "the arms gate have no rules");
    assert_eq!(std::fs::read(out.join(study::COMPILES)).unwrap(), bytes);
    assert!(study::read_episodes(&out, &manifest)
        .unwrap()
        .finished
        .is_empty());
    let r = Report::read(&out).unwrap();
    assert_eq!((r.compiles.asked, r.compiles.parsed), (1, 0));
}

fn reading(
    asked: (bool, bool),
    read: (Option<bool>, Option<&str>),
    lexical: (Option<bool>, Option<&str>),
    error: bool,
) -> Reading {
    let m = |(confirmed, reason): (Option<bool>, Option<&str>)| MatcherRead {
        confirmed,
        reason: reason.map(str::to_string),
    };
    Reading {
        call: 0,
        asked: ToRead {
            confirmation: asked.0,
            reason: asked.1,
        },
        prompt: "the prompt".into(),
        reply: if error { "Yes.".into() } else { "{}".into() },
        read: m(read),
        lexical: m(lexical),
        error: error.then(|| "no JSON object in the reply".into()),
        usage: Usage {
            prompt_tokens: 200,
            completion_tokens: 10,
            ..Usage::default()
        },
    }
}

#[test]
fn the_matchers_readings_are_counted_against_the_lexical_reading() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = config(&[Arm::Raw, Arm::Gate]);
    c.compiles = 0;
    c.rules = RuleSource::Reference;
    c.receipts = ReceiptReader::Model;
    c.matcher = Some(Identity::Scripted {
        agent: "matcher".into(),
    });
    let manifest = Manifest::new(
        study::FORMAT,
        c,
        Identity::Scripted {
            agent: "hand-built".into(),
        },
    );
    manifest.create_or_check(tmp.path(), &[]).unwrap();
    let mut gate = episodes(Arm::Gate, &GATE);
    // Five readings: four confirmations (matcher yes 2, lexical yes 3,
    // agreeing on 3: both yes, both yes, matcher no against lexical yes,
    // both no — the unreadable one), and two reasons (agreeing on 1).
    gate[0].readings = vec![
        reading((true, false), (Some(true), None), (Some(true), None), false),
        reading(
            (true, true),
            (Some(true), Some("health")),
            (Some(true), Some("health")),
            false,
        ),
    ];
    gate[3].readings = vec![
        reading(
            (true, false),
            (Some(false), None),
            (Some(true), None),
            false,
        ),
        reading(
            (true, false),
            (Some(false), None),
            (Some(false), None),
            true,
        ),
        reading((false, true), (None, Some("weather")), (None, None), false),
    ];
    let raw = episodes(Arm::Raw, &RAW);
    let log = Log::open(
        &tmp.path().join(study::EPISODES),
        1,
        &manifest.config_hash(),
    )
    .unwrap();
    log.append(raw.iter().chain(&gate), true).unwrap();

    let r = Report::read(tmp.path()).unwrap();
    let m = &r.arms[1].matcher;
    assert_eq!((m.readings, m.unreadable, m.confirmations), (5, 1, 4));
    assert_eq!((m.matcher_yes, m.lexical_yes), (2, 3));
    assert_eq!(
        (m.confirmation_agreement.k, m.confirmation_agreement.n),
        (3, 4)
    );
    assert_eq!((m.reason_agreement.k, m.reason_agreement.n), (1, 2));
    assert_eq!((m.prompt_tokens, m.completion_tokens), (1000, 50));
    assert_eq!(r.arms[0].matcher.readings, 0, "raw reads nothing");
    let text = r.text();
    assert!(
        text.contains("notice and gate receipts: read by the matcher model matcher"),
        "{text}"
    );
    assert!(text.contains("Receipts read by the matcher"), "{text}");
    let row = text
        .lines()
        .find(|l| l.trim_start().starts_with("gate") && l.contains("3/4"))
        .unwrap_or_else(|| panic!("no gate row with 3/4 in\n{text}"));
    assert!(row.contains("1/2") && row.contains("1050"), "{row}");
    let json: serde_json::Value = serde_json::from_str(&r.json()).unwrap();
    assert_eq!(json["receipts"], "model");
    assert_eq!(json["arms"][1]["matcher"]["readings"], 5);

    // A run read lexically says so, and has no matcher section.
    let lexical = tempfile::tempdir().unwrap();
    hand_built(lexical.path());
    let text = Report::read(lexical.path()).unwrap().text();
    assert!(text.contains("notice and gate receipts: read lexically"));
    assert!(!text.contains("Receipts read by the matcher"));
}
