//! Run directories: `manifest.json`, `episodes.jsonl`, `turns.jsonl`.
//!
//! Both logs are append-only. Every line carries the `attempt` that wrote it
//! (one per process that opened the directory) and the hash of the
//! manifest's configuration and model, so a line from another run is told
//! apart and never counted. An episode counts as finished
//! once its line is in `episodes.jsonl`; a resumed run skips finished
//! episodes, and turn lines of an attempt whose episode never finished are
//! ignored by readers. A torn last line (a crash mid-write) is dropped when
//! the directory is reopened and ignored when it is read.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

use super::cell::{CellConfig, CellModel};
use super::runner::{EpisodeRecord, TurnRecord};
use super::trap::Probes;
use crate::ladder::arms::Arm;
use crate::rundir::{self, DirError, DirLock};

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
    /// A lock held elsewhere, or a file that cannot be a log.
    #[error(transparent)]
    Dir(#[from] DirError),
    /// Not a run directory.
    #[error("{0} is not a statebench run directory (no manifest.json)")]
    NotARun(String),
    /// Logs whose configuration is unknown.
    #[error("{0} holds run logs but no manifest.json: refusing to add to logs of an unknown configuration (restore the manifest, or use another --out)")]
    NoManifest(String),
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

/// Writes a value with its object keys sorted: a manifest's bytes depend on
/// its values alone, never on the order of a struct's fields, so a resume
/// compares manifests written by any version.
pub fn sorted_keys<T: Serialize, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    serde_json::to_value(v)
        .map(sort_keys)
        .map_err(serde::ser::Error::custom)?
        .serialize(s)
}

/// A JSON value with every object's keys in sorted order (JSON objects
/// otherwise keep the order they were built or read in).
pub fn sort_keys(v: Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut entries: Vec<(String, Value)> = m.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k, sort_keys(v)))
                    .collect(),
            )
        }
        Value::Array(a) => Value::Array(a.into_iter().map(sort_keys).collect()),
        v => v,
    }
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

/// First key path at which two JSON values differ: (path, old, new).
pub fn first_difference(
    old: &Value,
    new: &Value,
    prefix: &str,
) -> Option<(String, String, String)> {
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

/// An open run directory. Its logs are opened for each append, so a grid
/// of many cells holds no file of a cell that is not writing.
pub struct RunDir {
    dir: PathBuf,
    attempt: u32,
    config_hash: String,
    finished: BTreeSet<(u64, Arm)>,
    /// This directory's lock, or None inside a grid whose lock covers it.
    _lock: Option<DirLock>,
}

/// Who keeps other processes out of a run directory while it is written.
#[derive(Clone, Copy)]
pub enum Locking<'a> {
    /// The directory's own lock (a cell run alone).
    Own,
    /// The grid directory's lock, held by this process for the cells in it.
    Grid(&'a DirLock),
}

#[derive(Serialize)]
struct Line<'a, T: Serialize> {
    attempt: u32,
    config_hash: &'a str,
    #[serde(flatten)]
    record: &'a T,
}

#[derive(Deserialize)]
struct Tagged<T> {
    attempt: u32,
    /// Absent in logs written before lines carried it.
    #[serde(default)]
    config_hash: Option<String>,
    #[serde(flatten)]
    record: T,
}

impl<T> Tagged<T> {
    /// Whether the line was written under the configuration with this hash.
    fn belongs(&self, hash: &str) -> bool {
        self.config_hash.as_deref().is_none_or(|h| h == hash)
    }
}

impl Manifest {
    /// A short hash of what the manifest pins (configuration and model):
    /// every log line carries it, so a line from another run is told apart.
    pub fn config_hash(&self) -> String {
        use sha2::{Digest, Sha256};
        let text = format!("{}\n{}", json(&self.config), json(&self.model));
        crate::hex(&Sha256::digest(text.as_bytes())[..8])
    }
}

/// Drops a torn last line (no trailing newline), reading only the file's
/// end.
pub fn repair_tail(path: &Path) -> Result<(), RunLogError> {
    if !rundir::regular_file(path)? {
        return Ok(());
    }
    let (len, last) = last_line(path)?;
    if let Some((start, complete)) = last {
        if !complete {
            let f = OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(io(path))?;
            f.set_len(start).map_err(io(path))?;
        }
    } else if len > 0 {
        // One torn line and nothing before it.
        let f = OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(io(path))?;
        f.set_len(0).map_err(io(path))?;
    }
    Ok(())
}

