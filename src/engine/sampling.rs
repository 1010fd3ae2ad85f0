//! Token choice: greedy with ties to the lowest id, or seeded sampling from a
//! per-request generator so a request's tokens never depend on its batch.

use crate::backend::Sampling;

/// A request's own random number generator (SplitMix64).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded for one request.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Index of the largest logit; the lowest index wins ties, NaN never wins.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_v {
            best_v = v;
            best = i;
        }
    }
    best as u32
}

/// Whether a temperature means greedy decoding (0, negative or not finite).
pub fn is_greedy(temperature: f32) -> bool {
    temperature <= 0.0 || !temperature.is_finite()
}

/// `exp((logit - max) / temperature)` per token, 0 for NaN: the
/// unnormalized probabilities sampling draws from (the best token's is 1).
fn weights(logits: &[f32], temperature: f32) -> Vec<f64> {
    let max = logits
        .iter()
        .copied()
        .filter(|v| !v.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    logits
        .iter()
        .map(|&v| {
            if v.is_nan() {
                0.0
            } else {
                (((v - max) / temperature) as f64).exp()
            }
        })
        .collect()
}

/// Samples from `softmax(logits / temperature)`; greedy when temperature is 0.
pub fn sample(logits: &[f32], temperature: f32, rng: &mut Rng) -> u32 {
    if is_greedy(temperature) {
        return argmax(logits);
    }
    // Sequential sums in f64, in token order: fixed, batch-independent.
    let weights = weights(logits, temperature);
    let total: f64 = weights.iter().sum();
    let mut target = rng.next_f64() * total;
    for (i, w) in weights.iter().enumerate() {
        if target < *w {
            return i as u32;
        }
        target -= w;
    }
    argmax(logits)
}

/// The logits a request chooses from: the model's, adjusted as its
/// [`Sampling`] says. `context` is the prompt and the reply so far, `reply`
/// the reply's tokens; `stop_ids` are masked while the reply is shorter
/// than `min_tokens`. In place; each step's adjustments depend on the
/// request alone.
pub fn adjust(logits: &mut [f32], s: &Sampling, prompt: &[u32], reply: &[u32], stop_ids: &[u32]) {
    for &(t, b) in &s.logit_bias {
        if let Some(v) = logits.get_mut(t as usize) {
            *v += b;
        }
    }
    if let Some(r) = s.repetition_penalty.filter(|&r| r != 1.0) {
        let mut seen = vec![false; logits.len()];
        for &t in prompt.iter().chain(reply) {
            if let Some(slot) = seen.get_mut(t as usize) {
                if !*slot {
                    *slot = true;
                    let v = &mut logits[t as usize];
                    *v = if *v > 0.0 { *v / r } else { *v * r };
                }
            }
        }
    }
    if s.frequency_penalty != 0.0 || s.presence_penalty != 0.0 {
        let mut counts: std::collections::BTreeMap<u32, u32> = Default::default();
        for &t in reply {
            *counts.entry(t).or_default() += 1;
        }
        for (t, n) in counts {
            if let Some(v) = logits.get_mut(t as usize) {
                *v -= s.frequency_penalty * n as f32 + s.presence_penalty;
            }
        }
    }
    if reply.len() < s.min_tokens {
        for &t in stop_ids {
            if let Some(v) = logits.get_mut(t as usize) {
                *v = f32::NEG_INFINITY;
            }
        }
    }
}

/// Samples as [`sample`] does, from the candidates `top_k`, `top_p` and
/// `min_p` keep (greedy ignores them: the best token is always kept).
pub fn sample_cut(logits: &[f32], temperature: f32, s: &Sampling, rng: &mut Rng) -> u32 {
    if is_greedy(temperature) || (s.top_k.is_none() && s.top_p.is_none() && s.min_p.is_none()) {
        return sample(logits, temperature, rng);
    }
    let mut weights = weights(logits, temperature);
    // Most likely first, ties to the lower id: a fixed order for the cuts.
    let mut order: Vec<u32> = (0..weights.len() as u32)
        .filter(|&i| weights[i as usize] > 0.0)
        .collect();
    order.sort_by(|&a, &b| {
        weights[b as usize]
            .total_cmp(&weights[a as usize])
            .then(a.cmp(&b))
    });
    let mut keep = order.len();
    if let Some(k) = s.top_k {
        keep = keep.min(k.max(1));
    }
    if let Some(p) = s.top_p {
        let total: f64 = order.iter().map(|&i| weights[i as usize]).sum();
        let mut sum = 0.0;
        let mut n = 0;
        for &i in &order[..keep] {
            sum += weights[i as usize];
            n += 1;
            if sum >= f64::from(p) * total {
                break;
            }
        }
        keep = n.max(1);
    }
    if let Some(m) = s.min_p {
        // The best token's weight is 1: exp(0).
        let n = order[..keep]
            .iter()
            .take_while(|&&i| weights[i as usize] >= f64::from(m))
            .count();
        keep = n.max(1);
    }
    let mut kept = vec![false; weights.len()];
    for &i in &order[..keep.min(order.len())] {
        kept[i as usize] = true;
    }
    for (w, k) in weights.iter_mut().zip(&kept) {
        if !k {
            *w = 0.0;
        }
    }
    let total: f64 = weights.iter().sum();
    let mut target = rng.next_f64() * total;
    for (i, w) in weights.iter().enumerate() {
        if *w > 0.0 && target < *w {
            return i as u32;
        }
        target -= w;
    }
    order.first().copied().unwrap_or_else(|| argmax(logits))
}

/// `token`'s log-probability under `softmax(logits)` and the `k` most
/// likely tokens', most likely first, ties to the lower id. The sums run
/// sequentially in f64 in token order, as sampling's do: a row's scores
/// depend on its logits alone.
pub fn score(logits: &[f32], token: u32, k: usize) -> super::scheduler::Scored {
    let max = logits
        .iter()
        .copied()
        .filter(|v| !v.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    let total: f64 = logits
        .iter()
        .filter(|v| !v.is_nan())
        .map(|&v| f64::from(v - max).exp())
        .sum();
    let log_total = f64::from(max) + total.ln();
    let logprob = |v: f32| {
        if v.is_nan() {
            f32::NEG_INFINITY
        } else {
            (f64::from(v) - log_total) as f32
        }
    };
    // The k best by (value descending, id ascending), kept sorted.
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    if k > 0 {
        for (i, &v) in logits.iter().enumerate() {
            if v.is_nan() || (top.len() == k && v <= top[k - 1].1) {
                continue;
            }
            let at = top.partition_point(|&(_, w)| w >= v);
            top.insert(at, (i as u32, v));
            top.truncate(k);
        }
    }
    super::scheduler::Scored {
        token,
        logprob: logits
            .get(token as usize)
            .map_or(f32::NEG_INFINITY, |&v| logprob(v)),
        top: top.into_iter().map(|(i, v)| (i, logprob(v))).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_go_to_lowest_id() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5, 0.5]), 1);
    }

    #[test]
    fn scores_are_log_softmax_with_the_best_first() {
        let l = [1.0f32, 3.0, 3.0, 2.0, f32::NAN];
        let s = score(&l, 3, 3);
        let z: f64 = [1.0f64, 3.0, 3.0, 2.0].iter().map(|v| v.exp()).sum();
        assert!((f64::from(s.logprob) - (2.0 - z.ln())).abs() < 1e-6);
        let ids: Vec<u32> = s.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, vec![1, 2, 3]);
        assert_eq!(s.top[0].1, s.top[1].1);
        assert!(score(&l, 0, 0).top.is_empty());
        let p: f64 = (0..4)
            .map(|t| f64::from(score(&l, t, 0).logprob).exp())
            .sum();
        assert!((p - 1.0).abs() < 1e-6);
    }

    #[test]
    fn adjustments_follow_the_parameters() {
        let s = Sampling {
            logit_bias: vec![(0, -100.0), (3, 2.0)],
            repetition_penalty: Some(2.0),
            frequency_penalty: 0.5,
            presence_penalty: 0.25,
            min_tokens: 2,
            ..Sampling::default()
        };
        let mut l = vec![1.0, 2.0, -1.0, 0.0, 4.0];
        // Token 1 seen in the prompt; token 2 twice in the reply; 4 is the stop.
        adjust(&mut l, &s, &[1], &[2, 2], &[4]);
        assert_eq!(l, vec![-99.0, 1.0, -2.0 - 1.25, 2.0, 4.0]);
        let mut l = vec![0.0; 5];
        adjust(&mut l, &s, &[], &[1], &[4]);
        assert_eq!(l[4], f32::NEG_INFINITY);
    }

    #[test]
    fn cuts_keep_the_most_likely() {
        let logits = [3.0, 2.0, 1.0, 0.0];
        let one = |s: &Sampling| {
            let mut rng = Rng::new(7);
            (0..200)
                .map(|_| sample_cut(&logits, 1.0, s, &mut rng))
                .max()
                .unwrap()
        };
        let k2 = Sampling {
            top_k: Some(2),
            ..Sampling::default()
        };
        assert_eq!(one(&k2), 1);
        let p = Sampling {
            top_p: Some(0.01),
            ..Sampling::default()
        };
        assert_eq!(one(&p), 0);
        let m = Sampling {
            min_p: Some(0.3),
            ..Sampling::default()
        };
        // exp(-1) ≈ 0.37 stays, exp(-2) ≈ 0.14 goes.
        assert_eq!(one(&m), 1);
        assert_eq!(one(&Sampling::default()), 3);
    }

    #[test]
    fn seeded_sampling_repeats() {
        let l = [0.1, 0.2, 0.3, 0.4, 0.5];
        let a: Vec<u32> = {
            let mut r = Rng::new(7);
            (0..20).map(|_| sample(&l, 1.0, &mut r)).collect()
        };
        let b: Vec<u32> = {
            let mut r = Rng::new(7);
            (0..20).map(|_| sample(&l, 1.0, &mut r)).collect()
        };
        assert_eq!(a, b);
    }
}
