//! K-quant weights (Q4_K, Q6_K) unpacked at load into an exact 32-element form,
//! `w[j] = s[j / 16] · q[j] − m`, then interleaved eight rows at a time like
//! [`crate::q8`]'s weights.
//!
//! A block's dot product with a Q8_0 activation block is two exact integer
//! half-dots (columns 0..16 and 16..32) times their scales, minus
//! `m · dx · Σx`. As in [`crate::q8`], every path performs the same f32
//! operations in the same order, so batching never changes a result.

use candle_core::quantized::k_quants::{BlockQ4K, BlockQ6K};

use crate::q8::{int_dots, interleave, put_row, slot, Packed, Q8Row};

/// 32 weights: `w[j] = s[j / 16] * q[j] - m`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KBlock {
    /// Scales of elements 0..16 and 16..32.
    pub s: [f32; 2],
    /// Offset subtracted from every element.
    pub m: f32,
    /// Integer values.
    pub qs: [i8; 32],
}

#[repr(C)]
struct RawQ4K {
    d: half::f16,
    dmin: half::f16,
    scales: [u8; 12],
    qs: [u8; 128],
}

#[repr(C)]
struct RawQ6K {
    ql: [u8; 128],
    qh: [u8; 64],
    scales: [i8; 16],
    d: half::f16,
}

const _: () = assert!(std::mem::size_of::<RawQ4K>() == std::mem::size_of::<BlockQ4K>());
const _: () = assert!(std::mem::size_of::<RawQ6K>() == std::mem::size_of::<BlockQ6K>());

fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Unpacks Q4_K super-blocks (8 sub-blocks of 32 with scale and min).
pub fn widen_q4k(xs: &[BlockQ4K]) -> Vec<KBlock> {
    // SAFETY: identical `repr(C)` layouts (size checked above).
    let xs = unsafe { std::slice::from_raw_parts(xs.as_ptr() as *const RawQ4K, xs.len()) };
    let mut out = Vec::with_capacity(xs.len() * 8);
    for b in xs {
        let (d, dmin) = (b.d.to_f32(), b.dmin.to_f32());
        for j in 0..4 {
            let q = &b.qs[32 * j..32 * j + 32];
            for (half, shift) in [(0usize, 0u8), (1, 4)] {
                let (sc, mn) = scale_min_k4(2 * j + half, &b.scales);
                let s = d * sc as f32;
                out.push(KBlock {
                    s: [s, s],
                    m: dmin * mn as f32,
                    qs: std::array::from_fn(|l| ((q[l] >> shift) & 0xF) as i8),
                });
            }
        }
    }
    out
}

/// Unpacks Q6_K super-blocks (16 sub-blocks of 16 with a scale each).
pub fn widen_q6k(xs: &[BlockQ6K]) -> Vec<KBlock> {
    // SAFETY: identical `repr(C)` layouts (size checked above).
    let xs = unsafe { std::slice::from_raw_parts(xs.as_ptr() as *const RawQ6K, xs.len()) };
    let mut out = Vec::with_capacity(xs.len() * 8);
    for b in xs {
        let d = b.d.to_f32();
        for idx in 0..2 {
            let ql = &b.ql[64 * idx..64 * idx + 64];
            let qh = &b.qh[32 * idx..32 * idx + 32];
            let sc = &b.scales[8 * idx..8 * idx + 8];
            for k in 0..4 {
                let qs = std::array::from_fn(|l| {
                    let (lo, hi) = match k {
                        0 => (ql[l] & 0xF, qh[l] & 3),
                        1 => (ql[l + 32] & 0xF, (qh[l] >> 2) & 3),
                        2 => (ql[l] >> 4, (qh[l] >> 4) & 3),
                        _ => (ql[l + 32] >> 4, (qh[l] >> 6) & 3),
                    };
                    (lo | (hi << 4)) as i8 - 32
                });
                out.push(KBlock {
                    s: [d * sc[2 * k] as f32, d * sc[2 * k + 1] as f32],
                    m: 0.0,
                    qs,
                });
            }
        }
    }
    out
}

/// Dequantizes blocks into `out` (same formula and rounding as the ggml
/// dequantizers); the tests' reference for the packed layout.
#[cfg(test)]
fn to_f32(xs: &[KBlock], out: &mut [f32]) {
    for (b, o) in xs.iter().zip(out.chunks_exact_mut(32)) {
        for (j, v) in o.iter_mut().enumerate() {
            *v = b.s[j / 16] * b.qs[j] as f32 - b.m;
        }
    }
}

