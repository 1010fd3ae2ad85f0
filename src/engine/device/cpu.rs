//! The CPU device: the kernels of `statebench_kernels`, run on the calling
//! rayon pool, in the arithmetic `statebench_kernels::ARITHMETIC` names.

use rayon::prelude::*;
use std::ops::Range;

use statebench_kernels::attention::attend_rows;
use statebench_kernels::{rms_norm, rope_neox, silu_mul, Matrix, RopeTable};

use super::{BatchRows, Device, DeviceInfo, Heads, HostWeight};
use crate::backend::BackendError;
use crate::engine::kv_cache::KvCache;

/// Rows of one sequence whose attention runs together (sharing each block of
/// the cache read); results do not depend on it.
const ROWS_TOGETHER: usize = 8;

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

    /// `rows × width` values for a kernel that writes every one of them: a
    /// spare buffer's stale values, not zeros. Clearing each product's
    /// output first, on fresh pages, was 5–6 % of a 512-token prefill's
    /// samples (`memset` and page faults).
    fn overwritten(rows: usize, width: usize) -> Self {
        Activations {
            width,
            data: spare::take(rows * width),
        }
    }

    pub fn rows(&self) -> usize {
        self.data.len() / self.width.max(1)
    }
}

impl Drop for Activations {
    fn drop(&mut self) {
        spare::give(std::mem::take(&mut self.data));
    }
}

/// Buffers of dropped activations, kept for the next of their size: a
/// forward pass makes the same few sizes layer after layer. Which buffer a
/// product gets never shows in its results, as its kernel writes every
/// value.
mod spare {
    use std::sync::Mutex;

    /// At most this many buffers are kept (a layer has about as many
    /// activations alive at once), of at most this many values in all
    /// (256 MiB: a 512-token prefill's largest is 10 MiB); a larger buffer
    /// displaces the smallest.
    const KEEP: usize = 8;
    const KEEP_VALUES: usize = 64 << 20;

    static SPARE: Mutex<Vec<Vec<f32>>> = Mutex::new(Vec::new());

    /// A buffer of `len` values: the smallest spare one that holds them,
    /// else a new one. Values the buffer held are kept; values past them
    /// are zero.
    pub(super) fn take(len: usize) -> Vec<f32> {
        let found = {
            let mut spare = SPARE.lock().unwrap_or_else(|e| e.into_inner());
            let best = (0..spare.len())
                .filter(|&i| spare[i].capacity() >= len)
                .min_by_key(|&i| spare[i].capacity());
            best.map(|i| spare.swap_remove(i))
        };
        let mut v = found.unwrap_or_default();
        // Shortening keeps the values; growing writes zeros only past them.
        v.resize(len, 0.0);
        v
    }

    pub(super) fn give(v: Vec<f32>) {
        if v.capacity() == 0 || v.capacity() > KEEP_VALUES {
            return;
        }
        let mut spare = SPARE.lock().unwrap_or_else(|e| e.into_inner());
        if spare.len() == KEEP {
            let smallest = (0..KEEP).min_by_key(|&i| spare[i].capacity());
            match smallest {
                Some(i) if spare[i].capacity() < v.capacity() => drop(spare.swap_remove(i)),
                _ => return,
            }
        }
        let held: usize = spare.iter().map(Vec::capacity).sum();
        if held + v.capacity() <= KEEP_VALUES {
            spare.push(v);
        }
    }
}

/// The CPU, through `statebench_kernels`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cpu;

