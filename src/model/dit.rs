//! `dit`: the class-conditional diffusion transformer of Peebles & Xie 2023, "Scalable Diffusion
//! Models with Transformers" (facebookresearch/DiT `models.py`), with its attention and MLP
//! sublayers as the units of the topology.
//!
//! **Model input** (one tensor, so that every topology, the parity harness and the trainer see a
//! backbone like any other): `[B, C·S·S + 2]` fp32 = the noisy image `x_t` flattened
//! (`[B, C, S, S]` row-major), then the timestep `t` (a float, `0 ≤ t < 1000`), then the class
//! label `y` (an integer stored as a float, `0..num_classes`; `num_classes` is the null class of
//! classifier-free guidance). [`pack`] builds it. **Model output**: `[B, out_C, S, S]` with
//! `out_C = C`, the predicted noise ε (or `2·C` with `learn_sigma: true`: ε, then the
//! variance interpolation, as the official code).
//!
//! Stem (`embed`): `x_embedder.proj` (the patch-embedding conv, weight `[D, C, p, p]`, stride `p`,
//! flattened to tokens `[B, T, D]`, `T = (S/p)²`, row-major) `+ pos_embed` (fixed 2-D
//! sin-cos, MAE/DiT convention, a constant, not a parameter) → `x0` `[B, T, D]`. The conditioning
//! `c = t_embedder(t) + y_embedder(y)` `[B, D]` (`t_embedder`: 256-d sinusoidal frequency
//! embedding → `mlp.0` → SiLU → `mlp.2`; `y_embedder.embedding_table` `[num_classes + 1, D]`) is
//! computed there too and kept for the current forward in the backbone (a shared cell); the
//! units and the readout read it. Topologies never see it.
//!
//! Units: block `b` has `blocks.{b}.adaLN_modulation.1` (`D → 6D`, zero-initialised), read
//! through SiLU(c) into shift/scale/gate for attention (rows `0..3D`) and MLP (rows `3D..6D`).
//! Attention unit: `gate_msa · attn(modulate(norm1(x), shift_msa, scale_msa))`, MLP unit:
//! `gate_mlp · mlp(modulate(norm2(x), shift_mlp, scale_mlp))`, `modulate(u, sh, sc) = u·(1 + sc) + sh`;
//! `norm1`, `norm2` are LayerNorms without affine (eps 1e-6), `attn` is timm's (`qkv`, `proj`,
//! biases), `mlp` is `fc1` → tanh-GELU → `fc2` (hidden `mlp_ratio·D`, default 4·D). So
//! `block_size = 2`; the topology adds the branch outputs as it wires them, and under `residual`
//! this is exactly the official DiT block.
//!
//! Readout: `final_layer`: `modulate(norm_final(y), shift, scale)` (`adaLN_modulation.1`,
//! `D → 2D`, zero-init) → `linear` (`D → p·p·out_C`, zero-init) → unpatchify → `[B, out_C, S, S]`.
//!
//! Init (DiT `initialize_weights`): every Linear Xavier-uniform with bias 0; `x_embedder.proj`
//! Xavier-uniform on its `[D, C·p·p]` view, bias 0; `y_embedder.embedding_table` and the
//! `t_embedder.mlp` weights `N(0, 0.02²)`; every `adaLN_modulation.1` and `final_layer.linear`
//! zero. So at init every unit outputs exactly 0 (gate 0) and the model outputs exactly 0.

use super::layers::{attention, Linear};
use super::mlp::matching;
use super::{Backbone, ModelEntry, ModelSpec};
use crate::config::{parse_options, OptionError};
use crate::data::DataInfo;
use crate::topology::{Norm, StackInfo, Unit};
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::rc::Rc;
use tch::{nn, Device, Kind, Tensor};

pub const ENTRY: ModelEntry = ModelEntry {
    name: "dit",
    about: "class-conditional diffusion transformer (Peebles & Xie 2023; adaLN-Zero attention + MLP units)",
    parse,
    options: crate::config::option_defaults::<Options>,
    tiny: "model: {kind: dit, patch: 4, width: 8, depth: 2, heads: 2}\n\
           data: {kind: synthetic_images, image_size: 8, channels: 3, classes: 3, samples: 16, batch_size: 4}\n",
};

