//! A config resolved against the registries: every kind section parsed and validated, in the
//! order data → model → topology (each needs what the previous one describes). Nothing is
//! loaded, built or written here, so a bad config fails before any work.

use crate::config::{self, ConfigError, LoadedConfig, OptionError, Override};
use crate::data::{self, DataSpec};
use crate::model::{self, ModelSpec};
use crate::topology::{self, TopologySpec};
use std::path::Path;

#[derive(Debug)]
pub struct Experiment {
    pub loaded: LoadedConfig,
    pub data: Box<dyn DataSpec>,
    pub model: Box<dyn ModelSpec>,
    pub topology: Box<dyn TopologySpec>,
}

impl Experiment {
    /// Resolves a loaded config against the registries: its data, model and topology sections parsed
    /// by their kinds (the model seeing the data's shape, the topology the model's stack), and a
    /// `diffusion` section only with a diffusion backbone and a label dropout in [0, 1). The errors
    /// name the file, key and line.
    pub fn resolve(loaded: LoadedConfig) -> Result<Self, ConfigError> {
        let c = &loaded.config;
        let data = data::parse(&c.data.kind, &c.data.options).map_err(|e| loaded.error("data", e))?;
        let model =
            model::parse(&c.model.kind, &c.model.options, &data.info()).map_err(|e| loaded.error("model", e))?;
        let topology = topology::parse(&c.topology.kind, &c.topology.options, model.stack())
            .map_err(|e| loaded.error("topology", e))?;
        if let Some(d) = &c.diffusion {
            if model.diffusion().is_none() {
                return Err(loaded.error(
                    "diffusion",
                    OptionError::new(
                        "label_dropout",
                        d.label_dropout,
                        "no `diffusion` section: model.kind is not a diffusion backbone (dit)",
                    ),
                ));
            }
            if !(0.0..1.0).contains(&d.label_dropout) {
                return Err(loaded.error(
                    "diffusion",
                    OptionError::new("label_dropout", d.label_dropout, "a probability in [0, 1)"),
                ));
            }
        }
        Ok(Self { loaded, data, model, topology })
    }

    /// Loads the config file at `path`, applies the `--set` `overrides`, and [`resolve`](Self::resolve)s it.
    pub fn from_file(path: &Path, overrides: &[Override]) -> Result<Self, ConfigError> {
        Self::resolve(config::load_file(path, overrides)?)
    }

    /// From YAML text; `origin` names it in messages (e.g. `<embedded:lnn/fig2b/k3-0to2.yaml>`).
    pub fn from_str(source: &str, origin: &str, overrides: &[Override]) -> Result<Self, ConfigError> {
        Self::resolve(config::load_str(source, Path::new(origin), overrides)?)
    }

    /// The training objective: the dataset's, or DDPM for a diffusion backbone.
    pub fn task(&self) -> data::Task {
        match self.model.diffusion() {
            Some((channels, classes, learn_sigma)) => data::Task::Diffusion(crate::task::ddpm::Diffusion {
                channels: channels as i64,
                num_classes: classes as i64,
                learn_sigma,
                label_dropout: self.config().diffusion.clone().unwrap_or_default().label_dropout,
            }),
            None => self.data.info().task,
        }
    }

    /// The model input C is measured on (the trainer's connectivity probe, and `plexus
    /// connectivity`'s): a raw `batch` (`[B, …]`, on `device`) through the data's input
    /// transform, then for a diffusion model noised and packed as training does, from the seed.
    pub fn probe_input(
        &self,
        batch: &data::Batch,
        transform: &data::InputTransform,
        device: tch::Device,
    ) -> tch::Tensor {
        let input = transform.on(device).apply(&batch.input.to_device(device));
        let batch = data::Batch { input, target: batch.target.to_device(device) };
        crate::device::with_seed(self.config().seed, || self.task().prepare(batch).input)
    }

    /// The config as loaded (with the overrides applied and the defaults filled in).
    pub fn config(&self) -> &config::Config {
        &self.loaded.config
    }
}
