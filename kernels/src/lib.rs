//! CPU compute kernels for the statebench engine.
//!
//! Every kernel here has a reduction order that is fixed by the shapes of the
//! model alone: an output element is always produced by one dot product whose
//! summation order does not depend on how many rows are in the batch, where a
//! prompt was split between cache and prefill, or how many threads run. That is
//! what makes a request's tokens bit-identical alone or batched, cached or cold.

/// Names the per-element arithmetic of these kernels. Results are
/// bit-identical across batches, tilings, threads and CPUs only within one
/// arithmetic; run manifests record it so a run is never resumed across a
/// change of it.
pub const ARITHMETIC: &str = "statebench-kernels/3: exact integer 32-column block dots, \
     one f32 fma per block; attention scores as four interleaved partial sums, \
     softmax sums over sixteen lanes";

pub mod alloc;
#[cfg(target_arch = "x86_64")]
pub mod amx;
pub mod attention;
pub mod cpu;
pub mod kq;
// Public only because `ops::Float::load16` names its register type.
#[doc(hidden)]
pub mod lanes;
pub mod matmul;
pub mod native;
pub mod ops;
pub mod pair;
pub mod peak;
pub mod q8;

pub use attention::attend;
pub use cpu::{amx_tiles, isa, Isa, IsaError, ISA_VAR};
pub use matmul::{matmul_each, Matrix, MatrixError, WeightData};
pub use ops::{dot_f32, rms_norm, rope_neox, silu_mul, RopeTable};

/// The sources of the engine's CUDA kernels (`kernels/cuda/`), compiled at
/// run time by NVRTC for the device at hand.
pub mod cuda {
    /// What every kernel set shares; prepended to each source.
    pub const COMMON: &str = include_str!("../cuda/common.cuh");

    /// Every kernel set: (name, source).
    pub const SOURCES: [(&str, &str); 5] = [
        ("gemm", include_str!("../cuda/gemm.cu")),
        ("norm", include_str!("../cuda/norm.cu")),
        ("rope", include_str!("../cuda/rope.cu")),
        ("attention", include_str!("../cuda/attention.cu")),
        ("elementwise", include_str!("../cuda/elementwise.cu")),
    ];

    /// The per-element arithmetic of these kernels (GPU results are
    /// reproducible within one arithmetic; they need not equal the CPU's).
    pub const ARITHMETIC: &str = "statebench-cuda/3: bf16 weights, activations and KV cache, \
         f32 accumulation, each value rounded once by the kernel that writes it; \
         matrix products by mma.sync m16n8k16, one chain over k per output range (k \
         split by the weight's shape alone into ranges sized for 132-block waves, \
         the ranges' sums added in order); attention in chunks \
         of 256 positions by absolute position (online softmax over 64-position \
         sub-tiles, P in bf16), the chunks folded in order; 256-lane tree norms";

    /// The arithmetic of the same kernels run by the CUDA emulator: a run
    /// on it never resumes as a GPU run, nor the other way round.
    pub const EMULATED_ARITHMETIC: &str = "statebench-cuda/3 on the CUDA emulator: \
         the same kernels compiled for the CPU; mma sums its 16 exact products and \
         the accumulator in double and rounds once; host libm for expf and the like; \
         fma only where written (no contraction)";

    /// Inline-PTX wrappers (`mma.sync`, `ldmatrix`, `cp.async`) with their
    /// emulated branch.
    pub const PTX: &str = include_str!("../cuda/ptx.cuh");

    /// The CUDA emulator built with this crate (`cuda/emulator/`): the
    /// directory holding its `libcuda.so`, `libnvrtc.so` and
    /// `include/cuda_emulator.h`. `STATEBENCH_CUDA_EMULATOR_DIR` at run time
    /// names another (a copy beside a moved binary).
    pub fn emulator_dir() -> Result<std::path::PathBuf, String> {
        if let Some(d) = std::env::var_os("STATEBENCH_CUDA_EMULATOR_DIR") {
            return Ok(d.into());
        }
        match option_env!("STATEBENCH_CUDA_EMULATOR_DIR") {
            Some(d) => Ok(d.into()),
            None => Err(format!(
                "the CUDA emulator was not built with this statebench: {}",
                option_env!("STATEBENCH_CUDA_EMULATOR_ABSENT").unwrap_or("no reason recorded")
            )),
        }
    }

    /// A kernel set's full source, as NVRTC compiles it: the shared
    /// definitions and the PTX wrappers first, each under its own file
    /// name, so errors (and the emulator's reports) name `common.cuh`,
    /// `ptx.cuh` or `<name>.cu` and the line there. With
    /// `STATEBENCH_CUDA_SOURCE_DIR` set, the shared definitions and the
    /// wrappers are that directory's (see [`kernel_sources`]; a file it
    /// lacks is the built-in copy here, and an error there).
    pub fn source(name: &str, body: &str) -> String {
        let (common, ptx) = match source_dir() {
            Some(dir) => (
                std::fs::read_to_string(dir.join("common.cuh")).unwrap_or_else(|_| COMMON.into()),
                std::fs::read_to_string(dir.join("ptx.cuh")).unwrap_or_else(|_| PTX.into()),
            ),
            None => (COMMON.to_string(), PTX.to_string()),
        };
        format!(
            "#line 1 \"common.cuh\"\n{common}\n#line 1 \"ptx.cuh\"\n{ptx}\n#line 1 \"{name}.cu\"\n{body}"
        )
    }

