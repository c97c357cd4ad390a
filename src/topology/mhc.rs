//! `mhc` — Manifold-Constrained Hyper-Connections (Xie et al. 2025): n streams (n = 4) mixed by a
//! doubly stochastic `H_res` (Sinkhorn–Knopp), input-dependent through one projection `φ` of the
//! flattened, RMS-normalised streams:
//! `[H̃pre, H̃post, H̃res] = x̃ φ / r`, `H_pre = σ(α_pre H̃pre + b_pre)`, `H_post = 2σ(α_post H̃post + b_post)`,
//! `H_res = Sinkhorn(α_res H̃res + b_res)`, and `H' = H_resᵀ H + H_postᵀ f(H_pre H)`.
//! Streams expand from copies of `x0` and reduce by the mean (see `hyper`).
//!
//! Init (`init`, docs/topologies.md): every option has `α = 0.01`.
//! - `residual` (default): Hyper-Connections' own static init carried through mHC's maps — unit k
//!   reads stream `k mod n` (`b_pre` = +8 there, −8 elsewhere: `H_pre` one-hot to 3·10⁻⁴), `H_res`
//!   starts at the identity (`b_res` = 0 on the diagonal, −8 off it, the public port of
//!   tokenbender's logits), `H_post = 1` (`b_post = 0`), `φ = 0` (as lucidrains' port): the network
//!   starts as the pre-norm residual network, and the streams are not interchangeable (each unit
//!   reads its own), so they specialise.
//! - `lucidrains`: his port's static init (`hyper-connections` at 4775103) — `b_pre` =
//!   one-hot(k mod n) (so `H_pre` = σ(1) = 0.73 there and 0.5 elsewhere), `b_res = I` (`H_res` =
//!   Sinkhorn(e^I)), `b_post = 1` (`H_post` = 2σ(1) = 1.46), `φ = 0`.
//! - `symmetric`: every bias 0 and `φ ~ N(0, 0.02²)` (`H_pre` = 0.5, `H_post` = 1, `H_res` ≈ 1/n on
//!   every stream): the streams start as copies and every map treats them alike, so only the ~1 %
//!   φ term tells them apart; kept to reproduce runs made before 2026-11-28.
//!
//! `res_bias: zeros | identity` (`5·I`), when given, replaces `b_res` of any init.

use super::common::{self, StreamMixing};
use super::{Granularity, StackInfo, Topology, TopologyEntry, TopologySpec, Unit};
use crate::config::{parse_options, OptionError};
use crate::native::{self, choice::sinkhorn};
use serde::Deserialize;
use tch::{nn, Kind, Tensor};

pub const ENTRY: TopologyEntry = TopologyEntry {
    name: "mhc",
    display: "mHC",
    about: "manifold-constrained hyper-connections: doubly stochastic stream mixing (Sinkhorn)",
    parse,
    // A dark olive: Tableau's (188, 189, 34) is too light on white for a thin line (contrast 2.0).
    color: (128, 128, 0),
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum ResBias {
    Zeros,
    Identity,
}

/// Where the mixing starts (see the module's doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Init {
    Residual,
    Lucidrains,
    Symmetric,
}

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Options {
    n: usize,
    sinkhorn_iters: usize,
    init: Init,
    res_bias: Option<ResBias>,
    granularity: Option<Granularity>,
}

impl Default for Options {
    fn default() -> Self {
        Options { n: 4, sinkhorn_iters: 20, init: Init::Residual, res_bias: None, granularity: None }
    }
}

/// The logit that puts a sigmoid at 1 − 3.4·10⁻⁴ (or, negated, 3.4·10⁻⁴), and a Sinkhorn entry at
/// e⁻⁸ of its diagonal: tokenbender's port's −8.
const SATURATED: f64 = 8.0;

#[derive(Debug)]
struct Spec {
    granularity: Granularity,
    depth: usize,
    width: usize,
    n: usize,
    iters: usize,
    init: Init,
    res_bias: Option<ResBias>,
}

