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
//! With `model.learn_sigma: true` the model also predicts the variance of each reverse step
//! (Nichol & Dhariwal 2021, as DiT trains it): output channels `C..2C` are `v ∈ [−1, 1]`
//! interpolating `log σ²_t = ((v+1)/2)·log β_t + (1 − (v+1)/2)·log β̃_t`, trained by the variational
//! bound term `L_vb` added to the ε-MSE (with ε̂ detached in `L_vb`, so the bound trains only the
//! variance), and DDPM sampling draws with that variance. See [`Diffusion::loss`].
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

/// The diffusion task of a DiT: image channels, classes (the null class is `num_classes`), the
/// label dropout, and whether the model predicts the variance too (`model.learn_sigma`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Diffusion {
    pub channels: i64,
    pub num_classes: i64,
    pub label_dropout: f64,
    pub learn_sigma: bool,
}

/// `β_t`, `t = 0..T`: linear from 1e-4 to 0.02, f64 `[T]` on the CPU.
pub fn betas() -> Tensor {
    Tensor::linspace(1e-4, 0.02, STEPS, (Kind::Double, Device::Cpu))
}

/// `ᾱ_t = Π_{s≤t} (1 − β_s)`, f64 `[T]` on the CPU.
pub fn alpha_bar() -> Tensor {
    (-betas() + 1.0).cumprod(0, Kind::Double)
}

/// The schedule's per-timestep tables, fp32 `[T]` on one device, built once (in f64 on the CPU)
/// per device and thread and cached: a table copied to a GPU inside every step would be a
/// blocking host-to-device copy, which waits for the GPU's queue like a read.
pub struct Schedule {
    /// `√ᾱ_t` and `√(1 − ᾱ_t)`: the forward process.
    sqrt_ab: Tensor,
    sqrt_one_minus_ab: Tensor,
    /// `1/√ᾱ_t` and `√(1/ᾱ_t − 1)`: `x̂0` from `x_t` and ε̂.
    recip_sqrt_ab: Tensor,
    recip_m1_sqrt_ab: Tensor,
    /// The posterior `q(x_{t−1} | x_t, x_0) = N(c₀·x_0 + c_t·x_t, β̃_t)` (`ᾱ_{−1} = 1`):
    /// `c₀ = β_t √ᾱ_{t−1} / (1 − ᾱ_t)`, `c_t = (1 − ᾱ_{t−1}) √α_t / (1 − ᾱ_t)`.
    coef_x0: Tensor,
    coef_xt: Tensor,
    /// `log β̃_t` with `β̃_0` (= 0) replaced by `β̃_1`: the lower end of the learned log-variance.
    log_var_clipped: Tensor,
    /// `log β_t`: its upper end.
    log_beta: Tensor,
}

impl Schedule {
    fn build(device: Device) -> Schedule {
        let beta = betas();
        let ab = alpha_bar();
        let ab_prev = Tensor::cat(&[Tensor::ones([1], (Kind::Double, Device::Cpu)), ab.narrow(0, 0, STEPS - 1)], 0);
        let one_minus_ab = -&ab + 1.0;
        let var = &beta * (-&ab_prev + 1.0) / &one_minus_ab;
        let var_clipped = Tensor::cat(&[var.narrow(0, 1, 1), var.narrow(0, 1, STEPS - 1)], 0);
        let put = |t: Tensor| t.to_kind(Kind::Float).to_device(device);
        Schedule {
            sqrt_ab: put(ab.sqrt()),
            sqrt_one_minus_ab: put(one_minus_ab.sqrt()),
            recip_sqrt_ab: put(ab.reciprocal().sqrt()),
            recip_m1_sqrt_ab: put((ab.reciprocal() - 1.0).sqrt()),
            coef_x0: put(&beta * ab_prev.sqrt() / &one_minus_ab),
            coef_xt: put((-&ab_prev + 1.0) * (-&beta + 1.0).sqrt() / &one_minus_ab),
            log_var_clipped: put(var_clipped.log()),
            log_beta: put(beta.log()),
        }
    }

