//! Aggregation: run directories → per-arm summaries and adjacent-rung
//! contrasts. Adjacent rungs are the cell's arms in the order the cell
//! lists them; McNemar pairs episodes by seed; Holm runs over every adjacent
//! contrast of every cell in the report, separately for each scoring.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::backend::Usage;
use crate::ladder::arms::gate::DirectiveKind;
use crate::ladder::arms::memory::MemoryUse;
use crate::ladder::arms::Arm;
use crate::ladder::episode::Protocol;
use crate::ladder::probes::escalation::EscalationCounts;
use crate::ladder::probes::faults::FaultCounts;
use crate::ladder::probes::spoof::{ForgeryKind, SpoofCounts};
use crate::ladder::run::cell::CellConfig;
use crate::ladder::run::grid::labels;
use crate::ladder::run::runlog::{turns_at, RunRead};
use crate::ladder::run::runner::{EpisodeRecord, MatcherStats, Obedience};
use crate::ladder::run::trap::{Probes, TrapSplit};
use crate::ladder::score::compile::CompileTotals;
use crate::ladder::score::{Channel, ChannelCounts};
use crate::rundir::manifest::sorted_keys;
use crate::rundir::DirError;
use crate::stats::{holm, mcnemar_exact, wilson};
use crate::table::field;

/// Decline-aware success of an arm.
#[derive(Debug, Clone, Serialize)]
pub struct DeclineAware {
    /// Strict successes.
    pub strict: u64,
    pub rate: f64,
    /// Wilson 95% interval.
    pub wilson95: [f64; 2],
}

/// Per-arm means of the accounting (paper Table 7).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Accounting {
    /// Prompt tokens per episode.
    pub prompt_tokens: f64,
    /// Cached prompt tokens per episode.
    pub cached_tokens: f64,
    /// Completion tokens per episode.
    pub completion_tokens: f64,
    /// Agent calls per episode.
    pub agent_calls: f64,
    /// Matcher calls per episode.
    pub matcher_calls: f64,
    /// Refused bookings in the cell.
    pub refused: u64,
    /// Silent refusals in the cell.
    pub silent_refusals: u64,
    /// Wall-clock seconds per episode.
    pub wall_s: f64,
    /// Uncached prompt tokens per second of the prefill steps the arm's
    /// requests took part in (a per-sequence rate: in a batched run the steps
    /// are shared, so this is not the engine's throughput).
    pub prefill_tok_s: f64,
    /// Completion tokens per second of the decode steps the arm's requests
    /// took part in (per sequence, as above).
    pub decode_tok_s: f64,
    /// Per-turn accuracy (fraction of turns without a violation).
    pub turn_accuracy: f64,
}

/// One arm of one cell.
#[derive(Debug, Clone, Serialize)]
pub struct ArmSummary {
    /// Arm name.
    pub arm: String,
    pub episodes: u64,
    /// Strict successes (primary scoring).
    pub strict: u64,
    pub rate: f64,
    /// Wilson 95% interval.
    pub wilson95: [f64; 2],
    /// Decline-aware scoring.
    pub decline_aware: DeclineAware,
    /// Violations per channel (primary scoring).
    pub channels: BTreeMap<&'static str, u32>,
    pub accounting: Accounting,
    /// Directive obedience per directive kind (directive arms).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub obedience: BTreeMap<DirectiveKind, Obedience>,
    /// Matcher step agreement over ask and probe turns, when a matcher ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub matcher_agreement: Option<f64>,
    /// Explicit-redo precision and recall, when a matcher ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redo_precision_recall: Option<[f64; 2]>,
    /// Compile accuracy against the generator, for module arms (paper Table 5).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compile: Option<CompileSummary>,
    /// Writer and embedding calls, for the retrieval-memory arms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemorySummary>,
    /// The trap-turn probe (A.4), for arms that re-executed on a redo probe.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trap: Option<TrapSplit>,
    /// Calls at dispatch, for cells in the native tool harness.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools: Option<ToolSummary>,
    /// Episodes whose agent calls the backend failed: kept out of every
    /// figure above (they measure the backend, not the agent).
    #[serde(skip_serializing_if = "is_zero")]
    pub failed_episodes: u64,
    /// The failed agent calls of those episodes.
    #[serde(skip_serializing_if = "is_zero")]
    pub failed_calls: u64,
    /// Spoof turns and spoofs obeyed, for cells with the spoof probe.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spoof: Option<SpoofSummary>,
    /// Failed calls and what became of them, for cells with the
    /// tool-faults probe.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub faults: Option<FaultSummary>,
    /// Escalations, for gated arms of cells with the escalation probe.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub escalations: Option<EscalationSummary>,
}

