//! `statebench bench`: the engine's figures, or with `--cell` a live cell
//! batched against one episode-arm at a time.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, ValueEnum};

use statebench::backend::shared::SharedBackend;
use statebench::backend::{Backend, ModelIdentity};
use statebench::bench::{self, EngineBenchOptions, Marks};
use statebench::engine::device::{Device, DeviceChoice};
use statebench::engine::Engine;
use statebench::ladder::episode::BriefVariant;
use statebench::ladder::run::cell::CellConfig;
use statebench_kernels::peak;

use super::{emit, BackendArgs, ModelArgs};

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt length of the prefill measurement (timed over three passes
    /// after one untimed, which faults in the activations' memory).
    #[arg(long, default_value_t = 512)]
    pub prefill_tokens: usize,
    /// Decode steps measured per batch size.
    #[arg(long, default_value_t = 32)]
    pub decode_steps: usize,
    /// Batch sizes of the decode measurement.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,32")]
    pub batches: Vec<usize>,
    /// Cached tokens of each sequence before the decode steps.
    #[arg(long, default_value_t = 64)]
    pub decode_context: usize,
    /// Turns of the growing conversation.
    #[arg(long, default_value_t = 44)]
    pub turns: usize,
    /// Reply tokens per turn of the growing conversation.
    #[arg(long, default_value_t = 16)]
    pub turn_tokens: usize,
    /// Also measure a 16-token request beside a prefill of this many prompt
    /// tokens, with the whole prefill chunk per step and with
    /// --mixed-prefill-chunk (0: not measured).
    #[arg(long, default_value_t = 0)]
    pub interleave_tokens: usize,
    /// Instead of the engine figures: run one small live cell batched (every
    /// episode-arm live at once) and again one episode-arm at a time, and
    /// report episodes per hour per arm and the share of prompt tokens served
    /// from cache.
    #[arg(long)]
    pub cell: bool,
    /// Instead of the engine figures: run a 4-cell grid (S = 5 and 10, the
    /// original and amended briefs, ρ = 0.15, four rungs) as one process
    /// and as its cells one after another, and report episodes per hour.
    #[arg(long, conflicts_with = "cell")]
    pub grid: bool,
    /// Profile the engine figures alone: the control and acknowledgement
    /// FIFOs of `perf record -D -1 --control fifo:CTL,ACK`, which statebench
    /// tells to sample only while prefill and decode are timed
    /// (`scripts/profile-cpu.sh` runs it for every figure).
    #[arg(long, value_name = "CTL,ACK", value_delimiter = ',', num_args = 1,
          conflicts_with_all = ["cell", "grid"])]
    pub perf_control: Vec<PathBuf>,
    /// Episode-arms in flight at most in the --grid benchmark (both runs).
    #[arg(long, default_value_t = 32)]
    pub live: usize,
    /// Episodes per arm of the --cell and --grid benchmarks.
    #[arg(long, default_value_t = 2)]
    pub cell_episodes: u64,
    /// Steps S of the --cell benchmark.
    #[arg(long, default_value_t = 5)]
    pub cell_steps: usize,
    /// Instead of measuring: the CUDA engine's performance model for
    /// Qwen3-8B on an H200 (each kernel's bytes, FLOPs and predicted time
    /// from its tile schedule), as Markdown. Predictions, not measurements.
    #[cfg(feature = "cuda")]
    #[arg(long, conflicts_with_all = ["cell", "grid"])]
    pub gpu_model: bool,
}

pub fn run(a: BenchArgs) -> Result<()> {
    #[cfg(feature = "cuda")]
    if a.gpu_model {
        print!("{}", gpu_model());
        return Ok(());
    }
    if a.cell {
        return cell(a);
    }
    if a.grid {
        return grid(a);
    }
    // Before the model loads, so a profiler that is not there is named at once.
    let mut marks = match a.perf_control.as_slice() {
        [] => Marks::default(),
        [ctl, ack] => Marks::perf(ctl, ack)?,
        _ => anyhow::bail!("--perf-control takes two paths, CTL,ACK"),
    };
    super::check::with_engine!(a.model, |e| engine(&a, &mut e, &mut marks))
}

