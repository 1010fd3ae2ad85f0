//! The airline policy as typed rules, checked at tool dispatch.
//!
//! A [`RuleSet`] holds the policy's parameters as data (hours, cabins,
//! memberships, bag counts, prices, limits): the hand-written
//! [`RuleSet::reference`] is the validation oracle, and the agent's own
//! model compiles another from policy.md (`compile`). The checks are code,
//! one function per [`RuleId`], and read the parameters; so two rule sets
//! differ only where their data does.
//!
//! A proposed write is judged on the database before it runs and on the
//! conversation's receipts:
//! - the identified user is the `user_id` of the latest `get_user_details`
//!   call whose result the agent saw and which succeeded (a JSON object
//!   with that `user_id`). A user id the user only typed is not enough: the
//!   policy asks the agent to obtain it, and the lookup is the receipt that
//!   it names a real profile;
//! - explicit confirmation, read as a careful rater would: the latest user
//!   message answers the agent's message right before it, which asked and
//!   named this action — its kind (cancel, bags, …) and its details: the
//!   reservation id; a booking's flight numbers and cabin; a change's new
//!   flight numbers and new cabin; a baggage change's new total; the
//!   passengers' first names; a certificate's amount — and the answer says
//!   yes ([`affirms`]), with or without the usual keywords ("Perfect, book
//!   it", "I agree", "No problem, go ahead"), and is neither hedged ("I
//!   think so", "I'm not sure"), conditional ("yes, if it is free"),
//!   refused or taken back ("yes… actually no", "please don't proceed"),
//!   nor followed by a question in the same message. A yes to an earlier,
//!   different question (the greeting, a request for the user id) confirms
//!   nothing; one question naming three changes, answered yes, confirms
//!   all three and nothing else; lookups between the yes and the write do
//!   not undo it. In doubt it is no yes: a yes misread costs the agent one
//!   more question, a no misread a write the user did not want;
//! - a reason covered by travel insurance is one of the rule set's
//!   `insurance_reasons`, or a word or phrase for it (sick, medical, "not
//!   feeling well", storm, …), not negated ("I'm not sick"), in any of the
//!   user's messages.
//!
//! With receipts read by a model ([`super::reader`]), the confirmation and
//! the reason are a matcher's reading ([`MatcherRead`]) instead; the
//! identified user and which exchange a confirmation is read from stay
//! code.
//!
//! Policy statements not encoded, and why:
//! - one cabin for all flights, the same flights for every passenger: the
//!   tools take one cabin and one passenger list per reservation, so no call
//!   can break them;
//! - insurance cannot be added after booking: no tool adds it;
//! - only available flights can be booked, gift-card and certificate
//!   balances, kept segments' prices, refunds to the original payment
//!   methods: the tools enforce or perform these themselves;
//! - "do not add checked bags the user does not need", ask for trip type,
//!   origin, destination, insurance and the reason for cancelling, do not
//!   offer compensation unprompted, confirm the facts first, transfer only
//!   when out of scope, one tool call at a time: they concern what the user
//!   wants or how the agent talks, which neither the database nor a write's
//!   arguments show.

use std::collections::{BTreeMap, BTreeSet};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::db::{Cabin, FlightDate, FlightDb, FlightType, Membership, PaymentMethod, Reservation};
use crate::backend::{Message, Role};

/// Opens every text [`RuleSet::shown`] renders, so that the receipts never
/// take a rendered verdict, wherever an arm places it, for the user's words.
pub const SHOWN_HEADER: &str = "[policy check]";

/// One rule of the airline policy that a write can break.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleId {
    /// The write concerns the user the agent identified by lookup.
    ReservationOwner,
    /// The user affirmed right after the agent described the action.
    ExplicitConfirmation,
    /// Nothing flown, and one of the grounds for cancelling holds.
    CancelEligibility,
    /// Basic economy flights cannot be changed.
    BasicEconomyChange,
    /// A flight change keeps origin, destination and trip type.
    ChangeKeepsRoute,
    /// No cabin change once a segment has flown.
    CabinChange,
    /// Paid bags are exactly those beyond the free allowance.
    BaggageAllowance,
    /// Checked bags can be added, not removed.
    BaggageRemoval,
    /// At most so many passengers; their number never changes.
    PassengerLimit,
    /// Payment methods from the profile, within the per-kind limits.
    PaymentMethods,
    /// A certificate only for an eligible user's disrupted reservation.
    CertificateEligibility,
    /// A certificate of the policy's amount per passenger.
    CertificateAmount,
}

impl RuleId {
    pub const ALL: [RuleId; 12] = [
        RuleId::ReservationOwner,
        RuleId::ExplicitConfirmation,
        RuleId::CancelEligibility,
        RuleId::BasicEconomyChange,
        RuleId::ChangeKeepsRoute,
        RuleId::CabinChange,
        RuleId::BaggageAllowance,
        RuleId::BaggageRemoval,
        RuleId::PassengerLimit,
        RuleId::PaymentMethods,
        RuleId::CertificateEligibility,
        RuleId::CertificateAmount,
    ];

    /// Stable name, used in logs and records.
    pub fn name(self) -> &'static str {
        match self {
            RuleId::ReservationOwner => "reservation_owner",
            RuleId::ExplicitConfirmation => "explicit_confirmation",
            RuleId::CancelEligibility => "cancel_eligibility",
            RuleId::BasicEconomyChange => "basic_economy_change",
            RuleId::ChangeKeepsRoute => "change_keeps_route",
            RuleId::CabinChange => "cabin_change",
            RuleId::BaggageAllowance => "baggage_allowance",
            RuleId::BaggageRemoval => "baggage_removal",
            RuleId::PassengerLimit => "passenger_limit",
            RuleId::PaymentMethods => "payment_methods",
            RuleId::CertificateEligibility => "certificate_eligibility",
            RuleId::CertificateAmount => "certificate_amount",
        }
    }
}

/// The six tools that change the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Write {
    BookReservation,
    CancelReservation,
    UpdateReservationBaggages,
    UpdateReservationFlights,
    UpdateReservationPassengers,
    SendCertificate,
}

impl Write {
    pub const ALL: [Write; 6] = [
        Write::BookReservation,
        Write::CancelReservation,
        Write::UpdateReservationBaggages,
        Write::UpdateReservationFlights,
        Write::UpdateReservationPassengers,
        Write::SendCertificate,
    ];

    /// The tool's name.
    pub fn name(self) -> &'static str {
        match self {
            Write::BookReservation => "book_reservation",
            Write::CancelReservation => "cancel_reservation",
            Write::UpdateReservationBaggages => "update_reservation_baggages",
            Write::UpdateReservationFlights => "update_reservation_flights",
            Write::UpdateReservationPassengers => "update_reservation_passengers",
            Write::SendCertificate => "send_certificate",
        }
    }

    pub fn from_name(name: &str) -> Option<Write> {
        Write::ALL.into_iter().find(|w| w.name() == name)
    }
}

/// A payment method's kind (its `source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PaymentKind {
    CreditCard,
    GiftCard,
    Certificate,
}

impl PaymentKind {
    fn of(m: &PaymentMethod) -> PaymentKind {
        match m {
            PaymentMethod::CreditCard { .. } => PaymentKind::CreditCard,
            PaymentMethod::GiftCard { .. } => PaymentKind::GiftCard,
            PaymentMethod::Certificate { .. } => PaymentKind::Certificate,
        }
    }
}

/// Free checked bags per passenger, by cabin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CabinBags {
    pub basic_economy: u32,
    pub economy: u32,
    pub business: u32,
}

impl CabinBags {
    pub fn get(&self, cabin: Cabin) -> u32 {
        match cabin {
            Cabin::BasicEconomy => self.basic_economy,
            Cabin::Economy => self.economy,
            Cabin::Business => self.business,
        }
    }
}

/// Free checked bags per passenger, by the booking user's membership.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FreeBags {
    pub regular: CabinBags,
    pub silver: CabinBags,
    pub gold: CabinBags,
}

