//! Tiny random-weight Qwen2 and Qwen3 checkpoints: agreement with the
//! transformers reference logits, invariance, and safetensors loading of
//! f32 / bf16 / f16, tied and untied checkpoints this test writes itself.

mod engine_common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use engine_common::*;
use statebench::backend::{Backend, BackendError, ChatRequest, Message, Role};
use statebench::engine::device::candle::Candle;
use statebench::engine::device::Device;
use statebench::engine::{Engine, EngineOptions, Quantize};

/// Max abs difference allowed against transformers' f32 logits.
const TOLERANCE: f32 = 1e-4;

fn tiny(name: &str) -> PathBuf {
    root().join("tests/fixtures/engine").join(name)
}

fn reference(dir: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join("logits.json")).expect("logits.json");
    serde_json::from_str(&text).expect("parses")
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).expect("ids")
}

fn floats(v: &serde_json::Value) -> Vec<f32> {
    serde_json::from_value(v.clone()).expect("floats")
}

fn check_reference(name: &str) {
    let dir = tiny(name);
    check_reference_on(name, &load(&dir), TOLERANCE);
}

fn check_reference_on<D: Device>(name: &str, engine: &Engine<D>, tolerance: f32) {
    let engine = &engine;
    let r = reference(&tiny(name));
    for case in r["cases"].as_array().expect("cases") {
        let input = ids(&case["input_ids"]);
        let got = cold_logits(engine, &input);
        let want = floats(&case["last_logits"]);
        let d = max_abs_diff(&got, &want);
        assert!(d <= tolerance, "{name} {}: max abs diff {d}", case["name"]);
        if let Some(all) = case.get("all_logits").and_then(|a| a.as_array()) {
            for (i, row) in all.iter().enumerate() {
                let got = cold_logits(engine, &input[..=i]);
                let d = max_abs_diff(&got, &floats(row));
                assert!(d <= tolerance, "{name} {} position {i}: {d}", case["name"]);
            }
        }
        let want_greedy = ids(&case["greedy"]);
        let (got_greedy, _) = greedy_incremental(engine, &input, want_greedy.len());
        assert_eq!(got_greedy, want_greedy, "{name} {} greedy", case["name"]);
    }
}

#[test]
fn tiny_qwen2_matches_transformers_logits_and_greedy() {
    check_reference("tiny-qwen2");
}

#[test]
fn tiny_qwen3_matches_transformers_logits_and_greedy() {
    check_reference("tiny-qwen3");
}

/// The forward pass on candle's tensors (what runs on Metal), here on
/// candle's CPU backend: the same reference logits and greedy paths.
fn check_candle(name: &str) {
    let dir = tiny(name);
    let engine = Engine::load_on(
        Candle::cpu(),
        &dir.to_string_lossy(),
        EngineOptions::default(),
    )
    .expect("loads on candle");
    check_reference_on(name, &engine, TOLERANCE);
}

#[test]
fn tiny_qwen2_on_candle_matches_transformers() {
    check_candle("tiny-qwen2");
}

#[test]
fn tiny_qwen3_on_candle_matches_transformers() {
    check_candle("tiny-qwen3");
}

fn invariance(name: &str) {
    let dir = tiny(name);
    let mut engine = load(&dir);
    let r = reference(&dir);
    let case = &r["cases"][2];
    let prompt = ids(&case["input_ids"]);
    check_incremental_equals_recompute(&engine, &prompt, 12);
    let n = prompt.len();
    check_split_prefill(&engine, &prompt, &[1, 2, n / 2, n - 1]);
    let others: Vec<ChatRequest> = (0..15)
        .map(|i| {
            let mut req = ask(&"word ".repeat(1 + i * 3), 3 + i % 7);
            req.temperature = if i % 2 == 0 { 0.0 } else { 1.0 };
            req.seed = i as u64;
            req
        })
        .collect();
    let mut target = ask("Name a colour.", 12);
    check_batch_invariance(&mut engine, target.clone(), &others);
    check_chunked_prefill(&dir, &mut engine, target.clone(), &others);
    target.temperature = 1.0;
    target.seed = 99;
    check_batch_invariance(&mut engine, target.clone(), &others);
    check_chunked_prefill(&dir, &mut engine, target, &others);
}

