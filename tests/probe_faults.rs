//! The tool-faults probe's validation suites: the perfect agent reads a
//! failed call's result and retries, so it is strict on every arm; a
//! failed call makes no step done in any arm's state; an agent that does
//! not retry leaves the due step unrecovered; the report counts and pairs
//! it; the text protocol, which calls no tool, refuses the probe.

mod probe_common;

use probe_common::{control_and_probe, episode, run};
use statebench::ladder::arms::gate::DirectiveKind;
use statebench::ladder::arms::Arm;
use statebench::ladder::episode::domain::Domain;
use statebench::ladder::episode::{EpisodeConfig, Protocol};
use statebench::ladder::parts::scripted::Scripted;
use statebench::ladder::run::cell::{run_cell, AgentSpec, CellConfig, CellParts, Source};
use statebench::ladder::run::runlog::read_run;
use statebench::ladder::run::runner::RunOptions;

fn faults(rate: f64) -> RunOptions {
    RunOptions {
        tool_faults: Some(rate),
        ..RunOptions::default()
    }
}

const TOOLS: [Protocol; 2] = [Protocol::Tool, Protocol::Native];

#[test]
fn the_perfect_agent_retries_and_is_strict_on_every_arm() {
    for domain in Domain::ALL {
        for protocol in TOOLS {
            for seed in 100..104 {
                let ep = episode(domain, protocol, seed);
                for arm in Arm::ALL {
                    for rate in [0.3, 1.0] {
                        let (r, turns) = run(&ep, arm, Scripted::Perfect, faults(rate));
                        let what = format!("{domain} {protocol:?} seed {seed} {arm} rate {rate}");
                        assert!(r.primary.strict, "{what}: {:?}", r.primary.channels);
                        let f = r.faults.expect("a faults cell counts its faults");
                        assert!(f.injected > 0, "{what}");
                        assert_eq!((f.unrecovered, f.re_executions), (0, 0), "{what}");
                        assert_eq!(
                            f.due, f.injected,
                            "{what}: the perfect agent calls only due steps"
                        );
                        // The failure reached the agent, which called again.
                        let faulted = turns
                            .iter()
                            .flat_map(|t| &t.bookings)
                            .filter(|b| b.fault.is_some())
                            .count();
                        assert_eq!(faulted as u32, f.injected, "{what}");
                        if rate == 1.0 {
                            let retried = turns.iter().filter(|t| t.bookings.len() == 2);
                            assert_eq!(retried.count() as u32, f.injected, "{what}");
                        }
                    }
                }
            }
        }
    }
}

/// Always-book does not retry; at rate 1 every call it makes fails, so no
/// step is ever done: not in the realized state, not in the checklist,
/// not in the gate module, not in the workspace.
#[test]
fn a_failed_call_makes_no_step_done_in_any_state() {
    for protocol in TOOLS {
        for seed in 100..106 {
            let ep = episode(Domain::Procurement, protocol, seed);
            for arm in Arm::ALL {
                let (r, turns) = run(&ep, arm, Scripted::AlwaysBook, faults(1.0));
                let what = format!("{protocol:?} seed {seed} {arm}");
                let f = r.faults.unwrap();
                assert!(f.injected > 0 && f.unrecovered > 0, "{what}: {f:?}");
                for t in &turns {
                    for b in &t.bookings {
                        assert!(!b.executed, "{what} turn {}", t.turn);
                        assert!(b.fault.is_some() || b.refusal.is_some() || !b.current);
                    }
                    assert!(
                        t.stamps.is_empty(),
                        "{what} turn {}: {:?}",
                        t.turn,
                        t.stamps
                    );
                    assert!(!t.request.contains(": DONE"), "{what} turn {}", t.turn);
                    if let Some(d) = &t.directive {
                        assert_ne!(d.kind, DirectiveKind::Done, "{what} turn {}", t.turn);
                    }
                }
                // Nothing done: the only violations are the steps left undone.
                let ch = r.primary.channels;
                assert_eq!(
                    ch.re_execution + ch.superseded + ch.unrequested,
                    0,
                    "{what}: {ch:?}"
                );
                assert_eq!(ch.omission, f.unrecovered, "{what}: {ch:?} {f:?}");
            }
        }
    }
}

