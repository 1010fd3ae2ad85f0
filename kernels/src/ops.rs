//! Element-wise and per-row operations: dot product, RMSNorm, RoPE, SwiGLU.

/// Lanes of the fixed-order f32 dot product; wide enough for AVX-512 to vectorise.
const LANES: usize = 16;

/// Dot product of two equal-length f32 slices with a fixed summation order:
/// sixteen interleaved partial sums, then a fixed pairwise tree, then the tail.
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    dot(a, b)
}

/// A weight element that widens to f32 exactly.
pub trait Float: Copy + Send + Sync {
    /// The value as f32 (exact).
    fn f32(self) -> f32;
    /// Sixteen values at `p` as f32 lanes (exact).
    ///
    /// # Safety
    /// The sixteen-lane kernels run ([`crate::cpu::wide_lanes`]); `p` points
    /// at sixteen values.
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    #[doc(hidden)]
    unsafe fn load16(p: *const Self) -> F32x16;
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use crate::lanes::{self, F32x16};

impl Float for f32 {
    #[inline]
    fn f32(self) -> f32 {
        self
    }
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> F32x16 {
        lanes::load(p)
    }
}

/// bf16 bits: the top half of the f32's, so widening is a shift.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(transparent)]
pub struct Bf16(pub u16);

impl Float for Bf16 {
    #[inline]
    fn f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> F32x16 {
        use std::arch::x86_64::*;
        let h = _mm256_loadu_si256(p as *const __m256i);
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
    }
    #[cfg(target_arch = "aarch64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> F32x16 {
        use std::arch::aarch64::*;
        let (a, b) = (
            vld1q_u16(p as *const u16),
            vld1q_u16((p as *const u16).add(8)),
        );
        let wide = |h: uint32x4_t| vreinterpretq_f32_u32(h);
        F32x16([
            wide(vshll_n_u16::<16>(vget_low_u16(a))),
            wide(vshll_high_n_u16::<16>(a)),
            wide(vshll_n_u16::<16>(vget_low_u16(b))),
            wide(vshll_high_n_u16::<16>(b)),
        ])
    }
}

impl Float for half::f16 {
    #[inline]
    fn f32(self) -> f32 {
        self.to_f32()
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> F32x16 {
        use std::arch::x86_64::*;
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }
    #[cfg(target_arch = "aarch64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> F32x16 {
        let p = p as *const u16;
        let (a, b) = crate::q8::neon::f16x8(p);
        let (c, d) = crate::q8::neon::f16x8(p.add(8));
        F32x16([a, b, c, d])
    }
}

/// [`dot_f32`] with the weights `a` stored as `E` and widened to f32 as they
/// are read: the same operations in the same order, so the same bits as
/// widening `a` first.
#[inline]
pub fn dot<E: Float>(a: &[E], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; LANES];
    let chunks = n / LANES;
    for c in 0..chunks {
        let xa = &a[c * LANES..c * LANES + LANES];
        let xb = &b[c * LANES..c * LANES + LANES];
        for l in 0..LANES {
            acc[l] = xa[l].f32().mul_add(xb[l], acc[l]);
        }
    }
    finish(acc, &a[chunks * LANES..], &b[chunks * LANES..])
}

/// The end of [`dot`]: the lanes summed by a fixed pairwise tree, then the
/// tail one element at a time.
#[inline]
fn finish<E: Float>(mut acc: [f32; LANES], a: &[E], b: &[f32]) -> f32 {
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for l in 0..width {
            acc[l] += acc[l + width];
        }
    }
    let mut sum = acc[0];
    for (x, y) in a.iter().zip(b) {
        sum = x.f32().mul_add(*y, sum);
    }
    sum
}

/// [`dot`] of `WR` weight rows with `XR` activation rows at once (each
/// weight widened once for all of them, `WR · XR` independent sums in
/// flight); every result has [`dot`]'s bits.
#[inline]
pub fn dots<E: Float, const WR: usize, const XR: usize>(
    ws: [&[E]; WR],
    xs: [&[f32]; XR],
) -> [[f32; XR]; WR] {
    let n = ws[0].len();
    assert!(
        ws.iter().all(|w| w.len() == n) && xs.iter().all(|x| x.len() == n),
        "row lengths"
    );
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    if crate::cpu::wide_lanes() {
        // SAFETY: the CPU has the lanes' instructions; the lengths were checked.
        return unsafe { dots_wide(ws, xs) };
    }
    ws.map(|w| xs.map(|x| dot(w, x)))
}

#[cfg(target_arch = "x86_64")]
pub(crate) use crate::cpu::avx512;

