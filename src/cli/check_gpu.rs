//! `statebench check gpu`: the one command a user with a GPU runs first.
//! It says which driver, NVRTC and kernel image this machine gives, checks
//! the kernels against the CPU, the invariance promises and a greedy
//! generation against the CPU engine, runs compute-sanitizer over the
//! kernel checks where it is installed, and times the matrix products at
//! the shapes the performance model predicts. The JSON it writes is what a
//! bug report attaches.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;
use serde::Serialize;

use statebench::engine::device::check;
use statebench::engine::device::cuda::{Cuda, Pipelines};
use statebench::engine::device::perf_model::{self, Pass};
use statebench::engine::device::{bf16_to_f32, f32_to_bf16, Cpu, Device, DeviceChoice, HostWeight};
use statebench::engine::model::BatchItem;
use statebench::engine::Engine;
use statebench_kernels::Matrix;

use super::{emit, ModelArgs};

#[derive(Args)]
pub struct GpuArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Where to write the report as JSON (it is printed either way).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Greedy tokens the device and the CPU engine each generate.
    #[arg(long, default_value_t = 16)]
    greedy: usize,
    /// Passes a matrix product is timed over (the median is reported).
    #[arg(long, default_value_t = 20)]
    reps: usize,
    /// Seconds each compute-sanitizer tool may take over the kernel checks
    /// (racecheck is the slowest); 0 skips compute-sanitizer.
    #[arg(long, default_value_t = 90)]
    sanitizer_seconds: u64,
}

#[derive(Serialize)]
struct Report {
    driver_version: String,
    nvrtc_version: String,
    image: String,
    device: DeviceOut,
    checks: Vec<CheckOut>,
    kernels: Vec<KernelOut>,
    /// What the timings are: a GPU's, or the emulator's (not a GPU's speed).
    timings: String,
    seconds: f64,
}

#[derive(Serialize)]
struct DeviceOut {
    name: String,
    sm: String,
    memory: usize,
}

#[derive(Serialize)]
struct CheckOut {
    name: String,
    ok: bool,
    detail: String,
}

#[derive(Serialize, Default)]
struct KernelOut {
    kernel: String,
    shape: Option<String>,
    measured_us: Option<f64>,
    predicted_us: Option<f64>,
    registers: Option<u32>,
    spills: Option<u32>,
    blocks_per_sm: Option<u32>,
}

/// The named check's outcome: a failure to run is a failed check.
fn outcome(name: &str, r: Result<(bool, String)>) -> CheckOut {
    let (ok, detail) = r.unwrap_or_else(|e| (false, statebench::one_line(&*e)));
    CheckOut {
        name: name.to_string(),
        ok,
        detail,
    }
}

