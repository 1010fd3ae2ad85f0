//! `statebench check …`: whether a device keeps the engine's promises —
//! each kernel against the CPU's, the invariance of a request's tokens, and
//! a model's logits for given tokens (for comparison with a reference).
//! `check gpu` (`check_gpu.rs`) runs them all on a GPU machine.

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use serde::Serialize;

use statebench::engine::device::check::{self, Outcome};
use statebench::engine::device::{Cpu, Device, DeviceChoice};
use statebench::engine::Engine;

use super::{emit, ModelArgs};

#[derive(Subcommand)]
pub enum CheckCommand {
    /// Every device operation against the CPU's on random inputs: max abs and relative error, bf16 units, and whether it is within what the device's rounding allows.
    Kernels(KernelArgs),
    /// One request's tokens alone, in batches beside requests of other lengths, cached and cold.
    Invariance(InvarianceArgs),
    /// The last-position logits and the greedy continuation of given token ids.
    Logits(LogitArgs),
    /// Each CUDA kernel's registers, spills, shared memory and occupancy on sm_80, sm_89 and sm_90 (NVRTC, then ptxas -v), held to its budget.
    #[cfg(feature = "cuda")]
    Ptxas(PtxasArgs),
    /// The first thing to run on a GPU: driver, NVRTC and kernel image, kernels against the CPU, the pipeline depths, compute-sanitizer, invariance, split prefill, a greedy generation against the CPU engine, and each matrix product's time beside the performance model's prediction, as JSON. Exits non-zero naming the first failed check.
    #[cfg(feature = "cuda")]
    Gpu(super::check_gpu::GpuArgs),
}

#[cfg(feature = "cuda")]
#[derive(Args)]
pub struct PtxasArgs {
    /// NVIDIA's assembler (the CUDA toolkit's, or the nvidia-cuda-nvcc wheel's nvidia/cu13/bin/ptxas).
    #[arg(long, default_value = "ptxas")]
    ptxas: std::path::PathBuf,
}

#[derive(Args)]
pub struct KernelArgs {
    /// Device to check against the CPU: cuda, cuda:N, cuda-emulated or metal.
    #[arg(long)]
    device: DeviceChoice,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

#[derive(Args)]
pub struct InvarianceArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Batch sizes the request runs in.
    #[arg(long, value_delimiter = ',', default_value = "3,32,128")]
    batches: Vec<usize>,
    /// Tokens the request generates.
    #[arg(long, default_value_t = 24)]
    max_tokens: usize,
}

#[derive(Args)]
pub struct LogitArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Comma-separated token ids.
    #[arg(long, value_delimiter = ',', required = true)]
    tokens: Vec<u32>,
    /// Greedy tokens to continue with.
    #[arg(long, default_value_t = 0)]
    greedy: usize,
}

/// Runs `$body` with `$engine` bound to the engine `$args` name, on its
/// device (an engine's type depends on its device, so this is a macro).
macro_rules! with_engine {
    ($args:expr, |$engine:ident| $body:expr) => {{
        let (spec, opts) = $args.spec_and_options()?;
        match $args.device() {
            DeviceChoice::Cpu => {
                let mut $engine = Engine::load(&spec, opts)?;
                $body
            }
            #[cfg(feature = "cuda")]
            choice @ (DeviceChoice::Cuda(_) | DeviceChoice::CudaEmulated) => {
                let dev = statebench::engine::device::cuda::Cuda::open_choice(choice)?;
                let mut $engine = Engine::load_on(dev, &spec, opts)?;
                $body
            }
            #[cfg(feature = "metal")]
            DeviceChoice::Metal(n) => {
                let dev = statebench::engine::device::candle::Candle::metal(n)?;
                let mut $engine = Engine::load_on(dev, &spec, opts)?;
                $body
            }
            #[allow(unreachable_patterns)]
            other => anyhow::bail!("--device {other}: this statebench was built without it"),
        }
    }};
}
pub(crate) use with_engine;

