//! The figure a kind of run draws of its own runs ([`crate::kinds::Figure`]; `plexus rl`'s
//! evaluation success against environment steps): one line per run from two columns of its
//! `metrics.csv` (colours by topology, as in every plexus figure), and the kind's baselines as grey
//! horizontal lines at their mean over the runs.

use super::{topology_color, Chart, Dash, Kind, LineChart, Series};
use crate::kinds::{Figure, RunKind};
use anyhow::{Context, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// `(x, y)` of the columns `x` and `y` of a run's `metrics.csv`.
fn curve(dir: &Path, x: &str, y: &str) -> Result<Vec<(f64, f64)>> {
    let path = dir.join("metrics.csv");
    let mut r = csv::Reader::from_reader(crate::input_file::open_regular(&path)?);
    let h = r.headers()?.clone();
    let col = |n: &str| h.iter().position(|c| c == n).with_context(|| format!("{}: no `{n}` column", path.display()));
    let (xi, yi) = (col(x)?, col(y)?);
    let mut out = Vec::new();
    for (i, rec) in r.records().enumerate() {
        let rec = rec.with_context(|| format!("reading {}", path.display()))?;
        match (rec.get(xi).map(str::parse::<f64>), rec.get(yi).map(str::parse::<f64>)) {
            (Some(Ok(a)), Some(Ok(b))) => out.push((a, b)),
            _ => anyhow::bail!(
                "{} line {}: `{}` is not a row of numbers ({x}, {y}); the file is damaged",
                path.display(),
                i + 2,
                rec.iter().collect::<Vec<_>>().join(",")
            ),
        }
    }
    Ok(out)
}

/// `kind`'s own figure of `runs` (`<figure>`, e.g. `success`); none for a kind without one.
pub fn kind_figure(kind: &dyn RunKind, runs: &[PathBuf]) -> Result<Vec<super::Figure>> {
    match kind.figure() {
        Some(f) => Ok(vec![figure(f, runs)?]),
        None => Ok(Vec::new()),
    }
}

/// One line per run, colours by topology, the kind's baselines as grey dotted lines.
fn figure(f: &Figure, runs: &[PathBuf]) -> Result<super::Figure> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut series = Vec::new();
    let (mut baselines, mut x_max) = (vec![Vec::new(); f.baselines.len()], 0.0f64);
    let described: Vec<(String, String, u64)> = runs.iter().map(|d| (f.describe)(d)).collect::<Result<_>>()?;
    for (dir, (kind, label, seed)) in runs.iter().zip(&described) {
        let shared = described.iter().filter(|d| d.1 == *label).count() > 1;
        let label = if shared { format!("{label}, seed {seed}") } else { label.clone() };
        let kind = kind.clone();
        let v = seen.entry(kind.clone()).or_default();
        let (color, dash) = (topology_color(&kind, *v), Dash::of_variant(*v));
        *v += 1;
        let points = curve(dir, f.x, f.y)?;
        x_max = points.iter().map(|p| p.0).fold(x_max, f64::max);
        series.push(Series { label, points, color: Some(color), band: None, dash });
        for (values, value) in baselines.iter_mut().zip((f.baseline_values)(dir)) {
            values.extend(value);
        }
    }
    // The baselines as horizontal lines: the mean over the runs (the same tasks for one seed).
    for (values, (label, grey)) in baselines.iter().zip(f.baselines) {
        if !values.is_empty() {
            let r = values.iter().sum::<f64>() / values.len() as f64;
            series.push(Series {
                label: label.to_string(),
                points: vec![(0.0, r), (x_max, r)],
                color: Some(plotters::style::RGBColor(*grey, *grey, *grey)),
                band: None,
                dash: Dash::Dotted,
            });
        }
    }
    let chart =
        LineChart { title: f.title.into(), x_label: f.x_label.into(), y_label: f.y_label.into(), log_y: false, series };
    Ok(super::Figure { file: f.file.into(), kind: Kind::RlSuccess, chart: Chart::Lines(chart) })
}
