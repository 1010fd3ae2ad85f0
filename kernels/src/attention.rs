//! Causal attention of one query row over its own sequence's KV cache.

use crate::ops::dot_f32;

/// Attention for one query row at position `len - 1` over cache positions
/// `0..len`, grouped-query: query head `h` reads KV head `h / (n_heads / n_kv_heads)`.
///
/// `k` and `v` are laid out `[position][kv_head][head_dim]`. The reduction over
/// keys is sequential in position order, so a row gives the same bits whether
/// it was computed during prefill or as an incremental decode step.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    len: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let group = n_heads / n_kv_heads;
    let kv_dim = n_kv_heads * head_dim;
    let scale = 1.0 / (head_dim as f32).sqrt();
    scores.clear();
    scores.resize(len, 0.0);
    for h in 0..n_heads {
        let kvh = h / group;
        let qh = &q[h * head_dim..(h + 1) * head_dim];
        let mut max = f32::NEG_INFINITY;
        for (t, s) in scores.iter_mut().enumerate() {
            let off = t * kv_dim + kvh * head_dim;
            *s = dot_f32(qh, &k[off..off + head_dim]) * scale;
            if *s > max {
                max = *s;
            }
        }
        let mut sum = 0f32;
        for s in scores.iter_mut() {
            *s = (*s - max).exp();
            sum += *s;
        }
        let inv = 1.0 / sum;
        let oh = &mut out[h * head_dim..(h + 1) * head_dim];
        oh.fill(0.0);
        for (t, s) in scores.iter().enumerate() {
            let p = s * inv;
            let off = t * kv_dim + kvh * head_dim;
            for (o, x) in oh.iter_mut().zip(&v[off..off + head_dim]) {
                *o = p.mul_add(*x, *o);
            }
        }
    }
}
