//! `cifar10`: CIFAR-10, 50,000 training and 10,000 test images, 32×32 RGB, 10 classes, read from
//! the data root in either of two layouts:
//!
//! - **binary**, the official distribution (`cifar-10-binary.tar.gz`): `cifar-10-batches-bin/`
//!   under `<root>/cifar10` or `<root>`, holding `data_batch_{1..5}.bin` and `test_batch.bin`.
//!   Each record is 1 label byte and 3072 pixel bytes: the 1024 red values, then green, then
//!   blue, each a 32×32 image in row-major order.
//! - **folder**, an image folder: `<root>/cifar10/{train,test}/<class>/*.{jpg,png}` (or the same
//!   directly under `<root>`), one directory per class name ([`CLASSES`], which fix the label
//!   order; files sorted by name within a class). Images are decoded in parallel once and the
//!   decoded arrays are cached (see [`super::files`]), keyed by the folder's canonical path, its
//!   file count, total size and newest modification time, so later loads read one file.
//!
//! Options: `root`, `format` (`auto` | `binary` | `folder`; `auto` takes the binary batches when
//! `cifar-10-batches-bin/` exists, else the folder), `classes` (a subset as class names or
//! indices, e.g. `[cat, dog]` for CIFAR-2; labels become `0..k` in the order given), `normalize`
//! (default true: per-channel CIFAR-10 mean/std after scaling to `[0, 1]`; false leaves `[0, 1]`),
//! `augment` (`none` | `flip_crop`: random horizontal flip and random 32×32 crop of the image
//! zero-padded by 4 pixels, drawn from `(seed, batch index, position in batch)`), `batch_size`
//! (default 64), `train_samples` / `eval_samples` (optional caps: the first N of a permutation
//! drawn from `seed`, after the class subset), `seed`.
//!
//! Batches: inputs `[B, 3, 32, 32]` float, labels `[B]` int64; training batches are drawn by
//! [`InMemory`] (an epoch is a seeded permutation), evaluation uses the whole test split in order.

use super::files::{cache_path, canonical, capped_indices, read_cache, rng_for, write_cache, Root};
use super::in_memory::InMemory;
use super::{
    check_caps, check_ranges, Batch, DataEntry, DataInfo, DataSource, DataSpec, InputTransform, Task, MAX_BATCH,
};
use crate::config::{parse_options, OptionError};
use anyhow::{anyhow, bail, Context};
use rand::Rng;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use tch::{Device, Tensor};

pub const CIFAR10: DataEntry = DataEntry {
    name: "cifar10",
    about: "CIFAR-10 from the official binary batches or an image folder; class subsets, flip/crop augmentation",
    parse,
};

/// The class names in label order (as in the official `batches.meta.txt`).
pub const CLASSES: [&str; 10] =
    ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"];
/// Per-channel mean and standard deviation of the CIFAR-10 training set, pixels in `[0, 1]`.
pub const MEAN: [f32; 3] = [0.4914, 0.4822, 0.4465];
pub const STD: [f32; 3] = [0.2470, 0.2435, 0.2616];
/// Bytes of one image (3 × 32 × 32) and of one record of the binary format (label + image).
pub const IMAGE_BYTES: usize = 3 * 32 * 32;
pub const RECORD_BYTES: usize = 1 + IMAGE_BYTES;
pub const DOWNLOAD_URL: &str = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz";
const BINARY_DIR: &str = "cifar-10-batches-bin";
const TRAIN_FILES: [&str; 5] =
    ["data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin", "data_batch_5.bin"];
