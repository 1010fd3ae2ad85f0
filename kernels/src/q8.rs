//! Q8_0 weights × Q8_0 activations, eight weight rows interleaved.
//!
//! Weights are stored eight rows at a time: per block of 32 columns, the eight rows' scales and their
//! values shifted to unsigned (`q + 128`), interleaved four bytes at a time.
//! One `vpdpbusd` of a register of weights with a broadcast 4-byte group of an
//! activation row then advances eight dot products, and each weight block is
//! loaded once for all the activation rows of a tile.
//!
//! Per output element the arithmetic is fixed: the exact integer dot product
//! of each block, then `acc = fma(dw · dx, s, acc)` block by block in column
//! order. The VNNI, AVX2, NEON and scalar paths compute the same integers and
//! the same f32 operations, so a result never depends on the batch, the tiling
//! or the CPU.

use candle_core::quantized::k_quants::BlockQ8_0;
use half::f16;
use rayon::prelude::*;

use crate::cpu::amx_tiles;
#[cfg(target_arch = "x86_64")]
use crate::cpu::{simd_level, Simd};

/// Byte layout of a Q8_0 block.
#[repr(C)]
#[derive(Clone, Copy)]
struct RawQ8 {
    d: f16,
    qs: [i8; 32],
}

const _: () = assert!(std::mem::size_of::<RawQ8>() == std::mem::size_of::<BlockQ8_0>());

fn raw8(b: &[BlockQ8_0]) -> &[RawQ8] {
    // SAFETY: identical `repr(C)` layouts of plain data (size checked above).
    unsafe { std::slice::from_raw_parts(b.as_ptr() as *const RawQ8, b.len()) }
}

/// Q8_0 blocks as (scale, values).
pub struct Q8Blocks(Vec<RawQ8>);

impl Q8Blocks {
    /// Q8_0 blocks as they are.
    pub fn from_q8_0(xs: &[BlockQ8_0]) -> Self {
        Q8Blocks(raw8(xs).to_vec())
    }

    /// Dequantizes (the ggml formula `q · d`); the tests' reference.
    #[cfg(test)]
    fn to_f32(&self, out: &mut [f32]) {
        for (b, o) in self.0.iter().zip(out.chunks_exact_mut(32)) {
            let d = b.d.to_f32();
            for (v, q) in o.iter_mut().zip(b.qs) {
                *v = q as f32 * d;
            }
        }
    }
}

/// Eight weight rows × one block of 32 columns.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Q8x8 {
    /// Scales of the eight rows.
    pub d: [f16; 8],
    /// `qs[32 g + 4 k + e]` is row `k`, column `4 g + e`, plus 128.
    pub qs: [u8; 256],
}

/// Position of row `k`, column `c` of a block in the interleaved layout.
pub(crate) fn slot(k: usize, c: usize) -> usize {
    32 * (c / 4) + 4 * k + c % 4
}

/// Interleaves `rows` rows of `bpr` blocks eight at a time, ordered group by
/// group, block by block: `fill(p, k, j)` copies source block `j` (row-major)
/// into row `k` of `p`; missing rows of the last group stay as in `empty`.
pub(crate) fn interleave<P: Copy>(
    rows: usize,
    bpr: usize,
    empty: P,
    mut fill: impl FnMut(&mut P, usize, usize),
) -> Vec<P> {
    let mut out = Vec::with_capacity(rows.div_ceil(8) * bpr);
    for g in 0..rows.div_ceil(8) {
        for i in 0..bpr {
            let mut p = empty;
            for k in 0..8.min(rows - 8 * g) {
                fill(&mut p, k, (8 * g + k) * bpr + i);
            }
            out.push(p);
        }
    }
    out
}

/// Writes one row's 32 values into a packed block, shifted to unsigned.
pub(crate) fn put_row(qs: &mut [u8; 256], k: usize, src: &[i8; 32]) {
    for (c, &v) in src.iter().enumerate() {
        qs[slot(k, c)] = (v as u8) ^ 0x80;
    }
}

/// Interleaves Q8_0 rows of `bpr` blocks eight at a time (missing rows of the
/// last group are zero).
pub fn pack_q8(blocks: &Q8Blocks, rows: usize, bpr: usize) -> Vec<Q8x8> {
    let b = &blocks.0;
    assert_eq!(b.len(), rows * bpr, "Q8_0 blocks for {rows} rows of {bpr}");
    let empty = Q8x8 {
        d: [f16::ZERO; 8],
        qs: [128; 256],
    };
    interleave(rows, bpr, empty, |p, k, j| {
        p.d[k] = b[j].d;
        put_row(&mut p.qs, k, &b[j].qs);
    })
}

/// Dequantizes row `r` of packed weights (the ggml formula `q · d`).
pub fn unpack_q8_row(w: &[Q8x8], bpr: usize, r: usize, out: &mut [f32]) {
    let (g, k) = (r / 8, r % 8);
    for (b, o) in w[g * bpr..(g + 1) * bpr]
        .iter()
        .zip(out.chunks_exact_mut(32))
    {
        let d = b.d[k].to_f32();
        for (c, v) in o.iter_mut().enumerate() {
            *v = ((b.qs[slot(k, c)] ^ 0x80) as i8) as f32 * d;
        }
    }
}

/// A batch of activation rows quantized to Q8_0 (ggml's rounding), with
/// the per-block data the kernels need.
pub struct Activations {
    bpr: usize,
    qs: Vec<[i8; 32]>,
    scales: Vec<f32>,
    starts: Vec<[i32; 2]>,
    sx: Vec<f32>,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    tiles: Vec<TileBlock>,
}

/// The storage of quantized activations. Dropped activations hand theirs
/// to the next quantization, which overwrites every element it keeps: no
/// clearing, and no fresh pages to fault in (a new set for each product
/// was a fifth of the time of quantizing 512 rows of 4,864 values).
#[derive(Default)]
struct Buffers {
    qs: Vec<[i8; 32]>,
    scales: Vec<f32>,
    starts: Vec<[i32; 2]>,
    sx: Vec<f32>,
    tiles: Vec<TileBlock>,
}

/// Buffers kept for reuse: a product holds one set at a time, a forward
/// pass a few, so a few are kept, up to a bound on their memory.
static SPARE: std::sync::Mutex<Vec<Buffers>> = std::sync::Mutex::new(Vec::new());
const SPARE_SETS: usize = 4;
const SPARE_BYTES: usize = 256 << 20;

impl Buffers {
    /// A set with `blocks` blocks of rows and `tiles` tile blocks, its
    /// contents stale.
    fn take(blocks: usize, tiles: usize) -> Self {
        let mut b = SPARE
            .lock()
            .map(|mut s| s.pop())
            .ok()
            .flatten()
            .unwrap_or_default();
        fit(&mut b.qs, blocks, [0; 32]);
        fit(&mut b.scales, blocks, 0.0);
        fit(&mut b.starts, blocks, [0; 2]);
        fit(&mut b.sx, blocks, 0.0);
        fit(&mut b.tiles, tiles, TileBlock::ZERO);
        b
    }

    /// The memory the set holds.
    fn bytes(&self) -> usize {
        fn of<T>(v: &Vec<T>) -> usize {
            v.capacity() * std::mem::size_of::<T>()
        }
        of(&self.qs) + of(&self.scales) + of(&self.starts) + of(&self.sx) + of(&self.tiles)
    }
}

/// `v` at length `len`, keeping the values it had (all overwritten later).
fn fit<T: Copy>(v: &mut Vec<T>, len: usize, fill: T) {
    if v.len() >= len {
        v.truncate(len)
    } else {
        v.resize(len, fill)
    }
}

impl Drop for Activations {
    fn drop(&mut self) {
        let b = Buffers {
            qs: std::mem::take(&mut self.qs),
            scales: std::mem::take(&mut self.scales),
            starts: std::mem::take(&mut self.starts),
            sx: std::mem::take(&mut self.sx),
            tiles: std::mem::take(&mut self.tiles),
        };
        if let Ok(mut spare) = SPARE.lock() {
            let held: usize = spare.iter().map(Buffers::bytes).sum();
            if spare.len() < SPARE_SETS && held + b.bytes() <= SPARE_BYTES {
                spare.push(b);
            }
        }
    }
}

