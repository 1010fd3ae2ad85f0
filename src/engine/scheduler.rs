//! The scheduler: sessions, the waiting queue, the running batch, admission
//! by KV budget and eviction of idle caches.
//!
//! Its contract is narrow: [`Scheduler::add_request`] queues a tokenized
//! request, [`Scheduler::schedule`] admits what fits and hands out the next
//! forward step's batch, and [`Scheduler::update`] takes that step's logits,
//! samples each request's next token and returns the requests that finished.
//! It never sees the model, the tokenizer or which device runs; the engine
//! ties the three together.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use super::device::Next;
use super::kv_cache::KvStore;
use super::model::BatchItem;
use super::sampling::{self, Rng};
use crate::backend::{BackendError, ChatRequest, Finish, RequestId, SessionId};

/// Limits the scheduler enforces.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Bytes that in-flight requests (prompt plus `max_tokens`) and idle
    /// sessions' caches may hold together.
    pub kv_budget_bytes: usize,
    /// Bytes one cached position takes.
    pub kv_bytes_per_token: usize,
    /// The model's context length.
    pub context: usize,
    /// Token ids that end a reply.
    pub stop_ids: Vec<u32>,
    /// Prompt tokens a request feeds per step, at most.
    pub prefill_chunk: usize,
    /// The same while another request decodes.
    pub mixed_chunk: usize,
}

/// A conversation's cached tokens and their KV entries.
#[derive(Default)]
struct Session<C> {
    tokens: Vec<u32>,
    cache: C,
    busy: bool,
    /// Scheduler clock when the session last started or finished a request.
    last_used: u64,
}

/// Masks the tokens a request may not choose next and follows the ones it
/// chose (a grammar over the vocabulary); the engine builds one per
/// constrained request.
pub trait TokenFilter: Send + Sync {
    /// Sets the logits of forbidden tokens to minus infinity.
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String>;
    /// Follows the chosen token.
    fn accept(&mut self, token: u32) -> Result<(), String>;
}

/// A chosen token's log-probability and the most likely tokens', most
/// likely first (ties to the lower id).
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// A request waiting for admission.
struct Waiting {
    id: RequestId,
    session: SessionId,
    req: ChatRequest,
    prompt: Vec<u32>,
    filter: Option<Box<dyn TokenFilter>>,
}

/// A request in the running batch; it holds its session's cache meanwhile.
struct Running<C> {
    id: RequestId,
    session: SessionId,
    req: ChatRequest,
    prompt: Vec<u32>,
    cached: usize,
    /// Tokens still to feed: the uncached prompt, then each generated token.
    feed: Vec<u32>,
    /// How many of `feed` the current step takes.
    fed: usize,
    tokens: Vec<u32>,
    cache: C,
    generated: Vec<u32>,
    /// One per generated token, when the request asked.
    scores: Vec<Scored>,
    /// One per prompt token after the first, when the request asked.
    prompt_scores: Vec<Scored>,
    filter: Option<Box<dyn TokenFilter>>,
    /// Why the filter failed, which ends the request.
    failed: Option<String>,
    rng: Rng,
    prefill_secs: f64,
    decode_secs: f64,
}

/// A request's next token from its step's logits: masked by its filter,
/// then chosen as its temperature says; scored under the unmasked logits
/// when it asked for log-probabilities.
fn choose<C>(r: &mut Running<C>, logits: &[f32], stop_ids: &[u32]) -> (u32, Option<Scored>) {
    // One copy of the row, only when something changes it.
    let adjusted = (r.req.sampling.adjusts_logits() || r.filter.is_some()).then(|| {
        let mut l = logits.to_vec();
        if r.req.sampling.adjusts_logits() {
            sampling::adjust(&mut l, &r.req.sampling, &r.prompt, &r.generated, stop_ids);
        }
        l
    });
    let (temperature, cut) = (r.req.temperature, &r.req.sampling);
    let t = match (&mut r.filter, adjusted) {
        (None, adjusted) => {
            let from = adjusted.as_deref().unwrap_or(logits);
            sampling::sample_cut(from, temperature, cut, &mut r.rng)
        }
        (Some(f), adjusted) => {
            let mut masked = adjusted.unwrap_or_else(|| logits.to_vec());
            let t = f
                .mask(&mut masked)
                .map(|()| sampling::sample_cut(&masked, temperature, cut, &mut r.rng))
                .and_then(|t| {
                    // A stop token ends the reply; the grammar allowed it.
                    if !stop_ids.contains(&t) {
                        f.accept(t)?;
                    }
                    Ok(t)
                });
            match t {
                Ok(t) => t,
                Err(e) => {
                    r.failed = Some(e);
                    stop_ids.first().copied().unwrap_or(0)
                }
            }
        }
    };
    let scored = r.req.logprobs.map(|k| sampling::score(logits, t, k));
    (t, scored)
}

