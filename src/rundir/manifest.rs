//! `manifest.json`: what a run directory's results are a function of.
//!
//! A manifest pins a study's configuration and the model (or the scripted
//! parts) that ran it. A directory is created with its manifest written
//! atomically; a resume compares the requested configuration and model
//! with the ones there, key by key, and refuses the first that differs.
//! Configuration and model are written with sorted keys, so a manifest's
//! bytes depend on its values alone and any version compares them.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

use super::{io, read_json, DirError};
use crate::backend::ModelIdentity;

/// The manifest's file name in a run directory.
pub const MANIFEST: &str = "manifest.json";

/// What ran a run's model-backed parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// A model: its name, weights hash, arithmetic and device.
    Model(ModelIdentity),
    /// No model: every part scripted, named by the scripted agent
    /// (`{"agent": "scripted:perfect"}`).
    Scripted { agent: String },
    /// No model, and no agent name to give: written as the word
    /// `"scripted"` (EAL-Bench's ledger writer and scripted executors).
    ScriptedUnnamed,
}

/// The word an unnamed scripted identity is written as.
const SCRIPTED: &str = "scripted";

impl Identity {
    /// The model's name, or the scripted agent's.
    pub fn name(&self) -> &str {
        match self {
            Identity::Model(m) => &m.name,
            Identity::Scripted { agent } => agent,
            Identity::ScriptedUnnamed => SCRIPTED,
        }
    }
}

/// The three spellings on disk.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum IdentityRepr {
    Model(ModelIdentity),
    Scripted { agent: String },
    Word(String),
}

impl Serialize for Identity {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Identity::Model(m) => IdentityRepr::Model(m.clone()),
            Identity::Scripted { agent } => IdentityRepr::Scripted {
                agent: agent.clone(),
            },
            Identity::ScriptedUnnamed => IdentityRepr::Word(SCRIPTED.into()),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Identity {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match IdentityRepr::deserialize(d)? {
            IdentityRepr::Model(m) => Ok(Identity::Model(m)),
            IdentityRepr::Scripted { agent } => Ok(Identity::Scripted { agent }),
            IdentityRepr::Word(w) if w == SCRIPTED => Ok(Identity::ScriptedUnnamed),
            IdentityRepr::Word(w) => Err(serde::de::Error::custom(format!(
                "model identity: expected an object or \"{SCRIPTED}\", got \"{w}\""
            ))),
        }
    }
}

/// What `manifest.json` holds, for a study whose configuration is `C`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(bound(serialize = "C: Serialize", deserialize = "C: DeserializeOwned"))]
pub struct Manifest<C> {
    /// The study's directory format (`statebench-run/1`, `statebench-eal/1`).
    pub format: String,
    /// Resuming requires it unchanged.
    #[serde(serialize_with = "sorted_keys")]
    pub config: C,
    /// Resuming requires it unchanged.
    #[serde(serialize_with = "sorted_keys")]
    pub model: Identity,
    /// The CPU kernel family of the process that created the directory,
    /// for a model on the CPU (`avx512`, `amx`, …; see
    /// `STATEBENCH_CPU_ISA`). Not pinned: every family gives the same
    /// bits, so a run resumes on any.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cpu_kernels: String,
    /// statebench version that created the directory.
    pub crate_version: String,
    /// Git commit of the source tree, when known.
    pub git_commit: String,
}

impl<C: Serialize + DeserializeOwned> Manifest<C> {
    /// A manifest of this build.
    pub fn new(format: &str, config: C, model: Identity) -> Manifest<C> {
        let cpu_kernels = match &model {
            Identity::Model(m) if m.arithmetic.starts_with(statebench_kernels::ARITHMETIC) => {
                statebench_kernels::isa().map_or_else(|_| String::new(), |i| i.name().into())
            }
            _ => String::new(),
        };
        Manifest {
            format: format.into(),
            config,
            model,
            cpu_kernels,
            crate_version: env!("CARGO_PKG_VERSION").into(),
            git_commit: git_commit(),
        }
    }

    /// A short hash of what the manifest pins (configuration and model):
    /// every log line carries it, so a line from another run is told apart.
    pub fn config_hash(&self) -> String {
        use sha2::{Digest, Sha256};
        let text = format!("{}\n{}", json(&self.config), json(&self.model));
        crate::hex(&Sha256::digest(text.as_bytes())[..8])
    }

