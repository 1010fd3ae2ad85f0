//! EAL domains: the organization, its people, counterparties, categories,
//! tools and message wordings a case is drawn from.
//!
//! A domain is data: `data/eal/<name>.json`, read once at first use. The
//! three share one shape — a grant names a counterparty, a category, a
//! limit and an expiry — so one generator, one ledger and one scorer serve
//! them all; only names and wordings differ.

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

/// A person of the fictional organization.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Person {
    pub name: String,
    pub role: String,
}

/// One of the executor's three terminal tools.
#[derive(Debug, Clone, Deserialize)]
pub struct ToolText {
    pub name: String,
    pub description: String,
}

/// The executor's tools: act on the request, escalate it, decline it.
#[derive(Debug, Clone, Deserialize)]
pub struct Tools {
    pub act: ToolText,
    pub escalate: ToolText,
    pub decline: ToolText,
}

/// Argument names of the act and escalate tools.
#[derive(Debug, Clone, Deserialize)]
pub struct Arguments {
    pub counterparty: String,
    pub category: String,
    pub amount: String,
}

/// Wordings, each with `{placeholders}` the generator fills.
#[derive(Debug, Clone, Deserialize)]
pub struct Texts {
    pub grant: Vec<String>,
    pub patch: Vec<String>,
    pub revoke: Vec<String>,
    pub replace: Vec<String>,
    /// A colleague passing on what an issuer said (not authority-capable).
    pub relay: Vec<String>,
    /// A counterparty claiming it was approved (not authority-capable).
    pub claim: Vec<String>,
    /// A colleague forwarding an issuer's words (not authority-capable).
    pub forward: Vec<String>,
    pub chatter: Vec<String>,
    pub request: Vec<String>,
}

/// One domain's file.
#[derive(Debug, Clone, Deserialize)]
pub struct DomainFile {
    pub name: String,
    pub organization: String,
    /// Who the executor is, as its system prompt names it.
    pub agent: String,
    pub counterparty_noun: String,
    pub category_noun: String,
    pub amount_noun: String,
    pub amount_prefix: String,
    pub amount_suffix: String,
    pub limit_min: u64,
    pub limit_max: u64,
    pub limit_step: u64,
    /// Grant ids read `<prefix>-<four digits>`.
    pub grant_prefix: String,
    pub arguments: Arguments,
    pub tools: Tools,
    pub issuers: Vec<Person>,
    pub colleagues: Vec<Person>,
    pub requester: Person,
    pub counterparties: Vec<String>,
    pub categories: Vec<String>,
    pub texts: Texts,
}

impl DomainFile {
    /// An amount as the domain writes it (`$12,500`, `40 hosts`).
    pub fn amount(&self, v: u64) -> String {
        format!(
            "{}{}{}",
            self.amount_prefix,
            thousands(v),
            self.amount_suffix
        )
    }
}

/// `12500` → `12,500`.
fn thousands(v: u64) -> String {
    let digits = v.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The EAL domains.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum EalDomain {
    /// Purchase orders against purchasing authorizations.
    Procurement,
    /// Fund transfers against transfer authorizations.
    Finance,
    /// Security operations against operation authorizations.
    Security,
}

const FILES: [(&str, &str); 3] = [
    (
        "procurement",
        include_str!("../../data/eal/procurement.json"),
    ),
    ("finance", include_str!("../../data/eal/finance.json")),
    ("security", include_str!("../../data/eal/security.json")),
];

impl EalDomain {
    pub const ALL: [EalDomain; 3] = [
        EalDomain::Procurement,
        EalDomain::Finance,
        EalDomain::Security,
    ];

    /// The domain's pool, read from its file.
    pub fn file(self) -> &'static DomainFile {
        static POOLS: OnceLock<Vec<DomainFile>> = OnceLock::new();
        &POOLS.get_or_init(|| {
            FILES
                .iter()
                .map(|(name, text)| {
                    // Compiled in and checked by the tests below.
                    serde_json::from_str(text)
                        .unwrap_or_else(|e| panic!("data/eal/{name}.json: {e}"))
                })
                .collect()
        })[self as usize]
    }

    pub fn name(self) -> &'static str {
        FILES[self as usize].0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every pool has room for a case: three issuers and colleagues, six
    /// counterparties and categories at least, wordings for every kind, and
    /// limits a narrowing can halve.
    #[test]
    fn pools_are_complete() {
        for d in EalDomain::ALL {
            let p = d.file();
            assert_eq!(p.name, d.name());
            assert!(
                p.issuers.len() >= 3 && p.colleagues.len() >= 3,
                "{}",
                p.name
            );
            assert!(p.counterparties.len() >= 6 && p.categories.len() >= 4);
            assert!(p.limit_min >= 4 * p.limit_step && p.limit_max > 2 * p.limit_min);
            assert_eq!(p.limit_min % p.limit_step, 0);
            let t = &p.texts;
            for pool in [
                &t.grant, &t.patch, &t.revoke, &t.replace, &t.relay, &t.claim, &t.forward,
                &t.chatter, &t.request,
            ] {
                assert!(!pool.is_empty(), "{}", p.name);
            }
            let mut names = [
                &p.tools.act.name,
                &p.tools.escalate.name,
                &p.tools.decline.name,
            ];
            names.sort();
            assert!(names[0] != names[1] && names[1] != names[2]);
        }
        assert_eq!(EalDomain::Procurement.file().amount(12500), "$12,500");
        assert_eq!(EalDomain::Security.file().amount(40), "40 hosts");
    }
}
