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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_go_to_lowest_id() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5, 0.5]), 1);
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
