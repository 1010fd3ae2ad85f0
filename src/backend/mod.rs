//! The one interface studies call: chat requests in, replies with token
//! accounting out, many conversations driven at once through `submit`/`step`.

pub mod http_client;
pub mod shared;
pub mod tools;

pub use tools::{split_tool_calls, Tool, ToolCall};

use std::path::PathBuf;

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions that frame the conversation.
    System,
    /// The user (for statebench: the episode's operator).
    User,
    /// The model.
    Assistant,
    /// A tool's result, answering one of the model's calls.
    Tool,
}

impl Role {
    /// The role's name as chat templates spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// The calls an assistant message made (native tool calling).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// The call a `tool` message answers.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tool_call_id: String,
}

impl Message {
    /// A message with the given role and text.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: String::new(),
        }
    }

    /// An assistant message that made tool calls.
    pub fn calls(content: impl Into<String>, tool_calls: Vec<ToolCall>) -> Self {
        Self {
            tool_calls,
            ..Self::new(Role::Assistant, content)
        }
    }

    /// A tool's result for the call `id`.
    pub fn tool_result(id: &str, content: impl Into<String>) -> Self {
        Self {
            tool_call_id: id.to_string(),
            ..Self::new(Role::Tool, content)
        }
    }
}

/// A chat request: the whole conversation so far plus generation settings.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ChatRequest {
    /// Full message list; the engine renders it with the model's chat template.
    pub messages: Vec<Message>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Extra stop strings; the reply is cut before the first one found.
    pub stop: Vec<String>,
    /// Thinking mode (Qwen3 `enable_thinking`); ignored by templates without it.
    pub thinking: bool,
    /// 0 is greedy (ties to the lowest token id); above 0 samples.
    pub temperature: f32,
    /// Seed of this request's own sampler.
    pub seed: u64,
    /// Functions the model may call; with any, the reply's `<tool_call>`
    /// blocks come back as [`ChatReply::tool_calls`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<Tool>,
    /// `Some(k)`: each generated token's log-probability and the `k` most
    /// likely tokens' (k at most [`MAX_TOP_LOGPROBS`]), in [`ChatReply::logprobs`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<usize>,
    /// A shape the reply must take; tokens that leave it are masked before
    /// each choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraint: Option<Constraint>,
    /// A text prompt tokenized as it is, in place of the rendered messages
    /// (text completions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_text: Option<String>,
}

/// Most alternatives a token's log-probabilities list (OpenAI's bound).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// A shape a reply must take, enforced token by token.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Constraint {
    /// Plain text: the model may not open a tool call.
    NoToolCalls,
    /// One or more calls of the offered tools (`None`), or exactly one call
    /// of the named one, in the template's `<tool_call>` form.
    ToolCalls(Option<String>),
    /// A JSON object.
    JsonObject,
    /// A JSON value valid under this JSON Schema.
    JsonSchema(serde_json::Value),
}

/// One candidate token and its log-probability under the model's
/// distribution (the logits before temperature and before any constraint).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Candidate {
    pub id: u32,
    /// The token's bytes (a piece of a UTF-8 character for some).
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

/// A generated token's log-probability and the most likely alternatives,
/// most likely first (ties to the lower id).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TokenLogprob {
    pub chosen: Candidate,
    pub top: Vec<Candidate>,
}

/// A token a running request generated in the last step.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    pub id: RequestId,
    pub token: u32,
    /// When the request asked for log-probabilities.
    pub logprob: Option<TokenLogprob>,
}

impl ChatRequest {
    /// Rejects requests no backend can serve: no messages, a zero budget, a
    /// temperature that is negative or not a number.
    pub fn validate(&self) -> Result<(), BackendError> {
        if self.max_tokens == 0 {
            return Err(BackendError::BadRequest(
                "max_tokens must be at least 1".into(),
            ));
        }
        if self.messages.is_empty() && self.prompt_text.is_none() {
            return Err(BackendError::BadRequest("no messages".into()));
        }
        if self.logprobs.is_some_and(|k| k > MAX_TOP_LOGPROBS) {
            return Err(BackendError::BadRequest(format!(
                "at most {MAX_TOP_LOGPROBS} top log-probabilities per token"
            )));
        }
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(BackendError::BadRequest(format!(
                "temperature must be a finite number >= 0, got {}",
                self.temperature
            )));
        }
        Ok(())
    }

    /// A greedy request for the given messages and token budget.
    pub fn greedy(messages: Vec<Message>, max_tokens: usize) -> Self {
        Self {
            messages,
            max_tokens,
            stop: Vec::new(),
            thinking: false,
            temperature: 0.0,
            seed: 0,
            tools: Vec::new(),
            logprobs: None,
            constraint: None,
            prompt_text: None,
        }
    }
}