/// The engine's figures on one device.
fn engine<D: Device>(a: &BenchArgs, engine: &mut Engine<D>, marks: &mut Marks) -> Result<()> {
    let id = engine.model_id()?;
    let device = engine.model().device.info();
    println!(
        "setup: model {} | {} | weights {} | {} threads | {} {} | arithmetic {}",
        id.name,
        id.format,
        a.model
            .weights
            .to_possible_value()
            .map_or_else(String::new, |v| v.get_name().to_string()),
        a.model.threads,
        device.name,
        device.hardware,
        device.arithmetic.split(':').next().unwrap_or_default()
    );
    // The host's own ceilings, measured on the engine's threads, so that
    // prefill and decode read as fractions of them.
    let ceilings = (device.name == "cpu")
        .then(|| engine.on_threads(|| (peak::int8_dot(), peak::stream_read())));
    if let Some((dot, stream)) = &ceilings {
        if let Some(d) = dot {
            println!(
                "host: int8 dot peak {:.1} GMAC/s ({})",
                d.per_sec / 1e9,
                d.how
            );
        }
        println!(
            "host: streaming read {:.1} GB/s ({})",
            stream.per_sec / 1e9,
            stream.how
        );
        if let Some(g) = statebench_kernels::cpu::wide_dot_gain() {
            println!(
                "host: a 512-bit vpdpbusd does {g:.2}x the work of a 256-bit one here; widened weights are held {}",
                if statebench_kernels::amx_tiles() {
                    "sixteen rows at a time (as the AMX tiles read them)"
                } else if statebench_kernels::cpu::pairs_pay() {
                    "sixteen rows at a time (512-bit kernels)"
                } else {
                    "in groups of eight rows (256-bit kernels)"
                }
            );
        }
        // Weights on 4 KiB pages stream slower (a page walk every 4 KiB):
        // a host that refuses huge pages shows it here.
        if let Some((bytes, setting)) = statebench_kernels::alloc::huge_page_use() {
            println!(
                "host: transparent huge pages {setting}; {:.0} MB of this process on 2 MiB pages (the weights asked for them)",
                bytes as f64 / 1e6
            );
        }
    }
    let cfg = &engine.model().cfg;
    let (layer_macs, head_macs) = (cfg.layer_macs_per_token(), cfg.head_macs());
    let streamed = engine.model().streamed_bytes();
    let b = bench::engine(
        engine,
        &EngineBenchOptions {
            prefill_tokens: a.prefill_tokens,
            decode_steps: a.decode_steps,
            batches: a.batches.clone(),
            decode_context: a.decode_context,
            turns: a.turns,
            turn_tokens: a.turn_tokens,
        },
        marks,
    )?;
    // Matrix products only: the layers' for every token, the output head
    // for the last.
    let macs = (b.prefill.tokens * layer_macs + head_macs) as f64 / b.prefill.secs;
    let of_peak = match ceilings.as_ref().and_then(|c| c.0.as_ref()) {
        Some(d) => format!(", {:.0}% of the int8 dot peak", 100.0 * macs / d.per_sec),
        None => String::new(),
    };
    println!(
        "prefill: {} tokens in {:.2}s = {:.1} tok/s | {:.1} GMAC/s{of_peak} (matrix products: {:.1} MMAC a token, the output head once; the mean of {} passes after one untimed)",
        b.prefill.tokens,
        b.prefill.secs,
        b.prefill.per_sec(),
        macs / 1e9,
        layer_macs as f64 / 1e6,
        bench::PREFILL_PASSES,
    );
    let base = b
        .decode
        .iter()
        .find(|(n, _)| *n == 1)
        .map(|(_, r)| r.per_sec());
    for (n, r) in &b.decode {
        let tps = r.per_sec();
        // Each step reads every weight once, whatever the batch.
        let reads = match streamed {
            Some(bytes) => {
                let rate = bytes as f64 * tps / *n as f64;
                let of = match &ceilings {
                    Some((_, s)) => {
                        format!(", {:.0}% of the streaming read", 100.0 * rate / s.per_sec)
                    }
                    None => String::new(),
                };
                format!(
                    " | weights {:.0} MB a step: {:.1} GB/s{of}",
                    bytes as f64 / 1e6,
                    rate / 1e9
                )
            }
            None => String::new(),
        };
        // Against batch 1 only where it was measured.
        let vs_one = base.map_or(String::new(), |x| format!(", {:.2}x batch 1", tps / x));
        println!(
            "decode: batch {n:>2}: {tps:.1} tok/s aggregate ({:.1} per sequence{vs_one}){reads}",
            tps / *n as f64,
        );
    }
    // No conversation measured, no lines about it.
    if a.turns > 0 {
        println!(
            "conversation: {} turns, {} reply tokens each; seconds per turn (prompt tokens, reused):",
            a.turns, a.turn_tokens
        );
        for t in &b.conversation {
            println!(
                "  turn {:>3}: with reuse {:.2}s ({} prompt, {} reused) | without reuse {:.2}s ({} prompt, 0 reused)",
                t.turn, t.warm_secs, t.warm.prompt_tokens, t.warm.cached_tokens, t.cold_secs, t.cold.prompt_tokens
            );
        }
        println!(
            "  mean per turn with reuse over all {} turns: {:.2}s",
            a.turns, b.mean_warm_secs
        );
    }
    if a.interleave_tokens > 0 {
        let whole = usize::try_from(a.model.prefill_chunk).unwrap_or(usize::MAX);
        let mixed = usize::try_from(a.model.mixed_prefill_chunk).unwrap_or(usize::MAX);
        let i = bench::interleave(engine, a.interleave_tokens, &[whole, mixed], mixed)?;
        println!(
            "interleaved: a {}-token reply alone {:.2}s; beside a {}-token prefill:",
            i.short_tokens, i.short_alone_secs, i.long_tokens
        );
        for (chunk, short, long) in &i.beside {
            println!(
                "  {chunk:>4} prompt tokens per step while it decodes: the reply {short:.2}s ({:.1}x alone), the long prompt {long:.2}s",
                short / i.short_alone_secs
            );
        }
    }
    Ok(())
}

