//! `statebench ladder …` and the quick start `statebench run`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use serde::Serialize;

use statebench::ladder::arms::Arm;
use statebench::ladder::episode::domain::Domain;
use statebench::ladder::episode::generator::{generate, ParaphraseCache};
use statebench::ladder::episode::paraphrase::{self, RewriteOptions};
use statebench::ladder::episode::{BriefVariant, EpisodeConfig, Protocol, StepId};
use statebench::ladder::parts::scripted::Scripted;
use statebench::ladder::parts::Agent;
use statebench::ladder::run::cell::{run_cell, CellConfig, CellModel, CellParts, Parts, Source};
use statebench::ladder::run::replay::{read_episode, read_replies, score_replies, EpisodeFile};
use statebench::ladder::run::runlog::read_run;
use statebench::ladder::run::runner::RunOptions;
use statebench::ladder::score::{perfect_labels, ChannelCounts, Label, Violation};
use statebench::report::{self, Format};

use super::{emit, BackendArgs};

#[derive(Subcommand)]
pub enum LadderCommand {
    /// Print one episode: the brief, the schedule and the perfect agent's labels.
    Episode(EpisodeArgs),
    /// Run (or resume) a cell of episodes on a list of arms into a run directory.
    Cell(CellArgs),
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
    /// Booking protocol: text (ref lines) or tool (ACTION lines).
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
        Ok(match &self.paraphrase_cache {
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
pub struct ReportArgs {
    /// Run directories.
    #[arg(required = true)]
    dirs: Vec<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
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

fn describe(label: &Label) -> String {
    let ids = |v: &[StepId]| {
        v.iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match label {
        Label::Execute { step } => format!("execute {step}"),
        Label::Redo { step } => format!("execute {step} again (authorized)"),
        Label::Confirm { step } => format!("confirm {step} done, book nothing"),
        Label::Blocked { step, missing } => {
            format!("{step} blocked on {}, book nothing", ids(missing))
        }
        Label::Decline { step } => format!("decline cancelled {step}"),
        Label::Nothing => "book nothing".into(),
    }
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
            describe(l)
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
    let needs_model = scripted.is_none() || matcher == Source::Model || compiler == Source::Model;
    let mut cfg = CellConfig::paper(&base, a.episodes, String::new(), matcher);
    cfg.compiler = compiler;
    cfg.arms = a.arms.clone();
    cfg.thinking = a.backend.think;
    cfg.options = RunOptions {
        bypass_matcher: !a.no_bypass,
        corrupt: a.corrupt,
    };
    // Fail on a bad configuration before loading a model.
    cfg.validate()?;
    let shared = needs_model.then(|| a.backend.spawn()).transpose()?;
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
        thinking: a.backend.think,
        model: match model {
            Some(m) => CellModel::Model(m),
            None => CellModel::Scripted { agent },
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
    let runs = a
        .dirs
        .iter()
        .map(|d| read_run(d))
        .collect::<Result<Vec<_>, _>>()?;
    emit(&report::render(&report::build(&runs), a.format))
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
    // Through a JSON value, whose keys come out sorted, as this output
    // always has.
    let out = serde_json::to_value(&out)?;
    emit(&(serde_json::to_string_pretty(&out)? + "\n"))
}
