//! The airline study's conversation loop: τ²'s turn order, stop tokens and
//! limits, the simulator's flipped view, the arms at dispatch, and batched
//! driving — first with scripted replies, then on the tiny random-weight
//! model, where batched episodes must equal episodes run one at a time.

mod engine_common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use serde_json::json;
use statebench::backend::{
    Backend, BackendError, ChatReply, ChatRequest, Finish, Finished, Message, ModelIdentity,
    RequestId, Role, SessionId, ToolCall, Usage,
};
use statebench::tau2::episode::{
    dispatch, run_episodes, user_stop, Episode, EpisodeSpec, Limits, Noticed, Side,
};
use statebench::tau2::prompts;
use statebench::tau2::reader::ReceiptReader;
use statebench::tau2::rules::{RuleSet, ToRead};
use statebench::tau2::task::Tau2Data;
use statebench::tau2::{tools, Arm, EpisodeRecord, Termination};

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/tau2-airline")
}

fn data() -> &'static Tau2Data {
    static DATA: OnceLock<Tau2Data> = OnceLock::new();
    DATA.get_or_init(|| Tau2Data::open(&data_dir()).expect("the τ² airline data loads"))
}

fn reference() -> Arc<RuleSet> {
    Arc::new(RuleSet::reference())
}

fn spec(task: usize, arm: Arm, limits: Limits) -> EpisodeSpec {
    EpisodeSpec {
        task: data().tasks[task].clone(),
        arm,
        trial: 0,
        seed: 300 + task as u64,
        rules: arm.uses_rules().then(|| (0, reference())),
        limits,
        receipts: ReceiptReader::Lexical,
    }
}

fn episode(task: usize, arm: Arm, limits: Limits) -> Episode<'static> {
    Episode::new(
        data(),
        spec(task, arm, limits),
        Arc::new(tools::schemas()),
        reference(),
    )
    .expect("spec is complete")
}

fn reply(text: &str, calls: &[(&str, &str)]) -> ChatReply {
    ChatReply {
        content: text.to_string(),
        reasoning: None,
        finish: Finish::Stop,
        usage: Usage {
            prompt_tokens: 10,
            completion_tokens: 3,
            ..Usage::default()
        },
        tokens: vec![1, 2, 3],
        tool_calls: calls
            .iter()
            .enumerate()
            .map(|(i, (name, args))| ToolCall {
                id: format!("call_{i}"),
                name: name.to_string(),
                arguments: args.to_string(),
            })
            .collect(),
        logprobs: Vec::new(),
        prompt: Vec::new(),
    }
}

/// Task 0: Emma Kim (emma_kim_9957) wants reservation EHGLP3 cancelled.
const USER: &str = "emma_kim_9957";
const RESERVATION: &str = "EHGLP3";

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "the τ² airline data (../shared/tau2-airline) is absent"
)]
fn the_agent_greets_and_the_simulator_sees_roles_flipped() {
    let mut ep = episode(0, Arm::Raw, Limits::default());
    let (side, req) = ep.request().unwrap();
    assert_eq!(side, Side::User);
    assert!(req.tools.is_empty(), "the simulator is offered no tools");
    assert_eq!(req.temperature, 0.0);
    assert_eq!(req.max_tokens, Limits::default().user_max_tokens);
    assert_eq!(req.messages.len(), 2);
    assert_eq!(req.messages[0].role, Role::System);
    assert!(req.messages[0]
        .content
        .starts_with(data().guidelines.trim_end()));
    assert!(
        req.messages[0].content.contains("EHGLP3"),
        "scenario in the prompt"
    );
    assert_eq!(
        req.messages[1],
        Message::new(Role::User, prompts::GREETING),
        "the greeting reaches the simulator as the other party's words"
    );

    ep.take(Ok(reply("I need to cancel a trip.", &[])));
    let (side, req) = ep.request().unwrap();
    assert_eq!(side, Side::Agent);
    assert_eq!(req.tools, tools::schemas());
    assert!(req.messages[0].content.contains(data().policy.trim()));
    assert_eq!(
        req.messages[1..],
        [
            Message::new(Role::Assistant, prompts::GREETING),
            Message::new(Role::User, "I need to cancel a trip."),
        ]
    );

    // Text with a call goes to the environment: the agent keeps its text,
    // the simulator never sees it.
    let args = format!("{{\"user_id\": \"{USER}\"}}");
    ep.take(Ok(reply(
        "<think>look them up</think>Let me look you up.",
        &[("get_user_details", &args)],
    )));
    assert_eq!(ep.next(), Ok(Side::Agent));
    let h = ep.agent_history();
    assert_eq!(h[3].role, Role::Assistant);
    assert_eq!(h[3].content, "Let me look you up.", "thinking stripped");
    assert_eq!(h[3].tool_calls[0].id, "call_0");
    assert_eq!(h[4].role, Role::Tool);
    assert_eq!(h[4].tool_call_id, "call_0");
    assert!(h[4].content.contains(USER), "{}", h[4].content);
    assert_eq!(
        ep.user_history().len(),
        3,
        "nothing of the call reaches the user"
    );
    assert_eq!(ep.calls().len(), 1);
    assert!(ep.calls()[0].executed && !ep.calls()[0].error && !ep.calls()[0].write);

    ep.take(Ok(reply("<think>ok</think>\nWhich reservation?", &[])));
    assert_eq!(ep.next(), Ok(Side::User));
    let u = ep.user_history();
    assert_eq!(
        u[1..],
        [
            Message::new(Role::User, prompts::GREETING),
            Message::new(Role::Assistant, "I need to cancel a trip."),
            Message::new(Role::User, "Which reservation?"),
        ]
    );
    // The second call's id follows the first's within the episode.
    ep.take(Ok(reply(&format!("{RESERVATION} please."), &[])));
    ep.take(Ok(reply(
        "",
        &[(
            "get_reservation_details",
            &format!("{{\"reservation_id\": \"{RESERVATION}\"}}"),
        )],
    )));
    assert_eq!(ep.agent_history().last().unwrap().tool_call_id, "call_1");
}

