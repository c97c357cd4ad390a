//! How a study's keys, values and metrics are named where a reader sees them (tables for a paper,
//! figures): `topology.kind` → `topology`, `hacn` → `H-ACN`, `decades_per_1k` → `rate (decades /
//! 1,000 steps)`, `best.eval.accuracy` → `best accuracy`. A name it does not know is shown as
//! it is, so a new metric is never hidden, only left in its key form.

use super::metric::Metric;

/// A metric in words (its unit, `(%)` where the tables print percent, is the caller's to add).
pub fn metric(name: &str) -> String {
    match Metric::parse(name).ok() {
        Some(Metric::AtStep { curve, step }) => format!("{} at step {step}", quantity(&curve)),
        Some(Metric::AtFirstReach { curve, when, threshold }) => {
            let level =
                if super::in_percent(&when) { format!("{} %", 100.0 * threshold) } else { threshold.to_string() };
            format!("{} when {} first reaches {level}", quantity(&curve), quantity(&when))
        }
        _ => match name {
            "decades_per_1k" => "rate (decades / 1,000 steps)".into(),
            "loss_rate" => "log-loss slope (decades / 1,000 steps)".into(),
            "steps_to_1e3" => "steps to 10⁻³ of the initial loss".into(),
            "steps_to_1e6" => "steps to 10⁻⁶ of the initial loss".into(),
            "steps_to_1e9" => "steps to 10⁻⁹ of the initial loss".into(),
            "mean_log_loss" => "mean log-loss (decades)".into(),
            "final_loss" => "final training loss".into(),
            "min_loss" => "lowest training loss".into(),
            "initial.gamma" => "Γ at the start".into(),
            n if n.starts_with("best.") => format!("best {}", quantity(&n["best.".len()..])),
            n => quantity(n),
        },
    }
}

/// A logged quantity's name (`eval.accuracy` → `accuracy`, `gamma` → `Γ`), without a unit.
fn quantity(name: &str) -> String {
    match name {
        "eval.accuracy" | "accuracy" => "accuracy".into(),
        "eval.loss" => "held-out loss".into(),
        "eval.perplexity" => "held-out perplexity".into(),
        "loss" => "training loss".into(),
        "gamma" => "Γ".into(),
        "fd.fd" => "Fréchet distance".into(),
        n => crate::kinds::KINDS
            .iter()
            .find_map(|k| k.metric_names().iter().find(|(m, _)| *m == n))
            .map_or_else(|| n.to_string(), |(_, words)| words.to_string()),
    }
}

/// A config key as a column title: its last part, with the papers' symbols for the options that
/// have one (`topology.init.mu` → `μ`, `topology.kind` → `topology`, `model.depth` → `depth`).
pub fn key(key: &str) -> String {
    match key {
        "topology.kind" => "topology".into(),
        "topology.init.mu" => "μ".into(),
        "name" => "run".into(),
        k => k.rsplit('.').next().unwrap_or(k).replace('_', " "),
    }
}

/// A config value in a key's column: a topology kind by its display name (`hacn` → `H-ACN`).
pub fn value(key: &str, value: &str) -> String {
    match key {
        k if k.ends_with("topology.kind") => crate::topology::entry(value).map_or(value, |e| e.display).to_string(),
        _ => value.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn keys_metrics_and_values_in_words() {
        assert_eq!(super::metric("decades_per_1k"), "rate (decades / 1,000 steps)");
        assert_eq!(super::metric("best.eval.accuracy"), "best accuracy");
        assert_eq!(super::metric("eval.accuracy"), "accuracy");
        assert_eq!(super::metric("eval.accuracy@400"), "accuracy at step 400");
        assert_eq!(super::metric("gamma@eval.accuracy>=0.325"), "Γ when accuracy first reaches 32.5 %");
        assert_eq!(super::metric("some.new_metric"), "some.new_metric");
        assert_eq!(super::key("topology.init.mu"), "μ");
        assert_eq!(super::key("model.channel_hidden"), "channel hidden");
        assert_eq!(super::value("topology.kind", "hacn"), "H-ACN");
    }
}
