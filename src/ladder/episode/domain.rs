//! Domains: the template pools episodes are drawn from (paper §4.1, Appendix E.3).
//!
//! A template is one step a project can contain, with every wording the
//! scripted user needs. Both pools have 18 templates and the same number of
//! templates per phase, so the phase-consistent dependency sampler induces
//! the same DAG-shape distribution in either domain.

use serde::{Deserialize, Serialize};

/// Number of phases a pool is divided into; edges only go from an earlier phase to a later one.
pub const PHASES: u8 = 6;

/// One step template of a domain pool.
#[derive(Debug, Clone, Copy)]
pub struct Template {
    /// Stable identifier, unique across both domains (`proc_` / `rel_` prefix).
    pub slug: &'static str,
    /// Phase 0..PHASES; a prerequisite always sits in a strictly earlier phase.
    pub phase: u8,
    /// Canonical wording used by the brief, the checklist and the matcher's step list.
    pub canonical: &'static str,
    /// Three paraphrased imperative asks (no trailing punctuation, no work order).
    pub asks: [&'static str; 3],
    /// Three wordings for an ask issued while the step is still blocked.
    pub premature: [&'static str; 3],
    /// Three redo probes: a fresh imperative request for the step once it is finished.
    pub redo_probes: [&'static str; 3],
    /// A status question about the step (the superseded cue uses it on the cancelled step).
    pub status_question: &'static str,
    /// An explicit, reasoned order to perform the finished step again.
    pub legit_redo: &'static str,
    /// Tool name used by the tool protocol (`ACTION {"tool": …}`).
    pub tool: &'static str,
}

/// The two template pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Domain {
    /// Procurement of equipment (the paper's main domain).
    Procurement,
    /// Software release engineering (paper Appendix E.3).
    Release,
}

impl Domain {
    /// Both domains, in a fixed order.
    pub const ALL: [Domain; 2] = [Domain::Procurement, Domain::Release];

    /// The domain's 18 templates, ordered by phase.
    pub fn templates(self) -> &'static [Template; 18] {
        match self {
            Domain::Procurement => &super::pools::PROCUREMENT,
            Domain::Release => &super::pools::RELEASE,
        }
    }

    /// Small-talk messages that ask for no step.
    pub fn fillers(self) -> &'static [&'static str] {
        match self {
            Domain::Procurement => &super::pools::PROCUREMENT_FILLERS,
            Domain::Release => &super::pools::RELEASE_FILLERS,
        }
    }

    /// The name used on the command line and in logs.
    pub fn name(self) -> &'static str {
        match self {
            Domain::Procurement => "procurement",
            Domain::Release => "release",
        }
    }
}

impl std::str::FromStr for Domain {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Domain::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| format!("unknown domain '{s}' (expected procurement or release)"))
    }
}

impl std::fmt::Display for Domain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
