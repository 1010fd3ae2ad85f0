//! A backend shared by many threads: one thread owns it and batches every
//! request the callers have in flight into the same forward steps.
//!
//! Episode runners stay plain sequential code (send a request, wait for the
//! reply); the batching happens here, where requests from all live episodes
//! meet the scheduler between decode steps.

use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::thread::JoinHandle;

use super::{Backend, BackendError, ChatReply, ChatRequest, ModelIdentity, RequestId, SessionId};

type ReplyTx = Sender<Result<ChatReply, BackendError>>;

enum Cmd {
    Open(Sender<SessionId>),
    Close(SessionId),
    Chat(SessionId, ChatRequest, ReplyTx),
}

/// The thread that owns a backend.
pub struct SharedBackend {
    tx: Option<Sender<Cmd>>,
    join: Option<JoinHandle<()>>,
    model: ModelIdentity,
}

/// A cloneable handle for submitting work to a [`SharedBackend`].
#[derive(Clone)]
pub struct Client {
    tx: Sender<Cmd>,
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
        })
    }

    /// A handle for callers.
    pub fn client(&self) -> Client {
        Client {
            tx: self.tx.clone().expect("the sender lives until drop"),
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

impl Client {
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
        let (tx, rx) = mpsc::channel();
        self.client
            .tx
            .send(Cmd::Chat(self.id, req, tx))
            .map_err(|_| gone())?;
        rx.recv().map_err(|_| gone())?
    }
}

impl Drop for Conversation {
    fn drop(&mut self) {
        let _ = self.client.tx.send(Cmd::Close(self.id));
    }
}

fn serve(mut backend: Box<dyn Backend + Send>, rx: Receiver<Cmd>) {
    let mut waiting: HashMap<RequestId, ReplyTx> = HashMap::new();
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
                    for (id, r) in done {
                        if let Some(tx) = waiting.remove(&id) {
                            let _ = tx.send(r);
                        }
                    }
                }
                Err(e) => {
                    let msg = crate::one_line(&e);
                    for (_, tx) in waiting.drain() {
                        let _ = tx.send(Err(BackendError::BadRequest(format!(
                            "engine step failed: {msg}"
                        ))));
                    }
                }
            }
        }
    }
}

fn handle(backend: &mut dyn Backend, waiting: &mut HashMap<RequestId, ReplyTx>, cmd: Cmd) {
    match cmd {
        Cmd::Open(tx) => {
            let _ = tx.send(backend.open_session());
        }
        Cmd::Close(s) => backend.close_session(s),
        Cmd::Chat(s, req, tx) => match backend.submit(s, req) {
            Ok(id) => {
                waiting.insert(id, tx);
            }
            Err(e) => {
                let _ = tx.send(Err(e));
            }
        },
    }
}