const TEST_FILE: &str = "test_batch.bin";

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    #[default]
    Auto,
    Binary,
    Folder,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Augment {
    #[default]
    None,
    FlipCrop,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Options {
    root: Option<PathBuf>,
    format: Format,
    classes: Option<Vec<serde_yaml::Value>>,
    normalize: bool,
    augment: Augment,
    batch_size: usize,
    train_samples: Option<usize>,
    eval_samples: Option<usize>,
    seed: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            root: None,
            format: Format::Auto,
            classes: None,
            normalize: true,
            augment: Augment::None,
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
    format: Format,
    /// Original CIFAR-10 labels of the classes kept; new label `i` is `classes[i]`.
    classes: Vec<u8>,
    normalize: bool,
    augment: Augment,
    batch_size: usize,
    train_samples: Option<usize>,
    eval_samples: Option<usize>,
    seed: u64,
}

fn parse(opts: &serde_yaml::Mapping, pinned: Option<&Path>) -> Result<Box<dyn DataSpec>, OptionError> {
    let o: Options = parse_options(opts)?;
    let classes = match &o.classes {
        None => (0..10).collect(),
        Some(list) => parse_classes(list)?,
    };
    check_ranges(&[("batch_size", o.batch_size, 1, MAX_BATCH)])?;
    check_caps(&[("train_samples", o.train_samples), ("eval_samples", o.eval_samples)])?;
    Ok(Box::new(Spec {
        root: Root::new(pinned, o.root),
        format: o.format,
        classes,
        normalize: o.normalize,
        augment: o.augment,
        batch_size: o.batch_size,
        train_samples: o.train_samples,
        eval_samples: o.eval_samples,
        seed: o.seed,
    }))
}

fn parse_classes(list: &[serde_yaml::Value]) -> Result<Vec<u8>, OptionError> {
    let allowed = || format!("a CIFAR-10 class name ({}) or index 0..=9", CLASSES.join(", "));
    if list.is_empty() {
        return Err(OptionError::new("classes", "[]", format!("a non-empty list, each {}", allowed())));
    }
    let mut out: Vec<u8> = Vec::with_capacity(list.len());
    for (i, v) in list.iter().enumerate() {
        let key = format!("classes[{i}]");
        let text = match v {
            serde_yaml::Value::String(s) => s.clone(),
            serde_yaml::Value::Number(n) => n.to_string(),
            other => serde_yaml::to_string(other).unwrap_or_default().trim().to_string(),
        };
        let label = match v {
            serde_yaml::Value::String(s) => CLASSES.iter().position(|c| c == s),
            serde_yaml::Value::Number(n) => n.as_u64().filter(|&k| k < 10).map(|k| k as usize),
            _ => None,
        };
        let Some(label) = label else {
            return Err(OptionError::new(key, text, allowed()));
        };
        if out.contains(&(label as u8)) {
            return Err(OptionError::new(key, text, format!("a class not already listed ({} is)", CLASSES[label])));
        }
        out.push(label as u8);
    }
    Ok(out)
}

impl DataSpec for Spec {
    fn kind(&self) -> &'static str {
        "cifar10"
    }
    fn info(&self) -> DataInfo {
        DataInfo { input_shape: vec![3, 32, 32], output_dim: self.classes.len(), task: Task::Classification }
    }
    fn load(&self) -> anyhow::Result<Box<dyn DataSource>> {
        let root = self.root.resolve();
        let (train, test, test_file) = read_layout(&root, self.format)?;
        let (x, y, _) = self.select(train, self.train_samples, 1);
        let (ex, ey, rows) = self.select(test, self.eval_samples, 2);
        let n = y.size()[0] as usize;
        if n == 0 {
            bail!("CIFAR-10 under {}: no training images of the classes asked for", root.display());
        }
        let transform = InputTransform::Identity; // applied by CifarSource::input_transform
        let inner = InMemory {
            x,
            y,
            eval: (ex, ey),
            batch: self.batch_size.min(n),
            seed: self.seed,
            transform,
            eval_rows: self.eval_record(test_file, rows),
            files: match binary_dir(&root, self.format) {
                Some(dir) => TRAIN_FILES.iter().chain([&TEST_FILE]).map(|f| dir.join(f)).collect(),
                None => Vec::new(),
            },
        };
        Ok(Box::new(CifarSource { inner, normalize: self.normalize, augment: self.augment, seed: self.seed }))
    }
}

