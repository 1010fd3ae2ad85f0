//! The default GGUF (Qwen2.5-Coder-0.5B-Instruct, Q4_K_M mix): reference
//! agreement and the invariance promise (a request's tokens are the same
//! alone or batched, cached or cold, in any process), bit for bit.

mod engine_common;

use engine_common::*;
use statebench::backend::{Backend, BackendError, ChatRequest, Finish, Message, Role};
use statebench::engine::template::ChatTemplate;
use statebench::engine::{Engine, EngineOptions, WeightLayout};

fn fixture(name: &str) -> serde_json::Value {
    let path = root().join("tests/fixtures/engine").join(name);
    let text = std::fs::read_to_string(&path).expect("fixture exists");
    serde_json::from_str(&text).expect("fixture parses")
}

fn others(n: usize) -> Vec<ChatRequest> {
    let topics = [
        "Write a haiku about rust.",
        "List three prime numbers.",
        "Explain recursion in one sentence to a child who likes trains and puzzles.",
        "What is 17 times 23?",
        "Name a colour.",
        "Translate 'good morning' into German, French and Spanish, one per line.",
        "Write a SQL query that counts rows in a table named orders.",
        "Why is the sky blue?",
    ];
    (0..n)
        .map(|i| {
            let mut r = ask(topics[i % topics.len()], 6 + (i * 5) % 23);
            if i % 3 == 1 {
                // Sampled neighbours: their randomness must not leak into the target.
                r.temperature = 0.8;
                r.seed = i as u64;
            }
            r
        })
        .collect()
}

#[test]
#[cfg_attr(
    not(has_default_model),
    ignore = "needs the default model: run models/fetch.sh"
)]
fn france_answers_paris_at_temperature_zero() {
    let path = default_model();
    let mut engine = load(&path);
    let reply = run_alone(
        &mut engine,
        ask("What is the capital of France? Answer in one word.", 16),
    );
    assert!(
        reply.content.contains("Paris"),
        "reply: {:?}",
        reply.content
    );
    assert_eq!(reply.finish, Finish::Stop);
    let u = reply.usage;
    assert_eq!(u.completion_tokens, reply.tokens.len());
    assert!(u.prompt_tokens > 20 && u.cached_tokens == 0);
    assert!(u.prefill_secs > 0.0);
}

#[test]
#[cfg_attr(
    not(has_default_model),
    ignore = "needs the default model: run models/fetch.sh"
)]
fn tokenizer_matches_reference_ids() {
    let path = default_model();
    let engine = load(&path);
    let cases = fixture("tokenizer_cases.json");
    let cases = cases["cases"].as_array().expect("cases");
    assert!(cases.len() >= 10);
    for c in cases {
        let text = c["text"].as_str().expect("text");
        let want: Vec<u32> = serde_json::from_value(c["ids"].clone()).expect("ids");
        let got = engine.encode(text).expect("encode");
        assert_eq!(got, want, "text {text:?}");
    }
}

/// Renders the fixture's cases of `template` with `tmpl`, each equal to
/// the recorded text, and encodes those with recorded ids with `engine`;
/// returns how many cases were checked.
fn check_template_cases(template: &str, tmpl: &ChatTemplate, engine: Option<&Engine>) -> usize {
    let cases = fixture("chat_template_cases.json");
    let mut checked = 0;
    for c in cases["cases"].as_array().expect("cases") {
        if c["template"].as_str() != Some(template) {
            continue;
        }
        let got = tmpl
            .render_json(
                &c["messages"],
                c["add_generation_prompt"].as_bool().unwrap_or(false),
                c["enable_thinking"].as_bool(),
            )
            .expect("renders");
        let want = c["rendered"].as_str().expect("rendered");
        assert_eq!(got, want, "case {} ({template})", c["name"]);
        if let Some(ids) = c.get("ids") {
            let e = engine.expect("a case with ids has an engine to encode it");
            let want_ids: Vec<u32> = serde_json::from_value(ids.clone()).expect("ids");
            assert_eq!(
                e.encode(&got).expect("encode"),
                want_ids,
                "ids of case {}",
                c["name"]
            );
        }
        checked += 1;
    }
    checked
}

