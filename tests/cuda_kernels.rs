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

/// The NVRTC on the library path builds each kernel set as a cubin (an ELF
/// image) for sm_80 and sm_90, writes PTX of its release's ISA version (the
/// table `toolkit` plans with), lists the archs the engine needs, and the
/// plan for an H200 under a driver of its own version is a cubin. CI runs
/// it with NVRTC 13.0 here and, through `nvrtc_12_4_as_well`, with 12.4.
#[test]
#[cfg_attr(not(has_nvrtc), ignore = "needs NVRTC (libnvrtc) on the library path")]
fn nvrtc_builds_cubins_and_writes_its_releases_ptx_isa() {
    use statebench::engine::device::cuda::{compile_image, nvrtc_archs, nvrtc_version, Pipelines};
    use statebench::engine::device::toolkit::{self, Image, ImageChoice};
    assert!(
        nvrtc_available(),
        "NVRTC (libnvrtc) is not on the library path"
    );
    let v = nvrtc_version().expect("nvrtcVersion answers");
    let archs = nvrtc_archs().expect("nvrtcGetSupportedArchs answers");
    eprintln!("NVRTC {v}: {archs:?}");
    if let Ok(want) = std::env::var("STATEBENCH_EXPECT_NVRTC") {
        assert_eq!(v.to_string(), want, "the NVRTC the parent test put first");
    }
    for sm in [80, 89, 90] {
        assert!(archs.contains(&sm), "NVRTC {v} lists no sm_{sm}: {archs:?}");
    }
    let (name, body) = statebench_kernels::cuda::SOURCES[0];
    let ptx = compile(name, body, "compute_80").expect("PTX compiles");
    assert_eq!(
        toolkit::ptx_version_of(&ptx.ptx),
        Some(toolkit::ptx_isa_of(v)),
        "NVRTC {v}'s PTX ISA is not the one the table gives"
    );
    for sm in [80, 90] {
        for (name, body) in statebench_kernels::cuda::SOURCES {
            let built = compile_image(name, body, Image::Cubin { sm }, Pipelines::DEEP)
                .unwrap_or_else(|e| panic!("{name} sm_{sm}: {}", statebench::one_line(&e)));
            assert!(built.log.is_empty(), "{name} sm_{sm}: {}", built.log);
            assert!(
                built.cubin && built.bytes.starts_with(b"\x7fELF"),
                "{name} sm_{sm}: not an ELF cubin"
            );
        }
    }
    let driver = toolkit::CudaVersion {
        major: v.major,
        minor: v.minor,
    };
    assert_eq!(
        toolkit::plan(driver, v, &archs, 90, ImageChoice::Auto),
        Ok(Image::Cubin { sm: 90 })
    );
}

/// The same test with NVRTC 12.4 first on the library path (the
/// `nvidia-cuda-nvrtc-cu12` wheel `.ci/run` installs under
/// target/nvrtc-12.4, or `STATEBENCH_NVRTC_12_DIR`), in a child process.
#[test]
#[cfg_attr(not(has_nvrtc), ignore = "needs NVRTC (libnvrtc) on the library path")]
fn nvrtc_12_4_as_well() {
    let dir = std::env::var("STATEBENCH_NVRTC_12_DIR").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/target/nvrtc-12.4/nvidia/cuda_nvrtc/lib"
        )
        .into()
    });
    let here = std::path::Path::new(&dir).join("libnvrtc.so.12").is_file();
    if !here && std::env::var_os("STATEBENCH_REQUIRE").is_none() && std::env::var_os("CI").is_none()
    {
        eprintln!("skipped: no NVRTC 12.4 at {dir}");
        return;
    }
    assert!(
        here,
        "no libnvrtc.so.12 in {dir} (.ci/run installs nvidia-cuda-nvrtc-cu12 there)"
    );
    let out = std::process::Command::new(std::env::current_exe().expect("the test binary"))
        .args([
            "--exact",
            "nvrtc_builds_cubins_and_writes_its_releases_ptx_isa",
            "--include-ignored",
            "--nocapture",
        ])
        .env("LD_LIBRARY_PATH", &dir)
        .env("STATEBENCH_EXPECT_NVRTC", "12.4")
        .output()
        .expect("the child runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "with NVRTC 12.4:\n{text}");
    assert!(text.contains("NVRTC 12.4"), "{text}");
}