pub fn run(a: &GpuArgs) -> Result<()> {
    let start = Instant::now();
    let choice = a.model.device.unwrap_or(DeviceChoice::Cuda(0));
    let ordinal = match choice {
        DeviceChoice::Cuda(n) => Some(n),
        DeviceChoice::CudaEmulated => None,
        other => bail!(
            "--device {other}: check gpu checks a CUDA device (cuda, cuda:N or cuda-emulated)"
        ),
    };
    // The device under test opens first: what cannot load says so here.
    let dev = Cuda::open_choice(choice)?;
    let (versions, image) = (dev.versions(), dev.image());
    let (major, minor) = dev.compute_capability();
    let (_, total) = dev.memory()?;
    let mut checks = Vec::new();

    // Each check that runs attention reserves a KV cache on its device, so
    // each gets a device of its own (the kernels are compiled once).
    let fresh = || Cuda::open_choice(choice);
    checks.push(outcome(
        "kernels against the CPU",
        fresh()
            .map_err(Into::into)
            .and_then(|d| kernels_against_cpu(&d)),
    ));
    checks.push(outcome("pipeline depths", pipelines(ordinal, fresh)));
    checks.push(sanitizer(choice, a.sanitizer_seconds));

    let info = dev.info();
    let mut kernels: Vec<KernelOut> = dev
        .kernel_resources()
        .into_iter()
        .map(|r| KernelOut {
            kernel: r.kernel,
            registers: r.registers,
            spills: r.local_bytes,
            blocks_per_sm: r.blocks_per_sm,
            ..KernelOut::default()
        })
        .collect();
    let qwen = perf_model::QWEN3_8B;
    // Qwen3-8B's shapes where the device has the memory and the speed for
    // them (a GPU with 4 GiB free); else the model's own, after it loads.
    let at_qwen = !dev.is_emulated() && dev.memory()?.0 > 4 << 30;
    if at_qwen {
        let predicts = info.hardware.contains("H200");
        push_timings(
            &mut checks,
            &mut kernels,
            timings(&dev, &qwen, a.reps, predicts),
        );
    }

    // The model checks: the device under test is handed to the engine.
    let (spec, mut opts) = a.model.spec_and_options()?;
    // Every prompt prefills in several chunks, so split prefill is in play.
    opts.prefill_chunk = 7;
    match Engine::load_on(dev, &spec, opts.clone()) {
        Ok(mut engine) => {
            checks.push(outcome("invariance", invariance(&mut engine)));
            checks.push(outcome("split prefill", split_prefill(&engine)));
            checks.push(outcome(
                "greedy against the CPU engine",
                greedy_against_cpu(&engine, &spec, opts, a.greedy),
            ));
            if !at_qwen {
                let c = &engine.model().cfg;
                let shape = perf_model::Shape {
                    name: "the model",
                    hidden: c.hidden,
                    layers: c.layers,
                    heads: c.heads,
                    kv_heads: c.kv_heads,
                    head_dim: c.head_dim,
                    intermediate: c.intermediate,
                    vocab: c.vocab,
                };
                let reps = if engine.model().device.is_emulated() {
                    1
                } else {
                    a.reps
                };
                let t = timings(&engine.model().device, &shape, reps, false);
                push_timings(&mut checks, &mut kernels, t);
            }
        }
        Err(e) => checks.push(outcome("model loads", Err(e.into()))),
    }

    let report = Report {
        driver_version: versions.driver.to_string(),
        nvrtc_version: versions.nvrtc.to_string(),
        image: image.to_string(),
        device: DeviceOut {
            name: info.hardware.clone(),
            sm: format!("{major}.{minor}"),
            memory: total,
        },
        checks,
        kernels,
        timings: if matches!(choice, DeviceChoice::CudaEmulated) {
            "the CUDA emulator's (a CPU executing the kernels: not a GPU's speed)".into()
        } else {
            format!("{}'s, CUDA events around each launch", info.hardware)
        },
        seconds: start.elapsed().as_secs_f64(),
    };
    let text = serde_json::to_string_pretty(&report)? + "\n";
    if let Some(path) = &a.json {
        std::fs::write(path, &text)
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    }
    emit(&text)?;
    if let Some(bad) = report.checks.iter().find(|c| !c.ok) {
        bail!("check gpu: {} failed: {}", bad.name, bad.detail);
    }
    Ok(())
}

fn kernels_against_cpu(dev: &Cuda) -> Result<(bool, String)> {
    let diffs = check::compare(&Cpu, dev, 7)?;
    let bad: Vec<&str> = diffs
        .iter()
        .filter(|d| !check::agrees(d, check::Rounding::Bf16))
        .map(|d| d.kernel)
        .collect();
    let worst = diffs
        .iter()
        .max_by(|x, y| x.max_bf16_ulps.total_cmp(&y.max_bf16_ulps));
    let detail = format!(
        "{} of {} operations within their bf16 bound{}{}",
        diffs.len() - bad.len(),
        diffs.len(),
        worst.map_or(String::new(), |w| format!(
            "; largest difference {} ({:.2} bf16 units)",
            w.kernel, w.max_bf16_ulps
        )),
        if bad.is_empty() {
            String::new()
        } else {
            format!("; outside: {}", bad.join(", "))
        }
    );
    Ok((bad.is_empty(), detail))
}

