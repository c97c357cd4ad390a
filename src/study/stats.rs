//! The statistics of a study: mean, sample standard deviation and a Student-t 95 % interval of a
//! metric over seeds, and the paired difference of two settings run on the same seeds; for claims
//! ([`super::claims`]): one-sided and equivalence (TOST) tests, the exact sign-flip test, Holm's
//! correction, and the power of a paired t-test.

use statrs::distribution::{ContinuousCDF, StudentsT};

/// A metric over `n` runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    pub n: usize,
    pub mean: f64,
    /// Sample standard deviation (n − 1 in the denominator); NaN for one run.
    pub sd: f64,
    /// 95 % confidence interval of the mean, `mean ± t(0.975, n−1)·sd/√n`; `None` for one run.
    pub ci95: Option<(f64, f64)>,
}

/// The Student-t quantile `t(0.975, df)`: half-width of a 95 % interval in standard errors.
pub fn t975(df: usize) -> f64 {
    StudentsT::new(0.0, 1.0, df as f64).expect("df ≥ 1").inverse_cdf(0.975)
}

/// Mean, standard deviation and 95 % interval of `xs` (non-empty).
pub fn describe(xs: &[f64]) -> Stats {
    let n = xs.len();
    assert!(n > 0, "describe: no values");
    let mean = xs.iter().sum::<f64>() / n as f64;
    if n == 1 {
        return Stats { n, mean, sd: f64::NAN, ci95: None };
    }
    let sd = (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt();
    let half = t975(n - 1) * sd / (n as f64).sqrt();
    Stats { n, mean, sd, ci95: Some((mean - half, mean + half)) }
}

/// The paired comparison of setting A against baseline B on the same seeds: the statistics of
/// the differences `a_i − b_i`, and the two-sided p-value of the paired t-test (`None` below two
/// pairs, or when every difference is the same).
#[derive(Debug, Clone, PartialEq)]
pub struct Paired {
    pub diff: Stats,
    pub p: Option<f64>,
}

/// `pairs`: `(a_i, b_i)` for each shared seed (non-empty).
pub fn paired(pairs: &[(f64, f64)]) -> Paired {
    let d: Vec<f64> = pairs.iter().map(|(a, b)| a - b).collect();
    let diff = describe(&d);
    let p = (diff.n > 1 && diff.sd > 0.0).then(|| t_test_p(&diff));
    Paired { diff, p }
}

/// The Student-t quantile `t(q, df)`.
pub fn t_quantile(q: f64, df: usize) -> f64 {
    StudentsT::new(0.0, 1.0, df as f64).expect("df ≥ 1").inverse_cdf(q)
}

/// P(T ≤ t) for a Student t with `df` degrees of freedom; ±∞ give 1 and 0.
fn t_cdf(t: f64, df: usize) -> f64 {
    if t.is_infinite() {
        return if t > 0.0 { 1.0 } else { 0.0 };
    }
    StudentsT::new(0.0, 1.0, df as f64).expect("df ≥ 1").cdf(t)
}

/// The t statistic of `d`'s mean against `shift`: `(mean − shift) / (sd/√n)`; a zero spread
/// gives ±∞ (or 0 when the mean is the shift), the limit a test takes as the spread vanishes.
fn t_stat(d: &Stats, shift: f64) -> f64 {
    let se = d.sd / (d.n as f64).sqrt();
    let x = d.mean - shift;
    if se > 0.0 {
        x / se
    } else if x == 0.0 {
        0.0
    } else {
        x.signum() * f64::INFINITY
    }
}

/// Two-sided p of the one-sample t-test of `d`'s mean = 0 (`d.n ≥ 2`).
pub fn t_test_p(d: &Stats) -> f64 {
    2.0 * (1.0 - t_cdf(t_stat(d, 0.0).abs(), d.n - 1))
}

/// One-sided p that `d`'s mean exceeds `shift` (H1: mean > shift; `d.n ≥ 2`).
pub fn p_greater(d: &Stats, shift: f64) -> f64 {
    1.0 - t_cdf(t_stat(d, shift), d.n - 1)
}

/// One-sided p that `d`'s mean is below `shift` (H1: mean < shift; `d.n ≥ 2`).
pub fn p_less(d: &Stats, shift: f64) -> f64 {
    t_cdf(t_stat(d, shift), d.n - 1)
}

/// The equivalence test (two one-sided tests, TOST) of `|mean| < margin`: the larger of the two
/// one-sided p's; small when the mean is shown to lie inside `(−margin, margin)`.
pub fn tost_p(d: &Stats, margin: f64) -> f64 {
    p_greater(d, -margin).max(p_less(d, margin))
}

/// The interval `mean ± t(1 − (1 − level)/2, n − 1)·sd/√n` (`d.n ≥ 2`).
pub fn interval(d: &Stats, level: f64) -> (f64, f64) {
    let half = t_quantile(1.0 - (1.0 - level) / 2.0, d.n - 1) * d.sd / (d.n as f64).sqrt();
    (d.mean - half, d.mean + half)
}

/// The exact two-sided sign-flip (permutation) p of paired differences `d` having mean 0: the
/// share of the 2ⁿ sign assignments whose |sum| is at least the observed one. It needs no
/// normality, but cannot go below 2/2ⁿ (0.25 at n = 3). `None` above 20 pairs.
pub fn sign_flip_p(d: &[f64]) -> Option<f64> {
    let n = d.len();
    if n == 0 || n > 20 {
        return None;
    }
    let observed = d.iter().sum::<f64>().abs();
    // Ties within round-off count as at least as extreme.
    let tol = 1e-12 * d.iter().map(|x| x.abs()).sum::<f64>();
    let extreme = (0u32..1 << n)
        .filter(|mask| {
            let s: f64 = d.iter().enumerate().map(|(i, x)| if mask >> i & 1 == 1 { -x } else { *x }).sum();
            s.abs() >= observed - tol
        })
        .count();
    Some(extreme as f64 / (1u64 << n) as f64)
}

/// Holm's step-down adjustment of a family's p-values (same order as given): the k-th smallest
/// is multiplied by `m − k + 1`, made monotone, and capped at 1. A claim of the family is
/// significant at α when its adjusted p is below α; the family-wise error stays ≤ α.
pub fn holm(ps: &[f64]) -> Vec<f64> {
    let m = ps.len();
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|&a, &b| ps[a].total_cmp(&ps[b]));
    let mut out = vec![0.0; m];
    let mut running: f64 = 0.0;
    for (k, &i) in order.iter().enumerate() {
        running = running.max(((m - k) as f64 * ps[i]).min(1.0));
        out[i] = running;
    }
    out
}

