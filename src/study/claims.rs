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
use super::metric::{one_value_at, one_value_per_step, Metric};
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
    /// A is not above B by `margin` or more (non-inferiority where lower is better: a loss "on
    /// par with the best" is `at_most` the best's plus the margin).
    AtMost,
    /// A is not below B by `margin` or more (non-inferiority where higher is better).
    AtLeast,
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
    /// `CURVE@STEP` for a logged curve's value at a step (`loss@300`, `eval.accuracy@400`), or
    /// `CURVE@WHEN>=V` for its value at the first logged step where the curve `WHEN` reaches `V`
    /// (a stop rule: `gamma@eval.accuracy>=0.69`, Γ when the accuracy first reaches 69 %).
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
    /// On an accuracy, a fraction (0.005, half a point) or percentage points written `0.5 pp`.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "fraction_or_points")]
    pub margin: Option<f64>,
    /// The effect the paper reports (Δ in the metric's unit, or ln A/B on `scale: log`), for the
    /// power line: the seeds it would need here.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "fraction_or_points")]
    pub effect: Option<f64>,
    #[serde(default = "default_alpha")]
    pub alpha: f64,
    /// Claims of one family are corrected together (Holm); default: the whole study.
    #[serde(default = "default_family")]
    pub family: String,
    /// How the setting departs from the paper's, and why (shown beside the verdict).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deviation: Option<String>,
    /// A change made to the claim after its runs, with its reason (listed with the verdict: a
    /// pre-registered claim changed later says so on the page).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amendment: Option<Amendment>,
    /// Who chose the margin: `plexus` (this project's choice, said beside the margin on the page)
    /// or the paper's words that give it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub margin_source: Option<String>,
    /// A registration made after the results of an earlier one were seen (the page labels the
    /// claim "re-registered after results"); it is judged on seeds the earlier one did not run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reregistered: Option<Amendment>,
}

/// A change to a claim after its runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Amendment {
    /// When (`2026-11-27`).
    pub date: String,
    /// What changed (`metric: fd.fd@400 → fd.fd@500`).
    pub change: String,
    /// Why, and what had been seen of the results when it was made.
    pub reason: String,
}

/// A margin or effect: a number, or percentage points written `N pp` (read as N / 100, the
/// fraction an accuracy is in the runs' files); a claim's fingerprint holds the number either way.
fn fraction_or_points<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Option<f64>, D::Error> {
    struct Amount;
    impl serde::de::Visitor<'_> for Amount {
        type Value = f64;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a number, or percentage points of an accuracy written `0.5 pp`")
        }
        fn visit_f64<E: serde::de::Error>(self, v: f64) -> std::result::Result<f64, E> {
            Ok(v)
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> std::result::Result<f64, E> {
            Ok(v as f64)
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> std::result::Result<f64, E> {
            Ok(v as f64)
        }
        fn visit_str<E: serde::de::Error>(self, t: &str) -> std::result::Result<f64, E> {
            points(t).ok_or_else(|| {
                E::custom(format!(
                    "`{t}` is neither a number nor percentage points (`0.5 pp`: half a point of an accuracy)"
                ))
            })
        }
    }
    d.deserialize_any(Amount).map(Some)
}

/// `N pp` as a fraction (N / 100); `None` for anything else.
fn points(text: &str) -> Option<f64> {
    let n: f64 = text.trim().strip_suffix("pp")?.trim().parse().ok()?;
    n.is_finite().then_some(n / 100.0)
}

/// The largest bare number a margin or effect on an accuracy may be (5 points as a fraction): a
/// number meant in points and read as a fraction is 100 times too large, and every plausible
/// margin in points (0.05 to 20) lands at or above this, so such a number is refused unless
/// written with its unit (`margin: 0.5` meant as half a point would be 50 points; `50 pp` says
/// that is meant).
pub const MAX_BARE_ACCURACY_AMOUNT: f64 = 0.05;

/// Checks how a spec's claims write their margins and effects (`claims` as the YAML has it): on
/// an accuracy, a bare number of at least [`MAX_BARE_ACCURACY_AMOUNT`] is refused with the two
/// readings it may have, and `pp` on a metric that is not an accuracy is refused.
pub fn check_written_units(claims: Option<&serde_yaml::Value>) -> Result<()> {
    for c in claims.and_then(|c| c.as_sequence()).into_iter().flatten() {
        let text = |k: &str| c.get(k).and_then(|v| v.as_str()).unwrap_or_default().to_string();
        let (id, metric, b_metric) = (text("id"), text("metric"), text("b_metric"));
        let log = text("scale") == "log";
        let accuracy = !log && (super::in_percent(&metric) || super::in_percent(&b_metric));
        for what in ["margin", "effect"] {
            match c.get(what) {
                Some(serde_yaml::Value::Number(n)) if accuracy => {
                    let v = n.as_f64().unwrap_or(f64::NAN);
                    if v.abs() >= MAX_BARE_ACCURACY_AMOUNT && v.abs() < 1.0 {
                        bail!(
                            "claim `{id}`: {what} {v} on {metric} reads as {} points of accuracy (a claim takes an \
                             accuracy as a fraction); write `{what}: {} pp` if you mean that, or {} for {v} points",
                            v * 100.0,
                            v * 100.0,
                            v / 100.0
                        );
                    }
                }
                Some(serde_yaml::Value::String(t)) if points(t).is_some() && !accuracy => bail!(
                    "claim `{id}`: {what} `{t}`: percentage points (pp) are for an accuracy on a linear scale; \
                     {metric} takes a plain number{}",
                    if log { " (on scale: log, a ln ratio)" } else { "" }
                ),
                _ => {}
            }
        }
    }
    Ok(())
}

