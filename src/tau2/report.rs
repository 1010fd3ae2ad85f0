//! The τ² run's measurements, read from its directory: per arm pass^k
//! (τ²'s estimator), pass1 and wrongful writes with Wilson intervals, mean
//! reward, refusals by rule, terminations, tokens and seconds; each arm
//! against raw on the same (task, trial) with an exact McNemar test (Holm
//! across arms) and the paired pass1 difference with a bootstrap interval
//! over tasks; and the compiles' agreement with the reference rule set.
//! Reads files only; never calls a model.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Serialize;

pub use super::evaluate::pass_hat_k;
use super::reader::ReceiptReader;
use super::record::{Arm, EpisodeRecord};
use super::study::{self, CompileRecord, Episodes, Manifest, RuleSource, StudyError};
use crate::rng::Rng;
use crate::stats::{holm, mcnemar_exact, wilson};
use crate::table::Table;

/// Seed of the paired bootstrap (fixed, so a report reads the same twice).
pub const BOOTSTRAP_SEED: u64 = 20240515;
/// Resamples of the paired bootstrap.
pub const BOOTSTRAP_RESAMPLES: usize = 10_000;
/// pass^k is reported for k = 1..=MAX_K.
pub const MAX_K: usize = 4;

/// τ²'s success: a reward of 1 (within 1e-6).
pub fn success(r: &EpisodeRecord) -> bool {
    (r.reward.reward - 1.0).abs() <= 1e-6
}

/// A count out of a total with its 95% Wilson interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Rate {
    pub k: usize,
    pub n: usize,
    pub rate: Option<f64>,
    pub lo: f64,
    pub hi: f64,
}

impl Rate {
    pub fn new(k: usize, n: usize) -> Rate {
        let (lo, hi) = wilson(k as u64, n as u64);
        Rate {
            k,
            n,
            rate: (n > 0).then(|| k as f64 / n as f64),
            lo,
            hi,
        }
    }

    fn text(&self) -> String {
        match self.rate {
            None => "–".into(),
            Some(r) => format!(
                "{}/{} = {r:.3} [{:.3}, {:.3}]",
                self.k, self.n, self.lo, self.hi
            ),
        }
    }
}

/// One arm's measurements over its finished episodes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ArmSummary {
    pub arm: Arm,
    pub episodes: usize,
    pub tasks: usize,
    /// pass^1..pass^MAX_K, mean over tasks; None where some task has fewer
    /// trials than k (τ² caps k at the fewest trials of any task).
    pub pass_hat: Vec<Option<f64>>,
    /// Episodes with reward 1, of all episodes.
    pub pass1: Rate,
    pub mean_reward: Option<f64>,
    /// Episodes in which a write the reference rules forbid ran.
    pub wrongful_writes: Rate,
    /// Calls refused at dispatch, by rule name.
    pub refusals: BTreeMap<String, usize>,
    /// Episodes by termination reason (τ²'s names).
    pub terminations: BTreeMap<String, usize>,
    /// Means per episode (one task run).
    pub agent_prompt_tokens: f64,
    pub agent_completion_tokens: f64,
    pub user_prompt_tokens: f64,
    pub user_completion_tokens: f64,
    pub secs: f64,
    /// The matcher's readings of the arm's episodes, totalled.
    pub matcher: MatcherSummary,
}

/// The matcher's readings on one arm, against the lexical reading of the
/// same receipts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MatcherSummary {
    pub readings: usize,
    /// Replies that were not the JSON asked (read as no and none).
    pub unreadable: usize,
    /// Readings of a confirmation: the matcher's yes, the lexical yes, and
    /// how many agree, of all read.
    pub confirmations: usize,
    pub matcher_yes: usize,
    pub lexical_yes: usize,
    pub confirmation_agreement: Rate,
    /// Readings of a cancellation's reason, and how many name the same
    /// reason (or none) as the lexical reading.
    pub reason_agreement: Rate,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}

