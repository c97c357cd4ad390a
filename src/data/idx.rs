//! `mnist`: any MNIST-family dataset in the IDX format (MNIST, Fashion-MNIST, KMNIST, …): 28×28
//! grey images in 10 classes, read from `<root>/<dataset>/` where the four files
//! `train-images-idx3-ubyte`, `train-labels-idx1-ubyte`, `t10k-images-idx3-ubyte` and
//! `t10k-labels-idx1-ubyte` are either plain or gzipped (`.gz`, as distributed).
//!
//! The IDX format: a big-endian header, magic number 2051 (images: count, rows, columns; 16
//! bytes) or 2049 (labels: count; 8 bytes), then one unsigned byte per pixel or label. Everything
//! is checked (magic, dimensions, that the two files of a split agree, the exact file length,
//! labels 0..=9); errors name the file and the byte offset (of the decompressed data for `.gz`).
//!
//! Options: `root`, `dataset` (folder under the root, default `fashion-mnist`), `normalize`
//! (default true: `x/255`, then `(x − mean)/std` with the scalar mean and standard deviation of
//! the whole training set; false leaves `[0, 1]`), `batch_size` (default 64), `train_samples` /
//! `eval_samples` (optional caps: the first N of a permutation drawn from `seed`), `seed`.
//!
//! Batches: inputs `[B, 1, 28, 28]` float, labels `[B]` int64 ([`InMemory`]).

use super::files::{capped_indices, Root};
use super::in_memory::InMemory;
use super::{check_caps, check_ranges, DataEntry, DataInfo, DataSource, DataSpec, InputTransform, Task, MAX_BATCH};
use crate::config::{parse_options, OptionError};
use anyhow::{anyhow, bail};
use serde::Deserialize;
use std::io::Read;
use std::path::{Path, PathBuf};
use tch::{Kind, Tensor};

pub const MNIST: DataEntry = DataEntry {
    name: "mnist",
    about: "an MNIST-family dataset in IDX format (default Fashion-MNIST), 28x28 grey, 10 classes",
    parse,
};

pub const IMAGES_MAGIC: u32 = 2051;
pub const LABELS_MAGIC: u32 = 2049;
pub const SIDE: usize = 28;
const CLASSES: usize = 10;

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Options {
    root: Option<PathBuf>,
    dataset: String,
    normalize: bool,
    batch_size: usize,
    train_samples: Option<usize>,
    eval_samples: Option<usize>,
    seed: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            root: None,
            dataset: "fashion-mnist".into(),
            normalize: true,
            batch_size: 64,
            train_samples: None,
            eval_samples: None,
            seed: 0,
        }
    }
}

#[derive(Debug)]
struct Spec {
    root: Root,
    dataset: String,
    normalize: bool,
    batch_size: usize,
    train_samples: Option<usize>,
    eval_samples: Option<usize>,
    seed: u64,
}

fn parse(opts: &serde_yaml::Mapping, pinned: Option<&Path>) -> Result<Box<dyn DataSpec>, OptionError> {
    let o: Options = parse_options(opts)?;
    super::files::folder_option("dataset", &o.dataset, "fashion-mnist")?;
    check_ranges(&[("batch_size", o.batch_size, 1, MAX_BATCH)])?;
    check_caps(&[("train_samples", o.train_samples), ("eval_samples", o.eval_samples)])?;
    Ok(Box::new(Spec {
        root: Root::new(pinned, o.root),
        dataset: o.dataset,
        normalize: o.normalize,
        batch_size: o.batch_size,
        train_samples: o.train_samples,
        eval_samples: o.eval_samples,
        seed: o.seed,
    }))
}

impl DataSpec for Spec {
    fn kind(&self) -> &'static str {
        "mnist"
    }
    fn info(&self) -> DataInfo {
        DataInfo { input_shape: vec![1, SIDE, SIDE], output_dim: CLASSES, task: Task::Classification }
    }
    fn load(&self) -> anyhow::Result<Box<dyn DataSource>> {
        let dir = self.root.resolve().join(&self.dataset);
        let train = load_split(&dir, "train", &self.dataset)?;
        let test = load_split(&dir, "t10k", &self.dataset)?;
        let (mean, std) = if self.normalize { pixel_mean_std(&train.pixels) } else { (0.0, 1.0) };
        let tensors = |s: IdxSplit, cap: Option<usize>, tag: u64| {
            let n = s.len();
            let chosen: Vec<i64> = capped_indices(n, cap, self.seed, tag).into_iter().map(|i| i as i64).collect();
            let x = Tensor::from_slice(&s.pixels).reshape([n as i64, 1, SIDE as i64, SIDE as i64]);
            let y = Tensor::from_slice(&s.labels).to_kind(Kind::Int64);
            let all = chosen.len() == n;
            let (x, y) = if all {
                (x, y)
            } else {
                let sel = Tensor::from_slice(&chosen);
                (x.index_select(0, &sel), y.index_select(0, &sel))
            };
            (x, y, (!all).then_some(chosen))
        };
        let (x, y, _) = tensors(train, self.train_samples, 1);
        let (ex, ey, rows) = tensors(test, self.eval_samples, 2);
        let n = y.size()[0] as usize;
        // Pixels stay uint8 until they are on the device (see `InputTransform`).
        let transform = InputTransform::Pixels { mean: vec![mean], std: vec![std] };
        let mut record = serde_yaml::Mapping::new();
        record.insert("kind".into(), "idx".into());
        for (key, stem) in [("images", "t10k-images-idx3-ubyte"), ("labels", "t10k-labels-idx1-ubyte")] {
            record.insert(key.into(), super::files::absolute(&find(&dir, stem, &self.dataset)?).into());
        }
        record.insert("rows".into(), super::files::rows_yaml(rows));
        let eval_rows = Some(record);
        let eval = (ex, ey);
        let stems =
            ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"];
        let files = stems.iter().map(|s| find(&dir, s, &self.dataset)).collect::<anyhow::Result<_>>()?;
        let batch = self.batch_size.min(n);
        Ok(Box::new(InMemory { x, y, eval, batch, seed: self.seed, transform, eval_rows, files }))
    }
}

