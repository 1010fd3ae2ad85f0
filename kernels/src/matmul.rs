//! Matrix × batch-of-rows products for float and GGML-quantized weights.
//!
//! A weight matrix has `rows` output features, each a row of `cols` inputs.
//! `y[b][r] = dot(w[r], x[b])`, where each dot product is one call with a fixed
//! order. Work is split over output rows only, and the loop is weights-outer so
//! a batch of activation rows reuses each weight row while it is in cache.

use candle_core::quantized::k_quants::{BlockQ4_1, BlockQ5K, BlockQ5_1, GgmlType};
use candle_core::quantized::GgmlDType;
use rayon::prelude::*;

use crate::kq::{unpack_k_row, K8};
use crate::native::{pack_q4_0, pack_q4k, pack_q5_0, pack_q6k, Q4Kx8, Q4x8, Q5x8, Q6Kx8, Stored};
use crate::ops::{dots, Bf16, Float};
use crate::pair::{pair_up, pairs_of, Pair, PairK, PairQ8, Paired};
use crate::q8::{pack_q8, unpack_q8_row, Activations, Packed, Q8Blocks, Q8Row, Q8x8, TileBlock};

/// Pair layouts with an AMX kernel ([`crate::amx::Kernel`] on x86-64).
#[cfg(target_arch = "x86_64")]
use crate::amx::Kernel as Tiled;

/// Pair layouts with an AMX kernel (none off x86-64).
#[cfg(not(target_arch = "x86_64"))]
trait Tiled {}
#[cfg(not(target_arch = "x86_64"))]
impl<T> Tiled for T {}

/// Why a weight matrix could not be built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MatrixError {
    /// The GGML type has no kernel here.
    UnsupportedType(String),
    /// The byte length or shape does not fit the type's block layout.
    BadShape(String),
    /// Value `n` (row-major) of float weights to be quantized is NaN or
    /// infinite: ggml's rounding would make it 0.
    NonFinite(usize),
}

impl std::fmt::Display for MatrixError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::UnsupportedType(t) => write!(f, "unsupported weight type {t}"),
            Self::BadShape(s) => write!(f, "bad weight shape: {s}"),
            Self::NonFinite(i) => write!(f, "value {i} is NaN or infinite"),
        }
    }
}

impl std::error::Error for MatrixError {}

/// Weight storage, one variant per supported element or block format.
pub enum WeightData {
    /// Plain f32.
    F32(Vec<f32>),
    /// bf16, widened to f32 in registers.
    Bf16(Vec<Bf16>),
    /// f16, widened to f32 in registers.
    F16(Vec<half::f16>),
    /// GGML Q4_1.
    Q4_1(Vec<BlockQ4_1>),
    /// GGML Q5_1.
    Q5_1(Vec<BlockQ5_1>),
    /// GGML Q8_0, eight rows interleaved; also Q4_0 and Q5_0 widened to it.
    Q8_0(Vec<Q8x8>),
    /// GGML Q4_K and Q6_K widened to the kernels' 32-column form.
    K(Vec<K8>),
    /// GGML Q4_0 at its own bits, eight rows interleaved.
    Q4_0(Vec<Q4x8>),
    /// GGML Q5_0 at its own bits, eight rows interleaved.
    Q5_0(Vec<Q5x8>),
    /// GGML Q4_K at its own bits, eight rows interleaved.
    Q4K(Vec<Q4Kx8>),
    /// GGML Q6_K at its own bits, eight rows interleaved.
    Q6K(Vec<Q6Kx8>),
    /// GGML Q5_K.
    Q5K(Vec<BlockQ5K>),
    /// Q8_0 (and Q4_0, Q5_0 widened) sixteen rows at a time, as the AMX
    /// tiles read them.
    Q8Pairs(Vec<PairQ8>),
    /// K-quants widened, sixteen rows at a time.
    KPairs(Vec<PairK>),
}

/// A weight matrix of `rows` output features by `cols` input features.
pub struct Matrix {
    rows: usize,
    cols: usize,
    data: WeightData,
    /// Every weight is within ±16 (Q4_0 and Q5_0, natively stored or
    /// widened): the AVX2 kernels then take a shorter path to the same bits.
    small: bool,
}

fn blocks_from_bytes<T: GgmlType>(bytes: &[u8], n_blocks: usize) -> Result<Vec<T>, MatrixError> {
    let size = std::mem::size_of::<T>();
    if bytes.len() != n_blocks * size {
        return Err(MatrixError::BadShape(format!(
            "{} bytes for {n_blocks} blocks of {size}",
            bytes.len()
        )));
    }
    let mut v: Vec<T> = (0..n_blocks).map(|_| T::zeros()).collect();
    // SAFETY: the block types are `repr(C)` plain data (f16 and byte arrays),
    // every bit pattern is valid, and the lengths were checked above.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), v.as_mut_ptr() as *mut u8, bytes.len());
    }
    Ok(v)
}

impl Matrix {
    /// A matrix of `data` as its format stores it.
    fn new(rows: usize, cols: usize, data: WeightData) -> Self {
        let small = matches!(data, WeightData::Q4_0(_) | WeightData::Q5_0(_));
        Self {
            rows,
            cols,
            data,
            small,
        }
    }

    /// A float matrix from row-major data.
    pub fn from_f32(rows: usize, cols: usize, data: Vec<f32>) -> Result<Self, MatrixError> {
        if data.len() != rows * cols {
            return Err(MatrixError::BadShape(format!(
                "{} values for {rows}x{cols}",
                data.len()
            )));
        }
        Ok(Self::new(rows, cols, WeightData::F32(data)))
    }

    /// A bf16 matrix from row-major bits, kept at 16 bits a weight.
    pub fn from_bf16(rows: usize, cols: usize, bits: Vec<u16>) -> Result<Self, MatrixError> {
        Self::floats(rows, cols, bits.len(), || {
            WeightData::Bf16(bits.into_iter().map(Bf16).collect())
        })
    }

    /// An f16 matrix from row-major bits, kept at 16 bits a weight.
    pub fn from_f16(rows: usize, cols: usize, bits: Vec<u16>) -> Result<Self, MatrixError> {
        Self::floats(rows, cols, bits.len(), || {
            WeightData::F16(bits.into_iter().map(half::f16::from_bits).collect())
        })
    }

    fn floats(
        rows: usize,
        cols: usize,
        n: usize,
        data: impl FnOnce() -> WeightData,
    ) -> Result<Self, MatrixError> {
        if n != rows * cols {
            return Err(MatrixError::BadShape(format!(
                "{n} values for {rows}x{cols}"
            )));
        }
        Ok(Self::new(rows, cols, data()))
    }

