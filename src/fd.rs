//! Fréchet distance between generated and real images in the feature space of a classifier that
//! plexus trained itself (no Inception weights are used or needed). **This is not FID-50K**: the
//! features, the sample count and the preprocessing differ, so the numbers compare runs of this
//! repository with each other (same extractor, same N), not with published FIDs.
//!
//! `FD = ‖μ₁ − μ₂‖² + tr Σ₁ + tr Σ₂ − 2 tr (Σ₁^{½} Σ₂ Σ₁^{½})^{½}`, in f64, with the square roots
//! taken by eigen-decomposition of symmetric PSD matrices (negative round-off eigenvalues clamped
//! to 0). Features: the representation the classifier's readout reads (the topology's output),
//! mean-pooled over tokens ([`crate::model::Model::features`]).

use anyhow::{bail, Result};
use tch::{Device, Kind, Tensor};

/// Mean `[F]` and unbiased covariance `[F, F]` of features `[N, F]`, f64 on the CPU.
pub fn stats(features: &Tensor) -> (Tensor, Tensor) {
    let f = features.to_kind(Kind::Double).to_device(Device::Cpu);
    let n = f.size()[0];
    let mu = f.mean_dim(0, false, Kind::Double);
    let c = &f - mu.unsqueeze(0);
    let cov = c.transpose(0, 1).matmul(&c) / ((n - 1).max(1) as f64);
    (mu, cov)
}

/// `S^{½}` of a symmetric PSD `[F, F]` f64 matrix (eigenvalues clamped at 0).
fn sqrt_psd(s: &Tensor) -> Tensor {
    let sym = (s + s.transpose(0, 1)) * 0.5;
    let (l, v) = sym.linalg_eigh("L");
    (&v * l.clamp_min(0.0).sqrt().unsqueeze(0)).matmul(&v.transpose(0, 1))
}

/// The Fréchet distance between two Gaussians `(μ₁, Σ₁)`, `(μ₂, Σ₂)` (f64 CPU tensors).
pub fn frechet(mu1: &Tensor, s1: &Tensor, mu2: &Tensor, s2: &Tensor) -> f64 {
    let r = sqrt_psd(s1);
    let m = r.matmul(s2).matmul(&r);
    let m = (&m + m.transpose(0, 1)) * 0.5;
    let tr_sqrt = m.linalg_eigvalsh("L").clamp_min(0.0).sqrt().sum(Kind::Double);
    let d = (mu1 - mu2).square().sum(Kind::Double) + s1.trace() + s2.trace() - tr_sqrt * 2.0;
    crate::host::values(&d.view([1]))[0]
}

/// The Fréchet distance between two feature sets `[N, F]`, `[M, F]`.
pub fn frechet_of(a: &Tensor, b: &Tensor) -> f64 {
    let (m1, s1) = stats(a);
    let (m2, s2) = stats(b);
    frechet(&m1, &s1, &m2, &s2)
}

/// What `plexus fd` measured.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FdResult {
    /// Fréchet distance of the generated images to the first `samples` held-out images.
    pub fd: f64,
    /// The same distance between two disjoint sets of `samples` held-out images: the floor that
    /// `fd` should be read against (what sampling noise alone gives at this sample count); `None`
    /// when the held-out set has fewer than `2 × samples` images.
    pub real_floor: Option<f64>,
    /// The share of generated images the extractor classifies as the label they were drawn for:
    /// whether the model uses its label (chance is 1 / classes).
    pub class_agreement: f64,
    /// The extractor's accuracy on the real images compared (what `class_agreement` can reach).
    pub extractor_accuracy: f64,
    pub classes: i64,
    pub samples: usize,
    /// How the images were drawn: sampler, steps, guidance scale, seed, weights, checkpoint step
    /// ([`crate::diffusion::SampleOptions::describe`]).
    pub sampling: String,
    /// The extractor run, as given.
    pub extractor: std::path::PathBuf,
    /// The SHA-256 of the extractor's weights that were loaded (its `final.safetensors`): what
    /// identifies it, whatever the path's spelling, and what tells a retrained one apart.
    pub extractor_sha256: String,
}

