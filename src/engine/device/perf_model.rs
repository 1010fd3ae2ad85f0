//! A performance model of the CUDA engine (`statebench bench --gpu-model`):
//! for a model shape and a GPU, each kernel's bytes and tensor FLOPs per
//! forward pass, as the kernels' tile schedules make them (rows padded to
//! the matrix product's 8-row fragments and attention's 16-row ones, split
//! matrix products writing and reading their partial sums, attention's
//! chunk partials, the blocks each launch has against the multiprocessors
//! they fill), and the time each takes at the GPU's bandwidth or tensor
//! throughput, whichever binds. Its figures are predictions until a GPU
//! measures the same passes (`scripts/gpu-check.sh`).

use super::cuda::{gemm_splits, Pipelines, ATTN_CHUNK, GEMM_BK, GEMM_BM, GEMM_BN, KV_BLOCK};

/// A dense Qwen model's shape.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub name: &'static str,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub vocab: usize,
}

/// Qwen3-8B.
pub const QWEN3_8B: Shape = Shape {
    name: "Qwen3-8B",
    hidden: 4096,
    layers: 36,
    heads: 32,
    kv_heads: 8,
    head_dim: 128,
    intermediate: 12_288,
    vocab: 151_936,
};

/// A GPU as the model sees it.
#[derive(Debug, Clone, Copy)]
pub struct Gpu {
    pub name: &'static str,
    pub sms: usize,
    /// Bytes a second from device memory a streaming kernel attains.
    pub bandwidth: f64,
    /// bf16 FLOPs a second `mma.sync` attains.
    pub mma: f64,
    /// Seconds each kernel of a CUDA graph costs beyond its work.
    pub launch: f64,
    /// Bytes of L2 cache: what several blocks read of one layer's keys and
    /// values comes from device memory once while it fits.
    pub l2: f64,
    /// Seconds a load from device memory takes under load: a
    /// multiprocessor streams at most its bytes in flight per latency.
    pub latency: f64,
    pub pipes: Pipelines,
}

/// An H200: 4.8 TB/s of HBM3e, of which a device-to-device copy attains
/// about 90% (4.3 TB/s); 989 TFLOP/s of dense bf16 through Hopper's wgmma, of which the
/// sm_80 `mma.sync` path these kernels use attains about 60% (assumed:
/// it issues from one warp at a time and cannot use the wgmma pipes' full
/// width); about 1.5 µs a kernel node in a replayed graph; 60 MB of L2;
/// about 1 µs from a load to its data under load.
pub const H200: Gpu = Gpu {
    name: "H200",
    sms: 132,
    bandwidth: 4.8e12 * 0.9,
    mma: 989e12 * 0.6,
    launch: 1.5e-6,
    l2: 60e6,
    latency: 1e-6,
    pipes: Pipelines::DEEP,
};

/// One kernel of a pass: what it moves and computes, and its blocks.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelCost {
    pub kernel: &'static str,
    /// Launches a pass (per layer kernels: once a layer).
    pub launches: usize,
    /// Bytes from and to device memory, over all launches.
    pub bytes: f64,
    /// Tensor-core FLOPs issued (padding included), over all launches.
    pub flops: f64,
    /// Blocks of one launch.
    pub blocks: usize,
    /// Predicted seconds, over all launches.
    pub secs: f64,
}

/// A forward pass: `rows` new tokens over `items` sequences, each row
/// attending to `context` earlier positions on average (and its own).
#[derive(Debug, Clone, Copy)]
pub struct Pass {
    pub rows: usize,
    pub items: usize,
    /// Positions each row attends to, on average.
    pub context: usize,
    /// Largest position a row of the pass attends to.
    pub max_context: usize,
}

impl Pass {
    /// A decode step of `batch` sequences with `context` cached tokens each.
    pub fn decode(batch: usize, context: usize) -> Pass {
        Pass {
            rows: batch,
            items: batch,
            context: context + 1,
            max_context: context + 1,
        }
    }
}

/// How a kernel's blocks use the GPU.
#[derive(Debug, Clone, Copy)]
struct Blocks {
    count: usize,
    /// At most this many on one multiprocessor (shared memory, registers).
    resident: usize,
    /// Bytes one block has in flight from device memory.
    in_flight: f64,
}

