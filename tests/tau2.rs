//! The τ²-bench airline domain on the real data: τ²'s own tool tests, the
//! database's dump and counts, gold replays, the evaluator's verdicts on
//! oracle and do-nothing agents, and τ²'s DB hash as Python computes it.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};
use statebench::tau2::db::{py_float_repr, FlightDb};
use statebench::tau2::evaluate::{evaluate, gold_db, pass_hat_k};
use statebench::tau2::task::{load_tasks, Task, TaskFile, Tau2Data};
use statebench::tau2::tools::{self, call, error_text, is_write};
use statebench::tau2::CallRecord;

/// Tasks of tasks.json with no gold write and nothing to communicate: the
/// ones an agent that does nothing passes.
const DO_NOTHING_PASSES: usize = 23;

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/tau2-airline")
}

fn data() -> Tau2Data {
    Tau2Data::open(&data_dir()).expect("the τ² airline data loads")
}

fn tasks(file: TaskFile) -> Vec<Task> {
    load_tasks(&data_dir().join(file.file_name())).expect("the task file loads")
}

fn required() -> bool {
    ["CI", "STATEBENCH_REQUIRE"]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()))
}

fn executed(name: &str, arguments: &Value) -> CallRecord {
    CallRecord {
        name: name.to_string(),
        arguments: arguments.clone(),
        write: is_write(name),
        executed: true,
        error: false,
        refused_by: Vec::new(),
        violates: Vec::new(),
    }
}

fn gold_calls(task: &Task) -> Vec<CallRecord> {
    task.criteria
        .actions
        .iter()
        .map(|a| executed(&a.name, &a.arguments))
        .collect()
}

// ---- (1) τ²'s tool tests (test_tools_airline.py), ported ----

/// The fixture database of τ²'s tool tests.
fn fixture() -> FlightDb {
    let seats = json!({"basic_economy": 16, "economy": 10, "business": 13});
    let prices = json!({"basic_economy": 87, "economy": 122, "business": 471});
    let available = json!({"status": "available", "available_seats": seats, "prices": prices});
    let db = json!({
        "flights": {
            "HAT001": {"flight_number": "HAT001", "origin": "PHL", "destination": "LGA",
                "scheduled_departure_time_est": "06:00:00", "scheduled_arrival_time_est": "07:00:00",
                "dates": {
                    "2024-05-14": {"status": "cancelled"},
                    "2024-05-15": {"status": "landed", "actual_departure_time_est": "2024-05-15T06:04:00",
                        "actual_arrival_time_est": "2024-05-15T07:30:00"},
                    "2024-05-16": available}},
            "HAT002": {"flight_number": "HAT002", "origin": "LGA", "destination": "LAX",
                "scheduled_departure_time_est": "08:00:00", "scheduled_arrival_time_est": "09:00:00",
                "dates": {"2024-05-16": available}}},
        "users": {"mia_li_3668": {"user_id": "mia_li_3668",
            "name": {"first_name": "Mia", "last_name": "Li"},
            "address": {"address1": "975 Sunset Drive", "address2": "Suite 217", "city": "Austin",
                "country": "USA", "state": "TX", "zip": "78750"},
            "email": "mia.li3818@example.com", "dob": "1990-04-05",
            "payment_methods": {
                "credit_card_4421486": {"source": "credit_card", "brand": "visa", "last_four": "7447",
                    "id": "credit_card_4421486"},
                "certificate_4856383": {"source": "certificate", "amount": 100, "id": "certificate_4856383"}},
            "saved_passengers": [{"first_name": "Amelia", "last_name": "Ahmed", "dob": "1957-03-21"}],
            "membership": "gold", "reservations": ["NO6JO3", "AIXC49", "HKEG34"]}},
        "reservations": {"4WQ150": {"reservation_id": "4WQ150", "user_id": "mia_li_3668",
            "origin": "PHL", "destination": "LGA", "flight_type": "one_way", "cabin": "economy",
            "flights": [{"origin": "PHL", "destination": "LGA", "flight_number": "HAT001",
                "date": "2024-05-16", "price": 122}],
            "passengers": [{"first_name": "Chen", "last_name": "Jackson", "dob": "1956-07-07"},
                {"first_name": "Raj", "last_name": "Smith", "dob": "1967-04-01"}],
            "payment_history": [{"payment_id": "credit_card_4421486", "amount": 500}],
            "created_at": "2024-05-02T03:10:19", "total_baggages": 5, "nonfree_baggages": 0,
            "insurance": "no"}}
    });
    FlightDb::from_json(&db.to_string()).expect("the fixture loads")
}

