//! The statebench command line; a thin layer over the library.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};

use statebench::cli_engine;
use statebench::ladder::agent::Scripted;
use statebench::ladder::arm::Arm;
use statebench::ladder::cell::{run_cell, CellConfig, Parts};
use statebench::ladder::domain::Domain;
use statebench::ladder::episode::{BriefVariant, EpisodeConfig, Protocol, StepId};
use statebench::ladder::generator::{generate, ParaphraseCache};
use statebench::ladder::module::{OracleCompiler, OracleMatcher};
use statebench::ladder::replay::{read_episode, read_replies, score_replies, EpisodeFile};
use statebench::ladder::runlog::read_run;
use statebench::ladder::runner::RunOptions;
use statebench::ladder::scorer::{perfect_labels, Label};
use statebench::report::{self, Format};

/// statebench: how strongly should task state act on an LLM agent?
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The paper's testbed: episodes, cells, reports, scoring.
    #[command(subcommand)]
    Ladder(LadderCommand),
    /// Generate one reply with the in-process engine and print its accounting.
    Generate(cli_engine::GenerateArgs),
    /// Manage model files.
    #[command(subcommand)]
    Model(ModelCommand),
    /// Measure prefill, batched decode and growing-conversation cost.
    Bench(cli_engine::BenchArgs),
}

#[derive(Subcommand)]
enum ModelCommand {
    /// Fetch the default model (runs models/fetch.sh).
    Fetch,
}

#[derive(Subcommand)]
enum LadderCommand {
    /// Print one episode: the brief, the schedule and the perfect agent's labels.
    Episode(EpisodeArgs),
    /// Run (or resume) a cell of episodes on a list of arms into a run directory.
    Cell(CellArgs),
    /// Report one or more run directories.
    Report(ReportArgs),
    /// Score replies produced elsewhere against an episode.
    Score(ScoreArgs),
}

/// The inputs an episode is a function of.
#[derive(Args, Clone)]
struct EpisodeSpec {
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
    brief: BriefArg,
    /// Booking protocol: text (ref lines) or tool (ACTION lines).
    #[arg(long, value_enum, default_value = "text")]
    protocol: ProtocolArg,
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

#[derive(Clone, Copy, clap::ValueEnum)]
enum BriefArg {
    Original,
    Amended,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ProtocolArg {
    Text,
    Tool,
}

impl EpisodeSpec {
    fn config(&self, seed: u64) -> EpisodeConfig {
        EpisodeConfig {
            domain: self.domain,
            steps: self.steps,
            density: self.density,
            seed,
            brief: match self.brief {
                BriefArg::Original => BriefVariant::Original,
                BriefArg::Amended => BriefVariant::Amended,
            },
            protocol: match self.protocol {
                ProtocolArg::Text => Protocol::Text,
                ProtocolArg::Tool => Protocol::Tool,
            },
            paraphrase_tier: self.paraphrase_tier,
            ambiguous_rate: self.ambiguous_rate,
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
struct EpisodeArgs {
    #[command(flatten)]
    spec: EpisodeSpec,
    /// Episode seed.
    #[arg(long, default_value_t = 100)]
    seed: u64,
    /// Print the episode as JSON (the input of `ladder score`).
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct CellArgs {
    #[command(flatten)]
    spec: EpisodeSpec,
    /// Scripted agent: perfect or always-book.
    #[arg(long, default_value = "perfect")]
    agent: Scripted,
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

#[derive(Args)]
struct ReportArgs {
    /// Run directories.
    #[arg(required = true)]
    dirs: Vec<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
}

#[derive(Args)]
struct ScoreArgs {
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

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Ladder(c) => match c {
            LadderCommand::Episode(a) => episode(a),
            LadderCommand::Cell(a) => cell(a),
            LadderCommand::Report(a) => report_cmd(a),
            LadderCommand::Score(a) => score(a),
        },
        Command::Generate(a) => cli_engine::generate(a),
        Command::Model(ModelCommand::Fetch) => cli_engine::model_fetch(),
        Command::Bench(a) => cli_engine::bench(a),
    }
}

/// Writes to stdout; a closed pipe (e.g. `| head`) ends output quietly.
fn emit(text: &str) -> Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
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

fn cell(a: CellArgs) -> Result<()> {
    if let Some(e) = a.corrupt {
        if !(0.0..=1.0).contains(&e) {
            bail!("--corrupt must be in [0, 1], got {e}");
        }
    }
    if a.arms.is_empty() {
        bail!("--arms is empty");
    }
    let cache = a.spec.cache()?;
    let base = a.spec.config(a.seed_start);
    let mut agent = a.agent;
    let cfg = CellConfig {
        domain: base.domain,
        steps: base.steps,
        density: base.density,
        brief: base.brief,
        protocol: base.protocol,
        paraphrase_tier: base.paraphrase_tier,
        ambiguous_rate: base.ambiguous_rate,
        seed_start: a.seed_start,
        episodes: a.episodes,
        arms: a.arms.clone(),
        agent: statebench::ladder::agent::Agent::name(&agent),
        matcher: "oracle".into(),
        compiler: "oracle".into(),
        options: RunOptions {
            bypass_matcher: !a.no_bypass,
            corrupt: a.corrupt,
        },
    };
    let parts = Parts {
        agent: &mut agent,
        matcher: &mut OracleMatcher,
        compiler: &mut OracleCompiler,
        model: serde_json::json!({ "agent": cfg.agent }),
    };
    let p = run_cell(&cfg, parts, cache.as_ref(), &a.out, !a.quiet)
        .with_context(|| format!("cell {}", a.out.display()))?;
    eprintln!(
        "{}: ran {} episode-arms, {} already finished",
        a.out.display(),
        p.ran,
        p.skipped
    );
    let run = read_run(&a.out)?;
    emit(&report::render(&report::build(&[run]), Format::Text))
}

fn report_cmd(a: ReportArgs) -> Result<()> {
    let runs = a
        .dirs
        .iter()
        .map(|d| read_run(d))
        .collect::<Result<Vec<_>, _>>()?;
    emit(&report::render(&report::build(&runs), a.format))
}

fn score(a: ScoreArgs) -> Result<()> {
    let ep = read_episode(&a.episode)?;
    let replies = read_replies(&a.replies, ep.turns.len())?;
    let (rec, turns) = score_replies(&ep, &replies, a.arm)?;
    let per_turn: Vec<serde_json::Value> = turns
        .iter()
        .map(|t| {
            serde_json::json!({
                "turn": t.turn,
                "kind": t.kind,
                "step": t.step,
                "label": t.label,
                "bookings": t.bookings,
                "violations": t.violations,
                "violations_decline_aware": t.violations_decline_aware,
            })
        })
        .collect();
    let out = serde_json::json!({
        "arm": a.arm,
        "strict": rec.primary.strict,
        "channels": rec.primary.channels,
        "decline_aware": { "strict": rec.decline_aware.strict, "channels": rec.decline_aware.channels },
        "turns_correct": rec.primary.turns_correct,
        "refused": rec.refused,
        "turns": per_turn,
    });
    emit(&(serde_json::to_string_pretty(&out)? + "\n"))
}
