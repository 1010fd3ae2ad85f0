//! A grid: cells crossed from axes (the paper's tables are grids), run in
//! one process through one model, each cell into its own run directory
//! under the grid directory, and split into shards for other machines.
//!
//! A grid file is TOML. Top-level keys apply to every cell; each
//! `[[cross]]` table is one cross product of its lists, falling back to the
//! top-level values; the grid is the union of the crosses in file order
//! (without `[[cross]]`, the top level is the one cross). Table 2 of the
//! paper is two crosses:
//!
//! ```toml
//! agent = "model"
//! episodes = 128
//! arms = ["raw", "checklist", "directive", "enforce"]
//! [[cross]]
//! steps = [5, 10, 15, 18]
//! density = [0.15]
//! [[cross]]
//! steps = [15]
//! density = [0.3]
//! ```

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::table::field;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::cell::{AgentSpec, CellConfig, CellError, EmbedderSpec, Source};
use super::runlog::{read_run, RunRead};
use super::runner::RunOptions;
use crate::ladder::arms::Arm;
use crate::ladder::episode::domain::Domain;
use crate::ladder::episode::generator::{self, GenError};
use crate::ladder::episode::{BriefVariant, EpisodeSettings, Protocol};
use crate::ladder::parts::scripted::Scripted;

/// The grid manifest's format.
pub const GRID_FORMAT: &str = "statebench-grid/1";

/// The axes of a grid, or one `[[cross]]` of them. Lists are axes; the
/// scalars are the same for every cell of the cross. The flags of `ladder
/// cell` and `ladder grid` are these keys (lists comma-separated); a key
/// no one sets has the paper's main grid's value. Every key is skipped
/// when unset, so a key present in the JSON is one that was set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct Axes {
    /// Template pools: procurement, release [default: procurement].
    #[arg(long, value_delimiter = ',')]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<Vec<Domain>>,
    /// Graph sizes S, 1..=18 [default: 10].
    #[arg(long, value_delimiter = ',')]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<Vec<usize>>,
    /// Extra-edge densities ρ in [0, 1] [default: 0.15].
    #[arg(long, value_delimiter = ',')]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub density: Option<Vec<f64>>,
    /// Brief variants [default: amended].
    #[arg(long, value_enum, value_delimiter = ',')]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub brief: Option<Vec<BriefVariant>>,
    /// Booking protocols: text (ref lines), tool (ACTION lines) or native
    /// (tool calls stamping a workspace) [default: text].
    #[arg(long, value_enum, value_delimiter = ',')]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Vec<Protocol>>,
    /// Paraphrase tiers: 0 assigned, 1 rotated, 2 held-out rewrites (needs
    /// --paraphrase-cache) [default: 0].
    #[arg(long, value_delimiter = ',')]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paraphrase_tier: Option<Vec<u8>>,
    /// Rates at which filler turns become ambiguous probes, in [0, 1]
    /// [default: 0].
    #[arg(long, value_delimiter = ',')]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ambiguous_rate: Option<Vec<f64>>,
    /// Thinking regimes (Qwen3 `enable_thinking`), e.g. false,true (--think
    /// alone means true) [default: false].
    #[arg(long, value_delimiter = ',')]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<Vec<bool>>,
    /// Models for the in-process engine (a .gguf, a checkpoint directory or
    /// a hub id); run one after another, each through its own engine. The
    /// flag is --model, one model.
    #[arg(skip)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<Vec<String>>,
    /// Arms of every cell, in ladder order: adjacent arms are contrasted
    /// (not an axis: a cell's arms are paired on its seeds) [default:
    /// raw,checklist,directive,enforce].
    #[arg(long, value_delimiter = ',')]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arms: Option<Vec<Arm>>,
    /// Agent [default: perfect].
    #[arg(long, value_enum)]
    #[serde(default, skip_serializing_if = "Option::is_none", with = "agent_kind")]
    pub agent: Option<AgentSpec>,
    /// Matcher: oracle (the scripted step) or model [default: model with
    /// the model agent, else oracle].
    #[arg(long, value_enum)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matcher: Option<Source>,
    /// Compiler: oracle (the generator's graph) or model [default: model
    /// with the model agent, else oracle].
    #[arg(long, value_enum)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compiler: Option<Source>,
    /// Episodes per cell [default: 128].
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub episodes: Option<u64>,
    /// First seed of every cell [default: 100].
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed_start: Option<u64>,
    /// Embedder of the retrieval-memory arms: `agent` (the agent model's
    /// final hidden state), `lexical` (hashed bag of words), or an
    /// embedding model (e.g. a Qwen3-Embedding-0.6B directory) loaded
    /// in-process [default: agent when a model runs, else lexical].
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedder: Option<EmbedderSpec>,
    /// Writer of the mem0 arms' facts: oracle (the realized state) or
    /// model [default: as the matcher].
    #[arg(long, value_enum)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_writer: Option<Source>,
    /// Corrupted-state ablation: flip done bits and drop edges at this rate
    /// per step-turn, in [0, 1].
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub corrupt: Option<f64>,
    /// Spoofed-state probe: forge state in the scripted user's message on
    /// this share of the turns that execute or confirm a step, in [0, 1]
    /// (the book's docs/src/probes.md).
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spoof: Option<f64>,
    /// Tool-faults probe: fail this share of the calls the gate admits with
    /// a transient error, in [0, 1] (tool and native protocols).
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_faults: Option<f64>,
    /// Escalation probe: a refusal on a gated arm offers the agent to ask
    /// the user to authorize the work; the scripted user grants a redo of
    /// a finished step on a seeded half of the requests.
    #[arg(long)]
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub escalation: bool,
    /// Run the matcher on filler and revision turns too.
    #[arg(long)]
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_bypass: bool,
    /// Crosses (top level only).
    #[arg(skip)]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cross: Vec<Axes>,
}

