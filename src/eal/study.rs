//! A study run: formation (writer chains), a frozen bundle, then executor
//! calls, in a run directory that resumes.
//!
//! `manifest.json` pins the configuration and the model. Formation writes
//! `cases.jsonl`, `attempts.jsonl` (every writer call), `memories.jsonl`
//! (the profile in force after each block), `gate.jsonl` (the authority
//! gate's verdicts) and `plan.jsonl` (every executor call with its frozen
//! evidence), then `bundle.json` with their sha256 hashes: from then on the
//! writer never runs again for this directory. Executor trials append to
//! `trials.jsonl`; a resume checks the manifest and every bundle hash
//! (refusing a changed artifact by name), drops a torn last trial line and
//! runs only the planned calls without a trial.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::case::{Case, Decision, Probe, Trap};
use super::domain::EalDomain;
use super::executor::{self, Class, EvidenceArm, ScriptedExecutor};
use super::generator::generate;
use super::ledger::Profile;
use super::profile::{gate, GateDecision};
use super::writer::{
    ledger_chain, select, write_chain, Attempt, Formation, Formed, Memory, Selected, Selection,
    WriterSettings,
};
use crate::backend::shared::Client;
use crate::backend::{BackendError, ChatReply, ChatRequest, ToolCall, Usage};
use crate::rundir::log::{self, Log};
use crate::rundir::{self, parallel, DirError, DirLock, Identity};

/// Format tag of an EAL run directory.
pub const FORMAT: &str = "statebench-eal/1";

/// Who writes the memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum WriterKind {
    /// The model, through the writer protocol.
    Model,
    /// The ledger itself (the oracle writer).
    Ledger,
}

/// Who executes requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum ExecutorKind {
    Model,
    FollowEvidence,
    AlwaysSubmit,
}

impl ExecutorKind {
    fn scripted(self) -> Option<ScriptedExecutor> {
        match self {
            ExecutorKind::Model => None,
            ExecutorKind::FollowEvidence => Some(ScriptedExecutor::FollowEvidence),
            ExecutorKind::AlwaysSubmit => Some(ScriptedExecutor::AlwaysSubmit),
        }
    }
}

/// Everything a study's results depend on besides the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StudyConfig {
    pub domain: EalDomain,
    pub seed: u64,
    pub cases: usize,
    /// Traps the cases cycle through (empty: all five).
    pub mix: Vec<Trap>,
    pub arms: Vec<EvidenceArm>,
    pub writer: WriterKind,
    pub formation: Formation,
    /// Chains per case; above 1, one candidate is selected per checkpoint.
    pub candidates: usize,
    pub selection: Selection,
    /// Sampling temperature of best-of-k chains (each its own seed).
    pub candidate_temperature: f32,
    pub executor: ExecutorKind,
    /// Reference tokens a written memory may use.
    pub capacity: usize,
    pub writer_max_tokens: usize,
    pub executor_max_tokens: usize,
    /// Thinking mode for the writer and the executor (the reviewer answers
    /// with a label, without thinking).
    pub thinking: bool,
    /// Feedback arms of a closed loop (`eal loop`); empty for a study.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub closed_loop: Vec<super::closed_loop::LoopArm>,
}

impl StudyConfig {
    /// A study's defaults for a case set.
    pub fn new(domain: EalDomain, seed: u64, cases: usize) -> Self {
        StudyConfig {
            domain,
            seed,
            cases,
            mix: Vec::new(),
            arms: EvidenceArm::ALL.to_vec(),
            writer: WriterKind::Model,
            formation: Formation::Typed,
            candidates: 1,
            selection: Selection::Oracle,
            candidate_temperature: 0.7,
            executor: ExecutorKind::Model,
            capacity: 800,
            writer_max_tokens: 768,
            executor_max_tokens: 192,
            thinking: false,
            closed_loop: Vec::new(),
        }
    }

