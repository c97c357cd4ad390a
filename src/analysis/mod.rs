//! Analysis of trained runs (`plexus analyze`): layer-wise exits, depth pruning, robustness to
//! input noise, Γ and Δ_t over training, and the correlation of converged residual weights
//! across seeds. Every function reads a run directory and writes CSVs into it.

pub mod connectivity;
pub mod noise;

use crate::data::Task;
use crate::experiment::Experiment;
use crate::model::Model;
use crate::run_dir::{atomic_write, RunDir};
use crate::train::eval::{evaluate_with, EvalResult, EvalSet};
use anyhow::{bail, Result};
use serde::Serialize;
use std::path::{Path, PathBuf};
use tch::Device;

/// A trained run, loaded from its final checkpoint onto the device it is analysed on, with its
/// evaluation batches there.
pub struct Run {
    pub dir: RunDir,
    pub exp: Experiment,
    pub model: Model,
    pub task: Task,
    pub eval: EvalSet,
}

impl Run {
    /// Loads the run onto the device its config names (`device: auto` resolves as in training).
    pub fn load(path: &Path) -> Result<Run> {
        Self::load_on(path, None)
    }

    /// Loads the run onto `device`, or the config's device if `None`.
    pub fn load_on(path: &Path, device: Option<Device>) -> Result<Run> {
        let dir = RunDir::open(path)?;
        crate::kinds::expect_kind(&dir, &crate::kinds::TRAIN)?;
        let exp = Experiment::of_run(&dir.path, &dir.config_file(), &[])?;
        anyhow::ensure!(
            exp.model.diffusion().is_none(),
            "{}: a diffusion run (model.kind `{}`): plexus analyze measures classifiers and language models \
             (layer-wise exits, pruning, input noise); for diffusion see eps_by_t.csv, plexus sample and plexus fd",
            path.display(),
            exp.model.kind()
        );
        let open = crate::train::trained::OpenOptions { device, ..Default::default() };
        let crate::train::trained::TrainedRun { dir, exp, model } = crate::train::trained::open(path, &open)?;
        let dev = model.vs.device();
        let data = exp.load_run_data(&dir.path)?;
        let mut eval = data.eval_batches();
        if eval.is_empty() {
            eval = vec![data.train_batch(0)?];
        }
        let eval = EvalSet::new(eval, &data.input_transform(), dev);
        let task = exp.data.info().task;
        Ok(Run { dir, exp, model, task, eval })
    }

    /// The run's topology as tables and legends name it: its kind and its layout, `kind (layout)`.
    pub fn label(&self) -> String {
        format!("{} ({})", self.exp.topology.kind(), self.exp.topology.label())
    }
}

/// One early exit: the readout applied after the first `units` units.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct ExitRow {
    pub units: usize,
    pub loss: f64,
    pub accuracy: Option<f64>,
    pub perplexity: Option<f64>,
}

/// Metrics of every early exit `0..=L` on the run's evaluation batches.
pub fn layerwise(run: &Run) -> Vec<ExitRow> {
    let l = run.model.depth();
    (0..=l)
        .map(|k| {
            let r =
                evaluate_with(run.task, &run.eval, 0, |x| run.model.forward_exit(x, k)).expect("at least one batch");
            ExitRow { units: k, loss: r.loss, accuracy: r.accuracy, perplexity: r.perplexity }
        })
        .collect()
}

/// Depth pruning: the metric when the top `removed` units are dropped (= the exit after
/// `L − removed` units), one row per `removed = 0..=L`.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct PruneRow {
    pub removed: usize,
    pub loss: f64,
    pub accuracy: Option<f64>,
    pub perplexity: Option<f64>,
}

/// Depth pruning read off the layer-wise exits (one per `units = 0..=L`, in that order): dropping
/// the top `removed` units is the exit after `L − removed`, so one row per `removed = 0..=L`.
pub fn pruning(exits: &[ExitRow]) -> Vec<PruneRow> {
    let l = exits.len() - 1;
    exits
        .iter()
        .rev()
        .map(|e| PruneRow { removed: l - e.units, loss: e.loss, accuracy: e.accuracy, perplexity: e.perplexity })
        .collect()
}

/// Γ over training, from `metrics.csv`'s `gamma` column: `(step, Γ)`.
pub fn gamma_series(dir: &Path) -> Result<Vec<(u64, f64)>> {
    Ok(RunDir::new(dir).metrics()?.into_iter().filter_map(|r| r.gamma.map(|g| (r.step, g))).collect())
}

