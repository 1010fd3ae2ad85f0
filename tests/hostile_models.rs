//! Hostile model files, one test per way they used to get through: values
//! that compute NaN which the quantizer then hid, GGUF and safetensors
//! files that crashed the loader or loaded silently wrong, and chat
//! templates that never finish.

mod engine_common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use engine_common::*;
use statebench::backend::{Backend, BackendError, ChatRequest, Message, Role};
use statebench::engine::{Engine, EngineOptions};

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

/// Rewrites a fixture copy's config.json.
fn edit_config(dir: &Path, edit: impl Fn(&mut serde_json::Value)) {
    let cfg = dir.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&cfg, v.to_string()).unwrap();
}

// ---------------------------------------------------------------- 6. NaN

#[test]
fn non_finite_model_constants_are_refused_at_load() {
    let tmp = tempfile::tempdir().unwrap();
    type Edit = Box<dyn Fn(&mut serde_json::Value)>;
    let cases: [(&str, Edit); 5] = [
        (
            "rms_norm_eps = -0.000001, not a finite positive number",
            Box::new(|v| v["rms_norm_eps"] = (-1e-6).into()),
        ),
        (
            "rope_theta = 0, not a finite positive number",
            Box::new(|v| v["rope_theta"] = 0.into()),
        ),
        (
            "rope_theta = inf, not a finite positive number",
            Box::new(|v| v["rope_theta"] = 1e300.into()),
        ),
        (
            "num_attention_heads = 4 is not a multiple of num_key_value_heads = 3",
            Box::new(|v| v["num_key_value_heads"] = 3.into()),
        ),
        (
            "num_hidden_layers is 0",
            Box::new(|v| v["num_hidden_layers"] = 0.into()),
        ),
    ];
    for (i, (needle, edit)) in cases.into_iter().enumerate() {
        let dir = tiny_copy(tmp.path(), "tiny-qwen2", 1000 + i as u64);
        edit_config(&dir, edit);
        generate_refused(&dir, &[], needle);
    }
    // JSON has no NaN: Python writes one as `NaN`, which is refused as JSON.
    for key in ["rms_norm_eps", "rope_theta"] {
        let dir = tiny_copy(tmp.path(), "tiny-qwen2", 2000);
        let cfg = dir.join("config.json");
        let text = std::fs::read_to_string(&cfg).unwrap();
        let re = regex::Regex::new(&format!(r#""{key}":\s*[0-9.e+-]+"#)).unwrap();
        assert!(re.is_match(&text), "{text}");
        std::fs::write(&cfg, re.replace(&text, format!(r#""{key}": NaN"#)).as_ref()).unwrap();
        generate_refused(
            &dir,
            &[],
            "config.json: corrupt or truncated weights: invalid JSON",
        );
    }
}

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

// ------------------------------------------------- 7. malformed safetensors

#[test]
fn a_qwen3_checkpoint_called_qwen2_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tiny_copy(tmp.path(), "tiny-qwen3", 512);
    edit_config(&dir, |v| {
        v["model_type"] = "qwen2".into();
        v["architectures"] = serde_json::json!(["Qwen2ForCausalLM"]);
    });
    generate_refused(
        &dir,
        &[],
        "tensor model.layers.0.self_attn.k_norm.weight is not part of a qwen2 model of 2 layers",
    );
    // The same files with their own config load.
    let dir = tiny_copy(tmp.path(), "tiny-qwen3", 513);
    Engine::load(&dir.to_string_lossy(), EngineOptions::default()).expect("loads");
}

#[test]
fn a_huge_context_is_refused_not_allocated() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tiny_copy(tmp.path(), "tiny-qwen2", 549_755_813_888);
    generate_refused(
        &dir,
        &[],
        "max_position_embeddings = 549755813888, more than the engine's limit of 1048576 positions",
    );
    // The limit itself loads.
    let dir = tiny_copy(tmp.path(), "tiny-qwen2", 1 << 20);
    edit_config(&dir, |v| v["max_position_embeddings"] = (1u64 << 20).into());
    Engine::load(&dir.to_string_lossy(), EngineOptions::default()).expect("loads");
}

// ------------------------------------------------------ 7. malformed GGUF

/// A metadata value of a hand-written GGUF.
enum Md {
    U32(u32),
    U64(u64),
    F32(f32),
    Str(&'static str),
}

/// A tensor entry: name, dimensions (ggml order: columns first), type
/// code, offset.
struct Entry(&'static str, Vec<u64>, u32, u64);

/// A GGUF v3 file: metadata, tensor entries and `data` after the header,
/// aligned to 32 bytes.
fn gguf(md: &[(&str, Md)], tensors: &[Entry], data: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    let s = |b: &mut Vec<u8>, t: &str| {
        b.extend((t.len() as u64).to_le_bytes());
        b.extend(t.as_bytes());
    };
    b.extend(b"GGUF");
    b.extend(3u32.to_le_bytes());
    b.extend((tensors.len() as u64).to_le_bytes());
    b.extend((md.len() as u64).to_le_bytes());
    for (k, v) in md {
        s(&mut b, k);
        match v {
            Md::U32(x) => {
                b.extend(4u32.to_le_bytes());
                b.extend(x.to_le_bytes());
            }
            Md::F32(x) => {
                b.extend(6u32.to_le_bytes());
                b.extend(x.to_le_bytes());
            }
            Md::Str(x) => {
                b.extend(8u32.to_le_bytes());
                s(&mut b, x);
            }
            Md::U64(x) => {
                b.extend(10u32.to_le_bytes());
                b.extend(x.to_le_bytes());
            }
        }
    }
    for Entry(name, dims, ty, offset) in tensors {
        s(&mut b, name);
        b.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            b.extend(d.to_le_bytes());
        }
        b.extend(ty.to_le_bytes());
        b.extend(offset.to_le_bytes());
    }
    while b.len() % 32 != 0 {
        b.push(0);
    }
    b.extend(data);
    b
}

/// A one-layer Qwen2 shape, with `edit` applied to its metadata.
fn metadata(edit: impl Fn(&mut Vec<(&'static str, Md)>)) -> Vec<(&'static str, Md)> {
    let mut md = vec![
        ("general.architecture", Md::Str("qwen2")),
        ("qwen2.embedding_length", Md::U32(64)),
        ("qwen2.feed_forward_length", Md::U32(128)),
        ("qwen2.block_count", Md::U32(1)),
        ("qwen2.attention.head_count", Md::U32(4)),
        ("qwen2.attention.head_count_kv", Md::U32(2)),
        ("qwen2.context_length", Md::U32(512)),
        ("qwen2.rope.freq_base", Md::F32(1e6)),
        ("qwen2.attention.layer_norm_rms_epsilon", Md::F32(1e-6)),
    ];
    edit(&mut md);
    md
}

fn set(md: &mut [(&'static str, Md)], key: &str, v: Md) {
    md.iter_mut().find(|(k, _)| *k == key).expect("key").1 = v;
}

/// An embedding (32 tokens × 64, f32) and a final norm after it.
fn tensors() -> Vec<Entry> {
    vec![
        Entry("token_embd.weight", vec![64, 32], 0, 0),
        Entry("output_norm.weight", vec![64], 0, 64 * 32 * 4),
    ]
}

const DATA: usize = 64 * 32 * 4 + 64 * 4;

#[test]
fn malformed_gguf_files_are_refused_in_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let data = vec![0u8; DATA];
    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
    // A context of 2^39 positions: its RoPE table alone was 549 GB.
    cases.push((
        "qwen2.context_length = 549755813888, more than the engine's limit of 1048576 positions",
        gguf(
            &metadata(|m| set(m, "qwen2.context_length", Md::U64(1 << 39))),
            &tensors(),
            &data,
        ),
    ));
    cases.push((
        "metadata general.alignment is 0, not a power of two",
        gguf(
            &metadata(|m| m.push(("general.alignment", Md::U32(0)))),
            &tensors(),
            &data,
        ),
    ));
    // The norm's offset inside the embedding's bytes.
    let mut overlap = tensors();
    overlap[1].3 = 64 * 4;
    cases.push((
        "tensors token_embd.weight and output_norm.weight share bytes",
        gguf(&metadata(|_| {}), &overlap, &data),
    ));
    // The embedding typed F16 where its bytes are f32 is fine by itself; one
    // typed so it runs past the file is not.
    let mut past = tensors();
    past[1].1 = vec![64 * 1024];
    cases.push((
        "tensor output_norm.weight: needs 262144 bytes from offset 8192 past the header",
        gguf(&metadata(|_| {}), &past, &data),
    ));
    let mut twice = tensors();
    twice.push(Entry("output_norm.weight", vec![64], 0, 64 * 32 * 4));
    cases.push((
        "tensor output_norm.weight: listed twice",
        gguf(&metadata(|_| {}), &twice, &data),
    ));
    let mut huge = tensors();
    huge.push(Entry(
        "blk.0.attn_norm.weight",
        vec![1 << 32, 1 << 32, 4],
        0,
        0,
    ));
    cases.push((
        "tensor blk.0.attn_norm.weight: dimensions [4294967296, 4294967296, 4] (zero, or a product past 2^64)",
        gguf(&metadata(|_| {}), &huge, &data),
    ));
    cases.push((
        "qwen2.attention.layer_norm_rms_epsilon = NaN, not a finite positive number",
        gguf(
            &metadata(|m| {
                set(
                    m,
                    "qwen2.attention.layer_norm_rms_epsilon",
                    Md::F32(f32::NAN),
                )
            }),
            &tensors(),
            &data,
        ),
    ));
    cases.push((
        "qwen2.rope.freq_base = NaN, not a finite positive number",
        gguf(
            &metadata(|m| set(m, "qwen2.rope.freq_base", Md::F32(f32::NAN))),
            &tensors(),
            &data,
        ),
    ));
    cases.push((
        "qwen2.attention.head_count = 4 is not a multiple of qwen2.attention.head_count_kv = 3",
        gguf(
            &metadata(|m| set(m, "qwen2.attention.head_count_kv", Md::U32(3))),
            &tensors(),
            &data,
        ),
    ));
    cases.push((
        "qwen2.block_count = 1000000, more than the engine's limit of 1024",
        gguf(
            &metadata(|m| set(m, "qwen2.block_count", Md::U32(1_000_000))),
            &tensors(),
            &data,
        ),
    ));
    // The unedited file passes every check above (and lacks a tokenizer).
    let base = tmp.path().join("base.gguf");
    std::fs::write(&base, gguf(&metadata(|_| {}), &tensors(), &data)).unwrap();
    generate_refused(&base, &[], "tokenizer");
    for (i, (needle, bytes)) in cases.into_iter().enumerate() {
        let f = tmp.path().join(format!("case{i}.gguf"));
        std::fs::write(&f, bytes).unwrap();
        generate_refused(&f, &[], needle);
    }
}

#[test]
#[cfg_attr(
    not(has_default_model),
    ignore = "needs the default model: run models/fetch.sh"
)]
fn a_truncated_default_model_copy_is_refused_before_mapping() {
    let model = default_model();
    let tmp = tempfile::tempdir().unwrap();
    // Another name: the shipped model's own name is checked by its sha256.
    let copy: PathBuf = tmp.path().join("renamed.gguf");
    let bytes = std::fs::read(&model).unwrap();
    std::fs::write(&copy, &bytes[..bytes.len() - 4096]).unwrap();
    generate_refused(&copy, &[], "(truncated download?)");
}

#[test]
#[cfg_attr(
    not(has_default_model),
    ignore = "needs the default model: run models/fetch.sh"
)]
fn a_huge_context_length_in_a_real_gguf_is_refused_not_allocated() {
    let model = default_model();
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("renamed.gguf");
    std::fs::copy(&model, &copy).unwrap();
    // The u32 value after the key and its type: 2^32 - 1 positions, whose
    // RoPE table was a 549 GB allocation that aborted.
    let mut head = vec![0u8; 4096];
    use std::io::{Read, Seek, Write};
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&copy)
        .unwrap();
    f.read_exact(&mut head).unwrap();
    let key = b"qwen2.context_length";
    let at = head.windows(key.len()).position(|w| w == key).unwrap() + key.len();
    assert_eq!(head[at..at + 4], 4u32.to_le_bytes(), "a u32 value");
    f.seek(std::io::SeekFrom::Start(at as u64 + 4)).unwrap();
    f.write_all(&u32::MAX.to_le_bytes()).unwrap();
    drop(f);
    generate_refused(
        &copy,
        &[],
        "qwen2.context_length = 4294967295, more than the engine's limit of 1048576 positions",
    );
}

// --------------------------------------------------------- 8. templates

/// A copy of tiny-qwen2 whose chat template is `template`.
fn with_template(dir: &Path, name: u64, template: &str) -> PathBuf {
    let d = tiny_copy(dir, "tiny-qwen2", name);
    let tc = d.join("tokenizer_config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&tc).unwrap()).unwrap();
    v["chat_template"] = template.into();
    std::fs::write(&tc, v.to_string()).unwrap();
    d
}

#[test]
fn templates_that_never_finish_are_stopped() {
    let tmp = tempfile::tempdir().unwrap();
    let endless = with_template(
        tmp.path(),
        600,
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}",
    );
    let t = Instant::now();
    generate_refused(&endless, &[], "instructions (a loop without end?)");
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    let huge = with_template(
        tmp.path(),
        601,
        "{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}",
    );
    generate_refused(&huge, &[], "more than the limit of 67108864 bytes");
    // One that loops only on longer conversations passes the load; the
    // request that sets it off gets the error.
    let late = with_template(
        tmp.path(),
        602,
        "{% if messages|length > 2 %}{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}{% endif %}{{ messages[-1].content }}",
    );
    let mut engine = Engine::load(&late.to_string_lossy(), EngineOptions::default()).unwrap();
    let s = engine.open_session();
    let req = ChatRequest::greedy(
        vec![
            Message::new(Role::User, "a"),
            Message::new(Role::Assistant, "b"),
            Message::new(Role::User, "c"),
        ],
        4,
    );
    let t = Instant::now();
    match engine.chat(s, req) {
        Err(BackendError::Template(m)) => assert!(m.contains("instructions"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
}