/// Mean and standard deviation of `bytes / 255`, exact (from a histogram).
fn pixel_mean_std(bytes: &[u8]) -> (f64, f64) {
    let mut hist = [0u64; 256];
    for &b in bytes {
        hist[b as usize] += 1;
    }
    let n = bytes.len().max(1) as f64;
    let mean = hist.iter().enumerate().map(|(v, &c)| v as f64 * c as f64).sum::<f64>() / n / 255.0;
    let var = hist.iter().enumerate().map(|(v, &c)| (v as f64 / 255.0 - mean).powi(2) * c as f64).sum::<f64>() / n;
    (mean, var.sqrt().max(1e-12))
}

/// One split: `n` images of 28×28 bytes (row-major) and `n` labels `0..=9`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IdxSplit {
    pub pixels: Vec<u8>,
    pub labels: Vec<u8>,
}

impl IdxSplit {
    /// The number of examples in the split.
    pub fn len(&self) -> usize {
        self.labels.len()
    }
    /// Whether the split has no examples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }
}

/// Where a dataset comes from, for "not found" messages.
fn provenance(dataset: &str) -> String {
    match dataset {
        "fashion-mnist" => "Fashion-MNIST is at https://github.com/zalandoresearch/fashion-mnist (files at \
             http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/; on Debian/Ubuntu: the package \
             `dataset-fashion-mnist`)"
            .into(),
        "mnist" => "MNIST is at http://yann.lecun.com/exdb/mnist/ (mirror: \
             https://ossci-datasets.s3.amazonaws.com/mnist/)"
            .into(),
        other => format!("put the four IDX files of `{other}` there"),
    }
}

/// Reads and checks one split (`prefix` = `train` or `t10k`) of the dataset in `dir`.
pub fn load_split(dir: &Path, prefix: &str, dataset: &str) -> anyhow::Result<IdxSplit> {
    let images = find(dir, &format!("{prefix}-images-idx3-ubyte"), dataset)?;
    let labels = find(dir, &format!("{prefix}-labels-idx1-ubyte"), dataset)?;
    let pixels = parse_images(&read_idx_file(&images)?, &images)?;
    let labels_v = parse_labels(&read_idx_file(&labels)?, &labels)?;
    let n = pixels.len() / (SIDE * SIDE);
    if n == 0 {
        bail!(
            "{}: the header says 0 images (count at byte offset 4); the {prefix} split of {dataset} needs at least one",
            where_(&images)
        );
    }
    if n != labels_v.len() {
        bail!(
            "{} has {n} images but {} has {} labels: the two files of a split must agree",
            images.display(),
            labels.display(),
            labels_v.len()
        );
    }
    Ok(IdxSplit { pixels, labels: labels_v })
}

fn find(dir: &Path, stem: &str, dataset: &str) -> anyhow::Result<PathBuf> {
    let plain = dir.join(stem);
    let gz = dir.join(format!("{stem}.gz"));
    if plain.is_file() {
        return Ok(plain);
    }
    if gz.is_file() {
        return Ok(gz);
    }
    bail!(
        "{dataset} not found: looked for {} and {}; {}; {}",
        plain.display(),
        gz.display(),
        provenance(dataset),
        super::how_to_point_at(dataset)
    )
}

/// The bytes of an IDX file, decompressed when its name ends in `.gz`.
pub fn read_idx_file(path: &Path) -> anyhow::Result<Vec<u8>> {
    let raw = std::fs::read(path).map_err(|e| anyhow!("cannot read {}: {e}", path.display()))?;
    if path.extension().is_some_and(|e| e == "gz") {
        let mut out = Vec::with_capacity(raw.len() * 4);
        // Multi-member: `cat a.gz b.gz` (or pigz/bgzip output) is a valid gzip file of several members.
        if let Err(e) = flate2::read::MultiGzDecoder::new(raw.as_slice()).read_to_end(&mut out) {
            bail!("{}: corrupt or truncated gzip data at decompressed byte offset {}: {e}", path.display(), out.len());
        }
        Ok(out)
    } else {
        Ok(raw)
    }
}

