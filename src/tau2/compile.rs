//! The agent's own model compiles the airline policy into a [`RuleSet`]:
//! one request asking for a JSON object of exactly the rule set's fields,
//! its parse, and its agreement with the reference, field by field.
//!
//! Compiles are sampled (temperature [`COMPILE_TEMPERATURE`], the request's
//! seed), so several seeds measure how much the compiled rules vary.

use serde_json::{json, Map, Value};

use super::prompts;
use super::rules::RuleSet;
use super::tools;
use crate::backend::{ChatRequest, Constraint, Message, Role};

/// Reply budgets, as the ladder's compiler has them.
pub const BUDGET_NO_THINK: usize = 3000;
pub const BUDGET_THINK: usize = 6000;

/// Sampling temperature of a compile: above 0 so that seeds differ.
pub const COMPILE_TEMPERATURE: f32 = 0.7;

/// Why a compile reply could not be used (one line, logged).
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error("no JSON object in the reply")]
    NoJson,
    #[error("the reply's JSON is not a rule set: {0}")]
    Shape(#[source] serde_json::Error),
}

/// The compile request on the no-thinking budget, with the rule set's JSON
/// schema as its constraint.
pub fn compile_request(policy: &str, seed: u64) -> ChatRequest {
    compile_request_for(policy, seed, false)
}

/// The compile request for a regime. Thinking replies are not constrained:
/// a constraint binds from the first token and would forbid the thinking
/// block.
pub fn compile_request_for(policy: &str, seed: u64, thinking: bool) -> ChatRequest {
    let prompt = format!("{}{}\n", prompts::COMPILE_HEAD, policy.trim());
    let mut req = ChatRequest::greedy(
        vec![Message::new(Role::User, prompt)],
        if thinking {
            BUDGET_THINK
        } else {
            BUDGET_NO_THINK
        },
    );
    req.thinking = thinking;
    req.temperature = COMPILE_TEMPERATURE;
    req.seed = seed;
    req.constraint = (!thinking).then(|| Constraint::JsonSchema(schema()));
    req
}

/// JSON schema of a [`RuleSet`] (every field required, no others). Lists
/// and numbers are bounded: a small model otherwise repeats list items or
/// digits until its budget runs out, and the reply never closes.
pub fn schema() -> Value {
    let list = |items: &[&str]| json!({"type": "array", "items": {"enum": items}, "maxItems": items.len()});
    let int = json!({"type": "integer", "minimum": 0, "maximum": 100_000});
    let boolean = json!({"type": "boolean"});
    let cabins = ["basic_economy", "economy", "business"];
    let memberships = ["regular", "silver", "gold"];
    let obj = |props: Map<String, Value>| {
        let required: Vec<&String> = props.keys().collect();
        json!({"type": "object", "properties": props, "required": required,
               "additionalProperties": false})
    };
    let cabin_bags = obj(cabins
        .iter()
        .map(|c| (c.to_string(), int.clone()))
        .collect());
    let free_bags = obj(memberships
        .iter()
        .map(|m| (m.to_string(), cabin_bags.clone()))
        .collect());
    let fields: Vec<(&str, Value)> = vec![
        ("confirm_before", list(&tools::WRITES)),
        ("cancel_window_hours", int.clone()),
        ("cancel_if_airline_cancelled", boolean.clone()),
        ("cancel_cabins", list(&cabins)),
        ("cancel_memberships", list(&memberships)),
        (
            "insurance_reasons",
            json!({"type": "array", "maxItems": 8,
                   "items": {"type": "string", "maxLength": 24}}),
        ),
        ("cancel_after_flown", boolean.clone()),
        ("basic_economy_flight_change", boolean.clone()),
        ("change_keeps_route", boolean.clone()),
        ("cabin_change_after_flown", boolean.clone()),
        ("free_bags", free_bags),
        ("bag_price", int.clone()),
        ("bags_removable", boolean.clone()),
        ("max_passengers", int.clone()),
        ("passenger_count_changeable", boolean.clone()),
        ("max_certificates", int.clone()),
        ("max_credit_cards", int.clone()),
        ("max_gift_cards", int.clone()),
        (
            "change_payment_kinds",
            list(&["credit_card", "gift_card", "certificate"]),
        ),
        ("compensation_memberships", list(&memberships)),
        ("compensation_if_insured", boolean.clone()),
        ("compensation_cabins", list(&cabins)),
        ("certificate_per_passenger_cancelled", int.clone()),
        ("certificate_per_passenger_delayed", int.clone()),
        ("delay_certificate_after_change", boolean),
    ];
    obj(fields
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect())
}