/// `agent` as grid files and flags name the kinds: `perfect`,
/// `always-book`, `credulous`, `model`.
mod agent_kind {
    use super::AgentSpec;
    use clap::ValueEnum;
    use serde::{de::Error, Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(a: &Option<AgentSpec>, s: S) -> Result<S::Ok, S::Error> {
        let name = a.as_ref().and_then(|a| a.to_possible_value());
        name.as_ref().map(|v| v.get_name()).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<AgentSpec>, D::Error> {
        let name = String::deserialize(d)?;
        AgentSpec::from_str(&name, false).map(Some).map_err(|_| {
            D::Error::unknown_variant(&name, &["perfect", "always-book", "credulous", "model"])
        })
    }
}

/// One setting a grid crosses. Its key is the grid file's, the flag's and
/// the cell configuration's (the values are the same type in [`Axes`] and
/// [`CellConfig`]), so a cell takes an axis's value by key.
#[derive(Clone, Copy)]
pub struct Axis {
    pub key: &'static str,
    /// The report's column; cell names put it before the value when
    /// `prefixed` (`S10`), else show the value alone (`release`).
    pub label: &'static str,
    pub prefixed: bool,
    /// A value as cell names and report columns show it.
    pub show: fn(&Value) -> String,
}

impl Axis {
    const fn new(key: &'static str, label: &'static str) -> Axis {
        Axis {
            key,
            label,
            prefixed: false,
            show: field,
        }
    }

    const fn prefixed(self) -> Axis {
        Axis {
            prefixed: true,
            ..self
        }
    }
}

/// The axes a grid crosses, in crossing order after the model (the last
/// varies fastest). A new episode setting is a field of
/// [`EpisodeSettings`], a key of [`Axes`] and an entry here.
pub const AXES: [Axis; 8] = [
    Axis {
        show: regime,
        ..Axis::new("thinking", "regime")
    },
    Axis::new("domain", "domain"),
    Axis::new("steps", "S").prefixed(),
    Axis::new("density", "rho").prefixed(),
    Axis::new("brief", "brief"),
    Axis::new("protocol", "protocol"),
    Axis::new("paraphrase_tier", "tier").prefixed(),
    Axis::new("ambiguous_rate", "amb").prefixed(),
];

fn regime(thinking: &Value) -> String {
    match thinking.as_bool() {
        Some(true) => "think".into(),
        _ => "nothink".into(),
    }
}

/// Why a grid cannot be made or run; each names the file and key.
#[derive(Debug, thiserror::Error)]
pub enum GridError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}{line}: {message}")]
    Parse {
        path: String,
        line: String,
        message: String,
    },
    #[error("{path}: {key} = []: an axis needs at least one value")]
    EmptyAxis { path: String, key: &'static str },
    #[error("{path}: {key} = {value}: {why}")]
    Value {
        path: String,
        key: &'static str,
        value: String,
        why: String,
    },
    #[error("{path}: [[cross]] inside [[cross]]: crosses do not nest")]
    NestedCross { path: String },
    #[error("--shard {0}: expected i/n with 0 <= i < n (e.g. 0/4)")]
    Shard(String),
    #[error("{dir}: {why}")]
    Dir { dir: String, why: String },
    #[error("{path}: the axes cross into {cells} cells, more than a grid holds (at most {MAX_CELLS}; split it into several grids)")]
    TooManyCells { path: String, cells: String },
    /// A lock held elsewhere, or a file that cannot be a grid's.
    #[error(transparent)]
    Files(#[from] crate::rundir::DirError),
}

/// What messages call axes given as flags.
pub const FLAGS: &str = "grid flags";

/// Most cells in one grid: ten times Table 2's crossed with every model of
/// a sweep, and few enough that the cells' names and configurations fit in
/// memory and the grid directory; a larger study is several grids (or
/// shards of them).
pub const MAX_CELLS: u64 = 10_000;

impl Axes {
    /// Reads a grid file.
    pub fn read(path: &Path) -> Result<Axes, GridError> {
        let p = path.display().to_string();
        let text = crate::rundir::read_manifest_text(path)?;
        let axes: Axes = toml::from_str(&text).map_err(|e| GridError::Parse {
            // The line number and the line itself, which names the key and value.
            line: e
                .span()
                .map(|s| {
                    let n = text[..s.start].matches('\n').count();
                    let src = text.lines().nth(n).unwrap_or("").trim();
                    format!(" line {} (`{src}`)", n + 1)
                })
                .unwrap_or_default(),
            message: e.message().replace('\n', " "),
            path: p.clone(),
        })?;
        if axes.cross.iter().any(|c| !c.cross.is_empty()) {
            return Err(GridError::NestedCross { path: p });
        }
        Ok(axes)
    }

    /// These axes with every key `over` sets replaced (flags over a file,
    /// a cross over the top level).
    pub fn overlay(self, over: Axes) -> Axes {
        let mut keys = self.keys();
        keys.extend(over.keys());
        serde_json::from_value(Value::Object(keys)).expect("axes read back their own keys")
    }

    /// The keys set, as JSON.
    fn keys(&self) -> Map<String, Value> {
        match serde_json::to_value(self) {
            Ok(Value::Object(m)) => m,
            _ => unreachable!("axes serialize to an object"),
        }
    }

    /// The crosses: each `[[cross]]` over the top level, or the top level.
    fn crosses(&self) -> Vec<Axes> {
        let top = Axes {
            cross: Vec::new(),
            ..self.clone()
        };
        if self.cross.is_empty() {
            return vec![top];
        }
        self.cross
            .iter()
            .map(|x| top.clone().overlay(x.clone()))
            .collect()
    }

    /// How many cells these axes make (duplicates included), or None past
    /// 2^64: the product of the axes' lengths, an unset axis counting one.
    fn size(&self) -> Option<u64> {
        let keys = self.keys();
        let models = self.model.as_ref().map_or(1, |m| m.len() as u64);
        AXES.iter()
            .map(|a| {
                keys.get(a.key)
                    .and_then(Value::as_array)
                    .map_or(1, |v| v.len() as u64)
            })
            .try_fold(models, |n, k| n.checked_mul(k))
    }
}

/// One cell of a grid: its directory name, configuration and model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GridCell {
    /// Directory under the grid directory.
    pub name: String,
    /// The configuration; its agent is `model` until a model is loaded, and
    /// its memory parts are settled when it runs.
    pub config: CellConfig,
    /// The model spec (in-process), or None (scripted or `--endpoint`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The embedder its memory arms were asked for (`--embedder`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedder: Option<EmbedderSpec>,
}

/// A grid: its axes (as given) and the cells they make.
#[derive(Debug, Clone, PartialEq)]
pub struct Grid {
    pub axes: Axes,
    pub cells: Vec<GridCell>,
}

impl Grid {
    /// Crosses the axes into cells, checking every value; `source` names the
    /// file (or the flags) in messages.
    pub fn new(axes: Axes, source: &str) -> Result<Grid, GridError> {
        let crosses = axes.crosses();
        // Counted before anything is crossed: a grid of 10^7 cells would
        // exhaust memory before it could be refused.
        let total = crosses
            .iter()
            .try_fold(0u64, |t, x| t.checked_add(x.size()?));
        if total.is_none_or(|t| t > MAX_CELLS) {
            return Err(GridError::TooManyCells {
                path: source.into(),
                cells: total.map_or("more than 2^64".into(), |t| t.to_string()),
            });
        }
        let mut cells: Vec<GridCell> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for cross in &crosses {
            for c in expand(cross, source)? {
                let key = serde_json::to_string(&c).expect("cells serialize");
                if seen.insert(key) {
                    cells.push(c);
                }
            }
        }
        name_cells(&mut cells);
        Ok(Grid { axes, cells })
    }

