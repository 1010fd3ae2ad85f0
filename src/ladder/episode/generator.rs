//! The episode generator: a pure function of [`EpisodeConfig`] (and, at
//! paraphrase tier 2, the rewrite cache). Same inputs, same bytes, on any
//! machine: every random draw comes from a named [`Rng`] stream of the seed.
//!
//! Sampler and schedule, as documented in the book (docs/src/testbed.md):
//! - **Steps.** S templates drawn uniformly without replacement from the
//!   domain's 18; their order after a second shuffle assigns the ids s1..sS,
//!   so id order is not phase order.
//! - **Graph.** Phase-consistent: a prerequisite is always in a strictly
//!   earlier phase. Each step with an earlier-phase candidate gets one base
//!   prerequisite with probability 1/2; then every other earlier-phase pair
//!   becomes an extra edge independently with probability ρ.
//! - **Revision.** At turn 20–24 one step with dependents (any step if none
//!   has one) is cancelled; each dependent is rewired to its other
//!   prerequisites plus the cancelled step's own (so ordering still holds);
//!   one edge not touching the cancelled step is relaxed. The cancelled step
//!   and the relaxed edge's prerequisite are never asked before the revision.
//! - **Schedule.** 44 turns simulated against the perfect agent: every step
//!   but the cancelled one is asked once, in a random eligible order; the trap
//!   budget (two premature asks, two redo probes, one superseded cue, one
//!   legitimate redo) is drawn in proportion to what remains, so traps are
//!   interleaved with asks; a premature-asked step is re-asked once eligible;
//!   the remaining turns are fillers, each an ambiguous probe with
//!   probability `ambiguous_rate` when two steps are eligible. Traps the graph
//!   cannot offer (no blocked step, S = 1) are left out.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::domain::{Family, Template};
use super::*;
use crate::ladder::prompts as p;
use crate::ladder::state::{Status, TaskState};
use crate::rng::Rng;

/// Why an episode could not be generated.
#[derive(Debug, thiserror::Error)]
pub enum GenError {
    /// S outside 1..=18.
    #[error("steps must be in 1..=18, got {0}")]
    Steps(usize),
    /// ρ outside [0, 1].
    #[error("density must be in [0, 1], got {0}")]
    Density(f64),
    #[error("ambiguous rate must be in [0, 1], got {0}")]
    AmbiguousRate(f64),
    #[error("paraphrase tier must be 0, 1 or 2, got {0}")]
    Tier(u8),
    /// Tier 2 without a cache.
    #[error("paraphrase tier 2 needs a rewrite cache (--paraphrase-cache FILE)")]
    NoCache,
    /// The cache lacks a rewrite the episode needs.
    #[error("paraphrase cache has no {family} rewrites for template '{slug}' (need 3)")]
    CacheEntry { slug: String, family: Family },
    #[error("paraphrase cache {path}")]
    CacheRead {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("paraphrase cache {path}")]
    CacheParse {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("paraphrase cache {path}: version '{found}' is not '{CACHE_VERSION}'")]
    CacheVersion { path: String, found: String },
}

/// Version tag of the tier-2 rewrite cache file.
pub const CACHE_VERSION: &str = "statebench-paraphrases/1";

/// Held-out rewrites for paraphrase tier 2, one file for both domains.
///
/// Format (JSON): `{"version": "statebench-paraphrases/1", "model": "…",
/// "templates": {"<slug>": {"ask": [3 strings], "premature": [3 strings],
/// "redo": [3 strings]}}}`. Strings follow the template conventions: no
/// trailing punctuation, no work order.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ParaphraseCache {
    /// [`CACHE_VERSION`].
    pub version: String,
    /// The model that wrote the rewrites.
    #[serde(default)]
    pub model: String,
    /// Rewrites per template slug.
    pub templates: BTreeMap<String, Rewrites>,
}

/// The three rewrite families of one template.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Rewrites {
    pub ask: Vec<String>,
    pub premature: Vec<String>,
    pub redo: Vec<String>,
}

impl Rewrites {
    /// One family's rewrites.
    pub fn family_mut(&mut self, f: Family) -> &mut Vec<String> {
        match f {
            Family::Ask => &mut self.ask,
            Family::Premature => &mut self.premature,
            Family::Redo => &mut self.redo,
        }
    }

