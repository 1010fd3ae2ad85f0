//! What every study's run directory is made of: one process at a time
//! ([`DirLock`]), a [`Manifest`] that pins the configuration and the model,
//! append-only JSONL logs whose lines are tagged with the attempt and the
//! configuration that wrote them ([`log`]), reads that stay bounded
//! whatever sits at a path, and the worker pool ([`parallel`]).
//!
//! A study defines its configuration type, its records and which log lines
//! count; everything about files, resumption and refusal lives here.
//!
//! A run directory is written by exactly one process: two writers would
//! each run every episode and interleave their lines. The lock is an
//! advisory `flock` on `DIR/.lock`, which the kernel drops when its holder
//! dies, so a killed run never leaves a stale lock behind; the file holds
//! the holder's pid for the refusal message.
//!
//! Logs and manifests are read only from regular files (a link to a device
//! or a FIFO would grow a reader without end or hang it), manifests up to
//! [`MANIFEST_CAP`] bytes and log lines up to [`LINE_CAP`] bytes.
//!
//! Layer: below every study. It records a backend's model identity in the
//! manifest and uses no study.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

pub mod log;
pub mod manifest;
mod pool;

pub use manifest::{Identity, Manifest};
pub use pool::parallel;

/// Largest manifest (or configuration file) read: a grid's manifest holds
/// every cell's configuration, a few KiB each.
pub const MANIFEST_CAP: u64 = 64 << 20;

/// Longest log line read: a turn line holds a prompt's replies, far less.
pub const LINE_CAP: usize = 16 << 20;

/// Name of the lock file inside a locked directory.
pub const LOCK_FILE: &str = ".lock";

/// Errors locking a directory or reading one of its files.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    #[error("{path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Another process holds the directory's lock.
    #[error("{dir} is in use by another statebench process{}: wait for it to finish, or use another directory", holder_text(*.holder))]
    Locked {
        dir: PathBuf,
        /// The holder's pid, when its lock file names one.
        holder: Option<u32>,
    },
    /// A device, FIFO, socket or directory where a file should be.
    #[error("{0} is not a regular file: refusing to read it")]
    NotAFile(PathBuf),
    #[error("{path} is {size} bytes, more than the {cap} a statebench manifest may hold")]
    TooLarge { path: PathBuf, size: u64, cap: u64 },
    /// A line or file that does not parse.
    #[error("{path}:{line}")]
    Parse {
        path: PathBuf,
        /// One-based line number.
        line: usize,
        #[source]
        source: serde_json::Error,
    },
    /// The directory was made with another configuration or model.
    #[error("{path} was made with a different configuration: {key} is {old} there, {new} now (use another --out, or the same settings to resume)")]
    ConfigMismatch {
        /// The manifest.
        path: PathBuf,
        /// The differing setting, as a key path (`config.steps`).
        key: String,
        /// Value in the directory.
        old: String,
        /// Value requested.
        new: String,
    },
    #[error("{0} is not a statebench run directory (no manifest.json)")]
    NotARun(PathBuf),
    /// Logs whose configuration is unknown.
    #[error("{dir} holds {file} but no manifest.json: refusing to add to logs of an unknown configuration (restore the manifest, or use another --out)")]
    NoManifest { dir: PathBuf, file: String },
    #[error("{path}:{line}: a line longer than {cap} bytes: not a statebench log")]
    LineTooLong {
        path: PathBuf,
        /// One-based line number.
        line: usize,
        cap: usize,
    },
}

fn holder_text(pid: Option<u32>) -> String {
    pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
}

pub(crate) fn io(path: &Path) -> impl Fn(std::io::Error) -> DirError + '_ {
    move |source| DirError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// An exclusive lock on a directory, held until dropped.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

