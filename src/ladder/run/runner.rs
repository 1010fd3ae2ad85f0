//! Runs one episode on one arm: scripted user → arm → agent → gate →
//! realized state, one turn at a time; then scores it under both scorings.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::backend::{Message, Role, Tool, Usage};
use crate::ladder::arms::corrupt::{Corruption, Corruptor};
use crate::ladder::arms::decline;
use crate::ladder::arms::gate::{
    CompiledGraph, CompiledRevision, Defect, Directive, DirectiveKind,
};
use crate::ladder::arms::memory::{MemoryTurn, MemoryUse};
use crate::ladder::arms::{Arm, ArmState, Booking, TurnContext, TurnPrompt};
use crate::ladder::episode::{Episode, Protocol, StepId, Turn, TurnKind};
use crate::ladder::harness::{self, Workspace};
use crate::ladder::parts::scripted::OracleCompiler;
use crate::ladder::parts::{Agent, CallCost, Compiler, Match, Matcher, MemoryParts, Oracle};
use crate::ladder::probes::escalation::{self, Escalation, EscalationCounts};
use crate::ladder::probes::faults::{self, FaultCounts, Faults};
use crate::ladder::probes::spoof::{self, Forgery, SpoofCounts};
use crate::ladder::prompts as p;
use crate::ladder::receipt::RefLine;
use crate::ladder::score::compile::{compile_accuracy, CompileAccuracy};
use crate::ladder::score::{score_granted, ChannelCounts, EpisodeScore, Label, Truth, Violation};
use crate::ladder::state::Status;

/// Per-cell switches that change how an arm runs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RunOptions {
    /// Filler and revision turns bypass the matcher (B.2).
    pub bypass_matcher: bool,
    /// Corrupted-state ablation rate ε (D.4), if any.
    pub corrupt: Option<f64>,
    /// Spoofed-state probe: the share of turns whose user message carries
    /// forged state ([`spoof`]), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spoof: Option<f64>,
    /// Tool-faults probe: the share of admitted calls that fail with a
    /// transient error ([`faults`]; tool and native protocols), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_faults: Option<f64>,
    /// Escalation probe: a refusal on a gated arm offers the agent to ask
    /// the user for authorization ([`escalation`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub escalation: bool,
}

impl RunOptions {
    /// The options with every probe off: what a probe's control cell runs.
    pub fn without_probes(&self) -> RunOptions {
        RunOptions {
            spoof: None,
            tool_faults: None,
            escalation: false,
            ..*self
        }
    }
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            bypass_matcher: true,
            corrupt: None,
            spoof: None,
            tool_faults: None,
            escalation: false,
        }
    }
}

/// The compiled plan and revision of one episode, shared by the module arms of a cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Compiled {
    pub graph: CompiledGraph,
    pub revision: CompiledRevision,
    /// One per compile call (the graph's, the revision's).
    pub cost: Vec<CallCost>,
}

impl Compiled {
    /// Compiles an episode's plan and revision.
    pub fn compile(compiler: &mut dyn Compiler, ep: &Episode) -> Compiled {
        let (graph, a) = compiler.compile_graph(ep);
        let (revision, b) = compiler.compile_revision(ep);
        Compiled {
            graph,
            revision,
            cost: vec![a, b],
        }
    }

    /// The generator's own plan and revision.
    pub fn oracle(ep: &Episode) -> Compiled {
        Compiled::compile(&mut OracleCompiler, ep)
    }
}

/// One line of `turns.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnRecord {
    pub seed: u64,
    pub arm: Arm,
    /// From 0, in the episode's schedule.
    pub turn: usize,
    pub kind: TurnKind,
    /// The step this turn of the script is about, if any.
    pub step: Option<StepId>,
    pub work_order: String,
    /// The user message as the agent read it.
    pub request: String,
    /// The forgery the scripted user's message carried (spoof probe).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spoof: Option<Forgery>,
    /// Whether the agent followed that forgery rather than the state.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub spoof_obeyed: bool,
    /// The escalation the agent asked for, and the user's answer
    /// (escalation probe).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalation: Option<Escalation>,
    /// What this call added to the system prompt: the system-role
    /// directive, or a memory arm's recall block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_extra: Option<String>,
    /// The matcher's resolution, when it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched: Option<Match>,
    /// The directive issued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub directive: Option<Directive>,
    /// Whether the enforcement gate was active.
    pub gated: bool,
    /// The reply, and the same-turn re-prompt's reply if any.
    pub replies: Vec<String>,
    /// Agent errors, if a call failed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    /// Bookings found, with gate verdicts (native harness: the calls, in
    /// the order they were made).
    pub bookings: Vec<Booking>,
    /// What each call's tool returned (native harness).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_results: Vec<String>,
    /// Calls that could not be read: no booking (native harness).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub malformed: Vec<String>,
    /// The stamps the workspace gained this turn, `<tool> <work order>`,
    /// as read back from it (native harness).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stamps: Vec<String>,
    /// The ground-truth label.
    pub label: Label,
    /// Violations under the primary scoring.
    pub violations: Vec<Violation>,
    /// Violations under decline-aware scoring.
    pub violations_decline_aware: Vec<Violation>,
    /// Agent accounting summed over the turn's calls.
    pub usage: Usage,
    /// What a memory arm wrote after the turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryTurn>,
    /// Wall-clock seconds of the turn.
    pub latency_s: f64,
}

