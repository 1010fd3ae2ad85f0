//! `statebench serve`: the in-process engine behind an OpenAI-compatible
//! HTTP API (`POST /v1/chat/completions`, non-streaming; `GET /v1/models`;
//! `GET /health`), loopback by default.
//!
//! Every HTTP request runs on its own thread and sends its chat to the one
//! [`Served`] engine thread, so concurrent HTTP requests meet in the
//! scheduler and decode in the same batched forward steps.
//!
//! Each request opens a session, chats once and closes it: the engine's
//! prefix cache is not reused across HTTP calls (reusing it — matching a
//! request's messages to a live session's — is a later optimisation). Greedy
//! replies are nevertheless the same tokens as in-process, since the
//! engine's output does not depend on what came from the cache.
//!
//! Request fields: `messages` (roles system/developer, user, assistant;
//! content a string or a list of text parts), `max_tokens` (or
//! `max_completion_tokens`; default 1024), `temperature` (default 1.0, as
//! the API's), `seed` (default 0), `stop` (string or list),
//! `chat_template_kwargs.enable_thinking` (default true, as Qwen3's template
//! and vLLM have it; ignored by templates without thinking). `n` must be 1;
//! `stream: true` is refused. Other sampling fields (`top_p`, penalties, …)
//! are accepted and ignored: the engine samples from the plain softmax.

use std::io::Read;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use serde_json::{json, Value};
use tiny_http::{Header, Method, Request, Response};

use crate::backend::served::{Client, Served};
use crate::backend::{BackendError, ChatReply, ChatRequest, Finish, Message, ModelIdentity, Role};

/// Largest request body read (bytes).
const MAX_BODY: u64 = 32 << 20;
/// `max_tokens` when a request gives none.
const DEFAULT_MAX_TOKENS: usize = 1024;

/// `statebench serve`.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// A .gguf file, a safetensors directory or a Hugging Face id (default: the default GGUF, fetched if missing).
    #[arg(long)]
    pub model: Option<String>,
    /// Address to listen on. Anything but loopback exposes the engine, unauthenticated, to the network.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port (0 picks a free one; the address is printed).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Compute threads of the engine.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address does not resolve or cannot be bound.
    #[error("{addr}: cannot listen: {cause} (pick another --host/--port)")]
    Bind {
        /// host:port as given.
        addr: String,
        /// Why.
        cause: String,
    },
}

/// A bound listener that answers nothing yet (bind before loading a model,
/// so a taken port fails fast).
pub struct Listener {
    http: tiny_http::Server,
    addr: SocketAddr,
}

impl Listener {
    /// Binds `host:port` (port 0 picks a free one).
    pub fn bind(host: &str, port: u16) -> Result<Listener, ServeError> {
        let spelled = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let bind = |cause: String| ServeError::Bind {
            addr: spelled.clone(),
            cause,
        };
        let addr = spelled
            .to_socket_addrs()
            .map_err(|e| bind(e.to_string()))?
            .next()
            .ok_or_else(|| bind("resolves to no address".into()))?;
        let http = tiny_http::Server::http(addr).map_err(|e| bind(e.to_string()))?;
        let addr = http
            .server_addr()
            .to_ip()
            .ok_or_else(|| bind("not an IP listener".into()))?;
        Ok(Listener { http, addr })
    }

    /// The bound address (with the actual port when 0 was asked).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Starts answering with the served engine behind `client`.
    pub fn serve(self, client: Client, model: ModelIdentity) -> Result<Server, ServeError> {
        let Listener { http, addr } = self;
        let http = Arc::new(http);
        let shared = Arc::new(Shared {
            client,
            model,
            next: AtomicU64::new(0),
        });
        let h = Arc::clone(&http);
        let join = std::thread::Builder::new()
            .name("statebench-http-accept".into())
            .spawn(move || {
                for rq in h.incoming_requests() {
                    let s = Arc::clone(&shared);
                    let spawned = std::thread::Builder::new()
                        .name("statebench-http-request".into())
                        .spawn(move || handle(rq, &s));
                    if let Err(e) = spawned {
                        eprintln!("statebench serve: could not start a request thread: {e}");
                    }
                }
            })
            .map_err(|e| ServeError::Bind {
                addr: addr.to_string(),
                cause: format!("could not start the accept thread: {e}"),
            })?;
        Ok(Server {
            http,
            addr,
            join: Some(join),
        })
    }
}

/// A running HTTP server; stops when shut down or dropped.
pub struct Server {
    http: Arc<tiny_http::Server>,
    addr: SocketAddr,
    join: Option<JoinHandle<()>>,
}

impl Server {
    /// Listens on `host:port` and answers with the served engine behind `client`.
    pub fn start(
        client: Client,
        model: ModelIdentity,
        host: &str,
        port: u16,
    ) -> Result<Server, ServeError> {
        Listener::bind(host, port)?.serve(client, model)
    }

    /// The bound address (with the actual port when 0 was asked).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until the process ends.
    pub fn wait(mut self) {
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }

