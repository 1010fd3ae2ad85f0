//! Sixteen f32 lanes: the width of the fixed-order sums (a dot product's
//! sixteen partial sums, a key block's sixteen positions). One AVX-512
//! register on x86-64, four NEON registers on aarch64; the kernels written
//! on them ([`crate::ops::dots`], attention's wide path) are one text for
//! both, and every operation here is the scalar path's, lane by lane.
//!
//! Every function is `#[inline(always)]` and unsafe: it runs inside a kernel
//! that has the instructions (`avx512f` on x86-64; NEON is part of every
//! aarch64 target).

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::*;
#[cfg(target_arch = "x86_64")]
pub use x86::{F32x16, I32x16};

#[cfg(target_arch = "aarch64")]
pub(crate) use arm::*;
#[cfg(target_arch = "aarch64")]
pub use arm::{F32x16, I32x16};

use crate::ops::{EXP_LN2_HI, EXP_LN2_LO, EXP_LOG2E, EXP_POLY};

/// [`crate::ops::exp_approx`] of sixteen values, operation for operation
/// (the same bits).
#[inline(always)]
pub(crate) unsafe fn exp(x: F32x16) -> F32x16 {
    let x = clamp(x, -87.0, 88.0);
    let ni = round(mul(x, splat(EXP_LOG2E)));
    let n = to_f32(ni);
    let r = fma(n, splat(-EXP_LN2_LO), fma(n, splat(-EXP_LN2_HI), x));
    let mut p = splat(EXP_POLY[0]);
    for &k in &EXP_POLY[1..] {
        p = fma(p, r, splat(k));
    }
    let y = add(fma(mul(p, r), r, r), splat(1.0));
    mul(y, pow2(ni))
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    pub type F32x16 = __m512;
    pub type I32x16 = __m512i;

    #[inline(always)]
    pub(crate) unsafe fn zero() -> F32x16 {
        _mm512_setzero_ps()
    }
    #[inline(always)]
    pub(crate) unsafe fn splat(v: f32) -> F32x16 {
        _mm512_set1_ps(v)
    }
    #[inline(always)]
    pub(crate) unsafe fn load(p: *const f32) -> F32x16 {
        _mm512_loadu_ps(p)
    }
    #[inline(always)]
    pub(crate) unsafe fn store(p: *mut f32, v: F32x16) {
        _mm512_storeu_ps(p, v)
    }
    /// `a · b + c`, rounded once (`f32::mul_add`).
    #[inline(always)]
    pub(crate) unsafe fn fma(a: F32x16, b: F32x16, c: F32x16) -> F32x16 {
        _mm512_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    pub(crate) unsafe fn add(a: F32x16, b: F32x16) -> F32x16 {
        _mm512_add_ps(a, b)
    }
    #[inline(always)]
    pub(crate) unsafe fn sub(a: F32x16, b: F32x16) -> F32x16 {
        _mm512_sub_ps(a, b)
    }
    #[inline(always)]
    pub(crate) unsafe fn mul(a: F32x16, b: F32x16) -> F32x16 {
        _mm512_mul_ps(a, b)
    }
    /// The larger of `a` and `m` where `m` holds no NaN; a NaN in `a` is
    /// passed over, as `f32::max` does.
    #[inline(always)]
    pub(crate) unsafe fn max(a: F32x16, m: F32x16) -> F32x16 {
        _mm512_max_ps(a, m)
    }
    /// The largest lane (of lanes holding no NaN).
    #[inline(always)]
    pub(crate) unsafe fn reduce_max(v: F32x16) -> f32 {
        _mm512_reduce_max_ps(v)
    }
    /// `f32::clamp`: the bounds first, so a NaN stays NaN.
    #[inline(always)]
    pub(crate) unsafe fn clamp(x: F32x16, lo: f32, hi: f32) -> F32x16 {
        _mm512_min_ps(_mm512_set1_ps(hi), _mm512_max_ps(_mm512_set1_ps(lo), x))
    }
    /// `f32::round` as i32, for magnitudes up to 128.
    #[inline(always)]
    pub(crate) unsafe fn round(x: F32x16) -> I32x16 {
        crate::ops::round_small(x)
    }
    #[inline(always)]
    pub(crate) unsafe fn to_f32(n: I32x16) -> F32x16 {
        _mm512_cvtepi32_ps(n)
    }
    /// `2ⁿ` for `n` in the normal exponent range.
    #[inline(always)]
    pub(crate) unsafe fn pow2(n: I32x16) -> F32x16 {
        _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(
            n,
            _mm512_set1_epi32(127),
        )))
    }
    /// Lanes `n..` set to zero.
    #[inline(always)]
    pub(crate) unsafe fn keep_first(v: F32x16, n: usize) -> F32x16 {
        let keep: __mmask16 = if n >= 16 { !0 } else { (1u16 << n) - 1 };
        _mm512_maskz_mov_ps(keep, v)
    }
    #[inline(always)]
    pub(crate) unsafe fn to_array(v: F32x16) -> [f32; 16] {
        std::mem::transmute::<F32x16, [f32; 16]>(v)
    }
}