/// Prompts fed three tokens a step, alone and beside requests that decode,
/// give the same tokens as whole-prompt prefill.
fn check_chunked_prefill(
    dir: &Path,
    engine: &mut Engine,
    target: ChatRequest,
    others: &[ChatRequest],
) {
    let opts = EngineOptions {
        prefill_chunk: 3,
        ..EngineOptions::default()
    };
    let mut chunked = Engine::load(&dir.to_string_lossy(), opts).expect("loads");
    let whole = run_alone(engine, target.clone());
    // Stepped by hand: the prompt takes one step per chunk.
    let s = chunked.open_session();
    chunked.submit(s, target.clone()).expect("submit");
    let mut steps = 0;
    let mut reply = None;
    while chunked.has_pending() {
        steps += 1;
        if let Some((_, r)) = chunked.step().expect("step").pop() {
            reply = Some(r.expect("reply"));
        }
    }
    let reply = reply.expect("finished");
    assert_eq!(reply.tokens, whole.tokens);
    let u = &reply.usage;
    assert_eq!(steps, u.prompt_tokens.div_ceil(3) + u.completion_tokens - 1);
    chunked.close_session(s);
    assert_eq!(
        run_batched(&mut chunked, target, others).tokens,
        whole.tokens
    );
}

#[test]
fn tiny_qwen2_invariance_a_b_c() {
    invariance("tiny-qwen2");
}

#[test]
fn tiny_qwen3_invariance_a_b_c() {
    invariance("tiny-qwen3");
}

// ------------------------------------------------ self-written checkpoints

/// Deterministic pseudo-random values in [-scale, scale].
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Dt {
    F32,
    Bf16,
    F16,
}

/// Rounds through the storage type so every variant holds the same values.
fn round(v: &[f32], dt: Dt) -> Vec<f32> {
    match dt {
        Dt::F32 => v.to_vec(),
        Dt::Bf16 => v
            .iter()
            .map(|x| half::bf16::from_f32(*x).to_f32())
            .collect(),
        Dt::F16 => v.iter().map(|x| half::f16::from_f32(*x).to_f32()).collect(),
    }
}

fn bytes(v: &[f32], dt: Dt) -> Vec<u8> {
    match dt {
        Dt::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Dt::Bf16 => v
            .iter()
            .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
            .collect(),
        Dt::F16 => v
            .iter()
            .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
            .collect(),
    }
}

/// Writes a Qwen2 or Qwen3 checkpoint of random weights (values already
/// rounded to `round_to`) stored as `dt`, with or without a tied head.
fn write_checkpoint(dir: &Path, qwen3: bool, dt: Dt, round_to: Dt, tied: bool) {
    let (vocab, h, inter, layers, heads, kv, hd) =
        (300usize, 64usize, 96usize, 2usize, 4usize, 2usize, 16usize);
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    let mut seed = 1u64;
    let mut add = |name: String, shape: Vec<usize>, scale: f32, offset: f32| {
        seed += 1;
        let n = shape.iter().product();
        let v: Vec<f32> = values(n, seed, scale)
            .into_iter()
            .map(|x| x + offset)
            .collect();
        tensors.push((name, shape, round(&v, round_to)));
    };
    add("model.embed_tokens.weight".into(), vec![vocab, h], 0.5, 0.0);
    for i in 0..layers {
        let p = format!("model.layers.{i}");
        add(format!("{p}.input_layernorm.weight"), vec![h], 0.1, 1.0);
        add(
            format!("{p}.post_attention_layernorm.weight"),
            vec![h],
            0.1,
            1.0,
        );
        add(
            format!("{p}.self_attn.q_proj.weight"),
            vec![heads * hd, h],
            0.2,
            0.0,
        );
        add(
            format!("{p}.self_attn.k_proj.weight"),
            vec![kv * hd, h],
            0.2,
            0.0,
        );
        add(
            format!("{p}.self_attn.v_proj.weight"),
            vec![kv * hd, h],
            0.2,
            0.0,
        );
        add(
            format!("{p}.self_attn.o_proj.weight"),
            vec![h, heads * hd],
            0.2,
            0.0,
        );
        if qwen3 {
            add(format!("{p}.self_attn.q_norm.weight"), vec![hd], 0.1, 1.0);
            add(format!("{p}.self_attn.k_norm.weight"), vec![hd], 0.1, 1.0);
        } else {
            add(
                format!("{p}.self_attn.q_proj.bias"),
                vec![heads * hd],
                0.1,
                0.0,
            );
            add(
                format!("{p}.self_attn.k_proj.bias"),
                vec![kv * hd],
                0.1,
                0.0,
            );
            add(
                format!("{p}.self_attn.v_proj.bias"),
                vec![kv * hd],
                0.1,
                0.0,
            );
        }
        add(
            format!("{p}.mlp.gate_proj.weight"),
            vec![inter, h],
            0.2,
            0.0,
        );
        add(format!("{p}.mlp.up_proj.weight"), vec![inter, h], 0.2, 0.0);
        add(
            format!("{p}.mlp.down_proj.weight"),
            vec![h, inter],
            0.2,
            0.0,
        );
    }
    add("model.norm.weight".into(), vec![h], 0.1, 1.0);
    if !tied {
        // The untied head holds the embedding's values, so logits must match the tied model.
        let embed = tensors[0].2.clone();
        tensors.push(("lm_head.weight".into(), vec![vocab, h], embed));
    }
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .into_iter()
        .map(|(n, s, v)| (n, s, bytes(&v, dt)))
        .collect();
    let st_dtype = match dt {
        Dt::F32 => safetensors::Dtype::F32,
        Dt::Bf16 => safetensors::Dtype::BF16,
        Dt::F16 => safetensors::Dtype::F16,
    };
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = data
        .iter()
        .map(|(n, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(st_dtype, s.clone(), b).expect("view"),
            )
        })
        .collect();
    let meta: Option<HashMap<String, String>> = None;
    safetensors::serialize_to_file(views, meta, &dir.join("model.safetensors")).expect("write");
    let config = serde_json::json!({
        "model_type": if qwen3 { "qwen3" } else { "qwen2" },
        "vocab_size": vocab, "hidden_size": h, "intermediate_size": inter,
        "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv, "head_dim": hd, "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 256,
        "tie_word_embeddings": tied,
    });
    std::fs::write(dir.join("config.json"), config.to_string()).expect("config");
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(tiny("tiny-qwen2").join(f), dir.join(f)).expect("copy tokenizer");
    }
}