impl Spec {
    /// The held-out rows for `resolved.yaml`: the file the test pixels were read from, the
    /// original labels of the classes kept (new label `i` is `classes[i]`) and the rows used, in
    /// order (`all`: every row in file order). `None` where no file holds the pixels as plexus read
    /// them (an image folder whose decode could not be cached).
    fn eval_record(&self, test_file: Option<TestFile>, rows: Option<Vec<i64>>) -> Option<serde_yaml::Mapping> {
        let mut record = serde_yaml::Mapping::new();
        match test_file? {
            TestFile::Binary(path) => {
                record.insert("kind".into(), "cifar10-binary".into());
                record.insert("file".into(), super::files::absolute(&path).into());
            }
            TestFile::DecodeCache { path, key } => {
                record.insert("kind".into(), "cifar10-cache".into());
                record.insert("file".into(), super::files::absolute(&path).into());
                record.insert("key".into(), key.into());
            }
        }
        let classes: serde_yaml::Sequence = self.classes.iter().map(|&c| u64::from(c).into()).collect();
        record.insert("classes".into(), classes.into());
        record.insert("rows".into(), super::files::rows_yaml(rows));
        Some(record)
    }

    /// The kept samples of `split` (class subset with remapped labels, then the cap) as uint8
    /// images `[n, 3, 32, 32]` and int64 labels `[n]`, with the rows of `split` they are (`None`:
    /// every row, in order).
    fn select(&self, split: RawSplit, cap: Option<usize>, tag: u64) -> (Tensor, Tensor, Option<Vec<i64>>) {
        let mut remap = [None; 256];
        for (new, &old) in self.classes.iter().enumerate() {
            remap[old as usize] = Some(new as i64);
        }
        let kept: Vec<usize> = (0..split.len()).filter(|&i| remap[split.labels[i] as usize].is_some()).collect();
        let chosen: Vec<i64> =
            capped_indices(kept.len(), cap, self.seed, tag).into_iter().map(|c| kept[c] as i64).collect();
        let y: Vec<i64> = chosen.iter().map(|&i| remap[split.labels[i as usize] as usize].expect("kept")).collect();
        let all = Tensor::from_slice(&split.pixels).reshape([split.len() as i64, 3, 32, 32]);
        drop(split);
        if chosen.len() == all.size()[0] as usize {
            (all, Tensor::from_slice(&y), None)
        } else {
            (all.index_select(0, &Tensor::from_slice(&chosen)), Tensor::from_slice(&y), Some(chosen))
        }
    }
}

/// One split as stored: labels `0..=9` and images of [`IMAGE_BYTES`] each, channel-major
/// (R plane, G plane, B plane; 32×32 row-major).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RawSplit {
    pub labels: Vec<u8>,
    pub pixels: Vec<u8>,
}

impl RawSplit {
    /// The number of images in the split.
    pub fn len(&self) -> usize {
        self.labels.len()
    }
    /// Whether the split has no images.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }
    /// Image `i`'s bytes as the binary files store them: 3 planes (R, G, B) of 32 × 32 bytes.
    pub fn image(&self, i: usize) -> &[u8] {
        &self.pixels[i * IMAGE_BYTES..(i + 1) * IMAGE_BYTES]
    }
    fn append(&mut self, other: RawSplit) {
        self.labels.extend(other.labels);
        self.pixels.extend(other.pixels);
    }
}

/// The file holding the test split's pixels exactly as plexus read them, for a run's
/// `resolved.yaml`: the official test batch, or — for an image folder — plexus' decode cache
/// (JPEG decoders differ: PIL and the `image` crate disagree by up to 4 levels on some CIFAR-10
/// pixels, so a reader must not decode the folder itself), with the key that names its contents.
#[derive(Debug, Clone)]
enum TestFile {
    Binary(PathBuf),
    DecodeCache { path: PathBuf, key: String },
}

