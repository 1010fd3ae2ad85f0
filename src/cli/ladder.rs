//! `statebench ladder …` and the quick start `statebench run`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use serde::Serialize;

use statebench::backend::shared::SharedBackend;
use statebench::ladder::arms::memory::MemoryKind;
use statebench::ladder::arms::Arm;
use statebench::ladder::episode::domain::Domain;
use statebench::ladder::episode::generator::{generate, ParaphraseCache};
use statebench::ladder::episode::paraphrase::{self, RewriteOptions};
use statebench::ladder::episode::{BriefVariant, EpisodeConfig, Protocol, StepId};
use statebench::ladder::parts::scripted::Scripted;
use statebench::ladder::parts::Agent;
use statebench::ladder::report::{self, Format};
use statebench::ladder::run::cell::{
    progress_bar, run_cell, run_cells, CellConfig, CellJob, CellParts, EmbedderId, Parts, Source,
};
use statebench::ladder::run::grid::{read_runs, AgentKind, Axes, Grid, GridManifest, Shard, FLAGS};
use statebench::ladder::run::replay::{read_episode, read_replies, score_replies, EpisodeFile};
use statebench::ladder::run::runlog::{read_run, Locking};
use statebench::ladder::run::runner::RunOptions;
use statebench::ladder::score::{perfect_labels, ChannelCounts, Label, Violation};
use statebench::rundir::{DirLock, Identity};

use super::{emit, BackendArgs};

#[derive(Subcommand)]
pub enum LadderCommand {
    /// Print one episode: the brief, the schedule and the perfect agent's labels.
    Episode(EpisodeArgs),
    /// Run (or resume) a cell of episodes on a list of arms into a run directory.
    Cell(CellArgs),
    /// Run (or resume) a grid of cells in one process, or one shard of it.
    Grid(Box<GridArgs>),
    /// Report one or more run directories.
    Report(ReportArgs),
    /// Score replies produced elsewhere against an episode.
    Score(ScoreArgs),
    /// Write held-out (tier-2) rewrites of every ask, premature and redo wording with a model.
    Paraphrase(ParaphraseArgs),
}

pub fn run(c: LadderCommand) -> Result<()> {
    match c {
        LadderCommand::Episode(a) => episode(a),
        LadderCommand::Cell(a) => cell(a),
        LadderCommand::Grid(a) => grid(*a),
        LadderCommand::Report(a) => report_cmd(a),
        LadderCommand::Score(a) => score(a),
        LadderCommand::Paraphrase(a) => paraphrase_cmd(a),
    }
}

/// The inputs an episode is a function of.
#[derive(Args, Clone)]
pub struct EpisodeSpec {
    /// Template pool: procurement or release.
    #[arg(long, default_value = "procurement")]
    domain: Domain,
    /// Number of steps S (1..=18).
    #[arg(long, default_value_t = 10)]
    steps: usize,
    /// Extra-edge density ρ in [0, 1].
    #[arg(long, default_value_t = 0.15)]
    density: f64,
    /// Brief variant.
    #[arg(long, value_enum, default_value = "amended")]
    brief: BriefVariant,
    /// Booking protocol: text (ref lines), tool (ACTION lines) or native (tool calls stamping a workspace).
    #[arg(long, value_enum, default_value = "text")]
    protocol: Protocol,
    /// Paraphrase tier: 0 assigned, 1 rotated, 2 held-out rewrites (needs --paraphrase-cache).
    #[arg(long, default_value_t = 0)]
    paraphrase_tier: u8,
    /// Tier-2 rewrite cache (format in the README).
    #[arg(long)]
    paraphrase_cache: Option<PathBuf>,
    /// Rate at which filler turns become ambiguous probes, in [0, 1].
    #[arg(long, default_value_t = 0.0)]
    ambiguous_rate: f64,
}

impl EpisodeSpec {
    fn config(&self, seed: u64) -> EpisodeConfig {
        EpisodeConfig {
            brief: self.brief,
            protocol: self.protocol,
            paraphrase_tier: self.paraphrase_tier,
            ambiguous_rate: self.ambiguous_rate,
            ..EpisodeConfig::paper(self.domain, self.steps, self.density, seed)
        }
    }

    fn cache(&self) -> Result<Option<ParaphraseCache>> {
        Self::cache_from(&self.paraphrase_cache)
    }

    fn cache_from(path: &Option<PathBuf>) -> Result<Option<ParaphraseCache>> {
        Ok(match path {
            Some(p) => Some(ParaphraseCache::load(p)?),
            None => None,
        })
    }
}

