//! A backend on any OpenAI-compatible `/v1/chat/completions` endpoint (vLLM,
//! SGLang, llama.cpp's server, or `statebench serve`): how a model too large
//! for one machine drives the studies.
//!
//! The server is stateless: a session is only an id, and every call sends
//! the session's full message list. `submit` starts the HTTP call on a worker
//! thread at once (at most `max_concurrency` in flight; the rest queue), so
//! requests from many sessions run concurrently and the server batches them;
//! `step` waits briefly for any call to finish and returns what finished.
//!
//! Mapping: messages, `max_tokens`, `temperature`, `seed` and `stop` as the
//! API names them; the thinking flag as `chat_template_kwargs:
//! {"enable_thinking": …}` (what vLLM and SGLang pass to Qwen3's template);
//! `reasoning_content` (or `reasoning`) becomes the reply's reasoning, and a
//! `<think>…</think>` block left in the content is split off the same way
//! the in-process engine does. Usage: `prompt_tokens`, `completion_tokens`
//! and `prompt_tokens_details.cached_tokens` when the server reports it. The
//! server's timings are unknown: the call's wall time is reported as decode
//! time, prefill time as zero, and no token ids come back.
//!
//! Failures: an HTTP 400 whose message speaks of the context length is a
//! [`BackendError::ContextOverflow`] (so the overflow halving of the budgets
//! applies); connection errors, timeouts, 429 and 5xx are retried with
//! exponential backoff (the paper: 900 s timeout, up to six attempts); every
//! other failure is one [`BackendError::Remote`] line naming the URL.
//!
//! Plain `http://` only, unless the crate is built with the `tls` feature.

use std::collections::{HashSet, VecDeque};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use regex::Regex;

use super::{
    Backend, BackendError, ChatReply, ChatRequest, Embeddings, Finished, ModelIdentity, RequestId,
    SessionId,
};
use crate::wire::{
    AnyError, ChatCompletion, ChatCompletionRequest, EmbeddingInput, EmbeddingRequest,
    EmbeddingResponse, ModelList, WireError,
};

/// Where and how to reach the server.
#[derive(Debug, Clone)]
pub struct OpenAiOptions {
    /// Server root, e.g. `http://127.0.0.1:8000` (a trailing `/v1` is accepted).
    pub base_url: String,
    /// Model name sent with every request; `None` asks the server's
    /// `/v1/models` (first listed) in [`OpenAiBackend::connect`].
    pub model: Option<String>,
    /// Environment variable holding an API key, sent as a bearer token when set.
    pub api_key_env: Option<String>,
    /// Most HTTP calls in flight at once.
    pub max_concurrency: usize,
    /// Whole-call timeout of one attempt.
    pub timeout: Duration,
    /// Attempts per call (connection errors, timeouts, 429 and 5xx are retried).
    pub attempts: u32,
    /// Wait before the first retry; doubled before each further one.
    pub backoff: Duration,
}

impl OpenAiOptions {
    /// The paper's settings (900 s timeout, six attempts, 1 s first backoff)
    /// for a server root; the API key from `OPENAI_API_KEY` when set.
    pub fn new(base_url: impl Into<String>) -> Self {
        OpenAiOptions {
            base_url: base_url.into(),
            model: None,
            api_key_env: Some("OPENAI_API_KEY".into()),
            max_concurrency: 32,
            timeout: Duration::from_secs(900),
            attempts: 6,
            backoff: Duration::from_secs(1),
        }
    }
}

/// The server root without a trailing slash or `/v1`.
fn root(base: &str) -> String {
    let b = base.trim().trim_end_matches('/');
    b.strip_suffix("/v1").unwrap_or(b).to_string()
}

/// The server root, checked to be an http(s) URL.
fn checked_root(base: &str) -> Result<String, BackendError> {
    let r = root(base);
    let lower = r.to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https://") {
        Ok(r)
    } else {
        Err(BackendError::BadRequest(format!(
            "endpoint '{base}' must start with http:// or https:// (e.g. http://127.0.0.1:8000)"
        )))
    }
}

