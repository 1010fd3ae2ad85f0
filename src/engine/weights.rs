//! Loading weights, tokenizer and chat template from a GGUF file, a local
//! safetensors directory, or a Hugging Face id in the local hub cache.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use candle_core::quantized::tokenizer::TokenizerFromGguf;
use candle_core::quantized::{gguf_file, GgmlDType};
use serde::Deserialize;
use statebench_kernels::Matrix;
use tokenizers::Tokenizer;

use super::device::{Device, HostWeight};
use super::model::{Arch, Attention, Config, DecoderLayer, Linear, Mlp, Model};
use super::{Quantize, WeightLayout};
use crate::backend::BackendError;

/// Everything read from a model's files.
pub struct Loaded<D: Device> {
    pub model: Model<D>,
    pub tokenizer: Tokenizer,
    /// The chat template source (Jinja).
    pub chat_template: String,
    /// Name from the metadata, or the directory's name.
    pub name: String,
    /// Storage format, for the model identity.
    pub format: String,
    /// Weight files, hashed for the model identity.
    pub files: Vec<PathBuf>,
    /// Tokens the tokenizer marks special that decoded text keeps: a GGUF's
    /// user-defined tokens (Qwen's `<tool_call>`, `</tool_call>`, the FIM
    /// tokens), which Hugging Face's tokenizer declares non-special. The
    /// GGUF tokenizer marks them special, and skipping them in decode would
    /// drop the tags a tool-call parser reads.
    pub literal_tokens: Vec<String>,
}

/// Loads a model onto `device` from a GGUF file, a safetensors directory, or
/// a hub id.
pub fn load<D: Device>(
    spec: &str,
    device: D,
    layout: WeightLayout,
    quantize: Option<Quantize>,
) -> Result<Loaded<D>, BackendError> {
    let path = Path::new(spec);
    let hold = Holding { layout, quantize };
    // Every step streams the weights: on huge pages, without a page walk
    // every 4 KiB.
    statebench_kernels::alloc::huge_pages(|| {
        if path.is_dir() {
            return load_safetensors_dir(path, spec, device, hold);
        }
        if path.is_file() {
            return load_gguf(path, device, hold);
        }
        if looks_like_hub_id(spec) {
            let dir = resolve_hub_id(spec)?;
            return load_safetensors_dir(&dir, spec, device, hold);
        }
        Err(BackendError::MissingFile {
            path: path.to_path_buf(),
            hint: "pass a .gguf file, a directory with config.json and safetensors, \
                   or a Hugging Face id"
                .into(),
        })
    })
}

fn looks_like_hub_id(s: &str) -> bool {
    let parts: Vec<&str> = s.split('/').collect();
    parts.len() == 2
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        })
        && !s.ends_with(".gguf")
}

/// Whether `HF_HUB_OFFLINE` forbids downloads.
fn hub_offline() -> bool {
    std::env::var("HF_HUB_OFFLINE")
        .map(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "1" | "true" | "yes" | "on"
            )
        })
        .unwrap_or(false)
}

/// Finds a hub id's snapshot directory: the local Hugging Face cache first,
/// then a download unless `HF_HUB_OFFLINE` is set.
fn resolve_hub_id(id: &str) -> Result<PathBuf, BackendError> {
    let cache = hf_hub::Cache::from_env();
    let offline = hub_offline();
    let missing = |file: &str, why: String| BackendError::MissingFile {
        path: PathBuf::from(format!("{id}/{file}")),
        hint: why,
    };
    let fetch = |file: &str| -> Result<PathBuf, BackendError> {
        if let Some(p) = cache.model(id.to_string()).get(file) {
            return Ok(p);
        }
        if offline {
            return Err(missing(
                file,
                format!(
                    "not in the Hugging Face cache at {} and HF_HUB_OFFLINE is set; unset it or download the model first",
                    cache.path().display()
                ),
            ));
        }
        download(id, file).map_err(|why| missing(file, why))
    };
    let config = fetch("config.json")?;
    fetch("tokenizer.json")?;
    fetch("tokenizer_config.json")?;
    if fetch("model.safetensors").is_err() {
        let index = fetch("model.safetensors.index.json")?;
        let index: ShardIndex = read_json(&index)?;
        let shards: std::collections::BTreeSet<String> = index.weight_map.into_values().collect();
        for shard in &shards {
            fetch(shard)?;
        }
    }
    // Newer repositories keep the chat template in its own file.
    let _ = fetch("chat_template.jinja");
    config
        .parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| missing("config.json", "bad cache layout".into()))
}

/// `model.safetensors.index.json`: which shard holds each tensor.
#[derive(Deserialize)]
struct ShardIndex {
    weight_map: HashMap<String, String>,
}

