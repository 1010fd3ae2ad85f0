//! The study's measurements, read from a run directory: formation,
//! memory fidelity against the ledger, per-arm decisions with Wilson
//! intervals, paired exact McNemar tests with Holm's adjustment, and the
//! attribution predicate. Reads files only; never calls a model.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

use super::case::{Case, Decision, Trap};
use super::events::BatchError;
use super::executor::score;
use super::executor::{Class, EvidenceArm};
use super::ledger::Ledger;
use super::profile::{false_authority, gate, Fidelity, Rejection, FIELDS};
use super::study::{check_bundle, read_trials, Manifest, PlannedCall, StudyError, Trial, BUNDLE};
use super::writer::{Attempt, Failure, Formed, Inadmissible, Memory, Selected};
use crate::rundir::read_jsonl;
use crate::stats::{holm, mcnemar_exact, wilson};
use crate::table::Table;

fn rate(k: usize, n: usize) -> String {
    if n == 0 {
        return "–".into();
    }
    let (lo, hi) = wilson(k as u64, n as u64);
    format!("{k}/{n} = {:.2} [{lo:.2}, {hi:.2}]", k as f64 / n as f64)
}

/// Scores a trial again from its recorded calls and its frozen case (a
/// backend error stays one).
pub fn rescore(cases: &[Case], t: &mut Trial) {
    let found = cases
        .iter()
        .filter(|c| c.id == t.case)
        .flat_map(|c| c.requests.iter().map(move |r| (c, r)))
        .find(|(_, r)| r.id == t.request);
    if let (Some((case, r)), true) = (found, t.class != Class::Error) {
        let ledger = Ledger::through(case, r.checkpoint);
        let s = score(case.domain.file(), ledger.profile(), r, &t.calls);
        t.class = s.class;
        t.correct = s.correct;
        t.unauthorized = s.unauthorized;
        t.over_refusal = s.over_refusal;
    }
}

/// A failed attempt's kind, for counting (the messages name records and ids).
fn rejection_kind(failure: &Failure) -> &'static str {
    use BatchError as B;
    use Inadmissible as I;
    use Rejection as R;
    let rejection = match failure {
        Failure::Inadmissible(i) => i,
        Failure::Backend(_) => return OTHER,
    };
    match rejection {
        I::Profile(R::NoJson) => "no JSON object",
        I::Profile(R::Json(_)) => "not valid JSON",
        I::Profile(R::Identity(_)) => "wrong profile identity",
        I::Profile(R::Schema(_)) => "not the profile schema",
        I::EventsSchema(_) => "not the events schema",
        I::Profile(R::Uncited { .. }) | I::Batch(B::Uncited { .. }) => {
            "a record or event cites no source"
        }
        I::Profile(R::Unseen { .. }) | I::Batch(B::Unseen { .. }) | I::NotesUnseen(_) => {
            "cites a source not yet seen"
        }
        I::Profile(R::Duplicate(_)) => "duplicate record id",
        I::Batch(B::Missing { .. }) => "an event names a grant the state lacks",
        I::Batch(B::Exists { .. }) => "an event issues an existing id",
        I::Profile(R::Capacity { .. }) => "over capacity",
        I::EmptyNotes => "empty notes",
        // A batch too long, an event's expiry not a date: the table has
        // never named them, and counts them with the failures it does not.
        I::Batch(B::TooMany { .. } | B::Expires { .. }) => OTHER,
    }
}

/// The kind of every failure the rejection table does not name.
const OTHER: &str = "backend error or other";

/// Paired outcome of two arms on the same requests.
#[derive(Debug, Clone, PartialEq)]
pub struct Paired {
    pub a: EvidenceArm,
    pub b: EvidenceArm,
    pub n: usize,
    /// `a` correct, `b` not.
    pub a_only: usize,
    /// `b` correct, `a` not.
    pub b_only: usize,
    pub p: f64,
}

/// Everything `eal report` prints, as numbers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Measurements {
    /// Per arm: trials, correct, unauthorized of denied, denied, over-refusals
    /// of permitted, permitted, classes.
    pub arms: BTreeMap<EvidenceArm, ArmRow>,
    /// Per memory arm (written, gated, oracle_exact): fidelity summed over
    /// the requests' checkpoints, and requests with false authority.
    pub fidelity: BTreeMap<EvidenceArm, (Fidelity, usize)>,
    pub paired: Vec<Paired>,
    /// Requests meeting the attribution predicate, and the cases they fall in.
    pub attributed: Vec<String>,
    pub attributed_cases: usize,
    /// Per trap and arm: (correct, trials).
    pub by_trap: BTreeMap<(Trap, EvidenceArm), (usize, usize)>,
}

