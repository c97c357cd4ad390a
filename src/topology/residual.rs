//! `residual` (pre-norm ResNet / Transformer): `x_k = x_{k-1} + f_k(x_{k-1})`, `y = x_L`.
//! C: all ones above the diagonal (every unit and the readout read the sum of all earlier outputs).

use super::{common, Norm, StackInfo, Topology, TopologyEntry, TopologySpec, Unit};
use crate::config::OptionError;
use tch::Tensor;

pub const ENTRY: TopologyEntry = TopologyEntry {
    name: "residual",
    display: "Residual",
    about: "cascaded identity shortcuts: x_k = x_{k-1} + f_k(x_{k-1})",
    parse,
    color: (31, 119, 180),
};

fn parse(opts: &serde_yaml::Mapping, stack: StackInfo) -> Result<Box<dyn TopologySpec>, OptionError> {
    common::parse_parameterless(opts, stack, ENTRY.name, "cascaded", || Box::new(Residual))
}

struct Residual;

impl Topology for Residual {
    fn forward(&self, x0: &Tensor, units: &[&dyn Unit], train: bool) -> Tensor {
        // `h + x` reads the branch output in its compute dtype (see `Unit::forward_compute`).
        units.iter().fold(x0.shallow_clone(), |x, f| f.forward_compute(&x, Norm::Default, train) + x)
    }

    fn gamma(&self) -> Option<Tensor> {
        Some(Tensor::from(1.0f64))
    }
}
