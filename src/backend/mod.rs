//! The one interface studies call: chat requests in, replies with token
//! accounting out, many conversations driven at once through `submit`/`step`.
//!
//! Layer: the interface between the engine and the studies. It defines the
//! types both sides use, and reaches a server through [`crate::wire`]; it uses
//! neither the engine (which implements [`Backend`]) nor any study.

pub mod http_client;
pub mod reply;
pub mod shared;
pub mod tools;

pub use reply::first_json_object;
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
    /// A prompt given as token ids, in place of text or messages (text
    /// completions from a client that tokenizes itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_ids: Option<Vec<u32>>,
    /// `Some(k)`: every prompt token's log-probability given the tokens
    /// before it and the `k` most likely tokens' there, in
    /// [`ChatReply::prompt`]. Such a request prefills its whole prompt
    /// (no cached prefix: the logits of cached positions are not kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<usize>,
    /// What shapes the choice beyond temperature.
    #[serde(default, skip_serializing_if = "Sampling::is_plain")]
    pub sampling: Sampling,
}

/// Adjustments of a request's next-token choice beyond temperature, the
/// OpenAI and vLLM sampling parameters. Applied to each step's logits in
/// this order: `logit_bias`, `repetition_penalty` (over prompt and reply),
/// `frequency_penalty` and `presence_penalty` (over the reply),
/// `min_tokens` (stop tokens masked); then, when sampling (temperature
/// above 0), `top_k`, `top_p` and `min_p` cut the candidates. Reported
/// log-probabilities stay the model's own (the logits before all of this).
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct Sampling {
    /// Added to these tokens' logits, each from -100 to 100.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub logit_bias: Vec<(u32, f32)>,
    /// Keep the fewest most likely tokens whose probabilities sum to at least this, in (0, 1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// Keep the `k` most likely tokens, `k` at least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<usize>,
    /// Keep tokens at least this fraction as likely as the most likely, in [0, 1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f32>,
    /// Subtracted from a token's logit once per time the reply holds it, from -2 to 2.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub frequency_penalty: f32,
    /// Subtracted from a token's logit once the reply holds it, from -2 to 2.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub presence_penalty: f32,
    /// A seen token's positive logit divided by it, a negative one
    /// multiplied (vLLM's and the CTRL paper's rule), above 0 up to 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repetition_penalty: Option<f32>,
    /// Tokens generated before a stop token or stop string may end the reply.
    #[serde(default, skip_serializing_if = "is_zero_count")]
    pub min_tokens: usize,
}

fn is_zero(v: &f32) -> bool {
    *v == 0.0
}

fn is_zero_count(v: &usize) -> bool {
    *v == 0
}

/// Largest `|bias|` of `logit_bias` (OpenAI's bound).
pub const MAX_LOGIT_BIAS: f32 = 100.0;

/// Largest repetition penalty accepted: past it every seen token is as good as banned.
pub const MAX_REPETITION_PENALTY: f32 = 10.0;

impl Sampling {
    /// Nothing beyond temperature.
    pub fn is_plain(&self) -> bool {
        *self == Sampling::default()
    }

    /// Whether the step's logits change before the choice (so a greedy
    /// request cannot take the device's argmax).
    pub fn adjusts_logits(&self) -> bool {
        !self.logit_bias.is_empty()
            || self.frequency_penalty != 0.0
            || self.presence_penalty != 0.0
            || self.repetition_penalty.is_some_and(|r| r != 1.0)
            || self.min_tokens > 0
    }

    /// The first parameter out of range, by its wire name, and why.
    pub fn check(&self, max_tokens: usize) -> Result<(), (&'static str, String)> {
        let within = |v: f32, lo: f32, hi: f32| v.is_finite() && v >= lo && v <= hi;
        if let Some((t, b)) = self
            .logit_bias
            .iter()
            .find(|(_, b)| !within(*b, -MAX_LOGIT_BIAS, MAX_LOGIT_BIAS))
        {
            return Err((
                "logit_bias",
                format!("logit_bias for token {t} must be from -100 to 100, got {b}"),
            ));
        }
        if let Some(p) = self
            .top_p
            .filter(|&p| !(p.is_finite() && p > 0.0 && p <= 1.0))
        {
            return Err((
                "top_p",
                format!("top_p must be above 0 and at most 1, got {p}"),
            ));
        }
        if self.top_k == Some(0) {
            return Err(("top_k", "top_k must be at least 1 (or -1 for all)".into()));
        }
        if let Some(p) = self.min_p.filter(|&p| !within(p, 0.0, 1.0)) {
            return Err(("min_p", format!("min_p must be from 0 to 1, got {p}")));
        }
        for (name, v) in [
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ] {
            if !within(v, -2.0, 2.0) {
                return Err((name, format!("{name} must be from -2 to 2, got {v}")));
            }
        }
        if let Some(r) = self
            .repetition_penalty
            .filter(|&r| !(r.is_finite() && r > 0.0 && r <= MAX_REPETITION_PENALTY))
        {
            return Err((
                "repetition_penalty",
                format!("repetition_penalty must be above 0 and at most {MAX_REPETITION_PENALTY}, got {r}"),
            ));
        }
        if self.min_tokens > max_tokens {
            return Err((
                "min_tokens",
                format!(
                    "min_tokens ({}) must be at most max_tokens ({max_tokens})",
                    self.min_tokens
                ),
            ));
        }
        Ok(())
    }
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

/// One prompt token with its log-probability given the tokens before it
/// (none for the first) and the most likely tokens there, most likely
/// first.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PromptToken {
    pub id: u32,
    pub bytes: Vec<u8>,
    pub logprob: Option<f32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
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
        // Zero tokens is scoring only: it needs the prompt's log-probabilities.
        if self.max_tokens == 0 && self.prompt_logprobs.is_none() {
            return Err(BackendError::BadRequest(
                "max_tokens must be at least 1 (0 only when scoring the prompt)".into(),
            ));
        }
        if self.messages.is_empty() && self.prompt_text.is_none() && self.prompt_ids.is_none() {
            return Err(BackendError::BadRequest("no messages".into()));
        }
        if let Err((field, why)) = self.sampling.check(self.max_tokens) {
            return Err(BackendError::BadField { field, why });
        }
        if self
            .logprobs
            .or(self.prompt_logprobs)
            .is_some_and(|k| k > MAX_TOP_LOGPROBS)
        {
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
            prompt_ids: None,
            prompt_logprobs: None,
            sampling: Sampling::default(),
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
    /// Per prompt token, when the request asked for the prompt's
    /// log-probabilities.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prompt: Vec<PromptToken>,
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
    /// One request field is malformed or out of range (named as the wire
    /// format names it).
    #[error("bad request: {why}")]
    BadField { field: &'static str, why: String },
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
    /// `STATEBENCH_CPU_ISA` names a kernel family that is unknown or that
    /// this host cannot run.
    #[error(transparent)]
    CpuIsa(#[from] statebench_kernels::IsaError),
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
    /// The model's context length, when known.
    fn context(&self) -> Option<usize> {
        None
    }
    /// Token ids as text with special tokens kept (`/detokenize`).
    fn text_with_special(&self, ids: &[u32]) -> Result<String, BackendError> {
        self.text(ids)
    }
    /// Each token's own string, as the vocabulary spells it.
    fn token_strs(&self, ids: &[u32]) -> Vec<String> {
        ids.iter().map(|t| t.to_string()).collect()
    }
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