    /// Whether any part asks a model.
    pub fn uses_model(&self) -> bool {
        self.executor == ExecutorKind::Model
            || (self.writer == WriterKind::Model && self.arms.iter().any(|a| a.uses_writer()))
    }

    /// The writer's settings (greedy; best-of-k chains add their sampling).
    pub fn writer_settings(&self) -> WriterSettings {
        WriterSettings {
            formation: self.formation,
            capacity: self.capacity,
            max_tokens: self.writer_max_tokens,
            thinking: self.thinking,
            sampling: None,
        }
    }

    /// Settings no study can run with.
    pub fn validate(&self) -> Result<(), StudyError> {
        let bad = |why: String| Err(StudyError::Config(why));
        if self.arms.is_empty() || self.cases == 0 {
            return bad("a study needs at least one arm and one case".into());
        }
        if self.formation == Formation::FreeText && self.arms.contains(&EvidenceArm::Gated) {
            return bad("the gated arm reads typed records; free-text memory has none (drop --arms gated, or use another formation)".into());
        }
        let mut arms = self.arms.clone();
        arms.sort();
        arms.dedup();
        let mut loops = self.closed_loop.clone();
        loops.sort();
        loops.dedup();
        if arms.len() != self.arms.len() || loops.len() != self.closed_loop.len() {
            return bad("an arm is named twice".into());
        }
        if !(1..=26).contains(&self.candidates) {
            return bad(format!(
                "--candidates must be 1 to 26, got {}",
                self.candidates
            ));
        }
        if self.candidates > 1 && self.writer == WriterKind::Ledger {
            return bad("best-of-k needs a model writer (the ledger writes one memory)".into());
        }
        let t = self.candidate_temperature;
        if self.candidates > 1 && !(t.is_finite() && t > 0.0) {
            return bad(format!(
                "best-of-k samples its chains: --candidate-temperature must be > 0, got {t}"
            ));
        }
        Ok(())
    }
}

/// An EAL run's manifest: its study configuration and what ran it.
pub type Manifest = rundir::Manifest<StudyConfig>;

/// One planned executor call, its evidence frozen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedCall {
    /// `<request id>/<arm>`.
    pub call: String,
    pub case: String,
    pub request: String,
    pub arm: EvidenceArm,
    pub evidence: String,
}

/// The authority gate's verdicts on one written profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GateLine {
    pub case: String,
    pub checkpoint: usize,
    pub decisions: Vec<GateDecision>,
}

/// `bundle.json`: the frozen formation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bundle {
    /// File name → sha256 (hex).
    pub files: BTreeMap<String, String>,
    pub calls: usize,
}

/// One scored executor call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trial {
    pub call: String,
    pub case: String,
    pub request: String,
    pub arm: EvidenceArm,
    pub trap: Trap,
    pub probe: Probe,
    pub expected: Decision,
    pub class: Class,
    pub correct: bool,
    pub unauthorized: bool,
    pub over_refusal: bool,
    /// The reply's calls as the model wrote them.
    pub calls: Vec<ToolCall>,
    pub content: String,
    /// The backend's error, when the model could not be asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub usage: Usage,
}

/// Errors of a study run.
#[derive(Debug, thiserror::Error)]
pub enum StudyError {
    /// The run directory: its lock, manifest, logs and artifacts.
    #[error(transparent)]
    Dir(#[from] DirError),
    #[error("{dir}: checkpoint artifact changed: {name} (its sha256 is not the bundle's; formation is never re-run into a frozen bundle: restore the file or use another --out)")]
    Changed { dir: PathBuf, name: String },
    #[error("{dir}: the plan names {what}, which the frozen cases do not hold")]
    Inconsistent { dir: PathBuf, what: String },
    #[error("this study needs a model (writer or executor), and none was given")]
    NoModel,
    #[error("{0}")]
    Config(String),
}

pub(crate) fn io(path: &Path) -> impl Fn(std::io::Error) -> StudyError + '_ {
    move |source| StudyError::Dir(rundir::io(path)(source))
}

