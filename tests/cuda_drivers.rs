//! The engine against the drivers and NVRTCs its users have, on the CUDA
//! emulator impersonating them (`STATEBENCH_EMULATOR_DRIVER_VERSION`,
//! `STATEBENCH_EMULATOR_NVRTC_VERSION`): which image each pair builds, the
//! pairs that run, and the one-line refusals of those that cannot. The
//! emulator refuses what the impersonated driver would refuse (PTX of a
//! newer ISA, a cubin from a newer major NVRTC), so a plan that chose
//! wrong fails here as it would on the GPU.
//!
//! Each pair runs in a child process: the emulator reads its settings once
//! a process, as a driver is what it is for the life of one.
#![cfg(all(feature = "cuda", target_os = "linux"))]

mod engine_common;

use std::process::Command;

use engine_common::root;

/// This binary's `child` test running `case` in a process of its own,
/// under the emulator settings `env` (and only those).
fn in_child(case: &str, env: &[(&str, &str)]) -> (bool, String) {
    engine_common::in_child("STATEBENCH_DRIVER_CASE", case, env)
}

/// What follows `prefix` on the first of the child's lines that holds it
/// (the test harness may have begun the line).
fn line<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.find(prefix).map(|at| &l[at + prefix.len()..]))
}

#[test]
#[ignore = "the entry point of the driver tests' child processes"]
fn child() {
    use statebench::engine::device::cuda::{self, Cuda};
    use statebench::engine::device::{Device, HostWeight};
    use statebench_kernels::Matrix;
    match std::env::var("STATEBENCH_DRIVER_CASE").as_deref() {
        // Opens the emulated device and runs one matrix product through
        // the kernels it loaded, timed with events as `check gpu` times.
        Ok("open") => match Cuda::open_emulated() {
            Ok(dev) => {
                println!("versions: {}", dev.versions());
                println!("image: {}", dev.image());
                println!("detail: {}", dev.info().detail);
                let values: Vec<f32> = (0..64 * 128).map(|i| (i % 13) as f32 / 16.0).collect();
                let m = Matrix::from_f32(64, 128, values).expect("a matrix");
                let w = dev.weight(HostWeight::Matrix(m)).expect("a weight uploads");
                match dev.time_matmul(&w, 3, 2) {
                    Ok(us) => println!("timed: {}", us >= 0.0),
                    Err(e) => println!("timing error: {}", statebench::one_line(&e)),
                }
            }
            Err(e) => println!("error: {}", statebench::one_line(&e)),
        },
        // Loads the emulated NVRTC's PTX straight into a context, past the
        // engine's plan: what the driver itself says of it.
        Ok("load-ptx") => {
            cuda::load_emulator().expect("the emulator loads");
            let ctx = cudarc::driver::CudaContext::new(0).expect("the emulated device opens");
            let (name, body) = statebench_kernels::cuda::SOURCES[1];
            let c = cuda::compile(name, body, "compute_80").unwrap_or_else(|e| panic!("{e}"));
            match ctx.load_module(cudarc::nvrtc::Ptx::from_src(c.ptx)) {
                Ok(_) => println!("loaded"),
                Err(e) => println!("load error: {e:?}"),
            }
        }
        _ => {}
    }
}

