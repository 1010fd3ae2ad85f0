//! The device-kernel interface the forward pass is written against, and its
//! implementations: [`cpu`] (the kernels of `statebench_kernels`),
//! [`candle`] (candle-core's tensors: Metal on Apple machines, and its CPU
//! backend, where the tests run it) and, with the `cuda` feature, `cuda`
//! (our own NVRTC-compiled kernels through cudarc).
//!
//! The layers in `model.rs` call only these operations, so a device is one
//! implementation of [`Device`]; the scheduler, sessions, sampling and
//! accounting never see which one runs. Every operation must keep the
//! reduction order of an output element independent of how many rows are in
//! the batch and where they came from: that is the invariance promise.

pub mod candle;
pub mod check;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "cuda")]
pub mod perf_model;
#[cfg(feature = "cuda")]
pub mod ptxas;
pub mod toolkit;

use std::ops::Range;

use statebench_kernels::Matrix;

use super::kv_cache::KvStore;
use super::model::{Attention, Linear, Mlp, Step};
use crate::backend::BackendError;

pub use cpu::{Activations, Cpu};

/// Query heads, key/value heads and the size of one head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heads {
    /// Query heads.
    pub q: usize,
    /// Key/value heads (each shared by `q / kv` query heads).
    pub kv: usize,
    /// Floats per head.
    pub dim: usize,
}

/// Where each row of a ragged batch comes from: its item and its position
/// in that item's sequence.
#[derive(Debug, Clone, Default)]
pub struct BatchRows {
    /// Item (sequence) of each row.
    pub item: Vec<usize>,
    /// Position of each row in its sequence.
    pub pos: Vec<usize>,
    /// Each item's rows, in batch order.
    pub spans: Vec<Range<usize>>,
}

impl BatchRows {
    /// Rows of items with `new[i]` tokens each after `cached[i]` cached ones.
    pub fn new(items: impl IntoIterator<Item = (usize, usize)>) -> Self {
        let mut rows = BatchRows::default();
        for (i, (cached, new)) in items.into_iter().enumerate() {
            let start = rows.item.len();
            for j in 0..new {
                rows.item.push(i);
                rows.pos.push(cached + j);
            }
            rows.spans.push(start..start + new);
        }
        rows
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.item.len()
    }

    /// Whether the batch has no rows.
    pub fn is_empty(&self) -> bool {
        self.item.is_empty()
    }

    /// The last row of every item (the one whose logits choose its next token).
    pub fn last_of_each(&self) -> Vec<usize> {
        self.spans.iter().map(|s| s.end - 1).collect()
    }
}

/// A weight matrix as read from the files, before it goes to a device.
pub enum HostWeight {
    /// f32 or packed GGUF blocks (the CPU multiplies these natively).
    Matrix(Matrix),
    /// bf16 values as stored in a safetensors file, `rows × cols`, so a
    /// bf16 device takes them without a detour through f32.
    Bf16 {
        rows: usize,
        cols: usize,
        bits: Vec<u16>,
    },
}

impl HostWeight {
    pub fn rows(&self) -> usize {
        match self {
            HostWeight::Matrix(m) => m.rows(),
            HostWeight::Bf16 { rows, .. } => *rows,
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            HostWeight::Matrix(m) => m.cols(),
            HostWeight::Bf16 { cols, .. } => *cols,
        }
    }

    /// The values as f32, row-major (bf16 widens exactly).
    pub fn to_f32(&self) -> Vec<f32> {
        match self {
            HostWeight::Matrix(m) => m.to_f32(),
            HostWeight::Bf16 { bits, .. } => bits.iter().map(|&b| bf16_to_f32(b)).collect(),
        }
    }

    /// As a host matrix (bf16 kept at 16 bits a weight).
    pub fn into_matrix(self) -> Result<Matrix, statebench_kernels::MatrixError> {
        match self {
            HostWeight::Matrix(m) => Ok(m),
            HostWeight::Bf16 { rows, cols, bits } => Matrix::from_bf16(rows, cols, bits),
        }
    }
}

