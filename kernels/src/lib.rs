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

#[cfg(target_arch = "x86_64")]
pub mod amx;
pub mod attention;
pub mod cpu;
pub mod kq;
pub mod matmul;
pub mod native;
pub mod ops;
pub mod pair;
pub mod q8;

pub use attention::attend;
pub use cpu::amx_tiles;
pub use matmul::{Matrix, MatrixError, WeightData};
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
    pub const ARITHMETIC: &str = "statebench-cuda/2: bf16 weights, activations and KV cache, \
         f32 accumulation, each value rounded once by the kernel that writes it; \
         matrix products by mma.sync m16n8k16, one chain over k per output (k split \
         by the weight's shape alone, the ranges added in order); attention in chunks \
         of 256 positions by absolute position (online softmax over 64-position \
         sub-tiles, P in bf16), the chunks folded in order; 256-lane tree norms";

    /// The arithmetic of the same kernels run by the CUDA emulator: a run
    /// on it never resumes as a GPU run, nor the other way round.
    pub const EMULATED_ARITHMETIC: &str = "statebench-cuda/2 on the CUDA emulator: \
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
    /// definitions and the PTX wrappers first (its errors name
    /// `<name>.cu` and the line there).
    pub fn source(name: &str, body: &str) -> String {
        format!("{COMMON}\n{PTX}\n#line 1 \"{name}.cu\"\n{body}")
    }
}