/// Token accounting of one call; sums over a turn, an episode or an arm.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Usage {
    /// Tokens of the rendered prompt.
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV entries were reused from the session's cache.
    pub cached_tokens: usize,
    /// Tokens generated (including the stop token, if one ended the reply).
    pub completion_tokens: usize,
    /// Wall time of the forward step that prefilled the uncached prompt tokens.
    pub prefill_secs: f64,
    /// Wall time of the decode steps this request took part in.
    pub decode_secs: f64,
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, o: Usage) {
        self.prompt_tokens += o.prompt_tokens;
        self.cached_tokens += o.cached_tokens;
        self.completion_tokens += o.completion_tokens;
        self.prefill_secs += o.prefill_secs;
        self.decode_secs += o.decode_secs;
    }
}

impl std::iter::Sum for Usage {
    fn sum<I: Iterator<Item = Usage>>(iter: I) -> Usage {
        iter.fold(Usage::default(), |mut a, b| {
            a += b;
            a
        })
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Finish {
    /// An end-of-turn token or a stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
}

/// A finished reply.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ChatReply {
    /// The answer, with any thinking block removed.
    pub content: String,
    /// The thinking block's text, when the model produced one.
    pub reasoning: Option<String>,
    /// Why generation ended.
    pub finish: Finish,
    /// Token accounting.
    pub usage: Usage,
    /// Generated token ids (including the stop token, if any).
    pub tokens: Vec<u32>,
    /// The tool calls the reply made (requests that offered tools).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// Per generated token (the stop token excluded), when asked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub logprobs: Vec<TokenLogprob>,
}

/// What model a backend serves, for run manifests.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ModelIdentity {
    /// Model name from the file metadata or directory.
    pub name: String,
    /// Where the weights were loaded from.
    pub source: String,
    /// sha256 of the weight file(s), hex.
    pub weights_sha256: String,
    /// Architecture (`qwen2`, `qwen3`).
    pub architecture: String,
    /// Storage format (e.g. `gguf Q4_K_M mix`, `safetensors bf16`).
    pub format: String,
    /// The engine's per-element arithmetic (`statebench_kernels::ARITHMETIC`
    /// on the CPU, the device's otherwise), or `remote` for a served model.
    #[serde(default)]
    pub arithmetic: String,
    /// The device that ran it, with its driver and compute capability;
    /// empty for the CPU.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub device: String,
}

impl ModelIdentity {
    /// A clean id for clients and tables: the weight file's name without
    /// `.gguf`, a checkpoint directory's name, the hub id as given, or a
    /// served model's own id.
    pub fn short_name(&self) -> String {
        if self.source.starts_with("http://") || self.source.starts_with("https://") {
            return self.name.clone();
        }
        let path = std::path::Path::new(&self.source);
        let name = if self.source.ends_with(".gguf") {
            path.file_stem()
        } else if path.is_dir() {
            path.file_name()
        } else {
            None
        };
        name.map_or_else(|| self.source.clone(), |n| n.to_string_lossy().into_owned())
    }
}

/// A conversation whose KV cache the backend keeps between calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u64);

/// One submitted request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

