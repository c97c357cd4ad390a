//! Real-dataset loaders: CIFAR-10 (official binary batches and image folder), MNIST-family IDX
//! files, text corpora. Formats and errors are checked on small files written here; the real
//! data comes from the shared data folder (`$PLEXUS_DATA`, else `../shared/data` next to the
//! repository). See [`shared`] for what happens when a dataset is missing.
//!
//! Run with `--nocapture` to see load times.

use plexus::data::{self, cifar, idx, text, Batch, DataSource, DataSpec, Task};
use std::path::{Path, PathBuf};
use std::time::Instant;
use tch::{Kind, Tensor};

/// The data root holding `dataset` (`cifar10`, `fashion-mnist` or `text`): `$PLEXUS_DATA` (which
/// `scripts/test.sh` sets, see `scripts/fetch-data.sh`), else `../shared/data` next to the
/// repository. Fashion-MNIST is always fetched by the test script. CIFAR-10 and the text corpora
/// are large downloads with no package-registry source: where a shared data folder sits next to
/// the clone (development and CI machines) a missing one fails the test; on a user's machine
/// without one the test says loudly that it did not run and why, and returns `None`.
///
/// Every test that calls this is `#[ignore = "needs real data: DATASET"]`: the fast tier
/// (`cargo test --release`) leaves it out, and `scripts/test.sh` runs it, or — where DATASET is
/// absent and there is no shared data folder — passes `--skip NAME` and lists it as skipped, so the
/// runner never reports it as passed.
fn shared(dataset: &str) -> Option<PathBuf> {
    let dir = match std::env::var_os(data::DATA_ENV) {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data"),
    };
    if dir.join(dataset).is_dir() {
        return Some(dir);
    }
    let msg = format!(
        "this real-data test needs {dataset}/ under the data root {} (set {} to a folder holding it; docs/setup-and-data.md, Data)",
        dir.display(),
        data::DATA_ENV
    );
    // Fashion-MNIST is always there (the test script fetches it); the others must be wherever a
    // shared data folder sits next to the clone, as on the development and CI machines.
    let shared_folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data").is_dir();
    if dataset == "fashion-mnist" || shared_folder {
        panic!("{msg}");
    }
    eprintln!("NOT RUN: {msg}");
    None
}

fn yaml(s: &str) -> serde_yaml::Mapping {
    serde_yaml::from_str(s).unwrap()
}

/// A registry spec reading from `root` (via the `root` option, or `$PLEXUS_DATA` when set).
fn registry(kind: &str, root: &Path, options: &str) -> Box<dyn DataSpec> {
    let mut m = yaml(options);
    m.insert("root".into(), root.to_str().unwrap().into());
    data::parse(kind, &m).unwrap_or_else(|e| panic!("{e:?}"))
}

/// A loaded dataset whose batches come out as the model sees them: raw batches (uint8 pixels for
/// images) with the dataset's input transform applied, as the trainer does on its device.
struct Ready(Box<dyn DataSource>, plexus::data::DeviceTransform);

impl Ready {
    fn ready(&self, b: Batch) -> Batch {
        Batch { input: self.1.apply(&b.input), target: b.target }
    }
    fn train_batch(&self, i: u64) -> Batch {
        self.ready(self.0.train_batch(i).unwrap_or_else(|e| panic!("{e:#}")))
    }
    fn eval_batches(&self) -> Vec<Batch> {
        self.0.eval_batches().into_iter().map(|b| self.ready(b)).collect()
    }
    fn batches_per_epoch(&self) -> u64 {
        self.0.batches_per_epoch()
    }
}

fn load(spec: &dyn DataSpec) -> Ready {
    let src = spec.load().unwrap_or_else(|e| panic!("{e:#}"));
    let t = src.input_transform().on(tch::Device::Cpu);
    Ready(src, t)
}

fn load_err(spec: &dyn DataSpec) -> String {
    match spec.load() {
        Ok(_) => panic!("expected {spec:?} to fail to load"),
        Err(e) => format!("{e:#}"),
    }
}

fn timed<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let out = f();
    eprintln!("[time] {what}: {:.2} s", t.elapsed().as_secs_f64());
    out
}

fn longs(t: &Tensor) -> Vec<i64> {
    Vec::<i64>::try_from(t.reshape([-1]).to_kind(Kind::Int64)).unwrap()
}

fn floats(t: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(t.reshape([-1]).to_kind(Kind::Float)).unwrap()
}

fn same(a: &Batch, b: &Batch) -> bool {
    a.input.equal(&b.input) && a.target.equal(&b.target)
}

// ---------------------------------------------------------------- CIFAR-10, official binary

/// One record: label, then R, G and B planes filled with `r`, `g`, `b`, except pixel (0, 1) of
/// the red plane, which is 7 (to check row-major order).
fn record(label: u8, r: u8, g: u8, b: u8) -> Vec<u8> {
    let mut rec = vec![label];
    for v in [r, g, b] {
        rec.extend(std::iter::repeat_n(v, 1024));
    }
    rec[1 + 1] = 7;
    rec
}

const TRAIN_LABELS: [u8; 5] = [3, 1, 4, 1, 5];

/// A complete `cifar-10-batches-bin/` (10,000 records per file, as the official one): every
/// record of training file `f` has label `TRAIN_LABELS[f]` and red value `10 + f`; the test
/// records alternate two distinct records.
fn write_binary(root: &Path) -> PathBuf {
    let dir = root.join("cifar10").join("cifar-10-batches-bin");
    std::fs::create_dir_all(&dir).unwrap();
    for (i, &label) in TRAIN_LABELS.iter().enumerate() {
        let r = 10 + i as u8;
        let file = record(label, r, 100 + r, 200 + r).repeat(cifar::RECORDS_PER_FILE);
        std::fs::write(dir.join(format!("data_batch_{}.bin", i + 1)), file).unwrap();
    }
    let mut pair = record(9, 50, 60, 70);
    pair.extend(record(0, 80, 90, 250));
    std::fs::write(dir.join("test_batch.bin"), pair.repeat(cifar::RECORDS_PER_FILE / 2)).unwrap();
    dir
}

