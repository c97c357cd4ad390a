//! DDPM (Ho et al. 2020) as DiT trains it: ε-prediction, a linear β schedule from 1e-4 to 0.02
//! over [`STEPS`] = 1000 steps, loss `MSE(ε̂, ε)` at a uniform random `t`, class labels replaced
//! by the null class with probability `diffusion.label_dropout` (default 0.1) for
//! classifier-free guidance.
//!
//! The trainer's [`crate::train::step::Stepper`] runs diffusion like any task: [`Task::prepare`]
//! turns an image batch (`[B, C, S, S]` after the input transform, labels `[B]`) into DiT model
//! inputs ([`crate::model::dit::pack`]) and noise targets, and [`Task::loss`] reads the ε
//! channels of the output. Noise, `t` and the dropout mask come from libtorch's global generator,
//! which the trainer reseeds from `(seed, step)`: a resumed run draws what it would have drawn.
//!
//! [`Task::prepare`]: crate::data::Task::prepare
//! [`Task::loss`]: crate::data::Task::loss

use crate::data::Batch;
use crate::model::dit::pack;
use crate::train::eval::{EvalResult, EvalSet};
use tch::{Device, Kind, Tensor};

/// Number of diffusion steps `T`.
pub const STEPS: i64 = 1000;
/// Validation buckets of `t` (`STEPS / BUCKETS` timesteps each).
pub const BUCKETS: i64 = 10;
/// Seed of the validation noise and timesteps: the same draws at every evaluation.
pub const EVAL_SEED: u64 = 0xD1F7_5EED;

/// `diffusion:` config section.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiffusionConfig {
    /// Probability that a training label is replaced by the null class (classifier-free guidance).
    pub label_dropout: f64,
}

impl Default for DiffusionConfig {
    fn default() -> Self {
        DiffusionConfig { label_dropout: 0.1 }
    }
}

/// The diffusion task of a DiT: image channels, classes (the null class is `num_classes`) and
/// the label dropout.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Diffusion {
    pub channels: i64,
    pub num_classes: i64,
    pub label_dropout: f64,
}

/// `β_t`, `t = 0..T`: linear from 1e-4 to 0.02, f64 `[T]` on the CPU.
pub fn betas() -> Tensor {
    Tensor::linspace(1e-4, 0.02, STEPS, (Kind::Double, Device::Cpu))
}

/// `ᾱ_t = Π_{s≤t} (1 − β_s)`, f64 `[T]` on the CPU.
pub fn alpha_bar() -> Tensor {
    (-betas() + 1.0).cumprod(0, Kind::Double)
}

impl Diffusion {
    /// `x0` `[B, C, S, S]`, labels `y` `[B]` → model input `x_t ⊕ t ⊕ y'` `[B, C·S·S + 2]` and
    /// target ε `[B, C, S, S]`, with `t ~ U{0..T−1}`, `ε ~ N(0, I)`,
    /// `x_t = √ᾱ_t·x0 + √(1−ᾱ_t)·ε`, and (if `train`) `y'` = null with probability `label_dropout`.
    pub fn prepare(&self, x0: &Tensor, y: &Tensor, train: bool) -> Batch {
        let dev = x0.device();
        let b = x0.size()[0];
        let t = Tensor::randint(STEPS, [b], (Kind::Int64, dev));
        let eps = x0.to_kind(Kind::Float).randn_like();
        let y = if train && self.label_dropout > 0.0 {
            let drop = Tensor::rand([b], (Kind::Float, dev)).lt(self.label_dropout);
            y.where_scalarother(&drop.logical_not(), self.num_classes)
        } else {
            y.shallow_clone()
        };
        Batch { input: pack(&noisy(x0, &t, &eps), &t, &y), target: eps }
    }

    /// `MSE(ε̂, ε)`: the first `C` channels of `output` `[B, out_C, S, S]` against `eps`
    /// `[B, C, S, S]`, mean over every element, fp32 scalar.
    pub fn loss(&self, output: &Tensor, eps: &Tensor) -> Tensor {
        let e = output.to_kind(Kind::Float).narrow(1, 0, self.channels);
        (e - eps.to_kind(Kind::Float)).square().mean(Kind::Float)
    }

