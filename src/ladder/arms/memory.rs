//! Retrieval memory as the record (Appendix F): a store of texts with unit
//! vectors, recalled by cosine similarity to the current request. The
//! store calls no model; [`Memory`] embeds and writes it through the
//! episode-arm's [`MemoryParts`].

use serde::{Deserialize, Serialize};

use crate::backend::{Message, Role};
use crate::ladder::episode::Episode;
use crate::ladder::parts::{Exchange, MemoryOp, MemoryParts};
use crate::ladder::prompts as p;
use crate::ladder::state::TaskState;

/// What the memory holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryKind {
    /// Every past exchange, verbatim.
    Exchanges,
    /// Short facts a writer keeps with ADD / UPDATE / DELETE (Mem0-style).
    Facts,
}

/// Where the recall block goes and what of the transcript stays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rendering {
    /// The brief, the recall block and the last two exchanges, instead of
    /// the transcript.
    Replace,
    /// The full transcript, plus the recall block.
    Augment,
}

/// One stored memory.
#[derive(Debug, Clone)]
struct Item {
    id: u32,
    text: String,
    vector: Vec<f32>,
}

/// What one episode-arm spent on its memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryUse {
    /// Writer model calls (Mem0-style memory; 0 for the oracle writer).
    pub writer_calls: u32,
    pub writer_prompt_tokens: u64,
    pub writer_completion_tokens: u64,
    /// Writer replies that did not parse (their exchange wrote nothing).
    pub writer_failures: u32,
    /// Operations dropped for naming an id the memory does not hold.
    pub ops_rejected: u32,
    /// Embedding calls and the tokens they read.
    pub embed_calls: u32,
    pub embed_tokens: u64,
    /// Embedding calls that failed (nothing recalled or stored that turn).
    pub embed_failures: u32,
    /// Memories held at the end of the episode.
    pub items: u32,
}

impl std::ops::AddAssign for MemoryUse {
    fn add_assign(&mut self, o: MemoryUse) {
        let MemoryUse {
            writer_calls,
            writer_prompt_tokens,
            writer_completion_tokens,
            writer_failures,
            ops_rejected,
            embed_calls,
            embed_tokens,
            embed_failures,
            items,
        } = o;
        self.writer_calls += writer_calls;
        self.writer_prompt_tokens += writer_prompt_tokens;
        self.writer_completion_tokens += writer_completion_tokens;
        self.writer_failures += writer_failures;
        self.ops_rejected += ops_rejected;
        self.embed_calls += embed_calls;
        self.embed_tokens += embed_tokens;
        self.embed_failures += embed_failures;
        self.items += items;
    }
}

/// The memory of one episode-arm.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    pub kind: MemoryKind,
    items: Vec<Item>,
    next_id: u32,
    pub used: MemoryUse,
}

impl MemoryStore {
    pub fn new(kind: MemoryKind) -> Self {
        MemoryStore {
            kind,
            items: Vec::new(),
            next_id: 1,
            used: MemoryUse::default(),
        }
    }

    /// The stored texts with their ids, oldest first.
    pub fn facts(&self) -> Vec<(u32, String)> {
        self.items.iter().map(|i| (i.id, i.text.clone())).collect()
    }

    /// The [`p::RECALL_K`] memories most similar to the query (vectors are
    /// unit length, so the dot product is the cosine); ties go to the older.
    pub fn recall(&self, query: &[f32]) -> Vec<&str> {
        let mut scored: Vec<(f32, usize)> = self
            .items
            .iter()
            .enumerate()
            .map(|(i, it)| (dot(&it.vector, query), i))
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        scored
            .iter()
            .take(p::RECALL_K)
            .map(|&(_, i)| self.items[i].text.as_str())
            .collect()
    }

    /// The operations that name ids the memory holds (counting the rest).
    pub fn admissible(&mut self, ops: Vec<MemoryOp>) -> Vec<MemoryOp> {
        let held = |id: u32| self.items.iter().any(|i| i.id == id);
        let (ok, rejected): (Vec<_>, Vec<_>) = ops.into_iter().partition(|op| match op {
            MemoryOp::Add { .. } => true,
            MemoryOp::Update { id, .. } | MemoryOp::Delete { id } => held(*id),
        });
        self.used.ops_rejected += rejected.len() as u32;
        ok
    }