    /// Stops accepting requests (requests in progress finish).
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.http.unblock();
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Shared {
    client: Client,
    model: ModelIdentity,
    next: AtomicU64,
}

/// An HTTP error answer: status, OpenAI error type, one-line message.
struct HttpError(u16, &'static str, String);

impl HttpError {
    fn bad(msg: impl Into<String>) -> Self {
        HttpError(400, "invalid_request_error", msg.into())
    }
}

fn handle(mut rq: Request, s: &Shared) {
    let (status, body) = match route(&mut rq, s) {
        Ok(v) => (200, v),
        Err(HttpError(status, kind, message)) => (
            status,
            json!({ "error": { "message": message, "type": kind, "param": null, "code": null } }),
        ),
    };
    let header =
        Header::from_bytes(&b"Content-Type"[..], &b"application/json"[..]).expect("static header");
    let resp = Response::from_data(body.to_string().into_bytes())
        .with_status_code(status)
        .with_header(header);
    let _ = rq.respond(resp);
}

fn route(rq: &mut Request, s: &Shared) -> Result<Value, HttpError> {
    let path = rq.url().split('?').next().unwrap_or("").to_string();
    let path = path.trim_end_matches('/');
    match (rq.method(), path) {
        (Method::Get, "/v1/models") => Ok(json!({
            "object": "list",
            "data": [{
                "id": s.model.name,
                "object": "model",
                "created": 0,
                "owned_by": "statebench",
            }],
        })),
        (Method::Get, "/health") => Ok(json!({ "status": "ok" })),
        (Method::Post, "/v1/chat/completions") => {
            let mut body = Vec::new();
            rq.as_reader()
                .take(MAX_BODY + 1)
                .read_to_end(&mut body)
                .map_err(|e| HttpError::bad(format!("could not read the request body: {e}")))?;
            if body.len() as u64 > MAX_BODY {
                return Err(HttpError(
                    413,
                    "invalid_request_error",
                    format!("request body over {MAX_BODY} bytes"),
                ));
            }
            let req = parse_chat(&body).map_err(HttpError::bad)?;
            let reply = chat(&s.client, req).map_err(|e| backend_error(&e))?;
            let n = s.next.fetch_add(1, Ordering::Relaxed) + 1;
            Ok(completion(&reply, &s.model.name, n))
        }
        (_, "/v1/models" | "/v1/chat/completions" | "/health") => Err(HttpError(
            405,
            "invalid_request_error",
            format!("method {} not allowed on {path}", rq.method()),
        )),
        _ => Err(HttpError(
            404,
            "not_found_error",
            format!(
                "no route {path} (this server has POST /v1/chat/completions and GET /v1/models)"
            ),
        )),
    }
}

fn chat(client: &Client, req: ChatRequest) -> Result<ChatReply, BackendError> {
    // One session per HTTP call; dropping it closes it.
    let session = client.open()?;
    session.chat(req)
}

fn backend_error(e: &BackendError) -> HttpError {
    match e {
        BackendError::ContextOverflow { .. }
        | BackendError::ExceedsKvBudget { .. }
        | BackendError::BadRequest(_)
        | BackendError::Template(_)
        | BackendError::Tokenizer(_) => HttpError::bad(e.to_string()),
        _ => HttpError(500, "server_error", e.to_string()),
    }
}

/// The OpenAI `chat.completion` body of a reply.
pub fn completion(reply: &ChatReply, model: &str, n: u64) -> Value {
    let mut message = json!({ "role": "assistant", "content": reply.content });
    if let Some(r) = &reply.reasoning {
        message["reasoning_content"] = json!(r);
    }
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let u = &reply.usage;
    json!({
        "id": format!("chatcmpl-{n}"),
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": match reply.finish {
                Finish::Stop => "stop",
                Finish::Length => "length",
            },
        }],
        "usage": {
            "prompt_tokens": u.prompt_tokens,
            "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": { "cached_tokens": u.cached_tokens },
        },
    })
}

fn text_of(content: &Value, i: usize) -> Result<String, String> {
    match content {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("text") | None, Some(Value::String(t))) => out.push_str(t),
                    (t, _) => {
                        return Err(format!(
                            "messages[{i}]: only text content parts are supported, got {}",
                            t.unwrap_or("a part without text")
                        ))
                    }
                }
            }
            Ok(out)
        }
        _ => Err(format!(
            "messages[{i}].content must be a string or a list of text parts"
        )),
    }
}

fn uint(v: &Value, key: &str) -> Result<Option<u64>, String> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("{key} must be a non-negative integer")),
    }
}

