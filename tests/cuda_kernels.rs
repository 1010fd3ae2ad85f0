//! Every CUDA kernel set compiles under NVRTC, for the compute capabilities
//! the engine targets, without an error or a warning; so do the inline-PTX
//! wrappers (`kernels/cuda/ptx.cuh`) in their GPU branch, through the
//! standalone kernels the emulator tests run. No GPU is needed:
//! NVRTC alone (the `nvidia-cuda-nvrtc` wheel `.ci/run` installs) compiles
//! to PTX. Where the build found no NVRTC (or no ptxas) the tests are
//! ignored, except in CI (`build.rs`), where they fail.
#![cfg(feature = "cuda")]

use statebench::engine::device::cuda::{compile, nvrtc_available};

#[test]
#[cfg_attr(not(has_nvrtc), ignore = "needs NVRTC (libnvrtc) on the library path")]
fn every_cuda_kernel_compiles_without_errors_or_warnings() {
    assert!(
        nvrtc_available(),
        "NVRTC (libnvrtc) is not on the library path"
    );
    // Ampere, Ada and Hopper; the H200 is compute capability 9.0.
    for arch in ["compute_80", "compute_89", "compute_90"] {
        for (name, body) in statebench_kernels::cuda::SOURCES {
            let c = compile(name, body, arch)
                .unwrap_or_else(|e| panic!("{arch}: {}", statebench::one_line(&e)));
            assert!(
                c.log.is_empty(),
                "{name} ({arch}) compiles with a log:\n{}",
                c.log
            );
            assert!(
                c.ptx.contains(".entry"),
                "{name} ({arch}): no kernel in the PTX"
            );
        }
        let c = compile("ptx_check", include_str!("cuda/ptx_check.cu"), arch)
            .unwrap_or_else(|e| panic!("ptx_check ({arch}): {}\n{}", e.first_error, e.log));
        assert!(c.log.is_empty(), "ptx_check ({arch}): {}", c.log);
        for op in [
            "mma.sync.aligned.m16n8k16",
            "ldmatrix.sync.aligned.m8n8.x4.trans",
            "cp.async.wait_group 1",
        ] {
            assert!(c.ptx.contains(op), "ptx_check ({arch}): no {op} in the PTX");
        }
    }
}

/// Every kernel within its budget on sm_80, sm_89 and sm_90 (registers,
/// nothing spilled, blocks a multiprocessor holds), as ptxas assembles the
/// PTX NVRTC emits: `statebench check ptxas`'s table, held in CI. ptxas
/// comes from the nvidia-cuda-nvcc wheel `.ci/run` installs (on the PATH,
/// or named by STATEBENCH_PTXAS).
#[test]
#[cfg_attr(
    not(all(has_nvrtc, has_ptxas)),
    ignore = "needs NVRTC (libnvrtc) on the library path and ptxas on the PATH (or STATEBENCH_PTXAS)"
)]
fn every_cuda_kernel_keeps_its_ptxas_budget() {
    use statebench::engine::device::ptxas;
    assert!(
        nvrtc_available(),
        "NVRTC (libnvrtc) is not on the library path"
    );
    let exe = std::env::var_os("STATEBENCH_PTXAS").unwrap_or_else(|| "ptxas".into());
    let runs = std::process::Command::new(&exe).arg("--version").output();
    assert!(
        runs.is_ok(),
        "ptxas is not on the PATH (set STATEBENCH_PTXAS): {runs:?}"
    );
    let uses = ptxas::report(std::path::Path::new(&exe)).expect("ptxas reports");
    eprintln!("{}", ptxas::table(&uses));
    let kernels = statebench_kernels::cuda::SOURCES
        .iter()
        .map(|(_, body)| body.matches("extern \"C\" __global__").count())
        .sum::<usize>();
    assert_eq!(uses.len(), 3 * kernels, "every kernel on every target");
    let over = ptxas::over_budget(&uses);
    assert!(over.is_empty(), "{over:#?}");
}
