//! The in-process inference engine: weights, tokenizer, chat template, the
//! Qwen forward pass, sessions with prefix reuse and the batching scheduler.
//!
//! Four parts, each unaware of the others' insides: the [`scheduler`]
//! (sessions, queue, running batch, KV budget), the [`kv_cache`] (one
//! sequence's keys and values), the [`model`] layers (the forward pass) and
//! the [`device`] kernels they call. [`Engine`] ties them to the tokenizer
//! and the chat template and implements [`Backend`].
//!
//! Layer: the bottom. The engine implements [`crate::backend::Backend`] and
//! uses the backend's request and reply types; it knows nothing of episodes
//! or studies.

pub mod constrain;
pub mod device;
pub mod gguf;
pub mod known;
pub mod kv_cache;
pub mod model;
pub mod prompt;
pub mod sampling;
pub mod scheduler;
pub mod template;
pub mod weights;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Instant;

use sha2::{Digest, Sha256};

use std::sync::Arc;

use crate::backend::{
    l2_normalize, split_thinking, split_tool_calls, Backend, BackendError, Candidate, ChatReply,
    ChatRequest, Constraint, Embeddings, Finished, Message, ModelIdentity, Progress, Prompt,
    PromptToken, RequestId, SessionId, TokenLogprob, Usage,
};
use constrain::{Grammars, TokenBytes};
use device::{Cpu, Device, DeviceChoice, Next};
use model::{BatchItem, Model};
use prompt::Prompter;
use scheduler::{Done, Limits, Scheduler};
use scheduler::{Scored, TokenFilter};
use template::ChatTemplate;

// Its own file: `build.rs` reads it too, to tell the tests whether the
// model is there.
include!("default_model.rs");

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
    /// Tokenize special-token strings inside message content as the control
    /// tokens they name (off: they are text, so no message can forge a turn).
    pub special_tokens_in_content: bool,
    /// Prompt tokens one request feeds per forward step: a long prompt is
    /// prefilled over several steps, so the batch's other requests keep
    /// decoding and a cancelled request stops within one chunk. The
    /// kernels make the split invisible in the results.
    pub prefill_chunk: usize,
    /// Prompt tokens a request feeds per step while other requests decode:
    /// each of their tokens waits for the step, so a long prompt beside
    /// them goes in smaller pieces (vLLM's chunked prefill under a token
    /// budget). Invisible in the results, as `prefill_chunk` is.
    pub mixed_prefill_chunk: usize,
    /// How quantized weights are held in memory (results are the same).
    pub weights: WeightLayout,
    /// Float weights quantized at load (results change: its own arithmetic).
    pub quantize: Option<Quantize>,
}

/// A quantization of float (f32, bf16, f16) weight matrices at load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Quantize {
    /// ggml's Q8_0: blocks of 32 with one f16 scale, about 8.5 bits a
    /// weight, read by the integer kernels.
    #[value(name = "q8_0")]
    Q8_0,
}

impl Quantize {
    /// How manifests name it (in the model's format and arithmetic).
    pub fn describe(self) -> &'static str {
        match self {
            Quantize::Q8_0 => "float weights quantized to Q8_0 at load (ggml rounding)",
        }
    }
}

/// How Q4_0, Q5_0, Q4_K and Q6_K weights are held in memory. The kernels
/// read the same integers and scales either way, so every result is
/// bit-identical; only memory and speed differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum WeightLayout {
    /// Widened once at load (8.5 bits a weight for Q4_0/Q5_0, 11 for
    /// Q4_K/Q6_K; on CPUs with AMX tiles, or whose 512-bit dot-product
    /// instructions do twice the work of 256-bit ones, held sixteen rows at a
    /// time as the tiles read them, 9 bits for the Q8_0 form): no unpacking
    /// per product, the faster from a few rows a batch up.
    #[default]
    Widened,
    /// The file's own bits, unpacked per product into cache: the file's size
    /// in memory and the fewest bytes streamed, the faster at batch 1.
    Native,
}

