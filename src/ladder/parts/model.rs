//! Model-backed agent, matcher and compiler: the B.1 prompts sent to the
//! agent model through a served backend, with the paper's budgets (Table 6).
//!
//! Budgets: reply 400 tokens (no-think) or 2,500 (thinking), doubled up to
//! 12,000 while a thinking reply comes back with empty content; on context
//! overflow the budget is halved, never below 512 (a budget already at or
//! below 512 gives up and the turn is scored as an empty reply). Matcher 200
//! / 2,500, compiler 3,000 / 6,000. Temperature 0.

use serde_json::Value;

use super::{
    Agent, CallCost, Compiler, Embedder, Exchange, Match, Matcher, MemoryOp, MemoryWriter, Oracle,
    Reply,
};
use crate::backend::shared::{Client, Conversation};
use crate::backend::{
    first_json_object, split_tool_calls, BackendError, ChatReply, ChatRequest, Embeddings, Message,
    Role, Tool, Usage,
};
use crate::ladder::arms::gate::{CompiledGraph, CompiledRevision};
use crate::ladder::episode::{Episode, StepId, Turn};
use crate::ladder::prompts as p;

/// Token budgets of one regime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Budgets {
    /// Reply budget.
    pub reply: usize,
    /// Ceiling of the empty-thinking doubling.
    pub reply_ceiling: usize,
    /// Floor of the overflow halving.
    pub overflow_floor: usize,
    /// Matcher budget.
    pub matcher: usize,
    /// Compiler budget.
    pub compiler: usize,
}

impl Budgets {
    /// The paper's budgets for a regime.
    pub fn for_regime(thinking: bool) -> Self {
        Budgets {
            reply: if thinking { 2500 } else { 400 },
            reply_ceiling: 12_000,
            overflow_floor: 512,
            matcher: if thinking { 2500 } else { 200 },
            compiler: if thinking { 6000 } else { 3000 },
        }
    }
}

/// One greedy call with the doubling and halving rules; returns the reply
/// (or the error that ended it) and the summed usage of every attempt.
fn call(
    session: &Conversation,
    messages: Vec<Message>,
    tools: &[Tool],
    budget: usize,
    b: &Budgets,
    thinking: bool,
) -> (Result<ChatReply, BackendError>, Usage) {
    let mut usage = Usage::default();
    let mut max = budget;
    loop {
        let req = ChatRequest {
            messages: messages.clone(),
            max_tokens: max,
            stop: Vec::new(),
            thinking,
            temperature: 0.0,
            seed: 0,
            tools: tools.to_vec(),
            logprobs: None,
            constraint: None,
            prompt_text: None,
            prompt_ids: None,
            prompt_logprobs: None,
            sampling: Default::default(),
        };
        match session.chat(req) {
            Ok(r) => {
                usage += r.usage;
                if thinking && r.content.trim().is_empty() && max < b.reply_ceiling {
                    max = (max * 2).min(b.reply_ceiling);
                    continue;
                }
                return (Ok(r), usage);
            }
            Err(BackendError::ContextOverflow { .. }) if max > b.overflow_floor => {
                max = (max / 2).max(b.overflow_floor);
            }
            Err(e) => return (Err(e), usage),
        }
    }
}

/// The agent under test: the arm's messages sent to the model.
pub struct ModelAgent {
    session: Conversation,
    thinking: bool,
    budgets: Budgets,
    name: String,
    /// The first error that says the model itself cannot run.
    broken: Option<String>,
}

impl ModelAgent {
    /// An agent on a fresh conversation of the served model.
    pub fn new(client: &Client, thinking: bool, name: String) -> Result<Self, BackendError> {
        Ok(ModelAgent {
            session: client.open()?,
            thinking,
            budgets: Budgets::for_regime(thinking),
            name,
            broken: None,
        })
    }
}

impl Agent for ModelAgent {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn reply(&mut self, messages: &[Message], tools: &[Tool], _oracle: &Oracle) -> Reply {
        let (r, usage) = call(
            &self.session,
            messages.to_vec(),
            tools,
            self.budgets.reply,
            &self.budgets,
            self.thinking,
        );
        match r {
            // A server without a tool-call parser returns the calls as
            // text: read them as the engine does.
            Ok(r) if !tools.is_empty() && r.tool_calls.is_empty() => {
                let (text, tool_calls) = split_tool_calls(&r.content);
                Reply {
                    text,
                    tool_calls,
                    usage,
                    ..Default::default()
                }
            }
            Ok(r) => Reply {
                text: r.content,
                tool_calls: r.tool_calls,
                usage,
                ..Default::default()
            },
            Err(e) => {
                // A failed forward step (device error, non-finite values)
                // is the model's failure, not this turn's.
                if matches!(
                    e,
                    BackendError::StepFailed { .. } | BackendError::Device { .. }
                ) {
                    self.broken.get_or_insert_with(|| crate::one_line(&e));
                }
                Reply {
                    usage,
                    outgrown: matches!(e, BackendError::ContextOverflow { .. }),
                    error: Some(crate::one_line(&e)),
                    ..Default::default()
                }
            }
        }
    }

