//! The arms: protocol layers between the scripted user and the agent (paper
//! §3.3, E.2). An arm is a composition of the paper's independent choices,
//! written down as an [`ArmSpec`]: what the agent reads, where a directive
//! goes, which gate applies and when a refusal arrives. The runner calls
//! the agent, the matcher and the compiler and hands their results in; a
//! memory arm's own [`Memory`] embeds and writes through the parts it holds.

pub mod corrupt;
pub mod decline;
pub mod gate;
pub mod memory;

use serde::{Deserialize, Serialize};

use crate::backend::{Message, Role};
use crate::ladder::episode::{Episode, StepId, Turn};
use crate::ladder::parts::{Match, MemoryParts};
use crate::ladder::probes::faults::{FaultKind, Faults};
use crate::ladder::prompts as p;
use crate::ladder::receipt::{self, RefLine};
use crate::ladder::state::{Status, TaskState};
use corrupt::Corruptor;
use gate::{CompiledGraph, CompiledRevision, Defect, Directive, Module, Policy, Refusal};
use memory::{Memory, MemoryKind, MemoryTurn, Rendering};

/// What the agent reads besides the brief and the transcript.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reads {
    /// The raw transcript only.
    Transcript,
    /// The oracle state's checklist appended to the user turn; `kept`: later
    /// turns re-read it (otherwise only the current turn shows it, E.2).
    Checklist { kept: bool },
    /// The agent's own LEDGER lines rendered back in the checklist's slot
    /// (§3.3); `kept`: later turns re-read it (appended), otherwise only the
    /// current turn shows it (replaced, Table 16).
    Ledger { kept: bool },
    /// A retrieval memory's recall block after the brief (Appendix F).
    Memory {
        kind: MemoryKind,
        rendering: Rendering,
    },
}

/// Where the directive for the matched step goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirectiveAt {
    /// Appended to the user turn, and kept there.
    UserTurn,
    /// In the system prompt of that call only (E.2).
    System,
    /// A line naming the matched step, no instruction, no module (E.2).
    StepLine,
}

/// Which bookings the gate refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    None,
    /// Cancelled, done-without-authorization and blocked steps.
    StateBound,
    /// Also any step the request did not resolve to (§3.3, G).
    RequestBound,
    /// State-bound where the validator passes, directive-only where it flags (D.3).
    ValidatorGated,
}

/// When a refused booking's rejection notice reaches the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice {
    /// Prepended to the next user turn.
    NextTurn,
    /// At once, as a re-prompt whose reply is the one the user sees (D.3).
    SameTurn,
}

/// One arm as the composition of the paper's choices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArmSpec {
    pub reads: Reads,
    /// None: no matcher runs.
    pub directive: Option<DirectiveAt>,
    pub gate: Gate,
    pub notice: Notice,
}

impl ArmSpec {
    const BASE: ArmSpec = ArmSpec {
        reads: Reads::Transcript,
        directive: None,
        gate: Gate::None,
        notice: Notice::NextTurn,
    };
    pub const RAW: ArmSpec = ArmSpec::BASE;
    pub const CHECKLIST: ArmSpec = ArmSpec {
        reads: Reads::Checklist { kept: true },
        ..ArmSpec::BASE
    };
    pub const CHECKLIST_REPLACE: ArmSpec = ArmSpec {
        reads: Reads::Checklist { kept: false },
        ..ArmSpec::BASE
    };
    pub const DIRECTIVE: ArmSpec = ArmSpec {
        directive: Some(DirectiveAt::UserTurn),
        ..ArmSpec::BASE
    };
    pub const DIRECTIVE_SYSTEM: ArmSpec = ArmSpec {
        directive: Some(DirectiveAt::System),
        ..ArmSpec::BASE
    };
    pub const DIRECTIVE_STEP: ArmSpec = ArmSpec {
        reads: Reads::Checklist { kept: false },
        directive: Some(DirectiveAt::StepLine),
        ..ArmSpec::BASE
    };
    pub const ENFORCE: ArmSpec = ArmSpec {
        gate: Gate::StateBound,
        ..ArmSpec::DIRECTIVE
    };
    pub const ENFORCE_SYSTEM: ArmSpec = ArmSpec {
        gate: Gate::StateBound,
        ..ArmSpec::DIRECTIVE_SYSTEM
    };
    pub const ENFORCE_REQUEST: ArmSpec = ArmSpec {
        gate: Gate::RequestBound,
        ..ArmSpec::DIRECTIVE
    };
    pub const ENFORCE_SAME_TURN: ArmSpec = ArmSpec {
        notice: Notice::SameTurn,
        ..ArmSpec::ENFORCE
    };
    pub const LEDGER: ArmSpec = ArmSpec {
        reads: Reads::Ledger { kept: true },
        ..ArmSpec::BASE
    };
    pub const LEDGER_REPLACE: ArmSpec = ArmSpec {
        reads: Reads::Ledger { kept: false },
        ..ArmSpec::BASE
    };
    const fn retrieval(kind: MemoryKind, rendering: Rendering) -> ArmSpec {
        ArmSpec {
            reads: Reads::Memory { kind, rendering },
            ..ArmSpec::BASE
        }
    }
    pub const TOPK_REPLACE: ArmSpec = ArmSpec::retrieval(MemoryKind::Exchanges, Rendering::Replace);
    pub const TOPK_AUGMENT: ArmSpec = ArmSpec::retrieval(MemoryKind::Exchanges, Rendering::Augment);
    pub const MEM0_REPLACE: ArmSpec = ArmSpec::retrieval(MemoryKind::Facts, Rendering::Replace);
    pub const MEM0_AUGMENT: ArmSpec = ArmSpec::retrieval(MemoryKind::Facts, Rendering::Augment);
    pub const HYBRID: ArmSpec = ArmSpec {
        gate: Gate::ValidatorGated,
        ..ArmSpec::DIRECTIVE
    };

