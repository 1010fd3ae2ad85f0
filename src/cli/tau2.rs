//! `statebench tau2 run|report`: τ²-bench's airline domain on a statebench
//! model, with the ladder's rungs at tool dispatch.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use clap::{Args, Subcommand, ValueEnum};

use statebench::backend::Backend;
use statebench::progress::Meter;
use statebench::rundir::Identity;
use statebench::tau2::episode::Limits;
use statebench::tau2::explain::{self, EpisodeRef, Explanation, ProposedCall, RulesSpec};
use statebench::tau2::reader::ReceiptReader;
use statebench::tau2::report::Report;
use statebench::tau2::rules::Verdict;
use statebench::tau2::source::Tau2Source;
use statebench::tau2::study::{self, RuleSource, Tau2Config};
use statebench::tau2::task::TaskFile;
use statebench::tau2::Arm;

use super::{emit, BackendArgs};

#[derive(Subcommand)]
pub enum Tau2Command {
    /// Run (or resume) τ²'s airline tasks into a run directory, then print its report.
    Run(Box<RunArgs>),
    /// Report a run directory (reads its files; runs no model).
    Report(ReportArgs),
    /// Every rule's verdict on one proposed call, with the receipts it
    /// read. Exit status: 0 allow, 1 refuse, 2 error.
    Explain(Box<ExplainArgs>),
}

pub fn run(c: Tau2Command) -> Result<()> {
    match c {
        Tau2Command::Run(a) => run_study(*a),
        Tau2Command::Report(a) => report(a),
        Tau2Command::Explain(a) => match explain(*a) {
            Ok(Verdict::Refuse) => Err(super::Exit(1).into()),
            Ok(_) => Ok(()),
            Err(e) => {
                eprintln!("error: {e:#}");
                Err(super::Exit(2).into())
            }
        },
    }
}

#[derive(Args)]
pub struct RunArgs {
    /// A τ²-bench airline data directory: policy.md, tasks.json, db.json,
    /// split_tasks.json and simulation_guidelines.md.
    #[arg(long)]
    tau2_data: PathBuf,
    /// Run directory (resumed when it exists).
    #[arg(long)]
    out: PathBuf,
    /// Arms (default: all four, raw,shown,notice,gate).
    #[arg(long, value_enum, value_delimiter = ',')]
    arms: Vec<Arm>,
    /// Trials of every (task, arm).
    #[arg(long, default_value_t = 1)]
    trials: u32,
    /// Tasks: all, split:NAME (a split of split_tasks.json), or ids separated by commas.
    #[arg(long, default_value = "all")]
    tasks: String,
    /// Which task file of the data directory.
    #[arg(long, value_enum, default_value_t = TaskFile::Current)]
    task_file: TaskFile,
    /// Seeded compiles of the policy into rules by the agent's model; trial t of a rule arm uses parsed compile t mod (compiles parsed).
    #[arg(long, default_value_t = 3)]
    compiles: usize,
    /// Rules of the rule arms: compiled by the model, or the hand-written reference (a validation run, labelled so).
    #[arg(long, value_enum, default_value_t = RuleSource::Compiled)]
    rules: RuleSource,
    /// Seed of the episodes and the compiles.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Messages of a conversation before it ends (default: τ²'s).
    #[arg(long)]
    max_steps: Option<usize>,
    /// Tool errors before a conversation ends (default: τ²'s).
    #[arg(long)]
    max_errors: Option<usize>,
    /// Most tokens of one agent reply.
    #[arg(long)]
    agent_max_tokens: Option<usize>,
    /// Most tokens of one user-simulator reply.
    #[arg(long)]
    user_max_tokens: Option<usize>,
    /// Model of the user simulator (a model spec as --model takes, or with
    /// --endpoint a model name the server serves). Default: the agent's.
    #[arg(long)]
    user_model: Option<String>,
    /// Who reads the receipts the notice and gate arms judge by (the
    /// user's confirmation of an action, a cancellation's reason): a
    /// matcher model, or words and phrases.
    #[arg(long, value_enum, default_value_t = ReceiptReader::Model)]
    receipts: ReceiptReader,
    /// The matcher's model (a model spec as --model takes, or with
    /// --endpoint a model name the server serves). Default: the agent's.
    #[arg(long)]
    matcher_model: Option<String>,
    /// A tau2-bench checkout's src/tau2: the agent's and the simulator's
    /// system-prompt layouts and the tools' descriptions are read from it
    /// (τ²'s own wording; default: statebench's).
    #[arg(long)]
    tau2_src: Option<PathBuf>,
    /// No progress lines.
    #[arg(long)]
    quiet: bool,
    #[command(flatten)]
    backend: BackendArgs,
}

