//! What one episode leaves behind: the line `tau2 run` appends to its log
//! and everything `tau2 report` reads. The evaluator re-scores it without a
//! model (its executed calls and the agent's texts are all it needs).

use serde::{Deserialize, Serialize};

use super::rules::{MatcherRead, ToRead};
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
    /// The user simulator's reply was not a message a user can send (τ²'s
    /// `user_error`): tool calls and no text. The model's own doing, so a
    /// finished episode, scored 0, not run again.
    UserError,
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
    /// `backend_error`; what the simulator sent, on `user_error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The matcher's readings of the conversation for the rule arm's
    /// judgement of writes (`--receipts model`), in call order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub readings: Vec<Reading>,
    /// What [`EpisodeRecord::bounded`] cut to keep the line readable.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cut: Vec<Cut>,
}

/// One matcher reading: what it was asked for which call, what it said,
/// what the rules took, and the lexical reading of the same receipts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reading {
    /// The call it was read for (its index in `calls`).
    pub call: usize,
    /// What was asked: the confirmation, the reason, or both.
    pub asked: ToRead,
    /// The request's user message (the system message is
    /// `prompts::READER_SYSTEM`).
    pub prompt: String,
    /// The matcher's reply, thinking removed.
    pub reply: String,
    /// What the rules took: the reply as read, or on an unreadable reply
    /// no confirmation and no reason.
    pub read: MatcherRead,
    /// The lexical reading of the same receipts.
    pub lexical: MatcherRead,
    /// Why the reply could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub usage: Usage,
}

/// One part of a record shortened when it was written: where (a path into
/// the record, such as `messages[3].content` or `calls[0].arguments.name`)
/// and how many bytes it had.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cut {
    pub at: String,
    pub bytes: usize,
}

/// Most bytes a written episode line may take: half the run directory's
/// line cap, so that every line its reader meets is one it reads.
pub const RECORD_CAP: usize = crate::rundir::LINE_CAP / 2;

/// Text caps tried in turn, longest first: each text of the record (a
/// message, a call's argument string, an error) is cut to the first that
/// brings the line under [`RECORD_CAP`]. A model's 400-token reply is far
/// below the first; only hostile replies or data are ever cut.
const TEXT_CAPS: [usize; 3] = [64 << 10, 4 << 10, 256];

/// Messages kept from each end when even the shortest texts leave the line
/// too long (a reply with thousands of calls).
const ENDS_KEPT: usize = 16;

fn cut_text(text: &mut String, cap: usize, at: impl FnOnce() -> String, cuts: &mut Vec<Cut>) {
    if text.len() <= cap {
        return;
    }
    cuts.push(Cut {
        at: at(),
        bytes: text.len(),
    });
    let mut end = cap;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
}

/// Cuts every string in a JSON value (keys stay: they are the tool's).
fn cut_value(v: &mut serde_json::Value, cap: usize, at: &str, cuts: &mut Vec<Cut>) {
    match v {
        serde_json::Value::String(s) => cut_text(s, cap, || at.to_string(), cuts),
        serde_json::Value::Array(items) => {
            for (i, x) in items.iter_mut().enumerate() {
                cut_value(x, cap, &format!("{at}[{i}]"), cuts);
            }
        }
        serde_json::Value::Object(map) => {
            for (k, x) in map.iter_mut() {
                cut_value(x, cap, &format!("{at}.{k}"), cuts);
            }
        }
        _ => {}
    }
}

fn line_len(r: &EpisodeRecord) -> usize {
    serde_json::to_vec(r).map_or(usize::MAX, |v| v.len())
}

impl EpisodeRecord {
    /// A write the reference rules forbid ran and changed the database (one
    /// that raised a tool error changed nothing).
    pub fn wrongful_write(&self) -> bool {
        self.calls
            .iter()
            .any(|c| c.write && c.executed && !c.error && !c.violates.is_empty())
    }

    /// The record as it is written: within [`RECORD_CAP`] bytes, each text
    /// cut to the longest of `TEXT_CAPS` that fits, and as a last resort
    /// the middle of the conversation left out; every cut listed in `cut`.
    /// The reward was computed before, on the whole record; a re-score of a
    /// cut record replays the cut arguments.
    pub fn bounded(self) -> EpisodeRecord {
        if line_len(&self) <= RECORD_CAP {
            return self;
        }
        let shortened = |cap| {
            let mut r = self.clone();
            r.cut_texts(cap);
            r
        };
        let mut r = shortened(TEXT_CAPS[0]);
        for &cap in &TEXT_CAPS[1..] {
            if line_len(&r) <= RECORD_CAP {
                return r;
            }
            r = shortened(cap);
        }
        let n = r.messages.len();
        if n > 2 * ENDS_KEPT {
            let dropped: usize = r.messages[ENDS_KEPT..n - ENDS_KEPT]
                .iter()
                .map(|m| serde_json::to_vec(m).map_or(0, |v| v.len()))
                .sum();
            r.messages.drain(ENDS_KEPT..n - ENDS_KEPT);
            r.cut.push(Cut {
                at: format!("messages[{ENDS_KEPT}..{}]", n - ENDS_KEPT),
                bytes: dropped,
            });
        }
        if line_len(&r) > RECORD_CAP {
            // Thousands of calls: keep the writes, which the evaluator
            // replays, and say how many reads went.
            let before = r.calls.len();
            r.calls.retain(|c| c.write);
            r.cut.push(Cut {
                at: format!("calls (reads: {} of {before})", before - r.calls.len()),
                bytes: 0,
            });
            r.messages.truncate(ENDS_KEPT);
        }
        r
    }

    fn cut_texts(&mut self, cap: usize) {
        let cuts = &mut self.cut;
        for (i, m) in self.messages.iter_mut().enumerate() {
            cut_text(
                &mut m.content,
                cap,
                || format!("messages[{i}].content"),
                cuts,
            );
            for (j, c) in m.tool_calls.iter_mut().enumerate() {
                cut_text(
                    &mut c.arguments,
                    cap,
                    || format!("messages[{i}].tool_calls[{j}].arguments"),
                    cuts,
                );
                cut_text(
                    &mut c.name,
                    cap,
                    || format!("messages[{i}].tool_calls[{j}].name"),
                    cuts,
                );
            }
        }
        for (i, c) in self.calls.iter_mut().enumerate() {
            cut_value(
                &mut c.arguments,
                cap,
                &format!("calls[{i}].arguments"),
                cuts,
            );
            cut_text(&mut c.name, cap, || format!("calls[{i}].name"), cuts);
        }
        if let Some(e) = self.error.as_mut() {
            cut_text(e, cap, || "error".into(), cuts);
        }
        for (i, r) in self.readings.iter_mut().enumerate() {
            cut_text(&mut r.prompt, cap, || format!("readings[{i}].prompt"), cuts);
            cut_text(&mut r.reply, cap, || format!("readings[{i}].reply"), cuts);
        }
    }

    pub fn key(&self) -> (String, Arm, u32) {
        (self.task_id.clone(), self.arm, self.trial)
    }
}
