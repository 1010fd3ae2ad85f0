//! The CUDA device: our own kernels (`kernels/cuda/*.cu`), compiled by
//! NVRTC for the device's compute capability when the device opens, and
//! launched through cudarc, which loads `libcuda` and `libnvrtc` at run
//! time (a binary built with the feature runs, on the CPU, where neither
//! exists).
//!
//! The arithmetic (`statebench-cuda/3`): bf16 weights (bf16 checkpoints as
//! they are; f16, f32 and GGUF weights rounded once to nearest-even bf16
//! at load), bf16 activations between kernels, each rounded once by the
//! kernel that writes it, f32 accumulation, and a bf16 KV cache, paged:
//! each layer's keys and values live in one pool of blocks of `KV_BLOCK`
//! positions, sized at load from the KV budget and the free device memory;
//! a sequence holds a list of blocks and gives them back when it shrinks
//! or is dropped. Matrix products run on tensor cores (`gemm.cu`),
//! attention in fixed chunks of positions (`attention.cu`); neither
//! depends on the batch.
//!
//! A forward pass takes its activations from one device arena, reset when
//! the next pass begins; its index metadata (positions, cache slots,
//! block tables, attention tiles) goes there too, uploaded once a pass.
//!
//! The same code runs on the CUDA emulator (`--device cuda-emulated`,
//! `kernels/cuda/emulator/`): its driver and NVRTC libraries are loaded in
//! place of NVIDIA's before cudarc looks for them, so everything above the
//! launch is the code a GPU runs.

use std::ffi::CString;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig,
};
use cudarc::nvrtc::Ptx;
use statebench_kernels::RopeTable;

use super::toolkit::{self, CudaVersion, Image, ImageChoice};
use super::{f32_to_bf16, BatchRows, Device, DeviceInfo, Heads, HostWeight};
use crate::backend::BackendError;
use crate::engine::kv_cache::KvStore;
use crate::engine::model::{Attention, Linear, Mlp, Step};

/// Positions per KV-cache block (`KV_BLOCK` in `common.cuh`): one
/// attention sub-tile.
pub const KV_BLOCK: usize = 64;

/// Positions per attention chunk (`ATTN_CHUNK` in `common.cuh`).
pub const ATTN_CHUNK: usize = 256;

/// Head dimensions the attention kernel is instantiated for: every dense
/// Qwen2/Qwen3 model's (64 or 128) and the tiny test models'. (At 256 its
/// accumulators would spill registers.)
const HEAD_DIMS: [usize; 4] = [16, 32, 64, 128];

/// Query heads per KV head the attention tile holds at most (its 64 rows).
const MAX_GROUP: usize = 64;

/// Why a kernel set did not compile: its name and NVRTC's first error.
#[derive(Debug, thiserror::Error)]
#[error("CUDA kernels `{kernel}` do not compile: {first_error}")]
pub struct CompileError {
    pub kernel: String,
    pub first_error: String,
    /// NVRTC's whole log.
    pub log: String,
}

/// A kernel set compiled: its PTX and NVRTC's log (empty when clean).
pub struct Compiled {
    pub ptx: String,
    pub log: String,
}

/// Whether the NVRTC library can be loaded.
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to open the library.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Whether the CUDA driver library can be loaded.
pub fn driver_available() -> bool {
    // SAFETY: only tries to open the library.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// The name the emulator's driver gives its device.
const EMULATED_HARDWARE: &str = "statebench CUDA emulator";

/// The emulator's driver library, once loaded into this process.
static EMULATOR: OnceLock<Result<libloading::os::unix::Library, String>> = OnceLock::new();

/// Loads the CUDA emulator's driver and NVRTC in place of NVIDIA's: cudarc
/// then opens `libcuda.so` and `libnvrtc.so` by name and gets these (a
/// library already loaded answers to its soname). Must come before any
/// other CUDA use in the process; a later real-GPU open is refused.
pub fn load_emulator() -> Result<(), String> {
    EMULATOR
        .get_or_init(|| {
            use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
            let dir = statebench_kernels::cuda::emulator_dir()?;
            let open = |lib: &str| {
                let path = dir.join(lib);
                if !path.is_file() {
                    return Err(format!(
                        "the CUDA emulator's {} is missing (STATEBENCH_CUDA_EMULATOR_DIR names the directory built beside statebench)",
                        path.display()
                    ));
                }
                // SAFETY: the emulator's libraries run no code at load.
                unsafe { Library::open(Some(&path), RTLD_NOW | RTLD_GLOBAL) }
                    .map_err(|e| format!("loading the CUDA emulator's {}: {e}", path.display()))
            };
            let driver = open("libcuda.so")?;
            std::mem::forget(open("libnvrtc.so")?);
            Ok(driver)
        })
        .as_ref()
        .map(|_| ())
        .map_err(Clone::clone)
}

/// The emulator's first kernel failure in this process (a deadlock, a bad
/// warp collective), when the emulator is loaded and one happened.
pub fn emulator_error() -> Option<String> {
    let lib = EMULATOR.get()?.as_ref().ok()?;
    let said = |lib: &libloading::os::unix::Library, symbol: &[u8]| -> Option<String> {
        // SAFETY: the symbol is `const char* f()`, as both emulator
        // libraries define their last error.
        let last: libloading::os::unix::Symbol<unsafe extern "C" fn() -> *const std::ffi::c_char> =
            unsafe { lib.get(symbol) }.ok()?;
        // SAFETY: the emulator returns a NUL-terminated string it keeps alive.
        let text = unsafe { std::ffi::CStr::from_ptr(last()) }
            .to_string_lossy()
            .into_owned();
        (!text.is_empty()).then_some(text)
    };
    // The NVRTC is loaded into the process's global scope beside the driver.
    said(lib, b"statebench_emu_last_error\0").or_else(|| {
        said(
            &libloading::os::unix::Library::this(),
            b"statebench_emu_nvrtc_error\0",
        )
    })
}

/// CUDA devices that answer; 0 without a driver.
pub fn gpu_count() -> usize {
    if !driver_available() {
        return 0;
    }
    CudaContext::device_count().map_or(0, |n| n.max(0) as usize)
}

/// Compiles one kernel set for `arch` (e.g. `compute_90`) to PTX; the log
/// comes back even when compilation succeeds, so warnings can be refused.
pub fn compile(name: &str, body: &str, arch: &str) -> Result<Compiled, CompileError> {
    compile_with(name, body, arch, Pipelines::DEEP)
}

/// [`compile`] with the copy pipelines `pipes`.
pub fn compile_with(
    name: &str,
    body: &str,
    arch: &str,
    pipes: Pipelines,
) -> Result<Compiled, CompileError> {
    let (image, log) = nvrtc_build(name, body, arch, pipes, false)?;
    Ok(Compiled {
        ptx: String::from_utf8_lossy(&image).trim().to_string(),
        log,
    })
}

/// A kernel set built as an [`Image`]: what the driver loads and NVRTC's
/// log.
pub struct Built {
    /// A cubin's bytes, or PTX text.
    pub bytes: Vec<u8>,
    pub cubin: bool,
    pub log: String,
}

impl Built {
    /// The image as cudarc loads it.
    pub fn module(&self) -> Ptx {
        if self.cubin {
            Ptx::from_binary(self.bytes.clone())
        } else {
            Ptx::from_src(String::from_utf8_lossy(&self.bytes).trim().to_string())
        }
    }
}

/// Compiles one kernel set as `image` says.
pub fn compile_image(
    name: &str,
    body: &str,
    image: Image,
    pipes: Pipelines,
) -> Result<Built, CompileError> {
    let cubin = matches!(image, Image::Cubin { .. });
    // A process opens a device several times (`check gpu`, tests): each
    // kernel set is compiled once a process for each image and depth.
    // (set, hash of its source, arch, pipeline depths) → (image, log)
    type Key = (String, u64, String, usize, usize);
    type Images = std::collections::HashMap<Key, (Vec<u8>, String)>;
    static BUILT: OnceLock<Mutex<Images>> = OnceLock::new();
    let body_hash = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        body.hash(&mut h);
        h.finish()
    };
    let key = (
        name.to_string(),
        body_hash,
        image.nvrtc_arch(),
        pipes.gemm,
        pipes.attention,
    );
    let built = BUILT.get_or_init(Default::default);
    let cached = built.lock().ok().and_then(|m| m.get(&key).cloned());
    let (bytes, log) = match cached {
        Some(hit) => hit,
        _ => {
            let fresh = nvrtc_build(name, body, &image.nvrtc_arch(), pipes, cubin)?;
            if let Ok(mut m) = built.lock() {
                m.insert(key, fresh.clone());
            }
            fresh
        }
    };
    Ok(Built { bytes, cubin, log })
}

/// NVRTC's version, as it reports it.
pub fn nvrtc_version() -> Result<CudaVersion, String> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: writes two integers.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if r != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(with_emulator_error(format!("nvrtcVersion failed: {r:?}")));
    }
    Ok(CudaVersion { major, minor })
}

/// The real archs NVRTC can build for (`nvrtcGetSupportedArchs`: 75 is
/// sm_75).
pub fn nvrtc_archs() -> Result<Vec<i32>, String> {
    use cudarc::nvrtc::sys;
    let mut n = 0;
    // SAFETY: writes one integer.
    let r = unsafe { sys::nvrtcGetNumSupportedArchs(&mut n) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS || !(0..=1024).contains(&n) {
        return Err(format!("nvrtcGetNumSupportedArchs failed: {r:?}"));
    }
    let mut archs = vec![0i32; n as usize];
    // SAFETY: `archs` holds the `n` integers NVRTC writes.
    let r = unsafe { sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(format!("nvrtcGetSupportedArchs failed: {r:?}"));
    }
    Ok(archs)
}

/// The driver's version (`cuDriverGetVersion`); the driver need not be
/// initialised.
pub fn driver_version() -> Result<CudaVersion, String> {
    let mut v = 0i32;
    // SAFETY: writes one integer.
    let r = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
    if r != cudarc::driver::sys::CUresult::CUDA_SUCCESS {
        return Err(with_emulator_error(format!(
            "cuDriverGetVersion failed: {r:?}"
        )));
    }
    Ok(CudaVersion::from_driver(v))
}

fn nvrtc_build(
    name: &str,
    body: &str,
    arch: &str,
    pipes: Pipelines,
    cubin: bool,
) -> Result<(Vec<u8>, String), CompileError> {
    use cudarc::nvrtc::result as nvrtc;
    use cudarc::nvrtc::sys;
    let fail = |first_error: String, log: String| CompileError {
        kernel: name.to_string(),
        first_error,
        log,
    };
    let source = statebench_kernels::cuda::source(name, body);
    let src = CString::new(source).map_err(|e| fail(e.to_string(), String::new()))?;
    let file =
        CString::new(format!("{name}.cu")).map_err(|e| fail(e.to_string(), String::new()))?;
    let prog =
        nvrtc::create_program(&src, Some(&file)).map_err(|e| fail(e.to_string(), String::new()))?;
    let opts = [
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        "--fmad=true".to_string(),
        format!("-DGEMM_STAGES={}", pipes.gemm),
        format!("-DATTN_KV_STAGES={}", pipes.attention),
    ];
    // SAFETY: `prog` is a live program; it is destroyed below on every path.
    let compiled = unsafe { nvrtc::compile_program(prog, &opts) };
    let log = unsafe { nvrtc::get_program_log(prog) }
        .map(|chars| c_text(&chars))
        .unwrap_or_default();
    let image = compiled.and_then(|()| {
        if cubin {
            // SAFETY: `prog` compiled for a real arch; the buffer holds
            // the size NVRTC reports.
            unsafe {
                let mut n = 0usize;
                sys::nvrtcGetCUBINSize(prog, &mut n).result()?;
                let mut bytes = vec![0u8; n];
                sys::nvrtcGetCUBIN(prog, bytes.as_mut_ptr().cast()).result()?;
                Ok(bytes)
            }
        } else {
            unsafe { nvrtc::get_ptx(prog) }.map(|chars| {
                chars
                    .iter()
                    .map(|&c| c as u8)
                    .take_while(|&b| b != 0)
                    .collect()
            })
        }
    });
    let _ = unsafe { nvrtc::destroy_program(prog) };
    match image {
        Ok(bytes) => Ok((bytes, log)),
        Err(e) => {
            let first = log
                .lines()
                .find(|l| l.contains("error"))
                .map(str::to_string)
                .unwrap_or_else(|| e.to_string());
            Err(fail(first, log))
        }
    }
}

fn c_text(chars: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).trim().to_string()
}

