//! `imagefolder`: image classification in the ImageNet layout, decoded on the fly.
//!
//! Layout: `<root>/<dir>/<split>/<class>/*.{jpg,jpeg,png}` (file extensions in any case, so
//! ImageNet's `.JPEG` too), e.g. `imagenet/train/n01440764/n01440764_10026.JPEG` and
//! `imagenet/val/n01440764/ILSVRC2012_val_00000293.JPEG` (the validation images sorted into
//! class folders, as torchvision's `ImageFolder` expects). The classes are the first `classes`
//! class folders of the training split in sorted order (all 1000 for ImageNet-1k; fewer for the
//! usual subsets); each must also exist in the evaluation split.
//!
//! Unlike CIFAR-10 the images are not held in memory: training batch `index` is a pure function of
//! `(seed, index)` — an epoch is a seeded permutation of the training files — and its images are
//! read, decoded, cropped and resized when it is asked for, on `workers` threads (in plexus's data
//! thread, off the training thread). Training augmentation `random_resized_crop` (the Inception
//! crop of simple ViT: area 5–100 % of the image, aspect ratio 3/4–4/3, then a horizontal flip with
//! probability ½); evaluation and `augment: none` resize the shorter side to `image_size · 256/224`
//! and take the centre `image_size` crop. Inputs are `[B, 3, S, S]` float, normalised with the
//! ImageNet channel mean and standard deviation (`normalize: true`, default), labels `[B]` int64.
//!
//! Evaluation holds its images in memory as uint8 tensors, so it is capped (`eval_samples`,
//! default 1000: 0.15 GB at 224²): a seeded sample of the evaluation split, decoded at load. A file
//! that cannot be read or decoded is an error naming it (at load for evaluation images; for
//! training images when the trainer takes their batch — prepared ahead on the data thread, the
//! error waits for it — which stops the run); with `skip_bad: true` an undecodable training
//! image is skipped instead (replaced by the next image of the epoch's permutation that decodes,
//! so batches stay a pure function of `(seed, index)`), and each one skipped is reported once with
//! the running count. The listing is checked at load (a class with no image, a class missing from
//! the evaluation split).
//!
//! Options: `root`, `dir` (required: the dataset's folder under the root), `train_split` (default
//! `train`), `eval_split` (default `val`), `classes` (required), `image_size` (default 224),
//! `normalize`, `augment` (`random_resized_crop` | `none`, default `random_resized_crop`),
//! `batch_size` (default 64), `train_samples` (optional cap), `eval_samples`, `workers` (default:
//! the machine's cores), `skip_bad` (default false), `seed`.

use super::files::{capped_indices, folder_option, rng_for, Root};
use super::{check_caps, check_ranges, Batch, DataEntry, DataInfo, DataSource, DataSpec, InputTransform, Task};
use crate::config::{parse_options, required, OptionError};
use anyhow::{anyhow, bail, Context};
use image::imageops::FilterType;
use rand::Rng;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use tch::Tensor;

pub const IMAGEFOLDER: DataEntry = DataEntry {
    name: "imagefolder",
    about: "image classification in the ImageNet folder layout, decoded on the fly (random-resized-crop, flip)",
    parse,
};

/// ImageNet channel statistics on `[0, 1]` pixels.
const MEAN: [f32; 3] = [0.485, 0.456, 0.406];
const STD: [f32; 3] = [0.229, 0.224, 0.225];

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum Augment {
    #[default]
    RandomResizedCrop,
    None,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Options {
    root: Option<PathBuf>,
    /// Required.
    #[serde(deserialize_with = "crate::config::present")]
    dir: Option<String>,
    train_split: String,
    eval_split: String,
    /// Required.
    #[serde(deserialize_with = "crate::config::present")]
    classes: Option<usize>,
    image_size: usize,
    normalize: bool,
    augment: Augment,
    batch_size: usize,
    train_samples: Option<usize>,
    eval_samples: usize,
    workers: Option<usize>,
    /// Skip training images that cannot be read or decoded (reported with a count) instead of
    /// stopping the run.
    skip_bad: bool,
    seed: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            root: None,
            dir: None,
            train_split: "train".into(),
            eval_split: "val".into(),
            classes: None,
            image_size: 224,
            normalize: true,
            augment: Augment::RandomResizedCrop,
            batch_size: 64,
            train_samples: None,
            eval_samples: 1000,
            workers: None,
            skip_bad: false,
            seed: 0,
        }
    }
}

#[derive(Debug, Clone)]
struct Spec {
    root: Root,
    /// The dataset's folder under the root, and its number of classes.
    dir: String,
    classes: usize,
    o: Options,
}

