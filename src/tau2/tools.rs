//! τ²'s airline tools over a [`FlightDb`]: the same checks, the same
//! changes, the same result and error texts the agent sees in τ².
//!
//! A result is the tool message content τ²'s environment sends: a string
//! result as it is, anything else as Python's `json.dumps` of the pydantic
//! dump. A failure is the exception's text, sent as `Error: <text>`.
//! Arguments are taken as τ² takes them: unknown or missing names fail as
//! a Python call would, nested objects are validated as τ²'s models
//! validate them, and scalar arguments τ² passes on unchecked (baggage
//! counts, the update's cabin) are used unchecked.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::db::{
    py_float_repr, py_json_dumps, to_value, Cabin, FlightDate, FlightDb, Passenger, Payment,
    PaymentMethod, Reservation, ReservationFlight, User,
};
use super::source::ToolDoc;
use crate::backend::Tool;

/// τ²'s frozen "now" (EST): reservations booked get it as `created_at`.
pub const NOW: &str = "2024-05-15T15:00:00";

/// The six tools that change the database.
pub const WRITES: [&str; 6] = [
    "book_reservation",
    "cancel_reservation",
    "update_reservation_baggages",
    "update_reservation_flights",
    "update_reservation_passengers",
    "send_certificate",
];

/// Ids a new reservation takes, the first one free (τ² allows three).
const NEW_RESERVATION_IDS: [&str; 3] = ["HATHAT", "HATHAU", "HATHAV"];
/// Ids a new certificate takes, the first one free.
const NEW_CERTIFICATE_IDS: [&str; 3] = [
    "certificate_3221322",
    "certificate_3221323",
    "certificate_3221324",
];

const AIRPORTS: [(&str, &str); 20] = [
    ("SFO", "San Francisco"),
    ("JFK", "New York"),
    ("LAX", "Los Angeles"),
    ("ORD", "Chicago"),
    ("DFW", "Dallas"),
    ("DEN", "Denver"),
    ("SEA", "Seattle"),
    ("ATL", "Atlanta"),
    ("MIA", "Miami"),
    ("BOS", "Boston"),
    ("PHX", "Phoenix"),
    ("IAH", "Houston"),
    ("LAS", "Las Vegas"),
    ("MCO", "Orlando"),
    ("EWR", "Newark"),
    ("CLT", "Charlotte"),
    ("MSP", "Minneapolis"),
    ("DTW", "Detroit"),
    ("PHL", "Philadelphia"),
    ("LGA", "LaGuardia"),
];

pub fn is_write(name: &str) -> bool {
    WRITES.contains(&name)
}

/// Why a call failed. `Display` is the exception text τ² puts after
/// `Error: `.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ToolError {
    /// No tool has that name.
    #[error("Tool '{0}' not found.")]
    UnknownTool(String),
    /// The arguments do not fit the tool (Python's `TypeError` on the call,
    /// or a model's validation error).
    #[error("{0}")]
    Arguments(String),
    /// The tool refused (its `ValueError`, or a `KeyError`'s quoted key).
    #[error("{0}")]
    Failed(String),
}

/// The tool message content τ² sends for a failed call.
pub fn error_text(e: &ToolError) -> String {
    format!("Error: {e}")
}

fn fail(text: impl Into<String>) -> ToolError {
    ToolError::Failed(text.into())
}

/// Runs one tool call. `Ok` holds the tool message content as τ² renders
/// it; a failed call may have changed the database where τ²'s does (a
/// booking that pays twice with one certificate).
pub fn call(db: &mut FlightDb, name: &str, args: &Value) -> Result<String, ToolError> {
    let spec = spec(name).ok_or_else(|| ToolError::UnknownTool(name.to_string()))?;
    let args = bind(spec, args)?;
    match name {
        "book_reservation" => book_reservation(db, &args),
        "calculate" => calculate(str_arg(&args, "expression")?),
        "cancel_reservation" => cancel_reservation(db, str_arg(&args, "reservation_id")?),
        "get_reservation_details" => {
            get_reservation(db, str_arg(&args, "reservation_id")?).map(dump)
        }
        "get_user_details" => get_user(db, str_arg(&args, "user_id")?).map(dump),
        "list_all_airports" => Ok(list_all_airports()),
        "search_direct_flight" => search_direct_flight(db, &args),
        "search_onestop_flight" => search_onestop_flight(db, &args),
        "send_certificate" => send_certificate(db, &args),
        "transfer_to_human_agents" => Ok("Transfer successful".to_string()),
        "update_reservation_baggages" => update_reservation_baggages(db, &args),
        "update_reservation_flights" => update_reservation_flights(db, &args),
        "update_reservation_passengers" => update_reservation_passengers(db, &args),
        "get_flight_status" => get_flight_status(db, &args),
        _ => unreachable!("every tool in SPECS has a branch"),
    }
}

/// A tool's parameters, in τ²'s order, with their JSON-schema types.
struct Spec {
    name: &'static str,
    description: &'static str,
    params: &'static [(&'static str, Param)],
}

