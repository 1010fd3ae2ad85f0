//! Bad GGUF input: truncated files and a corrupt magic give one-line errors
//! naming the file and the cause, never a panic or a hang.

mod engine_common;

use std::io::{Read, Write};
use std::path::Path;

use engine_common::*;
use statebench::backend::BackendError;
use statebench::engine::{Engine, EngineOptions};

fn prefix_copy(src: &Path, dst: &Path, n: usize) {
    let mut buf = vec![0u8; n];
    std::fs::File::open(src)
        .expect("open")
        .read_exact(&mut buf)
        .expect("read");
    std::fs::File::create(dst)
        .expect("create")
        .write_all(&buf)
        .expect("write");
}

fn load_err(path: &Path) -> BackendError {
    Engine::load(&path.to_string_lossy(), EngineOptions::default())
        .err()
        .expect("loading must fail")
}

#[test]
#[cfg_attr(
    not(has_default_model),
    ignore = "needs the default model: run models/fetch.sh"
)]
fn truncated_gguf_is_reported_with_its_path() {
    let model = default_model();
    let tmp = tempfile::tempdir().expect("tempdir");
    // Cut inside the metadata, and cut inside the tensor data.
    for n in [100usize, 3_000_000, 200_000_000] {
        let p = tmp.path().join(format!("cut-{n}.gguf"));
        prefix_copy(&model, &p, n);
        let err = load_err(&p);
        let msg = err.to_string();
        assert!(matches!(err, BackendError::CorruptWeights { .. }), "{msg}");
        assert!(msg.contains(&format!("cut-{n}.gguf")), "{msg}");
        assert!(!msg.contains('\n'), "one line: {msg}");
        if n == 200_000_000 {
            assert!(msg.contains("truncated"), "{msg}");
        }
    }
}

#[test]
#[cfg_attr(
    not(has_default_model),
    ignore = "needs the default model: run models/fetch.sh"
)]
fn corrupt_magic_is_reported() {
    let model = default_model();
    let tmp = tempfile::tempdir().expect("tempdir");
    let p = tmp.path().join("bad-magic.gguf");
    prefix_copy(&model, &p, 1 << 20);
    let mut bytes = std::fs::read(&p).expect("read");
    bytes[..4].copy_from_slice(b"NOPE");
    std::fs::write(&p, bytes).expect("write");
    let err = load_err(&p);
    let msg = err.to_string();
    assert!(matches!(err, BackendError::CorruptWeights { .. }), "{msg}");
    assert!(
        msg.contains("bad-magic.gguf") && msg.contains("GGUF"),
        "{msg}"
    );
}

#[test]
fn cli_reports_bad_model_in_one_line() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_statebench"))
        .args(["generate", "--model", "/nonexistent/x.gguf"])
        .output()
        .expect("spawn");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("/nonexistent/x.gguf") && err.contains("not found"),
        "{err}"
    );
}

/// `--device` names a device this machine or this build cannot give: one
/// line saying which and what to do, exit non-zero, before any model loads.
#[test]
fn unusable_devices_are_one_line_errors() {
    let tiny = root().join("tests/fixtures/engine/tiny-qwen2");
    let run = |device: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_statebench"))
            .args(["generate", "--max-tokens", "2", "--device", device])
            .arg("--model")
            .arg(&tiny)
            .output()
            .expect("spawn");
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        (out.status.success(), err)
    };
    let (ok, err) = run("tpu");
    assert!(!ok && err.contains("unknown device 'tpu'"), "{err}");
    let (ok, err) = run("metal");
    if !cfg!(feature = "metal") {
        assert!(!ok && err.contains("without the `metal` feature"), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    #[cfg(feature = "cuda")]
    if statebench::engine::device::cuda::gpu_count() == 0 {
        for device in ["cuda", "cuda:3"] {
            let (ok, err) = run(device);
            assert!(!ok, "{device} ran without a GPU");
            assert!(err.contains(device) && !err.contains("panicked"), "{err}");
            assert_eq!(err.lines().count(), 1, "{err}");
        }
    }
    // The CPU always answers.
    let (ok, err) = run("cpu");
    assert!(ok, "{err}");
}

/// A forward pass past the model's context (the RoPE table's and the
/// block tables' length) is refused in one line instead of reading past
/// the tables (the check is the model's, above every device).
#[test]
fn a_forward_pass_past_the_context_is_refused() {
    let tiny = engine_common::root().join("tests/fixtures/engine/tiny-qwen2");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_statebench"))
        .arg("bench")
        .arg("--model")
        .arg(&tiny)
        .args(["--prefill-tokens", "600", "--batches", "1", "--turns", "1"])
        .output()
        .expect("statebench runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("context overflow: 600 prompt tokens + 0 max tokens > context 512"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}