    /// The grid's identity: a hash of its cells (shards of one grid share it).
    pub fn id(&self) -> String {
        use sha2::{Digest, Sha256};
        let text = serde_json::to_string(&self.cells).expect("cells serialize");
        crate::hex(&Sha256::digest(text.as_bytes())[..8])
    }

    /// Episode-arms in the whole grid.
    pub fn episode_arms(&self) -> u64 {
        self.cells
            .iter()
            .map(|c| c.config.episodes * c.config.arms.len() as u64)
            .sum()
    }
}

fn bad(source: &str, key: &'static str, value: impl std::fmt::Display, why: String) -> GridError {
    GridError::Value {
        path: source.into(),
        key,
        value: value.to_string(),
        why,
    }
}

/// The cell a cross's scalars make, before its axes are set: the paper's
/// main grid where a key is unset.
fn base_cell(x: &Axes, source: &str) -> Result<CellConfig, GridError> {
    let agent = x
        .agent
        .clone()
        .unwrap_or(AgentSpec::Scripted(Scripted::Perfect));
    let parts = match agent {
        AgentSpec::Scripted(_) => Source::Oracle,
        AgentSpec::Model { .. } => Source::Model,
    };
    let arms = x.arms.clone().unwrap_or_else(|| Arm::LADDER.to_vec());
    if arms.is_empty() {
        return Err(GridError::EmptyAxis {
            path: source.into(),
            key: "arms",
        });
    }
    if let Some(e) = x.corrupt.filter(|e| !(0.0..=1.0).contains(e)) {
        return Err(bad(
            source,
            "corrupt",
            e,
            "the rate must be in [0, 1]".into(),
        ));
    }
    if let Some(r) = x.spoof.filter(|r| !(0.0..=1.0).contains(r)) {
        return Err(bad(source, "spoof", r, "the rate must be in [0, 1]".into()));
    }
    if let Some(r) = x.tool_faults.filter(|r| !(0.0..=1.0).contains(r)) {
        return Err(bad(
            source,
            "tool_faults",
            r,
            "the rate must be in [0, 1]".into(),
        ));
    }
    let memory = arms.iter().any(|a| a.uses_memory());
    Ok(CellConfig {
        episode: EpisodeSettings::default(),
        seed_start: x.seed_start.unwrap_or(100),
        episodes: x.episodes.unwrap_or(128),
        arms,
        agent,
        matcher: x.matcher.unwrap_or(parts),
        compiler: x.compiler.unwrap_or(parts),
        thinking: false,
        options: RunOptions {
            bypass_matcher: !x.no_bypass,
            corrupt: x.corrupt,
            spoof: x.spoof,
            tool_faults: x.tool_faults,
            escalation: x.escalation,
        },
        embedder: None,
        memory_writer: x.memory_writer.filter(|_| memory),
    })
}

/// The cells of one cross, in a fixed order: model, then [`AXES`] in
/// order (the last fastest), each checked.
fn expand(x: &Axes, source: &str) -> Result<Vec<GridCell>, GridError> {
    let base = base_cell(x, source)?;
    let models: Vec<Option<String>> = match &x.model {
        Some(m) if m.is_empty() => {
            return Err(GridError::EmptyAxis {
                path: source.into(),
                key: "model",
            })
        }
        Some(m) => m.iter().cloned().map(Some).collect(),
        None => vec![None],
    };
    let embedder = x.embedder.clone().filter(|_| base.uses_memory());
    let keys = x.keys();
    let base = match serde_json::to_value(&base) {
        Ok(Value::Object(m)) => m,
        _ => unreachable!("a cell serializes to an object"),
    };
    let mut lists = Vec::new();
    for a in &AXES {
        lists.push(match keys.get(a.key) {
            Some(Value::Array(v)) if v.is_empty() => {
                return Err(GridError::EmptyAxis {
                    path: source.into(),
                    key: a.key,
                })
            }
            Some(Value::Array(v)) => v.clone(),
            _ => vec![base[a.key].clone()],
        });
    }
    let mut cells = Vec::new();
    for model in &models {
        // An odometer over the axes' values.
        let mut at = vec![0; lists.len()];
        loop {
            let mut cfg = base.clone();
            for ((a, list), &i) in AXES.iter().zip(&lists).zip(&at) {
                cfg.insert(a.key.into(), list[i].clone());
            }
            let config: CellConfig = serde_json::from_value(Value::Object(cfg))
                .expect("an axis's values are its cell key's");
            check(&config, source)?;
            cells.push(GridCell {
                name: String::new(),
                config,
                model: model.clone(),
                embedder: embedder.clone(),
            });
            let Some(k) = (0..at.len()).rev().find(|&k| at[k] + 1 < lists[k].len()) else {
                break;
            };
            at[k] += 1;
            at[k + 1..].fill(0);
        }
    }
    Ok(cells)
}

/// The cell's checks, named by the key that failed.
fn check(cfg: &CellConfig, source: &str) -> Result<(), GridError> {
    generator::validate(&cfg.episode).map_err(|e| match e {
        GenError::Steps(s) => bad(source, "steps", s, e.to_string()),
        GenError::Density(d) => bad(source, "density", d, e.to_string()),
        GenError::AmbiguousRate(a) => bad(source, "ambiguous_rate", a, e.to_string()),
        GenError::Tier(t) => bad(source, "paraphrase_tier", t, e.to_string()),
        other => bad(source, "grid", "", other.to_string()),
    })?;
    cfg.validate().map_err(|e| match e {
        CellError::SeedRange { start, .. } => bad(source, "seed_start", start, e.to_string()),
        CellError::TooLarge { episodes, .. } => bad(source, "episodes", episodes, e.to_string()),
        CellError::FaultsNeedTools => bad(source, "tool_faults", "", e.to_string()),
        e => bad(source, "arms", arm_list(&cfg.arms), e.to_string()),
    })
}

fn arm_list(arms: &[Arm]) -> String {
    let names: Vec<&str> = arms.iter().map(|a| a.name()).collect();
    format!("[{}]", names.join(", "))
}

/// Names each cell by the values that vary across the grid (the model
/// by its file stem), so directories read like the table's rows.
fn name_cells(cells: &mut [GridCell]) {
    let parts = |c: &GridCell| -> Vec<(&'static str, String)> {
        let model = c
            .model
            .as_deref()
            .map(|m| {
                let stem = Path::new(m)
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_else(|| m.to_string());
                stem.replace(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '.'), "-")
            })
            .unwrap_or_default();
        let mut parts = vec![("", model)];
        parts.extend(
            labels(&c.config)
                .into_iter()
                .map(|(a, v)| match a.prefixed {
                    true => (a.label, v),
                    false => ("", v),
                }),
        );
        // Scalars that crosses may set apart (a probe beside its control):
        // named only where set, so the control keeps the plain name.
        let o = &c.config.options;
        let rate = |label: &str, r: Option<f64>| {
            r.map_or_else(String::new, |r| format!("{label}{}", field(&r)))
        };
        let escalation = if o.escalation { "escalation" } else { "" };
        for name in [
            rate("corrupt", o.corrupt),
            rate("spoof", o.spoof),
            rate("faults", o.tool_faults),
            escalation.to_string(),
        ] {
            parts.push(("", name));
        }
        parts
    };
    let all: Vec<_> = cells.iter().map(parts).collect();
    let varies: Vec<bool> = (0..all[0].len())
        .map(|k| all.iter().map(|p| &p[k].1).collect::<BTreeSet<_>>().len() > 1)
        .collect();
    let mut names = BTreeSet::new();
    for (i, (c, p)) in cells.iter_mut().zip(&all).enumerate() {
        let mut name: Vec<String> = p
            .iter()
            .zip(&varies)
            .filter(|(_, v)| **v)
            .map(|((k, v), _)| format!("{k}{v}"))
            .filter(|part| !part.is_empty())
            .collect();
        if name.is_empty() {
            name.push("cell".into());
        }
        let mut n = name.join("_");
        // Two models with one stem: keep names distinct.
        if !names.insert(n.clone()) {
            n = format!("{n}_{i}");
            names.insert(n.clone());
        }
        c.name = n;
    }
}

