//! Tells the tests which of the resources some of them need are here, as
//! cfgs: `has_default_model` (the default GGUF under `models/`),
//! `has_nvrtc` and `has_ptxas` (the CUDA kernel tests, with the `cuda`
//! feature), `has_cuda_emulator` (built by `kernels/build.rs` where a C++
//! compiler answers), `has_tau2_data` (the τ²-bench airline data at
//! `../shared/tau2-airline`). A test needing one that is absent is ignored with the
//! reason, so the harness counts it as ignored, never as passed. With
//! `STATEBENCH_REQUIRE` or `CI` set every cfg is set: each such test runs
//! and fails on what is missing, as CI wants.
//!
//! The library path and `PATH` are read but not watched: a change of either
//! would rebuild the crate. A build that found NVRTC or ptxas and a run
//! that does not fail the test; the other way round ignores it.

use std::path::Path;
use std::process::Command;

include!("src/engine/default_model.rs");

/// Where the τ²-bench airline tests read their data, from the crate root.
const TAU2_DATA: &str = "../shared/tau2-airline";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/engine/default_model.rs");
    // The folder, not the file: a missing file would rerun this every build.
    println!("cargo:rerun-if-changed=models");
    println!("cargo:rerun-if-changed={TAU2_DATA}");
    for var in ["STATEBENCH_REQUIRE", "CI", "STATEBENCH_PTXAS"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let required = ["STATEBENCH_REQUIRE", "CI"]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()));
    let cuda = std::env::var_os("CARGO_FEATURE_CUDA").is_some();
    let found = [
        ("has_default_model", Path::new(DEFAULT_MODEL).is_file()),
        ("has_nvrtc", cuda && nvrtc()),
        ("has_ptxas", cuda && ptxas()),
        (
            "has_tau2_data",
            Path::new(TAU2_DATA).join("db.json").is_file(),
        ),
        (
            "has_cuda_emulator",
            std::env::var_os("DEP_STATEBENCH_CUDA_EMULATOR_DIR").is_some(),
        ),
    ];
    for (cfg, here) in found {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
        if here || required {
            println!("cargo::rustc-cfg={cfg}");
        }
    }
}

/// Whether NVRTC loads, by the names cudarc tries on Linux for CUDA 13.
fn nvrtc() -> bool {
    ["libnvrtc.so", "libnvrtc.so.13"].into_iter().any(|name| {
        // SAFETY: loading NVRTC runs no code of ours; it is closed at once.
        unsafe { libloading::Library::new(name) }.is_ok()
    })
}

/// Whether ptxas runs, as the ptxas budget test calls it.
fn ptxas() -> bool {
    let exe = std::env::var_os("STATEBENCH_PTXAS").unwrap_or_else(|| "ptxas".into());
    Command::new(exe).arg("--version").output().is_ok()
}
