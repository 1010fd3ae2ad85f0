//! From a grid's cells to running them: the one path of `ladder cell` and
//! `ladder grid`. Flags or a grid file make [`Axes`](super::grid::Axes),
//! which [`Grid::new`](super::grid::Grid::new) crosses into cells with
//! every default settled and every value checked; here the cells get
//! their models and parts and run, each model's cells through one pool.

use std::path::PathBuf;

use super::cell::{
    run_cells, AgentSpec, CellConfig, CellError, CellJob, CellParts, CellProgress, EmbedderId,
    EmbedderSpec,
};
use super::grid::GridCell;
use super::runlog::Locking;
use crate::backend::shared::SharedBackend;
use crate::ladder::episode::generator::ParaphraseCache;
use crate::progress::Meter;
use crate::rundir::Identity;

/// What loads the models cells run on.
pub trait Loader {
    type Error: From<CellError>;
    /// The agent model: a grid's model spec, or the loader's own (its
    /// default model, or an endpoint) for None.
    fn model(&mut self, spec: Option<&str>) -> Result<SharedBackend, Self::Error>;
    /// An embedding model, in-process.
    fn embedder(&mut self, spec: &str) -> Result<SharedBackend, Self::Error>;
}

/// A cell to run into `out`: all its seeds, or a shard's.
pub struct Target<'a> {
    pub cell: &'a GridCell,
    pub out: PathBuf,
    pub seeds: Option<Vec<u64>>,
}

/// Runs cells, one engine per model, one model after another (in the
/// order the cells first name them); the cells of a model share its batch
/// and their compiles. Cells a shard gives no seeds are left alone.
pub fn run_targets<L: Loader>(
    targets: &[Target<'_>],
    loader: &mut L,
    locking: Locking<'_>,
    cache: Option<&ParaphraseCache>,
    concurrency: usize,
    bar: &Meter,
) -> Result<Vec<CellProgress>, L::Error> {
    let mut progress = vec![CellProgress { ran: 0, skipped: 0 }; targets.len()];
    let mut models: Vec<&Option<String>> = Vec::new();
    for t in targets {
        if !models.contains(&&t.cell.model) {
            models.push(&t.cell.model);
        }
    }
    let mut embedders = Vec::new();
    for model in models {
        let members: Vec<usize> = (0..targets.len())
            .filter(|&i| {
                let t = &targets[i];
                t.cell.model == *model && t.seeds.as_ref().is_none_or(|s| !s.is_empty())
            })
            .collect();
        let asked: Vec<CellConfig> = members.iter().map(|&i| asked(targets[i].cell)).collect();
        let shared = match asked.iter().any(CellConfig::needs_model) {
            true => Some(loader.model(model.as_deref())?),
            false => None,
        };
        let mut parts = Vec::new();
        for (&i, cfg) in members.iter().zip(asked) {
            let cell = targets[i].cell;
            parts.push(resolve(cell, cfg, shared.as_ref(), &mut embedders, loader)?);
        }
        let jobs: Vec<CellJob> = members
            .iter()
            .zip(&parts)
            .map(|(&i, (cfg, p))| CellJob {
                name: targets[i].cell.name.clone(),
                cfg: cfg.clone(),
                parts: p,
                out: targets[i].out.clone(),
                seeds: targets[i].seeds.clone(),
                locking,
            })
            .collect();
        let done = run_cells(&jobs, cache, concurrency, bar)?;
        for (&i, p) in members.iter().zip(done) {
            progress[i] = p;
        }
    }
    Ok(progress)
}

/// A cell's configuration with the embedder it was asked for, before any
/// model loads.
fn asked(cell: &GridCell) -> CellConfig {
    let mut cfg = cell.config.clone();
    match cell.embedder {
        Some(EmbedderSpec::Agent) => cfg.embedder = Some(EmbedderId::Agent),
        Some(EmbedderSpec::Lexical) => cfg.embedder = Some(EmbedderId::Lexical),
        Some(EmbedderSpec::Model(_)) | None => {}
    }
    cfg
}

/// A cell's final configuration and parts on its loaded model (None when
/// no cell of the model needs one): the model agent named by the model,
/// an embedding model loaded (once a run) where the cell asks for one, the
/// memory parts settled.
fn resolve<L: Loader>(
    cell: &GridCell,
    mut cfg: CellConfig,
    shared: Option<&SharedBackend>,
    embedders: &mut Vec<(String, SharedBackend)>,
    loader: &mut L,
) -> Result<(CellConfig, CellParts), L::Error> {
    let model = match (shared, &mut cfg.agent) {
        (Some(s), AgentSpec::Model { name }) => {
            *name = Some(s.model_id().name.clone());
            Identity::Model(s.model_id().clone())
        }
        (Some(s), AgentSpec::Scripted(_)) => Identity::Model(s.model_id().clone()),
        (None, AgentSpec::Scripted(_)) => Identity::Scripted {
            agent: cfg.agent.to_string(),
        },
        (None, AgentSpec::Model { .. }) => return Err(CellError::NoModel.into()),
    };
    let mut embedder = None;
    if let Some(EmbedderSpec::Model(spec)) = &cell.embedder {
        let at = match embedders.iter().position(|(s, _)| s == spec) {
            Some(at) => at,
            None => {
                embedders.push((spec.clone(), loader.embedder(spec)?));
                embedders.len() - 1
            }
        };
        let e: &SharedBackend = &embedders[at].1;
        cfg.embedder = Some(EmbedderId::Model(e.model_id().clone()));
        embedder = Some(e.client());
    }
    cfg.settle_memory(shared.is_some());
    let parts = CellParts {
        scripted: cfg.agent.scripted(),
        matcher: cfg.matcher,
        compiler: cfg.compiler,
        client: shared.map(|s| s.client()),
        embedder,
        thinking: cfg.thinking,
        model,
    };
    Ok((cfg, parts))
}
