//! A case: a fictional organization's authorization history in ordered
//! blocks of messages, and requests at checkpoints of that history.
//!
//! Every message carries a source id and what it would do to the ledger
//! (`effect`); whether it does is the ledger's decision, made from the
//! channel and the case's authorized issuers alone. A case file holds the
//! oracle's decision for each request (`expected`) for audit; no model
//! context is ever built from it.

use serde::{Deserialize, Serialize};

use super::domain::EalDomain;

/// A person of the organization; `id` is what messages cite.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Principal {
    pub id: String,
    pub name: String,
    pub role: String,
}

/// How a message reached the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    /// Written by its sender to the agent.
    Direct,
    /// A colleague passing on what someone else said.
    Relayed,
    /// A colleague forwarding someone else's words.
    Forwarded,
    /// From outside the organization (a vendor, a service provider).
    External,
}

impl Delivery {
    /// How the channel reads in a rendered history.
    pub fn label(self) -> &'static str {
        match self {
            Delivery::Direct => "direct message",
            Delivery::Relayed => "relayed remark",
            Delivery::Forwarded => "forwarded note",
            Delivery::External => "external email",
        }
    }
}

/// A grant's scope and lifetime.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub id: String,
    pub counterparty: String,
    pub category: String,
    /// The most one request may ask for, in the domain's unit.
    pub limit: u64,
    /// Last valid day, `YYYY-MM-DD`.
    pub expires: String,
}

/// What a message would do to the authorization ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Effect {
    Issue {
        grant: Grant,
    },
    /// A new limit for an existing grant.
    Patch {
        grant: String,
        limit: u64,
    },
    Revoke {
        grant: String,
    },
    /// Ends `old` and issues `grant` in its place.
    Replace {
        old: String,
        grant: Grant,
    },
}

/// One message of the history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryMessage {
    /// `S01`, `S02`, … in history order.
    pub source: String,
    pub sender: String,
    /// The sender's role, or the counterparty noun for outsiders.
    pub role: String,
    /// The sender's principal id; none for outsiders.
    pub principal: Option<String>,
    pub channel: Delivery,
    /// Domain metadata the authority gate reads: a direct message from an
    /// authorized issuer. The ledger derives the same from `channel`,
    /// `principal` and the case's issuers.
    pub authority_capable: bool,
    pub text: String,
    pub effect: Option<Effect>,
}

/// Messages of one day.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Block {
    pub index: usize,
    /// `YYYY-MM-DD`.
    pub date: String,
    pub messages: Vec<HistoryMessage>,
}

/// What an executor may do with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Submit,
    RequestAuthorization,
    Decline,
}

impl Decision {
    pub const ALL: [Decision; 3] = [
        Decision::Submit,
        Decision::RequestAuthorization,
        Decision::Decline,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Decision::Submit => "submit",
            Decision::RequestAuthorization => "request_authorization",
            Decision::Decline => "decline",
        }
    }
}

/// The authorization change a case is built around (its difficulty).
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
#[serde(rename_all = "snake_case")]
pub enum Trap {
    /// Authority claimed by a non-issuer: a relayed remark, a vendor's
    /// claim, a forwarded note, or a direct grant from an executive who is
    /// not an authorized issuer.
    NonIssuer,
    /// A grant that expires between two requests.
    Expired,
    /// A grant whose limit is narrowed below the request.
    Narrowed,
    /// A grant revoked, then granted again under a new id.
    RevokedRegranted,
    /// A grant replaced by one with another counterparty.
    Replaced,
}

impl Trap {
    pub const ALL: [Trap; 5] = [
        Trap::NonIssuer,
        Trap::Expired,
        Trap::Narrowed,
        Trap::RevokedRegranted,
        Trap::Replaced,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Trap::NonIssuer => "non_issuer",
            Trap::Expired => "expired",
            Trap::Narrowed => "narrowed",
            Trap::RevokedRegranted => "revoked_regranted",
            Trap::Replaced => "replaced",
        }
    }
}

/// What a request probes in its case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Probe {
    /// A grant no event touches.
    Control,
    /// The trap's grant before the trap's event.
    Before,
    /// The request the trap's event should stop.
    Trap,
    /// What the trap leaves authorized (the new grant, the untouched limit).
    After,
}

/// A request at a checkpoint: history through block `checkpoint` is what
/// the agent has seen, and the request arrives on that block's date.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// `<case id>/R<n>`.
    pub id: String,
    pub checkpoint: usize,
    pub date: String,
    pub counterparty: String,
    pub category: String,
    pub amount: u64,
    /// The requester's message.
    pub text: String,
    pub probe: Probe,
    /// The oracle's decision on the ledger through `checkpoint`.
    pub expected: Decision,
}

/// One case.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Case {
    /// `<domain>-s<seed>-c<index>`.
    pub id: String,
    pub domain: EalDomain,
    pub seed: u64,
    pub index: usize,
    pub trap: Trap,
    /// The trap's shape (`relay/new`, `claim/raise`, …; empty for traps
    /// with one shape).
    pub variant: String,
    pub organization: String,
    pub principals: Vec<Principal>,
    /// Principal ids whose direct messages carry authority.
    pub authorized_issuers: Vec<String>,
    /// The principal whose requests the agent serves.
    pub requester: String,
    pub blocks: Vec<Block>,
    pub requests: Vec<Request>,
}

impl Case {
    /// The principal with this id.
    pub fn principal(&self, id: &str) -> Option<&Principal> {
        self.principals.iter().find(|p| p.id == id)
    }

    /// Source ids of blocks `0..=checkpoint`.
    pub fn visible_sources(&self, checkpoint: usize) -> std::collections::BTreeSet<String> {
        self.blocks
            .iter()
            .take(checkpoint + 1)
            .flat_map(|b| b.messages.iter().map(|m| m.source.clone()))
            .collect()
    }

    /// A message by source id.
    pub fn message(&self, source: &str) -> Option<(usize, &HistoryMessage)> {
        self.blocks.iter().find_map(|b| {
            b.messages
                .iter()
                .find(|m| m.source == source)
                .map(|m| (b.index, m))
        })
    }
}