/// Totals the readings of an arm's episodes.
pub fn matcher_summary(eps: &[&EpisodeRecord]) -> MatcherSummary {
    let readings: Vec<_> = eps.iter().flat_map(|r| &r.readings).collect();
    let confirmations: Vec<(bool, bool)> = readings
        .iter()
        .filter(|r| r.asked.confirmation)
        .map(|r| {
            (
                r.read.confirmed.unwrap_or(false),
                r.lexical.confirmed.unwrap_or(false),
            )
        })
        .collect();
    let reasons: Vec<_> = readings.iter().filter(|r| r.asked.reason).collect();
    MatcherSummary {
        readings: readings.len(),
        unreadable: readings.iter().filter(|r| r.error.is_some()).count(),
        confirmations: confirmations.len(),
        matcher_yes: confirmations.iter().filter(|c| c.0).count(),
        lexical_yes: confirmations.iter().filter(|c| c.1).count(),
        confirmation_agreement: Rate::new(
            confirmations.iter().filter(|c| c.0 == c.1).count(),
            confirmations.len(),
        ),
        reason_agreement: Rate::new(
            reasons
                .iter()
                .filter(|r| r.read.reason == r.lexical.reason)
                .count(),
            reasons.len(),
        ),
        prompt_tokens: readings.iter().map(|r| r.usage.prompt_tokens).sum(),
        completion_tokens: readings.iter().map(|r| r.usage.completion_tokens).sum(),
    }
}

/// One arm against raw on the (task, trial) pairs both finished.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Paired {
    pub arm: Arm,
    pub pairs: usize,
    /// Pairs raw passed and the arm failed, and the other way round.
    pub raw_only: usize,
    pub arm_only: usize,
    pub mcnemar_p: f64,
    /// Holm-adjusted across the arms compared.
    pub holm_p: f64,
    /// Mean over pairs of (arm passed) − (raw passed); None without pairs.
    pub diff: Option<f64>,
    /// 95% percentile bootstrap interval of `diff`, resampling tasks.
    pub diff_ci: Option<(f64, f64)>,
}

/// One compile as the report lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompileRow {
    pub index: usize,
    pub seed: u64,
    pub parsed: bool,
    /// The parse error, or the model's failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Fields agreeing with the reference, of all fields.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agreeing: Option<(usize, usize)>,
    pub completion_tokens: usize,
}

/// Compile variance: every compile, and per field how many parsed
/// compiles differ from the reference there.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompileSummary {
    pub asked: usize,
    pub parsed: usize,
    pub rows: Vec<CompileRow>,
    /// Field → parsed compiles differing from the reference in it (fields
    /// every parsed compile agrees on are not listed).
    pub differing: BTreeMap<String, usize>,
}

/// Everything `tau2 report` prints.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub dir: String,
    pub model: String,
    /// None: the agent's model played the user.
    pub user_model: Option<String>,
    pub task_file: String,
    pub tasks: usize,
    pub trials: u32,
    pub rules: RuleSource,
    /// Who read the notice and gate arms' receipts, and the matcher's model.
    pub receipts: ReceiptReader,
    /// The τ² source files whose wording the prompts took, with their
    /// sha256; empty: statebench's wording.
    pub tau2_src_sha256: BTreeMap<String, String>,
    pub matcher: Option<String>,
    pub finished: usize,
    /// (task, arm, trial) keys whose only lines are failed model calls.
    pub unfinished: usize,
    pub duplicates: usize,
    pub arms: Vec<ArmSummary>,
    pub paired: Vec<Paired>,
    pub bootstrap_seed: u64,
    pub bootstrap_resamples: usize,
    pub compiles: CompileSummary,
}

impl Report {
    /// Reads a run directory.
    pub fn read(dir: &Path) -> Result<Report, StudyError> {
        let manifest = Manifest::read(dir)?;
        let episodes = study::read_episodes(dir, &manifest)?;
        let compiles = study::read_compiles(dir, &manifest)?;
        Ok(build(
            &dir.display().to_string(),
            &manifest,
            &episodes,
            &compiles,
        ))
    }

    /// Aligned text tables.
    pub fn text(&self) -> String {
        self.render(|t| t.text(), false)
    }

    /// Markdown.
    pub fn md(&self) -> String {
        self.render(|t| t.md(), true)
    }