    /// `STATEBENCH_CUDA_SOURCE_DIR`: a directory the kernel sources are
    /// read from instead of the copies built in (kernel work without a
    /// rebuild; the emulator's mutation tests).
    pub fn source_dir() -> Option<std::path::PathBuf> {
        std::env::var_os("STATEBENCH_CUDA_SOURCE_DIR")
            .filter(|d| !d.is_empty())
            .map(Into::into)
    }

    /// The kernel sources a device compiles: the built-in ones, or
    /// `STATEBENCH_CUDA_SOURCE_DIR`'s.
    #[derive(Debug, Clone)]
    pub struct KernelSources {
        /// Every kernel set: (name, source), as [`SOURCES`].
        pub sets: Vec<(&'static str, String)>,
        /// The directory they were read from, if not built in.
        pub dir: Option<std::path::PathBuf>,
        /// Whether they differ from the built-in ones; the files in order
        /// (`common.cuh`, `ptx.cuh`, each `<set>.cu`) with their contents
        /// when they do.
        pub modified: Option<Vec<(String, String)>>,
    }

    /// Reads the kernel sources: `common.cuh`, `ptx.cuh` and each
    /// `<set>.cu` from `STATEBENCH_CUDA_SOURCE_DIR` when it is set (a
    /// missing file is an error naming it), else the built-in copies.
    pub fn kernel_sources() -> Result<KernelSources, String> {
        let Some(dir) = source_dir() else {
            return Ok(KernelSources {
                sets: SOURCES.iter().map(|&(n, s)| (n, s.to_string())).collect(),
                dir: None,
                modified: None,
            });
        };
        let read = |file: &str| {
            let path = dir.join(file);
            std::fs::read_to_string(&path).map_err(|e| {
                format!(
                    "STATEBENCH_CUDA_SOURCE_DIR: cannot read {}: {e}",
                    path.display()
                )
            })
        };
        let mut files = vec![
            ("common.cuh".to_string(), read("common.cuh")?, COMMON),
            ("ptx.cuh".to_string(), read("ptx.cuh")?, PTX),
        ];
        let mut sets = Vec::new();
        for (name, builtin) in SOURCES {
            let file = format!("{name}.cu");
            let text = read(&file)?;
            sets.push((name, text.clone()));
            files.push((file, text, builtin));
        }
        let modified = files
            .iter()
            .any(|(_, text, builtin)| text != builtin)
            .then(|| files.into_iter().map(|(f, t, _)| (f, t)).collect());
        Ok(KernelSources {
            sets,
            dir: Some(dir),
            modified,
        })
    }

    /// The checks the CUDA emulator builds its kernels with, its schedule's
    /// seed and its fibers, as the environment sets them.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct EmulatorChecks {
        /// `races` (the default: races in shared memory, uninitialized
        /// reads, out-of-bounds accesses), `asan` (AddressSanitizer) or
        /// `off`: `STATEBENCH_EMULATOR_CHECKS` (or the older
        /// `STATEBENCH_EMULATOR_ASAN`: 0 is `off`, anything else `asan`).
        pub mode: &'static str,
        /// `STATEBENCH_EMULATOR_SCHEDULE_SEED` (default 1; 0 runs a block's
        /// threads and a grid's blocks in order).
        pub seed: u64,
        /// How a block's threads switch, `STATEBENCH_EMULATOR_FIBERS`:
        /// `native` (the default: a hand-written switch on x86-64, ucontext
        /// elsewhere) or `ucontext` (everywhere, so the path other hosts run
        /// is tested on x86-64 too).
        pub fibers: &'static str,
    }

    /// The emulator's [`EmulatorChecks`], or the setting it refuses (as its
    /// NVRTC and driver refuse them).
    pub fn emulator_checks() -> Result<EmulatorChecks, String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let mode = match var("STATEBENCH_EMULATOR_CHECKS").as_deref() {
            Some("races") => "races",
            Some("asan") => "asan",
            Some("off") => "off",
            Some(other) => {
                return Err(format!(
                    "STATEBENCH_EMULATOR_CHECKS={other} is not one of races, asan, off"
                ))
            }
            None => match var("STATEBENCH_EMULATOR_ASAN").as_deref() {
                None => "races",
                Some("0") => "off",
                Some(_) => "asan",
            },
        };
        let seed = match var("STATEBENCH_EMULATOR_SCHEDULE_SEED") {
            None => 1,
            Some(v) => v
                .parse::<u64>()
                .ok()
                .filter(|_| v.bytes().all(|b| b.is_ascii_digit()))
                .ok_or_else(|| {
                    format!(
                        "STATEBENCH_EMULATOR_SCHEDULE_SEED={v} is not an unsigned 64-bit integer (0 runs threads in order)"
                    )
                })?,
        };
        let fibers = match var("STATEBENCH_EMULATOR_FIBERS").as_deref() {
            None | Some("native") => "native",
            Some("ucontext") => "ucontext",
            Some(other) => {
                return Err(format!(
                    "STATEBENCH_EMULATOR_FIBERS={other} is not one of native, ucontext"
                ))
            }
        };
        Ok(EmulatorChecks { mode, seed, fibers })
    }
}
