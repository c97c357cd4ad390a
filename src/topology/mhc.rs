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
//! - `lucidrains`: his port's static init — `b_pre` = one-hot(k mod n) (so `H_pre` = σ(1) = 0.73
//!   there and 0.5 elsewhere), `b_res = I` (`H_res` = Sinkhorn(e^I)), `b_post = 0`, `φ = 0`.
//! - `symmetric`: every bias 0 and `φ ~ N(0, 0.02²)` (`H_pre` = 0.5, `H_post` = 1, `H_res` ≈ 1/n on
//!   every stream): the streams start as copies and every map treats them alike, so only the ~1 %
//!   φ term tells them apart; kept to reproduce runs made before 2026-11-28.
//!
//! `res_bias: zeros | identity` (`5·I`), when given, replaces `b_res` of any init.

use super::common::{self, StreamMixing};
use super::{Granularity, StackInfo, Topology, TopologyEntry, TopologySpec, Unit};
use crate::config::{parse_options, OptionError};
use crate::native::{self, sinkhorn};
use serde::Deserialize;
use tch::{nn, Kind, Tensor};

pub const ENTRY: TopologyEntry = TopologyEntry {
    name: "mhc",
    display: "mHC",
    about: "manifold-constrained hyper-connections: doubly stochastic stream mixing (Sinkhorn)",
    parse,
    color: (188, 189, 34),
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
                    bias_post: p.zeros("bias_post", &[n]),
                    bias_res: common::param_from(&p, "bias_res", &bias_res, true),
                }
            })
            .collect();
        Box::new(Mhc { layers, n: self.n, iters: self.iters, compute })
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
/// [`native::rms_project`], one autograd function whose backward forms the streams' gradient in one
/// pass where autograd ran the norm's backward and added two `[.., n·D]` gradients, and which keeps
/// no bf16 copy of the streams for backward (it casts them again there): on a GPU in fp32 or bf16
/// ([`native::rms_project_gpu`], with the composite's roundings), on the CPU in fp32 or fp64 with
/// the compute precision the same. Otherwise the RMS as one norm kernel (not square → mean → sqrt
/// with an `[.., n·D]` temporary saved for backward) and the product in the compute precision.
fn project(v: &Tensor, phi: &Tensor, compute: Kind) -> Tensor {
    if let Some(q) = native::rms_project_gpu(v, phi, compute) {
        return q;
    }
    if v.kind() == compute && native::fused_streams_take_all(&[v, phi]) {
        return native::rms_project(v, phi, compute).unwrap_or_else(|e| panic!("fused rms projection: {e:#}"));
    }
    let nd = v.size()[v.dim() - 1] as f64;
    let r = v.norm_scalaropt_dim(2.0, [-1i64], true) / nd.sqrt();
    common::matmul(v, phi, compute) / &r
}

