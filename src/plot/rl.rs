//! The figure of `plexus rl`: evaluation success rate against environment steps, one line per
//! run (colours by topology, as in every plexus figure), and the two baselines on the same tasks as
//! grey lines: the random policy (light) and the policy that walks straight at the goal (dark).

use super::{line_chart, topology_color, Dash, LineChart, Series};
use crate::rl::config::RlExperiment;
use crate::rl::trainer::RlSummary;
use anyhow::{Context, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// `(env_steps, success)` of a run's `metrics.csv`.
fn success_curve(dir: &Path) -> Result<Vec<(f64, f64)>> {
    let path = dir.join("metrics.csv");
    let mut r = csv::Reader::from_reader(crate::input_file::open_regular(&path)?);
    let h = r.headers()?.clone();
    let col = |n: &str| h.iter().position(|c| c == n).with_context(|| format!("{}: no `{n}` column", path.display()));
    let (x, y) = (col("env_steps")?, col("success")?);
    let mut out = Vec::new();
    for (i, rec) in r.records().enumerate() {
        let rec = rec.with_context(|| format!("reading {}", path.display()))?;
        match (rec.get(x).map(str::parse::<f64>), rec.get(y).map(str::parse::<f64>)) {
            (Some(Ok(a)), Some(Ok(b))) => out.push((a, b)),
            _ => anyhow::bail!(
                "{} line {}: `{}` is not a row of numbers (env_steps, success); the file is damaged",
                path.display(),
                i + 2,
                rec.iter().collect::<Vec<_>>().join(",")
            ),
        }
    }
    Ok(out)
}

/// Draws `success.{png,svg}` into `out` for the `plexus rl` run directories `runs`.
pub fn success(runs: &[PathBuf], out: &Path) -> Result<Vec<PathBuf>> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut series = Vec::new();
    let (mut random, mut straight, mut x_max) = (Vec::new(), Vec::new(), 0.0f64);
    for dir in runs {
        let exp = RlExperiment::from_file(&dir.join("config.yaml"), &[])
            .with_context(|| format!("{} is not a `plexus rl` run directory", dir.display()))?;
        let kind = exp.topology.kind().to_string();
        let v = seen.entry(kind.clone()).or_default();
        let (color, dash) = (topology_color(&kind, *v), Dash::of_variant(*v));
        *v += 1;
        let points = success_curve(dir)?;
        x_max = points.iter().map(|p| p.0).fold(x_max, f64::max);
        let label = format!("{}, depth {} ({})", super::display_name(&kind), exp.config.network.depth, exp.config.name);
        series.push(Series { label, points, color: Some(color), band: None, dash });
        if let Ok(text) = std::fs::read_to_string(dir.join("summary.json")) {
            if let Ok(s) = serde_json::from_str::<RlSummary>(&text) {
                random.push(s.random_success);
                // Runs written before the straight-line baseline have none (0 from the default).
                if s.straight_success > 0.0 {
                    straight.push(s.straight_success);
                }
            }
        }
    }
    // The baselines as horizontal lines: the mean over the runs (the same tasks for one seed).
    for (values, label, grey) in [(&random, "random policy", 150), (&straight, "straight at the goal", 60)] {
        if !values.is_empty() {
            let r = values.iter().sum::<f64>() / values.len() as f64;
            series.push(Series {
                label: label.into(),
                points: vec![(0.0, r), (x_max, r)],
                color: Some(plotters::style::RGBColor(grey, grey, grey)),
                band: None,
                dash: Dash::Dotted,
            });
        }
    }
    let chart = LineChart {
        title: "Contrastive RL, point maze: evaluation success".into(),
        x_label: "environment steps".into(),
        y_label: "success rate".into(),
        log_y: false,
        series,
    };
    line_chart(&chart, &out.join("success"))
}
