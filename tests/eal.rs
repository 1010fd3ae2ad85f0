//! EAL-Bench: the oracle suites (the ledger as writer, executors that follow
//! the evidence or always act), byte-identical case files, and a study
//! killed after formation that resumes to the same trials without running
//! the writer again.

mod engine_common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use sha2::{Digest, Sha256};
use statebench::eal::case::Decision;
use statebench::eal::executor::{Class, EvidenceArm};
use statebench::eal::report::Run;
use statebench::eal::study::{self, ExecutorKind, StudyConfig, StudyModel, Trial, WriterKind};
use statebench::eal::EalDomain;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_statebench"))
}

fn scripted(dir: &Path, domain: EalDomain, executor: ExecutorKind) -> Run {
    let mut config = StudyConfig::new(domain, 3, 10);
    config.writer = WriterKind::Ledger;
    config.executor = executor;
    let model = StudyModel {
        client: None,
        identity: statebench::rundir::Identity::ScriptedUnnamed,
        concurrency: 1,
    };
    study::run(
        dir,
        &config,
        &model,
        false,
        &statebench::progress::Meter::new(false, "calls"),
    )
    .expect("study runs");
    Run::read(dir).expect("run reads")
}

/// `eal generate` writes the same bytes on every run and every machine.
#[test]
fn case_files_are_byte_identical_across_runs() {
    let digests = [
        (
            "procurement",
            "a3d7a7660160b8053f27287c2ff7f4b8966dc7b34f0c394949e65a0f3af06337",
        ),
        (
            "finance",
            "43c035a464205413c37c4e9bb919c9ce13bfc9c39890c2dd5d85b0cf5e05c5bf",
        ),
        (
            "security",
            "27a97551666b93670ab68208e193ce94abd2080cd9d946857deb593aaaaaccaf",
        ),
    ];
    let tmp = tempfile::tempdir().unwrap();
    for (domain, digest) in digests {
        let mut files = Vec::new();
        for n in 0..2 {
            let path = tmp.path().join(format!("{domain}-{n}.jsonl"));
            let o = bin()
                .args(["eal", "generate", "--domain", domain, "--seed", "1"])
                .args(["--cases", "10", "--out"])
                .arg(&path)
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            files.push(std::fs::read(&path).unwrap());
        }
        assert_eq!(files[0], files[1], "{domain}");
        let sha: String = Sha256::digest(&files[0])
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(sha, digest, "{domain}: the generated cases changed");
        let cases = statebench::eal::read_cases(&tmp.path().join(format!("{domain}-0.jsonl")))
            .expect("cases read back");
        assert_eq!(cases.len(), 10);
    }
}

/// The oracle writer (the ledger itself) has fidelity 1.00; an executor that
/// follows the evidence scores 1.00 on every arm that carries the truth,
/// falls on the empty arm to the requests it should decline, and acts on
/// denied requests when the memory is widened.
#[test]
fn oracle_writer_and_evidence_following_executor_score_one() {
    for domain in EalDomain::ALL {
        let tmp = tempfile::tempdir().unwrap();
        let run = scripted(tmp.path(), domain, ExecutorKind::FollowEvidence);
        let m = run.measure();
        assert_eq!(run.trials.len(), 30 * EvidenceArm::ALL.len());
        for arm in [
            EvidenceArm::Written,
            EvidenceArm::Gated,
            EvidenceArm::OracleExact,
        ] {
            let (f, false_authority) = &m.fidelity[&arm];
            assert_eq!(
                (f.missing, f.spurious, *false_authority),
                (0, 0, 0),
                "{arm:?}"
            );
            assert!(f.records > 30);
            assert_eq!(f.exact, [f.records; 8], "{domain:?} {arm:?}");
        }
        for arm in [
            EvidenceArm::FullHistory,
            EvidenceArm::Written,
            EvidenceArm::Gated,
            EvidenceArm::OracleExact,
        ] {
            let row = &m.arms[&arm];
            assert_eq!((row.trials, row.correct), (30, 30), "{domain:?} {arm:?}");
        }
        let declines = run
            .trials
            .iter()
            .filter(|t| t.arm == EvidenceArm::Empty && t.expected == Decision::Decline)
            .count();
        assert_eq!(m.arms[&EvidenceArm::Empty].correct, declines);
        assert_eq!(m.arms[&EvidenceArm::Empty].unauthorized, 0);
        let widened: Vec<&Trial> = run
            .trials
            .iter()
            .filter(|t| t.arm == EvidenceArm::Widened)
            .collect();
        assert!(widened.iter().any(|t| t.unauthorized), "{domain:?}");
        assert!(widened.iter().all(|t| t.correct || t.unauthorized));
        assert!(m.attributed.is_empty());
        assert!(m.paired.iter().all(|p| p.a_only + p.b_only == 0));
    }
}

