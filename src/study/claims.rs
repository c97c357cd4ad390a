//! Pre-registered claims and their verdicts. A study's spec lists the claims it tests, each written
//! before its runs: what the paper says, the metric, the two arms compared on shared seeds, the
//! direction (or equivalence within a margin), α and the family it is corrected within. `plexus
//! report` applies one rule to every claim (docs/studies.md, "Claims and verdicts"):
//!
//! - the paired differences `d_i = A_i − B_i` over the seeds both arms ran (on `scale: log`,
//!   `ln A_i − ln B_i`: a ratio, for losses that span decades);
//! - a directional claim (`expect: less | greater`) **holds** when the two-sided paired t-test is
//!   significant after Holm's correction over the family and the mean difference points the
//!   paper's way; it **does not hold** when it is significant the other way, or when a `margin` is
//!   given and the equivalence test (TOST) shows `|Δ| < margin` at α/m (m: the family's size); else
//!   it is **inconclusive**;
//! - an equivalence claim (`expect: equivalent`, with its `margin`) **holds** when TOST is
//!   significant after Holm's correction; it **does not hold** when `|Δ| > margin` is significant at
//!   α/m; else inconclusive;
//! - an inconclusive claim with the paper's `effect` is **underpowered** when that effect needs
//!   more seeds than ran (80 % power at α/m, with the spread the runs showed).
//!
//! A claim about one arm across its seeds (`across_seeds: correlation`, with the vector metric's
//! `size`) has no arm B: its statistic is the mean Pearson correlation r̄ of the vector (say, the
//! converged residual weights `final.a[0..size]`) over every pair of seeds, and its p the share of
//! layer permutations (each seed's vector shuffled on its own, 9,999 of them, a fixed stream) with
//! an r̄ as high: the null is that the seeds share no profile over the layers. It **holds** when
//! that p is significant after Holm and r̄ > 0, **does not hold** when r̄ is as significantly
//! below what the permutations give, else inconclusive; its interval is the bootstrap over seeds.

use super::collect::RunRecord;
use super::stats::{self, Stats};
use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// What the paper says about arm A relative to arm B.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Expect {
    /// A's metric is lower than B's (a loss, a step count).
    Less,
    /// A's metric is higher than B's (an accuracy).
    Greater,
    /// A and B agree within `margin`.
    Equivalent,
}

/// The scale a claim compares on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scale {
    /// `A − B`, in the metric's unit.
    #[default]
    Linear,
    /// `ln A − ln B` (a ratio A/B): for positive quantities that span decades, such as losses.
    Log,
}

fn default_alpha() -> f64 {
    0.05
}

fn default_family() -> String {
    "study".into()
}

/// One claim of a study, as written in its spec (`claims:`), before the runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claim {
    /// A short name, unique in the study (`fig2b-0to2-faster`).
    pub id: String,
    /// What the paper says, in a sentence.
    pub statement: String,
    /// The paper and its figure or table (`ANCRe Fig. 2b`).
    pub source: String,
    /// A run metric as `plexus report` names it (`final_loss`, `best.eval.accuracy`, …), or
    /// `CURVE@STEP` for a logged curve's value at a step (`loss@300`, `eval.accuracy@400`).
    pub metric: String,
    /// Arm B's metric where it is not `metric`: with `b` the same arm as `a`, a claim about two
    /// numbers of the same runs, such as Γ at the end against its start (`metric: gamma`,
    /// `b_metric: initial.gamma`), paired run by run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub b_metric: Option<String>,
    /// Arm A: `KEY=VALUE[,KEY=VALUE…]` on the runs' config (`name=lnn-fig2b-0to2`).
    pub a: String,
    /// Arm B, the same way (none for an `across_seeds` claim).
    #[serde(default)]
    pub b: String,
    /// A statistic of arm A across its seeds instead of a paired comparison (see the module's
    /// doc): `metric` is then a vector, read as `metric[0]` … `metric[size − 1]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub across_seeds: Option<AcrossSeeds>,
    /// The length of an `across_seeds` claim's vector (2 × layers for the Mixer's residual
    /// weights: one per sublayer), fixed when the claim is written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<usize>,
    pub expect: Expect,
    #[serde(default)]
    pub scale: Scale,
    /// For `equivalent`: the largest |Δ| that counts as equal (required). For a direction: the
    /// smallest |Δ| that would matter (optional; an effect shown smaller is "does not hold").
    /// In the metric's unit, or in ln units on `scale: log`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub margin: Option<f64>,
    /// The effect the paper reports (Δ in the metric's unit, or ln A/B on `scale: log`), for the
    /// power line: the seeds it would need here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<f64>,
    #[serde(default = "default_alpha")]
    pub alpha: f64,
    /// Claims of one family are corrected together (Holm); default: the whole study.
    #[serde(default = "default_family")]
    pub family: String,
    /// How the setting departs from the paper's, and why (shown beside the verdict).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deviation: Option<String>,
}