/// A cell's value on each axis, as names and reports show it.
pub fn labels(cfg: &CellConfig) -> Vec<(Axis, String)> {
    let json = serde_json::to_value(cfg).unwrap_or_default();
    AXES.iter().map(|a| (*a, (a.show)(&json[a.key]))).collect()
}

/// One of n disjoint parts of a grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

impl std::str::FromStr for Shard {
    type Err = GridError;
    fn from_str(s: &str) -> Result<Shard, GridError> {
        let bad = || GridError::Shard(s.to_string());
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let (index, count) = (
            i.trim().parse().map_err(|_| bad())?,
            n.trim().parse().map_err(|_| bad())?,
        );
        if count == 0 || index >= count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }
}

impl Shard {
    /// The shard a scheduler's job array names: Slurm's
    /// `SLURM_ARRAY_TASK_ID` (less `SLURM_ARRAY_TASK_MIN`) of
    /// `SLURM_ARRAY_TASK_COUNT`, or a Kubernetes
    /// Indexed Job's `JOB_COMPLETION_INDEX` with `STATEBENCH_SHARD_COUNT`
    /// (Kubernetes does not export the completion count).
    pub fn from_env() -> Result<Option<Shard>, GridError> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let pair = match (
            var("SLURM_ARRAY_TASK_ID"),
            var("SLURM_ARRAY_TASK_COUNT"),
            var("JOB_COMPLETION_INDEX"),
            var("STATEBENCH_SHARD_COUNT"),
        ) {
            // Array ids may start above 0 (`--array=1-8`).
            (Some(i), Some(n), _, _) => Some(match var("SLURM_ARRAY_TASK_MIN") {
                Some(min) => match (i.parse::<u64>(), min.parse::<u64>()) {
                    (Ok(a), Ok(b)) if a >= b => ((a - b).to_string(), n),
                    _ => (i, n),
                },
                None => (i, n),
            }),
            (_, _, Some(i), Some(n)) => Some((i, n)),
            _ => None,
        };
        pair.map(|(i, n)| format!("{i}/{n}").parse()).transpose()
    }

    /// The seeds of each cell this shard runs. The grid is cut into units
    /// of (model, domain, S, ρ, block of seeds) holding every cell that
    /// shares them, so a shard keeps the compiles its cells share; units
    /// go to the least-loaded shard, largest first (ties by position), with
    /// work estimated as seeds × arms × S.
    pub fn seeds(&self, grid: &Grid) -> Vec<Vec<u64>> {
        let n = u64::from(self.count);
        let mut units: Vec<(Vec<(usize, u64)>, u64)> = Vec::new();
        let mut index: std::collections::BTreeMap<(String, u64), usize> = Default::default();
        for (ci, c) in grid.cells.iter().enumerate() {
            let g = &c.config;
            let block = (g.episodes / (4 * n)).clamp(1, 8);
            let family = format!(
                "{:?}|{:?}|{}|{}",
                c.model,
                g.episode.domain,
                g.episode.steps,
                g.episode.density.to_bits()
            );
            for (k, seed) in g.seeds().enumerate() {
                let key = (family.clone(), g.seed_start + (k as u64 / block) * block);
                let u = *index.entry(key).or_insert_with(|| {
                    units.push((Vec::new(), 0));
                    units.len() - 1
                });
                units[u].0.push((ci, seed));
                units[u].1 += g.arms.len() as u64 * g.episode.steps as u64;
            }
        }
        let mut order: Vec<usize> = (0..units.len()).collect();
        order.sort_by_key(|&u| (std::cmp::Reverse(units[u].1), u));
        let mut load = vec![0u64; self.count as usize];
        let mut out = vec![Vec::new(); grid.cells.len()];
        for u in order {
            let shard = (0..load.len()).min_by_key(|&s| (load[s], s)).unwrap_or(0);
            load[shard] += units[u].1;
            if shard == self.index as usize {
                for &(ci, seed) in &units[u].0 {
                    out[ci].push(seed);
                }
            }
        }
        for s in &mut out {
            s.sort_unstable();
        }
        out
    }
}

