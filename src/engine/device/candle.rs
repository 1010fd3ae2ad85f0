//! The forward pass on candle-core's tensors: Apple GPUs through candle's
//! Metal backend (`--features metal`, `--device metal`), and candle's CPU
//! backend, where the tests run this same code against the reference
//! logits.
//!
//! Every operation is a composition of candle ops in f32. Candle's matrix
//! products choose their algorithm by shape, so this device makes no
//! batch-invariance promise until one is measured.

use std::ops::Range;
use std::sync::Mutex;

use candle_core::{DType, Device as CandleDevice, Tensor, D};

use super::{BatchRows, Device, DeviceInfo, Heads, HostWeight};
use crate::backend::BackendError;
use crate::engine::kv_cache::KvStore;

/// A candle device; operations record their first failure for [`Device::sync`].
pub struct Candle {
    device: CandleDevice,
    name: String,
    failed: Mutex<Option<String>>,
}

impl Candle {
    /// Candle's CPU backend.
    pub fn cpu() -> Self {
        Candle {
            device: CandleDevice::Cpu,
            name: "candle-cpu".into(),
            failed: Mutex::new(None),
        }
    }

    /// The `ordinal`-th Metal GPU.
    #[cfg(feature = "metal")]
    pub fn metal(ordinal: usize) -> Result<Self, BackendError> {
        let device = CandleDevice::new_metal(ordinal).map_err(|e| BackendError::Device {
            device: format!("metal:{ordinal}"),
            cause: e.to_string(),
        })?;
        Ok(Candle {
            device,
            name: format!("metal:{ordinal}"),
            failed: Mutex::new(None),
        })
    }

    fn error(&self, e: candle_core::Error) -> BackendError {
        BackendError::Device {
            device: self.name.clone(),
            cause: first_line(&e.to_string()),
        }
    }

    /// The tensor, or (after recording the failure) an empty one, so the
    /// forward pass runs on to [`Device::sync`], which reports it.
    fn ok(&self, r: candle_core::Result<Tensor>) -> Tensor {
        r.unwrap_or_else(|e| {
            if let Ok(mut f) = self.failed.lock() {
                f.get_or_insert_with(|| first_line(&e.to_string()));
            }
            Tensor::zeros(0, DType::F32, &self.device).expect("an empty tensor")
        })
    }
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or_default().to_string()
}

/// One sequence's keys and values per layer, `[positions, kv_heads · dim]`.
#[derive(Debug, Clone, Default)]
pub struct CandleCache {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    len: usize,
}

impl KvStore for CandleCache {
    fn len(&self) -> usize {
        self.len
    }

    fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        for t in self.k.iter_mut().chain(self.v.iter_mut()) {
            // Narrowing a tensor that holds more than `len` rows cannot fail.
            if let Ok(n) = t.narrow(0, 0, len) {
                *t = n;
            }
        }
        self.len = len;
    }

    fn advance(&mut self, n: usize) {
        self.len += n;
    }
}

/// The RoPE table: cos and sin, `[positions, head_dim / 2]`.
pub struct CandleRope {
    cos: Tensor,
    sin: Tensor,
}

