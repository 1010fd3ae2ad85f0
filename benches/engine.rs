//! Kernel benchmarks: the default model's projection shapes (Q5_0 MLP up,
//! Q4_K / Q6_K MLP down, Q8_0 output head) at batch 1, 4 and 16, each with
//! its weights at the file's bits and widened at load; the MLP shapes at
//! batch 1 to 512, widened in groups of eight rows and in pairs of groups,
//! on the vector kernels (where the CPU has AVX-512) and, from sixteen
//! rows, on AMX tiles (where it has them); a layer's q, k and v and its
//! gate and up, one product at a time against all of one input's together;
//! the MLP shapes on the AVX2 kernels' short path for small weights and
//! their general path; attention of one row over 256 and 2,048 positions;
//! the pair kernels on one thread with their weights in L2 (arithmetic
//! apart from memory); and one decode step of the default model when it is
//! present.

use candle_core::quantized::GgmlDType;
use criterion::{criterion_group, criterion_main, Criterion};
use statebench_kernels::{matmul_each, Matrix};

/// A pool of `threads` for the products here: two, as the book's figures,
/// unless a group says otherwise. Each timing loop runs inside the pool
/// (`pool.install(|| b.iter(..))`): a call into the pool from criterion's
/// own thread per iteration would time that thread's sleep and wake-up too
/// (on a one-thread pool, Q8_0 batch 4 in cache measured 84 µs a call that
/// way against 16 inside).
fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("pool")
}

/// The default model's MLP shapes: the Q5_0 gate and up, the Q4_K down.
const MLP: [(GgmlDType, usize, usize, &str); 2] = [
    (GgmlDType::Q5_0, 4864, 896, "q5_0"),
    (GgmlDType::Q4K, 896, 4864, "q4_k"),
];

/// Weights of a `rows × cols` matrix, spread over ±0.5.
fn weights(rows: usize, cols: usize) -> Vec<f32> {
    (0..rows * cols)
        .map(|i| ((i * 7919) % 101) as f32 / 101.0 - 0.5)
        .collect()
}

/// One quantized projection of a model shape at batch 1, 4 and 16.
fn projection(c: &mut Criterion, dtype: GgmlDType, rows: usize, cols: usize, name: &str) {
    let w = weights(rows, cols);
    // Both layouts side by side: the file's own bits, and widened at load
    // (same results, more memory, no unpacking per product).
    let native = Matrix::quantize(dtype, rows, cols, &w).expect("quantize");
    let widened = Matrix::quantize(dtype, rows, cols, &w)
        .expect("quantize")
        .widen();
    drop(w);
    let pool = pool(2);
    for n in [1usize, 4, 16] {
        let x: Vec<f32> = (0..n * cols).map(|i| (i % 13) as f32 / 13.0).collect();
        let mut y = vec![0f32; n * rows];
        for (layout, m) in [("file bits", &native), ("widened", &widened)] {
            c.bench_function(&format!("{name} {rows}x{cols} batch {n} {layout}"), |b| {
                pool.install(|| b.iter(|| m.matmul(&x, n, &mut y)))
            });
        }
    }
}

fn matmul(c: &mut Criterion) {
    projection(c, GgmlDType::Q5_0, 4864, 896, "q5_0");
    // The MLP down projection, which the default file stores as Q4_K / Q6_K.
    projection(c, GgmlDType::Q4K, 896, 4864, "q4_k");
    projection(c, GgmlDType::Q6K, 896, 4864, "q6_k");
}