/// `e`, with the emulator's reason when it gave one.
fn with_emulator_error(e: String) -> String {
    match emulator_error() {
        Some(why) => format!("{e}: {why}"),
        None => e,
    }
}

/// Milliseconds between two completed events. cudarc built for CUDA 13
/// calls `cuEventElapsedTime_v2`, which drivers before 12.8 lack, so those
/// get the first version, looked up by name.
fn elapsed_ms(
    driver: CudaVersion,
    start: &cudarc::driver::CudaEvent,
    end: &cudarc::driver::CudaEvent,
) -> Result<f32, cudarc::driver::DriverError> {
    use cudarc::driver::sys::{self, CUevent, CUresult};
    let mut ms = 0f32;
    // SAFETY: both events were recorded on one context and have completed;
    // the symbol has the documented signature of `cuEventElapsedTime`.
    let r = unsafe {
        if driver.number() >= 12080 {
            sys::cuEventElapsedTime_v2(&mut ms, start.cu_event(), end.cu_event())
        } else {
            type Elapsed = unsafe extern "C" fn(*mut f32, CUevent, CUevent) -> CUresult;
            match sys::culib().get::<Elapsed>(b"cuEventElapsedTime\0") {
                Ok(f) => f(&mut ms, start.cu_event(), end.cu_event()),
                Err(_) => CUresult::CUDA_ERROR_NOT_FOUND,
            }
        }
    };
    r.result().map(|()| ms)
}

/// A loaded kernel's resources, as the driver reports them (`None` where
/// it does not: the emulator keeps no registers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelResources {
    pub kernel: String,
    pub registers: Option<u32>,
    /// Local memory a thread: what spilled, or a stack.
    pub local_bytes: Option<u32>,
    pub blocks_per_sm: Option<u32>,
}

/// The driver's and NVRTC's versions, as a device states them.
#[derive(Debug, Clone, Copy)]
pub struct Versions {
    pub driver: CudaVersion,
    pub nvrtc: CudaVersion,
}

impl Versions {
    /// Who chose the image's machine code.
    fn image_maker(self, image: Image) -> String {
        match image {
            Image::Cubin { sm } => format!("cubin sm_{sm} by NVRTC {}", self.nvrtc),
            Image::Ptx { arch } => format!(
                "PTX compute_{arch} by NVRTC {}, JIT-compiled by driver CUDA {}",
                self.nvrtc, self.driver
            ),
        }
    }
}

impl std::fmt::Display for Versions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "driver CUDA {}, NVRTC {}", self.driver, self.nvrtc)
    }
}

/// The versions here and the image the kernels are built as for a device
/// of compute capability `sm` (90 for 9.0), or the one-line reason none
/// can be ([`toolkit::plan`]).
pub fn plan_image(sm: i32) -> Result<(Versions, Image), String> {
    let driver = driver_version()?;
    let nvrtc = nvrtc_version()?;
    let archs = nvrtc_archs()?;
    let choice = ImageChoice::from_env()?;
    let image = toolkit::plan(driver, nvrtc, &archs, sm, choice)?;
    Ok((Versions { driver, nvrtc }, image))
}

/// The loaded kernels.
struct Kernels {
    gemm: CudaFunction,
    gemm_reduce: CudaFunction,
    rms_norm: CudaFunction,
    rope_kv: CudaFunction,
    /// One per head dimension of [`HEAD_DIMS`].
    attention: Vec<CudaFunction>,
    attention_merge: CudaFunction,
    embed: CudaFunction,
    add_bias: CudaFunction,
    add: CudaFunction,
    silu_mul: CudaFunction,
    gather_rows: CudaFunction,
    argmax_f32: CudaFunction,
    argmax_bf16: CudaFunction,
}

/// The matrix product's tile (`gemm.cu`): outputs and rows per block, k
/// per stage, and the threads of a block (8 warps of 64 × 32).
pub const GEMM_BM: usize = 128;
pub const GEMM_BN: usize = 128;
pub const GEMM_BK: usize = 64;
pub const GEMM_THREADS: usize = 256;

/// How deep the kernels' copy pipelines are: stages of the matrix
/// product's k-slices and of attention's K/V sub-tiles in shared memory.
/// Deeper where a block may take more shared memory; the arithmetic is the
/// same at every depth (a test runs both on the emulator).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pipelines {
    pub gemm: usize,
    pub attention: usize,
}

impl Pipelines {
    /// For blocks of up to 163 KiB (sm_80) or 227 KiB (sm_90): the
    /// product's 128 KiB.
    pub const DEEP: Pipelines = Pipelines {
        gemm: 4,
        attention: 2,
    };
    /// For blocks of up to 99 KiB (sm_86, sm_89, sm_120: consumer and
    /// workstation GPUs): the product's 96 KiB.
    pub const SHALLOW: Pipelines = Pipelines {
        gemm: 3,
        attention: 1,
    };

    /// The deepest pipelines whose blocks fit `smem_per_block` bytes.
    pub fn fitting(smem_per_block: usize) -> Pipelines {
        let need = |p: Pipelines| p.gemm_smem().max(p.attention_smem(128));
        if need(Self::DEEP) <= smem_per_block {
            Self::DEEP
        } else {
            Self::SHALLOW
        }
    }

    /// The matrix product's dynamic shared memory: each stage's weight and
    /// activation slices, bf16.
    pub fn gemm_smem(self) -> usize {
        self.gemm * (GEMM_BM + GEMM_BN) * GEMM_BK * 2
    }

    /// Attention's dynamic shared memory for head dimension `d`: the query
    /// tile (64 × d) and each stage's K and V sub-tiles (64 × d each), bf16;
    /// the running fold's accumulators (d / 2 for each of 128 threads), f32.
    pub fn attention_smem(self, d: usize) -> usize {
        (64 * d + self.attention * 2 * KV_BLOCK * d) * 2 + 128 * (d / 2) * 4
    }
}

/// What a matrix product's epilogue does with its sums (`EPI_*` in `gemm.cu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Epilogue {
    Bf16 = 0,
    F32 = 1,
    Residual = 2,
    SwiGlu = 3,
}

/// `gemm.cu`'s `GemmParams`, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct GemmParams {
    w: [u64; 3],
    bias: [u64; 3],
    x: u64,
    y: u64,
    partial: u64,
    seg_end: [i32; 3],
    rows: i32,
    k: i32,
    out: i32,
    ldy: i32,
    epilogue: i32,
    splits: i32,
    in_block: i32,
}

/// `attention.cu`'s `AttnParams`, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct AttnParams {
    q: u64,
    kpool: u64,
    vpool: u64,
    out: u64,
    partial: u64,
    tiles: u64,
    row_pos: u64,
    row_table: u64,
    tables: u64,
    heads: i32,
    kv_heads: i32,
    dim: i32,
    splits: i32,
    chunk_cap: i32,
    scale_log2: f32,
}

/// `rope.cu`'s `RopeParams`, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct RopeParams {
    q_src: u64,
    q_dst: u64,
    k_src: u64,
    v_src: u64,
    kpool: u64,
    vpool: u64,
    q_norm: u64,
    k_norm: u64,
    cos_t: u64,
    sin_t: u64,
    pos: u64,
    slots: u64,
    rows: i32,
    q_ld: i32,
    kv_ld: i32,
    heads: i32,
    kv_heads: i32,
    dim: i32,
    rotate_k: i32,
    eps: f32,
}

// SAFETY: plain #[repr(C)] data the kernels take by value, laid out as
// their C structs (sizes checked by static_assert there and by a test here).
unsafe impl DeviceRepr for GemmParams {}
unsafe impl DeviceRepr for AttnParams {}
unsafe impl DeviceRepr for RopeParams {}

/// The block slots of one wave the split rule fills: an H100's or H200's
/// 132 multiprocessors, one product block each (its 256 threads take
/// about 200 registers). A constant of the model, not of the device, so
/// every GPU splits a weight alike; others only fill their waves less.
pub const GEMM_WAVE: usize = 132;

/// Splits along k of a product with a weight of `out` rows and `k`
/// columns: of 1 to `k / 512` (at most 16) ranges, the count that leaves
/// the fewest slots idle when a decode step's blocks (one row tile, one
/// block per range and output tile) run in waves of [`GEMM_WAVE`]: the
/// least waves per unit of a block's work, the fewest splits on a tie.
/// A function of the weight's shape alone, never of the batch: the order
/// of every output's sum is fixed by the model.
pub fn gemm_splits(out: usize, k: usize) -> usize {
    let m_blocks = out.div_ceil(GEMM_BM).max(1);
    let most = (k.div_ceil(GEMM_BK) / 8).clamp(1, 16);
    let waves = |s: usize| (m_blocks * s).div_ceil(GEMM_WAVE);
    // waves(s) / s, compared without division.
    (2..=most).fold(1, |best, s| {
        if waves(s) * best < waves(best) * s {
            s
        } else {
            best
        }
    })
}

/// Whether a product over `rows` rows sums its k-ranges in each block
/// (else one range a block, added by `gemm_reduce`): in-block whenever the
/// rows fill more than one tile, so a prefill's blocks fill the GPU
/// without partial sums; a decode step's single row tile splits to fill
/// it. The bits are the same either way.
pub fn gemm_in_block(rows: usize, splits: usize) -> bool {
    splits == 1 || rows > GEMM_BN
}

