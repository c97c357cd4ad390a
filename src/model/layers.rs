//! Layers shared by backbones, with the precision rule of plexus (CUDA autocast's rule, written
//! out): parameters are fp32 master weights; a `Linear` computes in `compute` (bf16 under
//! `precision: bf16`) and returns `compute`, and so does attention (its SDPA kernel runs on q, k,
//! v cast to `compute`); activations (GELU, SiLU, products) run in the dtype they are given, the
//! wider of two; norms take any dtype and return fp32, as do softmax outside SDPA and the losses.
//! So a branch's hidden activations are bf16 under `precision: bf16` (half the bytes, read and
//! saved for backward, of fp32), while everything a topology sees is fp32: [`crate::model::Model`]
//! casts the stem's output, each unit's output and the readout to fp32 — the residual stream and
//! the mixing of topologies never round to bf16. (A topology that adds a unit's output once to the
//! fp32 stream reads it in bf16 and lets type promotion make the add fp32 — the same numbers, one
//! cast kernel fewer on CUDA: `Unit::forward_compute`.) Norms hand their branch fp32, not bf16: a
//! norm read by one `Linear` is cast once either way, and for one read by several (LLaMA's q, k, v
//! and gate, up) a bf16 output would sum those projections' gradients in bf16, which autocast does
//! not; what would save traffic is a norm kernel that writes bf16 itself.

use tch::{nn, nn::Module, Device, Kind, Tensor};

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

    /// A Linear with explicit inits: `weight` `[out, in]` from `weight_init`, and a bias `[out]`
    /// from `bias_init` if one is given (none otherwise).
    pub fn with_init(
        vs: &nn::Path,
        in_dim: i64,
        out_dim: i64,
        weight_init: nn::Init,
        bias_init: Option<nn::Init>,
        compute: Kind,
    ) -> Self {
        let weight = vs.var("weight", &[out_dim, in_dim], weight_init);
        let bias = bias_init.map(|i| vs.var("bias", &[out_dim], i));
        Self { weight, bias, compute }
    }

    /// `x`: `[.., in]` (any float dtype) → `[.., out]` in `compute`.
    pub fn forward(&self, x: &Tensor) -> Tensor {
        linear(x, &self.weight, self.bias.as_ref(), self.compute)
    }

    /// The same map along the middle axis: `x` `[B, in, N]` → `weight @ x + bias[:, None]`
    /// `[B, out, N]` in `compute` — what `forward(x.transpose(1, 2)).transpose(1, 2)` computes (the Mixer's
    /// token mixing), as one batched GEMM per sample with the weight broadcast over the batch, so
    /// neither `x` nor the result is transposed into a contiguous copy, forward or backward.
    pub fn forward_columns(&self, x: &Tensor) -> Tensor {
        let (b, n) = (x.size()[0], x.size()[2]);
        let out = self.weight.size()[0];
        let weight = self.weight.to_kind(self.compute).unsqueeze(0).expand([b, -1, -1], false);
        let x = x.to_kind(self.compute);
        match &self.bias {
            Some(bias) => {
                bias.to_kind(self.compute).unsqueeze(-1).expand([b, out, n], false).baddbmm(&weight, &x, 1, 1)
            }
            None => weight.bmm(&x),
        }
    }
}

/// `x @ weightᵀ + bias` computed in `compute`: `x` `[.., in]`, `weight` `[out, in]`, `bias`
/// `[out]` → `[.., out]` in `compute`. Also the tied LM head (`weight` = the embedding matrix).
pub fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>, compute: Kind) -> Tensor {
    // aten::linear (one addmm, bias inside the GEMM): the same kernel, and so the same
    // bf16 rounding, as torch.nn.functional.linear.
    let bias = bias.map(|b| b.to_kind(compute));
    x.to_kind(compute).linear(&weight.to_kind(compute), bias.as_ref())
}

/// `torch.nn.LayerNorm(d, eps=1e-5)` (weight 1, bias 0) computing in fp32 whatever its input.
pub fn layer_norm(vs: &nn::Path, d: i64) -> LayerNorm {
    LayerNorm::new(vs, d, true)
}