impl EngineOptions {
    /// Compute threads when none are given.
    pub const DEFAULT_THREADS: usize = 2;
    /// KV budget in GiB when none is given.
    pub const DEFAULT_KV_BUDGET_GIB: f64 = 8.0;
    /// Prompt tokens per request per step when none are given.
    pub const DEFAULT_PREFILL_CHUNK: usize = 512;
    /// Default of [`Self::mixed_prefill_chunk`].
    pub const DEFAULT_MIXED_PREFILL_CHUNK: usize = 64;
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            threads: Self::DEFAULT_THREADS,
            kv_budget_bytes: gib(Self::DEFAULT_KV_BUDGET_GIB),
            max_context: None,
            special_tokens_in_content: false,
            prefill_chunk: Self::DEFAULT_PREFILL_CHUNK,
            mixed_prefill_chunk: Self::DEFAULT_MIXED_PREFILL_CHUNK,
            weights: WeightLayout::default(),
            quantize: None,
        }
    }
}

/// Bytes in `g` GiB.
pub fn gib(g: f64) -> usize {
    (g * (1u64 << 30) as f64) as usize
}

/// Where the weights came from, for the model identity.
struct Origin {
    name: String,
    source: String,
    format: String,
    quantize: Option<Quantize>,
    files: Vec<PathBuf>,
    sha: OnceLock<String>,
}

/// The in-process engine on one device; implements [`Backend`].
pub struct Engine<D: Device = Cpu> {
    model: Model<D>,
    prompter: Arc<Prompter>,
    template_source: String,
    pool: rayon::ThreadPool,
    origin: Origin,
    scheduler: Scheduler<D::Cache>,
    /// Tokens one text feeds per forward step when embedding.
    prefill_chunk: usize,
    /// Read on the first request that asks for log-probabilities or a
    /// constraint.
    token_bytes: OnceLock<TokenBytes>,
    grammars: Option<Grammars>,
}

/// Tokens of the texts one embedding forward step takes together at most.
const EMBED_BATCH_TOKENS: usize = 8192;

/// Loads a model onto the chosen device, as the one chat interface the
/// studies call.
pub fn open(
    spec: &str,
    opts: EngineOptions,
    device: DeviceChoice,
) -> Result<Box<dyn Backend + Send>, BackendError> {
    let not_built = |feature: &str| {
        BackendError::Device {
        device: device.to_string(),
        cause: format!(
            "this statebench was built without the `{feature}` feature (rebuild with --features {feature}, or use --device cpu)"
        ),
    }
    };
    match device {
        DeviceChoice::Cpu => Ok(Box::new(Engine::load(spec, opts)?)),
        #[cfg(feature = "cuda")]
        DeviceChoice::Cuda(_) | DeviceChoice::CudaEmulated => Ok(Box::new(Engine::load_on(
            device::cuda::Cuda::open_choice(device)?,
            spec,
            opts,
        )?)),
        #[cfg(not(feature = "cuda"))]
        DeviceChoice::Cuda(_) | DeviceChoice::CudaEmulated => Err(not_built("cuda")),
        #[cfg(feature = "metal")]
        DeviceChoice::Metal(n) => Ok(Box::new(Engine::load_on(
            device::candle::Candle::metal(n)?,
            spec,
            opts,
        )?)),
        #[cfg(not(feature = "metal"))]
        DeviceChoice::Metal(_) => Err(not_built("metal")),
    }
}

impl Engine<Cpu> {
    /// Loads a model onto the CPU from a GGUF path, a safetensors directory
    /// or a hub id.
    pub fn load(spec: &str, opts: EngineOptions) -> Result<Self, BackendError> {
        // The CPU's forward passes allocate their activations per pass.
        statebench_kernels::cpu::hold_freed_memory();
        Self::load_on(Cpu, spec, opts)
    }
}