/// Finds CIFAR-10 under `root` in the layout `format` asks for and reads `(train, test)`.
pub fn load_raw(root: &Path, format: Format) -> anyhow::Result<(RawSplit, RawSplit)> {
    read_layout(root, format).map(|(train, test, _)| (train, test))
}

/// [`load_raw`], with the file the test pixels can be read back from.
fn read_layout(root: &Path, format: Format) -> anyhow::Result<(RawSplit, RawSplit, Option<TestFile>)> {
    let binary_dirs = binary_dirs(root);
    let folder_dirs = [root.join("cifar10"), root.to_path_buf()];
    let binary = binary_dir(root, format);
    let folder = folder_dirs
        .iter()
        .find(|d| d.join("train").is_dir() && d.join("test").is_dir())
        .filter(|_| format != Format::Binary);
    if let Some(dir) = binary {
        let (train, test) = load_binary_dir(&dir)?;
        return Ok((train, test, Some(TestFile::Binary(dir.join(TEST_FILE)))));
    }
    if let Some(dir) = folder {
        let (train, _) = read_folder_split(&dir.join("train"), root)?;
        let (test, cache) = read_folder_split(&dir.join("test"), root)?;
        let cache = cache.filter(|(path, _)| path.is_file()).map(|(path, key)| TestFile::DecodeCache { path, key });
        return Ok((train, test, cache));
    }
    let bin = format!("{} (or {})", binary_dirs[0].display(), binary_dirs[1].display());
    let fold = format!(
        "{} (or {})",
        folder_dirs[0].join("{train,test}").display(),
        folder_dirs[1].join("{train,test}").display()
    );
    let looked = match format {
        Format::Auto => format!("{bin} and {fold}"),
        Format::Binary => bin,
        Format::Folder => fold,
    };
    bail!(
        "CIFAR-10 not found: looked for {looked}; download {DOWNLOAD_URL} and extract it under {} \
         (`scripts/fetch-data.sh cifar10` does both); {}",
        root.display(),
        super::how_to_point_at("cifar10")
    )
}

/// Where the binary batches may sit under `root`, in the order they are looked for.
fn binary_dirs(root: &Path) -> [PathBuf; 2] {
    [root.join("cifar10").join(BINARY_DIR), root.join(BINARY_DIR)]
}

/// The binary batches' folder `load_raw` reads under `format`, if that is the layout it reads.
fn binary_dir(root: &Path, format: Format) -> Option<PathBuf> {
    binary_dirs(root).into_iter().find(|d| d.is_dir()).filter(|_| format != Format::Folder)
}

/// Reads the official binary batches in `dir` (`cifar-10-batches-bin`).
pub fn load_binary_dir(dir: &Path) -> anyhow::Result<(RawSplit, RawSplit)> {
    let mut train = RawSplit::default();
    for f in TRAIN_FILES {
        train.append(read_binary_file(&dir.join(f))?);
    }
    Ok((train, read_binary_file(&dir.join(TEST_FILE))?))
}

/// Records in each file of the official binary format (5 training batches and the test batch).
pub const RECORDS_PER_FILE: usize = 10_000;

/// Reads one file of the official binary format (see the module docs): exactly
/// [`RECORDS_PER_FILE`] records, so that an empty or cut file is an error, not a short epoch.
pub fn read_binary_file(path: &Path) -> anyhow::Result<RawSplit> {
    let bytes = std::fs::read(path).map_err(|e| {
        anyhow!(
            "cannot read the CIFAR-10 batch {}: {e} (the official batches come from {DOWNLOAD_URL})",
            path.display()
        )
    })?;
    let split = parse_binary(&bytes, path)?;
    let expected = RECORDS_PER_FILE * RECORD_BYTES;
    if bytes.len() != expected {
        bail!(
            "{}: incomplete CIFAR-10 batch: {} bytes ({} records), but every official batch file holds \
             {RECORDS_PER_FILE} records of {RECORD_BYTES} bytes ({expected} bytes){}; re-extract {DOWNLOAD_URL}",
            path.display(),
            bytes.len(),
            split.len(),
            if bytes.len() < expected { format!(", truncated at byte offset {}", bytes.len()) } else { String::new() }
        );
    }
    Ok(split)
}