/// For one tile of sixteen activation rows and one block, row `r` in lane
/// `r`: what the AMX kernels broadcast per row (the scale and `Σx` as f32),
/// and for the VNNI kernels of whole tiles the rows' values with their
/// sums' starts. One block of a tile is then a few lines at one address,
/// not sixteen rows' pointers (which left the kernels short of registers).
#[repr(C, align(64))]
#[derive(Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub struct TileBlock {
    pub(crate) dx: [f32; 16],
    pub(crate) sx: [f32; 16],
    /// The rows' values.
    pub(crate) qs: [[i8; 32]; 16],
    /// [`Q8Row::starts`] of the two halves of the block, added: where the
    /// Q8 kernels' one chain per block starts.
    pub(crate) start: [i32; 16],
    /// [`Q8Row::starts`], half by half: the K-quant kernels scale the halves
    /// apart.
    pub(crate) halves: [[i32; 16]; 2],
}

impl TileBlock {
    const ZERO: Self = TileBlock {
        dx: [0.0; 16],
        sx: [0.0; 16],
        qs: [[0; 32]; 16],
        start: [0; 16],
        halves: [[0; 16]; 2],
    };
}

/// Sixteen activation rows as the AMX kernels read them: block values row
/// after row (`stride` bytes apart), and per block the values broadcast per
/// row.
#[cfg(target_arch = "x86_64")]
pub struct Tile<'a> {
    pub(crate) qs: &'a [[i8; 32]],
    pub(crate) stride: usize,
    pub(crate) blocks: &'a [TileBlock],
}

/// One quantized activation row.
#[derive(Clone, Copy)]
pub struct Q8Row<'a> {
    /// Values of each block.
    pub qs: &'a [[i8; 32]],
    /// Scale of each block, as f32.
    pub scales: &'a [f32],
    /// Per block, `-128 ·` the sums of its values over columns 0..16 and
    /// 16..32: where `vpdpbusd`'s sums with weights shifted to unsigned
    /// start, so that they end at the signed products (made once per row,
    /// not once per weight group).
    pub starts: &'a [[i32; 2]],
    /// Per block, the sum of its values as f32 (exact: at most 32 · 127).
    pub sx: &'a [f32],
}

impl Q8Row<'_> {
    /// Whether the row has at least `n` blocks.
    pub fn covers(&self, n: usize) -> bool {
        self.qs.len() >= n && self.scales.len() >= n && self.starts.len() >= n && self.sx.len() >= n
    }
}

impl Activations {
    /// Quantizes `n` rows of `cols` values, each row on its own (a row's
    /// quantization never depends on the other rows).
    pub fn quantize(x: &[f32], n: usize, cols: usize) -> Self {
        assert!(cols.is_multiple_of(32) && x.len() == n * cols);
        let bpr = cols / 32;
        // The rows as whole tiles read them where the AMX or VNNI kernels
        // of whole tiles run: made with their rows, while those are in
        // cache (not on first use, so no task waits on another for them).
        let whole = if n >= 16 && sixteen_row_kernels() {
            n / 16
        } else {
            0
        };
        let Buffers {
            mut qs,
            mut scales,
            mut starts,
            mut sx,
            mut tiles,
        } = Buffers::take(n * bpr, whole * bpr);
        let c = bpr.max(1);
        let split = 16 * whole * bpr;
        let (tq, rq) = qs.split_at_mut(split);
        let (ts, rs) = scales.split_at_mut(split);
        let (tst, rst) = starts.split_at_mut(split);
        let (tsx, rsx) = sx.split_at_mut(split);
        let (tx, rx) = x.split_at(16 * whole * cols);
        tq.par_chunks_mut(16 * c)
            .zip(ts.par_chunks_mut(16 * c))
            .zip(tst.par_chunks_mut(16 * c).zip(tsx.par_chunks_mut(16 * c)))
            .zip(tx.par_chunks(16 * cols.max(1)).zip(tiles.par_chunks_mut(c)))
            .for_each(|(((q, s), (st, sx)), (rows, blocks))| {
                for r in 0..16 {
                    let at = r * bpr..(r + 1) * bpr;
                    let out = RowMut {
                        qs: &mut q[at.clone()],
                        scales: &mut s[at.clone()],
                        starts: &mut st[at.clone()],
                        sx: &mut sx[at],
                        tile: Some((&mut *blocks, r)),
                    };
                    quantize_row(&rows[r * cols..(r + 1) * cols], out);
                }
            });
        rq.par_chunks_mut(c)
            .zip(rs.par_chunks_mut(c))
            .zip(rst.par_chunks_mut(c).zip(rsx.par_chunks_mut(c)))
            .zip(rx.par_chunks(cols.max(1)))
            .for_each(|(((qs, scales), (starts, sx)), row)| {
                quantize_row(
                    row,
                    RowMut {
                        qs,
                        scales,
                        starts,
                        sx,
                        tile: None,
                    },
                )
            });
        Activations {
            bpr,
            qs,
            scales,
            starts,
            sx,
            tiles,
        }
    }

    /// Row `b`.
    pub fn row(&self, b: usize) -> Q8Row<'_> {
        let r = b * self.bpr..(b + 1) * self.bpr;
        Q8Row {
            qs: &self.qs[r.clone()],
            scales: &self.scales[r.clone()],
            starts: &self.starts[r.clone()],
            sx: &self.sx[r],
        }
    }

    /// Whether the rows carry tile data: quantized while the AMX tiles ran
    /// (otherwise the vector kernels take them, the same bits).
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn has_tiles(&self) -> bool {
        !self.tiles.is_empty()
    }

    /// Whether the rows `..end` are there, each covering `bpr` blocks.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn covers(&self, bpr: usize, end: usize) -> bool {
        bpr <= self.bpr && end * self.bpr <= self.scales.len()
    }

    /// The blocks of the whole tile of rows `b..b + 16`, where `b` is a
    /// multiple of sixteen and the rows carry tile data.
    pub(crate) fn whole_tile(&self, b: usize) -> Option<&[TileBlock]> {
        let t = b / 16;
        if !b.is_multiple_of(16) || (t + 1) * self.bpr > self.tiles.len() {
            return None;
        }
        Some(&self.tiles[t * self.bpr..(t + 1) * self.bpr])
    }

    /// Rows `b..b + 16` (`b` a multiple of sixteen) over their first `bpr`
    /// blocks, as the AMX kernels read them.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn tile(&self, b: usize, bpr: usize) -> Tile<'_> {
        let t = b / 16;
        Tile {
            qs: &self.qs[b * self.bpr..],
            stride: 32 * self.bpr,
            blocks: &self.tiles[t * self.bpr..(t + 1) * self.bpr][..bpr],
        }
    }
}