    fn family(&self, f: Family) -> &[String] {
        match f {
            Family::Ask => &self.ask,
            Family::Premature => &self.premature,
            Family::Redo => &self.redo,
        }
    }
}

impl ParaphraseCache {
    /// Reads and checks a cache file.
    pub fn load(path: &Path) -> Result<Self, GenError> {
        let path_s = || path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| GenError::CacheRead {
            path: path_s(),
            source,
        })?;
        let cache: ParaphraseCache =
            serde_json::from_str(&text).map_err(|source| GenError::CacheParse {
                path: path_s(),
                source,
            })?;
        if cache.version != CACHE_VERSION {
            return Err(GenError::CacheVersion {
                path: path_s(),
                found: cache.version,
            });
        }
        Ok(cache)
    }

    fn get(&self, slug: &str, family: Family, k: usize) -> Result<String, GenError> {
        let missing = || GenError::CacheEntry {
            slug: slug.to_string(),
            family,
        };
        let r = self.templates.get(slug).ok_or_else(missing)?;
        match r.family(family) {
            v if v.len() >= 3 => Ok(v[k].clone()),
            _ => Err(missing()),
        }
    }
}

/// Work orders and codes the protocol strings use as examples; never issued.
const RESERVED: [u32; 4] = [1234, 2048, 4242, 5678];

/// Checks settings without generating.
pub fn validate(cfg: &EpisodeSettings) -> Result<(), GenError> {
    if !(1..=18).contains(&cfg.steps) {
        return Err(GenError::Steps(cfg.steps));
    }
    if !(0.0..=1.0).contains(&cfg.density) {
        return Err(GenError::Density(cfg.density));
    }
    if !(0.0..=1.0).contains(&cfg.ambiguous_rate) {
        return Err(GenError::AmbiguousRate(cfg.ambiguous_rate));
    }
    if cfg.paraphrase_tier > 2 {
        return Err(GenError::Tier(cfg.paraphrase_tier));
    }
    Ok(())
}

/// Generates the episode for `cfg`.
pub fn generate(cfg: &EpisodeConfig, cache: Option<&ParaphraseCache>) -> Result<Episode, GenError> {
    validate(&cfg.settings)?;
    if cfg.settings.paraphrase_tier == 2 && cache.is_none() {
        return Err(GenError::NoCache);
    }
    let templates = select_templates(cfg);
    let requires = sample_graph(cfg, &templates);
    let codes = distinct_numbers(&mut Rng::stream(cfg.seed, "codes"), templates.len());
    let steps: Vec<Step> = templates
        .iter()
        .enumerate()
        .map(|(i, t)| Step {
            id: StepId(i as u8),
            slug: t.slug.to_string(),
            phase: t.phase,
            wording: t.canonical.to_string(),
            code: format!("RC-{}", codes[i]),
            tool: t.tool.to_string(),
            requires: requires[i].clone(),
        })
        .collect();
    let brief = render_brief(cfg, &steps);
    let plan = plan_revision(cfg, &steps);
    let mut sched = TurnPlanner::new(cfg, &templates, &steps, &plan, cache);
    let turns = sched.run()?;
    let revision = sched.revision;
    Ok(Episode {
        version: EPISODE_VERSION.to_string(),
        config: cfg.clone(),
        steps,
        brief,
        revision,
        turns,
    })
}

fn select_templates(cfg: &EpisodeConfig) -> Vec<&'static Template> {
    let pool = cfg.settings.domain.templates();
    let mut rng = Rng::stream(cfg.seed, "select");
    let mut idx: Vec<usize> = (0..pool.len()).collect();
    rng.shuffle(&mut idx);
    idx.truncate(cfg.settings.steps);
    // A second shuffle assigns ids, so id order carries no phase information.
    rng.shuffle(&mut idx);
    idx.into_iter().map(|i| &pool[i]).collect()
}

fn sample_graph(cfg: &EpisodeConfig, templates: &[&Template]) -> Vec<Vec<StepId>> {
    let mut rng = Rng::stream(cfg.seed, "graph");
    let n = templates.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| (templates[i].phase, i));
    let mut requires: Vec<Vec<StepId>> = vec![Vec::new(); n];
    for &v in &order {
        let cands: Vec<usize> = (0..n)
            .filter(|&u| templates[u].phase < templates[v].phase)
            .collect();
        if cands.is_empty() {
            continue;
        }
        if rng.chance(0.5) {
            let u = cands[rng.below(cands.len())];
            requires[v].push(StepId(u as u8));
        }
        for &u in &cands {
            let id = StepId(u as u8);
            if !requires[v].contains(&id) && rng.chance(cfg.settings.density) {
                requires[v].push(id);
            }
        }
        requires[v].sort();
    }
    requires
}