impl FreeBags {
    /// Free bags per passenger for this membership and cabin.
    pub fn per_passenger(&self, membership: Membership, cabin: Cabin) -> u32 {
        match membership {
            Membership::Regular => self.regular.get(cabin),
            Membership::Silver => self.silver.get(cabin),
            Membership::Gold => self.gold.get(cabin),
        }
    }
}

/// The policy's writable rules as parameters. Field names are the JSON the
/// compiler asks the model for (`compile`); money in whole dollars.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSet {
    /// Writes that need the user's explicit confirmation first.
    pub confirm_before: Vec<Write>,
    /// Hours after booking within which any reservation may be cancelled.
    pub cancel_window_hours: u32,
    /// A flight cancelled by the airline makes its reservation cancellable.
    pub cancel_if_airline_cancelled: bool,
    /// Cabins whose reservations may always be cancelled.
    pub cancel_cabins: Vec<Cabin>,
    /// Memberships whose reservations may always be cancelled.
    pub cancel_memberships: Vec<Membership>,
    /// Reasons for cancelling that travel insurance covers (with insurance,
    /// one of them stated by the user makes a reservation cancellable).
    pub insurance_reasons: Vec<String>,
    /// A reservation with a segment already flown may be cancelled.
    pub cancel_after_flown: bool,
    /// Basic economy reservations may change their flights.
    pub basic_economy_flight_change: bool,
    /// A flight change must keep origin, destination and trip type.
    pub change_keeps_route: bool,
    /// The cabin may change after a segment has flown.
    pub cabin_change_after_flown: bool,
    pub free_bags: FreeBags,
    /// Dollars per checked bag beyond the free allowance.
    pub bag_price: u32,
    /// Checked bags may be removed from a reservation.
    pub bags_removable: bool,
    /// Most passengers on one reservation.
    pub max_passengers: u32,
    /// A reservation's number of passengers may change.
    pub passenger_count_changeable: bool,
    /// Most payment methods of each kind on one booking.
    pub max_certificates: u32,
    pub max_credit_cards: u32,
    pub max_gift_cards: u32,
    /// Kinds of payment method that may pay for (or be refunded) a flight
    /// change.
    pub change_payment_kinds: Vec<PaymentKind>,
    /// A user with one of these memberships may be compensated.
    pub compensation_memberships: Vec<Membership>,
    /// Travel insurance on the reservation makes the user eligible.
    pub compensation_if_insured: bool,
    /// Flying one of these cabins makes the user eligible.
    pub compensation_cabins: Vec<Cabin>,
    /// Certificate dollars per passenger for a cancelled flight.
    pub certificate_per_passenger_cancelled: u32,
    /// Certificate dollars per passenger for a delayed flight.
    pub certificate_per_passenger_delayed: u32,
    /// The delay certificate comes only after the reservation was changed or
    /// cancelled.
    pub delay_certificate_after_change: bool,
}

/// One rule a proposed call breaks, and why (one line, for the agent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    pub rule: RuleId,
    pub reason: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.rule.name(), self.reason)
    }
}

/// A rule's (or a call's) verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Allow,
    Refuse,
    /// The rule judges other writes (or this rule set switches it off).
    NotApplicable,
}

impl Verdict {
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Refuse => "refuse",
            Verdict::NotApplicable => "not_applicable",
        }
    }
}

/// One rule's verdict on a proposed call, why, and what it read of the
/// conversation (empty for rules that read only the database).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RuleVerdict {
    pub rule: RuleId,
    pub verdict: Verdict,
    pub why: String,
    pub receipts: BTreeMap<String, Value>,
}

/// What the conversation so far proves (see the module doc for each test).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Receipts {
    /// The user the agent looked up last, successfully.
    pub user: Option<String>,
    /// The index of that lookup's result in the history.
    pub user_at: Option<usize>,
    /// The latest user message and the agent's message it answers.
    pub exchange: Option<Exchange>,
    /// Every user message, lowercased, one per line.
    pub user_text: String,
    /// Reservation-id-shaped words the conversation mentions outside user
    /// lookups (calls, their results, both sides' texts).
    pub mentioned: BTreeSet<String>,
    /// Reservations a write call of the agent changed: it ran (no arm held
    /// it back) and raised no error.
    pub changed: BTreeSet<String>,
    /// A matcher model's reading of the conversation for the write being
    /// judged (receipts read by a model): taken in place of the lexical
    /// reading of the confirmation and of the cancellation's reason.
    pub matcher: Option<MatcherRead>,
}

/// What a reader found in the conversation for one proposed write: a
/// matcher model's reading, or the lexical one of the same receipts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MatcherRead {
    /// The user's latest message confirms this action, with the details the
    /// agent's question before it listed. None: not read (the rules ask no
    /// confirmation of this write, or no agent message asked anything the
    /// latest user message answers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmed: Option<bool>,
    /// The covered reason the user gave for cancelling (one of the rule
    /// set's `insurance_reasons`); None: none given, or not a cancellation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Receipts {
    pub fn read(history: &[Message]) -> Receipts {
        let results: BTreeMap<&str, (usize, &str)> = history
            .iter()
            .enumerate()
            .filter(|(_, m)| m.role == Role::Tool)
            .map(|(i, m)| (m.tool_call_id.as_str(), (i, m.content.as_str())))
            .collect();
        let mut r = Receipts::default();
        let mut lookups = BTreeSet::new();
        for m in history {
            for call in &m.tool_calls {
                let found = results.get(call.id.as_str()).copied();
                let result = found.map(|(_, text)| text);
                let args: Value = serde_json::from_str(&call.arguments).unwrap_or(Value::Null);
                if call.name == "get_user_details" {
                    lookups.insert(call.id.as_str());
                    if let Some(user) = result.and_then(looked_up_user) {
                        r.user = Some(user);
                        r.user_at = found.map(|(i, _)| i);
                    }
                } else if let Some(id) = args.get("reservation_id").and_then(Value::as_str) {
                    r.mentioned.insert(id.to_string());
                    // Ran (a refusal by the arm is a result too) and did
                    // not fail.
                    let ok =
                        result.is_some_and(|t| !t.starts_with("Error") && !super::prompts::held(t));
                    if ok && Write::from_name(&call.name).is_some() {
                        r.changed.insert(id.to_string());
                    }
                }
            }
            let from_lookup = m.role == Role::Tool && lookups.contains(m.tool_call_id.as_str());
            if !from_lookup && !is_shown(m) {
                r.mentioned.extend(reservation_words(&m.content));
            }
            if m.role == Role::User && !is_shown(m) {
                r.user_text.push_str(&m.content.to_lowercase());
                r.user_text.push('\n');
            }
        }
        r.exchange = Exchange::latest(history);
        r
    }
}

impl Receipts {
    /// The receipts with a matcher's reading in place of the lexical one.
    pub fn read_with(history: &[Message], matcher: Option<&MatcherRead>) -> Receipts {
        Receipts {
            matcher: matcher.cloned(),
            ..Receipts::read(history)
        }
    }

    /// The identified user, as explain shows it.
    fn read_user(&self) -> BTreeMap<String, Value> {
        BTreeMap::from([
            (
                "identified_user".to_string(),
                self.user.clone().map_or(Value::Null, Value::String),
            ),
            (
                "lookup_result_at".to_string(),
                self.user_at.map_or(Value::Null, Value::from),
            ),
        ])
    }