    /// A matrix from raw GGML bytes of type `dtype` (rows of `cols` elements).
    pub fn from_ggml(
        dtype: GgmlDType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<Self, MatrixError> {
        let bs = dtype.block_size();
        if !cols.is_multiple_of(bs) {
            return Err(MatrixError::BadShape(format!(
                "row length {cols} is not a multiple of the {dtype:?} block size {bs}"
            )));
        }
        let (nb, bpr) = (rows * cols / bs, cols / bs);
        let halves = || {
            bytes
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect()
        };
        let data = match dtype {
            GgmlDType::F32 => {
                if bytes.len() != rows * cols * 4 {
                    return Err(MatrixError::BadShape(format!(
                        "{} bytes for {rows}x{cols} f32",
                        bytes.len()
                    )));
                }
                WeightData::F32(
                    bytes
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect(),
                )
            }
            GgmlDType::F16 => return Self::from_f16(rows, cols, halves()),
            GgmlDType::BF16 => return Self::from_bf16(rows, cols, halves()),
            GgmlDType::Q4_0 => {
                WeightData::Q4_0(pack_q4_0(&blocks_from_bytes(bytes, nb)?, rows, bpr))
            }
            GgmlDType::Q4_1 => WeightData::Q4_1(blocks_from_bytes(bytes, nb)?),
            GgmlDType::Q5_0 => {
                WeightData::Q5_0(pack_q5_0(&blocks_from_bytes(bytes, nb)?, rows, bpr))
            }
            GgmlDType::Q5_1 => WeightData::Q5_1(blocks_from_bytes(bytes, nb)?),
            GgmlDType::Q8_0 => WeightData::Q8_0(pack_q8(
                &Q8Blocks::from_q8_0(&blocks_from_bytes(bytes, nb)?),
                rows,
                bpr,
            )),
            GgmlDType::Q4K => WeightData::Q4K(pack_q4k(&blocks_from_bytes(bytes, nb)?, rows, bpr)),
            GgmlDType::Q5K => WeightData::Q5K(blocks_from_bytes(bytes, nb)?),
            GgmlDType::Q6K => WeightData::Q6K(pack_q6k(&blocks_from_bytes(bytes, nb)?, rows, bpr)),
            other => return Err(MatrixError::UnsupportedType(format!("{other:?}"))),
        };
        Ok(Self::new(rows, cols, data))
    }

    /// Quantizes row-major f32 data to `dtype` (for tests and benchmarks).
    pub fn quantize(
        dtype: GgmlDType,
        rows: usize,
        cols: usize,
        data: &[f32],
    ) -> Result<Self, MatrixError> {
        fn q<T: GgmlType>(data: &[f32], bs: usize) -> Vec<T> {
            let mut v: Vec<T> = (0..data.len() / bs).map(|_| T::zeros()).collect();
            T::from_float(data, &mut v);
            v
        }
        if data.len() != rows * cols || !cols.is_multiple_of(dtype.block_size()) {
            return Err(MatrixError::BadShape(format!(
                "{} values for {rows}x{cols} {dtype:?}",
                data.len()
            )));
        }
        if dtype != GgmlDType::F32 {
            if let Some(i) = data.iter().position(|v| !v.is_finite()) {
                return Err(MatrixError::NonFinite(i));
            }
        }
        let bs = dtype.block_size();
        let bpr = cols / bs;
        let data = match dtype {
            GgmlDType::F32 => WeightData::F32(data.to_vec()),
            GgmlDType::Q4_0 => WeightData::Q4_0(pack_q4_0(&q(data, bs), rows, bpr)),
            GgmlDType::Q5_0 => WeightData::Q5_0(pack_q5_0(&q(data, bs), rows, bpr)),
            GgmlDType::Q8_0 => {
                WeightData::Q8_0(pack_q8(&Q8Blocks::from_q8_0(&q(data, bs)), rows, bpr))
            }
            GgmlDType::Q4K => WeightData::Q4K(pack_q4k(&q(data, bs), rows, bpr)),
            GgmlDType::Q6K => WeightData::Q6K(pack_q6k(&q(data, bs), rows, bpr)),
            other => return Err(MatrixError::UnsupportedType(format!("{other:?}"))),
        };
        Ok(Self::new(rows, cols, data))
    }

    /// The same matrix with Q4_0, Q5_0, Q4_K and Q6_K weights widened once,
    /// here, instead of per product: more memory (8.5 or 11 bits a weight
    /// instead of the file's 4.5–6.6) for less work per product, which pays
    /// from a few rows a batch up. The kernels read the same values either
    /// way, so every result is bit-identical.
    pub fn widen(self) -> Self {
        fn all<S: Stored>(w: &[S], rows: usize, cols: usize) -> Vec<S::Wide> {
            let per_group = cols / S::COLS;
            let mut out = Vec::with_capacity(rows.div_ceil(8) * cols / 32);
            for g in w.chunks(per_group) {
                S::with_wide(g, |wide| out.extend_from_slice(wide));
            }
            out
        }
        let (rows, cols) = (self.rows, self.cols);
        let data = match &self.data {
            WeightData::Q4_0(w) => WeightData::Q8_0(all(w, rows, cols)),
            WeightData::Q5_0(w) => WeightData::Q8_0(all(w, rows, cols)),
            WeightData::Q4K(w) => WeightData::K(all(w, rows, cols)),
            WeightData::Q6K(w) => WeightData::K(all(w, rows, cols)),
            _ => return self,
        };
        // The same values, so as small as they were.
        Self { data, ..self }
    }

    /// The same matrix with Q8_0 and widened K-quant weights held sixteen
    /// rows at a time ([`crate::pair`]): the AMX tiles then multiply them
    /// without a copy per product, and the vector kernels read the same
    /// layout (the same bits either way). Worth it where
    /// [`crate::cpu::pairs_pay`] holds; other matrices are returned as they
    /// are.
    pub fn paired(self) -> Self {
        fn all<P: Pair>(w: &[P::Group], cols: usize) -> Vec<P> {
            let bpr = cols / 32;
            let mut out = vec![P::ZERO; pairs_of(w.len() / bpr) * bpr];
            pair_up(w, bpr, &mut out);
            out
        }
        let cols = self.cols;
        let data = match &self.data {
            WeightData::Q8_0(w) => WeightData::Q8Pairs(all(w, cols)),
            WeightData::K(w) => WeightData::KPairs(all(w, cols)),
            _ => return self,
        };
        // The same values, so as small as they were.
        Self { data, ..self }
    }

    /// Float weights (f32, bf16, f16) quantized to ggml's Q8_0 (blocks of
    /// 32 with one f16 scale, ggml's rounding), read by the integer kernels;
    /// other matrices are returned as they are. Results change with it: a
    /// different arithmetic from the float weights'.
    pub fn to_q8_0(self) -> Result<Self, MatrixError> {
        if !matches!(
            self.data,
            WeightData::F32(_) | WeightData::Bf16(_) | WeightData::F16(_)
        ) {
            return Ok(self);
        }
        Self::quantize(GgmlDType::Q8_0, self.rows, self.cols, &self.to_f32())
    }

    /// Bytes the weights take in memory.
    pub fn bytes(&self) -> usize {
        use std::mem::size_of_val;
        match &self.data {
            WeightData::F32(w) => size_of_val(&w[..]),
            WeightData::Bf16(w) => size_of_val(&w[..]),
            WeightData::F16(w) => size_of_val(&w[..]),
            WeightData::Q4_1(w) => size_of_val(&w[..]),
            WeightData::Q5_1(w) => size_of_val(&w[..]),
            WeightData::Q8_0(w) => size_of_val(&w[..]),
            WeightData::K(w) => size_of_val(&w[..]),
            WeightData::Q4_0(w) => size_of_val(&w[..]),
            WeightData::Q5_0(w) => size_of_val(&w[..]),
            WeightData::Q4K(w) => size_of_val(&w[..]),
            WeightData::Q6K(w) => size_of_val(&w[..]),
            WeightData::Q5K(w) => size_of_val(&w[..]),
            WeightData::Q8Pairs(w) => size_of_val(&w[..]),
            WeightData::KPairs(w) => size_of_val(&w[..]),
        }
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Name of the storage format.
    pub fn type_name(&self) -> &'static str {
        match &self.data {
            WeightData::F32(_) => "F32",
            WeightData::Bf16(_) => "BF16",
            WeightData::F16(_) => "F16",
            WeightData::Q4_1(_) => "Q4_1",
            WeightData::Q5_1(_) => "Q5_1",
            WeightData::Q8_0(_) => "Q8_0",
            WeightData::K(_) => "K-quant (widened)",
            WeightData::Q4_0(_) => "Q4_0",
            WeightData::Q5_0(_) => "Q5_0",
            WeightData::Q4K(_) => "Q4_K",
            WeightData::Q6K(_) => "Q6_K",
            WeightData::Q5K(_) => "Q5_K",
            WeightData::Q8Pairs(_) => "Q8_0 (16-row tiles)",
            WeightData::KPairs(_) => "K-quant (widened, 16-row tiles)",
        }
    }

    /// Dequantizes row `r` into `out` (used for embedding lookups).
    pub fn row_f32(&self, r: usize, out: &mut [f32]) {
        let c = self.cols;
        fn deq<T: GgmlType>(w: &[T], r: usize, c: usize, out: &mut [f32]) {
            let bpr = c / T::BLCK_SIZE;
            T::to_float(&w[r * bpr..(r + 1) * bpr], &mut out[..c]);
        }
        match &self.data {
            WeightData::F32(w) => out[..c].copy_from_slice(&w[r * c..(r + 1) * c]),
            WeightData::Bf16(w) => float_row(&w[r * c..(r + 1) * c], out),
            WeightData::F16(w) => float_row(&w[r * c..(r + 1) * c], out),
            WeightData::Q4_1(w) => deq(w, r, c, out),
            WeightData::Q5_1(w) => deq(w, r, c, out),
            WeightData::Q8_0(w) => unpack_q8_row(w, c / 32, r, &mut out[..c]),
            WeightData::K(w) => unpack_k_row(w, c / 32, r, &mut out[..c]),
            WeightData::Q4_0(w) => native_row(w, c, r, |g, k| unpack_q8_row(g, g.len(), k, out)),
            WeightData::Q5_0(w) => native_row(w, c, r, |g, k| unpack_q8_row(g, g.len(), k, out)),
            WeightData::Q4K(w) => native_row(w, c, r, |g, k| unpack_k_row(g, g.len(), k, out)),
            WeightData::Q6K(w) => native_row(w, c, r, |g, k| unpack_k_row(g, g.len(), k, out)),
            WeightData::Q5K(w) => deq(w, r, c, out),
            WeightData::Q8Pairs(w) => pair_row(w, c, r, out),
            WeightData::KPairs(w) => pair_row(w, c, r, out),
        }
    }

    /// The whole matrix as row-major f32.
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        for (r, row) in out.chunks_exact_mut(self.cols).enumerate() {
            self.row_f32(r, row);
        }
        out
    }