#[test]
fn stop_tokens_are_read_as_tau2_reads_them() {
    assert_eq!(user_stop("Thanks! ###STOP###"), Some(Termination::UserStop));
    assert_eq!(user_stop("###TRANSFER###"), Some(Termination::Transfer));
    assert_eq!(
        user_stop("I can't say. ###OUT-OF-SCOPE###"),
        Some(Termination::OutOfScope)
    );
    assert_eq!(
        user_stop("###STOP### ###OUT-OF-SCOPE###"),
        Some(Termination::OutOfScope)
    );
    assert_eq!(user_stop("stop, please"), None);
}

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "the τ² airline data (../shared/tau2-airline) is absent"
)]
fn a_stop_token_ends_the_episode_and_the_record_is_scored() {
    for (text, want) in [
        ("All done. ###STOP###", Termination::UserStop),
        ("###TRANSFER###", Termination::Transfer),
        ("###OUT-OF-SCOPE###", Termination::OutOfScope),
    ] {
        let mut ep = episode(0, Arm::Raw, Limits::default());
        ep.take(Ok(reply("Cancel EHGLP3 for me.", &[])));
        ep.take(Ok(reply("I cannot cancel that one.", &[])));
        ep.take(Ok(reply(text, &[])));
        assert_eq!(ep.next(), Err(want));
        assert!(ep.request().is_none());
        let r = ep.finish();
        assert_eq!(r.termination, want);
        assert_eq!(r.agent_turns, 1);
        assert_eq!(r.messages.last().unwrap().content, text);
        assert_eq!(r.user_usage.prompt_tokens, 20);
        assert_eq!(r.agent_usage.prompt_tokens, 10);
        // Task 0 has no gold write: an agent that changed nothing matches
        // the gold database.
        assert_eq!(r.reward.db_match, Some(true));
    }
}

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "the τ² airline data (../shared/tau2-airline) is absent"
)]
fn the_step_limit_counts_every_message_and_overrides_a_stop() {
    let limits = Limits {
        max_steps: 3,
        ..Limits::default()
    };
    let mut ep = episode(0, Arm::Raw, limits);
    ep.take(Ok(reply("Hello.", &[]))); // step 1
    ep.take(Ok(reply("Hi, what do you need?", &[]))); // step 2
    ep.take(Ok(reply("Nothing. ###STOP###", &[]))); // step 3
    assert_eq!(ep.next(), Err(Termination::MaxSteps));
    let r = ep.finish();
    assert_eq!(
        r.reward.reward, 0.0,
        "τ² does not grade a run cut by its limit"
    );

    // A call and its results are two steps: the limit falls after the
    // environment answered, not between the call and its result.
    let mut ep = episode(0, Arm::Raw, limits);
    ep.take(Ok(reply("Hello.", &[])));
    let args = format!("{{\"user_id\": \"{USER}\"}}");
    ep.take(Ok(reply("", &[("get_user_details", &args)])));
    assert_eq!(ep.next(), Err(Termination::MaxSteps));
    assert_eq!(ep.agent_history().last().unwrap().role, Role::Tool);
}

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "the τ² airline data (../shared/tau2-airline) is absent"
)]
fn failed_calls_count_as_errors_up_to_the_limit() {
    let limits = Limits {
        max_errors: 3,
        ..Limits::default()
    };
    let mut ep = episode(0, Arm::Raw, limits);
    ep.take(Ok(reply("Hello.", &[])));
    ep.take(Ok(reply(
        "",
        &[
            ("get_user_details", "{\"user_id\": "),
            ("get_user_details", "[\"emma_kim_9957\"]"),
        ],
    )));
    assert_eq!(ep.next(), Ok(Side::Agent));
    let c = ep.calls();
    assert!(c.iter().all(|c| c.error && !c.executed));
    assert_eq!(c[0].arguments, json!("{\"user_id\": "), "raw text kept");
    let h = ep.agent_history();
    assert!(h[h.len() - 1].content.starts_with("Error: "));
    assert!(h[h.len() - 2].content.starts_with("Error: "));
    ep.take(Ok(reply("", &[("book_a_spaceship", "{}")])));
    assert_eq!(ep.next(), Err(Termination::TooManyErrors));
    let r = ep.finish();
    assert!(
        r.calls[2].executed && r.calls[2].error,
        "an unknown tool ran and failed"
    );
    assert_eq!(r.reward.reward, 0.0);
}