fn parse(opts: &serde_yaml::Mapping, stack: StackInfo) -> Result<Box<dyn TopologySpec>, OptionError> {
    let o: Options = parse_options(opts)?;
    let (granularity, depth) = common::granularity(o.granularity, Granularity::Sublayer, stack)?;
    if o.n == 0 || o.n > 64 {
        return Err(OptionError::new("n", o.n, "a number of streams in 1..=64"));
    }
    if o.sinkhorn_iters == 0 || o.sinkhorn_iters > 1000 {
        return Err(OptionError::new("sinkhorn_iters", o.sinkhorn_iters, "an integer in 1..=1000"));
    }
    Ok(Box::new(Spec {
        granularity,
        depth,
        width: stack.width,
        n: o.n,
        iters: o.sinkhorn_iters,
        init: o.init,
        res_bias: o.res_bias,
    }))
}

impl TopologySpec for Spec {
    fn kind(&self) -> &'static str {
        ENTRY.name
    }
    fn label(&self) -> String {
        match self.init {
            Init::Residual => format!("n={}", self.n),
            Init::Lucidrains => format!("n={}, lucidrains init", self.n),
            Init::Symmetric => format!("n={}, symmetric init", self.n),
        }
    }
    fn granularity(&self) -> Granularity {
        self.granularity
    }
    fn streams(&self) -> usize {
        self.n
    }
    /// The read and write, and the `φ` product of the flattened streams `[n·d]` to the `n² + 2n`
    /// mixing logits: `n·d·(n² + 2n)` multiply-adds forward, twice as many backward (Sinkhorn's
    /// `iters·n²` and the RMS norm's `n·d` are left out: a lower bound).
    fn connection_flops(&self) -> u64 {
        let (n, d) = (self.n as u64, self.width as u64);
        common::stream_read_write_flops(self.n, self.width) + 6 * n * d * (n * n + 2 * n)
    }
    fn build(&self, vs: &nn::Path, compute: Kind) -> Box<dyn Topology> {
        Box::new(self.mhc(vs, compute))
    }
    fn build_width_rule(&self, vs: &nn::Path, compute: Kind) -> Option<Box<dyn StreamMixing>> {
        Some(Box::new(self.mhc(vs, compute)))
    }
}

impl Spec {
    fn mhc(&self, vs: &nn::Path, compute: Kind) -> Mhc {
        let (n, d) = (self.n as i64, self.width as i64);
        let opts = (Kind::Float, vs.device());
        let layers = (0..self.depth)
            .map(|k| {
                let p = vs / "layers" / k;
                // One-hot at stream k mod n, scaled to the init's logits: `(on, off)`.
                let onehot = |on: f64, off: f64| {
                    let t = Tensor::full([n], off, opts);
                    let _ = t.get((k as i64) % n).fill_(on);
                    t
                };
                let diagonal = |on: f64, off: f64| Tensor::full([n, n], off, opts) + Tensor::eye(n, opts) * (on - off);
                let (bias_pre, bias_res) = match self.init {
                    Init::Residual => (onehot(SATURATED, -SATURATED), diagonal(0.0, -SATURATED)),
                    Init::Lucidrains => (onehot(1.0, 0.0), diagonal(1.0, 0.0)),
                    Init::Symmetric => (Tensor::zeros([n], opts), Tensor::zeros([n, n], opts)),
                };
                // lucidrains' port starts its static beta at 1: `H_post = 2σ(1)` = 1.46.
                let bias_post = match self.init {
                    Init::Lucidrains => Tensor::ones([n], opts),
                    Init::Residual | Init::Symmetric => Tensor::zeros([n], opts),
                };
                let bias_res = match self.res_bias {
                    None => bias_res,
                    Some(ResBias::Zeros) => Tensor::zeros([n, n], opts),
                    Some(ResBias::Identity) => Tensor::eye(n, opts) * 5.0,
                };
                let phi = match self.init {
                    Init::Symmetric => nn::Init::Randn { mean: 0.0, stdev: 0.02 },
                    Init::Residual | Init::Lucidrains => nn::Init::Const(0.0),
                };
                Layer {
                    phi: p.var("phi", &[n * d, n * n + 2 * n], phi),
                    alpha_pre: p.var("alpha_pre", &[], nn::Init::Const(0.01)),
                    alpha_post: p.var("alpha_post", &[], nn::Init::Const(0.01)),
                    alpha_res: p.var("alpha_res", &[], nn::Init::Const(0.01)),
                    bias_pre: common::param_from(&p, "bias_pre", &bias_pre, true),
                    bias_post: common::param_from(&p, "bias_post", &bias_post, true),
                    bias_res: common::param_from(&p, "bias_res", &bias_res, true),
                }
            })
            .collect();
        Mhc { layers, n: self.n, iters: self.iters, compute }
    }
}

