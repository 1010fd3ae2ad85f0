//! The writer: one memory per case, revised block by block by a model and
//! admitted by software.
//!
//! Each update is a fresh context: the writer's instructions, the current
//! accepted memory and the new block. What a reply must be depends on the
//! formation: a complete typed profile, capacity-bounded notes, or a batch
//! of lifecycle events applied by the reducer. A rejected reply gets one
//! structural repair attempt with the validation error; a second rejection
//! (or a backend error) keeps the prior accepted memory. Every attempt is
//! logged with its reply and its verdict.
//!
//! Best-of-k runs k sampled chains per case and selects one whole
//! candidate per checkpoint: a model reviewer picks a blinded label, or the
//! oracle picks the least field error (lowest index on ties).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::case::Case;
use super::domain::DomainFile;
use super::events::{reduce, Batch, BatchError, MAX_EVENTS};
use super::ledger::{Ledger, Profile};
use super::profile::{
    admit, canonical, first_object, framed, reference_tokens, Fidelity, Rejection,
};
use super::prompts;
use crate::backend::{BackendError, ChatReply, ChatRequest, Message, Role, Usage};
use crate::rng::Rng;

/// What the writer maintains, and what its replies must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Formation {
    /// A complete typed profile each update.
    Typed,
    /// Capacity-bounded plain-text notes.
    FreeText,
    /// Lifecycle events, applied to the typed state by the reducer.
    Events,
}

/// A memory as a writer left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Memory {
    Profile(Profile),
    Text(String),
}

impl Memory {
    /// The typed profile, for formations that keep one.
    pub fn profile(&self) -> Option<&Profile> {
        match self {
            Memory::Profile(p) => Some(p),
            Memory::Text(_) => None,
        }
    }

    /// The memory as executors and later updates read it.
    pub fn text(&self) -> String {
        match self {
            Memory::Profile(p) => canonical(p),
            Memory::Text(t) => t.clone(),
        }
    }
}

/// One writer call and its verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    pub case: String,
    /// The chain of a best-of-k pool (0 without one).
    #[serde(default)]
    pub candidate: usize,
    pub block: usize,
    /// 1, or 2 for the repair.
    pub attempt: usize,
    pub accepted: bool,
    /// Why the attempt was not accepted; none when it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Failure>,
    pub reply: String,
    pub usage: Usage,
}

/// The memory in force after a block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Formed {
    pub case: String,
    #[serde(default)]
    pub candidate: usize,
    pub block: usize,
    /// Whether this block's update was admitted (else the prior memory stands).
    pub accepted: bool,
    pub memory: Memory,
}

/// Settings of a writer chain.
#[derive(Debug, Clone, Copy)]
pub struct WriterSettings {
    pub formation: Formation,
    /// Reference tokens the memory may use.
    pub capacity: usize,
    pub max_tokens: usize,
    pub thinking: bool,
    /// Sampling of a best-of-k chain: (temperature, seed); greedy without.
    pub sampling: Option<(f32, u64)>,
}

/// A model call: one request, one reply.
pub type Ask<'a> = &'a dyn Fn(ChatRequest) -> Result<ChatReply, BackendError>;

fn empty(formation: Formation) -> Memory {
    match formation {
        Formation::FreeText => Memory::Text(String::new()),
        _ => Memory::Profile(Profile::empty()),
    }
}

/// Source ids (`S` and two or more digits) a text mentions.
fn mentioned_sources(text: &str) -> BTreeSet<String> {
    let b = text.as_bytes();
    let mut out = BTreeSet::new();
    for i in 0..b.len() {
        let start = i == 0 || !b[i - 1].is_ascii_alphanumeric();
        if start && b[i] == b'S' {
            let digits = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
            let end = i + 1 + digits;
            if digits >= 2 && (end == b.len() || !b[end].is_ascii_alphanumeric()) {
                out.insert(text[i..end].to_string());
            }
        }
    }
    out
}

