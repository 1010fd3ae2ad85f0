//! A performance model of the CUDA engine (`statebench bench --gpu-model`):
//! for a model shape and a GPU, each kernel's traffic per forward pass as
//! the kernels' tile schedules make it (bytes from device memory, through
//! L2 and through shared memory, tensor FLOPs with rows padded to the
//! fragments, split matrix products writing and reading their partial
//! sums, attention's chunk partials), the blocks each launch has against
//! the multiprocessors and waves they fill, and the time each takes at
//! whichever of device-memory bandwidth, the bytes its blocks keep in
//! flight, L2, shared memory and mma.sync throughput binds it (named in
//! the tables). Every constant below names its public source; the two
//! this model assumes say so. Its figures are predictions until a GPU
//! measures the same passes (`statebench check gpu`'s timings).

use super::cuda::{
    gemm_in_block, gemm_splits, Pipelines, ATTN_CHUNK, GEMM_BK, GEMM_BM, GEMM_BN, KV_BLOCK,
};

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
    /// The clock the datasheet's tensor peak is computed at, Hz.
    pub clock: f64,
    /// Dense bf16 tensor FLOP/s of the datasheet.
    pub peak_bf16: f64,
    /// The fraction of `peak_bf16` that `mma.sync` reaches at best.
    pub mma_fraction: f64,
    /// Device-memory bytes a second of the datasheet, and the fraction of
    /// it a streaming read attains.
    pub dram: f64,
    pub dram_fraction: f64,
    /// L2 bytes a second, all slices together.
    pub l2_bandwidth: f64,
    /// Bytes of L2 cache: what several blocks read of one layer's keys and
    /// values comes from device memory once while it fits.
    pub l2: f64,
    /// Shared-memory bytes one multiprocessor reads or writes a clock.
    pub smem_per_clock: f64,
    /// Seconds each kernel of a replayed CUDA graph costs beyond its work.
    pub launch: f64,
    /// Seconds a load from device memory takes under load: a
    /// multiprocessor streams at most its bytes in flight per latency.
    pub latency: f64,
    pub pipes: Pipelines,
}

impl Gpu {
    /// Device-memory bytes a second a streaming kernel attains.
    pub fn bandwidth(&self) -> f64 {
        self.dram * self.dram_fraction
    }

    /// bf16 FLOP/s `mma.sync` attains at best.
    pub fn mma(&self) -> f64 {
        self.peak_bf16 * self.mma_fraction
    }

    /// Shared-memory bytes a second, all multiprocessors together.
    pub fn smem_bandwidth(&self) -> f64 {
        self.smem_per_clock * self.sms as f64 * self.clock
    }
}

/// An H200 SXM. Sources:
/// - 132 multiprocessors and 50 MB of L2: NVIDIA H100 Tensor Core GPU
///   Architecture whitepaper (H100 SXM5); the H200 is the same GH100
///   configuration with HBM3e (NVIDIA H200 datasheet).
/// - 989 TFLOP/s dense bf16: the H200 datasheet's 1,979 TFLOP/s "with
///   sparsity", halved. At the whitepaper's 4,096 dense bf16 FLOP a clock
///   per multiprocessor (twice the A100's 2,048) that is a 1.83 GHz clock.
/// - mma.sync at 63% of that peak at best: Spector et al., "GPUs Go Brrr"
///   (Hazy Research, 2024): without wgmma an H100 "tops out around 63%" of
///   its peak. (FlashAttention-3, Shah et al. 2024, reports the mma.sync
///   FlashAttention-2 at 35% on H100 attention.)
/// - 4.8 TB/s of HBM3e: the H200 datasheet. That a streaming read attains
///   85% of it is this model's assumption (no public measurement of an
///   H200 stream was found; the same blog puts the H100's 3 TB/s as "a
///   bit less in practice"); `check gpu` times the products at batch 1,
///   which stream their weights.
/// - 12 TB/s of L2: "GPUs Go Brrr" (H100 SXM, both partitions).
/// - 128 shared-memory bytes a clock per multiprocessor: the CUDA C++
///   Programming Guide (32 banks, 32 bits a bank a clock); 30.9 TB/s at
///   1.83 GHz ("GPUs Go Brrr" gives about 33 TB/s for L1 and shared
///   memory together).
/// - 1.5 µs a kernel node of a replayed graph, and 1 µs from a load to
///   its data under load: this model's assumptions (the order of the
///   launch gaps in NVIDIA's "Getting Started with CUDA Graphs", and of
///   the loaded latencies microbenchmarks report); `check gpu` measures
///   whole graph-replayed steps against them.
pub const H200: Gpu = Gpu {
    name: "H200",
    sms: 132,
    clock: 1.83e9,
    peak_bf16: 989e12,
    mma_fraction: 0.63,
    dram: 4.8e12,
    dram_fraction: 0.85,
    l2_bandwidth: 12e12,
    l2: 50e6,
    smem_per_clock: 128.0,
    launch: 1.5e-6,
    latency: 1e-6,
    pipes: Pipelines::DEEP,
};

