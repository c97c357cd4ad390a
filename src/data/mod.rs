//! Datasets. A `data.kind` selects a registry entry that parses its options, describes the data
//! ([`DataInfo`]) before anything is loaded, and then loads it as a [`DataSource`].
//!
//! Real datasets are read from a data root: the section's `root` option (`data.root`, in the
//! config or with `--set`), else the `PLEXUS_DATA` environment variable, else the folder that
//! `scripts/fetch-data.sh` assembles (see [`data_root`]). They are never downloaded at run time; a
//! missing file is an error that says where plexus looked and how to point it elsewhere.

pub mod cifar;
pub mod files;
pub mod idx;
pub mod imagefolder;
pub mod in_memory;
pub mod latents;
pub mod prefetch;
pub mod synthetic;
pub mod text;
pub mod tokenize;
pub mod tokens;

use crate::config::OptionError;
use std::fmt::Debug;
use std::path::{Path, PathBuf};
use tch::{Device, Tensor};

/// The environment variable that names the data root of every dataset without a `root`.
pub const DATA_ENV: &str = "PLEXUS_DATA";

/// The data root that `scripts/fetch-data.sh` assembles (and `scripts/run.sh` and
/// `scripts/test.sh` use) when `PLEXUS_DATA` is unset: `$PLEXUS_CACHE/data/root`, else
/// `~/.cache/plexus/data/root`.
pub fn default_data_root() -> PathBuf {
    let cache = std::env::var_os("PLEXUS_CACHE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").filter(|v| !v.is_empty()).map(|h| PathBuf::from(h).join(".cache/plexus")))
        .unwrap_or_else(|| PathBuf::from(".cache/plexus"));
    cache.join("data").join("root")
}

/// Where datasets are read from: `configured` (a dataset's `root`: what a config or `--set` says
/// wins), else `$PLEXUS_DATA`, else [`default_data_root`].
pub fn data_root(configured: Option<&Path>) -> PathBuf {
    if let Some(c) = configured {
        return c.to_path_buf();
    }
    match std::env::var_os(DATA_ENV) {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => default_data_root(),
    }
}

/// How to point plexus at a dataset that was not found, for the end of the error: the two ways to
/// name a data root, and what fills the default one.
pub fn how_to_point_at(dataset: &str) -> String {
    format!(
        "to read it from another folder, `export {DATA_ENV}=/path/to/folder` or `--set data.root=/path/to/folder` \
         (a folder holding `{dataset}/`); `scripts/fetch-data.sh` fills the default root {}",
        default_data_root().display()
    )
}

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

pub use crate::task::{Batch, Task};

/// How a raw batch input becomes the model input, applied on the training device after the copy:
/// image datasets ship uint8 pixels (4× fewer bytes to move than fp32) and normalise there.
#[derive(Debug, Clone, PartialEq)]
pub enum InputTransform {
    /// The input is the model input.
    Identity,
    /// uint8 pixels `[B, C, H, W]` → fp32 `(x/255 − mean) / std`, with one `(mean, std)` for all
    /// channels or one per channel.
    Pixels { mean: Vec<f64>, std: Vec<f64> },
}

impl InputTransform {
    /// The transform with its constants on `device` (made once; applying it then copies nothing).
    pub fn on(&self, device: Device) -> DeviceTransform {
        match self {
            InputTransform::Identity => DeviceTransform::Identity,
            InputTransform::Pixels { mean, std } if mean.len() == 1 => {
                DeviceTransform::Scalar { mean: mean[0], std: std[0] }
            }
            InputTransform::Pixels { mean, std } => {
                let c = mean.len() as i64;
                let t = |v: &[f64]| {
                    Tensor::from_slice(&v.iter().map(|x| *x as f32).collect::<Vec<_>>())
                        .reshape([1, c, 1, 1])
                        .to_device(device)
                };
                DeviceTransform::Channels { mean: t(mean), std: t(std) }
            }
        }
    }
}

