//! A cell: one configuration (domain, S, ρ, brief, …) run over a seed range
//! on a list of arms, logged to a run directory and resumable.

use crate::progress::Meter;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::runlog::{Locking, Manifest, RunDir, RUN_FORMAT};
use super::runner::{run_episode, Compiled, RunOptions};
use crate::backend::shared::Client;
use crate::backend::{BackendError, ModelIdentity};
use crate::ladder::arms::memory::MemoryKind;
use crate::ladder::arms::Arm;
use crate::ladder::episode::domain::Domain;
use crate::ladder::episode::generator::{generate, GenError, ParaphraseCache};
use crate::ladder::episode::{Episode, EpisodeConfig, EpisodeSettings, Protocol};
use crate::ladder::parts::model::{
    ModelAgent, ModelCompiler, ModelEmbedder, ModelMatcher, ModelMemoryWriter,
};
use crate::ladder::parts::scripted::{
    Lexical, OracleCompiler, OracleMatcher, OracleMemoryWriter, Scripted,
};
use crate::ladder::parts::{Agent, Compiler, Embedder, Matcher, MemoryParts, MemoryWriter};
use crate::rundir::{DirError, Identity};

/// Everything a cell is a function of; stored in the manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellConfig {
    /// First in the JSON, as their keys have always been: a grid's id
    /// hashes its cells' JSON in field order.
    #[serde(flatten)]
    pub episode: EpisodeSettings,
    pub seed_start: u64,
    pub episodes: u64,
    /// Arms, in ladder order (adjacent arms are contrasted).
    pub arms: Vec<Arm>,
    pub agent: AgentSpec,
    pub matcher: Source,
    pub compiler: Source,
    /// Thinking regime (Qwen3 `enable_thinking`).
    #[serde(default)]
    pub thinking: bool,
    pub options: RunOptions,
    /// What embeds the retrieval memories (cells with a memory arm).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedder: Option<EmbedderId>,
    /// What writes the Mem0-style memory's facts (cells with a memory arm).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_writer: Option<Source>,
}

/// Which agent runs a cell's episodes. Written as `scripted:perfect`,
/// `scripted:always-book`, `scripted:credulous`, `model` (before a model
/// is loaded) or `model:NAME`; the command line and grid files name the
/// kinds `perfect`, `always-book`, `credulous` and `model`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum AgentSpec {
    Scripted(Scripted),
    /// The model, by the name it loaded under (None until it is loaded).
    Model {
        name: Option<String>,
    },
}

/// An agent name that is none of [`AgentSpec`]'s.
#[derive(Debug, thiserror::Error)]
#[error(
    "unknown agent '{0}' (expected scripted:perfect, scripted:always-book, scripted:credulous, model or model:NAME)"
)]
pub struct UnknownAgent(String);

impl AgentSpec {
    /// The scripted agent, or None for the model.
    pub fn scripted(&self) -> Option<Scripted> {
        match self {
            AgentSpec::Scripted(s) => Some(*s),
            AgentSpec::Model { .. } => None,
        }
    }
}

impl std::fmt::Display for AgentSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AgentSpec::Scripted(s) => f.write_str(&s.name()),
            AgentSpec::Model { name: None } => f.write_str("model"),
            AgentSpec::Model { name: Some(n) } => write!(f, "model:{n}"),
        }
    }
}

impl std::str::FromStr for AgentSpec {
    type Err = UnknownAgent;
    fn from_str(s: &str) -> Result<AgentSpec, UnknownAgent> {
        if let Some(name) = s.strip_prefix("scripted:") {
            return name
                .parse()
                .map(AgentSpec::Scripted)
                .map_err(|_| UnknownAgent(s.into()));
        }
        match s.strip_prefix("model") {
            Some("") => Ok(AgentSpec::Model { name: None }),
            Some(rest) => match rest.strip_prefix(':') {
                Some(name) => Ok(AgentSpec::Model {
                    name: Some(name.into()),
                }),
                None => Err(UnknownAgent(s.into())),
            },
            None => Err(UnknownAgent(s.into())),
        }
    }
}

