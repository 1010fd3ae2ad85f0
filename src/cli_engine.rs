//! The engine's commands: `generate`, `model fetch`, `bench`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::backend::{Backend, ChatRequest, Message, Role};
use crate::engine::model::{BatchItem, KvCache};
use crate::engine::{Engine, EngineOptions, DEFAULT_MODEL};

/// Options shared by commands that load a model.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// A .gguf file, a directory with config.json + safetensors, or a Hugging
    /// Face id (from the hub cache; downloaded unless HF_HUB_OFFLINE=1).
    /// Default: the default GGUF, fetched with models/fetch.sh if missing.
    #[arg(long)]
    pub model: Option<String>,
    /// Compute threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
}

/// `statebench generate`.
#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The user message.
    #[arg(
        long,
        default_value = "What is the capital of France? Answer in one word."
    )]
    pub prompt: String,
    /// A system message (default: whatever the model's template supplies).
    #[arg(long)]
    pub system: Option<String>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Seed of the sampler (used when temperature > 0).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Thinking mode (Qwen3 `enable_thinking`).
    #[arg(long)]
    pub think: bool,
    /// Also print the generated token ids.
    #[arg(long)]
    pub print_tokens: bool,
}

/// `statebench bench`.
#[derive(clap::Args, Debug)]
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
    /// Turns of the growing conversation.
    #[arg(long, default_value_t = 44)]
    pub turns: usize,
    /// Reply tokens per turn of the growing conversation.
    #[arg(long, default_value_t = 16)]
    pub turn_tokens: usize,
}

/// The repository root: the working directory if it holds `models/`, else
/// the directory the crate was built from.
fn repo_root() -> PathBuf {
    if Path::new("models/fetch.sh").is_file() {
        PathBuf::from(".")
    } else {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
    }
}

