//! The paper's testbed, laid out as its flow:
//!
//! - [`episode`]: domains (data files), the generator, held-out phrasings;
//! - [`arms`]: what the agent reads and which gate applies, arm by arm;
//! - [`parts`]: the agent, matcher and compiler (scripted, oracle or model);
//! - [`run`]: the episode runner, cells, run logs and replays;
//! - [`score`]: ground-truth labels, the six error channels, compile accuracy;
//! - [`report`]: the paper's tables and figures over run directories.
//!
//! [`prompts`] holds every string the experiment sends, [`state`] the task
//! state machine, [`receipt`] the extraction of bookings from replies.
//!
//! Layer: a study. It calls models only through [`crate::backend`], never
//! the engine's insides, and builds on what every study shares below it
//! ([`crate::rundir`], [`crate::stats`], [`crate::table`], [`crate::progress`],
//! [`crate::rng`]); it uses no other study.

pub mod arms;
pub mod episode;
pub mod harness;
pub mod parts;
pub mod probes;
pub mod prompts;
pub mod receipt;
pub mod report;
pub mod run;
pub mod score;
pub mod state;
