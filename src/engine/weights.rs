//! Loading weights, tokenizer and chat template from a GGUF file, a local
//! safetensors directory, or a Hugging Face id in the local hub cache.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file;
use candle_core::quantized::tokenizer::TokenizerFromGguf;
use candle_core::quantized::GgmlDType;
use statebench_kernels::{Matrix, RopeTable};
use tokenizers::Tokenizer;

use super::model::{Arch, Attention, Config, Layer, Linear, Mlp, Model};
use crate::backend::BackendError;

/// Everything read from a model's files.
pub struct Loaded {
    /// The model.
    pub model: Model,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
    /// Its chat template source (Jinja).
    pub chat_template: String,
    /// Name from the metadata.
    pub name: String,
    /// Storage format, for the model identity.
    pub format: String,
    /// Weight files, hashed for the model identity.
    pub files: Vec<PathBuf>,
}

/// Loads a model from a GGUF file, a safetensors directory, or a hub id.
pub fn load(spec: &str) -> Result<Loaded, BackendError> {
    let path = Path::new(spec);
    if path.is_dir() {
        return load_safetensors_dir(path, spec);
    }
    if path.is_file() {
        return load_gguf(path);
    }
    if looks_like_hub_id(spec) {
        let dir = resolve_hub_id(spec)?;
        return load_safetensors_dir(&dir, spec);
    }
    Err(BackendError::MissingFile {
        path: path.to_path_buf(),
        hint:
            "pass a .gguf file, a directory with config.json and safetensors, or a Hugging Face id"
                .into(),
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
        let api = hf_hub::api::sync::ApiBuilder::from_env()
            .with_progress(true)
            .build()
            .map_err(|e| missing(file, format!("cannot reach the Hugging Face hub: {e}")))?;
        api.model(id.to_string())
            .get(file)
            .map_err(|e| missing(file, format!("download failed: {e}")))
    };
    let config = fetch("config.json")?;
    fetch("tokenizer.json")?;
    fetch("tokenizer_config.json")?;
    if fetch("model.safetensors").is_err() {
        let index = fetch("model.safetensors.index.json")?;
        let text = read_to_string(&index)?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| corrupt(&index, e.to_string()))?;
        let mut shards: Vec<&str> = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .map(|m| m.values().filter_map(|v| v.as_str()).collect())
            .unwrap_or_default();
        shards.sort();
        shards.dedup();
        for shard in shards {
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

fn read_to_string(path: &Path) -> Result<String, BackendError> {
    std::fs::read_to_string(path).map_err(|e| io_err(path, e))
}

fn io_err(path: &Path, e: std::io::Error) -> BackendError {
    if e.kind() == std::io::ErrorKind::NotFound {
        BackendError::MissingFile {
            path: path.to_path_buf(),
            hint: "check the path".into(),
        }
    } else {
        BackendError::Io {
            path: path.to_path_buf(),
            cause: e.to_string(),
        }
    }
}

fn corrupt(path: &Path, cause: impl Into<String>) -> BackendError {
    BackendError::CorruptWeights {
        path: path.to_path_buf(),
        cause: first_line(cause.into()),
    }
}

/// Library errors may carry a backtrace after the message; keep the message.
fn first_line(s: String) -> String {
    s.lines().next().unwrap_or_default().trim().to_string()
}

fn unsupported(path: &Path, cause: impl Into<String>) -> BackendError {
    BackendError::Unsupported {
        path: path.to_path_buf(),
        cause: first_line(cause.into()),
    }
}

/// Where weights come from: a name → (rows, cols, matrix) source.
trait Source {
    fn path(&self) -> &Path;
    fn has(&self, name: &str) -> bool;
    fn matrix(&self, name: &str) -> Result<Matrix, BackendError>;
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
    fn layer(&self, i: usize, part: &str) -> String {
        if self.gguf {
            let p = match part {
                "attn_norm" => "attn_norm.weight",
                "mlp_norm" => "ffn_norm.weight",
                "q.weight" => "attn_q.weight",
                "k.weight" => "attn_k.weight",
                "v.weight" => "attn_v.weight",
                "o.weight" => "attn_output.weight",
                "q.bias" => "attn_q.bias",
                "k.bias" => "attn_k.bias",
                "v.bias" => "attn_v.bias",
                "o.bias" => "attn_output.bias",
                "q_norm" => "attn_q_norm.weight",
                "k_norm" => "attn_k_norm.weight",
                "gate.weight" => "ffn_gate.weight",
                "up.weight" => "ffn_up.weight",
                "down.weight" => "ffn_down.weight",
                other => other,
            };
            format!("blk.{i}.{p}")
        } else {
            let p = match part {
                "attn_norm" => "input_layernorm.weight",
                "mlp_norm" => "post_attention_layernorm.weight",
                "q.weight" => "self_attn.q_proj.weight",
                "k.weight" => "self_attn.k_proj.weight",
                "v.weight" => "self_attn.v_proj.weight",
                "o.weight" => "self_attn.o_proj.weight",
                "q.bias" => "self_attn.q_proj.bias",
                "k.bias" => "self_attn.k_proj.bias",
                "v.bias" => "self_attn.v_proj.bias",
                "o.bias" => "self_attn.o_proj.bias",
                "q_norm" => "self_attn.q_norm.weight",
                "k_norm" => "self_attn.k_norm.weight",
                "gate.weight" => "mlp.gate_proj.weight",
                "up.weight" => "mlp.up_proj.weight",
                "down.weight" => "mlp.down_proj.weight",
                other => other,
            };
            format!("model.layers.{i}.{p}")
        }
    }
}

fn linear(
    src: &dyn Source,
    names: &Names,
    i: usize,
    part: &str,
    rows: usize,
    cols: usize,
) -> Result<Linear, BackendError> {
    let wname = names.layer(i, &format!("{part}.weight"));
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
    let bname = names.layer(i, &format!("{part}.bias"));
    let b = if src.has(&bname) {
        Some(src.vector(&bname, rows)?)
    } else {
        None
    };
    Ok(Linear { w, b })
}

fn build_model(src: &dyn Source, names: &Names, cfg: Config) -> Result<Model, BackendError> {
    let (h, hd) = (cfg.hidden, cfg.head_dim);
    let embed = src.matrix(&names.embed())?;
    if embed.cols() != h {
        return Err(corrupt(
            src.path(),
            format!("embedding width {} != hidden size {h}", embed.cols()),
        ));
    }
    let mut layers = Vec::with_capacity(cfg.layers);
    for i in 0..cfg.layers {
        let (q_norm, k_norm) = if cfg.arch == Arch::Qwen3 {
            (
                Some(src.vector(&names.layer(i, "q_norm"), hd)?),
                Some(src.vector(&names.layer(i, "k_norm"), hd)?),
            )
        } else {
            (None, None)
        };
        layers.push(Layer {
            attn_norm: src.vector(&names.layer(i, "attn_norm"), h)?,
            attn: Attention {
                q: linear(src, names, i, "q", cfg.heads * hd, h)?,
                k: linear(src, names, i, "k", cfg.kv_heads * hd, h)?,
                v: linear(src, names, i, "v", cfg.kv_heads * hd, h)?,
                o: linear(src, names, i, "o", h, cfg.heads * hd)?,
                q_norm,
                k_norm,
            },
            mlp_norm: src.vector(&names.layer(i, "mlp_norm"), h)?,
            mlp: Mlp {
                gate: linear(src, names, i, "gate", cfg.intermediate, h)?,
                up: linear(src, names, i, "up", cfg.intermediate, h)?,
                down: linear(src, names, i, "down", h, cfg.intermediate)?,
            },
        });
    }
    let norm = src.vector(&names.norm(), h)?;
    let lm_head = if src.has(&names.head()) {
        Some(src.matrix(&names.head())?)
    } else {
        None
    };
    let rope = RopeTable::new(hd, cfg.rope_theta, cfg.context);
    Ok(Model {
        cfg,
        embed,
        layers,
        norm,
        lm_head,
        rope,
    })
}

// ---------------------------------------------------------------- GGUF

struct GgufSource {
    path: PathBuf,
    content: gguf_file::Content,
    map: memmap2::Mmap,
}

impl Source for GgufSource {
    fn path(&self) -> &Path {
        &self.path
    }
    fn has(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }
    fn matrix(&self, name: &str) -> Result<Matrix, BackendError> {
        let info = self
            .content
            .tensor_infos
            .get(name)
            .ok_or_else(|| corrupt(&self.path, format!("missing tensor {name}")))?;
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
        let size = rows * cols / bs * dtype.type_size();
        let start = self.content.tensor_data_offset as usize + info.offset as usize;
        let end = start.saturating_add(size);
        if end > self.map.len() {
            return Err(corrupt(
                &self.path,
                format!(
                    "tensor {name} needs bytes {start}..{end} but the file has {} (truncated download?)",
                    self.map.len()
                ),
            ));
        }
        Matrix::from_ggml(dtype, rows, cols, &self.map[start..end]).map_err(|e| match e {
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

fn load_gguf(path: &Path) -> Result<Loaded, BackendError> {
    let file = File::open(path).map_err(|e| io_err(path, e))?;
    let mut reader = std::io::BufReader::new(&file);
    let content = gguf_file::Content::read(&mut reader)
        .map_err(|e| corrupt(path, format!("not a readable GGUF file: {e}")))?;
    // SAFETY: the file is opened read-only; the engine never writes model files.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| io_err(path, e))?;
    let arch_name = md(&content, path, "general.architecture")?
        .to_string()
        .map_err(|e| corrupt(path, e.to_string()))?
        .clone();
    let arch = match arch_name.as_str() {
        "qwen2" => Arch::Qwen2,
        "qwen3" => Arch::Qwen3,
        other => return Err(unsupported(path, format!("architecture `{other}`"))),
    };
    let a = arch_name.as_str();
    let hidden = md_usize(&content, path, &format!("{a}.embedding_length"))?;
    let heads = md_usize(&content, path, &format!("{a}.attention.head_count"))?;
    let vocab = content
        .tensor_infos
        .get("token_embd.weight")
        .map(|i| i.shape.dims()[0])
        .ok_or_else(|| corrupt(path, "missing tensor token_embd.weight"))?;
    let cfg = Config {
        arch,
        vocab,
        hidden,
        intermediate: md_usize(&content, path, &format!("{a}.feed_forward_length"))?,
        layers: md_usize(&content, path, &format!("{a}.block_count"))?,
        heads,
        kv_heads: md_usize(&content, path, &format!("{a}.attention.head_count_kv"))
            .unwrap_or(heads),
        head_dim: md_usize(&content, path, &format!("{a}.attention.key_length"))
            .unwrap_or(hidden / heads.max(1)),
        rope_theta: md_f32(&content, &format!("{a}.rope.freq_base"), 10_000.0),
        rms_eps: md_f32(
            &content,
            &format!("{a}.attention.layer_norm_rms_epsilon"),
            1e-6,
        ),
        context: md_usize(&content, path, &format!("{a}.context_length"))?,
    };
    validate(&cfg, path)?;
    let mut tokenizer = Tokenizer::from_gguf(&content)
        .map_err(|e| BackendError::Tokenizer(first_line(format!("{}: {e}", path.display()))))?;
    // A GGUF tokenizer applies no normalizer (llama.cpp and transformers' GGUF
    // conversion alike); keep agreement with them on the same file.
    tokenizer
        .with_normalizer(None::<tokenizers::NormalizerWrapper>)
        .map_err(|e| BackendError::Tokenizer(first_line(format!("{}: {e}", path.display()))))?;
    let chat_template = md(&content, path, "tokenizer.chat_template")
        .ok()
        .and_then(|v| v.to_string().ok().cloned())
        .ok_or_else(|| corrupt(path, "no tokenizer.chat_template in the metadata"))?;
    let name = content
        .metadata
        .get("general.name")
        .and_then(|v| v.to_string().ok().cloned())
        .unwrap_or_else(|| path.display().to_string());
    let mut types: Vec<String> = content
        .tensor_infos
        .values()
        .map(|i| format!("{:?}", i.ggml_dtype))
        .collect();
    types.sort();
    types.dedup();
    let src = GgufSource {
        path: path.to_path_buf(),
        content,
        map,
    };
    let model = build_model(&src, &Names { gguf: true }, cfg)?;
    Ok(Loaded {
        model,
        tokenizer,
        chat_template,
        name,
        format: format!("gguf ({})", types.join(", ")),
        files: vec![path.to_path_buf()],
    })
}

fn validate(cfg: &Config, path: &Path) -> Result<(), BackendError> {
    if cfg.heads == 0
        || cfg.kv_heads == 0
        || !cfg.heads.is_multiple_of(cfg.kv_heads)
        || !cfg.head_dim.is_multiple_of(2)
        || cfg.layers == 0
        || cfg.context == 0
    {
        return Err(corrupt(path, format!("inconsistent model shape {cfg:?}")));
    }
    Ok(())
}

// ---------------------------------------------------------------- safetensors

/// A safetensors tensor converted to f32: shape and values.
type StTensor = (Vec<usize>, Vec<f32>);

struct StSource {
    path: PathBuf,
    // Tensors move out as the model takes them, so weights are never held twice.
    tensors: std::cell::RefCell<HashMap<String, StTensor>>,
}

impl Source for StSource {
    fn path(&self) -> &Path {
        &self.path
    }
    fn has(&self, name: &str) -> bool {
        self.tensors.borrow().contains_key(name)
    }
    fn matrix(&self, name: &str) -> Result<Matrix, BackendError> {
        let (shape, data) = self
            .tensors
            .borrow_mut()
            .remove(name)
            .ok_or_else(|| corrupt(&self.path, format!("missing tensor {name}")))?;
        let (rows, cols) = match shape.as_slice() {
            [c] => (1, *c),
            [r, c] => (*r, *c),
            s => {
                return Err(corrupt(
                    &self.path,
                    format!("tensor {name} has shape {s:?}"),
                ))
            }
        };
        Matrix::from_f32(rows, cols, data)
            .map_err(|e| corrupt(&self.path, format!("tensor {name}: {e}")))
    }
}

fn cfg_usize(j: &serde_json::Value, key: &str) -> Option<usize> {
    j.get(key).and_then(|v| v.as_u64()).map(|v| v as usize)
}

fn load_safetensors_dir(dir: &Path, spec: &str) -> Result<Loaded, BackendError> {
    let config_path = dir.join("config.json");
    if !config_path.is_file() {
        return Err(BackendError::MissingFile {
            path: config_path,
            hint: "a model directory needs config.json, tokenizer.json and *.safetensors".into(),
        });
    }
    let j: serde_json::Value = serde_json::from_str(&read_to_string(&config_path)?)
        .map_err(|e| corrupt(&config_path, format!("invalid JSON: {e}")))?;
    let model_type = j
        .get("model_type")
        .and_then(|v| v.as_str())
        .unwrap_or("")
        .to_string();
    let arch = match model_type.as_str() {
        "qwen2" => Arch::Qwen2,
        "qwen3" => Arch::Qwen3,
        other => {
            return Err(unsupported(
                &config_path,
                format!("architecture (model_type) `{other}`"),
            ))
        }
    };
    let need = |k: &str| {
        cfg_usize(&j, k).ok_or_else(|| corrupt(&config_path, format!("missing or invalid {k}")))
    };
    let hidden = need("hidden_size")?;
    let heads = need("num_attention_heads")?;
    let cfg = Config {
        arch,
        vocab: need("vocab_size")?,
        hidden,
        intermediate: need("intermediate_size")?,
        layers: need("num_hidden_layers")?,
        heads,
        kv_heads: cfg_usize(&j, "num_key_value_heads").unwrap_or(heads),
        head_dim: cfg_usize(&j, "head_dim").unwrap_or(hidden / heads.max(1)),
        rope_theta: j
            .get("rope_theta")
            .or_else(|| j.get("rope_parameters").and_then(|r| r.get("rope_theta")))
            .and_then(|v| v.as_f64())
            .unwrap_or(10_000.0) as f32,
        rms_eps: j
            .get("rms_norm_eps")
            .and_then(|v| v.as_f64())
            .unwrap_or(1e-6) as f32,
        context: cfg_usize(&j, "max_position_embeddings").unwrap_or(32_768),
    };
    validate(&cfg, &config_path)?;
    let tied = j
        .get("tie_word_embeddings")
        .and_then(|v| v.as_bool())
        .unwrap_or(false);

    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| io_err(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(BackendError::MissingFile {
            path: dir.join("model.safetensors"),
            hint: "the model directory has no *.safetensors file".into(),
        });
    }
    let mut tensors = HashMap::new();
    let mut dtypes = std::collections::BTreeSet::new();
    for f in &files {
        let file = File::open(f).map_err(|e| io_err(f, e))?;
        // SAFETY: read-only map of a weight file the engine never writes.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| io_err(f, e))?;
        let st = safetensors::SafeTensors::deserialize(&map)
            .map_err(|e| corrupt(f, format!("not a readable safetensors file: {e}")))?;
        for (name, view) in st.tensors() {
            use safetensors::Dtype;
            let bytes = view.data();
            let data: Vec<f32> = match view.dtype() {
                Dtype::F32 => bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
                Dtype::BF16 => bytes
                    .chunks_exact(2)
                    .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
                Dtype::F16 => bytes
                    .chunks_exact(2)
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
                other => return Err(unsupported(f, format!("tensor {name} has dtype {other:?}"))),
            };
            dtypes.insert(format!("{:?}", view.dtype()).to_lowercase());
            tensors.insert(name, (view.shape().to_vec(), data));
        }
    }
    let src = StSource {
        path: files[0].clone(),
        tensors: std::cell::RefCell::new(tensors),
    };
    let names = Names { gguf: false };
    let mut model = build_model(&src, &names, cfg)?;
    if tied {
        model.lm_head = None;
    } else if model.lm_head.is_none() {
        return Err(corrupt(
            &files[0],
            "lm_head.weight missing and tie_word_embeddings is false",
        ));
    }

    let tok_path = dir.join("tokenizer.json");
    if !tok_path.is_file() {
        return Err(BackendError::MissingFile {
            path: tok_path,
            hint: "the model directory needs tokenizer.json".into(),
        });
    }
    let tokenizer = Tokenizer::from_file(&tok_path)
        .map_err(|e| BackendError::Tokenizer(format!("{}: {e}", tok_path.display())))?;
    let chat_template = dir_chat_template(dir)?;
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
        chat_template,
        name,
        format: format!(
            "safetensors ({})",
            dtypes.into_iter().collect::<Vec<_>>().join(", ")
        ),
        files,
    })
}

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
    let j: serde_json::Value = serde_json::from_str(&read_to_string(&tc)?)
        .map_err(|e| corrupt(&tc, format!("invalid JSON: {e}")))?;
    match j.get("chat_template") {
        Some(serde_json::Value::String(s)) => Ok(s.clone()),
        Some(serde_json::Value::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .or_else(|| list.first())
            .and_then(|t| t.get("template").and_then(|s| s.as_str()))
            .map(str::to_string)
            .ok_or_else(|| corrupt(&tc, "chat_template list has no template")),
        _ => Err(corrupt(&tc, "no chat_template")),
    }
}

/// Whether a GGUF type name is one this engine multiplies natively.
pub fn supported_ggml(dtype: GgmlDType) -> bool {
    matches!(
        dtype,
        GgmlDType::F32
            | GgmlDType::F16
            | GgmlDType::BF16
            | GgmlDType::Q4_0
            | GgmlDType::Q4_1
            | GgmlDType::Q5_0
            | GgmlDType::Q5_1
            | GgmlDType::Q8_0
            | GgmlDType::Q4K
            | GgmlDType::Q5K
            | GgmlDType::Q6K
    )
}