    /// Who read the conversation's confirmation and reason.
    fn read_by(&self) -> &'static str {
        match self.matcher {
            Some(_) => "matcher",
            None => "lexical",
        }
    }

    /// The exchange a confirmation is read from, as explain shows it.
    fn read_confirmation(&self) -> BTreeMap<String, Value> {
        let Some(x) = &self.exchange else {
            return BTreeMap::from([(
                "exchange".to_string(),
                Value::String(
                    "none: the latest user message does not answer an agent message with text"
                        .into(),
                ),
            )]);
        };
        BTreeMap::from([
            ("answer_at".to_string(), Value::from(x.at)),
            ("question".to_string(), Value::String(x.asked.clone())),
            ("answer".to_string(), Value::String(x.answer.clone())),
            ("question_asks".to_string(), Value::Bool(x.asks())),
            (
                "answer_says_yes".to_string(),
                Value::Bool(affirms(&x.answer)),
            ),
            ("read_by".to_string(), Value::String(self.read_by().into())),
            (
                "matcher_confirmed".to_string(),
                self.matcher
                    .as_ref()
                    .and_then(|m| m.confirmed)
                    .map_or(Value::Null, Value::Bool),
            ),
        ])
    }
}

/// What a matcher is asked for one proposed write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToRead {
    /// Whether the latest user message confirms the action.
    pub confirmation: bool,
    /// Which covered reason for cancelling the user gave.
    pub reason: bool,
}

/// The action a matcher is asked about, in words: its tool, then each
/// detail a confirmation must name (the reservation, the new flights and
/// cabin, the bag total, the passengers' first names, the amount).
pub fn action_details(db: &FlightDb, write: Write, args: &Value) -> Vec<String> {
    details(db, write, args)
        .into_iter()
        .map(|d| match d {
            Detail::Kind(_) => write.name().to_string(),
            Detail::Value(v) => v,
        })
        .collect()
}

/// The latest user message and the assistant text right before it: the
/// only exchange a confirmation can be read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchange {
    /// The agent's message (where a confirmation must list the action).
    pub asked: String,
    /// The user's answer.
    pub answer: String,
    /// The answer's index in the history.
    pub at: usize,
}

impl Exchange {
    fn latest(history: &[Message]) -> Option<Exchange> {
        let u = history
            .iter()
            .rposition(|m| m.role == Role::User && !is_shown(m))?;
        let asked = history[..u].last()?;
        (asked.role == Role::Assistant && !asked.content.trim().is_empty()).then(|| Exchange {
            asked: asked.content.clone(),
            answer: history[u].content.clone(),
            at: u,
        })
    }

    /// The agent asked the user something (a question mark, or a request
    /// for a yes such as "please confirm").
    pub fn asks(&self) -> bool {
        let a = self.asked.to_lowercase();
        a.contains('?')
            || ["please confirm", "confirm that", "let me know", "reply yes"]
                .iter()
                .any(|p| a.contains(p))
    }
}

/// Whether the receipts hold a confirmation of this write: Ok, or why not.
fn confirmation(
    db: &FlightDb,
    receipts: &Receipts,
    write: Write,
    args: &Value,
) -> Result<(), String> {
    let Some(x) = receipts.exchange.as_ref() else {
        return Err(
            "no explicit confirmation: list the action's details, ask, and get the user's yes first"
                .into(),
        );
    };
    if let Some(confirmed) = receipts.matcher.as_ref().and_then(|m| m.confirmed) {
        return match confirmed {
            true => Ok(()),
            false => Err("no explicit confirmation of this action, as the matcher read the exchange: list the action's details, ask, and get the user's yes first".into()),
        };
    }
    if !x.asks() {
        return Err(
            "no explicit confirmation: the agent's message before the user's last asked nothing"
                .into(),
        );
    }
    let asked = x.asked.to_lowercase();
    let tokens = detail_tokens(&asked);
    let missing: Vec<String> = details(db, write, args)
        .into_iter()
        .filter(|d| !d.named_in(&asked, &tokens))
        .map(|d| d.describe())
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "no explicit confirmation of this action: the question the user answered did not name {}",
            missing.join(", ")
        ));
    }
    if !affirms(&x.answer) {
        return Err("no explicit confirmation: the user's answer does not say yes (refused, hedged, conditional, taken back, or asking)".into());
    }
    Ok(())
}

/// One thing the agent's question must name for a yes to confirm a write.
enum Detail {
    /// What the action does: any of these stems, anywhere ("cancel…").
    Kind(&'static [&'static str]),
    /// A value of its arguments, as a word (numbers by value: 50 is "$50.00").
    Value(String),
}

impl Detail {
    fn named_in(&self, asked: &str, tokens: &[String]) -> bool {
        match self {
            Detail::Kind(stems) => stems.iter().any(|s| asked.contains(s)),
            Detail::Value(v) => {
                let v = v.to_lowercase();
                let num = v.parse::<f64>().ok();
                tokens.iter().any(|t| {
                    *t == v
                        || t.replace('_', " ") == v.replace('_', " ")
                        || num.is_some_and(|n| t.parse::<f64>().ok() == Some(n))
                }) || (v.contains('_') && asked.contains(&v.replace('_', " ")))
            }
        }
    }

    fn describe(&self) -> String {
        match self {
            Detail::Kind(stems) => format!("the action ({}…)", stems[0]),
            Detail::Value(v) => v.clone(),
        }
    }
}

/// The question's words for [`Detail::Value`]: letters, digits, `_` and
/// inner dots kept, so "$50.00," is "50.00" and "basic_economy" one word.
fn detail_tokens(asked: &str) -> Vec<String> {
    asked
        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.'))
        .map(|t| t.trim_matches('.'))
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .collect()
}

/// What a description of the write must name, as its arguments write it:
/// the kind of action; the reservation; a booking's flights and cabin, a
/// change's new flights and new cabin; a baggage change's new total; the
/// passengers' first names; a certificate's amount.
fn details(db: &FlightDb, write: Write, args: &Value) -> Vec<Detail> {
    let text = |k: &str| args.get(k).and_then(Value::as_str).map(str::to_string);
    let flights = || -> Vec<String> {
        args.get("flights")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|f| f.get("flight_number").and_then(Value::as_str))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    let held = text("reservation_id").and_then(|r| db.reservations.get(&r));
    let mut values: Vec<String> = text("reservation_id").into_iter().collect();
    let kind: &'static [&'static str] = match write {
        Write::BookReservation => {
            values.extend(flights());
            values.extend(text("cabin"));
            &["book", "purchase", "buy"]
        }
        Write::CancelReservation => &["cancel", "refund"],
        Write::UpdateReservationBaggages => {
            if let Some(n) = args.get("total_baggages").and_then(Value::as_i64) {
                values.push(n.to_string());
            }
            &["bag", "luggage"]
        }
        Write::UpdateReservationFlights => {
            let kept: BTreeSet<&str> = held
                .map(|r| r.flights.iter().map(|f| f.flight_number.as_str()).collect())
                .unwrap_or_default();
            values.extend(flights().into_iter().filter(|f| !kept.contains(f.as_str())));
            let cabin = text("cabin");
            if cabin.as_deref() != held.map(|r| r.cabin.name()) {
                values.extend(cabin);
            }
            &["flight", "cabin", "change", "switch", "move", "upgrade"]
        }
        Write::UpdateReservationPassengers => {
            if let Some(ps) = args.get("passengers").and_then(Value::as_array) {
                values.extend(
                    ps.iter()
                        .filter_map(|p| p.get("first_name").and_then(Value::as_str))
                        .map(str::to_string),
                );
            }
            &["passenger", "name", "traveler", "traveller"]
        }
        Write::SendCertificate => {
            if let Some(a) = args.get("amount").and_then(Value::as_f64) {
                values.push(a.to_string());
            }
            &["certificate", "voucher", "compensation", "credit"]
        }
    };
    let mut seen = BTreeSet::new();
    values.retain(|v| seen.insert(v.clone()));
    std::iter::once(Detail::Kind(kind))
        .chain(values.into_iter().map(Detail::Value))
        .collect()
}

fn is_shown(m: &Message) -> bool {
    m.content.trim_start().starts_with(SHOWN_HEADER)
}

/// The user id in a successful `get_user_details` result.
fn looked_up_user(result: &str) -> Option<String> {
    let v: Value = serde_json::from_str(result).ok()?;
    v.get("user_id")?.as_str().map(str::to_string)
}