    /// `y[b * rows + r] = dot(w[r], x[b * cols ..])` for `n` rows of `x`.
    pub fn matmul(&self, x: &[f32], n: usize, y: &mut [f32]) {
        assert_eq!(x.len(), n * self.cols, "matmul input length");
        assert_eq!(y.len(), n * self.rows, "matmul output length");
        if self.reads_q8() {
            return matmul_each(&[self], x, n, &mut [y]);
        }
        match &self.data {
            WeightData::F32(w) => matmul_float(w, self.rows, self.cols, x, n, y),
            WeightData::Bf16(w) => matmul_float(w, self.rows, self.cols, x, n, y),
            WeightData::F16(w) => matmul_float(w, self.rows, self.cols, x, n, y),
            WeightData::Q4_1(w) => matmul_q(w, self.rows, self.cols, x, n, y),
            WeightData::Q5_1(w) => matmul_q(w, self.rows, self.cols, x, n, y),
            WeightData::Q5K(w) => matmul_q(w, self.rows, self.cols, x, n, y),
            _ => unreachable!("a format that reads Q8_0 activations"),
        }
    }

    /// Whether this format's kernels read activations quantized to Q8_0
    /// (and so can share one quantized input with other matrices) rather
    /// than f32. The one place formats are sorted so: no wildcard, so a new
    /// format must be placed here.
    fn reads_q8(&self) -> bool {
        match self.data {
            WeightData::Q8_0(_)
            | WeightData::K(_)
            | WeightData::Q4_0(_)
            | WeightData::Q5_0(_)
            | WeightData::Q4K(_)
            | WeightData::Q6K(_)
            | WeightData::Q8Pairs(_)
            | WeightData::KPairs(_) => true,
            WeightData::F32(_)
            | WeightData::Bf16(_)
            | WeightData::F16(_)
            | WeightData::Q4_1(_)
            | WeightData::Q5_1(_)
            | WeightData::Q5K(_) => false,
        }
    }