    fn broken(&self) -> Option<&str> {
        self.broken.as_deref()
    }
}

/// Why a matcher or compiler reply could not be used. The text is logged
/// (`attempt N: …` in the call's cost), so it stays as it reads here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("no JSON object in the reply")]
    NoJson,
    #[error("missing \"{0}\"")]
    Missing(&'static str),
    #[error("missing \"steps\" object")]
    NoSteps,
    #[error("'{0}' is not a step of this plan")]
    NotAStep(String),
    #[error("step must be a string or null, got {0}")]
    StepType(Value),
    #[error("explicit_redo must be true or false, got {0}")]
    RedoType(Value),
    #[error("missing \"memory\" list")]
    NoMemory,
    #[error("memory[{0}]: {1}")]
    Op(usize, String),
}

fn step_of(v: &Value, n: usize) -> Result<Option<StepId>, ParseError> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) if s.eq_ignore_ascii_case("null") || s.is_empty() => Ok(None),
        Value::String(s) => match StepId::parse(s) {
            Some(id) if id.index() < n => Ok(Some(id)),
            _ => Err(ParseError::NotAStep(s.clone())),
        },
        other => Err(ParseError::StepType(other.clone())),
    }
}

/// Parses the matcher's JSON: `{"step": "sX" or null, "explicit_redo": bool}`.
pub fn parse_match(text: &str, n: usize) -> Result<(Option<StepId>, bool), ParseError> {
    let v = first_json_object(text).ok_or(ParseError::NoJson)?;
    let step = step_of(v.get("step").ok_or(ParseError::Missing("step"))?, n)?;
    let redo = match v.get("explicit_redo") {
        Some(Value::Bool(b)) => *b,
        Some(other) => return Err(ParseError::RedoType(other.clone())),
        None => return Err(ParseError::Missing("explicit_redo")),
    };
    Ok((step, redo))
}

/// Asks once, and once more with the correction if the reply does not parse.
fn ask_json<T>(
    session: &Conversation,
    prompt: String,
    budget: usize,
    b: &Budgets,
    thinking: bool,
    parse: impl Fn(&str) -> Result<T, ParseError>,
) -> (Option<T>, CallCost) {
    let mut cost = CallCost::default();
    let mut messages = vec![Message::new(Role::User, prompt)];
    for attempt in 0..2 {
        let (r, usage) = call(session, messages.clone(), &[], budget, b, thinking);
        cost.calls += 1;
        cost.prompt_tokens += usage.prompt_tokens as u64;
        cost.completion_tokens += usage.completion_tokens as u64;
        let text = match r {
            Ok(r) => r.content,
            Err(e) => {
                cost.error = Some(crate::one_line(&e));
                return (None, cost);
            }
        };
        match parse(&text) {
            Ok(v) => {
                cost.error = None;
                return (Some(v), cost);
            }
            Err(e) => {
                cost.error = Some(format!("attempt {}: {e}", attempt + 1));
                messages.push(Message::new(Role::Assistant, text));
                messages.push(Message::new(Role::User, p::JSON_CORRECTION));
            }
        }
    }
    (None, cost)
}

/// The model-backed matcher (B.1 prompt, JSON validated, one correction re-ask).
pub struct ModelMatcher {
    session: Conversation,
    thinking: bool,
    budgets: Budgets,
}

impl ModelMatcher {
    /// A matcher on its own conversation (its prompt prefix is reused across turns).
    pub fn new(client: &Client, thinking: bool) -> Result<Self, BackendError> {
        Ok(ModelMatcher {
            session: client.open()?,
            thinking,
            budgets: Budgets::for_regime(thinking),
        })
    }
}

impl Matcher for ModelMatcher {
    fn resolve(&mut self, ep: &Episode, turn: &Turn) -> Match {
        let prompt = p::matcher_prompt(&ep.step_list(), &turn.message);
        let n = ep.len();
        let (r, cost) = ask_json(
            &self.session,
            prompt,
            self.budgets.matcher,
            &self.budgets,
            self.thinking,
            |t| parse_match(t, n),
        );
        // A reply that never parses resolves to no step.
        let (step, explicit_redo) = r.unwrap_or((None, false));
        Match {
            step,
            explicit_redo,
            cost,
        }
    }
}