/// A request that finished: what the engine needs to write its reply.
#[derive(Debug, Clone)]
pub struct Done {
    pub id: RequestId,
    pub req: ChatRequest,
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV entries came from the session's cache.
    pub cached_tokens: usize,
    /// Generated ids, the stop token included when one ended the reply.
    pub generated: Vec<u32>,
    /// One per generated token, when the request asked for log-probabilities.
    pub scores: Vec<Scored>,
    /// The prompt's tokens and, when the request asked, one score per
    /// prompt token after the first.
    pub prompt: Vec<u32>,
    pub prompt_scores: Vec<Scored>,
    pub finish: Finish,
    pub prefill_secs: f64,
    pub decode_secs: f64,
    /// Why a constrained request could not go on.
    pub failed: Option<String>,
}

/// One forward step's work: every running request's feed and cache, and
/// whether it decodes greedily (so the device may pick its token).
pub struct Batch<'a, C> {
    pub items: Vec<BatchItem<'a, C>>,
    pub greedy: Vec<bool>,
    /// Items that need the logits of every position they feed, not only
    /// the last (their prompt is being scored).
    pub every_row: Vec<bool>,
}

/// Prompt tokens a scored request feeds per step, at most: each position's
/// logits come to the host (`rows × vocab` floats), and the kernels make
/// the chunking invisible.
pub const SCORE_CHUNK: usize = 64;

/// Sessions, queue and running batch of one engine.
pub struct Scheduler<C: KvStore> {
    limits: Limits,
    sessions: HashMap<SessionId, Session<C>>,
    waiting: VecDeque<Waiting>,
    running: Vec<Running<C>>,
    /// Tokens the last update chose, in running order.
    stepped: Vec<(RequestId, u32, Option<Scored>)>,
    next_id: u64,
    /// Counts admissions and finishes; orders sessions for eviction.
    clock: u64,
}

impl<C: KvStore> Scheduler<C> {
    pub fn new(limits: Limits) -> Self {
        Scheduler {
            limits,
            sessions: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            stepped: Vec::new(),
            next_id: 0,
            clock: 0,
        }
    }

    fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    pub fn open_session(&mut self) -> SessionId {
        let id = SessionId(self.fresh_id());
        self.sessions.insert(id, Session::default());
        id
    }

    /// Closes a session and drops its requests, queued or running.
    pub fn close_session(&mut self, s: SessionId) {
        self.sessions.remove(&s);
        self.waiting.retain(|p| p.session != s);
        self.running.retain(|r| r.session != s);
    }

    /// Checks that a session can take a request now.
    pub fn check_session(&self, s: SessionId) -> Result<(), BackendError> {
        let session = self
            .sessions
            .get(&s)
            .ok_or(BackendError::UnknownSession(s))?;
        if session.busy {
            return Err(BackendError::SessionBusy(s));
        }
        Ok(())
    }

