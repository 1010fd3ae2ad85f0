//! A τ² airline run directory: `manifest.json` pins the configuration (the
//! data files' hashes among it) and the agent's model; `compiles.jsonl`
//! holds one line per seeded compile of the policy into a rule set;
//! `episodes.jsonl` holds one [`EpisodeRecord`] per finished episode.
//!
//! Resuming reads both logs: a compile with a line is not asked again
//! (unless the model could not be asked), and an episode whose (task, arm,
//! trial) has a finished line is skipped. An episode that ended on a
//! failed model call (`backend_error`) is not finished: it runs again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::record::{Arm, EpisodeRecord, Termination};
use crate::backend::Usage;
use crate::rundir::log::{self, Tagged};
use crate::rundir::{self, DirError, Identity};

/// Format tag of a τ² run directory.
pub const FORMAT: &str = "statebench-tau2/1";
pub const COMPILES: &str = "compiles.jsonl";
pub const EPISODES: &str = "episodes.jsonl";

/// The data files a run's results depend on besides the task file (the
/// agent's policy, the database, the user simulator's guidelines).
pub const DATA_FILES: [&str; 3] = ["policy.md", "db.json", "simulation_guidelines.md"];

/// Where the rule arms' rule sets come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum RuleSource {
    /// Compiled from the policy by the agent's own model.
    Compiled,
    /// The hand-written reference rule set (a validation run: the rule arms
    /// then measure the oracle's rules, not the model's).
    Reference,
}

impl RuleSource {
    pub fn name(self) -> &'static str {
        match self {
            RuleSource::Compiled => "compiled",
            RuleSource::Reference => "reference",
        }
    }
}

/// Everything a run's results depend on besides the agent's model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tau2Config {
    /// The task file read from the data directory.
    pub task_file: String,
    /// sha256 (hex) of every data file read, by file name: a changed data
    /// directory refuses to resume.
    pub data_sha256: BTreeMap<String, String>,
    pub arms: Vec<Arm>,
    pub trials: u32,
    /// Task ids, in run order.
    pub tasks: Vec<String>,
    /// Seeded compiles of the policy by the agent's model (0 with
    /// reference rules or without rule arms).
    pub compiles: usize,
    pub rules: RuleSource,
    pub seed: u64,
    pub limits: LimitsConfig,
    /// The user simulator's model; None: the agent's model plays the user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_model: Option<Identity>,
}

/// An episode's limits as the manifest pins them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitsConfig {
    /// Messages of the conversation (τ²'s max steps).
    pub max_steps: usize,
    /// Tool errors before the episode ends.
    pub max_errors: usize,
    /// Most tokens of one agent reply, of one user-simulator reply.
    pub agent_max_tokens: usize,
    pub user_max_tokens: usize,
    /// Thinking mode (Qwen3 `enable_thinking`) for agent and user.
    pub thinking: bool,
}

impl Tau2Config {
    /// Settings no run can use.
    pub fn validate(&self) -> Result<(), StudyError> {
        let bad = |why: String| Err(StudyError::Config(why));
        if self.arms.is_empty() || self.tasks.is_empty() || self.trials == 0 {
            return bad("a run needs at least one arm, one task and one trial".into());
        }
        let mut arms = self.arms.clone();
        arms.sort();
        arms.dedup();
        if arms.len() != self.arms.len() {
            return bad("an arm is named twice in --arms".into());
        }
        let mut tasks = self.tasks.clone();
        tasks.sort();
        tasks.dedup();
        if tasks.len() != self.tasks.len() {
            return bad("a task is named twice in --tasks".into());
        }
        if self.uses_rules() && self.rules == RuleSource::Compiled && self.compiles == 0 {
            return bad(format!(
                "arms {} need rules: give --compiles 1 or more, or --rules reference",
                self.rule_arms().join(",")
            ));
        }
        Ok(())
    }

    /// Whether any arm applies rules.
    pub fn uses_rules(&self) -> bool {
        self.arms.iter().any(|a| a.uses_rules())
    }

    fn rule_arms(&self) -> Vec<&'static str> {
        self.arms
            .iter()
            .filter(|a| a.uses_rules())
            .map(|a| a.name())
            .collect()
    }

    /// The seed of every arm's episode of (task, trial): arms share it, so
    /// a paired comparison differs only by the arm.
    pub fn episode_seed(&self, task: &str, trial: u32) -> u64 {
        crate::rng::Rng::stream(self.seed, &format!("tau2/episode/{task}/{trial}")).next_u64()
    }

    /// The seed of compile `index`.
    pub fn compile_seed(&self, index: usize) -> u64 {
        crate::rng::Rng::stream(self.seed, &format!("tau2/compile/{index}")).next_u64()
    }
}

/// sha256 (hex) of a data file's bytes.
pub fn file_sha256(path: &Path) -> Result<String, StudyError> {
    let bytes = std::fs::read(path).map_err(|source| {
        StudyError::Dir(DirError::Io {
            path: path.to_path_buf(),
            source,
        })
    })?;
    Ok(crate::hex(&Sha256::digest(&bytes)))
}

