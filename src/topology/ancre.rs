//! `ancre` — Adaptive Neural Connection REassignment (ANCRe §4, eq. 6–8).
//!
//! Every shortcut `i:j` (`i < j`) carries a coefficient `p_ij`:
//! `s_j = f_j(s_{j-1}) + Σ_{i<j} p_ij · s_i`, `s_0 = x0`, `y = s_L`.
//!
//! * `normalization: ingoing` (default, eq. 7): `p_{·j} = softmax_i(c_{ij} / τ)` over the sources
//!   of target `j`; parameters `topology.logits.{j-1}`, shape `[j]`, `L(L+1)/2` in all. The first
//!   unit's single coefficient is therefore always 1 (its gradient is exactly 0).
//! * `normalization: outgoing` (eq. 6): `p_{i·} = softmax_j(c_{ij} / τ)` over the targets of source
//!   `i`; parameters `topology.logits.{i}`, shape `[L-i]`, `i = 0..L-1`.
//! * Logits start at 0: a uniform average over sources, not an identity.
//! * `tau` defaults to 0.01 as in the official code (the paper's text says 0.1); note that `1/τ`
//!   scales the logits' gradients.
//! * Ablations (ANCRe Table 5): `weights: constant` (`p_ij = 1/j`, no parameters) and
//!   `weights: cascaded` (a learnable scalar on each `k-1:k` shortcut, init 1, `topology.scale`).

use super::{common, StackInfo, Topology, TopologyEntry, TopologySpec, Unit};
use crate::config::{parse_options, OptionError};
use serde::Deserialize;
use tch::{nn, Kind, Tensor};

