//! The publication figures, built from run directories (what `plexus plot` draws):
//! training/eval loss, the connectivity heatmap and its evolution grid, ANCRe's
//! `log(p_ij / max_i p_ij)`, Γ and Δ_t over training, layer-wise exits, noise and pruning curves.
//! Colours are fixed per topology ([`super::topology_color`]) so figures can be compared.

use super::{heatmaps, line_chart, topology_color, Dash, Heatmap, LineChart, Series, Style};
use crate::analysis;
use crate::experiment::Experiment;
use crate::run_dir::RunDir;
use anyhow::{bail, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// A run as the figures see it: its directory, legend label and colour, and the setting (runs
/// whose configs differ only in `seed` and `name`) it belongs to.
pub struct PlotRun {
    pub dir: PathBuf,
    /// The run directory's name: per-run files are named by it, so that no two runs share one.
    pub name: String,
    pub kind: String,
    pub label: String,
    pub color: plotters::style::RGBColor,
    /// Its line: settings of one topology share a colour's shades and differ in line.
    pub dash: Dash,
    /// Index of the run's setting; the runs of one setting are drawn as one mean with a band.
    pub setting: usize,
    /// The run's objective: what its loss is measured in.
    pub task: crate::data::Task,
}

/// A run's config with `seed` and `name` left out: equal for the seeds of one setting.
fn setting_of(rd: &RunDir) -> Result<String> {
    let text = std::fs::read_to_string(rd.config_file())?;
    let mut v: serde_yaml::Value = serde_yaml::from_str(&text)?;
    if let serde_yaml::Value::Mapping(m) = &mut v {
        m.remove("seed");
        m.remove("name");
    }
    Ok(serde_yaml::to_string(&v)?)
}

/// Opens the runs, groups them into settings (configs equal but for `seed` and `name`) and labels
/// each setting by what tells it apart in this figure: the topology's display name ("H-ACN"), then
/// its settings where two settings share a topology ("H-ACN (μ=0.25)"), then the config's name.
/// Colours are per topology ([`topology_color`]), lighter for a topology's second setting.
pub fn open_runs(dirs: &[PathBuf]) -> Result<Vec<PlotRun>> {
    let mut settings: Vec<String> = Vec::new();
    let mut runs = Vec::new();
    let mut facts = Vec::new();
    for d in dirs {
        let rd = RunDir::open(d)?;
        crate::kinds::expect_kind(&rd, &crate::kinds::TRAIN)?;
        let exp = Experiment::of_run(&rd.path, &rd.config_file(), &[])?;
        let key = setting_of(&rd)?;
        let setting = settings.iter().position(|k| *k == key).unwrap_or_else(|| {
            settings.push(key);
            settings.len() - 1
        });
        let kind = exp.topology.kind().to_string();
        facts.push((setting, kind.clone(), exp.topology.label(), exp.config().name.clone()));
        let name = d.file_name().map_or_else(|| d.display().to_string(), |n| n.to_string_lossy().into_owned());
        runs.push(PlotRun {
            dir: d.clone(),
            name,
            kind,
            label: String::new(),
            color: topology_color("", 0),
            dash: Dash::Solid,
            setting,
            task: exp.task(),
        });
    }
    // One (kind, layout, config name) per setting, in the order the settings first appear.
    let per_setting: Vec<&(usize, String, String, String)> =
        (0..settings.len()).map(|s| facts.iter().find(|f| f.0 == s).expect("every setting has a run")).collect();
    let labels: Vec<String> = per_setting
        .iter()
        .map(|(_, kind, layout, name)| {
            let same_kind: Vec<_> = per_setting.iter().filter(|f| f.1 == *kind).collect();
            let mut label = super::display_name(kind);
            if same_kind.len() > 1 && same_kind.iter().any(|f| f.2 != *layout) {
                label = format!("{label} ({layout})");
            }
            if same_kind.iter().filter(|f| f.2 == *layout).count() > 1 {
                label = format!("{label}, {name}");
            }
            label
        })
        .collect();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let colors: Vec<_> = per_setting
        .iter()
        .map(|(_, kind, _, _)| {
            let v = seen.entry(kind.clone()).or_default();
            *v += 1;
            (topology_color(kind, *v - 1), Dash::of_variant(*v - 1))
        })
        .collect();
    for r in &mut runs {
        r.label = labels[r.setting].clone();
        (r.color, r.dash) = colors[r.setting];
    }
    Ok(runs)
}

/// One series per setting from its runs' rows (`points` picks them), for settings that have any:
/// a single run as its points; several (seeds) as the mean at every x all of them logged, with a
/// band of ± one standard deviation, the legend saying how many (`H-ACN (n = 3)`).
fn curves(runs: &[PlotRun], points: impl Fn(&RunDir) -> Result<Vec<(f64, f64)>>) -> Result<Vec<Series>> {
    let mut v = Vec::new();
    let settings = runs.iter().map(|r| r.setting).max().map_or(0, |m| m + 1);
    for s in 0..settings {
        let mine: Vec<&PlotRun> = runs.iter().filter(|r| r.setting == s).collect();
        let mut all = Vec::new();
        for r in &mine {
            let pts = points(&RunDir::new(&r.dir))?;
            if !pts.is_empty() {
                all.push(pts);
            }
        }
        let Some(first) = mine.first() else { continue };
        match all.len() {
            0 => {}
            1 => v.push(Series {
                label: first.label.clone(),
                points: all.remove(0),
                color: Some(first.color),
                band: None,
                dash: first.dash,
            }),
            n => {
                let (points, band) = mean_band(&all);
                v.push(Series {
                    label: format!("{} (n = {n})", first.label),
                    points,
                    color: Some(first.color),
                    band: Some(band),
                    dash: first.dash,
                });
            }
        }
    }
    Ok(v)
}

/// Points of a curve, `(x, y)`, or of a band, `(low, high)`.
type Points = Vec<(f64, f64)>;

/// The mean and mean ± sd of several curves at every x all of them have.
fn mean_band(curves: &[Points]) -> (Points, Points) {
    let (mut points, mut band) = (Vec::new(), Vec::new());
    for &(x, _) in &curves[0] {
        let ys: Vec<f64> = curves.iter().filter_map(|c| c.iter().find(|p| p.0 == x).map(|p| p.1)).collect();
        if ys.len() < curves.len() {
            continue;
        }
        let n = ys.len() as f64;
        let mean = ys.iter().sum::<f64>() / n;
        let sd = (ys.iter().map(|y| (y - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
        points.push((x, mean));
        band.push((mean - sd, mean + sd));
    }
    (points, band)
}

fn chart(
    title: &str,
    x: &str,
    y: &str,
    log_y: bool,
    mut series: Vec<Series>,
    style: &Style,
    out: &Path,
) -> Result<Vec<PathBuf>> {
    if series.iter().all(|s| s.points.is_empty()) {
        return Ok(Vec::new());
    }
    // Every line the mean of as many seeds: said once in the title, not in each legend entry;
    // else the entries with seeds say how many and the title what their bands are.
    let seeds =
        |s: &Series| s.band.as_ref().and(s.label.rsplit_once(" (n = ")).map(|(l, n)| (l.to_string(), n.to_string()));
    let mut title = title.to_string();
    match series.first().and_then(seeds) {
        Some((_, n)) if series.iter().all(|s| seeds(s).is_some_and(|(_, m)| m == n)) => {
            for s in &mut series {
                s.label = seeds(s).map(|(l, _)| l).unwrap_or_default();
            }
            title = format!("{title}, mean ± sd over {} seeds", n.trim_end_matches(')'));
        }
        _ if series.iter().any(|s| seeds(s).is_some()) => title = format!("{title}, mean ± sd over n seeds"),
        _ => {}
    }
    line_chart(&LineChart { title, x_label: x.into(), y_label: y.into(), log_y, series }, style, out)
}

/// What the runs' loss is measured in, for an axis title: nats for cross-entropy, the ε-MSE of a
/// diffusion model, ½‖f(X) − Y‖² of the linear-network regression; nothing when runs differ.
fn loss_unit(runs: &[PlotRun]) -> &'static str {
    use crate::data::Task;
    let unit = |t: &Task| match t {
        Task::Classification | Task::LanguageModel => " (nats)",
        Task::Diffusion(_) => " (ε-MSE)",
        Task::HalfSumSquares => " (½ squared error)",
    };
    match runs.first() {
        Some(r) if runs.iter().all(|o| unit(&o.task) == unit(&r.task)) => unit(&r.task),
        _ => "",
    }
}

/// Training loss of every run (log axis) → `loss.{png,svg}`; eval loss → `eval_loss.{png,svg}`.
pub fn losses(runs: &[PlotRun], style: &Style, out: &Path, title: Option<&str>) -> Result<Vec<PathBuf>> {
    let unit = loss_unit(runs);
    // A log axis where the loss spans decades, as `plexus report` draws it ([`super::spans_decades`]).
    let log = |series: &[Series]| super::spans_decades(series.iter().flat_map(|s| s.points.iter().map(|p| p.1)));
    let train = curves(runs, |d| Ok(d.metrics()?.iter().map(|m| (m.step as f64, m.loss)).collect()))?;
    let held_out = curves(runs, |d| Ok(d.evals()?.iter().map(|e| (e.step as f64, e.loss)).collect()))?;
    let (log_train, log_held_out) = (log(&train), log(&held_out));
    let train_label = format!("training loss{unit}");
    let mut files = chart(
        title.unwrap_or("Training loss"),
        "training step",
        &train_label,
        log_train,
        train,
        style,
        &out.join("loss"),
    )?;
    let held_out_label = format!("held-out loss{unit}");
    let eval_out = out.join("eval_loss");
    files.extend(chart("Evaluation loss", "training step", &held_out_label, log_held_out, held_out, style, &eval_out)?);
    Ok(files)
}

/// The held-out metric over training, from each run's eval.csv: perplexity for language models
/// (`eval_perplexity`, on a log axis where it spans more than a factor of 20), else accuracy in %
/// (`eval_accuracy`); nothing for runs that log neither (RL, diffusion).
pub fn eval_metric(runs: &[PlotRun], style: &Style, out: &Path) -> Result<Vec<PathBuf>> {
    let ppl = curves(runs, |d| Ok(d.evals()?.iter().filter_map(|e| Some((e.step as f64, e.perplexity?))).collect()))?;
    if ppl.iter().any(|s| !s.points.is_empty()) {
        let log = super::spans_decades(ppl.iter().flat_map(|s| s.points.iter().map(|p| p.1)));
        let file = out.join("eval_perplexity");
        return chart("Held-out perplexity", "training step", "held-out perplexity", log, ppl, style, &file);
    }
    let accuracy =
        curves(runs, |d| Ok(d.evals()?.iter().filter_map(|e| Some((e.step as f64, 100.0 * e.accuracy?))).collect()))?;
    let file = out.join("eval_accuracy");
    chart("Held-out accuracy", "training step", "held-out accuracy (%)", false, accuracy, style, &file)
}

/// Diffusion runs: the validation ε-MSE per bucket of timesteps at the last evaluation, against
/// the bucket's mid `t` (log axis) → `eps_by_t.{png,svg}`; nothing for other runs.
pub fn eps_by_t(runs: &[PlotRun], style: &Style, out: &Path) -> Result<Vec<PathBuf>> {
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
        "ε-MSE",
        true,
        series,
        style,
        &out.join("eps_by_t"),
    )
}

/// Γ over training (H-ACN Fig. 5) and Δ_t (Fig. 6a) for runs that have residual weights.
pub fn gamma_delta(runs: &[PlotRun], style: &Style, out: &Path) -> Result<Vec<PathBuf>> {
    // Γ is drawn for runs with trainable residual weights (those that save them), not for the
    // constant Γ of residual (1) or ACN (0).
    let gamma = curves(runs, |d| {
        let w = analysis::weight_series(&d.path)?;
        match w.is_empty() {
            true => Ok(Vec::new()),
            false => Ok(analysis::gamma_series(&d.path)?.iter().map(|&(s, v)| (s as f64, v)).collect()),
        }
    })?;
    let delta = curves(runs, |d| {
        let w = analysis::weight_series(&d.path)?;
        match w.len() > 1 {
            false => Ok(Vec::new()),
            true => {
                Ok(analysis::delta_series(&w).iter().filter(|(_, v)| *v > 0.0).map(|&(s, v)| (s as f64, v)).collect())
            }
        }
    })?;
    let mut files = chart(
        "Total connectivity strength Γ = ‖a‖₂/√L",
        "training step",
        "Γ",
        false,
        gamma,
        style,
        &out.join("gamma"),
    )?;
    files.extend(chart(
        "Convergence distance Δ_t = ‖a_T − a_t‖₂",
        "training step",
        "Δ_t",
        true,
        delta,
        style,
        &out.join("delta"),
    )?);
    Ok(files)
}

/// Layer-wise exits (H-ACN Fig. 2a, 4), depth pruning (Fig. 10) and input-noise robustness
/// (Fig. 3c), from the CSVs `plexus analyze` writes.
pub fn analysis_curves(runs: &[PlotRun], style: &Style, out: &Path) -> Result<Vec<PathBuf>> {
    let mut lm = false;
    for r in runs {
        lm |= analysis::read_layerwise(&RunDir::new(&r.dir))?.iter().any(|e| e.perplexity.is_some());
    }
    let (ylab, log_y) = if lm { ("perplexity", true) } else { ("accuracy (%)", false) };
    // The metric of a row: perplexity for language models, accuracy (in percent, as the tables
    // show it) otherwise.
    let metric =
        move |accuracy: Option<f64>, perplexity: Option<f64>| if lm { perplexity } else { accuracy.map(|a| 100.0 * a) };
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
        style,
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
        style,
        &out.join("pruning"),
    )?);
    // Noise: the mean over repeats at each level, per run (then over the seeds of a setting).
    let noise = curves(runs, |d| {
        let pts: Vec<(f64, f64)> = analysis::read_noise(d)?
            .iter()
            .filter_map(|n| Some((n.level, metric(n.accuracy, n.perplexity)?)))
            .collect();
        let mut levels: Vec<f64> = pts.iter().map(|p| p.0).collect();
        levels.dedup();
        Ok(levels
            .iter()
            .map(|l| {
                let v: Vec<f64> = pts.iter().filter(|p| p.0 == *l).map(|p| p.1).collect();
                (*l, v.iter().sum::<f64>() / v.len() as f64)
            })
            .collect())
    })?;
    files.extend(chart(
        "Robustness to input noise (mean over repeats)",
        if lm { "character noise probability p" } else { "input noise σ" },
        ylab,
        log_y,
        noise,
        style,
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
        colorbar_label: "connection strength C".into(),
        // Anchored at 0 and at least 1 (the identity shortcut), so "all ones" reads as full strength.
        range: Some(range),
    }
}

/// The C heatmap at `step` (default: the last saved) of every run, plus ANCRe's
/// `log(p_ij / max_i p_ij)` view where a run saved `p`.
pub fn connectivity(runs: &[PlotRun], step: Option<u64>, style: &Style, out: &Path) -> Result<Vec<PathBuf>> {
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
            &format!("Direct connectivity C — {} ({})", r.label, r.name),
            style,
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
                &format!("ANCRe coefficients — {} ({})", r.label, r.name),
                style,
                &out.join(format!("ancre_p_{}", r.name)),
            )?);
        }
    }
    Ok(files)
}