/// Width of the sinusoidal timestep embedding (DiT's `frequency_embedding_size`).
pub const FREQ_DIM: i64 = 256;

/// Defaults are DiT-S/2 except `depth`, which is required.
#[derive(Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
struct Options {
    image_size: Option<usize>,
    channels: Option<usize>,
    num_classes: Option<usize>,
    patch: usize,
    width: usize,
    /// Number of DiT blocks (the stack has 2·depth sublayer units) (required).
    #[serde(deserialize_with = "crate::config::present", serialize_with = "crate::config::mark_required")]
    depth: Option<usize>,
    heads: usize,
    /// Hidden size of the MLP units; default 4 × width (DiT's `mlp_ratio = 4`).
    mlp_hidden: Option<usize>,
    /// Also predict the variance interpolation (output channels 2·C), trained by the variational bound.
    learn_sigma: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            image_size: None,
            channels: None,
            num_classes: None,
            patch: 2,
            width: 384,
            depth: None,
            heads: 6,
            mlp_hidden: None,
            learn_sigma: false,
        }
    }
}

/// A validated DiT configuration.
#[derive(Debug, Clone)]
pub struct Spec {
    pub image_size: usize,
    pub channels: usize,
    pub num_classes: usize,
    pub patch: usize,
    pub width: usize,
    pub depth: usize,
    pub heads: usize,
    pub mlp_hidden: usize,
    pub learn_sigma: bool,
}

fn parse(opts: &serde_yaml::Mapping, data: &DataInfo) -> Result<Box<dyn ModelSpec>, OptionError> {
    let o: Options = parse_options(opts)?;
    let (c, s, depth, mlp_hidden) =
        super::patch_transformer_sizes("dit", data, o.depth, (o.width, o.heads, o.patch), o.mlp_hidden)?;
    Ok(Box::new(Spec {
        image_size: matching("image_size", o.image_size, s)?,
        channels: matching("channels", o.channels, c)?,
        num_classes: matching("num_classes", o.num_classes, data.output_dim)?,
        patch: o.patch,
        width: o.width,
        depth,
        heads: o.heads,
        mlp_hidden,
        learn_sigma: o.learn_sigma,
    }))
}

/// Xavier-uniform `[out, in]`: `U(±sqrt(6 / (in + out)))`.
fn xavier(in_dim: i64, out_dim: i64) -> nn::Init {
    let b = (6.0 / (in_dim + out_dim) as f64).sqrt();
    nn::Init::Uniform { lo: -b, up: b }
}

impl Spec {
    /// Output channels: `C`, or `2·C` with `learn_sigma`.
    pub fn out_channels(&self) -> usize {
        if self.learn_sigma {
            2 * self.channels
        } else {
            self.channels
        }
    }
    fn tokens(&self) -> usize {
        (self.image_size / self.patch).pow(2)
    }
}

impl ModelSpec for Spec {
    fn forward_flops(&self) -> f64 {
        let t = self.tokens() as f64;
        let (d, h) = (self.width as f64, self.mlp_hidden as f64);
        let pd = (self.channels * self.patch * self.patch) as f64;
        let out = (self.out_channels() * self.patch * self.patch) as f64;
        let cond = 2.0 * (FREQ_DIM as f64 * d + d * d);
        let block = 2.0 * d * 6.0 * d + 2.0 * t * d * 4.0 * d + 4.0 * t * t * d + 2.0 * 2.0 * t * d * h;
        let fin = 2.0 * d * 2.0 * d + 2.0 * t * d * out;
        2.0 * t * pd * d + cond + self.depth as f64 * block + fin
    }

