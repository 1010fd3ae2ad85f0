//! A cell: one configuration (domain, S, ρ, brief, …) run over a seed range
//! on a list of arms, logged to a run directory and resumable.

use std::path::Path;

use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::agent::{Agent, Scripted};
use super::arm::Arm;
use super::domain::Domain;
use super::episode::{BriefVariant, EpisodeConfig, Protocol};
use super::generator::{generate, GenError, ParaphraseCache};
use super::live::{ModelAgent, ModelCompiler, ModelMatcher};
use super::module::{Compiler, Matcher, OracleCompiler, OracleMatcher};
use super::runlog::{git_commit, Manifest, RunDir, RunLogError, RUN_FORMAT};
use super::runner::{run_episode, Compiled, RunOptions};
use crate::backend::served::Client;

/// Everything a cell is a function of; stored in the manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellConfig {
    /// Template pool.
    pub domain: Domain,
    /// S.
    pub steps: usize,
    /// ρ.
    pub density: f64,
    /// Brief variant.
    pub brief: BriefVariant,
    /// Booking protocol.
    pub protocol: Protocol,
    /// Paraphrase tier.
    pub paraphrase_tier: u8,
    /// Ambiguous-probe rate.
    pub ambiguous_rate: f64,
    /// First seed.
    pub seed_start: u64,
    /// Number of episodes.
    pub episodes: u64,
    /// Arms, in ladder order (adjacent arms are contrasted).
    pub arms: Vec<Arm>,
    /// Agent identity.
    pub agent: String,
    /// Matcher identity.
    pub matcher: String,
    /// Compiler identity.
    pub compiler: String,
    /// Thinking regime (Qwen3 `enable_thinking`).
    #[serde(default)]
    pub thinking: bool,
    /// Run switches.
    pub options: RunOptions,
}

