//! `acn` — Auto-regressive/accumulating connection network (H-ACN §2): units are chained without
//! shortcuts, `x_k = f_k(x_{k-1})`, and the readout sums every unit output and the embedding,
//! `y = x0 + Σ_k h_k` (long connections to the output, fixed at 1).
//! C: `C[k-1][k] = 1`, readout column all ones. `depth_ln: true`: Depth-adaptive LayerNorm, as the
//! H-ACN paper trains its ACNs (footnote 3, App. D; see [`common::DepthLn`]).

use super::{common, Granularity, Norm, StackInfo, Topology, TopologyEntry, TopologySpec, Unit};
use crate::config::OptionError;
use tch::{nn, Kind, Tensor};

pub const ENTRY: TopologyEntry = TopologyEntry {
    name: "acn",
    display: "ACN",
    about: "chained units, readout = x0 + sum of all unit outputs (H-ACN's ACN)",
    parse,
    color: (255, 127, 14),
};

fn parse(opts: &serde_yaml::Mapping, stack: StackInfo) -> Result<Box<dyn TopologySpec>, OptionError> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Options {
        granularity: Option<Granularity>,
        #[serde(default)]
        depth_ln: bool,
    }
    let o: Options = crate::config::parse_options(opts)?;
    let (granularity, depth) = common::granularity(o.granularity, Granularity::Sublayer, stack)?;
    if o.depth_ln && !stack.pre_norm {
        return Err(OptionError::new("depth_ln", true, "false: this backbone's units have no pre-norm to scale"));
    }
    Ok(Box::new(Spec { granularity, depth, depth_ln: o.depth_ln }))
}

/// ACN's options: `granularity`, and `depth_ln` (Depth-adaptive LayerNorm, as the H-ACN paper
/// trains its ACNs; [`common::DepthLn`]).
#[derive(Debug)]
struct Spec {
    granularity: Granularity,
    depth: usize,
    depth_ln: bool,
}

impl TopologySpec for Spec {
    fn kind(&self) -> &'static str {
        ENTRY.name
    }
    fn label(&self) -> String {
        if self.depth_ln {
            "a=0, DLN".into()
        } else {
            "a=0".into()
        }
    }
    fn granularity(&self) -> Granularity {
        self.granularity
    }
    fn build(&self, vs: &nn::Path, _compute: Kind) -> Box<dyn Topology> {
        Box::new(Acn { depth_ln: self.depth_ln.then(|| common::DepthLn::new(vs, self.depth)) })
    }
}

struct Acn {
    depth_ln: Option<common::DepthLn>,
}

impl Topology for Acn {
    fn forward(&self, x0: &Tensor, units: &[&dyn Unit], train: bool) -> Tensor {
        let scales = self.depth_ln.as_ref().map(common::DepthLn::scales);
        let mut x = x0.shallow_clone();
        let mut acc = x0.shallow_clone();
        for (k, f) in units.iter().enumerate() {
            let norm = scales.as_ref().map_or(Norm::Default, |s| Norm::Scaled(&s[k]));
            x = f.forward(&x, norm, train);
            acc = acc + &x;
        }
        acc
    }

    fn gamma(&self) -> Option<Tensor> {
        Some(Tensor::from(0.0f64))
    }
}
