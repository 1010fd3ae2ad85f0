//! Suite 6: the reference rule set against the real airline data.
//!
//! - Gold replay: each task's gold actions run in order on a fresh
//!   database, inside a conversation holding the receipts a careful agent
//!   would have (the user's opening: the task's reason for calling, known
//!   info and instructions; a successful `get_user_details` of the task's
//!   user; before each write the agent's description of it and the user's
//!   "yes"). The reference admits every gold write of `tasks.json` but the
//!   one in [`UNDECIDED`]. Two cancellations rest on the user's words about
//!   insurance: task 7 (59XX6W, "you are sick") and task 19 ("you feel
//!   unwell"); both are admitted.
//! - The first release's tasks: the reference refuses the gold writes in
//!   [`RELEASE_REFUSED`], each by the rule named there; the later task file
//!   dropped or corrected all but 39's:
//!   - 2 and 38 send noah_muller_9847 $50 for a delayed flight: none of his
//!     reservations has a delayed (or cancelled) flight in this database;
//!   - 7 upgrades XEHM4B to economy, then cancels it and 59XX6W: economy
//!     without insurance, booked long ago; 59XX6W is insured but this
//!     release's instructions give no covered reason (the current file
//!     upgrades to business and makes the user sick);
//!   - 9 and 37 cancel NQNU5R, whose first flight has landed;
//!   - 27 sends $150 for a delayed flight without the reservation being
//!     changed or cancelled first;
//!   - 29 changes VA5SGQ (DTW-LGA round trip) to DTW-JFK flights: a new
//!     destination (the current file cancels and books anew);
//!   - 33 charges two bags to a gold economy passenger whose three are free;
//!   - 39 cancels MSJ4OA, as in the current file ([`UNDECIDED`]);
//!   - 44 cancels S61CZX, insured economy booked 13 days before, with no
//!     reason given (the current file says the user is healthy and keeps it).
//! - One scripted violation per rule: a real call on the real database that
//!   breaks exactly that rule, beside one that breaks none.
//! - Confirmation: [`REPLIES`], 78 user answers to "Shall I proceed?"
//!   written for this suite and labelled as a careful rater would, each
//!   read as labelled; and conversations in which a yes answers the wrong
//!   question, names another action, or precedes lookups.

mod tau2_replies;

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use statebench::backend::{Message, Role, ToolCall};
use statebench::tau2::compile::{agreement, parse, CompileError};
use statebench::tau2::db::FlightDb;
use statebench::tau2::rules::{affirms, RuleId, RuleSet, Violation};
use statebench::tau2::task::{Task, TaskFile, Tau2Data};
use statebench::tau2::tools;
use tau2_replies::REPLIES;

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/tau2-airline")
}

/// Gold writes of `tasks.json` the policy's text cannot decide: (task id,
/// action id, why). The reference refuses them.
const UNDECIDED: &[(&str, &str, &str)] = &[(
    "39",
    "39_10",
    "cancels MSJ4OA (economy, insured, booked 10 days before) for the user \
     to give up the seat to someone else: the policy lets insurance cancel \
     only for health or weather, which this reason is not, yet the gold \
     treats the insured reservation as cancellable while the task refuses \
     the uninsured basic economy ones; insurance alone is not a ground the \
     text gives",
)];

/// Gold writes of `tasks_release.json` the reference refuses: (task id,
/// action id, rule).
const RELEASE_REFUSED: &[(&str, &str, &str)] = &[
    ("2", "2_3", "certificate_eligibility"),
    ("7", "7_3", "cancel_eligibility"),
    ("7", "7_4", "cancel_eligibility"),
    ("9", "9_0", "cancel_eligibility"),
    ("27", "27_1", "certificate_eligibility"),
    ("29", "29_1", "change_keeps_route"),
    ("33", "33_4", "baggage_allowance"),
    ("37", "37_0", "cancel_eligibility"),
    ("38", "38_2", "certificate_eligibility"),
    ("39", "39_10", "cancel_eligibility"),
    ("44", "44_16", "cancel_eligibility"),
];

/// An agent conversation being written, and the database it acts on.
struct Conversation {
    messages: Vec<Message>,
    db: FlightDb,
    calls: usize,
}

impl Conversation {
    fn new(db: FlightDb, opening: &str) -> Self {
        Conversation {
            messages: vec![
                Message::new(Role::Assistant, "Hi! How can I help you today?"),
                Message::new(Role::User, opening),
            ],
            db,
            calls: 0,
        }
    }