#[test]
fn an_agent_that_does_not_retry_leaves_due_steps_unrecovered() {
    let (mut due, mut unrecovered) = (0, 0);
    for seed in 100..120 {
        let ep = episode(Domain::Release, Protocol::Native, seed);
        let (plain, _) = run(
            &ep,
            Arm::Enforce,
            Scripted::AlwaysBook,
            RunOptions::default(),
        );
        assert!(plain.primary.strict);
        let (r, _) = run(&ep, Arm::Enforce, Scripted::AlwaysBook, faults(0.3));
        let f = r.faults.unwrap();
        assert_eq!(
            f.unrecovered, f.due,
            "seed {seed}: always-book never retries"
        );
        due += f.due;
        unrecovered += f.unrecovered;
        assert_eq!(r.primary.strict, f.unrecovered == 0, "seed {seed}");
    }
    assert!(unrecovered > 20, "{unrecovered} of {due}");
}

#[test]
fn the_text_protocol_refuses_the_probe() {
    let base = EpisodeConfig::paper(Domain::Procurement, 10, 0.15, 100);
    let mut cfg = CellConfig::paper(
        &base,
        2,
        AgentSpec::Scripted(Scripted::Perfect),
        Source::Oracle,
    );
    cfg.options.tool_faults = Some(0.3);
    let e = cfg.validate().unwrap_err().to_string();
    assert!(e.contains("--protocol tool or native"), "{e}");
    let tmp = tempfile::tempdir().unwrap();
    let parts = CellParts::scripted(Scripted::Perfect);
    assert!(run_cell(&cfg, &parts, None, tmp.path(), 1, false).is_err());
    assert!(!tmp.path().join("manifest.json").exists());
}

#[test]
fn the_report_counts_faults_and_pairs_the_control() {
    let tmp = tempfile::tempdir().unwrap();
    let mut base = EpisodeConfig::paper(Domain::Procurement, 10, 0.15, 100);
    base.settings.protocol = Protocol::Tool;
    let cells = (Scripted::AlwaysBook, 30, &[Arm::Raw, Arm::Enforce][..]);
    let set = |o: &mut RunOptions| o.tool_faults = Some(0.3);
    let (dc, dp) = control_and_probe(tmp.path(), &base, cells, set, "faults");
    let manifest = std::fs::read_to_string(dc.join("manifest.json")).unwrap();
    assert!(!manifest.contains("tool_faults"), "{manifest}");
    let runs = vec![read_run(&dc).unwrap(), read_run(&dp).unwrap()];
    let report = statebench::ladder::report::build(&runs).unwrap();
    let json = serde_json::to_value(&report).unwrap();
    let enforce = &json["cells"][1]["arms"][1];
    assert_eq!(enforce["arm"], "enforce");
    let f = &enforce["faults"];
    let (injected, unrecovered) = (
        f["injected"].as_u64().unwrap(),
        f["unrecovered"].as_u64().unwrap(),
    );
    assert!(
        injected > 30 && unrecovered > 0 && unrecovered <= injected,
        "{f}"
    );
    assert_eq!(f["unrecovered_share"]["count"], unrecovered);
    // Behind the gate always-book is strict without faults; with them it
    // loses every episode where a due call failed.
    let c = &f["control"];
    assert_eq!(
        (c["shared"].as_u64(), c["strict"][1].as_u64()),
        (Some(30), Some(30))
    );
    assert!(c["strict"][0].as_u64().unwrap() < 30, "{c}");
    assert!(c["p"].as_f64().unwrap() < 0.05, "{c}");
    let rows = probe_common::csv_rows(&report);
    assert_eq!(rows.len(), 4);
    assert_eq!(
        (
            rows[1]["tool_faults"].as_str(),
            rows[1]["faults_injected"].as_str()
        ),
        ("off", "")
    );
    let row = &rows[3];
    assert_eq!(
        (row["arm"].as_str(), row["tool_faults"].as_str()),
        ("enforce", "0.3")
    );
    let col = |k: &str| row[k].parse::<u64>().unwrap();
    assert_eq!(
        (col("faults_injected"), col("faults_unrecovered")),
        (injected, unrecovered)
    );
    assert_eq!(
        col("faults_due_turns"),
        f["unrecovered_share"]["of"].as_u64().unwrap()
    );
    assert_eq!(
        col("faults_re_executions"),
        f["re_executions"].as_u64().unwrap()
    );
    let text =
        statebench::ladder::report::render(&report, statebench::ladder::report::Format::Text);
    assert!(text.contains("Tools that fail"), "{text}");
    assert!(text.contains("tool_faults: off"), "{text}");
    let figs = statebench::ladder::report::html::all_figures(&report, &runs).unwrap();
    assert!(figs.iter().any(|f| f.name == "faults"));
}