impl From<AgentSpec> for String {
    fn from(a: AgentSpec) -> String {
        a.to_string()
    }
}

impl TryFrom<String> for AgentSpec {
    type Error = UnknownAgent;
    fn try_from(s: String) -> Result<AgentSpec, UnknownAgent> {
        s.parse()
    }
}

/// The kinds as flags and grid files name them (a model by no name).
impl clap::ValueEnum for AgentSpec {
    fn value_variants<'a>() -> &'a [Self] {
        &[
            AgentSpec::Scripted(Scripted::Perfect),
            AgentSpec::Scripted(Scripted::AlwaysBook),
            AgentSpec::Scripted(Scripted::Credulous),
            AgentSpec::Model { name: None },
        ]
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        use clap::builder::PossibleValue;
        match self {
            AgentSpec::Scripted(Scripted::Perfect) => Some(
                PossibleValue::new("perfect")
                    .help("The scripted perfect agent (replays ground truth)"),
            ),
            AgentSpec::Scripted(Scripted::AlwaysBook) => Some(
                PossibleValue::new("always-book")
                    .help("The memoryless policy that books every request"),
            ),
            AgentSpec::Scripted(Scripted::Credulous) => Some(
                PossibleValue::new("credulous")
                    .help("The scripted agent that believes any state the user's message claims"),
            ),
            AgentSpec::Model { name: None } => Some(
                PossibleValue::new("model")
                    .help("The model (--model, a grid's models, or --endpoint)"),
            ),
            AgentSpec::Model { name: Some(_) } => None,
        }
    }
}

/// Which embedder a cell's memory arms use, as the manifest names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum EmbedderId {
    /// The hashed bag of words (cells without a model).
    Lexical,
    /// The agent model's own final hidden state.
    Agent,
    /// A separate embedding model (`--embedder`).
    Model(ModelIdentity),
}

impl std::fmt::Display for EmbedderId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EmbedderId::Lexical => f.write_str("lexical"),
            EmbedderId::Agent => f.write_str("agent model"),
            EmbedderId::Model(m) => write!(f, "{}", m.name),
        }
    }
}

/// Which embedder a cell asks for, before any model is loaded: `agent`,
/// `lexical`, or an embedding model's spec (a checkpoint directory, a
/// .gguf or a hub id) loaded in-process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "String", from = "String")]
pub enum EmbedderSpec {
    Agent,
    Lexical,
    Model(String),
}

impl From<String> for EmbedderSpec {
    fn from(s: String) -> EmbedderSpec {
        match s.as_str() {
            "agent" => EmbedderSpec::Agent,
            "lexical" => EmbedderSpec::Lexical,
            _ => EmbedderSpec::Model(s),
        }
    }
}

impl From<EmbedderSpec> for String {
    fn from(e: EmbedderSpec) -> String {
        match e {
            EmbedderSpec::Agent => "agent".into(),
            EmbedderSpec::Lexical => "lexical".into(),
            EmbedderSpec::Model(m) => m,
        }
    }
}

impl std::str::FromStr for EmbedderSpec {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<EmbedderSpec, Self::Err> {
        Ok(s.to_string().into())
    }
}

impl CellConfig {
    /// A cell of the paper's main grid (the four rungs) with the given
    /// episodes, agent and parts.
    pub fn paper(base: &EpisodeConfig, episodes: u64, agent: AgentSpec, parts: Source) -> Self {
        CellConfig {
            episode: base.settings.clone(),
            seed_start: base.seed,
            episodes,
            arms: Arm::LADDER.to_vec(),
            agent,
            matcher: parts,
            compiler: parts,
            thinking: false,
            options: RunOptions::default(),
            embedder: None,
            memory_writer: None,
        }
    }

