//! statebench: how strongly should task state act on an LLM agent?
//!
//! The crate holds the paper's testbed (`ladder`), its statistics (`stats`)
//! and reports (`report`). Data flows one way: generator → episode → runner →
//! arm → agent → receipts → task state → scorer → log line. The scorer never
//! calls a model.

pub mod backend;
pub mod cli_engine;
pub mod engine;
pub mod ladder;
pub mod report;
pub mod rng;
pub mod serve;
pub mod stats;