/// Why a reply was not admitted under its formation (one line, sent back
/// for the repair).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Inadmissible {
    /// The profile's checks; also an event reply's JSON, and capacity under
    /// every formation (its message says "profile" for notes too).
    #[error(transparent)]
    Profile(#[from] Rejection),
    #[error("the notes are empty")]
    EmptyNotes,
    #[error("the notes cite {0}, which has not been seen")]
    NotesUnseen(String),
    #[error("does not match the events schema: {0}")]
    EventsSchema(String),
    #[error(transparent)]
    Batch(#[from] BatchError),
}

impl Inadmissible {
    /// The rejection whose message `text` is, if it is one.
    pub fn parse(text: &str) -> Option<Inadmissible> {
        if text == "the notes are empty" {
            return Some(Inadmissible::EmptyNotes);
        }
        if let Some(s) = framed(text, "the notes cite ", ", which has not been seen") {
            return Some(Inadmissible::NotesUnseen(s.to_string()));
        }
        if let Some(e) = text.strip_prefix("does not match the events schema: ") {
            return Some(Inadmissible::EventsSchema(e.to_string()));
        }
        Rejection::parse(text)
            .map(Inadmissible::Profile)
            .or_else(|| BatchError::parse(text).map(Inadmissible::Batch))
    }
}

/// Why a writer attempt was not accepted.
///
/// Files hold it as its message, the spelling every version has written,
/// and it is read back by that message: text that is no rejection this
/// version writes (a backend's message, or one of another version) reads
/// as [`Failure::Backend`], whole, so every line writes back the bytes it
/// was read from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(into = "String", from = "String")]
pub enum Failure {
    /// The reply was not admitted; one repair may follow.
    #[error(transparent)]
    Inadmissible(#[from] Inadmissible),
    /// The model could not be asked (the backend's message).
    #[error("{0}")]
    Backend(String),
}

impl From<String> for Failure {
    fn from(text: String) -> Failure {
        match Inadmissible::parse(&text) {
            Some(e) if e.to_string() == text => Failure::Inadmissible(e),
            _ => Failure::Backend(text),
        }
    }
}

impl From<Failure> for String {
    fn from(f: Failure) -> String {
        f.to_string()
    }
}

/// Admits a reply under a formation, given the memory it revises.
pub fn admit_reply(
    formation: Formation,
    reply: &str,
    current: &Memory,
    visible: &BTreeSet<String>,
    capacity: usize,
) -> Result<Memory, Inadmissible> {
    let within = |tokens: usize| {
        if tokens > capacity {
            return Err(Rejection::Capacity { tokens, capacity });
        }
        Ok(())
    };
    match formation {
        Formation::Typed => Ok(Memory::Profile(admit(reply, visible, capacity)?)),
        Formation::FreeText => {
            let text = reply.trim();
            if text.is_empty() {
                return Err(Inadmissible::EmptyNotes);
            }
            if let Some(s) = mentioned_sources(text)
                .into_iter()
                .find(|s| !visible.contains(s))
            {
                return Err(Inadmissible::NotesUnseen(s));
            }
            within(reference_tokens(text))?;
            Ok(Memory::Text(text.to_string()))
        }
        Formation::Events => {
            let value = first_object(reply)?;
            let batch: Batch = serde_json::from_value(value)
                .map_err(|e| Inadmissible::EventsSchema(e.to_string()))?;
            let state = current.profile().cloned().unwrap_or_else(Profile::empty);
            let next = reduce(&state, &batch, visible)?;
            within(reference_tokens(&canonical(&next)))?;
            Ok(Memory::Profile(next))
        }
    }
}

/// The writer's instructions and what its updates ask for, by formation.
pub fn instructions(case: &Case, pool: &DomainFile, s: &WriterSettings) -> (String, &'static str) {
    match s.formation {
        Formation::Typed => (
            prompts::writer_system(case, pool, s.capacity),
            prompts::ASK_PROFILE,
        ),
        Formation::FreeText => (
            prompts::writer_system_text(case, pool, s.capacity),
            prompts::ASK_TEXT,
        ),
        Formation::Events => (
            prompts::writer_system_events(case, pool, MAX_EVENTS, s.capacity),
            prompts::ASK_EVENTS,
        ),
    }
}

/// Runs a model writer over blocks `0..=last` of a case from `start`.
pub fn write_chain(
    case: &Case,
    pool: &DomainFile,
    settings: WriterSettings,
    last: usize,
    ask: Ask,
) -> (Vec<Formed>, Vec<Attempt>) {
    let (system, ask_for) = instructions(case, pool, &settings);
    let mut current = empty(settings.formation);
    let mut formed = Vec::new();
    let mut attempts = Vec::new();
    for b in case.blocks.iter().take(last + 1) {
        let (next, accepted, mut tried) = update(
            case,
            &settings,
            (&system, ask_for),
            &current,
            &prompts::block(b),
            &case.visible_sources(b.index),
            ask,
        );
        for a in &mut tried {
            a.block = b.index;
        }
        attempts.extend(tried);
        current = next;
        formed.push(Formed {
            case: case.id.clone(),
            candidate: 0,
            block: b.index,
            accepted,
            memory: current.clone(),
        });
    }
    (formed, attempts)
}

/// One update of a memory with a block's text (a history block, or a
/// closed loop's feedback): the memory in force after it, whether the
/// update was admitted, and its attempts (block 0; callers set it).
pub fn update(
    case: &Case,
    settings: &WriterSettings,
    (system, ask_for): (&str, &str),
    current: &Memory,
    block_text: &str,
    visible: &BTreeSet<String>,
    ask: Ask,
) -> (Memory, bool, Vec<Attempt>) {
    let mut messages = vec![
        Message::new(Role::System, system),
        Message::new(
            Role::User,
            prompts::writer_update(&current.text(), block_text, ask_for),
        ),
    ];
    let mut attempts = Vec::new();
    for attempt in 1..=2 {
        let mut req = ChatRequest {
            thinking: settings.thinking,
            ..ChatRequest::greedy(messages.clone(), settings.max_tokens)
        };
        if let Some((temperature, seed)) = settings.sampling {
            req.temperature = temperature;
            req.seed = seed.wrapping_add(attempt as u64);
        }
        let (reply, usage, verdict) = match ask(req) {
            Ok(r) => {
                let verdict = admit_reply(
                    settings.formation,
                    &r.content,
                    current,
                    visible,
                    settings.capacity,
                )
                .map_err(Failure::from);
                (r.content, r.usage, verdict)
            }
            Err(e) => (
                String::new(),
                Usage::default(),
                Err(Failure::Backend(crate::one_line(&e))),
            ),
        };
        attempts.push(Attempt {
            case: case.id.clone(),
            candidate: 0,
            block: 0,
            attempt,
            accepted: verdict.is_ok(),
            error: verdict.as_ref().err().cloned(),
            reply: reply.clone(),
            usage,
        });
        match verdict {
            Ok(m) => return (m, true, attempts),
            Err(Failure::Backend(_)) => break,
            Err(Failure::Inadmissible(error)) => {
                messages.push(Message::new(Role::Assistant, reply));
                messages.push(Message::new(
                    Role::User,
                    prompts::writer_repair(&error.to_string(), ask_for),
                ));
            }
        }
    }
    (current.clone(), false, attempts)
}

/// The oracle writer: the ledger itself, block by block.
pub fn ledger_chain(case: &Case, last: usize) -> Vec<Formed> {
    (0..=last)
        .map(|b| Formed {
            case: case.id.clone(),
            candidate: 0,
            block: b,
            accepted: true,
            memory: Memory::Profile(Ledger::through(case, b).profile().clone()),
        })
        .collect()
}

/// How one candidate of a best-of-k pool is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Selection {
    /// A model reviewer picks one blinded candidate.
    Reviewer,
    /// The least field error against the ledger, lowest index on ties.
    Oracle,
}

/// One selection over a pool at a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Selected {
    pub case: String,
    pub checkpoint: usize,
    pub selection: Selection,
    /// Candidate index chosen.
    pub chosen: usize,
    /// Labels in candidate order (reviewer).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub labels: String,
    /// The reviewer's reply, or the field errors per candidate (oracle).
    pub detail: String,
    /// The reviewer's reply named no single known label: the lowest index
    /// stands in.
    #[serde(default)]
    pub fallback: bool,
    #[serde(default)]
    pub usage: Usage,
}