    /// Reads `dir`'s manifest; refuses a directory without one.
    pub fn read(dir: &Path) -> Result<Manifest<C>, DirError> {
        let path = dir.join(MANIFEST);
        if !path.exists() {
            return Err(DirError::NotARun(dir.to_path_buf()));
        }
        read_json(&path)
    }

    /// Writes this manifest into `dir` (a temporary file renamed into
    /// place, so a crash leaves none or all of it), or checks that the one
    /// there pins the same configuration and model. `files` are the
    /// study's logs and artifacts: found without a manifest, their
    /// configuration is unknown and the directory is refused.
    pub fn create_or_check(&self, dir: &Path, files: &[&str]) -> Result<(), DirError> {
        let path = dir.join(MANIFEST);
        if path.exists() {
            let old = Manifest::<Value>::read(dir)?;
            let diff = first_difference(&json(&old.config), &json(&self.config), "config")
                .or_else(|| first_difference(&json(&old.model), &json(&self.model), "model"));
            return match diff {
                Some((key, old, new)) => Err(DirError::ConfigMismatch {
                    path,
                    key,
                    old,
                    new,
                }),
                None => Ok(()),
            };
        }
        if let Some(file) = files.iter().find(|f| dir.join(f).exists()) {
            return Err(DirError::NoManifest {
                dir: dir.to_path_buf(),
                file: file.to_string(),
            });
        }
        let text = serde_json::to_string_pretty(self).expect("manifests serialize") + "\n";
        write_atomic(&path, text.as_bytes())
    }
}

/// Writes a file whole or not at all: a temporary file beside it, renamed
/// into place.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), DirError> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    fs::write(&tmp, bytes).map_err(io(&tmp))?;
    fs::rename(&tmp, path).map_err(io(path))
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

/// A value as sorted JSON (Null where it does not serialize).
fn json<T: Serialize>(v: &T) -> Value {
    serde_json::to_value(v).map_or(Value::Null, sort_keys)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_keep_their_three_spellings() {
        let model = ModelIdentity {
            name: "m".into(),
            source: "m.gguf".into(),
            weights_sha256: "00".into(),
            architecture: "qwen2".into(),
            format: "gguf".into(),
            arithmetic: "a".into(),
            device: String::new(),
        };
        for (id, text) in [
            (
                Identity::Scripted {
                    agent: "scripted:perfect".into(),
                },
                r#"{"agent":"scripted:perfect"}"#,
            ),
            (Identity::ScriptedUnnamed, r#""scripted""#),
            (
                Identity::Model(model),
                r#"{"name":"m","source":"m.gguf","weights_sha256":"00","architecture":"qwen2","format":"gguf","arithmetic":"a"}"#,
            ),
        ] {
            assert_eq!(serde_json::to_string(&id).unwrap(), text);
            assert_eq!(serde_json::from_str::<Identity>(text).unwrap(), id);
        }
        assert!(serde_json::from_str::<Identity>(r#""other""#).is_err());
    }

    #[test]
    fn a_manifest_is_written_once_and_a_changed_setting_is_refused_by_key() {
        let tmp = tempfile::tempdir().unwrap();
        let m = Manifest::new(
            "f/1",
            serde_json::json!({"a": 1, "b": {"c": 2}}),
            Identity::ScriptedUnnamed,
        );
        m.create_or_check(tmp.path(), &[]).unwrap();
        m.create_or_check(tmp.path(), &[]).unwrap();
        assert!(!tmp.path().join("manifest.json.tmp").exists());
        let other = Manifest::new(
            "f/1",
            serde_json::json!({"a": 1, "b": {"c": 3}}),
            Identity::ScriptedUnnamed,
        );
        let e = other.create_or_check(tmp.path(), &[]).unwrap_err();
        assert!(
            matches!(&e, DirError::ConfigMismatch { key, .. } if key == "config.b.c"),
            "{e}"
        );
        let read: Manifest<Value> = Manifest::read(tmp.path()).unwrap();
        assert_eq!(read.config_hash(), m.config_hash());
        assert_ne!(other.config_hash(), m.config_hash());

        let bare = tempfile::tempdir().unwrap();
        std::fs::write(bare.path().join("log.jsonl"), "{}\n").unwrap();
        let e = m.create_or_check(bare.path(), &["log.jsonl"]).unwrap_err();
        assert!(matches!(e, DirError::NoManifest { .. }), "{e}");
    }
}