    /// Whether the matcher runs each turn.
    pub fn uses_matcher(&self) -> bool {
        self.directive.is_some()
    }

    /// The retrieval memory the arm keeps, if any.
    pub fn memory(&self) -> Option<MemoryKind> {
        match self.reads {
            Reads::Memory { kind, .. } => Some(kind),
            _ => None,
        }
    }

    /// Whether the agent keeps a LEDGER.
    pub fn ledger(&self) -> bool {
        matches!(self.reads, Reads::Ledger { .. })
    }

    /// Whether the arm owns a compiled gate module.
    pub fn uses_module(&self) -> bool {
        matches!(
            self.directive,
            Some(DirectiveAt::UserTurn | DirectiveAt::System)
        )
    }

    /// The enforcement policy, for gated arms.
    pub fn policy(&self) -> Option<Policy> {
        match self.gate {
            Gate::None => None,
            Gate::StateBound | Gate::ValidatorGated => Some(Policy::StateBound),
            Gate::RequestBound => Some(Policy::RequestBound),
        }
    }
}

/// One arm of the ladder (or one of its controls), by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Arm {
    Raw,
    Checklist,
    ChecklistReplace,
    Directive,
    DirectiveSystem,
    DirectiveStep,
    Enforce,
    EnforceRequest,
    EnforceSameTurn,
    Ledger,
    Hybrid,
    LedgerReplace,
    TopkReplace,
    TopkAugment,
    Mem0Replace,
    Mem0Augment,
    EnforceSystem,
}

impl Arm {
    /// Every arm, in ladder order first.
    pub const ALL: [Arm; 17] = [
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
        Arm::LedgerReplace,
        Arm::TopkReplace,
        Arm::TopkAugment,
        Arm::Mem0Replace,
        Arm::Mem0Augment,
        Arm::EnforceSystem,
    ];