/// `count` distinct four-digit numbers, none of them reserved.
fn distinct_numbers(rng: &mut Rng, count: usize) -> Vec<u32> {
    let mut out: Vec<u32> = Vec::with_capacity(count);
    while out.len() < count {
        let x = 1000 + rng.below(9000) as u32;
        if !RESERVED.contains(&x) && !out.contains(&x) {
            out.push(x);
        }
    }
    out
}

fn render_brief(cfg: &EpisodeConfig, steps: &[Step]) -> String {
    let mut lines = vec![p::BRIEF_OPENING.to_string()];
    for s in steps {
        let mut line = format!("- {}: {}", s.id, s.wording);
        if !s.requires.is_empty() {
            let r: Vec<String> = s.requires.iter().map(|u| u.to_string()).collect();
            line.push_str(&format!(" (requires: {})", r.join(", ")));
        }
        line.push_str(&format!(" [completion code {}]", s.code));
        if cfg.settings.protocol != Protocol::Text {
            line.push_str(&format!(" [tool {}]", s.tool));
        }
        lines.push(line);
    }
    lines.push(p::BRIEF_POLICY.to_string());
    if cfg.settings.brief == BriefVariant::Amended {
        lines.push(p::ONE_SHOT.to_string());
    }
    lines.push(match cfg.settings.protocol {
        Protocol::Text => p::EXECUTION_PROTOCOL.to_string(),
        Protocol::Tool => p::TOOL_CLAUSE.to_string(),
        Protocol::Native => p::NATIVE_TOOL_CLAUSE.to_string(),
    });
    lines.join("\n")
}

/// The revision chosen up front from the original graph.
struct RevisionPlan {
    turn: usize,
    cancel: StepId,
    relax: Option<(StepId, StepId)>,
}

fn plan_revision(cfg: &EpisodeConfig, steps: &[Step]) -> RevisionPlan {
    let mut rng = Rng::stream(cfg.seed, "revision");
    let turn = 20 + rng.below(5);
    let ids: Vec<StepId> = steps.iter().map(|s| s.id).collect();
    let with_dependents: Vec<StepId> = ids
        .iter()
        .copied()
        .filter(|c| steps.iter().any(|s| s.requires.contains(c)))
        .collect();
    let cancel = *rng
        .pick(if with_dependents.is_empty() {
            &ids
        } else {
            &with_dependents
        })
        .expect("an episode has at least one step");
    let edges: Vec<(StepId, StepId)> = steps
        .iter()
        .filter(|w| w.id != cancel)
        .flat_map(|w| {
            w.requires
                .iter()
                .filter(|u| **u != cancel)
                .map(move |u| (w.id, *u))
        })
        .collect();
    let relax = rng.pick(&edges).copied();
    RevisionPlan {
        turn,
        cancel,
        relax,
    }
}

/// The schedule simulation against the perfect agent.
struct TurnPlanner<'a> {
    cfg: &'a EpisodeConfig,
    templates: &'a [&'static Template],
    steps: &'a [Step],
    cache: Option<&'a ParaphraseCache>,
    plan_turn: usize,
    cancel: StepId,
    held: Vec<StepId>,
    truth: TaskState,
    asked: Vec<bool>,
    deferred: Vec<StepId>,
    probed: Vec<StepId>,
    legit_target: Option<StepId>,
    premature_left: usize,
    redo_left: usize,
    cue_left: usize,
    legit_left: usize,
    revision: Revision,
    rng: Rng,
    para: Rng,
    fill: Rng,
    last_filler: usize,
    work_orders: Vec<u32>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Event {
    Ask,
    ReAsk,
    Premature,
    Redo,
    Legit,
    Cue,
}

