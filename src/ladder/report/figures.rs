//! The paper's figures as SVG, written by hand (no plotting dependency):
//! strict success against S per rung with Wilson bars (Figure 1), error
//! channels stacked per arm (Figure 4), a per-turn strip of one episode
//! on each arm, and the probes' shares (forgeries obeyed, failed calls
//! left unrecovered) per arm.

use std::fmt::Write as _;

use super::aggregate::{ArmSummary, CellReport, Report, Share};
use super::render::{cell_fields, report_arms, varying};
use crate::ladder::run::runner::TurnRecord;
use crate::ladder::score::Channel;

/// One figure: a file name (without `.svg`), a title, the SVG text.
#[derive(Debug, Clone)]
pub struct Figure {
    pub name: String,
    pub title: String,
    pub svg: String,
}

/// Colours of the arms, in the order a report lists them.
const ARM_COLOURS: [&str; 11] = [
    "#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c",
    "#ccb974", "#64b5cd", "#2f4b7c",
];

/// Colours of the error channels, in [`Channel::ALL`] order.
const CHANNEL_COLOURS: [&str; 6] = [
    "#c44e52", "#8172b3", "#dd8452", "#4c72b0", "#937860", "#55a868",
];

/// A turn without a violation, in the strip.
const CORRECT: &str = "#d9d9d9";

/// A generous width of `s` at `size` pixels in a sans-serif font (0.62 em
/// a character; the widest common glyphs come near it), so that layouts
/// leave room for their text.
fn text_width(s: &str, size: f64) -> f64 {
    s.chars().count() as f64 * size * 0.62
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// An SVG document being drawn.
struct Svg {
    w: f64,
    h: f64,
    body: String,
}

impl Svg {
    fn new(w: f64, h: f64) -> Svg {
        Svg {
            w,
            h,
            body: String::new(),
        }
    }

    fn line(&mut self, (x1, y1): (f64, f64), (x2, y2): (f64, f64), stroke: &str, width: f64) {
        let _ = writeln!(
            self.body,
            r#"<line x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}" stroke="{stroke}" stroke-width="{width}"/>"#
        );
    }

    fn rect(&mut self, (x, y): (f64, f64), (w, h): (f64, f64), fill: &str, title: &str) {
        let _ = writeln!(
            self.body,
            r#"<rect x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{h:.1}" fill="{fill}"><title>{}</title></rect>"#,
            esc(title)
        );
    }

    fn circle(&mut self, (x, y): (f64, f64), r: f64, fill: &str, title: &str) {
        let _ = writeln!(
            self.body,
            r#"<circle cx="{x:.1}" cy="{y:.1}" r="{r}" fill="{fill}"><title>{}</title></circle>"#,
            esc(title)
        );
    }

    fn polyline(&mut self, pts: &[(f64, f64)], stroke: &str) {
        let p: Vec<String> = pts.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
        let _ = writeln!(
            self.body,
            r#"<polyline points="{}" fill="none" stroke="{stroke}" stroke-width="1.5"/>"#,
            p.join(" ")
        );
    }

    /// Text; `anchor` is start, middle or end; `rotate` turns it about its anchor.
    fn text(&mut self, (x, y): (f64, f64), s: &str, anchor: &str, size: f64, rotate: f64) {
        let _ = writeln!(
            self.body,
            r#"<text x="{x:.1}" y="{y:.1}" font-size="{size}" text-anchor="{anchor}" transform="rotate({rotate} {x:.1} {y:.1})">{}</text>"#,
            esc(s)
        );
    }

    /// A bar's name below the axis, slanted so that neighbours do not overlap.
    fn bar_name(&mut self, at: (f64, f64), name: &str) {
        self.text(at, name, "end", 10.0, -60.0);
    }

    fn finish(self, title: &str) -> String {
        format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\">\n<title>{t}</title>\n<rect width=\"{w}\" height=\"{h}\" fill=\"white\"/>\n{b}</svg>\n",
            w = self.w,
            h = self.h,
            t = esc(title),
            b = self.body
        )
    }
}

/// The rows of the report that share everything but S, each a figure.
fn groups_without_steps(r: &Report) -> Vec<(String, Vec<&CellReport>)> {
    let (vary, _) = varying(r);
    let mut groups: Vec<(String, Vec<&CellReport>)> = Vec::new();
    for c in &r.cells {
        let f = cell_fields(c);
        let key: Vec<String> = vary
            .iter()
            .filter(|&&k| f[k].0 != "S")
            .map(|&k| format!("{}={}", f[k].0, f[k].1))
            .collect();
        let key = key.join(" ");
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.push(c),
            None => groups.push((key, vec![c])),
        }
    }
    groups
}

