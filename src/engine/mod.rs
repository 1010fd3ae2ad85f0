//! The in-process inference engine: weights, tokenizer, chat template, the
//! Qwen forward pass, sessions with prefix reuse and the batching scheduler.
//!
//! Sequences, scheduler and model are kept apart: `model` knows nothing of
//! sessions, `Engine` knows nothing of matrix layouts.

pub mod model;
pub mod sampling;
pub mod template;
pub mod weights;

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Instant;

use sha2::{Digest, Sha256};

use crate::backend::{
    split_thinking, Backend, BackendError, ChatReply, ChatRequest, Finish, Finished, ModelIdentity,
    RequestId, SessionId, Usage,
};
use model::{BatchItem, KvCache, Model};
use sampling::Rng;
use template::ChatTemplate;

/// Where the default model lives, relative to the repository root.
pub const DEFAULT_MODEL: &str = "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Compute threads.
    pub threads: usize,
    /// Bytes of KV cache that in-flight requests (their prompt plus
    /// `max_tokens`) and idle sessions' caches may hold together; idle caches
    /// are dropped, least recently used first, to admit a request.
    pub kv_budget_bytes: usize,
    /// Caps the model's context length (saves RoPE table memory), if set.
    pub max_context: Option<usize>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            threads: 2,
            kv_budget_bytes: 8 << 30,
            max_context: None,
        }
    }
}

/// A conversation's cached tokens and their KV entries.
#[derive(Default)]
struct Session {
    tokens: Vec<u32>,
    cache: KvCache,
    busy: bool,
    /// When the session last started or finished a request (engine clock).
    last_used: u64,
}

/// A submitted request waiting for admission.
struct Pending {
    id: RequestId,
    session: SessionId,
    req: ChatRequest,
    prompt: Vec<u32>,
}

/// A request in the running batch; it owns its session's cache meanwhile.
struct Running {
    id: RequestId,
    session: SessionId,
    req: ChatRequest,
    prompt: Vec<u32>,
    cached: usize,
    /// Tokens to feed on the next forward step.
    feed: Vec<u32>,
    tokens: Vec<u32>,
    cache: KvCache,
    generated: Vec<u32>,
    rng: Rng,
    prefill_secs: f64,
    decode_secs: f64,
}

/// The in-process engine; implements [`Backend`].
pub struct Engine {
    model: Model,
    tokenizer: tokenizers::Tokenizer,
    template: ChatTemplate,
    template_source: String,
    stop_ids: Vec<u32>,
    pool: rayon::ThreadPool,
    opts: EngineOptions,
    name: String,
    source: String,
    format: String,
    files: Vec<PathBuf>,
    sha: OnceLock<String>,
    sessions: HashMap<SessionId, Session>,
    queue: VecDeque<Pending>,
    running: Vec<Running>,
    next_id: u64,
    /// Counts admissions and finishes; orders sessions for eviction.
    clock: u64,
}

impl Engine {
    /// Loads a model from a GGUF path, a safetensors directory or a hub id.
    pub fn load(spec: &str, opts: EngineOptions) -> Result<Self, BackendError> {
        let mut loaded = weights::load(spec)?;
        if let Some(max) = opts.max_context {
            if max < loaded.model.cfg.context {
                loaded.model.cfg.context = max;
                loaded.model.rope = statebench_kernels::RopeTable::new(
                    loaded.model.cfg.head_dim,
                    loaded.model.cfg.rope_theta,
                    max,
                );
            }
        }
        let template = ChatTemplate::new(&loaded.chat_template)?;
        let stop_ids = ["<|im_end|>", "<|endoftext|>"]
            .iter()
            .filter_map(|t| loaded.tokenizer.token_to_id(t))
            .collect();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(opts.threads.max(1))
            .build()
            .map_err(|e| BackendError::BadRequest(format!("thread pool: {e}")))?;
        Ok(Self {
            model: loaded.model,
            tokenizer: loaded.tokenizer,
            template,
            template_source: loaded.chat_template,
            stop_ids,
            pool,
            opts,
            name: loaded.name,
            source: spec.to_string(),
            format: loaded.format,
            files: loaded.files,
            sha: OnceLock::new(),
            sessions: HashMap::new(),
            queue: VecDeque::new(),
            running: Vec::new(),
            next_id: 0,
            clock: 0,
        })
    }

