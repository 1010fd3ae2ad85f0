//! The CUDA emulator's checks on the engine's own kernels: every kernel
//! runs clean under them, removing any one `__syncthreads();` of the
//! sources is reported as a race, the schedule's seed changes no bit of
//! what they compute, and kernel sources read from a directory
//! (`STATEBENCH_CUDA_SOURCE_DIR`) are compiled and, when they differ from
//! the built-in ones, recorded as another arithmetic.
#![cfg(all(feature = "cuda", target_os = "linux"))]

mod engine_common;

use std::path::Path;
use std::process::{Command, Output};

use engine_common::root;

/// `statebench` with `args`, its emulator settings those of `env` only.
fn statebench_with(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_statebench"));
    cmd.args(args);
    for var in [
        "STATEBENCH_EMULATOR_CHECKS",
        "STATEBENCH_EMULATOR_ASAN",
        "STATEBENCH_EMULATOR_SCHEDULE_SEED",
        "STATEBENCH_EMULATOR_FIBERS",
        "STATEBENCH_CUDA_SOURCE_DIR",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("statebench runs")
}

fn check_kernels(env: &[(&str, &str)]) -> Output {
    statebench_with(&["check", "kernels", "--device", "cuda-emulated"], env)
}

/// The kernel sources' directory, copied to `dir`.
fn copy_sources(dir: &Path) {
    let src = root().join("kernels/cuda");
    for e in std::fs::read_dir(&src).expect("kernels/cuda") {
        let p = e.expect("entry").path();
        if p.is_file() {
            std::fs::copy(&p, dir.join(p.file_name().expect("name"))).expect("copy");
        }
    }
}

/// Every `__syncthreads();` of the kernel sets, as (file, byte offset),
/// found in the text.
fn barriers() -> Vec<(String, usize)> {
    let mut sites = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(root().join("kernels/cuda"))
        .expect("kernels/cuda")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    files.sort();
    for p in files {
        let text = std::fs::read_to_string(&p).expect("source");
        let name = p.file_name().expect("name").to_string_lossy().into_owned();
        sites.extend(
            text.match_indices("__syncthreads();")
                .map(|(at, _)| (name.clone(), at)),
        );
    }
    sites
}

/// Removing any one barrier of the kernels makes `statebench check kernels`
/// on the emulator fail with a race: each barrier is needed, and the
/// checker sees what a missing one does.
#[test]
#[cfg_attr(
    not(has_cuda_emulator),
    ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
)]
fn removing_any_syncthreads_of_the_kernels_is_reported_as_a_race() {
    engine_common::require_emulator();
    let sites = barriers();
    assert!(sites.len() >= 7, "{sites:?}");
    for (file, at) in sites {
        let dir = tempfile::tempdir().expect("tempdir");
        copy_sources(dir.path());
        let path = dir.path().join(&file);
        let text = std::fs::read_to_string(&path).expect("source");
        let line = text[..at].lines().count() + usize::from(!text[..at].ends_with('\n'));
        let mut cut = text.clone();
        cut.replace_range(at..at + "__syncthreads();".len(), "");
        std::fs::write(&path, cut).expect("write");
        let o = check_kernels(&[(
            "STATEBENCH_CUDA_SOURCE_DIR",
            dir.path().to_str().expect("utf-8"),
        )]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && err.contains("race on shared"),
            "without the __syncthreads() of {file}:{line}, check kernels did not report a race:\n{err}"
        );
    }
}

