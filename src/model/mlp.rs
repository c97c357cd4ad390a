//! `mlp`: a pre-norm MLP stack, the small test backbone of the parity harness and a quick model
//! for vector data. Input `[B, ..]` (flattened to `[B, input_dim]`) → `stem` → L units
//! `f(x) = fc2(gelu(fc1(LN(x))))` → final `norm` → `head` → `[B, output_dim]`.
//! Names: `stem`, `units.{k}.norm|fc1|fc2`, `norm`, `head` (see `parity/SPEC.md`).

use super::layers::{layer_norm, pre_norm, LayerNorm, Linear, Mlp as MlpLayer};
use super::{Backbone, ModelEntry, ModelSpec};
use crate::config::{parse_options, required, OptionError};
use crate::data::DataInfo;
use crate::topology::{Norm, StackInfo, Unit};
use serde::{Deserialize, Serialize};
use tch::{nn, nn::Module, Kind, Tensor};

pub const ENTRY: ModelEntry = ModelEntry {
    name: "mlp",
    about: "pre-norm MLP stack (test backbone, vector data)",
    parse,
    options: crate::config::option_defaults::<Options>,
    tiny: "model: {kind: mlp, width: 8, depth: 3}\ndata: {kind: whitened_regression, dim: 6, samples: 8}\n",
};

#[derive(Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
struct Options {
    /// Defaults to the data's (flattened) input size; if given, must match it.
    input_dim: Option<usize>,
    /// Defaults to the data's output size (classes or target dimension).
    output_dim: Option<usize>,
    width: usize,
    /// Hidden size of each unit's MLP; default 4 × width.
    hidden: Option<usize>,
    /// Required.
    #[serde(deserialize_with = "crate::config::present", serialize_with = "crate::config::mark_required")]
    depth: Option<usize>,
}

impl Default for Options {
    fn default() -> Self {
        Options { input_dim: None, output_dim: None, width: 64, hidden: None, depth: None }
    }
}

#[derive(Debug)]
struct Spec {
    input_dim: usize,
    output_dim: usize,
    width: usize,
    hidden: usize,
    depth: usize,
}

/// `value` if it agrees with the data, else an error naming `key`.
pub(crate) fn matching(key: &str, value: Option<usize>, data: usize) -> Result<usize, OptionError> {
    match value {
        Some(v) if v != data => Err(OptionError::new(key, v, format!("{data} (what the data gives) or leave it out"))),
        _ => Ok(data),
    }
}

fn parse(opts: &serde_yaml::Mapping, data: &DataInfo) -> Result<Box<dyn ModelSpec>, OptionError> {
    let o: Options = parse_options(opts)?;
    let depth = required(o.depth, "depth")?;
    for (key, v) in [("width", o.width), ("depth", depth), ("hidden", o.hidden.unwrap_or(1))] {
        if v == 0 || v > 1 << 16 {
            return Err(OptionError::new(key, v, "an integer in 1..=65536"));
        }
    }
    Ok(Box::new(Spec {
        input_dim: matching("input_dim", o.input_dim, data.input_dim())?,
        output_dim: matching("output_dim", o.output_dim, data.output_dim)?,
        width: o.width,
        hidden: o.hidden.unwrap_or(4 * o.width),
        depth,
    }))
}

impl ModelSpec for Spec {
    fn forward_flops(&self) -> f64 {
        let (i, o, w, h) = (self.input_dim as f64, self.output_dim as f64, self.width as f64, self.hidden as f64);
        2.0 * (i * w + self.depth as f64 * 2.0 * w * h + w * o)
    }

    fn kind(&self) -> &'static str {
        "mlp"
    }
    fn stack(&self) -> StackInfo {
        StackInfo { sublayers: self.depth, block_size: 1, width: self.width, pre_norm: true, ports: false }
    }
    fn build(&self, vs: &nn::Path, compute: Kind) -> Box<dyn Backbone> {
        let (d, h) = (self.width as i64, self.hidden as i64);
        let units = (0..self.depth)
            .map(|k| {
                let p = vs / "units" / k;
                MlpUnit { norm: layer_norm(&(&p / "norm"), d), mlp: MlpLayer::new(&p, d, h, d, compute) }
            })
            .collect();
        Box::new(MlpStack {
            stem: Linear::new(&(vs / "stem"), self.input_dim as i64, d, true, compute),
            units,
            norm: layer_norm(&(vs / "norm"), d),
            head: Linear::new(&(vs / "head"), d, self.output_dim as i64, true, compute),
        })
    }
}

struct MlpUnit {
    norm: LayerNorm,
    mlp: MlpLayer,
}

impl Unit for MlpUnit {
    fn forward(&self, x: &Tensor, norm: Norm, _train: bool) -> Tensor {
        self.mlp.forward(&pre_norm(&self.norm, x, norm))
    }
}

struct MlpStack {
    stem: Linear,
    units: Vec<MlpUnit>,
    norm: LayerNorm,
    head: Linear,
}

impl Backbone for MlpStack {
    fn embed(&self, input: &Tensor, _train: bool) -> Tensor {
        self.stem.forward(&input.to_kind(Kind::Float).flatten(1, -1))
    }
    fn units(&self) -> Vec<&dyn Unit> {
        self.units.iter().map(|u| u as &dyn Unit).collect()
    }
    fn readout(&self, y: &Tensor, _train: bool) -> Tensor {
        self.head.forward(&self.norm.forward(y))
    }
}