/// Parses the graph compiler's JSON into a plan over the episode's step ids;
/// missing steps keep no prerequisites and an empty code (errors flow into
/// the module uncorrected).
pub fn parse_graph(text: &str, n: usize) -> Result<CompiledGraph, ParseError> {
    let v = first_json_object(text).ok_or(ParseError::NoJson)?;
    let steps = v
        .get("steps")
        .and_then(Value::as_object)
        .ok_or(ParseError::NoSteps)?;
    let mut g = CompiledGraph {
        requires: vec![Vec::new(); n],
        codes: vec![String::new(); n],
    };
    for (k, entry) in steps {
        let Some(id) = StepId::parse(k).filter(|id| id.index() < n) else {
            continue;
        };
        if let Some(deps) = entry.get("deps").and_then(Value::as_array) {
            let mut d: Vec<StepId> = deps
                .iter()
                .filter_map(Value::as_str)
                .filter_map(StepId::parse)
                .filter(|u| u.index() < n)
                .collect();
            d.sort();
            d.dedup();
            g.requires[id.index()] = d;
        }
        if let Some(code) = entry.get("code").and_then(Value::as_str) {
            g.codes[id.index()] = code.trim().to_string();
        }
    }
    Ok(g)
}

/// Parses the revision compiler's JSON.
pub fn parse_revision(text: &str, n: usize) -> Result<CompiledRevision, ParseError> {
    let v = first_json_object(text).ok_or(ParseError::NoJson)?;
    let cancel = step_of(v.get("cancel").unwrap_or(&Value::Null), n)?;
    let mut rewires = Vec::new();
    if let Some(obj) = v.get("rewires").and_then(Value::as_object) {
        for (k, list) in obj {
            let Some(w) = StepId::parse(k).filter(|w| w.index() < n) else {
                continue;
            };
            let mut deps: Vec<StepId> = list
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .filter_map(StepId::parse)
                        .filter(|u| u.index() < n)
                        .collect()
                })
                .unwrap_or_default();
            deps.sort();
            deps.dedup();
            rewires.push((w, deps));
        }
    }
    rewires.sort();
    let relax = match v.get("relax") {
        Some(Value::Array(a)) if a.len() == 2 => match (step_of(&a[0], n)?, step_of(&a[1], n)?) {
            (Some(w), Some(u)) => Some((w, u)),
            _ => None,
        },
        _ => None,
    };
    Ok(CompiledRevision {
        cancel,
        rewires,
        relax,
    })
}

/// The model-backed compiler (B.1 graph and revision prompts).
pub struct ModelCompiler {
    client: Client,
    thinking: bool,
    budgets: Budgets,
}

impl ModelCompiler {
    /// A compiler on the served model.
    pub fn new(client: &Client, thinking: bool) -> Self {
        ModelCompiler {
            client: client.clone(),
            thinking,
            budgets: Budgets::for_regime(thinking),
        }
    }

    fn ask<T>(
        &self,
        prompt: String,
        parse: impl Fn(&str) -> Result<T, ParseError>,
    ) -> (Option<T>, CallCost) {
        match self.client.open() {
            Ok(session) => ask_json(
                &session,
                prompt,
                self.budgets.compiler,
                &self.budgets,
                self.thinking,
                parse,
            ),
            Err(e) => (
                None,
                CallCost {
                    error: Some(crate::one_line(&e)),
                    ..Default::default()
                },
            ),
        }
    }
}

impl Compiler for ModelCompiler {
    fn compile_graph(&mut self, ep: &Episode) -> (CompiledGraph, CallCost) {
        let n = ep.len();
        let prompt = format!("{}\n\n{}", ep.brief, p::COMPILE_GRAPH);
        let (g, cost) = self.ask(prompt, |t| parse_graph(t, n));
        let g = g.unwrap_or(CompiledGraph {
            requires: vec![Vec::new(); n],
            codes: vec![String::new(); n],
        });
        (g, cost)
    }

    fn compile_revision(&mut self, ep: &Episode) -> (CompiledRevision, CallCost) {
        let n = ep.len();
        let prompt = p::compile_revision_prompt(&ep.step_list(), &ep.revision.message);
        let (r, cost) = self.ask(prompt, |t| parse_revision(t, n));
        (r.unwrap_or_default(), cost)
    }
}