struct Layer {
    phi: Tensor,
    alpha_pre: Tensor,
    alpha_post: Tensor,
    alpha_res: Tensor,
    bias_pre: Tensor,
    bias_post: Tensor,
    bias_res: Tensor,
}

struct Mhc {
    layers: Vec<Layer>,
    n: usize,
    iters: usize,
    compute: Kind,
}

/// The mixing logits `(v @ φ) / r` of the flattened streams `v` `[.., n·D]` (φ `[n·D, n² + 2n]`),
/// `r = ‖v‖₂ / √(n·D)` their RMS → `[.., n² + 2n]`.
///
/// [`native::kernels::rms_project`], one autograd function whose backward forms the streams' gradient in one
/// pass where autograd ran the norm's backward and added two `[.., n·D]` gradients, and which keeps
/// no bf16 copy of the streams for backward (it casts them again there): on a GPU in fp32 or bf16
/// ([`native::choice::rms_project_gpu`], with the composite's roundings), on the CPU in fp32 or fp64 with
/// the compute precision the same. Otherwise the RMS as one norm kernel (not square → mean → sqrt
/// with an `[.., n·D]` temporary saved for backward) and the product in the compute precision.
fn project(v: &Tensor, phi: &Tensor, compute: Kind) -> Tensor {
    if let Some(q) = native::choice::rms_project_gpu(v, phi, compute) {
        return q;
    }
    if v.kind() == compute && native::choice::fused_streams_take_all(&[v, phi]) {
        return native::kernels::rms_project(v, phi, compute).unwrap_or_else(|e| panic!("fused rms projection: {e:#}"));
    }
    let nd = v.size()[v.dim() - 1] as f64;
    let r = v.norm_scalaropt_dim(2.0, [-1i64], true) / nd.sqrt();
    common::matmul(v, phi, compute) / &r
}

impl StreamMixing for Mhc {
    fn streams(&self) -> usize {
        self.n
    }
    fn view_name(&self) -> &'static str {
        super::STREAM_MIXING_VIEWS[0]
    }
    /// (The RMS projection's backward is libtorch's products, not a kernel that adds into `h`'s
    /// gradient cell: its gradient reaches the cell through autograd.)
    fn mixing(&self, k: usize, h: &Tensor, _grad: Option<&native::kernels::StreamGrad>) -> (Tensor, Tensor, Tensor) {
        let l = &self.layers[k];
        let n = self.n as i64;
        let v = common::in_stream_kind(h).flatten(-2, -1);
        let q = project(&v, &l.phi, self.compute);
        // One split (backward: one `cat`), not three narrows, whose backwards each zero-fill a
        // gradient of q's size and copy into it.
        let parts = q.split_with_sizes([n, n, n * n], -1);
        let pre = (&parts[0] * &l.alpha_pre + &l.bias_pre).sigmoid();
        let post = (&parts[1] * &l.alpha_post + &l.bias_post).sigmoid() * 2.0;
        let mut shape = q.size();
        shape.pop();
        shape.extend([n, n]);
        let res = parts[2].reshape(shape.as_slice()) * &l.alpha_res + &l.bias_res;
        (pre, sinkhorn(&res, self.iters), post)
    }
}

impl Topology for Mhc {
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
