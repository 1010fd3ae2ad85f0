//! The arms: protocol layers between the scripted user and the agent (paper
//! §3.3, E.2). An arm decides what the agent reads (transcript, checklist,
//! directive, ledger) and, for the enforcement gate, which bookings enter the
//! execution channel. It never calls a model: the runner calls the matcher
//! and the compiler and hands their results in, so model-backed ones slot in
//! without touching this file.

use serde::{Deserialize, Serialize};

use super::agent::{Message, Role};
use super::corrupt::Corruptor;
use super::decline;
use super::episode::{Episode, StepId, Turn};
use super::module::{
    CompiledGraph, CompiledRevision, Defect, Directive, Match, Module, Policy, Refusal,
};
use super::protocol as p;
use super::receipt::{self, RefLine};
use super::state::{Status, TaskState};

/// One arm of the ladder (or one of its controls).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Arm {
    /// Raw transcript: the brief and the growing conversation.
    Raw,
    /// Text checklist of the oracle state appended to every user turn, kept in history.
    Checklist,
    /// Replace mode: the checklist only on the current turn (E.2).
    ChecklistReplace,
    /// Directive gate, directive in the user role.
    Directive,
    /// Directive gate, directive in the system prompt for that call only (E.2).
    DirectiveSystem,
    /// Replace-mode checklist plus a line naming the matched step, no instruction (E.2).
    DirectiveStep,
    /// Enforcement gate, state-bound, rejection notice on the next turn.
    Enforce,
    /// Enforcement gate, request-bound (§3.3, G).
    EnforceRequest,
    /// Enforcement gate, state-bound, same-turn re-prompt with the notice (D.3).
    EnforceSameTurn,
    /// Self-ledger: the agent's own LEDGER lines rendered back (§3.3).
    Ledger,
    /// Validator-gated hybrid: enforce where the validator passes, direct where it flags (D.3).
    Hybrid,
}

impl Arm {
    /// Every arm, in ladder order first.
    pub const ALL: [Arm; 11] = [
        Arm::Raw,
        Arm::Checklist,
        Arm::Directive,
        Arm::Enforce,
        Arm::ChecklistReplace,
        Arm::DirectiveSystem,
        Arm::DirectiveStep,
        Arm::EnforceRequest,
        Arm::EnforceSameTurn,
        Arm::Ledger,
        Arm::Hybrid,
    ];

    /// The name used on the command line and in logs.
    pub fn name(self) -> &'static str {
        match self {
            Arm::Raw => "raw",
            Arm::Checklist => "checklist",
            Arm::ChecklistReplace => "checklist-replace",
            Arm::Directive => "directive",
            Arm::DirectiveSystem => "directive-system",
            Arm::DirectiveStep => "directive-step",
            Arm::Enforce => "enforce",
            Arm::EnforceRequest => "enforce-request",
            Arm::EnforceSameTurn => "enforce-same-turn",
            Arm::Ledger => "ledger",
            Arm::Hybrid => "hybrid",
        }
    }

    /// Whether the arm consults the matcher each turn.
    pub fn uses_matcher(self) -> bool {
        matches!(
            self,
            Arm::Directive
                | Arm::DirectiveSystem
                | Arm::DirectiveStep
                | Arm::Enforce
                | Arm::EnforceRequest
                | Arm::EnforceSameTurn
                | Arm::Hybrid
        )
    }

    /// Whether the arm owns a compiled module.
    pub fn uses_module(self) -> bool {
        self.uses_matcher() && self != Arm::DirectiveStep
    }

    /// The enforcement policy, for gated arms.
    pub fn policy(self) -> Option<Policy> {
        match self {
            Arm::Enforce | Arm::EnforceSameTurn | Arm::Hybrid => Some(Policy::StateBound),
            Arm::EnforceRequest => Some(Policy::RequestBound),
            _ => None,
        }
    }

    /// Whether a refusal re-prompts the agent within the turn.
    pub fn same_turn_notice(self) -> bool {
        self == Arm::EnforceSameTurn
    }

    fn checklist_kept(self) -> bool {
        matches!(self, Arm::Checklist)
    }
}

impl std::str::FromStr for Arm {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Arm::ALL.into_iter().find(|a| a.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Arm::ALL.iter().map(|a| a.name()).collect();
            format!("unknown arm '{s}' (expected one of {})", names.join(", "))
        })
    }
}

impl std::fmt::Display for Arm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Renders the B.1 checklist of a state.
pub fn render_checklist(state: &TaskState) -> String {
    let mut lines = vec![p::CHECKLIST_HEADER.to_string()];
    for v in state.ids() {
        let entry = match state.status(v) {
            Status::Done => "DONE".to_string(),
            Status::Cancelled => "CANCELLED".to_string(),
            Status::Todo => "TODO (ready)".to_string(),
            Status::Blocked => {
                let m: Vec<String> = state.missing(v).iter().map(|u| u.to_string()).collect();
                format!("TODO (waiting on: {})", m.join(", "))
            }
        };
        lines.push(format!("- {v}: {entry}"));
    }
    lines.join("\n")
}