/// The file's length and where its last line starts, and whether that line
/// ends in a newline (None: no line starts after a newline, i.e. the file
/// is empty or one unterminated line). Reads backwards from the end in
/// blocks, so a long log costs what its last line does.
fn last_line(path: &Path) -> Result<(u64, Option<(u64, bool)>), RunLogError> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = rundir::open_regular(path)?;
    let len = f.metadata().map_err(io(path))?.len();
    if len == 0 {
        return Ok((0, None));
    }
    let mut last = [0u8; 1];
    f.seek(SeekFrom::Start(len - 1)).map_err(io(path))?;
    f.read_exact(&mut last).map_err(io(path))?;
    let complete = last[0] == b'\n';
    // Search for the newline before the last line.
    let mut end = if complete { len - 1 } else { len };
    let mut buf = vec![0u8; 64 << 10];
    while end > 0 {
        let start = end.saturating_sub(buf.len() as u64);
        let chunk = &mut buf[..(end - start) as usize];
        f.seek(SeekFrom::Start(start)).map_err(io(path))?;
        f.read_exact(chunk).map_err(io(path))?;
        if let Some(i) = chunk.iter().rposition(|b| *b == b'\n') {
            return Ok((len, Some((start + i as u64 + 1, complete))));
        }
        end = start;
    }
    Ok((len, if complete { Some((0, true)) } else { None }))
}

/// The attempt of a log's last complete line (attempts only grow), or 0.
fn last_attempt(path: &Path) -> Result<u32, RunLogError> {
    use std::io::{Read, Seek, SeekFrom};
    if !rundir::regular_file(path)? {
        return Ok(0);
    }
    let (len, last) = last_line(path)?;
    let Some((start, true)) = last else {
        return Ok(0);
    };
    let mut f = rundir::open_regular(path)?;
    f.seek(SeekFrom::Start(start)).map_err(io(path))?;
    let mut line = String::new();
    f.take((len - start).min(rundir::LINE_CAP as u64))
        .read_to_string(&mut line)
        .map_err(io(path))?;
    Ok(serde_json::from_str::<Tagged<serde::de::IgnoredAny>>(&line).map_or(0, |t| t.attempt))
}

/// Reads the complete, parseable lines of a JSONL file; a torn last line is ignored.
fn read_lines<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Vec<Tagged<T>>, RunLogError> {
    let (lines, complete) = rundir::read_log_lines(path)?;
    let mut out = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        out.extend(parse_line(path, &lines, complete, i)?);
    }
    Ok(out)
}

/// Parses line `i` of a log; None for a torn last line.
fn parse_line<T: for<'de> Deserialize<'de>>(
    path: &Path,
    lines: &[String],
    complete: bool,
    i: usize,
) -> Result<Option<Tagged<T>>, RunLogError> {
    match serde_json::from_str::<Tagged<T>>(&lines[i]) {
        Ok(t) => Ok(Some(t)),
        Err(_) if i + 1 == lines.len() && !complete => Ok(None),
        Err(source) => Err(RunLogError::Parse {
            path: path.display().to_string(),
            line: i + 1,
            source,
        }),
    }
}

impl RunDir {
    /// Opens (or creates) a run directory for this manifest; refuses one
    /// made with another configuration, logs without a manifest, and a
    /// directory another process is writing (a cell run alone also refuses
    /// the cell of a running grid).
    pub fn open(dir: &Path, manifest: &Manifest, locking: Locking) -> Result<RunDir, RunLogError> {
        let lock = match locking {
            Locking::Own => {
                let lock = DirLock::acquire(dir)?;
                if let Some(parent) = dir.parent() {
                    DirLock::check_free(parent)?;
                }
                Some(lock)
            }
            Locking::Grid(_) => {
                fs::create_dir_all(dir).map_err(io(dir))?;
                DirLock::check_free(dir)?;
                None
            }
        };
        let mpath = dir.join("manifest.json");
        let epath = dir.join("episodes.jsonl");
        let tpath = dir.join("turns.jsonl");
        if !mpath.exists() && (epath.exists() || tpath.exists()) {
            return Err(RunLogError::NoManifest(dir.display().to_string()));
        }
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
        repair_tail(&epath)?;
        repair_tail(&tpath)?;
        let config_hash = manifest.config_hash();
        let done: Vec<Tagged<EpisodeRecord>> = read_lines(&epath)?;
        let attempt = done
            .iter()
            .map(|t| t.attempt)
            .max()
            .unwrap_or(0)
            .max(last_attempt(&tpath)?)
            + 1;
        Ok(RunDir {
            dir: dir.to_path_buf(),
            attempt,
            // An episode whose agent calls failed runs again.
            finished: done
                .iter()
                .filter(|t| t.belongs(&config_hash) && t.record.failed_calls == 0)
                .map(|t| (t.record.seed, t.record.arm))
                .collect(),
            config_hash,
            _lock: lock,
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
                    config_hash: &self.config_hash,
                    record: t,
                })
                .expect("turn serializes"),
            );
            buf.push('\n');
        }
        let open = |p: &Path| {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map_err(io(p))
        };
        open(&tpath)?
            .write_all(buf.as_bytes())
            .map_err(io(&tpath))?;
        let line = serde_json::to_string(&Line {
            attempt: self.attempt,
            config_hash: &self.config_hash,
            record: rec,
        })
        .expect("episode serializes");
        let mut episodes = open(&epath)?;
        episodes
            .write_all(format!("{line}\n").as_bytes())
            .map_err(io(&epath))?;
        episodes.sync_data().map_err(io(&epath))?;
        self.finished.insert((rec.seed, rec.arm));
        Ok(())
    }
}