/// Each supported pair opens, builds the image the plan names, and runs
/// and times a product through it; the image and both versions are in
/// the device's detail (which the run manifest records).
#[test]
#[cfg_attr(
    not(has_cuda_emulator),
    ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
)]
fn supported_drivers_and_nvrtcs_build_the_image_the_plan_names_and_run() {
    engine_common::require_emulator();
    for (driver, nvrtc, image, want) in [
        ("13000", "13.0", "", "cubin sm_80"),
        ("12080", "12.8", "", "cubin sm_80"),
        // Minor-version compatibility: a 12.8 cubin on a 12.4 driver.
        ("12040", "12.8", "", "cubin sm_80"),
        ("12040", "12.4", "", "cubin sm_80"),
        ("12040", "12.4", "ptx", "PTX compute_80"),
        ("13000", "12.4", "ptx", "PTX compute_80"),
    ] {
        let mut env = vec![
            ("STATEBENCH_EMULATOR_DRIVER_VERSION", driver),
            ("STATEBENCH_EMULATOR_NVRTC_VERSION", nvrtc),
        ];
        if !image.is_empty() {
            env.push(("STATEBENCH_CUDA_IMAGE", image));
        }
        let (ok, text) = in_child("open", &env);
        let case = format!("driver {driver}, NVRTC {nvrtc}, image {image:?}");
        assert!(ok, "{case}:\n{text}");
        assert_eq!(line(&text, "error: "), None, "{case}:\n{text}");
        let n: i32 = driver.parse().expect("a driver number");
        let cuda = format!("{}.{}", n / 1000, n % 1000 / 10);
        assert_eq!(
            line(&text, "versions: "),
            Some(format!("driver CUDA {cuda}, NVRTC {nvrtc}").as_str()),
            "{case}:\n{text}"
        );
        assert_eq!(line(&text, "image: "), Some(want), "{case}:\n{text}");
        let detail =
            format!("emulated driver CUDA {cuda}, NVRTC {nvrtc}, {want}, compute capability 8.0");
        assert!(
            line(&text, "detail: ").is_some_and(|d| d.starts_with(&detail)),
            "{case}: the detail does not begin {detail:?}:\n{text}"
        );
        assert_eq!(line(&text, "timed: "), Some("true"), "{case}:\n{text}");
    }
}

/// Pairs that cannot run are refused in one line naming both versions and
/// what to install, before any kernel is built.
#[test]
#[cfg_attr(
    not(has_cuda_emulator),
    ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
)]
fn pairs_that_cannot_run_are_refused_in_one_line_naming_both_versions() {
    engine_common::require_emulator();
    for (driver, nvrtc, image, needles) in [
        (
            "12040",
            "13.0",
            "",
            &[
                "driver CUDA 12.4, NVRTC 13.0",
                "pip install \"nvidia-cuda-nvrtc-cu12>=12.4\"",
            ][..],
        ),
        (
            "12040",
            "13.0",
            "ptx",
            &["driver CUDA 12.4, NVRTC 13.0", "nvidia-cuda-nvrtc-cu12"][..],
        ),
        (
            "12040",
            "12.8",
            "ptx",
            &[
                "driver CUDA 12.4, NVRTC 12.8",
                "PTX ISA 8.7",
                "up to 8.4",
                "unset STATEBENCH_CUDA_IMAGE",
            ][..],
        ),
        (
            "11080",
            "12.4",
            "",
            &[
                "driver CUDA 11.8",
                "older than CUDA 12.4",
                "driver of CUDA 12.4 or later",
            ][..],
        ),
    ] {
        let mut env = vec![
            ("STATEBENCH_EMULATOR_DRIVER_VERSION", driver),
            ("STATEBENCH_EMULATOR_NVRTC_VERSION", nvrtc),
        ];
        if !image.is_empty() {
            env.push(("STATEBENCH_CUDA_IMAGE", image));
        }
        let (_, text) = in_child("open", &env);
        let case = format!("driver {driver}, NVRTC {nvrtc}, image {image:?}");
        let err = line(&text, "error: ").unwrap_or_else(|| panic!("{case} opened:\n{text}"));
        for n in needles {
            assert!(err.contains(n), "{case}: {n:?} not in {err:?}");
        }
        assert!(!text.contains("timed: "), "{case}:\n{text}");
    }
}

