//! The corrupted-state ablation (paper D.4): flip done bits and drop
//! prerequisite edges of the gate module's state at rate ε per step-turn.
//!
//! Seeded per episode, so a replay injects the same corruptions; every event
//! is recorded for the run log.

use serde::{Deserialize, Serialize};

use super::gate::Module;
use crate::ladder::episode::StepId;
use crate::rng::Rng;

/// One injected corruption.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Corruption {
    /// A done bit flipped (spurious done when `now_done`, lost done otherwise).
    FlipDone {
        /// Turn index.
        turn: usize,
        step: StepId,
        /// The bit after the flip.
        now_done: bool,
    },
    /// A prerequisite edge (u, v) dropped.
    DropEdge {
        /// Turn index.
        turn: usize,
        /// The step that lost a prerequisite.
        step: StepId,
        /// The dropped prerequisite.
        prerequisite: StepId,
    },
}

/// Injects corruptions into a module at rate ε per step per step-turn.
#[derive(Debug, Clone)]
pub struct Corruptor {
    eps: f64,
    rng: Rng,
    /// Every corruption injected so far.
    pub events: Vec<Corruption>,
}

impl Corruptor {
    /// A corruptor for one episode.
    pub fn new(eps: f64, episode_seed: u64) -> Self {
        Corruptor {
            eps,
            rng: Rng::stream(episode_seed, "corruption"),
            events: Vec::new(),
        }
    }

    /// Applies one step-turn's draws: for each step, a done-bit flip with
    /// probability ε and, if it has prerequisites, an edge drop with probability ε.
    pub fn apply(&mut self, module: &mut Module, turn: usize) {
        for i in 0..module.state.len() {
            let v = StepId(i as u8);
            if self.rng.chance(self.eps) {
                let now_done = !module.state.done[i];
                module.state.done[i] = now_done;
                self.events.push(Corruption::FlipDone {
                    turn,
                    step: v,
                    now_done,
                });
            }
            let reqs = &mut module.state.requires[i];
            if !reqs.is_empty() && self.rng.chance(self.eps) {
                let k = self.rng.below(reqs.len());
                let u = reqs.remove(k);
                self.events.push(Corruption::DropEdge {
                    turn,
                    step: v,
                    prerequisite: u,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ladder::arms::gate::CompiledGraph;

    #[test]
    fn rate_zero_changes_nothing_and_rate_one_flips_everything() {
        let g = CompiledGraph {
            requires: vec![vec![], vec![StepId(0)]],
            codes: vec!["RC-1".into(), "RC-2".into()],
        };
        let mut m = Module::new(g.clone());
        let before = m.clone();
        let mut c = Corruptor::new(0.0, 7);
        c.apply(&mut m, 0);
        assert_eq!(m, before);
        assert!(c.events.is_empty());
        let mut c = Corruptor::new(1.0, 7);
        c.apply(&mut m, 0);
        assert_eq!(m.state.done, vec![true, true]);
        assert!(m.state.requires[1].is_empty());
        assert_eq!(c.events.len(), 3);
    }

    #[test]
    fn seeded() {
        let g = CompiledGraph {
            requires: vec![vec![]; 10],
            codes: vec![String::new(); 10],
        };
        let run = || {
            let mut m = Module::new(g.clone());
            let mut c = Corruptor::new(0.1, 42);
            for t in 0..44 {
                c.apply(&mut m, t);
            }
            c.events
        };
        assert_eq!(run(), run());
    }
}
