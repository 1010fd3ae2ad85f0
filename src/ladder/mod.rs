//! The paper's testbed: domains, episodes, task state, receipts, arms and the scorer.

pub mod domain;