/// An A100 SXM 80 GB. Sources: 108 multiprocessors, 40 MB of L2 and a
/// 1.41 GHz boost clock (NVIDIA A100 Tensor Core GPU Architecture
/// whitepaper); 312 TFLOP/s dense bf16 and 2,039 GB/s of HBM2e (A100
/// datasheet). mma.sync is sm_80's own tensor instruction, so its ceiling
/// is the datasheet's peak; shared memory as on the H200 (the Programming
/// Guide's 128 bytes a clock). L2 at 5 TB/s: the whitepaper's 2.3× the
/// V100's L2 read bandwidth, which Jia et al. ("Dissecting the NVIDIA
/// Volta GPU Architecture via Microbenchmarking", 2018) measured near
/// 2.2 TB/s. The attained fraction of device memory, the graph-node cost
/// and the loaded latency are the H200's assumptions.
pub const A100: Gpu = Gpu {
    name: "A100",
    sms: 108,
    clock: 1.41e9,
    peak_bf16: 312e12,
    mma_fraction: 1.0,
    dram: 2.039e12,
    dram_fraction: 0.85,
    l2_bandwidth: 5e12,
    l2: 40e6,
    smem_per_clock: 128.0,
    launch: 1.5e-6,
    latency: 1e-6,
    pipes: Pipelines::DEEP,
};

/// What bounds a kernel's predicted time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// Device-memory bandwidth.
    Dram,
    /// The bytes its blocks keep in flight (too few blocks, or too little
    /// each, to cover the load latency).
    InFlight,
    L2,
    SharedMemory,
    /// mma.sync throughput.
    Tensor,
    /// The graph node's cost exceeds the work.
    Launch,
}

impl Bound {
    pub fn name(self) -> &'static str {
        match self {
            Bound::Dram => "HBM bandwidth",
            Bound::InFlight => "bytes in flight",
            Bound::L2 => "L2",
            Bound::SharedMemory => "shared memory",
            Bound::Tensor => "mma.sync",
            Bound::Launch => "launch",
        }
    }
}

/// One kernel of a pass: what it moves and computes, and its blocks.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelCost {
    pub kernel: &'static str,
    /// Launches a pass (per layer kernels: once a layer).
    pub launches: usize,
    /// Bytes from and to device memory, over all launches.
    pub bytes: f64,
    /// Bytes through L2 to the multiprocessors, over all launches.
    pub l2_bytes: f64,
    /// Bytes written to and read from shared memory, over all launches.
    pub smem_bytes: f64,
    /// Tensor-core FLOPs issued (padding included), over all launches.
    pub flops: f64,
    /// Blocks of one launch.
    pub blocks: usize,
    /// Predicted seconds, over all launches.
    pub secs: f64,
    /// What binds the time (of the first launch, where they differ).
    pub bound: Bound,
}

impl KernelCost {
    /// `n` launches of this one.
    fn scale(&mut self, n: usize) {
        let f = n as f64;
        self.launches *= n;
        self.bytes *= f;
        self.l2_bytes *= f;
        self.smem_bytes *= f;
        self.flops *= f;
        self.secs *= f;
    }