/// Applies a pre-norm (a norm module returning fp32: [`LayerNorm`], [`RmsNorm`]) as a topology
/// asks (default, scaled, or off). `x` `[.., D]` fp32 (the stream) → `[.., D]` fp32.
pub fn pre_norm(norm: &impl Module, x: &Tensor, mode: crate::topology::Norm) -> Tensor {
    use crate::topology::Norm;
    match mode {
        Norm::Default => norm.forward(x),
        Norm::Scaled(s) => norm.forward(x) * s,
        Norm::Off => x.shallow_clone(),
    }
}

/// A pre-norm that can write its output in the unit's compute dtype itself.
pub trait PreNorm: Module {
    /// `[.., D]` fp32 (the stream) → `[.., D]` in `kind`: the norm in fp32, then the cast the
    /// unit's first matmul would make anyway — on a GPU in bf16 both in one kernel each way
    /// ([`crate::native::choice::norm_to_bf16`]), with no fp32 output.
    fn forward_to(&self, x: &Tensor, kind: Kind) -> Tensor;
}

impl PreNorm for LayerNorm {
    fn forward_to(&self, x: &Tensor, kind: Kind) -> Tensor {
        if kind != Kind::BFloat16 {
            return self.forward(x).to_kind(kind);
        }
        let x = x.to_kind(Kind::Float);
        let composite = || self.forward(&x);
        crate::native::choice::norm_to_bf16(
            &x,
            &self.weight,
            self.bias.as_ref(),
            1e-5,
            crate::native::kernels::NormKind::Layer,
            composite,
        )
    }
}

impl PreNorm for RmsNorm {
    fn forward_to(&self, x: &Tensor, kind: Kind) -> Tensor {
        if kind != Kind::BFloat16 {
            return self.forward(x).to_kind(kind);
        }
        let x = x.to_kind(Kind::Float);
        crate::native::choice::norm_to_bf16(
            &x,
            &self.weight,
            None,
            self.eps,
            crate::native::kernels::NormKind::Rms,
            || self.forward(&x),
        )
    }
}

/// [`pre_norm`] whose default output comes in the unit's compute dtype `kind` ([`PreNorm`]), for a
/// unit whose one use of it is a matmul in that dtype (which would cast it). Only for one use:
/// the gradients of several uses of a bf16 tensor add in bf16, those of several casts of an fp32
/// one in fp32 (autocast's, the reference's). Scaled and off norms stay fp32.
pub fn pre_norm_to(norm: &impl PreNorm, x: &Tensor, mode: crate::topology::Norm, kind: Kind) -> Tensor {
    match mode {
        crate::topology::Norm::Default => norm.forward_to(x, kind),
        _ => pre_norm(norm, x, mode),
    }
}

/// A two-layer MLP `fc2(gelu(fc1(x)))` (exact GELU), named `fc1`, `fc2`.
pub struct Mlp {
    pub fc1: Linear,
    pub fc2: Linear,
}

impl Mlp {
    /// `fc1: d_in → hidden`, `fc2: hidden → d_out`, both with biases, matmuls in `compute`.
    pub fn new(vs: &nn::Path, d_in: i64, hidden: i64, d_out: i64, compute: Kind) -> Self {
        Self {
            fc1: Linear::new(&(vs / "fc1"), d_in, hidden, true, compute),
            fc2: Linear::new(&(vs / "fc2"), hidden, d_out, true, compute),
        }
    }

    /// `x`: `[.., d_in]` → `[.., d_out]` in the compute dtype.
    pub fn forward(&self, x: &Tensor) -> Tensor {
        self.fc2.forward(&self.fc1.forward(x).gelu("none"))
    }

    /// The MLP along the middle axis, `[B, d_in, N]` → `[B, d_out, N]` (see
    /// [`Linear::forward_columns`]).
    pub fn forward_columns(&self, x: &Tensor) -> Tensor {
        self.fc2.forward_columns(&self.fc1.forward_columns(x).gelu("none"))
    }
}