/// What a worker thread needs to make calls.
struct Shared {
    agent: ureq::Agent,
    /// `POST /v1/chat/completions`.
    url: String,
    /// `POST /v1/embeddings`.
    embeddings_url: String,
    model: String,
    key: Option<String>,
    attempts: u32,
    backoff: Duration,
}

struct Job {
    id: RequestId,
    session: SessionId,
    req: ChatRequest,
}

type Done = (RequestId, SessionId, Result<ChatReply, BackendError>);

/// A [`Backend`] on a remote OpenAI-compatible server.
pub struct OpenAiBackend {
    shared: Arc<Shared>,
    root: String,
    max_concurrency: usize,
    sessions: HashSet<SessionId>,
    busy: HashSet<SessionId>,
    queue: VecDeque<Job>,
    in_flight: usize,
    tx: Sender<Done>,
    rx: Receiver<Done>,
    next_id: u64,
}

fn remote(url: &str, cause: impl std::fmt::Display) -> BackendError {
    BackendError::Remote {
        url: url.to_string(),
        cause: one_line(&cause.to_string()),
    }
}

/// Collapses whitespace (servers send tracebacks) and caps the length.
fn one_line(s: &str) -> String {
    let mut out = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if out.len() > 400 {
        let mut cut = 400;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push('…');
    }
    out
}

fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        .build()
        .into()
}

fn api_key(env: &Option<String>) -> Option<String> {
    env.as_ref()
        .and_then(|v| std::env::var(v).ok())
        .filter(|k| !k.trim().is_empty())
}

/// Model ids the server lists at `GET /v1/models` (one attempt).
pub fn list_models(opts: &OpenAiOptions) -> Result<Vec<String>, BackendError> {
    let url = format!("{}/v1/models", checked_root(&opts.base_url)?);
    let mut rq = agent(opts.timeout.min(Duration::from_secs(60))).get(&url);
    if let Some(k) = api_key(&opts.api_key_env) {
        rq = rq.header("Authorization", format!("Bearer {k}"));
    }
    let mut resp = rq
        .call()
        .map_err(|e| remote(&url, format!("{e} (is the server running?)")))?;
    let status = resp.status().as_u16();
    let text = resp
        .body_mut()
        .read_to_string()
        .map_err(|e| remote(&url, e))?;
    if !(200..300).contains(&status) {
        return Err(remote(
            &url,
            format!("HTTP {status}: {}", error_message(&text)),
        ));
    }
    let list: ModelList = serde_json::from_str(&text)
        .map_err(|e| remote(&url, format!("not an OpenAI model list: {e}")))?;
    Ok(list.data.into_iter().map(|m| m.id).collect())
}

impl OpenAiBackend {
    /// A backend for a known model name; makes no network call.
    pub fn new(opts: OpenAiOptions) -> Result<Self, BackendError> {
        let root = checked_root(&opts.base_url)?;
        let Some(model) = opts.model.clone().filter(|m| !m.is_empty()) else {
            return Err(BackendError::BadRequest(format!(
                "no model name for {root} (pass one, or connect to ask the server)"
            )));
        };
        let (tx, rx) = mpsc::channel();
        Ok(OpenAiBackend {
            shared: Arc::new(Shared {
                agent: agent(opts.timeout),
                url: format!("{root}/v1/chat/completions"),
                embeddings_url: format!("{root}/v1/embeddings"),
                model,
                key: api_key(&opts.api_key_env),
                attempts: opts.attempts.max(1),
                backoff: opts.backoff,
            }),
            root,
            max_concurrency: opts.max_concurrency.max(1),
            sessions: HashSet::new(),
            busy: HashSet::new(),
            queue: VecDeque::new(),
            in_flight: 0,
            tx,
            rx,
            next_id: 0,
        })
    }