/// A statistic of one arm over its seeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AcrossSeeds {
    /// The mean pairwise Pearson correlation of a vector metric over the arm's seeds.
    Correlation,
}

impl Claim {
    /// The metric arm B is read at: `b_metric`, else `metric`.
    pub fn metric_of_b(&self) -> &str {
        self.b_metric.as_deref().unwrap_or(&self.metric)
    }

    /// The metrics the claim reads: `metric`, and `b_metric` where it differs; an
    /// `across_seeds` claim's `metric[0]` … `metric[size − 1]`.
    pub fn metrics(&self) -> Vec<String> {
        if self.across_seeds.is_some() {
            return (0..self.size.unwrap_or(0)).map(|i| format!("{}[{i}]", self.metric)).collect();
        }
        let mut m = vec![self.metric.clone()];
        if self.metric_of_b() != self.metric {
            m.push(self.metric_of_b().to_string());
        }
        m
    }
}

/// The outcome of the rule (see the module's doc).
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Holds,
    DoesNotHold,
    Inconclusive,
    /// Inconclusive, and the paper's effect needs this many seeds (`None`: more than 100,000).
    Underpowered(Option<usize>),
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            Verdict::Holds => write!(f, "holds"),
            Verdict::DoesNotHold => write!(f, "does not hold"),
            Verdict::Inconclusive => write!(f, "inconclusive"),
            Verdict::Underpowered(Some(n)) => write!(f, "underpowered (needs {n} seeds)"),
            Verdict::Underpowered(None) => write!(f, "underpowered (needs > 100,000 seeds)"),
        }
    }
}

/// A claim's statistics and verdict.
#[derive(Debug, Clone)]
pub struct ClaimResult {
    pub claim: Claim,
    /// The shared seeds, in order.
    pub seeds: Vec<u64>,
    /// `(A, B)` of the metric on each shared seed (in the metric's unit, not its log).
    pub values: Vec<(f64, f64)>,
    /// The paired differences (`ln` ratios on `scale: log`).
    pub diff: Stats,
    /// The claim's own p (directional: two-sided t-test; equivalence: TOST), and after Holm.
    pub p: f64,
    pub p_holm: f64,
    /// The exact sign-flip p of the differences (n ≤ 10), beside the t-test's.
    pub p_sign_flip: Option<f64>,
    /// An `across_seeds` claim's vector on each seed (`seeds`' order); empty otherwise.
    pub profiles: Vec<Vec<f64>>,
    /// The family's size m and the interval of Δ at the corrected level (1 − α/m; for
    /// equivalence 1 − 2α/m, TOST's).
    pub family_size: usize,
    pub interval: (f64, f64),
    /// The smallest |Δ| detectable with 80 % power at α/m with these seeds and this spread.
    pub detectable: f64,
    /// Seeds the paper's `effect` would need (80 % power at α/m).
    pub seeds_needed: Option<Option<usize>>,
    pub verdict: Verdict,
}