/// One arm's decisions.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ArmRow {
    pub trials: usize,
    pub correct: usize,
    /// Unauthorized acts on denied requests.
    pub unauthorized: usize,
    pub denied: usize,
    /// Acts beyond every grant on requests the ledger permits (another
    /// counterparty, category or amount than requested).
    pub unauthorized_permitted: usize,
    pub over_refusal: usize,
    pub permitted: usize,
    pub classes: BTreeMap<Class, usize>,
}

/// Reads a run directory's files.
pub struct Run {
    pub manifest: Manifest,
    pub cases: Vec<Case>,
    pub attempts: Vec<Attempt>,
    pub memories: Vec<Formed>,
    pub selections: Vec<Selected>,
    pub plan: Vec<PlannedCall>,
    pub trials: Vec<Trial>,
}

impl Run {
    pub fn read(dir: &Path) -> Result<Run, StudyError> {
        let manifest = Manifest::read(dir)?;
        if dir.join(BUNDLE).exists() {
            check_bundle(dir)?;
        }
        let cases: Vec<Case> = read_jsonl(&dir.join("cases.jsonl"))?;
        // The last trial of each call (a resume retries backend errors),
        // scored again from its calls: the scorer is a function of the
        // frozen case and the reply, so a report always applies today's.
        let mut trials = read_trials(dir, &manifest)?;
        trials.sort_by(|a, b| a.call.cmp(&b.call));
        for t in &mut trials {
            rescore(&cases, t);
        }
        Ok(Run {
            manifest,
            cases,
            attempts: read_jsonl(&dir.join("attempts.jsonl"))?,
            memories: read_jsonl(&dir.join("memories.jsonl"))?,
            selections: read_jsonl(&dir.join("selections.jsonl"))?,
            plan: read_jsonl(&dir.join("plan.jsonl"))?,
            trials,
        })
    }

    /// The written memory a checkpoint's requests read: the chain's, or the
    /// selected candidate's.
    pub fn written(&self, case: &str, checkpoint: usize) -> Option<&Memory> {
        let chosen = self
            .selections
            .iter()
            .find(|s| s.case == case && s.checkpoint == checkpoint)
            .map_or(0, |s| s.chosen);
        self.memories
            .iter()
            .find(|f| f.case == case && f.block == checkpoint && f.candidate == chosen)
            .map(|f| &f.memory)
    }

    /// The numbers of the report.
    pub fn measure(&self) -> Measurements {
        let mut m = Measurements::default();
        let trial = |req: &str, arm: EvidenceArm| {
            self.trials
                .iter()
                .find(|t| t.request == req && t.arm == arm && t.class != Class::Error)
        };
        for t in &self.trials {
            let row = m.arms.entry(t.arm).or_default();
            *row.classes.entry(t.class).or_default() += 1;
            if t.class == Class::Error {
                // Not a decision: left out of every rate and test.
                continue;
            }
            row.trials += 1;
            row.correct += usize::from(t.correct);
            let permitted = t.expected == Decision::Submit;
            row.denied += usize::from(!permitted);
            row.permitted += usize::from(permitted);
            row.unauthorized += usize::from(t.unauthorized && !permitted);
            row.unauthorized_permitted += usize::from(t.unauthorized && permitted);
            row.over_refusal += usize::from(t.over_refusal);
            let e = m.by_trap.entry((t.trap, t.arm)).or_default();
            e.0 += usize::from(t.correct);
            e.1 += 1;
        }
        let arms: Vec<EvidenceArm> = self.manifest.config.arms.clone();
        for case in &self.cases {
            for r in &case.requests {
                let truth = Ledger::through(case, r.checkpoint).profile().clone();
                let written = self
                    .written(&case.id, r.checkpoint)
                    .and_then(|m| m.profile())
                    .cloned();
                let mut memories = vec![(EvidenceArm::OracleExact, Some(truth.clone()))];
                if let Some(w) = written {
                    memories.push((EvidenceArm::Gated, Some(gate(&w, case, r.checkpoint).0)));
                    memories.push((EvidenceArm::Written, Some(w)));
                }
                for (arm, memory) in memories {
                    let Some(memory) = memory else { continue };
                    if !arms.contains(&arm) {
                        continue;
                    }
                    let e = m.fidelity.entry(arm).or_default();
                    e.0.add(&Fidelity::of(&memory, &truth));
                    e.1 += usize::from(false_authority(&memory, r));
                    if arm == EvidenceArm::Written && false_authority(&memory, r) {
                        let took = |a: EvidenceArm| {
                            trial(&r.id, a).is_some_and(|t| t.class == Class::Exact)
                        };
                        let oracle_ran = trial(&r.id, EvidenceArm::OracleExact).is_some();
                        if took(EvidenceArm::Written)
                            && oracle_ran
                            && !took(EvidenceArm::OracleExact)
                        {
                            m.attributed.push(r.id.clone());
                        }
                    }
                }
            }
        }
        let cases: std::collections::BTreeSet<&str> = m
            .attributed
            .iter()
            .filter_map(|r| r.rsplit_once('/').map(|(c, _)| c))
            .collect();
        m.attributed_cases = cases.len();
        let pairs = [
            (EvidenceArm::Written, EvidenceArm::OracleExact),
            (EvidenceArm::Gated, EvidenceArm::Written),
            (EvidenceArm::FullHistory, EvidenceArm::Written),
        ];
        for (a, b) in pairs {
            if !(arms.contains(&a) && arms.contains(&b)) {
                continue;
            }
            let mut p = Paired {
                a,
                b,
                n: 0,
                a_only: 0,
                b_only: 0,
                p: 1.0,
            };
            for ta in self
                .trials
                .iter()
                .filter(|t| t.arm == a && t.class != Class::Error)
            {
                if let Some(tb) = trial(&ta.request, b) {
                    p.n += 1;
                    p.a_only += usize::from(ta.correct && !tb.correct);
                    p.b_only += usize::from(tb.correct && !ta.correct);
                }
            }
            p.p = mcnemar_exact(p.a_only as u64, p.b_only as u64);
            m.paired.push(p);
        }
        m
    }

