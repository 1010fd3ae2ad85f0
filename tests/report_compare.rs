//! Paired comparisons in `ladder report` (the paper's Tables 4 and 13):
//! cells that differ in one setting are compared arm by arm on shared seeds;
//! cells that differ in more, or in the episodes themselves, are not.

use std::path::Path;

use statebench::ladder::arms::Arm;
use statebench::ladder::episode::domain::Domain;
use statebench::ladder::episode::{BriefVariant, EpisodeConfig};
use statebench::ladder::parts::scripted::Scripted;
use statebench::ladder::report;
use statebench::ladder::run::cell::{run_cell, AgentSpec, CellConfig, CellParts, Source};
use statebench::ladder::run::runlog::read_run;

fn cell(dir: &Path, agent: Scripted, f: impl Fn(&mut CellConfig)) {
    let base = EpisodeConfig::paper(Domain::Procurement, 10, 0.15, 100);
    let mut cfg = CellConfig::paper(&base, 40, AgentSpec::Scripted(agent), Source::Oracle);
    cfg.arms = Arm::LADDER.to_vec();
    f(&mut cfg);
    run_cell(&cfg, &CellParts::scripted(agent), None, dir, 2, false).unwrap();
}

#[test]
fn cells_differing_in_one_setting_are_compared_on_shared_seeds() {
    let tmp = tempfile::tempdir().unwrap();
    let d = |n: &str| tmp.path().join(n);
    cell(&d("canonical"), Scripted::AlwaysBook, |_| {});
    cell(&d("ambiguous"), Scripted::AlwaysBook, |c| {
        c.episode.ambiguous_rate = 0.3
    });
    // Held-out wording and the original brief at once: two settings.
    cell(&d("two"), Scripted::AlwaysBook, |c| {
        c.episode.paraphrase_tier = 1;
        c.episode.brief = BriefVariant::Original;
    });
    // Another graph size: other episodes, never paired.
    cell(&d("s15"), Scripted::AlwaysBook, |c| c.episode.steps = 15);
    let runs: Vec<_> = ["canonical", "ambiguous", "two", "s15"]
        .iter()
        .map(|n| read_run(&d(n)).unwrap())
        .collect();
    let r = report::build(&runs).unwrap();
    assert_eq!(r.comparisons.len(), 1, "{:?}", r.comparisons);
    let c = &r.comparisons[0];
    assert_eq!(c.setting, "amb");
    assert_eq!(c.values, ["0.0".to_string(), "0.3".to_string()]);
    let enforce = c.arms.iter().find(|a| a.arm == "enforce").unwrap();
    assert_eq!(enforce.shared, 40);
    // State-bound enforcement admits the unrequested bookings of the
    // ambiguous probes, so always-book loses episodes there.
    assert_eq!(enforce.strict[0], 40);
    assert!(enforce.strict[1] < 40);
    assert_eq!(enforce.ambiguous[0], 0);
    assert!(enforce.ambiguous[1] > 0 && enforce.ambiguous_booked[1] > 0);
    assert!(enforce.p < 0.05 && enforce.p_holm >= enforce.p);
    let raw = c.arms.iter().find(|a| a.arm == "raw").unwrap();
    assert_eq!(
        raw.ambiguous_booked[1], raw.ambiguous[1],
        "always-book books every probe"
    );
    assert!(raw.matcher_agreement.is_none() && enforce.matcher_agreement.is_some());
    let text = report::render(&r, report::Format::Text);
    assert!(text.contains("Paired comparisons"), "{text}");
}