/// Six upper-case letters and digits, as reservation ids are written.
fn reservation_words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| {
            w.len() == 6
                && w.chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
        })
        .map(str::to_string)
}

/// Words that say yes on their own.
const AFFIRM_WORDS: &[&str] = &[
    "yes",
    "yeah",
    "yep",
    "yup",
    "ya",
    "yea",
    "yess",
    "sure",
    "ok",
    "okay",
    "k",
    "alright",
    "correct",
    "confirm",
    "confirmed",
    "confirming",
    "proceed",
    "absolutely",
    "definitely",
    "agreed",
    "agree",
    "perfect",
    "great",
    "fine",
    "exactly",
    "certainly",
    "affirmative",
];
/// Phrases that say yes without any of the words.
const AFFIRM_PHRASES: &[&str] = &[
    "go ahead",
    "go for it",
    "please do",
    "do it",
    "do that",
    "book it",
    "cancel it",
    "change it",
    "send it",
    "update it",
    "make the change",
    "make it so",
    "sounds good",
    "looks good",
    "all good",
    "works for me",
    "that works",
    "let's do",
    "of course",
    "all right",
    "that's right",
    "that is right",
    "i'm happy with",
    "i am happy with",
    "please go",
    "that's what i want",
    "i do",
];
/// Negations that still say yes ("no problem, go ahead").
const NEGATED_YES: &[&str] = &[
    "no problem",
    "no problems",
    "not a problem",
    "no worries",
    "no rush",
    "don't mind",
    "do not mind",
    "dont mind",
];
/// Words that negate: a clause holding one refuses, unless the negation
/// is one of [`NEGATED_YES`] or falls on a detail of the booking
/// ([`NEGATED_DETAILS`]).
const NEGATORS: &[&str] = &[
    "no", "not", "never", "don't", "dont", "won't", "wont", "wouldn't", "can't", "cannot",
    "didn't", "doesn't", "isn't", "nope", "nah",
];
/// What a yes may decline in passing ("yes, no insurance").
const NEGATED_DETAILS: &[&str] = &[
    "insurance",
    "bag",
    "bags",
    "baggage",
    "luggage",
    "extra",
    "additional",
    "other",
];
/// Phrases that hedge, make a yes conditional, take it back, or turn it
/// into a request, wherever they stand.
const UNSAYING: &[&str] = &[
    "hold off",
    "hold on",
    "on second thought",
    "changed my mind",
    "change my mind",
    "cancel that",
    "scratch that",
    "forget it",
    "rather",
    "let me think",
    "let me check",
    "let me ask",
    "let me talk",
    "let me see",
    "let me look",
    "need to check",
    "need to ask",
    "need to think",
    "think about it",
    "check with",
    "talk to",
    "maybe",
    "perhaps",
    "probably",
    "i think so",
    "i guess so",
    "i suppose so",
    "unsure",
    "instead",
    "but",
    "if",
    "unless",
    "as long as",
    "provided",
    "first",
    "before you",
    "later",
    "please confirm",
    "can you",
    "could you",
    "tell me",
    "show me",
    "how much",
    "what's",
];

fn words(text: &str) -> Vec<String> {
    text.to_lowercase()
        .replace('’', "'")
        .split(|c: char| !(c.is_alphanumeric() || c == '\''))
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

/// Where `phrase` (words) starts in `w`, for each occurrence.
fn find_phrase(w: &[String], phrase: &str) -> Vec<usize> {
    let p: Vec<&str> = phrase.split(' ').collect();
    (0..w.len().saturating_sub(p.len() - 1))
        .filter(|&i| p.iter().zip(&w[i..]).all(|(a, b)| a == b))
        .collect()
}

/// The message's clauses, as words: split at sentence and clause
/// punctuation, so that "yes. actually, no" holds the clause "actually no".
fn clauses(text: &str) -> Vec<Vec<String>> {
    text.split(" - ")
        .flat_map(|c| c.split(|c: char| ",.;:!()\n—–…".contains(c)))
        .map(words)
        .filter(|w| !w.is_empty())
        .collect()
}

/// A negation in this clause refuses: it is not part of a [`NEGATED_YES`]
/// phrase and no detail it could be declining follows within three words.
fn clause_negates(c: &[String]) -> bool {
    let kept: BTreeSet<usize> = NEGATED_YES.iter().flat_map(|p| find_phrase(c, p)).collect();
    c.iter().enumerate().any(|(i, x)| {
        NEGATORS.contains(&x.as_str())
            && !kept.contains(&i)
            && !c[i + 1..]
                .iter()
                .take(3)
                .any(|n| NEGATED_DETAILS.contains(&n.as_str()))
    })
}

/// Whether a user's answer says yes, as a careful rater reads it: an
/// affirmation in words or a phrase, and nothing that refuses, hedges,
/// makes it conditional, takes it back or asks (any question mark). When
/// in doubt it is not a yes: a yes misread as a no costs the agent one
/// more question, a no misread as a yes a write the user did not want. An
/// echoed policy-check block is never the user's yes.
pub fn affirms(text: &str) -> bool {
    if text.contains(SHOWN_HEADER) || text.contains('?') {
        return false;
    }
    let cs = clauses(text);
    let says_yes = cs.iter().any(|c| {
        c.iter().any(|x| AFFIRM_WORDS.contains(&x.as_str()))
            || AFFIRM_PHRASES
                .iter()
                .chain(NEGATED_YES)
                .any(|p| !find_phrase(c, p).is_empty())
    });
    let unsays = cs
        .iter()
        .any(|c| clause_negates(c) || UNSAYING.iter().any(|p| !find_phrase(c, p).is_empty()));
    says_yes && !unsays
}

/// Words for each reason insurance may cover, beyond the reason's own name.
const REASON_WORDS: &[(&str, &[&str])] = &[
    (
        "health",
        &[
            "sick",
            "ill",
            "illness",
            "unwell",
            "medical",
            "hospital",
            "hospitalized",
            "doctor",
            "surgery",
            "injury",
            "injured",
        ],
    ),
    (
        "weather",
        &[
            "storm",
            "snow",
            "snowstorm",
            "hurricane",
            "blizzard",
            "flood",
            "tornado",
        ],
    ),
];

/// Phrases for each reason that hold none of its words ("not feeling
/// well" for health).
const REASON_PHRASES: &[(&str, &[&str])] = &[
    (
        "health",
        &[
            "not feeling well",
            "not feel well",
            "don't feel well",
            "didn't feel well",
            "not feeling good",
            "not well",
            "came down with",
            "come down with",
            "the flu",
            "a fever",
            "under the weather",
        ],
    ),
    ("weather", &["heavy snow", "ice storm", "severe storm"]),
];

/// A write's arguments in its typed form (None: the tool will refuse them).
fn args<T: DeserializeOwned>(v: &Value) -> Option<T> {
    T::deserialize(v).ok()
}

#[derive(Deserialize)]
struct FlightRef {
    flight_number: String,
    date: String,
}

#[derive(Deserialize)]
struct PaymentRef {
    payment_id: String,
}

#[derive(Deserialize)]
struct BookArgs {
    user_id: String,
    cabin: Cabin,
    passengers: Vec<Value>,
    payment_methods: Vec<PaymentRef>,
    total_baggages: i64,
    nonfree_baggages: i64,
}

#[derive(Deserialize)]
struct ReservationArg {
    reservation_id: String,
}

#[derive(Deserialize)]
struct FlightsArgs {
    cabin: Cabin,
    flights: Vec<FlightRef>,
    payment_id: String,
}

#[derive(Deserialize)]
struct BagsArgs {
    total_baggages: i64,
    nonfree_baggages: i64,
    payment_id: String,
}

#[derive(Deserialize)]
struct PassengersArgs {
    passengers: Vec<Value>,
}

#[derive(Deserialize)]
struct CertificateArgs {
    user_id: String,
    amount: f64,
}

/// One proposed write and what it is judged on.
struct Call<'a> {
    db: &'a FlightDb,
    receipts: &'a Receipts,
    write: Write,
    args: &'a Value,
}

