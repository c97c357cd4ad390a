//! `ancre` — Adaptive Neural Connection REassignment (ANCRe §4, eq. 6–8).
//!
//! Every shortcut `i:j` (`i < j`) between the states `s_0 … s_A` carries a coefficient `p_ij`:
//! `s_j = f_j(s_{j-1}) + Σ_{i<j} p_ij · s_i`, `s_0 = x0`, `y = s_A`.
//!
//! * Placement (ANCRe §4.2, Fig. 4): on a Transformer/Mixer (`block_size = 2`) the learned
//!   connections go to the *anchor* sublayers: `block` (default, the paper's choice) = the first
//!   sublayer of each block (MHSA/token-mix inputs), `ffn` = the second, `module` = every sublayer.
//!   Non-anchor sublayers keep their usual residual. With one unit per block (LNN, MLP stack) all
//!   placements mean "every unit".
//! * `normalization: ingoing` (default, eq. 7): `p_{·j} = softmax_i(c_{ij} / τ)`;
//!   `topology.logits.{j-1}` `[j]`, `A(A+1)/2` in all — the first anchor's single coefficient is
//!   always 1. `outgoing` (eq. 6): `p_{i·} = softmax_j(c_{ij} / τ)`; `topology.logits.{i}` `[A-i]`.
//! * Logits start at 0: a uniform average over sources, not an identity.
//! * `tau` defaults to 0.01 as in the official code (the paper's text says 0.1); `1/τ` scales the
//!   logits' gradients, so keep them out of weight decay and mind their learning rate.
//! * Ablations (Table 5): `weights: constant` (`p_ij = 1/j`), `weights: cascaded` (a learnable
//!   scalar per anchor on the `j-1:j` shortcut, init 1, `topology.scale`).
//! * `tsallis: {weight, q}`: adds `weight · Σ (1 − Σ p^q)/(q − 1)` over the softmax distributions
//!   to the loss, pushing towards sparse connectivity.

use super::{common, Granularity, Norm, StackInfo, Topology, TopologyEntry, TopologySpec, Unit};
use crate::config::{parse_options, OptionError};
use serde::Deserialize;
use tch::{nn, Kind, Tensor};

pub const ENTRY: TopologyEntry = TopologyEntry {
    name: "ancre",
    display: "ANCRe",
    about: "learned, softmax-normalised shortcuts between every pair of states (ANCRe)",
    parse,
    color: (214, 39, 40),
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Placement {
    Block,
    Ffn,
    Module,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Tsallis {
    weight: f64,
    q: f64,
}

impl Default for Tsallis {
    fn default() -> Self {
        Tsallis { weight: 0.0, q: 2.0 }
    }
}

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Options {
    normalization: Normalization,
    tau: f64,
    learnable: bool,
    weights: Weights,
    placement: Placement,
    tsallis: Option<Tsallis>,
    granularity: Option<Granularity>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            normalization: Normalization::Ingoing,
            tau: 0.01,
            learnable: true,
            weights: Weights::Softmax,
            placement: Placement::Block,
            tsallis: None,
            granularity: None,
        }
    }
}

#[derive(Debug)]
struct Spec {
    granularity: Granularity,
    /// 0-based indices of the anchor units.
    anchors: Vec<usize>,
    normalization: Normalization,
    tau: f64,
    learnable: bool,
    weights: Weights,
    tsallis: Option<Tsallis>,
}

fn parse(opts: &serde_yaml::Mapping, stack: StackInfo) -> Result<Box<dyn TopologySpec>, OptionError> {
    let o: Options = parse_options(opts)?;
    let (granularity, depth) = common::granularity(o.granularity, Granularity::Sublayer, stack)?;
    if !(o.tau.is_finite() && o.tau > 0.0) {
        return Err(OptionError::new("tau", o.tau, "a finite temperature > 0"));
    }
    let bs = if granularity == Granularity::Sublayer { stack.block_size } else { 1 };
    let anchors: Vec<usize> = match (o.placement, bs) {
        (_, 1) | (Placement::Module, _) => (0..depth).collect(),
        (Placement::Block, _) => (0..depth).filter(|k| k % bs == 0).collect(),
        (Placement::Ffn, _) => (0..depth).filter(|k| k % bs == 1).collect(),
    };
    if let Some(t) = o.tsallis {
        if !(t.weight.is_finite() && t.weight >= 0.0) {
            return Err(OptionError::new("tsallis.weight", t.weight, "a finite weight ≥ 0"));
        }
        if !(t.q.is_finite() && t.q > 1.0) {
            return Err(OptionError::new("tsallis.q", t.q, "an entropic index q > 1"));
        }
        if t.weight > 0.0 && o.weights != Weights::Softmax {
            return Err(OptionError::new("tsallis.weight", t.weight, "0 unless `weights: softmax`"));
        }
    }
    Ok(Box::new(Spec {
        granularity,
        anchors,
        normalization: o.normalization,
        tau: o.tau,
        learnable: o.learnable,
        weights: o.weights,
        tsallis: o.tsallis.filter(|t| t.weight > 0.0),
    }))
}