    /// The texts an operation list writes, in order: what needs vectors.
    pub fn texts(ops: &[MemoryOp]) -> Vec<String> {
        ops.iter()
            .filter_map(|op| match op {
                MemoryOp::Add { text } | MemoryOp::Update { text, .. } => Some(text.clone()),
                MemoryOp::Delete { .. } => None,
            })
            .collect()
    }

    /// Applies admissible operations; `vectors` are those of [`Self::texts`].
    pub fn apply(&mut self, ops: Vec<MemoryOp>, vectors: Vec<Vec<f32>>) {
        let mut vectors = vectors.into_iter();
        for op in ops {
            match op {
                MemoryOp::Add { text } => {
                    let Some(vector) = vectors.next() else { return };
                    self.items.push(Item {
                        id: self.next_id,
                        text,
                        vector,
                    });
                    self.next_id += 1;
                }
                MemoryOp::Update { id, text } => {
                    let Some(vector) = vectors.next() else { return };
                    if let Some(it) = self.items.iter_mut().find(|i| i.id == id) {
                        it.text = text;
                        it.vector = vector;
                    }
                }
                MemoryOp::Delete { id } => self.items.retain(|i| i.id != id),
            }
        }
        self.used.items = self.items.len() as u32;
    }
}

/// A memory arm's writes after one turn.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryTurn {
    /// The operations applied (the exchange itself, for the top-k memory).
    pub ops: Vec<MemoryOp>,
    /// Why the writer or the embedder failed on this turn, if they did.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

/// A memory arm's memory: the store and the parts that embed and write it.
pub struct Memory<'p> {
    store: MemoryStore,
    parts: &'p mut MemoryParts,
    /// Why the open turn's recall failed, reported with the turn's writes.
    recall_errors: Vec<String>,
}

impl<'p> Memory<'p> {
    pub fn new(kind: MemoryKind, parts: &'p mut MemoryParts) -> Self {
        Memory {
            store: MemoryStore::new(kind),
            parts,
            recall_errors: Vec::new(),
        }
    }

    /// What the episode-arm spent on its memory so far.
    pub fn used(&self) -> MemoryUse {
        self.store.used
    }

    /// The recall block for a request: the memories nearest its embedding
    /// (none when the embedder fails).
    pub fn recall_block(&mut self, request: &str) -> String {
        let recalled = match self.embed(vec![p::recall_query(request)]) {
            Ok(v) => v.first().map(|q| self.store.recall(q)).unwrap_or_default(),
            Err(e) => {
                self.recall_errors.push(e);
                Vec::new()
            }
        };
        render_recall(&recalled)
    }

    /// Writes a finished exchange: verbatim (top-k) or as the writer's
    /// operations (Mem0-style), then embeds what changed. `user` is the
    /// operator's message as written, `chain` what followed it, `truth` the
    /// realized state after the turn (the oracle writer reads it).
    pub fn remember(
        &mut self,
        episode: &Episode,
        user: &str,
        chain: &[Message],
        truth: &TaskState,
    ) -> MemoryTurn {
        let reply = memory_reply(chain);
        let mut out = MemoryTurn {
            ops: Vec::new(),
            errors: std::mem::take(&mut self.recall_errors),
        };
        let ops = match self.store.kind {
            MemoryKind::Exchanges => vec![MemoryOp::Add {
                text: p::exchange_memory(user, &reply),
            }],
            MemoryKind::Facts => {
                let facts = self.store.facts();
                let x = Exchange {
                    facts: &facts,
                    user,
                    reply: &reply,
                    truth,
                    episode,
                };
                let (ops, cost) = self.parts.writer.write(&x);
                let used = &mut self.store.used;
                used.writer_calls += cost.calls;
                used.writer_prompt_tokens += cost.prompt_tokens;
                used.writer_completion_tokens += cost.completion_tokens;
                if let Some(e) = cost.error {
                    used.writer_failures += 1;
                    out.errors.push(format!("writer: {e}"));
                }
                self.store.admissible(ops)
            }
        };
        let texts = MemoryStore::texts(&ops);
        let vectors = if texts.is_empty() {
            Ok(Vec::new())
        } else {
            self.embed(texts)
        };
        match vectors {
            Ok(v) => {
                out.ops = ops.clone();
                self.store.apply(ops, v);
            }
            Err(e) => out.errors.push(e),
        }
        out
    }