/// A cancellation straight after the user asked for it, with no details
/// read and no confirmation: the reference rules refuse it.
fn unconfirmed_cancel() -> (Vec<Message>, ToolCall) {
    let call = ToolCall {
        id: "call_0".into(),
        name: "cancel_reservation".into(),
        arguments: format!("{{\"reservation_id\": \"{RESERVATION}\"}}"),
    };
    let history = vec![
        Message::new(Role::System, prompts::agent_system(&data().policy)),
        Message::new(Role::Assistant, prompts::GREETING),
        Message::new(Role::User, format!("Cancel reservation {RESERVATION}.")),
        Message::calls("", vec![call.clone()]),
    ];
    (history, call)
}

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "the τ² airline data (../shared/tau2-airline) is absent"
)]
fn the_gate_refuses_a_write_and_changes_nothing() {
    let reference = RuleSet::reference();
    let (history, call) = unconfirmed_cancel();
    let args: serde_json::Value = serde_json::from_str(&call.arguments).unwrap();
    let broken = reference.check(&data().db, &history, &call.name, &args);
    assert!(
        !broken.is_empty(),
        "the reference rules refuse the cancellation"
    );

    let mut db = data().db.clone();
    let d = dispatch(
        Arm::Gate,
        Some(&reference),
        &reference,
        &mut db,
        &history,
        &mut Noticed::default(),
        &call,
        None,
    );
    assert_eq!(d.result, prompts::gate(&call.name, &broken));
    assert!(d.record.write && !d.record.executed && !d.record.error);
    let names: Vec<String> = broken.iter().map(|v| v.rule.name().to_string()).collect();
    assert_eq!(d.record.refused_by, names);
    assert_eq!(d.record.violates, names);
    assert!(db == data().db, "the database is unchanged");

    // Raw runs it: a wrongful write, judged by the reference rules.
    let d = dispatch(
        Arm::Raw,
        None,
        &reference,
        &mut db,
        &history,
        &mut Noticed::default(),
        &call,
        None,
    );
    assert!(d.record.executed && !d.record.error, "{}", d.result);
    assert!(d.record.refused_by.is_empty());
    assert_eq!(d.record.violates, names);
    assert!(db != data().db);
    assert_eq!(
        db.reservations[RESERVATION].status.as_deref(),
        Some("cancelled")
    );
}

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "the τ² airline data (../shared/tau2-airline) is absent"
)]
fn only_a_change_that_ran_unlocks_the_delay_certificate() {
    // M61CQM: ethan_martin_2396's (silver) economy reservation for three,
    // its second flight delayed. $50 a passenger is due once the
    // reservation was changed; a change the arm held back is no change.
    let reference = RuleSet::reference();
    let call = |id: &str, name: &str, args: serde_json::Value| ToolCall {
        id: id.into(),
        name: name.into(),
        arguments: args.to_string(),
    };
    let lookup = call(
        "call_0",
        "get_user_details",
        json!({ "user_id": "ethan_martin_2396" }),
    );
    let bags = call(
        "call_1",
        "update_reservation_baggages",
        json!({ "reservation_id": "M61CQM", "total_baggages": 3, "nonfree_baggages": 0, "payment_id": "credit_card_5447957" }),
    );
    let certificate = call(
        "call_2",
        "send_certificate",
        json!({ "user_id": "ethan_martin_2396", "amount": 150 }),
    );
    let mut db = data().db.clone();
    let mut history = vec![
        Message::new(Role::System, prompts::agent_system(&data().policy)),
        Message::new(Role::Assistant, prompts::GREETING),
        Message::new(
            Role::User,
            "My flight on M61CQM is delayed; add a bag each for the three of us.",
        ),
        Message::calls("", vec![lookup.clone()]),
    ];
    let looked = tools::call(
        &mut db,
        &lookup.name,
        &serde_json::from_str(&lookup.arguments).unwrap(),
    )
    .unwrap();
    history.push(Message::tool_result(&lookup.id, looked));
    // The bag change, unconfirmed: the gate holds it back.
    history.push(Message::calls("", vec![bags.clone()]));
    let held = dispatch(
        Arm::Gate,
        Some(&reference),
        &reference,
        &mut db,
        &history,
        &mut Noticed::default(),
        &bags,
        None,
    );
    assert!(!held.record.executed, "{}", held.result);
    assert!(prompts::held(&held.result));
    let before = history.clone();
    history.push(Message::tool_result(&bags.id, held.result));
    history.push(Message::calls("", vec![certificate.clone()]));
    let args: serde_json::Value = serde_json::from_str(&certificate.arguments).unwrap();
    let v = reference.check(&db, &history, &certificate.name, &args);
    assert!(
        v.iter().any(|v| v.rule.name() == "certificate_eligibility"),
        "a held change unlocked the certificate: {v:?}"
    );

    // The same change run (raw) unlocks it.
    let mut history = before;
    let ran = dispatch(
        Arm::Raw,
        None,
        &reference,
        &mut db,
        &history,
        &mut Noticed::default(),
        &bags,
        None,
    );
    assert!(ran.record.executed && !ran.record.error, "{}", ran.result);
    history.push(Message::tool_result(&bags.id, ran.result));
    history.push(Message::calls("", vec![certificate.clone()]));
    let v = reference.check(&db, &history, &certificate.name, &args);
    assert!(
        !v.iter().any(|v| v.rule.name() == "certificate_eligibility"),
        "{v:?}"
    );
}

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "the τ² airline data (../shared/tau2-airline) is absent"
)]
fn a_notice_warns_once_and_the_same_call_again_runs() {
    let reference = RuleSet::reference();
    let (history, call) = unconfirmed_cancel();
    let mut db = data().db.clone();
    let mut noticed = Noticed::default();
    let go = |db: &mut _, call: &ToolCall, noticed: &mut Noticed| {
        dispatch(
            Arm::Notice,
            Some(&reference),
            &reference,
            db,
            &history,
            noticed,
            call,
            None,
        )
    };
    let first = go(&mut db, &call, &mut noticed);
    assert!(!first.record.executed && !first.record.error);
    assert!(!first.record.refused_by.is_empty());
    assert!(first
        .result
        .starts_with("NOTICE: cancel_reservation was NOT executed"));
    assert!(first.result.contains(&first.record.refused_by[0]));
    assert!(db == data().db);

    // Another call is warned about on its own.
    let other = ToolCall {
        arguments: "{\"reservation_id\": \"NOSUCH\"}".into(),
        ..call.clone()
    };
    let d = go(&mut db, &other, &mut noticed);
    assert!(!d.record.refused_by.is_empty() && !d.record.executed);

    // The same call, arguments spelt differently but equal, runs.
    let again = ToolCall {
        id: "call_7".into(),
        arguments: format!("{{ \"reservation_id\":\"{RESERVATION}\" }}"),
        ..call.clone()
    };
    let second = go(&mut db, &again, &mut noticed);
    assert!(
        second.record.executed && !second.record.error,
        "{}",
        second.result
    );
    assert_eq!(second.record.refused_by, first.record.refused_by);
    assert!(db != data().db);
    // Its pass was used: a third issue is warned about afresh.
    let third = go(&mut db, &call, &mut noticed);
    assert!(!third.record.refused_by.is_empty() && !third.record.executed);
    assert!(third.result.starts_with("NOTICE: "));
}

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "the τ² airline data (../shared/tau2-airline) is absent"
)]
fn shown_verdicts_are_rebuilt_each_turn_and_never_kept() {
    let rules = reference();
    let mut ep = episode(0, Arm::Shown, Limits::default());
    ep.take(Ok(reply("Cancel EHGLP3 please.", &[])));
    let (_, req) = ep.request().unwrap();
    let last = req.messages.last().unwrap();
    assert_eq!(last.role, Role::System);
    assert_eq!(
        last.content,
        prompts::shown(&rules.shown(ep.db(), ep.agent_history()))
    );
    assert_eq!(req.messages.len(), ep.agent_history().len() + 1);

    ep.take(Ok(reply(
        "",
        &[(
            "get_reservation_details",
            &format!("{{\"reservation_id\": \"{RESERVATION}\"}}"),
        )],
    )));
    let systems = |m: &[Message]| m.iter().filter(|m| m.role == Role::System).count();
    assert_eq!(
        systems(ep.agent_history()),
        1,
        "only the system prompt is kept"
    );
    let (_, req) = ep.request().unwrap();
    assert_eq!(systems(&req.messages), 2);
    assert_eq!(
        req.messages.last().unwrap().content,
        prompts::shown(&rules.shown(ep.db(), ep.agent_history()))
    );
    assert!(ep.calls()[0].refused_by.is_empty(), "shown refuses nothing");

    // Raw has no such block.
    let mut raw = episode(0, Arm::Raw, Limits::default());
    raw.take(Ok(reply("Cancel EHGLP3 please.", &[])));
    let (_, req) = raw.request().unwrap();
    assert_eq!(systems(&req.messages), 1);
}

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "the τ² airline data (../shared/tau2-airline) is absent"
)]
fn an_arm_with_rules_needs_a_rule_set() {
    let mut s = spec(0, Arm::Gate, Limits::default());
    s.rules = None;
    let e = Episode::new(data(), s, Arc::new(tools::schemas()), reference());
    assert!(e.is_err());
}