/// Downloads one file of a hub repository into the hub cache.
#[cfg(feature = "hub-download")]
fn download(id: &str, file: &str) -> Result<PathBuf, String> {
    let api = hf_hub::api::sync::ApiBuilder::from_env()
        .with_progress(true)
        .build()
        .map_err(|e| format!("cannot reach the Hugging Face hub: {e}"))?;
    api.model(id.to_string())
        .get(file)
        .map_err(|e| format!("download failed: {e}"))
}

#[cfg(not(feature = "hub-download"))]
fn download(_id: &str, _file: &str) -> Result<PathBuf, String> {
    Err("not in the Hugging Face cache, and this build cannot download (built without the hub-download feature)".into())
}

fn read_to_string(path: &Path) -> Result<String, BackendError> {
    std::fs::read_to_string(path).map_err(|e| io_err(path, e))
}

/// Reads and parses a JSON file into `T`.
fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T, BackendError> {
    serde_json::from_str(&read_to_string(path)?)
        .map_err(|e| corrupt(path, format!("invalid JSON: {e}")))
}

pub(super) fn io_err(path: &Path, source: std::io::Error) -> BackendError {
    if source.kind() == std::io::ErrorKind::NotFound {
        BackendError::MissingFile {
            path: path.to_path_buf(),
            hint: "check the path".into(),
        }
    } else {
        BackendError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

pub(super) fn corrupt(path: &Path, cause: impl Into<String>) -> BackendError {
    BackendError::CorruptWeights {
        path: path.to_path_buf(),
        cause: format!(
            "{} (re-fetch or re-export the file)",
            first_line(cause.into())
        ),
    }
}

/// Library errors may carry a backtrace after the message; keep the message.
fn first_line(s: String) -> String {
    s.lines().next().unwrap_or_default().trim().to_string()
}

pub(super) fn unsupported(path: &Path, cause: impl Into<String>) -> BackendError {
    BackendError::Unsupported {
        path: path.to_path_buf(),
        cause: first_line(cause.into()),
    }
}

/// Where weights come from: tensors by name, as host matrices.
trait TensorSource {
    fn path(&self) -> &Path;
    fn has(&self, name: &str) -> bool;
    fn matrix(&self, name: &str) -> Result<HostWeight, BackendError>;
    /// Tensors of the files the model has not read, by name.
    fn unread(&self) -> Vec<String>;
    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, BackendError> {
        let m = self.matrix(name)?;
        let v = m.to_f32();
        if v.len() != len {
            return Err(corrupt(
                self.path(),
                format!("tensor {name} has {} values, expected {len}", v.len()),
            ));
        }
        Ok(v)
    }
}

/// Tensor names of one file format.
struct Names {
    gguf: bool,
}

impl Names {
    fn embed(&self) -> String {
        if self.gguf {
            "token_embd.weight"
        } else {
            "model.embed_tokens.weight"
        }
        .into()
    }
    fn head(&self) -> String {
        if self.gguf {
            "output.weight"
        } else {
            "lm_head.weight"
        }
        .into()
    }
    fn norm(&self) -> String {
        if self.gguf {
            "output_norm.weight"
        } else {
            "model.norm.weight"
        }
        .into()
    }
    /// Layer `i`'s tensor of `part`: its weight, or its bias.
    fn layer(&self, i: usize, part: Part, bias: bool) -> String {
        let (gguf, safetensors) = part.stems();
        let kind = if bias { "bias" } else { "weight" };
        if self.gguf {
            format!("blk.{i}.{gguf}.{kind}")
        } else {
            format!("model.layers.{i}.{safetensors}.{kind}")
        }
    }
}

/// A decoder layer's tensors by role; each file format spells them its own
/// way, written here once, so a misspelt role does not compile.
#[derive(Debug, Clone, Copy)]
enum Part {
    AttnNorm,
    MlpNorm,
    QNorm,
    KNorm,
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl Part {
    /// The name's stem in GGUF files and in safetensors checkpoints.
    fn stems(self) -> (&'static str, &'static str) {
        match self {
            Part::AttnNorm => ("attn_norm", "input_layernorm"),
            Part::MlpNorm => ("ffn_norm", "post_attention_layernorm"),
            Part::QNorm => ("attn_q_norm", "self_attn.q_norm"),
            Part::KNorm => ("attn_k_norm", "self_attn.k_norm"),
            Part::Q => ("attn_q", "self_attn.q_proj"),
            Part::K => ("attn_k", "self_attn.k_proj"),
            Part::V => ("attn_v", "self_attn.v_proj"),
            Part::O => ("attn_output", "self_attn.o_proj"),
            Part::Gate => ("ffn_gate", "mlp.gate_proj"),
            Part::Up => ("ffn_up", "mlp.up_proj"),
            Part::Down => ("ffn_down", "mlp.down_proj"),
        }
    }
}

/// How weight matrices are held once read.
#[derive(Clone, Copy)]
struct Holding {
    layout: WeightLayout,
    quantize: Option<Quantize>,
}

impl Holding {
    /// Quantizes or widens a matrix as asked, then puts it on `dev`.
    fn weight<D: Device>(
        self,
        dev: &D,
        src: &dyn TensorSource,
        name: &str,
        w: HostWeight,
    ) -> Result<D::Weight, BackendError> {
        let bad =
            |e: statebench_kernels::MatrixError| corrupt(src.path(), format!("tensor {name}: {e}"));
        let w = match (self.quantize, w) {
            (Some(Quantize::Q8_0), w) => {
                HostWeight::Matrix(w.into_matrix().and_then(Matrix::to_q8_0).map_err(bad)?)
            }
            // Sixteen rows at a time where the AMX tiles or 512-bit dots
            // take them (the same bits either way).
            (None, HostWeight::Matrix(m)) if self.layout == WeightLayout::Widened => {
                let m = m.widen();
                HostWeight::Matrix(if statebench_kernels::cpu::pairs_pay() {
                    m.paired()
                } else {
                    m
                })
            }
            (None, w) => w,
        };
        dev.weight(w)
    }
}

#[allow(clippy::too_many_arguments)]
fn linear<D: Device>(
    dev: &D,
    hold: Holding,
    src: &dyn TensorSource,
    names: &Names,
    i: usize,
    part: Part,
    rows: usize,
    cols: usize,
) -> Result<Linear<D>, BackendError> {
    let wname = names.layer(i, part, false);
    let w = src.matrix(&wname)?;
    if w.rows() != rows || w.cols() != cols {
        return Err(corrupt(
            src.path(),
            format!(
                "tensor {wname} is {}x{}, expected {rows}x{cols}",
                w.rows(),
                w.cols()
            ),
        ));
    }
    let bname = names.layer(i, part, true);
    let b = if src.has(&bname) {
        Some(dev.vector(src.vector(&bname, rows)?)?)
    } else {
        None
    };
    Ok(Linear {
        w: hold.weight(dev, src, &wname, w)?,
        b,
    })
}

/// Builds the model on `dev`; `tied` says the output head is the embedding
/// (None: whatever the files hold).
fn build_model<D: Device>(
    dev: D,
    hold: Holding,
    src: &dyn TensorSource,
    names: &Names,
    mut cfg: Config,
    tied: Option<bool>,
) -> Result<Model<D>, BackendError> {
    let (h, hd) = (cfg.hidden, cfg.head_dim);
    let embed = src.matrix(&names.embed())?;
    if embed.cols() != h {
        return Err(corrupt(
            src.path(),
            format!("embedding width {} != hidden size {h}", embed.cols()),
        ));
    }
    cfg.vocab = embed.rows();
    let vector = |name: String, len: usize| dev.vector(src.vector(&name, len)?);
    let linear = |i, part, rows, cols| linear(&dev, hold, src, names, i, part, rows, cols);
    let mut layers = Vec::with_capacity(cfg.layers);
    for i in 0..cfg.layers {
        let (q_norm, k_norm) = if cfg.arch == Arch::Qwen3 {
            (
                Some(vector(names.layer(i, Part::QNorm, false), hd)?),
                Some(vector(names.layer(i, Part::KNorm, false), hd)?),
            )
        } else {
            (None, None)
        };
        layers.push(DecoderLayer {
            attn_norm: vector(names.layer(i, Part::AttnNorm, false), h)?,
            attn: Attention {
                q: linear(i, Part::Q, cfg.heads * hd, h)?,
                k: linear(i, Part::K, cfg.kv_heads * hd, h)?,
                v: linear(i, Part::V, cfg.kv_heads * hd, h)?,
                o: linear(i, Part::O, h, cfg.heads * hd)?,
                q_norm,
                k_norm,
            },
            mlp_norm: vector(names.layer(i, Part::MlpNorm, false), h)?,
            mlp: Mlp {
                gate: linear(i, Part::Gate, cfg.intermediate, h)?,
                up: linear(i, Part::Up, cfg.intermediate, h)?,
                down: linear(i, Part::Down, h, cfg.intermediate)?,
            },
        });
    }
    let norm = vector(names.norm(), h)?;
    let lm_head = match (tied, src.has(&names.head())) {
        (Some(true), _) | (None, false) => None,
        (_, true) => {
            let name = names.head();
            Some(hold.weight(&dev, src, &name, src.matrix(&name)?)?)
        }
        (Some(false), false) => {
            return Err(corrupt(
                src.path(),
                "lm_head.weight missing and tie_word_embeddings is false",
            ))
        }
    };
    // Every tensor must be one the model reads: weights the config does not
    // describe (Qwen3's q/k norms under a config naming qwen2) would
    // otherwise be dropped without a word. Tolerated: a tied checkpoint's
    // own copy of the head, and RoPE frequency buffers (computed here from
    // rope_theta).
    let mut unread: Vec<String> = src
        .unread()
        .into_iter()
        .filter(|n| !(tied == Some(true) && *n == names.head()))
        .filter(|n| !n.ends_with("rotary_emb.inv_freq"))
        .collect();
    unread.sort();
    if let Some(name) = unread.first() {
        return Err(corrupt(
            src.path(),
            format!(
                "tensor {name} is not part of a {} model of {} layers (does the config name the right architecture?)",
                cfg.arch.as_str(),
                cfg.layers
            ),
        ));
    }
    let rope = dev.rope_table(hd, cfg.rope_theta, cfg.context)?;
    Ok(Model {
        embed: hold.weight(&dev, src, &names.embed(), embed)?,
        device: dev,
        cfg,
        layers,
        norm,
        lm_head,
        rope,
    })
}

// ---------------------------------------------------------------- GGUF

/// A GGUF file whose tensors are read (not mapped) as the model takes
/// them: a file truncated while it loads is then a read error, where a
/// mapped page past the end would be a SIGBUS.
struct GgufSource {
    path: PathBuf,
    content: gguf_file::Content,
    file: File,
    read: std::cell::RefCell<std::collections::HashSet<String>>,
}

impl TensorSource for GgufSource {
    fn path(&self) -> &Path {
        &self.path
    }
    fn has(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }
    fn unread(&self) -> Vec<String> {
        let read = self.read.borrow();
        self.content
            .tensor_infos
            .keys()
            .filter(|n| !read.contains(*n))
            .cloned()
            .collect()
    }
    fn matrix(&self, name: &str) -> Result<HostWeight, BackendError> {
        let info = self
            .content
            .tensor_infos
            .get(name)
            .ok_or_else(|| corrupt(&self.path, format!("missing tensor {name}")))?;
        self.read.borrow_mut().insert(name.to_string());
        let dims = info.shape.dims();
        let (rows, cols) = match dims {
            [c] => (1, *c),
            [r, c] => (*r, *c),
            _ => {
                return Err(corrupt(
                    &self.path,
                    format!("tensor {name} has shape {dims:?}"),
                ))
            }
        };
        let dtype = info.ggml_dtype;
        let bs = dtype.block_size();
        if cols % bs != 0 {
            return Err(corrupt(
                &self.path,
                format!("tensor {name}: {cols} columns do not fill {dtype:?} blocks"),
            ));
        }
        // The header check bounded every tensor's bytes by the file's size.
        let size = rows * cols / bs * dtype.type_size();
        let start = self.content.tensor_data_offset + info.offset;
        let mut bytes = vec![0u8; size];
        {
            use std::io::{Read, Seek};
            let mut f = &self.file;
            f.seek(std::io::SeekFrom::Start(start))
                .and_then(|_| f.read_exact(&mut bytes))
                .map_err(|e| match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => corrupt(
                        &self.path,
                        format!("tensor {name}: the file ends before its bytes (truncated while loading?)"),
                    ),
                    _ => io_err(&self.path, e),
                })?;
        }
        Matrix::from_ggml(dtype, rows, cols, &bytes)
            .map(HostWeight::Matrix)
            .map_err(|e| match e {
                statebench_kernels::MatrixError::UnsupportedType(t) => {
                    unsupported(&self.path, format!("tensor {name} has quant type {t}"))
                }
                other => corrupt(&self.path, format!("tensor {name}: {other}")),
            })
    }
}

fn md<'a>(
    c: &'a gguf_file::Content,
    path: &Path,
    key: &str,
) -> Result<&'a gguf_file::Value, BackendError> {
    c.metadata
        .get(key)
        .ok_or_else(|| corrupt(path, format!("missing metadata key {key}")))
}

