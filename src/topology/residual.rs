//! `residual` (pre-norm ResNet / Transformer): `x_k = x_{k-1} + f_k(x_{k-1})`, `y = x_L`.
//! C: all ones above the diagonal (every unit and the readout read the sum of all earlier outputs).

use super::{common, StackInfo, Topology, TopologyEntry, TopologySpec, Unit};
use crate::config::{parse_options, OptionError};
use serde::Deserialize;
use tch::{nn, Tensor};

pub const ENTRY: TopologyEntry = TopologyEntry {
    name: "residual",
    about: "cascaded identity shortcuts: x_k = x_{k-1} + f_k(x_{k-1})",
    parse,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Options {}

#[derive(Debug)]
struct Spec {
    stack: StackInfo,
}

fn parse(
    opts: &serde_yaml::Mapping,
    stack: StackInfo,
) -> Result<Box<dyn TopologySpec>, OptionError> {
    let _: Options = parse_options(opts)?;
    Ok(Box::new(Spec { stack }))
}

impl TopologySpec for Spec {
    fn kind(&self) -> &'static str {
        "residual"
    }
    fn label(&self) -> String {
        "cascaded".into()
    }
    fn build(&self, _vs: &nn::Path) -> Box<dyn Topology> {
        Box::new(Residual {
            depth: self.stack.depth,
        })
    }
}

struct Residual {
    depth: usize,
}

impl Topology for Residual {
    fn forward(&self, x0: &Tensor, units: &[&dyn Unit], train: bool) -> Tensor {
        units
            .iter()
            .fold(x0.shallow_clone(), |x, f| f.forward(&x, train) + x)
    }

    fn connectivity(&self, _x0: &Tensor, _units: &[&dyn Unit]) -> Tensor {
        let n = self.depth + 1;
        let mut w = vec![vec![0.0; n]; n];
        for j in 1..n {
            w[j - 1][j] = 1.0;
        }
        common::stream_connectivity(&w)
    }
}
