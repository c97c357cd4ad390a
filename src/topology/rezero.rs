//! `rezero` (Bachlechner et al. 2020): `x_k = x_{k-1} + α_k f_k(x_{k-1})` with `topology.alpha`
//! `[L]` initialised to 0 (every unit starts as the identity) and, as in the paper, no pre-norm in
//! the units (`norm: off`; `norm: keep` keeps them). C: `C[i][k] = α_i` for `1 ≤ i < k`, `C[0][k] = 1`.

use super::{common, Granularity, Norm, StackInfo, Topology, TopologyEntry, TopologySpec, Unit};
use crate::config::{parse_options, OptionError};
use serde::Deserialize;
use tch::{nn, Kind, Tensor};

pub const ENTRY: TopologyEntry = TopologyEntry {
    name: "rezero",
    display: "ReZero",
    about: "ReZero: residual branches scaled by a learnable alpha initialised at 0, no pre-norm",
    parse,
    color: (90, 90, 160),
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum NormOption {
    Off,
    Keep,
}

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Options {
    norm: NormOption,
    granularity: Option<Granularity>,
}

impl Default for Options {
    fn default() -> Self {
        Options { norm: NormOption::Off, granularity: None }
    }
}

#[derive(Debug)]
struct Spec {
    granularity: Granularity,
    depth: usize,
    norm: NormOption,
}

fn parse(opts: &serde_yaml::Mapping, stack: StackInfo) -> Result<Box<dyn TopologySpec>, OptionError> {
    let o: Options = parse_options(opts)?;
    let (granularity, depth) = common::granularity(o.granularity, Granularity::Sublayer, stack)?;
    Ok(Box::new(Spec { granularity, depth, norm: o.norm }))
}

impl TopologySpec for Spec {
    fn kind(&self) -> &'static str {
        ENTRY.name
    }
    fn label(&self) -> String {
        if self.norm == NormOption::Off {
            "no norm".into()
        } else {
            "with norm".into()
        }
    }
    fn granularity(&self) -> Granularity {
        self.granularity
    }
    fn build(&self, vs: &nn::Path, _compute: Kind) -> Box<dyn Topology> {
        Box::new(ReZero { alpha: vs.zeros("alpha", &[self.depth as i64]), norm_off: self.norm == NormOption::Off })
    }
}

struct ReZero {
    alpha: Tensor,
    norm_off: bool,
}

impl Topology for ReZero {
    fn forward(&self, x0: &Tensor, units: &[&dyn Unit], train: bool) -> Tensor {
        let norm = if self.norm_off { Norm::Off } else { Norm::Default };
        // One `unbind` (backward: one `stack`) rather than a `get(k)` per unit, and `x + α_k·f(x)`
        // as one `addcmul`.
        let alpha = self.alpha.unbind(0);
        units.iter().zip(&alpha).fold(x0.shallow_clone(), |x, (f, a)| x.addcmul(&f.forward_compute(&x, norm, train), a))
    }
}
