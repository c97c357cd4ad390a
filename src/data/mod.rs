//! Datasets. A `data.kind` selects a registry entry that parses its options, describes the data
//! ([`DataInfo`]) before anything is loaded, and then loads it as a [`DataSource`].

pub mod synthetic;

use crate::config::OptionError;
use std::fmt::Debug;
use tch::{Device, Tensor};

/// What the model and the trainer need to know about a dataset before it is loaded.
#[derive(Debug, Clone, PartialEq)]
pub struct DataInfo {
    /// Shape of one input sample: `[d]` for vectors, `[C, H, W]` for images.
    pub input_shape: Vec<usize>,
    /// Target dimension (regression) or number of classes (classification).
    pub output_dim: usize,
    pub task: Task,
}

impl DataInfo {
    /// Number of scalars in one input sample.
    pub fn input_dim(&self) -> usize {
        self.input_shape.iter().product()
    }
}

/// The objective, fixed by the dataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    /// Regression with `½‖f(X) − Y‖²_F` summed over the batch (the LNN case study's loss).
    HalfSumSquares,
    /// Classification with the mean cross-entropy of logits `[n, classes]` against labels `[n]`.
    Classification,
}

impl Task {
    /// `output`, `target`: `[n, d]`. Returns a scalar, computed in fp32.
    pub fn loss(&self, output: &Tensor, target: &Tensor) -> Tensor {
        match self {
            Task::HalfSumSquares => {
                let diff = output.to_kind(tch::Kind::Float) - target.to_kind(tch::Kind::Float);
                diff.square().sum(tch::Kind::Float) * 0.5
            }
            Task::Classification => output.to_kind(tch::Kind::Float).cross_entropy_for_logits(target),
        }
    }
}

/// One batch: `input` for the model, `target` for the loss.
pub struct Batch {
    pub input: Tensor,
    pub target: Tensor,
}

/// A loaded dataset.
pub trait DataSource {
    /// The next training batch (the whole set for full-batch data).
    fn next_train(&mut self) -> Batch;
}

/// A validated dataset configuration.
pub trait DataSpec: Debug {
    fn kind(&self) -> &'static str;
    fn info(&self) -> DataInfo;
    fn load(&self, device: Device) -> anyhow::Result<Box<dyn DataSource>>;
}

/// Parses and validates a section's options (everything but `kind`).
pub type ParseFn = fn(&serde_yaml::Mapping) -> Result<Box<dyn DataSpec>, OptionError>;

pub struct DataEntry {
    pub name: &'static str,
    pub about: &'static str,
    pub parse: ParseFn,
}

/// Every dataset plexus knows, by `data.kind`.
pub const REGISTRY: &[DataEntry] = &[synthetic::WHITENED_REGRESSION, synthetic::SYNTHETIC_IMAGES];

pub fn parse(kind: &str, options: &serde_yaml::Mapping) -> Result<Box<dyn DataSpec>, OptionError> {
    match REGISTRY.iter().find(|e| e.name == kind) {
        Some(e) => (e.parse)(options),
        None => Err(OptionError::new(
            "kind",
            kind,
            format!("one of {}", REGISTRY.iter().map(|e| format!("`{}`", e.name)).collect::<Vec<_>>().join(", ")),
        )),
    }
}
