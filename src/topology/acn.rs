//! `acn` — Auto-regressive/accumulating connection network (H-ACN §2): units are chained without
//! shortcuts, `x_k = f_k(x_{k-1})`, and the readout sums every unit output and the embedding,
//! `y = x0 + Σ_k h_k` (long connections to the output, fixed at 1).
//! C: `C[k-1][k] = 1`, readout column all ones.

use super::{common, Norm, StackInfo, Topology, TopologyEntry, TopologySpec, Unit};
use crate::config::OptionError;
use tch::Tensor;

pub const ENTRY: TopologyEntry = TopologyEntry {
    name: "acn",
    about: "chained units, readout = x0 + sum of all unit outputs (H-ACN's ACN)",
    parse,
    color: (255, 127, 14),
};

fn parse(opts: &serde_yaml::Mapping, stack: StackInfo) -> Result<Box<dyn TopologySpec>, OptionError> {
    common::parse_parameterless(opts, stack, ENTRY.name, "a=0", || Box::new(Acn))
}

struct Acn;

impl Topology for Acn {
    fn forward(&self, x0: &Tensor, units: &[&dyn Unit], train: bool) -> Tensor {
        let mut x = x0.shallow_clone();
        let mut acc = x0.shallow_clone();
        for f in units {
            x = f.forward(&x, Norm::Default, train);
            acc = acc + &x;
        }
        acc
    }

    fn gamma(&self) -> Option<Tensor> {
        Some(Tensor::from(0.0f64))
    }
}
