//! Opening a run for what comes after training (`plexus analyze`, `sample`, `fd`, `connectivity`):
//! one loader for all of them. It reads the run's `config.yaml`, builds its model on a device and
//! loads weights of the run through [`super::checkpoint::load_final`] (present, checksummed,
//! finite).

use super::checkpoint::load_final;
use crate::experiment::Experiment;
use crate::model::Model;
use crate::run_dir::RunDir;
use anyhow::Result;
use std::path::{Path, PathBuf};
use tch::{Device, Kind};

/// A finished run: its directory, its config resolved against the registries, and its model with
/// the chosen weights loaded.
pub struct TrainedRun {
    pub dir: RunDir,
    pub exp: Experiment,
    pub model: Model,
}

/// Which weights of a run to load: `final.safetensors` by default; diffusion runs may choose their
/// moving average (`diffusion::weights_file`).
pub type ChooseWeights<'a> = &'a dyn Fn(&RunDir) -> Result<PathBuf>;

/// The run's `final.safetensors`.
pub fn final_weights(run: &RunDir) -> Result<PathBuf> {
    Ok(run.final_checkpoint())
}

/// How to open a run: `device` (the config's if `None`), the dtype its matmuls run in
/// (`compute`: the config's precision if `None`), `--set` overrides of its config (only those that
/// leave the model's parameters as trained make sense), and which weights.
pub struct OpenOptions<'a> {
    pub device: Option<Device>,
    pub compute: Option<Kind>,
    pub overrides: &'a [crate::config::Override],
    pub weights: ChooseWeights<'a>,
}

impl Default for OpenOptions<'_> {
    fn default() -> Self {
        OpenOptions { device: None, compute: None, overrides: &[], weights: &final_weights }
    }
}

/// Opens the run at `path` as `o` says. The model is built from the config's seed, so a run whose
/// weights do not cover a buffer still starts as training did.
pub fn open(path: &Path, o: &OpenOptions) -> Result<TrainedRun> {
    let dir = RunDir::open(path)?;
    let exp = Experiment::of_run(&dir.path, &dir.config_file(), o.overrides)?;
    let cfg = exp.config();
    let device = match o.device {
        Some(d) => d,
        None => crate::device::resolve(cfg.device_request())?,
    };
    crate::device::apply_matmul_precision(cfg.tf32)?;
    let compute = o.compute.unwrap_or_else(|| cfg.precision.compute_kind());
    let mut model =
        crate::device::with_seed(cfg.seed, || Model::new(exp.model.as_ref(), exp.topology.as_ref(), device, compute));
    let weights = (o.weights)(&dir)?;
    load_final(&mut model.vs, &dir, &weights, "train")?;
    Ok(TrainedRun { dir, exp, model })
}
