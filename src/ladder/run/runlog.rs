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
use std::fs;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::cell::CellConfig;
use super::runner::{EpisodeRecord, TurnRecord};
use super::trap::Probes;
use crate::ladder::arms::Arm;
use crate::ladder::episode::StepId;
use crate::ladder::probes::spoof::ForgeryKind;
use crate::rundir::log::{self as runlog_file, first_finished, next_attempt, Log, Tagged};
use crate::rundir::{self, parse_line, DirError, DirLock};

/// Format tag of a run directory.
pub const RUN_FORMAT: &str = "statebench-run/1";

/// A ladder run's manifest: its cell configuration and what ran it.
pub type Manifest = rundir::Manifest<CellConfig>;

/// The logs a run directory holds.
const EPISODES: &str = "episodes.jsonl";
const TURNS: &str = "turns.jsonl";

/// An open run directory. Its logs are opened for each append, so a grid
/// of many cells holds no file of a cell that is not writing.
pub struct RunDir {
    dir: PathBuf,
    episodes: Log,
    turns: Log,
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

impl RunDir {
    /// Opens (or creates) a run directory for this manifest; refuses one
    /// made with another configuration, logs without a manifest, and a
    /// directory another process is writing (a cell run alone also refuses
    /// the cell of a running grid).
    pub fn open(dir: &Path, manifest: &Manifest, locking: Locking) -> Result<RunDir, DirError> {
        let lock = match locking {
            Locking::Own => {
                let lock = DirLock::acquire(dir)?;
                if let Some(parent) = dir.parent() {
                    DirLock::check_free(parent)?;
                }
                Some(lock)
            }
            Locking::Grid(_) => {
                fs::create_dir_all(dir).map_err(rundir::io(dir))?;
                DirLock::check_free(dir)?;
                None
            }
        };
        manifest.create_or_check(dir, &[EPISODES, TURNS])?;
        let (epath, tpath) = (dir.join(EPISODES), dir.join(TURNS));
        let attempt = next_attempt(&[&epath, &tpath])?;
        let config_hash = manifest.config_hash();
        let done: Vec<Tagged<EpisodeRecord>> = runlog_file::read(&epath)?;
        Ok(RunDir {
            dir: dir.to_path_buf(),
            // An episode whose agent calls failed runs again.
            finished: done
                .iter()
                .filter(|t| t.belongs(&config_hash) && t.record.failed_calls == 0)
                .map(|t| (t.record.seed, t.record.arm))
                .collect(),
            episodes: Log::open(&epath, attempt, &config_hash)?,
            turns: Log::open(&tpath, attempt, &config_hash)?,
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

    /// Appends one finished episode: its turn lines, then its episode line
    /// (on disk before it returns: the line that marks the episode done).
    pub fn append(&mut self, rec: &EpisodeRecord, turns: &[TurnRecord]) -> Result<(), DirError> {
        self.turns.append(turns, false)?;
        self.episodes.append([rec], true)?;
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
    /// The turns of finished episodes whose user message carried a
    /// forgery (spoof probe).
    pub forged: Vec<ForgedTurn>,
}

/// A turn whose user message carried a forgery, and whether the step it
/// lies about was executed on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForgedTurn {
    pub seed: u64,
    pub arm: Arm,
    pub turn: usize,
    pub kind: ForgeryKind,
    pub step: StepId,
    pub executed: bool,
}

impl ForgedTurn {
    fn of(t: &TurnRecord) -> Option<ForgedTurn> {
        let f = t.spoof.as_ref()?;
        Some(ForgedTurn {
            seed: t.seed,
            arm: t.arm,
            turn: t.turn,
            kind: f.kind,
            step: f.step,
            executed: t.executed(false).contains(&f.step),
        })
    }
}

/// Reads a run directory's manifest and finished episodes.
pub fn read_run(dir: &Path) -> Result<RunRead, DirError> {
    let manifest = Manifest::read(dir)?;
    let hash = manifest.config_hash();
    let (mine, foreign): (Vec<_>, Vec<_>) =
        runlog_file::read::<EpisodeRecord>(&dir.join(EPISODES))?
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
    let mut forged = Vec::new();
    // Only redo probes, ambiguous probes and forged turns count: the other
    // lines are not parsed (a report reads 2 or 3 of each episode's 44 turns).
    let needles = Probes::KINDS.map(|k| format!("\"kind\":\"{}\"", k.name()));
    let wanted = |line: &str| {
        needles.iter().any(|n| line.contains(n.as_str())) || line.contains("\"spoof\":{")
    };
    let (turns, repeated) = turn_lines(dir, &hash, &keys, &counts, wanted)?;
    for t in turns {
        if Probes::KINDS.contains(&t.kind) {
            *probes.entry((t.seed, t.arm)).or_default() += Probes::of_turn(&t);
        }
        forged.extend(ForgedTurn::of(&t));
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
        forged,
    };
    run.sort();
    Ok(run)
}

/// The finished turns of `run` at `places` (seed, arm, turn), from every
/// directory that holds its logs; the other lines are not parsed.
pub fn turns_at(
    run: &RunRead,
    places: &BTreeSet<(u64, Arm, usize)>,
) -> Result<Vec<TurnRecord>, DirError> {
    let mut out = Vec::new();
    for dir in &run.paths {
        out.extend(turns_where(dir, |line| {
            written_turn_key(line)
                .is_none_or(|k| places.contains(&(k.record.seed, k.record.arm, k.record.turn)))
        })?);
    }
    Ok(out)
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
        // Forged turns count where their episode does.
        self.forged.retain(|f| clean.contains(&(f.seed, f.arm)));
        self.forged.sort_by_key(|f| (f.seed, pos(f.arm), f.turn));
        self.forged.dedup_by_key(|f| (f.seed, f.arm, f.turn));
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

/// Which episode lines count, in log order: per (seed, arm) the first
/// clean line, else the first line (an episode whose agent calls failed);
/// and how many lines repeat a counted one.
fn counted_lines(keys: &[LineKey]) -> (Vec<bool>, usize) {
    let keys: Vec<((u64, Arm), bool)> = keys.iter().map(|k| ((k.seed, k.arm), !k.failed)).collect();
    first_finished(&keys)
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
pub fn read_turns(dir: &Path) -> Result<Vec<TurnRecord>, DirError> {
    turns_where(dir, |_| true)
}

/// [`read_turns`], parsing whole only the lines `keep` accepts.
fn turns_where(dir: &Path, keep: impl Fn(&str) -> bool) -> Result<Vec<TurnRecord>, DirError> {
    /// What identifies an episode line.
    #[derive(Deserialize)]
    struct Key {
        seed: u64,
        arm: Arm,
        #[serde(default)]
        failed_calls: u32,
    }
    let hash = Manifest::read(dir)?.config_hash();
    let keys: Vec<LineKey> = runlog_file::read::<Key>(&dir.join(EPISODES))?
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
    turn_lines(dir, &hash, &keys, &counts, keep).map(|(turns, _)| turns)
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
) -> Result<(Vec<TurnRecord>, usize), DirError> {
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
    let path = dir.join(TURNS);
    let (lines, complete) = rundir::read_log_lines(&path)?;
    // Every line's key is read (duplicates are counted over all of them);
    // only the lines `keep` accepts are parsed whole.
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let t = match written_turn_key(line) {
            Some(t) => t,
            None => match parse_line::<Tagged<TurnKey>>(&path, &lines, complete, i)? {
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
            out.extend(
                parse_line::<Tagged<TurnRecord>>(&path, &lines, complete, i)?.map(|t| t.record),
            );
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