/// A backend answering every queued request in each step from a script.
struct Scripted<F> {
    answer: F,
    queue: Vec<(RequestId, SessionId, ChatRequest)>,
    open: HashSet<SessionId>,
    /// The most sessions open at once.
    most_open: usize,
    sessions: u64,
    requests: u64,
    /// Requests answered per step.
    batches: Vec<usize>,
}

impl<F: FnMut(&ChatRequest) -> Result<ChatReply, BackendError>> Scripted<F> {
    fn new(answer: F) -> Self {
        Scripted {
            answer,
            queue: Vec::new(),
            open: HashSet::new(),
            most_open: 0,
            sessions: 0,
            requests: 0,
            batches: Vec::new(),
        }
    }
}

impl<F: FnMut(&ChatRequest) -> Result<ChatReply, BackendError>> Backend for Scripted<F> {
    fn open_session(&mut self) -> SessionId {
        self.sessions += 1;
        self.open.insert(SessionId(self.sessions));
        self.most_open = self.most_open.max(self.open.len());
        SessionId(self.sessions)
    }
    fn close_session(&mut self, s: SessionId) {
        assert!(self.open.remove(&s), "closed an unknown session");
    }
    fn submit(&mut self, s: SessionId, req: ChatRequest) -> Result<RequestId, BackendError> {
        if !self.open.contains(&s) {
            return Err(BackendError::UnknownSession(s));
        }
        if self.queue.iter().any(|q| q.1 == s) {
            return Err(BackendError::SessionBusy(s));
        }
        self.requests += 1;
        self.queue.push((RequestId(self.requests), s, req));
        Ok(RequestId(self.requests))
    }
    fn step(&mut self) -> Result<Finished, BackendError> {
        let queue = std::mem::take(&mut self.queue);
        self.batches.push(queue.len());
        Ok(queue
            .into_iter()
            .map(|(id, _, req)| (id, (self.answer)(&req)))
            .collect())
    }
    fn has_pending(&self) -> bool {
        !self.queue.is_empty()
    }
    fn model_id(&self) -> Result<ModelIdentity, BackendError> {
        Ok(ModelIdentity {
            name: "scripted".into(),
            source: "tests".into(),
            weights_sha256: String::new(),
            architecture: String::new(),
            format: String::new(),
            arithmetic: String::new(),
            device: String::new(),
        })
    }
}