fn parse(opts: &serde_yaml::Mapping, pinned: Option<&Path>) -> Result<Box<dyn DataSpec>, OptionError> {
    let o: Options = parse_options(opts)?;
    let (dir, classes) = (required(o.dir.clone(), "dir")?, required(o.classes, "classes")?);
    folder_option("dir", &dir, "imagenet")?;
    folder_option("train_split", &o.train_split, "train")?;
    folder_option("eval_split", &o.eval_split, "val")?;
    check_ranges(&[
        ("classes", classes, 2, 100_000),
        ("image_size", o.image_size, 8, 4096),
        ("batch_size", o.batch_size, 1, 1 << 16),
        ("eval_samples", o.eval_samples, 1, 10_000_000),
    ])?;
    check_caps(&[("train_samples", o.train_samples)])?;
    if o.workers == Some(0) {
        return Err(OptionError::new(
            "workers",
            0,
            "a positive number of decoding threads (leave it out for all cores)",
        ));
    }
    Ok(Box::new(Spec { root: Root::new(pinned, o.root.clone()), dir, classes, o }))
}

impl DataSpec for Spec {
    fn kind(&self) -> &'static str {
        "imagefolder"
    }
    fn info(&self) -> DataInfo {
        let s = self.o.image_size;
        DataInfo { input_shape: vec![3, s, s], output_dim: self.classes, task: Task::Classification }
    }
    fn load(&self) -> anyhow::Result<Box<dyn DataSource>> {
        let base = self.root.resolve().join(&self.dir);
        let train_dir = base.join(&self.o.train_split);
        let classes = class_names(&train_dir, self.classes)?;
        let (mut train, mut eval) =
            (list_split(&train_dir, &classes)?, list_split(&base.join(&self.o.eval_split), &classes)?);
        let keep = capped_indices(train.len(), self.o.train_samples, self.o.seed, 1);
        train = keep.into_iter().map(|i| train[i].clone()).collect();
        let keep = capped_indices(eval.len(), Some(self.o.eval_samples), self.o.seed, 2);
        eval = keep.into_iter().map(|i| eval[i].clone()).collect();
        if train.len() < self.o.batch_size {
            bail!(
                "{}: {} training images, fewer than one batch of {}",
                train_dir.display(),
                train.len(),
                self.o.batch_size
            );
        }
        let workers = self.o.workers.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
        let mut source =
            FolderSource { train, eval: Vec::new(), o: self.o.clone(), workers, skipped: Default::default() };
        // Decoded once, here, so that an unreadable evaluation image is an error of the load.
        source.eval = eval
            .chunks(self.o.batch_size)
            .map(|c| source.decode(&c.iter().collect::<Vec<_>>(), None, 0, "evaluation"))
            .collect::<anyhow::Result<_>>()?;
        Ok(Box::new(source))
    }
}

/// The first `n` class folders of `dir`, sorted by name.
fn class_names(dir: &Path, n: usize) -> anyhow::Result<Vec<String>> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        anyhow!(
            "image folder not found: cannot read {}: {e}; expected <root>/<dir>/<split>/<class>/*.jpg (ImageNet: \
             https://image-net.org/download, with the validation images sorted into class folders); {}",
            dir.display(),
            super::how_to_point_at("<dir>")
        )
    })?;
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    if names.len() < n {
        bail!("{}: {} class folders, but `classes: {n}` asks for {n}", dir.display(), names.len());
    }
    names.truncate(n);
    Ok(names)
}

/// `(file, label)` for every image of the `classes` under `split`, sorted by class then name.
fn list_split(split: &Path, classes: &[String]) -> anyhow::Result<Vec<(PathBuf, i64)>> {
    let mut out = Vec::new();
    for (label, class) in classes.iter().enumerate() {
        let dir = split.join(class);
        let entries = std::fs::read_dir(&dir)
            .map_err(|e| anyhow!("{}: cannot read the class folder of `{class}`: {e}", dir.display()))?;
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                let ext = p.extension().and_then(|x| x.to_str()).map(str::to_ascii_lowercase);
                matches!(ext.as_deref(), Some("jpg" | "jpeg" | "png"))
            })
            .collect();
        if files.is_empty() {
            bail!("{}: no .jpg/.jpeg/.png image in the class folder of `{class}`", dir.display());
        }
        files.sort();
        out.extend(files.into_iter().map(|f| (f, label as i64)));
    }
    Ok(out)
}