/// The run in `dir` on `dev` in fp32, with the weights `weights` and `step` choose.
fn load_on(
    dir: &std::path::Path,
    weights: crate::diffusion::Weights,
    step: Option<u64>,
    dev: Device,
) -> Result<(crate::experiment::Experiment, crate::model::Model)> {
    let choose = |d: &crate::run_dir::RunDir| crate::diffusion::weights_file(d, weights, step);
    let open = crate::train::trained::OpenOptions {
        device: Some(dev),
        compute: Some(Kind::Float),
        weights: &choose,
        ..Default::default()
    };
    crate::kinds::expect_kind(&crate::run_dir::RunDir::open(dir)?, &crate::kinds::TRAIN)?;
    let run = crate::train::trained::open(dir, &open)?;
    Ok((run.exp, run.model))
}

/// `plexus fd`: `samples` images drawn from the DiT run `run` (labels cycling over the classes)
/// against the first `samples` held-out images, in the features of the classifier run
/// `extractor` (same image shape and classes). Generated images are mapped to pixels through the
/// DiT data's input transform (clamped to [0, 1]) and then through the classifier's. Also the
/// real-vs-real floor and how often the extractor agrees with the generated images' labels.
pub fn fd_command(
    run: &std::path::Path,
    extractor: &std::path::Path,
    samples: usize,
    o: &crate::diffusion::SampleOptions,
    device: &str,
) -> Result<FdResult> {
    use crate::data::{InputTransform, Task};
    use crate::run_dir::RunDir;
    anyhow::ensure!(samples >= 2, "--samples must be at least 2");
    o.check()?;
    let dev = crate::device::from_flag("--device", device)?;
    // The diffusion run's weights as `o.weights` says; the extractor's as trained.
    let load = |dir: &std::path::Path, weights, step| load_on(dir, weights, step, dev);
    let (extractor_sha256, _) = crate::pins::sha256_file(&RunDir::open(extractor)?.final_checkpoint())?;
    let (gen_exp, gen) = load(run, o.weights, o.step)?;
    let Task::Diffusion(d) = gen_exp.task() else {
        bail!("{}: not a diffusion run (model.kind `{}`)", run.display(), gen_exp.model.kind());
    };
    let (cls_exp, cls) = load(extractor, crate::diffusion::Weights::Raw, None)?;
    if !matches!(cls_exp.task(), Task::Classification) {
        bail!("--extractor {}: not a classifier run (model.kind `{}`)", extractor.display(), cls_exp.model.kind());
    }
    let (gi, ci) = (gen_exp.data.info(), cls_exp.data.info());
    if gi.input_shape != ci.input_shape {
        bail!("--extractor reads images of shape {:?}, the diffusion run makes {:?}", ci.input_shape, gi.input_shape);
    }
    if ci.output_dim as i64 != d.num_classes {
        bail!(
            "--extractor {}: classifies {} classes, the diffusion run draws {}: use a classifier of the same dataset",
            extractor.display(),
            ci.output_dim,
            d.num_classes
        );
    }
    let (c, s) = (gi.input_shape[0] as i64, gi.input_shape[1] as i64);
    let gen_transform = gen_exp.load_run_data(run)?.input_transform();
    let cls_data = cls_exp.load_run_data(extractor)?;
    let cls_transform = cls_data.input_transform();
    let per_channel = |v: &[f64]| {
        let v: Vec<f32> = (0..c as usize).map(|i| v[i.min(v.len() - 1)] as f32).collect();
        Tensor::from_slice(&v).view([1, c, 1, 1]).to_device(dev)
    };
    // Real: the first `2 × samples` held-out images (or as many as there are, at least
    // `samples`), through the classifier's transform; the second half is the floor's other set.
    let to_cls = cls_transform.on(dev);
    let (mut real, mut real_labels) = (Vec::new(), Vec::new());
    let mut have = 0usize;
    for b in cls_data.eval_batches() {
        if have >= 2 * samples {
            break;
        }
        let x = to_cls.apply(&b.input.to_device(dev));
        let take = (2 * samples - have).min(x.size()[0] as usize) as i64;
        real.push(x.narrow(0, 0, take));
        real_labels.push(b.target.to_device(dev).narrow(0, 0, take));
        have += take as usize;
    }
    if have < samples {
        bail!("--samples {samples}: the extractor's held-out set has only {have} images (data.eval_samples)");
    }
    let feats = |x: &Tensor| tch::no_grad(|| cls.features(x));
    let all_real = Tensor::cat(&real, 0);
    let all_real_f = feats(&all_real);
    let extractor_accuracy = {
        let pred = tch::no_grad(|| cls.forward(&all_real.narrow(0, 0, samples as i64), false)).argmax(-1, false);
        let hits = pred.eq_tensor(&Tensor::cat(&real_labels, 0).narrow(0, 0, samples as i64));
        crate::host::scalar(&hits.to_kind(Kind::Float).mean(Kind::Float))
    };
    let real_f = vec![all_real_f.narrow(0, 0, samples as i64)];
    let floor_f = (have >= 2 * samples).then(|| all_real_f.narrow(0, samples as i64, samples as i64));
    // Generated: in chunks of 256, labels cycling over the classes.
    let mut gen_f = Vec::new();
    let mut agree = 0i64;
    let mut done = 0usize;
    while done < samples {
        let n = (samples - done).min(crate::diffusion::SAMPLE_CHUNK as usize) as i64;
        let labels = (Tensor::arange(n, (Kind::Int64, dev)) + done as i64).remainder(d.num_classes);
        let chunk = crate::diffusion::SampleOptions { seed: o.seed.wrapping_add(done as u64), ..*o };
        let x = crate::diffusion::sample(|x| gen.forward(x, false), &d, [n, c, s, s], &labels, &chunk);
        let pixels = match &gen_transform {
            InputTransform::Pixels { mean, std } => (x * per_channel(std) + per_channel(mean)).clamp(0.0, 1.0),
            InputTransform::Identity => x,
        };
        let x = match &cls_transform {
            InputTransform::Pixels { mean, std } => (pixels - per_channel(mean)) / per_channel(std),
            InputTransform::Identity => pixels,
        };
        gen_f.push(feats(&x));
        let pred = tch::no_grad(|| cls.forward(&x, false)).argmax(-1, false);
        agree += crate::host::scalar(&pred.eq_tensor(&labels).sum(Kind::Int64)) as i64;
        done += n as usize;
    }
    let (gen_f, real_f) = (Tensor::cat(&gen_f, 0), Tensor::cat(&real_f, 0));
    // Non-finite features (weights that hold NaN, sampling that overflowed) would reach the
    // eigendecomposition, which fails without saying why.
    anyhow::ensure!(
        crate::host::all_finite(&gen_f),
        "{}: the generated images' features are not finite (weights that are not finite, or sampling that \
         overflowed: try --weights raw, a smaller --cfg)",
        run.display()
    );
    anyhow::ensure!(
        crate::host::all_finite(&real_f),
        "--extractor {}: the real images' features are not finite (its weights are not finite)",
        extractor.display()
    );
    Ok(FdResult {
        fd: frechet_of(&gen_f, &real_f),
        real_floor: floor_f.map(|f| frechet_of(&f, &real_f)),
        class_agreement: agree as f64 / samples as f64,
        extractor_accuracy,
        classes: d.num_classes,
        samples,
        sampling: o.describe(),
        extractor: extractor.to_path_buf(),
        extractor_sha256,
    })
}

