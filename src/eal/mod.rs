//! EAL-Bench on the statebench engine: does persistent agent memory keep
//! changing authorization boundaries, and does an error in that memory
//! change what an executor does?
//!
//! Laid out as its flow — case → writer → frozen bundle → executor →
//! scorer → report, and the closed loop that feeds outcomes back:
//!
//! - [`domain`]: the organizations, people and wordings (data files);
//! - [`case`]: a case's history, requests and the types both share;
//! - [`generator`]: seeded cases built around one authorization change each;
//! - [`ledger`]: the ledger replay, the authorization profile it writes,
//!   and the oracle's one decision rule;
//! - [`writer`]: typed, free-text and event-sourcing writers, their
//!   admission, and best-of-k selection; [`events`] the reducer;
//! - [`profile`]: admission checks, the authority gate, the widened control,
//!   fidelity against the ledger;
//! - [`executor`]: evidence arms, native tools and the scorer of one call;
//! - [`study`]: run directories, the frozen bundle and resume;
//! - [`closed_loop`]: action/outcome or neutral feedback between requests;
//! - [`report`]: the measurements (it reads files, never a model).
//!
//! [`prompts`] holds every string EAL sends to a model.
//!
//! Layer: a study. It calls models only through [`crate::backend`], never
//! the engine's insides, and builds on what every study shares below it
//! ([`crate::rundir`], [`crate::stats`], [`crate::table`], [`crate::progress`],
//! [`crate::rng`]); it uses no other study.

pub mod case;
pub mod closed_loop;
pub mod domain;
pub mod events;
pub mod executor;
pub mod generator;
pub mod ledger;
pub mod profile;
pub mod prompts;
pub mod report;
pub mod study;
pub mod writer;

use std::path::{Path, PathBuf};

pub use case::{Case, Decision, Trap};
pub use domain::EalDomain;

/// Reading or writing EAL files.
#[derive(Debug, thiserror::Error)]
pub enum EalError {
    #[error(transparent)]
    Dir(#[from] crate::rundir::DirError),
    #[error("{path}:{line}: not a case")]
    Parse {
        path: PathBuf,
        line: usize,
        #[source]
        source: serde_json::Error,
    },
}

/// Cases as JSON lines, one case a line, in order.
pub fn cases_jsonl(cases: &[Case]) -> String {
    cases
        .iter()
        .map(|c| serde_json::to_string(c).expect("cases serialize") + "\n")
        .collect()
}

/// Reads a case file written by [`cases_jsonl`].
pub fn read_cases(path: &Path) -> Result<Vec<Case>, EalError> {
    let (lines, _) = crate::rundir::read_log_lines(path)?;
    lines
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|source| EalError::Parse {
                path: path.into(),
                line: i + 1,
                source,
            })
        })
        .collect()
}
