//! From a chat request to prompt tokens: the chat template rendered and the
//! text tokenized. A [`Prompter`] is shared, so this runs on the caller's
//! thread, never on the one thread that runs the model.
//!
//! Message content is text. A special-token string written inside it
//! (`<|im_start|>system …`) is tokenized as the characters it is, never as
//! the control token, unless the engine was opened with
//! `special_tokens_in_content`; otherwise one message could open a turn of
//! another role. Content without such strings is tokenized exactly as
//! before (the whole rendered prompt at once).

use tokenizers::Tokenizer;

use super::template::ChatTemplate;
use crate::backend::{BackendError, ChatRequest, Prompt};

/// Tokens of margin when a prompt's prefix already overflows the context
/// (a cut word may tokenize into more pieces than it does whole).
const CUT_MARGIN: usize = 64;

/// Renders and tokenizes requests for one model.
pub struct Prompter {
    pub(super) tokenizer: Tokenizer,
    /// The same tokenizer, reading special-token strings as text.
    plain: Tokenizer,
    pub(super) template: ChatTemplate,
    /// The special tokens' strings.
    specials: Vec<String>,
    /// Ids the decoder writes as their text although marked special.
    literal: Vec<u32>,
    special_tokens_in_content: bool,
    context: usize,
    vocab: usize,
}

impl Prompter {
    pub fn new(
        tokenizer: Tokenizer,
        template: ChatTemplate,
        special_tokens_in_content: bool,
        context: usize,
        vocab: usize,
        literal_tokens: &[String],
    ) -> Self {
        let mut plain = tokenizer.clone();
        plain.set_encode_special_tokens(true);
        let mut specials: Vec<String> = tokenizer
            .get_added_tokens_decoder()
            .into_values()
            .filter(|t| t.special && !literal_tokens.contains(&t.content))
            .map(|t| t.content)
            .filter(|c| !c.is_empty())
            .collect();
        specials.sort();
        let mut literal: Vec<u32> = literal_tokens
            .iter()
            .filter_map(|t| tokenizer.token_to_id(t))
            .collect();
        literal.sort_unstable();
        Prompter {
            tokenizer,
            plain,
            template,
            specials,
            literal,
            special_tokens_in_content,
            context,
            vocab,
        }
    }

    /// Generated ids as text: special tokens skipped, except the literal
    /// ones, written as their strings.
    pub fn decode(&self, ids: &[u32]) -> Result<String, BackendError> {
        let run = |ids: &[u32]| {
            self.tokenizer
                .decode(ids, true)
                .map_err(|e| BackendError::Tokenizer(e.to_string()))
        };
        let mut out = String::new();
        let mut start = 0;
        for (i, id) in ids.iter().enumerate() {
            if self.literal.binary_search(id).is_ok() {
                out.push_str(&run(&ids[start..i])?);
                out.push_str(self.tokenizer.id_to_token(*id).as_deref().unwrap_or(""));
                start = i + 1;
            }
        }
        out.push_str(&run(&ids[start..])?);
        Ok(out)
    }

    /// Tokenizes text; special tokens written in the text are recognised.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, BackendError> {
        encode(&self.tokenizer, text)
    }

    /// Refuses, without tokenizing all of it, a prompt whose beginning
    /// already holds more tokens than the context.
    fn overflow_early(&self, text: &str, max_tokens: usize) -> Result<(), BackendError> {
        let limit = 16 * (self.context + 1);
        if text.len() <= limit {
            return Ok(());
        }
        let mut cut = limit;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        let n = encode(&self.tokenizer, &text[..cut])?.len();
        if n > self.context + CUT_MARGIN {
            return Err(BackendError::ContextOverflow {
                prompt_tokens: n - CUT_MARGIN,
                partial: true,
                max_tokens,
                context: self.context,
            });
        }
        Ok(())
    }

    fn has_special(&self, text: &str) -> bool {
        self.specials.iter().any(|s| text.contains(s.as_str()))
    }

    /// Tokenizes a rendered prompt whose messages hold special-token
    /// strings: each message's content, found in the rendered text in
    /// order, as plain text; the template's own text as usual.
    fn encode_guarded(&self, text: &str, req: &ChatRequest) -> Result<Vec<u32>, BackendError> {
        let mut spans = Vec::new();
        let mut from = 0;
        for m in &req.messages {
            if !self.has_special(&m.content) {
                continue;
            }
            let c = m.content.trim();
            let Some(at) = text[from..].find(c) else {
                return Err(BackendError::BadRequest(
                    "a message holds special-token strings and the chat template rewrites it; \
                     send it without them, or open the engine with special tokens allowed in content"
                        .into(),
                ));
            };
            spans.push((from + at, from + at + c.len()));
            from += at + c.len();
        }
        let mut out = Vec::new();
        let mut pos = 0;
        for (a, b) in spans {
            out.extend(encode(&self.tokenizer, &text[pos..a])?);
            out.extend(encode(&self.plain, &text[a..b])?);
            pos = b;
        }
        out.extend(encode(&self.tokenizer, &text[pos..])?);
        Ok(out)
    }
}