/// `torch.nn.LayerNorm(d, eps=1e-5)` with a weight (init 1) and an optional bias (init 0), in fp32:
/// nanoGPT's `LayerNorm(ndim, bias)`. Names `<vs>.weight`, `<vs>.bias`.
#[derive(Debug)]
pub struct LayerNorm {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    dim: i64,
}

impl LayerNorm {
    /// A norm over the last dimension of size `d`, with a bias when `bias`.
    pub fn new(vs: &nn::Path, d: i64, bias: bool) -> Self {
        Self {
            weight: vs.var("weight", &[d], nn::Init::Const(1.0)),
            bias: bias.then(|| vs.var("bias", &[d], nn::Init::Const(0.0))),
            dim: d,
        }
    }
}

impl Module for LayerNorm {
    /// `[.., D]` any float dtype → `[.., D]` fp32.
    fn forward(&self, x: &Tensor) -> Tensor {
        x.to_kind(Kind::Float).layer_norm([self.dim], Some(&self.weight), self.bias.as_ref(), 1e-5, true)
    }
}

/// RMSNorm with a weight (init 1), LLaMA's: `weight · x / sqrt(mean(x², -1) + eps)`, in fp32.
/// Name `<vs>.weight`.
#[derive(Debug)]
pub struct RmsNorm {
    pub weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    /// A norm over the last dimension of size `d`; `eps` inside the square root.
    pub fn new(vs: &nn::Path, d: i64, eps: f64) -> Self {
        Self { weight: vs.var("weight", &[d], nn::Init::Const(1.0)), eps }
    }
}

impl Module for RmsNorm {
    /// `[.., D]` any float dtype → `[.., D]` fp32.
    fn forward(&self, x: &Tensor) -> Tensor {
        // aten::rms_norm: on the CPU it is the same composite of square, mean, rsqrt and products
        // as the formula above (bit-identical), on CUDA one fused kernel each way instead of about
        // six forward and ten backward launches per norm (LLaMA has two per block).
        let d = self.weight.size()[0];
        x.to_kind(Kind::Float).rms_norm([d], Some(&self.weight), self.eps)
    }
}

/// `torch.nn.Embedding` lookup: `weight` `[V, D]`, `tokens` int64 `[..]` → `[.., D]` fp32.
/// Panics with a clear message on non-integer input.
pub fn embed_tokens(weight: &Tensor, tokens: &Tensor) -> Tensor {
    assert!(
        matches!(tokens.kind(), Kind::Int64 | Kind::Int),
        "a language model takes integer token ids [B, T]; got a {:?} tensor of shape {:?}",
        tokens.kind(),
        tokens.size()
    );
    Tensor::embedding(weight, tokens, -1, false, false)
}

/// Rotary position embedding (Su et al.), rotate-half convention (GPT-NeoX / Hugging Face LLaMA):
/// frequencies `θ_i = base^(−2i/hd)`, `i < hd/2`, angle `t·θ_i` at position `t`, the two halves of
/// each head's features rotated as pairs `(x_i, x_{i+hd/2})`.
///
/// The tables are computed in f64 and stored in the compute dtype, as Hugging Face LLaMA casts them
/// to q's dtype: in bf16, q and k come from a bf16 `Linear` and the rotation stays bf16 (two bf16
/// roundings, no fp32 `[B, H, T, hd]` temporaries and no cast before attention). In fp32 nothing
/// changes.
pub struct Rope {
    /// `[max_len, hd]` in the compute dtype, each frequency repeated for both halves.
    cos: Tensor,
    /// `[max_len, hd]`: `−sin` on the first half, `sin` on the second (the rotation's sign folded
    /// in, see [`Rope::apply`]).
    sin_signed: Tensor,
}