    /// The agent calls a tool; its result joins the conversation.
    fn call(&mut self, name: &str, args: &Value) {
        self.calls += 1;
        let id = format!("call_{}", self.calls);
        let content = match tools::call(&mut self.db, name, args) {
            Ok(text) => text,
            Err(e) => tools::error_text(&e),
        };
        self.messages.push(Message::calls(
            "",
            vec![ToolCall {
                id: id.clone(),
                name: name.into(),
                arguments: args.to_string(),
            }],
        ));
        self.messages.push(Message::tool_result(&id, content));
    }

    /// The agent describes a write and the user answers.
    fn ask(&mut self, name: &str, args: &Value, answer: &str) {
        self.messages.push(Message::new(
            Role::Assistant,
            format!("I will run {name} with {args}. Shall I proceed?"),
        ));
        self.messages.push(Message::new(Role::User, answer));
    }

    fn check(&self, rules: &RuleSet, name: &str, args: &Value) -> Vec<Violation> {
        rules.check(&self.db, &self.messages, name, args)
    }
}

/// The user a task's gold actions act for: the first `user_id` argument,
/// or the owner of the first reservation they name.
fn task_user(db: &FlightDb, task: &Task) -> Option<String> {
    task.criteria.actions.iter().find_map(|a| {
        if let Some(u) = a.arguments.get("user_id").and_then(Value::as_str) {
            return Some(u.to_string());
        }
        let r = a.arguments.get("reservation_id").and_then(Value::as_str)?;
        db.reservations.get(r).map(|r| r.user_id.clone())
    })
}

/// Replays a task's gold actions with the receipts; the refused writes as
/// (action id, rules).
fn replay(rules: &RuleSet, db: &FlightDb, task: &Task) -> Vec<(String, Vec<RuleId>)> {
    let Some(user) = task_user(db, task) else {
        return Vec::new();
    };
    let s = &task.user;
    let opening = format!(
        "{}\n{}\n{}",
        s.reason_for_call,
        s.known_info.as_deref().unwrap_or(""),
        s.task_instructions
    );
    let mut c = Conversation::new(db.clone(), &opening);
    c.call("get_user_details", &json!({ "user_id": user }));
    let mut refused = Vec::new();
    for a in &task.criteria.actions {
        if tools::is_write(&a.name) {
            c.ask(&a.name, &a.arguments, "Yes, please go ahead.");
            let v = c.check(rules, &a.name, &a.arguments);
            if !v.is_empty() {
                for x in &v {
                    println!("task {} {} {}: {x}", task.id, a.action_id, a.name);
                }
                refused.push((a.action_id.clone(), v.iter().map(|x| x.rule).collect()));
            }
        } else {
            assert!(
                rules
                    .check(&c.db, &c.messages, &a.name, &a.arguments)
                    .is_empty(),
                "a read never violates"
            );
        }
        c.call(&a.name, &a.arguments);
    }
    refused
}

fn refused_writes(file: TaskFile) -> Vec<(String, String, String)> {
    let data = Tau2Data::open_tasks(&data_dir(), file).expect("airline data");
    let rules = RuleSet::reference();
    let mut out = Vec::new();
    for task in &data.tasks {
        for (action, ids) in replay(&rules, &data.db, task) {
            for id in ids {
                out.push((task.id.clone(), action.clone(), id.name().to_string()));
            }
        }
    }
    out
}

fn owned(list: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
    list.iter()
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
        .collect()
}

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "needs the τ² airline data at ../shared/tau2-airline"
)]
fn reference_admits_every_current_gold_write() {
    let refused: Vec<(String, String)> = refused_writes(TaskFile::Current)
        .into_iter()
        .map(|(t, a, _)| (t, a))
        .collect();
    let undecided: Vec<(String, String)> = UNDECIDED
        .iter()
        .map(|(t, a, _)| (t.to_string(), a.to_string()))
        .collect();
    assert_eq!(refused, undecided);
}

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "needs the τ² airline data at ../shared/tau2-airline"
)]
fn reference_refuses_the_release_gold_writes_it_should() {
    assert_eq!(refused_writes(TaskFile::Release), owned(RELEASE_REFUSED));
}

