//! Run directories: `manifest.json`, `episodes.jsonl`, `turns.jsonl`.
//!
//! Both logs are append-only. Every line carries the `attempt` that wrote it
//! (one per process that opened the directory). An episode counts as finished
//! once its line is in `episodes.jsonl`; a resumed run skips finished
//! episodes, and turn lines of an attempt whose episode never finished are
//! ignored by readers. A torn last line (a crash mid-write) is dropped when
//! the directory is reopened and ignored when it is read.

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

use super::cell::{CellConfig, CellModel};
use super::runner::{EpisodeRecord, TurnRecord};
use crate::ladder::arms::Arm;

/// Format tag of a run directory.
pub const RUN_FORMAT: &str = "statebench-run/1";

/// Errors reading or writing a run directory.
#[derive(Debug, thiserror::Error)]
pub enum RunLogError {
    #[error("{path}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A line or file that does not parse.
    #[error("{path}:{line}")]
    Parse {
        path: String,
        /// One-based line number.
        line: usize,
        #[source]
        source: serde_json::Error,
    },
    /// The directory was made with another configuration.
    #[error("{path} was made with a different configuration: {key} is {old} there, {new} now (use another --out, or the same settings to resume)")]
    ConfigMismatch {
        /// The manifest.
        path: String,
        /// The differing setting.
        key: String,
        /// Value in the directory.
        old: String,
        /// Value requested.
        new: String,
    },
    /// Not a run directory.
    #[error("{0} is not a statebench run directory (no manifest.json)")]
    NotARun(String),
}

/// What `manifest.json` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`RUN_FORMAT`].
    pub format: String,
    /// The full cell configuration; resuming requires it unchanged.
    #[serde(serialize_with = "sorted_keys")]
    pub config: CellConfig,
    /// Model identity (name, source, weights hash, arithmetic) or the
    /// scripted agent's name; resuming requires it unchanged.
    #[serde(serialize_with = "sorted_keys")]
    pub model: CellModel,
    /// statebench version that created the directory.
    pub crate_version: String,
    /// Git commit of the source tree, when known.
    pub git_commit: String,
}

/// Writes a value with its object keys sorted, as every run directory has
/// stored its configuration and model since the first (so manifests stay
/// byte-identical across versions).
pub fn sorted_keys<T: Serialize, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    serde_json::to_value(v)
        .map_err(serde::ser::Error::custom)?
        .serialize(s)
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> RunLogError + '_ {
    move |source| RunLogError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// The git commit of the working directory's repository, or "unknown".
pub fn git_commit() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// First key path at which two JSON values differ.
fn first_difference(old: &Value, new: &Value, prefix: &str) -> Option<(String, String, String)> {
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            keys.into_iter().find_map(|k| {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                first_difference(
                    a.get(k).unwrap_or(&Value::Null),
                    b.get(k).unwrap_or(&Value::Null),
                    &p,
                )
            })
        }
        _ if old == new => None,
        _ => Some((prefix.to_string(), old.to_string(), new.to_string())),
    }
}

/// An open run directory.
pub struct RunDir {
    dir: PathBuf,
    attempt: u32,
    finished: BTreeSet<(u64, Arm)>,
    episodes: File,
    turns: File,
}

#[derive(Serialize)]
struct Line<'a, T: Serialize> {
    attempt: u32,
    #[serde(flatten)]
    record: &'a T,
}

#[derive(Deserialize)]
struct Tagged<T> {
    attempt: u32,
    #[serde(flatten)]
    record: T,
}

/// Drops a torn last line (no trailing newline) and returns the complete lines.
fn repair_tail(path: &Path) -> Result<(), RunLogError> {
    if !path.exists() {
        return Ok(());
    }
    let bytes = fs::read(path).map_err(io(path))?;
    if bytes.is_empty() || bytes.ends_with(b"\n") {
        return Ok(());
    }
    let keep = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    let f = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(io(path))?;
    f.set_len(keep as u64).map_err(io(path))?;
    Ok(())
}

/// Reads the complete, parseable lines of a JSONL file; a torn last line is ignored.
fn read_lines<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Vec<Tagged<T>>, RunLogError> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let text = fs::read_to_string(path).map_err(io(path))?;
    let complete = text.ends_with('\n');
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Tagged<T>>(line) {
            Ok(t) => out.push(t),
            Err(_) if i + 1 == lines.len() && !complete => {}
            Err(source) => {
                return Err(RunLogError::Parse {
                    path: path.display().to_string(),
                    line: i + 1,
                    source,
                })
            }
        }
    }
    Ok(out)
}

