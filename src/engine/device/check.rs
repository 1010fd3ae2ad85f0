//! Every device operation run on two devices with the same random inputs,
//! and how far the results differ: the test of a new kernel set against
//! the CPU's (`statebench check-device`, `scripts/gpu-check.sh`).
//!
//! Weights and activations are drawn as bf16 values, so a bf16 device
//! holds exactly what the CPU holds and a difference is arithmetic alone:
//! the order of sums, and where a bf16 device rounds its results.

use super::{bf16_to_f32, f32_to_bf16, BatchRows, Device, Heads, HostWeight};
use crate::backend::BackendError;
use crate::rng::Rng;
use statebench_kernels::Matrix;

/// How far one operation's outputs differ between the two devices.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelDiff {
    pub kernel: &'static str,
    pub max_abs: f32,
    /// Largest |a − b| / max(|a|, 1e-6).
    pub max_rel: f32,
    /// Largest |b|: the scale of the results.
    pub scale: f32,
    /// Largest |a − b| in units in the last place of `b` as a bf16 (an
    /// 8-bit significand; below 2⁻⁸ the unit is 2⁻¹⁶): a result rounded to
    /// bf16 once is within 0.5 of the exact one.
    pub max_bf16_ulps: f32,
    /// Values compared.
    pub values: usize,
}

fn values(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| (rng.unit() as f32 * 2.0 - 1.0) * scale)
        .collect()
}

/// Values a bf16 device stores exactly.
fn bf16_values(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    values(rng, n, scale)
        .into_iter()
        .map(|v| bf16_to_f32(f32_to_bf16(v)))
        .collect()
}

fn weight(rows: usize, cols: usize, v: &[f32]) -> HostWeight {
    let m = Matrix::from_f32(rows, cols, v.to_vec()).expect("a well-formed matrix");
    HostWeight::Matrix(m)
}

fn diff(kernel: &'static str, a: &[Vec<f32>], b: &[Vec<f32>]) -> KernelDiff {
    let (mut max_abs, mut max_rel, mut max_ulps, mut scale, mut n) = (0f32, 0f32, 0f32, 0f32, 0);
    if a.len() != b.len() {
        return KernelDiff {
            kernel,
            max_abs: f32::INFINITY,
            max_rel: f32::INFINITY,
            max_bf16_ulps: f32::INFINITY,
            scale: 0.0,
            values: 0,
        };
    }
    for (ra, rb) in a.iter().zip(b) {
        if ra.len() != rb.len() {
            max_abs = f32::INFINITY;
            max_rel = f32::INFINITY;
            max_ulps = f32::INFINITY;
            continue;
        }
        for (x, y) in ra.iter().zip(rb) {
            let d = (x - y).abs();
            let d = if d.is_nan() { f32::INFINITY } else { d };
            max_abs = max_abs.max(d);
            max_rel = max_rel.max(d / x.abs().max(1e-6));
            max_ulps = max_ulps.max(d / bf16_ulp(*y));
            scale = scale.max(y.abs());
            n += 1;
        }
    }
    KernelDiff {
        kernel,
        max_abs,
        max_rel,
        max_bf16_ulps: max_ulps,
        scale,
        values: n,
    }
}

/// What a device rounds its results to, which decides how close to the
/// CPU's they must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rounding {
    /// f32 results (candle, Metal): within 1e-4, argmax exact.
    F32,
    /// bf16 results (CUDA): gathers exact; a result rounded once
    /// (products, norms, RoPE, SwiGLU, adds) within one bf16 unit in the
    /// last place (half for the rounding, the rest for sums in another
    /// order); a bias added to a product rounded before it within two
    /// half-units of the largest result; attention, whose softmax weights
    /// are bf16 (each off by up to 2⁻⁹ of itself), within 2⁻⁸ of values in
    /// [-1, 1].
    Bf16,
}

