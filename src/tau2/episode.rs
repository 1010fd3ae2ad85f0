//! τ²'s half-duplex conversation on statebench's engine: the agent opens
//! with the fixed greeting, then user simulator → agent → (tool calls →
//! environment → agent)* → user simulator … until the simulator ends it or a
//! limit does. The arms act where a tool call is dispatched.
//!
//! An [`Episode`] is the conversation's state machine and does no model call
//! of its own: it says which side speaks next and builds that side's
//! request, and takes the reply. [`run_episodes`] drives many episodes at
//! once, every pending request of every episode in the same backend steps.
//!
//! How τ²'s orchestrator is followed:
//! - Steps count every user message, every agent message and every batch of
//!   tool results (one step for all results of one agent message). After a
//!   step that does not wait on the environment, the step limit and then the
//!   error limit are checked, and either ends the episode — even one the
//!   simulator has just stopped, as τ² overrides the stop reason.
//! - An agent message with tool calls goes to the environment, text and all:
//!   its text stays in the agent's history (and counts for COMMUNICATE) but
//!   the simulator never sees it. Only agent messages without calls reach the
//!   simulator.
//! - Every failed tool call counts as an error: a tool that raises, an
//!   unknown tool, arguments that are not a JSON object. A refusal by the
//!   `gate` or `notice` arm is a tool result, not an error.
//! - `transfer_to_human_agents` is a tool like any other (it answers
//!   "Transfer successful"); the conversation ends when the simulator, told
//!   it is being transferred, says `###TRANSFER###`.
//! - A simulator reply made only of tool calls ends the episode as τ²'s
//!   `user_error` (the airline's simulator has no tools; text beside calls
//!   is kept and the calls dropped).
//! - Episodes ended by the step or error limit, by a user error or by a
//!   failed model call, get reward 0 unchecked (τ² grades only conversations a participant
//!   ended; [`evaluate::evaluate_episode`]).
//!
//! The simulator sees the conversation with roles flipped: the agent's
//! messages as `user`, its own as `assistant`, tool traffic left out. Both
//! sides' histories keep replies with their thinking stripped.
//!
//! Arms: `shown` appends one system message after the conversation in each
//! agent request, holding the rule set's verdicts for the database and
//! history as they are at that turn; it is rebuilt for every request and
//! never enters the history (nor the record). `notice` and `gate` act on
//! writes the arm's rule set refuses (see [`dispatch`]). With receipts read
//! by a model ([`reader`]), a write those arms judge waits, before it is
//! dispatched, on the matcher's reading of the conversation: one more
//! request of the episode, batched with every other.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;

use super::db::FlightDb;
use super::evaluate;
use super::prompts;
use super::reader::{self, Ask, ReceiptReader};
use super::record::{Arm, CallRecord, EpisodeRecord, Reading, Termination};
use super::rules::{MatcherRead, RuleSet, Violation};
use super::task::{Task, Tau2Data};
use super::tools;
use crate::backend::{
    split_thinking, Backend, BackendError, ChatReply, ChatRequest, Message, RequestId, Role,
    SessionId, Tool, ToolCall, Usage,
};

/// τ²'s default step limit (its command line's, not its orchestrator
/// class's 100).
pub const MAX_STEPS: usize = 200;
/// τ²'s default tool-error limit.
pub const MAX_ERRORS: usize = 10;
/// A reply's token budget without thinking (statebench's budget for a turn).
pub const REPLY_TOKENS: usize = 400;
/// A reply's token budget with thinking.
pub const THINKING_REPLY_TOKENS: usize = 2_500;

/// When an episode stops, and how long each side may speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Limits {
    pub max_steps: usize,
    pub max_errors: usize,
    /// Tokens per agent reply, thinking included.
    pub agent_max_tokens: usize,
    /// Tokens per user-simulator reply, thinking included.
    pub user_max_tokens: usize,
    /// The agent thinks (Qwen3 thinking mode).
    pub thinking: bool,
    /// The user simulator thinks.
    pub user_thinking: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits::new(false, false)
    }
}

impl Limits {
    /// τ²'s limits with each side's budget set by whether it thinks.
    pub fn new(thinking: bool, user_thinking: bool) -> Limits {
        let budget = |t: bool| {
            if t {
                THINKING_REPLY_TOKENS
            } else {
                REPLY_TOKENS
            }
        };
        Limits {
            max_steps: MAX_STEPS,
            max_errors: MAX_ERRORS,
            agent_max_tokens: budget(thinking),
            user_max_tokens: budget(user_thinking),
            thinking,
            user_thinking,
        }
    }
}