    /// Checks that the server answers (`GET /v1/models`, one attempt) and
    /// settles the model name: the given one, which must be listed when the
    /// server lists any, or else the first listed.
    pub fn connect(mut opts: OpenAiOptions) -> Result<Self, BackendError> {
        let served = list_models(&opts)?;
        let url = format!("{}/v1/models", root(&opts.base_url));
        match &opts.model {
            Some(m) if !served.is_empty() && !served.contains(m) => {
                return Err(remote(
                    &url,
                    format!(
                        "model '{m}' is not served here (served: {})",
                        served.join(", ")
                    ),
                ));
            }
            Some(_) => {}
            None => match served.first() {
                Some(m) => opts.model = Some(m.clone()),
                None => {
                    return Err(remote(
                        &url,
                        "the server lists no models (name one explicitly)",
                    ))
                }
            },
        }
        Self::new(opts)
    }

    /// The model name sent with each request.
    pub fn model(&self) -> &str {
        &self.shared.model
    }

    fn start(&mut self, job: Job) {
        self.in_flight += 1;
        let shared = Arc::clone(&self.shared);
        let tx = self.tx.clone();
        let (id, session) = (job.id, job.session);
        let spawned = std::thread::Builder::new()
            .name("statebench-http".into())
            .spawn(move || {
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    shared.call(&job.req)
                }))
                .unwrap_or_else(|_| Err(remote(&shared.url, "request thread panicked")));
                let _ = tx.send((job.id, job.session, result));
            });
        if let Err(e) = spawned {
            // Report the failure through the channel like any other reply.
            let _ = self.tx.send((
                id,
                session,
                Err(remote(
                    &self.shared.url,
                    format!("could not start a thread: {e}"),
                )),
            ));
        }
    }

    fn launch(&mut self) {
        while self.in_flight < self.max_concurrency {
            match self.queue.pop_front() {
                Some(job) => self.start(job),
                None => break,
            }
        }
    }

    fn accept(&mut self, (id, session, result): Done, out: &mut Finished) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.busy.remove(&session);
        if self.sessions.contains(&session) {
            out.push((id, result));
        }
    }
}

impl Backend for OpenAiBackend {
    fn open_session(&mut self) -> SessionId {
        self.next_id += 1;
        let id = SessionId(self.next_id);
        self.sessions.insert(id);
        id
    }

    fn close_session(&mut self, s: SessionId) {
        self.sessions.remove(&s);
        self.queue.retain(|j| j.session != s);
        // A call already on the wire finishes; its reply is dropped.
        self.busy.remove(&s);
    }

    fn submit(&mut self, s: SessionId, req: ChatRequest) -> Result<RequestId, BackendError> {
        if !self.sessions.contains(&s) {
            return Err(BackendError::UnknownSession(s));
        }
        if self.busy.contains(&s) {
            return Err(BackendError::SessionBusy(s));
        }
        req.validate()?;
        self.next_id += 1;
        let id = RequestId(self.next_id);
        self.busy.insert(s);
        self.queue.push_back(Job {
            id,
            session: s,
            req,
        });
        self.launch();
        Ok(id)
    }

    fn step(&mut self) -> Result<Finished, BackendError> {
        self.launch();
        let mut out = Vec::new();
        if self.in_flight == 0 {
            return Ok(out);
        }
        match self.rx.recv_timeout(Duration::from_millis(20)) {
            Ok(d) => self.accept(d, &mut out),
            Err(RecvTimeoutError::Timeout) => return Ok(out),
            // Unreachable: we hold a sender ourselves.
            Err(RecvTimeoutError::Disconnected) => return Ok(out),
        }
        while let Ok(d) = self.rx.try_recv() {
            self.accept(d, &mut out);
        }
        self.launch();
        out.sort_by_key(|(id, _)| *id);
        Ok(out)
    }

    fn embed(&mut self, texts: &[String]) -> Result<Embeddings, BackendError> {
        self.shared.embed(texts)
    }

    fn has_pending(&self) -> bool {
        !self.queue.is_empty() || self.in_flight > 0
    }

    fn model_id(&self) -> Result<ModelIdentity, BackendError> {
        Ok(ModelIdentity {
            name: self.shared.model.clone(),
            source: self.root.clone(),
            weights_sha256: String::new(),
            architecture: "remote".into(),
            format: "remote".into(),
            arithmetic: "remote".into(),
            device: String::new(),
        })
    }
}