/// Whether one operation's difference is within what `rounding` allows.
pub fn agrees(d: &KernelDiff, rounding: Rounding) -> bool {
    if d.values == 0 {
        return false;
    }
    let exact = matches!(d.kernel, "embed" | "gather" | "argmax");
    match rounding {
        Rounding::F32 => d.max_abs <= if exact { 0.0 } else { 1e-4 },
        Rounding::Bf16 => match d.kernel {
            _ if exact => d.max_abs == 0.0,
            "add_bias" => d.max_abs <= d.scale * 2f32.powi(-7),
            "attention prefill" | "attention decode" => d.max_abs <= 2f32.powi(-8),
            _ => d.max_bf16_ulps <= 1.0,
        },
    }
}

/// One unit in the last place of `x` as a bf16: 2^(exponent − 7), at
/// least 2⁻¹⁶ (exponents below −8 count as −8).
fn bf16_ulp(x: f32) -> f32 {
    let e = ((x.abs().to_bits() >> 23) as i32 - 127).max(-8);
    2f32.powi(e - 7)
}

/// One device's side of the comparison.
struct Side<'d, D: Device> {
    dev: &'d D,
}

impl<D: Device> Side<'_, D> {
    fn host(&self, x: D::Act) -> Vec<Vec<f32>> {
        self.dev.to_host(x)
    }
}

/// The sizes one comparison runs at.
#[derive(Debug, Clone)]
pub struct Shapes {
    /// Rows of the matrix product, norms and element-wise operations.
    pub rows: usize,
    /// Inner dimension of the matrix product (the K of `x Wᵀ`).
    pub hidden: usize,
    /// Outputs of the matrix product.
    pub inner: usize,
    pub vocab: usize,
    pub heads: Heads,
    /// Attention: each step's new positions per sequence, written to the
    /// cache and attended over, step after step.
    pub steps: Vec<Vec<usize>>,
}

impl Shapes {
    /// Rows and widths that fill no tile exactly: two sequences prefilled
    /// (3 and 150 positions: attention's 64-position sub-tiles three
    /// deep, so its copy pipeline turns over), then one decode step each.
    pub fn ragged() -> Self {
        Shapes {
            rows: 7,
            hidden: 96,
            inner: 80,
            vocab: 150,
            heads: Heads {
                q: 4,
                kv: 2,
                dim: 32,
            },
            steps: vec![vec![3, 150], vec![1, 1]],
        }
    }
}

/// Runs each operation on `a` and `b` with the same inputs (seeded) and
/// returns how far each pair of results differs.
pub fn compare<A: Device, B: Device>(
    a: &A,
    b: &B,
    seed: u64,
) -> Result<Vec<KernelDiff>, BackendError> {
    compare_at(a, b, seed, &Shapes::ragged())
}