fn booking(amount: i64) -> Value {
    json!({"user_id": "mia_li_3668", "origin": "PHL", "destination": "LGA",
        "flight_type": "one_way", "cabin": "economy",
        "flights": [{"flight_number": "HAT001", "date": "2024-05-16"}],
        "passengers": [{"first_name": "Noah", "last_name": "Brown", "dob": "1990-01-01"}],
        "payment_methods": [{"payment_id": "credit_card_4421486", "amount": amount}],
        "total_baggages": 2, "nonfree_baggages": 0, "insurance": "no"})
}

fn parsed(text: &str) -> Value {
    serde_json::from_str(text).expect("the result is JSON")
}

#[test]
fn tool_book_reservation() {
    let mut db = fixture();
    let r = parsed(&call(&mut db, "book_reservation", &booking(122)).unwrap());
    assert_eq!(r["reservation_id"], "HATHAT");
    assert_eq!(r["created_at"], tools::NOW);
    assert_eq!(r["status"], Value::Null);
    let seats = |db: &FlightDb| match &db.flights["HAT001"].dates["2024-05-16"] {
        statebench::tau2::db::FlightDate::Available {
            available_seats, ..
        } => available_seats.economy,
        _ => unreachable!(),
    };
    assert_eq!(seats(&db), 9);
    assert_eq!(
        db.users["mia_li_3668"].reservations.last().unwrap(),
        "HATHAT"
    );
    let e = call(&mut db, "book_reservation", &booking(121)).unwrap_err();
    assert_eq!(
        error_text(&e),
        "Error: Payment amount does not add up, total price is 122, but paid 121"
    );
    let next = parsed(&call(&mut db, "book_reservation", &booking(122)).unwrap());
    assert_eq!(next["reservation_id"], "HATHAU");
}

#[test]
fn tool_cancel_reservation() {
    let mut db = fixture();
    call(
        &mut db,
        "cancel_reservation",
        &json!({"reservation_id": "4WQ150"}),
    )
    .unwrap();
    let r = &db.reservations["4WQ150"];
    assert_eq!(r.status.as_deref(), Some("cancelled"));
    assert_eq!(r.payment_history.len(), 2);
    assert_eq!(r.payment_history[1].amount, -r.payment_history[0].amount);
}