/// A finished run read back for reporting.
#[derive(Debug, Clone)]
pub struct RunRead {
    /// The directory, or the cell's name in a grid.
    pub dir: PathBuf,
    /// The directories whose logs it holds (several for a grid cell run
    /// in shards).
    pub paths: Vec<PathBuf>,
    pub manifest: Manifest,
    /// Finished episodes, first line per (seed, arm).
    pub episodes: Vec<EpisodeRecord>,
    /// Episodes that ended with failed agent calls and were not run again
    /// cleanly, first line per (seed, arm): kept out of every rate.
    pub failed: Vec<EpisodeRecord>,
    /// Episode lines written under another configuration, not counted.
    pub foreign: usize,
    /// Lines counted once though written more than once: an episode
    /// finished twice, a turn line repeated (two writers, or a log appended
    /// to itself).
    pub duplicates: usize,
    /// The probes of each finished episode's turns, by (seed, arm).
    pub probes: BTreeMap<(u64, Arm), Probes>,
}

fn json<T: Serialize>(v: &T) -> Value {
    serde_json::to_value(v).map_or(Value::Null, sort_keys)
}

fn read_manifest(mpath: &Path) -> Result<Manifest, RunLogError> {
    serde_json::from_str(&rundir::read_manifest_text(mpath)?).map_err(|source| RunLogError::Parse {
        path: mpath.display().to_string(),
        line: 1,
        source,
    })
}

/// Reads a run directory's manifest and finished episodes.
pub fn read_run(dir: &Path) -> Result<RunRead, RunLogError> {
    let mpath = dir.join("manifest.json");
    if !mpath.exists() {
        return Err(RunLogError::NotARun(dir.display().to_string()));
    }
    let manifest = read_manifest(&mpath)?;
    let hash = manifest.config_hash();
    let (mine, foreign): (Vec<_>, Vec<_>) =
        read_lines::<EpisodeRecord>(&dir.join("episodes.jsonl"))?
            .into_iter()
            .partition(|t| t.belongs(&hash));
    let keys: Vec<LineKey> = mine
        .iter()
        .map(|t| LineKey::of(&t.record, t.attempt))
        .collect();
    let (counts, duplicates) = counted_lines(&keys);
    let (mut episodes, mut failed) = (Vec::new(), Vec::new());
    for (t, &counts) in mine.into_iter().zip(&counts) {
        match (counts, t.record.failed_calls) {
            (false, _) => {}
            (true, 0) => episodes.push(t.record),
            (true, _) => failed.push(t.record),
        }
    }
    let mut probes: BTreeMap<(u64, Arm), Probes> = BTreeMap::new();
    // Only redo probes and ambiguous probes count: the other lines are not
    // parsed (a report reads 2 or 3 of each episode's 44 turns).
    let needles = Probes::KINDS.map(|k| format!("\"kind\":\"{}\"", k.name()));
    let probe_kinds = |line: &str| needles.iter().any(|n| line.contains(n.as_str()));
    let (turns, repeated) = turn_lines(dir, &hash, &keys, &counts, probe_kinds)?;
    for t in turns {
        *probes.entry((t.seed, t.arm)).or_default() += Probes::of_turn(&t);
    }
    let mut run = RunRead {
        dir: dir.to_path_buf(),
        paths: vec![dir.to_path_buf()],
        manifest,
        duplicates: duplicates + repeated,
        episodes,
        failed,
        foreign: foreign.len(),
        probes,
    };
    run.sort();
    Ok(run)
}