/// The script: the user asks, the agent looks the user up, answers, and
/// the user stops; seed 13 fails on the agent's first call.
fn script(req: &ChatRequest) -> Result<ChatReply, BackendError> {
    let last = &req.messages.last().unwrap().content;
    if req.tools.is_empty() {
        return Ok(if last == prompts::GREETING {
            reply(&format!("Hi, I am {USER}. Cancel {RESERVATION}."), &[])
        } else {
            reply("Thanks. ###STOP###", &[])
        });
    }
    if req.seed == 13 {
        return Err(BackendError::BadRequest("scripted failure".into()));
    }
    Ok(if req.messages.last().unwrap().role == Role::Tool {
        reply("Your reservation EHGLP3 cannot be refunded.", &[])
    } else {
        reply(
            "Let me look.",
            &[("get_user_details", &format!("{{\"user_id\": \"{USER}\"}}"))],
        )
    })
}

fn stable(mut r: EpisodeRecord) -> String {
    r.secs = 0.0;
    for u in [&mut r.agent_usage, &mut r.user_usage] {
        u.prefill_secs = 0.0;
        u.decode_secs = 0.0;
    }
    serde_json::to_string(&r).unwrap()
}

/// Runs `specs` with at most `max_live` live at once; records sorted.
fn run(backend: &mut dyn Backend, specs: Vec<EpisodeSpec>, max_live: usize) -> Vec<EpisodeRecord> {
    let mut out = Vec::new();
    run_episodes::<std::convert::Infallible>(
        backend,
        None,
        None,
        data(),
        specs,
        max_live,
        &mut |r| {
            out.push(r);
            Ok(())
        },
    )
    .expect("runs");
    out.sort_by_key(|r| (r.task_id.clone(), r.arm, r.trial));
    out
}

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "the τ² airline data (../shared/tau2-airline) is absent"
)]
fn scripted_episodes_run_together_as_they_run_alone() {
    let specs = || {
        let mut failing = spec(1, Arm::Raw, Limits::default());
        failing.seed = 13;
        vec![
            spec(0, Arm::Raw, Limits::default()),
            spec(0, Arm::Gate, Limits::default()),
            failing,
        ]
    };
    let mut together = Scripted::new(script);
    let batched = run(&mut together, specs(), 3);
    assert!(together.open.is_empty(), "every session is closed");
    assert!(
        together.batches.iter().any(|&n| n >= 3),
        "requests of several episodes share steps: {:?}",
        together.batches
    );
    assert_eq!(batched.len(), 3);
    let ok = &batched[0];
    assert_eq!((ok.task_id.as_str(), ok.arm), ("0", Arm::Raw));
    assert_eq!(ok.termination, Termination::UserStop);
    assert_eq!(ok.agent_turns, 2);
    assert_eq!(ok.calls.len(), 1);
    assert!(ok.calls[0].executed);
    let roles: Vec<Role> = ok.messages.iter().map(|m| m.role).collect();
    use Role::*;
    assert_eq!(
        roles,
        [System, Assistant, User, Assistant, Tool, Assistant, User]
    );
    assert_eq!(batched[1].arm, Arm::Gate);
    assert_eq!(batched[1].rules, Some(0));
    let failed = &batched[2];
    assert_eq!(failed.termination, Termination::BackendError);
    assert!(failed
        .error
        .as_deref()
        .unwrap()
        .contains("scripted failure"));
    assert_eq!(failed.reward.reward, 0.0);

    let mut alone = Vec::new();
    let mut steps_alone = Vec::new();
    for s in specs() {
        let mut b = Scripted::new(script);
        alone.extend(run(&mut b, vec![s], 1));
        steps_alone.push(b.batches.len());
    }
    let batched: Vec<String> = batched.into_iter().map(stable).collect();
    assert_eq!(batched, alone.into_iter().map(stable).collect::<Vec<_>>());

    // Two places for three episodes: the failing one ends on its first
    // call and the third takes its place at once, beside the first.
    let mut two = Scripted::new(script);
    let [ok, gate, failing]: [EpisodeSpec; 3] = specs().try_into().unwrap();
    let streamed = run(&mut two, vec![failing, ok, gate], 2);
    assert_eq!(
        streamed.into_iter().map(stable).collect::<Vec<_>>(),
        batched
    );
    assert_eq!(two.most_open, 4, "two episodes live, a session per side");
    assert!(two.batches.iter().all(|&n| n <= 2), "{:?}", two.batches);
    assert!(
        two.batches.len() < steps_alone[0] + steps_alone[1],
        "the third episode ran beside the second: {:?} against {steps_alone:?} alone",
        two.batches
    );
}

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "the τ² airline data (../shared/tau2-airline) is absent"
)]
fn tiny_model_episodes_are_well_formed_and_batch_invariant() {
    let tmp = tempfile::tempdir().unwrap();
    // The policy and the tool schemas take most of this context on the tiny
    // model's byte-level vocabulary.
    let model = engine_common::tiny_copy(tmp.path(), "tiny-qwen2", 32_768);
    let limits = Limits {
        max_steps: 5,
        agent_max_tokens: 12,
        user_max_tokens: 12,
        ..Limits::default()
    };
    let specs = || {
        let mut v = Vec::new();
        for task in [0, 1] {
            for arm in [Arm::Raw, Arm::Gate] {
                v.push(spec(task, arm, limits));
            }
        }
        v
    };
    let mut engine = engine_common::load(&model);
    let batched = run(&mut engine, specs(), 4);
    assert_eq!(batched.len(), 4);
    for r in &batched {
        assert!(r.error.is_none(), "{:?}", r.error);
        assert_eq!(r.termination, Termination::MaxSteps, "{r:?}");
        assert_eq!(r.messages[0].role, Role::System);
        assert_eq!(r.messages[1].content, prompts::GREETING);
        assert!(r.agent_turns >= 1);
        assert!(r.agent_usage.prompt_tokens > 0 && r.agent_usage.completion_tokens > 0);
        assert!(r.user_usage.prompt_tokens > 0 && r.user_usage.completion_tokens > 0);
        assert!(
            r.agent_usage.cached_tokens > 0,
            "the agent's session reuses its prefix"
        );
        assert_eq!(r.reward.reward, 0.0);
        assert_eq!(r.rules.is_some(), r.arm == Arm::Gate);
    }
    let mut alone = Vec::new();
    for s in specs() {
        alone.extend(run(&mut engine, vec![s], 1));
    }
    assert_eq!(
        batched.into_iter().map(stable).collect::<Vec<_>>(),
        alone.into_iter().map(stable).collect::<Vec<_>>()
    );
}