/// A crop box `(x, y, w, h)` in an image of `width × height`: Inception-style random-resized crop
/// (area 5–100 %, aspect 3/4–4/3, ten tries) or, failing that and for evaluation, the centre crop
/// of the square that a shorter-side resize to `S·256/224` followed by a centre `S` crop keeps.
pub fn crop_box(width: u32, height: u32, random: Option<&mut impl Rng>) -> (u32, u32, u32, u32) {
    let (w, h) = (width as f64, height as f64);
    if let Some(rng) = random {
        for _ in 0..10 {
            let area = w * h * rng.gen_range(0.05..=1.0);
            let ratio = (rng.gen_range((0.75f64).ln()..=(4.0f64 / 3.0).ln())).exp();
            let (cw, ch) = ((area * ratio).sqrt().round(), (area / ratio).sqrt().round());
            if cw >= 1.0 && ch >= 1.0 && cw <= w && ch <= h {
                let x = rng.gen_range(0..=(width - cw as u32));
                let y = rng.gen_range(0..=(height - ch as u32));
                return (x, y, cw as u32, ch as u32);
            }
        }
    }
    let side = (w.min(h) * 224.0 / 256.0).round().max(1.0) as u32;
    ((width - side) / 2, (height - side) / 2, side, side)
}

/// Reads `path`, crops `crop_box`, resizes to `size × size` and writes channel-major bytes.
fn load_image(path: &Path, size: u32, rng: Option<&mut rand::rngs::StdRng>, out: &mut [u8]) -> anyhow::Result<()> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let img =
        image::load_from_memory(&bytes).map_err(|e| anyhow!("{}: cannot decode the image: {e}", path.display()))?;
    let rgb = img.into_rgb8();
    let (flip, bx) = match rng {
        Some(r) => {
            let b = crop_box(rgb.width(), rgb.height(), Some(&mut *r));
            (r.gen_bool(0.5), b)
        }
        None => (false, crop_box(rgb.width(), rgb.height(), None::<&mut rand::rngs::StdRng>)),
    };
    let cropped = image::imageops::crop_imm(&rgb, bx.0, bx.1, bx.2, bx.3).to_image();
    let mut resized = image::imageops::resize(&cropped, size, size, FilterType::Triangle);
    if flip {
        image::imageops::flip_horizontal_in_place(&mut resized);
    }
    let plane = (size * size) as usize;
    for (p, px) in resized.pixels().enumerate() {
        out[p] = px[0];
        out[plane + p] = px[1];
        out[2 * plane + p] = px[2];
    }
    Ok(())
}

struct FolderSource {
    train: Vec<(PathBuf, i64)>,
    /// The decoded evaluation batches.
    eval: Vec<Batch>,
    o: Options,
    workers: usize,
    /// Training images found undecodable so far (`skip_bad`).
    skipped: std::sync::Mutex<std::collections::HashSet<PathBuf>>,
}

/// The image a decoding error is about, and its split (attached as context, for `skip_bad`).
#[derive(Debug)]
struct BadImage(PathBuf, &'static str);

impl std::fmt::Display for BadImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.1 {
            "training" => write!(f, "bad training image"),
            split => write!(
                f,
                "bad {split} image (decoded when the data loads; data.skip_bad skips training images only: \
                 remove or replace it)"
            ),
        }
    }
}

impl FolderSource {
    /// Decodes `files` on `self.workers` threads into `[n, 3, S, S]` uint8 pixels and `[n]` labels.
    /// `augment_tag`: `Some(batch index)` draws the random crops and flips from `(seed, index, i)`,
    /// `i` the image's position in its batch (`first` is that of `files[0]`: a data-parallel rank
    /// decodes a slice of the batch with the crops of the whole).
    /// `split` names the images in errors ("training", "evaluation").
    fn decode(
        &self,
        files: &[&(PathBuf, i64)],
        augment_tag: Option<u64>,
        first: usize,
        split: &'static str,
    ) -> anyhow::Result<Batch> {
        let s = self.o.image_size as u32;
        let per_image = 3 * (s * s) as usize;
        let mut pixels = vec![0u8; files.len() * per_image];
        let chunk = files.len().div_ceil(self.workers).max(1);
        let seed = self.o.seed;
        std::thread::scope(|scope| {
            let jobs: Vec<_> = files
                .chunks(chunk)
                .zip(pixels.chunks_mut(chunk * per_image))
                .enumerate()
                .map(|(c, (fs, out))| {
                    scope.spawn(move || -> anyhow::Result<()> {
                        for (k, (f, o)) in fs.iter().zip(out.chunks_exact_mut(per_image)).enumerate() {
                            let at = (first + c * chunk + k) as u64;
                            let mut rng = augment_tag.map(|t| rng_for(seed, &[0x1F0, t, at]));
                            load_image(&f.0, s, rng.as_mut(), o)
                                .map_err(|e| e.context(BadImage(f.0.clone(), split)))?;
                        }
                        Ok(())
                    })
                })
                .collect();
            jobs.into_iter().try_for_each(|j| j.join().expect("an image decoding thread panicked"))
        })?;
        let n = files.len() as i64;
        // uint8 until it is on the device (see `input_transform`).
        let x = Tensor::from_slice(&pixels).reshape([n, 3, s as i64, s as i64]);
        let y = Tensor::from_slice(&files.iter().map(|f| f.1).collect::<Vec<i64>>());
        Ok(Batch { input: x, target: y })
    }
}