fn md_usize(c: &gguf_file::Content, path: &Path, key: &str) -> Result<usize, BackendError> {
    use gguf_file::Value::*;
    Ok(match md(c, path, key)? {
        U8(v) => *v as usize,
        U16(v) => *v as usize,
        U32(v) => *v as usize,
        U64(v) => *v as usize,
        I8(v) if *v >= 0 => *v as usize,
        I16(v) if *v >= 0 => *v as usize,
        I32(v) if *v >= 0 => *v as usize,
        I64(v) if *v >= 0 => *v as usize,
        other => {
            return Err(corrupt(
                path,
                format!("metadata {key} is {other:?}, not a count"),
            ))
        }
    })
}

fn md_f32(c: &gguf_file::Content, key: &str, default: f32) -> f32 {
    c.metadata
        .get(key)
        .and_then(|v| {
            v.to_f32()
                .ok()
                .or_else(|| v.to_f64().ok().map(|x| x as f32))
        })
        .unwrap_or(default)
}

/// The model's shapes from GGUF metadata.
fn gguf_config(content: &gguf_file::Content, path: &Path) -> Result<Config, BackendError> {
    let arch_name = md(content, path, "general.architecture")?
        .to_string()
        .map_err(|e| corrupt(path, e.to_string()))?;
    let arch = Arch::parse(arch_name)
        .ok_or_else(|| unsupported(path, format!("architecture `{arch_name}`")))?;
    let key = |k: &str| format!("{arch_name}.{k}");
    let count = |k: &str| md_usize(content, path, &key(k));
    let hidden = count("embedding_length")?;
    let heads = count("attention.head_count")?;
    let vocab = content
        .tensor_infos
        .get("token_embd.weight")
        .map(|i| i.shape.dims()[0])
        .ok_or_else(|| corrupt(path, "missing tensor token_embd.weight"))?;
    let cfg = Config {
        arch,
        vocab,
        hidden,
        intermediate: count("feed_forward_length")?,
        layers: count("block_count")?,
        heads,
        kv_heads: count("attention.head_count_kv").unwrap_or(heads),
        head_dim: count("attention.key_length").unwrap_or(hidden / heads.max(1)),
        rope_theta: md_f32(content, &key("rope.freq_base"), 10_000.0),
        rms_eps: md_f32(content, &key("attention.layer_norm_rms_epsilon"), 1e-6),
        context: count("context_length")?,
    };
    validate(
        &cfg,
        path,
        &Keys {
            vocab: "token_embd.weight rows".into(),
            hidden: key("embedding_length"),
            intermediate: key("feed_forward_length"),
            layers: key("block_count"),
            heads: key("attention.head_count"),
            kv_heads: key("attention.head_count_kv"),
            head_dim: key("attention.key_length"),
            rope_theta: key("rope.freq_base"),
            rms_eps: key("attention.layer_norm_rms_epsilon"),
            context: key("context_length"),
        },
    )?;
    Ok(cfg)
}