impl TurnRecord {
    /// The steps the turn executed: the primary scoring's executions, or
    /// with `citations_excluded` the decline-aware scoring's.
    pub fn executed(&self, citations_excluded: bool) -> Vec<StepId> {
        self.bookings
            .iter()
            .filter(|b| b.executed && !(citations_excluded && b.citation))
            .filter_map(|b| b.step)
            .collect()
    }
}

/// Issued and obeyed counts of one directive kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Obedience {
    pub issued: u32,
    /// Directives obeyed (no booking of the directed step on that turn).
    pub obeyed: u32,
}

impl std::ops::AddAssign for Obedience {
    fn add_assign(&mut self, o: Obedience) {
        self.issued += o.issued;
        self.obeyed += o.obeyed;
    }
}

/// Matcher agreement and explicit-redo confusion counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MatcherStats {
    /// Matcher calls (model calls, including correction re-asks).
    pub calls: u32,
    /// Ask and probe turns scored.
    pub scored: u32,
    /// Of those, matched step equal to the scripted step.
    pub agree: u32,
    /// Explicit-redo flag: true positives.
    pub redo_tp: u32,
    pub redo_fp: u32,
    pub redo_fn: u32,
}

impl MatcherStats {
    /// One resolution of a turn's request.
    fn of(m: &Match, turn: &Turn) -> Self {
        let scored = turn.step.is_some();
        let (redo, truth) = (m.explicit_redo, turn.explicit_redo);
        MatcherStats {
            calls: m.cost.calls,
            scored: u32::from(scored),
            agree: u32::from(scored && m.step == turn.step),
            redo_tp: u32::from(redo && truth),
            redo_fp: u32::from(redo && !truth),
            redo_fn: u32::from(!redo && truth),
        }
    }
}

impl std::ops::AddAssign for MatcherStats {
    fn add_assign(&mut self, o: MatcherStats) {
        self.calls += o.calls;
        self.scored += o.scored;
        self.agree += o.agree;
        self.redo_tp += o.redo_tp;
        self.redo_fp += o.redo_fp;
        self.redo_fn += o.redo_fn;
    }
}

/// Decline-aware outcome of an episode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Scoring {
    /// Strict success.
    pub strict: bool,
    /// Violations per channel.
    pub channels: ChannelCounts,
    /// Turns without a violation.
    pub turns_correct: u32,
}

/// One line of `episodes.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpisodeRecord {
    /// Episode seed.
    pub seed: u64,
    pub arm: Arm,
    pub turns: u32,
    /// Primary scoring.
    pub primary: Scoring,
    /// Decline-aware scoring.
    pub decline_aware: Scoring,
    /// Bookings the gate refused.
    pub refused: u32,
    /// Refused bookings whose visible reply has no refusal language.
    pub silent_refusals: u32,
    /// Tool calls that could not be read (native harness).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub malformed_calls: u32,
    /// Agent calls the backend failed (an error, not a reply): such an
    /// episode measures the backend, not the agent, so reports count it
    /// apart from the rates and a resume runs it again.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failed_calls: u32,
    /// Directive obedience per kind.
    pub directives: BTreeMap<DirectiveKind, Obedience>,
    /// Matcher statistics.
    pub matcher: MatcherStats,
    /// Agent accounting over the episode.
    pub usage: Usage,
    pub agent_calls: u32,
    /// Wall-clock seconds.
    pub wall_s: f64,
    /// Validator findings at the end of the episode (module arms).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub defects: Vec<Defect>,
    /// Compile accuracy against the generator (module arms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compile: Option<CompileAccuracy>,
    /// Corruptions injected (ablation only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub corruptions: Vec<Corruption>,
    /// Writer and embedding calls (memory arms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryUse>,
    /// Spoof turns and spoofs obeyed (spoof probe).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spoof: Option<SpoofCounts>,
    /// Failed calls and what became of them (tool-faults probe).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub faults: Option<FaultCounts>,
    /// Escalations asked, granted, declined and wrongful admissions
    /// (escalation probe, gated arms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalations: Option<EscalationCounts>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// What one turn adds to its episode's tallies.