/// Every operation at the deep and the shallow pipelines, bit for bit.
fn pipelines(
    ordinal: Option<usize>,
    fresh: impl Fn() -> Result<Cuda, statebench::backend::BackendError>,
) -> Result<(bool, String)> {
    let dev = fresh()?;
    let other = match ordinal {
        Some(n) => Cuda::open_with(n, Pipelines::SHALLOW)?,
        None => Cuda::open_emulated_with(Some(Pipelines::SHALLOW))?,
    };
    let diffs = check::compare(&dev, &other, 11)?;
    let differ: Vec<&str> = diffs
        .iter()
        .filter(|d| d.max_abs != 0.0)
        .map(|d| d.kernel)
        .collect();
    Ok((
        differ.is_empty(),
        if differ.is_empty() {
            format!(
                "{} operations equal bit for bit at the deep and the shallow pipelines",
                diffs.len()
            )
        } else {
            format!("differ between the pipeline depths: {}", differ.join(", "))
        },
    ))
}

/// compute-sanitizer's memcheck, racecheck and synccheck over the kernel
/// checks, with arena and KV memory filled with NaN first.
fn sanitizer(choice: DeviceChoice, seconds: u64) -> CheckOut {
    let name = "compute-sanitizer";
    let limit = std::time::Duration::from_secs(seconds);
    if seconds == 0 {
        return CheckOut {
            name: name.into(),
            ok: true,
            detail: "skipped: --sanitizer-seconds 0".into(),
        };
    }
    if matches!(choice, DeviceChoice::CudaEmulated) {
        return CheckOut {
            name: name.into(),
            ok: true,
            detail: "skipped on the emulator: its own race, sync and init checks ran with every kernel instead".into(),
        };
    }
    let Some(tool) = which("compute-sanitizer") else {
        return CheckOut {
            name: name.into(),
            ok: true,
            detail: "skipped: compute-sanitizer is not on PATH (it comes with the CUDA toolkit)"
                .into(),
        };
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return outcome(name, Err(e.into())),
    };
    let mut said = Vec::new();
    for t in ["memcheck", "racecheck", "synccheck"] {
        let mut cmd = std::process::Command::new(&tool);
        cmd.args(["--tool", t, "--error-exitcode", "1", "--print-limit", "5"])
            .arg(&exe)
            .args(["check", "kernels", "--device", &choice.to_string()])
            .env("STATEBENCH_CUDA_POISON", "1");
        match run_bounded(cmd, limit) {
            Ok((Some(status), _)) if status.success() => said.push(format!("{t} clean")),
            // Some sandboxed GPU hosts do not let the tool attach; that
            // says nothing of the kernels.
            Ok((_, text)) if text.contains("Device not supported") => {
                return CheckOut {
                    name: name.into(),
                    ok: true,
                    detail: format!(
                        "skipped: compute-sanitizer cannot attach to this device ({t} said \"Device not supported\")"
                    ),
                };
            }
            Ok((status, text)) => {
                let first = text
                    .lines()
                    .find(|l| l.contains("=========") && !l.contains("COMPUTE-SANITIZER"))
                    .unwrap_or("no report line")
                    .trim()
                    .to_string();
                let how = match status {
                    Some(s) => s.to_string(),
                    None => {
                        format!("stopped after {seconds} s; --sanitizer-seconds gives it longer")
                    }
                };
                return CheckOut {
                    name: name.into(),
                    ok: false,
                    detail: format!("{t} failed ({how}): {first}"),
                };
            }
            Err(e) => return outcome(name, Err(e)),
        }
    }
    CheckOut {
        name: name.into(),
        ok: true,
        detail: said.join(", "),
    }
}

