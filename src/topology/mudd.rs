//! `mudd` — multiway dynamic dense connections (MUDDFormer, Xiao et al., ICML 2025;
//! docs/topologies.md, "`mudd`"). After block i the states `X_0 = x0 … X_i` are mixed per token
//! into `C_i` inputs of block i+1, `Z^c = Σ_j W_i[c, j] X_j`, with
//! `W_i = b_i + w2_i(gelu(w1_i(rms(X_i))))` `[.., C_i, i+1]` (`b_i` alone under `dynamic: false`):
//! `ways: qkvr` gives the query, key, value and residual ports of the block's attention their own
//! mix ([`Unit::forward_ports`]), `ways: l` one mix the block runs on. The last block's single mix
//! is the readout's input. Block granularity (`l` also on sublayers). Init (the authors' JAX code): `b_i` one-hot on
//! the latest state, `w1` `N(0, 1/D)`, `w2` zero — the residual Transformer.
//!
//! C is input-dependent: the coefficients of every state over `h_0 … h_L` (`X_j = R_j + h_j`, `R_j`
//! the residual input of block j) ride along the values through the same per-token weights and are
//! averaged over batch and tokens, one C per way.

use super::{common, Granularity, Norm, Ports, StackInfo, Topology, TopologyEntry, TopologySpec, Unit};
use crate::config::{parse_options, OptionError};
use serde::Deserialize;
use tch::{nn, Kind, Tensor};

pub const ENTRY: TopologyEntry = TopologyEntry {
    name: "mudd",
    display: "MUDD",
    about: "MUDDFormer: per-token dense mixes of all earlier block outputs, one per way (query, key, value, residual)",
    parse,
    color: (188, 128, 34),
};

/// The RMS norm's epsilon before the weight generator (the authors' `norm_eps`).
const RMS_EPS: f64 = 1e-6;

/// The parameter view of C per way (`params/ways_step_N.csv`).
pub const WAYS_VIEW: &str = "ways";