#[test]
fn cifar_binary_records_give_labels_pixels_and_channel_order() {
    let tmp = tempfile::tempdir().unwrap();
    write_binary(tmp.path());
    let spec = data::parse_at("cifar10", tmp.path(), &yaml("{normalize: false, batch_size: 5}")).unwrap();
    assert_eq!(spec.info().input_shape, vec![3, 32, 32]);
    assert_eq!(spec.info().output_dim, 10);
    assert_eq!(spec.info().task, Task::Classification);
    let src = load(spec.as_ref());
    assert_eq!(src.batches_per_epoch(), 10_000, "50,000 records in batches of 5");
    let b = src.train_batch(0);
    assert_eq!(b.input.size(), vec![5, 3, 32, 32]);
    assert_eq!(b.input.kind(), Kind::Float);
    assert_eq!(b.target.kind(), Kind::Int64);
    // The epoch is a permutation: recover each sample's file from its red value.
    let mut seen: Vec<(i64, u8)> = Vec::new();
    for (i, label) in longs(&b.target).into_iter().enumerate() {
        let px = floats(&b.input.get(i as i64));
        let r = (px[0] * 255.0).round() as u8;
        let file = (r - 10) as usize;
        assert_eq!(label, TRAIN_LABELS[file] as i64, "label of the record in data_batch_{}.bin", file + 1);
        assert_eq!((px[1] * 255.0).round() as u8, 7, "pixel (0, 1) of the red plane");
        assert_eq!((px[1024] * 255.0).round() as u8, 100 + r, "green plane");
        assert_eq!((px[2048 + 1] * 255.0).round() as u8, 200 + r, "blue plane");
        assert_eq!((px[3071] * 255.0).round() as u8, 200 + r);
        seen.push((label, r));
    }
    // Every file contributes (the epoch is a permutation of all five).
    for i in 1..200 {
        let b = src.train_batch(i);
        for (label, px) in longs(&b.target).into_iter().zip(floats(&b.input).chunks(3072)) {
            seen.push((label, (px[0] * 255.0).round() as u8));
        }
    }
    seen.sort();
    seen.dedup();
    assert_eq!(seen, vec![(1, 11), (1, 13), (3, 10), (4, 12), (5, 14)]);
    // The test split is evaluated in file order.
    let ev = src.eval_batches();
    assert_eq!(ev.len(), 2_000);
    assert_eq!(longs(&ev[0].target), vec![9, 0, 9, 0, 9]);
    let px = floats(&ev[0].input);
    assert_eq!([px[0], px[1024], px[2048]].map(|v| (v * 255.0).round() as u8), [50, 60, 70]);
    assert_eq!([px[3072], px[3072 + 1024], px[3072 + 2048]].map(|v| (v * 255.0).round() as u8), [80, 90, 250]);

    // Normalisation uses the CIFAR-10 channel statistics.
    let src = load(data::parse_at("cifar10", tmp.path(), &yaml("{}")).unwrap().as_ref());
    let px = floats(&src.eval_batches()[0].input);
    for (c, v) in [50.0f32, 60.0, 70.0].into_iter().enumerate() {
        let want = (v / 255.0 - cifar::MEAN[c]) / cifar::STD[c];
        assert!((px[c * 1024] - want).abs() < 1e-5, "channel {c}: {} vs {want}", px[c * 1024]);
    }

    // A class subset remaps labels in the order given: [cat, automobile] keeps 3 of 5 files.
    let spec = data::parse_at("cifar10", tmp.path(), &yaml("{classes: [cat, 1], batch_size: 64}")).unwrap();
    assert_eq!(spec.info().output_dim, 2);
    let src = load(spec.as_ref());
    assert_eq!(src.batches_per_epoch(), 30_000 / 64);
    let mut labels = longs(&src.train_batch(0).target);
    labels.sort();
    labels.dedup();
    assert_eq!(labels, vec![0, 1]);
}

#[test]
fn cifar_binary_truncated_file_and_bad_label_name_file_and_offset() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = write_binary(tmp.path());
    let spec = data::parse_at("cifar10", tmp.path(), &yaml("{}")).unwrap();

    let mut bytes = record(2, 1, 2, 3);
    bytes.extend(record(2, 1, 2, 3));
    bytes.extend(vec![0u8; 100]);
    std::fs::write(dir.join("data_batch_3.bin"), &bytes).unwrap();
    let e = load_err(spec.as_ref());
    assert!(e.contains("data_batch_3.bin") && e.contains("offset 6146") && e.contains("truncated"), "{e}");

    let mut bytes = record(2, 1, 2, 3).repeat(cifar::RECORDS_PER_FILE);
    bytes[3073] = 10;
    std::fs::write(dir.join("data_batch_3.bin"), &bytes).unwrap();
    let e = load_err(spec.as_ref());
    assert!(e.contains("data_batch_3.bin") && e.contains("offset 3073") && e.contains("label"), "{e}");

    std::fs::remove_file(dir.join("data_batch_3.bin")).unwrap();
    let e = load_err(spec.as_ref());
    assert!(e.contains("data_batch_3.bin"), "{e}");
}

