//! K-quant weights (Q4_K, Q6_K) unpacked at load into an exact 32-element form
//! the batched integer kernels can use: `w[j] = s[j / 16] * q[j] - m`.
//!
//! The sub-block scales land on the kernels' lane boundaries (lanes 0–3 hold
//! elements 0–15, lanes 4–7 elements 16–31), so a block's dot product with a
//! Q8_0 activation block is eight exact integer lanes times two scales, minus
//! `m · dx · Σx`. As in [`crate::q8`], every path performs the same f32
//! operations in the same order, so batching never changes a result.

use candle_core::quantized::k_quants::{BlockQ4K, BlockQ6K};

use crate::q8::{Group, Q8Row};

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

/// Dequantizes blocks into `out` (same formula and rounding as the ggml dequantizers).
pub fn to_f32(xs: &[KBlock], out: &mut [f32]) {
    for (b, o) in xs.iter().zip(out.chunks_exact_mut(32)) {
        for (j, v) in o.iter_mut().enumerate() {
            *v = b.s[j / 16] * b.qs[j] as f32 - b.m;
        }
    }
}

/// `out[i] = dot(w, xs[i])` for up to four activation rows.
pub fn dot_k_rows(w: &[KBlock], xs: &[Q8Row<'_>], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::q8::has_avx2() {
        let mut i = 0;
        while i + 4 <= xs.len() {
            // SAFETY: AVX2 and FMA are present; lengths are checked inside.
            let v = unsafe { avx2::dot::<4>(w, [xs[i], xs[i + 1], xs[i + 2], xs[i + 3]]) };
            out[i..i + 4].copy_from_slice(&v);
            i += 4;
        }
        while i < xs.len() {
            // SAFETY: as above.
            let v = unsafe { avx2::dot::<1>(w, [xs[i]]) };
            out[i] = v[0];
            i += 1;
        }
        return;
    }
    for (o, x) in out.iter_mut().zip(xs) {
        *o = scalar_dot(w, *x);
    }
}

/// `WR` weight rows × `XR` activation rows (4 × 4 or 2 × 8); the same bits
/// as [`dot_k_rows`] for every dot product. Only call when
/// [`crate::q8::has_tile`] is true.
pub fn dot_k_tile<const WR: usize, const XR: usize>(
    w: [&[KBlock]; WR],
    xs: &Group<'_, XR>,
) -> [[f32; XR]; WR] {
    assert!(crate::q8::has_tile(), "dot_k_tile needs AVX-512 VNNI");
    assert!(crate::q8::tile_shape_ok(WR, XR), "no {WR} x {XR} tile");
    let n = w[0].len();
    assert!(w.iter().all(|r| r.len() == n) && xs.scales.len() >= n && xs.sums.len() >= n);
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: VNNI is present (asserted) and all lengths were checked
        // here and in `Group::new`.
        unsafe { vnni::tile(w, xs) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        unreachable!()
    }
}

