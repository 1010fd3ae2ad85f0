//! τ²'s own wording, read at run time from the user's tau2-bench checkout
//! (`--tau2-src DIR`, its `src/tau2`): the agent's system-prompt layout and
//! instruction (`agent/llm_agent.py`), the airline tools' descriptions
//! (`domains/airline/tools.py`, their docstrings as τ² turns them into
//! tool schemas) and the user simulator's system-prompt layout
//! (`user/user_simulator.py`). statebench does not carry τ²'s text; without
//! this option its own wording is used ([`super::prompts`], [`super::tools`]).
//!
//! The files are read, not run: a module-level `NAME = """…"""` string
//! (with `.strip()` when the source strips it), and each `@is_tool` method's
//! docstring read as τ²'s docstring parser reads the Google style — the
//! description is the first line, then the rest before the first section
//! after a blank line; each `Args:` entry `name: text` describes that
//! parameter. A directory may also hold the files flattened, `/` written
//! `__` (`agent__llm_agent.py`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The files read, as a checkout's `src/tau2` holds them.
pub const FILES: [&str; 3] = [AGENT_FILE, TOOLS_FILE, USER_FILE];
const AGENT_FILE: &str = "agent/llm_agent.py";
const TOOLS_FILE: &str = "domains/airline/tools.py";
const USER_FILE: &str = "user/user_simulator.py";

/// Most bytes of one file: each is a few dozen kilobytes.
pub const FILE_CAP: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("--tau2-src {}: {why}", path.display())]
    File { path: PathBuf, why: String },
}

/// One tool's wording: its description and its parameters'.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolDoc {
    pub description: String,
    pub params: BTreeMap<String, String>,
}

/// What a run takes from τ²'s sources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tau2Source {
    /// The agent's system prompt with `{agent_instruction}` and
    /// `{domain_policy}` to fill (Python `str.format` fields).
    agent_prompt: String,
    agent_instruction: String,
    /// The simulator's system prompt with
    /// `{global_user_sim_guidelines_with_persona}` and `{instructions}`.
    user_prompt: String,
    /// Every `@is_tool` method's wording, by tool name.
    pub tools: BTreeMap<String, ToolDoc>,
    /// sha256 (hex) of each file read, by its name in the checkout.
    pub sha256: BTreeMap<String, String>,
}

impl Tau2Source {
    /// Reads the three files from `dir`.
    pub fn read(dir: &Path) -> Result<Tau2Source, SourceError> {
        let mut texts = BTreeMap::new();
        let mut sha256 = BTreeMap::new();
        for name in FILES {
            let (path, text) = read_file(dir, name)?;
            sha256.insert(
                name.to_string(),
                crate::hex(&Sha256::digest(text.as_bytes())),
            );
            texts.insert(name, (path, text));
        }
        let constant = |file: &str, name: &str| -> Result<String, SourceError> {
            let (path, text) = &texts[file];
            module_string(text, name).ok_or_else(|| SourceError::File {
                path: path.clone(),
                why: format!("no module-level string {name} = \"\"\"…\"\"\" in it"),
            })
        };
        let agent_prompt = constant(AGENT_FILE, "SYSTEM_PROMPT")?;
        let agent_instruction = constant(AGENT_FILE, "AGENT_INSTRUCTION")?;
        let user_prompt = constant(USER_FILE, "SYSTEM_PROMPT")?;
        let (tools_path, tools_text) = &texts[TOOLS_FILE];
        let tools = tool_docs(tools_text);
        if tools.is_empty() {
            return Err(SourceError::File {
                path: tools_path.clone(),
                why: "no @is_tool method with a docstring in it".into(),
            });
        }
        for (path, template, fields) in [
            (
                &texts[AGENT_FILE].0,
                &agent_prompt,
                &["agent_instruction", "domain_policy"][..],
            ),
            (
                &texts[USER_FILE].0,
                &user_prompt,
                &["global_user_sim_guidelines_with_persona", "instructions"][..],
            ),
        ] {
            if let Some(f) = fields
                .iter()
                .find(|f| !template.contains(&format!("{{{f}}}")))
            {
                return Err(SourceError::File {
                    path: path.clone(),
                    why: format!("its SYSTEM_PROMPT has no {{{f}}} field"),
                });
            }
        }
        Ok(Tau2Source {
            agent_prompt,
            agent_instruction,
            user_prompt,
            tools,
            sha256,
        })
    }

    /// The agent's system prompt as τ² builds it for `policy`.
    pub fn agent_system(&self, policy: &str) -> String {
        format_fields(
            &self.agent_prompt,
            &[
                ("agent_instruction", &self.agent_instruction),
                ("domain_policy", policy),
            ],
        )
    }

