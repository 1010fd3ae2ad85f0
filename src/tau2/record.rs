//! What one episode leaves behind: the line `tau2 run` appends to its log
//! and everything `tau2 report` reads. The evaluator re-scores it without a
//! model (its executed calls and the agent's texts are all it needs).

use serde::{Deserialize, Serialize};

use crate::backend::{Message, Usage};

/// How strongly the airline policy acts at tool dispatch (the ladder's
/// rungs, paper §5.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[derive(clap::ValueEnum)]
pub enum Arm {
    /// The agent as τ² runs it: policy in the system prompt, nothing else.
    Raw,
    /// The compiled rules' verdicts for the current state rendered in each
    /// agent turn.
    Shown,
    /// A write the rules refuse gets a warning instead of running; the same
    /// call issued again runs.
    Notice,
    /// A write the rules refuse returns the refusal as its tool result and
    /// changes nothing.
    Gate,
}

impl Arm {
    pub const ALL: [Arm; 4] = [Arm::Raw, Arm::Shown, Arm::Notice, Arm::Gate];

    pub fn name(self) -> &'static str {
        match self {
            Arm::Raw => "raw",
            Arm::Shown => "shown",
            Arm::Notice => "notice",
            Arm::Gate => "gate",
        }
    }

    /// Whether the arm needs a compiled rule set.
    pub fn uses_rules(self) -> bool {
        self != Arm::Raw
    }
}

/// A tool call the agent made, in order, and what became of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallRecord {
    pub name: String,
    /// The arguments as the agent wrote them (an object when well formed;
    /// a JSON string holding the raw text when they did not parse).
    pub arguments: serde_json::Value,
    /// One of τ²'s six writes.
    pub write: bool,
    /// The environment ran it (false: refused by the gate, or held back by
    /// a notice). Only executed calls are replayed by the evaluator.
    pub executed: bool,
    /// The tool raised an error (τ²'s `Error: …` result).
    pub error: bool,
    /// Rules of the arm's rule set that refused it at dispatch (empty on
    /// raw, or when none refused).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused_by: Vec<String>,
    /// Rules of the hand-written reference rule set that the call breaks,
    /// judged at dispatch on every arm: an executed write with any is a
    /// wrongful write.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub violates: Vec<String>,
}

/// Why the conversation ended (τ²'s termination reasons).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Termination {
    /// The user simulator said `###STOP###`.
    UserStop,
    /// The user simulator said `###TRANSFER###` (after the agent's
    /// `transfer_to_human_agents`, which itself ends nothing, as in τ²).
    Transfer,
    /// The user simulator said `###OUT-OF-SCOPE###`.
    OutOfScope,
    /// The step limit was reached.
    MaxSteps,
    /// Too many tool errors.
    TooManyErrors,
    /// A model call failed (the episode is run again on resume).
    BackendError,
}

/// The evaluator's verdict on one episode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reward {
    /// Product over the task's reward basis.
    pub reward: f64,
    /// The replayed database equals the gold one (None when DB is not in the
    /// basis).
    pub db_match: Option<bool>,
    /// Each COMMUNICATE string found in an agent message, in task order.
    pub communicated: Vec<bool>,
}

/// One episode: a task, an arm, a trial.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpisodeRecord {
    pub task_id: String,
    pub arm: Arm,
    pub trial: u32,
    pub seed: u64,
    /// Which compiled rule set the arm used (index into the run's compiles),
    /// None on raw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<usize>,
    pub termination: Termination,
    /// The agent's side of the conversation as it was sent (system prompt
    /// first), thinking stripped.
    pub messages: Vec<Message>,
    pub calls: Vec<CallRecord>,
    pub reward: Reward,
    /// Agent and user-simulator token accounting, summed over the episode.
    pub agent_usage: Usage,
    pub user_usage: Usage,
    /// Agent turns (model calls) and wall-clock seconds.
    pub agent_turns: u32,
    pub secs: f64,
    /// The last failed model call's message, when `termination` is
    /// `backend_error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl EpisodeRecord {
    /// A write the reference rules forbid ran and changed the database (one
    /// that raised a tool error changed nothing).
    pub fn wrongful_write(&self) -> bool {
        self.calls
            .iter()
            .any(|c| c.write && c.executed && !c.error && !c.violates.is_empty())
    }

    pub fn key(&self) -> (String, Arm, u32) {
        (self.task_id.clone(), self.arm, self.trial)
    }
}