/// Parses the bytes of one binary batch; `path` names it in errors.
pub fn parse_binary(bytes: &[u8], path: &Path) -> anyhow::Result<RawSplit> {
    if !bytes.len().is_multiple_of(RECORD_BYTES) {
        let offset = bytes.len() / RECORD_BYTES * RECORD_BYTES;
        bail!(
            "{}: truncated record at byte offset {offset}: the file has {} bytes, not a multiple of the \
             {RECORD_BYTES}-byte record (1 label + 3072 pixels); re-extract {DOWNLOAD_URL}",
            path.display(),
            bytes.len()
        );
    }
    let n = bytes.len() / RECORD_BYTES;
    let mut split = RawSplit { labels: Vec::with_capacity(n), pixels: Vec::with_capacity(n * IMAGE_BYTES) };
    for (i, rec) in bytes.chunks_exact(RECORD_BYTES).enumerate() {
        if rec[0] > 9 {
            bail!(
                "{}: label byte {} at byte offset {} (record {i}) is not a CIFAR-10 class 0..=9; is this a \
                 CIFAR-10 batch file?",
                path.display(),
                rec[0],
                i * RECORD_BYTES
            );
        }
        split.labels.push(rec[0]);
        split.pixels.extend_from_slice(&rec[1..]);
    }
    Ok(split)
}

/// The image files of one class directory, sorted by name, with their total size in bytes and
/// newest modification time (for the cache key).
fn class_files(dir: &Path) -> anyhow::Result<(Vec<PathBuf>, u64, u128)> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        anyhow!(
            "CIFAR-10 image folder: cannot read the class directory {}: {e} (expected one directory per class: {})",
            dir.display(),
            CLASSES.join(" ")
        )
    })?;
    let (mut files, mut bytes, mut newest) = (Vec::new(), 0u64, 0u128);
    for e in entries {
        let e = e.with_context(|| format!("listing {}", dir.display()))?;
        let p = e.path();
        let ext = p.extension().and_then(|x| x.to_str()).map(str::to_ascii_lowercase);
        if matches!(ext.as_deref(), Some("jpg" | "jpeg" | "png")) {
            let meta = e.metadata().with_context(|| format!("reading {}", p.display()))?;
            bytes += meta.len();
            newest = newest.max(mtime_ns(&meta));
            files.push(p);
        }
    }
    if files.is_empty() {
        bail!("CIFAR-10 image folder: no .jpg or .png images in {}", dir.display());
    }
    files.sort();
    Ok((files, bytes, newest))
}

fn mtime_ns(meta: &std::fs::Metadata) -> u128 {
    meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos())
}

/// Reads one split of the image-folder layout (`split_dir` = `<dir>/train` or `<dir>/test`),
/// from the cache under `cache_root` when it holds this folder with the same files (count, total
/// size, newest modification time), else by decoding every image (in parallel) and caching the
/// result.
pub fn load_folder_split(split_dir: &Path, cache_root: &Path) -> anyhow::Result<RawSplit> {
    read_folder_split(split_dir, cache_root).map(|(split, _)| split)
}