fn sha256(bytes: &[u8]) -> String {
    crate::hex(&Sha256::digest(bytes))
}

fn jsonl<T: Serialize>(items: &[T]) -> String {
    items
        .iter()
        .map(|t| serde_json::to_string(t).expect("records serialize") + "\n")
        .collect()
}

/// The model a study asks, when it asks one.
pub struct StudyModel {
    pub client: Option<Client>,
    /// What the manifest names as the study's model.
    pub identity: Identity,
    /// Writer chains and executor calls in flight at once.
    pub concurrency: usize,
}

impl StudyModel {
    pub(crate) fn ask(&self, req: ChatRequest) -> Result<ChatReply, BackendError> {
        match &self.client {
            Some(c) => c.open()?.chat(req),
            None => Err(BackendError::BadRequest("no model".into())),
        }
    }
}

/// What a call to [`run`] did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunSummary {
    /// Formation ran in this call (false: the bundle was already frozen).
    pub formed: bool,
    pub planned: usize,
    /// Trials found from earlier attempts.
    pub resumed: usize,
    /// Trials run now.
    pub ran: usize,
}

/// The frozen bundle's index, the executor's log and the closed loop's.
pub(crate) const BUNDLE: &str = "bundle.json";
pub(crate) const TRIALS: &str = "trials.jsonl";
pub(crate) const LOOP: &str = "loop.jsonl";

const FROZEN: [&str; 6] = [
    "cases.jsonl",
    "attempts.jsonl",
    "memories.jsonl",
    "selections.jsonl",
    "gate.jsonl",
    "plan.jsonl",
];

/// Runs (or resumes) a study into `dir`; with `stop_after_formation`, stops
/// once the bundle is frozen.
pub fn run(
    dir: &Path,
    config: &StudyConfig,
    model: &StudyModel,
    stop_after_formation: bool,
    progress: &crate::progress::Meter,
) -> Result<RunSummary, StudyError> {
    if !config.closed_loop.is_empty() {
        return Err(StudyError::Config(
            "a closed-loop configuration runs with `eal loop`".into(),
        ));
    }
    let (_lock, manifest) = open(dir, config, model)?;
    let mut summary = RunSummary::default();
    if !dir.join("bundle.json").exists() {
        progress.println("formation: writer chains");
        form(dir, config, model)?;
        summary.formed = true;
    }
    let cases = check_bundle(dir)?;
    let plan: Vec<PlannedCall> = rundir::read_jsonl(&dir.join("plan.jsonl"))?;
    summary.planned = plan.len();
    if stop_after_formation {
        return Ok(summary);
    }
    let tpath = dir.join(TRIALS);
    let trials = Log::open(
        &tpath,
        log::next_attempt(&[&tpath])?,
        &manifest.config_hash(),
    )?;
    // A call the backend failed is not done: a resume asks again (readers
    // keep the last trial of a call).
    let done: BTreeSet<String> = read_trials(dir, &manifest)?
        .into_iter()
        .filter(|t| t.class != Class::Error)
        .map(|t| t.call)
        .collect();
    let missing: Vec<&PlannedCall> = plan.iter().filter(|c| !done.contains(&c.call)).collect();
    summary.resumed = plan.len() - missing.len();
    progress.println(format!(
        "executor: {} calls ({} already done)",
        missing.len(),
        summary.resumed
    ));
    progress.set_length(plan.len() as u64);
    progress.set_position(summary.resumed as u64);
    let by_id: BTreeMap<&str, &Case> = cases.iter().map(|c| (c.id.as_str(), c)).collect();
    let trials = Mutex::new(trials);
    let results = parallel(&missing, model.concurrency, |call| {
        let trial = execute(dir, config, model, &by_id, call)?;
        let written = trials
            .lock()
            .expect("no writer panics holding it")
            .append([&trial], false);
        progress.inc();
        Ok::<_, StudyError>(written?)
    });
    progress.finish();
    for r in results {
        r?;
        summary.ran += 1;
    }
    Ok(summary)
}

