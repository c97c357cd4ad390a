//! `denseformer` — Depth-Weighted Averaging (DenseFormer, Pagliardini et al. 2024).
//!
//! Blocks keep their own residual; after block i the stream is replaced by a learned combination of
//! every earlier *post-block* stream: `X_0 = x0`, `z_0 = x0`, `X_i = z_{i-1} + f_i(z_{i-1})`,
//! `z_i = Σ_{k ∈ S_i} w_i[k] · X_k`, `y = z_L`. Initialised to 1 on `X_i` and 0 elsewhere, so it
//! starts as the plain (residual) Transformer. `dilation` keeps only `k ≡ i (mod dilation)`;
//! `period` applies the averaging after every `period`-th block only. O(L²) weights
//! `topology.weights.{i}` (key = 1-based block index). Default granularity: `block`.

use super::{common, Granularity, Norm, StackInfo, Topology, TopologyEntry, TopologySpec, Unit};
use crate::config::{parse_options, OptionError};
use serde::Deserialize;
use tch::{nn, Kind, Tensor};

pub const ENTRY: TopologyEntry = TopologyEntry {
    name: "denseformer",
    display: "DenseFormer",
    about: "depth-weighted averaging of all earlier block outputs (DenseFormer)",
    parse,
    color: (148, 103, 189),
};

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Options {
    dilation: usize,
    period: usize,
    granularity: Option<Granularity>,
}

impl Default for Options {
    fn default() -> Self {
        Options { dilation: 1, period: 1, granularity: None }
    }
}

#[derive(Debug)]
struct Spec {
    granularity: Granularity,
    depth: usize,
    dilation: usize,
    period: usize,
}

fn parse(opts: &serde_yaml::Mapping, stack: StackInfo) -> Result<Box<dyn TopologySpec>, OptionError> {
    let o: Options = parse_options(opts)?;
    let (granularity, depth) = common::granularity(o.granularity, Granularity::Block, stack)?;
    if o.dilation == 0 || o.dilation > depth {
        return Err(OptionError::new("dilation", o.dilation, format!("an integer in 1..={depth}")));
    }
    if o.period == 0 || o.period > depth {
        return Err(OptionError::new("period", o.period, format!("an integer in 1..={depth}")));
    }
    Ok(Box::new(Spec { granularity, depth, dilation: o.dilation, period: o.period }))
}

impl Spec {
    /// The sources `S_i` of the averaging after block `i` (ascending).
    fn sources(&self, i: usize) -> Vec<usize> {
        (0..=i).filter(|k| (i - k).is_multiple_of(self.dilation)).collect()
    }
}

impl TopologySpec for Spec {
    fn kind(&self) -> &'static str {
        ENTRY.name
    }
    fn label(&self) -> String {
        format!("dil {}, per {}", self.dilation, self.period)
    }
    fn granularity(&self) -> Granularity {
        self.granularity
    }
    fn build(&self, vs: &nn::Path, _compute: Kind) -> Box<dyn Topology> {
        let wp = vs / "weights";
        let mut dwa = Vec::new();
        for i in (1..=self.depth).filter(|i| i % self.period == 0) {
            let s = self.sources(i);
            let mut init = vec![0.0f32; s.len()];
            init[s.len() - 1] = 1.0;
            let w = common::param_from(&wp, &i.to_string(), &Tensor::from_slice(&init).to_device(vs.device()), true);
            dwa.push((i, s, w));
        }
        Box::new(DenseFormer { dwa, depth: self.depth })
    }
}

struct DenseFormer {
    /// `(i, S_i, w_i)` for every block followed by an averaging.
    dwa: Vec<(usize, Vec<usize>, Tensor)>,
    depth: usize,
}

impl Topology for DenseFormer {
    fn forward(&self, x0: &Tensor, units: &[&dyn Unit], train: bool) -> Tensor {
        // The post-block streams X_0 … X_L.
        let mut post = common::History::new(units.len() + 1, x0);
        let mut z = post.push(x0.shallow_clone()).shallow_clone();
        let mut next = self.dwa.iter().peekable();
        for (k, f) in units.iter().enumerate() {
            let i = k + 1;
            let xi = post.push(&z + f.forward_compute(&z, Norm::Default, train)).shallow_clone();
            z = match next.next_if(|d| d.0 == i) {
                Some((_, sources, w)) => post.mix(sources, &w.to_kind(x0.kind())),
                None => xi,
            };
        }
        z
    }

    fn parameter_view(&self) -> Option<(String, Tensor)> {
        let n = self.depth + 1;
        let m = Tensor::zeros([n as i64, n as i64], (Kind::Double, tch::Device::Cpu));
        for (i, sources, w) in &self.dwa {
            for (v, &k) in common::to_vec(w).iter().zip(sources) {
                let _ = m.get(k as i64).get(*i as i64).fill_(*v);
            }
        }
        Some(("w".into(), m))
    }
}