    /// The parallel tasks of `y = x Wᵀ` from activations already quantized
    /// to Q8_0, for the formats whose kernels read them; `None` for the
    /// rest.
    fn q8_job<'a>(&'a self, q8: Q8Input<'a>, y: &'a mut [f32]) -> Option<Job<'a>> {
        let (r, c, small) = (self.rows, self.cols, self.small);
        Some(match &self.data {
            WeightData::Q8_0(w) => packed_job(w, r, c, small, q8, y),
            WeightData::K(w) => packed_job(w, r, c, small, q8, y),
            WeightData::Q4_0(w) => packed_job(w, r, c, small, q8, y),
            WeightData::Q5_0(w) => packed_job(w, r, c, small, q8, y),
            WeightData::Q4K(w) => packed_job(w, r, c, small, q8, y),
            WeightData::Q6K(w) => packed_job(w, r, c, small, q8, y),
            WeightData::Q8Pairs(w) => pairs_job(w, r, c, q8, y),
            WeightData::KPairs(w) => pairs_job(w, r, c, q8, y),
            _ => return None,
        })
    }
}

/// `ys[i] = x · wsᵢᵀ` for matrices that read the same `n × cols` input
/// (a layer's q, k and v; its gate and up): where each one's kernels read
/// Q8_0 activations, `x` is quantized once and every matrix's tasks run as
/// one parallel region, one wait on the pool instead of one a matrix. The
/// same bits as [`Matrix::matmul`] on each.
pub fn matmul_each(ws: &[&Matrix], x: &[f32], n: usize, ys: &mut [&mut [f32]]) {
    assert_eq!(ws.len(), ys.len(), "one output per matrix");
    let cols = ws.first().map_or(0, |w| w.cols);
    for (w, y) in ws.iter().zip(ys.iter()) {
        assert_eq!(w.cols, cols, "matmul_each: matrices of one input width");
        assert_eq!(x.len(), n * cols, "matmul input length");
        assert_eq!(y.len(), n * w.rows, "matmul output length");
    }
    if !ws.iter().all(|w| w.reads_q8()) {
        for (w, y) in ws.iter().zip(ys.iter_mut()) {
            w.matmul(x, n, y);
        }
        return;
    }
    let acts = Activations::quantize(x, n, cols);
    let xrows: Vec<Q8Row<'_>> = (0..n).map(|b| acts.row(b)).collect();
    let jobs: Vec<Job<'_>> = ws
        .iter()
        .zip(ys.iter_mut())
        .map(|(w, y)| w.q8_job((&acts, &xrows), y).expect("a Q8_0-input format"))
        .collect();
    // Task `t` overall: the job whose range holds it, and its task there.
    let mut starts = Vec::with_capacity(jobs.len());
    let mut total = 0;
    for j in &jobs {
        starts.push(total);
        total += j.tasks;
    }
    (0..total).into_par_iter().for_each(|t| {
        let i = starts.partition_point(|&s| s <= t) - 1;
        (jobs[i].run)(t - starts[i]);
    });
}

/// Activations quantized to Q8_0 and their rows, as the kernels read them.
type Q8Input<'a> = (&'a Activations, &'a [Q8Row<'a>]);

/// One product's parallel tasks: `run(t)` for `t` in `0..tasks` writes
/// disjoint output rows.
struct Job<'a> {
    tasks: usize,
    run: Box<dyn Fn(usize) + Sync + 'a>,
    /// The output the tasks write through a raw pointer, held as borrowed.
    _out: std::marker::PhantomData<&'a mut [f32]>,
}

/// Dequantizes row `r` of natively stored weights through its widened group
/// (`unpack(group, k)` writes row `k` of the group).
fn native_row<S: Stored>(w: &[S], cols: usize, r: usize, unpack: impl FnOnce(&[S::Wide], usize)) {
    let per_group = cols / S::COLS;
    S::with_wide(&w[r / 8 * per_group..(r / 8 + 1) * per_group], |g| {
        unpack(g, r % 8)
    });
}

/// Dequantizes row `r` of weights held sixteen rows at a time.
fn pair_row<P: Pair>(w: &[P], cols: usize, r: usize, out: &mut [f32]) {
    let bpr = cols / 32;
    P::row(
        &w[r / 16 * bpr..(r / 16 + 1) * bpr],
        r % 16,
        &mut out[..cols],
    );
}

/// Output rows per parallel task: enough work per task, several tasks per thread.
const ROWS_PER_TASK: usize = 32;

/// Raw output pointer shared by tasks that write disjoint elements.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint indices (distinct output rows `r`).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// Pointer to element `i`; a method so closures capture the whole wrapper.
    fn at(self, i: usize) -> *mut f32 {
        // SAFETY: callers pass indices inside the output slice.
        unsafe { self.0.add(i) }
    }
}

/// Writes `v[r][8 h + k]` to row `8 (g + h) + k` of output row `b0 + r`
/// (output rows of `rows` elements), the elements that exist. A whole
/// tile's row is one fixed-size store (a copy of `m` elements was a call to
/// `memmove` per row, 3.5% of a batch-32 decode step).
fn write_tile<const W: usize>(out: OutPtr, rows: usize, b0: usize, g: usize, v: &[[f32; W]]) {
    let m = W.min(rows - 8 * g);
    for (r, vr) in v.iter().enumerate() {
        let at = out.at((b0 + r) * rows + 8 * g);
        // SAFETY: callers pass `b0 + r` below the batch and `g` below the
        // groups, so the elements `at..at + m` are inside the output; only
        // the task owning groups `g..` writes them.
        unsafe {
            if m == W {
                *(at as *mut [f32; W]) = *vr;
            } else {
                std::slice::from_raw_parts_mut(at, m).copy_from_slice(&vr[..m]);
            }
        }
    }
}

fn float_row<E: Float>(w: &[E], out: &mut [f32]) {
    for (o, v) in out.iter_mut().zip(w) {
        *o = v.f32();
    }
}