impl RunDir {
    /// Opens (or creates) a run directory for this manifest; refuses one made with another configuration.
    pub fn open(dir: &Path, manifest: &Manifest) -> Result<RunDir, RunLogError> {
        fs::create_dir_all(dir).map_err(io(dir))?;
        let mpath = dir.join("manifest.json");
        if mpath.exists() {
            let old = read_manifest(&mpath)?;
            let diff = first_difference(&json(&old.config), &json(&manifest.config), "config")
                .or_else(|| first_difference(&json(&old.model), &json(&manifest.model), "model"));
            if let Some((key, old, new)) = diff {
                return Err(RunLogError::ConfigMismatch {
                    path: mpath.display().to_string(),
                    key,
                    old,
                    new,
                });
            }
        } else {
            let tmp = dir.join("manifest.json.tmp");
            let text = serde_json::to_string_pretty(manifest).expect("manifest serializes");
            fs::write(&tmp, text + "\n").map_err(io(&tmp))?;
            fs::rename(&tmp, &mpath).map_err(io(&mpath))?;
        }
        let epath = dir.join("episodes.jsonl");
        let tpath = dir.join("turns.jsonl");
        repair_tail(&epath)?;
        repair_tail(&tpath)?;
        let done: Vec<Tagged<EpisodeRecord>> = read_lines(&epath)?;
        let turns_attempt = read_lines::<serde::de::IgnoredAny>(&tpath)?
            .iter()
            .map(|t| t.attempt)
            .max()
            .unwrap_or(0);
        let attempt = done
            .iter()
            .map(|t| t.attempt)
            .max()
            .unwrap_or(0)
            .max(turns_attempt)
            + 1;
        let open = |p: &Path| {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map_err(io(p))
        };
        Ok(RunDir {
            dir: dir.to_path_buf(),
            attempt,
            finished: done.iter().map(|t| (t.record.seed, t.record.arm)).collect(),
            episodes: open(&epath)?,
            turns: open(&tpath)?,
        })
    }

    /// Whether this (seed, arm) already has its episode line.
    pub fn is_finished(&self, seed: u64, arm: Arm) -> bool {
        self.finished.contains(&(seed, arm))
    }

    /// Number of finished episodes.
    pub fn finished(&self) -> usize {
        self.finished.len()
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Appends one finished episode: its turn lines, then its episode line.
    pub fn append(&mut self, rec: &EpisodeRecord, turns: &[TurnRecord]) -> Result<(), RunLogError> {
        let tpath = self.dir.join("turns.jsonl");
        let epath = self.dir.join("episodes.jsonl");
        let mut buf = String::new();
        for t in turns {
            buf.push_str(
                &serde_json::to_string(&Line {
                    attempt: self.attempt,
                    record: t,
                })
                .expect("turn serializes"),
            );
            buf.push('\n');
        }
        self.turns.write_all(buf.as_bytes()).map_err(io(&tpath))?;
        self.turns.flush().map_err(io(&tpath))?;
        let line = serde_json::to_string(&Line {
            attempt: self.attempt,
            record: rec,
        })
        .expect("episode serializes");
        self.episodes
            .write_all(format!("{line}\n").as_bytes())
            .map_err(io(&epath))?;
        self.episodes.sync_data().map_err(io(&epath))?;
        self.finished.insert((rec.seed, rec.arm));
        Ok(())
    }
}

/// A finished run read back for reporting.
#[derive(Debug, Clone)]
pub struct RunRead {
    /// The directory.
    pub dir: PathBuf,
    pub manifest: Manifest,
    /// Finished episodes, first line per (seed, arm).
    pub episodes: Vec<EpisodeRecord>,
}

fn json<T: Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

fn read_manifest(mpath: &Path) -> Result<Manifest, RunLogError> {
    serde_json::from_str(&fs::read_to_string(mpath).map_err(io(mpath))?).map_err(|source| {
        RunLogError::Parse {
            path: mpath.display().to_string(),
            line: 1,
            source,
        }
    })
}

/// Reads a run directory's manifest and finished episodes.
pub fn read_run(dir: &Path) -> Result<RunRead, RunLogError> {
    let mpath = dir.join("manifest.json");
    if !mpath.exists() {
        return Err(RunLogError::NotARun(dir.display().to_string()));
    }
    let manifest = read_manifest(&mpath)?;
    let mut seen = BTreeSet::new();
    let episodes = read_lines::<EpisodeRecord>(&dir.join("episodes.jsonl"))?
        .into_iter()
        .map(|t| t.record)
        .filter(|r| seen.insert((r.seed, r.arm)))
        .collect();
    Ok(RunRead {
        dir: dir.to_path_buf(),
        manifest,
        episodes,
    })
}

/// Reads the turn lines of finished episodes (those of unfinished attempts are skipped).
pub fn read_turns(dir: &Path) -> Result<Vec<TurnRecord>, RunLogError> {
    /// What identifies an episode line.
    #[derive(Deserialize)]
    struct Key {
        seed: u64,
        arm: Arm,
    }
    let finished: BTreeSet<(u64, Arm, u32)> = read_lines::<Key>(&dir.join("episodes.jsonl"))?
        .into_iter()
        .map(|t| (t.record.seed, t.record.arm, t.attempt))
        .collect();
    let turns: Vec<Tagged<TurnRecord>> = read_lines(&dir.join("turns.jsonl"))?;
    Ok(turns
        .into_iter()
        .filter(|t| finished.contains(&(t.record.seed, t.record.arm, t.attempt)))
        .map(|t| t.record)
        .collect())
}