/// Whether an error is worth another attempt.
fn transient(e: &ureq::Error) -> bool {
    matches!(
        e,
        ureq::Error::Io(_)
            | ureq::Error::Timeout(_)
            | ureq::Error::ConnectionFailed
            | ureq::Error::HostNotFound
            | ureq::Error::Protocol(_)
            | ureq::Error::BodyStalled
    )
}

impl Shared {
    fn call(&self, req: &ChatRequest) -> Result<ChatReply, BackendError> {
        let body = serde_json::to_vec(&ChatCompletionRequest::from_chat(&self.model, req))
            .map_err(|e| BackendError::BadRequest(format!("request does not serialize: {e}")))?;
        let (text, secs) = self.post(&self.url, &body, req.max_tokens)?;
        parse_reply(&text, secs).map_err(|e| {
            remote(
                &self.url,
                format!("malformed reply: {}", crate::one_line(&e)),
            )
        })
    }

    /// `POST /v1/embeddings` for the texts, in one call.
    fn embed(&self, texts: &[String]) -> Result<Embeddings, BackendError> {
        let url = &self.embeddings_url;
        let req = EmbeddingRequest {
            model: self.model.clone(),
            input: EmbeddingInput::Many(texts.to_vec()),
            encoding_format: Some("float".into()),
        };
        let body = serde_json::to_vec(&req)
            .map_err(|e| BackendError::BadRequest(format!("request does not serialize: {e}")))?;
        let (text, _) = self.post(url, &body, 0)?;
        serde_json::from_str::<EmbeddingResponse>(&text)
            .map_err(WireError::json)
            .and_then(|r| r.into_embeddings(texts.len()))
            .map_err(|e| remote(url, format!("malformed reply: {}", crate::one_line(&e))))
    }

    /// POSTs a JSON body with the retry rules; returns the 2xx body and the
    /// wall time of the attempt that got it.
    fn post(
        &self,
        url: &str,
        body: &[u8],
        max_tokens: usize,
    ) -> Result<(String, f64), BackendError> {
        let mut last = String::new();
        for attempt in 0..self.attempts {
            if attempt > 0 {
                std::thread::sleep(self.backoff.saturating_mul(1 << (attempt - 1).min(16)));
            }
            let started = Instant::now();
            let mut rq = self
                .agent
                .post(url)
                .header("Content-Type", "application/json");
            if let Some(k) = &self.key {
                rq = rq.header("Authorization", format!("Bearer {k}"));
            }
            let mut resp = match rq.send(body) {
                Ok(r) => r,
                Err(e) if transient(&e) => {
                    last = e.to_string();
                    continue;
                }
                Err(e) => return Err(remote(url, e)),
            };
            let status = resp.status().as_u16();
            let bytes = match resp.body_mut().with_config().limit(64 << 20).read_to_vec() {
                Ok(t) => t,
                Err(e) if transient(&e) => {
                    last = e.to_string();
                    continue;
                }
                Err(e) => return Err(remote(url, e)),
            };
            // A body that arrived whole but is not text is the server's
            // answer, not a transient fault: asking again gets it again.
            let text = String::from_utf8(bytes).map_err(|e| {
                remote(
                    url,
                    format!("HTTP {status}: the body is not UTF-8 text ({e})"),
                )
            })?;
            if (200..300).contains(&status) {
                return Ok((text, started.elapsed().as_secs_f64()));
            }
            let msg = error_message(&text);
            if status == 429 || status >= 500 {
                last = format!("HTTP {status}: {msg}");
                continue;
            }
            if status == 400 && mentions_context(&msg) {
                return Err(overflow(&msg, max_tokens));
            }
            return Err(remote(url, format!("HTTP {status}: {msg}")));
        }
        Err(remote(
            url,
            format!("{last} (gave up after {} attempts)", self.attempts),
        ))
    }
}

