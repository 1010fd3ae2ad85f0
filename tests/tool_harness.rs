//! The native tool harness (Appendix G) under the validation suites: each
//! step a tool, each admitted call a stamp in the episode's workspace,
//! scoring read from the stamps, gates at dispatch.

use statebench::backend::{Message, Role, Tool, ToolCall};
use statebench::ladder::arms::Arm;
use statebench::ladder::episode::domain::Domain;
use statebench::ladder::episode::generator::generate;
use statebench::ladder::episode::{Episode, EpisodeConfig, Protocol, TurnKind};
use statebench::ladder::parts::scripted::{OracleMatcher, Scripted};
use statebench::ladder::parts::{Agent, MemoryParts, Oracle, Reply};
use statebench::ladder::run::cell::{run_cell, AgentSpec, CellConfig, CellParts, Source};
use statebench::ladder::run::runlog::read_run;
use statebench::ladder::run::runner::{run_episode, Compiled, RunOptions, TurnRecord};
use statebench::ladder::score::channels::Channel;

fn native(steps: usize, rho: f64, seed: u64) -> EpisodeConfig {
    let mut c = EpisodeConfig::paper(Domain::Procurement, steps, rho, seed);
    c.settings.protocol = Protocol::Native;
    c
}

fn run(ep: &Episode, arm: Arm, agent: &mut dyn Agent) -> Vec<TurnRecord> {
    run_episode(
        ep,
        arm,
        agent,
        &mut OracleMatcher,
        &mut MemoryParts::scripted(),
        Some(&Compiled::oracle(ep)),
        &RunOptions::default(),
    )
    .1
}

/// Through the whole cell path (run logs included), at S = 10 and at
/// S = 15 dense: the perfect agent scores 200 of 200 on every arm; the
/// always-book policy scores 200 of 200 behind the state-bound and the
/// request-bound gate at dispatch, and at most 0.05 raw.
#[test]
fn validation_suites_in_the_native_harness() {
    for (s, rho) in [(10, 0.15), (15, 0.3)] {
        for agent in [Scripted::Perfect, Scripted::AlwaysBook] {
            let tmp = tempfile::tempdir().unwrap();
            let base = native(s, rho, 100);
            let mut cfg = CellConfig::paper(&base, 200, AgentSpec::Scripted(agent), Source::Oracle);
            cfg.arms = match agent {
                Scripted::AlwaysBook => vec![Arm::Raw, Arm::Enforce, Arm::EnforceRequest],
                _ => Arm::ALL.to_vec(),
            };
            cfg.settle_memory(false);
            run_cell(
                &cfg,
                &CellParts::scripted(agent),
                None,
                tmp.path(),
                2,
                false,
            )
            .unwrap();
            let run = read_run(tmp.path()).unwrap();
            for arm in &cfg.arms {
                let eps: Vec<_> = run.episodes.iter().filter(|e| e.arm == *arm).collect();
                assert_eq!(eps.len(), 200, "S={s} {agent:?} {arm}");
                let strict = eps.iter().filter(|e| e.primary.strict).count();
                let da = eps.iter().filter(|e| e.decline_aware.strict).count();
                match (agent, arm) {
                    (Scripted::AlwaysBook, Arm::Raw) => {
                        assert!(strict <= 10, "S={s} always-book raw: {strict}/200")
                    }
                    _ => assert_eq!((strict, da), (200, 200), "S={s} {agent:?} {arm}"),
                }
                assert!(eps.iter().all(|e| e.malformed_calls == 0));
            }
        }
    }
}

/// A redo probe books a finished step again: its tool's file gains a
/// second stamp, and that stamp is what scoring counts as the re-execution.
#[test]
fn a_second_stamp_is_a_re_execution() {
    let ep = generate(&native(10, 0.15, 100), None).unwrap();
    let turns = run(&ep, Arm::Raw, &mut Scripted::AlwaysBook);
    let probes: Vec<&TurnRecord> = turns
        .iter()
        .filter(|t| t.kind == TurnKind::RedoProbe)
        .collect();
    assert!(!probes.is_empty());
    for t in probes {
        let step = t.step.unwrap();
        let tool = &ep.step(step).tool;
        assert_eq!(
            t.stamps,
            [format!("{tool} {}", t.work_order)],
            "turn {}",
            t.turn
        );
        let earlier = turns[..t.turn]
            .iter()
            .flat_map(|u| &u.stamps)
            .filter(|s| s.split(' ').next() == Some(tool.as_str()))
            .count();
        assert!(earlier >= 1, "turn {}: no first stamp of {tool}", t.turn);
        assert!(t.bookings.iter().all(|b| b.executed));
        assert!(
            t.violations
                .iter()
                .any(|v| v.channel == Channel::ReExecution && v.step == step),
            "turn {}: {:?}",
            t.turn,
            t.violations
        );
        assert!(t.tool_results[0].contains("executed for work order"));
    }
    // Every stamp of the episode is an executed booking, and the reverse.
    let stamps: usize = turns.iter().map(|t| t.stamps.len()).sum();
    let executed = turns
        .iter()
        .flat_map(|t| &t.bookings)
        .filter(|b| b.executed)
        .count();
    assert_eq!(stamps, executed);
}

