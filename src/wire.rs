//! The OpenAI chat-completions wire format, written once: the HTTP client
//! backend sends and reads these structs, `statebench serve` reads and
//! writes them.
//!
//! Fields a server may leave out have serde defaults, so replies from vLLM,
//! SGLang, llama.cpp's server and `statebench serve` all parse.
//!
//! Layer: with the backend, whose message types it converts; it uses no
//! engine and no study.

use serde::{Deserialize, Serialize};

use crate::backend::{
    Candidate, ChatReply, ChatRequest, Constraint, Embeddings, Finish, Message, PromptToken, Role,
    Sampling, TokenLogprob, Tool, ToolCall, Usage, MAX_TOP_LOGPROBS,
};

/// Why a body was refused, in one line for a 400, or why a reply could not
/// be read.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("invalid JSON body")]
    Syntax(#[source] serde_json::Error),
    #[error("the body must be a JSON object with OpenAI chat fields")]
    Shape(#[source] serde_json::Error),
    #[error("n must be from 1 to {MAX_N}, got {0}")]
    N(u64),
    #[error("top_logprobs must be from 0 to {MAX_TOP_LOGPROBS}, got {0}")]
    TopLogprobs(u64),
    #[error("top_logprobs needs logprobs: true")]
    TopLogprobsAlone,
    #[error("tool_choice {0}")]
    ToolChoice(String),
    #[error("response_format {0}")]
    ResponseFormat(String),
    #[error(
        "prompt must be a string, a list of strings, a list of token ids or a list of such lists"
    )]
    Prompt,
    #[error("logprobs must be from 0 to {MAX_TOP_LOGPROBS}, got {0}")]
    Logprobs(u64),
    #[error("max_tokens 0 scores the prompt only: it needs echo: true with logprobs")]
    ScoreOnly,
    #[error("{1}")]
    Param(&'static str, String),
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
    #[error("encoding_format '{0}' is not supported (float, base64)")]
    EncodingFormat(String),
    #[error("the reply does not hold one embedding for each of the {0} inputs")]
    EmbeddingCount(usize),
}

impl WireError {
    /// The request field at fault, as OpenAI's error `param` names it.
    pub fn param(&self) -> Option<&'static str> {
        Some(match self {
            WireError::N(_) => "n",
            WireError::TopLogprobs(_) | WireError::TopLogprobsAlone => "top_logprobs",
            WireError::ToolChoice(_) => "tool_choice",
            WireError::ResponseFormat(_) => "response_format",
            WireError::Prompt => "prompt",
            WireError::Logprobs(_) => "logprobs",
            WireError::ScoreOnly => "max_tokens",
            WireError::Param(name, _) => name,
            WireError::NoMessages
            | WireError::Role(..)
            | WireError::NoRole(_)
            | WireError::Part(..) => "messages",
            WireError::NoTokens => "max_tokens",
            WireError::Temperature => "temperature",
            WireError::Seed(_) => "seed",
            WireError::NoInput | WireError::TooManyInputs(_) => "input",
            WireError::EncodingFormat(_) => "encoding_format",
            _ => return None,
        })
    }

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

/// `max_tokens` of a text completion that gives none (OpenAI's default).
pub const DEFAULT_COMPLETION_TOKENS: usize = 16;

/// Most choices one request may ask for: they decode together in one batch.
pub const MAX_N: u64 = 8;

/// Choice `i`'s seed: the request's own for the first, so `n = 1` samples
/// as it always has; choice `i` after it the seed's `i`-th SplitMix64 draw.
pub fn choice_seed(seed: u64, i: usize) -> u64 {
    let mut r = crate::rng::Rng::new(seed);
    (0..i).fold(seed, |_, _| r.next_u64())
}

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
    pub stream_options: Option<StreamOptions>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template_kwargs: Option<TemplateKwargs>,
    /// Functions the model may call; their calls come back in `tool_calls`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<Tool>,
    /// `none`, `auto`, `required` or `{"type": "function", "function": {"name": …}}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<serde_json::Value>,
    /// `{"type": "text" | "json_object" | "json_schema", "json_schema": {"schema": …}}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<u64>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
}

