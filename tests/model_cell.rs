//! The live ladder end to end on the real engine: a model-backed agent,
//! matcher and compiler in one process, many episodes batched together.
//!
//! The fast tests use the random-weight Qwen2 checkpoint of the engine
//! fixtures (with a longer context so whole episodes fit); one test runs a
//! tiny cell on the default GGUF.

mod engine_common;

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use statebench::ladder::run::runlog::{read_run, read_turns};
use statebench::rundir::Identity;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_statebench"))
}

fn cell_args<'a>(model: &'a str, out: &'a str, live: &'a str) -> Vec<&'a str> {
    vec![
        "ladder",
        "cell",
        "--agent",
        "model",
        "--device",
        "cpu",
        "--model",
        model,
        "--arms",
        "raw,checklist,directive,enforce",
        "--steps",
        "3",
        "--episodes",
        "3",
        "--seed-start",
        "100",
        "--out",
        out,
        "--live",
        live,
        "--quiet",
    ]
}

/// Runs two episodes of `arms` with `live` in flight into `out`.
fn two_episodes(model: &str, out: &Path, live: &str, arms: &str, extra: &[&str]) {
    let mut args = cell_args(model, out.to_str().unwrap(), live);
    let at = args.iter().position(|a| *a == "--arms").unwrap() + 1;
    args[at] = arms;
    let at = args.iter().position(|a| *a == "--episodes").unwrap() + 1;
    args[at] = "2";
    args.extend(extra);
    let o = bin().args(args).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// Replies and bookings per (seed, arm, turn).
fn transcripts(dir: &Path) -> Vec<String> {
    let mut t: Vec<String> = read_turns(dir)
        .unwrap()
        .into_iter()
        .map(|t| {
            serde_json::json!([
                t.seed,
                t.arm,
                t.turn,
                t.request,
                t.replies,
                t.bookings,
                t.matched.map(|m| (m.step, m.explicit_redo))
            ])
            .to_string()
        })
        .collect();
    t.sort();
    t
}

#[test]
fn live_cell_is_batch_invariant_and_survives_a_kill() {
    let tmp = tempfile::tempdir().unwrap();
    let model = engine_common::tiny_model_long(tmp.path());
    let model = model.to_str().unwrap();
    // One episode-arm at a time.
    let seq = tmp.path().join("sequential");
    let o = bin()
        .args(cell_args(model, seq.to_str().unwrap(), "1"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let records = read_run(&seq).unwrap().episodes;
    assert_eq!(records.len(), 12);
    // The model parts really ran: agent tokens, matcher calls, a compile.
    for r in &records {
        assert!(r.usage.completion_tokens > 0, "{r:?}");
        if r.arm.uses_matcher() {
            assert!(r.matcher.calls > 0);
            assert!(r.compile.is_some());
        }
    }

    // All twelve at once, killed once some have finished, then resumed.
    let cut = tmp.path().join("killed");
    let mut child = bin()
        .args(cell_args(model, cut.to_str().unwrap(), "12"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let episodes = cut.join("episodes.jsonl");
    loop {
        let n = fs::read_to_string(&episodes)
            .map(|s| s.lines().count())
            .unwrap_or(0);
        if n >= 3 || t0.elapsed() > Duration::from_secs(300) {
            break;
        }
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    let done_before = read_run(&cut).map(|r| r.episodes.len()).unwrap_or(0);
    let o = bin()
        .args(cell_args(model, cut.to_str().unwrap(), "12"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("{} already finished", done_before)),
        "{err}"
    );

    assert_eq!(
        engine_common::stable_records(&seq),
        engine_common::stable_records(&cut),
        "batched + killed + resumed equals sequential"
    );
    assert_eq!(transcripts(&seq), transcripts(&cut));
}

/// The memory arms on the model: the agent model embeds (its own final
/// hidden state) and writes the Mem0-style facts; batched or not, the same
/// transcripts and memories.
#[test]
fn memory_arms_run_on_the_model_and_are_batch_invariant() {
    let tmp = tempfile::tempdir().unwrap();
    let model = engine_common::tiny_model_long(tmp.path());
    let model = model.to_str().unwrap();
    let arms = "topk-replace,mem0-augment,ledger-replace";
    let (seq, par) = (tmp.path().join("seq"), tmp.path().join("par"));
    two_episodes(model, &seq, "1", arms, &[]);
    two_episodes(model, &par, "6", arms, &[]);
    let r = read_run(&seq).unwrap();
    let cfg = serde_json::to_value(&r.manifest.config).unwrap();
    assert_eq!(cfg["embedder"]["kind"], "agent", "{cfg}");
    assert_eq!(cfg["memory_writer"], "model", "{cfg}");
    for e in &r.episodes {
        let m = e.memory;
        match e.arm.name() {
            "topk-replace" => {
                let m = m.expect("memory use");
                // One query and one stored exchange per turn.
                assert_eq!(m.embed_calls, 2 * e.turns, "{m:?}");
                assert_eq!(m.items, e.turns);
                assert_eq!(m.writer_calls, 0);
            }
            "mem0-augment" => {
                let m = m.expect("memory use");
                assert!(m.writer_calls >= e.turns, "{m:?}");
                assert!(m.writer_prompt_tokens > 0 && m.embed_tokens > 0);
            }
            _ => assert!(m.is_none()),
        }
    }
    let turns = read_turns(&seq).unwrap();
    let recall = turns
        .iter()
        .filter(|t| t.arm.name() == "topk-replace" && t.turn > 0)
        .all(|t| {
            t.system_extra
                .as_deref()
                .is_some_and(|s| s.contains("(1) USER: "))
        });
    assert!(recall, "every later top-k turn recalls a stored exchange");
    assert_eq!(
        engine_common::stable_records(&seq),
        engine_common::stable_records(&par)
    );
    assert_eq!(transcripts(&seq), transcripts(&par));
}

/// The native tool harness on the model: the step tools reach the chat
/// template, and batched or not the same transcripts, calls and stamps.
#[test]
fn native_tool_harness_runs_on_the_model_and_is_batch_invariant() {
    let tmp = tempfile::tempdir().unwrap();
    let model = engine_common::tiny_model_long(tmp.path());
    let model = model.to_str().unwrap();
    let (arms, native) = ("raw,enforce,enforce-request", ["--protocol", "native"]);
    let (seq, par) = (tmp.path().join("seq"), tmp.path().join("par"));
    two_episodes(model, &seq, "1", arms, &native);
    two_episodes(model, &par, "6", arms, &native);
    let r = read_run(&seq).unwrap();
    let cfg = serde_json::to_value(&r.manifest.config).unwrap();
    assert_eq!(cfg["protocol"], "native", "{cfg}");
    let turns = read_turns(&seq).unwrap();
    assert_eq!(turns.len(), 2 * 3 * 44);
    let stamps = |dir: &Path| {
        let mut v: Vec<String> = read_turns(dir)
            .unwrap()
            .into_iter()
            .map(|t| {
                serde_json::json!([t.seed, t.arm, t.turn, t.stamps, t.tool_results, t.malformed])
                    .to_string()
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        engine_common::stable_records(&seq),
        engine_common::stable_records(&par)
    );
    assert_eq!(transcripts(&seq), transcripts(&par));
    assert_eq!(stamps(&seq), stamps(&par));
}

#[test]
#[cfg_attr(
    not(has_default_model),
    ignore = "needs the default model: run models/fetch.sh"
)]
fn live_cell_on_the_default_model() {
    let gguf = engine_common::default_model();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("cell");
    let o = bin()
        .args([
            "ladder",
            "cell",
            "--agent",
            "model",
            "--device",
            "cpu",
            "--model",
            gguf.to_str().unwrap(),
            "--arms",
            "raw,enforce",
            "--steps",
            "3",
            "--episodes",
            "1",
            "--out",
            out.to_str().unwrap(),
            "--quiet",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("Ladder (strict episode success)"), "{text}");
    let run = read_run(&out).unwrap();
    assert_eq!(run.episodes.len(), 2);
    match &run.manifest.model {
        Identity::Model(m) => assert_eq!(m.architecture, "qwen2"),
        other => panic!("a model cell records its model, not {other:?}"),
    }
    let turns = read_turns(&out).unwrap();
    assert_eq!(turns.len(), 88);
    // Every turn has a reply from the model (or the error that replaced it).
    assert!(turns
        .iter()
        .all(|t| !t.replies[0].is_empty() || !t.errors.is_empty()));
    let enforce = run
        .episodes
        .iter()
        .find(|e| e.arm.name() == "enforce")
        .unwrap();
    assert!(enforce.matcher.calls > 0);
    assert!(enforce.compile.is_some());
}

/// `--embedder PATH`: a separate Qwen checkpoint embeds in-process beside a
/// scripted agent (which loads no model of its own); the manifest records
/// its identity, and the perfect agent still scores every episode.
#[test]
fn a_separate_embedding_model_is_loaded_and_recorded() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("cell");
    let embedder = engine_common::root().join("tests/fixtures/engine/tiny-qwen3");
    let o = bin()
        .args(["ladder", "cell", "--agent", "perfect", "--device", "cpu"])
        .args(["--arms", "topk-replace,mem0-augment", "--steps", "5"])
        .args(["--episodes", "3", "--quiet", "--embedder"])
        .arg(&embedder)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let run = read_run(&out).unwrap();
    let cfg = serde_json::to_value(&run.manifest.config).unwrap();
    assert_eq!(cfg["embedder"]["kind"], "model", "{cfg}");
    assert_eq!(cfg["embedder"]["architecture"], "qwen3", "{cfg}");
    assert_eq!(cfg["memory_writer"], "oracle", "{cfg}");
    assert_eq!(run.episodes.len(), 6);
    for e in &run.episodes {
        assert!(e.primary.strict, "{e:?}");
        let m = e.memory.expect("memory use");
        assert!(m.embed_calls > 0 && m.embed_tokens > 0 && m.embed_failures == 0);
    }
}

/// A live cell through the CUDA engine on the emulator: the tiny Qwen2 as
/// agent (a 2,048-token context, so a turn's 400 reply tokens run and the
/// next turn overflows), the raw and checklist rungs, two episodes each,
/// all four episode-arms batched and then one at a time: the same
/// episodes, turns and replies, and the manifest names the emulated device
/// and its arithmetic.
#[cfg(feature = "cuda")]
#[test]
#[cfg_attr(
    not(has_cuda_emulator),
    ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
)]
fn live_cell_on_the_emulated_gpu_is_batch_invariant() {
    engine_common::require_emulator();
    let tmp = tempfile::tempdir().unwrap();
    let model = engine_common::tiny_copy(tmp.path(), "tiny-qwen2", 2048);
    let model = model.to_str().unwrap();
    let run = |live: &str| {
        let out = tmp.path().join(format!("live-{live}"));
        let mut args = cell_args(model, out.to_str().unwrap(), live);
        let at = args.iter().position(|a| *a == "--device").unwrap() + 1;
        args[at] = "cuda-emulated";
        let at = args.iter().position(|a| *a == "--arms").unwrap() + 1;
        args[at] = "raw,checklist";
        let at = args.iter().position(|a| *a == "--episodes").unwrap() + 1;
        args[at] = "2";
        let o = bin().args(args).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        out
    };
    let (batched, alone) = (run("4"), run("1"));
    let records = read_run(&batched).unwrap().episodes;
    assert_eq!(records.len(), 4);
    assert!(
        records.iter().all(|r| r.usage.completion_tokens > 0),
        "{records:?}"
    );
    let manifest = std::fs::read_to_string(batched.join("manifest.json")).unwrap();
    assert!(manifest.contains("cuda-emulated"), "{manifest}");
    assert!(manifest.contains("statebench-cuda/3"), "{manifest}");
    assert_eq!(
        engine_common::stable_records(&batched),
        engine_common::stable_records(&alone),
        "batched equals one at a time"
    );
    assert_eq!(transcripts(&batched), transcripts(&alone));
}
