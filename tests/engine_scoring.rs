//! Prompt log-probabilities and the sampling parameters, on the engine
//! itself: every prompt token is scored from the same bits a cold prefill of
//! its prefix gives, whatever the chunking, the batch or the cache, and each
//! sampling parameter does what it says, deterministically.

mod engine_common;

use std::path::PathBuf;

use engine_common::{cold_logits, load, root, run_alone, run_batched};
use statebench::backend::{Backend, ChatRequest, Sampling};
use statebench::engine::sampling;

fn tiny() -> PathBuf {
    root().join("tests/fixtures/engine/tiny-qwen2")
}

/// 150 token ids (more than two scoring chunks), fixed.
fn prompt() -> Vec<u32> {
    let mut r = statebench::rng::Rng::new(5);
    (0..150).map(|_| (r.next_u64() % 290) as u32).collect()
}

fn scoring(ids: &[u32], k: usize, max_tokens: usize) -> ChatRequest {
    ChatRequest {
        prompt_ids: Some(ids.to_vec()),
        prompt_logprobs: Some(k),
        ..ChatRequest::greedy(Vec::new(), max_tokens)
    }
}

/// The prompt's scores as (logprob, top ids) per token after the first.
fn scores(reply: &statebench::backend::ChatReply) -> Vec<(u32, f32, Vec<u32>)> {
    assert!(
        reply.prompt[0].logprob.is_none(),
        "the first token has no score"
    );
    reply.prompt[1..]
        .iter()
        .map(|t| {
            let top = t.top.iter().map(|c| c.id).collect();
            (t.id, t.logprob.expect("scored"), top)
        })
        .collect()
}

#[test]
fn prompt_scores_are_cold_prefill_bits_whatever_the_batch_or_cache() {
    let mut engine = load(&tiny());
    let ids = prompt();
    let reply = run_alone(&mut engine, scoring(&ids, 3, 0));
    assert_eq!(reply.prompt.len(), ids.len());
    assert!(reply.tokens.is_empty(), "max_tokens 0 generates nothing");
    assert_eq!(reply.usage.prompt_tokens, ids.len());
    let got = scores(&reply);
    // Each position against a cold prefill of its prefix (last-row logits).
    for p in 1..ids.len() {
        let want = sampling::score(&cold_logits(&engine, &ids[..p]), ids[p], 3);
        let (id, lp, top) = &got[p - 1];
        assert_eq!(*id, ids[p]);
        assert_eq!(lp.to_bits(), want.logprob.to_bits(), "position {p}");
        assert_eq!(*top, want.top.iter().map(|t| t.0).collect::<Vec<_>>());
    }
    // A prefix scores the same bits as inside the longer prompt.
    let short = run_alone(&mut engine, scoring(&ids[..70], 3, 0));
    assert_eq!(scores(&short)[..], got[..69]);
    // Beside requests that decode and another that scores.
    let others = [
        ChatRequest {
            prompt_ids: Some(ids[40..90].to_vec()),
            ..ChatRequest::greedy(Vec::new(), 12)
        },
        scoring(&ids[10..], 2, 4),
        ChatRequest {
            prompt_ids: Some(ids[..120].to_vec()),
            ..ChatRequest::greedy(Vec::new(), 20)
        },
    ];
    let batched = run_batched(&mut engine, scoring(&ids, 3, 0), &others);
    assert_eq!(scores(&batched), got);
    // On a session whose cache already holds the prompt.
    let s = engine.open_session();
    let warm = ChatRequest {
        prompt_ids: Some(ids.clone()),
        ..ChatRequest::greedy(Vec::new(), 5)
    };
    engine.chat(s, warm).expect("chat");
    let cached = engine.chat(s, scoring(&ids, 3, 0)).expect("scores");
    assert_eq!(
        cached.usage.cached_tokens, 0,
        "a scored prompt is recomputed"
    );
    assert_eq!(scores(&cached), got);
    // Scoring and generating together: the reply is the unscored one.
    let plain = run_alone(
        &mut engine,
        ChatRequest {
            prompt_ids: Some(ids.clone()),
            ..ChatRequest::greedy(Vec::new(), 6)
        },
    );
    let both = run_alone(&mut engine, scoring(&ids, 0, 6));
    assert_eq!(both.tokens, plain.tokens);
    assert!(both.prompt[1..].iter().all(|t| t.top.is_empty()));
}

