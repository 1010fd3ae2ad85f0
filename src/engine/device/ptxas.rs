//! What each CUDA kernel takes of a GPU, as `ptxas -v` reports it for the
//! architectures the engine targets (registers, spilled bytes, stack,
//! static shared memory), beside the block size and dynamic shared memory
//! the host launches it with, the blocks one multiprocessor then holds and
//! the occupancy that gives; and the budgets every kernel is held to.
//! `statebench check ptxas` prints the table; a test holds each kernel to
//! its budget in every CI run.

use std::path::Path;
use std::process::Command;

use super::cuda::{compile_with, Pipelines, GEMM_THREADS, KV_BLOCK};

/// A GPU architecture the kernels are built for, with the limits of one
/// multiprocessor that decide how many blocks it holds.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    /// Compute capability × 10 (80 for sm_80).
    pub sm: u32,
    /// Which GPUs it is.
    pub gpus: &'static str,
    /// The pipelines the engine compiles for it.
    pub pipes: Pipelines,
    pub max_warps: u32,
    pub max_blocks: u32,
    /// Shared memory one multiprocessor has for blocks.
    pub smem: u32,
}

/// Registers of a multiprocessor (every target), allocated to a warp in
/// units of 256.
const REGISTERS: u32 = 65_536;

/// Shared memory the driver reserves per block.
const RESERVED_SMEM: u32 = 1024;

pub const TARGETS: [Target; 3] = [
    Target {
        sm: 80,
        gpus: "A100",
        pipes: Pipelines::DEEP,
        max_warps: 64,
        max_blocks: 32,
        smem: 167_936,
    },
    Target {
        sm: 89,
        gpus: "L4, L40S, RTX 4090",
        pipes: Pipelines::SHALLOW,
        max_warps: 48,
        max_blocks: 24,
        smem: 102_400,
    },
    Target {
        sm: 90,
        gpus: "H100, H200",
        pipes: Pipelines::DEEP,
        max_warps: 64,
        max_blocks: 32,
        smem: 233_472,
    },
];

/// One kernel on one target.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelUse {
    pub kernel: String,
    pub sm: u32,
    pub registers: u32,
    /// Bytes spilled to local memory, stored and loaded.
    pub spilled: u32,
    pub stack: u32,
    pub static_smem: u32,
    pub dynamic_smem: u32,
    pub threads: u32,
    pub blocks_per_sm: u32,
    /// Resident warps over the most a multiprocessor holds.
    pub occupancy: f32,
}

/// The threads and dynamic shared memory the host launches `kernel` with.
pub fn launch_shape(kernel: &str, pipes: Pipelines) -> (u32, u32) {
    match kernel {
        "gemm" => (GEMM_THREADS as u32, pipes.gemm_smem() as u32),
        "rope_kv" => (128, 0),
        // One thread a dimension: 128 for the models that matter.
        "attention_merge" => (128, 0),
        k if k.starts_with("argmax") => (1024, 0),
        k if k.starts_with("attention_d") => {
            let d: usize = k["attention_d".len()..].parse().unwrap_or(128);
            (128, pipes.attention_smem(d) as u32)
        }
        _ => (256, 0),
    }
}

/// What one line of ptxas's report says of the kernel it is on.
fn parse(report: &str, sm: u32, pipes: Pipelines) -> Vec<KernelUse> {
    let number_before = |line: &str, what: &str| -> Option<u32> {
        let at = line.find(what)?;
        line[..at].split_whitespace().last()?.parse().ok()
    };
    let mut out: Vec<KernelUse> = Vec::new();
    for line in report.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let kernel = rest.split('\'').next().unwrap_or_default().to_string();
            let (threads, dynamic_smem) = launch_shape(&kernel, pipes);
            out.push(KernelUse {
                kernel,
                sm,
                registers: 0,
                spilled: 0,
                stack: 0,
                static_smem: 0,
                dynamic_smem,
                threads,
                blocks_per_sm: 0,
                occupancy: 0.0,
            });
            continue;
        }
        let Some(k) = out.last_mut() else { continue };
        if line.contains("stack frame") {
            k.stack = number_before(line, "bytes stack frame").unwrap_or(0);
            k.spilled = number_before(line, "bytes spill stores").unwrap_or(0)
                + number_before(line, "bytes spill loads").unwrap_or(0);
        }
        if line.contains("Used") && line.contains("registers") {
            k.registers = number_before(line, "registers").unwrap_or(0);
            k.static_smem = number_before(line, "bytes smem").unwrap_or(0);
        }
    }
    out
}