impl Blocks {
    /// A small kernel: plenty resident, a few KiB in flight each.
    fn small(count: usize) -> Blocks {
        Blocks {
            count,
            resident: 8,
            in_flight: 4096.0,
        }
    }
}

/// Predicted time of a kernel moving `bytes` and issuing `flops`: the
/// binding one of bandwidth and tensor throughput. The multiprocessors its
/// blocks keep busy share the tensor throughput; each streams at most its
/// blocks' bytes in flight per load latency (Little's law), and all of
/// them together at most the bandwidth.
fn predict(g: &Gpu, bytes: f64, flops: f64, b: Blocks) -> f64 {
    let busy = b.count.min(g.sms).max(1) as f64;
    let together = b.count.div_ceil(g.sms).clamp(1, b.resident) as f64;
    let bw = g.bandwidth.min(busy * together * b.in_flight / g.latency);
    (bytes / bw).max(flops / (g.mma * busy / g.sms as f64)) + g.launch
}

/// The matrix product `rows × k` by a weight of `out × k`: weights once,
/// activations in and out, split-K partials written and read back.
fn gemm(
    g: &Gpu,
    kernel: &'static str,
    rows: usize,
    k: usize,
    out: usize,
    out_width: usize,
    residual: bool,
) -> Vec<KernelCost> {
    let splits = gemm_splits(out, k);
    let n_blocks = rows.div_ceil(GEMM_BN);
    let blocks = n_blocks * out.div_ceil(GEMM_BM) * splits;
    // Three blocks fit a multiprocessor's shared memory; each has all its
    // stages but the one computed in flight: weight rows and batch rows.
    let tile = Blocks {
        count: blocks,
        resident: 3,
        in_flight: ((g.pipes.gemm - 1) * (GEMM_BM + rows.min(GEMM_BN)) * GEMM_BK * 2) as f64,
    };
    // Rows padded to the fragment's 8; outputs to the fragment's 16.
    let flops = 2.0 * (out.div_ceil(16) * 16) as f64 * k as f64 * (rows.div_ceil(8) * 8) as f64;
    let weights = (out * k * 2) as f64;
    let acts = (rows * k * 2) as f64;
    let written = (rows * out_width * 2) as f64 * if residual { 2.0 } else { 1.0 };
    let mut v = Vec::new();
    if splits > 1 {
        let partial = (splits * rows * out * 4) as f64;
        v.push(KernelCost {
            kernel,
            launches: 1,
            bytes: weights + acts + partial,
            flops,
            blocks,
            secs: predict(g, weights + acts + partial, flops, tile),
        });
        let reduce_blocks = (rows * out_width).div_ceil(256);
        v.push(KernelCost {
            kernel: "  split-K sum",
            launches: 1,
            bytes: partial + written,
            flops: 0.0,
            blocks: reduce_blocks,
            secs: predict(g, partial + written, 0.0, Blocks::small(reduce_blocks)),
        });
    } else {
        let bytes = weights + acts + written;
        v.push(KernelCost {
            kernel,
            launches: 1,
            bytes,
            flops,
            blocks,
            secs: predict(g, bytes, flops, tile),
        });
    }
    v
}

