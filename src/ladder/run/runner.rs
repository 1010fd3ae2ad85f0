//! Runs one episode on one arm: scripted user → arm → agent → gate →
//! realized state, one turn at a time; then scores it under both scorings.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::backend::Usage;
use crate::ladder::arms::corrupt::{Corruption, Corruptor};
use crate::ladder::arms::decline;
use crate::ladder::arms::gate::{
    CompiledGraph, CompiledRevision, Defect, Directive, DirectiveKind,
};
use crate::ladder::arms::memory::{MemoryKind, MemoryStore, MemoryUse};
use crate::ladder::arms::{Arm, ArmState, Booking, TurnPrompt};
use crate::ladder::episode::{Episode, StepId, Turn, TurnKind};
use crate::ladder::parts::scripted::OracleCompiler;
use crate::ladder::parts::{
    Agent, CallCost, Compiler, Exchange as MemoryExchange, Match, Matcher, MemoryOp, MemoryParts,
    Oracle,
};
use crate::ladder::prompts as p;
use crate::ladder::score::compile::{compile_accuracy, CompileAccuracy};
use crate::ladder::score::{score, ChannelCounts, EpisodeScore, Label, Truth, Violation};

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
        Compiled::compile(&mut OracleCompiler, ep)
    }
}

/// One line of `turns.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnRecord {
    /// Episode seed.
    pub seed: u64,
    pub arm: Arm,
    /// Turn index.
    pub turn: usize,
    /// Turn kind.
    pub kind: TurnKind,
    /// Scripted step.
    pub step: Option<StepId>,
    pub work_order: String,
    /// The user message as the agent read it.
    pub request: String,
    /// What this call added to the system prompt: the system-role
    /// directive, or a memory arm's recall block.
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
    /// What a memory arm wrote after the turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryTurn>,
    /// Wall-clock seconds of the turn.
    pub latency_s: f64,
}

/// A memory arm's writes after one turn.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryTurn {
    /// The operations applied (the exchange itself, for the top-k memory).
    pub ops: Vec<MemoryOp>,
    /// Why the writer or the embedder failed on this turn, if they did.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

/// Issued and obeyed counts of one directive kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Obedience {
    pub issued: u32,
    /// Directives obeyed (no booking of the directed step on that turn).
    pub obeyed: u32,
}

impl std::ops::AddAssign for Obedience {
    fn add_assign(&mut self, o: Obedience) {
        self.issued += o.issued;
        self.obeyed += o.obeyed;
    }
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
    pub redo_fp: u32,
    pub redo_fn: u32,
}

impl MatcherStats {
    /// One resolution of a turn's request.
    fn of(m: &Match, turn: &Turn) -> Self {
        let scored = turn.step.is_some();
        let (redo, truth) = (m.explicit_redo, turn.explicit_redo);
        MatcherStats {
            calls: m.cost.calls,
            scored: u32::from(scored),
            agree: u32::from(scored && m.step == turn.step),
            redo_tp: u32::from(redo && truth),
            redo_fp: u32::from(redo && !truth),
            redo_fn: u32::from(!redo && truth),
        }
    }
}

impl std::ops::AddAssign for MatcherStats {
    fn add_assign(&mut self, o: MatcherStats) {
        self.calls += o.calls;
        self.scored += o.scored;
        self.agree += o.agree;
        self.redo_tp += o.redo_tp;
        self.redo_fp += o.redo_fp;
        self.redo_fn += o.redo_fn;
    }
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
    pub arm: Arm,
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
    /// Writer and embedding calls (memory arms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryUse>,
}

/// What one turn adds to its episode's tallies.
#[derive(Debug, Clone, Default)]
struct Tally {
    usage: Usage,
    agent_calls: u32,
    refused: u32,
    silent: u32,
    matcher: MatcherStats,
    directives: BTreeMap<DirectiveKind, Obedience>,
}

impl std::ops::AddAssign for Tally {
    fn add_assign(&mut self, t: Tally) {
        self.usage += t.usage;
        self.agent_calls += t.agent_calls;
        self.refused += t.refused;
        self.silent += t.silent;
        self.matcher += t.matcher;
        for (k, o) in t.directives {
            *self.directives.entry(k).or_default() += o;
        }
    }
}

/// One episode on one arm in progress: the arm's state and the realized truth.
struct Episodic<'e> {
    ep: &'e Episode,
    arm: Arm,
    state: ArmState,
    truth: Truth,
    compiled: Option<&'e Compiled>,
    opts: &'e RunOptions,
}