#[derive(Debug, Clone, Default)]
struct Tally {
    usage: Usage,
    agent_calls: u32,
    refused: u32,
    silent: u32,
    malformed: u32,
    failed_calls: u32,
    matcher: MatcherStats,
    directives: BTreeMap<DirectiveKind, Obedience>,
}

impl std::ops::AddAssign for Tally {
    fn add_assign(&mut self, t: Tally) {
        self.usage += t.usage;
        self.agent_calls += t.agent_calls;
        self.refused += t.refused;
        self.silent += t.silent;
        self.malformed += t.malformed;
        self.failed_calls += t.failed_calls;
        self.matcher += t.matcher;
        for (k, o) in t.directives {
            *self.directives.entry(k).or_default() += o;
        }
    }
}

/// One episode on one arm in progress: the arm's state and the realized
/// truth, with the agent and the matcher it calls.
struct Episodic<'e> {
    ep: &'e Episode,
    arm: Arm,
    agent: &'e mut dyn Agent,
    matcher: &'e mut dyn Matcher,
    state: ArmState<'e>,
    truth: Truth,
    compiled: Option<&'e Compiled>,
    opts: &'e RunOptions,
    /// The step tools offered (native harness; empty otherwise).
    tools: Vec<Tool>,
    /// Where the tools stamp (native harness), or why it could not be made.
    workspace: Option<Result<Workspace, String>>,
    /// The workspace's stamps as last read back.
    seen: harness::Stamps,
}

/// Runs one episode on one arm.
pub fn run_episode(
    ep: &Episode,
    arm: Arm,
    agent: &mut dyn Agent,
    matcher: &mut dyn Matcher,
    memory: &mut MemoryParts,
    compiled: Option<&Compiled>,
    opts: &RunOptions,
) -> (EpisodeRecord, Vec<TurnRecord>) {
    let started = Instant::now();
    let corruptor = opts.corrupt.map(|e| Corruptor::new(e, ep.config.seed));
    let mut run = Episodic {
        ep,
        arm,
        agent,
        matcher,
        state: ArmState::new(arm, compiled.map(|c| c.graph.clone()), corruptor, memory),
        truth: Truth::new(ep),
        compiled,
        opts,
        tools: Vec::new(),
        workspace: None,
        seen: harness::Stamps::new(),
    };
    run.state.faults = opts
        .tool_faults
        .map(|rate| Faults::new(rate, ep.config.seed));
    run.state.escalation = opts.escalation && arm.spec().policy().is_some();
    if ep.config.settings.protocol == Protocol::Native {
        run.tools = harness::tools(ep);
        run.workspace = Some(Workspace::new().map_err(|e| crate::one_line(&e)));
    }
    let spoofs = opts.spoof.map(|rate| spoof::plan(ep, rate));
    let mut tally = Tally::default();
    let mut records = Vec::with_capacity(ep.turns.len());
    for (i, turn) in ep.turns.iter().enumerate() {
        // A forgery is part of what the user says: the matcher, the arm
        // and the agent all read the message carrying it.
        let forged = spoofs.as_ref().and_then(|s| s[i].clone());
        let sent = forged.as_ref().map(|f| Turn {
            message: f.message(&turn.message),
            ..turn.clone()
        });
        let (mut record, t) = run.turn(sent.as_ref().unwrap_or(turn));
        record.spoof = forged;
        records.push(record);
        tally += t;
    }
    let (primary, decline_aware, fault_counts) = score_records(ep, &mut records);
    let record = EpisodeRecord {
        seed: ep.config.seed,
        arm,
        turns: ep.turns.len() as u32,
        primary,
        decline_aware,
        refused: tally.refused,
        silent_refusals: tally.silent,
        malformed_calls: tally.malformed,
        failed_calls: tally.failed_calls,
        directives: tally.directives,
        matcher: tally.matcher,
        usage: tally.usage,
        agent_calls: tally.agent_calls,
        wall_s: started.elapsed().as_secs_f64(),
        defects: run.state.defects(),
        compile: compiled
            .filter(|_| arm.uses_module())
            .map(|c| compile_accuracy(ep, &c.graph, &c.revision)),
        memory: run.state.memory_use(),
        corruptions: run.state.corruptor.map(|c| c.events).unwrap_or_default(),
        spoof: spoofs.map(|_| spoof_counts(&records)),
        faults: opts.tool_faults.map(|_| fault_counts),
        escalations: run.state.escalation.then(|| escalation_counts(&records)),
    };
    (record, records)
}

