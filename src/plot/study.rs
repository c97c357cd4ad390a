//! `plexus report`'s figures: each curve (loss, Γ, an eval metric) of every setting as its mean
//! over seeds with a band of ± one standard deviation.

use super::{line_chart, LineChart, Series, PALETTE};
use crate::study::{self, StudyReport};
use anyhow::Result;
use std::path::{Path, PathBuf};

/// Draws `curve-<name>.{png,svg}` into `out` for each of the report's curves that the runs log;
/// returns the files written.
pub fn band_curves(r: &StudyReport, out: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for name in &r.curves {
        // A loss spanning decades is drawn on a log axis, its band in log space.
        let linear: Vec<Vec<(f64, f64, f64, f64)>> =
            r.groups.iter().map(|g| study::band(r, g, name, false)).collect::<Result<_>>()?;
        let ys: Vec<f64> = linear.iter().flatten().map(|p| p.1).collect();
        let (lo, hi) = ys.iter().fold((f64::MAX, f64::MIN), |(a, b), &y| (a.min(y), b.max(y)));
        let log_y = name.ends_with("loss") && lo > 0.0 && hi / lo > 20.0;
        let mut series = Vec::new();
        for (i, (g, band)) in r.groups.iter().zip(linear).enumerate() {
            let band = if log_y { study::band(r, g, name, true)? } else { band };
            if band.is_empty() {
                continue;
            }
            let label = match r.by.is_empty() {
                true => format!("all runs (n = {})", g.runs.len()),
                false => format!(
                    "{} (n = {})",
                    r.by.iter().zip(&g.key).map(|(k, v)| format!("{}={v}", short(k))).collect::<Vec<_>>().join(", "),
                    g.runs.len()
                ),
            };
            series.push(Series {
                label,
                points: band.iter().map(|&(x, m, _, _)| (x, m)).collect(),
                color: Some(PALETTE[i % PALETTE.len()]),
                band: Some(band.iter().map(|&(_, _, lo, hi)| (lo, hi)).collect()),
            });
        }
        if series.is_empty() {
            continue;
        }
        // RL success: the baselines of the same tasks as flat grey lines (their mean over runs).
        if name == "success" {
            let x_max = series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).fold(0.0, f64::max);
            for (metric, label, grey) in
                [("straight_success", "straight at the goal", 60), ("random_success", "random policy", 150)]
            {
                let v: Vec<f64> = r.runs.iter().filter_map(|run| run.metrics.get(metric).copied()).collect();
                if !v.is_empty() {
                    let mean = v.iter().sum::<f64>() / v.len() as f64;
                    series.push(Series {
                        label: format!("{label} (mean of the runs' tasks)"),
                        points: vec![(0.0, mean), (x_max, mean)],
                        color: Some(plotters::style::RGBColor(grey, grey, grey)),
                        band: None,
                    });
                }
            }
        }
        let x = if name == "success" { "environment steps" } else { "step" };
        let chart = LineChart {
            title: match log_y {
                true => format!("{name}: geometric mean ×÷ geometric sd over seeds"),
                false => format!("{name}: mean ± sd over seeds"),
            },
            x_label: x.into(),
            y_label: name.clone(),
            log_y,
            series,
        };
        std::fs::create_dir_all(out)?;
        let file = format!("curve-{}", name.replace(['.', '/'], "_"));
        files.extend(line_chart(&chart, &out.join(file))?);
    }
    Ok(files)
}

/// `topology.init.mu` → `mu` in legends.
fn short(key: &str) -> &str {
    key.rsplit('.').next().unwrap_or(key)
}