/// Blocks of `k` one multiprocessor of `t` holds: the fewest its
/// registers, shared memory, threads and block slots allow.
pub fn blocks_per_sm(k: &KernelUse, t: &Target) -> u32 {
    let warps = k.threads.div_ceil(32);
    let per_warp = (k.registers.max(1) * 32).div_ceil(256) * 256;
    let by_registers = REGISTERS / (per_warp * warps);
    let smem = k.static_smem + k.dynamic_smem + RESERVED_SMEM;
    let by_smem = t.smem / smem;
    let by_warps = t.max_warps / warps;
    by_registers.min(by_smem).min(by_warps).min(t.max_blocks)
}

/// Every kernel set compiled by NVRTC for each target and assembled by
/// `ptxas` (the path of NVIDIA's assembler): each kernel's resources.
pub fn report(ptxas: &Path) -> Result<Vec<KernelUse>, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?;
    let mut out = Vec::new();
    for t in &TARGETS {
        for (set, body) in statebench_kernels::cuda::SOURCES {
            let arch = format!("compute_{}", t.sm);
            let c = compile_with(set, body, &arch, t.pipes).map_err(|e| e.to_string())?;
            let file = dir.path().join(format!("{set}_{}.ptx", t.sm));
            std::fs::write(&file, &c.ptx).map_err(|e| format!("{}: {e}", file.display()))?;
            let run = Command::new(ptxas)
                .arg("-v")
                .arg(format!("--gpu-name=sm_{}", t.sm))
                .arg(&file)
                .args(["-o", "/dev/null"])
                .output()
                .map_err(|e| format!("running {}: {e}", ptxas.display()))?;
            let text = String::from_utf8_lossy(&run.stderr);
            if !run.status.success() {
                return Err(format!(
                    "ptxas on {set} for sm_{}: {}",
                    t.sm,
                    text.lines().next().unwrap_or("failed")
                ));
            }
            for mut k in parse(&text, t.sm, t.pipes) {
                k.blocks_per_sm = blocks_per_sm(&k, t);
                k.occupancy =
                    (k.blocks_per_sm * k.threads.div_ceil(32)) as f32 / t.max_warps as f32;
                out.push(k);
            }
        }
    }
    Ok(out)
}

/// What a kernel may take: at most `registers` a thread, nothing spilled
/// or on a stack, and at least `blocks[i]` blocks on a multiprocessor of
/// [`TARGETS`]`[i]`.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// The kernel, or a prefix of its name (`attention_d`).
    pub kernel: &'static str,
    pub registers: u32,
    pub blocks: [u32; 3],
}

/// The budgets. The matrix product and attention are where the time goes:
/// their registers leave room for the accumulators without spilling, and
/// their shared memory for as many blocks as keep the copies in flight (the
/// product: one block of 8 warps a multiprocessor, each thread holding a
/// range's 64 accumulators and the 64 sums of the ranges before it, with 3
/// or 4 k-slices of 32 KiB in flight; attention at head dimension 128: 1
/// to 2 of 4 warps each, enough to keep a KV sub-tile loading while one is
/// computed). The rest are small kernels.
pub const BUDGETS: [Budget; 7] = [
    Budget {
        kernel: "gemm_reduce",
        registers: 64,
        blocks: [4, 4, 4],
    },
    Budget {
        kernel: "gemm",
        registers: 240,
        blocks: [1, 1, 1],
    },
    Budget {
        kernel: "attention_merge",
        registers: 64,
        blocks: [8, 8, 8],
    },
    Budget {
        kernel: "attention_d128",
        registers: 240,
        blocks: [1, 1, 2],
    },
    Budget {
        kernel: "attention_d",
        registers: 200,
        blocks: [1, 1, 1],
    },
    // 1,024 threads a block: a multiprocessor holds two (one on sm_89).
    Budget {
        kernel: "argmax",
        registers: 64,
        blocks: [2, 1, 2],
    },
    Budget {
        kernel: "",
        registers: 64,
        blocks: [4, 4, 4],
    },
];