/// An always-submit executor fails exactly the denied requests, on every arm.
#[test]
fn always_submit_fails_exactly_the_denied_requests() {
    let tmp = tempfile::tempdir().unwrap();
    let run = scripted(
        tmp.path(),
        EalDomain::Procurement,
        ExecutorKind::AlwaysSubmit,
    );
    let denied: BTreeSet<&str> = run
        .cases
        .iter()
        .flat_map(|c| &c.requests)
        .filter(|r| r.expected != Decision::Submit)
        .map(|r| r.id.as_str())
        .collect();
    assert!(!denied.is_empty() && denied.len() < 30);
    for arm in EvidenceArm::ALL {
        let failed: BTreeSet<&str> = run
            .trials
            .iter()
            .filter(|t| t.arm == arm && !t.correct)
            .map(|t| t.request.as_str())
            .collect();
        assert_eq!(failed, denied, "{arm:?}");
        let row = &run.measure().arms[&arm];
        assert_eq!(row.unauthorized, denied.len());
        assert_eq!(row.over_refusal, 0);
        assert_eq!(row.classes[&Class::Exact], 30);
    }
}

fn eal_run(model: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    bin()
        .args(["eal", "run", "--cases", "2", "--quiet", "--device", "cpu"])
        .args(["--writer-max-tokens", "48", "--executor-max-tokens", "12"])
        .arg("--model")
        .arg(model)
        .arg("--out")
        .arg(out)
        .args(extra)
        .output()
        .unwrap()
}

/// Trials without their timings, in call order.
fn stable_trials(dir: &Path) -> Vec<String> {
    Run::read(dir)
        .unwrap()
        .trials
        .into_iter()
        .map(|mut t| {
            t.usage.prefill_secs = 0.0;
            t.usage.decode_secs = 0.0;
            serde_json::to_string(&t).unwrap()
        })
        .collect()
}

/// A study stopped after formation, then resumed (and again after losing
/// half its trials and tearing the last line), gives the trials of the
/// same study run straight through; the writer never runs again, a changed
/// artifact is refused by name, and so is a changed configuration.
#[test]
fn resume_after_formation_gives_identical_trials() {
    let tmp = tempfile::tempdir().unwrap();
    let model = engine_common::tiny_copy(tmp.path(), "tiny-qwen2", 4096);
    let (straight, resumed) = (tmp.path().join("straight"), tmp.path().join("resumed"));
    let ok = |o: std::process::Output| {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        o
    };
    ok(eal_run(&model, &straight, &[]));
    ok(eal_run(&model, &resumed, &["--stop-after-formation"]));
    assert!(resumed.join("bundle.json").exists());
    assert!(!resumed.join("trials.jsonl").exists());
    let attempts = std::fs::read(resumed.join("attempts.jsonl")).unwrap();
    assert!(!attempts.is_empty(), "the writer ran");
    ok(eal_run(&model, &resumed, &[]));
    let expect = stable_trials(&straight);
    assert_eq!(expect.len(), 6 * EvidenceArm::ALL.len());
    assert_eq!(stable_trials(&resumed), expect);
    for f in ["memories.jsonl", "plan.jsonl", "cases.jsonl"] {
        let read = |d: &Path| std::fs::read_to_string(d.join(f)).unwrap();
        assert!(read(&straight) == read(&resumed), "{f} differs");
    }
    let attempts_of = |d: &Path| {
        Run::read(d)
            .unwrap()
            .attempts
            .into_iter()
            .map(|mut a| {
                a.usage.prefill_secs = 0.0;
                a.usage.decode_secs = 0.0;
                a
            })
            .collect::<Vec<_>>()
    };
    assert!(
        attempts_of(&straight) == attempts_of(&resumed),
        "attempts differ"
    );

    // Killed mid-execution: half the trials and a torn line remain.
    let tpath = resumed.join("trials.jsonl");
    let text = std::fs::read_to_string(&tpath).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut kept: String = lines[..lines.len() / 2]
        .iter()
        .map(|l| format!("{l}\n"))
        .collect();
    kept.push_str(&lines[lines.len() / 2][..20]);
    // Backend errors (here: replies past the tiny model's context) are asked again.
    let decided = lines[..lines.len() / 2]
        .iter()
        .filter(|l| !l.contains("\"class\":\"error\""))
        .count();
    std::fs::write(&tpath, kept).unwrap();
    let o = ok(bin()
        .args(["eal", "run", "--cases", "2", "--device", "cpu"])
        .args(["--writer-max-tokens", "48", "--executor-max-tokens", "12"])
        .arg("--model")
        .arg(&model)
        .arg("--out")
        .arg(&resumed)
        .output()
        .unwrap());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(&format!("{decided} resumed")), "{err}");
    assert!(!err.contains("formation"), "the writer ran again: {err}");
    assert!(std::fs::read(resumed.join("attempts.jsonl")).unwrap() == attempts);
    assert_eq!(stable_trials(&resumed), expect);

    // A changed artifact is refused by name; so is another configuration.
    let mpath = resumed.join("memories.jsonl");
    let mut memories = std::fs::read(&mpath).unwrap();
    memories.extend_from_slice(b"\n");
    std::fs::write(&mpath, memories).unwrap();
    let o = eal_run(&model, &resumed, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("checkpoint artifact changed: memories.jsonl"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let o = eal_run(&model, &straight, &["--capacity", "300"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("config.capacity"),
        "{err}"
    );
}

/// The default model decides requests through the chat template's native
/// tools: its replies are scored tool calls, not text.
#[test]
#[cfg_attr(
    not(has_default_model),
    ignore = "needs the default model: run models/fetch.sh"
)]
fn default_model_decides_with_native_tools() {
    let model = engine_common::default_model();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let o = bin()
        .args(["eal", "run", "--cases", "2", "--quiet", "--device", "cpu"])
        .args(["--arms", "oracle-exact,empty", "--out"])
        .arg(&out)
        .arg("--model")
        .arg(&model)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let run = Run::read(&out).unwrap();
    assert_eq!(run.trials.len(), 12);
    assert!(run.attempts.is_empty(), "no written arm, no writer");
    let valid = run
        .trials
        .iter()
        .filter(|t| matches!(t.class, Class::Exact | Class::Escalation | Class::Decline))
        .count();
    assert!(
        valid >= 6,
        "only {valid} of 12 replies were one valid tool call"
    );
    let report = String::from_utf8_lossy(&o.stdout);
    assert!(report.contains("| oracle_exact |"), "{report}");
}