impl CellConfig {
    /// The episode configuration for one seed.
    pub fn episode(&self, seed: u64) -> EpisodeConfig {
        EpisodeConfig {
            domain: self.domain,
            steps: self.steps,
            density: self.density,
            seed,
            brief: self.brief,
            protocol: self.protocol,
            paraphrase_tier: self.paraphrase_tier,
            ambiguous_rate: self.ambiguous_rate,
        }
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
    Log(#[from] RunLogError),
    /// The model could not be reached.
    #[error("model: {0}")]
    Model(String),
}

/// What the models behind a cell are. A cell runs many episodes at once, so
/// every episode-arm gets its own agent and matcher (a conversation each).
pub trait Parts: Sync {
    /// A fresh agent for one episode-arm.
    fn agent(&self) -> Result<Box<dyn Agent + Send>, String>;
    /// A fresh matcher for one episode-arm.
    fn matcher(&self) -> Result<Box<dyn Matcher + Send>, String>;
    /// A compiler (one compile per episode, shared by the cell's module arms).
    fn compiler(&self) -> Result<Box<dyn Compiler + Send>, String>;
    /// Model identity for the manifest.
    fn model(&self) -> serde_json::Value;
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
/// matcher and compiler on one served model.
pub struct CellParts {
    /// The scripted agent, or None for the model agent.
    pub scripted: Option<Scripted>,
    /// Matcher source.
    pub matcher: Source,
    /// Compiler source.
    pub compiler: Source,
    /// The served model, when any part is model-backed.
    pub client: Option<Client>,
    /// Thinking regime.
    pub thinking: bool,
    /// Model identity for the manifest.
    pub model: serde_json::Value,
}

impl CellParts {
    /// A scripted agent with the oracle matcher and compiler.
    pub fn scripted(agent: Scripted) -> Self {
        CellParts {
            scripted: Some(agent),
            matcher: Source::Oracle,
            compiler: Source::Oracle,
            client: None,
            thinking: false,
            model: serde_json::json!({ "agent": agent.name() }),
        }
    }

    fn client(&self) -> Result<&Client, String> {
        self.client
            .as_ref()
            .ok_or_else(|| "a model-backed part needs --model".to_string())
    }
}

impl Parts for CellParts {
    fn agent(&self) -> Result<Box<dyn Agent + Send>, String> {
        match self.scripted {
            Some(s) => Ok(Box::new(s)),
            None => {
                let name = self
                    .model
                    .get("name")
                    .and_then(|v| v.as_str())
                    .unwrap_or("model");
                ModelAgent::new(self.client()?, self.thinking, format!("model:{name}"))
                    .map(|a| Box::new(a) as Box<dyn Agent + Send>)
                    .map_err(|e| e.to_string())
            }
        }
    }
    fn matcher(&self) -> Result<Box<dyn Matcher + Send>, String> {
        match self.matcher {
            Source::Oracle => Ok(Box::new(OracleMatcher)),
            Source::Model => ModelMatcher::new(self.client()?, self.thinking)
                .map(|m| Box::new(m) as Box<dyn Matcher + Send>)
                .map_err(|e| e.to_string()),
        }
    }
    fn compiler(&self) -> Result<Box<dyn Compiler + Send>, String> {
        match self.compiler {
            Source::Oracle => Ok(Box::new(OracleCompiler)),
            Source::Model => Ok(Box::new(ModelCompiler::new(self.client()?, self.thinking))),
        }
    }
    fn model(&self) -> serde_json::Value {
        self.model.clone()
    }
}

/// One episode's compile, done once by whichever worker needs it first.
type CompileSlot = Arc<OnceLock<Result<Compiled, String>>>;

/// Summary of a cell run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CellProgress {
    /// Episode-arms run now.
    pub ran: usize,
    /// Episode-arms skipped as already finished.
    pub skipped: usize,
}

/// Runs (or resumes) a cell into `out`, with at most `live` episode-arms in
/// flight at once (each a thread that waits on the model most of the time;
/// the served backend batches their requests).
pub fn run_cell(
    cfg: &CellConfig,
    parts: &dyn Parts,
    cache: Option<&ParaphraseCache>,
    out: &Path,
    live: usize,
    progress: bool,
) -> Result<CellProgress, CellError> {
    // Check the configuration before touching the directory.
    super::generator::validate(&cfg.episode(cfg.seed_start))?;
    let manifest = Manifest {
        format: RUN_FORMAT.to_string(),
        config: serde_json::to_value(cfg).expect("config serializes"),
        model: parts.model(),
        crate_version: env!("CARGO_PKG_VERSION").to_string(),
        git_commit: git_commit(),
    };
    let dir = RunDir::open(out, &manifest)?;
    let total = cfg.episodes as usize * cfg.arms.len();
    let jobs: Vec<(u64, Arm)> = cfg
        .seeds()
        .flat_map(|s| cfg.arms.iter().map(move |a| (s, *a)))
        .filter(|(s, a)| !dir.is_finished(*s, *a))
        .collect();
    let skipped = total - jobs.len();
    let bar = if progress {
        let b = ProgressBar::new(total as u64);
        b.set_style(
            ProgressStyle::with_template(
                "{bar:40} {pos}/{len} episode-arms  {per_sec}  eta {eta}  {msg}",
            )
            .expect("static template"),
        );
        b.set_position(skipped as u64);
        b
    } else {
        ProgressBar::hidden()
    };
    // One compile per episode, shared by the module arms; the first worker
    // to need it compiles, the others wait for it.
    let needs_compile = cfg.arms.iter().any(|a| a.uses_module());
    let compiled: Mutex<HashMap<u64, CompileSlot>> = Mutex::new(HashMap::new());
    let next = AtomicUsize::new(0);
    let failed: Mutex<Option<CellError>> = Mutex::new(None);
    let dir = Mutex::new(dir);
    let tokens = AtomicUsize::new(0);
    let started = std::time::Instant::now();
    let work = || loop {
        if failed.lock().map(|f| f.is_some()).unwrap_or(true) {
            return;
        }
        let i = next.fetch_add(1, Ordering::SeqCst);
        let Some(&(seed, arm)) = jobs.get(i) else {
            return;
        };
        let fail = |e: CellError| {
            if let Ok(mut f) = failed.lock() {
                f.get_or_insert(e);
            }
        };
        let ep = match generate(&cfg.episode(seed), cache) {
            Ok(ep) => ep,
            Err(e) => return fail(e.into()),
        };
        let slot = compiled
            .lock()
            .map(|mut m| m.entry(seed).or_default().clone())
            .expect("compile cache lock");
        let comp = if needs_compile && arm.uses_module() {
            let c = slot.get_or_init(|| {
                let mut compiler = parts.compiler()?;
                Ok(Compiled::compile(&mut *compiler, &ep))
            });
            match c {
                Ok(c) => Some(c),
                Err(e) => return fail(CellError::Model(e.clone())),
            }
        } else {
            None
        };
        let (mut agent, mut matcher) = match (parts.agent(), parts.matcher()) {
            (Ok(a), Ok(m)) => (a, m),
            (Err(e), _) | (_, Err(e)) => return fail(CellError::Model(e)),
        };
        let (rec, turns) = run_episode(&ep, arm, &mut *agent, &mut *matcher, comp, &cfg.options);
        let n = tokens.fetch_add(rec.usage.completion_tokens, Ordering::SeqCst)
            + rec.usage.completion_tokens;
        let appended = dir
            .lock()
            .map_err(|_| ())
            .map(|mut d| d.append(&rec, &turns));
        match appended {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return fail(e.into()),
            Err(()) => return,
        }
        if n > 0 {
            bar.set_message(format!(
                "{:.1} tok/s",
                n as f64 / started.elapsed().as_secs_f64()
            ));
        }
        bar.inc(1);
    };
    let workers = live.max(1).min(jobs.len());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(work);
        }
    });
    bar.finish_and_clear();
    if let Some(e) = failed.into_inner().ok().flatten() {
        return Err(e);
    }
    let ran = next.load(Ordering::SeqCst).min(jobs.len());
    Ok(CellProgress { ran, skipped })
}
