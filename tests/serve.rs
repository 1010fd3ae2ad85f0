//! `statebench serve` and the OpenAI-compatible backend test each other: a
//! live cell run through the server over HTTP produces the same transcripts
//! as the same cell in-process. Every server these tests start listens on
//! loopback, is killed when its test ends, and every wait is bounded.

mod engine_common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use engine_common::statebench_within;
use serde_json::{json, Value};
use statebench::backend::http_client::{OpenAiBackend, OpenAiOptions};
use statebench::backend::{Backend, BackendError, ChatReply, ChatRequest, Message, Role};

const BIN: &str = env!("CARGO_BIN_EXE_statebench");

/// A `statebench serve` child process; killed when dropped.
struct ServeProc {
    child: Child,
    url: String,
}

impl ServeProc {
    /// Starts the server on a free loopback port and waits (bounded) for its address.
    fn start(model: &Path) -> ServeProc {
        Self::start_with(model, &[])
    }

    /// [`Self::start`] with more `serve` flags.
    fn start_with(model: &Path, flags: &[&str]) -> ServeProc {
        let mut child = Command::new(BIN)
            .args(["serve", "--host", "127.0.0.1", "--port", "0", "--model"])
            .arg(model)
            .args(flags)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("serve starts");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(180);
        let mut seen = Vec::new();
        let mut proc = ServeProc {
            child,
            url: String::new(),
        };
        while proc.url.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(at) = line.find("http://127.0.0.1:") {
                        let rest = &line[at..];
                        let end = rest.find(' ').unwrap_or(rest.len());
                        proc.url = rest[..end].to_string();
                    }
                    seen.push(line);
                }
                Err(_) => panic!("serve did not report its address in time: {seen:?}"),
            }
        }
        proc
    }
}

impl Drop for ServeProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The tiny random-weight Qwen2 fixture with its context raised from 512 to
/// 4,096 positions (RoPE works at any length; the weights are random), so
/// an episode's brief fits and replies are actually generated — at 512
/// every call would be a context overflow. Later turns still overflow,
/// which exercises the error path too.
fn tiny_model(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/engine/tiny-qwen2");
    let dst = dir.join("tiny-qwen2");
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    let cfg = dst.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    v["max_position_embeddings"] = json!(4096);
    std::fs::write(&cfg, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    dst
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(300)))
        .http_status_as_error(false)
        .build()
        .into()
}

/// POSTs a raw body; returns (status, parsed JSON body).
fn post(url: &str, body: &str) -> (u16, Value) {
    let mut resp = agent()
        .post(format!("{url}/v1/chat/completions"))
        .header("Content-Type", "application/json")
        .send(body)
        .expect("server answers");
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().expect("body reads");
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, v)
}

/// Every line of a run file keyed by (seed, arm, turn), without token
/// accounting and timings (cached tokens and latencies differ by design),
/// and the configuration hash (the two runs name their model differently).
fn lines(dir: &Path, file: &str) -> BTreeMap<(u64, String, u64), Value> {
    let text = std::fs::read_to_string(dir.join(file)).unwrap();
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut v: Value = serde_json::from_str(line).unwrap();
        let key = (
            v["seed"].as_u64().unwrap(),
            v["arm"].as_str().unwrap().to_string(),
            v.get("turn").and_then(Value::as_u64).unwrap_or(0),
        );
        if let Some(o) = v.as_object_mut() {
            for k in ["usage", "latency_s", "wall_s", "config_hash"] {
                o.remove(k);
            }
        }
        assert!(out.insert(key, v).is_none(), "duplicate line in {file}");
    }
    out
}

/// Runs the same command line in-process (`--model`) into `dir/local` and
/// through a fresh `statebench serve` (`--endpoint`) into `dir/remote`;
/// both must succeed.
fn in_process_and_served(model: &Path, dir: &Path, args: &[&str]) -> (PathBuf, PathBuf) {
    let (local, remote) = (dir.join("local"), dir.join("remote"));
    let limit = Duration::from_secs(600);
    let mut a = args.to_vec();
    a.extend([
        "--model",
        model.to_str().unwrap(),
        "--out",
        local.to_str().unwrap(),
    ]);
    let o = statebench_within(&a, limit);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let server = ServeProc::start(model);
    let mut a = args.to_vec();
    a.extend(["--endpoint", &server.url, "--out", remote.to_str().unwrap()]);
    let o = statebench_within(&a, limit);
    drop(server);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    (local, remote)
}

