//! Statistics used in the paper: Wilson (1927) score interval, exact McNemar (1947) test, Holm (1979) step-down adjustment.
//!
//! Layer: a leaf; it uses nothing else of the crate, and any layer may use it.

/// The 0.975 quantile of the standard normal distribution (two-sided 95%).
pub const Z_95: f64 = 1.959963984540054;

/// 95% Wilson score interval for `successes` out of `n`, clamped to [0, 1]; (0, 1) when `n == 0`.
pub fn wilson(successes: u64, n: u64) -> (f64, f64) {
    wilson_z(successes, n, Z_95)
}

/// Wilson score interval for `successes` out of `n` with critical value `z`, clamped to [0, 1]; (0, 1) when `n == 0`.
pub fn wilson_z(successes: u64, n: u64, z: f64) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let k = successes.min(n) as f64;
    let n = n as f64;
    let p = k / n;
    let z2 = z * z;
    let denom = 1.0 + z2 / n;
    let center = (p + z2 / (2.0 * n)) / denom;
    let half = z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / denom;
    let lo = if k == 0.0 { 0.0 } else { center - half };
    let hi = if k == n { 1.0 } else { center + half };
    (lo.clamp(0.0, 1.0), hi.clamp(0.0, 1.0))
}

/// Exact two-sided McNemar p-value for discordant counts `b` and `c`: min(1, 2 P(X <= min(b, c))), X ~ Bin(b + c, 1/2).
pub fn mcnemar_exact(b: u64, c: u64) -> f64 {
    let n = b + c;
    let k = b.min(c);
    if n == 0 || 2 * k >= n {
        return 1.0;
    }
    // log P(X = k); P(X = i) is increasing in i for i <= k < n/2, so the sum below
    // is taken relative to its largest term and never underflows spuriously.
    let log_pk = ln_choose(n, k) - (n as f64) * std::f64::consts::LN_2;
    let mut sum = 1.0_f64;
    let mut term = 1.0_f64;
    let mut i = k;
    while i > 0 {
        // P(X = i - 1) / P(X = i) = i / (n - i + 1)
        term *= i as f64 / (n - i + 1) as f64;
        sum += term;
        if term < sum * 1e-17 {
            break;
        }
        i -= 1;
    }
    (log_pk + (2.0 * sum).ln()).exp().min(1.0)
}

/// Holm step-down adjusted p-values, returned in input order, monotone and capped at 1.
pub fn holm(p: &[f64]) -> Vec<f64> {
    let m = p.len();
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|&a, &b| p[a].total_cmp(&p[b]));
    let mut adj = vec![0.0; m];
    let mut running = 0.0_f64;
    for (j, &idx) in order.iter().enumerate() {
        let v = ((m - j) as f64 * p[idx]).min(1.0);
        running = running.max(v);
        adj[idx] = running;
    }
    adj
}

/// ln C(n, k).
fn ln_choose(n: u64, k: u64) -> f64 {
    ln_factorial(n) - ln_factorial(k) - ln_factorial(n - k)
}

/// ln(n!): exact product below 20, Stirling series (relative error < 1e-16) above.
fn ln_factorial(n: u64) -> f64 {
    if n < 20 {
        return (2..=n).map(|i| i as f64).product::<f64>().ln();
    }
    let x = n as f64;
    let x2 = x * x;
    let series = (1.0 / 12.0 - (1.0 / 360.0 - (1.0 / 1260.0 - (1.0 / 1680.0) / x2) / x2) / x2) / x;
    x * x.ln() - x + 0.5 * (2.0 * std::f64::consts::PI * x).ln() + series
}

#[cfg(test)]
mod tests {
    //! Reference values printed by tests/fixtures/stats_reference.py with
    //! Python 3.11.7, numpy 2.4.6, scipy 1.17.1, statsmodels 0.15.0.
    //! Tolerance: relative 1e-9, or absolute 1e-12 where the reference is 0.
    use super::*;

    fn close(got: f64, want: f64) -> bool {
        if want == 0.0 {
            got.abs() <= 1e-12
        } else {
            ((got - want) / want).abs() <= 1e-9
        }
    }