fn load_gguf<D: Device>(path: &Path, device: D, hold: Holding) -> Result<Loaded<D>, BackendError> {
    super::known::verify(path)?;
    let file = File::open(path).map_err(|e| io_err(path, e))?;
    let content = super::gguf::read_header(path, &file)?;
    let cfg = gguf_config(&content, path)?;
    let tokenizer_err =
        |e: String| BackendError::Tokenizer(first_line(format!("{}: {e}", path.display())));
    let mut tokenizer = Tokenizer::from_gguf(&content).map_err(|e| tokenizer_err(e.to_string()))?;
    // A GGUF tokenizer applies no normalizer (llama.cpp and transformers' GGUF
    // conversion alike); keep agreement with them on the same file.
    tokenizer
        .with_normalizer(None::<tokenizers::NormalizerWrapper>)
        .map_err(|e| tokenizer_err(e.to_string()))?;
    let literal_tokens = user_defined_tokens(&content);
    let chat_template = md(&content, path, "tokenizer.chat_template")
        .ok()
        .and_then(|v| v.to_string().ok().cloned())
        .ok_or_else(|| corrupt(path, "no tokenizer.chat_template in the metadata"))?;
    let name = content
        .metadata
        .get("general.name")
        .and_then(|v| v.to_string().ok().cloned())
        .unwrap_or_else(|| path.display().to_string());
    let types: std::collections::BTreeSet<String> = content
        .tensor_infos
        .values()
        .map(|i| format!("{:?}", i.ggml_dtype))
        .collect();
    let format = format!("gguf ({})", Vec::from_iter(types).join(", "));
    let src = GgufSource {
        path: path.to_path_buf(),
        content,
        file,
        read: Default::default(),
    };
    Ok(Loaded {
        model: build_model(device, hold, &src, &Names { gguf: true }, cfg, None)?,
        tokenizer,
        chat_template,
        name,
        format,
        files: vec![path.to_path_buf()],
        literal_tokens,
    })
}

