//! `statebench bench`: the engine's figures, or with `--cell` a live cell
//! batched against one episode-arm at a time.

use anyhow::Result;
use clap::Args;

use statebench::backend::Backend;
use statebench::bench::{self, EngineBenchOptions};
use statebench::engine::device::{Device, DeviceChoice};
use statebench::engine::Engine;
use statebench::ladder::run::cell::CellConfig;

use super::{emit, BackendArgs, ModelArgs};

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt length of the prefill measurement.
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
    /// Instead of the engine figures: run one small live cell batched (every
    /// episode-arm live at once) and again one episode-arm at a time, and
    /// report episodes per hour per arm and the share of prompt tokens served
    /// from cache.
    #[arg(long)]
    pub cell: bool,
    /// Episodes per arm of the --cell benchmark.
    #[arg(long, default_value_t = 2)]
    pub cell_episodes: u64,
    /// Steps S of the --cell benchmark.
    #[arg(long, default_value_t = 5)]
    pub cell_steps: usize,
}

pub fn run(a: BenchArgs) -> Result<()> {
    if a.cell {
        return cell(a);
    }
    super::check::with_engine!(a.model, |e| engine(&a, &mut e))
}

/// The engine's figures on one device.
fn engine<D: Device>(a: &BenchArgs, engine: &mut Engine<D>) -> Result<()> {
    let id = engine.model_id()?;
    let device = engine.model().device.info();
    println!(
        "setup: model {} | {} | {} threads | f32 activations and KV cache | {} {}",
        id.name, id.format, a.model.threads, device.name, device.hardware
    );
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
    )?;
    println!(
        "prefill: {} tokens in {:.2}s = {:.1} tok/s",
        b.prefill.tokens,
        b.prefill.secs,
        b.prefill.per_sec()
    );
    let base = b
        .decode
        .iter()
        .find(|(n, _)| *n == 1)
        .map(|(_, r)| r.per_sec());
    for (n, r) in &b.decode {
        let tps = r.per_sec();
        println!(
            "decode: batch {n:>2}: {tps:.1} tok/s aggregate ({:.1} per sequence, {:.2}x batch 1)",
            tps / *n as f64,
            base.map_or(0.0, |x| tps / x)
        );
    }
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
    Ok(())
}

fn cell(a: BenchArgs) -> Result<()> {
    let backend = BackendArgs {
        model: a.model.clone(),
        endpoint: None,
        remote_model: None,
        api_key_env: String::new(),
        think: false,
        concurrency: usize::MAX,
    };
    let (shared, model) = backend.spawn()?;
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
        c.steps,
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
