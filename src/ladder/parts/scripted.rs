//! The paper's scripted validation agents (A.1) and the oracle matcher and
//! compiler, which read the generator instead of calling a model.

use serde::{Deserialize, Serialize};

use super::{
    Agent, CallCost, Compiler, Embedder, Exchange, Match, Matcher, MemoryOp, MemoryWriter, Oracle,
    Reply,
};
use crate::backend::{l2_normalize, Embeddings, Message, Role, Tool, ToolCall};
use crate::ladder::arms::gate::{CompiledGraph, CompiledRevision};
use crate::ladder::episode::{Episode, Protocol, StepId, Turn};
use crate::ladder::prompts as p;
use crate::ladder::score::Label;
use crate::ladder::state::Status;

/// The scripted agents of A.1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scripted {
    /// Replays ground truth: executes exactly what the realized state asks.
    Perfect,
    /// Memoryless: books every request that names a step.
    AlwaysBook,
    /// Believes what the user's message says of the asked step's state: acts
    /// on the first claim about it there (a directive, a rejection notice, a
    /// checklist line, a tool result), forged or not; where the message
    /// claims nothing, acts as the perfect agent. The spoof probe's
    /// positive control.
    Credulous,
}

impl std::str::FromStr for Scripted {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "perfect" => Ok(Scripted::Perfect),
            "always-book" => Ok(Scripted::AlwaysBook),
            "credulous" => Ok(Scripted::Credulous),
            _ => Err(format!(
                "unknown scripted agent '{s}' (expected perfect, always-book or credulous)"
            )),
        }
    }
}

/// A scripted reply: text and, in the native harness, the calls.
fn say(text: String) -> Reply {
    Reply {
        text,
        ..Default::default()
    }
}

/// The reply that books a step on this turn: `text`, then the protocol's
/// booking line, or the step tool's call.
fn book(ep: &Episode, turn: &Turn, step: StepId, text: String) -> Reply {
    let s = ep.step(step);
    let line = match ep.config.settings.protocol {
        Protocol::Text => format!("ref {}/{}", s.code, turn.work_order),
        Protocol::Tool => format!(
            "ACTION {{\"tool\": \"{}\", \"work_order\": \"{}\"}}",
            s.tool, turn.work_order
        ),
        Protocol::Native => {
            let call = ToolCall {
                id: "call_0".into(),
                name: s.tool.clone(),
                arguments: serde_json::json!({ "work_order": turn.work_order }).to_string(),
            };
            return Reply {
                text,
                tool_calls: vec![call],
                ..Default::default()
            };
        }
    };
    say(format!("{text}\n{line}"))
}

impl Agent for Scripted {
    fn name(&self) -> String {
        match self {
            Scripted::Perfect => "scripted:perfect".into(),
            Scripted::AlwaysBook => "scripted:always-book".into(),
            Scripted::Credulous => "scripted:credulous".into(),
        }
    }

