//! Causal attention of query rows over their own sequence's KV cache.
//!
//! Keys are stored transposed in blocks of [`KEY_BLOCK`] positions
//! (`[block][kv_head][dim][lane]`), so one vector instruction advances the
//! scores of sixteen keys; values stay one row per position. Every reduction
//! has an order fixed by the row's position alone: a score is four
//! interleaved partial sums over the head dimensions, the softmax sum is
//! sixteen lane sums over blocks then a fixed tree, and the output
//! accumulates positions in order. So a row gives the same bits whether it
//! was computed during prefill or as an incremental decode step, and
//! whatever else is in the batch.

use std::ops::Range;

use crate::ops::exp_approx;

/// Positions per key block (one vector of lanes).
pub const KEY_BLOCK: usize = 16;

/// Floats of one key block for `n_kv_heads` heads of `head_dim`.
pub fn key_block_len(n_kv_heads: usize, head_dim: usize) -> usize {
    n_kv_heads * head_dim * KEY_BLOCK
}

/// Appends the keys of one position (`[kv_head][dim]`) at position `pos` of
/// a transposed key cache (which holds exactly the blocks for `0..pos`).
pub fn push_key(kt: &mut Vec<f32>, pos: usize, key: &[f32], n_kv_heads: usize, head_dim: usize) {
    let per = key_block_len(n_kv_heads, head_dim);
    if pos.is_multiple_of(KEY_BLOCK) {
        kt.resize(kt.len() + per, 0.0);
    }
    let base = (pos / KEY_BLOCK) * per;
    let lane = pos % KEY_BLOCK;
    for (i, &v) in key.iter().enumerate() {
        kt[base + i * KEY_BLOCK + lane] = v;
    }
}

/// Attention of the query heads that share KV head `kvh` (grouped-query
/// attention), for one query row at position `len - 1` over cache positions
/// `0..len`.
///
/// `q` and `out` hold the group's heads (`group × head_dim`); `kt` is the
/// transposed key cache, `v` the values laid out `[position][kv_head][head_dim]`.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    q: &[f32],
    kt: &[f32],
    v: &[f32],
    len: usize,
    kvh: usize,
    n_kv_heads: usize,
    head_dim: usize,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    attend_rows(
        &[q],
        &[len],
        kt,
        v,
        kvh..kvh + 1,
        n_kv_heads,
        head_dim,
        scores,
        &mut [out],
    );
}

/// [`attend`] for several query rows of one sequence at once (row `i` over
/// positions `0..lens[i]`) and the KV heads `kv_heads` (each row holds their
/// query heads in order, `kv_heads.len() × group` of them), each with exactly
/// its own result: the rows share each key block and each run of value rows
/// while those are in cache, so a chunk of prefill reads the cache once per
/// few rows instead of once a row; and the heads together read each block
/// and each value row whole, where one head alone reads a fraction of each.
#[allow(clippy::too_many_arguments)]
pub fn attend_rows(
    qs: &[&[f32]],
    lens: &[usize],
    kt: &[f32],
    v: &[f32],
    kv_heads: Range<usize>,
    n_kv_heads: usize,
    head_dim: usize,
    scores: &mut Vec<f32>,
    outs: &mut [&mut [f32]],
) {
    let max = lens.iter().copied().max().unwrap_or(0);
    let width = qs.first().map_or(0, |q| q.len());
    let per_kv = kv_heads.len() * head_dim;
    assert!(
        qs.len() == lens.len()
            && outs.len() == lens.len()
            && kt.len() >= max.div_ceil(KEY_BLOCK) * key_block_len(n_kv_heads, head_dim)
            && v.len() >= max * n_kv_heads * head_dim
            && !kv_heads.is_empty()
            && kv_heads.end <= n_kv_heads
            && width > 0
            && width.is_multiple_of(per_kv)
            && qs
                .iter()
                .zip(outs.iter())
                .all(|(q, o)| q.len() == width && o.len() == width),
        "attention operands of their shapes"
    );
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    if crate::cpu::wide_lanes() && lens.iter().all(|&l| l > 0) {
        // SAFETY: the CPU has the lanes' instructions; the shapes were
        // checked above.
        match head_dim {
            64 => {
                return unsafe {
                    wide::attend::<64, 4>(qs, lens, kt, v, kv_heads, n_kv_heads, scores, outs)
                }
            }
            128 => {
                return unsafe {
                    wide::attend::<128, 8>(qs, lens, kt, v, kv_heads, n_kv_heads, scores, outs)
                }
            }
            _ => {}
        }
    }
    let group = width / kv_heads.len();
    for ((q, &len), out) in qs.iter().zip(lens).zip(outs.iter_mut()) {
        for (i, kvh) in kv_heads.clone().enumerate() {
            let at = i * group..(i + 1) * group;
            let (q, out) = (&q[at.clone()], &mut out[at]);
            attend_scalar(q, kt, v, len, kvh, n_kv_heads, head_dim, scores, out);
        }
    }
}