#[test]
fn chat_templates_render_byte_identical() {
    let qwen3_src =
        std::fs::read_to_string(root().join("tests/fixtures/engine/qwen3_chat_template.jinja"))
            .expect("qwen3 template");
    let qwen3 = ChatTemplate::new(&qwen3_src).expect("qwen3 compiles");
    for c in fixture("chat_template_cases.json")["cases"]
        .as_array()
        .expect("cases")
    {
        let known = matches!(c["template"].as_str(), Some("qwen3" | "qwen2.5"));
        assert!(known, "unknown template {}", c["template"]);
    }
    let checked = check_template_cases("qwen3", &qwen3, None);
    assert!(checked >= 30, "only {checked} cases checked");
}

/// Qwen2.5 cases render with the template read from the GGUF itself.
#[test]
#[cfg_attr(
    not(has_default_model),
    ignore = "needs the default model: run models/fetch.sh"
)]
fn default_model_template_renders_byte_identical() {
    let engine = load(&default_model());
    let checked = check_template_cases("qwen2.5", engine.template(), Some(&engine));
    assert!(checked >= 10, "only {checked} cases checked");
}

#[test]
#[cfg_attr(
    not(has_default_model),
    ignore = "needs the default model: run models/fetch.sh"
)]
fn default_system_prompt_comes_from_the_template() {
    let path = default_model();
    let engine = load(&path);
    let text = engine
        .render(&[Message::new(Role::User, "hi")], false)
        .expect("render");
    assert!(text.starts_with(
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    ));
    assert!(text.ends_with("<|im_start|>assistant\n"));
}

/// Invariance (a): tolerance 0 — the logits are compared bit for bit.
#[test]
#[cfg_attr(
    not(has_default_model),
    ignore = "needs the default model: run models/fetch.sh"
)]
fn invariance_a_incremental_decode_equals_full_recompute() {
    let path = default_model();
    let engine = load(&path);
    let text = engine
        .render(
            &[Message::new(Role::User, "Count from one to ten in words.")],
            false,
        )
        .expect("render");
    let prompt = engine.encode(&text).expect("encode");
    check_incremental_equals_recompute(&engine, &prompt, 10);
}

#[test]
#[cfg_attr(
    not(has_default_model),
    ignore = "needs the default model: run models/fetch.sh"
)]
fn invariance_b_tokens_identical_alone_and_in_batches_of_2_4_16() {
    let path = default_model();
    let mut engine = load(&path);
    let mut target = ask("Name three rivers in Europe.", 20);
    check_batch_invariance(&mut engine, target.clone(), &others(15));
    // A sampled request too: its own seeded RNG makes it batch-independent.
    target.temperature = 0.7;
    target.seed = 1234;
    check_batch_invariance(&mut engine, target, &others(15));
}

#[test]
#[cfg_attr(
    not(has_default_model),
    ignore = "needs the default model: run models/fetch.sh"
)]
fn invariance_c_cached_prefix_equals_cold_prefill() {
    let path = default_model();
    let mut engine = load(&path);
    let text = engine
        .render(
            &[
                Message::new(Role::System, "You are a careful bookkeeper."),
                Message::new(Role::User, "Book order 17 for ACME, then summarise."),
            ],
            false,
        )
        .expect("render");
    let prompt = engine.encode(&text).expect("encode");
    let n = prompt.len();
    check_split_prefill(&engine, &prompt, &[1, 5, n / 3, n / 2, n - 2, n - 1]);

    // Through sessions: turn 2 reuses turn 1's cache and equals a cold run.
    let mut msgs = vec![Message::new(
        Role::User,
        "Give me a word that rhymes with cat.",
    )];
    let s = engine.open_session();
    let r1 = engine
        .chat(s, ChatRequest::greedy(msgs.clone(), 12))
        .expect("turn 1");
    msgs.push(Message::new(Role::Assistant, r1.content.clone()));
    msgs.push(Message::new(Role::User, "And one that rhymes with dog?"));
    let warm = engine
        .chat(s, ChatRequest::greedy(msgs.clone(), 12))
        .expect("turn 2");
    assert!(
        warm.usage.cached_tokens > r1.usage.prompt_tokens,
        "turn 2 reused {} tokens",
        warm.usage.cached_tokens
    );
    let cold = run_alone(&mut engine, ChatRequest::greedy(msgs, 12));
    assert_eq!(cold.usage.cached_tokens, 0);
    assert_eq!(warm.tokens, cold.tokens);
}

