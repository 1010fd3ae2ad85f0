//! The device-kernel interface the forward pass is written against, and its
//! CPU implementation over the kernels of `statebench_kernels`.
//!
//! The layers in `model.rs` call only these operations, so a device is one
//! implementation of [`Device`]; the scheduler, sessions, sampling and
//! accounting never see which one runs. Every operation must keep the
//! reduction order of an output element independent of how many rows are in
//! the batch and where they came from: that is the invariance promise.

use std::ops::Range;

use rayon::prelude::*;
use statebench_kernels::{attend, rms_norm, rope_neox, silu_mul, Matrix, RopeTable};

use super::kv_cache::{KvCache, KvStore};

/// Query heads, key/value heads and the size of one head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heads {
    /// Query heads.
    pub q: usize,
    /// Key/value heads (each shared by `q / kv` query heads).
    pub kv: usize,
    /// Floats per head.
    pub dim: usize,
}

/// Where each row of a ragged batch comes from: its item and its position
/// in that item's sequence.
#[derive(Debug, Clone, Default)]
pub struct BatchRows {
    /// Item (sequence) of each row.
    pub item: Vec<usize>,
    /// Position of each row in its sequence.
    pub pos: Vec<usize>,
    /// Each item's rows, in batch order.
    pub spans: Vec<Range<usize>>,
}

impl BatchRows {
    /// Rows of items with `new[i]` tokens each after `cached[i]` cached ones.
    pub fn new(items: impl IntoIterator<Item = (usize, usize)>) -> Self {
        let mut rows = BatchRows::default();
        for (i, (cached, new)) in items.into_iter().enumerate() {
            let start = rows.item.len();
            for j in 0..new {
                rows.item.push(i);
                rows.pos.push(cached + j);
            }
            rows.spans.push(start..start + new);
        }
        rows
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.item.len()
    }

    /// Whether the batch has no rows.
    pub fn is_empty(&self) -> bool {
        self.item.is_empty()
    }

    /// The last row of every item (the one whose logits choose its next token).
    pub fn last_of_each(&self) -> Vec<usize> {
        self.spans.iter().map(|s| s.end - 1).collect()
    }
}

/// The operations of one forward pass on one kind of device.
///
/// Activations are `rows × width` f32 matrices in the device's memory;
/// weights and vectors are uploaded once at load.
pub trait Device: Sync {
    /// A weight matrix, `out × in`, in the device's packed layout.
    type Weight: Send + Sync;
    /// A parameter vector (norm weight, bias).
    type Vector: Send + Sync;
    /// Activations, `rows × width`.
    type Act;
    /// The rotary-embedding table.
    type Rope: Send + Sync;
    /// One sequence's KV cache.
    type Cache: KvStore;

    /// Takes a weight matrix loaded on the host.
    fn weight(&self, m: Matrix) -> Self::Weight;
    /// Takes a parameter vector loaded on the host.
    fn vector(&self, v: Vec<f32>) -> Self::Vector;
    /// The RoPE table for `max_pos` positions.
    fn rope_table(&self, head_dim: usize, theta: f32, max_pos: usize) -> Self::Rope;

    /// One embedding row per token.
    fn embed(&self, table: &Self::Weight, tokens: &[u32]) -> Self::Act;
    /// RMSNorm of every `weight.len()`-wide chunk of every row.
    fn rms_norm(&self, x: &Self::Act, weight: &Self::Vector, eps: f32) -> Self::Act;
    /// `x Wᵀ`: `rows × in` → `rows × out`.
    fn matmul(&self, w: &Self::Weight, x: &Self::Act) -> Self::Act;
    /// Adds a bias to every row.
    fn add_bias(&self, y: &mut Self::Act, bias: &Self::Vector);
    /// Rotates `heads` heads of every row by its position.
    fn rope(&self, x: &mut Self::Act, heads: usize, pos: &[usize], table: &Self::Rope);
    /// Writes rows `rows` of `k` and `v` as the next positions of one layer
    /// of `cache` (made visible by [`KvStore::advance`] after every layer).
    fn kv_write(
        &self,
        cache: &mut Self::Cache,
        layer: usize,
        k: &Self::Act,
        v: &Self::Act,
        rows: Range<usize>,
        heads: Heads,
    );
    /// Causal attention of every query row over its own item's cache
    /// (positions `0..=pos`), `rows × (q · dim)`.
    fn attention(
        &self,
        q: &Self::Act,
        caches: &[&Self::Cache],
        layer: usize,
        rows: &BatchRows,
        heads: Heads,
    ) -> Self::Act;
    /// `gate ← silu(gate) · up`.
    fn silu_mul(&self, gate: &mut Self::Act, up: &Self::Act);
    /// `x ← x + y`.
    fn add(&self, x: &mut Self::Act, y: &Self::Act);
    /// The given rows of `x`, in that order.
    fn gather(&self, x: &Self::Act, rows: &[usize]) -> Self::Act;
    /// Copies activations to the host, one vector per row.
    fn to_host(&self, x: Self::Act) -> Vec<Vec<f32>>;
}