/// [`attend`] one element at a time: the arithmetic every path performs.
#[allow(clippy::too_many_arguments)]
fn attend_scalar(
    q: &[f32],
    kt: &[f32],
    v: &[f32],
    len: usize,
    kvh: usize,
    n_kv_heads: usize,
    head_dim: usize,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    const L: usize = KEY_BLOCK;
    let group = q.len() / head_dim;
    let kv_dim = n_kv_heads * head_dim;
    let scale = 1.0 / (head_dim as f32).sqrt();
    let blocks = len.div_ceil(L);
    let per = key_block_len(n_kv_heads, head_dim);
    let padded = blocks * L;
    // scores[g * padded + t]
    scores.clear();
    scores.resize(group * padded, 0.0);
    for b in 0..blocks {
        let kb = &kt[b * per + kvh * head_dim * L..b * per + (kvh + 1) * head_dim * L];
        for g in 0..group {
            let qg = &q[g * head_dim..(g + 1) * head_dim];
            // Dimension d goes to partial sum d % 4 (unrolled so the four
            // stay in registers).
            let mut acc = [[0f32; L]; 4];
            for d in (0..head_dim).step_by(4) {
                for (j, a) in acc.iter_mut().enumerate() {
                    let Some(&qj) = qg.get(d + j) else { break };
                    let kd: &[f32; L] = kb[(d + j) * L..(d + j + 1) * L]
                        .try_into()
                        .expect("block lanes");
                    for l in 0..L {
                        a[l] = qj.mul_add(kd[l], a[l]);
                    }
                }
            }
            let s = &mut scores[g * padded + b * L..g * padded + (b + 1) * L];
            for l in 0..L {
                s[l] = ((acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l])) * scale;
            }
        }
    }
    for g in 0..group {
        let s = &mut scores[g * padded..(g + 1) * padded];
        let max = s[..len].iter().copied().fold(f32::NEG_INFINITY, f32::max);
        for (t, x) in s.iter_mut().enumerate() {
            *x = if t < len { exp_approx(*x - max) } else { 0.0 };
        }
        let mut lanes = [0f32; L];
        for chunk in s.chunks_exact(L) {
            for l in 0..L {
                lanes[l] += chunk[l];
            }
        }
        let mut width = L;
        while width > 1 {
            width /= 2;
            for l in 0..width {
                lanes[l] += lanes[l + width];
            }
        }
        let inv = 1.0 / lanes[0];
        for x in s.iter_mut() {
            *x *= inv;
        }
    }
    match head_dim {
        64 => weighted_values::<64, 4>(scores, padded, v, len, kv_dim, kvh, out),
        128 => weighted_values::<128, 2>(scores, padded, v, len, kv_dim, kvh, out),
        _ => {
            out.fill(0.0);
            for t in 0..len {
                let off = t * kv_dim + kvh * head_dim;
                let vt = &v[off..off + head_dim];
                for g in 0..group {
                    let p = scores[g * padded + t];
                    for (o, x) in out[g * head_dim..(g + 1) * head_dim].iter_mut().zip(vt) {
                        *o = p.mul_add(*x, *o);
                    }
                }
            }
        }
    }
}