    fn kind(&self) -> &'static str {
        "dit"
    }
    fn diffusion(&self) -> Option<(usize, usize, bool)> {
        Some((self.channels, self.num_classes, self.learn_sigma))
    }
    fn stack(&self) -> StackInfo {
        StackInfo { sublayers: 2 * self.depth, block_size: 2, width: self.width, pre_norm: true, ports: false }
    }
    fn build(&self, vs: &nn::Path, compute: Kind) -> Box<dyn Backbone> {
        let (d, h) = (self.width as i64, self.mlp_hidden as i64);
        let grid = (self.image_size / self.patch) as i64;
        let p = self.patch as i64;
        let c = self.channels as i64;
        let zero = Some(nn::Init::Const(0.0));
        let small = nn::Init::Randn { mean: 0.0, stdev: 0.02 };
        let cond: Rc<RefCell<Option<Tensor>>> = Rc::new(RefCell::new(None));
        let mut units = Vec::new();
        for b in 0..self.depth {
            let bp = vs / "blocks" / b;
            let ada = Rc::new(Linear::with_init(
                &(&bp / "adaLN_modulation" / 1),
                d,
                6 * d,
                nn::Init::Const(0.0),
                zero,
                compute,
            ));
            let ap = &bp / "attn";
            units.push(DitUnit {
                kind: Sublayer::Attn {
                    qkv: Linear::with_init(&(&ap / "qkv"), d, 3 * d, xavier(d, 3 * d), zero, compute),
                    proj: Linear::with_init(&(&ap / "proj"), d, d, xavier(d, d), zero, compute),
                    heads: self.heads as i64,
                    compute,
                },
                ada: ada.clone(),
                rows: 0,
                width: d,
                cond: cond.clone(),
            });
            let mp = &bp / "mlp";
            units.push(DitUnit {
                kind: Sublayer::Mlp {
                    fc1: Linear::with_init(&(&mp / "fc1"), d, h, xavier(d, h), zero, compute),
                    fc2: Linear::with_init(&(&mp / "fc2"), h, d, xavier(h, d), zero, compute),
                },
                ada,
                rows: 3 * d,
                width: d,
                cond: cond.clone(),
            });
        }
        let patch_dim = c * p * p;
        let xp = vs / "x_embedder" / "proj";
        let tp = vs / "t_embedder" / "mlp";
        let fp = vs / "final_layer";
        let out = (self.out_channels() as i64) * p * p;
        Box::new(Dit {
            proj_weight: xp.var("weight", &[d, c, p, p], xavier(patch_dim, d)),
            proj_bias: xp.var("bias", &[d], nn::Init::Const(0.0)),
            pos_embed: pos_embed_2d(grid, d, vs.device()),
            t_freqs: timestep_freqs(FREQ_DIM, vs.device()),
            t_mlp0: Linear::with_init(&(&tp / 0), FREQ_DIM, d, small, zero, compute),
            t_mlp2: Linear::with_init(&(&tp / 2), d, d, small, zero, compute),
            y_table: (vs / "y_embedder" / "embedding_table").var("weight", &[self.num_classes as i64 + 1, d], small),
            units,
            final_ada: Linear::with_init(
                &(&fp / "adaLN_modulation" / 1),
                d,
                2 * d,
                nn::Init::Const(0.0),
                zero,
                compute,
            ),
            final_linear: Linear::with_init(&(&fp / "linear"), d, out, nn::Init::Const(0.0), zero, compute),
            cond,
            patch: p,
            channels: c,
            out_channels: self.out_channels() as i64,
            image_size: self.image_size as i64,
            compute,
        })
    }
}

pub use crate::task::ddpm::pack;

/// The frequencies of DiT's timestep embedding, `f_i = exp(−ln(10⁴)·i/(dim/2))`, `i < dim/2`:
/// `[dim/2]` fp32 on `device`, computed as DiT's `TimestepEmbedder` computes them (on the CPU, in
/// that order of operations: the same fp32 roundings as the reference) but once, as a constant,
/// so that a CUDA graph can capture the step (no host-to-device copy in the forward).
pub fn timestep_freqs(dim: i64, device: Device) -> Tensor {
    let half = dim / 2;
    ((Tensor::arange(half, (Kind::Float, Device::Cpu)) * -(1e4f64).ln()) / half as f64).exp().to_device(device)
}

