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

fn assert_close(diffs: &[KernelDiff], tolerance: f32) {
    for d in diffs {
        eprintln!(
            "{:<18} max abs {:.3e}  max rel {:.3e}  ({} values)",
            d.kernel, d.max_abs, d.max_rel, d.values
        );
    }
    for d in diffs {
        assert!(d.values > 0, "{}: nothing compared", d.kernel);
        let tol = if d.kernel == "argmax" { 0.0 } else { tolerance };
        assert!(
            d.max_abs <= tol,
            "{}: max abs diff {} > {tol}",
            d.kernel,
            d.max_abs
        );
    }
}

#[test]
fn candle_operations_agree_with_the_cpu() {
    let diffs = compare(&Cpu, &Candle::cpu(), 7).expect("both devices run");
    assert_eq!(diffs.len(), 12);
    assert_close(&diffs, 1e-4);
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
mod cuda {
    use super::*;
    use engine_common::*;
    use statebench::backend::ChatRequest;
    use statebench::engine::device::check::{compare_at, Shapes};
    use statebench::engine::device::cuda::Cuda;
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

    /// Whether the device under test is there (the emulator is built
    /// wherever cargo found a C++ compiler on Linux).
    fn device_present() -> bool {
        real_gpu() || emulator_built()
    }

    fn engine_on_gpu(dir: &Path) -> Engine<Cuda> {
        let opts = EngineOptions {
            kv_budget_bytes: 64 << 20,
            ..EngineOptions::default()
        };
        Engine::load_on(gpu(), &dir.to_string_lossy(), opts).expect("loads on the GPU")
    }

    /// The CUDA engine against the CPU engine holding the same bf16
    /// matrices (so only the order of f32 sums differs: 1e-3), and against
    /// the transformers logits of the f32 checkpoint within what rounding
    /// the matrices to bf16 moves the CPU engine's own logits, plus that
    /// 1e-3; greedy paths equal.
    fn agrees_with_cpu(name: &str) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let bf16 = tiny_bf16_copy(tmp.path(), name);
        let gpu = engine_on_gpu(&bf16);
        let cpu = load(&bf16);
        let f32_dir = root().join("tests/fixtures/engine").join(name);
        let reference: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(f32_dir.join("logits.json")).expect("logits.json"),
        )
        .expect("parses");
        for case in reference["cases"].as_array().expect("cases") {
            let input: Vec<u32> = serde_json::from_value(case["input_ids"].clone()).expect("ids");
            let want: Vec<f32> =
                serde_json::from_value(case["last_logits"].clone()).expect("logits");
            let (g, c) = (cold_logits(&gpu, &input), cold_logits(&cpu, &input));
            let d = max_abs_diff(&g, &c);
            let rounding = max_abs_diff(&c, &want);
            let to_reference = max_abs_diff(&g, &want);
            eprintln!(
                "{name} {}: GPU vs CPU (same bf16) {d:.3e}; vs transformers f32 {to_reference:.3e} (bf16 rounding moves the CPU {rounding:.3e})",
                case["name"]
            );
            assert!(d <= 1e-3, "{name} {}: {d}", case["name"]);
            assert!(
                to_reference <= rounding + 1e-3,
                "{name} {}: {to_reference} > {rounding} + 1e-3",
                case["name"]
            );
            let (gt, _) = greedy_incremental(&gpu, &input, 8);
            let (ct, _) = greedy_incremental(&cpu, &input, 8);
            assert_eq!(gt, ct, "{name} {}: greedy tokens", case["name"]);
        }
    }

    #[test]
    fn tiny_qwen2_on_cuda_agrees_with_the_cpu() {
        if !device_present() {
            return;
        }
        agrees_with_cpu("tiny-qwen2");
    }

    #[test]
    fn tiny_qwen3_on_cuda_agrees_with_the_cpu() {
        if !device_present() {
            return;
        }
        agrees_with_cpu("tiny-qwen3");
    }

    /// The invariance promise on the GPU, bit for bit: incremental decode
    /// equals recompute, a cached prefix equals a cold prefill (split
    /// anywhere, across KV blocks), and a request's tokens are the same
    /// alone and in batches of 2, 4 and 16.
    #[test]
    fn cuda_invariance_a_b_c() {
        if !device_present() {
            return;
        }
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
    fn cuda_invariance_in_large_batches_and_chunked_prefill() {
        if !device_present() {
            return;
        }
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

    /// `statebench check invariance` on the device in two processes: the
    /// same hashes, and every hash of a process equal.
    #[test]
    fn cuda_invariance_holds_across_processes() {
        if !device_present() {
            return;
        }
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
    fn cuda_operations_agree_with_the_cpu() {
        if !device_present() {
            return;
        }
        // bf16 weights are the same values on both; f32 sums in another order.
        assert_close(&compare(&Cpu, &gpu(), 7).expect("both devices run"), 1e-3);
    }

    /// Every operation at the shapes of the models the engine runs: head
    /// dimensions 128 and 256, 8 KV heads of 4 query heads each, K = 12,288,
    /// 1 to 128 rows, contexts that cross KV blocks (16 positions).
    #[test]
    fn cuda_operations_agree_with_the_cpu_at_model_shapes() {
        if !device_present() {
            return;
        }
        for (rows, dim, steps) in [
            (1, 128, vec![vec![17], vec![1]]),
            (7, 256, vec![vec![5, 2], vec![1, 1], vec![16, 3]]),
            (16, 128, vec![vec![16], vec![1]]),
            (33, 256, vec![vec![20, 13], vec![1, 1]]),
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
            // Sums over 12,288 terms of magnitude up to 0.1 in another order.
            assert_close(&diffs, 2e-3);
        }
    }

    /// A KV cache that cannot grow fails its step with a one-line error,
    /// launches nothing after it (no attention over a short block table),
    /// and leaves the device usable for the next step.
    #[test]
    fn cuda_kv_exhaustion_fails_the_step_and_the_next_one_runs() {
        if !device_present() {
            return;
        }
        use statebench::engine::device::{BatchRows, Device};
        use statebench::engine::kv_cache::KvStore;
        let dev = gpu();
        let heads = Heads {
            q: 4,
            kv: 2,
            dim: 16,
        };
        // Room for two blocks of 16 positions in one layer.
        let block = heads.kv * 16 * heads.dim * 2 * 4;
        dev.reserve_kv(1, heads, 2 * block).expect("reserves");
        let mut cache = <Cuda as Device>::Cache::default();
        let rows = BatchRows::new([(0, 40)]);
        let kvw = heads.kv * heads.dim;
        let k = dev.act(kvw, vec![0.5; 40 * kvw]);
        let v = dev.act(kvw, vec![0.25; 40 * kvw]);
        dev.kv_write(&mut [&mut cache], 0, &k, &v, &rows, heads);
        let q = dev.act(heads.q * heads.dim, vec![1.0; 40 * heads.q * heads.dim]);
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