/// Everything that can go wrong, each a one-line message with a hint.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// A file the model needs is absent.
    #[error("{path}: file not found ({hint})")]
    MissingFile {
        /// The missing path.
        path: PathBuf,
        /// What to do about it.
        hint: String,
    },
    /// A weight file is truncated or not in the expected format.
    #[error("{path}: corrupt or truncated weights: {cause}")]
    CorruptWeights {
        /// The bad file.
        path: PathBuf,
        /// What was wrong.
        cause: String,
    },
    /// The files describe something this engine cannot run.
    #[error("{path}: unsupported model: {cause} (supported: qwen2 / qwen3 dense; F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)")]
    Unsupported {
        /// The file that says so.
        path: PathBuf,
        /// What is unsupported.
        cause: String,
    },
    /// The tokenizer could not be built or failed on input.
    #[error("tokenizer: {0} (check tokenizer.json or the GGUF tokenizer metadata)")]
    Tokenizer(String),
    /// The chat template could not be parsed or rendered.
    #[error("chat template: {0} (check the template shipped with the model)")]
    Template(String),
    /// The prompt plus its token budget exceed the model's context.
    #[error(
        "context overflow: {}{prompt_tokens} prompt tokens + {max_tokens} max tokens > context {context} (shorten the conversation or lower max_tokens)",
        if *.partial { "over " } else { "" }
    )]
    ContextOverflow {
        /// Tokens of the rendered prompt.
        prompt_tokens: usize,
        /// Only the prompt's beginning was tokenized: the whole holds more
        /// than `prompt_tokens`.
        partial: bool,
        /// Requested generation budget.
        max_tokens: usize,
        /// Model context length.
        context: usize,
    },
    /// The request could never fit in the KV-memory budget.
    #[error("request needs {needed_bytes} bytes of KV cache, budget is {budget_bytes} (raise the KV budget or lower max_tokens)")]
    ExceedsKvBudget {
        /// Bytes the request would need at its longest.
        needed_bytes: usize,
        /// The configured budget.
        budget_bytes: usize,
    },
    /// The session id is not open.
    #[error("unknown session {0:?} (open one with open_session)")]
    UnknownSession(SessionId),
    /// The session already has a request in flight.
    #[error("session {0:?} already has a request in flight (wait for its reply)")]
    SessionBusy(SessionId),
    /// The caller gave up on the request (its HTTP client went away).
    #[error("the request was cancelled")]
    Cancelled,
    /// A request asked for something malformed.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// A `Constraint` that cannot be compiled (a schema that is not valid
    /// JSON Schema, a tool that was not offered).
    #[error("{field}: {cause}")]
    Constraint { field: &'static str, cause: String },
    /// A remote server could not be reached or answered with an error.
    #[error("{url}: {cause}")]
    Remote {
        /// The endpoint.
        url: String,
        /// What went wrong (HTTP status and the server's message, or the connection error).
        cause: String,
    },
    /// The forward pass produced NaN or infinite values.
    #[error("the forward pass produced NaN or infinite values ({place}): the weights are likely corrupt (compare the file's sha256 with its source)")]
    NonFinite { place: String },
    /// A forward step failed; every request in it ends with this.
    #[error("{model}: {cause}")]
    StepFailed { model: String, cause: String },
    /// The compute device failed (a driver error, memory exhausted, a
    /// kernel that did not compile).
    #[error("{device}: {cause}")]
    Device { device: String, cause: String },
    /// An I/O error on a named file.
    #[error("{path}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Unit-length embeddings, one per input text, and the tokens they read.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Embeddings {
    /// One L2-normalised vector per text, in input order.
    pub vectors: Vec<Vec<f32>>,
    /// Tokens read over all texts.
    pub prompt_tokens: usize,
}

/// Scales `v` to unit length (sum of squares in f64, in order, so every
/// backend normalises the same vector to the same bits). A vector already
/// of unit length to f32 precision keeps its bits, so normalising twice (a
/// server's vectors, read back by the client) changes nothing; a zero
/// vector stays zero.
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    if norm > 0.0 && (norm - 1.0).abs() > 1e-6 {
        for x in v.iter_mut() {
            *x = (f64::from(*x) / norm) as f32;
        }
    }
}

