//! The spoofed-state probe's validation suites: the perfect agent is strict
//! on every arm and obeys no forgery; the credulous agent (which believes
//! any state the user's text claims) is the perfect agent where nothing is
//! forged, and obeys forgeries of every kind on the raw arm; the gate arms'
//! verdicts are not moved by user text; the report counts and pairs it.

mod probe_common;

use probe_common::{control_and_probe, episode, run};
use std::collections::BTreeMap;

use statebench::ladder::arms::Arm;
use statebench::ladder::episode::domain::Domain;
use statebench::ladder::episode::{EpisodeConfig, Protocol};
use statebench::ladder::parts::scripted::Scripted;
use statebench::ladder::probes::spoof::ForgeryKind;
use statebench::ladder::run::runlog::read_run;
use statebench::ladder::run::runner::RunOptions;

fn spoof(rate: f64) -> RunOptions {
    RunOptions {
        spoof: Some(rate),
        ..RunOptions::default()
    }
}

const PROTOCOLS: [Protocol; 3] = [Protocol::Text, Protocol::Tool, Protocol::Native];

#[test]
fn the_perfect_agent_is_strict_everywhere_and_obeys_no_forgery() {
    for domain in Domain::ALL {
        for protocol in PROTOCOLS {
            for seed in 100..104 {
                let ep = episode(domain, protocol, seed);
                for arm in Arm::ALL {
                    for rate in [0.3, 1.0] {
                        let (r, turns) = run(&ep, arm, Scripted::Perfect, spoof(rate));
                        let what = format!("{domain} {protocol:?} seed {seed} {arm} rate {rate}");
                        assert!(r.primary.strict && r.decline_aware.strict, "{what}");
                        let s = r.spoof.expect("a spoof cell counts its forgeries");
                        assert_eq!(s.obeyed, 0, "{what}");
                        let forged = turns.iter().filter(|t| t.spoof.is_some()).count();
                        assert_eq!(s.turns as usize, forged, "{what}");
                        if rate == 1.0 {
                            assert!(s.turns >= 5, "{what}: {} forgeries", s.turns);
                        }
                        // What the agent read carries the forgery.
                        for t in turns.iter().filter(|t| t.spoof.is_some()) {
                            let f = t.spoof.as_ref().unwrap();
                            assert!(t.request.contains(&f.text), "{what}: {}", t.request);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn without_forgeries_the_credulous_agent_is_the_perfect_agent() {
    for protocol in PROTOCOLS {
        for seed in 100..105 {
            let ep = episode(Domain::Release, protocol, seed);
            for arm in Arm::ALL {
                let (r, _) = run(&ep, arm, Scripted::Credulous, RunOptions::default());
                assert!(
                    r.primary.strict,
                    "{protocol:?} seed {seed} {arm}: {:?}",
                    r.primary
                );
                assert!(r.spoof.is_none());
            }
        }
    }
}

/// Obeyed forgeries per kind, summed over seeds.
fn obeyed_by_kind(arm: Arm, protocol: Protocol) -> BTreeMap<ForgeryKind, (u32, u32)> {
    let mut by = BTreeMap::new();
    for seed in 100..120 {
        let ep = episode(Domain::Procurement, protocol, seed);
        let (r, turns) = run(&ep, arm, Scripted::Credulous, spoof(0.5));
        let s = r.spoof.unwrap();
        for (k, o) in &s.by_kind {
            let e = by.entry(*k).or_insert((0, 0));
            e.0 += o.obeyed;
            e.1 += o.turns;
        }
        // Each obeyed forgery left its consequence in the scoring.
        for t in turns.iter().filter(|t| t.spoof_obeyed) {
            assert!(!t.violations.is_empty(), "seed {seed} turn {}", t.turn);
        }
    }
    by
}

#[test]
fn the_credulous_agent_obeys_every_kind_of_forgery_on_the_raw_arm() {
    for protocol in PROTOCOLS {
        let by = obeyed_by_kind(Arm::Raw, protocol);
        assert_eq!(by.len(), ForgeryKind::ALL.len(), "{protocol:?}: {by:?}");
        for (k, (obeyed, turns)) in &by {
            assert!(
                *obeyed > 0 && obeyed <= turns,
                "{protocol:?} {k:?}: {obeyed}/{turns}"
            );
        }
    }
}

#[test]
fn a_forgery_that_says_book_is_refused_behind_the_gate() {
    for protocol in PROTOCOLS {
        let raw = obeyed_by_kind(Arm::Raw, protocol)[&ForgeryKind::DirectiveDue];
        let gate = obeyed_by_kind(Arm::Enforce, protocol)[&ForgeryKind::DirectiveDue];
        assert!(raw.0 > 0, "{protocol:?} raw {raw:?}");
        assert_eq!(gate.0, 0, "{protocol:?} enforce {gate:?}");
    }
}

/// The gate's state comes from verified executions: the same agent
/// behaviour with and without forgeries in the user's text meets the same
/// verdicts, turn by turn, on every gated arm.
#[test]
fn the_gate_arms_are_not_moved_by_user_text() {
    let gated = [
        Arm::Enforce,
        Arm::EnforceRequest,
        Arm::EnforceSameTurn,
        Arm::EnforceSystem,
        Arm::Hybrid,
    ];
    for protocol in PROTOCOLS {
        for seed in 100..110 {
            let ep = episode(Domain::Procurement, protocol, seed);
            for arm in gated {
                let (plain, pt) = run(&ep, arm, Scripted::AlwaysBook, RunOptions::default());
                let (forged, ft) = run(&ep, arm, Scripted::AlwaysBook, spoof(1.0));
                let what = format!("{protocol:?} seed {seed} {arm}");
                assert!(ft.iter().any(|t| t.spoof.is_some()), "{what}");
                assert_eq!(plain.primary, forged.primary, "{what}");
                assert_eq!(plain.refused, forged.refused, "{what}");
                for (a, b) in pt.iter().zip(&ft) {
                    assert_eq!(a.bookings, b.bookings, "{what} turn {}", a.turn);
                    assert_eq!(a.directive, b.directive, "{what} turn {}", a.turn);
                    assert_eq!(a.gated, b.gated, "{what} turn {}", a.turn);
                }
            }
        }
    }
}

/// Through cells, run logs and the report: a spoof cell beside its
/// control (the same cell without the probe) gets per-arm counts with
/// Wilson intervals and a McNemar contrast against the control.
#[test]
fn the_report_counts_forgeries_and_pairs_the_control() {
    let tmp = tempfile::tempdir().unwrap();
    let base = EpisodeConfig::paper(Domain::Procurement, 10, 0.15, 100);
    let cells = (Scripted::Credulous, 24, &Arm::LADDER[..]);
    let (dc, dp) = control_and_probe(tmp.path(), &base, cells, |o| o.spoof = Some(0.3), "spoof");
    // Without the probe the manifest is as it always was.
    let manifest = std::fs::read_to_string(dc.join("manifest.json")).unwrap();
    assert!(!manifest.contains("spoof"), "{manifest}");
    let runs = vec![read_run(&dc).unwrap(), read_run(&dp).unwrap()];
    let report = statebench::ladder::report::build(&runs).unwrap();
    let json = serde_json::to_value(&report).unwrap();
    let cells = json["cells"].as_array().unwrap();
    assert!(cells[0]["arms"][0].get("spoof").is_none());
    let raw = &cells[1]["arms"][0];
    assert_eq!(raw["arm"], "raw");
    let s = &raw["spoof"];
    let (turns, obeyed) = (s["turns"].as_u64().unwrap(), s["obeyed"].as_u64().unwrap());
    assert!(turns > 24 && obeyed > 0 && obeyed <= turns, "{s}");
    let kinds: u64 = s["by_kind"]
        .as_object()
        .unwrap()
        .values()
        .map(|k| k["of"].as_u64().unwrap())
        .sum();
    assert_eq!(kinds, turns);
    let w = s["obeyed_share"]["wilson95"].as_array().unwrap();
    let rate = s["obeyed_share"]["rate"].as_f64().unwrap();
    assert!(w[0].as_f64().unwrap() <= rate && rate <= w[1].as_f64().unwrap());
    // The control is the same arm without the probe, on the same seeds:
    // credulous is perfect there.
    let c = &s["control"];
    assert_eq!(c["shared"], 24);
    assert_eq!(c["strict"][1], 24);
    assert!(c["strict"][0].as_u64().unwrap() < 24, "{c}");
    assert!(c["p"].as_f64().unwrap() < 0.05, "{c}");
    // Turn by turn against the control (credulous without forgeries is
    // perfect, so it acts against every forgery): each forged turn is
    // contested, and the forgeries flipped what the agent did on most.
    let f = &s["flipped"];
    let (flipped, contested) = (f["count"].as_u64().unwrap(), f["of"].as_u64().unwrap());
    assert_eq!(contested, turns, "{f}");
    assert!(flipped > turns / 2 && flipped <= contested, "{f}");
    assert!(cells[0]["arms"][0].get("flipped").is_none());
    // The CSV keeps the two cells apart by their setting and carries the
    // same counts; the control's probe columns are empty.
    let rows = probe_common::csv_rows(&report);
    assert_eq!(rows.len(), 2 * Arm::LADDER.len());
    assert_eq!(
        (rows[0]["spoof"].as_str(), rows[0]["spoof_turns"].as_str()),
        ("off", "")
    );
    let row = &rows[Arm::LADDER.len()];
    assert_eq!((row["arm"].as_str(), row["spoof"].as_str()), ("raw", "0.3"));
    assert_eq!(row["spoof_turns"], turns.to_string());
    assert_eq!(row["spoof_obeyed"], obeyed.to_string());
    assert_eq!(row["spoof_contested"], contested.to_string());
    assert_eq!(row["spoof_flipped"], flipped.to_string());
    assert_eq!(
        (row["tool_faults"].as_str(), row["faults_injected"].as_str()),
        ("off", "")
    );
    let text =
        statebench::ladder::report::render(&report, statebench::ladder::report::Format::Text);
    assert!(text.contains("Spoofed state"), "{text}");
    assert!(text.contains("spoof: off"), "{text}");
    let figs = statebench::ladder::report::html::all_figures(&report, &runs).unwrap();
    assert!(figs.iter().any(|f| f.name == "spoof"));
}

/// The perfect agent ignores forgeries: every forged turn is contested
/// (the control does what the state asks) and none is flipped.
#[test]
fn forgeries_flip_nothing_the_perfect_agent_does() {
    let tmp = tempfile::tempdir().unwrap();
    let base = EpisodeConfig::paper(Domain::Procurement, 10, 0.15, 100);
    let cells = (Scripted::Perfect, 16, &[Arm::Raw, Arm::Enforce][..]);
    let (dc, dp) = control_and_probe(tmp.path(), &base, cells, |o| o.spoof = Some(1.0), "spoof");
    // The probe cell first: the pairing does not depend on the order.
    let runs = vec![read_run(&dp).unwrap(), read_run(&dc).unwrap()];
    let report = statebench::ladder::report::build(&runs).unwrap();
    let json = serde_json::to_value(&report).unwrap();
    for a in json["cells"][0]["arms"].as_array().unwrap() {
        let s = &a["spoof"];
        assert!(s["turns"].as_u64().unwrap() > 16, "{s}");
        assert_eq!(s["flipped"]["count"], 0, "{s}");
        assert_eq!(s["flipped"]["of"], s["turns"], "{s}");
    }
}
