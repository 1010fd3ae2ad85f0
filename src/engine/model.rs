//! The Qwen2 / Qwen3 dense forward pass with per-sequence positions and caches.
//!
//! One forward call takes a ragged batch: each item is one sequence's new
//! tokens (a whole uncached prompt, or the single token being decoded) and its
//! KV cache. All rows of all items go through the matrix products together;
//! attention runs per row over that row's own sequence.

use rayon::prelude::*;
use statebench_kernels::attention::{push_key, KEY_BLOCK};
use statebench_kernels::{attend, rms_norm, rope_neox, silu_mul, Matrix, RopeTable};

/// Which member of the Qwen family the weights are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Qwen2 / Qwen2.5: biases on q, k, v.
    Qwen2,
    /// Qwen3 dense: RMSNorm on q and k per head, no biases.
    Qwen3,
}

impl Arch {
    /// The architecture's name as the model files spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
        }
    }
}

/// Shapes and constants of a model, read from its files.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Architecture.
    pub arch: Arch,
    /// Vocabulary size (rows of the embedding).
    pub vocab: usize,
    /// Hidden size.
    pub hidden: usize,
    /// MLP inner size.
    pub intermediate: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Size of one head.
    pub head_dim: usize,
    /// RoPE base.
    pub rope_theta: f32,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Context length the model was trained for.
    pub context: usize,
}

impl Config {
    /// Bytes of KV cache one token occupies (f32 keys and values, all layers).
    pub fn kv_bytes_per_token(&self) -> usize {
        self.layers * 2 * self.kv_heads * self.head_dim * 4
    }
}

/// A projection `y = W x (+ b)`.
pub struct Linear {
    /// Weight, `out × in`.
    pub w: Matrix,
    /// Optional bias, `out`.
    pub b: Option<Vec<f32>>,
}

impl Linear {
    fn forward(&self, x: &[f32], n: usize) -> Vec<f32> {
        let rows = self.w.rows();
        let mut y = vec![0f32; n * rows];
        self.w.matmul(x, n, &mut y);
        if let Some(b) = &self.b {
            for row in y.chunks_exact_mut(rows) {
                for (v, bb) in row.iter_mut().zip(b) {
                    *v += bb;
                }
            }
        }
        y
    }
}

/// Self-attention weights of one layer.
pub struct Attention {
    /// Query projection.
    pub q: Linear,
    /// Key projection.
    pub k: Linear,
    /// Value projection.
    pub v: Linear,
    /// Output projection.
    pub o: Linear,
    /// Qwen3's per-head query RMSNorm.
    pub q_norm: Option<Vec<f32>>,
    /// Qwen3's per-head key RMSNorm.
    pub k_norm: Option<Vec<f32>>,
}

/// SwiGLU MLP weights of one layer.
pub struct Mlp {
    /// Gate projection.
    pub gate: Linear,
    /// Up projection.
    pub up: Linear,
    /// Down projection.
    pub down: Linear,
}

/// One decoder layer.
pub struct Layer {
    /// RMSNorm before attention.
    pub attn_norm: Vec<f32>,
    /// Attention.
    pub attn: Attention,
    /// RMSNorm before the MLP.
    pub mlp_norm: Vec<f32>,
    /// MLP.
    pub mlp: Mlp,
}

/// A whole model.
pub struct Model {
    /// Shapes.
    pub cfg: Config,
    /// Token embedding, `vocab × hidden`.
    pub embed: Matrix,
    /// Decoder layers.
    pub layers: Vec<Layer>,
    /// Final RMSNorm.
    pub norm: Vec<f32>,
    /// Output head; `None` when tied to the embedding.
    pub lm_head: Option<Matrix>,
    /// RoPE cos/sin table.
    pub rope: RopeTable,
}

/// One sequence's keys and values per layer: keys transposed in blocks of
/// [`KEY_BLOCK`] positions (see `statebench_kernels::attention`), values
/// `[position][kv_head][head_dim]`.
#[derive(Debug, Clone, Default)]
pub struct KvCache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    len: usize,
}

impl KvCache {
    /// Cached positions.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Drops positions from `len` on.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        let (old_blocks, new_blocks) = (self.len.div_ceil(KEY_BLOCK), len.div_ceil(KEY_BLOCK));
        for (k, v) in self.k.iter_mut().zip(self.v.iter_mut()) {
            // Lanes past `len` in the last key block go stale; attention
            // never reads them and the next positions overwrite them.
            let per_block = k.len() / old_blocks;
            k.truncate(new_blocks * per_block);
            let per_pos = v.len() / self.len;
            v.truncate(len * per_pos);
        }
        self.len = len;
    }
}

/// One item of a ragged batch: new tokens for one sequence and its cache.
pub struct BatchItem<'a> {
    /// Tokens to append, at positions `cache.len()..`.
    pub tokens: &'a [u32],
    /// The sequence's cache; grows by `tokens.len()`.
    pub cache: &'a mut KvCache,
}