/// The GGUF's user-defined tokens (`tokenizer.ggml.token_type` 4).
fn user_defined_tokens(c: &gguf_file::Content) -> Vec<String> {
    const USER_DEFINED: u32 = 4;
    let (Some(gguf_file::Value::Array(types)), Some(gguf_file::Value::Array(tokens))) = (
        c.metadata.get("tokenizer.ggml.token_type"),
        c.metadata.get("tokenizer.ggml.tokens"),
    ) else {
        return Vec::new();
    };
    let ty = |v: &gguf_file::Value| match v {
        gguf_file::Value::I32(t) => u32::try_from(*t).ok(),
        gguf_file::Value::U32(t) => Some(*t),
        _ => None,
    };
    types
        .iter()
        .zip(tokens)
        .filter(|(t, _)| ty(t) == Some(USER_DEFINED))
        .filter_map(|(_, tok)| tok.to_string().ok().cloned())
        .collect()
}

/// Positions a model may declare at most (`context_length`,
/// `max_position_embeddings`): the RoPE table and the scheduler are sized by
/// it at load. 2^20 holds every Qwen release (the 1M-context ones declare
/// 1,010,000).
pub const MAX_CONTEXT: usize = 1 << 20;

/// The largest value each shape may take: beyond any released model, and
/// small enough that no product of them overflows or allocates absurdly
/// before the tensors are checked against them.
const MAX_LAYERS: usize = 1024;
const MAX_HEADS: usize = 1024;
const MAX_HEAD_DIM: usize = 1024;
const MAX_HIDDEN: usize = 1 << 16;
const MAX_INTERMEDIATE: usize = 1 << 18;
const MAX_VOCAB: usize = 1 << 22;