/// The C a config will train with, drawn before any training (`plexus plot CONFIG`): its
/// initialised model's C as a heatmap, `<out>/connectivity_<name>.{png,svg,pdf}`.
pub fn config_connectivity(config: &Path, style: &Style, out: &Path) -> Result<Vec<PathBuf>> {
    let exp = crate::experiment::Experiment::from_file(config, &[])?;
    let c = analysis::connectivity::matrix(config, &[])?;
    let name = exp.config().name.clone();
    let title = format!("Direct connectivity C — {} ({name})", super::display_name(exp.topology.kind()));
    heatmaps(&[c_panel(&c, "at initialisation".into())], &title, style, &out.join(format!("connectivity_{name}")))
}

/// C at several fractions of training, side by side with one colour scale (H-ACN Fig. 9).
pub fn connectivity_grid(runs: &[PlotRun], style: &Style, out: &Path) -> Result<Vec<PathBuf>> {
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
            &format!("C over training — {} ({})", r.label, r.name),
            style,
            &out.join(format!("connectivity_grid_{}", r.name)),
        )?);
    }
    Ok(files)
}

/// Every figure the runs have data for.
pub fn all(
    dirs: &[PathBuf],
    style: &Style,
    out: &Path,
    title: Option<&str>,
    step: Option<u64>,
) -> Result<Vec<PathBuf>> {
    if dirs.is_empty() {
        bail!("no run directory given");
    }
    let runs = open_runs(dirs)?;
    let mut files = losses(&runs, style, out, title)?;
    files.extend(eval_metric(&runs, style, out)?);
    files.extend(gamma_delta(&runs, style, out)?);
    files.extend(eps_by_t(&runs, style, out)?);
    files.extend(analysis_curves(&runs, style, out)?);
    files.extend(connectivity(&runs, step, style, out)?);
    files.extend(connectivity_grid(&runs, style, out)?);
    Ok(files)
}
