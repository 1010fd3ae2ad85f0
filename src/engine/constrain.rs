//! Constrained decoding: a [`Constraint`] compiled into a token mask over
//! the model's vocabulary, by llguidance (JSON Schema and Lark grammars,
//! the library vLLM, SGLang and llama.cpp use for structured output).
//!
//! The mask only removes choices: a constrained request's logits are the
//! unconstrained ones, so its scores and the other requests of its batch
//! are untouched.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use tokenizers::Tokenizer;

use super::scheduler::TokenFilter;
use crate::backend::{BackendError, Constraint, Tool};

/// Each token id's bytes, as the decoder writes them.
pub struct TokenBytes {
    bytes: Vec<Vec<u8>>,
    /// Control tokens (never text a grammar can match).
    control: Vec<bool>,
}

impl TokenBytes {
    /// Reads the byte-level BPE vocabulary: each piece's characters map
    /// back to bytes (GPT-2's table); added tokens are their text, control
    /// tokens (special ones the decoder drops) flagged apart.
    pub fn new(tokenizer: &Tokenizer, vocab: usize, literal: &[u32]) -> Self {
        // Char to byte: the table's characters all lie below U+0144.
        let mut byte_of = [None; 0x144];
        for (b, c) in byte_table().into_iter().enumerate() {
            byte_of[c as usize] = Some(b as u8);
        }
        let added = tokenizer.get_added_tokens_decoder();
        let mut bytes = vec![Vec::new(); vocab];
        let mut control = vec![false; vocab];
        for (id, slot) in bytes.iter_mut().enumerate() {
            let id32 = id as u32;
            if let Some(t) = added.get(&id32) {
                *slot = t.content.clone().into_bytes();
                control[id] = t.special && literal.binary_search(&id32).is_err();
                continue;
            }
            let Some(piece) = tokenizer.id_to_token(id32) else {
                continue;
            };
            for c in piece.chars() {
                match byte_of.get(c as usize).copied().flatten() {
                    Some(b) => slot.push(b),
                    None => slot.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                }
            }
        }
        TokenBytes { bytes, control }
    }

    /// A token's bytes (empty for an id the tokenizer does not have).
    pub fn of(&self, id: u32) -> &[u8] {
        self.bytes.get(id as usize).map_or(&[], Vec::as_slice)
    }
}

/// The characters byte-level BPE writes for bytes 0..=255 (GPT-2's
/// `bytes_to_unicode`): printable Latin-1 as itself, the rest shifted past
/// 255 in order.
fn byte_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut shifted = 0u32;
    for (b, slot) in table.iter_mut().enumerate() {
        let printable = (b'!'..=b'~').contains(&(b as u8))
            || (0xA1..=0xAC).contains(&b)
            || (0xAE..=0xFF).contains(&b);
        *slot = if printable {
            char::from(b as u8)
        } else {
            shifted += 1;
            char::from_u32(255 + shifted).expect("below the surrogates")
        };
    }
    table
}

/// The vocabulary indexed once per model for the grammars.
pub struct Grammars {
    factory: ParserFactory,
    digits: Arc<Digits>,
    /// `<tool_call>` as one token, when the vocabulary has it.
    tool_call_token: Option<u32>,
}

impl Grammars {
    /// Indexes the vocabulary; `eos` is the token that ends a reply.
    pub fn new(
        tokens: &TokenBytes,
        eos: u32,
        tool_call_token: Option<u32>,
    ) -> Result<Self, BackendError> {
        let words: Vec<Vec<u8>> = tokens
            .bytes
            .iter()
            .zip(&tokens.control)
            .map(|(b, &control)| {
                if control {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(b);
                    w
                } else {
                    b.clone()
                }
            })
            .collect();
        let info = TokRxInfo::new(words.len() as u32, eos);
        let env = Arc::new(ApproximateTokEnv::new(TokTrie::from(&info, &words)));
        let mut factory = ParserFactory::new_simple(&(env as _))
            .map_err(|e| BackendError::Tokenizer(format!("indexing for grammars: {e}")))?;
        factory.quiet();
        Ok(Grammars {
            factory,
            digits: Arc::new(Digits::new(tokens)),
            tool_call_token,
        })
    }