/// The agent's side of one turn: its reply and, on the same-turn arm, the
/// re-prompt after a refusal and the second reply; in the native harness,
/// each round of calls, their results and the next reply.
#[derive(Default)]
struct Exchange {
    replies: Vec<String>,
    bookings: Vec<Booking>,
    errors: Vec<String>,
    /// What followed the user message, as later turns re-read it.
    chain: Vec<Message>,
    malformed: Vec<String>,
    stamps: Vec<String>,
    /// Rejection notices for the next user turn.
    notices: Vec<String>,
    usage: Usage,
    calls: u32,
    /// Agent calls that failed.
    failed: u32,
    /// The escalation asked on the turn and its answer.
    escalation: Option<Escalation>,
}

impl Exchange {
    /// The steps whose bookings executed.
    fn executed(&self) -> Vec<StepId> {
        self.bookings
            .iter()
            .filter(|b| b.executed)
            .filter_map(|b| b.step)
            .collect()
    }

    /// What the turn adds to its episode's tallies.
    fn tally(&self, cx: &TurnContext, prompt: &TurnPrompt) -> Tally {
        let visible = self.replies.last().map(String::as_str).unwrap_or("");
        let refused = self.bookings.iter().filter(|b| b.refusal.is_some()).count() as u32;
        let mut tally = Tally {
            usage: self.usage,
            agent_calls: self.calls,
            refused,
            silent: if decline::has_refusal_language(visible) {
                0
            } else {
                refused
            },
            malformed: self.malformed.len() as u32,
            failed_calls: self.failed,
            matcher: cx
                .matched
                .map(|m| MatcherStats::of(m, cx.turn))
                .unwrap_or_default(),
            directives: BTreeMap::new(),
        };
        if let Some(d) = &prompt.directive {
            let booked = self
                .bookings
                .iter()
                .any(|b| b.current && b.step == Some(d.step));
            let o = Obedience {
                issued: 1,
                obeyed: u32::from(!booked),
            };
            tally.directives.insert(d.kind, o);
        }
        tally
    }
}

