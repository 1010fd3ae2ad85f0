//! The scorer: turn labels from the realized state and the six error channels
//! (paper §3.1, §4.2, D.2). It never calls a model.
//!
//! Ground truth is dynamic: the generator's graph, revised at the revision
//! turn, advanced by the steps the agent actually executed. A turn's label is
//! computed from that state at the start of the turn; the steps executed on
//! the turn are judged against the same start-of-turn state.
//!
//! Channel precedence for an executed step x, so the six channels partition
//! every violation: cancelled → superseded; done without authorization →
//! re-execution; blocked → premature; otherwise, if x is not the requested
//! step → unrequested. A requested step that should have been executed and
//! was not → refused redo when its redo was authorized, omission otherwise.

pub mod channels;
pub mod compile;

use serde::{Deserialize, Serialize};

use super::episode::generator::{apply_revision, initial_state};
use super::episode::{Episode, StepId, Turn, TurnKind};
use super::state::{Status, TaskState};
pub use channels::{Channel, ChannelCounts, Violation};

/// What the turn asks of the agent, from the realized state (§3.1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "label", rename_all = "snake_case")]
pub enum Label {
    /// Execute the eligible step exactly once.
    Execute { step: StepId },
    /// Execute the finished step again: its redo is authorized.
    Redo { step: StepId },
    /// Confirm completion; execute nothing.
    Confirm { step: StepId },
    /// Name the missing prerequisites; execute nothing.
    Blocked {
        step: StepId,
        /// Its missing prerequisites.
        missing: Vec<StepId>,
    },
    /// Decline the cancelled step; execute nothing.
    Decline { step: StepId },
    /// Execute nothing (filler, revision, ambiguous probe).
    Nothing,
}

impl Label {
    /// What the perfect agent does, in words.
    pub fn describe(&self) -> String {
        let ids = |v: &[StepId]| {
            v.iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            Label::Execute { step } => format!("execute {step}"),
            Label::Redo { step } => format!("execute {step} again (authorized)"),
            Label::Confirm { step } => format!("confirm {step} done, book nothing"),
            Label::Blocked { step, missing } => {
                format!("{step} blocked on {}, book nothing", ids(missing))
            }
            Label::Decline { step } => format!("decline cancelled {step}"),
            Label::Nothing => "book nothing".into(),
        }
    }

    /// Whether the correct response executes the step.
    pub fn executes(&self) -> Option<StepId> {
        match self {
            Label::Execute { step } | Label::Redo { step } => Some(*step),
            _ => None,
        }
    }
}

/// The realized ground truth, advanced turn by turn; the runner and the scorer share it.
#[derive(Debug, Clone)]
pub struct Truth {
    /// The realized state.
    pub state: TaskState,
}

impl Truth {
    /// The state before the first turn.
    pub fn new(ep: &Episode) -> Self {
        Truth {
            state: initial_state(ep),
        }
    }

    /// Opens a turn: applies the revision on its turn, sets α from the script; returns the label.
    pub fn open(&mut self, ep: &Episode, turn: &Turn) -> Label {
        if turn.kind == TurnKind::Revision {
            apply_revision(&mut self.state, &ep.revision);
        }
        let alpha = match (turn.step, turn.explicit_redo) {
            (Some(v), true) => vec![v],
            _ => Vec::new(),
        };
        self.state.authorize(alpha);
        self.label(turn)
    }

    /// Adds a step to α for the opened turn: the user authorized it again.
    pub fn grant(&mut self, v: StepId) {
        if !self.state.authorized.contains(&v) {
            self.state.authorized.push(v);
        }
    }

    /// The label of a turn on the current state.
    pub fn label(&self, turn: &Turn) -> Label {
        let Some(v) = turn.step else {
            return Label::Nothing;
        };
        match self.state.status(v) {
            Status::Cancelled => Label::Decline { step: v },
            Status::Done if self.state.is_authorized(v) => Label::Redo { step: v },
            Status::Done => Label::Confirm { step: v },
            Status::Blocked => Label::Blocked {
                step: v,
                missing: self.state.missing(v),
            },
            Status::Todo => Label::Execute { step: v },
        }
    }

    /// Judges the steps executed on an opened turn, then applies them.
    pub fn close(&mut self, turn: &Turn, executed: &[StepId]) -> Vec<Violation> {
        let mut out = Vec::new();
        let mut seen: Vec<StepId> = Vec::new();
        for &x in executed {
            if seen.contains(&x) {
                continue;
            }
            seen.push(x);
            let channel = match self.state.status(x) {
                Status::Cancelled => Some(Channel::Superseded),
                Status::Done if !self.state.is_authorized(x) => Some(Channel::ReExecution),
                Status::Blocked => Some(Channel::Premature),
                _ if turn.step != Some(x) => Some(Channel::Unrequested),
                _ => None,
            };
            if let Some(channel) = channel {
                out.push(Violation { channel, step: x });
            }
        }
        if let Some(v) = turn.step {
            if self.state.may_execute(v) && !seen.contains(&v) {
                let channel = if self.state.status(v) == Status::Done {
                    Channel::RefusedRedo
                } else {
                    Channel::Omission
                };
                out.push(Violation { channel, step: v });
            }
        }
        for x in seen {
            self.state.execute(x);
        }
        out
    }
}

/// The score of one turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnScore {
    pub label: Label,
    /// Steps executed.
    pub executed: Vec<StepId>,
    pub violations: Vec<Violation>,
}