/// Every kernel of one pass of `s` on `g`, per layer kernels summed over
/// the layers.
pub fn pass_costs(s: &Shape, g: &Gpu, p: &Pass) -> Vec<KernelCost> {
    let (r, h, d) = (p.rows, s.hidden, s.head_dim);
    let (qd, kvd) = (s.heads * d, s.kv_heads * d);
    let group = s.heads / s.kv_heads;
    let small = |kernel, bytes: f64, blocks: usize| KernelCost {
        kernel,
        launches: 1,
        bytes,
        flops: 0.0,
        blocks,
        secs: predict(g, bytes, 0.0, Blocks::small(blocks)),
    };
    let mut layer = Vec::new();
    layer.push(small("rms_norm", (r * h * 4) as f64, r));
    layer.extend(gemm(
        g,
        "gemm q|k|v",
        r,
        h,
        qd + 2 * kvd,
        qd + 2 * kvd,
        false,
    ));
    layer.push(small("rope_kv", (r * (qd + 2 * kvd) * 2 * 2) as f64, r));

    // Attention: tiles of 64 / group rows of one sequence (decode: one
    // row), one block per tile, KV head and split; each tile reads its
    // positions' keys and values once for all its query heads.
    let per_tile = 64 / group;
    let tiles = if p.items == p.rows {
        p.rows
    } else {
        p.items * (p.rows / p.items).div_ceil(per_tile)
    };
    let chunks = p.max_context.div_ceil(ATTN_CHUNK);
    let splits = g.sms.div_ceil(tiles * s.kv_heads).clamp(1, chunks);
    let blocks = tiles * s.kv_heads * splits;
    // Positions a tile reads: a decode row its context; a prefill tile the
    // context of its last row, in whole KV blocks.
    let tile_positions =
        (p.context + per_tile.min(p.rows / p.items.max(1))).div_ceil(KV_BLOCK) * KV_BLOCK;
    // Tiles of one sequence share its keys and values through L2 while a
    // layer's fit there.
    let read = (tiles * s.kv_heads * tile_positions * d * 2 * 2) as f64;
    let unique = (p.items * (p.context + p.rows / p.items.max(1)) * kvd * 2 * 2) as f64;
    let kv_bytes = if unique <= g.l2 { unique } else { read };
    // 16 M-rows a warp; a tile's rows × group of them hold queries.
    let m_rows = (per_tile.min(p.rows / p.items.max(1)) * group).div_ceil(16) * 16;
    let flops =
        (tiles * s.kv_heads) as f64 * m_rows as f64 * tile_positions as f64 * d as f64 * 4.0;
    let partials = if splits > 1 {
        (r * s.heads * chunks * (d + 2) * 4) as f64
    } else {
        0.0
    };
    let attn_bytes = kv_bytes + (r * qd * 2 * 2) as f64 + partials;
    layer.push(KernelCost {
        kernel: "attention",
        launches: 1,
        bytes: attn_bytes,
        flops,
        blocks,
        // Two blocks fit a multiprocessor; each has the next sub-tile's
        // keys and values in flight while it computes one.
        secs: predict(
            g,
            attn_bytes,
            flops,
            Blocks {
                count: blocks,
                resident: 2,
                in_flight: (KV_BLOCK * d * 2 * 2) as f64,
            },
        ),
    });
    if splits > 1 {
        layer.push(small(
            "  chunk merge",
            partials + (r * qd * 2) as f64,
            r * s.heads,
        ));
    }
    layer.extend(gemm(g, "gemm o (+ residual)", r, qd, h, h, true));
    layer.push(small("rms_norm", (r * h * 4) as f64, r));
    layer.extend(gemm(
        g,
        "gemm gate|up (SwiGLU)",
        r,
        h,
        2 * s.intermediate,
        s.intermediate,
        false,
    ));
    layer.extend(gemm(
        g,
        "gemm down (+ residual)",
        r,
        s.intermediate,
        h,
        h,
        true,
    ));

    let mut all: Vec<KernelCost> = Vec::new();
    for mut k in layer {
        k.launches *= s.layers;
        k.bytes *= s.layers as f64;
        k.flops *= s.layers as f64;
        k.secs *= s.layers as f64;
        match all.iter_mut().find(|a| a.kernel == k.kernel) {
            Some(a) => {
                a.launches += k.launches;
                a.bytes += k.bytes;
                a.flops += k.flops;
                a.secs += k.secs;
            }
            None => all.push(k),
        }
    }
    all.insert(0, small("embed", (r * h * 4) as f64, r));
    all.push(small(
        "gather, final norm",
        (p.items * h * 6) as f64,
        p.items,
    ));
    all.extend(gemm(g, "gemm lm_head", p.items, h, s.vocab, s.vocab, false));
    // One block of 1,024 threads a row.
    let argmax_bytes = (p.items * s.vocab * 4) as f64;
    all.push(KernelCost {
        kernel: "argmax",
        launches: 1,
        bytes: argmax_bytes,
        flops: 0.0,
        blocks: p.items,
        secs: predict(
            g,
            argmax_bytes,
            0.0,
            Blocks {
                count: p.items,
                resident: 2,
                in_flight: 16384.0,
            },
        ),
    });
    all
}

