//! The publication figures, built from run directories (what `plexus plot` draws):
//! training/eval loss, the connectivity heatmap and its evolution grid, ANCRe's
//! `log(p_ij / max_i p_ij)`, Γ and Δ_t over training, layer-wise exits, noise and pruning curves.
//! Colours are fixed per topology ([`super::topology_color`]) so figures can be compared.

use super::panels::{ancre_panel, c_panel, stream_panels, way_panels};
use super::{topology_color, Chart, Dash, Figure, Heatmap, Kind, LineChart, Series};
use crate::analysis;
use crate::experiment::Experiment;
use crate::run_dir::RunDir;
use anyhow::{bail, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The figures of one producer.
type Figures = Result<Vec<Figure>>;

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
    pub seed: u64,
    /// The entries of C its wiring never carries (a sparse `graph`'s).
    pub absent: Vec<(usize, usize)>,
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
        facts.push((setting, kind.clone(), exp.topology.label(), exp.config().name.clone(), exp.topology.display()));
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
            seed: exp.config().seed,
            absent: exp.topology.absent_edges(),
        });
    }
    // One (kind, layout, config name, display name) per setting, in the order the settings first
    // appear.
    let per_setting: Vec<&(usize, String, String, String, String)> =
        (0..settings.len()).map(|s| facts.iter().find(|f| f.0 == s).expect("every setting has a run")).collect();
    let labels: Vec<String> = per_setting
        .iter()
        .map(|(_, kind, layout, name, display)| {
            let same_kind: Vec<_> = per_setting.iter().filter(|f| f.1 == *kind).collect();
            // The spec's display name: the registry's ("H-ACN"), a composition's parts ("AttnRes × mHC").
            let mut label = display.clone();
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
        .map(|(_, kind, _, _, _)| {
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

/// Accuracy curves in percent with their bands held to 0–100 (a mean + sd past 100 % is not an
/// accuracy any seed had).
fn held_to_percent(mut series: Vec<Series>) -> Vec<Series> {
    for s in &mut series {
        for b in s.band.iter_mut().flatten() {
            *b = (b.0.max(0.0), b.1.min(100.0));
        }
    }
    series
}

/// A line chart of `series` (none where no series has a point), its title saying what the bands
/// are; on a log axis where `log_y` asks and the values span decades ([`super::spans_decades`]).
fn chart(kind: Kind, title: &str, (x, y): (&str, &str), log_y: bool, mut series: Vec<Series>) -> Vec<Figure> {
    if series.iter().all(|s| s.points.is_empty()) {
        return Vec::new();
    }
    let log_y = log_y && super::spans_decades(series.iter().flat_map(|s| s.points.iter().map(|p| p.1)));
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
    let chart = Chart::Lines(LineChart { title, x_label: x.into(), y_label: y.into(), log_y, series });
    vec![Figure { file: kind.name().into(), kind, chart }]
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

/// Training loss of every run → `loss`; held-out loss → `eval_loss`. Each on a log axis where it
/// spans decades, as `plexus report` draws it ([`super::spans_decades`]).
pub fn losses(runs: &[PlotRun], title: Option<&str>) -> Figures {
    let unit = loss_unit(runs);
    let log = |series: &[Series]| super::spans_decades(series.iter().flat_map(|s| s.points.iter().map(|p| p.1)));
    let train = curves(runs, |d| Ok(d.metrics()?.iter().map(|m| (m.step as f64, m.loss)).collect()))?;
    let held_out = curves(runs, |d| Ok(d.evals()?.iter().map(|e| (e.step as f64, e.loss)).collect()))?;
    let (log_train, log_held_out) = (log(&train), log(&held_out));
    let train_label = format!("training loss{unit}");
    let mut figures =
        chart(Kind::Loss, title.unwrap_or("Training loss"), ("training step", &train_label), log_train, train);
    let held_out_label = format!("held-out loss{unit}");
    let axes = ("training step", held_out_label.as_str());
    figures.extend(chart(Kind::EvalLoss, "Held-out loss", axes, log_held_out, held_out));
    Ok(figures)
}

/// The held-out metric over training, from each run's eval.csv: perplexity for language models
/// (`eval_perplexity`, on a log axis where it spans more than a factor of 20), else accuracy in %
/// (`eval_accuracy`); nothing for runs that log neither (RL, diffusion).
pub fn eval_metric(runs: &[PlotRun]) -> Figures {
    let ppl = curves(runs, |d| Ok(d.evals()?.iter().filter_map(|e| Some((e.step as f64, e.perplexity?))).collect()))?;
    if ppl.iter().any(|s| !s.points.is_empty()) {
        let log = super::spans_decades(ppl.iter().flat_map(|s| s.points.iter().map(|p| p.1)));
        let axes = ("training step", "held-out perplexity");
        return Ok(chart(Kind::EvalPerplexity, "Held-out perplexity", axes, log, ppl));
    }
    let accuracy =
        curves(runs, |d| Ok(d.evals()?.iter().filter_map(|e| Some((e.step as f64, 100.0 * e.accuracy?))).collect()))?;
    let accuracy = held_to_percent(accuracy);
    Ok(chart(Kind::EvalAccuracy, "Held-out accuracy", ("training step", "held-out accuracy (%)"), false, accuracy))
}

/// Diffusion runs: the validation ε-MSE per bucket of timesteps at the last evaluation, against
/// the bucket's mid `t` (log axis) → `eps_by_t`; nothing for other runs.
pub fn eps_by_t(runs: &[PlotRun]) -> Figures {
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
    let title = "Validation ε-MSE by timestep (last evaluation)";
    Ok(chart(Kind::EpsByT, title, ("diffusion timestep t (bucket mid)", "ε-MSE"), true, series))
}

/// Γ over training (H-ACN Fig. 5) and Δₜ (Fig. 6a) for runs that have residual weights.
pub fn gamma_delta(runs: &[PlotRun]) -> Figures {
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
    let mut figures =
        chart(Kind::Gamma, "Total connectivity strength Γ = ‖a‖₂/√L", ("training step", "Γ"), false, gamma);
    let title = "Convergence distance Δₜ = ‖a(T) − a(t)‖₂";
    figures.extend(chart(Kind::Delta, title, ("training step", "Δₜ"), true, delta));
    Ok(figures)
}

/// A row's metric: perplexity for language models, else accuracy in percent (as the tables show it).
fn metric_of(lm: bool, accuracy: Option<f64>, perplexity: Option<f64>) -> Option<f64> {
    if lm {
        perplexity
    } else {
        accuracy.map(|a| 100.0 * a)
    }
}

/// Layer-wise exits (H-ACN Fig. 2a, 4) against the fraction of the depth used — comparable
/// between a residual net of 8 sublayer units and an H-ACN of 4 layers — and depth pruning (Fig.
/// 10), from the CSVs `plexus analyze` writes.
fn exits(runs: &[PlotRun], lm: bool, (ylab, log_y): (&str, bool)) -> Figures {
    let layerwise = curves(runs, |d| {
        let rows = analysis::read_layerwise(d)?;
        let depth = rows.iter().map(|e| e.units).max().unwrap_or(0).max(1) as f64;
        Ok(rows
            .iter()
            .filter_map(|e| Some((e.units as f64 / depth, metric_of(lm, e.accuracy, e.perplexity)?)))
            .collect())
    })?;
    let layerwise = if lm { layerwise } else { held_to_percent(layerwise) };
    let title = "Layer-wise exits: final norm and shared head after unit i of L";
    let mut figures = chart(Kind::Layerwise, title, ("fraction of the depth used (i / L)", ylab), log_y, layerwise);
    let pruning = curves(runs, |d| {
        Ok(analysis::read_pruning(d)?
            .iter()
            .filter_map(|e| Some((e.removed as f64, metric_of(lm, e.accuracy, e.perplexity)?)))
            .collect())
    })?;
    let pruning = if lm { pruning } else { held_to_percent(pruning) };
    figures.extend(chart(Kind::Pruning, "Depth pruning: top units removed", ("units removed", ylab), log_y, pruning));
    Ok(figures)
}

/// Layer-wise exits, depth pruning ([`exits`]) and input-noise robustness (Fig. 3c), from the
/// CSVs `plexus analyze` writes.
pub fn analysis_curves(runs: &[PlotRun]) -> Figures {
    let mut lm = false;
    for r in runs {
        lm |= analysis::read_layerwise(&RunDir::new(&r.dir))?.iter().any(|e| e.perplexity.is_some());
    }
    // Perplexity on a log axis where it spans decades (the rule of every loss-like figure).
    let (ylab, log_y) = if lm { ("perplexity", true) } else { ("accuracy (%)", false) };
    let mut figures = exits(runs, lm, (ylab, log_y))?;
    // Noise: the mean over repeats at each level, per run (then over the seeds of a setting).
    let noise = curves(runs, |d| {
        let pts: Vec<(f64, f64)> = analysis::read_noise(d)?
            .iter()
            .filter_map(|n| Some((n.level, metric_of(lm, n.accuracy, n.perplexity)?)))
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
    let noise = if lm { noise } else { held_to_percent(noise) };
    let x = if lm { "character noise probability p" } else { "input noise σ" };
    figures.extend(chart(Kind::Noise, "Robustness to input noise (mean over repeats)", (x, ylab), log_y, noise));
    Ok(figures)
}

/// A run as a per-run figure's title names it: its label, and its seed where runs share a label.
fn run_title(r: &PlotRun, runs: &[PlotRun]) -> String {
    match runs.iter().filter(|o| o.label == r.label).count() {
        1 => r.label.clone(),
        _ => format!("{}, seed {}", r.label, r.seed),
    }
}
/// The C heatmap at `step` (default: the last saved) of every run; for a run with a width rule
/// (`compose`, `hyper`, `mhc`) C beside its stream mixing per unit; and ANCRe's
/// `log(p_ij / max_i p_ij)` view where a run saved `p`.
pub fn connectivity(runs: &[PlotRun], step: Option<u64>) -> Figures {
    let mut figures = Vec::new();
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
        let who = run_title(r, runs);
        let title = format!("Direct connectivity C — {who}");
        let chart = Chart::Heatmaps { title, panels: vec![c_panel(&c, format!("step {s}"), &r.absent)] };
        figures.push(Figure { file: format!("connectivity_{}", r.name), kind: Kind::Connectivity, chart });
        if let Some(view) = crate::topology::STREAM_MIXING_VIEWS.iter().find(|v| run.param_view_file(v, s).exists()) {
            let m = crate::run_dir::read_matrix(&run.param_view_file(view, s))?;
            let title = format!("Depth and width — {who}, step {s}");
            let mut panels = vec![Heatmap {
                title: "C over depth".into(),
                colorbar_label: "weight (C; stream s in t)".into(),
                ..c_panel(&c, String::new(), &r.absent)
            }];
            panels.extend(stream_panels(&m, &run.param_view_file(view, s))?);
            let chart = Chart::Heatmaps { title, panels };
            figures.push(Figure { file: format!("depth_width_{}", r.name), kind: Kind::DepthWidth, chart });
        }
        let view = crate::topology::mudd::WAYS_VIEW;
        if run.param_view_file(view, s).exists() {
            let m = crate::run_dir::read_matrix(&run.param_view_file(view, s))?;
            let title = format!("Direct connectivity C per way — {who}, step {s}");
            let chart = Chart::Heatmaps { title, panels: way_panels(&m, &run.param_view_file(view, s))? };
            figures.push(Figure { file: format!("mudd_ways_{}", r.name), kind: Kind::Ways, chart });
        }
        let view = crate::topology::SHORTCUT_WEIGHTS;
        if run.param_view_file(view, s).exists() {
            let p = crate::run_dir::read_square_matrix(&run.param_view_file(view, s))?;
            let title = format!("ANCRe coefficients — {who}");
            let chart = Chart::Heatmaps { title, panels: vec![ancre_panel(&p, s)] };
            figures.push(Figure { file: format!("ancre_p_{}", r.name), kind: Kind::AncreCoefficients, chart });
        }
    }
    Ok(figures)
}

/// The C a config will train with, drawn before any training (`plexus plot CONFIG`): its
/// initialised model's C as a heatmap, `connectivity_<name>`.
pub fn config_connectivity(config: &Path) -> Figures {
    let exp = crate::experiment::Experiment::from_file(config, &[])?;
    let c = analysis::connectivity::matrix(config, &[])?;
    let name = exp.config().name.clone();
    let title = format!("Direct connectivity C — {} at initialisation", exp.topology.display());
    let chart =
        Chart::Heatmaps { title, panels: vec![c_panel(&c, "at initialisation".into(), &exp.topology.absent_edges())] };
    Ok(vec![Figure { file: format!("connectivity_{name}"), kind: Kind::Connectivity, chart }])
}

/// The saved steps nearest to 0, ¼, ½, ¾ and all of training, each once.
fn snapshots(steps: &[u64]) -> Vec<u64> {
    let last = *steps.last().unwrap_or(&0) as f64;
    let mut picked: Vec<u64> = Vec::new();
    for f in [0.0, 0.25, 0.5, 0.75, 1.0] {
        let want = f * last;
        let near = steps.iter().min_by(|a, b| (**a as f64 - want).abs().total_cmp(&(**b as f64 - want).abs()));
        if let Some(&best) = near.filter(|b| !picked.contains(b)) {
            picked.push(best);
        }
    }
    picked
}

/// C at several fractions of training, side by side with one colour scale (H-ACN Fig. 9); one
/// panel, titled so, where C does not move over training (residual's all-ones matrix).
pub fn connectivity_grid(runs: &[PlotRun]) -> Figures {
    let mut figures = Vec::new();
    for r in runs {
        let run = RunDir::new(&r.dir);
        let steps = run.connectivity_steps()?;
        if steps.len() < 2 {
            continue;
        }
        let last = *steps.last().unwrap_or(&1) as f64;
        let picked = snapshots(&steps);
        let cs: Vec<_> = picked.iter().map(|s| run.connectivity(*s)).collect::<Result<_>>()?;
        let unchanged =
            cs.windows(2).all(|w| w[0].iter().zip(w[1].iter()).all(|(a, b)| a == b || (a.is_nan() && b.is_nan())));
        let panels: Vec<Heatmap> = match unchanged {
            true => {
                vec![c_panel(&cs[0], format!("steps {}–{}: unchanged", picked[0], picked[picked.len() - 1]), &r.absent)]
            }
            false => picked
                .iter()
                .zip(&cs)
                .map(|(s, c)| c_panel(c, format!("step {s} ({:.0}%)", 100.0 * *s as f64 / last), &r.absent))
                .collect(),
        };
        let chart = Chart::Heatmaps { title: format!("C over training — {}", run_title(r, runs)), panels };
        figures.push(Figure { file: format!("connectivity_grid_{}", r.name), kind: Kind::ConnectivityGrid, chart });
    }
    Ok(figures)
}

/// Every figure the runs have data for (`plexus plot RUN…`).
pub fn all(dirs: &[PathBuf], title: Option<&str>, step: Option<u64>) -> Figures {
    if dirs.is_empty() {
        bail!("no run directory given");
    }
    let runs = open_runs(dirs)?;
    let mut figures = losses(&runs, title)?;
    figures.extend(eval_metric(&runs)?);
    figures.extend(gamma_delta(&runs)?);
    figures.extend(eps_by_t(&runs)?);
    figures.extend(analysis_curves(&runs)?);
    figures.extend(connectivity(&runs, step)?);
    figures.extend(connectivity_grid(&runs)?);
    Ok(figures)
}
