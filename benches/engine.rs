//! Kernel benchmarks: the default model's projection shapes (Q5_0 MLP up,
//! Q4_K / Q6_K MLP down, Q8_0 output head) at batch 1, 4 and 16, each with
//! its weights at the file's bits and widened at load, and one decode step of
//! the default model when it is present.

use candle_core::quantized::GgmlDType;
use criterion::{criterion_group, criterion_main, Criterion};
use statebench_kernels::Matrix;

/// One quantized projection of a model shape at batch 1, 4 and 16.
fn projection(c: &mut Criterion, dtype: GgmlDType, rows: usize, cols: usize, name: &str) {
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919) % 101) as f32 / 101.0 - 0.5)
        .collect();
    // Both layouts side by side: the file's own bits, and widened at load
    // (same results, more memory, no unpacking per product).
    let native = Matrix::quantize(dtype, rows, cols, &w).expect("quantize");
    let widened = Matrix::quantize(dtype, rows, cols, &w)
        .expect("quantize")
        .widen();
    drop(w);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .expect("pool");
    for n in [1usize, 4, 16] {
        let x: Vec<f32> = (0..n * cols).map(|i| (i % 13) as f32 / 13.0).collect();
        let mut y = vec![0f32; n * rows];
        for (layout, m) in [("file bits", &native), ("widened", &widened)] {
            c.bench_function(&format!("{name} {rows}x{cols} batch {n} {layout}"), |b| {
                b.iter(|| pool.install(|| m.matmul(&x, n, &mut y)))
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

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = matmul, big_matmul, decode_step
}
criterion_main!(benches);
