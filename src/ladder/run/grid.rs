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

use serde::{Deserialize, Serialize};

use super::cell::{CellConfig, Source};
use super::runlog::{read_run, RunRead};
use super::runner::RunOptions;
use crate::ladder::arms::Arm;
use crate::ladder::episode::domain::Domain;
use crate::ladder::episode::generator::{self, GenError};
use crate::ladder::episode::{BriefVariant, EpisodeConfig, Protocol};
use crate::ladder::parts::scripted::Scripted;
use crate::ladder::parts::Agent;

/// The grid manifest's format.
pub const GRID_FORMAT: &str = "statebench-grid/1";

/// Which agent a grid's cells run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum AgentKind {
    /// The scripted perfect agent.
    Perfect,
    /// The memoryless policy that books every request.
    AlwaysBook,
    /// The model (in-process or `--endpoint`).
    Model,
}

/// The axes of a grid, or one `[[cross]]` of them. Lists are axes; the
/// scalars are the same for every cell of the cross.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Axes {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<Vec<Domain>>,
    /// S.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<Vec<usize>>,
    /// ρ.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub density: Option<Vec<f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub brief: Option<Vec<BriefVariant>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Vec<Protocol>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paraphrase_tier: Option<Vec<u8>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ambiguous_rate: Option<Vec<f64>>,
    /// Thinking regimes (Qwen3 `enable_thinking`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<Vec<bool>>,
    /// Models for the in-process engine (a .gguf, a checkpoint directory or
    /// a hub id); run one after another, each through its own engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<Vec<String>>,
    /// Arms of every cell, in ladder order (not an axis: a cell's arms are
    /// paired on its seeds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arms: Option<Vec<Arm>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentKind>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matcher: Option<Source>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compiler: Option<Source>,
    /// Episodes per cell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub episodes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed_start: Option<u64>,
    /// Crosses (top level only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cross: Vec<Axes>,
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

    /// These axes with every key `over` sets replaced (flags over a file).
    pub fn overlay(mut self, over: Axes) -> Axes {
        macro_rules! take {
            ($($f:ident),*) => { $( if over.$f.is_some() { self.$f = over.$f; } )* };
        }
        take!(
            domain,
            steps,
            density,
            brief,
            protocol,
            paraphrase_tier,
            ambiguous_rate,
            thinking,
            model,
            arms,
            agent,
            matcher,
            compiler,
            episodes,
            seed_start
        );
        if !over.cross.is_empty() {
            self.cross = over.cross;
        }
        self
    }
}

