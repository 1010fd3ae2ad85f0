//! The models statebench ships (models/manifest.json): a file that bears
//! one's name is checked against its size and sha256 when it is loaded, so
//! a corrupted or truncated download is refused rather than run. The check
//! is remembered beside the file (`<file>.verified`: size, modification
//! time and hash), so only a changed file is hashed again.

use std::path::Path;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::backend::BackendError;

#[derive(Deserialize)]
struct Manifest {
    models: Vec<Entry>,
}

#[derive(Deserialize)]
struct Entry {
    file: String,
    size: u64,
    sha256: String,
}

fn manifest() -> Manifest {
    serde_json::from_str(include_str!("../../models/manifest.json"))
        .expect("models/manifest.json is checked by the tests")
}

/// Refuses a file named like a shipped model whose size or sha256 differs
/// from the manifest's.
pub fn verify(path: &Path) -> Result<(), BackendError> {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return Ok(());
    };
    let Some(entry) = manifest().models.into_iter().find(|e| e.file == name) else {
        return Ok(());
    };
    let io = |source| BackendError::Io {
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    let corrupt = |what: String| BackendError::CorruptWeights {
        path: path.to_path_buf(),
        cause: format!("{what} (models/manifest.json); `statebench model fetch` replaces it"),
    };
    if meta.len() != entry.size {
        return Err(corrupt(format!("{} bytes, not {}", meta.len(), entry.size)));
    }
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let stamp = format!("{} {mtime} {}", meta.len(), entry.sha256);
    let memo = path.with_file_name(format!("{name}.verified"));
    if std::fs::read_to_string(&memo).is_ok_and(|m| m.trim() == stamp) {
        return Ok(());
    }
    let mut h = Sha256::new();
    let mut f = std::fs::File::open(path).map_err(io)?;
    std::io::copy(&mut f, &mut h).map_err(io)?;
    let sha = crate::hex(&h.finalize());
    if sha != entry.sha256 {
        return Err(corrupt(format!("sha256 {sha}, not {}", entry.sha256)));
    }
    // Remembered atomically; a directory we cannot write only costs a rehash.
    let tmp = path.with_file_name(format!("{name}.verified.{}", std::process::id()));
    if std::fs::write(&tmp, format!("{stamp}\n")).is_ok() && std::fs::rename(&tmp, &memo).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    Ok(())
}