    /// Adds `o`'s launches to these.
    fn add(&mut self, o: &KernelCost) {
        self.launches += o.launches;
        self.bytes += o.bytes;
        self.l2_bytes += o.l2_bytes;
        self.smem_bytes += o.smem_bytes;
        self.flops += o.flops;
        self.secs += o.secs;
    }
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

/// What one launch moves and computes.
#[derive(Debug, Clone, Copy, Default)]
struct Work {
    dram: f64,
    l2: f64,
    smem: f64,
    flops: f64,
}

/// Predicted time of one launch, and what binds it. Device memory is
/// shared by all: each wave of resident blocks streams at the bandwidth,
/// or at the bytes its blocks keep in flight per load latency (Little's
/// law), whichever is less. L2, shared memory and the tensor cores are
/// each multiprocessor's own share of the whole: the busiest
/// multiprocessor does its blocks' part (blocks spread evenly, waves of
/// `sms × resident`), so a partial last wave costs a whole one.
fn predict(g: &Gpu, w: Work, b: Blocks) -> (f64, Bound) {
    let count = b.count.max(1);
    let slots = g.sms * b.resident.max(1);
    let waves = count.div_ceil(slots);
    let last = count - (waves - 1) * slots;
    let per_block = w.dram / count as f64;
    let stream = |blocks: usize| {
        let rate = g.bandwidth().min(blocks as f64 * b.in_flight / g.latency);
        blocks as f64 * per_block / rate
    };
    let dram = (waves - 1) as f64 * stream(slots) + stream(last);
    let lead = if waves > 1 { slots } else { last };
    let dram_bound = if g.bandwidth() <= lead as f64 * b.in_flight / g.latency {
        Bound::Dram
    } else {
        Bound::InFlight
    };
    // Blocks on the busiest multiprocessor, as a fraction of all.
    let busiest = if count <= slots {
        count.div_ceil(g.sms)
    } else {
        waves * b.resident.max(1)
    } as f64
        / count as f64;
    let share = |total: f64, rate: f64| total * busiest / (rate / g.sms as f64);
    let terms = [
        (dram, dram_bound),
        (share(w.l2, g.l2_bandwidth), Bound::L2),
        (share(w.smem, g.smem_bandwidth()), Bound::SharedMemory),
        (share(w.flops, g.mma()), Bound::Tensor),
    ];
    let (t, bound) = terms
        .into_iter()
        .fold((0.0, Bound::Launch), |a, b| if b.0 > a.0 { b } else { a });
    let bound = if g.launch > t { Bound::Launch } else { bound };
    (t + g.launch, bound)
}

/// A kernel's cost from one launch's work.
fn cost(g: &Gpu, kernel: &'static str, w: Work, b: Blocks) -> KernelCost {
    let (secs, bound) = predict(g, w, b);
    KernelCost {
        kernel,
        launches: 1,
        bytes: w.dram,
        l2_bytes: w.l2,
        smem_bytes: w.smem,
        flops: w.flops,
        blocks: b.count,
        secs,
        bound,
    }
}

/// A kernel that streams `bytes` once (norms, RoPE, sums).
fn streaming(g: &Gpu, kernel: &'static str, bytes: f64, blocks: usize) -> KernelCost {
    let w = Work {
        dram: bytes,
        l2: bytes,
        ..Work::default()
    };
    cost(g, kernel, w, Blocks::small(blocks))
}

/// The matrix product `rows × k` by a weight of `out × k` (`gemm.cu`):
/// the weight read once from device memory and once through L2 by each
/// row tile, the activations once and through L2 by each output tile;
/// each k-slice written to shared memory whole (rows past the batch
/// zero-filled) and read by the warps that hold rows, 4 ldmatrix.x4 of the
/// weight and one for each two of their 8-row fragments per 16 of k; a
/// decode step's k-ranges written and read back as partial sums.
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
    let in_block = gemm_in_block(rows, splits);
    let (m_blocks, n_blocks) = (out.div_ceil(GEMM_BM), rows.div_ceil(GEMM_BN));
    let blocks = m_blocks * n_blocks * if in_block { 1 } else { splits };
    let k_tiles = k.div_ceil(GEMM_BK) as f64;
    // Shared memory a k-slice of one row tile of `r` rows: the slices
    // written, then per 16 of k each working warp's fragments read (512
    // bytes an ldmatrix.x4). Two warps along the outputs, four along the
    // rows, each 32 rows in fragments of 8.
    let slice_smem = |r: usize| {
        let mut bytes = ((GEMM_BM + GEMM_BN) * GEMM_BK * 2) as f64;
        for wn in 0..4 {
            let frags = r.saturating_sub(wn * 32).div_ceil(8).min(4);
            if frags > 0 {
                bytes += 2.0 * (GEMM_BK / 16) as f64 * (4 + frags.div_ceil(2)) as f64 * 512.0;
            }
        }
        bytes
    };
    let full_tiles = rows / GEMM_BN;
    let tail = rows % GEMM_BN;
    let smem = m_blocks as f64
        * k_tiles
        * (full_tiles as f64 * slice_smem(GEMM_BN) + if tail > 0 { slice_smem(tail) } else { 0.0 });
    // Outputs padded to the tile (both output warps compute all their
    // fragments); rows to the fragment's 8.
    let flops = 2.0 * (m_blocks * GEMM_BM) as f64 * k as f64 * (rows.div_ceil(8) * 8) as f64;
    let weights = (out * k * 2) as f64;
    let acts = (rows * k * 2) as f64;
    let l2 = weights * n_blocks as f64 + acts * m_blocks as f64;
    let written = (rows * out_width * 2) as f64 * if residual { 2.0 } else { 1.0 };
    // One block a multiprocessor (256 threads of about 200 registers);
    // each has its stages but the one computed in flight: weight rows and
    // batch rows.
    let tile = Blocks {
        count: blocks,
        resident: 1,
        in_flight: ((g.pipes.gemm - 1) * (GEMM_BM + rows.min(GEMM_BN)) * GEMM_BK * 2) as f64,
    };
    let mut v = Vec::new();
    let mut work = Work {
        dram: weights + acts,
        l2,
        smem,
        flops,
    };
    if in_block {
        work.dram += written;
        v.push(cost(g, kernel, work, tile));
    } else {
        let partial = (splits * rows * out * 4) as f64;
        work.dram += partial;
        v.push(cost(g, kernel, work, tile));
        let reduce_blocks = (rows * out_width).div_ceil(256);
        v.push(streaming(
            g,
            "  split-K sum",
            partial + written,
            reduce_blocks,
        ));
    }
    v
}

