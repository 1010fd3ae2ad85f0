//! `statebench eal`: EAL-Bench cases, formation and execution.

use statebench::rundir::Identity;
use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Subcommand};
use statebench::progress::Meter;

use statebench::backend::shared::SharedBackend;
use statebench::eal::closed_loop::{self, LoopArm};
use statebench::eal::executor::EvidenceArm;
use statebench::eal::report::Run;
use statebench::eal::study::{self, ExecutorKind, StudyConfig, StudyModel, WriterKind};
use statebench::eal::writer::{Formation, Selection};
use statebench::eal::{self, generator, EalDomain, Trap};

use super::{emit, BackendArgs};

#[derive(Subcommand)]
pub enum EalCommand {
    /// Generate a case set (JSON lines: one case a line).
    Generate(GenerateArgs),
    /// Print a case: its history, requests and the oracle's decisions.
    Show(ShowArgs),
    /// Run (or resume) a study: writer chains, a frozen bundle, executor calls on every evidence arm.
    Run(Box<RunArgs>),
    /// Run (or resume) a closed loop: each request's action and outcome (or a neutral block) go back to the writer before the case's next request.
    Loop(Box<LoopArgs>),
    /// Print a study's measurements from its run directory.
    Report(ReportArgs),
}

pub fn run(c: EalCommand) -> Result<()> {
    match c {
        EalCommand::Generate(a) => generate(a),
        EalCommand::Show(a) => show(a),
        EalCommand::Run(a) => run_study(*a),
        EalCommand::Loop(a) => run_closed_loop(*a),
        EalCommand::Report(a) => report(a),
    }
}

#[derive(Args)]
pub struct CaseSet {
    /// Domain of the cases.
    #[arg(long, value_enum, default_value_t = EalDomain::Procurement)]
    pub domain: EalDomain,
    /// Seed of the case set; cases are a pure function of domain, seed and index.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Number of cases (three requests each).
    #[arg(long, default_value_t = 10)]
    pub cases: usize,
    /// Authorization changes the cases cycle through (default: all five).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub mix: Vec<Trap>,
}

impl CaseSet {
    pub fn cases(&self) -> Vec<eal::Case> {
        generator::generate(self.domain, self.seed, self.cases, &self.mix)
    }
}

#[derive(Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    set: CaseSet,
    /// Write here instead of stdout.
    #[arg(long)]
    out: Option<PathBuf>,
}

fn generate(a: GenerateArgs) -> Result<()> {
    let text = eal::cases_jsonl(&a.set.cases());
    match a.out {
        Some(p) => std::fs::write(&p, text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display())),
        None => emit(&text),
    }
}

#[derive(Args)]
pub struct ShowArgs {
    #[command(flatten)]
    set: CaseSet,
    /// Index of the case in the set.
    #[arg(long, default_value_t = 0)]
    index: usize,
    /// Print the case as JSON.
    #[arg(long)]
    json: bool,
}

fn show(a: ShowArgs) -> Result<()> {
    if a.index >= a.set.cases {
        anyhow::bail!(
            "--index {} is outside the set of {} cases (indices 0 to {})",
            a.index,
            a.set.cases,
            a.set.cases.saturating_sub(1)
        );
    }
    let cases = generator::generate(a.set.domain, a.set.seed, a.index + 1, &a.set.mix);
    let case = &cases[a.index];
    if a.json {
        return emit(&(serde_json::to_string_pretty(case)? + "\n"));
    }
    let mut out = format!(
        "{} ({}, trap {}{})\nauthorized issuers: {}\n\n",
        case.id,
        case.organization,
        case.trap.name(),
        if case.variant.is_empty() {
            String::new()
        } else {
            format!(" {}", case.variant)
        },
        eal::prompts::issuers(case)
    );
    out.push_str(&eal::prompts::history(case, case.blocks.len() - 1));
    out.push('\n');
    for r in &case.requests {
        out.push_str(&format!(
            "{} after block {} ({:?}): {}\n    oracle: {}\n",
            r.id,
            r.checkpoint,
            r.probe,
            r.text,
            r.expected.name()
        ));
    }
    emit(&out)
}

/// The parts of a study: who writes, what, and who executes.
#[derive(Args)]
pub struct StudyArgs {
    #[command(flatten)]
    set: CaseSet,
    /// Who writes the memory: the model, or the ledger itself (the oracle writer).
    #[arg(long, value_enum, default_value_t = WriterKind::Model)]
    writer: WriterKind,
    /// What the writer maintains: a typed profile, free-text notes, or lifecycle events.
    #[arg(long, value_enum, default_value_t = Formation::Typed)]
    formation: Formation,
    /// Who decides requests: the model, or a scripted executor.
    #[arg(long, value_enum, default_value_t = ExecutorKind::Model)]
    executor: ExecutorKind,
    /// Reference tokens a written memory may use.
    #[arg(long, default_value_t = 800)]
    capacity: usize,
    /// Most tokens of one writer reply.
    #[arg(long, default_value_t = 768)]
    writer_max_tokens: usize,
    /// Most tokens of one executor reply.
    #[arg(long, default_value_t = 192)]
    executor_max_tokens: usize,
    /// Run directory (resumed when it exists).
    #[arg(long)]
    out: PathBuf,
    /// No progress lines.
    #[arg(long)]
    quiet: bool,
    #[command(flatten)]
    backend: BackendArgs,
}