/// The sampling parameters of the chat and completions APIs (OpenAI's and
/// vLLM's), as sent: each is read into [`Sampling`] or refused naming
/// itself, never ignored.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SamplingFields {
    /// Token id (a string) to a bias from -100 to 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logit_bias: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<serde_json::Value>,
    /// -1 (or 0) keeps every token, as vLLM has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_p: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repetition_penalty: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_tokens: Option<serde_json::Value>,
    /// Choices sampled to return the best: only 1 (or n) is served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_of: Option<serde_json::Value>,
    /// Text after the completion (insertion): not served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suffix: Option<serde_json::Value>,
}

impl SamplingFields {
    /// The fields of a request's sampling, for a served model.
    pub fn from_sampling(s: &Sampling) -> Self {
        use serde_json::json;
        let map: serde_json::Map<String, serde_json::Value> = s
            .logit_bias
            .iter()
            .map(|(t, b)| (t.to_string(), json!(b)))
            .collect();
        SamplingFields {
            logit_bias: (!map.is_empty()).then_some(serde_json::Value::Object(map)),
            top_p: s.top_p.map(|v| json!(v)),
            top_k: s.top_k.map(|v| json!(v)),
            min_p: s.min_p.map(|v| json!(v)),
            frequency_penalty: (s.frequency_penalty != 0.0).then(|| json!(s.frequency_penalty)),
            presence_penalty: (s.presence_penalty != 0.0).then(|| json!(s.presence_penalty)),
            repetition_penalty: s.repetition_penalty.map(|v| json!(v)),
            min_tokens: (s.min_tokens > 0).then(|| json!(s.min_tokens)),
            best_of: None,
            suffix: None,
        }
    }

    /// The sampling these fields ask for, or the first refused, by name.
    pub fn into_sampling(self, max_tokens: usize, n: u64) -> Result<Sampling, WireError> {
        use serde_json::Value;
        let bad = |name: &'static str, why: String| WireError::Param(name, why);
        let number = |name: &'static str, v: Option<Value>| -> Result<Option<f32>, WireError> {
            match v {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Number(x)) => Ok(x.as_f64().map(|x| x as f32)),
                Some(other) => Err(bad(name, format!("{name} must be a number, got {other}"))),
            }
        };
        let count = |name: &'static str, v: Option<Value>| -> Result<Option<i64>, WireError> {
            match v {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Number(x)) if x.as_i64().is_some() => Ok(x.as_i64()),
                Some(other) => Err(bad(name, format!("{name} must be an integer, got {other}"))),
            }
        };
        let mut logit_bias = Vec::new();
        match self.logit_bias {
            None | Some(Value::Null) => {}
            Some(Value::Object(m)) => {
                for (k, v) in m {
                    let t: u32 = k.trim().parse().map_err(|_| {
                        bad(
                            "logit_bias",
                            format!("logit_bias keys must be token ids, got '{k}'"),
                        )
                    })?;
                    let b = v.as_f64().ok_or_else(|| {
                        bad(
                            "logit_bias",
                            format!("logit_bias for token {t} must be a number, got {v}"),
                        )
                    })?;
                    logit_bias.push((t, b as f32));
                }
                // One order whatever the body's.
                logit_bias.sort_by_key(|&(t, _)| t);
            }
            Some(other) => {
                return Err(bad(
                    "logit_bias",
                    format!("logit_bias must be an object of token id to bias, got {other}"),
                ))
            }
        }
        let top_k = match count("top_k", self.top_k)? {
            None | Some(-1) | Some(0) => None,
            Some(k) if k > 0 => Some(k as usize),
            Some(k) => {
                return Err(bad(
                    "top_k",
                    format!("top_k must be -1 (all) or at least 1, got {k}"),
                ))
            }
        };
        let min_tokens = match count("min_tokens", self.min_tokens)? {
            None => 0,
            Some(k) if k >= 0 => k as usize,
            Some(k) => {
                return Err(bad(
                    "min_tokens",
                    format!("min_tokens must be at least 0, got {k}"),
                ))
            }
        };
        match count("best_of", self.best_of)? {
            None => {}
            Some(b) if b == 1 || b == n as i64 => {}
            Some(b) => {
                return Err(bad(
                    "best_of",
                    format!("best_of {b} is not supported (only 1, or equal to n)"),
                ))
            }
        }
        match self.suffix {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s.is_empty() => {}
            Some(_) => return Err(bad("suffix", "suffix (insertion) is not supported".into())),
        }
        let s = Sampling {
            logit_bias,
            top_p: number("top_p", self.top_p)?,
            top_k,
            min_p: number("min_p", self.min_p)?,
            frequency_penalty: number("frequency_penalty", self.frequency_penalty)?.unwrap_or(0.0),
            presence_penalty: number("presence_penalty", self.presence_penalty)?.unwrap_or(0.0),
            repetition_penalty: number("repetition_penalty", self.repetition_penalty)?,
            min_tokens,
        };
        s.check(max_tokens).map_err(|(name, why)| bad(name, why))?;
        Ok(s)
    }
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StreamOptions {
    /// A last chunk, with no choices, carries the usage.
    #[serde(default)]
    pub include_usage: bool,
}