/// `out[g] = Σ_t p[g][t] · v[t]`, positions in order, `G` heads at a time so
/// their accumulators stay in registers while each value row is loaded once.
fn weighted_values<const HD: usize, const G: usize>(
    p: &[f32],
    padded: usize,
    v: &[f32],
    len: usize,
    kv_dim: usize,
    kvh: usize,
    out: &mut [f32],
) {
    let group = out.len() / HD;
    for g0 in (0..group).step_by(G) {
        let mut acc = [[0f32; HD]; G];
        let n = G.min(group - g0);
        for t in 0..len {
            let off = t * kv_dim + kvh * HD;
            let vt: &[f32; HD] = v[off..off + HD].try_into().expect("value row");
            // Heads past the group's end weigh every value by zero.
            let w: [f32; G] =
                std::array::from_fn(|j| if j < n { p[(g0 + j) * padded + t] } else { 0.0 });
            for (a, &pj) in acc.iter_mut().zip(&w) {
                for d in 0..HD {
                    a[d] = pj.mul_add(vt[d], a[d]);
                }
            }
        }
        for (j, a) in acc.iter().take(n).enumerate() {
            out[(g0 + j) * HD..(g0 + j + 1) * HD].copy_from_slice(a);
        }
    }
}

/// [`attend_scalar`] in sixteen-lane registers ([`crate::lanes`]: AVX-512 or
/// NEON), sixteen positions (scores) or sixteen head dimensions (values) a
/// register: each lane performs the scalar path's operations in its order.
/// Up to eight query heads go through a key block together, and through a
/// run of value rows 32 dimensions at a time, so each key or value vector
/// loaded serves every head; rows of one sequence, then the call's KV heads,
/// take each key block and each run of value rows in turn while it is in L1,
/// and the blocks and rows a little further on are asked for ahead.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod wide {
    use super::{key_block_len, KEY_BLOCK as L};
    use crate::lanes::{self as simd, F32x16};
    use std::ops::Range;

    /// Runs `$f` with the const `$h` set to `$n` heads, eight for more.
    macro_rules! by_heads {
        ($n:expr, $h:ident => $f:expr) => {
            by_heads!(@ $n, $h, $f; 1 2 3 4 5 6 7)
        };
        (@ $n:expr, $h:ident, $f:expr; $($k:literal)*) => {
            match $n {
                $($k => {
                    const $h: usize = $k;
                    $f
                })*
                _ => {
                    const $h: usize = 8;
                    $f
                }
            }
        };
    }

    /// Positions of values a pass of [`weighted`] covers for every row
    /// (their value rows, 16 KB, stay in L1 from one row to the next).
    const VALUE_RUN: usize = 64;

    /// Key blocks ahead of use to prefetch.
    const KEYS_AHEAD: usize = 2;

    /// Value rows ahead of use to prefetch.
    const ROWS_AHEAD: usize = 16;

    /// `V` = `HD / 16` registers a head.
    ///
    /// # Safety
    /// The CPU has the lanes' instructions; the operands have the shapes
    /// [`super::attend_rows`] checks, and every length is positive.
    #[allow(clippy::too_many_arguments)]
    #[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx512f"))]
    pub(super) unsafe fn attend<const HD: usize, const V: usize>(
        qs: &[&[f32]],
        lens: &[usize],
        kt: &[f32],
        v: &[f32],
        kv_heads: Range<usize>,
        n_kv_heads: usize,
        scores: &mut Vec<f32>,
        outs: &mut [&mut [f32]],
    ) {
        // Row r's heads 0..heads, `group` to a KV head (in `kv_heads` order).
        let heads = qs[0].len() / HD;
        let group = heads / kv_heads.len();
        let scale = 1.0 / (HD as f32).sqrt();
        let max = lens.iter().copied().max().unwrap_or(0);
        let per = key_block_len(n_kv_heads, HD);
        // Row r's head h: scores at `(r · heads + h) · padded`.
        let padded = max.div_ceil(L) * L;
        // Every score read is written first (a row reads only its own
        // blocks), so the buffer is grown but never cleared.
        let need = qs.len() * heads * padded;
        if scores.len() < need {
            scores.resize(need, 0.0);
        }
        let s = scores.as_mut_ptr();
        let blocks = max.div_ceil(L);
        // The heads' part of a key block: `HD` lines a head, contiguous.
        let part = kv_heads.start * HD * L;
        for b in 0..blocks {
            // One KV head's part of a block is 4 KB (at 64 dimensions) and
            // the next block's is a page away, past where the hardware
            // prefetcher follows a stream: a decode row alone waited on
            // memory at every block.
            if b + KEYS_AHEAD < blocks {
                let next = kt.as_ptr().add((b + KEYS_AHEAD) * per + part);
                for line in 0..kv_heads.len() * HD {
                    crate::cpu::prefetch_line(next.add(line * L));
                }
            }
            for (i, kvh) in kv_heads.clone().enumerate() {
                let kb = kt.as_ptr().add(b * per + kvh * HD * L);
                for (r, q) in qs.iter().enumerate() {
                    if b * L >= lens[r] {
                        continue;
                    }
                    for g in (i * group..(i + 1) * group).step_by(8) {
                        let at = s.add((r * heads + g) * padded + b * L);
                        by_heads!((i + 1) * group - g, H => block_scores::<HD, H>(q, g, kb, scale, at, padded));
                    }
                }
            }
        }
        for (r, &len) in lens.iter().enumerate() {
            for h in 0..heads {
                softmax(s.add((r * heads + h) * padded), len, len.div_ceil(L));
            }
        }
        // The outputs hold the value sums between runs of positions.
        for o in outs.iter_mut() {
            o.fill(0.0);
        }
        let kv_dim = n_kv_heads * HD;
        for t0 in (0..max).step_by(VALUE_RUN) {
            for (i, kvh) in kv_heads.clone().enumerate() {
                let vp = v.as_ptr().add(kvh * HD);
                for c in (0..V).step_by(2) {
                    // The first pass over a run asks for the rows' lines a
                    // little later, every head's.
                    let mut ahead = i == 0 && c == 0;
                    for (r, o) in outs.iter_mut().enumerate() {
                        let ts = t0..(t0 + VALUE_RUN).min(lens[r]);
                        if ts.is_empty() {
                            continue;
                        }
                        for g in (i * group..(i + 1) * group).step_by(8) {
                            let run = Run {
                                p: s.add((r * heads + g) * padded),
                                padded,
                                v: vp.add(16 * c),
                                kv_dim,
                                ts: ts.clone(),
                                out: o.as_mut_ptr().add(g * HD + 16 * c),
                                hd: HD,
                                ahead: if std::mem::take(&mut ahead) {
                                    kv_heads.len() * HD / L
                                } else {
                                    0
                                },
                            };
                            by_heads!((i + 1) * group - g, H => weighted::<H>(run));
                        }
                    }
                }
            }
        }
    }

    /// Scores of heads `g..g + H` for one key block, written at `at` (head
    /// `g`'s), `padded` apart: dimension `d` goes to partial sum `d % 4`,
    /// then `((a0 + a1) + (a2 + a3)) · scale`.
    #[inline(always)]
    unsafe fn block_scores<const HD: usize, const H: usize>(
        q: &[f32],
        g: usize,
        kb: *const f32,
        scale: f32,
        at: *mut f32,
        padded: usize,
    ) {
        let mut acc = [[simd::zero(); 4]; H];
        let q = q.as_ptr().add(g * HD);
        for d in (0..HD).step_by(4) {
            for j in 0..4 {
                let kd = simd::load(kb.add((d + j) * L));
                for (h, a) in acc.iter_mut().enumerate() {
                    a[j] = simd::fma(simd::splat(*q.add(h * HD + d + j)), kd, a[j]);
                }
            }
        }
        for (h, a) in acc.iter().enumerate() {
            let sum = simd::add(simd::add(a[0], a[1]), simd::add(a[2], a[3]));
            simd::store(at.add(h * padded), simd::mul(sum, simd::splat(scale)));
        }
    }

    /// One head's softmax in place over positions `0..len` of `blocks`
    /// blocks (the padding becomes zero): maximum, `exp_approx(x − max)`,
    /// sixteen lane sums over blocks then a fixed tree, times `1 / sum`.
    #[inline(always)]
    unsafe fn softmax(s: *mut f32, len: usize, blocks: usize) {
        // Maximum of the scores (order-free; NaN is passed over as
        // `f32::max` does).
        let full = len / L;
        let mut m = simd::splat(f32::NEG_INFINITY);
        for b in 0..full {
            m = simd::max(simd::load(s.add(b * L)), m);
        }
        let mut max = simd::reduce_max(m);
        for t in full * L..len {
            max = max.max(*s.add(t));
        }
        let mut lanes = simd::zero();
        for b in 0..blocks {
            let x = simd::sub(simd::load(s.add(b * L)), simd::splat(max));
            let e = simd::keep_first(simd::exp(x), len - b * L);
            simd::store(s.add(b * L), e);
            lanes = simd::add(lanes, e);
        }
        let mut lanes = simd::to_array(lanes);
        let mut width = L;
        while width > 1 {
            width /= 2;
            for l in 0..width {
                lanes[l] += lanes[l + width];
            }
        }
        let inv = simd::splat(1.0 / lanes[0]);
        for b in 0..blocks {
            simd::store(s.add(b * L), simd::mul(simd::load(s.add(b * L)), inv));
        }
    }

    /// A run of positions `ts` of 32 value dimensions for a few heads:
    /// probabilities at `p` (heads `padded` apart), value rows at `v` (`kv_dim`
    /// apart), sums at `out` (heads `hd` apart); `ahead` lines of the value
    /// row [`ROWS_AHEAD`] later are prefetched (none but on a run's first
    /// pass).
    struct Run {
        p: *const f32,
        padded: usize,
        v: *const f32,
        kv_dim: usize,
        ts: std::ops::Range<usize>,
        out: *mut f32,
        hd: usize,
        ahead: usize,
    }

    /// `out[h] += Σ_t p[h][t] · v[t]` over the run's positions in order, for
    /// heads `0..H`.
    #[inline(always)]
    unsafe fn weighted<const H: usize>(
        Run {
            p,
            padded,
            v,
            kv_dim,
            ts,
            out,
            hd,
            ahead,
        }: Run,
    ) {
        let mut acc: [[F32x16; 2]; H] = std::array::from_fn(|h| {
            let o = out.add(h * hd);
            [simd::load(o), simd::load(o.add(16))]
        });
        for t in ts {
            let row = v.add(t * kv_dim);
            let later = row.wrapping_add(ROWS_AHEAD * kv_dim);
            for line in 0..ahead {
                crate::cpu::prefetch_line(later.wrapping_add(line * L));
            }
            let vt = [simd::load(row), simd::load(row.add(16))];
            for (h, a) in acc.iter_mut().enumerate() {
                let w = simd::splat(*p.add(h * padded + t));
                a[0] = simd::fma(w, vt[0], a[0]);
                a[1] = simd::fma(w, vt[1], a[1]);
            }
        }
        for (h, a) in acc.iter().enumerate() {
            let o = out.add(h * hd);
            simd::store(o, a[0]);
            simd::store(o.add(16), a[1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plain attention in f64 for comparison.
    fn reference(q: &[f32], keys: &[Vec<f32>], vals: &[Vec<f32>], hd: usize) -> Vec<f32> {
        let group = q.len() / hd;
        let mut out = vec![0f32; q.len()];
        for g in 0..group {
            let qg = &q[g * hd..(g + 1) * hd];
            let s: Vec<f64> = keys
                .iter()
                .map(|k| {
                    qg.iter()
                        .zip(k)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
                        / (hd as f64).sqrt()
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for d in 0..hd {
                let v: f64 = e.iter().zip(vals).map(|(p, v)| p * v[d] as f64).sum();
                out[g * hd + d] = (v / z) as f32;
            }
        }
        out
    }

    #[test]
    fn matches_reference_and_ignores_stale_lanes() {
        let val = |i: usize| ((i * 7919) % 1009) as f32 / 1009.0 - 0.5;
        // Head sizes of the specialised paths (64, 128) and the generic one.
        for ((nkv, hd, group), len) in [(2, 64, 7), (1, 128, 3), (2, 32, 2)]
            .into_iter()
            .flat_map(|s| [1, 15, 16, 17, 40].map(|len| (s, len)))
        {
            let keys: Vec<Vec<f32>> = (0..len)
                .map(|t| (0..nkv * hd).map(|i| val(t * 131 + i)).collect())
                .collect();
            let vals: Vec<Vec<f32>> = (0..len)
                .map(|t| (0..nkv * hd).map(|i| val(t * 71 + i + 5)).collect())
                .collect();
            let mut kt = Vec::new();
            for (t, k) in keys.iter().enumerate() {
                push_key(&mut kt, t, k, nkv, hd);
            }
            let v: Vec<f32> = vals.concat();
            let q: Vec<f32> = (0..group * hd).map(|i| val(i * 3 + 1) * 2.0).collect();
            for kvh in 0..nkv {
                let mut out = vec![0f32; group * hd];
                attend(&q, &kt, &v, len, kvh, nkv, hd, &mut Vec::new(), &mut out);
                let ks: Vec<Vec<f32>> = keys
                    .iter()
                    .map(|k| k[kvh * hd..(kvh + 1) * hd].to_vec())
                    .collect();
                let vs: Vec<Vec<f32>> = vals
                    .iter()
                    .map(|x| x[kvh * hd..(kvh + 1) * hd].to_vec())
                    .collect();
                let want = reference(&q, &ks, &vs, hd);
                for (a, b) in out.iter().zip(&want) {
                    assert!((a - b).abs() < 1e-5, "len {len}: {a} vs {b}");
                }
                // Stale keys in the last block's unused lanes change nothing.
                let mut dirty = kt.clone();
                let used = len % KEY_BLOCK;
                if used != 0 {
                    let per = key_block_len(nkv, hd);
                    let base = (len / KEY_BLOCK) * per;
                    for i in 0..nkv * hd {
                        for l in used..KEY_BLOCK {
                            dirty[base + i * KEY_BLOCK + l] = f32::NAN;
                        }
                    }
                }
                let mut again = vec![0f32; group * hd];
                attend(
                    &q,
                    &dirty,
                    &v,
                    len,
                    kvh,
                    nkv,
                    hd,
                    &mut Vec::new(),
                    &mut again,
                );
                assert_eq!(out, again, "len {len}");
            }
        }
    }

    #[test]
    fn wide_path_equals_the_scalar_order() {
        let val = |i: usize| ((i * 7919) % 1009) as f32 / 1009.0 - 0.5;
        for (nkv, hd, group) in [(2, 64, 7), (2, 64, 5), (1, 128, 3), (4, 128, 1), (1, 64, 2)] {
            for len in [1, 15, 16, 17, 40, 100] {
                let mut kt = Vec::new();
                for t in 0..len {
                    let k: Vec<f32> = (0..nkv * hd).map(|i| val(t * 131 + i) * 3.0).collect();
                    push_key(&mut kt, t, &k, nkv, hd);
                }
                let v: Vec<f32> = (0..len * nkv * hd).map(|i| val(i * 71 + 5)).collect();
                let q: Vec<f32> = (0..group * hd).map(|i| val(i * 3 + 1) * 2.0).collect();
                for kvh in 0..nkv {
                    let mut wide = vec![0f32; group * hd];
                    let mut scalar = vec![0f32; group * hd];
                    attend(&q, &kt, &v, len, kvh, nkv, hd, &mut Vec::new(), &mut wide);
                    attend_scalar(&q, &kt, &v, len, kvh, nkv, hd, &mut Vec::new(), &mut scalar);
                    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&wide),
                        bits(&scalar),
                        "hd {hd} group {group} len {len}"
                    );
                }
            }
        }
    }

    /// A transposed key cache and its values for positions `0..len`.
    fn cache(nkv: usize, hd: usize, len: usize) -> (Vec<f32>, Vec<f32>) {
        let val = |i: usize| ((i * 7919) % 1009) as f32 / 1009.0 - 0.5;
        let mut kt = Vec::new();
        for t in 0..len {
            let k: Vec<f32> = (0..nkv * hd).map(|i| val(t * 131 + i) * 3.0).collect();
            push_key(&mut kt, t, &k, nkv, hd);
        }
        let v: Vec<f32> = (0..len * nkv * hd).map(|i| val(i * 71 + 5)).collect();
        (kt, v)
    }

    fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|v| v.to_bits()).collect()
    }

    /// One row of one KV head's heads by the scalar path, as bits.
    fn alone(
        q: &[f32],
        kt: &[f32],
        v: &[f32],
        len: usize,
        kvh: usize,
        nkv: usize,
        hd: usize,
    ) -> Vec<u32> {
        let mut out = vec![0f32; q.len()];
        attend_scalar(q, kt, v, len, kvh, nkv, hd, &mut Vec::new(), &mut out);
        bits(&out)
    }

    #[test]
    fn rows_together_equal_rows_alone() {
        let val = |i: usize| ((i * 7919) % 1009) as f32 / 1009.0 - 0.5;
        for (nkv, hd, group) in [(2, 64, 7), (1, 128, 3), (2, 32, 2), (1, 64, 9)] {
            let (kt, v) = cache(nkv, hd, 150);
            // A prefill chunk's consecutive positions, and lengths apart.
            let lens = [61, 62, 63, 64, 65, 1, 150, 80];
            let qs: Vec<Vec<f32>> = (0..lens.len())
                .map(|r| {
                    (0..group * hd)
                        .map(|i| val(i * 3 + r * 17 + 1) * 2.0)
                        .collect()
                })
                .collect();
            for kvh in 0..nkv {
                let mut together = vec![vec![0f32; group * hd]; lens.len()];
                let q_refs: Vec<&[f32]> = qs.iter().map(|q| q.as_slice()).collect();
                let mut outs: Vec<&mut [f32]> =
                    together.iter_mut().map(|o| o.as_mut_slice()).collect();
                attend_rows(
                    &q_refs,
                    &lens,
                    &kt,
                    &v,
                    kvh..kvh + 1,
                    nkv,
                    hd,
                    &mut Vec::new(),
                    &mut outs,
                );
                for (r, &len) in lens.iter().enumerate() {
                    assert_eq!(
                        bits(&together[r]),
                        alone(&qs[r], &kt, &v, len, kvh, nkv, hd),
                        "hd {hd} group {group} row {r}"
                    );
                }
            }
        }
    }

    #[test]
    fn heads_together_equal_heads_alone() {
        let val = |i: usize| ((i * 7919) % 1009) as f32 / 1009.0 - 0.5;
        // Every KV head of the cache together, and a middle pair, against
        // each head alone; chunk rows and a decode row; the wide head sizes
        // and a scalar one.
        for (nkv, hd, group) in [(2, 64, 7), (4, 64, 3), (3, 128, 2), (4, 32, 2), (2, 64, 9)] {
            let (kt, v) = cache(nkv, hd, 150);
            for lens in [vec![61, 62, 63, 64, 65], vec![150]] {
                for heads in [0..nkv, 1..nkv.min(3)] {
                    let width = heads.len() * group * hd;
                    let qs: Vec<Vec<f32>> = (0..lens.len())
                        .map(|r| (0..width).map(|i| val(i * 3 + r * 17 + 1) * 2.0).collect())
                        .collect();
                    let q_refs: Vec<&[f32]> = qs.iter().map(|q| q.as_slice()).collect();
                    let mut together = vec![vec![0f32; width]; lens.len()];
                    let mut outs: Vec<&mut [f32]> =
                        together.iter_mut().map(|o| o.as_mut_slice()).collect();
                    attend_rows(
                        &q_refs,
                        &lens,
                        &kt,
                        &v,
                        heads.clone(),
                        nkv,
                        hd,
                        &mut Vec::new(),
                        &mut outs,
                    );
                    for (i, kvh) in heads.clone().enumerate() {
                        let at = i * group * hd..(i + 1) * group * hd;
                        for (r, &len) in lens.iter().enumerate() {
                            assert_eq!(
                                bits(&together[r][at.clone()]),
                                alone(&qs[r][at.clone()], &kt, &v, len, kvh, nkv, hd),
                                "hd {hd} group {group} heads {heads:?} row {r}"
                            );
                        }
                    }
                }
            }
        }
    }
}
