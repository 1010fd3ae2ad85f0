//! The airline database: flights, users and reservations, shaped field for
//! field like τ²'s pydantic `FlightDB` so that dumps and hashes agree with
//! τ²'s byte for byte.
//!
//! Two renderings matter: the data file (`model_dump_json(indent=4,
//! exclude_none=True)`) and τ²'s DB hash (sha256 of `json.dumps(
//! model_dump(), sort_keys=True, default=str)`, None fields kept as null).
//! Both go through a `serde_json::Value` whose objects keep field order.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("cannot read the airline database {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the airline database is not valid")]
    Parse(#[source] serde_json::Error),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlightDb {
    pub flights: IndexMap<String, Flight>,
    pub users: IndexMap<String, User>,
    pub reservations: IndexMap<String, Reservation>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Flight {
    pub flight_number: String,
    pub origin: String,
    pub destination: String,
    /// `HH:MM:SS` EST; an arrival may carry a `+1` day suffix.
    pub scheduled_departure_time_est: String,
    pub scheduled_arrival_time_est: String,
    /// By date, `YYYY-MM-DD`.
    pub dates: IndexMap<String, FlightDate>,
}

/// A flight on one date. Times are `YYYY-MM-DDTHH:MM:SS` EST.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status")]
pub enum FlightDate {
    #[serde(rename = "available")]
    Available {
        available_seats: CabinCounts,
        /// Dollars per passenger.
        prices: CabinCounts,
    },
    #[serde(rename = "landed")]
    Landed {
        actual_departure_time_est: String,
        actual_arrival_time_est: String,
    },
    #[serde(rename = "cancelled")]
    Cancelled,
    #[serde(rename = "delayed")]
    Delayed {
        estimated_departure_time_est: String,
        estimated_arrival_time_est: String,
    },
    #[serde(rename = "flying")]
    Flying {
        actual_departure_time_est: String,
        estimated_arrival_time_est: String,
    },
    #[serde(rename = "on time")]
    OnTime {
        estimated_departure_time_est: String,
        estimated_arrival_time_est: String,
    },
}

impl FlightDate {
    /// The `status` value as τ² spells it.
    pub fn status(&self) -> &'static str {
        match self {
            FlightDate::Available { .. } => "available",
            FlightDate::Landed { .. } => "landed",
            FlightDate::Cancelled => "cancelled",
            FlightDate::Delayed { .. } => "delayed",
            FlightDate::Flying { .. } => "flying",
            FlightDate::OnTime { .. } => "on time",
        }
    }
}

/// One number per cabin (seats left, or a price in dollars).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CabinCounts {
    pub basic_economy: i64,
    pub economy: i64,
    pub business: i64,
}

impl CabinCounts {
    pub fn get(&self, cabin: Cabin) -> i64 {
        match cabin {
            Cabin::BasicEconomy => self.basic_economy,
            Cabin::Economy => self.economy,
            Cabin::Business => self.business,
        }
    }