/// Parses the memory writer's JSON: `{"memory": [{"event": "ADD", "text"},
/// {"event": "UPDATE", "id", "text"}, {"event": "DELETE", "id"},
/// {"event": "NONE"}]}`; ids may be numbers or strings of digits.
pub fn parse_memory_ops(text: &str) -> Result<Vec<MemoryOp>, ParseError> {
    let v = first_json_object(text).ok_or(ParseError::NoJson)?;
    let list = v
        .get("memory")
        .and_then(Value::as_array)
        .ok_or(ParseError::NoMemory)?;
    let mut ops = Vec::new();
    for (i, o) in list.iter().enumerate() {
        let bad = |why: &str| ParseError::Op(i, why.to_string());
        let event = o
            .get("event")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("no event"))?;
        let id = || match o.get("id") {
            Some(Value::Number(n)) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
            Some(Value::String(s)) => s.trim().parse().ok(),
            _ => None,
        };
        let text = || {
            o.get("text")
                .and_then(Value::as_str)
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())
        };
        ops.push(match event.to_ascii_uppercase().as_str() {
            "ADD" => MemoryOp::Add {
                text: text().ok_or_else(|| bad("ADD without text"))?,
            },
            "UPDATE" => MemoryOp::Update {
                id: id().ok_or_else(|| bad("UPDATE without a numeric id"))?,
                text: text().ok_or_else(|| bad("UPDATE without text"))?,
            },
            "DELETE" => MemoryOp::Delete {
                id: id().ok_or_else(|| bad("DELETE without a numeric id"))?,
            },
            "NONE" => continue,
            other => return Err(bad(&format!("unknown event '{other}'"))),
        });
    }
    Ok(ops)
}

/// The Mem0-style writer on the served model: one call per exchange (one
/// correction re-ask when the JSON does not parse), its own conversation.
pub struct ModelMemoryWriter {
    session: Conversation,
    thinking: bool,
    budgets: Budgets,
}

impl ModelMemoryWriter {
    pub fn new(client: &Client, thinking: bool) -> Result<Self, BackendError> {
        Ok(ModelMemoryWriter {
            session: client.open()?,
            thinking,
            budgets: Budgets::for_regime(thinking),
        })
    }
}

impl MemoryWriter for ModelMemoryWriter {
    fn write(&mut self, x: &Exchange) -> (Vec<MemoryOp>, CallCost) {
        let prompt = p::memory_writer_prompt(x.facts, x.user, x.reply);
        let (ops, cost) = ask_json(
            &self.session,
            prompt,
            self.budgets.matcher,
            &self.budgets,
            self.thinking,
            parse_memory_ops,
        );
        (ops.unwrap_or_default(), cost)
    }
}

/// Embeddings from a served model: the agent model's own final hidden state,
/// or a separate embedding model (`--embedder`).
pub struct ModelEmbedder {
    client: Client,
}

impl ModelEmbedder {
    pub fn new(client: &Client) -> Self {
        ModelEmbedder {
            client: client.clone(),
        }
    }
}

impl Embedder for ModelEmbedder {
    fn embed(&mut self, texts: &[String]) -> Result<Embeddings, String> {
        self.client
            .embed(texts.to_vec())
            .map_err(|e| crate::one_line(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matcher_json_is_validated() {
        assert_eq!(
            parse_match(
                "```json\n{\"step\": \"s3\", \"explicit_redo\": false}\n```",
                5
            ),
            Ok((Some(StepId(2)), false))
        );
        assert_eq!(
            parse_match("{\"step\": null, \"explicit_redo\": true}", 5),
            Ok((None, true))
        );
        assert!(parse_match("{\"step\": \"s9\", \"explicit_redo\": false}", 5).is_err());
        assert!(parse_match("{\"step\": \"s1\"}", 5).is_err());
        assert!(parse_match("s1, no redo", 5).is_err());
        assert!(parse_match("{\"step\": \"s1\", \"explicit_redo\": \"no\"}", 5).is_err());
    }

    #[test]
    fn graph_json_flows_errors_in_uncorrected() {
        let g = parse_graph(
            "Here: {\"steps\": {\"s1\": {\"deps\": [], \"code\": \"RC-1111\"}, \"s2\": {\"deps\": [\"s1\", \"s9\"], \"code\": \"RC-2222\"}, \"s7\": {}}}",
            3,
        )
        .unwrap();
        assert_eq!(g.requires, vec![vec![], vec![StepId(0)], vec![]]);
        assert_eq!(g.codes, vec!["RC-1111", "RC-2222", ""]);
        assert!(parse_graph("{\"plan\": 1}", 3).is_err());
    }

    #[test]
    fn revision_json() {
        let r = parse_revision(
            "{\"cancel\": \"s2\", \"rewires\": {\"s3\": [\"s1\"]}, \"relax\": [\"s4\", \"s1\"]}",
            4,
        )
        .unwrap();
        assert_eq!(r.cancel, Some(StepId(1)));
        assert_eq!(r.rewires, vec![(StepId(2), vec![StepId(0)])]);
        assert_eq!(r.relax, Some((StepId(3), StepId(0))));
        let r =
            parse_revision("{\"cancel\": \"s2\", \"rewires\": {}, \"relax\": null}", 4).unwrap();
        assert_eq!(r.relax, None);
    }
}