/// One episode to run: a task under an arm, one trial of it.
#[derive(Debug, Clone)]
pub struct EpisodeSpec {
    pub task: Task,
    pub arm: Arm,
    pub trial: u32,
    /// The seed of every request the episode makes (both sides).
    pub seed: u64,
    /// The compiled rule set the arm uses and its index among the run's
    /// compiles; None on raw.
    pub rules: Option<(usize, Arc<RuleSet>)>,
    pub limits: Limits,
    /// Who reads the receipts the `notice` and `gate` arms judge by.
    pub receipts: ReceiptReader,
}

/// A spec that cannot run.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("task {task}: the {arm} arm needs a rule set and none was given")]
    MissingRules { task: String, arm: &'static str },
}

/// Who speaks next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Agent,
    User,
    /// The matcher reads the conversation for a write about to be judged.
    Matcher,
}

/// What one dispatched tool call left: its record and the tool message the
/// agent reads.
#[derive(Debug, Clone, PartialEq)]
pub struct Dispatched {
    pub record: CallRecord,
    pub result: String,
}

/// Calls the `notice` arm has warned about, by name and arguments: the same
/// call issued again runs (once; a third issue is warned about afresh).
#[derive(Debug, Clone, Default)]
pub struct Noticed(Vec<(String, Value)>);

/// Dispatches one tool call on the given arm.
///
/// Every well-formed call is first judged by the `reference` rules against
/// the database before it runs (`violates`). On `notice` and `gate` the
/// arm's `rules` judge it too; a call they refuse (only writes can be) does
/// not run: on `gate` its result is the rejection; on `notice` it is a
/// warning the first time, and the identical call issued again runs, keeping
/// the rules that flagged it in `refused_by`. `history` is the agent's
/// conversation up to and including the message that made the call;
/// `matcher` a matcher's reading of it for this call, which the arm's rules
/// take in place of their lexical reading (the reference rules never do).
#[allow(clippy::too_many_arguments)]
pub fn dispatch(
    arm: Arm,
    rules: Option<&RuleSet>,
    reference: &RuleSet,
    db: &mut FlightDb,
    history: &[Message],
    noticed: &mut Noticed,
    call: &ToolCall,
    matcher: Option<&MatcherRead>,
) -> Dispatched {
    let name = call.name.as_str();
    let args = match serde_json::from_str::<Value>(&call.arguments) {
        Ok(v) if v.is_object() => v,
        parsed => {
            let why = match parsed {
                Ok(_) => "not an object".to_string(),
                Err(e) => e.to_string(),
            };
            return Dispatched {
                record: CallRecord {
                    name: name.to_string(),
                    arguments: Value::String(call.arguments.clone()),
                    write: tools::is_write(name),
                    executed: false,
                    error: true,
                    refused_by: Vec::new(),
                    violates: Vec::new(),
                },
                result: prompts::malformed_arguments(name, &why),
            };
        }
    };
    let violates = names(&reference.check(db, history, name, &args));
    let verdict: Vec<Violation> = match (arm, rules) {
        (Arm::Notice | Arm::Gate, Some(r)) => r.check_read(db, history, name, &args, matcher),
        _ => Vec::new(),
    };
    let refused_by = names(&verdict);
    let held = |result: String| Dispatched {
        record: CallRecord {
            name: name.to_string(),
            arguments: args.clone(),
            write: tools::is_write(name),
            executed: false,
            error: false,
            refused_by: refused_by.clone(),
            violates: violates.clone(),
        },
        result,
    };
    if !verdict.is_empty() {
        match arm {
            Arm::Gate => return held(prompts::gate(name, &verdict)),
            Arm::Notice => {
                let key = (name.to_string(), args.clone());
                match noticed.0.iter().position(|k| *k == key) {
                    Some(i) => {
                        noticed.0.remove(i);
                    }
                    None => {
                        noticed.0.push(key);
                        return held(prompts::notice(name, &verdict));
                    }
                }
            }
            Arm::Raw | Arm::Shown => {}
        }
    }
    let (result, error) = match tools::call(db, name, &args) {
        Ok(text) => (text, false),
        Err(e) => (tools::error_text(&e), true),
    };
    Dispatched {
        record: CallRecord {
            name: name.to_string(),
            arguments: args,
            write: tools::is_write(name),
            executed: true,
            error,
            refused_by,
            violates,
        },
        result,
    }
}