    /// The filter enforcing `c` on a request offering `tools`.
    pub fn filter(
        &self,
        c: &Constraint,
        tools: &[Tool],
    ) -> Result<Box<dyn TokenFilter>, BackendError> {
        let (field, grammar) = match c {
            Constraint::NoToolCalls => {
                return Ok(Box::new(Banned(self.tool_call_token.into_iter().collect())))
            }
            Constraint::JsonObject => (
                "response_format",
                TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"}))),
            ),
            Constraint::JsonSchema(schema) => {
                integer_bounds_fit(schema).map_err(|cause| BackendError::Constraint {
                    field: "response_format",
                    cause,
                })?;
                (
                    "response_format",
                    TopLevelGrammar::from_json_schema(compact(schema.clone())),
                )
            }
            Constraint::ToolCalls(name) => ("tool_choice", tool_grammar(name.as_deref(), tools)?),
        };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| BackendError::Constraint {
                field,
                cause: first_line(&e.to_string()),
            })?;
        let mut matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(BackendError::Constraint {
                field,
                cause: first_line(&e),
            });
        }
        // Some schemas (a `$ref` that recurses without consuming input) fail
        // only when the first mask is computed: compute it now, so the
        // request is refused before any reply (or stream) starts.
        if let Err(e) = matcher.compute_mask_or_eos() {
            return Err(BackendError::Constraint {
                field,
                cause: format!(
                    "no reply can satisfy the schema ({}); a $ref that refers to itself without a property in between is one cause",
                    // The parser's state dump follows the reason.
                    first_line(&e.to_string()).split(" <state>").next().unwrap_or("")
                ),
            });
        }
        Ok(Box::new(Grammar {
            matcher,
            digits: self.digits.clone(),
            run: 0,
        }))
    }
}

/// A cause in one line: its lines trimmed and joined (a regex parse error
/// puts the pattern and the fault on lines of their own).
fn first_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Refuses integer bounds a 64-bit integer cannot hold (`minimum: 1e308`
/// on an integer): the grammar cannot keep a reply inside them.
fn integer_bounds_fit(schema: &serde_json::Value) -> Result<(), String> {
    use serde_json::Value;
    match schema {
        Value::Object(o) => {
            let integer = match o.get("type") {
                Some(Value::String(t)) => t == "integer",
                Some(Value::Array(ts)) => ts.iter().any(|t| t == "integer"),
                _ => false,
            };
            if integer {
                for key in ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"] {
                    if let Some(Value::Number(n)) = o.get(key) {
                        if n.as_i64().is_none() && n.as_u64().is_none() {
                            let fits = n.as_f64().is_some_and(|f| {
                                f.fract() == 0.0 && f >= i64::MIN as f64 && f < i64::MAX as f64
                            });
                            if !fits {
                                return Err(format!(
                                    "integer bound {key} = {n} is outside the 64-bit integers"
                                ));
                            }
                        }
                    }
                }
            }
            o.values().try_for_each(integer_bounds_fit)
        }
        Value::Array(a) => a.iter().try_for_each(integer_bounds_fit),
        _ => Ok(()),
    }
}

/// A tool's parameter schema moved under the call grammar's root: its
/// `$defs` (or `definitions`) join the root's as `t{i}.NAME`, and its `$ref`s
/// are rewritten to match (`#` itself, the tool's whole schema, becomes
/// `#/$defs/t{i}`), so references resolve as they do in `response_format`.
fn hoist_defs(
    i: usize,
    mut params: serde_json::Value,
    root: &mut serde_json::Map<String, serde_json::Value>,
) -> serde_json::Value {
    use serde_json::Value;
    let prefix = format!("t{i}.");
    /// Rewrites the refs; whether one was `#` (the tool's whole schema).
    fn rewrite(v: &mut Value, prefix: &str, whole: &str) -> bool {
        let mut to_whole = false;
        match v {
            Value::Object(o) => {
                if let Some(Value::String(r)) = o.get_mut("$ref") {
                    if r == "#" {
                        *r = whole.to_string();
                        to_whole = true;
                    } else if let Some(rest) = r
                        .strip_prefix("#/$defs/")
                        .or_else(|| r.strip_prefix("#/definitions/"))
                    {
                        *r = format!("#/$defs/{prefix}{rest}");
                    }
                }
                for v in o.values_mut() {
                    to_whole |= rewrite(v, prefix, whole);
                }
            }
            Value::Array(a) => {
                for v in a {
                    to_whole |= rewrite(v, prefix, whole);
                }
            }
            _ => {}
        }
        to_whole
    }
    let whole = format!("#/$defs/t{i}");
    let mut defs = serde_json::Map::new();
    if let Value::Object(o) = &mut params {
        for key in ["$defs", "definitions"] {
            if let Some(Value::Object(d)) = o.remove(key) {
                defs.extend(d);
            }
        }
    }
    let mut recursive = rewrite(&mut params, &prefix, &whole);
    for (name, mut d) in defs {
        recursive |= rewrite(&mut d, &prefix, &whole);
        root.insert(format!("{prefix}{name}"), d);
    }
    if recursive {
        root.insert(format!("t{i}"), params);
        serde_json::json!({"$ref": whole})
    } else {
        params
    }
}

/// JSON written as `json.dumps` writes it (`", "` and `": "`, no other
/// whitespace): a model cannot pad an object with newlines until its budget
/// runs out, and the text parses the same.
fn compact(mut schema: serde_json::Value) -> serde_json::Value {
    if let serde_json::Value::Object(o) = &mut schema {
        o.insert(
            "x-guidance".into(),
            serde_json::json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
            }),
        );
    }
    schema
}