/// The `error.message` of an OpenAI-style error body, or the body itself.
fn error_message(text: &str) -> String {
    let m = serde_json::from_str::<AnyError>(text).map(AnyError::message);
    let m = one_line(m.as_deref().unwrap_or(text));
    if m.is_empty() {
        "(empty body)".into()
    } else {
        m
    }
}

/// Whether a 400's message is about the context length (vLLM, SGLang,
/// llama.cpp and `statebench serve` spell it differently).
fn mentions_context(msg: &str) -> bool {
    let m = msg.to_lowercase();
    [
        "context length",
        "maximum context",
        "context window",
        "context size",
        "context overflow",
    ]
    .iter()
    .any(|k| m.contains(k))
}

fn num(re: &Regex, msg: &str, i: usize) -> Option<usize> {
    re.captures(msg)?.get(i)?.as_str().parse().ok()
}

/// A context overflow with whatever counts the message gives (0 if none).
fn overflow(msg: &str, max_tokens: usize) -> BackendError {
    static OURS: OnceLock<Regex> = OnceLock::new();
    static MAX_CTX: OnceLock<Regex> = OnceLock::new();
    static IN_MSGS: OnceLock<Regex> = OnceLock::new();
    static SGL: OnceLock<Regex> = OnceLock::new();
    let ours = OURS.get_or_init(|| {
        Regex::new(r"(\d+) prompt tokens \+ (\d+) max tokens > context (\d+)")
            .expect("static regex")
    });
    if let (Some(p), Some(m), Some(c)) = (num(ours, msg, 1), num(ours, msg, 2), num(ours, msg, 3)) {
        return BackendError::ContextOverflow {
            prompt_tokens: p,
            partial: msg.contains("overflow: over "),
            max_tokens: m,
            context: c,
        };
    }
    let max_ctx = MAX_CTX
        .get_or_init(|| Regex::new(r"maximum context length is (\d+)").expect("static regex"));
    let in_msgs = IN_MSGS
        .get_or_init(|| Regex::new(r"(\d+) (?:tokens )?in the messages").expect("static regex"));
    let sgl = SGL.get_or_init(|| {
        Regex::new(
            r"input \((\d+) tokens\) is longer than the model's context length \((\d+) tokens\)",
        )
        .expect("static regex")
    });
    let (prompt_tokens, context) = match (num(sgl, msg, 1), num(sgl, msg, 2)) {
        (Some(p), Some(c)) => (p, c),
        _ => (
            num(in_msgs, msg, 1).unwrap_or(0),
            num(max_ctx, msg, 1).unwrap_or(0),
        ),
    };
    BackendError::ContextOverflow {
        prompt_tokens,
        partial: false,
        max_tokens,
        context,
    }
}

