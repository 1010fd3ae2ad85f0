//! The CUDA device: our own kernels (`kernels/cuda/*.cu`), compiled by
//! NVRTC for the device's compute capability when the device opens, and
//! launched through cudarc, which loads `libcuda` and `libnvrtc` at run
//! time (a binary built with the feature runs, on the CPU, where neither
//! exists).
//!
//! Weights are bf16 on the device (bf16 checkpoints as they are; f16, f32
//! and GGUF weights rounded once to nearest-even bf16 at load);
//! activations and the KV cache are f32. The KV cache is paged: each
//! layer's keys and values live in one pool of blocks of `KV_BLOCK`
//! positions, sized at load from the KV budget and the free device memory;
//! a sequence holds a list of blocks and gives them back when it shrinks
//! or is dropped.
//!
//! The same code runs on the CUDA emulator (`--device cuda-emulated`,
//! `kernels/cuda/emulator/`): its driver and NVRTC libraries are loaded in
//! place of NVIDIA's before cudarc looks for them, so everything above the
//! launch is the code a GPU runs.

use std::ffi::CString;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use statebench_kernels::RopeTable;

use super::{f32_to_bf16, BatchRows, Device, DeviceInfo, Heads, HostWeight};
use crate::backend::BackendError;
use crate::engine::kv_cache::KvStore;

/// Positions per KV-cache block (`KV_BLOCK` in `common.cuh`).
pub const KV_BLOCK: usize = 16;

/// Largest head dimension the attention kernel holds in registers.
const MAX_HEAD_DIM: usize = 256;

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
    // SAFETY: the symbol is `const char* statebench_emu_last_error()`.
    let last: libloading::os::unix::Symbol<unsafe extern "C" fn() -> *const std::ffi::c_char> =
        unsafe { lib.get(b"statebench_emu_last_error\0") }.ok()?;
    // SAFETY: the emulator returns a NUL-terminated string it keeps alive.
    let text = unsafe { std::ffi::CStr::from_ptr(last()) }
        .to_string_lossy()
        .into_owned();
    (!text.is_empty()).then_some(text)
}

/// CUDA devices that answer; 0 without a driver.
pub fn gpu_count() -> usize {
    if !driver_available() {
        return 0;
    }
    CudaContext::device_count().map_or(0, |n| n.max(0) as usize)
}

