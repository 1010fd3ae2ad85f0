//! The Qwen2 / Qwen3 dense forward pass over a ragged batch, one plain
//! struct per layer, written once against the [`Device`] kernel interface.
//!
//! One forward call takes a ragged batch: each item is one sequence's new
//! tokens (a whole uncached prompt, or the single token being decoded) and its
//! KV cache. All rows of all items go through the matrix products together;
//! attention runs per row over that row's own sequence.

use super::device::{BatchRows, Device, Heads, Next, NON_FINITE};
use super::kv_cache::{KvCache, KvStore};
use crate::backend::BackendError;

/// Which member of the Qwen family the weights are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Qwen2 / Qwen2.5: biases on q, k, v.
    Qwen2,
    /// Qwen3 dense: RMSNorm on q and k per head, no biases.
    Qwen3,
}

impl Arch {
    /// The architecture a model file names (`general.architecture`, `model_type`).
    pub fn parse(name: &str) -> Option<Arch> {
        match name {
            "qwen2" => Some(Arch::Qwen2),
            "qwen3" => Some(Arch::Qwen3),
            _ => None,
        }
    }

    /// The architecture's name as the model files spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
        }
    }
}

/// Shapes and constants of a model, read from its files.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub arch: Arch,
    /// Rows of the embedding.
    pub vocab: usize,
    pub hidden: usize,
    /// Width of the MLP's gate and up projections.
    pub intermediate: usize,
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rope_theta: f32,
    pub rms_eps: f32,
    /// Context length the model was trained for (or the cap the engine set).
    pub context: usize,
}

impl Config {
    /// Bytes of KV cache one token occupies (f32 keys and values, all layers).
    pub fn kv_bytes_per_token(&self) -> usize {
        self.layers * 2 * self.kv_heads * self.head_dim * 4
    }

    /// Multiply-accumulates of one token's matrix products in the decoder
    /// layers: q, k, v, o, gate, up and down (attention over the cache aside).
    pub fn layer_macs_per_token(&self) -> usize {
        let (h, i) = (self.hidden, self.intermediate);
        let (q, kv) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
        self.layers * (2 * h * q + 2 * h * kv + 3 * h * i)
    }

    /// Multiply-accumulates of the output head for one row it scores.
    pub fn head_macs(&self) -> usize {
        self.hidden * self.vocab
    }

    /// Head counts and size.
    pub fn heads(&self) -> Heads {
        Heads {
            q: self.heads,
            kv: self.kv_heads,
            dim: self.head_dim,
        }
    }
}

/// A projection `y = x Wᵀ (+ b)`.
pub struct Linear<D: Device> {
    /// Weight, `out × in`.
    pub w: D::Weight,
    /// Bias, `out` (Qwen2's q, k, v).
    pub b: Option<D::Vector>,
}

impl<D: Device> Linear<D> {
    pub(crate) fn forward(&self, dev: &D, x: &D::Act) -> D::Act {
        let mut y = dev.matmul(&self.w, x);
        if let Some(b) = &self.b {
            dev.add_bias(&mut y, b);
        }
        y
    }

    /// Projections of the same input, run together where the device can
    /// ([`Device::matmul_each`]); the same results as one `forward` each.
    pub(crate) fn forward_each<const N: usize>(
        dev: &D,
        ls: [&Linear<D>; N],
        x: &D::Act,
    ) -> [D::Act; N] {
        let ys = dev.matmul_each(&ls.map(|l| &l.w), x);
        let mut ys: [D::Act; N] = match ys.try_into() {
            Ok(ys) => ys,
            Err(_) => panic!("matmul_each: one output per matrix"),
        };
        for (y, l) in ys.iter_mut().zip(ls) {
            if let Some(b) = &l.b {
                dev.add_bias(y, b);
            }
        }
        ys
    }
}

/// What one layer's attention needs besides its weights: the batch's items
/// and row layout, and the model's shared constants.
pub struct Step<'s, 'a, D: Device> {
    /// The batch's sequences.
    pub items: &'s mut [BatchItem<'a, D::Cache>],
    /// Item and position of every row.
    pub rows: &'s BatchRows,
    /// Head counts and size.
    pub heads: Heads,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// RoPE table.
    pub rope: &'s D::Rope,
}

