//! A backend shared by many threads: one thread owns it and batches every
//! request the callers have in flight into the same forward steps.
//!
//! Episode runners stay plain sequential code (send a request, wait for the
//! reply); the batching happens here, where requests from all live episodes
//! meet the scheduler between decode steps. Rendering and tokenizing a
//! request happen on the caller's thread (the backend's [`Prompt`]), so a
//! huge prompt never holds the thread that runs the model.

use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::{
    Backend, BackendError, ChatReply, ChatRequest, Embeddings, ModelIdentity, Progress, Prompt,
    RequestId, SessionId,
};

/// What a submitted request sends back: its tokens as they come (when it
/// streams), then its reply.
pub enum Event {
    Token(Progress),
    Done(Result<ChatReply, BackendError>),
}

/// Where a request's events go, each tagged with the caller's number for
/// it (several requests may share one channel).
pub type Events = Sender<(usize, Event)>;

/// A submitted request's caller.
struct Caller {
    session: SessionId,
    events: Events,
    tag: usize,
    stream: bool,
}

enum Cmd {
    Open(Sender<SessionId>),
    Pending(Sender<usize>),
    Close(SessionId),
    /// A request, with its prompt tokens when the caller made them.
    Chat(SessionId, Box<ChatRequest>, Option<Vec<u32>>, Caller),
    /// Texts to embed, with their tokens when the caller made them; run
    /// between two steps.
    Embed(
        Vec<String>,
        Option<Vec<Vec<u32>>>,
        Sender<Result<Embeddings, BackendError>>,
    ),
}

/// The thread that owns a backend.
pub struct SharedBackend {
    tx: Option<Sender<Cmd>>,
    join: Option<JoinHandle<()>>,
    model: ModelIdentity,
    prompter: Option<Arc<dyn Prompt>>,
}

/// A cloneable handle for submitting work to a [`SharedBackend`].
#[derive(Clone)]
pub struct Client {
    tx: Sender<Cmd>,
    prompter: Option<Arc<dyn Prompt>>,
}

/// One conversation on a shared backend; closed when dropped.
pub struct Conversation {
    client: Client,
    id: SessionId,
}

fn gone() -> BackendError {
    BackendError::BadRequest("the engine thread has stopped".into())
}

impl SharedBackend {
    /// Starts the owning thread.
    pub fn spawn(backend: Box<dyn Backend + Send>) -> Result<SharedBackend, BackendError> {
        let model = backend.model_id()?;
        let prompter = backend.prompter();
        let (tx, rx) = mpsc::channel();
        let join = std::thread::Builder::new()
            .name("statebench-engine".into())
            .spawn(move || serve(backend, rx))
            .map_err(|source| BackendError::Io {
                path: "statebench-engine thread".into(),
                source,
            })?;
        Ok(SharedBackend {
            tx: Some(tx),
            join: Some(join),
            model,
            prompter,
        })
    }

    /// A handle for callers.
    pub fn client(&self) -> Client {
        Client {
            tx: self.tx.clone().expect("the sender lives until drop"),
            prompter: self.prompter.clone(),
        }
    }

    /// The served model.
    pub fn model_id(&self) -> &ModelIdentity {
        &self.model
    }
}

impl Drop for SharedBackend {
    fn drop(&mut self) {
        // Closing our sender lets the thread exit once every client is gone.
        self.tx.take();
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }
}

/// Tokens embedded in one go on the engine thread (or one text, when it is
/// longer): a waiting decode step is delayed by about one prefill chunk's
/// work, not by a whole request of thousands of inputs.
pub const EMBED_CHUNK_TOKENS: usize = 1024;

/// Texts embedded in one go when their tokens are not known here (a
/// backend that tokenizes on its own thread).
const EMBED_CHUNK_TEXTS: usize = 8;

impl Client {
    /// Requests submitted and not yet answered (queued or running).
    pub fn pending(&self) -> Result<usize, BackendError> {
        let (tx, rx) = mpsc::channel();
        self.tx.send(Cmd::Pending(tx)).map_err(|_| gone())?;
        rx.recv().map_err(|_| gone())
    }

    /// Embeds texts (see [`Backend::embed`]); tokenized on this thread.
    pub fn embed(&self, texts: Vec<String>) -> Result<Embeddings, BackendError> {
        self.embed_unless(texts, &|| false)
    }

    /// As [`Client::embed`], about [`EMBED_CHUNK_TOKENS`] at a time: the
    /// engine thread embeds synchronously, so between chunks it runs the
    /// decode steps waiting beside them, and `cancelled` (the caller gone)
    /// is asked before each chunk ([`BackendError::Cancelled`]). Each
    /// text's vector does not depend on the texts embedded with it.
    pub fn embed_unless(
        &self,
        texts: Vec<String>,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<Embeddings, BackendError> {
        let mut out = Embeddings {
            vectors: Vec::with_capacity(texts.len()),
            prompt_tokens: 0,
        };
        let tokens: Option<Vec<Vec<u32>>> = match &self.prompter {
            Some(p) => Some(
                texts
                    .iter()
                    .map(|t| p.embedding_tokens(t))
                    .collect::<Result<_, _>>()?,
            ),
            None => None,
        };
        let mut start = 0;
        while start < texts.len() {
            if cancelled() {
                return Err(BackendError::Cancelled);
            }
            let end = match &tokens {
                Some(t) => {
                    let mut end = start + 1;
                    let mut sum = t[start].len();
                    while end < t.len() && sum + t[end].len() <= EMBED_CHUNK_TOKENS {
                        sum += t[end].len();
                        end += 1;
                    }
                    end
                }
                None => (start + EMBED_CHUNK_TEXTS).min(texts.len()),
            };
            let chunk_tokens = tokens.as_ref().map(|t| t[start..end].to_vec());
            let (tx, rx) = mpsc::channel();
            self.tx
                .send(Cmd::Embed(texts[start..end].to_vec(), chunk_tokens, tx))
                .map_err(|_| gone())?;
            start = end;
            let e = rx.recv().map_err(|_| gone())??;
            out.vectors.extend(e.vectors);
            out.prompt_tokens += e.prompt_tokens;
        }
        Ok(out)
    }

    /// What renders and tokenizes requests, for a backend that does.
    pub fn prompter(&self) -> Option<&Arc<dyn Prompt>> {
        self.prompter.as_ref()
    }

    /// Opens a conversation.
    pub fn open(&self) -> Result<Conversation, BackendError> {
        let (tx, rx) = mpsc::channel();
        self.tx.send(Cmd::Open(tx)).map_err(|_| gone())?;
        let id = rx.recv().map_err(|_| gone())?;
        Ok(Conversation {
            client: self.clone(),
            id,
        })
    }
}

impl Conversation {
    /// Sends one request on this conversation and waits for its reply.
    pub fn chat(&self, req: ChatRequest) -> Result<ChatReply, BackendError> {
        self.chat_unless(req, &|| false)
    }