/// How a format names the shape keys, for messages.
struct Keys {
    vocab: String,
    hidden: String,
    intermediate: String,
    layers: String,
    heads: String,
    kv_heads: String,
    head_dim: String,
    rope_theta: String,
    rms_eps: String,
    context: String,
}

/// Refuses shapes and constants no model has, naming the key and value:
/// counts of zero or past the limits above, query heads not a multiple of
/// KV heads, an odd head size, and RMSNorm epsilons or RoPE bases that are
/// not finite and positive (the forward pass would compute NaN from them).
fn validate(cfg: &Config, path: &Path, keys: &Keys) -> Result<(), BackendError> {
    let counts = [
        (&keys.vocab, cfg.vocab, MAX_VOCAB),
        (&keys.hidden, cfg.hidden, MAX_HIDDEN),
        (&keys.intermediate, cfg.intermediate, MAX_INTERMEDIATE),
        (&keys.layers, cfg.layers, MAX_LAYERS),
        (&keys.heads, cfg.heads, MAX_HEADS),
        (&keys.kv_heads, cfg.kv_heads, MAX_HEADS),
        (&keys.head_dim, cfg.head_dim, MAX_HEAD_DIM),
    ];
    for (key, v, max) in counts {
        if v == 0 {
            return Err(corrupt(path, format!("{key} is 0")));
        }
        if v > max {
            return Err(unsupported(
                path,
                format!("{key} = {v}, more than the engine's limit of {max}"),
            ));
        }
    }
    if cfg.context == 0 {
        return Err(corrupt(path, format!("{} is 0", keys.context)));
    }
    if cfg.context > MAX_CONTEXT {
        return Err(unsupported(
            path,
            format!(
                "{} = {}, more than the engine's limit of {MAX_CONTEXT} positions",
                keys.context, cfg.context
            ),
        ));
    }
    if !cfg.heads.is_multiple_of(cfg.kv_heads) {
        return Err(corrupt(
            path,
            format!(
                "{} = {} is not a multiple of {} = {}",
                keys.heads, cfg.heads, keys.kv_heads, cfg.kv_heads
            ),
        ));
    }
    if !cfg.head_dim.is_multiple_of(2) {
        return Err(corrupt(
            path,
            format!(
                "{} = {} is odd (RoPE rotates pairs)",
                keys.head_dim, cfg.head_dim
            ),
        ));
    }
    for (key, v) in [
        (&keys.rope_theta, cfg.rope_theta),
        (&keys.rms_eps, cfg.rms_eps),
    ] {
        if !(v.is_finite() && v > 0.0) {
            return Err(corrupt(
                path,
                format!("{key} = {v}, not a finite positive number"),
            ));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- safetensors

/// A safetensors tensor: where its bytes are, not yet read.
struct StTensor {
    file: usize,
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    bytes: std::ops::Range<usize>,
}

struct StSource {
    path: PathBuf,
    maps: Vec<memmap2::Mmap>,
    // Tensors move out as the model takes them, each read from its file's
    // map and its pages then released, so a checkpoint is held once.
    tensors: std::cell::RefCell<HashMap<String, StTensor>>,
}

impl TensorSource for StSource {
    fn path(&self) -> &Path {
        &self.path
    }
    fn has(&self, name: &str) -> bool {
        self.tensors.borrow().contains_key(name)
    }
    fn unread(&self) -> Vec<String> {
        self.tensors.borrow().keys().cloned().collect()
    }
    fn matrix(&self, name: &str) -> Result<HostWeight, BackendError> {
        let t = self
            .tensors
            .borrow_mut()
            .remove(name)
            .ok_or_else(|| corrupt(&self.path, format!("missing tensor {name}")))?;
        let (rows, cols) = match t.shape.as_slice() {
            [c] => (1, *c),
            [r, c] => (*r, *c),
            s => {
                return Err(corrupt(
                    &self.path,
                    format!("tensor {name} has shape {s:?}"),
                ))
            }
        };
        let map = &self.maps[t.file];
        let bytes = &map[t.bytes.clone()];
        let bad = |e: String| corrupt(&self.path, format!("tensor {name}: {e}"));
        // bf16 stays bits (a GPU takes them as they are); f16 and f32 are
        // read as the GGUF path reads them.
        let weight = match t.dtype {
            safetensors::Dtype::BF16 => {
                let bits: Vec<u16> = bytes
                    .chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]]))
                    .collect();
                if bits.len() != rows * cols {
                    return Err(bad(format!(
                        "{} values for a {rows}x{cols} matrix",
                        bits.len()
                    )));
                }
                HostWeight::Bf16 { rows, cols, bits }
            }
            dtype => {
                let dtype = if dtype == safetensors::Dtype::F16 {
                    GgmlDType::F16
                } else {
                    GgmlDType::F32
                };
                HostWeight::Matrix(
                    Matrix::from_ggml(dtype, rows, cols, bytes).map_err(|e| bad(e.to_string()))?,
                )
            }
        };
        // SAFETY: a read-only private map of a file nothing writes: dropped
        // pages read back from the file if touched again.
        unsafe {
            map.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                t.bytes.start,
                t.bytes.len(),
            )
        }
        .map_err(|e| io_err(&self.path, e))?;
        Ok(weight)
    }
}

