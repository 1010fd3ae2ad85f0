//! The escalation probe's validation suites: the perfect agent is strict on
//! every arm and never needs to ask; always-book behind the gates asks,
//! the scripted user grants and declines, and the gate admits a finished
//! step only with an authorization on record (no wrongful admission, and a
//! counter that would see one); the report counts and pairs it.

mod probe_common;

use probe_common::{control_and_probe, episode, run};
use statebench::ladder::arms::Arm;
use statebench::ladder::episode::domain::Domain;
use statebench::ladder::episode::{EpisodeConfig, Protocol};
use statebench::ladder::parts::scripted::Scripted;
use statebench::ladder::run::runlog::read_run;
use statebench::ladder::run::runner::{escalation_counts, RunOptions};

fn escalation() -> RunOptions {
    RunOptions {
        escalation: true,
        ..RunOptions::default()
    }
}

const PROTOCOLS: [Protocol; 3] = [Protocol::Text, Protocol::Tool, Protocol::Native];
const GATED: [Arm; 5] = [
    Arm::Enforce,
    Arm::EnforceSystem,
    Arm::EnforceRequest,
    Arm::EnforceSameTurn,
    Arm::Hybrid,
];

#[test]
fn the_perfect_agent_is_strict_on_every_arm_and_never_asks() {
    for domain in Domain::ALL {
        for protocol in PROTOCOLS {
            for seed in 100..105 {
                let ep = episode(domain, protocol, seed);
                for arm in Arm::ALL {
                    let (r, _) = run(&ep, arm, Scripted::Perfect, escalation());
                    let what = format!("{domain} {protocol:?} seed {seed} {arm}");
                    assert!(r.primary.strict && r.decline_aware.strict, "{what}");
                    match r.escalations {
                        Some(e) => {
                            assert!(arm.spec().policy().is_some(), "{what}");
                            assert_eq!((e.asked, e.wrongful), (0, 0), "{what}");
                        }
                        None => assert!(arm.spec().policy().is_none(), "{what}"),
                    }
                }
            }
        }
    }
}

#[test]
fn always_book_behind_the_gate_asks_and_no_admission_is_wrongful() {
    for protocol in PROTOCOLS {
        for arm in GATED {
            let (mut asked, mut granted, mut declined, mut readmitted) = (0, 0, 0, 0);
            for seed in 100..120 {
                let ep = episode(Domain::Procurement, protocol, seed);
                let (r, turns) = run(&ep, arm, Scripted::AlwaysBook, escalation());
                let what = format!("{protocol:?} seed {seed} {arm}");
                let e = r.escalations.unwrap();
                assert_eq!(e.wrongful, 0, "{what}");
                assert_eq!(e.asked, e.granted + e.declined, "{what}");
                // Every re-execution the gate admitted was authorized: the
                // ground truth, which holds the grants in α, sees none.
                assert_eq!(r.primary.channels.re_execution, 0, "{what}");
                assert!(r.primary.strict, "{what}: {:?}", r.primary.channels);
                for t in &turns {
                    let grant = t.escalation.as_ref().filter(|e| e.granted);
                    for b in t.bookings.iter().filter(|b| b.redo && b.executed) {
                        let by_matcher = t
                            .matched
                            .as_ref()
                            .is_some_and(|m| m.explicit_redo && m.step == b.step);
                        let by_user = grant.is_some_and(|g| Some(g.step) == b.step);
                        assert!(by_matcher || by_user, "{what} turn {}", t.turn);
                        readmitted += u32::from(by_user);
                    }
                    if let Some(e) = &t.escalation {
                        // The user's answer reached the agent.
                        assert!(t.replies.len() >= 3, "{what} turn {}", t.turn);
                        assert!(!e.answer.is_empty());
                    }
                }
                asked += e.asked;
                granted += e.granted;
                declined += e.declined;
            }
            let what = format!("{protocol:?} {arm}");
            assert!(
                granted > 5 && declined > 5,
                "{what}: {asked} {granted} {declined}"
            );
            assert_eq!(readmitted, granted, "{what}: each grant was booked once");
        }
    }
}