/// Calls in the chat template's form: `<tool_call>\n{"name": …, "arguments":
/// …}\n</tool_call>`, the arguments valid under the tool's parameters.
/// Exactly one call of a named tool, or one or more of any offered.
fn tool_grammar(name: Option<&str>, tools: &[Tool]) -> Result<TopLevelGrammar, BackendError> {
    let offered: Vec<&Tool> = tools
        .iter()
        .filter(|t| name.is_none_or(|n| t.function.name == n))
        .collect();
    if offered.is_empty() {
        return Err(BackendError::Constraint {
            field: "tool_choice",
            cause: match name {
                Some(n) => format!("names the function '{n}', which tools does not offer"),
                None => "is 'required' but no tools are offered".into(),
            },
        });
    }
    let mut defs = serde_json::Map::new();
    let mut call = |i: usize, t: &Tool| {
        let params = if t.function.parameters.is_null() {
            serde_json::json!({"type": "object"})
        } else {
            hoist_defs(i, t.function.parameters.clone(), &mut defs)
        };
        serde_json::json!({
            "type": "object",
            "properties": {"name": {"const": t.function.name}, "arguments": params},
            "required": ["name", "arguments"],
            "additionalProperties": false,
        })
    };
    let mut body = match offered.as_slice() {
        [one] => call(0, one),
        many => {
            serde_json::json!({"anyOf": many.iter().enumerate().map(|(i, t)| call(i, t)).collect::<Vec<_>>()})
        }
    };
    for t in &offered {
        integer_bounds_fit(&t.function.parameters).map_err(|cause| BackendError::Constraint {
            field: "tools",
            cause: format!("function '{}': {cause}", t.function.name),
        })?;
    }
    if !defs.is_empty() {
        body["$defs"] = serde_json::Value::Object(defs);
    }
    let repeat = if name.is_some() {
        ""
    } else {
        " (\"\\n\" call)*"
    };
    Ok(TopLevelGrammar::from_lark(format!(
        "start: call{repeat}\ncall: \"<tool_call>\\n\" body \"\\n</tool_call>\"\nbody: %json {}\n",
        compact(body)
    )))
}

/// Most digits in a row a constrained reply may write. JSON Schema puts no
/// length on a number, and a model can write digits until its budget runs
/// out (a float field that never ends); 24 holds any 64-bit integer and
/// any double's significant digits. After that many, tokens that begin with
/// a digit are masked while the grammar allows anything else (a string of
/// more digits that a pattern demands is still written).
pub const MAX_DIGIT_RUN: usize = 24;

/// Each token's digits: whether it begins with one, whether it is all
/// digits, and how many it ends with.
struct Digits {
    leads: Vec<bool>,
    all: Vec<bool>,
    trailing: Vec<usize>,
}

impl Digits {
    fn new(tokens: &TokenBytes) -> Self {
        let is_digit = |b: &u8| b.is_ascii_digit();
        Digits {
            leads: tokens
                .bytes
                .iter()
                .map(|b| b.first().is_some_and(is_digit))
                .collect(),
            all: tokens
                .bytes
                .iter()
                .map(|b| !b.is_empty() && b.iter().all(is_digit))
                .collect(),
            trailing: tokens
                .bytes
                .iter()
                .map(|b| b.iter().rev().take_while(|c| is_digit(c)).count())
                .collect(),
        }
    }
}

/// A grammar's token mask, and the digits written in a row so far.
struct Grammar {
    matcher: Matcher,
    digits: Arc<Digits>,
    run: usize,
}

impl TokenFilter for Grammar {
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| format!("constrained decoding: {}", first_line(&e.to_string())))?;
        let leads = &self.digits.leads;
        let cut = self.run >= MAX_DIGIT_RUN
            && (0..logits.len())
                .any(|t| allowed.is_allowed(t as u32) && !leads.get(t).copied().unwrap_or(false));
        for (t, l) in logits.iter_mut().enumerate() {
            if !allowed.is_allowed(t as u32) || (cut && leads.get(t).copied().unwrap_or(false)) {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    fn accept(&mut self, token: u32) -> Result<(), String> {
        let t = token as usize;
        if self.digits.all.get(t).copied().unwrap_or(false) {
            self.run += self.digits.trailing[t];
        } else {
            self.run = self.digits.trailing.get(t).copied().unwrap_or(0);
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| format!("constrained decoding: {}", first_line(&e.to_string())))
    }
}

/// Tokens never chosen.
struct Banned(Vec<u32>);

impl TokenFilter for Banned {
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        for &t in &self.0 {
            if let Some(l) = logits.get_mut(t as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    fn accept(&mut self, _: u32) -> Result<(), String> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::byte_table;

    #[test]
    fn the_byte_table_is_gpt2s() {
        let t = byte_table();
        assert_eq!(t[b'A' as usize], 'A');
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        let mut seen: Vec<char> = t.to_vec();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 256);
    }
}