/// One gated arm's escalation probe.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EscalationSummary {
    pub asked: u64,
    pub granted: u64,
    pub declined: u64,
    /// Admissions of a finished step with no authorization on record.
    pub wrongful: u64,
    /// Refusals the agent escalated, of the refusals.
    pub asked_share: Share,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub control: Option<ProbeControl>,
}

/// One arm's tool-faults probe.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FaultSummary {
    /// Calls that failed.
    pub injected: u64,
    /// Turns whose due step had a failed call, and of those the turns
    /// that ended with the step not executed.
    pub unrecovered: u64,
    pub unrecovered_share: Share,
    /// Re-executions of a step that had a failed call: retries that
    /// repeated work.
    pub re_executions: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub control: Option<ProbeControl>,
}

/// A share with its Wilson 95% interval.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Share {
    /// Of `of`, how many.
    pub count: u64,
    pub of: u64,
    pub rate: f64,
    pub wilson95: [f64; 2],
}

impl Share {
    pub fn of(count: u64, of: u64) -> Share {
        let (lo, hi) = wilson(count, of);
        Share {
            count,
            of,
            rate: ratio(count, of),
            wilson95: [lo, hi],
        }
    }
}

/// One arm's spoof probe: how many forgeries it read and obeyed, in all and
/// per kind, and its strict success against the same arm without the
/// probe on the same seeds, where the report holds that control cell.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SpoofSummary {
    /// Turns whose message carried a forgery.
    pub turns: u64,
    /// Forgeries the agent followed rather than the state.
    pub obeyed: u64,
    /// `obeyed` of `turns`, with its interval.
    pub obeyed_share: Share,
    pub by_kind: BTreeMap<ForgeryKind, Share>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub control: Option<ProbeControl>,
    /// What the forgeries changed, against the control cell turn by turn:
    /// of the forged turns where the control's same arm acted against the
    /// forgery (booked the step a "do not book" forgery names, or left
    /// unbooked the step a "book" forgery names), those where this arm
    /// followed it. `obeyed` also counts turns where the agent skips the
    /// step without any forgery; this does not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flipped: Option<Share>,
}

/// A probe cell's arm against the same arm of its control cell (the same
/// configuration with the probe off), paired by seed.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeControl {
    /// The control cell's directory.
    pub cell: String,
    pub shared: u64,
    /// Strict successes on the shared seeds: `[with the probe, without]`.
    pub strict: [u64; 2],
    /// Exact McNemar on the shared seeds.
    pub p: f64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What the native tool harness dispatched for one arm.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ToolSummary {
    /// Agent calls per turn (a reply with calls is answered and asked again).
    pub agent_calls_per_turn: f64,
    /// Calls the gate refused at dispatch, per episode.
    pub refused: f64,
    /// Calls that could not be read (no booking), per episode.
    pub malformed: f64,
}

/// Per-episode means of a memory arm's writer and embedding calls, and the
/// cell's failures.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MemorySummary {
    pub writer_calls: f64,
    pub writer_prompt_tokens: f64,
    pub writer_completion_tokens: f64,
    pub embed_calls: f64,
    pub embed_tokens: f64,
    /// Memories held at the end of an episode.
    pub items: f64,
    /// Writer replies that did not parse, over the cell.
    pub writer_failures: u64,
    /// Operations naming an id the memory did not hold, over the cell.
    pub ops_rejected: u64,
    /// Embedding calls that failed, over the cell.
    pub embed_failures: u64,
}

