//! Native tool calling: the tools a request offers, the calls a reply
//! makes, and the one parser that reads Qwen's `<tool_call>` blocks out of
//! generated text (the in-process engine and `serve` both use it, as vLLM's
//! `hermes` parser does for a served Qwen).

use serde::{Deserialize, Serialize};

/// A function the model may call, as chat templates and the OpenAI API
/// spell it (`{"type": "function", "function": {...}}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    pub function: FunctionDef,
}

fn function_kind() -> String {
    "function".into()
}

/// A function's name, what it does and its JSON-schema parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionDef {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub parameters: serde_json::Value,
}

impl Tool {
    /// A function tool.
    pub fn function(name: &str, description: &str, parameters: serde_json::Value) -> Self {
        Tool {
            kind: function_kind(),
            function: FunctionDef {
                name: name.to_string(),
                description: description.to_string(),
                parameters,
            },
        }
    }
}

/// One call a reply made. `arguments` is the JSON text the model wrote
/// (an object when the call is well formed), kept as text as the OpenAI
/// API does, so a malformed argument string reaches the caller unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id, answered by the `tool` message that carries its result.
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// Splits a reply's `<tool_call>{"name": …, "arguments": {…}}</tool_call>`
/// blocks off its text: (text without the parsed blocks, calls in order).
/// A block whose JSON does not parse, or has no name, stays in the text
/// (as vLLM leaves it), where a caller can count it as malformed. An
/// unterminated last block runs to the end of the reply. A reply without
/// tags is read for bare call objects instead — a line that opens
/// `{"name": …, "arguments": …}`, fenced as ```` ```json ```` or not — as
/// llama.cpp's Hermes parser reads them: small Qwen2.5 models drop the
/// tags. Call ids are `call_<n>` in reply order.
pub fn split_tool_calls(text: &str) -> (String, Vec<ToolCall>) {
    if !text.contains("<tool_call>") {
        return split_bare_calls(text);
    }
    const OPEN: &str = "<tool_call>";
    const CLOSE: &str = "</tool_call>";
    let mut kept = String::new();
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(a) = rest.find(OPEN) {
        let body_start = a + OPEN.len();
        let (body, next) = match rest[body_start..].find(CLOSE) {
            Some(b) => (
                &rest[body_start..body_start + b],
                body_start + b + CLOSE.len(),
            ),
            None => (&rest[body_start..], rest.len()),
        };
        match parse_call(body, calls.len()) {
            Some(call) => {
                kept.push_str(&rest[..a]);
                calls.push(call);
            }
            None => kept.push_str(&rest[..next]),
        }
        rest = &rest[next..];
    }
    kept.push_str(rest);
    if calls.is_empty() {
        return (text.to_string(), calls);
    }
    (kept.trim().to_string(), calls)
}

/// Bare call objects at line starts, with a ```` ```json ```` fence around
/// one removed along with it.
fn split_bare_calls(text: &str) -> (String, Vec<ToolCall>) {
    let mut kept = String::new();
    let mut calls = Vec::new();
    let mut at = 0;
    let mut line_start = 0;
    while line_start < text.len() {
        let line_end = text[line_start..]
            .find('\n')
            .map_or(text.len(), |i| line_start + i + 1);
        let line = &text[line_start..line_end];
        let indent = line.len() - line.trim_start().len();
        let fenced = line.trim_start().starts_with("```");
        let obj = if fenced {
            line_end
        } else {
            line_start + indent
        };
        match bare_call(text, obj, calls.len()) {
            Some((call, end)) => {
                let mut end = end;
                if fenced {
                    let rest = &text[end..];
                    let close = rest.trim_start();
                    if let Some(after) = close.strip_prefix("```") {
                        end = text.len() - after.len();
                    }
                }
                if text[end..].starts_with('\n') {
                    end += 1;
                }
                kept.push_str(&text[at..line_start]);
                calls.push(call);
                at = end;
                line_start = end;
            }
            None => line_start = line_end,
        }
    }
    if calls.is_empty() {
        return (text.to_string(), calls);
    }
    kept.push_str(&text[at..]);
    (kept.trim().to_string(), calls)
}