/// Bytes of the checkpoint's matrices (2-D tensors) as stored.
fn matrix_bytes(dir: &Path) -> usize {
    let buf = std::fs::read(dir.join("model.safetensors")).expect("read");
    let st = safetensors::SafeTensors::deserialize(&buf).expect("parse");
    st.tensors()
        .iter()
        .filter(|(_, v)| v.shape().len() == 2)
        .map(|(_, v)| v.data().len())
        .sum()
}

#[test]
fn float_weights_quantized_to_q8_0_at_load_are_their_own_arithmetic() {
    let tmp = tempfile::tempdir().expect("tempdir");
    write_checkpoint(tmp.path(), false, Dt::Bf16, Dt::Bf16, true);
    let exact = load(tmp.path());
    let opts = EngineOptions {
        quantize: Some(Quantize::Q8_0),
        ..EngineOptions::default()
    };
    let mut q = Engine::load(&tmp.path().to_string_lossy(), opts).expect("loads");
    // 34 bytes per 32 weights against bf16's 64 (plus the last group's rows).
    assert!(q.model().weight_bytes() * 100 < exact.model().weight_bytes() * 56);
    let tokens = [5u32, 17, 42, 99, 250, 7];
    let (a, b) = (cold_logits(&exact, &tokens), cold_logits(&q, &tokens));
    assert_ne!(a, b, "quantized weights give other logits");
    let spread =
        a.iter().fold(f32::MIN, |m, &x| m.max(x)) - a.iter().fold(f32::MAX, |m, &x| m.min(x));
    assert!(
        max_abs_diff(&a, &b) < 0.05 * spread,
        "{} of {spread}",
        max_abs_diff(&a, &b)
    );
    let (ia, ib) = (exact.model_id().expect("id"), q.model_id().expect("id"));
    assert!(ib.arithmetic.contains("Q8_0") && !ia.arithmetic.contains("Q8_0"));
    assert!(ib.format.contains("Q8_0"));
    // The integer kernels keep a request's tokens independent of its batch.
    let target = ChatRequest::greedy(vec![Message::new(Role::User, "abc")], 8);
    let others: Vec<ChatRequest> = (0..5)
        .map(|i| ChatRequest::greedy(vec![Message::new(Role::User, "x".repeat(i + 1))], 6))
        .collect();
    let alone = run_alone(&mut q, target.clone());
    assert_eq!(run_batched(&mut q, target, &others).tokens, alone.tokens);
}

#[test]
fn safetensors_dtypes_and_tied_heads_load_to_the_same_model() {
    let tokens = [5u32, 17, 42, 99, 250, 7];
    for qwen3 in [false, true] {
        for round_to in [Dt::Bf16, Dt::F16] {
            let mut results = Vec::new();
            for (dt, tied) in [(Dt::F32, true), (round_to, true), (round_to, false)] {
                let tmp = tempfile::tempdir().expect("tempdir");
                write_checkpoint(tmp.path(), qwen3, dt, round_to, tied);
                let engine = load(tmp.path());
                assert_eq!(
                    engine.model().weight_bytes(),
                    matrix_bytes(tmp.path()),
                    "{dt:?}: the weights take their file's bytes"
                );
                let l = cold_logits(&engine, &tokens);
                assert!(l.iter().all(|x| x.is_finite()));
                results.push(((dt, tied), l));
            }
            for (what, l) in &results[1..] {
                assert_eq!(
                    l, &results[0].1,
                    "qwen3={qwen3}: {what:?} differs from the f32 tied checkpoint"
                );
            }
        }
    }
}

