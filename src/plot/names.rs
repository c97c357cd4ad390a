//! Names in display form: a topology's as papers print it, a logged quantity's with its unit.

/// Whether a loss is drawn on a log axis: every value positive, the largest more than 20 times
/// the smallest (1.3 decades). One rule for `plexus plot` and `plexus report`, so that the same
/// runs' loss has one scale in both.
pub fn spans_decades(values: impl Iterator<Item = f64>) -> bool {
    let (lo, hi) =
        values.filter(|v| v.is_finite()).fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
    lo > 0.0 && hi / lo > 20.0
}

pub use crate::topology::display_name;

/// The axis title of a logged quantity, with its unit: `loss` → `training loss (nats)` (the unit
/// given), `eval.accuracy` → `held-out accuracy (%)`, `gamma` → `Γ`, `fd.fd` → `Fréchet distance`,
/// …; a name it does not know
/// is shown as it is.
pub fn quantity(name: &str, loss_unit: &str) -> String {
    let (prefix, base) = match name.split_once('.') {
        Some((p, b)) => (p, b),
        None => ("", name),
    };
    let what = match prefix {
        "eval" => "held-out ",
        "layerwise" => "exit ",
        "noise" => "",
        _ => "",
    };
    match base {
        "loss" if prefix.is_empty() => format!("training loss{loss_unit}"),
        "loss" => format!("{what}loss{loss_unit}"),
        b if b.ends_with("accuracy") => format!("{what}accuracy (%)"),
        "perplexity" => format!("{what}perplexity"),
        "gamma" => "Γ".into(),
        "success" => "success rate".into(),
        "grad_norm" => "gradient norm".into(),
        "lr" => "learning rate".into(),
        // `plexus fd` at checkpoints: distances in the extractor's feature space, unitless.
        // Short enough for a single-column figure's axis.
        "fd" if prefix == "fd" => "Fréchet distance".into(),
        "real_floor" if prefix == "fd" => "real-vs-real distance".into(),
        "class_agreement" if prefix == "fd" => "class agreement".into(),
        // `plexus analyze`'s numbers: at half depth, under input noise at a level.
        _ if name == "analysis.half_depth.accuracy" => "accuracy at half depth (%)".into(),
        _ if name.starts_with("analysis.noise[") => noise_metric(name),
        // A summary number (`final_loss`, `decades_per_1k`) as the report's tables name it.
        _ => crate::study::names::metric(name),
    }
}

/// `analysis.noise[0.2].accuracy` → `accuracy at input noise σ = 0.2 (%)`, `….accuracy_drop` →
/// `accuracy drop at σ = 0.2 (points)` (short enough for a column's axis), `….perplexity` →
/// `perplexity at character noise p = 0.2`; another name as it is.
fn noise_metric(name: &str) -> String {
    let Some((level, what)) = name["analysis.noise[".len()..].split_once("].") else { return name.to_string() };
    match what {
        "accuracy" => format!("accuracy at input noise σ = {level} (%)"),
        "accuracy_drop" => format!("accuracy drop at σ = {level} (points)"),
        "perplexity" => format!("perplexity at character noise p = {level}"),
        _ => name.to_string(),
    }
}