#[derive(Clone, Copy)]
enum Param {
    Str(&'static str),
    Int(&'static str),
    /// A string from a fixed set: (description, allowed values).
    Enum(&'static str, &'static [&'static str]),
    /// An array of one of the nested models.
    Flights,
    Passengers,
    Payments,
}

const CABINS: &[&str] = &["business", "economy", "basic_economy"];

const SPECS: [Spec; 14] = [
    Spec {
        name: "book_reservation",
        description: "Create a new reservation for a user on the given flights, charging the given payment methods. Fails unless the payments add up to the total price.",
        params: &[
            ("user_id", Param::Str("The id of the user booking, e.g. 'sara_doe_496'.")),
            ("origin", Param::Str("IATA code of the trip's origin, e.g. 'SFO'.")),
            ("destination", Param::Str("IATA code of the trip's destination, e.g. 'JFK'.")),
            ("flight_type", Param::Enum("Whether the trip is one way or a round trip.", &["round_trip", "one_way"])),
            ("cabin", Param::Enum("The cabin for every flight of the reservation.", CABINS)),
            ("flights", Param::Flights),
            ("passengers", Param::Passengers),
            ("payment_methods", Param::Payments),
            ("total_baggages", Param::Int("How many bags the reservation carries in all.")),
            ("nonfree_baggages", Param::Int("How many of those bags are paid for.")),
            ("insurance", Param::Enum("Whether travel insurance is bought.", &["yes", "no"])),
        ],
    },
    Spec {
        name: "calculate",
        description: "Evaluate an arithmetic expression and return the result rounded to two decimals.",
        params: &[("expression", Param::Str("The expression: numbers, + - * /, parentheses and spaces only, e.g. '2 + 2'."))],
    },
    Spec {
        name: "cancel_reservation",
        description: "Cancel a whole reservation, refunding every payment made on it.",
        params: &[("reservation_id", Param::Str("The reservation id, e.g. 'ZFA04Y'."))],
    },
    Spec {
        name: "get_reservation_details",
        description: "Look up a reservation by its id.",
        params: &[("reservation_id", Param::Str("The reservation id, e.g. '8JX2WO'."))],
    },
    Spec {
        name: "get_user_details",
        description: "Look up a user's profile: name, address, payment methods, saved passengers, membership and reservation ids.",
        params: &[("user_id", Param::Str("The user id, e.g. 'sara_doe_496'."))],
    },
    Spec {
        name: "list_all_airports",
        description: "List every airport served, with its IATA code and city.",
        params: &[],
    },
    Spec {
        name: "search_direct_flight",
        description: "Find the nonstop flights between two airports on a date that can still be booked.",
        params: &[
            ("origin", Param::Str("IATA code of the departure airport, e.g. 'JFK'.")),
            ("destination", Param::Str("IATA code of the arrival airport, e.g. 'LAX'.")),
            ("date", Param::Str("The date, as 'YYYY-MM-DD', e.g. '2024-05-01'.")),
        ],
    },
    Spec {
        name: "search_onestop_flight",
        description: "Find the bookable connections with one stop between two airports leaving on a date, as pairs of flights.",
        params: &[
            ("origin", Param::Str("IATA code of the departure airport, e.g. 'JFK'.")),
            ("destination", Param::Str("IATA code of the arrival airport, e.g. 'LAX'.")),
            ("date", Param::Str("The date of the first flight, as 'YYYY-MM-DD', e.g. '2024-05-01'.")),
        ],
    },
    Spec {
        name: "send_certificate",
        description: "Add a travel certificate of the given amount to a user's payment methods.",
        params: &[
            ("user_id", Param::Str("The id of the user receiving it, e.g. 'sara_doe_496'.")),
            ("amount", Param::Int("The certificate's value in dollars.")),
        ],
    },
    Spec {
        name: "transfer_to_human_agents",
        description: "Hand the conversation over to a human agent, with a summary of the user's issue. For when the user asks for a human, or the request cannot be handled within the policy and these tools.",
        params: &[("summary", Param::Str("What the user needs, in brief."))],
    },
    Spec {
        name: "update_reservation_baggages",
        description: "Change the number of bags on a reservation, charging any added paid bags to a payment method of the user.",
        params: &[
            ("reservation_id", Param::Str("The reservation id, e.g. 'ZFA04Y'.")),
            ("total_baggages", Param::Int("The new total number of bags.")),
            ("nonfree_baggages", Param::Int("The new number of paid bags.")),
            ("payment_id", Param::Str("A payment method id from the user's profile, e.g. 'credit_card_7815826' or 'gift_card_7815826'.")),
        ],
    },
    Spec {
        name: "update_reservation_flights",
        description: "Replace the flights (and cabin) of a reservation, paying or refunding the price difference through a payment method of the user.",
        params: &[
            ("reservation_id", Param::Str("The reservation id, e.g. 'ZFA04Y'.")),
            ("cabin", Param::Enum("The cabin for the reservation after the change.", CABINS)),
            ("flights", Param::Flights),
            ("payment_id", Param::Str("A payment method id from the user's profile, e.g. 'credit_card_7815826' or 'gift_card_7815826'.")),
        ],
    },
    Spec {
        name: "update_reservation_passengers",
        description: "Replace the passengers of a reservation; their number cannot change.",
        params: &[
            ("reservation_id", Param::Str("The reservation id, e.g. 'ZFA04Y'.")),
            ("passengers", Param::Passengers),
        ],
    },
    Spec {
        name: "get_flight_status",
        description: "The status of a flight on a date: available, on time, delayed, flying, landed or cancelled.",
        params: &[
            ("flight_number", Param::Str("The flight number, e.g. 'HAT001'.")),
            ("date", Param::Str("The date, as 'YYYY-MM-DD'.")),
        ],
    },
];

/// One of the airline's tools.
pub fn is_tool(name: &str) -> bool {
    spec(name).is_some()
}

fn spec(name: &str) -> Option<&'static Spec> {
    SPECS.iter().find(|s| s.name == name)
}

/// The 14 tools, with τ²'s names and parameters, as function tools.
pub fn schemas() -> Vec<Tool> {
    worded(None)
}

/// The tools as [`schemas`], their descriptions and their parameters'
/// top-level ones taken from τ²'s docstrings where `docs` has them.
pub fn worded(docs: Option<&BTreeMap<String, ToolDoc>>) -> Vec<Tool> {
    SPECS
        .iter()
        .map(|s| {
            let doc = docs.and_then(|d| d.get(s.name));
            let mut params = parameters(s);
            if let (Some(doc), Some(props)) = (doc, params["properties"].as_object_mut()) {
                for (name, p) in props.iter_mut() {
                    if let Some(text) = doc.params.get(name) {
                        p["description"] = Value::String(text.clone());
                    }
                }
            }
            let description = doc.map_or(s.description, |d| d.description.as_str());
            Tool::function(s.name, description, params)
        })
        .collect()
}

fn parameters(spec: &Spec) -> Value {
    let mut properties = Map::new();
    for (name, param) in spec.params {
        properties.insert(name.to_string(), param_schema(*param));
    }
    let required: Vec<&str> = spec.params.iter().map(|(n, _)| *n).collect();
    json!({"type": "object", "properties": properties, "required": required})
}

fn param_schema(param: Param) -> Value {
    let str_prop = |d: &str| json!({"type": "string", "description": d});
    match param {
        Param::Str(d) => str_prop(d),
        Param::Int(d) => json!({"type": "integer", "description": d}),
        Param::Enum(d, values) => json!({"type": "string", "enum": values, "description": d}),
        Param::Flights => json!({
            "type": "array",
            "description": "Every flight segment of the reservation, in order (unchanged segments included).",
            "items": {"type": "object", "properties": {
                "flight_number": str_prop("The flight number, e.g. 'HAT001'."),
                "date": str_prop("The date, as 'YYYY-MM-DD'."),
            }, "required": ["flight_number", "date"]},
        }),
        Param::Passengers => json!({
            "type": "array",
            "description": "The passengers, each with first name, last name and date of birth.",
            "items": {"type": "object", "properties": {
                "first_name": str_prop("First name."),
                "last_name": str_prop("Last name."),
                "dob": str_prop("Date of birth, as 'YYYY-MM-DD'."),
            }, "required": ["first_name", "last_name", "dob"]},
        }),
        Param::Payments => json!({
            "type": "array",
            "description": "The payment methods charged and the dollars charged to each.",
            "items": {"type": "object", "properties": {
                "payment_id": str_prop("A payment method id from the user's profile."),
                "amount": {"type": "integer", "description": "Dollars charged to it."},
            }, "required": ["payment_id", "amount"]},
        }),
    }
}

/// Checks the argument names as Python binds keyword arguments: an unknown
/// name first, then the missing ones.
fn bind(spec: &Spec, args: &Value) -> Result<Map<String, Value>, ToolError> {
    let map = match args {
        Value::Object(m) => m.clone(),
        Value::Null => Map::new(),
        other => {
            return Err(ToolError::Arguments(format!(
                "AirlineTools.{}() argument after ** must be a mapping, not {}",
                spec.name,
                py_type(other)
            )))
        }
    };
    if let Some(k) = map
        .keys()
        .find(|k| !spec.params.iter().any(|(p, _)| p == k))
    {
        return Err(ToolError::Arguments(format!(
            "AirlineTools.{}() got an unexpected keyword argument '{k}'",
            spec.name
        )));
    }
    let missing: Vec<String> = spec
        .params
        .iter()
        .filter(|(p, _)| !map.contains_key(*p))
        .map(|(p, _)| format!("'{p}'"))
        .collect();
    if missing.is_empty() {
        return Ok(map);
    }
    let plural = if missing.len() == 1 { "" } else { "s" };
    Err(ToolError::Arguments(format!(
        "AirlineTools.{}() missing {} required positional argument{plural}: {}",
        spec.name,
        missing.len(),
        py_and_list(&missing)
    )))
}

/// Python's listing of missing names: `'a'`, `'a' and 'b'`,
/// `'a', 'b', and 'c'`.
fn py_and_list(names: &[String]) -> String {
    match names {
        [one] => one.clone(),
        [a, b] => format!("{a} and {b}"),
        _ => {
            let (last, rest) = names.split_last().expect("three or more names");
            format!("{}, and {last}", rest.join(", "))
        }
    }
}

fn py_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "NoneType",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "int",
        Value::String(_) => "str",
        Value::Array(_) => "list",
        Value::Object(_) => "dict",
    }
}

/// A string argument. τ² would compare a non-string to its keys and find
/// nothing; statebench refuses it up front, as a type error.
fn str_arg<'a>(args: &'a Map<String, Value>, name: &str) -> Result<&'a str, ToolError> {
    match &args[name] {
        Value::String(s) => Ok(s),
        other => Err(ToolError::Arguments(format!(
            "{name} must be a string, not {}",
            py_type(other)
        ))),
    }
}

