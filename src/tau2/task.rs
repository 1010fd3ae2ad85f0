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
    /// Parsed, but its contents contradict themselves or the database.
    #[error("{path}: {why}")]
    Invalid { path: PathBuf, why: String },
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
    /// τ²'s own prompt layouts and tool descriptions (`--tau2-src`); None:
    /// statebench's wording.
    pub wording: Option<super::source::Tau2Source>,
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
        let db: FlightDb = files.json("db.json")?;
        let invalid = |name: &str, why: String| DataError::Invalid {
            path: dir.join(name),
            why,
        };
        check_references(&db).map_err(|why| invalid("db.json", why))?;
        let tasks: Vec<Task> = raw.into_iter().map(Task::from).collect();
        for task in &tasks {
            check_gold(task, &db).map_err(|why| invalid(file.file_name(), why))?;
        }
        Ok(Tau2Data {
            dir: dir.to_path_buf(),
            policy: files.text("policy.md")?,
            db,
            tasks,
            split: files.json("split_tasks.json")?,
            guidelines: files.text("simulation_guidelines.md")?,
            sha256: files.sha256,
            wording: None,
        })
    }

    pub fn task(&self, id: &str) -> Option<&Task> {
        self.tasks.iter().find(|t| t.id == id)
    }
}

/// Every id the database uses names a record it holds: a reservation's
/// user and flights (on that date), a user's reservations (each theirs),
/// and each record under its own id. A dangling id would fail a tool call
/// in the middle of an episode, or, worse, be read as "not found".
fn check_references(db: &FlightDb) -> Result<(), String> {
    for (id, f) in &db.flights {
        if *id != f.flight_number {
            return Err(format!("flight {id} is filed as {}", f.flight_number));
        }
    }
    for (id, r) in &db.reservations {
        if *id != r.reservation_id {
            return Err(format!("reservation {id} is filed as {}", r.reservation_id));
        }
        let Some(user) = db.users.get(&r.user_id) else {
            return Err(format!(
                "reservation {id} names user {}, who is not in the database",
                r.user_id
            ));
        };
        if !user.reservations.contains(id) {
            return Err(format!(
                "reservation {id} is not among user {}'s reservations",
                r.user_id
            ));
        }
        for seg in &r.flights {
            let known = db
                .flights
                .get(&seg.flight_number)
                .is_some_and(|f| f.dates.contains_key(&seg.date));
            if !known {
                return Err(format!(
                    "reservation {id} names flight {} on {}, which the database does not hold",
                    seg.flight_number, seg.date
                ));
            }
        }
    }
    for (id, u) in &db.users {
        if *id != u.user_id {
            return Err(format!("user {id} is filed as {}", u.user_id));
        }
        for r in &u.reservations {
            match db.reservations.get(r) {
                None => {
                    return Err(format!(
                        "user {id} lists reservation {r}, which is not in the database"
                    ))
                }
                Some(res) if res.user_id != *id => {
                    return Err(format!(
                        "user {id} lists reservation {r}, which is {}'s",
                        res.user_id
                    ))
                }
                Some(_) => {}
            }
        }
    }
    Ok(())
}

/// A task's gold actions name the airline's tools and replay without error
/// on the database: the gold database every episode of the task is scored
/// against is then the one its actions describe.
fn check_gold(task: &Task, db: &FlightDb) -> Result<(), String> {
    let actions = &task.criteria.actions;
    if let Some(a) = actions.iter().find(|a| !tools::is_tool(&a.name)) {
        return Err(format!(
            "task {}: gold action {} names {:?}, which is not an airline tool",
            task.id, a.action_id, a.name
        ));
    }
    if !task.has_gold_write() {
        return Ok(());
    }
    let mut gold = db.clone();
    for a in actions {
        if let Err(e) = tools::call(&mut gold, &a.name, &a.arguments) {
            return Err(format!(
                "task {}: gold action {} ({}) fails on the database: {}",
                task.id,
                a.action_id,
                a.name,
                tools::error_text(&e)
            ));
        }
    }
    Ok(())
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