    /// Queues a tokenized request; refuses one that can never run.
    pub fn add_request(
        &mut self,
        s: SessionId,
        req: ChatRequest,
        prompt: Vec<u32>,
        filter: Option<Box<dyn TokenFilter>>,
    ) -> Result<RequestId, BackendError> {
        self.check_session(s)?;
        let context = self.limits.context;
        // Checked: a max_tokens near usize::MAX must not wrap past the limits.
        let total = prompt
            .len()
            .checked_add(req.max_tokens)
            .filter(|&t| t <= context)
            .ok_or(BackendError::ContextOverflow {
                prompt_tokens: prompt.len(),
                partial: false,
                max_tokens: req.max_tokens,
                context,
            })?;
        let need = self.bytes(total);
        if need > self.limits.kv_budget_bytes {
            return Err(BackendError::ExceedsKvBudget {
                needed_bytes: need,
                budget_bytes: self.limits.kv_budget_bytes,
            });
        }
        let id = RequestId(self.fresh_id());
        if let Some(session) = self.sessions.get_mut(&s) {
            session.busy = true;
        }
        self.waiting.push_back(Waiting {
            id,
            session: s,
            req,
            prompt,
            filter,
        });
        Ok(id)
    }

    /// Sets [`Limits::mixed_chunk`].
    pub fn set_mixed_chunk(&mut self, n: usize) {
        self.limits.mixed_chunk = n;
    }

    /// The token ids that end a reply, the template's turn end first.
    pub fn stop_ids(&self) -> &[u32] {
        &self.limits.stop_ids
    }

    /// Whether a token id ends a reply.
    pub fn is_stop_id(&self, t: u32) -> bool {
        self.limits.stop_ids.contains(&t)
    }

