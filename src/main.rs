//! The statebench command line; each command is a few calls into the library.

mod cli;

use std::process::ExitCode;

use clap::Parser;

/// Weights on huge pages where Linux offers them (`statebench_kernels::alloc`).
#[global_allocator]
static ALLOC: statebench_kernels::alloc::HugePages = statebench_kernels::alloc::HugePages;

fn main() -> ExitCode {
    match cli::run(cli::Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        // A command that reports its outcome in the exit status (`tau2
        // explain`) has printed everything already.
        Err(e) => match e.downcast_ref::<cli::Exit>() {
            Some(cli::Exit(code)) => ExitCode::from(*code),
            None => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}
