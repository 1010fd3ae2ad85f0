//! Element-wise and per-row operations: dot product, RMSNorm, RoPE, SwiGLU.

/// Lanes of the fixed-order f32 dot product; wide enough for AVX-512 to vectorise.
pub const LANES: usize = 16;

/// Dot product of two equal-length f32 slices with a fixed summation order:
/// sixteen interleaved partial sums, then a fixed pairwise tree, then the tail.
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    dot(a, b)
}

/// A weight element that widens to f32 exactly.
pub trait Float: Copy + Send + Sync {
    /// The value as f32 (exact).
    fn f32(self) -> f32;
    /// Sixteen values as f32 (exact).
    #[inline]
    fn lanes(v: &[Self]) -> [f32; LANES] {
        std::array::from_fn(|l| v[l].f32())
    }
}

impl Float for f32 {
    #[inline]
    fn f32(self) -> f32 {
        self
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
}

impl Float for half::f16 {
    #[inline]
    fn f32(self) -> f32 {
        self.to_f32()
    }
    #[inline]
    fn lanes(v: &[Self]) -> [f32; LANES] {
        use half::slice::HalfFloatSliceExt;
        let mut out = [0f32; LANES];
        v[..LANES].convert_to_f32_slice(&mut out);
        out
    }
}

/// [`dot_f32`] with the weights `a` stored as `E` and widened in registers:
/// the same operations in the same order, so the same bits as widening `a`
/// to f32 first.
#[inline]
pub fn dot<E: Float>(a: &[E], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; LANES];
    let chunks = n / LANES;
    for c in 0..chunks {
        let xa = E::lanes(&a[c * LANES..c * LANES + LANES]);
        let xb = &b[c * LANES..c * LANES + LANES];
        for l in 0..LANES {
            acc[l] = xa[l].mul_add(xb[l], acc[l]);
        }
    }
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for l in 0..width {
            acc[l] += acc[l + width];
        }
    }
    let mut sum = acc[0];
    for i in chunks * LANES..n {
        sum = a[i].f32().mul_add(b[i], sum);
    }
    sum
}

/// `e^x` to about 1 ulp (Cephes polynomial), branch-free so loops over it
/// vectorise; the libm call it replaces dominated attention at long contexts.
#[inline]
pub fn exp_approx(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 88.0);
    let n = (x * LOG2E).round();
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, x));
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 0.5);
    let y = (p * r).mul_add(r, r) + 1.0;
    y * f32::from_bits(((n as i32 + 127) << 23) as u32)
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
