//! What the probe suites share: an episode at S = 10, ρ = 0.15 in a
//! protocol, and one scripted episode-arm run with the oracle parts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use statebench::ladder::arms::Arm;
use statebench::ladder::episode::domain::Domain;
use statebench::ladder::episode::generator::generate;
use statebench::ladder::episode::{Episode, EpisodeConfig, Protocol};
use statebench::ladder::parts::scripted::{OracleMatcher, Scripted};
use statebench::ladder::parts::MemoryParts;
use statebench::ladder::run::cell::{run_cell, AgentSpec, CellConfig, CellParts, Source};
use statebench::ladder::run::runner::{
    run_episode, Compiled, EpisodeRecord, RunOptions, TurnRecord,
};

pub fn episode(domain: Domain, protocol: Protocol, seed: u64) -> Episode {
    let mut c = EpisodeConfig::paper(domain, 10, 0.15, seed);
    c.settings.protocol = protocol;
    generate(&c, None).unwrap()
}

pub fn run(
    ep: &Episode,
    arm: Arm,
    agent: Scripted,
    opts: RunOptions,
) -> (EpisodeRecord, Vec<TurnRecord>) {
    let mut agent = agent;
    run_episode(
        ep,
        arm,
        &mut agent,
        &mut OracleMatcher,
        &mut MemoryParts::scripted(),
        Some(&Compiled::oracle(ep)),
        &opts,
    )
}

/// The report's CSV rows as column → value maps, header first checked to
/// name each column once.
pub fn csv_rows(report: &statebench::ladder::report::Report) -> Vec<BTreeMap<String, String>> {
    let csv = statebench::ladder::report::render(report, statebench::ladder::report::Format::Csv);
    let mut lines = csv.lines();
    let head: Vec<&str> = lines.next().unwrap().split(',').collect();
    let unique: std::collections::BTreeSet<_> = head.iter().collect();
    assert_eq!(unique.len(), head.len(), "a column named twice: {csv}");
    lines
        .map(|l| {
            let cells: Vec<&str> = l.split(',').collect();
            assert_eq!(cells.len(), head.len(), "{l}");
            head.iter()
                .map(|h| h.to_string())
                .zip(cells.iter().map(|c| c.to_string()))
                .collect()
        })
        .collect()
}

/// A cell of `agent` with the oracle parts on `episodes` seeds of `base`,
/// run into `dir/control`, and the same cell with the probe `set` turns on
/// into `dir/name`; returns the two directories.
pub fn control_and_probe(
    dir: &Path,
    base: &EpisodeConfig,
    (agent, episodes, arms): (Scripted, u64, &[Arm]),
    set: impl FnOnce(&mut RunOptions),
    name: &str,
) -> (PathBuf, PathBuf) {
    let mut control = CellConfig::paper(base, episodes, AgentSpec::Scripted(agent), Source::Oracle);
    control.arms = arms.to_vec();
    let mut probe = control.clone();
    set(&mut probe.options);
    let parts = CellParts::scripted(agent);
    let (dc, dp) = (dir.join("control"), dir.join(name));
    run_cell(&control, &parts, None, &dc, 2, false).unwrap();
    run_cell(&probe, &parts, None, &dp, 2, false).unwrap();
    (dc, dp)
}
