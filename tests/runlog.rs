//! Run directories: append-only logs, resume after a crash without losing,
//! duplicating or changing an episode, torn last lines, configuration checks.

use std::fs;
use std::path::Path;

use statebench::ladder::arms::Arm;
use statebench::ladder::episode::domain::Domain;
use statebench::ladder::episode::{BriefVariant, EpisodeSettings, Protocol};
use statebench::ladder::parts::scripted::Scripted;
use statebench::ladder::run::cell::{
    run_cell, AgentSpec, CellConfig, CellError, CellParts, Source,
};
use statebench::ladder::run::runlog::{read_run, read_turns};
use statebench::ladder::run::runner::{EpisodeRecord, RunOptions};
use statebench::rundir::{DirError, Identity};

fn cfg(agent: Scripted) -> CellConfig {
    CellConfig {
        episode: EpisodeSettings {
            domain: Domain::Procurement,
            steps: 8,
            density: 0.15,
            brief: BriefVariant::Amended,
            protocol: Protocol::Text,
            paraphrase_tier: 0,
            ambiguous_rate: 0.0,
        },
        seed_start: 100,
        episodes: 12,
        arms: vec![Arm::Raw, Arm::Checklist, Arm::Directive, Arm::Enforce],
        agent: AgentSpec::Scripted(agent),
        matcher: Source::Oracle,
        compiler: Source::Oracle,
        thinking: false,
        options: RunOptions::default(),
        embedder: None,
        memory_writer: None,
    }
}

fn run(
    c: &CellConfig,
    dir: &Path,
) -> Result<statebench::ladder::run::cell::CellProgress, CellError> {
    let agent = c.agent.scripted().unwrap();
    // Several workers, so completion order differs from seed order.
    run_cell(c, &CellParts::scripted(agent), None, dir, 3, false)
}

/// Episode records without the fields that measure time.
fn stable(mut v: Vec<EpisodeRecord>) -> Vec<String> {
    v.sort_by_key(|r| (r.seed, r.arm));
    v.into_iter()
        .map(|mut r| {
            r.wall_s = 0.0;
            serde_json::to_string(&r).unwrap()
        })
        .collect()
}

#[test]
fn killed_and_resumed_cell_equals_an_uninterrupted_one() {
    let tmp = tempfile::tempdir().unwrap();
    let (full, cut) = (tmp.path().join("full"), tmp.path().join("cut"));
    let c = cfg(Scripted::AlwaysBook);
    let p = run(&c, &full).unwrap();
    assert_eq!((p.ran, p.skipped), (48, 0));

    // A crash: the run had written 17 episode lines and was mid-way through
    // the 18th episode's turn lines and its episode line.
    fs::create_dir_all(&cut).unwrap();
    fs::copy(full.join("manifest.json"), cut.join("manifest.json")).unwrap();
    let eps = fs::read_to_string(full.join("episodes.jsonl")).unwrap();
    let lines: Vec<&str> = eps.lines().collect();
    let mut kept = lines[..17].join("\n") + "\n";
    kept.push_str(&lines[17][..40]);
    fs::write(cut.join("episodes.jsonl"), kept).unwrap();
    let turns = fs::read_to_string(full.join("turns.jsonl")).unwrap();
    let tl: Vec<&str> = turns.lines().collect();
    let mut tkept = tl[..17 * 44 + 10].join("\n") + "\n";
    tkept.push_str(&tl[17 * 44 + 10][..25]);
    fs::write(cut.join("turns.jsonl"), tkept).unwrap();

    // Reading a crashed directory ignores the torn line.
    assert_eq!(read_run(&cut).unwrap().episodes.len(), 17);

    let p = run(&c, &cut).unwrap();
    assert_eq!((p.ran, p.skipped), (31, 17));
    let a = read_run(&full).unwrap().episodes;
    let b = read_run(&cut).unwrap().episodes;
    assert_eq!(b.len(), 48, "no episode lost or duplicated");
    assert_eq!(stable(a), stable(b), "no episode changed");
    // Turn lines of the unfinished attempt are ignored; each finished episode has its 44.
    assert_eq!(read_turns(&cut).unwrap().len(), 48 * 44);

    // A third run has nothing to do.
    let p = run(&c, &cut).unwrap();
    assert_eq!((p.ran, p.skipped), (0, 48));
}

#[test]
fn resuming_with_another_configuration_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let c = cfg(Scripted::Perfect);
    run(&c, tmp.path()).unwrap();
    let mut other = c.clone();
    other.episode.density = 0.3;
    let err = run(&other, tmp.path()).unwrap_err();
    match &err {
        CellError::Log(DirError::ConfigMismatch { key, .. }) => {
            assert_eq!(key, "config.density")
        }
        e => panic!("unexpected error {e}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("config.density") && !msg.contains('\n'),
        "{msg}"
    );
}

#[test]
fn bad_configuration_touches_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("never");
    let mut c = cfg(Scripted::Perfect);
    c.episode.steps = 19;
    assert!(matches!(run(&c, &dir), Err(CellError::Gen(_))));
    assert!(!dir.exists());
}

#[test]
fn corrupt_middle_line_is_an_error_with_its_line_number() {
    let tmp = tempfile::tempdir().unwrap();
    let c = cfg(Scripted::Perfect);
    run(&c, tmp.path()).unwrap();
    let path = tmp.path().join("episodes.jsonl");
    let text = fs::read_to_string(&path).unwrap();
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    lines[3] = "{not json".into();
    fs::write(&path, lines.join("\n") + "\n").unwrap();
    let err = statebench::one_line(&read_run(tmp.path()).unwrap_err());
    assert!(err.contains("episodes.jsonl:4:"), "{err}");
}

#[test]
fn resuming_across_a_change_of_engine_arithmetic_is_refused() {
    use statebench::ladder::run::runlog::{Locking, Manifest, RunDir, RUN_FORMAT};
    let tmp = tempfile::tempdir().unwrap();
    let manifest = |arithmetic: &str| Manifest {
        format: RUN_FORMAT.into(),
        config: cfg(Scripted::Perfect),
        model: Identity::Model(statebench::backend::ModelIdentity {
            name: "m".into(),
            source: "m.gguf".into(),
            weights_sha256: String::new(),
            architecture: "qwen2".into(),
            format: "gguf".into(),
            arithmetic: arithmetic.into(),
            device: String::new(),
        }),
        cpu_kernels: String::new(),
        crate_version: "0".into(),
        git_commit: "unknown".into(),
    };
    RunDir::open(
        tmp.path(),
        &manifest(statebench_kernels::ARITHMETIC),
        Locking::Own,
    )
    .unwrap();
    RunDir::open(
        tmp.path(),
        &manifest(statebench_kernels::ARITHMETIC),
        Locking::Own,
    )
    .expect("same engine resumes");
    match RunDir::open(tmp.path(), &manifest("older kernels"), Locking::Own) {
        Err(DirError::ConfigMismatch { key, .. }) => assert_eq!(key, "model.arithmetic"),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("a run made by other kernels must not resume"),
    }
}