#[derive(Args)]
pub struct EpisodeArgs {
    #[command(flatten)]
    spec: EpisodeSpec,
    /// Episode seed.
    #[arg(long, default_value_t = 100)]
    seed: u64,
    /// Print the episode as JSON (the input of `ladder score`).
    #[arg(long)]
    json: bool,
}

/// Which agent runs the episodes.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum AgentArg {
    /// The scripted perfect agent (replays ground truth).
    Perfect,
    /// The memoryless policy that books every request.
    AlwaysBook,
    /// The model given by --model (default: the default GGUF).
    Model,
}

#[derive(Args)]
pub struct CellArgs {
    #[command(flatten)]
    spec: EpisodeSpec,
    /// Agent: perfect, always-book or model.
    #[arg(long, value_enum, default_value = "perfect")]
    agent: AgentArg,
    #[command(flatten)]
    backend: BackendArgs,
    /// Matcher: oracle (scripted step) or model. Default: model with --agent model, else oracle.
    #[arg(long, value_enum)]
    matcher: Option<Source>,
    /// Compiler: oracle (generator's graph) or model. Default: model with --agent model, else oracle.
    #[arg(long, value_enum)]
    compiler: Option<Source>,
    /// Embedder of the retrieval-memory arms: `agent` (the agent model's
    /// final hidden state), `lexical` (hashed bag of words), or a Qwen
    /// checkpoint (e.g. a Qwen3-Embedding-0.6B directory), loaded in-process.
    /// Default: agent when a model runs, else lexical.
    #[arg(long)]
    embedder: Option<String>,
    /// Writer of the mem0 arms' facts: oracle (the realized state) or model.
    /// Default: as the matcher.
    #[arg(long, value_enum)]
    memory_writer: Option<Source>,
    /// Comma-separated arms, in ladder order (adjacent arms are contrasted).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "raw,checklist,directive,enforce"
    )]
    arms: Vec<Arm>,
    /// Number of episodes.
    #[arg(long, default_value_t = 128)]
    episodes: u64,
    /// First seed.
    #[arg(long, default_value_t = 100)]
    seed_start: u64,
    /// Run directory (resumed if it holds a partial run of the same configuration).
    #[arg(long)]
    out: PathBuf,
    /// Corrupted-state ablation: flip done bits and drop edges at this rate per step-turn.
    #[arg(long)]
    corrupt: Option<f64>,
    /// Run the matcher on filler and revision turns too.
    #[arg(long)]
    no_bypass: bool,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

/// The quick start: a small live ladder on the default model.
#[derive(Args)]
pub struct RunArgs {
    /// Episodes per arm.
    #[arg(long, default_value_t = 4)]
    episodes: u64,
    /// Number of steps S.
    #[arg(long, default_value_t = 5)]
    steps: usize,
    /// Run directory.
    #[arg(long, default_value = "runs/quickstart")]
    out: PathBuf,
    #[command(flatten)]
    backend: BackendArgs,
}

