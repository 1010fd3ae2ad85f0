//! A τ² airline run directory: `manifest.json` pins the configuration (the
//! data files' hashes among it) and the agent's model; `compiles.jsonl`
//! holds one line per seeded compile of the policy into a rule set;
//! `episodes.jsonl` holds one [`EpisodeRecord`] per finished episode.
//!
//! Resuming reads both logs: a compile with a line is not asked again
//! (unless the model could not be asked), and an episode whose (task, arm,
//! trial) has a finished line is skipped. An episode that ended on a
//! failed model call (`backend_error`) is not finished: it runs again.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::compile::{self, Agreement};
use super::episode::{self, EpisodeSpec, Limits};
use super::reader::ReceiptReader;
use super::record::{Arm, EpisodeRecord, Termination};
use super::rules::RuleSet;
use super::task::{DataError, TaskFile, Tau2Data};
use crate::backend::{Backend, ChatReply, RequestId, SessionId, Usage};
use crate::progress::Meter;
use crate::rundir::log::{self, Log, Tagged};
use crate::rundir::{self, DirError, DirLock, Identity};

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

/// Everything a run's results depend on besides the agent's model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tau2Config {
    /// The task file read from the data directory.
    pub task_file: TaskFile,
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
    pub limits: Limits,
    /// The user simulator's model; None: the agent's model plays the user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_model: Option<Identity>,
    /// Who reads the receipts the `notice` and `gate` arms judge by (run
    /// directories from before the choice read lexically).
    #[serde(
        default = "ReceiptReader::before_choice",
        skip_serializing_if = "ReceiptReader::is_lexical"
    )]
    pub receipts: ReceiptReader,
    /// The matcher's model when receipts are read by a model: the agent's
    /// own unless `--matcher-model` names another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matcher: Option<Identity>,
    /// sha256 (hex) of τ²'s source files whose wording the prompts and
    /// tool descriptions take (`--tau2-src`), by their path in a checkout;
    /// empty: statebench's wording.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tau2_src_sha256: BTreeMap<String, String>,
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

/// The hashes a configuration pins: the data files and the task file read.
pub fn data_hashes(data: &Tau2Data, task_file: TaskFile) -> BTreeMap<String, String> {
    DATA_FILES
        .iter()
        .copied()
        .chain([task_file.file_name()])
        .filter_map(|f| Some((f.to_string(), data.sha256.get(f)?.clone())))
        .collect()
}

/// A τ² run's manifest: its configuration and the agent's model.
pub type Manifest = rundir::Manifest<Tau2Config>;

/// Most bytes of a compile's reply a record keeps (a rule set is a few
/// kilobytes; the reply was parsed whole before it is cut).
pub const COMPILE_REPLY_CAP: usize = 1 << 20;

/// One seeded compile of the policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompileRecord {
    pub index: usize,
    pub seed: u64,
    /// The model's reply as it came (thinking removed), its first
    /// [`COMPILE_REPLY_CAP`] bytes.
    pub reply: String,
    /// The reply's length, when it was longer than the cap and cut.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_bytes: Option<usize>,
    /// The parsed rule set, when the reply parsed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<RuleSet>,
    /// Why the reply did not parse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The model could not be asked (the compile is asked again on resume).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_error: Option<String>,
    /// Agreement with the reference rule set, when the reply parsed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agreement: Option<Agreement>,
    pub usage: Usage,
}

impl CompileRecord {
    pub fn parsed(&self) -> bool {
        self.rules.is_some()
    }
}

