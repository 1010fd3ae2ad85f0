//! The statebench command line; a thin layer over the library.

use clap::{Parser, Subcommand};
use statebench::cli_engine;

/// statebench: how strongly should task state act on an LLM agent?
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate one reply with the in-process engine and print its accounting.
    Generate(cli_engine::GenerateArgs),
    /// Manage model files.
    Model {
        #[command(subcommand)]
        command: ModelCmd,
    },
    /// Measure prefill, batched decode and growing-conversation cost.
    Bench(cli_engine::BenchArgs),
}

#[derive(Subcommand)]
enum ModelCmd {
    /// Fetch the default model (runs models/fetch.sh).
    Fetch,
}

fn main() {
    // One line per error, never a backtrace: the library's messages carry the hint.
    if let Err(e) = run(Cli::parse()) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Cmd::Generate(a) => cli_engine::generate(a),
        Cmd::Model {
            command: ModelCmd::Fetch,
        } => cli_engine::model_fetch(),
        Cmd::Bench(a) => cli_engine::bench(a),
    }
}