/// One cell of a grid: its directory name, configuration and model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GridCell {
    /// Directory under the grid directory.
    pub name: String,
    /// The configuration; `agent` names the agent kind (`perfect`,
    /// `always-book`, `model`) until a model is loaded.
    pub config: CellConfig,
    /// The model spec (in-process), or None (scripted or `--endpoint`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
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
        let crosses = if axes.cross.is_empty() {
            vec![Axes::default()]
        } else {
            axes.cross.clone()
        };
        // Counted before anything is crossed: a grid of 10^7 cells would
        // exhaust memory before it could be refused.
        let mut total: Option<u64> = Some(0);
        for cross in &crosses {
            total = total.and_then(|t| t.checked_add(cross_size(&axes, cross)?));
        }
        if total.is_none_or(|t| t > MAX_CELLS) {
            return Err(GridError::TooManyCells {
                path: source.into(),
                cells: total.map_or("more than 2^64".into(), |t| t.to_string()),
            });
        }
        let mut cells: Vec<GridCell> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for cross in &crosses {
            for c in expand(&axes, cross, source)? {
                let key = serde_json::to_string(&(&c.config, &c.model)).expect("cells serialize");
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

/// The value of an axis in a cross: the cross's, else the top level's,
/// else the default; an empty list is refused.
fn axis<T: Clone>(
    cross: &Option<Vec<T>>,
    top: &Option<Vec<T>>,
    default: T,
    key: &'static str,
    source: &str,
) -> Result<Vec<T>, GridError> {
    let v = cross
        .clone()
        .or_else(|| top.clone())
        .unwrap_or_else(|| vec![default]);
    if v.is_empty() {
        return Err(GridError::EmptyAxis {
            path: source.into(),
            key,
        });
    }
    Ok(v)
}

fn bad(source: &str, key: &'static str, value: impl std::fmt::Display, why: String) -> GridError {
    GridError::Value {
        path: source.into(),
        key,
        value: value.to_string(),
        why,
    }
}

/// How many cells one cross makes (duplicates included), or None past
/// 2^64: the product of its axes' lengths, an unset axis counting one.
fn cross_size(top: &Axes, x: &Axes) -> Option<u64> {
    fn len<T>(cross: &Option<Vec<T>>, top: &Option<Vec<T>>) -> u64 {
        cross
            .as_ref()
            .or(top.as_ref())
            .map_or(1, |v| v.len() as u64)
    }
    [
        len(&x.model, &top.model),
        len(&x.thinking, &top.thinking),
        len(&x.domain, &top.domain),
        len(&x.steps, &top.steps),
        len(&x.density, &top.density),
        len(&x.brief, &top.brief),
        len(&x.protocol, &top.protocol),
        len(&x.paraphrase_tier, &top.paraphrase_tier),
        len(&x.ambiguous_rate, &top.ambiguous_rate),
    ]
    .into_iter()
    .try_fold(1u64, |n, k| n.checked_mul(k))
}

/// The cells of one cross, in a fixed order (model, thinking, domain, S,
/// ρ, brief, protocol, tier, ambiguous rate), each value checked.
fn expand(top: &Axes, x: &Axes, source: &str) -> Result<Vec<GridCell>, GridError> {
    let one = |c: Option<u64>, t: Option<u64>, d: u64| c.or(t).unwrap_or(d);
    let episodes = one(x.episodes, top.episodes, 128);
    let seed_start = one(x.seed_start, top.seed_start, 100);
    let agent = x.agent.or(top.agent).unwrap_or(AgentKind::Perfect);
    let parts_default = match agent {
        AgentKind::Model => Source::Model,
        _ => Source::Oracle,
    };
    let matcher = x.matcher.or(top.matcher).unwrap_or(parts_default);
    let compiler = x.compiler.or(top.compiler).unwrap_or(parts_default);
    let arms = x
        .arms
        .clone()
        .or_else(|| top.arms.clone())
        .unwrap_or_else(|| Arm::LADDER.to_vec());
    let models: Vec<Option<String>> = match x.model.clone().or_else(|| top.model.clone()) {
        Some(m) if m.is_empty() => {
            return Err(GridError::EmptyAxis {
                path: source.into(),
                key: "model",
            })
        }
        Some(m) => m.into_iter().map(Some).collect(),
        None => vec![None],
    };
    let thinking = axis(&x.thinking, &top.thinking, false, "thinking", source)?;
    let domains = axis(
        &x.domain,
        &top.domain,
        Domain::Procurement,
        "domain",
        source,
    )?;
    let steps = axis(&x.steps, &top.steps, 10, "steps", source)?;
    let densities = axis(&x.density, &top.density, 0.15, "density", source)?;
    let briefs = axis(&x.brief, &top.brief, BriefVariant::Amended, "brief", source)?;
    let protocols = axis(
        &x.protocol,
        &top.protocol,
        Protocol::Text,
        "protocol",
        source,
    )?;
    let tiers = axis(
        &x.paraphrase_tier,
        &top.paraphrase_tier,
        0,
        "paraphrase_tier",
        source,
    )?;
    let ambiguous = axis(
        &x.ambiguous_rate,
        &top.ambiguous_rate,
        0.0,
        "ambiguous_rate",
        source,
    )?;
    if arms.is_empty() {
        return Err(GridError::EmptyAxis {
            path: source.into(),
            key: "arms",
        });
    }
    let mut cells = Vec::new();
    for model in &models {
        for &think in &thinking {
            for &domain in &domains {
                for &s in &steps {
                    for &rho in &densities {
                        for &brief in &briefs {
                            for &protocol in &protocols {
                                for &tier in &tiers {
                                    for &amb in &ambiguous {
                                        let base = EpisodeConfig {
                                            brief,
                                            protocol,
                                            paraphrase_tier: tier,
                                            ambiguous_rate: amb,
                                            ..EpisodeConfig::paper(domain, s, rho, seed_start)
                                        };
                                        check_episode(&base, source)?;
                                        let mut cfg = CellConfig::paper(
                                            &base,
                                            episodes,
                                            agent_name(agent),
                                            matcher,
                                        );
                                        cfg.compiler = compiler;
                                        cfg.arms = arms.clone();
                                        cfg.thinking = think;
                                        cfg.options = RunOptions::default();
                                        cfg.validate().map_err(|e| {
                                            bad(source, "arms", arm_list(&arms), e.to_string())
                                        })?;
                                        cells.push(GridCell {
                                            name: String::new(),
                                            config: cfg,
                                            model: model.clone(),
                                        });
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(cells)
}

/// The name an agent kind has in a cell configuration before a model is
/// loaded (`scripted:perfect`, … as the scripted agents name themselves).
pub fn agent_name(a: AgentKind) -> String {
    match a {
        AgentKind::Perfect => Scripted::Perfect.name(),
        AgentKind::AlwaysBook => Scripted::AlwaysBook.name(),
        AgentKind::Model => "model".into(),
    }
}

fn arm_list(arms: &[Arm]) -> String {
    let names: Vec<&str> = arms.iter().map(|a| a.name()).collect();
    format!("[{}]", names.join(", "))
}

/// The generator's checks, named by the key that failed.
fn check_episode(cfg: &EpisodeConfig, source: &str) -> Result<(), GridError> {
    generator::validate(cfg).map_err(|e| match e {
        GenError::Steps(s) => bad(source, "steps", s, e.to_string()),
        GenError::Density(d) => bad(source, "density", d, e.to_string()),
        GenError::AmbiguousRate(a) => bad(source, "ambiguous_rate", a, e.to_string()),
        GenError::Tier(t) => bad(source, "paraphrase_tier", t, e.to_string()),
        other => bad(source, "grid", "", other.to_string()),
    })
}

/// Names each cell by the values that vary across the grid (the model
/// by its file stem), so directories read like the table's rows.
fn name_cells(cells: &mut [GridCell]) {
    let parts = |c: &GridCell| -> Vec<(&'static str, String)> {
        let g = &c.config;
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
        vec![
            ("", model),
            ("", if g.thinking { "think" } else { "nothink" }.into()),
            ("", text(&g.domain)),
            ("S", g.steps.to_string()),
            ("rho", text(&g.density)),
            ("", text(&g.brief)),
            ("", text(&g.protocol)),
            ("tier", g.paraphrase_tier.to_string()),
            ("amb", text(&g.ambiguous_rate)),
        ]
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

/// A configuration value as its JSON spells it, without quotes.
fn text<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v)
        .unwrap_or_default()
        .trim_matches('"')
        .to_string()
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
                g.domain,
                g.steps,
                g.density.to_bits()
            );
            for (k, seed) in g.seeds().enumerate() {
                let key = (family.clone(), g.seed_start + (k as u64 / block) * block);
                let u = *index.entry(key).or_insert_with(|| {
                    units.push((Vec::new(), 0));
                    units.len() - 1
                });
                units[u].0.push((ci, seed));
                units[u].1 += g.arms.len() as u64 * g.steps as u64;
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
        std::fs::write(dir.join("grid.json"), text)
            .map_err(|source| GridError::Io { path: d, source })
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
            for (k, v) in run.probes {
                into.probes.entry(k).or_insert(v);
            }
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
