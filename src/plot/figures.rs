//! The publication figures, built from run directories (what `plexus plot` draws):
//! training/eval loss, the connectivity heatmap and its evolution grid, ANCRe's
//! `log(p_ij / max_i p_ij)`, Γ and Δ_t over training, layer-wise exits, noise and pruning curves.
//! Colours are fixed per topology ([`super::topology_color`]) so figures can be compared.

use super::{heatmaps, line_chart, topology_color, Heatmap, LineChart, Series};
use crate::analysis;
use crate::experiment::Experiment;
use crate::run_dir::RunDir;
use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// A run as the figures see it: its directory, legend label and colour.
pub struct PlotRun {
    pub dir: PathBuf,
    pub name: String,
    pub kind: String,
    pub label: String,
    pub color: plotters::style::RGBColor,
}

/// Opens the runs and assigns labels and per-topology colours.
pub fn open_runs(dirs: &[PathBuf]) -> Result<Vec<PlotRun>> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    dirs.iter()
        .map(|d| {
            let rd = RunDir::open(d)?;
            let exp = Experiment::from_file(&rd.file("config.yaml"), &[])?;
            let kind = exp.topology.kind().to_string();
            let v = seen.entry(kind.clone()).or_default();
            let color = topology_color(&kind, *v);
            *v += 1;
            Ok(PlotRun {
                dir: d.clone(),
                name: exp.config().name.clone(),
                label: format!("{} ({})", kind, exp.topology.label()),
                kind,
                color,
            })
        })
        .collect()
}

fn read_xy(path: &Path, x: &str, y: &str) -> Result<Vec<(f64, f64)>> {
    let mut r = csv::Reader::from_path(path).with_context(|| format!("reading {}", path.display()))?;
    let h = r.headers()?.clone();
    let col = |n: &str| h.iter().position(|c| c == n).with_context(|| format!("{}: no `{n}` column", path.display()));
    let (xi, yi) = (col(x)?, col(y)?);
    let mut out = Vec::new();
    for rec in r.records() {
        let rec = rec?;
        if let (Ok(a), Ok(b)) = (rec[xi].parse::<f64>(), rec[yi].parse::<f64>()) {
            out.push((a, b));
        }
    }
    Ok(out)
}

fn curves(runs: &[PlotRun], file: &str, x: &str, y: &str) -> Result<Vec<Series>> {
    let mut v = Vec::new();
    for r in runs {
        let p = r.dir.join(file);
        if p.exists() {
            v.push(Series { label: r.label.clone(), points: read_xy(&p, x, y)?, color: Some(r.color) });
        }
    }
    Ok(v)
}

fn chart(title: &str, x: &str, y: &str, log_y: bool, series: Vec<Series>, out: &Path) -> Result<Vec<PathBuf>> {
    if series.iter().all(|s| s.points.is_empty()) {
        return Ok(Vec::new());
    }
    line_chart(&LineChart { title: title.into(), x_label: x.into(), y_label: y.into(), log_y, series }, out)
}

/// Training loss of every run (log axis) → `loss.{png,svg}`; eval loss → `eval_loss.{png,svg}`.
pub fn losses(runs: &[PlotRun], out: &Path, title: Option<&str>) -> Result<Vec<PathBuf>> {
    let mut files = chart(
        title.unwrap_or("Training loss"),
        "step",
        "training loss (log scale)",
        true,
        curves(runs, "metrics.csv", "step", "loss")?,
        &out.join("loss"),
    )?;
    files.extend(chart(
        "Evaluation loss",
        "step",
        "held-out loss (log scale)",
        true,
        curves(runs, "eval.csv", "step", "loss")?,
        &out.join("eval_loss"),
    )?);
    Ok(files)
}