/// bf16 → f32 is exact: the bf16 bits are the top half of the f32's.
pub fn bf16_to_f32(b: u16) -> f32 {
    use statebench_kernels::ops::Float;
    statebench_kernels::ops::Bf16(b).f32()
}

/// f32 → bf16, rounded to nearest even (NaN stays NaN).
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

/// What [`Device::argmax`] returns for a row with a NaN or an infinity.
pub const NON_FINITE: u32 = u32::MAX;

/// Whether a row of logits is fit to pick from, and its pick: the pick of
/// [`crate::engine::sampling::argmax`] (the lowest index of the largest
/// value). Finite rows only, so it is found as the largest value in sixteen
/// lanes, then its first index: two passes the compiler vectorises, where
/// the one-pass compare and branch per value took 2.4% of a batch-32
/// decode step over a 151,936-token vocabulary.
pub fn argmax_checked(row: &[f32]) -> u32 {
    if !row.iter().all(|v| v.is_finite()) {
        return NON_FINITE;
    }
    let chunks = row.chunks_exact(16);
    let tail = chunks.remainder();
    let lanes = chunks.fold([f32::NEG_INFINITY; 16], |mut m, c| {
        for (m, &v) in m.iter_mut().zip(c) {
            *m = if v > *m { v } else { *m };
        }
        m
    });
    let max = lanes
        .into_iter()
        .chain(tail.iter().copied())
        .fold(f32::NEG_INFINITY, |m, v| if v > m { v } else { m });
    row.iter().position(|&v| v == max).unwrap_or(0) as u32
}

/// What one step's forward pass hands back for an item: its logits, or
/// only its greedy choice when the device picked it (ties to the lowest
/// id, NaN never wins) and the logits need not leave the device.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    Logits(Vec<f32>),
    Argmax(u32),
}

/// Which device runs the forward pass (`--device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceChoice {
    Cpu,
    Cuda(usize),
    /// The CUDA engine on the CUDA emulator: the same kernels and host code,
    /// executed on the CPU (for tests and kernel debugging, never chosen
    /// by default).
    CudaEmulated,
    Metal(usize),
}

impl DeviceChoice {
    /// The first CUDA GPU when this build has CUDA and one answers (driver
    /// and NVRTC present, at least one device), else the CPU.
    pub fn auto() -> Self {
        #[cfg(feature = "cuda")]
        if cuda::gpu_count() > 0 && cuda::nvrtc_available() {
            return DeviceChoice::Cuda(0);
        }
        DeviceChoice::Cpu
    }
}

impl std::str::FromStr for DeviceChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (kind, n) = match s.split_once(':') {
            Some((k, n)) => {
                let n = n
                    .parse()
                    .map_err(|_| format!("device '{s}': '{n}' is not a device number"))?;
                (k, n)
            }
            None => (s, 0),
        };
        match kind {
            "cpu" if !s.contains(':') => Ok(DeviceChoice::Cpu),
            "cuda-emulated" if !s.contains(':') => Ok(DeviceChoice::CudaEmulated),
            "cuda" => Ok(DeviceChoice::Cuda(n)),
            "metal" => Ok(DeviceChoice::Metal(n)),
            _ => Err(format!(
                "unknown device '{s}' (expected cpu, cuda, cuda:N, cuda-emulated or metal)"
            )),
        }
    }
}

impl std::fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceChoice::Cpu => f.write_str("cpu"),
            DeviceChoice::Cuda(n) => write!(f, "cuda:{n}"),
            DeviceChoice::CudaEmulated => f.write_str("cuda-emulated"),
            DeviceChoice::Metal(n) => write!(f, "metal:{n}"),
        }
    }
}

/// What identifies a device and its arithmetic in a run manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// `cpu`, `cuda:0`, `metal:0`, …
    pub name: String,
    /// The hardware, as its driver names it.
    pub hardware: String,
    /// Driver version, compute capability and the like; empty on the CPU.
    pub detail: String,
    /// The per-element arithmetic of this device's kernels; results are
    /// reproducible within one arithmetic.
    pub arithmetic: String,
}