impl DirLock {
    /// Locks `dir` (created if missing) for this process, or refuses with
    /// the holder's pid.
    pub fn acquire(dir: &Path) -> Result<DirLock, DirError> {
        fs::create_dir_all(dir).map_err(io(dir))?;
        let path = dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io(&path))?;
        match settled(|| file.try_lock()) {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(DirError::Locked {
                    dir: dir.to_path_buf(),
                    holder: holder(&path),
                })
            }
            Err(TryLockError::Error(e)) => return Err(io(&path)(e)),
        }
        file.set_len(0).map_err(io(&path))?;
        writeln!(file, "{}", std::process::id()).map_err(io(&path))?;
        Ok(DirLock { _file: file })
    }

    /// Refuses when another process holds `dir`'s lock (a directory without
    /// a lock file is free); takes nothing.
    pub fn check_free(dir: &Path) -> Result<(), DirError> {
        let path = dir.join(LOCK_FILE);
        let Ok(file) = OpenOptions::new().read(true).open(&path) else {
            return Ok(());
        };
        match settled(|| file.try_lock_shared()) {
            Ok(()) => Ok(()),
            Err(TryLockError::WouldBlock) => Err(DirError::Locked {
                dir: dir.to_path_buf(),
                holder: holder(&path),
            }),
            Err(TryLockError::Error(e)) => Err(io(&path)(e)),
        }
    }
}

/// `try_lock` retried for up to half a second, 5 ms apart, while it would
/// block: a child this process spawns shares the lock's open file until its
/// exec closes it, so a lock just dropped here can read as held for that
/// moment.
fn settled(try_lock: impl Fn() -> Result<(), TryLockError>) -> Result<(), TryLockError> {
    for _ in 0..LOCK_WAITS {
        match try_lock() {
            Err(TryLockError::WouldBlock) => {
                std::thread::sleep(std::time::Duration::from_millis(5))
            }
            done => return done,
        }
    }
    try_lock()
}

/// How many times a blocked lock is tried again before the refusal.
const LOCK_WAITS: u32 = 100;

/// The pid a lock file names.
fn holder(path: &Path) -> Option<u32> {
    let mut text = String::new();
    File::open(path)
        .ok()?
        .take(32)
        .read_to_string(&mut text)
        .ok()?;
    text.trim().parse().ok()
}

/// Whether `path` exists; refuses anything that is not a regular file
/// (following links), before it is opened: opening a FIFO blocks.
pub fn regular_file(path: &Path) -> Result<bool, DirError> {
    match fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(true),
        Ok(_) => Err(DirError::NotAFile(path.to_path_buf())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io(path)(e)),
    }
}

/// Opens a regular file for reading.
pub fn open_regular(path: &Path) -> Result<File, DirError> {
    if !regular_file(path)? {
        return Err(io(path)(std::io::ErrorKind::NotFound.into()));
    }
    File::open(path).map_err(io(path))
}

/// Reads a manifest or configuration file: a regular file of at most
/// [`MANIFEST_CAP`] bytes.
pub fn read_manifest_text(path: &Path) -> Result<String, DirError> {
    let f = open_regular(path)?;
    let size = f.metadata().map_err(io(path))?.len();
    if size > MANIFEST_CAP {
        return Err(DirError::TooLarge {
            path: path.to_path_buf(),
            size,
            cap: MANIFEST_CAP,
        });
    }
    let mut text = String::new();
    // The cap holds even for a file that grows while it is read.
    f.take(MANIFEST_CAP + 1)
        .read_to_string(&mut text)
        .map_err(io(path))?;
    if text.len() as u64 > MANIFEST_CAP {
        return Err(DirError::TooLarge {
            path: path.to_path_buf(),
            size: text.len() as u64,
            cap: MANIFEST_CAP,
        });
    }
    Ok(text)
}

/// A JSONL log's lines, each at most [`LINE_CAP`] bytes, and whether the
/// last one ended in a newline (a torn last line did not). A missing file
/// has no lines.
pub fn read_log_lines(path: &Path) -> Result<(Vec<String>, bool), DirError> {
    if !regular_file(path)? {
        return Ok((Vec::new(), true));
    }
    let mut r = BufReader::new(File::open(path).map_err(io(path))?);
    let mut lines = Vec::new();
    let mut complete = true;
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let n = (&mut r)
            .take(LINE_CAP as u64 + 1)
            .read_until(b'\n', &mut buf)
            .map_err(io(path))?;
        if n == 0 {
            break;
        }
        complete = buf.last() == Some(&b'\n');
        if buf.len() > LINE_CAP + usize::from(complete) {
            return Err(DirError::LineTooLong {
                path: path.to_path_buf(),
                line: lines.len() + 1,
                cap: LINE_CAP,
            });
        }
        if complete {
            buf.pop();
        }
        let line = String::from_utf8(std::mem::take(&mut buf)).map_err(|e| {
            io(path)(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("line {}: {e}", lines.len() + 1),
            ))
        })?;
        lines.push(line);
    }
    Ok((lines, complete))
}