/// Activations on the CPU: `rows × width`, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Activations {
    /// Floats per row.
    pub width: usize,
    /// `rows × width` values.
    pub data: Vec<f32>,
}

impl Activations {
    fn zeros(rows: usize, width: usize) -> Self {
        Activations {
            width,
            data: vec![0f32; rows * width],
        }
    }

    pub fn rows(&self) -> usize {
        self.data.len() / self.width.max(1)
    }
}

/// The CPU, through `statebench_kernels`; runs on the calling rayon pool.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cpu;

impl Device for Cpu {
    type Weight = Matrix;
    type Vector = Vec<f32>;
    type Act = Activations;
    type Rope = RopeTable;
    type Cache = KvCache;

    fn weight(&self, m: Matrix) -> Matrix {
        m
    }

    fn vector(&self, v: Vec<f32>) -> Vec<f32> {
        v
    }

    fn rope_table(&self, head_dim: usize, theta: f32, max_pos: usize) -> RopeTable {
        RopeTable::new(head_dim, theta, max_pos)
    }

    fn embed(&self, table: &Matrix, tokens: &[u32]) -> Activations {
        let mut x = Activations::zeros(tokens.len(), table.cols());
        x.data
            .par_chunks_mut(x.width)
            .zip(tokens.par_iter())
            .for_each(|(row, &t)| table.row_f32(t as usize, row));
        x
    }

    fn rms_norm(&self, x: &Activations, weight: &Vec<f32>, eps: f32) -> Activations {
        let mut y = x.clone();
        y.data
            .par_chunks_mut(weight.len())
            .for_each(|r| rms_norm(r, weight, eps));
        y
    }

    fn matmul(&self, w: &Matrix, x: &Activations) -> Activations {
        let n = x.rows();
        let mut y = Activations::zeros(n, w.rows());
        w.matmul(&x.data, n, &mut y.data);
        y
    }

    fn add_bias(&self, y: &mut Activations, bias: &Vec<f32>) {
        for row in y.data.chunks_exact_mut(y.width) {
            for (v, b) in row.iter_mut().zip(bias) {
                *v += b;
            }
        }
    }

    fn rope(&self, x: &mut Activations, heads: usize, pos: &[usize], table: &RopeTable) {
        x.data
            .par_chunks_mut(x.width)
            .zip(pos.par_iter())
            .for_each(|(r, &p)| rope_neox(r, heads, p, table));
    }

    fn kv_write(
        &self,
        cache: &mut KvCache,
        layer: usize,
        k: &Activations,
        v: &Activations,
        rows: Range<usize>,
        heads: Heads,
    ) {
        let kvd = heads.kv * heads.dim;
        let span = rows.start * kvd..rows.end * kvd;
        cache.write(
            layer,
            &k.data[span.clone()],
            &v.data[span],
            heads.kv,
            heads.dim,
        );
    }

    fn attention(
        &self,
        q: &Activations,
        caches: &[&KvCache],
        layer: usize,
        rows: &BatchRows,
        heads: Heads,
    ) -> Activations {
        let mut out = Activations::zeros(rows.len(), q.width);
        let layers: Vec<(&[f32], &[f32])> = caches.iter().map(|c| c.layer(layer)).collect();
        // One task per (row, KV head): the query heads sharing that KV head.
        let group = q.width / heads.kv;
        out.data
            .par_chunks_mut(group)
            .zip(q.data.par_chunks(group))
            .enumerate()
            .for_each_init(Vec::new, |scores, (i, (o, qg))| {
                let (r, kvh) = (i / heads.kv, i % heads.kv);
                let (kt, v) = layers[rows.item[r]];
                attend(
                    qg,
                    kt,
                    v,
                    rows.pos[r] + 1,
                    kvh,
                    heads.kv,
                    heads.dim,
                    scores,
                    o,
                );
            });
        out
    }

    fn silu_mul(&self, gate: &mut Activations, up: &Activations) {
        gate.data
            .par_chunks_mut(gate.width)
            .zip(up.data.par_chunks(up.width))
            .for_each(|(g, u)| silu_mul(g, u));
    }

    fn add(&self, x: &mut Activations, y: &Activations) {
        for (a, b) in x.data.iter_mut().zip(&y.data) {
            *a += b;
        }
    }

    fn gather(&self, x: &Activations, rows: &[usize]) -> Activations {
        let w = x.width;
        let mut data = Vec::with_capacity(rows.len() * w);
        for &r in rows {
            data.extend_from_slice(&x.data[r * w..(r + 1) * w]);
        }
        Activations { width: w, data }
    }

    fn to_host(&self, x: Activations) -> Vec<Vec<f32>> {
        x.data.chunks_exact(x.width).map(<[f32]>::to_vec).collect()
    }
}