    /// Whether any arm keeps a retrieval memory.
    pub fn uses_memory(&self) -> bool {
        self.arms.iter().any(|a| a.uses_memory())
    }

    /// Whether a part of the cell runs on the agent model: the agent, a
    /// model matcher or compiler, or a memory arm's embedder or fact
    /// writer (a writer only where an arm keeps facts).
    pub fn needs_model(&self) -> bool {
        let facts = self
            .arms
            .iter()
            .any(|a| a.spec().memory() == Some(MemoryKind::Facts));
        let memory = self.uses_memory()
            && (self.embedder == Some(EmbedderId::Agent)
                || (facts && self.memory_writer == Some(Source::Model)));
        self.agent.scripted().is_none()
            || self.matcher == Source::Model
            || self.compiler == Source::Model
            || memory
    }

    /// Settles the memory parts of a cell with memory arms, where the user
    /// named none: the agent model's hidden state when a model runs (else
    /// the lexical embedder), and the writer from the same source as the
    /// matcher. Cells without memory arms keep none (their manifests stay
    /// as they were).
    pub fn settle_memory(&mut self, model: bool) {
        if !self.uses_memory() {
            self.embedder = None;
            self.memory_writer = None;
            return;
        }
        self.embedder.get_or_insert(if model {
            EmbedderId::Agent
        } else {
            EmbedderId::Lexical
        });
        self.memory_writer.get_or_insert(self.matcher);
    }

    /// The quick start's cell: procurement, S steps, ρ = 0.15, seeds from
    /// 100, the four rungs, a model as agent, matcher and compiler.
    pub fn quickstart(model: &str, steps: usize, episodes: u64) -> Self {
        let base = EpisodeConfig::paper(Domain::Procurement, steps, 0.15, 100);
        let agent = AgentSpec::Model {
            name: Some(model.to_string()),
        };
        CellConfig::paper(&base, episodes, agent, Source::Model)
    }

    /// Checks what no episode can show: the seed range, the arms, the size.
    pub fn validate(&self) -> Result<(), CellError> {
        crate::ladder::episode::generator::validate(&self.episode)?;
        if self.seed_start.checked_add(self.episodes).is_none() {
            return Err(CellError::SeedRange {
                start: self.seed_start,
                episodes: self.episodes,
            });
        }
        if self.arms.is_empty() {
            return Err(CellError::NoArms);
        }
        if self.options.tool_faults.is_some() && self.episode.protocol == Protocol::Text {
            return Err(CellError::FaultsNeedTools);
        }
        for (i, a) in self.arms.iter().enumerate() {
            if self.arms[..i].contains(a) {
                return Err(CellError::DuplicateArm(*a));
            }
        }
        let total = self.episodes.checked_mul(self.arms.len() as u64);
        if total.is_none_or(|t| t > MAX_EPISODE_ARMS) {
            return Err(CellError::TooLarge {
                episodes: self.episodes,
                arms: self.arms.len(),
            });
        }
        Ok(())
    }

    /// The seeds of the cell.
    pub fn seeds(&self) -> std::ops::Range<u64> {
        self.seed_start..self.seed_start + self.episodes
    }
}

