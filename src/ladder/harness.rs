//! The native tool harness (Appendix G): each step is a tool whose one
//! argument is the work order; a call that the gate admits stamps the work
//! order into the episode's workspace, a temporary directory removed with
//! the episode. Scoring reads the workspace: a turn executed a step when
//! the step's file gained a stamp carrying the turn's work order, so a
//! second stamp for a finished step is a re-execution and a refused call,
//! which stamps nothing, executes nothing. Tools never fail.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::episode::Episode;
use super::prompts as p;
use super::receipt::RefLine;
use crate::backend::{Tool, ToolCall};

/// Most agent calls of one turn: a reply with calls gets their results and
/// is asked again, until it replies without calls or this many replies
/// were made (a loop the agent does not end is cut here).
pub const MAX_ROUNDS: usize = 5;

/// The step tools of an episode, in step order.
pub fn tools(ep: &Episode) -> Vec<Tool> {
    ep.steps
        .iter()
        .map(|s| {
            let params = json!({
                "type": "object",
                "properties": {
                    "work_order": {"type": "string", "description": p::WORK_ORDER_ARGUMENT}
                },
                "required": ["work_order"]
            });
            Tool::function(
                &s.tool,
                &p::tool_description(&s.id.to_string(), &s.wording),
                params,
            )
        })
        .collect()
}

/// A call as a booking, or why it is malformed: the arguments must be a
/// JSON object whose `work_order` holds a four-digit work order (`#W1234`,
/// `W1234` or `1234`).
pub fn booking(call: &ToolCall, line_no: usize) -> Result<RefLine, String> {
    let args: serde_json::Value = serde_json::from_str(&call.arguments)
        .map_err(|_| format!("arguments are not JSON: {}", call.arguments))?;
    let wo = args
        .get("work_order")
        .and_then(|v| v.as_str())
        .ok_or_else(|| format!("no work_order string in {}", call.arguments))?;
    let digits: String = wo.chars().filter(|c| c.is_ascii_digit()).collect();
    let shape = wo
        .trim()
        .trim_start_matches('#')
        .trim_start_matches(['W', 'w'])
        .chars()
        .all(|c| c.is_ascii_digit());
    if digits.len() != 4 || !shape {
        return Err(format!("work_order '{wo}' is not a work order like #W1234"));
    }
    let work_order = format!("#W{digits}");
    Ok(RefLine {
        code: String::new(),
        tool: call.name.clone(),
        line: format!("{}({{\"work_order\": \"{work_order}\"}})", call.name),
        work_order,
        line_no,
    })
}

/// Every stamp in a workspace: tool name → work orders in stamp order.
pub type Stamps = BTreeMap<String, Vec<String>>;

/// One episode's workspace.
pub struct Workspace {
    dir: tempfile::TempDir,
}

/// A workspace that could not be made, written or read.
#[derive(Debug, thiserror::Error)]
#[error("tool workspace {path}")]
pub struct WorkspaceError {
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

impl Workspace {
    /// A fresh, empty workspace in the system's temporary directory.
    pub fn new() -> Result<Self, WorkspaceError> {
        tempfile::Builder::new()
            .prefix("statebench-workspace-")
            .tempdir()
            .map(|dir| Workspace { dir })
            .map_err(|source| WorkspaceError {
                path: std::env::temp_dir(),
                source,
            })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The tool's effect: one line, the work order, appended to the tool's
    /// file.
    pub fn stamp(&self, tool: &str, work_order: &str) -> Result<(), WorkspaceError> {
        let path = self.dir.path().join(tool);
        let err = |source| WorkspaceError {
            path: path.clone(),
            source,
        };
        let mut f = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(err)?;
        writeln!(f, "{work_order}").map_err(err)
    }

    /// Reads every stamp back from the files.
    pub fn stamps(&self) -> Result<Stamps, WorkspaceError> {
        let dir = self.dir.path();
        let err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| WorkspaceError { path, source }
        };
        let mut out = Stamps::new();
        for entry in fs::read_dir(dir).map_err(err(dir))? {
            let path = entry.map_err(err(dir))?.path();
            let text = fs::read_to_string(&path).map_err(err(&path))?;
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            out.insert(name, text.lines().map(str::to_string).collect());
        }
        Ok(out)
    }
}

/// The stamps in `after` that `before` lacks, as (tool, work order) pairs.
pub fn new_stamps(before: &Stamps, after: &Stamps) -> Vec<(String, String)> {
    after
        .iter()
        .flat_map(|(tool, wos)| {
            let seen = before.get(tool).map_or(0, Vec::len);
            wos.iter()
                .skip(seen)
                .map(move |wo| (tool.clone(), wo.clone()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(args: &str) -> ToolCall {
        ToolCall {
            id: "call_0".into(),
            name: "sign_msa".into(),
            arguments: args.into(),
        }
    }

    #[test]
    fn calls_become_bookings_or_are_malformed() {
        let b = booking(&call("{\"work_order\": \"W1941\"}"), 0).unwrap();
        assert_eq!(b.work_order, "#W1941");
        assert_eq!(b.tool, "sign_msa");
        for bad in [
            "{\"work_order\": 1941}",
            "{\"order\": \"#W1941\"}",
            "{\"work_order\": \"#W19411\"}",
            "{\"work_order\": \"RC-1941\"}",
            "not json",
        ] {
            assert!(booking(&call(bad), 0).is_err(), "{bad}");
        }
    }

    #[test]
    fn stamps_append_and_are_read_back() {
        let ws = Workspace::new().unwrap();
        let path = ws.path().to_path_buf();
        let before = ws.stamps().unwrap();
        ws.stamp("sign_msa", "#W1000").unwrap();
        ws.stamp("sign_msa", "#W2000").unwrap();
        ws.stamp("order_parts", "#W2000").unwrap();
        let after = ws.stamps().unwrap();
        assert_eq!(after["sign_msa"], ["#W1000", "#W2000"]);
        assert_eq!(new_stamps(&before, &after).len(), 3);
        ws.stamp("sign_msa", "#W3000").unwrap();
        let later = ws.stamps().unwrap();
        assert_eq!(
            new_stamps(&after, &later),
            [("sign_msa".to_string(), "#W3000".to_string())]
        );
        drop(ws);
        assert!(!path.exists(), "the workspace is removed with the episode");
    }
}
