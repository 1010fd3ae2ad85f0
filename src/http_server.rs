//! `statebench serve`: the in-process engine behind an OpenAI-compatible
//! HTTP API (`POST /v1/chat/completions`, streaming or not; `POST
//! /v1/completions`; `POST /v1/embeddings`; `GET /v1/models[/{id}]`;
//! `GET /health`), loopback by default.
//!
//! The server is a small HTTP/1.1 over `std::net` (keep-alive, bodies by
//! `Content-Length` up to 32 MiB, 30 s read timeouts, a bounded number of
//! connections at once): owning the socket lets it notice a client that
//! hung up, and drop its request from the batch at once.
//!
//! Every connection runs on its own thread and sends its requests to the one
//! [`SharedBackend`](crate::backend::shared::SharedBackend) thread, so
//! concurrent requests, and a request's `n` choices, meet in the scheduler
//! and decode in the same batched forward steps.
//!
//! Each choice runs on a session of its own. A finished session is kept
//! idle (`SessionPool`) with the prompt it read, and a later request that
//! extends that prompt (a conversation's next turn) runs on it, reusing its
//! keys and values as an in-process session would; the engine evicts idle
//! caches under its KV budget. Replies are the same tokens either way,
//! since the engine's output depends neither on what came from the cache
//! nor on the batch.
//!
//! The fields each endpoint reads, and what it refuses, are typed in
//! [`crate::wire`] and listed in the book (docs/src/serve.md). Sampling
//! fields the engine has no use for (`top_p`, penalties, …) are accepted
//! and ignored: it samples from the plain softmax.
//!
//! Layer: beside the studies, on the engine: it serves the engine through
//! [`crate::wire`] and uses no study.

use std::hash::{BuildHasher, Hasher};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::backend::shared::{Client, Conversation, Event};
use crate::backend::{BackendError, ChatReply, ChatRequest, ModelIdentity, Progress, TokenLogprob};
use crate::wire::{
    choice_seed, finish_reason, ChatCall, ChatChunk, ChatCompletion, ChatCompletionRequest,
    ChoiceLogprobs, ChunkChoice, Completion, CompletionChoice, CompletionChunk, CompletionRequest,
    Delta, EmbeddingRequest, EmbeddingResponse, ErrorBody, ErrorDetail, ModelCard, ModelList,
    ToolCallDelta, WireError, WireUsage,
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
    served_name: Option<String>,
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
            served_name: None,
        })
    }

    /// The model id clients send and are answered with (default: the
    /// model's [`ModelIdentity::short_name`]).
    pub fn served_model_name(mut self, name: Option<String>) -> Listener {
        self.served_name = name;
        self
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
            served_name,
        } = self;
        let shared = Arc::new(Shared {
            client,
            name: served_name.unwrap_or_else(|| model.short_name()),
            draws: Mutex::new(crate::rng::Rng::new(entropy())),
            pool: SessionPool::new(),
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
                    let stream = match conn {
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
                        let e = HttpError::new(
                            503,
                            "server_error",
                            format!("{max_connections} connections are open; retry later"),
                        );
                        let _ = write_json(&stream, e.status, &e.body(), false);
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
    /// The served model id.
    name: String,
    /// Seeded at start: ids and seeds differ between server runs.
    draws: Mutex<crate::rng::Rng>,
    pool: SessionPool<Conversation>,
}

/// Idle sessions, least recently used first, each with the prompt tokens
/// it last read (its cache holds those and the reply).
struct SessionPool<S> {
    idle: Mutex<std::collections::VecDeque<(Vec<u32>, S)>>,
}

/// Idle sessions kept at most; the least recently used is closed past it.
const IDLE_SESSIONS: usize = 256;

impl<S> SessionPool<S> {
    fn new() -> SessionPool<S> {
        SessionPool {
            idle: Mutex::new(std::collections::VecDeque::new()),
        }
    }

    /// A session for `prompt`: the one whose whole last prompt `prompt`
    /// extends the furthest (the same conversation's next turn); failing
    /// that, the least recently used one that shares at least half of what
    /// it read (a system prompt, most likely of a conversation that
    /// ended), so an active conversation keeps its cache.
    fn take(&self, prompt: &[u32]) -> Option<S> {
        let mut idle = self.idle.lock().ok()?;
        let shared: Vec<(usize, usize)> = idle
            .iter()
            .map(|(read, _)| {
                (
                    crate::engine::scheduler::common_prefix(read, prompt),
                    read.len(),
                )
            })
            .collect();
        let extended = (0..idle.len())
            .filter(|&i| shared[i].0 == shared[i].1 && shared[i].0 > 0)
            .max_by_key(|&i| (shared[i].0, i));
        let at = extended.or_else(|| {
            (0..idle.len()).find(|&i| shared[i].0 > 0 && 2 * shared[i].0 >= shared[i].1)
        })?;
        idle.remove(at).map(|(_, session)| session)
    }

    /// Keeps `session`, which has just answered `prompt`.
    fn put(&self, prompt: Vec<u32>, session: S) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.push_back((prompt, session));
            if idle.len() > IDLE_SESSIONS {
                idle.pop_front();
            }
        }
    }
}

impl Shared {
    /// A fresh 64-bit value: the next draw of the server's generator.
    fn fresh(&self) -> u64 {
        self.draws.lock().map_or(0, |mut r| r.next_u64())
    }

    /// An id no other response of this server, nor likely of another, has.
    fn fresh_id(&self, prefix: &str) -> String {
        format!("{prefix}{:016x}{:08x}", self.fresh(), self.fresh() as u32)
    }
}