/// A `chat.completion` body → reply.
fn parse_reply(text: &str, secs: f64) -> Result<ChatReply, WireError> {
    let c: ChatCompletion = serde_json::from_str(text).map_err(WireError::json)?;
    c.into_reply(secs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Finish, Message, Role};

    #[test]
    fn roots_are_normalised() {
        assert_eq!(root("http://h:8000/v1/"), "http://h:8000");
        assert_eq!(root(" http://h:8000 "), "http://h:8000");
        assert_eq!(root("http://h/api/v1"), "http://h/api");
    }

    #[test]
    fn body_spells_the_api_fields() {
        let mut req = ChatRequest {
            temperature: 0.7,
            seed: 3,
            thinking: true,
            ..ChatRequest::greedy(vec![Message::new(Role::User, "hi")], 7)
        };
        let b = serde_json::to_value(ChatCompletionRequest::from_chat("m", &req)).unwrap();
        assert_eq!(b["messages"][0]["role"], "user");
        assert_eq!(b["chat_template_kwargs"]["enable_thinking"], true);
        assert!(b.get("stop").is_none());
        req.stop = vec!["x".into()];
        req.thinking = false;
        let s = serde_json::to_string(&ChatCompletionRequest::from_chat("m", &req)).unwrap();
        assert!(s.contains("\"temperature\":0.7,"), "{s}");
        assert!(s.contains("\"stop\":[\"x\"]"), "{s}");
    }

    /// Every constraint the engine takes reaches a server as the fields
    /// the server reads back into the same constraint.
    #[test]
    fn constraints_travel_in_the_body() {
        use crate::backend::{Constraint, Tool};
        let tools = vec![Tool::function(
            "f",
            "",
            serde_json::json!({"type": "object"}),
        )];
        for c in [
            Constraint::NoToolCalls,
            Constraint::ToolCalls(None),
            Constraint::ToolCalls(Some("f".into())),
            Constraint::JsonObject,
            Constraint::JsonSchema(serde_json::json!({"type": "object", "maxProperties": 2})),
        ] {
            let req = ChatRequest {
                tools: tools.clone(),
                constraint: Some(c.clone()),
                ..ChatRequest::greedy(vec![Message::new(Role::User, "hi")], 7)
            };
            let body = serde_json::to_string(&ChatCompletionRequest::from_chat("m", &req)).unwrap();
            let back: ChatCompletionRequest = serde_json::from_str(&body).unwrap();
            assert_eq!(back.into_call().unwrap().req.constraint, Some(c), "{body}");
        }
    }

    #[test]
    fn replies_parse_with_usage_and_reasoning() {
        let r = parse_reply(
            r#"{"choices":[{"message":{"role":"assistant","content":"Paris","reasoning_content":"hm"},"finish_reason":"length"}],
                "usage":{"prompt_tokens":10,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4}}}"#,
            0.5,
        )
        .unwrap();
        assert_eq!(r.content, "Paris");
        assert_eq!(r.reasoning.as_deref(), Some("hm"));
        assert_eq!(r.finish, Finish::Length);
        assert_eq!(r.usage.prompt_tokens, 10);
        assert_eq!(r.usage.cached_tokens, 4);
        assert_eq!(r.usage.completion_tokens, 2);
        let r = parse_reply(
            r#"{"choices":[{"message":{"content":"<think>a</think>\n\nb"},"finish_reason":"stop"}]}"#,
            0.0,
        )
        .unwrap();
        assert_eq!(
            (r.reasoning.as_deref(), r.content.as_str()),
            (Some("a"), "b")
        );
        assert_eq!(r.usage.cached_tokens, 0);
        assert!(parse_reply(r#"{"choices":[]}"#, 0.0).is_err());
        assert!(parse_reply("<html>", 0.0).is_err());
    }

    #[test]
    fn context_overflow_messages_are_recognised() {
        let vllm = "This model's maximum context length is 32768 tokens. However, you requested 33000 tokens (32000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.";
        assert!(mentions_context(vllm));
        match overflow(vllm, 1000) {
            BackendError::ContextOverflow {
                prompt_tokens,
                max_tokens,
                context,
                ..
            } => assert_eq!((prompt_tokens, max_tokens, context), (32000, 1000, 32768)),
            e => panic!("{e}"),
        }
        let ours = "context overflow: 600 prompt tokens + 400 max tokens > context 512 (shorten the conversation or lower max_tokens)";
        assert!(mentions_context(ours));
        match overflow(ours, 1) {
            BackendError::ContextOverflow {
                prompt_tokens,
                max_tokens,
                context,
                ..
            } => assert_eq!((prompt_tokens, max_tokens, context), (600, 400, 512)),
            e => panic!("{e}"),
        }
        let sgl =
            "The input (5000 tokens) is longer than the model's context length (4096 tokens).";
        assert!(mentions_context(sgl));
        assert!(mentions_context(
            "the request exceeds the available context size"
        ));
        assert!(!mentions_context("temperature must be non-negative"));
    }

    #[test]
    fn error_messages_are_one_line() {
        assert_eq!(
            error_message(r#"{"error":{"message":"bad\n  thing","type":"x"}}"#),
            "bad thing"
        );
        assert_eq!(
            error_message("Internal\nServer Error"),
            "Internal Server Error"
        );
        assert_eq!(error_message(""), "(empty body)");
        assert!(one_line(&"x".repeat(1000)).len() < 410);
    }
}
