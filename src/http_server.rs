//! `statebench serve`: the in-process engine behind an OpenAI-compatible
//! HTTP API (`POST /v1/chat/completions`, non-streaming; `GET /v1/models`;
//! `GET /health`), loopback by default.
//!
//! The server is a small HTTP/1.1 over `std::net` (one request per
//! connection, `Connection: close`, bodies by `Content-Length` up to
//! 32 MiB, 30 s read timeouts, a bounded number of connections at once):
//! owning the socket lets it notice a client that hung up, and drop its
//! request from the batch at once.
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

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde::Serialize;

use crate::backend::shared::Client;
use crate::backend::{BackendError, ChatRequest, ModelIdentity};
use crate::wire::{
    ChatCompletion, ChatCompletionRequest, EmbeddingRequest, EmbeddingResponse, ErrorBody,
    ErrorDetail, ModelCard, ModelList, WireError,
};

/// Largest request body read (bytes).
const MAX_BODY: usize = 32 << 20;
/// Largest request line plus headers (bytes).
const MAX_HEAD: usize = 64 << 10;
/// How long a client may take to send its request, or to take the answer.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections served at once by default (a thread each); past the bound a
/// connection gets 503 at once, so a flood of clients cannot exhaust
/// threads or descriptors.
pub const MAX_CONNECTIONS: usize = 512;
/// Longest pause of the accept loop after accept fails (out of descriptors):
/// it waits instead of spinning, doubling from a millisecond.
const MAX_ACCEPT_PAUSE: Duration = Duration::from_secs(1);

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
    tcp: TcpListener,
    addr: SocketAddr,
    max_connections: usize,
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
        let addr = spelled
            .to_socket_addrs()
            .map_err(bind)?
            .next()
            .ok_or_else(|| bind(std::io::Error::other("resolves to no address")))?;
        let tcp = TcpListener::bind(addr).map_err(bind)?;
        let addr = tcp.local_addr().map_err(bind)?;
        Ok(Listener {
            tcp,
            addr,
            max_connections: MAX_CONNECTIONS,
        })
    }

    /// Serves at most `n` connections at once (default [`MAX_CONNECTIONS`]).
    pub fn max_connections(mut self, n: usize) -> Listener {
        self.max_connections = n.max(1);
        self
    }

    /// The bound address (with the actual port when 0 was asked).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Starts answering with the served engine behind `client`.
    pub fn serve(self, client: Client, model: ModelIdentity) -> Result<Server, ServeError> {
        let Listener {
            tcp,
            addr,
            max_connections,
        } = self;
        let shared = Arc::new(Shared {
            client,
            model,
            next: AtomicU64::new(0),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let open = Arc::new(AtomicUsize::new(0));
        let join = std::thread::Builder::new()
            .name("statebench-http-accept".into())
            .spawn(move || {
                let mut pause = Duration::ZERO;
                for conn in tcp.incoming() {
                    if stopping.load(Ordering::SeqCst) {
                        break;
                    }
                    let mut stream = match conn {
                        Ok(s) => {
                            pause = Duration::ZERO;
                            s
                        }
                        Err(_) => {
                            pause = (pause * 2).clamp(Duration::from_millis(1), MAX_ACCEPT_PAUSE);
                            std::thread::sleep(pause);
                            continue;
                        }
                    };
                    if open.load(Ordering::SeqCst) >= max_connections {
                        let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
                        answer(
                            &mut stream,
                            Err(HttpError(
                                503,
                                "server_error",
                                format!("{max_connections} connections are open; retry later"),
                            )),
                        );
                        let _ = stream.shutdown(Shutdown::Both);
                        continue;
                    }
                    let s = Arc::clone(&shared);
                    let guard = OpenConnection::new(&open);
                    let spawned = std::thread::Builder::new()
                        .name("statebench-http-request".into())
                        .spawn(move || handle(stream, &s, guard));
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
            addr,
            stop,
            join: Some(join),
        })
    }
}

/// A running HTTP server; stops when shut down or dropped.
pub struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
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
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop with a connection of our own.
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
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

/// A request as read off the socket.
struct HttpRequest {
    method: String,
    path: String,
    body: Vec<u8>,
}

/// One connection counted as open while this lives.
struct OpenConnection(Arc<AtomicUsize>);

impl OpenConnection {
    fn new(open: &Arc<AtomicUsize>) -> Self {
        open.fetch_add(1, Ordering::SeqCst);
        OpenConnection(Arc::clone(open))
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn handle(mut stream: TcpStream, s: &Shared, slot: OpenConnection) {
    let _ = stream.set_read_timeout(Some(IO_TIMEOUT));
    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
    let result = match read_request(&mut stream) {
        Ok(rq) => route(&rq, s, &stream),
        Err(e) => Err(e),
    };
    answer(&mut stream, result);
    // The slot is free before the client can see the close, so a client that
    // reads an answer to its end and connects again is never refused for it.
    drop(slot);
    let _ = stream.shutdown(Shutdown::Both);
}

/// Writes the answer (a body, or an error as OpenAI's error object); the
/// caller closes the connection.
fn answer(stream: &mut TcpStream, result: Result<String, HttpError>) {
    let (status, body) = match result {
        Ok(body) => (200, body),
        // The client went away; there is nobody to answer.
        Err(HttpError(499, ..)) => return,
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
    let head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        reason(status),
        body.len()
    );
    let _ = stream
        .write_all(head.as_bytes())
        .and_then(|()| stream.write_all(body.as_bytes()))
        .and_then(|()| stream.flush());
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        411 => "Length Required",
        413 => "Payload Too Large",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Internal Server Error",
    }
}

/// Reads the request line, the headers and a `Content-Length` body.
fn read_request(stream: &mut TcpStream) -> Result<HttpRequest, HttpError> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        if buf.len() > MAX_HEAD {
            return Err(HttpError(
                431,
                "invalid_request_error",
                format!("request line and headers over {MAX_HEAD} bytes"),
            ));
        }
        let n = stream
            .read(&mut chunk)
            .map_err(|e| HttpError::bad(format!("could not read the request: {e}")))?;
        if n == 0 {
            return Err(HttpError::bad(
                "the connection closed before a whole request arrived",
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or("").split_whitespace();
    let (Some(method), Some(target)) = (first.next(), first.next()) else {
        return Err(HttpError::bad("malformed request line"));
    };
    let mut length: Option<usize> = None;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            return Err(HttpError::bad(format!("malformed header line '{line}'")));
        };
        let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
        if name == "content-length" {
            let n = value
                .parse()
                .map_err(|_| HttpError::bad(format!("Content-Length '{value}' is not a length")))?;
            // Two lengths that differ leave the body's end ambiguous (the
            // way requests are smuggled past a proxy).
            if length.is_some_and(|l| l != n) {
                return Err(HttpError::bad("conflicting Content-Length headers"));
            }
            length = Some(n);
        }
        if name == "transfer-encoding" && !value.eq_ignore_ascii_case("identity") {
            return Err(HttpError(
                411,
                "invalid_request_error",
                "chunked request bodies are not supported; send Content-Length".into(),
            ));
        }
    }
    let length = length.unwrap_or(0);
    if length > MAX_BODY {
        return Err(HttpError(
            413,
            "invalid_request_error",
            format!("request body over {MAX_BODY} bytes"),
        ));
    }
    let mut body = buf.split_off(head_end + 4);
    body.truncate(length);
    if body.len() < length {
        let start = body.len();
        body.resize(length, 0);
        stream
            .read_exact(&mut body[start..])
            .map_err(|e| HttpError::bad(format!("could not read the request body: {e}")))?;
    }
    let path = target.split('?').next().unwrap_or("");
    Ok(HttpRequest {
        method: method.to_string(),
        path: path.trim_end_matches('/').to_string(),
        body,
    })
}

/// Whether the client hung up: a read would see the end of the stream.
fn client_gone(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return false;
    }
    let mut b = [0u8; 1];
    let gone = matches!(stream.peek(&mut b), Ok(0));
    let _ = stream.set_nonblocking(false);
    gone
}

fn json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("wire types serialize")
}

fn route(rq: &HttpRequest, s: &Shared, stream: &TcpStream) -> Result<String, HttpError> {
    let path = rq.path.as_str();
    match (rq.method.as_str(), path) {
        ("GET", "/v1/models") => Ok(json(&ModelList {
            object: "list".into(),
            data: vec![ModelCard {
                id: s.model.name.clone(),
                object: "model".into(),
                created: 0,
                owned_by: "statebench".into(),
            }],
        })),
        ("GET", "/health") => Ok(r#"{"status":"ok"}"#.into()),
        ("POST", "/v1/chat/completions") => {
            let req = parse_chat(&rq.body).map_err(|e| HttpError::bad(crate::one_line(&e)))?;
            let reply = chat(&s.client, req, stream)?;
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
        ("POST", "/v1/embeddings") => {
            let req: EmbeddingRequest = serde_json::from_slice(&rq.body)
                .map_err(|e| HttpError::bad(crate::one_line(&WireError::json(e))))?;
            let texts = req
                .into_texts()
                .map_err(|e| HttpError::bad(crate::one_line(&e)))?;
            let e = match s.client.embed_unless(texts, &|| client_gone(stream)) {
                Ok(e) => e,
                Err(BackendError::Cancelled) => return Err(HttpError(499, "", String::new())),
                Err(e) => return Err(backend_error(&e)),
            };
            Ok(json(&EmbeddingResponse::from_embeddings(&e, &s.model.name)))
        }
        (_, "/v1/models" | "/v1/chat/completions" | "/v1/embeddings" | "/health") => Err(HttpError(
            405,
            "invalid_request_error",
            format!("method {} not allowed on {path}", rq.method),
        )),
        _ => Err(HttpError(
            404,
            "not_found_error",
            format!(
                "no route {path} (this server has POST /v1/chat/completions, POST /v1/embeddings and GET /v1/models)"
            ),
        )),
    }
}

/// One conversation per HTTP call (dropping it closes it); dropped from the
/// batch as soon as the client hangs up.
fn chat(
    client: &Client,
    req: ChatRequest,
    stream: &TcpStream,
) -> Result<crate::backend::ChatReply, HttpError> {
    let session = client.open().map_err(|e| backend_error(&e))?;
    match session.chat_unless(req, &|| client_gone(stream)) {
        Ok(r) => Ok(r),
        Err(BackendError::Cancelled) => Err(HttpError(499, "", String::new())),
        Err(e) => Err(backend_error(&e)),
    }
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
        let r = parse_chat(
            br##"{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":null,"tool_calls":[{"id":"c7","type":"function","function":{"name":"f","arguments":"{\"work_order\": \"#W1\"}"}}]},{"role":"tool","tool_call_id":"c7","content":"ok"}],"tools":[{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object"}}}],"tool_choice":"auto"}"##,
        )
        .unwrap();
        assert_eq!(r.tools[0].function.name, "f");
        assert_eq!(r.messages[1].tool_calls[0].id, "c7");
        assert_eq!(
            r.messages[1].tool_calls[0].arguments,
            "{\"work_order\": \"#W1\"}"
        );
        assert_eq!(r.messages[2].role, crate::backend::Role::Tool);
        assert_eq!(r.messages[2].tool_call_id, "c7");
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
                br#"{"messages":[{"role":"function","content":"q"}]}"#,
                "'function' is not supported",
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