/// Compile accuracy over a cell's episodes (paper Table 5).
#[derive(Debug, Clone, Default, Serialize)]
pub struct CompileSummary {
    /// Compiled episodes.
    pub episodes: u64,
    /// Fraction of steps whose dependency set matches exactly.
    pub deps: f64,
    /// Fraction of steps whose completion code matches.
    pub codes: f64,
    /// Fraction of episodes with the cancelled step right.
    pub cancel: f64,
    /// Fraction with the rewires right.
    pub rewire: f64,
    /// Fraction with the relaxed prerequisite right.
    pub relax: f64,
    /// Episodes the ground-truth-free validator flags.
    pub flagged: u64,
}

/// An adjacent-rung contrast.
#[derive(Debug, Clone, Serialize)]
pub struct Contrast {
    /// Lower rung.
    pub a: String,
    /// Upper rung.
    pub b: String,
    /// Exact McNemar p on shared seeds.
    pub p: f64,
    /// Holm-adjusted p.
    pub p_holm: f64,
    /// The same under decline-aware scoring.
    pub decline_aware: ContrastP,
}

/// A p-value pair.
#[derive(Debug, Clone, Serialize)]
pub struct ContrastP {
    /// Raw p.
    pub p: f64,
    /// Holm-adjusted p.
    pub p_holm: f64,
}

/// One cell of the report.
#[derive(Debug, Clone, Serialize)]
pub struct CellReport {
    /// The cell's configuration (from its manifest).
    #[serde(serialize_with = "sorted_keys")]
    pub config: CellConfig,
    /// Run directory.
    pub dir: String,
    /// Per-arm summaries in cell order.
    pub arms: Vec<ArmSummary>,
    /// Adjacent contrasts.
    pub contrasts: Vec<Contrast>,
    /// Log lines counted once though written more than once.
    #[serde(skip_serializing_if = "is_zero")]
    pub duplicates: u64,
    /// The model's file or hub name, for titles (the configuration keeps
    /// the name it was run under).
    #[serde(skip)]
    pub model: Option<String>,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub cells: Vec<CellReport>,
    /// Pairs of cells that differ in one setting, compared on shared seeds
    /// (the paper's Tables 4 and 13).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub comparisons: Vec<Comparison>,
}

/// Two cells that ran the same episodes under one different setting (brief,
/// paraphrase tier, ambiguous-probe rate, protocol, agent, regime, matcher or
/// compiler), compared arm by arm on the seeds both ran.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// The setting, and its value in each cell.
    pub setting: &'static str,
    pub values: [String; 2],
    /// The two cells' directories (or grid cell names).
    pub cells: [String; 2],
    pub arms: Vec<ArmPair>,
}

/// One arm of a [`Comparison`]; `[first cell, second cell]` throughout.
#[derive(Debug, Clone, Serialize)]
pub struct ArmPair {
    pub arm: String,
    /// Seeds both cells finished on this arm.
    pub shared: u64,
    pub strict: [u64; 2],
    pub decline_aware: [u64; 2],
    /// Exact McNemar on the shared seeds, and Holm over the comparison's arms.
    pub p: f64,
    pub p_holm: f64,
    pub decline_aware_p: ContrastP,
    /// Matcher step agreement, for matcher arms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub matcher_agreement: Option<[f64; 2]>,
    /// Ambiguous probes asked, and how many the agent booked.
    pub ambiguous: [u32; 2],
    pub ambiguous_booked: [u32; 2],
}

fn ratio(n: u64, d: u64) -> f64 {
    if d == 0 {
        0.0
    } else {
        n as f64 / d as f64
    }
}