/// Eight K-quant weight rows × one block of 32 columns, interleaved as in
/// [`crate::q8::Q8x8`]: `w = s[c / 16] · q − m` per row.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct K8 {
    /// Scales of columns 0..16, one per row.
    pub s0: [f32; 8],
    /// Scales of columns 16..32, one per row.
    pub s1: [f32; 8],
    /// Offsets, one per row.
    pub m: [f32; 8],
    /// `qs[32 g + 4 k + e]` is row `k`, column `4 g + e`, plus 128.
    pub qs: [u8; 256],
}

/// Interleaves rows of `bpr` unpacked blocks eight at a time (missing rows of
/// the last group are zero); ordered group by group, block by block.
pub fn pack_k(blocks: &[KBlock], rows: usize, bpr: usize) -> Vec<K8> {
    assert_eq!(
        blocks.len(),
        rows * bpr,
        "K blocks for {rows} rows of {bpr}"
    );
    let empty = K8 {
        s0: [0.0; 8],
        s1: [0.0; 8],
        m: [0.0; 8],
        qs: [128; 256],
    };
    interleave(rows, bpr, empty, |p, k, j| {
        let src = &blocks[j];
        (p.s0[k], p.s1[k], p.m[k]) = (src.s[0], src.s[1], src.m);
        put_row(&mut p.qs, k, &src.qs);
    })
}

/// Dequantizes row `r` of packed weights (the ggml formulas).
pub fn unpack_k_row(w: &[K8], bpr: usize, r: usize, out: &mut [f32]) {
    let (g, k) = (r / 8, r % 8);
    for (b, o) in w[g * bpr..(g + 1) * bpr]
        .iter()
        .zip(out.chunks_exact_mut(32))
    {
        for (c, v) in o.iter_mut().enumerate() {
            let q = ((b.qs[slot(k, c)] ^ 0x80) as i8) as f32;
            let s = if c < 16 { b.s0[k] } else { b.s1[k] };
            *v = s * q - b.m[k];
        }
    }
}