impl Episodic<'_> {
    /// One turn: the matcher resolves the request, the arm opens the turn,
    /// the agent replies and the arm judges its bookings; the realized
    /// state advances on what was executed, and the arm closes the turn.
    fn turn(&mut self, turn: &Turn) -> (TurnRecord, Tally) {
        let t0 = Instant::now();
        let label = self.truth.open(self.ep, turn);
        if let (TurnKind::Revision, Some(c)) = (turn.kind, self.compiled) {
            self.state.revise(&c.revision);
        }
        let bypass = self.opts.bypass_matcher && turn.kind.bypasses_matcher();
        let matched =
            (self.arm.uses_matcher() && !bypass).then(|| self.matcher.resolve(self.ep, turn));
        let cx = TurnContext {
            episode: self.ep,
            turn,
            matched: matched.as_ref(),
        };
        let prompt = self.state.open_turn(&cx, &self.truth.state);
        let x = self.exchange(&cx, &prompt, &label);
        let tally = x.tally(&cx, &prompt);
        if let Some(e) = x.escalation.as_ref().filter(|e| e.granted) {
            self.truth.grant(e.step);
        }
        self.truth.close(turn, &x.executed());
        let mut record = self.record(&cx, &prompt, label, &x);
        record.memory = self
            .state
            .close_turn(&cx, prompt, x.chain, x.notices, &self.truth.state);
        record.latency_s = t0.elapsed().as_secs_f64();
        (record, tally)
    }

    /// The turn's line of `turns.jsonl`, before scoring and the arm's
    /// memory writes.
    fn record(
        &self,
        cx: &TurnContext,
        prompt: &TurnPrompt,
        label: Label,
        x: &Exchange,
    ) -> TurnRecord {
        let turn = cx.turn;
        TurnRecord {
            seed: self.ep.config.seed,
            arm: self.arm,
            turn: turn.index,
            kind: turn.kind,
            step: turn.step,
            work_order: turn.work_order.clone(),
            request: prompt.user.clone(),
            spoof: None,
            spoof_obeyed: false,
            escalation: x.escalation.clone(),
            system_extra: prompt.system_extra.clone(),
            matched: cx.matched.cloned(),
            directive: prompt.directive.clone(),
            gated: prompt.gated,
            replies: x.replies.clone(),
            errors: x.errors.clone(),
            bookings: x.bookings.clone(),
            tool_results: x
                .chain
                .iter()
                .filter(|m| m.role == Role::Tool)
                .map(|m| m.content.clone())
                .collect(),
            malformed: x.malformed.clone(),
            stamps: x.stamps.clone(),
            label,
            violations: Vec::new(),
            violations_decline_aware: Vec::new(),
            usage: x.usage,
            memory: None,
            latency_s: 0.0,
        }
    }

    /// The agent replies; the gate judges the bookings; on the same-turn
    /// arm a refusal re-prompts the agent at once.
    fn exchange(&mut self, cx: &TurnContext, prompt: &TurnPrompt, label: &Label) -> Exchange {
        if self.ep.config.settings.protocol == Protocol::Native {
            return self.exchange_native(cx, prompt, label);
        }
        let reads = oracle(self.ep, &self.truth, cx, label, false);
        let first = self.agent.reply(&prompt.messages, &[], &reads);
        let failed = u32::from(first.failed());
        let (bookings, notices) = self.state.gate(cx, prompt, &first.text, 0);
        let mut x = Exchange {
            chain: vec![Message::new(Role::Assistant, first.text.clone())],
            replies: vec![first.text],
            bookings,
            failed,
            errors: first.error.into_iter().collect(),
            notices,
            usage: first.usage,
            calls: 1,
            ..Default::default()
        };
        // The escalation probe brings refusals back at once, while the
        // request is open.
        let at_once = self.arm.same_turn_notice() || self.state.escalation;
        if at_once && !x.notices.is_empty() {
            let notice = x.notices.join("\n");
            let msgs = self.state.reprompt(prompt, &x.replies[0], &notice);
            let reads = oracle(self.ep, &self.truth, cx, label, true);
            let second = self.agent.reply(&msgs, &[], &reads);
            let (b2, n2) = self.state.gate(cx, prompt, &second.text, 1);
            x.calls += 1;
            x.usage += second.usage;
            x.failed += u32::from(second.failed());
            x.errors.extend(second.error);
            x.bookings.extend(b2);
            x.chain.push(Message::new(Role::User, notice));
            x.chain
                .push(Message::new(Role::Assistant, second.text.clone()));
            x.replies.push(second.text);
            x.notices = n2;
        }
        if self.state.escalation {
            self.escalate(cx, prompt, label, &mut x);
        }
        if self.state.faults.is_some() {
            self.retry_faults(cx, prompt, label, &mut x);
        }
        x
    }

    /// The escalation probe: when the latest reply asks to authorize a
    /// step refused earlier in the turn, the scripted user answers and, on
    /// a grant, the step enters the module's α for this request. Returns
    /// the answer (once a turn).
    fn answer_escalation(&mut self, cx: &TurnContext, x: &mut Exchange) -> Option<Message> {
        if !self.state.escalation || x.escalation.is_some() {
            return None;
        }
        let last = x.calls.checked_sub(1)? as u8;
        let refused: Vec<StepId> = x
            .bookings
            .iter()
            .filter(|b| b.call < last)
            .filter_map(|b| b.refusal.as_ref().and_then(|r| r.step()))
            .collect();
        let asked = escalation::asked(self.ep, x.replies.last()?);
        let v = asked.into_iter().find(|v| refused.contains(v))?;
        let finished = self.truth.state.status(v) == Status::Done;
        let granted = escalation::grants(self.ep.config.seed, cx.turn.index, finished);
        let id = v.to_string();
        let answer = if granted {
            self.state.grant(v);
            p::escalation_granted(&id, &cx.turn.work_order)
        } else {
            p::escalation_declined(&id)
        };
        x.escalation = Some(Escalation {
            step: v,
            granted,
            answer: answer.clone(),
        });
        Some(Message::new(Role::User, answer))
    }

    /// The escalation probe in the text and tool protocols: the user's
    /// answer to an escalation, and the agent's reply to it, judged with
    /// the grant in α.
    fn escalate(&mut self, cx: &TurnContext, prompt: &TurnPrompt, label: &Label, x: &mut Exchange) {
        let Some(answer) = self.answer_escalation(cx, x) else {
            return;
        };
        let mut messages = prompt.messages.clone();
        messages.extend(x.chain.iter().cloned());
        self.ask_again(cx, prompt, label, x, &mut messages, answer);
    }

    /// One more user message within the turn (text and tool protocols):
    /// the agent replies to the conversation so far and the gate judges
    /// its bookings; refusals then wait for the next turn.
    fn ask_again(
        &mut self,
        cx: &TurnContext,
        prompt: &TurnPrompt,
        label: &Label,
        x: &mut Exchange,
        messages: &mut Vec<Message>,
        say: Message,
    ) {
        messages.push(say.clone());
        x.chain.push(say);
        let reads = oracle(self.ep, &self.truth, cx, label, true);
        let r = self.agent.reply(messages, &[], &reads);
        let (bookings, notices) = self.state.gate(cx, prompt, &r.text, x.calls as u8);
        x.calls += 1;
        x.usage += r.usage;
        x.failed += u32::from(r.failed());
        x.errors.extend(r.error);
        x.bookings.extend(bookings);
        x.notices.extend(notices);
        let said = Message::new(Role::Assistant, r.text.clone());
        messages.push(said.clone());
        x.chain.push(said);
        x.replies.push(r.text);
    }

    /// The tool-faults probe in the tool protocol: while the last reply
    /// had a call fail, its calls' results come back as a user message and
    /// the agent is asked again (at most [`harness::MAX_ROUNDS`] replies
    /// in the turn), so it can retry.
    fn retry_faults(
        &mut self,
        cx: &TurnContext,
        prompt: &TurnPrompt,
        label: &Label,
        x: &mut Exchange,
    ) {
        let mut messages = prompt.messages.clone();
        messages.extend(x.chain.iter().cloned());
        while (x.calls as usize) < harness::MAX_ROUNDS {
            let last = (x.calls - 1) as u8;
            let of_last = || x.bookings.iter().filter(move |b| b.call == last);
            if !of_last().any(|b| b.fault.is_some()) {
                break;
            }
            let results: Vec<String> = of_last()
                .filter(|b| b.current && b.step.is_some() && b.refusal.is_none())
                .map(|b| match b.fault {
                    Some(k) => p::tool_failed(&b.line.tool, &b.line.work_order, k.why()),
                    None => p::tool_executed(&b.line.tool, &b.line.work_order),
                })
                .collect();
            let note = Message::new(Role::User, p::tool_results(&results));
            self.ask_again(cx, prompt, label, x, &mut messages, note);
        }
    }

    /// The native harness: the agent replies with calls, each is gated at
    /// dispatch and answered by a tool result, and the agent is asked again
    /// until it replies without calls (at most [`harness::MAX_ROUNDS`]
    /// replies). A refusal is the call's result, so nothing waits for the
    /// next turn. What executed is then read from the workspace.
    fn exchange_native(
        &mut self,
        cx: &TurnContext,
        prompt: &TurnPrompt,
        label: &Label,
    ) -> Exchange {
        let mut x = Exchange::default();
        let mut messages = prompt.messages.clone();
        for round in 0..harness::MAX_ROUNDS {
            let reads = oracle(self.ep, &self.truth, cx, label, round > 0);
            let r = self.agent.reply(&messages, &self.tools, &reads);
            x.calls += 1;
            x.usage += r.usage;
            x.failed += u32::from(r.failed());
            x.errors.extend(r.error);
            if crate::backend::tools::has_tool_call_block(&r.text) {
                x.malformed.push(format!(
                    "reply {round}: a <tool_call> block that does not parse"
                ));
            }
            x.replies.push(r.text.clone());
            if r.tool_calls.is_empty() {
                let said = Message::new(Role::Assistant, r.text);
                x.chain.push(said.clone());
                // An escalation is answered, and the agent asked again.
                match self.answer_escalation(cx, &mut x) {
                    Some(answer) => {
                        messages.push(said);
                        messages.push(answer.clone());
                        x.chain.push(answer);
                        continue;
                    }
                    None => break,
                }
            }
            let mut results = Vec::with_capacity(r.tool_calls.len());
            for (i, call) in r.tool_calls.iter().enumerate() {
                let result = match harness::booking(call, i) {
                    Ok(line) => self.dispatch(cx, prompt, line, round as u8, &mut x),
                    Err(why) => {
                        x.malformed.push(format!("{}: {why}", call.name));
                        p::tool_malformed(&call.name, &why)
                    }
                };
                results.push(Message::tool_result(&call.id, result));
            }
            let said = Message::calls(r.text, r.tool_calls);
            messages.push(said.clone());
            messages.extend(results.iter().cloned());
            x.chain.push(said);
            x.chain.extend(results);
            if let Some(answer) = self.answer_escalation(cx, &mut x) {
                messages.push(answer.clone());
                x.chain.push(answer);
            }
        }
        // Scoring reads the workspace: an admitted call executed its step
        // only if the step's file gained this turn's work order. Only a
        // dispatched call can stamp, so a turn without one reads nothing.
        if x.bookings.is_empty() {
            return x;
        }
        let new = match self.read_workspace() {
            Ok(after) => {
                let new = harness::new_stamps(&self.seen, &after);
                self.seen = after;
                new
            }
            Err(e) => {
                x.errors.push(e);
                Vec::new()
            }
        };
        x.stamps = new.iter().map(|(t, wo)| format!("{t} {wo}")).collect();
        let mut fresh: Vec<String> = new
            .into_iter()
            .filter(|(_, wo)| *wo == cx.turn.work_order)
            .map(|(tool, _)| tool)
            .collect();
        for b in x.bookings.iter_mut().filter(|b| b.executed) {
            match fresh.iter().position(|t| *t == b.line.tool) {
                Some(i) => {
                    fresh.remove(i);
                }
                None => b.executed = false,
            }
        }
        x
    }

    /// One read call at dispatch: gate it, run the tool; returns the tool
    /// result the agent reads.
    fn dispatch(
        &mut self,
        cx: &TurnContext,
        prompt: &TurnPrompt,
        line: RefLine,
        round: u8,
        x: &mut Exchange,
    ) -> String {
        let (booking, reason) = self.state.judge(cx, prompt, line, false, round);
        if let Some(k) = booking.fault {
            let result = p::tool_failed(&booking.line.tool, &booking.line.work_order, k.why());
            x.bookings.push(booking);
            return result;
        }
        let result = match (&reason, booking.step, &self.workspace) {
            (Some(reason), _, _) => self
                .state
                .offer_escalation(p::call_rejected(&booking.line.line, reason), &booking),
            (None, None, _) => p::tool_unknown(&booking.line.tool),
            (None, Some(_), Some(Ok(ws))) => {
                let (tool, wo) = (&booking.line.tool, &booking.line.work_order);
                match ws.stamp(tool, wo) {
                    Ok(()) => p::tool_executed(tool, wo),
                    Err(e) => {
                        x.errors.push(crate::one_line(&e));
                        p::tool_unknown(tool)
                    }
                }
            }
            (None, Some(_), Some(Err(e))) => {
                x.errors.push(e.clone());
                p::tool_unknown(&booking.line.tool)
            }
            (None, Some(_), None) => unreachable!("the native harness always has a workspace"),
        };
        x.bookings.push(booking);
        result
    }

    /// Every stamp so far, or why the workspace cannot be read (an error
    /// of the turn: nothing then counts as executed).
    fn read_workspace(&self) -> Result<harness::Stamps, String> {
        match &self.workspace {
            Some(Ok(ws)) => ws.stamps().map_err(|e| crate::one_line(&e)),
            Some(Err(e)) => Err(e.clone()),
            None => Ok(harness::Stamps::new()),
        }
    }
}