/// Float weights, each row's elements widened to f32 as the dot products
/// read them, in tiles of up to four weight rows × four activation rows.
fn matmul_float<E: Float>(w: &[E], rows: usize, cols: usize, x: &[f32], n: usize, y: &mut [f32]) {
    let out = OutPtr(y.as_mut_ptr());
    let tasks = rows.div_ceil(ROWS_PER_TASK);
    (0..tasks).into_par_iter().for_each(|t| {
        // SAFETY: `b * rows + r < n * rows == y.len()`, and only the task
        // owning row `r` writes it.
        let put = |b: usize, r: usize, v: f32| unsafe { *out.at(b * rows + r) = v };
        let task_rows = t * ROWS_PER_TASK..((t + 1) * ROWS_PER_TASK).min(rows);
        for s0 in (0..n).step_by(X_SLICE) {
            let s1 = (s0 + X_SLICE).min(n);
            let mut r = task_rows.start;
            while r < task_rows.end {
                if r + 4 <= task_rows.end {
                    float_tiles::<E, 4>(w, x, cols, r, s0..s1, &put);
                    r += 4;
                } else {
                    float_tiles::<E, 1>(w, x, cols, r, s0..s1, &put);
                    r += 1;
                }
            }
        }
    });
}

/// Weight rows `r..r + WR` against the activation rows `bs`, four at a time
/// and then one.
fn float_tiles<E: Float, const WR: usize>(
    w: &[E],
    x: &[f32],
    cols: usize,
    r: usize,
    bs: std::ops::Range<usize>,
    put: &impl Fn(usize, usize, f32),
) {
    fn tile<E: Float, const WR: usize, const XR: usize>(
        w: &[E],
        x: &[f32],
        cols: usize,
        (r, b): (usize, usize),
        put: &impl Fn(usize, usize, f32),
    ) {
        let ws = std::array::from_fn(|k| &w[(r + k) * cols..(r + k + 1) * cols]);
        let xs = std::array::from_fn(|i| &x[(b + i) * cols..(b + i + 1) * cols]);
        for (k, v) in dots::<E, WR, XR>(ws, xs).iter().enumerate() {
            for (i, &v) in v.iter().enumerate() {
                put(b + i, r + k, v);
            }
        }
    }
    let mut b = bs.start;
    while b + 4 <= bs.end {
        tile::<E, WR, 4>(w, x, cols, (r, b), put);
        b += 4;
    }
    for b in b..bs.end {
        tile::<E, WR, 1>(w, x, cols, (r, b), put);
    }
}

/// Activation rows per tile of the generic quantized loop.
const ROW_TILE: usize = 8;

fn matmul_q<T: GgmlType>(w: &[T], rows: usize, cols: usize, x: &[f32], n: usize, y: &mut [f32]) {
    let bpr = cols / T::BLCK_SIZE;
    let xbpr = cols / T::VecDotType::BLCK_SIZE;
    // Quantize each activation row on its own; a row's quantization never
    // depends on the other rows.
    let mut xq: Vec<T::VecDotType> = (0..n * xbpr).map(|_| T::VecDotType::zeros()).collect();
    xq.par_chunks_mut(xbpr)
        .zip(x.par_chunks(cols))
        .for_each(|(q, r)| T::VecDotType::from_float(r, q));
    // ggml's quantization reads NaN as 0: a row holding a NaN or an infinity
    // gives NaN products instead, so the engine's check sees it.
    let finite: Vec<bool> = x
        .par_chunks(cols)
        .map(|r| r.iter().all(|v| v.is_finite()))
        .collect();
    let portable = candle_dot_portable();
    let out = OutPtr(y.as_mut_ptr());
    let tasks = rows.div_ceil(ROWS_PER_TASK);
    (0..tasks).into_par_iter().for_each(|t| {
        for tile in (0..n).step_by(ROW_TILE) {
            for r in t * ROWS_PER_TASK..((t + 1) * ROWS_PER_TASK).min(rows) {
                let wr = &w[r * bpr..(r + 1) * bpr];
                for b in tile..(tile + ROW_TILE).min(n) {
                    let xb = &xq[b * xbpr..(b + 1) * xbpr];
                    let v = if !finite[b] {
                        f32::NAN
                    } else if portable {
                        T::vec_dot_unopt(cols, wr, xb)
                    } else {
                        T::vec_dot(cols, wr, xb)
                    };
                    // SAFETY: as in `matmul_float`.
                    unsafe { *out.at(b * rows + r) = v };
                }
            }
        }
    });
}

/// Whether candle's products take its portable dot, asked once a product.
/// On aarch64 candle's NEON dot for Q5_K takes `sdot` whatever the CPU, and
/// a CPU without the dot-product extension (a Cortex-A72) stops on it with
/// SIGILL; there the portable dot runs instead.
fn candle_dot_portable() -> bool {
    #[cfg(target_arch = "aarch64")]
    if !std::arch::is_aarch64_feature_detected!("dotprod") {
        return true;
    }
    false
}

/// Activation rows per slice of the batch: a task's weights stay in cache
/// while a slice streams by.
const X_SLICE: usize = 64;