/// An integer argument (an integral float counts, as Python's arithmetic
/// on it would give the same numbers).
fn int_arg(args: &Map<String, Value>, name: &str) -> Result<i64, ToolError> {
    as_int(&args[name]).ok_or_else(|| {
        ToolError::Arguments(format!(
            "{name} must be an integer, not {}",
            py_type(&args[name])
        ))
    })
}

fn as_int(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64().or_else(|| {
            let f = n.as_f64()?;
            (f.fract() == 0.0 && f.abs() < 9.0e15).then_some(f as i64)
        }),
        _ => None,
    }
}

/// Python's `str()` of a JSON number argument.
fn py_num(v: &Value) -> String {
    match v {
        Value::Number(n) if n.is_f64() => py_float_repr(n.as_f64().unwrap_or(f64::NAN)),
        other => other.to_string(),
    }
}

/// The content τ² sends for a pydantic result: `json.dumps(model_dump())`.
fn dump<T: serde::Serialize>(model: &T) -> String {
    py_json_dumps(&to_value(model), false)
}

// --- nested models, validated as τ²'s pydantic models validate them ---

struct FlightInfo {
    flight_number: String,
    date: String,
}

/// A list argument of nested models: `(model, fields)`.
fn objects<'a>(
    args: &'a Map<String, Value>,
    name: &str,
    model: &str,
    fields: &[&str],
) -> Result<Vec<Vec<&'a Value>>, ToolError> {
    let Value::Array(items) = &args[name] else {
        return Err(ToolError::Arguments(format!(
            "{name} must be a list, not {}",
            py_type(&args[name])
        )));
    };
    items
        .iter()
        .map(|item| object_fields(item, model, fields))
        .collect()
}

