//! Tools that fail (`--tool-faults RATE`, tool and native protocols): a
//! seeded share of calls the gate admits fail with a transient error; the
//! tool runs nothing, stamps nothing, and no arm's state counts the step.
//!
//! A fault is drawn for the first call of a tool in a turn, as a function
//! of the episode seed, the turn and the tool only: every arm that makes
//! that call meets the same fault, so outcomes pair by seed. It is
//! transient: a second call of the same tool in the same turn goes
//! through. So an agent that reads the failure and retries always
//! recovers, and one that does not leaves the step undone.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::ladder::episode::StepId;
use crate::ladder::score::{Channel, Label, Violation};
use crate::rng::Rng;

/// How a call failed. None ran the tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// The call timed out before the tool ran.
    Timeout,
    /// The tool's service was unavailable.
    Unavailable,
    /// The call was rate limited.
    RateLimited,
}

impl FaultKind {
    pub const ALL: [FaultKind; 3] = [
        FaultKind::Timeout,
        FaultKind::Unavailable,
        FaultKind::RateLimited,
    ];

    /// What the failed call's result says happened.
    pub fn why(self) -> &'static str {
        match self {
            FaultKind::Timeout => "the call timed out before the tool ran",
            FaultKind::Unavailable => "the tool's service was unavailable (503)",
            FaultKind::RateLimited => "the call was rate limited (429)",
        }
    }
}

/// Draws the faults of one episode-arm.
#[derive(Debug, Clone)]
pub struct Faults {
    rate: f64,
    seed: u64,
    /// The turn whose calls `called` holds.
    turn: Option<usize>,
    /// Tools already called in that turn.
    called: BTreeSet<String>,
}

impl Faults {
    pub fn new(rate: f64, episode_seed: u64) -> Self {
        Faults {
            rate,
            seed: episode_seed,
            turn: None,
            called: BTreeSet::new(),
        }
    }

    /// Whether this admitted call of `tool` on `turn` fails, and how.
    pub fn draw(&mut self, turn: usize, tool: &str) -> Option<FaultKind> {
        if self.turn != Some(turn) {
            self.turn = Some(turn);
            self.called.clear();
        }
        let tool = tool.trim().to_ascii_lowercase();
        if !self.called.insert(tool.clone()) {
            // A retry within the turn: the fault was transient.
            return None;
        }
        let mut rng = Rng::stream(self.seed, &format!("tool-faults {turn} {tool}"));
        rng.chance(self.rate)
            .then(|| FaultKind::ALL[rng.below(FaultKind::ALL.len())])
    }
}

/// Faults injected into an episode (or an arm's episodes) and what became
/// of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultCounts {
    /// Calls that failed.
    pub injected: u32,
    /// Turns whose due step had a failed call.
    pub due: u32,
    /// Of those, turns that ended with the step not executed.
    pub unrecovered: u32,
    /// Re-executions of a step that had a failed call on that turn or
    /// before: retries that repeated work.
    pub re_executions: u32,
}

impl std::ops::AddAssign for FaultCounts {
    fn add_assign(&mut self, o: FaultCounts) {
        self.injected += o.injected;
        self.due += o.due;
        self.unrecovered += o.unrecovered;
        self.re_executions += o.re_executions;
    }
}

/// What one scored turn adds: `faulted` the steps whose calls failed on
/// it, `label` and `executed` its scoring, `violations` its violations;
/// `before` the steps with a failed call on an earlier turn (updated).
pub fn count_turn(
    faulted: &[StepId],
    label: &Label,
    executed: &[StepId],
    violations: &[Violation],
    before: &mut BTreeSet<StepId>,
) -> FaultCounts {
    before.extend(faulted.iter().copied());
    let due = label.executes().filter(|v| faulted.contains(v));
    FaultCounts {
        injected: faulted.len() as u32,
        due: u32::from(due.is_some()),
        unrecovered: u32::from(due.is_some_and(|v| !executed.contains(&v))),
        re_executions: violations
            .iter()
            .filter(|x| x.channel == Channel::ReExecution && before.contains(&x.step))
            .count() as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_are_seeded_per_turn_and_tool_and_transient() {
        let mut a = Faults::new(0.5, 7);
        let mut b = Faults::new(0.5, 7);
        let draws: Vec<_> = (0..200).map(|t| a.draw(t, "sign_contract")).collect();
        // Another arm, calling other tools in between, meets the same faults.
        let other: Vec<_> = (0..200)
            .map(|t| {
                b.draw(t, "other_tool");
                b.draw(t, "Sign_Contract ")
            })
            .collect();
        assert_eq!(draws, other);
        let n = draws.iter().filter(|d| d.is_some()).count();
        assert!((70..130).contains(&n), "{n} of 200");
        for k in FaultKind::ALL {
            assert!(draws.contains(&Some(k)));
        }
        // The retry in the same turn goes through.
        let mut c = Faults::new(1.0, 7);
        assert!(c.draw(3, "x").is_some());
        assert_eq!(c.draw(3, "x"), None);
        assert!(c.draw(4, "x").is_some());
        assert!(Faults::new(0.0, 7).draw(0, "x").is_none());
    }

    #[test]
    fn a_turn_counts_its_faults_and_what_became_of_them() {
        let (v, u) = (StepId(1), StepId(2));
        let mut before = BTreeSet::new();
        let ask = Label::Execute { step: v };
        let c = count_turn(&[v], &ask, &[], &[], &mut before);
        assert_eq!((c.injected, c.due, c.unrecovered), (1, 1, 1));
        let c = count_turn(&[v], &ask, &[v], &[], &mut before);
        assert_eq!((c.due, c.unrecovered), (1, 0));
        let redo = Violation {
            channel: Channel::ReExecution,
            step: v,
        };
        let c = count_turn(&[], &Label::Confirm { step: v }, &[v], &[redo], &mut before);
        assert_eq!((c.injected, c.re_executions), (0, 1));
        let other = Violation {
            channel: Channel::ReExecution,
            step: u,
        };
        assert_eq!(
            count_turn(&[], &Label::Nothing, &[u], &[other], &mut before).re_executions,
            0
        );
    }
}