/// The residual weights `a` saved during training (the topology's
/// [`RESIDUAL_WEIGHTS`](crate::topology::RESIDUAL_WEIGHTS) view), by step.
pub fn weight_series(dir: &Path) -> Result<Vec<(u64, Vec<f64>)>> {
    let run = RunDir::new(dir);
    let name = crate::topology::RESIDUAL_WEIGHTS;
    run.param_view_steps(name)?
        .into_iter()
        .map(|step| {
            let view = run.param_view(name, step)?;
            Ok((step, view.rows().into_iter().next().map(|r| r.to_vec()).unwrap_or_default()))
        })
        .collect()
}

/// `Δ_t = ‖a_T − a_t‖₂` (H-ACN Fig. 6a): distance of the residual weights from their final value.
pub fn delta_series(weights: &[(u64, Vec<f64>)]) -> Vec<(u64, f64)> {
    let Some((_, last)) = weights.last() else { return Vec::new() };
    weights.iter().map(|(s, a)| (*s, a.iter().zip(last).map(|(x, y)| (x - y) * (x - y)).sum::<f64>().sqrt())).collect()
}

/// Pearson correlation of two equally long vectors.
pub fn pearson(x: &[f64], y: &[f64]) -> f64 {
    let n = x.len() as f64;
    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    let cov: f64 = x.iter().zip(y).map(|(a, b)| (a - mx) * (b - my)).sum();
    let vx: f64 = x.iter().map(|a| (a - mx) * (a - mx)).sum();
    let vy: f64 = y.iter().map(|b| (b - my) * (b - my)).sum();
    cov / (vx * vy).sqrt()
}

impl AnalyzeOptions {
    /// Noise levels are finite, σ ≥ 0, probabilities in [0, 1], at least one of each and one repeat.
    pub fn validate(&self) -> Result<()> {
        anyhow::ensure!(self.repeats >= 1, "--repeats {}: at least 1 repeat per noise level", self.repeats);
        anyhow::ensure!(
            !self.sigmas.is_empty() && !self.char_probs.is_empty(),
            "--sigmas and --probs need at least one level"
        );
        if let Some(s) = self.sigmas.iter().find(|s| !(s.is_finite() && **s >= 0.0)) {
            anyhow::bail!("--sigmas: `{s}` is not a noise standard deviation: each must be a finite number ≥ 0");
        }
        if let Some(p) = self.char_probs.iter().find(|p| !(0.0..=1.0).contains(*p)) {
            anyhow::bail!("--probs: `{p}` is not a probability: each must be in [0, 1]");
        }
        Ok(())
    }
}

/// What `plexus analyze` reports per run (also `analysis.json`).
#[derive(Debug, Clone, Serialize)]
pub struct AnalysisSummary {
    pub run: String,
    pub topology: String,
    pub depth: usize,
    pub final_eval: Option<EvalResult>,
    pub gamma: Option<f64>,
    /// Exit after ⌊L/2⌋ units.
    pub half_depth: ExitRow,
    pub noise: Vec<noise::NoiseSummary>,
}

/// Options of `plexus analyze`.
#[derive(Debug, Clone)]
pub struct AnalyzeOptions {
    /// Gaussian input-noise standard deviations (vector/image inputs).
    pub sigmas: Vec<f64>,
    /// Character-noise probabilities (token inputs).
    pub char_probs: Vec<f64>,
    pub repeats: usize,
    pub seed: u64,
    /// The device to analyse on; `None`: the run's own (its config's `device`).
    pub device: Option<Device>,
}

impl Default for AnalyzeOptions {
    fn default() -> Self {
        Self {
            sigmas: vec![0.0, 0.1, 0.2, 0.3, 0.5, 1.0],
            char_probs: vec![0.0, 0.02, 0.05, 0.1, 0.2],
            repeats: 3,
            seed: 0,
            device: None,
        }
    }
}

/// The event file `plexus analyze` writes into a run's `tensorboard/` (replaced by every analysis).
pub const ANALYSIS_EVENTS: &str = "events.out.tfevents.analysis.plexus";

