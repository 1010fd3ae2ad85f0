//! What the τ² tests that script an endpoint share: the endpoint playing
//! both sides of a conversation, and the data directory.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::engine_common::FakeEndpoint;

/// `tau2 run` on task 0 and one arm against the endpoint at `url`.
pub fn run_args<'a>(url: &'a str, out: &'a str, data: &'a str, arm: &'a str) -> Vec<&'a str> {
    vec![
        "tau2",
        "run",
        "--tau2-data",
        data,
        "--tasks",
        "0",
        "--arms",
        arm,
        "--quiet",
        "--endpoint",
        url,
        "--out",
        out,
    ]
}

pub fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/tau2-airline")
}

/// A chat completion carrying `text` and these (name, arguments) calls.
pub fn completion(text: &str, calls: &[(&str, String)]) -> Vec<u8> {
    let calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, (name, args))| {
            json!({"id": format!("c{i}"), "type": "function",
                   "function": {"name": name, "arguments": args}})
        })
        .collect();
    let mut message = json!({"role": "assistant", "content": text});
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    json!({
        "id": "x", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    })
    .to_string()
    .into_bytes()
}

/// A conversation the endpoint plays both sides of: the agent (requests
/// with tools) makes `calls` once, then says "Done."; the user opens, and
/// stops once the agent said "Done.". `user` replaces the user's opening.
pub fn endpoint(calls: Vec<(&'static str, String)>, user: Option<Vec<u8>>) -> FakeEndpoint {
    endpoint_reading(calls, user, None)
}

/// [`endpoint`], answering the matcher's readings with `reading` (None: as
/// the user would, which is no reading at all).
pub fn endpoint_reading(
    calls: Vec<(&'static str, String)>,
    user: Option<Vec<u8>>,
    reading: Option<&'static str>,
) -> FakeEndpoint {
    FakeEndpoint::scripted(move |body| {
        let req: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        (200, answer(&req, &calls, user.as_deref(), reading))
    })
}

/// The scripted conversation's answer to one request (see [`endpoint`]).
pub fn answer(
    req: &Value,
    calls: &[(&str, String)],
    user: Option<&[u8]>,
    reading: Option<&str>,
) -> Vec<u8> {
    let messages = req["messages"].as_array().cloned().unwrap_or_default();
    let last = messages.last().cloned().unwrap_or(Value::Null);
    let reads = messages.first().map(|m| &m["content"])
        == Some(&Value::from(statebench::tau2::prompts::READER_SYSTEM));
    if let (true, Some(r)) = (reads, reading) {
        completion(r, &[])
    } else if req.get("tools").is_some() {
        if last["role"] == "tool" {
            completion("Done.", &[])
        } else {
            completion("", calls)
        }
    } else if last["content"] == "Done." {
        completion("###STOP###", &[])
    } else {
        user.map(<[u8]>::to_vec)
            .unwrap_or_else(|| completion("Please work out a sum for me.", &[]))
    }
}
