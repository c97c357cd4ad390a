//! `shortcuts`: an explicit set of identity shortcuts `i:j` (ANCRe §3 notation): the output of
//! node `i` (0 = the embedding) is added to the output of unit `j`,
//! `s_j = f_j(s_{j-1}) + Σ_{(i,j) ∈ E} s_i`, `y = s_L`. With every `k-1:k` edge this is `residual`;
//! with none, `plain`.
//!
//! ```yaml
//! topology: { kind: shortcuts, edges: ["0:2"] }
//! ```

use super::{common, StackInfo, Topology, TopologyEntry, TopologySpec, Unit};
use crate::config::{parse_options, OptionError};
use serde::Deserialize;
use tch::{nn, Tensor};

pub const ENTRY: TopologyEntry = TopologyEntry {
    name: "shortcuts",
    about: "explicit identity shortcuts i:j added to the output of unit j",
    parse,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Options {
    /// Shortcuts as `"i:j"` strings, `0 ≤ i < j ≤ L`.
    #[serde(default)]
    edges: Vec<String>,
}

#[derive(Debug)]
struct Spec {
    stack: StackInfo,
    edges: Vec<(usize, usize)>,
}

fn parse(
    opts: &serde_yaml::Mapping,
    stack: StackInfo,
) -> Result<Box<dyn TopologySpec>, OptionError> {
    let o: Options = parse_options(opts)?;
    let mut edges = Vec::new();
    for (n, s) in o.edges.iter().enumerate() {
        let e = common::parse_edge(s, stack.depth)
            .map_err(|a| OptionError::new(format!("edges[{n}]"), s, a))?;
        if edges.contains(&e) {
            return Err(OptionError::new(
                format!("edges[{n}]"),
                s,
                "each edge at most once",
            ));
        }
        edges.push(e);
    }
    edges.sort();
    Ok(Box::new(Spec { stack, edges }))
}

impl TopologySpec for Spec {
    fn kind(&self) -> &'static str {
        "shortcuts"
    }
    fn label(&self) -> String {
        if self.edges.is_empty() {
            return "none".into();
        }
        self.edges
            .iter()
            .map(|(i, j)| format!("{i}:{j}"))
            .collect::<Vec<_>>()
            .join("+")
    }
    fn build(&self, _vs: &nn::Path) -> Box<dyn Topology> {
        Box::new(Shortcuts {
            depth: self.stack.depth,
            edges: self.edges.clone(),
        })
    }
}

struct Shortcuts {
    depth: usize,
    edges: Vec<(usize, usize)>,
}

impl Topology for Shortcuts {
    fn forward(&self, x0: &Tensor, units: &[&dyn Unit], train: bool) -> Tensor {
        // streams[i] = s_i; only kept so that later edges can read them.
        let mut streams: Vec<Tensor> = vec![x0.shallow_clone()];
        for (k, f) in units.iter().enumerate() {
            let j = k + 1;
            let mut s = f.forward(&streams[k], train);
            for &(i, _) in self.edges.iter().filter(|e| e.1 == j) {
                s += &streams[i];
            }
            streams.push(s);
        }
        streams.pop().expect("s_L")
    }

    fn connectivity(&self, _x0: &Tensor, _units: &[&dyn Unit]) -> Tensor {
        let n = self.depth + 1;
        let mut w = vec![vec![0.0; n]; n];
        for &(i, j) in &self.edges {
            w[i][j] = 1.0;
        }
        common::stream_connectivity(&w)
    }
}
