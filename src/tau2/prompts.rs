//! Every string of statebench's own that the airline study sends to a model:
//! the frames around the policy (for the agent, and for the compiler that
//! turns it into a rule set) and around the simulator's guidelines and
//! scenario, and the texts the arms put in the agent's turn. The policy,
//! the guidelines and the scenarios themselves are the user's data, read at
//! run time.

use super::rules::Violation;
use super::task::UserScenario;

/// The agent's first message, before the user says anything. τ² opens every
/// conversation with this fixed text, so the simulator's first reply
/// answers the same words on every run; it is protocol, not ours to word.
pub const GREETING: &str = "Hi! How can I help you today?";

/// The user simulator's end-of-conversation tokens, as the guidelines name
/// them.
pub const STOP: &str = "###STOP###";
pub const TRANSFER: &str = "###TRANSFER###";
pub const OUT_OF_SCOPE: &str = "###OUT-OF-SCOPE###";

/// A placeholder some guideline files carry for runtime persona text;
/// statebench adds none, so it is removed.
const PERSONA_SLOT: &str = "<PERSONA_GUIDELINES>";

/// The agent's system prompt: our instructions, then the airline policy.
pub fn agent_system(policy: &str) -> String {
    format!(
        "You work as a customer service agent for an airline. Serve the customer \
         under the policy given below.\n\
         Each of your turns does exactly one of two things: write a message to the \
         customer, or make tool calls. Do not mix the two in one turn.\n\
         Stay within the policy at all times, and give tool arguments as valid JSON.\n\
         \n\
         <policy>\n{}\n</policy>",
        policy.trim_end()
    )
}

/// The user simulator's system prompt: the guidelines as the data directory
/// gives them, then the task's scenario.
pub fn user_system(guidelines: &str, scenario: &UserScenario) -> String {
    format!(
        "{}\n\n<scenario>\n{}\n</scenario>",
        without_persona(guidelines).trim_end(),
        scenario_text(scenario)
    )
}

/// The guidelines with their persona slot empty.
pub fn without_persona(guidelines: &str) -> String {
    guidelines.replace(PERSONA_SLOT, "")
}

/// A scenario as the simulator reads it: each field the task gives, under
/// its name, indented one tab.
pub fn scenario_text(s: &UserScenario) -> String {
    let mut parts = Vec::new();
    if let Some(p) = &s.persona {
        parts.push(section("Persona", p));
    }
    parts.push(section("Reason for call", &s.reason_for_call));
    if let Some(k) = &s.known_info {
        parts.push(section("Known info", k));
    }
    if let Some(u) = &s.unknown_info {
        parts.push(section("Unknown info", u));
    }
    parts.push(section("Task instructions", &s.task_instructions));
    parts.join("\n")
}

fn section(title: &str, body: &str) -> String {
    let indented: Vec<String> = body
        .lines()
        .map(|l| {
            if l.trim().is_empty() {
                String::new()
            } else {
                format!("\t{l}")
            }
        })
        .collect();
    format!("{title}:\n{}", indented.join("\n"))
}

/// The `shown` arm's block, placed after the conversation in each agent
/// turn: the rule set's verdicts for the state as it is now (they open with
/// their own header).
pub fn shown(verdicts: &str) -> String {
    format!(
        "{}\n(Recomputed from the current records before each of your turns.)",
        verdicts.trim_end()
    )
}

fn named(violations: &[Violation]) -> String {
    violations
        .iter()
        .map(|v| format!("{} ({})", v.rule.name(), v.reason))
        .collect::<Vec<_>>()
        .join("; ")
}

/// How the `notice` and `gate` arms' results open: a tool result opening
/// so is a write that did not run.
const NOTICE_HEAD: &str = "NOTICE: ";
const GATE_HEAD: &str = "REJECTED: ";

/// Whether a tool result is an arm's refusal (the call did not run). No
/// tool's own result opens so: they are JSON, plain values or `Error: …`.
pub fn held(result: &str) -> bool {
    result.starts_with(NOTICE_HEAD) || result.starts_with(GATE_HEAD)
}

/// The `notice` arm's result for a write the rules refuse: it did not run,
/// and the same call again will.
pub fn notice(tool: &str, violations: &[Violation]) -> String {
    format!(
        "{NOTICE_HEAD}{tool} was NOT executed. The policy rules flag it: {}. \
         Nothing was changed. If you are certain the action is allowed, make \
         the same call again with identical arguments and it will be executed.",
        named(violations)
    )
}

/// The `gate` arm's result for a write the rules refuse.
pub fn gate(tool: &str, violations: &[Violation]) -> String {
    format!(
        "{GATE_HEAD}{tool} was NOT executed because it breaks the policy: {}. \
         Nothing was changed.",
        named(violations)
    )
}

/// The result of a call whose arguments are not a JSON object (τ²'s error
/// form: the text of a failed call starts with `Error: `).
pub fn malformed_arguments(tool: &str, why: &str) -> String {
    format!("Error: the arguments of {tool} are not a JSON object ({why})")
}

/// The compile request's instructions; the policy follows them.
pub const COMPILE_HEAD: &str = "\
You turn an airline's customer-service policy into rule parameters that a \
program checks before the service agent's tools change any booking.

Read the policy below. Answer with one JSON object that has exactly these \
fields and nothing else (no comments, no extra fields). Take every value \
from the policy's text; where the policy says nothing about a field, use \
the value that means \"not allowed\" (false, 0, or an empty list).