/// The seconds a pass's memory traffic takes at full bandwidth if the
/// weights and the KV cache were read once and nothing else moved.
pub fn roofline(s: &Shape, g: &Gpu, p: &Pass) -> f64 {
    let weights = s.layers
        * (s.hidden * (s.heads + 2 * s.kv_heads) * s.head_dim
            + s.heads * s.head_dim * s.hidden
            + 3 * s.hidden * s.intermediate)
        + s.vocab * s.hidden;
    let kv =
        p.items * (p.rows / p.items.max(1) + p.context) * s.layers * s.kv_heads * s.head_dim * 2;
    ((weights + kv) * 2) as f64 / g.bandwidth
}

/// A scenario of the model's table.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: String,
    /// Tokens a pass (or a prefill) produces or consumes.
    pub tokens: usize,
    /// The passes it takes.
    pub passes: Vec<Pass>,
}

/// The scenarios of the goals: decode at a 1,024-token context in
/// batches of 1, 32, 64 and 128, and a 2,048-token prefill in the engine's
/// chunks of 512.
pub fn scenarios() -> Vec<Scenario> {
    let mut v: Vec<Scenario> = [1usize, 32, 64, 128]
        .iter()
        .map(|&b| Scenario {
            name: format!("decode, batch {b}, context 1,024"),
            tokens: b,
            passes: vec![Pass::decode(b, 1024)],
        })
        .collect();
    let chunk = crate::engine::EngineOptions::DEFAULT_PREFILL_CHUNK;
    v.push(Scenario {
        name: format!("prefill 2,048 tokens (chunks of {chunk})"),
        tokens: 2048,
        passes: (0..2048 / chunk)
            .map(|i| Pass {
                rows: chunk,
                items: 1,
                context: i * chunk + chunk / 2,
                max_context: (i + 1) * chunk,
            })
            .collect(),
    });
    v
}

/// A scenario's predicted seconds, roofline seconds and kernel costs.
pub fn predict_scenario(s: &Shape, g: &Gpu, sc: &Scenario) -> (f64, f64, Vec<KernelCost>) {
    let mut total = 0.0;
    let mut roof = 0.0;
    let mut costs: Vec<KernelCost> = Vec::new();
    for p in &sc.passes {
        let c = pass_costs(s, g, p);
        total += c.iter().map(|k| k.secs).sum::<f64>();
        roof += roofline(s, g, p);
        if costs.is_empty() {
            costs = c;
        } else {
            for (a, b) in costs.iter_mut().zip(c) {
                a.bytes += b.bytes;
                a.flops += b.flops;
                a.secs += b.secs;
                a.launches += b.launches;
            }
        }
    }
    (total, roof, costs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_one_decode_is_bound_by_reading_the_weights() {
        let sc = &scenarios()[0];
        let (secs, roof, costs) = predict_scenario(&QWEN3_8B, &H200, sc);
        // 8.2 B parameters of 2 bytes each and a 1k-token cache: ~16.6 GB.
        assert!((3.5e-3..4.5e-3).contains(&roof), "{roof}");
        assert!(secs > roof && secs < 2.0 * roof, "{secs} vs {roof}");
        // The products and their split-K sums take most of the step; small
        // kernels (norms, RoPE, argmax) the rest.
        let gemm: f64 = costs
            .iter()
            .filter(|k| k.kernel.starts_with("gemm") || k.kernel.contains("split-K"))
            .map(|k| k.secs)
            .sum();
        assert!(gemm > 0.75 * secs, "{gemm} of {secs}");
    }

    #[test]
    fn prefill_is_bound_by_the_tensor_cores() {
        let sc = scenarios().pop().expect("the prefill");
        let (secs, roof, costs) = predict_scenario(&QWEN3_8B, &H200, &sc);
        let flops: f64 = costs.iter().map(|k| k.flops).sum();
        // 2 FLOPs a layer parameter (6.95 B) a token, 28.5 TFLOP for 2,048
        // tokens, plus attention's and the last rows' output head.
        assert!((2.85e13..3.2e13).contains(&flops), "{flops}");
        assert!(secs > 3.0 * roof, "{secs} vs {roof}");
    }
}