/// File-name form of a group label.
fn slug(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// Strict success against S, one line per rung with Wilson 95% bars; one
/// figure per combination of the other fields that vary.
pub fn success_by_steps(r: &Report) -> Vec<Figure> {
    let arms = report_arms(r);
    groups_without_steps(r)
        .into_iter()
        .map(|(key, cells)| {
            let (w, h) = (640.0, 380.0);
            let (l, rt, t, b) = (56.0, 150.0, 36.0, 48.0);
            let mut steps: Vec<usize> = cells.iter().map(|c| c.config.episode.steps).collect();
            steps.sort_unstable();
            steps.dedup();
            let pw = w - l - rt;
            let x_of = |s: usize| {
                let i = steps.iter().position(|x| *x == s).unwrap_or(0) as f64;
                match steps.len() {
                    1 => l + pw / 2.0,
                    n => l + 20.0 + i * (pw - 40.0) / (n - 1) as f64,
                }
            };
            let y_of = |v: f64| t + (1.0 - v) * (h - t - b);
            let mut svg = Svg::new(w, h);
            for k in 0..=4 {
                let v = k as f64 / 4.0;
                svg.line((l, y_of(v)), (l + pw, y_of(v)), "#eeeeee", 1.0);
                svg.text(
                    (l - 6.0, y_of(v) + 4.0),
                    &format!("{v:.2}"),
                    "end",
                    11.0,
                    0.0,
                );
            }
            svg.line((l, y_of(0.0)), (l + pw, y_of(0.0)), "#333333", 1.0);
            svg.line((l, t), (l, y_of(0.0)), "#333333", 1.0);
            for &s in &steps {
                svg.text((x_of(s), h - b + 18.0), &s.to_string(), "middle", 11.0, 0.0);
            }
            svg.text((l + pw / 2.0, h - 10.0), "S (steps)", "middle", 12.0, 0.0);
            svg.text(
                (16.0, t + (h - t - b) / 2.0),
                "strict success",
                "middle",
                12.0,
                -90.0,
            );
            let title = if key.is_empty() {
                "Strict success by S (Wilson 95%)".to_string()
            } else {
                format!("Strict success by S (Wilson 95%): {key}")
            };
            svg.text((l, 20.0), &title, "start", 13.0, 0.0);
            let n = arms.len() as f64;
            for (k, arm) in arms.iter().enumerate() {
                let colour = ARM_COLOURS[k % ARM_COLOURS.len()];
                let dx = (k as f64 - (n - 1.0) / 2.0) * 5.0;
                let mut pts = Vec::new();
                for &s in &steps {
                    let Some(a) = cells
                        .iter()
                        .filter(|c| c.config.episode.steps == s)
                        .find_map(|c| c.arms.iter().find(|a| a.arm == *arm))
                    else {
                        continue;
                    };
                    let x = x_of(s) + dx;
                    let (lo, hi) = (y_of(a.wilson95[0]), y_of(a.wilson95[1]));
                    svg.line((x, lo), (x, hi), colour, 1.2);
                    svg.line((x - 3.0, lo), (x + 3.0, lo), colour, 1.2);
                    svg.line((x - 3.0, hi), (x + 3.0, hi), colour, 1.2);
                    let tip = format!(
                        "{arm}, S={s}: {}/{} = {:.2} [{:.2}, {:.2}]",
                        a.strict, a.episodes, a.rate, a.wilson95[0], a.wilson95[1]
                    );
                    svg.circle((x, y_of(a.rate)), 3.5, colour, &tip);
                    pts.push((x, y_of(a.rate)));
                }
                if pts.len() > 1 {
                    svg.polyline(&pts, colour);
                }
                let ly = t + 10.0 + k as f64 * 18.0;
                svg.line((w - rt + 16.0, ly), (w - rt + 36.0, ly), colour, 3.0);
                svg.text((w - rt + 42.0, ly + 4.0), arm, "start", 11.0, 0.0);
            }
            let name = if key.is_empty() {
                "success-by-S".to_string()
            } else {
                format!("success-by-S_{}", slug(&key))
            };
            Figure {
                name,
                svg: svg.finish(&title),
                title,
            }
        })
        .collect()
}

/// Violations per episode by channel (primary scoring), one stacked bar
/// per arm, arms grouped by cell.
pub fn channels(r: &Report) -> Figure {
    let (vary, _) = varying(r);
    let label = |c: &CellReport| {
        let f = cell_fields(c);
        let v: Vec<String> = vary
            .iter()
            .map(|&k| format!("{}={}", f[k].0, f[k].1))
            .collect();
        if v.is_empty() {
            c.dir.clone()
        } else {
            v.join(" ")
        }
    };
    let per_ep = |c: &CellReport, a: usize, ch: Channel| {
        let s = &c.arms[a];
        f64::from(s.channels[ch.name()]) / s.episodes.max(1) as f64
    };
    let tallest = r
        .cells
        .iter()
        .flat_map(|c| {
            (0..c.arms.len()).map(move |a| Channel::ALL.iter().map(|&ch| per_ep(c, a, ch)).sum())
        })
        .fold(0.0f64, f64::max);
    let step = tick_step(tallest / 4.0);
    let max = step * 4.0;
    let title = "Error channels per arm (violations per episode, primary scoring)";
    let (l, t, b) = (56.0, 36.0, 130.0);
    let (bw, gap) = (18.0, 24.0);
    // Each cell's group is as wide as its bars or its label, whichever is
    // wider; the legend as wide as its longest name; the figure as wide as
    // its title.
    let group =
        |c: &CellReport| (c.arms.len() as f64 * (bw + 4.0)).max(text_width(&label(c), 10.0));
    let pw: f64 = r.cells.iter().map(|c| group(c) + gap).sum();
    let legend = Channel::ALL
        .iter()
        .map(|ch| text_width(ch.name(), 11.0))
        .fold(0.0, f64::max);
    let rt = 34.0 + legend + 12.0;
    let w = (l + pw + rt).max(l + text_width(title, 13.0) + 12.0);
    let h = 400.0;
    let y_of = |v: f64| t + (1.0 - v / max) * (h - t - b);
    let mut svg = Svg::new(w, h);
    svg.text((l, 20.0), title, "start", 13.0, 0.0);
    for k in 0..=4 {
        let v = step * k as f64;
        svg.line((l, y_of(v)), (l + pw, y_of(v)), "#eeeeee", 1.0);
        svg.text(
            (l - 6.0, y_of(v) + 4.0),
            &format!("{}", (v * 1000.0).round() / 1000.0),
            "end",
            11.0,
            0.0,
        );
    }
    svg.line((l, y_of(0.0)), (l + pw, y_of(0.0)), "#333333", 1.0);
    let mut start = l + gap / 2.0;
    for c in &r.cells {
        let (gw, bars) = (group(c), c.arms.len() as f64 * (bw + 4.0));
        let mut x = start + (gw - bars) / 2.0;
        for (a, arm) in c.arms.iter().enumerate() {
            let mut y = y_of(0.0);
            for (ci, &ch) in Channel::ALL.iter().enumerate() {
                let v = per_ep(c, a, ch);
                if v > 0.0 {
                    let hgt = y_of(0.0) - y_of(v);
                    let tip = format!(
                        "{}, {}: {} {v:.2} per episode",
                        label(c),
                        arm.arm,
                        ch.name()
                    );
                    svg.rect((x, y - hgt), (bw, hgt), CHANNEL_COLOURS[ci], &tip);
                    y -= hgt;
                }
            }
            svg.bar_name((x + bw / 2.0, y_of(0.0) + 10.0), &arm.arm);
            x += bw + 4.0;
        }
        svg.text((start + gw / 2.0, h - 12.0), &label(c), "middle", 10.0, 0.0);
        start += gw + gap;
    }
    for (ci, ch) in Channel::ALL.iter().enumerate() {
        let ly = t + 10.0 + ci as f64 * 18.0;
        svg.rect(
            (w - rt + 16.0, ly - 8.0),
            (12.0, 12.0),
            CHANNEL_COLOURS[ci],
            ch.name(),
        );
        svg.text((w - rt + 34.0, ly + 2.0), ch.name(), "start", 11.0, 0.0);
    }
    Figure {
        name: "channels".into(),
        title: title.into(),
        svg: svg.finish(title),
    }
}

/// The spoof probe: per cell that ran it, the share of forgeries each arm
/// obeyed, with Wilson 95% whiskers; None when no cell ran the probe.
pub fn spoof_obeyed(r: &Report) -> Option<Figure> {
    probe_shares(
        r,
        ("spoof", "spoof"),
        "Spoofed state: share of forgeries obeyed per arm (Wilson 95%)",
        |a| a.spoof.as_ref().map(|s| &s.obeyed_share),
    )
}

/// The tool-faults probe: per cell that ran it, the share of due steps
/// whose failed call each arm left unrecovered, with Wilson 95% whiskers.
pub fn faults_unrecovered(r: &Report) -> Option<Figure> {
    probe_shares(
        r,
        ("faults", "tool_faults"),
        "Tools that fail: share of due steps left unrecovered per arm (Wilson 95%)",
        |a| a.faults.as_ref().map(|f| &f.unrecovered_share),
    )
}

/// The escalation probe: per cell that ran it, the share of refusals each
/// gated arm's agent escalated, with Wilson 95% whiskers.
pub fn escalations_asked(r: &Report) -> Option<Figure> {
    probe_shares(
        r,
        ("escalation", "escalation"),
        "Escalation: share of refusals the agent asked the user to authorize (Wilson 95%)",
        |a| a.escalations.as_ref().map(|e| &e.asked_share),
    )
}

/// A probe's share per arm as bars with whiskers, one group per cell that
/// ran it (`name`: the figure's file and the cell field of the probe).
fn probe_shares(
    r: &Report,
    (name, probe): (&str, &str),
    title: &str,
    share: impl Fn(&ArmSummary) -> Option<&Share>,
) -> Option<Figure> {
    let cells: Vec<&CellReport> = r
        .cells
        .iter()
        .filter(|c| c.arms.iter().any(|a| share(a).is_some()))
        .collect();
    if cells.is_empty() {
        return None;
    }
    let label = |c: &CellReport| {
        let f = cell_fields(c);
        let model = &f[0].1;
        let rate = f.iter().find(|x| x.0 == probe).map_or("", |x| x.1.as_str());
        format!("{model} {probe}={rate}")
    };
    let (l, t, b) = (56.0, 36.0, 130.0);
    let (bw, gap) = (18.0, 24.0);
    let group =
        |c: &CellReport| (c.arms.len() as f64 * (bw + 4.0)).max(text_width(&label(c), 10.0));
    let pw: f64 = cells.iter().map(|c| group(c) + gap).sum();
    let w = (l + pw + 12.0).max(l + text_width(title, 13.0) + 12.0);
    let h = 400.0;
    let y_of = |v: f64| t + (1.0 - v) * (h - t - b);
    let mut svg = Svg::new(w, h);
    svg.text((l, 20.0), title, "start", 13.0, 0.0);
    for k in 0..=4 {
        let v = 0.25 * k as f64;
        svg.line((l, y_of(v)), (l + pw, y_of(v)), "#eeeeee", 1.0);
        svg.text((l - 6.0, y_of(v) + 4.0), &format!("{v}"), "end", 11.0, 0.0);
    }
    svg.line((l, y_of(0.0)), (l + pw, y_of(0.0)), "#333333", 1.0);
    let mut start = l + gap / 2.0;
    for c in &cells {
        let (gw, bars) = (group(c), c.arms.len() as f64 * (bw + 4.0));
        let mut x = start + (gw - bars) / 2.0;
        for (a, arm) in c.arms.iter().enumerate() {
            if let Some(o) = share(arm) {
                let tip = format!(
                    "{}, {}: {}/{} = {:.2} [{:.2}, {:.2}]",
                    label(c),
                    arm.arm,
                    o.count,
                    o.of,
                    o.rate,
                    o.wilson95[0],
                    o.wilson95[1]
                );
                let colour = ARM_COLOURS[a % ARM_COLOURS.len()];
                let top = y_of(o.rate);
                svg.rect((x, top), (bw, y_of(0.0) - top), colour, &tip);
                let mid = x + bw / 2.0;
                let (lo, hi) = (y_of(o.wilson95[0]), y_of(o.wilson95[1]));
                svg.line((mid, lo), (mid, hi), "#333333", 1.0);
                svg.line((mid - 4.0, lo), (mid + 4.0, lo), "#333333", 1.0);
                svg.line((mid - 4.0, hi), (mid + 4.0, hi), "#333333", 1.0);
            }
            svg.bar_name((x + bw / 2.0, y_of(0.0) + 10.0), &arm.arm);
            x += bw + 4.0;
        }
        svg.text((start + gw / 2.0, h - 12.0), &label(c), "middle", 10.0, 0.0);
        start += gw + gap;
    }
    Some(Figure {
        name: name.into(),
        title: title.into(),
        svg: svg.finish(title),
    })
}

/// The smallest round step (1, 2, 2.5 or 5 times a power of ten, at
/// least 0.25) not below `raw`, so the axis reads in round numbers.
fn tick_step(raw: f64) -> f64 {
    let mut p = 0.1f64;
    loop {
        for m in [1.0, 2.0, 2.5, 5.0] {
            let s = m * p;
            if s >= raw && s >= 0.25 {
                return s;
            }
        }
        p *= 10.0;
    }
}

/// The short name of a turn kind in the strip.
fn kind_mark(kind: &str) -> &'static str {
    match kind {
        "ask" => "A",
        "re_ask" => "R",
        "premature" => "P",
        "redo_probe" => "D",
        "superseded_cue" => "S",
        "legit_redo" => "L",
        "revision" => "V",
        "ambiguous" => "?",
        _ => "·",
    }
}