    /// The tables on `device` (built on first use on this thread).
    pub fn on(device: Device) -> std::rc::Rc<Schedule> {
        thread_local! {
            static CACHE: std::cell::RefCell<Vec<(Device, std::rc::Rc<Schedule>)>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        CACHE.with(|c| {
            if let Some((_, s)) = c.borrow().iter().find(|(d, _)| *d == device) {
                return s.clone();
            }
            let s = std::rc::Rc::new(Schedule::build(device));
            c.borrow_mut().push((device, s.clone()));
            s
        })
    }
}

/// `table[t]` as `[B, 1, 1, 1]` (`t` `[B]` int64 on the table's device).
fn at(table: &Tensor, t: &Tensor) -> Tensor {
    table.index_select(0, t).view([-1, 1, 1, 1])
}

/// The learned log-variance `[B, C, S, S]` from `v` (the model's second half): `frac = (v+1)/2`
/// between `log β̃_t` (clipped) and `log β_t`.
fn learned_log_var(s: &Schedule, v: &Tensor, t: &Tensor) -> Tensor {
    let frac = (v.to_kind(Kind::Float) + 1.0) / 2.0;
    &frac * at(&s.log_beta, t) + (-&frac + 1.0) * at(&s.log_var_clipped, t)
}

/// `KL(N(μ₁, e^{ℓ₁}) ‖ N(μ₂, e^{ℓ₂}))` elementwise, in nats.
fn normal_kl(mean1: &Tensor, logvar1: &Tensor, mean2: &Tensor, logvar2: &Tensor) -> Tensor {
    ((logvar2 - logvar1) + (logvar1 - logvar2).exp() + (mean1 - mean2).square() * (-logvar2).exp() - 1.0) * 0.5
}

/// `Φ(x)` by the tanh approximation (as the reference implementations use).
fn approx_normal_cdf(x: &Tensor) -> Tensor {
    let inner = (x + x.pow_tensor_scalar(3) * 0.044715) * (2.0 / std::f64::consts::PI).sqrt();
    (inner.tanh() + 1.0) * 0.5
}

/// Log-likelihood of `x` (data scaled to [−1, 1], 256 bins of width 2/255) under `N(mean, e^{2·log_scale})`
/// discretised to those bins, the edge bins open-ended; elementwise, nats. For data that is not on
/// that grid (normalised pixels, latents) it is the same formula the reference code applies.
fn discretized_gaussian_log_likelihood(x: &Tensor, mean: &Tensor, log_scale: &Tensor) -> Tensor {
    let centered = x - mean;
    let inv_std = (-log_scale).exp();
    let cdf_plus = approx_normal_cdf(&(&inv_std * (&centered + 1.0 / 255.0)));
    let cdf_min = approx_normal_cdf(&(&inv_std * (&centered - 1.0 / 255.0)));
    let log_cdf_plus = cdf_plus.clamp_min(1e-12).log();
    let log_one_minus_cdf_min = (-&cdf_min + 1.0).clamp_min(1e-12).log();
    let log_delta = (cdf_plus - cdf_min).clamp_min(1e-12).log();
    let upper = log_one_minus_cdf_min.where_self(&x.gt(0.999), &log_delta);
    log_cdf_plus.where_self(&x.lt(-0.999), &upper)
}

/// The variational-bound term of each example, in bits per dimension `[B]`: for `t > 0`
/// `KL(q(x_{t−1}|x_t, x_0) ‖ p(x_{t−1}|x_t))`, for `t = 0` the decoder's negative
/// log-likelihood of `x_0`. `eps_hat`, `v`, `x0`, `x_t` `[B, C, S, S]`, `t` `[B]` int64. The model's
/// mean comes from `eps_hat` (pass it detached to train only the variance through this term).
pub fn vb_bits(eps_hat: &Tensor, v: &Tensor, x0: &Tensor, x_t: &Tensor, t: &Tensor) -> Tensor {
    let s = Schedule::on(x_t.device());
    let (x0, x_t) = (x0.to_kind(Kind::Float), x_t.to_kind(Kind::Float));
    let posterior_mean = |x0: &Tensor| at(&s.coef_x0, t) * x0 + at(&s.coef_xt, t) * &x_t;
    let true_mean = posterior_mean(&x0);
    let true_log_var = at(&s.log_var_clipped, t);
    let pred_x0 = at(&s.recip_sqrt_ab, t) * &x_t - at(&s.recip_m1_sqrt_ab, t) * eps_hat;
    let model_mean = posterior_mean(&pred_x0);
    let model_log_var = learned_log_var(&s, v, t);
    let ln2 = std::f64::consts::LN_2;
    let per = |e: Tensor| e.flatten(1, -1).mean_dim(1, false, Kind::Float) / ln2;
    let kl = per(normal_kl(&true_mean, &true_log_var, &model_mean, &model_log_var));
    let nll = per(-discretized_gaussian_log_likelihood(&x0, &model_mean, &(&model_log_var * 0.5)));
    nll.where_self(&t.eq(0), &kl)
}

impl Diffusion {
    /// `x0` `[B, C, S, S]`, labels `y` `[B]` → model input `x_t ⊕ t ⊕ y'` `[B, C·S·S + 2]` and
    /// target ε `[B, C, S, S]`, with `t ~ U{0..T−1}`, `ε ~ N(0, I)`,
    /// `x_t = √ᾱ_t·x0 + √(1−ᾱ_t)·ε`, and (if `train`) `y'` = null with probability `label_dropout`.
    /// With `learn_sigma` the target also carries what the variational bound needs:
    /// `ε ⊕ x_t ⊕ x0 ⊕ t` along the channels, `[B, 3C + 1, S, S]` (t as a constant plane).
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
        let x_t = noisy(x0, &t, &eps);
        let input = pack(&x_t, &t, &y);
        if !self.learn_sigma {
            return Batch { input, target: eps };
        }
        let plane = t.to_kind(Kind::Float).view([-1, 1, 1, 1]).expand_as(&eps.narrow(1, 0, 1));
        let target = Tensor::cat(&[&eps, &x_t, &x0.to_kind(Kind::Float), &plane], 1);
        Batch { input, target }
    }

