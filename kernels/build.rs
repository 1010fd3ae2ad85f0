//! Builds the CUDA emulator (`cuda/emulator/`): the driver and NVRTC
//! libraries cudarc loads when statebench runs on `--device cuda-emulated`,
//! beside the header its kernels compile against. Built where the target is
//! the host and Linux and a C++ compiler answers; elsewhere statebench
//! builds as before and the emulated device says why it is absent.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let src = Path::new("cuda/emulator");
    for f in ["abi.h", "cuda_emulator.h", "driver.cpp", "nvrtc.cpp"] {
        println!("cargo:rerun-if-changed=cuda/emulator/{f}");
    }
    println!("cargo:rerun-if-env-changed=CXX");
    match build(src) {
        Ok(dir) => {
            println!(
                "cargo:rustc-env=STATEBENCH_CUDA_EMULATOR_DIR={}",
                dir.display()
            );
            // For statebench's build script: its emulator tests run.
            println!("cargo:dir={}", dir.display());
        }
        Err(why) => {
            println!("cargo:warning=CUDA emulator not built: {why}");
            println!("cargo:rustc-env=STATEBENCH_CUDA_EMULATOR_ABSENT={why}");
        }
    }
}

fn build(src: &Path) -> Result<PathBuf, String> {
    let target = std::env::var("TARGET").unwrap_or_default();
    let host = std::env::var("HOST").unwrap_or_default();
    if target != host || std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        return Err(format!(
            "it runs on Linux, built for the host ({target} is not {host} on Linux)"
        ));
    }
    let out =
        PathBuf::from(std::env::var("OUT_DIR").map_err(|e| e.to_string())?).join("cuda-emulator");
    let include = out.join("include");
    std::fs::create_dir_all(&include).map_err(|e| e.to_string())?;
    for header in ["abi.h", "cuda_emulator.h"] {
        std::fs::copy(src.join(header), include.join(header)).map_err(|e| e.to_string())?;
    }
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".to_string());
    for (lib, source) in [("libcuda.so", "driver.cpp"), ("libnvrtc.so", "nvrtc.cpp")] {
        let status = Command::new(&cxx)
            .args([
                "-std=c++17",
                "-O2",
                "-fPIC",
                "-shared",
                "-fvisibility=hidden",
            ])
            .arg(format!("-Wl,-soname,{lib}"))
            .arg(src.join(source))
            .arg("-o")
            .arg(out.join(lib))
            .arg("-ldl")
            .arg("-lpthread")
            .status()
            .map_err(|e| format!("cannot run the C++ compiler `{cxx}`: {e}"))?;
        if !status.success() {
            return Err(format!(
                "`{cxx}` failed on cuda/emulator/{source} ({status})"
            ));
        }
    }
    Ok(out)
}