/// Free KV-cache blocks, shared by every sequence's cache.
#[derive(Debug)]
pub struct BlockPool {
    free: Mutex<Vec<u32>>,
}

impl BlockPool {
    fn take(&self, n: usize) -> Option<Vec<u32>> {
        let mut free = self.free.lock().ok()?;
        if free.len() < n {
            return None;
        }
        let at = free.len() - n;
        Some(free.split_off(at))
    }

    fn give(&self, blocks: impl IntoIterator<Item = u32>) {
        if let Ok(mut free) = self.free.lock() {
            free.extend(blocks);
        }
    }
}

/// Each layer's key and value pools, bf16 `[block][kv_head][KV_BLOCK][dim]`.
struct KvPools {
    k: Vec<DeviceBuf<u16>>,
    v: Vec<DeviceBuf<u16>>,
    blocks: Arc<BlockPool>,
}

/// One sequence's blocks in the pools.
#[derive(Debug, Default)]
pub struct CudaCache {
    blocks: Vec<u32>,
    len: usize,
    pool: Option<Arc<BlockPool>>,
}

impl CudaCache {
    fn release_from(&mut self, keep: usize) {
        if keep < self.blocks.len() {
            let gone = self.blocks.split_off(keep);
            if let Some(p) = &self.pool {
                p.give(gone);
            }
        }
    }
}

impl Drop for CudaCache {
    fn drop(&mut self) {
        self.release_from(0);
    }
}

impl KvStore for CudaCache {
    fn len(&self) -> usize {
        self.len
    }

    fn truncate(&mut self, len: usize) {
        if len < self.len {
            self.len = len;
            self.release_from(len.div_ceil(KV_BLOCK));
        }
    }

    fn advance(&mut self, n: usize) {
        self.len += n;
    }

    fn footprint(tokens: usize) -> usize {
        tokens.div_ceil(KV_BLOCK) * KV_BLOCK
    }
}

/// A device allocation that lives as long as the model (weights, vectors,
/// the KV pools, the RoPE table) and its address.
pub struct DeviceBuf<T> {
    ptr: u64,
    len: usize,
    _mem: CudaSlice<T>,
}

/// How an activation's elements are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DType {
    Bf16,
    F32,
}

impl DType {
    fn bytes(self) -> usize {
        match self {
            DType::Bf16 => 2,
            DType::F32 => 4,
        }
    }
}

/// Activations on the device: `rows × width` in the pass's arena; `None`
/// after a failure (reported by [`Device::sync`]).
pub struct CudaAct {
    /// Rows as stored and launched: in a graphed pass, padded to its bucket.
    rows: usize,
    /// Rows the forward pass asked for (what comes back to the host).
    real: usize,
    width: usize,
    dtype: DType,
    mem: Option<ArenaPtr>,
}

/// An address in the arena and the pass it belongs to.
#[derive(Debug, Clone, Copy)]
struct ArenaPtr {
    ptr: u64,
    pass: u64,
}

/// A bf16 weight matrix on the device, `rows × cols`.
pub struct CudaWeight {
    rows: usize,
    cols: usize,
    buf: DeviceBuf<u16>,
}

/// The RoPE table on the device.
pub struct CudaRope {
    cos: DeviceBuf<f32>,
    sin: DeviceBuf<f32>,
    half: usize,
}

/// The device memory of one forward pass: activations and index metadata,
/// handed out in order from chunks and all given back when the next pass
/// begins. A pass that outgrows its chunk takes another (as large as it
/// asks, at least 16 MiB); the next pass then starts from one chunk as
/// large as the last pass took, so a steady decode allocates nothing.
struct Arena {
    chunks: Vec<CudaSlice<u8>>,
    /// Base address of the last chunk, its size and bytes used in it.
    base: u64,
    size: usize,
    used: usize,
    /// Bytes this pass has taken, over every chunk.
    taken: usize,
    /// Counts passes; an activation of an earlier pass is refused.
    pass: u64,
}

/// Alignment of every arena allocation (as cudaMalloc's).
const ARENA_ALIGN: usize = 256;

/// The first chunk's size.
const ARENA_FIRST: usize = 16 << 20;

impl Arena {
    fn new() -> Self {
        Arena {
            chunks: Vec::new(),
            base: 0,
            size: 0,
            used: 0,
            taken: 0,
            pass: 1,
        }
    }
}

/// A kernel launch: the function, its geometry and its parameters' bytes
/// (each parameter at its offset). What a graphed pass records instead of
/// launching, and compares with the graph it replays.
#[derive(Debug, Clone, PartialEq)]
struct Launch {
    func: usize,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    shared: u32,
    /// The parameters, 8-byte aligned.
    words: Vec<u64>,
    offsets: Vec<usize>,
}

impl Launch {
    fn new(f: &CudaFunction, cfg: LaunchConfig) -> Self {
        Launch {
            func: f.cu_function() as usize,
            grid: cfg.grid_dim,
            block: cfg.block_dim,
            shared: cfg.shared_mem_bytes,
            words: Vec::new(),
            offsets: Vec::new(),
        }
    }

    /// Appends one parameter's bytes.
    fn param(mut self, bytes: &[u8]) -> Self {
        let at = self.words.len() * 8;
        self.offsets.push(at);
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.words.push(u64::from_le_bytes(w));
        }
        self
    }
}

/// The bytes of a parameter struct.
fn bytes_of<P: DeviceRepr>(p: &P) -> &[u8] {
    // SAFETY: P is plain #[repr(C)] data; its bytes are read, not interpreted.
    unsafe { std::slice::from_raw_parts((p as *const P).cast::<u8>(), std::mem::size_of::<P>()) }
}

/// A decode pass (every item one new token), recorded rather than run: its
/// rows padded to a power of two (its bucket), its launches, and the
/// metadata to upload before they run. At its end the launches run as the
/// bucket's CUDA graph: replayed when they equal a graph's, else captured.
struct Recording {
    real: usize,
    padded: usize,
    launches: Vec<Launch>,
    uploads: Vec<(u64, Vec<u8>)>,
}

/// A captured graph (cudarc's handle, used under the `graphs` lock only, as
/// CUDA requires of graph objects) and the launches it holds.
struct Graph {
    launches: Vec<Launch>,
    exec: cudarc::driver::CudaGraph,
}

// SAFETY: a Graph is only touched with the `graphs` mutex held, which
// serializes every call on it as CUDA's graph thread-safety rules ask.
unsafe impl Send for Graph {}

/// Graphs kept per bucket (a greedy step and a sampling step differ).
const GRAPHS_PER_BUCKET: usize = 4;

/// Decode passes of up to this many rows run as graphs.
const MAX_GRAPH_ROWS: usize = 256;

/// Which metadata vector a pass uploads: each kind once a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Meta {
    Tokens,
    Pos,
    Slots,
    Tiles,
    RowTable,
    Tables,
    Gather,
}

/// One NVIDIA GPU.
pub struct Cuda {
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
    k: Kernels,
    info: DeviceInfo,
    /// Multiprocessors: how many blocks fill the device.
    sms: usize,
    /// The kernels' pipeline depths, as compiled.
    pipes: Pipelines,
    kv: OnceLock<KvPools>,
    failed: Mutex<Option<String>>,
    arena: Mutex<Arena>,
    /// This pass's uploaded metadata, by kind and content.
    meta: Mutex<Vec<(Meta, Vec<i32>, u64)>>,
    /// Attention's chunk splits, when set (tests); else by the rule.
    attention_splits: AtomicUsize,
    /// How products add their k-ranges, when set (tests): 1 in each
    /// block, 2 over blocks; 0 by the rule.
    gemm_in_block: AtomicUsize,
    /// The pass being recorded for a graph, if this pass is one.
    recording: Mutex<Option<Recording>>,
    /// Captured decode graphs, by bucket.
    graphs: Mutex<std::collections::HashMap<usize, Vec<Graph>>>,
    graphs_on: std::sync::atomic::AtomicBool,
    /// Graphs captured and replayed so far.
    captured: AtomicUsize,
    replayed: AtomicUsize,
    /// Positions the RoPE table covers: the context, which fixes a graphed
    /// pass's block tables and attention partials.
    context: AtomicUsize,
    /// What built and loads the kernels, and how.
    versions: Versions,
    image: Image,
    compute: (i32, i32),
    emulated: bool,
}

/// The error of an unusable device, in one line with what to do.
fn unusable(device: &str, cause: impl std::fmt::Display) -> BackendError {
    BackendError::Device {
        device: device.to_string(),
        cause: cause.to_string(),
    }
}

/// A kernel argument, as the launch passes it.
#[derive(Debug, Clone, Copy)]
enum Arg {
    Ptr(u64),
    I32(i32),
    F32(f32),
}

impl Cuda {
    /// Opens GPU `ordinal`: loads the driver and NVRTC, compiles and loads
    /// the kernels for its compute capability.
    pub fn open(ordinal: usize) -> Result<Self, BackendError> {
        Self::open_on(ordinal, false, None)
    }

    /// Opens GPU `ordinal` with the kernels' pipelines as `pipes` says (the
    /// check that every depth gives the same bits).
    pub fn open_with(ordinal: usize, pipes: Pipelines) -> Result<Self, BackendError> {
        Self::open_on(ordinal, false, Some(pipes))
    }

    /// Opens the CUDA emulator's device: the same kernels and host code,
    /// executed on the CPU.
    pub fn open_emulated() -> Result<Self, BackendError> {
        Self::open_emulated_with(None)
    }

    /// The emulator's device with the kernels' pipelines as `pipes` says
    /// (`None`: as they fit, as on a GPU), so the depths a GPU of another
    /// kind would take run here too.
    pub fn open_emulated_with(pipes: Option<Pipelines>) -> Result<Self, BackendError> {
        let refused = |e| unusable(&super::DeviceChoice::CudaEmulated.to_string(), e);
        // Its settings first: a refused one is one line naming it.
        statebench_kernels::cuda::emulator_checks().map_err(refused)?;
        load_emulator().map_err(refused)?;
        Self::open_on(0, true, pipes)
    }

    /// The device `--device` names (`cuda[:N]` or `cuda-emulated`).
    pub fn open_choice(choice: super::DeviceChoice) -> Result<Self, BackendError> {
        match choice {
            super::DeviceChoice::CudaEmulated => Self::open_emulated(),
            super::DeviceChoice::Cuda(n) => Self::open(n),
            other => Err(unusable(&other.to_string(), "not a CUDA device")),
        }
    }

