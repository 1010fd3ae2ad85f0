//! Grids: one process over many cells, shards that add up to the whole,
//! cells that equal the same cells run alone, and bad grids refused.

mod engine_common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use statebench::ladder::run::runlog::read_run;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_statebench"))
}

fn ok(o: Output) -> String {
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn run(args: &[&str]) -> String {
    ok(bin().args(args).output().unwrap())
}

/// The report JSON with wall-clock fields zeroed (they differ between any
/// two runs; everything else must not).
fn stable_json(text: &str) -> serde_json::Value {
    fn zero(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m.iter_mut() {
                    if k == "wall_s" {
                        *x = 0.into();
                    } else {
                        zero(x);
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(zero),
            _ => {}
        }
    }
    let mut v: serde_json::Value = serde_json::from_str(text).unwrap();
    zero(&mut v);
    v
}

/// The report's text up to the per-cell sections: the grid's tables, which
/// hold no wall-clock figure.
fn grid_section(md: &str) -> &str {
    &md[..md.find("\n### ").expect("per-cell sections follow")]
}

const AXES: [&str; 8] = [
    "--steps",
    "5,10",
    "--density",
    "0.15,0.3",
    "--episodes",
    "6",
    "--arms",
    "raw,checklist,directive,enforce",
];

#[test]
fn sharded_grid_reports_equal_the_unsharded_grid() {
    let tmp = tempfile::tempdir().unwrap();
    let whole = tmp.path().join("whole");
    let mut args = vec!["ladder", "grid", "--agent", "always-book", "--quiet"];
    args.extend(AXES);
    let mut a = args.clone();
    a.extend(["--out", whole.to_str().unwrap()]);
    run(&a);

    // Three shards: by flag, by a Slurm job array, by a Kubernetes Indexed Job.
    let shards: Vec<PathBuf> = (0..3).map(|i| tmp.path().join(format!("s{i}"))).collect();
    let mut a = args.clone();
    a.extend(["--out", shards[0].to_str().unwrap(), "--shard", "0/3"]);
    run(&a);
    let mut a = args.clone();
    a.extend(["--out", shards[1].to_str().unwrap()]);
    ok(bin()
        .args(&a)
        .env("SLURM_ARRAY_TASK_ID", "1")
        .env("SLURM_ARRAY_TASK_COUNT", "3")
        .output()
        .unwrap());
    let mut a = args.clone();
    a.extend(["--out", shards[2].to_str().unwrap()]);
    ok(bin()
        .args(&a)
        .env("JOB_COMPLETION_INDEX", "2")
        .env("STATEBENCH_SHARD_COUNT", "3")
        .output()
        .unwrap());

    // Disjoint and complete: every (cell, seed, arm) once across the shards.
    let cells = ["S5_rho0.15", "S5_rho0.3", "S10_rho0.15", "S10_rho0.3"];
    let mut total = 0;
    for c in cells {
        let mut seen = std::collections::BTreeSet::new();
        for s in &shards {
            for e in read_run(&s.join(c)).unwrap().episodes {
                assert!(seen.insert((e.seed, e.arm)), "{c}: {} twice", e.seed);
            }
        }
        assert_eq!(seen.len(), 24, "{c}");
        assert!(shards
            .iter()
            .all(|s| read_run(&s.join(c)).unwrap().episodes.len() < 24));
        total += seen.len();
    }
    assert_eq!(total, 96);

    let report = |dirs: &[&Path], format: &str| {
        let mut a = vec!["ladder", "report", "--format", format];
        a.extend(dirs.iter().map(|d| d.to_str().unwrap()));
        run(&a)
    };
    let parts: Vec<&Path> = shards.iter().map(|p| p.as_path()).collect();
    let md_whole = report(&[&whole], "md");
    let md_parts = report(&parts, "md");
    assert_eq!(grid_section(&md_whole), grid_section(&md_parts));
    assert!(md_whole.contains("| S | rho | raw | checklist | directive | enforce |"));
    assert_eq!(
        stable_json(&report(&[&whole], "json")),
        stable_json(&report(&parts, "json"))
    );
    // The shards in another order give the same report.
    let reversed: Vec<&Path> = parts.iter().rev().copied().collect();
    assert_eq!(
        stable_json(&report(&parts, "json")),
        stable_json(&report(&reversed, "json"))
    );
    // One tidy CSV row per cell and arm.
    let csv = report(&parts, "csv");
    assert_eq!(csv.lines().count(), 1 + 4 * 4);

    // A resume runs nothing more.
    let mut a = args.clone();
    a.extend(["--out", whole.to_str().unwrap()]);
    let o = bin().args(&a).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    ok(o);
    assert!(err.contains("ran 0 episode-arms"), "{err}");
}

#[test]
fn grid_cells_on_a_model_equal_the_same_cells_run_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let model = engine_common::tiny_model_long(tmp.path());
    let model = model.to_str().unwrap();
    let grid = tmp.path().join("grid");
    // Tiers 0 and 1 share the brief, so their compiles are shared; both
    // cells are batched together through one engine.
    run(&[
        "ladder",
        "grid",
        "--agent",
        "model",
        "--device",
        "cpu",
        "--model",
        model,
        "--steps",
        "3",
        "--paraphrase-tier",
        "0,1",
        "--episodes",
        "2",
        "--arms",
        "raw,enforce",
        "--live",
        "8",
        "--out",
        grid.to_str().unwrap(),
        "--quiet",
    ]);
    for tier in ["0", "1"] {
        let alone = tmp.path().join(format!("alone{tier}"));
        run(&[
            "ladder",
            "cell",
            "--agent",
            "model",
            "--device",
            "cpu",
            "--model",
            model,
            "--steps",
            "3",
            "--paraphrase-tier",
            tier,
            "--episodes",
            "2",
            "--arms",
            "raw,enforce",
            "--live",
            "1",
            "--out",
            alone.to_str().unwrap(),
            "--quiet",
        ]);
        let cell = grid.join(format!("tier{tier}"));
        let (a, b) = (
            engine_common::stable_records(&alone),
            engine_common::stable_records(&cell),
        );
        assert_eq!(a.len(), 4);
        assert_eq!(a, b, "tier {tier}: the grid cell equals the cell run alone");
        assert_eq!(
            read_run(&alone).unwrap().manifest.config,
            read_run(&cell).unwrap().manifest.config
        );
    }
}

/// `ladder grid` takes every flag `ladder cell` takes, and a grid cell with
/// them equals the cell run alone: configuration and episodes.
#[test]
fn grid_cells_with_the_cells_flags_equal_the_cells_run_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let grid = tmp.path().join("grid");
    let flags = [
        "--agent",
        "always-book",
        "--arms",
        "raw,enforce,topk-replace,mem0-augment",
        "--episodes",
        "3",
        "--embedder",
        "lexical",
        "--memory-writer",
        "oracle",
        "--corrupt",
        "0.01",
        "--no-bypass",
        "--quiet",
    ];
    let mut a = vec!["ladder", "grid", "--steps", "5,6", "--out"];
    a.push(grid.to_str().unwrap());
    a.extend(flags);
    run(&a);
    let alone = tmp.path().join("alone");
    let mut a = vec!["ladder", "cell", "--steps", "6", "--out"];
    a.push(alone.to_str().unwrap());
    a.extend(flags);
    run(&a);
    let config = read_run(&alone).unwrap().manifest.config;
    assert_eq!(read_run(&grid.join("S6")).unwrap().manifest.config, config);
    let config = serde_json::to_value(&config).unwrap();
    assert_eq!(config["embedder"]["kind"], "lexical", "{config}");
    assert_eq!(config["options"]["bypass_matcher"], false, "{config}");
    assert_eq!(config["options"]["corrupt"], 0.01, "{config}");
    assert_eq!(
        engine_common::stable_records(&grid.join("S6")),
        engine_common::stable_records(&alone)
    );
    // A cell takes one value of each setting.
    let o = bin()
        .args(["ladder", "cell", "--steps", "5,6", "--out"])
        .arg(tmp.path().join("two"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("make 2 cells"));
    assert!(!tmp.path().join("two").exists());
}

/// Runs a command that must fail with one line naming `needle`, and
/// checks that `out` was not created.
fn refused(args: &[&str], needle: &str, out: &Path) {
    let o = bin().args(args).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{args:?} succeeded");
    assert!(err.contains(needle), "{args:?}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    assert!(!out.exists(), "{args:?} wrote {}", out.display());
}

#[test]
fn bad_grids_are_refused_in_one_line_and_write_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let o = out.to_str().unwrap();
    let cases = [
        (
            "steps = [5]\nstepz = [5]\n",
            "line 2 (`stepz = [5]`): unknown field `stepz`",
        ),
        ("steps = [5, 40]\n", "steps = 40: steps must be in 1..=18"),
        (
            "density = [1.5]\n",
            "density = 1.5: density must be in [0, 1]",
        ),
        (
            "ambiguous_rate = []\n",
            "ambiguous_rate = []: an axis needs at least one value",
        ),
        ("arms = [\"raw\", \"bogus\"]\n", "unknown variant `bogus`"),
        ("arms = [\"raw\", \"raw\"]\n", "arm raw is listed twice"),
        (
            "[[cross]]\nsteps = [5]\n[[cross.cross]]\nsteps = [6]\n",
            "crosses do not nest",
        ),
    ];
    for (i, (text, needle)) in cases.iter().enumerate() {
        let f = tmp.path().join(format!("bad{i}.toml"));
        fs::write(&f, text).unwrap();
        let name = f.to_str().unwrap();
        refused(&["ladder", "grid", name, "--out", o], needle, &out);
        assert!(
            String::from_utf8_lossy(
                &bin()
                    .args(["ladder", "grid", name, "--dry-run"])
                    .output()
                    .unwrap()
                    .stderr
            )
            .contains(name),
            "the message names the file"
        );
    }
    refused(
        &[
            "ladder", "grid", "--steps", "5", "--out", o, "--shard", "3/2",
        ],
        "--shard 3/2: expected i/n",
        &out,
    );

    // Shards of two grids, or of one grid on two engines, in one report.
    let a = tmp.path().join("a");
    let b = tmp.path().join("b");
    let base = ["ladder", "grid", "--steps", "5", "--quiet"];
    let mut x = base.to_vec();
    x.extend([
        "--episodes",
        "2",
        "--shard",
        "0/2",
        "--out",
        a.to_str().unwrap(),
    ]);
    run(&x);
    let mut x = base.to_vec();
    x.extend(["--episodes", "3", "--out", b.to_str().unwrap()]);
    run(&x);
    let r = bin()
        .args(["ladder", "report", a.to_str().unwrap(), b.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!r.status.success());
    assert!(String::from_utf8_lossy(&r.stderr).contains("report one grid at a time"));

    let c = tmp.path().join("c");
    let mut x = base.to_vec();
    x.extend([
        "--episodes",
        "2",
        "--shard",
        "1/2",
        "--out",
        c.to_str().unwrap(),
    ]);
    run(&x);
    // The other shard's cell as if another engine had run it.
    let m = c.join("cell/manifest.json");
    let mut v: serde_json::Value = serde_json::from_str(&fs::read_to_string(&m).unwrap()).unwrap();
    v["model"] = serde_json::json!({"agent": "scripted:other"});
    fs::write(&m, v.to_string()).unwrap();
    let r = bin()
        .args(["ladder", "report", a.to_str().unwrap(), c.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!r.status.success());
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(err.contains("another configuration or model"), "{err}");
}

/// The probes' grid sets each probe apart from its control in crosses:
/// the cells are named by the probe they run, the controls plainly.
#[test]
fn the_documented_probes_grid_names_each_probe_beside_its_control() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/grid/probes.toml");
    let listed = run(&["ladder", "grid", file.to_str().unwrap(), "--dry-run"]);
    let names: Vec<&str> = listed
        .lines()
        .filter(|l| l.contains(" episodes x "))
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "text",
            "text_spoof0.3",
            "text_escalation",
            "native",
            "native_faults0.3"
        ],
        "{listed}"
    );
    assert!(listed.ends_with("5 cells, 80 episode-arms\n"), "{listed}");
}

