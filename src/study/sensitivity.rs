//! The sensitivity of a claim's verdict to the metric it was registered on (docs/studies.md,
//! "Convergence claims and the sensitivity line"): the same claim — arms, direction, margin, α,
//! family — judged again under each other reading of the same question that the runs hold, by the
//! same rule. A claim whose verdict changes under one of them is *metric-sensitive*: its verdict
//! rests on the choice of metric, and the page says so beside it.
//!
//! The readings, by the question a metric asks:
//! - how fast the loss falls: the steps to 10⁻³, 10⁻⁶ and 10⁻⁹ of the initial loss (a ratio of
//!   steps, on a log scale), the fitted linear rate (`decades_per_1k`, decades gained per 1,000
//!   steps before fp32's floor: faster is *greater*, so the direction flips; a ratio of rates, on a
//!   log scale) and the mean log-loss over the run (`mean_log_loss`, decades below the start,
//!   linear). A margin given as a ratio (`at_most` ×2 on steps) carries over to the other ratios
//!   (×2 of steps is ÷2 of the rate) and not to the mean log-loss, which is then left out;
//! - an accuracy: at the end (`eval.accuracy`) and at its best (`best.eval.accuracy`);
//! - Γ read when a stop rule fires (`gamma@eval.accuracy>=V`) and at the end (`gamma`).

use super::claims::{Claim, Expect, Scale};

/// How fast the loss falls, read five ways: `(metric, scale, whether lower is faster, name)`.
const SPEED: [(&str, Scale, bool, &str); 5] = [
    ("steps_to_1e3", Scale::Log, true, "steps to 10⁻³"),
    ("steps_to_1e6", Scale::Log, true, "steps to 10⁻⁶"),
    ("steps_to_1e9", Scale::Log, true, "steps to 10⁻⁹"),
    ("decades_per_1k", Scale::Log, false, "fitted rate"),
    ("mean_log_loss", Scale::Linear, true, "mean log-loss"),
];

/// An accuracy read at the end and at its best.
const ACCURACY: [(&str, &str); 2] = [("eval.accuracy", "final accuracy"), ("best.eval.accuracy", "best accuracy")];

/// One other reading of a claim: its name on the page and the claim as it reads there.
#[derive(Debug, Clone)]
pub struct Alternative {
    pub name: String,
    pub claim: Claim,
}

/// `e` the other way round (a reading where greater means what lower meant).
fn flipped(e: Expect) -> Expect {
    match e {
        Expect::Less => Expect::Greater,
        Expect::Greater => Expect::Less,
        Expect::AtMost => Expect::AtLeast,
        Expect::AtLeast => Expect::AtMost,
        Expect::Equivalent => Expect::Equivalent,
    }
}

/// The other readings of `c`'s question that the page judges it under (none for a claim across
/// seeds, or one whose metric has no other reading). They carry no paper effect: the power line
/// is the registered metric's.
pub fn alternatives(c: &Claim) -> Vec<Alternative> {
    if c.across_seeds.is_some() {
        return Vec::new();
    }
    let with = |name: &str, metric: &str, b_metric: Option<String>, scale: Scale, expect: Expect| Alternative {
        name: name.to_string(),
        claim: Claim { metric: metric.to_string(), b_metric, scale, expect, effect: None, ..c.clone() },
    };
    // The registered reading of speed: one of SPEED, or the signed rate `loss_rate` (linear,
    // lower is faster).
    let speed = SPEED
        .iter()
        .find(|s| s.0 == c.metric)
        .map(|s| (s.1, s.2))
        .or((c.metric == "loss_rate").then_some((Scale::Linear, true)));
    if let (Some((scale, lower_faster)), None) = (speed, &c.b_metric) {
        return SPEED
            .iter()
            .filter(|s| s.0 != c.metric)
            // A margin carries over between ratios only.
            .filter(|s| c.margin.is_none() || (scale == Scale::Log && s.1 == Scale::Log))
            .map(|&(metric, alt_scale, alt_lower_faster, name)| {
                let expect = if alt_lower_faster == lower_faster { c.expect } else { flipped(c.expect) };
                with(name, metric, None, alt_scale, expect)
            })
            .collect();
    }
    if let (Some(_), None) = (ACCURACY.iter().find(|a| a.0 == c.metric), &c.b_metric) {
        return ACCURACY
            .iter()
            .filter(|a| a.0 != c.metric)
            .map(|&(metric, name)| with(name, metric, None, c.scale, c.expect))
            .collect();
    }
    let at_stop = |m: &str| m.starts_with("gamma@") && m.contains(">=");
    if at_stop(&c.metric) && c.b_metric.as_deref().is_none_or(at_stop) {
        let b = c.b_metric.as_ref().map(|_| "gamma".to_string());
        return vec![with("Γ at the end", "gamma", b, c.scale, c.expect)];
    }
    Vec::new()
}