    /// The report as Markdown.
    pub fn render(&self) -> String {
        let m = self.measure();
        let c = &self.manifest.config;
        let mut out = String::new();
        let model = self.manifest.model.name();
        let requests: usize = self.cases.iter().map(|c| c.requests.len()).sum();
        let _ = writeln!(
            out,
            "EAL study: {} cases of {} (seed {}), {requests} requests; writer {:?} ({:?}), executor {:?}; model {model}",
            self.cases.len(),
            c.domain.name(),
            c.seed,
            c.writer,
            c.formation,
            c.executor,
        );
        let _ = writeln!(
            out,
            "trials {} of {} planned\n",
            self.trials.len(),
            self.plan.len()
        );
        self.formation(&mut out);
        self.fidelity(&mut out, &m);
        self.decisions(&mut out, &m);
        self.by_trap(&mut out, &m);
        self.paired(&mut out, &m);
        self.attribution(&mut out, &m);
        out
    }

    /// Writer updates, their verdicts and the best-of-k selections.
    fn formation(&self, out: &mut String) {
        let c = &self.manifest.config;
        if !self.attempts.is_empty() {
            let updates = self.memories.len();
            // Counts over every chain of a best-of-k pool.
            let first = self
                .attempts
                .iter()
                .filter(|a| a.attempt == 1 && a.accepted)
                .count();
            let repaired = self
                .attempts
                .iter()
                .filter(|a| a.attempt == 2 && a.accepted)
                .count();
            let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
            for a in self.attempts.iter().filter(|a| !a.accepted) {
                let kind = a.error.as_ref().map_or(OTHER, rejection_kind);
                *reasons.entry(kind.into()).or_default() += 1;
            }
            let tokens: usize = self
                .attempts
                .iter()
                .map(|a| a.usage.prompt_tokens + a.usage.completion_tokens)
                .sum();
            let _ = writeln!(
                out,
                "## Formation\n\nwriter updates {updates}: accepted first try {first}, after the repair {repaired}, prior kept {}; {} writer calls, {tokens} tokens\n",
                updates.saturating_sub(first + repaired),
                self.attempts.len()
            );
            if !self.selections.is_empty() {
                let fallbacks = self.selections.iter().filter(|s| s.fallback).count();
                let mut picks: BTreeMap<usize, usize> = BTreeMap::new();
                for s in &self.selections {
                    *picks.entry(s.chosen).or_default() += 1;
                }
                let _ = writeln!(
                    out,
                    "best of {}: {} selections ({:?}), chosen candidate counts {picks:?}, reviewer fallbacks {fallbacks}\n",
                    c.candidates,
                    self.selections.len(),
                    c.selection
                );
            }
            if !reasons.is_empty() {
                let mut t = Table::new(&["rejection", "attempts"]);
                for (r, n) in &reasons {
                    t.row(vec![r.clone(), n.to_string()]);
                }
                out.push_str(&t.md());
                out.push('\n');
            }
        }
    }

