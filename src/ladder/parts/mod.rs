//! The agent side of a turn: the conversation an arm builds, the [`Agent`]
//! trait, and the paper's scripted validation agents (A.1).
//!
//! A model-backed agent reads only the prompt. The scripted agents also read
//! the [`Oracle`] — the episode, the turn and the realized state — because
//! they are the paper's validation suites, not agents under test.

use serde::{Deserialize, Serialize};

use super::episode::{Episode, Protocol, Turn};
use super::protocol as p;
use super::scorer::Label;
use super::state::TaskState;

pub use crate::backend::{Message, Role};

/// What scripted agents may read besides the prompt.
#[derive(Debug, Clone, Copy)]
pub struct Oracle<'a> {
    /// The episode.
    pub episode: &'a Episode,
    /// The current turn.
    pub turn: &'a Turn,
    /// The realized ground-truth state at the start of the turn (α set).
    pub truth: &'a TaskState,
    /// The ground-truth label of the turn.
    pub label: &'a Label,
    /// Whether this call is the same-turn re-prompt after a rejection.
    pub reprompt: bool,
}

pub use crate::backend::Usage;

impl Usage {
    /// Adds another call's accounting (sums over a turn, an episode, an arm).
    pub fn add(&mut self, o: &Usage) {
        self.prompt_tokens += o.prompt_tokens;
        self.cached_tokens += o.cached_tokens;
        self.completion_tokens += o.completion_tokens;
        self.prefill_secs += o.prefill_secs;
        self.decode_secs += o.decode_secs;
    }
}

/// The agent's reply.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    /// Visible text.
    pub text: String,
    /// Accounting.
    pub usage: Usage,
    /// An error the call ended in (scored as an empty reply).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// An agent under test or a scripted validation agent.
pub trait Agent {
    /// Identity for the run manifest.
    fn name(&self) -> String;
    /// Replies to the conversation (system prompt first).
    fn reply(&mut self, messages: &[Message], oracle: &Oracle) -> Reply;
}

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
fn booking(ep: &Episode, turn: &Turn, step: super::episode::StepId) -> String {
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