/// [`dots`] in sixteen-lane registers: lane `l` is [`dot`]'s partial sum `l`.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx512f"))]
unsafe fn dots_wide<E: Float, const WR: usize, const XR: usize>(
    ws: [&[E]; WR],
    xs: [&[f32]; XR],
) -> [[f32; XR]; WR] {
    let n = ws[0].len();
    let chunks = n / LANES;
    let mut acc = [[lanes::zero(); XR]; WR];
    for c in 0..chunks {
        let x: [F32x16; XR] = std::array::from_fn(|r| lanes::load(xs[r].as_ptr().add(c * LANES)));
        for (k, w) in ws.iter().enumerate() {
            let w = E::load16(w.as_ptr().add(c * LANES));
            for r in 0..XR {
                acc[k][r] = lanes::fma(w, x[r], acc[k][r]);
            }
        }
    }
    std::array::from_fn(|k| {
        std::array::from_fn(|r| {
            let lanes = lanes::to_array(acc[k][r]);
            finish(lanes, &ws[k][chunks * LANES..], &xs[r][chunks * LANES..])
        })
    })
}

/// `e^x` to about 1 ulp (Cephes polynomial), branch-free so loops over it
/// vectorise; the libm call it replaces dominated attention at long contexts.
#[inline]
pub fn exp_approx(x: f32) -> f32 {
    let x = x.clamp(-87.0, 88.0);
    let n = (x * EXP_LOG2E).round();
    let r = n.mul_add(-EXP_LN2_LO, n.mul_add(-EXP_LN2_HI, x));
    let mut p = EXP_POLY[0];
    for &k in &EXP_POLY[1..] {
        p = p.mul_add(r, k);
    }
    let y = (p * r).mul_add(r, r) + 1.0;
    y * f32::from_bits(((n as i32 + 127) << 23) as u32)
}

pub(crate) const EXP_LOG2E: f32 = std::f32::consts::LOG2_E;
pub(crate) const EXP_LN2_HI: f32 = 0.693_359_4;
pub(crate) const EXP_LN2_LO: f32 = -2.121_944_4e-4;
/// Coefficients of `(eʳ − 1 − r) / r²`, highest degree first.
pub(crate) const EXP_POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];

/// `t.round()` (half away from zero) of sixteen values as i32, computed as
/// `trunc(t + copysign(0.49999997, t))`: equal for every f32 of magnitude up
/// to 128 (checked exhaustively: 2,248,146,946 values), which callers keep to.
///
/// # Safety
/// The CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn round_small(t: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    let half = _mm512_set1_epi32(0.5f32.to_bits() as i32 - 1);
    let sign = _mm512_and_si512(_mm512_castps_si512(t), _mm512_set1_epi32(i32::MIN));
    _mm512_cvttps_epi32(_mm512_add_ps(
        t,
        _mm512_castsi512_ps(_mm512_or_si512(half, sign)),
    ))
}

/// [`round_small`] of eight values, for the `avx2` family.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn round_small8(t: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let half = _mm256_set1_epi32(0.5f32.to_bits() as i32 - 1);
    let sign = _mm256_and_si256(_mm256_castps_si256(t), _mm256_set1_epi32(i32::MIN));
    _mm256_cvttps_epi32(_mm256_add_ps(
        t,
        _mm256_castsi256_ps(_mm256_or_si256(half, sign)),
    ))
}

/// RMSNorm of one row in place: `x * rsqrt(mean(x²) + eps) * weight`.
pub fn rms_norm(x: &mut [f32], weight: &[f32], eps: f32) {
    let ss = dot_f32(x, x);
    let scale = 1.0 / (ss / x.len() as f32 + eps).sqrt();
    for (v, w) in x.iter_mut().zip(weight) {
        *v = (*v * scale) * w;
    }
}

/// `gate <- silu(gate) * up`, the SwiGLU activation: `g / (1 + e^-g) · u`
/// with [`expf`], sixteen values at a time where the CPU has AVX-512 (the
/// same operations, so the same bits).
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "SwiGLU halves");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the CPU has AVX-512F; the lengths were checked.
    let done = if crate::cpu::avx512() {
        unsafe { silu_mul_avx512(gate, up) }
    } else {
        0
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    for (g, u) in gate[done..].iter_mut().zip(&up[done..]) {
        let s = *g / (1.0 + expf(-*g));
        *g = s * u;
    }
}

