//! A cell: one configuration (domain, S, ρ, brief, …) run over a seed range
//! on a list of arms, logged to a run directory and resumable.

use std::path::Path;

use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use super::agent::Agent;
use super::arm::Arm;
use super::domain::Domain;
use super::episode::{BriefVariant, EpisodeConfig, Protocol};
use super::generator::{generate, GenError, ParaphraseCache};
use super::module::{Compiler, Matcher};
use super::runlog::{git_commit, Manifest, RunDir, RunLogError, RUN_FORMAT};
use super::runner::{run_episode, Compiled, RunOptions};

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
}

/// What the models behind a cell are.
pub struct Parts<'a> {
    /// The agent.
    pub agent: &'a mut dyn Agent,
    /// The matcher.
    pub matcher: &'a mut dyn Matcher,
    /// The compiler.
    pub compiler: &'a mut dyn Compiler,
    /// Model identity for the manifest.
    pub model: serde_json::Value,
}

/// Summary of a cell run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CellProgress {
    /// Episode-arms run now.
    pub ran: usize,
    /// Episode-arms skipped as already finished.
    pub skipped: usize,
}

/// Runs (or resumes) a cell into `out`.
pub fn run_cell(
    cfg: &CellConfig,
    parts: Parts,
    cache: Option<&ParaphraseCache>,
    out: &Path,
    progress: bool,
) -> Result<CellProgress, CellError> {
    // Check the configuration before touching the directory.
    super::generator::validate(&cfg.episode(cfg.seed_start))?;
    let manifest = Manifest {
        format: RUN_FORMAT.to_string(),
        config: serde_json::to_value(cfg).expect("config serializes"),
        model: parts.model.clone(),
        crate_version: env!("CARGO_PKG_VERSION").to_string(),
        git_commit: git_commit(),
    };
    let mut dir = RunDir::open(out, &manifest)?;
    let total = cfg.episodes as usize * cfg.arms.len();
    let bar = if progress {
        let b = ProgressBar::new(total as u64);
        b.set_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} episode-arms  {per_sec}  eta {eta}")
                .expect("static template"),
        );
        b.set_position(dir.finished() as u64);
        b
    } else {
        ProgressBar::hidden()
    };
    let mut p = CellProgress { ran: 0, skipped: 0 };
    for seed in cfg.seeds() {
        if cfg.arms.iter().all(|a| dir.is_finished(seed, *a)) {
            p.skipped += cfg.arms.len();
            continue;
        }
        let ep = generate(&cfg.episode(seed), cache)?;
        // One compile per episode, shared by the module arms of the cell.
        let compiled = cfg.arms.iter().any(|a| a.uses_module()).then(|| {
            let (graph, a) = parts.compiler.compile_graph(&ep);
            let (revision, b) = parts.compiler.compile_revision(&ep);
            Compiled {
                graph,
                revision,
                cost: vec![a, b],
            }
        });
        for &arm in &cfg.arms {
            if dir.is_finished(seed, arm) {
                p.skipped += 1;
                continue;
            }
            let (rec, turns) = run_episode(
                &ep,
                arm,
                &mut *parts.agent,
                &mut *parts.matcher,
                compiled.as_ref(),
                &cfg.options,
            );
            dir.append(&rec, &turns)?;
            p.ran += 1;
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    Ok(p)
}
