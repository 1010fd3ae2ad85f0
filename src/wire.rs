//! The OpenAI chat-completions wire format, written once: the HTTP client
//! backend sends and reads these structs, `statebench serve` reads and
//! writes them.
//!
//! Fields a server may leave out have serde defaults, so replies from vLLM,
//! SGLang, llama.cpp's server and `statebench serve` all parse.

use serde::{Deserialize, Serialize};

use crate::backend::{
    ChatReply, ChatRequest, Embeddings, Finish, Message, Role, Tool, ToolCall, Usage,
};

/// Why a body was refused, in one line for a 400, or why a reply could not
/// be read.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("invalid JSON body")]
    Syntax(#[source] serde_json::Error),
    #[error("the body must be a JSON object with OpenAI chat fields")]
    Shape(#[source] serde_json::Error),
    #[error("stream: true is not supported; this server answers non-streaming requests only (send stream: false)")]
    Stream,
    #[error("n must be 1, got {0}")]
    N(u64),
    #[error("messages is empty")]
    NoMessages,
    #[error("messages[{0}].role '{1}' is not supported (system, user, assistant, tool)")]
    Role(usize, String),
    #[error("messages[{0}] has no role")]
    NoRole(usize),
    #[error("messages[{0}]: only text content parts are supported, got {1}")]
    Part(usize, String),
    #[error("max_tokens must be at least 1")]
    NoTokens,
    #[error("temperature must be a number >= 0")]
    Temperature,
    #[error("seed must be an integer from -2^63 to 2^64-1, got {0}")]
    Seed(String),
    #[error("no choices")]
    NoChoices,
    #[error("the reply holds {0} tool calls, more than the {MAX_TOOL_CALLS} a reply may make")]
    TooManyCalls(usize),
    #[error("input is empty")]
    NoInput,
    #[error("input holds {0} texts, more than the {MAX_EMBED_INPUTS} one request may embed")]
    TooManyInputs(usize),
    #[error("encoding_format '{0}' is not supported (float)")]
    EncodingFormat(String),
    #[error("the reply does not hold one embedding for each of the {0} inputs")]
    EmbeddingCount(usize),
}

impl WireError {
    /// A JSON error on a body: broken JSON, or JSON of the wrong shape.
    pub fn json(e: serde_json::Error) -> Self {
        match e.classify() {
            serde_json::error::Category::Data => WireError::Shape(e),
            _ => WireError::Syntax(e),
        }
    }
}

/// Most tool calls read from one reply: each is dispatched and answered in
/// the conversation, so a reply of thousands would grow it without bound.
pub const MAX_TOOL_CALLS: usize = 128;

/// Most texts one embeddings request may hold (OpenAI's bound too).
pub const MAX_EMBED_INPUTS: usize = 2048;

/// `max_tokens` when a request gives none.
pub const DEFAULT_MAX_TOKENS: usize = 1024;

/// `POST /v1/chat/completions` body.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ChatCompletionRequest {
    #[serde(default)]
    pub model: String,
    pub messages: Vec<WireMessage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// The newer spelling of `max_tokens`; wins when both are given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u64>,
    /// The API's default is 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// An integer from -2^63 to 2^64 - 1 (some clients send negative seeds;
    /// they wrap to u64); anything else is refused, not wrapped or rounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<serde_json::Number>,
    #[serde(default, skip_serializing_if = "Stop::is_empty")]
    pub stop: Stop,
    #[serde(default)]
    pub stream: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template_kwargs: Option<TemplateKwargs>,
    /// Functions the model may call; their calls come back in `tool_calls`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<Tool>,
}

/// One message as the API spells it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WireMessage {
    #[serde(default)]
    pub role: Option<String>,
    #[serde(default)]
    pub content: Option<Content>,
    /// An assistant message's calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<WireToolCall>,
    /// The call a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

/// One tool call as the API spells it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WireToolCall {
    #[serde(default)]
    pub id: String,
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    pub function: WireFunctionCall,
}

fn function_kind() -> String {
    "function".into()
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WireFunctionCall {
    #[serde(default)]
    pub name: String,
    /// JSON text; a server that sends an object instead has it written back as text.
    #[serde(default, deserialize_with = "arguments_text")]
    pub arguments: String,
}

fn arguments_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(s) => s,
        serde_json::Value::Null => String::new(),
        v => v.to_string(),
    })
}