/// [`silu_mul`] of the whole sixteens of `gate`; returns how many values it
/// did.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn silu_mul_avx512(gate: &mut [f32], up: &[f32]) -> usize {
    use std::arch::x86_64::*;
    let n = gate.len() / 16 * 16;
    let one = _mm512_set1_ps(1.0);
    for i in (0..n).step_by(16) {
        let g = _mm512_loadu_ps(gate.as_ptr().add(i));
        let u = _mm512_loadu_ps(up.as_ptr().add(i));
        let minus = _mm512_castsi512_ps(_mm512_xor_si512(
            _mm512_castps_si512(g),
            _mm512_set1_epi32(i32::MIN),
        ));
        let s = _mm512_div_ps(g, _mm512_add_ps(one, expf16(minus)));
        _mm512_storeu_ps(gate.as_mut_ptr().add(i), _mm512_mul_ps(s, u));
    }
    n
}

/// `e^x` for SwiGLU, computed as glibc's `expf` (2.27 and later, built with
/// FMA) computes it: `x · 32 / ln 2 = k + r` in double precision, then
/// `2^(k/32)` from a table times a cubic in `r`, rounded once to f32. The
/// same bits as that libm on every one of the 2³² inputs (checked), but
/// ours: the platform's `expf` differs between libms, and between glibc's
/// FMA and SSE2 builds, so calling it tied results to the host; written out,
/// it also vectorises (sixteen lanes in `silu_mul`).
pub fn expf(x: f32) -> f32 {
    let top = (x.to_bits() >> 20) & 0x7ff;
    if top >= EXPF_BIG_TOP {
        if let Some(v) = expf_edge(x) {
            return v;
        }
    }
    let xd = x as f64;
    let shifted = EXPF_INV_LN2_N.mul_add(xd, EXPF_SHIFT);
    let ki = shifted.to_bits();
    let kd = shifted - EXPF_SHIFT;
    let r = EXPF_INV_LN2_N.mul_add(xd, -kd);
    let s = f64::from_bits(EXPF_TABLE[(ki % 32) as usize].wrapping_add(ki << 47));
    let [c0, c1, c2] = EXPF_POLY;
    let z = c0.mul_add(r, c1);
    let r2 = r * r;
    let y = c2.mul_add(r, 1.0);
    let y = z.mul_add(r2, y);
    (y * s) as f32
}

/// [`expf`] where `|x| ≥ 88` or `x` is NaN: the values that do not come
/// from the table, or `None` for those that do.
fn expf_edge(x: f32) -> Option<f32> {
    if x.is_nan() {
        Some(x + x)
    } else if x > EXPF_OVERFLOW {
        Some(f32::INFINITY)
    } else if x < EXPF_UNDERFLOW {
        Some(0.0)
    } else if x < EXPF_TINY {
        // glibc's "may underflow" value: the least subnormal.
        Some(f32::from_bits(1))
    } else {
        None
    }
}

/// The top twelve bits (sign aside) from which [`expf`] checks the edges:
/// those of 88.0.
const EXPF_BIG_TOP: u32 = 0x42b;
/// Above `ln 2¹²⁸`: infinity.
const EXPF_OVERFLOW: f32 = f32::from_bits(0x42b1_7217);
/// Below `ln 2⁻¹⁵⁰`: zero.
const EXPF_UNDERFLOW: f32 = f32::from_bits(0xc2cf_f1b4);
/// Below `ln 2⁻¹⁴⁹`: the least subnormal.
const EXPF_TINY: f32 = f32::from_bits(0xc2ce_8ecf);
/// `32 / ln 2`.
const EXPF_INV_LN2_N: f64 = f64::from_bits(0x4047_1547_652b_82fe);
/// `1.5 · 2⁵²`: adding it rounds to an integer, which its low bits then hold.
const EXPF_SHIFT: f64 = f64::from_bits(0x4338_0000_0000_0000);
/// The cubic's coefficients for `r` in units of `ln 2 / 32`, highest first.
const EXPF_POLY: [f64; 3] = [
    f64::from_bits(0x3ebc_6af8_4b91_2394),
    f64::from_bits(0x3f2e_bfce_50fa_c4f3),
    f64::from_bits(0x3f96_2e42_ff0c_52d6),
];
/// `2^(i/32)` rounded to f64, as bits, minus `i << 47` (the table index's
/// share of the exponent field, added back with `k`).
static EXPF_TABLE: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];

