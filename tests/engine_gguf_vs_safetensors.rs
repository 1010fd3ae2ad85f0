//! The default GGUF dequantized and written as an f32 safetensors directory
//! (by this test) loads through the safetensors path; its greedy tokens are
//! compared with transformers on the same dequantized weights
//! (`default_model_greedy.json`) and with the GGUF path's quantized kernels.

mod engine_common;

use std::path::Path;

use engine_common::*;
use statebench::backend::Message;
use statebench::engine::Engine;

fn write_dequantized(engine: &Engine, dir: &Path) {
    let m = engine.model();
    let c = &m.cfg;
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    let mat = |name: &str, w: &statebench_kernels::Matrix| {
        (name.to_string(), vec![w.rows(), w.cols()], w.to_f32())
    };
    tensors.push(mat("model.embed_tokens.weight", &m.embed));
    if let Some(h) = &m.lm_head {
        tensors.push(mat("lm_head.weight", h));
    }
    tensors.push(("model.norm.weight".into(), vec![c.hidden], m.norm.clone()));
    for (i, l) in m.layers.iter().enumerate() {
        let p = format!("model.layers.{i}");
        tensors.push((
            format!("{p}.input_layernorm.weight"),
            vec![c.hidden],
            l.attn_norm.clone(),
        ));
        tensors.push((
            format!("{p}.post_attention_layernorm.weight"),
            vec![c.hidden],
            l.mlp_norm.clone(),
        ));
        for (n, lin) in [
            ("q", &l.attn.q),
            ("k", &l.attn.k),
            ("v", &l.attn.v),
            ("o", &l.attn.o),
        ] {
            tensors.push(mat(&format!("{p}.self_attn.{n}_proj.weight"), &lin.w));
            if let Some(b) = &lin.b {
                tensors.push((
                    format!("{p}.self_attn.{n}_proj.bias"),
                    vec![b.len()],
                    b.clone(),
                ));
            }
        }
        for (n, lin) in [
            ("gate", &l.mlp.gate),
            ("up", &l.mlp.up),
            ("down", &l.mlp.down),
        ] {
            tensors.push(mat(&format!("{p}.mlp.{n}_proj.weight"), &lin.w));
        }
    }
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .into_iter()
        .map(|(n, s, v)| (n, s, v.iter().flat_map(|x| x.to_le_bytes()).collect()))
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = bytes
        .iter()
        .map(|(n, s, b)| {
            let v = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b)
                .expect("view");
            (n.clone(), v)
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).expect("write");
    let config = serde_json::json!({
        "model_type": c.arch.as_str(), "vocab_size": c.vocab, "hidden_size": c.hidden,
        "intermediate_size": c.intermediate, "num_hidden_layers": c.layers,
        "num_attention_heads": c.heads, "num_key_value_heads": c.kv_heads,
        "head_dim": c.head_dim, "rope_theta": c.rope_theta, "rms_norm_eps": c.rms_eps,
        "max_position_embeddings": c.context, "tie_word_embeddings": m.lm_head.is_none(),
    });
    std::fs::write(dir.join("config.json"), config.to_string()).expect("config");
    engine
        .tokenizer()
        .save(dir.join("tokenizer.json"), false)
        .expect("tokenizer.json");
    let tc = serde_json::json!({ "chat_template": engine.template_source() });
    std::fs::write(dir.join("tokenizer_config.json"), tc.to_string()).expect("tokenizer_config");
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[test]
#[cfg_attr(
    not(has_default_model),
    ignore = "needs the default model: run models/fetch.sh"
)]
fn dequantized_safetensors_path_agrees_with_gguf_and_transformers() {
    let path = default_model();
    let gguf = load(&path);
    let tmp = tempfile::tempdir().expect("tempdir");
    write_dequantized(&gguf, tmp.path());
    let st = load(tmp.path());

    let text =
        std::fs::read_to_string(root().join("tests/fixtures/engine/default_model_greedy.json"))
            .expect("fixture");
    let fixture: serde_json::Value = serde_json::from_str(&text).expect("parses");
    let cases = fixture["cases"].as_array().expect("cases");
    let (mut st_tf, mut gguf_st, mut total) = (0, 0, 0);
    for case in cases {
        let messages: Vec<Message> =
            serde_json::from_value(case["messages"].clone()).expect("messages");
        let want_prompt: Vec<u32> =
            serde_json::from_value(case["prompt_ids"].clone()).expect("ids");
        let want: Vec<u32> = serde_json::from_value(case["greedy_ids"].clone()).expect("ids");
        for e in [&gguf, &st] {
            let prompt = e
                .encode(&e.render(&messages, false).expect("render"))
                .expect("encode");
            assert_eq!(prompt, want_prompt, "prompt ids of {messages:?}");
        }
        let (g, _) = greedy_incremental(&gguf, &want_prompt, want.len());
        let (s, _) = greedy_incremental(&st, &want_prompt, want.len());
        let a = common_prefix(&s, &want);
        let b = common_prefix(&g, &s);
        eprintln!(
            "{:?}: safetensors vs transformers {a}/{n} tokens, GGUF vs safetensors {b}/{n}",
            messages.last().map(|m| &m.content),
            n = want.len()
        );
        st_tf += a;
        gguf_st += b;
        total += want.len();
        // The reply itself (up to the end-of-turn token) must agree on both paths.
        let stops = ["<|im_end|>", "<|endoftext|>"].map(|t| gguf.tokenizer().token_to_id(t));
        let end = want
            .iter()
            .position(|t| stops.contains(&Some(*t)))
            .unwrap_or(8)
            .max(1);
        assert!(
            a >= end,
            "safetensors path diverges from transformers inside the reply"
        );
        assert!(
            g[0] == s[0],
            "first token differs between the GGUF and safetensors paths"
        );
    }
    eprintln!(
        "agreement: safetensors vs transformers {st_tf}/{total} tokens; GGUF vs safetensors {gguf_st}/{total} tokens"
    );
}
