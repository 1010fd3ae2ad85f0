//! Why a proposed tool call would run or be refused: every rule's verdict
//! with the receipts it read, for a conversation in τ²'s own message format
//! or for a call recorded in a run directory. The verdicts are those
//! dispatch reaches ([`RuleSet::verdicts`] is what [`RuleSet::check`]
//! filters). The receipts are read lexically, or taken from the matcher's
//! reading a run recorded for the call, or read by a matcher model asked
//! now ([`ask_matcher`]); only the last runs a model.
//!
//! The database a call is judged on is the data directory's `db.json`
//! after the calls before it: for a conversation file every call it holds
//! (τ² ran them all, so a call that failed there fails again and changes
//! nothing), for a recorded episode the calls that ran (a call the arm
//! refused changed nothing).

use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::Serialize;
use serde_json::Value;

use super::compile;
use super::db::FlightDb;
use super::reader;
use super::record::{Arm, EpisodeRecord, Reading};
use super::rules::{RuleSet, RuleVerdict, Verdict};
use super::study::{self, Manifest, RuleSource, StudyError};
use super::task::Tau2Data;
use super::tools;
use crate::backend::{Backend, Message, Role, ToolCall};

/// Most bytes of a conversation file, a rule-set file or a `--call`.
pub const FILE_CAP: u64 = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    #[error("{}: {why}", path.display())]
    File { path: PathBuf, why: String },
    #[error("--call: {0}")]
    Call(String),
    #[error("--episode {spec}: {why}")]
    Episode { spec: String, why: String },
    #[error("--rules {spec}: {why}")]
    Rules { spec: String, why: String },
    #[error(transparent)]
    Study(#[from] StudyError),
    #[error("the matcher model failed: {0}")]
    Matcher(String),
}

fn file_error(path: &Path, why: impl std::fmt::Display) -> ExplainError {
    ExplainError::File {
        path: path.to_path_buf(),
        why: why.to_string(),
    }
}

/// Reads a file of at most [`FILE_CAP`] bytes as text.
fn read_capped(path: &Path) -> Result<String, ExplainError> {
    let len = std::fs::metadata(path)
        .map_err(|e| file_error(path, e))?
        .len();
    if len > FILE_CAP {
        return Err(file_error(
            path,
            format!("{len} bytes, above the {FILE_CAP}-byte cap"),
        ));
    }
    std::fs::read_to_string(path).map_err(|e| file_error(path, e))
}

/// The call being judged.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProposedCall {
    pub name: String,
    pub arguments: Value,
}

impl FromStr for ProposedCall {
    type Err = ExplainError;

    /// `{"name": …, "arguments": {…}}`; the arguments may be a JSON string
    /// of an object, as OpenAI writes them, and other keys (τ²'s `id`,
    /// `requestor`) are ignored.
    fn from_str(text: &str) -> Result<ProposedCall, ExplainError> {
        if text.len() as u64 > FILE_CAP {
            return Err(ExplainError::Call(format!(
                "{} bytes, above the {FILE_CAP}-byte cap",
                text.len()
            )));
        }
        let v: Value = serde_json::from_str(text).map_err(|e| ExplainError::Call(e.to_string()))?;
        let name = v
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| ExplainError::Call("needs a \"name\" (a tool's name)".into()))?;
        let arguments = arguments_object(v.get("arguments").unwrap_or(&Value::Null))
            .ok_or_else(|| ExplainError::Call("\"arguments\" must be an object".into()))?;
        if !tools::is_tool(name) {
            return Err(ExplainError::Call(format!(
                "{name:?} is not one of the airline domain's tools"
            )));
        }
        Ok(ProposedCall {
            name: name.to_string(),
            arguments,
        })
    }
}

/// An arguments object, given as one or as a JSON string holding one.
fn arguments_object(v: &Value) -> Option<Value> {
    match v {
        Value::Object(_) => Some(v.clone()),
        Value::String(s) => serde_json::from_str::<Value>(s)
            .ok()
            .filter(Value::is_object),
        _ => None,
    }
}