impl<'a> Call<'a> {
    /// The reservation the call names, when it names one that exists.
    fn reservation(&self) -> Option<&'a Reservation> {
        let id = args::<ReservationArg>(self.args)?.reservation_id;
        self.db.reservations.get(&id)
    }
}

type RuleFn = fn(&RuleSet, &Call) -> Option<String>;

impl RuleSet {
    /// The policy as statebench reads it (policy.md, airline domain).
    pub fn reference() -> RuleSet {
        let bags = |basic_economy, economy, business| CabinBags {
            basic_economy,
            economy,
            business,
        };
        RuleSet {
            // The policy names bookings and every kind of update; the study
            // holds cancellations and certificates to the same receipt.
            confirm_before: Write::ALL.to_vec(),
            cancel_window_hours: 24,
            cancel_if_airline_cancelled: true,
            cancel_cabins: vec![Cabin::Business],
            cancel_memberships: vec![],
            insurance_reasons: vec!["health".into(), "weather".into()],
            cancel_after_flown: false,
            basic_economy_flight_change: false,
            change_keeps_route: true,
            cabin_change_after_flown: false,
            free_bags: FreeBags {
                regular: bags(0, 1, 2),
                silver: bags(1, 2, 3),
                gold: bags(2, 3, 4),
            },
            bag_price: 50,
            bags_removable: false,
            max_passengers: 5,
            passenger_count_changeable: false,
            max_certificates: 1,
            max_credit_cards: 1,
            max_gift_cards: 3,
            change_payment_kinds: vec![PaymentKind::CreditCard, PaymentKind::GiftCard],
            compensation_memberships: vec![Membership::Silver, Membership::Gold],
            compensation_if_insured: true,
            compensation_cabins: vec![Cabin::Business],
            certificate_per_passenger_cancelled: 100,
            certificate_per_passenger_delayed: 50,
            delay_certificate_after_change: true,
        }
    }

    const RULES: [(RuleId, RuleFn); 12] = [
        (RuleId::ReservationOwner, RuleSet::reservation_owner),
        (RuleId::ExplicitConfirmation, RuleSet::explicit_confirmation),
        (RuleId::CancelEligibility, RuleSet::cancel_eligibility),
        (RuleId::BasicEconomyChange, RuleSet::basic_economy_change),
        (RuleId::ChangeKeepsRoute, RuleSet::change_keeps_route),
        (RuleId::CabinChange, RuleSet::cabin_change),
        (RuleId::BaggageAllowance, RuleSet::baggage_allowance),
        (RuleId::BaggageRemoval, RuleSet::baggage_removal),
        (RuleId::PassengerLimit, RuleSet::passenger_limit),
        (RuleId::PaymentMethods, RuleSet::payment_methods),
        (
            RuleId::CertificateEligibility,
            RuleSet::certificate_eligibility,
        ),
        (RuleId::CertificateAmount, RuleSet::certificate_amount),
    ];

    /// The rules a proposed call breaks, given the DB before it runs and the
    /// agent's conversation so far. Empty for reads and for unknown tools.
    pub fn check(
        &self,
        db: &FlightDb,
        history: &[Message],
        name: &str,
        args: &Value,
    ) -> Vec<Violation> {
        self.check_read(db, history, name, args, None)
    }

    /// [`RuleSet::check`] with a matcher's reading of the conversation in
    /// place of the lexical one (None: the lexical).
    pub fn check_read(
        &self,
        db: &FlightDb,
        history: &[Message],
        name: &str,
        args: &Value,
        matcher: Option<&MatcherRead>,
    ) -> Vec<Violation> {
        self.verdicts_read(db, history, name, args, matcher)
            .into_iter()
            .filter(|v| v.verdict == Verdict::Refuse)
            .map(|v| Violation {
                rule: v.rule,
                reason: v.why,
            })
            .collect()
    }

    /// Every rule's verdict on a proposed call, with the receipts it read:
    /// what [`RuleSet::check`] keeps the refusals of. A read (or a name
    /// that is no write) is judged by no rule.
    pub fn verdicts(
        &self,
        db: &FlightDb,
        history: &[Message],
        name: &str,
        args: &Value,
    ) -> Vec<RuleVerdict> {
        self.verdicts_read(db, history, name, args, None)
    }

    /// [`RuleSet::verdicts`] with a matcher's reading (None: the lexical).
    pub fn verdicts_read(
        &self,
        db: &FlightDb,
        history: &[Message],
        name: &str,
        args: &Value,
        matcher: Option<&MatcherRead>,
    ) -> Vec<RuleVerdict> {
        match Write::from_name(name) {
            Some(write) => {
                self.verdicts_of(db, &Receipts::read_with(history, matcher), write, args)
            }
            None => RuleId::ALL
                .iter()
                .map(|&rule| RuleVerdict {
                    rule,
                    verdict: Verdict::NotApplicable,
                    why: format!("{name} is not a write"),
                    receipts: BTreeMap::new(),
                })
                .collect(),
        }
    }

    fn verdicts_of(
        &self,
        db: &FlightDb,
        receipts: &Receipts,
        write: Write,
        args: &Value,
    ) -> Vec<RuleVerdict> {
        let call = Call {
            db,
            receipts,
            write,
            args,
        };
        Self::RULES
            .iter()
            .map(|&(rule, f)| {
                let (verdict, why) = match f(self, &call) {
                    Some(why) => (Verdict::Refuse, why),
                    None if self.judges(rule, write) => (Verdict::Allow, "holds".to_string()),
                    None => (
                        Verdict::NotApplicable,
                        format!("does not judge {} here", write.name()),
                    ),
                };
                let receipts = match rule {
                    RuleId::ReservationOwner => receipts.read_user(),
                    RuleId::ExplicitConfirmation if self.judges(rule, write) => {
                        receipts.read_confirmation()
                    }
                    RuleId::CancelEligibility if write == Write::CancelReservation => {
                        BTreeMap::from([
                            (
                                "covered_reason".to_string(),
                                self.reason(receipts).map_or(Value::Null, Value::String),
                            ),
                            (
                                "read_by".to_string(),
                                Value::String(receipts.read_by().into()),
                            ),
                        ])
                    }
                    _ => BTreeMap::new(),
                };
                RuleVerdict {
                    rule,
                    verdict,
                    why,
                    receipts,
                }
            })
            .collect()
    }

    /// Whether `rule` judges `write` under this rule set's parameters (a
    /// parameter that permits what the rule guards switches it off).
    fn judges(&self, rule: RuleId, write: Write) -> bool {
        use Write::*;
        match rule {
            RuleId::ReservationOwner => true,
            RuleId::ExplicitConfirmation => self.confirm_before.contains(&write),
            RuleId::CancelEligibility => write == CancelReservation,
            RuleId::BasicEconomyChange => {
                write == UpdateReservationFlights && !self.basic_economy_flight_change
            }
            RuleId::ChangeKeepsRoute => {
                write == UpdateReservationFlights && self.change_keeps_route
            }
            RuleId::CabinChange => {
                write == UpdateReservationFlights && !self.cabin_change_after_flown
            }
            RuleId::BaggageAllowance => {
                matches!(write, BookReservation | UpdateReservationBaggages)
            }
            RuleId::BaggageRemoval => write == UpdateReservationBaggages && !self.bags_removable,
            RuleId::PassengerLimit => {
                write == BookReservation
                    || write == UpdateReservationPassengers && !self.passenger_count_changeable
            }
            RuleId::PaymentMethods => matches!(
                write,
                BookReservation | UpdateReservationFlights | UpdateReservationBaggages
            ),
            RuleId::CertificateEligibility | RuleId::CertificateAmount => write == SendCertificate,
        }
    }