impl InputTransform {
    /// The transform as a run's `resolved.yaml` records it: `{kind: identity}`, or `{kind: pixels,
    /// mean, std}` (model input = `(x/255 − mean) / std` in fp32, one value for all channels or one
    /// per channel; a per-channel mean and sd are rounded to fp32 before use, as [`Self::on`] does).
    pub fn to_yaml(&self) -> serde_yaml::Value {
        let mut m = serde_yaml::Mapping::new();
        match self {
            InputTransform::Identity => {
                m.insert("kind".into(), "identity".into());
            }
            InputTransform::Pixels { mean, std } => {
                m.insert("kind".into(), "pixels".into());
                m.insert("mean".into(), mean.iter().map(|v| serde_yaml::Value::from(*v)).collect());
                m.insert("std".into(), std.iter().map(|v| serde_yaml::Value::from(*v)).collect());
            }
        }
        serde_yaml::Value::Mapping(m)
    }
}

/// An [`InputTransform`] ready on a device.
pub enum DeviceTransform {
    Identity,
    Scalar { mean: f64, std: f64 },
    Channels { mean: Tensor, std: Tensor },
}

impl DeviceTransform {
    /// Raw input (on the device) → model input.
    pub fn apply(&self, x: &Tensor) -> Tensor {
        let pixels = || x.to_kind(tch::Kind::Float) / 255.0;
        match self {
            DeviceTransform::Identity => x.shallow_clone(),
            DeviceTransform::Scalar { mean, std } => (pixels() - *mean) / *std,
            DeviceTransform::Channels { mean, std } => (pixels() - mean) / std,
        }
    }
}

/// A loaded dataset. Training batches are addressed by their index over the whole run
/// (0, 1, 2, … across epochs) and must be a deterministic function of the dataset, its seed and
/// the index: that is what makes a resumed run see exactly the batches of an uninterrupted one,
/// and lets [`prefetch::Prefetcher`] prepare them on another thread.
pub trait DataSource: Send {
    /// Training batch number `index` (raw inputs: see [`DataSource::input_transform`]), on the
    /// CPU, or on the training device once [`DataSource::make_resident`] said yes. An error (an
    /// unreadable file, named) reaches the trainer when it takes the batch, and stops the run.
    fn train_batch(&self, index: u64) -> anyhow::Result<Batch>;
    /// Rows `rank·B/world .. (rank+1)·B/world` of training batch `index`: what rank `rank` of a
    /// `world`-process data-parallel run trains on (`B` a multiple of `world`). The default makes
    /// the whole batch and slices it; sources whose batches are expensive to make (decoded images)
    /// make only the slice, with the same result.
    fn train_shard(&self, index: u64, rank: usize, world: usize) -> anyhow::Result<Batch> {
        Ok(self.train_batch(index)?.shard(rank, world))
    }
    /// Batches in one epoch (1 for full-batch data).
    fn batches_per_epoch(&self) -> u64;
    /// The held-out evaluation set as fixed raw batches (empty if the dataset has none).
    fn eval_batches(&self) -> Vec<Batch>;
    /// What turns a raw input into the model input, on the device.
    fn input_transform(&self) -> InputTransform {
        InputTransform::Identity
    }
    /// The held-out set as a reader outside plexus rebuilds it from the dataset's files, for a
    /// run's `resolved.yaml`: the files, the rows (or windows) in the order they are evaluated, and
    /// the batch size. `None` (the default) where the dataset does not record it (generated data).
    fn eval_record(&self) -> Option<serde_yaml::Mapping> {
        None
    }
    /// Moves the whole dataset to `device` so that batches are gathered there and nothing crosses
    /// the bus during training; returns whether it did (in-memory datasets without host-side
    /// augmentation do; streamed or host-augmented ones do not).
    fn make_resident(&mut self, device: Device) -> bool {
        let _ = device;
        false
    }
    /// The dataset's files whose bytes the source serves, in a fixed order: a run records their
    /// content hashes when it starts and refuses to resume (or be analysed) on files that changed
    /// since ([`crate::pins`]). Empty for generated data, and for image folders (their hundreds
    /// of thousands of files are identified by the decode cache's key instead: names, sizes and
    /// modification times).
    fn files(&self) -> Vec<std::path::PathBuf> {
        Vec::new()
    }
}

