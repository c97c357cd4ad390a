//! A study's metric, parsed once: what a report's `--metric`, a spec's `report.metrics` and a
//! claim's `metric` name, in its three forms, with the quantity it measures (which decides its
//! unit: an accuracy is a fraction in the runs' files, shown in percent).
//!
//! - a run's number: `final_loss`, `eval.accuracy`, `best.eval.accuracy`, `final.a[3]`;
//! - a logged curve at a step, `CURVE@STEP`: `loss@300`, `eval.accuracy@400`, `fd.fd@500`;
//! - a curve at the first logged step where another reaches a level, `CURVE@WHEN>=V` (a stop
//!   rule): `gamma@eval.accuracy>=0.69`, Γ when the accuracy first reaches 69 %.
//!
//! Every check that depends on a metric's unit or on reading one value per step goes through
//! here, so each form gets every check.

use anyhow::{bail, Result};

/// One metric, as [`Metric::parse`] reads it.
#[derive(Debug, Clone, PartialEq)]
pub enum Metric {
    /// A run's number, by its name in the report.
    Number(String),
    /// `curve`'s value at `step`.
    AtStep { curve: String, step: f64 },
    /// `curve`'s value at the first logged step where `when` is at least `threshold`.
    AtFirstReach { curve: String, when: String, threshold: f64 },
}

impl Metric {
    /// Reads a metric's text; an error says what follows `@` and names the text.
    pub fn parse(text: &str) -> Result<Metric> {
        let Some((curve, rest)) = text.rsplit_once('@') else { return Ok(Metric::Number(text.to_string())) };
        if curve.is_empty() {
            bail!("metric `{text}`: a curve's name comes before `@` (loss@300)");
        }
        if let Some((when, threshold)) = rest.split_once(">=") {
            let threshold: f64 = threshold.trim().parse().ok().filter(|t: &f64| t.is_finite()).ok_or_else(|| {
                anyhow::anyhow!("metric `{text}`: the stop rule's threshold `{threshold}` must be a finite number")
            })?;
            if when.trim().is_empty() {
                bail!("metric `{text}`: the stop rule names the curve it stops on (gamma@eval.accuracy>=0.69)");
            }
            return Ok(Metric::AtFirstReach { curve: curve.into(), when: when.trim().into(), threshold });
        }
        match rest.trim().parse::<f64>() {
            Ok(step) if step.is_finite() && step >= 0.0 => Ok(Metric::AtStep { curve: curve.into(), step }),
            _ => bail!(
                "metric `{text}`: after `@` comes a step ≥ 0 (loss@300) or a stop rule (gamma@eval.accuracy>=0.69), \
                 not `{rest}`"
            ),
        }
    }

    /// What the metric measures: the number's or the curve's name (`eval.accuracy` of
    /// `eval.accuracy@400`, `gamma` of `gamma@eval.accuracy>=0.69`).
    pub fn quantity(&self) -> &str {
        match self {
            Metric::Number(n) => n,
            Metric::AtStep { curve, .. } | Metric::AtFirstReach { curve, .. } => curve,
        }
    }

    /// Whether it is an accuracy (or a drop of one): a fraction in the runs' files, which tables
    /// and figures show in percent and claims take margins of in fractions or `pp`.
    pub fn is_accuracy(&self) -> bool {
        let q = self.quantity();
        q.ends_with("accuracy") || q.ends_with("accuracy_drop")
    }
}

/// Whether the metric named `text` is an accuracy ([`Metric::is_accuracy`]), whatever its form;
/// a text that does not parse is judged by its name before any `@`.
pub fn is_accuracy(text: &str) -> bool {
    match Metric::parse(text) {
        Ok(m) => m.is_accuracy(),
        Err(_) => Metric::Number(text.split('@').next().unwrap_or(text).to_string()).is_accuracy(),
    }
}

/// The value of curve `name` at `step` among its `points` (`(step, value)`), `None` where it has
/// none; an error when the curve holds two different values at that step (a file edited by hand,
/// two logs run together: which one a verdict read would be chance). `run` names the run.
pub fn one_value_at(run: &str, name: &str, points: &[(f64, f64)], step: f64) -> Result<Option<f64>> {
    let at: Vec<f64> = points.iter().filter(|(x, _)| *x == step).map(|p| p.1).collect();
    let Some(&y) = at.first() else { return Ok(None) };
    if at.iter().any(|v| v.to_bits() != y.to_bits()) {
        bail!(
            "run {run}: curve `{name}` has {} different values at step {step} ({}); one step, one value",
            at.len(),
            at.iter().map(f64::to_string).collect::<Vec<_>>().join(", ")
        );
    }
    Ok(Some(y))
}

/// An error when curve `name` holds two different values at any one step (see [`one_value_at`]).
pub fn one_value_per_step(run: &str, name: &str, points: &[(f64, f64)]) -> Result<()> {
    let mut sorted: Vec<(f64, f64)> = points.to_vec();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    for w in sorted.windows(2) {
        if w[0].0 == w[1].0 && w[0].1.to_bits() != w[1].1.to_bits() {
            one_value_at(run, name, points, w[0].0)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_form_parses_with_its_quantity_and_unit() {
        assert_eq!(Metric::parse("final_loss").unwrap(), Metric::Number("final_loss".into()));
        let m = Metric::parse("eval.accuracy@400").unwrap();
        assert_eq!(m, Metric::AtStep { curve: "eval.accuracy".into(), step: 400.0 });
        assert!(m.is_accuracy() && is_accuracy("eval.accuracy@400") && is_accuracy("best.eval.accuracy"));
        let m = Metric::parse("gamma@eval.accuracy>=0.69").unwrap();
        assert_eq!(m.quantity(), "gamma");
        assert!(!m.is_accuracy(), "Γ read at a stop rule on the accuracy is Γ");
        assert!(is_accuracy("analysis.half_depth.accuracy_drop"));
        for bad in ["loss@", "loss@x", "@300", "loss@-1", "gamma@acc>=inf", "gamma@>=0.5"] {
            assert!(Metric::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn two_values_at_one_step_are_an_error() {
        let pts = [(0.0, 1.0), (100.0, 0.5), (100.0, 0.5), (200.0, 0.2)];
        assert_eq!(one_value_at("r", "c", &pts, 100.0).unwrap(), Some(0.5));
        assert_eq!(one_value_at("r", "c", &pts, 50.0).unwrap(), None);
        one_value_per_step("r", "c", &pts).unwrap();
        let twice = [(0.0, 1.0), (100.0, 0.5), (100.0, 0.9)];
        let e = one_value_per_step("r", "c", &twice).unwrap_err().to_string();
        assert!(e.contains("2 different values at step 100 (0.5, 0.9)"), "{e}");
    }
}