/// Compiles one kernel set for `arch` (e.g. `compute_90`); the log comes
/// back even when compilation succeeds, so warnings can be refused.
pub fn compile(name: &str, body: &str, arch: &str) -> Result<Compiled, CompileError> {
    use cudarc::nvrtc::result as nvrtc;
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
    ];
    // SAFETY: `prog` is a live program; it is destroyed below on every path.
    let compiled = unsafe { nvrtc::compile_program(prog, &opts) };
    let log = unsafe { nvrtc::get_program_log(prog) }
        .map(|chars| c_text(&chars))
        .unwrap_or_default();
    let ptx = compiled.and_then(|()| unsafe { nvrtc::get_ptx(prog) });
    let _ = unsafe { nvrtc::destroy_program(prog) };
    match ptx {
        Ok(chars) => Ok(Compiled {
            ptx: c_text(&chars),
            log,
        }),
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

/// The loaded kernels.
struct Kernels {
    gemm: CudaFunction,
    rms_norm: CudaFunction,
    rope: CudaFunction,
    kv_write: CudaFunction,
    attention: CudaFunction,
    embed: CudaFunction,
    add_bias: CudaFunction,
    add: CudaFunction,
    silu_mul: CudaFunction,
    gather_rows: CudaFunction,
    argmax: CudaFunction,
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

/// Each layer's key and value pools, `[block][kv_head][KV_BLOCK][dim]`.
struct KvPools {
    k: Vec<CudaSlice<f32>>,
    v: Vec<CudaSlice<f32>>,
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

/// Activations on the device: `rows × width` f32; `None` after a failure
/// (reported by [`Device::sync`]).
pub struct CudaAct {
    rows: usize,
    width: usize,
    data: Option<CudaSlice<f32>>,
    pool: Arc<ActPool>,
}

impl Drop for CudaAct {
    fn drop(&mut self) {
        if let Some(d) = self.data.take() {
            self.pool.give(d);
        }
    }
}

/// Device buffers of dropped activations, kept by length for the next
/// activation of that length: a decode step's shapes are the last step's,
/// so once the first has run a step allocates nothing.
#[derive(Default)]
struct ActPool {
    free: Mutex<PooledBuffers>,
}

#[derive(Default)]
struct PooledBuffers {
    by_len: std::collections::HashMap<usize, Vec<CudaSlice<f32>>>,
    /// Floats held in `by_len`.
    floats: usize,
}

/// Buffers kept per length (a layer has fewer live activations of one shape).
const POOLED_PER_LENGTH: usize = 8;

/// Floats the pool holds at most (256 MiB): prompts of ever new lengths
/// (a server's) must not keep a buffer of each; past it the pool starts over.
const POOLED_FLOATS: usize = 64 << 20;

impl ActPool {
    fn take(&self, n: usize) -> Option<CudaSlice<f32>> {
        let mut free = self.free.lock().ok()?;
        let buffer = free.by_len.get_mut(&n)?.pop()?;
        free.floats -= n;
        Some(buffer)
    }

    fn give(&self, buffer: CudaSlice<f32>) {
        let Ok(mut free) = self.free.lock() else {
            return;
        };
        let n = buffer.len();
        if n > POOLED_FLOATS {
            return;
        }
        if free.floats + n > POOLED_FLOATS {
            *free = PooledBuffers::default();
        }
        let same = free.by_len.entry(n).or_default();
        if same.len() < POOLED_PER_LENGTH {
            same.push(buffer);
            free.floats += n;
        }
    }
}

/// A bf16 weight matrix on the device, `rows × cols`.
pub struct CudaWeight {
    rows: usize,
    cols: usize,
    data: CudaSlice<u16>,
}

/// The RoPE table on the device.
pub struct CudaRope {
    cos: CudaSlice<f32>,
    sin: CudaSlice<f32>,
    half: usize,
}

/// A vector of step metadata and its copy on the device.
type StepMeta = (Vec<i32>, Arc<CudaSlice<i32>>);

/// One NVIDIA GPU.
pub struct Cuda {
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
    k: Kernels,
    info: DeviceInfo,
    kv: OnceLock<KvPools>,
    failed: Mutex<Option<String>>,
    /// This step's uploaded metadata, by content.
    meta: Mutex<Vec<StepMeta>>,
    acts: Arc<ActPool>,
}

/// The error of an unusable device, in one line with what to do.
fn unusable(device: &str, cause: impl std::fmt::Display) -> BackendError {
    BackendError::Device {
        device: device.to_string(),
        cause: cause.to_string(),
    }
}

impl Cuda {
    /// Opens GPU `ordinal`: loads the driver and NVRTC, compiles and loads
    /// the kernels for its compute capability.
    pub fn open(ordinal: usize) -> Result<Self, BackendError> {
        Self::open_on(ordinal, false)
    }

    /// Opens the CUDA emulator's device: the same kernels and host code,
    /// executed on the CPU.
    pub fn open_emulated() -> Result<Self, BackendError> {
        load_emulator().map_err(|e| unusable(&super::DeviceChoice::CudaEmulated.to_string(), e))?;
        Self::open_on(0, true)
    }

    /// The device `--device` names (`cuda[:N]` or `cuda-emulated`).
    pub fn open_choice(choice: super::DeviceChoice) -> Result<Self, BackendError> {
        match choice {
            super::DeviceChoice::CudaEmulated => Self::open_emulated(),
            super::DeviceChoice::Cuda(n) => Self::open(n),
            other => Err(unusable(&other.to_string(), "not a CUDA device")),
        }
    }

    fn open_on(ordinal: usize, emulated: bool) -> Result<Self, BackendError> {
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
        let count = CudaContext::device_count().map_err(|e| unusable(&name, e))?;
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
        let ctx = CudaContext::new(ordinal).map_err(|e| unusable(&name, e))?;
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
        let arch = format!("compute_{major}{minor}");
        let mut functions = std::collections::HashMap::new();
        for (set, body) in statebench_kernels::cuda::SOURCES {
            let c = compile(set, body, &arch).map_err(|e| unusable(&name, crate::one_line(&e)))?;
            let module = ctx
                .load_module(Ptx::from_src(c.ptx))
                .map_err(|e| unusable(&name, format!("loading kernels `{set}`: {e}")))?;
            functions.insert(set, module);
        }
        let f = |set: &str, kernel: &str| {
            functions[set]
                .load_function(kernel)
                .map_err(|e| unusable(&name, format!("kernel {kernel}: {e}")))
        };
        let k = Kernels {
            gemm: f("gemm", "gemm_bf16")?,
            rms_norm: f("norm", "rms_norm")?,
            rope: f("rope", "rope")?,
            kv_write: f("attention", "kv_write")?,
            attention: f("attention", "attention")?,
            embed: f("elementwise", "embed")?,
            add_bias: f("elementwise", "add_bias")?,
            add: f("elementwise", "add")?,
            silu_mul: f("elementwise", "silu_mul")?,
            gather_rows: f("elementwise", "gather_rows")?,
            argmax: f("elementwise", "argmax")?,
        };
        let mut driver = 0i32;
        // SAFETY: writes one integer.
        unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver) };
        let asan = std::env::var("STATEBENCH_EMULATOR_ASAN").map_or(true, |v| v != "0");
        let info = DeviceInfo {
            name: name.clone(),
            hardware,
            detail: format!(
                "{}driver {}.{}, compute capability {major}.{minor}{}",
                if emulated { "emulated " } else { "" },
                driver / 1000,
                (driver % 1000) / 10,
                match (emulated, asan) {
                    (true, true) => ", kernels under AddressSanitizer",
                    (true, false) => ", kernels without AddressSanitizer",
                    _ => "",
                }
            ),
            arithmetic: if emulated {
                statebench_kernels::cuda::EMULATED_ARITHMETIC
            } else {
                statebench_kernels::cuda::ARITHMETIC
            }
            .to_string(),
        };
        Ok(Cuda {
            stream: ctx.default_stream(),
            ctx,
            k,
            info,
            kv: OnceLock::new(),
            failed: Mutex::new(None),
            meta: Mutex::new(Vec::new()),
            acts: Arc::default(),
        })
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

    /// A step's index metadata (positions, block tables, cache slots) on
    /// the device: every layer of a step asks for the same vectors, so each
    /// distinct one is uploaded once a step (`sync` ends the step).
    fn step_meta(&self, v: Vec<i32>) -> Option<Arc<CudaSlice<i32>>> {
        let mut meta = self.meta.lock().ok()?;
        if let Some((_, d)) = meta.iter().find(|(h, _)| *h == v) {
            return Some(Arc::clone(d));
        }
        let d = Arc::new(self.upload(&v)?);
        meta.push((v, Arc::clone(&d)));
        Some(d)
    }

    fn upload<T: DeviceRepr>(&self, v: &[T]) -> Option<CudaSlice<T>> {
        self.stream
            .clone_htod(v)
            .map_err(|e| self.fail(format!("copy to device: {e}")))
            .ok()
    }

    fn alloc(&self, n: usize) -> Option<CudaSlice<f32>> {
        let n = n.max(1);
        // Reused buffers hold an earlier activation's values: every kernel
        // writes all of its output (the emulator's NaN-filled fresh memory
        // checks that on a step's first run of each shape).
        if let Some(reused) = self.acts.take(n) {
            return Some(reused);
        }
        // SAFETY: every kernel that gets this buffer writes all of it.
        unsafe { self.stream.alloc::<f32>(n) }
            .map_err(|e| self.fail(format!("device memory: {e}")))
            .ok()
    }

    /// A launch's outcome: a failure is recorded, and the result is None.
    fn launched<T>(&self, r: Result<T, cudarc::driver::DriverError>) -> Option<()> {
        r.map(|_| ())
            .map_err(|e| self.fail(format!("kernel launch: {e}")))
            .ok()
    }

    fn wrap(&self, rows: usize, width: usize, data: Option<CudaSlice<f32>>) -> CudaAct {
        CudaAct {
            rows,
            width,
            data,
            pool: Arc::clone(&self.acts),
        }
    }

    /// Blocks to cover `rows` elements with 256 threads each.
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
}

impl Device for Cuda {
    type Weight = CudaWeight;
    type Vector = CudaSlice<f32>;
    type Act = CudaAct;
    type Rope = CudaRope;
    type Cache = CudaCache;

    fn info(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn weight(&self, w: HostWeight) -> Result<CudaWeight, BackendError> {
        let (rows, cols) = (w.rows(), w.cols());
        let bits: Vec<u16> = match w {
            HostWeight::Bf16 { bits, .. } => bits,
            HostWeight::Matrix(m) => m.to_f32().into_iter().map(f32_to_bf16).collect(),
        };
        let data = self
            .stream
            .clone_htod(&bits)
            .map_err(|e| unusable(&self.info.name, format!("uploading weights: {e}")))?;
        Ok(CudaWeight { rows, cols, data })
    }

    fn vector(&self, v: Vec<f32>) -> Result<CudaSlice<f32>, BackendError> {
        self.stream
            .clone_htod(&v)
            .map_err(|e| unusable(&self.info.name, format!("uploading weights: {e}")))
    }

    fn rope_table(
        &self,
        head_dim: usize,
        theta: f32,
        max_pos: usize,
    ) -> Result<CudaRope, BackendError> {
        if head_dim > MAX_HEAD_DIM {
            return Err(unusable(
                &self.info.name,
                format!("head dimension {head_dim} is over the attention kernel's {MAX_HEAD_DIM}"),
            ));
        }
        let t = RopeTable::new(head_dim, theta, max_pos);
        Ok(CudaRope {
            cos: self.vector(t.cos().to_vec())?,
            sin: self.vector(t.sin().to_vec())?,
            half: t.half(),
        })
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
        let block_floats = heads.kv * KV_BLOCK * heads.dim;
        let block_bytes = layers * 2 * block_floats * 4;
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
                format!("no device memory left for a KV cache ({free} bytes free)"),
            ));
        }
        let mut k = Vec::with_capacity(layers);
        let mut v = Vec::with_capacity(layers);
        for _ in 0..layers {
            for pool in [&mut k, &mut v] {
                // SAFETY: a block is written (kv_write) before attention reads it.
                let p = unsafe { self.stream.alloc::<f32>(blocks * block_floats) }
                    .map_err(|e| unusable(&self.info.name, format!("KV cache: {e}")))?;
                pool.push(p);
            }
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

    fn act(&self, width: usize, data: Vec<f32>) -> CudaAct {
        let rows = data.len() / width.max(1);
        self.wrap(rows, width, self.upload(&data))
    }

    fn embed(&self, table: &CudaWeight, tokens: &[u32]) -> CudaAct {
        let (rows, hidden) = (tokens.len(), table.cols);
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let (rows_i, hidden_i) = (rows as i32, hidden as i32);
        let out = (|| {
            self.healthy()?;
            let ids = self.upload(&ids)?;
            let mut out = self.alloc(rows * hidden)?;
            let mut b = self.stream.launch_builder(&self.k.embed);
            b.arg(&table.data)
                .arg(&ids)
                .arg(&mut out)
                .arg(&rows_i)
                .arg(&hidden_i);
            // SAFETY: embed(table, tokens, x, rows, hidden), x has rows × hidden floats.
            self.launched(unsafe { b.launch(Self::grid(rows * hidden)) })?;
            Some(out)
        })();
        self.wrap(rows, hidden, out)
    }

    fn rms_norm(&self, x: &CudaAct, weight: &CudaSlice<f32>, eps: f32) -> CudaAct {
        let w = weight.len();
        let w_i = w as i32;
        let out = (|| {
            self.healthy()?;
            let xd = x.data.as_ref()?;
            let mut out = self.alloc(x.rows * x.width)?;
            let cfg = LaunchConfig {
                grid_dim: ((x.rows * x.width / w).max(1) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut b = self.stream.launch_builder(&self.k.rms_norm);
            b.arg(xd).arg(weight).arg(&mut out).arg(&w_i).arg(&eps);
            // SAFETY: rms_norm(x, weight, y, width, eps), one block per chunk.
            self.launched(unsafe { b.launch(cfg) })?;
            Some(out)
        })();
        self.wrap(x.rows, x.width, out)
    }

    fn matmul(&self, w: &CudaWeight, x: &CudaAct) -> CudaAct {
        let (rows_i, k_i, out_i) = (x.rows as i32, w.cols as i32, w.rows as i32);
        let out = (|| {
            self.healthy()?;
            let xd = x.data.as_ref()?;
            let mut out = self.alloc(x.rows * w.rows)?;
            let cfg = LaunchConfig {
                grid_dim: (x.rows.div_ceil(16) as u32, w.rows.div_ceil(64) as u32, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut b = self.stream.launch_builder(&self.k.gemm);
            b.arg(xd)
                .arg(&w.data)
                .arg(&mut out)
                .arg(&rows_i)
                .arg(&k_i)
                .arg(&out_i);
            // SAFETY: gemm_bf16(x, w, y, rows, k, out) over 16 × 64 tiles.
            self.launched(unsafe { b.launch(cfg) })?;
            Some(out)
        })();
        self.wrap(x.rows, w.rows, out)
    }

    fn add_bias(&self, y: &mut CudaAct, bias: &CudaSlice<f32>) {
        let (rows_i, width_i) = (y.rows as i32, y.width as i32);
        let n = y.rows * y.width;
        let ok = (|| {
            self.healthy()?;
            let yd = y.data.as_mut()?;
            let mut b = self.stream.launch_builder(&self.k.add_bias);
            b.arg(yd).arg(bias).arg(&rows_i).arg(&width_i);
            // SAFETY: add_bias(y, bias, rows, width).
            self.launched(unsafe { b.launch(Self::grid(n)) })
        })();
        if ok.is_none() {
            y.data = None;
        }
    }

    fn rope(&self, x: &mut CudaAct, heads: usize, pos: &[usize], table: &CudaRope) {
        let n = x.rows * heads * table.half;
        let (rows_i, heads_i, half_i) = (x.rows as i32, heads as i32, table.half as i32);
        let pos: Vec<i32> = pos.iter().map(|&p| p as i32).collect();
        let ok = (|| {
            self.healthy()?;
            let pos = self.step_meta(pos)?;
            let xd = x.data.as_mut()?;
            let mut b = self.stream.launch_builder(&self.k.rope);
            b.arg(xd)
                .arg(&table.cos)
                .arg(&table.sin)
                .arg(&*pos)
                .arg(&rows_i)
                .arg(&heads_i)
                .arg(&half_i);
            // SAFETY: rope(x, cos, sin, pos, rows, heads, half), in place.
            self.launched(unsafe { b.launch(Self::grid(n)) })
        })();
        if ok.is_none() {
            x.data = None;
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
        let (Some(kd), Some(vd)) = (k.data.as_ref(), v.data.as_ref()) else {
            return;
        };
        let (rows_i, kv_i, dim_i) = (rows.len() as i32, heads.kv as i32, heads.dim as i32);
        let _ = (|| {
            self.healthy()?;
            // Where each row's position goes: block * KV_BLOCK + offset.
            let mut slots = Vec::with_capacity(rows.len());
            for (cache, span) in caches.iter_mut().zip(&rows.spans) {
                self.grow(cache, span.len())?;
                for p in cache.len..cache.len + span.len() {
                    let b = cache.blocks[p / KV_BLOCK] as usize;
                    slots.push((b * KV_BLOCK + p % KV_BLOCK) as i32);
                }
            }
            let pools = self.kv.get()?;
            let slots = self.step_meta(slots)?;
            let n = rows.len() * heads.kv * heads.dim;
            let mut b = self.stream.launch_builder(&self.k.kv_write);
            b.arg(kd)
                .arg(vd)
                .arg(&pools.k[layer])
                .arg(&pools.v[layer])
                .arg(&*slots)
                .arg(&rows_i)
                .arg(&kv_i)
                .arg(&dim_i);
            // SAFETY: kv_write(k, v, kpool, vpool, slots, rows, kv_heads, dim);
            // every slot lies in a block this cache holds.
            self.launched(unsafe { b.launch(Self::grid(n)) })
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
        let (q_i, kv_i, dim_i) = (heads.q as i32, heads.kv as i32, heads.dim as i32);
        let scale = 1.0f32 / (heads.dim as f32).sqrt();
        let out = (|| {
            self.healthy()?;
            let qd = q.data.as_ref()?;
            let pools = self.kv.get()?;
            // Every item's block table, one after another, and where each row's starts.
            let mut tables: Vec<i32> = Vec::new();
            let mut offsets = Vec::with_capacity(caches.len());
            for c in caches {
                offsets.push(tables.len() as i32);
                tables.extend(c.blocks.iter().map(|&b| b as i32));
            }
            let row_table: Vec<i32> = rows.item.iter().map(|&i| offsets[i]).collect();
            let row_pos: Vec<i32> = rows.pos.iter().map(|&p| p as i32).collect();
            let tables = self.step_meta(tables)?;
            let row_table = self.step_meta(row_table)?;
            let row_pos = self.step_meta(row_pos)?;
            let mut out = self.alloc(rows.len() * q.width)?;
            let cfg = LaunchConfig {
                grid_dim: (rows.len() as u32, heads.kv as u32, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut b = self.stream.launch_builder(&self.k.attention);
            b.arg(qd)
                .arg(&pools.k[layer])
                .arg(&pools.v[layer])
                .arg(&mut out)
                .arg(&*row_pos)
                .arg(&*row_table)
                .arg(&*tables)
                .arg(&q_i)
                .arg(&kv_i)
                .arg(&dim_i)
                .arg(&scale);
            // SAFETY: attention(q, kpool, vpool, out, row_pos, row_table,
            // tables, heads, kv_heads, dim, scale); one block per (row, KV head).
            self.launched(unsafe { b.launch(cfg) })?;
            Some(out)
        })();
        self.wrap(rows.len(), q.width, out)
    }

    fn silu_mul(&self, gate: &mut CudaAct, up: &CudaAct) {
        let n = gate.rows * gate.width;
        let n_i = n as i32;
        let ok = (|| {
            self.healthy()?;
            let u = up.data.as_ref()?;
            let g = gate.data.as_mut()?;
            let mut b = self.stream.launch_builder(&self.k.silu_mul);
            b.arg(g).arg(u).arg(&n_i);
            // SAFETY: silu_mul(gate, up, n).
            self.launched(unsafe { b.launch(Self::grid(n)) })
        })();
        if ok.is_none() {
            gate.data = None;
        }
    }

    fn add(&self, x: &mut CudaAct, y: &CudaAct) {
        let n = x.rows * x.width;
        let n_i = n as i32;
        let ok = (|| {
            self.healthy()?;
            let yd = y.data.as_ref()?;
            let xd = x.data.as_mut()?;
            let mut b = self.stream.launch_builder(&self.k.add);
            b.arg(xd).arg(yd).arg(&n_i);
            // SAFETY: add(x, y, n).
            self.launched(unsafe { b.launch(Self::grid(n)) })
        })();
        if ok.is_none() {
            x.data = None;
        }
    }

    fn gather(&self, x: &CudaAct, rows: &[usize]) -> CudaAct {
        let idx: Vec<i32> = rows.iter().map(|&r| r as i32).collect();
        let (n_i, width_i) = (rows.len() as i32, x.width as i32);
        let out = (|| {
            self.healthy()?;
            let xd = x.data.as_ref()?;
            let idx = self.upload(&idx)?;
            let mut out = self.alloc(rows.len() * x.width)?;
            let mut b = self.stream.launch_builder(&self.k.gather_rows);
            b.arg(xd).arg(&idx).arg(&mut out).arg(&n_i).arg(&width_i);
            // SAFETY: gather_rows(x, rows, y, n, width).
            self.launched(unsafe { b.launch(Self::grid(rows.len() * x.width)) })?;
            Some(out)
        })();
        self.wrap(rows.len(), x.width, out)
    }

    fn to_host(&self, x: CudaAct) -> Vec<Vec<f32>> {
        let Some(d) = x.data.as_ref() else {
            return Vec::new();
        };
        match self.stream.clone_dtoh(d) {
            Ok(v) => v
                .chunks_exact(x.width.max(1))
                .map(<[f32]>::to_vec)
                .collect(),
            Err(e) => {
                self.fail(format!("copy from device: {e}"));
                Vec::new()
            }
        }
    }

    fn argmax(&self, x: &CudaAct) -> Vec<u32> {
        let picks = (|| {
            self.healthy()?;
            let xd = x.data.as_ref()?;
            // SAFETY: the kernel writes one index per row.
            let mut out = unsafe { self.stream.alloc::<u32>(x.rows.max(1)) }
                .map_err(|e| self.fail(format!("device memory: {e}")))
                .ok()?;
            let cfg = LaunchConfig {
                grid_dim: (x.rows as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let width_i = x.width as i32;
            let mut b = self.stream.launch_builder(&self.k.argmax);
            b.arg(xd).arg(&mut out).arg(&width_i);
            // SAFETY: argmax(x, out, width), one block per row.
            self.launched(unsafe { b.launch(cfg) })?;
            self.stream
                .clone_dtoh(&out)
                .map_err(|e| self.fail(format!("copy from device: {e}")))
                .ok()
        })();
        picks
            .map(|mut p| {
                p.truncate(x.rows);
                p
            })
            .unwrap_or_default()
    }

    fn sync(&self) -> Result<(), BackendError> {
        if let Err(e) = self.stream.synchronize() {
            self.fail(e);
        }
        if let Ok(mut meta) = self.meta.lock() {
            meta.clear();
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
        assert_eq!(CudaCache::footprint(17), 32);
        assert_eq!(CudaCache::footprint(0), 0);
    }
}