/// The sums of a block's values over columns 0..16 and 16..32. On x86-64
/// by `psadbw` of the values made unsigned (the compiler's own sum took
/// the bytes out one at a time, 6% of a prefill).
fn half_sums(qs: &[i8; 32]) -> [i32; 2] {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        // SAFETY: SSE2 is part of x86-64; the loads are inside `qs`.
        unsafe {
            let flip = _mm_set1_epi8(i8::MIN);
            let sum = |p: *const i8| {
                let v = _mm_xor_si128(_mm_loadu_si128(p as *const __m128i), flip);
                let s = _mm_sad_epu8(v, _mm_setzero_si128());
                _mm_cvtsi128_si32(s) + _mm_extract_epi16::<4>(s) - 16 * 128
            };
            [sum(qs.as_ptr()), sum(qs.as_ptr().add(16))]
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    [&qs[..16], &qs[16..]].map(|h| h.iter().map(|&v| v as i32).sum())
}

/// Whether kernels read whole tiles of sixteen activation rows: AMX, or
/// the VNNI group kernels.
fn sixteen_row_kernels() -> bool {
    #[cfg(target_arch = "x86_64")]
    if simd_level() == Simd::Vnni {
        return true;
    }
    amx_tiles()
}

/// One activation row's quantized blocks and their per-block data, and
/// where the row is row `r` of a whole tile, that tile's blocks.
struct RowMut<'a> {
    qs: &'a mut [[i8; 32]],
    scales: &'a mut [f32],
    starts: &'a mut [[i32; 2]],
    sx: &'a mut [f32],
    tile: Option<(&'a mut [TileBlock], usize)>,
}

/// Quantizes one row block by block, with each block's scale as f32, the
/// starts of its halves' sums and `Σx`.
fn quantize_row(x: &[f32], mut out: RowMut<'_>) {
    #[cfg(target_arch = "x86_64")]
    if simd_level() == Simd::Vnni {
        // SAFETY: the VNNI level implies AVX-512F, BW and VL, and F16C.
        return unsafe { quantize_row_avx512(x, out) };
    }
    for (i, xb) in x.chunks_exact(32).enumerate() {
        let (d, qs) = quantize_block(xb);
        block_data(i, d.to_f32(), qs, half_sums(&qs), &mut out);
    }
}

/// Stores block `i` of a row: its values, scale and sums, in the row and
/// in its tile's block.
#[inline(always)]
fn block_data(i: usize, d: f32, qs: [i8; 32], [lo, hi]: [i32; 2], out: &mut RowMut<'_>) {
    let (starts, sx) = ([-128 * lo, -128 * hi], (lo + hi) as f32);
    out.qs[i] = qs;
    out.scales[i] = d;
    out.starts[i] = starts;
    out.sx[i] = sx;
    if let Some((blocks, r)) = &mut out.tile {
        let (tb, r) = (&mut blocks[i], *r);
        tb.dx[r] = d;
        tb.sx[r] = sx;
        tb.qs[r] = qs;
        tb.start[r] = starts[0] + starts[1];
        tb.halves[0][r] = starts[0];
        tb.halves[1][r] = starts[1];
    }
}

/// [`quantize_row`] in 512-bit registers: the halves' sums from the values
/// widened back to 32 bits (the same integers as [`half_sums`]) and the
/// scale's trip through f16 by F16C, inside the loop rather than a call a
/// block (together, quantization took 8% of a 512-token prefill).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
unsafe fn quantize_row_avx512(x: &[f32], mut out: RowMut<'_>) {
    use std::arch::x86_64::*;
    for (i, xb) in x.chunks_exact(32).enumerate() {
        let (d, q) = block_avx512(xb.try_into().expect("a block of 32 values"));
        // The scale as the kernels read it: rounded to f16 and back.
        let h = _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(d));
        let d = _mm_cvtss_f32(_mm_cvtph_ps(h));
        let qs = std::mem::transmute::<[__m128i; 2], [i8; 32]>(q);
        block_data(i, d, qs, half_sums(&qs), &mut out);
    }
}

/// ggml's Q8_0 quantization of 32 values, operation for operation:
/// `d = amax / 127`, `q = round(x / d)` (computed as `x · (1 / d)`). A block
/// holding a NaN or an infinity gets the scale NaN: ggml's rounding would
/// turn NaN into 0 and hide it, while a NaN scale carries it into every
/// product the block takes part in, where the engine's check sees it.
pub fn quantize_block(x: &[f32]) -> (f16, [i8; 32]) {
    let x: &[f32; 32] = x.try_into().expect("a block of 32 values");
    #[cfg(target_arch = "x86_64")]
    if simd_level() == Simd::Vnni {
        // SAFETY: the VNNI level implies AVX-512F, BW and VL.
        return unsafe { quantize_block_avx512(x) };
    }
    #[cfg(target_arch = "x86_64")]
    if simd_level() == Simd::Avx2 {
        // SAFETY: the AVX2 level was detected.
        return unsafe { quantize_block_avx2(x) };
    }
    #[cfg(target_arch = "aarch64")]
    if crate::cpu::neon() {
        // SAFETY: NEON is part of every aarch64 target.
        return unsafe { neon::quantize_block(x) };
    }
    quantize_block_scalar(x)
}

fn quantize_block_scalar(x: &[f32; 32]) -> (f16, [i8; 32]) {
    let (amax, finite) = x.iter().fold((0f32, true), |(m, ok), v| {
        (m.max(v.abs()), ok & v.is_finite())
    });
    let d = if finite { amax / 127.0 } else { f32::NAN };
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    (
        f16::from_f32(d),
        std::array::from_fn(|j| (x[j] * id).round() as i8),
    )
}

/// [`quantize_block_scalar`] in two registers. The maximum of finite values
/// does not depend on its order; rounding is [`crate::ops::round_small`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn quantize_block_avx512(x: &[f32; 32]) -> (f16, [i8; 32]) {
    let (d, q) = block_avx512(x);
    (f16::from_f32(d), std::mem::transmute::<[_; 2], [i8; 32]>(q))
}

/// [`quantize_block_avx512`]'s work, inlined into its callers: the scale
/// as f32 and the values, sixteen a register.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn block_avx512(x: &[f32; 32]) -> (f32, [std::arch::x86_64::__m128i; 2]) {
    use std::arch::x86_64::*;
    let abs = |v: __m512| {
        _mm512_castsi512_ps(_mm512_and_si512(
            _mm512_castps_si512(v),
            _mm512_set1_epi32(0x7FFF_FFFF),
        ))
    };
    let a = _mm512_loadu_ps(x.as_ptr());
    let b = _mm512_loadu_ps(x.as_ptr().add(16));
    let (aa, ab) = (abs(a), abs(b));
    let amax = _mm512_reduce_max_ps(_mm512_max_ps(aa, ab)).max(0.0);
    // Unordered or above f32::MAX: NaN or infinite.
    let big = _mm512_set1_ps(f32::MAX);
    let bad =
        _mm512_cmp_ps_mask::<_CMP_NLE_UQ>(aa, big) | _mm512_cmp_ps_mask::<_CMP_NLE_UQ>(ab, big);
    let d = if bad == 0 { amax / 127.0 } else { f32::NAN };
    let id = _mm512_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
    // |x · id| ≤ 127 (plus rounding), within `round_small`'s range.
    let q = |v: __m512| _mm512_cvtepi32_epi8(crate::ops::round_small(_mm512_mul_ps(v, id)));
    (d, [q(a), q(b)])
}

/// [`quantize_block_scalar`] in four 256-bit registers, as
/// [`quantize_block_avx512`] does it in two; rounding is
/// [`crate::ops::round_small8`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_block_avx2(x: &[f32; 32]) -> (f16, [i8; 32]) {
    use std::arch::x86_64::*;
    let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(x.as_ptr().add(8 * i)));
    let magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let a = v.map(|r| _mm256_and_ps(r, magnitude));
    // Ordered and at most f32::MAX: finite. A block with NaN or an infinity
    // gets the NaN scale and zero values, as the scalar path gives it.
    let big = _mm256_set1_ps(f32::MAX);
    let finite = a.iter().fold(!0, |m, r| {
        m & _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_LE_OQ>(*r, big))
    });
    if finite != 0xff {
        return (f16::from_f32(f32::NAN), [0; 32]);
    }
    let m = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_shuffle_ps::<1>(m, m));
    let d = _mm_cvtss_f32(m).max(0.0) / 127.0;
    let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
    let q = v.map(|r| crate::ops::round_small8(_mm256_mul_ps(r, id)));
    // |q| ≤ 127, so the saturating packs are exact; they interleave the
    // 128-bit halves, which the permute puts back in order.
    let bytes = _mm256_packs_epi16(
        _mm256_packs_epi32(q[0], q[1]),
        _mm256_packs_epi32(q[2], q[3]),
    );
    let ordered = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    (
        f16::from_f32(d),
        std::mem::transmute::<__m256i, [i8; 32]>(ordered),
    )
}