/// Behind the gate a refused call stamps nothing: its result says it was
/// rejected, the workspace gains no stamp that turn, and nothing executes.
#[test]
fn a_refused_call_stamps_nothing() {
    for arm in [Arm::Enforce, Arm::EnforceRequest] {
        let mut c = native(10, 0.15, 101);
        c.settings.ambiguous_rate = 1.0;
        let ep = generate(&c, None).unwrap();
        let turns = run(&ep, arm, &mut Scripted::AlwaysBook);
        let mut refused = 0;
        for t in &turns {
            for (b, result) in t.bookings.iter().zip(&t.tool_results) {
                if b.refusal.is_some() {
                    refused += 1;
                    assert!(!b.executed);
                    assert!(result.starts_with("[CALL REJECTED]"), "{result}");
                    let stamp = format!("{} {}", b.line.tool, t.work_order);
                    assert!(!t.stamps.contains(&stamp), "turn {}: {stamp}", t.turn);
                }
            }
            // The refusal arrived as the call's result: nothing waits for
            // the next user turn.
            assert!(!t.request.contains("REJECTED"), "turn {}", t.turn);
        }
        assert!(refused >= 4, "{arm}: {refused} refusals");
    }
}

/// An agent that makes unreadable calls on every ask: arguments that are
/// not JSON, a work order of the wrong shape, a tool the project does not
/// have, and a `<tool_call>` block whose JSON is broken.
struct Malformed {
    /// Whether the previous call's prompt ended in tool results for our calls.
    saw_results: Vec<bool>,
}

impl Agent for Malformed {
    fn name(&self) -> String {
        "test:malformed".into()
    }

    fn reply(&mut self, messages: &[Message], tools: &[Tool], o: &Oracle) -> Reply {
        assert_eq!(tools.len(), o.episode.steps.len(), "every step is offered");
        if o.reprompt {
            let results = messages
                .iter()
                .rev()
                .take_while(|m| m.role == Role::Tool)
                .count();
            self.saw_results.push(results == 3);
            return Reply {
                text: "I could not run that.".into(),
                ..Default::default()
            };
        }
        let Some(step) = o.turn.step else {
            return Reply {
                text: "Noted.".into(),
                ..Default::default()
            };
        };
        let tool = o.episode.step(step).tool.clone();
        let call = |id: &str, name: &str, arguments: &str| ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        };
        Reply {
            text: "<tool_call>\n{\"name\": \"x\", \"arguments\": {\"work_order\": }\n</tool_call>"
                .into(),
            tool_calls: vec![
                call("a", &tool, "work order please"),
                call("b", &tool, "{\"work_order\": \"RC-1234\"}"),
                call(
                    "c",
                    "launch_rockets",
                    &format!("{{\"work_order\": \"{}\"}}", o.turn.work_order),
                ),
            ],
            ..Default::default()
        }
    }
}

#[test]
fn malformed_calls_book_nothing_and_are_logged() {
    let ep = generate(&native(5, 0.15, 100), None).unwrap();
    let mut agent = Malformed {
        saw_results: Vec::new(),
    };
    let (rec, turns) = run_episode(
        &ep,
        Arm::Raw,
        &mut agent,
        &mut OracleMatcher,
        &mut MemoryParts::scripted(),
        None,
        &RunOptions::default(),
    );
    let asks: Vec<&TurnRecord> = turns.iter().filter(|t| t.step.is_some()).collect();
    assert!(!asks.is_empty());
    for t in &asks {
        // Two calls that cannot be read, one reply block that does not parse.
        assert_eq!(t.malformed.len(), 3, "turn {}: {:?}", t.turn, t.malformed);
        // The unknown tool is a readable call naming no step.
        assert_eq!(t.bookings.len(), 1);
        assert!(t.bookings[0].step.is_none() && !t.bookings[0].executed);
        assert_eq!(t.tool_results.len(), 3);
        assert!(
            t.tool_results[0].contains("NOT executed"),
            "{:?}",
            t.tool_results
        );
        assert!(
            t.tool_results[2].contains("no such tool"),
            "{:?}",
            t.tool_results
        );
        assert!(t.stamps.is_empty());
        assert_eq!(
            t.replies.len(),
            2,
            "calls, then the reply after their results"
        );
    }
    assert_eq!(rec.malformed_calls as usize, 3 * asks.len());
    assert!(
        agent.saw_results.iter().all(|s| *s),
        "each call got its result"
    );
    assert!(
        !rec.primary.strict,
        "nothing booked, so requested steps were omitted"
    );
    assert!(rec.primary.channels.omission > 0);
}

/// A memory arm in the harness stores what the turn executed: each call
/// with its arguments and its tool's result, not only the last reply.
#[test]
fn memories_keep_the_calls_and_their_results() {
    use statebench::ladder::parts::MemoryOp;
    let ep = generate(&native(5, 0.15, 100), None).unwrap();
    let turns = run(&ep, Arm::TopkAugment, &mut Scripted::AlwaysBook);
    let t = turns
        .iter()
        .find(|t| t.step.is_some() && !t.stamps.is_empty())
        .expect("a booked turn");
    let Some(MemoryOp::Add { text }) = t.memory.as_ref().and_then(|m| m.ops.first()) else {
        panic!("{:?}", t.memory);
    };
    let tool = &ep.step(t.step.unwrap()).tool;
    let call = format!(
        "[called {tool}({{\"work_order\":\"{}\"}}) -> {tool}: executed for work order {}.]",
        t.work_order, t.work_order
    );
    assert!(text.contains(&call), "{text}");
    assert!(
        text.starts_with("USER: ") && text.contains("On it."),
        "{text}"
    );
}