impl From<&ToolCall> for WireToolCall {
    fn from(c: &ToolCall) -> Self {
        WireToolCall {
            id: c.id.clone(),
            kind: function_kind(),
            function: WireFunctionCall {
                name: c.name.clone(),
                arguments: c.arguments.clone(),
            },
        }
    }
}

impl WireToolCall {
    /// The engine's call; a missing id becomes `call_<n>`.
    fn into_call(self, n: usize) -> ToolCall {
        ToolCall {
            id: if self.id.is_empty() {
                format!("call_{n}")
            } else {
                self.id
            },
            name: self.function.name,
            arguments: self.function.arguments,
        }
    }
}

/// A message's content: a string, or a list of parts.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

/// Stop strings: one string or a list.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Default for Stop {
    fn default() -> Self {
        Stop::Many(Vec::new())
    }
}

impl Stop {
    fn is_empty(&self) -> bool {
        matches!(self, Stop::Many(v) if v.is_empty())
    }

    fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

/// What vLLM and SGLang pass to the chat template (Qwen3's `enable_thinking`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TemplateKwargs {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_thinking: Option<bool>,
}

impl ChatCompletionRequest {
    /// The body for an engine request.
    pub fn from_chat(model: &str, req: &ChatRequest) -> Self {
        ChatCompletionRequest {
            model: model.to_string(),
            messages: req
                .messages
                .iter()
                .map(|m| WireMessage {
                    role: Some(m.role.as_str().to_string()),
                    content: Some(Content::Text(m.content.clone())),
                    tool_calls: m.tool_calls.iter().map(WireToolCall::from).collect(),
                    tool_call_id: (!m.tool_call_id.is_empty()).then(|| m.tool_call_id.clone()),
                })
                .collect(),
            tools: req.tools.clone(),
            max_tokens: Some(req.max_tokens as u64),
            temperature: Some(req.temperature),
            seed: Some(req.seed.into()),
            stop: Stop::Many(req.stop.clone()),
            chat_template_kwargs: Some(TemplateKwargs {
                enable_thinking: Some(req.thinking),
            }),
            ..Default::default()
        }
    }

    /// The engine request this body asks for, or a one-line reason it is
    /// refused. Thinking is on unless the body turns it off (as Qwen3's
    /// template and vLLM have it).
    pub fn into_chat(self) -> Result<ChatRequest, WireError> {
        if self.stream {
            return Err(WireError::Stream);
        }
        if let Some(n) = self.n.filter(|n| *n != 1) {
            return Err(WireError::N(n));
        }
        if self.messages.is_empty() {
            return Err(WireError::NoMessages);
        }
        let messages = self
            .messages
            .into_iter()
            .enumerate()
            .map(|(i, m)| m.into_message(i))
            .collect::<Result<Vec<_>, _>>()?;
        let max_tokens = self
            .max_completion_tokens
            .or(self.max_tokens)
            .map_or(DEFAULT_MAX_TOKENS, |n| n as usize);
        if max_tokens == 0 {
            return Err(WireError::NoTokens);
        }
        let temperature = self.temperature.unwrap_or(1.0);
        if !(temperature.is_finite() && temperature >= 0.0) {
            return Err(WireError::Temperature);
        }
        let seed = match &self.seed {
            None => 0,
            Some(n) => match (n.as_u64(), n.as_i64()) {
                (Some(u), _) => u,
                (None, Some(i)) => i as u64,
                (None, None) => return Err(WireError::Seed(n.to_string())),
            },
        };
        Ok(ChatRequest {
            messages,
            max_tokens,
            stop: self.stop.into_vec(),
            thinking: self
                .chat_template_kwargs
                .and_then(|k| k.enable_thinking)
                .unwrap_or(true),
            temperature,
            seed,
            tools: self.tools,
        })
    }
}