    /// JSON of every number.
    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).expect("reports serialize") + "\n"
    }

    fn render(&self, table: impl Fn(&Table) -> String, md: bool) -> String {
        let mut s = self.header(md);
        for (title, body) in self.sections() {
            s += &if md {
                format!("\n## {title}\n\n")
            } else {
                format!("\n{title}\n")
            };
            s += &match body {
                Body::Table(t) => table(&t),
                Body::Text(text) => text + "\n",
            };
        }
        s
    }

    /// The run: where, which model and simulator, which rules, how many
    /// episodes counted.
    fn header(&self, md: bool) -> String {
        let rules = match self.rules {
            RuleSource::Compiled if self.compiles.parsed == 0 => format!(
                "compiled by the agent's model, but none of {} compiles parsed",
                self.compiles.asked
            ),
            RuleSource::Compiled => format!(
                "compiled by the agent's model ({} of {} compiles parsed; trial t uses parsed compile t mod {})",
                self.compiles.parsed, self.compiles.asked, self.compiles.parsed
            ),
            RuleSource::Reference => {
                "the hand-written reference (validation run: not the model's own rules)".into()
            }
        };
        let receipts = match (&self.receipts, &self.matcher) {
            (ReceiptReader::Model, Some(m)) => format!("read by the matcher model {m}"),
            _ => "read lexically (words and phrases)".to_string(),
        };
        let wording = match self.tau2_src_sha256.is_empty() {
            true => "statebench's wording".to_string(),
            false => format!(
                "τ²'s own, from --tau2-src ({})",
                self.tau2_src_sha256
                    .iter()
                    .map(|(f, h)| format!("{f} {}", &h[..h.len().min(12)]))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        let (title, gap) = if md { ("# ", "\n") } else { ("", "") };
        format!(
            "{title}τ²-bench airline: {}\n\
             {gap}model: {}; user simulator: {}; {} tasks of {} × {} trials; rule arms' rules: {rules}; notice and gate receipts: {receipts}; prompts and tool descriptions: {wording}\n\
             {gap}episodes: {} finished, {} unfinished (a failed model call; run again on resume), {} duplicate lines not counted\n",
            self.dir,
            self.model,
            self.user_model.as_deref().unwrap_or("the same model"),
            self.tasks,
            self.task_file,
            self.trials,
            self.finished,
            self.unfinished,
            self.duplicates
        )
    }

    /// The report's sections, titled, in order.
    fn sections(&self) -> Vec<(String, Body)> {
        let mut out = vec![
            (
                "Arms (per episode means; pass^k as τ² estimates it, mean over tasks of C(c,k)/C(n,k))"
                    .to_string(),
                Body::Table(self.arms_table()),
            ),
            ("Terminations".into(), self.terminations()),
            ("Refusals at dispatch, by rule".into(), self.refusals()),
        ];
        if self.receipts == ReceiptReader::Model {
            out.push((
                "Receipts read by the matcher, against the lexical reading of the same receipts"
                    .into(),
                Body::or_none(
                    self.matcher_table(),
                    "no readings: no notice or gate arm judged a write that needs one",
                ),
            ));
        }
        if !self.paired.is_empty() {
            out.push((
                format!(
                    "Against raw on the same (task, trial): exact McNemar, Holm across arms; pass1 difference with a 95% bootstrap interval ({} resamples of tasks, seed {})",
                    self.bootstrap_resamples, self.bootstrap_seed
                ),
                Body::Table(self.paired_table()),
            ));
        }
        if self.compiles.asked > 0 {
            out.push((
                format!(
                    "Compiles: {} of {} parsed",
                    self.compiles.parsed, self.compiles.asked
                ),
                Body::Table(self.compiles_table()),
            ));
            if self.compiles.parsed > 0 {
                out.push((
                    "Fields differing from the reference".into(),
                    self.differing_fields(),
                ));
            }
        }
        out
    }

    fn arms_table(&self) -> Table {
        let mut t = Table::new(&[
            "arm",
            "episodes",
            "pass^1",
            "pass^2",
            "pass^3",
            "pass^4",
            "pass1 [95% Wilson]",
            "mean reward",
            "wrongful writes [95% Wilson]",
            "agent tokens",
            "user tokens",
            "seconds",
        ]);
        for a in &self.arms {
            let mut row = vec![a.arm.name().to_string(), a.episodes.to_string()];
            row.extend(a.pass_hat.iter().map(|p| num(*p)));
            row.push(a.pass1.text());
            row.push(num(a.mean_reward));
            row.push(a.wrongful_writes.text());
            row.push(format!(
                "{:.0}",
                a.agent_prompt_tokens + a.agent_completion_tokens
            ));
            row.push(format!(
                "{:.0}",
                a.user_prompt_tokens + a.user_completion_tokens
            ));
            row.push(format!("{:.1}", a.secs));
            t.row(row);
        }
        t
    }

    fn matcher_table(&self) -> Table {
        let mut t = Table::new(&[
            "arm",
            "readings",
            "unreadable",
            "confirmations read",
            "matcher yes",
            "lexical yes",
            "confirmation agreement [95% Wilson]",
            "reason agreement [95% Wilson]",
            "matcher tokens",
        ]);
        for a in self.arms.iter().filter(|a| a.matcher.readings > 0) {
            let m = &a.matcher;
            t.row(vec![
                a.arm.name().into(),
                m.readings.to_string(),
                m.unreadable.to_string(),
                m.confirmations.to_string(),
                m.matcher_yes.to_string(),
                m.lexical_yes.to_string(),
                m.confirmation_agreement.text(),
                m.reason_agreement.text(),
                (m.prompt_tokens + m.completion_tokens).to_string(),
            ]);
        }
        t
    }

    fn terminations(&self) -> Body {
        let reasons: BTreeSet<&String> = self
            .arms
            .iter()
            .flat_map(|a| a.terminations.keys())
            .collect();
        let mut head = vec!["arm".to_string()];
        head.extend(reasons.iter().map(|r| r.to_string()));
        let mut t = Table::new(&head);
        for a in &self.arms {
            let mut row = vec![a.arm.name().to_string()];
            row.extend(
                reasons
                    .iter()
                    .map(|r| a.terminations.get(*r).copied().unwrap_or(0).to_string()),
            );
            t.row(row);
        }
        Body::or_none(t, "none")
    }

    fn refusals(&self) -> Body {
        let mut t = Table::new(&["arm", "rule", "calls refused"]);
        for a in &self.arms {
            for (rule, n) in &a.refusals {
                t.row(vec![a.arm.name().into(), rule.clone(), n.to_string()]);
            }
        }
        Body::or_none(t, "none")
    }

    fn paired_table(&self) -> Table {
        let mut t = Table::new(&[
            "arm",
            "pairs",
            "raw only",
            "arm only",
            "McNemar p",
            "Holm p",
            "Δ pass1 [95% bootstrap]",
        ]);
        for p in &self.paired {
            t.row(vec![
                p.arm.name().into(),
                p.pairs.to_string(),
                p.raw_only.to_string(),
                p.arm_only.to_string(),
                format!("{:.4}", p.mcnemar_p),
                format!("{:.4}", p.holm_p),
                match (p.diff, p.diff_ci) {
                    (Some(d), Some((lo, hi))) => format!("{d:+.3} [{lo:+.3}, {hi:+.3}]"),
                    _ => "–".into(),
                },
            ]);
        }
        t
    }

    fn compiles_table(&self) -> Table {
        let mut t = Table::new(&[
            "compile",
            "seed",
            "parsed",
            "agrees with reference",
            "tokens",
            "error",
        ]);
        for c in &self.compiles.rows {
            t.row(vec![
                c.index.to_string(),
                c.seed.to_string(),
                if c.parsed { "yes" } else { "no" }.into(),
                c.agreeing
                    .map_or("–".into(), |(a, n)| format!("{a}/{n} fields")),
                c.completion_tokens.to_string(),
                c.error.as_deref().map_or(String::new(), one_line),
            ]);
        }
        t
    }

    fn differing_fields(&self) -> Body {
        let mut t = Table::new(&["field", "parsed compiles differing"]);
        for (f, n) in &self.compiles.differing {
            t.row(vec![f.clone(), format!("{n}/{}", self.compiles.parsed)]);
        }
        Body::or_none(
            t,
            "none: every parsed compile agrees with the reference in every field",
        )
    }
}

/// A report section's content: a table, or a line saying it has none.
enum Body {
    Table(Table),
    Text(String),
}

impl Body {
    fn or_none(t: Table, none: &str) -> Body {
        if t.rows.is_empty() {
            Body::Text(none.into())
        } else {
            Body::Table(t)
        }
    }
}

fn num(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| format!("{v:.3}"))
}