impl Device for Cpu {
    type Weight = Matrix;
    type Vector = Vec<f32>;
    type Act = Activations;
    type Rope = RopeTable;
    type Cache = KvCache;

    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            name: "cpu".into(),
            // The kernel family (results do not depend on it).
            hardware: statebench_kernels::isa()
                .map_or_else(|e| e.to_string(), |i| format!("{i} kernels")),
            detail: String::new(),
            arithmetic: statebench_kernels::ARITHMETIC.into(),
        }
    }

    fn weight(&self, w: HostWeight) -> Result<Matrix, BackendError> {
        w.into_matrix()
            .map_err(|e| BackendError::BadRequest(format!("weight matrix: {e}")))
    }

    fn weight_bytes(&self, w: &Matrix) -> Option<usize> {
        Some(w.bytes())
    }

    fn vector(&self, v: Vec<f32>) -> Result<Vec<f32>, BackendError> {
        Ok(v)
    }

    fn rope_table(
        &self,
        head_dim: usize,
        theta: f32,
        max_pos: usize,
    ) -> Result<RopeTable, BackendError> {
        Ok(RopeTable::new(head_dim, theta, max_pos))
    }

    fn act(&self, width: usize, data: Vec<f32>) -> Activations {
        Activations { width, data }
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
        let mut y = Activations::overwritten(x.rows(), x.width);
        y.data.copy_from_slice(&x.data);
        y.data
            .par_chunks_mut(weight.len())
            .for_each(|r| rms_norm(r, weight, eps));
        y
    }

    fn matmul(&self, w: &Matrix, x: &Activations) -> Activations {
        let n = x.rows();
        let mut y = Activations::overwritten(n, w.rows());
        w.matmul(&x.data, n, &mut y.data);
        y
    }

    fn matmul_each(&self, ws: &[&Matrix], x: &Activations) -> Vec<Activations> {
        let n = x.rows();
        let mut ys: Vec<Activations> = ws
            .iter()
            .map(|w| Activations::overwritten(n, w.rows()))
            .collect();
        let mut outs: Vec<&mut [f32]> = ys.iter_mut().map(|y| y.data.as_mut_slice()).collect();
        statebench_kernels::matmul_each(ws, &x.data, n, &mut outs);
        ys
    }

    fn add_bias(&self, y: &mut Activations, bias: &Vec<f32>) {
        y.data.par_chunks_mut(y.width).for_each(|row| {
            for (v, b) in row.iter_mut().zip(bias) {
                *v += b;
            }
        });
    }

    fn rope(&self, x: &mut Activations, heads: usize, pos: &[usize], table: &RopeTable) {
        x.data
            .par_chunks_mut(x.width)
            .zip(pos.par_iter())
            .for_each(|(r, &p)| rope_neox(r, heads, p, table));
    }

    fn kv_write(
        &self,
        caches: &mut [&mut KvCache],
        layer: usize,
        k: &Activations,
        v: &Activations,
        rows: &BatchRows,
        heads: Heads,
    ) {
        let kvd = heads.kv * heads.dim;
        for (cache, span) in caches.iter_mut().zip(&rows.spans) {
            let span = span.start * kvd..span.end * kvd;
            cache.write(
                layer,
                &k.data[span.clone()],
                &v.data[span],
                heads.kv,
                heads.dim,
            );
        }
    }

    fn attention(
        &self,
        q: &Activations,
        caches: &[&KvCache],
        layer: usize,
        rows: &BatchRows,
        heads: Heads,
    ) -> Activations {
        let (n, kv) = (rows.len(), heads.kv);
        let layers: Vec<(&[f32], &[f32])> = caches.iter().map(|c| c.layer(layer)).collect();
        // One task per (run of up to ROWS_TOGETHER rows of one sequence, KV
        // heads): the query heads sharing those KV heads, for rows that read
        // the same cache while it is in L1/L2. A task takes every KV head
        // (reading each key block and value row whole, where one head reads
        // a part of each a page apart) unless that would leave threads idle:
        // a lone decode row still spreads its heads. Each task writes its
        // rows' columns of its heads in place (the kernel overwrites them
        // all), so the output needs no clearing and no copy after.
        let (group, dim) = (q.width / kv, heads.dim);
        let runs: Vec<Range<usize>> = rows
            .spans
            .iter()
            .flat_map(|span| {
                (span.start..span.end)
                    .step_by(ROWS_TOGETHER)
                    .map(move |r| r..(r + ROWS_TOGETHER).min(span.end))
            })
            .collect();
        debug_assert_eq!(runs.iter().map(Range::len).sum::<usize>(), n);
        let threads = rayon::current_num_threads();
        let per_task = if runs.len() >= threads { kv } else { 1 };
        let parts: Vec<Range<usize>> = (0..kv)
            .step_by(per_task)
            .map(|h| h..(h + per_task).min(kv))
            .collect();
        let mut out = Activations::overwritten(n, q.width);
        // (run, part, the run's rows' columns of the part); the runs take
        // the rows in order.
        let mut out_rows = out.data.chunks_exact_mut(q.width);
        let mut tasks = Vec::with_capacity(runs.len() * parts.len());
        for run in &runs {
            let mut outs: Vec<Vec<&mut [f32]>> = parts
                .iter()
                .map(|_| Vec::with_capacity(run.len()))
                .collect();
            for mut row in out_rows.by_ref().take(run.len()) {
                for (part, o) in parts.iter().zip(&mut outs) {
                    let (mine, rest) = row.split_at_mut(part.len() * group);
                    o.push(mine);
                    row = rest;
                }
            }
            tasks.extend(parts.iter().zip(outs).map(|(part, o)| (run, part, o)));
        }
        tasks
            .par_iter_mut()
            .for_each_init(Vec::new, |scores, (run, part, outs)| {
                let (kt, v) = layers[rows.item[run.start]];
                let cols = part.start * group..part.end * group;
                let qs: Vec<&[f32]> = run
                    .clone()
                    .map(|r| &q.data[r * q.width..(r + 1) * q.width][cols.clone()])
                    .collect();
                let lens: Vec<usize> = run.clone().map(|r| rows.pos[r] + 1).collect();
                attend_rows(&qs, &lens, kt, v, (*part).clone(), kv, dim, scores, outs);
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
        x.data
            .par_chunks_mut(x.width)
            .zip(y.data.par_chunks(x.width))
            .for_each(|(a, b)| {
                for (a, b) in a.iter_mut().zip(b) {
                    *a += b;
                }
            });
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

    fn argmax(&self, x: &Activations) -> Vec<u32> {
        x.data
            .par_chunks_exact(x.width)
            .map(super::argmax_checked)
            .collect()
    }

    fn all_finite(&self, x: &Activations) -> Option<bool> {
        Some(x.data.iter().all(|v| v.is_finite()))
    }

    fn sync(&self) -> Result<(), BackendError> {
        Ok(())
    }
}

impl crate::engine::model::Model<Cpu> {
    /// Bytes the weight matrices take in memory (norms and biases aside).
    pub fn weight_bytes(&self) -> usize {
        let layers: usize = self.projections().map(|lin| lin.w.bytes()).sum();
        self.embed.bytes() + self.lm_head.as_ref().map_or(0, Matrix::bytes) + layers
    }
}
