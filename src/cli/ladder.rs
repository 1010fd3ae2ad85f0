//! `statebench ladder …` and the quick start `statebench run`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use serde::Serialize;

use statebench::backend::shared::SharedBackend;
use statebench::ladder::arms::Arm;
use statebench::ladder::episode::domain::Domain;
use statebench::ladder::episode::generator::{generate, ParaphraseCache};
use statebench::ladder::episode::paraphrase::{self, RewriteOptions};
use statebench::ladder::episode::{EpisodeSettings, StepId};
use statebench::ladder::report::{self, Format};
use statebench::ladder::run::cell::{progress_bar, AgentSpec, CellProgress};
use statebench::ladder::run::grid::{read_runs, Axes, Grid, GridManifest, Shard, FLAGS};
use statebench::ladder::run::replay::{read_episode, read_replies, score_replies, EpisodeFile};
use statebench::ladder::run::resolve::{run_targets, Loader, Target};
use statebench::ladder::run::runlog::{read_run, Locking};
use statebench::ladder::score::{perfect_labels, ChannelCounts, Label, Violation};
use statebench::rundir::DirLock;

use super::{emit, BackendArgs};

#[derive(Subcommand)]
pub enum LadderCommand {
    /// Print one episode: the brief, the schedule and the perfect agent's labels.
    Episode(EpisodeArgs),
    /// Run (or resume) a cell of episodes on a list of arms into a run directory.
    Cell(Box<CellArgs>),
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
        LadderCommand::Cell(a) => cell(*a),
        LadderCommand::Grid(a) => grid(*a),
        LadderCommand::Report(a) => report_cmd(a),
        LadderCommand::Score(a) => score(a),
        LadderCommand::Paraphrase(a) => paraphrase_cmd(a),
    }
}

#[derive(Args)]
pub struct EpisodeArgs {
    #[command(flatten)]
    settings: EpisodeSettings,
    /// Tier-2 rewrite cache (format in the book: docs/src/testbed.md).
    #[arg(long)]
    paraphrase_cache: Option<PathBuf>,
    /// Episode seed.
    #[arg(long, default_value_t = 100)]
    seed: u64,
    /// Print the episode as JSON (the input of `ladder score`).
    #[arg(long)]
    json: bool,
}

/// What `ladder cell` and `ladder grid` both take: a cell's settings (a
/// grid's axes: lists), the model, the rewrite cache.
#[derive(Args)]
pub struct CellFlags {
    #[command(flatten)]
    axes: Axes,
    #[command(flatten)]
    backend: BackendArgs,
    /// Tier-2 rewrite cache (format in the book: docs/src/testbed.md).
    #[arg(long)]
    paraphrase_cache: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

#[derive(Args)]
pub struct CellArgs {
    #[command(flatten)]
    flags: CellFlags,
    /// Run directory (resumed if it holds a partial run of the same configuration).
    #[arg(long)]
    out: PathBuf,
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
    /// Grid file (TOML; keys as the flags, lists for axes, `[[cross]]`
    /// tables for unions of crosses). Flags replace the file's top-level keys.
    file: Option<PathBuf>,
    #[command(flatten)]
    flags: CellFlags,
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
}

/// What messages call the settings of `ladder cell`.
const CELL_FLAGS: &str = "cell flags";

impl CellFlags {
    /// The grid of the file's keys (if any) under the flags; `source`
    /// names the flags in messages where there is no file.
    fn grid(&self, file: Option<&Path>, source: &str) -> Result<Grid> {
        let (axes, source) = match file {
            Some(f) => (Axes::read(f)?, f.display().to_string()),
            None => (Axes::default(), source.to_string()),
        };
        let mut flags = self.axes.clone();
        flags.model = self.backend.model.model.clone().map(|m| vec![m]);
        if flags.thinking.is_none() && self.backend.think {
            flags.thinking = Some(vec![true]);
        }
        let grid = Grid::new(axes.overlay(flags), &source)?;
        if self.backend.endpoint.is_some() && grid.cells.iter().any(|c| c.model.is_some()) {
            bail!("{source}: model = [...] names in-process models; with --endpoint leave it out");
        }
        Ok(grid)
    }

    /// Runs cells on the models these flags load, with a progress bar.
    fn run(
        &self,
        targets: &[Target<'_>],
        locking: Locking<'_>,
        cache: Option<&ParaphraseCache>,
    ) -> Result<Vec<CellProgress>> {
        let bar = progress_bar(!self.quiet);
        let mut engines = Engines(&self.backend);
        let concurrency = self.backend.concurrency;
        let done = run_targets(targets, &mut engines, locking, cache, concurrency, &bar)?;
        bar.finish();
        Ok(done)
    }
}

/// Loads models as the backend flags say; a grid's model replaces --model.
struct Engines<'a>(&'a BackendArgs);

impl Loader for Engines<'_> {
    type Error = anyhow::Error;

    fn model(&mut self, spec: Option<&str>) -> Result<SharedBackend> {
        let mut backend = self.0.clone();
        if let Some(m) = spec {
            backend.model.model = Some(m.to_string());
        }
        Ok(backend.spawn()?.0)
    }

