//! Chat templates: the Jinja template shipped with the model, interpreted
//! with minijinja plus the Python string methods such templates use.

use minijinja::value::Kwargs;
use minijinja::{Environment, ErrorKind, Value};

use crate::backend::{BackendError, Message, Tool};

/// Instructions one render may execute: a template's loops are the
/// model file's, and nested `range()` loops would otherwise run for hours,
/// holding every request behind them. Qwen's templates take a few hundred
/// per message.
pub const TEMPLATE_FUEL: u64 = 20_000_000;

/// Bytes one render may write: far beyond the longest context's text,
/// short of what would exhaust memory.
pub const TEMPLATE_OUTPUT_BYTES: usize = 64 << 20;

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    thinks: bool,
}

/// Why a render failed: a limit of this engine, or the template itself.
enum RenderError {
    Limit(String),
    Template(String),
}

impl From<RenderError> for BackendError {
    fn from(e: RenderError) -> Self {
        match e {
            RenderError::Limit(m) | RenderError::Template(m) => BackendError::Template(m),
        }
    }
}

/// A writer that stops at [`TEMPLATE_OUTPUT_BYTES`].
struct Bounded {
    out: Vec<u8>,
    over: bool,
}

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.out.len() + buf.len() > TEMPLATE_OUTPUT_BYTES {
            self.over = true;
            return Err(std::io::Error::other("template output limit"));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn raise_exception(msg: String) -> Result<String, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
}

impl ChatTemplate {
    /// Compiles a template source (as found in `tokenizer.chat_template` or
    /// `tokenizer_config.json`).
    pub fn new(source: &str) -> Result<Self, BackendError> {
        let mut env = Environment::new();
        // Hugging Face renders with these Jinja settings.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", tojson);
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| BackendError::Template(e.to_string()))?;
        Ok(Self {
            env,
            thinks: source.contains("<think>"),
        })
    }

    /// Whether the template has a thinking mode (writes `<think>` blocks).
    pub fn thinks(&self) -> bool {
        self.thinks
    }

    /// Renders a short conversation, so that a template that cannot finish
    /// within the limits ([`TEMPLATE_FUEL`], [`TEMPLATE_OUTPUT_BYTES`]) is
    /// refused when the model loads rather than on every request. Other
    /// failures are left to the requests: a template may rightly refuse
    /// some conversations.
    pub fn probe(&self) -> Result<(), BackendError> {
        let msgs = [
            Message::new(crate::backend::Role::System, "You are a helpful assistant."),
            Message::new(crate::backend::Role::User, "Hello."),
        ];
        let msgs: Vec<Value> = msgs.iter().map(message_value).collect();
        match self.render_values(Value::from(msgs), None, true, Some(false)) {
            Err(RenderError::Limit(m)) => Err(BackendError::Template(m)),
            _ => Ok(()),
        }
    }

    /// Renders a conversation with the generation prompt appended; `tools`,
    /// when any, go to the template as Hugging Face passes them.
    pub fn render(
        &self,
        messages: &[Message],
        tools: &[Tool],
        thinking: bool,
    ) -> Result<String, BackendError> {
        let msgs: Vec<Value> = messages.iter().map(message_value).collect();
        let tools = (!tools.is_empty()).then(|| Value::from_serialize(tools));
        Ok(self.render_values(Value::from(msgs), tools, true, Some(thinking))?)
    }

    /// Renders arbitrary message objects (e.g. with `reasoning_content`), as
    /// `apply_chat_template` would; `enable_thinking: None` leaves it undefined.
    pub fn render_json(
        &self,
        messages: &serde_json::Value,
        add_generation_prompt: bool,
        enable_thinking: Option<bool>,
    ) -> Result<String, BackendError> {
        Ok(self.render_values(
            Value::from_serialize(messages),
            None,
            add_generation_prompt,
            enable_thinking,
        )?)
    }

    fn render_values(
        &self,
        messages: Value,
        tools: Option<Value>,
        add_generation_prompt: bool,
        enable_thinking: Option<bool>,
    ) -> Result<String, RenderError> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| RenderError::Template(e.to_string()))?;
        // Variables a template does not receive stay undefined, as in
        // `apply_chat_template`.
        let mut ctx = vec![
            ("messages", messages),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
        ];
        if let Some(t) = enable_thinking {
            ctx.push(("enable_thinking", Value::from(t)));
        }
        if let Some(t) = tools {
            ctx.push(("tools", t));
        }
        let ctx = Value::from_iter(ctx);
        let mut out = Bounded {
            out: Vec::new(),
            over: false,
        };
        match tmpl.render_captured_to(ctx, &mut out) {
            Ok(_) => String::from_utf8(out.out)
                .map_err(|e| RenderError::Template(format!("output is not UTF-8: {e}"))),
            Err(_) if out.over => Err(RenderError::Limit(format!(
                "rendering wrote more than the limit of {TEMPLATE_OUTPUT_BYTES} bytes"
            ))),
            Err(e) if e.kind() == ErrorKind::OutOfFuel => Err(RenderError::Limit(format!(
                "rendering ran past the limit of {TEMPLATE_FUEL} instructions (a loop without end?)"
            ))),
            Err(e) => Err(RenderError::Template(format!("{e:#}").replace('\n', " "))),
        }
    }
}