/// Every rule's verdict on one call, and the call's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Explanation {
    /// `refuse` when any rule refuses, else `allow`.
    pub verdict: Verdict,
    pub call: ProposedCall,
    /// Which rule set judged it.
    pub rule_set: String,
    pub rules: Vec<RuleVerdict>,
    /// The matcher's reading the rules took in place of the lexical one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reading: Option<Reading>,
}

impl Explanation {
    /// Judges `call` after `history` on `db` by `rules`, reading the
    /// conversation as `reading` did (None: lexically).
    pub fn new(
        rules: &RuleSet,
        rule_set: String,
        db: &FlightDb,
        history: &[Message],
        call: ProposedCall,
        reading: Option<Reading>,
    ) -> Explanation {
        let read = reading.as_ref().map(|r| &r.read);
        let verdicts = rules.verdicts_read(db, history, &call.name, &call.arguments, read);
        let refused = verdicts.iter().any(|v| v.verdict == Verdict::Refuse);
        Explanation {
            verdict: if refused {
                Verdict::Refuse
            } else {
                Verdict::Allow
            },
            call,
            rule_set,
            rules: verdicts,
            reading,
        }
    }

    /// One line per rule, then what the conversation rules read.
    pub fn text(&self) -> String {
        let mut out = format!(
            "{} {}\nverdict: {}  (rules: {})\n",
            self.call.name,
            self.call.arguments,
            self.verdict.name(),
            self.rule_set
        );
        let width = self
            .rules
            .iter()
            .map(|r| r.rule.name().len())
            .max()
            .unwrap_or(0);
        for r in &self.rules {
            out += &format!(
                "  {:width$}  {:14}  {}\n",
                r.rule.name(),
                r.verdict.name(),
                r.why
            );
        }
        if let Some(r) = &self.reading {
            out += &format!(
                "matcher's reading: {} (lexical: {}){}\n",
                read_text(&r.read),
                read_text(&r.lexical),
                r.error
                    .as_ref()
                    .map_or(String::new(), |e| format!("; reply unreadable: {e}"))
            );
            out += &format!("  reply: {}\n", r.reply.trim());
        }
        for r in self.rules.iter().filter(|r| !r.receipts.is_empty()) {
            out += &format!("receipts of {}:\n", r.rule.name());
            for (k, v) in &r.receipts {
                let v = match v {
                    Value::String(s) => s.clone(),
                    v => v.to_string(),
                };
                out += &format!("  {k}: {v}\n");
            }
        }
        out
    }

    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).expect("explanations serialize") + "\n"
    }
}

fn read_text(r: &super::rules::MatcherRead) -> String {
    let mut parts = Vec::new();
    if let Some(c) = r.confirmed {
        parts.push(format!("confirmed {c}"));
    }
    parts.push(format!("reason {}", r.reason.as_deref().unwrap_or("none")));
    parts.join(", ")
}

/// Asks a matcher model now for the reading `call` needs under `rules`
/// after `history` (None: the rules read nothing of the conversation for
/// it), as a run with `--receipts model` would have.
pub fn ask_matcher(
    backend: &mut dyn Backend,
    rules: &RuleSet,
    db: &FlightDb,
    history: &[Message],
    call: &ProposedCall,
    seed: u64,
) -> Result<Option<Reading>, ExplainError> {
    let Some(ask) = reader::ask(rules, db, history, &call.name, &call.arguments, seed) else {
        return Ok(None);
    };
    let fail = |e: &dyn std::fmt::Display| ExplainError::Matcher(e.to_string());
    let session = backend.open_session();
    let id = backend
        .submit(session, ask.request.clone())
        .map_err(|e| fail(&e))?;
    let reply = loop {
        if !backend.has_pending() {
            return Err(fail(&"the backend dropped the request"));
        }
        let done = backend.step().map_err(|e| fail(&e))?;
        if let Some((_, r)) = done.into_iter().find(|(i, _)| *i == id) {
            break r.map_err(|e| fail(&e))?;
        }
    };
    backend.close_session(session);
    let index = history.iter().map(|m| m.tool_calls.len()).sum();
    Ok(Some(reader::reading(index, ask, &reply, rules)))
}

