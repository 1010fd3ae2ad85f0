//! Q8_0 weights × Q8_0 activations, several activation rows per weight block.
//!
//! Q4_0 and Q5_0 weights are widened to Q8_0 blocks at load (exactly: same
//! scale, integer values -16..=15 fit in i8), so one kernel serves all three.
//! Per output element the arithmetic is always the same sequence: an exact
//! integer dot per block, eight f32 lanes accumulated block by block with
//! fused multiply-adds, then a fixed horizontal sum. Processing 1 or 4 rows at
//! a time only changes how many elements run side by side, never the bits;
//! the scalar fallback emulates the same lanes, so results match on CPUs
//! without AVX2 too.

use candle_core::quantized::k_quants::{BlockQ4_0, BlockQ5_0, BlockQ8_0};

/// Byte layout of a Q8_0 block.
#[repr(C)]
#[derive(Clone, Copy)]
struct RawQ8 {
    d: half::f16,
    qs: [i8; 32],
}

#[repr(C)]
struct RawQ5 {
    d: half::f16,
    qh: [u8; 4],
    qs: [u8; 16],
}

#[repr(C)]
struct RawQ4 {
    d: half::f16,
    qs: [u8; 16],
}

const _: () = assert!(std::mem::size_of::<RawQ8>() == std::mem::size_of::<BlockQ8_0>());
const _: () = assert!(std::mem::size_of::<RawQ5>() == std::mem::size_of::<BlockQ5_0>());
const _: () = assert!(std::mem::size_of::<RawQ4>() == std::mem::size_of::<BlockQ4_0>());

fn raw8(b: &[BlockQ8_0]) -> &[RawQ8] {
    // SAFETY: identical `repr(C)` layouts of plain data (size checked above).
    unsafe { std::slice::from_raw_parts(b.as_ptr() as *const RawQ8, b.len()) }
}

fn from_raw8(v: Vec<RawQ8>) -> Vec<BlockQ8_0> {
    let mut v = std::mem::ManuallyDrop::new(v);
    // SAFETY: same size and alignment (both hold an f16 then bytes), same
    // layout; the allocation is handed over unchanged.
    unsafe { Vec::from_raw_parts(v.as_mut_ptr() as *mut BlockQ8_0, v.len(), v.capacity()) }
}