/// Every expected file must be present and complete: an empty training batch would silently
/// train on 4/5 of the data, an empty test batch would silently skip evaluation.
#[test]
fn cifar_binary_empty_or_short_files_are_errors_not_smaller_splits() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = write_binary(tmp.path());
    let spec = data::parse_at("cifar10", tmp.path(), &yaml("{}")).unwrap();
    let full = std::fs::read(dir.join("data_batch_3.bin")).unwrap();
    std::fs::write(dir.join("data_batch_3.bin"), b"").unwrap();
    let e = load_err(spec.as_ref());
    assert!(e.contains("data_batch_3.bin") && e.contains("0 bytes") && e.contains("10000 records"), "{e}");
    // A whole number of records but fewer than the official 10,000.
    std::fs::write(dir.join("data_batch_3.bin"), &full[..9_999 * 3073]).unwrap();
    let e = load_err(spec.as_ref());
    assert!(e.contains("data_batch_3.bin") && e.contains("9999 records") && e.contains("offset 30726927"), "{e}");
    std::fs::write(dir.join("data_batch_3.bin"), &full).unwrap();
    std::fs::write(dir.join("test_batch.bin"), b"").unwrap();
    let e = load_err(spec.as_ref());
    assert!(e.contains("test_batch.bin") && e.contains("incomplete"), "{e}");
}

#[test]
fn missing_datasets_say_where_plexus_looked() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().display().to_string();
    let e = load_err(data::parse_at("cifar10", tmp.path(), &yaml("{}")).unwrap().as_ref());
    assert!(e.contains("CIFAR-10 not found") && e.contains(&root), "{e}");
    assert!(
        e.contains("cifar-10-batches-bin") && e.contains("https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz")
    );
    let e = load_err(data::parse_at("cifar10", tmp.path(), &yaml("{format: folder}")).unwrap().as_ref());
    assert!(e.contains(&format!("{root}/cifar10/{{train,test}}")), "{e}");

    let e = load_err(data::parse_at("mnist", tmp.path(), &yaml("{}")).unwrap().as_ref());
    assert!(e.contains(&format!("{root}/fashion-mnist/train-images-idx3-ubyte")), "{e}");
    assert!(e.contains("https://github.com/zalandoresearch/fashion-mnist") && e.contains("dataset-fashion-mnist"));

    let e = load_err(data::parse_at("text", tmp.path(), &yaml("{file: text/nope.txt}")).unwrap().as_ref());
    assert!(e.contains(&format!("{root}/text/nope.txt")), "{e}");
}

#[test]
fn options_are_validated() {
    let err = |kind: &str, s: &str| data::parse(kind, &yaml(s)).unwrap_err();
    assert_eq!(err("cifar10", "{clases: [cat]}").key, "clases");
    assert_eq!(err("cifar10", "{classes: [cat, puma]}").key, "classes[1]");
    assert_eq!(err("cifar10", "{classes: [cat, 3]}").key, "classes[1]");
    assert_eq!(err("cifar10", "{augment: mixup}").key, "augment");
    assert_eq!(err("cifar10", "{format: tar}").key, "format");
    assert_eq!(err("cifar10", "{train_samples: 0}").key, "train_samples");
    assert_eq!(err("mnist", "{dataset: ../x}").key, "dataset");
    assert_eq!(err("text", "{seq_len: 8}").key, "", "file is required");
    assert_eq!(err("text", "{file: a.txt, tokenizer: bpe}").key, "tokenizer");
    assert_eq!(err("text", "{file: a.txt, val_fraction: 1.0}").key, "val_fraction");
    // `info()` needs no files.
    let info = data::parse("text", &yaml("{file: missing.txt, tokenizer: gpt2, seq_len: 32}")).unwrap().info();
    assert_eq!((info.input_shape, info.output_dim, info.task), (vec![32], 50304, Task::LanguageModel));
    let info = data::parse("cifar10", &yaml("{classes: [cat, dog]}")).unwrap().info();
    assert_eq!(info.output_dim, 2);
}

// ---------------------------------------------------------------- CIFAR-10, image folder

/// A 32×32 image with red `r`, green `g`, blue `b`, and red 7 at pixel (0, 1).
fn image_of(r: u8, g: u8, b: u8) -> image::RgbImage {
    image::RgbImage::from_fn(
        32,
        32,
        |x, y| if (x, y) == (1, 0) { image::Rgb([7, g, b]) } else { image::Rgb([r, g, b]) },
    )
}

#[test]
fn cifar_folder_layout_decodes_in_class_order_and_caches() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cifar10");
    for (split, per_class) in [("train", 2u8), ("test", 1)] {
        for (c, class) in cifar::CLASSES.iter().enumerate() {
            let d = dir.join(split).join(class);
            std::fs::create_dir_all(&d).unwrap();
            for k in 0..per_class {
                image_of(10 * c as u8 + k, 100 + k, 200).save(d.join(format!("{k:04}.png"))).unwrap();
            }
        }
    }
    std::fs::write(dir.join("train/cat/notes.txt"), "not an image").unwrap();
    let spec = data::parse_at("cifar10", tmp.path(), &yaml("{normalize: false, batch_size: 20}")).unwrap();
    let src = load(spec.as_ref());
    assert_eq!(src.batches_per_epoch(), 1);
    let b = src.train_batch(0);
    assert_eq!(b.input.size(), vec![20, 3, 32, 32]);
    for (i, label) in longs(&b.target).into_iter().enumerate() {
        let px: Vec<u8> = floats(&b.input.get(i as i64)).iter().map(|v| (v * 255.0).round() as u8).collect();
        assert_eq!(px[0] / 10, label as u8, "red encodes the class");
        let k = px[0] % 10;
        assert_eq!((px[1], px[1024], px[2048 + 5]), (7, 100 + k, 200), "channel-major, row-major");
    }
    let ev = src.eval_batches();
    assert_eq!(longs(&ev[0].target), (0..10).collect::<Vec<i64>>(), "test split in class order");
    let cache = tmp.path().join(".plexus-cache");
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 2, "train and test decoded into the cache");
    let again = load(spec.as_ref());
    assert!(same(&again.train_batch(0), &b) && same(&again.eval_batches()[0], &ev[0]), "the cache gives the same data");

    // A changed folder (a file more) is decoded again, not served from the stale cache.
    image_of(250, 0, 0).save(dir.join("train/truck/0002.png")).unwrap();
    let spec21 = data::parse_at("cifar10", tmp.path(), &yaml("{normalize: false, batch_size: 21}")).unwrap();
    let t = longs(&load(spec21.as_ref()).train_batch(0).target);
    assert_eq!(t.iter().filter(|&&l| l == 9).count(), 3);

    std::fs::write(dir.join("train/dog/0000.png"), b"garbage").unwrap();
    let e = load_err(spec.as_ref());
    assert!(e.contains("train/dog/0000.png") && e.contains("decode"), "{e}");
    image_of(50, 100, 200).save(dir.join("train/dog/0000.png")).unwrap();
    std::fs::remove_dir_all(dir.join("test/frog")).unwrap();
    let e = load_err(spec.as_ref());
    assert!(e.contains("test/frog"), "{e}");
}