/// The metrics the readings of [`SPEED`] derive from a run's loss curve where its record does not
/// hold them (a runs.csv holds only what its report read): `name`'s value from `loss`
/// (`(step, loss)` in step order), `None` when the curve does not reach it (steps to a level never
/// reached) or the name is not one of them.
pub fn from_loss_curve(name: &str, loss: &[(f64, f64)]) -> Option<f64> {
    let first = loss.first()?.1;
    let level = |k: i32| loss.iter().find(|p| p.1 <= 10f64.powi(-k) * first).map(|p| p.0);
    match name {
        "steps_to_1e3" => level(3),
        "steps_to_1e6" => level(6),
        "steps_to_1e9" => level(9),
        "loss_rate" => crate::train::loss_rate(loss),
        "decades_per_1k" => crate::train::loss_rate(loss).map(|r| -r),
        "mean_log_loss" => {
            let logs: Vec<f64> = loss.iter().filter(|p| p.1 > 0.0).map(|p| (p.1 / first).log10()).collect();
            (!logs.is_empty() && first > 0.0).then(|| logs.iter().sum::<f64>() / logs.len() as f64)
        }
        _ => None,
    }
}

/// Whether `name` is a metric [`from_loss_curve`] derives.
pub fn derived_from_loss(name: &str) -> bool {
    SPEED.iter().any(|s| s.0 == name) || name == "loss_rate"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(metric: &str, expect: Expect, margin: Option<f64>) -> Claim {
        serde_yaml::from_str(&format!(
            "{{id: x, statement: s, source: p, metric: {metric}, a: name=a, b: name=b, expect: {}, scale: log{}}}",
            serde_yaml::to_string(&expect).unwrap().trim(),
            margin.map_or(String::new(), |m| format!(", margin: {m}"))
        ))
        .unwrap()
    }

    /// A speed claim is read under the four other speeds; the rate flips the direction; a ratio
    /// margin carries over to the ratios and leaves the mean log-loss out.
    #[test]
    fn a_speed_claim_is_read_every_other_way_and_a_ratio_margin_carries_over() {
        let alts = alternatives(&claim("steps_to_1e3", Expect::Less, None));
        let names: Vec<&str> = alts.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["steps to 10⁻⁶", "steps to 10⁻⁹", "fitted rate", "mean log-loss"]);
        let rate = &alts[2].claim;
        assert_eq!((rate.metric.as_str(), rate.expect, rate.scale), ("decades_per_1k", Expect::Greater, Scale::Log));
        assert_eq!((alts[3].claim.scale, alts[3].claim.expect), (Scale::Linear, Expect::Less));
        let alts = alternatives(&claim("steps_to_1e6", Expect::AtMost, Some(0.693)));
        let names: Vec<&str> = alts.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["steps to 10⁻³", "steps to 10⁻⁹", "fitted rate"]);
        assert_eq!((alts[2].claim.expect, alts[2].claim.margin), (Expect::AtLeast, Some(0.693)));
        assert!(alternatives(&claim("final_loss", Expect::Less, None)).is_empty());
    }

    #[test]
    fn the_speeds_are_derived_from_the_loss_curve() {
        // Two decades per 100 steps from 1, logged every 10 steps to 10⁻¹⁰.
        let loss: Vec<(f64, f64)> = (0..=50).map(|k| (10.0 * k as f64, 10f64.powf(-0.2 * k as f64))).collect();
        assert_eq!(from_loss_curve("steps_to_1e3", &loss), Some(150.0));
        assert_eq!(from_loss_curve("steps_to_1e9", &loss), Some(450.0));
        assert!((from_loss_curve("decades_per_1k", &loss).unwrap() - 20.0).abs() < 1e-9);
        assert!((from_loss_curve("mean_log_loss", &loss).unwrap() + 5.0).abs() < 1e-9);
        assert_eq!(from_loss_curve("steps_to_1e6", &loss[..20]), None, "never reached");
    }
}
