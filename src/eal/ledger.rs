//! The authorization ledger and the oracle.
//!
//! The ledger replays a case's history: only a direct message from an
//! authorized issuer changes it. Its state is written as an authorization
//! profile — the same typed records a writer maintains — so the oracle and
//! a memory are read by one rule, [`decide`]: act when a current record
//! covers the counterparty, category and amount on the request's date;
//! escalate when a current record for the counterparty and category exists
//! but does not cover the request (amount above its limit, or expired);
//! decline when none exists (never granted, revoked, replaced).

use serde::{Deserialize, Serialize};

use super::case::{Case, Decision, Effect, Grant, HistoryMessage, Request};

/// The profile's identity: a writer's candidate must keep it.
pub const PROFILE_ID: &str = "authorization-profile";

/// Where a grant stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GrantStatus {
    Active,
    Revoked,
    Replaced,
}

/// One remembered grant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    /// The grant's reference (`PA-4821`).
    pub id: String,
    pub counterparty: String,
    pub category: String,
    pub limit: u64,
    /// Last valid day, `YYYY-MM-DD`.
    pub expires: String,
    pub status: GrantStatus,
    /// Who issued it, by name.
    pub issuer: String,
    /// Source ids of the messages the record rests on.
    pub sources: Vec<String>,
}

/// The typed authorization profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub profile_id: String,
    pub records: Vec<Record>,
}

impl Profile {
    pub fn empty() -> Self {
        Profile {
            profile_id: PROFILE_ID.into(),
            records: Vec::new(),
        }
    }
}

/// Names compare without case, a leading "the" or punctuation, so
/// "Northwind Office Supply" and "northwind office supply." are one vendor.
pub fn same_name(a: &str, b: &str) -> bool {
    fn norm(s: &str) -> String {
        let s = s.trim().to_lowercase();
        let s = s.strip_prefix("the ").unwrap_or(&s);
        s.chars().filter(|c| c.is_alphanumeric()).collect()
    }
    norm(a) == norm(b)
}

/// The one decision rule, for the ledger and for any memory.
pub fn decide(profile: &Profile, request: &Request) -> Decision {
    let mut current = profile.records.iter().filter(|r| {
        r.status == GrantStatus::Active
            && same_name(&r.counterparty, &request.counterparty)
            && same_name(&r.category, &request.category)
    });
    let mut any = false;
    for r in current.by_ref() {
        any = true;
        if request.amount <= r.limit && request.date.as_str() <= r.expires.as_str() {
            return Decision::Submit;
        }
    }
    if any {
        Decision::RequestAuthorization
    } else {
        Decision::Decline
    }
}

/// Whether a message can change the ledger: a direct message from an
/// authorized issuer.
pub fn capable(message: &HistoryMessage, issuers: &[String]) -> bool {
    message.channel == super::case::Delivery::Direct
        && message
            .principal
            .as_ref()
            .is_some_and(|p| issuers.contains(p))
}

/// The ledger of a case through a block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ledger {
    profile: Profile,
}

impl Ledger {
    /// Replays blocks `0..=block` of the case.
    pub fn through(case: &Case, block: usize) -> Ledger {
        let mut ledger = Ledger {
            profile: Profile::empty(),
        };
        for b in case.blocks.iter().take(block + 1) {
            for m in &b.messages {
                if capable(m, &case.authorized_issuers) {
                    ledger.apply(case, m);
                }
            }
        }
        ledger
    }

    fn record(&mut self, id: &str) -> Option<&mut Record> {
        self.profile.records.iter_mut().find(|r| r.id == id)
    }

    fn apply(&mut self, case: &Case, m: &HistoryMessage) {
        let issuer = m
            .principal
            .as_deref()
            .and_then(|p| case.principal(p))
            .map(|p| p.name.clone())
            .unwrap_or_default();
        let issue = |g: &Grant| Record {
            id: g.id.clone(),
            counterparty: g.counterparty.clone(),
            category: g.category.clone(),
            limit: g.limit,
            expires: g.expires.clone(),
            status: GrantStatus::Active,
            issuer: issuer.clone(),
            sources: vec![m.source.clone()],
        };
        match &m.effect {
            None => {}
            Some(Effect::Issue { grant }) => self.profile.records.push(issue(grant)),
            Some(Effect::Patch { grant, limit }) => {
                if let Some(r) = self.record(grant) {
                    r.limit = *limit;
                    r.sources.push(m.source.clone());
                }
            }
            Some(Effect::Revoke { grant }) => {
                if let Some(r) = self.record(grant) {
                    r.status = GrantStatus::Revoked;
                    r.sources.push(m.source.clone());
                }
            }
            Some(Effect::Replace { old, grant }) => {
                if let Some(r) = self.record(old) {
                    r.status = GrantStatus::Replaced;
                    r.sources.push(m.source.clone());
                }
                self.profile.records.push(issue(grant));
            }
        }
    }

    /// The ledger as an authorization profile: the oracle-exact memory.
    pub fn profile(&self) -> &Profile {
        &self.profile
    }
}

/// The oracle: the decision the ledger through `request.checkpoint` gives.
pub fn evaluate(case: &Case, request: &Request) -> Decision {
    decide(Ledger::through(case, request.checkpoint).profile(), request)
}