impl Rope {
    /// Tables for positions `0..max_len` and an even head dimension `hd`, in `compute` on `device`.
    pub fn new(max_len: i64, head_dim: i64, base: f64, device: Device, compute: Kind) -> Self {
        assert!(head_dim % 2 == 0, "RoPE needs an even head dimension, got {head_dim}");
        let opts = (Kind::Double, Device::Cpu);
        let inv_freq = (Tensor::arange_start_step(0, head_dim, 2, opts) * (-base.ln() / head_dim as f64)).exp();
        let freqs = Tensor::arange(max_len, opts).outer(&inv_freq); // [max_len, hd/2]
        let emb = Tensor::cat(&[&freqs, &freqs], -1); // [max_len, hd]
        let sin_signed = Tensor::cat(&[freqs.sin().neg(), freqs.sin()], -1);
        // Rounded to fp32 first (the tables' values do not depend on the precision beyond that).
        let put = |t: Tensor| t.to_kind(Kind::Float).to_kind(compute).to_device(device);
        Self { cos: put(emb.cos()), sin_signed: put(sin_signed) }
    }

    /// `x`: `[B, H, T, hd]` (positions `0..T`, `T ≤ max_len`) → rotated, same shape, in the
    /// promoted dtype of `x` and the tables (bf16 for bf16 q and k in a bf16 model).
    pub fn apply(&self, x: &Tensor) -> Tensor {
        let (t, hd) = (x.size()[2], x.size()[3]);
        let max_len = self.cos.size()[0];
        assert!(t <= max_len, "sequence of {t} tokens is longer than the model's context seq_len = {max_len}");
        let (cos, sin_signed) = (self.cos.narrow(0, 0, t), self.sin_signed.narrow(0, 0, t));
        // rotate_half(x)·sin = [−x₂, x₁]·[s, s] = roll(x, hd/2)·[−s, s]: one `roll` instead of two
        // halves, a negation and a `cat` (whose backwards zero-fill and copy), and one `addcmul`.
        (x * cos).addcmul(&x.roll([hd / 2], [-1]), &sin_signed)
    }

    /// `x` `[B, T, H·hd]` (q or k from a projection) → split into `heads` heads and rotated,
    /// `[B, H, T, hd]`: on a GPU one CUDA kernel each way ([`crate::native::choice::rope_heads`], which
    /// reads a block of a packed qkv where it is), else the transpose and [`Rope::apply`].
    pub fn apply_heads(&self, x: &Tensor, heads: i64) -> Tensor {
        let _scope = crate::native::kineto::scope(crate::native::kineto::scopes::ROPE);
        if let Some(y) = crate::native::choice::rope_heads(x, &self.cos, &self.sin_signed, heads) {
            return y;
        }
        let (b, t, d) = x.size3().expect("RoPE inputs are [B, T, D]");
        self.apply(&x.reshape([b, t, heads, d / heads]).transpose(1, 2))
    }

    /// The same tables, shared (no copy).
    pub fn shallow_clone(&self) -> Self {
        Self { cos: self.cos.shallow_clone(), sin_signed: self.sin_signed.shallow_clone() }
    }
}

/// Multi-head scaled dot-product attention (scale `1/sqrt(hd)`), without projections:
/// `q`, `k`, `v` `[B, T, D]` (any float dtype) are split into `heads` heads `[B, H, T, hd]`
/// (feature `h·hd + j` is feature `j` of head `h`), optionally rotated by `rope` (q and k), cast to
/// `compute` for `aten::scaled_dot_product_attention` (causal mask if `causal`; a no-op for q, k,
/// v that come in `compute` from a `Linear`, RoPE's tables being in `compute` too), and merged
/// back: `[B, T, D]` in `compute`.
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    heads: i64,
    causal: bool,
    rope: Option<&Rope>,
    compute: Kind,
) -> Tensor {
    let (b, t, d) = q.size3().expect("attention inputs are [B, T, D]");
    let split = |x: &Tensor| x.reshape([b, t, heads, d / heads]).transpose(1, 2);
    let (q, k, v) = match rope {
        Some(r) => (r.apply_heads(q, heads), r.apply_heads(k, heads), split(v)),
        None => (split(q), split(k), split(v)),
    };
    let o = Tensor::scaled_dot_product_attention(
        &q.to_kind(compute),
        &k.to_kind(compute),
        &v.to_kind(compute),
        None::<Tensor>,
        0.0,
        causal,
        None,
        false,
    );
    o.transpose(1, 2).reshape([b, t, d])
}