/// The operations of one forward pass on one kind of device.
///
/// Activations are `rows × width` f32 matrices in the device's memory;
/// weights and vectors are uploaded once at load. Operations do not return
/// errors: a device records the first failure and reports it from
/// [`Device::sync`], which the forward pass calls at its end (as CUDA
/// reports errors at the next synchronisation).
pub trait Device: Sync + Send {
    /// A weight matrix, `out × in`, in the device's packed layout.
    type Weight: Send + Sync;
    /// A parameter vector (norm weight, bias).
    type Vector: Send + Sync;
    /// Activations, `rows × width`.
    type Act;
    /// The rotary-embedding table.
    type Rope: Send + Sync;
    /// One sequence's KV cache.
    type Cache: KvStore;

    /// What the device is, for run manifests.
    fn info(&self) -> DeviceInfo;
    /// Takes a weight matrix loaded on the host.
    fn weight(&self, w: HostWeight) -> Result<Self::Weight, BackendError>;
    /// Bytes a weight matrix takes on the device, where the device says.
    fn weight_bytes(&self, w: &Self::Weight) -> Option<usize> {
        let _ = w;
        None
    }
    /// Takes a parameter vector loaded on the host.
    fn vector(&self, v: Vec<f32>) -> Result<Self::Vector, BackendError>;
    /// The RoPE table for `max_pos` positions.
    fn rope_table(
        &self,
        head_dim: usize,
        theta: f32,
        max_pos: usize,
    ) -> Result<Self::Rope, BackendError>;
    /// Sets aside KV-cache memory for a model of `layers` layers: returns
    /// the budget in bytes the scheduler may admit against, at most
    /// `budget` (a device with a fixed pool may grant less).
    fn reserve_kv(
        &self,
        layers: usize,
        heads: Heads,
        budget: usize,
    ) -> Result<usize, BackendError> {
        let _ = (layers, heads);
        Ok(budget)
    }

    /// Bytes one position takes in one layer's cache: the keys and values
    /// of every KV head (f32 unless the device stores them otherwise).
    fn kv_bytes_per_position(&self, heads: Heads) -> usize {
        heads.kv * heads.dim * 2 * 4
    }

    /// A forward pass over `rows` begins: no activation of an earlier
    /// pass is used again (a device may reuse their memory).
    fn begin_pass(&self, rows: &BatchRows) {
        let _ = rows;
    }