#[test]
#[ignore = "needs real data: cifar10"]
fn cifar_folder_on_shared_data() {
    let Some(root) = shared("cifar10") else { return };
    let (train, test) = timed("CIFAR-10 folder, raw train+test (decode or cache)", || {
        cifar::load_raw(&root, cifar::Format::Folder).unwrap_or_else(|e| panic!("{e:#}"))
    });
    let (train2, _) = timed("CIFAR-10 folder, raw train+test again (cache)", || {
        cifar::load_raw(&root, cifar::Format::Auto).unwrap_or_else(|e| panic!("{e:#}"))
    });
    assert!(train2 == train, "the cached decode equals the decode");
    drop(train2);
    assert_eq!((train.len(), test.len()), (50_000, 10_000));
    assert_eq!(train.pixels.len(), 50_000 * 3072);
    for c in 0..10u8 {
        assert_eq!(train.labels.iter().filter(|&&l| l == c).count(), 5000, "class {c}");
        assert_eq!(test.labels.iter().filter(|&&l| l == c).count(), 1000, "class {c}");
    }
    // Real images, not blank: the mean red value of CIFAR-10 is about 0.49 · 255.
    let red: f64 = (0..1000).map(|i| train.image(i)[..1024].iter().map(|&v| v as f64).sum::<f64>()).sum::<f64>();
    let red = red / (1000.0 * 1024.0 * 255.0);
    assert!((red - 0.49).abs() < 0.05, "mean red {red}");

    // Whole dataset through the registry: normalised inputs, deterministic batches.
    let spec = registry("cifar10", &root, "{}");
    let src = timed("CIFAR-10 folder, spec load (cache)", || load(spec.as_ref()));
    assert_eq!(src.batches_per_epoch(), 50_000 / 64);
    let ev = src.eval_batches();
    assert_eq!(ev.iter().map(|b| b.target.size()[0]).sum::<i64>(), 10_000);
    let (b7, b8) = (src.train_batch(7), src.train_batch(8));
    assert_eq!(b7.input.size(), vec![64, 3, 32, 32]);
    assert!(same(&b7, &src.train_batch(7)), "same index, same batch");
    assert!(!b7.input.equal(&b8.input), "different indices differ");
    let big = src.train_batch(781 + 3); // second epoch
    assert!(!same(&big, &src.train_batch(3)), "epochs are reshuffled");
    let mean = floats(&b7.input.mean_dim([0, 2, 3].as_slice(), false, Kind::Float));
    assert!(mean.iter().all(|m| m.abs() < 0.3), "normalised channel means {mean:?}");

    // Augmentation: same shape and labels, deterministic, different from the plain batch.
    let aug = load(registry("cifar10", &root, "{augment: flip_crop}").as_ref());
    let a7 = aug.train_batch(7);
    assert_eq!(a7.input.size(), vec![64, 3, 32, 32]);
    assert!(same(&a7, &aug.train_batch(7)));
    assert!(a7.target.equal(&b7.target) && !a7.input.equal(&b7.input));
    assert!(same(&aug.eval_batches()[0], &ev[0]), "evaluation is not augmented");

    // CIFAR-2 [cat, dog]: 10,000 training images, labels {0, 1} in the order given.
    let spec = registry("cifar10", &root, "{classes: [cat, dog], normalize: false, batch_size: 10000}");
    assert_eq!(spec.info().output_dim, 2);
    let two = load(spec.as_ref());
    assert_eq!(two.batches_per_epoch(), 1);
    let t = longs(&two.train_batch(0).target);
    assert_eq!(t.len(), 10_000);
    assert_eq!(t.iter().filter(|&&l| l == 0).count(), 5000);
    assert_eq!(t.iter().filter(|&&l| l == 1).count(), 5000);
    let ev = two.eval_batches();
    assert_eq!(longs(&ev[0].target).len(), 2000);
    // The first test image kept is the first cat of the test split, now label 0.
    let first_cat = test.labels.iter().position(|&l| l == 3).unwrap();
    assert_eq!(longs(&ev[0].target)[0], 0);
    let px: Vec<u8> = floats(&ev[0].input.get(0)).iter().map(|v| (v * 255.0).round() as u8).collect();
    assert_eq!(px, test.image(first_cat));

    // Caps: the first N of a seeded permutation.
    let capped = load(registry("cifar10", &root, "{train_samples: 640, eval_samples: 100, batch_size: 64}").as_ref());
    assert_eq!(capped.batches_per_epoch(), 10);
    assert_eq!(capped.eval_batches().iter().map(|b| b.target.size()[0]).sum::<i64>(), 100);
}

// ---------------------------------------------------------------- IDX (Fashion-MNIST)