/// Turns a request into its prompt tokens (renders and tokenizes); shared
/// with callers so that work happens on their threads.
pub trait Prompt: Send + Sync {
    fn tokens(&self, req: &ChatRequest) -> Result<Vec<u32>, BackendError>;
    /// Generated ids as the reply's text (special tokens dropped).
    fn text(&self, ids: &[u32]) -> Result<String, BackendError>;
    /// Whether the chat template has a thinking mode (replies may open
    /// with a `<think>` block).
    fn reasons(&self) -> bool {
        false
    }
    /// The tokens an embedding of `text` reads.
    fn embedding_tokens(&self, text: &str) -> Result<Vec<u32>, BackendError>;
}

/// Requests that finished during one `step`, each with its reply or error.
pub type Finished = Vec<(RequestId, Result<ChatReply, BackendError>)>;

/// A chat backend: open conversations, submit requests, step until replies arrive.
pub trait Backend {
    /// Opens a new, empty conversation.
    fn open_session(&mut self) -> SessionId;
    /// Closes a conversation and frees its cache.
    fn close_session(&mut self, s: SessionId);
    /// Queues a request on a session; it runs on later `step` calls.
    fn submit(&mut self, s: SessionId, req: ChatRequest) -> Result<RequestId, BackendError>;
    /// What turns requests into prompt tokens, for a backend that tokenizes
    /// (the in-process engine); callers run it before [`Self::submit_prepared`].
    fn prompter(&self) -> Option<std::sync::Arc<dyn Prompt>> {
        None
    }
    /// Queues a request whose prompt tokens the prompter made.
    fn submit_prepared(
        &mut self,
        s: SessionId,
        req: ChatRequest,
        prompt: Vec<u32>,
    ) -> Result<RequestId, BackendError> {
        let _ = prompt;
        self.submit(s, req)
    }
    /// Embeds texts: the final hidden state of each text's last token,
    /// L2-normalised. Batch-invariant: a text's vector does not depend on
    /// the other texts of the call.
    fn embed(&mut self, texts: &[String]) -> Result<Embeddings, BackendError> {
        let _ = texts;
        Err(BackendError::BadRequest(
            "this backend has no embedding entry point".into(),
        ))
    }
    /// Embeds texts whose tokens the prompter made.
    fn embed_prepared(
        &mut self,
        texts: &[String],
        tokens: Vec<Vec<u32>>,
    ) -> Result<Embeddings, BackendError> {
        let _ = tokens;
        self.embed(texts)
    }
    /// Advances every live request by one token; returns the requests that finished.
    fn step(&mut self) -> Result<Finished, BackendError>;
    /// The tokens the last `step` generated, one per request that decoded
    /// (for streaming); a backend that cannot tell returns none.
    fn take_progress(&mut self) -> Vec<Progress> {
        Vec::new()
    }
    /// Whether any request is queued or running.
    fn has_pending(&self) -> bool;
    /// Submits one request and steps until it finishes. Other requests keep
    /// running; their replies are dropped, so don't mix this with `submit`.
    fn chat(&mut self, s: SessionId, req: ChatRequest) -> Result<ChatReply, BackendError> {
        let id = self.submit(s, req)?;
        loop {
            for (rid, result) in self.step()? {
                if rid == id {
                    return result;
                }
            }
        }
    }
    /// What model this backend serves (for an engine: hashes the weights
    /// once, so an unreadable weight file is an error here).
    fn model_id(&self) -> Result<ModelIdentity, BackendError>;
}

/// Splits `<think>…</think>` off a reply: (reasoning, content). One rule for
/// the in-process engine and for servers without a reasoning parser.
pub fn split_thinking(text: &str) -> (Option<String>, String) {
    match text.find("</think>") {
        Some(end) => {
            let head = &text[..end];
            let reasoning = head
                .trim_start()
                .strip_prefix("<think>")
                .unwrap_or(head)
                .trim()
                .to_string();
            let content = text[end + "</think>".len()..].trim_start().to_string();
            (Some(reasoning), content)
        }
        None => (None, text.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::split_thinking;

    #[test]
    fn thinking_blocks_are_split_off() {
        let (r, c) = split_thinking("<think>\nweigh it\n</think>\n\nParis");
        assert_eq!(r.as_deref(), Some("weigh it"));
        assert_eq!(c, "Paris");
        let (r, c) = split_thinking("Paris");
        assert_eq!(r, None);
        assert_eq!(c, "Paris");
    }
}