    fn embedder(&mut self, spec: &str) -> Result<SharedBackend> {
        let mut m = self.0.model.clone();
        m.model = Some(spec.to_string());
        Ok(SharedBackend::spawn(m.load()?)?)
    }
}

fn load_cache(path: &Option<PathBuf>) -> Result<Option<ParaphraseCache>> {
    Ok(match path {
        Some(p) => Some(ParaphraseCache::load(p)?),
        None => None,
    })
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
    /// The JSON document described in the book (docs/src/reports.md).
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
    let cache = load_cache(&a.paraphrase_cache)?;
    let ep = generate(&a.settings.at(a.seed), cache.as_ref())?;
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

fn cell(a: CellArgs) -> Result<()> {
    run_one(&a.flags, &a.out)
}

/// `statebench run`: the quick start's cell on a model.
pub fn quickstart(a: RunArgs) -> Result<()> {
    let axes = Axes {
        steps: Some(vec![a.steps]),
        episodes: Some(a.episodes),
        agent: Some(AgentSpec::Model { name: None }),
        ..Axes::default()
    };
    let flags = CellFlags {
        axes,
        backend: a.backend,
        paraphrase_cache: None,
        quiet: false,
    };
    run_one(&flags, &a.out)
}

/// Runs (or resumes) the one cell the flags make into `out`, and prints
/// its report.
fn run_one(flags: &CellFlags, out: &Path) -> Result<()> {
    let cache = load_cache(&flags.paraphrase_cache)?;
    let grid = flags.grid(None, CELL_FLAGS)?;
    let [cell] = grid.cells.as_slice() else {
        bail!(
            "{CELL_FLAGS}: the settings make {} cells; a cell takes one value of each (ladder grid runs several)",
            grid.cells.len()
        );
    };
    let target = Target {
        cell,
        out: out.to_path_buf(),
        seeds: None,
    };
    let started = Instant::now();
    let p = flags
        .run(&[target], Locking::Own, cache.as_ref())
        .with_context(|| format!("cell {}", out.display()))?;
    eprintln!(
        "{}: ran {} episode-arms in {:.1} s, {} already finished",
        out.display(),
        p[0].ran,
        started.elapsed().as_secs_f64(),
        p[0].skipped
    );
    let run = read_run(out)?;
    emit(&report::render(&report::build(&[run])?, Format::Text))
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
    let r = report::build(&runs)?;
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
    let grid = a.flags.grid(a.file.as_deref(), FLAGS)?;
    let shard = match &a.shard {
        Some(s) => Some(s.parse::<Shard>()?),
        None => Shard::from_env()?,
    };
    let seeds: Vec<Option<Vec<u64>>> = match shard {
        Some(s) => s.seeds(&grid).into_iter().map(Some).collect(),
        None => vec![None; grid.cells.len()],
    };
    if a.dry_run {
        return emit(&cell_list(&grid, &seeds, shard));
    }
    let out = a.out.expect("clap requires --out without --dry-run");
    let cache = load_cache(&a.flags.paraphrase_cache)?;
    let lock = DirLock::acquire(&out)?;
    GridManifest::new(&grid, shard).create_or_check(&out)?;
    let targets: Vec<Target> = grid
        .cells
        .iter()
        .zip(seeds)
        .map(|(cell, seeds)| Target {
            cell,
            out: out.join(&cell.name),
            seeds,
        })
        .collect();
    let started = Instant::now();
    let done = a
        .flags
        .run(&targets, Locking::Grid(&lock), cache.as_ref())
        .with_context(|| format!("grid {}", out.display()))?;
    eprintln!(
        "{}: ran {} episode-arms in {:.1} s",
        out.display(),
        done.iter().map(|p| p.ran).sum::<usize>(),
        started.elapsed().as_secs_f64()
    );
    let runs = read_runs(std::slice::from_ref(&out))?;
    emit(&report::render(&report::build(&runs)?, Format::Md))
}

/// `ladder grid --dry-run`: each cell with the episodes it (or the shard)
/// runs, and the total.
fn cell_list(grid: &Grid, seeds: &[Option<Vec<u64>>], shard: Option<Shard>) -> String {
    let mut out = String::new();
    let mut total = 0;
    for (c, s) in grid.cells.iter().zip(seeds) {
        let episodes = s.as_ref().map_or(c.config.episodes, |s| s.len() as u64);
        let n = episodes * c.config.arms.len() as u64;
        total += n;
        out += &format!(
            "{:<40} {:>5} episodes x {} arms = {:>6} episode-arms\n",
            c.name,
            episodes,
            c.config.arms.len(),
            n
        );
    }
    let of = match shard {
        Some(s) => format!(
            " in shard {}/{} (grid {})",
            s.index,
            s.count,
            grid.episode_arms()
        ),
        None => String::new(),
    };
    out + &format!("{} cells, {total} episode-arms{of}\n", grid.cells.len())
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