/// A conversation in which the agent looked `user` up and described the
/// call, and the user said `answer`.
fn scripted(db: &FlightDb, user: &str, name: &str, args: &Value, answer: &str) -> Conversation {
    let mut c = Conversation::new(db.clone(), "I need help with my booking.");
    c.call("get_user_details", &json!({ "user_id": user }));
    c.ask(name, args, answer);
    c
}

/// A call: tool name and arguments.
type Call = (&'static str, Value);

/// `bad` breaks exactly `rule`, `good` nothing; both after the agent looked
/// `user` up, described the call and heard "yes" (the confirmation case
/// answers the bad call otherwise).
struct Case {
    rule: RuleId,
    user: &'static str,
    bad: Call,
    good: Call,
}

fn cases() -> Vec<Case> {
    let cancel = |r: &str| ("cancel_reservation", json!({ "reservation_id": r }));
    let bags = |total: i64, nonfree: i64| {
        (
            "update_reservation_baggages",
            json!({"reservation_id": "4WQ150", "total_baggages": total,
                   "nonfree_baggages": nonfree, "payment_id": "gift_card_3576581"}),
        )
    };
    let flights = |r: &str, cabin: &str, legs: Value, pay: &str| {
        (
            "update_reservation_flights",
            json!({"reservation_id": r, "cabin": cabin, "flights": legs, "payment_id": pay}),
        )
    };
    let passenger =
        |i: usize| json!({"first_name": format!("P{i}"), "last_name": "Li", "dob": "1990-01-01"});
    let book = |n: usize, pay: Value| {
        (
            "book_reservation",
            json!({"user_id": "mia_li_3668", "origin": "JFK", "destination": "SEA",
                   "flight_type": "one_way", "cabin": "economy",
                   "flights": [{"flight_number": "HAT136", "date": "2024-05-20"},
                               {"flight_number": "HAT039", "date": "2024-05-20"}],
                   "passengers": (0..n).map(passenger).collect::<Vec<_>>(),
                   "payment_methods": pay, "total_baggages": 0, "nonfree_baggages": 0,
                   "insurance": "no"}),
        )
    };
    let card = |id: &str| json!({"payment_id": id, "amount": 100});
    let certificate = |user: &str, amount: u32| {
        (
            "send_certificate",
            json!({"user_id": user, "amount": amount}),
        )
    };
    vec![
        // 4WQ150 is chen_jackson_3290's (business, so cancellable).
        (
            RuleId::ReservationOwner,
            "james_santos_9046",
            cancel("4WQ150"),
            cancel("5GAZGX"),
        ),
        (
            RuleId::ExplicitConfirmation,
            "chen_jackson_3290",
            cancel("4WQ150"),
            cancel("4WQ150"),
        ),
        // T6HMDP: economy, no insurance, booked 2024-05-05; 5GAZGX: business.
        (
            RuleId::CancelEligibility,
            "james_santos_9046",
            cancel("T6HMDP"),
            cancel("5GAZGX"),
        ),
        // T1QOBS: basic economy JFK-MIA on HAT060 2024-05-26.
        (
            RuleId::BasicEconomyChange,
            "harper_lopez_1489",
            flights(
                "T1QOBS",
                "basic_economy",
                json!([{"flight_number": "HAT060", "date": "2024-05-27"}]),
                "credit_card_9875103",
            ),
            flights(
                "T1QOBS",
                "economy",
                json!([{"flight_number": "HAT060", "date": "2024-05-26"}]),
                "credit_card_9875103",
            ),
        ),
        // T6HMDP: economy DEN-LAS one way on HAT229 2024-05-19.
        (
            RuleId::ChangeKeepsRoute,
            "james_santos_9046",
            flights(
                "T6HMDP",
                "economy",
                json!([{"flight_number": "HAT046", "date": "2024-05-19"}]),
                "credit_card_6899560",
            ),
            flights(
                "T6HMDP",
                "business",
                json!([{"flight_number": "HAT229", "date": "2024-05-19"}]),
                "credit_card_6899560",
            ),
        ),
        // DFJCPK: economy round trip whose first two flights landed on 2024-05-11.
        (
            RuleId::CabinChange,
            "mason_johnson_9566",
            flights(
                "DFJCPK",
                "business",
                json!([
                {"flight_number": "HAT092", "date": "2024-05-11"}, {"flight_number": "HAT237", "date": "2024-05-11"},
                {"flight_number": "HAT248", "date": "2024-05-19"}, {"flight_number": "HAT240", "date": "2024-05-19"}]),
                "credit_card_3562064",
            ),
            flights(
                "DFJCPK",
                "economy",
                json!([
                {"flight_number": "HAT092", "date": "2024-05-11"}, {"flight_number": "HAT237", "date": "2024-05-11"},
                {"flight_number": "HAT248", "date": "2024-05-19"}, {"flight_number": "HAT240", "date": "2024-05-19"}]),
                "credit_card_3562064",
            ),
        ),
        // 4WQ150: silver, business, three passengers: nine free bags, five now.
        (
            RuleId::BaggageAllowance,
            "chen_jackson_3290",
            bags(6, 1),
            bags(10, 1),
        ),
        (
            RuleId::BaggageRemoval,
            "chen_jackson_3290",
            bags(4, 0),
            bags(5, 0),
        ),
        (
            RuleId::PassengerLimit,
            "mia_li_3668",
            book(6, json!([card("credit_card_4421486")])),
            book(5, json!([card("credit_card_4421486")])),
        ),
        (
            RuleId::PaymentMethods,
            "mia_li_3668",
            book(
                1,
                json!([card("credit_card_4421486"), card("credit_card_1955700")]),
            ),
            book(
                1,
                json!([card("credit_card_4421486"), card("certificate_4856383")]),
            ),
        ),
        // james_santos_9046 (regular): no flight of his is cancelled or delayed.
        // amelia_khan_8728 (gold): 9FNHDR, one passenger, HAT277 cancelled.
        (
            RuleId::CertificateEligibility,
            "james_santos_9046",
            certificate("james_santos_9046", 100),
            certificate("amelia_khan_8728", 100),
        ),
        (
            RuleId::CertificateAmount,
            "amelia_khan_8728",
            certificate("amelia_khan_8728", 150),
            certificate("amelia_khan_8728", 100),
        ),
    ]
    .into_iter()
    .map(|(rule, user, bad, good)| Case {
        rule,
        user,
        bad,
        good,
    })
    .collect()
}

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "needs the τ² airline data at ../shared/tau2-airline"
)]
fn reference_refuses_one_scripted_violation_per_rule() {
    let db = FlightDb::load(&data_dir().join("db.json")).expect("db.json");
    let rules = RuleSet::reference();
    let cases = cases();
    let covered: Vec<RuleId> = cases.iter().map(|c| c.rule).collect();
    assert_eq!(covered, RuleId::ALL, "one case per rule, in order");
    for Case {
        rule,
        user,
        bad: (bad, bad_args),
        good: (good, good_args),
    } in cases
    {
        let answer = if rule == RuleId::ExplicitConfirmation {
            "How much would that cost?"
        } else {
            "Yes, please."
        };
        let c = scripted(&db, user, bad, &bad_args, answer);
        let got: Vec<RuleId> = c
            .check(&rules, bad, &bad_args)
            .iter()
            .map(|v| v.rule)
            .collect();
        assert_eq!(got, [rule], "{}: {bad} {bad_args}", rule.name());
        // The good call is judged for the user it concerns.
        let good_user = good_args
            .get("user_id")
            .and_then(Value::as_str)
            .unwrap_or(user);
        let c = scripted(&db, good_user, good, &good_args, "Yes, please.");
        let v = c.check(&rules, good, &good_args);
        assert!(v.is_empty(), "{}: {good} {good_args}: {v:?}", rule.name());
    }
}

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "needs the τ² airline data at ../shared/tau2-airline"
)]
fn no_lookup_refuses_every_write_and_reads_pass() {
    let db = FlightDb::load(&data_dir().join("db.json")).expect("db.json");
    let rules = RuleSet::reference();
    let args = json!({"reservation_id": "4WQ150"});
    let history = [
        Message::new(Role::User, "Cancel 4WQ150, I am chen_jackson_3290."),
        Message::new(Role::Assistant, "I will cancel 4WQ150. Proceed?"),
        Message::new(Role::User, "yes"),
    ];
    let v = rules.check(&db, &history, "cancel_reservation", &args);
    assert_eq!(
        v.iter().map(|v| v.rule).collect::<Vec<_>>(),
        [RuleId::ReservationOwner]
    );
    assert!(rules
        .check(&db, &history, "get_reservation_details", &args)
        .is_empty());
}

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "needs the τ² airline data at ../shared/tau2-airline"
)]
fn shown_renders_the_touched_reservations_verdicts() {
    let db = FlightDb::load(&data_dir().join("db.json")).expect("db.json");
    let rules = RuleSet::reference();
    let mut c = Conversation::new(db, "Please cancel T6HMDP and 5GAZGX.");
    c.call("get_user_details", &json!({"user_id": "james_santos_9046"}));
    let text = rules.shown(&c.db, &c.messages);
    println!("{text}");
    let line = |id: &str| {
        text.lines()
            .find(|l| l.starts_with(id))
            .unwrap_or_else(|| panic!("no line for {id}"))
            .to_string()
    };
    assert!(line("T6HMDP").contains("cancel: not allowed"));
    assert!(line("5GAZGX").contains("cancel: allowed (business cabin)"));
    assert!(!text.contains("MWJZ87"), "untouched reservations stay out");
    assert!(text.ends_with(
        "confirmation: not given: list the action's details, ask, and get the user's yes before any write"
    ));
}