/// DiT's `TimestepEmbedder.timestep_embedding`: `t` `[B]`, `freqs` `[dim/2]` (see
/// [`timestep_freqs`]) → `[B, dim]` fp32 = `[cos(t·f), sin(t·f)]`.
pub fn timestep_embedding(t: &Tensor, freqs: &Tensor) -> Tensor {
    let args = t.to_kind(Kind::Float).unsqueeze(1) * freqs.unsqueeze(0);
    Tensor::cat(&[args.cos(), args.sin()], 1)
}

/// DiT's fixed position embedding (MAE `get_2d_sincos_pos_embed`): for the token at grid row `i`,
/// column `j` (row-major, as the patch embedding flattens them), with `ω_k = 10⁴^(−k/(D/4))`, `k < D/4`:
/// `[sin(j ω), cos(j ω), sin(i ω), cos(i ω)]`. Returns `[grid², D]` fp32 (computed in fp64).
pub fn pos_embed_2d(grid: i64, d: i64, device: Device) -> Tensor {
    let opts = (Kind::Double, Device::Cpu);
    let q = d / 4;
    // As MAE's code: 1 / 10⁴^(k/q), in fp64 (fp32 after the last step, so that the reference's
    // roundings are these).
    let omega = Tensor::pow_scalar(1e4, &(Tensor::arange(q, opts) / q as f64)).reciprocal();
    let rows = Tensor::arange(grid, opts).unsqueeze(1).expand([grid, grid], false).reshape([-1]);
    let cols = Tensor::arange(grid, opts).unsqueeze(0).expand([grid, grid], false).reshape([-1]);
    let (i, j) = (rows.outer(&omega), cols.outer(&omega));
    Tensor::cat(&[j.sin(), j.cos(), i.sin(), i.cos()], 1).to_kind(Kind::Float).to_device(device)
}

/// `u·(1 + scale) + shift`: `u` `[B, T, D]`, `shift`, `scale` `[B, D]`.
fn modulate(u: &Tensor, shift: &Tensor, scale: &Tensor) -> Tensor {
    u * (scale.unsqueeze(1) + 1.0) + shift.unsqueeze(1)
}

/// LayerNorm without affine, eps 1e-6, fp32: `[.., D]` → `[.., D]`.
fn plain_norm(x: &Tensor) -> Tensor {
    let d = *x.size().last().expect("a feature dimension");
    x.to_kind(Kind::Float).layer_norm([d], None::<&Tensor>, None::<&Tensor>, 1e-6, true)
}

enum Sublayer {
    Attn { qkv: Linear, proj: Linear, heads: i64, compute: Kind },
    Mlp { fc1: Linear, fc2: Linear },
}

/// An attention or MLP sublayer of a DiT block with its adaLN-Zero modulation, `[B, T, D] → [B, T, D]`.
struct DitUnit {
    kind: Sublayer,
    /// The block's `adaLN_modulation.1` (`D → 6D`), shared by its two units.
    ada: Rc<Linear>,
    /// First row of this unit's shift/scale/gate in the modulation (0 or 3D).
    rows: i64,
    width: i64,
    cond: Rc<RefCell<Option<Tensor>>>,
}

impl Unit for DitUnit {
    fn forward(&self, x: &Tensor, mode: Norm, _train: bool) -> Tensor {
        let c = self.cond.borrow();
        let c = c.as_ref().expect("DiT units run after embed, which sets the conditioning");
        // shift, scale, gate [B, D] each: this unit's third of SiLU(c) through the whole
        // modulation [B, 6D], computed by each unit, as the reference (and DiT's code, once per
        // block) does. Not a GEMM of this unit's 3D rows alone: on a GPU, cuBLAS picks another
        // kernel for the narrower product, whose other order of sums differs from the reference by
        // bf16 roundings (the first GPU slot's DiT parity failures).
        let m = self.ada.forward(&c.silu()).narrow(1, self.rows, 3 * self.width).chunk(3, 1);
        let u = match mode {
            Norm::Default => plain_norm(x),
            Norm::Scaled(s) => plain_norm(x) * s,
            Norm::Off => x.to_kind(Kind::Float),
        };
        let u = modulate(&u, &m[0], &m[1]);
        let h = match &self.kind {
            Sublayer::Attn { qkv, proj, heads, compute } => {
                let qkv = qkv.forward(&u).chunk(3, -1);
                proj.forward(&attention(&qkv[0], &qkv[1], &qkv[2], *heads, false, None, *compute))
            }
            Sublayer::Mlp { fc1, fc2 } => fc2.forward(&fc1.forward(&u).gelu("tanh")),
        };
        m[2].unsqueeze(1) * h
    }
}

