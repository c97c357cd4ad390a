//! The statistics of a study: mean, sample standard deviation and a Student-t 95 % interval of a
//! metric over seeds, and the paired difference of two settings run on the same seeds.

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
    let p = (diff.n > 1 && diff.sd > 0.0).then(|| {
        let t = diff.mean / (diff.sd / (diff.n as f64).sqrt());
        let dist = StudentsT::new(0.0, 1.0, (diff.n - 1) as f64).expect("df ≥ 1");
        2.0 * (1.0 - dist.cdf(t.abs()))
    });
    Paired { diff, p }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