/// A conversation in τ²'s message format: a JSON array of messages, or an
/// object holding one under `messages` (an entry of a simulation file).
/// Messages have `role` (system, user, assistant, tool) and `content`
/// (text or null); an assistant's `tool_calls` hold `id`, `name` and
/// `arguments` (an object, or a JSON string of one); a tool message names
/// the call it answers by `id` (τ²) or `tool_call_id` (OpenAI).
pub fn read_conversation(path: &Path) -> Result<Vec<Message>, ExplainError> {
    let v: Value = serde_json::from_str(&read_capped(path)?)
        .map_err(|e| file_error(path, format!("not JSON: {e}")))?;
    let list = match &v {
        Value::Array(a) => a,
        Value::Object(o) => o
            .get("messages")
            .and_then(Value::as_array)
            .ok_or_else(|| file_error(path, "an object without a \"messages\" list"))?,
        _ => {
            return Err(file_error(
                path,
                "neither a message list nor an object holding one",
            ))
        }
    };
    list.iter()
        .enumerate()
        .map(|(i, m)| message(m).map_err(|why| file_error(path, format!("message {i}: {why}"))))
        .collect()
}

fn message(m: &Value) -> Result<Message, String> {
    let text = |k: &str| m.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let content = match m.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err("content must be text or null".into()),
    };
    Ok(match m.get("role").and_then(Value::as_str) {
        Some("system") => Message::new(Role::System, content),
        Some("user") => Message::new(Role::User, content),
        Some("assistant") => {
            let calls = match m.get("tool_calls") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(a)) => a
                    .iter()
                    .enumerate()
                    .map(|(j, c)| tool_call(c).map_err(|why| format!("tool call {j}: {why}")))
                    .collect::<Result<_, _>>()?,
                Some(_) => return Err("tool_calls must be a list".into()),
            };
            Message::calls(content, calls)
        }
        Some("tool") => {
            let id = [text("id"), text("tool_call_id")]
                .into_iter()
                .find(|s| !s.is_empty())
                .ok_or("a tool message needs the id of the call it answers")?;
            Message::tool_result(&id, content)
        }
        Some(r) => return Err(format!("unknown role {r:?}")),
        None => return Err("no role".into()),
    })
}

fn tool_call(c: &Value) -> Result<ToolCall, String> {
    // OpenAI nests name and arguments under "function".
    let f = c.get("function").unwrap_or(c);
    let name = f.get("name").and_then(Value::as_str).ok_or("no name")?;
    let arguments = arguments_object(f.get("arguments").unwrap_or(&Value::Null))
        .ok_or("arguments must be an object")?;
    Ok(ToolCall {
        id: c
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        name: name.to_string(),
        arguments: arguments.to_string(),
    })
}

/// `db` after every call of `history`, in order.
pub fn replay_conversation(db: &FlightDb, history: &[Message]) -> FlightDb {
    let mut db = db.clone();
    for call in history.iter().flat_map(|m| &m.tool_calls) {
        if let Ok(args) = serde_json::from_str::<Value>(&call.arguments) {
            // A call that failed in the conversation fails here too and,
            // like every failing tool, leaves the database as it was.
            let _ = tools::call(&mut db, &call.name, &args);
        }
    }
    db
}

/// `RUN_DIR:TASK:ARM:TRIAL:STEP`: the STEP-th call (from 0) of a recorded
/// episode.
#[derive(Debug, Clone, PartialEq)]
pub struct EpisodeRef {
    pub dir: PathBuf,
    pub task: String,
    pub arm: Arm,
    pub trial: u32,
    pub step: usize,
}