/// One booking line of a reply, with what the gate and the world made of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Booking {
    /// The line as extracted.
    #[serde(flatten)]
    pub line: RefLine,
    /// Which call of the turn wrote it (0 = the reply, 1 = the same-turn re-prompt).
    pub call: u8,
    /// Carries the current turn's work order (otherwise a re-display).
    pub current: bool,
    /// The step its code or tool names in the generator's plan.
    pub step: Option<StepId>,
    /// Entered the execution channel (not refused by a gate, current, names a step).
    pub executed: bool,
    /// The gate's refusal, when refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<Refusal>,
    /// A citation inside a decline under decline-aware scoring (A.2).
    pub citation: bool,
}

/// What one arm holds across the turns of an episode.
#[derive(Debug, Clone)]
pub struct ArmState {
    /// The arm.
    pub arm: Arm,
    /// The compiled module, for module arms.
    pub module: Option<Module>,
    /// Past turns as the agent will re-read them.
    history: Vec<Message>,
    /// The agent's ledger: (code, status) in first-written order.
    ledger: Vec<(String, String)>,
    /// Rejection notices waiting for the next user turn.
    notices: Vec<String>,
    /// The corrupted-state ablation, when enabled.
    pub corruptor: Option<Corruptor>,
}

/// The prompt of one agent call plus what the arm decided for the turn.
#[derive(Debug, Clone)]
pub struct TurnPrompt {
    /// Full message list, system prompt first.
    pub messages: Vec<Message>,
    /// The user message as this turn shows it.
    pub user: String,
    /// The user message as later turns will re-read it.
    user_for_history: String,
    /// The directive issued, if any.
    pub directive: Option<Directive>,
    /// The system prompt extra (system-role directive), if any.
    pub system_extra: Option<String>,
    /// Whether the enforcement gate is active on this turn.
    pub gated: bool,
}

impl ArmState {
    /// A fresh arm state; module arms take the compiled graph.
    pub fn new(arm: Arm, graph: Option<CompiledGraph>, corruptor: Option<Corruptor>) -> Self {
        ArmState {
            arm,
            module: if arm.uses_module() {
                graph.map(Module::new)
            } else {
                None
            },
            history: Vec::new(),
            ledger: Vec::new(),
            notices: Vec::new(),
            corruptor,
        }
    }

    /// Applies the compiled revision to the module.
    pub fn revise(&mut self, rev: &CompiledRevision) {
        if let Some(m) = &mut self.module {
            m.revise(rev);
        }
    }

    /// The validator's current findings (empty for arms without a module).
    pub fn defects(&self) -> Vec<Defect> {
        self.module
            .as_ref()
            .map(|m| m.validate())
            .unwrap_or_default()
    }

    fn system_prompt(&self, ep: &Episode) -> String {
        if self.arm == Arm::Ledger {
            format!("{}\n{}", ep.brief, p::LEDGER_CLAUSE)
        } else {
            ep.brief.clone()
        }
    }

    fn render_ledger(&self) -> String {
        let mut lines = vec![p::LEDGER_HEADER.to_string()];
        if self.ledger.is_empty() {
            lines.push(p::LEDGER_EMPTY.to_string());
        }
        for (code, status) in &self.ledger {
            lines.push(format!("- {code}: {status}"));
        }
        lines.join("\n")
    }

