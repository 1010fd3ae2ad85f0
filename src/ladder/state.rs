//! The task-state machine G = (V, E, σ, α) of paper §3.1.
//!
//! Status is derived, never asserted: σ is computed from the cancelled set,
//! the done set (verified executions) and the prerequisite relation. The same
//! type holds the ground truth (the generator's graph, advanced on valid
//! bookings) and the gate module's compiled state (advanced on the receipts the
//! gate admits).

use serde::{Deserialize, Serialize};

use super::episode::StepId;

/// Derived status of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Eligible: not cancelled, not done, every prerequisite done.
    Todo,
    /// Some prerequisite is not done.
    Blocked,
    /// A verified execution exists.
    Done,
    /// Cancelled by the revision.
    Cancelled,
}

/// G = (V, E, σ, α): steps are indices `0..len`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskState {
    /// `requires[v]` = every u with (u, v) ∈ E.
    pub requires: Vec<Vec<StepId>>,
    /// Whether a verified execution of v exists.
    pub done: Vec<bool>,
    /// Whether v was cancelled.
    pub cancelled: Vec<bool>,
    /// α: done steps whose re-execution is authorized for the current request.
    pub authorized: Vec<StepId>,
}

impl TaskState {
    /// A fresh state over this prerequisite relation: nothing done or cancelled.
    pub fn new(requires: Vec<Vec<StepId>>) -> Self {
        let n = requires.len();
        TaskState {
            requires,
            done: vec![false; n],
            cancelled: vec![false; n],
            authorized: Vec::new(),
        }
    }

    /// Number of steps.
    pub fn len(&self) -> usize {
        self.requires.len()
    }

    /// Whether there are no steps.
    pub fn is_empty(&self) -> bool {
        self.requires.is_empty()
    }

    /// All step ids.
    pub fn ids(&self) -> impl Iterator<Item = StepId> {
        (0..self.len()).map(|i| StepId(i as u8))
    }

    /// σ(v), derived.
    pub fn status(&self, v: StepId) -> Status {
        let i = v.index();
        if self.cancelled[i] {
            Status::Cancelled
        } else if self.done[i] {
            Status::Done
        } else if self.requires[i].iter().any(|u| !self.done[u.index()]) {
            Status::Blocked
        } else {
            Status::Todo
        }
    }

    /// Prerequisites of v that are not done, in id order.
    pub fn missing(&self, v: StepId) -> Vec<StepId> {
        let mut m: Vec<StepId> = self.requires[v.index()]
            .iter()
            .copied()
            .filter(|u| !self.done[u.index()])
            .collect();
        m.sort();
        m.dedup();
        m
    }

    /// Whether v's re-execution is authorized for the current request.
    pub fn is_authorized(&self, v: StepId) -> bool {
        self.authorized.contains(&v)
    }

    /// Whether executing v now is correct: todo, or done and authorized.
    pub fn may_execute(&self, v: StepId) -> bool {
        match self.status(v) {
            Status::Todo => true,
            Status::Done => self.is_authorized(v),
            Status::Blocked | Status::Cancelled => false,
        }
    }

    /// Records a verified execution of v.
    pub fn execute(&mut self, v: StepId) {
        self.done[v.index()] = true;
    }

    /// cancel(v).
    pub fn cancel(&mut self, v: StepId) {
        self.cancelled[v.index()] = true;
    }

    /// rewire(w, P): replace w's prerequisite set by P.
    pub fn rewire(&mut self, w: StepId, p: Vec<StepId>) {
        self.requires[w.index()] = p;
    }

    /// relax(w, u): drop the edge (u, w).
    pub fn relax(&mut self, w: StepId, u: StepId) {
        self.requires[w.index()].retain(|x| *x != u);
    }

    /// Sets α for the current request.
    pub fn authorize(&mut self, steps: Vec<StepId>) {
        self.authorized = steps;
    }

    /// Whether the prerequisite relation has a cycle.
    pub fn has_cycle(&self) -> bool {
        // Kahn's algorithm over the edges (u, v) with u in requires[v].
        let n = self.len();
        let mut indeg = vec![0usize; n];
        let mut out: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (v, reqs) in self.requires.iter().enumerate() {
            let mut seen = Vec::new();
            for u in reqs {
                if u.index() < n && !seen.contains(u) {
                    seen.push(*u);
                    indeg[v] += 1;
                    out[u.index()].push(v);
                }
            }
        }
        let mut queue: Vec<usize> = (0..n).filter(|&v| indeg[v] == 0).collect();
        let mut visited = 0;
        while let Some(u) = queue.pop() {
            visited += 1;
            for &v in &out[u] {
                indeg[v] -= 1;
                if indeg[v] == 0 {
                    queue.push(v);
                }
            }
        }
        visited < n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(i: u8) -> StepId {
        StepId(i)
    }

    #[test]
    fn status_is_derived() {
        let mut g = TaskState::new(vec![vec![], vec![s(0)], vec![s(0), s(1)]]);
        assert_eq!(g.status(s(0)), Status::Todo);
        assert_eq!(g.status(s(1)), Status::Blocked);
        assert_eq!(g.missing(s(2)), vec![s(0), s(1)]);
        g.execute(s(0));
        assert_eq!(g.status(s(0)), Status::Done);
        assert_eq!(g.status(s(1)), Status::Todo);
        assert_eq!(g.missing(s(2)), vec![s(1)]);
        g.cancel(s(1));
        assert_eq!(g.status(s(1)), Status::Cancelled);
        // s2 still lists the cancelled s1, so it stays blocked until rewired.
        assert_eq!(g.status(s(2)), Status::Blocked);
        g.rewire(s(2), vec![s(0)]);
        assert_eq!(g.status(s(2)), Status::Todo);
    }

    #[test]
    fn relax_and_authorization() {
        let mut g = TaskState::new(vec![vec![], vec![s(0)]]);
        g.relax(s(1), s(0));
        assert_eq!(g.status(s(1)), Status::Todo);
        g.execute(s(1));
        assert!(!g.may_execute(s(1)));
        g.authorize(vec![s(1)]);
        assert!(g.may_execute(s(1)));
        g.authorize(vec![]);
        assert!(!g.may_execute(s(1)));
    }

    #[test]
    fn cycle_detection() {
        let g = TaskState::new(vec![vec![s(1)], vec![s(0)]]);
        assert!(g.has_cycle());
        let g = TaskState::new(vec![vec![], vec![s(0)], vec![s(1)]]);
        assert!(!g.has_cycle());
    }
}