impl FromStr for EpisodeRef {
    type Err = ExplainError;

    fn from_str(spec: &str) -> Result<EpisodeRef, ExplainError> {
        let bad = |why: &str| ExplainError::Episode {
            spec: spec.to_string(),
            why: why.to_string(),
        };
        // The directory may hold colons; the four fields after it do not.
        let mut parts = spec.rsplitn(5, ':');
        let (step, trial, arm, task, dir) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        );
        let (Some(step), Some(trial), Some(arm), Some(task), Some(dir)) =
            (step, trial, arm, task, dir)
        else {
            return Err(bad("expected RUN_DIR:TASK:ARM:TRIAL:STEP"));
        };
        Ok(EpisodeRef {
            dir: PathBuf::from(dir),
            task: task.to_string(),
            arm: <Arm as clap::ValueEnum>::from_str(arm, true)
                .map_err(|_| bad("ARM is one of raw, shown, notice, gate"))?,
            trial: trial.parse().map_err(|_| bad("TRIAL is a number"))?,
            step: step
                .parse()
                .map_err(|_| bad("STEP is a call's index in the episode, from 0"))?,
        })
    }
}

/// A recorded call, ready to judge.
pub struct Recorded {
    /// The run directory.
    pub dir: PathBuf,
    pub manifest: Manifest,
    pub record: EpisodeRecord,
    /// The agent's conversation as dispatch saw it: up to the message that
    /// made the call and the results of that message's earlier calls.
    pub history: Vec<Message>,
    /// The database the call met.
    pub db: FlightDb,
    pub call: ProposedCall,
    /// The matcher's reading the run took for this call, if any.
    pub reading: Option<Reading>,
}

/// Finds a recorded call and rebuilds what dispatch saw. `data` must be the
/// run's own data (its hashes are checked against the manifest's).
pub fn recorded(data: &Tau2Data, r: &EpisodeRef, spec: &str) -> Result<Recorded, ExplainError> {
    let bad = |why: String| ExplainError::Episode {
        spec: spec.to_string(),
        why,
    };
    let manifest = Manifest::read(&r.dir).map_err(StudyError::from)?;
    let theirs = &manifest.config.data_sha256;
    let ours = study::data_hashes(data, manifest.config.task_file);
    if let Some((file, _)) = theirs.iter().find(|(f, h)| ours.get(*f) != Some(h)) {
        return Err(bad(format!(
            "--tau2-data's {file} is not the one this run read (its sha256 differs)"
        )));
    }
    let episodes = study::read_episodes(&r.dir, &manifest)?;
    let record = episodes
        .finished
        .into_iter()
        .chain(episodes.unfinished)
        .find(|e| e.task_id == r.task && e.arm == r.arm && e.trial == r.trial)
        .ok_or_else(|| bad("no episode of this task, arm and trial in the run".into()))?;
    if let Some(cut) = record.cut.first() {
        return Err(bad(format!(
            "the record was shortened when written ({} of {} bytes), so its calls cannot be replayed as they ran",
            cut.at, cut.bytes
        )));
    }
    let Some(target) = record.calls.get(r.step) else {
        return Err(bad(format!(
            "the episode made {} calls (STEP 0 to {})",
            record.calls.len(),
            record.calls.len().saturating_sub(1)
        )));
    };
    // The message holding the STEP-th call, and how many of its calls
    // came before it: dispatch saw their results too.
    let mut seen = 0;
    let mut earlier = 0;
    let at = record
        .messages
        .iter()
        .position(|m| {
            earlier = r.step - seen.min(r.step);
            seen += m.tool_calls.len();
            seen > r.step
        })
        .ok_or_else(|| bad("the record's messages hold fewer calls than its call list".into()))?;
    let mut db = data.db.clone();
    for c in record.calls[..r.step].iter().filter(|c| c.executed) {
        // As in the episode: a failing call left the database as it was.
        let _ = tools::call(&mut db, &c.name, &c.arguments);
    }
    let arguments = arguments_object(&target.arguments).ok_or_else(|| {
        bad(format!(
            "call {} had arguments that were not an object; dispatch refused it unjudged",
            r.step
        ))
    })?;
    let call = ProposedCall {
        name: target.name.clone(),
        arguments,
    };
    let end = (at + 1 + earlier).min(record.messages.len());
    let history = record.messages[..end].to_vec();
    let reading = record.readings.iter().find(|x| x.call == r.step).cloned();
    Ok(Recorded {
        reading,
        dir: r.dir.clone(),
        manifest,
        record,
        history,
        db,
        call,
    })
}