    /// `MSE(ε̂, ε)`: the first `C` channels of `output` `[B, out_C, S, S]` against ε, the first `C`
    /// channels of `target` ([`Diffusion::prepare`]), mean over every element, fp32 scalar. With
    /// `learn_sigma`, plus the mean over the batch of [`vb_bits`] with ε̂ detached (DiT's
    /// `mse + vb`, weight 1): the bound trains the variance channels only.
    pub fn loss(&self, output: &Tensor, target: &Tensor) -> Tensor {
        let c = self.channels;
        let out = output.to_kind(Kind::Float);
        let eps_hat = out.narrow(1, 0, c);
        let mse = (&eps_hat - target.narrow(1, 0, c).to_kind(Kind::Float)).square().mean(Kind::Float);
        if !self.learn_sigma {
            return mse;
        }
        let part = |k: i64| target.narrow(1, k * c, c);
        let t = target.select(1, 3 * c).select(1, 0).select(1, 0).to_kind(Kind::Int64);
        let (x_t, x0) = (part(1), part(2));
        let vb = vb_bits(&eps_hat.detach(), &out.narrow(1, c, c), &x0, &x_t, &t);
        mse + vb.mean(Kind::Float)
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
                let per = (e - batch.target.narrow(1, 0, self.channels)).square().flatten(1, -1).mean_dim(
                    1,
                    false,
                    Kind::Double,
                );
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
    let s = Schedule::on(x0.device());
    at(&s.sqrt_ab, t) * x0.to_kind(Kind::Float) + at(&s.sqrt_one_minus_ab, t) * eps.to_kind(Kind::Float)
}

/// A reverse-process sampler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Sampler {
    /// DDPM ancestral sampling over all 1000 steps, posterior variance `β̃_t` (or the
    /// model's own with `learn_sigma`).
    Ddpm,
    /// DDIM with η = 0 (deterministic) over `steps` evenly spaced timesteps.
    Ddim,
}

/// Which weights of a diffusion run draw the samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Weights {
    /// The moving average (`train.ema`) where the run kept one, else the trained weights.
    #[default]
    Auto,
    /// The moving average; an error if the run kept none.
    Ema,
    /// The weights as trained (`final.safetensors`).
    Raw,
}

/// The weights file of `run` for `which`: `final_ema.safetensors` or `final.safetensors`.
pub fn weights_file(run: &crate::run_dir::RunDir, which: Weights) -> anyhow::Result<std::path::PathBuf> {
    let ema = run.final_ema_checkpoint();
    match which {
        Weights::Raw => Ok(run.final_checkpoint()),
        Weights::Auto if ema.is_file() => Ok(ema),
        Weights::Auto => Ok(run.final_checkpoint()),
        Weights::Ema if ema.is_file() => Ok(ema),
        Weights::Ema => anyhow::bail!(
            "--weights ema: {} has no {} (the run kept no moving average: set train.ema, e.g. 0.9999, when training)",
            run.path.display(),
            ema.display()
        ),
    }
}

/// How to sample: the sampler, its number of steps (DDIM), the guidance scale and the seed.
#[derive(Debug, Clone, Copy)]
pub struct SampleOptions {
    pub sampler: Sampler,
    pub steps: usize,
    pub cfg: f64,
    pub seed: u64,
    /// The weights to sample with ([`sample_run`] and `plexus fd`; [`sample`] takes a model).
    pub weights: Weights,
}

/// The most images per class `plexus sample` draws into its grid.
pub const MAX_PER_CLASS: usize = 100;
/// The most images sampled at once (`plexus sample`, `plexus fd`).
pub const SAMPLE_CHUNK: i64 = 256;

/// The largest classifier-free guidance scale the sampling commands take (papers use 1.5–10; far
/// beyond, ε̂ overflows and the images are not finite).
pub const MAX_CFG: f64 = 100.0;