fn object_fields<'a>(
    item: &'a Value,
    model: &str,
    fields: &[&str],
) -> Result<Vec<&'a Value>, ToolError> {
    let Value::Object(obj) = item else {
        return Err(ToolError::Arguments(format!(
            "each item must be a {model} object, not {}",
            py_type(item)
        )));
    };
    let missing: Vec<&str> = fields
        .iter()
        .copied()
        .filter(|f| !obj.contains_key(*f))
        .collect();
    if !missing.is_empty() {
        return Err(validation_error(model, &missing, "Field required"));
    }
    Ok(fields.iter().map(|f| &obj[*f]).collect())
}

fn validation_error(model: &str, fields: &[&str], msg: &str) -> ToolError {
    let n = fields.len();
    let plural = if n == 1 { "" } else { "s" };
    let mut text = format!("{n} validation error{plural} for {model}");
    for f in fields {
        text.push_str(&format!("\n{f}\n  {msg}"));
    }
    ToolError::Arguments(text)
}

fn model_str(v: &Value, model: &str, field: &str) -> Result<String, ToolError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        _ => Err(validation_error(
            model,
            &[field],
            "Input should be a valid string",
        )),
    }
}

fn flight_infos(args: &Map<String, Value>) -> Result<Vec<FlightInfo>, ToolError> {
    objects(args, "flights", "FlightInfo", &["flight_number", "date"])?
        .into_iter()
        .map(|f| {
            Ok(FlightInfo {
                flight_number: model_str(f[0], "FlightInfo", "flight_number")?,
                date: model_str(f[1], "FlightInfo", "date")?,
            })
        })
        .collect()
}

fn passengers(args: &Map<String, Value>) -> Result<Vec<Passenger>, ToolError> {
    objects(
        args,
        "passengers",
        "Passenger",
        &["first_name", "last_name", "dob"],
    )?
    .into_iter()
    .map(|p| {
        Ok(Passenger {
            first_name: model_str(p[0], "Passenger", "first_name")?,
            last_name: model_str(p[1], "Passenger", "last_name")?,
            dob: model_str(p[2], "Passenger", "dob")?,
        })
    })
    .collect()
}

fn payments(args: &Map<String, Value>) -> Result<Vec<Payment>, ToolError> {
    objects(
        args,
        "payment_methods",
        "Payment",
        &["payment_id", "amount"],
    )?
    .into_iter()
    .map(|p| {
        let amount = as_int(p[1]).ok_or_else(|| {
            validation_error("Payment", &["amount"], "Input should be a valid integer")
        })?;
        Ok(Payment {
            payment_id: model_str(p[0], "Payment", "payment_id")?,
            amount,
        })
    })
    .collect()
}

/// One of the listed strings (a `Literal` field of τ²'s `Reservation`).
fn literal(args: &Map<String, Value>, name: &str, allowed: &[&str]) -> Result<String, ToolError> {
    match &args[name] {
        Value::String(s) if allowed.contains(&s.as_str()) => Ok(s.clone()),
        _ => {
            let quoted: Vec<String> = allowed.iter().map(|a| format!("'{a}'")).collect();
            let (last, rest) = quoted.split_last().expect("a literal has values");
            let msg = format!("Input should be {} or {last}", rest.join(", "));
            Err(validation_error("Reservation", &[name], &msg))
        }
    }
}

// --- lookups, with τ²'s messages ---

fn get_user<'a>(db: &'a FlightDb, user_id: &str) -> Result<&'a User, ToolError> {
    db.users
        .get(user_id)
        .ok_or_else(|| fail(format!("User {user_id} not found")))
}

fn get_reservation<'a>(db: &'a FlightDb, id: &str) -> Result<&'a Reservation, ToolError> {
    db.reservations
        .get(id)
        .ok_or_else(|| fail(format!("Reservation {id} not found")))
}

fn get_flight_date<'a>(
    db: &'a FlightDb,
    number: &str,
    date: &str,
) -> Result<&'a FlightDate, ToolError> {
    let flight = db
        .flights
        .get(number)
        .ok_or_else(|| fail(format!("Flight {number} not found")))?;
    flight
        .dates
        .get(date)
        .ok_or_else(|| fail(format!("Flight {number} not found on date {date}")))
}

/// A new segment priced for `cabin`, checked bookable for `seats`
/// passengers.
fn new_segment(
    db: &FlightDb,
    info: &FlightInfo,
    cabin: Cabin,
    seats: usize,
) -> Result<ReservationFlight, ToolError> {
    let number = &info.flight_number;
    let FlightDate::Available {
        available_seats,
        prices,
    } = get_flight_date(db, number, &info.date)?
    else {
        return Err(fail(format!(
            "Flight {number} not available on date {}",
            info.date
        )));
    };
    if available_seats.get(cabin) < seats as i64 {
        return Err(fail(format!("Not enough seats on flight {number}")));
    }
    let flight = &db.flights[number.as_str()];
    Ok(ReservationFlight {
        flight_number: number.clone(),
        origin: flight.origin.clone(),
        destination: flight.destination.clone(),
        date: info.date.clone(),
        price: prices.get(cabin),
    })
}

// --- the tools ---

