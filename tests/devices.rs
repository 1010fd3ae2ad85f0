//! The devices behind the one forward pass: each operation of candle's
//! device (the code Metal runs) against the CPU's on random inputs, and the
//! CUDA device's operations, models and invariance. The CUDA tests run on
//! the CUDA emulator (the same kernels and host code, executed on the CPU)
//! unless `STATEBENCH_TEST_GPU=real` points them at GPU 0, as
//! `scripts/gpu-check.sh` does on a GPU machine.

mod engine_common;

use statebench::engine::device::candle::Candle;
use statebench::engine::device::check::{compare, KernelDiff};
use statebench::engine::device::Cpu;

fn print(diffs: &[KernelDiff]) {
    for d in diffs {
        eprintln!(
            "{:<18} max abs {:.3e}  max rel {:.3e}  max {:.2} bf16 ulps  ({} values)",
            d.kernel, d.max_abs, d.max_rel, d.max_bf16_ulps, d.values
        );
    }
}

#[test]
fn candle_operations_agree_with_the_cpu() {
    use statebench::engine::device::check::{agrees, Rounding};
    let diffs = compare(&Cpu, &Candle::cpu(), 7).expect("both devices run");
    print(&diffs);
    assert_eq!(diffs.len(), 12);
    for d in &diffs {
        assert!(agrees(d, Rounding::F32), "{}: {d:?}", d.kernel);
    }
}

/// The invariance check `statebench check invariance` and the GPU script
/// run: on the CPU every hash agrees.
#[test]
fn invariance_check_holds_on_the_cpu() {
    let dir = engine_common::root().join("tests/fixtures/engine/tiny-qwen2");
    let mut engine = engine_common::load(&dir);
    let out = statebench::engine::device::check::invariance(&mut engine, &[3, 8], 8).expect("runs");
    assert_eq!(out.len(), 5);
    let (first, turns) = out.split_at(3);
    assert!(first.iter().all(|o| o.hash == first[0].hash), "{first:?}");
    assert_eq!(turns[0].hash, turns[1].hash, "{turns:?}");
    assert!(turns[0].case.contains("cached") && !turns[0].case.starts_with("second turn, 0 "));
}

#[cfg(feature = "cuda")]
#[path = "cuda/bf16_reference.rs"]
mod bf16_reference;

#[cfg(feature = "cuda")]
mod cuda {
    use super::*;
    use crate::bf16_reference;
    use engine_common::*;
    use statebench::backend::ChatRequest;
    use statebench::engine::device::check::{compare_at, Shapes};
    use statebench::engine::device::cuda::{Cuda, KV_BLOCK};
    use statebench::engine::device::Heads;
    use statebench::engine::{Engine, EngineOptions};
    use std::path::Path;

    /// The device under test: the emulator, or GPU 0 with
    /// `STATEBENCH_TEST_GPU=real`.
    fn gpu() -> Cuda {
        if real_gpu() {
            Cuda::open(0).expect("a CUDA GPU")
        } else {
            Cuda::open_emulated().unwrap_or_else(|e| panic!("{}", statebench::one_line(&e)))
        }
    }

    fn real_gpu() -> bool {
        std::env::var("STATEBENCH_TEST_GPU").as_deref() == Ok("real")
    }

    fn engine_on_gpu(dir: &Path) -> Engine<Cuda> {
        let opts = EngineOptions {
            kv_budget_bytes: 64 << 20,
            ..EngineOptions::default()
        };
        Engine::load_on(gpu(), &dir.to_string_lossy(), opts).expect("loads on the GPU")
    }