    /// Validation: the ε-MSE over the held-out images at timesteps and noise drawn from
    /// [`EVAL_SEED`] (the same at every evaluation), in total and per bucket of `STEPS/BUCKETS`
    /// timesteps (`[BUCKETS]`, bucket `k` = `t ∈ [100k, 100k+100)`). One read. `None` if the set
    /// is empty. Labels are kept (no dropout).
    pub fn evaluate(
        &self,
        set: &EvalSet,
        step: u64,
        mut forward: impl FnMut(&Tensor) -> Tensor,
    ) -> Option<(EvalResult, Vec<f64>)> {
        if set.is_empty() {
            return None;
        }
        let dev = set.device();
        let (mut sums, mut counts) =
            (Tensor::zeros([BUCKETS], (Kind::Double, dev)), Tensor::zeros([BUCKETS], (Kind::Double, dev)));
        let _seed = crate::device::seed_guard(EVAL_SEED);
        tch::no_grad(|| {
            set.for_each(|b| {
                let batch = self.prepare(&b.input, &b.target, false);
                let out = forward(&batch.input);
                let e = out.to_kind(Kind::Float).narrow(1, 0, self.channels);
                let per = (e - &batch.target).square().flatten(1, -1).mean_dim(1, false, Kind::Double);
                let t = batch.input.select(1, batch.input.size()[1] - 2).to_kind(Kind::Int64);
                let k = t.divide_scalar_mode(STEPS / BUCKETS, "floor");
                sums = sums.scatter_add(0, &k, &per);
                counts = counts.scatter_add(0, &k, &per.ones_like());
            })
        });
        let v = crate::host::values(&Tensor::cat(&[&sums, &counts], 0));
        let (s, c) = v.split_at(BUCKETS as usize);
        let total: f64 = s.iter().sum::<f64>() / c.iter().sum::<f64>();
        let buckets = s.iter().zip(c).map(|(s, c)| if *c > 0.0 { s / c } else { f64::NAN }).collect();
        Some((EvalResult { step, loss: total, accuracy: None, perplexity: None }, buckets))
    }
}

/// `x_t = √ᾱ_t·x0 + √(1−ᾱ_t)·ε`: `x0`, `eps` `[B, C, S, S]`, `t` `[B]` int64 → fp32.
pub fn noisy(x0: &Tensor, t: &Tensor, eps: &Tensor) -> Tensor {
    let ab = alpha_bar().to_kind(Kind::Float).to_device(x0.device()).index_select(0, t).view([-1, 1, 1, 1]);
    ab.sqrt() * x0.to_kind(Kind::Float) + (-&ab + 1.0).sqrt() * eps.to_kind(Kind::Float)
}

/// A reverse-process sampler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Sampler {
    /// DDPM ancestral sampling over all [`STEPS`] steps, posterior variance `β̃_t`.
    Ddpm,
    /// DDIM with η = 0 (deterministic) over `steps` evenly spaced timesteps.
    Ddim,
}

/// How to sample: the sampler, its number of steps (DDIM), the guidance scale and the seed.
#[derive(Debug, Clone, Copy)]
pub struct SampleOptions {
    pub sampler: Sampler,
    pub steps: usize,
    pub cfg: f64,
    pub seed: u64,
}

/// The timesteps a sampler visits, descending: every `t` for DDPM; for DDIM `steps` timesteps
/// `⌊i·T/steps⌋`, `i = steps−1..0`.
pub fn timesteps(sampler: Sampler, steps: usize) -> Vec<i64> {
    match sampler {
        Sampler::Ddpm => (0..STEPS).rev().collect(),
        Sampler::Ddim => {
            let n = (steps as i64).clamp(1, STEPS);
            let mut v: Vec<i64> = (0..n).map(|i| i * STEPS / n).collect();
            v.dedup();
            v.reverse();
            v
        }
    }
}

/// Draws images from the reverse process. `eps` is the model: a packed input
/// ([`crate::model::dit::pack`]) `[N, C·S·S + 2]` → `[N, out_C, S, S]` (its first `C` channels are
/// ε̂). `labels` `[N]` int64 on the model's device; `shape` = `[N, C, S, S]`; options `o`. Classifier-free
/// guidance with scale `cfg`: `ε̂ = ε̂(∅) + cfg·(ε̂(y) − ε̂(∅))` (the model runs on the labels and the
/// null class in one batch of `2N`; `cfg = 1` runs it on the labels alone). The start noise and
/// DDPM's noise are drawn from `seed` (deterministic for a seed on a device). Returns `x_0`
/// `[N, C, S, S]` fp32, in the model's data space (the training input transform's output).
pub fn sample(
    eps: impl Fn(&Tensor) -> Tensor,
    d: &Diffusion,
    shape: [i64; 4],
    labels: &Tensor,
    o: &SampleOptions,
) -> Tensor {
    let SampleOptions { sampler, steps, cfg, seed } = *o;
    let dev = labels.device();
    let ab: Vec<f64> = crate::host::values(&alpha_bar());
    let beta: Vec<f64> = crate::host::values(&betas());
    let _seed = crate::device::seed_guard(seed);
    tch::no_grad(|| {
        let mut x = Tensor::randn(shape, (Kind::Float, dev));
        let n = shape[0];
        let guided = |x: &Tensor, t: i64| -> Tensor {
            let tt = Tensor::full([n], t, (Kind::Int64, dev));
            if cfg == 1.0 {
                return eps(&pack(x, &tt, labels)).narrow(1, 0, d.channels);
            }
            let null = labels.full_like(d.num_classes);
            let both = Tensor::cat(&[pack(x, &tt, labels), pack(x, &tt, &null)], 0);
            let e = eps(&both).narrow(1, 0, d.channels);
            let (c, u) = (e.narrow(0, 0, n), e.narrow(0, n, n));
            &u + (c - &u) * cfg
        };
        let ts = timesteps(sampler, steps);
        for (i, &t) in ts.iter().enumerate() {
            let e = guided(&x, t);
            let a = ab[t as usize];
            match sampler {
                Sampler::Ddim => {
                    let prev = ts.get(i + 1).map_or(1.0, |&p| ab[p as usize]);
                    let x0 = (&x - &e * (1.0 - a).sqrt()) / a.sqrt();
                    x = x0 * prev.sqrt() + e * (1.0 - prev).sqrt();
                }
                Sampler::Ddpm => {
                    let b = beta[t as usize];
                    let mean = (&x - e * (b / (1.0 - a).sqrt())) / (1.0 - b).sqrt();
                    x = if t > 0 {
                        let var = b * (1.0 - ab[t as usize - 1]) / (1.0 - a);
                        mean + x.randn_like() * var.sqrt()
                    } else {
                        mean
                    };
                }
            }
        }
        x
    })
}