/// The kernels' results do not depend on the order the emulator runs their
/// threads and blocks in, nor on how it switches between them: `check
/// kernels` and `check invariance` give the same figures and hashes in
/// thread order, under two seeds, and on the ucontext fibers that hosts
/// other than x86-64 run (`STATEBENCH_EMULATOR_FIBERS=ucontext`).
#[test]
#[cfg_attr(
    not(has_cuda_emulator),
    ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
)]
fn the_schedule_seed_changes_no_bit_of_what_the_kernels_compute() {
    engine_common::require_emulator();
    let model = root().join("tests/fixtures/engine/tiny-qwen2");
    let model = model.to_str().expect("utf-8");
    let mut kernels = Vec::new();
    let mut hashes = Vec::new();
    for (seed, fibers) in [
        ("0", "native"),
        ("1", "native"),
        ("8146", "native"),
        ("8146", "ucontext"),
    ] {
        let env = [
            ("STATEBENCH_EMULATOR_SCHEDULE_SEED", seed),
            ("STATEBENCH_EMULATOR_FIBERS", fibers),
        ];
        let o = check_kernels(&env);
        assert!(
            o.status.success(),
            "seed {seed}, {fibers} fibers: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        kernels.push(String::from_utf8_lossy(&o.stdout).into_owned());
        let o = statebench_with(
            &[
                "check",
                "invariance",
                "--device",
                "cuda-emulated",
                "--model",
                model,
                "--batches",
                "3",
                "--max-tokens",
                "6",
                "--kv-budget-gib",
                "0.0625",
            ],
            &env,
        );
        assert!(
            o.status.success(),
            "seed {seed}, {fibers} fibers: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        hashes.push(String::from_utf8_lossy(&o.stdout).into_owned());
    }
    assert!(kernels.iter().all(|k| *k == kernels[0]), "{kernels:#?}");
    assert!(hashes.iter().all(|h| *h == hashes[0]), "{hashes:#?}");
}

/// Refused emulator settings end the command with one line naming them.
#[test]
#[cfg_attr(
    not(has_cuda_emulator),
    ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
)]
fn a_refused_emulator_setting_is_one_line_naming_it() {
    engine_common::require_emulator();
    for (var, value, needle) in [
        (
            "STATEBENCH_EMULATOR_SCHEDULE_SEED",
            "seven",
            "STATEBENCH_EMULATOR_SCHEDULE_SEED=seven is not an unsigned 64-bit integer",
        ),
        (
            "STATEBENCH_EMULATOR_CHECKS",
            "all",
            "STATEBENCH_EMULATOR_CHECKS=all is not one of races, asan, off",
        ),
        (
            "STATEBENCH_EMULATOR_FIBERS",
            "green",
            "STATEBENCH_EMULATOR_FIBERS=green is not one of native, ucontext",
        ),
    ] {
        let o = check_kernels(&[(var, value)]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{var}={value} was accepted");
        assert!(err.contains(needle), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}

/// Runs in a child process (`STATEBENCH_RACES_CASE=info`): opens the
/// emulated device and prints its detail and arithmetic, or its error.
#[test]
#[ignore = "the entry point of the source-directory test's child processes"]
fn child() {
    if std::env::var("STATEBENCH_RACES_CASE").as_deref() != Ok("info") {
        return;
    }
    use statebench::engine::device::Device;
    match statebench::engine::device::cuda::Cuda::open_emulated() {
        Ok(dev) => {
            let info = dev.info();
            println!("detail: {}", info.detail);
            println!("arithmetic: {}", info.arithmetic);
        }
        Err(e) => println!("error: {}", statebench::one_line(&e)),
    }
}

/// The emulated device's `detail:`/`arithmetic:`/`error:` lines with `env`.
fn device_info(env: &[(&str, &str)]) -> String {
    let (_, text) = engine_common::in_child("STATEBENCH_RACES_CASE", "info", env);
    text.lines()
        // The harness begins the first line with the test's name.
        .map(|l| l.trim_start_matches("test child ... "))
        .filter(|l| {
            l.starts_with("detail: ") || l.starts_with("arithmetic: ") || l.starts_with("error: ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Sources from `STATEBENCH_CUDA_SOURCE_DIR`: a copy of the built-in ones
/// is the same arithmetic; an edited one is recorded as modified, with the
/// directory and a digest of its files; a missing file is an error naming
/// it. The detail names the checks and the seed.
#[test]
#[cfg_attr(
    not(has_cuda_emulator),
    ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
)]
fn kernel_sources_from_a_directory_are_compiled_and_recorded() {
    engine_common::require_emulator();
    let builtin = statebench_kernels::cuda::EMULATED_ARITHMETIC;
    let plain = device_info(&[("STATEBENCH_EMULATOR_SCHEDULE_SEED", "42")]);
    assert!(
        plain.contains(&format!("arithmetic: {builtin}\n"))
            || plain.ends_with(&format!("arithmetic: {builtin}")),
        "{plain}"
    );
    assert!(
        plain.contains(
            ", kernels checked for races, uninitialized reads and out-of-bounds accesses, schedule seed 42"
        ),
        "{plain}"
    );
    assert!(!plain.contains("fibers"), "{plain}");
    let fibers = device_info(&[("STATEBENCH_EMULATOR_FIBERS", "ucontext")]);
    assert!(
        fibers.contains(", schedule seed 1, ucontext fibers"),
        "{fibers}"
    );
    let asan = device_info(&[("STATEBENCH_EMULATOR_CHECKS", "asan")]);
    assert!(
        asan.contains(", kernels under AddressSanitizer, schedule seed 1"),
        "{asan}"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    copy_sources(dir.path());
    let d = dir.path().to_str().expect("utf-8");
    let same = device_info(&[("STATEBENCH_CUDA_SOURCE_DIR", d)]);
    assert!(same.ends_with(&format!("arithmetic: {builtin}")), "{same}");

    let norm = dir.path().join("norm.cu");
    let text = std::fs::read_to_string(&norm).expect("norm.cu");
    std::fs::write(&norm, text + "\n// edited\n").expect("write");
    let edited = device_info(&[("STATEBENCH_CUDA_SOURCE_DIR", d)]);
    assert!(
        edited.contains(&format!(
            "arithmetic: {builtin}; kernel sources modified ({d}, sha256 "
        )),
        "{edited}"
    );

    std::fs::remove_file(dir.path().join("ptx.cuh")).expect("remove");
    let missing = device_info(&[("STATEBENCH_CUDA_SOURCE_DIR", d)]);
    assert!(
        missing.starts_with("error: ") && missing.contains(&format!("{d}/ptx.cuh")),
        "{missing}"
    );
    assert_eq!(missing.lines().count(), 1, "{missing}");
}
