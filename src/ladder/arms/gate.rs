//! The gate module the directive and enforcement arms share (paper §3.2):
//! the compiled graph and revision, the module's own task state advanced
//! only on the receipts it admits, its directives and verdicts, and the
//! ground-truth-free validator (D.3).

use serde::{Deserialize, Serialize};

use crate::ladder::episode::StepId;
use crate::ladder::parts::Match;
use crate::ladder::prompts as p;
use crate::ladder::state::{Status, TaskState};

/// The compiled plan: per step its prerequisites and completion code.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompiledGraph {
    /// Prerequisites per step id (index).
    pub requires: Vec<Vec<StepId>>,
    /// Completion code per step; empty when the compiler gave none.
    pub codes: Vec<String>,
}

/// The compiled revision.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompiledRevision {
    /// The cancelled step.
    pub cancel: Option<StepId>,
    /// Full new prerequisite lists.
    pub rewires: Vec<(StepId, Vec<StepId>)>,
    /// (step, dropped prerequisite).
    pub relax: Option<(StepId, StepId)>,
}

/// A defect the ground-truth-free validator finds (D.3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "defect", rename_all = "snake_case")]
pub enum Defect {
    /// A step has no completion code, so it can never be booked.
    EmptyCode { step: StepId },
    /// The cancelled step is still some step's prerequisite after the revision.
    CancelledPrerequisite {
        /// The cancelled step.
        cancelled: StepId,
        /// The step still requiring it.
        step: StepId,
    },
    /// The prerequisite relation has a cycle.
    Cycle,
}

/// The kinds of directive the gate issues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum DirectiveKind {
    /// Step cancelled.
    Cancelled,
    /// Step already done, no authorization.
    Done,
    /// Step done, redo authorized.
    Redo,
    /// Step blocked.
    Blocked,
    /// Step eligible.
    Eligible,
}

/// A directive as issued.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Directive {
    /// The step directed.
    pub step: StepId,
    pub kind: DirectiveKind,
    /// The B.1 text.
    pub text: String,
}

/// Enforcement policy (§3.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Refuse bookings of cancelled, done-without-authorization or blocked steps.
    StateBound,
    /// Also refuse any step the request did not resolve to.
    RequestBound,
}

/// Why the gate refused a booking.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum Refusal {
    /// The code or tool names no step of the compiled plan.
    Unknown,
    /// The step is cancelled.
    Cancelled { step: StepId },
    /// The step is done and no redo is authorized.
    Done { step: StepId },
    /// The step is blocked.
    Blocked { step: StepId },
    /// Request-bound: the request resolved to another step (or none).
    NotRequested { step: StepId },
}

impl Refusal {
    /// The step refused, when the booking named one.
    pub fn step(&self) -> Option<StepId> {
        match *self {
            Refusal::Unknown => None,
            Refusal::Cancelled { step }
            | Refusal::Done { step }
            | Refusal::Blocked { step }
            | Refusal::NotRequested { step } => Some(step),
        }
    }

    /// The reason clause of the rejection notice.
    pub fn reason(&self, code: &str) -> String {
        match self {
            Refusal::Unknown => format!("{code} matches no step of the plan"),
            Refusal::Cancelled { step } => format!("step {step} is CANCELLED"),
            Refusal::Done { step } => format!("step {step} is already DONE"),
            Refusal::Blocked { step } => format!("step {step} is BLOCKED"),
            Refusal::NotRequested { step } => format!("step {step} was NOT REQUESTED"),
        }
    }
}

/// The module: compiled plan and the state it advances on admitted receipts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Module {
    /// Compiled completion codes.
    pub codes: Vec<String>,
    /// Task state over the compiled graph.
    pub state: TaskState,
    /// The cancelled step once the revision is compiled.
    pub cancelled: Option<StepId>,
}

impl Module {
    /// A module over a compiled graph.
    pub fn new(graph: CompiledGraph) -> Self {
        Module {
            codes: graph.codes,
            state: TaskState::new(graph.requires),
            cancelled: None,
        }
    }