impl StudyArgs {
    fn config(&self) -> StudyConfig {
        let mut config = StudyConfig::new(self.set.domain, self.set.seed, self.set.cases);
        config.mix = self.set.mix.clone();
        config.writer = self.writer;
        config.formation = self.formation;
        config.executor = self.executor;
        config.capacity = self.capacity;
        config.writer_max_tokens = self.writer_max_tokens;
        config.executor_max_tokens = self.executor_max_tokens;
        config.thinking = self.backend.think;
        config
    }

    /// The model the configuration asks, started when it asks one.
    fn model(&self, config: &StudyConfig) -> Result<(Option<SharedBackend>, StudyModel)> {
        if !config.uses_model() {
            let scripted = StudyModel {
                client: None,
                identity: Identity::ScriptedUnnamed,
                concurrency: 1,
            };
            return Ok((None, scripted));
        }
        let (shared, id) = self.backend.spawn()?;
        let model = StudyModel {
            client: Some(shared.client()),
            identity: Identity::Model(id),
            concurrency: self.backend.concurrency,
        };
        Ok((Some(shared), model))
    }

    fn progress(&self, unit: &'static str) -> Meter {
        Meter::new(!self.quiet, unit)
    }
}

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    parts: StudyArgs,
    /// Evidence arms (default: all six).
    #[arg(long, value_enum, value_delimiter = ',')]
    arms: Vec<EvidenceArm>,
    /// Writer chains per case (sampled, each with its own seed); above 1, one candidate is selected per checkpoint.
    #[arg(long, default_value_t = 1)]
    candidates: usize,
    /// How a best-of-k candidate is selected.
    #[arg(long, value_enum, default_value_t = Selection::Oracle)]
    selection: Selection,
    /// Sampling temperature of best-of-k chains.
    #[arg(long, default_value_t = 0.7)]
    candidate_temperature: f32,
    /// Stop once formation is frozen (a later run resumes with the executor calls).
    #[arg(long)]
    stop_after_formation: bool,
}

fn run_study(a: RunArgs) -> Result<()> {
    let mut config = a.parts.config();
    if !a.arms.is_empty() {
        config.arms = a.arms.clone();
    }
    config.candidates = a.candidates;
    config.selection = a.selection;
    config.candidate_temperature = a.candidate_temperature;
    config.validate()?;
    let (shared, model) = a.parts.model(&config)?;
    let start = std::time::Instant::now();
    let progress = a.parts.progress("calls");
    let out = &a.parts.out;
    let summary = study::run(out, &config, &model, a.stop_after_formation, &progress)?;
    drop(model);
    drop(shared);
    progress.println(format!(
        "{}: {} calls planned, {} resumed, {} run ({:.1} s)",
        out.display(),
        summary.planned,
        summary.resumed,
        summary.ran,
        start.elapsed().as_secs_f64()
    ));
    if a.stop_after_formation {
        return Ok(());
    }
    emit(&Run::read(out)?.render())
}

#[derive(Args)]
pub struct LoopArgs {
    #[command(flatten)]
    parts: StudyArgs,
    /// Feedback arms: the action and its outcome, or a neutral block (default: both).
    #[arg(long, value_enum, value_delimiter = ',')]
    arms: Vec<LoopArm>,
}

fn run_closed_loop(a: LoopArgs) -> Result<()> {
    let mut config = a.parts.config();
    config.arms = vec![EvidenceArm::Written];
    config.closed_loop = if a.arms.is_empty() {
        vec![LoopArm::Action, LoopArm::Neutral]
    } else {
        a.arms.clone()
    };
    config.validate()?;
    let (shared, model) = a.parts.model(&config)?;
    let start = std::time::Instant::now();
    let progress = a.parts.progress("cases");
    let out = &a.parts.out;
    let ran = closed_loop::run_loop(out, &config, &model, &progress)?;
    drop(model);
    drop(shared);
    progress.println(format!(
        "{}: {ran} cases run ({:.1} s)",
        out.display(),
        start.elapsed().as_secs_f64()
    ));
    emit(&closed_loop::render(out)?)
}

#[derive(Args)]
pub struct ReportArgs {
    /// A run directory of `eal run` or `eal loop`.
    dir: PathBuf,
}

fn report(a: ReportArgs) -> Result<()> {
    if a.dir.join("loop.jsonl").exists() {
        return emit(&closed_loop::render(&a.dir)?);
    }
    emit(&Run::read(&a.dir)?.render())
}
