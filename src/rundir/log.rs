//! Append-only JSONL logs.
//!
//! Every line carries the `attempt` that wrote it (one per process that
//! opened the directory) and the hash of the manifest's configuration and
//! model ([`super::Manifest::config_hash`]), so a line of another run is
//! told apart and never counted. A torn last line (a crash mid-write) is
//! dropped when a log is opened for appending and ignored when it is read.
//! Nothing is rewritten: which of a key's lines counts is decided by the
//! reader, with [`first_finished`] (the earliest finished line; failures
//! stay on record) or [`last_per_key`] (the latest line).

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::{io, open_regular, read_jsonl, regular_file, DirError, LINE_CAP};

/// A log opened for appending under one attempt and configuration.
#[derive(Debug)]
pub struct Log {
    path: PathBuf,
    attempt: u32,
    config_hash: String,
}

/// A line as written: the tags, then the record's own fields.
#[derive(Serialize)]
struct Line<'a, T: Serialize> {
    attempt: u32,
    config_hash: &'a str,
    #[serde(flatten)]
    record: &'a T,
}

/// A line as read: its tags and its record.
#[derive(Debug, Clone, Deserialize)]
pub struct Tagged<T> {
    /// 0 in logs written before lines carried it.
    #[serde(default)]
    pub attempt: u32,
    /// Absent in logs written before lines carried it.
    #[serde(default)]
    pub config_hash: Option<String>,
    #[serde(flatten)]
    pub record: T,
}

impl<T> Tagged<T> {
    /// Whether the line was written under the configuration with this hash
    /// (an untagged line is taken to be).
    pub fn belongs(&self, hash: &str) -> bool {
        self.config_hash.as_deref().is_none_or(|h| h == hash)
    }
}

impl Log {
    /// Opens `path` for appending lines tagged with `attempt` and
    /// `config_hash`, first dropping a torn last line.
    pub fn open(path: &Path, attempt: u32, config_hash: &str) -> Result<Log, DirError> {
        repair_tail(path)?;
        Ok(Log {
            path: path.to_path_buf(),
            attempt,
            config_hash: config_hash.into(),
        })
    }

    /// Appends records as tagged lines in one write; with `sync`, waits
    /// until they are on disk (a line that marks work finished).
    pub fn append<'a, T: Serialize + 'a>(
        &self,
        records: impl IntoIterator<Item = &'a T>,
        sync: bool,
    ) -> Result<(), DirError> {
        let mut buf = String::new();
        for record in records {
            let line = Line {
                attempt: self.attempt,
                config_hash: &self.config_hash,
                record,
            };
            buf.push_str(&serde_json::to_string(&line).expect("log records serialize"));
            buf.push('\n');
        }
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(io(&self.path))?;
        f.write_all(buf.as_bytes()).map_err(io(&self.path))?;
        if sync {
            f.sync_data().map_err(io(&self.path))?;
        }
        Ok(())
    }
}

/// Reads a log's complete lines with their tags; a torn last line is
/// ignored, any other line that does not parse is refused with its number.
pub fn read<T: DeserializeOwned>(path: &Path) -> Result<Vec<Tagged<T>>, DirError> {
    read_jsonl(path)
}

/// Per key, which line counts: the first finished line, else the first
/// line (work that never finished stays on record, counted apart); and how
/// many lines repeat a counted one with its outcome (a failure a later
/// line replaced is history, not a duplicate). `keys` are the lines' keys
/// and whether each finished, in log order.
pub fn first_finished<K: Ord + Clone>(keys: &[(K, bool)]) -> (Vec<bool>, usize) {
    let mut chosen: BTreeMap<&K, usize> = BTreeMap::new();
    for (i, (k, finished)) in keys.iter().enumerate() {
        let at = chosen.entry(k).or_insert(i);
        if !keys[*at].1 && *finished {
            *at = i;
        }
    }
    let mut counts = vec![false; keys.len()];
    let mut duplicates = 0;
    for (i, (k, finished)) in keys.iter().enumerate() {
        let at = chosen[k];
        counts[i] = i == at;
        duplicates += usize::from(i != at && *finished == keys[at].1);
    }
    (counts, duplicates)
}

/// Per key, whether each line is the key's last (a rerun replaces what
/// came before).
pub fn last_per_key<K: Ord>(keys: &[K]) -> Vec<bool> {
    let mut last: BTreeMap<&K, usize> = BTreeMap::new();
    for (i, k) in keys.iter().enumerate() {
        last.insert(k, i);
    }
    let mut counts = vec![false; keys.len()];
    for i in last.into_values() {
        counts[i] = true;
    }
    counts
}