/// Runs every analysis on one run and writes `layerwise.csv`, `pruning.csv`, `noise.csv`,
/// `gamma.csv`, `delta.csv` (when the topology has residual weights) and `analysis.json`; where the
/// run logs TensorBoard events, Δ_t and the exits' metrics there too ([`ANALYSIS_EVENTS`]).
pub fn analyze(path: &Path, opts: &AnalyzeOptions) -> Result<AnalysisSummary> {
    opts.validate()?;
    let run = Run::load_on(path, opts.device)?;
    let d = &run.dir;
    // analyze writes into the run directory: not while a training run holds it (nor a second analyze).
    let _lock = d.lock()?;
    // Its event file is replaced at the end: checked before the work (a link, a folder, a device
    // there is refused, not replaced).
    let events = d.path.join(crate::tensorboard::DIR);
    if events.is_dir() {
        crate::run_dir::check_output_file(&events.join(ANALYSIS_EVENTS), "the analysis' event file")?;
    }
    let exits = layerwise(&run);
    write_rows(&d.layerwise_file(), &exits)?;
    write_rows(&d.pruning_file(), &pruning(&exits))?;
    let noise_rows = noise::robustness(&run, opts)?;
    write_rows(&d.noise_file(), &noise_rows)?;
    let noise_summary = noise::summarise(&noise_rows);
    let gammas = gamma_series(&d.path)?;
    if !gammas.is_empty() {
        write_pairs(&d.gamma_file(), "gamma", &gammas)?;
    }
    let weights = weight_series(&d.path)?;
    if weights.len() > 1 {
        write_pairs(&d.delta_file(), "delta", &delta_series(&weights))?;
    }
    let l = run.model.depth();
    let summary = AnalysisSummary {
        run: run.exp.config().name.clone(),
        topology: run.label(),
        depth: l,
        final_eval: evaluate_with(run.task, &run.eval, 0, |x| run.model.forward(x, false)),
        gamma: run.model.topology.gamma().map(|g| crate::host::scalar(&g)),
        half_depth: exits[l / 2].clone(),
        noise: noise_summary,
    };
    atomic_write(&d.analysis_file(), serde_json::to_string_pretty(&summary)?.as_bytes())?;
    // Beside the training's events (a run that logs them): Δ_t over the training steps and the
    // early exits' metrics over the units they keep (step = units), in one file that a new
    // analysis replaces.
    if events.is_dir() {
        let deltas = if weights.len() > 1 { delta_series(&weights) } else { Vec::new() };
        crate::tensorboard::EventWriter::replace(&d.path, ANALYSIS_EVENTS, |w| {
            for (step, delta) in &deltas {
                w.scalars(*step, &[("analysis/delta_t", *delta)])?;
            }
            for e in &exits {
                let mut values = vec![("analysis/exit_loss", e.loss)];
                values.extend(e.accuracy.map(|a| ("analysis/exit_accuracy", a)));
                values.extend(e.perplexity.map(|p| ("analysis/exit_perplexity", p)));
                w.scalars(e.units as u64, &values)?;
            }
            Ok(())
        })?;
    }
    Ok(summary)
}

/// Pearson correlation of the converged residual weights `a` between every pair of runs
/// (H-ACN §4: 92 % Mixer, 95 % GPT-2 across seeds). Returns the matrix, runs in order.
pub fn correlate(runs: &[PathBuf]) -> Result<ndarray::Array2<f64>> {
    let finals: Vec<Vec<f64>> = runs
        .iter()
        .map(|r| {
            let w = weight_series(r)?;
            match w.last() {
                Some((_, a)) => Ok(a.clone()),
                None => bail!("{}: no residual weights saved (params/a_step_*.csv): not an hacn run?", r.display()),
            }
        })
        .collect::<Result<_>>()?;
    if finals.windows(2).any(|w| w[0].len() != w[1].len()) {
        bail!("the runs have different depths; correlations need the same architecture");
    }
    Ok(ndarray::Array2::from_shape_fn((finals.len(), finals.len()), |(i, j)| pearson(&finals[i], &finals[j])))
}

/// Writes `rows` as a CSV with a header from their field names, atomically.
pub(crate) fn write_rows<T: Serialize>(path: &Path, rows: &[T]) -> Result<()> {
    let mut w = csv::Writer::from_writer(Vec::new());
    for r in rows {
        w.serialize(r)?;
    }
    atomic_write(path, &w.into_inner()?)
}

fn write_pairs(path: &Path, name: &str, rows: &[(u64, f64)]) -> Result<()> {
    let mut s = format!("step,{name}\n");
    for (a, b) in rows {
        s += &format!("{a},{b}\n");
    }
    atomic_write(path, s.as_bytes())
}

/// `layerwise.csv` of a run (none before `plexus analyze`).
pub fn read_layerwise(run: &RunDir) -> Result<Vec<ExitRow>> {
    crate::run_dir::read_rows(&run.layerwise_file())
}

/// `pruning.csv` of a run (none before `plexus analyze`).
pub fn read_pruning(run: &RunDir) -> Result<Vec<PruneRow>> {
    crate::run_dir::read_rows(&run.pruning_file())
}

/// `noise.csv` of a run (none before `plexus analyze`).
pub fn read_noise(run: &RunDir) -> Result<Vec<noise::NoiseRow>> {
    crate::run_dir::read_rows(&run.noise_file())
}
