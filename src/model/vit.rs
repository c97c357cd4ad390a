//! `vit`: the simple ViT of Beyer et al. 2022, "Better plain ViT baselines for ImageNet-1k"
//! (the H-ACN paper's ImageNet backbone: S/16, global average pooling, fixed 2-D sin-cos position
//! embedding, zero-initialised head).
//!
//! Input `[B, C, S, S]` → patchify to `[B, T, C·p·p]` (`T = (S/p)²`, as the mixer) → `stem` →
//! `+ posemb` → `x0` `[B, T, D]`; each layer is two pre-LN units, attention
//! (`blocks.{b}.attn`: `norm`, `qkv`, `proj`, non-causal multi-head SDPA) and MLP
//! (`blocks.{b}.mlp`: `norm`, `fc1`, exact GELU, `fc2`), so `block_size = 2`; readout: `norm`,
//! mean over tokens, `head` → `[B, num_classes]`.
//!
//! Init (big_vision's ViT): `qkv`, `proj`, `fc1`, `fc2` weights Xavier-uniform (the fused `qkv` as
//! three `D×D` maps), attention biases 0, MLP biases `N(0, 1e-6²)`; `stem` LeCun-normal
//! (`N(0, 1/fan_in)`) with bias 0; `head` weight and bias 0, so the initial logits are exactly 0.

use super::layers::{attention, layer_norm, pre_norm, LayerNorm, Linear, Mlp};
use super::mixer::patchify;
use super::mlp::matching;
use super::{Backbone, ModelEntry, ModelSpec};
use crate::config::{parse_options, OptionError};
use crate::data::DataInfo;
use crate::topology::{Norm, StackInfo, Unit};
use serde::{Deserialize, Serialize};
use tch::{nn, nn::Module, Device, Kind, Tensor};

pub const ENTRY: ModelEntry = ModelEntry {
    name: "vit",
    about: "simple ViT on images (Beyer et al. 2022; attention + MLP units)",
    parse,
    options: crate::config::option_defaults::<Options>,
    tiny: "model: {kind: vit, patch: 4, width: 8, depth: 2, heads: 2}\n\
           data: {kind: synthetic_images, image_size: 8, channels: 3, classes: 3, samples: 16, batch_size: 4}\n",
};

/// Defaults are ViT-S/16 except `depth`, which is required.
#[derive(Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
struct Options {
    image_size: Option<usize>,
    channels: Option<usize>,
    num_classes: Option<usize>,
    patch: usize,
    width: usize,
    /// Number of Transformer layers (the stack has 2·depth sublayer units) (required).
    #[serde(deserialize_with = "crate::config::present", serialize_with = "crate::config::mark_required")]
    depth: Option<usize>,
    heads: usize,
    /// Hidden size of the MLP units; default 4 × width.
    mlp_hidden: Option<usize>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            image_size: None,
            channels: None,
            num_classes: None,
            patch: 16,
            width: 384,
            depth: None,
            heads: 6,
            mlp_hidden: None,
        }
    }
}

#[derive(Debug)]
struct Spec {
    image_size: usize,
    channels: usize,
    num_classes: usize,
    patch: usize,
    width: usize,
    depth: usize,
    heads: usize,
    mlp_hidden: usize,
}

fn parse(opts: &serde_yaml::Mapping, data: &DataInfo) -> Result<Box<dyn ModelSpec>, OptionError> {
    let o: Options = parse_options(opts)?;
    let (c, s, depth, mlp_hidden) =
        super::patch_transformer_sizes("vit", data, o.depth, (o.width, o.heads, o.patch), o.mlp_hidden)?;
    Ok(Box::new(Spec {
        image_size: matching("image_size", o.image_size, s)?,
        channels: matching("channels", o.channels, c)?,
        num_classes: matching("num_classes", o.num_classes, data.output_dim)?,
        patch: o.patch,
        width: o.width,
        depth,
        heads: o.heads,
        mlp_hidden,
    }))
}

/// Xavier-uniform `[out, in]` (Glorot & Bengio): `U(±sqrt(6 / (in + out)))`.
fn xavier(in_dim: i64, out_dim: i64) -> nn::Init {
    let b = (6.0 / (in_dim + out_dim) as f64).sqrt();
    nn::Init::Uniform { lo: -b, up: b }
}

impl ModelSpec for Spec {
    fn forward_flops(&self) -> f64 {
        let t = ((self.image_size / self.patch) * (self.image_size / self.patch)) as f64;
        let (w, pd, h) = (self.width as f64, (self.channels * self.patch * self.patch) as f64, self.mlp_hidden as f64);
        let block = 2.0 * t * w * 4.0 * w + 4.0 * t * t * w + 2.0 * 2.0 * t * w * h;
        2.0 * t * pd * w + self.depth as f64 * block + 2.0 * w * self.num_classes as f64
    }