/// The fingerprint of a study's claims as written (every field, amendments included): CRC-32C of
/// their JSON, 8 hex digits. A sweep records it in each run it trains (`study.json`), so a report
/// can say which runs were made under other claims.
pub fn claims_fingerprint(claims: &[Claim]) -> String {
    let json = serde_json::to_string(claims).expect("claims serialise");
    format!("{:08x}", crc32c::crc32c(json.as_bytes()))
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
            // Bounded here too: a spec read back from a sweep record has not been through `check`.
            return (0..self.size.unwrap_or(0).min(MAX_SIZE)).map(|i| format!("{}[{i}]", self.metric)).collect();
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
    /// Not shown either way, but the interval excludes the paper's `effect`: whatever the
    /// difference is at this size, it is smaller than the paper's.
    EffectExcluded,
    Inconclusive,
    /// Inconclusive, and the paper's effect needs this many seeds (`None`: more than 100,000).
    Underpowered(Option<usize>),
    /// No statistic can be computed from these numbers (the reason: a seed's value is not
    /// finite, a vector is constant, …): no p, no interval, no verdict.
    NotComputable(String),
}

impl Verdict {
    /// The verdict in a few words (a not-computable one without its reason), for the sensitivity
    /// line.
    pub fn short(&self) -> String {
        match self {
            Verdict::NotComputable(why) if why.contains("does not get there") => {
                "not computable (a run does not get there)".into()
            }
            Verdict::NotComputable(_) => "not computable".into(),
            v => v.to_string(),
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            Verdict::Holds => write!(f, "holds"),
            Verdict::DoesNotHold => write!(f, "does not hold"),
            Verdict::EffectExcluded => write!(f, "the paper's effect excluded at this size"),
            Verdict::Inconclusive => write!(f, "inconclusive"),
            Verdict::Underpowered(Some(n)) => write!(f, "underpowered (needs {n} seeds)"),
            Verdict::Underpowered(None) => write!(f, "underpowered (needs > 100,000 seeds)"),
            Verdict::NotComputable(why) => write!(f, "not computable: {why}"),
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
    /// The power these seeds had for the paper's `effect` (at α/m, with the spread they showed).
    pub power: Option<f64>,
    pub verdict: Verdict,
    /// The verdict under each other reading of the claim's question ([`super::sensitivity`]),
    /// by the same rule: `(reading, verdict)`.
    pub sensitivity: Vec<(String, Verdict)>,
}

/// A verdict's outcome for comparing readings: an underpowered claim is an inconclusive one.
fn outcome(v: &Verdict) -> Option<u8> {
    match v {
        Verdict::Holds => Some(0),
        Verdict::DoesNotHold => Some(1),
        Verdict::Inconclusive | Verdict::Underpowered(_) => Some(2),
        Verdict::EffectExcluded => Some(3),
        Verdict::NotComputable(_) => None,
    }
}

impl ClaimResult {
    /// Whether the verdict changes under another reading of the claim's question (one that can be
    /// computed): the verdict rests on the choice of metric.
    pub fn metric_sensitive(&self) -> bool {
        let own = outcome(&self.verdict);
        own.is_some() && self.sensitivity.iter().any(|(_, v)| outcome(v).is_some_and(|o| Some(o) != own))
    }

    /// The verdict with what a reviewer must read with it (`amount` shows a difference in the
    /// metric's unit as the tables print it: points of accuracy, a ratio on a log scale):
    /// - where the claim gives the paper's effect, the power these seeds had for it, and
    ///   "underpowered" beside any verdict (holds included: an effect found with little power is
    ///   likely overstated) where that power is below 80 %;
    /// - where it gives a margin and the smallest difference these seeds detect (80 % power at
    ///   α/m) is larger, "underpowered" with both, whatever the verdict;
    /// - for equivalence and non-inferiority, a difference from 0 that is itself significant at
    ///   α/m ("within the margin; A significantly above B");
    /// - a directional claim that holds by Holm's p while its 1 − α/m interval (Bonferroni's level)
    ///   reaches 0: both are said;
    /// - "metric-sensitive" where another reading of the claim's question gives another verdict.
    pub fn verdict_text(&self, amount: &dyn Fn(f64) -> String) -> String {
        let mut text = match (self.power, &self.verdict) {
            (Some(p), Verdict::Underpowered(need)) => format!(
                "underpowered (needs {}; {:.0} % power for the paper's effect)",
                need.map_or("> 100,000 seeds".into(), |n| format!("{n} seeds")),
                100.0 * p
            ),
            (Some(p), v) if p < 0.8 => {
                format!("{v} (underpowered: {:.0} % power for the paper's effect)", 100.0 * p)
            }
            (Some(p), v) => format!("{v} ({:.0} % power for the paper's effect)", 100.0 * p),
            (None, v) => v.to_string(),
        };
        let computed = !matches!(self.verdict, Verdict::NotComputable(_)) && self.claim.across_seeds.is_none();
        let alpha_m = self.claim.alpha / self.family_size.max(1) as f64;
        let mut notes = Vec::new();
        if let (true, Some(m)) = (computed, self.claim.margin) {
            if self.detectable.is_finite() && self.detectable > m {
                notes.push(format!(
                    "underpowered: these seeds detect a difference of {} or more, the margin is {}",
                    amount(self.detectable),
                    amount(m)
                ));
            }
            let zero_p = stats::t_test_p(&self.diff);
            let margin_kind = matches!(self.claim.expect, Expect::Equivalent | Expect::AtMost | Expect::AtLeast);
            if margin_kind && self.verdict == Verdict::Holds && zero_p < alpha_m {
                let way = if self.diff.mean > 0.0 { "above" } else { "below" };
                let p = if zero_p < 0.001 { "< 0.001".to_string() } else { format!("= {zero_p:.3}") };
                notes.push(format!("within the margin; A significantly {way} B, p {p} at α/m"));
            }
        }
        let directional = matches!(self.claim.expect, Expect::Less | Expect::Greater);
        let (lo, hi) = self.interval;
        if computed && directional && self.verdict == Verdict::Holds && lo <= 0.0 && hi >= 0.0 {
            notes.push("by Holm's p; its 1 − α/m interval, Bonferroni's level, still reaches 0".into());
        }
        if !notes.is_empty() {
            text += &format!(" ({})", notes.join("; "));
        }
        if self.metric_sensitive() {
            text += " — metric-sensitive";
        }
        text
    }
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

/// Whether `run` belongs to one of the claim's arms (the runs whose metrics it reads: a metric
/// that only other runs lack does not hold the claim back).
pub fn in_an_arm(claim: &Claim, run: &RunRecord) -> bool {
    [&claim.a, &claim.b]
        .iter()
        .filter(|t| !t.is_empty())
        .any(|t| arm(t, "", &claim.id).is_ok_and(|kv| kv.iter().all(|(k, v)| run.config.get(k) == Some(v))))
}

/// The metrics the claim reads from `run`: `metric` (an across-seeds claim's entries) where the
/// run is in arm A, `b_metric` where it is in arm B (both for a claim on two numbers of the same
/// runs); none for a run of neither arm. A claim whose arms read different metrics (`CURVE@WHEN>=V`
/// at each task's own level, say) waits only on what each arm's runs are read at.
pub fn metrics_read_from(claim: &Claim, run: &RunRecord) -> Vec<String> {
    let is_in = |t: &str| {
        !t.is_empty() && arm(t, "", &claim.id).is_ok_and(|kv| kv.iter().all(|(k, v)| run.config.get(k) == Some(v)))
    };
    let mut read = Vec::new();
    if is_in(&claim.a) {
        read = if claim.across_seeds.is_some() { claim.metrics() } else { vec![claim.metric.clone()] };
    }
    if is_in(&claim.b) && !read.iter().any(|m| m == claim.metric_of_b()) {
        read.push(claim.metric_of_b().to_string());
    }
    read
}

/// The value of `metric` in `run` (see [`Claim::metric`]); `CURVE@STEP` is read from the run's
/// curves unless the record already holds it (a report read back from its runs.csv).
pub fn metric_value(run: &RunRecord, metric: &str) -> Result<f64> {
    if let Some(v) = run.metrics.get(metric) {
        return Ok(*v);
    }
    let name = run.dir.display().to_string();
    // How fast the loss falls, read from the loss curve where the record does not hold it (a
    // runs.csv holds what its report read; the sensitivity line reads the others).
    if super::sensitivity::derived_from_loss(metric) {
        let loss = run.curve("loss")?;
        return super::sensitivity::from_loss_curve(metric, &loss).ok_or_else(|| match loss.is_empty() {
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

/// The longest claim id (it names the claim's figure file).
pub const MAX_ID_CHARS: usize = 80;

/// The longest vector an `across_seeds` claim reads (far above any network's depth).
pub const MAX_SIZE: usize = 4_096;

/// The file stem of a claim's figure: `claim-<id>`, with every character other than ASCII letters,
/// digits and `-` written `_` (so `x.y` and `x_y` share a stem: [`check`] refuses that pair).
pub fn figure_stem(id: &str) -> String {
    format!("claim-{}", id.replace(|ch: char| !ch.is_ascii_alphanumeric() && ch != '-', "_"))
}

/// Checks a study's claims before any run: ids of letters, digits, `.`, `_` and `-` (at most
/// [`MAX_ID_CHARS`]), unique, and unique as figure files; valid arms; a margin where one is needed;
/// α in (0, 0.5); finite margins and effects; an `across_seeds` vector of at most [`MAX_SIZE`].
pub fn check(claims: &[Claim]) -> Result<()> {
    let mut ids = std::collections::BTreeSet::new();
    let mut stems: std::collections::BTreeMap<String, &str> = std::collections::BTreeMap::new();
    for c in claims {
        let shown: String = c.id.chars().take(40).collect();
        if c.id.is_empty()
            || c.id.chars().count() > MAX_ID_CHARS
            || !c.id.chars().all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '.' | '_' | '-'))
        {
            bail!(
                "claim id `{shown}{}`: ids are 1 to {MAX_ID_CHARS} ASCII letters, digits, `.`, `_` or `-` \
                 (it names the claim's figure file), e.g. fig2b-0to2-faster",
                if c.id.chars().count() > 40 { "…" } else { "" }
            );
        }
        if !ids.insert(&c.id) {
            bail!("claim `{}` is listed twice (ids must be unique in a study)", c.id);
        }
        if let Some(other) = stems.insert(figure_stem(&c.id), &c.id) {
            bail!(
                "claims `{other}` and `{}` would draw to one figure file ({}.png): ids must differ in more than \
                 `.` against `_`",
                c.id,
                figure_stem(&c.id)
            );
        }
        arm(&c.a, "a", &c.id)?;
        for m in std::iter::once(&c.metric).chain(&c.b_metric) {
            Metric::parse(m).map_err(|e| anyhow::anyhow!("claim `{}`: {e}", c.id))?;
        }
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
            (Expect::AtMost | Expect::AtLeast, None) => bail!(
                "claim `{}`: `expect: {}` needs a `margin` (how much worse than B still counts as on par)",
                c.id,
                if c.expect == Expect::AtMost { "at_most" } else { "at_least" }
            ),
            (_, Some(m)) if !(m.is_finite() && m > 0.0) => {
                bail!("claim `{}`: margin must be a finite number > 0, got {m}", c.id)
            }
            _ => {}
        }
        if let Some(e) = c.effect.filter(|e| !e.is_finite() || *e == 0.0) {
            bail!("claim `{}`: effect must be a finite, non-zero number (the paper's Δ), got {e}", c.id);
        }
        // The paper's effect points the way the claim expects: a negative effect on a claim that
        // A is greater would make the power line and "the paper's effect excluded" test another
        // claim than the one written.
        let against = match c.expect {
            Expect::Greater => c.effect.filter(|e| *e < 0.0),
            Expect::Less => c.effect.filter(|e| *e > 0.0),
            _ => None,
        };
        if let Some(e) = against {
            let want = if c.expect == Expect::Greater { "positive (A above B)" } else { "negative (A below B)" };
            bail!(
                "claim `{}`: effect {e} points against `expect: {}`: the paper's Δ = A − B (ln A/B on scale: log) of \
                 this claim is {want}",
                c.id,
                if c.expect == Expect::Greater { "greater" } else { "less" }
            );
        }
        // An accuracy is a fraction in the runs' files and a percentage in the tables: a margin or
        // effect of 2 meant as 2 points would be a 200-point one, and the claim would hold trivially.
        if c.scale == Scale::Linear && c.metrics().iter().any(|m| super::in_percent(m)) {
            for (what, v) in [("margin", c.margin), ("effect", c.effect)] {
                if let Some(v) = v.filter(|v| v.abs() >= 1.0) {
                    bail!(
                        "claim `{}`: {what} {v} on {} — an accuracy is a fraction (0 to 1) in a claim, though the \
                         tables print percent: did you mean {} ({v} points)?",
                        c.id,
                        c.metric,
                        v / 100.0
                    );
                }
            }
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
    if c.size.is_some_and(|n| n > MAX_SIZE) {
        return bad(&format!("reads at most {MAX_SIZE} entries (`size`; one per layer or unit)"));
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
fn paired_verdict(claim: &Claim, diff: &Stats, significant: bool, alpha_m: f64) -> Judged {
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

/// The runs of one arm (`text`: `KEY=VALUE[,…]`) by seed, in seed order. An arm that names a key
/// no run has, or a value no run has, is an error saying which and what the runs have; so is a
/// run of the arm without a seed, or two runs of the arm with one seed (one run counted twice, or
/// arm keys that leave a setting open): a claim pairs one run per arm and seed.
fn arm_runs<'r>(claim: &Claim, which: &str, text: &str, runs: &'r [RunRecord]) -> Result<Vec<(u64, &'r RunRecord)>> {
    let kv = arm(text, which, &claim.id)?;
    let of_arm: Vec<&RunRecord> = runs.iter().filter(|r| kv.iter().all(|(k, v)| r.config.get(k) == Some(v))).collect();
    if of_arm.is_empty() {
        bail!("claim `{}`: arm {which} ({text}) {}", claim.id, why_no_run(&kv, runs));
    }
    let mut by_seed: Vec<(u64, &RunRecord)> = Vec::new();
    for r in of_arm {
        let Some(seed) = r.seed() else {
            bail!(
                "claim `{}`: run {} of arm {which} ({text}) has no seed (its config's `seed`{}); a claim pairs runs by seed",
                claim.id,
                r.dir.display(),
                r.config.get("seed").map(|s| format!(" is `{s}`, not a whole number ≥ 0")).unwrap_or_default()
            );
        };
        if let Some((_, other)) = by_seed.iter().find(|(s, _)| *s == seed) {
            bail!(
                "claim `{}`: arm {which} ({text}) has two runs with seed {seed}: {} and {}; a claim pairs one run per \
                 arm and seed (is one run counted twice, or do the arm's keys leave a setting open? add KEY=VALUE)",
                claim.id,
                other.dir.display(),
                r.dir.display()
            );
        }
        by_seed.push((seed, r));
    }
    by_seed.sort_by_key(|p| p.0);
    Ok(by_seed)
}

/// Why no run matches the arm `kv`: a key no run's config has (with the keys of its section), a
/// value no run has (with the values they have), or no run with all of them at once.
fn why_no_run(kv: &[(String, String)], runs: &[RunRecord]) -> String {
    let list = |mut v: Vec<String>| {
        v.sort();
        v.dedup();
        let more = v.len().saturating_sub(12);
        v.truncate(12);
        format!("{}{}", v.join(", "), if more > 0 { format!(", … ({more} more)") } else { String::new() })
    };
    for (k, v) in kv {
        if !runs.iter().any(|r| r.config.contains_key(k)) {
            let section = k.split('.').next().unwrap_or(k);
            let near: Vec<String> = runs
                .iter()
                .flat_map(|r| r.config.keys())
                .filter(|c| c.split('.').next() == Some(section))
                .cloned()
                .collect();
            return if near.is_empty() {
                format!(
                    "matches no run: no run's config has the key `{k}` (their sections: {})",
                    list(
                        runs.iter()
                            .flat_map(|r| r.config.keys())
                            .map(|c| c.split('.').next().unwrap_or(c).to_string())
                            .collect()
                    )
                )
            } else {
                format!("matches no run: no run's config has the key `{k}` (keys of `{section}`: {})", list(near))
            };
        }
        if !runs.iter().any(|r| r.config.get(k) == Some(v)) {
            return format!(
                "matches no run: no run has {k}={v} (the runs' values of {k}: {})",
                list(runs.iter().filter_map(|r| r.config.get(k).cloned()).collect())
            );
        }
    }
    "matches no run: each KEY=VALUE is some run's, but no run has all of them".into()
}

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

/// Checks `claims` against the runs a sweep plans, before any of them trains (`planned`: each
/// planned run's resolved config, flattened as a report reads it, without metrics): every arm
/// matches planned runs, one per seed; a paired claim's arms share at least 2 seeds and an
/// `across_seeds` claim's arm has at least 3. A claim that could never be judged is refused here,
/// not after the training.
pub fn check_against_plan(claims: &[Claim], planned: &[RunRecord]) -> Result<()> {
    check(claims)?;
    for c in claims {
        let a = arm_runs(c, "a", &c.a, planned)?;
        if c.across_seeds.is_some() {
            if a.len() < 3 {
                bail!(
                    "claim `{}`: the sweep plans {} seed(s) of a ({}); a correlation across seeds needs at least 3",
                    c.id,
                    a.len(),
                    c.a
                );
            }
            continue;
        }
        let b = arm_runs(c, "b", &c.b, planned)?;
        let shared = a.iter().filter(|(s, _)| b.iter().any(|(t, _)| s == t)).count();
        if shared < 2 {
            bail!(
                "claim `{}`: the sweep plans {shared} seed(s) shared by a ({}) and b ({}); a verdict needs at least 2",
                c.id,
                c.a,
                c.b
            );
        }
    }
    Ok(())
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
    super::sensitivity::alternatives(claim)
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
            curves: BTreeMap::new(),
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
            amendment: None,
            margin_source: None,
            reregistered: None,
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
        // An arm that matches no run says why: the value, or the key, no run has.
        let mut c = claim("x", Expect::Less, None);
        c.b = "name=zzz".into();
        let why = e(c);
        assert!(why.contains("no run has name=zzz") && why.contains("values of name: a, b"), "{why}");
        let mut c = claim("x", Expect::Less, None);
        c.b = "nmae=b".into();
        let why = e(c);
        assert!(why.contains("no run's config has the key `nmae`"), "{why}");
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

    /// A seed's value that is not finite (or not positive on a log scale) makes the claim "not
    /// computable", with the seed named and no p or interval; the rest of the family is still
    /// judged, with the claim counted in m at p = 1.
    #[test]
    fn values_no_statistic_can_take_make_a_claim_not_computable() {
        for (a0, log, want) in [
            (f64::INFINITY, true, "seed 0's A (m) is inf"),
            (f64::NAN, false, "seed 0's A (m) is NaN"),
            (f64::NEG_INFINITY, false, "seed 0's A (m) is -inf"),
            (0.0, true, "seed 0's A (m) is 0, and `scale: log` needs positive values"),
        ] {
            let r = arms(&[(a0, 1.1), (1.0, 1.9), (2.0, 3.0), (3.0, 4.2), (4.0, 4.8)]);
            let mut c = claim("x", Expect::Less, None);
            if log {
                c.scale = Scale::Log;
            }
            let mut other = claim("y", Expect::Less, None);
            other.a = "name=a".into();
            other.metric = "n".into();
            other.b_metric = Some("n".into());
            let mut r = r;
            for run in r.iter_mut() {
                let s = run.seed().unwrap() as f64;
                run.metrics.insert("n".into(), if run.config["name"] == "a" { s } else { s + 1.0 });
            }
            let res = evaluate(&[c, other], &r).unwrap();
            assert_eq!(res[0].verdict, Verdict::NotComputable(want.into()), "{a0} {log}");
            assert!(res[0].p.is_nan() && res[0].p_holm.is_nan() && res[0].interval.0.is_nan());
            // The other claim of the family: judged, with m = 2 (the bad claim's p taken as 1).
            assert_eq!(res[1].verdict, Verdict::Holds);
            assert_eq!(res[1].family_size, 2);
            assert_eq!(res[1].p_holm, (2.0 * res[1].p).min(1.0));
        }
    }

    /// The verdict code itself refuses non-finite differences (an assertion, not a silent p).
    #[test]
    #[should_panic(expected = "non-finite differences")]
    fn the_verdict_asserts_finite_inputs() {
        let diff = Stats { n: 3, mean: f64::NAN, sd: 1.0, ci95: None };
        paired_verdict(&claim("x", Expect::Less, None), &diff, true, 0.05);
    }

    /// One run per arm and seed: an arm with two runs of one seed (one run copied, or ten rows
    /// all carrying seed 0) is an error naming both, never n = 10 from one seed.
    #[test]
    fn an_arm_with_two_runs_of_one_seed_is_refused() {
        let mut r = runs();
        let mut copy = run("a", 0, 0.5);
        copy.dir = PathBuf::from("a-copy");
        r.push(copy);
        let e = evaluate(&[claim("x", Expect::Less, None)], &r).unwrap_err().to_string();
        assert!(e.contains("two runs with seed 0") && e.contains("a-copy") && e.contains("a-seed=0"), "{e}");
        // Ten runs of arm a, all seed 0, against one b run of seed 0.
        let r: Vec<RunRecord> = (0..10)
            .map(|i| RunRecord { dir: PathBuf::from(format!("a{i}")), ..run("a", 0, i as f64) })
            .chain([run("b", 0, 5.0)])
            .collect();
        let e = evaluate(&[claim("x", Expect::Less, None)], &r).unwrap_err().to_string();
        assert!(e.contains("two runs with seed 0"), "{e}");
        // A run of the arm without a seed is named.
        let mut r = runs();
        r[0].config.remove("seed");
        let e = evaluate(&[claim("x", Expect::Less, None)], &r).unwrap_err().to_string();
        assert!(e.contains("has no seed"), "{e}");
    }

    /// An across-seeds claim reads the whole vector or refuses: a `size` shorter than the runs'
    /// vector is an error (it would test a prefix); a constant or non-finite vector makes the
    /// claim not computable, with the seed named, instead of a panic or a p from NaN.
    #[test]
    fn across_seeds_vectors_are_checked() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(3);
        let good: Vec<Vec<f64>> =
            (0..5).map(|_| (0..8).map(|i| i as f64 + rng.gen_range(-0.3..0.3)).collect()).collect();
        let e = evaluate(&[across(3)], &vector_runs(&good)).unwrap_err().to_string();
        assert!(e.contains("`size: 3`") && e.contains("8 entries"), "{e}");
        assert_eq!(evaluate(&[across(8)], &vector_runs(&good)).unwrap()[0].verdict, Verdict::Holds);
        let mut constant = good.clone();
        constant[2] = vec![0.25; 8];
        let res = evaluate(&[across(8)], &vector_runs(&constant)).unwrap().remove(0);
        assert_eq!(
            res.verdict,
            Verdict::NotComputable("seed 2's vector v[0..8] is constant (it has no correlation)".into())
        );
        assert!(res.p.is_nan() && res.diff.mean.is_nan());
        let mut nan = good.clone();
        nan[4][5] = f64::NAN;
        let res = evaluate(&[across(8)], &vector_runs(&nan)).unwrap().remove(0);
        assert_eq!(res.verdict, Verdict::NotComputable("seed 4's v[5] is NaN".into()));
    }

    /// Ids are bounded and file-safe, and two ids that would draw to one figure file are refused;
    /// an across-seeds `size` is bounded before anything is allocated for it.
    #[test]
    fn ids_and_sizes_are_bounded() {
        let e = |c: Claim| check(&[c]).unwrap_err().to_string();
        assert!(e(claim(&"x".repeat(300), Expect::Less, None)).contains("1 to 80"));
        assert!(e(claim("a/b", Expect::Less, None)).contains("ASCII letters"));
        let e2 = check(&[claim("x.y", Expect::Less, None), claim("x_y", Expect::Less, None)]).unwrap_err().to_string();
        assert!(e2.contains("one figure file"), "{e2}");
        assert!(check(&[claim("hacn-mu-0.25-beats-1", Expect::Less, None)]).is_ok());
        assert!(e(Claim { size: Some(100_000_000_000), ..across(8) }).contains("at most 4096"));
    }

    /// Claims are checked against a sweep's plan before training: an arm that matches no planned
    /// run is refused, naming the claim and what the runs have.
    #[test]
    fn claims_are_checked_against_the_planned_runs() {
        let planned: Vec<RunRecord> = runs()
            .into_iter()
            .map(|mut r| {
                r.metrics.clear();
                r
            })
            .collect();
        assert!(check_against_plan(&[claim("x", Expect::Less, None)], &planned).is_ok());
        let mut c = claim("x", Expect::Less, None);
        c.b = "name=bb".into();
        let e = check_against_plan(&[c], &planned).unwrap_err().to_string();
        assert!(e.contains("claim `x`") && e.contains("no run has name=bb"), "{e}");
        let e = check_against_plan(&[across(8)], &planned[..4]).unwrap_err().to_string();
        assert!(e.contains("2 seed(s) of a"), "{e}");
    }

    /// Every outcome of the rule on a constructed case, in the documented order: an effect shown
    /// smaller than the margin does not hold even when significant in the paper's direction; the
    /// paper's effect excluded when the interval lies on the near side of it; non-inferiority
    /// (`at_most`) holds within its margin and does not hold past it; the power line beside every
    /// verdict, "underpowered" beside a "holds" found with little power.
    #[test]
    fn every_outcome_of_the_rule_is_reached() {
        // A below B by 0.01 with almost no spread: significant, but far below a 0.5 margin.
        let tiny = arms(&[(0.99, 1.0), (1.989, 2.0), (2.9905, 3.0), (3.99, 4.0), (4.9895, 5.0)]);
        let res = evaluate(&[claim("x", Expect::Less, Some(0.5))], &tiny).unwrap().remove(0);
        assert!(res.p_holm < 0.05, "{}", res.p_holm);
        assert_eq!(res.verdict, Verdict::DoesNotHold, "significant but smaller than the margin");
        // The paper says A is lower by 5; these runs are inconclusive on the direction but exclude 5.
        let near_zero = arms(&[(1.01, 1.0), (0.98, 1.0), (1.015, 1.0), (0.99, 1.0), (1.005, 1.0)]);
        let mut c = claim("x", Expect::Less, None);
        c.effect = Some(-5.0);
        let res = evaluate(std::slice::from_ref(&c), &near_zero).unwrap().remove(0);
        assert_eq!(res.verdict, Verdict::EffectExcluded);
        assert!(res.interval.0 > -5.0, "{:?}", res.interval);
        assert_eq!(
            res.verdict_text(&|x| x.to_string()),
            "the paper's effect excluded at this size (100 % power for the paper's effect)"
        );
        // Non-inferiority: A at most 0.1 above B.
        let mut at_most = claim("x", Expect::AtMost, Some(0.1));
        assert_eq!(evaluate(std::slice::from_ref(&at_most), &near_zero).unwrap()[0].verdict, Verdict::Holds);
        let worse = arms(&[(1.5, 1.0), (1.6, 1.0), (1.45, 1.0), (1.55, 1.0), (1.5, 1.0)]);
        assert_eq!(evaluate(std::slice::from_ref(&at_most), &worse).unwrap()[0].verdict, Verdict::DoesNotHold);
        // Far better than B is not a failure of "at most" (two-sided equivalence would call it one).
        let better = arms(&[(0.1, 1.0), (0.2, 1.0), (0.15, 1.0), (0.12, 1.0), (0.18, 1.0)]);
        assert_eq!(evaluate(std::slice::from_ref(&at_most), &better).unwrap()[0].verdict, Verdict::Holds);
        let mut equivalent = at_most.clone();
        equivalent.expect = Expect::Equivalent;
        assert_eq!(evaluate(&[equivalent], &better).unwrap()[0].verdict, Verdict::DoesNotHold);
        at_most.margin = None;
        assert!(check(&[at_most]).unwrap_err().to_string().contains("needs a `margin`"));
        // A "holds" found with little power for the paper's (larger) effect says so.
        let noisy = arms(&[(0.0, 1.0), (0.3, 1.4), (0.5, 1.0), (-0.2, 0.9), (0.1, 1.3), (0.6, 1.2)]);
        let mut c = claim("x", Expect::Less, None);
        c.effect = Some(-0.3);
        let res = evaluate(&[c], &noisy).unwrap().remove(0);
        assert_eq!(res.verdict, Verdict::Holds);
        let power = res.power.unwrap();
        assert!(power < 0.8, "{power}");
        assert!(
            res.verdict_text(&|x| x.to_string()).starts_with("holds (underpowered:"),
            "{}",
            res.verdict_text(&|x| x.to_string())
        );
    }

    /// A margin or effect on an accuracy is a fraction: 2 (meant as 2 points) is refused with the
    /// fraction it likely means; 0.02 passes.
    #[test]
    fn accuracy_margins_are_fractions() {
        let mut c = claim("x", Expect::Greater, Some(2.0));
        c.metric = "eval.accuracy".into();
        let e = check(std::slice::from_ref(&c)).unwrap_err().to_string();
        assert!(e.contains("margin 2") && e.contains("did you mean 0.02"), "{e}");
        c.margin = Some(0.02);
        c.effect = Some(-1.5);
        assert!(check(std::slice::from_ref(&c)).unwrap_err().to_string().contains("effect -1.5"));
        c.effect = Some(0.004);
        assert!(check(&[c]).is_ok());
    }

    /// Each arm's runs are read at their own metric: A at `metric`, B at `b_metric`.
    #[test]
    fn each_arm_is_read_at_its_own_metric() {
        let mut c = claim("x", Expect::Greater, None);
        c.metric = "gamma@eval.accuracy>=0.3".into();
        c.b_metric = Some("gamma@eval.accuracy>=0.6".into());
        assert_eq!(metrics_read_from(&c, &run("a", 0, 1.0)), vec!["gamma@eval.accuracy>=0.3".to_string()]);
        assert_eq!(metrics_read_from(&c, &run("b", 0, 1.0)), vec!["gamma@eval.accuracy>=0.6".to_string()]);
        assert!(metrics_read_from(&c, &run("c", 0, 1.0)).is_empty());
        let mut same = claim("x", Expect::Greater, None);
        same.b = same.a.clone();
        same.b_metric = Some("initial.gamma".into());
        assert_eq!(metrics_read_from(&same, &run("a", 0, 1.0)), vec!["m".to_string(), "initial.gamma".to_string()]);
    }

    /// The runs a claim reads are its arms': a run of a third setting is none of them.
    #[test]
    fn a_claims_runs_are_those_of_its_arms() {
        let c = claim("x", Expect::Less, None);
        assert!(in_an_arm(&c, &run("a", 0, 1.0)) && in_an_arm(&c, &run("b", 3, 1.0)));
        assert!(!in_an_arm(&c, &run("c", 0, 1.0)));
        assert!(!in_an_arm(&across(8), &run("b", 0, 1.0)));
    }

    /// `CURVE@WHEN>=V` reads the curve where the stop rule would have ended the run: Γ at the
    /// first evaluation whose accuracy reaches 0.6 (step 20, not the later and higher 30), and an
    /// error naming the best value when the rule never fires or the curve is not logged there.
    #[test]
    fn a_stop_rule_reads_the_curve_at_the_first_step_that_reaches_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("metrics.csv"),
            "step,loss,gamma\n0,2.3,0.25\n10,2.0,0.3\n20,1.8,0.35\n30,1.7,0.4\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("eval.csv"),
            "step,loss,accuracy\n0,2.3,0.1\n20,1.9,0.61\n25,1.9,0.58\n30,1.8,0.7\n",
        )
        .unwrap();
        let mut r = run("a", 0, 1.0);
        r.dir = dir.path().to_path_buf();
        assert_eq!(metric_value(&r, "gamma@eval.accuracy>=0.6").unwrap(), 0.35);
        assert_eq!(metric_value(&r, "eval.loss@eval.accuracy>=0.7").unwrap(), 1.8);
        let never = metric_value(&r, "gamma@eval.accuracy>=0.9").unwrap_err().to_string();
        assert!(never.contains("never reaches 0.9") && never.contains("0.7 at step 30"), "{never}");
        std::fs::write(dir.path().join("eval.csv"), "step,loss,accuracy\n5,2.3,0.6\n").unwrap();
        let unlogged = metric_value(&r, "gamma@eval.accuracy>=0.6").unwrap_err().to_string();
        assert!(unlogged.contains("at step 5") && unlogged.contains("not logged"), "{unlogged}");
        let bad = metric_value(&r, "gamma@eval.accuracy>=x").unwrap_err().to_string();
        assert!(bad.contains("finite number"), "{bad}");
    }

    /// `CURVE@STEP` at a step the curve holds twice: the same value is read, two values are an
    /// error naming both, never one of them picked.
    #[test]
    fn a_step_logged_twice_with_two_values_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("metrics.csv"),
            "step,loss
10,2.0
10,2.0
20,1.8
20,1.7
",
        )
        .unwrap();
        let mut r = run("a", 0, 1.0);
        r.dir = dir.path().to_path_buf();
        assert_eq!(metric_value(&r, "loss@10").unwrap(), 2.0);
        let e = metric_value(&r, "loss@20").unwrap_err().to_string();
        assert!(e.contains("2 different values at step 20") && e.contains("1.8, 1.7"), "{e}");
        // A stop rule too: the curve it stops on, and the one it reads there, one value a step.
        std::fs::write(dir.path().join("eval.csv"), "step,loss,accuracy\n10,2.0,0.3\n10,2.0,0.5\n").unwrap();
        let e = metric_value(&r, "loss@eval.accuracy>=0.45").unwrap_err().to_string();
        assert!(e.contains("curve `eval.accuracy` has 2 different values at step 10"), "{e}");
        std::fs::write(dir.path().join("eval.csv"), "step,loss,accuracy\n10,2.0,0.3\n20,2.0,0.5\n").unwrap();
        let e = metric_value(&r, "loss@eval.accuracy>=0.45").unwrap_err().to_string();
        assert!(e.contains("curve `loss` has 2 different values at step 20"), "{e}");
    }

    /// The unit guard knows every form of an accuracy (`eval.accuracy@400` is one): a bare 0.5
    /// (50 points) is refused in a margin and an effect, `1 pp` is accepted; an effect pointing
    /// against `expect` is refused; a metric whose `@` part is not a step or a stop rule is
    /// refused before any run.
    #[test]
    fn every_form_of_a_metric_gets_every_check() {
        let yaml = |body: &str| -> serde_yaml::Value {
            serde_yaml::from_str(&format!("- {{id: x, metric: eval.accuracy@400, {body}}}")).unwrap()
        };
        for body in ["margin: 0.5", "effect: 0.5"] {
            assert!(check_written_units(Some(&yaml(body))).is_err(), "{body}");
        }
        let mut c = claim("x", Expect::Greater, Some(1.0));
        c.metric = "eval.accuracy@400".into();
        let e = check(&[c]).unwrap_err().to_string();
        assert!(e.contains("margin 1") && e.contains("did you mean 0.01"), "{e}");
        check_written_units(Some(&yaml("margin: 1 pp"))).unwrap();
        let e = check_written_units(Some(&yaml("margin: 0.5"))).unwrap_err().to_string();
        assert!(e.contains("50 points of accuracy") && e.contains("50 pp") && e.contains("0.005"), "{e}");
        let mut c = claim("x", Expect::Greater, None);
        c.metric = "eval.accuracy@400".into();
        c.effect = Some(-0.02);
        let e = check(std::slice::from_ref(&c)).unwrap_err().to_string();
        assert!(e.contains("effect -0.02 points against `expect: greater`"), "{e}");
        c.expect = Expect::Less;
        check(std::slice::from_ref(&c)).unwrap();
        c.margin = Some(f64::INFINITY);
        let e = check(std::slice::from_ref(&c)).unwrap_err().to_string();
        assert!(e.contains("margin must be a finite number > 0, got inf"), "{e}");
        c.margin = None;
        c.metric = "eval.accuracy@soon".into();
        let e = check(&[c]).unwrap_err().to_string();
        assert!(e.contains("after `@` comes a step"), "{e}");
    }
}
