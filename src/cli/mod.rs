//! The command line: argument types, the model every model command loads,
//! and one module per group of commands. Every command calls the library
//! and prints what it returns.

mod bench;
mod check;
#[cfg(feature = "cuda")]
mod check_gpu;
mod eal;
mod engine;
mod ladder;
mod serve;
mod tau2;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};

use statebench::backend::http_client::{OpenAiBackend, OpenAiOptions};
use statebench::backend::shared::SharedBackend;
use statebench::backend::{Backend, ModelIdentity};
use statebench::engine::device::DeviceChoice;
use statebench::engine::{gib, EngineOptions, Quantize, WeightLayout, DEFAULT_MODEL};

/// statebench: how strongly should task state act on an LLM agent?
#[derive(Parser)]
#[command(version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The paper's testbed: episodes, cells, reports, scoring.
    #[command(subcommand)]
    Ladder(ladder::LadderCommand),
    /// Quick start: a small live ladder on the default model (procurement, S=5, four arms).
    Run(ladder::RunArgs),
    /// Generate one reply with the in-process engine and print its accounting.
    Generate(engine::GenerateArgs),
    /// Manage model files.
    #[command(subcommand)]
    Model(engine::ModelCommand),
    /// Measure prefill, batched decode and growing-conversation cost; with --cell, a live cell batched against one episode at a time.
    Bench(bench::BenchArgs),
    /// Serve the in-process engine as an OpenAI-compatible chat-completions endpoint.
    Serve(serve::ServeArgs),
    /// Check a device: kernels against the CPU, invariance, logits for a reference.
    #[command(subcommand)]
    Check(check::CheckCommand),
    /// EAL-Bench: authorization memory written by a model, consumed by an executor with native tools.
    #[command(subcommand)]
    Eal(eal::EalCommand),
    /// τ²-bench's airline domain in-process, with the ladder's rungs at tool dispatch.
    #[command(subcommand)]
    Tau2(tau2::Tau2Command),
}

/// Runs one parsed command line.
pub fn run(cli: Cli) -> Result<()> {
    // A kernel-family cap that cannot be honoured is refused before any
    // command starts, in one line naming the variable.
    statebench_kernels::isa()?;
    match cli.command {
        Command::Ladder(c) => ladder::run(c),
        Command::Run(a) => ladder::quickstart(a),
        Command::Generate(a) => engine::generate(a),
        Command::Model(c) => engine::model(c),
        Command::Bench(a) => bench::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Check(c) => check::run(c),
        Command::Eal(c) => eal::run(c),
        Command::Tau2(c) => tau2::run(c),
    }
}

/// Which model, and how the in-process engine runs it.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// A .gguf file, a directory with config.json + safetensors, or a Hugging
    /// Face id (from the hub cache; downloaded unless HF_HUB_OFFLINE=1).
    /// Default: the default GGUF, fetched with models/fetch.sh if missing.
    #[arg(long)]
    pub model: Option<String>,
    /// Compute threads of the engine.
    #[arg(long, default_value_t = EngineOptions::DEFAULT_THREADS)]
    pub threads: usize,
    /// KV-cache memory of the engine in GiB (running requests and idle
    /// sessions together; idle caches are dropped, least recently used first;
    /// on a GPU, at most what its memory holds after the weights).
    #[arg(long, default_value_t = EngineOptions::DEFAULT_KV_BUDGET_GIB)]
    pub kv_budget_gib: f64,
    /// Device of the forward pass: cpu, cuda, cuda:N, cuda-emulated (the CUDA
    /// engine executed on the CPU by the emulator) or metal. Default: the
    /// first CUDA GPU when this build has CUDA and one answers, else cpu.
    #[arg(long)]
    pub device: Option<DeviceChoice>,
    /// Read special-token strings inside message content (`<|im_start|>`, …)
    /// as the control tokens they name. Off by default: content is text, so
    /// no message can open a turn of another role.
    #[arg(long)]
    pub special_tokens_in_content: bool,
    /// Prompt tokens a request prefills per forward step; results do not
    /// depend on it.
    #[arg(long, default_value_t = EngineOptions::DEFAULT_PREFILL_CHUNK as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub prefill_chunk: u64,
    /// Prompt tokens a request prefills per step while others decode (their
    /// tokens wait for each step); results do not depend on it.
    #[arg(long, default_value_t = EngineOptions::DEFAULT_MIXED_PREFILL_CHUNK as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub mixed_prefill_chunk: u64,
    /// How Q4_0, Q5_0, Q4_K and Q6_K weights are held in memory: widened
    /// once at load (faster from a few rows a batch up) or at the file's own
    /// bits (its size in memory, faster at batch 1). Results are
    /// bit-identical either way.
    #[arg(long, value_enum, default_value_t = WeightLayout::default())]
    pub weights: WeightLayout,
    /// Quantize float (f32, bf16, f16) weight matrices at load, for speed
    /// over exactness: results change, and manifests record it in the
    /// model's format and arithmetic.
    #[arg(long, value_enum)]
    pub quantize: Option<Quantize>,
}