/// A message as a chat template reads it: role and content, plus the calls
/// of an assistant message (arguments as a JSON object when they parse,
/// as Hugging Face passes them) and the call id a tool result answers.
fn message_value(m: &Message) -> Value {
    let mut fields = vec![
        ("role", Value::from(m.role.as_str())),
        ("content", Value::from(m.content.as_str())),
    ];
    if !m.tool_calls.is_empty() {
        let calls = m.tool_calls.iter().map(|c| {
            let arguments = serde_json::from_str::<serde_json::Value>(&c.arguments)
                .map(|v| Value::from_serialize(&v))
                .unwrap_or_else(|_| Value::from(c.arguments.as_str()));
            let function = Value::from_iter([
                ("name", Value::from(c.name.as_str())),
                ("arguments", arguments),
            ]);
            Value::from_iter([
                ("id", Value::from(c.id.as_str())),
                ("type", Value::from("function")),
                ("function", function),
            ])
        });
        fields.push(("tool_calls", Value::from_iter(calls)));
    }
    if !m.tool_call_id.is_empty() {
        fields.push(("tool_call_id", Value::from(m.tool_call_id.as_str())));
    }
    Value::from_iter(fields)
}

/// Python's separators: `", "` between items, `": "` after keys.
struct PySeparators;

impl PySeparators {
    fn item<W: ?Sized + std::io::Write>(w: &mut W, first: bool) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }
}

impl serde_json::ser::Formatter for PySeparators {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        PySeparators::item(w, first)
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        PySeparators::item(w, first)
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

/// `tojson` as Hugging Face defines it for chat templates —
/// `json.dumps(x, ensure_ascii=False, indent=indent)` — so tool schemas and
/// call arguments reach the model spelled as in training, not in
/// minijinja's compact, HTML-escaped form. Keys keep their order.
fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    let indent = match indent {
        Some(i) => Some(i),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let _: Option<Value> = kwargs.get("ensure_ascii")?;
    let _: Option<Value> = kwargs.get("separators")?;
    let _: Option<Value> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let indent = indent
        .filter(|v| !v.is_none() && !v.is_undefined())
        .map(|v| usize::try_from(v).unwrap_or(2));
    let mut out = Vec::new();
    let r = match indent {
        Some(n) => {
            let pad = " ".repeat(n);
            let f = serde_json::ser::PrettyFormatter::with_indent(pad.as_bytes());
            serde::Serialize::serialize(
                value,
                &mut serde_json::Serializer::with_formatter(&mut out, f),
            )
        }
        None => serde::Serialize::serialize(
            value,
            &mut serde_json::Serializer::with_formatter(&mut out, PySeparators),
        ),
    };
    r.map_err(|e| {
        minijinja::Error::new(ErrorKind::InvalidOperation, "cannot serialize to JSON")
            .with_source(e)
    })?;
    Ok(Value::from_safe_string(
        String::from_utf8(out).expect("serde_json writes UTF-8"),
    ))
}
