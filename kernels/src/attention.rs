//! Causal attention of one query row over its own sequence's KV cache.

use crate::ops::{dot_f32, exp_approx};

/// Attention of the query heads that share KV head `kvh` (grouped-query
/// attention), for one query row at position `len - 1` over cache positions
/// `0..len`.
///
/// `q` and `out` hold the group's heads (`group × head_dim`); `k` and `v` are
/// laid out `[position][kv_head][head_dim]`. Each key row is loaded once for
/// the whole group. Every reduction over keys runs sequentially in position
/// order, so a row gives the same bits whether it was computed during prefill
/// or as an incremental decode step, and whatever else is in the batch.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    len: usize,
    kvh: usize,
    n_kv_heads: usize,
    head_dim: usize,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let group = q.len() / head_dim;
    let kv_dim = n_kv_heads * head_dim;
    let scale = 1.0 / (head_dim as f32).sqrt();
    // scores[g * len + t]
    scores.clear();
    scores.resize(group * len, 0.0);
    for t in 0..len {
        let off = t * kv_dim + kvh * head_dim;
        let kt = &k[off..off + head_dim];
        for g in 0..group {
            scores[g * len + t] = dot_f32(&q[g * head_dim..(g + 1) * head_dim], kt) * scale;
        }
    }
    for g in 0..group {
        let s = &mut scores[g * len..(g + 1) * len];
        let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        for x in s.iter_mut() {
            *x = exp_approx(*x - max);
        }
        // A separate loop keeps the sum sequential in position order.
        let mut sum = 0f32;
        for x in s.iter() {
            sum += *x;
        }
        let inv = 1.0 / sum;
        for x in s.iter_mut() {
            *x *= inv;
        }
    }
    out.fill(0.0);
    for t in 0..len {
        let off = t * kv_dim + kvh * head_dim;
        let vt = &v[off..off + head_dim];
        for g in 0..group {
            let p = scores[g * len + t];
            for (o, x) in out[g * head_dim..(g + 1) * head_dim].iter_mut().zip(vt) {
                *o = p.mul_add(*x, *o);
            }
        }
    }
}