impl StreamMixing for Mhc {
    fn streams(&self) -> usize {
        self.n
    }
    /// (The RMS projection's backward is libtorch's products, not a kernel that adds into `h`'s
    /// gradient cell: its gradient reaches the cell through autograd.)
    fn mixing(&self, k: usize, h: &Tensor, _grad: Option<&native::StreamGrad>) -> (Tensor, Tensor, Tensor) {
        let l = &self.layers[k];
        let n = self.n as i64;
        let v = h.to_kind(Kind::Float).flatten(-2, -1);
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
            "H_res".into(),
            tch::no_grad(|| common::multi_stream(self, x0, units, false, true).1.expect("traced").res),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The RMS projection with bf16 products ([`native::rms_project`] with compute bf16, what a GPU
    /// step runs under `precision: bf16`) against the composite it replaces (`project`'s last lines:
    /// the norm, then the bf16 product read back in fp32), q and the gradients of v and φ. The
    /// roundings are the composite's, so the two differ only where an fp32 sum taken in another
    /// order tips a bf16 rounding (rare, by one bf16 unit) and otherwise by fp32 roundoff: at most
    /// 2 % of the elements more than 2⁻¹⁶ of the tensor's largest magnitude apart, none more than
    /// 2⁻⁷ (a rounding left out moves most elements by about 2⁻⁹).
    #[test]
    fn the_rms_projection_in_bf16_rounds_as_the_composite() {
        tch::manual_seed(5);
        let opts = (Kind::Float, tch::Device::Cpu);
        let inputs = [Tensor::randn([3, 7, 40], opts) * 2.0 + 0.5, Tensor::randn([40, 24], opts) * 0.1];
        let g = Tensor::randn([3, 7, 24], opts);
        let run = |fused: bool| -> Vec<Tensor> {
            let xs: Vec<Tensor> = inputs.iter().map(|t| t.detach().set_requires_grad(true)).collect();
            let q = if fused {
                native::rms_project(&xs[0], &xs[1], Kind::BFloat16).unwrap()
            } else {
                let r = xs[0].norm_scalaropt_dim(2.0, [-1i64], true) / 40f64.sqrt();
                common::matmul(&xs[0], &xs[1], Kind::BFloat16) / r
            };
            (&q * &g).sum(Kind::Float).backward();
            std::iter::once(q.detach()).chain(xs.iter().map(|x| x.grad())).collect()
        };
        let (fused, composite) = (run(true), run(false));
        for (i, (a, b)) in fused.iter().zip(&composite).enumerate() {
            let gap = (a - b).abs() / b.abs().max();
            let apart = gap.gt(2f64.powi(-16)).to_kind(Kind::Double).mean(Kind::Double).double_value(&[]);
            let largest = gap.max().double_value(&[]);
            assert!(apart <= 0.02 && largest <= 2f64.powi(-7), "output {i} (q, dv, dφ): {apart} apart, {largest:e}");
        }
    }

    /// The fused RMS projection against the composite formula (fp64, fp32): the value and the
    /// gradients of the streams and of φ. (The model's own fused-against-composite check is
    /// `plexus parity` on the mHC cases.)
    #[test]
    fn the_fused_rms_projection_matches_the_composite_one() {
        tch::manual_seed(5);
        for (kind, tol) in [(Kind::Double, 1e-12), (Kind::Float, 2e-5)] {
            let opts = (kind, tch::Device::Cpu);
            let inputs = [Tensor::randn([3, 7, 40], opts) * 2.0 + 0.5, Tensor::randn([40, 24], opts) * 0.1];
            let g = Tensor::randn([3, 7, 24], opts);
            let run = |fused: bool| -> Vec<Tensor> {
                let xs: Vec<Tensor> = inputs.iter().map(|t| t.detach().set_requires_grad(true)).collect();
                let q = if fused {
                    native::rms_project(&xs[0], &xs[1], xs[0].kind()).unwrap()
                } else {
                    // The composite formula in the inputs' precision (`project` returns fp32).
                    let r = xs[0].norm_scalaropt_dim(2.0, [-1i64], true) / 40f64.sqrt();
                    xs[0].matmul(&xs[1]) / r
                };
                (&q * &g).sum(kind).backward();
                std::iter::once(q.detach()).chain(xs.iter().map(|x| x.grad())).collect()
            };
            let (fused, reference) = (run(true), run(false));
            for (i, (a, b)) in fused.iter().zip(&reference).enumerate() {
                assert_eq!(a.size(), b.size(), "output {i}");
                let err = max_diff(a, b) / b.abs().max().double_value(&[]).max(1.0);
                assert!(err < tol, "{kind:?}: output {i} (0 = q, then dv, dφ) off by {err:e}");
            }
        }
    }

    #[test]
    fn sinkhorn_is_doubly_stochastic() {
        // Logits of the size mHC produces (α = 0.01 scales the projection; b = 0): 20 iterations
        // reach fp32 accuracy. (Far larger logits, N(0, 2²), need ~200 iterations for 1e-5 rows.)
        tch::manual_seed(0);
        let m = sinkhorn(&(Tensor::randn([1000, 4, 4], (Kind::Float, tch::Device::Cpu)) * 0.5), 20);
        let rows = (m.sum_dim_intlist(-1, false, Kind::Float) - 1.0).abs().max().double_value(&[]);
        let cols = (m.sum_dim_intlist(-2, false, Kind::Float) - 1.0).abs().max().double_value(&[]);
        assert!(rows < 1e-5 && cols < 1e-5, "rows {rows:e}, cols {cols:e}");
    }

    /// The log-domain iteration in fp64, written out here as the reference of the fused kernel.
    fn sinkhorn_f64(logits: &Tensor, iters: usize) -> Tensor {
        let mut l = logits.shallow_clone();
        for _ in 0..iters {
            l = l.log_softmax(-1, Kind::Double).log_softmax(-2, Kind::Double);
        }
        l.exp()
    }

    /// Value and gradient of `<sinkhorn(L), G>` with respect to `L`.
    fn value_and_grad(f: impl Fn(&Tensor) -> Tensor, logits: &Tensor, g: &Tensor) -> (Tensor, Tensor) {
        let l = logits.detach().set_requires_grad(true);
        let p = f(&l);
        (&p * g).sum(p.kind()).backward();
        (f(&l).detach(), l.grad())
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a.to_kind(Kind::Double) - b.to_kind(Kind::Double)).abs().max().double_value(&[])
    }

    /// The fused kernel (CPU, fp32 and fp64) against the log-domain autograd graph: forward and
    /// the gradient of the logits, with every instruction set the machine has, on token counts
    /// that are not a multiple of the vector width (2, 4 or 8 tokens) or of the generic loops'
    /// block of 16; n = 2, 4 (mHC's default) and 8 run the register-resident loops, n = 3 the
    /// generic ones; 1, 7 and 20 iterations.
    #[test]
    fn the_fused_sinkhorn_matches_the_log_domain_graph() {
        for isa in native::kernel_isas() {
            native::with_kernel_isa(isa, fused_sinkhorn_matches_the_log_domain_graph);
        }
    }

    fn fused_sinkhorn_matches_the_log_domain_graph() {
        tch::manual_seed(1);
        for (n, iters, tokens) in [(4, 20, 37), (3, 1, 5), (4, 7, 16), (2, 20, 9), (8, 20, 11), (4, 1, 3)] {
            let logits = Tensor::randn([tokens, n, n], (Kind::Double, tch::Device::Cpu)) * 1.5;
            let g = Tensor::randn([tokens, n, n], (Kind::Double, tch::Device::Cpu));
            assert!(native::sinkhorn_fits(n as usize, iters));
            let (p_ref, g_ref) = value_and_grad(|l| sinkhorn_f64(l, iters), &logits, &g);
            let (p64, g64) = value_and_grad(|l| native::sinkhorn_fused(l, iters).unwrap(), &logits, &g);
            assert_eq!(p64.kind(), Kind::Double);
            let (dp, dg) = (max_diff(&p64, &p_ref), max_diff(&g64, &g_ref));
            let isa = native::kernel_isa().name();
            assert!(dp < 1e-13 && dg < 1e-12, "{isa} fp64 n={n} iters={iters}: value {dp:e}, grad {dg:e}");
            let (l32, g32) = (logits.to_kind(Kind::Float), g.to_kind(Kind::Float));
            let (p_f, g_f) = value_and_grad(|l| sinkhorn(l, iters), &l32, &g32);
            let (p_c, g_c) = value_and_grad(|l| native::sinkhorn_composite(l, iters), &l32, &g32);
            for (what, fused, comp) in [("value", &p_f, &p_c), ("grad", &g_f, &g_c)] {
                let (to_ref, comp_to_ref) = (
                    max_diff(fused, if what == "value" { &p_ref } else { &g_ref }),
                    max_diff(comp, if what == "value" { &p_ref } else { &g_ref }),
                );
                assert!(
                    to_ref < 2e-5,
                    "{isa} fp32 n={n} iters={iters} {what}: fused {to_ref:e} from fp64 (composite {comp_to_ref:e})"
                );
            }
        }
    }

    /// One arithmetic (`native/src/sinkhorn.cu`): the fused CPU loops — the register-resident ones
    /// (n = 2, 4, 8) and the block loops (any other n) — and the CUDA kernels' host build give the
    /// same bits, value and gradient, fp32 and fp64, for every n the kernels take, on token counts
    /// that leave partial vectors and blocks. Exact in the baseline build, where neither side can
    /// fuse a multiply-add. The wider instruction sets contract the backward's dot products
    /// ⟨g, y⟩ into FMAs: the same value, and a gradient that differs by at most one rounding of
    /// each of a line's n products per normalisation, 2·iters·n·u·max|g| in all (u the unit
    /// roundoff; the walk back does not amplify it, its steps scale by line sums of a
    /// doubly-stochastic matrix).
    #[test]
    fn the_cpu_loops_and_the_cuda_kernels_run_one_sinkhorn() {
        tch::manual_seed(3);
        for isa in native::kernel_isas() {
            for n in 1..=native::CUDA_KERNELS_MAX_STREAMS as i64 {
                for (iters, tokens) in [(20, 37), (3, 5)] {
                    for (kind, u) in [(Kind::Float, f64::from(f32::EPSILON) / 2.0), (Kind::Double, f64::EPSILON / 2.0)]
                    {
                        let logits =
                            (Tensor::randn([tokens, n, n], (Kind::Double, tch::Device::Cpu)) * 1.5).to_kind(kind);
                        let g = Tensor::randn([tokens, n, n], (Kind::Double, tch::Device::Cpu)).to_kind(kind);
                        let (p_cpu, g_cpu) = native::with_kernel_isa(isa, || {
                            value_and_grad(|l| native::sinkhorn_fused(l, iters).unwrap(), &logits, &g)
                        });
                        let (p_k, g_k) = native::sinkhorn_cuda_host(&logits, Some(&g), iters).unwrap();
                        let (dp, dg) = (max_diff(&p_cpu, &p_k), max_diff(&g_cpu, &g_k.unwrap()));
                        let what = format!("{} n={n} iters={iters} {kind:?}", isa.name());
                        assert_eq!(dp, 0.0, "{what}: the values differ by {dp:e}");
                        let fma_bound = (2 * iters) as f64 * n as f64 * u * max_diff(&g, &g.zeros_like());
                        let bound = if isa == native::KernelIsa::Baseline { 0.0 } else { fma_bound };
                        assert!(dg <= bound, "{what}: the gradients differ by {dg:e} (allowed {bound:e})");
                    }
                }
            }
        }
    }

    /// No tokens (an empty batch slice): both loops return empty values and gradients.
    #[test]
    fn the_fused_sinkhorn_takes_zero_tokens() {
        for isa in native::kernel_isas() {
            for n in [4, 3] {
                let logits = Tensor::zeros([0, n, n], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
                let p = native::with_kernel_isa(isa, || native::sinkhorn_fused(&logits, 20).unwrap());
                assert_eq!(p.size(), [0, n, n]);
                p.sum(Kind::Float).backward();
                assert_eq!(logits.grad().size(), [0, n, n], "{} n = {n}", isa.name());
            }
        }
    }

    /// Logits far below their row's maximum underflow in `exp`: the fused kernel keeps such lines
    /// at 0 rather than dividing 0 by 0, and its gradient stays finite.
    #[test]
    fn the_fused_sinkhorn_stays_finite_on_extreme_logits() {
        let logits = Tensor::from_slice(&[0.0f32, -200.0, 0.0, -300.0]).view([1, 2, 2]).set_requires_grad(true);
        let p = native::sinkhorn_fused(&logits, 20).unwrap();
        p.sum(Kind::Float).backward();
        let (pv, gv) = (crate::host::values(&p), crate::host::values(&logits.grad()));
        assert!(pv.iter().chain(&gv).all(|v| v.is_finite()), "P {pv:?}, dL {gv:?}");
        assert_eq!(pv, vec![0.5, 0.0, 0.5, 0.0], "column 1 underflowed entirely and stays 0");
    }

    /// The CUDA kernels' arithmetic (`native/src/sinkhorn.cu`, its per-token functions run on the
    /// CPU) against the log-domain graph in fp64: every n the kernels take, 1, 7 and 20 iterations,
    /// value and gradient, in fp64 (where only the order of operations differs) and in fp32 (the
    /// kernels' precision on the GPU). The backward walks back from the final matrix by the saved
    /// line sums rather than keeping every iterate, which this checks to fp64 rounding.
    #[test]
    fn the_cuda_sinkhorn_arithmetic_matches_the_log_domain_graph() {
        tch::manual_seed(2);
        for n in 1..=native::CUDA_KERNELS_MAX_STREAMS as i64 {
            for (iters, tokens) in [(20, 37), (7, 5), (1, 3)] {
                let logits = Tensor::randn([tokens, n, n], (Kind::Double, tch::Device::Cpu)) * 1.5;
                let g = Tensor::randn([tokens, n, n], (Kind::Double, tch::Device::Cpu));
                let (p_ref, g_ref) = value_and_grad(|l| sinkhorn_f64(l, iters), &logits, &g);
                let (p64, g64) = native::sinkhorn_cuda_host(&logits, Some(&g), iters).unwrap();
                let (dp, dg) = (max_diff(&p64, &p_ref), max_diff(&g64.unwrap(), &g_ref));
                assert!(dp < 1e-13 && dg < 1e-11, "fp64 n={n} iters={iters}: value {dp:e}, grad {dg:e}");
                let (p32, g32) =
                    native::sinkhorn_cuda_host(&logits.to_kind(Kind::Float), Some(&g.to_kind(Kind::Float)), iters)
                        .unwrap();
                let (dp, dg) = (max_diff(&p32, &p_ref), max_diff(&g32.unwrap(), &g_ref));
                assert!(dp < 2e-5 && dg < 2e-5, "fp32 n={n} iters={iters}: value {dp:e}, grad {dg:e}");
            }
        }
        let empty = Tensor::zeros([0, 4, 4], (Kind::Float, tch::Device::Cpu));
        let (p, gl) = native::sinkhorn_cuda_host(&empty, Some(&empty), 20).unwrap();
        assert_eq!((p.size(), gl.unwrap().size()), (vec![0, 4, 4], vec![0, 4, 4]));
        assert!(native::sinkhorn_cuda_host(&Tensor::zeros([2, 9, 9], (Kind::Float, tch::Device::Cpu)), None, 20)
            .is_err_and(|e| e.to_string().contains("1 ≤ n ≤ 8")));
    }

    /// Saturated logits — a column whose every entry is ~200 below its row's maximum, so that it
    /// underflows to 0 after the first row normalisation, and a row of equal logits beside rows with
    /// one dominant entry — give the same matrix and the same gradient from the composite graph,
    /// the fused CPU kernel and the CUDA kernels' arithmetic (n = 2, 3, 4).
    #[test]
    fn the_composite_and_the_kernels_agree_on_saturated_logits() {
        for n in [2i64, 3, 4] {
            let mut v = vec![0.0f32; (2 * n * n) as usize];
            for t in 0..2 {
                for i in 0..n {
                    for j in 0..n {
                        let k = (t * n * n + i * n + j) as usize;
                        v[k] = if j == n - 1 {
                            -200.0 - i as f32
                        } else if t == 1 && i == 0 {
                            0.0
                        } else {
                            (i * j) as f32 * 0.3
                        };
                    }
                }
            }
            let logits = Tensor::from_slice(&v).view([2, n, n]);
            let g = (Tensor::arange(2 * n * n, (Kind::Float, tch::Device::Cpu)) * 0.37).sin().view([2, n, n]);
            let (p_c, g_c) = value_and_grad(|l| native::sinkhorn_composite(l, 20), &logits, &g);
            let (p_f, g_f) = value_and_grad(|l| native::sinkhorn_fused(l, 20).unwrap(), &logits, &g);
            let (p_k, g_k) = native::sinkhorn_cuda_host(&logits, Some(&g), 20).unwrap();
            let g_k = g_k.unwrap();
            let last_col = p_c.narrow(2, n - 1, 1);
            assert_eq!(max_diff(&last_col, &last_col.zeros_like()), 0.0, "n = {n}: the underflowed column stays 0");
            assert!([&p_c, &g_c].iter().all(|t| crate::host::all_finite(t)), "n = {n}");
            for (what, a, b) in [
                ("fused value", &p_f, &p_c),
                ("fused grad", &g_f, &g_c),
                ("cuda value", &p_k, &p_c),
                ("cuda grad", &g_k, &g_c),
            ] {
                let err = max_diff(a, b);
                assert!(err < 1e-5, "n = {n}: {what} differs from the composite by {err:e}");
            }
        }
    }

    /// As the CPU kernel: an underflowed line stays 0 and the gradient stays finite.
    #[test]
    fn the_cuda_sinkhorn_arithmetic_stays_finite_on_extreme_logits() {
        let logits = Tensor::from_slice(&[0.0f32, -200.0, 0.0, -300.0]).view([1, 2, 2]);
        let (p, gl) = native::sinkhorn_cuda_host(&logits, Some(&logits.ones_like()), 20).unwrap();
        let (pv, gv) = (crate::host::values(&p), crate::host::values(&gl.unwrap()));
        assert!(gv.iter().all(|v| v.is_finite()), "dL {gv:?}");
        assert_eq!(pv, vec![0.5, 0.0, 0.5, 0.0], "column 1 underflowed entirely and stays 0");
    }
}