#[test]
#[ignore = "needs real data: fashion-mnist"]
fn fashion_mnist_on_shared_data() {
    let root = shared("fashion-mnist").unwrap();
    let dir = root.join("fashion-mnist");
    let train = timed("Fashion-MNIST raw train", || idx::load_split(&dir, "train", "fashion-mnist").unwrap());
    let test = idx::load_split(&dir, "t10k", "fashion-mnist").unwrap();
    assert_eq!((train.len(), test.len()), (60_000, 10_000));
    assert_eq!(train.pixels.len(), 60_000 * 784);
    for c in 0..10u8 {
        assert_eq!(train.labels.iter().filter(|&&l| l == c).count(), 6000, "class {c}");
        assert_eq!(test.labels.iter().filter(|&&l| l == c).count(), 1000, "class {c}");
    }

    let spec = registry("mnist", &root, "{batch_size: 1000}");
    assert_eq!(spec.info().input_shape, vec![1, 28, 28]);
    assert_eq!(spec.info().output_dim, 10);
    let src = timed("Fashion-MNIST spec load", || load(spec.as_ref()));
    assert_eq!(src.batches_per_epoch(), 60);
    let ev = src.eval_batches();
    assert_eq!(ev.len(), 10);
    assert_eq!(longs(&ev[0].target), test.labels[..1000].iter().map(|&l| l as i64).collect::<Vec<_>>());
    let b = src.train_batch(4);
    assert_eq!(b.input.size(), vec![1000, 1, 28, 28]);
    assert!(same(&b, &src.train_batch(4)) && !b.input.equal(&src.train_batch(5).input));
    let (m, s) = (b.input.mean(Kind::Float).double_value(&[]), b.input.std(true).double_value(&[]));
    assert!(m.abs() < 0.1 && (s - 1.0).abs() < 0.1, "normalised mean {m}, std {s}");
    let labels = longs(&b.target);
    assert!(labels.iter().all(|&l| (0..10).contains(&l)));

    let raw = load(registry("mnist", &root, "{normalize: false, batch_size: 10, eval_samples: 25}").as_ref());
    let ev = raw.eval_batches();
    assert_eq!(ev.iter().map(|b| b.target.size()[0]).collect::<Vec<_>>(), vec![10, 10, 5]);
    let px = floats(&ev[0].input);
    assert!(px.iter().all(|&v| (0.0..=1.0).contains(&v)));
}

