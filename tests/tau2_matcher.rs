//! The default model as the τ² rule arms' matcher, measured on the
//! labelled replies: each answers the agent's question about cancelling
//! 4WQ150, and the matcher reads (in one batch, schema-bounded) whether it
//! confirms and which covered reason it gives. Every reply must be the JSON
//! asked; the counts are a golden of the engine at temperature 0, and the
//! book (docs/src/tau2.md) quotes them.

mod engine_common;
mod tau2_replies;

use std::path::{Path, PathBuf};

use serde_json::json;
use statebench::backend::{Backend, Message, Role, ToolCall};
use statebench::tau2::db::FlightDb;
use statebench::tau2::prompts;
use statebench::tau2::reader;
use statebench::tau2::rules::RuleSet;
use statebench::tau2::tools;
use tau2_replies::REPLIES;

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/tau2-airline")
}

/// chen_jackson_3290 asks to cancel 4WQ150, is looked up and asked; the
/// user answers `answer` and the agent cancels.
fn history(db: &mut FlightDb, answer: &str) -> Vec<Message> {
    let lookup = ToolCall {
        id: "call_0".into(),
        name: "get_user_details".into(),
        arguments: json!({"user_id": "chen_jackson_3290"}).to_string(),
    };
    let profile = tools::call(db, &lookup.name, &json!({"user_id": "chen_jackson_3290"}))
        .expect("a known user");
    let cancel = ToolCall {
        id: "call_1".into(),
        name: "cancel_reservation".into(),
        arguments: json!({"reservation_id": "4WQ150"}).to_string(),
    };
    vec![
        Message::new(Role::System, "policy"),
        Message::new(Role::Assistant, prompts::GREETING),
        Message::new(
            Role::User,
            "Please cancel 4WQ150. My user id is chen_jackson_3290.",
        ),
        Message::calls("", vec![lookup]),
        Message::tool_result("call_0", profile),
        Message::new(
            Role::Assistant,
            "Reservation 4WQ150 is in business, so it can be cancelled for a full refund. Shall I cancel it?",
        ),
        Message::new(Role::User, answer),
        Message::calls("", vec![cancel]),
    ]
}

#[test]
#[cfg_attr(
    not(all(has_default_model, has_tau2_data)),
    ignore = "needs the default model and the τ² airline data"
)]
fn the_default_model_reads_the_labelled_replies() {
    let rules = RuleSet::reference();
    let mut db = FlightDb::load(&data_dir().join("db.json")).expect("db.json");
    let mut engine = engine_common::load(&engine_common::default_model());
    let args = json!({"reservation_id": "4WQ150"});
    let mut flight = Vec::new();
    for (answer, label) in REPLIES {
        let h = history(&mut db, answer);
        let ask = reader::ask(&rules, &db, &h, "cancel_reservation", &args, 0)
            .expect("a cancellation the reference asks a confirmation of");
        assert!(ask.to_read.confirmation && ask.to_read.reason);
        let s = engine.open_session();
        let id = engine.submit(s, ask.request.clone()).expect("submit");
        flight.push((id, s, ask, *answer, *label));
    }
    let mut replies = std::collections::HashMap::new();
    while engine.has_pending() {
        for (id, r) in engine.step().expect("step") {
            replies.insert(id, r.expect("a reply"));
        }
    }
    // (label, matcher's reading) counts, and the reasons read.
    let (mut tp, mut fp, mut tn, mut fn_) = (0, 0, 0, 0);
    let mut reasons = 0;
    let mut misread = Vec::new();
    for (id, s, ask, answer, label) in flight {
        engine.close_session(s);
        let r = reader::reading(1, ask, &replies[&id], &rules);
        assert!(r.error.is_none(), "{answer:?}: {:?} ({})", r.error, r.reply);
        let yes = r.read.confirmed.expect("asked");
        reasons += usize::from(r.read.reason.is_some());
        match (label, yes) {
            (true, true) => tp += 1,
            (false, true) => {
                fp += 1;
                misread.push((answer, r.reply));
            }
            (false, false) => tn += 1,
            (true, false) => {
                fn_ += 1;
                misread.push((answer, r.reply));
            }
        }
    }
    let misread_n = misread.len();
    println!(
        "default-model matcher on {} labelled replies: {} read as labelled; yes read yes {tp}, not read yes {fp}, not read not {tn}, yes read not {fn_}; a covered reason read in {reasons} (none was given)",
        REPLIES.len(),
        tp + tn
    );
    println!("misread (reply, matcher's answer): {misread:?}");
    assert_eq!(tp + fp + tn + fn_, REPLIES.len());
    assert_eq!(misread_n, fp + fn_);
    assert_eq!(
        (tp, fp, tn, fn_, reasons),
        GOLDEN,
        "the default model's readings changed"
    );
}

/// The default model's readings at temperature 0: (yes read yes, not read
/// yes, not read not, yes read not, covered reasons read).
const GOLDEN: (usize, usize, usize, usize, usize) = (11, 0, 40, 27, 68);