impl SampleOptions {
    /// The flags `plexus sample` and `plexus fd` share, checked once for both: `--cfg` a finite
    /// scale in 0..=[`MAX_CFG`], `--steps` in 1..=1000.
    pub fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.cfg.is_finite() && (0.0..=MAX_CFG).contains(&self.cfg),
            "--cfg must be a finite guidance scale in 0..={MAX_CFG} (1 = no guidance), got {}",
            self.cfg
        );
        anyhow::ensure!(
            (1..=STEPS as usize).contains(&self.steps),
            "--steps must be in 1..={STEPS}, got {}",
            self.steps
        );
        Ok(())
    }
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
    let SampleOptions { sampler, steps, cfg, seed, .. } = *o;
    let dev = labels.device();
    let ab: Vec<f64> = crate::host::values(&alpha_bar());
    let beta: Vec<f64> = crate::host::values(&betas());
    let _seed = crate::device::seed_guard(seed);
    tch::no_grad(|| {
        let mut x = Tensor::randn(shape, (Kind::Float, dev));
        let n = shape[0];
        // ε̂ (guided) and, with `learn_sigma`, the variance channels `v` of the conditional half.
        let guided = |x: &Tensor, t: i64| -> (Tensor, Option<Tensor>) {
            let tt = Tensor::full([n], t, (Kind::Int64, dev));
            let c = d.channels;
            let variance = |out: &Tensor| d.learn_sigma.then(|| out.narrow(0, 0, n).narrow(1, c, c));
            if cfg == 1.0 {
                let out = eps(&pack(x, &tt, labels));
                return (out.narrow(1, 0, c), variance(&out));
            }
            let null = labels.full_like(d.num_classes);
            let out = eps(&Tensor::cat(&[pack(x, &tt, labels), pack(x, &tt, &null)], 0));
            let e = out.narrow(1, 0, c);
            let (cond, uncond) = (e.narrow(0, 0, n), e.narrow(0, n, n));
            (&uncond + (cond - &uncond) * cfg, variance(&out))
        };
        let schedule = d.learn_sigma.then(|| Schedule::on(dev));
        let ts = timesteps(sampler, steps);
        for (i, &t) in ts.iter().enumerate() {
            let (e, v) = guided(&x, t);
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
                        let noise = x.randn_like();
                        let noise = match (&v, &schedule) {
                            (Some(v), Some(s)) => {
                                let tt = Tensor::full([n], t, (Kind::Int64, dev));
                                noise * (learned_log_var(s, v, &tt) * 0.5).exp()
                            }
                            _ => noise * (b * (1.0 - ab[t as usize - 1]) / (1.0 - a)).sqrt(),
                        };
                        mean + noise
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
    anyhow::ensure!(
        (1..=MAX_PER_CLASS).contains(&per_class),
        "--per-class {per_class}: expected an integer in 1..={MAX_PER_CLASS} (images per class in the PNG grid; \
         to score many samples, use plexus fd --samples)"
    );
    o.check()?;
    let dev = crate::device::resolve(crate::device::parse_device(device).map_err(anyhow::Error::msg)?)?;
    let mut model = crate::device::with_seed(exp.config().seed, || {
        crate::model::Model::new(exp.model.as_ref(), exp.topology.as_ref(), dev, Kind::Float)
    });
    let ck = weights_file(&dir, o.weights)?;
    crate::train::checkpoint::load_final(&mut model.vs, &dir, &ck)?;
    let info = exp.data.info();
    let (c, s) = (info.input_shape[0] as i64, info.input_shape[1] as i64);
    let k = d.num_classes;
    let labels = Tensor::arange(k, (Kind::Int64, dev)).repeat_interleave_self_int(per_class as i64, 0, None);
    let n = labels.size()[0];
    // In chunks of at most SAMPLE_CHUNK images, so memory does not grow with the grid (chunk i
    // draws its noise from seed + its first image's index, as `plexus fd` does).
    let x = Tensor::cat(
        &(0..n)
            .step_by(SAMPLE_CHUNK as usize)
            .map(|at| {
                let m = (n - at).min(SAMPLE_CHUNK);
                let chunk = SampleOptions { seed: o.seed.wrapping_add(at as u64), ..*o };
                sample(|x| model.forward(x, false), &d, [m, c, s, s], &labels.narrow(0, at, m), &chunk)
            })
            .collect::<Vec<_>>(),
        0,
    );
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
    let px: Vec<f32> = crate::host::values(&(x * 255.0).round()).into_iter().map(|v| v as f32).collect();
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
    crate::run_dir::atomic_write_with(&out, |p| img.save(p).context("encoding the PNG"))?;
    Ok(out)
}