/// What one chat-completions body asks for.
#[derive(Debug, Clone)]
pub struct ChatCall {
    /// Choice 0's request (the others differ in their seeds).
    pub req: ChatRequest,
    /// Choices.
    pub n: usize,
    /// `Some` when the reply streams.
    pub stream: Option<StreamOptions>,
    /// Whether the body gave the seed (else the server draws one).
    pub seeded: bool,
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
        let (tool_choice, response_format) = constraint_fields(req.constraint.as_ref());
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
            tool_choice,
            response_format,
            sampling: SamplingFields::from_sampling(&req.sampling),
            ..Default::default()
        }
    }

    /// What this body asks for, or a one-line reason it is refused.
    /// Thinking is on unless the body turns it off (as Qwen3's template and
    /// vLLM have it), and off under a constraint (the grammar covers the
    /// whole reply). Without a seed the seed is 0 and `seeded` false.
    pub fn into_call(self) -> Result<ChatCall, WireError> {
        let n = self.n.unwrap_or(1);
        if !(1..=MAX_N).contains(&n) {
            return Err(WireError::N(n));
        }
        let logprobs = logprobs(self.logprobs.unwrap_or(false), self.top_logprobs)?;
        let constraint = constraint(
            self.tool_choice.as_ref(),
            self.response_format.as_ref(),
            &self.tools,
        )?;
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
        let temperature = temperature(self.temperature)?;
        let seed = seed(self.seed.as_ref())?;
        let sampling = self.sampling.into_sampling(max_tokens, n)?;
        let req = ChatRequest {
            messages,
            max_tokens,
            stop: self.stop.into_vec(),
            thinking: constraint.is_none()
                && self
                    .chat_template_kwargs
                    .and_then(|k| k.enable_thinking)
                    .unwrap_or(true),
            temperature,
            seed: seed.unwrap_or(0),
            tools: self.tools,
            logprobs,
            constraint,
            prompt_text: None,
            prompt_ids: None,
            prompt_logprobs: None,
            sampling,
        };
        Ok(ChatCall {
            req,
            n: n as usize,
            stream: self.stream.then(|| self.stream_options.unwrap_or_default()),
            seeded: seed.is_some(),
        })
    }
}

/// The API's default temperature is 1.
fn temperature(t: Option<f32>) -> Result<f32, WireError> {
    let t = t.unwrap_or(1.0);
    if !(t.is_finite() && t >= 0.0) {
        return Err(WireError::Temperature);
    }
    Ok(t)
}

