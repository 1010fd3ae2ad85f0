//! Runs one episode on one arm: scripted user → arm → agent → gate →
//! realized state, one turn at a time; then scores it under both scorings.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::agent::{Agent, Oracle, Usage};
use super::arm::{Arm, ArmState, Booking};
use super::corrupt::{Corruption, Corruptor};
use super::decline;
use super::episode::{Episode, StepId, TurnKind};
use super::module::{
    compile_accuracy, CallCost, CompileAccuracy, CompiledGraph, CompiledRevision, Compiler, Defect,
    Directive, DirectiveKind, Match, Matcher,
};
use super::scorer::{score, ChannelCounts, Label, Truth, Violation};

/// Per-cell switches that change how an arm runs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RunOptions {
    /// Filler and revision turns bypass the matcher (B.2).
    pub bypass_matcher: bool,
    /// Corrupted-state ablation rate ε (D.4), if any.
    pub corrupt: Option<f64>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            bypass_matcher: true,
            corrupt: None,
        }
    }
}

/// The compiled plan and revision of one episode, shared by the module arms of a cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Compiled {
    /// Compiled graph.
    pub graph: CompiledGraph,
    /// Compiled revision.
    pub revision: CompiledRevision,
    /// Cost of the compile calls.
    pub cost: Vec<CallCost>,
}

impl Compiled {
    /// Compiles an episode's plan and revision.
    pub fn compile(compiler: &mut dyn Compiler, ep: &Episode) -> Compiled {
        let (graph, a) = compiler.compile_graph(ep);
        let (revision, b) = compiler.compile_revision(ep);
        Compiled {
            graph,
            revision,
            cost: vec![a, b],
        }
    }

    /// The generator's own plan and revision.
    pub fn oracle(ep: &Episode) -> Compiled {
        Compiled::compile(&mut super::module::OracleCompiler, ep)
    }
}

/// One line of `turns.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnRecord {
    /// Episode seed.
    pub seed: u64,
    /// Arm.
    pub arm: Arm,
    /// Turn index.
    pub turn: usize,
    /// Turn kind.
    pub kind: TurnKind,
    /// Scripted step.
    pub step: Option<StepId>,
    /// Work order.
    pub work_order: String,
    /// The user message as the agent read it.
    pub request: String,
    /// The system-role directive of this call, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_extra: Option<String>,
    /// The matcher's resolution, when it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched: Option<Match>,
    /// The directive issued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub directive: Option<Directive>,
    /// Whether the enforcement gate was active.
    pub gated: bool,
    /// The reply, and the same-turn re-prompt's reply if any.
    pub replies: Vec<String>,
    /// Agent errors, if a call failed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    /// Bookings found, with gate verdicts.
    pub bookings: Vec<Booking>,
    /// The ground-truth label.
    pub label: Label,
    /// Violations under the primary scoring.
    pub violations: Vec<Violation>,
    /// Violations under decline-aware scoring.
    pub violations_decline_aware: Vec<Violation>,
    /// Agent accounting summed over the turn's calls.
    pub usage: Usage,
    /// Wall-clock seconds of the turn.
    pub latency_s: f64,
}

/// Issued and obeyed counts of one directive kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Obedience {
    /// Directives issued.
    pub issued: u32,
    /// Directives obeyed (no booking of the directed step on that turn).
    pub obeyed: u32,
}

/// Matcher agreement and explicit-redo confusion counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MatcherStats {
    /// Matcher calls (model calls, including correction re-asks).
    pub calls: u32,
    /// Ask and probe turns scored.
    pub scored: u32,
    /// Of those, matched step equal to the scripted step.
    pub agree: u32,
    /// Explicit-redo flag: true positives.
    pub redo_tp: u32,
    /// False positives.
    pub redo_fp: u32,
    /// False negatives.
    pub redo_fn: u32,
}

/// Decline-aware outcome of an episode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Scoring {
    /// Strict success.
    pub strict: bool,
    /// Violations per channel.
    pub channels: ChannelCounts,
    /// Turns without a violation.
    pub turns_correct: u32,
}