/// `grid.json`: what a grid directory holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GridManifest {
    /// [`GRID_FORMAT`].
    pub format: String,
    /// [`Grid::id`]; the shards of one grid share it.
    pub grid: String,
    pub axes: Axes,
    pub cells: Vec<GridCell>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<Shard>,
}

impl GridManifest {
    pub fn new(grid: &Grid, shard: Option<Shard>) -> GridManifest {
        GridManifest {
            format: GRID_FORMAT.into(),
            grid: grid.id(),
            axes: grid.axes.clone(),
            cells: grid.cells.clone(),
            shard,
        }
    }

    /// Reads `dir/grid.json`, or None when `dir` is not a grid directory.
    pub fn read(dir: &Path) -> Result<Option<GridManifest>, GridError> {
        let path = dir.join("grid.json");
        if !path.exists() {
            return Ok(None);
        }
        let p = path.display().to_string();
        let text = crate::rundir::read_manifest_text(&path)?;
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| GridError::Parse {
                path: p,
                line: format!(" line {}", e.line()),
                message: e.to_string(),
            })
    }

    /// Writes `dir/grid.json`, or checks that the one there is this grid
    /// and shard (a resume).
    pub fn create_or_check(&self, dir: &Path) -> Result<(), GridError> {
        let d = dir.display().to_string();
        if let Some(old) = GridManifest::read(dir)? {
            if old.grid != self.grid {
                return Err(GridError::Dir {
                    dir: d,
                    why: format!(
                        "holds grid {}, not this one ({}): use another --out",
                        old.grid, self.grid
                    ),
                });
            }
            if old.shard != self.shard {
                return Err(GridError::Dir {
                    dir: d,
                    why: format!(
                        "holds shard {}, not {}",
                        shard_text(old.shard),
                        shard_text(self.shard)
                    ),
                });
            }
            return Ok(());
        }
        std::fs::create_dir_all(dir).map_err(|source| GridError::Io {
            path: d.clone(),
            source,
        })?;
        let text = serde_json::to_string_pretty(self).expect("grid manifest serializes") + "\n";
        // Whole or absent: a grid directory with a torn grid.json could
        // not be resumed or reported.
        Ok(crate::rundir::manifest::write_atomic(
            &dir.join("grid.json"),
            text.as_bytes(),
        )?)
    }

    /// The run directories of the cells.
    pub fn cell_dirs(&self, dir: &Path) -> Vec<(String, PathBuf)> {
        self.cells
            .iter()
            .map(|c| (c.name.clone(), dir.join(&c.name)))
            .collect()
    }
}

