//! What the CUDA engine's arithmetic (`statebench-cuda/3`) computes, written
//! plainly on the host: a Qwen2/Qwen3 forward pass over a safetensors
//! checkpoint that rounds to bf16 exactly where the kernels write bf16 (the
//! norms' outputs, every projection's output after its bias, the attention
//! inputs after norm and RoPE, the cached keys and values, the softmax
//! weights P, the attention output, the residual stream after each add,
//! SwiGLU's product) and keeps the logits f32. Attention reduces chunks of
//! 256 positions in sub-tiles of 64 with an online softmax and folds the
//! chunks in order, as the kernel does. Dot products are summed in f64, so
//! the CUDA engine differs from it by the order of its f32 sums alone.

use std::collections::HashMap;
use std::path::Path;

use statebench::engine::device::{bf16_to_f32, f32_to_bf16};

fn bf(x: f32) -> f32 {
    bf16_to_f32(f32_to_bf16(x))
}

/// A tiny checkpoint in memory, every tensor widened to f32.
pub struct Reference {
    t: HashMap<String, Vec<f32>>,
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    dim: usize,
    layers: usize,
    eps: f32,
    rope: statebench_kernels::RopeTable,
    qk_norm: bool,
    tied: bool,
}

impl Reference {
    pub fn load(dir: &Path) -> Reference {
        use safetensors::{Dtype, SafeTensors};
        let cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let mut t = HashMap::new();
        for (name, view) in st.tensors() {
            let data: Vec<f32> = match view.dtype() {
                Dtype::F32 => view
                    .data()
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
                Dtype::BF16 => view
                    .data()
                    .chunks_exact(2)
                    .map(|b| bf16_to_f32(u16::from_le_bytes([b[0], b[1]])))
                    .collect(),
                other => panic!("{name}: {other:?}"),
            };
            t.insert(name, data);
        }
        let n = |k: &str| cfg[k].as_u64().unwrap() as usize;
        let (hidden, heads) = (n("hidden_size"), n("num_attention_heads"));
        let dim = cfg["head_dim"]
            .as_u64()
            .map_or(hidden / heads, |d| d as usize);
        let theta = cfg["rope_theta"].as_f64().unwrap() as f32;
        Reference {
            hidden,
            heads,
            kv_heads: n("num_key_value_heads"),
            dim,
            layers: n("num_hidden_layers"),
            eps: cfg["rms_norm_eps"].as_f64().unwrap() as f32,
            rope: statebench_kernels::RopeTable::new(dim, theta, n("max_position_embeddings")),
            qk_norm: cfg["model_type"] == "qwen3",
            tied: !t.contains_key("lm_head.weight"),
            t,
        }
    }

    fn get(&self, name: &str) -> &[f32] {
        self.t
            .get(name)
            .unwrap_or_else(|| panic!("no tensor {name}"))
    }

    /// x Wᵀ (+ b) for one row, summed exactly enough (f64).
    fn project(&self, name: &str, x: &[f32]) -> Vec<f32> {
        let w = self.get(&format!("{name}.weight"));
        let cols = x.len();
        let mut y: Vec<f32> = w
            .chunks_exact(cols)
            .map(|row| {
                row.iter()
                    .zip(x)
                    .map(|(a, b)| *a as f64 * *b as f64)
                    .sum::<f64>() as f32
            })
            .collect();
        if let Some(b) = self.t.get(&format!("{name}.bias")) {
            for (v, b) in y.iter_mut().zip(b) {
                *v += b;
            }
        }
        y
    }

    /// RMSNorm of `x` with weight `w`, not rounded.
    fn norm(&self, x: &[f32], w: &[f32]) -> Vec<f32> {
        let ss: f64 = x.iter().map(|v| *v as f64 * *v as f64).sum();
        let scale = 1.0 / ((ss as f32 / x.len() as f32 + self.eps).sqrt());
        x.iter().zip(w).map(|(v, w)| v * scale * w).collect()
    }

    /// Rotates one head in place ("rotate half") by position `pos`.
    fn rotate(&self, x: &mut [f32], pos: usize) {
        let half = self.dim / 2;
        let (c, s) = (self.rope.cos(), self.rope.sin());
        for i in 0..half {
            let (x0, x1) = (x[i], x[i + half]);
            let (ci, si) = (c[pos * half + i], s[pos * half + i]);
            x[i] = x0 * ci - x1 * si;
            x[i + half] = x1 * ci + x0 * si;
        }
    }