/// One line of `episodes.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpisodeRecord {
    /// Episode seed.
    pub seed: u64,
    /// Arm.
    pub arm: Arm,
    /// Number of turns.
    pub turns: u32,
    /// Primary scoring.
    pub primary: Scoring,
    /// Decline-aware scoring.
    pub decline_aware: Scoring,
    /// Bookings the gate refused.
    pub refused: u32,
    /// Refused bookings whose visible reply has no refusal language.
    pub silent_refusals: u32,
    /// Directive obedience per kind.
    pub directives: BTreeMap<DirectiveKind, Obedience>,
    /// Matcher statistics.
    pub matcher: MatcherStats,
    /// Agent accounting over the episode.
    pub usage: Usage,
    /// Agent calls.
    pub agent_calls: u32,
    /// Wall-clock seconds.
    pub wall_s: f64,
    /// Validator findings at the end of the episode (module arms).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub defects: Vec<Defect>,
    /// Compile accuracy against the generator (module arms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compile: Option<CompileAccuracy>,
    /// Corruptions injected (ablation only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub corruptions: Vec<Corruption>,
}

/// Runs one episode on one arm.
pub fn run_episode(
    ep: &Episode,
    arm: Arm,
    agent: &mut dyn Agent,
    matcher: &mut dyn Matcher,
    compiled: Option<&Compiled>,
    opts: &RunOptions,
) -> (EpisodeRecord, Vec<TurnRecord>) {
    let started = Instant::now();
    let corruptor = opts.corrupt.map(|e| Corruptor::new(e, ep.config.seed));
    let mut state = ArmState::new(arm, compiled.map(|c| c.graph.clone()), corruptor);
    let mut truth = Truth::new(ep);
    let mut records = Vec::with_capacity(ep.turns.len());
    let mut mstats = MatcherStats::default();
    let mut directives: BTreeMap<DirectiveKind, Obedience> = BTreeMap::new();
    let mut usage = Usage::default();
    let mut agent_calls = 0;
    let (mut refused, mut silent) = (0, 0);
    for turn in &ep.turns {
        let t0 = Instant::now();
        let label = truth.open(ep, turn);
        if turn.kind == TurnKind::Revision {
            if let Some(c) = compiled {
                state.revise(&c.revision);
            }
        }
        let matched = (arm.uses_matcher()
            && !(opts.bypass_matcher && turn.kind.bypasses_matcher()))
        .then(|| matcher.resolve(ep, turn));
        if let Some(m) = &matched {
            mstats.calls += m.cost.calls;
            if turn.step.is_some() {
                mstats.scored += 1;
                mstats.agree += u32::from(m.step == turn.step);
            }
            match (m.explicit_redo, turn.explicit_redo) {
                (true, true) => mstats.redo_tp += 1,
                (true, false) => mstats.redo_fp += 1,
                (false, true) => mstats.redo_fn += 1,
                _ => {}
            }
        }
        let prompt = state.open_turn(ep, turn, &truth.state, matched.as_ref());
        let oracle = |reprompt| Oracle {
            episode: ep,
            turn,
            truth: &truth.state,
            label: &label,
            reprompt,
        };
        let first = agent.reply(&prompt.messages, &oracle(false));
        agent_calls += 1;
        let mut turn_usage = first.usage;
        let mut errors: Vec<String> = first.error.iter().cloned().collect();
        let (mut bookings, notices) =
            state.gate(ep, turn, &prompt, matched.as_ref(), &first.text, 0);
        let mut replies = vec![first.text];
        let mut reprompt_notice = None;
        let mut next_turn = notices;
        if arm.same_turn_notice() && !next_turn.is_empty() {
            let notice = next_turn.join("\n");
            let msgs = state.reprompt(&prompt, &replies[0], &notice);
            let second = agent.reply(&msgs, &oracle(true));
            agent_calls += 1;
            turn_usage.add(&second.usage);
            errors.extend(second.error.iter().cloned());
            let (b2, n2) = state.gate(ep, turn, &prompt, matched.as_ref(), &second.text, 1);
            bookings.extend(b2);
            replies.push(second.text);
            reprompt_notice = Some(notice);
            next_turn = n2;
        }
        usage.add(&turn_usage);
        let visible = replies.last().map(String::as_str).unwrap_or("");
        let turn_refused = bookings.iter().filter(|b| b.refusal.is_some()).count() as u32;
        refused += turn_refused;
        if !decline::has_refusal_language(visible) {
            silent += turn_refused;
        }
        if let Some(d) = &prompt.directive {
            let o = directives.entry(d.kind).or_default();
            o.issued += 1;
            let booked = bookings.iter().any(|b| b.current && b.step == Some(d.step));
            o.obeyed += u32::from(!booked);
        }
        let executed: Vec<StepId> = bookings
            .iter()
            .filter(|b| b.executed)
            .filter_map(|b| b.step)
            .collect();
        truth.close(turn, &executed);
        records.push(TurnRecord {
            seed: ep.config.seed,
            arm,
            turn: turn.index,
            kind: turn.kind,
            step: turn.step,
            work_order: turn.work_order.clone(),
            request: prompt.user.clone(),
            system_extra: prompt.system_extra.clone(),
            matched,
            directive: prompt.directive.clone(),
            gated: prompt.gated,
            replies: replies.clone(),
            errors,
            bookings,
            label,
            violations: Vec::new(),
            violations_decline_aware: Vec::new(),
            usage: turn_usage,
            latency_s: t0.elapsed().as_secs_f64(),
        });
        state.close_turn(prompt, &replies, reprompt_notice, next_turn);
    }
    let (primary, decline_aware) = score_records(ep, &mut records);
    let record = EpisodeRecord {
        seed: ep.config.seed,
        arm,
        turns: ep.turns.len() as u32,
        primary,
        decline_aware,
        refused,
        silent_refusals: silent,
        directives,
        matcher: mstats,
        usage,
        agent_calls,
        wall_s: started.elapsed().as_secs_f64(),
        defects: state.defects(),
        compile: compiled
            .filter(|_| arm.uses_module())
            .map(|c| compile_accuracy(ep, &c.graph, &c.revision)),
        corruptions: state.corruptor.map(|c| c.events).unwrap_or_default(),
    };
    (record, records)
}

