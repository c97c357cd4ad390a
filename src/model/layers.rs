//! Layers shared by backbones, with the precision rule of plexus: parameters are fp32 master
//! weights; a `Linear` computes in `compute` (bf16 under `precision: bf16`) and returns fp32;
//! norms, activations, softmax and losses stay fp32.

use tch::{nn, nn::Module, Kind, Tensor};

/// `torch.nn.Linear` (weight `[out, in]`, optional bias) computing in a chosen dtype.
pub struct Linear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub compute: Kind,
}

impl Linear {
    /// PyTorch's default init (Kaiming-uniform weight, uniform bias), named `<vs>.weight/.bias`.
    pub fn new(vs: &nn::Path, in_dim: i64, out_dim: i64, bias: bool, compute: Kind) -> Self {
        let l = nn::linear(vs, in_dim, out_dim, nn::LinearConfig { bias, ..Default::default() });
        Self { weight: l.ws, bias: l.bs, compute }
    }

    /// `x`: `[.., in]` → `[.., out]` fp32.
    pub fn forward(&self, x: &Tensor) -> Tensor {
        // aten::linear (one addmm, bias inside the GEMM): the same kernel, and so the same
        // bf16 rounding, as torch.nn.functional.linear.
        let c = self.compute;
        let bias = self.bias.as_ref().map(|b| b.to_kind(c));
        x.to_kind(c).linear(&self.weight.to_kind(c), bias.as_ref()).to_kind(Kind::Float)
    }
}

/// `torch.nn.LayerNorm(d, eps=1e-5)` in fp32.
pub fn layer_norm(vs: &nn::Path, d: i64) -> nn::LayerNorm {
    nn::layer_norm(vs, vec![d], Default::default())
}

/// Applies a pre-norm as a topology asks (default, scaled, or off).
pub fn pre_norm(norm: &nn::LayerNorm, x: &Tensor, mode: crate::topology::Norm) -> Tensor {
    use crate::topology::Norm;
    match mode {
        Norm::Default => norm.forward(&x.to_kind(Kind::Float)),
        Norm::Scaled(s) => norm.forward(&x.to_kind(Kind::Float)) * s,
        Norm::Off => x.shallow_clone(),
    }
}

/// A two-layer MLP `fc2(gelu(fc1(x)))` (exact GELU), named `fc1`, `fc2`.
pub struct Mlp {
    pub fc1: Linear,
    pub fc2: Linear,
}

impl Mlp {
    pub fn new(vs: &nn::Path, d_in: i64, hidden: i64, d_out: i64, compute: Kind) -> Self {
        Self {
            fc1: Linear::new(&(vs / "fc1"), d_in, hidden, true, compute),
            fc2: Linear::new(&(vs / "fc2"), hidden, d_out, true, compute),
        }
    }

    pub fn forward(&self, x: &Tensor) -> Tensor {
        self.fc2.forward(&self.fc1.forward(x).gelu("none"))
    }
}