    /// The simulator's system prompt as τ² builds it: the guidelines (with
    /// no persona text in their slot) and the scenario.
    pub fn user_system(&self, guidelines: &str, scenario: &str) -> String {
        format_fields(
            &self.user_prompt,
            &[
                ("global_user_sim_guidelines_with_persona", guidelines),
                ("instructions", scenario),
            ],
        )
    }
}

/// `name` in `dir`, as a checkout holds it or flattened.
fn read_file(dir: &Path, name: &str) -> Result<(PathBuf, String), SourceError> {
    let nested = dir.join(name);
    let flat = dir.join(name.replace('/', "__"));
    let path = if nested.is_file() || !flat.is_file() {
        nested
    } else {
        flat
    };
    let err = |why: String| SourceError::File {
        path: path.clone(),
        why,
    };
    let len = std::fs::metadata(&path)
        .map_err(|e| {
            err(format!(
                "{e} (give a tau2-bench checkout's src/tau2, which holds {})",
                FILES.join(", ")
            ))
        })?
        .len();
    if len > FILE_CAP {
        return Err(err(format!("{len} bytes, above the {FILE_CAP}-byte cap")));
    }
    let text = std::fs::read_to_string(&path).map_err(|e| err(e.to_string()))?;
    Ok((path, text))
}

/// Python's `str.format` for named fields: `{name}` replaced, `{{` and
/// `}}` halved; any other brace left as it is.
fn format_fields(template: &str, fields: &[(&str, &str)]) -> String {
    let mut out = String::new();
    let mut rest = template;
    while let Some(i) = rest.find(['{', '}']) {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        if rest.starts_with("{{") || rest.starts_with("}}") {
            out.push_str(&rest[..1]);
            rest = &rest[2..];
            continue;
        }
        let field = rest.strip_prefix('{').and_then(|r| {
            let end = r.find('}')?;
            fields
                .iter()
                .find(|(n, _)| *n == &r[..end])
                .map(|f| (f, end))
        });
        match field {
            Some(((_, value), end)) => {
                out.push_str(value);
                rest = &rest[end + 2..];
            }
            None => {
                out.push_str(&rest[..1]);
                rest = &rest[1..];
            }
        }
    }
    out + rest
}

/// A module-level `NAME = """…"""` string (its escapes read as Python's),
/// stripped when `.strip()` follows it.
fn module_string(text: &str, name: &str) -> Option<String> {
    let head = format!("{name} = \"\"\"");
    let start = text
        .match_indices(&head)
        .map(|(i, _)| i)
        .find(|&i| i == 0 || text.as_bytes()[i - 1] == b'\n')?
        + head.len();
    let len = text[start..].find("\"\"\"")?;
    let body = unescape(&text[start..start + len]);
    Some(match text[start + len + 3..].starts_with(".strip()") {
        true => body.trim().to_string(),
        false => body,
    })
}

/// Python's escapes in a non-raw string literal: the common ones, and a
/// backslash before a newline joins the lines.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('\n') => {}
            Some(c @ ('\\' | '"' | '\'')) => out.push(c),
            Some(c) => {
                out.push('\\');
                out.push(c);
            }
            None => out.push('\\'),
        }
    }
    out
}

/// Every `@is_tool` method's name and docstring, read as τ²'s parser reads
/// it (a commented-out decorator is no tool).
fn tool_docs(text: &str) -> BTreeMap<String, ToolDoc> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = BTreeMap::new();
    for (i, line) in lines.iter().enumerate() {
        if !line.trim_start().starts_with("@is_tool") {
            continue;
        }
        let Some(def) = lines[i + 1..]
            .iter()
            .position(|l| l.trim_start().starts_with("def "))
            .map(|d| i + 1 + d)
        else {
            continue;
        };
        let name: String = lines[def]
            .trim_start()
            .trim_start_matches("def ")
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        // The signature ends at the first line ending in `:` after its `(`.
        let Some(body) = lines[def..]
            .iter()
            .position(|l| l.trim_end().ends_with(':'))
            .map(|e| def + e + 1)
        else {
            continue;
        };
        let rest = lines[body..].join("\n");
        let trimmed = rest.trim_start();
        let Some(doc) = trimmed.strip_prefix("\"\"\"") else {
            continue;
        };
        let Some(end) = doc.find("\"\"\"") else {
            continue;
        };
        out.insert(name, parse_docstring(&unescape(&doc[..end])));
    }
    out
}

/// Python's `inspect.cleandoc`: leading and trailing blank lines gone, the
/// first line stripped, the rest's common indentation removed.
fn cleandoc(doc: &str) -> String {
    let lines: Vec<&str> = doc.lines().collect();
    let indent = lines
        .iter()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    let mut out: Vec<String> = lines
        .iter()
        .enumerate()
        .map(|(i, l)| match i {
            0 => l.trim_start().to_string(),
            _ => l.get(indent..).unwrap_or("").trim_end().to_string(),
        })
        .collect();
    while out.first().is_some_and(|l| l.trim().is_empty()) {
        out.remove(0);
    }
    while out.last().is_some_and(|l| l.trim().is_empty()) {
        out.pop();
    }
    out.join("\n")
}