/// Γ over training (H-ACN Fig. 5) and Δ_t (Fig. 6a) for runs that have residual weights.
pub fn gamma_delta(runs: &[PlotRun], out: &Path) -> Result<Vec<PathBuf>> {
    let mut gamma = Vec::new();
    let mut delta = Vec::new();
    for r in runs {
        let g = analysis::gamma_series(&r.dir)?;
        if !g.is_empty() && r.kind == "hacn" {
            gamma.push(Series {
                label: r.label.clone(),
                points: g.iter().map(|&(s, v)| (s as f64, v)).collect(),
                color: Some(r.color),
            });
        }
        let w = analysis::weight_series(&r.dir)?;
        if w.len() > 1 {
            let d = analysis::delta_series(&w);
            let pts = d.iter().filter(|(_, v)| *v > 0.0).map(|&(s, v)| (s as f64, v)).collect();
            delta.push(Series { label: r.label.clone(), points: pts, color: Some(r.color) });
        }
    }
    let mut files = chart("Total connectivity strength Γ = ‖a‖₂/√L", "step", "Γ", false, gamma, &out.join("gamma"))?;
    files.extend(chart(
        "Convergence distance Δ_t = ‖a_T − a_t‖₂",
        "step",
        "Δ_t (log scale)",
        true,
        delta,
        &out.join("delta"),
    )?);
    Ok(files)
}

/// Layer-wise exits (H-ACN Fig. 2a, 4), depth pruning (Fig. 10) and input-noise robustness
/// (Fig. 3c), from the CSVs `plexus analyze` writes.
pub fn analysis_curves(runs: &[PlotRun], out: &Path) -> Result<Vec<PathBuf>> {
    let lm = runs.iter().any(|r| {
        std::fs::read_to_string(r.dir.join("layerwise.csv"))
            .is_ok_and(|s| s.lines().nth(1).is_some_and(|l| !l.ends_with(',')))
    });
    let (metric, ylab, log_y) =
        if lm { ("perplexity", "perplexity (log scale)", true) } else { ("accuracy", "accuracy", false) };
    let mut files = chart(
        "Layer-wise exits: final norm + shared head after unit i",
        "units used (i)",
        ylab,
        log_y,
        curves(runs, "layerwise.csv", "units", metric)?,
        &out.join("layerwise"),
    )?;
    files.extend(chart(
        "Depth pruning: top units removed",
        "units removed",
        ylab,
        log_y,
        curves(runs, "pruning.csv", "removed", metric)?,
        &out.join("pruning"),
    )?);
    // Noise: mean over repeats per level.
    let mut noise = Vec::new();
    for r in runs {
        let p = r.dir.join("noise.csv");
        if !p.exists() {
            continue;
        }
        let pts = read_xy(&p, "level", metric)?;
        let mut levels: Vec<f64> = pts.iter().map(|p| p.0).collect();
        levels.dedup();
        let mean = levels
            .iter()
            .map(|l| {
                let v: Vec<f64> = pts.iter().filter(|p| p.0 == *l).map(|p| p.1).collect();
                (*l, v.iter().sum::<f64>() / v.len() as f64)
            })
            .collect();
        noise.push(Series { label: r.label.clone(), points: mean, color: Some(r.color) });
    }
    files.extend(chart(
        "Robustness to input noise (mean over repeats)",
        "noise level (σ or p)",
        ylab,
        log_y,
        noise,
        &out.join("noise"),
    )?);
    Ok(files)
}

fn node_labels(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            if i == 0 {
                "emb".into()
            } else if i + 1 == n {
                "out".into()
            } else {
                i.to_string()
            }
        })
        .collect()
}

/// C as a heatmap panel: rows = sources (embedding, units), columns = targets (units, readout).
fn c_panel(c: &[Vec<f64>], title: String) -> Heatmap {
    let n = c.len();
    let labels = node_labels(n);
    let values: Vec<Vec<f64>> =
        (0..n - 1).map(|i| (1..n).map(|k| if i < k { c[i][k] } else { f64::NAN }).collect()).collect();
    let range = {
        let v = values.iter().flatten().filter(|v| v.is_finite());
        v.fold((0.0f64, 1.0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)))
    };
    Heatmap {
        title,
        annotate: n <= 14,
        values,
        row_labels: labels[..n - 1].to_vec(),
        col_labels: labels[1..].to_vec(),
        x_label: "target node".into(),
        y_label: "source node".into(),
        colorbar_label: "C[source][target]".into(),
        // Anchored at 0 and at least 1 (the identity shortcut), so "all ones" reads as full strength.
        range: Some(range),
    }
}