/// A kernel for a few activation rows at a time against one block of
/// weight rows (`W` of them).
trait Rows<const W: usize> {
    fn rows<const XR: usize>(&self, xs: &[Q8Row<'_>; XR]) -> [[f32; W]; XR];
    /// [`Rows::rows`] for the sixteen rows of a whole tile, `t` its blocks:
    /// the same bits.
    fn tile(&self, t: &[TileBlock], xs: &[Q8Row<'_>; 16]) -> [[f32; W]; 16] {
        let _ = t;
        self.rows(xs)
    }
}

/// One group of eight interleaved weight rows, and whether all its weights
/// are within ±16 ([`Packed::group_small`]).
struct Group<'a, S>(&'a [S], bool);

impl<S: Packed> Rows<8> for Group<'_, S> {
    fn rows<const XR: usize>(&self, xs: &[Q8Row<'_>; XR]) -> [[f32; 8]; XR] {
        if self.1 {
            S::group_small(self.0, xs)
        } else {
            S::group(self.0, xs)
        }
    }
    fn tile(&self, t: &[TileBlock], xs: &[Q8Row<'_>; 16]) -> [[f32; 8]; 16] {
        S::tile_group(self.0, t, xs)
    }
}

/// One pair of groups, sixteen rows.
struct Pairs<'a, P>(&'a [P]);

impl<P: Pair> Rows<16> for Pairs<'_, P> {
    fn rows<const XR: usize>(&self, xs: &[Q8Row<'_>; XR]) -> [[f32; 16]; XR] {
        P::group(self.0, xs)
    }
    fn tile(&self, t: &[TileBlock], xs: &[Q8Row<'_>; 16]) -> [[f32; 16]; 16] {
        P::tile(self.0, t, xs)
    }
}

/// Activation rows `b..s1` of `acts` against one block of weight rows:
/// sixteen at a time (from their whole tile where the rows carry one), then
/// eight, four, and one at a time; `put(b0, v)` takes rows `b0..`. Sixteen
/// rows a call read each weight block once for a batch of sixteen, where
/// two calls of eight read it twice, the first from memory (batch 16 decode
/// measured 1.17× with AVX-512 VNNI; the AVX2 kernels, short of registers
/// for sixteen rows, measured no slower).
fn in_tiles<const W: usize>(
    k: &impl Rows<W>,
    (acts, xrows): (&Activations, &[Q8Row<'_>]),
    mut b: usize,
    s1: usize,
    put: impl Fn(usize, &[[f32; W]]),
) {
    // The rows are borrowed in place, not copied per call.
    fn rows_at<'a, 'x, const XR: usize>(xrows: &'a [Q8Row<'x>], b: usize) -> &'a [Q8Row<'x>; XR] {
        xrows[b..b + XR].try_into().expect("XR rows")
    }
    while b + 16 <= s1 {
        let xs = rows_at::<16>(xrows, b);
        match acts.whole_tile(b) {
            Some(t) => put(b, &k.tile(t, xs)),
            None => put(b, &k.rows(xs)),
        }
        b += 16;
    }
    if b + 8 <= s1 {
        put(b, &k.rows(rows_at::<8>(xrows, b)));
        b += 8;
    }
    if b + 4 <= s1 {
        put(b, &k.rows(rows_at::<4>(xrows, b)));
        b += 4;
    }
    while b < s1 {
        put(b, &k.rows(rows_at::<1>(xrows, b)));
        b += 1;
    }
}

/// Packed weights: each group of eight weight rows is widened once per
/// product, and each widened block is loaded once for sixteen activation
/// rows (then eight, four, one at a time for the rest of a slice); on
/// AMX, whole tiles of sixteen rows go to the tiles, the groups paired once
/// per product.
fn packed_job<'a, S: Stored>(
    w: &'a [S],
    rows: usize,
    cols: usize,
    small: bool,
    (acts, xrows): Q8Input<'a>,
    y: &'a mut [f32],
) -> Job<'a>
where
    S::Wide: Paired,
    <S::Wide as Paired>::Pair: Tiled,
{
    let (bpr, wbpr, n) = (cols / S::COLS, cols / 32, xrows.len());
    let out = OutPtr(y.as_mut_ptr());
    let groups = rows.div_ceil(8);
    let per_task = ROWS_PER_TASK / 8;
    let amx = n >= 16 && crate::cpu::amx_tiles();
    let small = small && crate::cpu::short_path();
    Job {
        tasks: groups.div_ceil(per_task),
        run: Box::new(move |t| {
            let task_groups = t * per_task..((t + 1) * per_task).min(groups);
            // Widen one group at a time while one slice covers the batch (its
            // blocks then stay in L1), else the task's groups once for all
            // its slices; on AMX the task's groups at once from sixteen rows.
            let span = if n > X_SLICE || amx { per_task } else { 1 };
            for c0 in task_groups.clone().step_by(span) {
                let c1 = (c0 + span).min(task_groups.end);
                S::with_wide(&w[c0 * bpr..c1 * bpr], |wide| {
                    let done = if amx {
                        <S::Wide as Paired>::Pair::buffer().with_borrow_mut(|p| {
                            let need = pairs_of(c1 - c0) * wbpr;
                            if p.len() < need {
                                p.resize(need, Pair::ZERO);
                            }
                            let p = &mut p[..need];
                            pair_up(wide, wbpr, p);
                            tiles_amx(p, wbpr, acts, 0..n, X_SLICE, |b, q, v| {
                                write_tile(out, rows, b, c0 + 2 * q, v)
                            })
                        })
                    } else {
                        0
                    };
                    for s0 in (0..n).step_by(X_SLICE) {
                        let s1 = (s0 + X_SLICE).min(n);
                        for g in c0..c1 {
                            let wg = Group(&wide[(g - c0) * wbpr..(g - c0 + 1) * wbpr], small);
                            in_tiles(&wg, (acts, xrows), s0.max(done), s1, |b, v| {
                                write_tile(out, rows, b, g, v)
                            });
                        }
                    }
                });
            }
        }),
        _out: std::marker::PhantomData,
    }
}

/// Weights held sixteen rows at a time ([`crate::pair`]): on AMX whole tiles
/// of sixteen activation rows go to the tiles straight from the weights;
/// the rest, or every row without AMX, to the pair kernels.
fn pairs_job<'a, P: Pair + Tiled>(
    w: &'a [P],
    rows: usize,
    cols: usize,
    (acts, xrows): Q8Input<'a>,
    y: &'a mut [f32],
) -> Job<'a> {
    let (bpr, n) = (cols / 32, xrows.len());
    let out = OutPtr(y.as_mut_ptr());
    let pairs = rows.div_ceil(16);
    let per_task = ROWS_PER_TASK / 16;
    Job {
        tasks: pairs.div_ceil(per_task),
        run: Box::new(move |t| {
            let task = t * per_task..((t + 1) * per_task).min(pairs);
            let wt = &w[task.start * bpr..task.end * bpr];
            let done = tiles_amx(wt, bpr, acts, 0..n, X_SLICE, |b, q, v| {
                write_tile(out, rows, b, 2 * (task.start + q), v)
            });
            for s0 in (0..n).step_by(X_SLICE) {
                let s1 = (s0 + X_SLICE).min(n);
                for q in task.clone() {
                    let wq = Pairs(&w[q * bpr..(q + 1) * bpr]);
                    in_tiles(&wq, (acts, xrows), s0.max(done), s1, |b, v| {
                        write_tile(out, rows, b, 2 * q, v)
                    });
                }
            }
        }),
        _out: std::marker::PhantomData,
    }
}