    fn kind(&self) -> &'static str {
        "vit"
    }
    fn stack(&self) -> StackInfo {
        StackInfo { sublayers: 2 * self.depth, block_size: 2, width: self.width, pre_norm: true, ports: false }
    }
    fn build(&self, vs: &nn::Path, compute: Kind) -> Box<dyn Backbone> {
        let (d, h) = (self.width as i64, self.mlp_hidden as i64);
        let grid = (self.image_size / self.patch) as i64;
        let patch_dim = (self.channels * self.patch * self.patch) as i64;
        let zero = Some(nn::Init::Const(0.0));
        let tiny = Some(nn::Init::Randn { mean: 0.0, stdev: 1e-6 });
        let stem_init = nn::Init::Randn { mean: 0.0, stdev: (1.0 / patch_dim as f64).sqrt() };
        let mut units = Vec::new();
        for b in 0..self.depth {
            let p = vs / "blocks" / b;
            let ap = &p / "attn";
            units.push(VitUnit::Attn {
                norm: layer_norm(&(&ap / "norm"), d),
                // Xavier per q, k, v map ([D, D] each), as flax's separate projections.
                qkv: Linear::with_init(&(&ap / "qkv"), d, 3 * d, xavier(d, d), zero, compute),
                proj: Linear::with_init(&(&ap / "proj"), d, d, xavier(d, d), zero, compute),
                heads: self.heads as i64,
                compute,
            });
            let mp = &p / "mlp";
            units.push(VitUnit::Mlp {
                norm: layer_norm(&(&mp / "norm"), d),
                mlp: Mlp {
                    fc1: Linear::with_init(&(&mp / "fc1"), d, h, xavier(d, h), tiny, compute),
                    fc2: Linear::with_init(&(&mp / "fc2"), h, d, xavier(h, d), tiny, compute),
                },
            });
        }
        Box::new(Vit {
            stem: Linear::with_init(&(vs / "stem"), patch_dim, d, stem_init, zero, compute),
            posemb: posemb_sincos_2d(grid, grid, d, vs.device()),
            units,
            norm: layer_norm(&(vs / "norm"), d),
            head: Linear::with_init(&(vs / "head"), d, self.num_classes as i64, nn::Init::Const(0.0), zero, compute),
            patch: self.patch as i64,
        })
    }
}

/// Fixed 2-D sin-cos position embedding (big_vision `posemb_sincos_2d`, temperature 10⁴): for the
/// token at grid row `y`, column `x` (row-major, as [`patchify`]), with `ω_i = 10⁴^(−i/(D/4 − 1))`,
/// `i < D/4`: `[sin(x ω), cos(x ω), sin(y ω), cos(y ω)]`. Returns `[h·w, D]` fp32 (computed in fp64).
pub fn posemb_sincos_2d(h: i64, w: i64, d: i64, device: Device) -> Tensor {
    let opts = (Kind::Double, Device::Cpu);
    let q = d / 4;
    let omega = (Tensor::arange(q, opts) * (-(1e4f64).ln() / (q - 1) as f64)).exp();
    let ys = Tensor::arange(h, opts).unsqueeze(1).expand([h, w], false).reshape([-1]);
    let xs = Tensor::arange(w, opts).unsqueeze(0).expand([h, w], false).reshape([-1]);
    let (y, x) = (ys.outer(&omega), xs.outer(&omega));
    Tensor::cat(&[x.sin(), x.cos(), y.sin(), y.cos()], 1).to_kind(Kind::Float).to_device(device)
}

/// An attention or MLP sublayer, `[B, T, D] → [B, T, D]`.
enum VitUnit {
    Attn { norm: LayerNorm, qkv: Linear, proj: Linear, heads: i64, compute: Kind },
    Mlp { norm: LayerNorm, mlp: Mlp },
}

impl Unit for VitUnit {
    fn forward(&self, x: &Tensor, mode: Norm, _train: bool) -> Tensor {
        match self {
            VitUnit::Attn { norm, qkv, proj, heads, compute } => {
                let u = pre_norm(norm, x, mode);
                let qkv = qkv.forward(&u).chunk(3, -1); // q, k, v: [B, T, D] each
                proj.forward(&attention(&qkv[0], &qkv[1], &qkv[2], *heads, false, None, *compute))
            }
            VitUnit::Mlp { norm, mlp } => mlp.forward(&pre_norm(norm, x, mode)),
        }
    }
}

struct Vit {
    stem: Linear,
    /// `[T, D]` fp32, a constant (not a parameter).
    posemb: Tensor,
    units: Vec<VitUnit>,
    norm: LayerNorm,
    head: Linear,
    patch: i64,
}

impl Backbone for Vit {
    /// `[B, C, S, S]` → `[B, T, D]`.
    fn embed(&self, input: &Tensor, _train: bool) -> Tensor {
        self.stem.forward(&patchify(&input.to_kind(Kind::Float), self.patch)) + &self.posemb
    }
    fn units(&self) -> Vec<&dyn Unit> {
        self.units.iter().map(|u| u as &dyn Unit).collect()
    }
    /// `[B, T, D]` → `[B, num_classes]`.
    fn readout(&self, y: &Tensor, _train: bool) -> Tensor {
        self.head.forward(&self.norm.forward(y).mean_dim(1, false, Kind::Float))
    }
}
