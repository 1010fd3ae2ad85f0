//! The paper's validation suites (Appendix A.1) as tests: the scripted perfect
//! agent scores every episode on every arm; behind a corrupted module it
//! fails; a memoryless always-book policy scores 1.00 behind state-bound
//! enforcement with the generator's graph and fails on the raw rung.

use statebench::ladder::arms::gate::Refusal;
use statebench::ladder::arms::Arm;
use statebench::ladder::episode::domain::Domain;
use statebench::ladder::episode::generator::generate;
use statebench::ladder::episode::{Episode, EpisodeConfig, Protocol};
use statebench::ladder::parts::scripted::OracleMatcher;
use statebench::ladder::parts::scripted::Scripted;
use statebench::ladder::parts::MemoryParts;
use statebench::ladder::run::runner::{run_episode, Compiled, EpisodeRecord, RunOptions};

fn compiled(ep: &Episode) -> Compiled {
    Compiled::oracle(ep)
}

fn run(ep: &Episode, arm: Arm, agent: Scripted, opts: RunOptions) -> EpisodeRecord {
    let mut agent = agent;
    run_episode(
        ep,
        arm,
        &mut agent,
        &mut OracleMatcher,
        &mut MemoryParts::scripted(),
        Some(&compiled(ep)),
        &opts,
    )
    .0
}

#[test]
fn perfect_agent_scores_every_episode_on_every_arm() {
    let grid = [(5, 0.15), (10, 0.15), (15, 0.15), (18, 0.15), (15, 0.3)];
    for domain in Domain::ALL {
        for (s, rho) in grid {
            for seed in 100..120 {
                for protocol in [Protocol::Text, Protocol::Tool, Protocol::Native] {
                    let mut c = EpisodeConfig::paper(domain, s, rho, seed);
                    c.settings.protocol = protocol;
                    c.settings.ambiguous_rate = 0.15;
                    let ep = generate(&c, None).unwrap();
                    for arm in Arm::ALL {
                        let r = run(&ep, arm, Scripted::Perfect, RunOptions::default());
                        assert!(
                            r.primary.strict && r.decline_aware.strict,
                            "{domain} S={s} rho={rho} seed={seed} {protocol:?} {arm}: {:?}",
                            r.primary.channels
                        );
                        assert_eq!(r.primary.turns_correct, 44);
                        assert_eq!(r.refused, 0);
                    }
                }
            }
        }
    }
}

#[test]
fn perfect_agent_behind_a_corrupted_module_fails() {
    let mut ok = 0;
    for seed in 100..115 {
        let ep = generate(
            &EpisodeConfig::paper(Domain::Procurement, 15, 0.3, seed),
            None,
        )
        .unwrap();
        let opts = RunOptions {
            corrupt: Some(0.05),
            ..Default::default()
        };
        let r = run(&ep, Arm::Enforce, Scripted::Perfect, opts);
        assert!(!r.corruptions.is_empty());
        ok += u32::from(r.primary.strict);
    }
    assert_eq!(
        ok, 0,
        "perfect agent behind a corrupted gate: {ok}/15 strict"
    );
}

#[test]
fn corruption_rate_zero_is_harmless() {
    let ep = generate(
        &EpisodeConfig::paper(Domain::Procurement, 15, 0.3, 100),
        None,
    )
    .unwrap();
    let opts = RunOptions {
        corrupt: Some(0.0),
        ..Default::default()
    };
    assert!(
        run(&ep, Arm::Enforce, Scripted::Perfect, opts)
            .primary
            .strict
    );
}

#[test]
fn always_book_is_perfect_behind_the_gate_and_fails_raw() {
    let n = 200;
    let (mut gate, mut system, mut raw) = (0, 0, 0);
    for seed in 100..100 + n {
        let ep = generate(
            &EpisodeConfig::paper(Domain::Procurement, 10, 0.15, seed),
            None,
        )
        .unwrap();
        let strict = |arm| {
            run(&ep, arm, Scripted::AlwaysBook, RunOptions::default())
                .primary
                .strict
        };
        gate += u32::from(strict(Arm::Enforce));
        // The system-role control: directives in the system prompt, rejection
        // notices still in the user turn, the same gate.
        system += u32::from(strict(Arm::EnforceSystem));
        raw += u32::from(
            run(&ep, Arm::Raw, Scripted::AlwaysBook, RunOptions::default())
                .primary
                .strict,
        );
    }
    assert_eq!(gate, n as u32, "always-book behind state-bound enforcement");
    assert_eq!(system, n as u32, "always-book behind enforce-system");
    assert!(
        f64::from(raw) / n as f64 <= 0.05,
        "always-book raw: {raw}/{n}"
    );
}