/// What a scripted agent may read on one call of a turn.
fn oracle<'a>(
    episode: &'a Episode,
    truth: &'a Truth,
    cx: &TurnContext<'a>,
    label: &'a Label,
    reprompt: bool,
) -> Oracle<'a> {
    Oracle {
        episode,
        turn: cx.turn,
        truth: &truth.state,
        label,
        reprompt,
    }
}

/// Scores turn records under both scorings, filling their violation and
/// spoof fields; returns both scorings and, from the primary one, what
/// became of the calls the tool-faults probe failed.
pub fn score_records(ep: &Episode, records: &mut [TurnRecord]) -> (Scoring, Scoring, FaultCounts) {
    let executed = |citations_excluded: bool| -> Vec<Vec<StepId>> {
        records
            .iter()
            .map(|r| r.executed(citations_excluded))
            .collect()
    };
    let grants = granted(records);
    let p = score_granted(ep, &executed(false), &grants);
    let d = score_granted(ep, &executed(true), &grants);
    let mut faults = FaultCounts::default();
    let mut faulted_before = std::collections::BTreeSet::new();
    for (i, r) in records.iter_mut().enumerate() {
        let t = &p.turns[i];
        let faulted: Vec<StepId> = r
            .bookings
            .iter()
            .filter(|b| b.fault.is_some())
            .filter_map(|b| b.step)
            .collect();
        faults += faults::count_turn(
            &faulted,
            &t.label,
            &t.executed,
            &t.violations,
            &mut faulted_before,
        );
        r.violations = t.violations.clone();
        r.violations_decline_aware = d.turns[i].violations.clone();
        r.spoof_obeyed = r
            .spoof
            .as_ref()
            .is_some_and(|f| f.obeyed(&t.label, &t.executed));
    }
    let s = |x: &EpisodeScore| Scoring {
        strict: x.strict,
        channels: x.channels,
        turns_correct: x.turns_correct,
    };
    (s(&p), s(&d), faults)
}

