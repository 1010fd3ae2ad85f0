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

/// RMSNorm of one row in place: `x * rsqrt(mean(x²) + eps) * weight`.
pub fn rms_norm(x: &mut [f32], weight: &[f32], eps: f32) {
    let ss = dot_f32(x, x);
    let scale = 1.0 / (ss / x.len() as f32 + eps).sqrt();
    for (v, w) in x.iter_mut().zip(weight) {
        *v = (*v * scale) * w;
    }
}

/// `gate <- silu(gate) * up`, the SwiGLU activation.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        let s = *g / (1.0 + (-*g).exp());
        *g = s * u;
    }
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