#[test]
fn parse_reads_plain_and_fenced_replies() {
    let reference = RuleSet::reference();
    let text = serde_json::to_string_pretty(&reference).unwrap();
    assert_eq!(parse(&text).unwrap(), reference);
    let fenced = format!("Here are the rules:\n```json\n{text}\n```\nDone.");
    assert_eq!(parse(&fenced).unwrap(), reference);
}

#[test]
fn parse_names_what_is_wrong() {
    assert!(matches!(
        parse("I cannot do that."),
        Err(CompileError::NoJson)
    ));
    let mut v = serde_json::to_value(RuleSet::reference()).unwrap();
    v.as_object_mut().unwrap().remove("bag_price");
    let e = parse(&v.to_string()).unwrap_err();
    assert!(e.to_string().contains("missing field `bag_price`"), "{e}");
    let mut v = serde_json::to_value(RuleSet::reference()).unwrap();
    v["cancel_cabins"] = json!(["first_class"]);
    assert!(matches!(parse(&v.to_string()), Err(CompileError::Shape(_))));
    v = serde_json::to_value(RuleSet::reference()).unwrap();
    v["free_bags"]["gold"]["extra"] = json!(1);
    assert!(parse(&v.to_string()).is_err(), "unknown fields are refused");
}

#[test]
fn agreement_counts_fields_and_names_the_changed_ones() {
    let reference = RuleSet::reference();
    let same = agreement(&reference, &reference);
    assert_eq!(same.agreeing, same.fields);
    assert!(same.differing.is_empty());
    // 25 top-level fields, free_bags counted as its 9 leaves.
    assert_eq!(same.fields, 25 - 1 + 9);

    let mut changed = reference.clone();
    changed.free_bags.silver.economy = 1;
    changed.cancel_window_hours = 48;
    changed
        .cancel_cabins
        .push(statebench::tau2::db::Cabin::Economy);
    let a = agreement(&changed, &reference);
    assert_eq!(
        a.differing,
        [
            "cancel_window_hours",
            "cancel_cabins",
            "free_bags.silver.economy"
        ]
    );
    assert_eq!(a.agreeing, a.fields - 3);

    // Order within a list does not matter.
    let mut reordered = reference.clone();
    reordered.insurance_reasons.reverse();
    assert!(agreement(&reordered, &reference).differing.is_empty());
}

