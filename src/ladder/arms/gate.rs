//! The compiled state machine the gates share (paper §3.2): the compiled
//! graph and revision, the module's own task state advanced only on the
//! receipts it admits, and the ground-truth-free validator (D.3).
//!
//! The matcher and the compiler are traits. Their oracle implementations
//! read the generator (the scripted step; the generator's graph); the
//! model-backed ones send the B.1 prompts to the agent model.

use serde::{Deserialize, Serialize};

use super::episode::{Episode, StepId, Turn};
use super::protocol as p;
use super::state::{Status, TaskState};

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

/// What a compile call produced, with its cost.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CallCost {
    /// Model calls made (0 for oracles).
    pub calls: u32,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
    /// Error text when the reply could not be used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Compiles the brief and the revision message into module state.
pub trait Compiler {
    /// Identity written to the run manifest.
    fn name(&self) -> String;
    /// Compiles the plan from the brief.
    fn compile_graph(&mut self, ep: &Episode) -> (CompiledGraph, CallCost);
    /// Compiles the revision message.
    fn compile_revision(&mut self, ep: &Episode) -> (CompiledRevision, CallCost);
}

/// The matcher's resolution of one user message.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Match {
    /// The step the message asks for or about.
    pub step: Option<StepId>,
    /// Whether the user explicitly authorizes re-execution.
    pub explicit_redo: bool,
    /// Cost of the call(s).
    #[serde(default)]
    pub cost: CallCost,
}

/// Resolves a user message to a step (paper §3.2, B.1).
pub trait Matcher {
    /// Identity written to the run manifest.
    fn name(&self) -> String;
    /// Resolves one turn's user message.
    fn resolve(&mut self, ep: &Episode, turn: &Turn) -> Match;
}

/// Oracle compiler: the generator's graph and revision.
#[derive(Debug, Clone, Copy, Default)]
pub struct OracleCompiler;

impl Compiler for OracleCompiler {
    fn name(&self) -> String {
        "oracle".into()
    }
    fn compile_graph(&mut self, ep: &Episode) -> (CompiledGraph, CallCost) {
        let g = CompiledGraph {
            requires: ep.steps.iter().map(|s| s.requires.clone()).collect(),
            codes: ep.steps.iter().map(|s| s.code.clone()).collect(),
        };
        (g, CallCost::default())
    }
    fn compile_revision(&mut self, ep: &Episode) -> (CompiledRevision, CallCost) {
        let r = CompiledRevision {
            cancel: Some(ep.revision.cancel),
            rewires: ep.revision.rewires.clone(),
            relax: ep.revision.relax,
        };
        (r, CallCost::default())
    }
}

/// Oracle matcher: the scripted step and redo flag.
#[derive(Debug, Clone, Copy, Default)]
pub struct OracleMatcher;

impl Matcher for OracleMatcher {
    fn name(&self) -> String {
        "oracle".into()
    }
    fn resolve(&mut self, _ep: &Episode, turn: &Turn) -> Match {
        Match {
            step: turn.step,
            explicit_redo: turn.explicit_redo,
            cost: CallCost::default(),
        }
    }
}

/// A defect the ground-truth-free validator finds (D.3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "defect", rename_all = "snake_case")]
pub enum Defect {
    /// A step has no completion code, so it can never be booked.
    EmptyCode {
        /// The step.
        step: StepId,
    },
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
    /// Its kind.
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
    Cancelled {
        /// The step.
        step: StepId,
    },
    /// The step is done and no redo is authorized.
    Done {
        /// The step.
        step: StepId,
    },
    /// The step is blocked.
    Blocked {
        /// The step.
        step: StepId,
    },
    /// Request-bound: the request resolved to another step (or none).
    NotRequested {
        /// The step.
        step: StepId,
    },
}

impl Refusal {
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

/// Compile accuracy of one episode against the generator (paper Table 5).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompileAccuracy {
    /// Steps whose dependency set matches exactly.
    pub deps_correct: u32,
    /// Steps whose code matches.
    pub codes_correct: u32,
    /// Number of steps.
    pub steps: u32,
    /// Cancelled step correct.
    pub cancel_correct: bool,
    /// Rewires correct (same set of steps, same lists).
    pub rewire_correct: bool,
    /// Relax correct.
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