    /// Activations from the host: `data` is `rows × width`, row-major.
    fn act(&self, width: usize, data: Vec<f32>) -> Self::Act;
    /// One embedding row per token.
    fn embed(&self, table: &Self::Weight, tokens: &[u32]) -> Self::Act;
    /// RMSNorm of every `weight.len()`-wide chunk of every row.
    fn rms_norm(&self, x: &Self::Act, weight: &Self::Vector, eps: f32) -> Self::Act;
    /// `x Wᵀ`: `rows × in` → `rows × out`.
    fn matmul(&self, w: &Self::Weight, x: &Self::Act) -> Self::Act;
    /// `x Wᵀ` for each `W` of `ws`, matrices that read the same input (a
    /// layer's q, k and v; its gate and up); a device may run them together.
    fn matmul_each(&self, ws: &[&Self::Weight], x: &Self::Act) -> Vec<Self::Act> {
        ws.iter().map(|w| self.matmul(w, x)).collect()
    }
    /// The output head's logits, `rows × vocab` (f32 on every device).
    fn logits(&self, head: &Self::Weight, x: &Self::Act) -> Self::Act {
        self.matmul(head, x)
    }
    /// One layer's attention inputs: q, k and v projected from `h`,
    /// Qwen3's per-head norms, RoPE, and k and v written to every item's
    /// cache; returns q, `rows × (q · dim)`. A device may fuse the steps.
    fn attention_inputs(
        &self,
        attn: &Attention<Self>,
        h: &Self::Act,
        layer: usize,
        s: &mut Step<'_, '_, Self>,
    ) -> Self::Act
    where
        Self: Sized,
    {
        super::model::attention_inputs(self, attn, h, layer, s)
    }
    /// `x ← x + h Wᵀ (+ b)`: a projection added to the residual stream.
    fn project_add(&self, w: &Linear<Self>, h: &Self::Act, x: &mut Self::Act)
    where
        Self: Sized,
    {
        let y = w.forward(self, h);
        self.add(x, &y);
    }
    /// `x ← x + down(silu(h W_gateᵀ) · h W_upᵀ)`: the MLP added to the
    /// residual stream.
    fn mlp_add(&self, mlp: &Mlp<Self>, h: &Self::Act, x: &mut Self::Act)
    where
        Self: Sized,
    {
        let y = mlp.forward(self, h);
        self.add(x, &y);
    }
    /// Adds a bias to every row.
    fn add_bias(&self, y: &mut Self::Act, bias: &Self::Vector);
    /// Rotates `heads` heads of every row by its position.
    fn rope(&self, x: &mut Self::Act, heads: usize, pos: &[usize], table: &Self::Rope);
    /// Writes each item's rows of `k` and `v` as its next positions in one
    /// layer of its cache (made visible by [`KvStore::advance`] after every
    /// layer).
    fn kv_write(
        &self,
        caches: &mut [&mut Self::Cache],
        layer: usize,
        k: &Self::Act,
        v: &Self::Act,
        rows: &BatchRows,
        heads: Heads,
    );
    /// Causal attention of every query row over its own item's cache
    /// (positions `0..=pos`), `rows × (q · dim)`.
    fn attention(
        &self,
        q: &Self::Act,
        caches: &[&Self::Cache],
        layer: usize,
        rows: &BatchRows,
        heads: Heads,
    ) -> Self::Act;
    /// `gate ← silu(gate) · up`.
    fn silu_mul(&self, gate: &mut Self::Act, up: &Self::Act);
    /// `x ← x + y`.
    fn add(&self, x: &mut Self::Act, y: &Self::Act);
    /// The given rows of `x`, in that order.
    fn gather(&self, x: &Self::Act, rows: &[usize]) -> Self::Act;
    /// Copies activations to the host, one vector per row.
    fn to_host(&self, x: Self::Act) -> Vec<Vec<f32>>;
    /// Each row's index of its largest value, ties to the lowest index
    /// (`sampling::argmax`, on the device); [`NON_FINITE`] for a row that
    /// holds a NaN or an infinity.
    fn argmax(&self, x: &Self::Act) -> Vec<u32>;
    /// Whether every value is finite, where the device can tell cheaply
    /// (the forward pass then names the first layer that went wrong).
    fn all_finite(&self, x: &Self::Act) -> Option<bool> {
        let _ = x;
        None
    }
    /// Waits for the device and reports the first failure since the last call.
    fn sync(&self) -> Result<(), BackendError>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::sampling::argmax;

    #[test]
    fn argmax_checked_picks_as_argmax_does() {
        let mut rows: Vec<Vec<f32>> = vec![
            vec![],
            vec![-0.0, 0.0],
            vec![0.0, -0.0, 0.0],
            vec![-3.0; 37],
            vec![f32::MAX, f32::MIN, f32::MAX],
        ];
        for n in [1usize, 15, 16, 17, 33, 151] {
            for salt in 0..20usize {
                // Few distinct values, so ties are common, and the largest
                // sometimes only in the tail.
                rows.push(
                    (0..n)
                        .map(|i| ((i * 7 + salt * 13) % (3 + salt % 5)) as f32 - 2.0)
                        .collect(),
                );
            }
        }
        for row in &rows {
            assert_eq!(argmax_checked(row), argmax(row), "{row:?}");
        }
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut row = vec![1.0; 40];
            row[33] = bad;
            assert_eq!(argmax_checked(&row), NON_FINITE, "{bad}");
        }
    }
}