    pub fn has_pending(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// Bytes of KV cache held now: running requests' reservations plus every
    /// session's cached entries.
    pub fn kv_bytes_in_use(&self) -> usize {
        self.reserved_bytes() + self.idle_bytes_except(None)
    }

    /// Bytes of cache memory `tokens` positions take.
    fn bytes(&self, tokens: usize) -> usize {
        C::footprint(tokens) * self.limits.kv_bytes_per_token
    }

    fn idle_bytes_except(&self, keep: Option<SessionId>) -> usize {
        self.sessions
            .iter()
            .filter(|(id, _)| Some(**id) != keep)
            .map(|(_, s)| self.bytes(s.cache.len()))
            .sum()
    }

    fn reserved_bytes(&self) -> usize {
        self.running
            .iter()
            .map(|r| self.bytes(r.prompt.len() + r.req.max_tokens))
            .sum()
    }

    /// Drops the cache of the least recently used session other than `keep`
    /// (it re-prefills on its next turn, with the same result); returns the
    /// bytes freed, or None when no such session holds a cache.
    fn evict_lru_except(&mut self, keep: Option<SessionId>) -> Option<usize> {
        let victim = self
            .sessions
            .iter()
            .filter(|(id, s)| Some(**id) != keep && !s.cache.is_empty())
            .min_by_key(|(id, s)| (s.last_used, **id))
            .map(|(id, _)| *id);
        let freed = self.bytes(self.sessions.get(&victim?)?.cache.len());
        let s = self.sessions.get_mut(&victim?)?;
        s.cache = C::default();
        s.tokens.clear();
        Some(freed)
    }

    /// Makes room beside the running requests for caches of `lens` tokens
    /// that live outside any session (an embedding group's), dropping idle
    /// sessions' caches, least recently used first; refuses when the
    /// running requests leave too little.
    pub fn make_room(&mut self, lens: &[usize]) -> Result<(), BackendError> {
        let need: usize = lens.iter().map(|&n| self.bytes(n)).sum();
        let budget = self.limits.kv_budget_bytes;
        let mut held = self.kv_bytes_in_use();
        while held + need > budget {
            match self.evict_lru_except(None) {
                Some(freed) => held -= freed,
                None => {
                    return Err(BackendError::ExceedsKvBudget {
                        needed_bytes: need + self.reserved_bytes(),
                        budget_bytes: budget,
                    })
                }
            }
        }
        Ok(())
    }

    /// Moves waiting requests into the running batch while the KV budget allows.
    fn admit(&mut self) {
        let budget = self.limits.kv_budget_bytes;
        while let Some(p) = self.waiting.front() {
            let (need, keep) = (self.bytes(p.prompt.len() + p.req.max_tokens), p.session);
            let mut reserved = self.reserved_bytes();
            if !self.running.is_empty() && reserved + need > budget {
                break;
            }
            // Idle caches make room for a request that fits beside the running ones.
            reserved += self.idle_bytes_except(Some(keep));
            while reserved + need > budget {
                match self.evict_lru_except(Some(keep)) {
                    Some(freed) => reserved -= freed,
                    None => break,
                }
            }
            let Some(p) = self.waiting.pop_front() else {
                break;
            };
            self.clock += 1;
            let clock = self.clock;
            let session = self.sessions.entry(p.session).or_default();
            session.last_used = clock;
            let mut tokens = std::mem::take(&mut session.tokens);
            let mut cache = std::mem::take(&mut session.cache);
            // Reuse the longest common prefix, but always recompute the last
            // prompt token: its logits choose the first reply token. A
            // scored prompt recomputes every position: cached ones have no
            // logits kept.
            let lcp = if p.req.prompt_logprobs.is_some() {
                0
            } else {
                common_prefix(&tokens, &p.prompt)
                    .min(p.prompt.len() - 1)
                    .min(cache.len())
            };
            cache.truncate(lcp);
            tokens.truncate(lcp);
            self.running.push(Running {
                id: p.id,
                session: p.session,
                feed: p.prompt[lcp..].to_vec(),
                fed: 0,
                prompt: p.prompt,
                cached: lcp,
                tokens,
                cache,
                generated: Vec::new(),
                scores: Vec::new(),
                prompt_scores: Vec::new(),
                filter: p.filter,
                failed: None,
                rng: Rng::new(p.req.seed),
                prefill_secs: 0.0,
                decode_secs: 0.0,
                req: p.req,
            });
        }
    }

    /// Admits what fits and returns the next forward step's batch: every
    /// running request with the tokens it feeds (the next chunk of its
    /// uncached prompt, or its last generated token). None when nothing runs.
    pub fn schedule(&mut self) -> Option<Batch<'_, C>> {
        self.admit();
        if self.running.is_empty() {
            return None;
        }
        // A filtered, adjusted or scored request needs its logits on the host.
        let scoring = |r: &Running<C>| r.req.prompt_logprobs.is_some() && r.generated.is_empty();
        let every_row: Vec<bool> = self.running.iter().map(scoring).collect();
        let greedy = self
            .running
            .iter()
            .map(|r| {
                sampling::is_greedy(r.req.temperature)
                    && r.filter.is_none()
                    && r.req.logprobs.is_none()
                    && !r.req.sampling.adjusts_logits()
                    && !scoring(r)
            })
            .collect();
        // Requests that decode wait for the whole step: keep it short.
        let decoding = self.running.iter().any(|r| !r.generated.is_empty());
        let chunk = if decoding {
            self.limits.prefill_chunk.min(self.limits.mixed_chunk)
        } else {
            self.limits.prefill_chunk
        };
        let items = self
            .running
            .iter_mut()
            .zip(&every_row)
            .map(|(r, &every)| {
                let chunk = if every { chunk.min(SCORE_CHUNK) } else { chunk };
                r.fed = r.feed.len().min(chunk);
                BatchItem {
                    tokens: &r.feed[..r.fed],
                    cache: &mut r.cache,
                }
            })
            .collect();
        Some(Batch {
            items,
            greedy,
            every_row,
        })
    }