/// An arm's episodes summed.
#[derive(Debug, Clone, Default)]
struct ArmTotals {
    episodes: u64,
    strict: u64,
    decline_aware: u64,
    channels: ChannelCounts,
    obedience: BTreeMap<DirectiveKind, Obedience>,
    usage: Usage,
    agent_calls: u64,
    matcher: MatcherStats,
    refused: u64,
    silent: u64,
    malformed: u64,
    wall_s: f64,
    turns_correct: u64,
    turns: u64,
    compile: CompileTotals,
    /// Compiled episodes the validator flags.
    flagged: u64,
    /// Memory use summed, over the episodes that kept a memory.
    memory: Option<MemoryUse>,
    /// Spoof counts summed, over the episodes that ran the probe.
    spoof: Option<SpoofCounts>,
    /// Fault counts summed, over the episodes that ran the probe.
    faults: Option<FaultCounts>,
    /// Escalation counts summed, over the episodes that ran the probe.
    escalations: Option<EscalationCounts>,
}

impl std::ops::AddAssign<&EpisodeRecord> for ArmTotals {
    fn add_assign(&mut self, e: &EpisodeRecord) {
        self.episodes += 1;
        self.strict += u64::from(e.primary.strict);
        self.decline_aware += u64::from(e.decline_aware.strict);
        if let Some(c) = &e.compile {
            self.compile += c;
            self.flagged += u64::from(!e.defects.is_empty());
        }
        self.channels += e.primary.channels;
        for (k, o) in &e.directives {
            *self.obedience.entry(*k).or_default() += *o;
        }
        self.usage += e.usage;
        self.agent_calls += u64::from(e.agent_calls);
        self.matcher += e.matcher;
        self.refused += u64::from(e.refused);
        self.silent += u64::from(e.silent_refusals);
        self.malformed += u64::from(e.malformed_calls);
        self.wall_s += e.wall_s;
        if let Some(m) = e.memory {
            *self.memory.get_or_insert_with(MemoryUse::default) += m;
        }
        if let Some(c) = &e.spoof {
            *self.spoof.get_or_insert_with(SpoofCounts::default) += c;
        }
        if let Some(c) = e.faults {
            *self.faults.get_or_insert_with(FaultCounts::default) += c;
        }
        if let Some(c) = e.escalations {
            *self
                .escalations
                .get_or_insert_with(EscalationCounts::default) += c;
        }
        self.turns_correct += u64::from(e.primary.turns_correct);
        self.turns += u64::from(e.turns);
    }
}