/// Runs one episode on one arm.
pub fn run_episode(
    ep: &Episode,
    arm: Arm,
    agent: &mut dyn Agent,
    matcher: &mut dyn Matcher,
    memory: &mut MemoryParts,
    compiled: Option<&Compiled>,
    opts: &RunOptions,
) -> (EpisodeRecord, Vec<TurnRecord>) {
    let started = Instant::now();
    let corruptor = opts.corrupt.map(|e| Corruptor::new(e, ep.config.seed));
    let mut run = Episodic {
        ep,
        arm,
        state: ArmState::new(arm, compiled.map(|c| c.graph.clone()), corruptor),
        truth: Truth::new(ep),
        compiled,
        opts,
    };
    let mut tally = Tally::default();
    let mut records = Vec::with_capacity(ep.turns.len());
    for turn in &ep.turns {
        let (record, t) = run.turn(turn, agent, matcher, memory);
        records.push(record);
        tally += t;
    }
    let (primary, decline_aware) = score_records(ep, &mut records);
    let record = EpisodeRecord {
        seed: ep.config.seed,
        arm,
        turns: ep.turns.len() as u32,
        primary,
        decline_aware,
        refused: tally.refused,
        silent_refusals: tally.silent,
        directives: tally.directives,
        matcher: tally.matcher,
        usage: tally.usage,
        agent_calls: tally.agent_calls,
        wall_s: started.elapsed().as_secs_f64(),
        defects: run.state.defects(),
        compile: compiled
            .filter(|_| arm.uses_module())
            .map(|c| compile_accuracy(ep, &c.graph, &c.revision)),
        corruptions: run.state.corruptor.map(|c| c.events).unwrap_or_default(),
        memory: run.state.memory.map(|m| m.used),
    };
    (record, records)
}

/// The agent's side of one turn: its reply and, on the same-turn arm, the
/// re-prompt after a refusal and the second reply.
struct Exchange {
    replies: Vec<String>,
    bookings: Vec<Booking>,
    errors: Vec<String>,
    /// The notice sent between the two replies, if any.
    reprompt: Option<String>,
    /// Rejection notices for the next user turn.
    notices: Vec<String>,
    usage: Usage,
    calls: u32,
}

