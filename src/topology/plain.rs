//! `plain`: no shortcut at all, `x_k = f_k(x_{k-1})`, `y = x_L`.
//! C: `C[k-1][k] = 1`, the readout reads unit L only.

use super::{common, Granularity, Norm, StackInfo, Topology, TopologyEntry, TopologySpec, Unit};
use crate::config::{parse_options, OptionError};
use serde::Deserialize;
use tch::{nn, Kind, Tensor};

pub const ENTRY: TopologyEntry = TopologyEntry { name: "plain", about: "no shortcut: x_k = f_k(x_{k-1})", parse };

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Options {
    granularity: Option<Granularity>,
}

#[derive(Debug)]
struct Spec {
    granularity: Granularity,
}

fn parse(opts: &serde_yaml::Mapping, stack: StackInfo) -> Result<Box<dyn TopologySpec>, OptionError> {
    let o: Options = parse_options(opts)?;
    let (granularity, _) = common::granularity(o.granularity, Granularity::Sublayer, stack)?;
    Ok(Box::new(Spec { granularity }))
}

impl TopologySpec for Spec {
    fn kind(&self) -> &'static str {
        "plain"
    }
    fn label(&self) -> String {
        "none".into()
    }
    fn granularity(&self) -> Granularity {
        self.granularity
    }
    fn build(&self, _vs: &nn::Path, _compute: Kind) -> Box<dyn Topology> {
        Box::new(Plain)
    }
}

struct Plain;

impl Topology for Plain {
    fn forward(&self, x0: &Tensor, units: &[&dyn Unit], train: bool) -> Tensor {
        units.iter().fold(x0.shallow_clone(), |x, f| f.forward(&x, Norm::Default, train))
    }
}
