//! Rendering a report: the ladder, contrast, channel, accounting, obedience
//! and compile tables as aligned text or Markdown, one CSV row per cell and
//! arm, or the JSON document described in the book (docs/src/reports.md).

use std::fmt::Write as _;

use super::aggregate::{
    probe_on, probe_rate, ArmSummary, CellReport, Comparison, ProbeControl, Report, Share,
};
use crate::ladder::arms::gate::DirectiveKind;
use crate::ladder::probes::spoof::ForgeryKind;
use crate::ladder::run::cell::{AgentSpec, CellConfig};
use crate::ladder::run::grid::labels;
use crate::ladder::score::Channel;
use crate::table::field;
use crate::table::Table;

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned terminal tables.
    Text,
    /// Markdown tables.
    Md,
    /// Comma-separated values, one row per cell and arm.
    Csv,
    /// The JSON document described in the book (docs/src/reports.md).
    Json,
}

/// The model as titles and tables name it (its file or hub name), or the
/// scripted agent.
fn model_label(c: &CellReport) -> String {
    match (&c.model, &c.config.agent) {
        (Some(file), AgentSpec::Model { name: Some(_) }) => file.clone(),
        (_, AgentSpec::Model { name: Some(name) }) => name.clone(),
        (_, agent) => agent.to_string(),
    }
}

/// The agent as titles name it: the model by [`model_label`], a scripted
/// agent by its own name.
fn agent_label(c: &CellReport) -> String {
    match &c.config.agent {
        AgentSpec::Model { name: Some(_) } => format!("model:{}", model_label(c)),
        agent => agent.to_string(),
    }
}

fn cell_title(c: &CellReport) -> String {
    let g = &c.config;
    let e = &g.episode;
    let mut probes = String::new();
    if let Some(r) = g.options.spoof {
        probes += &format!(" spoof={}", field(&r));
    }
    if let Some(r) = g.options.tool_faults {
        probes += &format!(" tool_faults={}", field(&r));
    }
    if g.options.escalation {
        probes += " escalation=on";
    }
    format!(
        "{} S={} rho={} brief={} protocol={} agent={} episodes={} seeds {}..{probes}",
        field(&e.domain),
        e.steps,
        field(&e.density),
        field(&e.brief),
        field(&e.protocol),
        field(&agent_label(c)),
        g.episodes,
        g.seed_start,
    )
}