    /// The last token's logits after a cold prefill of `tokens`.
    pub fn logits(&self, tokens: &[u32]) -> Vec<f32> {
        let (h, d) = (self.hidden, self.dim);
        let group = self.heads / self.kv_heads;
        let embed = self.get("model.embed_tokens.weight");
        let mut x: Vec<Vec<f32>> = tokens
            .iter()
            .map(|&t| embed[t as usize * h..(t as usize + 1) * h].to_vec())
            .collect();
        let scale_log2 = std::f32::consts::LOG2_E / (d as f32).sqrt();
        for l in 0..self.layers {
            let p = format!("model.layers.{l}");
            let an = self.get(&format!("{p}.input_layernorm.weight")).to_vec();
            let mut q_all = Vec::new();
            let mut k_all = Vec::new();
            let mut v_all = Vec::new();
            for (pos, xr) in x.iter().enumerate() {
                let hn: Vec<f32> = self.norm(xr, &an).into_iter().map(bf).collect();
                let q = self.project(&format!("{p}.self_attn.q_proj"), &hn);
                let k = self.project(&format!("{p}.self_attn.k_proj"), &hn);
                let v = self.project(&format!("{p}.self_attn.v_proj"), &hn);
                let finish = |v: Vec<f32>, norm: Option<&str>| -> Vec<f32> {
                    let mut out = Vec::new();
                    for head in v.chunks_exact(d) {
                        let head: Vec<f32> = head.iter().map(|x| bf(*x)).collect();
                        let mut head = match norm {
                            Some(n) => self.norm(&head, self.get(n)),
                            None => head,
                        };
                        self.rotate(&mut head, pos);
                        out.extend(head.into_iter().map(bf));
                    }
                    out
                };
                let (qn, kn) = (
                    format!("{p}.self_attn.q_norm.weight"),
                    format!("{p}.self_attn.k_norm.weight"),
                );
                let (qn, kn) = if self.qk_norm {
                    (Some(qn.as_str()), Some(kn.as_str()))
                } else {
                    (None, None)
                };
                q_all.push(finish(q, qn));
                k_all.push(finish(k, kn));
                v_all.push(v.into_iter().map(bf).collect::<Vec<f32>>());
            }
            for (i, xr) in x.iter_mut().enumerate() {
                let mut att = vec![0f32; self.heads * d];
                for hq in 0..self.heads {
                    let kh = hq / group;
                    let q = &q_all[i][hq * d..(hq + 1) * d];
                    let (mut big_m, mut big_l, mut big_o) =
                        (f32::NEG_INFINITY, 0f32, vec![0f32; d]);
                    for c in 0..=i / 256 {
                        let (mut m, mut lsum, mut acc) = (f32::NEG_INFINITY, 0f32, vec![0f32; d]);
                        for sub in 0..4 {
                            let first = c * 256 + sub * 64;
                            if first > i {
                                break;
                            }
                            let last = (first + 64).min(i + 1);
                            let xs: Vec<f32> = (first..last)
                                .map(|j| {
                                    let k = &k_all[j][kh * d..(kh + 1) * d];
                                    let s: f64 =
                                        q.iter().zip(k).map(|(a, b)| *a as f64 * *b as f64).sum();
                                    s as f32 * scale_log2
                                })
                                .collect();
                            let mx = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                            let m_new = m.max(mx);
                            let corr = (m - m_new).exp2();
                            let ps: Vec<f32> = xs.iter().map(|x| bf((x - m_new).exp2())).collect();
                            lsum = lsum * corr + ps.iter().sum::<f32>();
                            for (dd, a) in acc.iter_mut().enumerate() {
                                let pv: f64 = ps
                                    .iter()
                                    .zip(first..last)
                                    .map(|(p, j)| *p as f64 * v_all[j][kh * d + dd] as f64)
                                    .sum();
                                *a = *a * corr + pv as f32;
                            }
                            m = m_new;
                        }
                        let m2 = big_m.max(m);
                        let (wa, wb) = ((big_m - m2).exp2(), (m - m2).exp2());
                        big_l = big_l * wa + lsum * wb;
                        for (o, a) in big_o.iter_mut().zip(&acc) {
                            *o = *o * wa + a * wb;
                        }
                        big_m = m2;
                    }
                    for dd in 0..d {
                        att[hq * d + dd] = bf(big_o[dd] / big_l);
                    }
                }
                let o = self.project(&format!("{p}.self_attn.o_proj"), &att);
                for (a, b) in xr.iter_mut().zip(o) {
                    *a = bf(*a + b);
                }
                let mn = self.get(&format!("{p}.post_attention_layernorm.weight"));
                let hn: Vec<f32> = self.norm(xr, mn).into_iter().map(bf).collect();
                let g = self.project(&format!("{p}.mlp.gate_proj"), &hn);
                let u = self.project(&format!("{p}.mlp.up_proj"), &hn);
                let act: Vec<f32> = g
                    .iter()
                    .zip(&u)
                    .map(|(g, u)| bf(g / (1.0 + (-g).exp()) * u))
                    .collect();
                let down = self.project(&format!("{p}.mlp.down_proj"), &act);
                for (a, b) in xr.iter_mut().zip(down) {
                    *a = bf(*a + b);
                }
            }
        }
        let last = x.last().expect("a token");
        let hn: Vec<f32> = self
            .norm(last, self.get("model.norm.weight"))
            .into_iter()
            .map(bf)
            .collect();
        let head = if self.tied {
            "model.embed_tokens"
        } else {
            "lm_head"
        };
        self.project(head, &hn)
    }
}