/// The call object starting at `from` (after blanks), and where it ends.
fn bare_call(text: &str, from: usize, n: usize) -> Option<(ToolCall, usize)> {
    let rest = text.get(from..)?;
    let skip = rest.len() - rest.trim_start().len();
    if !rest[skip..].starts_with('{') {
        return None;
    }
    let start = from + skip;
    let mut it =
        serde_json::Deserializer::from_str(&text[start..]).into_iter::<serde_json::Value>();
    let v = it.next()?.ok()?;
    let end = start + it.byte_offset();
    let obj = v.as_object()?;
    if obj.len() != 2 || !obj.contains_key("arguments") {
        return None;
    }
    Some((call_of(&v, n)?, end))
}

fn parse_call(body: &str, n: usize) -> Option<ToolCall> {
    let v: serde_json::Value = serde_json::from_str(body.trim()).ok()?;
    call_of(&v, n)
}

fn call_of(v: &serde_json::Value, n: usize) -> Option<ToolCall> {
    let name = v.get("name")?.as_str()?.to_string();
    let arguments = match v.get("arguments") {
        None | Some(serde_json::Value::Null) => "{}".to_string(),
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(a) => a.to_string(),
    };
    Some(ToolCall {
        id: format!("call_{n}"),
        name,
        arguments,
    })
}

/// Whether text still holds a `<tool_call>` block (one that did not parse).
pub fn has_tool_call_block(text: &str) -> bool {
    text.contains("<tool_call>")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen_blocks_become_calls() {
        let text = "Booking it.\n<tool_call>\n{\"name\": \"sign_msa\", \"arguments\": {\"work_order\": \"#W1234\"}}\n</tool_call>";
        let (kept, calls) = split_tool_calls(text);
        assert_eq!(kept, "Booking it.");
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "sign_msa");
        assert_eq!(calls[0].id, "call_0");
        assert_eq!(calls[0].arguments, "{\"work_order\":\"#W1234\"}");
    }

    #[test]
    fn malformed_blocks_stay_in_the_text() {
        let text = "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"work_order\": }\n</tool_call>\n<tool_call>{\"name\": \"b\", \"arguments\": \"{}\"}</tool_call>";
        let (kept, calls) = split_tool_calls(text);
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "b");
        assert_eq!(calls[0].arguments, "{}");
        assert!(has_tool_call_block(&kept), "{kept}");
        let (same, none) = split_tool_calls("no calls here");
        assert_eq!((same.as_str(), none.len()), ("no calls here", 0));
    }

    #[test]
    fn bare_call_objects_are_read_without_tags() {
        let (kept, calls) = split_tool_calls(
            "{\"name\": \"sign_msa\", \"arguments\": {\"work_order\": \"#W1234\"}}",
        );
        assert_eq!((kept.as_str(), calls.len()), ("", 1));
        assert_eq!(calls[0].arguments, "{\"work_order\":\"#W1234\"}");
        let (kept, calls) = split_tool_calls(
            "Signing now.\n```json\n{\"name\": \"a\", \"arguments\": {}}\n```\nthen\n{\"name\": \"b\", \"arguments\": {\"x\": 1}}\nDone.",
        );
        assert_eq!(calls.len(), 2, "{calls:?}");
        assert_eq!((calls[0].name.as_str(), calls[1].name.as_str()), ("a", "b"));
        assert_eq!(calls[1].id, "call_1");
        assert_eq!(kept, "Signing now.\nthen\nDone.");
        // JSON that is not a call object stays text.
        for text in [
            "{\"step\": \"s1\", \"explicit_redo\": false}",
            "See {\"name\": \"a\", \"arguments\": {}} inline",
            "{\"name\": \"a\", \"arguments\": {}, \"extra\": 1}",
        ] {
            let (kept, calls) = split_tool_calls(text);
            assert!(calls.is_empty(), "{text}");
            assert_eq!(kept, text);
        }
    }

    #[test]
    fn an_unterminated_block_runs_to_the_end() {
        let (kept, calls) = split_tool_calls("<tool_call>\n{\"name\": \"x\", \"arguments\": {}}\n");
        assert_eq!(kept, "");
        assert_eq!(calls[0].name, "x");
    }
}