const CELL: [&str; 15] = [
    "ladder",
    "cell",
    "--agent",
    "model",
    "--matcher",
    "model",
    "--compiler",
    "model",
    "--steps",
    "3",
    "--episodes",
    "2",
    "--arms",
    "raw,directive,enforce,mem0-augment",
    "--quiet",
];

#[test]
fn cell_through_serve_matches_in_process() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path());
    let (local, remote) = in_process_and_served(&model, tmp.path(), &CELL);

    let (a, b) = (lines(&local, "turns.jsonl"), lines(&remote, "turns.jsonl"));
    assert_eq!(a.len(), 2 * 4 * 44, "in-process turns");
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "same turns"
    );
    let mut generated = 0;
    for (k, x) in &a {
        let y = &b[k];
        for field in [
            "request", "replies", "bookings", "errors", "label", "matched",
        ] {
            assert_eq!(x.get(field), y.get(field), "{k:?} {field}");
        }
        assert_eq!(x, y, "{k:?}");
        if x["replies"]
            .as_array()
            .is_some_and(|r| r.iter().any(|s| s.as_str().is_some_and(|s| !s.is_empty())))
        {
            generated += 1;
        }
    }
    // Replies were really generated (not only overflow errors) on both sides.
    assert!(generated >= 6, "only {generated} turns with a reply");
    assert_eq!(
        lines(&local, "episodes.jsonl"),
        lines(&remote, "episodes.jsonl")
    );
    // The remote run's manifest names the endpoint.
    let m: Value =
        serde_json::from_str(&std::fs::read_to_string(remote.join("manifest.json")).unwrap())
            .unwrap();
    assert_eq!(m["model"]["architecture"], "remote", "{m}");
    // The memory arm embedded through the endpoint's /v1/embeddings.
    assert_eq!(m["config"]["embedder"]["kind"], "agent", "{m}");
    let e = lines(&remote, "episodes.jsonl");
    let mem = e
        .values()
        .find(|v| v["arm"] == "mem0-augment")
        .expect("a mem0-augment episode");
    assert!(mem["memory"]["embed_calls"].as_u64() > Some(0), "{mem}");
}

#[test]
#[cfg_attr(
    not(has_default_model),
    ignore = "needs the default model: run models/fetch.sh"
)]
fn france_prompt_through_serve_answers_paris() {
    let gguf = engine_common::default_model();
    let server = ServeProc::start(&gguf);
    let mut resp = agent()
        .get(format!("{}/v1/models", server.url))
        .call()
        .expect("models answers");
    let models: Value = serde_json::from_str(&resp.body_mut().read_to_string().unwrap()).unwrap();
    assert_eq!(models["object"], "list");
    assert!(models["data"][0]["id"].is_string(), "{models}");
    let body = json!({
        "model": models["data"][0]["id"],
        "messages": [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
        "max_tokens": 16,
        "temperature": 0,
    });
    let (status, v) = post(&server.url, &body.to_string());
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(content.contains("Paris"), "{content}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    let u = &v["usage"];
    assert!(u["prompt_tokens"].as_u64().unwrap() > 10, "{v}");
    assert!(u["completion_tokens"].as_u64().unwrap() >= 1, "{v}");
    assert_eq!(
        u["total_tokens"].as_u64(),
        Some(u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap())
    );
    assert!(u["prompt_tokens_details"]["cached_tokens"].is_u64(), "{v}");
}

/// A conversation's next turn runs on the session its last turn left idle
/// and reads that turn's prompt from the cache, with the reply a cold
/// server gives.
#[test]
fn a_conversations_next_turn_reuses_its_cache_with_the_same_reply() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path());
    let ask = |url: &str, messages: &Value| {
        let body = json!({"messages": messages, "max_tokens": 8, "temperature": 0});
        let (status, v) = post(url, &body.to_string());
        assert_eq!(status, 200, "{v}");
        let usage = |k: &str| v["usage"][k].as_u64().unwrap();
        let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        let message = v["choices"][0]["message"].clone();
        (message, usage("prompt_tokens"), cached)
    };
    let first = json!([{"role": "user", "content": "Book the flight to Paris on Monday."}]);
    let warm = ServeProc::start(&model);
    let (reply, first_prompt, cached) = ask(&warm.url, &first);
    assert_eq!(cached, 0);
    let mut next = first.as_array().unwrap().clone();
    next.push(json!({"role": "assistant", "content": reply["content"]}));
    next.push(json!({"role": "user", "content": "And the hotel for two nights."}));
    let next = Value::Array(next);
    let (warm_reply, prompt, cached) = ask(&warm.url, &next);
    // The engine always recomputes a prompt's last token.
    assert!(
        cached >= first_prompt - 1 && cached < prompt,
        "{cached} of {prompt} cached after a {first_prompt}-token turn"
    );
    drop(warm);
    let cold = ServeProc::start(&model);
    let (cold_reply, _, cached) = ask(&cold.url, &next);
    assert_eq!(cached, 0);
    assert_eq!(warm_reply, cold_reply);
}