/// Reads a JSON-lines file of records written whole (an artifact, or a
/// log whose tags are part of `T`); a torn last line is ignored, any other
/// line that does not parse is refused with its number. A missing file
/// has no lines.
pub fn read_jsonl<T: DeserializeOwned>(path: &Path) -> Result<Vec<T>, DirError> {
    let (lines, complete) = read_log_lines(path)?;
    let mut out = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        out.extend(parse_line(path, &lines, complete, i)?);
    }
    Ok(out)
}

/// Parses line `i` of a file's `lines`; None for a torn last line.
pub fn parse_line<T: DeserializeOwned>(
    path: &Path,
    lines: &[String],
    complete: bool,
    i: usize,
) -> Result<Option<T>, DirError> {
    match serde_json::from_str::<T>(&lines[i]) {
        Ok(t) => Ok(Some(t)),
        Err(_) if i + 1 == lines.len() && !complete => Ok(None),
        Err(source) => Err(DirError::Parse {
            path: path.to_path_buf(),
            line: i + 1,
            source,
        }),
    }
}

/// Reads one JSON file (a manifest, a bundle) of at most [`MANIFEST_CAP`]
/// bytes.
pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T, DirError> {
    serde_json::from_str(&read_manifest_text(path)?).map_err(|source| DirError::Parse {
        path: path.to_path_buf(),
        line: 1,
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_naming_the_holder_and_freed_on_drop() {
        let tmp = tempfile::tempdir().unwrap();
        let held = DirLock::acquire(tmp.path()).unwrap();
        let e = DirLock::acquire(tmp.path()).unwrap_err();
        assert!(matches!(&e, DirError::Locked { holder: Some(p), .. } if *p == std::process::id()));
        assert!(e
            .to_string()
            .contains(&format!("pid {}", std::process::id())));
        assert!(DirLock::check_free(tmp.path()).is_err());
        drop(held);
        DirLock::check_free(tmp.path()).unwrap();
        DirLock::acquire(tmp.path()).unwrap();
    }

    #[test]
    fn a_dropped_lock_is_free_again_while_this_process_spawns_children() {
        let tmp = tempfile::tempdir().unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::process::Command::new("true").status().unwrap();
                }
            });
            let refused = (0..1000).find_map(|_| DirLock::acquire(tmp.path()).err());
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            assert!(refused.is_none(), "a dropped lock is free: {refused:?}");
        });
    }

    #[test]
    fn logs_split_into_lines_with_the_torn_tail_marked_and_long_lines_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("a.jsonl");
        fs::write(&p, "{}\n{\"a\":1}\n{\"b\"").unwrap();
        let (lines, complete) = read_log_lines(&p).unwrap();
        assert_eq!(lines, ["{}", "{\"a\":1}", "{\"b\""]);
        assert!(!complete);
        fs::write(&p, format!("{{}}\n{}\n", "x".repeat(LINE_CAP))).unwrap();
        assert_eq!(read_log_lines(&p).unwrap().0.len(), 2);
        fs::write(&p, format!("{{}}\n{}\n", "x".repeat(LINE_CAP + 1))).unwrap();
        let e = read_log_lines(&p).unwrap_err();
        assert!(matches!(e, DirError::LineTooLong { line: 2, .. }), "{e}");
        assert!(matches!(
            read_log_lines(Path::new("/dev/zero")),
            Err(DirError::NotAFile(_))
        ));
        assert!(matches!(
            read_manifest_text(Path::new("/dev/zero")),
            Err(DirError::NotAFile(_))
        ));
    }
}