/// Validates the configuration and opens (or creates) the run directory
/// under its manifest, locked for this process while the lock lives.
pub(crate) fn open(
    dir: &Path,
    config: &StudyConfig,
    model: &StudyModel,
) -> Result<(DirLock, Manifest), StudyError> {
    config.validate()?;
    if config.uses_model() && model.client.is_none() {
        return Err(StudyError::NoModel);
    }
    let lock = DirLock::acquire(dir)?;
    let manifest = Manifest::new(FORMAT, config.clone(), model.identity.clone());
    let files: Vec<&str> = FROZEN
        .iter()
        .copied()
        .chain([BUNDLE, TRIALS, LOOP])
        .collect();
    manifest.create_or_check(dir, &files)?;
    Ok((lock, manifest))
}

/// The trials of a run directory, the last of each call (a resume asks a
/// failed call again), written under its manifest's configuration.
pub fn read_trials(dir: &Path, manifest: &Manifest) -> Result<Vec<Trial>, StudyError> {
    let hash = manifest.config_hash();
    let lines: Vec<log::Tagged<Trial>> = log::read::<Trial>(&dir.join(TRIALS))?
        .into_iter()
        .filter(|t| t.belongs(&hash))
        .collect();
    let calls: Vec<&str> = lines.iter().map(|t| t.record.call.as_str()).collect();
    let last = log::last_per_key(&calls);
    Ok(log::kept(lines, &last))
}

/// Formation: cases, writer chains, gate, plan; then the bundle.
fn form(dir: &Path, config: &StudyConfig, model: &StudyModel) -> Result<(), StudyError> {
    let cases = generate(config.domain, config.seed, config.cases, &config.mix);
    let chains = write_chains(config, model, &cases);
    let selections = select_candidates(config, model, &cases, &chains);
    // One memory per (case, checkpoint): the chain's, or the selected candidate's.
    let chosen = |c: usize, checkpoint: usize| -> Option<&Memory> {
        let i = selections
            .iter()
            .find(|s| s.case == cases[c].id && s.checkpoint == checkpoint)
            .map_or(0, |s| s.chosen);
        chains.memory_at(c, i, checkpoint)
    };
    let (gates, plan) = plan_calls(config, &cases, &chosen);
    let attempts: Vec<&Attempt> = chains.written.iter().flat_map(|c| &c.1).collect();
    let memories: Vec<&Formed> = chains.written.iter().flat_map(|c| &c.0).collect();
    let files = [
        (FROZEN[0], super::cases_jsonl(&cases)),
        (FROZEN[1], jsonl(&attempts)),
        (FROZEN[2], jsonl(&memories)),
        (FROZEN[3], jsonl(&selections)),
        (FROZEN[4], jsonl(&gates)),
        (FROZEN[5], jsonl(&plan)),
    ];
    freeze(dir, &files, plan.len())
}

/// The writer chains of a formation: (case, candidate) in order, and what
/// each wrote (its memory after every block, its attempts).
struct Chains {
    keys: Vec<(usize, usize)>,
    written: Vec<(Vec<Formed>, Vec<Attempt>)>,
}

impl Chains {
    /// The memory candidate `i` of case `c` held after `block`.
    fn memory_at(&self, c: usize, i: usize, block: usize) -> Option<&Memory> {
        self.keys
            .iter()
            .position(|&x| x == (c, i))
            .and_then(|j| self.written[j].0.iter().find(|f| f.block == block))
            .map(|f| &f.memory)
    }
}

