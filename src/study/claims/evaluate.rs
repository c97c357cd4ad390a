//! The rule applied to the runs: each claim's values per seed, its statistic and p, Holm's
//! correction within its family, the verdict, and the sensitivity line.

use super::arm::arm_runs;
use super::{check, Claim, ClaimResult, Expect, Scale, Verdict};
use crate::study::collect::RunRecord;
use crate::study::metric::{one_value_at, one_value_per_step, Metric};
use crate::study::stats::{self, Stats};
use anyhow::{bail, Result};

/// The value of `metric` in `run` (see [`Claim::metric`]); `CURVE@STEP` is read from the run's
/// curves unless the record already holds it (a report read back from its runs.csv).
pub fn metric_value(run: &RunRecord, metric: &str) -> Result<f64> {
    if let Some(v) = run.metrics.get(metric) {
        return Ok(*v);
    }
    let name = run.dir.display().to_string();
    // How fast the loss falls, read from the loss curve where the record does not hold it (a
    // runs.csv holds what its report read; the sensitivity line reads the others).
    if crate::study::sensitivity::derived_from_loss(metric) {
        let loss = run.curve("loss")?;
        return crate::study::sensitivity::from_loss_curve(metric, &loss).ok_or_else(|| match loss.is_empty() {
            true => anyhow::anyhow!("run {name}: no metric `{metric}`, and no loss curve to read it from"),
            false => anyhow::anyhow!("run {name}: `{metric}`: the loss does not get there in the run"),
        });
    }
    match Metric::parse(metric)? {
        Metric::AtStep { curve, step } => {
            let points = run.curve(&curve)?;
            if let Some(y) = one_value_at(&name, &curve, &points, step)? {
                return Ok(y);
            }
            let logged: Vec<String> = points.iter().map(|(x, _)| x.to_string()).collect();
            bail!(
                "run {name}: curve `{curve}` has no value at step {step}; it is logged at steps {}",
                if logged.is_empty() { "none".to_string() } else { logged.join(", ") }
            );
        }
        Metric::AtFirstReach { curve, when, threshold } => value_at_first_reach(run, metric, &curve, &when, threshold),
        Metric::Number(_) => bail!(
            "run {name}: no metric `{metric}`; it has: {}",
            run.metrics.keys().map(String::as_str).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// `CURVE@WHEN>=V`: the value of `curve` at the first logged step where the curve `when` reaches
/// `threshold` — the run as a stop rule would have ended it ("train until the accuracy reaches V"),
/// since a run stopped there holds exactly the weights this run held at that step. An error
/// (the claim is then not computable for the run) when `when` never reaches `threshold`, or
/// `curve` is not logged at that step.
fn value_at_first_reach(run: &RunRecord, metric: &str, curve: &str, when: &str, threshold: f64) -> Result<f64> {
    let name = run.dir.display().to_string();
    let stops = run.curve(when)?;
    // The first step that reaches the level must be one step with one value, as must the
    // curve read there (two rows of one step would make the stop, or the value, chance).
    one_value_per_step(&name, when, &stops)?;
    if stops.is_empty() {
        bail!("run {}: metric `{metric}`: the run logs no curve `{when}` to stop on", run.dir.display());
    }
    let Some(&(step, _)) = stops.iter().find(|(_, y)| *y >= threshold) else {
        let best = stops.iter().map(|p| p.1).fold(f64::NAN, f64::max);
        bail!(
            "run {}: metric `{metric}`: `{when}` never reaches {threshold} (its highest: {best} at step {}); \
             train longer or lower the threshold",
            run.dir.display(),
            stops.iter().find(|p| p.1 == best).map_or(f64::NAN, |p| p.0)
        );
    };
    let points = run.curve(curve)?;
    match one_value_at(&name, curve, &points, step)? {
        Some(y) => Ok(y),
        None => bail!(
            "run {}: metric `{metric}`: `{when}` reaches {threshold} at step {step}, where `{curve}` is not logged \
             (log both at common steps: log.eval_every a multiple of log.every)",
            run.dir.display()
        ),
    }
}

/// The mean Pearson correlation over every pair of `v`'s vectors whose indices `idx` differ as
/// runs (`idx[i] != idx[j]`: a bootstrap sample may hold a run twice).
pub(super) fn mean_pairwise_r(v: &[Vec<f64>], idx: &[usize]) -> f64 {
    let (mut sum, mut n) = (0.0, 0usize);
    for i in 0..idx.len() {
        for j in i + 1..idx.len() {
            if idx[i] != idx[j] {
                sum += crate::analysis::pearson(&v[idx[i]], &v[idx[j]]);
                n += 1;
            }
        }
    }
    sum / n as f64
}

/// Permutations of the layer order and bootstrap resamples of the seeds behind an `across_seeds`
/// claim; a fixed stream, so that a report is reproducible.
pub(super) const PERMUTATIONS: usize = 9_999;
const RESAMPLES: usize = 2_000;

/// r̄ of `v` (one vector per seed), its one-sided permutation p's (as high, as low) and the
/// bootstrap interval over seeds at `level`.
pub fn seed_correlation(v: &[Vec<f64>], level: f64) -> (f64, f64, f64, (f64, f64)) {
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};
    let all: Vec<usize> = (0..v.len()).collect();
    let r = mean_pairwise_r(v, &all);
    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(0x5eed_c0de);
    let (mut high, mut low) = (0usize, 0usize);
    let mut shuffled = v.to_vec();
    for _ in 0..PERMUTATIONS {
        for s in shuffled.iter_mut() {
            s.shuffle(&mut rng);
        }
        let rp = mean_pairwise_r(&shuffled, &all);
        high += usize::from(rp >= r);
        low += usize::from(rp <= r);
    }
    let p = |k: usize| (1 + k) as f64 / (1 + PERMUTATIONS) as f64;
    let mut boot: Vec<f64> = (0..RESAMPLES)
        .filter_map(|_| {
            let idx: Vec<usize> = (0..v.len()).map(|_| rng.gen_range(0..v.len())).collect();
            let r = mean_pairwise_r(v, &idx);
            r.is_finite().then_some(r)
        })
        .collect();
    boot.sort_by(f64::total_cmp);
    // Every resample degenerate (one run drawn every time) leaves no interval rather than a panic.
    let q = |f: f64| match boot.len() {
        0 => f64::NAN,
        n => boot[((f * (n - 1) as f64).round() as usize).min(n - 1)],
    };
    let tail = (1.0 - level) / 2.0;
    (r, p(high), p(low), (q(tail), q(1.0 - tail)))
}

/// A paired claim's verdict (`significant`: its Holm p below α; `alpha_m`: α over the family's
/// size), its interval at the corrected level, the smallest detectable |Δ|, the seeds the paper's
/// effect would need and the power these seeds had for it. The checks run in the documented order
/// (docs/studies.md, "Claims and verdicts"): for a direction, an effect shown smaller than the
/// margin that would matter first (a significant but negligible effect does not hold), then the
/// direction, then the paper's effect excluded, then power.
pub(super) fn paired_verdict(claim: &Claim, diff: &Stats, significant: bool, alpha_m: f64) -> Judged {
    assert!(
        diff.mean.is_finite() && (diff.n < 2 || diff.sd.is_finite()),
        "claim `{}`: a verdict from non-finite differences (mean {}, sd {})",
        claim.id,
        diff.mean,
        diff.sd
    );
    let verdict = match claim.expect {
        Expect::Less | Expect::Greater => {
            let right_way = (claim.expect == Expect::Less) == (diff.mean < 0.0);
            let shown_small = claim.margin.is_some_and(|mg| stats::tost_p(diff, mg) < alpha_m);
            // Δ shown to lie on the near side of the paper's effect (one-sided, at α/m).
            let excluded = claim.effect.is_some_and(|e| {
                if e < 0.0 {
                    stats::p_greater(diff, e) < alpha_m
                } else {
                    stats::p_less(diff, e) < alpha_m
                }
            });
            if shown_small {
                Verdict::DoesNotHold
            } else if significant && diff.mean != 0.0 {
                if right_way {
                    Verdict::Holds
                } else {
                    Verdict::DoesNotHold
                }
            } else if excluded {
                Verdict::EffectExcluded
            } else {
                Verdict::Inconclusive
            }
        }
        Expect::Equivalent => {
            let mg = claim.margin.expect("checked");
            let outside = stats::p_greater(diff, mg).min(stats::p_less(diff, -mg));
            if significant {
                Verdict::Holds
            } else if outside < alpha_m {
                Verdict::DoesNotHold
            } else {
                Verdict::Inconclusive
            }
        }
        Expect::AtMost | Expect::AtLeast => {
            let mg = claim.margin.expect("checked");
            // Worse than B by the margin or more, shown one-sided at α/m.
            let worse = match claim.expect {
                Expect::AtMost => stats::p_greater(diff, mg),
                _ => stats::p_less(diff, -mg),
            };
            if significant {
                Verdict::Holds
            } else if worse < alpha_m {
                Verdict::DoesNotHold
            } else {
                Verdict::Inconclusive
            }
        }
    };
    let sd = if diff.sd.is_finite() { diff.sd } else { 0.0 };
    let seeds_needed = claim.effect.map(|e| stats::pairs_needed(sd, e, alpha_m, 0.8));
    let power = claim.effect.map(|e| stats::power(sd, diff.n, e, alpha_m));
    let verdict = match (verdict, seeds_needed) {
        (Verdict::Inconclusive, Some(need)) if need.is_none_or(|n| n > diff.n) => Verdict::Underpowered(need),
        (v, _) => v,
    };
    // A one-sided test at α/m (TOST's two, non-inferiority's one) matches the bound of the
    // two-sided interval at 1 − 2α/m.
    let level = match claim.expect {
        Expect::Equivalent | Expect::AtMost | Expect::AtLeast => 1.0 - 2.0 * alpha_m,
        _ => 1.0 - alpha_m,
    };
    (verdict, stats::interval(diff, level), stats::detectable(sd, diff.n, alpha_m, 0.8), seeds_needed, power)
}

/// An across-seeds claim's verdict, its bootstrap interval at the corrected level, and no power
/// line (the permutation test has none).
fn across_seeds_verdict(profiles: &[Vec<f64>], significant: bool, alpha_m: f64) -> Judged {
    let (r, _, p_low, interval) = seed_correlation(profiles, 1.0 - alpha_m);
    assert!(r.is_finite(), "a verdict across seeds from a correlation that is not finite ({r})");
    let verdict = if significant && r > 0.0 {
        Verdict::Holds
    } else if p_low < alpha_m {
        Verdict::DoesNotHold
    } else {
        Verdict::Inconclusive
    };
    (verdict, interval, f64::NAN, None, None)
}

/// A verdict, the interval of the claim's statistic, the smallest detectable effect, the seeds the
/// paper's effect would need and the power these seeds had for it.
type Judged = (Verdict, (f64, f64), f64, Option<Option<usize>>, Option<f64>);

/// The first value in `values` (seed, value) that no statistic can take: not finite, or (for a
/// log scale) not positive.
fn not_computable(what: &str, values: &[(u64, f64)], log: bool) -> Option<String> {
    values.iter().find_map(|&(seed, v)| {
        if !v.is_finite() {
            Some(format!("seed {seed}'s {what} is {v}"))
        } else if log && v <= 0.0 {
            Some(format!("seed {seed}'s {what} is {v}, and `scale: log` needs positive values"))
        } else {
            None
        }
    })
}

/// One claim's numbers before Holm's correction.
struct Partial {
    claim: Claim,
    /// `(seed, A, B)` (an `across_seeds` claim: `(seed, NaN, NaN)`).
    pairs: Vec<(u64, f64, f64)>,
    diff: Stats,
    p: f64,
    p_sign_flip: Option<f64>,
    profiles: Vec<Vec<f64>>,
    /// Why no statistic can be computed, where none can.
    not_computable: Option<String>,
}

/// An across-seeds claim's numbers: its arm's vector on each seed (of length `size` exactly), then
/// r̄ and its permutation p — or why they cannot be computed (an entry that is not finite, a
/// constant vector: no correlation).
fn across_seeds_partial(c: &Claim, runs: &[RunRecord]) -> Result<Partial> {
    let of_arm = arm_runs(c, "a", &c.a, runs)?;
    if of_arm.len() < 3 {
        bail!("claim `{}`: {} seed(s) of a ({}); a correlation across seeds needs at least 3", c.id, of_arm.len(), c.a);
    }
    let size = c.size.expect("checked");
    let mut per_seed = Vec::new();
    for &(seed, r) in &of_arm {
        let past = format!("{}[{size}]", c.metric);
        if r.metrics.contains_key(&past) {
            let len = (size..).take_while(|i| r.metrics.contains_key(&format!("{}[{i}]", c.metric))).count() + size;
            bail!(
                "claim `{}`: `size: {size}`, but run {} has {len} entries of `{}` ({}[0..{len}]); `size` must be the \
                 vector's length (a shorter one would test a prefix)",
                c.id,
                r.dir.display(),
                c.metric,
                c.metric
            );
        }
        let v = c.metrics().iter().map(|m| metric_value(r, m)).collect::<Result<Vec<f64>>>()?;
        per_seed.push((seed, v));
    }
    let why = per_seed.iter().find_map(|(seed, v)| {
        if let Some(i) = v.iter().position(|x| !x.is_finite()) {
            Some(format!("seed {seed}'s {}[{i}] is {}", c.metric, v[i]))
        } else if v.iter().all(|x| *x == v[0]) {
            Some(format!("seed {seed}'s vector {}[0..{size}] is constant (it has no correlation)", c.metric))
        } else {
            None
        }
    });
    let profiles: Vec<Vec<f64>> = per_seed.iter().map(|p| p.1.clone()).collect();
    let pairs = per_seed.iter().map(|p| (p.0, f64::NAN, f64::NAN)).collect();
    // Kept in the paired claims' places: the seeds, r̄ as the mean, p (one-sided, as high).
    let (r, p_high) = match why {
        None => {
            let (r, p_high, _, _) = seed_correlation(&profiles, 0.95);
            (r, p_high)
        }
        Some(_) => (f64::NAN, f64::NAN),
    };
    let diff = Stats { n: profiles.len(), mean: r, sd: f64::NAN, ci95: None };
    Ok(Partial { claim: c.clone(), pairs, diff, p: p_high, p_sign_flip: None, profiles, not_computable: why })
}

/// A paired claim's numbers: the runs of arms a and b on the seeds both ran, their differences,
/// the test's p and the sign-flip p — or why they cannot be computed (a value that is not finite,
/// or not positive on a log scale).
fn paired_partial(c: &Claim, runs: &[RunRecord]) -> Result<Partial> {
    let (a, b) = (arm_runs(c, "a", &c.a, runs)?, arm_runs(c, "b", &c.b, runs)?);
    let mut pairs = Vec::new();
    for &(seed, ra) in &a {
        if let Some((_, rb)) = b.iter().find(|(s, _)| *s == seed) {
            pairs.push((seed, metric_value(ra, &c.metric)?, metric_value(rb, c.metric_of_b())?));
        }
    }
    if pairs.len() < 2 {
        let seeds = |v: &[(u64, &RunRecord)]| v.iter().map(|p| p.0.to_string()).collect::<Vec<_>>().join(", ");
        bail!(
            "claim `{}`: {} shared seed(s) between a ({}: seeds {}) and b ({}: seeds {}); a verdict needs at least 2",
            c.id,
            pairs.len(),
            c.a,
            seeds(&a),
            c.b,
            seeds(&b)
        );
    }
    let log = c.scale == Scale::Log;
    let why = not_computable(&format!("A ({})", c.metric), &pairs.iter().map(|p| (p.0, p.1)).collect::<Vec<_>>(), log)
        .or_else(|| {
            not_computable(
                &format!("B ({})", c.metric_of_b()),
                &pairs.iter().map(|p| (p.0, p.2)).collect::<Vec<_>>(),
                log,
            )
        });
    if let Some(why) = why {
        let diff = Stats { n: pairs.len(), mean: f64::NAN, sd: f64::NAN, ci95: None };
        return Ok(Partial {
            claim: c.clone(),
            pairs,
            diff,
            p: f64::NAN,
            p_sign_flip: None,
            profiles: vec![],
            not_computable: Some(why),
        });
    }
    let d: Vec<f64> = pairs.iter().map(|&(_, x, y)| if log { x.ln() - y.ln() } else { x - y }).collect();
    let diff = stats::describe(&d);
    let p = match (c.expect, c.margin) {
        (Expect::Equivalent, Some(mg)) => stats::tost_p(&diff, mg),
        (Expect::AtMost, Some(mg)) => stats::p_less(&diff, mg),
        (Expect::AtLeast, Some(mg)) => stats::p_greater(&diff, -mg),
        _ => stats::t_test_p(&diff),
    };
    let p_sign_flip = if d.len() <= 10 { stats::sign_flip_p(&d) } else { None };
    Ok(Partial { claim: c.clone(), pairs, diff, p, p_sign_flip, profiles: vec![], not_computable: None })
}

/// Evaluates `claims` on `runs`: pairs each claim's arms by seed, then applies the rule with
/// Holm's correction within each family. A claim whose numbers admit no statistic is "not
/// computable" (with the reason) and counts in its family's size with p = 1, so that it cannot
/// make the others' correction milder; every other outcome is computed from finite numbers only.
pub fn evaluate(claims: &[Claim], runs: &[RunRecord]) -> Result<Vec<ClaimResult>> {
    check(claims)?;
    let partial = claims
        .iter()
        .map(|c| if c.across_seeds.is_some() { across_seeds_partial(c, runs) } else { paired_partial(c, runs) })
        .collect::<Result<Vec<Partial>>>()?;
    // Holm within each family.
    let mut p_holm = vec![0.0; partial.len()];
    let mut families: Vec<&String> = claims.iter().map(|c| &c.family).collect();
    families.sort();
    families.dedup();
    let mut family_size = vec![0; partial.len()];
    for f in families {
        let idx: Vec<usize> = (0..partial.len()).filter(|&i| &partial[i].claim.family == f).collect();
        let ps: Vec<f64> =
            idx.iter().map(|&i| if partial[i].not_computable.is_some() { 1.0 } else { partial[i].p }).collect();
        let adjusted = stats::holm(&ps);
        for (k, &i) in idx.iter().enumerate() {
            p_holm[i] = if partial[i].not_computable.is_some() { f64::NAN } else { adjusted[k] };
            family_size[i] = idx.len();
        }
    }
    let sensitivity: Vec<Vec<(String, Verdict)>> =
        (0..partial.len()).map(|i| sensitivity_of(i, &partial, &family_size, runs)).collect();
    Ok(partial
        .into_iter()
        .zip(sensitivity)
        .enumerate()
        .map(|(i, (Partial { claim, pairs, diff, p, p_sign_flip, profiles, not_computable }, sensitivity))| {
            let seeds: Vec<u64> = pairs.iter().map(|p| p.0).collect();
            let values: Vec<(f64, f64)> = pairs.iter().map(|&(_, a, b)| (a, b)).collect();
            let m = family_size[i];
            let alpha_m = claim.alpha / m as f64;
            let (verdict, interval, detectable, seeds_needed, power) = match (not_computable, claim.across_seeds) {
                (Some(why), _) => (Verdict::NotComputable(why), (f64::NAN, f64::NAN), f64::NAN, None, None),
                (None, Some(_)) => across_seeds_verdict(&profiles, p_holm[i] < claim.alpha, alpha_m),
                (None, None) => paired_verdict(&claim, &diff, p_holm[i] < claim.alpha, alpha_m),
            };
            ClaimResult {
                interval,
                detectable,
                claim,
                seeds,
                values,
                diff,
                p,
                p_holm: p_holm[i],
                p_sign_flip,
                profiles,
                family_size: m,
                seeds_needed,
                power,
                verdict,
                sensitivity,
            }
        })
        .collect())
}

/// The verdict of claim `i` under each other reading of its question ([`super::sensitivity`]):
/// the reading's numbers on the same runs, its p put in the claim's place among its family's for
/// Holm's correction, and the same rule. A reading the runs cannot give is "not computable".
fn sensitivity_of(i: usize, partial: &[Partial], family_size: &[usize], runs: &[RunRecord]) -> Vec<(String, Verdict)> {
    let claim = &partial[i].claim;
    let family: Vec<usize> = (0..partial.len()).filter(|&k| partial[k].claim.family == claim.family).collect();
    let alpha_m = claim.alpha / family_size[i] as f64;
    crate::study::sensitivity::alternatives(claim)
        .into_iter()
        .map(|alt| {
            let verdict = match paired_partial(&alt.claim, runs) {
                Err(e) => Verdict::NotComputable(format!("{e:#}")),
                Ok(Partial { not_computable: Some(why), .. }) => Verdict::NotComputable(why),
                Ok(p) => {
                    let ps: Vec<f64> = family
                        .iter()
                        .map(|&k| match (k == i, &partial[k].not_computable) {
                            (true, _) => p.p,
                            (false, Some(_)) => 1.0,
                            (false, None) => partial[k].p,
                        })
                        .collect();
                    let at = family.iter().position(|&k| k == i).expect("a claim is in its family");
                    let significant = stats::holm(&ps)[at] < claim.alpha;
                    paired_verdict(&alt.claim, &p.diff, significant, alpha_m).0
                }
            };
            (alt.name, verdict)
        })
        .collect()
}