/// `KEY=VALUE[,KEY=VALUE…]` as pairs.
fn arm(text: &str, which: &str, claim: &str) -> Result<Vec<(String, String)>> {
    text.split(',')
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
            _ => bail!("claim `{claim}`: `{which}: {text}` must be KEY=VALUE[,KEY=VALUE…], e.g. name=lnn-fig2b-0to2"),
        })
        .collect()
}

/// The value of `metric` in `run` (see [`Claim::metric`]); `CURVE@STEP` is read from the run's
/// curves unless the record already holds it (a report read back from its runs.csv).
pub fn metric_value(run: &RunRecord, metric: &str) -> Result<f64> {
    if let Some(v) = run.metrics.get(metric) {
        return Ok(*v);
    }
    if let Some((curve, step)) = metric.rsplit_once('@') {
        let step: f64 = step.parse().map_err(|_| anyhow::anyhow!("metric `{metric}`: STEP must be a number"))?;
        let points = super::collect::curve(&run.dir, curve)?;
        if let Some((_, y)) = points.iter().find(|(x, _)| *x == step) {
            return Ok(*y);
        }
        let logged: Vec<String> = points.iter().map(|(x, _)| x.to_string()).collect();
        bail!(
            "run {}: curve `{curve}` has no value at step {step}; it is logged at steps {}",
            run.dir.display(),
            if logged.is_empty() { "none".to_string() } else { logged.join(", ") }
        );
    }
    bail!(
        "run {}: no metric `{metric}`; it has: {}",
        run.dir.display(),
        run.metrics.keys().map(String::as_str).collect::<Vec<_>>().join(", ")
    )
}

/// Checks a study's claims before any run: unique ids, valid arms, a margin where one is needed,
/// α in (0, 0.5), finite margins and effects.
pub fn check(claims: &[Claim]) -> Result<()> {
    let mut ids = std::collections::BTreeSet::new();
    for c in claims {
        if !ids.insert(&c.id) {
            bail!("claim `{}` is listed twice (ids must be unique in a study)", c.id);
        }
        arm(&c.a, "a", &c.id)?;
        if c.across_seeds.is_some() {
            check_across_seeds(c)?;
            continue;
        }
        if c.b.is_empty() {
            bail!("claim `{}`: no arm `b` (a paired claim compares two arms; `across_seeds` claims have one)", c.id);
        }
        if c.size.is_some() {
            bail!("claim `{}`: `size` is for `across_seeds` claims", c.id);
        }
        arm(&c.b, "b", &c.id)?;
        if c.a == c.b && c.b_metric.as_ref().is_none_or(|m| *m == c.metric) {
            bail!(
                "claim `{}`: arms a and b are the same ({}) with the same metric; compare two arms, or two metrics \
                 of the same runs with b_metric",
                c.id,
                c.a
            );
        }
        if !(c.alpha > 0.0 && c.alpha < 0.5) {
            bail!("claim `{}`: alpha {} must be in (0, 0.5)", c.id, c.alpha);
        }
        match (c.expect, c.margin) {
            (Expect::Equivalent, None) => bail!("claim `{}`: `expect: equivalent` needs a `margin`", c.id),
            (_, Some(m)) if !(m.is_finite() && m > 0.0) => bail!("claim `{}`: margin {m} must be > 0", c.id),
            _ => {}
        }
        if c.effect.is_some_and(|e| !e.is_finite() || e == 0.0) {
            bail!("claim `{}`: effect must be a non-zero number", c.id);
        }
    }
    Ok(())
}

