//! Receipt extraction: the booking lines of a reply (paper §3.2, §4.2, A.1).
//!
//! A booking is a `ref <completion code>/<work order>` line (text protocol)
//! or an `ACTION {"tool": …, "work_order": …}` line (tool protocol). The
//! extraction tolerates markdown (bold, italics, code spans and fences,
//! quotes, bullets, numbering), surrounding punctuation and case. Whether a
//! booking executes anything is decided elsewhere: only a booking carrying
//! the current turn's work order can; a stale one is a re-display.

use std::sync::OnceLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

use super::episode::Protocol;

/// One booking line found in a reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefLine {
    /// Normalized completion code (`RC-1234`) for text bookings, empty for tool bookings.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub code: String,
    /// Tool name for tool bookings, empty for text bookings.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tool: String,
    /// Normalized work order (`#W1234`).
    pub work_order: String,
    /// The booking as canonical text, e.g. `ref RC-1234/#W5678`.
    pub line: String,
    /// Zero-based line number in the reply.
    pub line_no: usize,
}

/// Markdown decoration stripped before matching.
fn strip_markdown(line: &str) -> String {
    line.chars()
        .filter(|c| !matches!(c, '*' | '_' | '`' | '~'))
        .collect()
}

fn ref_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        // `ref`, then up to a few separator characters (":", quotes, brackets),
        // the code `RC-dddd` (any dash), a slash and the work order `#Wdddd`.
        Regex::new(
            r#"(?i)\bref\b[\s:=\-"'(\[]{0,4}rc\s*[-‐‑–—]?\s*(\d{4})\s*/\s*#?\s*w\s*[-]?\s*(\d{4})\b"#,
        )
        .expect("static regex")
    })
}

fn action_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| Regex::new(r"(?i)\baction\b\s*:?\s*(\{[^{}]*\})").expect("static regex"))
}

/// All `ref` bookings in a reply, in order.
pub fn extract_refs(reply: &str) -> Vec<RefLine> {
    let mut out = Vec::new();
    for (line_no, raw) in reply.lines().enumerate() {
        let line = strip_markdown(raw);
        for cap in ref_regex().captures_iter(&line) {
            let code = format!("RC-{}", &cap[1]);
            let work_order = format!("#W{}", &cap[2]);
            out.push(RefLine {
                line: format!("ref {code}/{work_order}"),
                code,
                tool: String::new(),
                work_order,
                line_no,
            });
        }
    }
    out
}

/// All `ACTION {…}` bookings in a reply, in order; lines whose JSON does not parse are skipped.
pub fn extract_actions(reply: &str) -> Vec<RefLine> {
    let mut out = Vec::new();
    for (line_no, raw) in reply.lines().enumerate() {
        let line: String = raw.chars().filter(|c| !matches!(c, '`' | '*')).collect();
        for cap in action_regex().captures_iter(&line) {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&cap[1]) else {
                continue;
            };
            let tool = v.get("tool").and_then(|t| t.as_str()).unwrap_or("").trim();
            let wo = v
                .get("work_order")
                .and_then(|t| t.as_str())
                .unwrap_or("")
                .trim();
            let digits: String = wo.chars().filter(|c| c.is_ascii_digit()).collect();
            if tool.is_empty() || digits.len() != 4 {
                continue;
            }
            let work_order = format!("#W{digits}");
            out.push(RefLine {
                code: String::new(),
                tool: tool.to_string(),
                line: format!("ACTION {{\"tool\": \"{tool}\", \"work_order\": \"{work_order}\"}}"),
                work_order,
                line_no,
            });
        }
    }
    out
}

/// The bookings of a reply's text under a protocol (native tool calls
/// arrive as calls, not text: see `harness`).
pub fn extract(protocol: Protocol, reply: &str) -> Vec<RefLine> {
    match protocol {
        Protocol::Text => extract_refs(reply),
        Protocol::Tool => extract_actions(reply),
        Protocol::Native => Vec::new(),
    }
}