    /// The model (for tests and benchmarks that drive the forward pass directly).
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Runs `f` on the engine's compute threads.
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }

    /// Runs one ragged forward batch on the engine's threads.
    pub fn forward(&self, items: &mut [BatchItem<'_>]) -> Vec<Vec<f32>> {
        self.pool.install(|| self.model.forward(items))
    }

    /// Renders messages with the model's chat template.
    pub fn render(
        &self,
        messages: &[crate::backend::Message],
        thinking: bool,
    ) -> Result<String, BackendError> {
        self.template.render(messages, thinking)
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &tokenizers::Tokenizer {
        &self.tokenizer
    }

    /// The model's chat template source.
    pub fn template_source(&self) -> &str {
        &self.template_source
    }

    /// The model's chat template.
    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    /// Tokenizes text; special tokens written in the text are recognised.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, BackendError> {
        self.tokenizer
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| BackendError::Tokenizer(e.to_string()))
    }

    /// Detokenizes, dropping special tokens.
    pub fn decode(&self, ids: &[u32]) -> Result<String, BackendError> {
        self.tokenizer
            .decode(ids, true)
            .map_err(|e| BackendError::Tokenizer(e.to_string()))
    }

    /// Token ids that end a turn.
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// The model's context length.
    pub fn context(&self) -> usize {
        self.model.cfg.context
    }

    /// Compute threads.
    pub fn threads(&self) -> usize {
        self.opts.threads
    }

    /// Storage format of the weights.
    pub fn format(&self) -> &str {
        &self.format
    }

    fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Bytes of KV cache held now: running requests' reservations plus every
    /// session's cached entries.
    pub fn kv_bytes_in_use(&self) -> usize {
        self.reserved_bytes() + self.idle_bytes_except(None)
    }

    fn idle_bytes_except(&self, keep: Option<SessionId>) -> usize {
        let per = self.model.cfg.kv_bytes_per_token();
        self.sessions
            .iter()
            .filter(|(id, _)| Some(**id) != keep)
            .map(|(_, s)| s.cache.len() * per)
            .sum()
    }

    /// Drops the cache of the least recently used session other than `keep`
    /// (it re-prefills on its next turn, with the same result); returns the
    /// bytes freed, or None when no such session holds a cache.
    fn evict_lru_except(&mut self, keep: SessionId) -> Option<usize> {
        let per = self.model.cfg.kv_bytes_per_token();
        let victim = self
            .sessions
            .iter()
            .filter(|(id, s)| **id != keep && !s.cache.is_empty())
            .min_by_key(|(id, s)| (s.last_used, **id))
            .map(|(id, _)| *id);
        let s = self.sessions.get_mut(&victim?)?;
        let freed = s.cache.len() * per;
        s.cache = KvCache::default();
        s.tokens.clear();
        Some(freed)
    }

    fn reserved_bytes(&self) -> usize {
        let per = self.model.cfg.kv_bytes_per_token();
        self.running
            .iter()
            .map(|r| (r.prompt.len() + r.req.max_tokens) * per)
            .sum()
    }

    /// Moves queued requests into the running batch while the KV budget allows.
    fn admit(&mut self) {
        let per = self.model.cfg.kv_bytes_per_token();
        while let Some(p) = self.queue.front() {
            let (need, keep) = ((p.prompt.len() + p.req.max_tokens) * per, p.session);
            let budget = self.opts.kv_budget_bytes;
            if !self.running.is_empty() && self.reserved_bytes() + need > budget {
                break;
            }
            // Idle caches make room for a request that fits beside the running ones.
            let mut in_use = self.reserved_bytes() + self.idle_bytes_except(Some(keep));
            while in_use + need > budget {
                match self.evict_lru_except(keep) {
                    Some(freed) => in_use -= freed,
                    None => break,
                }
            }
            let Some(p) = self.queue.pop_front() else {
                break;
            };
            self.clock += 1;
            let clock = self.clock;
            let session = self.sessions.entry(p.session).or_default();
            session.last_used = clock;
            let mut tokens = std::mem::take(&mut session.tokens);
            let mut cache = std::mem::take(&mut session.cache);
            // Reuse the longest common prefix, but always recompute the last
            // prompt token: its logits choose the first reply token.
            let lcp = tokens
                .iter()
                .zip(&p.prompt)
                .take_while(|(a, b)| a == b)
                .count()
                .min(p.prompt.len() - 1)
                .min(cache.len());
            cache.truncate(lcp);
            tokens.truncate(lcp);
            let rng = Rng::new(p.req.seed);
            self.running.push(Running {
                id: p.id,
                session: p.session,
                feed: p.prompt[lcp..].to_vec(),
                prompt: p.prompt,
                cached: lcp,
                tokens,
                cache,
                generated: Vec::new(),
                rng,
                prefill_secs: 0.0,
                decode_secs: 0.0,
                req: p.req,
            });
        }
    }

    /// Checks whether a running request is done; returns its finish reason.
    fn finished(&self, r: &Running) -> Option<Finish> {
        let last = *r.generated.last()?;
        if self.stop_ids.contains(&last) {
            return Some(Finish::Stop);
        }
        if !r.req.stop.is_empty() {
            if let Ok(text) = self.tokenizer.decode(&r.generated, true) {
                if r.req
                    .stop
                    .iter()
                    .any(|s| !s.is_empty() && text.contains(s.as_str()))
                {
                    return Some(Finish::Stop);
                }
            }
        }
        if r.generated.len() >= r.req.max_tokens
            || r.prompt.len() + r.generated.len() >= self.model.cfg.context
        {
            return Some(Finish::Length);
        }
        None
    }

    fn reply(&self, r: &Running, finish: Finish) -> Result<ChatReply, BackendError> {
        let body: &[u32] = match r.generated.last() {
            Some(t) if self.stop_ids.contains(t) => &r.generated[..r.generated.len() - 1],
            _ => &r.generated,
        };
        let mut text = self.decode(body)?;
        if let Some(cut) = r
            .req
            .stop
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| text.find(s.as_str()))
            .min()
        {
            text.truncate(cut);
        }
        let (reasoning, content) = split_thinking(&text);
        Ok(ChatReply {
            content,
            reasoning,
            finish,
            usage: Usage {
                prompt_tokens: r.prompt.len(),
                cached_tokens: r.cached,
                completion_tokens: r.generated.len(),
                prefill_secs: r.prefill_secs,
                decode_secs: r.decode_secs,
            },
            tokens: r.generated.clone(),
        })
    }
}