/// [`compare`] at the given sizes.
pub fn compare_at<A: Device, B: Device>(
    a: &A,
    b: &B,
    seed: u64,
    shapes: &Shapes,
) -> Result<Vec<KernelDiff>, BackendError> {
    let (sa, sb) = (Side { dev: a }, Side { dev: b });
    let mut rng = Rng::stream(seed, "device-check");
    let mut out = Vec::new();
    let Shapes {
        rows,
        hidden,
        inner,
        vocab,
        heads,
        ..
    } = *shapes;

    // Embedding gather.
    let table = bf16_values(&mut rng, vocab * hidden, 1.0);
    let (ta, tb) = (
        a.weight(weight(vocab, hidden, &table))?,
        b.weight(weight(vocab, hidden, &table))?,
    );
    let tokens: Vec<u32> = (0..rows).map(|i| (i * 37 % vocab) as u32).collect();
    out.push(diff(
        "embed",
        &sa.host(a.embed(&ta, &tokens)),
        &sb.host(b.embed(&tb, &tokens)),
    ));

    // Matrix product with a bias.
    let x = bf16_values(&mut rng, rows * hidden, 1.0);
    let w = bf16_values(&mut rng, inner * hidden, 0.1);
    let bias = values(&mut rng, inner, 0.1);
    let (wa, wb) = (
        a.weight(weight(inner, hidden, &w))?,
        b.weight(weight(inner, hidden, &w))?,
    );
    let (ba, bb) = (a.vector(bias.clone())?, b.vector(bias)?);
    let (xa, xb) = (a.act(hidden, x.clone()), b.act(hidden, x.clone()));
    let mut ya = a.matmul(&wa, &xa);
    let mut yb = b.matmul(&wb, &xb);
    out.push(diff(
        "matmul",
        &sa.host(a.matmul(&wa, &xa)),
        &sb.host(b.matmul(&wb, &xb)),
    ));
    a.add_bias(&mut ya, &ba);
    b.add_bias(&mut yb, &bb);
    out.push(diff("add_bias", &sa.host(ya), &sb.host(yb)));

    // RMSNorm over whole rows and per head.
    let g = values(&mut rng, hidden, 1.0);
    let (ga, gb) = (a.vector(g.clone())?, b.vector(g)?);
    out.push(diff(
        "rms_norm",
        &sa.host(a.rms_norm(&xa, &ga, 1e-6)),
        &sb.host(b.rms_norm(&xb, &gb, 1e-6)),
    ));
    let hg = values(&mut rng, heads.dim, 1.0);
    let (hga, hgb) = (a.vector(hg.clone())?, b.vector(hg)?);
    let q = bf16_values(&mut rng, rows * heads.q * heads.dim, 1.0);
    let (qa, qb) = (
        a.act(heads.q * heads.dim, q.clone()),
        b.act(heads.q * heads.dim, q.clone()),
    );
    out.push(diff(
        "rms_norm per head",
        &sa.host(a.rms_norm(&qa, &hga, 1e-6)),
        &sb.host(b.rms_norm(&qb, &hgb, 1e-6)),
    ));

    // RoPE at scattered positions.
    let (ra, rb) = (
        a.rope_table(heads.dim, 10_000.0, 512)?,
        b.rope_table(heads.dim, 10_000.0, 512)?,
    );
    let pos: Vec<usize> = (0..rows).map(|i| i * 61 % 500).collect();
    let (mut qra, mut qrb) = (
        a.act(heads.q * heads.dim, q.clone()),
        b.act(heads.q * heads.dim, q),
    );
    a.rope(&mut qra, heads.q, &pos, &ra);
    b.rope(&mut qrb, heads.q, &pos, &rb);
    out.push(diff("rope", &sa.host(qra), &sb.host(qrb)));

    // SwiGLU and the residual add.
    let gate = bf16_values(&mut rng, rows * inner, 4.0);
    let up = bf16_values(&mut rng, rows * inner, 1.0);
    let (mut gta, mut gtb) = (a.act(inner, gate.clone()), b.act(inner, gate));
    a.silu_mul(&mut gta, &a.act(inner, up.clone()));
    b.silu_mul(&mut gtb, &b.act(inner, up.clone()));
    out.push(diff("silu_mul", &sa.host(gta), &sb.host(gtb)));
    let (mut ada, mut adb) = (a.act(hidden, x.clone()), b.act(hidden, x.clone()));
    let other = bf16_values(&mut rng, rows * hidden, 1.0);
    a.add(&mut ada, &a.act(hidden, other.clone()));
    b.add(&mut adb, &b.act(hidden, other));
    out.push(diff("add", &sa.host(ada), &sb.host(adb)));

    // Row gather and argmax (exact: compared as numbers).
    let pick = [rows - 1, 0, rows / 2];
    out.push(diff(
        "gather",
        &sa.host(a.gather(&xa, &pick)),
        &sb.host(b.gather(&xb, &pick)),
    ));
    let mut logits = bf16_values(&mut rng, rows * vocab, 1.0);
    logits[5] = logits.iter().copied().fold(f32::MIN, f32::max); // a tie, lowest index wins
    if rows > 1 {
        logits[vocab + 3] = f32::NAN;
    }
    let (la, lb) = (a.act(vocab, logits.clone()), b.act(vocab, logits));
    let as_f = |v: Vec<u32>| vec![v.into_iter().map(|i| i as f32).collect::<Vec<_>>()];
    out.push(diff("argmax", &as_f(a.argmax(&la)), &as_f(b.argmax(&lb))));

    // KV write and attention, step after step.
    let seqs = shapes.steps.first().map_or(0, Vec::len);
    let positions: usize = shapes.steps.iter().flatten().sum();
    let budget = (positions + 16 * seqs * shapes.steps.len()) * heads.kv * heads.dim * 2 * 4;
    a.reserve_kv(1, heads, budget)?;
    b.reserve_kv(1, heads, budget)?;
    let (mut ca, mut cb): (Vec<A::Cache>, Vec<B::Cache>) = (
        (0..seqs).map(|_| A::Cache::default()).collect(),
        (0..seqs).map(|_| B::Cache::default()).collect(),
    );
    let mut att = Vec::new();
    for step in &shapes.steps {
        let n: usize = step.iter().sum();
        let cached: Vec<usize> = ca
            .iter()
            .map(crate::engine::kv_cache::KvStore::len)
            .collect();
        let brows = BatchRows::new(cached.into_iter().zip(step.iter().copied()));
        let kvw = heads.kv * heads.dim;
        let k = bf16_values(&mut rng, n * kvw, 1.0);
        let v = bf16_values(&mut rng, n * kvw, 1.0);
        let q = bf16_values(&mut rng, n * heads.q * heads.dim, 1.0);
        {
            let mut refs: Vec<&mut A::Cache> = ca.iter_mut().collect();
            a.kv_write(
                &mut refs,
                0,
                &a.act(kvw, k.clone()),
                &a.act(kvw, v.clone()),
                &brows,
                heads,
            );
        }
        {
            let mut refs: Vec<&mut B::Cache> = cb.iter_mut().collect();
            b.kv_write(&mut refs, 0, &b.act(kvw, k), &b.act(kvw, v), &brows, heads);
        }
        let refs_a: Vec<&A::Cache> = ca.iter().collect();
        let refs_b: Vec<&B::Cache> = cb.iter().collect();
        let oa = a.attention(
            &a.act(heads.q * heads.dim, q.clone()),
            &refs_a,
            0,
            &brows,
            heads,
        );
        let ob = b.attention(&b.act(heads.q * heads.dim, q), &refs_b, 0, &brows, heads);
        att.push((sa.host(oa), sb.host(ob)));
        for (c, &m) in ca.iter_mut().zip(step) {
            crate::engine::kv_cache::KvStore::advance(c, m);
        }
        for (c, &m) in cb.iter_mut().zip(step) {
            crate::engine::kv_cache::KvStore::advance(c, m);
        }
    }
    for (i, (x, y)) in att.iter().enumerate() {
        let single = shapes.steps[i].iter().all(|&n| n == 1);
        let name = if single {
            "attention decode"
        } else {
            "attention prefill"
        };
        out.push(diff(name, x, y));
    }
    a.sync()?;
    b.sync()?;
    Ok(out)
}

