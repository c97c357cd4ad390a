//! Generated data.
//!
//! `whitened_regression`: the ANCRe case study's regression problem. Inputs are whitened
//! (`X Xᵀ = I_d` in the paper's column convention; here rows are samples, so `Xᵀ X = I_d` for the
//! `[n, d]` matrix) and targets are `Y = A X` for a fixed `A = U diag(σ) Vᵀ` of rank `rank`, with
//! singular values evenly spaced in `[sigma_min, sigma_max]`. A rank-deficient `A` is what
//! Theorem 3.2 needs for the sublinear lower bound of the `0:1` layout.
//!
//! The data has its own `seed`, so every topology in a comparison sees the same problem.

use super::{Batch, DataEntry, DataInfo, DataSource, DataSpec, Task};
use crate::config::{parse_options, OptionError};
use serde::Deserialize;
use tch::{Device, Kind, Tensor};

pub const WHITENED_REGRESSION: DataEntry = DataEntry {
    name: "whitened_regression",
    about: "whitened inputs, targets Y = A X with a (rank-deficient) A (ANCRe §3)",
    parse,
};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Options {
    #[serde(default = "default_dim")]
    dim: usize,
    #[serde(default = "default_samples")]
    samples: usize,
    /// Rank of A; default `dim / 2`.
    rank: Option<usize>,
    #[serde(default = "one")]
    sigma_min: f64,
    #[serde(default = "two")]
    sigma_max: f64,
    #[serde(default)]
    seed: u64,
}

fn default_dim() -> usize {
    16
}
fn default_samples() -> usize {
    64
}
fn one() -> f64 {
    1.0
}
fn two() -> f64 {
    2.0
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

fn parse(opts: &serde_yaml::Mapping) -> Result<Box<dyn DataSpec>, OptionError> {
    let o: Options = parse_options(opts)?;
    if o.dim == 0 || o.dim > 4096 {
        return Err(OptionError::new("dim", o.dim, "an integer in 1..=4096"));
    }
    if o.samples < o.dim {
        return Err(OptionError::new(
            "samples",
            o.samples,
            format!("at least `dim` = {} samples (whitening needs n ≥ d)", o.dim),
        ));
    }
    let rank = o.rank.unwrap_or(o.dim / 2);
    if rank > o.dim {
        return Err(OptionError::new(
            "rank",
            rank,
            format!("an integer in 0..={}", o.dim),
        ));
    }
    if !(o.sigma_min.is_finite()
        && o.sigma_max.is_finite()
        && 0.0 < o.sigma_min
        && o.sigma_min <= o.sigma_max)
    {
        return Err(OptionError::new(
            "sigma_min",
            o.sigma_min,
            format!(
                "finite singular values with 0 < sigma_min ≤ sigma_max (sigma_max = {})",
                o.sigma_max
            ),
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
        DataInfo {
            input_dim: self.dim,
            output_dim: self.dim,
            task: Task::HalfSumSquares,
        }
    }
    fn load(&self, device: Device) -> anyhow::Result<Box<dyn DataSource>> {
        let (x, y) = self.generate();
        Ok(Box::new(FullBatch {
            x: x.to_device(device),
            y: y.to_device(device),
        }))
    }
}

impl Spec {
    /// Returns `(X [n, d], Y [n, d])` in fp32, generated in fp64 from `seed`.
    fn generate(&self) -> (Tensor, Tensor) {
        let opts = (Kind::Double, Device::Cpu);
        let (n, d) = (self.samples as i64, self.dim as i64);
        tch::manual_seed(self.seed as i64);
        let (x, _) = Tensor::linalg_qr(&Tensor::randn([n, d], opts), "reduced");
        let (u, _) = Tensor::linalg_qr(&Tensor::randn([d, d], opts), "reduced");
        let (v, _) = Tensor::linalg_qr(&Tensor::randn([d, d], opts), "reduced");
        let mut sigma = vec![0.0f64; self.dim];
        for (i, s) in sigma.iter_mut().take(self.rank).enumerate() {
            let t = if self.rank > 1 {
                i as f64 / (self.rank - 1) as f64
            } else {
                0.0
            };
            *s = self.sigma_max - t * (self.sigma_max - self.sigma_min);
        }
        let a = u
            .matmul(&Tensor::from_slice(&sigma).diag(0))
            .matmul(&v.tr());
        let y = x.matmul(&a.tr());
        (x.to_kind(Kind::Float), y.to_kind(Kind::Float))
    }
}

struct FullBatch {
    x: Tensor,
    y: Tensor,
}

impl DataSource for FullBatch {
    fn next_train(&mut self) -> Batch {
        Batch {
            input: self.x.shallow_clone(),
            target: self.y.shallow_clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_whitened_and_target_map_has_the_rank_asked_for() {
        let spec = Spec {
            dim: 8,
            samples: 32,
            rank: 3,
            sigma_min: 1.0,
            sigma_max: 2.0,
            seed: 7,
        };
        let (x, y) = spec.generate();
        let gram = x.tr().matmul(&x) - Tensor::eye(8, (Kind::Float, Device::Cpu));
        assert!(gram.abs().max().double_value(&[]) < 1e-5);
        // Y = X Aᵀ with Xᵀ X = I, so A = (Xᵀ Y)ᵀ.
        let a = x.tr().matmul(&y).tr();
        let sv = Vec::<f32>::try_from(a.svd(true, true).1).unwrap();
        assert!(
            (sv[0] - 2.0).abs() < 1e-4 && (sv[2] - 1.0).abs() < 1e-4,
            "{sv:?}"
        );
        assert!(sv[3] < 1e-4, "rank 3 expected: {sv:?}");
    }
}
