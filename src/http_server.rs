//! `statebench serve`: the in-process engine behind an OpenAI-compatible
//! HTTP API (`POST /v1/chat/completions`, non-streaming; `GET /v1/models`;
//! `GET /health`), loopback by default.
//!
//! Every HTTP request runs on its own thread and sends its chat to the one
//! [`SharedBackend`](crate::backend::shared::SharedBackend) thread, so concurrent HTTP requests meet in the
//! scheduler and decode in the same batched forward steps.
//!
//! Each request opens a session, chats once and closes it: the engine's
//! prefix cache is not reused across HTTP calls (reusing it — matching a
//! request's messages to a live session's — is a later optimisation). Greedy
//! replies are nevertheless the same tokens as in-process, since the
//! engine's output does not depend on what came from the cache.
//!
//! Request fields (typed in [`crate::wire`]): `messages` (roles system/developer, user, assistant;
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

use serde::Serialize;
use tiny_http::{Header, Method, Request, Response};

use crate::backend::shared::Client;
use crate::backend::{BackendError, ChatReply, ChatRequest, ModelIdentity};
use crate::wire::{
    ChatCompletion, ChatCompletionRequest, ErrorBody, ErrorDetail, ModelCard, ModelList, WireError,
};

/// Largest request body read (bytes).
const MAX_BODY: u64 = 32 << 20;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address does not resolve or cannot be bound.
    #[error("{addr}: cannot listen (pick another --host/--port)")]
    Bind {
        /// host:port as given.
        addr: String,
        #[source]
        source: std::io::Error,
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
        let bind = |source: std::io::Error| ServeError::Bind {
            addr: spelled.clone(),
            source,
        };
        let other = |msg: String| bind(std::io::Error::other(msg));
        let addr = spelled
            .to_socket_addrs()
            .map_err(bind)?
            .next()
            .ok_or_else(|| other("resolves to no address".into()))?;
        let http = tiny_http::Server::http(addr).map_err(|e| other(e.to_string()))?;
        let addr = http
            .server_addr()
            .to_ip()
            .ok_or_else(|| other("not an IP listener".into()))?;
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
            .map_err(|source| ServeError::Bind {
                addr: addr.to_string(),
                source,
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
        Ok(body) => (200, body),
        Err(HttpError(status, kind, message)) => {
            let body = ErrorBody {
                error: ErrorDetail {
                    message,
                    kind: kind.into(),
                    param: None,
                    code: None,
                },
            };
            (status, json(&body))
        }
    };
    let header =
        Header::from_bytes(&b"Content-Type"[..], &b"application/json"[..]).expect("static header");
    let resp = Response::from_data(body.into_bytes())
        .with_status_code(status)
        .with_header(header);
    let _ = rq.respond(resp);
}

fn json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("wire types serialize")
}

fn route(rq: &mut Request, s: &Shared) -> Result<String, HttpError> {
    let path = rq.url().split('?').next().unwrap_or("").to_string();
    let path = path.trim_end_matches('/');
    match (rq.method(), path) {
        (Method::Get, "/v1/models") => Ok(json(&ModelList {
            object: "list".into(),
            data: vec![ModelCard {
                id: s.model.name.clone(),
                object: "model".into(),
                created: 0,
                owned_by: "statebench".into(),
            }],
        })),
        (Method::Get, "/health") => Ok(r#"{"status":"ok"}"#.into()),
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
            let req = parse_chat(&body).map_err(|e| HttpError::bad(crate::one_line(&e)))?;
            let reply = chat(&s.client, req).map_err(|e| backend_error(&e))?;
            let n = s.next.fetch_add(1, Ordering::Relaxed) + 1;
            let created = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            Ok(json(&ChatCompletion::from_reply(
                &reply,
                &s.model.name,
                n,
                created,
            )))
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
    // One conversation per HTTP call; dropping it closes it.
    client.open()?.chat(req)
}

fn backend_error(e: &BackendError) -> HttpError {
    let msg = crate::one_line(e);
    match e {
        BackendError::ContextOverflow { .. }
        | BackendError::ExceedsKvBudget { .. }
        | BackendError::BadRequest(_)
        | BackendError::Template(_)
        | BackendError::Tokenizer(_) => HttpError::bad(msg),
        _ => HttpError(500, "server_error", msg),
    }
}

/// Parses a `/v1/chat/completions` body into an engine request.
pub fn parse_chat(body: &[u8]) -> Result<ChatRequest, WireError> {
    let req: ChatCompletionRequest = serde_json::from_slice(body).map_err(WireError::json)?;
    req.into_chat()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::DEFAULT_MAX_TOKENS;

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
            let e = crate::one_line(&parse_chat(body).unwrap_err());
            assert!(e.contains(needle), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }
}