/// One `LEDGER <code> <STATUS>` line of the self-ledger arm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerLine {
    /// Normalized completion code.
    pub code: String,
    /// DONE, CANCELLED or TODO.
    pub status: String,
}

/// All ledger lines in a reply.
pub fn extract_ledger(reply: &str) -> Vec<LedgerLine> {
    static RE: OnceLock<Regex> = OnceLock::new();
    let re = RE.get_or_init(|| {
        Regex::new(r"(?i)\bledger\b[\s:]*rc\s*-?\s*(\d{4})[\s:]*\b(done|cancelled|canceled|todo)\b")
            .expect("static regex")
    });
    reply
        .lines()
        .flat_map(|raw| {
            let line = strip_markdown(raw);
            re.captures_iter(&line)
                .map(|c| LedgerLine {
                    code: format!("RC-{}", &c[1]),
                    status: match c[2].to_ascii_uppercase().as_str() {
                        "CANCELED" => "CANCELLED".to_string(),
                        s => s.to_string(),
                    },
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The payload-format matrix (A.1): each reply must yield exactly the booking `ref RC-4808/#W1941`.
    const FORMATS: &[(&str, &str)] = &[
        ("plain", "ref RC-4808/#W1941"),
        ("sentence", "Booked the order. ref RC-4808/#W1941"),
        ("bold", "**ref RC-4808/#W1941**"),
        ("bold payload", "ref **RC-4808/#W1941**"),
        ("italic", "_ref RC-4808/#W1941_"),
        ("code span", "`ref RC-4808/#W1941`"),
        ("code fence", "```\nref RC-4808/#W1941\n```"),
        ("quote", "> ref RC-4808/#W1941"),
        ("bullet", "- ref RC-4808/#W1941"),
        ("numbered", "1. ref RC-4808/#W1941"),
        ("trailing period", "ref RC-4808/#W1941."),
        ("single quotes", "'ref RC-4808/#W1941'"),
        ("parenthesised", "(ref RC-4808/#W1941)"),
        ("upper case", "REF RC-4808/#W1941"),
        ("lower case", "ref rc-4808/#w1941"),
        ("colon", "Ref: RC-4808/#W1941"),
        ("spaced slash", "ref RC-4808 / #W1941"),
        ("no hash", "ref RC-4808/W1941"),
        ("unicode dash", "ref RC‑4808/#W1941"),
        ("bold label", "**Ref:** RC-4808/#W1941;"),
    ];

    #[test]
    fn payload_format_matrix() {
        assert!(FORMATS.len() >= 13);
        for (name, reply) in FORMATS {
            let got = extract_refs(reply);
            assert_eq!(got.len(), 1, "{name}: {reply:?} -> {got:?}");
            assert_eq!(got[0].line, "ref RC-4808/#W1941", "{name}");
        }
    }

    #[test]
    fn non_bookings_are_not_extracted() {
        for reply in [
            "The code is RC-4808 and the order #W1941.",
            "reference RC-4808/#W1941",
            "ref RC-480/#W1941",
            "prefer RC-4808/#W1941",
        ] {
            assert!(extract_refs(reply).is_empty(), "{reply:?}");
        }
    }

    #[test]
    fn several_refs_and_line_numbers() {
        let got = extract_refs("first\nref RC-1111/#W2222 and ref RC-3333/#W4444\n");
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].line_no, 1);
        assert_eq!(got[1].code, "RC-3333");
    }

    #[test]
    fn actions() {
        let got = extract_actions(
            "Sure.\nACTION {\"tool\": \"place_equipment_order\", \"work_order\": \"#W1941\"}\n`ACTION {\"tool\":\"x\",\"work_order\":\"W12\"}`",
        );
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].tool, "place_equipment_order");
        assert_eq!(got[0].work_order, "#W1941");
        assert!(extract_actions("ACTION {not json}").is_empty());
    }

    #[test]
    fn ledger_lines() {
        let got = extract_ledger("done\nLEDGER RC-1234 DONE\n**LEDGER** rc-5555: canceled");
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].code, "RC-5555");
        assert_eq!(got[1].status, "CANCELLED");
    }
}