/// The file of a run that holds its distances over training: one row per checkpoint step measured
/// (`plexus fd --step N` or `--every-checkpoint`), read by `plexus report` as the curves `fd.fd`,
/// `fd.real_floor` and `fd.class_agreement` against the step (metrics `fd.fd@STEP`).
pub const STEPS_FILE: &str = "fd_steps.csv";

/// One row of [`STEPS_FILE`]: what [`fd_command`] measured at one checkpoint, with the setting it
/// was measured in (the sampling options but the step, the sample count, the extractor), so that
/// one run's rows are one curve.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct StepRow {
    step: u64,
    fd: f64,
    real_floor: Option<f64>,
    class_agreement: f64,
    extractor_accuracy: f64,
    samples: usize,
    sampling: String,
    extractor: String,
    /// Absent in the rows plexus wrote before it identified extractors by their weights.
    #[serde(default)]
    extractor_sha256: String,
}

impl StepRow {
    /// Whether `self` was measured in the setting of `row`: the same sample count, sampling
    /// options (but the step) and extractor weights (by their SHA-256; a row written before plexus
    /// recorded it, by the extractor's path). Rows written before plexus described the sampling in
    /// words hold its debug form, `old_sampling`.
    fn same_setting(&self, row: &StepRow, old_sampling: &str) -> bool {
        let sampling = self.sampling == row.sampling || self.sampling == old_sampling;
        let extractor = match self.extractor_sha256.is_empty() {
            true => self.extractor == row.extractor,
            false => self.extractor_sha256 == row.extractor_sha256,
        };
        self.samples == row.samples && sampling && extractor
    }
}

