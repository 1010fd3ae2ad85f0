//! Episodes: the brief, the step graph and the 44-turn scripted schedule (paper §4.1).
//!
//! An episode is a pure function of its [`EpisodeConfig`]: [`domain`] holds
//! the template pools, [`generator`] draws the graph and plans the turns,
//! [`paraphrase`] writes the held-out rewrites tier 2 reads. This file holds
//! the data an episode carries.

pub mod domain;
pub mod generator;
pub mod paraphrase;

use serde::{Deserialize, Serialize};
use std::fmt;

use domain::Domain;

/// Version tag written into every serialized episode; a file with another tag is refused.
pub const EPISODE_VERSION: &str = "statebench-episode/1";

/// Number of scripted turns in every episode, whatever its size (§4.1).
pub const TURNS: usize = 44;

/// A step id, `s1`..`s18`, stored as its zero-based index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StepId(pub u8);

impl StepId {
    /// Zero-based index into the episode's step list.
    pub fn index(self) -> usize {
        usize::from(self.0)
    }

    /// Parses `s3` (case-insensitive, surrounding whitespace allowed).
    pub fn parse(s: &str) -> Option<StepId> {
        let t = s.trim();
        let rest = t.strip_prefix('s').or_else(|| t.strip_prefix('S'))?;
        let n: u8 = rest.parse().ok()?;
        (1..=18).contains(&n).then(|| StepId(n - 1))
    }
}

impl fmt::Display for StepId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s{}", self.0 + 1)
    }
}

impl Serialize for StepId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for StepId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        StepId::parse(&s).ok_or_else(|| serde::de::Error::custom(format!("bad step id '{s}'")))
    }
}

/// Which brief the agent receives (§4.3, Appendix B.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum BriefVariant {
    /// The brief without the one-shot sentence.
    Original,
    /// The brief with the one-shot sentence (the main grid).
    Amended,
}

/// How the agent books work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// `ref <code>/<work order>` lines (the payload testbed).
    Text,
    /// `ACTION {"tool": …, "work_order": …}` lines (the tool clause of Appendix G).
    Tool,
    /// Native tool calls: each step a tool offered through the chat
    /// template's `tools` (OpenAI `tools` through an endpoint), each call
    /// stamping a per-episode workspace that scoring reads (Appendix G).
    Native,
}

/// What an episode is a function of apart from its seed: the settings a
/// cell fixes and a grid crosses. The flags are `ladder episode`'s; their
/// defaults are the paper's main grid at procurement, S = 10, ρ = 0.15.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clap::Args)]
pub struct EpisodeSettings {
    /// Template pool: procurement or release.
    #[arg(long, default_value_t = EpisodeSettings::default().domain)]
    pub domain: Domain,
    /// Number of steps S, 1..=18.
    #[arg(long, default_value_t = EpisodeSettings::default().steps)]
    pub steps: usize,
    /// Extra-edge density ρ in [0, 1].
    #[arg(long, default_value_t = EpisodeSettings::default().density)]
    pub density: f64,
    /// Brief variant.
    #[arg(long, value_enum, default_value_t = EpisodeSettings::default().brief)]
    pub brief: BriefVariant,
    /// Booking protocol: text (ref lines), tool (ACTION lines) or native
    /// (tool calls stamping a workspace).
    #[arg(long, value_enum, default_value_t = EpisodeSettings::default().protocol)]
    pub protocol: Protocol,
    /// Paraphrase tier: 0 assigned, 1 rotated, 2 held-out rewrites from a
    /// cache (--paraphrase-cache).
    #[arg(long, default_value_t = EpisodeSettings::default().paraphrase_tier)]
    pub paraphrase_tier: u8,
    /// Rate at which filler slots become ambiguous probes, in [0, 1].
    #[arg(long, default_value_t = EpisodeSettings::default().ambiguous_rate)]
    pub ambiguous_rate: f64,
}

impl EpisodeSettings {
    /// The paper's main grid at (domain, S, ρ): amended brief, text
    /// protocol, assigned wordings, no ambiguous probes.
    pub fn paper(domain: Domain, steps: usize, density: f64) -> Self {
        EpisodeSettings {
            domain,
            steps,
            density,
            brief: BriefVariant::Amended,
            protocol: Protocol::Text,
            paraphrase_tier: 0,
            ambiguous_rate: 0.0,
        }
    }

    /// The episode of these settings at `seed`.
    pub fn at(&self, seed: u64) -> EpisodeConfig {
        EpisodeConfig {
            settings: self.clone(),
            seed,
        }
    }
}

impl Default for EpisodeSettings {
    fn default() -> Self {
        EpisodeSettings::paper(Domain::Procurement, 10, 0.15)
    }
}