Fields:
- confirm_before: list of write tools that need the user's explicit yes \
before they run, from: book_reservation, cancel_reservation, \
update_reservation_baggages, update_reservation_flights, \
update_reservation_passengers, send_certificate
- cancel_window_hours: integer, hours after booking within which any \
reservation may be cancelled
- cancel_if_airline_cancelled: boolean, a flight cancelled by the airline \
makes its reservation cancellable
- cancel_cabins: list of cabins (basic_economy, economy, business) whose \
reservations may always be cancelled
- cancel_memberships: list of memberships (regular, silver, gold) whose \
reservations may always be cancelled
- insurance_reasons: list of short lowercase words, the reasons for \
cancelling that travel insurance covers
- cancel_after_flown: boolean, a reservation with a segment already flown \
may be cancelled
- basic_economy_flight_change: boolean, basic economy reservations may \
change their flights
- change_keeps_route: boolean, a flight change must keep origin, \
destination and trip type
- cabin_change_after_flown: boolean, the cabin may change after a segment \
has flown
- free_bags: object with keys regular, silver, gold; each an object with \
keys basic_economy, economy, business: free checked bags per passenger
- bag_price: integer dollars per checked bag beyond the free ones
- bags_removable: boolean, checked bags may be removed from a reservation
- max_passengers: integer, most passengers on one reservation
- passenger_count_changeable: boolean, a reservation's number of \
passengers may change
- max_certificates, max_credit_cards, max_gift_cards: integers, most \
payment methods of each kind on one booking
- change_payment_kinds: list of payment kinds (credit_card, gift_card, \
certificate) that may pay for a flight change
- compensation_memberships: list of memberships that make a user eligible \
for compensation
- compensation_if_insured: boolean, travel insurance makes the user \
eligible for compensation
- compensation_cabins: list of cabins whose passengers are eligible for \
compensation
- certificate_per_passenger_cancelled: integer dollars per passenger of the \
certificate for a cancelled flight
- certificate_per_passenger_delayed: integer dollars per passenger of the \
certificate for a delayed flight
- delay_certificate_after_change: boolean, the delay certificate is given \
only after the reservation was changed or cancelled

The policy:

";

/// The matcher's instructions when the rule arms' receipts are read by a
/// model (`--receipts model`): it reports what the customer said, and the
/// rules decide.
pub const READER_SYSTEM: &str = "\
You read part of a conversation between an airline's customer-service agent \
and a customer, and report exactly what the customer said. You do not judge \
the airline's policy and you do not help either side. Answer with one JSON \
object and nothing else.";

/// Most characters of one quoted message in a matcher's prompt, and of all
/// the customer's messages together: a reading is a short request whatever
/// the conversation holds.
pub const READ_QUOTE_CAP: usize = 1_500;
pub const READ_CUSTOMER_CAP: usize = 6_000;

/// A message as the matcher quotes it: its first [`READ_QUOTE_CAP`]
/// characters.
fn quoted(text: &str) -> String {
    let t = text.trim();
    match t.char_indices().nth(READ_QUOTE_CAP) {
        Some((i, _)) => format!("{} […]", &t[..i]),
        None => t.to_string(),
    }
}

/// What a customer's reply to "shall I go ahead?" can be, as the matcher
/// classifies it; only the first confirms. Kinds rather than a yes/no: a
/// small model tells a conditional or hedged yes from a plain one more
/// reliably when it must name which it is.
pub const REPLY_KINDS: [(&str, &str); 6] = [
    (
        "yes",
        "a plain yes to this action, with no condition, change or doubt",
    ),
    (
        "yes_with_conditions",
        "a yes that adds a condition or asks for a change",
    ),
    ("unsure", "hesitant, hedged, or wants to wait or think"),
    ("no", "refuses, or takes back a yes"),
    ("question", "asks something instead of answering"),
    ("other", "anything else"),
];

/// The matcher's request for one proposed write: the action and its
/// details, then what it must read — the agent's last message and the
/// customer's answer (`exchange`), and for a reason the customer's
/// messages, latest kept first — and the fields it answers with.
pub fn reading(
    action: &str,
    details: &[String],
    exchange: Option<(&str, &str)>,
    reasons: Option<(&[String], &[&str])>,
) -> String {
    let mut out = format!(
        "The agent is about to run this action: {action}. Its details: {}.\n",
        details.join(", ")
    );
    if let Some((asked, answer)) = exchange {
        out.push_str(&format!(
            "\nThe agent's last message to the customer:\n<agent>\n{}\n</agent>\n\
             \nThe customer's reply to it:\n<customer>\n{}\n</customer>\n",
            quoted(asked),
            quoted(answer)
        ));
    }
    if let Some((_, said)) = reasons {
        let mut kept = Vec::new();
        let mut used = 0;
        for m in said.iter().rev() {
            let q = quoted(m);
            if used + q.len() > READ_CUSTOMER_CAP && !kept.is_empty() {
                break;
            }
            used += q.len();
            kept.push(q);
        }
        let left = said.len() - kept.len();
        kept.reverse();
        out.push_str(&format!(
            "\nEverything the customer said in the conversation{}:\n<customer_messages>\n{}\n</customer_messages>\n",
            if left > 0 {
                format!(" (the first {left} messages left out)")
            } else {
                String::new()
            },
            kept.join("\n---\n")
        ));
    }
    out.push_str("\nAnswer with one JSON object with these fields:\n");
    if exchange.is_some() {
        out.push_str(&format!(
            "- \"agent_listed_this_action\": true if the agent's message described this \
             action with these details and asked the customer whether to go ahead.\n\
             - \"customer_reply\": what the customer's reply is, one of: {}.\n",
            REPLY_KINDS
                .iter()
                .map(|(k, what)| format!("\"{k}\" ({what})"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if let Some((names, _)) = reasons {
        out.push_str(&format!(
            "- \"reason\": the reason for cancelling the customer stated as theirs: \
             \"none\" (they stated none of these, or denied it), {}.\n",
            names
                .iter()
                .map(|n| format!("\"{n}\""))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    out
}