/// Errors of a τ² run.
#[derive(Debug, thiserror::Error)]
pub enum StudyError {
    /// The run directory: its lock, manifest and logs.
    #[error(transparent)]
    Dir(#[from] DirError),
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Data(#[from] DataError),
    /// A compile the model could not answer: the rule arms' compiles are
    /// fixed before any episode runs, so the run stops (a resume asks again).
    #[error("compile {index}: the model failed: {error} (run again to retry)")]
    CompileFailed { index: usize, error: String },
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

/// Reads a data directory with the chosen task file.
pub fn open_data(dir: &Path, task_file: TaskFile) -> Result<Tau2Data, StudyError> {
    Ok(Tau2Data::open_tasks(dir, task_file)?)
}

/// The task ids `--tasks` names, in run order: `all` (the task file's
/// order), `split:NAME` (a split of `split_tasks.json`), or ids separated
/// by commas. Every id must be a task of the task file.
pub fn select_tasks(data: &Tau2Data, spec: &str) -> Result<Vec<String>, StudyError> {
    let file = data.dir.display();
    let ids: Vec<String> = if spec == "all" {
        data.tasks.iter().map(|t| t.id.clone()).collect()
    } else if let Some(name) = spec.strip_prefix("split:") {
        match data.split.get(name) {
            Some(ids) => ids.clone(),
            None => {
                let names: Vec<&str> = data.split.keys().map(String::as_str).collect();
                return Err(StudyError::Config(format!(
                    "--tasks split:{name}: {file}/split_tasks.json has no such split (it has {})",
                    names.join(", ")
                )));
            }
        }
    } else {
        spec.split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    };
    if let Some(id) = ids.iter().find(|id| data.task(id).is_none()) {
        return Err(StudyError::Config(format!(
            "--tasks: no task {id} in {file} ({} tasks; ids like {})",
            data.tasks.len(),
            data.tasks
                .iter()
                .take(3)
                .map(|t| t.id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    if ids.is_empty() {
        return Err(StudyError::Config(format!("--tasks {spec}: no tasks")));
    }
    Ok(ids)
}

/// What a call to [`run`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunSummary {
    /// Compiles asked now.
    pub compiled: usize,
    /// Episodes of the configuration: tasks × arms × trials.
    pub planned: usize,
    /// Finished in earlier attempts, skipped.
    pub already: usize,
    /// Finished now.
    pub ran: usize,
    /// Ended now on a failed model call (run again on resume).
    pub failed: usize,
}

/// Runs (or resumes) a τ² run into `dir`: the compiles first, then every
/// (task, arm, trial) without a finished episode, at most `concurrency`
/// episodes batched together, each finished one replaced by the next.
/// `user` None: the agent's model plays the user too; `matcher` None: the
/// agent's model reads the receipts.
#[allow(clippy::too_many_arguments)]
pub fn run(
    dir: &Path,
    data: &Tau2Data,
    config: &Tau2Config,
    model: Identity,
    agent: &mut dyn Backend,
    user: Option<&mut dyn Backend>,
    matcher: Option<&mut dyn Backend>,
    concurrency: usize,
    progress: &Meter,
) -> Result<RunSummary, StudyError> {
    config.validate()?;
    let wording = data
        .wording
        .as_ref()
        .map(|w| w.sha256.clone())
        .unwrap_or_default();
    if wording != config.tau2_src_sha256 {
        return Err(StudyError::Config(
            "the configuration's --tau2-src hashes are not those of the wording the data holds"
                .into(),
        ));
    }
    if config.receipts == ReceiptReader::Model && config.matcher.is_none() {
        return Err(StudyError::Config(
            "receipts read by a model need the matcher's identity in the configuration".into(),
        ));
    }
    let _lock = DirLock::acquire(dir)?;
    let manifest = Manifest::new(FORMAT, config.clone(), model);
    manifest.create_or_check(dir, &[COMPILES, EPISODES])?;
    let (cpath, epath) = (dir.join(COMPILES), dir.join(EPISODES));
    let attempt = log::next_attempt(&[&cpath, &epath])?;
    let hash = manifest.config_hash();
    let mut summary = RunSummary::default();

    let rule_sets = rule_sets(dir, data, config, &manifest, attempt, agent, &mut summary)?;

    let done = read_episodes(dir, &manifest)?;
    let mut specs = Vec::new();
    for id in &config.tasks {
        let task = data
            .task(id)
            .ok_or_else(|| StudyError::Config(format!("no task {id} in the data directory")))?;
        for trial in 0..config.trials {
            for &arm in &config.arms {
                summary.planned += 1;
                if done.is_finished(id, arm, trial) {
                    summary.already += 1;
                    continue;
                }
                let rules = match arm.uses_rules() {
                    true => Some(rule_sets[trial as usize % rule_sets.len()].clone()),
                    false => None,
                };
                specs.push(EpisodeSpec {
                    task: task.clone(),
                    arm,
                    trial,
                    seed: config.episode_seed(id, trial),
                    rules,
                    limits: config.limits,
                    receipts: config.receipts,
                });
            }
        }
    }
    progress.println(format!(
        "episodes: {} to run, {} already finished",
        specs.len(),
        summary.already
    ));
    progress.set_length(summary.planned as u64);
    progress.set_position(summary.already as u64);
    let log = Log::open(&epath, attempt, &hash)?;
    let (mut ran, mut failed) = (0, 0);
    let mut on_done = |r: EpisodeRecord| -> Result<(), DirError> {
        let r = r.bounded();
        log.append([&r], true)?;
        match finished(&r) {
            true => ran += 1,
            false => failed += 1,
        }
        progress.inc();
        Ok(())
    };
    // `concurrency` bounds the episodes live at once, and so the KV cache
    // they hold together.
    episode::run_episodes(agent, user, matcher, data, specs, concurrency, &mut on_done).map_err(
        |e| match e {
            episode::RunError::Sink(e) => StudyError::Dir(e),
            e => StudyError::Config(e.to_string()),
        },
    )?;
    summary.ran = ran;
    summary.failed = failed;
    progress.finish();
    Ok(summary)
}

/// The rule sets the rule arms use, trial `t` taking entry `t % len`: the
/// reference alone (index 0) with `--rules reference`, else every compile
/// that parsed, asked first where the log lacks it. Empty without rule arms.
fn rule_sets(
    dir: &Path,
    data: &Tau2Data,
    config: &Tau2Config,
    manifest: &Manifest,
    attempt: u32,
    agent: &mut dyn Backend,
    summary: &mut RunSummary,
) -> Result<Vec<(usize, Arc<RuleSet>)>, StudyError> {
    if !config.uses_rules() {
        return Ok(Vec::new());
    }
    if config.rules == RuleSource::Reference {
        return Ok(vec![(0, Arc::new(RuleSet::reference()))]);
    }
    let have = read_compiles(dir, manifest)?;
    if let Some(c) = have.iter().find(|c| c.index >= config.compiles) {
        return Err(StudyError::Inconsistent {
            dir: dir.to_path_buf(),
            index: c.index,
            compiles: config.compiles,
        });
    }
    let missing: Vec<usize> = (0..config.compiles)
        .filter(|i| {
            !have
                .iter()
                .any(|c| c.index == *i && c.backend_error.is_none())
        })
        .collect();
    if !missing.is_empty() {
        let records = ask_compiles(agent, data, config, &missing);
        summary.compiled = records.len();
        Log::open(&dir.join(COMPILES), attempt, &manifest.config_hash())?.append(&records, true)?;
    }
    let compiles = read_compiles(dir, manifest)?;
    if let Some(c) = compiles.iter().find(|c| c.backend_error.is_some()) {
        return Err(StudyError::CompileFailed {
            index: c.index,
            error: c.backend_error.clone().unwrap_or_default(),
        });
    }
    let sets: Vec<(usize, Arc<RuleSet>)> = compiles
        .iter()
        .filter_map(|c| c.rules.clone().map(|r| (c.index, Arc::new(r))))
        .collect();
    if sets.is_empty() {
        let errors = compiles
            .iter()
            .map(|c| {
                let e = c.error.as_deref().unwrap_or("no error recorded");
                format!("compile {}: {}", c.index, e.lines().next().unwrap_or(""))
            })
            .collect::<Vec<_>>()
            .join("; ");
        return Err(StudyError::NoRules {
            arms: config.rule_arms().join(","),
            errors,
        });
    }
    Ok(sets)
}

/// Asks the compiles `indices` of the policy together, in one batch.
fn ask_compiles(
    agent: &mut dyn Backend,
    data: &Tau2Data,
    config: &Tau2Config,
    indices: &[usize],
) -> Vec<CompileRecord> {
    let reference = RuleSet::reference();
    let mut results: BTreeMap<usize, Result<ChatReply, String>> = BTreeMap::new();
    let mut flight: HashMap<RequestId, (usize, SessionId)> = HashMap::new();
    for &i in indices {
        let session = agent.open_session();
        let req = compile::compile_request_for(
            &data.policy,
            config.compile_seed(i),
            config.limits.thinking,
        );
        match agent.submit(session, req) {
            Ok(id) => {
                flight.insert(id, (i, session));
            }
            Err(e) => {
                agent.close_session(session);
                results.insert(i, Err(e.to_string()));
            }
        }
    }
    while !flight.is_empty() {
        match agent.step() {
            Ok(finished) => {
                for (id, reply) in finished {
                    if let Some((i, session)) = flight.remove(&id) {
                        agent.close_session(session);
                        results.insert(i, reply.map_err(|e| e.to_string()));
                    }
                }
            }
            Err(e) => {
                // A failed step fails every request in it.
                for (_, (i, session)) in flight.drain() {
                    agent.close_session(session);
                    results.insert(i, Err(e.to_string()));
                }
            }
        }
    }
    results
        .into_iter()
        .map(|(index, reply)| {
            let seed = config.compile_seed(index);
            match reply {
                Err(e) => CompileRecord {
                    index,
                    seed,
                    reply: String::new(),
                    reply_bytes: None,
                    rules: None,
                    error: None,
                    backend_error: Some(e),
                    agreement: None,
                    usage: Usage::default(),
                },
                Ok(mut reply) => {
                    let parsed = compile::parse(&reply.content);
                    let reply_bytes = (reply.content.len() > COMPILE_REPLY_CAP).then(|| {
                        let n = reply.content.len();
                        let mut end = COMPILE_REPLY_CAP;
                        while !reply.content.is_char_boundary(end) {
                            end -= 1;
                        }
                        reply.content.truncate(end);
                        n
                    });
                    CompileRecord {
                        index,
                        seed,
                        agreement: parsed
                            .as_ref()
                            .ok()
                            .map(|r| compile::agreement(r, &reference)),
                        error: parsed.as_ref().err().map(|e| e.to_string()),
                        rules: parsed.ok(),
                        backend_error: None,
                        reply: reply.content,
                        reply_bytes,
                        usage: reply.usage,
                    }
                }
            }
        })
        .collect()
}
