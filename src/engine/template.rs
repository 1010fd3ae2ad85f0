//! Chat templates: the Jinja template shipped with the model, interpreted
//! with minijinja plus the Python string methods such templates use.

use minijinja::{Environment, ErrorKind};

use crate::backend::{BackendError, Message};

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
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
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| BackendError::Template(e.to_string()))?;
        Ok(Self { env })
    }

    /// Renders a conversation with the generation prompt appended.
    pub fn render(&self, messages: &[Message], thinking: bool) -> Result<String, BackendError> {
        let msgs: Vec<minijinja::Value> = messages
            .iter()
            .map(|m| minijinja::context! { role => m.role.as_str(), content => m.content.as_str() })
            .collect();
        self.render_values(minijinja::Value::from(msgs), true, Some(thinking))
    }

    /// Renders arbitrary message objects (e.g. with `reasoning_content`), as
    /// `apply_chat_template` would; `enable_thinking: None` leaves it undefined.
    pub fn render_json(
        &self,
        messages: &serde_json::Value,
        add_generation_prompt: bool,
        enable_thinking: Option<bool>,
    ) -> Result<String, BackendError> {
        self.render_values(
            minijinja::Value::from_serialize(messages),
            add_generation_prompt,
            enable_thinking,
        )
    }

    fn render_values(
        &self,
        messages: minijinja::Value,
        add_generation_prompt: bool,
        enable_thinking: Option<bool>,
    ) -> Result<String, BackendError> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| BackendError::Template(e.to_string()))?;
        let ctx = match enable_thinking {
            Some(t) => minijinja::context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                enable_thinking => t,
            },
            None => minijinja::context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
            },
        };
        tmpl.render(ctx)
            .map_err(|e| BackendError::Template(format!("{e:#}").replace('\n', " ")))
    }
}
