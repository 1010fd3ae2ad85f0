//! `STATEBENCH_CPU_ISA` caps every CPU kernel family at once, and every
//! family gives the same bits: the default GGUF's logits, its greedy path
//! and a seeded sample are compared under each cap this host runs, in both
//! weight layouts, and against the aarch64 Linux build run under
//! qemu-user. A cap that is unknown, or that the host cannot run, is
//! refused in one line naming the variable.

mod engine_common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use engine_common::{default_model, missing};
use statebench_kernels::{Isa, ISA_VAR};

/// Which statebench runs: this build, or the aarch64 binary under
/// qemu-user emulating `cpu` (`max` has the dot-product extension, a
/// Cortex-A72 has plain NEON only).
#[derive(Clone, Copy)]
enum Build<'a> {
    Here,
    Aarch64 { exe: &'a Path, cpu: &'a str },
}

fn statebench(cap: Option<&str>, args: &[&str]) -> Output {
    statebench_on(Build::Here, cap, args)
}

fn statebench_on(build: Build, cap: Option<&str>, args: &[&str]) -> Output {
    let mut c = match build {
        Build::Here => Command::new(env!("CARGO_BIN_EXE_statebench")),
        Build::Aarch64 { exe, cpu } => {
            let mut c = Command::new("qemu-aarch64");
            c.args(["-cpu", cpu, "-L", "/usr/aarch64-linux-gnu"])
                .arg(exe);
            c
        }
    };
    c.args(args)
        .env_remove(ISA_VAR)
        .env_remove("STATEBENCH_NO_AMX")
        .env_remove("STATEBENCH_NO_VNNI");
    if let Some(cap) = cap {
        c.env(ISA_VAR, cap);
    }
    c.output().expect("statebench runs")
}

fn stdout(build: Build, cap: Option<&str>, args: &[&str]) -> String {
    let o = statebench_on(build, cap, args);
    assert!(
        o.status.success(),
        "{cap:?} {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// What one cap computes: the logits after a 40-token prompt (a prefill of
/// many rows, where the AMX and VNNI paths take over) with 8 greedy steps,
/// and `sampled` tokens drawn at temperature 0.9 from a chat prompt.
fn outputs(
    build: Build,
    cap: Option<&str>,
    weights: &str,
    sampled: usize,
) -> (serde_json::Value, String) {
    let model = default_model();
    let model = model.to_str().unwrap();
    let tokens: Vec<String> = (0..40).map(|i| (100 + 37 * i).to_string()).collect();
    let engine = ["--model", model, "--weights", weights, "--threads", "2"];
    let tokens = tokens.join(",");
    let run = |head: &[&str], tail: &[&str]| stdout(build, cap, &[head, &engine, tail].concat());
    let logits = run(
        &["check", "logits"],
        &["--tokens", &tokens, "--greedy", "8"],
    );
    let prompt = "Name three rivers in Europe and say where each one rises.";
    let sample = run(
        &["generate"],
        &[
            "--prompt",
            prompt,
            "--max-tokens",
            &sampled.to_string(),
            "--temperature",
            "0.9",
            "--seed",
            "7",
        ],
    );
    (
        serde_json::from_str(&logits).expect("check logits prints JSON"),
        sample,
    )
}

#[test]
#[cfg_attr(
    not(has_default_model),
    ignore = "needs the default model: run models/fetch.sh"
)]
fn every_kernel_family_gives_the_same_bits() {
    let caps = Isa::available();
    assert!(caps.contains(&Isa::Scalar) && caps.len() >= 2, "{caps:?}");
    let widest = *caps.last().unwrap();
    for weights in ["widened", "native"] {
        let (logits, sample) = outputs(Build::Here, None, weights, 24);
        assert_eq!(logits["hardware"], format!("{widest} kernels"));
        assert_eq!(logits["greedy"].as_array().unwrap().len(), 8);
        assert!(!sample.trim().is_empty());
        for cap in &caps {
            let (l, s) = outputs(Build::Here, Some(cap.name()), weights, 24);
            // The family that ran is the one asked for, and its bits are the widest's.
            assert_eq!(l["hardware"], format!("{cap} kernels"));
            for k in ["last_logits", "greedy"] {
                assert_eq!(l[k], logits[k], "{cap} {k}, {weights} weights");
            }
            assert_eq!(s, sample, "{cap} sample, {weights} weights");
        }
    }
}