impl<'a> TurnPlanner<'a> {
    fn new(
        cfg: &'a EpisodeConfig,
        templates: &'a [&'static Template],
        steps: &'a [Step],
        plan: &RevisionPlan,
        cache: Option<&'a ParaphraseCache>,
    ) -> Self {
        let mut held = vec![plan.cancel];
        if let Some((_, u)) = plan.relax {
            held.push(u);
        }
        let n = steps.len();
        TurnPlanner {
            cfg,
            templates,
            steps,
            cache,
            plan_turn: plan.turn,
            cancel: plan.cancel,
            held,
            truth: TaskState::new(steps.iter().map(|s| s.requires.clone()).collect()),
            asked: vec![false; n],
            deferred: Vec::new(),
            probed: Vec::new(),
            legit_target: None,
            premature_left: 2,
            redo_left: 2,
            cue_left: 1,
            legit_left: 1,
            revision: Revision {
                turn: plan.turn,
                cancel: plan.cancel,
                rewires: Vec::new(),
                relax: plan.relax,
                message: String::new(),
            },
            rng: Rng::stream(cfg.seed, "schedule"),
            para: Rng::stream(cfg.seed, "paraphrase"),
            fill: Rng::stream(cfg.seed, "filler"),
            last_filler: usize::MAX,
            work_orders: distinct_numbers(&mut Rng::stream(cfg.seed, "work_orders"), TURNS),
        }
    }

    fn ids(&self) -> Vec<StepId> {
        self.truth.ids().collect()
    }

    fn held_now(&self, t: usize, v: StepId) -> bool {
        t < self.plan_turn && self.held.contains(&v)
    }

    fn candidates(&self, t: usize, e: Event) -> Vec<StepId> {
        let ids = self.ids();
        let st = |v: StepId| self.truth.status(v);
        match e {
            Event::Ask => ids
                .into_iter()
                .filter(|&v| {
                    !self.asked[v.index()] && st(v) == Status::Todo && !self.held_now(t, v)
                })
                .collect(),
            Event::ReAsk => self
                .deferred
                .iter()
                .copied()
                .filter(|&v| st(v) == Status::Todo)
                .collect(),
            Event::Premature if self.premature_left > 0 => ids
                .into_iter()
                .filter(|&v| {
                    !self.asked[v.index()]
                        && st(v) == Status::Blocked
                        && v != self.cancel
                        && !self.held_now(t, v)
                })
                .collect(),
            // Distinct targets for the two probes and the legitimate redo
            // where the graph allows; small graphs reuse a finished step.
            Event::Redo if self.redo_left > 0 => {
                let done: Vec<StepId> = ids
                    .into_iter()
                    .filter(|&v| st(v) == Status::Done && !self.probed.contains(&v))
                    .collect();
                let fresh: Vec<StepId> = done
                    .iter()
                    .copied()
                    .filter(|&v| self.legit_target != Some(v))
                    .collect();
                if fresh.is_empty() {
                    done
                } else {
                    fresh
                }
            }
            Event::Legit if self.legit_left > 0 => {
                let done: Vec<StepId> =
                    ids.into_iter().filter(|&v| st(v) == Status::Done).collect();
                let fresh: Vec<StepId> = done
                    .iter()
                    .copied()
                    .filter(|v| !self.probed.contains(v))
                    .collect();
                if fresh.is_empty() {
                    done
                } else {
                    fresh
                }
            }
            Event::Cue if self.cue_left > 0 && t > self.plan_turn => vec![self.cancel],
            _ => Vec::new(),
        }
    }

    /// How many more of this event the schedule still owes.
    fn owed(&self, e: Event) -> usize {
        match e {
            Event::Ask => self
                .ids()
                .into_iter()
                .filter(|&v| !self.asked[v.index()] && v != self.cancel)
                .count(),
            Event::ReAsk => self.deferred.len(),
            Event::Premature => self.premature_left,
            Event::Redo => self.redo_left,
            Event::Legit => self.legit_left,
            Event::Cue => self.cue_left,
        }
    }

    fn run(&mut self) -> Result<Vec<Turn>, GenError> {
        const EVENTS: [Event; 6] = [
            Event::Ask,
            Event::ReAsk,
            Event::Premature,
            Event::Redo,
            Event::Legit,
            Event::Cue,
        ];
        let mut turns = Vec::with_capacity(TURNS);
        for t in 0..TURNS {
            if t == self.plan_turn {
                turns.push(self.revision_turn(t));
                continue;
            }
            // Premature asks are optional (the graph may offer no blocked
            // step), so they do not count towards the turns the schedule must
            // reserve; every other owed event does.
            let must: usize = EVENTS
                .iter()
                .filter(|e| **e != Event::Premature)
                .map(|&e| self.owed(e))
                .sum::<usize>()
                + usize::from(t < self.plan_turn);
            let remaining = TURNS - t;
            // Premature asks get four times the weight: the window in which a
            // not-yet-asked step is blocked closes as the plan advances.
            let avail: Vec<(Event, usize)> = EVENTS
                .iter()
                .map(|&e| {
                    let n = self.candidates(t, e).len().min(self.owed(e));
                    (e, if e == Event::Premature { 4 * n } else { n })
                })
                .filter(|(_, n)| *n > 0)
                .collect();
            let owed_total: usize = avail.iter().map(|(_, n)| n).sum();
            // Spread what is still owed evenly over the turns left.
            let owed_all = must + self.owed(Event::Premature);
            let take = !avail.is_empty()
                && (must + 1 >= remaining || self.rng.unit() < owed_all as f64 / remaining as f64);
            if !take {
                turns.push(self.filler_turn(t));
                continue;
            }
            // Event type in proportion to what is owed, then a uniform instance.
            let mut r = self.rng.below(owed_total);
            let mut chosen = avail[0].0;
            for (e, n) in &avail {
                if r < *n {
                    chosen = *e;
                    break;
                }
                r -= n;
            }
            let cands = self.candidates(t, chosen);
            let v = cands[self.rng.below(cands.len())];
            turns.push(self.event_turn(t, chosen, v)?);
        }
        Ok(turns)
    }

    fn work_order(&self, t: usize) -> String {
        format!("#W{}", self.work_orders[t])
    }

    fn message(wording: &str, wo: &str) -> String {
        if wording.ends_with('?') {
            format!("{wording} ({wo})")
        } else {
            format!("{wording} ({wo}).")
        }
    }

    /// Picks one of three wordings by paraphrase tier.
    fn wording(&mut self, v: StepId, family: Family) -> Result<String, GenError> {
        let k = self.para.below(3);
        let t = self.templates[v.index()];
        match self.cfg.settings.paraphrase_tier {
            0 => Ok(t.family(family)[k].clone()),
            1 => Ok(t.family(family)[(k + 1) % 3].clone()),
            _ => self.cache.ok_or(GenError::NoCache)?.get(&t.slug, family, k),
        }
    }

    fn event_turn(&mut self, t: usize, e: Event, v: StepId) -> Result<Turn, GenError> {
        let wo = self.work_order(t);
        let tpl = self.templates[v.index()];
        let (kind, wording, explicit_redo) = match e {
            Event::Ask => {
                self.asked[v.index()] = true;
                self.truth.execute(v);
                (TurnKind::Ask, self.wording(v, Family::Ask)?, false)
            }
            Event::ReAsk => {
                self.deferred.retain(|x| *x != v);
                self.truth.execute(v);
                (TurnKind::ReAsk, self.wording(v, Family::Ask)?, false)
            }
            Event::Premature => {
                self.asked[v.index()] = true;
                self.deferred.push(v);
                self.premature_left -= 1;
                (
                    TurnKind::Premature,
                    self.wording(v, Family::Premature)?,
                    false,
                )
            }
            Event::Redo => {
                self.probed.push(v);
                self.redo_left -= 1;
                (TurnKind::RedoProbe, self.wording(v, Family::Redo)?, false)
            }
            Event::Legit => {
                self.legit_target = Some(v);
                self.legit_left -= 1;
                (TurnKind::LegitRedo, tpl.legit_redo.to_string(), true)
            }
            Event::Cue => {
                self.cue_left -= 1;
                (
                    TurnKind::SupersededCue,
                    tpl.status_question.to_string(),
                    false,
                )
            }
        };
        Ok(Turn {
            index: t,
            kind,
            step: Some(v),
            named: Vec::new(),
            explicit_redo,
            message: Self::message(&wording, &wo),
            work_order: wo,
        })
    }

    fn filler_turn(&mut self, t: usize) -> Turn {
        let wo = self.work_order(t);
        let eligible: Vec<StepId> = self
            .ids()
            .into_iter()
            .filter(|&v| self.truth.status(v) == Status::Todo && !self.held_now(t, v))
            .collect();
        if self.cfg.settings.ambiguous_rate > 0.0
            && eligible.len() >= 2
            && self.fill.chance(self.cfg.settings.ambiguous_rate)
        {
            let a = self.fill.below(eligible.len());
            let mut b = self.fill.below(eligible.len() - 1);
            if b >= a {
                b += 1;
            }
            let (a, b) = (eligible[a], eligible[b]);
            let text = p::ambiguous_probe(
                &self.steps[a.index()].wording,
                &self.steps[b.index()].wording,
            );
            return Turn {
                index: t,
                kind: TurnKind::Ambiguous,
                step: None,
                named: vec![a, b],
                explicit_redo: false,
                message: Self::message(&text, &wo),
                work_order: wo,
            };
        }
        let fillers = self.cfg.settings.domain.fillers();
        let mut i = self.fill.below(fillers.len());
        if i == self.last_filler {
            i = (i + 1) % fillers.len();
        }
        self.last_filler = i;
        Turn {
            index: t,
            kind: TurnKind::Filler,
            step: None,
            named: Vec::new(),
            explicit_redo: false,
            message: format!("{} ({wo})", fillers[i]),
            work_order: wo,
        }
    }

    fn revision_turn(&mut self, t: usize) -> Turn {
        let c = self.cancel;
        let cancel_reqs = self.truth.requires[c.index()].clone();
        let wording = |v: StepId| self.steps[v.index()].wording.as_str();
        let mut sentences = vec![p::revision_cancel(wording(c))];
        let mut rewires = Vec::new();
        for w in self.ids() {
            if w != c && self.truth.requires[w.index()].contains(&c) {
                let mut new: Vec<StepId> = self.truth.requires[w.index()]
                    .iter()
                    .copied()
                    .filter(|u| *u != c)
                    .chain(cancel_reqs.iter().copied())
                    .collect();
                new.sort();
                new.dedup();
                rewires.push((w, new));
            }
        }
        for (w, new) in &rewires {
            let names: Vec<&str> = new.iter().map(|u| wording(*u)).collect();
            sentences.push(p::revision_rewire(wording(*w), &names));
        }
        // Apply cancel and rewires before computing the relaxed step's remainder.
        self.truth.cancel(c);
        for (w, new) in &rewires {
            self.truth.rewire(*w, new.clone());
        }
        if let Some((w, u)) = self.revision.relax {
            self.truth.relax(w, u);
            let names: Vec<&str> = self.truth.requires[w.index()]
                .iter()
                .map(|x| self.steps[x.index()].wording.as_str())
                .collect();
            sentences.push(p::revision_relax(
                &self.steps[w.index()].wording,
                &self.steps[u.index()].wording,
                &names,
            ));
        }
        self.held.clear();
        let message = sentences.join(" ");
        self.revision.rewires = rewires;
        self.revision.message = message.clone();
        let wo = self.work_order(t);
        Turn {
            index: t,
            kind: TurnKind::Revision,
            step: None,
            named: Vec::new(),
            explicit_redo: false,
            message: format!("{message} ({wo})"),
            work_order: wo,
        }
    }
}