/// Why a cell could not run.
#[derive(Debug, thiserror::Error)]
pub enum CellError {
    /// Bad episode configuration.
    #[error(transparent)]
    Gen(#[from] GenError),
    /// Run directory trouble.
    #[error(transparent)]
    Log(#[from] DirError),
    /// The model could not be reached.
    #[error("model")]
    Model(#[from] BackendError),
    #[error("a model-backed part needs a model (--model or --endpoint)")]
    NoModel,
    #[error("the cell's manifest names an embedding model; pass it again with --embedder")]
    NoEmbedder,
    /// The model failed in a way no turn can recover from; the episode is
    /// not logged, so a resume runs it again.
    #[error("the model cannot run: {0}")]
    ModelBroken(String),
    #[error(
        "seeds {start} + {episodes} episodes pass the largest seed {}",
        u64::MAX
    )]
    SeedRange { start: u64, episodes: u64 },
    #[error("no arms to run")]
    NoArms,
    #[error("--tool-faults fails tool calls: it needs --protocol tool or native (the text protocol books by ref lines, which call no tool)")]
    FaultsNeedTools,
    #[error("arm {0} is listed twice (each arm runs once per episode; list it once)")]
    DuplicateArm(Arm),
    #[error("{episodes} episodes x {arms} arms is more than one cell holds (at most {MAX_EPISODE_ARMS} episode-arms; split it into cells)")]
    TooLarge { episodes: u64, arms: usize },
    /// The backend keeps failing calls: the episodes so far are logged
    /// (counted apart from the rates) and a resume runs them again.
    #[error("{episodes} episodes in a row ended in failed agent calls; stopping (a resume runs them again). Last error: {last}")]
    CallsFailing { episodes: u32, last: String },
}

/// Episode-arms in one cell at most (each is a log line and a job).
pub const MAX_EPISODE_ARMS: u64 = 100_000_000;

/// Episodes in a row (as they finish, over every cell of the run) with a
/// failed agent call after which a run stops: a backend that fails every
/// call would otherwise log the whole cell as failed episodes.
pub const FAILING_EPISODES: u32 = 3;

/// What the parts behind a cell are. A cell runs many episodes at once, so
/// every episode-arm gets its own agent and matcher (a conversation each).
pub trait Parts: Sync {
    /// A fresh agent for one episode-arm.
    fn agent(&self) -> Result<Box<dyn Agent + Send>, CellError>;
    /// A fresh matcher for one episode-arm.
    fn matcher(&self) -> Result<Box<dyn Matcher + Send>, CellError>;
    /// A compiler (one compile per episode, shared by the cell's module arms).
    fn compiler(&self) -> Result<Box<dyn Compiler + Send>, CellError>;
    /// Fresh memory parts for one episode-arm of the cell.
    fn memory(&self, cfg: &CellConfig) -> Result<MemoryParts, CellError>;
    /// What runs the parts, for the manifest.
    fn model(&self) -> Identity;
}

/// Where a matcher or compiler comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// The generator (scripted step; generator's graph).
    Oracle,
    /// The agent model, with the B.1 prompts.
    Model,
}

/// The parts of a cell: a scripted or model agent, and oracle or model
/// matcher and compiler on one shared model.
pub struct CellParts {
    /// The scripted agent, or None for the model agent.
    pub scripted: Option<Scripted>,
    pub matcher: Source,
    pub compiler: Source,
    /// The shared model, when any part is model-backed.
    pub client: Option<Client>,
    /// A separate embedding model, when `--embedder` names one.
    pub embedder: Option<Client>,
    pub thinking: bool,
    pub model: Identity,
}

impl CellParts {
    /// A scripted agent with the oracle matcher and compiler.
    pub fn scripted(agent: Scripted) -> Self {
        CellParts {
            scripted: Some(agent),
            matcher: Source::Oracle,
            compiler: Source::Oracle,
            client: None,
            embedder: None,
            thinking: false,
            model: Identity::Scripted {
                agent: agent.name(),
            },
        }
    }

    /// A model as agent, matcher and compiler.
    pub fn model(client: Client, model: ModelIdentity, thinking: bool) -> Self {
        CellParts {
            scripted: None,
            matcher: Source::Model,
            compiler: Source::Model,
            client: Some(client),
            embedder: None,
            thinking,
            model: Identity::Model(model),
        }
    }

    fn client(&self) -> Result<&Client, CellError> {
        self.client.as_ref().ok_or(CellError::NoModel)
    }
}