fn one_line_error(v: &Value) -> String {
    let m = v["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"));
    assert!(!m.contains('\n'), "{m}");
    assert!(v["error"]["type"].is_string(), "{v}");
    m.to_string()
}

#[test]
fn bad_requests_get_400_with_one_line_messages() {
    let tmp = tempfile::tempdir().unwrap();
    let server = ServeProc::start(&tiny_model(tmp.path()));
    let url = &server.url;

    let (s, v) = post(
        url,
        r#"{"messages":[{"role":"user","content":"hi"}],"n":9}"#,
    );
    assert_eq!(s, 400);
    assert!(one_line_error(&v).contains("n must be from 1 to 8"), "{v}");
    assert_eq!(v["error"]["param"], "n", "{v}");

    let (s, v) = post(url, r#"{"messages": [{"role": "user", "content": "hi"}"#);
    assert_eq!(s, 400);
    assert!(one_line_error(&v).contains("invalid JSON"), "{v}");

    let (s, v) = post(
        url,
        r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":100000}"#,
    );
    assert_eq!(s, 400);
    assert!(one_line_error(&v).contains("context"), "{v}");

    // Concurrent greedy requests batch in the engine and agree with a lone one.
    let body =
        r#"{"messages":[{"role":"user","content":"hello there"}],"max_tokens":24,"temperature":0}"#;
    let (s, alone) = post(url, body);
    assert_eq!(s, 200, "{alone}");
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || post(&url, body))
        })
        .collect();
    for h in handles {
        let (s, v) = h.join().unwrap();
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["choices"][0]["message"], alone["choices"][0]["message"]);
        // One of them may read the lone request's prompt from its session.
        for k in ["prompt_tokens", "completion_tokens", "total_tokens"] {
            assert_eq!(v["usage"][k], alone["usage"][k], "{v}");
        }
    }
}

#[test]
fn client_maps_overflow_and_reports_replies() {
    let tmp = tempfile::tempdir().unwrap();
    let server = ServeProc::start(&tiny_model(tmp.path()));
    let mut b = OpenAiBackend::connect(OpenAiOptions::new(format!("{}/v1", server.url))).unwrap();
    assert_eq!(b.model(), "tiny-qwen2");
    assert_eq!(b.model_id().unwrap().architecture, "remote");
    let s = b.open_session();
    let msgs = vec![Message::new(Role::User, "hello")];
    let r = b.chat(s, ChatRequest::greedy(msgs.clone(), 8)).unwrap();
    assert_eq!(r.usage.completion_tokens, 8);
    assert!(r.usage.prompt_tokens > 0);
    match b.chat(s, ChatRequest::greedy(msgs, 100_000)) {
        Err(BackendError::ContextOverflow {
            max_tokens,
            context,
            ..
        }) => assert_eq!((max_tokens, context), (100_000, 4096)),
        other => panic!("{other:?}"),
    }
}

