//! The paper's scripted validation agents (A.1) and the oracle matcher and
//! compiler, which read the generator instead of calling a model.

use serde::{Deserialize, Serialize};

use super::{Agent, CallCost, Compiler, Match, Matcher, Oracle, Reply};
use crate::backend::Message;
use crate::ladder::arms::gate::{CompiledGraph, CompiledRevision};
use crate::ladder::episode::{Episode, Protocol, StepId, Turn};
use crate::ladder::prompts as p;
use crate::ladder::score::Label;

/// The scripted agents of A.1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scripted {
    /// Replays ground truth: executes exactly what the realized state asks.
    Perfect,
    /// Memoryless: books every request that names a step.
    AlwaysBook,
}

impl std::str::FromStr for Scripted {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "perfect" => Ok(Scripted::Perfect),
            "always-book" => Ok(Scripted::AlwaysBook),
            _ => Err(format!(
                "unknown scripted agent '{s}' (expected perfect or always-book)"
            )),
        }
    }
}

/// The booking line a scripted agent writes for a step on this turn.
fn booking(ep: &Episode, turn: &Turn, step: StepId) -> String {
    let s = ep.step(step);
    match ep.config.protocol {
        Protocol::Text => format!("ref {}/{}", s.code, turn.work_order),
        Protocol::Tool => format!(
            "ACTION {{\"tool\": \"{}\", \"work_order\": \"{}\"}}",
            s.tool, turn.work_order
        ),
    }
}

impl Agent for Scripted {
    fn name(&self) -> String {
        match self {
            Scripted::Perfect => "scripted:perfect".into(),
            Scripted::AlwaysBook => "scripted:always-book".into(),
        }
    }

    fn reply(&mut self, _messages: &[Message], o: &Oracle) -> Reply {
        let ep = o.episode;
        let text = if o.reprompt {
            // The gate refused the booking: acknowledge without booking again.
            "Understood -- that work was not booked.".to_string()
        } else {
            match self {
                Scripted::Perfect => match o.label {
                    Label::Execute { step } | Label::Redo { step } => format!(
                        "Done: {}.\n{}",
                        ep.step(*step).wording,
                        booking(ep, o.turn, *step)
                    ),
                    Label::Confirm { step } => {
                        format!("{step} is already complete; nothing new to book.")
                    }
                    Label::Blocked { step, missing } => {
                        let m: Vec<String> = missing.iter().map(|u| u.to_string()).collect();
                        format!("{step} is waiting on {}.", m.join(", "))
                    }
                    Label::Decline { step } => format!("{step} was cancelled; declining."),
                    Label::Nothing => p::SCRIPTED_ACK.to_string(),
                },
                Scripted::AlwaysBook => match o.turn.step.or(o.turn.named.first().copied()) {
                    Some(step) => format!("On it.\n{}", booking(ep, o.turn, step)),
                    None => p::SCRIPTED_ACK.to_string(),
                },
            }
        };
        Reply {
            text,
            ..Default::default()
        }
    }
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