impl ModelArgs {
    pub fn spec_and_options(&self) -> Result<(String, EngineOptions)> {
        let spec = resolve_model(&self.model)?;
        if !(self.kv_budget_gib.is_finite() && self.kv_budget_gib > 0.0) {
            anyhow::bail!(
                "--kv-budget-gib must be a positive number, got {}",
                self.kv_budget_gib
            );
        }
        let opts = EngineOptions {
            threads: self.threads,
            kv_budget_bytes: gib(self.kv_budget_gib),
            special_tokens_in_content: self.special_tokens_in_content,
            prefill_chunk: usize::try_from(self.prefill_chunk).unwrap_or(usize::MAX),
            mixed_prefill_chunk: usize::try_from(self.mixed_prefill_chunk).unwrap_or(usize::MAX),
            weights: self.weights,
            quantize: self.quantize,
            ..EngineOptions::default()
        };
        Ok((spec, opts))
    }

    /// The device these flags name.
    pub fn device(&self) -> DeviceChoice {
        self.device.unwrap_or_else(DeviceChoice::auto)
    }

    /// Loads the engine these flags name on their device.
    pub fn load(&self) -> Result<Box<dyn Backend + Send>> {
        let (spec, opts) = self.spec_and_options()?;
        Ok(statebench::engine::open(&spec, opts, self.device())?)
    }
}

/// A model for the studies: the in-process engine, or a remote server.
#[derive(Args, Debug, Clone)]
pub struct BackendArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Drive a remote OpenAI-compatible server (vLLM, SGLang, `statebench serve`) instead of the in-process engine, e.g. http://127.0.0.1:8000.
    #[arg(long, conflicts_with = "model")]
    pub endpoint: Option<String>,
    /// Model name to request from --endpoint (default: the first it lists at /v1/models).
    #[arg(long, requires = "endpoint")]
    pub remote_model: Option<String>,
    /// Environment variable holding the --endpoint API key (sent as a bearer token when set).
    #[arg(long, default_value = "OPENAI_API_KEY", requires = "endpoint")]
    pub api_key_env: String,
    /// Thinking regime (Qwen3 enable_thinking) with the paper's thinking budgets.
    #[arg(long)]
    pub think: bool,
    /// Episode-arms in flight at once; their model calls are batched together.
    #[arg(long, alias = "live", default_value_t = 32)]
    pub concurrency: usize,
}

impl BackendArgs {
    /// Opens the backend these flags name; `name` replaces the model (a
    /// model name on the server with `--endpoint`, else a model spec loaded
    /// with the same engine flags).
    pub fn open(&self, name: Option<&str>) -> Result<Box<dyn Backend + Send>> {
        Ok(match &self.endpoint {
            Some(url) => Box::new(OpenAiBackend::connect(OpenAiOptions {
                model: name
                    .map(str::to_string)
                    .or_else(|| self.remote_model.clone()),
                api_key_env: Some(self.api_key_env.clone()),
                max_concurrency: self.concurrency.max(1),
                ..OpenAiOptions::new(url.clone())
            })?),
            None => {
                let mut model = self.model.clone();
                if let Some(n) = name {
                    model.model = Some(n.to_string());
                }
                model.load()?
            }
        })
    }

    /// Starts the backend on its own thread, shared by every caller.
    pub fn spawn(&self) -> Result<(SharedBackend, ModelIdentity)> {
        let shared = SharedBackend::spawn(self.open(None)?)?;
        let id = shared.model_id().clone();
        Ok((shared, id))
    }
}

/// Writes to stdout; a closed pipe (e.g. `| head`) ends output quietly.
/// Ends the process with this status, printing nothing more.
#[derive(Debug)]
pub struct Exit(pub u8);

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit status {}", self.0)
    }
}

impl std::error::Error for Exit {}

pub fn emit(text: &str) -> Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}

/// The repository root: the working directory if it holds `models/`, else
/// the directory the binary was built from.
fn repo_root() -> PathBuf {
    if Path::new("models/fetch.sh").is_file() {
        PathBuf::from(".")
    } else {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
    }
}

/// Runs `models/fetch.sh` (the one piece of code that fetches models).
fn fetch_default_model() -> Result<PathBuf> {
    let script = repo_root().join("models/fetch.sh");
    if !script.is_file() {
        bail!(
            "{}: fetch script not found (run from the statebench repository)",
            script.display()
        );
    }
    let status = std::process::Command::new("bash")
        .arg(&script)
        .status()
        .with_context(|| format!("{}: could not run bash", script.display()))?;
    if !status.success() {
        bail!(
            "{}: fetching the default model failed ({status}); see its output above",
            script.display()
        );
    }
    let path = repo_root().join(DEFAULT_MODEL);
    if !path.is_file() {
        bail!("{}: still missing after fetching", path.display());
    }
    Ok(path)
}

/// The model spec to load: the flag, or the default GGUF (fetched if missing).
fn resolve_model(arg: &Option<String>) -> Result<String> {
    if let Some(m) = arg {
        return Ok(m.clone());
    }
    let path = repo_root().join(DEFAULT_MODEL);
    let path = if path.is_file() {
        path
    } else {
        eprintln!("default model missing; fetching it with models/fetch.sh");
        fetch_default_model()?
    };
    Ok(path.to_string_lossy().into_owned())
}