#[test]
#[cfg_attr(
    not(has_default_model),
    ignore = "needs the default model: run models/fetch.sh"
)]
fn invariance_d_identical_across_processes_thread_counts_and_weight_layouts() {
    let path = default_model();
    let run = |threads: &str, weights: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_statebench"))
            .args(["generate", "--device", "cpu", "--model"])
            .arg(&path)
            .args([
                "--prompt",
                "Write a limerick about a ledger.",
                "--max-tokens",
                "24",
                "--temperature",
                "0.9",
                "--seed",
                "7",
                "--print-tokens",
                "--threads",
                threads,
                "--weights",
                weights,
            ])
            .output()
            .expect("spawn statebench");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let a = run("2", "widened");
    let b = run("2", "widened");
    let c = run("1", "widened");
    let d = run("1", "native");
    assert!(a.contains("tokens: ["));
    assert_eq!(a, b, "two processes differ");
    assert_eq!(a, c, "one thread differs from two");
    assert_eq!(
        a, d,
        "weights at the file's bits differ from widened weights"
    );
}

#[test]
#[cfg_attr(
    not(has_default_model),
    ignore = "needs the default model: run models/fetch.sh"
)]
fn invariance_e_weights_at_file_bits_equal_widened_weights() {
    let path = default_model();
    let mut widened = load(&path);
    let opts = EngineOptions {
        weights: WeightLayout::Native,
        ..EngineOptions::default()
    };
    let mut native = Engine::load(&path.to_string_lossy(), opts).expect("loads");
    // At the file's bits the matrices take exactly the file's bytes.
    let mut file = std::fs::File::open(&path).expect("open");
    let gguf = candle_core::quantized::gguf_file::Content::read(&mut file).expect("gguf");
    let file_bytes: usize = gguf
        .tensor_infos
        .values()
        .filter(|t| t.shape.dims().len() == 2)
        .map(|t| t.shape.elem_count() / t.ggml_dtype.block_size() * t.ggml_dtype.type_size())
        .sum();
    assert_eq!(native.model().weight_bytes(), file_bytes);
    assert!(widened.model().weight_bytes() > file_bytes * 5 / 4);
    let text = widened
        .render(
            &[Message::new(Role::User, "Book order 17 for ACME.")],
            false,
        )
        .expect("render");
    let prompt = widened.encode(&text).expect("encode");
    assert_eq!(
        cold_logits(&widened, &prompt),
        cold_logits(&native, &prompt),
        "prefill logits"
    );
    let target = ask("Name three rivers in Europe.", 16);
    let a = run_batched(&mut widened, target.clone(), &others(5));
    let b = run_batched(&mut native, target, &others(5));
    assert_eq!(a.tokens, b.tokens, "batched decode");
}

#[test]
#[cfg_attr(
    not(has_default_model),
    ignore = "needs the default model: run models/fetch.sh"
)]
fn context_overflow_is_its_own_error() {
    let path = default_model();
    let mut engine = load(&path);
    let s = engine.open_session();
    let err = engine
        .submit(s, ask("hello", engine.model().cfg.context))
        .expect_err("overflow");
    assert!(matches!(err, BackendError::ContextOverflow { .. }), "{err}");
    assert!(err.to_string().contains("context overflow"));
}

#[test]
#[cfg_attr(
    not(has_default_model),
    ignore = "needs the default model: run models/fetch.sh"
)]
fn kv_budget_queues_or_refuses() {
    let path = default_model();
    let per_token = 24 * 2 * 2 * 64 * 4;
    let opts = EngineOptions {
        kv_budget_bytes: 100 * per_token,
        ..EngineOptions::default()
    };
    let mut engine = Engine::load(&path.to_string_lossy(), opts).expect("loads");
    let s = engine.open_session();
    let err = engine.submit(s, ask("hello", 90)).expect_err("never fits");
    assert!(matches!(err, BackendError::ExceedsKvBudget { .. }), "{err}");
    // Two requests that fit only one at a time: both finish, one after the other.
    let (a, b) = (engine.open_session(), engine.open_session());
    let ra = engine.submit(a, ask("Say yes.", 8)).expect("a");
    let rb = engine.submit(b, ask("Say no.", 8)).expect("b");
    let mut done = Vec::new();
    while engine.has_pending() {
        for (id, r) in engine.step().expect("step") {
            r.expect("reply");
            done.push(id);
        }
    }
    assert_eq!(done, vec![ra, rb]);
}

