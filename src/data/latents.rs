//! `latents`: pre-encoded image latents with class labels (e.g. ImageNet through the Stable
//! Diffusion VAE, as latent-space DiT trains on), for `model.kind: dit`.
//!
//! Layout: `<root>/<dataset>/{train,val}_latents.f32` and `<root>/<dataset>/{train,val}_labels.i64`.
//! A latents file is raw little-endian fp32, `N × channels × size × size` values in that
//! (row-major) order, no header; a labels file is raw little-endian int64, `N` values in
//! `0..classes`. `N` is read from the file lengths, which must agree; `channels`, `size` and
//! `classes` come from the options (defaults 4, 32, 1000: ImageNet 256² through the SD VAE).
//! Write them from NumPy with `lat.astype('<f4').tofile(...)` and `y.astype('<i8').tofile(...)`.
//! Latents are used as stored (scale them — e.g. by the VAE's 0.18215 — before writing, or set
//! `scale`). Errors name the file looked for and its expected length.
//!
//! Options: `root`, `dataset` (folder under the root, default `latents`), `channels`, `size`,
//! `classes`, `scale` (default 1), `batch_size` (default 256), `train_samples` / `eval_samples`
//! (caps: the first N of a permutation drawn from `seed`), `seed`.
//!
//! Batches: inputs `[B, channels, size, size]` fp32, labels `[B]` int64 ([`InMemory`]).

use super::files::{capped_indices, Root};
use super::in_memory::InMemory;
use super::{check_caps, check_ranges, DataEntry, DataInfo, DataSource, DataSpec, InputTransform, Task, MAX_BATCH};
use crate::config::{parse_options, OptionError};
use anyhow::{bail, Context};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use tch::{Kind, Tensor};

pub const LATENTS: DataEntry = DataEntry {
    name: "latents",
    about: "pre-encoded image latents (raw f32 N×C×S×S + int64 labels), for latent-space DiT",
    parse,
};

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Options {
    root: Option<PathBuf>,
    dataset: String,
    channels: usize,
    size: usize,
    classes: usize,
    scale: f64,
    batch_size: usize,
    train_samples: Option<usize>,
    eval_samples: Option<usize>,
    seed: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            root: None,
            dataset: "latents".into(),
            channels: 4,
            size: 32,
            classes: 1000,
            scale: 1.0,
            batch_size: 256,
            train_samples: None,
            eval_samples: None,
            seed: 0,
        }
    }
}

#[derive(Debug)]
struct Spec {
    root: Root,
    o: Options,
}

fn parse(opts: &serde_yaml::Mapping, pinned: Option<&Path>) -> Result<Box<dyn DataSpec>, OptionError> {
    let o: Options = parse_options(opts)?;
    super::files::folder_option("dataset", &o.dataset, "latents")?;
    check_ranges(&[
        ("channels", o.channels, 1, 4096),
        ("size", o.size, 1, 4096),
        ("classes", o.classes, 1, 1 << 24),
        ("batch_size", o.batch_size, 1, MAX_BATCH),
    ])?;
    check_caps(&[("train_samples", o.train_samples), ("eval_samples", o.eval_samples)])?;
    if !(o.scale.is_finite() && o.scale > 0.0) {
        return Err(OptionError::new("scale", o.scale, "a finite number > 0"));
    }
    Ok(Box::new(Spec { root: Root::new(pinned, o.root.clone()), o }))
}

/// Reads a raw little-endian file of `elem`-byte values, checking its length is a multiple of
/// `per_sample · elem` bytes; returns the bytes and `N`.
fn read_raw(path: &Path, per_sample: usize, elem: usize, what: &str) -> anyhow::Result<(Vec<u8>, usize)> {
    let bytes = std::fs::read(path).with_context(|| {
        format!(
            "{what}: cannot read {} (see src/data/latents.rs for the format: raw little-endian, no header)",
            path.display()
        )
    })?;
    let unit = per_sample * elem;
    if bytes.is_empty() || !bytes.len().is_multiple_of(unit) {
        bail!(
            "{}: {} bytes is not a positive multiple of {unit} ({what}: {per_sample} values of {elem} bytes per sample)",
            path.display(),
            bytes.len()
        );
    }
    let n = bytes.len() / unit;
    Ok((bytes, n))
}

impl Spec {
    fn split(&self, dir: &Path, split: &str, cap: Option<usize>, tag: u64) -> anyhow::Result<(Tensor, Tensor)> {
        let (c, s) = (self.o.channels, self.o.size);
        let lat_path = dir.join(format!("{split}_latents.f32"));
        let lab_path = dir.join(format!("{split}_labels.i64"));
        let (lat, n) = read_raw(&lat_path, c * s * s, 4, &format!("latents of {c}×{s}×{s} fp32"))?;
        let (lab, m) = read_raw(&lab_path, 1, 8, "labels, int64")?;
        if n != m {
            bail!("{} holds {n} latents but {} holds {m} labels", lat_path.display(), lab_path.display());
        }
        let x: Vec<f32> = lat.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        let y: Vec<i64> = lab.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes"))).collect();
        if let Some((i, bad)) = y.iter().enumerate().find(|(_, v)| !(0..self.o.classes as i64).contains(v)) {
            bail!("{}: label {bad} of sample {i} is outside 0..{} (data.classes)", lab_path.display(), self.o.classes);
        }
        if let Some(i) = x.iter().position(|v| !v.is_finite()) {
            bail!("{}: value {i} is not finite", lat_path.display());
        }
        let x = Tensor::from_slice(&x).reshape([n as i64, c as i64, s as i64, s as i64]) * self.o.scale;
        let y = Tensor::from_slice(&y);
        let chosen: Vec<i64> = capped_indices(n, cap, self.o.seed, tag).into_iter().map(|i| i as i64).collect();
        if chosen.len() == n {
            return Ok((x, y));
        }
        let sel = Tensor::from_slice(&chosen);
        Ok((x.index_select(0, &sel), y.index_select(0, &sel)))
    }
}

impl DataSpec for Spec {
    fn kind(&self) -> &'static str {
        "latents"
    }
    fn info(&self) -> DataInfo {
        DataInfo {
            input_shape: vec![self.o.channels, self.o.size, self.o.size],
            output_dim: self.o.classes,
            task: Task::Classification,
        }
    }
    fn load(&self) -> anyhow::Result<Box<dyn DataSource>> {
        let dir = self.root.resolve().join(&self.o.dataset);
        if !dir.is_dir() {
            bail!(
                "latents: no folder {} (expected {{train,val}}_latents.f32 and {{train,val}}_labels.i64 there; set \
                 data.root or {} to the folder holding `{}`)",
                dir.display(),
                super::DATA_ENV,
                self.o.dataset
            );
        }
        let (x, y) = self.split(&dir, "train", self.o.train_samples, 1)?;
        let eval = self.split(&dir, "val", self.o.eval_samples, 2)?;
        let n = y.size()[0] as usize;
        Ok(Box::new(InMemory {
            x: x.to_kind(Kind::Float),
            y,
            eval,
            batch: self.o.batch_size.min(n),
            seed: self.o.seed,
            transform: InputTransform::Identity,
            eval_rows: None,
            files: ["train_latents.f32", "train_labels.i64", "val_latents.f32", "val_labels.i64"]
                .iter()
                .map(|f| dir.join(f))
                .filter(|p| p.is_file())
                .collect(),
        }))
    }
}