/// The C heatmap at `step` (default: the last saved) of every run, plus ANCRe's
/// `log(p_ij / max_i p_ij)` view where a run saved `p`.
pub fn connectivity(runs: &[PlotRun], step: Option<u64>, out: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for r in runs {
        let series = analysis::connectivity_series(&r.dir)?;
        let Some((s, path)) = (match step {
            Some(want) => series.iter().find(|(s, _)| *s == want).cloned(),
            None => series.last().cloned(),
        }) else {
            continue;
        };
        let c = analysis::read_square_matrix(&path)?;
        files.extend(heatmaps(
            &[c_panel(&c, format!("step {s}"))],
            &format!("Direct layer connectivity C — {}", r.label),
            &out.join(format!("connectivity_{}", r.name)),
        )?);
        let p_file = r.dir.join("params").join(format!("p_step_{s}.csv"));
        if p_file.exists() {
            let p = analysis::read_square_matrix(&p_file)?;
            let n = p.len();
            let labels = node_labels(n + 1);
            let mut values = vec![vec![f64::NAN; n - 1]; n - 1];
            for j in 1..n {
                let max = (0..j).map(|i| p[i][j]).fold(f64::MIN, f64::max);
                for i in 0..j {
                    values[i][j - 1] = (p[i][j] / max).ln();
                }
            }
            let panel = Heatmap {
                title: format!("step {s}"),
                annotate: n <= 14,
                values,
                row_labels: labels[..n - 1]
                    .iter()
                    .map(|l| if l == "emb" { "s0".into() } else { format!("s{l}") })
                    .collect(),
                col_labels: (1..n).map(|j| format!("s{j}")).collect(),
                x_label: "target state j".into(),
                y_label: "source state i".into(),
                colorbar_label: "log(p_ij / max_i p_ij)".into(),
                range: None,
            };
            files.extend(heatmaps(
                &[panel],
                &format!("ANCRe coefficients — {}", r.label),
                &out.join(format!("ancre_p_{}", r.name)),
            )?);
        }
    }
    Ok(files)
}

/// C at several fractions of training, side by side with one colour scale (H-ACN Fig. 9).
pub fn connectivity_grid(runs: &[PlotRun], out: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for r in runs {
        let series = analysis::connectivity_series(&r.dir)?;
        if series.len() < 2 {
            continue;
        }
        let last = series.last().unwrap().0 as f64;
        let mut picked: Vec<(u64, PathBuf)> = Vec::new();
        for f in [0.0, 0.25, 0.5, 0.75, 1.0] {
            let want = f * last;
            let best =
                series.iter().min_by(|a, b| (a.0 as f64 - want).abs().total_cmp(&(b.0 as f64 - want).abs())).unwrap();
            if !picked.iter().any(|p| p.0 == best.0) {
                picked.push(best.clone());
            }
        }
        let panels: Vec<Heatmap> = picked
            .iter()
            .map(|(s, p)| {
                Ok(c_panel(&analysis::read_square_matrix(p)?, format!("step {s} ({:.0}%)", 100.0 * *s as f64 / last)))
            })
            .collect::<Result<_>>()?;
        files.extend(heatmaps(
            &panels,
            &format!("C over training — {}", r.label),
            &out.join(format!("connectivity_grid_{}", r.name)),
        )?);
    }
    Ok(files)
}

/// Every figure the runs have data for.
pub fn all(dirs: &[PathBuf], out: &Path, title: Option<&str>, step: Option<u64>) -> Result<Vec<PathBuf>> {
    if dirs.is_empty() {
        bail!("no run directory given");
    }
    let runs = open_runs(dirs)?;
    let mut files = losses(&runs, out, title)?;
    files.extend(gamma_delta(&runs, out)?);
    files.extend(analysis_curves(&runs, out)?);
    files.extend(connectivity(&runs, step, out)?);
    files.extend(connectivity_grid(&runs, out)?);
    Ok(files)
}