struct Dit {
    /// `x_embedder.proj.weight` `[D, C, p, p]`, `.bias` `[D]`.
    proj_weight: Tensor,
    proj_bias: Tensor,
    /// `[T, D]` fp32, a constant.
    pos_embed: Tensor,
    /// The timestep embedding's frequencies `[FREQ_DIM / 2]` fp32, a constant.
    t_freqs: Tensor,
    t_mlp0: Linear,
    t_mlp2: Linear,
    /// `[num_classes + 1, D]`.
    y_table: Tensor,
    units: Vec<DitUnit>,
    final_ada: Linear,
    final_linear: Linear,
    /// The conditioning `c` `[B, D]` of the current forward, set by `embed`.
    cond: Rc<RefCell<Option<Tensor>>>,
    patch: i64,
    channels: i64,
    out_channels: i64,
    image_size: i64,
    compute: Kind,
}

impl Backbone for Dit {
    /// `[B, C·S·S + 2]` (see [`pack`]) → `x0` `[B, T, D]`; sets the conditioning `c` `[B, D]`.
    fn embed(&self, input: &Tensor, _train: bool) -> Tensor {
        let (b, s, c) = (input.size()[0], self.image_size, self.channels);
        let n = c * s * s;
        let input = input.to_kind(Kind::Float);
        let x = input.narrow(1, 0, n).reshape([b, c, s, s]);
        let t = input.select(1, n);
        let y = input.select(1, n + 1).detach().round().to_kind(Kind::Int64);
        // The patch embedding as the conv it is (as the reference: a GEMM of patchified inputs
        // computes the same sums in another order, which on a GPU differs by roundings):
        // [B, D, S/p, S/p] → [B, T, D].
        let (c, p) = (self.compute, self.patch);
        let h = x.to_kind(c).conv2d(
            &self.proj_weight.to_kind(c),
            Some(self.proj_bias.to_kind(c)),
            [p, p],
            [0, 0],
            [1, 1],
            1,
        );
        let x0 = h.flatten(2, -1).transpose(1, 2) + &self.pos_embed;
        let t_emb = self.t_mlp2.forward(&self.t_mlp0.forward(&timestep_embedding(&t, &self.t_freqs)).silu());
        let y_emb = self.y_table.index_select(0, &y);
        *self.cond.borrow_mut() = Some(t_emb + y_emb);
        x0
    }
    fn units(&self) -> Vec<&dyn Unit> {
        self.units.iter().map(|u| u as &dyn Unit).collect()
    }
    /// `[B, T, D]` → `[B, out_C, S, S]`.
    fn readout(&self, y: &Tensor, _train: bool) -> Tensor {
        let c = self.cond.borrow();
        let c = c.as_ref().expect("readout runs after embed, which sets the conditioning");
        let m = self.final_ada.forward(&c.silu()).chunk(2, 1);
        let out = self.final_linear.forward(&modulate(&plain_norm(y), &m[0], &m[1]));
        // unpatchify: [B, T, p·p·oc] → [B, h, w, p, p, oc] → [B, oc, h, p, w, p] → [B, oc, S, S].
        let (b, p, oc) = (out.size()[0], self.patch, self.out_channels);
        let g = self.image_size / p;
        out.reshape([b, g, g, p, p, oc]).permute([0, 5, 1, 3, 2, 4]).reshape([b, oc, g * p, g * p])
    }
}