/// The budget `kernel` is held to: the first whose name is its prefix.
pub fn budget_of(kernel: &str) -> Budget {
    *BUDGETS
        .iter()
        .find(|b| kernel.starts_with(b.kernel))
        .unwrap_or(&BUDGETS[BUDGETS.len() - 1])
}

/// Every way `uses` break their budgets, one line each.
pub fn over_budget(uses: &[KernelUse]) -> Vec<String> {
    let mut out = Vec::new();
    for k in uses {
        let b = budget_of(&k.kernel);
        let at = TARGETS.iter().position(|t| t.sm == k.sm).unwrap_or(0);
        if k.registers > b.registers {
            out.push(format!(
                "{} on sm_{}: {} registers > {}",
                k.kernel, k.sm, k.registers, b.registers
            ));
        }
        if k.spilled > 0 || k.stack > 0 {
            out.push(format!(
                "{} on sm_{}: {} bytes spilled, {} bytes of stack",
                k.kernel, k.sm, k.spilled, k.stack
            ));
        }
        if k.blocks_per_sm < b.blocks[at] {
            out.push(format!(
                "{} on sm_{}: {} blocks a multiprocessor < {}",
                k.kernel, k.sm, k.blocks_per_sm, b.blocks[at]
            ));
        }
    }
    out
}

/// The report as a Markdown table, a row per kernel, a column group per
/// target.
pub fn table(uses: &[KernelUse]) -> String {
    let mut kernels: Vec<&str> = Vec::new();
    for k in uses {
        if !kernels.contains(&k.kernel.as_str()) {
            kernels.push(&k.kernel);
        }
    }
    let mut s = String::from("| kernel | threads |");
    for t in &TARGETS {
        s += &format!(" sm_{} regs | smem KiB | blocks/SM (occupancy) |", t.sm);
    }
    s += "\n|---|---:|";
    for _ in &TARGETS {
        s += "---:|---:|---:|";
    }
    s.push('\n');
    for name in kernels {
        let row: Vec<&KernelUse> = uses.iter().filter(|k| k.kernel == name).collect();
        s += &format!("| `{name}` | {} |", row.first().map_or(0, |k| k.threads));
        for t in &TARGETS {
            match row.iter().find(|k| k.sm == t.sm) {
                Some(k) => {
                    s += &format!(
                        " {}{} | {:.1} | {} ({:.0}%) |",
                        k.registers,
                        if k.spilled > 0 { " (spills)" } else { "" },
                        (k.static_smem + k.dynamic_smem) as f32 / 1024.0,
                        k.blocks_per_sm,
                        100.0 * k.occupancy
                    );
                }
                None => s += " – | – | – |",
            }
        }
        s.push('\n');
    }
    s
}

/// `KV_BLOCK` is the attention sub-tile: the budgets above assume 64.
const _: () = assert!(KV_BLOCK == 64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ptxas_reports_and_counts_blocks() {
        let report = "ptxas info    : Compiling entry function 'gemm' for 'sm_90'\n\
            ptxas info    : Function properties for gemm\n    \
            8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
            ptxas info    : Used 124 registers, used 1 barriers, 1024 bytes smem\n";
        let mut k = parse(report, 90, Pipelines::DEEP).remove(0);
        assert_eq!(
            (k.registers, k.spilled, k.stack, k.static_smem),
            (124, 16, 8, 1024)
        );
        assert_eq!(k.dynamic_smem, 131_072);
        // Registers: 128 a thread → 4096 a warp, 32 Ki a block of 8 warps:
        // 2 blocks; shared memory: 228 KiB / (128 KiB dynamic + 1 static +
        // 1 reserved): 1.
        k.blocks_per_sm = blocks_per_sm(&k, &TARGETS[2]);
        assert_eq!(k.blocks_per_sm, 1);
        k.dynamic_smem = 65_536;
        assert_eq!(blocks_per_sm(&k, &TARGETS[2]), 2);
        k.dynamic_smem = 131_072;
        assert_eq!(budget_of("attention_d128").registers, 240);
        assert_eq!(budget_of("attention_d64").registers, 200);
        assert_eq!(budget_of("gemm_reduce").registers, 64);
        assert_eq!(budget_of("embed").registers, 64);
        assert_eq!(
            over_budget(std::slice::from_ref(&k)),
            vec!["gemm on sm_90: 16 bytes spilled, 8 bytes of stack".to_string()]
        );
    }
}