impl Parts for CellParts {
    fn agent(&self) -> Result<Box<dyn Agent + Send>, CellError> {
        Ok(match self.scripted {
            Some(s) => Box::new(s),
            None => {
                let name = AgentSpec::Model {
                    name: Some(self.model.name().to_string()),
                };
                let client = self.client()?;
                Box::new(ModelAgent::new(client, self.thinking, name.to_string())?)
            }
        })
    }
    fn matcher(&self) -> Result<Box<dyn Matcher + Send>, CellError> {
        Ok(match self.matcher {
            Source::Oracle => Box::new(OracleMatcher),
            Source::Model => Box::new(ModelMatcher::new(self.client()?, self.thinking)?),
        })
    }
    fn compiler(&self) -> Result<Box<dyn Compiler + Send>, CellError> {
        Ok(match self.compiler {
            Source::Oracle => Box::new(OracleCompiler),
            Source::Model => Box::new(ModelCompiler::new(self.client()?, self.thinking)),
        })
    }
    fn memory(&self, cfg: &CellConfig) -> Result<MemoryParts, CellError> {
        let embedder: Box<dyn Embedder + Send> = match &cfg.embedder {
            None | Some(EmbedderId::Lexical) => Box::new(Lexical),
            Some(EmbedderId::Agent) => Box::new(ModelEmbedder::new(self.client()?)),
            Some(EmbedderId::Model(_)) => Box::new(ModelEmbedder::new(
                self.embedder.as_ref().ok_or(CellError::NoEmbedder)?,
            )),
        };
        let writer: Box<dyn MemoryWriter + Send> = match cfg.memory_writer {
            None | Some(Source::Oracle) => Box::new(OracleMemoryWriter),
            Some(Source::Model) => Box::new(ModelMemoryWriter::new(self.client()?, self.thinking)?),
        };
        Ok(MemoryParts { embedder, writer })
    }
    fn model(&self) -> Identity {
        self.model.clone()
    }
}

/// One compile, done once by whichever worker needs it first (`None` when
/// that worker failed and recorded why).
type CompileSlot = Arc<OnceLock<Option<Compiled>>>;

/// What a compile is a function of. A model compile reads the brief, the
/// step list and the revision message, so cells whose episodes agree on
/// those share it (as the paper shares one compile per domain, S, ρ and
/// seed); the oracle reads the generator's graph, so it is per episode.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum CompileKey {
    Model {
        thinking: bool,
        brief: String,
        steps: String,
        revision: String,
    },
    Episode {
        cell: usize,
        seed: u64,
    },
}

/// Summary of a cell run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CellProgress {
    /// Episode-arms run now.
    pub ran: usize,
    /// Episode-arms skipped as already finished.
    pub skipped: usize,
}

/// Runs (or resumes) a cell into `out`, with at most `concurrency`
/// episode-arms in flight at once (each a thread that waits on the model
/// most of the time; the shared backend batches their requests).
pub fn run_cell(
    cfg: &CellConfig,
    parts: &dyn Parts,
    cache: Option<&ParaphraseCache>,
    out: &Path,
    concurrency: usize,
    progress: bool,
) -> Result<CellProgress, CellError> {
    let job = CellJob {
        name: out.display().to_string(),
        cfg: cfg.clone(),
        parts,
        out: out.to_path_buf(),
        seeds: None,
        locking: Locking::Own,
    };
    let bar = progress_bar(progress);
    let p = run_cells(&[job], cache, concurrency, &bar)?;
    bar.finish();
    Ok(p[0])
}

/// One cell of a run over several: its configuration, parts, directory,
/// and the seeds this process runs (all of them, or a shard's).
pub struct CellJob<'a> {
    /// What progress lines call the cell.
    pub name: String,
    pub cfg: CellConfig,
    pub parts: &'a dyn Parts,
    pub out: PathBuf,
    /// A subset of `cfg.seeds()`, or None for all.
    pub seeds: Option<Vec<u64>>,
    pub locking: Locking<'a>,
}