fn names(v: &[Violation]) -> Vec<String> {
    v.iter().map(|v| v.rule.name().to_string()).collect()
}

/// How a simulator message ends the conversation, if it does. A message
/// holding several tokens counts as out of scope first, then stop, then
/// transfer.
pub fn user_stop(text: &str) -> Option<Termination> {
    [
        (prompts::OUT_OF_SCOPE, Termination::OutOfScope),
        (prompts::STOP, Termination::UserStop),
        (prompts::TRANSFER, Termination::Transfer),
    ]
    .into_iter()
    .find(|(token, _)| text.contains(token))
    .map(|(_, t)| t)
}

/// One conversation in progress.
pub struct Episode<'d> {
    data: &'d Tau2Data,
    spec: EpisodeSpec,
    tools: Arc<Vec<Tool>>,
    reference: Arc<RuleSet>,
    db: FlightDb,
    /// The agent's history as it is sent, system prompt first.
    agent: Vec<Message>,
    /// The simulator's history, roles flipped, its system prompt first.
    user: Vec<Message>,
    calls: Vec<CallRecord>,
    noticed: Noticed,
    /// The calls of the agent's latest message not yet dispatched.
    pending: VecDeque<ToolCall>,
    /// A call waiting on the matcher's reading, and the reading asked.
    asking: Option<(ToolCall, Ask)>,
    readings: Vec<Reading>,
    steps: usize,
    errors: usize,
    next: Result<Side, Termination>,
    agent_usage: Usage,
    user_usage: Usage,
    agent_turns: u32,
    started: Instant,
    error: Option<String>,
}