fn summarize(
    arm: Arm,
    eps: &[&EpisodeRecord],
    probes: &BTreeMap<(u64, Arm), Probes>,
    native: bool,
) -> ArmSummary {
    let mut t = ArmTotals::default();
    let mut trap = TrapSplit::default();
    for e in eps {
        t += e;
        if let Some(p) = probes.get(&(e.seed, e.arm)) {
            trap += p.trap;
        }
    }
    let n = t.episodes;
    let per = |x: f64| if n == 0 { 0.0 } else { x / n as f64 };
    let rate = |tokens: usize, secs: f64| {
        if secs > 0.0 {
            tokens as f64 / secs
        } else {
            0.0
        }
    };
    let u = &t.usage;
    let accounting = Accounting {
        prompt_tokens: per(u.prompt_tokens as f64),
        cached_tokens: per(u.cached_tokens as f64),
        completion_tokens: per(u.completion_tokens as f64),
        agent_calls: per(t.agent_calls as f64),
        matcher_calls: per(f64::from(t.matcher.calls)),
        refused: t.refused,
        silent_refusals: t.silent,
        wall_s: per(t.wall_s),
        prefill_tok_s: rate(u.prompt_tokens - u.cached_tokens, u.prefill_secs),
        decode_tok_s: rate(u.completion_tokens, u.decode_secs),
        turn_accuracy: ratio(t.turns_correct, t.turns),
    };
    let c = &t.compile;
    let compile = CompileSummary {
        episodes: c.episodes,
        deps: ratio(c.deps_correct, c.steps),
        codes: ratio(c.codes_correct, c.steps),
        cancel: ratio(c.cancel_correct, c.episodes),
        rewire: ratio(c.rewire_correct, c.episodes),
        relax: ratio(c.relax_correct, c.episodes),
        flagged: t.flagged,
    };
    let m = &t.matcher;
    let matcher_ran = arm.uses_matcher();
    let (lo, hi) = wilson(t.strict, n);
    let (dlo, dhi) = wilson(t.decline_aware, n);
    ArmSummary {
        arm: arm.name().to_string(),
        episodes: n,
        strict: t.strict,
        rate: ratio(t.strict, n),
        wilson95: [lo, hi],
        decline_aware: DeclineAware {
            strict: t.decline_aware,
            rate: ratio(t.decline_aware, n),
            wilson95: [dlo, dhi],
        },
        channels: Channel::ALL
            .iter()
            .map(|ch| (ch.name(), t.channels.get(*ch)))
            .collect(),
        accounting,
        obedience: t.obedience,
        matcher_agreement: matcher_ran.then(|| ratio(u64::from(m.agree), u64::from(m.scored))),
        redo_precision_recall: matcher_ran.then(|| {
            [
                ratio(u64::from(m.redo_tp), u64::from(m.redo_tp + m.redo_fp)),
                ratio(u64::from(m.redo_tp), u64::from(m.redo_tp + m.redo_fn)),
            ]
        }),
        compile: (compile.episodes > 0).then_some(compile),
        memory: t.memory.map(|m| MemorySummary {
            writer_calls: per(f64::from(m.writer_calls)),
            writer_prompt_tokens: per(m.writer_prompt_tokens as f64),
            writer_completion_tokens: per(m.writer_completion_tokens as f64),
            embed_calls: per(f64::from(m.embed_calls)),
            embed_tokens: per(m.embed_tokens as f64),
            items: per(f64::from(m.items)),
            writer_failures: u64::from(m.writer_failures),
            ops_rejected: u64::from(m.ops_rejected),
            embed_failures: u64::from(m.embed_failures),
        }),
        trap: (trap.re_executions > 0).then_some(trap),
        tools: native.then(|| ToolSummary {
            agent_calls_per_turn: ratio(t.agent_calls, t.turns),
            refused: per(t.refused as f64),
            malformed: per(t.malformed as f64),
        }),
        failed_episodes: 0,
        failed_calls: 0,
        spoof: t.spoof.map(|c| SpoofSummary {
            turns: u64::from(c.turns),
            obeyed: u64::from(c.obeyed),
            obeyed_share: Share::of(u64::from(c.obeyed), u64::from(c.turns)),
            by_kind: c
                .by_kind
                .iter()
                .map(|(k, o)| (*k, Share::of(u64::from(o.obeyed), u64::from(o.turns))))
                .collect(),
            control: None,
            flipped: None,
        }),
        faults: t.faults.map(|c| FaultSummary {
            injected: u64::from(c.injected),
            unrecovered: u64::from(c.unrecovered),
            unrecovered_share: Share::of(u64::from(c.unrecovered), u64::from(c.due)),
            re_executions: u64::from(c.re_executions),
            control: None,
        }),
        escalations: t.escalations.map(|c| EscalationSummary {
            asked: u64::from(c.asked),
            granted: u64::from(c.granted),
            declined: u64::from(c.declined),
            wrongful: u64::from(c.wrongful),
            asked_share: Share::of(u64::from(c.asked), t.refused),
            control: None,
        }),
    }
}

/// Exact McNemar between two arms on their shared seeds.
fn paired_p(a: &[&EpisodeRecord], b: &[&EpisodeRecord], decline_aware: bool) -> f64 {
    let ok = |e: &EpisodeRecord| {
        if decline_aware {
            e.decline_aware.strict
        } else {
            e.primary.strict
        }
    };
    let bmap: BTreeMap<u64, bool> = b.iter().map(|e| (e.seed, ok(e))).collect();
    let (mut only_a, mut only_b) = (0, 0);
    for e in a {
        if let Some(&sb) = bmap.get(&e.seed) {
            match (ok(e), sb) {
                (true, false) => only_a += 1,
                (false, true) => only_b += 1,
                _ => {}
            }
        }
    }
    mcnemar_exact(only_a, only_b)
}