/// Scores turn records under both scorings, filling their violation fields.
pub fn score_records(ep: &Episode, records: &mut [TurnRecord]) -> (Scoring, Scoring) {
    let executed = |citations_excluded: bool| -> Vec<Vec<StepId>> {
        records
            .iter()
            .map(|r| {
                r.bookings
                    .iter()
                    .filter(|b| b.executed && !(citations_excluded && b.citation))
                    .filter_map(|b| b.step)
                    .collect()
            })
            .collect()
    };
    let p = score(ep, &executed(false));
    let d = score(ep, &executed(true));
    for (i, r) in records.iter_mut().enumerate() {
        r.violations = p.turns[i].violations.clone();
        r.violations_decline_aware = d.turns[i].violations.clone();
    }
    let s = |x: &super::scorer::EpisodeScore| Scoring {
        strict: x.strict,
        channels: x.channels,
        turns_correct: x.turns_correct,
    };
    (s(&p), s(&d))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ladder::agent::Scripted;
    use crate::ladder::domain::Domain;
    use crate::ladder::generator::{config, generate};
    use crate::ladder::module::OracleMatcher;

    fn compiled(ep: &Episode) -> Compiled {
        Compiled::oracle(ep)
    }

    #[test]
    fn perfect_agent_is_strict_on_every_arm() {
        for seed in 100..110 {
            let ep = generate(&config(Domain::Release, 10, 0.15, seed), None).unwrap();
            let c = compiled(&ep);
            for arm in Arm::ALL {
                let (rec, turns) = run_episode(
                    &ep,
                    arm,
                    &mut Scripted::Perfect,
                    &mut OracleMatcher,
                    Some(&c),
                    &RunOptions::default(),
                );
                assert!(rec.primary.strict, "{arm} seed {seed}: {:?}", rec.primary);
                assert!(rec.decline_aware.strict, "{arm} seed {seed}");
                assert_eq!(rec.refused, 0);
                assert_eq!(turns.len(), ep.turns.len());
            }
        }
    }

    #[test]
    fn directive_gate_prompt_carries_the_directive() {
        let ep = generate(&config(Domain::Procurement, 5, 0.15, 100), None).unwrap();
        let c = compiled(&ep);
        let (_, turns) = run_episode(
            &ep,
            Arm::Directive,
            &mut Scripted::Perfect,
            &mut OracleMatcher,
            Some(&c),
            &RunOptions::default(),
        );
        let redo = turns
            .iter()
            .find(|t| t.kind == TurnKind::RedoProbe)
            .unwrap();
        assert!(redo.request.contains("is already DONE"), "{}", redo.request);
        let filler = turns.iter().find(|t| t.kind == TurnKind::Filler).unwrap();
        assert!(filler.matched.is_none() && filler.directive.is_none());
    }
}