#[test]
fn compile_requests_carry_the_policy_budget_and_seed() {
    use statebench::backend::Constraint;
    use statebench::tau2::compile::{compile_request, compile_request_for};
    let policy = "# Airline Agent Policy\nEach extra baggage is 50 dollars.";
    let a = compile_request(policy, 3);
    assert_eq!((a.max_tokens, a.thinking, a.seed), (3000, false, 3));
    assert!(a.temperature > 0.0, "seeds must be able to differ");
    assert!(a.messages[0]
        .content
        .contains("Each extra baggage is 50 dollars."));
    assert!(matches!(a.constraint, Some(Constraint::JsonSchema(_))));
    let b = compile_request_for(policy, 4, true);
    assert_eq!((b.max_tokens, b.thinking, b.seed), (6000, true, 4));
    assert!(
        b.constraint.is_none(),
        "a constraint would forbid the thinking block"
    );
    assert_eq!(a.messages[0].content, b.messages[0].content);
}

#[test]
fn every_labelled_reply_is_read_as_labelled() {
    assert!(REPLIES.len() >= 60);
    let yes = REPLIES.iter().filter(|(_, y)| *y).count();
    println!(
        "{} replies: {yes} yes, {} not",
        REPLIES.len(),
        REPLIES.len() - yes
    );
    let misread: Vec<&(&str, bool)> = REPLIES
        .iter()
        .filter(|(text, label)| affirms(text) != *label)
        .collect();
    assert!(misread.is_empty(), "misread (reply, label): {misread:?}");
}