/// Runs (or resumes) several cells through one pool of `concurrency`
/// workers, so the batch stays full across cell boundaries. The cells'
/// model parts must share one model: compiles with equal inputs are
/// shared between cells. Longer episodes start first, so the last batch
/// is not one long straggler.
pub fn run_cells(
    cells: &[CellJob<'_>],
    cache: Option<&ParaphraseCache>,
    concurrency: usize,
    bar: &Meter,
) -> Result<Vec<CellProgress>, CellError> {
    // Check every configuration before touching any directory.
    for c in cells {
        c.cfg.validate()?;
    }
    let mut dirs = Vec::new();
    let mut jobs: Vec<(usize, u64, Arm)> = Vec::new();
    let mut progress = Vec::new();
    let mut todo_per_cell = Vec::new();
    for (i, c) in cells.iter().enumerate() {
        let manifest = Manifest::new(RUN_FORMAT, c.cfg.clone(), c.parts.model());
        let dir = RunDir::open(&c.out, &manifest, c.locking)?;
        let seeds: Vec<u64> = match &c.seeds {
            Some(s) => s.clone(),
            None => c.cfg.seeds().collect(),
        };
        let all: Vec<(usize, u64, Arm)> = seeds
            .iter()
            .flat_map(|&s| c.cfg.arms.iter().map(move |&a| (i, s, a)))
            .collect();
        let todo: Vec<_> = all
            .iter()
            .copied()
            .filter(|&(_, s, a)| !dir.is_finished(s, a))
            .collect();
        progress.push(CellProgress {
            ran: 0,
            skipped: all.len() - todo.len(),
        });
        todo_per_cell.push(todo.len());
        jobs.extend(todo);
        dirs.push(Mutex::new(dir));
    }
    // Longest episodes first (turns grow with S), then seed and arm order.
    jobs.sort_by_key(|&(i, s, a)| {
        let c = &cells[i].cfg;
        let arm = c.arms.iter().position(|x| *x == a);
        (std::cmp::Reverse(c.episode.steps), s, i, arm)
    });
    let total: usize = progress.iter().map(|p| p.skipped).sum::<usize>() + jobs.len();
    bar.set_length(total as u64);
    bar.set_position(progress.iter().map(|p| p.skipped as u64).sum());
    let left: Vec<AtomicUsize> = todo_per_cell.iter().map(|&n| AtomicUsize::new(n)).collect();
    let pool = Workers {
        cells,
        cache,
        compiled: Mutex::new(HashMap::new()),
        dirs,
        left,
        failed: Mutex::new(None),
        tokens: AtomicUsize::new(0),
        failing: Mutex::new(0),
        started: Instant::now(),
        bar,
    };
    // After a failure the remaining jobs are passed over.
    crate::rundir::parallel(&jobs, concurrency, |&(cell, seed, arm)| {
        if pool.failed() {
            return;
        }
        if let Err(e) = pool.run(cell, seed, arm) {
            pool.fail(e);
        }
    });
    if let Some(e) = pool.failed.into_inner().ok().flatten() {
        return Err(e);
    }
    for (i, p) in progress.iter_mut().enumerate() {
        p.ran = todo_per_cell[i] - pool.left[i].load(Ordering::SeqCst);
    }
    Ok(progress)
}

/// Progress over episode-arms (hidden when `show` is false).
pub fn progress_bar(show: bool) -> Meter {
    Meter::new(show, "episode-arms")
}

/// What the worker threads of a run share.
struct Workers<'a> {
    cells: &'a [CellJob<'a>],
    cache: Option<&'a ParaphraseCache>,
    compiled: Mutex<HashMap<CompileKey, CompileSlot>>,
    dirs: Vec<Mutex<RunDir>>,
    /// Episode-arms each cell has left to run.
    left: Vec<AtomicUsize>,
    /// The first error; the other workers stop taking jobs.
    failed: Mutex<Option<CellError>>,
    /// Completion tokens so far, for the progress bar.
    tokens: AtomicUsize,
    /// Episodes in a row, as they finished, with a failed agent call.
    failing: Mutex<u32>,
    started: Instant,
    bar: &'a Meter,
}