/// Everything an episode is a function of: its settings and its seed.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct EpisodeConfig {
    #[serde(flatten)]
    pub settings: EpisodeSettings,
    /// Episode seed.
    pub seed: u64,
}

impl EpisodeConfig {
    /// The paper's main grid at (domain, S, ρ, seed).
    pub fn paper(domain: Domain, steps: usize, density: f64, seed: u64) -> Self {
        EpisodeSettings::paper(domain, steps, density).at(seed)
    }
}

/// The settings' keys with the seed after ρ, where episode files (and
/// their digests) have always had it.
impl Serialize for EpisodeConfig {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error, SerializeMap};
        let settings = match serde_json::to_value(&self.settings).map_err(S::Error::custom)? {
            serde_json::Value::Object(m) => m,
            _ => return Err(S::Error::custom("episode settings are not an object")),
        };
        let mut m = s.serialize_map(Some(settings.len() + 1))?;
        for (k, v) in &settings {
            m.serialize_entry(k, v)?;
            if k == "density" {
                m.serialize_entry("seed", &self.seed)?;
            }
        }
        m.end()
    }
}

/// One step of the plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// Step id as the brief shows it.
    pub id: StepId,
    /// Template slug.
    pub slug: String,
    /// Phase of the template.
    pub phase: u8,
    /// Canonical wording from the brief.
    pub wording: String,
    /// Completion code `RC-dddd`.
    pub code: String,
    /// Tool name for the tool protocol.
    pub tool: String,
    /// Prerequisites in the original plan.
    pub requires: Vec<StepId>,
}

/// The mid-episode revision: cancel one step with its rewiring, relax one prerequisite.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Revision {
    /// Turn index at which the revision message arrives.
    pub turn: usize,
    /// The cancelled step.
    pub cancel: StepId,
    /// Each step whose prerequisites changed because of the cancellation, with its full new list.
    pub rewires: Vec<(StepId, Vec<StepId>)>,
    /// (step, dropped prerequisite), when the graph offers one.
    pub relax: Option<(StepId, StepId)>,
    /// The revision text without work order, as the compiler receives it.
    pub message: String,
}

/// What a scheduled turn is for; the label itself is computed from the realized state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnKind {
    /// A request for a step that is eligible when scheduled.
    Ask,
    /// The re-ask of a correctly deferred step once its prerequisites are met.
    ReAsk,
    /// A request for a step that is blocked when scheduled (trap).
    Premature,
    /// A fresh request for a finished step (trap).
    RedoProbe,
    /// A status question about the cancelled step (trap).
    SupersededCue,
    /// An explicit, reasoned order to redo a finished step.
    LegitRedo,
    /// The plan revision.
    Revision,
    /// Small talk.
    Filler,
    /// A probe naming two eligible steps without saying which; correct: execute nothing.
    Ambiguous,
}

impl TurnKind {
    /// Whether the matcher is bypassed on this turn by schedule metadata (B.2).
    pub fn bypasses_matcher(self) -> bool {
        matches!(self, TurnKind::Filler | TurnKind::Revision)
    }

    /// The snake_case name used in logs.
    pub fn name(self) -> &'static str {
        match self {
            TurnKind::Ask => "ask",
            TurnKind::ReAsk => "re_ask",
            TurnKind::Premature => "premature",
            TurnKind::RedoProbe => "redo_probe",
            TurnKind::SupersededCue => "superseded_cue",
            TurnKind::LegitRedo => "legit_redo",
            TurnKind::Revision => "revision",
            TurnKind::Filler => "filler",
            TurnKind::Ambiguous => "ambiguous",
        }
    }
}

/// One scripted user turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Turn {
    /// Zero-based turn index.
    pub index: usize,
    /// What the turn is for.
    pub kind: TurnKind,
    /// The step the request resolves to (None for filler, revision and ambiguous turns).
    pub step: Option<StepId>,
    /// For ambiguous probes: the two steps named.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub named: Vec<StepId>,
    /// Whether the user explicitly authorizes re-execution (α).
    pub explicit_redo: bool,
    /// The fresh work order `#Wdddd`.
    pub work_order: String,
    /// The user message as sent, work order included.
    pub message: String,
}

/// A generated episode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Episode {
    /// [`EPISODE_VERSION`].
    pub version: String,
    /// The inputs it was generated from.
    pub config: EpisodeConfig,
    /// Steps in id order (`s1` first).
    pub steps: Vec<Step>,
    /// The brief (system prompt of every arm).
    pub brief: String,
    pub revision: Revision,
    /// The 44 turns.
    pub turns: Vec<Turn>,
}

impl Episode {
    /// The step with this id.
    pub fn step(&self, id: StepId) -> &Step {
        &self.steps[id.index()]
    }