/// Candidate labels, blinded: a shuffle fixed by the case and checkpoint.
pub fn blind(case: &Case, checkpoint: usize, k: usize) -> Vec<char> {
    let mut labels: Vec<char> = ('A'..='Z').take(k).collect();
    Rng::stream(case.seed, &format!("eal/blind/{}/{checkpoint}", case.id)).shuffle(&mut labels);
    labels
}

/// Selects one candidate memory for a checkpoint.
pub fn select(
    case: &Case,
    pool: &DomainFile,
    checkpoint: usize,
    candidates: &[&Memory],
    selection: Selection,
    ask: Ask,
) -> Selected {
    let mut out = Selected {
        case: case.id.clone(),
        checkpoint,
        selection,
        chosen: 0,
        labels: String::new(),
        detail: String::new(),
        fallback: false,
        usage: Usage::default(),
    };
    match selection {
        Selection::Oracle => {
            let truth = Ledger::through(case, checkpoint).profile().clone();
            let errors: Vec<usize> = candidates
                .iter()
                .map(|m| match m.profile() {
                    Some(p) => Fidelity::of(p, &truth).errors(),
                    None => usize::MAX,
                })
                .collect();
            out.chosen = (0..errors.len()).min_by_key(|i| errors[*i]).unwrap_or(0);
            out.detail = format!("{errors:?}");
        }
        Selection::Reviewer => {
            let labels = blind(case, checkpoint, candidates.len());
            out.labels = labels.iter().collect();
            let mut shown: Vec<(char, String)> = labels
                .iter()
                .zip(candidates)
                .map(|(l, m)| (*l, m.text()))
                .collect();
            shown.sort_by_key(|(l, _)| *l);
            let req = ChatRequest::greedy(
                vec![
                    Message::new(Role::System, prompts::reviewer_system(case, pool)),
                    Message::new(
                        Role::User,
                        prompts::reviewer_user(&prompts::history(case, checkpoint), &shown),
                    ),
                ],
                16,
            );
            let (text, usage) = match ask(req) {
                Ok(r) => (r.content, r.usage),
                Err(e) => {
                    // No answer to read: the lowest index stands in.
                    out.fallback = true;
                    out.detail = crate::one_line(&e);
                    return out;
                }
            };
            out.usage = usage;
            let named: Vec<usize> = labels
                .iter()
                .enumerate()
                .filter(|(_, l)| {
                    text.split(|c: char| !c.is_ascii_alphanumeric())
                        .any(|w| w.len() == 1 && w.starts_with(**l))
                })
                .map(|(i, _)| i)
                .collect();
            match named[..] {
                [i] => out.chosen = i,
                _ => out.fallback = true,
            }
            out.detail = text;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eal::generator::generate;
    use crate::eal::EalDomain;

    #[test]
    fn free_text_and_events_are_admitted_structurally() {
        let case = &generate(EalDomain::Procurement, 6, 1, &[])[0];
        let visible = case.visible_sources(0);
        let none = Memory::Text(String::new());
        let notes = "PA-1 laptops up to $5,000, active, from [S01] and S02.";
        assert_eq!(
            admit_reply(Formation::FreeText, notes, &none, &visible, 100),
            Ok(Memory::Text(notes.into()))
        );
        assert_eq!(
            admit_reply(Formation::FreeText, "see S09", &none, &visible, 100),
            Err(Inadmissible::NotesUnseen("S09".into()))
        );
        assert!(matches!(
            admit_reply(Formation::FreeText, notes, &none, &visible, 5),
            Err(Inadmissible::Profile(Rejection::Capacity {
                capacity: 5,
                ..
            }))
        ));
        assert_eq!(
            admit_reply(Formation::FreeText, "  ", &none, &visible, 100),
            Err(Inadmissible::EmptyNotes)
        );
        assert_eq!(
            mentioned_sources("S01, [S02] S3 XS04 S05x S123"),
            ["S01", "S02", "S123"]
                .iter()
                .map(|s| s.to_string())
                .collect()
        );

        let batch = serde_json::to_string(&super::super::events::ledger_batch(case, 0)).unwrap();
        let empty = Memory::Profile(Profile::empty());
        let admitted = admit_reply(Formation::Events, &batch, &empty, &visible, 10_000);
        assert_eq!(
            admitted,
            Ok(Memory::Profile(Ledger::through(case, 0).profile().clone()))
        );
        let err = admit_reply(
            Formation::Events,
            r#"{"events": [{"op": "burn"}]}"#,
            &empty,
            &visible,
            10_000,
        );
        assert!(matches!(err, Err(Inadmissible::EventsSchema(_))), "{err:?}");
    }

    /// Every failure reads back from the message earlier versions wrote,
    /// as its own variant, and writes back the same bytes; text that is
    /// no rejection is a backend's message, kept whole.
    #[test]
    fn failures_read_back_from_their_messages() {
        use BatchError as B;
        use Inadmissible as I;
        let s = |s: &str| s.to_string();
        let rejected = |r: Rejection| Failure::Inadmissible(I::Profile(r));
        let batch = |b: BatchError| Failure::Inadmissible(I::Batch(b));
        let known = [
            ("no JSON object in the reply", rejected(Rejection::NoJson)),
            (
                "not valid JSON: EOF while parsing an object at line 1 column 10",
                rejected(Rejection::Json(s(
                    "EOF while parsing an object at line 1 column 10",
                ))),
            ),
            (
                r#"profile_id must be "authorization-profile", got "profile-2""#,
                rejected(Rejection::Identity(s(r#""profile-2""#))),
            ),
            (
                r#"profile_id must be "authorization-profile", got nothing"#,
                rejected(Rejection::Identity(s("nothing"))),
            ),
            (
                r#"does not match the profile schema: record PA-1: expires "May" is not YYYY-MM-DD"#,
                rejected(Rejection::Schema(s(
                    r#"record PA-1: expires "May" is not YYYY-MM-DD"#,
                ))),
            ),
            (
                "record PA-1 cites no source",
                rejected(Rejection::Uncited { record: s("PA-1") }),
            ),
            (
                "record PA-1 cites S09, which has not been seen",
                rejected(Rejection::Unseen {
                    record: s("PA-1"),
                    source_id: s("S09"),
                }),
            ),
            (
                "record id PA-1 appears twice",
                rejected(Rejection::Duplicate(s("PA-1"))),
            ),
            (
                "the profile uses 300 reference tokens; capacity is 200",
                rejected(Rejection::Capacity {
                    tokens: 300,
                    capacity: 200,
                }),
            ),
            ("the notes are empty", Failure::Inadmissible(I::EmptyNotes)),
            (
                "the notes cite S09, which has not been seen",
                Failure::Inadmissible(I::NotesUnseen(s("S09"))),
            ),
            (
                "does not match the events schema: unknown variant `burn`",
                Failure::Inadmissible(I::EventsSchema(s("unknown variant `burn`"))),
            ),
            (
                "33 events; at most 32 a block",
                batch(B::TooMany { events: 33 }),
            ),
            ("event 2 cites no source", batch(B::Uncited { event: 2 })),
            (
                "event 2 cites S99, which has not been seen",
                batch(B::Unseen {
                    event: 2,
                    source_id: s("S99"),
                }),
            ),
            (
                "event 12 names PA-0000, which the state does not hold",
                batch(B::Missing {
                    event: 12,
                    id: s("PA-0000"),
                }),
            ),
            (
                r#"event 2: expires "May 31" is not YYYY-MM-DD"#,
                batch(B::Expires {
                    event: 2,
                    expires: s("May 31"),
                }),
            ),
            (
                "event 3 issues PA-1, which exists",
                batch(B::Exists {
                    event: 3,
                    id: s("PA-1"),
                }),
            ),
        ];
        let unknown = [
            "context overflow: 4147 prompt tokens + 12 max tokens > context 4096",
            "",
            "no JSON object in the reply, twice",
            "the profile uses 0300 reference tokens; capacity is 200",
            "event x cites no source",
            "7 events; at most 8 a block",
        ];
        let backend = unknown.iter().map(|t| (*t, Failure::Backend(s(t))));
        for (text, failure) in known.into_iter().chain(backend) {
            assert_eq!(failure.to_string(), text);
            let json = serde_json::to_string(text).unwrap();
            assert_eq!(serde_json::to_string(&failure).unwrap(), json);
            let read: Failure = serde_json::from_str(&json).unwrap();
            assert_eq!(read, failure, "{text}");
        }
    }

    /// The oracle picks the candidate with the least field error; labels are
    /// a fixed shuffle.
    #[test]
    fn oracle_selection_takes_the_least_error_and_the_lowest_index_on_ties() {
        let case = &generate(EalDomain::Security, 2, 1, &[])[0];
        let truth = Ledger::through(case, 3).profile().clone();
        let mut worse = truth.clone();
        worse.records[0].limit += 5;
        let candidates = [
            Memory::Profile(worse.clone()),
            Memory::Profile(truth.clone()),
            Memory::Profile(truth.clone()),
            Memory::Text("notes".into()),
        ];
        let refs: Vec<&Memory> = candidates.iter().collect();
        let never: Ask = &|_| panic!("the oracle asks no model");
        let s = select(case, case.domain.file(), 3, &refs, Selection::Oracle, never);
        assert_eq!(s.chosen, 1);
        assert_eq!(blind(case, 3, 4), blind(case, 3, 4));
        let mut sorted = blind(case, 3, 4);
        sorted.sort();
        assert_eq!(sorted, ['A', 'B', 'C', 'D']);
    }
}