    fn assert_close(got: f64, want: f64, what: &str) {
        assert!(close(got, want), "{what}: got {got:e}, want {want:e}");
    }

    #[test]
    fn wilson_matches_statsmodels() {
        // statsmodels proportion_confint(k, n, alpha=0.05, method="wilson")
        let cases: &[(u64, u64, f64, f64)] = &[
            (0, 10, 0.0, 0.27753279986288926),
            (10, 10, 0.7224672001371106, 1.0),
            (5, 10, 0.23659309051256394, 0.7634069094874361),
            (128, 128, 0.9708630437264916, 1.0),
            (70, 128, 0.4605263667221713, 0.6304920436271872),
            (1, 3, 0.06149194472039626, 0.7923403991979523),
            (0, 1, 0.0, 0.7934506856227627),
            (37, 1000, 0.026961180875554734, 0.05058239748206931),
        ];
        for &(k, n, lo, hi) in cases {
            let (l, h) = wilson(k, n);
            assert_close(l, lo, &format!("wilson({k},{n}).lo"));
            assert_close(h, hi, &format!("wilson({k},{n}).hi"));
        }
    }

    #[test]
    fn wilson_edge_cases() {
        assert_eq!(wilson(0, 0), (0.0, 1.0));
        assert_eq!(wilson(0, 10).0, 0.0);
        assert_eq!(wilson(10, 10).1, 1.0);
        assert_eq!(wilson(5, 10), wilson_z(5, 10, Z_95));
        let (l, h) = wilson_z(5, 10, 0.0);
        assert_close(l, 0.5, "z=0 lo");
        assert_close(h, 0.5, "z=0 hi");
    }

    #[test]
    fn mcnemar_matches_scipy() {
        // scipy binomtest(min(b, c), b + c, 0.5, alternative="two-sided").pvalue
        let cases: &[(u64, u64, f64)] = &[
            (0, 0, 1.0),
            (0, 5, 0.0625),
            (1, 9, 0.021484375),
            (3, 3, 1.0),
            (10, 25, 0.016673847800120715),
            (40, 60, 0.05688793364098089),
            (500, 560, 0.06990955946026937),
            (900, 1100, 8.45708953550381e-06),
            (0, 1000, 1.8665272370064378e-301),
            (3, 1000, 3.923720417925807e-294),
            (1000, 0, 1.8665272370064378e-301),
        ];
        for &(b, c, p) in cases {
            assert_close(mcnemar_exact(b, c), p, &format!("mcnemar({b},{c})"));
        }
    }

    #[test]
    fn mcnemar_extremes() {
        // 2 * 0.5^2000 = 2^-1999 underflows f64; scipy also returns exactly 0.0.
        assert_eq!(mcnemar_exact(0, 2000), 0.0);
        assert!(mcnemar_exact(0, 1000) > 0.0);
        assert_eq!(mcnemar_exact(1, 0), 1.0);
        assert_eq!(mcnemar_exact(2500, 2500), 1.0);
        assert_eq!(mcnemar_exact(7, 3), mcnemar_exact(3, 7));
        let p = mcnemar_exact(2450, 2550);
        assert!(p > 0.0 && p < 1.0);
    }

    #[test]
    fn holm_matches_statsmodels() {
        // statsmodels multipletests(p, method="holm")[1]
        let fam4 = [0.01, 0.04, 0.03, 0.005];
        let want4 = [0.03, 0.06, 0.06, 0.02];
        // ties (0.02, 0.02) and saturation at 1
        let fam6 = [0.02, 0.5, 0.02, 0.001, 0.9, 0.3];
        let want6 = [0.1, 1.0, 0.1, 0.006, 1.0, 0.8999999999999999];
        for (fam, want) in [(&fam4[..], &want4[..]), (&fam6[..], &want6[..])] {
            let got = holm(fam);
            assert_eq!(got.len(), want.len());
            for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
                assert_close(g, w, &format!("holm {fam:?}[{i}]"));
            }
        }
        assert!(holm(&[]).is_empty());
        assert_eq!(holm(&[0.7]), vec![0.7]);
    }
}