    /// Resolves a completion code to its step (exact, case-insensitive).
    pub fn step_by_code(&self, code: &str) -> Option<StepId> {
        self.steps
            .iter()
            .find(|s| s.code.eq_ignore_ascii_case(code))
            .map(|s| s.id)
    }

    /// Resolves a tool name to its step.
    pub fn step_by_tool(&self, tool: &str) -> Option<StepId> {
        self.steps
            .iter()
            .find(|s| s.tool.eq_ignore_ascii_case(tool.trim()))
            .map(|s| s.id)
    }

    /// The step list as the matcher and revision compiler show it: "- sX: wording" lines.
    pub fn step_list(&self) -> String {
        self.steps
            .iter()
            .map(|s| format!("- {}: {}", s.id, s.wording))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Number of steps.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// What an episode read from a file must satisfy before it is scored:
    /// the generator's invariants, checked, with the first violation named.
    pub fn validate(&self) -> Result<(), String> {
        let n = self.steps.len();
        if !(1..=18).contains(&n) || self.config.settings.steps != n {
            return Err(format!(
                "{n} steps (config says {}; 1..=18)",
                self.config.settings.steps
            ));
        }
        let known = |v: &StepId| v.index() < n;
        let well_formed = |s: &str, prefix: &str| {
            s.strip_prefix(prefix)
                .is_some_and(|d| d.len() == 4 && d.bytes().all(|b| b.is_ascii_digit()))
        };
        for (i, s) in self.steps.iter().enumerate() {
            if s.id.index() != i {
                return Err(format!(
                    "step {i} has id {} (ids run s1, s2, … in order)",
                    s.id
                ));
            }
            if !well_formed(&s.code, "RC-") {
                return Err(format!(
                    "{}: completion code '{}' is not RC-dddd",
                    s.id, s.code
                ));
            }
            if self.steps[..i].iter().any(|o| o.code == s.code) {
                return Err(format!(
                    "{}: completion code {} is used twice",
                    s.id, s.code
                ));
            }
            if let Some(u) = s.requires.iter().find(|u| !known(u) || **u == s.id) {
                return Err(format!(
                    "{} requires {u}, which is not another step of the plan",
                    s.id
                ));
            }
        }
        let graph = crate::ladder::state::TaskState::new(
            self.steps.iter().map(|s| s.requires.clone()).collect(),
        );
        if graph.has_cycle() {
            return Err("the prerequisite graph has a cycle".into());
        }
        let r = &self.revision;
        let rewired = r
            .rewires
            .iter()
            .flat_map(|(w, p)| std::iter::once(w).chain(p));
        let relaxed = r.relax.iter().flat_map(|(w, u)| [w, u]);
        if let Some(v) = std::iter::once(&r.cancel)
            .chain(rewired)
            .chain(relaxed)
            .find(|v| !known(v))
        {
            return Err(format!(
                "the revision names {v}, which is not a step of the plan"
            ));
        }
        if self.turns.len() != TURNS {
            return Err(format!(
                "{} turns (an episode has {TURNS})",
                self.turns.len()
            ));
        }
        if self.turns.get(r.turn).map(|t| t.kind) != Some(TurnKind::Revision) {
            return Err(format!(
                "the revision is at turn {}, which is not the revision turn",
                r.turn
            ));
        }
        for (i, t) in self.turns.iter().enumerate() {
            if t.index != i {
                return Err(format!("turn {i} has index {}", t.index));
            }
            if !well_formed(&t.work_order, "#W") {
                return Err(format!(
                    "turn {i}: work order '{}' is not #Wdddd",
                    t.work_order
                ));
            }
            if self.turns[..i].iter().any(|o| o.work_order == t.work_order) {
                return Err(format!(
                    "turn {i}: work order {} is used twice",
                    t.work_order
                ));
            }
            if let Some(v) = t.step.iter().chain(&t.named).find(|v| !known(v)) {
                return Err(format!(
                    "turn {i} names {v}, which is not a step of the plan"
                ));
            }
        }
        Ok(())
    }

    /// Whether the episode has no steps (never true for a generated one).
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn episode_config_keeps_its_key_order_and_reads_back() {
        let mut c = EpisodeConfig::paper(Domain::Release, 12, 0.3, 4242);
        c.settings.ambiguous_rate = 0.5;
        let text = serde_json::to_string(&c).unwrap();
        assert_eq!(
            text,
            r#"{"domain":"release","steps":12,"density":0.3,"seed":4242,"brief":"amended","protocol":"text","paraphrase_tier":0,"ambiguous_rate":0.5}"#
        );
        assert_eq!(serde_json::from_str::<EpisodeConfig>(&text).unwrap(), c);
    }
}