/// [`load_folder_split`], with the cache file and its key (`None` where no cache can be kept).
fn read_folder_split(split_dir: &Path, cache_root: &Path) -> anyhow::Result<(RawSplit, Option<(PathBuf, String)>)> {
    let (mut files, mut labels, mut bytes, mut newest) = (Vec::new(), Vec::new(), 0u64, 0u128);
    for (label, class) in CLASSES.iter().enumerate() {
        let (f, b, t) = class_files(&split_dir.join(class))?;
        labels.extend(std::iter::repeat_n(label as u8, f.len()));
        files.extend(f);
        bytes += b;
        newest = newest.max(t);
    }
    let n = files.len();
    let identity = format!("cifar10-folder v1\n{}", canonical(split_dir).display());
    let key = format!("{identity}\n{n} files, {bytes} bytes, newest mtime {newest} ns");
    let cache = cache_path(cache_root, "cifar10-folder", &identity);
    if let Some(payload) = cache.as_deref().and_then(|p| read_cache(p, &key)) {
        if payload.len() == n * RECORD_BYTES {
            let mut pixels = payload;
            let cached_labels = pixels.split_off(n * IMAGE_BYTES);
            if cached_labels == labels {
                return Ok((RawSplit { labels, pixels }, cache.map(|p| (p, key))));
            }
        }
    }
    let pixels = decode_parallel(&files)?;
    if let Some(p) = &cache {
        let mut payload = pixels.clone();
        payload.extend_from_slice(&labels);
        write_cache(p, &key, &payload);
    }
    Ok((RawSplit { labels, pixels }, cache.map(|p| (p, key))))
}

/// Decodes 32×32 images into channel-major bytes, on all cores (at least 2 threads).
fn decode_parallel(files: &[PathBuf]) -> anyhow::Result<Vec<u8>> {
    let mut pixels = vec![0u8; files.len() * IMAGE_BYTES];
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2).max(2);
    let per = files.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let workers: Vec<_> = files
            .chunks(per)
            .zip(pixels.chunks_mut(per * IMAGE_BYTES))
            .map(|(fs, out)| {
                s.spawn(move || -> anyhow::Result<()> {
                    for (f, o) in fs.iter().zip(out.chunks_exact_mut(IMAGE_BYTES)) {
                        decode_image(f, o)?;
                    }
                    Ok(())
                })
            })
            .collect();
        workers.into_iter().try_for_each(|w| w.join().expect("an image decoding thread panicked"))
    })?;
    Ok(pixels)
}

fn decode_image(path: &Path, out: &mut [u8]) -> anyhow::Result<()> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let ext = path.extension().and_then(|x| x.to_str()).map(str::to_ascii_lowercase);
    let decoded = match ext.as_deref() {
        Some("png") => image::load_from_memory_with_format(&bytes, image::ImageFormat::Png),
        Some("jpg" | "jpeg") => image::load_from_memory_with_format(&bytes, image::ImageFormat::Jpeg),
        _ => image::load_from_memory(&bytes),
    };
    let img = decoded.map_err(|e| anyhow!("{}: cannot decode the image: {e}", path.display()))?;
    if (img.width(), img.height()) != (32, 32) {
        bail!("{}: the image is {}×{}, CIFAR-10 images are 32×32", path.display(), img.width(), img.height());
    }
    let rgb = img.into_rgb8();
    for (p, px) in rgb.pixels().enumerate() {
        out[p] = px[0];
        out[1024 + p] = px[1];
        out[2048 + p] = px[2];
    }
    Ok(())
}

/// Flips (horizontally, if `flip`) and shifts one channel-major image: output pixel `(y, x)` is
/// input pixel `(y + dy, x' + dx)` with `x' = 31 − x` when flipped, zero outside the image. With
/// `dx, dy ∈ −4..=4` this is a random 32×32 crop of the image zero-padded by 4, then a flip.
pub fn flip_shift(img: &[u8], out: &mut [u8], flip: bool, dx: i32, dy: i32) {
    for c in 0..3 {
        let (src, dst) = (&img[c * 1024..(c + 1) * 1024], &mut out[c * 1024..(c + 1) * 1024]);
        for y in 0..32i32 {
            for x in 0..32i32 {
                let (sy, sx) = (y + dy, if flip { 31 - x } else { x } + dx);
                let v = if (0..32).contains(&sy) && (0..32).contains(&sx) { src[(sy * 32 + sx) as usize] } else { 0 };
                dst[(y * 32 + x) as usize] = v;
            }
        }
    }
}

struct CifarSource {
    /// Images as uint8 `[n, 3, 32, 32]`; converted (and augmented) per batch.
    inner: InMemory,
    normalize: bool,
    augment: Augment,
    seed: u64,
}