/// 8B92J5: aarav_lee_3563's (regular) insured economy reservation, booked
/// days before τ²'s now, nothing flown: only an insured reason makes it
/// cancellable.
const INSURED: &str = "8B92J5";
const INSURED_USER: &str = "aarav_lee_3563";

/// A gate episode on the reference rules whose receipts a matcher reads,
/// brought to the agent's cancellation of 8B92J5 after it asked and the
/// user answered `answer`.
fn to_the_cancellation(answer: &str) -> Episode<'static> {
    let mut s = spec(0, Arm::Gate, Limits::default());
    s.receipts = ReceiptReader::Model;
    let mut ep = Episode::new(data(), s, Arc::new(tools::schemas()), reference()).unwrap();
    ep.take(Ok(reply(
        &format!("I am {INSURED_USER}. I want to cancel {INSURED}; I am unwell."),
        &[],
    )));
    let lookup = format!("{{\"user_id\": \"{INSURED_USER}\"}}");
    ep.take(Ok(reply("", &[("get_user_details", &lookup)])));
    assert_eq!(ep.next(), Ok(Side::Agent), "a read needs no reading");
    ep.take(Ok(reply(
        &format!("I can cancel reservation {INSURED} and refund it. Shall I go ahead?"),
        &[],
    )));
    ep.take(Ok(reply(answer, &[])));
    let cancel = format!("{{\"reservation_id\": \"{INSURED}\"}}");
    ep.take(Ok(reply("", &[("cancel_reservation", &cancel)])));
    ep
}

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "the τ² airline data (../shared/tau2-airline) is absent"
)]
fn the_matchers_reading_decides_where_the_gate_reads_the_conversation() {
    // The write waits on the matcher: a bounded JSON request of its own.
    let mut ep = to_the_cancellation("Sounds fine.");
    assert_eq!(ep.next(), Ok(Side::Matcher));
    let (side, req) = ep.request().unwrap();
    assert_eq!(side, Side::Matcher);
    assert!(req.tools.is_empty() && !req.thinking && req.temperature == 0.0);
    assert_eq!(req.max_tokens, statebench::tau2::reader::READ_TOKENS);
    assert_eq!(req.messages[0].content, prompts::READER_SYSTEM);
    let prompt = &req.messages[1].content;
    for part in [
        "cancel_reservation",
        INSURED,
        "Shall I go ahead?",
        "Sounds fine.",
    ] {
        assert!(prompt.contains(part), "{part} missing from {prompt}");
    }
    match &req.constraint {
        Some(statebench::backend::Constraint::JsonSchema(s)) => {
            let both = ToRead {
                confirmation: true,
                reason: true,
            };
            assert_eq!(
                *s,
                statebench::tau2::reader::schema(&RuleSet::reference(), both)
            );
        }
        c => panic!("the reading is not bounded by a schema: {c:?}"),
    }
    assert_eq!(ep.calls().len(), 1, "the cancellation has not run yet");

    // The matcher reads no yes: refused for that alone.
    ep.take(Ok(reply(
        r#"{"agent_listed_this_action": true, "customer_reply": "no", "reason": "health"}"#,
        &[],
    )));
    assert_eq!(ep.next(), Ok(Side::Agent));
    let c = &ep.calls()[1];
    assert!(!c.executed, "{c:?}");
    assert_eq!(c.refused_by, ["explicit_confirmation"]);

    // Read as a yes with a covered reason: it runs.
    let mut ep = to_the_cancellation("Sounds fine.");
    ep.take(Ok(reply(
        r#"{"agent_listed_this_action": true, "customer_reply": "yes", "reason": "health"}"#,
        &[],
    )));
    let c = &ep.calls()[1];
    assert!(c.executed && !c.error && c.refused_by.is_empty(), "{c:?}");

    // A yes without a covered reason: cancel_eligibility refuses, whatever
    // the words say ("unwell" is a health reason lexically).
    let mut ep = to_the_cancellation("Sounds fine.");
    ep.take(Ok(reply(
        r#"{"agent_listed_this_action": true, "customer_reply": "yes", "reason": "none"}"#,
        &[],
    )));
    assert_eq!(ep.calls()[1].refused_by, ["cancel_eligibility"]);

    // An unreadable reply is no yes and no reason, counted as unreadable.
    let mut ep = to_the_cancellation("Sounds fine.");
    ep.take(Ok(reply("Yes.", &[])));
    let c = ep.calls()[1].clone();
    assert!(!c.executed);
    assert!(c.refused_by.contains(&"explicit_confirmation".to_string()));
    assert_eq!(ep.readings().len(), 1);
    let reading = &ep.readings()[0];
    assert_eq!(reading.call, 1);
    assert!(reading.error.is_some());
    assert_eq!(reading.read.confirmed, Some(false));
    assert_eq!(reading.read.reason, None);
    // The lexical reading of the same receipts sits beside it.
    assert_eq!(reading.lexical.reason.as_deref(), Some("health"));
    assert!(reading.lexical.confirmed.is_some());
    // The reference rules that score the call never read by the matcher.
    assert_eq!(
        c.violates,
        RuleSet::reference()
            .check(
                &data().db,
                &ep.agent_history()[..ep.agent_history().len() - 1],
                "cancel_reservation",
                &json!({ "reservation_id": INSURED })
            )
            .iter()
            .map(|v| v.rule.name().to_string())
            .collect::<Vec<_>>()
    );
}

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "the τ² airline data (../shared/tau2-airline) is absent"
)]
fn arms_that_do_not_judge_at_dispatch_ask_no_reading() {
    for arm in [Arm::Raw, Arm::Shown] {
        let mut s = spec(0, arm, Limits::default());
        s.receipts = ReceiptReader::Model;
        let mut ep = Episode::new(data(), s, Arc::new(tools::schemas()), reference()).unwrap();
        assert!(!ep.reads_receipts());
        ep.take(Ok(reply("Cancel EHGLP3.", &[])));
        let cancel = format!("{{\"reservation_id\": \"{RESERVATION}\"}}");
        ep.take(Ok(reply("", &[("cancel_reservation", &cancel)])));
        assert_eq!(ep.next(), Ok(Side::Agent), "{arm:?}");
        assert!(ep.calls()[0].executed);
    }
}