fn seed(n: Option<&serde_json::Number>) -> Result<Option<u64>, WireError> {
    let Some(n) = n else { return Ok(None) };
    match (n.as_u64(), n.as_i64()) {
        (Some(u), _) => Ok(Some(u)),
        (None, Some(i)) => Ok(Some(i as u64)),
        (None, None) => Err(WireError::Seed(n.to_string())),
    }
}

/// `logprobs` and `top_logprobs` as the engine's `Some(k)`.
fn logprobs(on: bool, top: Option<u64>) -> Result<Option<usize>, WireError> {
    match top {
        Some(k) if k > MAX_TOP_LOGPROBS as u64 => Err(WireError::TopLogprobs(k)),
        Some(k) if k > 0 && !on => Err(WireError::TopLogprobsAlone),
        _ => Ok(on.then(|| top.unwrap_or(0) as usize)),
    }
}

/// A constraint as the body's `tool_choice` and `response_format`, the
/// fields [`constraint`] reads back: a served model is held to the same
/// shape as the engine's.
fn constraint_fields(
    c: Option<&Constraint>,
) -> (Option<serde_json::Value>, Option<serde_json::Value>) {
    use serde_json::json;
    match c {
        None => (None, None),
        Some(Constraint::NoToolCalls) => (Some(json!("none")), None),
        Some(Constraint::ToolCalls(None)) => (Some(json!("required")), None),
        Some(Constraint::ToolCalls(Some(name))) => (
            Some(json!({"type": "function", "function": {"name": name}})),
            None,
        ),
        Some(Constraint::JsonObject) => (None, Some(json!({"type": "json_object"}))),
        Some(Constraint::JsonSchema(schema)) => (
            None,
            Some(
                json!({"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}),
            ),
        ),
    }
}

/// `tool_choice` and `response_format` as one constraint on the reply.
fn constraint(
    tool_choice: Option<&serde_json::Value>,
    format: Option<&serde_json::Value>,
    tools: &[Tool],
) -> Result<Option<Constraint>, WireError> {
    use serde_json::Value;
    let bad_choice = |why: &str| WireError::ToolChoice(why.to_string());
    let calls = match tool_choice {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => None,
            "none" => (!tools.is_empty()).then_some(Constraint::NoToolCalls),
            "required" if tools.is_empty() => {
                return Err(bad_choice("is 'required' but no tools are offered"))
            }
            "required" => Some(Constraint::ToolCalls(None)),
            other => {
                return Err(WireError::ToolChoice(format!(
                    "'{other}' is not one of none, auto, required or a named function"
                )))
            }
        },
        Some(v) => {
            let name = v
                .pointer("/function/name")
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    bad_choice(
                        r#"must be a string or {"type": "function", "function": {"name": …}}"#,
                    )
                })?;
            if !tools.iter().any(|t| t.function.name == name) {
                return Err(WireError::ToolChoice(format!(
                    "names the function '{name}', which tools does not offer"
                )));
            }
            Some(Constraint::ToolCalls(Some(name.to_string())))
        }
    };
    let bad_format = |why: &str| WireError::ResponseFormat(why.to_string());
    let json = match format {
        None | Some(Value::Null) => None,
        Some(f) => match f.get("type").and_then(Value::as_str) {
            Some("text") => None,
            Some("json_object") => Some(Constraint::JsonObject),
            Some("json_schema") => {
                let schema = f
                    .pointer("/json_schema/schema")
                    .ok_or_else(|| bad_format("json_schema needs json_schema.schema"))?;
                if !(schema.is_object() || schema.is_boolean()) {
                    return Err(bad_format(
                        "json_schema.schema must be a JSON Schema object",
                    ));
                }
                Some(Constraint::JsonSchema(schema.clone()))
            }
            _ => return Err(bad_format("type must be text, json_object or json_schema")),
        },
    };
    match (calls, json) {
        (Some(Constraint::ToolCalls(_)), Some(_)) => Err(bad_format(
            "cannot be combined with tool_choice 'required' or a named function",
        )),
        (Some(Constraint::NoToolCalls), Some(j)) => Ok(Some(j)),
        (calls, json) => Ok(json.or(calls)),
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
    /// The seed the choices were sampled from (drawn by the server when the
    /// request gave none), so any sample can be asked for again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Choice {
    #[serde(default)]
    pub index: u32,
    pub message: AssistantMessage,
    /// Written by `serve` when asked; a server's are not read.
    #[serde(skip_deserializing)]
    pub logprobs: Option<ChoiceLogprobs>,
    #[serde(default)]
    pub finish_reason: Option<String>,
}

