//! `plexus report`'s figures: each curve (loss, Γ, an eval metric over training; after `plexus
//! analyze`, a metric against the exit depth or the input noise) of every setting as its mean over
//! seeds with a band of ± one standard deviation. Accuracies are drawn in percent, as the tables
//! show them.

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
        let percent = study::in_percent(name);
        let scale = |band: Vec<(f64, f64, f64, f64)>| match percent {
            true => band.into_iter().map(|(x, m, lo, hi)| (x, 100.0 * m, 100.0 * lo, 100.0 * hi)).collect(),
            false => band,
        };
        let linear: Vec<Vec<(f64, f64, f64, f64)>> =
            r.groups.iter().map(|g| study::band(r, g, name, false).map(scale)).collect::<Result<_>>()?;
        let ys: Vec<f64> = linear.iter().flatten().map(|p| p.1).collect();
        let (lo, hi) = ys.iter().fold((f64::MAX, f64::MIN), |(a, b), &y| (a.min(y), b.max(y)));
        let log_y = name.ends_with("loss") && lo > 0.0 && hi / lo > 20.0;
        let mut series = Vec::new();
        let colors = group_colors(r);
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
                color: Some(colors[i]),
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
        let x = match name.split('.').next() {
            Some("success") => "environment steps",
            Some("layerwise") => "units before the exit (the shared head reads the stream there)",
            Some("noise") => "input noise level (Gaussian σ; for text, replacement probability)",
            _ => "step",
        };
        let chart = LineChart {
            title: match log_y {
                true => format!("{name}: geometric mean ×÷ geometric sd over seeds"),
                false => format!("{name}: mean ± sd over seeds"),
            },
            x_label: x.into(),
            y_label: if percent { format!("{name} (%)") } else { name.clone() },
            log_y,
            series,
        };
        std::fs::create_dir_all(out)?;
        let file = format!("curve-{}", name.replace(['.', '/'], "_"));
        files.extend(line_chart(&chart, &out.join(file))?);
    }
    Ok(files)
}

/// Draws `claim-<id>.{png,svg,pdf}` into `out` for each of the report's claims: the metric of arm
/// A and of arm B on each shared seed (a log axis where the claim compares on a log scale), titled
/// with the claim, its mean difference and its verdict; returns the files written.
pub fn claim_figures(r: &StudyReport, out: &Path) -> Result<Vec<PathBuf>> {
    use crate::study::claims::Scale;
    let mut files = Vec::new();
    for c in &r.claims {
        let cl = &c.claim;
        // Numbers no statistic could take (a value that is not finite) draw no figure either.
        if matches!(c.verdict, crate::study::claims::Verdict::NotComputable(_)) {
            continue;
        }
        if cl.across_seeds.is_some() {
            files.extend(profiles_figure(c, out)?);
            continue;
        }
        let log = cl.scale == Scale::Log;
        // Accuracies in percent, as the tables show them.
        let unit = match !log && cl.metrics().iter().all(|m| study::in_percent(m)) {
            true => 100.0,
            false => 1.0,
        };
        let arm = |label: &str, text: &str, pick: fn(&(f64, f64)) -> f64, color: usize| Series {
            label: format!("{label}: {text}"),
            points: c.seeds.iter().zip(&c.values).map(|(&s, v)| (s as f64, unit * pick(v))).collect(),
            color: Some(PALETTE[color]),
            band: None,
        };
        // Three significant digits, an exponent where the fixed point would hide them.
        let num = |v: f64| match v.abs() {
            a if a != 0.0 && !(1e-3..1e6).contains(&a) => format!("{v:.2e}"),
            _ => format!("{v:.3}"),
        };
        let delta = match log {
            true => format!("A/B = ×{}", num(c.diff.mean.exp())),
            false => format!("Δ = A − B = {}", num(unit * c.diff.mean)),
        };
        let chart = LineChart {
            title: format!("{} ({}): {delta}, {}", cl.id, cl.source, c.verdict),
            x_label: "seed (A and B paired on it)".into(),
            y_label: cl.metrics().join(" (A) vs ")
                + if cl.b_metric.is_some() { " (B)" } else { "" }
                + if unit == 100.0 { " (%)" } else { "" },
            log_y: log,
            series: vec![arm("A", &cl.a, |v| v.0, 0), arm("B", &cl.b, |v| v.1, 1)],
        };
        std::fs::create_dir_all(out)?;
        let file = crate::study::claims::figure_stem(&cl.id);
        files.extend(line_chart(&chart, &out.join(file))?);
    }
    Ok(files)
}

/// An `across_seeds` claim's figure: each seed's vector against its index (the residual weights
/// unit by unit), titled with r̄ and the verdict.
fn profiles_figure(c: &crate::study::claims::ClaimResult, out: &Path) -> Result<Vec<PathBuf>> {
    let cl = &c.claim;
    let series = c
        .seeds
        .iter()
        .zip(&c.profiles)
        .enumerate()
        .map(|(k, (seed, v))| Series {
            label: format!("seed {seed}"),
            points: v.iter().enumerate().map(|(i, y)| (i as f64, *y)).collect(),
            color: Some(PALETTE[k % PALETTE.len()]),
            band: None,
        })
        .collect();
    let chart = LineChart {
        title: format!(
            "{} ({}): mean r = {:.3} over {} seeds, {}",
            cl.id,
            cl.source,
            c.diff.mean,
            c.seeds.len(),
            c.verdict
        ),
        x_label: format!("index of {} (unit)", cl.metric),
        y_label: format!("{} ({})", cl.metric, cl.a),
        log_y: false,
        series,
    };
    std::fs::create_dir_all(out)?;
    let file = crate::study::claims::figure_stem(&cl.id);
    line_chart(&chart, &out.join(file))
}

/// One colour per group: where every run of a group has one topology (`topology.kind`, or an RL
/// network's `network.topology.kind`), that topology's colour — the one `plexus plot` draws it in,
/// lightened for a second group of the same topology — so a topology looks the same in every
/// figure; otherwise the palette in group order.
fn group_colors(r: &StudyReport) -> Vec<plotters::style::RGBColor> {
    let kind_of = |g: &crate::study::GroupResult| -> Option<String> {
        let kinds: std::collections::BTreeSet<&String> = g
            .runs
            .iter()
            .filter_map(|&i| {
                let c = &r.runs[i].config;
                c.get("topology.kind").or_else(|| c.get("network.topology.kind"))
            })
            .collect();
        match kinds.into_iter().collect::<Vec<_>>().as_slice() {
            [one]
                if g.runs.iter().all(|&i| {
                    let c = &r.runs[i].config;
                    c.contains_key("topology.kind") || c.contains_key("network.topology.kind")
                }) =>
            {
                Some((*one).clone())
            }
            _ => None,
        }
    };
    let kinds: Vec<Option<String>> = r.groups.iter().map(kind_of).collect();
    if kinds.iter().any(Option::is_none) {
        return (0..r.groups.len()).map(|i| PALETTE[i % PALETTE.len()]).collect();
    }
    let mut seen: std::collections::HashMap<&String, usize> = std::collections::HashMap::new();
    kinds
        .iter()
        .map(|k| {
            let k = k.as_ref().expect("checked");
            let v = seen.entry(k).or_default();
            *v += 1;
            super::topology_color(k, *v - 1)
        })
        .collect()
}

/// `topology.init.mu` → `mu` in legends.
fn short(key: &str) -> &str {
    key.rsplit('.').next().unwrap_or(key)
}