/// Section titles of the Google style.
const SECTIONS: [&str; 9] = [
    "Args:",
    "Arguments:",
    "Parameters:",
    "Returns:",
    "Return:",
    "Yields:",
    "Raises:",
    "Example:",
    "Examples:",
];

/// A Google-style docstring: the description (the first line, and the
/// rest before the first section after a blank line) and the `Args:`
/// entries, each's text with its continuation lines.
fn parse_docstring(doc: &str) -> ToolDoc {
    let text = cleandoc(doc);
    let lines: Vec<&str> = text.lines().collect();
    let first_section = lines
        .iter()
        .position(|l| SECTIONS.contains(&l.trim()))
        .unwrap_or(lines.len());
    let desc = lines[..first_section].join("\n");
    let (short, long) = match desc.split_once('\n') {
        Some((s, l)) => (s.trim().to_string(), l.trim().to_string()),
        None => (desc.trim().to_string(), String::new()),
    };
    let description = match long.is_empty() {
        true => short,
        false => format!("{short}\n\n{long}"),
    };
    let mut params = BTreeMap::new();
    let mut in_args = false;
    let mut current: Option<(String, String)> = None;
    let mut item_indent = None;
    for line in &lines[first_section..] {
        let t = line.trim();
        if SECTIONS.contains(&t) && line.len() == line.trim_start().len() {
            in_args = matches!(t, "Args:" | "Arguments:" | "Parameters:");
            item_indent = None;
            continue;
        }
        if !in_args || t.is_empty() {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        let indent_of_items = *item_indent.get_or_insert(indent);
        match (indent == indent_of_items, t.split_once(':')) {
            (true, Some((head, text))) => {
                if let Some((n, d)) = current.take() {
                    params.insert(n, d);
                }
                // `name (type): text` names the parameter before the type.
                let name = head.split_whitespace().next().unwrap_or("").to_string();
                current = Some((name, text.trim().to_string()));
            }
            _ => {
                if let Some((_, d)) = current.as_mut() {
                    d.push('\n');
                    d.push_str(t);
                }
            }
        }
    }
    if let Some((n, d)) = current {
        params.insert(n, d);
    }
    ToolDoc {
        description,
        params,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_strings_are_read_with_their_escapes_and_strip() {
        let src = "X = 1\nPROMPT = \"\"\"\n  Hello {name}\\n\\tthere \\\"you\\\" \\\njoined\n\"\"\".strip()\nRAW = \"\"\" kept \"\"\"\n  INDENTED = \"\"\"no\"\"\"\n";
        assert_eq!(
            module_string(src, "PROMPT").as_deref(),
            Some("Hello {name}\n\tthere \"you\" joined")
        );
        assert_eq!(module_string(src, "RAW").as_deref(), Some(" kept "));
        assert_eq!(module_string(src, "INDENTED"), None, "not module level");
        assert_eq!(module_string(src, "MISSING"), None);
    }

    #[test]
    fn format_fields_fills_named_fields_and_halves_doubled_braces() {
        let t = "<a>\n{x}\n</a> {{literal}} {unknown} {y}";
        assert_eq!(
            format_fields(t, &[("x", "X {y} stays"), ("y", "Y")]),
            "<a>\nX {y} stays\n</a> {literal} {unknown} Y"
        );
    }

    #[test]
    fn docstrings_are_read_as_the_google_style_parser_reads_them() {
        let src = r#"
class Tools:
    @is_tool(ToolType.WRITE)
    def change(
        self,
        reservation_id: str,
        cabin: str,
    ) -> Reservation:
        """
        Change a reservation.

        Only cabins that exist.
        Two lines of detail.

        Args:
            reservation_id: The reservation ID, such as 'ZFA04Y'.
            cabin (str): The cabin, such as 'economy'
                or 'business'.

        Returns:
            The changed reservation.
        """
        return 1

    # @is_tool(ToolType.THINK)
    def think(self, thought: str) -> str:
        """Not a tool."""

    @is_tool(ToolType.READ)
    def ping(self) -> str:
        """Answer pong."""
        return "pong"
"#;
        let docs = tool_docs(src);
        assert_eq!(docs.len(), 2, "{docs:?}");
        let c = &docs["change"];
        assert_eq!(
            c.description,
            "Change a reservation.\n\nOnly cabins that exist.\nTwo lines of detail."
        );
        assert_eq!(
            c.params["reservation_id"],
            "The reservation ID, such as 'ZFA04Y'."
        );
        assert_eq!(
            c.params["cabin"],
            "The cabin, such as 'economy'\nor 'business'."
        );
        assert_eq!(c.params.len(), 2, "Returns is no parameter");
        assert_eq!(docs["ping"].description, "Answer pong.");
        assert!(docs["ping"].params.is_empty());
    }
}
