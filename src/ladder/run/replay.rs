//! Scoring replies produced elsewhere (another harness, an API): the replies
//! are replayed turn by turn through an arm with the oracle matcher and
//! compiler, so a gated arm's verdicts are recomputed exactly.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::runner::{run_episode, Compiled, EpisodeRecord, RunOptions, TurnRecord};
use crate::backend::{Message, Tool};
use crate::ladder::arms::Arm;
use crate::ladder::episode::{Episode, Protocol, EPISODE_VERSION};
use crate::ladder::parts::scripted::OracleMatcher;
use crate::ladder::parts::{Agent, MemoryParts, Oracle, Reply};
use crate::ladder::score::Label;

/// Errors reading an episode or a replies file.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("{path}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A line that is not the JSON it should be.
    #[error("{path}:{line}")]
    Json {
        path: String,
        /// One-based line.
        line: usize,
        #[source]
        source: serde_json::Error,
    },
    /// A line that parses but says something impossible.
    #[error("{path}:{line}: {cause}")]
    Line {
        path: String,
        line: usize,
        cause: String,
    },
    /// Episode written by another format version.
    #[error("{path}: episode version '{found}' is not '{EPISODE_VERSION}' (regenerate it with `statebench ladder episode --json`)")]
    Version { path: String, found: String },
    /// An episode that breaks what the generator guarantees.
    #[error("{path}: not a valid episode: {cause}")]
    Invalid { path: String, cause: String },
    /// Turn coverage problems.
    #[error("{path}: {cause}")]
    Coverage { path: String, cause: String },
    /// An arm that cannot be replayed.
    #[error("arm {0} re-prompts the agent within a turn; recorded replies cannot answer that (score it live)")]
    Arm(Arm),
    /// Native tool calls answer tool results within a turn.
    #[error("the native tool protocol answers tool results within a turn; recorded replies cannot (score it live, or use --protocol tool)")]
    Native,
}

/// What `ladder episode --json` writes: the episode and the perfect agent's labels.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EpisodeFile {
    /// The episode.
    #[serde(flatten)]
    pub episode: Episode,
    /// Ground-truth labels along the perfect agent's path.
    #[serde(default)]
    pub perfect_labels: Vec<Label>,
}

/// Reads an episode file, checking its version.
pub fn read_episode(path: &Path) -> Result<Episode, ReplayError> {
    /// Read first, so a file of another version is named as such.
    #[derive(Deserialize)]
    struct Versioned {
        version: Option<String>,
    }
    let p = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ReplayError::Io {
        path: p.clone(),
        source,
    })?;
    let json = |source: serde_json::Error| ReplayError::Json {
        path: p.clone(),
        line: source.line(),
        source,
    };
    let v: Versioned = serde_json::from_str(&text).map_err(json)?;
    let found = v.version.unwrap_or_else(|| "(none)".into());
    if found != EPISODE_VERSION {
        return Err(ReplayError::Version { path: p, found });
    }
    let f: EpisodeFile = serde_json::from_str(&text).map_err(json)?;
    f.episode
        .validate()
        .map_err(|cause| ReplayError::Invalid { path: p, cause })?;
    Ok(f.episode)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplyLine {
    turn: usize,
    reply: String,
}

/// Reads a replies file: one `{"turn": i, "reply": "…"}` line per turn, every turn exactly once.
pub fn read_replies(path: &Path, turns: usize) -> Result<Vec<String>, ReplayError> {
    let p = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ReplayError::Io {
        path: p.clone(),
        source,
    })?;
    let mut out: Vec<Option<String>> = vec![None; turns];
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |cause: String| ReplayError::Line {
            path: p.clone(),
            line: i + 1,
            cause,
        };
        let r: ReplyLine = serde_json::from_str(line).map_err(|source| ReplayError::Json {
            path: p.clone(),
            line: i + 1,
            source,
        })?;
        if r.turn >= turns {
            return Err(bad(format!(
                "turn {} is past the episode's last turn {}",
                r.turn,
                turns - 1
            )));
        }
        if out[r.turn].is_some() {
            return Err(bad(format!("turn {} appears twice", r.turn)));
        }
        out[r.turn] = Some(r.reply);
    }
    let missing: Vec<String> = out
        .iter()
        .enumerate()
        .filter(|(_, r)| r.is_none())
        .map(|(i, _)| i.to_string())
        .collect();
    if !missing.is_empty() {
        return Err(ReplayError::Coverage {
            path: p,
            cause: format!("no reply for turn(s) {}", missing.join(", ")),
        });
    }
    Ok(out.into_iter().flatten().collect())
}

/// Plays recorded replies back, one per turn.
struct Recorded<'a>(&'a [String]);

impl Agent for Recorded<'_> {
    fn name(&self) -> String {
        "recorded".into()
    }
    fn reply(&mut self, _m: &[Message], _tools: &[Tool], o: &Oracle) -> Reply {
        Reply {
            text: self.0[o.turn.index].clone(),
            ..Default::default()
        }
    }
}

/// Scores recorded replies on an arm.
pub fn score_replies(
    ep: &Episode,
    replies: &[String],
    arm: Arm,
) -> Result<(EpisodeRecord, Vec<TurnRecord>), ReplayError> {
    if arm.same_turn_notice() {
        return Err(ReplayError::Arm(arm));
    }
    if ep.config.settings.protocol == Protocol::Native {
        return Err(ReplayError::Native);
    }
    let compiled = arm.uses_module().then(|| Compiled::oracle(ep));
    Ok(run_episode(
        ep,
        arm,
        &mut Recorded(replies),
        &mut OracleMatcher,
        &mut MemoryParts::scripted(),
        compiled.as_ref(),
        &RunOptions::default(),
    ))
}