impl RunRead {
    /// Puts the episodes in seed order, arms in the cell's order, keeping
    /// the first of duplicates: a report does not depend on the order in
    /// which episodes finished, or on which shard ran them.
    pub fn sort(&mut self) {
        let arms = &self.manifest.config.arms;
        let pos = |a: Arm| arms.iter().position(|x| *x == a);
        self.episodes.sort_by_key(|e| (e.seed, pos(e.arm)));
        self.episodes.dedup_by_key(|e| (e.seed, e.arm));
        let clean: BTreeSet<(u64, Arm)> = self.episodes.iter().map(|e| (e.seed, e.arm)).collect();
        self.failed.retain(|e| !clean.contains(&(e.seed, e.arm)));
        self.failed.sort_by_key(|e| (e.seed, pos(e.arm)));
        self.failed.dedup_by_key(|e| (e.seed, e.arm));
    }
}

/// What decides whether an episode line counts.
#[derive(Clone, Copy)]
struct LineKey {
    seed: u64,
    arm: Arm,
    attempt: u32,
    failed: bool,
}

impl LineKey {
    fn of(r: &EpisodeRecord, attempt: u32) -> LineKey {
        LineKey {
            seed: r.seed,
            arm: r.arm,
            attempt,
            failed: r.failed_calls > 0,
        }
    }
}

/// Which episode lines count, in log order: per (seed, arm) the first clean
/// line, else the first line (an episode whose agent calls failed); and how
/// many lines repeat the counted one (failed lines a clean retry replaced
/// are history, not duplicates).
fn counted_lines(keys: &[LineKey]) -> (Vec<bool>, usize) {
    let mut chosen: BTreeMap<(u64, Arm), usize> = BTreeMap::new();
    for (i, k) in keys.iter().enumerate() {
        let at = chosen.entry((k.seed, k.arm)).or_insert(i);
        if keys[*at].failed && !k.failed {
            *at = i;
        }
    }
    let mut counts = vec![false; keys.len()];
    let mut duplicates = 0;
    for (i, k) in keys.iter().enumerate() {
        let at = chosen[&(k.seed, k.arm)];
        counts[i] = i == at;
        duplicates += usize::from(i != at && k.failed == keys[at].failed);
    }
    (counts, duplicates)
}

/// What identifies a turn line.
#[derive(Deserialize)]
struct TurnKey {
    seed: u64,
    arm: Arm,
    turn: usize,
}

/// The key of a turn line as [`RunDir::append`] writes it, read off the
/// line's start (`{"attempt":1,"config_hash":"…","seed":7,"arm":"raw",
/// "turn":0,…`) without parsing the rest: a report reads every line's key
/// but few whole lines. None for any other spelling, which is then parsed.
fn written_turn_key(line: &str) -> Option<Tagged<TurnKey>> {
    fn number<T: std::str::FromStr>(rest: &str) -> Option<(T, &str)> {
        let end = rest.find(|c: char| !c.is_ascii_digit())?;
        Some((rest[..end].parse().ok()?, &rest[end..]))
    }
    fn text(rest: &str) -> Option<(&str, &str)> {
        let end = rest.find('"')?;
        Some((&rest[..end], &rest[end + 1..]))
    }
    let (attempt, rest) = number(line.strip_prefix("{\"attempt\":")?)?;
    let (hash, rest) = text(rest.strip_prefix(",\"config_hash\":\"")?)?;
    let (seed, rest) = number(rest.strip_prefix(",\"seed\":")?)?;
    let (arm, rest) = text(rest.strip_prefix(",\"arm\":\"")?)?;
    let (turn, rest) = number(rest.strip_prefix(",\"turn\":")?)?;
    rest.starts_with(',').then_some(())?;
    Some(Tagged {
        attempt,
        config_hash: Some(hash.to_string()),
        record: TurnKey {
            seed,
            arm: arm.parse().ok()?,
            turn,
        },
    })
}