/// chen_jackson_3290 looked up, asked `question`, answered `answer`.
fn exchange(db: &FlightDb, question: &str, answer: &str) -> Conversation {
    let mut c = Conversation::new(db.clone(), "I want to cancel 4WQ150.");
    c.call("get_user_details", &json!({"user_id": "chen_jackson_3290"}));
    c.messages.push(Message::new(Role::Assistant, question));
    c.messages.push(Message::new(Role::User, answer));
    c
}

fn confirmation_refused(c: &Conversation, name: &str, args: &Value) -> bool {
    c.check(&RuleSet::reference(), name, args)
        .iter()
        .any(|v| v.rule == RuleId::ExplicitConfirmation)
}

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "needs the τ² airline data at ../shared/tau2-airline"
)]
fn a_yes_confirms_only_the_action_its_question_named() {
    let db = FlightDb::load(&data_dir().join("db.json")).expect("db.json");
    let cancel = json!({"reservation_id": "4WQ150"});
    let bags = json!({"reservation_id": "4WQ150", "total_baggages": 6,
                      "nonfree_baggages": 1, "payment_id": "gift_card_3576581"});
    // Named and asked: the cancellation runs, lookups in between or not.
    let mut c = exchange(&db, "Shall I cancel reservation 4WQ150 now?", "Sure.");
    assert!(!confirmation_refused(&c, "cancel_reservation", &cancel));
    c.call("get_reservation_details", &cancel);
    assert!(!confirmation_refused(&c, "cancel_reservation", &cancel));
    // The same yes does not cover a baggage change it never named.
    assert!(confirmation_refused(
        &c,
        "update_reservation_baggages",
        &bags
    ));
    // One question naming both confirms both.
    let c = exchange(
        &db,
        "For 4WQ150 I will set the checked bags to 6 (one paid, on gift_card_3576581) and then cancel it. Shall I do both?",
        "Yes to both.",
    );
    assert!(!confirmation_refused(
        &c,
        "update_reservation_baggages",
        &bags
    ));
    assert!(!confirmation_refused(&c, "cancel_reservation", &cancel));
    // A bag total the question did not say is not confirmed.
    let c = exchange(&db, "Shall I set 4WQ150's checked bags to 7?", "Yes.");
    assert!(confirmation_refused(
        &c,
        "update_reservation_baggages",
        &bags
    ));
    // A yes to a request for the user id confirms nothing.
    let c = exchange(
        &db,
        "Could you give me your user id?",
        "Sure, my user id is chen_jackson_3290.",
    );
    assert!(confirmation_refused(&c, "cancel_reservation", &cancel));
    // Nor does a message that asked nothing, or a hedged answer.
    let c = exchange(&db, "I can cancel 4WQ150 for you.", "Yes.");
    assert!(confirmation_refused(&c, "cancel_reservation", &cancel));
    let c = exchange(&db, "Shall I cancel 4WQ150?", "Yes, if the refund is full.");
    assert!(confirmation_refused(&c, "cancel_reservation", &cancel));
}

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "needs the τ² airline data at ../shared/tau2-airline"
)]
fn a_yes_to_the_greeting_confirms_nothing() {
    let db = FlightDb::load(&data_dir().join("db.json")).expect("db.json");
    let cancel = json!({"reservation_id": "4WQ150"});
    let mut c = Conversation::new(
        db,
        "Yes, please cancel 4WQ150 right away, I am chen_jackson_3290.",
    );
    c.call("get_user_details", &json!({"user_id": "chen_jackson_3290"}));
    let v = c.check(&RuleSet::reference(), "cancel_reservation", &cancel);
    assert_eq!(
        v.iter().map(|v| v.rule).collect::<Vec<_>>(),
        [RuleId::ExplicitConfirmation],
        "{v:?}"
    );
    println!("{}", v[0]);
}