/// [`expf`] of sixteen values, operation for operation: two halves of
/// eight doubles, the table read by two-register permutes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn expf16(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let table = |i: usize| _mm512_loadu_si512(EXPF_TABLE.as_ptr().add(8 * i) as *const _);
    let (t0, t1, t2, t3) = (table(0), table(1), table(2), table(3));
    let inv = _mm512_set1_pd(EXPF_INV_LN2_N);
    let shift = _mm512_set1_pd(EXPF_SHIFT);
    let [c0, c1, c2] = EXPF_POLY.map(|c| _mm512_set1_pd(c));
    let half = |xh: __m256| {
        let xd = _mm512_cvtps_pd(xh);
        let shifted = _mm512_fmadd_pd(inv, xd, shift);
        let ki = _mm512_castpd_si512(shifted);
        let kd = _mm512_sub_pd(shifted, shift);
        let r = _mm512_fmsub_pd(inv, xd, kd);
        // Entries 0..16 or 16..32 by bit 4 of the index, each by its bits 0..4.
        let low = _mm512_permutex2var_epi64(t0, ki, t1);
        let high = _mm512_permutex2var_epi64(t2, ki, t3);
        let upper = _mm512_test_epi64_mask(ki, _mm512_set1_epi64(16));
        let t = _mm512_mask_blend_epi64(upper, low, high);
        let s = _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64::<47>(ki)));
        let z = _mm512_fmadd_pd(c0, r, c1);
        let r2 = _mm512_mul_pd(r, r);
        let y = _mm512_fmadd_pd(c2, r, _mm512_set1_pd(1.0));
        let y = _mm512_fmadd_pd(z, r2, y);
        _mm512_cvtpd_ps(_mm512_mul_pd(y, s))
    };
    let lo = half(_mm512_castps512_ps256(x));
    let hi = half(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
        _mm512_castps_pd(x),
    )));
    let y = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
        _mm512_castps_pd(_mm512_castps256_ps512(lo)),
        _mm256_castps_pd(hi),
    ));
    // The edges, as `expf_edge` orders them (each mask overrides the ones
    // before it; NaN compares false in all but the last).
    let below = |c: f32| _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(c));
    let least = _mm512_castsi512_ps(_mm512_set1_epi32(1));
    let y = _mm512_mask_blend_ps(below(EXPF_TINY), y, least);
    let y = _mm512_mask_blend_ps(below(EXPF_UNDERFLOW), y, _mm512_setzero_ps());
    let over = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, _mm512_set1_ps(EXPF_OVERFLOW));
    let y = _mm512_mask_blend_ps(over, y, _mm512_set1_ps(f32::INFINITY));
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
    _mm512_mask_blend_ps(nan, y, _mm512_add_ps(x, x))
}

/// Precomputed cos/sin for rotary position embeddings ("rotate half" layout).
pub struct RopeTable {
    half: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
    max_pos: usize,
}

impl RopeTable {
    /// Builds the table for `max_pos` positions; angles are computed in f32 the
    /// way the reference implementation does, so logits agree closely.
    pub fn new(head_dim: usize, theta: f32, max_pos: usize) -> Self {
        let half = head_dim / 2;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| 1.0 / theta.powf((2 * i) as f32 / head_dim as f32))
            .collect();
        let mut cos = Vec::with_capacity(max_pos * half);
        let mut sin = Vec::with_capacity(max_pos * half);
        for p in 0..max_pos {
            for f in &inv_freq {
                let a = p as f32 * f;
                cos.push(a.cos());
                sin.push(a.sin());
            }
        }
        Self {
            half,
            cos,
            sin,
            max_pos,
        }
    }

    /// Number of positions the table covers.
    pub fn max_pos(&self) -> usize {
        self.max_pos
    }

    /// Half the head dimension: the angles per position.
    pub fn half(&self) -> usize {
        self.half
    }

    /// cos of every angle, `max_pos × half` (for devices that keep their own copy).
    pub fn cos(&self) -> &[f32] {
        &self.cos
    }

    /// sin of every angle, `max_pos × half`.
    pub fn sin(&self) -> &[f32] {
        &self.sin
    }
}