fn shard_text(s: Option<Shard>) -> String {
    match s {
        Some(s) => format!("{}/{}", s.index, s.count),
        None => "none (the whole grid)".into(),
    }
}

/// Reads run directories and grid directories for one report. A grid
/// directory stands for its cells, in grid order; the shards of one grid
/// merge cell by cell (each cell's episodes from every shard, in seed and
/// arm order), so the report of n shards is the report of the whole grid.
/// Cells of a grid are named by their directory under the grid.
pub fn read_runs(dirs: &[PathBuf]) -> Result<Vec<RunRead>, GridError> {
    let mut runs: Vec<RunRead> = Vec::new();
    let mut grid: Option<(String, String)> = None;
    // Cell name → its run in `runs`.
    let mut merged: std::collections::BTreeMap<String, usize> = Default::default();
    // A directory named twice would count its cells twice (and double the
    // multiple-comparison correction).
    let mut named: std::collections::BTreeMap<PathBuf, &Path> = Default::default();
    for d in dirs {
        let real = std::fs::canonicalize(d).unwrap_or_else(|_| d.clone());
        if let Some(first) = named.insert(real, d) {
            return Err(GridError::Dir {
                dir: d.display().to_string(),
                why: format!(
                    "is named twice (also as {}): a report reads each directory once",
                    first.display()
                ),
            });
        }
    }
    for d in dirs {
        let Some(m) = GridManifest::read(d)? else {
            runs.push(read_run(d).map_err(|e| dir_error(d, e))?);
            continue;
        };
        let here = d.display().to_string();
        match &grid {
            Some((id, first)) if *id != m.grid => {
                return Err(GridError::Dir {
                    dir: here,
                    why: format!(
                    "is a shard of grid {}, but {first} is of grid {id}: report one grid at a time",
                    m.grid
                ),
                })
            }
            None => grid = Some((m.grid.clone(), here.clone())),
            _ => {}
        }
        for (name, path) in m.cell_dirs(d) {
            if !path.join("manifest.json").exists() {
                continue;
            }
            let mut run = read_run(&path).map_err(|e| dir_error(&path, e))?;
            run.dir = PathBuf::from(&name);
            let Some(&at) = merged.get(&name) else {
                merged.insert(name, runs.len());
                runs.push(run);
                continue;
            };
            let into = &mut runs[at];
            if into.manifest.config_hash() != run.manifest.config_hash() {
                return Err(GridError::Dir {
                    dir: path.display().to_string(),
                    why: format!(
                        "ran this cell with another configuration or model than {} (model {} vs {}, arithmetic or weights may differ): shards must run one engine",
                        into.paths[0].display(),
                        run.manifest.model.name(),
                        into.manifest.model.name()
                    ),
                });
            }
            into.foreign += run.foreign;
            into.duplicates += run.duplicates;
            into.paths.append(&mut run.paths);
            into.episodes.append(&mut run.episodes);
            into.failed.append(&mut run.failed);
            for (k, v) in run.probes {
                into.probes.entry(k).or_insert(v);
            }
            into.forged.append(&mut run.forged);
        }
    }
    for r in &mut runs {
        r.sort();
    }
    Ok(runs)
}

