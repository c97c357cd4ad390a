//! `lnn`: the deep linear network of the ANCRe case study (§3): `K` square `d×d` linear layers,
//! no bias, no norm, small random init, `f(x) = W_K … W_1 x`. Stem and head are the identity, so the
//! topology's shortcuts are the only thing added to the product.
//!
//! Rows are samples: input `[n, d]` → output `[n, d]`; `layers.{k}.weight` is `[d, d]` as in
//! `torch.nn.Linear(d, d, bias=False)`.

use super::{Backbone, ModelEntry, ModelSpec};
use crate::config::{parse_options, required, OptionError};
use crate::data::DataInfo;
use crate::topology::{Norm, StackInfo, Unit};
use serde::{Deserialize, Serialize};
use tch::{nn, Kind, Tensor};

pub const ENTRY: ModelEntry = ModelEntry {
    name: "lnn",
    about: "deep linear network W_K … W_1 x (ANCRe §3 case study)",
    parse,
    options: crate::config::option_defaults::<Options>,
    tiny: "model: {kind: lnn, depth: 3}\ndata: {kind: whitened_regression, dim: 6, samples: 8}\n",
};

#[derive(Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
struct Options {
    /// Number of layers K, ≥ 1 (required).
    #[serde(deserialize_with = "crate::config::present", serialize_with = "crate::config::mark_required")]
    depth: Option<usize>,
    /// Standard deviation of the i.i.d. normal initialisation of every weight ("small init").
    init_std: f64,
}

impl Default for Options {
    fn default() -> Self {
        Options { depth: None, init_std: 0.05 }
    }
}

#[derive(Debug)]
struct Spec {
    depth: usize,
    width: usize,
    init_std: f64,
}

fn parse(opts: &serde_yaml::Mapping, data: &DataInfo) -> Result<Box<dyn ModelSpec>, OptionError> {
    let o: Options = parse_options(opts)?;
    let depth = required(o.depth, "depth")?;
    if depth == 0 || depth > 1024 {
        return Err(OptionError::new("depth", depth, "an integer in 1..=1024"));
    }
    if !(o.init_std.is_finite() && o.init_std >= 0.0) {
        return Err(OptionError::new("init_std", o.init_std, "a finite standard deviation ≥ 0"));
    }
    if data.input_dim() != data.output_dim {
        return Err(OptionError::new(
            "kind",
            "lnn",
            format!(
                "data with equal input and output dimensions (square layers); got {} → {}",
                data.input_dim(),
                data.output_dim
            ),
        ));
    }
    Ok(Box::new(Spec { depth, width: data.input_dim(), init_std: o.init_std }))
}

impl ModelSpec for Spec {
    fn forward_flops(&self) -> f64 {
        // K square layers applied to one column of X.
        2.0 * (self.depth * self.width * self.width) as f64
    }

    fn kind(&self) -> &'static str {
        "lnn"
    }
    fn stack(&self) -> StackInfo {
        StackInfo { sublayers: self.depth, block_size: 1, width: self.width, pre_norm: false, ports: false }
    }
    fn build(&self, vs: &nn::Path, compute: Kind) -> Box<dyn Backbone> {
        let d = self.width as i64;
        let layers = (0..self.depth)
            .map(|k| {
                let weight =
                    (vs / "layers" / k).var("weight", &[d, d], nn::Init::Randn { mean: 0.0, stdev: self.init_std });
                Linear { weight, compute }
            })
            .collect();
        Box::new(Lnn { layers })
    }
}

/// One bias-free square linear layer `x ↦ x Wᵀ`, computed in `compute` and returned in `x`'s dtype.
struct Linear {
    weight: Tensor,
    compute: Kind,
}

impl Unit for Linear {
    fn forward(&self, x: &Tensor, _norm: Norm, _train: bool) -> Tensor {
        x.to_kind(self.compute).matmul(&self.weight.to_kind(self.compute).tr()).to_kind(x.kind())
    }
}

struct Lnn {
    layers: Vec<Linear>,
}

impl Backbone for Lnn {
    fn embed(&self, input: &Tensor, _train: bool) -> Tensor {
        input.shallow_clone()
    }
    fn units(&self) -> Vec<&dyn Unit> {
        self.layers.iter().map(|l| l as &dyn Unit).collect()
    }
    fn readout(&self, y: &Tensor, _train: bool) -> Tensor {
        y.shallow_clone()
    }
}