impl TopologySpec for Spec {
    fn kind(&self) -> &'static str {
        ENTRY.name
    }
    fn label(&self) -> String {
        match self.weights {
            Weights::Softmax => {
                let n = if self.normalization == Normalization::Ingoing { "in" } else { "out" };
                format!("{n}, τ={}", self.tau)
            }
            Weights::Constant => "constant 1/j".into(),
            Weights::Cascaded => "cascaded scalars".into(),
        }
    }
    fn granularity(&self) -> Granularity {
        self.granularity
    }
    fn build(&self, vs: &nn::Path, _compute: Kind) -> Box<dyn Topology> {
        let a = self.anchors.len() as i64;
        let params = match self.weights {
            Weights::Softmax => {
                let logits = vs / "logits";
                let sizes: Vec<i64> = match self.normalization {
                    Normalization::Ingoing => (1..=a).collect(),
                    Normalization::Outgoing => (0..a).map(|i| a - i).collect(),
                };
                sizes
                    .iter()
                    .enumerate()
                    .map(|(n, &s)| common::param(&logits, &n.to_string(), &[s], 0.0, self.learnable))
                    .collect()
            }
            Weights::Cascaded => vec![common::param(vs, "scale", &[a], 1.0, self.learnable)],
            Weights::Constant => vec![],
        };
        Box::new(Ancre {
            anchors: self.anchors.clone(),
            normalization: self.normalization,
            weights: self.weights,
            tau: self.tau,
            tsallis: self.tsallis,
            params,
        })
    }
}

struct Ancre {
    anchors: Vec<usize>,
    normalization: Normalization,
    weights: Weights,
    tau: f64,
    tsallis: Option<Tsallis>,
    /// Softmax: the logit vectors (see module docs); cascaded: `[scale]`; constant: empty.
    params: Vec<Tensor>,
}

impl Ancre {
    /// The softmax distributions the logits define (ingoing: per target; outgoing: per source).
    fn distributions(&self) -> Vec<Tensor> {
        self.params.iter().map(|c| (c / self.tau).softmax(0, Kind::Float)).collect()
    }

    /// `p[j]` (j = 1..=A) = coefficients `[j]` of the states `s_0 … s_{j-1}` into state `j`;
    /// `p[0]` is unused.
    /// Built on `dev` (the stream's device): the constant weights have no parameter to take it from.
    fn coefficients(&self, dev: tch::Device) -> Vec<Tensor> {
        let a = self.anchors.len();
        let mut p = vec![Tensor::zeros([0], (Kind::Float, dev))];
        match (self.weights, self.normalization) {
            (Weights::Softmax, Normalization::Ingoing) => p.extend(self.distributions()),
            (Weights::Softmax, Normalization::Outgoing) => {
                let out = self.distributions();
                for j in 1..=a {
                    // Source i's targets are i+1..=A, so target j is entry j-i-1 of out[i].
                    let col: Vec<Tensor> = (0..j).map(|i| out[i].get((j - i - 1) as i64)).collect();
                    p.push(Tensor::stack(&col, 0));
                }
            }
            (Weights::Constant, _) => {
                for j in 1..=a {
                    p.push(Tensor::full([j as i64], 1.0 / j as f64, (Kind::Float, dev)));
                }
            }
            (Weights::Cascaded, _) => {
                let s = &self.params[0];
                for j in 1..=a {
                    let zeros = Tensor::zeros([(j - 1) as i64], (Kind::Float, dev));
                    p.push(Tensor::cat(&[zeros, s.narrow(0, (j - 1) as i64, 1)], 0));
                }
            }
        }
        p
    }
}

impl Topology for Ancre {
    fn forward(&self, x0: &Tensor, units: &[&dyn Unit], train: bool) -> Tensor {
        // `units` may be a prefix of the stack (early exits): anchors past it are not run.
        let p = self.coefficients(x0.device());
        let mut x = x0.shallow_clone();
        let first = self.anchors[0].min(units.len());
        for f in &units[..first] {
            x = &x + f.forward_compute(&x, Norm::Default, train);
        }
        // The anchor states s_0 … s_{A-1}; the newest one, `s`, is pushed when an anchor reads it
        // (the last one never is: nothing reads it but the output).
        let mut states = common::History::new(self.anchors.len() + 1, x0);
        let mut s = x;
        for (j0, &a) in self.anchors.iter().enumerate().take_while(|(_, &a)| a < units.len()) {
            let sj = states.push(s).shallow_clone();
            // `z = f_a(s_j0) + Σ_i p_ij s_i` over i = 0..=j0 (see `common::History`).
            let mut z = units[a].forward_compute(&sj, Norm::Default, train)
                + states.mix_first(j0 + 1, &p[j0 + 1].to_kind(x0.kind()));
            let end = self.anchors.get(j0 + 1).copied().unwrap_or(units.len()).min(units.len());
            for f in &units[a + 1..end] {
                z = &z + f.forward_compute(&z, Norm::Default, train);
            }
            s = z;
        }
        s
    }

    fn parameter_view(&self) -> Option<(String, Tensor)> {
        let n = self.anchors.len() + 1;
        let dev = self.params.first().map_or(tch::Device::Cpu, |p| p.device());
        let p = tch::no_grad(|| self.coefficients(dev));
        let mut m = vec![0.0f64; n * n];
        for (j, pj) in p.iter().enumerate().skip(1) {
            for (i, x) in common::to_vec(pj).iter().enumerate() {
                m[i * n + j] = *x;
            }
        }
        Some((super::SHORTCUT_WEIGHTS.into(), Tensor::from_slice(&m).view([n as i64, n as i64])))
    }

    fn regularizer(&self) -> Option<Tensor> {
        let t = self.tsallis?;
        let entropies: Vec<Tensor> = self
            .distributions()
            .iter()
            .map(|p| (1.0 - p.pow_tensor_scalar(t.q).sum(Kind::Float)) / (t.q - 1.0))
            .collect();
        Some(common::sum(&entropies) * t.weight)
    }
}
