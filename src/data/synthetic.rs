//! Generated data.
//!
//! `whitened_regression`: the ANCRe case study's regression problem. Inputs are whitened
//! (`X Xᵀ = I_d` in the paper's column convention; here rows are samples, so `Xᵀ X = I_d` for the
//! `[n, d]` matrix) and targets are `Y = A X` for a fixed `A = U diag(σ) Vᵀ` of rank `rank`, with
//! singular values evenly spaced in `[sigma_min, sigma_max]`. A rank-deficient `A` is what
//! Theorem 3.2 needs for the sublinear lower bound of the `0:1` layout.
//!
//! The data has its own `seed`, so every topology in a comparison sees the same problem.

use super::in_memory::InMemory;
use super::{check_ranges, Batch, DataEntry, DataInfo, DataSource, DataSpec, InputTransform, Task, MAX_BATCH};
use crate::config::{parse_options, OptionError};
use rand::SeedableRng;
use serde::Deserialize;
use std::path::Path;
use tch::{Device, Kind, Tensor};

pub const WHITENED_REGRESSION: DataEntry = DataEntry {
    name: "whitened_regression",
    about: "whitened inputs, targets Y = A X with a (rank-deficient) A (ANCRe §3)",
    parse,
};

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Options {
    dim: usize,
    samples: usize,
    /// Rank of A; default `dim / 2`.
    rank: Option<usize>,
    sigma_min: f64,
    sigma_max: f64,
    seed: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options { dim: 16, samples: 64, rank: None, sigma_min: 1.0, sigma_max: 2.0, seed: 0 }
    }
}

#[derive(Debug)]
struct Spec {
    dim: usize,
    samples: usize,
    rank: usize,
    sigma_min: f64,
    sigma_max: f64,
    seed: u64,
}

fn parse(opts: &serde_yaml::Mapping, _pinned: Option<&Path>) -> Result<Box<dyn DataSpec>, OptionError> {
    let o: Options = parse_options(opts)?;
    check_ranges(&[("dim", o.dim, 1, 4096)])?;
    if o.samples < o.dim {
        return Err(OptionError::new(
            "samples",
            o.samples,
            format!("at least `dim` = {} samples (whitening needs n ≥ d)", o.dim),
        ));
    }
    let rank = o.rank.unwrap_or(o.dim / 2);
    check_ranges(&[("rank", rank, 0, o.dim)])?;
    if !(o.sigma_min.is_finite() && o.sigma_max.is_finite() && 0.0 < o.sigma_min && o.sigma_min <= o.sigma_max) {
        return Err(OptionError::new(
            "sigma_min",
            o.sigma_min,
            format!("finite singular values with 0 < sigma_min ≤ sigma_max (sigma_max = {})", o.sigma_max),
        ));
    }
    Ok(Box::new(Spec {
        dim: o.dim,
        samples: o.samples,
        rank,
        sigma_min: o.sigma_min,
        sigma_max: o.sigma_max,
        seed: o.seed,
    }))
}

impl DataSpec for Spec {
    fn kind(&self) -> &'static str {
        "whitened_regression"
    }
    fn info(&self) -> DataInfo {
        DataInfo { input_shape: vec![self.dim], output_dim: self.dim, task: Task::HalfSumSquares }
    }
    fn load(&self) -> anyhow::Result<Box<dyn DataSource>> {
        let (x, y) = self.generate();
        Ok(Box::new(FullBatch { x, y }))
    }
}

impl Spec {
    /// Returns `(X [n, d], Y [n, d])` in fp32, generated in fp64 from `seed`.
    fn generate(&self) -> (Tensor, Tensor) {
        let opts = (Kind::Double, Device::Cpu);
        let (n, d) = (self.samples as i64, self.dim as i64);
        let (g, h, k) = crate::device::with_seed(self.seed, || {
            (Tensor::randn([n, d], opts), Tensor::randn([d, d], opts), Tensor::randn([d, d], opts))
        });
        let (x, _) = Tensor::linalg_qr(&g, "reduced");
        let (u, _) = Tensor::linalg_qr(&h, "reduced");
        let (v, _) = Tensor::linalg_qr(&k, "reduced");
        let mut sigma = vec![0.0f64; self.dim];
        for (i, s) in sigma.iter_mut().take(self.rank).enumerate() {
            let t = if self.rank > 1 { i as f64 / (self.rank - 1) as f64 } else { 0.0 };
            *s = self.sigma_max - t * (self.sigma_max - self.sigma_min);
        }
        let a = u.matmul(&Tensor::from_slice(&sigma).diag(0)).matmul(&v.tr());
        let y = x.matmul(&a.tr());
        (x.to_kind(Kind::Float), y.to_kind(Kind::Float))
    }
}

