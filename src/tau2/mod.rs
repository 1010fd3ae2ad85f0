//! The τ²-bench airline transfer study (paper §5.4, RQ4): τ²'s airline
//! domain, its tools, user simulator and evaluator on the statebench
//! engine, with the ladder's rungs applied at tool dispatch.
//!
//! The data (policy, tasks, database, simulator guidelines) is read from a
//! τ²-bench airline data directory the user names; none of it is part of
//! statebench.
//!
//! Layer: a study. It calls models only through [`crate::backend`], never
//! the engine's insides, and builds on what every study shares below it
//! ([`crate::rundir`], [`crate::stats`], [`crate::table`], [`crate::progress`],
//! [`crate::rng`]); it uses no other study.

pub mod compile;
pub mod db;
pub mod episode;
pub mod evaluate;
pub mod explain;
pub mod prompts;
pub mod reader;
pub mod record;
pub mod report;
pub mod rules;
pub mod source;
pub mod study;
pub mod task;
pub mod tools;

pub use record::{Arm, CallRecord, EpisodeRecord, Reading, Reward, Termination};