impl FolderSource {
    /// The images of training batch `index` (before any `skip_bad` replacement), its
    /// augmentation tag, its epoch's order of the training images and where the batch ends in it.
    #[allow(clippy::type_complexity)]
    fn batch_files(&self, index: u64) -> (Vec<&(PathBuf, i64)>, Option<u64>, Vec<i64>, usize) {
        let per_epoch = self.batches_per_epoch();
        let (epoch, b) = (index / per_epoch, (index % per_epoch) as usize);
        let perm = super::in_memory::epoch_permutation(self.train.len(), self.o.seed, epoch);
        let bs = self.o.batch_size;
        let files = perm[b * bs..(b + 1) * bs].iter().map(|&i| &self.train[i as usize]).collect();
        (files, (self.o.augment == Augment::RandomResizedCrop).then_some(index), perm, (b + 1) * bs)
    }
}

impl DataSource for FolderSource {
    /// Decodes only this rank's slice of the batch (a `world`-fold saving of decoding on every
    /// rank). An image in the slice that cannot be decoded falls back to the whole batch, sliced:
    /// the replacement rules (`skip_bad`) and errors are then exactly the single-process ones.
    fn train_shard(&self, index: u64, rank: usize, world: usize) -> anyhow::Result<Batch> {
        if world > 1 {
            let (files, tag, _, _) = self.batch_files(index);
            let per = files.len() / world;
            if let Ok(b) = self.decode(&files[rank * per..(rank + 1) * per], tag, rank * per, "training") {
                return Ok(b);
            }
        }
        Ok(self.train_batch(index)?.shard(rank, world))
    }
    fn train_batch(&self, index: u64) -> anyhow::Result<Batch> {
        // Replacements for skipped images: the images after this batch in the epoch's order.
        let (mut files, tag, perm, mut next) = self.batch_files(index);
        let bs = self.o.batch_size;
        loop {
            let e = match self.decode(&files, tag, 0, "training") {
                Ok(batch) => return Ok(batch),
                Err(e) => e,
            };
            let bad = e.downcast_ref::<BadImage>().map(|b| b.0.clone());
            let Some(bad) = bad.filter(|_| self.o.skip_bad) else {
                // The error reaches the trainer when it takes this batch, which stops the run.
                return Err(e.context(format!(
                    "imagefolder training batch {index} (set `data.skip_bad: true` to skip training images that \
                     cannot be decoded)"
                )));
            };
            let count = {
                let mut skipped = self.skipped.lock().unwrap_or_else(|p| p.into_inner());
                if skipped.insert(bad.clone()) {
                    eprintln!("imagefolder: skipping an undecodable training image ({} so far): {e:#}", skipped.len());
                }
                skipped.len()
            };
            if count >= self.train.len() {
                anyhow::bail!("imagefolder: none of the {} training images can be decoded", self.train.len());
            }
            let slot = files.iter().position(|f| f.0 == bad).expect("the bad image is in the batch");
            for tried in 0.. {
                if tried > perm.len() {
                    anyhow::bail!(
                        "imagefolder: fewer decodable training images than one batch of {bs} ({count} skipped)"
                    );
                }
                let candidate = &self.train[perm[next % perm.len()] as usize];
                next += 1;
                let known_bad = self.skipped.lock().unwrap_or_else(|p| p.into_inner()).contains(&candidate.0);
                if !known_bad && !files.iter().any(|f| f.0 == candidate.0) {
                    files[slot] = candidate;
                    break;
                }
            }
        }
    }
    fn batches_per_epoch(&self) -> u64 {
        (self.train.len() / self.o.batch_size).max(1) as u64
    }
    fn input_transform(&self) -> InputTransform {
        if self.o.normalize {
            InputTransform::Pixels { mean: MEAN.map(f64::from).to_vec(), std: STD.map(f64::from).to_vec() }
        } else {
            InputTransform::Pixels { mean: vec![0.0], std: vec![1.0] }
        }
    }
    fn eval_batches(&self) -> Vec<Batch> {
        self.eval.iter().map(|b| Batch { input: b.input.shallow_clone(), target: b.target.shallow_clone() }).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn crops_fit_in_the_image_and_the_centre_crop_is_224_of_256() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0);
        for _ in 0..200 {
            let (x, y, w, h) = crop_box(500, 375, Some(&mut rng));
            assert!(x + w <= 500 && y + h <= 375 && w > 0 && h > 0);
            let r = w as f64 / h as f64;
            assert!((0.74..=1.35).contains(&r), "aspect {r}");
        }
        assert_eq!(crop_box(500, 256, None::<&mut rand::rngs::StdRng>), (138, 16, 224, 224));
    }
}
