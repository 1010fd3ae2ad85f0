//! The devices behind the one forward pass: each operation of candle's
//! device (the code Metal runs) against the CPU's on random inputs, and,
//! on a machine with an NVIDIA GPU, the CUDA device's operations, models
//! and invariance. The GPU tests are ignored where no GPU is (the harness
//! reports them as ignored, with the reason); `scripts/gpu-check.sh` runs
//! them with `--ignored`.

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
    use statebench::engine::device::cuda::Cuda;
    use statebench::engine::{Engine, EngineOptions};

    fn tiny_on_gpu(name: &str) -> Engine<Cuda> {
        let dir = root().join("tests/fixtures/engine").join(name);
        let opts = EngineOptions {
            kv_budget_bytes: 1 << 30,
            ..EngineOptions::default()
        };
        Engine::load_on(
            Cuda::open(0).expect("a CUDA GPU"),
            &dir.to_string_lossy(),
            opts,
        )
        .expect("loads on the GPU")
    }

    /// bf16 weights on the GPU against f32 on the CPU: logits agree to the
    /// rounding of the weights, and the greedy paths of the reference
    /// prompts are the same tokens.
    fn agrees_with_cpu(name: &str) {
        let gpu = tiny_on_gpu(name);
        let dir = root().join("tests/fixtures/engine").join(name);
        let cpu = load(&dir);
        let reference: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join("logits.json")).expect("logits.json"),
        )
        .expect("parses");
        for case in reference["cases"].as_array().expect("cases") {
            let input: Vec<u32> = serde_json::from_value(case["input_ids"].clone()).expect("ids");
            let d = max_abs_diff(&cold_logits(&gpu, &input), &cold_logits(&cpu, &input));
            eprintln!(
                "{name} {}: max abs logit diff GPU vs CPU {d:.3e}",
                case["name"]
            );
            assert!(d < 5e-2, "{name} {}: {d}", case["name"]);
            let (g, _) = greedy_incremental(&gpu, &input, 8);
            let (c, _) = greedy_incremental(&cpu, &input, 8);
            assert_eq!(g, c, "{name} {}: greedy tokens", case["name"]);
        }
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU (scripts/gpu-check.sh runs it)"]
    fn tiny_qwen2_on_cuda_agrees_with_the_cpu() {
        agrees_with_cpu("tiny-qwen2");
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU (scripts/gpu-check.sh runs it)"]
    fn tiny_qwen3_on_cuda_agrees_with_the_cpu() {
        agrees_with_cpu("tiny-qwen3");
    }

    /// The invariance promise on the GPU, bit for bit: incremental decode
    /// equals recompute, a cached prefix equals a cold prefill, and a
    /// request's tokens are the same alone and in batches of 2, 4 and 16.
    #[test]
    #[ignore = "needs an NVIDIA GPU (scripts/gpu-check.sh runs it)"]
    fn cuda_invariance_a_b_c() {
        for name in ["tiny-qwen2", "tiny-qwen3"] {
            let mut gpu = tiny_on_gpu(name);
            let prompt: Vec<u32> = (0..23).map(|i| 5 + i * 7 % 90).collect();
            check_incremental_equals_recompute(&gpu, &prompt, 12);
            check_split_prefill(&gpu, &prompt, &[1, 2, 11, 22]);
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

    #[test]
    #[ignore = "needs an NVIDIA GPU (scripts/gpu-check.sh runs it)"]
    fn cuda_operations_agree_with_the_cpu() {
        let gpu = Cuda::open(0).expect("a CUDA GPU");
        // bf16 weights are the same values on both; f32 sums in another order.
        assert_close(&compare(&Cpu, &gpu, 7).expect("both devices run"), 1e-3);
    }
}