/// A loopback port nothing listens on.
fn dead_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[test]
fn unreachable_endpoint_is_a_one_line_error() {
    let url = format!("http://127.0.0.1:{}", dead_port());
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("cell");
    let mut args = CELL.to_vec();
    args.extend(["--endpoint", &url, "--out", out.to_str().unwrap()]);
    let o = statebench_within(&args, Duration::from_secs(60));
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(e.trim_end().lines().count(), 1, "{e}");
    assert!(e.contains(&url) && e.contains("server running"), "{e}");
    assert!(!e.contains("panicked"), "{e}");

    // Mid-run failures are retried, then one line naming the URL.
    let mut opts = OpenAiOptions::new(url.clone());
    opts.model = Some("m".into());
    opts.attempts = 3;
    opts.backoff = Duration::from_millis(10);
    let mut b = OpenAiBackend::new(opts).unwrap();
    let s = b.open_session();
    let e = b
        .chat(
            s,
            ChatRequest::greedy(vec![Message::new(Role::User, "hi")], 4),
        )
        .unwrap_err()
        .to_string();
    assert!(e.starts_with(&url), "{e}");
    assert!(e.contains("gave up after 3 attempts"), "{e}");
    assert!(!e.contains('\n'), "{e}");
}

/// Native tool calling on the default model: the step tools offered, the
/// model calls one, the call's result goes back as a `tool` message and
/// the model answers. In-process and through `serve` + the OpenAI client,
/// every reply, call and id is the same; the wire says `tool_calls`.
#[test]
#[cfg_attr(
    not(has_default_model),
    ignore = "needs the default model: run models/fetch.sh"
)]
fn tool_calls_through_serve_match_in_process() {
    use statebench::backend::{Tool, ToolCall};
    use statebench::engine::{Engine, EngineOptions};
    let gguf = engine_common::default_model();
    let params = json!({
        "type": "object",
        "properties": {"work_order": {"type": "string", "description": "the work order number from the current message, e.g. #W1234"}},
        "required": ["work_order"]
    });
    let tools = vec![
        Tool::function(
            "sign_msa",
            "Carry out step s1: sign the master service agreement.",
            params.clone(),
        ),
        Tool::function(
            "place_equipment_order",
            "Carry out step s2: place the main equipment order.",
            params,
        ),
    ];
    let first = vec![
        Message::new(
            Role::System,
            "You are the agent for an assigned project. To carry out a step, call its tool with the work order number from my current message.",
        ),
        Message::new(
            Role::User,
            "Please sign the master service agreement now (#W4821).",
        ),
    ];
    let ask = |messages: Vec<Message>| ChatRequest {
        tools: tools.clone(),
        ..ChatRequest::greedy(messages, 64)
    };
    let mut engine = Engine::load(gguf.to_str().unwrap(), EngineOptions::default()).unwrap();
    let s = engine.open_session();
    let local = engine.chat(s, ask(first.clone())).unwrap();
    assert_eq!(local.tool_calls.len(), 1, "{local:?}");
    let call: &ToolCall = &local.tool_calls[0];
    assert_eq!(call.name, "sign_msa", "{local:?}");
    let args: Value = serde_json::from_str(&call.arguments).unwrap();
    assert_eq!(args["work_order"], "#W4821", "{local:?}");
    let mut second = first.clone();
    second.push(Message::calls(
        local.content.clone(),
        local.tool_calls.clone(),
    ));
    second.push(Message::tool_result(
        &call.id,
        "sign_msa: executed for work order #W4821.",
    ));
    let local2 = engine.chat(s, ask(second.clone())).unwrap();
    drop(engine);

    let server = ServeProc::start(&gguf);
    let mut b = OpenAiBackend::connect(OpenAiOptions::new(server.url.clone())).unwrap();
    let rs = b.open_session();
    let remote = b.chat(rs, ask(first.clone())).unwrap();
    let remote2 = b.chat(rs, ask(second)).unwrap();
    // The same calls; the server names each with an id of its own.
    let calls = |r: &ChatReply| -> Vec<(String, String)> {
        r.tool_calls
            .iter()
            .map(|c| (c.name.clone(), c.arguments.clone()))
            .collect()
    };
    for (l, r) in [(&local, &remote), (&local2, &remote2)] {
        assert_eq!(
            (&l.content, calls(l), l.usage.completion_tokens),
            (&r.content, calls(r), r.usage.completion_tokens)
        );
    }
    let ids: Vec<&str> = remote
        .tool_calls
        .iter()
        .chain(&remote2.tool_calls)
        .map(|c| c.id.as_str())
        .collect();
    assert!(
        ids.iter().all(|i| i.starts_with("call_") && i.len() > 20),
        "{ids:?}"
    );
    let mut unique = ids.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), ids.len(), "{ids:?}");
    // The raw wire: calls as OpenAI spells them, arguments as a string.
    let body = serde_json::to_string(&statebench::wire::ChatCompletionRequest::from_chat(
        "m",
        &ask(first),
    ))
    .unwrap();
    let (status, v) = post(&server.url, &body);
    assert_eq!(status, 200, "{v}");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    let c = &choice["message"]["tool_calls"][0];
    assert_eq!(c["type"], "function", "{v}");
    assert!(
        c["id"].as_str().is_some_and(|i| i.starts_with("call_")),
        "{v}"
    );
    assert_eq!(c["function"]["name"], "sign_msa");
    assert!(c["function"]["arguments"].is_string(), "{v}");
}