/// Applies RoPE in place to `n_heads` consecutive heads of one row at `pos`.
pub fn rope_neox(x: &mut [f32], n_heads: usize, pos: usize, table: &RopeTable) {
    let half = table.half;
    let cos = &table.cos[pos * half..pos * half + half];
    let sin = &table.sin[pos * half..pos * half + half];
    for h in 0..n_heads {
        let head = &mut x[h * 2 * half..(h + 1) * 2 * half];
        for i in 0..half {
            let x0 = head[i];
            let x1 = head[i + half];
            head[i] = x0 * cos[i] - x1 * sin[i];
            head[i + half] = x1 * cos[i] + x0 * sin[i];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wide_path_equals_the_scalar_order() {
        for n in [5usize, 16, 200, 203] {
            let w: Vec<f32> = (0..n).map(|i| ((i * 37) % 29) as f32 / 7.0 - 2.0).collect();
            let xs: Vec<Vec<f32>> = (0..3)
                .map(|r| {
                    (0..n)
                        .map(|i| ((i * 13 + r) % 17) as f32 / 5.0 - 1.7)
                        .collect()
                })
                .collect();
            let x = [&xs[0][..], &xs[1][..], &xs[2][..]];
            let bf: Vec<Bf16> = w
                .iter()
                .map(|v| Bf16(half::bf16::from_f32(*v).to_bits()))
                .collect();
            let hf: Vec<half::f16> = w.iter().map(|v| half::f16::from_f32(*v)).collect();
            let w2: Vec<f32> = w.iter().rev().copied().collect();
            assert_eq!(
                dots([&w, &w2], x),
                [&w, &w2].map(|w| x.map(|x| dot(w, x))),
                "f32, {n}"
            );
            assert_eq!(dots([&bf], x), [x.map(|x| dot(&bf, x))], "bf16, {n}");
            assert_eq!(dots([&hf], x), [x.map(|x| dot(&hf, x))], "f16, {n}");
            let wide: Vec<f32> = bf.iter().map(|v| v.f32()).collect();
            assert_eq!(dots([&bf], x), dots([&wide], x), "bf16 widened first, {n}");
        }
    }

    /// `expf` against the platform's where that is glibc's (2.27 or later,
    /// which it was written from), on a spread of a million inputs and the
    /// edges; and the sixteen-lane path against `expf` on the same inputs.
    /// (All 2³² inputs were compared once, on x86-64 with FMA: equal.)
    #[test]
    fn expf_is_glibcs_and_every_path_agrees() {
        let edges = [
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MIN_POSITIVE,
            f32::from_bits(1),
            88.0,
            -88.0,
            EXPF_OVERFLOW,
            f32::from_bits(EXPF_OVERFLOW.to_bits() + 1),
            EXPF_UNDERFLOW,
            f32::from_bits(EXPF_UNDERFLOW.to_bits() + 1),
            f32::from_bits(EXPF_UNDERFLOW.to_bits() - 1),
            EXPF_TINY,
            f32::from_bits(EXPF_TINY.to_bits() + 1),
            f32::from_bits(EXPF_TINY.to_bits() - 1),
            -100.0,
            -1e-30,
            1e-30,
        ];
        let spread = (0..1u64 << 20).map(|i| f32::from_bits((i * 4099) as u32));
        let xs: Vec<f32> = edges.into_iter().chain(spread).collect();
        let ours: Vec<u32> = xs.iter().map(|&x| expf(x).to_bits()).collect();
        if cfg!(all(target_os = "linux", target_env = "gnu")) {
            for (x, &o) in xs.iter().zip(&ours) {
                let libm = x.exp();
                let same = libm.to_bits() == o || (libm.is_nan() && f32::from_bits(o).is_nan());
                assert!(same, "{x:e}: glibc {:08x}, ours {o:08x}", libm.to_bits());
            }
        }
        // SwiGLU of the same values through the sixteen-lane path and one by one.
        let up: Vec<f32> = (0..xs.len()).map(|i| (i % 7) as f32 - 3.0).collect();
        let mut wide = xs.clone();
        silu_mul(&mut wide, &up);
        let one_by_one: Vec<u32> = xs
            .iter()
            .zip(&up)
            .map(|(&g, &u)| ((g / (1.0 + f32::from_bits(expf(-g).to_bits()))) * u).to_bits())
            .collect();
        let wide: Vec<u32> = wide.iter().map(|v| v.to_bits()).collect();
        for (i, (a, b)) in wide.iter().zip(&one_by_one).enumerate() {
            let nan = f32::from_bits(*a).is_nan() && f32::from_bits(*b).is_nan();
            assert!(a == b || nan, "SwiGLU of {:e}: {a:08x} vs {b:08x}", xs[i]);
        }
    }

    #[test]
    fn exp_approx_is_accurate() {
        for i in -1990..=100 {
            let x = i as f32 * 0.0437;
            let (a, b) = (exp_approx(x), x.exp());
            assert!((a - b).abs() <= 4e-7 * b, "{x}: {a} vs {b}");
        }
        assert!(exp_approx(f32::NEG_INFINITY) < 1e-37);
    }

    #[test]
    fn dot_matches_naive_closely() {
        let a: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..37).map(|i| (i as f32 * 0.11).cos()).collect();
        let naive: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot_f32(&a, &b) - naive).abs() < 1e-5);
    }
}
