//! Receipts read by a model (`--receipts model`, the default): where a
//! `notice` or `gate` arm judges a write, a matcher model reads the
//! conversation for that write — whether the user's latest message
//! confirms this action with the details the agent listed, and for a
//! cancellation which covered reason the user gave — and the arm's rules
//! decide on its reading. The reference rules that score every call
//! (`violates`) keep the lexical reading, the labelled oracle; each
//! reading is logged beside the lexical reading of the same receipts, so
//! the report measures the matcher against it.
//!
//! What stays code: which user was looked up, which exchange a
//! confirmation is read from (the latest user message and the agent's text
//! right before it), and everything the database says. A reply that is not
//! the requested JSON is no confirmation and no reason (in doubt, no yes),
//! and is counted as unreadable.
//!
//! The `shown` arm renders its verdicts before any call is proposed, with
//! no action to read a confirmation of; it keeps the lexical reading.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::db::FlightDb;
use super::prompts;
use super::record::Reading;
use super::rules::{self, MatcherRead, Receipts, RuleSet, ToRead, Write};
use crate::backend::{ChatReply, ChatRequest, Constraint, Message, Role};

/// Who reads the rule arms' receipts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum ReceiptReader {
    /// A matcher model reads the confirmation and the reason.
    Model,
    /// Words and phrases read them (the reference rules' reading).
    Lexical,
}

impl ReceiptReader {
    pub fn name(self) -> &'static str {
        match self {
            ReceiptReader::Model => "model",
            ReceiptReader::Lexical => "lexical",
        }
    }

    /// Run directories from before the choice existed read lexically.
    pub fn before_choice() -> ReceiptReader {
        ReceiptReader::Lexical
    }

    pub fn is_lexical(&self) -> bool {
        *self == ReceiptReader::Lexical
    }
}

/// A reading's reply budget: the answer is a dozen tokens of JSON, and a
/// bounded one can never run long.
pub const READ_TOKENS: usize = 48;

/// One reading to ask: the request and what the record keeps of it.
#[derive(Debug, Clone)]
pub struct Ask {
    pub to_read: ToRead,
    /// The request's user message (its system message is
    /// [`prompts::READER_SYSTEM`]).
    pub prompt: String,
    pub request: ChatRequest,
    /// The lexical reading of the same receipts.
    pub lexical: MatcherRead,
}

/// The reading a proposed call needs before `rules` judge it, if any:
/// writes the rules read the conversation for (a confirmation they ask, a
/// cancellation's reason). `history` is the agent's conversation up to the
/// call; `seed` the episode's.
pub fn ask(
    rules: &RuleSet,
    db: &FlightDb,
    history: &[Message],
    name: &str,
    args: &Value,
    seed: u64,
) -> Option<Ask> {
    let write = Write::from_name(name)?;
    // Read once: the prompt and the lexical reading both come from it.
    let receipts = Receipts::read(history);
    let to_read = rules.to_read(&receipts, write)?;
    let exchange = receipts
        .exchange
        .as_ref()
        .filter(|_| to_read.confirmation)
        .map(|x| (x.asked.as_str(), x.answer.as_str()));
    let said: Vec<&str> = receipts.user_text.lines().collect();
    let reasons = to_read
        .reason
        .then_some((rules.insurance_reasons.as_slice(), said.as_slice()));
    let prompt = prompts::reading(
        write.name(),
        &rules::action_details(db, write, args),
        exchange,
        reasons,
    );
    let mut request = ChatRequest::greedy(
        vec![
            Message::new(Role::System, prompts::READER_SYSTEM),
            Message::new(Role::User, prompt.clone()),
        ],
        READ_TOKENS,
    );
    request.seed = seed;
    request.constraint = Some(Constraint::JsonSchema(schema(rules, to_read)));
    Some(Ask {
        to_read,
        prompt,
        request,
        lexical: rules.lexical_read(db, &receipts, write, args, to_read),
    })
}

/// The reply's shape: the fields asked, each required, nothing else.
pub fn schema(rules: &RuleSet, to_read: ToRead) -> Value {
    let mut props = serde_json::Map::new();
    if to_read.confirmation {
        let kinds: Vec<&str> = prompts::REPLY_KINDS.iter().map(|(k, _)| *k).collect();
        props.insert(
            "agent_listed_this_action".into(),
            json!({"type": "boolean"}),
        );
        props.insert("customer_reply".into(), json!({"enum": kinds}));
    }
    if to_read.reason {
        // "none" first: the choice a reading falls back on is the safe one.
        let names: Vec<&str> = std::iter::once("none")
            .chain(rules.insurance_reasons.iter().map(String::as_str))
            .collect();
        props.insert("reason".into(), json!({"enum": names}));
    }
    let required: Vec<&String> = props.keys().collect();
    json!({"type": "object", "properties": props, "required": required,
           "additionalProperties": false})
}