#[test]
fn sampling_parameters_are_honoured_and_deterministic() {
    let mut engine = load(&tiny());
    let ids = prompt()[..30].to_vec();
    let req = |temperature: f32, s: Sampling| ChatRequest {
        prompt_ids: Some(ids.clone()),
        temperature,
        seed: 11,
        sampling: s,
        ..ChatRequest::greedy(Vec::new(), 24)
    };
    let greedy = run_alone(&mut engine, req(0.0, Sampling::default())).tokens;
    let hot = run_alone(&mut engine, req(1.5, Sampling::default())).tokens;
    assert_ne!(hot, greedy, "the fixture samples away from greedy at 1.5");
    // Cuts that keep only the best token sample the greedy reply.
    for cut in [
        Sampling {
            top_k: Some(1),
            ..Sampling::default()
        },
        Sampling {
            top_p: Some(1e-6),
            ..Sampling::default()
        },
        Sampling {
            min_p: Some(1.0),
            ..Sampling::default()
        },
    ] {
        assert_eq!(
            run_alone(&mut engine, req(1.5, cut.clone())).tokens,
            greedy,
            "{cut:?}"
        );
    }
    // A bias of 100 on one token makes greedy choose it every time.
    let biased = run_alone(
        &mut engine,
        req(
            0.0,
            Sampling {
                logit_bias: vec![(17, 100.0)],
                ..Sampling::default()
            },
        ),
    );
    assert!(
        biased.tokens.iter().all(|&t| t == 17),
        "{:?}",
        biased.tokens
    );
    // Penalties: greedy repeats itself on random weights; a penalty stops
    // the repeats it punishes.
    let repeats = |t: &[u32]| t.len() - t.iter().collect::<std::collections::BTreeSet<_>>().len();
    assert!(repeats(&greedy) > 0, "{greedy:?}");
    for s in [
        Sampling {
            presence_penalty: 2.0,
            ..Sampling::default()
        },
        Sampling {
            frequency_penalty: 2.0,
            ..Sampling::default()
        },
        Sampling {
            repetition_penalty: Some(10.0),
            ..Sampling::default()
        },
    ] {
        let t = run_alone(&mut engine, req(0.0, s.clone())).tokens;
        assert!(repeats(&t) < repeats(&greedy), "{s:?}: {t:?} vs {greedy:?}");
    }
    // min_tokens holds the stop token back.
    let eos = 299;
    let stop_soon = run_alone(
        &mut engine,
        req(
            0.0,
            Sampling {
                logit_bias: vec![(eos, 100.0)],
                ..Sampling::default()
            },
        ),
    );
    assert_eq!(stop_soon.tokens, vec![eos]);
    let held = run_alone(
        &mut engine,
        req(
            0.0,
            Sampling {
                logit_bias: vec![(eos, 100.0)],
                min_tokens: 5,
                ..Sampling::default()
            },
        ),
    );
    assert_eq!(held.tokens.len(), 6, "{:?}", held.tokens);
    assert_eq!(held.tokens.last(), Some(&eos));
    // Sampled with every parameter: the same tokens again, and beside others.
    let all = Sampling {
        top_k: Some(40),
        top_p: Some(0.9),
        min_p: Some(0.01),
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        repetition_penalty: Some(1.3),
        logit_bias: vec![(3, -5.0), (8, 2.0)],
        min_tokens: 3,
    };
    let once = run_alone(&mut engine, req(0.9, all.clone())).tokens;
    assert_eq!(run_alone(&mut engine, req(0.9, all.clone())).tokens, once);
    let others = [req(1.0, Sampling::default()), req(0.0, Sampling::default())];
    assert_eq!(
        run_batched(&mut engine, req(0.9, all), &others).tokens,
        once
    );
}

#[test]
fn out_of_range_sampling_is_refused_in_one_line() {
    let mut engine = load(&tiny());
    for (s, needle) in [
        (
            Sampling {
                top_p: Some(-5.0),
                ..Sampling::default()
            },
            "top_p",
        ),
        (
            Sampling {
                frequency_penalty: 1e9,
                ..Sampling::default()
            },
            "frequency_penalty",
        ),
        (
            Sampling {
                logit_bias: vec![(1_000_000, 1.0)],
                ..Sampling::default()
            },
            "outside the model's",
        ),
        (
            Sampling {
                min_tokens: 99,
                ..Sampling::default()
            },
            "min_tokens",
        ),
    ] {
        let s2 = engine.open_session();
        let req = ChatRequest {
            prompt_ids: Some(vec![1, 2, 3]),
            sampling: s,
            ..ChatRequest::greedy(Vec::new(), 8)
        };
        let e = engine.submit(s2, req).unwrap_err();
        let line = statebench::one_line(&e);
        assert!(line.contains(needle), "{line}");
    }
}

#[test]
fn a_constrained_number_ends_though_the_model_wants_more_digits() {
    use statebench::backend::Constraint;
    let mut engine = load(&tiny());
    let one = engine.encode("1").unwrap()[0];
    let req = ChatRequest {
        prompt_ids: Some(prompt()[..20].to_vec()),
        constraint: Some(Constraint::JsonSchema(
            serde_json::json!({"type": "number"}),
        )),
        // The model would write "1" for ever.
        sampling: Sampling {
            logit_bias: vec![(one, 60.0)],
            ..Sampling::default()
        },
        ..ChatRequest::greedy(Vec::new(), 400)
    };
    let reply = run_alone(&mut engine, req);
    assert_eq!(
        reply.finish,
        statebench::backend::Finish::Stop,
        "{}",
        reply.content
    );
    let n: f64 = reply
        .content
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{e}: {}", reply.content));
    assert!(n > 0.0);
    let longest = reply
        .content
        .split(|c: char| !c.is_ascii_digit())
        .map(str::len)
        .max()
        .unwrap();
    assert!(
        longest <= statebench::engine::constrain::MAX_DIGIT_RUN + 8,
        "{}",
        reply.content
    );
    assert!(
        longest >= statebench::engine::constrain::MAX_DIGIT_RUN,
        "{}",
        reply.content
    );
}