/// The counter sees an admission whose authorization is not on record:
/// take a granted escalation away from a recorded turn and count again.
#[test]
fn a_wrongful_admission_would_be_counted() {
    let ep = episode(Domain::Release, Protocol::Text, 101);
    let (r, mut turns) = run(&ep, Arm::Enforce, Scripted::AlwaysBook, escalation());
    assert!(r.escalations.unwrap().granted > 0);
    assert_eq!(escalation_counts(&turns).wrongful, 0);
    let t = turns
        .iter_mut()
        .find(|t| t.escalation.as_ref().is_some_and(|e| e.granted))
        .unwrap();
    t.escalation.as_mut().unwrap().granted = false;
    assert_eq!(escalation_counts(&turns).wrongful, 1);
}

#[test]
fn ungated_arms_have_no_escalation_path() {
    let ep = episode(Domain::Procurement, Protocol::Text, 100);
    for arm in [Arm::Raw, Arm::Checklist, Arm::Directive] {
        let (plain, pt) = run(&ep, arm, Scripted::AlwaysBook, RunOptions::default());
        let (with, wt) = run(&ep, arm, Scripted::AlwaysBook, escalation());
        assert!(with.escalations.is_none());
        assert_eq!(plain.primary, with.primary, "{arm}");
        for (a, b) in pt.iter().zip(&wt) {
            assert_eq!((&a.request, &a.replies), (&b.request, &b.replies), "{arm}");
            assert_eq!(a.bookings, b.bookings, "{arm}");
        }
    }
}

#[test]
fn the_report_counts_escalations_and_pairs_the_control() {
    let tmp = tempfile::tempdir().unwrap();
    let base = EpisodeConfig::paper(Domain::Procurement, 10, 0.15, 100);
    let cells = (Scripted::AlwaysBook, 20, &[Arm::Raw, Arm::Enforce][..]);
    let set = |o: &mut RunOptions| o.escalation = true;
    let (dc, dp) = control_and_probe(tmp.path(), &base, cells, set, "escalation");
    let manifest = std::fs::read_to_string(dc.join("manifest.json")).unwrap();
    assert!(!manifest.contains("escalation"), "{manifest}");
    let runs = vec![read_run(&dc).unwrap(), read_run(&dp).unwrap()];
    let report = statebench::ladder::report::build(&runs).unwrap();
    let json = serde_json::to_value(&report).unwrap();
    let arms = &json["cells"][1]["arms"];
    assert!(arms[0].get("escalations").is_none(), "raw has no gate");
    let e = &arms[1]["escalations"];
    let asked = e["asked"].as_u64().unwrap();
    assert!(asked > 20, "{e}");
    assert_eq!(
        e["granted"].as_u64().unwrap() + e["declined"].as_u64().unwrap(),
        asked
    );
    assert_eq!(e["wrongful"], 0);
    assert_eq!(e["asked_share"]["count"], asked);
    let c = &e["control"];
    assert_eq!(
        (c["shared"].as_u64(), c["strict"].clone()),
        (Some(20), serde_json::json!([20, 20]))
    );
    let rows = probe_common::csv_rows(&report);
    assert_eq!(rows.len(), 4);
    assert_eq!(rows[1]["escalation"], "off");
    let (raw, enforce) = (&rows[2], &rows[3]);
    assert_eq!(
        (raw["escalation"].as_str(), raw["escalation_asked"].as_str()),
        ("on", "")
    );
    assert_eq!(enforce["arm"], "enforce");
    let col = |k: &str| enforce[k].parse::<u64>().unwrap();
    assert_eq!(col("escalation_asked"), asked);
    assert_eq!(
        col("escalation_refusals"),
        e["asked_share"]["of"].as_u64().unwrap()
    );
    assert_eq!(
        col("escalation_granted") + col("escalation_declined"),
        asked
    );
    assert_eq!(col("escalation_wrongful"), 0);
    let text =
        statebench::ladder::report::render(&report, statebench::ladder::report::Format::Text);
    assert!(text.contains("Escalation (refusals"), "{text}");
    assert!(text.contains("escalation: off"), "{text}");
    let figs = statebench::ladder::report::html::all_figures(&report, &runs).unwrap();
    assert!(figs.iter().any(|f| f.name == "escalation"));
}