/// `torch.nn.functional.dropout(x, p, training=train)`; the identity (no kernel) when `p = 0` or
/// not training. Any shape.
pub fn dropout(x: Tensor, p: f64, train: bool) -> Tensor {
    if train && p > 0.0 {
        x.dropout(p, true)
    } else {
        x
    }
}

/// `model.value_residual` of the attention backbones (`gpt`, `llama`): value residual learning
/// (ResFormer, Zhou et al., ACL 2025). The first layer's values `v₀` `[B, T, D]` (its value
/// projection's output, before the head split) are mixed into every later layer's values:
/// `v_b ← λ_{b,0}·v₀ + λ_{b,1}·v_b` (parity/SPEC.md, "Shared Transformer pieces").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ValueResidual {
    /// Every layer attends over its own values (the backbone as it is).
    #[default]
    None,
    /// `λ = (0.5, 0.5)`, constants: the authors' public code (ResFormer).
    Fixed,
    /// `λ_b` a parameter `value_lambda` `[2]` of each later layer, initialised to `(0.5, 0.5)`:
    /// the learnable form starts as the fixed one.
    Learnable,
}

/// The first attention layer's values of the current forward pass, shared by the stack's
/// attention units: the stem clears it ([`FirstValues::clear`]), the first attention unit sets it,
/// the later ones read it. A pass through the units is one call chain on one thread.
#[derive(Clone, Default)]
pub struct FirstValues(std::rc::Rc<std::cell::RefCell<Option<Tensor>>>);

impl FirstValues {
    /// Starts a forward pass: no first-layer values yet.
    pub fn clear(&self) {
        self.0.borrow_mut().take();
    }
}

/// What one attention unit does with its values under `value_residual`.
pub enum ValueMix {
    /// The first layer: its values are `v₀`.
    First(FirstValues),
    /// A later layer: `λ[0]·v₀ + λ[1]·v` with `λ` `[2]` fp32 (`learnable`), or `0.5·v₀ + 0.5·v`
    /// (`fixed`, `lambda` None).
    Later { first: FirstValues, lambda: Option<Tensor> },
}

impl ValueMix {
    /// The value mixes of a stack of `layers` attention layers (None under `value_residual: none`:
    /// the units keep their values untouched). `path(b)` is layer b's attention module, where
    /// layer b's `value_lambda` lives (`learnable`).
    pub fn stack<'a>(
        mode: ValueResidual,
        layers: usize,
        path: impl Fn(usize) -> nn::Path<'a>,
    ) -> Vec<Option<ValueMix>> {
        let first = FirstValues::default();
        (0..layers)
            .map(|b| match (mode, b) {
                (ValueResidual::None, _) => None,
                (_, 0) => Some(ValueMix::First(first.clone())),
                (ValueResidual::Fixed, _) => Some(ValueMix::Later { first: first.clone(), lambda: None }),
                (ValueResidual::Learnable, _) => Some(ValueMix::Later {
                    first: first.clone(),
                    lambda: Some(path(b).var("value_lambda", &[2], nn::Init::Const(0.5))),
                }),
            })
            .collect()
    }

    /// `v` `[B, T, D]` (the projection's output, in its dtype) → the values this layer attends
    /// over, same shape and dtype.
    pub fn mix(&self, v: Tensor) -> Tensor {
        match self {
            ValueMix::First(first) => {
                *first.0.borrow_mut() = Some(v.shallow_clone());
                v
            }
            ValueMix::Later { first, lambda } => {
                let v0 = first.0.borrow();
                let v0 = v0.as_ref().expect(
                    "value_residual: a later attention layer ran before the first in this forward pass \
                     (the topology must call the units in order, starting with unit 0)",
                );
                assert_eq!(
                    v0.size(),
                    v.size(),
                    "value_residual: the first layer's values and this layer's differ in shape (another batch?)"
                );
                match lambda {
                    Some(l) => l.get(0) * v0 + l.get(1) * v,
                    None => v0 * 0.5 + v * 0.5,
                }
            }
        }
    }
}
