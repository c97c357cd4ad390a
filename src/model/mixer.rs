//! `mixer`: MLP-Mixer (Tolstikhin et al. 2021), the H-ACN paper's CIFAR backbone (App. A: 16
//! layers, D = 128, patch 4, channel MLP 512, token MLP 64).
//!
//! Input `[B, C, S, S]` → patchify to `[B, T, C·p·p]` (`T = (S/p)²`) → `stem` → `[B, T, D]`; each
//! layer is two units, token mixing (`blocks.{b}.token_mix`: LN, then an MLP across the T tokens)
//! and channel mixing (`blocks.{b}.channel_mix`: LN, then an MLP across D), so `block_size = 2`;
//! readout: `norm`, mean over tokens, `head` → `[B, num_classes]`. Standard pre-norm Mixer layers
//! (the authors' variant ending in `LN(ReLU(Linear(·) + x))` is not reproduced).

use super::layers::{layer_norm, pre_norm, LayerNorm, Linear, Mlp};
use super::mlp::matching;
use super::{Backbone, ModelEntry, ModelSpec};
use crate::config::{parse_options, required, OptionError};
use crate::data::DataInfo;
use crate::topology::{Norm, StackInfo, Unit};
use serde::{Deserialize, Serialize};
use tch::{nn, nn::Module, Kind, Tensor};

pub const ENTRY: ModelEntry = ModelEntry {
    name: "mixer",
    about: "MLP-Mixer on images (token + channel mixing units)",
    parse,
    options: crate::config::option_defaults::<Options>,
    tiny: "model: {kind: mixer, patch: 4, width: 8, token_hidden: 4, channel_hidden: 8, depth: 2}\n\
           data: {kind: synthetic_images, image_size: 8, channels: 3, classes: 3, samples: 16, batch_size: 4}\n",
};

#[derive(Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
struct Options {
    image_size: Option<usize>,
    channels: Option<usize>,
    num_classes: Option<usize>,
    patch: usize,
    width: usize,
    token_hidden: usize,
    channel_hidden: usize,
    /// Number of Mixer layers (the stack has 2·depth sublayer units) (required).
    #[serde(deserialize_with = "crate::config::present", serialize_with = "crate::config::mark_required")]
    depth: Option<usize>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            image_size: None,
            channels: None,
            num_classes: None,
            patch: 4,
            width: 128,
            token_hidden: 64,
            channel_hidden: 512,
            depth: None,
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
    token_hidden: usize,
    channel_hidden: usize,
    depth: usize,
}

fn parse(opts: &serde_yaml::Mapping, data: &DataInfo) -> Result<Box<dyn ModelSpec>, OptionError> {
    let o: Options = parse_options(opts)?;
    let depth = required(o.depth, "depth")?;
    let (c, s) = super::square_images("mixer", data)?;
    super::check_sizes(
        &[("width", o.width), ("depth", depth), ("token_hidden", o.token_hidden), ("channel_hidden", o.channel_hidden)],
        o.patch,
        s,
    )?;
    Ok(Box::new(Spec {
        image_size: matching("image_size", o.image_size, s)?,
        channels: matching("channels", o.channels, c)?,
        num_classes: matching("num_classes", o.num_classes, data.output_dim)?,
        patch: o.patch,
        width: o.width,
        token_hidden: o.token_hidden,
        channel_hidden: o.channel_hidden,
        depth,
    }))
}

impl ModelSpec for Spec {
    fn forward_flops(&self) -> f64 {
        let t = ((self.image_size / self.patch) * (self.image_size / self.patch)) as f64;
        let (w, pd) = (self.width as f64, (self.channels * self.patch * self.patch) as f64);
        let (ht, hc) = (self.token_hidden as f64, self.channel_hidden as f64);
        // Token mixing: every channel's T tokens through T→ht→T; channel mixing: every token w→hc→w.
        let block = 2.0 * 2.0 * w * t * ht + 2.0 * 2.0 * t * w * hc;
        2.0 * t * pd * w + self.depth as f64 * block + 2.0 * w * self.num_classes as f64
    }

    fn kind(&self) -> &'static str {
        "mixer"
    }
    fn stack(&self) -> StackInfo {
        StackInfo { sublayers: 2 * self.depth, block_size: 2, width: self.width, pre_norm: true, ports: false }
    }
    fn build(&self, vs: &nn::Path, compute: Kind) -> Box<dyn Backbone> {
        let d = self.width as i64;
        let t = ((self.image_size / self.patch) * (self.image_size / self.patch)) as i64;
        let patch_dim = (self.channels * self.patch * self.patch) as i64;
        let mut units = Vec::new();
        for b in 0..self.depth {
            let p = vs / "blocks" / b;
            let tp = &p / "token_mix";
            units.push(MixUnit {
                norm: layer_norm(&(&tp / "norm"), d),
                mlp: Mlp::new(&tp, t, self.token_hidden as i64, t, compute),
                tokens: true,
            });
            let cp = &p / "channel_mix";
            units.push(MixUnit {
                norm: layer_norm(&(&cp / "norm"), d),
                mlp: Mlp::new(&cp, d, self.channel_hidden as i64, d, compute),
                tokens: false,
            });
        }
        Box::new(Mixer {
            stem: Linear::new(&(vs / "stem"), patch_dim, d, true, compute),
            units,
            norm: layer_norm(&(vs / "norm"), d),
            head: Linear::new(&(vs / "head"), d, self.num_classes as i64, true, compute),
            patch: self.patch as i64,
        })
    }
}

/// A token-mixing or channel-mixing unit, `[B, T, D] → [B, T, D]`.
struct MixUnit {
    norm: LayerNorm,
    mlp: Mlp,
    tokens: bool,
}

impl Unit for MixUnit {
    fn forward(&self, x: &Tensor, norm: Norm, _train: bool) -> Tensor {
        let u = pre_norm(&self.norm, x, norm);
        if self.tokens {
            // Mixing along the token axis of `[B, T, D]`: the MLP applied to each column.
            self.mlp.forward_columns(&u)
        } else {
            self.mlp.forward(&u)
        }
    }
}

struct Mixer {
    stem: Linear,
    units: Vec<MixUnit>,
    norm: LayerNorm,
    head: Linear,
    patch: i64,
}

/// `[B, C, S, S]` → `[B, T, C·p·p]`, patches in row-major order, each flattened as (c, dy, dx).
pub fn patchify(x: &Tensor, p: i64) -> Tensor {
    let (b, c, s) = (x.size()[0], x.size()[1], x.size()[2]);
    x.reshape([b, c, s / p, p, s / p, p]).permute([0, 2, 4, 1, 3, 5]).reshape([b, (s / p) * (s / p), c * p * p])
}

impl Backbone for Mixer {
    fn embed(&self, input: &Tensor, _train: bool) -> Tensor {
        self.stem.forward(&patchify(&input.to_kind(Kind::Float), self.patch))
    }
    fn units(&self) -> Vec<&dyn Unit> {
        self.units.iter().map(|u| u as &dyn Unit).collect()
    }
    fn readout(&self, y: &Tensor, _train: bool) -> Tensor {
        self.head.forward(&self.norm.forward(y).mean_dim(1, false, Kind::Float))
    }
}