/// A choice's log-probabilities, one entry per content token.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ChoiceLogprobs {
    pub content: Vec<WireLogprob>,
}

/// One token's log-probability as the API spells it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WireLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    #[serde(default)]
    pub top_logprobs: Vec<WireTopLogprob>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WireTopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

impl ChoiceLogprobs {
    pub fn from_tokens(t: &[TokenLogprob]) -> Self {
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        ChoiceLogprobs {
            content: t
                .iter()
                .map(|t| WireLogprob {
                    token: text(&t.chosen.bytes),
                    logprob: t.chosen.logprob,
                    bytes: t.chosen.bytes.clone(),
                    top_logprobs: t
                        .top
                        .iter()
                        .map(|c| WireTopLogprob {
                            token: text(&c.bytes),
                            logprob: c.logprob,
                            bytes: c.bytes.clone(),
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

/// The API's name for why a choice ended.
pub fn finish_reason(reply: &ChatReply) -> &'static str {
    match reply.finish {
        Finish::Length => "length",
        Finish::Stop if !reply.tool_calls.is_empty() => "tool_calls",
        Finish::Stop => "stop",
    }
}

/// One `chat.completion.chunk` of a streamed reply.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ChatChunk {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChunkChoice>,
    /// On the last chunk alone, when `stream_options.include_usage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<WireUsage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ChunkChoice {
    pub index: u32,
    pub delta: Delta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<ChoiceLogprobs>,
    pub finish_reason: Option<String>,
}

/// What a chunk adds to a choice's message.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Delta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallDelta>,
}

/// A tool call's first (and here only) piece.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ToolCallDelta {
    pub index: u32,
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub function: WireFunctionCall,
}

impl ToolCallDelta {
    pub fn from_calls(calls: &[ToolCall]) -> Vec<Self> {
        calls
            .iter()
            .enumerate()
            .map(|(i, c)| ToolCallDelta {
                index: i as u32,
                id: c.id.clone(),
                kind: function_kind(),
                function: WireFunctionCall {
                    name: c.name.clone(),
                    arguments: c.arguments.clone(),
                },
            })
            .collect()
    }
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

impl WireUsage {
    /// The usage of a request's choices: the prompt counted once, every
    /// choice's completion.
    pub fn of(replies: &[ChatReply]) -> Self {
        let prompt = replies.first().map_or(0, |r| r.usage.prompt_tokens) as u64;
        let completion: u64 = replies
            .iter()
            .map(|r| r.usage.completion_tokens as u64)
            .sum();
        WireUsage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: replies.first().map_or(0, |r| r.usage.cached_tokens) as u64,
            },
        }
    }
}

impl ChatCompletion {
    /// The reply to write for a request's choices, in choice order.
    pub fn from_replies(
        replies: &[ChatReply],
        model: &str,
        id: String,
        created: u64,
        seed: Option<u64>,
    ) -> Self {
        ChatCompletion {
            id,
            object: "chat.completion".into(),
            created,
            model: model.to_string(),
            choices: replies
                .iter()
                .enumerate()
                .map(|(i, reply)| Choice {
                    index: i as u32,
                    message: AssistantMessage {
                        role: "assistant".into(),
                        // The API's content is null beside calls when nothing else was said.
                        content: (reply.tool_calls.is_empty() || !reply.content.is_empty())
                            .then(|| reply.content.clone()),
                        reasoning_content: reply.reasoning.clone(),
                        reasoning: None,
                        tool_calls: reply.tool_calls.iter().map(WireToolCall::from).collect(),
                    },
                    logprobs: (!reply.logprobs.is_empty())
                        .then(|| ChoiceLogprobs::from_tokens(&reply.logprobs)),
                    finish_reason: Some(finish_reason(reply).into()),
                })
                .collect(),
            usage: WireUsage::of(replies),
            seed,
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
            logprobs: Vec::new(),
            prompt: Vec::new(),
        })
    }
}

/// `POST /v1/embeddings` body.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct EmbeddingRequest {
    #[serde(default)]
    pub model: String,
    pub input: EmbeddingInput,
    /// `float` (the default) or `base64` (little-endian f32s).
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
    /// The texts and whether vectors go back as base64, refusing an empty
    /// input or another format.
    pub fn into_texts(self) -> Result<(Vec<String>, bool), WireError> {
        let base64 = match self.encoding_format.as_deref() {
            None | Some("float") => false,
            Some("base64") => true,
            Some(f) => return Err(WireError::EncodingFormat(f.to_string())),
        };
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
        Ok((texts, base64))
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
    pub embedding: Vector,
    #[serde(default)]
    pub index: usize,
}

/// A vector as numbers, or as base64 of its little-endian f32s.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Vector {
    Floats(Vec<f32>),
    Base64(String),
}