    fn reservation_owner(&self, c: &Call) -> Option<String> {
        let Some(user) = c.receipts.user.as_deref() else {
            return Some(
                "no user identified yet: look the user up (get_user_details) first".into(),
            );
        };
        let owner = match c.write {
            Write::BookReservation => args::<BookArgs>(c.args)?.user_id,
            Write::SendCertificate => args::<CertificateArgs>(c.args)?.user_id,
            _ => c.reservation()?.user_id.clone(),
        };
        (owner != user)
            .then(|| format!("the write concerns user {owner}, not the identified user {user}"))
    }

    fn explicit_confirmation(&self, c: &Call) -> Option<String> {
        if !self.confirm_before.contains(&c.write) {
            return None;
        }
        confirmation(c.db, c.receipts, c.write, c.args).err()
    }

    fn cancel_eligibility(&self, c: &Call) -> Option<String> {
        if c.write != Write::CancelReservation {
            return None;
        }
        let r = c.reservation()?;
        self.cancel_verdict(c.db, c.receipts, r).err()
    }

    /// Ok(ground) when the reservation may be cancelled, Err(why not).
    fn cancel_verdict(
        &self,
        db: &FlightDb,
        receipts: &Receipts,
        r: &Reservation,
    ) -> Result<String, String> {
        if let Some(seg) = flown_segment(db, r) {
            if !self.cancel_after_flown {
                return Err(format!("{seg} has already flown"));
            }
        }
        let hours = hours_before_now(&r.created_at);
        if hours.is_some_and(|h| h <= f64::from(self.cancel_window_hours)) {
            return Ok(format!("booked within {} h", self.cancel_window_hours));
        }
        if self.cancel_if_airline_cancelled {
            if let Some(seg) = segment_with(db, r, |d| matches!(d, FlightDate::Cancelled)) {
                return Ok(format!("{seg} was cancelled by the airline"));
            }
        }
        if self.cancel_cabins.contains(&r.cabin) {
            return Ok(format!("{} cabin", Cabin::name(r.cabin)));
        }
        if let Some(m) = db.users.get(&r.user_id).map(|u| u.membership) {
            if self.cancel_memberships.contains(&m) {
                return Ok(format!("{} member", membership_name(m)));
            }
        }
        let insured = r.insurance == "yes";
        let reason = self.reason(receipts);
        if let (true, Some(reason)) = (insured, reason) {
            return Ok(format!("insured, and the user gave a {reason} reason"));
        }
        let booked = hours.map_or("at an unreadable time".into(), |h| format!("{h:.0} h ago"));
        Err(format!(
            "booked {booked} (window {} h), no airline-cancelled flight, {} cabin, {}",
            self.cancel_window_hours,
            Cabin::name(r.cabin),
            if insured {
                format!(
                    "insured but no covered reason ({}) stated by the user",
                    self.insurance_reasons.join(", ")
                )
            } else {
                "no travel insurance".into()
            }
        ))
    }

    /// The covered reason the user gave: the matcher's reading (a reason
    /// of this rule set's only), else the first the user's messages state.
    fn reason(&self, receipts: &Receipts) -> Option<String> {
        match &receipts.matcher {
            Some(m) => m
                .reason
                .clone()
                .filter(|r| self.insurance_reasons.contains(r)),
            None => self.covered_reason(&receipts.user_text).map(str::to_string),
        }
    }

    /// What a matcher must read for `write` under this rule set: whether
    /// the user confirmed it (when the rules ask that and an exchange
    /// exists to read it from) and, for a cancellation, the reason given.
    /// None: the rules read nothing of the conversation for this write.
    pub fn to_read(&self, receipts: &Receipts, write: Write) -> Option<ToRead> {
        let confirmation = self.confirm_before.contains(&write) && receipts.exchange.is_some();
        let reason = write == Write::CancelReservation && !self.insurance_reasons.is_empty();
        (confirmation || reason).then_some(ToRead {
            confirmation,
            reason,
        })
    }

    /// The lexical reading of what `to_read` names: the reading the rules
    /// take without a matcher, set beside the matcher's to measure it.
    pub fn lexical_read(
        &self,
        db: &FlightDb,
        receipts: &Receipts,
        write: Write,
        args: &Value,
        to_read: ToRead,
    ) -> MatcherRead {
        MatcherRead {
            confirmed: to_read
                .confirmation
                .then(|| confirmation(db, receipts, write, args).is_ok()),
            reason: to_read
                .reason
                .then(|| self.covered_reason(&receipts.user_text).map(str::to_string))
                .flatten(),
        }
    }

    /// The first covered reason the user's messages state.
    fn covered_reason(&self, user_text: &str) -> Option<&str> {
        let said = words(user_text);
        self.insurance_reasons
            .iter()
            .map(String::as_str)
            .find(|reason| {
                let reason_lc = reason.to_lowercase();
                let extra = REASON_WORDS
                    .iter()
                    .find(|(r, _)| *r == reason_lc)
                    .map_or(&[][..], |(_, w)| *w);
                let phrases = REASON_PHRASES
                    .iter()
                    .find(|(r, _)| *r == reason_lc)
                    .map_or(&[][..], |(_, p)| *p);
                // "I'm not sick" states no reason.
                let negated = |i: usize| {
                    said[i.saturating_sub(2)..i]
                        .iter()
                        .any(|w| NEGATORS.contains(&w.as_str()))
                };
                said.iter()
                    .enumerate()
                    .any(|(i, w)| (*w == reason_lc || extra.contains(&w.as_str())) && !negated(i))
                    || phrases.iter().any(|p| !find_phrase(&said, p).is_empty())
            })
    }

    fn basic_economy_change(&self, c: &Call) -> Option<String> {
        if c.write != Write::UpdateReservationFlights || self.basic_economy_flight_change {
            return None;
        }
        let r = c.reservation()?;
        let a = args::<FlightsArgs>(c.args)?;
        (r.cabin == Cabin::BasicEconomy && flights_differ(r, &a.flights)).then(|| {
            format!(
                "{} is basic economy: its flights cannot be changed (its cabin can)",
                r.reservation_id
            )
        })
    }

    fn change_keeps_route(&self, c: &Call) -> Option<String> {
        if c.write != Write::UpdateReservationFlights || !self.change_keeps_route {
            return None;
        }
        let r = c.reservation()?;
        let a = args::<FlightsArgs>(c.args)?;
        if !flights_differ(r, &a.flights) {
            return None;
        }
        let legs: Vec<(&str, &str)> = a
            .flights
            .iter()
            .map(|f| {
                c.db.flights
                    .get(&f.flight_number)
                    .map(|x| (x.origin.as_str(), x.destination.as_str()))
            })
            .collect::<Option<_>>()?;
        let (Some(first), Some(last)) = (legs.first(), legs.last()) else {
            return Some("no flights given".into());
        };
        let kept = match r.flight_type {
            FlightType::OneWay => first.0 == r.origin && last.1 == r.destination,
            FlightType::RoundTrip => {
                first.0 == r.origin
                    && last.1 == r.origin
                    && legs.iter().any(|l| l.1 == r.destination)
            }
        };
        let route: Vec<String> = legs.iter().map(|l| format!("{}-{}", l.0, l.1)).collect();
        (!kept).then(|| {
            format!(
                "new flights {} do not keep {}'s {} {}-{}",
                route.join(" "),
                r.reservation_id,
                flight_type_name(r.flight_type),
                r.origin,
                r.destination
            )
        })
    }

    fn cabin_change(&self, c: &Call) -> Option<String> {
        if c.write != Write::UpdateReservationFlights || self.cabin_change_after_flown {
            return None;
        }
        let r = c.reservation()?;
        let a = args::<FlightsArgs>(c.args)?;
        if a.cabin == r.cabin {
            return None;
        }
        flown_segment(c.db, r).map(|seg| format!("cabin cannot change: {seg} has already flown"))
    }

    /// Free bags for `passengers` of this user (by id) in this cabin.
    fn free_bags_for(
        &self,
        db: &FlightDb,
        user_id: &str,
        cabin: Cabin,
        passengers: usize,
    ) -> Option<i64> {
        let m = db.users.get(user_id)?.membership;
        Some(i64::from(self.free_bags.per_passenger(m, cabin)) * passengers as i64)
    }