#[derive(Args)]
pub struct GridArgs {
    /// Grid file (TOML; keys as the flags below, lists for axes, `[[cross]]`
    /// tables for unions of crosses). Flags replace the file's top-level keys.
    file: Option<PathBuf>,
    /// Template pools.
    #[arg(long, value_delimiter = ',')]
    domain: Option<Vec<Domain>>,
    /// Graph sizes S.
    #[arg(long, value_delimiter = ',')]
    steps: Option<Vec<usize>>,
    /// Extra-edge densities ρ.
    #[arg(long, value_delimiter = ',')]
    density: Option<Vec<f64>>,
    /// Brief variants.
    #[arg(long, value_enum, value_delimiter = ',')]
    brief: Option<Vec<BriefVariant>>,
    /// Booking protocols.
    #[arg(long, value_enum, value_delimiter = ',')]
    protocol: Option<Vec<Protocol>>,
    /// Paraphrase tiers.
    #[arg(long, value_delimiter = ',')]
    paraphrase_tier: Option<Vec<u8>>,
    /// Tier-2 rewrite cache.
    #[arg(long)]
    paraphrase_cache: Option<PathBuf>,
    /// Ambiguous-probe rates.
    #[arg(long, value_delimiter = ',')]
    ambiguous_rate: Option<Vec<f64>>,
    /// Thinking regimes, e.g. false,true (--think alone means true).
    #[arg(long, value_delimiter = ',')]
    thinking: Option<Vec<bool>>,
    /// Arms of every cell, in ladder order.
    #[arg(long, value_delimiter = ',')]
    arms: Option<Vec<Arm>>,
    /// Agent: perfect, always-book or model (default perfect).
    #[arg(long, value_enum)]
    agent: Option<AgentKind>,
    /// Matcher (default: model with --agent model, else oracle).
    #[arg(long, value_enum)]
    matcher: Option<Source>,
    /// Compiler (default: model with --agent model, else oracle).
    #[arg(long, value_enum)]
    compiler: Option<Source>,
    /// Episodes per cell (default 128).
    #[arg(long)]
    episodes: Option<u64>,
    /// First seed of every cell (default 100).
    #[arg(long)]
    seed_start: Option<u64>,
    #[command(flatten)]
    backend: BackendArgs,
    /// Grid directory: grid.json and one run directory per cell.
    #[arg(long, required_unless_present = "dry_run")]
    out: Option<PathBuf>,
    /// Run part i of n (0-based), e.g. 0/4. Default: from
    /// SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT, or JOB_COMPLETION_INDEX
    /// with STATEBENCH_SHARD_COUNT; else the whole grid.
    #[arg(long)]
    shard: Option<String>,
    /// List the cells and their episodes, run nothing.
    #[arg(long)]
    dry_run: bool,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

impl GridArgs {
    /// The axes the flags set.
    fn axes(&self) -> Axes {
        Axes {
            domain: self.domain.clone(),
            steps: self.steps.clone(),
            density: self.density.clone(),
            brief: self.brief.clone(),
            protocol: self.protocol.clone(),
            paraphrase_tier: self.paraphrase_tier.clone(),
            ambiguous_rate: self.ambiguous_rate.clone(),
            thinking: self
                .thinking
                .clone()
                .or_else(|| self.backend.think.then(|| vec![true])),
            model: self.backend.model.model.clone().map(|m| vec![m]),
            arms: self.arms.clone(),
            agent: self.agent,
            matcher: self.matcher,
            compiler: self.compiler,
            episodes: self.episodes,
            seed_start: self.seed_start,
            cross: Vec::new(),
        }
    }
}

#[derive(Args)]
pub struct ReportArgs {
    /// Run directories and grid directories (shards of one grid are merged).
    #[arg(required = true)]
    dirs: Vec<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    format: ReportFormat,
    /// Where to write: a directory for svg (required), a file for the
    /// others (default: standard output).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Seeds per cell the HTML episode browser holds.
    #[arg(long, default_value_t = 16)]
    browse_seeds: usize,
}

/// What `ladder report` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ReportFormat {
    /// Aligned terminal tables.
    Text,
    /// Markdown tables.
    Md,
    /// Comma-separated values, one row per cell and arm.
    Csv,
    /// The JSON document described in the README.
    Json,
    /// The figures, one SVG file each, into the --out directory.
    Svg,
    /// One self-contained HTML page: tables, figures, episode browser.
    Html,
}

#[derive(Args)]
pub struct ScoreArgs {
    /// Episode file written by `ladder episode --json`.
    #[arg(long)]
    episode: PathBuf,
    /// Replies, one `{"turn": i, "reply": "…"}` JSON line per turn.
    #[arg(long)]
    replies: PathBuf,
    /// Arm whose gate (if any) the replies are played through.
    #[arg(long, default_value = "raw")]
    arm: Arm,
}

#[derive(Args)]
pub struct ParaphraseArgs {
    /// Output cache file (the --paraphrase-cache of tier 2).
    #[arg(long)]
    out: PathBuf,
    /// Domains to rewrite (default: both).
    #[arg(long, value_delimiter = ',', default_value = "procurement,release")]
    domains: Vec<Domain>,
    /// Sampling temperature.
    #[arg(long, default_value_t = 0.7)]
    temperature: f32,
    /// Base seed of the sampler.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[command(flatten)]
    backend: BackendArgs,
}

fn episode(a: EpisodeArgs) -> Result<()> {
    let cache = a.spec.cache()?;
    let ep = generate(&a.spec.config(a.seed), cache.as_ref())?;
    let labels = perfect_labels(&ep);
    if a.json {
        let f = EpisodeFile {
            episode: ep,
            perfect_labels: labels,
        };
        return emit(&(serde_json::to_string_pretty(&f)? + "\n"));
    }
    let mut out = format!(
        "BRIEF\n{}\n\nREVISION at turn {}: {}\n\nSCHEDULE (turn, kind, step: message -> perfect agent)\n",
        ep.brief, ep.revision.turn, ep.revision.message
    );
    for (t, l) in ep.turns.iter().zip(&labels) {
        let step = t.step.map(|s| s.to_string()).unwrap_or_else(|| "-".into());
        out += &format!(
            "{:>2} {:<14} {:<3} {}\n   -> {}\n",
            t.index,
            t.kind.name(),
            step,
            t.message,
            l.describe()
        );
    }
    emit(&out)
}