impl Backend for Engine {
    fn open_session(&mut self) -> SessionId {
        let id = SessionId(self.fresh_id());
        self.sessions.insert(id, Session::default());
        id
    }

    fn close_session(&mut self, s: SessionId) {
        self.sessions.remove(&s);
        self.queue.retain(|p| p.session != s);
        self.running.retain(|r| r.session != s);
    }

    fn submit(&mut self, s: SessionId, req: ChatRequest) -> Result<RequestId, BackendError> {
        let session = self
            .sessions
            .get(&s)
            .ok_or(BackendError::UnknownSession(s))?;
        if session.busy {
            return Err(BackendError::SessionBusy(s));
        }
        req.validate()?;
        let text = self.template.render(&req.messages, req.thinking)?;
        let prompt = self.encode(&text)?;
        if prompt.is_empty() {
            return Err(BackendError::BadRequest(
                "the prompt renders to no tokens".into(),
            ));
        }
        if let Some(&t) = prompt
            .iter()
            .find(|&&t| t as usize >= self.model.embed.rows())
        {
            return Err(BackendError::BadRequest(format!(
                "token id {t} is outside the model's {}-row embedding (tokenizer and weights do not match)",
                self.model.embed.rows()
            )));
        }
        let context = self.model.cfg.context;
        if prompt.len() + req.max_tokens > context {
            return Err(BackendError::ContextOverflow {
                prompt_tokens: prompt.len(),
                max_tokens: req.max_tokens,
                context,
            });
        }
        let need = (prompt.len() + req.max_tokens) * self.model.cfg.kv_bytes_per_token();
        if need > self.opts.kv_budget_bytes {
            return Err(BackendError::ExceedsKvBudget {
                needed_bytes: need,
                budget_bytes: self.opts.kv_budget_bytes,
            });
        }
        let id = RequestId(self.fresh_id());
        if let Some(session) = self.sessions.get_mut(&s) {
            session.busy = true;
        }
        self.queue.push_back(Pending {
            id,
            session: s,
            req,
            prompt,
        });
        Ok(id)
    }

    fn step(&mut self) -> Result<Finished, BackendError> {
        self.admit();
        if self.running.is_empty() {
            return Ok(Vec::new());
        }
        let started = Instant::now();
        let logits = {
            let mut items: Vec<BatchItem<'_>> = self
                .running
                .iter_mut()
                .map(|r| BatchItem {
                    tokens: &r.feed,
                    cache: &mut r.cache,
                })
                .collect();
            self.pool.install(|| self.model.forward(&mut items))
        };
        let secs = started.elapsed().as_secs_f64();
        for (r, l) in self.running.iter_mut().zip(&logits) {
            if r.generated.is_empty() {
                r.prefill_secs += secs;
            } else {
                r.decode_secs += secs;
            }
            r.tokens.extend_from_slice(&r.feed);
            let t = sampling::sample(l, r.req.temperature, &mut r.rng);
            r.generated.push(t);
            r.feed.clear();
            r.feed.push(t);
        }
        let mut done = Vec::new();
        let mut i = 0;
        while i < self.running.len() {
            match self.finished(&self.running[i]) {
                Some(finish) => {
                    let r = self.running.swap_remove(i);
                    let reply = self.reply(&r, finish);
                    self.clock += 1;
                    if let Some(session) = self.sessions.get_mut(&r.session) {
                        session.tokens = r.tokens;
                        session.cache = r.cache;
                        session.busy = false;
                        session.last_used = self.clock;
                    }
                    done.push((r.id, reply));
                }
                None => i += 1,
            }
        }
        done.sort_by_key(|(id, _)| *id);
        Ok(done)
    }

    fn has_pending(&self) -> bool {
        !self.queue.is_empty() || !self.running.is_empty()
    }

    fn model_id(&self) -> ModelIdentity {
        let sha = self.sha.get_or_init(|| hash_files(&self.files)).clone();
        ModelIdentity {
            name: self.name.clone(),
            source: self.source.clone(),
            weights_sha256: sha,
            architecture: self.model.cfg.arch.as_str().to_string(),
            format: self.format.clone(),
            arithmetic: statebench_kernels::ARITHMETIC.to_string(),
        }
    }
}

fn hash_files(files: &[PathBuf]) -> String {
    let mut h = Sha256::new();
    for f in files {
        if let Ok(mut file) = std::fs::File::open(f) {
            let _ = std::io::copy(&mut file, &mut h);
        }
    }
    let digest = h.finalize();
    digest.iter().map(|b| format!("{b:02x}")).collect()
}