/// A native tool-harness cell through `--endpoint` (tools sent as OpenAI
/// `tools`, calls read from `tool_calls`) logs the same turns as in-process.
#[test]
fn native_cell_through_serve_matches_in_process() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path());
    let cell = [
        "ladder",
        "cell",
        "--agent",
        "model",
        "--steps",
        "3",
        "--episodes",
        "1",
        "--arms",
        "raw,enforce-request",
        "--protocol",
        "native",
        "--quiet",
    ];
    let (local, remote) = in_process_and_served(&model, tmp.path(), &cell);
    let (a, b) = (lines(&local, "turns.jsonl"), lines(&remote, "turns.jsonl"));
    assert_eq!(a.len(), 2 * 44);
    assert_eq!(a, b);
    // Replies were generated with the tools in the prompt (the tiny model's
    // 4,096 positions overflow on later turns, the error path).
    let generated = a
        .values()
        .filter(|v| v["replies"][0].as_str().is_some_and(|s| !s.is_empty()))
        .count();
    assert!(generated >= 4, "only {generated} turns with a reply");
    assert_eq!(
        lines(&local, "episodes.jsonl"),
        lines(&remote, "episodes.jsonl")
    );
}

/// An EAL study through `--endpoint` (the writer's JSON as text, the
/// executor's tools as OpenAI `tools`) forms the same memories and scores
/// the same trials as in-process.
#[test]
fn eal_study_through_serve_matches_in_process() {
    use statebench::eal::report::Run;
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path());
    let study = [
        "eal",
        "run",
        "--cases",
        "2",
        "--quiet",
        "--writer-max-tokens",
        "48",
        "--executor-max-tokens",
        "12",
    ];
    let (local, remote) = in_process_and_served(&model, tmp.path(), &study);
    for f in ["memories.jsonl", "plan.jsonl"] {
        let read = |d: &Path| std::fs::read_to_string(d.join(f)).unwrap();
        assert!(read(&local) == read(&remote), "{f} differs");
    }
    let (a, b) = (Run::read(&local).unwrap(), Run::read(&remote).unwrap());
    let replies = |r: &Run| {
        r.attempts
            .iter()
            .map(|a| (a.reply.clone(), a.accepted, a.error.clone()))
            .collect::<Vec<_>>()
    };
    assert!(!a.attempts.is_empty());
    assert!(replies(&a) == replies(&b), "writer replies differ");
    let trials = |r: &Run| {
        r.trials
            .iter()
            .map(|t| {
                let mut t = t.clone();
                t.usage = Default::default();
                serde_json::to_string(&t).unwrap()
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(a.trials.len(), 36);
    assert_eq!(trials(&a), trials(&b));
}

/// `serve` on the CUDA engine, executed by the CUDA emulator: a chat
/// round trip answers, twice the same.
#[cfg(all(feature = "cuda", target_os = "linux"))]
#[test]
#[cfg_attr(
    not(has_cuda_emulator),
    ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
)]
fn serve_round_trip_on_the_emulated_cuda_device() {
    engine_common::require_emulator();
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path());
    let server = ServeProc::start_with(
        &model,
        &["--device", "cuda-emulated", "--kv-budget-gib", "0.0625"],
    );
    let body = json!({
        "model": "tiny",
        "messages": [{"role": "user", "content": "Name a colour."}],
        "max_tokens": 12,
        "temperature": 0
    })
    .to_string();
    let (status, first) = post(&server.url, &body);
    assert_eq!(status, 200, "{first}");
    let content = first["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_string();
    assert_eq!(first["usage"]["completion_tokens"], json!(12), "{first}");
    let (_, second) = post(&server.url, &body);
    assert_eq!(second["choices"][0]["message"]["content"], json!(content));
}