#[test]
fn tool_get_reservation_details() {
    let mut db = fixture();
    let args = json!({"reservation_id": "4WQ150"});
    let text = call(&mut db, "get_reservation_details", &args).unwrap();
    assert!(text.starts_with(r#"{"reservation_id": "4WQ150", "user_id": "mia_li_3668""#));
    assert!(text.ends_with(r#""insurance": "no", "status": null}"#));
    let e = call(
        &mut db,
        "get_reservation_details",
        &json!({"reservation_id": "NONEXISTENT"}),
    );
    assert_eq!(
        error_text(&e.unwrap_err()),
        "Error: Reservation NONEXISTENT not found"
    );
}

#[test]
fn tool_get_user_details() {
    let mut db = fixture();
    let u = parsed(
        &call(
            &mut db,
            "get_user_details",
            &json!({"user_id": "mia_li_3668"}),
        )
        .unwrap(),
    );
    assert_eq!(
        u["payment_methods"]["certificate_4856383"]["amount"],
        json!(100.0)
    );
    let e = call(
        &mut db,
        "get_user_details",
        &json!({"user_id": "NONEXISTENT"}),
    );
    assert_eq!(
        error_text(&e.unwrap_err()),
        "Error: User NONEXISTENT not found"
    );
}

#[test]
fn tool_list_all_airports() {
    let text = call(&mut fixture(), "list_all_airports", &json!({})).unwrap();
    assert!(text.starts_with(r#"[{"iata": "SFO", "city": "San Francisco"}, "#));
    assert_eq!(parsed(&text).as_array().unwrap().len(), 20);
}

#[test]
fn tool_search_direct_flight() {
    let mut db = fixture();
    let mut args = json!({"origin": "PHL", "destination": "LGA", "date": "2024-05-16"});
    let found = parsed(&call(&mut db, "search_direct_flight", &args).unwrap());
    assert_eq!(found.as_array().unwrap().len(), 1);
    assert_eq!(found[0]["date"], Value::Null);
    args["date"] = json!("2024-05-17");
    assert_eq!(call(&mut db, "search_direct_flight", &args).unwrap(), "[]");
}

#[test]
fn tool_search_onestop_flight() {
    let mut db = fixture();
    let mut args = json!({"origin": "PHL", "destination": "LAX", "date": "2024-05-16"});
    let found = parsed(&call(&mut db, "search_onestop_flight", &args).unwrap());
    assert_eq!(found.as_array().unwrap().len(), 1);
    assert_eq!(found[0][0]["flight_number"], "HAT001");
    assert_eq!(found[0][1]["date"], "2024-05-16");
    args["date"] = json!("2024-05-17");
    assert_eq!(call(&mut db, "search_onestop_flight", &args).unwrap(), "[]");
}

#[test]
fn tool_send_certificate() {
    let mut db = fixture();
    let args = json!({"user_id": "mia_li_3668", "amount": 100});
    let text = call(&mut db, "send_certificate", &args).unwrap();
    assert_eq!(
        text,
        "Certificate certificate_3221322 added to user mia_li_3668 with amount 100."
    );
    let methods = &db.users["mia_li_3668"].payment_methods;
    assert_eq!(methods["certificate_3221322"].balance(), Some(100.0));
}

#[test]
fn tool_transfer_to_human_agents() {
    let args = json!({"summary": "The user wants to cancel the reservation."});
    let text = call(&mut fixture(), "transfer_to_human_agents", &args).unwrap();
    assert_eq!(text, "Transfer successful");
}

#[test]
fn tool_update_reservation_baggages() {
    let mut db = fixture();
    let mut args = json!({"reservation_id": "4WQ150", "total_baggages": 2,
        "nonfree_baggages": 2, "payment_id": "credit_card_4421486"});
    call(&mut db, "update_reservation_baggages", &args).unwrap();
    let r = &db.reservations["4WQ150"];
    assert_eq!((r.total_baggages, r.nonfree_baggages), (2, 2));
    assert_eq!(r.payment_history.last().unwrap().amount, 100);
    args["payment_id"] = json!("certificate_4856383");
    let e = call(&mut db, "update_reservation_baggages", &args).unwrap_err();
    assert_eq!(
        error_text(&e),
        "Error: Certificate cannot be used to update reservation"
    );
}

#[test]
fn tool_update_reservation_flights() {
    let mut db = fixture();
    let args = json!({"reservation_id": "4WQ150", "cabin": "basic_economy",
        "flights": [{"flight_number": "HAT001", "date": "2024-05-16"}],
        "payment_id": "credit_card_4421486"});
    call(&mut db, "update_reservation_flights", &args).unwrap();
    let r = &db.reservations["4WQ150"];
    assert_eq!(r.cabin, statebench::tau2::db::Cabin::BasicEconomy);
    assert_eq!(r.payment_history.last().unwrap().amount, -70);
}

#[test]
fn tool_update_reservation_passengers() {
    let mut db = fixture();
    let mut args = json!({"reservation_id": "4WQ150", "passengers": [
        {"first_name": "John", "last_name": "Doe", "dob": "1956-07-07"},
        {"first_name": "Jane", "last_name": "Doe", "dob": "1967-04-01"}]});
    call(&mut db, "update_reservation_passengers", &args).unwrap();
    let p = &db.reservations["4WQ150"].passengers;
    assert_eq!(
        [
            p[0].first_name.as_str(),
            p[0].last_name.as_str(),
            p[0].dob.as_str()
        ],
        ["John", "Doe", "1956-07-07"]
    );
    assert_eq!(
        [
            p[1].first_name.as_str(),
            p[1].last_name.as_str(),
            p[1].dob.as_str()
        ],
        ["Jane", "Doe", "1967-04-01"]
    );
    args["passengers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"first_name": "Jim", "last_name": "Beam", "dob": "1978-05-03"}));
    let e = call(&mut db, "update_reservation_passengers", &args).unwrap_err();
    assert_eq!(error_text(&e), "Error: Number of passengers does not match");
}

#[test]
fn tool_calculate() {
    let mut db = fixture();
    let calc = |db: &mut FlightDb, e: &str| {
        call(db, "calculate", &json!({ "expression": e })).map_err(|e| error_text(&e))
    };
    assert_eq!(calc(&mut db, "1 + 1").unwrap(), "2.0");
    assert_eq!(calc(&mut db, "10 / 3").unwrap(), "3.33");
    assert_eq!(calc(&mut db, "(100 - 20) * 1.5").unwrap(), "120.0");
    assert_eq!(calc(&mut db, "7 // -2").unwrap(), "-4.0");
    assert_eq!(calc(&mut db, "2 ** -1").unwrap(), "0.5");
    assert_eq!(calc(&mut db, "0.125").unwrap(), "0.12");
    assert_eq!(calc(&mut db, "10 ** 20").unwrap(), "1e+20");
    assert_eq!(
        calc(&mut db, "1 / 0").unwrap_err(),
        "Error: division by zero"
    );
    assert_eq!(
        calc(&mut db, "2 x 3").unwrap_err(),
        "Error: Invalid characters in expression"
    );
    assert_eq!(
        calc(&mut db, "1 +").unwrap_err(),
        "Error: invalid syntax (<string>, line 1)"
    );
}

#[test]
fn calculate_bounds_a_hostile_expression_and_never_overflows() {
    let mut db = fixture();
    let calc = |db: &mut FlightDb, e: &str| {
        call(db, "calculate", &json!({ "expression": e })).map_err(|e| error_text(&e))
    };
    let deep = "too many nested parentheses (<string>, line 1)";
    // Nesting as deep as Python's parser allows still evaluates.
    let ok = format!("{}1{}", "(".repeat(199), ")".repeat(199));
    assert_eq!(calc(&mut db, &ok).unwrap(), "1.0");
    // Far deeper (the stack of a recursive parser would overflow) is an
    // error result, for parentheses, unary signs and power towers alike.
    for e in [
        format!("{}1{}", "(".repeat(20_000), ")".repeat(20_000)),
        format!("{}1", "-".repeat(100_000)),
        format!("{}2", "2**".repeat(50_000)),
    ] {
        assert_eq!(calc(&mut db, &e).unwrap_err(), format!("Error: {deep}"));
    }
    // i128's edges leave it for a float, as Python's integers never overflow.
    let min = "(-170141183460469231731687303715884105727-1)";
    assert_eq!(
        calc(&mut db, &format!("{min}//-1")).unwrap(),
        "1.7014118346046923e+38"
    );
    assert_eq!(
        calc(&mut db, &format!("-{min}")).unwrap(),
        "1.7014118346046923e+38"
    );
    assert_eq!(
        calc(&mut db, &format!("{min}//7")).unwrap(),
        "-2.4305883351495603e+37"
    );
    assert_eq!(
        calc(&mut db, &format!("{min}*{min}")).unwrap(),
        "2.894802230932905e+76"
    );
}

#[test]
fn tool_arguments_fail_as_python_calls_do() {
    let mut db = fixture();
    let e = call(&mut db, "get_user_details", &json!({})).unwrap_err();
    assert_eq!(
        error_text(&e),
        "Error: AirlineTools.get_user_details() missing 1 required positional argument: 'user_id'"
    );
    let e = call(
        &mut db,
        "get_user_details",
        &json!({"user_id": "x", "id": 1}),
    )
    .unwrap_err();
    assert_eq!(
        error_text(&e),
        "Error: AirlineTools.get_user_details() got an unexpected keyword argument 'id'"
    );
    let e = call(&mut db, "fly", &json!({})).unwrap_err();
    assert_eq!(error_text(&e), "Error: Tool 'fly' not found.");
}

#[test]
fn schemas_name_the_14_tools_with_their_parameters() {
    let schemas = tools::schemas();
    assert_eq!(schemas.len(), 14);
    assert_eq!(
        schemas
            .iter()
            .filter(|t| is_write(&t.function.name))
            .count(),
        6
    );
    let book = schemas
        .iter()
        .find(|t| t.function.name == "book_reservation")
        .unwrap();
    let required = book.function.parameters["required"].as_array().unwrap();
    assert_eq!(required.len(), 11);
}

#[test]
fn floats_print_as_python_repr() {
    let cases = [
        (128.0, "128.0"),
        (27.5, "27.5"),
        (0.1 + 0.2, "0.30000000000000004"),
        (1e16, "1e+16"),
        (1234567890123456.0, "1234567890123456.0"),
        (0.0001, "0.0001"),
        (0.00001, "1e-05"),
        (-2.5e-7, "-2.5e-07"),
        (0.0, "0.0"),
        (1.5e300, "1.5e+300"),
    ];
    for (x, want) in cases {
        assert_eq!(py_float_repr(x), want, "{x:e}");
    }
}

// ---- (2) the database ----

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "needs the τ² airline data at ../shared/tau2-airline"
)]
fn db_counts_and_redumps_byte_for_byte() {
    let path = data_dir().join("db.json");
    let db = FlightDb::load(&path).unwrap();
    assert_eq!(
        (db.flights.len(), db.users.len(), db.reservations.len()),
        (300, 500, 2000)
    );
    let file = std::fs::read_to_string(&path).unwrap();
    assert!(
        db.to_file_json() == file,
        "the re-dump differs from db.json"
    );
}

// ---- (3) gold replays ----

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "needs the τ² airline data at ../shared/tau2-airline"
)]
fn gold_actions_replay_without_error_and_change_the_db_iff_they_write() {
    let initial = data().db;
    let before = initial.hash();
    for file in [TaskFile::Current, TaskFile::Release] {
        let tasks = tasks(file);
        assert_eq!(tasks.len(), 50);
        for task in &tasks {
            let mut db = initial.clone();
            for a in &task.criteria.actions {
                if let Err(e) = call(&mut db, &a.name, &a.arguments) {
                    panic!(
                        "{file:?} task {}: {} failed: {}",
                        task.id,
                        a.name,
                        error_text(&e)
                    );
                }
            }
            let changed = db.hash() != before;
            assert_eq!(changed, task.has_gold_write(), "{file:?} task {}", task.id);
        }
    }
}

// ---- (4) the evaluator ----

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "needs the τ² airline data at ../shared/tau2-airline"
)]
fn oracle_agent_scores_one_on_every_task() {
    let initial = data().db;
    for file in [TaskFile::Current, TaskFile::Release] {
        for task in tasks(file) {
            let texts = task.criteria.communicate_info.clone();
            let r = evaluate(&task, &initial, &gold_calls(&task), &texts);
            assert_eq!(r.reward, 1.0, "{file:?} task {}: {r:?}", task.id);
        }
    }
}

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "needs the τ² airline data at ../shared/tau2-airline"
)]
fn do_nothing_agent_passes_exactly_the_tasks_that_ask_nothing() {
    let initial = data().db;
    let tasks = tasks(TaskFile::Current);
    let mut passed = 0;
    for task in &tasks {
        let r = evaluate(task, &initial, &[], &[]);
        let asks_nothing = !task.has_gold_write() && task.criteria.communicate_info.is_empty();
        assert_eq!(r.reward == 1.0, asks_nothing, "task {}", task.id);
        passed += usize::from(r.reward == 1.0);
    }
    assert_eq!(passed, DO_NOTHING_PASSES);
}

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "needs the τ² airline data at ../shared/tau2-airline"
)]
fn a_missing_gold_write_or_an_extra_cancel_scores_zero() {
    let initial = data().db;
    for task in tasks(TaskFile::Current) {
        let texts = task.criteria.communicate_info.clone();
        let gold = gold_calls(&task);
        if let Some(last) = gold.iter().rposition(|c| c.write) {
            let mut dropped = gold.clone();
            dropped.remove(last);
            let r = evaluate(&task, &initial, &dropped, &texts);
            assert_eq!(r.reward, 0.0, "task {} without its last write", task.id);
        }
        // A reservation the gold actions leave alone.
        let after = gold_db(&task, &initial);
        let id = initial
            .reservations
            .keys()
            .find(|id| after.reservations[id.as_str()] == initial.reservations[id.as_str()])
            .unwrap();
        let mut extra = gold.clone();
        extra.push(executed(
            "cancel_reservation",
            &json!({ "reservation_id": id }),
        ));
        let r = evaluate(&task, &initial, &extra, &texts);
        assert_eq!(r.reward, 0.0, "task {} with {id} cancelled", task.id);
    }
}