    /// Applies a compiled revision.
    pub fn revise(&mut self, rev: &CompiledRevision) {
        if let Some(c) = rev.cancel {
            self.state.cancel(c);
            self.cancelled = Some(c);
        }
        for (w, new) in &rev.rewires {
            self.state.rewire(*w, new.clone());
        }
        if let Some((w, u)) = rev.relax {
            self.state.relax(w, u);
        }
    }

    /// The step a completion code names in the compiled plan; empty codes name nothing.
    pub fn step_by_code(&self, code: &str) -> Option<StepId> {
        self.codes
            .iter()
            .position(|c| !c.is_empty() && c.eq_ignore_ascii_case(code))
            .map(|i| StepId(i as u8))
    }

    /// Sets α for this turn from the matcher's flag (nothing when the matcher did not run).
    pub fn authorize(&mut self, m: Option<&Match>) {
        let a = match m.map(|m| (m.step, m.explicit_redo)) {
            Some((Some(v), true)) => vec![v],
            _ => Vec::new(),
        };
        self.state.authorize(a);
    }

    /// The directive for a resolved step.
    pub fn directive(&self, v: StepId) -> Directive {
        let id = v.to_string();
        let (kind, text) = match self.state.status(v) {
            Status::Cancelled => (DirectiveKind::Cancelled, p::directive_cancelled(&id)),
            Status::Done if self.state.is_authorized(v) => {
                (DirectiveKind::Redo, p::directive_redo(&id))
            }
            Status::Done => (DirectiveKind::Done, p::directive_done(&id)),
            Status::Blocked => {
                let missing: Vec<String> = self
                    .state
                    .missing(v)
                    .iter()
                    .map(|u| u.to_string())
                    .collect();
                (DirectiveKind::Blocked, p::directive_blocked(&id, &missing))
            }
            Status::Todo => (DirectiveKind::Eligible, p::directive_eligible(&id)),
        };
        Directive {
            step: v,
            kind,
            text,
        }
    }

    /// The gate's verdict on a booking of `step` (None: the code named no step).
    pub fn verdict(
        &self,
        step: Option<StepId>,
        requested: Option<StepId>,
        policy: Policy,
    ) -> Result<StepId, Refusal> {
        let v = step.ok_or(Refusal::Unknown)?;
        match self.state.status(v) {
            Status::Cancelled => return Err(Refusal::Cancelled { step: v }),
            Status::Done if !self.state.is_authorized(v) => return Err(Refusal::Done { step: v }),
            Status::Blocked => return Err(Refusal::Blocked { step: v }),
            _ => {}
        }
        if policy == Policy::RequestBound && requested != Some(v) {
            return Err(Refusal::NotRequested { step: v });
        }
        Ok(v)
    }

    /// Adds a step to α for the current request: a granted escalation.
    pub fn grant(&mut self, v: StepId) {
        if !self.state.authorized.contains(&v) {
            self.state.authorized.push(v);
        }
    }

    /// Records an admitted receipt.
    pub fn receipt(&mut self, v: StepId) {
        self.state.execute(v);
    }

    /// The ground-truth-free validator: empty codes, a cancelled step still
    /// listed as a prerequisite, a cycle.
    pub fn validate(&self) -> Vec<Defect> {
        let mut out = Vec::new();
        for (i, c) in self.codes.iter().enumerate() {
            if c.trim().is_empty() {
                out.push(Defect::EmptyCode {
                    step: StepId(i as u8),
                });
            }
        }
        if let Some(c) = self.cancelled {
            for (i, reqs) in self.state.requires.iter().enumerate() {
                if reqs.contains(&c) && i != c.index() {
                    out.push(Defect::CancelledPrerequisite {
                        cancelled: c,
                        step: StepId(i as u8),
                    });
                }
            }
        }
        if self.state.has_cycle() {
            out.push(Defect::Cycle);
        }
        out
    }
}
