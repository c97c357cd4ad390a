//! `hyper` — Hyper-Connections (Zhu et al. 2024): `n` parallel streams `H: [.., n, D]` (n = 4),
//! expanded from n copies of `x0` and reduced by the mean (the paper sums; the constant factor n is
//! removed by the final norm, and the mean keeps "at init = residual" exact without one).
//!
//! Per unit k: `A = A_static + tanh(Norm(H) W_a)·s_a` (`[.., n, n+1]`), `B = B_static + tanh(Norm(H) w_b)·s_b`
//! (`[.., n]`); the unit reads `Σ_s A[s,0] H_s`, and `H'_t = Σ_s A[s,1+t] H_s + B[t]·f_k(·)`.
//! Init: `A_static[:,0] = onehot(k mod n)`, `A_static[:,1:] = I`, `B_static = 1`, `W_a = w_b = 0`,
//! `s = 0.01` — exactly the pre-norm residual network. `dynamic: false` drops the input-dependent
//! terms. Parameters under `topology.layers.{k-1}.` (see `docs/topologies.md`).
//! Effective C: unit inputs traced as coefficients over `h_0 … h_L`, averaged over batch and tokens.

use super::common::{self, StreamMixing};
use super::{Granularity, StackInfo, Topology, TopologyEntry, TopologySpec, Unit};
use crate::config::{parse_options, OptionError};
use crate::native;
use serde::Deserialize;
use tch::{nn, nn::Module, Kind, Tensor};

pub const ENTRY: TopologyEntry = TopologyEntry {
    name: "hyper",
    display: "HC",
    about: "Hyper-Connections: n parallel streams with learned (dynamic) mixing",
    parse,
    color: (227, 119, 194),
};

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Options {
    n: usize,
    dynamic: bool,
    granularity: Option<Granularity>,
}

impl Default for Options {
    fn default() -> Self {
        Options { n: 4, dynamic: true, granularity: None }
    }
}

#[derive(Debug)]
struct Spec {
    granularity: Granularity,
    depth: usize,
    width: usize,
    n: usize,
    dynamic: bool,
}

fn parse(opts: &serde_yaml::Mapping, stack: StackInfo) -> Result<Box<dyn TopologySpec>, OptionError> {
    let o: Options = parse_options(opts)?;
    let (granularity, depth) = common::granularity(o.granularity, Granularity::Sublayer, stack)?;
    if o.n == 0 || o.n > 64 {
        return Err(OptionError::new("n", o.n, "a number of streams in 1..=64"));
    }
    Ok(Box::new(Spec { granularity, depth, width: stack.width, n: o.n, dynamic: o.dynamic }))
}

impl TopologySpec for Spec {
    fn kind(&self) -> &'static str {
        ENTRY.name
    }
    fn label(&self) -> String {
        format!("n={}, {}", self.n, if self.dynamic { "dynamic" } else { "static" })
    }
    fn granularity(&self) -> Granularity {
        self.granularity
    }
    fn streams(&self) -> usize {
        self.n
    }
    /// The read and write, and for dynamic mixing the projection of each normalised stream row to
    /// its n + 2 logits: `n·d·(n + 2)` multiply-adds forward, twice as many backward.
    fn connection_flops(&self) -> u64 {
        let (n, d) = (self.n as u64, self.width as u64);
        let projection = if self.dynamic { 6 * n * d * (n + 2) } else { 0 };
        common::stream_read_write_flops(self.n, self.width) + projection
    }
    fn build(&self, vs: &nn::Path, compute: Kind) -> Box<dyn Topology> {
        Box::new(self.hyper(vs, compute))
    }
    fn build_width_rule(&self, vs: &nn::Path, compute: Kind) -> Option<Box<dyn StreamMixing>> {
        Some(Box::new(self.hyper(vs, compute)))
    }
}