/// The default model's products that read one input (q, k, v: Q5_0, Q5_0,
/// Q8_0; gate and up: Q5_0), widened, at decode batches and a prefill
/// chunk: one `matmul` each (a quantization of the input and a wait on the
/// pool each) against `matmul_each` (one of each). The same bits.
fn shared_input(c: &mut Criterion) {
    let pool = pool(2);
    let cols = 896;
    let mat = |dtype, rows: usize, salt: usize| {
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919 + salt) % 101) as f32 / 101.0 - 0.5)
            .collect();
        Matrix::quantize(dtype, rows, cols, &w)
            .expect("quantize")
            .widen()
    };
    let qkv = [
        mat(GgmlDType::Q5_0, 896, 1),
        mat(GgmlDType::Q5_0, 128, 2),
        mat(GgmlDType::Q8_0, 128, 3),
    ];
    let gate_up = [mat(GgmlDType::Q5_0, 4864, 4), mat(GgmlDType::Q5_0, 4864, 5)];
    for (name, ms) in [("q k v", &qkv[..]), ("gate up", &gate_up[..])] {
        let ws: Vec<&Matrix> = ms.iter().collect();
        for n in [1usize, 4, 16, 64] {
            let x: Vec<f32> = (0..n * cols)
                .map(|i| (i % 13) as f32 / 13.0 - 0.4)
                .collect();
            let mut ys: Vec<Vec<f32>> = ms.iter().map(|m| vec![0f32; n * m.rows()]).collect();
            c.bench_function(&format!("{name} batch {n}, one product at a time"), |b| {
                pool.install(|| {
                    b.iter(|| {
                        for (m, y) in ms.iter().zip(ys.iter_mut()) {
                            m.matmul(&x, n, y)
                        }
                    })
                })
            });
            c.bench_function(&format!("{name} batch {n}, together"), |b| {
                pool.install(|| {
                    b.iter(|| {
                        let mut outs: Vec<&mut [f32]> =
                            ys.iter_mut().map(|y| y.as_mut_slice()).collect();
                        matmul_each(&ws, &x, n, &mut outs)
                    })
                })
            });
        }
    }
}

/// Decode- and prefill-sized batches, weights in groups of eight rows and
/// in pairs of groups, with the AMX kernels on and off where the CPU has
/// them (the same bits); the vector kernels alone on AVX-512 without AMX.
fn tiles(c: &mut Criterion) {
    #[cfg(target_arch = "x86_64")]
    {
        use statebench_kernels::Isa;
        let amx = statebench_kernels::amx_tiles();
        if !amx && statebench_kernels::isa().map_or(true, |i| i < Isa::Avx512) {
            eprintln!("no AVX-512 on this CPU; skipping the tile benchmarks");
            return;
        }
        let kernels: &[(&str, bool)] = if amx {
            &[("amx", true), ("vector", false)]
        } else {
            &[("vector", false)]
        };
        let pool = pool(2);
        for (dtype, rows, cols, name) in MLP {
            let w = weights(rows, cols);
            let quantized = || Matrix::quantize(dtype, rows, cols, &w).expect("quantize");
            let groups = quantized().widen();
            let pairs = quantized().widen().paired();
            for n in [1usize, 4, 8, 16, 64, 512] {
                let x: Vec<f32> = (0..n * cols).map(|i| (i % 13) as f32 / 13.0).collect();
                let mut y = vec![0f32; n * rows];
                for (layout, m) in [("groups", &groups), ("pairs", &pairs)] {
                    for &(kernels, on) in kernels {
                        // Below a whole tile the AMX path is the vector one.
                        if on && n < 16 {
                            continue;
                        }
                        let id = format!("{name} {rows}x{cols} batch {n} {layout} {kernels}");
                        c.bench_function(&id, |b| {
                            statebench_kernels::cpu::set_amx_tiles(on);
                            pool.install(|| b.iter(|| m.matmul(&x, n, &mut y)));
                            statebench_kernels::cpu::set_amx_tiles(amx);
                        });
                    }
                }
            }
        }
    }
}

/// Weights within ±16 (the MLP's Q5_0 gate and up; its Q4_K down, which
/// keeps the general path either way, as a control), widened, at decode
/// batches and a prefill chunk: the AVX2 kernels' short path for them
/// against their general path (the same bits). Where the CPU has VNNI
/// both run the VNNI kernels; run it with `STATEBENCH_CPU_ISA=avx2` there.
fn short_path(c: &mut Criterion) {
    let pool = pool(2);
    for (dtype, rows, cols, name) in MLP {
        let m = Matrix::quantize(dtype, rows, cols, &weights(rows, cols))
            .expect("quantize")
            .widen();
        for n in [1usize, 4, 16, 64] {
            let x: Vec<f32> = (0..n * cols).map(|i| (i % 13) as f32 / 13.0).collect();
            let mut y = vec![0f32; n * rows];
            for (path, on) in [("short", true), ("general", false)] {
                let id = format!("{name} {rows}x{cols} batch {n} widened, {path} path");
                c.bench_function(&id, |b| {
                    statebench_kernels::cpu::set_short_path(on);
                    pool.install(|| b.iter(|| m.matmul(&x, n, &mut y)));
                    statebench_kernels::cpu::set_short_path(true);
                });
            }
        }
    }
}