/// Runs `models/fetch.sh` (the one piece of code that fetches models).
pub fn fetch_default_model() -> Result<PathBuf> {
    let script = repo_root().join("models/fetch.sh");
    if !script.is_file() {
        bail!(
            "{}: fetch script not found (run from the statebench repository)",
            script.display()
        );
    }
    let status = Command::new("bash")
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
pub fn resolve_model(arg: &Option<String>) -> Result<String> {
    match arg {
        Some(m) => Ok(m.clone()),
        None => {
            let path = repo_root().join(DEFAULT_MODEL);
            let path = if path.is_file() {
                path
            } else {
                eprintln!("default model missing; fetching it with models/fetch.sh");
                fetch_default_model()?
            };
            Ok(path.to_string_lossy().into_owned())
        }
    }
}

fn load(args: &ModelArgs) -> Result<Engine> {
    let spec = resolve_model(&args.model)?;
    let opts = EngineOptions {
        threads: args.threads,
        ..EngineOptions::default()
    };
    Ok(Engine::load(&spec, opts)?)
}

/// `statebench generate`: one reply and its accounting.
pub fn generate(args: GenerateArgs) -> Result<()> {
    let mut engine = load(&args.model)?;
    let mut messages = Vec::new();
    if let Some(s) = &args.system {
        messages.push(Message::new(Role::System, s.clone()));
    }
    messages.push(Message::new(Role::User, args.prompt.clone()));
    let session = engine.open_session();
    let reply = engine.chat(
        session,
        ChatRequest {
            messages,
            max_tokens: args.max_tokens,
            stop: Vec::new(),
            thinking: args.think,
            temperature: args.temperature,
            seed: args.seed,
        },
    )?;
    if let Some(r) = &reply.reasoning {
        println!("<think>\n{r}\n</think>");
    }
    println!("{}", reply.content);
    if args.print_tokens {
        println!("tokens: {:?}", reply.tokens);
    }
    let u = reply.usage;
    let decode_tps = if u.decode_secs > 0.0 {
        (u.completion_tokens.saturating_sub(1)) as f64 / u.decode_secs
    } else {
        0.0
    };
    eprintln!(
        "finish: {:?} | prompt {} (cached {}) | completion {} | prefill {:.3}s | decode {:.3}s ({:.1} tok/s)",
        reply.finish,
        u.prompt_tokens,
        u.cached_tokens,
        u.completion_tokens,
        u.prefill_secs,
        u.decode_secs,
        decode_tps
    );
    Ok(())
}

/// `statebench model fetch`.
pub fn model_fetch() -> Result<()> {
    let path = fetch_default_model()?;
    println!("{}", path.display());
    Ok(())
}

/// Deterministic filler text for benchmarks.
fn filler(words: usize, salt: usize) -> String {
    const W: [&str; 12] = [
        "ledger", "invoice", "step", "booking", "order", "review", "audit", "ship", "draft",
        "check", "plan", "note",
    ];
    (0..words)
        .map(|i| W[(i * 7 + salt * 3) % W.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

/// `statebench bench`: prefill, batched decode, growing conversation.
pub fn bench(args: BenchArgs) -> Result<()> {
    let mut engine = load(&args.model)?;
    let id = engine.model_id();
    println!(
        "setup: model {} | {} | {} threads | f32 activations and KV cache | CPU",
        id.name,
        engine.format(),
        engine.threads()
    );

    // Prefill: one prompt of exactly N tokens, cold cache.
    let mut toks = engine.encode(&filler(args.prefill_tokens * 2, 0))?;
    toks.truncate(args.prefill_tokens);
    let mut cache = KvCache::default();
    let t = Instant::now();
    engine.forward(&mut [BatchItem {
        tokens: &toks,
        cache: &mut cache,
    }]);
    let secs = t.elapsed().as_secs_f64();
    println!(
        "prefill: {} tokens in {:.2}s = {:.1} tok/s",
        toks.len(),
        secs,
        toks.len() as f64 / secs
    );

    // Decode: B sequences with distinct 64-token prompts, N steps each.
    let mut base = 0.0;
    for &b in &args.batches {
        let prompts: Vec<Vec<u32>> = (0..b)
            .map(|i| {
                let mut p = engine.encode(&filler(100, i + 1)).unwrap_or_default();
                p.truncate(64);
                p
            })
            .collect();
        let mut caches: Vec<KvCache> = vec![KvCache::default(); b];
        {
            let mut items: Vec<BatchItem<'_>> = prompts
                .iter()
                .zip(caches.iter_mut())
                .map(|(p, c)| BatchItem {
                    tokens: p,
                    cache: c,
                })
                .collect();
            engine.forward(&mut items);
        }
        let feed: Vec<[u32; 1]> = (0..b).map(|i| [(i as u32 * 17 + 220) % 1000]).collect();
        let t = Instant::now();
        for _ in 0..args.decode_steps {
            let mut items: Vec<BatchItem<'_>> = feed
                .iter()
                .zip(caches.iter_mut())
                .map(|(f, c)| BatchItem {
                    tokens: f,
                    cache: c,
                })
                .collect();
            engine.forward(&mut items);
        }
        let secs = t.elapsed().as_secs_f64();
        let tps = (b * args.decode_steps) as f64 / secs;
        if b == 1 {
            base = tps;
        }
        let ratio = if base > 0.0 { tps / base } else { 0.0 };
        println!(
            "decode: batch {b:>2}: {tps:.1} tok/s aggregate ({:.1} per sequence, {ratio:.2}x batch 1)",
            tps / b as f64
        );
    }

    // Growing conversation: every turn re-sends the whole transcript. With
    // prefix reuse only the new tokens are prefilled; cold, all of them are.
    let mut messages = vec![Message::new(
        Role::System,
        "You keep a ledger of work orders.".to_string(),
    )];
    let session = engine.open_session();
    let mut warm = Vec::new();
    let mut transcripts = Vec::new();
    for turn in 0..args.turns {
        messages.push(Message::new(
            Role::User,
            format!("Turn {}: {}", turn + 1, filler(20, turn)),
        ));
        let req = ChatRequest {
            messages: messages.clone(),
            max_tokens: args.turn_tokens,
            stop: Vec::new(),
            thinking: false,
            temperature: 0.0,
            seed: 0,
        };
        transcripts.push(req.clone());
        let t = Instant::now();
        let reply = engine.chat(session, req)?;
        warm.push((t.elapsed().as_secs_f64(), reply.usage));
        messages.push(Message::new(Role::Assistant, reply.content));
    }
    // Cold cost at five sampled turns (running all of them cold takes minutes).
    let n = args.turns;
    let mut sample: Vec<usize> = [1, n / 4, n / 2, 3 * n / 4, n]
        .into_iter()
        .filter(|&t| t >= 1 && t <= n)
        .collect();
    sample.dedup();
    println!(
        "conversation: {n} turns, {} reply tokens each; seconds per turn (prompt tokens, reused):",
        args.turn_tokens
    );
    for &t in &sample {
        let s = engine.open_session();
        let start = Instant::now();
        let cold = engine.chat(s, transcripts[t - 1].clone())?;
        let cold_secs = start.elapsed().as_secs_f64();
        engine.close_session(s);
        let (w, u) = warm[t - 1];
        println!(
            "  turn {t:>3}: with reuse {w:.2}s ({} prompt, {} reused) | without reuse {cold_secs:.2}s ({} prompt, 0 reused)",
            u.prompt_tokens, u.cached_tokens, cold.usage.prompt_tokens
        );
    }
    let mean = warm.iter().map(|w| w.0).sum::<f64>() / n.max(1) as f64;
    println!("  mean per turn with reuse over all {n} turns: {mean:.2}s");
    Ok(())
}