pub const ENTRY: TopologyEntry = TopologyEntry {
    name: "ancre",
    about: "learned, softmax-normalised shortcuts between every pair of nodes (ANCRe)",
    parse,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Normalization {
    Ingoing,
    Outgoing,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Weights {
    Softmax,
    Constant,
    Cascaded,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Options {
    #[serde(default = "default_norm")]
    normalization: Normalization,
    #[serde(default = "default_tau")]
    tau: f64,
    #[serde(default = "default_true")]
    learnable: bool,
    #[serde(default = "default_weights")]
    weights: Weights,
}

fn default_norm() -> Normalization {
    Normalization::Ingoing
}
fn default_tau() -> f64 {
    0.01
}
fn default_true() -> bool {
    true
}
fn default_weights() -> Weights {
    Weights::Softmax
}

#[derive(Debug)]
struct Spec {
    stack: StackInfo,
    normalization: Normalization,
    tau: f64,
    learnable: bool,
    weights: Weights,
}

fn parse(
    opts: &serde_yaml::Mapping,
    stack: StackInfo,
) -> Result<Box<dyn TopologySpec>, OptionError> {
    let o: Options = parse_options(opts)?;
    if !(o.tau.is_finite() && o.tau > 0.0) {
        return Err(OptionError::new("tau", o.tau, "a finite temperature > 0"));
    }
    Ok(Box::new(Spec {
        stack,
        normalization: o.normalization,
        tau: o.tau,
        learnable: o.learnable,
        weights: o.weights,
    }))
}

impl TopologySpec for Spec {
    fn kind(&self) -> &'static str {
        "ancre"
    }
    fn label(&self) -> String {
        match self.weights {
            Weights::Softmax => {
                let n = if self.normalization == Normalization::Ingoing {
                    "in"
                } else {
                    "out"
                };
                format!("{n}, τ={}", self.tau)
            }
            Weights::Constant => "constant 1/j".into(),
            Weights::Cascaded => "cascaded scalars".into(),
        }
    }
    fn build(&self, vs: &nn::Path) -> Box<dyn Topology> {
        let l = self.stack.depth as i64;
        let new = |p: &nn::Path, name: &str, size: i64, init: f64| {
            if self.learnable {
                p.var(name, &[size], nn::Init::Const(init))
            } else {
                // Registered (so checkpoints hold it) but frozen.
                let t = p.zeros_no_train(name, &[size]);
                tch::no_grad(|| t.shallow_clone().fill_(init))
            }
        };
        let params = match self.weights {
            Weights::Softmax => {
                let logits = vs / "logits";
                let sizes: Vec<i64> = match self.normalization {
                    Normalization::Ingoing => (1..=l).collect(),
                    Normalization::Outgoing => (0..l).map(|i| l - i).collect(),
                };
                sizes
                    .iter()
                    .enumerate()
                    .map(|(n, &s)| new(&logits, &n.to_string(), s, 0.0))
                    .collect()
            }
            Weights::Cascaded => vec![new(vs, "scale", l, 1.0)],
            Weights::Constant => vec![],
        };
        Box::new(Ancre {
            depth: self.stack.depth,
            spec_norm: self.normalization,
            weights: self.weights,
            tau: self.tau,
            params,
        })
    }
}

struct Ancre {
    depth: usize,
    spec_norm: Normalization,
    weights: Weights,
    tau: f64,
    /// Softmax: the logit vectors (see module docs); cascaded: `[scale]`; constant: empty.
    params: Vec<Tensor>,
}

impl Ancre {
    /// `p[j]` = coefficients of the sources `0..j` into target `j` (1-D tensor `[j]`), `j = 1..=L`;
    /// index 0 is unused.
    fn coefficients(&self) -> Vec<Tensor> {
        let l = self.depth;
        let mut p: Vec<Tensor> = vec![Tensor::zeros([0], (Kind::Float, tch::Device::Cpu))];
        match (self.weights, self.spec_norm) {
            (Weights::Softmax, Normalization::Ingoing) => {
                for j in 1..=l {
                    p.push((&self.params[j - 1] / self.tau).softmax(0, Kind::Float));
                }
            }
            (Weights::Softmax, Normalization::Outgoing) => {
                let out: Vec<Tensor> = self
                    .params
                    .iter()
                    .map(|c| (c / self.tau).softmax(0, Kind::Float))
                    .collect();
                for j in 1..=l {
                    // source i's targets are i+1..=L, so target j is entry j-i-1 of out[i].
                    let col: Vec<Tensor> = (0..j).map(|i| out[i].get((j - i - 1) as i64)).collect();
                    p.push(Tensor::stack(&col, 0));
                }
            }
            (Weights::Constant, _) => {
                for j in 1..=l {
                    let dev = tch::Device::Cpu;
                    p.push(Tensor::full([j as i64], 1.0 / j as f64, (Kind::Float, dev)));
                }
            }
            (Weights::Cascaded, _) => {
                for j in 1..=l {
                    let s = &self.params[0];
                    let zeros = Tensor::zeros([(j - 1) as i64], (Kind::Float, s.device()));
                    p.push(Tensor::cat(&[zeros, s.narrow(0, (j - 1) as i64, 1)], 0));
                }
            }
        }
        p
    }
}

impl Topology for Ancre {
    fn forward(&self, x0: &Tensor, units: &[&dyn Unit], train: bool) -> Tensor {
        let p = self.coefficients();
        let mut streams: Vec<Tensor> = vec![x0.shallow_clone()];
        for (k, f) in units.iter().enumerate() {
            let j = k + 1;
            let pj = p[j].to_device(x0.device()).to_kind(x0.kind());
            let mut s = f.forward(&streams[k], train);
            for (i, si) in streams.iter().enumerate() {
                s += si * pj.get(i as i64);
            }
            streams.push(s);
        }
        streams.pop().expect("s_L")
    }

    fn connectivity(&self, _x0: &Tensor, _units: &[&dyn Unit]) -> Tensor {
        common::stream_connectivity(&common::to_rows(
            &self.parameter_view().expect("ancre has p").1,
        ))
    }

    fn parameter_view(&self) -> Option<(String, Tensor)> {
        let n = self.depth + 1;
        let p = tch::no_grad(|| self.coefficients());
        let mut m = vec![0.0f64; n * n];
        for (j, pj) in p.iter().enumerate().skip(1) {
            let v = Vec::<f64>::try_from(pj.to_kind(Kind::Double).to_device(tch::Device::Cpu))
                .expect("f64");
            for (i, x) in v.iter().enumerate() {
                m[i * n + j] = *x;
            }
        }
        Some((
            "p".into(),
            Tensor::from_slice(&m).view([n as i64, n as i64]),
        ))
    }
}