    fn baggage_allowance(&self, c: &Call) -> Option<String> {
        let (free, total, nonfree) = match c.write {
            Write::BookReservation => {
                let a = args::<BookArgs>(c.args)?;
                let free = self.free_bags_for(c.db, &a.user_id, a.cabin, a.passengers.len())?;
                (free, a.total_baggages, a.nonfree_baggages)
            }
            Write::UpdateReservationBaggages => {
                let r = c.reservation()?;
                let a = args::<BagsArgs>(c.args)?;
                let free = self.free_bags_for(c.db, &r.user_id, r.cabin, r.passengers.len())?;
                (free, a.total_baggages, a.nonfree_baggages)
            }
            _ => return None,
        };
        let owed = (total - free).max(0);
        (nonfree != owed).then(|| {
            format!(
                "{free} bags are free here, so {total} bags mean {owed} paid (${} each), not {nonfree}",
                self.bag_price
            )
        })
    }

    fn baggage_removal(&self, c: &Call) -> Option<String> {
        if c.write != Write::UpdateReservationBaggages || self.bags_removable {
            return None;
        }
        let r = c.reservation()?;
        let a = args::<BagsArgs>(c.args)?;
        (a.total_baggages < r.total_baggages).then(|| {
            format!(
                "bags can be added, not removed: {} has {}, the call sets {}",
                r.reservation_id, r.total_baggages, a.total_baggages
            )
        })
    }

    fn passenger_limit(&self, c: &Call) -> Option<String> {
        match c.write {
            Write::BookReservation => {
                let n = args::<BookArgs>(c.args)?.passengers.len();
                (n > self.max_passengers as usize).then(|| {
                    format!(
                        "{n} passengers: at most {} per reservation",
                        self.max_passengers
                    )
                })
            }
            Write::UpdateReservationPassengers if !self.passenger_count_changeable => {
                let r = c.reservation()?;
                let n = args::<PassengersArgs>(c.args)?.passengers.len();
                (n != r.passengers.len()).then(|| {
                    format!(
                        "the number of passengers cannot change: {} has {}, the call gives {n}",
                        r.reservation_id,
                        r.passengers.len()
                    )
                })
            }
            _ => None,
        }
    }

    fn payment_methods(&self, c: &Call) -> Option<String> {
        let (user_id, ids, kinds_allowed): (String, Vec<String>, Option<&[PaymentKind]>) =
            match c.write {
                Write::BookReservation => {
                    let a = args::<BookArgs>(c.args)?;
                    let ids = a
                        .payment_methods
                        .into_iter()
                        .map(|p| p.payment_id)
                        .collect();
                    (a.user_id, ids, None)
                }
                Write::UpdateReservationFlights => {
                    let r = c.reservation()?;
                    let a = args::<FlightsArgs>(c.args)?;
                    (
                        r.user_id.clone(),
                        vec![a.payment_id],
                        Some(&self.change_payment_kinds[..]),
                    )
                }
                Write::UpdateReservationBaggages => {
                    let r = c.reservation()?;
                    (
                        r.user_id.clone(),
                        vec![args::<BagsArgs>(c.args)?.payment_id],
                        None,
                    )
                }
                _ => return None,
            };
        let user = c.db.users.get(&user_id)?;
        let mut count: BTreeMap<PaymentKind, u32> = BTreeMap::new();
        for id in &ids {
            let Some(m) = user.payment_methods.get(id) else {
                return Some(format!("{id} is not in {user_id}'s profile"));
            };
            let kind = PaymentKind::of(m);
            if kinds_allowed.is_some_and(|k| !k.contains(&kind)) {
                return Some(format!(
                    "a flight change cannot be paid with {}",
                    kind_name(kind)
                ));
            }
            *count.entry(kind).or_default() += 1;
        }
        let limits = [
            (PaymentKind::Certificate, self.max_certificates),
            (PaymentKind::CreditCard, self.max_credit_cards),
            (PaymentKind::GiftCard, self.max_gift_cards),
        ];
        limits.into_iter().find_map(|(kind, max)| {
            let n = count.get(&kind).copied().unwrap_or(0);
            (n > max).then(|| format!("{n} {}s: at most {max} per reservation", kind_name(kind)))
        })
    }

    /// The certificates the policy allows this user: (reservation, amount,
    /// why), over the user's reservations with a disrupted flight.
    fn certificate_offers(
        &self,
        db: &FlightDb,
        receipts: &Receipts,
        user_id: &str,
    ) -> Vec<(String, u32, String)> {
        let Some(user) = db.users.get(user_id) else {
            return Vec::new();
        };
        let mut offers = Vec::new();
        for r in user
            .reservations
            .iter()
            .filter_map(|id| db.reservations.get(id))
        {
            let eligible = self.compensation_memberships.contains(&user.membership)
                || (self.compensation_if_insured && r.insurance == "yes")
                || self.compensation_cabins.contains(&r.cabin);
            if !eligible {
                continue;
            }
            let n = r.passengers.len() as u32;
            if let Some(seg) = segment_with(db, r, |d| matches!(d, FlightDate::Cancelled)) {
                let amount = self.certificate_per_passenger_cancelled * n;
                offers.push((r.reservation_id.clone(), amount, format!("{seg} cancelled")));
            }
            let changed = !self.delay_certificate_after_change
                || receipts.changed.contains(&r.reservation_id);
            if let (Some(seg), true) = (
                segment_with(db, r, |d| matches!(d, FlightDate::Delayed { .. })),
                changed,
            ) {
                let amount = self.certificate_per_passenger_delayed * n;
                offers.push((r.reservation_id.clone(), amount, format!("{seg} delayed")));
            }
        }
        offers
    }

    fn certificate_eligibility(&self, c: &Call) -> Option<String> {
        if c.write != Write::SendCertificate {
            return None;
        }
        let a = args::<CertificateArgs>(c.args)?;
        let user = c.db.users.get(&a.user_id)?;
        self.certificate_offers(c.db, c.receipts, &a.user_id)
            .is_empty()
            .then(|| {
                format!(
                    "{} ({} member) has no reservation that qualifies: compensation needs a \
                 cancelled flight, or a delayed one after changing or cancelling its \
                 reservation, and a {} member, travel insurance or a {} cabin",
                    a.user_id,
                    membership_name(user.membership),
                    self.compensation_memberships
                        .iter()
                        .map(|m| membership_name(*m))
                        .collect::<Vec<_>>()
                        .join("/"),
                    self.compensation_cabins
                        .iter()
                        .map(|m| Cabin::name(*m))
                        .collect::<Vec<_>>()
                        .join("/"),
                )
            })
    }

    fn certificate_amount(&self, c: &Call) -> Option<String> {
        if c.write != Write::SendCertificate {
            return None;
        }
        let a = args::<CertificateArgs>(c.args)?;
        let offers = self.certificate_offers(c.db, c.receipts, &a.user_id);
        if offers.is_empty() || offers.iter().any(|o| f64::from(o.1) == a.amount) {
            return None;
        }
        let allowed: Vec<String> = offers
            .iter()
            .map(|(r, amt, why)| format!("${amt} for {r} ({why})"))
            .collect();
        Some(format!(
            "${} is not the policy's amount: {}",
            a.amount,
            allowed.join("; ")
        ))
    }