impl Episodic<'_> {
    /// One turn: matcher, prompt, agent, gate, then the realized state
    /// advances on what was executed.
    fn turn(
        &mut self,
        turn: &Turn,
        agent: &mut dyn Agent,
        matcher: &mut dyn Matcher,
        memory: &mut MemoryParts,
    ) -> (TurnRecord, Tally) {
        let (ep, arm) = (self.ep, self.arm);
        let t0 = Instant::now();
        let label = self.truth.open(ep, turn);
        if turn.kind == TurnKind::Revision {
            if let Some(c) = self.compiled {
                self.state.revise(&c.revision);
            }
        }
        let bypass = self.opts.bypass_matcher && turn.kind.bypasses_matcher();
        let matched = (arm.uses_matcher() && !bypass).then(|| matcher.resolve(ep, turn));
        let mut memory_errors = Vec::new();
        let query = match self.state.memory {
            Some(_) => {
                let q = self.embed(memory, vec![p::recall_query(&turn.message)]);
                q.map_err(|e| memory_errors.push(e))
                    .ok()
                    .and_then(|v| v.into_iter().next())
            }
            None => None,
        };
        let prompt = self.state.open_turn(
            ep,
            turn,
            &self.truth.state,
            matched.as_ref(),
            query.as_deref(),
        );
        let x = self.exchange(turn, &prompt, matched.as_ref(), &label, agent);
        let visible = x.replies.last().map(String::as_str).unwrap_or("");
        let refused = x.bookings.iter().filter(|b| b.refusal.is_some()).count() as u32;
        let mut tally = Tally {
            usage: x.usage,
            agent_calls: x.calls,
            refused,
            silent: if decline::has_refusal_language(visible) {
                0
            } else {
                refused
            },
            matcher: matched
                .as_ref()
                .map(|m| MatcherStats::of(m, turn))
                .unwrap_or_default(),
            directives: BTreeMap::new(),
        };
        if let Some(d) = &prompt.directive {
            let booked = x
                .bookings
                .iter()
                .any(|b| b.current && b.step == Some(d.step));
            let o = Obedience {
                issued: 1,
                obeyed: u32::from(!booked),
            };
            tally.directives.insert(d.kind, o);
        }
        let executed: Vec<StepId> = x
            .bookings
            .iter()
            .filter(|b| b.executed)
            .filter_map(|b| b.step)
            .collect();
        self.truth.close(turn, &executed);
        let mut record = TurnRecord {
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
            replies: x.replies.clone(),
            errors: x.errors,
            bookings: x.bookings,
            label,
            violations: Vec::new(),
            violations_decline_aware: Vec::new(),
            usage: x.usage,
            memory: None,
            latency_s: t0.elapsed().as_secs_f64(),
        };
        self.state
            .close_turn(prompt, &x.replies, x.reprompt, x.notices);
        if self.state.memory.is_some() {
            let visible = record.replies.last().map(String::as_str).unwrap_or("");
            let mut m = self.remember(memory, &turn.message, visible);
            memory_errors.append(&mut m.errors);
            m.errors = memory_errors;
            record.memory = Some(m);
            record.latency_s = t0.elapsed().as_secs_f64();
        }
        (record, tally)
    }

    /// Embeds texts for the memory, counting the call.
    fn embed(
        &mut self,
        parts: &mut MemoryParts,
        texts: Vec<String>,
    ) -> Result<Vec<Vec<f32>>, String> {
        let r = parts.embedder.embed(&texts);
        let used = &mut self.state.memory.as_mut().expect("a memory arm").used;
        used.embed_calls += 1;
        match r {
            Ok(e) if e.vectors.len() == texts.len() => {
                used.embed_tokens += e.prompt_tokens as u64;
                Ok(e.vectors)
            }
            Ok(e) => {
                used.embed_failures += 1;
                Err(format!(
                    "embedder: {} vectors for {} texts",
                    e.vectors.len(),
                    texts.len()
                ))
            }
            Err(e) => {
                used.embed_failures += 1;
                Err(format!("embedder: {e}"))
            }
        }
    }

    /// Writes the finished exchange into the memory: verbatim (top-k) or
    /// as the writer's operations (Mem0-style), then embeds what changed.
    fn remember(&mut self, parts: &mut MemoryParts, user: &str, reply: &str) -> MemoryTurn {
        let store = self.state.memory.as_mut().expect("a memory arm");
        let mut out = MemoryTurn::default();
        let ops = match store.kind {
            MemoryKind::Exchanges => vec![MemoryOp::Add {
                text: p::exchange_memory(user, reply),
            }],
            MemoryKind::Facts => {
                let facts = store.facts();
                let x = MemoryExchange {
                    facts: &facts,
                    user,
                    reply,
                    truth: &self.truth.state,
                    episode: self.ep,
                };
                let (ops, cost) = parts.writer.write(&x);
                let used = &mut store.used;
                used.writer_calls += cost.calls;
                used.writer_prompt_tokens += cost.prompt_tokens;
                used.writer_completion_tokens += cost.completion_tokens;
                if let Some(e) = cost.error {
                    used.writer_failures += 1;
                    out.errors.push(format!("writer: {e}"));
                }
                store.admissible(ops)
            }
        };
        let texts = MemoryStore::texts(&ops);
        let vectors = if texts.is_empty() {
            Ok(Vec::new())
        } else {
            self.embed(parts, texts)
        };
        match vectors {
            Ok(v) => {
                let store = self.state.memory.as_mut().expect("a memory arm");
                out.ops = ops.clone();
                store.apply(ops, v);
            }
            Err(e) => out.errors.push(e),
        }
        out
    }

    /// The agent replies; the gate judges the bookings; on the same-turn
    /// arm a refusal re-prompts the agent at once.
    fn exchange(
        &mut self,
        turn: &Turn,
        prompt: &TurnPrompt,
        matched: Option<&Match>,
        label: &Label,
        agent: &mut dyn Agent,
    ) -> Exchange {
        let ep = self.ep;
        let oracle = |reprompt| Oracle {
            episode: ep,
            turn,
            truth: &self.truth.state,
            label,
            reprompt,
        };
        let first = agent.reply(&prompt.messages, &oracle(false));
        let (bookings, notices) = self.state.gate(ep, turn, prompt, matched, &first.text, 0);
        let mut x = Exchange {
            replies: vec![first.text],
            bookings,
            errors: first.error.into_iter().collect(),
            reprompt: None,
            notices,
            usage: first.usage,
            calls: 1,
        };
        if self.arm.same_turn_notice() && !x.notices.is_empty() {
            let notice = x.notices.join("\n");
            let msgs = self.state.reprompt(prompt, &x.replies[0], &notice);
            let second = agent.reply(&msgs, &oracle(true));
            let (b2, n2) = self.state.gate(ep, turn, prompt, matched, &second.text, 1);
            x.calls += 1;
            x.usage += second.usage;
            x.errors.extend(second.error);
            x.bookings.extend(b2);
            x.replies.push(second.text);
            x.reprompt = Some(notice);
            x.notices = n2;
        }
        x
    }
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
    let s = |x: &EpisodeScore| Scoring {
        strict: x.strict,
        channels: x.channels,
        turns_correct: x.turns_correct,
    };
    (s(&p), s(&d))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ladder::episode::domain::Domain;
    use crate::ladder::episode::generator::generate;
    use crate::ladder::episode::EpisodeConfig;
    use crate::ladder::parts::scripted::{OracleMatcher, Scripted};

    fn compiled(ep: &Episode) -> Compiled {
        Compiled::oracle(ep)
    }

    #[test]
    fn perfect_agent_is_strict_on_every_arm() {
        for seed in 100..110 {
            let ep =
                generate(&EpisodeConfig::paper(Domain::Release, 10, 0.15, seed), None).unwrap();
            let c = compiled(&ep);
            for arm in Arm::ALL {
                let (rec, turns) = run_episode(
                    &ep,
                    arm,
                    &mut Scripted::Perfect,
                    &mut OracleMatcher,
                    &mut MemoryParts::scripted(),
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
        let ep = generate(
            &EpisodeConfig::paper(Domain::Procurement, 5, 0.15, 100),
            None,
        )
        .unwrap();
        let c = compiled(&ep);
        let (_, turns) = run_episode(
            &ep,
            Arm::Directive,
            &mut Scripted::Perfect,
            &mut OracleMatcher,
            &mut MemoryParts::scripted(),
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
