//! Hostile model files, one test per way they used to get through: values
//! that compute NaN which the quantizer then hid.

mod engine_common;

use std::path::Path;
use std::process::{Command, Output};

use engine_common::*;
use statebench::backend::{Backend, BackendError};
use statebench::engine::{Engine, EngineOptions};

fn statebench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_statebench"))
        .args(args)
        .output()
        .expect("binary runs")
}

/// Fails with a one-line message holding `needle`.
fn refused(args: &[&str], needle: &str) {
    let o = statebench(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{args:?} was accepted");
    assert!(err.contains(needle), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
}

/// `generate` on the CPU with `model`, plus `extra` arguments.
fn generate_refused(model: &Path, extra: &[&str], needle: &str) {
    let m = model.to_str().unwrap();
    let mut args = vec![
        "generate",
        "--device",
        "cpu",
        "--model",
        m,
        "--max-tokens",
        "4",
    ];
    args.extend_from_slice(extra);
    refused(&args, needle);
}

/// Rewrites one f32 tensor of a safetensors file in place.
fn edit_tensor(file: &Path, name: &str, edit: impl Fn(&mut [f32])) {
    let bytes = std::fs::read(file).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut owned: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    let t = owned.iter_mut().find(|t| t.0 == name).expect("tensor");
    assert_eq!(t.1, safetensors::Dtype::F32);
    let mut vals: Vec<f32> =
        t.3.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
    edit(&mut vals);
    t.3 = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = owned
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, file).unwrap();
}

// ---------------------------------------------------------------- 6. NaN

#[test]
fn a_nan_norm_weight_fails_under_quantized_activations() {
    let tmp = tempfile::tempdir().unwrap();
    let tiny = tiny_copy(tmp.path(), "tiny-qwen2", 4096);
    edit_tensor(
        &tiny.join("model.safetensors"),
        "model.layers.0.input_layernorm.weight",
        |v| v[3] = f32::NAN,
    );
    // Float weights: the NaN reaches the logits.
    generate_refused(&tiny, &[], "first in the output of layer 0");
    // Q8_0 weights quantize their inputs: ggml's rounding made NaN a 0 and
    // the reply came out as tokens.
    generate_refused(
        &tiny,
        &["--quantize", "q8_0"],
        "first in the output of layer 0",
    );
    // Through the engine: the request ends with the error.
    let opts = EngineOptions {
        quantize: Some(statebench::engine::Quantize::Q8_0),
        ..EngineOptions::default()
    };
    let mut engine = Engine::load(&tiny.to_string_lossy(), opts).unwrap();
    let s = engine.open_session();
    match engine.chat(s, ask("hello", 4)) {
        Err(BackendError::StepFailed { cause, .. }) => {
            assert!(cause.contains("NaN or infinite"), "{cause}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_nan_weight_is_refused_where_it_would_be_quantized() {
    let tmp = tempfile::tempdir().unwrap();
    let tiny = tiny_copy(tmp.path(), "tiny-qwen2", 4096);
    edit_tensor(
        &tiny.join("model.safetensors"),
        "model.layers.1.mlp.down_proj.weight",
        |v| v[5] = f32::NAN,
    );
    generate_refused(
        &tiny,
        &["--quantize", "q8_0"],
        "tensor model.layers.1.mlp.down_proj.weight: value 5 is NaN or infinite",
    );
}