/// What the plan avoids is what the driver refuses: PTX of NVRTC 12.8
/// (ISA 8.7) loaded past the plan into a CUDA 12.4 driver (ISA 8.4) fails
/// with CUDA_ERROR_UNSUPPORTED_PTX_VERSION, as on a GPU; the same PTX on a
/// 12.8 driver loads.
#[test]
#[cfg_attr(
    not(has_cuda_emulator),
    ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
)]
fn ptx_newer_than_the_driver_is_refused_by_the_driver_itself() {
    engine_common::require_emulator();
    let (_, old) = in_child(
        "load-ptx",
        &[
            ("STATEBENCH_EMULATOR_DRIVER_VERSION", "12040"),
            ("STATEBENCH_EMULATOR_NVRTC_VERSION", "12.8"),
        ],
    );
    assert!(
        line(&old, "load error: ")
            .is_some_and(|e| e.contains("CUDA_ERROR_UNSUPPORTED_PTX_VERSION")),
        "{old}"
    );
    assert!(
        old.contains("PTX ISA 8.7 is newer than a CUDA 12.4 driver loads (8.4)"),
        "{old}"
    );
    let (_, new) = in_child(
        "load-ptx",
        &[
            ("STATEBENCH_EMULATOR_DRIVER_VERSION", "12080"),
            ("STATEBENCH_EMULATOR_NVRTC_VERSION", "12.8"),
        ],
    );
    assert_eq!(line(&new, "loaded"), Some(""), "{new}");
}

/// Emulator settings that are not what they must be are refused in one
/// line naming the variable, not taken as a default.
#[test]
#[cfg_attr(
    not(has_cuda_emulator),
    ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
)]
fn bad_emulator_settings_are_refused_naming_the_variable() {
    engine_common::require_emulator();
    for (var, value) in [
        ("STATEBENCH_EMULATOR_MEMORY_GIB", "0"),
        ("STATEBENCH_EMULATOR_MEMORY_GIB", "-1"),
        ("STATEBENCH_EMULATOR_MEMORY_GIB", "NaN"),
        ("STATEBENCH_EMULATOR_MEMORY_GIB", "lots"),
        ("STATEBENCH_EMULATOR_MEMORY_GIB", "1e30"),
        ("STATEBENCH_EMULATOR_DRIVER_VERSION", "abc"),
        ("STATEBENCH_EMULATOR_DRIVER_VERSION", "12.4"),
        ("STATEBENCH_EMULATOR_NVRTC_VERSION", "x"),
        ("STATEBENCH_EMULATOR_NVRTC_VERSION", "12040"),
        ("STATEBENCH_CUDA_IMAGE", "sass"),
    ] {
        let (_, text) = in_child("open", &[(var, value)]);
        let err = line(&text, "error: ").unwrap_or_else(|| panic!("{var}={value} opened:\n{text}"));
        assert!(
            err.contains(var) && err.contains(value),
            "{var}={value}: {err:?}"
        );
    }
}

/// `check gpu` end to end on the emulator impersonating the oldest pair it
/// supports (a CUDA 12.4 driver, NVRTC 12.4): every check passes, and the
/// report names the versions and the image.
#[test]
#[cfg_attr(
    not(has_cuda_emulator),
    ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
)]
fn check_gpu_passes_on_a_cuda_12_4_driver() {
    engine_common::require_emulator();
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("gpu-check.json");
    let model = root().join("tests/fixtures/engine/tiny-qwen2");
    let out = Command::new(env!("CARGO_BIN_EXE_statebench"))
        .args(["check", "gpu", "--device", "cuda-emulated", "--model"])
        .arg(&model)
        .arg("--json")
        .arg(&json)
        .env("STATEBENCH_EMULATOR_DRIVER_VERSION", "12040")
        .env("STATEBENCH_EMULATOR_NVRTC_VERSION", "12.4")
        .env_remove("STATEBENCH_CUDA_IMAGE")
        .output()
        .expect("statebench runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("the report")).expect("JSON");
    assert_eq!(report["driver_version"], "12.4", "{report}");
    assert_eq!(report["nvrtc_version"], "12.4", "{report}");
    assert_eq!(report["image"], "cubin sm_80", "{report}");
    let checks = report["checks"].as_array().expect("checks");
    assert!(checks.len() >= 5, "{report}");
    for c in checks {
        assert_eq!(c["ok"], true, "{c}");
    }
    let kernels = report["kernels"].as_array().expect("kernels");
    assert!(!kernels.is_empty(), "{report}");
}
