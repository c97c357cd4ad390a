//! `densenet` — DenseNet-style concatenation: every unit (and the readout) reads a learned
//! projection of the concatenation of all earlier outputs,
//! `input_k = P_k · concat(h_0 … h_{k-1})`, `P_k: k·D → D` (`topology.proj.{k-1}.weight`, no bias),
//! initialised "sum-like" (one identity block per source), so it starts as the residual network.
//! Effective C: `C[i][k] = tr(P_k block i) / D`, the identity component of each source's block.

use super::{common, Granularity, Norm, StackInfo, Topology, TopologyEntry, TopologySpec, Unit};
use crate::config::{parse_options, OptionError};
use serde::Deserialize;
use tch::{nn, Kind, Tensor};

pub const ENTRY: TopologyEntry = TopologyEntry {
    name: "densenet",
    display: "DenseNet",
    about: "learned projection of the concatenation of all earlier outputs (DenseNet-style)",
    parse,
    color: (128, 0, 128),
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Options {
    granularity: Option<Granularity>,
}

#[derive(Debug)]
struct Spec {
    granularity: Granularity,
    depth: usize,
    width: usize,
}

fn parse(opts: &serde_yaml::Mapping, stack: StackInfo) -> Result<Box<dyn TopologySpec>, OptionError> {
    let o: Options = parse_options(opts)?;
    let (granularity, depth) = common::granularity(o.granularity, Granularity::Sublayer, stack)?;
    Ok(Box::new(Spec { granularity, depth, width: stack.width }))
}

impl TopologySpec for Spec {
    fn kind(&self) -> &'static str {
        ENTRY.name
    }
    fn label(&self) -> String {
        "concat".into()
    }
    fn granularity(&self) -> Granularity {
        self.granularity
    }
    fn build(&self, vs: &nn::Path, compute: Kind) -> Box<dyn Topology> {
        let d = self.width as i64;
        let eye = Tensor::eye(d, (Kind::Float, vs.device()));
        let proj = (1..=self.depth as i64 + 1)
            .map(|k| {
                let init = eye.repeat([1, k]);
                common::param_from(&(vs / "proj" / (k - 1)), "weight", &init, true)
            })
            .collect();
        Box::new(DenseNet { proj, width: d, compute })
    }
}

struct DenseNet {
    /// `proj[k-1]`: `[D, k·D]`.
    proj: Vec<Tensor>,
    width: i64,
    compute: Kind,
}

impl Topology for DenseNet {
    fn forward(&self, x0: &Tensor, units: &[&dyn Unit], train: bool) -> Tensor {
        let mut outputs = vec![x0.shallow_clone()];
        for (k, f) in units.iter().enumerate() {
            let input = common::matmul(&Tensor::cat(&outputs, -1), &self.proj[k].tr(), self.compute);
            outputs.push(f.forward(&input, Norm::Default, train));
        }
        common::matmul(&Tensor::cat(&outputs, -1), &self.proj[units.len()].tr(), self.compute)
    }

    fn connectivity(&self, _x0: &Tensor, _units: &[&dyn Unit]) -> Tensor {
        let d = self.width;
        let cols: Vec<Vec<f64>> = self
            .proj
            .iter()
            .map(|p| {
                let k = p.size()[1] / d;
                let traces: Vec<Tensor> = (0..k).map(|i| p.narrow(1, i * d, d).detach().trace()).collect();
                crate::host::values(&Tensor::stack(&traces, 0)).into_iter().map(|t| t / d as f64).collect()
            })
            .collect();
        common::connectivity_from_columns(&cols)
    }
}
