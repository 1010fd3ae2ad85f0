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

use serde::{Deserialize, Serialize};

use super::episode::{Episode, StepId, Turn, TurnKind};
use super::generator::{apply_revision, initial_state};
use super::state::{Status, TaskState};

/// The six error channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Channel {
    /// A done step executed without authorization.
    ReExecution,
    /// A cancelled step executed.
    Superseded,
    /// A blocked step executed.
    Premature,
    /// An eligible requested step not executed.
    Omission,
    /// A step other than the requested one executed.
    Unrequested,
    /// An authorized re-execution not performed.
    RefusedRedo,
}

impl Channel {
    /// All channels in report order.
    pub const ALL: [Channel; 6] = [
        Channel::ReExecution,
        Channel::Superseded,
        Channel::Premature,
        Channel::Omission,
        Channel::Unrequested,
        Channel::RefusedRedo,
    ];

    /// snake_case name.
    pub fn name(self) -> &'static str {
        match self {
            Channel::ReExecution => "re_execution",
            Channel::Superseded => "superseded",
            Channel::Premature => "premature",
            Channel::Omission => "omission",
            Channel::Unrequested => "unrequested",
            Channel::RefusedRedo => "refused_redo",
        }
    }
}

/// Violation counts per channel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelCounts {
    /// Re-executions.
    pub re_execution: u32,
    /// Superseded executions.
    pub superseded: u32,
    /// Premature executions.
    pub premature: u32,
    /// Omissions.
    pub omission: u32,
    /// Unrequested executions.
    pub unrequested: u32,
    /// Refused redos.
    pub refused_redo: u32,
}

impl ChannelCounts {
    /// Adds one violation.
    pub fn add(&mut self, c: Channel) {
        *self.get_mut(c) += 1;
    }

    /// Count of one channel.
    pub fn get(&self, c: Channel) -> u32 {
        match c {
            Channel::ReExecution => self.re_execution,
            Channel::Superseded => self.superseded,
            Channel::Premature => self.premature,
            Channel::Omission => self.omission,
            Channel::Unrequested => self.unrequested,
            Channel::RefusedRedo => self.refused_redo,
        }
    }

    fn get_mut(&mut self, c: Channel) -> &mut u32 {
        match c {
            Channel::ReExecution => &mut self.re_execution,
            Channel::Superseded => &mut self.superseded,
            Channel::Premature => &mut self.premature,
            Channel::Omission => &mut self.omission,
            Channel::Unrequested => &mut self.unrequested,
            Channel::RefusedRedo => &mut self.refused_redo,
        }
    }

    /// Sum over channels.
    pub fn total(&self) -> u32 {
        Channel::ALL.iter().map(|c| self.get(*c)).sum()
    }

    /// Adds another count.
    pub fn merge(&mut self, o: &ChannelCounts) {
        for c in Channel::ALL {
            *self.get_mut(c) += o.get(c);
        }
    }
}

/// What the turn asks of the agent, from the realized state (§3.1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "label", rename_all = "snake_case")]
pub enum Label {
    /// Execute the eligible step exactly once.
    Execute {
        /// The step.
        step: StepId,
    },
    /// Execute the finished step again: its redo is authorized.
    Redo {
        /// The step.
        step: StepId,
    },
    /// Confirm completion; execute nothing.
    Confirm {
        /// The step.
        step: StepId,
    },
    /// Name the missing prerequisites; execute nothing.
    Blocked {
        /// The step.
        step: StepId,
        /// Its missing prerequisites.
        missing: Vec<StepId>,
    },
    /// Decline the cancelled step; execute nothing.
    Decline {
        /// The step.
        step: StepId,
    },
    /// Execute nothing (filler, revision, ambiguous probe).
    Nothing,
}

impl Label {
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

/// One violation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    /// Its channel.
    pub channel: Channel,
    /// The step concerned.
    pub step: StepId,
}

/// The score of one turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnScore {
    /// The label.
    pub label: Label,
    /// Steps executed.
    pub executed: Vec<StepId>,
    /// Violations.
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
    let mut truth = Truth::new(ep);
    let mut turns = Vec::with_capacity(ep.turns.len());
    let mut channels = ChannelCounts::default();
    let mut correct = 0;
    for (i, turn) in ep.turns.iter().enumerate() {
        let label = truth.open(ep, turn);
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
    use crate::ladder::domain::Domain;
    use crate::ladder::generator::{config, generate};

    fn perfect_executions(ep: &Episode) -> Vec<Vec<StepId>> {
        perfect_labels(ep)
            .iter()
            .map(|l| l.executes().into_iter().collect())
            .collect()
    }

    #[test]
    fn perfect_script_is_strict() {
        for seed in 100..140 {
            let ep = generate(&config(Domain::Procurement, 10, 0.15, seed), None).unwrap();
            let s = score(&ep, &perfect_executions(&ep));
            assert!(s.strict, "seed {seed}: {:?}", s.channels);
            assert_eq!(s.turns_correct as usize, ep.turns.len());
        }
    }

    #[test]
    fn each_channel_fires() {
        let ep = generate(&config(Domain::Procurement, 10, 0.15, 101), None).unwrap();
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
            .map(|s| generate(&config(Domain::Procurement, 10, 0.3, s), None).unwrap())
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