impl<D: Device> Engine<D> {
    /// Loads a model onto `device`.
    pub fn load_on(device: D, spec: &str, opts: EngineOptions) -> Result<Self, BackendError> {
        // Weights are packed for the CPU kernels' family: refuse a bad cap
        // before any is read.
        statebench_kernels::isa()?;
        let mut loaded = weights::load(spec, device, opts.weights, opts.quantize)?;
        if let Some(max) = opts.max_context {
            loaded.model.cap_context(max)?;
        }
        let template = ChatTemplate::new(&loaded.chat_template)?;
        template.probe()?;
        let stop_ids = ["<|im_end|>", "<|endoftext|>"]
            .iter()
            .filter_map(|t| loaded.tokenizer.token_to_id(t))
            .collect();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(opts.threads.max(1))
            .build()
            .map_err(|e| BackendError::BadRequest(format!("thread pool: {e}")))?;
        let cfg = &loaded.model.cfg;
        let kv_budget_bytes =
            loaded
                .model
                .device
                .reserve_kv(cfg.layers, cfg.heads(), opts.kv_budget_bytes)?;
        let scheduler = Scheduler::new(Limits {
            kv_budget_bytes,
            kv_bytes_per_token: cfg.layers * loaded.model.device.kv_bytes_per_position(cfg.heads()),
            context: cfg.context,
            stop_ids,
            prefill_chunk: opts.prefill_chunk.max(1),
            mixed_chunk: opts.mixed_prefill_chunk.max(1),
        });
        let prompter = Prompter::new(
            loaded.tokenizer,
            template,
            opts.special_tokens_in_content,
            loaded.model.cfg.context,
            loaded.model.cfg.vocab,
            &loaded.literal_tokens,
        );
        Ok(Self {
            model: loaded.model,
            prompter: Arc::new(prompter),
            template_source: loaded.chat_template,
            pool,
            origin: Origin {
                name: loaded.name,
                source: spec.to_string(),
                format: loaded.format,
                quantize: opts.quantize,
                files: loaded.files,
                sha: OnceLock::new(),
            },
            scheduler,
            prefill_chunk: opts.prefill_chunk.max(1),
            token_bytes: OnceLock::new(),
            grammars: None,
        })
    }

    /// The model (for tests and benchmarks that read weights or drive the
    /// forward pass directly).
    /// The weights' format as loaded (`gguf Q4_K_M`, `safetensors bf16`, …).
    pub fn format(&self) -> &str {
        &self.origin.format
    }

    pub fn model(&self) -> &Model<D> {
        &self.model
    }

