//! DDPM (Ho et al. 2020) as DiT trains it: ε-prediction, a linear β schedule from 1e-4 to 0.02
//! over [`STEPS`] = 1000 steps, loss `MSE(ε̂, ε)` at a uniform random `t`, class labels replaced
//! by the null class with probability `diffusion.label_dropout` (default 0.1) for
//! classifier-free guidance.
//!
//! The trainer runs diffusion like any task: [`Task::prepare`] turns an image batch (`[B, C, S, S]`
//! after the input transform, labels `[B]`) into DiT model inputs ([`pack`]) and noise targets,
//! and [`Task::loss`] reads the ε
//! channels of the output. Noise, `t` and the dropout mask come from libtorch's global generator,
//! which the trainer reseeds from `(seed, step)`: a resumed run draws what it would have drawn.
//!
//! With `model.learn_sigma: true` the model also predicts the variance of each reverse step
//! (Nichol & Dhariwal 2021, as DiT trains it): output channels `C..2C` are `v ∈ [−1, 1]`
//! interpolating `log σ²_t = ((v+1)/2)·log β_t + (1 − (v+1)/2)·log β̃_t`, trained by the variational
//! bound term `L_vb` added to the ε-MSE (with ε̂ detached in `L_vb`, so the bound trains only the
//! variance), and DDPM sampling draws with that variance. See [`Diffusion::loss`].
//!
//! Sampling, and the commands that sample, are in diffusion.rs; validation per bucket of
//! timesteps in `train::eval::evaluate_diffusion`.
//!
//! [`Task::prepare`]: super::Task::prepare
//! [`Task::loss`]: super::Task::loss

use super::Batch;
use tch::{Device, Kind, Tensor};

/// Number of diffusion steps `T`.
pub const STEPS: i64 = 1000;
/// Validation buckets of `t` (`STEPS / BUCKETS` timesteps each).
pub const BUCKETS: i64 = 10;
/// Seed of the validation noise and timesteps: the same draws at every evaluation.
pub const EVAL_SEED: u64 = 0xD1F7_5EED;

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
pub(crate) fn learned_log_var(s: &Schedule, v: &Tensor, t: &Tensor) -> Tensor {
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
}

/// `x_t = √ᾱ_t·x0 + √(1−ᾱ_t)·ε`: `x0`, `eps` `[B, C, S, S]`, `t` `[B]` int64 → fp32.
pub fn noisy(x0: &Tensor, t: &Tensor, eps: &Tensor) -> Tensor {
    let s = Schedule::on(x0.device());
    at(&s.sqrt_ab, t) * x0.to_kind(Kind::Float) + at(&s.sqrt_one_minus_ab, t) * eps.to_kind(Kind::Float)
}

/// Packs a DiT model input: `x` `[B, C, S, S]`, `t` `[B]` (any numeric kind, `0 ≤ t < 1000`),
/// `y` `[B]` int64 labels (`num_classes` = null) → `[B, C·S·S + 2]` fp32 on `x`'s device.
pub fn pack(x: &Tensor, t: &Tensor, y: &Tensor) -> Tensor {
    let b = x.size()[0];
    Tensor::cat(
        &[
            x.to_kind(Kind::Float).reshape([b, -1]),
            t.to_kind(Kind::Float).reshape([b, 1]).to_device(x.device()),
            y.to_kind(Kind::Float).reshape([b, 1]).to_device(x.device()),
        ],
        1,
    )
}