    /// The four rungs of the ladder.
    pub const LADDER: [Arm; 4] = [Arm::Raw, Arm::Checklist, Arm::Directive, Arm::Enforce];

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
            Arm::LedgerReplace => "ledger-replace",
            Arm::TopkReplace => "topk-replace",
            Arm::TopkAugment => "topk-augment",
            Arm::Mem0Replace => "mem0-replace",
            Arm::Mem0Augment => "mem0-augment",
            Arm::EnforceSystem => "enforce-system",
        }
    }

    /// What the arm is made of.
    pub fn spec(self) -> ArmSpec {
        match self {
            Arm::Raw => ArmSpec::RAW,
            Arm::Checklist => ArmSpec::CHECKLIST,
            Arm::ChecklistReplace => ArmSpec::CHECKLIST_REPLACE,
            Arm::Directive => ArmSpec::DIRECTIVE,
            Arm::DirectiveSystem => ArmSpec::DIRECTIVE_SYSTEM,
            Arm::DirectiveStep => ArmSpec::DIRECTIVE_STEP,
            Arm::Enforce => ArmSpec::ENFORCE,
            Arm::EnforceRequest => ArmSpec::ENFORCE_REQUEST,
            Arm::EnforceSameTurn => ArmSpec::ENFORCE_SAME_TURN,
            Arm::Ledger => ArmSpec::LEDGER,
            Arm::Hybrid => ArmSpec::HYBRID,
            Arm::LedgerReplace => ArmSpec::LEDGER_REPLACE,
            Arm::TopkReplace => ArmSpec::TOPK_REPLACE,
            Arm::TopkAugment => ArmSpec::TOPK_AUGMENT,
            Arm::Mem0Replace => ArmSpec::MEM0_REPLACE,
            Arm::Mem0Augment => ArmSpec::MEM0_AUGMENT,
            Arm::EnforceSystem => ArmSpec::ENFORCE_SYSTEM,
        }
    }

    /// Whether the arm consults the matcher each turn.
    pub fn uses_matcher(self) -> bool {
        self.spec().uses_matcher()
    }

    /// Whether the arm owns a compiled module.
    pub fn uses_module(self) -> bool {
        self.spec().uses_module()
    }

    /// Whether the arm keeps a retrieval memory (and so needs an embedder).
    pub fn uses_memory(self) -> bool {
        self.spec().memory().is_some()
    }

    /// Whether a refusal re-prompts the agent within the turn.
    pub fn same_turn_notice(self) -> bool {
        self.spec().notice == Notice::SameTurn
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
    /// How the call failed, when the tool-faults probe failed it (it then
    /// ran nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<FaultKind>,
    /// Under the escalation probe: the gate admitted a step its state holds
    /// finished, an authorized redo (the probe counts any without an
    /// authorization on record).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub redo: bool,
    /// A citation inside a decline under decline-aware scoring (A.2).
    pub citation: bool,
}

/// One scripted turn as the arm reads it.
#[derive(Debug, Clone, Copy)]
pub struct TurnContext<'a> {
    pub episode: &'a Episode,
    pub turn: &'a Turn,
    /// The matcher's resolution (matcher arms; None when bypassed).
    pub matched: Option<&'a Match>,
}

/// What one arm holds across the turns of an episode.
pub struct ArmState<'p> {
    pub arm: Arm,
    spec: ArmSpec,
    /// The compiled gate module, for module arms.
    pub module: Option<Module>,
    /// Past turns as the agent will re-read them.
    history: Vec<Message>,
    /// Where each past turn's exchange starts in `history`.
    exchanges: Vec<usize>,
    /// The agent's ledger: (code, status) in first-written order.
    ledger: Vec<(String, String)>,
    /// Rejection notices waiting for the next user turn.
    notices: Vec<String>,
    /// The corrupted-state ablation, when enabled.
    pub corruptor: Option<Corruptor>,
    /// The tool-faults probe, when enabled.
    pub faults: Option<Faults>,
    /// The escalation probe, on a gated arm: refusals offer it.
    pub escalation: bool,
    /// The retrieval memory, for memory arms.
    memory: Option<Memory<'p>>,
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

impl<'p> ArmState<'p> {
    /// A fresh arm state; module arms take the compiled graph, memory arms
    /// embed and write through `memory`.
    pub fn new(
        arm: Arm,
        graph: Option<CompiledGraph>,
        corruptor: Option<Corruptor>,
        memory: &'p mut MemoryParts,
    ) -> Self {
        let spec = arm.spec();
        ArmState {
            arm,
            spec,
            module: graph.filter(|_| spec.uses_module()).map(Module::new),
            history: Vec::new(),
            exchanges: Vec::new(),
            ledger: Vec::new(),
            notices: Vec::new(),
            corruptor,
            faults: None,
            escalation: false,
            memory: spec.memory().map(|kind| Memory::new(kind, memory)),
        }
    }

    /// Applies the compiled revision to the module.
    pub fn revise(&mut self, rev: &CompiledRevision) {
        if let Some(m) = &mut self.module {
            m.revise(rev);
        }
    }

    /// What a memory arm spent on its memory so far.
    pub fn memory_use(&self) -> Option<memory::MemoryUse> {
        self.memory.as_ref().map(Memory::used)
    }