/// The hashes a configuration pins for a data directory and task file.
pub fn data_hashes(dir: &Path, task_file: &str) -> Result<BTreeMap<String, String>, StudyError> {
    DATA_FILES
        .iter()
        .copied()
        .chain([task_file])
        .map(|f| Ok((f.to_string(), file_sha256(&dir.join(f))?)))
        .collect()
}

/// A τ² run's manifest: its configuration and the agent's model.
pub type Manifest = rundir::Manifest<Tau2Config>;

/// One seeded compile of the policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompileRecord {
    pub index: usize,
    pub seed: u64,
    /// The model's reply as it came (thinking removed).
    pub reply: String,
    /// The parsed rule set (JSON of `RuleSet`), when the reply parsed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<serde_json::Value>,
    /// Why the reply did not parse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The model could not be asked (the compile is asked again on resume).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_error: Option<String>,
    /// Agreement with the reference rule set, when the reply parsed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agreement: Option<AgreementRecord>,
    pub usage: Usage,
}

impl CompileRecord {
    pub fn parsed(&self) -> bool {
        self.rules.is_some()
    }
}

/// How a compiled rule set agrees with the reference, field by field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgreementRecord {
    pub fields: usize,
    pub agreeing: usize,
    /// The fields that differ, by name.
    pub differing: Vec<String>,
}

/// Errors of a τ² run.
#[derive(Debug, thiserror::Error)]
pub enum StudyError {
    /// The run directory: its lock, manifest and logs.
    #[error(transparent)]
    Dir(#[from] DirError),
    #[error("{0}")]
    Config(String),
    /// Every compile failed to parse and the rule arms have no rules.
    #[error("no compile of the policy parsed ({errors}): the arms {arms} have no rules (rerun with --rules reference to run them on the hand-written reference, or drop them from --arms)")]
    NoRules { arms: String, errors: String },
    #[error("{dir}: compiles.jsonl holds compile {index}, but the run asks for {compiles}")]
    Inconsistent {
        dir: PathBuf,
        index: usize,
        compiles: usize,
    },
}

/// A run directory's compiles: the last line of each index written under
/// its configuration (a compile the model could not answer is asked again).
pub fn read_compiles(dir: &Path, manifest: &Manifest) -> Result<Vec<CompileRecord>, StudyError> {
    let hash = manifest.config_hash();
    let lines: Vec<Tagged<CompileRecord>> = log::read::<CompileRecord>(&dir.join(COMPILES))?
        .into_iter()
        .filter(|t| t.belongs(&hash))
        .collect();
    let keys: Vec<usize> = lines.iter().map(|t| t.record.index).collect();
    let last = log::last_per_key(&keys);
    let mut out = log::kept(lines, &last);
    out.sort_by_key(|c| c.index);
    Ok(out)
}

/// The compiles the rule arms draw from, in index order: those that parsed.
/// The rule arms of trial `t` use `usable[t % usable.len()]`, so with as
/// many compiles as trials each trial runs on its own compile, and compile
/// variance enters the trials rather than being fixed by one draw.
pub fn usable(compiles: &[CompileRecord]) -> Vec<&CompileRecord> {
    compiles.iter().filter(|c| c.parsed()).collect()
}

/// The episodes of a run directory, as readers count them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Episodes {
    /// Per (task, arm, trial): its first finished line.
    pub finished: Vec<EpisodeRecord>,
    /// Keys with no finished line: their first line (a failed model call).
    pub unfinished: Vec<EpisodeRecord>,
    /// Lines repeating a counted one's outcome, not counted.
    pub duplicates: usize,
}

impl Episodes {
    /// Whether (task, arm, trial) has a finished episode.
    pub fn is_finished(&self, task: &str, arm: Arm, trial: u32) -> bool {
        self.finished
            .iter()
            .any(|r| r.task_id == task && r.arm == arm && r.trial == trial)
    }
}

/// Whether an episode's line counts as finished work.
pub fn finished(r: &EpisodeRecord) -> bool {
    r.termination != Termination::BackendError
}

/// A run directory's episodes written under its configuration: per key the
/// first finished line; a key that only failed is listed apart.
pub fn read_episodes(dir: &Path, manifest: &Manifest) -> Result<Episodes, StudyError> {
    let hash = manifest.config_hash();
    let lines: Vec<Tagged<EpisodeRecord>> = log::read::<EpisodeRecord>(&dir.join(EPISODES))?
        .into_iter()
        .filter(|t| t.belongs(&hash))
        .collect();
    Ok(choose(lines.into_iter().map(|t| t.record).collect()))
}

/// Picks the counted line of each key from records in log order.
pub fn choose(records: Vec<EpisodeRecord>) -> Episodes {
    let keys: Vec<_> = records.iter().map(|r| (r.key(), finished(r))).collect();
    let (counts, duplicates) = log::first_finished(&keys);
    let mut out = Episodes {
        duplicates,
        ..Episodes::default()
    };
    for (r, counted) in records.into_iter().zip(counts) {
        match (counted, finished(&r)) {
            (false, _) => {}
            (true, true) => out.finished.push(r),
            (true, false) => out.unfinished.push(r),
        }
    }
    out
}