#[cfg(target_arch = "aarch64")]
pub(crate) mod arm {
    use std::arch::aarch64::*;

    /// Lanes `4 i .. 4 i + 4` in register `i`.
    #[derive(Clone, Copy)]
    pub struct F32x16(pub(crate) [float32x4_t; 4]);
    #[derive(Clone, Copy)]
    pub struct I32x16([int32x4_t; 4]);

    #[inline(always)]
    fn each(f: impl Fn(usize) -> float32x4_t) -> F32x16 {
        F32x16([f(0), f(1), f(2), f(3)])
    }

    #[inline(always)]
    pub(crate) unsafe fn zero() -> F32x16 {
        splat(0.0)
    }
    #[inline(always)]
    pub(crate) unsafe fn splat(v: f32) -> F32x16 {
        F32x16([vdupq_n_f32(v); 4])
    }
    #[inline(always)]
    pub(crate) unsafe fn load(p: *const f32) -> F32x16 {
        each(|i| vld1q_f32(p.add(4 * i)))
    }
    #[inline(always)]
    pub(crate) unsafe fn store(p: *mut f32, v: F32x16) {
        for (i, r) in v.0.into_iter().enumerate() {
            vst1q_f32(p.add(4 * i), r);
        }
    }
    /// `a · b + c`, rounded once (`f32::mul_add`).
    #[inline(always)]
    pub(crate) unsafe fn fma(a: F32x16, b: F32x16, c: F32x16) -> F32x16 {
        each(|i| vfmaq_f32(c.0[i], a.0[i], b.0[i]))
    }
    #[inline(always)]
    pub(crate) unsafe fn add(a: F32x16, b: F32x16) -> F32x16 {
        each(|i| vaddq_f32(a.0[i], b.0[i]))
    }
    #[inline(always)]
    pub(crate) unsafe fn sub(a: F32x16, b: F32x16) -> F32x16 {
        each(|i| vsubq_f32(a.0[i], b.0[i]))
    }
    #[inline(always)]
    pub(crate) unsafe fn mul(a: F32x16, b: F32x16) -> F32x16 {
        each(|i| vmulq_f32(a.0[i], b.0[i]))
    }
    /// The larger of `a` and `m` where `m` holds no NaN; a NaN in `a` is
    /// passed over (`fmaxnm`), as `f32::max` does.
    #[inline(always)]
    pub(crate) unsafe fn max(a: F32x16, m: F32x16) -> F32x16 {
        each(|i| vmaxnmq_f32(a.0[i], m.0[i]))
    }
    /// The largest lane (of lanes holding no NaN).
    #[inline(always)]
    pub(crate) unsafe fn reduce_max(v: F32x16) -> f32 {
        let [a, b, c, d] = v.0;
        vmaxnmvq_f32(vmaxnmq_f32(vmaxnmq_f32(a, b), vmaxnmq_f32(c, d)))
    }
    /// `f32::clamp`: `fmax`/`fmin` carry a NaN through.
    #[inline(always)]
    pub(crate) unsafe fn clamp(x: F32x16, lo: f32, hi: f32) -> F32x16 {
        each(|i| vminq_f32(vdupq_n_f32(hi), vmaxq_f32(vdupq_n_f32(lo), x.0[i])))
    }
    /// `f32::round` as i32: `fcvtas` rounds half away from zero, as it does.
    #[inline(always)]
    pub(crate) unsafe fn round(x: F32x16) -> I32x16 {
        I32x16(x.0.map(|r| vcvtaq_s32_f32(r)))
    }
    #[inline(always)]
    pub(crate) unsafe fn to_f32(n: I32x16) -> F32x16 {
        each(|i| vcvtq_f32_s32(n.0[i]))
    }
    /// `2ⁿ` for `n` in the normal exponent range.
    #[inline(always)]
    pub(crate) unsafe fn pow2(n: I32x16) -> F32x16 {
        each(|i| vreinterpretq_f32_s32(vshlq_n_s32::<23>(vaddq_s32(n.0[i], vdupq_n_s32(127)))))
    }
    /// Lanes `n..` set to zero.
    #[inline(always)]
    pub(crate) unsafe fn keep_first(v: F32x16, n: usize) -> F32x16 {
        let n = vdupq_n_u32(n.min(16) as u32);
        let lane0: [u32; 4] = [0, 1, 2, 3];
        let lane0 = vld1q_u32(lane0.as_ptr());
        each(|i| {
            let live = vcltq_u32(vaddq_u32(lane0, vdupq_n_u32(4 * i as u32)), n);
            vreinterpretq_f32_u32(vandq_u32(live, vreinterpretq_u32_f32(v.0[i])))
        })
    }
    #[inline(always)]
    pub(crate) unsafe fn to_array(v: F32x16) -> [f32; 16] {
        std::mem::transmute::<[float32x4_t; 4], [f32; 16]>(v.0)
    }
}