/// The fields of a Hugging Face `config.json` the engine reads.
#[derive(Deserialize)]
struct HfConfig {
    model_type: String,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rope_theta: Option<f64>,
    /// Newer configs keep `rope_theta` here.
    rope_parameters: Option<RopeParameters>,
    rms_norm_eps: Option<f64>,
    max_position_embeddings: Option<usize>,
    #[serde(default)]
    tie_word_embeddings: bool,
}

#[derive(Deserialize)]
struct RopeParameters {
    rope_theta: Option<f64>,
}

impl HfConfig {
    fn config(&self, path: &Path) -> Result<Config, BackendError> {
        let arch = Arch::parse(&self.model_type).ok_or_else(|| {
            unsupported(
                path,
                format!("architecture (model_type) `{}`", self.model_type),
            )
        })?;
        let heads = self.num_attention_heads;
        let rope_theta = self
            .rope_theta
            .or_else(|| self.rope_parameters.as_ref().and_then(|r| r.rope_theta));
        let cfg = Config {
            arch,
            vocab: self.vocab_size,
            hidden: self.hidden_size,
            intermediate: self.intermediate_size,
            layers: self.num_hidden_layers,
            heads,
            kv_heads: self.num_key_value_heads.unwrap_or(heads),
            head_dim: self.head_dim.unwrap_or(self.hidden_size / heads.max(1)),
            rope_theta: rope_theta.unwrap_or(10_000.0) as f32,
            rms_eps: self.rms_norm_eps.unwrap_or(1e-6) as f32,
            context: self.max_position_embeddings.unwrap_or(32_768),
        };
        validate(
            &cfg,
            path,
            &Keys {
                vocab: "vocab_size".into(),
                hidden: "hidden_size".into(),
                intermediate: "intermediate_size".into(),
                layers: "num_hidden_layers".into(),
                heads: "num_attention_heads".into(),
                kv_heads: "num_key_value_heads".into(),
                head_dim: "head_dim".into(),
                rope_theta: "rope_theta".into(),
                rms_eps: "rms_norm_eps".into(),
                context: "max_position_embeddings".into(),
            },
        )?;
        Ok(cfg)
    }
}