fn dir_error(d: &Path, e: crate::rundir::DirError) -> GridError {
    GridError::Dir {
        dir: d.display().to_string(),
        why: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid(toml: &str) -> Grid {
        Grid::new(toml::from_str(toml).unwrap(), "test").unwrap()
    }

    /// Each axis's key is the cell configuration's: two values of it make
    /// two cells that differ there alone, named and labelled by it.
    #[test]
    fn every_axis_sets_its_own_key_of_a_cell() {
        let values = [
            ("thinking", "[false, true]"),
            ("domain", r#"["procurement", "release"]"#),
            ("steps", "[5, 6]"),
            ("density", "[0.15, 0.3]"),
            ("brief", r#"["original", "amended"]"#),
            ("protocol", r#"["text", "tool"]"#),
            ("paraphrase_tier", "[0, 1]"),
            ("ambiguous_rate", "[0.0, 0.3]"),
        ];
        assert_eq!(values.map(|v| v.0), AXES.map(|a| a.key));
        for (a, (key, list)) in AXES.iter().zip(values) {
            let g = grid(&format!("{key} = {list}"));
            assert_eq!(g.cells.len(), 2, "{key}");
            let [x, y] = [0, 1].map(|i| serde_json::to_value(&g.cells[i].config).unwrap());
            let differ: Vec<&String> = x
                .as_object()
                .unwrap()
                .keys()
                .filter(|k| x[k.as_str()] != y[k.as_str()])
                .collect();
            assert_eq!(differ, [key], "{key}");
            let shown = (a.show)(&y[key]);
            let name = if a.prefixed {
                format!("{}{shown}", a.label)
            } else {
                shown
            };
            assert_eq!(g.cells[1].name, name, "{key}");
        }
    }

    #[test]
    fn cells_cross_in_axis_order_and_crosses_fall_back_to_the_top() {
        let g = grid("thinking = [false, true]\nsteps = [5, 6]\n[[cross]]\ndensity = [0.3]\n[[cross]]\nsteps = [7]");
        let names: Vec<&str> = g.cells.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "nothink_S5_rho0.3",
                "nothink_S6_rho0.3",
                "think_S5_rho0.3",
                "think_S6_rho0.3",
                "nothink_S7_rho0.15",
                "think_S7_rho0.15"
            ]
        );
    }

    #[test]
    fn agents_keep_their_spellings() {
        for s in [
            "scripted:perfect",
            "scripted:always-book",
            "model",
            "model:qwen3",
        ] {
            let a: AgentSpec = serde_json::from_value(serde_json::json!(s)).unwrap();
            assert_eq!(serde_json::to_value(&a).unwrap(), s);
        }
        assert!(serde_json::from_str::<AgentSpec>(r#""perfect""#).is_err());
        assert!(serde_json::from_str::<AgentSpec>(r#""modelx""#).is_err());
        // Grid files and grid.json name the kinds.
        let axes: Axes = toml::from_str(r#"agent = "always-book""#).unwrap();
        assert_eq!(axes.agent, Some(AgentSpec::Scripted(Scripted::AlwaysBook)));
        assert_eq!(
            serde_json::to_string(&axes).unwrap(),
            r#"{"agent":"always-book"}"#
        );
        let g = Grid::new(axes, "test").unwrap();
        assert_eq!(g.cells[0].config.agent.to_string(), "scripted:always-book");
        assert!(toml::from_str::<Axes>(r#"agent = "scripted:perfect""#).is_err());
    }

    #[test]
    fn flags_replace_the_keys_they_set() {
        let file: Axes =
            toml::from_str("steps = [5, 6]\nepisodes = 3\n[[cross]]\ndensity = [0.3]").unwrap();
        let flags = Axes {
            steps: Some(vec![7]),
            no_bypass: true,
            ..Axes::default()
        };
        let a = file.overlay(flags);
        assert_eq!(a.steps, Some(vec![7]));
        assert_eq!(a.episodes, Some(3));
        assert!(a.no_bypass);
        assert_eq!(a.cross.len(), 1);
    }
}