impl Spec {
    fn hyper(&self, vs: &nn::Path, compute: Kind) -> Hyper {
        let (n, d) = (self.n as i64, self.width as i64);
        let dev = vs.device();
        let layers = (0..self.depth)
            .map(|k| {
                let p = vs / "layers" / k;
                let a = Tensor::zeros([n, n + 1], (Kind::Float, dev));
                let _ = a.get((k as i64) % n).get(0).fill_(1.0);
                a.narrow(1, 1, n).copy_(&Tensor::eye(n, (Kind::Float, dev)));
                let dynamic = self.dynamic.then(|| Dynamic {
                    norm: nn::layer_norm(
                        &p / "norm",
                        vec![d],
                        nn::LayerNormConfig { eps: NORM_EPS, ..Default::default() },
                    ),
                    alpha: p.zeros("dynamic_alpha", &[d, n + 1]),
                    beta: p.zeros("dynamic_beta", &[d]),
                    alpha_scale: p.var("alpha_scale", &[], nn::Init::Const(0.01)),
                    beta_scale: p.var("beta_scale", &[], nn::Init::Const(0.01)),
                });
                Layer {
                    static_alpha: common::param_from(&p, "static_alpha", &a, true),
                    static_beta: p.ones("static_beta", &[n]),
                    dynamic,
                }
            })
            .collect();
        Hyper { layers, n: self.n, compute }
    }
}

struct Dynamic {
    norm: nn::LayerNorm,
    alpha: Tensor,
    beta: Tensor,
    alpha_scale: Tensor,
    beta_scale: Tensor,
}

/// ε of the dynamic weights' LayerNorm (PyTorch's default).
const NORM_EPS: f64 = 1e-5;

impl Dynamic {
    /// The dynamic logits of streams `h` `[.., n, D]`: `(Norm(H) W_a [.., n, n+1], Norm(H) w_b [.., n])`,
    /// as one product with `W = [W_a | w_b]` `[D, n+2]`, split.
    ///
    /// On a GPU one kernel each way computes it ([`native::choice::norm_project_gpu`], with the composite's
    /// bf16 roundings under `precision: bf16`); in fp32 on the CPU one fused kernel
    /// ([`native::kernels::norm_project`]): the normalised streams, an `[.., n, D]` tensor written, read by
    /// the product and saved for backward, are never materialised. Otherwise LayerNorm, then the
    /// product in the compute precision (bf16 under `precision: bf16`, as every `Linear`).
    fn logits(&self, h: &Tensor, compute: Kind, grad: Option<&native::kernels::StreamGrad>) -> (Tensor, Tensor) {
        let k = self.alpha.size()[1];
        let w = Tensor::cat(&[&self.alpha, &self.beta.unsqueeze(1)], 1);
        let (gamma, beta) = (self.norm.ws.as_ref(), self.norm.bs.as_ref());
        let gpu = match (gamma, beta) {
            (Some(gamma), Some(beta)) => native::choice::norm_project_gpu(h, gamma, beta, &w, NORM_EPS, compute, grad),
            _ => None,
        };
        let z = match (gpu, gamma, beta, compute) {
            (Some(z), ..) => z,
            (None, Some(gamma), Some(beta), Kind::Float)
                if h.kind() == Kind::Float
                    && native::choice::fused_streams_take_all(&[h, gamma, beta, &self.alpha]) =>
            {
                native::kernels::norm_project(h, gamma, beta, &w, NORM_EPS)
                    .unwrap_or_else(|e| panic!("fused norm and projection: {e:#}"))
            }
            _ => common::matmul(&self.norm.forward(&common::in_stream_kind(h)), &w, compute),
        };
        let parts = z.split_with_sizes([k, 1], -1);
        (parts[0].shallow_clone(), parts[1].squeeze_dim(-1))
    }
}

struct Layer {
    static_alpha: Tensor,
    static_beta: Tensor,
    dynamic: Option<Dynamic>,
}

struct Hyper {
    layers: Vec<Layer>,
    n: usize,
    compute: Kind,
}