/// Widens Q5_0 blocks to Q8_0 blocks holding exactly the same values.
pub fn widen_q5_0(xs: &[BlockQ5_0]) -> Vec<BlockQ8_0> {
    // SAFETY: identical `repr(C)` layouts (size checked above).
    let xs = unsafe { std::slice::from_raw_parts(xs.as_ptr() as *const RawQ5, xs.len()) };
    let out = xs
        .iter()
        .map(|b| {
            let qh = u32::from_le_bytes(b.qh);
            let mut qs = [0i8; 32];
            for j in 0..16 {
                let lo = (b.qs[j] & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
                let hi = (b.qs[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
                qs[j] = lo as i8 - 16;
                qs[j + 16] = hi as i8 - 16;
            }
            RawQ8 { d: b.d, qs }
        })
        .collect();
    from_raw8(out)
}

/// Widens Q4_0 blocks to Q8_0 blocks holding exactly the same values.
pub fn widen_q4_0(xs: &[BlockQ4_0]) -> Vec<BlockQ8_0> {
    // SAFETY: identical `repr(C)` layouts (size checked above).
    let xs = unsafe { std::slice::from_raw_parts(xs.as_ptr() as *const RawQ4, xs.len()) };
    let out = xs
        .iter()
        .map(|b| {
            let mut qs = [0i8; 32];
            for j in 0..16 {
                qs[j] = (b.qs[j] & 0x0F) as i8 - 8;
                qs[j + 16] = (b.qs[j] >> 4) as i8 - 8;
            }
            RawQ8 { d: b.d, qs }
        })
        .collect();
    from_raw8(out)
}

/// One activation row quantized to Q8_0, with its block scales as f32.
#[derive(Clone, Copy)]
pub struct Q8Row<'a> {
    /// Blocks of the row.
    pub blocks: &'a [BlockQ8_0],
    /// `blocks[i].d` as f32, converted once per row rather than per dot product.
    pub scales: &'a [f32],
    /// `blocks[i].qs` shifted to unsigned (`q + 128`), for the VNNI tile kernel.
    pub offset: &'a [[u8; 32]],
    /// Sum of each block's integer values, for weights with an offset (Q4_K).
    pub sums: &'a [i32],
}

/// A quantized activation row's side data: f32 scales, unsigned values, block sums.
pub type RowQuant = (Vec<f32>, Vec<[u8; 32]>, Vec<i32>);

/// The integer values of a Q8_0 block.
pub(crate) fn qs(b: &BlockQ8_0) -> &[i8; 32] {
    // SAFETY: `RawQ8` mirrors the block layout (size checked above).
    unsafe { &(*(b as *const BlockQ8_0 as *const RawQ8)).qs }
}

/// Quantizes one f32 row to Q8_0; returns its block scales as f32 and its
/// values shifted to unsigned.
pub fn quantize_row(x: &[f32], blocks: &mut [BlockQ8_0]) -> RowQuant {
    use candle_core::quantized::k_quants::GgmlType;
    BlockQ8_0::from_float(x, blocks);
    let raw = raw8(blocks);
    let scales = raw.iter().map(|b| b.d.to_f32()).collect();
    let offset = raw
        .iter()
        .map(|b| std::array::from_fn(|k| (b.qs[k] as u8) ^ 0x80))
        .collect();
    let sums = raw
        .iter()
        .map(|b| b.qs.iter().map(|&q| q as i32).sum())
        .collect();
    (scales, offset, sums)
}

/// Whether the tile kernels ([`dot_q8_tile`], [`crate::kq::dot_k_tile`]) run on this CPU.
pub fn has_tile() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        simd_level() == Simd::Vnni
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `R` activation rows with their per-block scales and sums interleaved
/// (`scales[i][r]` is row `r`'s block `i`), so a tile kernel loads them
/// together.
pub struct Group<'a, const R: usize> {
    /// The rows.
    pub rows: [Q8Row<'a>; R],
    /// Block scales, the rows side by side.
    pub scales: Vec<[f32; R]>,
    /// Block sums as f32 (exact: at most 32 · 128), the rows side by side.
    pub sums: Vec<[f32; R]>,
}

impl<'a, const R: usize> Group<'a, R> {
    /// Interleaves the scales and sums of `R` rows of `n` blocks.
    pub fn new(rows: [Q8Row<'a>; R], n: usize) -> Self {
        assert!(rows
            .iter()
            .all(|x| x.scales.len() >= n && x.offset.len() >= n && x.blocks.len() >= n));
        let scales = (0..n)
            .map(|i| std::array::from_fn(|r| rows[r].scales[i]))
            .collect();
        let sums = (0..n)
            .map(|i| std::array::from_fn(|r| rows[r].sums.get(i).map_or(0.0, |&s| s as f32)))
            .collect();
        Group { rows, scales, sums }
    }
}

/// Whether a `WR × XR` tile has a kernel: 4 × 4 or 2 × 8.
pub const fn tile_shape_ok(wr: usize, xr: usize) -> bool {
    matches!((wr, xr), (4, 4) | (2, 8))
}

/// `WR` weight rows × `XR` activation rows at once (4 × 4 or 2 × 8); the
/// same bits as [`dot_q8_rows`] for every dot product. Only call when
/// [`has_tile`] is true.
pub fn dot_q8_tile<const WR: usize, const XR: usize>(
    w: [&[BlockQ8_0]; WR],
    xs: &Group<'_, XR>,
) -> [[f32; XR]; WR] {
    assert!(has_tile(), "dot_q8_tile needs AVX-512 VNNI");
    assert!(tile_shape_ok(WR, XR), "no {WR} x {XR} tile");
    let n = w[0].len();
    assert!(w.iter().all(|r| r.len() == n) && xs.scales.len() >= n);
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: VNNI is present (asserted) and all lengths were checked
        // here and in `Group::new`.
        unsafe { vnni::tile(w.map(raw8), xs) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        unreachable!()
    }
}

/// `out[i] = dot(w, xs[i])` for up to four activation rows (same length as `w`).
pub fn dot_q8_rows(w: &[BlockQ8_0], xs: &[Q8Row<'_>], out: &mut [f32]) {
    let w = raw8(w);
    #[cfg(target_arch = "x86_64")]
    {
        let level = simd_level();
        if level != Simd::None {
            let mut i = 0;
            while i + 4 <= xs.len() {
                let r = [xs[i], xs[i + 1], xs[i + 2], xs[i + 3]];
                // SAFETY: the CPU has the features of `level`; all rows have
                // `w.len()` blocks.
                let v = unsafe {
                    match level {
                        Simd::Vnni => vnni::dot4(w, r),
                        _ => avx2::dot4(w, r),
                    }
                };
                out[i..i + 4].copy_from_slice(&v);
                i += 4;
            }
            while i < xs.len() {
                // SAFETY: as above.
                out[i] = unsafe {
                    match level {
                        Simd::Vnni => vnni::dot1(w, xs[i]),
                        _ => avx2::dot1(w, xs[i]),
                    }
                };
                i += 1;
            }
            return;
        }
    }
    for (o, x) in out.iter_mut().zip(xs) {
        *o = scalar_dot(w, *x);
    }
}

/// The same arithmetic as the SIMD kernels, lane by lane.
fn scalar_dot(w: &[RawQ8], x: Q8Row<'_>) -> f32 {
    let xb = raw8(x.blocks);
    let mut acc = [0f32; 8];
    for ((bw, bx), dx) in w.iter().zip(xb).zip(x.scales) {
        let d = bw.d.to_f32() * dx;
        for (l, a) in acc.iter_mut().enumerate() {
            let mut s = 0i32;
            for k in 4 * l..4 * l + 4 {
                s += bw.qs[k] as i32 * bx.qs[k] as i32;
            }
            *a = d.mul_add(s as f32, *a);
        }
    }
    hsum_scalar(acc)
}

/// The horizontal sum in the order the `_mm256` code below performs it.
pub(crate) fn hsum_scalar(a: [f32; 8]) -> f32 {
    let s = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    let t0 = s[0] + s[2];
    let t1 = s[1] + s[3];
    t0 + t1
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Simd {
    None,
    Avx2,
    Vnni,
}

/// Whether AVX2 and FMA kernels run on this CPU.
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx2() -> bool {
    simd_level() != Simd::None
}

#[cfg(target_arch = "x86_64")]
fn simd_level() -> Simd {
    use std::sync::OnceLock;
    static LEVEL: OnceLock<Simd> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
        let vnni = is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl");
        if std::env::var_os("STATEBENCH_NO_VNNI").is_some() {
            return if avx2 { Simd::Avx2 } else { Simd::None };
        }
        match (avx2, vnni) {
            (true, true) => Simd::Vnni,
            (true, false) => Simd::Avx2,
            _ => Simd::None,
        }
    })
}

/// Weight blocks to prefetch ahead of use (about 4 KiB): the tiled loops do so
/// much work per block that out-of-order execution alone keeps too few loads
/// in flight while weights stream from memory.
pub(crate) const PREFETCH: usize = 120;

/// Generates `dot1`/`dot4` for one instruction set; only the exact integer
/// block product differs between them, so all give the same bits.
#[cfg(target_arch = "x86_64")]
macro_rules! q8_kernels {
    ($features:literal, $block:ident) => {
        use super::{Q8Row, RawQ8};
        use std::arch::x86_64::*;

        #[target_feature(enable = $features)]
        unsafe fn hsum(x: __m256) -> f32 {
            // (a0+a4, a1+a5, a2+a6, a3+a7) -> (s0+s2, s1+s3) -> their sum.
            let s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_movehdup_ps(s));
            _mm_cvtss_f32(s)
        }

        #[target_feature(enable = $features)]
        pub(super) unsafe fn dot1(w: &[RawQ8], x: Q8Row<'_>) -> f32 {
            let xb = super::raw8(x.blocks);
            let mut acc = _mm256_setzero_ps();
            for (i, bw) in w.iter().enumerate() {
                let qw = _mm256_loadu_si256(bw.qs.as_ptr() as *const __m256i);
                let ax = _mm256_sign_epi8(qw, qw);
                let dw = bw.d.to_f32();
                let qx = _mm256_loadu_si256(xb[i].qs.as_ptr() as *const __m256i);
                let d = _mm256_set1_ps(dw * x.scales[i]);
                acc = _mm256_fmadd_ps(d, $block(ax, qw, qx), acc);
            }
            hsum(acc)
        }

        #[target_feature(enable = $features)]
        pub(super) unsafe fn dot4(w: &[RawQ8], x: [Q8Row<'_>; 4]) -> [f32; 4] {
            let xb = [
                super::raw8(x[0].blocks),
                super::raw8(x[1].blocks),
                super::raw8(x[2].blocks),
                super::raw8(x[3].blocks),
            ];
            let mut acc = [_mm256_setzero_ps(); 4];
            let n = w.len();
            assert!((0..4).all(|r| xb[r].len() >= n && x[r].scales.len() >= n));
            for (i, bw) in w.iter().enumerate() {
                _mm_prefetch::<_MM_HINT_T0>(
                    (bw as *const RawQ8).wrapping_add(super::PREFETCH) as *const i8
                );
                let qw = _mm256_loadu_si256(bw.qs.as_ptr() as *const __m256i);
                let ax = _mm256_sign_epi8(qw, qw);
                let dw = bw.d.to_f32();
                for r in 0..4 {
                    // SAFETY: `i < n` and every row has at least `n` blocks.
                    let qx = _mm256_loadu_si256(
                        xb.get_unchecked(r).get_unchecked(i).qs.as_ptr() as *const __m256i
                    );
                    let d = _mm256_set1_ps(dw * *x.get_unchecked(r).scales.get_unchecked(i));
                    acc[r] = _mm256_fmadd_ps(d, $block(ax, qw, qx), acc[r]);
                }
            }
            [hsum(acc[0]), hsum(acc[1]), hsum(acc[2]), hsum(acc[3])]
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    /// Exact integer dot of one block pair as eight i32 lanes of four products.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn block(ax: __m256i, qw: __m256i, qx: __m256i) -> __m256 {
        let sy = _mm256_sign_epi8(qx, qw);
        let dot = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1));
        _mm256_cvtepi32_ps(dot)
    }
    q8_kernels!("avx2,fma", block);
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use super::PREFETCH;
    /// The same eight i32 lanes as the AVX2 kernel, in one VNNI instruction.
    #[target_feature(enable = "avx2,fma,avx512vnni,avx512vl")]
    #[inline]
    unsafe fn block(ax: __m256i, qw: __m256i, qx: __m256i) -> __m256 {
        let sy = _mm256_sign_epi8(qx, qw);
        _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sy))
    }
    q8_kernels!("avx2,fma,avx512vnni,avx512vl", block);

    /// `WR × XR` tile. Activations are unsigned (`q + 128`), so one
    /// `vpdpbusd` per pair does the block product; starting its accumulator
    /// at `-128 · Σw` per lane leaves exactly the signed lanes of `block`.
    /// The scale products of a block (the same f32 products as `dw * dx`)
    /// are computed together and read back as broadcasts, which keeps the
    /// multiply pipes for the dot products.
    #[target_feature(enable = "avx2,fma,avx512vnni,avx512vl,f16c")]
    // The indices address several arrays at once.
    #[allow(clippy::needless_range_loop)]
    pub(crate) unsafe fn tile<const WR: usize, const XR: usize>(
        w: [&[RawQ8]; WR],
        x: &super::Group<'_, XR>,
    ) -> [[f32; XR]; WR] {
        let n = w[0].len();
        let c80 = _mm256_set1_epi8(0x80u8 as i8);
        let zero = _mm256_setzero_si256();
        let mut acc = [[_mm256_setzero_ps(); XR]; WR];
        let mut prod = [0f32; 32];
        for i in 0..n {
            let dx = x.scales.get_unchecked(i);
            let mut q = [zero; WR];
            let mut nc = [zero; WR];
            for j in 0..WR {
                let b = w.get_unchecked(j).get_unchecked(i);
                _mm_prefetch::<_MM_HINT_T0>((b as *const RawQ8).wrapping_add(PREFETCH) as *const i8);
                q[j] = _mm256_loadu_si256(b.qs.as_ptr() as *const __m256i);
                nc[j] = _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, c80, q[j]));
                let dw = b.d.to_f32();
                for r in 0..XR {
                    *prod.get_unchecked_mut(j * XR + r) = dw * *dx.get_unchecked(r);
                }
            }
            // Opaque to the optimiser, so the products are read back with
            // broadcast loads rather than rebuilt with shuffles.
            let prod = std::hint::black_box(&prod);
            for r in 0..XR {
                let xr = x.rows.get_unchecked(r);
                let xu = _mm256_loadu_si256(xr.offset.get_unchecked(i).as_ptr() as *const __m256i);
                for j in 0..WR {
                    let l = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(nc[j], xu, q[j]));
                    let d = _mm256_broadcast_ss(prod.get_unchecked(j * XR + r));
                    acc[j][r] = _mm256_fmadd_ps(d, l, acc[j][r]);
                }
            }
        }
        let mut out = [[0f32; XR]; WR];
        for j in 0..WR {
            for r in 0..XR {
                out[j][r] = hsum(acc[j][r]);
            }
        }
        out
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
    fn widening_is_exact_and_kernels_agree() {
        let n = 896;
        let w: Vec<f32> = (0..n)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
            .collect();
        let xs: Vec<Vec<BlockQ8_0>> = (0..6)
            .map(|r| {
                let x: Vec<f32> = (0..n)
                    .map(|i| ((i * 13 + r) % 29) as f32 / 14.0 - 1.0)
                    .collect();
                blocks(&x)
            })
            .collect();
        let q5: Vec<BlockQ5_0> = blocks(&w);
        let wide = widen_q5_0(&q5);
        let mut a = vec![0f32; n];
        let mut b = vec![0f32; n];
        BlockQ5_0::to_float(&q5, &mut a);
        BlockQ8_0::to_float(&wide, &mut b);
        assert_eq!(a, b, "Q5_0 widening must be exact");
        let q4: Vec<BlockQ4_0> = blocks(&w);
        BlockQ4_0::to_float(&q4, &mut a);
        BlockQ8_0::to_float(&widen_q4_0(&q4), &mut b);
        assert_eq!(a, b, "Q4_0 widening must be exact");

        let scales: Vec<Vec<f32>> = xs
            .iter()
            .map(|x| raw8(x).iter().map(|b| b.d.to_f32()).collect())
            .collect();
        let offsets: Vec<Vec<[u8; 32]>> = xs
            .iter()
            .map(|x| {
                raw8(x)
                    .iter()
                    .map(|b| std::array::from_fn(|k| (b.qs[k] as u8) ^ 0x80))
                    .collect()
            })
            .collect();
        let rows: Vec<Q8Row<'_>> = xs
            .iter()
            .zip(&scales)
            .zip(&offsets)
            .map(|((b, s), o)| Q8Row {
                blocks: b,
                scales: s,
                offset: o,
                sums: &[],
            })
            .collect();
        let mut all = vec![0f32; 6];
        dot_q8_rows(&wide, &rows, &mut all);
        for (i, r) in rows.iter().enumerate() {
            let mut one = [0f32];
            dot_q8_rows(&wide, &[*r], &mut one);
            assert_eq!(one[0], all[i]);
            assert_eq!(scalar_dot(raw8(&wide), *r), all[i], "scalar emulation");
            let stock = BlockQ8_0::vec_dot(n, &wide, r.blocks);
            assert!((stock - all[i]).abs() <= 1e-3 * stock.abs().max(1.0));
        }
        if has_tile() {
            let ws: Vec<Vec<BlockQ8_0>> = (0..4)
                .map(|j| {
                    let w: Vec<f32> = (0..n)
                        .map(|i| ((i * (53 + 10 * j)) % 97) as f32 / 40.0 - 1.2)
                        .collect();
                    widen_q5_0(&blocks::<BlockQ5_0>(&w))
                })
                .collect();
            let rows8: [Q8Row<'_>; 8] = std::array::from_fn(|r| rows[r % rows.len()]);
            let single = |wj: &[BlockQ8_0], xs: &[Q8Row<'_>]| {
                let mut v = vec![0f32; xs.len()];
                dot_q8_rows(wj, xs, &mut v);
                v
            };
            for first in [0, 2] {
                let quad = Group::new(std::array::from_fn(|r| rows[first + r]), n / 32);
                let t = dot_q8_tile::<4, 4>(std::array::from_fn(|j| ws[j].as_slice()), &quad);
                for (j, wj) in ws.iter().enumerate() {
                    assert_eq!(
                        t[j].to_vec(),
                        single(wj, &rows[first..first + 4]),
                        "4x4 row {j}"
                    );
                }
            }
            let eight = Group::new(rows8, n / 32);
            let t = dot_q8_tile::<2, 8>([&ws[1], &ws[3]], &eight);
            assert_eq!(t[0].to_vec(), single(&ws[1], &rows8), "2x8 row 0");
            assert_eq!(t[1].to_vec(), single(&ws[3], &rows8), "2x8 row 1");
        }
    }
}