fn idx_header(magic: u32, dims: &[u32]) -> Vec<u8> {
    let mut h = magic.to_be_bytes().to_vec();
    for d in dims {
        h.extend(d.to_be_bytes());
    }
    h
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

#[test]
#[ignore = "needs real data: fashion-mnist"]
fn idx_copies_load_and_corruptions_name_file_and_offset() {
    // A small copy of the real data: the first 30 training and 20 test samples.
    let real = shared("fashion-mnist").unwrap().join("fashion-mnist");
    let train = idx::load_split(&real, "train", "fashion-mnist").unwrap();
    let test = idx::load_split(&real, "t10k", "fashion-mnist").unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("fashion-mnist");
    std::fs::create_dir_all(&dir).unwrap();
    let write = |prefix: &str, s: &idx::IdxSplit, n: usize, gz: bool| {
        let mut images = idx_header(2051, &[n as u32, 28, 28]);
        images.extend(&s.pixels[..n * 784]);
        let mut labels = idx_header(2049, &[n as u32]);
        labels.extend(&s.labels[..n]);
        let ext = if gz { ".gz" } else { "" };
        let f = |b: &[u8]| if gz { gzip(b) } else { b.to_vec() };
        std::fs::write(dir.join(format!("{prefix}-images-idx3-ubyte{ext}")), f(&images)).unwrap();
        std::fs::write(dir.join(format!("{prefix}-labels-idx1-ubyte{ext}")), f(&labels)).unwrap();
    };
    write("train", &train, 30, false);
    write("t10k", &test, 20, true);
    let spec = data::parse_at("mnist", tmp.path(), &yaml("{batch_size: 10, normalize: false}")).unwrap();
    let src = load(spec.as_ref());
    assert_eq!(src.batches_per_epoch(), 3);
    let ev = src.eval_batches();
    assert_eq!(longs(&ev[1].target), test.labels[10..20].iter().map(|&l| l as i64).collect::<Vec<_>>());
    let px: Vec<u8> = floats(&ev[0].input.get(3)).iter().map(|v| (v * 255.0).round() as u8).collect();
    assert_eq!(px, &test.pixels[3 * 784..4 * 784]);
    // `dataset` may be an absolute folder (read wherever the root is), but not climb out of the root.
    let elsewhere = data::parse_at(
        "mnist",
        Path::new("/nonexistent"),
        &yaml(&format!("{{batch_size: 10, dataset: {}}}", dir.display())),
    );
    assert_eq!(load(elsewhere.unwrap().as_ref()).batches_per_epoch(), 3);
    let e = data::parse_at("mnist", tmp.path(), &yaml("{dataset: ../fashion-mnist}")).unwrap_err();
    assert!(e.key == "dataset" && e.allowed.contains("no `..`") && e.allowed.contains("absolute path"), "{e:?}");

    let images = dir.join("train-images-idx3-ubyte");
    let good = std::fs::read(&images).unwrap();
    let mut bad = good.clone();
    bad[3] = 0x01; // 2049: a label file's magic
    std::fs::write(&images, &bad).unwrap();
    let e = load_err(spec.as_ref());
    assert!(e.contains("train-images-idx3-ubyte") && e.contains("magic") && e.contains("byte offset 0"), "{e}");

    std::fs::write(&images, &good[..16 + 5 * 784 + 100]).unwrap();
    let e = load_err(spec.as_ref());
    assert!(e.contains("train-images-idx3-ubyte") && e.contains("byte offset 4036") && e.contains("image 5"), "{e}");

    std::fs::write(&images, &good).unwrap();
    let labels = dir.join("train-labels-idx1-ubyte");
    let mut l = std::fs::read(&labels).unwrap();
    l[8 + 7] = 12;
    std::fs::write(&labels, &l).unwrap();
    let e = load_err(spec.as_ref());
    assert!(e.contains("train-labels-idx1-ubyte") && e.contains("byte offset 15"), "{e}");

    l[8 + 7] = 1;
    l.pop();
    l[7] = 29;
    std::fs::write(&labels, &l).unwrap();
    let e = load_err(spec.as_ref());
    assert!(e.contains("30 images") && e.contains("29 labels"), "{e}");

    // A truncated gzip stream.
    let gz = dir.join("t10k-images-idx3-ubyte.gz");
    std::fs::write(&labels, {
        let mut l = idx_header(2049, &[30]);
        l.extend(&train.labels[..30]);
        l
    })
    .unwrap();
    let z = std::fs::read(&gz).unwrap();
    std::fs::write(&gz, &z[..z.len() / 2]).unwrap();
    let e = load_err(spec.as_ref());
    assert!(e.contains("t10k-images-idx3-ubyte.gz") && e.contains("offset"), "{e}");
}

// ---------------------------------------------------------------- text

#[test]
#[ignore = "needs real data: text"]
fn text_char_tokens_are_the_bytes_of_the_file() {
    let Some(root) = shared("text") else { return };
    let bytes = std::fs::read(root.join("text/tinyshakespeare.txt")).unwrap();
    let spec = registry("text", &root, "{file: text/tinyshakespeare.txt, tokenizer: char, seq_len: 64, batch_size: 8}");
    let info = spec.info();
    assert_eq!((info.input_shape, info.output_dim, info.task), (vec![64], 256, Task::LanguageModel));
    let src = timed("text char load (tinyshakespeare)", || load(spec.as_ref()));
    let n_val = (bytes.len() as f64 * 0.1).round() as usize;
    let n_train = bytes.len() - n_val;
    assert_eq!(src.batches_per_epoch(), ((n_train - 1) / (8 * 64)) as u64);
    let b = src.train_batch(11);
    assert_eq!((b.input.size(), b.input.kind(), b.target.kind()), (vec![8, 64], Kind::Int64, Kind::Int64));
    assert!(b.input.narrow(1, 1, 63).equal(&b.target.narrow(1, 0, 63)), "target = input shifted by one");
    assert!(same(&b, &src.train_batch(11)) && !b.input.equal(&src.train_batch(12).input));
    // Each row is a window of the training split.
    let train_text = &bytes[..n_train];
    for r in 0..8 {
        let mut window: Vec<u8> = longs(&b.input.get(r)).into_iter().map(|t| t as u8).collect();
        window.push(*longs(&b.target.get(r)).last().unwrap() as u8);
        assert!(train_text.windows(65).any(|w| w == window.as_slice()), "row {r} is a window of the training text");
    }
    // Evaluation: 8 fixed batches of windows spread evenly over the last 10%.
    let ev = src.eval_batches();
    assert_eq!(ev.len(), 8);
    assert!(ev.iter().all(|e| e.input.size() == vec![8, 64]));
    let first: Vec<u8> = longs(&ev[0].input.get(0)).into_iter().map(|t| t as u8).collect();
    assert_eq!(first, &bytes[n_train..n_train + 64]);
    let end: Vec<u8> = longs(&ev[7].target.get(7)).into_iter().map(|t| t as u8).collect();
    assert_eq!(end, &bytes[bytes.len() - 64..]);
}

#[test]
#[ignore = "needs real data: text"]
fn text_gpt2_tokens_on_shared_data_are_cached_and_batched() {
    let Some(root) = shared("text") else { return };
    let path = root.join("text/tinyshakespeare.txt");
    let tmp = tempfile::tempdir().unwrap();
    // Into a fresh cache (the temporary directory is writable): first tokenisation, then the cache.
    let fresh = timed("text gpt2 tokenisation (tinyshakespeare, no cache)", || {
        text::tokenize_file(&path, text::Tokenizer::Gpt2, tmp.path()).unwrap()
    });
    let cached = timed("text gpt2 tokens (tinyshakespeare, cache)", || {
        text::tokenize_file(&path, text::Tokenizer::Gpt2, tmp.path()).unwrap()
    });
    assert_eq!(fresh, cached);
    assert_eq!(std::fs::read_dir(tmp.path().join(".plexus-cache")).unwrap().count(), 1, "one cache entry");
    assert!((250_000..400_000).contains(&fresh.len()), "{} GPT-2 tokens", fresh.len());
    assert!(fresh.iter().all(|&t| (t as usize) < text::GPT2_VOCAB));
    let head = text::gpt2_encode("First Citizen:\n");
    assert_eq!(&fresh[..head.len()], head.as_slice(), "the file starts with `First Citizen:`");

    let spec = registry("text", &root, "{file: text/tinyshakespeare.txt, tokenizer: gpt2, seq_len: 32, batch_size: 4}");
    assert_eq!(spec.info().output_dim, 50304);
    let src = timed("text gpt2 spec load (tinyshakespeare)", || load(spec.as_ref()));
    let b = src.train_batch(0);
    assert_eq!(b.input.size(), vec![4, 32]);
    assert!(b.input.narrow(1, 1, 31).equal(&b.target.narrow(1, 0, 31)));
    assert!(same(&b, &src.train_batch(0)) && !b.input.equal(&src.train_batch(1).input));
    let row: Vec<u16> = longs(&b.input.get(0)).into_iter().map(|t| t as u16).collect();
    let n_train = fresh.len() - (fresh.len() as f64 * 0.1).round() as usize;
    assert!(fresh[..n_train].windows(32).any(|w| w == row.as_slice()), "a window of the training tokens");
    let ev = src.eval_batches();
    assert_eq!(ev.len(), 8);
    let first: Vec<u16> = longs(&ev[0].input.get(0)).into_iter().map(|t| t as u16).collect();
    assert_eq!(first, &fresh[n_train..n_train + 32]);
}

#[test]
fn text_in_a_temporary_root_and_short_files() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("t.txt"), "abcdefghij".repeat(10)).unwrap();
    let spec =
        data::parse_at("text", tmp.path(), &yaml("{file: t.txt, seq_len: 8, batch_size: 2, eval_batches: 1}")).unwrap();
    let src = load(spec.as_ref());
    let b = src.train_batch(0);
    assert_eq!(b.input.size(), vec![2, 8]);
    assert!(b.input.narrow(1, 1, 7).equal(&b.target.narrow(1, 0, 7)));
    let ev = src.eval_batches();
    assert_eq!(longs(&ev[0].input.get(0)), b"abcdefgh".iter().map(|&c| c as i64).collect::<Vec<_>>());

    let spec = data::parse_at("text", tmp.path(), &yaml("{file: t.txt, seq_len: 95}")).unwrap();
    let e = load_err(spec.as_ref());
    assert!(e.contains("t.txt") && e.contains("seq_len"), "{e}");

    std::fs::write(tmp.path().join("bad.txt"), [b'a', b'b', 0xff, b'c']).unwrap();
    let spec = data::parse_at("text", tmp.path(), &yaml("{file: bad.txt, tokenizer: gpt2, seq_len: 1}")).unwrap();
    let e = load_err(spec.as_ref());
    assert!(e.contains("bad.txt") && e.contains("byte offset 2"), "{e}");
}

