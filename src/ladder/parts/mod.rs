//! The parts behind a cell: the agent under test, the matcher that
//! resolves a request to a step, and the compiler that turns the brief and
//! the revision into the gate module's plan.
//!
//! Each is a trait with two kinds of implementation: [`scripted`] (the
//! paper's validation agents and the oracle matcher and compiler, which
//! read the generator) and [`model`] (the B.1 prompts sent to a model). A
//! model-backed agent reads only the prompt; the scripted agents also read
//! the [`Oracle`] — the episode, the turn and the realized state — because
//! they are the paper's validation suites, not agents under test.

pub mod model;
pub mod scripted;

use serde::{Deserialize, Serialize};

use super::arms::gate::{CompiledGraph, CompiledRevision};
use super::episode::{Episode, StepId, Turn};
use super::score::Label;
use super::state::TaskState;
use crate::backend::{Embeddings, Message, Tool, ToolCall, Usage};

/// What scripted agents may read besides the prompt.
#[derive(Debug, Clone, Copy)]
pub struct Oracle<'a> {
    pub episode: &'a Episode,
    pub turn: &'a Turn,
    /// The realized ground-truth state at the start of the turn (α set).
    pub truth: &'a TaskState,
    /// The ground-truth label of the turn.
    pub label: &'a Label,
    /// Whether this call follows another of the same turn: the same-turn
    /// re-prompt after a rejection, or tool results.
    pub reprompt: bool,
}

/// The agent's reply.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    /// Visible text.
    pub text: String,
    /// Tool calls (native tool harness).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    pub usage: Usage,
    /// An error the call ended in (scored as an empty reply).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Whether `error` is the conversation outgrowing the model's context
    /// even at the smallest reply budget: the arm's own transcript, scored
    /// as an empty reply like any silence, where any other error is a
    /// failed call that measures the backend.
    #[serde(skip)]
    pub outgrown: bool,
}

impl Reply {
    /// Whether the call failed (an error other than an outgrown context).
    pub fn failed(&self) -> bool {
        self.error.is_some() && !self.outgrown
    }
}

/// An agent under test or a scripted validation agent.
pub trait Agent {
    /// Identity for the run manifest.
    fn name(&self) -> String;
    /// Replies to the conversation (system prompt first); `tools` are the
    /// functions it may call (none outside the native tool harness).
    fn reply(&mut self, messages: &[Message], tools: &[Tool], oracle: &Oracle) -> Reply;
    /// Why the model behind the agent cannot run, once a call showed it
    /// (the cell stops rather than score empty replies).
    fn broken(&self) -> Option<&str> {
        None
    }
}

/// What a compile call produced, with its cost.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CallCost {
    /// Model calls made (0 for oracles).
    pub calls: u32,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Error text when the reply could not be used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Compiles the brief and the revision message into module state.
pub trait Compiler {
    /// Compiles the plan from the brief.
    fn compile_graph(&mut self, ep: &Episode) -> (CompiledGraph, CallCost);
    /// Compiles the revision message.
    fn compile_revision(&mut self, ep: &Episode) -> (CompiledRevision, CallCost);
}

/// The matcher's resolution of one user message.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Match {
    /// The step the message asks for or about.
    pub step: Option<StepId>,
    /// Whether the user explicitly authorizes re-execution.
    pub explicit_redo: bool,
    /// Cost of the call(s).
    #[serde(default)]
    pub cost: CallCost,
}

/// Resolves a user message to a step (paper §3.2, B.1).
pub trait Matcher {
    /// Resolves one turn's user message.
    fn resolve(&mut self, ep: &Episode, turn: &Turn) -> Match;
}

/// Embeds texts for the retrieval-memory arms (Appendix F): one unit vector
/// per text.
pub trait Embedder {
    fn embed(&mut self, texts: &[String]) -> Result<Embeddings, String>;
}

/// One memory operation of a Mem0-style writer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "UPPERCASE")]
pub enum MemoryOp {
    Add { text: String },
    Update { id: u32, text: String },
    Delete { id: u32 },
}

/// What a memory writer sees of one finished turn.
#[derive(Debug, Clone, Copy)]
pub struct Exchange<'a> {
    /// The stored facts, `(id, text)`.
    pub facts: &'a [(u32, String)],
    /// The operator's message as written (without arm additions).
    pub user: &'a str,
    /// The agent's visible reply.
    pub reply: &'a str,
    /// The realized state after the turn (read by the oracle writer only).
    pub truth: &'a TaskState,
    pub episode: &'a Episode,
}

/// Turns each exchange into memory operations (the Mem0-style memory).
pub trait MemoryWriter {
    fn write(&mut self, x: &Exchange) -> (Vec<MemoryOp>, CallCost);
}

/// The memory parts of an episode-arm: what embeds and what writes facts.
pub struct MemoryParts {
    pub embedder: Box<dyn Embedder + Send>,
    pub writer: Box<dyn MemoryWriter + Send>,
}

impl MemoryParts {
    /// The model-free memory parts: the lexical embedder and the oracle
    /// writer (the scripted suites, and arms without memory).
    pub fn scripted() -> Self {
        MemoryParts {
            embedder: Box::new(scripted::Lexical),
            writer: Box::new(scripted::OracleMemoryWriter),
        }
    }
}