/// On AMX, the whole tiles of sixteen rows of `rows` (which starts at a
/// multiple of sixteen) against each pair in `pairs` (pairs of `bpr`
/// blocks), `slice` rows at a time for every pair: `out(b, q, v)` takes rows
/// `b..b + 16` of pair `q` (`v[r][j]`: its row `j`), the same bits as
/// [`Pair::group`]. Returns the end of the rows done: `rows.start` where the
/// CPU has no AMX tiles or the rows fill no tile.
fn tiles_amx<P: Pair + Tiled>(
    pairs: &[P],
    bpr: usize,
    acts: &Activations,
    rows: std::ops::Range<usize>,
    slice: usize,
    out: impl FnMut(usize, usize, &[[f32; 16]; 16]),
) -> usize {
    #[cfg(target_arch = "x86_64")]
    // Activations quantized while the tiles were off carry no tile data;
    // the vector kernels then take them (the same bits).
    if crate::cpu::amx_tiles() && rows.len() >= 16 && !pairs.is_empty() && acts.has_tiles() {
        assert!(
            acts.covers(bpr, rows.end) && rows.start.is_multiple_of(16) && slice.is_multiple_of(16),
            "whole tiles of activation rows covering the weights"
        );
        return crate::amx::products(pairs, bpr, |b| acts.tile(b, bpr), rows, slice, out);
    }
    let _ = (pairs, bpr, acts, slice, out);
    rows.start
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batched_rows_equal_single_rows() {
        let (rows, cols) = (70, 64);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919) % 97) as f32 / 97.0 - 0.5)
            .collect();
        let m = Matrix::from_f32(rows, cols, w).unwrap();
        let x: Vec<f32> = (0..5 * cols)
            .map(|i| ((i * 31) % 13) as f32 / 13.0 - 0.5)
            .collect();
        let mut y = vec![0f32; 5 * rows];
        m.matmul(&x, 5, &mut y);
        for b in 0..5 {
            let mut y1 = vec![0f32; rows];
            m.matmul(&x[b * cols..(b + 1) * cols], 1, &mut y1);
            assert_eq!(y1, y[b * rows..(b + 1) * rows]);
        }
    }

    #[test]
    fn half_precision_weights_equal_their_f32_widening() {
        let (rows, cols, n) = (37, 200, 5);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919) % 97) as f32 / 37.0 - 1.3)
            .collect();
        let x: Vec<f32> = (0..n * cols)
            .map(|i| ((i * 31) % 13) as f32 / 13.0 - 0.5)
            .collect();
        let bf: Vec<u16> = w
            .iter()
            .map(|v| half::bf16::from_f32(*v).to_bits())
            .collect();
        let hf: Vec<u16> = w
            .iter()
            .map(|v| half::f16::from_f32(*v).to_bits())
            .collect();
        for (name, m) in [
            ("bf16", Matrix::from_bf16(rows, cols, bf).unwrap()),
            ("f16", Matrix::from_f16(rows, cols, hf).unwrap()),
        ] {
            assert_eq!(m.bytes(), rows * cols * 2, "{name} keeps 16 bits a weight");
            let wide = Matrix::from_f32(rows, cols, m.to_f32()).unwrap();
            let (mut a, mut b) = (vec![0f32; n * rows], vec![0f32; n * rows]);
            m.matmul(&x, n, &mut a);
            wide.matmul(&x, n, &mut b);
            assert_eq!(a, b, "{name}: widened in registers vs at load");
        }
        assert!(Matrix::from_bf16(rows, cols, vec![0; 3]).is_err());

        // Quantized at load: ggml's Q8_0 of the same values, packed.
        let cols = 192;
        let w = &w[..rows * cols];
        let bf: Vec<u16> = w
            .iter()
            .map(|v| half::bf16::from_f32(*v).to_bits())
            .collect();
        let m = Matrix::from_bf16(rows, cols, bf).unwrap();
        let f = m.to_f32();
        let q = m.to_q8_0().unwrap();
        let want = Matrix::quantize(GgmlDType::Q8_0, rows, cols, &f).unwrap();
        assert_eq!((q.type_name(), q.to_f32()), ("Q8_0", want.to_f32()));
    }

    /// A product reading a Q8_0 block that holds a NaN is NaN, not the
    /// value taken as 0.
    #[test]
    fn a_non_finite_activation_block_makes_its_products_nan() {
        let cols = 64;
        let w: Vec<f32> = (0..8 * cols).map(|i| (i % 7) as f32 - 3.0).collect();
        let m = Matrix::quantize(GgmlDType::Q8_0, 8, cols, &w).unwrap();
        let mut x: Vec<f32> = (0..2 * cols).map(|i| (i % 5) as f32).collect();
        x[cols + 40] = f32::NAN;
        let mut y = vec![0f32; 16];
        m.matmul(&x, 2, &mut y);
        assert!(y[..8].iter().all(|v| v.is_finite()), "{y:?}");
        assert!(y[8..].iter().all(|v| v.is_nan()), "{y:?}");
    }

    #[test]
    fn products_of_one_input_together_equal_each_alone() {
        // A layer's q, k, v (or gate, up): matrices of different heights,
        // formats and layouts that read one input, in one parallel region;
        // and with a float matrix among them, each on its own.
        let cols = 256;
        let mats = |dts: &[(GgmlDType, usize)]| -> Vec<Matrix> {
            dts.iter()
                .enumerate()
                .map(|(i, &(dt, rows))| {
                    let w: Vec<f32> = (0..rows * cols)
                        .map(|j| ((j * 7919 + i * 13) % 101) as f32 / 101.0 - 0.5)
                        .collect();
                    let m = Matrix::quantize(dt, rows, cols, &w).unwrap();
                    match i % 3 {
                        0 => m,
                        1 => m.widen(),
                        _ => m.widen().paired(),
                    }
                })
                .collect()
        };
        let q8 = mats(&[
            (GgmlDType::Q5_0, 96),
            (GgmlDType::Q6K, 40),
            (GgmlDType::Q4K, 41),
            (GgmlDType::Q8_0, 200),
        ]);
        let mut mixed = mats(&[(GgmlDType::Q5_0, 96), (GgmlDType::Q6K, 40)]);
        let wf: Vec<f32> = (0..24 * cols).map(|j| (j % 9) as f32 / 9.0 - 0.5).collect();
        mixed.push(Matrix::from_f32(24, cols, wf).unwrap());
        for ms in [&q8, &mixed] {
            for n in [1, 5, 20, 150] {
                let x: Vec<f32> = (0..n * cols)
                    .map(|i| ((i * 31) % 17) as f32 / 17.0 - 0.5)
                    .collect();
                let ws: Vec<&Matrix> = ms.iter().collect();
                let mut ys: Vec<Vec<f32>> = ms.iter().map(|m| vec![0f32; n * m.rows()]).collect();
                let mut outs: Vec<&mut [f32]> = ys.iter_mut().map(|y| y.as_mut_slice()).collect();
                matmul_each(&ws, &x, n, &mut outs);
                for (m, y) in ms.iter().zip(&ys) {
                    let mut alone = vec![0f32; n * m.rows()];
                    m.matmul(&x, n, &mut alone);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(y), bits(&alone), "{} at {n} rows", m.type_name());
                }
            }
        }
    }

    #[test]
    fn quantized_batches_equal_single_rows() {
        // Row and batch counts that reach every path: tiles of 16, 8 and 4,
        // their leftovers, single rows, batches of several slices, AMX tiles
        // of two groups × sixteen rows with an odd group paired with an
        // empty one (on CPUs with AMX; turned off, the vector kernels take
        // the same batches), and weights held sixteen rows at a time.
        for (rows, n) in [(40, 7), (41, 13), (42, 20), (43, 150)] {
            let cols = 512;
            let w: Vec<f32> = (0..rows * cols)
                .map(|i| ((i * 7919) % 101) as f32 / 101.0 - 0.5)
                .collect();
            let x: Vec<f32> = (0..n * cols)
                .map(|i| ((i * 31) % 17) as f32 / 17.0 - 0.5)
                .collect();
            for dt in [
                GgmlDType::Q4_0,
                GgmlDType::Q5_0,
                GgmlDType::Q8_0,
                GgmlDType::Q4K,
                GgmlDType::Q6K,
            ] {
                let m = Matrix::quantize(dt, rows, cols, &w).unwrap();
                let mut y = vec![0f32; n * rows];
                m.matmul(&x, n, &mut y);
                let wide = Matrix::quantize(dt, rows, cols, &w).unwrap().widen();
                let mut yw = vec![0f32; n * rows];
                wide.matmul(&x, n, &mut yw);
                assert_eq!(y, yw, "{dt:?}: file bits vs widened at load");
                let paired = Matrix::quantize(dt, rows, cols, &w)
                    .unwrap()
                    .widen()
                    .paired();
                assert!(paired.type_name().contains("16-row tiles"), "{dt:?}");
                let mut yp = vec![0f32; n * rows];
                paired.matmul(&x, n, &mut yp);
                assert_eq!(y, yp, "{dt:?}: file bits vs sixteen rows at a time");
                #[cfg(target_arch = "x86_64")]
                {
                    crate::cpu::set_amx_tiles(false);
                    let mut yv = vec![0f32; n * rows];
                    m.matmul(&x, n, &mut yv);
                    let mut ypv = vec![0f32; n * rows];
                    paired.matmul(&x, n, &mut ypv);
                    crate::cpu::set_amx_tiles(true);
                    assert_eq!(y, yv, "{dt:?}: AMX tiles vs vector kernels");
                    assert_eq!(y, ypv, "{dt:?}: pairs without AMX tiles");
                }
                assert_eq!(m.to_f32(), wide.to_f32(), "{dt:?}: rows as read");
                assert_eq!(m.to_f32(), paired.to_f32(), "{dt:?}: paired rows as read");
                for b in 0..n {
                    let mut y1 = vec![0f32; rows];
                    m.matmul(&x[b * cols..(b + 1) * cols], 1, &mut y1);
                    assert_eq!(
                        y1,
                        y[b * rows..(b + 1) * rows],
                        "{dt:?} rows {rows} batch {n}"
                    );
                }
            }
        }
    }

    /// Every product assigns each of its outputs, whatever they held: the
    /// engine hands products spare buffers holding an earlier product's
    /// values. Outputs start as NaN here; a value left unwritten would stay
    /// NaN and differ from the product into zeros.
    #[test]
    fn products_write_every_output() {
        let (rows, cols) = (41, 256);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919) % 101) as f32 / 101.0 - 0.5)
            .collect();
        let bf16: Vec<u16> = w
            .iter()
            .map(|&v| half::bf16::from_f32(v).to_bits())
            .collect();
        let f16: Vec<u16> = w
            .iter()
            .map(|&v| half::f16::from_f32(v).to_bits())
            .collect();
        let mut mats = vec![
            Matrix::from_f32(rows, cols, w.clone()).unwrap(),
            Matrix::from_bf16(rows, cols, bf16).unwrap(),
            Matrix::from_f16(rows, cols, f16).unwrap(),
        ];
        for dt in [
            GgmlDType::Q4_0,
            GgmlDType::Q5_0,
            GgmlDType::Q8_0,
            GgmlDType::Q4K,
            GgmlDType::Q6K,
        ] {
            mats.push(Matrix::quantize(dt, rows, cols, &w).unwrap());
            mats.push(Matrix::quantize(dt, rows, cols, &w).unwrap().widen());
            mats.push(
                Matrix::quantize(dt, rows, cols, &w)
                    .unwrap()
                    .widen()
                    .paired(),
            );
        }
        // The formats products read unquantized activations for, from a
        // file's bytes.
        fn ggml<T: GgmlType>(dt: GgmlDType, rows: usize, cols: usize, w: &[f32]) -> Matrix {
            let mut b: Vec<T> = (0..w.len() / T::BLCK_SIZE).map(|_| T::zeros()).collect();
            T::from_float(w, &mut b);
            // SAFETY: GGML blocks are plain bytes and halves, with no padding.
            let bytes = unsafe {
                std::slice::from_raw_parts(b.as_ptr() as *const u8, std::mem::size_of_val(&b[..]))
            };
            Matrix::from_ggml(dt, rows, cols, bytes).unwrap()
        }
        mats.push(ggml::<BlockQ4_1>(GgmlDType::Q4_1, rows, cols, &w));
        mats.push(ggml::<BlockQ5_1>(GgmlDType::Q5_1, rows, cols, &w));
        mats.push(ggml::<BlockQ5K>(GgmlDType::Q5K, rows, cols, &w));
        for m in &mats {
            for n in [1, 4, 7, 16, 20, 70] {
                let x: Vec<f32> = (0..n * cols)
                    .map(|i| ((i * 31) % 17) as f32 / 17.0 - 0.5)
                    .collect();
                let mut zeros = vec![0f32; n * rows];
                m.matmul(&x, n, &mut zeros);
                let mut nans = vec![f32::NAN; n * rows];
                m.matmul(&x, n, &mut nans);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&zeros), bits(&nans), "{} batch {n}", m.type_name());
                let mut each = [vec![f32::NAN; n * rows], vec![f32::NAN; n * rows]];
                let [a, b] = &mut each;
                matmul_each(&[m, m], &x, n, &mut [a.as_mut_slice(), b.as_mut_slice()]);
                assert_eq!(
                    bits(&zeros),
                    bits(a),
                    "{} together, batch {n}",
                    m.type_name()
                );
                assert_eq!(
                    bits(&zeros),
                    bits(b),
                    "{} together, batch {n}",
                    m.type_name()
                );
            }
        }
    }
}