/// POSTs a body to `path`; returns (status, the body's text).
fn post_text(url: &str, path: &str, body: &Value) -> (u16, String) {
    let mut resp = agent()
        .post(format!("{url}{path}"))
        .header("Content-Type", "application/json")
        .send(body.to_string())
        .expect("server answers");
    let status = resp.status().as_u16();
    (
        status,
        resp.body_mut().read_to_string().expect("body reads"),
    )
}

/// POSTs a body to `path`; returns (status, parsed JSON body).
fn post_json(url: &str, path: &str, body: &Value) -> (u16, Value) {
    let (status, text) = post_text(url, path, body);
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, v)
}

/// The data lines of an event stream, `[DONE]` last.
fn events(text: &str) -> Vec<Value> {
    let data: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{text}");
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).expect("event is JSON"))
        .collect()
}

#[test]
fn completions_score_prompts_take_token_ids_and_stream() {
    let tmp = tempfile::tempdir().unwrap();
    let server = ServeProc::start(&tiny_model(tmp.path()));
    let url = &server.url;
    let text = "the quick brown fox jumps over the lazy dog and then it runs away into the woods";
    let (s, tok) = post_json(url, "/tokenize", &json!({"prompt": text}));
    assert_eq!(s, 200, "{tok}");
    let ids: Vec<u64> = serde_json::from_value(tok["tokens"].clone()).unwrap();
    assert_eq!(tok["count"], ids.len());
    assert_eq!(tok["max_model_len"], 4096);
    let (s, de) = post_json(url, "/detokenize", &json!({"tokens": ids}));
    assert_eq!(s, 200, "{de}");
    assert_eq!(de["prompt"], text);

    // Scoring only: every prompt token, the first without a score.
    let score = |prompt: Value| {
        let body = json!({"prompt": prompt, "echo": true, "logprobs": 2, "max_tokens": 0});
        let (s, v) = post_json(url, "/v1/completions", &body);
        assert_eq!(s, 200, "{v}");
        v
    };
    let v = score(json!(text));
    let c = &v["choices"][0];
    assert_eq!(c["text"], text);
    assert_eq!(c["finish_reason"], "length");
    let lp = &c["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), ids.len());
    assert!(lp["token_logprobs"][0].is_null() && lp["top_logprobs"][0].is_null());
    let scores = lp["token_logprobs"].as_array().unwrap();
    for (i, x) in scores.iter().enumerate().skip(1) {
        let x = x.as_f64().unwrap();
        assert!(x <= 0.0, "{x}");
        let top = lp["top_logprobs"][i].as_object().unwrap();
        assert!(!top.is_empty() && top.len() <= 2, "{top:?}");
        let best = top
            .values()
            .map(|v| v.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        assert!(x <= best, "token {i}: {x} above the best {best}");
    }
    let offsets: Vec<usize> = serde_json::from_value(lp["text_offset"].clone()).unwrap();
    let joined: String = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(joined, text);
    assert!(offsets.windows(2).all(|w| w[0] < w[1]) && offsets[0] == 0);
    // The same tokens as ids give the same bits; a prefix scores its part.
    let by_ids = score(json!(ids));
    assert_eq!(by_ids["choices"][0]["logprobs"], *lp);
    let prefix = score(json!(ids[..9]));
    assert_eq!(
        prefix["choices"][0]["logprobs"]["token_logprobs"],
        json!(scores[..9])
    );
    // Several prompts (token lists) at once, in order, the same bits as alone.
    let (s, many) = post_json(
        url,
        "/v1/completions",
        &json!({"prompt": [ids[..9], ids], "echo": true, "logprobs": 2, "max_tokens": 0}),
    );
    assert_eq!(s, 200, "{many}");
    assert_eq!(
        many["choices"][0]["logprobs"],
        prefix["choices"][0]["logprobs"]
    );
    assert_eq!(many["choices"][1]["logprobs"], *lp);
    // Under load: the same scores while other requests decode.
    let busy: Vec<_> = (0..3)
        .map(|i| {
            let url = url.clone();
            std::thread::spawn(move || {
                let body =
                    json!({"prompt": format!("load {i}"), "max_tokens": 40, "temperature": 0});
                post_json(&url, "/v1/completions", &body)
            })
        })
        .collect();
    assert_eq!(score(json!(ids))["choices"][0]["logprobs"], *lp);
    for b in busy {
        assert_eq!(b.join().unwrap().0, 200);
    }
    // lm-eval's loglikelihood request: echo, logprobs 1, one generated token.
    let (s, ll) = post_json(
        url,
        "/v1/completions",
        &json!({"prompt": ids, "echo": true, "logprobs": 1, "max_tokens": 1, "temperature": 0}),
    );
    assert_eq!(s, 200, "{ll}");
    let l = &ll["choices"][0]["logprobs"];
    assert_eq!(l["tokens"].as_array().unwrap().len(), ids.len() + 1);
    assert_eq!(l["token_logprobs"][ids.len() - 1], scores[ids.len() - 1]);

    // Generation from ids equals generation from the text.
    let gen = |prompt: Value, stream: bool| json!({"prompt": prompt, "max_tokens": 20, "temperature": 0, "stream": stream});
    let (s, a) = post_json(url, "/v1/completions", &gen(json!(text), false));
    assert_eq!(s, 200, "{a}");
    let (_, b) = post_json(url, "/v1/completions", &gen(json!(ids), false));
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
    // Streamed: the pieces add up to the same text, the last names the finish.
    let (s, raw) = post_text(url, "/v1/completions", &gen(json!(text), true));
    assert_eq!(s, 200, "{raw}");
    let ev = events(&raw);
    let streamed: String = ev
        .iter()
        .map(|e| e["choices"][0]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(streamed, a["choices"][0]["text"].as_str().unwrap());
    assert!(ev.iter().all(|e| e["object"] == "text_completion"));
    assert_eq!(
        ev.last().unwrap()["choices"][0]["finish_reason"],
        a["choices"][0]["finish_reason"]
    );
    // With echo the prompt comes first.
    let mut body = gen(json!(text), true);
    body["echo"] = json!(true);
    let (_, raw) = post_text(url, "/v1/completions", &body);
    assert_eq!(events(&raw)[0]["choices"][0]["text"], text);

    // Refused, naming the field, before any 200.
    for (body, param) in [
        (json!({"prompt": text, "max_tokens": 0}), "max_tokens"),
        (json!({"prompt": text, "logprobs": 21}), "logprobs"),
        (json!({"prompt": [1, -2]}), "prompt"),
        (json!({"prompt": [[1], "x", 3]}), "prompt"),
        (json!({"prompt": [1_000_000]}), "prompt"),
        (
            json!({"prompt": text, "stream": true, "echo": true, "logprobs": 1}),
            "stream",
        ),
        (json!({"prompt": text, "top_p": -5}), "top_p"),
        (
            json!({"prompt": text, "frequency_penalty": 1e9}),
            "frequency_penalty",
        ),
        (
            json!({"prompt": text, "presence_penalty": "x"}),
            "presence_penalty",
        ),
        (json!({"prompt": text, "top_k": 0.5}), "top_k"),
        (json!({"prompt": text, "min_p": 2}), "min_p"),
        (
            json!({"prompt": text, "repetition_penalty": 0}),
            "repetition_penalty",
        ),
        (json!({"prompt": text, "min_tokens": 99}), "min_tokens"),
        (
            json!({"prompt": text, "logit_bias": {"x": 1}}),
            "logit_bias",
        ),
        (
            json!({"prompt": text, "logit_bias": {"5": -101}}),
            "logit_bias",
        ),
        (json!({"prompt": text, "best_of": 3}), "best_of"),
        (json!({"prompt": text, "suffix": "end"}), "suffix"),
    ] {
        let (s, v) = post_json(url, "/v1/completions", &body);
        assert_eq!(s, 400, "{body}: {v}");
        one_line_error(&v);
        assert_eq!(v["error"]["param"], param, "{body}: {v}");
    }
    let (s, v) = post_json(
        url,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "top_p": 7}),
    );
    assert_eq!((s, &v["error"]["param"]), (400, &json!("top_p")), "{v}");
    // Honoured on chat too: a bias of 100 on one token makes it the reply.
    let (s, tok) = post_json(url, "/tokenize", &json!({"prompt": "fox"}));
    assert_eq!(s, 200);
    let fox = tok["tokens"][0].as_u64().unwrap();
    let (s, v) = post_json(
        url,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                "temperature": 0, "logit_bias": {fox.to_string(): 100}}),
    );
    assert_eq!(s, 200, "{v}");
    let (_, one) = post_json(url, "/detokenize", &json!({"tokens": [fox]}));
    let piece = one["prompt"].as_str().unwrap();
    assert_eq!(
        v["choices"][0]["message"]["content"],
        piece.repeat(3).trim(),
        "{v}"
    );
    // Chat messages tokenize to the prompt the chat counts.
    let msgs = json!([{"role": "user", "content": "hello there"}]);
    let (_, t) = post_json(url, "/tokenize", &json!({"messages": msgs}));
    let (_, c) = post_json(
        url,
        "/v1/chat/completions",
        &json!({"messages": msgs, "max_tokens": 2, "chat_template_kwargs": {"enable_thinking": true}}),
    );
    assert_eq!(t["count"], c["usage"]["prompt_tokens"], "{t} {c}");
}