/// The tokens one request produced under one condition, as a short hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// `alone`, `batch of 32`, `cached prefix`, …
    pub case: String,
    pub tokens: usize,
    /// sha256 of the token ids, first 16 hex digits.
    pub hash: String,
}

fn token_hash(tokens: &[u32]) -> String {
    use sha2::{Digest, Sha256};
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    crate::hex(&Sha256::digest(bytes)[..8])
}

/// `prompt` prefilled in one pass on a cold cache, then `n` tokens
/// decoded greedily one at a time (argmax on the host, ties to the lowest
/// id): the prompt's last logits and the tokens.
pub fn greedy_path<D: Device>(
    engine: &crate::engine::Engine<D>,
    prompt: &[u32],
    n: usize,
) -> Result<(Vec<f32>, Vec<u32>), BackendError> {
    use crate::engine::model::BatchItem;
    let mut cache = D::Cache::default();
    let mut step = |tokens: &[u32]| {
        engine
            .forward(&mut [BatchItem {
                tokens,
                cache: &mut cache,
            }])
            .map(|mut rows| rows.remove(0))
    };
    let first = step(prompt)?;
    let mut last = first.clone();
    let mut tokens = Vec::with_capacity(n);
    for _ in 0..n {
        let t = crate::engine::sampling::argmax(&last);
        tokens.push(t);
        last = step(&[t])?;
    }
    Ok((first, tokens))
}

