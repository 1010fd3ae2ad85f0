//! Reports: the ladder table (strict success with Wilson 95% intervals,
//! adjacent-rung exact McNemar with Holm), the channel table and the per-arm
//! accounting, as terminal text, Markdown, CSV or JSON.
//!
//! Adjacent rungs are the cell's arms in the order the cell lists them;
//! McNemar pairs episodes by seed; Holm runs over every adjacent contrast of
//! every cell in the report, separately for each scoring.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;

use crate::ladder::arm::Arm;
use crate::ladder::module::DirectiveKind;
use crate::ladder::runlog::RunRead;
use crate::ladder::runner::{EpisodeRecord, Obedience};
use crate::ladder::scorer::{Channel, ChannelCounts};
use crate::stats::{holm, mcnemar_exact, wilson};

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned terminal tables.
    Text,
    /// Markdown tables.
    Md,
    /// Comma-separated values, one row per cell and arm.
    Csv,
    /// The JSON document described in the README.
    Json,
}

/// Decline-aware success of an arm.
#[derive(Debug, Clone, Serialize)]
pub struct DeclineAware {
    /// Strict successes.
    pub strict: u64,
    /// Rate.
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
    /// Episodes.
    pub episodes: u64,
    /// Strict successes (primary scoring).
    pub strict: u64,
    /// Rate.
    pub rate: f64,
    /// Wilson 95% interval.
    pub wilson95: [f64; 2],
    /// Decline-aware scoring.
    pub decline_aware: DeclineAware,
    /// Violations per channel (primary scoring).
    pub channels: BTreeMap<&'static str, u32>,
    /// Accounting.
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
    pub config: Value,
    /// Run directory.
    pub dir: String,
    /// Per-arm summaries in cell order.
    pub arms: Vec<ArmSummary>,
    /// Adjacent contrasts.
    pub contrasts: Vec<Contrast>,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Cells.
    pub cells: Vec<CellReport>,
}

fn ratio(n: u64, d: u64) -> f64 {
    if d == 0 {
        0.0
    } else {
        n as f64 / d as f64
    }
}

