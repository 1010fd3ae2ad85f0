//! The event-sourcing writer's deltas and their deterministic reducer.
//!
//! The model proposes lifecycle events for a block; software checks their
//! structure (at most [`MAX_EVENTS`], every event citing visible sources,
//! every target present) and applies them, in order, to a clone of the
//! current state. A batch that fails anywhere changes nothing. Structural
//! acceptance says nothing about whether the events are what the messages
//! meant: that is measured, against the ledger, like any memory.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::case::{Case, Effect, Grant};
use super::ledger::{capable, GrantStatus, Profile, Record};
use super::profile::{framed, is_date};

/// Most events one block may add.
pub const MAX_EVENTS: usize = 32;

/// A grant as an issue or replace event states it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewGrant {
    pub id: String,
    pub counterparty: String,
    pub category: String,
    pub limit: u64,
    pub expires: String,
    pub issuer: String,
}

/// One lifecycle delta.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Event {
    Issue {
        grant: NewGrant,
        sources: Vec<String>,
    },
    /// A new limit (and, when given, a new expiry) for a grant.
    Patch {
        id: String,
        limit: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expires: Option<String>,
        sources: Vec<String>,
    },
    Revoke {
        id: String,
        sources: Vec<String>,
    },
    Replace {
        old: String,
        grant: NewGrant,
        sources: Vec<String>,
    },
}

impl Event {
    fn sources(&self) -> &[String] {
        match self {
            Event::Issue { sources, .. }
            | Event::Patch { sources, .. }
            | Event::Revoke { sources, .. }
            | Event::Replace { sources, .. } => sources,
        }
    }
}

/// A writer's reply: `{"events": [...]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Batch {
    pub events: Vec<Event>,
}

fn record(g: &NewGrant, sources: &[String]) -> Record {
    Record {
        id: g.id.clone(),
        counterparty: g.counterparty.clone(),
        category: g.category.clone(),
        limit: g.limit,
        expires: g.expires.clone(),
        status: GrantStatus::Active,
        issuer: g.issuer.clone(),
        sources: sources.to_vec(),
    }
}

/// Why a batch was refused; it then changes nothing. Events count from 1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("{events} events; at most {MAX_EVENTS} a block")]
    TooMany { events: usize },
    #[error("event {event} cites no source")]
    Uncited { event: usize },
    #[error("event {event} cites {source_id}, which has not been seen")]
    Unseen { event: usize, source_id: String },
    #[error("event {event} names {id}, which the state does not hold")]
    Missing { event: usize, id: String },
    #[error("event {event}: expires \"{expires}\" is not YYYY-MM-DD")]
    Expires { event: usize, expires: String },
    #[error("event {event} issues {id}, which exists")]
    Exists { event: usize, id: String },
}

impl BatchError {
    /// The error whose message `text` is, if it is one (see
    /// [`super::writer::Failure`]).
    pub fn parse(text: &str) -> Option<BatchError> {
        if let Some(n) = text.strip_suffix(&format!(" events; at most {MAX_EVENTS} a block")) {
            return Some(BatchError::TooMany {
                events: n.parse().ok()?,
            });
        }
        let rest = text.strip_prefix("event ")?;
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let event = rest[..digits].parse().ok()?;
        let rest = &rest[digits..];
        if rest == " cites no source" {
            return Some(BatchError::Uncited { event });
        }
        let between = |prefix, suffix| framed(rest, prefix, suffix).map(str::to_string);
        if let Some(source_id) = between(" cites ", ", which has not been seen") {
            return Some(BatchError::Unseen { event, source_id });
        }
        if let Some(id) = between(" names ", ", which the state does not hold") {
            return Some(BatchError::Missing { event, id });
        }
        if let Some(expires) = between(": expires \"", "\" is not YYYY-MM-DD") {
            return Some(BatchError::Expires { event, expires });
        }
        let id = between(" issues ", ", which exists")?;
        Some(BatchError::Exists { event, id })
    }
}

/// Applies a batch to a clone of `state`, or says which event failed.
pub fn reduce(
    state: &Profile,
    batch: &Batch,
    visible: &BTreeSet<String>,
) -> Result<Profile, BatchError> {
    if batch.events.len() > MAX_EVENTS {
        return Err(BatchError::TooMany {
            events: batch.events.len(),
        });
    }
    let mut next = state.clone();
    for (i, e) in batch.events.iter().enumerate() {
        let event = i + 1;
        if e.sources().is_empty() {
            return Err(BatchError::Uncited { event });
        }
        if let Some(s) = e.sources().iter().find(|s| !visible.contains(*s)) {
            return Err(BatchError::Unseen {
                event,
                source_id: s.clone(),
            });
        }
        let target = |next: &mut Profile, id: &str| {
            next.records
                .iter_mut()
                .position(|r| r.id == id)
                .ok_or_else(|| BatchError::Missing {
                    event,
                    id: id.to_string(),
                })
        };
        let expires = match e {
            Event::Issue { grant, .. } | Event::Replace { grant, .. } => Some(&grant.expires),
            Event::Patch { expires, .. } => expires.as_ref(),
            Event::Revoke { .. } => None,
        };
        if let Some(x) = expires.filter(|x| !is_date(x)) {
            return Err(BatchError::Expires {
                event,
                expires: x.clone(),
            });
        }
        let exists = |id: &str| BatchError::Exists {
            event,
            id: id.to_string(),
        };
        match e {
            Event::Issue { grant, sources } => {
                if next.records.iter().any(|r| r.id == grant.id) {
                    return Err(exists(&grant.id));
                }
                next.records.push(record(grant, sources));
            }
            Event::Patch {
                id,
                limit,
                expires,
                sources,
            } => {
                let i = target(&mut next, id)?;
                let r = &mut next.records[i];
                r.limit = *limit;
                if let Some(x) = expires {
                    r.expires = x.clone();
                }
                r.sources.extend(sources.iter().cloned());
            }
            Event::Revoke { id, sources } => {
                let i = target(&mut next, id)?;
                next.records[i].status = GrantStatus::Revoked;
                next.records[i].sources.extend(sources.iter().cloned());
            }
            Event::Replace {
                old,
                grant,
                sources,
            } => {
                let i = target(&mut next, old)?;
                next.records[i].status = GrantStatus::Replaced;
                next.records[i].sources.extend(sources.iter().cloned());
                if next.records.iter().any(|r| r.id == grant.id) {
                    return Err(exists(&grant.id));
                }
                next.records.push(record(grant, sources));
            }
        }
    }
    Ok(next)
}