    /// The verdicts for the current state, for the `shown` arm: the
    /// identified user's allowance, each of their reservations the
    /// conversation names (cancel, change, cabin, bags, passengers,
    /// compensation), and whether the user has confirmed.
    pub fn shown(&self, db: &FlightDb, history: &[Message]) -> String {
        let receipts = Receipts::read(history);
        let mut out = vec![SHOWN_HEADER.to_string()];
        let confirmation = match &receipts.exchange {
            Some(x) if x.asks() && affirms(&x.answer) => {
                "the user's latest message says yes to your last question; it confirms only the actions whose details that question listed"
            }
            _ => "not given: list the action's details, ask, and get the user's yes before any write",
        };
        let user = receipts.user.as_deref().and_then(|u| db.users.get(u));
        let Some(user) = user else {
            out.push("user: none identified yet (look the user up with get_user_details before any write)".into());
            out.push(format!("confirmation: {confirmation}"));
            return out.join("\n");
        };
        let m = user.membership;
        let per = |c| self.free_bags.per_passenger(m, c);
        out.push(format!(
            "user {} ({} member): free bags per passenger basic_economy {}, economy {}, business {}; extra bag ${}; at most {} passengers",
            user.user_id,
            membership_name(m),
            per(Cabin::BasicEconomy),
            per(Cabin::Economy),
            per(Cabin::Business),
            self.bag_price,
            self.max_passengers
        ));
        let named: Vec<&Reservation> = user
            .reservations
            .iter()
            .filter(|id| receipts.mentioned.contains(*id))
            .filter_map(|id| db.reservations.get(id))
            .collect();
        for r in &named {
            out.push(self.reservation_verdicts(db, &receipts, r));
        }
        if named.is_empty() {
            out.push(format!("reservations: {}", user.reservations.join(", ")));
        }
        let offers = self.certificate_offers(db, &receipts, &user.user_id);
        if !offers.is_empty() {
            let o: Vec<String> = offers
                .iter()
                .map(|(r, a, why)| format!("${a} for {r} ({why})"))
                .collect();
            out.push(format!("compensation if the user asks: {}", o.join("; ")));
        }
        out.push(format!("confirmation: {confirmation}"));
        out.join("\n")
    }

    fn reservation_verdicts(&self, db: &FlightDb, receipts: &Receipts, r: &Reservation) -> String {
        let head = format!(
            "{} ({}, {}, {} {}-{}, {} passengers, insurance {}{})",
            r.reservation_id,
            Cabin::name(r.cabin),
            r.created_at,
            flight_type_name(r.flight_type),
            r.origin,
            r.destination,
            r.passengers.len(),
            r.insurance,
            if r.status.as_deref() == Some("cancelled") {
                ", cancelled"
            } else {
                ""
            }
        );
        let cancel = match self.cancel_verdict(db, receipts, r) {
            Ok(why) => format!("cancel: allowed ({why})"),
            Err(why) => format!("cancel: not allowed ({why})"),
        };
        let flown = flown_segment(db, r);
        let change = if r.cabin == Cabin::BasicEconomy && !self.basic_economy_flight_change {
            "change flights: not allowed (basic economy)".to_string()
        } else if self.change_keeps_route {
            format!(
                "change flights: allowed keeping {} {}-{}",
                flight_type_name(r.flight_type),
                r.origin,
                r.destination
            )
        } else {
            "change flights: allowed".to_string()
        };
        let cabin = match (&flown, self.cabin_change_after_flown) {
            (Some(seg), false) => format!("change cabin: not allowed ({seg} flown)"),
            _ => "change cabin: allowed, all segments together".to_string(),
        };
        let free = self
            .free_bags_for(db, &r.user_id, r.cabin, r.passengers.len())
            .unwrap_or(0);
        let bags = format!(
            "bags: {} now ({} paid), {free} free, each beyond ${}{}",
            r.total_baggages,
            r.nonfree_baggages,
            self.bag_price,
            if self.bags_removable {
                ""
            } else {
                ", none removable"
            }
        );
        let passengers = if self.passenger_count_changeable {
            "passengers: editable".to_string()
        } else {
            format!("passengers: editable, exactly {}", r.passengers.len())
        };
        format!("{head}: {cancel}; {change}; {cabin}; {bags}; {passengers}")
    }
}

/// The first segment whose date status satisfies `f`, as "HAT001 on 2024-05-01".
fn segment_with(db: &FlightDb, r: &Reservation, f: impl Fn(&FlightDate) -> bool) -> Option<String> {
    r.flights
        .iter()
        .find(|s| {
            db.flights
                .get(&s.flight_number)
                .and_then(|fl| fl.dates.get(&s.date))
                .is_some_and(&f)
        })
        .map(|s| format!("{} on {}", s.flight_number, s.date))
}

/// A segment that has taken off (landed or in the air).
fn flown_segment(db: &FlightDb, r: &Reservation) -> Option<String> {
    segment_with(db, r, |d| {
        matches!(d, FlightDate::Landed { .. } | FlightDate::Flying { .. })
    })
}

/// The call's flights are not the reservation's (as sets of number and date).
fn flights_differ(r: &Reservation, new: &[FlightRef]) -> bool {
    let old: BTreeSet<(&str, &str)> = r
        .flights
        .iter()
        .map(|f| (f.flight_number.as_str(), f.date.as_str()))
        .collect();
    let new: BTreeSet<(&str, &str)> = new
        .iter()
        .map(|f| (f.flight_number.as_str(), f.date.as_str()))
        .collect();
    old != new
}

/// Hours from an ISO `YYYY-MM-DDTHH:MM:SS` time to the policy's now.
fn hours_before_now(t: &str) -> Option<f64> {
    Some((seconds(super::tools::NOW)? - seconds(t)?) as f64 / 3600.0)
}

/// Seconds since 1970-01-01 of an ISO local time (the calendar's days by
/// the civil-from-days count).
fn seconds(t: &str) -> Option<i64> {
    let num = |a: usize, b: usize| t.get(a..b)?.parse::<i64>().ok();
    let (y, m, d) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (hh, mm, ss) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hh * 3600 + mm * 60 + ss)
}

fn membership_name(m: Membership) -> &'static str {
    match m {
        Membership::Regular => "regular",
        Membership::Silver => "silver",
        Membership::Gold => "gold",
    }
}

fn flight_type_name(t: FlightType) -> &'static str {
    match t {
        FlightType::OneWay => "one_way",
        FlightType::RoundTrip => "round_trip",
    }
}

fn kind_name(k: PaymentKind) -> &'static str {
    match k {
        PaymentKind::CreditCard => "credit card",
        PaymentKind::GiftCard => "gift card",
        PaymentKind::Certificate => "certificate",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_counts_hours() {
        assert_eq!(hours_before_now("2024-05-14T15:00:00"), Some(24.0));
        assert_eq!(hours_before_now("2024-04-30T15:00:00"), Some(15.0 * 24.0));
        assert_eq!(hours_before_now("garbage"), None);
    }

    #[test]
    fn affirmations() {
        for yes in [
            "Yes",
            "yes, please proceed.",
            "Sure, go ahead",
            "Confirmed!",
            "OK",
            "No problem, go ahead",
            "Wait — yes",
            "Yes, I don't need insurance",
        ] {
            assert!(affirms(yes), "{yes}");
        }
        for no in [
            "No, wait.",
            "Not yet, yes I will think",
            "What is the price?",
            "don't, yes",
            "[policy check] get the user's yes",
            "Yes. Actually, no.",
            "Sure, if it is refundable",
        ] {
            assert!(!affirms(no), "{no}");
        }
    }

    #[test]
    fn reasons_are_read_from_words_and_phrases_and_not_negated() {
        let r = RuleSet::reference();
        for (said, reason) in [
            ("i'm not feeling well, so i can't fly", Some("health")),
            ("i came down with the flu", Some("health")),
            ("my doctor says i should not travel", Some("health")),
            ("there is a snowstorm at my destination", Some("weather")),
            ("i'm not sick, i just changed my plans", None),
            ("i'm feeling well, my plans changed", None),
            ("no storm, just a change of plans", None),
        ] {
            assert_eq!(r.covered_reason(said), reason, "{said}");
        }
    }

    #[test]
    fn clauses_split_at_punctuation_and_dashes() {
        assert_eq!(
            clauses("Yes. Actually, no - wait—ok"),
            [
                vec!["yes"],
                vec!["actually"],
                vec!["no"],
                vec!["wait"],
                vec!["ok"]
            ]
        );
    }
}
