//! `plain`: no shortcut at all, `x_k = f_k(x_{k-1})`, `y = x_L`.
//! C: `C[k-1][k] = 1`, the readout reads unit L only.

use super::{common, StackInfo, Topology, TopologyEntry, TopologySpec, Unit};
use crate::config::{parse_options, OptionError};
use serde::Deserialize;
use tch::{nn, Tensor};

pub const ENTRY: TopologyEntry = TopologyEntry {
    name: "plain",
    about: "no shortcut: x_k = f_k(x_{k-1})",
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
        "plain"
    }
    fn label(&self) -> String {
        "none".into()
    }
    fn build(&self, _vs: &nn::Path) -> Box<dyn Topology> {
        Box::new(Plain {
            depth: self.stack.depth,
        })
    }
}

struct Plain {
    depth: usize,
}

impl Topology for Plain {
    fn forward(&self, x0: &Tensor, units: &[&dyn Unit], train: bool) -> Tensor {
        units
            .iter()
            .fold(x0.shallow_clone(), |x, f| f.forward(&x, train))
    }

    fn connectivity(&self, _x0: &Tensor, _units: &[&dyn Unit]) -> Tensor {
        common::stream_connectivity(&vec![vec![0.0; self.depth + 1]; self.depth + 1])
    }
}