/// Parses a `/v1/chat/completions` body into an engine request; the error
/// is a one-line message for a 400.
pub fn parse_chat(body: &[u8]) -> Result<ChatRequest, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("invalid JSON body: {e}"))?;
    if !v.is_object() {
        return Err("the body must be a JSON object".into());
    }
    if v.get("stream").and_then(Value::as_bool) == Some(true) {
        return Err(
            "stream: true is not supported; this server answers non-streaming requests only (send stream: false)"
                .into(),
        );
    }
    if let Some(n) = uint(&v, "n")? {
        if n != 1 {
            return Err(format!("n must be 1, got {n}"));
        }
    }
    let msgs = v
        .get("messages")
        .and_then(Value::as_array)
        .ok_or("messages must be a list of {role, content}")?;
    if msgs.is_empty() {
        return Err("messages is empty".into());
    }
    let mut messages = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        let role = match m.get("role").and_then(Value::as_str) {
            Some("system" | "developer") => Role::System,
            Some("user") => Role::User,
            Some("assistant") => Role::Assistant,
            Some(r) => {
                return Err(format!(
                    "messages[{i}].role '{r}' is not supported (system, user, assistant)"
                ))
            }
            None => return Err(format!("messages[{i}] has no role")),
        };
        let content = text_of(m.get("content").unwrap_or(&Value::Null), i)?;
        messages.push(Message::new(role, content));
    }
    let max_tokens = match uint(&v, "max_completion_tokens")? {
        Some(n) => Some(n),
        None => uint(&v, "max_tokens")?,
    };
    let max_tokens = max_tokens.map_or(DEFAULT_MAX_TOKENS, |n| n as usize);
    if max_tokens == 0 {
        return Err("max_tokens must be at least 1".into());
    }
    let temperature = match v.get("temperature") {
        None | Some(Value::Null) => 1.0,
        Some(t) => t
            .as_f64()
            .filter(|t| t.is_finite() && *t >= 0.0)
            .ok_or("temperature must be a number >= 0")? as f32,
    };
    let seed = match v.get("seed") {
        None | Some(Value::Null) => 0,
        Some(s) => s
            .as_u64()
            .or_else(|| s.as_i64().map(|x| x as u64))
            .ok_or("seed must be an integer")?,
    };
    let stop = match v.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|s| s.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or("stop must be a string or a list of strings")?,
        Some(_) => return Err("stop must be a string or a list of strings".into()),
    };
    let thinking = match v.pointer("/chat_template_kwargs/enable_thinking") {
        None | Some(Value::Null) => true,
        Some(b) => b
            .as_bool()
            .ok_or("chat_template_kwargs.enable_thinking must be a boolean")?,
    };
    Ok(ChatRequest {
        messages,
        max_tokens,
        stop,
        thinking,
        temperature,
        seed,
    })
}

/// `statebench serve`: loads the model and answers until killed.
pub fn serve_command(a: ServeArgs) -> anyhow::Result<()> {
    let listener = Listener::bind(&a.host, a.port)?;
    let spec = crate::cli_engine::resolve_model(&a.model)?;
    let opts = crate::engine::EngineOptions {
        threads: a.threads,
        ..crate::engine::EngineOptions::default()
    };
    let engine = crate::engine::Engine::load(&spec, opts)?;
    let served = Served::spawn(Box::new(engine));
    let model = served.model_id().clone();
    let server = listener.serve(served.client(), model.clone())?;
    let addr = server.addr();
    if !addr.ip().is_loopback() {
        eprintln!(
            "warning: listening on {addr}, beyond this machine; the server has no authentication"
        );
    }
    eprintln!(
        "statebench serve: {} on http://{addr} (POST /v1/chat/completions, GET /v1/models)",
        model.name
    );
    server.wait();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_bodies_parse_with_openai_defaults() {
        let r = parse_chat(
            br#"{"model":"x","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}"#,
        )
        .unwrap();
        assert_eq!(r.messages.len(), 2);
        assert_eq!(r.messages[1].content, "ab");
        assert_eq!(r.max_tokens, DEFAULT_MAX_TOKENS);
        assert_eq!(r.temperature, 1.0);
        assert!(r.thinking);
        let r = parse_chat(
            br#"{"messages":[{"role":"user","content":"q"}],"max_tokens":5,"temperature":0,"seed":9,"stop":"\n","chat_template_kwargs":{"enable_thinking":false}}"#,
        )
        .unwrap();
        assert_eq!((r.max_tokens, r.temperature, r.seed), (5, 0.0, 9));
        assert_eq!(r.stop, vec!["\n".to_string()]);
        assert!(!r.thinking);
    }

    #[test]
    fn bad_bodies_get_one_line_reasons() {
        for (body, needle) in [
            (&b"{not json"[..], "invalid JSON body"),
            (
                br#"{"messages":[{"role":"user","content":"q"}],"stream":true}"#,
                "stream: true is not supported",
            ),
            (br#"{"messages":[]}"#, "messages is empty"),
            (
                br#"{"messages":[{"role":"tool","content":"q"}]}"#,
                "'tool' is not supported",
            ),
            (
                br#"{"messages":[{"role":"user","content":"q"}],"n":2}"#,
                "n must be 1",
            ),
            (
                br#"{"messages":[{"role":"user","content":"q"}],"max_tokens":0}"#,
                "at least 1",
            ),
            (
                br#"{"messages":[{"role":"user","content":"q"}],"temperature":-1}"#,
                "temperature",
            ),
            (br#"[1]"#, "JSON object"),
        ] {
            let e = parse_chat(body).unwrap_err();
            assert!(e.contains(needle), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }
}