/// Which rules judge: `reference`, `compiled:N` (compile N of the run
/// directory), or a file holding a rule set as a compile writes it.
#[derive(Debug, Clone, PartialEq)]
pub enum RulesSpec {
    Reference,
    Compiled(usize),
    File(PathBuf),
}

impl FromStr for RulesSpec {
    type Err = ExplainError;

    fn from_str(s: &str) -> Result<RulesSpec, ExplainError> {
        Ok(match s {
            "reference" => RulesSpec::Reference,
            _ => match s.strip_prefix("compiled:") {
                Some(n) => RulesSpec::Compiled(n.parse().map_err(|_| ExplainError::Rules {
                    spec: s.to_string(),
                    why: "compiled:N takes a compile's index".into(),
                })?),
                None => RulesSpec::File(PathBuf::from(s)),
            },
        })
    }
}

/// The rule set `spec` names, and how to call it; `run` is the run
/// directory `compiled:N` reads.
pub fn rules(spec: &RulesSpec, run: Option<&Path>) -> Result<(RuleSet, String), ExplainError> {
    match spec {
        RulesSpec::Reference => Ok((RuleSet::reference(), "reference".into())),
        RulesSpec::File(path) => {
            let set = compile::parse(&read_capped(path)?).map_err(|e| file_error(path, e))?;
            Ok((set, path.display().to_string()))
        }
        RulesSpec::Compiled(n) => {
            let bad = |why: String| ExplainError::Rules {
                spec: format!("compiled:{n}"),
                why,
            };
            let dir = run.ok_or_else(|| {
                bad("names a compile of a run directory: give it with --episode".into())
            })?;
            let manifest = Manifest::read(dir).map_err(StudyError::from)?;
            let compiles = study::read_compiles(dir, &manifest)?;
            let c = compiles
                .iter()
                .find(|c| c.index == *n)
                .ok_or_else(|| bad(format!("the run holds {} compiles", compiles.len())))?;
            let set = c.rules.clone().ok_or_else(|| {
                bad(format!(
                    "compile {n} did not parse: {}",
                    c.error.as_deref().unwrap_or("no rules")
                ))
            })?;
            Ok((set, format!("compile {n}")))
        }
    }
}

/// The rules a recorded episode's arm judged with: its compile (or the
/// reference, on a validation run); on raw and shown, which judge nothing,
/// the reference that scores wrongful writes.
pub fn episode_rules(rec: &Recorded) -> Result<(RuleSet, String), ExplainError> {
    match (rec.record.rules, rec.manifest.config.rules) {
        (Some(_), RuleSource::Reference) => Ok((
            RuleSet::reference(),
            format!("reference (the run's {} arm)", rec.record.arm.name()),
        )),
        (Some(n), RuleSource::Compiled) => {
            let (set, _) = rules(&RulesSpec::Compiled(n), Some(&rec.dir))?;
            Ok((set, format!("compile {n} (the episode's)")))
        }
        (None, _) => Ok((
            RuleSet::reference(),
            format!(
                "reference (the {} arm judges nothing; the reference scores wrongful writes)",
                rec.record.arm.name()
            ),
        )),
    }
}