/// The in-process engine for the live benchmarks.
fn spawn(a: &BenchArgs) -> Result<(SharedBackend, ModelIdentity)> {
    BackendArgs {
        model: a.model.clone(),
        endpoint: None,
        remote_model: None,
        api_key_env: String::new(),
        think: false,
        concurrency: usize::MAX,
    }
    .spawn()
}

fn grid(a: BenchArgs) -> Result<()> {
    let (shared, model) = spawn(&a)?;
    let mut cells = Vec::new();
    for steps in [5, 10] {
        for brief in [BriefVariant::Original, BriefVariant::Amended] {
            let mut c = CellConfig::quickstart(&model.name, steps, a.cell_episodes);
            c.episode.brief = brief;
            cells.push(c);
        }
    }
    let scratch =
        std::env::temp_dir().join(format!("statebench-bench-grid-{}", std::process::id()));
    let b = bench::grid(shared.client(), model, cells, a.live, &scratch)?;
    let mut out = format!(
        "grid: procurement S=5,10 x brief original,amended, rho=0.15, {} episodes x 4 arms a cell, model {}, {} threads, at most {} episode-arms live\n",
        a.cell_episodes, b.model, a.model.threads, b.live
    );
    out += &format!(
        "one process:        {:>7.1} s  {:>7.1} episode-arms/hour\n",
        b.grid_secs,
        b.grid_per_hour()
    );
    out += &format!(
        "cells in sequence:  {:>7.1} s  {:>7.1} episode-arms/hour\n",
        b.sequence_secs,
        b.sequence_per_hour()
    );
    out += &format!(
        "ratio {:.2}; transcripts identical between the two: {}\n",
        b.grid_per_hour() / b.sequence_per_hour(),
        if b.identical { "yes" } else { "NO" }
    );
    emit(&out)
}