/// Weights stored eight rows interleaved: the group kernels of each
/// instruction set, and the dispatch between them.
pub trait Packed: Sized + Sync {
    /// The arithmetic of the SIMD kernels, one element at a time.
    fn scalar(w: &[Self], x: Q8Row<'_>) -> [f32; 8];
    /// AVX-512 VNNI kernel.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA, F16C, AVX-512 VNNI and VL; every row covers `w`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn vnni<const XR: usize>(w: &[Self], xs: &[Q8Row<'_>; XR]) -> [[f32; 8]; XR];
    /// AVX2 kernel.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; every row covers `w`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2<const XR: usize>(w: &[Self], xs: &[Q8Row<'_>; XR]) -> [[f32; 8]; XR];
    /// AVX2 kernel for weights within ±16 (Q4_0's and Q5_0's): the same
    /// bits as [`Packed::avx2`] for them, in fewer instructions where a
    /// layout has one (wrong sums for larger weights); by default the
    /// general kernel. The K-quants' layout keeps the default: with its f32
    /// steps per half-block the short path measured no faster.
    ///
    /// # Safety
    /// As [`Packed::avx2`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2_small<const XR: usize>(w: &[Self], xs: &[Q8Row<'_>; XR]) -> [[f32; 8]; XR] {
        Self::avx2(w, xs)
    }
    /// NEON kernel with `sdot`.
    ///
    /// # Safety
    /// The CPU has the dot-product extension; every row covers `w`.
    #[cfg(target_arch = "aarch64")]
    unsafe fn sdot<const XR: usize>(w: &[Self], xs: &[Q8Row<'_>; XR]) -> [[f32; 8]; XR];
    /// NEON kernel by widening multiplies.
    ///
    /// # Safety
    /// Every row covers `w`.
    #[cfg(target_arch = "aarch64")]
    unsafe fn neon<const XR: usize>(w: &[Self], xs: &[Q8Row<'_>; XR]) -> [[f32; 8]; XR];

    /// VNNI kernel for the sixteen rows of a whole tile.
    ///
    /// # Safety
    /// As [`Packed::vnni`]; `t` covers `w`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn vnni16(w: &[Self], t: &[TileBlock]) -> [[f32; 8]; 16];

    /// [`Packed::group`] for the sixteen rows `xs` of a whole tile, `t` its
    /// blocks (the same rows): the same bits, from the tile where a kernel
    /// reads whole tiles.
    fn tile_group(w: &[Self], t: &[TileBlock], xs: &[Q8Row<'_>; 16]) -> [[f32; 8]; 16] {
        #[cfg(target_arch = "x86_64")]
        if simd_level() == Simd::Vnni {
            assert!(t.len() >= w.len(), "activation tile too short");
            // SAFETY: the CPU has the VNNI level's features; lengths checked.
            return unsafe { Self::vnni16(w, t) };
        }
        let _ = t;
        Self::group(w, xs)
    }

    /// `out[r][k] = dot(weight row k of the group, xs[r])` for a group of
    /// eight weight rows (`w` holds its blocks) and `XR` activation rows.
    fn group<const XR: usize>(w: &[Self], xs: &[Q8Row<'_>; XR]) -> [[f32; 8]; XR] {
        assert!(
            xs.iter().all(|x| x.covers(w.len())),
            "activation rows too short"
        );
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: the CPU has the features of each path; lengths were checked.
            match simd_level() {
                Simd::Vnni => return unsafe { Self::vnni(w, xs) },
                Simd::Avx2 => return unsafe { Self::avx2(w, xs) },
                Simd::None => {}
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            // SAFETY: `sdot` only where the CPU has it; lengths were checked.
            if crate::cpu::dotprod() {
                return unsafe { Self::sdot(w, xs) };
            }
            if crate::cpu::neon() {
                return unsafe { Self::neon(w, xs) };
            }
        }
        std::array::from_fn(|r| Self::scalar(w, xs[r]))
    }

    /// [`Packed::group`] where every weight of `w` is within ±16: the same
    /// bits, on AVX2 by [`Packed::avx2_small`].
    fn group_small<const XR: usize>(w: &[Self], xs: &[Q8Row<'_>; XR]) -> [[f32; 8]; XR] {
        #[cfg(target_arch = "x86_64")]
        if simd_level() == Simd::Avx2 {
            assert!(
                xs.iter().all(|x| x.covers(w.len())),
                "activation rows too short"
            );
            // SAFETY: the CPU has AVX2, FMA and F16C; lengths were checked.
            return unsafe { Self::avx2_small(w, xs) };
        }
        Self::group(w, xs)
    }
}

impl Packed for Q8x8 {
    fn scalar(w: &[Self], x: Q8Row<'_>) -> [f32; 8] {
        let mut acc = [0f32; 8];
        for (i, b) in w.iter().enumerate() {
            for (k, a) in acc.iter_mut().enumerate() {
                let [lo, hi] = int_dots(&b.qs, k, &x.qs[i]);
                let d = b.d[k].to_f32() * x.scales[i];
                *a = d.mul_add((lo + hi) as f32, *a);
            }
        }
        acc
    }
    #[cfg(target_arch = "x86_64")]
    unsafe fn vnni<const XR: usize>(w: &[Self], xs: &[Q8Row<'_>; XR]) -> [[f32; 8]; XR] {
        vnni::group(w, xs)
    }
    #[cfg(target_arch = "x86_64")]
    unsafe fn vnni16(w: &[Self], t: &[TileBlock]) -> [[f32; 8]; 16] {
        vnni::group16(w, t)
    }
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2<const XR: usize>(w: &[Self], xs: &[Q8Row<'_>; XR]) -> [[f32; 8]; XR] {
        avx2::group(w, xs)
    }
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2_small<const XR: usize>(w: &[Self], xs: &[Q8Row<'_>; XR]) -> [[f32; 8]; XR] {
        avx2::group_small(w, xs)
    }
    #[cfg(target_arch = "aarch64")]
    unsafe fn sdot<const XR: usize>(w: &[Self], xs: &[Q8Row<'_>; XR]) -> [[f32; 8]; XR] {
        neon::group_sdot(w, xs)
    }
    #[cfg(target_arch = "aarch64")]
    unsafe fn neon<const XR: usize>(w: &[Self], xs: &[Q8Row<'_>; XR]) -> [[f32; 8]; XR] {
        neon::group_plain(w, xs)
    }
}

/// The exact integer dot of row `k` of a packed block with activation values,
/// over columns 0..16 and 16..32.
pub(crate) fn int_dots(qs: &[u8; 256], k: usize, x: &[i8; 32]) -> [i32; 2] {
    let mut s = [0i32; 2];
    for (c, &xv) in x.iter().enumerate() {
        s[c / 16] += ((qs[slot(k, c)] ^ 0x80) as i8) as i32 * xv as i32;
    }
    s
}

/// `$row!(r)` for each row `r` of a tile, written out: the compiler keeps
/// sixteen accumulators in registers only where no loop indexes them.
#[cfg(target_arch = "x86_64")]
macro_rules! sixteen {
    ($row:ident) => {
        $crate::q8::sixteen!($row; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15)
    };
    ($row:ident; $($r:literal)*) => {
        $($row!($r);)*
    };
}
#[cfg(target_arch = "x86_64")]
pub(crate) use sixteen;

/// Registers as arrays of their f32 lanes, moved at once. A `map` over
/// the registers stayed a call per register (its closure compiled for the
/// kernel's instructions, `map` not): a tenth of a Q8 tile product's
/// samples at batch 512.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn lanes<V, const L: usize, const N: usize>(regs: [V; N]) -> [[f32; L]; N] {
    const { assert!(std::mem::size_of::<V>() == 4 * L) };
    // SAFETY: a register of `L` f32 lanes is `4 L` bytes with no padding.
    std::mem::transmute_copy(&regs)
}

/// Generates `group` for one instruction set; only the integer block dots
/// (`$dots`) differ between them, so all give the same bits.
#[cfg(target_arch = "x86_64")]
macro_rules! q8_group {
    ($name:ident, $features:literal, |$q:ident, $x:ident, $s:ident| $dots:expr, $load:path) => {
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $name<const XR: usize>(
            w: &[super::Q8x8],
            x: &[super::Q8Row<'_>; XR],
        ) -> [[f32; 8]; XR] {
            let mut acc = [_mm256_setzero_ps(); XR];
            for (i, b) in w.iter().enumerate() {
                crate::cpu::prefetch_ahead(b);
                let dw = _mm256_cvtph_ps(_mm_loadu_si128(b.d.as_ptr() as *const __m128i));
                let $q = $load(&b.qs);
                for (a, xr) in acc.iter_mut().zip(x) {
                    let $x = xr.qs.get_unchecked(i);
                    let $s = *xr.starts.get_unchecked(i);
                    let (lo, hi) = $dots;
                    let s = _mm256_cvtepi32_ps(_mm256_add_epi32(lo, hi));
                    let d = _mm256_mul_ps(dw, _mm256_set1_ps(*xr.scales.get_unchecked(i)));
                    *a = _mm256_fmadd_ps(d, s, *a);
                }
            }
            super::lanes(acc)
        }
    };
}

/// Integer dot products of a packed block (eight registers of 4-byte groups)
/// with one activation block, as eight i32 lanes (one per weight row) for
/// columns 0..16 and 16..32. VNNI: weights are unsigned (`q + 128`), so each
/// `vpdpbusd` starts from `-128 · Σx` (the row's `starts`) to leave the
/// signed products exactly.
#[cfg(target_arch = "x86_64")]
pub(crate) mod vnni {
    use std::arch::x86_64::*;

    /// Broadcasts the 4-byte group `g` of an activation block.
    #[inline(always)]
    pub(crate) unsafe fn group4(x: &[i8; 32], g: usize) -> __m256i {
        _mm256_set1_epi32(std::ptr::read_unaligned(x.as_ptr().add(4 * g) as *const i32))
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
    #[inline]
    pub(crate) unsafe fn dots(
        q: &[__m256i; 8],
        x: &[i8; 32],
        start: [i32; 2],
    ) -> (__m256i, __m256i) {
        let mut lo = _mm256_set1_epi32(start[0]);
        let mut hi = _mm256_set1_epi32(start[1]);
        for g in 0..4 {
            lo = _mm256_dpbusd_epi32(lo, q[g], group4(x, g));
            hi = _mm256_dpbusd_epi32(hi, q[g + 4], group4(x, g + 4));
        }
        (lo, hi)
    }

    q8_group!(
        group,
        "avx2,fma,f16c,avx512vnni,avx512vl",
        |q, x, s| dots(&q, x, s),
        super::avx2::load
    );

    /// [`group`] for the sixteen rows of a whole tile: every row's
    /// accumulator in a register of its own, the rows' data at one address
    /// a block, and one chain's start for the whole block (the two halves'
    /// sums are added anyway; integers, so the same sum). 1.4× `group` on
    /// the MLP shapes.
    #[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
    pub(crate) unsafe fn group16(w: &[super::Q8x8], t: &[super::TileBlock]) -> [[f32; 8]; 16] {
        let mut acc = [_mm256_setzero_ps(); 16];
        for (b, x) in w.iter().zip(t) {
            crate::cpu::prefetch_ahead(b);
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(b.d.as_ptr() as *const __m128i));
            let q = super::avx2::load(&b.qs);
            macro_rules! row {
                ($r:literal) => {
                    let (lo, hi) = dots(&q, &x.qs[$r], [x.start[$r], 0]);
                    let s = _mm256_cvtepi32_ps(_mm256_add_epi32(lo, hi));
                    let d = _mm256_mul_ps(dw, _mm256_set1_ps(x.dx[$r]));
                    acc[$r] = _mm256_fmadd_ps(d, s, acc[$r]);
                };
            }
            super::sixteen!(row);
        }
        super::lanes(acc)
    }
}

/// The same integer lanes without VNNI: weights back to signed, then the
/// sign trick (`|w| · sign(x, w)`) so `maddubs` cannot saturate. The
/// weights' part of it (signed, and their magnitudes) is made once per
/// block for all the activation rows of a call.
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use std::arch::x86_64::*;

    /// A block's weights, signed again, and their magnitudes, four columns
    /// of eight rows a register.
    pub(crate) struct Signed {
        w: [__m256i; 8],
        abs: [__m256i; 8],
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) unsafe fn dots(q: &Signed, x: &[i8; 32]) -> (__m256i, __m256i) {
        let ones = _mm256_set1_epi16(1);
        let mut s = [_mm256_setzero_si256(); 2];
        for g in 0..8 {
            let xg =
                _mm256_set1_epi32(std::ptr::read_unaligned(x.as_ptr().add(4 * g) as *const i32));
            let p = _mm256_maddubs_epi16(q.abs[g], _mm256_sign_epi8(xg, q.w[g]));
            s[g / 4] = _mm256_add_epi32(s[g / 4], _mm256_madd_epi16(p, ones));
        }
        (s[0], s[1])
    }

    /// A block's values as they are stored (unsigned, `q + 128`).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) unsafe fn load(qs: &[u8; 256]) -> [__m256i; 8] {
        std::array::from_fn(|g| _mm256_loadu_si256(qs.as_ptr().add(32 * g) as *const __m256i))
    }

    /// A block's values signed again, with their magnitudes.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) unsafe fn signed(qs: &[u8; 256]) -> Signed {
        let c80 = _mm256_set1_epi8(0x80u8 as i8);
        let w = load(qs).map(|q| _mm256_xor_si256(q, c80));
        Signed {
            w,
            abs: w.map(|v| _mm256_sign_epi8(v, v)),
        }
    }

    /// A block's weights offset to `q + 16` (0..=32 where every weight is
    /// within ±16), as [`dots_small`] reads them.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) unsafe fn small(qs: &[u8; 256]) -> [__m256i; 8] {
        // Stored as `q + 128`; bytes wrap, so `q + 16` for every q ≥ -16.
        let c = _mm256_set1_epi8(112);
        load(qs).map(|q| _mm256_sub_epi8(q, c))
    }

    /// [`dots`] for weights within ±16 (`q` from [`small`]): they are
    /// `maddubs`' unsigned side as they are, so no sign step, and four
    /// groups' pair sums fit 16 bits (|sum| ≤ 4 · 2 · 32 · 127 = 32,512)
    /// before one widening add instead of four. `start` is the row's
    /// [`crate::q8::Q8Row::starts`] (`-128 · Σx`); an eighth of it,
    /// `-16 · Σx`, takes the offset back out. Exact integers, so the same
    /// lanes as [`dots`].
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) unsafe fn dots_small(
        q: &[__m256i; 8],
        x: &[i8; 32],
        start: [i32; 2],
    ) -> (__m256i, __m256i) {
        let ones = _mm256_set1_epi16(1);
        let mut s = [_mm256_setzero_si256(); 2];
        for (h, sh) in s.iter_mut().enumerate() {
            let mut p = _mm256_setzero_si256();
            for (g, qg) in q.iter().enumerate().skip(4 * h).take(4) {
                let xg = _mm256_set1_epi32(std::ptr::read_unaligned(
                    x.as_ptr().add(4 * g) as *const i32
                ));
                p = _mm256_add_epi16(p, _mm256_maddubs_epi16(*qg, xg));
            }
            *sh = _mm256_add_epi32(_mm256_set1_epi32(start[h] >> 3), _mm256_madd_epi16(p, ones));
        }
        (s[0], s[1])
    }

    q8_group!(group, "avx2,fma,f16c", |q, x, _s| dots(&q, x), signed);
    q8_group!(
        group_small,
        "avx2,fma,f16c",
        |q, x, s| dots_small(&q, x, s),
        small
    );
}

/// The same integer lanes on aarch64, four weight rows a register: the
/// weights back to signed bytes, then `sdot` (each 32-bit lane a row's
/// four-column dot) where the CPU has the dot-product extension, else
/// widening multiplies (`smull`) and pairwise adds; both exact. The f32 steps
/// are the scalar path's, four rows a register.
#[cfg(target_arch = "aarch64")]
pub(crate) mod neon {
    use std::arch::aarch64::*;
    use std::arch::asm;

    /// Eight f16 at `p` as f32, rows 0..4 and 4..8 (`fcvtl`, exact; the
    /// intrinsic's f16 vector type is not stable Rust).
    #[inline(always)]
    pub(crate) unsafe fn f16x8(p: *const u16) -> (float32x4_t, float32x4_t) {
        let h = vld1q_u16(p);
        let (lo, hi): (float32x4_t, float32x4_t);
        asm!(
            "fcvtl {lo:v}.4s, {h:v}.4h",
            "fcvtl2 {hi:v}.4s, {h:v}.8h",
            h = in(vreg) h,
            lo = out(vreg) lo,
            hi = out(vreg) hi,
            options(pure, nomem, nostack, preserves_flags),
        );
        (lo, hi)
    }

    /// A packed block's weights as signed bytes: register `2 g` holds
    /// rows 0..4 of 4-byte group `g`, register `2 g + 1` rows 4..8.
    #[inline(always)]
    pub(crate) unsafe fn load(qs: &[u8; 256]) -> [int8x16_t; 16] {
        let c80 = vdupq_n_u8(0x80);
        std::array::from_fn(|i| {
            vreinterpretq_s8_u8(veorq_u8(vld1q_u8(qs.as_ptr().add(16 * i)), c80))
        })
    }

    /// The integer dots of a block with one activation block: columns
    /// 0..16 for rows 0..4 and 4..8, then columns 16..32 likewise.
    ///
    /// # Safety
    /// The CPU has the dot-product extension.
    #[target_feature(enable = "dotprod")]
    #[inline]
    pub(crate) unsafe fn dots_sdot(w: &[int8x16_t; 16], x: &[i8; 32]) -> [int32x4_t; 4] {
        let (x0, x1) = (vld1q_s8(x.as_ptr()), vld1q_s8(x.as_ptr().add(16)));
        let z = vdupq_n_s32(0);
        let (mut a0, mut a1, mut a2, mut a3) = (z, z, z, z);
        // Group g's four activation bytes are lane g % 4 of x0 or x1 (`sdot`
        // by element: no broadcast needed).
        asm!(
            "sdot {a0:v}.4s, {w0:v}.16b, {x0:v}.4b[0]",
            "sdot {a1:v}.4s, {w1:v}.16b, {x0:v}.4b[0]",
            "sdot {a0:v}.4s, {w2:v}.16b, {x0:v}.4b[1]",
            "sdot {a1:v}.4s, {w3:v}.16b, {x0:v}.4b[1]",
            "sdot {a0:v}.4s, {w4:v}.16b, {x0:v}.4b[2]",
            "sdot {a1:v}.4s, {w5:v}.16b, {x0:v}.4b[2]",
            "sdot {a0:v}.4s, {w6:v}.16b, {x0:v}.4b[3]",
            "sdot {a1:v}.4s, {w7:v}.16b, {x0:v}.4b[3]",
            "sdot {a2:v}.4s, {w8:v}.16b, {x1:v}.4b[0]",
            "sdot {a3:v}.4s, {w9:v}.16b, {x1:v}.4b[0]",
            "sdot {a2:v}.4s, {w10:v}.16b, {x1:v}.4b[1]",
            "sdot {a3:v}.4s, {w11:v}.16b, {x1:v}.4b[1]",
            "sdot {a2:v}.4s, {w12:v}.16b, {x1:v}.4b[2]",
            "sdot {a3:v}.4s, {w13:v}.16b, {x1:v}.4b[2]",
            "sdot {a2:v}.4s, {w14:v}.16b, {x1:v}.4b[3]",
            "sdot {a3:v}.4s, {w15:v}.16b, {x1:v}.4b[3]",
            a0 = inout(vreg) a0,
            a1 = inout(vreg) a1,
            a2 = inout(vreg) a2,
            a3 = inout(vreg) a3,
            w0 = in(vreg) w[0],
            w1 = in(vreg) w[1],
            w2 = in(vreg) w[2],
            w3 = in(vreg) w[3],
            w4 = in(vreg) w[4],
            w5 = in(vreg) w[5],
            w6 = in(vreg) w[6],
            w7 = in(vreg) w[7],
            w8 = in(vreg) w[8],
            w9 = in(vreg) w[9],
            w10 = in(vreg) w[10],
            w11 = in(vreg) w[11],
            w12 = in(vreg) w[12],
            w13 = in(vreg) w[13],
            w14 = in(vreg) w[14],
            w15 = in(vreg) w[15],
            x0 = in(vreg) x0,
            x1 = in(vreg) x1,
            options(pure, nomem, nostack, preserves_flags),
        );
        [a0, a1, a2, a3]
    }

    /// [`dots_sdot`] by widening multiplies: each `smull` gives two rows'
    /// eight products, pairwise-added into their lanes. A product is at most
    /// 128 · 127 in magnitude (activations are within ±127), so two fit the
    /// 16-bit sums exactly.
    #[inline(always)]
    pub(crate) unsafe fn dots_plain(w: &[int8x16_t; 16], x: &[i8; 32]) -> [int32x4_t; 4] {
        // p[half][j]: rows 2j, 2j + 1, columns 0..2 and 2..4 of each group.
        let mut p = [[vdupq_n_s32(0); 4]; 2];
        for g in 0..8 {
            let xg = vreinterpretq_s8_s32(vdupq_n_s32(std::ptr::read_unaligned(
                x.as_ptr().add(4 * g) as *const i32,
            )));
            let h = &mut p[g / 4];
            for (j, wj) in [w[2 * g], w[2 * g + 1]].into_iter().enumerate() {
                let lo = vmull_s8(vget_low_s8(wj), vget_low_s8(xg));
                h[2 * j] = vpadalq_s16(h[2 * j], lo);
                h[2 * j + 1] = vpadalq_s16(h[2 * j + 1], vmull_high_s8(wj, xg));
            }
        }
        [
            vpaddq_s32(p[0][0], p[0][1]),
            vpaddq_s32(p[0][2], p[0][3]),
            vpaddq_s32(p[1][0], p[1][1]),
            vpaddq_s32(p[1][2], p[1][3]),
        ]
    }

    /// Generates `group` for one way of taking the integer dots; only
    /// `$dots` differs, so both give the same bits.
    macro_rules! q8_group {
        ($name:ident, $(#[$attr:meta])* $dots:path) => {
            $(#[$attr])*
            pub(crate) unsafe fn $name<const XR: usize>(
                w: &[super::Q8x8],
                x: &[super::Q8Row<'_>; XR],
            ) -> [[f32; 8]; XR] {
                let mut acc = [[vdupq_n_f32(0.0); 2]; XR];
                for (i, b) in w.iter().enumerate() {
                    let dw = f16x8(b.d.as_ptr() as *const u16);
                    let q = load(&b.qs);
                    for (a, xr) in acc.iter_mut().zip(x) {
                        let [lo0, lo1, hi0, hi1] = $dots(&q, xr.qs.get_unchecked(i));
                        let dx = *xr.scales.get_unchecked(i);
                        let s0 = vcvtq_f32_s32(vaddq_s32(lo0, hi0));
                        let s1 = vcvtq_f32_s32(vaddq_s32(lo1, hi1));
                        a[0] = vfmaq_f32(a[0], vmulq_n_f32(dw.0, dx), s0);
                        a[1] = vfmaq_f32(a[1], vmulq_n_f32(dw.1, dx), s1);
                    }
                }
                acc.map(|a| std::mem::transmute::<[float32x4_t; 2], [f32; 8]>(a))
            }
        };
    }
    q8_group!(
        group_sdot,
        #[target_feature(enable = "dotprod")]
        dots_sdot
    );
    q8_group!(group_plain, dots_plain);

    /// [`super::quantize_block_scalar`] in eight registers. The maximum of
    /// finite values does not depend on its order; `fcvtas` rounds half away
    /// from zero as `f32::round` does, and NaN to 0 as `as i8` does.
    pub(crate) unsafe fn quantize_block(x: &[f32; 32]) -> (half::f16, [i8; 32]) {
        let v: [float32x4_t; 8] = std::array::from_fn(|i| vld1q_f32(x.as_ptr().add(4 * i)));
        let a = v.map(|r| vabsq_f32(r));
        let m = |p: float32x4_t, q: float32x4_t| vmaxq_f32(p, q);
        let top = m(
            m(m(a[0], a[1]), m(a[2], a[3])),
            m(m(a[4], a[5]), m(a[6], a[7])),
        );
        let amax = vmaxvq_f32(top).max(0.0);
        // Compares false for NaN: finite means every |x| ≤ f32::MAX.
        let big = vdupq_n_f32(f32::MAX);
        let ok = a
            .iter()
            .fold(vdupq_n_u32(!0), |o, r| vandq_u32(o, vcleq_f32(*r, big)));
        let d = if vminvq_u32(ok) == !0 {
            amax / 127.0
        } else {
            f32::NAN
        };
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q = v.map(|r| vcvtaq_s32_f32(vmulq_n_f32(r, id)));
        let h: [int16x8_t; 4] =
            std::array::from_fn(|i| vcombine_s16(vmovn_s32(q[2 * i]), vmovn_s32(q[2 * i + 1])));
        let out = [
            vcombine_s8(vmovn_s16(h[0]), vmovn_s16(h[1])),
            vcombine_s8(vmovn_s16(h[2]), vmovn_s16(h[3])),
        ];
        (
            half::f16::from_f32(d),
            std::mem::transmute::<[int8x16_t; 2], [i8; 32]>(out),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::k_quants::GgmlType;

    fn blocks<T: GgmlType>(v: &[f32]) -> Vec<T> {
        let mut b: Vec<T> = (0..v.len() / 32).map(|_| T::zeros()).collect();
        T::from_float(v, &mut b);
        b
    }

    #[test]
    fn half_sums_are_the_sums() {
        for k in 0..300usize {
            let b: [i8; 32] = std::array::from_fn(|j| match k {
                0 => i8::MIN,
                1 => i8::MAX,
                _ => ((j * 131 + k * 71) % 256) as u8 as i8,
            });
            let want = [&b[..16], &b[16..]].map(|h| h.iter().map(|&v| v as i32).sum::<i32>());
            assert_eq!(half_sums(&b), want, "block {k}");
        }
    }

    #[test]
    fn both_quantizations_agree() {
        let mut blocks: Vec<[f32; 32]> = vec![[0.0; 32], [-0.0; 32], [1e-30; 32]];
        // Values that land on and beside every .5 after scaling.
        for k in 0..256 {
            let t = (k as f32 - 128.0) + 0.5;
            let mut b = [0f32; 32];
            b[0] = 127.0;
            b[1] = t;
            b[2] = f32::from_bits(t.to_bits() + 1);
            b[3] = f32::from_bits(t.to_bits() - 1);
            b[4] = -t;
            blocks.push(b);
        }
        for s in 0..2000u32 {
            blocks.push(std::array::from_fn(|j| {
                let v = (s.wrapping_mul(2654435761) ^ (j as u32).wrapping_mul(40503)) % 20001;
                (v as f32 / 1000.0 - 10.0) * (1 + s % 7) as f32
            }));
        }
        for b in &blocks {
            let (d, q) = quantize_block(b);
            let (d2, q2) = quantize_block_scalar(b);
            assert_eq!((d.to_bits(), q), (d2.to_bits(), q2), "{b:?}");
            #[cfg(target_arch = "x86_64")]
            if is_x86_feature_detected!("avx2") {
                // SAFETY: AVX2 was detected.
                let (d3, q3) = unsafe { quantize_block_avx2(b) };
                assert_eq!((d3.to_bits(), q3), (d2.to_bits(), q2), "AVX2: {b:?}");
            }
        }
    }

    #[test]
    fn non_finite_values_give_a_nan_scale_on_every_path() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for at in [0, 17, 31] {
                let mut b: [f32; 32] = std::array::from_fn(|j| j as f32 - 16.0);
                b[at] = bad;
                let (d, q) = quantize_block(&b);
                let (d2, q2) = quantize_block_scalar(&b);
                assert!(d.is_nan() && d2.is_nan(), "{bad} at {at}");
                assert_eq!(q, q2, "{bad} at {at}");
                #[cfg(target_arch = "x86_64")]
                if is_x86_feature_detected!("avx2") {
                    // SAFETY: AVX2 was detected.
                    let (d3, q3) = unsafe { quantize_block_avx2(&b) };
                    assert_eq!(
                        (d3.to_bits(), q3),
                        (d2.to_bits(), q2),
                        "AVX2: {bad} at {at}"
                    );
                }
            }
        }
    }

    /// Rows and whole tiles hold every block's values, scale and sums as
    /// the scalar quantization gives them, on a batch that takes the
    /// buffers a larger one left (stale values everywhere), with a block
    /// of NaN among them.
    #[test]
    fn quantized_rows_and_tiles_hold_every_block() {
        let value = |i: usize, k: usize| ((i * 7919 + k * 104729) % 4001) as f32 / 400.0 - 5.0;
        drop(Activations::quantize(
            &(0..70 * 224).map(|i| value(i, 1)).collect::<Vec<_>>(),
            70,
            224,
        ));
        let (n, cols) = (37, 160);
        let mut x: Vec<f32> = (0..n * cols).map(|i| value(i, 2)).collect();
        x[20 * cols + 64 + 5] = f32::NAN;
        let acts = Activations::quantize(&x, n, cols);
        let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        for b in 0..n {
            let row = acts.row(b);
            for (i, xb) in x[b * cols..(b + 1) * cols].chunks_exact(32).enumerate() {
                let (d, qs) = quantize_block_scalar(xb.try_into().unwrap());
                let [lo, hi] =
                    [&qs[..16], &qs[16..]].map(|h| h.iter().map(|&v| v as i32).sum::<i32>());
                let at = format!("row {b} block {i}");
                assert!(same(row.scales[i], d.to_f32()), "{at}");
                assert_eq!(row.qs[i], qs, "{at}");
                assert_eq!(row.starts[i], [-128 * lo, -128 * hi], "{at}");
                assert!(same(row.sx[i], (lo + hi) as f32), "{at}");
                let Some(tile) = acts.whole_tile(b / 16 * 16) else {
                    continue;
                };
                let (tb, r) = (&tile[i], b % 16);
                assert!(
                    same(tb.dx[r], row.scales[i]) && same(tb.sx[r], row.sx[i]),
                    "{at}"
                );
                assert_eq!(tb.qs[r], qs, "{at}");
                assert_eq!(tb.start[r], -128 * (lo + hi), "{at}");
                assert_eq!([tb.halves[0][r], tb.halves[1][r]], row.starts[i], "{at}");
            }
        }
        assert!(
            acts.whole_tile(32).is_none(),
            "rows 32..37 are no whole tile"
        );
        #[cfg(target_arch = "x86_64")]
        assert_eq!(acts.has_tiles(), sixteen_row_kernels());
    }

    #[test]
    fn quantization_matches_ggml() {
        let x: Vec<f32> = (0..32 * 64)
            .map(|i| (((i * 7919) % 2003) as f32 / 1001.0 - 1.0) * (1 + i % 5) as f32)
            .chain([0.0; 32])
            .chain((0..32).map(|i| if i % 2 == 0 { 0.5 } else { -1.5 }))
            .collect();
        let stock: Vec<BlockQ8_0> = blocks(&x);
        for (b, xb) in raw8(&stock).iter().zip(x.chunks_exact(32)) {
            let (d, qs) = quantize_block(xb);
            assert_eq!((d.to_bits(), qs), (b.d.to_bits(), b.qs));
        }
    }

    /// Weights within ±16 (Q4_0, Q5_0) take the short AVX2 path: the same
    /// bits as the scalar path and the general one, at the extremes where
    /// its 16-bit sums are closest to overflowing (every weight ±16, so 0
    /// or 32 after the offset, every activation ±127) and on mixed data,
    /// for one to sixteen rows at once; and the K-quants' layout, which
    /// keeps the general path, through the same calls.
    #[test]
    fn small_weights_take_a_short_path_to_the_same_bits() {
        let bpr = 6;
        // Block i, row k, column c: the extremes first, then mixed values.
        let q = |i: usize, k: usize, c: usize| -> i8 {
            match i {
                0 => 16,
                1 => -16,
                2 => {
                    if (c + k).is_multiple_of(2) {
                        16
                    } else {
                        -16
                    }
                }
                3 => 0,
                _ => ((i * 131 + k * 37 + c * 11) % 33) as i8 - 16,
            }
        };
        let qs = |i: usize| {
            let mut qs = [0u8; 256];
            for k in 0..8 {
                for c in 0..32 {
                    qs[slot(k, c)] = (q(i, k, c) as u8) ^ 0x80;
                }
            }
            qs
        };
        let q8: Vec<Q8x8> = (0..bpr)
            .map(|i| Q8x8 {
                d: std::array::from_fn(|k| f16::from_f32(0.01 + k as f32 / 64.0)),
                qs: qs(i),
            })
            .collect();
        let k8: Vec<crate::kq::K8> = (0..bpr)
            .map(|i| crate::kq::K8 {
                s0: std::array::from_fn(|k| 0.02 + k as f32 / 50.0),
                s1: std::array::from_fn(|k| 0.03 + k as f32 / 70.0),
                m: std::array::from_fn(|k| 0.1 * k as f32),
                qs: qs(i),
            })
            .collect();
        // Rows of ±1 (every value quantizes to ±127), then mixed rows.
        let cols = 32 * bpr;
        let x: Vec<f32> = (0..16 * cols)
            .map(|i| match i / cols {
                0 => 1.0,
                1 => -1.0,
                2 => {
                    if i % 3 == 0 {
                        1.0
                    } else {
                        -1.0
                    }
                }
                _ => ((i * 13) % 29) as f32 / 14.0 - 1.0,
            })
            .collect();
        let acts = Activations::quantize(&x, 16, cols);
        assert!(
            acts.row(0).qs.iter().flatten().all(|&v| v == 127),
            "±127 rows"
        );
        let all: [Q8Row<'_>; 16] = std::array::from_fn(|r| acts.row(r));
        fn agree<P: Packed + Sync>(name: &str, w: &[P], all: &[Q8Row<'_>; 16]) {
            let sixteen = P::group_small(w, all);
            assert_eq!(sixteen, P::group(w, all), "{name}: sixteen rows");
            let eight = P::group_small(w, &std::array::from_fn::<_, 8, _>(|r| all[r]));
            let four = P::group_small(w, &std::array::from_fn::<_, 4, _>(|r| all[4 + r]));
            for r in 0..16 {
                let one = P::group_small(w, &[all[r]]);
                assert_eq!(one[0], P::scalar(w, all[r]), "{name} row {r}: scalar");
                assert_eq!(one[0], sixteen[r], "{name} row {r}: one vs sixteen");
                if r < 8 {
                    assert_eq!(eight[r], sixteen[r], "{name} row {r}: eight vs sixteen");
                }
                if (4..8).contains(&r) {
                    assert_eq!(four[r - 4], sixteen[r], "{name} row {r}: four vs sixteen");
                }
                // The short path itself, wherever the CPU has AVX2 (on a
                // VNNI host `group_small` takes VNNI).
                #[cfg(target_arch = "x86_64")]
                if crate::cpu::avx2_fma_f16c() {
                    // SAFETY: AVX2, FMA and F16C were detected; the rows
                    // cover `w`.
                    let short = unsafe { P::avx2_small(w, &[all[r]]) };
                    assert_eq!(short[0], one[0], "{name} row {r}: AVX2 short path");
                }
            }
        }
        agree("Q8_0 layout", &q8, &all);
        agree("K-quant layout", &k8, &all);
    }

    #[test]
    fn packing_is_exact_and_every_path_agrees() {
        let (rows, cols) = (11, 896);
        let bpr = cols / 32;
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
            .collect();
        let q8: Vec<BlockQ8_0> = blocks(&w);
        let wide = Q8Blocks::from_q8_0(&q8);
        let mut a = vec![0f32; rows * cols];
        let mut b = vec![0f32; rows * cols];
        BlockQ8_0::to_float(&q8, &mut a);
        wide.to_f32(&mut b);
        assert_eq!(a, b, "Q8_0 blocks as read");

        let packed = pack_q8(&wide, rows, bpr);
        let deq = |r: usize| {
            let mut o = vec![0f32; cols];
            unpack_q8_row(&packed, bpr, r, &mut o);
            o
        };
        for r in 0..rows {
            let mut want = vec![0f32; cols];
            BlockQ8_0::to_float(&q8[r * bpr..(r + 1) * bpr], &mut want);
            assert_eq!(deq(r), want, "row {r} through the packed layout");
        }

        let x: Vec<f32> = (0..16 * cols)
            .map(|i| ((i * 13) % 29) as f32 / 14.0 - 1.0)
            .collect();
        let acts = Activations::quantize(&x, 16, cols);
        let all: [Q8Row<'_>; 16] = std::array::from_fn(|r| acts.row(r));
        let xs: [Q8Row<'_>; 8] = std::array::from_fn(|r| all[r]);
        for g in 0..rows.div_ceil(8) {
            let wg = &packed[g * bpr..(g + 1) * bpr];
            let sixteen = Q8x8::group(wg, &all);
            #[cfg(target_arch = "x86_64")]
            if simd_level() == Simd::Vnni {
                let t = acts.whole_tile(0).expect("VNNI hosts read whole tiles");
                let tiled = Q8x8::tile_group(wg, t, &all);
                assert_eq!(tiled, sixteen, "group {g}: whole tile vs sixteen rows");
            }
            let eight = Q8x8::group(wg, &xs);
            assert_eq!(eight, sixteen[..8], "group {g}: eight rows vs sixteen");
            let four = Q8x8::group(wg, &[xs[4], xs[5], xs[6], xs[7]]);
            for r in 0..8 {
                let one = Q8x8::group(wg, &[xs[r]]);
                assert_eq!(one[0], eight[r], "group {g}: one row vs eight");
                assert_eq!(
                    Q8x8::scalar(wg, xs[r]),
                    one[0],
                    "group {g}: scalar emulation"
                );
                if r >= 4 {
                    assert_eq!(four[r - 4], eight[r], "group {g}: four rows vs eight");
                }
                #[cfg(target_arch = "x86_64")]
                if simd_level() == Simd::Vnni {
                    // SAFETY: VNNI implies AVX2, FMA and F16C were detected.
                    let avx = unsafe { avx2::group(wg, &[xs[r]]) };
                    assert_eq!(avx[0], one[0], "group {g}: AVX2 vs VNNI");
                }
                #[cfg(target_arch = "aarch64")]
                if crate::cpu::dotprod() {
                    // SAFETY: the lengths were checked by `group`.
                    let plain = unsafe { neon::group_plain(wg, &[xs[r]]) };
                    assert_eq!(plain[0], one[0], "group {g}: widening multiplies vs sdot");
                }
                for (k, &got) in eight[r].iter().enumerate() {
                    let row = 8 * g + k;
                    if row >= rows {
                        continue;
                    }
                    let (exact, scale) = deq(row)
                        .iter()
                        .zip(&x[r * cols..(r + 1) * cols])
                        .fold((0f32, 0f32), |(e, s), (a, b)| {
                            (e + a * b, s + (a * b).abs())
                        });
                    assert!(
                        (got - exact).abs() <= 0.01 * scale,
                        "row {row}: {got} vs {exact}"
                    );
                }
            }
        }
    }
}