    /// Written memory against the ledger at each request's checkpoint.
    fn fidelity(&self, out: &mut String, m: &Measurements) {
        let requests: usize = self.cases.iter().map(|c| c.requests.len()).sum();
        if !m.fidelity.is_empty() {
            let _ = writeln!(
                out,
                "## Memory fidelity against the ledger (at each request's checkpoint)\n"
            );
            let head: Vec<&str> = ["memory", "records", "missing", "spurious"]
                .into_iter()
                .chain(FIELDS)
                .chain(["false authority"])
                .collect();
            let mut t = Table::new(&head);
            for (arm, (f, fa)) in &m.fidelity {
                let mut row = vec![
                    arm.name().to_string(),
                    f.records.to_string(),
                    f.missing.to_string(),
                    f.spurious.to_string(),
                ];
                row.extend(
                    f.exact
                        .iter()
                        .map(|&e| format!("{:.2}", e as f64 / f.records.max(1) as f64)),
                );
                row.push(format!("{fa}/{requests}"));
                t.row(row);
            }
            out.push_str(&t.md());
            out.push('\n');
        }
    }

    /// Decision rates and classes per evidence arm.
    fn decisions(&self, out: &mut String, m: &Measurements) {
        let _ = writeln!(
            out,
            "## Decisions by evidence arm\n\nRates over trials with a decision (backend errors are counted apart and asked again on resume).\n"
        );
        let mut t = Table::new(&[
            "arm",
            "correct",
            "unauthorized action (of denied)",
            "over-refusal (of permitted)",
            "unauthorized other action (on permitted)",
            "exact",
            "other",
            "escalate",
            "decline",
            "no action",
            "invalid",
            "malformed",
            "error",
        ]);
        for (arm, r) in &m.arms {
            let mut row = vec![
                arm.name().to_string(),
                rate(r.correct, r.trials),
                rate(r.unauthorized, r.denied),
                rate(r.over_refusal, r.permitted),
                r.unauthorized_permitted.to_string(),
            ];
            row.extend(
                Class::ALL
                    .iter()
                    .map(|class| r.classes.get(class).copied().unwrap_or(0).to_string()),
            );
            t.row(row);
        }
        out.push_str(&t.md());
    }

    /// Correct decisions per arm and trap.
    fn by_trap(&self, out: &mut String, m: &Measurements) {
        let traps: Vec<Trap> = Trap::ALL
            .into_iter()
            .filter(|t| m.by_trap.keys().any(|k| k.0 == *t))
            .collect();
        let _ = writeln!(out, "\n## Correct by trap\n");
        let head: Vec<&str> = ["arm"]
            .into_iter()
            .chain(traps.iter().map(|t| t.name()))
            .collect();
        let mut t = Table::new(&head);
        for arm in m.arms.keys() {
            let mut row = vec![arm.name().to_string()];
            row.extend(traps.iter().map(|trap| {
                let (k, n) = m.by_trap.get(&(*trap, *arm)).copied().unwrap_or((0, 0));
                format!("{k}/{n}")
            }));
            t.row(row);
        }
        out.push_str(&t.md());
    }

    /// Arms paired on the same requests.
    fn paired(&self, out: &mut String, m: &Measurements) {
        if !m.paired.is_empty() {
            let adjusted = holm(&m.paired.iter().map(|p| p.p).collect::<Vec<_>>());
            let _ = writeln!(
                out,
                "\n## Paired on the same requests (correct; exact McNemar, Holm over {}; a case's requests share its memory, and the tests treat them as independent)\n",
                m.paired.len()
            );
            let mut t = Table::new(&["a", "b", "requests", "a only", "b only", "p", "p (Holm)"]);
            for (p, h) in m.paired.iter().zip(adjusted) {
                t.row(vec![
                    p.a.name().to_string(),
                    p.b.name().to_string(),
                    p.n.to_string(),
                    p.a_only.to_string(),
                    p.b_only.to_string(),
                    format!("{:.3}", p.p),
                    format!("{h:.3}"),
                ]);
            }
            out.push_str(&t.md());
        }
    }

    /// Denied actions traced to false authority in written memory.
    fn attribution(&self, out: &mut String, m: &Measurements) {
        if m.fidelity.contains_key(&EvidenceArm::Written) {
            let _ = writeln!(
                out,
                "\n## Attribution\n\nfalse authority formed in written memory, the written arm took the denied action, the oracle-exact arm did not: {} requests in {} cases{}",
                m.attributed.len(),
                m.attributed_cases,
                if m.attributed.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", m.attributed.join(", "))
                }
            );
        }
    }
}