#[test]
fn gate_admits_unrequested_bookings_on_ambiguous_probes_but_request_bound_refuses_them() {
    let mut c = EpisodeConfig::paper(Domain::Procurement, 10, 0.15, 100);
    c.settings.ambiguous_rate = 1.0;
    let ep = generate(&c, None).unwrap();
    let state = run(
        &ep,
        Arm::Enforce,
        Scripted::AlwaysBook,
        RunOptions::default(),
    );
    assert!(state.primary.channels.unrequested > 0);
    let (request, turns) = run_episode(
        &ep,
        Arm::EnforceRequest,
        &mut Scripted::AlwaysBook,
        &mut OracleMatcher,
        &mut MemoryParts::scripted(),
        Some(&compiled(&ep)),
        &RunOptions::default(),
    );
    assert_eq!(request.primary.channels.unrequested, 0);
    let not_requested = turns
        .iter()
        .flat_map(|t| &t.bookings)
        .filter(|b| matches!(b.refusal, Some(Refusal::NotRequested { .. })))
        .count();
    assert!(not_requested > 0);
}

#[test]
fn refused_bookings_are_logged_and_silent_ones_counted() {
    let ep = generate(&EpisodeConfig::paper(Domain::Release, 10, 0.15, 100), None).unwrap();
    let next = run(
        &ep,
        Arm::Enforce,
        Scripted::AlwaysBook,
        RunOptions::default(),
    );
    assert!(
        next.refused >= 4,
        "redo probes, premature asks, cue: {}",
        next.refused
    );
    // "On it. ref …" carries no refusal language: every refusal is silent.
    assert_eq!(next.silent_refusals, next.refused);
    // Same-turn notice: the visible reply is the re-prompted acknowledgement.
    let same = run(
        &ep,
        Arm::EnforceSameTurn,
        Scripted::AlwaysBook,
        RunOptions::default(),
    );
    assert_eq!(same.refused, next.refused);
    assert_eq!(same.silent_refusals, 0);
    assert_eq!(same.agent_calls, 44 + same.refused);
}

/// The suite on the retrieval-memory arms and the replaced self-ledger,
/// through the whole cell path (lexical embedder, oracle memory writer,
/// run logs): 200 of 200 at S = 10 and at S = 15 dense, under both scorings.
#[test]
fn perfect_agent_scores_200_of_200_on_the_memory_and_ledger_arms() {
    use statebench::ladder::run::cell::{run_cell, AgentSpec, CellConfig, CellParts, Source};
    use statebench::ladder::run::runlog::read_run;
    let arms = [
        Arm::LedgerReplace,
        Arm::TopkReplace,
        Arm::TopkAugment,
        Arm::Mem0Replace,
        Arm::Mem0Augment,
    ];
    for (s, rho) in [(10, 0.15), (15, 0.3)] {
        let tmp = tempfile::tempdir().unwrap();
        let base = EpisodeConfig::paper(Domain::Procurement, s, rho, 100);
        let mut cfg = CellConfig::paper(
            &base,
            200,
            AgentSpec::Scripted(Scripted::Perfect),
            Source::Oracle,
        );
        cfg.arms = arms.to_vec();
        cfg.settle_memory(false);
        let parts = CellParts::scripted(Scripted::Perfect);
        run_cell(&cfg, &parts, None, tmp.path(), 2, false).unwrap();
        let run = read_run(tmp.path()).unwrap();
        for arm in arms {
            let eps: Vec<_> = run.episodes.iter().filter(|e| e.arm == arm).collect();
            assert_eq!(eps.len(), 200, "S={s} {arm}");
            let strict = eps.iter().filter(|e| e.primary.strict).count();
            let da = eps.iter().filter(|e| e.decline_aware.strict).count();
            assert_eq!((strict, da), (200, 200), "S={s} rho={rho} {arm}");
            for e in &eps {
                match arm {
                    Arm::LedgerReplace => assert!(e.memory.is_none()),
                    Arm::TopkReplace | Arm::TopkAugment => {
                        let m = e.memory.unwrap();
                        assert_eq!((m.embed_calls, m.items), (2 * e.turns, e.turns));
                    }
                    _ => {
                        // One fact per step the episode finished or cancelled.
                        let m = e.memory.unwrap();
                        assert!(m.items as usize >= s / 2, "{m:?}");
                        assert_eq!((m.writer_calls, m.ops_rejected), (0, 0));
                    }
                }
            }
        }
    }
}