/// The fields an `across_seeds` claim needs and those it may not have.
fn check_across_seeds(c: &Claim) -> Result<()> {
    let bad = |what: &str| bail!("claim `{}`: an `across_seeds` claim {what}", c.id);
    if !c.b.is_empty() || c.b_metric.is_some() {
        return bad("has one arm, `a`: no `b` or `b_metric`");
    }
    if c.expect != Expect::Greater {
        return bad("expects `greater` (a correlation above the permutations')");
    }
    if c.margin.is_some() || c.scale != Scale::Linear {
        return bad("takes no `margin` and no `scale`");
    }
    if c.size.is_none_or(|n| n < 3) {
        return bad("needs the vector's `size`, at least 3 (a correlation of 2 values is ±1)");
    }
    if !(c.alpha > 0.0 && c.alpha < 0.5) {
        bail!("claim `{}`: alpha {} must be in (0, 0.5)", c.id, c.alpha);
    }
    Ok(())
}

/// The mean Pearson correlation over every pair of `v`'s vectors whose indices `idx` differ as
/// runs (`idx[i] != idx[j]`: a bootstrap sample may hold a run twice).
fn mean_pairwise_r(v: &[Vec<f64>], idx: &[usize]) -> f64 {
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
const PERMUTATIONS: usize = 9_999;
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
    let q = |f: f64| boot[((f * (boot.len() - 1) as f64).round() as usize).min(boot.len() - 1)];
    let tail = (1.0 - level) / 2.0;
    (r, p(high), p(low), (q(tail), q(1.0 - tail)))
}