/// The events the ledger itself would write for a block: the oracle event
/// writer.
pub fn ledger_batch(case: &Case, block: usize) -> Batch {
    let issuer = |p: &Option<String>| {
        p.as_deref()
            .and_then(|p| case.principal(p))
            .map(|p| p.name.clone())
            .unwrap_or_default()
    };
    let grant = |g: &Grant, by: &str| NewGrant {
        id: g.id.clone(),
        counterparty: g.counterparty.clone(),
        category: g.category.clone(),
        limit: g.limit,
        expires: g.expires.clone(),
        issuer: by.to_string(),
    };
    let events = case.blocks[block]
        .messages
        .iter()
        .filter(|m| capable(m, &case.authorized_issuers))
        .filter_map(|m| {
            let sources = vec![m.source.clone()];
            let by = issuer(&m.principal);
            Some(match m.effect.as_ref()? {
                Effect::Issue { grant: g } => Event::Issue {
                    grant: grant(g, &by),
                    sources,
                },
                Effect::Patch { grant, limit } => Event::Patch {
                    id: grant.clone(),
                    limit: *limit,
                    expires: None,
                    sources,
                },
                Effect::Revoke { grant } => Event::Revoke {
                    id: grant.clone(),
                    sources,
                },
                Effect::Replace { old, grant: g } => Event::Replace {
                    old: old.clone(),
                    grant: grant(g, &by),
                    sources,
                },
            })
        })
        .collect();
    Batch { events }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eal::generator::generate;
    use crate::eal::ledger::Ledger;
    use crate::eal::EalDomain;

    /// The ledger's own events, reduced block by block, give the ledger.
    #[test]
    fn reducing_the_ledgers_events_gives_the_ledger() {
        for d in EalDomain::ALL {
            for case in generate(d, 9, 10, &[]) {
                let mut state = Profile::empty();
                for b in 0..case.blocks.len() {
                    let visible = case.visible_sources(b);
                    state = reduce(&state, &ledger_batch(&case, b), &visible).expect("valid");
                    assert_eq!(&state, Ledger::through(&case, b).profile(), "{}", case.id);
                }
            }
        }
    }

    #[test]
    fn a_bad_event_rejects_the_whole_batch() {
        let case = &generate(EalDomain::Procurement, 9, 1, &[])[0];
        let visible = case.visible_sources(0);
        let state = reduce(&Profile::empty(), &ledger_batch(case, 0), &visible).unwrap();
        let id = state.records[0].id.clone();
        let revoke = |id: &str, s: &str| Event::Revoke {
            id: id.into(),
            sources: vec![s.into()],
        };
        let ok = revoke(&id, "S01");
        for (bad, why) in [
            (
                revoke("PA-0000", "S01"),
                BatchError::Missing {
                    event: 2,
                    id: "PA-0000".into(),
                },
            ),
            (
                revoke(&id, "S99"),
                BatchError::Unseen {
                    event: 2,
                    source_id: "S99".into(),
                },
            ),
            (
                Event::Patch {
                    id: id.clone(),
                    limit: 1,
                    expires: Some("May 31".into()),
                    sources: vec!["S01".into()],
                },
                BatchError::Expires {
                    event: 2,
                    expires: "May 31".into(),
                },
            ),
            (
                Event::Revoke {
                    id: id.clone(),
                    sources: vec![],
                },
                BatchError::Uncited { event: 2 },
            ),
        ] {
            let batch = Batch {
                events: vec![ok.clone(), bad],
            };
            assert_eq!(reduce(&state, &batch, &visible), Err(why));
        }
        let many = Batch {
            events: vec![ok.clone(); MAX_EVENTS + 1],
        };
        assert_eq!(
            reduce(&state, &many, &visible),
            Err(BatchError::TooMany {
                events: MAX_EVENTS + 1
            })
        );
        let after = reduce(&state, &Batch { events: vec![ok] }, &visible).unwrap();
        assert_eq!(after.records[0].status, GrantStatus::Revoked);
        assert_eq!(
            state.records[0].status,
            GrantStatus::Active,
            "the prior state is untouched"
        );
    }
}