/// Per block: the two exact integer half-dots `lo`, `hi`, then
/// `acc = fma(s0·dx, lo, acc)`, `acc = fma(s1·dx, hi, acc)`,
/// `corr = fma(m·dx, Σx, corr)`; the result is `acc − corr`, on every path.
impl Packed for K8 {
    fn scalar(w: &[Self], x: Q8Row<'_>) -> [f32; 8] {
        let mut acc = [0f32; 8];
        let mut corr = [0f32; 8];
        for (i, b) in w.iter().enumerate() {
            let dx = x.scales[i];
            let sx = (x.sums[i][0] + x.sums[i][1]) as f32;
            for k in 0..8 {
                let [lo, hi] = int_dots(&b.qs, k, &x.qs[i]);
                acc[k] = (b.s0[k] * dx).mul_add(lo as f32, acc[k]);
                acc[k] = (b.s1[k] * dx).mul_add(hi as f32, acc[k]);
                corr[k] = (b.m[k] * dx).mul_add(sx, corr[k]);
            }
        }
        std::array::from_fn(|k| acc[k] - corr[k])
    }
    #[cfg(target_arch = "x86_64")]
    unsafe fn vnni<const XR: usize>(w: &[Self], xs: &[Q8Row<'_>; XR]) -> [[f32; 8]; XR] {
        simd::group_vnni(w, xs)
    }
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2<const XR: usize>(w: &[Self], xs: &[Q8Row<'_>; XR]) -> [[f32; 8]; XR] {
        simd::group_avx2(w, xs)
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::K8;
    use crate::q8::{avx2, vnni, Q8Row};
    use std::arch::x86_64::*;

    /// Generates the group kernel for one instruction set; only the integer
    /// half-dots differ between them, so both give the same bits.
    macro_rules! k_group {
        ($name:ident, $features:literal, |$q:ident, $x:ident, $s:ident| $dots:expr, $load:path) => {
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $name<const XR: usize>(
                w: &[K8],
                x: &[Q8Row<'_>; XR],
            ) -> [[f32; 8]; XR] {
                let mut acc = [_mm256_setzero_ps(); XR];
                let mut corr = [_mm256_setzero_ps(); XR];
                for (i, b) in w.iter().enumerate() {
                    let p = (b as *const K8 as *const i8).wrapping_add(crate::q8::PREFETCH);
                    for line in 0..6 {
                        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64 * line));
                    }
                    let s0 = _mm256_loadu_ps(b.s0.as_ptr());
                    let s1 = _mm256_loadu_ps(b.s1.as_ptr());
                    let m = _mm256_loadu_ps(b.m.as_ptr());
                    let $q = $load(&b.qs);
                    for r in 0..XR {
                        let xr = x.get_unchecked(r);
                        let $x = xr.qs.get_unchecked(i);
                        let $s = *xr.sums.get_unchecked(i);
                        let (lo, hi) = $dots;
                        let dx = _mm256_set1_ps(*xr.scales.get_unchecked(i));
                        let sx = _mm256_set1_ps(($s[0] + $s[1]) as f32);
                        let a =
                            _mm256_fmadd_ps(_mm256_mul_ps(s0, dx), _mm256_cvtepi32_ps(lo), acc[r]);
                        acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(s1, dx), _mm256_cvtepi32_ps(hi), a);
                        corr[r] = _mm256_fmadd_ps(_mm256_mul_ps(m, dx), sx, corr[r]);
                    }
                }
                std::array::from_fn(|r| {
                    std::mem::transmute::<__m256, [f32; 8]>(_mm256_sub_ps(acc[r], corr[r]))
                })
            }
        };
    }

    k_group!(
        group_vnni,
        "avx2,fma,f16c,avx512vnni,avx512vl",
        |q, x, s| vnni::dots(&q, x, s),
        avx2::load
    );
    k_group!(
        group_avx2,
        "avx2,fma,f16c",
        |q, x, _s| avx2::dots(&q, x),
        avx2::load
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::q8::Activations;
    use candle_core::quantized::k_quants::GgmlType;

    fn blocks<T: GgmlType>(v: &[f32]) -> Vec<T> {
        let mut b: Vec<T> = (0..v.len() / T::BLCK_SIZE).map(|_| T::zeros()).collect();
        T::from_float(v, &mut b);
        b
    }

    #[test]
    fn unpacking_and_packing_are_exact_and_every_path_agrees() {
        let (rows, cols) = (10, 512);
        let bpr = cols / 32;
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 0.9)
            .collect();
        let x: Vec<f32> = (0..8 * cols)
            .map(|i| ((i * 13) % 29) as f32 / 14.0 - 1.0)
            .collect();
        let acts = Activations::quantize(&x, 8, cols);
        let xs: [Q8Row<'_>; 8] = std::array::from_fn(|r| acts.row(r));
        let q4: Vec<BlockQ4K> = blocks(&w);
        let q6: Vec<BlockQ6K> = blocks(&w);
        for (name, k, stock) in [
            ("q4k", widen_q4k(&q4), {
                let mut v = vec![0f32; rows * cols];
                BlockQ4K::to_float(&q4, &mut v);
                v
            }),
            ("q6k", widen_q6k(&q6), {
                let mut v = vec![0f32; rows * cols];
                BlockQ6K::to_float(&q6, &mut v);
                v
            }),
        ] {
            let mut ours = vec![0f32; rows * cols];
            to_f32(&k, &mut ours);
            assert_eq!(ours, stock, "{name} unpacking must be exact");
            let packed = pack_k(&k, rows, bpr);
            for r in 0..rows {
                let mut row = vec![0f32; cols];
                unpack_k_row(&packed, bpr, r, &mut row);
                assert_eq!(
                    row,
                    stock[r * cols..(r + 1) * cols],
                    "{name} row {r} packed"
                );
            }
            for g in 0..rows.div_ceil(8) {
                let wg = &packed[g * bpr..(g + 1) * bpr];
                let eight = K8::group(wg, &xs);
                for r in 0..8 {
                    let one = K8::group(wg, &[xs[r]]);
                    assert_eq!(one[0], eight[r], "{name}: one row vs eight");
                    assert_eq!(K8::scalar(wg, xs[r]), one[0], "{name}: scalar emulation");
                    #[cfg(target_arch = "x86_64")]
                    if crate::q8::simd_level() == crate::q8::Simd::Vnni {
                        // SAFETY: VNNI implies AVX2, FMA and F16C were detected.
                        let avx = unsafe { simd::group_avx2(wg, &[xs[r]]) };
                        assert_eq!(avx[0], one[0], "{name}: AVX2 vs VNNI");
                    }
                    for (kk, &got) in eight[r].iter().enumerate() {
                        let row = 8 * g + kk;
                        if row >= rows {
                            continue;
                        }
                        let (exact, scale) = stock[row * cols..(row + 1) * cols]
                            .iter()
                            .zip(&x[r * cols..(r + 1) * cols])
                            .fold((0f32, 0f32), |(e, s), (a, b)| {
                                (e + a * b, s + (a * b).abs())
                            });
                        assert!(
                            (got - exact).abs() <= 0.01 * scale,
                            "{name} row {row}: {got} vs {exact}"
                        );
                    }
                }
            }
        }
    }
}