#[test]
fn pass_hat_k_is_the_ratio_of_binomials() {
    assert_eq!(pass_hat_k(4, 4, 4), Some(1.0));
    assert_eq!(pass_hat_k(3, 4, 1), Some(0.75));
    assert_eq!(pass_hat_k(3, 4, 2), Some(0.5)); // C(3,2)/C(4,2) = 3/6
    assert_eq!(pass_hat_k(1, 4, 2), Some(0.0));
    assert_eq!(pass_hat_k(2, 2, 3), None);
}

// ---- (5) τ²'s hash, computed by Python ----

/// An interpreter with pydantic: the client venv `.ci/run` builds, else
/// `python3`. None (a failure under CI) when neither has it.
fn pydantic_python() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let venv = root.join("target/client-venv/bin/python");
    for python in [venv, PathBuf::from("python3")] {
        let ok = Command::new(&python)
            .args(["-c", "import pydantic"])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return Some(python);
        }
    }
    let why = "no python with pydantic (target/client-venv or python3)";
    if required() {
        panic!("{why}; .ci/run installs it before the tests");
    }
    eprintln!("SKIPPED python_pydantic_hash_equals_ours: {why}");
    None
}

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "needs the τ² airline data at ../shared/tau2-airline"
)]
fn python_pydantic_hash_equals_ours() {
    let Some(python) = pydantic_python() else {
        return;
    };
    let data = data();
    let mut dbs = vec![data.db.clone()];
    for id in ["14", "17", "23"] {
        dbs.push(gold_db(data.task(id).unwrap(), &data.db));
    }
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for (i, db) in dbs.iter().enumerate() {
        let path = dir.path().join(format!("db{i}.json"));
        std::fs::write(&path, db.to_file_json()).unwrap();
        files.push(path);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tau2_hash.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg(data_dir())
        .args(&files)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    let ours: Vec<String> = dbs.iter().map(FlightDb::hash).collect();
    assert_eq!(theirs, ours);
    assert_eq!(
        ours.iter().collect::<std::collections::BTreeSet<_>>().len(),
        4
    );
}