impl Device for Candle {
    type Weight = Tensor;
    type Vector = Tensor;
    type Act = Tensor;
    type Rope = CandleRope;
    type Cache = CandleCache;

    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            name: self.name.clone(),
            hardware: format!("{:?}", self.device.location()),
            detail: String::new(),
            arithmetic: "candle-core-0.11/f32 (not batch-invariant)".into(),
        }
    }

    fn weight(&self, w: HostWeight) -> Result<Tensor, BackendError> {
        let (rows, cols) = (w.rows(), w.cols());
        Tensor::from_vec(w.to_f32(), (rows, cols), &self.device).map_err(|e| self.error(e))
    }

    fn vector(&self, v: Vec<f32>) -> Result<Tensor, BackendError> {
        let n = v.len();
        Tensor::from_vec(v, n, &self.device).map_err(|e| self.error(e))
    }

    fn rope_table(
        &self,
        head_dim: usize,
        theta: f32,
        max_pos: usize,
    ) -> Result<CandleRope, BackendError> {
        // The CPU's table, so both devices rotate by the same f32 angles.
        let table = statebench_kernels::RopeTable::new(head_dim, theta, max_pos);
        let half = table.half();
        let (cos, sin) = (table.cos().to_vec(), table.sin().to_vec());
        let t = |v| Tensor::from_vec(v, (max_pos, half), &self.device).map_err(|e| self.error(e));
        Ok(CandleRope {
            cos: t(cos)?,
            sin: t(sin)?,
        })
    }

    fn act(&self, width: usize, data: Vec<f32>) -> Tensor {
        let rows = data.len() / width.max(1);
        self.ok(Tensor::from_vec(data, (rows, width), &self.device))
    }

    fn embed(&self, table: &Tensor, tokens: &[u32]) -> Tensor {
        self.ok(Tensor::new(tokens, &self.device).and_then(|ids| table.index_select(&ids, 0)))
    }

    fn rms_norm(&self, x: &Tensor, weight: &Tensor, eps: f32) -> Tensor {
        self.ok((|| {
            let (rows, width) = x.dims2()?;
            let w = weight.dims1()?;
            let chunks = x.reshape((rows * width / w, w))?;
            let ms = chunks.sqr()?.mean_keepdim(1)?;
            let scale = (ms + f64::from(eps))?.sqrt()?.recip()?;
            chunks
                .broadcast_mul(&scale)?
                .broadcast_mul(weight)?
                .reshape((rows, width))
        })())
    }

    fn matmul(&self, w: &Tensor, x: &Tensor) -> Tensor {
        self.ok(w.t().and_then(|wt| x.matmul(&wt)))
    }

    fn add_bias(&self, y: &mut Tensor, bias: &Tensor) {
        *y = self.ok(y.broadcast_add(bias));
    }

    fn rope(&self, x: &mut Tensor, heads: usize, pos: &[usize], table: &CandleRope) {
        *x = self.ok((|| {
            let (rows, width) = x.dims2()?;
            let half = width / heads / 2;
            let ids: Vec<u32> = pos.iter().map(|&p| p as u32).collect();
            let ids = Tensor::new(ids.as_slice(), &self.device)?;
            let cos = table.cos.index_select(&ids, 0)?.unsqueeze(1)?; // rows × 1 × half
            let sin = table.sin.index_select(&ids, 0)?.unsqueeze(1)?;
            let h = x.reshape((rows, heads, 2 * half))?;
            let (x0, x1) = (h.narrow(2, 0, half)?, h.narrow(2, half, half)?);
            let r0 = (x0.broadcast_mul(&cos)? - x1.broadcast_mul(&sin)?)?;
            let r1 = (x1.broadcast_mul(&cos)? + x0.broadcast_mul(&sin)?)?;
            Tensor::cat(&[r0, r1], 2)?.reshape((rows, width))
        })());
    }

    fn kv_write(
        &self,
        caches: &mut [&mut CandleCache],
        layer: usize,
        k: &Tensor,
        v: &Tensor,
        rows: &BatchRows,
        _heads: Heads,
    ) {
        for (cache, span) in caches.iter_mut().zip(&rows.spans) {
            for (store, new) in [(&mut cache.k, k), (&mut cache.v, v)] {
                let new = self.ok(new.narrow(0, span.start, span.len()));
                if store.len() <= layer {
                    store.push(new);
                } else {
                    store[layer] = self.ok(Tensor::cat(&[&store[layer], &new], 0));
                }
            }
        }
    }

    fn attention(
        &self,
        q: &Tensor,
        caches: &[&CandleCache],
        layer: usize,
        rows: &BatchRows,
        heads: Heads,
    ) -> Tensor {
        let Heads {
            q: nh,
            kv: nkv,
            dim,
        } = heads;
        let group = nh / nkv;
        let scale = 1.0 / (dim as f64).sqrt();
        let per_item = |i: usize, span: &Range<usize>| -> candle_core::Result<Tensor> {
            let m = span.len();
            let c = caches[i];
            let total = c.k[layer].dims2()?.0; // cached + new positions
            let first = rows.pos[span.start];
            // q: m × nh × dim → nkv × (group · m) × dim, query head = kvh · group + g.
            let q = q
                .narrow(0, span.start, m)?
                .reshape((m, nkv, group, dim))?
                .permute((1, 2, 0, 3))?
                .reshape((nkv, group * m, dim))?
                .contiguous()?;
            let kv = |t: &Tensor| -> candle_core::Result<Tensor> {
                t.reshape((total, nkv, dim))?.transpose(0, 1)?.contiguous()
            };
            let (k, v) = (kv(&c.k[layer])?, kv(&c.v[layer])?);
            let scores = (q.matmul(&k.t()?)? * scale)?; // nkv × (group · m) × total
                                                        // Row j of each group sees positions 0..=first + j.
            let mask: Vec<f32> = (0..group * m)
                .flat_map(|r| {
                    let last = first + r % m;
                    (0..total).map(move |t| if t <= last { 0.0 } else { f32::NEG_INFINITY })
                })
                .collect();
            let mask = Tensor::from_vec(mask, (group * m, total), &self.device)?;
            let scores = scores.broadcast_add(&mask)?;
            let max = scores.max_keepdim(D::Minus1)?;
            let e = scores.broadcast_sub(&max)?.exp()?;
            let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
            p.matmul(&v)? // nkv × (group · m) × dim
                .reshape((nkv, group, m, dim))?
                .permute((2, 0, 1, 3))?
                .reshape((m, nh * dim))
        };
        self.ok((|| {
            let outs = rows
                .spans
                .iter()
                .enumerate()
                .map(|(i, s)| per_item(i, s))
                .collect::<candle_core::Result<Vec<_>>>()?;
            Tensor::cat(&outs, 0)
        })())
    }

    fn silu_mul(&self, gate: &mut Tensor, up: &Tensor) {
        *gate = self.ok(gate.silu().and_then(|g| g * up));
    }

    fn add(&self, x: &mut Tensor, y: &Tensor) {
        *x = self.ok(&*x + y);
    }

    fn gather(&self, x: &Tensor, rows: &[usize]) -> Tensor {
        let ids: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        self.ok(Tensor::new(ids.as_slice(), &self.device).and_then(|i| x.index_select(&i, 0)))
    }

    fn to_host(&self, x: Tensor) -> Vec<Vec<f32>> {
        match x.to_vec2::<f32>() {
            Ok(v) => v,
            Err(e) => {
                self.ok(Err(e));
                Vec::new()
            }
        }
    }

    fn argmax(&self, x: &Tensor) -> Vec<u32> {
        // On the host, for `sampling::argmax`'s tie rule and the NaN check.
        self.to_host(x.clone())
            .iter()
            .map(|r| super::argmax_checked(r))
            .collect()
    }

    fn sync(&self) -> Result<(), BackendError> {
        let failed = self.failed.lock().ok().and_then(|mut f| f.take());
        match failed {
            Some(cause) => Err(BackendError::Device {
                device: self.name.clone(),
                cause,
            }),
            None => Ok(()),
        }
    }
}