    /// Runs `f` on the engine's threads (what a measurement of the host
    /// beside the engine's own figures needs).
    pub fn on_threads<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }

    /// Runs one ragged forward batch on the engine's threads; returns each
    /// item's last logits.
    pub fn forward(
        &self,
        items: &mut [BatchItem<'_, D::Cache>],
    ) -> Result<Vec<Vec<f32>>, BackendError> {
        self.pool.install(|| self.model.forward(items))
    }

    /// Runs one ragged forward batch as a greedy decode step runs: each
    /// item's next token chosen on the device, only the token ids copied
    /// back.
    pub fn forward_greedy(
        &self,
        items: &mut [BatchItem<'_, D::Cache>],
    ) -> Result<Vec<u32>, BackendError> {
        let greedy = vec![true; items.len()];
        let next = self.pool.install(|| self.model.step(items, &greedy))?;
        Ok(next
            .into_iter()
            .map(|n| match n {
                Next::Argmax(t) => t,
                Next::Logits(l) => sampling::argmax(&l),
            })
            .collect())
    }

    /// Renders messages with the model's chat template.
    pub fn render(&self, messages: &[Message], thinking: bool) -> Result<String, BackendError> {
        self.prompter.template.render(messages, &[], thinking)
    }

    pub fn tokenizer(&self) -> &tokenizers::Tokenizer {
        &self.prompter.tokenizer
    }

    /// The chat template as shipped with the model.
    pub fn template_source(&self) -> &str {
        &self.template_source
    }

    pub fn template(&self) -> &ChatTemplate {
        &self.prompter.template
    }

    /// Writes the model's tokenizer as a Hugging Face tokenizer directory
    /// (`tokenizer.json`, `tokenizer_config.json` with the chat template,
    /// `special_tokens_map.json`) that encodes as [`Self::encode`] does, so a
    /// client can count and tokenize for a GGUF-only model. Returns the
    /// files written.
    pub fn export_tokenizer(&self, dir: &std::path::Path) -> Result<Vec<PathBuf>, BackendError> {
        let io = |p: &std::path::Path, source: std::io::Error| BackendError::Io {
            path: p.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        let tok = &self.prompter.tokenizer;
        let name = |id: Option<u32>| id.and_then(|t| tok.id_to_token(t));
        // The reply's end is the first stop token; padding the plain end of text.
        let eos = name(self.scheduler.stop_ids().first().copied());
        let pad = name(tok.token_to_id("<|endoftext|>")).or_else(|| eos.clone());
        let json_path = dir.join("tokenizer.json");
        tok.save(&json_path, false)
            .map_err(|e| BackendError::Tokenizer(format!("{}: {e}", json_path.display())))?;
        let specials = serde_json::json!({ "eos_token": eos, "pad_token": pad });
        let config = serde_json::json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "chat_template": self.template_source,
            "eos_token": eos,
            "pad_token": pad,
            "bos_token": null,
            "add_bos_token": false,
            "add_prefix_space": false,
            "clean_up_tokenization_spaces": false,
            "split_special_tokens": false,
            "errors": "replace",
            "model_max_length": self.model.cfg.context,
        });
        let mut written = vec![json_path];
        for (file, v) in [
            ("tokenizer_config.json", config),
            ("special_tokens_map.json", specials),
        ] {
            let p = dir.join(file);
            let text = serde_json::to_string_pretty(&v).expect("JSON values serialize");
            std::fs::write(&p, text).map_err(|e| io(&p, e))?;
            written.push(p);
        }
        Ok(written)
    }

    /// Sets [`EngineOptions::mixed_prefill_chunk`] (benchmarks compare two).
    pub fn set_mixed_prefill_chunk(&mut self, n: usize) {
        self.scheduler.set_mixed_chunk(n.max(1));
    }

    /// Tokenizes text; special tokens written in the text are recognised.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, BackendError> {
        self.prompter.encode(text)
    }

    /// Detokenizes, dropping special tokens.
    pub fn decode(&self, ids: &[u32]) -> Result<String, BackendError> {
        self.prompter.decode(ids)
    }

    /// Bytes of KV cache held now: running requests' reservations plus every
    /// session's cached entries.
    pub fn kv_bytes_in_use(&self) -> usize {
        self.scheduler.kv_bytes_in_use()
    }

    /// Embeds one group of tokenized texts together.
    fn embed_group(&self, texts: &[&[u32]]) -> Result<Vec<Vec<f32>>, BackendError> {
        let mut caches: Vec<D::Cache> = texts.iter().map(|_| D::Cache::default()).collect();
        let mut out: Vec<Vec<f32>> = vec![Vec::new(); texts.len()];
        let mut at = 0;
        while texts.iter().any(|t| at < t.len()) {
            let mut which = Vec::new();
            let mut items = Vec::new();
            for (i, (t, cache)) in texts.iter().zip(caches.iter_mut()).enumerate() {
                if at < t.len() {
                    let end = (at + self.prefill_chunk).min(t.len());
                    which.push((i, end == t.len()));
                    items.push(BatchItem {
                        tokens: &t[at..end],
                        cache,
                    });
                }
            }
            let hidden = self.pool.install(|| self.model.hidden(&mut items))?;
            for ((i, last), h) in which.into_iter().zip(hidden) {
                if last {
                    out[i] = h;
                }
            }
            at += self.prefill_chunk;
        }
        for v in &mut out {
            l2_normalize(v);
        }
        Ok(out)
    }

    fn token_bytes(&self) -> &TokenBytes {
        self.token_bytes.get_or_init(|| self.prompter.token_bytes())
    }

    /// A token's log-probabilities with each candidate's bytes.
    fn logprob(&self, s: &Scored) -> TokenLogprob {
        let bytes = self.token_bytes();
        let candidate = |id: u32, logprob: f32| Candidate {
            id,
            bytes: bytes.of(id).to_vec(),
            logprob,
        };
        TokenLogprob {
            chosen: candidate(s.token, s.logprob),
            top: s.top.iter().map(|&(id, lp)| candidate(id, lp)).collect(),
        }
    }

    /// The filter enforcing a request's constraint; the vocabulary is
    /// indexed on the first.
    fn filter(&mut self, req: &ChatRequest) -> Result<Option<Box<dyn TokenFilter>>, BackendError> {
        let Some(c) = &req.constraint else {
            return Ok(None);
        };
        if self.grammars.is_none() {
            let eos = self.prompter.tokenizer.token_to_id("<|im_end|>");
            let eos = eos
                .or_else(|| self.prompter.tokenizer.token_to_id("<|endoftext|>"))
                .unwrap_or(0);
            let tool_call = self.prompter.tokenizer.token_to_id("<tool_call>");
            self.grammars = Some(Grammars::new(self.token_bytes(), eos, tool_call)?);
        }
        let grammars = self.grammars.as_ref().expect("indexed above");
        grammars.filter(c, &req.tools).map(Some)
    }

    fn reply(&self, d: Done) -> Result<ChatReply, BackendError> {
        if let Some(cause) = d.failed {
            return Err(BackendError::BadRequest(cause));
        }
        let body = match d.generated.split_last() {
            Some((t, body)) if self.scheduler.is_stop_id(*t) => body,
            _ => &d.generated,
        };
        let mut text = self.decode(body)?;
        if let Some(cut) = d
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
        let plain = d.req.tools.is_empty() || d.req.constraint == Some(Constraint::NoToolCalls);
        let (content, tool_calls) = if plain {
            (content, Vec::new())
        } else {
            split_tool_calls(&content)
        };
        let logprobs = d.scores[..d.scores.len().min(body.len())]
            .iter()
            .map(|s| self.logprob(s))
            .collect();
        let prompt = match d.req.prompt_logprobs {
            Some(_) => self.prompt_tokens(&d.prompt, &d.prompt_scores),
            None => Vec::new(),
        };
        Ok(ChatReply {
            content,
            reasoning,
            tool_calls,
            finish: d.finish,
            usage: Usage {
                prompt_tokens: d.prompt_tokens,
                cached_tokens: d.cached_tokens,
                completion_tokens: d.generated.len(),
                prefill_secs: d.prefill_secs,
                decode_secs: d.decode_secs,
            },
            tokens: d.generated,
            logprobs,
            prompt,
        })
    }

    /// The prompt's tokens with their scores: none for the first, then one
    /// per later token.
    fn prompt_tokens(&self, prompt: &[u32], scores: &[Scored]) -> Vec<PromptToken> {
        let bytes = self.token_bytes();
        prompt
            .iter()
            .enumerate()
            .map(|(i, &id)| {
                let scored = i.checked_sub(1).and_then(|j| scores.get(j));
                PromptToken {
                    id,
                    bytes: bytes.of(id).to_vec(),
                    logprob: scored.map(|s| s.logprob),
                    top: scored.map_or_else(Vec::new, |s| self.logprob(s).top),
                }
            })
            .collect()
    }
}

