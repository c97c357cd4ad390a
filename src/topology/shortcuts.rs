//! `shortcuts`: an explicit set of identity shortcuts `i:j` (ANCRe §3 notation): the output of
//! node `i` (0 = the embedding) is added to the output of unit `j`,
//! `s_j = f_j(s_{j-1}) + Σ_{(i,j) ∈ E} s_i`, `y = s_L`. With every `k-1:k` edge this is `residual`;
//! with none, `plain`.
//!
//! ```yaml
//! topology: { kind: shortcuts, edges: ["0:2"] }
//! ```

use super::{common, Granularity, Norm, StackInfo, Topology, TopologyEntry, TopologySpec, Unit};
use crate::config::{parse_options, OptionError};
use serde::Deserialize;
use tch::{nn, Kind, Tensor};

pub const ENTRY: TopologyEntry = TopologyEntry {
    name: "shortcuts",
    display: "Shortcuts",
    about: "explicit identity shortcuts i:j added to the output of unit j",
    parse,
    color: (0, 0, 0),
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Options {
    /// Shortcuts as `"i:j"` strings, `0 ≤ i < j ≤ L`.
    #[serde(default)]
    edges: Vec<String>,
    granularity: Option<Granularity>,
}

#[derive(Debug)]
struct Spec {
    granularity: Granularity,
    edges: Vec<(usize, usize)>,
}

fn parse(opts: &serde_yaml::Mapping, stack: StackInfo) -> Result<Box<dyn TopologySpec>, OptionError> {
    let o: Options = parse_options(opts)?;
    let (granularity, depth) = common::granularity(o.granularity, Granularity::Sublayer, stack)?;
    let mut edges = Vec::new();
    for (n, s) in o.edges.iter().enumerate() {
        let e = common::parse_edge(s, depth).map_err(|a| OptionError::new(format!("edges[{n}]"), s, a))?;
        if edges.contains(&e) {
            return Err(OptionError::new(format!("edges[{n}]"), s, "each edge at most once"));
        }
        edges.push(e);
    }
    edges.sort();
    Ok(Box::new(Spec { granularity, edges }))
}

impl TopologySpec for Spec {
    fn kind(&self) -> &'static str {
        ENTRY.name
    }
    fn label(&self) -> String {
        if self.edges.is_empty() {
            return "none".into();
        }
        self.edges.iter().map(|(i, j)| format!("{i}:{j}")).collect::<Vec<_>>().join("+")
    }
    fn granularity(&self) -> Granularity {
        self.granularity
    }
    fn build(&self, _vs: &nn::Path, _compute: Kind) -> Box<dyn Topology> {
        Box::new(Shortcuts { edges: self.edges.clone() })
    }
}

struct Shortcuts {
    edges: Vec<(usize, usize)>,
}

impl Topology for Shortcuts {
    fn forward(&self, x0: &Tensor, units: &[&dyn Unit], train: bool) -> Tensor {
        // streams[i] = s_i; kept so that later edges can read them.
        let mut streams: Vec<Tensor> = vec![x0.shallow_clone()];
        for (k, f) in units.iter().enumerate() {
            let mut s = f.forward(&streams[k], Norm::Default, train);
            for &(i, _) in self.edges.iter().filter(|e| e.1 == k + 1) {
                s = s + &streams[i];
            }
            streams.push(s);
        }
        streams.pop().expect("s_L")
    }
}