/// A paired claim's verdict (`significant`: its Holm p below α; `alpha_m`: α over the family's
/// size), its interval at the corrected level, the smallest detectable |Δ| and the seeds the
/// paper's effect would need.
fn paired_verdict(claim: &Claim, diff: &Stats, significant: bool, alpha_m: f64) -> Judged {
    let verdict = match claim.expect {
        Expect::Less | Expect::Greater => {
            let right_way = (claim.expect == Expect::Less) == (diff.mean < 0.0);
            let shown_small = claim.margin.is_some_and(|mg| stats::tost_p(diff, mg) < alpha_m);
            if significant && diff.mean != 0.0 && right_way {
                Verdict::Holds
            } else if (significant && diff.mean != 0.0) || shown_small {
                Verdict::DoesNotHold
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
    };
    let sd = if diff.sd.is_finite() { diff.sd } else { 0.0 };
    let seeds_needed = claim.effect.map(|e| stats::pairs_needed(sd, e, alpha_m, 0.8));
    let verdict = match (verdict, seeds_needed) {
        (Verdict::Inconclusive, Some(need)) if need.is_none_or(|n| n > diff.n) => Verdict::Underpowered(need),
        (v, _) => v,
    };
    let level = match claim.expect {
        Expect::Equivalent => 1.0 - 2.0 * alpha_m,
        _ => 1.0 - alpha_m,
    };
    (verdict, stats::interval(diff, level), stats::detectable(sd, diff.n, alpha_m, 0.8), seeds_needed)
}

/// An across-seeds claim's verdict, its bootstrap interval at the corrected level, and no power
/// line (the permutation test has none).
fn across_seeds_verdict(profiles: &[Vec<f64>], significant: bool, alpha_m: f64) -> Judged {
    let (r, _, p_low, interval) = seed_correlation(profiles, 1.0 - alpha_m);
    let verdict = if significant && r > 0.0 {
        Verdict::Holds
    } else if p_low < alpha_m {
        Verdict::DoesNotHold
    } else {
        Verdict::Inconclusive
    };
    (verdict, interval, f64::NAN, None)
}

/// A verdict, the interval of the claim's statistic, the smallest detectable effect and the seeds
/// the paper's effect would need.
type Judged = (Verdict, (f64, f64), f64, Option<Option<usize>>);

/// Evaluates `claims` on `runs`: pairs each claim's arms by seed, then applies the rule with
/// Holm's correction within each family.
pub fn evaluate(claims: &[Claim], runs: &[RunRecord]) -> Result<Vec<ClaimResult>> {
    check(claims)?;
    let mut partial = Vec::new();
    for c in claims {
        let member = |r: &RunRecord, kv: &[(String, String)]| kv.iter().all(|(k, v)| r.config.get(k) == Some(v));
        if c.across_seeds.is_some() {
            let a = arm(&c.a, "a", &c.id)?;
            let mut per_seed = Vec::new();
            for r in runs.iter().filter(|r| member(r, &a)) {
                let Some(seed) = r.seed() else { continue };
                let v = c.metrics().iter().map(|m| metric_value(r, m)).collect::<Result<Vec<f64>>>()?;
                per_seed.push((seed, v));
            }
            if per_seed.len() < 3 {
                bail!(
                    "claim `{}`: {} seed(s) of a ({}); a correlation across seeds needs at least 3",
                    c.id,
                    per_seed.len(),
                    c.a
                );
            }
            per_seed.sort_by_key(|p| p.0);
            // Kept in the paired claims' places: the seeds, r̄ as the mean, p (one-sided, as high).
            let profiles: Vec<Vec<f64>> = per_seed.iter().map(|p| p.1.clone()).collect();
            let (r, p_high, _, _) = seed_correlation(&profiles, 0.95);
            let diff = Stats { n: profiles.len(), mean: r, sd: f64::NAN, ci95: None };
            let pairs = per_seed.iter().map(|p| (p.0, f64::NAN, f64::NAN)).collect();
            partial.push((c.clone(), pairs, diff, p_high, None, profiles));
            continue;
        }
        let (a, b) = (arm(&c.a, "a", &c.id)?, arm(&c.b, "b", &c.id)?);
        let mut pairs = Vec::new();
        for ra in runs.iter().filter(|r| member(r, &a)) {
            let Some(seed) = ra.seed() else { continue };
            if let Some(rb) = runs.iter().find(|r| member(r, &b) && r.seed() == Some(seed)) {
                let (x, y) = (metric_value(ra, &c.metric)?, metric_value(rb, c.metric_of_b())?);
                if c.scale == Scale::Log && (x <= 0.0 || y <= 0.0) {
                    bail!("claim `{}`: scale log needs positive values; seed {seed} has {x} and {y}", c.id);
                }
                pairs.push((seed, x, y));
            }
        }
        if pairs.len() < 2 {
            bail!(
                "claim `{}`: {} shared seed(s) between a ({}) and b ({}); a verdict needs at least 2",
                c.id,
                pairs.len(),
                c.a,
                c.b
            );
        }
        pairs.sort_by_key(|p| p.0);
        let d: Vec<f64> =
            pairs.iter().map(|&(_, x, y)| if c.scale == Scale::Log { x.ln() - y.ln() } else { x - y }).collect();
        let diff = stats::describe(&d);
        let p = match c.expect {
            Expect::Equivalent => stats::tost_p(&diff, c.margin.expect("checked")),
            _ => stats::t_test_p(&diff),
        };
        let p_sign_flip = if d.len() <= 10 { stats::sign_flip_p(&d) } else { None };
        partial.push((c.clone(), pairs, diff, p, p_sign_flip, Vec::new()));
    }
    // Holm within each family.
    let mut p_holm = vec![0.0; partial.len()];
    let mut families: Vec<&String> = claims.iter().map(|c| &c.family).collect();
    families.sort();
    families.dedup();
    let mut family_size = vec![0; partial.len()];
    for f in families {
        let idx: Vec<usize> = (0..partial.len()).filter(|&i| &partial[i].0.family == f).collect();
        let adjusted = stats::holm(&idx.iter().map(|&i| partial[i].3).collect::<Vec<_>>());
        for (k, &i) in idx.iter().enumerate() {
            p_holm[i] = adjusted[k];
            family_size[i] = idx.len();
        }
    }
    Ok(partial
        .into_iter()
        .enumerate()
        .map(|(i, (claim, pairs, diff, p, p_sign_flip, profiles))| {
            let seeds: Vec<u64> = pairs.iter().map(|p| p.0).collect();
            let values: Vec<(f64, f64)> = pairs.iter().map(|&(_, a, b)| (a, b)).collect();
            let m = family_size[i];
            let alpha_m = claim.alpha / m as f64;
            let significant = p_holm[i] < claim.alpha;
            let (verdict, interval, detectable, seeds_needed) = match claim.across_seeds {
                Some(_) => across_seeds_verdict(&profiles, significant, alpha_m),
                None => paired_verdict(&claim, &diff, significant, alpha_m),
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
                verdict,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    fn run(name: &str, seed: u64, value: f64) -> RunRecord {
        RunRecord {
            dir: PathBuf::from(format!("{name}-seed={seed}")),
            config: BTreeMap::from([("name".into(), name.into()), ("seed".into(), seed.to_string())]),
            metrics: BTreeMap::from([("m".into(), value)]),
        }
    }

    fn claim(id: &str, expect: Expect, margin: Option<f64>) -> Claim {
        Claim {
            id: id.into(),
            statement: String::new(),
            source: String::new(),
            metric: "m".into(),
            b_metric: None,
            a: "name=a".into(),
            b: "name=b".into(),
            across_seeds: None,
            size: None,
            expect,
            scale: Scale::Linear,
            margin,
            effect: None,
            alpha: 0.05,
            family: "study".into(),
            deviation: None,
        }
    }

    /// Runs of arms `a` and `b` on seeds 0, 1, … with these values.
    fn arms(values: &[(f64, f64)]) -> Vec<RunRecord> {
        let mut r = Vec::new();
        for (s, &(a, b)) in values.iter().enumerate() {
            r.push(run("a", s as u64, a));
            r.push(run("b", s as u64, b));
        }
        r
    }

    /// A lower by about 1 on five seeds (differences −1.1, −0.9, −1.0, −1.2, −0.8).
    fn runs() -> Vec<RunRecord> {
        arms(&[(0.0, 1.1), (1.0, 1.9), (2.0, 3.0), (3.0, 4.2), (4.0, 4.8)])
    }

    #[test]
    fn the_rule_gives_each_verdict() {
        let r = runs();
        let v = |c: Claim| evaluate(&[c], &r).unwrap().remove(0);
        assert_eq!(v(claim("x", Expect::Less, None)).verdict, Verdict::Holds);
        assert_eq!(v(claim("x", Expect::Greater, None)).verdict, Verdict::DoesNotHold);
        // Equivalent within 2 (|Δ| = 1, sd 0.16): holds; within 0.5: shown to differ by more.
        assert_eq!(v(claim("x", Expect::Equivalent, Some(2.0))).verdict, Verdict::Holds);
        assert_eq!(v(claim("x", Expect::Equivalent, Some(0.5))).verdict, Verdict::DoesNotHold);
        // A direction whose effect is shown smaller than the margin that would matter does not
        // hold; without the margin the same runs are inconclusive.
        let flat = arms(&[(1.01, 1.0), (0.98, 1.0), (1.015, 1.0), (0.99, 1.0), (1.005, 1.0)]);
        let on_flat = |c: Claim| evaluate(&[c], &flat).unwrap().remove(0).verdict;
        assert_eq!(on_flat(claim("x", Expect::Less, Some(0.5))), Verdict::DoesNotHold);
        assert_eq!(on_flat(claim("x", Expect::Less, None)), Verdict::Inconclusive);
        let one = v(claim("x", Expect::Less, None));
        assert_eq!(one.seeds, vec![0, 1, 2, 3, 4]);
        assert!((one.diff.mean + 1.0).abs() < 1e-12);
        assert_eq!(one.p_sign_flip, Some(2.0 / 32.0));
    }

    /// Two metrics of the same runs: arm B read at `b_metric`, paired run by run (Γ at the end
    /// against its start); the same arm and the same metric twice is refused.
    #[test]
    fn b_metric_compares_two_numbers_of_the_same_runs() {
        let start_end = |seed: u64, start: f64, end: f64| {
            let mut r = run("a", seed, end);
            r.metrics.insert("start".into(), start);
            r
        };
        let r = vec![
            start_end(0, 0.25, 0.31),
            start_end(1, 0.25, 0.29),
            start_end(2, 0.26, 0.33),
            start_end(3, 0.25, 0.30),
        ];
        let mut c = claim("grows", Expect::Greater, None);
        c.b = "name=a".into();
        c.b_metric = Some("start".into());
        let res = evaluate(std::slice::from_ref(&c), &r).unwrap().remove(0);
        assert_eq!(res.values, [(0.31, 0.25), (0.29, 0.25), (0.33, 0.26), (0.30, 0.25)]);
        assert_eq!(res.verdict, Verdict::Holds);
        assert_eq!(c.metrics(), ["m", "start"]);
        c.b_metric = Some("m".into());
        let e = check(&[c]).unwrap_err().to_string();
        assert!(e.contains("same") && e.contains("b_metric"), "{e}");
    }

    #[test]
    fn noise_is_inconclusive_and_underpowered_when_the_paper_effect_needs_more_seeds() {
        let r = arms(&[(1.0, 1.5), (2.0, 1.2), (0.5, 0.9), (1.3, 0.6)]);
        let mut c = claim("x", Expect::Less, None);
        assert_eq!(evaluate(std::slice::from_ref(&c), &r).unwrap()[0].verdict, Verdict::Inconclusive);
        c.effect = Some(-0.1);
        let res = evaluate(&[c], &r).unwrap().remove(0);
        let Verdict::Underpowered(Some(n)) = res.verdict else { panic!("{:?}", res.verdict) };
        assert!(n > 4 && res.detectable > 0.1, "{n} {}", res.detectable);
    }

    #[test]
    fn holm_corrects_within_a_family() {
        let r = runs();
        let mut other = claim("y", Expect::Less, None);
        other.metric = "m".into();
        let res = evaluate(&[claim("x", Expect::Less, None), other], &r).unwrap();
        assert_eq!(res[0].family_size, 2);
        assert!((res[0].p_holm - 2.0 * res[0].p).abs() < 1e-15 || res[0].p_holm == 1.0);
        let mut alone = claim("y", Expect::Less, None);
        alone.family = "own".into();
        let res = evaluate(&[claim("x", Expect::Less, None), alone], &r).unwrap();
        assert_eq!((res[0].family_size, res[0].p_holm), (1, res[0].p));
    }

    #[test]
    fn bad_claims_are_refused_with_the_reason() {
        let r = runs();
        let e = |c: Claim| evaluate(&[c], &r).unwrap_err().to_string();
        assert!(e(claim("x", Expect::Equivalent, None)).contains("needs a `margin`"));
        let mut c = claim("x", Expect::Less, None);
        c.a = "a".into();
        assert!(e(c).contains("KEY=VALUE"));
        let mut c = claim("x", Expect::Less, None);
        c.b = "name=zzz".into();
        assert!(e(c).contains("0 shared seed(s)"));
        assert!(evaluate(&[claim("x", Expect::Less, None), claim("x", Expect::Less, None)], &r)
            .unwrap_err()
            .to_string()
            .contains("twice"));
    }

    /// Runs of arm `a` on seeds 0, 1, … with these vectors as `v[0]` ….
    fn vector_runs(vs: &[Vec<f64>]) -> Vec<RunRecord> {
        vs.iter()
            .enumerate()
            .map(|(seed, v)| {
                let mut r = run("a", seed as u64, 0.0);
                r.metrics = v.iter().enumerate().map(|(i, x)| (format!("v[{i}]"), *x)).collect();
                r
            })
            .collect()
    }

    fn across(size: usize) -> Claim {
        Claim {
            metric: "v".into(),
            b: String::new(),
            across_seeds: Some(AcrossSeeds::Correlation),
            size: Some(size),
            ..claim("c", Expect::Greater, None)
        }
    }

    /// The permutation p against its exact value: 3 seeds of 4 entries have (4!)³ = 13,824 layer
    /// orders, all enumerated here. The Monte Carlo p of 9,999 permutations is a binomial
    /// estimate: within 4 standard errors (√(p(1 − p)/9,999)) and the +1 of its estimator.
    #[test]
    fn the_permutation_p_matches_the_exact_one() {
        let v = vec![vec![0.1, 0.5, 0.2, 0.9], vec![0.3, 0.4, 0.1, 0.7], vec![0.2, 0.1, 0.3, 0.8]];
        let all = [0, 1, 2];
        let r = mean_pairwise_r(&v, &all);
        let orders: Vec<Vec<usize>> = {
            let mut out = Vec::new();
            for a in 0..4 {
                for b in 0..4 {
                    for c in 0..4 {
                        for d in 0..4 {
                            let o = vec![a, b, c, d];
                            if o.iter().collect::<std::collections::BTreeSet<_>>().len() == 4 {
                                out.push(o);
                            }
                        }
                    }
                }
            }
            out
        };
        let (mut hits, mut total) = (0usize, 0usize);
        for o1 in &orders {
            for o2 in &orders {
                let w =
                    vec![v[0].clone(), o1.iter().map(|&i| v[1][i]).collect(), o2.iter().map(|&i| v[2][i]).collect()];
                // Shuffling the first vector too changes nothing: r depends on the orders relative to it.
                hits += usize::from(mean_pairwise_r(&w, &all) >= r - 1e-12);
                total += 1;
            }
        }
        let exact = hits as f64 / total as f64;
        let (r2, p, _, (lo, hi)) = seed_correlation(&v, 0.95);
        assert_eq!(r, r2);
        let se = (exact * (1.0 - exact) / PERMUTATIONS as f64).sqrt();
        assert!((p - exact).abs() < 4.0 * se + 1.0 / PERMUTATIONS as f64, "p {p} against exact {exact}");
        assert!(lo <= r && r <= hi, "{lo} {r} {hi}");
    }

    /// Seeds that share a profile (plus noise) hold; seeds drawn independently do not.
    #[test]
    fn a_shared_profile_across_seeds_holds_and_independent_ones_do_not() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(7);
        let profile = [0.2, 0.3, 0.25, 0.28, 0.37, 0.24, 0.23, 0.25];
        let shared: Vec<Vec<f64>> =
            (0..6).map(|_| profile.iter().map(|p| p + rng.gen_range(-0.02..0.02)).collect()).collect();
        let own: Vec<Vec<f64>> = (0..6).map(|_| (0..8).map(|_| rng.gen_range(0.2..0.4)).collect()).collect();
        let verdict = |vs: &[Vec<f64>]| evaluate(&[across(8)], &vector_runs(vs)).unwrap().remove(0);
        let held = verdict(&shared);
        assert_eq!(held.verdict, Verdict::Holds, "r̄ {} p {}", held.diff.mean, held.p);
        assert!(held.diff.mean > 0.8 && held.interval.0 > 0.5, "{:?}", held.interval);
        assert_eq!(held.profiles.len(), 6);
        let apart = verdict(&own);
        assert_ne!(apart.verdict, Verdict::Holds, "r̄ {} p {}", apart.diff.mean, apart.p);
        assert!(apart.p > 0.05, "{}", apart.p);
    }

    /// An across-seeds claim has one arm, `greater`, and a size; a paired claim has arm b.
    #[test]
    fn across_seeds_claims_are_checked() {
        assert!(check(&[across(8)]).is_ok());
        for (c, why) in [
            (Claim { b: "name=b".into(), ..across(8) }, "one arm"),
            (Claim { size: Some(2), ..across(8) }, "at least 3"),
            (Claim { expect: Expect::Less, ..across(8) }, "greater"),
            (Claim { b: String::new(), ..claim("p", Expect::Greater, None) }, "no arm `b`"),
        ] {
            let e = check(&[c]).unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
        }
    }
}