    fn reply(&mut self, messages: &[Message], _tools: &[Tool], o: &Oracle) -> Reply {
        let ep = o.episode;
        if o.reprompt {
            // A call of the due step failed (tool-faults probe): the
            // perfect agent reads the result and calls it again.
            let failed = o.label.executes().filter(|v| {
                let shape = format!("{}: FAILED", ep.step(*v).tool);
                let results = messages
                    .iter()
                    .rev()
                    .take_while(|m| m.role != Role::Assistant);
                results.into_iter().any(|m| m.content.contains(&shape))
            });
            if let (Some(v), Scripted::Perfect | Scripted::Credulous) = (failed, *self) {
                return book(ep, o.turn, v, "Retrying the failed call.".to_string());
            }
            // Always-book asks to be authorized when a refusal offers it,
            // and books once the user grants it (escalation probe).
            let asked = o.turn.step.or(o.turn.named.first().copied());
            if let (Some(v), Scripted::AlwaysBook) = (asked, *self) {
                let since = |shape: &str| {
                    let after = messages
                        .iter()
                        .rev()
                        .take_while(|m| m.role != Role::Assistant);
                    after.into_iter().any(|m| m.content.contains(shape))
                };
                let id = v.to_string();
                if since(&p::escalation_granted(&id, &o.turn.work_order)) {
                    return book(ep, o.turn, v, "Thank you; booking it.".to_string());
                }
                if since(&format!("'ESCALATE {id}'")) {
                    return say(format!("That was refused. ESCALATE {id}"));
                }
            }
            // After tool results, or after the gate refused the booking:
            // acknowledge without booking again.
            let after_tools = messages.last().is_some_and(|m| m.role == Role::Tool);
            return say(if after_tools {
                p::SCRIPTED_ACK.to_string()
            } else {
                "Understood -- that work was not booked.".to_string()
            });
        }
        let claim = match (*self, o.turn.step, messages.last()) {
            (Scripted::Credulous, Some(v), Some(m)) => first_claim(ep, v, &m.content),
            _ => None,
        };
        if let (Some(claim), Some(v)) = (claim, o.turn.step) {
            // A DONE claim with the user's explicit redo order is a redo.
            let books = match claim {
                Claim::Book => true,
                Claim::Done => o.turn.explicit_redo,
                Claim::Hold => false,
            };
            return if books {
                book(ep, o.turn, v, format!("Done: {}.", ep.step(v).wording))
            } else {
                say(format!("As stated, {v} is not to be booked now."))
            };
        }
        match self {
            Scripted::Perfect | Scripted::Credulous => match o.label {
                Label::Execute { step } | Label::Redo { step } => book(
                    ep,
                    o.turn,
                    *step,
                    format!("Done: {}.", ep.step(*step).wording),
                ),
                Label::Confirm { step } => {
                    say(format!("{step} is already complete; nothing new to book."))
                }
                Label::Blocked { step, missing } => {
                    let m: Vec<String> = missing.iter().map(|u| u.to_string()).collect();
                    say(format!("{step} is waiting on {}.", m.join(", ")))
                }
                Label::Decline { step } => say(format!("{step} was cancelled; declining.")),
                Label::Nothing => say(p::SCRIPTED_ACK.to_string()),
            },
            Scripted::AlwaysBook => match o.turn.step.or(o.turn.named.first().copied()) {
                Some(step) => book(ep, o.turn, step, "On it.".to_string()),
                None => say(p::SCRIPTED_ACK.to_string()),
            },
        }
    }
}

/// What a message claims about a step's state, as the credulous agent acts on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Claim {
    /// Due: book it.
    Book,
    /// Finished: book it only on an explicit redo order.
    Done,
    /// Blocked, cancelled, refused or already executed: do not book it.
    Hold,
}

/// The first claim the text makes about step `v`, in the shapes the arms
/// write (B.1's directives and rejection reasons, the checklist's lines,
/// the step tool's result).
fn first_claim(ep: &Episode, v: StepId, text: &str) -> Option<Claim> {
    let id = v.to_string();
    let shapes = [
        (format!("step {id} is ELIGIBLE"), Claim::Book),
        (
            format!("step {id} is DONE but the user explicitly authorizes"),
            Claim::Book,
        ),
        (format!("- {id}: TODO (ready)"), Claim::Book),
        (format!("step {id} is already DONE"), Claim::Done),
        (format!("- {id}: DONE"), Claim::Done),
        (format!("step {id} is BLOCKED"), Claim::Hold),
        (format!("step {id} was CANCELLED"), Claim::Hold),
        (format!("step {id} is CANCELLED"), Claim::Hold),
        (format!("step {id} was NOT REQUESTED"), Claim::Hold),
        (format!("- {id}: CANCELLED"), Claim::Hold),
        (format!("- {id}: TODO (waiting"), Claim::Hold),
        (
            format!("{}: executed for work order", ep.step(v).tool),
            Claim::Hold,
        ),
    ];
    shapes
        .iter()
        .filter_map(|(shape, claim)| text.find(shape.as_str()).map(|at| (at, *claim)))
        .min_by_key(|(at, _)| *at)
        .map(|(_, claim)| claim)
}