impl<D: Device> Backend for Engine<D> {
    fn open_session(&mut self) -> SessionId {
        self.scheduler.open_session()
    }

    fn close_session(&mut self, s: SessionId) {
        self.scheduler.close_session(s);
    }

    fn submit(&mut self, s: SessionId, req: ChatRequest) -> Result<RequestId, BackendError> {
        self.scheduler.check_session(s)?;
        let prompt = self.prompter.tokens(&req)?;
        let filter = self.filter(&req)?;
        self.scheduler.add_request(s, req, prompt, filter)
    }

    fn prompter(&self) -> Option<Arc<dyn Prompt>> {
        Some(self.prompter.clone())
    }

    fn submit_prepared(
        &mut self,
        s: SessionId,
        req: ChatRequest,
        prompt: Vec<u32>,
    ) -> Result<RequestId, BackendError> {
        req.validate()?;
        self.prompter.check(&prompt)?;
        let filter = self.filter(&req)?;
        self.scheduler.add_request(s, req, prompt, filter)
    }

    fn embed(&mut self, texts: &[String]) -> Result<Embeddings, BackendError> {
        let tokens = texts
            .iter()
            .map(|t| self.prompter.embedding_tokens(t))
            .collect::<Result<Vec<_>, _>>()?;
        self.embed_prepared(texts, tokens)
    }