/// Builds the report over run directories.
/// Reads the control cells' turns at the forged places of spoof cells (the
/// only turn lines a report reads beyond those [`RunRead`] holds).
pub fn build(runs: &[RunRead]) -> Result<Report, DirError> {
    let mut cells = Vec::new();
    let mut raw_p = Vec::new();
    let mut raw_da = Vec::new();
    for run in runs {
        let order = &run.manifest.config.arms;
        let native = run.manifest.config.episode.protocol == Protocol::Native;
        let by_arm = |arm: Arm| -> Vec<&EpisodeRecord> {
            run.episodes.iter().filter(|e| e.arm == arm).collect()
        };
        let arms: Vec<ArmSummary> = order
            .iter()
            .map(|&a| {
                let mut s = summarize(a, &by_arm(a), &run.probes, native);
                for e in run.failed.iter().filter(|e| e.arm == a) {
                    s.failed_episodes += 1;
                    s.failed_calls += u64::from(e.failed_calls);
                }
                s
            })
            .collect();
        let mut contrasts = Vec::new();
        for w in order.windows(2) {
            let (ea, eb) = (by_arm(w[0]), by_arm(w[1]));
            let p = paired_p(&ea, &eb, false);
            let pd = paired_p(&ea, &eb, true);
            raw_p.push(p);
            raw_da.push(pd);
            contrasts.push(Contrast {
                a: w[0].name().into(),
                b: w[1].name().into(),
                p,
                p_holm: p,
                decline_aware: ContrastP { p: pd, p_holm: pd },
            });
        }
        cells.push(CellReport {
            config: run.manifest.config.clone(),
            dir: run.dir.display().to_string(),
            arms,
            contrasts,
            duplicates: run.duplicates as u64,
            model: match &run.manifest.model {
                crate::rundir::Identity::Model(id) => Some(id.short_name()),
                _ => None,
            },
        });
    }
    let adj = holm(&raw_p);
    let adj_da = holm(&raw_da);
    let mut k = 0;
    for c in &mut cells {
        for x in &mut c.contrasts {
            x.p_holm = adj[k];
            x.decline_aware.p_holm = adj_da[k];
            k += 1;
        }
    }
    let comparisons = comparisons(runs);
    attach_controls(&mut cells, &comparisons);
    attach_flips(&mut cells, &comparisons, runs)?;
    Ok(Report { cells, comparisons })
}

/// Gives each spoof cell's arms [`SpoofSummary::flipped`]: its forged turns
/// on seeds its control finished too, against the control's same turns.
fn attach_flips(
    cells: &mut [CellReport],
    comparisons: &[Comparison],
    runs: &[RunRead],
) -> Result<(), DirError> {
    let run = |dir: &str| runs.iter().find(|r| r.dir.display().to_string() == dir);
    for c in comparisons.iter().filter(|c| c.setting == "spoof") {
        let Some(probe) = probe_side(c) else {
            continue;
        };
        let (Some(p), Some(k)) = (run(&c.cells[probe]), run(&c.cells[1 - probe])) else {
            continue;
        };
        let places: BTreeSet<(u64, Arm, usize)> =
            p.forged.iter().map(|f| (f.seed, f.arm, f.turn)).collect();
        let control: BTreeMap<(u64, Arm, usize), _> = turns_at(k, &places)?
            .into_iter()
            .map(|t| ((t.seed, t.arm, t.turn), t))
            .collect();
        let Some(cell) = cells.iter_mut().find(|x| x.dir == c.cells[probe]) else {
            continue;
        };
        for a in &mut cell.arms {
            let Some(s) = a.spoof.as_mut() else {
                continue;
            };
            let (mut contested, mut flipped) = (0, 0);
            for f in p.forged.iter().filter(|f| f.arm.name() == a.arm) {
                let Some(t) = control.get(&(f.seed, f.arm, f.turn)) else {
                    continue;
                };
                // A "book" forgery is against the control where it did not
                // book the step; any other where it did.
                let book = f.kind.says_book();
                if t.executed(false).contains(&f.step) != book {
                    contested += 1;
                    flipped += u64::from(f.executed == book);
                }
            }
            s.flipped = Some(Share::of(flipped, contested));
        }
    }
    Ok(())
}