    /// Builds the turn's prompt. `truth` is the oracle state (checklist arms),
    /// `matched` the matcher's resolution (matcher arms, None when bypassed).
    pub fn open_turn(
        &mut self,
        ep: &Episode,
        turn: &Turn,
        truth: &TaskState,
        matched: Option<&Match>,
    ) -> TurnPrompt {
        let mut directive = None;
        let mut gated = false;
        if let Some(m) = &mut self.module {
            m.authorize(matched);
            if let (Some(c), Some(_)) = (&mut self.corruptor, turn.step) {
                c.apply(m, turn.index);
            }
            directive = matched.and_then(|x| x.step).map(|v| m.directive(v));
            gated = match self.arm {
                Arm::Hybrid => m.validate().is_empty(),
                a => a.policy().is_some(),
            };
        }
        let base = turn.message.clone();
        let with_notices = |text: String, notices: &mut Vec<String>| {
            if notices.is_empty() {
                text
            } else {
                let n = notices.join("\n");
                notices.clear();
                format!("{n}\n\n{text}")
            }
        };
        let mut system_extra = None;
        let (user, kept) = match self.arm {
            Arm::Raw => (base.clone(), base),
            Arm::Checklist | Arm::ChecklistReplace => {
                let u = format!("{base}\n\n{}", render_checklist(truth));
                let kept = if self.arm.checklist_kept() {
                    u.clone()
                } else {
                    base
                };
                (u, kept)
            }
            Arm::DirectiveStep => {
                let mut u = format!("{base}\n\n{}", render_checklist(truth));
                if let Some(v) = matched.and_then(|m| m.step) {
                    u.push('\n');
                    u.push_str(&p::matched_step_line(&v.to_string()));
                }
                (u, base)
            }
            Arm::Ledger => {
                let u = format!("{base}\n\n{}", self.render_ledger());
                (u.clone(), u)
            }
            Arm::DirectiveSystem => {
                system_extra = directive.as_ref().map(|d| d.text.clone());
                (base.clone(), base)
            }
            Arm::Directive
            | Arm::Enforce
            | Arm::EnforceRequest
            | Arm::EnforceSameTurn
            | Arm::Hybrid => {
                let u = match &directive {
                    Some(d) => format!("{base}\n\n{}", d.text),
                    None => base,
                };
                let u = with_notices(u, &mut self.notices);
                (u.clone(), u)
            }
        };
        let mut system = self.system_prompt(ep);
        if let Some(x) = &system_extra {
            system.push_str("\n\n");
            system.push_str(x);
        }
        let mut messages = Vec::with_capacity(self.history.len() + 2);
        messages.push(Message::new(Role::System, system));
        messages.extend(self.history.iter().cloned());
        messages.push(Message::new(Role::User, user.clone()));
        TurnPrompt {
            messages,
            user,
            user_for_history: kept,
            directive,
            system_extra,
            gated,
        }
    }

    /// Extracts and gates the bookings of one reply; returns them and the
    /// rejection notices it produced.
    pub fn gate(
        &mut self,
        ep: &Episode,
        turn: &Turn,
        prompt: &TurnPrompt,
        matched: Option<&Match>,
        reply: &str,
        call: u8,
    ) -> (Vec<Booking>, Vec<String>) {
        let mut out = Vec::new();
        let mut notices = Vec::new();
        let requested = matched.and_then(|m| m.step);
        for line in receipt::extract(ep.config.protocol, reply) {
            let current = line.work_order == turn.work_order;
            let step = if line.tool.is_empty() {
                ep.step_by_code(&line.code)
            } else {
                ep.step_by_tool(&line.tool)
            };
            let citation = current && decline::is_citation(reply, line.line_no);
            let mut refusal = None;
            if current {
                if let Some(m) = &mut self.module {
                    // The module resolves codes through its compiled plan;
                    // tools are the harness's own registry.
                    let module_step = if line.tool.is_empty() {
                        m.step_by_code(&line.code)
                    } else {
                        step
                    };
                    let policy = self.arm.policy().unwrap_or(Policy::StateBound);
                    let verdict = m.verdict(module_step, requested, policy);
                    match verdict {
                        Err(r) if prompt.gated => {
                            let reason = r.reason(if line.code.is_empty() {
                                &line.tool
                            } else {
                                &line.code
                            });
                            notices.push(p::rejection_notice(&line.line, &reason));
                            refusal = Some(r);
                        }
                        // Receipts advance the module whether or not it gates.
                        _ => {
                            if let Some(v) = module_step {
                                m.receipt(v);
                            }
                        }
                    }
                }
            }
            out.push(Booking {
                executed: current && step.is_some() && refusal.is_none(),
                line,
                call,
                current,
                step,
                refusal,
                citation,
            });
        }
        (out, notices)
    }

    /// The same-turn re-prompt: the refused reply and the notice appended.
    pub fn reprompt(&self, prompt: &TurnPrompt, reply: &str, notice: &str) -> Vec<Message> {
        let mut m = prompt.messages.clone();
        m.push(Message::new(Role::Assistant, reply));
        m.push(Message::new(Role::User, notice));
        m
    }

    /// Closes the turn: records what later turns re-read and queues the
    /// notices for the next user turn. With a same-turn re-prompt, `replies`
    /// holds both replies and `reprompt` the notice sent between them.
    pub fn close_turn(
        &mut self,
        prompt: TurnPrompt,
        replies: &[String],
        reprompt: Option<String>,
        next_turn: Vec<String>,
    ) {
        self.history
            .push(Message::new(Role::User, prompt.user_for_history));
        let mut replies_iter = replies.iter();
        if let Some(first) = replies_iter.next() {
            self.history
                .push(Message::new(Role::Assistant, first.clone()));
        }
        if let (Some(notice), Some(second)) = (reprompt, replies_iter.next()) {
            self.history.push(Message::new(Role::User, notice));
            self.history
                .push(Message::new(Role::Assistant, second.clone()));
        }
        self.notices.extend(next_turn);
        if self.arm == Arm::Ledger {
            for r in replies {
                for l in receipt::extract_ledger(r) {
                    match self.ledger.iter_mut().find(|(c, _)| *c == l.code) {
                        Some(e) => e.1 = l.status,
                        None => self.ledger.push((l.code, l.status)),
                    }
                }
            }
        }
    }
}