/// Applies the episode's revision to a ground-truth state.
pub fn apply_revision(state: &mut TaskState, rev: &Revision) {
    state.cancel(rev.cancel);
    for (w, new) in &rev.rewires {
        state.rewire(*w, new.clone());
    }
    if let Some((w, u)) = rev.relax {
        state.relax(w, u);
    }
}

/// The ground-truth state at the start of an episode.
pub fn initial_state(ep: &Episode) -> TaskState {
    TaskState::new(ep.steps.iter().map(|s| s.requires.clone()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(ep: &Episode, k: TurnKind) -> usize {
        ep.turns.iter().filter(|t| t.kind == k).count()
    }

    #[test]
    fn same_inputs_same_bytes() {
        let c = EpisodeConfig::paper(Domain::Release, 12, 0.3, 4242);
        let a = serde_json::to_string(&generate(&c, None).unwrap()).unwrap();
        let b = serde_json::to_string(&generate(&c, None).unwrap()).unwrap();
        assert_eq!(a, b);
        let other = EpisodeConfig::paper(Domain::Release, 12, 0.3, 4243);
        assert_ne!(
            a,
            serde_json::to_string(&generate(&other, None).unwrap()).unwrap()
        );
    }

    #[test]
    fn schedule_invariants_hold_across_sizes() {
        let mut premature_full = 0;
        let mut total = 0;
        for domain in Domain::ALL {
            for s in [1, 2, 3, 5, 10, 15, 18] {
                for density in [0.0, 0.15, 0.3, 1.0] {
                    for seed in 100..130 {
                        let ep = generate(&EpisodeConfig::paper(domain, s, density, seed), None)
                            .unwrap();
                        total += 1;
                        assert_eq!(ep.turns.len(), TURNS);
                        assert_eq!(count(&ep, TurnKind::Revision), 1);
                        let wos: std::collections::BTreeSet<_> =
                            ep.turns.iter().map(|t| t.work_order.clone()).collect();
                        assert_eq!(wos.len(), TURNS, "work orders unique");
                        let codes: std::collections::BTreeSet<_> =
                            ep.steps.iter().map(|t| t.code.clone()).collect();
                        assert_eq!(codes.len(), s, "codes unique");
                        // Every step but the cancelled one is asked.
                        for st in &ep.steps {
                            let asked = ep.turns.iter().any(|t| {
                                t.step == Some(st.id)
                                    && matches!(t.kind, TurnKind::Ask | TurnKind::ReAsk)
                            });
                            assert_eq!(asked, st.id != ep.revision.cancel, "S={s} seed={seed}");
                        }
                        // Prerequisites come from strictly earlier phases.
                        for st in &ep.steps {
                            for u in &st.requires {
                                assert!(ep.step(*u).phase < st.phase);
                            }
                        }
                        // Each premature ask is followed by a re-ask of the same step.
                        for t in ep.turns.iter().filter(|t| t.kind == TurnKind::Premature) {
                            assert!(ep.turns[t.index..]
                                .iter()
                                .any(|r| r.kind == TurnKind::ReAsk && r.step == t.step));
                        }
                        if s >= 3 {
                            assert_eq!(count(&ep, TurnKind::RedoProbe), 2, "S={s} seed={seed}");
                            assert_eq!(count(&ep, TurnKind::LegitRedo), 1);
                            assert_eq!(count(&ep, TurnKind::SupersededCue), 1);
                        }
                        if s >= 5 && density > 0.0 && count(&ep, TurnKind::Premature) == 2 {
                            premature_full += 1;
                        }
                        let cue = ep.turns.iter().find(|t| t.kind == TurnKind::SupersededCue);
                        if let Some(cue) = cue {
                            assert!(cue.index > ep.revision.turn);
                            assert_eq!(cue.step, Some(ep.revision.cancel));
                        }
                    }
                }
            }
        }
        eprintln!("episodes with both premature asks: {premature_full} of {total}");
    }

    #[test]
    fn bad_inputs_are_refused() {
        let mut c = EpisodeConfig::paper(Domain::Procurement, 0, 0.15, 1);
        assert!(matches!(generate(&c, None), Err(GenError::Steps(0))));
        c.settings.steps = 19;
        assert!(matches!(generate(&c, None), Err(GenError::Steps(19))));
        c.settings.steps = 5;
        c.settings.density = 1.5;
        assert!(matches!(generate(&c, None), Err(GenError::Density(_))));
        c.settings.density = 0.1;
        c.settings.paraphrase_tier = 2;
        assert!(matches!(generate(&c, None), Err(GenError::NoCache)));
    }

    #[test]
    fn tiers_change_wording_not_structure() {
        let mut c = EpisodeConfig::paper(Domain::Procurement, 10, 0.15, 100);
        let a = generate(&c, None).unwrap();
        c.settings.paraphrase_tier = 1;
        let b = generate(&c, None).unwrap();
        assert_eq!(a.steps, b.steps);
        let kinds = |e: &Episode| e.turns.iter().map(|t| (t.kind, t.step)).collect::<Vec<_>>();
        assert_eq!(kinds(&a), kinds(&b));
        let asks = |e: &Episode| {
            e.turns
                .iter()
                .filter(|t| t.kind == TurnKind::Ask)
                .map(|t| t.message.clone())
                .collect::<Vec<_>>()
        };
        assert!(asks(&a).iter().zip(asks(&b)).all(|(x, y)| *x != y));
    }

    #[test]
    fn ambiguous_probes_name_two_eligible_steps() {
        let mut c = EpisodeConfig::paper(Domain::Procurement, 10, 0.15, 100);
        c.settings.ambiguous_rate = 0.5;
        let ep = generate(&c, None).unwrap();
        let amb: Vec<&Turn> = ep
            .turns
            .iter()
            .filter(|t| t.kind == TurnKind::Ambiguous)
            .collect();
        assert!(!amb.is_empty());
        for t in amb {
            assert_eq!(t.named.len(), 2);
            assert!(t.step.is_none());
        }
    }
}