fn cell(a: BenchArgs) -> Result<()> {
    let (shared, model) = spawn(&a)?;
    let cfg = CellConfig::quickstart(&model.name, a.cell_steps, a.cell_episodes);
    let scratch =
        std::env::temp_dir().join(format!("statebench-bench-cell-{}", std::process::id()));
    let b = bench::cell(shared.client(), model, cfg, &scratch)?;
    let c = &b.cell;
    let mut out = format!(
        "live cell: procurement S={} rho=0.15, {} episodes x {} arms, model {}, {} threads\n\
         batched: all {} episode-arms live at once, {:.1} s wall; sequential: one at a time, {:.1} s wall\n\
         transcripts identical between the two: {}\n\n\
         arm        episodes/hour batched  episodes/hour sequential  ratio  prompt tokens from cache\n",
        c.episode.steps,
        c.episodes,
        c.arms.len(),
        b.model,
        a.model.threads,
        c.episodes as usize * c.arms.len(),
        b.batched_secs,
        b.sequential_secs,
        if b.identical { "yes" } else { "NO" },
    );
    for r in &b.arms {
        out += &format!(
            "{:<10} {:>22.1}  {:>24.1}  {:>5.2}  {:>23.3}\n",
            r.arm,
            r.batched_per_hour,
            r.sequential_per_hour,
            r.batched_per_hour / r.sequential_per_hour.max(1e-9),
            r.cached_share
        );
    }
    emit(&out)
}

/// The performance model's tables: one row a scenario on each GPU, then
/// each kernel of three H200 scenarios with what binds it.
#[cfg(feature = "cuda")]
fn gpu_model() -> String {
    use statebench::engine::device::perf_model::{
        predict_scenario, scenarios, Gpu, A100, H200, QWEN3_8B,
    };
    let shape = QWEN3_8B;
    let header = |gpu: &Gpu| {
        format!(
            "Predicted, not measured: {} on an {} ({} SMs at {:.2} GHz; {:.2} of {:.2} TB/s of device memory attained; {:.0} TFLOP/s of mma.sync ({:.0}% of {:.0} dense bf16); {:.1} TB/s of shared memory; {:.0} TB/s of L2; {:.1} µs a graph node).\n\n",
            shape.name,
            gpu.name,
            gpu.sms,
            gpu.clock / 1e9,
            gpu.bandwidth() / 1e12,
            gpu.dram / 1e12,
            gpu.mma() / 1e12,
            gpu.mma_fraction * 100.0,
            gpu.peak_bf16 / 1e12,
            gpu.smem_bandwidth() / 1e12,
            gpu.l2_bandwidth / 1e12,
            gpu.launch * 1e6
        )
    };
    let all = scenarios();
    let summary = |gpu: &Gpu| {
        let mut out = header(gpu);
        out += "| scenario | predicted | step | bandwidth roofline |\n|---|---:|---:|---:|\n";
        for sc in &all {
            let (secs, roof, _) = predict_scenario(&shape, gpu, sc);
            out += &format!(
                "| {} | {:.0} tok/s | {:.2} ms | {:.0} tok/s |\n",
                sc.name,
                sc.tokens as f64 / secs,
                secs * 1e3,
                sc.tokens as f64 / roof
            );
        }
        out
    };
    let mut out = summary(&H200);
    for sc in [&all[0], &all[3], &all[4]] {
        let (secs, _, costs) = predict_scenario(&shape, &H200, sc);
        out += &format!(
            "\n{} ({:.2} ms):\n\n| kernel | launches | HBM GB | L2 GB | shared GB | TFLOP | blocks | ms | bound by |\n|---|---:|---:|---:|---:|---:|---:|---:|---|\n",
            sc.name,
            secs * 1e3
        );
        for k in costs {
            out += &format!(
                "| {} | {} | {:.3} | {:.3} | {:.3} | {:.2} | {} | {:.3} | {} |\n",
                k.kernel.trim(),
                k.launches,
                k.bytes / 1e9,
                k.l2_bytes / 1e9,
                k.smem_bytes / 1e9,
                k.flops / 1e12,
                k.blocks,
                k.secs * 1e3,
                k.bound.name()
            );
        }
    }
    out += "\n";
    out += &summary(&A100);
    out
}