pub fn run(c: CheckCommand) -> Result<()> {
    match c {
        CheckCommand::Kernels(a) => kernels(a),
        CheckCommand::Invariance(a) => with_engine!(a.model, |engine| invariance(&a, &mut engine)),
        CheckCommand::Logits(a) => with_engine!(a.model, |engine| logits(&a, &mut engine)),
        #[cfg(feature = "cuda")]
        CheckCommand::Ptxas(a) => ptxas(&a),
        #[cfg(feature = "cuda")]
        CheckCommand::Gpu(a) => super::check_gpu::run(&a),
    }
}

#[cfg(feature = "cuda")]
fn ptxas(a: &PtxasArgs) -> Result<()> {
    use statebench::engine::device::ptxas;
    let uses = ptxas::report(&a.ptxas).map_err(anyhow::Error::msg)?;
    emit(&ptxas::table(&uses))?;
    let over = ptxas::over_budget(&uses);
    if !over.is_empty() {
        bail!("{} over budget: {}", over.len(), over.join("; "));
    }
    Ok(())
}

#[derive(Serialize)]
struct KernelRow {
    kernel: &'static str,
    /// Within what the device's rounding allows (`check::agrees`).
    ok: bool,
    max_abs: f32,
    max_rel: f32,
    max_bf16_ulps: f32,
    values: usize,
}

fn kernels(a: KernelArgs) -> Result<()> {
    let diffs = match a.device {
        DeviceChoice::Cpu => check::compare(&Cpu, &Cpu, a.seed)?,
        #[cfg(feature = "cuda")]
        choice @ (DeviceChoice::Cuda(_) | DeviceChoice::CudaEmulated) => check::compare(
            &Cpu,
            &statebench::engine::device::cuda::Cuda::open_choice(choice)?,
            a.seed,
        )?,
        #[cfg(feature = "metal")]
        DeviceChoice::Metal(n) => check::compare(
            &Cpu,
            &statebench::engine::device::candle::Candle::metal(n)?,
            a.seed,
        )?,
        #[allow(unreachable_patterns)]
        other => bail!("--device {other}: this statebench was built without it"),
    };
    // The CUDA device rounds its results to bf16; candle's are f32.
    let rounding = if matches!(a.device, DeviceChoice::Cuda(_) | DeviceChoice::CudaEmulated) {
        check::Rounding::Bf16
    } else {
        check::Rounding::F32
    };
    let rows: Vec<KernelRow> = diffs
        .into_iter()
        .map(|d| KernelRow {
            ok: check::agrees(&d, rounding),
            kernel: d.kernel,
            max_abs: d.max_abs,
            max_rel: d.max_rel,
            max_bf16_ulps: d.max_bf16_ulps,
            values: d.values,
        })
        .collect();
    emit(&(serde_json::to_string_pretty(&rows)? + "\n"))
}

#[derive(Serialize)]
struct InvarianceRow {
    case: String,
    tokens: usize,
    hash: String,
}

fn invariance<D: Device>(a: &InvarianceArgs, engine: &mut Engine<D>) -> Result<()> {
    let outcomes = check::invariance(engine, &a.batches, a.max_tokens)?;
    let rows: Vec<InvarianceRow> = outcomes
        .into_iter()
        .map(|Outcome { case, tokens, hash }| InvarianceRow { case, tokens, hash })
        .collect();
    emit(&(serde_json::to_string_pretty(&rows)? + "\n"))
}

#[derive(Serialize)]
struct LogitsOut {
    device: String,
    /// The hardware; on the CPU, the kernel family that ran.
    hardware: String,
    last_logits: Vec<f32>,
    greedy: Vec<u32>,
}

fn logits<D: Device>(a: &LogitArgs, engine: &mut Engine<D>) -> Result<()> {
    let (first, greedy) = check::greedy_path(engine, &a.tokens, a.greedy)?;
    let info = engine.model().device.info();
    let out = LogitsOut {
        device: info.name,
        hardware: info.hardware,
        last_logits: first,
        greedy,
    };
    emit(&(serde_json::to_string(&out)? + "\n"))
}
