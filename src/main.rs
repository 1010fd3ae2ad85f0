//! The statebench command line; a thin layer over the library.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};

use statebench::backend::openai::{OpenAiBackend, OpenAiOptions};
use statebench::backend::served::Served;
use statebench::cli_engine;
use statebench::engine::{Engine, EngineOptions};
use statebench::ladder::agent::Scripted;
use statebench::ladder::arm::Arm;
use statebench::ladder::cell::{run_cell, CellConfig, CellParts, Source};
use statebench::ladder::domain::Domain;
use statebench::ladder::episode::{BriefVariant, EpisodeConfig, Protocol, StepId};
use statebench::ladder::generator::{generate, ParaphraseCache};
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
    /// Quick start: a small live ladder on the default model (procurement, S=5, four arms).
    Run(RunArgs),
    /// Generate one reply with the in-process engine and print its accounting.
    Generate(cli_engine::GenerateArgs),
    /// Manage model files.
    #[command(subcommand)]
    Model(ModelCommand),
    /// Measure prefill, batched decode and growing-conversation cost; with --cell, a live cell batched against one episode at a time.
    Bench(BenchCmd),
    /// Serve the in-process engine as an OpenAI-compatible chat-completions endpoint.
    Serve(statebench::serve::ServeArgs),
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
    /// Write held-out (tier-2) rewrites of every ask, premature and redo wording with a model.
    Paraphrase(ParaphraseArgs),
}

