//! One sequence's keys and values, layer by layer, in the layout the CPU
//! attention kernel reads: keys transposed in blocks of [`KEY_BLOCK`]
//! positions (`statebench_kernels::attention`), values
//! `[position][kv_head][head_dim]`.
//!
//! The forward pass writes a step's new positions into every layer with
//! [`KvCache::write`], then makes them visible with [`KvCache::advance`];
//! the scheduler truncates a session's cache to the prefix it reuses.

use statebench_kernels::attention::{push_key, KEY_BLOCK};

/// What the scheduler needs of any device's per-sequence cache.
pub trait KvStore: Default + Send + Sync {
    /// Cached positions.
    fn len(&self) -> usize;
    /// Drops positions from `len` on.
    fn truncate(&mut self, len: usize);
    /// Makes `n` positions written to every layer part of the cache.
    fn advance(&mut self, n: usize);
    /// Whether nothing is cached.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Positions of memory that holding `tokens` positions takes (a paged
    /// cache rounds up to whole blocks); what admission counts.
    fn footprint(tokens: usize) -> usize {
        tokens
    }
}

/// The CPU cache of one sequence.
#[derive(Debug, Clone, Default)]
pub struct KvCache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    len: usize,
}

impl KvCache {
    /// Writes `rows` new positions of one layer, at `len()..len() + rows`:
    /// `keys` and `values` are `rows × (kv_heads · head_dim)`.
    pub fn write(
        &mut self,
        layer: usize,
        keys: &[f32],
        values: &[f32],
        kv_heads: usize,
        head_dim: usize,
    ) {
        if self.k.len() <= layer {
            self.k.resize_with(layer + 1, Vec::new);
            self.v.resize_with(layer + 1, Vec::new);
        }
        let kvd = kv_heads * head_dim;
        for (j, key) in keys.chunks_exact(kvd).enumerate() {
            push_key(&mut self.k[layer], self.len + j, key, kv_heads, head_dim);
        }
        self.v[layer].extend_from_slice(values);
    }

    /// One layer's keys (transposed blocks) and values, including positions
    /// written but not yet advanced over.
    pub fn layer(&self, layer: usize) -> (&[f32], &[f32]) {
        (&self.k[layer], &self.v[layer])
    }
}

impl KvStore for KvCache {
    fn len(&self) -> usize {
        self.len
    }

    fn truncate(&mut self, len: usize) {
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

    fn advance(&mut self, n: usize) {
        self.len += n;
    }
}