#[test]
fn the_documented_table2_grid_lists_its_cells_and_shards_cover_it() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/grid/table2.toml");
    let f = file.to_str().unwrap();
    let whole = run(&["ladder", "grid", f, "--dry-run"]);
    // Five (S, ρ) pairs x two regimes, 128 episodes x 4 rungs each.
    assert!(whole.ends_with("10 cells, 5120 episode-arms\n"), "{whole}");
    assert!(whole.contains("think_S15_rho0.3 "), "{whole}");
    let mut sum = 0;
    let mut work = Vec::new();
    for i in 0..8 {
        let o = bin()
            .args(["ladder", "grid", f, "--dry-run"])
            .env("SLURM_ARRAY_TASK_ID", i.to_string())
            .env("SLURM_ARRAY_TASK_COUNT", "8")
            .output()
            .unwrap();
        let text = ok(o);
        let last = text.lines().last().unwrap();
        assert!(
            last.contains(&format!("in shard {i}/8 (grid 5120)")),
            "{last}"
        );
        sum += last.split(' ').nth(2).unwrap().parse::<u64>().unwrap();
        // Expected work: episode-arms x S, from the cell lines.
        let w: u64 = text
            .lines()
            .filter(|l| l.contains(" episodes x "))
            .map(|l| {
                let name = l.split_whitespace().next().unwrap();
                let s: u64 = name
                    .split('_')
                    .find_map(|p| p.strip_prefix('S'))
                    .unwrap()
                    .parse()
                    .unwrap();
                let eps: u64 = l.split_whitespace().nth(1).unwrap().parse().unwrap();
                eps * 4 * s
            })
            .sum();
        work.push(w);
    }
    assert_eq!(sum, 5120);
    // Balanced by expected work: no shard over its share by more than 5%.
    let mean = work.iter().sum::<u64>() as f64 / 8.0;
    assert!(work.iter().all(|&w| (w as f64) <= mean * 1.05), "{work:?}");
}