/// The script, with a matcher that reads every confirmation as a yes.
fn script_with_matcher(req: &ChatRequest) -> Result<ChatReply, BackendError> {
    if req.messages[0].content == prompts::READER_SYSTEM {
        return Ok(reply(
            r#"{"agent_listed_this_action": true, "customer_reply": "yes", "reason": "none"}"#,
            &[],
        ));
    }
    let last = req.messages.last().unwrap();
    if req.tools.is_empty() {
        // The user: asks to cancel, says yes when asked, then stops.
        return Ok(match last.content.as_str() {
            prompts::GREETING => reply(&format!("Cancel {RESERVATION}, please."), &[]),
            c if c.starts_with("Shall I") => reply("Yes, go ahead.", &[]),
            _ => reply("Thanks. ###STOP###", &[]),
        });
    }
    // The agent asks, then cancels once the user answered.
    Ok(match last.role {
        Role::Tool => reply("Done.", &[]),
        _ if last.content.contains("Cancel") => {
            reply(&format!("Shall I cancel reservation {RESERVATION}?"), &[])
        }
        _ => reply(
            "",
            &[(
                "cancel_reservation",
                &format!("{{\"reservation_id\": \"{RESERVATION}\"}}"),
            )],
        ),
    })
}

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "the τ² airline data (../shared/tau2-airline) is absent"
)]
fn readings_go_to_the_matchers_backend_and_batch_with_the_others() {
    let specs = || {
        (0..3)
            .map(|trial| {
                let mut s = spec(0, Arm::Gate, Limits::default());
                s.trial = trial;
                s.receipts = ReceiptReader::Model;
                s
            })
            .collect::<Vec<_>>()
    };
    // On the agent's backend: each episode's reading is one more request,
    // in the same steps as the other episodes' requests.
    let mut one = Scripted::new(script_with_matcher);
    let shared = run(&mut one, specs(), 3);
    assert!(one.open.is_empty(), "every session is closed");
    assert_eq!(one.most_open, 9, "three episodes, a session per side");
    for r in &shared {
        assert_eq!(r.readings.len(), 1, "{r:?}");
        assert_eq!(r.readings[0].read.confirmed, Some(true));
    }
    assert!(one.batches.iter().any(|&n| n >= 3), "{:?}", one.batches);

    // A matcher of its own gets the readings and nothing else.
    let mut agent = Scripted::new(script_with_matcher);
    let mut matcher = Scripted::new(script_with_matcher);
    let mut out = Vec::new();
    run_episodes::<std::convert::Infallible>(
        &mut agent,
        None,
        Some(&mut matcher),
        data(),
        specs(),
        3,
        &mut |r| {
            out.push(r);
            Ok(())
        },
    )
    .unwrap();
    out.sort_by_key(|r| r.trial);
    assert_eq!(matcher.requests, 3, "one reading per episode");
    assert_eq!(matcher.most_open, 3);
    assert!(matcher.open.is_empty() && agent.open.is_empty());
    assert_eq!(agent.requests + matcher.requests, one.requests);
    let stable_all = |v: Vec<EpisodeRecord>| v.into_iter().map(stable).collect::<Vec<_>>();
    assert_eq!(stable_all(out), stable_all(shared));
}
