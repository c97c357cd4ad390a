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