// ---------------------------------------------------------------- image folder (ImageNet layout)

/// `<dir>/{train,val}/<class>/…`: three classes of flat-coloured images of various sizes (class
/// `k` is the colour `COLOURS[k]`), PNG and JPEG, with ImageNet-style upper-case extensions.
const COLOURS: [[u8; 3]; 3] = [[250, 10, 10], [10, 250, 10], [10, 10, 250]];

fn image_folder(dir: &Path) {
    for (split, per_class) in [("train", 6), ("val", 3)] {
        for (k, class) in ["n001", "n002", "n003"].iter().enumerate() {
            let d = dir.join(split).join(class);
            std::fs::create_dir_all(&d).unwrap();
            for i in 0..per_class {
                let (w, h) = (40 + 13 * i as u32, 30 + 7 * k as u32);
                let img = image::RgbImage::from_pixel(w, h, image::Rgb(COLOURS[k]));
                let name = if i % 2 == 0 { format!("img_{i}.PNG") } else { format!("img_{i}.JPEG") };
                let fmt = if i % 2 == 0 { image::ImageFormat::Png } else { image::ImageFormat::Jpeg };
                img.save_with_format(d.join(name), fmt).unwrap();
            }
        }
    }
    std::fs::create_dir_all(dir.join("train/n004")).unwrap(); // a fourth class, beyond `classes: 3`
    std::fs::write(dir.join("train/n004/x.jpg"), b"not an image").unwrap();
}

/// An `imagefolder` spec pinned to `root` (whatever `PLEXUS_DATA` says).
fn folder_spec(root: &Path, options: &str) -> Box<dyn DataSpec> {
    data::parse_at("imagefolder", root, &yaml(options)).unwrap_or_else(|e| panic!("{e:?}"))
}

#[test]
fn image_folder_decodes_crops_and_labels_by_class_folder() {
    let tmp = tempfile::tempdir().unwrap();
    image_folder(&tmp.path().join("inet"));
    let opts = "{dir: inet, classes: 3, image_size: 16, batch_size: 4, normalize: false, workers: 2, seed: 1}";
    let spec = folder_spec(tmp.path(), opts);
    assert_eq!(spec.info().input_shape, vec![3, 16, 16]);
    assert_eq!(spec.info().output_dim, 3);
    let src = load(spec.as_ref());
    assert_eq!(src.batches_per_epoch(), 18 / 4);
    let b = src.train_batch(5);
    assert_eq!(b.input.size(), vec![4, 3, 16, 16]);
    assert!(same(&b, &src.train_batch(5)), "a batch is a pure function of its index");
    // Every image is one flat colour: after crop, resize and flip each pixel is its class colour.
    for (i, label) in longs(&b.target).into_iter().enumerate() {
        let px = floats(&b.input.get(i as i64));
        for c in 0..3 {
            let want = COLOURS[label as usize][c] as f32 / 255.0;
            let plane = &px[c * 256..(c + 1) * 256];
            assert!(plane.iter().all(|v| (v - want).abs() < 0.05), "image {i}, class {label}, channel {c}");
        }
    }
    // An epoch visits every training image once (labels: 6 of each class in 4 batches + 2 left).
    let mut counts = [0; 3];
    for i in 0..src.batches_per_epoch() {
        for l in longs(&src.train_batch(i).target) {
            counts[l as usize] += 1;
        }
    }
    assert_eq!(counts.iter().sum::<i32>(), 16);
    assert!(counts.iter().all(|&c| c >= 4), "{counts:?}");
    // Evaluation: all 9 validation images, centre crops, in class order.
    let ev = src.eval_batches();
    let labels: Vec<i64> = ev.iter().flat_map(|e| longs(&e.target)).collect();
    assert_eq!(labels, vec![0, 0, 0, 1, 1, 1, 2, 2, 2]);
    // Normalised inputs use the ImageNet mean and std.
    let norm = folder_spec(tmp.path(), &opts.replace("normalize: false", "normalize: true"));
    let e = &load(norm.as_ref()).eval_batches()[0];
    let red = floats(&e.input.get(0).get(0))[0];
    assert!((red - (250.0 / 255.0 - 0.485) / 0.229).abs() < 0.1, "{red}");
}

#[test]
fn image_folder_errors_name_what_is_missing_or_broken() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("inet");
    image_folder(&dir);
    let e = load_err(folder_spec(tmp.path(), "{dir: nowhere, classes: 3}").as_ref());
    assert!(e.contains("nowhere/train") && e.contains("image-net.org"), "{e}");
    let e = load_err(folder_spec(tmp.path(), "{dir: inet, classes: 5}").as_ref());
    assert!(e.contains("4 class folders") && e.contains("classes: 5"), "{e}");
    // Class n004 has no validation folder.
    let e = load_err(folder_spec(tmp.path(), "{dir: inet, classes: 4, batch_size: 2}").as_ref());
    assert!(e.contains("val/n004"), "{e}");
    // A corrupt validation image is an error of the load, naming the file.
    std::fs::write(dir.join("val/n002/img_1.JPEG"), b"\xff\xd8 truncated").unwrap();
    let e = load_err(folder_spec(tmp.path(), "{dir: inet, classes: 3, image_size: 16, batch_size: 4}").as_ref());
    assert!(e.contains("val/n002/img_1.JPEG") && e.contains("cannot decode"), "{e}");
    let m = yaml("{dir: ../up, classes: 3}");
    assert_eq!(data::parse("imagefolder", &m).unwrap_err().key, "dir");
}