/// Grouped-query self-attention of one layer.
pub struct Attention<D: Device> {
    pub q: Linear<D>,
    pub k: Linear<D>,
    pub v: Linear<D>,
    pub o: Linear<D>,
    /// Qwen3 normalises each query and key head before RoPE.
    pub q_norm: Option<D::Vector>,
    pub k_norm: Option<D::Vector>,
}

/// q, k and v of `h`, Qwen3's q/k norms, RoPE, and k and v written to
/// every item's cache, one operation at a time; returns q. What
/// [`Device::attention_inputs`] does unless a device fuses it.
pub(crate) fn attention_inputs<D: Device>(
    dev: &D,
    attn: &Attention<D>,
    h: &D::Act,
    layer: usize,
    s: &mut Step<'_, '_, D>,
) -> D::Act {
    let Heads { q: nh, kv: nkv, .. } = s.heads;
    // rows × (nh · dim), rows × (nkv · dim), rows × (nkv · dim)
    let [mut q, mut k, v] = Linear::forward_each(dev, [&attn.q, &attn.k, &attn.v], h);
    if let (Some(qn), Some(kn)) = (&attn.q_norm, &attn.k_norm) {
        q = dev.rms_norm(&q, qn, s.eps);
        k = dev.rms_norm(&k, kn, s.eps);
    }
    dev.rope(&mut q, nh, &s.rows.pos, s.rope);
    dev.rope(&mut k, nkv, &s.rows.pos, s.rope);
    let mut caches: Vec<&mut D::Cache> = s.items.iter_mut().map(|it| &mut *it.cache).collect();
    dev.kv_write(&mut caches, layer, &k, &v, s.rows, s.heads);
    q
}

/// The SwiGLU MLP of one layer.
pub struct Mlp<D: Device> {
    pub gate: Linear<D>,
    pub up: Linear<D>,
    pub down: Linear<D>,
}

impl<D: Device> Mlp<D> {
    pub(crate) fn forward(&self, dev: &D, h: &D::Act) -> D::Act {
        // rows × intermediate, each
        let [mut g, u] = Linear::forward_each(dev, [&self.gate, &self.up], h);
        dev.silu_mul(&mut g, &u);
        self.down.forward(dev, &g)
    }
}

/// One decoder layer: pre-norm attention and MLP, each added to the residual.
pub struct DecoderLayer<D: Device> {
    pub attn_norm: D::Vector,
    pub attn: Attention<D>,
    pub mlp_norm: D::Vector,
    pub mlp: Mlp<D>,
}

impl<D: Device> DecoderLayer<D> {
    fn forward(&self, dev: &D, x: &mut D::Act, layer: usize, s: &mut Step<'_, '_, D>) {
        let h = dev.rms_norm(x, &self.attn_norm, s.eps);
        let q = dev.attention_inputs(&self.attn, &h, layer, s); // rows × (heads · dim)
        let caches: Vec<&D::Cache> = s.items.iter().map(|it| &*it.cache).collect();
        let att = dev.attention(&q, &caches, layer, s.rows, s.heads);
        dev.project_add(&self.attn.o, &att, x);
        let h = dev.rms_norm(x, &self.mlp_norm, s.eps);
        dev.mlp_add(&self.mlp, &h, x);
    }
}

/// A whole model on one device.
pub struct Model<D: Device> {
    pub cfg: Config,
    pub device: D,
    /// Token embedding, `vocab × hidden`.
    pub embed: D::Weight,
    pub layers: Vec<DecoderLayer<D>>,
    /// Final RMSNorm.
    pub norm: D::Vector,
    /// Output head, `vocab × hidden`; `None` when tied to the embedding.
    pub lm_head: Option<D::Weight>,
    pub rope: D::Rope,
}

/// The logits of an item's fed positions before its last, one row each.
pub type EarlierRows = Vec<Vec<f32>>;

/// One item of a ragged batch: new tokens for one sequence and its cache.
pub struct BatchItem<'a, C = KvCache> {
    /// Tokens to append, at positions `cache.len()..`.
    pub tokens: &'a [u32],
    /// The sequence's cache; grows by `tokens.len()`.
    pub cache: &'a mut C,
}

impl<D: Device> Model<D> {
    /// Bytes of weights one decode step reads: every layer's projections and
    /// the output head (the embedding where the head is tied to it; else
    /// the embedding gives one row a token and is not counted). `None` where
    /// the device does not say what its weights take.
    pub fn streamed_bytes(&self) -> Option<usize> {
        std::iter::once(self.head())
            .chain(self.projections().map(|l| &l.w))
            .map(|w| self.device.weight_bytes(w))
            .sum()
    }