#[derive(Args)]
struct ParaphraseArgs {
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
    live: LiveArgs,
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

/// How a cell's model parts run.
#[derive(Args)]
struct LiveArgs {
    /// A .gguf file, a safetensors directory or a Hugging Face id (default: the default GGUF, fetched if missing).
    #[arg(long, conflicts_with = "endpoint")]
    model: Option<String>,
    /// Drive a remote OpenAI-compatible server (vLLM, SGLang, `statebench serve`) instead of the in-process engine, e.g. http://127.0.0.1:8000.
    #[arg(long)]
    endpoint: Option<String>,
    /// Model name to request from --endpoint (default: the first it lists at /v1/models).
    #[arg(long, requires = "endpoint")]
    remote_model: Option<String>,
    /// Environment variable holding the --endpoint API key (sent as a bearer token when set).
    #[arg(long, default_value = "OPENAI_API_KEY", requires = "endpoint")]
    api_key_env: String,
    /// Matcher: oracle (scripted step) or model. Default: model with --agent model, else oracle.
    #[arg(long, value_enum)]
    matcher: Option<Source>,
    /// Compiler: oracle (generator's graph) or model. Default: model with --agent model, else oracle.
    #[arg(long, value_enum)]
    compiler: Option<Source>,
    /// Thinking regime (Qwen3 enable_thinking) with the paper's thinking budgets.
    #[arg(long)]
    think: bool,
    /// Episode-arms in flight at once; their model calls are batched together.
    #[arg(long, default_value_t = 32)]
    live: usize,
    /// Compute threads of the engine.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// KV-cache memory of the engine in GiB (running requests and idle
    /// sessions together; idle caches are dropped, least recently used first).
    #[arg(long, default_value_t = 8.0)]
    kv_budget_gib: f64,
}

#[derive(Args)]
struct CellArgs {
    #[command(flatten)]
    spec: EpisodeSpec,
    /// Agent: perfect, always-book or model.
    #[arg(long, value_enum, default_value = "perfect")]
    agent: AgentArg,
    #[command(flatten)]
    live: LiveArgs,
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

/// `statebench bench`: engine figures, or with `--cell` the live-cell comparison.
#[derive(Args)]
struct BenchCmd {
    #[command(flatten)]
    engine: cli_engine::BenchArgs,
    /// Instead of the engine figures: run one small live cell batched (every
    /// episode-arm live at once) and again one episode-arm at a time, and
    /// report episodes per hour per arm and the share of prompt tokens served
    /// from cache.
    #[arg(long)]
    cell: bool,
    /// Episodes per arm of the --cell benchmark.
    #[arg(long, default_value_t = 2)]
    cell_episodes: u64,
    /// Steps S of the --cell benchmark.
    #[arg(long, default_value_t = 5)]
    cell_steps: usize,
}

/// The quick start: a small live ladder on the default model.
#[derive(Args)]
struct RunArgs {
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
    live: LiveArgs,
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
            LadderCommand::Paraphrase(a) => paraphrase(a),
        },
        Command::Run(a) => quickstart(a),
        Command::Generate(a) => cli_engine::generate(a),
        Command::Model(ModelCommand::Fetch) => cli_engine::model_fetch(),
        Command::Bench(a) if a.cell => bench_cell(a),
        Command::Bench(a) => cli_engine::bench(a.engine),
        Command::Serve(a) => statebench::serve::serve_command(a),
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

/// Loads the served model when any part needs it.
fn serve_model(live: &LiveArgs) -> Result<(Served, serde_json::Value)> {
    if let Some(url) = &live.endpoint {
        let opts = OpenAiOptions {
            model: live.remote_model.clone(),
            api_key_env: Some(live.api_key_env.clone()),
            max_concurrency: live.live.max(1),
            ..OpenAiOptions::new(url.clone())
        };
        let backend = OpenAiBackend::connect(opts)?;
        let served = Served::spawn(Box::new(backend));
        let id = serde_json::to_value(served.model_id())?;
        return Ok((served, id));
    }
    let spec = cli_engine::resolve_model(&live.model)?;
    let opts = EngineOptions {
        threads: live.threads,
        kv_budget_bytes: (live.kv_budget_gib * (1u64 << 30) as f64) as usize,
        ..EngineOptions::default()
    };
    let engine = Engine::load(&spec, opts)?;
    let served = Served::spawn(Box::new(engine));
    let id = serde_json::to_value(served.model_id())?;
    Ok((served, id))
}

/// Runs a cell and prints its report.
fn run_and_report(
    cfg: &CellConfig,
    parts: &CellParts,
    cache: Option<&ParaphraseCache>,
    out: &std::path::Path,
    live: usize,
    quiet: bool,
) -> Result<()> {
    let started = std::time::Instant::now();
    let p = run_cell(cfg, parts, cache, out, live, !quiet)
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
    if a.arms.is_empty() {
        bail!("--arms is empty");
    }
    let cache = a.spec.cache()?;
    let base = a.spec.config(a.seed_start);
    // Fail on a bad configuration before loading a model.
    statebench::ladder::generator::validate(&base)?;
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
    let matcher = a.live.matcher.unwrap_or(default);
    let compiler = a.live.compiler.unwrap_or(default);
    let needs_model = scripted.is_none() || matcher == Source::Model || compiler == Source::Model;
    let (served, model) = if needs_model {
        let (s, id) = serve_model(&a.live)?;
        (Some(s), id)
    } else {
        (None, serde_json::Value::Null)
    };
    let agent_name = match scripted {
        Some(s) => statebench::ladder::agent::Agent::name(&s),
        None => format!(
            "model:{}",
            model.get("name").and_then(|v| v.as_str()).unwrap_or("?")
        ),
    };
    let source_name = |s: Source| match s {
        Source::Oracle => "oracle".to_string(),
        Source::Model => "model".to_string(),
    };
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
        agent: agent_name.clone(),
        matcher: source_name(matcher),
        compiler: source_name(compiler),
        thinking: a.live.think,
        options: RunOptions {
            bypass_matcher: !a.no_bypass,
            corrupt: a.corrupt,
        },
    };
    let parts = CellParts {
        scripted,
        matcher,
        compiler,
        client: served.as_ref().map(|s| s.client()),
        thinking: a.live.think,
        model: if needs_model {
            model
        } else {
            serde_json::json!({ "agent": agent_name })
        },
    };
    run_and_report(&cfg, &parts, cache.as_ref(), &a.out, a.live.live, a.quiet)
}

fn paraphrase(a: ParaphraseArgs) -> Result<()> {
    let (served, model) = serve_model(&a.live)?;
    let name = model
        .get("name")
        .and_then(|v| v.as_str())
        .unwrap_or("?")
        .to_string();
    let opts = statebench::ladder::paraphrase::RewriteOptions {
        temperature: a.temperature,
        seed: a.seed,
        live: a.live.live,
    };
    let cache = statebench::ladder::paraphrase::rewrite(&served.client(), &name, &a.domains, opts)
        .map_err(|e| anyhow::anyhow!("paraphrase: {e}"))?;
    let text = serde_json::to_string_pretty(&cache)? + "\n";
    std::fs::write(&a.out, text).with_context(|| format!("writing {}", a.out.display()))?;
    eprintln!(
        "{}: {} templates x 3 families x 3 rewrites by {name}",
        a.out.display(),
        cache.templates.len()
    );
    Ok(())
}

/// The quick start's cell configuration on a model.
fn live_ladder(
    steps: usize,
    episodes: u64,
    model: &serde_json::Value,
    thinking: bool,
) -> CellConfig {
    let name = model.get("name").and_then(|v| v.as_str()).unwrap_or("?");
    CellConfig {
        domain: Domain::Procurement,
        steps,
        density: 0.15,
        brief: BriefVariant::Amended,
        protocol: Protocol::Text,
        paraphrase_tier: 0,
        ambiguous_rate: 0.0,
        seed_start: 100,
        episodes,
        arms: vec![Arm::Raw, Arm::Checklist, Arm::Directive, Arm::Enforce],
        agent: format!("model:{name}"),
        matcher: "model".into(),
        compiler: "model".into(),
        thinking,
        options: RunOptions::default(),
    }
}

fn model_parts(served: &Served, model: serde_json::Value, thinking: bool) -> CellParts {
    CellParts {
        scripted: None,
        matcher: Source::Model,
        compiler: Source::Model,
        client: Some(served.client()),
        thinking,
        model,
    }
}

fn bench_cell(a: BenchCmd) -> Result<()> {
    let live = LiveArgs {
        model: a.engine.model.model.clone(),
        matcher: None,
        compiler: None,
        think: false,
        live: usize::MAX,
        threads: a.engine.model.threads,
        endpoint: None,
        remote_model: None,
        api_key_env: "OPENAI_API_KEY".into(),
        kv_budget_gib: 8.0,
    };
    let (served, model) = serve_model(&live)?;
    let cfg = live_ladder(a.cell_steps, a.cell_episodes, &model, false);
    let parts = model_parts(&served, model, false);
    let base = std::env::temp_dir().join(format!("statebench-bench-cell-{}", std::process::id()));
    let total = cfg.episodes as usize * cfg.arms.len();
    let mut walls = Vec::new();
    for (name, workers) in [("batched", total), ("sequential", 1)] {
        let dir = base.join(name);
        let _ = std::fs::remove_dir_all(&dir);
        let t = std::time::Instant::now();
        run_cell(&cfg, &parts, None, &dir, workers, true)?;
        walls.push((name, dir, t.elapsed().as_secs_f64()));
    }
    let runs: Vec<_> = walls
        .iter()
        .map(|(_, d, _)| read_run(d))
        .collect::<Result<_, _>>()?;
    let same = {
        let key = |d: &std::path::Path| -> Result<Vec<String>> {
            let mut v: Vec<String> = statebench::ladder::runlog::read_turns(d)?
                .into_iter()
                .map(|t| {
                    serde_json::json!([t.seed, t.arm, t.turn, t.replies, t.bookings]).to_string()
                })
                .collect();
            v.sort();
            Ok(v)
        };
        key(&walls[0].1)? == key(&walls[1].1)?
    };
    let mut out = format!(
        "live cell: procurement S={} rho=0.15, {} episodes x {} arms, model {}, {} threads\n\
         batched: all {} episode-arms live at once, {:.1} s wall; sequential: one at a time, {:.1} s wall\n\
         transcripts identical between the two: {}\n\n\
         arm        episodes/hour batched  episodes/hour sequential  ratio  prompt tokens from cache\n",
        cfg.steps, cfg.episodes, cfg.arms.len(),
        runs[0].manifest.model.get("name").and_then(|v| v.as_str()).unwrap_or("?"),
        a.engine.model.threads, total, walls[0].2, walls[1].2,
        if same { "yes" } else { "NO" },
    );
    let (mut prompt, mut cached) = (0usize, 0usize);
    for arm in &cfg.arms {
        let eps = |r: &statebench::ladder::runlog::RunRead| -> Vec<statebench::ladder::runner::EpisodeRecord> {
            r.episodes.iter().filter(|e| e.arm == *arm).cloned().collect()
        };
        let (b, q) = (eps(&runs[0]), eps(&runs[1]));
        // Batched: the arm's episodes over the wall clock all arms shared.
        let eph_b = b.len() as f64 / walls[0].2 * 3600.0;
        // Sequential: the arm's episodes over the time they took, one at a time.
        let seq_s: f64 = q.iter().map(|e| e.wall_s).sum();
        let eph_s = q.len() as f64 / seq_s.max(1e-9) * 3600.0;
        let p: usize = b.iter().map(|e| e.usage.prompt_tokens).sum();
        let c: usize = b.iter().map(|e| e.usage.cached_tokens).sum();
        prompt += p;
        cached += c;
        out += &format!(
            "{:<10} {:>22.1}  {:>24.1}  {:>5.2}  {:>23.3}\n",
            arm.name(),
            eph_b,
            eph_s,
            eph_b / eph_s.max(1e-9),
            c as f64 / p.max(1) as f64
        );
    }
    out += &format!(
        "{:<10} {:>22.1}  {:>24.1}  {:>5.2}  {:>23.3}\n",
        "all",
        total as f64 / walls[0].2 * 3600.0,
        total as f64 / walls[1].2 * 3600.0,
        walls[1].2 / walls[0].2,
        cached as f64 / prompt.max(1) as f64
    );
    let _ = std::fs::remove_dir_all(&base);
    emit(&out)
}

fn quickstart(a: RunArgs) -> Result<()> {
    let (served, model) = serve_model(&a.live)?;
    let cfg = live_ladder(a.steps, a.episodes, &model, a.live.think);
    let parts = model_parts(&served, model, a.live.think);
    run_and_report(&cfg, &parts, None, &a.out, a.live.live, false)
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