impl Default for Vector {
    fn default() -> Self {
        Vector::Floats(Vec::new())
    }
}

impl Vector {
    fn encode(v: &[f32], base64: bool) -> Self {
        if !base64 {
            return Vector::Floats(v.to_vec());
        }
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        Vector::Base64(crate::base64::encode(&bytes))
    }

    fn into_floats(self) -> Option<Vec<f32>> {
        match self {
            Vector::Floats(v) => Some(v),
            Vector::Base64(s) => {
                let b = crate::base64::decode(&s)?;
                b.len().is_multiple_of(4).then(|| {
                    b.chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect()
                })
            }
        }
    }
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
    pub fn from_embeddings(e: &Embeddings, model: &str, base64: bool) -> Self {
        EmbeddingResponse {
            object: "list".into(),
            data: e
                .vectors
                .iter()
                .enumerate()
                .map(|(index, v)| EmbeddingData {
                    object: "embedding".into(),
                    embedding: Vector::encode(v, base64),
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
            *slot = d
                .embedding
                .into_floats()
                .ok_or(WireError::EmbeddingCount(n))?;
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

/// `POST /v1/completions` body (text completions).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CompletionRequest {
    #[serde(default)]
    pub model: String,
    /// A string, a list of strings, a list of token ids, or a list of such
    /// lists: one prompt each.
    pub prompt: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<serde_json::Number>,
    #[serde(default, skip_serializing_if = "Stop::is_empty")]
    pub stop: Stop,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u64>,
    /// The `k` most likely tokens' log-probabilities per token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<u64>,
    /// The prompt written before the completion; with `logprobs`, the
    /// prompt's tokens scored too.
    #[serde(default)]
    pub echo: bool,
    #[serde(default)]
    pub stream: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
}

/// One completions prompt as sent.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    Text(String),
    Ids(Vec<u32>),
}

/// What one completions body asks for: a request per prompt.
#[derive(Debug, Clone)]
pub struct CompletionCall {
    /// One per prompt, each choice 0's.
    pub reqs: Vec<ChatRequest>,
    pub n: usize,
    pub echo: bool,
    pub seeded: bool,
    /// `Some` when the reply streams.
    pub stream: Option<StreamOptions>,
}

/// The prompts of a completions body.
fn prompts(v: serde_json::Value) -> Result<Vec<PromptInput>, WireError> {
    use serde_json::Value;
    let id = |v: &Value| {
        v.as_u64()
            .and_then(|t| u32::try_from(t).ok())
            .ok_or(WireError::Prompt)
    };
    let ids = |a: &[Value]| a.iter().map(id).collect::<Result<Vec<u32>, _>>();
    match v {
        Value::String(s) => Ok(vec![PromptInput::Text(s)]),
        Value::Array(a) if a.is_empty() => Err(WireError::Prompt),
        Value::Array(a) if a.iter().all(Value::is_number) => Ok(vec![PromptInput::Ids(ids(&a)?)]),
        Value::Array(a) => a
            .into_iter()
            .map(|p| match p {
                Value::String(s) => Ok(PromptInput::Text(s)),
                Value::Array(t) if !t.is_empty() => Ok(PromptInput::Ids(ids(&t)?)),
                _ => Err(WireError::Prompt),
            })
            .collect(),
        _ => Err(WireError::Prompt),
    }
}

impl CompletionRequest {
    pub fn into_call(self) -> Result<CompletionCall, WireError> {
        let n = self.n.unwrap_or(1);
        if !(1..=MAX_N).contains(&n) {
            return Err(WireError::N(n));
        }
        let prompts = prompts(self.prompt)?;
        if prompts.len() as u64 * n > MAX_N {
            return Err(WireError::N(prompts.len() as u64 * n));
        }
        if let Some(k) = self.logprobs.filter(|&k| k > MAX_TOP_LOGPROBS as u64) {
            return Err(WireError::Logprobs(k));
        }
        let k = self.logprobs.map(|k| k as usize);
        let scores_prompt = self.echo && k.is_some();
        if self.stream && scores_prompt {
            return Err(WireError::Param(
                "stream",
                "stream: true with echo and logprobs is not supported; score the prompt without streaming".into(),
            ));
        }
        let max_tokens = self
            .max_tokens
            .map_or(DEFAULT_COMPLETION_TOKENS, |n| n as usize);
        // Zero tokens only scores: there must be something to score.
        if max_tokens == 0 && !scores_prompt {
            return Err(WireError::ScoreOnly);
        }
        let temperature = temperature(self.temperature)?;
        let seed = seed(self.seed.as_ref())?;
        let sampling = self.sampling.into_sampling(max_tokens, n)?;
        let stop = self.stop.into_vec();
        let reqs = prompts
            .into_iter()
            .map(|p| {
                let (prompt_text, prompt_ids) = match p {
                    PromptInput::Text(t) => (Some(t), None),
                    PromptInput::Ids(ids) => (None, Some(ids)),
                };
                ChatRequest {
                    stop: stop.clone(),
                    temperature,
                    seed: seed.unwrap_or(0),
                    logprobs: k.filter(|_| max_tokens > 0),
                    prompt_text,
                    prompt_ids,
                    prompt_logprobs: k.filter(|_| scores_prompt),
                    sampling: sampling.clone(),
                    ..ChatRequest::greedy(Vec::new(), max_tokens)
                }
            })
            .collect();
        Ok(CompletionCall {
            reqs,
            n: n as usize,
            echo: self.echo,
            seeded: seed.is_some(),
            stream: self.stream.then(|| self.stream_options.unwrap_or_default()),
        })
    }
}

/// A `text_completion` reply.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Completion {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    pub usage: WireUsage,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

/// One chunk of a streamed `text_completion`; the last, with no choices,
/// carries the usage when `stream_options.include_usage` asks.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CompletionChunk {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    pub usage: Option<WireUsage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CompletionChoice {
    pub text: String,
    pub index: u32,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<String>,
}

/// The completions API's log-probabilities: parallel lists per token, the
/// echoed prompt's first (its first token has none: nothing comes before it).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<Option<f32>>,
    pub top_logprobs: Vec<Option<serde_json::Map<String, serde_json::Value>>>,
    /// Each token's character offset in `text`.
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    fn push(
        &mut self,
        bytes: &[u8],
        logprob: Option<f32>,
        top: Option<&[Candidate]>,
        offset: &mut usize,
    ) {
        let text = String::from_utf8_lossy(bytes).into_owned();
        self.text_offset.push(*offset);
        *offset += text.chars().count();
        self.tokens.push(text);
        self.token_logprobs.push(logprob);
        self.top_logprobs.push(top.map(|top| {
            top.iter()
                .map(|c| {
                    let key = String::from_utf8_lossy(&c.bytes).into_owned();
                    (key, serde_json::json!(c.logprob))
                })
                .collect()
        }));
    }

    /// Generated tokens' entries, the first at character `offset`.
    pub fn of_tokens(tokens: &[TokenLogprob], mut offset: usize) -> Self {
        let mut lp = CompletionLogprobs::default();
        for t in tokens {
            lp.push(
                &t.chosen.bytes,
                Some(t.chosen.logprob),
                Some(&t.top),
                &mut offset,
            );
        }
        lp
    }

    /// The prompt's entries (`echo`), from character 0.
    pub fn of_prompt(prompt: &[PromptToken]) -> Self {
        let mut lp = CompletionLogprobs::default();
        let mut offset = 0;
        for t in prompt {
            let top = t.logprob.map(|_| &t.top[..]);
            lp.push(&t.bytes, t.logprob, top, &mut offset);
        }
        lp
    }

    /// These entries followed by `more`'s.
    pub fn extend(&mut self, more: CompletionLogprobs) {
        self.tokens.extend(more.tokens);
        self.token_logprobs.extend(more.token_logprobs);
        self.top_logprobs.extend(more.top_logprobs);
        self.text_offset.extend(more.text_offset);
    }
}

impl CompletionChoice {
    /// Choice `index` for a reply; `echo` is the prompt written before it
    /// (its tokens scored too when the reply holds their scores).
    pub fn new(index: usize, reply: &ChatReply, echo: Option<&str>) -> Self {
        let head = echo.unwrap_or("");
        let scored = echo.is_some() && !reply.prompt.is_empty();
        let logprobs = (scored || !reply.logprobs.is_empty()).then(|| {
            let mut lp = if scored {
                CompletionLogprobs::of_prompt(&reply.prompt)
            } else {
                CompletionLogprobs::default()
            };
            lp.extend(CompletionLogprobs::of_tokens(
                &reply.logprobs,
                head.chars().count(),
            ));
            lp
        });
        CompletionChoice {
            text: format!("{head}{}", reply.content),
            index: index as u32,
            logprobs,
            finish_reason: Some(finish_reason(reply).into()),
        }
    }
}

/// `POST /tokenize` body (vLLM's): a text prompt, or messages rendered by
/// the chat template.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TokenizeRequest {
    #[serde(default)]
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<WireMessage>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<Tool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template_kwargs: Option<TemplateKwargs>,
    /// Each token's vocabulary string beside its id.
    #[serde(default)]
    pub return_token_strs: bool,
}