#[test]
fn hostile_schemas_are_refused_naming_their_field_before_any_stream() {
    let tmp = tempfile::tempdir().unwrap();
    let server = ServeProc::start(&tiny_model(tmp.path()));
    let url = &server.url;
    let with_schema = |schema: Value, stream: bool| {
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 30, "stream": stream,
               "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
    };
    for (schema, needle) in [
        (
            json!({"$ref": "#"}),
            "no reply can satisfy the schema (NoExtensionBias)",
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "(abc"}}}),
            "regex parse error: (abc ^ error: unclosed group",
        ),
        (
            json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1e308, "maximum": 1e308}}, "required": ["n"]}),
            "integer bound minimum = 1e+308 is outside the 64-bit integers",
        ),
    ] {
        for stream in [false, true] {
            let (s, text) = post_text(
                url,
                "/v1/chat/completions",
                &with_schema(schema.clone(), stream),
            );
            assert_eq!(s, 400, "{schema} stream={stream}: {text}");
            let v: Value = serde_json::from_str(&text).unwrap();
            let m = one_line_error(&v);
            assert!(m.contains(needle) && !m.contains("<state>"), "{m}");
            assert_eq!(v["error"]["param"], "response_format", "{v}");
        }
    }
    // A tool's parameters with `$defs` references, as pydantic writes them:
    // the call's arguments follow the referenced schema.
    let tool = json!({"type": "function", "function": {"name": "f", "parameters": {
        "$defs": {"P": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["x"], "additionalProperties": false}},
        "type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}, "required": ["p"], "additionalProperties": false}}});
    let body = json!({"messages": [{"role": "user", "content": "call f"}], "max_tokens": 200,
                      "temperature": 0, "tools": [tool], "tool_choice": "required"});
    let (s, v) = post_json(url, "/v1/chat/completions", &body);
    assert_eq!(s, 200, "{v}");
    let calls = v["choices"][0]["message"]["tool_calls"]
        .as_array()
        .unwrap_or_else(|| panic!("{v}"));
    assert!(!calls.is_empty(), "{v}");
    for c in calls {
        let args: Value =
            serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap();
        let x = args["p"]["x"].as_i64().unwrap_or_else(|| panic!("{args}"));
        assert!((0..=9).contains(&x), "{args}");
    }
}