/// The smallest true mean difference a two-sided paired t-test at level `alpha` detects with
/// probability `power`, with `n` pairs whose differences have standard deviation `sd`:
/// `(t(1 − α/2, n−1) + t(power, n−1))·sd/√n` (the usual approximation of the noncentral t).
pub fn detectable(sd: f64, n: usize, alpha: f64, power: f64) -> f64 {
    (t_quantile(1.0 - alpha / 2.0, n - 1) + t_quantile(power, n - 1)) * sd / (n as f64).sqrt()
}

/// The power of the two-sided paired t-test at level `alpha` to detect `effect` with `n` pairs of
/// spread `sd`: the inverse of [`detectable`] (the same normal-shift approximation to the
/// non-central t), `P(T_{n−1} ≤ |effect|·√n/sd − t(1 − α/2, n − 1))`; 1 without spread.
pub fn power(sd: f64, n: usize, effect: f64, alpha: f64) -> f64 {
    if n < 2 {
        return f64::NAN;
    }
    if sd == 0.0 {
        return 1.0;
    }
    t_cdf(effect.abs() * (n as f64).sqrt() / sd - t_quantile(1.0 - alpha / 2.0, n - 1), n - 1)
}

/// The fewest pairs (2 … 100,000) at which [`detectable`] reaches `effect`; `None` beyond.
pub fn pairs_needed(sd: f64, effect: f64, alpha: f64, power: f64) -> Option<usize> {
    if sd == 0.0 {
        return Some(2);
    }
    let ok = |n: usize| detectable(sd, n, alpha, power) <= effect.abs();
    if !ok(100_000) {
        return None;
    }
    // detectable falls with n: bisect.
    let (mut lo, mut hi) = (2usize, 100_000usize);
    if ok(lo) {
        return Some(lo);
    }
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if ok(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The power of the test is the inverse of the detectable effect: at the effect detectable with
    /// 80 % power, 80 %; more at a larger effect, less at a smaller one.
    #[test]
    fn power_inverts_the_detectable_effect() {
        for (sd, n, alpha) in [(1.0, 5, 0.05), (0.3, 10, 0.025), (2.0, 30, 0.01)] {
            let d = detectable(sd, n, alpha, 0.8);
            assert!((power(sd, n, d, alpha) - 0.8).abs() < 1e-9, "{sd} {n} {alpha}");
            assert!(power(sd, n, 2.0 * d, alpha) > 0.99 && power(sd, n, 0.3 * d, alpha) < 0.3);
        }
        assert_eq!(power(0.0, 3, 0.1, 0.05), 1.0);
    }

    #[test]
    fn t_quantiles_match_the_tables() {
        // Standard tables: t(0.975, 1) = 12.706, t(0.975, 2) = 4.303, t(0.975, 4) = 2.776, t(0.975, 30) = 2.042.
        for (df, t) in [(1, 12.706), (2, 4.303), (4, 2.776), (30, 2.042)] {
            assert!((t975(df) - t).abs() < 1e-3, "df {df}: {}", t975(df));
        }
    }

    #[test]
    fn one_run_has_a_mean_and_no_spread() {
        let s = describe(&[0.5]);
        assert_eq!((s.n, s.mean, s.ci95), (1, 0.5, None));
        assert!(s.sd.is_nan());
    }

    /// Reference values from SciPy 1.x (`ttest_1samp` with `alternative`, `t.interval`,
    /// `permutation_test(..., permutation_type='samples', n_resamples=inf)`, `nct` for power),
    /// computed outside this repository on the same numbers.
    #[test]
    fn tests_match_scipy() {
        let d = [3.1, 1.2, 2.5, 0.4, 1.9, 2.2];
        let s = describe(&d);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9 * b.abs().max(1e-3);
        assert!(close(t_test_p(&s), 0.004905857429700768), "{}", t_test_p(&s));
        assert!(close(p_greater(&s, 1.0), 0.03718905714598594));
        assert!(close(tost_p(&s, 3.0), 0.018060220495494914));
        let (lo, hi) = interval(&s, 0.9);
        assert!(close(lo, 1.0918584024302849) && close(hi, 2.6748082642363817), "{lo} {hi}");
        assert_eq!(sign_flip_p(&d), Some(0.03125));
        assert_eq!(sign_flip_p(&[0.5, -0.2, 0.3]), Some(0.5));
        // n = 3: no assignment is more extreme than all-positive and its mirror: 2/8.
        assert_eq!(sign_flip_p(&[1.0, 2.0, 3.0]), Some(0.25));
        let h = holm(&[0.01, 0.04, 0.03, 0.005]);
        for (a, b) in h.iter().zip([0.03, 0.06, 0.06, 0.02]) {
            assert!(close(*a, b), "{h:?}");
        }
        // Power: effect 0.5 sd of the differences, α = 0.05, 80 %: SciPy's noncentral t gives
        // 0.795 at 33 pairs and 0.808 at 34; the approximation agrees on 34.
        assert_eq!(pairs_needed(1.0, 0.5, 0.05, 0.8), Some(34));
        assert!(close(detectable(2.0, 5, 0.05, 0.8), 3.3249523000544148));
    }

    #[test]
    fn a_difference_without_spread_is_certain_and_a_zero_one_is_not() {
        let s = describe(&[2.0, 2.0, 2.0]);
        assert_eq!(t_test_p(&s), 0.0);
        assert_eq!(tost_p(&s, 1.0), 1.0);
        assert_eq!(tost_p(&s, 3.0), 0.0);
        assert_eq!(t_test_p(&describe(&[0.0, 0.0])), 1.0);
    }
}