/// Runs `cmd` for at most `limit`, killing it and what it started after;
/// its exit status (`None` when killed) and the first 64 KiB of its stdout
/// and stderr.
fn run_bounded(
    mut cmd: std::process::Command,
    limit: std::time::Duration,
) -> Result<(Option<std::process::ExitStatus>, String)> {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    // Its own process group, so the tool's target (the statebench it
    // started) is killed with it and the pipes close.
    let mut child = cmd
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    // Each stream is drained to its end (so the child never blocks on a
    // full pipe) and only its start kept.
    let keep = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut kept = Vec::new();
            if let Some(mut r) = r {
                let mut buf = [0u8; 8192];
                while let Ok(n @ 1..) = r.read(&mut buf) {
                    let room = (64usize << 10).saturating_sub(kept.len());
                    kept.extend_from_slice(&buf[..n.min(room)]);
                }
            }
            kept
        })
    };
    let out = keep(
        child
            .stdout
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let err = keep(
        child
            .stderr
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break Some(s);
        }
        if start.elapsed() > limit {
            let group = format!("-{}", child.id());
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &group])
                .status();
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let text = |h: std::thread::JoinHandle<Vec<u8>>| {
        String::from_utf8_lossy(&h.join().unwrap_or_default()).into_owned()
    };
    Ok((status, text(out) + &text(err)))
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(tool))
            .find(|p| p.is_file())
    })
}

/// One request alone and in batches, and a second turn cached and cold:
/// each group's tokens equal.
fn invariance<D: Device>(engine: &mut Engine<D>) -> Result<(bool, String)> {
    let outcomes = check::invariance(engine, &[3, 16], 12)?;
    let (turns, batches): (Vec<_>, Vec<_>) = outcomes
        .iter()
        .partition(|o| o.case.starts_with("second turn"));
    let mut differ = Vec::new();
    for group in [&batches, &turns] {
        if let Some(first) = group.first() {
            differ.extend(
                group
                    .iter()
                    .filter(|o| o.hash != first.hash)
                    .map(|o| format!("{} against {}", o.case, first.case)),
            );
        }
    }
    let cases: Vec<&str> = outcomes.iter().map(|o| o.case.as_str()).collect();
    Ok((
        differ.is_empty(),
        if differ.is_empty() {
            format!("tokens equal in each group: {}", cases.join("; "))
        } else {
            format!("tokens differ: {}", differ.join("; "))
        },
    ))
}

/// A prompt's last logits in one forward pass and in passes of 7 tokens,
/// bit for bit.
fn split_prefill<D: Device>(engine: &Engine<D>) -> Result<(bool, String)> {
    let tokens = engine.encode(&"A ledger of steps, each booked once. ".repeat(8))?;
    let whole = {
        let mut cache = D::Cache::default();
        engine.forward(&mut [BatchItem {
            tokens: &tokens,
            cache: &mut cache,
        }])?
    };
    let mut cache = D::Cache::default();
    let mut last = Vec::new();
    for part in tokens.chunks(7) {
        last = engine.forward(&mut [BatchItem {
            tokens: part,
            cache: &mut cache,
        }])?;
    }
    let same = whole[0]
        .iter()
        .zip(&last[0])
        .all(|(a, b)| a.to_bits() == b.to_bits());
    Ok((
        same,
        format!(
            "{} tokens in one pass and in passes of 7: last logits {}",
            tokens.len(),
            if same { "equal bit for bit" } else { "differ" }
        ),
    ))
}

/// The device's greedy tokens against the CPU engine's on the same model.
/// The device holds its weights as bf16; so does the CPU when the model's
/// are bf16 (other formats are rounded on the device only, which the
/// detail says).
fn greedy_against_cpu<D: Device>(
    engine: &Engine<D>,
    spec: &str,
    mut opts: statebench::engine::EngineOptions,
    n: usize,
) -> Result<(bool, String)> {
    let prompt = engine.encode("The three primary colours are")?;
    let (_, on_device) = check::greedy_path(engine, &prompt, n)?;
    opts.prefill_chunk = statebench::engine::EngineOptions::DEFAULT_PREFILL_CHUNK;
    let cpu = Engine::load(spec, opts)?;
    let (_, on_cpu) = check::greedy_path(&cpu, &prompt, n)?;
    let format = cpu.format().to_string();
    let diverge = on_device.iter().zip(&on_cpu).position(|(a, b)| a != b);
    Ok(match diverge {
        None => (
            true,
            format!("{n} greedy tokens equal ({format} weights on the CPU, bf16 on the device)"),
        ),
        Some(i) => (
            false,
            format!(
                "greedy tokens part at token {i} of {n}: device {}, CPU {} ({format} weights on the CPU, bf16 on the device)",
                on_device[i], on_cpu[i]
            ),
        ),
    })
}

