//! Token choice: greedy with ties to the lowest id, or seeded sampling from a
//! per-request generator so a request's tokens never depend on its batch.

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

/// Samples from `softmax(logits / temperature)`; greedy when temperature is 0.
pub fn sample(logits: &[f32], temperature: f32, rng: &mut Rng) -> u32 {
    if is_greedy(temperature) {
        return argmax(logits);
    }
    let max = logits
        .iter()
        .copied()
        .filter(|v| !v.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    // Sequential sums in f64, in token order: fixed, batch-independent.
    let weights: Vec<f64> = logits
        .iter()
        .map(|&v| {
            if v.is_nan() {
                0.0
            } else {
                (((v - max) / temperature) as f64).exp()
            }
        })
        .collect();
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