/// The ways' names in the order of `W`'s rows (`qkvr`).
pub const WAYS: [&str; 4] = ["query", "key", "value", "residual"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Ways {
    /// One mix per port: query, key, value, residual (the paper's MUDD).
    Qkvr,
    /// One mix, the block's input (per-token DenseFormer).
    L,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Options {
    /// Default: `qkvr` where the backbone's blocks have ports, `l` elsewhere.
    ways: Option<Ways>,
    #[serde(default = "default_dynamic")]
    dynamic: bool,
    granularity: Option<Granularity>,
}

fn default_dynamic() -> bool {
    true
}

#[derive(Debug)]
struct Spec {
    granularity: Granularity,
    depth: usize,
    width: usize,
    ways: Ways,
    dynamic: bool,
}

fn parse(opts: &serde_yaml::Mapping, stack: StackInfo) -> Result<Box<dyn TopologySpec>, OptionError> {
    let o: Options = parse_options(opts)?;
    let ways = o.ways.unwrap_or(if stack.ports { Ways::Qkvr } else { Ways::L });
    if ways == Ways::Qkvr && o.granularity == Some(Granularity::Sublayer) {
        return Err(OptionError::new(
            "granularity",
            "sublayer",
            "block with `ways: qkvr` (its ports are a Transformer layer's attention inputs; `ways: l` also runs on sublayers)",
        ));
    }
    let (granularity, depth) = common::granularity(o.granularity, Granularity::Block, stack)?;
    if ways == Ways::Qkvr && !stack.ports {
        return Err(OptionError::new(
            "ways",
            "qkvr",
            "`l` on this backbone: its blocks have no query, key and value ports (an attention sublayer first, as in `gpt` and `llama`)",
        ));
    }
    Ok(Box::new(Spec { granularity, depth, width: stack.width, ways, dynamic: o.dynamic }))
}

impl Spec {
    fn ways(&self) -> usize {
        match self.ways {
            Ways::Qkvr => 4,
            Ways::L => 1,
        }
    }
}

/// The authors' hidden size of a weight generator: `(⌊n/64⌋ + 1)·64`.
pub fn round64(n: usize) -> usize {
    (n / 64 + 1) * 64
}

impl TopologySpec for Spec {
    fn kind(&self) -> &'static str {
        ENTRY.name
    }
    fn label(&self) -> String {
        let ways = match self.ways {
            Ways::Qkvr => "qkvr",
            Ways::L => "l",
        };
        format!("{ways}, {}", if self.dynamic { "dynamic" } else { "static" })
    }
    fn granularity(&self) -> Granularity {
        self.granularity
    }
    fn ports(&self) -> bool {
        self.ways == Ways::Qkvr
    }
    fn build(&self, vs: &nn::Path, compute: Kind) -> Box<dyn Topology> {
        let (l, d) = (self.depth, self.width as i64);
        let mixes = (1..=l)
            .map(|i| {
                let c = if i == l { 1 } else { self.ways() };
                let mut init = vec![0.0f32; c * (i + 1)];
                for row in init.chunks_mut(i + 1) {
                    row[i] = 1.0;
                }
                let init = Tensor::from_slice(&init).view([c as i64, i as i64 + 1]).to_device(vs.device());
                let dense = common::param_from(&(vs / "dense"), &i.to_string(), &init, true);
                let dynamic = self.dynamic.then(|| {
                    let p = vs / "dynamic" / i;
                    let hidden = round64(c * (i + 1) * if i == l { 4 } else { 1 }) as i64;
                    let std = 1.0 / (d as f64).sqrt();
                    let w1 = (&p / "w1").var("weight", &[hidden, d], nn::Init::Randn { mean: 0.0, stdev: std });
                    let w2 = (&p / "w2").zeros("weight", &[(c * (i + 1)) as i64, hidden]);
                    (w1, w2)
                });
                Mix { dense, dynamic }
            })
            .collect();
        Box::new(Mudd { mixes, ways: self.ways(), compute })
    }
}

/// The mixing after one block.
struct Mix {
    /// `b_i` `[C_i, i+1]`.
    dense: Tensor,
    /// `(w1 [H_i, D], w2 [C_i·(i+1), H_i])`.
    dynamic: Option<(Tensor, Tensor)>,
}

impl Mix {
    /// `W_i` from the state `x` `[.., D]`: `[.., C_i, i+1]` fp32 (dynamic), or `b_i` `[C_i, i+1]`.
    /// The generator's matmuls run in `compute`, its GELU on what they return (a `Linear`'s rule).
    fn weights(&self, x: &Tensor, compute: Kind) -> Tensor {
        let Some((w1, w2)) = &self.dynamic else { return self.dense.shallow_clone() };
        let d = *x.size().last().expect("a feature axis");
        let r = x.rms_norm([d], None::<Tensor>, RMS_EPS);
        let a = r.to_kind(compute).linear(&w1.to_kind(compute), None::<Tensor>).gelu("none");
        let dw = a.linear(&w2.to_kind(compute), None::<Tensor>);
        let mut shape = x.size();
        shape.pop();
        shape.extend(self.dense.size());
        dw.view(shape.as_slice()).to_kind(common::stream_kind(x.kind())) + &self.dense
    }
}

/// A state: its value `[.., D]` and, in a trace, its coefficients over `h_0 … h_L` `[.., L+1]`.
struct State {
    value: Tensor,
    coef: Option<Tensor>,
}

impl State {
    /// The same tensors, shared.
    fn share(&self) -> State {
        State { value: self.value.shallow_clone(), coef: self.coef.as_ref().map(Tensor::shallow_clone) }
    }

    /// `stack` (the states so far, on a new second-to-last axis: values `[.., m, D]`, coefficients
    /// `[.., m, L+1]`) with `x` appended.
    fn stacked(stack: Option<State>, x: &State) -> State {
        let Some(stack) = stack else {
            return State { value: x.value.unsqueeze(-2), coef: x.coef.as_ref().map(|c| c.unsqueeze(-2)) };
        };
        let cat = |a: &Tensor, b: &Tensor| Tensor::cat(&[a.shallow_clone(), b.unsqueeze(-2)], -2);
        State {
            value: cat(&stack.value, &x.value),
            coef: stack.coef.as_ref().zip(x.coef.as_ref()).map(|(a, b)| cat(a, b)),
        }
    }

    /// Every way's mix of the stacked states, `Z = W X`: `W` `[.., C, m]` (or `[C, m]`, static)
    /// times `X` `[.., m, D]`, one product for all ways (not `C·m` multiply-adds, each a kernel
    /// and a full-size temporary each way); the coefficients through the same weights. The ways
    /// are taken apart by one `unbind`, whose backward stacks their gradients in one operator: a
    /// `select` per way would fill a zero tensor of all C ways' size for each way and add the C.
    fn mixes(stack: &State, w: &Tensor) -> Vec<State> {
        let z = w.matmul(&stack.value).unbind(-2);
        let zc = stack.coef.as_ref().map(|c| w.to_kind(c.kind()).matmul(c).unbind(-2));
        z.into_iter()
            .enumerate()
            .map(|(c, value)| State { value, coef: zc.as_ref().map(|t| t[c].shallow_clone()) })
            .collect()
    }
}

struct Mudd {
    mixes: Vec<Mix>,
    /// 4 (`qkvr`) or 1 (`l`).
    ways: usize,
    compute: Kind,
}

impl Mudd {
    /// Runs the stack; with `trace`, the states carry coefficients and `columns[c]` collects each
    /// unit's way-c input coefficients (averaged over batch and tokens) and, last, the readout's.
    fn run(
        &self,
        x0: &Tensor,
        units: &[&dyn Unit],
        train: bool,
        mut columns: Option<&mut Vec<Vec<Vec<f64>>>>,
    ) -> Tensor {
        let n = units.len() as i64 + 1;
        // e_k over h_0 … h_L, per token.
        let basis = |k: usize| {
            let mut shape = x0.size();
            *shape.last_mut().expect("a feature axis") = n;
            let e = Tensor::zeros(shape.as_slice(), (Kind::Double, x0.device()));
            let _ = e.narrow(-1, k as i64, 1).fill_(1.0);
            e
        };
        let start = State { value: x0.shallow_clone(), coef: columns.is_some().then(|| basis(0)) };
        // Block 1 reads x0 on every way.
        let mut ins: Vec<State> = (0..self.ways).map(|_| start.share()).collect();
        let mut stack = Some(State::stacked(None, &start));
        for (k, (f, mix)) in units.iter().zip(&self.mixes).enumerate() {
            if let Some(cols) = columns.as_deref_mut() {
                for (c, s) in ins.iter().enumerate() {
                    cols[c].push(common::mean_over_leading(s.coef.as_ref().expect("traced")));
                }
            }
            let residual = &ins[ins.len() - 1];
            let value = if ins.len() == 4 && k > 0 {
                let ports =
                    Ports { query: &ins[0].value, key: &ins[1].value, value: &ins[2].value, residual: &residual.value };
                &residual.value
                    + f.forward_ports(&ports, train)
                        .expect("mudd's qkvr is refused at load on a backbone without ports")
            } else {
                &residual.value + f.forward_compute(&residual.value, Norm::Default, train)
            };
            let x = State { value, coef: residual.coef.as_ref().map(|c| c + basis(k + 1)) };
            let w = mix.weights(&x.value, self.compute);
            let all = State::stacked(stack.take(), &x);
            ins = State::mixes(&all, &w);
            stack = Some(all);
        }
        let y = ins.swap_remove(0);
        if let Some(cols) = columns {
            let readout = common::mean_over_leading(y.coef.as_ref().expect("traced"));
            for col in cols.iter_mut() {
                col.push(readout.clone());
            }
        }
        y.value
    }

    /// One C per way on `x0`'s batch, `[L+2, L+2]` each (q, k, v, r under `qkvr`).
    fn per_way(&self, x0: &Tensor, units: &[&dyn Unit]) -> Vec<Tensor> {
        let mut cols = vec![Vec::new(); self.ways];
        let _ = tch::no_grad(|| self.run(x0, units, false, Some(&mut cols)));
        cols.iter().map(|c| common::connectivity_from_columns(c)).collect()
    }
}

impl Topology for Mudd {
    fn forward(&self, x0: &Tensor, units: &[&dyn Unit], train: bool) -> Tensor {
        self.run(x0, units, train, None)
    }

    /// The residual way's C (the one way's under `l`).
    fn connectivity(&self, x0: &Tensor, units: &[&dyn Unit]) -> Tensor {
        self.per_way(x0, units).pop().expect("at least one way")
    }

    /// `ways`: every way's C stacked, `[ways·(L+2), L+2]`, in the order query, key, value,
    /// residual.
    fn parameter_view_on(&self, x0: &Tensor, units: &[&dyn Unit]) -> Option<(String, Tensor)> {
        Some((WAYS_VIEW.into(), Tensor::cat(&self.per_way(x0, units), 0)))
    }
}