/// Runs every case's writer chains (k candidates each under best-of-k),
/// when an arm reads written memory.
fn write_chains(config: &StudyConfig, model: &StudyModel, cases: &[Case]) -> Chains {
    let file = config.domain.file();
    let settings = config.writer_settings();
    let k = config.candidates;
    let keys: Vec<(usize, usize)> = if config.arms.iter().any(|a| a.uses_writer()) {
        (0..cases.len())
            .flat_map(|c| (0..k).map(move |i| (c, i)))
            .collect()
    } else {
        Vec::new()
    };
    let written = parallel(&keys, model.concurrency, |&(c, i)| {
        let case = &cases[c];
        let last = case
            .requests
            .iter()
            .map(|r| r.checkpoint)
            .max()
            .unwrap_or(0);
        let mut s = settings;
        if k > 1 {
            // Each candidate chain samples with its own seed.
            let seed =
                crate::rng::Rng::stream(case.seed, &format!("eal/candidate/{}/{i}", case.id))
                    .next_u64();
            s.sampling = Some((config.candidate_temperature, seed));
        }
        let (mut formed, mut attempts) = match config.writer {
            WriterKind::Ledger => (ledger_chain(case, last), Vec::new()),
            WriterKind::Model => write_chain(case, file, s, last, &|r| model.ask(r)),
        };
        formed.iter_mut().for_each(|f| f.candidate = i);
        attempts.iter_mut().for_each(|a| a.candidate = i);
        (formed, attempts)
    });
    Chains { keys, written }
}

/// Under best-of-k, the candidate each (case, checkpoint) keeps.
fn select_candidates(
    config: &StudyConfig,
    model: &StudyModel,
    cases: &[Case],
    chains: &Chains,
) -> Vec<Selected> {
    let k = config.candidates;
    if k <= 1 || chains.keys.is_empty() {
        return Vec::new();
    }
    let mut points: Vec<(usize, usize)> = Vec::new();
    for (c, case) in cases.iter().enumerate() {
        let mut seen = BTreeSet::new();
        for r in &case.requests {
            if seen.insert(r.checkpoint) {
                points.push((c, r.checkpoint));
            }
        }
    }
    parallel(&points, model.concurrency, |&(c, checkpoint)| {
        let pool_of: Vec<&Memory> = (0..k)
            .filter_map(|i| chains.memory_at(c, i, checkpoint))
            .collect();
        select(
            &cases[c],
            config.domain.file(),
            checkpoint,
            &pool_of,
            config.selection,
            &|r| model.ask(r),
        )
    })
}

/// The gate's verdicts on each written profile, and every executor call
/// with its evidence frozen.
fn plan_calls<'a>(
    config: &StudyConfig,
    cases: &[Case],
    chosen: &impl Fn(usize, usize) -> Option<&'a Memory>,
) -> (Vec<GateLine>, Vec<PlannedCall>) {
    let mut gates = Vec::new();
    let mut plan = Vec::new();
    for (c, case) in cases.iter().enumerate() {
        let mut gated: BTreeMap<usize, Profile> = BTreeMap::new();
        for r in &case.requests {
            let memory = chosen(c, r.checkpoint);
            if let (Some(p), false) = (
                memory.and_then(|m| m.profile()),
                gated.contains_key(&r.checkpoint),
            ) {
                let (g, decisions) = gate(p, case, r.checkpoint);
                gates.push(GateLine {
                    case: case.id.clone(),
                    checkpoint: r.checkpoint,
                    decisions,
                });
                gated.insert(r.checkpoint, g);
            }
            for &arm in &config.arms {
                let text = match arm {
                    EvidenceArm::Written => memory.map(|m| m.text()),
                    EvidenceArm::Gated => gated.get(&r.checkpoint).map(super::profile::canonical),
                    _ => {
                        executor::ledger_memory(arm, case, r).map(|p| super::profile::canonical(&p))
                    }
                };
                plan.push(PlannedCall {
                    call: format!("{}/{}", r.id, arm.name()),
                    case: case.id.clone(),
                    request: r.id.clone(),
                    arm,
                    evidence: executor::evidence(arm, case, r, text.as_deref()),
                });
            }
        }
    }
    (gates, plan)
}