fn book_reservation(db: &mut FlightDb, args: &Map<String, Value>) -> Result<String, ToolError> {
    let flights = flight_infos(args)?;
    let passengers = passengers(args)?;
    let payments = payments(args)?;
    let user_id = str_arg(args, "user_id")?;
    let user = get_user(db, user_id)?;
    let id = NEW_RESERVATION_IDS
        .iter()
        .find(|id| !db.reservations.contains_key(**id))
        .ok_or_else(|| fail("Too many reservations"))?
        .to_string();
    let flight_type = literal(args, "flight_type", &["round_trip", "one_way"])?;
    let cabin_name = literal(args, "cabin", CABINS)?;
    let cabin = Cabin::parse(&cabin_name).expect("a listed cabin");
    let total_baggages = int_arg(args, "total_baggages")?;
    let nonfree_baggages = int_arg(args, "nonfree_baggages")?;
    let insurance = literal(args, "insurance", &["yes", "no"])?;
    let mut segments = Vec::new();
    let mut total_price = 0;
    for info in &flights {
        let segment = new_segment(db, info, cabin, passengers.len())?;
        total_price += segment.price * passengers.len() as i64;
        segments.push(segment);
    }
    if insurance == "yes" {
        total_price += 30 * passengers.len() as i64;
    }
    total_price += 50 * nonfree_baggages;
    for p in &payments {
        let method = user
            .payment_methods
            .get(&p.payment_id)
            .ok_or_else(|| fail(format!("Payment method {} not found", p.payment_id)))?;
        if method.balance().is_some_and(|b| b < p.amount as f64) {
            return Err(fail(format!(
                "Not enough balance in payment method {}",
                p.payment_id
            )));
        }
    }
    let paid: i64 = payments.iter().map(|p| p.amount).sum();
    if paid != total_price {
        return Err(fail(format!(
            "Payment amount does not add up, total price is {total_price}, but paid {paid}"
        )));
    }
    charge(db.users.get_mut(user_id).expect("user checked"), &payments)?;
    for info in &flights {
        if let Some(FlightDate::Available {
            available_seats, ..
        }) = db
            .flights
            .get_mut(&info.flight_number)
            .and_then(|f| f.dates.get_mut(&info.date))
        {
            *available_seats.get_mut(cabin) -= passengers.len() as i64;
        }
    }
    let reservation = Reservation {
        reservation_id: id.clone(),
        user_id: user_id.to_string(),
        origin: str_arg(args, "origin")?.to_string(),
        destination: str_arg(args, "destination")?.to_string(),
        flight_type: serde_json::from_value(Value::String(flight_type)).expect("a listed type"),
        cabin,
        flights: segments,
        passengers,
        payment_history: payments,
        created_at: NOW.to_string(),
        total_baggages,
        nonfree_baggages,
        insurance,
        status: None,
    };
    let text = dump(&reservation);
    db.reservations.insert(id.clone(), reservation);
    db.users[user_id].reservations.push(id);
    Ok(text)
}

/// Takes the booking's payments: a gift card's balance goes down, a
/// certificate is used up whole. A certificate named twice fails on the
/// second removal after the earlier payments were taken, as in τ².
fn charge(user: &mut User, payments: &[Payment]) -> Result<(), ToolError> {
    for p in payments {
        match user.payment_methods.get_mut(&p.payment_id) {
            Some(PaymentMethod::GiftCard { amount, .. }) => *amount -= p.amount as f64,
            Some(PaymentMethod::Certificate { .. }) => {
                user.payment_methods.shift_remove(&p.payment_id);
            }
            Some(PaymentMethod::CreditCard { .. }) => {}
            None => return Err(fail(format!("'{}'", p.payment_id))),
        }
    }
    Ok(())
}

fn cancel_reservation(db: &mut FlightDb, id: &str) -> Result<String, ToolError> {
    get_reservation(db, id)?;
    let reservation = &mut db.reservations[id];
    let refunds: Vec<Payment> = reservation
        .payment_history
        .iter()
        .map(|p| Payment {
            payment_id: p.payment_id.clone(),
            amount: -p.amount,
        })
        .collect();
    reservation.payment_history.extend(refunds);
    reservation.status = Some("cancelled".to_string());
    // Seats are not given back: τ² leaves them taken.
    Ok(dump(&*reservation))
}

fn list_all_airports() -> String {
    let airports: Vec<Value> = AIRPORTS
        .iter()
        .map(|(iata, city)| json!({"iata": iata, "city": city}))
        .collect();
    py_json_dumps(&Value::Array(airports), false)
}

/// τ²'s `DirectFlight` for each bookable flight on `date`, in database
/// order; `leave_after` compares `HH:MM:SS` strings as τ² does.
fn direct_flights(
    db: &FlightDb,
    date: &str,
    origin: Option<&str>,
    destination: Option<&str>,
    leave_after: Option<&str>,
) -> Vec<Map<String, Value>> {
    let mut found = Vec::new();
    for flight in db.flights.values() {
        let matches = origin.is_none_or(|o| flight.origin == o)
            && destination.is_none_or(|d| flight.destination == d)
            && leave_after.is_none_or(|t| flight.scheduled_departure_time_est.as_str() >= t);
        let Some(FlightDate::Available {
            available_seats,
            prices,
        }) = flight.dates.get(date)
        else {
            continue;
        };
        if !matches {
            continue;
        }
        let Value::Object(entry) = json!({
            "flight_number": flight.flight_number,
            "origin": flight.origin,
            "destination": flight.destination,
            "status": "available",
            "scheduled_departure_time_est": flight.scheduled_departure_time_est,
            "scheduled_arrival_time_est": flight.scheduled_arrival_time_est,
            "date": null,
            "available_seats": available_seats,
            "prices": prices,
        }) else {
            unreachable!("json! of an object literal")
        };
        found.push(entry);
    }
    found
}

fn search_direct_flight(db: &FlightDb, args: &Map<String, Value>) -> Result<String, ToolError> {
    let (origin, destination) = (str_arg(args, "origin")?, str_arg(args, "destination")?);
    let found = direct_flights(
        db,
        str_arg(args, "date")?,
        Some(origin),
        Some(destination),
        None,
    );
    let list = found.into_iter().map(Value::Object).collect();
    Ok(py_json_dumps(&Value::Array(list), false))
}