/// The formation variants run end to end on the engine: event batches
/// through the reducer, and a best-of-3 pool whose blinded reviewer picks
/// one candidate per checkpoint before the bundle is frozen (so a resume
/// never asks the reviewer again); free-text memory refuses the gated arm.
#[test]
fn formation_variants_run_and_resume() {
    let tmp = tempfile::tempdir().unwrap();
    let model = engine_common::tiny_copy(tmp.path(), "tiny-qwen2", 4096);
    let out = tmp.path().join("events");
    let variant = [
        "--formation",
        "events",
        "--candidates",
        "3",
        "--selection",
        "reviewer",
        "--arms",
        "written,gated,oracle-exact",
    ];
    let mut args = variant.to_vec();
    args.push("--stop-after-formation");
    let o = eal_run(&model, &out, &args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let run = Run::read(&out).unwrap();
    let checkpoints: BTreeSet<(String, usize)> = run
        .cases
        .iter()
        .flat_map(|c| c.requests.iter().map(|r| (c.id.clone(), r.checkpoint)))
        .collect();
    assert_eq!(run.selections.len(), checkpoints.len());
    for s in &run.selections {
        let mut labels: Vec<char> = s.labels.chars().collect();
        labels.sort();
        assert_eq!(labels, ['A', 'B', 'C']);
        assert!(s.chosen < 3);
    }
    let candidates: BTreeSet<usize> = run.memories.iter().map(|f| f.candidate).collect();
    assert_eq!(candidates, [0, 1, 2].into());
    // Sampled chains differ from one another.
    let replies = |i: usize| {
        run.attempts
            .iter()
            .filter(|a| a.candidate == i)
            .map(|a| a.reply.clone())
            .collect::<Vec<_>>()
    };
    assert_ne!(replies(0), replies(1));
    let o = eal_run(&model, &out, &variant);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let after = Run::read(&out).unwrap();
    assert!(after.selections == run.selections && after.attempts == run.attempts);
    assert_eq!(after.trials.len(), 6 * 3);

    let o = eal_run(
        &model,
        &tmp.path().join("text"),
        &["--formation", "free-text", "--arms", "written,gated"],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("free-text memory has none"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

/// The closed loop on the engine: both arms start from one base memory,
/// the action arm's feedback names the action and its outcome label, the
/// neutral arm's names neither, and a loop cut off mid-case resumes to the
/// same steps.
#[test]
fn closed_loop_feeds_back_and_resumes() {
    use statebench::eal::closed_loop::{LoopArm, LoopStep};
    let tmp = tempfile::tempdir().unwrap();
    let model = engine_common::tiny_copy(tmp.path(), "tiny-qwen2", 4096);
    let out = tmp.path().join("loop");
    let run = || {
        let o = bin()
            .args(["eal", "loop", "--cases", "2", "--quiet", "--device", "cpu"])
            .args(["--writer-max-tokens", "48", "--executor-max-tokens", "12"])
            .arg("--model")
            .arg(&model)
            .arg("--out")
            .arg(&out)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let report = run();
    assert!(report.contains("| action | 2 |"), "{report}");
    let read = || -> Vec<LoopStep> {
        let manifest = study::Manifest::read(&out).unwrap();
        let cases = statebench::eal::generator::generate(
            manifest.config.domain,
            manifest.config.seed,
            manifest.config.cases,
            &manifest.config.mix,
        );
        let mut v: Vec<LoopStep> =
            statebench::eal::closed_loop::read_steps(&out, &manifest, &cases).unwrap();
        v.sort_by(|a, b| (&a.case, a.arm, a.step).cmp(&(&b.case, b.arm, b.step)));
        v.iter_mut().for_each(|s| {
            s.trial.usage = Default::default();
            s.update
                .iter_mut()
                .for_each(|a| a.usage = Default::default());
            s.history
                .iter_mut()
                .for_each(|a| a.usage = Default::default());
        });
        v
    };
    let steps = read();
    assert_eq!(steps.len(), 2 * 3 * 2);
    // Every writer attempt is on record: the base formation once per case.
    for case in ["procurement-s1-c00", "procurement-s1-c01"] {
        let first = steps
            .iter()
            .filter(|s| s.case == case && s.step == 0 && !s.history.is_empty())
            .count();
        assert_eq!(first, 1, "{case}");
    }
    for s in &steps {
        let last = s.step == 2;
        assert_eq!(s.feedback.is_empty(), last);
        assert_eq!(s.update.is_empty(), last);
        match s.arm {
            LoopArm::Action if !last => {
                assert!(s.feedback.contains("ACTION_OUTCOME") && s.feedback.contains("Outcome:"))
            }
            LoopArm::Neutral if !last => assert!(!s.feedback.contains("Request:")),
            _ => {}
        }
        if s.step == 0 {
            let other = steps
                .iter()
                .find(|o| o.case == s.case && o.step == 0 && o.arm != s.arm)
                .unwrap();
            assert_eq!(s.memory, other.memory, "one base memory for both arms");
        }
    }
    // Cut off mid-case: the second case's last lines are lost.
    let path = out.join("loop.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    let keep: Vec<&str> = text.lines().take(8).collect();
    std::fs::write(&path, keep.join("\n") + "\n").unwrap();
    run();
    assert_eq!(read(), steps);
}

/// A call the backend fails is a trial of class `error`: left out of every
/// rate, and asked again on resume. An arm named twice is refused.
#[test]
fn backend_errors_are_retried_and_not_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let model = engine_common::tiny_copy(tmp.path(), "tiny-qwen2", 4096);
    let out = tmp.path().join("overflow");
    // 4,000 tokens of budget after a prompt of hundreds overflow 4,096.
    let args = ["--arms", "empty", "--executor-max-tokens", "4000"];
    for attempt in 0..2 {
        let o = bin()
            .args(["eal", "run", "--cases", "2", "--device", "cpu"])
            .arg("--model")
            .arg(&model)
            .arg("--out")
            .arg(&out)
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("executor: 6 calls (0 already done)"),
            "attempt {attempt}: {err}"
        );
    }
    let run = Run::read(&out).unwrap();
    assert_eq!(run.trials.len(), 6, "the last trial of each call");
    assert!(run
        .trials
        .iter()
        .all(|t| t.class == Class::Error && !t.correct));
    let error = run.trials[0].error.as_deref().unwrap_or_default();
    assert!(error.contains("context overflow"), "{error}");
    let m = run.measure();
    assert_eq!(m.arms[&EvidenceArm::Empty].trials, 0);
    assert_eq!(m.arms[&EvidenceArm::Empty].classes[&Class::Error], 6);

    let o = eal_run(
        &model,
        &tmp.path().join("twice"),
        &["--arms", "written,written"],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("named twice"), "{err}");
}