/// Reads every `*.safetensors` file of a directory (f32, bf16 and f16 kept
/// as they are).
fn read_safetensors(dir: &Path) -> Result<(StSource, Vec<PathBuf>, String), BackendError> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| io_err(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    let Some(first) = files.first().cloned() else {
        return Err(BackendError::MissingFile {
            path: dir.join("model.safetensors"),
            hint: "the model directory has no *.safetensors file".into(),
        });
    };
    let mut tensors = HashMap::new();
    let mut dtypes = std::collections::BTreeSet::new();
    let mut maps = Vec::new();
    for (i, f) in files.iter().enumerate() {
        let file = File::open(f).map_err(|e| io_err(f, e))?;
        // SAFETY: read-only map of a weight file the engine never writes.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| io_err(f, e))?;
        let st = safetensors::SafeTensors::deserialize(&map)
            .map_err(|e| corrupt(f, format!("not a readable safetensors file: {e}")))?;
        for (name, view) in st.tensors() {
            use safetensors::Dtype;
            if !matches!(view.dtype(), Dtype::F32 | Dtype::BF16 | Dtype::F16) {
                return Err(unsupported(
                    f,
                    format!("tensor {name} has dtype {:?}", view.dtype()),
                ));
            }
            let start = view.data().as_ptr() as usize - map.as_ptr() as usize;
            dtypes.insert(format!("{:?}", view.dtype()).to_lowercase());
            tensors.insert(
                name,
                StTensor {
                    file: i,
                    dtype: view.dtype(),
                    shape: view.shape().to_vec(),
                    bytes: start..start + view.data().len(),
                },
            );
        }
        drop(st);
        maps.push(map);
    }
    let format = format!("safetensors ({})", Vec::from_iter(dtypes).join(", "));
    let src = StSource {
        path: first,
        maps,
        tensors: std::cell::RefCell::new(tensors),
    };
    Ok((src, files, format))
}

fn load_safetensors_dir<D: Device>(
    dir: &Path,
    spec: &str,
    device: D,
    hold: Holding,
) -> Result<Loaded<D>, BackendError> {
    let config_path = dir.join("config.json");
    if !config_path.is_file() {
        return Err(BackendError::MissingFile {
            path: config_path,
            hint: "a model directory needs config.json, tokenizer.json and *.safetensors".into(),
        });
    }
    let hf: HfConfig = read_json(&config_path)?;
    let cfg = hf.config(&config_path)?;
    let (src, files, format) = read_safetensors(dir)?;
    let names = Names { gguf: false };
    let model = build_model(
        device,
        hold,
        &src,
        &names,
        cfg,
        Some(hf.tie_word_embeddings),
    )?;

    let tok_path = dir.join("tokenizer.json");
    if !tok_path.is_file() {
        return Err(BackendError::MissingFile {
            path: tok_path,
            hint: "the model directory needs tokenizer.json".into(),
        });
    }
    let tokenizer = Tokenizer::from_file(&tok_path)
        .map_err(|e| BackendError::Tokenizer(format!("{}: {e}", tok_path.display())))?;
    let name = if Path::new(spec).is_dir() {
        dir.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| spec.to_string())
    } else {
        spec.to_string()
    };
    Ok(Loaded {
        model,
        tokenizer,
        chat_template: dir_chat_template(dir)?,
        name,
        format,
        files,
        literal_tokens: Vec::new(),
    })
}

/// The chat template of `tokenizer_config.json`: one string, or a list of
/// named templates.
#[derive(Deserialize)]
struct TokenizerConfig {
    chat_template: Option<ChatTemplates>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ChatTemplates {
    One(String),
    Named(Vec<NamedTemplate>),
}

#[derive(Deserialize)]
struct NamedTemplate {
    name: Option<String>,
    template: String,
}

/// The template in `chat_template.jinja`, else the one `tokenizer_config.json`
/// names `default` (or its first).
fn dir_chat_template(dir: &Path) -> Result<String, BackendError> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        return read_to_string(&jinja);
    }
    let tc = dir.join("tokenizer_config.json");
    if !tc.is_file() {
        return Err(BackendError::MissingFile {
            path: tc,
            hint: "the model directory needs tokenizer_config.json with a chat_template".into(),
        });
    }
    match read_json::<TokenizerConfig>(&tc)?.chat_template {
        Some(ChatTemplates::One(s)) => Ok(s),
        Some(ChatTemplates::Named(list)) => {
            let default = list
                .iter()
                .position(|t| t.name.as_deref() == Some("default"));
            list.into_iter()
                .nth(default.unwrap_or(0))
                .map(|t| t.template)
                .ok_or_else(|| corrupt(&tc, "chat_template list has no template"))
        }
        None => Err(corrupt(&tc, "no chat_template")),
    }
}