/// A validated dataset configuration.
pub trait DataSpec: Debug {
    fn kind(&self) -> &'static str;
    fn info(&self) -> DataInfo;
    /// Loads (or generates) the data. Errors name the files and how to get them.
    fn load(&self) -> anyhow::Result<Box<dyn DataSource>>;
}

/// Parses and validates a section's options (everything but `kind`). A file-backed dataset reads
/// from `pinned` when it is given, whatever `PLEXUS_DATA` and the `root` option say (generated
/// data ignores it); see [`parse_at`].
pub type ParseFn = fn(&serde_yaml::Mapping, Option<&Path>) -> Result<Box<dyn DataSpec>, OptionError>;

pub struct DataEntry {
    pub name: &'static str,
    pub about: &'static str,
    pub parse: ParseFn,
}

/// Every dataset plexus knows, by `data.kind`.
pub const REGISTRY: &[DataEntry] = &[
    synthetic::WHITENED_REGRESSION,
    synthetic::SYNTHETIC_IMAGES,
    synthetic::SYNTHETIC_TOKENS,
    cifar::CIFAR10,
    idx::MNIST,
    text::TEXT,
    imagefolder::IMAGEFOLDER,
    tokens::TOKENS,
    latents::LATENTS,
];

/// Parses a `data` section's options for `kind`; the data root is resolved at load time
/// ([`data_root`]).
pub fn parse(kind: &str, options: &serde_yaml::Mapping) -> Result<Box<dyn DataSpec>, OptionError> {
    parse_with(kind, options, None)
}

/// Parses `options` like [`parse`], but the dataset reads its files from `root` whatever
/// `PLEXUS_DATA` and the `root` option say: for programs and tests that manage their own files.
pub fn parse_at(kind: &str, root: &Path, options: &serde_yaml::Mapping) -> Result<Box<dyn DataSpec>, OptionError> {
    parse_with(kind, options, Some(root))
}

fn parse_with(
    kind: &str,
    options: &serde_yaml::Mapping,
    pinned: Option<&Path>,
) -> Result<Box<dyn DataSpec>, OptionError> {
    match REGISTRY.iter().find(|e| e.name == kind) {
        Some(e) => (e.parse)(options, pinned),
        None => Err(OptionError::new(
            "kind",
            kind,
            format!("one of {}", REGISTRY.iter().map(|e| format!("`{}`", e.name)).collect::<Vec<_>>().join(", ")),
        )),
    }
}

/// The largest `batch_size` a loader accepts unless it says otherwise.
pub const MAX_BATCH: usize = 1 << 20;

/// The option checks every loader shares: each `(key, value, lo, hi)` must lie in `lo..=hi`; the
/// first that does not is the error ("an integer in lo..=hi").
pub(crate) fn check_ranges(checks: &[(&str, usize, usize, usize)]) -> Result<(), OptionError> {
    for &(key, v, lo, hi) in checks {
        if !(lo..=hi).contains(&v) {
            return Err(OptionError::new(key, v, format!("an integer in {lo}..={hi}")));
        }
    }
    Ok(())
}

/// Sample caps (`train_samples`, `eval_samples`): absent means all of them, 0 is an error.
pub(crate) fn check_caps(caps: &[(&str, Option<usize>)]) -> Result<(), OptionError> {
    for &(key, cap) in caps {
        if cap == Some(0) {
            return Err(OptionError::new(key, 0, "a positive number of samples (leave it out to use all)"));
        }
    }
    Ok(())
}