    /// The validator's current findings (empty for arms without a module).
    pub fn defects(&self) -> Vec<Defect> {
        self.module
            .as_ref()
            .map(|m| m.validate())
            .unwrap_or_default()
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

    /// Builds the turn's prompt; `truth` is the oracle state (checklist
    /// arms). A memory arm recalls for the request here.
    pub fn open_turn(&mut self, cx: &TurnContext, truth: &TaskState) -> TurnPrompt {
        let (turn, matched) = (cx.turn, cx.matched);
        let (directive, gated) = self.consult_module(turn, matched);
        let base = &turn.message;
        // What the agent reads on top of the request, and what history keeps.
        let (mut user, mut kept) = match self.spec.reads {
            Reads::Transcript => (base.clone(), base.clone()),
            Reads::Checklist { kept } => {
                let u = format!("{base}\n\n{}", render_checklist(truth));
                let k = if kept { u.clone() } else { base.clone() };
                (u, k)
            }
            Reads::Ledger { kept } => {
                let u = format!("{base}\n\n{}", self.render_ledger());
                let k = if kept { u.clone() } else { base.clone() };
                (u, k)
            }
            Reads::Memory { .. } => (base.clone(), base.clone()),
        };
        let mut system = cx.episode.brief.clone();
        if self.spec.ledger() {
            system = format!("{system}\n{}", p::LEDGER_CLAUSE);
        }
        let mut system_extra = None;
        // The recall block follows the brief, as in Appendix F.
        if let Some(m) = &mut self.memory {
            let block = m.recall_block(base);
            system = format!("{system}\n\n{block}");
            system_extra = Some(block);
        }
        match self.spec.directive {
            None => {}
            Some(DirectiveAt::StepLine) => {
                if let Some(v) = matched.and_then(|m| m.step) {
                    user.push('\n');
                    user.push_str(&p::matched_step_line(&v.to_string()));
                }
            }
            // Rejection notices stay in the user role (Table 16).
            Some(DirectiveAt::System) => {
                if let Some(d) = &directive {
                    system.push_str("\n\n");
                    system.push_str(&d.text);
                    system_extra = Some(d.text.clone());
                }
                if !self.notices.is_empty() {
                    user = format!("{}\n\n{user}", self.notices.join("\n"));
                    kept = format!("{}\n\n{kept}", self.notices.join("\n"));
                    self.notices.clear();
                }
            }
            // The directive and any rejection notice are part of the user
            // turn, as later turns re-read it.
            Some(DirectiveAt::UserTurn) => {
                if let Some(d) = &directive {
                    user = format!("{user}\n\n{}", d.text);
                }
                if !self.notices.is_empty() {
                    user = format!("{}\n\n{user}", self.notices.join("\n"));
                    self.notices.clear();
                }
                kept = user.clone();
            }
        }
        let past = match self.spec.reads {
            // The last two exchanges.
            Reads::Memory {
                rendering: Rendering::Replace,
                ..
            } => {
                let n = self.exchanges.len();
                let from = if n >= 2 { self.exchanges[n - 2] } else { 0 };
                &self.history[from..]
            }
            _ => &self.history[..],
        };
        let mut messages = Vec::with_capacity(past.len() + 2);
        messages.push(Message::new(Role::System, system));
        messages.extend(past.iter().cloned());
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

    /// Sets the module's authorization for the turn (and lets the ablation
    /// corrupt it); returns the directive for the matched step and whether
    /// the gate is active.
    fn consult_module(
        &mut self,
        turn: &Turn,
        matched: Option<&Match>,
    ) -> (Option<Directive>, bool) {
        let Some(m) = &mut self.module else {
            return (None, false);
        };
        m.authorize(matched);
        if let (Some(c), Some(_)) = (&mut self.corruptor, turn.step) {
            c.apply(m, turn.index);
        }
        let directive = matched.and_then(|x| x.step).map(|v| m.directive(v));
        let gated = match self.spec.gate {
            Gate::None => false,
            Gate::ValidatorGated => m.validate().is_empty(),
            Gate::StateBound | Gate::RequestBound => true,
        };
        (directive, gated)
    }

    /// Extracts and gates the bookings of one reply's text; returns them
    /// and the rejection notices it produced.
    pub fn gate(
        &mut self,
        cx: &TurnContext,
        prompt: &TurnPrompt,
        reply: &str,
        call: u8,
    ) -> (Vec<Booking>, Vec<String>) {
        let mut out = Vec::new();
        let mut notices = Vec::new();
        for line in receipt::extract(cx.episode.config.settings.protocol, reply) {
            let citation =
                line.work_order == cx.turn.work_order && decline::is_citation(reply, line.line_no);
            let (booking, reason) = self.judge(cx, prompt, line, citation, call);
            if let Some(reason) = reason {
                let notice = p::rejection_notice(&booking.line.line, &reason);
                notices.push(self.offer_escalation(notice, &booking));
            }
            out.push(booking);
        }
        (out, notices)
    }

    /// A refusal's notice, with the escalation probe's offer when the arm
    /// runs it and the refusal names a step.
    pub fn offer_escalation(&self, notice: String, booking: &Booking) -> String {
        match booking.refusal.as_ref().and_then(Refusal::step) {
            Some(v) if self.escalation => {
                format!("{notice} {}", p::escalation_offer(&v.to_string()))
            }
            _ => notice,
        }
    }

    /// Adds a step to the module's α for this request (a granted escalation).
    pub fn grant(&mut self, v: StepId) {
        if let Some(m) = &mut self.module {
            m.grant(v);
        }
    }

    /// Judges one booking: resolves its step, and for a current booking
    /// asks the module, which refuses it (when gated) or takes its receipt.
    /// Returns the booking and, when refused, the reason to tell the agent.
    /// `executed` says the booking enters the execution channel; the
    /// native tool harness confirms it from the workspace.
    pub fn judge(
        &mut self,
        cx: &TurnContext,
        prompt: &TurnPrompt,
        line: RefLine,
        citation: bool,
        call: u8,
    ) -> (Booking, Option<String>) {
        let requested = cx.matched.and_then(|m| m.step);
        let current = line.work_order == cx.turn.work_order;
        let step = if line.tool.is_empty() {
            cx.episode.step_by_code(&line.code)
        } else {
            cx.episode.step_by_tool(&line.tool)
        };
        let mut refusal = None;
        let mut reason = None;
        let mut receipt = None;
        let mut redo = false;
        if let (true, Some(m)) = (current, &mut self.module) {
            // The module resolves codes through its compiled plan; tools
            // are the harness's own registry.
            let module_step = if line.tool.is_empty() {
                m.step_by_code(&line.code)
            } else {
                step
            };
            let policy = self.spec.policy().unwrap_or(Policy::StateBound);
            match m.verdict(module_step, requested, policy) {
                Err(r) if prompt.gated => {
                    let name = if line.code.is_empty() {
                        &line.tool
                    } else {
                        &line.code
                    };
                    reason = Some(r.reason(name));
                    refusal = Some(r);
                }
                Ok(v) => {
                    // Kept only under the escalation probe, which counts
                    // them (logs without it stay as they were).
                    redo = self.escalation && prompt.gated && m.state.status(v) == Status::Done;
                    receipt = module_step;
                }
                // Receipts advance the module whether or not it gates.
                Err(_) => receipt = module_step,
            }
        }
        // A call that would run may fail (the tool-faults probe); then it
        // ran nothing and no state counts it.
        let runs = current && step.is_some() && refusal.is_none() && !line.tool.is_empty();
        let fault = match &mut self.faults {
            Some(f) if runs => f.draw(cx.turn.index, &line.tool),
            _ => None,
        };
        if let (Some(v), Some(m), None) = (receipt, &mut self.module, fault) {
            m.receipt(v);
        }
        let booking = Booking {
            executed: current && step.is_some() && refusal.is_none() && fault.is_none(),
            line,
            call,
            current,
            step,
            refusal,
            fault,
            redo: redo && fault.is_none(),
            citation,
        };
        (booking, reason)
    }

    /// The same-turn re-prompt: the refused reply and the notice appended.
    pub fn reprompt(&self, prompt: &TurnPrompt, reply: &str, notice: &str) -> Vec<Message> {
        let mut m = prompt.messages.clone();
        m.push(Message::new(Role::Assistant, reply));
        m.push(Message::new(Role::User, notice));
        m
    }

    /// Closes the turn: a memory arm writes the exchange into its memory
    /// (returning what it wrote), then the arm records what later turns
    /// re-read and queues the notices for the next user turn. `chain` is
    /// what followed the user message, in order: the reply, and a same-turn
    /// re-prompt with its reply, or the native harness's calls, tool results
    /// and last reply; `truth` the realized state after the turn.
    pub fn close_turn(
        &mut self,
        cx: &TurnContext,
        prompt: TurnPrompt,
        chain: Vec<Message>,
        next_turn: Vec<String>,
        truth: &TaskState,
    ) -> Option<MemoryTurn> {
        let written = self
            .memory
            .as_mut()
            .map(|m| m.remember(cx.episode, &cx.turn.message, &chain, truth));
        self.exchanges.push(self.history.len());
        self.history
            .push(Message::new(Role::User, prompt.user_for_history));
        let replies: Vec<String> = chain
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .map(|m| m.content.clone())
            .collect();
        self.history.extend(chain);
        self.notices.extend(next_turn);
        if self.spec.ledger() {
            for r in &replies {
                for l in receipt::extract_ledger(r) {
                    match self.ledger.iter_mut().find(|(c, _)| *c == l.code) {
                        Some(e) => e.1 = l.status,
                        None => self.ledger.push((l.code, l.status)),
                    }
                }
            }
        }
        written
    }
}