/// 64 bits from the process's hash keys (seeded by the OS).
fn entropy() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// An HTTP error answer: status and OpenAI's error object.
#[derive(Debug)]
struct HttpError {
    status: u16,
    kind: &'static str,
    message: String,
    param: Option<&'static str>,
    code: Option<&'static str>,
}

impl HttpError {
    fn new(status: u16, kind: &'static str, message: String) -> Self {
        HttpError {
            status,
            kind,
            message,
            param: None,
            code: None,
        }
    }

    fn bad(msg: impl Into<String>) -> Self {
        HttpError::new(400, "invalid_request_error", msg.into())
    }

    fn wire(e: &WireError) -> Self {
        HttpError {
            param: e.param(),
            ..HttpError::bad(crate::one_line(e))
        }
    }

    /// The client hung up: nobody to answer.
    fn gone() -> Self {
        HttpError::new(499, "", String::new())
    }

    fn body(&self) -> String {
        json(&ErrorBody {
            error: ErrorDetail {
                message: self.message.clone(),
                kind: self.kind.into(),
                param: self.param.map(Into::into),
                code: self.code.map(Into::into),
            },
        })
    }
}

/// A request as read off the socket.
struct HttpRequest {
    method: String,
    path: String,
    body: Vec<u8>,
    /// Whether the connection stays open after the answer.
    keep_alive: bool,
}

/// What a route answered, for the connection and the log line.
struct Answered {
    /// The JSON body; None when the route streamed its answer itself.
    body: Option<String>,
    /// The response id and token counts, for the log line.
    id: String,
    usage: Option<WireUsage>,
}

impl Answered {
    fn plain(body: String) -> Self {
        Answered {
            body: Some(body),
            id: String::new(),
            usage: None,
        }
    }
}

/// Holds one of the server's connection slots while alive.
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

/// Answers the connection's requests in turn until it closes, asks to
/// close, streams, or fails.
fn handle(stream: TcpStream, s: &Shared, slot: OpenConnection) {
    let _ = stream.set_read_timeout(Some(IO_TIMEOUT));
    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
    let mut pending = Vec::new();
    loop {
        let started = Instant::now();
        let rq = match read_request(&stream, &mut pending) {
            Ok(Some(rq)) => rq,
            Ok(None) => break,
            Err(e) => {
                let _ = write_json(&stream, e.status, &e.body(), false);
                log("-", "-", e.status, None, started);
                break;
            }
        };
        let result = route(&rq, s, &stream);
        let (status, keep) = match &result {
            Ok(a) => match &a.body {
                Some(body) => {
                    let wrote = write_json(&stream, 200, body, rq.keep_alive).is_ok();
                    (200, rq.keep_alive && wrote)
                }
                None => (200, false),
            },
            Err(e) if e.status == 499 => (499, false),
            Err(e) => {
                let wrote = write_json(&stream, e.status, &e.body(), rq.keep_alive).is_ok();
                (e.status, rq.keep_alive && wrote)
            }
        };
        if rq.path != "/health" {
            let (id, usage) = match &result {
                Ok(a) => (a.id.as_str(), a.usage.as_ref()),
                Err(_) => ("-", None),
            };
            let what = format!("{} {}", rq.method, rq.path);
            log(
                if id.is_empty() { "-" } else { id },
                &what,
                status,
                usage,
                started,
            );
        }
        if !keep {
            break;
        }
    }
    // The slot is free before the client can see the close, so a client that
    // reads an answer to its end and connects again is never refused for it.
    drop(slot);
    let _ = stream.shutdown(Shutdown::Both);
}

/// One line per request on stderr: id, route, status, tokens, latency.
fn log(id: &str, what: &str, status: u16, usage: Option<&WireUsage>, started: Instant) {
    let tokens = usage.map_or(String::new(), |u| {
        format!(
            " prompt={} cached={} completion={}",
            u.prompt_tokens, u.prompt_tokens_details.cached_tokens, u.completion_tokens
        )
    });
    eprintln!(
        "statebench serve: {id} {what} {status}{tokens} {:.3}s",
        started.elapsed().as_secs_f64()
    );
}

