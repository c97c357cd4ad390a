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
    /// Arm B, the same way.
    pub b: String,
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

impl Claim {
    /// The metric arm B is read at: `b_metric`, else `metric`.
    pub fn metric_of_b(&self) -> &str {
        self.b_metric.as_deref().unwrap_or(&self.metric)
    }

    /// The metrics the claim reads: `metric`, and `b_metric` where it differs.
    pub fn metrics(&self) -> Vec<&str> {
        let mut m = vec![self.metric.as_str()];
        if self.metric_of_b() != self.metric {
            m.push(self.metric_of_b());
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

/// Evaluates `claims` on `runs`: pairs each claim's arms by seed, then applies the rule with
/// Holm's correction within each family.
pub fn evaluate(claims: &[Claim], runs: &[RunRecord]) -> Result<Vec<ClaimResult>> {
    check(claims)?;
    let mut partial = Vec::new();
    for c in claims {
        let (a, b) = (arm(&c.a, "a", &c.id)?, arm(&c.b, "b", &c.id)?);
        let member = |r: &RunRecord, kv: &[(String, String)]| kv.iter().all(|(k, v)| r.config.get(k) == Some(v));
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
        partial.push((c.clone(), pairs, diff, p, p_sign_flip));
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
        .map(|(i, (claim, pairs, diff, p, p_sign_flip))| {
            let seeds: Vec<u64> = pairs.iter().map(|p| p.0).collect();
            let values: Vec<(f64, f64)> = pairs.iter().map(|&(_, a, b)| (a, b)).collect();
            let m = family_size[i];
            let alpha_m = claim.alpha / m as f64;
            let significant = p_holm[i] < claim.alpha;
            let verdict = match claim.expect {
                Expect::Less | Expect::Greater => {
                    let right_way = (claim.expect == Expect::Less) == (diff.mean < 0.0);
                    let shown_small = claim.margin.is_some_and(|mg| stats::tost_p(&diff, mg) < alpha_m);
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
                    let outside = stats::p_greater(&diff, mg).min(stats::p_less(&diff, -mg));
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
                (Verdict::Inconclusive, Some(need)) if need.is_none_or(|n| n > seeds.len()) => {
                    Verdict::Underpowered(need)
                }
                (v, _) => v,
            };
            let level = match claim.expect {
                Expect::Equivalent => 1.0 - 2.0 * alpha_m,
                _ => 1.0 - alpha_m,
            };
            ClaimResult {
                interval: stats::interval(&diff, level),
                detectable: stats::detectable(sd, diff.n, alpha_m, 0.8),
                claim,
                seeds,
                values,
                diff,
                p,
                p_holm: p_holm[i],
                p_sign_flip,
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
}
