//! What a request may ask beyond its text, on the default GGUF: per-token
//! log-probabilities and constrained replies (a JSON Schema, a named tool,
//! no tool). Both keep the engine's promise: a request's tokens and scores
//! are the same alone and in a batch of others, bit for bit.

mod engine_common;

use engine_common::*;
use statebench::backend::{
    Backend, BackendError, ChatRequest, Constraint, Message, Role, Tool, MAX_TOP_LOGPROBS,
};

fn neighbours() -> Vec<ChatRequest> {
    let mut v = vec![
        ask("Write a haiku about rust.", 12),
        ask("List three prime numbers.", 9),
        ask("Why is the sky blue?", 20),
    ];
    v[1].temperature = 0.8;
    v[1].seed = 5;
    // A constrained neighbour too: its mask must not touch the others.
    v[2].constraint = Some(Constraint::JsonObject);
    v
}

#[test]
#[cfg_attr(
    not(has_default_model),
    ignore = "needs the default model: run models/fetch.sh"
)]
fn log_probabilities_are_the_models_and_batch_invariant() {
    let path = default_model();
    let mut engine = load(&path);
    let plain = ask("Name three colours.", 12);
    let scored = ChatRequest {
        logprobs: Some(5),
        ..plain.clone()
    };
    let a = run_alone(&mut engine, plain);
    let b = run_alone(&mut engine, scored.clone());
    // Scoring reads the logits on the host; the tokens are the same.
    assert_eq!(a.tokens, b.tokens);
    assert_eq!(a.content, b.content);
    assert!(a.logprobs.is_empty());
    let body = b.tokens.len() - usize::from(b.finish == statebench::backend::Finish::Stop);
    assert_eq!(b.logprobs.len(), body);
    let mut bytes = Vec::new();
    for t in &b.logprobs {
        assert!(t.chosen.logprob <= 0.0, "{t:?}");
        assert_eq!(t.top.len(), 5);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(t.top[0].id, t.chosen.id);
        assert_eq!(t.top[0].logprob, t.chosen.logprob);
        assert!(t.top.windows(2).all(|w| w[0].logprob >= w[1].logprob));
        bytes.extend_from_slice(&t.chosen.bytes);
    }
    assert_eq!(String::from_utf8(bytes).unwrap(), b.content);
    let c = run_batched(&mut engine, scored.clone(), &neighbours());
    same(&b, &c);
    assert_eq!(b.logprobs, c.logprobs);
    // Sampled, scores are still the model's distribution's.
    let sampled = ChatRequest {
        temperature: 0.9,
        seed: 11,
        ..scored
    };
    let d = run_alone(&mut engine, sampled.clone());
    let e = run_batched(&mut engine, sampled, &neighbours());
    assert_eq!(d.tokens, e.tokens);
    assert_eq!(d.logprobs, e.logprobs);
    let too_many = ChatRequest {
        logprobs: Some(MAX_TOP_LOGPROBS + 1),
        ..ask("hi", 2)
    };
    let s = engine.open_session();
    assert!(matches!(
        engine.submit(s, too_many),
        Err(BackendError::BadRequest(_))
    ));
}

fn same(a: &statebench::backend::ChatReply, b: &statebench::backend::ChatReply) {
    assert_eq!(a.tokens, b.tokens);
    assert_eq!(a.content, b.content);
    assert_eq!(a.tool_calls, b.tool_calls);
}

#[test]
#[cfg_attr(
    not(has_default_model),
    ignore = "needs the default model: run models/fetch.sh"
)]
fn constrained_replies_follow_their_schema_and_are_batch_invariant() {
    let path = default_model();
    let mut engine = load(&path);
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": false,
    });
    let person = ChatRequest {
        constraint: Some(Constraint::JsonSchema(schema)),
        ..ask("Invent a person. Reply in JSON with name and age.", 48)
    };
    let alone = run_alone(&mut engine, person.clone());
    let v: serde_json::Value =
        serde_json::from_str(&alone.content).unwrap_or_else(|e| panic!("{e}: {:?}", alone.content));
    assert!(v["name"].is_string() && v["age"].is_i64(), "{v}");
    assert_eq!(v.as_object().unwrap().len(), 2, "{v}");
    same(&alone, &run_batched(&mut engine, person, &neighbours()));

    // A named tool: exactly one call of it, arguments under its schema.
    let weather = Tool::function(
        "get_weather",
        "Current weather in a city.",
        serde_json::json!({
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        }),
    );
    let other = Tool::function(
        "get_time",
        "The time.",
        serde_json::json!({"type": "object"}),
    );
    let base = ChatRequest {
        tools: vec![other, weather],
        ..ask("Tell me a joke about the weather in Oslo.", 48)
    };
    let named = ChatRequest {
        constraint: Some(Constraint::ToolCalls(Some("get_weather".into()))),
        ..base.clone()
    };
    let r = run_alone(&mut engine, named.clone());
    assert_eq!(r.tool_calls.len(), 1, "{r:?}");
    assert_eq!(r.tool_calls[0].name, "get_weather");
    let args: serde_json::Value = serde_json::from_str(&r.tool_calls[0].arguments).unwrap();
    assert!(args["city"].is_string(), "{args}");
    same(&r, &run_batched(&mut engine, named, &neighbours()));

    // No tools: the reply is text, with no call read out of it.
    let none = ChatRequest {
        constraint: Some(Constraint::NoToolCalls),
        ..ChatRequest {
            messages: vec![Message::new(Role::User, "What is the weather in Paris?")],
            ..base
        }
    };
    let r = run_alone(&mut engine, none);
    assert!(r.tool_calls.is_empty(), "{r:?}");
    assert!(!r.content.contains("<tool_call>"), "{r:?}");

    // Not JSON Schema, or a tool not offered: refused at submit, naming the field.
    let s = engine.open_session();
    let bad = ChatRequest {
        constraint: Some(Constraint::JsonSchema(serde_json::json!({"type": 12}))),
        ..ask("hi", 4)
    };
    match engine.submit(s, bad) {
        Err(BackendError::Constraint { field, .. }) => assert_eq!(field, "response_format"),
        other => panic!("{other:?}"),
    }
    let absent = ChatRequest {
        constraint: Some(Constraint::ToolCalls(Some("nope".into()))),
        ..ask("hi", 4)
    };
    match engine.submit(s, absent) {
        Err(BackendError::Constraint { field, .. }) => assert_eq!(field, "tool_choice"),
        other => panic!("{other:?}"),
    }
}