fn summarize(arm: Arm, eps: &[&EpisodeRecord]) -> ArmSummary {
    let n = eps.len() as u64;
    let strict = eps.iter().filter(|e| e.primary.strict).count() as u64;
    let da = eps.iter().filter(|e| e.decline_aware.strict).count() as u64;
    let mut channels = ChannelCounts::default();
    let mut obedience: BTreeMap<DirectiveKind, Obedience> = BTreeMap::new();
    let mut acc = Accounting::default();
    let matcher_ran = arm.uses_matcher();
    let (mut agree, mut scored, mut tp, mut fp, mut fneg) = (0, 0, 0, 0, 0);
    let (mut prefill_tok, mut prefill_s, mut decode_tok, mut decode_s) = (0u64, 0.0, 0u64, 0.0);
    let (mut turns_ok, mut turns) = (0u64, 0u64);
    let mut comp = CompileSummary::default();
    let (mut deps_ok, mut codes_ok, mut steps) = (0u64, 0u64, 0u64);
    let (mut cancel_ok, mut rewire_ok, mut relax_ok) = (0u64, 0u64, 0u64);
    for e in eps {
        if let Some(c) = &e.compile {
            comp.episodes += 1;
            deps_ok += u64::from(c.deps_correct);
            codes_ok += u64::from(c.codes_correct);
            steps += u64::from(c.steps);
            cancel_ok += u64::from(c.cancel_correct);
            rewire_ok += u64::from(c.rewire_correct);
            relax_ok += u64::from(c.relax_correct);
            comp.flagged += u64::from(!e.defects.is_empty());
        }
        channels.merge(&e.primary.channels);
        for (k, o) in &e.directives {
            let x = obedience.entry(*k).or_default();
            x.issued += o.issued;
            x.obeyed += o.obeyed;
        }
        acc.prompt_tokens += e.usage.prompt_tokens as f64;
        acc.cached_tokens += e.usage.cached_tokens as f64;
        acc.completion_tokens += e.usage.completion_tokens as f64;
        acc.agent_calls += f64::from(e.agent_calls);
        acc.matcher_calls += f64::from(e.matcher.calls);
        acc.refused += u64::from(e.refused);
        acc.silent_refusals += u64::from(e.silent_refusals);
        acc.wall_s += e.wall_s;
        prefill_tok += (e.usage.prompt_tokens - e.usage.cached_tokens) as u64;
        prefill_s += e.usage.prefill_secs;
        decode_tok += e.usage.completion_tokens as u64;
        decode_s += e.usage.decode_secs;
        turns_ok += u64::from(e.primary.turns_correct);
        turns += u64::from(e.turns);
        agree += e.matcher.agree;
        scored += e.matcher.scored;
        tp += e.matcher.redo_tp;
        fp += e.matcher.redo_fp;
        fneg += e.matcher.redo_fn;
    }
    let per = |x: f64| if n == 0 { 0.0 } else { x / n as f64 };
    acc.prompt_tokens = per(acc.prompt_tokens);
    acc.cached_tokens = per(acc.cached_tokens);
    acc.completion_tokens = per(acc.completion_tokens);
    acc.agent_calls = per(acc.agent_calls);
    acc.matcher_calls = per(acc.matcher_calls);
    acc.wall_s = per(acc.wall_s);
    acc.prefill_tok_s = if prefill_s > 0.0 {
        prefill_tok as f64 / prefill_s
    } else {
        0.0
    };
    acc.decode_tok_s = if decode_s > 0.0 {
        decode_tok as f64 / decode_s
    } else {
        0.0
    };
    acc.turn_accuracy = ratio(turns_ok, turns);
    comp.deps = ratio(deps_ok, steps);
    comp.codes = ratio(codes_ok, steps);
    comp.cancel = ratio(cancel_ok, comp.episodes);
    comp.rewire = ratio(rewire_ok, comp.episodes);
    comp.relax = ratio(relax_ok, comp.episodes);
    let (lo, hi) = wilson(strict, n);
    let (dlo, dhi) = wilson(da, n);
    ArmSummary {
        arm: arm.name().to_string(),
        episodes: n,
        strict,
        rate: ratio(strict, n),
        wilson95: [lo, hi],
        decline_aware: DeclineAware {
            strict: da,
            rate: ratio(da, n),
            wilson95: [dlo, dhi],
        },
        channels: Channel::ALL
            .iter()
            .map(|c| (c.name(), channels.get(*c)))
            .collect(),
        accounting: acc,
        obedience,
        matcher_agreement: matcher_ran.then(|| ratio(u64::from(agree), u64::from(scored))),
        redo_precision_recall: matcher_ran.then(|| {
            [
                ratio(u64::from(tp), u64::from(tp + fp)),
                ratio(u64::from(tp), u64::from(tp + fneg)),
            ]
        }),
        compile: (comp.episodes > 0).then_some(comp),
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
pub fn build(runs: &[RunRead]) -> Report {
    let mut cells = Vec::new();
    let mut raw_p = Vec::new();
    let mut raw_da = Vec::new();
    for run in runs {
        let order: Vec<Arm> = run
            .manifest
            .config
            .get("arms")
            .and_then(|v| serde_json::from_value(v.clone()).ok())
            .unwrap_or_default();
        let by_arm = |arm: Arm| -> Vec<&EpisodeRecord> {
            run.episodes.iter().filter(|e| e.arm == arm).collect()
        };
        let arms: Vec<ArmSummary> = order.iter().map(|&a| summarize(a, &by_arm(a))).collect();
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
    Report { cells }
}

fn cell_title(c: &CellReport) -> String {
    let g = |k: &str| {
        c.config
            .get(k)
            .map(|v| v.to_string().trim_matches('"').to_string())
            .unwrap_or_default()
    };
    format!(
        "{} S={} rho={} brief={} protocol={} agent={} episodes={} seeds {}..",
        g("domain"),
        g("steps"),
        g("density"),
        g("brief"),
        g("protocol"),
        g("agent"),
        g("episodes"),
        g("seed_start"),
    )
}

fn fmt_p(p: f64) -> String {
    if p < 1e-3 {
        format!("{p:.1e}")
    } else {
        format!("{p:.3}")
    }
}

/// A plain table: header and rows.
struct Table {
    head: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn text(&self) -> String {
        let w: Vec<usize> = (0..self.head.len())
            .map(|i| {
                self.rows
                    .iter()
                    .map(|r| r[i].chars().count())
                    .chain([self.head[i].chars().count()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |r: &[String]| {
            r.iter()
                .enumerate()
                .map(|(i, c)| format!("{c:<width$}", width = w[i]))
                .collect::<Vec<_>>()
                .join("  ")
                .trim_end()
                .to_string()
        };
        let mut s = line(&self.head) + "\n";
        for r in &self.rows {
            s += &line(r);
            s.push('\n');
        }
        s
    }

    fn md(&self) -> String {
        let mut s = format!("| {} |\n", self.head.join(" | "));
        s += &format!("|{}\n", " --- |".repeat(self.head.len()));
        for r in &self.rows {
            s += &format!("| {} |\n", r.join(" | "));
        }
        s
    }
}

fn ladder_table(c: &CellReport) -> Table {
    Table {
        head: [
            "arm",
            "n",
            "strict",
            "rate",
            "Wilson 95%",
            "decline-aware",
            "per-turn acc.",
        ]
        .map(String::from)
        .to_vec(),
        rows: c
            .arms
            .iter()
            .map(|a| {
                vec![
                    a.arm.clone(),
                    a.episodes.to_string(),
                    a.strict.to_string(),
                    format!("{:.2}", a.rate),
                    format!("[{:.2}, {:.2}]", a.wilson95[0], a.wilson95[1]),
                    format!("{:.2}", a.decline_aware.rate),
                    format!("{:.3}", a.accounting.turn_accuracy),
                ]
            })
            .collect(),
    }
}

fn contrast_table(c: &CellReport) -> Table {
    Table {
        head: ["contrast", "McNemar p", "Holm p", "DA p", "DA Holm p"]
            .map(String::from)
            .to_vec(),
        rows: c
            .contrasts
            .iter()
            .map(|x| {
                vec![
                    format!("{} -> {}", x.a, x.b),
                    fmt_p(x.p),
                    fmt_p(x.p_holm),
                    fmt_p(x.decline_aware.p),
                    fmt_p(x.decline_aware.p_holm),
                ]
            })
            .collect(),
    }
}

fn channel_table(c: &CellReport) -> Table {
    let mut head = vec!["arm".to_string()];
    head.extend(Channel::ALL.iter().map(|ch| ch.name().to_string()));
    Table {
        head,
        rows: c
            .arms
            .iter()
            .map(|a| {
                let mut r = vec![a.arm.clone()];
                r.extend(
                    Channel::ALL
                        .iter()
                        .map(|ch| a.channels[ch.name()].to_string()),
                );
                r
            })
            .collect(),
    }
}

fn accounting_table(c: &CellReport) -> Table {
    Table {
        head: [
            "arm",
            "prompt tok/ep",
            "cached tok/ep",
            "completion tok/ep",
            "agent calls/ep",
            "matcher calls/ep",
            "refused",
            "silent",
            "wall s/ep",
            "prefill tok/s/seq",
            "decode tok/s/seq",
        ]
        .map(String::from)
        .to_vec(),
        rows: c
            .arms
            .iter()
            .map(|a| {
                let x = &a.accounting;
                vec![
                    a.arm.clone(),
                    format!("{:.0}", x.prompt_tokens),
                    format!("{:.0}", x.cached_tokens),
                    format!("{:.0}", x.completion_tokens),
                    format!("{:.1}", x.agent_calls),
                    format!("{:.1}", x.matcher_calls),
                    x.refused.to_string(),
                    x.silent_refusals.to_string(),
                    format!("{:.2}", x.wall_s),
                    format!("{:.1}", x.prefill_tok_s),
                    format!("{:.1}", x.decode_tok_s),
                ]
            })
            .collect(),
    }
}

fn gate_table(c: &CellReport) -> Table {
    let kinds = [
        DirectiveKind::Cancelled,
        DirectiveKind::Done,
        DirectiveKind::Blocked,
    ];
    let ob = |a: &ArmSummary, k: DirectiveKind| match a.obedience.get(&k) {
        Some(o) if o.issued > 0 => format!(
            "{}/{} ({:.3})",
            o.obeyed,
            o.issued,
            f64::from(o.obeyed) / f64::from(o.issued)
        ),
        _ => "-".into(),
    };
    Table {
        head: [
            "arm",
            "obeyed CANCELLED",
            "obeyed DONE",
            "obeyed BLOCKED",
            "matcher agreement",
            "redo precision",
            "redo recall",
        ]
        .map(String::from)
        .to_vec(),
        rows: c
            .arms
            .iter()
            .filter(|a| a.matcher_agreement.is_some())
            .map(|a| {
                let pr = a.redo_precision_recall.unwrap_or([0.0, 0.0]);
                let mut r = vec![a.arm.clone()];
                r.extend(kinds.iter().map(|k| ob(a, *k)));
                r.push(format!("{:.3}", a.matcher_agreement.unwrap_or(0.0)));
                r.push(format!("{:.3}", pr[0]));
                r.push(format!("{:.3}", pr[1]));
                r
            })
            .collect(),
    }
}

fn compile_table(c: &CellReport) -> Table {
    Table {
        head: [
            "arm",
            "episodes",
            "deps",
            "codes",
            "cancel",
            "rewire",
            "relax",
            "validator flags",
        ]
        .map(String::from)
        .to_vec(),
        rows: c
            .arms
            .iter()
            .filter_map(|a| a.compile.as_ref().map(|x| (a, x)))
            .map(|(a, x)| {
                vec![
                    a.arm.clone(),
                    x.episodes.to_string(),
                    format!("{:.3}", x.deps),
                    format!("{:.3}", x.codes),
                    format!("{:.3}", x.cancel),
                    format!("{:.3}", x.rewire),
                    format!("{:.3}", x.relax),
                    x.flagged.to_string(),
                ]
            })
            .collect(),
    }
}

/// Renders the report.
pub fn render(r: &Report, format: Format) -> String {
    match format {
        Format::Json => serde_json::to_string_pretty(r).expect("report serializes") + "\n",
        Format::Csv => {
            let mut s = String::from("dir,domain,steps,density,brief,agent,arm,episodes,strict,rate,wilson_lo,wilson_hi,da_strict,da_rate");
            for ch in Channel::ALL {
                s += &format!(",{}", ch.name());
            }
            s += ",prompt_tokens,cached_tokens,completion_tokens,refused,silent_refusals,wall_s\n";
            for c in &r.cells {
                let g = |k: &str| {
                    c.config
                        .get(k)
                        .map(|v| v.to_string().trim_matches('"').to_string())
                        .unwrap_or_default()
                };
                for a in &c.arms {
                    let _ = write!(
                        s,
                        "{},{},{},{},{},{},{},{},{},{:.4},{:.4},{:.4},{},{:.4}",
                        c.dir,
                        g("domain"),
                        g("steps"),
                        g("density"),
                        g("brief"),
                        g("agent"),
                        a.arm,
                        a.episodes,
                        a.strict,
                        a.rate,
                        a.wilson95[0],
                        a.wilson95[1],
                        a.decline_aware.strict,
                        a.decline_aware.rate
                    );
                    for ch in Channel::ALL {
                        let _ = write!(s, ",{}", a.channels[ch.name()]);
                    }
                    let x = &a.accounting;
                    let _ = writeln!(
                        s,
                        ",{:.1},{:.1},{:.1},{},{},{:.3}",
                        x.prompt_tokens,
                        x.cached_tokens,
                        x.completion_tokens,
                        x.refused,
                        x.silent_refusals,
                        x.wall_s
                    );
                }
            }
            s
        }
        Format::Text | Format::Md => {
            let md = format == Format::Md;
            let mut s = String::new();
            for c in &r.cells {
                let title = cell_title(c);
                let sections = [
                    ("Ladder (strict episode success)", ladder_table(c)),
                    (
                        "Adjacent rungs (exact McNemar on shared seeds, Holm over the report)",
                        contrast_table(c),
                    ),
                    ("Error channels (primary scoring)", channel_table(c)),
                    ("Per-arm accounting", accounting_table(c)),
                    ("Directive obedience and matcher (gate arms)", gate_table(c)),
                    (
                        "Compile accuracy against the generator (module arms)",
                        compile_table(c),
                    ),
                ];
                if md {
                    let _ = writeln!(s, "### {title}\n");
                } else {
                    let _ = writeln!(s, "== {title}");
                }
                for (name, t) in sections {
                    if t.rows.is_empty() {
                        continue;
                    }
                    if md {
                        let _ = writeln!(s, "**{name}**\n\n{}", t.md());
                    } else {
                        let _ = writeln!(s, "{name}\n{}", t.text());
                    }
                }
            }
            s
        }
    }
}
