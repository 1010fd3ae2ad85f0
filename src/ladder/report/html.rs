//! The report as one self-contained HTML file: the tables, the figures
//! inline, and an episode browser (pick a cell, an arm and a seed; read
//! each turn's request, directive, reply, bookings with the gate's verdict,
//! label and channel). Nothing is fetched: styles, script and data are in
//! the file.

use std::collections::BTreeMap;

use serde::Serialize;

use super::aggregate::Report;
use super::figures::{self, Figure};
use super::render::html_tables;
use crate::ladder::run::runlog::{read_turns, RunRead};
use crate::ladder::run::runner::TurnRecord;
use crate::rundir::DirError;

const STYLE: &str = include_str!("page.css");
const SCRIPT: &str = include_str!("page.js");

/// One turn as the browser shows it.
#[derive(Debug, Clone, Serialize)]
struct BrowseTurn {
    turn: usize,
    kind: &'static str,
    step: String,
    request: String,
    /// The directive, the system-role addition, or empty.
    directive: String,
    replies: Vec<String>,
    /// Each booking and what became of it.
    bookings: Vec<String>,
    label: String,
    /// Violations (primary scoring); empty when the turn is correct.
    channels: Vec<String>,
}

impl BrowseTurn {
    fn of(t: &TurnRecord) -> BrowseTurn {
        let directive = match (&t.directive, &t.system_extra) {
            (Some(d), _) => d.text.clone(),
            (None, Some(x)) => x.clone(),
            (None, None) => String::new(),
        };
        let bookings = t
            .bookings
            .iter()
            .map(|b| {
                let what = match (&b.refusal, b.executed, b.current) {
                    (Some(r), _, _) => {
                        format!("refused by the gate: {}", r.reason(&b.line.line))
                    }
                    (None, true, _) => "executed".into(),
                    (None, false, false) => "re-displayed (not this turn's work order)".into(),
                    (None, false, true) => "names no step".into(),
                };
                let call = if b.call > 0 { " (re-prompt)" } else { "" };
                format!("{}{call}: {what}", b.line.line)
            })
            .collect();
        BrowseTurn {
            turn: t.turn,
            kind: t.kind.name(),
            step: t.step.map(|s| s.to_string()).unwrap_or_default(),
            request: t.request.clone(),
            directive,
            replies: t.replies.clone(),
            bookings,
            label: t.label.describe(),
            channels: t
                .violations
                .iter()
                .map(|v| format!("{} {}", v.channel.name(), v.step))
                .collect(),
        }
    }
}

/// A cell's episodes for the browser.
#[derive(Debug, Clone, Serialize)]
struct BrowseCell {
    name: String,
    arms: Vec<String>,
    seeds: Vec<u64>,
    /// `"arm|seed"` → turns.
    episodes: BTreeMap<String, Vec<BrowseTurn>>,
}

/// The finished turns of a run's first `seeds` seeds, by arm then seed.
fn turns_of(run: &RunRead, seeds: usize) -> Result<Vec<TurnRecord>, DirError> {
    let mut keep: Vec<u64> = run.episodes.iter().map(|e| e.seed).collect();
    keep.dedup();
    keep.truncate(seeds);
    let mut turns = Vec::new();
    for p in &run.paths {
        turns.extend(
            read_turns(p)?
                .into_iter()
                .filter(|t| keep.contains(&t.seed)),
        );
    }
    let arms = &run.manifest.config.arms;
    turns.sort_by_key(|t| (arms.iter().position(|a| *a == t.arm), t.seed, t.turn));
    Ok(turns)
}

/// The per-turn strip of a cell's first seed on every arm.
pub fn cell_strip(run: &RunRead) -> Result<Option<Figure>, DirError> {
    let turns = turns_of(run, 1)?;
    let Some(seed) = turns.first().map(|t| t.seed) else {
        return Ok(None);
    };
    let arms: Vec<(String, Vec<TurnRecord>)> = run
        .manifest
        .config
        .arms
        .iter()
        .map(|a| {
            let t: Vec<TurnRecord> = turns.iter().filter(|t| t.arm == *a).cloned().collect();
            (a.name().to_string(), t)
        })
        .filter(|(_, t)| !t.is_empty())
        .collect();
    Ok(Some(figures::strip(
        &run.dir.display().to_string(),
        seed,
        &arms,
    )))
}

/// Every figure of a report: success by S, channels, a strip per cell.
pub fn all_figures(report: &Report, runs: &[RunRead]) -> Result<Vec<Figure>, DirError> {
    let mut figs = figures::success_by_steps(report);
    figs.push(figures::channels(report));
    figs.extend(figures::spoof_obeyed(report));
    figs.extend(figures::faults_unrecovered(report));
    figs.extend(figures::escalations_asked(report));
    for run in runs {
        if let Some(f) = cell_strip(run)? {
            figs.push(f);
        }
    }
    Ok(figs)
}

/// The HTML page; the browser holds the first `seeds` seeds of each cell.
pub fn page(report: &Report, runs: &[RunRead], seeds: usize) -> Result<String, DirError> {
    let mut cells = Vec::new();
    for run in runs {
        let turns = turns_of(run, seeds)?;
        let mut episodes: BTreeMap<String, Vec<BrowseTurn>> = BTreeMap::new();
        let mut kept: Vec<u64> = Vec::new();
        for t in &turns {
            if !kept.contains(&t.seed) {
                kept.push(t.seed);
            }
            episodes
                .entry(format!("{}|{}", t.arm.name(), t.seed))
                .or_default()
                .push(BrowseTurn::of(t));
        }
        kept.sort_unstable();
        cells.push(BrowseCell {
            name: run.dir.display().to_string(),
            arms: run
                .manifest
                .config
                .arms
                .iter()
                .map(|a| a.name().to_string())
                .collect(),
            seeds: kept,
            episodes,
        });
    }
    // `</` cannot close the data block early.
    let data = serde_json::to_string(&serde_json::json!({ "cells": cells }))
        .expect("browser data serializes")
        .replace("</", "<\\/");
    let figs: String = all_figures(report, runs)?
        .into_iter()
        .map(|f| format!("<figure>\n{}</figure>\n", f.svg))
        .collect();
    Ok(format!(
        r#"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>statebench report</title>
<style>
{STYLE}</style>
</head>
<body>
<h1>statebench report</h1>
<p class="caption">{n} cell(s); strict success with Wilson 95% intervals, exact McNemar with Holm; decline-aware beside primary.</p>
<section id="tables">
{tables}</section>
<section id="figures">
<h2>Figures</h2>
{figs}</section>
<section id="browser">
<h2>Episodes</h2>
<p class="caption">The first {seeds} seeds of each cell. Turns with a violation are marked.</p>
<label>cell <select id="cell"></select></label>
<label>arm <select id="arm"></select></label>
<label>seed <select id="seed"></select></label>
<p id="summary"></p>
<table id="turns">
<thead><tr><th>turn</th><th>kind</th><th>request (as the agent read it)</th><th>directive</th><th>reply</th><th>bookings and the gate's verdict</th><th>label</th><th>channel</th></tr></thead>
<tbody></tbody>
</table>
</section>
<script type="application/json" id="data">{data}</script>
<script>
{SCRIPT}</script>
</body>
</html>
"#,
        n = report.cells.len(),
        tables = html_tables(report),
    ))
}