/// `plexus sample`: loads a DiT run's final checkpoint, draws `per_class` images of every class
/// (classes in rows) and writes them as one PNG grid into the run's figures directory
/// ([`crate::run_dir::RunDir::samples_file`]). Pixels are mapped back through the data's input
/// transform (`x·std + mean`, clamped to [0, 1]); images with more than 3 channels (latents) show
/// their first 3 channels, each min-max scaled. Returns the PNG's path.
pub fn sample_run(
    run: &std::path::Path,
    per_class: usize,
    o: &SampleOptions,
    device: &str,
) -> anyhow::Result<std::path::PathBuf> {
    use anyhow::Context;
    let dir = crate::run_dir::RunDir::open(run)?;
    let exp = crate::experiment::Experiment::from_file(&dir.config_file(), &[])?;
    let crate::data::Task::Diffusion(d) = exp.task() else {
        anyhow::bail!("{}: not a diffusion run (model.kind is `{}`, not `dit`)", run.display(), exp.model.kind());
    };
    anyhow::ensure!(per_class >= 1, "--per-class must be at least 1");
    anyhow::ensure!(
        o.cfg.is_finite() && o.cfg >= 0.0,
        "--cfg must be a finite scale ≥ 0 (1 = no guidance), got {}",
        o.cfg
    );
    anyhow::ensure!((1..=STEPS as usize).contains(&o.steps), "--steps must be in 1..={STEPS}, got {}", o.steps);
    let dev = crate::device::resolve(crate::device::parse_device(device).map_err(anyhow::Error::msg)?)?;
    let mut model = crate::device::with_seed(exp.config().seed, || {
        crate::model::Model::new(exp.model.as_ref(), exp.topology.as_ref(), dev, Kind::Float)
    });
    let ck = dir.final_checkpoint();
    crate::train::checkpoint::load_weights(&mut model.vs, &ck).with_context(|| format!("loading {}", ck.display()))?;
    let info = exp.data.info();
    let (c, s) = (info.input_shape[0] as i64, info.input_shape[1] as i64);
    let k = d.num_classes;
    let labels = Tensor::arange(k, (Kind::Int64, dev)).repeat_interleave_self_int(per_class as i64, 0, None);
    let n = labels.size()[0];
    let x = sample(|x| model.forward(x, false), &d, [n, c, s, s], &labels, o);
    let transform = exp.data.load()?.input_transform();
    let x = match transform {
        crate::data::InputTransform::Pixels { mean, std } => {
            let col = |v: &[f64]| {
                let v: Vec<f32> = (0..c as usize).map(|i| v[i.min(v.len() - 1)] as f32).collect();
                Tensor::from_slice(&v).view([1, c, 1, 1]).to_device(dev)
            };
            (x * col(&std) + col(&mean)).clamp(0.0, 1.0)
        }
        crate::data::InputTransform::Identity => {
            let lo = x.amin([0, 2, 3], true);
            let hi = x.amax([0, 2, 3], true);
            (x - &lo) / (hi - lo + 1e-8)
        }
    };
    let x = if c > 3 { x.narrow(1, 0, 3) } else { x };
    let ch = x.size()[1];
    // Grid [k·(S+2), per·(S+2), ch] with 2-pixel gaps, row = class.
    let g = (s + 2) as usize;
    let (h, w) = (k as usize * g, per_class * g);
    let px: Vec<f32> = crate::host::values(&(x * 255.0).round().to_kind(Kind::Double).to_device(tch::Device::Cpu))
        .into_iter()
        .map(|v| v as f32)
        .collect();
    let mut img = image::RgbImage::new(w as u32, h as u32);
    for i in 0..n as usize {
        let (row, col) = (i / per_class, i % per_class);
        for yy in 0..s as usize {
            for xx in 0..s as usize {
                let at = |cc: usize| px[((i * ch as usize + cc) * s as usize + yy) * s as usize + xx] as u8;
                let rgb = if ch == 1 { [at(0); 3] } else { [at(0), at(1), at(2)] };
                img.put_pixel((col * g + 1 + xx) as u32, (row * g + 1 + yy) as u32, image::Rgb(rgb));
            }
        }
    }
    let out = dir.samples_file(o.sampler, o.steps, o.cfg);
    std::fs::create_dir_all(out.parent().expect("a figures directory"))?;
    img.save(&out).with_context(|| format!("writing {}", out.display()))?;
    Ok(out)
}