struct FullBatch {
    x: Tensor,
    y: Tensor,
}

impl DataSource for FullBatch {
    fn train_batch(&self, _index: u64) -> anyhow::Result<Batch> {
        Ok(Batch { input: self.x.shallow_clone(), target: self.y.shallow_clone() })
    }
    fn batches_per_epoch(&self) -> u64 {
        1
    }
    /// The case study measures optimisation, not generalisation: there is no held-out set.
    fn eval_batches(&self) -> Vec<Batch> {
        Vec::new()
    }
    fn make_resident(&mut self, device: Device) -> bool {
        (self.x, self.y) = (self.x.to_device(device), self.y.to_device(device));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_whitened_and_target_map_has_the_rank_asked_for() {
        let spec = Spec { dim: 8, samples: 32, rank: 3, sigma_min: 1.0, sigma_max: 2.0, seed: 7 };
        let (x, y) = spec.generate();
        let gram = x.tr().matmul(&x) - Tensor::eye(8, (Kind::Float, Device::Cpu));
        assert!(gram.abs().max().double_value(&[]) < 1e-5);
        // Y = X Aᵀ with Xᵀ X = I, so A = (Xᵀ Y)ᵀ.
        let a = x.tr().matmul(&y).tr();
        let sv = Vec::<f32>::try_from(a.svd(true, true).1).unwrap();
        assert!((sv[0] - 2.0).abs() < 1e-4 && (sv[2] - 1.0).abs() < 1e-4, "{sv:?}");
        assert!(sv[3] < 1e-4, "rank 3 expected: {sv:?}");
    }
}

/// `synthetic_images`: class-prototype images for smoke tests and parity shapes, generated from a
/// seed: each class has a random prototype `[C, S, S]`; a sample is its class prototype plus
/// Gaussian noise of standard deviation `noise`. Learnable, so a falling loss means something.
pub const SYNTHETIC_IMAGES: DataEntry = DataEntry {
    name: "synthetic_images",
    about: "generated class-prototype images (smoke tests; no download)",
    parse: parse_images,
};

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct ImageOptions {
    image_size: usize,
    channels: usize,
    classes: usize,
    samples: usize,
    noise: f64,
    batch_size: usize,
    seed: u64,
}

impl Default for ImageOptions {
    fn default() -> Self {
        ImageOptions { image_size: 8, channels: 3, classes: 10, samples: 256, noise: 1.0, batch_size: 32, seed: 0 }
    }
}

#[derive(Debug)]
struct ImageSpec(ImageOptions);

fn parse_images(opts: &serde_yaml::Mapping, _pinned: Option<&Path>) -> Result<Box<dyn DataSpec>, OptionError> {
    let o: ImageOptions = parse_options(opts)?;
    check_ranges(&[
        ("image_size", o.image_size, 1, 512),
        ("channels", o.channels, 1, 64),
        ("classes", o.classes, 1, 100_000),
        ("samples", o.samples, 1, 10_000_000),
        ("batch_size", o.batch_size, 1, MAX_BATCH),
    ])?;
    if !(o.noise.is_finite() && o.noise >= 0.0) {
        return Err(OptionError::new("noise", o.noise, "a finite standard deviation ≥ 0"));
    }
    Ok(Box::new(ImageSpec(o)))
}

impl DataSpec for ImageSpec {
    fn kind(&self) -> &'static str {
        "synthetic_images"
    }
    fn info(&self) -> DataInfo {
        let o = &self.0;
        DataInfo {
            input_shape: vec![o.channels, o.image_size, o.image_size],
            output_dim: o.classes,
            task: Task::Classification,
        }
    }
    fn load(&self) -> anyhow::Result<Box<dyn DataSource>> {
        let o = &self.0;
        let opts = (Kind::Float, Device::Cpu);
        let (c, s) = (o.channels as i64, o.image_size as i64);
        let eval_n = (o.samples / 4).max(1) as i64;
        let (x, y, ex, ey) = crate::device::with_seed(o.seed, || {
            let protos = Tensor::randn([o.classes as i64, c, s, s], opts);
            let draw = |n: i64| {
                let labels = Tensor::randint(o.classes as i64, [n], (Kind::Int64, Device::Cpu));
                (protos.index_select(0, &labels) + Tensor::randn([n, c, s, s], opts) * o.noise, labels)
            };
            let (x, y) = draw(o.samples as i64);
            let (ex, ey) = draw(eval_n);
            (x, y, ex, ey)
        });
        Ok(Box::new(InMemory {
            x,
            y,
            eval: (ex, ey),
            batch: o.batch_size.min(o.samples),
            seed: o.seed,
            transform: InputTransform::Identity,
            eval_rows: None,
            files: Vec::new(),
        }))
    }
}

