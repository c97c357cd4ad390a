//! `plain`: no shortcut at all, `x_k = f_k(x_{k-1})`, `y = x_L`.
//! C: `C[k-1][k] = 1`, the readout reads unit L only.

use super::{common, Norm, StackInfo, Topology, TopologyEntry, TopologySpec, Unit};
use crate::config::OptionError;
use tch::Tensor;

pub const ENTRY: TopologyEntry = TopologyEntry {
    name: "plain",
    display: "Plain",
    about: "no shortcut: x_k = f_k(x_{k-1})",
    parse,
    color: (127, 127, 127),
};

fn parse(opts: &serde_yaml::Mapping, stack: StackInfo) -> Result<Box<dyn TopologySpec>, OptionError> {
    common::parse_parameterless(opts, stack, ENTRY.name, "none", || Box::new(Plain))
}

struct Plain;

impl Topology for Plain {
    fn forward(&self, x0: &Tensor, units: &[&dyn Unit], train: bool) -> Tensor {
        units.iter().fold(x0.shallow_clone(), |x, f| f.forward(&x, Norm::Default, train))
    }
}