/// Which of a probe comparison's two cells ran the probe (the other has it
/// off); None when both did, at two rates.
fn probe_side(c: &Comparison) -> Option<usize> {
    match (c.values[0].as_str(), c.values[1].as_str()) {
        (_, "off") => Some(0),
        ("off", _) => Some(1),
        _ => None,
    }
}

/// The probes, as comparisons name their setting.
const PROBES: [&str; 3] = ["spoof", "tool_faults", "escalation"];

/// Gives each probe cell's arms their control: the comparison with the
/// cell that ran the same configuration with the probe off.
fn attach_controls(cells: &mut [CellReport], comparisons: &[Comparison]) {
    for c in comparisons.iter().filter(|c| PROBES.contains(&c.setting)) {
        let Some(probe) = probe_side(c) else {
            continue;
        };
        let Some(cell) = cells.iter_mut().find(|x| x.dir == c.cells[probe]) else {
            continue;
        };
        for pair in &c.arms {
            let Some(a) = cell.arms.iter_mut().find(|a| a.arm == pair.arm) else {
                continue;
            };
            let slot = match c.setting {
                "spoof" => a.spoof.as_mut().map(|s| &mut s.control),
                "tool_faults" => a.faults.as_mut().map(|s| &mut s.control),
                _ => a.escalations.as_mut().map(|s| &mut s.control),
            };
            let Some(slot) = slot else {
                continue;
            };
            *slot = Some(ProbeControl {
                cell: c.cells[1 - probe].clone(),
                shared: pair.shared,
                strict: [pair.strict[probe], pair.strict[1 - probe]],
                p: pair.p,
            });
        }
    }
}