/// A message cut to one table cell.
fn one_line(s: &str) -> String {
    let line = s.lines().next().unwrap_or("");
    let mut out: String = line.chars().take(100).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

/// The report of a manifest, its episodes and its compiles.
pub fn build(
    dir: &str,
    manifest: &Manifest,
    episodes: &Episodes,
    compiles: &[CompileRecord],
) -> Report {
    let c = &manifest.config;
    let arms: Vec<ArmSummary> = c
        .arms
        .iter()
        .map(|&arm| {
            let eps: Vec<&EpisodeRecord> =
                episodes.finished.iter().filter(|r| r.arm == arm).collect();
            summarize(arm, &eps)
        })
        .collect();
    let mut paired: Vec<Paired> = c
        .arms
        .iter()
        .filter(|&&a| a != Arm::Raw && c.arms.contains(&Arm::Raw))
        .map(|&arm| pair(arm, &episodes.finished))
        .collect();
    let adjusted = holm(&paired.iter().map(|p| p.mcnemar_p).collect::<Vec<_>>());
    for (p, h) in paired.iter_mut().zip(adjusted) {
        p.holm_p = h;
    }
    Report {
        dir: dir.into(),
        model: manifest.model.name().into(),
        user_model: c.user_model.as_ref().map(|m| m.name().to_string()),
        task_file: c.task_file.file_name().into(),
        tasks: c.tasks.len(),
        trials: c.trials,
        rules: c.rules,
        receipts: c.receipts,
        tau2_src_sha256: c.tau2_src_sha256.clone(),
        matcher: c.matcher.as_ref().map(|m| m.name().to_string()),
        finished: episodes.finished.len(),
        unfinished: episodes.unfinished.len(),
        duplicates: episodes.duplicates,
        arms,
        paired,
        bootstrap_seed: BOOTSTRAP_SEED,
        bootstrap_resamples: BOOTSTRAP_RESAMPLES,
        compiles: compile_summary(compiles),
    }
}

/// One arm's measurements.
pub fn summarize(arm: Arm, eps: &[&EpisodeRecord]) -> ArmSummary {
    let n = eps.len();
    let mut by_task: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for r in eps {
        let e = by_task.entry(&r.task_id).or_default();
        e.0 += usize::from(success(r));
        e.1 += 1;
    }
    let pass_hat = (1..=MAX_K)
        .map(|k| {
            let per_task: Option<Vec<f64>> = by_task
                .values()
                .map(|&(c, n)| pass_hat_k(c, n, k))
                .collect();
            per_task
                .filter(|v| !v.is_empty())
                .map(|v| v.iter().sum::<f64>() / v.len() as f64)
        })
        .collect();
    let mut refusals = BTreeMap::new();
    for call in eps.iter().flat_map(|r| &r.calls) {
        for rule in &call.refused_by {
            *refusals.entry(rule.clone()).or_insert(0) += 1;
        }
    }
    let mut terminations = BTreeMap::new();
    for r in eps {
        *terminations
            .entry(crate::table::field(&r.termination))
            .or_insert(0) += 1;
    }
    let mean = |f: &dyn Fn(&EpisodeRecord) -> f64| {
        if n == 0 {
            0.0
        } else {
            eps.iter().map(|r| f(r)).sum::<f64>() / n as f64
        }
    };
    ArmSummary {
        arm,
        episodes: n,
        tasks: by_task.len(),
        pass_hat,
        pass1: Rate::new(eps.iter().filter(|r| success(r)).count(), n),
        mean_reward: (n > 0).then(|| mean(&|r| r.reward.reward)),
        wrongful_writes: Rate::new(eps.iter().filter(|r| r.wrongful_write()).count(), n),
        refusals,
        terminations,
        agent_prompt_tokens: mean(&|r| r.agent_usage.prompt_tokens as f64),
        agent_completion_tokens: mean(&|r| r.agent_usage.completion_tokens as f64),
        user_prompt_tokens: mean(&|r| r.user_usage.prompt_tokens as f64),
        user_completion_tokens: mean(&|r| r.user_usage.completion_tokens as f64),
        secs: mean(&|r| r.secs),
        matcher: matcher_summary(eps),
    }
}

/// `arm` against raw on the (task, trial) pairs both finished (Holm's
/// adjustment is filled in by the caller, across arms).
pub fn pair(arm: Arm, finished: &[EpisodeRecord]) -> Paired {
    let outcome = |a: Arm| -> BTreeMap<(&str, u32), bool> {
        finished
            .iter()
            .filter(|r| r.arm == a)
            .map(|r| ((r.task_id.as_str(), r.trial), success(r)))
            .collect()
    };
    let (raw, other) = (outcome(Arm::Raw), outcome(arm));
    // Per task: the pairs' differences (arm − raw), for the bootstrap.
    let mut by_task: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let (mut raw_only, mut arm_only) = (0, 0);
    for (key, &r) in &raw {
        let Some(&a) = other.get(key) else { continue };
        raw_only += usize::from(r && !a);
        arm_only += usize::from(a && !r);
        by_task
            .entry(key.0)
            .or_default()
            .push(f64::from(u8::from(a)) - f64::from(u8::from(r)));
    }
    let groups: Vec<Vec<f64>> = by_task.into_values().collect();
    let pairs: usize = groups.iter().map(Vec::len).sum();
    let diff = mean_of(&groups);
    let diff_ci = diff.map(|_| bootstrap(&groups, BOOTSTRAP_SEED, BOOTSTRAP_RESAMPLES));
    Paired {
        arm,
        pairs,
        raw_only,
        arm_only,
        mcnemar_p: mcnemar_exact(raw_only as u64, arm_only as u64),
        holm_p: 1.0,
        diff,
        diff_ci,
    }
}

/// Mean of every value of the groups together.
fn mean_of(groups: &[Vec<f64>]) -> Option<f64> {
    let n: usize = groups.iter().map(Vec::len).sum();
    (n > 0).then(|| groups.iter().flatten().sum::<f64>() / n as f64)
}

/// 95% percentile bootstrap interval of the mean of all values, resampling
/// whole groups (tasks) with replacement: a task's trials are not
/// independent of each other, its pairs move together. (0, 0) without data.
pub fn bootstrap(groups: &[Vec<f64>], seed: u64, resamples: usize) -> (f64, f64) {
    if groups.is_empty() || resamples == 0 {
        return (0.0, 0.0);
    }
    let sums: Vec<(f64, usize)> = groups
        .iter()
        .map(|g| (g.iter().sum::<f64>(), g.len()))
        .collect();
    let mut rng = Rng::new(seed);
    let mut means: Vec<f64> = (0..resamples)
        .map(|_| {
            let (mut s, mut n) = (0.0, 0);
            for _ in 0..sums.len() {
                let (gs, gn) = sums[rng.below(sums.len())];
                s += gs;
                n += gn;
            }
            if n == 0 {
                0.0
            } else {
                s / n as f64
            }
        })
        .collect();
    means.sort_by(f64::total_cmp);
    let at = |q: f64| means[((q * (resamples - 1) as f64).round() as usize).min(resamples - 1)];
    (at(0.025), at(0.975))
}

/// Compile variance from the compile log.
pub fn compile_summary(compiles: &[CompileRecord]) -> CompileSummary {
    let mut differing = BTreeMap::new();
    for a in compiles.iter().filter_map(|c| c.agreement.as_ref()) {
        for f in &a.differing {
            *differing.entry(f.clone()).or_insert(0) += 1;
        }
    }
    CompileSummary {
        asked: compiles.len(),
        parsed: compiles.iter().filter(|c| c.parsed()).count(),
        rows: compiles
            .iter()
            .map(|c| CompileRow {
                index: c.index,
                seed: c.seed,
                parsed: c.parsed(),
                error: c.error.clone().or_else(|| c.backend_error.clone()),
                agreeing: c.agreement.as_ref().map(|a| (a.agreeing, a.fields)),
                completion_tokens: c.usage.completion_tokens,
            })
            .collect(),
        differing,
    }
}