/// Keeps `r` with the run `run`: the final weights' measurement (`step` `None`) as `fd.json`
/// (metrics `fd.*` of `plexus report`), a checkpoint's as the row of its step in [`STEPS_FILE`]
/// (the same step measured again replaces its row). Rows of another setting are refused — a
/// curve whose points were drawn with different samplers, seeds or extractors is not a curve —
/// with what to do. Returns the file written.
pub fn record(
    run: &std::path::Path,
    step: Option<u64>,
    o: &crate::diffusion::SampleOptions,
    r: &FdResult,
) -> Result<std::path::PathBuf> {
    let Some(step) = step else {
        let file = run.join("fd.json");
        crate::run_dir::atomic_write(&file, serde_json::to_string_pretty(r)?.as_bytes())?;
        return Ok(file);
    };
    let file = run.join(STEPS_FILE);
    let row = StepRow {
        step,
        fd: r.fd,
        real_floor: r.real_floor,
        class_agreement: r.class_agreement,
        extractor_accuracy: r.extractor_accuracy,
        samples: r.samples,
        sampling: crate::diffusion::SampleOptions { step: None, ..*o }.describe(),
        extractor: r.extractor.display().to_string(),
        extractor_sha256: r.extractor_sha256.clone(),
    };
    let old_sampling = format!("{:?}", crate::diffusion::SampleOptions { step: None, ..*o });
    let mut rows: Vec<StepRow> = Vec::new();
    if file.is_file() {
        let bytes = crate::input_file::read_bounded(&file, crate::input_file::MAX_RECORD_BYTES, "an FD record")?;
        for rec in csv::Reader::from_reader(bytes.as_slice()).deserialize() {
            rows.push(rec.map_err(|e| {
                anyhow::anyhow!("{}: not an FD record ({e}); remove it to measure anew", file.display())
            })?);
        }
    }
    if let Some(other) = rows.iter().find(|x| !x.same_setting(&row, &old_sampling)) {
        let weights = |r: &StepRow| match r.extractor_sha256.is_empty() {
            true => String::new(),
            false => format!(" (weights SHA-256 {})", r.extractor_sha256),
        };
        bail!(
            "{}: its step {} was measured with {} samples ({}) and the extractor {}{}; this measurement uses {} \
             samples ({}) and {}{}. One run's distances over training must share their setting, the extractor's \
             weights included: measure with the same flags and extractor, or remove the file to start the curve anew",
            file.display(),
            other.step,
            other.samples,
            other.sampling,
            other.extractor,
            weights(other),
            row.samples,
            row.sampling,
            row.extractor,
            weights(&row)
        );
    }
    rows.retain(|x| x.step != step);
    rows.push(row);
    rows.sort_by_key(|x| x.step);
    let mut w = csv::Writer::from_writer(Vec::new());
    for x in &rows {
        w.serialize(x)?;
    }
    crate::run_dir::atomic_write(&file, &w.into_inner()?)?;
    Ok(file)
}

/// The steps of the complete checkpoints `run` kept, in order (what `plexus fd --every-checkpoint`
/// measures).
pub fn checkpoint_steps(run: &std::path::Path) -> Result<Vec<u64>> {
    let dir = crate::run_dir::RunDir::open(run)?;
    Ok(crate::train::checkpoint::list(&dir)?.into_iter().map(|(_, s)| s.step).collect())
}