impl WireMessage {
    fn into_message(self, i: usize) -> Result<Message, WireError> {
        let role = match self.role.as_deref() {
            Some("system" | "developer") => Role::System,
            Some("user") => Role::User,
            Some("assistant") => Role::Assistant,
            Some("tool") => Role::Tool,
            Some(r) => return Err(WireError::Role(i, r.to_string())),
            None => return Err(WireError::NoRole(i)),
        };
        let content = match self.content {
            None => String::new(),
            Some(Content::Text(s)) => s,
            Some(Content::Parts(parts)) => {
                let mut out = String::new();
                for p in parts {
                    match (p.kind.as_deref(), p.text) {
                        (Some("text") | None, Some(t)) => out.push_str(&t),
                        (t, _) => {
                            let t = t.unwrap_or("a part without text").to_string();
                            return Err(WireError::Part(i, t));
                        }
                    }
                }
                out
            }
        };
        let calls = self.tool_calls.into_iter().enumerate();
        Ok(Message {
            tool_calls: calls.map(|(n, c)| c.into_call(n)).collect(),
            tool_call_id: self.tool_call_id.unwrap_or_default(),
            ..Message::new(role, content)
        })
    }
}

/// A `chat.completion` reply.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ChatCompletion {
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub object: String,
    #[serde(default)]
    pub created: u64,
    #[serde(default)]
    pub model: String,
    pub choices: Vec<Choice>,
    #[serde(default)]
    pub usage: WireUsage,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Choice {
    #[serde(default)]
    pub index: u32,
    pub message: AssistantMessage,
    /// Always null here; whatever a server sends is not read.
    #[serde(skip_deserializing)]
    pub logprobs: Option<()>,
    #[serde(default)]
    pub finish_reason: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AssistantMessage {
    #[serde(default)]
    pub role: String,
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Some servers' spelling of `reasoning_content`.
    #[serde(default, skip_serializing)]
    pub reasoning: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<WireToolCall>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WireUsage {
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub completion_tokens: u64,
    #[serde(default)]
    pub total_tokens: u64,
    #[serde(default)]
    pub prompt_tokens_details: PromptTokensDetails,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PromptTokensDetails {
    #[serde(default)]
    pub cached_tokens: u64,
}

impl ChatCompletion {
    /// The reply to write for an engine reply.
    pub fn from_reply(reply: &ChatReply, model: &str, n: u64, created: u64) -> Self {
        let u = &reply.usage;
        ChatCompletion {
            id: format!("chatcmpl-{n}"),
            object: "chat.completion".into(),
            created,
            model: model.to_string(),
            choices: vec![Choice {
                index: 0,
                message: AssistantMessage {
                    role: "assistant".into(),
                    // The API's content is null beside calls when nothing else was said.
                    content: (reply.tool_calls.is_empty() || !reply.content.is_empty())
                        .then(|| reply.content.clone()),
                    reasoning_content: reply.reasoning.clone(),
                    reasoning: None,
                    tool_calls: reply.tool_calls.iter().map(WireToolCall::from).collect(),
                },
                logprobs: None,
                finish_reason: Some(
                    match reply.finish {
                        Finish::Length => "length",
                        Finish::Stop if !reply.tool_calls.is_empty() => "tool_calls",
                        Finish::Stop => "stop",
                    }
                    .into(),
                ),
            }],
            usage: WireUsage {
                prompt_tokens: u.prompt_tokens as u64,
                completion_tokens: u.completion_tokens as u64,
                total_tokens: (u.prompt_tokens + u.completion_tokens) as u64,
                prompt_tokens_details: PromptTokensDetails {
                    cached_tokens: u.cached_tokens as u64,
                },
            },
        }
    }

    /// The engine reply this completion carries. A server's timings are
    /// unknown: `secs` (the call's wall time) is counted as decode time.
    pub fn into_reply(self, secs: f64) -> Result<ChatReply, WireError> {
        let usage = Usage {
            prompt_tokens: self.usage.prompt_tokens as usize,
            cached_tokens: self.usage.prompt_tokens_details.cached_tokens as usize,
            completion_tokens: self.usage.completion_tokens as usize,
            prefill_secs: 0.0,
            decode_secs: secs,
        };
        let choice = self
            .choices
            .into_iter()
            .next()
            .ok_or(WireError::NoChoices)?;
        let m = choice.message;
        let raw = m.content.unwrap_or_default();
        let (reasoning, content) = match m.reasoning_content.or(m.reasoning) {
            Some(r) => (Some(r), raw),
            None => crate::backend::split_thinking(&raw),
        };
        if m.tool_calls.len() > MAX_TOOL_CALLS {
            return Err(WireError::TooManyCalls(m.tool_calls.len()));
        }
        let calls = m.tool_calls.into_iter().enumerate();
        Ok(ChatReply {
            content,
            reasoning,
            tool_calls: calls.map(|(n, c)| c.into_call(n)).collect(),
            finish: match choice.finish_reason.as_deref() {
                Some("length") => Finish::Length,
                _ => Finish::Stop,
            },
            usage,
            tokens: Vec::new(),
        })
    }
}

/// `POST /v1/embeddings` body.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct EmbeddingRequest {
    #[serde(default)]
    pub model: String,
    pub input: EmbeddingInput,
    /// Only `float` is supported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding_format: Option<String>,
}

/// The texts to embed: one string or a list.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EmbeddingInput {
    One(String),
    Many(Vec<String>),
}

impl Default for EmbeddingInput {
    fn default() -> Self {
        EmbeddingInput::Many(Vec::new())
    }
}

impl EmbeddingRequest {
    /// The texts, refusing an empty input or a format other than floats.
    pub fn into_texts(self) -> Result<Vec<String>, WireError> {
        if let Some(f) = self.encoding_format.filter(|f| f != "float") {
            return Err(WireError::EncodingFormat(f));
        }
        let texts = match self.input {
            EmbeddingInput::One(s) => vec![s],
            EmbeddingInput::Many(v) => v,
        };
        if texts.is_empty() {
            return Err(WireError::NoInput);
        }
        if texts.len() > MAX_EMBED_INPUTS {
            return Err(WireError::TooManyInputs(texts.len()));
        }
        Ok(texts)
    }
}

/// `POST /v1/embeddings` reply.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct EmbeddingResponse {
    #[serde(default)]
    pub object: String,
    pub data: Vec<EmbeddingData>,
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub usage: EmbeddingUsage,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct EmbeddingData {
    #[serde(default)]
    pub object: String,
    pub embedding: Vec<f32>,
    #[serde(default)]
    pub index: usize,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct EmbeddingUsage {
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub total_tokens: u64,
}

impl EmbeddingResponse {
    /// The reply to write for engine embeddings.
    pub fn from_embeddings(e: &Embeddings, model: &str) -> Self {
        EmbeddingResponse {
            object: "list".into(),
            data: e
                .vectors
                .iter()
                .enumerate()
                .map(|(index, v)| EmbeddingData {
                    object: "embedding".into(),
                    embedding: v.clone(),
                    index,
                })
                .collect(),
            model: model.to_string(),
            usage: EmbeddingUsage {
                prompt_tokens: e.prompt_tokens as u64,
                total_tokens: e.prompt_tokens as u64,
            },
        }
    }

    /// The embeddings this reply carries for `n` texts, in input order and
    /// normalised here (servers differ on whether they normalise).
    pub fn into_embeddings(self, n: usize) -> Result<Embeddings, WireError> {
        let mut vectors = vec![Vec::new(); n];
        for d in self.data {
            let slot = vectors
                .get_mut(d.index)
                .ok_or(WireError::EmbeddingCount(n))?;
            *slot = d.embedding;
            crate::backend::l2_normalize(slot);
        }
        if vectors.iter().any(Vec::is_empty) {
            return Err(WireError::EmbeddingCount(n));
        }
        Ok(Embeddings {
            vectors,
            prompt_tokens: self.usage.prompt_tokens as usize,
        })
    }
}

/// An error reply: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub message: String,
    #[serde(rename = "type", default)]
    pub kind: String,
    #[serde(default)]
    pub param: Option<String>,
    #[serde(default)]
    pub code: Option<String>,
}

/// The error bodies servers send: OpenAI's, or a bare message.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum AnyError {
    OpenAi { error: ErrorDetail },
    Message { message: String },
    Detail { detail: String },
    Plain { error: String },
}

impl AnyError {
    pub fn message(self) -> String {
        match self {
            AnyError::OpenAi { error } => error.message,
            AnyError::Message { message: m }
            | AnyError::Detail { detail: m }
            | AnyError::Plain { error: m } => m,
        }
    }
}

/// `GET /v1/models`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ModelList {
    #[serde(default)]
    pub object: String,
    #[serde(default)]
    pub data: Vec<ModelCard>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelCard {
    pub id: String,
    #[serde(default)]
    pub object: String,
    #[serde(default)]
    pub created: u64,
    #[serde(default)]
    pub owned_by: String,
}