/// Reads a compile reply: the first JSON object in it (fenced or not),
/// which must have exactly the rule set's fields.
pub fn parse(reply_text: &str) -> Result<RuleSet, CompileError> {
    let v = crate::backend::first_json_object(reply_text).ok_or(CompileError::NoJson)?;
    serde_json::from_value(v).map_err(CompileError::Shape)
}

/// How far a compiled rule set agrees with the reference: one field per
/// leaf (`free_bags.gold.economy` is one); lists compare as sets, and
/// `insurance_reasons` case-blind.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Agreement {
    pub fields: usize,
    pub agreeing: usize,
    /// Dotted names of the fields that differ, in the rule set's order.
    pub differing: Vec<String>,
}

pub fn agreement(compiled: &RuleSet, reference: &RuleSet) -> Agreement {
    let a: std::collections::BTreeMap<String, Value> = leaves(compiled).into_iter().collect();
    let b = leaves(reference);
    let differing: Vec<String> = b
        .iter()
        .filter(|(k, v)| a.get(k) != Some(v))
        .map(|(k, _)| k.clone())
        .collect();
    Agreement {
        fields: b.len(),
        agreeing: b.len() - differing.len(),
        differing,
    }
}

/// A rule set's leaf fields, lists normalised to sorted sets.
fn leaves(r: &RuleSet) -> Vec<(String, Value)> {
    fn walk(prefix: &str, v: Value, out: &mut Vec<(String, Value)>) {
        match v {
            Value::Object(o) => {
                for (k, x) in o {
                    let name = if prefix.is_empty() {
                        k
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&name, x, out);
                }
            }
            Value::Array(items) => {
                let mut set: Vec<String> = items
                    .iter()
                    .map(|x| x.as_str().map_or(x.to_string(), str::to_lowercase))
                    .collect();
                set.sort();
                set.dedup();
                out.push((prefix.to_string(), json!(set)));
            }
            other => out.push((prefix.to_string(), other)),
        }
    }
    let mut out = Vec::new();
    walk(
        "",
        serde_json::to_value(r).expect("a rule set serializes"),
        &mut out,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_every_field() {
        let s = schema();
        let req: Vec<&str> = s["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let fields: Vec<String> = serde_json::to_value(RuleSet::reference())
            .unwrap()
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        assert_eq!(req, fields);
    }

    /// Every list and number the model writes has an end: a reply that
    /// repeats list items ran out of budget on the default model.
    #[test]
    fn schema_bounds_every_list_and_number() {
        fn walk(v: &Value, path: &str, open: &mut Vec<String>) {
            match v.get("type").and_then(Value::as_str) {
                Some("array") if v.get("maxItems").is_none() => open.push(path.into()),
                Some("integer") if v.get("maximum").is_none() => open.push(path.into()),
                _ => {}
            }
            for key in ["properties", "items"] {
                match v.get(key) {
                    Some(Value::Object(m)) if key == "properties" => {
                        for (k, f) in m {
                            walk(f, &format!("{path}.{k}"), open);
                        }
                    }
                    Some(item) if key == "items" => walk(item, &format!("{path}[]"), open),
                    _ => {}
                }
            }
        }
        let mut open = Vec::new();
        walk(&schema(), "", &mut open);
        assert!(open.is_empty(), "unbounded: {open:?}");
        // The reference itself fits the bounds.
        let reference = serde_json::to_value(RuleSet::reference()).unwrap();
        for (k, v) in reference.as_object().unwrap() {
            if let Some(a) = v.as_array() {
                let max = schema()["properties"][k]["maxItems"].as_u64().unwrap();
                assert!(a.len() as u64 <= max, "{k}");
            }
        }
    }
}