/// The same arithmetic as the AVX2 kernel, lane by lane.
fn scalar_dot(w: &[KBlock], x: Q8Row<'_>) -> f32 {
    let mut acc = [0f32; 8];
    let mut corr = 0f32;
    for (i, bw) in w.iter().enumerate() {
        let xq = crate::q8::qs(&x.blocks[i]);
        let dx = x.scales[i];
        for (l, a) in acc.iter_mut().enumerate() {
            let s: i32 = bw.qs[4 * l..4 * l + 4]
                .iter()
                .zip(&xq[4 * l..4 * l + 4])
                .map(|(&a, &b)| a as i32 * b as i32)
                .sum();
            *a = (bw.s[l / 4] * dx).mul_add(s as f32, *a);
        }
        corr = (bw.m * dx).mul_add(x.sums[i] as f32, corr);
    }
    crate::q8::hsum_scalar(acc) - corr
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::KBlock;
    use crate::q8::Q8Row;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum(x: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot<const R: usize>(w: &[KBlock], x: [Q8Row<'_>; R]) -> [f32; R] {
        let n = w.len();
        assert!(x
            .iter()
            .all(|r| r.blocks.len() >= n && r.scales.len() >= n && r.sums.len() >= n));
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); R];
        let mut corr = [0f32; R];
        for (i, bw) in w.iter().enumerate() {
            // Fewer bytes ahead than the Q8_0 kernels: these blocks are larger.
            _mm_prefetch::<_MM_HINT_T0>((bw as *const KBlock).wrapping_add(90) as *const i8);
            let qw = _mm256_loadu_si256(bw.qs.as_ptr() as *const __m256i);
            let ax = _mm256_sign_epi8(qw, qw);
            let sv = _mm256_set_m128(_mm_set1_ps(bw.s[1]), _mm_set1_ps(bw.s[0]));
            for r in 0..R {
                let xr = x.get_unchecked(r);
                let xb = xr.blocks.get_unchecked(i);
                let qx = _mm256_loadu_si256(crate::q8::qs(xb).as_ptr() as *const __m256i);
                let dx = *xr.scales.get_unchecked(i);
                let sy = _mm256_sign_epi8(qx, qw);
                let lanes = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), ones);
                let d = _mm256_mul_ps(sv, _mm256_set1_ps(dx));
                acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes), acc[r]);
                corr[r] = (bw.m * dx).mul_add(*xr.sums.get_unchecked(i) as f32, corr[r]);
            }
        }
        std::array::from_fn(|r| hsum(acc[r]) - corr[r])
    }
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use super::KBlock;
    use crate::q8::Group;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum(x: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// `WR × XR` tile: the integer lanes by `vpdpbusd` on unsigned
    /// activations (as in `q8::vnni::tile`), the offset term `m · dx · Σx`
    /// four rows per 128-bit multiply and fused multiply-add, lane for lane
    /// the scalar operations of the AVX2 kernel.
    #[target_feature(enable = "avx2,fma,avx512vnni,avx512vl")]
    // The indices address several arrays at once.
    #[allow(clippy::needless_range_loop)]
    pub(super) unsafe fn tile<const WR: usize, const XR: usize>(
        w: [&[KBlock]; WR],
        x: &Group<'_, XR>,
    ) -> [[f32; XR]; WR] {
        let n = w[0].len();
        let c80 = _mm256_set1_epi8(0x80u8 as i8);
        let zero = _mm256_setzero_si256();
        let mut acc = [[_mm256_setzero_ps(); XR]; WR];
        // corr[j][c] holds rows 4c..4c+4 of weight row j.
        let mut corr = [[_mm_setzero_ps(); 2]; WR];
        for i in 0..n {
            let dx = x.scales.get_unchecked(i);
            let sums = x.sums.get_unchecked(i);
            let mut q = [zero; WR];
            let mut nc = [zero; WR];
            let mut sv = [_mm256_setzero_ps(); WR];
            for j in 0..WR {
                let b = w.get_unchecked(j).get_unchecked(i);
                _mm_prefetch::<_MM_HINT_T0>((b as *const KBlock).wrapping_add(90) as *const i8);
                q[j] = _mm256_loadu_si256(b.qs.as_ptr() as *const __m256i);
                nc[j] = _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, c80, q[j]));
                sv[j] = _mm256_set_m128(_mm_set1_ps(b.s[1]), _mm_set1_ps(b.s[0]));
                for c in 0..XR / 4 {
                    let dxv = _mm_loadu_ps(dx.as_ptr().add(4 * c));
                    let sv4 = _mm_loadu_ps(sums.as_ptr().add(4 * c));
                    let md = _mm_mul_ps(_mm_set1_ps(b.m), dxv);
                    corr[j][c] = _mm_fmadd_ps(md, sv4, corr[j][c]);
                }
            }
            for r in 0..XR {
                let xr = x.rows.get_unchecked(r);
                let xu = _mm256_loadu_si256(xr.offset.get_unchecked(i).as_ptr() as *const __m256i);
                let d = _mm256_set1_ps(*dx.get_unchecked(r));
                for j in 0..WR {
                    let l = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(nc[j], xu, q[j]));
                    acc[j][r] = _mm256_fmadd_ps(_mm256_mul_ps(sv[j], d), l, acc[j][r]);
                }
            }
        }
        let mut out = [[0f32; XR]; WR];
        for j in 0..WR {
            let mut c = [0f32; 8];
            _mm_storeu_ps(c.as_mut_ptr(), corr[j][0]);
            _mm_storeu_ps(c.as_mut_ptr().add(4), corr[j][1]);
            for r in 0..XR {
                out[j][r] = hsum(acc[j][r]) - c[r];
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::q8::quantize_row;
    use candle_core::quantized::k_quants::{BlockQ8_0, GgmlType};

    fn blocks<T: GgmlType>(v: &[f32]) -> Vec<T> {
        let mut b: Vec<T> = (0..v.len() / T::BLCK_SIZE).map(|_| T::zeros()).collect();
        T::from_float(v, &mut b);
        b
    }

    #[test]
    fn unpacking_is_exact_and_kernels_agree() {
        let n = 512;
        let w: Vec<f32> = (0..n)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 0.9)
            .collect();
        let x: Vec<f32> = (0..n)
            .map(|i| ((i * 13) % 29) as f32 / 14.0 - 1.0)
            .collect();
        let mut xq: Vec<BlockQ8_0> = (0..n / 32).map(|_| BlockQ8_0::zeros()).collect();
        let (scales, offset, sums) = quantize_row(&x, &mut xq);
        let row = Q8Row {
            blocks: &xq,
            scales: &scales,
            offset: &offset,
            sums: &sums,
        };
        let x2: Vec<f32> = x.iter().rev().map(|v| v * 0.7 + 0.05).collect();
        let mut xq2: Vec<BlockQ8_0> = (0..n / 32).map(|_| BlockQ8_0::zeros()).collect();
        let (scales2, offset2, sums2) = quantize_row(&x2, &mut xq2);
        let row2 = Q8Row {
            blocks: &xq2,
            scales: &scales2,
            offset: &offset2,
            sums: &sums2,
        };
        let q4: Vec<BlockQ4K> = blocks(&w);
        let q6: Vec<BlockQ6K> = blocks(&w);
        for (name, k, stock) in [
            ("q4k", widen_q4k(&q4), {
                let mut v = vec![0f32; n];
                BlockQ4K::to_float(&q4, &mut v);
                v
            }),
            ("q6k", widen_q6k(&q6), {
                let mut v = vec![0f32; n];
                BlockQ6K::to_float(&q6, &mut v);
                v
            }),
        ] {
            let mut ours = vec![0f32; n];
            to_f32(&k, &mut ours);
            assert_eq!(ours, stock, "{name} unpacking must be exact");
            let mut four = [0f32; 4];
            dot_k_rows(&k, &[row, row, row, row], &mut four);
            let mut one = [0f32];
            dot_k_rows(&k, &[row], &mut one);
            assert_eq!(one[0], four[2], "{name}: one row vs four");
            assert_eq!(scalar_dot(&k, row), one[0], "{name}: scalar emulation");
            if crate::q8::has_tile() {
                let ws: Vec<Vec<KBlock>> = (0..4)
                    .map(|j| {
                        let v: Vec<f32> =
                            w.iter().map(|a| a * (1.0 + j as f32 / 3.0) - 0.1).collect();
                        if name == "q4k" {
                            widen_q4k(&blocks::<BlockQ4K>(&v))
                        } else {
                            widen_q6k(&blocks::<BlockQ6K>(&v))
                        }
                    })
                    .collect();
                let xs = [row, row2, row, row2];
                let single = |wj: &[KBlock]| {
                    let mut v = [0f32; 4];
                    dot_k_rows(wj, &xs, &mut v);
                    v
                };
                let quad = Group::new(xs, n / 32);
                let t = dot_k_tile::<4, 4>(std::array::from_fn(|j| ws[j].as_slice()), &quad);
                for (j, wj) in ws.iter().enumerate() {
                    assert_eq!(t[j], single(wj), "{name}: 4x4 row {j}");
                }
                let eight = Group::new([row, row2, row, row2, row2, row, row2, row], n / 32);
                let t = dot_k_tile::<2, 8>([&ws[0], &ws[2]], &eight);
                for (jj, j) in [0, 2].into_iter().enumerate() {
                    let a = single(&ws[j]);
                    let want = [a[0], a[1], a[0], a[1], a[1], a[0], a[1], a[0]];
                    assert_eq!(t[jj], want, "{name}: 2x8 row {j}");
                }
            }
            let exact: f32 = stock.iter().zip(&x).map(|(a, b)| a * b).sum();
            assert!(
                (one[0] - exact).abs() < 0.02 * exact.abs().max(1.0),
                "{name}: {} vs {exact}",
                one[0]
            );
        }
    }
}