    /// Takes the outputs of the batch [`Self::schedule`] returned (one per
    /// running request, in its order; `rows` the logits of the positions
    /// before each `every_row` item's last) and the step's wall time;
    /// samples each request's next token and returns the finished requests,
    /// in id order. `stopped` says whether generated ids contain one of the
    /// stop strings.
    pub fn update(
        &mut self,
        outputs: &[Next],
        rows: &[Vec<Vec<f32>>],
        took: Duration,
        stopped: &dyn Fn(&[u32], &[String]) -> bool,
    ) -> Vec<Done> {
        let secs = took.as_secs_f64();
        self.stepped.clear();
        let no_rows = Vec::new();
        for (i, (r, out)) in self.running.iter_mut().zip(outputs).enumerate() {
            if r.generated.is_empty() {
                r.prefill_secs += secs;
            } else {
                r.decode_secs += secs;
            }
            let start = r.tokens.len();
            r.tokens.extend(r.feed.drain(..r.fed));
            if let Some(k) = r.req.prompt_logprobs.filter(|_| r.generated.is_empty()) {
                // Position p's logits score prompt token p + 1.
                let last = match out {
                    Next::Logits(l) => Some(l),
                    Next::Argmax(_) => None,
                };
                let fed_rows = rows.get(i).unwrap_or(&no_rows).iter().chain(last);
                for (p, l) in (start..).zip(fed_rows) {
                    if let Some(&next) = r.prompt.get(p + 1) {
                        r.prompt_scores.push(sampling::score(l, next, k));
                    }
                }
            }
            if !r.feed.is_empty() || r.req.max_tokens == 0 {
                // Mid-prompt, or scoring only: these logits choose nothing.
                continue;
            }
            let (t, scored) = match out {
                Next::Argmax(t) => (*t, None),
                Next::Logits(l) => choose(r, l, &self.limits.stop_ids),
            };
            r.generated.push(t);
            r.feed.push(t);
            if let Some(s) = &scored {
                r.scores.push(s.clone());
            }
            self.stepped.push((r.id, t, scored));
        }
        let mut done = Vec::new();
        let mut i = 0;
        while i < self.running.len() {
            let Some(finish) = self.finish_of(&self.running[i], stopped) else {
                i += 1;
                continue;
            };
            let r = self.running.swap_remove(i);
            self.clock += 1;
            if let Some(session) = self.sessions.get_mut(&r.session) {
                session.tokens = r.tokens;
                session.cache = r.cache;
                session.busy = false;
                session.last_used = self.clock;
            }
            done.push(Done {
                id: r.id,
                prompt_tokens: r.prompt.len(),
                cached_tokens: r.cached,
                generated: r.generated,
                scores: r.scores,
                prompt: r.prompt,
                prompt_scores: r.prompt_scores,
                failed: r.failed,
                finish,
                prefill_secs: r.prefill_secs,
                decode_secs: r.decode_secs,
                req: r.req,
            });
        }
        done.sort_by_key(|d| d.id);
        done
    }

    /// The tokens the last [`Self::update`] chose, one per request that
    /// decoded, with log-probabilities where the request asked.
    pub fn take_stepped(&mut self) -> Vec<(RequestId, u32, Option<Scored>)> {
        std::mem::take(&mut self.stepped)
    }

    /// Ends every running request after a failed step: their sessions are
    /// free again, with empty caches (what the step wrote is not trusted).
    pub fn abort_running(&mut self) -> Vec<RequestId> {
        let mut ids = Vec::new();
        for r in self.running.drain(..) {
            if let Some(session) = self.sessions.get_mut(&r.session) {
                session.busy = false;
                session.tokens.clear();
            }
            ids.push(r.id);
        }
        ids.sort();
        ids
    }

    /// Why a running request is done, if it is.
    fn finish_of(
        &self,
        r: &Running<C>,
        stopped: &dyn Fn(&[u32], &[String]) -> bool,
    ) -> Option<Finish> {
        if r.req.max_tokens == 0 && r.feed.is_empty() {
            return Some(Finish::Length);
        }
        let last = *r.generated.last()?;
        if self.is_stop_id(last) || r.failed.is_some() {
            return Some(Finish::Stop);
        }
        if !r.req.stop.is_empty()
            && r.generated.len() >= r.req.sampling.min_tokens
            && stopped(&r.generated, &r.req.stop)
        {
            return Some(Finish::Stop);
        }
        if r.generated.len() >= r.req.max_tokens
            || r.prompt.len() + r.generated.len() >= self.limits.context
        {
            return Some(Finish::Length);
        }
        None
    }
}

/// How many leading tokens `a` and `b` share.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