/// Runs a cell and prints its report.
fn run_and_report(
    cfg: &CellConfig,
    parts: &dyn Parts,
    cache: Option<&ParaphraseCache>,
    out: &Path,
    concurrency: usize,
    quiet: bool,
) -> Result<()> {
    let started = std::time::Instant::now();
    let p = run_cell(cfg, parts, cache, out, concurrency, !quiet)
        .with_context(|| format!("cell {}", out.display()))?;
    eprintln!(
        "{}: ran {} episode-arms in {:.1} s, {} already finished",
        out.display(),
        p.ran,
        started.elapsed().as_secs_f64(),
        p.skipped
    );
    let run = read_run(out)?;
    emit(&report::render(&report::build(&[run]), Format::Text))
}

fn cell(a: CellArgs) -> Result<()> {
    if let Some(e) = a.corrupt {
        if !(0.0..=1.0).contains(&e) {
            bail!("--corrupt must be in [0, 1], got {e}");
        }
    }
    let cache = a.spec.cache()?;
    let base = a.spec.config(a.seed_start);
    let scripted = match a.agent {
        AgentArg::Perfect => Some(Scripted::Perfect),
        AgentArg::AlwaysBook => Some(Scripted::AlwaysBook),
        AgentArg::Model => None,
    };
    let default = if scripted.is_some() {
        Source::Oracle
    } else {
        Source::Model
    };
    let matcher = a.matcher.unwrap_or(default);
    let compiler = a.compiler.unwrap_or(default);
    let mut cfg = CellConfig::paper(&base, a.episodes, String::new(), matcher);
    cfg.compiler = compiler;
    cfg.arms = a.arms.clone();
    cfg.thinking = a.backend.think;
    cfg.options = RunOptions {
        bypass_matcher: !a.no_bypass,
        corrupt: a.corrupt,
    };
    cfg.memory_writer = a.memory_writer;
    let embedder_path = match a.embedder.as_deref() {
        None => None,
        Some("agent") => {
            cfg.embedder = Some(EmbedderId::Agent);
            None
        }
        Some("lexical") => {
            cfg.embedder = Some(EmbedderId::Lexical);
            None
        }
        Some(path) => Some(path.to_string()),
    };
    let memory_model = cfg.uses_memory()
        && (cfg.embedder == Some(EmbedderId::Agent)
            || (cfg.memory_writer == Some(Source::Model)
                && cfg
                    .arms
                    .iter()
                    .any(|a| a.spec().memory() == Some(MemoryKind::Facts))));
    let needs_model =
        scripted.is_none() || matcher == Source::Model || compiler == Source::Model || memory_model;
    cfg.settle_memory(needs_model);
    // Fail on a bad configuration before loading a model.
    cfg.validate()?;
    let shared = needs_model.then(|| a.backend.spawn()).transpose()?;
    let embedder = match embedder_path.filter(|_| cfg.uses_memory()) {
        Some(path) => {
            let mut m = a.backend.model.clone();
            m.model = Some(path);
            let e = SharedBackend::spawn(m.load()?)?;
            cfg.embedder = Some(EmbedderId::Model(e.model_id().clone()));
            Some(e)
        }
        None => None,
    };
    let model = shared.as_ref().map(|(_, id)| id.clone());
    cfg.agent = match (scripted, &model) {
        (Some(s), _) => s.name(),
        (None, Some(m)) => format!("model:{}", m.name),
        (None, None) => unreachable!("a model agent loads a model"),
    };
    let agent = cfg.agent.clone();
    let parts = CellParts {
        scripted,
        matcher,
        compiler,
        client: shared.as_ref().map(|(s, _)| s.client()),
        embedder: embedder.as_ref().map(|e| e.client()),
        thinking: a.backend.think,
        model: match model {
            Some(m) => Identity::Model(m),
            None => Identity::Scripted { agent },
        },
    };
    run_and_report(
        &cfg,
        &parts,
        cache.as_ref(),
        &a.out,
        a.backend.concurrency,
        a.quiet,
    )
}