/// One episode on each arm, a square per turn: grey when the turn is
/// correct, else the colour of its first violation's channel; a dot where
/// the gate refused a booking. The top row names each turn's kind (A ask,
/// R re-ask, P premature, D redo probe, S superseded cue, L legitimate
/// redo, V revision, ? ambiguous, · filler).
pub fn strip(cell: &str, seed: u64, arms: &[(String, Vec<TurnRecord>)]) -> Figure {
    let turns = arms.iter().map(|(_, t)| t.len()).max().unwrap_or(0);
    let (l, t, cw, rh) = (130.0, 44.0, 13.0, 18.0);
    let w = (l + turns as f64 * cw + 20.0).max(420.0);
    let h = t + 18.0 + arms.len() as f64 * rh + 70.0;
    let mut svg = Svg::new(w, h);
    let title = format!("Per-turn strip: {cell}, seed {seed}");
    svg.text((8.0, 18.0), &title, "start", 13.0, 0.0);
    if let Some((_, first)) = arms.first() {
        for tr in first {
            let x = l + tr.turn as f64 * cw;
            svg.text(
                (x + cw / 2.0, t + 8.0),
                kind_mark(tr.kind.name()),
                "middle",
                9.0,
                0.0,
            );
        }
    }
    for (row, (arm, turns)) in arms.iter().enumerate() {
        let y = t + 16.0 + row as f64 * rh;
        svg.text((l - 8.0, y + 11.0), arm, "end", 11.0, 0.0);
        for tr in turns {
            let x = l + tr.turn as f64 * cw;
            let (fill, what) = match tr.violations.first() {
                Some(v) => {
                    let i = Channel::ALL
                        .iter()
                        .position(|c| *c == v.channel)
                        .unwrap_or(0);
                    (
                        CHANNEL_COLOURS[i],
                        format!("{} {}", v.channel.name(), v.step),
                    )
                }
                None => (CORRECT, "correct".to_string()),
            };
            let tip = format!(
                "turn {} {}: {}; {}",
                tr.turn,
                tr.kind.name(),
                tr.label.describe(),
                what
            );
            svg.rect((x, y), (cw - 2.0, rh - 4.0), fill, &tip);
            if tr.bookings.iter().any(|b| b.refusal.is_some()) {
                svg.circle(
                    (x + (cw - 2.0) / 2.0, y + (rh - 4.0) / 2.0),
                    2.0,
                    "#000000",
                    "refused by the gate",
                );
            }
        }
    }
    let ly = t + 16.0 + arms.len() as f64 * rh + 14.0;
    let mut x = 8.0;
    for (i, ch) in Channel::ALL.iter().enumerate() {
        svg.rect((x, ly), (10.0, 10.0), CHANNEL_COLOURS[i], ch.name());
        svg.text((x + 14.0, ly + 9.0), ch.name(), "start", 10.0, 0.0);
        x += 16.0 + ch.name().len() as f64 * 6.0;
    }
    svg.rect((x, ly), (10.0, 10.0), CORRECT, "correct");
    svg.text((x + 14.0, ly + 9.0), "correct", "start", 10.0, 0.0);
    svg.text(
        (8.0, ly + 30.0),
        "A ask, R re-ask, P premature, D redo probe, S superseded cue, L legitimate redo, V revision, ? ambiguous, · filler; dot: refused by the gate",
        "start",
        10.0,
        0.0,
    );
    Figure {
        name: format!("strip_{}_seed{seed}", slug(cell)),
        svg: svg.finish(&title),
        title,
    }
}
