//! The paper's testbed: domains, episodes, task state, receipts, arms and the scorer.

pub mod agent;
pub mod arm;
pub mod cell;
pub mod corrupt;
pub mod decline;
pub mod domain;
pub mod episode;
pub mod generator;
pub mod live;
pub mod module;
pub mod paraphrase;
pub mod pools;
pub mod protocol;
pub mod receipt;
pub mod replay;
pub mod runlog;
pub mod runner;
pub mod scorer;
pub mod state;