/// The score of one episode under one scoring.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpisodeScore {
    /// Per-turn scores.
    pub turns: Vec<TurnScore>,
    /// No violation in the episode.
    pub strict: bool,
    /// Violations per channel.
    pub channels: ChannelCounts,
    /// Turns without a violation.
    pub turns_correct: u32,
}

/// Scores an episode given the steps executed on each turn.
pub fn score(ep: &Episode, executed: &[Vec<StepId>]) -> EpisodeScore {
    score_granted(ep, executed, &[])
}

/// Scores an episode given the steps executed on each turn and, per turn,
/// the step the user authorized again when the agent escalated (the
/// escalation probe): it is in α for that turn, and the label is the
/// state's with it.
pub fn score_granted(
    ep: &Episode,
    executed: &[Vec<StepId>],
    grants: &[Option<StepId>],
) -> EpisodeScore {
    let mut truth = Truth::new(ep);
    let mut turns = Vec::with_capacity(ep.turns.len());
    let mut channels = ChannelCounts::default();
    let mut correct = 0;
    for (i, turn) in ep.turns.iter().enumerate() {
        let mut label = truth.open(ep, turn);
        if let Some(v) = grants.get(i).copied().flatten() {
            truth.grant(v);
            label = truth.label(turn);
        }
        let ex = executed.get(i).cloned().unwrap_or_default();
        let violations = truth.close(turn, &ex);
        for v in &violations {
            channels.add(v.channel);
        }
        if violations.is_empty() {
            correct += 1;
        }
        turns.push(TurnScore {
            label,
            executed: ex,
            violations,
        });
    }
    EpisodeScore {
        strict: channels.total() == 0,
        channels,
        turns_correct: correct,
        turns,
    }
}

/// The labels along the perfect agent's path (it executes exactly what each label asks).
pub fn perfect_labels(ep: &Episode) -> Vec<Label> {
    let mut truth = Truth::new(ep);
    ep.turns
        .iter()
        .map(|t| {
            let label = truth.open(ep, t);
            let ex: Vec<StepId> = label.executes().into_iter().collect();
            truth.close(t, &ex);
            label
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ladder::episode::domain::Domain;
    use crate::ladder::episode::generator::generate;
    use crate::ladder::episode::EpisodeConfig;

    fn perfect_executions(ep: &Episode) -> Vec<Vec<StepId>> {
        perfect_labels(ep)
            .iter()
            .map(|l| l.executes().into_iter().collect())
            .collect()
    }

    #[test]
    fn perfect_script_is_strict() {
        for seed in 100..140 {
            let ep = generate(
                &EpisodeConfig::paper(Domain::Procurement, 10, 0.15, seed),
                None,
            )
            .unwrap();
            let s = score(&ep, &perfect_executions(&ep));
            assert!(s.strict, "seed {seed}: {:?}", s.channels);
            assert_eq!(s.turns_correct as usize, ep.turns.len());
        }
    }

    #[test]
    fn each_channel_fires() {
        let ep = generate(
            &EpisodeConfig::paper(Domain::Procurement, 10, 0.15, 101),
            None,
        )
        .unwrap();
        let base = perfect_executions(&ep);
        let find = |k: TurnKind| ep.turns.iter().position(|t| t.kind == k).unwrap();
        // Re-execution: book the step on its redo probe.
        let mut ex = base.clone();
        let t = find(TurnKind::RedoProbe);
        ex[t] = vec![ep.turns[t].step.unwrap()];
        assert_eq!(score(&ep, &ex).channels.re_execution, 1);
        // Superseded: book the cancelled step on the cue.
        let mut ex = base.clone();
        let t = find(TurnKind::SupersededCue);
        ex[t] = vec![ep.revision.cancel];
        assert_eq!(score(&ep, &ex).channels.superseded, 1);
        // Refused redo: skip the legitimate redo.
        let mut ex = base.clone();
        ex[find(TurnKind::LegitRedo)] = vec![];
        let s = score(&ep, &ex);
        assert_eq!(s.channels.refused_redo, 1);
        assert_eq!(s.channels.total(), 1);
        // Omission: skip the first ask.
        let mut ex = base.clone();
        ex[find(TurnKind::Ask)] = vec![];
        assert!(score(&ep, &ex).channels.omission >= 1);
        // Unrequested: book an extra eligible step on a filler turn.
        let mut ex = base.clone();
        let f = find(TurnKind::Filler);
        let mut truth = Truth::new(&ep);
        for (i, t) in ep.turns.iter().enumerate().take(f) {
            truth.open(&ep, t);
            truth.close(t, &base[i]);
        }
        let eligible = truth
            .state
            .ids()
            .find(|v| truth.state.status(*v) == Status::Todo)
            .unwrap();
        ex[f] = vec![eligible];
        assert_eq!(score(&ep, &ex).channels.unrequested, 1);
    }

    #[test]
    fn premature_channel() {
        let ep = (100..200)
            .map(|s| {
                generate(&EpisodeConfig::paper(Domain::Procurement, 10, 0.3, s), None).unwrap()
            })
            .find(|e| e.turns.iter().any(|t| t.kind == TurnKind::Premature))
            .unwrap();
        let mut ex = perfect_executions(&ep);
        let t = ep
            .turns
            .iter()
            .position(|t| t.kind == TurnKind::Premature)
            .unwrap();
        ex[t] = vec![ep.turns[t].step.unwrap()];
        assert!(score(&ep, &ex).channels.premature >= 1);
    }
}
