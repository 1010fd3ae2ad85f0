//! K-quant weights (Q4_K, Q6_K) in an exact 32-column form,
//! `w[j] = s[j / 16] · q[j] − m`, eight rows interleaved like [`crate::q8`]'s
//! weights (widened to it from the file's bits by [`crate::native`]).
//!
//! A block's dot product with a Q8_0 activation block is two exact integer
//! half-dots (columns 0..16 and 16..32) times their scales, minus
//! `m · dx · Σx`. As in [`crate::q8`], every path (VNNI, AVX2, NEON, scalar) performs the same f32
//! operations in the same order, so batching never changes a result.

#[cfg(target_arch = "x86_64")]
use crate::q8::TileBlock;
use crate::q8::{int_dots, slot, Packed, Q8Row};

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
            let sx = x.sx[i];
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
    unsafe fn vnni16(w: &[Self], t: &[TileBlock]) -> [[f32; 8]; 16] {
        simd::group16_vnni(w, t)
    }
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2<const XR: usize>(w: &[Self], xs: &[Q8Row<'_>; XR]) -> [[f32; 8]; XR] {
        simd::group_avx2(w, xs)
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

/// The NEON group kernels: [`crate::q8::neon`]'s integer dots, then the
/// scalar path's f32 steps, four rows a register.
#[cfg(target_arch = "aarch64")]
mod neon {
    use super::K8;
    use crate::q8::neon::{dots_plain, dots_sdot, load};
    use crate::q8::Q8Row;
    use std::arch::aarch64::*;

    macro_rules! k_group {
        ($name:ident, $(#[$attr:meta])* $dots:path) => {
            $(#[$attr])*
            pub(super) unsafe fn $name<const XR: usize>(
                w: &[K8],
                x: &[Q8Row<'_>; XR],
            ) -> [[f32; 8]; XR] {
                let z = vdupq_n_f32(0.0);
                let mut acc = [[z; 2]; XR];
                let mut corr = [[z; 2]; XR];
                let two = |v: &[f32; 8]| [vld1q_f32(v.as_ptr()), vld1q_f32(v.as_ptr().add(4))];
                for (i, b) in w.iter().enumerate() {
                    let (s0, s1, m) = (two(&b.s0), two(&b.s1), two(&b.m));
                    let q = load(&b.qs);
                    for r in 0..XR {
                        let xr = x.get_unchecked(r);
                        let [lo0, lo1, hi0, hi1] = $dots(&q, xr.qs.get_unchecked(i));
                        let (lo, hi) = ([lo0, lo1], [hi0, hi1]);
                        let dx = *xr.scales.get_unchecked(i);
                        let sx = vdupq_n_f32(*xr.sx.get_unchecked(i));
                        for h in 0..2 {
                            let a = vfmaq_f32(acc[r][h], vmulq_n_f32(s0[h], dx), vcvtq_f32_s32(lo[h]));
                            acc[r][h] = vfmaq_f32(a, vmulq_n_f32(s1[h], dx), vcvtq_f32_s32(hi[h]));
                            corr[r][h] = vfmaq_f32(corr[r][h], vmulq_n_f32(m[h], dx), sx);
                        }
                    }
                }
                std::array::from_fn(|r| {
                    let d = [0, 1].map(|h| vsubq_f32(acc[r][h], corr[r][h]));
                    std::mem::transmute::<[float32x4_t; 2], [f32; 8]>(d)
                })
            }
        };
    }

    k_group!(
        group_sdot,
        #[target_feature(enable = "dotprod")]
        dots_sdot
    );
    k_group!(group_plain, dots_plain);
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::K8;
    use crate::q8::{avx2, lanes, vnni, Q8Row, TileBlock};
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
                    crate::cpu::prefetch_ahead(b);
                    let s0 = _mm256_loadu_ps(b.s0.as_ptr());
                    let s1 = _mm256_loadu_ps(b.s1.as_ptr());
                    let m = _mm256_loadu_ps(b.m.as_ptr());
                    let $q = $load(&b.qs);
                    for r in 0..XR {
                        let xr = x.get_unchecked(r);
                        let $x = xr.qs.get_unchecked(i);
                        let $s = *xr.starts.get_unchecked(i);
                        let (lo, hi) = $dots;
                        let dx = _mm256_set1_ps(*xr.scales.get_unchecked(i));
                        let sx = _mm256_set1_ps(*xr.sx.get_unchecked(i));
                        let a =
                            _mm256_fmadd_ps(_mm256_mul_ps(s0, dx), _mm256_cvtepi32_ps(lo), acc[r]);
                        acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(s1, dx), _mm256_cvtepi32_ps(hi), a);
                        corr[r] = _mm256_fmadd_ps(_mm256_mul_ps(m, dx), sx, corr[r]);
                    }
                }
                for (a, c) in acc.iter_mut().zip(corr) {
                    *a = _mm256_sub_ps(*a, c);
                }
                lanes(acc)
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
        avx2::signed
    );

    /// [`group_vnni`] for the sixteen rows of a whole tile, each row's
    /// accumulator in a register of its own: the `acc` chains over the
    /// blocks, then the `corr` chains (each chain's operations and order
    /// as there; thirty-two accumulators do not fit the registers at once).
    /// 1.3× `group_vnni` on the MLP's down shape.
    #[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
    pub(super) unsafe fn group16_vnni(w: &[K8], t: &[TileBlock]) -> [[f32; 8]; 16] {
        let mut acc = [_mm256_setzero_ps(); 16];
        for (b, x) in w.iter().zip(t) {
            crate::cpu::prefetch_ahead(b);
            let s0 = _mm256_loadu_ps(b.s0.as_ptr());
            let s1 = _mm256_loadu_ps(b.s1.as_ptr());
            let q = avx2::load(&b.qs);
            macro_rules! row {
                ($r:literal) => {
                    let (lo, hi) = vnni::dots(&q, &x.qs[$r], [x.halves[0][$r], x.halves[1][$r]]);
                    let dx = _mm256_set1_ps(x.dx[$r]);
                    let a = _mm256_fmadd_ps(_mm256_mul_ps(s0, dx), _mm256_cvtepi32_ps(lo), acc[$r]);
                    acc[$r] = _mm256_fmadd_ps(_mm256_mul_ps(s1, dx), _mm256_cvtepi32_ps(hi), a);
                };
            }
            crate::q8::sixteen!(row);
        }
        let mut corr = [_mm256_setzero_ps(); 16];
        for (b, x) in w.iter().zip(t) {
            let m = _mm256_loadu_ps(b.m.as_ptr());
            macro_rules! row {
                ($r:literal) => {
                    let (dx, sx) = (_mm256_set1_ps(x.dx[$r]), _mm256_set1_ps(x.sx[$r]));
                    corr[$r] = _mm256_fmadd_ps(_mm256_mul_ps(m, dx), sx, corr[$r]);
                };
            }
            crate::q8::sixteen!(row);
        }
        for (a, c) in acc.iter_mut().zip(corr) {
            *a = _mm256_sub_ps(*a, c);
        }
        lanes(acc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::q8::Activations;

    /// Groups of `rows` rows of `bpr` blocks in the two forms the K-quants
    /// widen to: Q4_K's (values 0..16, an offset) and, `signed`, Q6_K's
    /// (values -32..32, no offset).
    fn groups(rows: usize, bpr: usize, signed: bool) -> Vec<K8> {
        let hash = |v: usize| v.wrapping_mul(2654435761) >> 7;
        let mut out = Vec::new();
        for g in 0..rows.div_ceil(8) {
            for i in 0..bpr {
                let at = |k: usize| (8 * g + k) * bpr + i;
                let scale =
                    |k: usize, salt: usize| (1 + hash(at(k) * 3 + salt) % 50) as f32 / 300.0;
                let mut b = K8 {
                    s0: std::array::from_fn(|k| scale(k, 0)),
                    s1: std::array::from_fn(|k| scale(k, 1)),
                    m: std::array::from_fn(|k| if signed { 0.0 } else { scale(k, 2) }),
                    qs: [0; 256],
                };
                for k in 0..8 {
                    for c in 0..32 {
                        let h = hash(32 * at(k) + c);
                        let q = if signed {
                            (h % 64) as i8 - 32
                        } else {
                            (h % 16) as i8
                        };
                        b.qs[slot(k, c)] = (q as u8) ^ 0x80;
                    }
                }
                out.push(b);
            }
        }
        out
    }

    #[test]
    fn every_path_agrees() {
        let (rows, cols) = (10, 512);
        let bpr = cols / 32;
        let x: Vec<f32> = (0..16 * cols)
            .map(|i| ((i * 13) % 29) as f32 / 14.0 - 1.0)
            .collect();
        let acts = Activations::quantize(&x, 16, cols);
        let all: [Q8Row<'_>; 16] = std::array::from_fn(|r| acts.row(r));
        let xs: [Q8Row<'_>; 8] = std::array::from_fn(|r| all[r]);
        for (name, signed) in [("q4k", false), ("q6k", true)] {
            let packed = groups(rows, bpr, signed);
            for g in 0..rows.div_ceil(8) {
                let wg = &packed[g * bpr..(g + 1) * bpr];
                let sixteen = K8::group(wg, &all);
                #[cfg(target_arch = "x86_64")]
                if crate::cpu::simd_level() == crate::cpu::Simd::Vnni {
                    let t = acts.whole_tile(0).expect("VNNI hosts read whole tiles");
                    let tiled = K8::tile_group(wg, t, &all);
                    assert_eq!(tiled, sixteen, "{name}: whole tile vs sixteen rows");
                }
                let eight = K8::group(wg, &xs);
                assert_eq!(eight, sixteen[..8], "{name}: eight rows vs sixteen");
                for r in 0..8 {
                    let one = K8::group(wg, &[xs[r]]);
                    assert_eq!(one[0], eight[r], "{name}: one row vs eight");
                    assert_eq!(K8::scalar(wg, xs[r]), one[0], "{name}: scalar emulation");
                    #[cfg(target_arch = "x86_64")]
                    if crate::cpu::simd_level() == crate::cpu::Simd::Vnni {
                        // SAFETY: VNNI implies AVX2, FMA and F16C were detected.
                        let avx = unsafe { simd::group_avx2(wg, &[xs[r]]) };
                        assert_eq!(avx[0], one[0], "{name}: AVX2 vs VNNI");
                    }
                    #[cfg(target_arch = "aarch64")]
                    if crate::cpu::dotprod() {
                        // SAFETY: the lengths were checked by `group`.
                        let plain = unsafe { neon::group_plain(wg, &[xs[r]]) };
                        assert_eq!(plain[0], one[0], "{name}: widening multiplies vs sdot");
                    }
                    for (kk, &got) in eight[r].iter().enumerate() {
                        let row = 8 * g + kk;
                        if row >= rows {
                            continue;
                        }
                        let mut w = vec![0f32; cols];
                        unpack_k_row(&packed, bpr, row, &mut w);
                        let (exact, scale) = w
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
