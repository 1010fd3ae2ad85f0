//! Compile accuracy: the compiled plan and revision against the generator's
//! (paper Table 5), per episode and summed over a cell.

use serde::{Deserialize, Serialize};

use crate::ladder::arms::gate::{CompiledGraph, CompiledRevision};
use crate::ladder::episode::{Episode, StepId};

/// Compile accuracy of one episode against the generator (paper Table 5).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompileAccuracy {
    /// Steps whose dependency set matches exactly.
    pub deps_correct: u32,
    /// Steps whose code matches.
    pub codes_correct: u32,
    pub steps: u32,
    /// Cancelled step correct.
    pub cancel_correct: bool,
    /// Rewires correct (same set of steps, same lists).
    pub rewire_correct: bool,
    pub relax_correct: bool,
}

/// Scores a compiled graph and revision against the generator's.
pub fn compile_accuracy(ep: &Episode, g: &CompiledGraph, r: &CompiledRevision) -> CompileAccuracy {
    let sorted = |v: &[StepId]| {
        let mut v = v.to_vec();
        v.sort();
        v.dedup();
        v
    };
    let mut acc = CompileAccuracy {
        steps: ep.steps.len() as u32,
        ..Default::default()
    };
    for s in &ep.steps {
        let i = s.id.index();
        if g.requires.get(i).map(|d| sorted(d)) == Some(sorted(&s.requires)) {
            acc.deps_correct += 1;
        }
        if g.codes
            .get(i)
            .is_some_and(|c| c.eq_ignore_ascii_case(&s.code))
        {
            acc.codes_correct += 1;
        }
    }
    acc.cancel_correct = r.cancel == Some(ep.revision.cancel);
    let norm = |rw: &[(StepId, Vec<StepId>)]| {
        let mut v: Vec<(StepId, Vec<StepId>)> = rw.iter().map(|(w, p)| (*w, sorted(p))).collect();
        v.sort();
        v
    };
    acc.rewire_correct = norm(&r.rewires) == norm(&ep.revision.rewires);
    acc.relax_correct = r.relax == ep.revision.relax;
    acc
}

/// Compile accuracy summed over episodes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompileTotals {
    pub episodes: u64,
    pub steps: u64,
    pub deps_correct: u64,
    pub codes_correct: u64,
    pub cancel_correct: u64,
    pub rewire_correct: u64,
    pub relax_correct: u64,
}

impl std::ops::AddAssign<&CompileAccuracy> for CompileTotals {
    fn add_assign(&mut self, c: &CompileAccuracy) {
        self.episodes += 1;
        self.steps += u64::from(c.steps);
        self.deps_correct += u64::from(c.deps_correct);
        self.codes_correct += u64::from(c.codes_correct);
        self.cancel_correct += u64::from(c.cancel_correct);
        self.rewire_correct += u64::from(c.rewire_correct);
        self.relax_correct += u64::from(c.relax_correct);
    }
}