/// `statebench run`: the quick start's cell on a model.
pub fn quickstart(a: RunArgs) -> Result<()> {
    let (shared, model) = a.backend.spawn()?;
    let mut cfg = CellConfig::quickstart(&model.name, a.steps, a.episodes);
    cfg.thinking = a.backend.think;
    let parts = CellParts::model(shared.client(), model, a.backend.think);
    run_and_report(&cfg, &parts, None, &a.out, a.backend.concurrency, false)
}

fn paraphrase_cmd(a: ParaphraseArgs) -> Result<()> {
    let (shared, model) = a.backend.spawn()?;
    let opts = RewriteOptions {
        temperature: a.temperature,
        seed: a.seed,
        concurrency: a.backend.concurrency,
    };
    let cache = paraphrase::rewrite(&shared.client(), &model.name, &a.domains, opts)
        .context("paraphrase")?;
    let text = serde_json::to_string_pretty(&cache)? + "\n";
    std::fs::write(&a.out, text).with_context(|| format!("writing {}", a.out.display()))?;
    eprintln!(
        "{}: {} templates x 3 families x 3 rewrites by {}",
        a.out.display(),
        cache.templates.len(),
        model.name
    );
    Ok(())
}

fn report_cmd(a: ReportArgs) -> Result<()> {
    let runs = read_runs(&a.dirs)?;
    let r = report::build(&runs);
    let text = match a.format {
        ReportFormat::Text => report::render(&r, Format::Text),
        ReportFormat::Md => report::render(&r, Format::Md),
        ReportFormat::Csv => report::render(&r, Format::Csv),
        ReportFormat::Json => report::render(&r, Format::Json),
        ReportFormat::Html => report::html::page(&r, &runs, a.browse_seeds)?,
        ReportFormat::Svg => {
            let Some(dir) = &a.out else {
                bail!("--format svg writes one file per figure: give a directory with --out");
            };
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            for f in report::html::all_figures(&r, &runs)? {
                let path = dir.join(format!("{}.svg", f.name));
                std::fs::write(&path, &f.svg)
                    .with_context(|| format!("writing {}", path.display()))?;
                eprintln!("{}: {}", path.display(), f.title);
            }
            return Ok(());
        }
    };
    match &a.out {
        Some(path) => {
            std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
        }
        None => emit(&text),
    }
}