/// The invariance promise on `engine`'s device: one greedy request's
/// tokens alone, in batches of each size in `batches` beside requests of
/// other lengths (greedy and sampled), and with its prefix cached or cold.
/// Every hash must be the same; across processes too.
pub fn invariance<D: Device>(
    engine: &mut crate::engine::Engine<D>,
    batches: &[usize],
    max_tokens: usize,
) -> Result<Vec<Outcome>, BackendError> {
    use crate::backend::{Backend, ChatRequest, Message, Role};
    let user = |t: &str| Message::new(Role::User, t);
    let target = ChatRequest::greedy(
        vec![user(
            "List three colours, one per line, then say which you like.",
        )],
        max_tokens,
    );
    let other = |i: usize| {
        let mut r = ChatRequest::greedy(
            vec![user(&format!(
                "{} {i}",
                "Tell me about the ledger.".repeat(1 + i % 9)
            ))],
            4 + i % 13,
        );
        if i % 2 == 1 {
            r.temperature = 1.0;
            r.seed = i as u64;
        }
        r
    };
    let mut out = Vec::new();
    let mut record = |case: String, tokens: &[u32]| {
        out.push(Outcome {
            case,
            tokens: tokens.len(),
            hash: token_hash(tokens),
        })
    };
    let s = engine.open_session();
    let alone = engine.chat(s, target.clone())?;
    engine.close_session(s);
    record("alone".into(), &alone.tokens);
    for &n in batches {
        // The target in the middle of the batch, neither first nor last.
        let mut reqs: Vec<ChatRequest> = (0..n.saturating_sub(1)).map(other).collect();
        let at = reqs.len() / 2;
        reqs.insert(at, target.clone());
        let mut ids = Vec::new();
        let mut sessions = Vec::new();
        for r in reqs {
            let s = engine.open_session();
            ids.push(engine.submit(s, r)?);
            sessions.push(s);
        }
        let want = ids[at];
        let mut got = None;
        while engine.has_pending() {
            for (id, r) in engine.step()? {
                if id == want {
                    got = Some(r?);
                }
            }
        }
        for s in sessions {
            engine.close_session(s);
        }
        let reply =
            got.ok_or_else(|| BackendError::BadRequest("the target never finished".into()))?;
        record(format!("batch of {n}"), &reply.tokens);
    }
    // A second turn whose first turn is cached, and the same conversation cold.
    let s = engine.open_session();
    let first = engine.chat(s, target.clone())?;
    let mut second = target.clone();
    second
        .messages
        .push(Message::new(Role::Assistant, first.content));
    second.messages.push(user("Now name one more."));
    let cached = engine.chat(s, second.clone())?;
    engine.close_session(s);
    let s = engine.open_session();
    let cold = engine.chat(s, second)?;
    engine.close_session(s);
    record(
        format!("second turn, {} tokens cached", cached.usage.cached_tokens),
        &cached.tokens,
    );
    record("second turn, cold".into(), &cold.tokens);
    Ok(out)
}