    /// Texts go through in groups of at most `EMBED_BATCH_TOKENS` tokens,
    /// each group prefilled chunk by chunk in fresh caches of its own; the
    /// kernels make neither the grouping nor the chunking visible.
    fn embed_prepared(
        &mut self,
        _texts: &[String],
        tokens: Vec<Vec<u32>>,
    ) -> Result<Embeddings, BackendError> {
        for t in &tokens {
            self.prompter.check(t)?;
        }
        let mut vectors = Vec::with_capacity(tokens.len());
        let mut group: Vec<&[u32]> = Vec::new();
        let mut group_tokens = 0;
        for t in &tokens {
            if !group.is_empty() && group_tokens + t.len() > EMBED_BATCH_TOKENS {
                self.scheduler
                    .make_room(&group.iter().map(|g| g.len()).collect::<Vec<_>>())?;
                vectors.extend(self.embed_group(&group)?);
                group.clear();
                group_tokens = 0;
            }
            group.push(t);
            group_tokens += t.len();
        }
        self.scheduler
            .make_room(&group.iter().map(|g| g.len()).collect::<Vec<_>>())?;
        vectors.extend(self.embed_group(&group)?);
        Ok(Embeddings {
            vectors,
            prompt_tokens: tokens.iter().map(Vec::len).sum(),
        })
    }

    fn step(&mut self) -> Result<Finished, BackendError> {
        let started = Instant::now();
        let outputs = match self.scheduler.schedule() {
            Some(mut b) => self
                .pool
                .install(|| self.model.step_rows(&mut b.items, &b.greedy, &b.every_row)),
            None => return Ok(Vec::new()),
        };
        let (outputs, rows) = match outputs {
            Ok(o) => o,
            // The step failed (the device, or non-finite values): every
            // request in it ends with the error, and their sessions start over.
            Err(e) => {
                let cause = crate::one_line(&e);
                let ids = self.scheduler.abort_running();
                return Ok(ids
                    .into_iter()
                    .map(|id| {
                        let model = self.origin.name.clone();
                        let cause = cause.clone();
                        (id, Err(BackendError::StepFailed { model, cause }))
                    })
                    .collect());
            }
        };
        let tokenizer = &self.prompter.tokenizer;
        // Whether the ids decode to text containing one of the stop strings.
        let stopped = |ids: &[u32], stop: &[String]| {
            tokenizer.decode(ids, true).is_ok_and(|text| {
                stop.iter()
                    .any(|s| !s.is_empty() && text.contains(s.as_str()))
            })
        };
        let done = self
            .scheduler
            .update(&outputs, &rows, started.elapsed(), &stopped);
        Ok(done.into_iter().map(|d| (d.id, self.reply(d))).collect())
    }

    fn take_progress(&mut self) -> Vec<Progress> {
        let stepped = self.scheduler.take_stepped();
        stepped
            .into_iter()
            .map(|(id, token, scored)| Progress {
                id,
                token,
                logprob: scored.map(|s| self.logprob(&s)),
            })
            .collect()
    }

    fn has_pending(&self) -> bool {
        self.scheduler.has_pending()
    }

    fn model_id(&self) -> Result<ModelIdentity, BackendError> {
        let o = &self.origin;
        let weights_sha256 = match o.sha.get() {
            Some(sha) => sha.clone(),
            None => {
                let sha = hash_files(&o.files)?;
                o.sha.get_or_init(|| sha).clone()
            }
        };
        let d = self.model.device.info();
        // The CPU is what every manifest meant before devices existed.
        let device = if d.name == "cpu" {
            String::new()
        } else {
            format!("{} ({}; {})", d.name, d.hardware, d.detail)
        };
        Ok(ModelIdentity {
            name: o.name.clone(),
            source: o.source.clone(),
            weights_sha256,
            architecture: self.model.cfg.arch.as_str().to_string(),
            format: match o.quantize {
                Some(q) => format!("{}; {}", o.format, q.describe()),
                None => o.format.clone(),
            },
            arithmetic: match o.quantize {
                Some(q) => format!("{}; {}", d.arithmetic, q.describe()),
                None => d.arithmetic,
            },
            device,
        })
    }
}

/// sha256 over the weight files, in order; an unreadable file is an error,
/// never the hash of nothing.
fn hash_files(files: &[PathBuf]) -> Result<String, BackendError> {
    let mut h = Sha256::new();
    for f in files {
        let io = |source| BackendError::Io {
            path: f.clone(),
            source,
        };
        let mut file = std::fs::File::open(f).map_err(io)?;
        std::io::copy(&mut file, &mut h).map_err(io)?;
    }
    Ok(crate::hex(&h.finalize()))
}