    fn open_on(
        ordinal: usize,
        emulated: bool,
        pipes: Option<Pipelines>,
    ) -> Result<Self, BackendError> {
        let name = if emulated {
            super::DeviceChoice::CudaEmulated
        } else {
            super::DeviceChoice::Cuda(ordinal)
        }
        .to_string();
        if !driver_available() {
            return Err(unusable(
                &name,
                "no CUDA driver found (libcuda); install the NVIDIA driver or use --device cpu",
            ));
        }
        // Before anything else asks the driver: an old one may lack calls
        // the engine makes, and the user needs the version, not a panic.
        let driver = driver_version().map_err(|e| unusable(&name, e))?;
        toolkit::supported_driver(driver).map_err(|e| unusable(&name, e))?;
        let count = CudaContext::device_count()
            .map_err(|e| unusable(&name, with_emulator_error(e.to_string())))?;
        if ordinal >= count.max(0) as usize {
            return Err(unusable(
                &name,
                format!(
                    "this machine has {count} CUDA device(s); pick cuda:0..cuda:{}",
                    count - 1
                ),
            ));
        }
        if !nvrtc_available() {
            return Err(unusable(
                &name,
                "NVRTC (libnvrtc) not found; install the CUDA toolkit or the nvidia-cuda-nvrtc wheel and put its lib directory on LD_LIBRARY_PATH",
            ));
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| unusable(&name, with_emulator_error(e.to_string())))?;
        let hardware = ctx.name().unwrap_or_default();
        if hardware.starts_with(EMULATED_HARDWARE) != emulated {
            return Err(unusable(
                &name,
                if emulated {
                    "another CUDA driver was loaded in this process before the emulator"
                } else {
                    "this process runs the CUDA emulator (--device cuda-emulated); a GPU cannot be opened beside it"
                },
            ));
        }
        // Tracking events on every buffer costs two events per operation,
        // and one stream orders everything the engine does.
        // SAFETY: the engine uses one stream, so no cross-stream waits are lost.
        unsafe { ctx.disable_event_tracking() };
        let (major, minor) = ctx.compute_capability().map_err(|e| unusable(&name, e))?;
        if major < 8 {
            return Err(unusable(
                &name,
                format!("compute capability {major}.{minor}: the kernels need 8.0 or later (bf16 tensor cores)"),
            ));
        }
        let sms = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| unusable(&name, e))?
            .max(1) as usize;
        let smem = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .map_err(|e| unusable(&name, e))?
            .max(0) as usize;
        let pipes = pipes.unwrap_or_else(|| Pipelines::fitting(smem));
        let (versions, image) = plan_image(major * 10 + minor).map_err(|e| unusable(&name, e))?;
        let mut functions = std::collections::HashMap::new();
        let sources = statebench_kernels::cuda::kernel_sources().map_err(|e| unusable(&name, e))?;
        for &(set, ref body) in &sources.sets {
            let built = compile_image(set, body, image, pipes)
                .map_err(|e| unusable(&name, crate::one_line(&e)))?;
            let module = ctx.load_module(built.module()).map_err(|e| {
                unusable(
                    &name,
                    format!("loading kernels `{set}` ({image}, {versions}): {e}"),
                )
            })?;
            functions.insert(set, module);
        }
        let f = |set: &str, kernel: &str| {
            functions[set]
                .load_function(kernel)
                .map_err(|e| unusable(&name, format!("kernel {kernel}: {e}")))
        };
        // Kernels whose shared memory is over the 48 KiB every launch may take.
        let wide = |func: CudaFunction, bytes: usize| {
            func.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
            .map_err(|e| unusable(&name, format!("shared memory of {bytes} bytes: {e}")))?;
            Ok::<_, BackendError>(func)
        };
        let mut attention = Vec::new();
        for d in HEAD_DIMS {
            attention.push(wide(
                f("attention", &format!("attention_d{d}"))?,
                pipes.attention_smem(d),
            )?);
        }
        let k = Kernels {
            gemm: wide(f("gemm", "gemm")?, pipes.gemm_smem())?,
            gemm_reduce: f("gemm", "gemm_reduce")?,
            rms_norm: f("norm", "rms_norm")?,
            rope_kv: f("rope", "rope_kv")?,
            attention,
            attention_merge: f("attention", "attention_merge")?,
            embed: f("elementwise", "embed")?,
            add_bias: f("elementwise", "add_bias")?,
            add: f("elementwise", "add")?,
            silu_mul: f("elementwise", "silu_mul")?,
            gather_rows: f("elementwise", "gather_rows")?,
            argmax_f32: f("elementwise", "argmax_f32")?,
            argmax_bf16: f("elementwise", "argmax_bf16")?,
        };
        // The emulator's checks and schedule, as its detail records them.
        let checks = if emulated {
            match statebench_kernels::cuda::emulator_checks() {
                Ok(c) => format!(
                    ", kernels {}, schedule seed {}{}",
                    match c.mode {
                        "races" =>
                            "checked for races, uninitialized reads and out-of-bounds accesses",
                        "asan" => "under AddressSanitizer",
                        _ => "unchecked",
                    },
                    c.seed,
                    // Only the forced fallback is named: the default
                    // detail stays what earlier manifests recorded.
                    if c.fibers == "ucontext" {
                        ", ucontext fibers"
                    } else {
                        ""
                    }
                ),
                Err(e) => format!(", {e}"),
            }
        } else {
            String::new()
        };
        // Sources other than the built-in ones are other arithmetic, as far
        // as anyone can tell: the manifest says so, and resume compares it.
        let modified = match &sources.modified {
            Some(files) => {
                use sha2::Digest;
                let mut h = sha2::Sha256::new();
                for (file, text) in files {
                    h.update(file.as_bytes());
                    h.update((text.len() as u64).to_le_bytes());
                    h.update(text.as_bytes());
                }
                let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
                format!(
                    "; kernel sources modified ({}, sha256 {hex})",
                    sources
                        .dir
                        .as_deref()
                        .unwrap_or(std::path::Path::new("?"))
                        .display()
                )
            }
            None => String::new(),
        };
        let info = DeviceInfo {
            name: name.clone(),
            hardware,
            detail: format!(
                "{}{versions}, {image}, compute capability {major}.{minor}{checks}",
                if emulated { "emulated " } else { "" },
            ),
            // On a GPU the bits are the image's: a cubin's are NVRTC's, a
            // PTX image's the driver's JIT's, so each names its maker.
            arithmetic: if emulated {
                format!(
                    "{}{modified}",
                    statebench_kernels::cuda::EMULATED_ARITHMETIC
                )
            } else {
                format!(
                    "{}; {}{modified}",
                    statebench_kernels::cuda::ARITHMETIC,
                    versions.image_maker(image)
                )
            },
        };
        let stream = ctx.new_stream().map_err(|e| unusable(&name, e))?;
        Ok(Cuda {
            stream,
            ctx,
            k,
            info,
            sms,
            pipes,
            kv: OnceLock::new(),
            failed: Mutex::new(None),
            arena: Mutex::new(Arena::new()),
            meta: Mutex::new(Vec::new()),
            attention_splits: AtomicUsize::new(0),
            gemm_in_block: AtomicUsize::new(0),
            recording: Mutex::new(None),
            graphs: Mutex::new(std::collections::HashMap::new()),
            graphs_on: std::sync::atomic::AtomicBool::new(true),
            captured: AtomicUsize::new(0),
            replayed: AtomicUsize::new(0),
            context: AtomicUsize::new(0),
            versions,
            image,
            compute: (major, minor),
            emulated,
        })
    }

    /// With `STATEBENCH_CUDA_POISON=1`, fills `bytes` at `ptr` with 0xff
    /// (NaN in bf16 and f32), so a read of what no kernel wrote shows in
    /// the results and under compute-sanitizer (`check gpu` sets it).
    fn poison(&self, ptr: u64, bytes: usize) -> Option<()> {
        if std::env::var_os("STATEBENCH_CUDA_POISON").is_none_or(|v| v != "1") {
            return Some(());
        }
        // SAFETY: `ptr` is a live allocation of at least `bytes`.
        unsafe {
            cudarc::driver::result::memset_d8_async(ptr, 0xff, bytes, self.stream.cu_stream())
        }
        .map_err(|e| self.fail(format!("memset: {e}")))
        .ok()
    }

    /// The driver's and NVRTC's versions.
    pub fn versions(&self) -> Versions {
        self.versions
    }

    /// The kind of image the kernels were built as.
    pub fn image(&self) -> Image {
        self.image
    }

    /// The device's compute capability.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute
    }

    /// Whether this is the CUDA emulator's device.
    pub fn is_emulated(&self) -> bool {
        self.emulated
    }

    /// Device memory: (free, total) bytes.
    pub fn memory(&self) -> Result<(usize, usize), BackendError> {
        self.ctx
            .mem_get_info()
            .map_err(|e| unusable(&self.info.name, e))
    }

    /// Every loaded kernel's registers, local (spilled) bytes a thread and
    /// resident blocks a multiprocessor at its launch shape, as the driver
    /// reports them for the loaded image.
    pub fn kernel_resources(&self) -> Vec<KernelResources> {
        use cudarc::driver::sys::CUfunction_attribute as A;
        let k = &self.k;
        let mut all: Vec<(String, &CudaFunction)> = vec![
            ("gemm".into(), &k.gemm),
            ("gemm_reduce".into(), &k.gemm_reduce),
            ("rms_norm".into(), &k.rms_norm),
            ("rope_kv".into(), &k.rope_kv),
        ];
        for (d, f) in HEAD_DIMS.iter().zip(&k.attention) {
            all.push((format!("attention_d{d}"), f));
        }
        all.extend([
            ("attention_merge".to_string(), &k.attention_merge),
            ("embed".into(), &k.embed),
            ("add_bias".into(), &k.add_bias),
            ("add".into(), &k.add),
            ("silu_mul".into(), &k.silu_mul),
            ("gather_rows".into(), &k.gather_rows),
            ("argmax_f32".into(), &k.argmax_f32),
            ("argmax_bf16".into(), &k.argmax_bf16),
        ]);
        all.into_iter()
            .map(|(kernel, f)| {
                let attr = |a: A| {
                    let mut v = 0i32;
                    // SAFETY: `f` is a loaded function; writes one integer.
                    let r = unsafe {
                        cudarc::driver::sys::cuFuncGetAttribute(&mut v, a, f.cu_function())
                    };
                    (r == cudarc::driver::sys::CUresult::CUDA_SUCCESS && !self.emulated)
                        .then_some(v.max(0) as u32)
                };
                let (threads, smem) = super::ptxas::launch_shape(&kernel, self.pipes);
                let blocks_per_sm = f
                    .occupancy_max_active_blocks_per_multiprocessor(threads, smem as usize, None)
                    .ok();
                KernelResources {
                    registers: attr(A::CU_FUNC_ATTRIBUTE_NUM_REGS),
                    local_bytes: attr(A::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES),
                    blocks_per_sm,
                    kernel,
                }
            })
            .collect()
    }

    /// The median over `reps` passes of the device time of `w`'s product
    /// with `rows` random rows, in µs (CUDA events around the launch).
    pub fn time_matmul(
        &self,
        w: &CudaWeight,
        rows: usize,
        reps: usize,
    ) -> Result<f64, BackendError> {
        let k = w.cols;
        let data: Vec<f32> = (0..rows * k)
            .map(|i| ((i % 17) as f32 - 8.0) / 16.0)
            .collect();
        let mut times = Vec::with_capacity(reps);
        // A one-row pass would be recorded for a graph, not run.
        let graphs = self.graphs_on.swap(false, Ordering::Relaxed);
        let timed = self.time_passes(w, rows, reps, &data, &mut times);
        self.graphs_on.store(graphs, Ordering::Relaxed);
        timed?;
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 2])
    }

    fn time_passes(
        &self,
        w: &CudaWeight,
        rows: usize,
        reps: usize,
        data: &[f32],
        times: &mut Vec<f64>,
    ) -> Result<(), BackendError> {
        let fail = |e: cudarc::driver::DriverError| unusable(&self.info.name, e);
        let k = w.cols;
        for _ in 0..reps.max(1) {
            self.begin_pass(&BatchRows::new([(0, rows)]));
            let x = self.act(k, data.to_vec());
            let timed = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
            let start = self.ctx.new_event(timed).map_err(fail)?;
            let end = self.ctx.new_event(timed).map_err(fail)?;
            start.record(&self.stream).map_err(fail)?;
            let _y = self.matmul(w, &x);
            end.record(&self.stream).map_err(fail)?;
            self.sync()?;
            let ms = elapsed_ms(self.versions.driver, &start, &end).map_err(fail)?;
            times.push(f64::from(ms) * 1e3);
        }
        Ok(())
    }

    /// Makes attention split each tile's chunks over `n` blocks (`None`:
    /// as many as fill the device). The arithmetic is the same for every
    /// `n`; the test that proves it sets this.
    pub fn set_attention_splits(&self, n: Option<usize>) {
        self.attention_splits
            .store(n.unwrap_or(0), Ordering::Relaxed);
    }

    /// Makes matrix products add their k-ranges in each block (`Some(true)`),
    /// over blocks and `gemm_reduce` (`Some(false)`), or by the rule
    /// (`None`). The arithmetic is the same either way; the test that
    /// proves it sets this.
    pub fn set_gemm_in_block(&self, v: Option<bool>) {
        let code = match v {
            None => 0,
            Some(true) => 1,
            Some(false) => 2,
        };
        self.gemm_in_block.store(code, Ordering::Relaxed);
    }

    /// Whether decode passes run as CUDA graphs (on by default). A graph
    /// changes no arithmetic; the test that proves it turns them off.
    pub fn set_graphs(&self, on: bool) {
        self.graphs_on.store(on, Ordering::Relaxed);
    }

    /// Decode graphs captured and replayed since the device opened.
    pub fn graph_counts(&self) -> (usize, usize) {
        (
            self.captured.load(Ordering::Relaxed),
            self.replayed.load(Ordering::Relaxed),
        )
    }

    /// The rows a pass of `rows` stores and launches: its bucket when the
    /// pass is recorded for a graph and `rows` are its rows.
    fn padded(&self, rows: usize) -> usize {
        match self.recording.lock().ok().as_deref() {
            Some(Some(r)) if r.real == rows => r.padded,
            _ => rows,
        }
    }

    /// `v` (one value per row) padded to the pass's bucket with `fill(row)`.
    fn pad(&self, mut v: Vec<i32>, fill: impl Fn(usize) -> i32) -> Vec<i32> {
        let padded = self.padded(v.len());
        for r in v.len()..padded {
            v.push(fill(r));
        }
        v
    }

    fn is_recording(&self) -> bool {
        matches!(self.recording.lock().ok().as_deref(), Some(Some(_)))
    }

    /// Each row's position, padding rows -1.
    fn positions(&self, pos: &[usize]) -> Vec<i32> {
        self.pad(pos.iter().map(|&p| p as i32).collect(), |_| -1)
    }

    /// Where each row's block table starts, and the tables: one after
    /// another, or, in a graphed pass, one per row at a fixed stride (the
    /// blocks the context can take), so its arena and launches do not
    /// change as the caches grow.
    fn block_tables(&self, caches: &[&CudaCache], rows: &BatchRows) -> (Vec<i32>, Vec<i32>) {
        let n_rows = self.padded(rows.len());
        if self.is_recording() {
            let stride = self.context.load(Ordering::Relaxed).div_ceil(KV_BLOCK);
            let mut tables = vec![0i32; n_rows * stride];
            for (r, &item) in rows.item.iter().enumerate() {
                for (j, &b) in caches[item].blocks.iter().take(stride).enumerate() {
                    tables[r * stride + j] = b as i32;
                }
            }
            let row_table = (0..n_rows).map(|r| (r * stride) as i32).collect();
            return (row_table, tables);
        }
        let mut tables: Vec<i32> = Vec::new();
        let mut offsets = Vec::with_capacity(caches.len());
        for c in caches {
            offsets.push(tables.len() as i32);
            tables.extend(c.blocks.iter().map(|&b| b as i32));
        }
        let row_table = rows.item.iter().map(|&i| offsets[i]).collect();
        (row_table, tables)
    }

    /// None once an operation of this step has failed: the rest of the
    /// step launches nothing (an attention over a block table that could
    /// not grow would read outside the cache), and `sync` reports it.
    fn healthy(&self) -> Option<()> {
        match self.failed.lock() {
            Ok(f) if f.is_none() => Some(()),
            _ => None,
        }
    }

    /// Records the first failure; `sync` reports it.
    fn fail(&self, cause: impl std::fmt::Display) {
        if let Ok(mut f) = self.failed.lock() {
            f.get_or_insert_with(|| cause.to_string());
        }
    }

    /// A persistent device allocation holding `v`.
    fn persistent<T: DeviceRepr>(&self, v: &[T], what: &str) -> Result<DeviceBuf<T>, BackendError> {
        let mem = self
            .stream
            .clone_htod(v)
            .map_err(|e| unusable(&self.info.name, format!("uploading {what}: {e}")))?;
        let (ptr, _) = mem.device_ptr(&self.stream);
        Ok(DeviceBuf {
            ptr,
            len: v.len(),
            _mem: mem,
        })
    }

    /// `bytes` of this pass's arena.
    fn arena_alloc(&self, bytes: usize) -> Option<ArenaPtr> {
        let bytes = bytes.max(1).div_ceil(ARENA_ALIGN) * ARENA_ALIGN;
        let mut a = self.arena.lock().ok()?;
        if a.used + bytes > a.size {
            let size = bytes.max(ARENA_FIRST);
            self.arena_chunk(&mut a, size)?;
        }
        let ptr = a.base + a.used as u64;
        a.used += bytes;
        a.taken += bytes;
        Some(ArenaPtr { ptr, pass: a.pass })
    }

    /// Starts a new chunk of `size` bytes.
    fn arena_chunk(&self, a: &mut Arena, size: usize) -> Option<()> {
        // SAFETY: every kernel writes what it hands on before it is read.
        let chunk = unsafe { self.stream.alloc::<u8>(size) }
            .map_err(|e| self.fail(format!("device memory: {e}")))
            .ok()?;
        let (base, _) = chunk.device_ptr(&self.stream);
        self.poison(base, size)?;
        a.base = base;
        a.size = size;
        a.used = 0;
        a.chunks.push(chunk);
        Some(())
    }

    /// The device address of `x`, if it holds data of this pass.
    fn addr(&self, x: &CudaAct) -> Option<u64> {
        let m = x.mem?;
        let pass = self.arena.lock().ok()?.pass;
        if m.pass != pass {
            self.fail("an activation of an earlier forward pass was used (a bug)");
            return None;
        }
        Some(m.ptr)
    }

    /// A fresh activation of this pass.
    fn new_act(&self, real: usize, width: usize, dtype: DType) -> CudaAct {
        let rows = self.padded(real);
        let mem = self
            .healthy()
            .and_then(|()| self.arena_alloc(rows * width * dtype.bytes()));
        CudaAct {
            rows,
            real,
            width,
            dtype,
            mem,
        }
    }

    /// Copies `v` to a fresh arena allocation.
    fn upload<T: DeviceRepr>(&self, v: &[T]) -> Option<ArenaPtr> {
        let dst = self.arena_alloc(std::mem::size_of_val(v))?;
        if v.is_empty() {
            return Some(dst);
        }
        if let Some(rec) = self.recording.lock().ok()?.as_mut() {
            // SAFETY: plain data, read as bytes.
            let bytes = unsafe {
                std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v))
            };
            rec.uploads.push((dst.ptr, bytes.to_vec()));
            return Some(dst);
        }
        // SAFETY: the allocation holds `v`'s bytes; the driver has copied a
        // pageable source by the time the call returns.
        unsafe { cudarc::driver::result::memcpy_htod_async(dst.ptr, v, self.stream.cu_stream()) }
            .map_err(|e| self.fail(format!("copy to device: {e}")))
            .ok()?;
        Some(dst)
    }

    /// A pass's index metadata on the device: every layer asks for the
    /// same vectors, so each is uploaded once a pass (by kind, so a graphed
    /// pass lays out its arena the same way whatever the values).
    fn step_meta(&self, kind: Meta, v: Vec<i32>) -> Option<u64> {
        let meta = self.meta.lock().ok()?;
        if let Some((_, _, d)) = meta.iter().find(|(k, h, _)| *k == kind && *h == v) {
            return Some(*d);
        }
        drop(meta);
        let d = self.upload(&v)?.ptr;
        self.meta.lock().ok()?.push((kind, v, d));
        Some(d)
    }

    /// Launches `f` with `args` in order; a failure is recorded.
    fn launch(&self, f: &CudaFunction, cfg: LaunchConfig, args: &[Arg]) -> Option<()> {
        let mut l = Launch::new(f, cfg);
        for a in args {
            l = match a {
                Arg::Ptr(p) => l.param(&p.to_le_bytes()),
                Arg::I32(i) => l.param(&i.to_le_bytes()),
                Arg::F32(x) => l.param(&x.to_le_bytes()),
            };
        }
        self.submit(l)
    }

    /// Launches `f` with its one parameter struct.
    fn launch_with<P: DeviceRepr>(
        &self,
        f: &CudaFunction,
        cfg: LaunchConfig,
        params: &P,
    ) -> Option<()> {
        self.submit(Launch::new(f, cfg).param(bytes_of(params)))
    }

    /// Runs a launch now, or records it when the pass is being recorded.
    fn submit(&self, l: Launch) -> Option<()> {
        self.healthy()?;
        if let Some(rec) = self.recording.lock().ok()?.as_mut() {
            rec.launches.push(l);
            return Some(());
        }
        self.issue(&l)
    }

    /// Issues one launch on the stream.
    fn issue(&self, l: &Launch) -> Option<()> {
        let base = l.words.as_ptr().cast::<u8>();
        let mut params: Vec<*mut std::ffi::c_void> = l
            .offsets
            .iter()
            // SAFETY: every offset lies inside `words`.
            .map(|&o| unsafe { base.add(o) } as *mut std::ffi::c_void)
            .collect();
        // SAFETY: `func` is one of this device's loaded kernels and the
        // parameters are its own, in order, as the call site built them.
        unsafe {
            cudarc::driver::result::launch_kernel(
                l.func as cudarc::driver::sys::CUfunction,
                l.grid,
                l.block,
                l.shared,
                self.stream.cu_stream(),
                &mut params,
            )
        }
        .map_err(|e| self.fail(format!("kernel launch: {e}")))
        .ok()
    }

    /// Ends a recorded pass: its launches run as the bucket's graph
    /// (replayed when they equal a captured one, else captured now) after
    /// its metadata is uploaded. Nothing for a pass that was not recorded.
    fn finish_pass(&self) -> Option<()> {
        let rec = self.recording.lock().ok()?.take()?;
        self.healthy()?;
        let mut graphs = self.graphs.lock().ok()?;
        let kept = graphs.entry(rec.padded).or_default();
        let at = match kept.iter().position(|g| g.launches == rec.launches) {
            Some(i) => {
                self.replayed.fetch_add(1, Ordering::Relaxed);
                i
            }
            None => {
                let exec = self.capture(&rec.launches)?;
                self.captured.fetch_add(1, Ordering::Relaxed);
                if kept.len() == GRAPHS_PER_BUCKET {
                    kept.remove(0);
                }
                kept.push(Graph {
                    launches: rec.launches,
                    exec,
                });
                kept.len() - 1
            }
        };
        for (dst, bytes) in &rec.uploads {
            // SAFETY: `dst` was allocated in this pass's arena for `bytes`.
            unsafe {
                cudarc::driver::result::memcpy_htod_async(*dst, bytes, self.stream.cu_stream())
            }
            .map_err(|e| self.fail(format!("copy to device: {e}")))
            .ok()?;
        }
        kept[at]
            .exec
            .launch()
            .map_err(|e| self.fail(format!("graph launch: {e}")))
            .ok()
    }

    /// Captures `launches` as one graph.
    fn capture(&self, launches: &[Launch]) -> Option<cudarc::driver::CudaGraph> {
        use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
        self.stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| self.fail(format!("graph capture: {e}")))
            .ok()?;
        let issued = launches.iter().all(|l| self.issue(l).is_some());
        let graph = self
            .stream
            .end_capture(CUgraphInstantiate_flags(0))
            .map_err(|e| self.fail(format!("graph capture: {e}")))
            .ok()??;
        issued.then_some(graph)
    }

    /// Blocks of 256 threads covering `n` elements.
    fn grid(n: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (n.div_ceil(256).max(1) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Gives a cache the blocks its next `more` positions need.
    fn grow(&self, cache: &mut CudaCache, more: usize) -> Option<()> {
        let pools = self.kv.get().or_else(|| {
            self.fail("the KV cache was used before it was reserved");
            None
        })?;
        let need = (cache.len + more).div_ceil(KV_BLOCK);
        if need > cache.blocks.len() {
            let got = pools.blocks.take(need - cache.blocks.len()).or_else(|| {
                self.fail("KV-cache memory exhausted (lower the KV budget or the batch)");
                None
            })?;
            cache.blocks.extend(got);
            cache.pool.get_or_insert_with(|| Arc::clone(&pools.blocks));
        }
        Some(())
    }

    /// Grows every item's cache by its rows and returns where each row's
    /// keys and values go: block · KV_BLOCK + offset.
    fn slots(&self, caches: &mut [&mut CudaCache], rows: &BatchRows) -> Option<Vec<i32>> {
        let mut slots = Vec::with_capacity(rows.len());
        for (cache, span) in caches.iter_mut().zip(&rows.spans) {
            self.grow(cache, span.len())?;
            for p in cache.len..cache.len + span.len() {
                let b = cache.blocks[p / KV_BLOCK] as usize;
                slots.push((b * KV_BLOCK + p % KV_BLOCK) as i32);
            }
        }
        Some(slots)
    }

    /// One matrix product `y = x Wᵀ` over the weight segments `parts`
    /// (their rows end to end, each with its bias), with `epi`'s epilogue
    /// into `y` (row stride `ldy`), split along k as the fused weight's
    /// shape says.
    fn gemm(
        &self,
        parts: &[Segment<'_>],
        x: &CudaAct,
        epi: Epilogue,
        y: u64,
        ldy: usize,
    ) -> Option<()> {
        self.healthy()?;
        let xp = self.addr(x)?;
        if x.dtype != DType::Bf16 {
            self.fail("the matrix product takes bf16 activations (a bug)");
            return None;
        }
        let k = parts[0].0.cols;
        let mut p = GemmParams {
            x: xp,
            y,
            rows: x.rows as i32,
            k: k as i32,
            ldy: ldy as i32,
            epilogue: epi as i32,
            ..GemmParams::default()
        };
        let mut end = 0;
        for (i, (w, bias)) in parts.iter().enumerate() {
            if w.cols != k || x.width != k {
                self.fail(format!(
                    "matrix product of {} columns with activations {} wide (a bug)",
                    w.cols, x.width
                ));
                return None;
            }
            end += w.rows;
            p.w[i] = w.buf.ptr;
            p.bias[i] = bias.map_or(0, |b| b.ptr);
            p.seg_end[i] = end as i32;
        }
        for i in parts.len()..3 {
            p.seg_end[i] = end as i32;
        }
        p.out = end as i32;
        let splits = gemm_splits(end, k);
        p.splits = splits as i32;
        // One range is always summed in its block.
        let in_block = match self.gemm_in_block.load(Ordering::Relaxed) {
            0 => gemm_in_block(x.rows, splits),
            forced => forced == 1 || splits == 1,
        };
        p.in_block = i32::from(in_block);
        if !in_block {
            p.partial = self.arena_alloc(splits * x.rows * end * 4)?.ptr;
        }
        let cfg = LaunchConfig {
            grid_dim: (
                x.rows.div_ceil(GEMM_BN).max(1) as u32,
                end.div_ceil(GEMM_BM) as u32,
                if in_block { 1 } else { splits as u32 },
            ),
            block_dim: (GEMM_THREADS as u32, 1, 1),
            shared_mem_bytes: self.pipes.gemm_smem() as u32,
        };
        self.launch_with(&self.k.gemm, cfg, &p)?;
        if !in_block {
            let features = if epi == Epilogue::SwiGlu {
                end / 2
            } else {
                end
            };
            self.launch_with(&self.k.gemm_reduce, Self::grid(x.rows * features), &p)?;
        }
        Some(())
    }

    /// The fused RoPE/norm/KV-write kernel (`rope.cu`) over `rows` rows.
    fn rope_kv(&self, p: RopeParams) -> Option<()> {
        let cfg = LaunchConfig {
            grid_dim: (p.rows.max(1) as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        if p.rows == 0 {
            return Some(());
        }
        self.launch_with(&self.k.rope_kv, cfg, &p)
    }

    /// Copies a device vector of `n` elements to the host.
    fn download<T: DeviceRepr + Default + Clone>(&self, ptr: u64, n: usize) -> Option<Vec<T>> {
        let mut out = vec![T::default(); n];
        if n == 0 {
            return Some(out);
        }
        // SAFETY: `ptr` holds `n` elements of T; the sync below waits for the copy.
        unsafe {
            cudarc::driver::result::memcpy_dtoh_async(&mut out, ptr, self.stream.cu_stream())
        }
        .map_err(|e| self.fail(format!("copy from device: {e}")))
        .ok()?;
        self.stream.synchronize().map_err(|e| self.fail(e)).ok()?;
        Some(out)
    }
}

/// One segment of a fused weight: its rows and their bias.
type Segment<'a> = (&'a CudaWeight, Option<&'a DeviceBuf<f32>>);

fn seg(l: &Linear<Cuda>) -> Segment<'_> {
    (&l.w, l.b.as_ref())
}

impl Device for Cuda {
    type Weight = CudaWeight;
    type Vector = DeviceBuf<f32>;
    type Act = CudaAct;
    type Rope = CudaRope;
    type Cache = CudaCache;

    fn info(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn weight_bytes(&self, w: &CudaWeight) -> Option<usize> {
        // bf16 values.
        Some(w.rows * w.cols * 2)
    }

    fn weight(&self, w: HostWeight) -> Result<CudaWeight, BackendError> {
        let (rows, cols) = (w.rows(), w.cols());
        if !cols.is_multiple_of(8) {
            return Err(unusable(
                &self.info.name,
                format!("a weight of {cols} columns: the matrix product needs a multiple of 8"),
            ));
        }
        let bits: Vec<u16> = match w {
            HostWeight::Bf16 { bits, .. } => bits,
            HostWeight::Matrix(m) => m.to_f32().into_iter().map(f32_to_bf16).collect(),
        };
        Ok(CudaWeight {
            rows,
            cols,
            buf: self.persistent(&bits, "weights")?,
        })
    }

    fn vector(&self, v: Vec<f32>) -> Result<DeviceBuf<f32>, BackendError> {
        self.persistent(&v, "weights")
    }

    fn rope_table(
        &self,
        head_dim: usize,
        theta: f32,
        max_pos: usize,
    ) -> Result<CudaRope, BackendError> {
        if !HEAD_DIMS.contains(&head_dim) {
            return Err(unusable(
                &self.info.name,
                format!("head dimension {head_dim}: the attention kernel takes {HEAD_DIMS:?}"),
            ));
        }
        let t = RopeTable::new(head_dim, theta, max_pos);
        self.context.store(max_pos, Ordering::Relaxed);
        Ok(CudaRope {
            cos: self.persistent(t.cos(), "the RoPE table")?,
            sin: self.persistent(t.sin(), "the RoPE table")?,
            half: t.half(),
        })
    }

    fn kv_bytes_per_position(&self, heads: Heads) -> usize {
        heads.kv * heads.dim * 2 * 2
    }

    fn reserve_kv(
        &self,
        layers: usize,
        heads: Heads,
        budget: usize,
    ) -> Result<usize, BackendError> {
        if self.kv.get().is_some() {
            return Err(unusable(
                &self.info.name,
                "the KV cache is already reserved (one model per device)",
            ));
        }
        if heads.kv == 0 || !heads.q.is_multiple_of(heads.kv) || heads.q / heads.kv > MAX_GROUP {
            return Err(unusable(
                &self.info.name,
                format!(
                    "{} query heads over {} KV heads: attention takes groups of at most {MAX_GROUP}",
                    heads.q, heads.kv
                ),
            ));
        }
        let block_elems = heads.kv * KV_BLOCK * heads.dim;
        let block_bytes = layers * 2 * block_elems * 2;
        let (free, _) = self
            .ctx
            .mem_get_info()
            .map_err(|e| unusable(&self.info.name, e))?;
        // Leave a tenth of what is free (and 1 GiB) for activations.
        let usable = (free / 10 * 9).saturating_sub(1 << 30);
        let blocks = budget.min(usable) / block_bytes.max(1);
        if blocks == 0 {
            return Err(unusable(
                &self.info.name,
                format!(
                    "no device memory left for a KV cache: {free} bytes are free after the weights, and the engine keeps a tenth of that plus 1 GiB ({} bytes) for activations; one KV block of every layer takes {block_bytes} bytes",
                    free - free / 10 * 9 + (1 << 30)
                ),
            ));
        }
        let pool = || -> Result<DeviceBuf<u16>, BackendError> {
            // SAFETY: a position is written (rope_kv) before attention reads
            // it; positions past a row's end are zero-filled when staged.
            let mem = unsafe { self.stream.alloc::<u16>(blocks * block_elems) }
                .map_err(|e| unusable(&self.info.name, format!("KV cache: {e}")))?;
            let (ptr, _) = mem.device_ptr(&self.stream);
            self.poison(ptr, blocks * block_elems * 2)
                .ok_or_else(|| unusable(&self.info.name, "KV cache: filling it with NaN failed"))?;
            Ok(DeviceBuf {
                ptr,
                len: blocks * block_elems,
                _mem: mem,
            })
        };
        let mut k = Vec::with_capacity(layers);
        let mut v = Vec::with_capacity(layers);
        for _ in 0..layers {
            k.push(pool()?);
            v.push(pool()?);
        }
        let free_blocks = (0..blocks as u32).rev().collect();
        let pools = KvPools {
            k,
            v,
            blocks: Arc::new(BlockPool {
                free: Mutex::new(free_blocks),
            }),
        };
        let _ = self.kv.set(pools);
        Ok(blocks * block_bytes)
    }

    fn begin_pass(&self, rows: &BatchRows) {
        if let Ok(mut rec) = self.recording.lock() {
            // A decode pass (one new token an item) is recorded and run as
            // its bucket's graph.
            let decode = rows.spans.iter().all(|s| s.len() == 1);
            let n = rows.len();
            *rec = (self.graphs_on.load(Ordering::Relaxed)
                && decode
                && n > 0
                && n <= MAX_GRAPH_ROWS
                && self.context.load(Ordering::Relaxed) > 0)
                .then(|| Recording {
                    real: n,
                    padded: n.next_power_of_two(),
                    launches: Vec::new(),
                    uploads: Vec::new(),
                });
        }
        if let Ok(mut a) = self.arena.lock() {
            a.pass += 1;
            if a.chunks.len() > 1 {
                // The last pass outgrew its chunk: one as large as it took.
                let size = a.taken.max(ARENA_FIRST);
                a.chunks.clear();
                a.size = 0;
                let _ = self.arena_chunk(&mut a, size);
            }
            a.used = 0;
            a.taken = 0;
        }
        if let Ok(mut meta) = self.meta.lock() {
            meta.clear();
        }
    }

    fn act(&self, width: usize, data: Vec<f32>) -> CudaAct {
        let rows = data.len() / width.max(1);
        let bits: Vec<u16> = data.into_iter().map(f32_to_bf16).collect();
        let mem = self.healthy().and_then(|()| self.upload(&bits));
        CudaAct {
            rows,
            real: rows,
            width,
            dtype: DType::Bf16,
            mem,
        }
    }

    fn embed(&self, table: &CudaWeight, tokens: &[u32]) -> CudaAct {
        let hidden = table.cols;
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let mut out = self.new_act(tokens.len(), hidden, DType::Bf16);
        let rows = out.rows;
        let ok = (|| {
            let ids = self.step_meta(Meta::Tokens, self.pad(ids, |_| 0))?;
            let y = self.addr(&out)?;
            // embed(table, tokens, x, rows, hidden)
            self.launch(
                &self.k.embed,
                Self::grid(rows * hidden),
                &[
                    Arg::Ptr(table.buf.ptr),
                    Arg::Ptr(ids),
                    Arg::Ptr(y),
                    Arg::I32(rows as i32),
                    Arg::I32(hidden as i32),
                ],
            )
        })();
        if ok.is_none() {
            out.mem = None;
        }
        out
    }

    fn rms_norm(&self, x: &CudaAct, weight: &DeviceBuf<f32>, eps: f32) -> CudaAct {
        let w = weight.len;
        let mut out = self.new_act(x.real, x.width, DType::Bf16);
        let ok = (|| {
            let (xp, y) = (self.addr(x)?, self.addr(&out)?);
            let cfg = LaunchConfig {
                grid_dim: ((x.rows * x.width / w.max(1)).max(1) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // rms_norm(x, weight, y, width, eps), one block per chunk of `width`.
            self.launch(
                &self.k.rms_norm,
                cfg,
                &[
                    Arg::Ptr(xp),
                    Arg::Ptr(weight.ptr),
                    Arg::Ptr(y),
                    Arg::I32(w as i32),
                    Arg::F32(eps),
                ],
            )
        })();
        if ok.is_none() {
            out.mem = None;
        }
        out
    }

    fn matmul(&self, w: &CudaWeight, x: &CudaAct) -> CudaAct {
        let mut out = self.new_act(x.real, w.rows, DType::Bf16);
        let ok = self
            .addr(&out)
            .and_then(|y| self.gemm(&[(w, None)], x, Epilogue::Bf16, y, w.rows));
        if ok.is_none() {
            out.mem = None;
        }
        out
    }

    fn logits(&self, head: &CudaWeight, x: &CudaAct) -> CudaAct {
        let mut out = self.new_act(x.real, head.rows, DType::F32);
        let ok = self
            .addr(&out)
            .and_then(|y| self.gemm(&[(head, None)], x, Epilogue::F32, y, head.rows));
        if ok.is_none() {
            out.mem = None;
        }
        out
    }

    fn attention_inputs(
        &self,
        attn: &Attention<Cuda>,
        h: &CudaAct,
        layer: usize,
        s: &mut Step<'_, '_, Cuda>,
    ) -> CudaAct {
        let heads = s.heads;
        let (qd, kvd) = (heads.q * heads.dim, heads.kv * heads.dim);
        let width = qd + 2 * kvd;
        let qkv = self.new_act(h.real, width, DType::Bf16);
        let mut q = self.new_act(h.real, qd, DType::Bf16);
        let rows = q.rows;
        let ok = (|| {
            let qkv_p = self.addr(&qkv)?;
            self.gemm(
                &[seg(&attn.q), seg(&attn.k), seg(&attn.v)],
                h,
                Epilogue::Bf16,
                qkv_p,
                width,
            )?;
            let mut caches: Vec<&mut CudaCache> =
                s.items.iter_mut().map(|it| &mut *it.cache).collect();
            let slots = self.slots(&mut caches, s.rows)?;
            let pools = self.kv.get()?;
            let p = RopeParams {
                q_src: qkv_p,
                q_dst: self.addr(&q)?,
                k_src: qkv_p + (qd * 2) as u64,
                v_src: qkv_p + ((qd + kvd) * 2) as u64,
                kpool: pools.k[layer].ptr,
                vpool: pools.v[layer].ptr,
                q_norm: attn.q_norm.as_ref().map_or(0, |v| v.ptr),
                k_norm: attn.k_norm.as_ref().map_or(0, |v| v.ptr),
                cos_t: s.rope.cos.ptr,
                sin_t: s.rope.sin.ptr,
                pos: self.step_meta(Meta::Pos, self.positions(&s.rows.pos))?,
                slots: self.step_meta(Meta::Slots, self.pad(slots, |_| -1))?,
                rows: rows as i32,
                q_ld: width as i32,
                kv_ld: width as i32,
                heads: heads.q as i32,
                kv_heads: heads.kv as i32,
                dim: heads.dim as i32,
                rotate_k: 1,
                eps: s.eps,
            };
            self.rope_kv(p)
        })();
        if ok.is_none() {
            q.mem = None;
        }
        q
    }

    fn project_add(&self, w: &Linear<Cuda>, h: &CudaAct, x: &mut CudaAct) {
        let ok = self
            .addr(x)
            .and_then(|y| self.gemm(&[seg(w)], h, Epilogue::Residual, y, x.width));
        if ok.is_none() {
            x.mem = None;
        }
    }

    fn mlp_add(&self, mlp: &Mlp<Cuda>, h: &CudaAct, x: &mut CudaAct) {
        let inter = mlp.gate.w.rows;
        let act = self.new_act(h.real, inter, DType::Bf16);
        let ok = (|| {
            let a = self.addr(&act)?;
            self.gemm(
                &[seg(&mlp.gate), seg(&mlp.up)],
                h,
                Epilogue::SwiGlu,
                a,
                inter,
            )?;
            let y = self.addr(x)?;
            self.gemm(&[seg(&mlp.down)], &act, Epilogue::Residual, y, x.width)
        })();
        if ok.is_none() {
            x.mem = None;
        }
    }

    fn add_bias(&self, y: &mut CudaAct, bias: &DeviceBuf<f32>) {
        let n = y.rows * y.width;
        let ok = (|| {
            let yp = self.addr(y)?;
            // add_bias(y, bias, rows, width)
            self.launch(
                &self.k.add_bias,
                Self::grid(n),
                &[
                    Arg::Ptr(yp),
                    Arg::Ptr(bias.ptr),
                    Arg::I32(y.rows as i32),
                    Arg::I32(y.width as i32),
                ],
            )
        })();
        if ok.is_none() {
            y.mem = None;
        }
    }

    fn rope(&self, x: &mut CudaAct, heads: usize, pos: &[usize], table: &CudaRope) {
        let dim = 2 * table.half;
        let ok = (|| {
            let xp = self.addr(x)?;
            let p = RopeParams {
                q_src: xp,
                q_dst: xp,
                cos_t: table.cos.ptr,
                sin_t: table.sin.ptr,
                pos: self.step_meta(Meta::Pos, self.positions(pos))?,
                rows: x.rows as i32,
                q_ld: (heads * dim) as i32,
                heads: heads as i32,
                dim: dim as i32,
                ..RopeParams::default()
            };
            self.rope_kv(p)
        })();
        if ok.is_none() {
            x.mem = None;
        }
    }

    fn kv_write(
        &self,
        caches: &mut [&mut CudaCache],
        layer: usize,
        k: &CudaAct,
        v: &CudaAct,
        rows: &BatchRows,
        heads: Heads,
    ) {
        let _ = (|| {
            let (kp, vp) = (self.addr(k)?, self.addr(v)?);
            let slots = self.slots(caches, rows)?;
            let pools = self.kv.get()?;
            let p = RopeParams {
                k_src: kp,
                v_src: vp,
                kpool: pools.k[layer].ptr,
                vpool: pools.v[layer].ptr,
                pos: self.step_meta(Meta::Pos, self.positions(&rows.pos))?,
                slots: self.step_meta(Meta::Slots, self.pad(slots, |_| -1))?,
                rows: k.rows as i32,
                kv_ld: (heads.kv * heads.dim) as i32,
                kv_heads: heads.kv as i32,
                dim: heads.dim as i32,
                ..RopeParams::default()
            };
            self.rope_kv(p)
        })();
    }

    fn attention(
        &self,
        q: &CudaAct,
        caches: &[&CudaCache],
        layer: usize,
        rows: &BatchRows,
        heads: Heads,
    ) -> CudaAct {
        let mut out = self.new_act(rows.len(), q.width, DType::Bf16);
        let n_rows = out.rows;
        let ok = (|| {
            let (qp, op) = (self.addr(q)?, self.addr(&out)?);
            let pools = self.kv.get()?;
            let d = HEAD_DIMS.iter().position(|&d| d == heads.dim).or_else(|| {
                self.fail(format!(
                    "head dimension {} has no attention kernel",
                    heads.dim
                ));
                None
            })?;
            let group = heads.q / heads.kv;
            let per_tile = (MAX_GROUP / group).max(1);
            let (row_table, tables) = self.block_tables(caches, rows);
            let row_pos = self.positions(&rows.pos);
            // Tiles: up to `per_tile` consecutive rows of one item (padding
            // rows, one a tile, compute zeros).
            let mut tiles: Vec<i32> = Vec::new();
            for span in &rows.spans {
                let mut at = span.start;
                while at < span.end {
                    let n = per_tile.min(span.end - at);
                    tiles.extend([at as i32, n as i32]);
                    at += n;
                }
            }
            for r in rows.len()..n_rows {
                tiles.extend([r as i32, 1]);
            }
            let n_tiles = tiles.len() / 2;
            let chunk_cap = if n_rows > rows.len() || self.is_recording() {
                self.context.load(Ordering::Relaxed).div_ceil(ATTN_CHUNK)
            } else {
                rows.pos
                    .iter()
                    .map(|p| p / ATTN_CHUNK + 1)
                    .max()
                    .unwrap_or(1)
            }
            .max(1);
            // Blocks enough for one wave over the multiprocessors.
            let splits = match self.attention_splits.load(Ordering::Relaxed) {
                0 => self.sms.div_ceil((n_tiles * heads.kv).max(1)),
                n => n,
            }
            .clamp(1, chunk_cap);
            let partial = if splits > 1 {
                self.arena_alloc(n_rows * heads.q * chunk_cap * (heads.dim + 2) * 4)?
                    .ptr
            } else {
                0
            };
            let p = AttnParams {
                q: qp,
                kpool: pools.k[layer].ptr,
                vpool: pools.v[layer].ptr,
                out: op,
                partial,
                tiles: self.step_meta(Meta::Tiles, tiles)?,
                row_pos: self.step_meta(Meta::Pos, row_pos)?,
                row_table: self.step_meta(Meta::RowTable, row_table)?,
                tables: self.step_meta(Meta::Tables, tables)?,
                heads: heads.q as i32,
                kv_heads: heads.kv as i32,
                dim: heads.dim as i32,
                splits: splits as i32,
                chunk_cap: chunk_cap as i32,
                scale_log2: std::f32::consts::LOG2_E / (heads.dim as f32).sqrt(),
            };
            let cfg = LaunchConfig {
                grid_dim: (n_tiles as u32, heads.kv as u32, splits as u32),
                block_dim: (128, 1, 1),
                shared_mem_bytes: self.pipes.attention_smem(heads.dim) as u32,
            };
            self.launch_with(&self.k.attention[d], cfg, &p)?;
            if splits > 1 {
                let merge = LaunchConfig {
                    grid_dim: (n_rows as u32, heads.q as u32, 1),
                    block_dim: (heads.dim as u32, 1, 1),
                    shared_mem_bytes: 0,
                };
                self.launch_with(&self.k.attention_merge, merge, &p)?;
            }
            Some(())
        })();
        if ok.is_none() {
            out.mem = None;
        }
        out
    }

    fn silu_mul(&self, gate: &mut CudaAct, up: &CudaAct) {
        let n = gate.rows * gate.width;
        let ok = (|| {
            let (g, u) = (self.addr(gate)?, self.addr(up)?);
            // silu_mul(gate, up, n)
            self.launch(
                &self.k.silu_mul,
                Self::grid(n),
                &[Arg::Ptr(g), Arg::Ptr(u), Arg::I32(n as i32)],
            )
        })();
        if ok.is_none() {
            gate.mem = None;
        }
    }

    fn add(&self, x: &mut CudaAct, y: &CudaAct) {
        let n = x.rows * x.width;
        let ok = (|| {
            let (xp, yp) = (self.addr(x)?, self.addr(y)?);
            // add(x, y, n)
            self.launch(
                &self.k.add,
                Self::grid(n),
                &[Arg::Ptr(xp), Arg::Ptr(yp), Arg::I32(n as i32)],
            )
        })();
        if ok.is_none() {
            x.mem = None;
        }
    }

    fn gather(&self, x: &CudaAct, rows: &[usize]) -> CudaAct {
        let idx: Vec<i32> = rows.iter().map(|&r| r as i32).collect();
        let mut out = self.new_act(rows.len(), x.width, x.dtype);
        let n = out.rows;
        let ok = (|| {
            if x.dtype != DType::Bf16 {
                self.fail("gather takes bf16 activations (a bug)");
                return None;
            }
            let (xp, yp) = (self.addr(x)?, self.addr(&out)?);
            // Padding rows read themselves.
            let idx = self.step_meta(Meta::Gather, self.pad(idx, |r| r as i32))?;
            // gather_rows(x, rows, y, n, width)
            self.launch(
                &self.k.gather_rows,
                Self::grid(n * x.width),
                &[
                    Arg::Ptr(xp),
                    Arg::Ptr(idx),
                    Arg::Ptr(yp),
                    Arg::I32(n as i32),
                    Arg::I32(x.width as i32),
                ],
            )
        })();
        if ok.is_none() {
            out.mem = None;
        }
        out
    }

    fn to_host(&self, x: CudaAct) -> Vec<Vec<f32>> {
        let Some(ptr) = self.addr(&x) else {
            return Vec::new();
        };
        self.finish_pass();
        let n = x.real * x.width;
        let values: Option<Vec<f32>> = match x.dtype {
            DType::F32 => self.download::<f32>(ptr, n),
            DType::Bf16 => self
                .download::<u16>(ptr, n)
                .map(|b| b.into_iter().map(super::bf16_to_f32).collect()),
        };
        values
            .map(|v| {
                v.chunks_exact(x.width.max(1))
                    .map(<[f32]>::to_vec)
                    .collect()
            })
            .unwrap_or_default()
    }

    fn argmax(&self, x: &CudaAct) -> Vec<u32> {
        let picks = (|| {
            let xp = self.addr(x)?;
            let out = self.arena_alloc(x.rows.max(1) * 4)?.ptr;
            let cfg = LaunchConfig {
                grid_dim: (x.rows.max(1) as u32, 1, 1),
                block_dim: (1024, 1, 1),
                shared_mem_bytes: 0,
            };
            let f = match x.dtype {
                DType::F32 => &self.k.argmax_f32,
                DType::Bf16 => &self.k.argmax_bf16,
            };
            // argmax_*(x, out, width), one block per row.
            self.launch(
                f,
                cfg,
                &[Arg::Ptr(xp), Arg::Ptr(out), Arg::I32(x.width as i32)],
            )?;
            self.finish_pass();
            self.download::<u32>(out, x.real)
        })();
        picks.unwrap_or_default()
    }

    fn sync(&self) -> Result<(), BackendError> {
        // A recorded pass that never reached its end (it failed) runs nothing.
        if let Ok(mut rec) = self.recording.lock() {
            *rec = None;
        }
        if let Err(e) = self.stream.synchronize() {
            self.fail(e);
        }
        let failed = self.failed.lock().ok().and_then(|mut f| f.take());
        match failed {
            Some(cause) => Err(unusable(
                &self.info.name,
                match emulator_error() {
                    Some(kernel) => format!("{cause} ({kernel})"),
                    None => cause,
                },
            )),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caches_give_their_blocks_back_when_they_shrink_or_drop() {
        let pool = Arc::new(BlockPool {
            free: Mutex::new((0..10).collect()),
        });
        let mut c = CudaCache::default();
        c.blocks = pool.take(4).expect("10 free");
        c.pool = Some(Arc::clone(&pool));
        c.len = 4 * KV_BLOCK;
        assert_eq!(pool.free.lock().unwrap().len(), 6);
        assert!(pool.take(7).is_none(), "never more than is free");
        c.truncate(KV_BLOCK + 1); // two blocks still hold positions
        assert_eq!(c.blocks.len(), 2);
        assert_eq!(pool.free.lock().unwrap().len(), 8);
        drop(c);
        assert_eq!(pool.free.lock().unwrap().len(), 10);
        assert_eq!(CudaCache::footprint(KV_BLOCK + 1), 2 * KV_BLOCK);
        assert_eq!(CudaCache::footprint(0), 0);
    }

    /// The parameter structs as the kernels' C structs lay them out
    /// (`static_assert`s in the `.cu` files say the same sizes).
    #[test]
    fn kernel_parameter_structs_have_their_c_sizes() {
        assert_eq!(std::mem::size_of::<GemmParams>(), 112);
        assert_eq!(std::mem::size_of::<AttnParams>(), 96);
        assert_eq!(std::mem::size_of::<RopeParams>(), 128);
    }

    #[test]
    fn splits_depend_on_the_weight_alone() {
        // Qwen3-8B: q/k/v fused (48 output tiles: 384 blocks, 2.9 waves
        // of 132), o (128 blocks), gate/up fused (192 tiles: 384 blocks),
        // down (128), lm_head (1,187 tiles, nine waves unsplit).
        assert_eq!(gemm_splits(6144, 4096), 8);
        assert_eq!(gemm_splits(4096, 4096), 4);
        assert_eq!(gemm_splits(24576, 4096), 2);
        assert_eq!(gemm_splits(4096, 12288), 4);
        assert_eq!(gemm_splits(151_936, 4096), 1);
        // Short k: never split below 8 slices, nor more than 16 ways.
        assert_eq!(gemm_splits(64, 1023), 2);
        assert_eq!(gemm_splits(64, 960), 1);
        assert_eq!(gemm_splits(48, 12_288), 16);
        // Decode steps split; anything past one row tile adds in the block.
        assert!(!gemm_in_block(128, 8) && gemm_in_block(129, 8) && gemm_in_block(1, 1));
    }
}