    /// As [`Self::chat`], but gives up (the request is dropped from the
    /// batch) once `cancelled` says so; it is asked every 50 ms.
    pub fn chat_unless(
        &self,
        req: ChatRequest,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<ChatReply, BackendError> {
        let (tx, rx) = mpsc::channel();
        self.start(req, None, false, 0, &tx)?;
        loop {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok((_, Event::Done(r))) => return r,
                Ok((_, Event::Token(_))) => {}
                Err(RecvTimeoutError::Disconnected) => return Err(gone()),
                Err(RecvTimeoutError::Timeout) if cancelled() => {
                    let _ = self.client.tx.send(Cmd::Close(self.id));
                    return Err(BackendError::Cancelled);
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
    }

    /// Submits a request without waiting: its events arrive on `events`
    /// tagged `tag` (tokens only when `stream`). `prompt` is its tokens when
    /// the caller made them already. Dropping the conversation cancels it.
    pub fn start(
        &self,
        req: ChatRequest,
        prompt: Option<Vec<u32>>,
        stream: bool,
        tag: usize,
        events: &Events,
    ) -> Result<(), BackendError> {
        let prompt = match (prompt, &self.client.prompter) {
            (Some(p), _) => Some(p),
            (None, Some(p)) => Some(p.tokens(&req)?),
            (None, None) => None,
        };
        let caller = Caller {
            session: self.id,
            events: events.clone(),
            tag,
            stream,
        };
        self.client
            .tx
            .send(Cmd::Chat(self.id, Box::new(req), prompt, caller))
            .map_err(|_| gone())
    }
}

impl Drop for Conversation {
    fn drop(&mut self) {
        let _ = self.client.tx.send(Cmd::Close(self.id));
    }
}

/// Requests waiting for their replies.
type Waiting = HashMap<RequestId, Caller>;

fn serve(mut backend: Box<dyn Backend + Send>, rx: Receiver<Cmd>) {
    let mut waiting: Waiting = HashMap::new();
    let mut open = true;
    loop {
        // Block only when there is nothing to step.
        if !backend.has_pending() {
            if !open {
                return;
            }
            match rx.recv() {
                Ok(cmd) => handle(&mut *backend, &mut waiting, cmd),
                Err(_) => return,
            }
        }
        // Everything already submitted joins this step.
        loop {
            match rx.try_recv() {
                Ok(cmd) => handle(&mut *backend, &mut waiting, cmd),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        if backend.has_pending() {
            match backend.step() {
                Ok(done) => {
                    if waiting.values().any(|c| c.stream) {
                        for p in backend.take_progress() {
                            if let Some(c) = waiting.get(&p.id).filter(|c| c.stream) {
                                let _ = c.events.send((c.tag, Event::Token(p)));
                            }
                        }
                    }
                    for (id, r) in done {
                        if let Some(c) = waiting.remove(&id) {
                            let _ = c.events.send((c.tag, Event::Done(r)));
                        }
                    }
                }
                Err(e) => {
                    let msg = crate::one_line(&e);
                    for (_, c) in waiting.drain() {
                        let cause = format!("engine step failed: {msg}");
                        let _ = c
                            .events
                            .send((c.tag, Event::Done(Err(BackendError::BadRequest(cause)))));
                    }
                }
            }
        }
    }
}

fn handle(backend: &mut dyn Backend, waiting: &mut Waiting, cmd: Cmd) {
    match cmd {
        Cmd::Open(tx) => {
            let _ = tx.send(backend.open_session());
        }
        Cmd::Pending(tx) => {
            let _ = tx.send(waiting.len());
        }
        Cmd::Close(s) => {
            backend.close_session(s);
            // Its requests are gone from the backend; nobody waits on them.
            waiting.retain(|_, c| c.session != s);
        }
        Cmd::Embed(texts, tokens, tx) => {
            let r = match tokens {
                Some(t) => backend.embed_prepared(&texts, t),
                None => backend.embed(&texts),
            };
            let _ = tx.send(r);
        }
        Cmd::Chat(s, req, prompt, caller) => {
            let submitted = match prompt {
                Some(p) => backend.submit_prepared(s, *req, p),
                None => backend.submit(s, *req),
            };
            match submitted {
                Ok(id) => {
                    waiting.insert(id, caller);
                }
                Err(e) => {
                    let _ = caller.events.send((caller.tag, Event::Done(Err(e))));
                }
            }
        }
    }
}