impl<'d> Episode<'d> {
    /// A fresh conversation on a copy of the data's database: the greeting
    /// said, the simulator to answer it.
    pub fn new(
        data: &'d Tau2Data,
        spec: EpisodeSpec,
        tools: Arc<Vec<Tool>>,
        reference: Arc<RuleSet>,
    ) -> Result<Episode<'d>, SpecError> {
        if spec.arm.uses_rules() && spec.rules.is_none() {
            return Err(SpecError::MissingRules {
                task: spec.task.id.clone(),
                arm: spec.arm.name(),
            });
        }
        let (agent_system, user_system) = match &data.wording {
            Some(w) => (
                w.agent_system(&data.policy),
                w.user_system(
                    &prompts::without_persona(&data.guidelines),
                    &prompts::scenario_text(&spec.task.user),
                ),
            ),
            None => (
                prompts::agent_system(&data.policy),
                prompts::user_system(&data.guidelines, &spec.task.user),
            ),
        };
        let agent = vec![
            Message::new(Role::System, agent_system),
            Message::new(Role::Assistant, prompts::GREETING),
        ];
        let user = vec![
            Message::new(Role::System, user_system),
            Message::new(Role::User, prompts::GREETING),
        ];
        Ok(Episode {
            data,
            db: data.db.clone(),
            spec,
            tools,
            reference,
            agent,
            user,
            calls: Vec::new(),
            noticed: Noticed::default(),
            pending: VecDeque::new(),
            asking: None,
            readings: Vec::new(),
            steps: 0,
            errors: 0,
            next: Ok(Side::User),
            agent_usage: Usage::default(),
            user_usage: Usage::default(),
            agent_turns: 0,
            started: Instant::now(),
            error: None,
        })
    }

    /// Whether a matcher reads the receipts of this episode's writes: a
    /// `notice` or `gate` arm with receipts read by a model.
    pub fn reads_receipts(&self) -> bool {
        self.spec.receipts == ReceiptReader::Model
            && matches!(self.spec.arm, Arm::Notice | Arm::Gate)
    }

    pub fn spec(&self) -> &EpisodeSpec {
        &self.spec
    }

    /// Who speaks next, or how the conversation ended.
    pub fn next(&self) -> Result<Side, Termination> {
        self.next
    }

    pub fn is_done(&self) -> bool {
        self.next.is_err()
    }

    /// The agent's history (system prompt first).
    pub fn agent_history(&self) -> &[Message] {
        &self.agent
    }

    /// The simulator's history, roles flipped (system prompt first).
    pub fn user_history(&self) -> &[Message] {
        &self.user
    }

    /// The episode's database as the executed calls left it.
    pub fn db(&self) -> &FlightDb {
        &self.db
    }

    pub fn calls(&self) -> &[CallRecord] {
        &self.calls
    }

    /// The matcher's readings so far, in call order.
    pub fn readings(&self) -> &[Reading] {
        &self.readings
    }

    /// The request of the side that speaks next; None once done.
    pub fn request(&self) -> Option<(Side, ChatRequest)> {
        let side = self.next.ok()?;
        let l = &self.spec.limits;
        let req = match side {
            Side::Agent => {
                let mut messages = self.agent.clone();
                if let (Arm::Shown, Some((_, rules))) = (self.spec.arm, &self.spec.rules) {
                    messages.push(Message::new(
                        Role::System,
                        prompts::shown(&rules.shown(&self.db, &self.agent)),
                    ));
                }
                ChatRequest {
                    thinking: l.thinking,
                    seed: self.spec.seed,
                    tools: self.tools.as_ref().clone(),
                    ..ChatRequest::greedy(messages, l.agent_max_tokens)
                }
            }
            Side::User => ChatRequest {
                thinking: l.user_thinking,
                seed: self.spec.seed,
                ..ChatRequest::greedy(self.user.clone(), l.user_max_tokens)
            },
            Side::Matcher => self.asking.as_ref()?.1.request.clone(),
        };
        Some((side, req))
    }

    /// Takes the reply to the request of the side that was to speak. A
    /// failed call ends the episode.
    pub fn take(&mut self, reply: Result<ChatReply, BackendError>) {
        let Ok(side) = self.next else { return };
        let reply = match reply {
            Ok(r) => r,
            Err(e) => return self.fail(e.to_string()),
        };
        match side {
            Side::Agent => self.take_agent(reply),
            Side::User => self.take_user(reply),
            Side::Matcher => self.take_reading(reply),
        }
    }

    /// Ends the episode on a failed model call.
    pub fn fail(&mut self, error: String) {
        if self.next.is_ok() {
            self.error = Some(error);
            self.next = Err(Termination::BackendError);
        }
    }

    fn take_user(&mut self, reply: ChatReply) {
        self.user_usage += reply.usage;
        let text = split_thinking(&reply.content).1;
        if text.trim().is_empty() && !reply.tool_calls.is_empty() {
            // The user has no tools: a reply of calls alone says nothing to
            // the agent, and is not passed on as an empty message.
            self.error = Some(format!(
                "the user simulator replied with {} tool call(s) and no text",
                reply.tool_calls.len()
            ));
            self.next = Err(Termination::UserError);
            return;
        }
        self.steps += 1;
        self.user.push(Message::new(Role::Assistant, text.clone()));
        self.next = match user_stop(&text) {
            Some(t) => Err(t),
            None => Ok(Side::Agent),
        };
        self.agent.push(Message::new(Role::User, text));
        self.check_limits();
    }

    fn take_agent(&mut self, reply: ChatReply) {
        self.agent_usage += reply.usage;
        self.agent_turns += 1;
        let text = split_thinking(&reply.content).1;
        self.steps += 1;
        if reply.tool_calls.is_empty() {
            self.agent.push(Message::new(Role::Assistant, text.clone()));
            self.user.push(Message::new(Role::User, text));
            self.next = Ok(Side::User);
            self.check_limits();
            return;
        }
        // Ids unique within the episode, so each result answers one call.
        let calls: Vec<ToolCall> = reply
            .tool_calls
            .into_iter()
            .enumerate()
            .map(|(i, c)| ToolCall {
                id: format!("call_{}", self.calls.len() + i),
                ..c
            })
            .collect();
        self.agent.push(Message::calls(text, calls.clone()));
        self.pending = calls.into();
        self.advance();
    }

    /// Dispatches the latest message's calls in order until one waits on
    /// the matcher; once all ran, their results are one step and the agent
    /// speaks again.
    fn advance(&mut self) {
        while let Some(call) = self.pending.pop_front() {
            if let Some(ask) = self.to_read(&call) {
                self.asking = Some((call, ask));
                self.next = Ok(Side::Matcher);
                return;
            }
            self.run_call(&call, None);
        }
        self.steps += 1;
        self.next = Ok(Side::Agent);
        self.check_limits();
    }

    /// The matcher's reading a call needs first: with receipts read by a
    /// model, a well-formed write the `notice` or `gate` arm's rules read
    /// the conversation for.
    fn to_read(&self, call: &ToolCall) -> Option<Ask> {
        if !self.reads_receipts() {
            return None;
        }
        let (_, rules) = self.spec.rules.as_ref()?;
        let args = serde_json::from_str::<Value>(&call.arguments)
            .ok()
            .filter(Value::is_object)?;
        reader::ask(
            rules,
            &self.db,
            &self.agent,
            &call.name,
            &args,
            self.spec.seed,
        )
    }

    fn take_reading(&mut self, reply: ChatReply) {
        let (Some((call, ask)), Some((_, rules))) = (self.asking.take(), &self.spec.rules) else {
            return;
        };
        let reading = reader::reading(self.calls.len(), ask, &reply, rules);
        let read = reading.read.clone();
        self.readings.push(reading);
        self.run_call(&call, Some(&read));
        self.advance();
    }

    fn run_call(&mut self, call: &ToolCall, matcher: Option<&MatcherRead>) {
        let rules = self.spec.rules.as_ref().map(|(_, r)| r.as_ref());
        let d = dispatch(
            self.spec.arm,
            rules,
            &self.reference,
            &mut self.db,
            &self.agent,
            &mut self.noticed,
            call,
            matcher,
        );
        self.errors += usize::from(d.record.error);
        self.calls.push(d.record);
        self.agent.push(Message::tool_result(&call.id, d.result));
    }

    fn check_limits(&mut self) {
        if self.steps >= self.spec.limits.max_steps {
            self.next = Err(Termination::MaxSteps);
        }
        if self.errors >= self.spec.limits.max_errors {
            self.next = Err(Termination::TooManyErrors);
        }
    }

    /// The record of a finished episode, scored.
    ///
    /// # Panics
    /// If the episode is not done.
    pub fn finish(self) -> EpisodeRecord {
        let termination = self.next.expect_err("finish() on a running episode");
        let texts: Vec<String> = self
            .agent
            .iter()
            .filter(|m| m.role == Role::Assistant && !m.content.trim().is_empty())
            .map(|m| m.content.clone())
            .collect();
        let reward = evaluate::evaluate_episode(
            &self.spec.task,
            &self.data.db,
            termination,
            &self.calls,
            &texts,
        );
        EpisodeRecord {
            task_id: self.spec.task.id.clone(),
            arm: self.spec.arm,
            trial: self.spec.trial,
            seed: self.spec.seed,
            rules: self.spec.rules.as_ref().map(|(i, _)| *i),
            termination,
            messages: self.agent,
            calls: self.calls,
            reward,
            agent_usage: self.agent_usage,
            user_usage: self.user_usage,
            agent_turns: self.agent_turns,
            secs: self.started.elapsed().as_secs_f64(),
            error: self.error,
            readings: self.readings,
            cut: Vec::new(),
        }
    }
}

