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
    /// The files outside the run the parse read ([`crate::pins`]): what a new run pins. Empty for
    /// a run's own config, whose inputs come from its record (`pinned`).
    pub inputs: Vec<crate::pins::Taken>,
    /// The run's record of its inputs, when this is a run's config parsed against it ([`Experiment::of_run`]).
    pub pinned: Option<crate::pins::Manifest>,
}

impl Experiment {
    /// Resolves a loaded config against the registries: its data, model and topology sections parsed
    /// by their kinds (the model seeing the data's shape, the topology the model's stack), and a
    /// `diffusion` section only with a diffusion backbone and a label dropout in [0, 1). The errors
    /// name the file, key and line. The files outside a run that the config names (a C, a
    /// `meta.json`) are read as named, and kept in `inputs` for a new run to pin.
    pub fn resolve(loaded: LoadedConfig) -> Result<Self, ConfigError> {
        let (exp, taken) = crate::pins::scope(crate::pins::Scope::Take, || Self::parse(loaded));
        Ok(Self { inputs: taken, ..exp? })
    }

    /// The config of the run in `dir` (its `config.yaml`, or `config` for a resumed run given
    /// another file) with `overrides`, parsed against what the run pinned when it started: a C or
    /// `meta.json` the config names is read from the run's copy, never from where the config
    /// points (which may have changed since). A run made before inputs were pinned reads them as
    /// named.
    pub fn of_run(dir: &Path, config: &Path, overrides: &[Override]) -> anyhow::Result<Self> {
        let loaded = config::load_file(config, overrides)?;
        let scope = crate::pins::of_run(dir)?;
        let pinned = match &scope {
            crate::pins::Scope::Run { manifest, .. } => Some(manifest.clone()),
            crate::pins::Scope::Take => None,
        };
        let (exp, _) = crate::pins::scope(scope, || Self::parse(loaded));
        Ok(Self { pinned, ..exp? })
    }

    fn parse(loaded: LoadedConfig) -> Result<Self, ConfigError> {
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
        Ok(Self { loaded, data, model, topology, inputs: Vec::new(), pinned: None })
    }

    /// Loads the config file at `path`, applies the `--set` `overrides`, and [`resolve`](Self::resolve)s it.
    pub fn from_file(path: &Path, overrides: &[Override]) -> Result<Self, ConfigError> {
        Self::resolve(config::load_file(path, overrides)?)
    }

    /// From YAML text; `origin` names it in messages (e.g. `<embedded:lnn/fig2b/k3-0to2.yaml>`).
    pub fn from_str(source: &str, origin: &str, overrides: &[Override]) -> Result<Self, ConfigError> {
        Self::resolve(config::load_str(source, Path::new(origin), overrides)?)
    }

    /// Checks `data` (this experiment's, loaded) against the files the run in `dir` recorded when
    /// it started, for a run's config parsed against its record ([`Experiment::of_run`]): a reader
    /// of the run never measures on a dataset that changed since ([`crate::pins::verify_files`]).
    pub fn check_data(&self, dir: &Path, data: &dyn data::DataSource) -> anyhow::Result<()> {
        crate::pins::verify_files(dir, self.pinned.as_ref(), &crate::pins::data_file_keys(&data.files()))
    }

    /// The data of the run in `dir` (this experiment its config, [`Experiment::of_run`]), loaded and
    /// checked against the files the run recorded ([`Experiment::check_data`]).
    pub fn load_run_data(&self, dir: &Path) -> anyhow::Result<Box<dyn data::DataSource>> {
        let data = self.data.load()?;
        self.check_data(dir, data.as_ref())?;
        Ok(data)
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