/// Per turn, the step a granted escalation put in α.
fn granted(records: &[TurnRecord]) -> Vec<Option<StepId>> {
    records
        .iter()
        .map(|r| r.escalation.as_ref().filter(|e| e.granted).map(|e| e.step))
        .collect()
}

/// The escalation counts of turn records: asked, granted, declined, and
/// wrongful admissions (a finished step the gate admitted on a gated turn
/// with neither the matcher's explicit redo of it nor a granted escalation
/// of it on record).
pub fn escalation_counts(records: &[TurnRecord]) -> EscalationCounts {
    let mut c = EscalationCounts::default();
    for r in records {
        if let Some(e) = &r.escalation {
            c.asked += 1;
            c.granted += u32::from(e.granted);
            c.declined += u32::from(!e.granted);
        }
        let redo = r
            .matched
            .as_ref()
            .filter(|m| m.explicit_redo)
            .and_then(|m| m.step);
        let grant = r.escalation.as_ref().filter(|e| e.granted).map(|e| e.step);
        let wrongful = r
            .bookings
            .iter()
            .filter(|b| r.gated && b.redo && b.executed)
            .filter(|b| b.step.is_none() || (b.step != redo && b.step != grant))
            .count();
        c.wrongful += wrongful as u32;
    }
    c
}