impl TokenizeRequest {
    /// The request whose prompt the tokens are.
    pub fn into_request(self) -> Result<ChatRequest, WireError> {
        match (self.prompt, self.messages) {
            (Some(text), None) => Ok(ChatRequest {
                prompt_text: Some(text),
                ..ChatRequest::greedy(Vec::new(), 1)
            }),
            (None, Some(messages)) => {
                if messages.is_empty() {
                    return Err(WireError::NoMessages);
                }
                let messages = messages
                    .into_iter()
                    .enumerate()
                    .map(|(i, m)| m.into_message(i))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(ChatRequest {
                    tools: self.tools,
                    thinking: self
                        .chat_template_kwargs
                        .and_then(|k| k.enable_thinking)
                        .unwrap_or(true),
                    ..ChatRequest::greedy(messages, 1)
                })
            }
            _ => Err(WireError::Param(
                "prompt",
                "send one of prompt (a string) and messages".into(),
            )),
        }
    }
}

/// `POST /tokenize` reply.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TokenizeResponse {
    pub count: usize,
    pub max_model_len: usize,
    pub tokens: Vec<u32>,
    pub token_strs: Option<Vec<String>>,
}

/// `POST /detokenize` body.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DetokenizeRequest {
    #[serde(default)]
    pub model: String,
    pub tokens: Vec<u32>,
}

/// `POST /detokenize` reply: the text, special tokens kept.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DetokenizeResponse {
    pub prompt: String,
}