/// The aarch64 Linux build, cross-compiled by `.ci/run` (`cargo build
/// --release --target aarch64-unknown-linux-gnu`, linked as
/// `.cargo/config.toml` says) and run under qemu-user, computes this host's
/// bits: the same logits, greedy path and seeded sample under its default
/// family (`neon`, taking `sdot`), under `neon` on a CPU without the
/// dot-product extension, and under `scalar`; an x86 family is refused by
/// name. Emulated, a token costs seconds, so the sample is 8 tokens.
#[test]
#[cfg_attr(
    not(has_default_model),
    ignore = "needs the default model: run models/fetch.sh"
)]
fn the_aarch64_build_gives_this_hosts_bits() {
    // The binary under test sits in <target>/release: the cross build in
    // <target>/aarch64-unknown-linux-gnu/release.
    let target: PathBuf = Path::new(env!("CARGO_BIN_EXE_statebench"))
        .ancestors()
        .nth(2)
        .expect("a target directory")
        .to_path_buf();
    let exe = target.join("aarch64-unknown-linux-gnu/release/statebench");
    if !exe.is_file() {
        missing(&format!(
            "no aarch64 build at {} (cargo build --release --target aarch64-unknown-linux-gnu)",
            exe.display()
        ));
        return;
    }
    if Command::new("qemu-aarch64")
        .arg("--version")
        .output()
        .is_err()
    {
        missing("qemu-aarch64 does not run (Debian: qemu-user)");
        return;
    }
    let (logits, sample) = outputs(Build::Here, None, "widened", 8);
    let runs = [
        ("max", None, "neon"),
        ("cortex-a72", Some("neon"), "neon"),
        ("max", Some("scalar"), "scalar"),
    ];
    for (cpu, cap, family) in runs {
        let arm = Build::Aarch64 { exe: &exe, cpu };
        let (l, s) = outputs(arm, cap, "widened", 8);
        assert_eq!(l["hardware"], format!("{family} kernels"), "{cpu} {cap:?}");
        for k in ["last_logits", "greedy"] {
            assert_eq!(l[k], logits[k], "aarch64 {k} on {cpu}, cap {cap:?}");
        }
        assert_eq!(s, sample, "aarch64 sample on {cpu}, cap {cap:?}");
    }
    let arm = Build::Aarch64 {
        exe: &exe,
        cpu: "max",
    };
    let o = statebench_on(arm, Some("avx512"), &["ladder", "episode", "--steps", "5"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "avx512 was taken: {err}");
    assert!(err.contains(&format!("{ISA_VAR}=avx512")), "{err}");
}

/// The number after `key` in `line` (commas and units aside).
fn figure(line: &str, key: &str) -> f64 {
    let at = line
        .find(key)
        .unwrap_or_else(|| panic!("{key:?} in {line:?}"))
        + key.len();
    let num: String = line[at..]
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    num.parse()
        .unwrap_or_else(|_| panic!("a number after {key:?} in {line:?}"))
}

/// `bench` measures the host's ceilings on the engine's threads (the int8
/// dot peak of the family in force, where it has a dot instruction, and the
/// streaming read) and states prefill and every decode batch as fractions
/// of them; the matrix products are counted from the model's shape (the
/// default GGUF's layers hold 0.36 B weights, one MAC each a token).
#[test]
#[cfg_attr(
    not(has_default_model),
    ignore = "needs the default model: run models/fetch.sh"
)]
fn bench_reads_its_figures_against_the_hosts_ceilings() {
    let model = default_model();
    for cap in Isa::available() {
        let out = stdout(
            Build::Here,
            Some(cap.name()),
            &[
                "bench",
                "--model",
                model.to_str().unwrap(),
                "--threads",
                "2",
                "--prefill-tokens",
                "64",
                "--batches",
                "1,4",
                "--decode-steps",
                "4",
                "--turns",
                "1",
            ],
        );
        let lines = |start: &'static str| {
            out.lines()
                .filter(move |l| l.starts_with(start))
                .collect::<Vec<_>>()
        };
        let peak = lines("host: int8 dot peak").first().copied();
        assert_eq!(peak.is_some(), cap != Isa::Scalar, "{cap}: {out}");
        let stream = figure(lines("host: streaming read")[0], "read");
        assert!(stream > 0.0, "{out}");
        let prefill = lines("prefill:")[0];
        assert_eq!(figure(prefill, "products:"), 357.8, "{prefill}");
        if let Some(peak) = peak {
            let dot = figure(peak, "peak");
            let (rate, pct) = (figure(prefill, "|"), figure(prefill, "GMAC/s,"));
            assert!(dot > 0.0 && rate > 0.0, "{out}");
            assert!(
                (100.0 * rate / dot - pct).abs() <= 1.0,
                "{prefill} against {peak}"
            );
        }
        // The widened default GGUF's weights, which each step reads: 558 MB
        // in groups of eight rows, 582 MB sixteen rows at a time (f32
        // scales), as the host line says they are held under this cap.
        let layout = lines("host: a 512-bit vpdpbusd").first().copied();
        let vnni = peak.is_some_and(|p| p.contains("512-bit vpdpbusd"));
        assert_eq!(layout.is_some(), vnni, "{cap}: {out}");
        let held = if layout.is_some_and(|l| l.contains("sixteen rows at a time")) {
            582.0
        } else {
            558.0
        };
        // The weights asked for huge pages; where Linux hands them out on
        // request, they got some (the allocator is the binary's).
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled");
        if let Ok(thp) = thp {
            let line = lines("host: transparent huge pages")[0];
            let setting = thp.split_once('[').unwrap().1.split_once(']').unwrap().0;
            assert!(
                line.contains(&format!("pages {setting};")),
                "{line} ({thp})"
            );
            let on_huge = figure(line, &format!("{setting};"));
            assert_eq!(on_huge > 0.0, setting != "never", "{line}");
        }
        let decode = lines("decode: batch");
        assert_eq!(decode.len(), 2, "{out}");
        for d in decode {
            assert_eq!(figure(d, "weights"), held, "{d}");
            let (rate, pct) = (figure(d, "step:"), figure(d, "GB/s,"));
            assert!((100.0 * rate / stream - pct).abs() <= 1.0, "{d}");
        }
    }
}

#[test]
fn a_cap_that_cannot_run_is_refused_in_one_line() {
    let x86 = cfg!(target_arch = "x86_64");
    let mut bad = vec!["avx1024", "AVX-512", " "];
    // A family of the other architecture never runs here.
    bad.push(if x86 { "neon" } else { "avx2" });
    for value in bad {
        let o = statebench(Some(value), &["ladder", "episode", "--steps", "5"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{value:?} was taken");
        assert_eq!(err.trim_end().lines().count(), 1, "{value:?}: {err}");
        assert!(err.contains(&format!("{ISA_VAR}={value}")), "{err}");
        assert!(o.stdout.is_empty());
    }
    // Every family the host runs is taken, in any case.
    for cap in Isa::available() {
        let o = statebench(
            Some(&cap.name().to_uppercase()),
            &["ladder", "episode", "--steps", "5"],
        );
        assert!(
            o.status.success(),
            "{cap}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}