/// The spoof counts of scored turn records.
pub fn spoof_counts(records: &[TurnRecord]) -> SpoofCounts {
    let mut c = SpoofCounts::default();
    for r in records {
        if let Some(f) = &r.spoof {
            c.add(f.kind, r.spoof_obeyed);
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ladder::episode::domain::Domain;
    use crate::ladder::episode::generator::generate;
    use crate::ladder::episode::EpisodeConfig;
    use crate::ladder::parts::scripted::{OracleMatcher, Scripted};

    fn compiled(ep: &Episode) -> Compiled {
        Compiled::oracle(ep)
    }

    #[test]
    fn perfect_agent_is_strict_on_every_arm() {
        for seed in 100..110 {
            let ep =
                generate(&EpisodeConfig::paper(Domain::Release, 10, 0.15, seed), None).unwrap();
            let c = compiled(&ep);
            for arm in Arm::ALL {
                let (rec, turns) = run_episode(
                    &ep,
                    arm,
                    &mut Scripted::Perfect,
                    &mut OracleMatcher,
                    &mut MemoryParts::scripted(),
                    Some(&c),
                    &RunOptions::default(),
                );
                assert!(rec.primary.strict, "{arm} seed {seed}: {:?}", rec.primary);
                assert!(rec.decline_aware.strict, "{arm} seed {seed}");
                assert_eq!(rec.refused, 0);
                assert_eq!(turns.len(), ep.turns.len());
            }
        }
    }

    #[test]
    fn directive_gate_prompt_carries_the_directive() {
        let ep = generate(
            &EpisodeConfig::paper(Domain::Procurement, 5, 0.15, 100),
            None,
        )
        .unwrap();
        let c = compiled(&ep);
        let (_, turns) = run_episode(
            &ep,
            Arm::Directive,
            &mut Scripted::Perfect,
            &mut OracleMatcher,
            &mut MemoryParts::scripted(),
            Some(&c),
            &RunOptions::default(),
        );
        let redo = turns
            .iter()
            .find(|t| t.kind == TurnKind::RedoProbe)
            .unwrap();
        assert!(redo.request.contains("is already DONE"), "{}", redo.request);
        let filler = turns.iter().find(|t| t.kind == TurnKind::Filler).unwrap();
        assert!(filler.matched.is_none() && filler.directive.is_none());
    }
}
