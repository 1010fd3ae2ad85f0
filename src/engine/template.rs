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
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| BackendError::Template(e.to_string()))?;
        let msgs: Vec<minijinja::Value> = messages
            .iter()
            .map(|m| {
                minijinja::context! { role => m.role.as_str(), content => m.content.as_str() }
            })
            .collect();
        tmpl.render(minijinja::context! {
            messages => msgs,
            add_generation_prompt => true,
            enable_thinking => thinking,
        })
        .map_err(|e| BackendError::Template(format!("{e:#}").replace('\n', " ")))
    }
}