/// Timing rows after the kernels' resource rows, each with the product
/// kernel's resources; a failure to time is a failed check.
fn push_timings(
    checks: &mut Vec<CheckOut>,
    kernels: &mut Vec<KernelOut>,
    t: Result<Vec<KernelOut>>,
) {
    let gemm = kernels
        .iter()
        .find(|k| k.kernel == "gemm")
        .map(|k| (k.registers, k.spills, k.blocks_per_sm));
    match t {
        Ok(rows) => kernels.extend(rows.into_iter().map(|mut r| {
            if let Some((reg, sp, b)) = gemm {
                (r.registers, r.spills, r.blocks_per_sm) = (reg, sp, b);
            }
            r
        })),
        Err(e) => checks.push(outcome("timings", Err(e))),
    }
}

/// The matrix products of one layer timed at `shape`'s decode (batch 1 and
/// 128 at a 1k context) and 2k-prefill (one chunk of 512) passes, each
/// beside the performance model's prediction for an H200 when `predicts`.
fn timings(
    dev: &Cuda,
    shape: &perf_model::Shape,
    reps: usize,
    predicts: bool,
) -> Result<Vec<KernelOut>> {
    let shape = *shape;
    let (h, q, kv) = (
        shape.hidden,
        shape.heads * shape.head_dim,
        shape.kv_heads * shape.head_dim,
    );
    let products = [
        ("gemm q|k|v", h, q + 2 * kv),
        ("gemm o (+ residual)", q, h),
        ("gemm gate|up (SwiGLU)", h, 2 * shape.intermediate),
        ("gemm down (+ residual)", shape.intermediate, h),
    ];
    let chunk = statebench::engine::EngineOptions::DEFAULT_PREFILL_CHUNK;
    let passes = [
        ("decode b1", Pass::decode(1, 1024)),
        ("decode b128", Pass::decode(128, 1024)),
        (
            "2k prefill chunk",
            Pass {
                rows: chunk,
                items: 1,
                context: 1024 + chunk / 2,
                max_context: 2048,
            },
        ),
    ];
    let mut out = Vec::new();
    for (name, k, n) in products {
        let values: Vec<f32> = (0..n * k)
            .map(|i| bf16_to_f32(f32_to_bf16(((i * 7919 % 257) as f32 - 128.0) / 4096.0)))
            .collect();
        let w = dev.weight(HostWeight::Matrix(Matrix::from_f32(n, k, values)?))?;
        for (pass_name, pass) in &passes {
            let measured = dev.time_matmul(&w, pass.rows, reps)?;
            let predicted = predicts.then(|| {
                let costs = perf_model::pass_costs(&shape, &perf_model::H200, pass);
                // The product and its split-K sum, which follows it.
                let at = costs.iter().position(|c| c.kernel == name);
                at.map(|i| {
                    let mut secs = costs[i].secs / costs[i].launches as f64;
                    if let Some(next) = costs.get(i + 1).filter(|c| c.kernel.contains("split-K")) {
                        secs += next.secs / next.launches as f64;
                    }
                    secs * 1e6
                })
            });
            out.push(KernelOut {
                kernel: name.to_string(),
                shape: Some(format!(
                    "{} ({pass_name}): {} rows × k {k} → {n}",
                    shape.name, pass.rows
                )),
                measured_us: Some(measured),
                predicted_us: predicted.flatten(),
                ..KernelOut::default()
            });
        }
    }
    Ok(out)
}