fn fmt_p(p: f64) -> String {
    if p < 1e-3 {
        format!("{p:.1e}")
    } else {
        format!("{p:.3}")
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

fn memory_table(c: &CellReport) -> Table {
    let embedder = c
        .config
        .embedder
        .as_ref()
        .map(|e| e.to_string())
        .unwrap_or_default();
    let writer = c
        .config
        .memory_writer
        .map(|w| field(&w))
        .unwrap_or_default();
    Table {
        head: [
            "arm",
            "embedder",
            "writer",
            "embed calls/ep",
            "embed tok/ep",
            "writer calls/ep",
            "writer prompt tok/ep",
            "writer completion tok/ep",
            "memories at end",
            "failed writes",
            "rejected ops",
            "failed embeds",
        ]
        .map(String::from)
        .to_vec(),
        rows: c
            .arms
            .iter()
            .filter_map(|a| a.memory.as_ref().map(|m| (a, m)))
            .map(|(a, m)| {
                let facts = a.arm.starts_with("mem0");
                vec![
                    a.arm.clone(),
                    embedder.clone(),
                    if facts { writer.clone() } else { "-".into() },
                    format!("{:.1}", m.embed_calls),
                    format!("{:.0}", m.embed_tokens),
                    format!("{:.1}", m.writer_calls),
                    format!("{:.0}", m.writer_prompt_tokens),
                    format!("{:.0}", m.writer_completion_tokens),
                    format!("{:.1}", m.items),
                    m.writer_failures.to_string(),
                    m.ops_rejected.to_string(),
                    m.embed_failures.to_string(),
                ]
            })
            .collect(),
    }
}

fn trap_table(c: &CellReport) -> Table {
    Table {
        head: [
            "arm",
            "redo probes",
            "re-executions",
            "says done, then books",
            "books without saying so",
            "share saying done",
        ]
        .map(String::from)
        .to_vec(),
        rows: c
            .arms
            .iter()
            .filter_map(|a| a.trap.map(|t| (a, t)))
            .map(|(a, t)| {
                vec![
                    a.arm.clone(),
                    t.probes.to_string(),
                    t.re_executions.to_string(),
                    t.says_done.to_string(),
                    t.silent.to_string(),
                    format!("{:.2}", f64::from(t.says_done) / f64::from(t.re_executions)),
                ]
            })
            .collect(),
    }
}

fn tool_table(c: &CellReport) -> Table {
    Table {
        head: [
            "arm",
            "agent calls/turn",
            "refused calls/ep",
            "malformed calls/ep",
        ]
        .map(String::from)
        .to_vec(),
        rows: c
            .arms
            .iter()
            .filter_map(|a| a.tools.as_ref().map(|t| (a, t)))
            .map(|(a, t)| {
                vec![
                    a.arm.clone(),
                    format!("{:.2}", t.agent_calls_per_turn),
                    format!("{:.2}", t.refused),
                    format!("{:.2}", t.malformed),
                ]
            })
            .collect(),
    }
}

/// A share as `count/of = rate [lo, hi]`.
fn share(s: &Share) -> String {
    format!(
        "{}/{} = {:.2} [{:.2}, {:.2}]",
        s.count, s.of, s.rate, s.wilson95[0], s.wilson95[1]
    )
}

fn spoof_table(c: &CellReport) -> Table {
    let mut head: Vec<String> = ["arm", "spoofs obeyed [Wilson 95%]"]
        .map(String::from)
        .to_vec();
    head.extend(ForgeryKind::ALL.iter().map(|k| k.name().to_string()));
    head.push("flipped against the control [Wilson 95%]".into());
    head.push("strict: spoofed / control, McNemar p".into());
    Table {
        head,
        rows: c
            .arms
            .iter()
            .filter_map(|a| a.spoof.as_ref().map(|s| (a, s)))
            .map(|(a, s)| {
                let mut row = vec![a.arm.clone(), share(&s.obeyed_share)];
                row.extend(ForgeryKind::ALL.iter().map(|k| match s.by_kind.get(k) {
                    Some(x) => format!("{}/{}", x.count, x.of),
                    None => "-".into(),
                }));
                row.push(s.flipped.as_ref().map_or_else(|| "-".into(), share));
                row.push(control_cell(s.control.as_ref()));
                row
            })
            .collect(),
    }
}

fn control_cell(control: Option<&ProbeControl>) -> String {
    match control {
        Some(x) => format!(
            "{}/{} vs {}/{}, p = {}",
            x.strict[0],
            x.shared,
            x.strict[1],
            x.shared,
            fmt_p(x.p)
        ),
        None => "no control cell in the report".into(),
    }
}

fn fault_table(c: &CellReport) -> Table {
    Table {
        head: [
            "arm",
            "failed calls",
            "unrecovered due steps [Wilson 95%]",
            "re-executions after a failed call",
            "strict: with faults / control, McNemar p",
        ]
        .map(String::from)
        .to_vec(),
        rows: c
            .arms
            .iter()
            .filter_map(|a| a.faults.as_ref().map(|f| (a, f)))
            .map(|(a, f)| {
                vec![
                    a.arm.clone(),
                    f.injected.to_string(),
                    share(&f.unrecovered_share),
                    f.re_executions.to_string(),
                    control_cell(f.control.as_ref()),
                ]
            })
            .collect(),
    }
}

fn escalation_table(c: &CellReport) -> Table {
    Table {
        head: [
            "arm",
            "refusals escalated [Wilson 95%]",
            "granted",
            "declined",
            "wrongful admissions",
            "strict: with escalation / control, McNemar p",
        ]
        .map(String::from)
        .to_vec(),
        rows: c
            .arms
            .iter()
            .filter_map(|a| a.escalations.as_ref().map(|e| (a, e)))
            .map(|(a, e)| {
                vec![
                    a.arm.clone(),
                    share(&e.asked_share),
                    e.granted.to_string(),
                    e.declined.to_string(),
                    e.wrongful.to_string(),
                    control_cell(e.control.as_ref()),
                ]
            })
            .collect(),
    }
}

fn failed_table(c: &CellReport) -> Table {
    Table {
        head: ["arm", "failed episodes", "failed calls"]
            .map(String::from)
            .to_vec(),
        rows: c
            .arms
            .iter()
            .filter(|a| a.failed_episodes > 0)
            .map(|a| {
                vec![
                    a.arm.clone(),
                    a.failed_episodes.to_string(),
                    a.failed_calls.to_string(),
                ]
            })
            .collect(),
    }
}

fn duplicates_table(c: &CellReport) -> Table {
    Table {
        head: vec!["duplicate lines dropped".into()],
        rows: (c.duplicates > 0)
            .then(|| vec![c.duplicates.to_string()])
            .into_iter()
            .collect(),
    }
}

/// Renders the report.
pub fn render(r: &Report, format: Format) -> String {
    match format {
        Format::Json => serde_json::to_string_pretty(r).expect("report serializes") + "\n",
        Format::Csv => csv(r),
        Format::Text => tables(r, Style::Text),
        Format::Md => tables(r, Style::Md),
    }
}

/// One row per cell and arm.
fn csv(r: &Report) -> String {
    let mut s = String::from("dir,domain,steps,density,brief,protocol,paraphrase_tier,ambiguous_rate,thinking,seed_start,agent,arm,episodes,strict,rate,wilson_lo,wilson_hi,da_strict,da_rate,da_wilson_lo,da_wilson_hi");
    for ch in Channel::ALL {
        s += &format!(",{}", ch.name());
    }
    s += ",prompt_tokens,cached_tokens,completion_tokens,refused,silent_refusals,wall_s,failed_episodes,failed_calls,duplicates";
    s += PROBE_CSV_HEAD;
    s.push('\n');
    for c in &r.cells {
        let g = &c.config;
        let e = &g.episode;
        for a in &c.arms {
            let _ = write!(
                s,
                "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{:.4},{:.4},{:.4},{},{:.4},{:.4},{:.4}",
                c.dir,
                field(&e.domain),
                e.steps,
                field(&e.density),
                field(&e.brief),
                field(&e.protocol),
                e.paraphrase_tier,
                field(&e.ambiguous_rate),
                g.thinking,
                g.seed_start,
                field(&g.agent),
                a.arm,
                a.episodes,
                a.strict,
                a.rate,
                a.wilson95[0],
                a.wilson95[1],
                a.decline_aware.strict,
                a.decline_aware.rate,
                a.decline_aware.wilson95[0],
                a.decline_aware.wilson95[1]
            );
            for ch in Channel::ALL {
                let _ = write!(s, ",{}", a.channels[ch.name()]);
            }
            let x = &a.accounting;
            let _ = write!(
                s,
                ",{:.1},{:.1},{:.1},{},{},{:.3},{},{},{}",
                x.prompt_tokens,
                x.cached_tokens,
                x.completion_tokens,
                x.refused,
                x.silent_refusals,
                x.wall_s,
                a.failed_episodes,
                a.failed_calls,
                c.duplicates
            );
            s += &probe_csv(g, a);
            s.push('\n');
        }
    }
    s
}

/// The probe columns of a CSV row: each probe's setting (`off` where the
/// cell did not run it, so a grid over rates keeps its cells apart), then
/// its counts, empty where the arm has none (a probe off, or escalation on
/// an ungated arm). Per-kind spoof counts are in the JSON report.
const PROBE_CSV_HEAD: &str = ",spoof,tool_faults,escalation,\
spoof_turns,spoof_obeyed,spoof_contested,spoof_flipped,\
faults_injected,faults_due_turns,faults_unrecovered,faults_re_executions,\
escalation_refusals,escalation_asked,escalation_granted,escalation_declined,escalation_wrongful";

fn probe_csv(g: &CellConfig, a: &ArmSummary) -> String {
    let counts = |n: &[u64]| n.iter().map(|v| format!(",{v}")).collect::<String>();
    let mut s = format!(
        ",{},{},{}",
        probe_rate(g.options.spoof),
        probe_rate(g.options.tool_faults),
        probe_on(g.options.escalation)
    );
    s += &match &a.spoof {
        Some(p) => {
            counts(&[p.turns, p.obeyed])
                + &p.flipped
                    .map_or_else(|| ",,".into(), |f| counts(&[f.of, f.count]))
        }
        None => ",,,,".into(),
    };
    s += &match &a.faults {
        Some(f) => counts(&[
            f.injected,
            f.unrecovered_share.of,
            f.unrecovered,
            f.re_executions,
        ]),
        None => ",,,,".into(),
    };
    s += &match &a.escalations {
        Some(e) => counts(&[e.asked_share.of, e.asked, e.granted, e.declined, e.wrongful]),
        None => ",,,,,".into(),
    };
    s
}

/// The configuration fields a grid varies, as (column, value) per cell:
/// the model, the grid's axes as they label cells, the episodes.
pub(crate) fn cell_fields(c: &CellReport) -> Vec<(&'static str, String)> {
    let mut fields = vec![("model", model_label(c))];
    fields.extend(labels(&c.config).into_iter().map(|(a, v)| (a.label, v)));
    fields.push(("episodes", c.config.episodes.to_string()));
    fields.push(("spoof", probe_rate(c.config.options.spoof)));
    fields.push(("tool_faults", probe_rate(c.config.options.tool_faults)));
    fields.push(("escalation", probe_on(c.config.options.escalation)));
    fields
}

/// The probes among [`cell_fields`]: not a setting of a report where no cell ran them.
const PROBE_FIELDS: [&str; 3] = ["spoof", "tool_faults", "escalation"];

/// The fields that vary across the report's cells, and the fixed ones.
pub(crate) fn varying(r: &Report) -> (Vec<usize>, Vec<(&'static str, String)>) {
    let all: Vec<_> = r.cells.iter().map(cell_fields).collect();
    let mut vary = Vec::new();
    let mut fixed = Vec::new();
    for k in 0..all[0].len() {
        if all.iter().any(|f| f[k].1 != all[0][k].1) {
            vary.push(k);
        } else if !(PROBE_FIELDS.contains(&all[0][k].0) && all[0][k].1 == "off") {
            // A probe no cell ran is not a setting of the report.
            fixed.push(all[0][k].clone());
        }
    }
    (vary, fixed)
}

/// The columns that name a report's cells (the fields that vary), and
/// each cell's values in them.
struct RowNames {
    head: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl RowNames {
    fn of(r: &Report) -> RowNames {
        let (vary, _) = varying(r);
        let fields: Vec<_> = r.cells.iter().map(cell_fields).collect();
        RowNames {
            head: vary.iter().map(|&k| fields[0][k].0.to_string()).collect(),
            rows: fields
                .iter()
                .map(|f| vary.iter().map(|&k| f[k].1.clone()).collect())
                .collect(),
        }
    }
}

/// Every arm of the report, in the order cells list them.
pub(crate) fn report_arms(r: &Report) -> Vec<String> {
    let mut arms: Vec<String> = Vec::new();
    for c in &r.cells {
        for a in &c.arms {
            if !arms.contains(&a.arm) {
                arms.push(a.arm.clone());
            }
        }
    }
    arms
}

/// The paper's Table 2 layout: one row per cell (the fields that vary),
/// one column per rung: strict rate, Wilson 95% interval, and the
/// decline-aware rate beside it.
fn grid_table(r: &Report) -> Table {
    let names = RowNames::of(r);
    let arms = report_arms(r);
    let mut head = names.head;
    head.extend(arms.iter().cloned());
    let rows = r
        .cells
        .iter()
        .zip(names.rows)
        .map(|(c, mut row)| {
            row.extend(
                arms.iter()
                    .map(|arm| match c.arms.iter().find(|a| a.arm == *arm) {
                        Some(a) => format!(
                            "{:.2} [{:.2}, {:.2}] / {:.2}",
                            a.rate, a.wilson95[0], a.wilson95[1], a.decline_aware.rate
                        ),
                        None => "-".into(),
                    }),
            );
            row
        })
        .collect();
    Table { head, rows }
}

/// Adjacent-rung contrasts of every cell, Holm-adjusted over the report.
fn grid_contrast_table(r: &Report) -> Table {
    let names = RowNames::of(r);
    let mut pairs: Vec<String> = Vec::new();
    for c in &r.cells {
        for x in &c.contrasts {
            let p = format!("{} -> {}", x.a, x.b);
            if !pairs.contains(&p) {
                pairs.push(p);
            }
        }
    }
    let mut head = names.head;
    head.extend(pairs.iter().cloned());
    let rows = r
        .cells
        .iter()
        .zip(names.rows)
        .map(|(c, mut row)| {
            row.extend(pairs.iter().map(|p| {
                match c
                    .contrasts
                    .iter()
                    .find(|x| format!("{} -> {}", x.a, x.b) == *p)
                {
                    Some(x) => format!("{} / {}", fmt_p(x.p_holm), fmt_p(x.decline_aware.p_holm)),
                    None => "-".into(),
                }
            }));
            row
        })
        .collect();
    Table { head, rows }
}

/// Error channels (primary scoring), one row per cell and arm.
fn grid_channel_table(r: &Report) -> Table {
    let names = RowNames::of(r);
    let mut head = names.head;
    head.push("arm".into());
    head.extend(Channel::ALL.iter().map(|ch| ch.name().to_string()));
    let mut rows = Vec::new();
    for (c, prefix) in r.cells.iter().zip(&names.rows) {
        for a in &c.arms {
            let mut row = prefix.clone();
            row.push(a.arm.clone());
            row.extend(
                Channel::ALL
                    .iter()
                    .map(|ch| a.channels[ch.name()].to_string()),
            );
            rows.push(row);
        }
    }
    Table { head, rows }
}

/// How tables and headings are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Style {
    Text,
    Md,
    Html,
}

impl Style {
    fn heading(self, level: usize, text: &str) -> String {
        match self {
            Style::Text => format!("{} {text}\n", "=".repeat(level)),
            Style::Md => format!("{} {text}\n\n", "#".repeat(level + 1)),
            Style::Html => format!(
                "<h{l}>{}</h{l}>\n",
                text.replace('&', "&amp;").replace('<', "&lt;"),
                l = level + 1
            ),
        }
    }

    fn section(self, name: &str, t: &Table) -> String {
        match self {
            Style::Text => format!("{name}\n{}\n", t.text()),
            Style::Md => format!("**{name}**\n\n{}\n", t.md()),
            Style::Html => format!("<p class=\"caption\">{name}</p>\n{}", t.html()),
        }
    }
}

/// The grid's tables, for a report of more than one cell.
fn grid_tables(r: &Report, style: Style) -> String {
    let (_, fixed) = varying(r);
    let fixed: Vec<String> = fixed.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let sections = [
        (
            "Strict episode success: rate [Wilson 95%] / decline-aware rate",
            grid_table(r),
        ),
        (
            "Adjacent rungs: exact McNemar p on shared seeds, Holm over the table (primary / decline-aware)",
            grid_contrast_table(r),
        ),
        ("Error channels (primary scoring)", grid_channel_table(r)),
    ];
    let title = format!("Grid ({} cells; {})", r.cells.len(), fixed.join(" "));
    let mut s = style.heading(1, &title);
    for (name, t) in sections {
        s += &style.section(name, &t);
    }
    s
}

/// A paired comparison as one table, `first / second` in each column.
fn comparison_table(c: &Comparison) -> Table {
    let pair = |a: &dyn std::fmt::Display, b: &dyn std::fmt::Display| format!("{a} / {b}");
    Table {
        head: [
            "arm",
            "shared seeds",
            "strict",
            "McNemar p",
            "Holm p",
            "decline-aware",
            "DA p",
            "DA Holm p",
            "matcher agreement",
            "ambiguous booked / asked",
        ]
        .map(String::from)
        .to_vec(),
        rows: c
            .arms
            .iter()
            .map(|x| {
                vec![
                    x.arm.clone(),
                    x.shared.to_string(),
                    pair(&x.strict[0], &x.strict[1]),
                    fmt_p(x.p),
                    fmt_p(x.p_holm),
                    pair(&x.decline_aware[0], &x.decline_aware[1]),
                    fmt_p(x.decline_aware_p.p),
                    fmt_p(x.decline_aware_p.p_holm),
                    x.matcher_agreement
                        .map(|m| format!("{:.3} / {:.3}", m[0], m[1]))
                        .unwrap_or_else(|| "-".into()),
                    format!(
                        "{}/{} / {}/{}",
                        x.ambiguous_booked[0],
                        x.ambiguous[0],
                        x.ambiguous_booked[1],
                        x.ambiguous[1]
                    ),
                ]
            })
            .collect(),
    }
}

/// The paired comparisons: cells that differ in one setting, on shared seeds.
fn comparison_tables(r: &Report, style: Style) -> String {
    let mut s = String::new();
    for c in &r.comparisons {
        let title = format!(
            "{}: {} ({}) vs {} ({}) on shared seeds; Holm over the arms",
            c.setting, c.values[0], c.cells[0], c.values[1], c.cells[1]
        );
        s += &style.section(&title, &comparison_table(c));
    }
    if !s.is_empty() {
        s = style.heading(1, "Paired comparisons (cells differing in one setting)") + &s;
    }
    s
}

/// Every table of every cell; a report of several cells opens with the
/// grid's tables and the paired comparisons.
fn tables(r: &Report, style: Style) -> String {
    let mut s = String::new();
    if r.cells.len() > 1 {
        s += &grid_tables(r, style);
        s += &comparison_tables(r, style);
    }
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
            ("Retrieval memory (per episode)", memory_table(c)),
            ("Tool calls at dispatch (native harness)", tool_table(c)),
            (
                "Trap-turn probe (re-executions on redo probes, A.4)",
                trap_table(c),
            ),
            (
                "Spoofed state (forgeries in the user's text followed rather than the state; control: the same cell without the probe)",
                spoof_table(c),
            ),
            (
                "Tools that fail (transient errors on admitted calls; control: the same cell without the probe)",
                fault_table(c),
            ),
            (
                "Escalation (refusals the agent asked the user to authorize; control: the same cell without the probe)",
                escalation_table(c),
            ),
            (
                "Failed agent calls (their episodes are kept out of every table above; a resume runs them again)",
                failed_table(c),
            ),
            (
                "Run log (lines written more than once, each counted once)",
                duplicates_table(c),
            ),
        ];
        s += &style.heading(2, &title);
        for (name, t) in sections {
            if !t.rows.is_empty() {
                s += &style.section(name, &t);
            }
        }
    }
    s
}

/// Every table as HTML, for the HTML report.
pub(crate) fn html_tables(r: &Report) -> String {
    tables(r, Style::Html)
}