fn where_(path: &Path) -> String {
    if path.extension().is_some_and(|e| e == "gz") {
        format!("{} (decompressed)", path.display())
    } else {
        path.display().to_string()
    }
}

fn be_u32(bytes: &[u8], offset: usize) -> u32 {
    u32::from_be_bytes(bytes[offset..offset + 4].try_into().expect("4 bytes"))
}

/// Checks an IDX3 image file (28×28 images) and returns its pixels; `path` names it in errors.
pub fn parse_images(bytes: &[u8], path: &Path) -> anyhow::Result<Vec<u8>> {
    let at = where_(path);
    if bytes.len() < 16 {
        bail!("{at}: truncated header at byte offset {}: an IDX image file starts with 16 header bytes", bytes.len());
    }
    let magic = be_u32(bytes, 0);
    if magic != IMAGES_MAGIC {
        bail!("{at}: bad magic number {magic} (0x{magic:08x}) at byte offset 0: an IDX image file has {IMAGES_MAGIC} (0x{IMAGES_MAGIC:08x})");
    }
    let n = be_u32(bytes, 4) as usize;
    let (rows, cols) = (be_u32(bytes, 8) as usize, be_u32(bytes, 12) as usize);
    if (rows, cols) != (SIDE, SIDE) {
        bail!("{at}: images are {rows}×{cols} (header at byte offset 8), expected {SIDE}×{SIDE}");
    }
    let image = SIDE * SIDE;
    let expected = 16 + n * image;
    if bytes.len() < expected {
        let k = (bytes.len() - 16) / image;
        bail!(
            "{at}: truncated at byte offset {}: the header says {n} images ({expected} bytes), image {k} starts at \
             byte offset {} and is incomplete",
            bytes.len(),
            16 + k * image
        );
    }
    if bytes.len() > expected {
        bail!(
            "{at}: {} unexpected bytes after the last of {n} images, from byte offset {expected}",
            bytes.len() - expected
        );
    }
    Ok(bytes[16..].to_vec())
}

/// Checks an IDX1 label file (labels 0..=9) and returns its labels; `path` names it in errors.
pub fn parse_labels(bytes: &[u8], path: &Path) -> anyhow::Result<Vec<u8>> {
    let at = where_(path);
    if bytes.len() < 8 {
        bail!("{at}: truncated header at byte offset {}: an IDX label file starts with 8 header bytes", bytes.len());
    }
    let magic = be_u32(bytes, 0);
    if magic != LABELS_MAGIC {
        bail!("{at}: bad magic number {magic} (0x{magic:08x}) at byte offset 0: an IDX label file has {LABELS_MAGIC} (0x{LABELS_MAGIC:08x})");
    }
    let n = be_u32(bytes, 4) as usize;
    let expected = 8 + n;
    if bytes.len() < expected {
        bail!("{at}: truncated at byte offset {}: the header says {n} labels ({expected} bytes)", bytes.len());
    }
    if bytes.len() > expected {
        bail!(
            "{at}: {} unexpected bytes after the last of {n} labels, from byte offset {expected}",
            bytes.len() - expected
        );
    }
    if let Some(i) = bytes[8..].iter().position(|&l| l as usize >= CLASSES) {
        bail!("{at}: label {} at byte offset {} is not a class 0..=9", bytes[8 + i], 8 + i);
    }
    Ok(bytes[8..].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_checked() {
        let p = Path::new("x-images-idx3-ubyte");
        let mut img = vec![0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 28, 0, 0, 0, 28];
        img.extend(vec![7u8; 2 * 784]);
        assert_eq!(parse_images(&img, p).unwrap().len(), 2 * 784);
        let e = parse_images(&img[..16 + 784 + 5], p).unwrap_err().to_string();
        assert!(e.contains("byte offset 805") && e.contains("image 1"), "{e}");
        let mut bad = img.clone();
        bad[11] = 27;
        assert!(parse_images(&bad, p).unwrap_err().to_string().contains("27×28"));
        let l = Path::new("x-labels-idx1-ubyte");
        assert_eq!(parse_labels(&[0, 0, 8, 1, 0, 0, 0, 2, 3, 9], l).unwrap(), vec![3, 9]);
        let e = parse_labels(&[0, 0, 8, 1, 0, 0, 0, 2, 3, 10], l).unwrap_err().to_string();
        assert!(e.contains("byte offset 9"), "{e}");
        assert!(parse_labels(&[0, 0, 8, 3, 0, 0, 0, 0], l).unwrap_err().to_string().contains("magic"));
    }

    #[test]
    fn mean_std_is_exact() {
        let (m, s) = pixel_mean_std(&[0, 255]);
        assert!((m - 0.5).abs() < 1e-12 && (s - 0.5).abs() < 1e-12);
    }
}