    pub fn get_mut(&mut self, cabin: Cabin) -> &mut i64 {
        match cabin {
            Cabin::BasicEconomy => &mut self.basic_economy,
            Cabin::Economy => &mut self.economy,
            Cabin::Business => &mut self.business,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cabin {
    BasicEconomy,
    Economy,
    Business,
}

impl Cabin {
    pub fn parse(text: &str) -> Option<Cabin> {
        match text {
            "basic_economy" => Some(Cabin::BasicEconomy),
            "economy" => Some(Cabin::Economy),
            "business" => Some(Cabin::Business),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Cabin::BasicEconomy => "basic_economy",
            Cabin::Economy => "economy",
            Cabin::Business => "business",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Membership {
    Gold,
    Silver,
    Regular,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FlightType {
    RoundTrip,
    OneWay,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Name {
    pub first_name: String,
    pub last_name: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Address {
    pub address1: String,
    #[serde(default)]
    pub address2: Option<String>,
    pub city: String,
    pub country: String,
    pub state: String,
    pub zip: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct User {
    pub user_id: String,
    pub name: Name,
    pub address: Address,
    pub email: String,
    /// `YYYY-MM-DD`.
    pub dob: String,
    pub payment_methods: IndexMap<String, PaymentMethod>,
    pub saved_passengers: Vec<Passenger>,
    pub membership: Membership,
    /// Reservation ids, oldest first.
    pub reservations: Vec<String>,
}

/// A saved way to pay. Gift card and certificate balances are dollars, as
/// floats (τ² types them `float`; a balance less an integer price stays a
/// float).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum PaymentMethod {
    CreditCard {
        id: String,
        brand: String,
        last_four: String,
    },
    GiftCard {
        id: String,
        amount: f64,
    },
    Certificate {
        id: String,
        amount: f64,
    },
}

impl PaymentMethod {
    /// τ²'s `source` value.
    pub fn source(&self) -> &'static str {
        match self {
            PaymentMethod::CreditCard { .. } => "credit_card",
            PaymentMethod::GiftCard { .. } => "gift_card",
            PaymentMethod::Certificate { .. } => "certificate",
        }
    }

    pub fn id(&self) -> &str {
        match self {
            PaymentMethod::CreditCard { id, .. }
            | PaymentMethod::GiftCard { id, .. }
            | PaymentMethod::Certificate { id, .. } => id,
        }
    }

    /// The balance of a gift card or certificate.
    pub fn balance(&self) -> Option<f64> {
        match self {
            PaymentMethod::CreditCard { .. } => None,
            PaymentMethod::GiftCard { amount, .. } | PaymentMethod::Certificate { amount, .. } => {
                Some(*amount)
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Passenger {
    pub first_name: String,
    pub last_name: String,
    /// `YYYY-MM-DD`.
    pub dob: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reservation {
    pub reservation_id: String,
    pub user_id: String,
    pub origin: String,
    pub destination: String,
    pub flight_type: FlightType,
    pub cabin: Cabin,
    pub flights: Vec<ReservationFlight>,
    pub passengers: Vec<Passenger>,
    /// Payments in order; refunds are negative amounts.
    pub payment_history: Vec<Payment>,
    /// `YYYY-MM-DDTHH:MM:SS` EST.
    pub created_at: String,
    pub total_baggages: i64,
    pub nonfree_baggages: i64,
    /// `"yes"` or `"no"`.
    pub insurance: String,
    /// `Some("cancelled")` once cancelled.
    #[serde(default)]
    pub status: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReservationFlight {
    pub flight_number: String,
    pub origin: String,
    pub destination: String,
    /// `YYYY-MM-DD`.
    pub date: String,
    /// Dollars per passenger.
    pub price: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Payment {
    pub payment_id: String,
    /// Dollars; negative for a refund.
    pub amount: i64,
}

/// Most bytes a τ² data file may have, by its name. Each is far above τ²'s
/// own (`db.json` 7 MB, the task files 160 kB, `policy.md` 8 kB): a wrong
/// path to a huge file, or to a FIFO or device, is refused rather than
/// read, and the texts sent whole as prompts (the policy, the guidelines)
/// stay within what a model's context can take at all.
pub fn data_file_cap(name: &str) -> u64 {
    match name {
        "policy.md" | "simulation_guidelines.md" | "simulation_guidelines_tools.md" => 256 << 10,
        "split_tasks.json" => 1 << 20,
        "tasks.json" | "tasks_release.json" => 16 << 20,
        _ => DATA_FILE_CAP,
    }
}

/// Most bytes of a data file [`data_file_cap`] does not name (`db.json`).
pub const DATA_FILE_CAP: u64 = 64 << 20;

/// A data file's text: a regular file within its [`data_file_cap`]. Every
/// file of the data directory is read through it.
pub fn read_data_file(path: &Path) -> std::io::Result<String> {
    use std::io::{Error, ErrorKind, Read};
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let cap = data_file_cap(name);
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(Error::new(ErrorKind::InvalidInput, "not a regular file"));
    }
    let too_big = || {
        Error::new(
            ErrorKind::InvalidData,
            format!("{} bytes, above the {cap}-byte cap for {name}", meta.len()),
        )
    };
    if meta.len() > cap {
        return Err(too_big());
    }
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(cap + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > cap {
        return Err(too_big());
    }
    Ok(text)
}

impl FlightDb {
    pub fn load(path: &Path) -> Result<FlightDb, DbError> {
        let text = read_data_file(path).map_err(|source| DbError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        FlightDb::from_json(&text)
    }

    pub fn from_json(text: &str) -> Result<FlightDb, DbError> {
        serde_json::from_str(text).map_err(DbError::Parse)
    }

    /// τ²'s `model_dump()`: every field, None as null, in field order.
    pub fn model_dump(&self) -> Value {
        to_value(self)
    }

    /// The data file's form: `model_dump_json(indent=4, exclude_none=True)`.
    pub fn to_file_json(&self) -> String {
        pretty_json(&strip_nulls(self.model_dump()))
    }

    /// τ²'s DB hash: hex sha256 of `json.dumps(model_dump(), sort_keys=True,
    /// default=str)`.
    pub fn hash(&self) -> String {
        use sha2::{Digest, Sha256};
        let text = py_json_dumps(&self.model_dump(), true);
        crate::hex(&Sha256::digest(text.as_bytes()))
    }
}

/// Any of the model's types as τ²'s `model_dump()` gives it.
pub fn to_value<T: Serialize>(model: &T) -> Value {
    // The types hold only strings, integers, floats and maps with string
    // keys: serialising them cannot fail.
    serde_json::to_value(model).expect("the airline types serialise to JSON")
}

/// Drops null members of objects, at every depth (pydantic's
/// `exclude_none`).
pub fn strip_nulls(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, strip_nulls(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(strip_nulls).collect()),
        other => other,
    }
}

/// pydantic's `model_dump_json(indent=4)`: UTF-8 unescaped, floats with a
/// fraction digit, no trailing newline.
pub fn pretty_json(value: &Value) -> String {
    let mut out = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut out, formatter);
    value
        .serialize(&mut ser)
        .expect("writing JSON to memory cannot fail");
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

/// Python's `json.dumps(value, sort_keys=…)` with its defaults: separators
/// `", "` and `": "`, non-ASCII as `\uXXXX`, floats as `repr(float)`.
pub fn py_json_dumps(value: &Value, sort_keys: bool) -> String {
    let mut out = String::new();
    write_py_json(value, sort_keys, &mut out);
    out
}

fn write_py_json(value: &Value, sort_keys: bool, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => write!(out, "{i}").expect("writing to a String"),
            (None, Some(u)) => write!(out, "{u}").expect("writing to a String"),
            _ => out.push_str(&py_float_repr(n.as_f64().unwrap_or(f64::NAN))),
        },
        Value::String(s) => write_py_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_py_json(item, sort_keys, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            if sort_keys {
                // Python compares str by code point, which UTF-8 byte order
                // preserves.
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_py_string(k, out);
                out.push_str(": ");
                write_py_json(v, sort_keys, out);
            }
            out.push('}');
        }
    }
}

fn write_py_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    write!(out, "\\u{unit:04x}").expect("writing to a String");
                }
            }
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: the shortest digits that round-trip, positional
/// for decimal exponents from -5 to 15, else `d.ddde+XX`.
pub fn py_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // Rust's `{:e}` gives the shortest round-trip digits, as `d.ddde-N`.
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("{:e} exponent is an integer");
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if x.is_sign_negative() { "-" } else { "" };
    let body = if (-4..16).contains(&exp) {
        positional(&digits, exp)
    } else {
        let (head, tail) = digits.split_at(1);
        let frac = if tail.is_empty() {
            String::new()
        } else {
            format!(".{tail}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{head}{frac}e{esign}{:02}", exp.abs())
    };
    format!("{sign}{body}")
}

/// `digits` (d.ddd × 10^exp) written out, with at least one fraction digit.
fn positional(digits: &str, exp: i32) -> String {
    if exp < 0 {
        let zeros = "0".repeat((-exp - 1) as usize);
        return format!("0.{zeros}{digits}");
    }
    let point = exp as usize + 1;
    if digits.len() <= point {
        let zeros = "0".repeat(point - digits.len());
        format!("{digits}{zeros}.0")
    } else {
        format!("{}.{}", &digits[..point], &digits[point..])
    }
}