impl Workers<'_> {
    fn failed(&self) -> bool {
        self.failed.lock().map(|f| f.is_some()).unwrap_or(true)
    }

    fn fail(&self, e: CellError) {
        if let Ok(mut f) = self.failed.lock() {
            f.get_or_insert(e);
        }
    }

    /// Runs one episode-arm and appends it to its cell's run directory.
    fn run(&self, cell: usize, seed: u64, arm: Arm) -> Result<(), CellError> {
        let job = &self.cells[cell];
        let ep = generate(&job.cfg.episode.at(seed), self.cache)?;
        let slot = self.slot(cell, &ep);
        let compiled = match arm.uses_module() {
            // The first worker to need the compile runs it; the others wait.
            true => match slot.get_or_init(|| self.compile(job, &ep)) {
                Some(c) => Some(c),
                None => return Ok(()),
            },
            false => None,
        };
        let mut agent = job.parts.agent()?;
        let mut matcher = job.parts.matcher()?;
        let mut memory = match arm.uses_memory() {
            true => job.parts.memory(&job.cfg)?,
            false => MemoryParts::scripted(),
        };
        let (rec, turns) = run_episode(
            &ep,
            arm,
            &mut *agent,
            &mut *matcher,
            &mut memory,
            compiled,
            &job.cfg.options,
        );
        if let Some(why) = agent.broken() {
            return Err(CellError::ModelBroken(why.to_string()));
        }
        match self.dirs[cell].lock() {
            Ok(mut dir) => dir.append(&rec, &turns)?,
            // Another worker panicked; the thread scope re-raises it.
            Err(_) => return Ok(()),
        }
        self.tick(cell, rec.usage.completion_tokens);
        let mut failing = self.failing.lock().expect("no worker panics holding it");
        *failing = if rec.failed_calls > 0 {
            *failing + 1
        } else {
            0
        };
        if *failing >= FAILING_EPISODES {
            let last = turns.iter().rev().find_map(|t| t.errors.last());
            return Err(CellError::CallsFailing {
                episodes: *failing,
                last: last.cloned().unwrap_or_default(),
            });
        }
        Ok(())
    }

    /// Counts a finished episode-arm on the bar, and a finished cell.
    fn tick(&self, cell: usize, tokens: usize) {
        let n = self.tokens.fetch_add(tokens, Ordering::SeqCst) + tokens;
        if n > 0 {
            let secs = self.started.elapsed().as_secs_f64();
            self.bar
                .set_message(format!("{:.1} tok/s", n as f64 / secs));
        }
        self.bar.inc();
        let last = self.left[cell].fetch_sub(1, Ordering::SeqCst) == 1;
        if last && self.cells.len() > 1 {
            self.bar
                .println(format!("finished {}", self.cells[cell].name));
        }
    }

    /// The compile slot an episode of a cell uses.
    fn slot(&self, cell: usize, ep: &Episode) -> CompileSlot {
        let cfg = &self.cells[cell].cfg;
        let key = match cfg.compiler {
            Source::Model => CompileKey::Model {
                thinking: cfg.thinking,
                brief: ep.brief.clone(),
                steps: ep.step_list(),
                revision: ep.revision.message.clone(),
            },
            Source::Oracle => CompileKey::Episode {
                cell,
                seed: ep.config.seed,
            },
        };
        let mut map = self.compiled.lock().expect("compile cache lock");
        map.entry(key).or_default().clone()
    }

    /// Compiles an episode's plan and revision; records why if it cannot.
    fn compile(&self, job: &CellJob<'_>, ep: &Episode) -> Option<Compiled> {
        match job.parts.compiler() {
            Ok(mut compiler) => Some(Compiled::compile(&mut *compiler, ep)),
            Err(e) => {
                self.fail(e);
                None
            }
        }
    }
}
