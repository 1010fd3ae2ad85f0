//! `statebench generate` and `statebench model fetch`.

use anyhow::Result;
use clap::{Args, Subcommand};

use statebench::backend::{ChatRequest, Message, Role};

use super::ModelArgs;

#[derive(Subcommand)]
pub enum ModelCommand {
    /// Fetch the default model (runs models/fetch.sh).
    Fetch,
    /// Write the model's tokenizer as a Hugging Face tokenizer directory
    /// (tokenizer.json, tokenizer_config.json with the chat template), for
    /// clients such as lm-eval that tokenize themselves.
    Tokenizer(TokenizerArgs),
}

/// `statebench model tokenizer`.
#[derive(Args, Debug)]
pub struct TokenizerArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The directory to write (created if missing).
    #[arg(long)]
    pub out: std::path::PathBuf,
}

/// Writes the tokenizer directory and names its files.
pub fn tokenizer(args: TokenizerArgs) -> Result<()> {
    let (spec, opts) = args.model.spec_and_options()?;
    let engine = statebench::engine::Engine::load(&spec, opts)?;
    for f in engine.export_tokenizer(&args.out)? {
        println!("{}", f.display());
    }
    Ok(())
}

/// `statebench generate`.
#[derive(Args, Debug)]
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

/// One reply and its accounting.
pub fn generate(args: GenerateArgs) -> Result<()> {
    let mut engine = args.model.load()?;
    let mut messages = Vec::new();
    if let Some(s) = &args.system {
        messages.push(Message::new(Role::System, s.clone()));
    }
    messages.push(Message::new(Role::User, args.prompt.clone()));
    let session = engine.open_session();
    let reply = engine.chat(
        session,
        ChatRequest {
            thinking: args.think,
            temperature: args.temperature,
            seed: args.seed,
            ..ChatRequest::greedy(messages, args.max_tokens)
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

/// `statebench model …`.
pub fn model(c: ModelCommand) -> Result<()> {
    match c {
        ModelCommand::Fetch => {
            println!("{}", super::fetch_default_model()?.display());
            Ok(())
        }
        ModelCommand::Tokenizer(a) => tokenizer(a),
    }
}