impl StreamMixing for Hyper {
    fn streams(&self) -> usize {
        self.n
    }
    fn view_name(&self) -> &'static str {
        super::STREAM_MIXING_VIEWS[1]
    }
    fn mixing(&self, k: usize, h: &Tensor, grad: Option<&native::kernels::StreamGrad>) -> (Tensor, Tensor, Tensor) {
        let l = &self.layers[k];
        let (a, b) = match &l.dynamic {
            None => (l.static_alpha.shallow_clone(), l.static_beta.shallow_clone()),
            Some(d) => {
                let (za, zb) = d.logits(h, self.compute, grad);
                (&l.static_alpha + za.tanh() * &d.alpha_scale, &l.static_beta + zb.tanh() * &d.beta_scale)
            }
        };
        let n = self.n as i64;
        // One split (backward: one `cat`), not a select and a narrow, whose backwards each
        // zero-fill an `[.., n, n+1]` gradient and copy into it. The parts are made contiguous:
        // as strided views (row stride n+1) they send the stream read and write, batched matmuls
        // over every token, down libtorch's slow path for non-BLAS layouts — on the CPU the
        // GPT-size hyper step took 1.4× PyTorch eager's until this copy of two tiny tensors.
        let parts = a.split_with_sizes([1, n], -1);
        (parts[0].squeeze_dim(-1).contiguous(), parts[1].contiguous(), b)
    }

    /// Dynamic mixing in fp32 (or fp64) on the CPU: one autograd function for the norm, the
    /// projection, the tanh-scaled weights and the read ([`native::kernels::hyper_pre`]), one pass per token
    /// each way, in place of some 15 operators forward and 25 backward over `[.., n, n+2]` tensors
    /// and the read's own pass. Otherwise [`mixing`](StreamMixing::mixing), then the read.
    fn read_and_mixing(
        &self,
        k: usize,
        h: &Tensor,
        grad: Option<&native::kernels::StreamGrad>,
    ) -> (Tensor, Tensor, Tensor) {
        match self.fused_pre(k, h) {
            Some(p) => native::kernels::hyper_pre(h, &p).unwrap_or_else(|e| panic!("fused hyper pre: {e:#}")),
            None => common::mixing_then_read(self, k, h, grad),
        }
    }
}

impl Hyper {
    /// Unit k's parameters for the fused pre step, when it applies: dynamic mixing computed in
    /// fp32, and the streams `h` and the parameters all fp32 (or all fp64) on the CPU.
    /// Not under [`native::setting::gpu_paths_on_cpu`]: a GPU has no such kernel, and that setting runs the
    /// GPU's paths (the dynamic logits' kernel, then the read).
    fn fused_pre(&self, k: usize, h: &Tensor) -> Option<native::kernels::HyperPreParams<'_>> {
        let l = &self.layers[k];
        let d = l.dynamic.as_ref().filter(|_| self.compute == Kind::Float && !native::setting::gpu_paths_on_cpu())?;
        let (gamma, beta) = (d.norm.ws.as_ref()?, d.norm.bs.as_ref()?);
        let all = [h, gamma, beta, &d.alpha, &d.beta, &l.static_alpha, &l.static_beta, &d.alpha_scale, &d.beta_scale];
        native::choice::fused_streams_take_all(&all).then_some(native::kernels::HyperPreParams {
            gamma,
            beta,
            w_a: &d.alpha,
            w_b: &d.beta,
            a_static: &l.static_alpha,
            b_static: &l.static_beta,
            s_a: &d.alpha_scale,
            s_b: &d.beta_scale,
            eps: NORM_EPS,
        })
    }
}

impl Topology for Hyper {
    fn forward(&self, x0: &Tensor, units: &[&dyn Unit], train: bool) -> Tensor {
        common::multi_stream(self, x0, units, train, false).0
    }

    fn connectivity(&self, x0: &Tensor, units: &[&dyn Unit]) -> Tensor {
        tch::no_grad(|| common::multi_stream(self, x0, units, false, true).1.expect("traced").connectivity)
    }

    fn parameter_view_on(&self, x0: &Tensor, units: &[&dyn Unit]) -> Option<(String, Tensor)> {
        Some((
            self.view_name().into(),
            tch::no_grad(|| common::multi_stream(self, x0, units, false, true).1.expect("traced").res),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mixing weights reach the stream read and write as contiguous tensors, static and
    /// dynamic: as strided views of the `[.., n, n+1]` weights they sent the per-token matrix
    /// products down libtorch's path for non-BLAS layouts (1.4× PyTorch eager's step on the CPU).
    #[test]
    fn the_mixing_weights_are_contiguous() {
        for dynamic in [false, true] {
            let spec = Spec { granularity: Granularity::Sublayer, depth: 2, width: 8, n: 4, dynamic };
            let vs = nn::VarStore::new(tch::Device::Cpu);
            let hyper = spec.hyper(&vs.root(), Kind::Float);
            let h = Tensor::randn([3, 5, 4, 8], (Kind::Float, tch::Device::Cpu));
            let (pre, res, post) = hyper.mixing(1, &h, None);
            assert_eq!(res.size().last(), Some(&4), "res is n × n");
            for (name, t) in [("pre", &pre), ("res", &res), ("post", &post)] {
                assert!(t.is_contiguous(), "dynamic {dynamic}: {name} {:?} strides {:?}", t.size(), t.stride());
            }
        }
    }
}