impl CifarSource {
    fn augmented(&self, x: &Tensor, index: u64) -> Tensor {
        let n = x.size()[0] as usize;
        let raw = Vec::<u8>::try_from(x.reshape([-1])).expect("uint8 images");
        let mut out = vec![0u8; raw.len()];
        for (i, (img, o)) in raw.chunks_exact(IMAGE_BYTES).zip(out.chunks_exact_mut(IMAGE_BYTES)).enumerate() {
            let mut rng = rng_for(self.seed, &[0xF11B, index, i as u64]);
            let flip = rng.gen_bool(0.5);
            let (dx, dy) = (rng.gen_range(-4..=4), rng.gen_range(-4..=4));
            flip_shift(img, o, flip, dx, dy);
        }
        Tensor::from_slice(&out).reshape([n as i64, 3, 32, 32])
    }
}

impl DataSource for CifarSource {
    fn files(&self) -> Vec<PathBuf> {
        self.inner.files()
    }

    fn train_batch(&self, index: u64) -> anyhow::Result<Batch> {
        let b = self.inner.train_batch(index)?;
        let x = match self.augment {
            Augment::None => b.input,
            Augment::FlipCrop => self.augmented(&b.input, index),
        };
        Ok(Batch { input: x, target: b.target })
    }
    /// uint8 → `x/255`, then the per-channel CIFAR-10 statistics if `normalize`.
    fn input_transform(&self) -> InputTransform {
        if self.normalize {
            InputTransform::Pixels { mean: MEAN.map(f64::from).to_vec(), std: STD.map(f64::from).to_vec() }
        } else {
            InputTransform::Pixels { mean: vec![0.0], std: vec![1.0] }
        }
    }
    /// Host-side augmentation needs the pixels on the host; without it the set moves.
    fn make_resident(&mut self, device: Device) -> bool {
        self.augment == Augment::None && self.inner.make_resident(device)
    }
    fn batches_per_epoch(&self) -> u64 {
        self.inner.batches_per_epoch()
    }
    fn eval_batches(&self) -> Vec<Batch> {
        self.inner.eval_batches()
    }
    fn eval_record(&self) -> Option<serde_yaml::Mapping> {
        self.inner.eval_record()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flip_shift_moves_pixels_and_pads_with_zero() {
        let img: Vec<u8> = (0..IMAGE_BYTES).map(|i| (i % 251) as u8 + 1).collect();
        let mut out = vec![0u8; IMAGE_BYTES];
        flip_shift(&img, &mut out, false, 0, 0);
        assert_eq!(out, img);
        flip_shift(&img, &mut out, true, 0, 0);
        assert_eq!(out[0], img[31]);
        assert_eq!(out[1024 + 32 + 5], img[1024 + 32 + 26]);
        flip_shift(&img, &mut out, false, 4, -4);
        assert_eq!(out[0], 0, "top rows come from the padding");
        assert_eq!(out[4 * 32], img[4], "(4, 0) reads (0, 4)");
        assert_eq!(out[4 * 32 + 28], 0, "right columns come from the padding");
    }

    #[test]
    fn classes_accept_names_and_indices_and_reject_others() {
        let v = |s: &str| serde_yaml::from_str::<Vec<serde_yaml::Value>>(s).unwrap();
        assert_eq!(parse_classes(&v("[cat, dog]")).unwrap(), vec![3, 5]);
        assert_eq!(parse_classes(&v("[9, airplane]")).unwrap(), vec![9, 0]);
        assert_eq!(parse_classes(&v("[cat, puma]")).unwrap_err().key, "classes[1]");
        assert_eq!(parse_classes(&v("[10]")).unwrap_err().key, "classes[0]");
        assert_eq!(parse_classes(&v("[3, cat]")).unwrap_err().key, "classes[1]");
        assert!(parse_classes(&v("[]")).is_err());
    }
}