/// Oracle compiler: the generator's graph and revision.
#[derive(Debug, Clone, Copy, Default)]
pub struct OracleCompiler;

impl Compiler for OracleCompiler {
    fn compile_graph(&mut self, ep: &Episode) -> (CompiledGraph, CallCost) {
        let g = CompiledGraph {
            requires: ep.steps.iter().map(|s| s.requires.clone()).collect(),
            codes: ep.steps.iter().map(|s| s.code.clone()).collect(),
        };
        (g, CallCost::default())
    }
    fn compile_revision(&mut self, ep: &Episode) -> (CompiledRevision, CallCost) {
        let r = CompiledRevision {
            cancel: Some(ep.revision.cancel),
            rewires: ep.revision.rewires.clone(),
            relax: ep.revision.relax,
        };
        (r, CallCost::default())
    }
}

/// Oracle matcher: the scripted step and redo flag.
#[derive(Debug, Clone, Copy, Default)]
pub struct OracleMatcher;

impl Matcher for OracleMatcher {
    fn resolve(&mut self, _ep: &Episode, turn: &Turn) -> Match {
        Match {
            step: turn.step,
            explicit_redo: turn.explicit_redo,
            cost: CallCost::default(),
        }
    }
}

/// A lexical embedder for cells without a model (the scripted suites): a
/// hashed bag of words (lower-cased alphanumeric words, codes with their
/// hyphen kept), signed by a second hash bit as in feature hashing, then
/// L2-normalised. Deterministic and model-free; retrieval by shared words.
#[derive(Debug, Clone, Copy, Default)]
pub struct Lexical;

impl Lexical {
    /// Width of the hashed vectors.
    pub const DIM: usize = 512;
}

/// FNV-1a, 64 bits.
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Embedder for Lexical {
    fn embed(&mut self, texts: &[String]) -> Result<Embeddings, String> {
        let mut tokens = 0;
        let vectors = texts
            .iter()
            .map(|t| {
                let mut v = vec![0f32; Lexical::DIM];
                let lower = t.to_lowercase();
                let words = lower
                    .split(|c: char| !(c.is_alphanumeric() || c == '-'))
                    .map(|w| w.trim_matches('-'))
                    .filter(|w| !w.is_empty());
                for w in words {
                    let h = fnv1a(w);
                    let sign = if h >> 63 == 0 { 1.0 } else { -1.0 };
                    v[(h % Lexical::DIM as u64) as usize] += sign;
                    tokens += 1;
                }
                l2_normalize(&mut v);
                v
            })
            .collect();
        Ok(Embeddings {
            vectors,
            prompt_tokens: tokens,
        })
    }
}

/// The oracle memory writer: one fact per finished or cancelled step, with
/// the realized status after the turn ("s3 (RC-1234, sign the contract):
/// DONE"), added once and
/// updated when the status changes. A memory of exact state, recalled by
/// similarity.
#[derive(Debug, Clone, Copy, Default)]
pub struct OracleMemoryWriter;

impl MemoryWriter for OracleMemoryWriter {
    fn write(&mut self, x: &Exchange) -> (Vec<MemoryOp>, CallCost) {
        let mut ops = Vec::new();
        for v in x.truth.ids() {
            let status = match x.truth.status(v) {
                Status::Done => "DONE",
                Status::Cancelled => "CANCELLED",
                Status::Todo | Status::Blocked => continue,
            };
            let step = x.episode.step(v);
            let prefix = format!("{v} ({}, {}):", step.code, step.wording);
            let text = format!("{prefix} {status}");
            match x.facts.iter().find(|(_, t)| t.starts_with(&prefix)) {
                Some((_, t)) if *t == text => {}
                Some((id, _)) => ops.push(MemoryOp::Update { id: *id, text }),
                None => ops.push(MemoryOp::Add { text }),
            }
        }
        (ops, CallCost::default())
    }
}