/// What stopped a run (failed model calls only end their episodes).
#[derive(Debug, thiserror::Error)]
pub enum RunError<E> {
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// `on_done` failed.
    #[error("{0}")]
    Sink(E),
}

/// A live episode and where its requests go: one session per side, so
/// each side's prompt cache carries over (the matcher's only where it
/// reads).
struct Live<'d> {
    ep: Episode<'d>,
    sessions: [Option<SessionId>; 3],
}

/// Which backend: 0 the agent's, 1 the simulator's own, 2 the matcher's own.
type Slot = usize;

/// The backend of `slot`; the agent's where that side has none of its own.
fn backend<'a>(
    agent: &'a mut dyn Backend,
    others: &'a mut [Option<&mut dyn Backend>; 2],
    slot: Slot,
) -> &'a mut dyn Backend {
    match others.get_mut(slot.wrapping_sub(1)) {
        Some(Some(b)) => &mut **b,
        _ => agent,
    }
}

/// Runs episodes together, at most `max_live` at once: every pending agent
/// and simulator request of every live episode goes into the same backend
/// steps, and a finished episode's place goes to the next in `specs` at
/// once, so the batch stays full. `user` None: the agent's backend also
/// plays the user. Each episode has one session per side, so each side's
/// prompt cache carries over from turn to turn. Records are handed to
/// `on_done` as episodes finish; a failed model call ends only its episode
/// (`backend_error`). Records do not depend on which episodes ran together,
/// as the backend's replies do not. `matcher` None: the agent's backend
/// reads the receipts too.
pub fn run_episodes<E>(
    agent: &mut dyn Backend,
    user: Option<&mut dyn Backend>,
    matcher: Option<&mut dyn Backend>,
    data: &Tau2Data,
    specs: Vec<EpisodeSpec>,
    max_live: usize,
    on_done: &mut dyn FnMut(EpisodeRecord) -> Result<(), E>,
) -> Result<(), RunError<E>> {
    let tools = Arc::new(tools::worded(data.wording.as_ref().map(|w| &w.tools)));
    let reference = Arc::new(RuleSet::reference());
    // One lifetime for both (a trait object's may shorten behind `&mut`).
    let mut others: [Option<&mut dyn Backend>; 2] = [
        user.map(|u| u as &mut dyn Backend),
        matcher.map(|m| m as &mut dyn Backend),
    ];
    // Each side's slot: its own backend's, or the agent's.
    let slots: [Slot; 3] = [0, 1, 2].map(|s| match s {
        0 => 0,
        s if others[s - 1].is_some() => s,
        _ => 0,
    });
    let mut queue = specs.into_iter();
    // An episode holds its own copy of the database: built when it starts.
    let mut live: Vec<Option<Live>> = (0..max_live.clamp(1, queue.len().max(1)))
        .map(|_| None)
        .collect();
    let mut flight: HashMap<(Slot, RequestId), usize> = HashMap::new();
    let mut busy = vec![false; live.len()];
    loop {
        for (i, slot) in live.iter_mut().enumerate() {
            // Until this place waits on a reply or has nothing left to run.
            while !busy[i] {
                if slot.is_none() {
                    let Some(spec) = queue.next() else { break };
                    let ep = Episode::new(data, spec, tools.clone(), reference.clone())?;
                    let sides = [true, true, ep.reads_receipts()];
                    let mut sessions = [None; 3];
                    for (s, open) in sides.into_iter().enumerate() {
                        sessions[s] =
                            open.then(|| backend(agent, &mut others, slots[s]).open_session());
                    }
                    *slot = Some(Live { ep, sessions });
                }
                let l = slot.as_mut().expect("filled above");
                if let Some((side, req)) = l.ep.request() {
                    let s = match side {
                        Side::Agent => 0,
                        Side::User => 1,
                        Side::Matcher => 2,
                    };
                    let b = slots[s];
                    let session = l.sessions[s].expect("a side that speaks has a session");
                    match backend(agent, &mut others, b).submit(session, req) {
                        Ok(id) => {
                            flight.insert((b, id), i);
                            busy[i] = true;
                            continue;
                        }
                        Err(e) => l.ep.take(Err(e)),
                    }
                }
                if !l.ep.is_done() {
                    break;
                }
                let l = slot.take().expect("live above");
                for (b, session) in slots.into_iter().zip(l.sessions) {
                    if let Some(session) = session {
                        backend(agent, &mut others, b).close_session(session);
                    }
                }
                on_done(l.ep.finish()).map_err(RunError::Sink)?;
            }
        }
        if flight.is_empty() {
            return Ok(());
        }
        for b in [0, 1, 2] {
            if b != 0 && slots[b] == 0 {
                continue;
            }
            let be = backend(agent, &mut others, b);
            if !be.has_pending() {
                continue;
            }
            match be.step() {
                Ok(finished) => {
                    for (id, result) in finished {
                        let Some(i) = flight.remove(&(b, id)) else {
                            continue;
                        };
                        busy[i] = false;
                        if let Some(l) = live[i].as_mut() {
                            l.ep.take(result);
                        }
                    }
                }
                Err(e) => {
                    // The whole step failed: every request on this backend
                    // ends its episode with the same error.
                    let msg = e.to_string();
                    let ids: Vec<_> = flight.keys().filter(|k| k.0 == b).copied().collect();
                    for k in ids {
                        let i = flight.remove(&k).expect("listed above");
                        busy[i] = false;
                        if let Some(l) = live[i].as_mut() {
                            l.ep.fail(msg.clone());
                        }
                    }
                }
            }
        }
    }
}