fn grid(a: GridArgs) -> Result<()> {
    let (axes, source) = match &a.file {
        Some(f) => (Axes::read(f)?, f.display().to_string()),
        None => (Axes::default(), FLAGS.to_string()),
    };
    let grid = Grid::new(axes.overlay(a.axes()), &source)?;
    let shard = match &a.shard {
        Some(s) => Some(s.parse::<Shard>()?),
        None => Shard::from_env()?,
    };
    let seeds: Vec<Option<Vec<u64>>> = match shard {
        Some(s) => s.seeds(&grid).into_iter().map(Some).collect(),
        None => vec![None; grid.cells.len()],
    };
    let count = |i: usize| match &seeds[i] {
        Some(s) => s.len() as u64,
        None => grid.cells[i].config.episodes,
    };
    if a.dry_run {
        let mut out = String::new();
        let mut total = 0;
        for (i, c) in grid.cells.iter().enumerate() {
            let n = count(i) * c.config.arms.len() as u64;
            total += n;
            out += &format!(
                "{:<40} {:>5} episodes x {} arms = {:>6} episode-arms\n",
                c.name,
                count(i),
                c.config.arms.len(),
                n
            );
        }
        out += &format!(
            "{} cells, {total} episode-arms{}\n",
            grid.cells.len(),
            match shard {
                Some(s) => format!(
                    " in shard {}/{} (grid {})",
                    s.index,
                    s.count,
                    grid.episode_arms()
                ),
                None => String::new(),
            }
        );
        return emit(&out);
    }
    let out = a
        .out
        .clone()
        .expect("clap requires --out without --dry-run");
    if a.backend.endpoint.is_some() && grid.cells.iter().any(|c| c.model.is_some()) {
        bail!("{source}: model = [...] names in-process models; with --endpoint leave it out");
    }
    let cache = EpisodeSpec::cache_from(&a.paraphrase_cache)?;
    let lock = DirLock::acquire(&out)?;
    GridManifest::new(&grid, shard).create_or_check(&out)?;
    let started = std::time::Instant::now();
    let bar = progress_bar(!a.quiet);
    // One engine per model, one after another; every cell of a model
    // shares its batch.
    let mut models: Vec<Option<String>> = Vec::new();
    for c in &grid.cells {
        if !models.contains(&c.model) {
            models.push(c.model.clone());
        }
    }
    let mut ran = 0;
    for model in models {
        let members: Vec<usize> = (0..grid.cells.len())
            .filter(|&i| grid.cells[i].model == model && count(i) > 0)
            .collect();
        let needs_model = members.iter().any(|&i| {
            let g = &grid.cells[i].config;
            g.agent == "model" || g.matcher == Source::Model || g.compiler == Source::Model
        });
        let mut backend = a.backend.clone();
        if model.is_some() {
            backend.model.model = model.clone();
        }
        let shared = needs_model.then(|| backend.spawn()).transpose()?;
        let parts: Vec<CellParts> = members
            .iter()
            .map(|&i| {
                let g = &grid.cells[i].config;
                let scripted = match g.agent.as_str() {
                    "model" => None,
                    name => name.strip_prefix("scripted:").and_then(|n| n.parse().ok()),
                };
                CellParts {
                    scripted,
                    matcher: g.matcher,
                    compiler: g.compiler,
                    client: shared.as_ref().map(|(s, _)| s.client()),
                    embedder: None,
                    thinking: g.thinking,
                    model: match (&shared, scripted) {
                        (Some((_, id)), _) => Identity::Model(id.clone()),
                        (None, Some(s)) => Identity::Scripted { agent: s.name() },
                        (None, None) => unreachable!("a model agent loads a model"),
                    },
                }
            })
            .collect();
        let jobs: Vec<CellJob> = members
            .iter()
            .zip(&parts)
            .map(|(&i, p)| {
                let c = &grid.cells[i];
                let mut cfg = c.config.clone();
                cfg.settle_memory(p.client.is_some());
                if let (None, Identity::Model(id)) = (p.scripted, &p.model) {
                    cfg.agent = format!("model:{}", id.name);
                }
                CellJob {
                    name: c.name.clone(),
                    cfg,
                    parts: p,
                    out: out.join(&c.name),
                    seeds: seeds[i].clone(),
                    locking: Locking::Grid(&lock),
                }
            })
            .collect();
        let done = run_cells(&jobs, cache.as_ref(), a.backend.concurrency, &bar)
            .with_context(|| format!("grid {}", out.display()))?;
        ran += done.iter().map(|p| p.ran).sum::<usize>();
    }
    bar.finish();
    eprintln!(
        "{}: ran {ran} episode-arms in {:.1} s",
        out.display(),
        started.elapsed().as_secs_f64()
    );
    let runs = read_runs(std::slice::from_ref(&out))?;
    emit(&report::render(&report::build(&runs), Format::Md))
}

/// What `ladder score` prints.
#[derive(Serialize)]
struct ScoreOutput {
    arm: Arm,
    strict: bool,
    channels: ChannelCounts,
    decline_aware: DeclineAwareOutput,
    turns_correct: u32,
    refused: u32,
    turns: Vec<TurnOutput>,
}

#[derive(Serialize)]
struct DeclineAwareOutput {
    strict: bool,
    channels: ChannelCounts,
}

#[derive(Serialize)]
struct TurnOutput {
    turn: usize,
    kind: statebench::ladder::episode::TurnKind,
    step: Option<StepId>,
    label: Label,
    bookings: Vec<statebench::ladder::arms::Booking>,
    violations: Vec<Violation>,
    violations_decline_aware: Vec<Violation>,
}

fn score(a: ScoreArgs) -> Result<()> {
    let ep = read_episode(&a.episode)?;
    let replies = read_replies(&a.replies, ep.turns.len())?;
    let (rec, turns) = score_replies(&ep, &replies, a.arm)?;
    let out = ScoreOutput {
        arm: a.arm,
        strict: rec.primary.strict,
        channels: rec.primary.channels,
        decline_aware: DeclineAwareOutput {
            strict: rec.decline_aware.strict,
            channels: rec.decline_aware.channels,
        },
        turns_correct: rec.primary.turns_correct,
        refused: rec.refused,
        turns: turns
            .into_iter()
            .map(|t| TurnOutput {
                turn: t.turn,
                kind: t.kind,
                step: t.step,
                label: t.label,
                bookings: t.bookings,
                violations: t.violations,
                violations_decline_aware: t.violations_decline_aware,
            })
            .collect(),
    };
    // Keys sorted, as this output always has had them.
    let out = statebench::rundir::manifest::sort_keys(serde_json::to_value(&out)?);
    emit(&(serde_json::to_string_pretty(&out)? + "\n"))
}