    /// The output head: its own matrix, or the embedding it is tied to.
    pub fn head(&self) -> &D::Weight {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// Every layer's projections (q, k, v, o, gate, up, down), layer by layer.
    pub fn projections(&self) -> impl Iterator<Item = &Linear<D>> {
        self.layers.iter().flat_map(|l| {
            let (a, m) = (&l.attn, &l.mlp);
            [&a.q, &a.k, &a.v, &a.o, &m.gate, &m.up, &m.down]
        })
    }

    /// Runs the batch; returns the logits of each item's last token.
    pub fn forward(
        &self,
        items: &mut [BatchItem<'_, D::Cache>],
    ) -> Result<Vec<Vec<f32>>, BackendError> {
        self.within_context(items)?;
        let Some(logits) = self.last_logits(items) else {
            return Ok(Vec::new());
        };
        let out = self.device.to_host(logits);
        self.device.sync()?;
        Ok(out)
    }

    /// Runs the batch; for the items marked `greedy` only the chosen token
    /// comes back from the device, for the others their logits. Logits that
    /// are NaN or infinite are an error (corrupt weights, most likely),
    /// naming the first layer whose output went wrong where the device can
    /// tell.
    pub fn step(
        &self,
        items: &mut [BatchItem<'_, D::Cache>],
        greedy: &[bool],
    ) -> Result<Vec<Next>, BackendError> {
        Ok(self.step_rows(items, greedy, &[])?.0)
    }

    /// As [`Self::step`]; for each item marked in `every_row` also the
    /// logits of the positions before its last, on the host (empty for the
    /// others). Those items must not be greedy.
    pub fn step_rows(
        &self,
        items: &mut [BatchItem<'_, D::Cache>],
        greedy: &[bool],
        every_row: &[bool],
    ) -> Result<(Vec<Next>, Vec<EarlierRows>), BackendError> {
        self.within_context(items)?;
        let mut bad_layer = None;
        let n = items.len();
        let Some((logits, spans)) = self.logits_of(items, every_row, Some(&mut bad_layer)) else {
            return Ok((Vec::new(), Vec::new()));
        };
        let mut extra = vec![Vec::new(); n];
        let out: Vec<Next> = if greedy.iter().all(|g| *g) {
            let picks = self.device.argmax(&logits);
            picks.into_iter().map(Next::Argmax).collect()
        } else {
            let mut rows = self.device.to_host(logits);
            // The first n rows are each item's last; the rest each marked
            // item's earlier ones, in its order.
            let earlier = rows.split_off(n);
            let mut earlier = earlier.into_iter();
            for (i, count) in spans.into_iter().enumerate() {
                extra[i] = earlier.by_ref().take(count).collect();
            }
            rows.into_iter().map(Next::Logits).collect()
        };
        self.device.sync()?;
        let finite_rows = extra
            .iter()
            .flatten()
            .all(|l| l.iter().all(|v| v.is_finite()));
        let finite = |n: &Next| match n {
            Next::Argmax(t) => *t != NON_FINITE,
            Next::Logits(l) => l.iter().all(|v| v.is_finite()),
        };
        if !(out.iter().all(finite) && finite_rows) {
            return Err(BackendError::NonFinite {
                place: match bad_layer {
                    Some(l) => format!("first in the output of layer {l}"),
                    None => "in the logits".into(),
                },
            });
        }
        Ok((out, extra))
    }

    /// Every item's positions inside the context: the RoPE table and a
    /// device's block tables are sized by it, so a position past it is
    /// refused here rather than read past their ends.
    fn within_context(&self, items: &[BatchItem<'_, D::Cache>]) -> Result<(), BackendError> {
        let context = self.cfg.context;
        match items
            .iter()
            .map(|it| it.cache.len() + it.tokens.len())
            .find(|&n| n > context)
        {
            Some(n) => Err(BackendError::ContextOverflow {
                prompt_tokens: n,
                partial: false,
                max_tokens: 0,
                context,
            }),
            None => Ok(()),
        }
    }

    /// The forward pass up to the output head: `items × vocab` logits of
    /// each item's last token, on the device. None for an empty batch.
    fn last_logits(&self, items: &mut [BatchItem<'_, D::Cache>]) -> Option<D::Act> {
        Some(self.logits_of(items, &[], None)?.0)
    }

    /// The logits of each item's last token (`items × vocab`, on the
    /// device), followed by those of every earlier fed position of the
    /// items marked in `every_row`; with how many earlier rows each item has.
    fn logits_of(
        &self,
        items: &mut [BatchItem<'_, D::Cache>],
        every_row: &[bool],
        bad_layer: Option<&mut Option<usize>>,
    ) -> Option<(D::Act, Vec<usize>)> {
        let (h, spans) = self.hidden_rows(items, every_row, bad_layer)?; // rows × hidden
        Some((self.device.logits(self.head(), &h), spans)) // rows × vocab
    }

    /// Runs the batch; returns each item's last hidden state after the final
    /// norm (`items × hidden` on the host): the last-token pooling of
    /// embedding models. Non-finite values are an error, as in [`Self::step`].
    pub fn hidden(
        &self,
        items: &mut [BatchItem<'_, D::Cache>],
    ) -> Result<Vec<Vec<f32>>, BackendError> {
        self.within_context(items)?;
        let mut bad_layer = None;
        let Some(h) = self.last_hidden(items, Some(&mut bad_layer)) else {
            return Ok(Vec::new());
        };
        let out = self.device.to_host(h);
        self.device.sync()?;
        if let Some(l) = bad_layer {
            return Err(BackendError::NonFinite {
                place: format!("first in the output of layer {l}"),
            });
        }
        if out.iter().flatten().any(|v| !v.is_finite()) {
            return Err(BackendError::NonFinite {
                place: "in the final norm".into(),
            });
        }
        Ok(out)
    }

    /// The decoder stack and the final norm over the batch: `items × hidden`
    /// of each item's last token, on the device. None for an empty batch.
    fn last_hidden(
        &self,
        items: &mut [BatchItem<'_, D::Cache>],
        bad_layer: Option<&mut Option<usize>>,
    ) -> Option<D::Act> {
        Some(self.hidden_rows(items, &[], bad_layer)?.0)
    }

    /// As [`Self::last_hidden`], followed by the rows of every earlier fed
    /// position of the items marked in `every_row`; with how many earlier
    /// rows each item has. Rows are gathered, never recomputed: a position's
    /// state is the same whichever rows come out.
    fn hidden_rows(
        &self,
        items: &mut [BatchItem<'_, D::Cache>],
        every_row: &[bool],
        mut bad_layer: Option<&mut Option<usize>>,
    ) -> Option<(D::Act, Vec<usize>)> {
        let (c, dev) = (&self.cfg, &self.device);
        let rows = BatchRows::new(items.iter().map(|it| (it.cache.len(), it.tokens.len())));
        if rows.is_empty() {
            return None;
        }
        dev.begin_pass(&rows);
        let tokens: Vec<u32> = items
            .iter()
            .flat_map(|it| it.tokens.iter().copied())
            .collect();
        let mut x = dev.embed(&self.embed, &tokens); // rows × hidden
        let mut step = Step {
            heads: c.heads(),
            eps: c.rms_eps,
            rope: &self.rope,
            rows: &rows,
            items,
        };
        for (li, layer) in self.layers.iter().enumerate() {
            layer.forward(dev, &mut x, li, &mut step);
            if let Some(bad) = bad_layer.as_deref_mut() {
                if bad.is_none() && dev.all_finite(&x) == Some(false) {
                    *bad = Some(li);
                }
            }
        }
        for it in step.items.iter_mut() {
            it.cache.advance(it.tokens.len());
        }
        let mut pick = rows.last_of_each();
        let mut earlier = Vec::with_capacity(rows.spans.len());
        for (i, span) in rows.spans.iter().enumerate() {
            let marked = every_row.get(i).copied().unwrap_or(false);
            let before = if marked {
                span.start..span.end - 1
            } else {
                0..0
            };
            earlier.push(before.len());
            pick.extend(before);
        }
        let picked = dev.gather(&x, &pick); // (items + earlier) × hidden
        Some((dev.rms_norm(&picked, &self.norm, c.rms_eps), earlier))
    }

    /// Caps the context (and the RoPE table) at `max` positions.
    pub fn cap_context(&mut self, max: usize) -> Result<(), BackendError> {
        if max < self.cfg.context {
            self.cfg.context = max;
            self.rope = self
                .device
                .rope_table(self.cfg.head_dim, self.cfg.rope_theta, max)?;
        }
        Ok(())
    }
}