    /// Embeds texts, counting the call.
    fn embed(&mut self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, String> {
        let r = self.parts.embedder.embed(&texts);
        let used = &mut self.store.used;
        used.embed_calls += 1;
        match r {
            Ok(e) if e.vectors.len() == texts.len() => {
                used.embed_tokens += e.prompt_tokens as u64;
                Ok(e.vectors)
            }
            Ok(e) => {
                used.embed_failures += 1;
                Err(format!(
                    "embedder: {} vectors for {} texts",
                    e.vectors.len(),
                    texts.len()
                ))
            }
            Err(e) => {
                used.embed_failures += 1;
                Err(format!("embedder: {e}"))
            }
        }
    }
}

/// The agent's side of a turn as a memory stores it: the reply the user
/// saw; in the native harness, every round's text with its calls and their
/// results, so the memory holds what was executed.
fn memory_reply(chain: &[Message]) -> String {
    if chain.iter().all(|m| m.tool_calls.is_empty()) {
        return chain
            .iter()
            .rfind(|m| m.role == Role::Assistant)
            .map(|m| m.content.clone())
            .unwrap_or_default();
    }
    let mut lines = Vec::new();
    for (i, m) in chain.iter().enumerate() {
        if m.role != Role::Assistant {
            continue;
        }
        if !m.content.trim().is_empty() {
            lines.push(m.content.clone());
        }
        // The results follow their calls (ids repeat across replies).
        let results = &chain[i + 1..];
        for c in &m.tool_calls {
            let result = results
                .iter()
                .take_while(|r| r.role == Role::Tool)
                .find(|r| r.tool_call_id == c.id)
                .map_or("", |r| r.content.as_str());
            lines.push(p::memory_call(&c.name, &c.arguments, result));
        }
    }
    lines.join("\n")
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The recall block shown to the agent.
pub fn render_recall(recalled: &[&str]) -> String {
    let mut lines = vec![p::RECALL_HEADER.to_string()];
    if recalled.is_empty() {
        lines.push(p::RECALL_EMPTY.to_string());
    }
    for (i, r) in recalled.iter().enumerate() {
        lines.push(format!("({}) {r}", i + 1));
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(v: &[f32]) -> Vec<f32> {
        let mut v = v.to_vec();
        crate::backend::l2_normalize(&mut v);
        v
    }

    #[test]
    fn recall_ranks_by_cosine_and_ops_keep_ids() {
        let mut m = MemoryStore::new(MemoryKind::Facts);
        let ops = vec![
            MemoryOp::Add { text: "a".into() },
            MemoryOp::Add { text: "b".into() },
        ];
        m.apply(ops, vec![unit(&[1.0, 0.0]), unit(&[0.0, 1.0])]);
        assert_eq!(m.recall(&unit(&[0.1, 1.0])), vec!["b", "a"]);
        let ops = m.admissible(vec![
            MemoryOp::Update {
                id: 1,
                text: "a2".into(),
            },
            MemoryOp::Delete { id: 9 },
            MemoryOp::Delete { id: 2 },
        ]);
        assert_eq!(m.used.ops_rejected, 1);
        assert_eq!(MemoryStore::texts(&ops), vec!["a2".to_string()]);
        m.apply(ops, vec![unit(&[0.0, 1.0])]);
        assert_eq!(m.facts(), vec![(1, "a2".to_string())]);
        assert_eq!(m.used.items, 1);
        // Ties go to the older memory.
        m.apply(
            vec![MemoryOp::Add { text: "c".into() }],
            vec![unit(&[0.0, 1.0])],
        );
        assert_eq!(m.recall(&unit(&[0.0, 1.0])), vec!["a2", "c"]);
        assert_eq!(
            render_recall(&["x"]),
            format!("{}\n(1) x", p::RECALL_HEADER)
        );
    }
}
