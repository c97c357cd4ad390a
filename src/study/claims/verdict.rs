//! A claim's verdict and its numbers, and how they read in one line.

use super::{Claim, Expect};
use crate::study::stats::{self, Stats};

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