impl Model {
    /// Runs the batch; returns the logits of each item's last token.
    pub fn forward(&self, items: &mut [BatchItem<'_>]) -> Vec<Vec<f32>> {
        let c = &self.cfg;
        let (hd, nh, nkv) = (c.head_dim, c.heads, c.kv_heads);
        let (qd, kvd) = (nh * hd, nkv * hd);
        // Row bookkeeping: which item each row belongs to and its position.
        let mut row_item = Vec::new();
        let mut row_pos = Vec::new();
        for (i, it) in items.iter().enumerate() {
            for j in 0..it.tokens.len() {
                row_item.push(i);
                row_pos.push(it.cache.len + j);
            }
        }
        let n = row_item.len();
        if n == 0 {
            return Vec::new();
        }
        for it in items.iter_mut() {
            if it.cache.k.len() != c.layers {
                it.cache.k = vec![Vec::new(); c.layers];
                it.cache.v = vec![Vec::new(); c.layers];
            }
        }

        let mut x = vec![0f32; n * c.hidden];
        let tokens: Vec<u32> = items
            .iter()
            .flat_map(|it| it.tokens.iter().copied())
            .collect();
        x.par_chunks_mut(c.hidden)
            .zip(tokens.par_iter())
            .for_each(|(row, &t)| self.embed.row_f32(t as usize, row));

        for (li, layer) in self.layers.iter().enumerate() {
            // Attention block.
            let mut h = x.clone();
            h.par_chunks_mut(c.hidden)
                .for_each(|r| rms_norm(r, &layer.attn_norm, c.rms_eps));
            let mut q = layer.attn.q.forward(&h, n);
            let mut k = layer.attn.k.forward(&h, n);
            let v = layer.attn.v.forward(&h, n);
            if let (Some(qn), Some(kn)) = (&layer.attn.q_norm, &layer.attn.k_norm) {
                q.par_chunks_mut(hd)
                    .for_each(|r| rms_norm(r, qn, c.rms_eps));
                k.par_chunks_mut(hd)
                    .for_each(|r| rms_norm(r, kn, c.rms_eps));
            }
            q.par_chunks_mut(qd)
                .zip(row_pos.par_iter())
                .for_each(|(r, &p)| rope_neox(r, nh, p, &self.rope));
            k.par_chunks_mut(kvd)
                .zip(row_pos.par_iter())
                .for_each(|(r, &p)| rope_neox(r, nkv, p, &self.rope));
            let mut row = 0;
            for it in items.iter_mut() {
                let m = it.tokens.len();
                for j in 0..m {
                    let key = &k[(row + j) * kvd..(row + j + 1) * kvd];
                    push_key(&mut it.cache.k[li], it.cache.len + j, key, nkv, hd);
                }
                it.cache.v[li].extend_from_slice(&v[row * kvd..(row + m) * kvd]);
                row += m;
            }
            let mut att = vec![0f32; n * qd];
            {
                let caches: Vec<(&[f32], &[f32])> = items
                    .iter()
                    .map(|it| (it.cache.k[li].as_slice(), it.cache.v[li].as_slice()))
                    .collect();
                // One task per (row, KV head): the query heads sharing a KV head.
                let gd = qd / nkv;
                att.par_chunks_mut(gd)
                    .zip(q.par_chunks(gd))
                    .enumerate()
                    .for_each_init(Vec::new, |scores, (i, (out, qg))| {
                        let (r, kvh) = (i / nkv, i % nkv);
                        let (kc, vc) = caches[row_item[r]];
                        attend(qg, kc, vc, row_pos[r] + 1, kvh, nkv, hd, scores, out);
                    });
            }
            let o = layer.attn.o.forward(&att, n);
            for (xv, ov) in x.iter_mut().zip(&o) {
                *xv += ov;
            }

            // MLP block.
            let mut h = x.clone();
            h.par_chunks_mut(c.hidden)
                .for_each(|r| rms_norm(r, &layer.mlp_norm, c.rms_eps));
            let mut g = layer.mlp.gate.forward(&h, n);
            let u = layer.mlp.up.forward(&h, n);
            g.par_chunks_mut(c.intermediate)
                .zip(u.par_chunks(c.intermediate))
                .for_each(|(g, u)| silu_mul(g, u));
            let d = layer.mlp.down.forward(&g, n);
            for (xv, dv) in x.iter_mut().zip(&d) {
                *xv += dv;
            }
        }
        for it in items.iter_mut() {
            it.cache.len += it.tokens.len();
        }

        // Logits for each item's last row only.
        let mut last = Vec::with_capacity(items.len() * c.hidden);
        let mut row = 0;
        for it in items.iter() {
            row += it.tokens.len();
            last.extend_from_slice(&x[(row - 1) * c.hidden..row * c.hidden]);
        }
        last.par_chunks_mut(c.hidden)
            .for_each(|r| rms_norm(r, &self.norm, c.rms_eps));
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        let mut logits = vec![0f32; items.len() * head.rows()];
        head.matmul(&last, items.len(), &mut logits);
        logits
            .chunks_exact(head.rows())
            .map(|r| r.to_vec())
            .collect()
    }
}