/// A gzip file of several members (`cat a.gz b.gz`, pigz, bgzip) is valid (`gzip -t` passes) and
/// decompresses to the concatenation; a header that says 0 images is an error naming the file,
/// not a panic when batches are drawn.
#[test]
fn idx_multi_member_gzip_loads_and_an_empty_split_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("fashion-mnist");
    std::fs::create_dir_all(&dir).unwrap();
    let n = 12u32;
    let mut images = idx_header(2051, &[n, 28, 28]);
    images.extend((0..n as usize * 784).map(|i| (i % 251) as u8));
    let mut labels = idx_header(2049, &[n]);
    labels.extend((0..n as u8).map(|i| i % 10));
    for prefix in ["train", "t10k"] {
        // Two members: the header and the first half, then the rest.
        let mut two = gzip(&images[..16 + 6 * 784]);
        two.extend(gzip(&images[16 + 6 * 784..]));
        std::fs::write(dir.join(format!("{prefix}-images-idx3-ubyte.gz")), &two).unwrap();
        let mut two = gzip(&labels[..8]);
        two.extend(gzip(&labels[8..]));
        std::fs::write(dir.join(format!("{prefix}-labels-idx1-ubyte.gz")), &two).unwrap();
    }
    let read = idx::read_idx_file(&dir.join("train-images-idx3-ubyte.gz")).unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(read, images);
    let spec = data::parse_at("mnist", tmp.path(), &yaml("{batch_size: 4, normalize: false}")).unwrap();
    let src = load(spec.as_ref());
    assert_eq!(src.batches_per_epoch(), 3);
    assert_eq!(longs(&src.eval_batches()[2].target), vec![8, 9, 0, 1]);

    // count 0 in both files of the test split: consistent, but nothing to evaluate on.
    std::fs::write(dir.join("t10k-images-idx3-ubyte.gz"), gzip(&idx_header(2051, &[0, 28, 28]))).unwrap();
    std::fs::write(dir.join("t10k-labels-idx1-ubyte.gz"), gzip(&idx_header(2049, &[0]))).unwrap();
    let e = load_err(spec.as_ref());
    assert!(e.contains("t10k-images-idx3-ubyte.gz") && e.contains("0 images"), "{e}");
}

/// A data-parallel rank decodes only its slice of an image-folder batch, with the crops and flips
/// the whole batch would give those images; an undecodable image in the slice falls back to the
/// whole batch (`skip_bad` replacements as in one process).
#[test]
fn image_folder_ranks_decode_their_slice_with_the_whole_batch_crops() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("grad");
    // Textured images (a diagonal gradient, one channel per class), so that crops and flips show.
    for split in ["train", "val"] {
        for (k, class) in ["a", "b"].iter().enumerate() {
            let d = dir.join(split).join(class);
            std::fs::create_dir_all(&d).unwrap();
            for i in 0..8u32 {
                let img = image::RgbImage::from_fn(24 + 3 * i, 20 + 2 * i, |x, y| {
                    let v = ((x * 9 + y * 5 + 17 * i) % 256) as u8;
                    image::Rgb(if k == 0 { [v, 0, 255 - v] } else { [0, v, v / 2] })
                });
                img.save_with_format(d.join(format!("{i}.png")), image::ImageFormat::Png).unwrap();
            }
        }
    }
    let opts = "{dir: grad, classes: 2, image_size: 12, batch_size: 8, eval_samples: 4, workers: 3, seed: 5, \
                augment: random_resized_crop, skip_bad: true}";
    let src = folder_spec(tmp.path(), opts).load().unwrap();
    let slice = |b: &Batch, r: i64, w: i64| -> Batch {
        let per = b.input.size()[0] / w;
        Batch { input: b.input.narrow(0, r * per, per), target: b.target.narrow(0, r * per, per) }
    };
    for index in [0u64, 1, 5] {
        let whole = src.train_batch(index).unwrap();
        for world in [2usize, 4] {
            for rank in 0..world {
                let mine = src.train_shard(index, rank, world).unwrap();
                assert_eq!(mine.input.size()[0], 8 / world as i64);
                assert!(same(&mine, &slice(&whole, rank as i64, world as i64)), "batch {index}, rank {rank}/{world}");
            }
        }
        // Not vacuous: the crops differ between positions, so a wrong offset would show.
        let (a, b) = (slice(&whole, 0, 2), slice(&whole, 1, 2));
        assert!(!a.input.equal(&b.input));
    }
    // An undecodable image: the rank whose slice holds it falls back to the whole batch (with the
    // replacement a single process makes); the other rank's slice is unchanged.
    let victim = src.train_batch(2).unwrap();
    let files: Vec<PathBuf> =
        ["a", "b"].iter().flat_map(|c| (0..8).map(move |i| PathBuf::from(format!("{c}/{i}.png")))).collect();
    for f in &files {
        // Break images one at a time until one of batch 2's is hit.
        let p = dir.join("train").join(f);
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, b"not a png").unwrap();
        let fresh = folder_spec(tmp.path(), opts).load().unwrap();
        let whole = fresh.train_batch(2).unwrap();
        let changed = !same(&whole, &victim);
        if changed {
            for rank in 0..2 {
                let mine = fresh.train_shard(2, rank, 2).unwrap();
                assert!(same(&mine, &slice(&whole, rank as i64, 2)), "rank {rank} with {} broken", f.display());
            }
            std::fs::write(&p, bytes).unwrap();
            return;
        }
        std::fs::write(&p, bytes).unwrap();
    }
    panic!("no image of batch 2 was found to break");
}