fn search_onestop_flight(db: &FlightDb, args: &Map<String, Value>) -> Result<String, ToolError> {
    let (origin, destination) = (str_arg(args, "origin")?, str_arg(args, "destination")?);
    let date = str_arg(args, "date")?;
    let mut pairs = Vec::new();
    for mut first in direct_flights(db, date, Some(origin), None, None) {
        first["date"] = Value::String(date.to_string());
        let arrival = first["scheduled_arrival_time_est"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let date2 = if arrival.contains("+1") {
            next_day(date)?
        } else {
            date.to_string()
        };
        let via = first["destination"].as_str().unwrap_or("").to_string();
        for mut second in direct_flights(db, &date2, Some(&via), Some(destination), Some(&arrival))
        {
            second["date"] = Value::String(date2.clone());
            pairs.push(json!([first.clone(), second]));
        }
    }
    Ok(py_json_dumps(&Value::Array(pairs), false))
}

/// τ²'s next-day date for a `+1` arrival: the day number of the last two
/// characters plus one, in May 2024, unpadded (`2024-05-6`).
fn next_day(date: &str) -> Result<String, ToolError> {
    let chars: Vec<char> = date.chars().collect();
    let tail: String = chars[chars.len().saturating_sub(2)..].iter().collect();
    let day: i64 = tail
        .trim()
        .parse()
        .map_err(|_| fail(format!("invalid literal for int() with base 10: '{tail}'")))?;
    Ok(format!("2024-05-{}", day + 1))
}

fn send_certificate(db: &mut FlightDb, args: &Map<String, Value>) -> Result<String, ToolError> {
    let user_id = str_arg(args, "user_id")?;
    get_user(db, user_id)?;
    let amount = match &args["amount"] {
        Value::Number(n) => n.as_f64().unwrap_or(f64::NAN),
        other => {
            return Err(validation_error(
                "Certificate",
                &["amount"],
                &format!("Input should be a valid number, not {}", py_type(other)),
            ))
        }
    };
    let user = &mut db.users[user_id];
    let Some(id) = NEW_CERTIFICATE_IDS
        .iter()
        .find(|id| !user.payment_methods.contains_key(**id))
    else {
        return Err(fail("Too many certificates"));
    };
    user.payment_methods.insert(
        id.to_string(),
        PaymentMethod::Certificate {
            id: id.to_string(),
            amount,
        },
    );
    Ok(format!(
        "Certificate {id} added to user {user_id} with amount {}.",
        py_num(&args["amount"])
    ))
}

/// Charges (or, for a negative price, credits) an update to one of the
/// user's payment methods; the payment to record, if the price is not 0.
fn pay_for_update(
    user: &mut User,
    payment_id: &str,
    price: i64,
) -> Result<Option<Payment>, ToolError> {
    let method = user
        .payment_methods
        .get_mut(payment_id)
        .ok_or_else(|| fail("Payment method not found"))?;
    match method {
        PaymentMethod::Certificate { .. } => {
            return Err(fail("Certificate cannot be used to update reservation"))
        }
        PaymentMethod::GiftCard { amount, .. } if *amount < price as f64 => {
            return Err(fail("Gift card balance is not enough"))
        }
        PaymentMethod::GiftCard { amount, .. } => *amount -= price as f64,
        PaymentMethod::CreditCard { .. } => {}
    }
    Ok((price != 0).then(|| Payment {
        payment_id: payment_id.to_string(),
        amount: price,
    }))
}

fn update_reservation_baggages(
    db: &mut FlightDb,
    args: &Map<String, Value>,
) -> Result<String, ToolError> {
    let id = str_arg(args, "reservation_id")?;
    let user_id = get_reservation(db, id)?.user_id.clone();
    get_user(db, &user_id)?;
    let total_baggages = int_arg(args, "total_baggages")?;
    let nonfree_baggages = int_arg(args, "nonfree_baggages")?;
    let payment_id = str_arg(args, "payment_id")?;
    let price = 50 * (nonfree_baggages - db.reservations[id].nonfree_baggages).max(0);
    let payment = pay_for_update(&mut db.users[&user_id], payment_id, price)?;
    let reservation = &mut db.reservations[id];
    reservation.payment_history.extend(payment);
    reservation.total_baggages = total_baggages;
    reservation.nonfree_baggages = nonfree_baggages;
    Ok(dump(&*reservation))
}

fn update_reservation_flights(
    db: &mut FlightDb,
    args: &Map<String, Value>,
) -> Result<String, ToolError> {
    let flights = flight_infos(args)?;
    let id = str_arg(args, "reservation_id")?;
    let reservation = get_reservation(db, id)?;
    let user_id = reservation.user_id.clone();
    get_user(db, &user_id)?;
    let cabin_arg = str_arg(args, "cabin")?;
    // τ² compares the cabin unchecked and indexes seats and prices with it:
    // an unknown cabin fails there as a KeyError.
    let cabin = Cabin::parse(cabin_arg);
    let seats = reservation.passengers.len();
    let mut segments = Vec::new();
    let mut price = 0;
    for info in &flights {
        let kept = reservation.flights.iter().find(|f| {
            f.flight_number == info.flight_number
                && f.date == info.date
                && cabin == Some(reservation.cabin)
        });
        let segment = match (kept, cabin) {
            (Some(f), _) => f.clone(),
            (None, Some(c)) => new_segment(db, info, c, seats)?,
            (None, None) => {
                bookable(db, info)?;
                return Err(fail(format!("'{cabin_arg}'")));
            }
        };
        price += segment.price * seats as i64;
        segments.push(segment);
    }
    let Some(cabin) = cabin else {
        return Err(fail(format!("'{cabin_arg}'")));
    };
    price -= reservation.flights.iter().map(|f| f.price).sum::<i64>() * seats as i64;
    let payment_id = str_arg(args, "payment_id")?;
    let payment = pay_for_update(&mut db.users[&user_id], payment_id, price)?;
    let reservation = &mut db.reservations[id];
    reservation.payment_history.extend(payment);
    reservation.flights = segments;
    reservation.cabin = cabin;
    // Seats are not taken for new segments: τ² leaves the flights as they
    // were.
    Ok(dump(&*reservation))
}

/// The checks τ² makes on a new segment before it reads the cabin's seats.
fn bookable(db: &FlightDb, info: &FlightInfo) -> Result<(), ToolError> {
    match get_flight_date(db, &info.flight_number, &info.date)? {
        FlightDate::Available { .. } => Ok(()),
        _ => Err(fail(format!(
            "Flight {} not available on date {}",
            info.flight_number, info.date
        ))),
    }
}

fn update_reservation_passengers(
    db: &mut FlightDb,
    args: &Map<String, Value>,
) -> Result<String, ToolError> {
    let passengers = passengers(args)?;
    let id = str_arg(args, "reservation_id")?;
    let reservation = get_reservation(db, id)?;
    if passengers.len() != reservation.passengers.len() {
        return Err(fail("Number of passengers does not match"));
    }
    let reservation = &mut db.reservations[id];
    reservation.passengers = passengers;
    Ok(dump(&*reservation))
}

fn get_flight_status(db: &FlightDb, args: &Map<String, Value>) -> Result<String, ToolError> {
    let date = get_flight_date(db, str_arg(args, "flight_number")?, str_arg(args, "date")?)?;
    Ok(date.status().to_string())
}

// --- calculate ---

fn calculate(expression: &str) -> Result<String, ToolError> {
    if !expression.chars().all(|c| "0123456789+-*/(). ".contains(c)) {
        return Err(fail("Invalid characters in expression"));
    }
    let value = calc::eval(expression).map_err(fail)?;
    let x = match value {
        calc::Num::Int(i) => i as f64,
        calc::Num::Float(f) => f,
    };
    Ok(py_float_repr(round2(x)))
}

/// Python's `round(x, 2)`: correctly rounded, ties to even on the exact
/// binary value.
fn round2(x: f64) -> f64 {
    if !x.is_finite() {
        return x;
    }
    format!("{x:.2}").parse().unwrap_or(x)
}

/// Python's evaluation of the arithmetic `calculate` admits: integers stay
/// integers until `/`, `**` with a negative exponent, or a float operand.
mod calc {
    #[derive(Debug, Clone, Copy)]
    pub enum Num {
        Int(i128),
        Float(f64),
    }

    impl Num {
        fn f(self) -> f64 {
            match self {
                Num::Int(i) => i as f64,
                Num::Float(f) => f,
            }
        }
    }

    #[derive(Debug, Clone, PartialEq)]
    enum Tok {
        Num(String),
        Op(&'static str),
        Open,
        Close,
    }

    const SYNTAX: &str = "invalid syntax (<string>, line 1)";

    /// Most nested parentheses, unary signs and `**` right operands on one
    /// path of the parse. Python's parser stops at 200 nested parentheses
    /// ("too many nested parentheses"); the same bound here keeps a
    /// model's expression from exhausting the stack.
    pub const MAX_DEPTH: usize = 200;
    const TOO_DEEP: &str = "too many nested parentheses (<string>, line 1)";

    pub fn eval(text: &str) -> Result<Num, String> {
        let toks = tokens(text)?;
        if toks.is_empty() {
            return Err("invalid syntax (<string>, line 0)".into());
        }
        let mut p = Parser {
            toks,
            at: 0,
            depth: 0,
        };
        let v = p.expr()?;
        if p.at != p.toks.len() {
            return Err(if p.toks[p.at] == Tok::Close {
                "unmatched ')' (<string>, line 1)".into()
            } else {
                SYNTAX.into()
            });
        }
        v.ok_or_else(|| {
            "float() argument must be a string or a real number, not 'tuple'".to_string()
        })
    }

    fn tokens(text: &str) -> Result<Vec<Tok>, String> {
        let chars: Vec<char> = text.chars().collect();
        let mut toks = Vec::new();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            let next = chars.get(i + 1).copied();
            match c {
                ' ' => i += 1,
                '(' => (toks.push(Tok::Open), i += 1).1,
                ')' => (toks.push(Tok::Close), i += 1).1,
                '*' if next == Some('*') => (toks.push(Tok::Op("**")), i += 2).1,
                '/' if next == Some('/') => (toks.push(Tok::Op("//")), i += 2).1,
                '*' => (toks.push(Tok::Op("*")), i += 1).1,
                '/' => (toks.push(Tok::Op("/")), i += 1).1,
                '+' => (toks.push(Tok::Op("+")), i += 1).1,
                '-' => (toks.push(Tok::Op("-")), i += 1).1,
                _ => {
                    let start = i;
                    while i < chars.len() && chars[i].is_ascii_digit() {
                        i += 1;
                    }
                    if i < chars.len() && chars[i] == '.' {
                        i += 1;
                        while i < chars.len() && chars[i].is_ascii_digit() {
                            i += 1;
                        }
                    }
                    let lit: String = chars[start..i].iter().collect();
                    if lit == "." {
                        return Err(SYNTAX.into());
                    }
                    toks.push(Tok::Num(lit));
                }
            }
        }
        Ok(toks)
    }

    struct Parser {
        toks: Vec<Tok>,
        at: usize,
        /// Recursive descents open on the current path.
        depth: usize,
    }

    /// `None` is the empty tuple `()`.
    type Val = Option<Num>;

    impl Parser {
        fn peek(&self) -> Option<&Tok> {
            self.toks.get(self.at)
        }

        fn eat_op(&mut self, ops: &[&str]) -> Option<&'static str> {
            match self.peek() {
                Some(Tok::Op(o)) if ops.contains(o) => {
                    let o = *o;
                    self.at += 1;
                    Some(o)
                }
                _ => None,
            }
        }

        fn expr(&mut self) -> Result<Val, String> {
            let mut v = self.term()?;
            while let Some(op) = self.eat_op(&["+", "-"]) {
                let r = self.term()?;
                v = Some(binary(op, need(v, op)?, need(r, op)?)?);
            }
            Ok(v)
        }

        fn term(&mut self) -> Result<Val, String> {
            let mut v = self.factor()?;
            while let Some(op) = self.eat_op(&["*", "/", "//"]) {
                let r = self.factor()?;
                v = Some(binary(op, need(v, op)?, need(r, op)?)?);
            }
            Ok(v)
        }

        /// `factor` one level deeper, refused past [`MAX_DEPTH`].
        fn nested<T>(
            &mut self,
            f: impl FnOnce(&mut Self) -> Result<T, String>,
        ) -> Result<T, String> {
            if self.depth >= MAX_DEPTH {
                return Err(TOO_DEEP.into());
            }
            self.depth += 1;
            let v = f(self);
            self.depth -= 1;
            v
        }

        fn factor(&mut self) -> Result<Val, String> {
            if let Some(op) = self.eat_op(&["+", "-"]) {
                let v = self.nested(Self::factor)?;
                let Some(n) = v else {
                    return Err(format!("bad operand type for unary {op}: 'tuple'"));
                };
                return Ok(Some(match (op, n) {
                    // Python's integers have no least value: -i128::MIN
                    // leaves i128 for a float, as an overflowing product does.
                    ("-", Num::Int(i)) => i.checked_neg().map_or(Num::Float(-(i as f64)), Num::Int),
                    ("-", Num::Float(f)) => Num::Float(-f),
                    _ => n,
                }));
            }
            let base = self.atom()?;
            if self.eat_op(&["**"]).is_some() {
                let exp = self.nested(Self::factor)?;
                return Ok(Some(binary("**", need(base, "**")?, need(exp, "**")?)?));
            }
            Ok(base)
        }

        fn atom(&mut self) -> Result<Val, String> {
            match self.peek().cloned() {
                Some(Tok::Num(lit)) => {
                    self.at += 1;
                    number(&lit).map(Some)
                }
                Some(Tok::Open) => {
                    self.at += 1;
                    if self.peek() == Some(&Tok::Close) {
                        self.at += 1;
                        return Ok(None);
                    }
                    let v = self.nested(Self::expr)?;
                    match self.peek() {
                        Some(Tok::Close) => {
                            self.at += 1;
                            Ok(v)
                        }
                        None => Err("'(' was never closed (<string>, line 1)".into()),
                        Some(_) => Err(SYNTAX.into()),
                    }
                }
                Some(Tok::Close) => Err("unmatched ')' (<string>, line 1)".into()),
                _ => Err(SYNTAX.into()),
            }
        }
    }

    fn need(v: Val, op: &str) -> Result<Num, String> {
        v.ok_or_else(|| format!("unsupported operand type(s) for {op}: 'tuple' and 'tuple'"))
    }

    fn number(lit: &str) -> Result<Num, String> {
        if !lit.contains('.') {
            if lit.len() > 1 && lit.starts_with('0') && lit.chars().any(|c| c != '0') {
                return Err("leading zeros in decimal integer literals are not permitted; use an 0o prefix for octal integers (<string>, line 1)".into());
            }
            if let Ok(i) = lit.parse::<i128>() {
                return Ok(Num::Int(i));
            }
        }
        let text = if lit.starts_with('.') {
            format!("0{lit}")
        } else {
            lit.to_string()
        };
        text.parse::<f64>()
            .map(Num::Float)
            .map_err(|_| SYNTAX.into())
    }

    fn binary(op: &str, a: Num, b: Num) -> Result<Num, String> {
        use Num::{Float, Int};
        Ok(match (op, a, b) {
            ("+", Int(x), Int(y)) => x.checked_add(y).map_or(Float(x as f64 + y as f64), Int),
            ("-", Int(x), Int(y)) => x.checked_sub(y).map_or(Float(x as f64 - y as f64), Int),
            ("*", Int(x), Int(y)) => x.checked_mul(y).map_or(Float(x as f64 * y as f64), Int),
            ("+", _, _) => Float(a.f() + b.f()),
            ("-", _, _) => Float(a.f() - b.f()),
            ("*", _, _) => Float(a.f() * b.f()),
            ("/", Int(_), Int(0)) => return Err("division by zero".into()),
            ("/", _, _) if b.f() == 0.0 => return Err("float division by zero".into()),
            ("/", _, _) => Float(a.f() / b.f()),
            ("//", Int(_), Int(0)) => return Err("integer division or modulo by zero".into()),
            // Floor division; i128::MIN // -1 leaves i128 for a float.
            ("//", Int(x), Int(y)) => match (x.checked_div_euclid(y), x.checked_rem_euclid(y)) {
                (Some(q), Some(r)) => Int(q - i128::from(y < 0 && r != 0)),
                _ => Float((x as f64 / y as f64).floor()),
            },
            ("//", _, _) if b.f() == 0.0 => return Err("float floor division by zero".into()),
            ("//", _, _) => Float((a.f() / b.f()).floor()),
            _ => power(a, b)?,
        })
    }

    fn power(a: Num, b: Num) -> Result<Num, String> {
        use Num::{Float, Int};
        match (a, b) {
            (Int(x), Int(y)) if y >= 0 => Ok(u32::try_from(y)
                .ok()
                .and_then(|y| x.checked_pow(y))
                .map_or(Float((x as f64).powf(y as f64)), Int)),
            _ if a.f() == 0.0 && b.f() < 0.0 => {
                Err("0.0 cannot be raised to a negative power".into())
            }
            _ if a.f() < 0.0 && b.f().fract() != 0.0 => {
                Err("float() argument must be a string or a real number, not 'complex'".into())
            }
            _ => Ok(Float(a.f().powf(b.f()))),
        }
    }
}