#[test]
fn safetensors_bad_input_gives_one_line_errors() {
    // Missing config.json.
    let tmp = tempfile::tempdir().expect("tempdir");
    let err = Engine::load(&tmp.path().to_string_lossy(), EngineOptions::default())
        .err()
        .expect("fails");
    let msg = err.to_string();
    assert!(matches!(err, BackendError::MissingFile { .. }), "{msg}");
    assert!(msg.contains("config.json") && !msg.contains('\n'), "{msg}");

    // Unsupported architecture.
    write_checkpoint(tmp.path(), false, Dt::F32, Dt::F32, true);
    let cfg = std::fs::read_to_string(tmp.path().join("config.json")).expect("read");
    std::fs::write(
        tmp.path().join("config.json"),
        cfg.replace("\"qwen2\"", "\"llama\""),
    )
    .expect("write");
    let err = Engine::load(&tmp.path().to_string_lossy(), EngineOptions::default())
        .err()
        .expect("fails");
    let msg = err.to_string();
    assert!(matches!(err, BackendError::Unsupported { .. }), "{msg}");
    assert!(
        msg.contains("llama") && msg.contains("config.json"),
        "{msg}"
    );

    // Truncated safetensors.
    std::fs::write(tmp.path().join("config.json"), cfg).expect("write");
    let st = tmp.path().join("model.safetensors");
    let full = std::fs::read(&st).expect("read");
    std::fs::write(&st, &full[..full.len() / 2]).expect("truncate");
    let err = Engine::load(&tmp.path().to_string_lossy(), EngineOptions::default())
        .err()
        .expect("fails");
    let msg = err.to_string();
    assert!(matches!(err, BackendError::CorruptWeights { .. }), "{msg}");
    assert!(msg.contains("model.safetensors"), "{msg}");

    // A path that is nothing at all.
    let err = Engine::load("/nonexistent/model.gguf", EngineOptions::default())
        .err()
        .expect("fails");
    assert!(matches!(err, BackendError::MissingFile { .. }), "{err}");
}

#[test]
fn qwen3_thinking_flag_reaches_the_template() {
    let engine = load(&tiny("tiny-qwen3"));
    let msgs = [Message::new(Role::User, "hi")];
    let off = engine.render(&msgs, false).expect("render");
    let on = engine.render(&msgs, true).expect("render");
    assert!(
        off.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        "{off:?}"
    );
    assert!(on.ends_with("<|im_start|>assistant\n"), "{on:?}");
}

#[test]
fn hub_ids_resolve_from_the_local_cache_offline() {
    // A hub cache laid out as `huggingface_hub` writes it, holding tiny-qwen2.
    let home = tempfile::tempdir().expect("tempdir");
    let repo = home.path().join("hub/models--statebench-test--tiny-qwen2");
    let snap = repo.join("snapshots/0123abcd");
    std::fs::create_dir_all(&snap).expect("mkdir");
    std::fs::create_dir_all(repo.join("refs")).expect("mkdir");
    std::fs::write(repo.join("refs/main"), "0123abcd").expect("ref");
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::fs::copy(tiny("tiny-qwen2").join(f), snap.join(f)).expect("copy");
    }
    // This is the only test in this binary that reads these variables.
    std::env::set_var("HF_HOME", home.path());
    std::env::set_var("HF_HUB_OFFLINE", "1");
    let by_id =
        Engine::load("statebench-test/tiny-qwen2", EngineOptions::default()).expect("loads by id");
    let by_dir = load(&tiny("tiny-qwen2"));
    let tokens = [1u32, 2, 3, 40, 50];
    assert_eq!(cold_logits(&by_id, &tokens), cold_logits(&by_dir, &tokens));

    let err = Engine::load("statebench-test/absent-model", EngineOptions::default())
        .err()
        .expect("absent");
    let msg = err.to_string();
    assert!(matches!(err, BackendError::MissingFile { .. }), "{msg}");
    assert!(
        msg.contains("statebench-test/absent-model") && msg.contains("HF_HUB_OFFLINE"),
        "{msg}"
    );
}