fn write_json(
    mut stream: &TcpStream,
    status: u16,
    body: &str,
    keep_alive: bool,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: {}\r\n\r\n",
        reason(status),
        body.len(),
        if keep_alive { "keep-alive" } else { "close" }
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    stream.flush()
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

/// Reads the next request: the request line, the headers and a
/// `Content-Length` body. `pending` holds bytes read past the previous
/// request (a pipelining client's). None when the client closed, or went
/// quiet, between requests.
fn read_request(
    mut stream: &TcpStream,
    pending: &mut Vec<u8>,
) -> Result<Option<HttpRequest>, HttpError> {
    let mut buf = std::mem::take(pending);
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        if buf.len() > MAX_HEAD {
            return Err(HttpError::new(
                431,
                "invalid_request_error",
                format!("request line and headers over {MAX_HEAD} bytes"),
            ));
        }
        let n = match stream.read(&mut chunk) {
            Ok(n) => n,
            Err(_) if buf.is_empty() => return Ok(None),
            Err(e) => return Err(HttpError::bad(format!("could not read the request: {e}"))),
        };
        if n == 0 {
            if buf.is_empty() {
                return Ok(None);
            }
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
    let http10 = first.next() == Some("HTTP/1.0");
    let mut length: Option<usize> = None;
    let mut connection = String::new();
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
        if name == "connection" {
            connection = value.to_ascii_lowercase();
        }
        if name == "transfer-encoding" && !value.eq_ignore_ascii_case("identity") {
            return Err(HttpError::new(
                411,
                "invalid_request_error",
                "chunked request bodies are not supported; send Content-Length".into(),
            ));
        }
    }
    let length = length.unwrap_or(0);
    if length > MAX_BODY {
        return Err(HttpError::new(
            413,
            "invalid_request_error",
            format!("request body over {MAX_BODY} bytes"),
        ));
    }
    let mut body = buf.split_off(head_end + 4);
    if body.len() > length {
        *pending = body.split_off(length);
    }
    if body.len() < length {
        let start = body.len();
        body.resize(length, 0);
        stream
            .read_exact(&mut body[start..])
            .map_err(|e| HttpError::bad(format!("could not read the request body: {e}")))?;
    }
    let path = target.split('?').next().unwrap_or("");
    let keep_alive = if http10 {
        connection.contains("keep-alive")
    } else {
        !connection.contains("close")
    };
    Ok(Some(HttpRequest {
        method: method.to_string(),
        path: path.trim_end_matches('/').to_string(),
        body,
        keep_alive,
    }))
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

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The routes, for the start line and a 404.
pub const ROUTES: &str = "POST /v1/chat/completions, POST /v1/completions, POST /v1/embeddings, POST /tokenize, POST /detokenize, GET /v1/models, GET /v1/models/{id}, GET /health";

fn route(rq: &HttpRequest, s: &Shared, stream: &TcpStream) -> Result<Answered, HttpError> {
    let path = rq.path.as_str();
    let card = || ModelCard {
        id: s.name.clone(),
        object: "model".into(),
        created: 0,
        owned_by: "statebench".into(),
    };
    let model_path = path.strip_prefix("/v1/models/").map(percent_decoded);
    let model_path = model_path.as_deref();
    match (rq.method.as_str(), path) {
        ("GET", "/v1/models") => Ok(Answered::plain(json(&ModelList {
            object: "list".into(),
            data: vec![card()],
        }))),
        ("GET", _) if model_path == Some(s.name.as_str()) => Ok(Answered::plain(json(&card()))),
        ("GET", _) if model_path.is_some() => Err(HttpError {
            param: Some("model"),
            code: Some("model_not_found"),
            ..HttpError::new(
                404,
                "invalid_request_error",
                format!(
                    "The model '{}' does not exist; this server serves '{}'",
                    model_path.unwrap_or(""),
                    s.name
                ),
            )
        }),
        ("GET", "/health") => Ok(Answered::plain(r#"{"status":"ok"}"#.into())),
        ("POST", "/v1/chat/completions") => {
            let call = parse_chat(&rq.body).map_err(|e| HttpError::wire(&e))?;
            chat(call, s, stream)
        }
        ("POST", "/v1/completions") => {
            let req: CompletionRequest = serde_json::from_slice(&rq.body)
                .map_err(|e| HttpError::wire(&WireError::json(e)))?;
            let call = req.into_call().map_err(|e| HttpError::wire(&e))?;
            complete(call, s, stream)
        }
        ("POST", "/tokenize") => {
            let req: crate::wire::TokenizeRequest = serde_json::from_slice(&rq.body)
                .map_err(|e| HttpError::wire(&WireError::json(e)))?;
            let strs = req.return_token_strs;
            let req = req.into_request().map_err(|e| HttpError::wire(&e))?;
            let prompter = s
                .client
                .prompter()
                .ok_or_else(|| HttpError::bad("this backend has no tokenizer"))?;
            let field = if req.prompt_text.is_some() {
                "prompt"
            } else {
                "messages"
            };
            let tokens = prompter
                .tokens(&req)
                .map_err(|e| backend_error(&e, field))?;
            Ok(Answered::plain(json(&crate::wire::TokenizeResponse {
                count: tokens.len(),
                max_model_len: prompter.context().unwrap_or(0),
                token_strs: strs.then(|| prompter.token_strs(&tokens)),
                tokens,
            })))
        }
        ("POST", "/detokenize") => {
            let req: crate::wire::DetokenizeRequest = serde_json::from_slice(&rq.body)
                .map_err(|e| HttpError::wire(&WireError::json(e)))?;
            let prompter = s
                .client
                .prompter()
                .ok_or_else(|| HttpError::bad("this backend has no tokenizer"))?;
            let prompt = prompter
                .text_with_special(&req.tokens)
                .map_err(|e| backend_error(&e, "tokens"))?;
            Ok(Answered::plain(json(&crate::wire::DetokenizeResponse {
                prompt,
            })))
        }
        ("POST", "/v1/embeddings") => {
            let req: EmbeddingRequest = serde_json::from_slice(&rq.body)
                .map_err(|e| HttpError::wire(&WireError::json(e)))?;
            let (texts, base64) = req.into_texts().map_err(|e| HttpError::wire(&e))?;
            let e = match s.client.embed_unless(texts, &|| client_gone(stream)) {
                Ok(e) => e,
                Err(BackendError::Cancelled) => return Err(HttpError::gone()),
                Err(e) => return Err(backend_error(&e, "input")),
            };
            Ok(Answered {
                id: "embd".into(),
                usage: Some(WireUsage {
                    prompt_tokens: e.prompt_tokens as u64,
                    total_tokens: e.prompt_tokens as u64,
                    ..WireUsage::default()
                }),
                body: Some(json(&EmbeddingResponse::from_embeddings(
                    &e, &s.name, base64,
                ))),
            })
        }
        (
            _,
            "/v1/models"
            | "/v1/chat/completions"
            | "/v1/completions"
            | "/v1/embeddings"
            | "/tokenize"
            | "/detokenize"
            | "/health",
        ) => Err(HttpError::new(
            405,
            "invalid_request_error",
            format!("method {} not allowed on {path}", rq.method),
        )),
        _ if model_path.is_some() => Err(HttpError::new(
            405,
            "invalid_request_error",
            format!("method {} not allowed on {path}", rq.method),
        )),
        _ => Err(HttpError::new(
            404,
            "not_found_error",
            format!("no route {path} (this server has {ROUTES})"),
        )),
    }
}

/// A path segment with its `%XX` escapes decoded (a model id may hold
/// spaces or slashes); a malformed escape stays as written.
fn percent_decoded(segment: &str) -> String {
    let b = segment.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, ..) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The seed a request samples from: its own, or a fresh one.
fn seed_of(given: bool, seed: u64, s: &Shared) -> u64 {
    if given {
        seed
    } else {
        s.fresh()
    }
}

/// `POST /v1/chat/completions`.
fn chat(call: ChatCall, s: &Shared, stream: &TcpStream) -> Result<Answered, HttpError> {
    let ChatCall {
        req,
        n,
        stream: streaming,
        seeded,
    } = call;
    let seed = seed_of(seeded, req.seed, s);
    let reqs: Vec<ChatRequest> = (0..n)
        .map(|i| ChatRequest {
            seed: choice_seed(seed, i),
            ..req.clone()
        })
        .collect();
    let id = s.fresh_id("chatcmpl-");
    let created = now_secs();
    let shown_seed = Some(seed);
    let Some(options) = streaming else {
        let mut replies = run(s, reqs, stream, "messages", false, &mut |_, _| Ok(()))?;
        for r in &mut replies {
            name_calls(r, s);
        }
        let reply =
            ChatCompletion::from_replies(&replies, &s.name, id.clone(), created, shown_seed);
        return Ok(Answered {
            body: Some(json(&reply)),
            usage: Some(reply.usage),
            id,
        });
    };
    let prompter = s
        .client
        .prompter()
        .cloned()
        .ok_or_else(|| HttpError::bad("this backend cannot stream"))?;
    let mut sse = Sse {
        stream,
        head: false,
        chunk: ChatChunk {
            id: id.clone(),
            object: "chat.completion.chunk".into(),
            created,
            model: s.name.clone(),
            choices: Vec::new(),
            usage: None,
            seed: shown_seed,
        },
    };
    let mut choices: Vec<Streaming> = (0..n).map(|_| Streaming::default()).collect();
    let thinks = prompter.reasons() && req.thinking;
    let calls =
        !req.tools.is_empty() && req.constraint != Some(crate::backend::Constraint::NoToolCalls);
    let result = run(s, reqs, stream, "messages", true, &mut |i, event| {
        // A request refused at its start (a schema that cannot be decoded)
        // is answered as an error, not as a stream that fails.
        if !sse.head && !matches!(event, Event::Done(Err(_))) {
            sse.open(n)?;
        }
        let c = &mut choices[i];
        match event {
            Event::Token(p) => {
                let delta = c.token(p, &*prompter, &req.stop, calls, thinks);
                if let Some((delta, logprobs)) = delta {
                    sse.send(i, delta, chat_logprobs(&logprobs), None)?;
                }
            }
            Event::Done(Ok(reply)) => {
                let mut reply = reply.clone();
                name_calls(&mut reply, s);
                let (delta, logprobs) = c.finish(&reply);
                if delta.content.is_some()
                    || delta.reasoning_content.is_some()
                    || !delta.tool_calls.is_empty()
                    || !logprobs.is_empty()
                {
                    sse.send(i, delta, chat_logprobs(&logprobs), None)?;
                }
                sse.send(
                    i,
                    Delta::default(),
                    None,
                    Some(finish_reason(&reply).into()),
                )?;
            }
            Event::Done(Err(_)) => {}
        }
        Ok(())
    });
    match result {
        Ok(replies) => {
            let usage = WireUsage::of(&replies);
            if options.include_usage {
                sse.chunk.choices.clear();
                sse.chunk.usage = Some(usage.clone());
                sse.data(&json(&sse.chunk)).map_err(|_| HttpError::gone())?;
            }
            sse.data("[DONE]").map_err(|_| HttpError::gone())?;
            Ok(Answered {
                body: None,
                id,
                usage: Some(usage),
            })
        }
        Err(e) if sse.head && e.status != 499 => {
            // The status line is out; the error goes down the stream.
            let _ = sse.data(&e.body());
            Ok(Answered {
                body: None,
                id,
                usage: None,
            })
        }
        Err(e) => Err(e),
    }
}

/// `POST /v1/completions`.
fn complete(
    call: crate::wire::CompletionCall,
    s: &Shared,
    stream: &TcpStream,
) -> Result<Answered, HttpError> {
    let seed = seed_of(call.seeded, call.reqs[0].seed, s);
    let mut reqs = Vec::new();
    for r in &call.reqs {
        for i in 0..call.n {
            reqs.push(ChatRequest {
                seed: choice_seed(seed, i),
                ..r.clone()
            });
        }
    }
    let id = s.fresh_id("cmpl-");
    let created = now_secs();
    if let Some(options) = &call.stream {
        return complete_streaming(&call, reqs, options, s, stream, (id, created, seed));
    }
    let replies = run(s, reqs.clone(), stream, "prompt", false, &mut |_, _| Ok(()))?;
    let choices = replies
        .iter()
        .zip(&reqs)
        .enumerate()
        .map(|(i, (reply, req))| {
            let echo = call.echo.then(|| echo_text(req, &reply.prompt, s));
            CompletionChoice::new(i, reply, echo.as_deref())
        })
        .collect();
    let usage = completion_usage(&replies, call.n);
    let body = Completion {
        id: id.clone(),
        object: "text_completion".into(),
        created,
        model: s.name.clone(),
        choices,
        usage: usage.clone(),
        seed: Some(seed),
    };
    Ok(Answered {
        body: Some(json(&body)),
        id,
        usage: Some(usage),
    })
}

/// The usage of a completions call: each prompt counted once, not once
/// per choice.
fn completion_usage(replies: &[ChatReply], n: usize) -> WireUsage {
    let mut usage = WireUsage::of(replies);
    usage.prompt_tokens = replies
        .iter()
        .step_by(n.max(1))
        .map(|r| r.usage.prompt_tokens as u64)
        .sum();
    usage.total_tokens = usage.prompt_tokens + usage.completion_tokens;
    usage
}

/// The prompt as `echo` writes it: the text as sent, or a prompt of token
/// ids as its tokens' text (their bytes, when the reply scored them).
fn echo_text(req: &ChatRequest, scored: &[crate::backend::PromptToken], s: &Shared) -> String {
    if let Some(text) = &req.prompt_text {
        return text.clone();
    }
    if !scored.is_empty() {
        let bytes: Vec<u8> = scored.iter().flat_map(|t| t.bytes.clone()).collect();
        return String::from_utf8_lossy(&bytes).into_owned();
    }
    let ids = req.prompt_ids.as_deref().unwrap_or(&[]);
    s.client
        .prompter()
        .and_then(|p| p.text(ids).ok())
        .unwrap_or_default()
}

/// `POST /v1/completions` with `stream: true`: a `text_completion` chunk
/// per settled piece of text, then one with the finish reason, per choice.
fn complete_streaming(
    call: &crate::wire::CompletionCall,
    reqs: Vec<ChatRequest>,
    options: &crate::wire::StreamOptions,
    s: &Shared,
    stream: &TcpStream,
    (id, created, seed): (String, u64, u64),
) -> Result<Answered, HttpError> {
    let prompter = s
        .client
        .prompter()
        .cloned()
        .ok_or_else(|| HttpError::bad("this backend cannot stream"))?;
    let chunk = |index: usize, text: String, logprobs, finish_reason| CompletionChunk {
        id: id.clone(),
        object: "text_completion".into(),
        created,
        model: s.name.clone(),
        choices: vec![CompletionChoice {
            text,
            index: index as u32,
            logprobs,
            finish_reason,
        }],
        usage: None,
        seed: Some(seed),
    };
    let n = reqs.len();
    let mut head = false;
    let mut choices: Vec<Streaming> = (0..n).map(|_| Streaming::default()).collect();
    // Each choice's character count so far: its tokens' text offsets.
    let mut offsets: Vec<usize> = vec![0; n];
    let stops: Vec<Vec<String>> = reqs.iter().map(|r| r.stop.clone()).collect();
    let echoes: Vec<Option<String>> = reqs
        .iter()
        .map(|r| call.echo.then(|| echo_text(r, &[], s)))
        .collect();
    let result = run(s, reqs, stream, "prompt", true, &mut |i, event| {
        if !head && !matches!(event, Event::Done(Err(_))) {
            sse_head(stream)?;
            head = true;
            for (j, echo) in echoes.iter().enumerate() {
                if let Some(text) = echo {
                    offsets[j] = text.chars().count();
                    sse_data(stream, &json(&chunk(j, text.clone(), None, None)))?;
                }
            }
        }
        let c = &mut choices[i];
        let (text, logprobs, finish) = match event {
            Event::Token(p) => match c.token(p, &*prompter, &stops[i], false, false) {
                Some((delta, lp)) => (delta.content.unwrap_or_default(), lp, None),
                None => return Ok(()),
            },
            Event::Done(Ok(reply)) => {
                let (delta, lp) = c.finish(reply);
                let finish = Some(finish_reason(reply).to_string());
                (delta.content.unwrap_or_default(), lp, finish)
            }
            Event::Done(Err(_)) => return Ok(()),
        };
        let logprobs = (!logprobs.is_empty())
            .then(|| crate::wire::CompletionLogprobs::of_tokens(&logprobs, offsets[i]));
        offsets[i] += text.chars().count();
        sse_data(stream, &json(&chunk(i, text, logprobs, finish)))
    });
    match result {
        Ok(replies) => {
            let usage = completion_usage(&replies, call.n);
            if options.include_usage {
                let mut last = chunk(0, String::new(), None, None);
                last.choices.clear();
                last.usage = Some(usage.clone());
                sse_data(stream, &json(&last)).map_err(|_| HttpError::gone())?;
            }
            sse_data(stream, "[DONE]").map_err(|_| HttpError::gone())?;
            Ok(Answered {
                body: None,
                id,
                usage: Some(usage),
            })
        }
        Err(e) if head && e.status != 499 => {
            // The status line is out; the error goes down the stream.
            let _ = sse_data(stream, &e.body());
            Ok(Answered {
                body: None,
                id,
                usage: None,
            })
        }
        Err(e) => Err(e),
    }
}

/// How often a running request asks whether its client is still there.
const CLIENT_CHECK: Duration = Duration::from_millis(50);

/// Tool-call ids unique across the server's replies (the engine numbers a
/// reply's calls from `call_0`).
fn name_calls(reply: &mut ChatReply, s: &Shared) {
    for c in &mut reply.tool_calls {
        c.id = s.fresh_id("call_");
    }
}

/// Runs requests together, one session each (dropping them cancels the
/// rest), handing every event to `on` as it arrives; the replies in
/// request order, their sessions back in the pool. Given up when the
/// client hangs up or `on` fails.
fn run(
    s: &Shared,
    reqs: Vec<ChatRequest>,
    stream: &TcpStream,
    prompt_field: &'static str,
    streams: bool,
    on: &mut dyn FnMut(usize, &Event) -> std::io::Result<()>,
) -> Result<Vec<ChatReply>, HttpError> {
    let n = reqs.len();
    let (tx, rx) = mpsc::channel();
    let mut sessions = Vec::with_capacity(n);
    for (i, req) in reqs.into_iter().enumerate() {
        let prompt = match s.client.prompter() {
            Some(p) => Some(
                p.tokens(&req)
                    .map_err(|e| backend_error(&e, prompt_field))?,
            ),
            None => None,
        };
        let session = match prompt.as_deref().and_then(|p| s.pool.take(p)) {
            Some(session) => session,
            None => s
                .client
                .open()
                .map_err(|e| backend_error(&e, prompt_field))?,
        };
        session
            .start(req, prompt.clone(), streams, i, &tx)
            .map_err(|e| backend_error(&e, prompt_field))?;
        sessions.push((prompt, session));
    }
    drop(tx);
    let mut replies: Vec<Option<ChatReply>> = vec![None; n];
    let mut left = n;
    let mut asked = Instant::now();
    while left > 0 {
        // Tokens may arrive faster than the wait below: the client is asked
        // after it by the clock.
        if asked.elapsed() >= CLIENT_CHECK {
            if client_gone(stream) {
                return Err(HttpError::gone());
            }
            asked = Instant::now();
        }
        match rx.recv_timeout(CLIENT_CHECK) {
            Ok((i, event)) => {
                on(i, &event).map_err(|_| HttpError::gone())?;
                match event {
                    Event::Token(_) => {}
                    Event::Done(Ok(r)) => {
                        replies[i] = Some(r);
                        left -= 1;
                    }
                    Event::Done(Err(BackendError::Cancelled)) => return Err(HttpError::gone()),
                    Event::Done(Err(e)) => return Err(backend_error(&e, prompt_field)),
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(HttpError::new(
                    500,
                    "server_error",
                    "the engine thread has stopped".into(),
                ))
            }
        }
    }
    for (prompt, session) in sessions {
        if let Some(prompt) = prompt {
            s.pool.put(prompt, session);
        }
    }
    Ok(replies.into_iter().flatten().collect())
}

/// One server-sent event.
fn sse_data(mut w: &TcpStream, data: &str) -> std::io::Result<()> {
    w.write_all(format!("data: {data}\n\n").as_bytes())?;
    w.flush()
}

/// The status line of an event stream.
fn sse_head(mut w: &TcpStream) -> std::io::Result<()> {
    w.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n",
    )
}

/// Server-sent events of one streamed reply.
struct Sse<'a> {
    stream: &'a TcpStream,
    /// Whether the status line and the first chunks are out.
    head: bool,
    /// The chunk each event fills in.
    chunk: ChatChunk,
}

impl Sse<'_> {
    fn data(&mut self, data: &str) -> std::io::Result<()> {
        sse_data(self.stream, data)
    }

    /// The status line and each choice's opening chunk (its role).
    fn open(&mut self, n: usize) -> std::io::Result<()> {
        sse_head(self.stream)?;
        self.head = true;
        for i in 0..n {
            let delta = Delta {
                role: Some("assistant".into()),
                content: Some(String::new()),
                ..Delta::default()
            };
            self.send(i, delta, None, None)?;
        }
        Ok(())
    }

    fn send(
        &mut self,
        index: usize,
        delta: Delta,
        logprobs: Option<ChoiceLogprobs>,
        finish_reason: Option<String>,
    ) -> std::io::Result<()> {
        self.chunk.choices = vec![ChunkChoice {
            index: index as u32,
            delta,
            logprobs,
            finish_reason,
        }];
        let text = json(&self.chunk);
        self.data(&text)
    }
}

/// One streamed choice: its tokens so far and what of them was sent.
#[derive(Default)]
struct Streaming {
    ids: Vec<u32>,
    /// Content sent.
    sent: String,
    reasoning_sent: bool,
    /// Log-probabilities received and not yet sent.
    logprobs: Vec<TokenLogprob>,
    logprobs_sent: usize,
}

impl Streaming {
    /// Takes a token; the delta to send when more text is settled.
    fn token(
        &mut self,
        p: &Progress,
        prompter: &dyn crate::backend::Prompt,
        stop: &[String],
        calls: bool,
        thinks: bool,
    ) -> Option<(Delta, Vec<TokenLogprob>)> {
        self.ids.push(p.token);
        self.logprobs.extend(p.logprob.clone());
        let text = prompter.text(&self.ids).ok()?;
        let (reasoning, content) = settled(&text, stop, calls, thinks);
        let mut delta = Delta::default();
        if let (Some(r), false) = (reasoning, self.reasoning_sent) {
            delta.reasoning_content = Some(r.to_string());
            self.reasoning_sent = true;
        }
        if content.len() > self.sent.len() && content.starts_with(self.sent.as_str()) {
            delta.content = Some(content[self.sent.len()..].to_string());
            self.sent = content.to_string();
        }
        if delta.content.is_none() && delta.reasoning_content.is_none() {
            return None;
        }
        let logprobs = self.take_logprobs(None);
        Some((delta, logprobs))
    }

    /// The rest of the reply once it is done: content not yet sent, the
    /// reasoning if it was not, the tool calls.
    fn finish(&mut self, reply: &ChatReply) -> (Delta, Vec<TokenLogprob>) {
        let rest = reply
            .content
            .strip_prefix(self.sent.as_str())
            .or_else(|| reply.content.trim_start().strip_prefix(self.sent.as_str()))
            .unwrap_or("");
        let delta = Delta {
            content: (!rest.is_empty()).then(|| rest.to_string()),
            reasoning_content: reply.reasoning.clone().filter(|_| !self.reasoning_sent),
            tool_calls: ToolCallDelta::from_calls(&reply.tool_calls),
            role: None,
        };
        // The reply's own list leaves out the stop token's.
        let logprobs = self.take_logprobs(Some(&reply.logprobs));
        (delta, logprobs)
    }

    fn take_logprobs(&mut self, all: Option<&[TokenLogprob]>) -> Vec<TokenLogprob> {
        let list = match all {
            Some(all) => all.get(self.logprobs_sent..).unwrap_or(&[]).to_vec(),
            None => std::mem::take(&mut self.logprobs),
        };
        self.logprobs.clear();
        self.logprobs_sent += list.len();
        list
    }
}

/// A chat chunk's log-probabilities, none for an empty list.
fn chat_logprobs(list: &[TokenLogprob]) -> Option<ChoiceLogprobs> {
    (!list.is_empty()).then(|| ChoiceLogprobs::from_tokens(list))
}

/// The reasoning and the content of a reply so far that no later token can
/// change: held back are an unfinished character, anything that may begin
/// a stop string or a tool call, trailing whitespace (the reply's end
/// trims it), and, while a thinking block is open, everything.
fn settled<'a>(
    text: &'a str,
    stop: &[String],
    calls: bool,
    thinks: bool,
) -> (Option<&'a str>, &'a str) {
    let (reasoning, mut text) = match text.find("</think>") {
        Some(end) => {
            let head = text[..end].trim_start();
            let head = head.strip_prefix("<think>").unwrap_or(head).trim();
            (Some(head), text[end + "</think>".len()..].trim_start())
        }
        None if thinks => return (None, ""),
        None => (None, text),
    };
    let mut end = text.len();
    while text[..end].ends_with('\u{FFFD}') {
        end -= '\u{FFFD}'.len_utf8();
    }
    let mut markers: Vec<&str> = stop
        .iter()
        .map(String::as_str)
        .filter(|s| !s.is_empty())
        .collect();
    if calls {
        markers.push("<tool_call>");
        text = text.trim_start();
        end = end.min(text.len());
        // A line that opens a bare call object, or a fence around one.
        let mut at = 0;
        for line in text[..end].split_inclusive('\n') {
            let t = line.trim_start();
            if t.starts_with('{')
                || t.starts_with("```")
                || (!line.ends_with('\n') && "```".starts_with(t) && !t.is_empty())
            {
                end = at;
                break;
            }
            at += line.len();
        }
    }
    for m in markers {
        match text[..end].find(m) {
            Some(i) => end = i,
            None => {
                // A suffix that may grow into the marker.
                for k in (1..m.len()).rev() {
                    if m.is_char_boundary(k) && text[..end].ends_with(&m[..k]) {
                        end -= k;
                        break;
                    }
                }
            }
        }
    }
    (reasoning, text[..end].trim_end())
}

/// A backend error as the API answers it.
fn backend_error(e: &BackendError, prompt_field: &'static str) -> HttpError {
    let msg = crate::one_line(e);
    match e {
        BackendError::ContextOverflow { .. } => HttpError {
            param: Some(prompt_field),
            code: Some("context_length_exceeded"),
            ..HttpError::bad(msg)
        },
        BackendError::ExceedsKvBudget { .. } => HttpError {
            param: Some("max_tokens"),
            ..HttpError::bad(msg)
        },
        BackendError::Constraint { field, .. } | BackendError::BadField { field, .. } => {
            HttpError {
                param: Some(field),
                ..HttpError::bad(msg)
            }
        }
        BackendError::BadRequest(_) | BackendError::Template(_) | BackendError::Tokenizer(_) => {
            HttpError::bad(msg)
        }
        _ => HttpError::new(500, "server_error", msg),
    }
}

/// Parses a `/v1/chat/completions` body.
pub fn parse_chat(body: &[u8]) -> Result<ChatCall, WireError> {
    let req: ChatCompletionRequest = serde_json::from_slice(body).map_err(WireError::json)?;
    req.into_call()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::DEFAULT_MAX_TOKENS;

    #[test]
    fn the_pool_gives_a_conversation_its_own_session_and_an_old_one_to_a_new_one() {
        let pool = SessionPool::new();
        let system = [1, 2, 3, 4];
        pool.put([&system[..], &[10, 11]].concat(), "ended");
        pool.put([&system[..], &[20, 21]].concat(), "active");
        pool.put([&system[..], &[20]].concat(), "shorter");
        pool.put(vec![9, 9, 9, 9, 9, 9, 9, 9, 9], "unrelated");
        // The next turn takes the session whose whole prompt it extends furthest.
        assert_eq!(pool.take(&[1, 2, 3, 4, 20, 21, 30, 31]), Some("active"));
        // A new conversation sharing the system prompt takes the least
        // recently used session that shares half of what it read.
        assert_eq!(pool.take(&[1, 2, 3, 4, 40]), Some("ended"));
        assert_eq!(pool.take(&[1, 2, 3, 4, 50]), Some("shorter"));
        // Less than half shared: no session.
        assert_eq!(pool.take(&[9, 9, 9, 9, 1]), None);
        assert_eq!(pool.take(&[5]), None);
        for i in 0..IDLE_SESSIONS as u32 + 1 {
            pool.put(vec![100 + i], "filler");
        }
        assert_eq!(pool.idle.lock().unwrap().len(), IDLE_SESSIONS);
        assert_eq!(
            pool.take(&[9, 9, 9, 9, 9, 9, 9, 9, 9]),
            None,
            "closed past the cap"
        );
    }

    #[test]
    fn chat_bodies_parse_with_openai_defaults() {
        let c = parse_chat(
            br#"{"model":"x","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}"#,
        )
        .unwrap();
        assert!((c.n, c.stream.is_none(), c.seeded) == (1, true, false));
        let r = c.req;
        assert_eq!(r.messages.len(), 2);
        assert_eq!(r.messages[1].content, "ab");
        assert_eq!(r.max_tokens, DEFAULT_MAX_TOKENS);
        assert_eq!(r.temperature, 1.0);
        assert!(r.thinking);
        let r = parse_chat(
            br#"{"messages":[{"role":"user","content":"q"}],"max_tokens":5,"temperature":0,"seed":9,"stop":"\n","chat_template_kwargs":{"enable_thinking":false}}"#,
        )
        .unwrap()
        .req;
        assert_eq!((r.max_tokens, r.temperature, r.seed), (5, 0.0, 9));
        assert_eq!(r.stop, vec!["\n".to_string()]);
        assert!(!r.thinking);
        let r = parse_chat(
            br##"{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":null,"tool_calls":[{"id":"c7","type":"function","function":{"name":"f","arguments":"{\"work_order\": \"#W1\"}"}}]},{"role":"tool","tool_call_id":"c7","content":"ok"}],"tools":[{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object"}}}],"tool_choice":"auto"}"##,
        )
        .unwrap()
        .req;
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
                br#"{"messages":[{"role":"user","content":"q"}],"top_logprobs":3}"#,
                "top_logprobs needs logprobs: true",
            ),
            (
                br#"{"messages":[{"role":"user","content":"q"}],"logprobs":true,"top_logprobs":21}"#,
                "top_logprobs must be from 0 to 20",
            ),
            (
                br#"{"messages":[{"role":"user","content":"q"}],"tool_choice":"required"}"#,
                "no tools are offered",
            ),
            (
                br#"{"messages":[{"role":"user","content":"q"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}}"#,
                "'g', which tools does not offer",
            ),
            (
                br#"{"messages":[{"role":"user","content":"q"}],"response_format":{"type":"xml"}}"#,
                "response_format type must be",
            ),
            (
                br#"{"messages":[{"role":"user","content":"q"}],"response_format":{"type":"json_schema","json_schema":{"name":"x"}}}"#,
                "needs json_schema.schema",
            ),
            (br#"{"messages":[]}"#, "messages is empty"),
            (
                br#"{"messages":[{"role":"function","content":"q"}]}"#,
                "'function' is not supported",
            ),
            (
                br#"{"messages":[{"role":"user","content":"q"}],"n":9}"#,
                "n must be from 1 to 8",
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
            let line = crate::one_line(&e);
            assert!(line.contains(needle), "{line}");
            assert!(!line.contains('\n'), "{line}");
            // Each names its field, as OpenAI's `param` does.
            assert!(e.param().is_some() || needle.contains("JSON"), "{line}");
        }
    }

    #[test]
    fn constraints_come_from_tool_choice_and_response_format() {
        use crate::backend::Constraint;
        let tools = r#""tools":[{"type":"function","function":{"name":"f"}}]"#;
        let c = |extra: &str| {
            parse_chat(
                format!(r#"{{"messages":[{{"role":"user","content":"q"}}],{extra}}}"#).as_bytes(),
            )
            .unwrap()
            .req
        };
        assert_eq!(
            c(&format!(r#"{tools},"tool_choice":"none""#)).constraint,
            Some(Constraint::NoToolCalls)
        );
        assert_eq!(
            c(&format!(r#"{tools},"tool_choice":"auto""#)).constraint,
            None
        );
        assert_eq!(
            c(&format!(r#"{tools},"tool_choice":"required""#)).constraint,
            Some(Constraint::ToolCalls(None))
        );
        let named = c(&format!(
            r#"{tools},"tool_choice":{{"type":"function","function":{{"name":"f"}}}}"#
        ));
        assert_eq!(
            named.constraint,
            Some(Constraint::ToolCalls(Some("f".into())))
        );
        // A constrained reply is the whole reply: thinking is off.
        assert!(!named.thinking);
        let j = c(r#""response_format":{"type":"json_object"}"#);
        assert_eq!(j.constraint, Some(Constraint::JsonObject));
        let s = c(
            r#""response_format":{"type":"json_schema","json_schema":{"name":"p","schema":{"type":"object"}}}"#,
        );
        assert_eq!(
            s.constraint,
            Some(Constraint::JsonSchema(serde_json::json!({"type":"object"})))
        );
        assert_eq!(c(r#""logprobs":true,"top_logprobs":4"#).logprobs, Some(4));
        assert_eq!(c(r#""logprobs":true"#).logprobs, Some(0));
        assert!(c(r#""response_format":{"type":"text"}"#)
            .constraint
            .is_none());
    }

    #[test]
    fn stream_settles_only_what_no_later_token_changes() {
        let stop = vec!["END".to_string()];
        assert_eq!(settled("Hello wor", &[], false, false), (None, "Hello wor"));
        // Trailing whitespace, a half character and a stop string's start wait.
        assert_eq!(settled("Hello \u{FFFD}", &[], false, false).1, "Hello");
        assert_eq!(settled("one EN", &stop, false, false).1, "one");
        assert_eq!(settled("one END two", &stop, false, false).1, "one");
        // A tool call's opening, tagged or bare, waits for the reply's end.
        assert_eq!(settled("Sure.\n<tool_", &[], true, false).1, "Sure.");
        assert_eq!(settled("Sure.\n{\"name\"", &[], true, false).1, "Sure.");
        assert_eq!(settled("Sure.\n``", &[], true, false).1, "Sure.");
        // An open thinking block holds everything; once closed it is reasoning.
        assert_eq!(settled("<think>\nhm", &[], false, true), (None, ""));
        assert_eq!(
            settled("<think>\nhm\n</think>\n\nParis", &[], false, true),
            (Some("hm"), "Paris")
        );
    }

    #[test]
    fn model_paths_are_percent_decoded() {
        assert_eq!(
            percent_decoded("Qwen2.5%20Coder%2F0.5B"),
            "Qwen2.5 Coder/0.5B"
        );
        assert_eq!(percent_decoded("a%2"), "a%2");
    }
}