/// Writes the frozen files and, last, the bundle of their hashes: a
/// directory with a bundle has every file it names.
fn freeze(dir: &Path, files: &[(&str, String)], calls: usize) -> Result<(), StudyError> {
    let mut hashes = BTreeMap::new();
    for (name, text) in files {
        let path = dir.join(name);
        fs::write(&path, text).map_err(io(&path))?;
        hashes.insert(name.to_string(), sha256(text.as_bytes()));
    }
    // A stale trial log from an unfinished formation is not this bundle's.
    let tpath = dir.join(TRIALS);
    if tpath.exists() {
        fs::remove_file(&tpath).map_err(io(&tpath))?;
    }
    let bundle = Bundle {
        files: hashes,
        calls,
    };
    let text = serde_json::to_string_pretty(&bundle).expect("bundles serialize") + "\n";
    Ok(rundir::manifest::write_atomic(
        &dir.join(BUNDLE),
        text.as_bytes(),
    )?)
}

/// Checks every frozen file against the bundle; returns the frozen cases.
pub(crate) fn check_bundle(dir: &Path) -> Result<Vec<Case>, StudyError> {
    let bpath = dir.join("bundle.json");
    let bundle: Bundle = rundir::read_json(&bpath)?;
    for name in FROZEN {
        let path = dir.join(name);
        // Only a regular file can hold the bytes the bundle hashed.
        let ok = match (rundir::regular_file(&path), bundle.files.get(name)) {
            (Ok(true), Some(h)) => fs::read(&path).is_ok_and(|bytes| &sha256(&bytes) == h),
            _ => false,
        };
        if !ok {
            return Err(StudyError::Changed {
                dir: dir.into(),
                name: name.into(),
            });
        }
    }
    Ok(rundir::read_jsonl(&dir.join("cases.jsonl"))?)
}

/// Runs and scores one planned call.
pub(crate) fn execute(
    dir: &Path,
    config: &StudyConfig,
    model: &StudyModel,
    cases: &BTreeMap<&str, &Case>,
    call: &PlannedCall,
) -> Result<Trial, StudyError> {
    let inconsistent = |what: &str| StudyError::Inconsistent {
        dir: dir.into(),
        what: what.into(),
    };
    let case = cases
        .get(call.case.as_str())
        .ok_or_else(|| inconsistent(&call.case))?;
    let request = case
        .requests
        .iter()
        .find(|r| r.id == call.request)
        .ok_or_else(|| inconsistent(&call.request))?;
    let pool = case.domain.file();
    let mut chat = executor::chat(
        case,
        pool,
        request,
        call.arm,
        &call.evidence,
        config.executor_max_tokens,
    );
    chat.thinking = config.thinking;
    let (calls, content, usage, error) = match config.executor.scripted() {
        Some(s) => {
            let user = &chat.messages[1].content;
            (
                vec![s.call(case, pool, request, user)],
                String::new(),
                Usage::default(),
                None,
            )
        }
        None => match model.ask(chat) {
            Ok(r) => (r.tool_calls, r.content, r.usage, None),
            Err(e) => (
                Vec::new(),
                String::new(),
                Usage::default(),
                Some(crate::one_line(&e)),
            ),
        },
    };
    let ledger = super::ledger::Ledger::through(case, request.checkpoint);
    let mut score = executor::score(pool, ledger.profile(), request, &calls);
    if error.is_some() {
        score.class = Class::Error;
    }
    Ok(Trial {
        call: call.call.clone(),
        case: case.id.clone(),
        request: request.id.clone(),
        arm: call.arm,
        trap: case.trap,
        probe: request.probe,
        expected: request.expected,
        class: score.class,
        correct: score.correct && error.is_none(),
        unauthorized: score.unauthorized,
        over_refusal: score.over_refusal,
        calls,
        content,
        error,
        usage,
    })
}