#[test]
#[cfg_attr(
    not(has_default_model),
    ignore = "needs the default model: run models/fetch.sh"
)]
fn idle_session_caches_count_in_the_kv_budget_and_are_evicted_lru() {
    let path = default_model();
    let per_token = 24 * 2 * 2 * 64 * 4;
    let budget = 100 * per_token;
    let opts = EngineOptions {
        kv_budget_bytes: budget,
        ..EngineOptions::default()
    };
    let mut small = Engine::load(&path.to_string_lossy(), opts).expect("loads");
    let mut large = load(&path);
    let turn = |e: &mut Engine, s, messages: &[Message], max| {
        e.submit(s, ChatRequest::greedy(messages.to_vec(), max))
            .expect("submit");
        let mut out = None;
        while e.has_pending() {
            for (_, r) in e.step().expect("step") {
                out = Some(r.expect("reply"));
            }
        }
        out.expect("a reply")
    };
    // Two short conversations leave their caches behind in both engines.
    let first = vec![Message::new(Role::User, "Say yes.")];
    let (a, b) = (small.open_session(), small.open_session());
    let reply_a = turn(&mut small, a, &first, 8);
    turn(&mut small, b, &[Message::new(Role::User, "Say no.")], 8);
    let idle = small.kv_bytes_in_use();
    assert!(idle > 0 && idle <= budget, "idle caches {idle} of {budget}");
    // A third request that fits only without them: both are dropped, oldest first.
    let long = vec![Message::new(
        Role::User,
        "Write the word pear. ".repeat(6).as_str(),
    )];
    let n = small
        .encode(&small.render(&long, false).expect("render"))
        .expect("encode")
        .len();
    let c = small.open_session();
    turn(&mut small, c, &long, 100 - n - 2);
    assert!(small.kv_bytes_in_use() <= budget);
    // Session a's next turn re-prefills from nothing, with the same reply as
    // an engine that kept its cache.
    let mut second = first.clone();
    second.push(Message::new(Role::Assistant, reply_a.content.clone()));
    second.push(Message::new(Role::User, "Again."));
    let evicted = turn(&mut small, a, &second, 8);
    let la = large.open_session();
    let kept_first = turn(&mut large, la, &first, 8);
    assert_eq!(kept_first.content, reply_a.content);
    let kept = turn(&mut large, la, &second, 8);
    assert_eq!(evicted.usage.cached_tokens, 0, "a's cache was evicted");
    assert!(
        kept.usage.cached_tokens > 0,
        "the large engine reused a's cache"
    );
    assert_eq!(evicted.content, kept.content);
    assert!(small.kv_bytes_in_use() <= budget);
}

#[test]
#[cfg_attr(
    not(has_default_model),
    ignore = "needs the default model: run models/fetch.sh"
)]
fn stop_strings_and_length_end_replies() {
    let path = default_model();
    let mut engine = load(&path);
    let mut req = ask("Count from 1 to 10, separated by commas, digits only.", 40);
    let full = run_alone(&mut engine, req.clone());
    assert!(full.content.contains("4,5"), "reply: {:?}", full.content);
    req.stop = vec![",5".into()];
    let cut = run_alone(&mut engine, req.clone());
    assert_eq!(cut.finish, Finish::Stop);
    assert!(
        cut.content.ends_with('4') && !cut.content.contains('5'),
        "{:?}",
        cut.content
    );
    req.stop.clear();
    req.max_tokens = 3;
    let short = run_alone(&mut engine, req);
    assert_eq!(short.finish, Finish::Length);
    assert_eq!(short.usage.completion_tokens, 3);
}

#[test]
#[cfg_attr(
    not(has_default_model),
    ignore = "needs the default model: run models/fetch.sh"
)]
fn exported_tokenizer_encodes_as_the_engine_does() {
    let engine = load(&default_model());
    let dir = tempfile::tempdir().unwrap();
    let files = engine.export_tokenizer(dir.path()).expect("exports");
    assert_eq!(files.len(), 3);
    let exported =
        tokenizers::Tokenizer::from_file(dir.path().join("tokenizer.json")).expect("loads");
    let cases = fixture("tokenizer_cases.json");
    for c in cases["cases"].as_array().expect("cases") {
        let text = c["text"].as_str().expect("text");
        let want: Vec<u32> = serde_json::from_value(c["ids"].clone()).expect("ids");
        for special in [false, true] {
            let got = exported.encode(text, special).expect("encode");
            assert_eq!(
                got.get_ids(),
                &want[..],
                "text {text:?}, add_special_tokens {special}"
            );
        }
    }
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("tokenizer_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(config["chat_template"], engine.template_source());
    assert_eq!(config["eos_token"], "<|im_end|>");
    assert_eq!(config["model_max_length"], engine.model().cfg.context);
}