/// Reads a matcher's reply: the first JSON object in it, holding every
/// field asked with a value of its kind.
pub fn parse(reply: &str, rules: &RuleSet, to_read: ToRead) -> Result<MatcherRead, String> {
    let v = crate::backend::first_json_object(reply)
        .ok_or_else(|| "no JSON object in the reply".to_string())?;
    let confirmed = match to_read.confirmation {
        false => None,
        true => {
            let listed = v
                .get("agent_listed_this_action")
                .and_then(Value::as_bool)
                .ok_or_else(|| "\"agent_listed_this_action\" is not true or false".to_string())?;
            let kind = v
                .get("customer_reply")
                .and_then(Value::as_str)
                .filter(|k| prompts::REPLY_KINDS.iter().any(|(x, _)| x == k))
                .ok_or_else(|| "\"customer_reply\" is not one of the kinds asked".to_string())?;
            Some(listed && kind == prompts::REPLY_KINDS[0].0)
        }
    };
    let reason = match to_read.reason {
        false => None,
        true => {
            let r = v
                .get("reason")
                .and_then(Value::as_str)
                .ok_or_else(|| "\"reason\" is not a string".to_string())?;
            match r {
                "none" => None,
                r if rules.insurance_reasons.iter().any(|x| x == r) => Some(r.to_string()),
                r => return Err(format!("\"reason\" {r:?} is not one asked for")),
            }
        }
    };
    Ok(MatcherRead { confirmed, reason })
}

/// What the record keeps of a reading: an unreadable reply reads as no
/// confirmation and no reason.
pub fn reading(call: usize, ask: Ask, reply: &ChatReply, rules: &RuleSet) -> Reading {
    let text = crate::backend::split_thinking(&reply.content).1;
    let parsed = parse(&text, rules, ask.to_read);
    let fallback = MatcherRead {
        confirmed: ask.to_read.confirmation.then_some(false),
        reason: None,
    };
    Reading {
        call,
        asked: ask.to_read,
        prompt: ask.prompt,
        reply: text,
        error: parsed.as_ref().err().cloned(),
        read: parsed.unwrap_or(fallback),
        lexical: ask.lexical,
        usage: reply.usage,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOTH: ToRead = ToRead {
        confirmation: true,
        reason: true,
    };

    #[test]
    fn replies_are_read_only_in_the_shape_asked() {
        let rules = RuleSet::reference();
        let ok = parse(
            r#"{"agent_listed_this_action": true, "customer_reply": "yes", "reason": "health"}"#,
            &rules,
            BOTH,
        );
        assert_eq!(
            ok,
            Ok(MatcherRead {
                confirmed: Some(true),
                reason: Some("health".into())
            })
        );
        let none = parse(
            r#"```json
{"agent_listed_this_action": true, "customer_reply": "unsure", "reason": "none"}
```"#,
            &rules,
            BOTH,
        );
        assert_eq!(
            none,
            Ok(MatcherRead {
                confirmed: Some(false),
                reason: None
            })
        );
        for bad in [
            "yes",
            r#"{"agent_listed_this_action": "yes", "customer_reply": "yes", "reason": "none"}"#,
            r#"{"agent_listed_this_action": true, "customer_reply": "sure", "reason": "none"}"#,
            r#"{"agent_listed_this_action": true, "customer_reply": "yes"}"#,
            r#"{"agent_listed_this_action": true, "customer_reply": "yes", "reason": "boredom"}"#,
        ] {
            assert!(parse(bad, &rules, BOTH).is_err(), "{bad}");
        }
        // A field not asked is not read.
        let only_reason = ToRead {
            confirmation: false,
            reason: true,
        };
        assert_eq!(
            parse(r#"{"reason": "weather"}"#, &rules, only_reason),
            Ok(MatcherRead {
                confirmed: None,
                reason: Some("weather".into())
            })
        );
    }

    #[test]
    fn the_schema_asks_exactly_the_fields_read() {
        let rules = RuleSet::reference();
        let s = schema(&rules, BOTH);
        assert_eq!(
            s["required"],
            json!(["agent_listed_this_action", "customer_reply", "reason"])
        );
        assert_eq!(
            s["properties"]["reason"]["enum"],
            json!(["none", "health", "weather"])
        );
        assert_eq!(
            s["properties"]["customer_reply"]["enum"],
            json!([
                "yes",
                "yes_with_conditions",
                "unsure",
                "no",
                "question",
                "other"
            ])
        );
        let c = schema(
            &rules,
            ToRead {
                confirmation: true,
                reason: false,
            },
        );
        assert_eq!(
            c["required"],
            json!(["agent_listed_this_action", "customer_reply"])
        );
    }
}