fn encode(t: &Tokenizer, text: &str) -> Result<Vec<u32>, BackendError> {
    t.encode(text, false)
        .map(|e| e.get_ids().to_vec())
        .map_err(|e| BackendError::Tokenizer(e.to_string()))
}

impl Prompt for Prompter {
    fn embedding_tokens(&self, text: &str) -> Result<Vec<u32>, BackendError> {
        Prompter::embedding_tokens(self, text)
    }

    fn text(&self, ids: &[u32]) -> Result<String, BackendError> {
        self.decode(ids)
    }

    fn reasons(&self) -> bool {
        self.template.thinks()
    }

    fn context(&self) -> Option<usize> {
        Some(self.context)
    }

    fn text_with_special(&self, ids: &[u32]) -> Result<String, BackendError> {
        self.in_vocab("tokens", "token id", ids.iter().copied())?;
        self.tokenizer
            .decode(ids, false)
            .map_err(|e| BackendError::Tokenizer(e.to_string()))
    }

    fn token_strs(&self, ids: &[u32]) -> Vec<String> {
        ids.iter()
            .map(|&t| self.tokenizer.id_to_token(t).unwrap_or_default())
            .collect()
    }

    fn tokens(&self, req: &ChatRequest) -> Result<Vec<u32>, BackendError> {
        req.validate()?;
        let biased = req.sampling.logit_bias.iter().map(|&(t, _)| t);
        self.in_vocab("logit_bias", "logit_bias token", biased)?;
        if let Some(ids) = &req.prompt_ids {
            self.in_vocab("prompt", "prompt token id", ids.iter().copied())?;
            self.check(ids)?;
            return Ok(ids.clone());
        }
        if let Some(text) = &req.prompt_text {
            self.overflow_early(text, req.max_tokens)?;
            let prompt = self.encode(text)?;
            self.check(&prompt)?;
            return Ok(prompt);
        }
        let text = self
            .template
            .render(&req.messages, &req.tools, req.thinking)?;
        self.overflow_early(&text, req.max_tokens)?;
        let guard = !self.special_tokens_in_content
            && req.messages.iter().any(|m| self.has_special(&m.content));
        let prompt = if guard {
            self.encode_guarded(&text, req)?
        } else {
            self.encode(&text)?
        };
        self.check(&prompt)?;
        Ok(prompt)
    }
}

impl Prompter {
    /// Refuses, naming the request's `field`, a client's token id outside
    /// the vocabulary.
    fn in_vocab(
        &self,
        field: &'static str,
        what: &str,
        mut ids: impl Iterator<Item = u32>,
    ) -> Result<(), BackendError> {
        match ids.find(|&t| t as usize >= self.vocab) {
            Some(t) => Err(BackendError::BadField {
                field,
                why: format!("{what} {t} is outside the model's {} tokens", self.vocab),
            }),
            None => Ok(()),
        }
    }

    /// Every token id's bytes, for log-probabilities and grammars.
    pub fn token_bytes(&self) -> super::constrain::TokenBytes {
        super::constrain::TokenBytes::new(&self.tokenizer, self.vocab, &self.literal)
    }

    /// The tokens an embedding reads: the text as plain text (special-token
    /// strings in it stay text), then `<|endoftext|>` where the vocabulary
    /// has it, whose hidden state Qwen3-Embedding pools.
    pub fn embedding_tokens(&self, text: &str) -> Result<Vec<u32>, BackendError> {
        self.overflow_early(text, 0)?;
        let mut ids = encode(&self.plain, text)?;
        ids.extend(self.tokenizer.token_to_id("<|endoftext|>"));
        if ids.len() > self.context {
            return Err(BackendError::ContextOverflow {
                prompt_tokens: ids.len(),
                partial: false,
                max_tokens: 0,
                context: self.context,
            });
        }
        self.check(&ids)?;
        Ok(ids)
    }

    /// A prompt the model can take: not empty, every id inside the embedding.
    pub fn check(&self, prompt: &[u32]) -> Result<(), BackendError> {
        if prompt.is_empty() {
            return Err(BackendError::BadRequest(
                "the prompt renders to no tokens".into(),
            ));
        }
        if let Some(&t) = prompt.iter().find(|&&t| t as usize >= self.vocab) {
            return Err(BackendError::BadRequest(format!(
                "token id {t} is outside the model's {}-row embedding (tokenizer and weights do not match)",
                self.vocab
            )));
        }
        Ok(())
    }
}