/// The files a data directory must hold before anything is read.
const REQUIRED: [&str; 3] = ["policy.md", "tasks.json", "db.json"];

/// Refuses a data directory without the files a run reads, in one line.
pub fn check_data_dir(dir: &Path, task_file: &str) -> Result<()> {
    let extra = (!REQUIRED.contains(&task_file)).then_some(task_file);
    let missing: Vec<&str> = REQUIRED
        .iter()
        .copied()
        .chain(extra)
        .filter(|f| !dir.join(f).is_file())
        .collect();
    if !missing.is_empty() {
        bail!(
            "{}: not a τ²-bench airline data directory (missing {}); give --tau2-data a tau2-bench checkout's data/tau2/domains/airline",
            dir.display(),
            missing.join(", ")
        );
    }
    Ok(())
}

/// Opens one model as these flags name it; `name` replaces the model (a
/// spec for the engine, a served name for --endpoint).
fn run_study(a: RunArgs) -> Result<()> {
    let task_file = a.task_file;
    check_data_dir(&a.tau2_data, task_file.file_name())?;
    let mut data = study::open_data(&a.tau2_data, task_file)?;
    if let Some(dir) = &a.tau2_src {
        data.wording = Some(Tau2Source::read(dir)?);
    }
    let tasks = study::select_tasks(&data, &a.tasks)?;
    let defaults = Limits::new(a.backend.think, a.backend.think);
    let limits = Limits {
        max_steps: a.max_steps.unwrap_or(defaults.max_steps),
        max_errors: a.max_errors.unwrap_or(defaults.max_errors),
        agent_max_tokens: a.agent_max_tokens.unwrap_or(defaults.agent_max_tokens),
        user_max_tokens: a.user_max_tokens.unwrap_or(defaults.user_max_tokens),
        ..defaults
    };
    let arms = if a.arms.is_empty() {
        Arm::ALL.to_vec()
    } else {
        a.arms.clone()
    };
    let mut config = Tau2Config {
        task_file,
        data_sha256: study::data_hashes(&data, task_file),
        compiles: 0,
        rules: a.rules,
        seed: a.seed,
        limits,
        user_model: None,
        receipts: a.receipts,
        matcher: None,
        tau2_src_sha256: data
            .wording
            .as_ref()
            .map(|w| w.sha256.clone())
            .unwrap_or_default(),
        arms,
        trials: a.trials,
        tasks,
    };
    if config.uses_rules() && a.rules == RuleSource::Compiled {
        config.compiles = a.compiles;
    }
    if a.matcher_model.is_some() && a.receipts == ReceiptReader::Lexical {
        bail!("--matcher-model names the model that reads receipts; with --receipts lexical none does");
    }
    config.validate()?;
    let mut agent = a.backend.open(None)?;
    let mut user = match &a.user_model {
        Some(name) => {
            let u = a.backend.open(Some(name))?;
            config.user_model = Some(Identity::Model(u.model_id()?));
            Some(u)
        }
        None => None,
    };
    let identity = Identity::Model(agent.model_id()?);
    let mut matcher = match (&a.matcher_model, a.receipts) {
        (Some(name), ReceiptReader::Model) => {
            let m = a.backend.open(Some(name))?;
            config.matcher = Some(Identity::Model(m.model_id()?));
            Some(m)
        }
        (None, ReceiptReader::Model) => {
            config.matcher = Some(identity.clone());
            None
        }
        _ => None,
    };
    config.validate()?;
    let start = std::time::Instant::now();
    let progress = Meter::new(!a.quiet, "episodes");
    let summary = study::run(
        &a.out,
        &data,
        &config,
        identity,
        &mut *agent,
        user.as_deref_mut().map(|u| u as &mut dyn Backend),
        matcher.as_deref_mut().map(|m| m as &mut dyn Backend),
        a.backend.concurrency,
        &progress,
    )?;
    // The outcome, shown even with --quiet.
    eprintln!(
        "{}: {} episodes: {} run, {} already finished, {} failed (model error; run again on resume) ({:.1} s)",
        a.out.display(),
        summary.planned,
        summary.ran,
        summary.already,
        summary.failed,
        start.elapsed().as_secs_f64()
    );
    drop(agent);
    drop(user);
    drop(matcher);
    emit(&Report::read(&a.out)?.text())?;
    // A run that left failed episodes is not done: a script that checks
    // the exit status learns it, and the same command resumes them.
    if summary.failed > 0 {
        let finished = summary.ran + summary.already;
        bail!(
            "{} of {} episodes ended in a failed model call ({finished} finished); run the same command again to resume them",
            summary.failed,
            summary.planned
        );
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    Text,
    Md,
    Json,
}

#[derive(Args)]
pub struct ReportArgs {
    /// A run directory of `tau2 run`.
    dir: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

fn report(a: ReportArgs) -> Result<()> {
    let r = Report::read(&a.dir)?;
    emit(&match a.format {
        Format::Text => r.text(),
        Format::Md => r.md(),
        Format::Json => r.json(),
    })
}

#[derive(Args)]
#[command(group = clap::ArgGroup::new("what").required(true).args(["conversation", "episode"]))]
pub struct ExplainArgs {
    /// A τ²-bench airline data directory (its db.json; with --episode, the
    /// run's own data).
    #[arg(long)]
    tau2_data: PathBuf,
    /// A conversation in τ²'s message format (a simulation's `messages`,
    /// or an object holding them); the call is judged after it.
    #[arg(long, requires = "call")]
    conversation: Option<PathBuf>,
    /// The proposed call: {"name": …, "arguments": {…}}.
    #[arg(long, conflicts_with = "episode")]
    call: Option<String>,
    /// A recorded call instead: RUN_DIR:TASK:ARM:TRIAL:STEP (STEP: the
    /// call's index in the episode, from 0).
    #[arg(long)]
    episode: Option<String>,
    /// The rules: reference, compiled:N (compile N of the --episode run),
    /// or a file holding a rule set as a compile writes it. Default: the
    /// episode's own (the reference for a conversation, and on raw and
    /// shown).
    #[arg(long)]
    rules: Option<String>,
    /// Who reads the confirmation and the reason: lexical, or a matcher
    /// model (the model flags' model, asked now, unless the --episode run
    /// recorded its matcher's reading of this call). Default: as the
    /// episode read them; lexical for a conversation.
    #[arg(long, value_enum)]
    receipts: Option<ReceiptReader>,
    /// JSON instead of text.
    #[arg(long)]
    json: bool,
    /// The matcher's model with --receipts model.
    #[command(flatten)]
    backend: BackendArgs,
}

fn explain(a: ExplainArgs) -> Result<Verdict> {
    let spec = a
        .rules
        .as_deref()
        .map(str::parse::<RulesSpec>)
        .transpose()?;
    let e = match (&a.conversation, &a.episode) {
        (Some(path), _) => {
            let db = statebench::tau2::db::FlightDb::load(&a.tau2_data.join("db.json"))?;
            let history = explain::read_conversation(path)?;
            let call: ProposedCall = a.call.as_deref().unwrap_or_default().parse()?;
            let (rules, name) =
                explain::rules(spec.as_ref().unwrap_or(&RulesSpec::Reference), None)?;
            let db = explain::replay_conversation(&db, &history);
            let reading = match a.receipts {
                Some(ReceiptReader::Model) => {
                    let mut m = a.backend.open(None)?;
                    explain::ask_matcher(&mut *m, &rules, &db, &history, &call, 0)?
                }
                _ => None,
            };
            Explanation::new(&rules, name, &db, &history, call, reading)
        }
        (None, Some(text)) => {
            let r: EpisodeRef = text.parse()?;
            let manifest = statebench::tau2::study::Manifest::read(&r.dir)?;
            check_data_dir(&a.tau2_data, manifest.config.task_file.file_name())?;
            let data = study::open_data(&a.tau2_data, manifest.config.task_file)?;
            let rec = explain::recorded(&data, &r, text)?;
            let (rules, name) = match &spec {
                Some(s) => explain::rules(s, Some(&r.dir))?,
                None => explain::episode_rules(&rec)?,
            };
            let reading = match (a.receipts, rec.reading) {
                (Some(ReceiptReader::Lexical), _) => None,
                (_, Some(recorded)) => Some(recorded),
                (Some(ReceiptReader::Model), None) => {
                    let mut m = a.backend.open(None)?;
                    let seed = rec.record.seed;
                    explain::ask_matcher(&mut *m, &rules, &rec.db, &rec.history, &rec.call, seed)?
                }
                (None, None) => None,
            };
            Explanation::new(&rules, name, &rec.db, &rec.history, rec.call, reading)
        }
        (None, None) => bail!("give --conversation with --call, or --episode"),
    };
    emit(&if a.json { e.json() } else { e.text() })?;
    Ok(e.verdict)
}
