//! The publication figures, built from run directories (what `plexus plot` draws):
//! training/eval loss, the connectivity heatmap and its evolution grid, ANCRe's
//! `log(p_ij / max_i p_ij)`, Γ and Δ_t over training, layer-wise exits, noise and pruning curves.
//! Colours are fixed per topology ([`super::topology_color`]) so figures can be compared.

use super::{heatmaps, line_chart, topology_color, Heatmap, LineChart, Series};
use crate::analysis;
use crate::experiment::Experiment;
use crate::run_dir::RunDir;
use anyhow::{bail, Result};
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
            crate::train::trained::refuse_rl_run(&rd)?;
            let exp = Experiment::from_file(&rd.config_file(), &[])?;
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

/// One series per run from its `RunDir`'s rows (`points` picks them), for runs that have any.
fn curves(runs: &[PlotRun], points: impl Fn(&RunDir) -> Result<Vec<(f64, f64)>>) -> Result<Vec<Series>> {
    let mut v = Vec::new();
    for r in runs {
        let pts = points(&RunDir::new(&r.dir))?;
        if !pts.is_empty() {
            v.push(Series { label: r.label.clone(), points: pts, color: Some(r.color), band: None });
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
        curves(runs, |d| Ok(d.metrics()?.iter().map(|m| (m.step as f64, m.loss)).collect()))?,
        &out.join("loss"),
    )?;
    files.extend(chart(
        "Evaluation loss",
        "step",
        "held-out loss (log scale)",
        true,
        curves(runs, |d| Ok(d.evals()?.iter().map(|e| (e.step as f64, e.loss)).collect()))?,
        &out.join("eval_loss"),
    )?);
    Ok(files)
}

/// Diffusion runs: the validation ε-MSE per bucket of timesteps at the last evaluation, against
/// the bucket's mid `t` (log axis) → `eps_by_t.{png,svg}`; nothing for other runs.
pub fn eps_by_t(runs: &[PlotRun], out: &Path) -> Result<Vec<PathBuf>> {
    let series = curves(runs, |d| {
        let rows = d.eps_by_t()?;
        let Some((_, last)) = rows.last() else { return Ok(Vec::new()) };
        let width = crate::diffusion::STEPS as f64 / last.len() as f64;
        Ok(last
            .iter()
            .enumerate()
            .filter(|(_, v)| v.is_finite() && **v > 0.0)
            .map(|(k, v)| ((k as f64 + 0.5) * width, *v))
            .collect())
    })?;
    chart(
        "Validation ε-MSE by timestep (last evaluation)",
        "diffusion timestep t (bucket mid)",
        "ε-MSE (log scale)",
        true,
        series,
        &out.join("eps_by_t"),
    )
}

/// Γ over training (H-ACN Fig. 5) and Δ_t (Fig. 6a) for runs that have residual weights.
pub fn gamma_delta(runs: &[PlotRun], out: &Path) -> Result<Vec<PathBuf>> {
    let mut gamma = Vec::new();
    let mut delta = Vec::new();
    for r in runs {
        let g = analysis::gamma_series(&r.dir)?;
        let w = analysis::weight_series(&r.dir)?;
        // Γ is drawn for runs with trainable residual weights (those that save them), not for the
        // constant Γ of residual (1) or ACN (0).
        if !g.is_empty() && !w.is_empty() {
            gamma.push(Series {
                label: r.label.clone(),
                points: g.iter().map(|&(s, v)| (s as f64, v)).collect(),
                color: Some(r.color),
                band: None,
            });
        }
        if w.len() > 1 {
            let d = analysis::delta_series(&w);
            let pts = d.iter().filter(|(_, v)| *v > 0.0).map(|&(s, v)| (s as f64, v)).collect();
            delta.push(Series { label: r.label.clone(), points: pts, color: Some(r.color), band: None });
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
    let mut lm = false;
    for r in runs {
        lm |= analysis::read_layerwise(&RunDir::new(&r.dir))?.iter().any(|e| e.perplexity.is_some());
    }
    let (ylab, log_y) = if lm { ("perplexity (log scale)", true) } else { ("accuracy", false) };
    // The metric of a row: perplexity for language models, accuracy otherwise.
    let metric = move |accuracy: Option<f64>, perplexity: Option<f64>| if lm { perplexity } else { accuracy };
    let mut files = chart(
        "Layer-wise exits: final norm + shared head after unit i",
        "units used (i)",
        ylab,
        log_y,
        curves(runs, |d| {
            Ok(analysis::read_layerwise(d)?
                .iter()
                .filter_map(|e| Some((e.units as f64, metric(e.accuracy, e.perplexity)?)))
                .collect())
        })?,
        &out.join("layerwise"),
    )?;
    files.extend(chart(
        "Depth pruning: top units removed",
        "units removed",
        ylab,
        log_y,
        curves(runs, |d| {
            Ok(analysis::read_pruning(d)?
                .iter()
                .filter_map(|e| Some((e.removed as f64, metric(e.accuracy, e.perplexity)?)))
                .collect())
        })?,
        &out.join("pruning"),
    )?);
    // Noise: mean over repeats per level.
    let mut noise = Vec::new();
    for r in runs {
        let pts: Vec<(f64, f64)> = analysis::read_noise(&RunDir::new(&r.dir))?
            .iter()
            .filter_map(|n| Some((n.level, metric(n.accuracy, n.perplexity)?)))
            .collect();
        if pts.is_empty() {
            continue;
        }
        let mut levels: Vec<f64> = pts.iter().map(|p| p.0).collect();
        levels.dedup();
        let mean = levels
            .iter()
            .map(|l| {
                let v: Vec<f64> = pts.iter().filter(|p| p.0 == *l).map(|p| p.1).collect();
                (*l, v.iter().sum::<f64>() / v.len() as f64)
            })
            .collect();
        noise.push(Series { label: r.label.clone(), points: mean, color: Some(r.color), band: None });
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
fn c_panel(c: &crate::run_dir::Matrix, title: String) -> Heatmap {
    let n = c.nrows();
    let labels = node_labels(n);
    let values =
        ndarray::Array2::from_shape_fn((n - 1, n - 1), |(i, j)| if i < j + 1 { c[[i, j + 1]] } else { f64::NAN });
    let range = {
        let v = values.iter().filter(|v| v.is_finite());
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
        let run = RunDir::new(&r.dir);
        let steps = run.connectivity_steps()?;
        let Some(s) = (match step {
            Some(want) => steps.iter().find(|s| **s == want).copied(),
            None => steps.last().copied(),
        }) else {
            continue;
        };
        let c = run.connectivity(s)?;
        files.extend(heatmaps(
            &[c_panel(&c, format!("step {s}"))],
            &format!("Direct layer connectivity C — {}", r.label),
            &out.join(format!("connectivity_{}", r.name)),
        )?);
        let view = crate::topology::SHORTCUT_WEIGHTS;
        if run.param_view_file(view, s).exists() {
            let p = crate::run_dir::read_square_matrix(&run.param_view_file(view, s))?;
            let n = p.nrows();
            let labels = node_labels(n + 1);
            let mut values = ndarray::Array2::from_elem((n - 1, n - 1), f64::NAN);
            for j in 1..n {
                let max = (0..j).map(|i| p[[i, j]]).fold(f64::MIN, f64::max);
                for i in 0..j {
                    values[[i, j - 1]] = (p[[i, j]] / max).ln();
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
        let run = RunDir::new(&r.dir);
        let steps = run.connectivity_steps()?;
        if steps.len() < 2 {
            continue;
        }
        let last = *steps.last().unwrap() as f64;
        let mut picked: Vec<u64> = Vec::new();
        for f in [0.0, 0.25, 0.5, 0.75, 1.0] {
            let want = f * last;
            let best =
                *steps.iter().min_by(|a, b| (**a as f64 - want).abs().total_cmp(&(**b as f64 - want).abs())).unwrap();
            if !picked.contains(&best) {
                picked.push(best);
            }
        }
        let panels: Vec<Heatmap> = picked
            .iter()
            .map(|s| Ok(c_panel(&run.connectivity(*s)?, format!("step {s} ({:.0}%)", 100.0 * *s as f64 / last))))
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
    files.extend(eps_by_t(&runs, out)?);
    files.extend(analysis_curves(&runs, out)?);
    files.extend(connectivity(&runs, step, out)?);
    files.extend(connectivity_grid(&runs, out)?);
    Ok(files)
}