/// One query row (seven heads sharing a KV head, as in the default model)
/// over a cache of 256 and 2,048 positions.
fn attention(c: &mut Criterion) {
    use statebench_kernels::attention::{attend, push_key};
    let (n_kv, hd, group) = (2, 64, 7);
    let val = |i: usize| ((i * 7919) % 1009) as f32 / 1009.0 - 0.5;
    for len in [256usize, 2048] {
        let mut kt = Vec::new();
        for t in 0..len {
            let k: Vec<f32> = (0..n_kv * hd).map(|i| val(t * 131 + i)).collect();
            push_key(&mut kt, t, &k, n_kv, hd);
        }
        let v: Vec<f32> = (0..len * n_kv * hd).map(|i| val(i * 3 + 7)).collect();
        let q: Vec<f32> = (0..group * hd).map(|i| val(i * 5 + 1)).collect();
        let (mut scores, mut out) = (Vec::new(), vec![0f32; group * hd]);
        c.bench_function(&format!("attention, one row over {len} positions"), |b| {
            b.iter(|| attend(&q, &kt, &v, len, 0, n_kv, hd, &mut scores, &mut out))
        });
    }
}

fn big_matmul(c: &mut Criterion) {
    // The output head's shape: too big for cache, so weights stream from memory.
    projection(c, GgmlDType::Q8_0, 151_936, 896, "q8_0");
}

fn decode_step(c: &mut Criterion) {
    use statebench::engine::kv_cache::KvCache;
    use statebench::engine::model::BatchItem;
    use statebench::engine::{Engine, EngineOptions, DEFAULT_MODEL};
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(DEFAULT_MODEL);
    let Ok(engine) = Engine::load(&path.to_string_lossy(), EngineOptions::default()) else {
        eprintln!("default model absent; skipping the decode-step benchmark");
        return;
    };
    let prompt: Vec<u32> = (0..64).map(|i| 1000 + i).collect();
    let mut cache = KvCache::default();
    engine
        .forward(&mut [BatchItem {
            tokens: &prompt,
            cache: &mut cache,
        }])
        .expect("forward");
    c.bench_function("default model decode step, batch 1", |b| {
        b.iter(|| {
            let mut c2 = cache.clone();
            engine
                .forward(&mut [BatchItem {
                    tokens: &[1234],
                    cache: &mut c2,
                }])
                .expect("forward")
        })
    });
}

/// The pair kernels' arithmetic apart from memory: a 512 × 1,024 matrix
/// (Q8_0 and Q4_K widened into pairs, about half a megabyte: it stays in
/// L2) on one thread, in multiply-accumulates a second, to set against the
/// int8 dot peak of one thread (`statebench bench --threads 1`). Unlike the
/// products above, these figures barely move with the host's memory
/// traffic.
fn in_cache(c: &mut Criterion) {
    if !statebench_kernels::cpu::pairs_pay() {
        eprintln!("weights are not held in pairs on this CPU; skipping the in-cache benchmarks");
        return;
    }
    let (rows, cols) = (512, 1024);
    let w = weights(rows, cols);
    let one = pool(1);
    let mut g = c.benchmark_group("pairs in cache, one thread");
    for (dtype, name) in [(GgmlDType::Q8_0, "q8_0"), (GgmlDType::Q4K, "q4_k")] {
        let m = Matrix::quantize(dtype, rows, cols, &w)
            .expect("quantize")
            .widen()
            .paired();
        for n in [4usize, 16, 64] {
            let x: Vec<f32> = (0..n * cols).map(|i| (i % 13) as f32 / 13.0).collect();
            let mut y = vec![0f32; n * rows];
            g.throughput(criterion::Throughput::Elements((rows * cols * n) as u64));
            g.bench_function(format!("{name} {rows}x{cols} batch {n}"), |b| {
                one.install(|| b.iter(|| m.matmul(&x, n, &mut y)))
            });
        }
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = matmul, tiles, in_cache, shared_input, short_path, attention, big_matmul, decode_step
}
criterion_main!(benches);