/// `synthetic_tokens`: token sequences from a fixed random Markov chain (each token has a few
/// likely successors), for smoke tests and parity shapes of language models without a corpus.
/// Learnable: the best achievable loss is the chain's entropy rate, well below `ln(vocab)`.
pub const SYNTHETIC_TOKENS: DataEntry = DataEntry {
    name: "synthetic_tokens",
    about: "generated Markov-chain token sequences (language-model smoke tests; no download)",
    parse: parse_tokens,
};

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct TokenOptions {
    vocab: usize,
    seq_len: usize,
    batch_size: usize,
    eval_batches: usize,
    seed: u64,
}

impl Default for TokenOptions {
    fn default() -> Self {
        TokenOptions { vocab: 64, seq_len: 32, batch_size: 16, eval_batches: 4, seed: 0 }
    }
}

#[derive(Debug)]
struct TokenSpec(TokenOptions);

fn parse_tokens(opts: &serde_yaml::Mapping, _pinned: Option<&Path>) -> Result<Box<dyn DataSpec>, OptionError> {
    let o: TokenOptions = parse_options(opts)?;
    check_ranges(&[
        ("vocab", o.vocab, 2, 1 << 20),
        ("seq_len", o.seq_len, 1, 1 << 16),
        ("batch_size", o.batch_size, 1, 1 << 16),
        ("eval_batches", o.eval_batches, 0, 1 << 16),
    ])?;
    Ok(Box::new(TokenSpec(o)))
}

impl DataSpec for TokenSpec {
    fn kind(&self) -> &'static str {
        "synthetic_tokens"
    }
    fn info(&self) -> DataInfo {
        DataInfo { input_shape: vec![self.0.seq_len], output_dim: self.0.vocab, task: Task::LanguageModel }
    }
    fn load(&self) -> anyhow::Result<Box<dyn DataSource>> {
        use rand::Rng;
        let o = &self.0;
        let mut rng = rand::rngs::StdRng::seed_from_u64(o.seed);
        // Four likely successors per token, with probabilities 0.55, 0.25, 0.15, 0.05.
        let successors: Vec<[u32; 4]> =
            (0..o.vocab).map(|_| [0; 4].map(|_: u32| rng.gen_range(0..o.vocab as u32))).collect();
        Ok(Box::new(MarkovTokens { successors, o: o.clone() }))
    }
}

struct MarkovTokens {
    successors: Vec<[u32; 4]>,
    o: TokenOptions,
}

impl MarkovTokens {
    /// `batch_size` sequences of `seq_len + 1` tokens drawn from `stream_seed`.
    fn sample(&self, stream_seed: u64) -> Batch {
        use rand::Rng;
        let (b, t) = (self.o.batch_size, self.o.seq_len);
        let mut rng = rand::rngs::StdRng::seed_from_u64(stream_seed);
        let mut toks = Vec::with_capacity(b * (t + 1));
        for _ in 0..b {
            let mut cur = rng.gen_range(0..self.o.vocab as u32);
            for _ in 0..=t {
                toks.push(cur as i64);
                let u: f64 = rng.gen();
                let pick = if u < 0.55 {
                    0
                } else if u < 0.8 {
                    1
                } else if u < 0.95 {
                    2
                } else {
                    3
                };
                cur = self.successors[cur as usize][pick];
            }
        }
        let all = Tensor::from_slice(&toks).view([b as i64, t as i64 + 1]);
        Batch { input: all.narrow(1, 0, t as i64), target: all.narrow(1, 1, t as i64) }
    }
}

impl DataSource for MarkovTokens {
    fn train_batch(&self, index: u64) -> anyhow::Result<Batch> {
        Ok(self.sample(self.o.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (2 * index + 1)))
    }
    fn batches_per_epoch(&self) -> u64 {
        u64::MAX
    }
    fn eval_batches(&self) -> Vec<Batch> {
        (0..self.o.eval_batches as u64)
            .map(|i| self.sample(self.o.seed.wrapping_mul(31) ^ (2 * i) ^ (1 << 40)))
            .collect()
    }
}