/// The records of the lines a reader keeps (`keep`, one flag a line).
pub fn kept<T>(lines: Vec<Tagged<T>>, keep: &[bool]) -> Vec<T> {
    lines
        .into_iter()
        .zip(keep)
        .filter(|(_, k)| **k)
        .map(|(t, _)| t.record)
        .collect()
}

/// Drops a torn last line (no trailing newline), reading only the file's
/// end.
pub fn repair_tail(path: &Path) -> Result<(), DirError> {
    if !regular_file(path)? {
        return Ok(());
    }
    let (len, last) = last_line(path)?;
    let keep = match last {
        Some((_, true)) => return Ok(()),
        Some((start, false)) => start,
        // One torn line and nothing before it.
        None if len > 0 => 0,
        None => return Ok(()),
    };
    let f = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(io(path))?;
    f.set_len(keep).map_err(io(path))
}

/// The file's length and where its last line starts, and whether that line
/// ends in a newline (None: no line starts after a newline, i.e. the file
/// is empty or one unterminated line). Reads backwards from the end in
/// blocks, so a long log costs what its last line does.
fn last_line(path: &Path) -> Result<(u64, Option<(u64, bool)>), DirError> {
    let mut f = open_regular(path)?;
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

/// The attempt of the next process to write `logs`: one past the last
/// line's of any of them (attempts only grow), after dropping torn tails.
pub fn next_attempt(logs: &[&Path]) -> Result<u32, DirError> {
    let mut last = 0;
    for path in logs {
        repair_tail(path)?;
        last = last.max(last_attempt(path)?);
    }
    Ok(last + 1)
}

/// The attempt of a log's last line when it is complete, or 0.
fn last_attempt(path: &Path) -> Result<u32, DirError> {
    if !regular_file(path)? {
        return Ok(0);
    }
    let (len, last) = last_line(path)?;
    let Some((start, true)) = last else {
        return Ok(0);
    };
    let mut f = open_regular(path)?;
    f.seek(SeekFrom::Start(start)).map_err(io(path))?;
    let mut line = String::new();
    f.take((len - start).min(LINE_CAP as u64))
        .read_to_string(&mut line)
        .map_err(io(path))?;
    Ok(serde_json::from_str::<Tagged<serde::de::IgnoredAny>>(&line).map_or(0, |t| t.attempt))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_tagged_a_torn_tail_is_dropped_and_readers_choose_per_key() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("log.jsonl");
        #[derive(Serialize, Deserialize, Debug, PartialEq)]
        struct R {
            k: u32,
            ok: bool,
        }
        let log = Log::open(&path, 1, "h1").unwrap();
        log.append(&[R { k: 1, ok: false }, R { k: 2, ok: true }], false)
            .unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"{\"attempt\":1,\"con")
            .unwrap();
        assert_eq!(
            read::<R>(&path).unwrap().len(),
            2,
            "a torn tail is not read"
        );
        let attempt = next_attempt(&[&path, &tmp.path().join("absent.jsonl")]).unwrap();
        assert_eq!(attempt, 2);
        let log = Log::open(&path, attempt, "h1").unwrap();
        log.append(&[R { k: 1, ok: true }, R { k: 2, ok: true }], true)
            .unwrap();
        let lines: Vec<Tagged<R>> = read(&path).unwrap();
        assert_eq!(lines.len(), 4, "the torn line was dropped on open");
        assert_eq!(
            std::fs::read_to_string(&path)
                .unwrap()
                .lines()
                .next()
                .unwrap(),
            r#"{"attempt":1,"config_hash":"h1","k":1,"ok":false}"#
        );
        assert!(lines.iter().all(|t| t.belongs("h1") && !t.belongs("h2")));
        let keys: Vec<(u32, bool)> = lines.iter().map(|t| (t.record.k, t.record.ok)).collect();
        assert_eq!(first_finished(&keys), (vec![false, true, true, false], 1));
        let keys: Vec<u32> = lines.iter().map(|t| t.record.k).collect();
        assert_eq!(last_per_key(&keys), vec![false, false, true, true]);
        // A torn line alone is dropped whole.
        std::fs::write(&path, "{\"attempt\":3").unwrap();
        repair_tail(&path).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"");
    }
}