    /// The CUDA engine against its arithmetic written plainly on the host
    /// (`cuda/bf16_reference.rs`: the same bf16 roundings, exact sums), so
    /// only the order of f32 sums differs, and the greedy paths equal; the
    /// distance to the CPU engine holding the same bf16 matrices and to the
    /// transformers logits of the f32 checkpoint is printed beside it.
    fn agrees_with_its_reference(name: &str) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let bf16 = tiny_bf16_copy(tmp.path(), name);
        let gpu = engine_on_gpu(&bf16);
        let cpu = load(&bf16);
        let reference = bf16_reference::Reference::load(&bf16);
        let f32_dir = root().join("tests/fixtures/engine").join(name);
        let fixtures: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(f32_dir.join("logits.json")).expect("logits.json"),
        )
        .expect("parses");
        for case in fixtures["cases"].as_array().expect("cases") {
            let input: Vec<u32> = serde_json::from_value(case["input_ids"].clone()).expect("ids");
            let transformers: Vec<f32> =
                serde_json::from_value(case["last_logits"].clone()).expect("logits");
            let g = cold_logits(&gpu, &input);
            let want = reference.logits(&input);
            let d = max_abs_diff(&g, &want);
            eprintln!(
                "{name} {}: GPU vs its bf16 reference {d:.3e}; vs the CPU engine (f32 activations) {:.3e}; vs transformers f32 {:.3e}",
                case["name"],
                max_abs_diff(&g, &cold_logits(&cpu, &input)),
                max_abs_diff(&g, &transformers),
            );
            assert!(d <= reference_tolerance(), "{name} {}: {d}", case["name"]);
            let (gt, _) = greedy_incremental(&gpu, &input, 8);
            let mut rt = Vec::new();
            let mut seq = input.clone();
            for _ in 0..8 {
                let next = statebench::engine::sampling::argmax(&reference.logits(&seq));
                rt.push(next);
                seq.push(next);
            }
            assert_eq!(gt, rt, "{name} {}: greedy tokens", case["name"]);
        }
    }

    /// How far the logits may be from the reference: the emulator sums
    /// each mma's products in double, and measured within 1e-6 of it (no
    /// bf16 rounding flipped); a GPU's tensor cores sum in their own order,
    /// where one flipped bf16 rounding moves a tiny model's logit by about
    /// 1e-3.
    fn reference_tolerance() -> f32 {
        if real_gpu() {
            1e-2
        } else {
            1e-5
        }
    }

    #[test]
    #[cfg_attr(
        not(has_cuda_emulator),
        ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
    )]
    fn tiny_qwen2_on_cuda_agrees_with_its_reference() {
        agrees_with_its_reference("tiny-qwen2");
    }

    #[test]
    #[cfg_attr(
        not(has_cuda_emulator),
        ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
    )]
    fn tiny_qwen3_on_cuda_agrees_with_its_reference() {
        agrees_with_its_reference("tiny-qwen3");
    }

    /// The invariance promise on the GPU, bit for bit: incremental decode
    /// equals recompute, a cached prefix equals a cold prefill (split
    /// anywhere, across KV blocks), and a request's tokens are the same
    /// alone and in batches of 2, 4 and 16.
    #[test]
    #[cfg_attr(
        not(has_cuda_emulator),
        ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
    )]
    fn cuda_invariance_a_b_c() {
        for name in ["tiny-qwen2", "tiny-qwen3"] {
            let mut gpu = engine_on_gpu(&root().join("tests/fixtures/engine").join(name));
            let prompt: Vec<u32> = (0..40).map(|i| 5 + i * 7 % 90).collect();
            check_incremental_equals_recompute(&gpu, &prompt, 12);
            check_split_prefill(&gpu, &prompt, &[1, 2, 11, 16, 17, 33]);
            let others: Vec<ChatRequest> = (0..15)
                .map(|i| {
                    let mut req = ask(&"word ".repeat(1 + i * 3), 3 + i % 7);
                    req.temperature = if i % 2 == 0 { 0.0 } else { 1.0 };
                    req.seed = i as u64;
                    req
                })
                .collect();
            check_batch_invariance(&mut gpu, ask("Name a colour.", 12), &others);
        }
    }

    /// A short conversation (a one-line system message, so prompts are a
    /// few dozen tokens and the emulator's attention stays cheap).
    fn short(user: &str, max_tokens: usize) -> ChatRequest {
        use statebench::backend::{Message, Role};
        ChatRequest::greedy(
            vec![
                Message::new(Role::System, "Be brief."),
                Message::new(Role::User, user),
            ],
            max_tokens,
        )
    }

    /// One request's tokens alone and in batches of 3, 32 and 128 beside
    /// requests of other lengths (greedy and sampled), prefilled in chunks
    /// of 7 tokens, and its second turn cached against cold: all equal.
    #[test]
    #[cfg_attr(
        not(has_cuda_emulator),
        ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
    )]
    fn cuda_invariance_in_large_batches_and_chunked_prefill() {
        let dir = root().join("tests/fixtures/engine/tiny-qwen2");
        let opts = EngineOptions {
            kv_budget_bytes: 64 << 20,
            prefill_chunk: 7,
            ..EngineOptions::default()
        };
        let mut gpu = Engine::load_on(gpu(), &dir.to_string_lossy(), opts).expect("loads");
        let target = short("Name a colour.", 8);
        let others: Vec<ChatRequest> = (0..127)
            .map(|i| {
                let mut r = short(&"word ".repeat(1 + i % 11), 2 + i % 9);
                if i % 2 == 1 {
                    r.temperature = 1.0;
                    r.seed = i as u64;
                }
                r
            })
            .collect();
        let alone = run_alone(&mut gpu, target.clone());
        for n in [3usize, 32, 128] {
            let batched = run_batched(&mut gpu, target.clone(), &others[..n - 1]);
            assert_eq!(batched.tokens, alone.tokens, "batch of {n}");
        }
        // Its second turn with the first cached, and the same conversation cold.
        use statebench::backend::{Backend, Message, Role};
        let mut second = target.clone();
        second
            .messages
            .push(Message::new(Role::Assistant, alone.content.clone()));
        second.messages.push(Message::new(Role::User, "One more."));
        let s = gpu.open_session();
        gpu.chat(s, target).expect("first turn");
        let cached = gpu.chat(s, second.clone()).expect("second turn");
        gpu.close_session(s);
        assert!(cached.usage.cached_tokens > 0, "{:?}", cached.usage);
        let cold = run_alone(&mut gpu, second);
        assert_eq!(cached.tokens, cold.tokens, "cached vs cold");
    }

    /// Decode steps run as CUDA graphs, one captured per batch bucket and
    /// replayed while the caches grow past KV blocks; every request's
    /// tokens equal those of the same batch launched kernel by kernel.
    #[test]
    #[cfg_attr(
        not(has_cuda_emulator),
        ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
    )]
    fn cuda_graphs_change_no_token() {
        use statebench::backend::Backend;
        let dir = root().join("tests/fixtures/engine/tiny-qwen2");
        let mut gpu = engine_on_gpu(&dir);
        let reqs: Vec<ChatRequest> = (0..5)
            .map(|i| {
                let mut r = short(&"word ".repeat(1 + i * 4), 90);
                if i % 2 == 1 {
                    r.temperature = 1.0;
                    r.seed = i as u64;
                }
                r
            })
            .collect();
        let run = |gpu: &mut Engine<Cuda>| -> Vec<Vec<u32>> {
            let mut ids = Vec::new();
            for r in &reqs {
                let s = gpu.open_session();
                ids.push((gpu.submit(s, r.clone()).expect("submit"), s));
            }
            let mut out = vec![Vec::new(); ids.len()];
            while gpu.has_pending() {
                for (id, r) in gpu.step().expect("step") {
                    let at = ids.iter().position(|(i, _)| *i == id).expect("ours");
                    out[at] = r.expect("reply").tokens;
                }
            }
            for (_, s) in ids {
                gpu.close_session(s);
            }
            out
        };
        let graphed = run(&mut gpu);
        let (captured, replayed) = gpu.model().device.graph_counts();
        eprintln!(
            "tokens {:?}; graphs captured {captured}, replayed {replayed}",
            graphed.iter().map(Vec::len).collect::<Vec<_>>()
        );
        assert!(
            captured >= 1 && replayed > 10 * captured,
            "{captured} {replayed}"
        );
        assert!(
            graphed.iter().any(|t| t.len() > KV_BLOCK),
            "no reply crossed a KV block"
        );
        gpu.model().device.set_graphs(false);
        let eager = run(&mut gpu);
        assert_eq!(gpu.model().device.graph_counts(), (captured, replayed));
        assert_eq!(graphed, eager);
    }

    /// `statebench check invariance` on the device in two processes: the
    /// same hashes, and every hash of a process equal.
    #[test]
    #[cfg_attr(
        not(has_cuda_emulator),
        ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
    )]
    fn cuda_invariance_holds_across_processes() {
        let dir = root().join("tests/fixtures/engine/tiny-qwen2");
        // The binary beside a carried test binary (`scripts/gpu-check.sh`), or this build's.
        let bin = std::env::var_os("STATEBENCH_BIN")
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_statebench").into());
        let device = if real_gpu() { "cuda" } else { "cuda-emulated" };
        let run = || {
            let o = std::process::Command::new(&bin)
                .args(["check", "invariance", "--device", device, "--model"])
                .arg(&dir)
                .args([
                    "--batches",
                    "3",
                    "--max-tokens",
                    "6",
                    "--kv-budget-gib",
                    "0.0625",
                ])
                .output()
                .expect("statebench runs");
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
            v.as_array()
                .expect("rows")
                .iter()
                .map(|r| r["hash"].as_str().expect("hash").to_string())
                .collect::<Vec<_>>()
        };
        let (a, b) = (run(), run());
        assert_eq!(a, b, "two processes");
        assert_eq!(a.len(), 4);
        assert!(a[..2].iter().all(|h| *h == a[0]), "{a:?}");
        assert_eq!(a[2], a[3], "cached vs cold: {a:?}");
    }

    #[test]
    #[cfg_attr(
        not(has_cuda_emulator),
        ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
    )]
    fn cuda_operations_agree_with_the_cpu() {
        assert_bf16_close(&compare(&Cpu, &gpu(), 7).expect("both devices run"));
    }

    /// Every operation within the bounds of bf16 results
    /// (`check::Rounding::Bf16`).
    fn assert_bf16_close(diffs: &[KernelDiff]) {
        use statebench::engine::device::check::{agrees, Rounding};
        print(diffs);
        for d in diffs {
            assert!(agrees(d, Rounding::Bf16), "{}: {d:?}", d.kernel);
        }
    }

    /// Every operation at the shapes of the models the engine runs: head
    /// dimensions 64 and 128, 8 KV heads of 4 query heads each, K = 12,288
    /// (split along k), 1 to 128 rows, contexts that cross KV blocks (64
    /// positions) and attention chunks (256), prefilled and decoded.
    #[test]
    #[cfg_attr(
        not(has_cuda_emulator),
        ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
    )]
    fn cuda_operations_agree_with_the_cpu_at_model_shapes() {
        for (rows, dim, steps) in [
            (1, 128, vec![vec![300], vec![1]]),
            (3, 128, vec![vec![520, 70, 1], vec![1, 1, 1]]),
            (7, 64, vec![vec![5, 2], vec![1, 1], vec![16, 3]]),
            (16, 128, vec![vec![16], vec![1]]),
            (33, 64, vec![vec![20, 13], vec![1, 1]]),
            (128, 128, vec![vec![40, 88], vec![1, 1]]),
        ] {
            let shapes = Shapes {
                rows,
                hidden: 12_288,
                inner: 48,
                vocab: 150,
                heads: Heads { q: 32, kv: 8, dim },
                steps,
            };
            let diffs = compare_at(&Cpu, &gpu(), 7, &shapes).expect("both devices run");
            eprintln!("{rows} rows, head dim {dim}:");
            assert_bf16_close(&diffs);
        }
    }

    /// Seeded values in [-scale, scale] that bf16 holds exactly.
    fn bf16_draws(mut seed: u64) -> impl FnMut(usize, f32) -> Vec<f32> {
        use statebench::engine::device::{bf16_to_f32, f32_to_bf16};
        move |len, scale| {
            (0..len)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let u = ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
                    bf16_to_f32(f32_to_bf16(u * scale))
                })
                .collect()
        }
    }

    /// One row's attention is the same bits whether its chunks are folded
    /// in the kernel (one split) or split over blocks and folded by the
    /// merge kernel, and whether the row is computed inside a prefill tile
    /// or decoded alone with its cache: 700 positions (three chunks, eleven
    /// KV blocks), 8 query heads over 2 KV heads, head dimension 64.
    #[test]
    #[cfg_attr(
        not(has_cuda_emulator),
        ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
    )]
    fn cuda_attention_bits_depend_on_neither_splits_nor_tiles() {
        use statebench::engine::device::{BatchRows, Device};
        let dev = gpu();
        let heads = Heads {
            q: 8,
            kv: 2,
            dim: 64,
        };
        let n: usize = 700;
        let block = heads.kv * KV_BLOCK * heads.dim * 2 * 2;
        dev.reserve_kv(1, heads, n.div_ceil(KV_BLOCK) * block)
            .expect("reserves");
        let mut draw = bf16_draws(7);
        let (kvw, qw) = (heads.kv * heads.dim, heads.q * heads.dim);
        let (k, v, q) = (draw(n * kvw, 1.0), draw(n * kvw, 1.0), draw(n * qw, 1.0));
        let mut cache = <Cuda as Device>::Cache::default();
        let rows = BatchRows::new([(0, n)]);
        dev.kv_write(
            &mut [&mut cache],
            0,
            &dev.act(kvw, k),
            &dev.act(kvw, v),
            &rows,
            heads,
        );
        let bits =
            |x: Vec<Vec<f32>>| -> Vec<u32> { x.concat().iter().map(|f| f.to_bits()).collect() };
        let mut prefill = Vec::new();
        let mut decode = Vec::new();
        for splits in [1, 2, 3, 7] {
            dev.set_attention_splits(Some(splits));
            let all =
                dev.to_host(dev.attention(&dev.act(qw, q.clone()), &[&cache], 0, &rows, heads));
            prefill.push(bits(all));
            // Rows 255, 256 and 699 alone, as decode steps see them.
            for p in [255usize, 256, 699] {
                let one = BatchRows::new([(p, 1)]);
                let qp = q[p * qw..(p + 1) * qw].to_vec();
                let out = dev.to_host(dev.attention(&dev.act(qw, qp), &[&cache], 0, &one, heads));
                decode.push((p, bits(out)));
            }
        }
        dev.set_attention_splits(None);
        dev.sync().expect("runs");
        assert!(
            prefill.iter().all(|p| *p == prefill[0]),
            "prefill bits differ across splits"
        );
        for (p, d) in &decode {
            assert_eq!(
                d[..],
                prefill[0][p * qw..(p + 1) * qw],
                "row {p} decoded alone differs from its prefill tile"
            );
        }
    }

    /// Every matrix product gives each row the same bits at batches of 1,
    /// 3, 16, 33 and 128 rows and inside a 300-row prefill (three row
    /// tiles), whether its k-ranges are added in each block or over blocks
    /// by `gemm_reduce`, for each epilogue: bf16, f32 logits, a biased
    /// projection added to the residual stream, and SwiGLU (its gate and up
    /// split along k) followed by the down projection added back. The
    /// weights split along k into 4 and 2 ranges, and one not at all.
    #[test]
    #[cfg_attr(
        not(has_cuda_emulator),
        ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
    )]
    fn cuda_products_are_the_same_bits_at_every_batch_and_either_way_of_adding_ranges() {
        use statebench::engine::device::cuda::gemm_splits;
        use statebench::engine::device::{Device, HostWeight};
        use statebench::engine::model::{Linear, Mlp};
        let dev = gpu();
        let mut draw = bf16_draws(23);
        let (hidden, inter, vocab) = (2048usize, 104usize, 150usize);
        assert_eq!(gemm_splits(200, hidden), 4);
        assert_eq!(gemm_splits(2 * inter, hidden), 4);
        assert_eq!(gemm_splits(vocab, 1000), 2);
        assert_eq!(gemm_splits(hidden, inter), 1);
        let weight = |w: Vec<f32>, rows: usize, cols: usize| {
            let m = statebench_kernels::Matrix::from_f32(rows, cols, w).expect("matrix");
            dev.weight(HostWeight::Matrix(m)).expect("weight")
        };
        let proj = weight(draw(200 * hidden, 0.05), 200, hidden);
        let head = weight(draw(vocab * 1000, 0.05), vocab, 1000);
        let o = Linear {
            w: weight(draw(hidden * hidden, 0.02), hidden, hidden),
            b: Some(dev.vector(draw(hidden, 0.1)).expect("bias")),
        };
        let mlp = Mlp {
            gate: Linear {
                w: weight(draw(inter * hidden, 0.05), inter, hidden),
                b: None,
            },
            up: Linear {
                w: weight(draw(inter * hidden, 0.05), inter, hidden),
                b: None,
            },
            down: Linear {
                w: weight(draw(hidden * inter, 0.05), hidden, inter),
                b: None,
            },
        };
        let n = 300usize;
        let (x, x1000, resid) = (
            draw(n * hidden, 1.0),
            draw(n * 1000, 1.0),
            draw(n * hidden, 1.0),
        );
        let bits = |x: Vec<Vec<f32>>| -> Vec<Vec<u32>> {
            x.iter()
                .map(|r| r.iter().map(|f| f.to_bits()).collect())
                .collect()
        };
        // The four products' rows for the first `rows` rows of the inputs.
        let run = |rows: usize| -> Vec<Vec<Vec<u32>>> {
            let xa = dev.act(hidden, x[..rows * hidden].to_vec());
            let mut out = vec![
                bits(dev.to_host(dev.matmul(&proj, &xa))),
                bits(dev.to_host(dev.logits(&head, &dev.act(1000, x1000[..rows * 1000].to_vec())))),
            ];
            let mut r = dev.act(hidden, resid[..rows * hidden].to_vec());
            dev.project_add(&o, &xa, &mut r);
            out.push(bits(dev.to_host(r)));
            let mut r = dev.act(hidden, resid[..rows * hidden].to_vec());
            dev.mlp_add(&mlp, &xa, &mut r);
            out.push(bits(dev.to_host(r)));
            out
        };
        dev.set_gemm_in_block(Some(true));
        let whole = run(n);
        for mode in [Some(true), Some(false), None] {
            dev.set_gemm_in_block(mode);
            for rows in [1usize, 3, 16, 33, 128, n] {
                for (i, (got, want)) in run(rows).iter().zip(&whole).enumerate() {
                    assert_eq!(
                        got.len(),
                        rows,
                        "product {i} at {rows} rows ({mode:?}): {:?}",
                        dev.sync()
                    );
                    for (r, row) in got.iter().enumerate() {
                        assert!(
                            *row == want[r],
                            "product {i}, row {r} of {rows} (in-block {mode:?}) differs from the same row of {n}"
                        );
                    }
                }
            }
        }
        dev.set_gemm_in_block(None);
        dev.sync().expect("runs");
    }

    /// The shallow pipelines (3-stage matrix product, single-buffered
    /// attention: what GPUs with 99 KiB blocks get) compute the same bits
    /// as the deep ones: products with fewer k-slices than stages, a k
    /// that ends mid-slice, split along k and not, 1 to 130 rows; attention
    /// over three chunks, prefilled and decoded.
    #[test]
    #[cfg_attr(
        not(has_cuda_emulator),
        ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
    )]
    fn cuda_pipeline_depths_change_no_bit() {
        if real_gpu() {
            return;
        }
        use statebench::engine::device::cuda::Pipelines;
        use statebench::engine::device::{BatchRows, Device, HostWeight};
        let mut draw = bf16_draws(11);
        let heads = Heads {
            q: 8,
            kv: 2,
            dim: 128,
        };
        let n = 600usize;
        let (kvw, qw) = (heads.kv * heads.dim, heads.q * heads.dim);
        // (rows, k, outputs), then the weight and the activations.
        let shapes = [
            (1usize, 192usize, 200usize),
            (33, 1000, 72),
            (130, 12_288, 40),
        ];
        let products: Vec<(Vec<f32>, Vec<f32>)> = shapes
            .iter()
            .map(|&(rows, k, out)| (draw(out * k, 0.1), draw(rows * k, 1.0)))
            .collect();
        let (kk, vv, qq) = (draw(n * kvw, 1.0), draw(n * kvw, 1.0), draw(n * qw, 1.0));
        let run = |pipes: Pipelines| -> Vec<Vec<u32>> {
            let dev = Cuda::open_emulated_with(Some(pipes)).expect("opens");
            let bits =
                |x: Vec<Vec<f32>>| -> Vec<u32> { x.concat().iter().map(|f| f.to_bits()).collect() };
            let mut out = Vec::new();
            for (&(_, k, o), (w, x)) in shapes.iter().zip(&products) {
                let m = statebench_kernels::Matrix::from_f32(o, k, w.clone()).expect("matrix");
                let w = dev.weight(HostWeight::Matrix(m)).expect("weight");
                out.push(bits(dev.to_host(dev.matmul(&w, &dev.act(k, x.clone())))));
            }
            let block = heads.kv * KV_BLOCK * heads.dim * 2 * 2;
            dev.reserve_kv(1, heads, n.div_ceil(KV_BLOCK) * block)
                .expect("reserves");
            let mut cache = <Cuda as Device>::Cache::default();
            let rows = BatchRows::new([(0, n)]);
            dev.kv_write(
                &mut [&mut cache],
                0,
                &dev.act(kvw, kk.clone()),
                &dev.act(kvw, vv.clone()),
                &rows,
                heads,
            );
            out.push(bits(dev.to_host(dev.attention(
                &dev.act(qw, qq.clone()),
                &[&cache],
                0,
                &rows,
                heads,
            ))));
            let one = BatchRows::new([(n - 1, 1)]);
            let last = qq[(n - 1) * qw..].to_vec();
            out.push(bits(dev.to_host(dev.attention(
                &dev.act(qw, last),
                &[&cache],
                0,
                &one,
                heads,
            ))));
            dev.sync().expect("runs");
            out
        };
        let (deep, shallow) = (run(Pipelines::DEEP), run(Pipelines::SHALLOW));
        for (i, (d, s)) in deep.iter().zip(&shallow).enumerate() {
            assert!(!d.is_empty(), "result {i} is empty");
            assert_eq!(d, s, "result {i} differs between the pipelines");
        }
    }

    /// A KV cache that cannot grow fails its step with a one-line error,
    /// launches nothing after it (no attention over a short block table),
    /// and leaves the device usable for the next step.
    #[test]
    #[cfg_attr(
        not(has_cuda_emulator),
        ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
    )]
    fn cuda_kv_exhaustion_fails_the_step_and_the_next_one_runs() {
        use statebench::engine::device::{BatchRows, Device};
        use statebench::engine::kv_cache::KvStore;
        let dev = gpu();
        let heads = Heads {
            q: 4,
            kv: 2,
            dim: 16,
        };
        // Room for two blocks of positions in one layer (bf16 keys and values).
        let block = heads.kv * KV_BLOCK * heads.dim * 2 * 2;
        dev.reserve_kv(1, heads, 2 * block).expect("reserves");
        let mut cache = <Cuda as Device>::Cache::default();
        let n = 2 * KV_BLOCK + 8;
        let rows = BatchRows::new([(0, n)]);
        let kvw = heads.kv * heads.dim;
        let k = dev.act(kvw, vec![0.5; n * kvw]);
        let v = dev.act(kvw, vec![0.25; n * kvw]);
        dev.kv_write(&mut [&mut cache], 0, &k, &v, &rows, heads);
        let q = dev.act(heads.q * heads.dim, vec![1.0; n * heads.q * heads.dim]);
        let out = dev.attention(&q, &[&cache], 0, &rows, heads);
        assert!(
            dev.to_host(out).is_empty(),
            "nothing computed after the failure"
        );
        let err = dev.sync().expect_err("the step fails");
        assert!(
            err.to_string().contains("KV-cache memory exhausted"),
            "{err}"
        );
        // The next step, within the pool, runs.
        let mut cache = <Cuda as Device>::Cache::default();
        let rows = BatchRows::new([(0, 20)]);
        let k = dev.act(kvw, vec![0.5; 20 * kvw]);
        let v = dev.act(kvw, vec![0.25; 20 * kvw]);
        dev.kv_write(&mut [&mut cache], 0, &k, &v, &rows, heads);
        cache.advance(20);
        let q = dev.act(heads.q * heads.dim, vec![1.0; 20 * heads.q * heads.dim]);
        let out = dev.to_host(dev.attention(&q, &[&cache], 0, &rows, heads));
        dev.sync().expect("the next step runs");
        assert_eq!(out.len(), 20);
        // Every position holds the same value: the output is that value.
        assert!(out.iter().flatten().all(|&x| (x - 0.25).abs() < 1e-6));
    }
}