/// Every kernel of one pass of `s` on `g`, per layer kernels summed over
/// the layers.
pub fn pass_costs(s: &Shape, g: &Gpu, p: &Pass) -> Vec<KernelCost> {
    let (r, h, d) = (p.rows, s.hidden, s.head_dim);
    let (qd, kvd) = (s.heads * d, s.kv_heads * d);
    let group = s.heads / s.kv_heads;
    let small = |kernel, bytes: f64, blocks: usize| streaming(g, kernel, bytes, blocks);
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
    // Every tile's keys and values come through L2 and are written to
    // shared memory once, then read by each of its 4 warps.
    let attn = Work {
        dram: attn_bytes,
        l2: read + (r * qd * 2 * 2) as f64 + partials,
        smem: read * 5.0,
        flops,
    };
    // Two blocks fit a multiprocessor; each has the next sub-tile's keys
    // and values in flight while it computes one.
    layer.push(cost(
        g,
        "attention",
        attn,
        Blocks {
            count: blocks,
            resident: 2,
            in_flight: (KV_BLOCK * d * 2 * 2) as f64,
        },
    ));
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
        k.scale(s.layers);
        match all.iter_mut().find(|a| a.kernel == k.kernel) {
            Some(a) => a.add(&k),
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
    all.push(cost(
        g,
        "argmax",
        Work {
            dram: argmax_bytes,
            l2: argmax_bytes,
            ..Work::default()
        },
        Blocks {
            count: p.items,
            resident: 2,
            in_flight: 16384.0,
        },
    ));
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
    ((weights + kv) * 2) as f64 / g.bandwidth()
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
                a.add(&b);
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
    fn prefill_products_are_bound_on_chip_not_by_device_memory() {
        let sc = scenarios().pop().expect("the prefill");
        let (secs, roof, costs) = predict_scenario(&QWEN3_8B, &H200, &sc);
        let flops: f64 = costs.iter().map(|k| k.flops).sum();
        // 2 FLOPs a layer parameter (6.95 B) a token, 28.5 TFLOP for 2,048
        // tokens, plus outputs padded to 128-row tiles, attention's and the
        // last rows' output head.
        assert!((2.85e13..3.2e13).contains(&flops), "{flops}");
        assert!(secs > 3.0 * roof, "{secs} vs {roof}");
        // Full tiles read 16 FLOP a shared-memory byte (the 128 × 128
        // tile's 8 warps of 64 × 32, slices written counted), and shared
        // memory binds before mma.sync and L2 do.
        for k in costs
            .iter()
            .filter(|k| k.kernel.starts_with("gemm") && k.kernel != "gemm lm_head")
        {
            let per_byte = k.flops / k.smem_bytes;
            assert!((15.5..16.5).contains(&per_byte), "{}: {per_byte}", k.kernel);
            assert_eq!(k.bound, Bound::SharedMemory, "{}", k.kernel);
        }
        // Prefill products sum their ranges in the block: no split-K sums.
        assert!(costs.iter().all(|k| !k.kernel.contains("split-K")));
    }

    #[test]
    fn decode_products_stream_their_weights_at_the_bandwidth() {
        for b in [1, 128] {
            let (_, _, costs) = predict_scenario(
                &QWEN3_8B,
                &H200,
                &Scenario {
                    name: String::new(),
                    tokens: b,
                    passes: vec![Pass::decode(b, 1024)],
                },
            );
            for k in costs.iter().filter(|k| k.kernel.starts_with("gemm")) {
                assert!(
                    matches!(k.bound, Bound::Dram | Bound::SharedMemory),
                    "batch {b}, {}: {:?}",
                    k.kernel,
                    k.bound
                );
            }
        }
    }

    /// The goals the tiles are sized for, under this model's constants:
    /// Qwen3-8B bf16 on an H200, decode at batch 1 ≥ 180 tok/s and at
    /// batch 128 ≥ 9,000, a 2,048-token prefill ≥ 20,000.
    #[test]
    fn the_h200_goals_hold_under_the_model() {
        let all = scenarios();
        let rate = |sc: &Scenario| {
            let (secs, _, _) = predict_scenario(&QWEN3_8B, &H200, sc);
            sc.tokens as f64 / secs
        };
        assert!(rate(&all[0]) >= 180.0, "batch 1: {}", rate(&all[0]));
        assert!(rate(&all[3]) >= 9_000.0, "batch 128: {}", rate(&all[3]));
        assert!(rate(&all[4]) >= 20_000.0, "prefill: {}", rate(&all[4]));
    }

    /// A partial last wave costs a whole one on each multiprocessor's own
    /// resources: 133 compute-bound blocks take twice as long as 132.
    #[test]
    fn a_partial_wave_costs_a_whole_one() {
        let w = |n: usize| Work {
            flops: 1e9 * n as f64,
            ..Work::default()
        };
        let b = |count| Blocks {
            count,
            resident: 1,
            in_flight: 0.0,
        };
        let (t132, bound) = predict(&H200, w(132), b(132));
        let (t133, _) = predict(&H200, w(133), b(133));
        assert_eq!(bound, Bound::Tensor);
        let ratio = (t133 - H200.launch) / (t132 - H200.launch);
        assert!((ratio - 2.0).abs() < 0.02, "{ratio}");
    }
}
