//! τ²'s airline tasks and the data directory a study reads: policy, tasks,
//! split, database and the user simulator's guidelines.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::db::FlightDb;
use super::tools;

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a valid τ² airline file")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// Which task file of the data directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum TaskFile {
    /// `tasks.json`: the current tasks (gold writes corrected).
    Current,
    /// `tasks_release.json`: the tasks of τ²'s first release.
    Release,
}

impl TaskFile {
    pub fn file_name(self) -> &'static str {
        match self {
            TaskFile::Current => "tasks.json",
            TaskFile::Release => "tasks_release.json",
        }
    }
}

/// One airline task. Fields τ² has and statebench does not use are ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    pub id: String,
    pub purpose: Option<String>,
    pub user: UserScenario,
    pub criteria: Criteria,
}

/// What the simulated user knows and wants.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UserScenario {
    pub persona: Option<String>,
    pub reason_for_call: String,
    pub known_info: Option<String>,
    pub unknown_info: Option<String>,
    pub task_instructions: String,
}

/// How an episode is scored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Criteria {
    /// The gold tool calls, in order.
    pub actions: Vec<GoldAction>,
    /// Strings some agent message must contain.
    pub communicate_info: Vec<String>,
    /// Judged in τ² by a model; not part of the airline reward.
    pub nl_assertions: Vec<String>,
    /// `DB`, `COMMUNICATE`, …; the first release's tasks have none and
    /// get the airline's `DB`, `COMMUNICATE`.
    pub reward_basis: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GoldAction {
    pub action_id: String,
    pub name: String,
    pub arguments: serde_json::Value,
}

impl Task {
    /// One of the gold actions is a write.
    pub fn has_gold_write(&self) -> bool {
        self.criteria
            .actions
            .iter()
            .any(|a| tools::is_write(&a.name))
    }
}

/// τ²'s reward basis where a task names none (τ²'s default).
const DEFAULT_BASIS: [&str; 2] = ["DB", "COMMUNICATE"];

// The file's layout, as far as statebench reads it.
#[derive(Deserialize)]
struct RawTask {
    id: String,
    #[serde(default)]
    description: Option<RawDescription>,
    user_scenario: RawScenario,
    #[serde(default)]
    evaluation_criteria: Option<RawCriteria>,
}

#[derive(Deserialize)]
struct RawDescription {
    #[serde(default)]
    purpose: Option<String>,
}

#[derive(Deserialize)]
struct RawScenario {
    #[serde(default)]
    persona: Option<String>,
    instructions: RawInstructions,
}

#[derive(Deserialize)]
struct RawInstructions {
    reason_for_call: String,
    #[serde(default)]
    known_info: Option<String>,
    #[serde(default)]
    unknown_info: Option<String>,
    task_instructions: String,
}

#[derive(Deserialize)]
struct RawCriteria {
    #[serde(default)]
    actions: Option<Vec<RawAction>>,
    #[serde(default)]
    communicate_info: Option<Vec<String>>,
    #[serde(default)]
    nl_assertions: Option<Vec<String>>,
    #[serde(default)]
    reward_basis: Option<Vec<String>>,
}

#[derive(Deserialize)]
struct RawAction {
    action_id: String,
    name: String,
    #[serde(default)]
    arguments: serde_json::Value,
}

impl From<RawTask> for Task {
    fn from(raw: RawTask) -> Task {
        let c = raw.evaluation_criteria.unwrap_or(RawCriteria {
            actions: None,
            communicate_info: None,
            nl_assertions: None,
            reward_basis: None,
        });
        let i = raw.user_scenario.instructions;
        Task {
            id: raw.id,
            purpose: raw.description.and_then(|d| d.purpose),
            user: UserScenario {
                persona: raw.user_scenario.persona,
                reason_for_call: i.reason_for_call,
                known_info: i.known_info,
                unknown_info: i.unknown_info,
                task_instructions: i.task_instructions,
            },
            criteria: Criteria {
                actions: c
                    .actions
                    .unwrap_or_default()
                    .into_iter()
                    .map(gold)
                    .collect(),
                communicate_info: c.communicate_info.unwrap_or_default(),
                nl_assertions: c.nl_assertions.unwrap_or_default(),
                reward_basis: c
                    .reward_basis
                    .unwrap_or_else(|| DEFAULT_BASIS.map(String::from).to_vec()),
            },
        }
    }
}

fn gold(a: RawAction) -> GoldAction {
    let arguments = match a.arguments {
        serde_json::Value::Null => serde_json::Value::Object(Default::default()),
        other => other,
    };
    GoldAction {
        action_id: a.action_id,
        name: a.name,
        arguments,
    }
}

/// A τ² airline data directory, read whole.
#[derive(Debug, Clone)]
pub struct Tau2Data {
    pub dir: PathBuf,
    /// `policy.md`: the agent's policy.
    pub policy: String,
    /// `db.json`: the initial database of every episode.
    pub db: FlightDb,
    pub tasks: Vec<Task>,
    /// `split_tasks.json`: split name → task ids.
    pub split: BTreeMap<String, Vec<String>>,
    /// `simulation_guidelines.md`: the user simulator's guidelines.
    pub guidelines: String,
    /// sha256 (hex) of every file read, by file name: of the bytes loaded,
    /// so what a run pins is what it read.
    pub sha256: BTreeMap<String, String>,
}

impl Tau2Data {
    /// The directory with its current tasks (`tasks.json`).
    pub fn open(dir: &Path) -> Result<Tau2Data, DataError> {
        Tau2Data::open_tasks(dir, TaskFile::Current)
    }

    pub fn open_tasks(dir: &Path, file: TaskFile) -> Result<Tau2Data, DataError> {
        let mut files = Files {
            dir,
            sha256: BTreeMap::new(),
        };
        let raw: Vec<RawTask> = files.json(file.file_name())?;
        Ok(Tau2Data {
            dir: dir.to_path_buf(),
            policy: files.text("policy.md")?,
            db: files.json("db.json")?,
            tasks: raw.into_iter().map(Task::from).collect(),
            split: files.json("split_tasks.json")?,
            guidelines: files.text("simulation_guidelines.md")?,
            sha256: files.sha256,
        })
    }

    pub fn task(&self, id: &str) -> Option<&Task> {
        self.tasks.iter().find(|t| t.id == id)
    }
}

/// A τ² task file (either layout).
pub fn load_tasks(path: &Path) -> Result<Vec<Task>, DataError> {
    let raw: Vec<RawTask> = parse_text(path, &read(path)?)?;
    Ok(raw.into_iter().map(Task::from).collect())
}

/// A data directory's files as they are read, each hashed on the way.
struct Files<'a> {
    dir: &'a Path,
    sha256: BTreeMap<String, String>,
}

impl Files<'_> {
    fn text(&mut self, name: &str) -> Result<String, DataError> {
        let text = read(&self.dir.join(name))?;
        let hash = crate::hex(&Sha256::digest(text.as_bytes()));
        self.sha256.insert(name.to_string(), hash);
        Ok(text)
    }

    fn json<T: serde::de::DeserializeOwned>(&mut self, name: &str) -> Result<T, DataError> {
        let text = self.text(name)?;
        parse_text(&self.dir.join(name), &text)
    }
}

fn read(path: &Path) -> Result<String, DataError> {
    super::db::read_data_file(path).map_err(|source| DataError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn parse_text<T: serde::de::DeserializeOwned>(path: &Path, text: &str) -> Result<T, DataError> {
    serde_json::from_str(text).map_err(|source| DataError::Parse {
        path: path.to_path_buf(),
        source,
    })
}