/// Reads the turn lines of finished episodes, each (seed, arm, turn) once:
/// those of the attempt whose episode line counts (the first), so turns of
/// unfinished attempts, of an episode finished twice, and repeated lines
/// are skipped.
pub fn read_turns(dir: &Path) -> Result<Vec<TurnRecord>, RunLogError> {
    /// What identifies an episode line.
    #[derive(Deserialize)]
    struct Key {
        seed: u64,
        arm: Arm,
        #[serde(default)]
        failed_calls: u32,
    }
    let hash = read_manifest(&dir.join("manifest.json"))?.config_hash();
    let keys: Vec<LineKey> = read_lines::<Key>(&dir.join("episodes.jsonl"))?
        .into_iter()
        .filter(|t| t.belongs(&hash))
        .map(|t| LineKey {
            seed: t.record.seed,
            arm: t.record.arm,
            attempt: t.attempt,
            failed: t.record.failed_calls > 0,
        })
        .collect();
    let (counts, _) = counted_lines(&keys);
    turn_lines(dir, &hash, &keys, &counts, |_| true).map(|(turns, _)| turns)
}

/// The turn lines of the counted episode lines (`keys` of the episode
/// lines under `hash`, `counts` from [`counted_lines`]), parsing whole only
/// the lines `keep` accepts; also counts the lines skipped as duplicates (of
/// finished episodes, not those of attempts that never finished).
fn turn_lines(
    dir: &Path,
    hash: &str,
    keys: &[LineKey],
    counts: &[bool],
    keep: impl Fn(&str) -> bool,
) -> Result<(Vec<TurnRecord>, usize), RunLogError> {
    let counted: BTreeMap<(u64, Arm), LineKey> = keys
        .iter()
        .zip(counts)
        .filter(|(_, c)| **c)
        .map(|(k, _)| ((k.seed, k.arm), *k))
        .collect();
    // Attempts that finished an episode, and whether their line was failed.
    let finished: BTreeMap<(u64, Arm, u32), bool> = keys
        .iter()
        .map(|k| ((k.seed, k.arm, k.attempt), k.failed))
        .collect();
    let mut seen = BTreeSet::new();
    let mut repeated = 0;
    let mut out = Vec::new();
    let path = dir.join("turns.jsonl");
    let (lines, complete) = rundir::read_log_lines(&path)?;
    // Every line's key is read (duplicates are counted over all of them);
    // only the lines `keep` accepts are parsed whole.
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let t = match written_turn_key(line) {
            Some(t) => t,
            None => match parse_line::<TurnKey>(&path, &lines, complete, i)? {
                Some(t) => t,
                None => continue,
            },
        };
        let (seed, arm) = (t.record.seed, t.record.arm);
        if !t.belongs(hash) {
            continue;
        }
        let (Some(&failed), Some(c)) = (
            finished.get(&(seed, arm, t.attempt)),
            counted.get(&(seed, arm)),
        ) else {
            continue;
        };
        if c.attempt != t.attempt {
            repeated += usize::from(failed == c.failed);
        } else if !seen.insert((seed, arm, t.record.turn)) {
            repeated += 1;
        } else if keep(line) {
            out.extend(parse_line::<TurnRecord>(&path, &lines, complete, i)?.map(|t| t.record));
        }
    }
    Ok((out, repeated))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turn_keys_read_off_a_written_line_equal_the_parsed_ones() {
        for arm in Arm::ALL {
            let name = serde_json::to_value(arm).unwrap();
            let line = format!(
                r#"{{"attempt":3,"config_hash":"2a0475a7995dd440","seed":107,"arm":{name},"turn":41,"kind":"filler"}}"#
            );
            let fast = written_turn_key(&line).expect("our own spelling");
            let parsed: Tagged<TurnKey> = serde_json::from_str(&line).unwrap();
            assert_eq!(
                (
                    fast.attempt,
                    fast.config_hash,
                    fast.record.seed,
                    fast.record.arm,
                    fast.record.turn
                ),
                (
                    parsed.attempt,
                    parsed.config_hash,
                    parsed.record.seed,
                    parsed.record.arm,
                    parsed.record.turn
                )
            );
        }
        // Other spellings go to the parser.
        for other in [
            r#"{"attempt":1,"seed":1,"arm":"raw","turn":0,"kind":"filler"}"#,
            r#"{"attempt":1, "config_hash":"x","seed":1,"arm":"raw","turn":0}"#,
            r#"{"attempt":1,"config_hash":"x","seed":1,"arm":"raw","turn":0}"#,
            r#"{"attempt":1,"config_hash":"x","seed":-1,"arm":"raw","turn":0,"k":1}"#,
        ] {
            assert!(written_turn_key(other).is_none(), "{other}");
        }
    }
}