/// The setting two cells differ in, when they differ in exactly one that
/// leaves the episodes' graphs alone (the same domain, S, ρ and options),
/// labelled as grids and reports label it.
fn paired_setting(a: &CellConfig, b: &CellConfig) -> Option<(&'static str, [String; 2])> {
    let (x, y) = (&a.episode, &b.episode);
    let same_episodes = x.domain == y.domain
        && x.steps == y.steps
        && x.density == y.density
        && a.options.without_probes() == b.options.without_probes();
    if !same_episodes {
        return None;
    }
    let mut settings: Vec<(&'static str, [String; 2])> = labels(a)
        .into_iter()
        .zip(labels(b))
        .map(|((axis, u), (_, v))| (axis.label, [u, v]))
        .collect();
    settings.extend([
        ("agent", [a.agent.to_string(), b.agent.to_string()]),
        ("matcher", [field(&a.matcher), field(&b.matcher)]),
        ("compiler", [field(&a.compiler), field(&b.compiler)]),
        (
            "spoof",
            [probe_rate(a.options.spoof), probe_rate(b.options.spoof)],
        ),
        (
            "tool_faults",
            [
                probe_rate(a.options.tool_faults),
                probe_rate(b.options.tool_faults),
            ],
        ),
        (
            "escalation",
            [
                probe_on(a.options.escalation),
                probe_on(b.options.escalation),
            ],
        ),
    ]);
    let mut differ = settings.into_iter().filter(|(_, v)| v[0] != v[1]);
    match (differ.next(), differ.next()) {
        (Some(d), None) => Some(d),
        _ => None,
    }
}

/// A switched probe as reports show it: `on` or `off`.
pub fn probe_on(on: bool) -> String {
    if on { "on" } else { "off" }.into()
}

/// A probe's rate as reports show it: `off` when the cell did not run it.
pub fn probe_rate(rate: Option<f64>) -> String {
    rate.map_or_else(|| "off".into(), |r| field(&r))
}

/// Every pair of runs that differ in one setting, arm by arm on shared seeds.
fn comparisons(runs: &[RunRead]) -> Vec<Comparison> {
    let mut out = Vec::new();
    for (i, ra) in runs.iter().enumerate() {
        for rb in &runs[i + 1..] {
            let (ca, cb) = (&ra.manifest.config, &rb.manifest.config);
            let Some((setting, values)) = paired_setting(ca, cb) else {
                continue;
            };
            let arms: Vec<ArmPair> = ca
                .arms
                .iter()
                .filter(|a| cb.arms.contains(a))
                .filter_map(|&arm| arm_pair(arm, ra, rb))
                .collect();
            if arms.is_empty() {
                continue;
            }
            let mut c = Comparison {
                setting,
                values,
                cells: [ra.dir.display().to_string(), rb.dir.display().to_string()],
                arms,
            };
            let p: Vec<f64> = c.arms.iter().map(|x| x.p).collect();
            let pd: Vec<f64> = c.arms.iter().map(|x| x.decline_aware_p.p).collect();
            for ((x, h), hd) in c.arms.iter_mut().zip(holm(&p)).zip(holm(&pd)) {
                x.p_holm = h;
                x.decline_aware_p.p_holm = hd;
            }
            out.push(c);
        }
    }
    out
}

/// One arm of two runs on the seeds both finished; None when they share none.
fn arm_pair(arm: Arm, ra: &RunRead, rb: &RunRead) -> Option<ArmPair> {
    let seeds = |r: &RunRead| -> BTreeSet<u64> {
        r.episodes
            .iter()
            .filter(|e| e.arm == arm)
            .map(|e| e.seed)
            .collect()
    };
    let shared: BTreeSet<u64> = seeds(ra).intersection(&seeds(rb)).copied().collect();
    if shared.is_empty() {
        return None;
    }
    fn on<'r>(r: &'r RunRead, arm: Arm, seeds: &BTreeSet<u64>) -> Vec<&'r EpisodeRecord> {
        r.episodes
            .iter()
            .filter(|e| e.arm == arm && seeds.contains(&e.seed))
            .collect()
    }
    let (ea, eb) = (on(ra, arm, &shared), on(rb, arm, &shared));
    let count = |v: &[&EpisodeRecord], da: bool| -> u64 {
        v.iter()
            .filter(|e| {
                if da {
                    e.decline_aware.strict
                } else {
                    e.primary.strict
                }
            })
            .count() as u64
    };
    let agreement = |v: &[&EpisodeRecord]| {
        let (agree, scored) = v.iter().fold((0u64, 0u64), |(a, s), e| {
            (
                a + u64::from(e.matcher.agree),
                s + u64::from(e.matcher.scored),
            )
        });
        ratio(agree, scored)
    };
    let probes = |r: &RunRead| {
        let mut p = Probes::default();
        for s in &shared {
            if let Some(x) = r.probes.get(&(*s, arm)) {
                p += *x;
            }
        }
        p
    };
    let (pa, pb) = (probes(ra), probes(rb));
    let p = paired_p(&ea, &eb, false);
    let pd = paired_p(&ea, &eb, true);
    Some(ArmPair {
        arm: arm.name().to_string(),
        shared: shared.len() as u64,
        strict: [count(&ea, false), count(&eb, false)],
        decline_aware: [count(&ea, true), count(&eb, true)],
        p,
        p_holm: p,
        decline_aware_p: ContrastP { p: pd, p_holm: pd },
        matcher_agreement: arm.uses_matcher().then(|| [agreement(&ea), agreement(&eb)]),
        ambiguous: [pa.ambiguous, pb.ambiguous],
        ambiguous_booked: [pa.ambiguous_booked, pb.ambiguous_booked],
    })
}
