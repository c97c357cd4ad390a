//! `laurel` — Learned Augmented Residual Layer (LAuReL, Menghani et al. 2024), three variants:
//! * `rw`: `x_k = α f_k(x_{k-1}) + β x_{k-1}`, `(α, β) = softmax(topology.layers.{k-1}.weights)`;
//! * `lr`: `x_k = f_k(x_{k-1}) + x_{k-1} + B A x_{k-1}`, rank-r `A = down [r, D]` (init N(0, 1/D)),
//!   `B = up [D, r]` (init 0, so it starts as the residual network);
//! * `pa`: `lr` plus the same low-rank map on earlier streams:
//!   `x_k = f_k(x_{k-1}) + x_{k-1} + Σ_{j=1}^{history} γ_j B A x_{k-j}` (`gamma` init 1).
//!
//! Effective C: scalars exactly (`rw`); a low-rank map `B A` counts as its identity component
//! `tr(B A)/D` (`lr`, `pa`).

use super::{common, Granularity, Norm, StackInfo, Topology, TopologyEntry, TopologySpec, Unit};
use crate::config::{parse_options, OptionError};
use serde::Deserialize;
use tch::{nn, Kind, Tensor};

pub const ENTRY: TopologyEntry = TopologyEntry {
    name: "laurel",
    display: "LAuReL",
    about: "LAuReL: learned residual weights (rw), low-rank (lr) or previous-activation (pa) terms",
    parse,
    color: (0, 128, 128),
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Variant {
    Rw,
    Lr,
    Pa,
}

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Options {
    variant: Variant,
    rank: usize,
    history: usize,
    granularity: Option<Granularity>,
}

impl Default for Options {
    fn default() -> Self {
        Options { variant: Variant::Rw, rank: 4, history: 2, granularity: None }
    }
}

#[derive(Debug)]
struct Spec {
    granularity: Granularity,
    depth: usize,
    width: usize,
    variant: Variant,
    rank: usize,
    history: usize,
}

fn parse(opts: &serde_yaml::Mapping, stack: StackInfo) -> Result<Box<dyn TopologySpec>, OptionError> {
    let o: Options = parse_options(opts)?;
    let (granularity, depth) = common::granularity(o.granularity, Granularity::Sublayer, stack)?;
    if o.rank == 0 || o.rank > stack.width {
        return Err(OptionError::new("rank", o.rank, format!("an integer in 1..={} (the width)", stack.width)));
    }
    if o.history == 0 || o.history > depth {
        return Err(OptionError::new("history", o.history, format!("an integer in 1..={depth}")));
    }
    Ok(Box::new(Spec { granularity, depth, width: stack.width, variant: o.variant, rank: o.rank, history: o.history }))
}

impl TopologySpec for Spec {
    fn kind(&self) -> &'static str {
        ENTRY.name
    }
    fn label(&self) -> String {
        match self.variant {
            Variant::Rw => "rw".into(),
            Variant::Lr => format!("lr r={}", self.rank),
            Variant::Pa => format!("pa r={} k={}", self.rank, self.history),
        }
    }
    fn granularity(&self) -> Granularity {
        self.granularity
    }
    fn build(&self, vs: &nn::Path, compute: Kind) -> Box<dyn Topology> {
        let (d, r) = (self.width as i64, self.rank as i64);
        let layers = (0..self.depth)
            .map(|k| {
                let p = vs / "layers" / k;
                match self.variant {
                    Variant::Rw => Layer { weights: Some(p.zeros("weights", &[2])), down: None, up: None, gamma: None },
                    Variant::Lr | Variant::Pa => Layer {
                        weights: None,
                        down: Some(p.var(
                            "down",
                            &[r, d],
                            nn::Init::Randn { mean: 0.0, stdev: 1.0 / (d as f64).sqrt() },
                        )),
                        up: Some(p.zeros("up", &[d, r])),
                        gamma: (self.variant == Variant::Pa)
                            .then(|| p.var("gamma", &[self.history as i64], nn::Init::Const(1.0))),
                    },
                }
            })
            .collect();
        Box::new(Laurel { layers, width: d, compute })
    }
}

struct Layer {
    weights: Option<Tensor>,
    down: Option<Tensor>,
    up: Option<Tensor>,
    gamma: Option<Tensor>,
}

impl Layer {
    /// `x @ downᵀ @ upᵀ` in `compute`: `x` `[.., D]` → `[.., D]` fp32.
    fn low_rank(&self, x: &Tensor, compute: Kind) -> Tensor {
        let (down, up) = (self.down.as_ref().expect("lr/pa"), self.up.as_ref().expect("lr/pa"));
        common::matmul(&common::matmul(x, &down.tr(), compute), &up.tr(), compute)
    }
}

struct Laurel {
    layers: Vec<Layer>,
    width: i64,
    compute: Kind,
}

impl Topology for Laurel {
    fn forward(&self, x0: &Tensor, units: &[&dyn Unit], train: bool) -> Tensor {
        let mut streams = vec![x0.shallow_clone()];
        for (k, (f, layer)) in units.iter().zip(&self.layers).enumerate() {
            let x = &streams[k];
            let h = f.forward(x, Norm::Default, train);
            let next = if let Some(w) = &layer.weights {
                let ab = w.softmax(0, Kind::Float).unbind(0);
                (h * &ab[0]).addcmul(x, &ab[1])
            } else {
                let mut z = h + x;
                match &layer.gamma {
                    None => z = z + layer.low_rank(x, self.compute),
                    Some(g) => {
                        let g = g.unbind(0);
                        for j in 1..=g.len().min(k + 1) {
                            z = z.addcmul(&layer.low_rank(&streams[k + 1 - j], self.compute), &g[j - 1]);
                        }
                    }
                }
                z
            };
            streams.push(next);
        }
        streams.pop().expect("x_L")
    }

    fn connectivity(&self, x0: &Tensor, units: &[&dyn Unit]) -> Tensor {
        if self.layers.first().is_some_and(|l| l.weights.is_some()) {
            return common::probe_connectivity(|x, u| self.forward(x, u, false), units.len(), x0.device());
        }
        // A low-rank map acts on the stream as a matrix; its scalar stand-in is tr(B A)/D.
        let traces: Vec<Tensor> = self
            .layers
            .iter()
            .map(|l| l.up.as_ref().unwrap().matmul(l.down.as_ref().unwrap()).detach().trace())
            .collect();
        let traces: Vec<f64> =
            crate::host::values(&Tensor::stack(&traces, 0)).into_iter().map(|t| t / self.width as f64).collect();
        let gammas: Vec<Vec<f64>> =
            self.layers.iter().map(|l| l.gamma.as_ref().map(common::to_vec).unwrap_or_else(|| vec![1.0])).collect();
        common::probe_connectivity(
            |x0, units| {
                let mut streams = vec![x0.shallow_clone()];
                for (k, f) in units.iter().enumerate() {
                    let mut z = f.forward(&streams[k], Norm::Default, false) + &streams[k];
                    for (j, g) in gammas[k].iter().enumerate().take(k + 1) {
                        z = z + &streams[k - j] * (g * traces[k]);
                    }
                    streams.push(z);
                }
                streams.pop().expect("x_L")
            },
            units.len(),
            x0.device(),
        )
    }
}
