//! Helpers shared by topologies: connectivity by probing, parameters, option parsing.

use super::{Granularity, Norm, StackInfo, Unit};
use crate::config::OptionError;
use crate::native::{self, choice::stream_read, choice::stream_write, kernels::StreamGrad};
use std::cell::{Cell, RefCell};
use tch::{nn, Device, Kind, Tensor};

/// A stand-in unit for tracing connectivity: it records the input it is given (a vector of
/// coefficients over `h_0 … h_L`) and returns the basis vector `e_k` as its output `h_k`.
struct Probe {
    k: i64,
    seen: RefCell<Option<Tensor>>,
}

impl Unit for Probe {
    fn forward(&self, x: &Tensor, _norm: Norm, _train: bool) -> Tensor {
        *self.seen.borrow_mut() = Some(x.detach().copy());
        let e = Tensor::zeros_like(x);
        let _ = e.narrow(-1, self.k, 1).fill_(1.0);
        e
    }
}

/// Effective connectivity of a topology whose mixing is linear in the streams with weights that
/// do not depend on the streams' values (plain, residual, shortcuts, ACN, H-ACN, ANCRe, DWA,
/// LayerComb, ReZero, …): run it with `x0 = e_0` and units returning `e_k`, in the
/// `(L+1)`-dimensional space of coefficients over `h_0 … h_L`. The input recorded by unit k is
/// column k of C; the readout representation is column L+1. Exact, and shares the topology's own
/// forward code, so C cannot drift from what the model computes.
///
/// The probe runs on `device`, the device of the topology's parameters (they multiply the probe's
/// coefficients), and C is assembled there; only the finished matrix is copied to the CPU.
///
/// `run(x0, units) -> y`. Returns `[(L+2), (L+2)]` f64 on the CPU.
pub fn probe_connectivity(run: impl Fn(&Tensor, &[&dyn Unit]) -> Tensor, depth: usize, device: Device) -> Tensor {
    let n = depth as i64 + 1;
    let probes: Vec<Probe> = (1..=depth as i64).map(|k| Probe { k, seen: RefCell::new(None) }).collect();
    let units: Vec<&dyn Unit> = probes.iter().map(|p| p as &dyn Unit).collect();
    let x0 = Tensor::zeros([1, n], (Kind::Double, device));
    let _ = x0.narrow(-1, 0, 1).fill_(1.0);
    let y = tch::no_grad(|| run(&x0, &units));
    let c = Tensor::zeros([n + 1, n + 1], (Kind::Double, device));
    for (k, p) in probes.iter().enumerate() {
        let col = p.seen.borrow().as_ref().expect("every unit is called once").to_kind(Kind::Double).view([n]);
        c.narrow(1, k as i64 + 1, 1).narrow(0, 0, n).copy_(&col.view([n, 1]));
    }
    c.narrow(1, n, 1).narrow(0, 0, n).copy_(&y.to_kind(Kind::Double).view([n, 1]));
    crate::host::to_cpu(&c)
}

thread_local! {
    static PAIRED_TRACE: Cell<bool> = const { Cell::new(false) };
}

/// Whether a paired trace is running (`compose`'s C, docs/topologies.md "compose"): every state
/// tensor a topology sees has a leading axis of 2, `[values, coefficients]`, the second the
/// coefficients of the same state over `h_0 … h_L` (a chunk of them, in the feature channels). A
/// topology whose mixing weights depend on the states' values (AttnRes) computes them from
/// index 0 only and applies them to both, so that the coefficients go through the mixing the
/// values went through; scalar-weight topologies need do nothing.
pub fn paired_trace() -> bool {
    PAIRED_TRACE.with(Cell::get)
}

/// Runs `f` as a paired trace (see [`paired_trace`]), restoring the previous setting after.
pub fn with_paired_trace<T>(f: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            PAIRED_TRACE.with(|p| p.set(self.0));
        }
    }
    let _restore = Restore(PAIRED_TRACE.with(|p| p.replace(true)));
    f()
}

/// Builds C from per-target coefficient columns: `cols[k-1]` = coefficients over `h_0…h_{k-1}`
/// (length ≥ k) of the input of node k, for k = 1..=L+1. Returns `[(L+2), (L+2)]` f64.
pub fn connectivity_from_columns(cols: &[Vec<f64>]) -> Tensor {
    let size = cols.len() + 1;
    let mut c = vec![0.0f64; size * size];
    for (k1, col) in cols.iter().enumerate() {
        for (i, v) in col.iter().enumerate().take(k1 + 1) {
            c[i * size + k1 + 1] = *v;
        }
    }
    Tensor::from_slice(&c).view([size as i64, size as i64])
}

/// A 2-D tensor as an f64 matrix on the host (one counted read, see [`crate::host`]).
pub fn to_matrix(t: &Tensor) -> ndarray::Array2<f64> {
    crate::host::matrix(t)
}

/// `t` `[.., K]` averaged over every leading axis (batch, tokens, streams): `[K]` f64 on the host
/// (one counted read). What input-dependent topologies' traced C columns are.
pub fn mean_over_leading(t: &Tensor) -> Vec<f64> {
    let k = *t.size().last().expect("a last axis");
    to_vec(&t.reshape([-1, k]).mean_dim(0, false, Kind::Double))
}

/// A tensor's values as f64 (one counted read, see [`crate::host`]).
pub fn to_vec(t: &Tensor) -> Vec<f64> {
    crate::host::values(t)
}

/// A parameter of `shape` filled with `init`; frozen (registered, no gradient) if not learnable.
pub fn param(vs: &nn::Path, name: &str, shape: &[i64], init: f64, learnable: bool) -> Tensor {
    if learnable {
        vs.var(name, shape, nn::Init::Const(init))
    } else {
        let t = vs.zeros_no_train(name, shape);
        tch::no_grad(|| t.shallow_clone().fill_(init))
    }
}

/// A parameter initialised from a given tensor (copied).
pub fn param_from(vs: &nn::Path, name: &str, value: &Tensor, learnable: bool) -> Tensor {
    let t = vs.var_copy(name, value);
    if learnable {
        t
    } else {
        t.set_requires_grad(false)
    }
}

/// The topology's granularity (`granularity:` option or the topology's default) and the number
/// of units it gives.
pub fn granularity(
    opt: Option<Granularity>,
    default: Granularity,
    stack: StackInfo,
) -> Result<(Granularity, usize), OptionError> {
    let g = opt.unwrap_or(default);
    let depth = stack.depth(g);
    if depth == 0 {
        return Err(OptionError::new(
            "granularity",
            format!("{g:?}").to_lowercase(),
            "a granularity with at least one unit",
        ));
    }
    Ok((g, depth))
}

/// Parses a shortcut written `i:j` (identity from the output of node i added to the output of
/// node j), checking `0 ≤ i < j ≤ L`.
pub fn parse_edge(s: &str, depth: usize) -> Result<(usize, usize), String> {
    let allowed = format!("an edge `i:j` with integers 0 ≤ i < j ≤ {depth} (the depth)");
    let (a, b) = s.split_once(':').ok_or_else(|| allowed.clone())?;
    let i: usize = a.trim().parse().map_err(|_| allowed.clone())?;
    let j: usize = b.trim().parse().map_err(|_| allowed.clone())?;
    if i < j && j <= depth {
        Ok((i, j))
    } else {
        Err(allowed)
    }
}

/// `a @ b` computed in `compute` (bf16 under `precision: bf16`, as every `Linear` of the backbones),
/// returned in fp32 (fp64 where `compute` is fp64, as the reductions' tests run):
/// `a` `[.., m, k]`, `b` `[k, n]` → `[.., m, n]`.
pub fn matmul(a: &Tensor, b: &Tensor, compute: Kind) -> Tensor {
    a.to_kind(compute).matmul(&b.to_kind(compute)).to_kind(stream_kind(compute))
}

/// The dtype the stream arithmetic runs in for a tensor of `kind`: fp32, or fp64 for fp64 (the
/// reductions' tests run whole topologies in fp64; no run of a model does).
pub fn stream_kind(kind: Kind) -> Kind {
    if kind == Kind::Double {
        Kind::Double
    } else {
        Kind::Float
    }
}

/// `t` in [`stream_kind`]: a bf16 tensor cast to fp32, an fp32 or fp64 one as it is.
pub fn in_stream_kind(t: &Tensor) -> Tensor {
    t.to_kind(stream_kind(t.kind()))
}

/// The spec of a topology with no options but `granularity` and no parameters (plain, residual,
/// ACN): one generic spec instead of a copy per topology.
#[derive(Debug)]
pub struct ParameterlessSpec {
    pub kind: &'static str,
    /// The layout's name in tables and legends.
    pub label: &'static str,
    pub granularity: Granularity,
    pub build: fn() -> Box<dyn super::Topology>,
}

impl super::TopologySpec for ParameterlessSpec {
    fn kind(&self) -> &'static str {
        self.kind
    }
    fn label(&self) -> String {
        self.label.into()
    }
    fn granularity(&self) -> Granularity {
        self.granularity
    }
    fn build(&self, _vs: &nn::Path, _compute: Kind) -> Box<dyn super::Topology> {
        (self.build)()
    }
}

/// Parses the options of a parameterless topology: `granularity` (default sublayer), nothing else.
pub fn parse_parameterless(
    opts: &serde_yaml::Mapping,
    stack: StackInfo,
    kind: &'static str,
    label: &'static str,
    build: fn() -> Box<dyn super::Topology>,
) -> Result<Box<dyn super::TopologySpec>, OptionError> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Options {
        granularity: Option<Granularity>,
    }
    let o: Options = crate::config::parse_options(opts)?;
    let (granularity, _) = granularity(o.granularity, Granularity::Sublayer, stack)?;
    Ok(Box::new(ParameterlessSpec { kind, label, granularity, build }))
}

/// Depth-adaptive LayerNorm (H-ACN App. D, eq. 7), of H-ACN and ACN: unit l's pre-norm scaled by
/// `α_l = 1 + l·s_l`, with one learnable strength `s_l` per unit (`topology.norm_strength`
/// `[L]`, initialised at 0.05). Learning `s_l`, not `α_l`: under AdamW, whose steps are about the
/// same size for every parameter, `α_l` then moves l times as fast as `s_l`, as in the paper.
pub struct DepthLn {
    strength: Tensor,
    /// `[1, 2, …, L]`.
    depth: Tensor,
}

impl DepthLn {
    /// The strengths of `depth` units under `vs` (`norm_strength`).
    pub fn new(vs: &nn::Path, depth: usize) -> Self {
        let opts = (Kind::Float, vs.device());
        let strength = param_from(vs, "norm_strength", &Tensor::full([depth as i64], 0.05, opts), true);
        DepthLn { strength, depth: Tensor::arange_start(1, depth as i64 + 1, opts) }
    }

    /// The pre-norm scales `α_l = 1 + l·s_l`, one 0-dim tensor per unit.
    pub fn scales(&self) -> Vec<Tensor> {
        (&self.depth * &self.strength + 1.0).unbind(0)
    }
}

/// Sum of a list of same-shape tensors.
pub fn sum(ts: &[Tensor]) -> Tensor {
    ts.iter().skip(1).fold(ts[0].shallow_clone(), |a, b| a + b)
}

/// `Σ_i w[i] · xs[i]` for same-shape states `xs` and a weight vector `w` `[k]` (k = xs.len() ≥ 1):
/// one `mul` then one `addcmul` per further state — k kernels forward, each reading its state once
/// and writing no temporary, instead of a `mul` (an `[..]`-sized temporary) and an `add` per state;
/// `w` is split once by `unbind` (one autograd node) rather than k `select`s.
///
/// The dense topologies sum through [`History`], which runs this only under
/// `PLEXUS_FUSED_KERNELS=0` (and its test takes it as the reference): a stacked history
/// (`w @ stack(xs)`) would copy O(L²) states, and a preallocated one written slot by slot is an
/// in-place write into a tensor that earlier products saved for backward, which autograd's version
/// check rejects — `History` keeps its buffer out of autograd's sight in C++ autograd functions.
pub fn weighted_sum(xs: &[&Tensor], w: &Tensor) -> Tensor {
    let w = w.unbind(0);
    let mut acc = xs[0] * &w[0];
    for (x, wi) in xs.iter().zip(&w).skip(1) {
        acc = acc.addcmul(x, wi);
    }
    acc
}

/// The states of a dense topology (ANCRe, DenseFormer, LayerComb), same-shape tensors `[..]`, and
/// weighted sums over them.
///
/// With the fused kernels on (the default, any device), the states are also copied into one
/// `[capacity, numel]` buffer as they are pushed, and a sum over k of them is one matrix-vector
/// product forward and two kernels backward ([`native::kernels::history_mix`]) instead of k and about 3k
/// ([`weighted_sum`]); each state's gradient is gathered in a buffer row instead of being added up
/// from every later sum that read it, which was O(L²) kernels per step. Under
/// `PLEXUS_FUSED_KERNELS=0`, [`weighted_sum`] over the states.
pub struct History {
    /// `(buf [capacity, numel], gbuf)`, see `native/src/history.cpp`.
    buffers: Option<(Tensor, Tensor)>,
    states: Vec<Tensor>,
}

impl History {
    /// A history of at most `capacity` states shaped like `like`.
    pub fn new(capacity: usize, like: &Tensor) -> History {
        let buffers = native::setting::fused_kernels_on().then(|| {
            let opts = (like.kind(), like.device());
            (Tensor::empty([capacity as i64, like.numel() as i64], opts), Tensor::empty([0], opts))
        });
        History { buffers, states: Vec::with_capacity(capacity) }
    }

    /// Appends `x` as the next state and returns it: the tensor to use downstream in place of `x`
    /// (with the buffer, an autograd pass-through that receives the sums' gradients).
    pub fn push(&mut self, x: Tensor) -> &Tensor {
        let x = match &self.buffers {
            Some((buf, gbuf)) => native::kernels::history_push(buf, gbuf, self.states.len(), &x)
                .unwrap_or_else(|e| panic!("history push: {e:#}")),
            None => x,
        };
        self.states.push(x);
        self.states.last().expect("just pushed")
    }

    /// State `i` (0-based, in push order).
    pub fn state(&self, i: usize) -> &Tensor {
        &self.states[i]
    }

    /// The number of states pushed so far.
    pub fn len(&self) -> usize {
        self.states.len()
    }

    /// Whether no state was pushed yet.
    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
    }

    /// `Σ_i w[i] · state slots[i]` for weights `w` `[k]` (the states' dtype), `slots` ascending.
    pub fn mix(&self, slots: &[usize], w: &Tensor) -> Tensor {
        let xs: Vec<&Tensor> = slots.iter().map(|&s| &self.states[s]).collect();
        match &self.buffers {
            Some((buf, gbuf)) => {
                native::kernels::history_mix(buf, gbuf, slots, &xs, w).unwrap_or_else(|e| panic!("history sum: {e:#}"))
            }
            None => weighted_sum(&xs, w),
        }
    }

    /// Attention Residuals' depth attention over the states at `slots` with the query `q` `[D]`
    /// through plexus' kernels ([`native::choice::history_attend_fused`]): `Some((y [.., D], α [.., k]))`
    /// where a fused kernel takes it (the GPU's, or the CPU row loops for fp32/fp64); `None`
    /// otherwise (no buffer, another device or dtype, or too many slots), and the caller runs its
    /// composite.
    pub fn attend(&self, slots: &[usize], q: &Tensor) -> Option<(Tensor, Tensor)> {
        let (buf, gbuf) = self.buffers.as_ref()?;
        let xs: Vec<&Tensor> = slots.iter().map(|&s| &self.states[s]).collect();
        native::choice::history_attend_fused(buf, gbuf, slots, &xs, q)
    }

    /// [`History::mix`] over the first `k` states.
    pub fn mix_first(&self, k: usize, w: &Tensor) -> Tensor {
        let slots: Vec<usize> = (0..k).collect();
        self.mix(&slots, w)
    }
}

/// FLOPs per token of the stream read `u = Σ_s pre[s] H[s]` and write
/// `H' = resᵀ H + post ⊗ o` for `n` streams of width `d`, forward and backward: `(n² + 2n)·d`
/// multiply-adds forward, twice as many backward (each product's two input gradients), 2 FLOPs
/// each.
pub fn stream_read_write_flops(n: usize, d: usize) -> u64 {
    6 * (n * n + 2 * n) as u64 * d as u64
}

/// The per-unit mixing of a multi-stream topology (Hyper-Connections, mHC) with `n` streams
/// `H: [.., n, D]`: unit k reads `u = Σ_s pre[s] H_s`, and the streams become
/// `H'_t = Σ_s res[s, t] H_s + post[t] · f_k(u)`.
pub trait StreamMixing {
    fn streams(&self) -> usize;
    /// The name of the stream-mixing view ([`StreamTrace::res`]): `A_res` (HC), `H_res` (mHC).
    fn view_name(&self) -> &'static str;
    /// For unit `k` (0-based) and streams `h` `[.., n, D]`: `(pre [.., n], res [.., n, n], post [.., n])`
    /// (leading dims may be absent for static mixing). `grad`: h's gradient cell
    /// ([`native::choice::gather_stream_grads`]), for a fused kernel that reads h (or none).
    fn mixing(&self, k: usize, h: &Tensor, grad: Option<&StreamGrad>) -> (Tensor, Tensor, Tensor);
    /// Unit `k`'s input and its write weights at once: `(u [.., D], res, post)` with
    /// `u = Σ_s pre[s] H_s`. The default runs [`mixing`](Self::mixing) then [`stream_read`]; a
    /// topology with a kernel that does both in one pass overrides it.
    fn read_and_mixing(&self, k: usize, h: &Tensor, grad: Option<&StreamGrad>) -> (Tensor, Tensor, Tensor) {
        mixing_then_read(self, k, h, grad)
    }
}

/// [`StreamMixing::read_and_mixing`] in two steps, [`mixing`](StreamMixing::mixing) then
/// [`stream_read`]: the default, and the fallback of an override whose kernel does not apply.
pub fn mixing_then_read(
    mix: &(impl StreamMixing + ?Sized),
    k: usize,
    h: &Tensor,
    grad: Option<&StreamGrad>,
) -> (Tensor, Tensor, Tensor) {
    let (pre, res, post) = mix.mixing(k, h, grad);
    (stream_read(h, &pre, grad), res, post)
}

/// Runs a multi-stream topology: `H_0` = n copies of `x0`, `y` = mean over streams. With
/// `trace`, also returns C by carrying, next to `H`, the coefficients of every stream over
/// `h_0 … h_L` (`[.., n, L+1]`) and averaging each unit's input coefficients over the batch.
pub fn multi_stream(
    mix: &dyn StreamMixing,
    x0: &Tensor,
    units: &[&dyn Unit],
    train: bool,
    trace: bool,
) -> (Tensor, Option<StreamTrace>) {
    let n = mix.streams() as i64;
    let l = units.len() as i64;
    // Each state's readers send their gradients into one tensor where the fused kernels run
    // (`grad`, see native::choice::gather_stream_grads), instead of autograd adding three per unit.
    let (mut h, mut grad) =
        native::choice::gather_stream_grads(x0.unsqueeze(-2).repeat_interleave_self_int(n, Some(-2), None));
    let lead: Vec<i64> = x0.size()[..x0.dim() - 1].to_vec();
    let mut coef = trace.then(|| {
        let mut shape = lead.clone();
        shape.extend([n, l + 1]);
        let c = Tensor::zeros(shape.as_slice(), (Kind::Double, x0.device()));
        let _ = c.narrow(-1, 0, 1).fill_(1.0);
        c
    });
    let mut cols: Vec<Vec<f64>> = Vec::new();
    let mut res_means: Vec<Tensor> = Vec::new();
    let mean_over_lead = |t: &Tensor| -> Vec<f64> {
        let flat = t.reshape([-1, l + 1]);
        to_vec(&flat.mean_dim(0, false, Kind::Double))
    };
    for (k, f) in units.iter().enumerate() {
        // Tracing needs `pre` itself; a run that does not takes the fused read where there is one.
        let (u, pre, res, post) = if coef.is_some() {
            let (pre, res, post) = mix.mixing(k, &h, grad.as_ref());
            (stream_read(&h, &pre, grad.as_ref()), Some(pre), res, post)
        } else {
            let (u, res, post) = mix.read_and_mixing(k, &h, grad.as_ref());
            (u, None, res, post)
        };
        let o = f.forward(&u, Norm::Default, train);
        (h, grad) = native::choice::gather_stream_grads(stream_write(&h, &res, &post, &o, grad.as_ref()));
        if let (Some(c), Some(pre)) = (coef.as_mut(), pre) {
            let (pre, res, post) = (pre.to_kind(Kind::Double), res.to_kind(Kind::Double), post.to_kind(Kind::Double));
            res_means.push(crate::host::to_cpu(&res.reshape([-1, n, n]).mean_dim(0, false, Kind::Double)));
            cols.push(mean_over_lead(&(pre.unsqueeze(-1) * &*c).sum_dim_intlist(-2, false, Kind::Double)));
            let e = Tensor::zeros([l + 1], (Kind::Double, x0.device()));
            let _ = e.get(k as i64 + 1).fill_(1.0);
            *c = res.transpose(-1, -2).matmul(&*c) + post.unsqueeze(-1) * e;
        }
    }
    let y = h.mean_dim(-2, false, h.kind());
    let trace = coef.map(|c| {
        cols.push(mean_over_lead(&c.mean_dim(-2, false, Kind::Double)));
        StreamTrace { connectivity: connectivity_from_columns(&cols), res: Tensor::cat(&res_means, 0) }
    });
    (y, trace)
}

/// What a traced multi-stream run yields.
pub struct StreamTrace {
    /// Effective C, `[(L+2), (L+2)]`.
    pub connectivity: Tensor,
    /// The stream-mixing matrices averaged over batch and tokens, stacked per unit: `[L·n, n]`
    /// (rows `k·n + s`, column t = weight of stream s in the new stream t after unit k).
    pub res: Tensor,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probing_a_residual_rule_gives_all_ones() {
        let l = 3;
        let c = to_matrix(&probe_connectivity(
            |x0, units| units.iter().fold(x0.shallow_clone(), |x, f| f.forward(&x, Norm::Default, false) + x),
            l,
            Device::Cpu,
        ));
        for ((i, k), v) in c.indexed_iter() {
            assert_eq!(*v, if i < k { 1.0 } else { 0.0 }, "C[{i}][{k}]");
        }
    }

    #[test]
    fn edges_are_checked() {
        assert_eq!(parse_edge("0:2", 3), Ok((0, 2)));
        assert!(parse_edge("0:5", 3).is_err());
        assert!(parse_edge("2:1", 3).is_err());
        assert!(parse_edge("a:b", 3).is_err());
    }

    /// A unit for the multi-stream tests: `tanh(x W)`, W `[D, D]`.
    struct TanhUnit(Tensor);

    impl Unit for TanhUnit {
        fn forward(&self, x: &Tensor, _norm: Norm, _train: bool) -> Tensor {
            x.matmul(&self.0).tanh()
        }
    }

    /// `kind` (hyper or mhc, with `options`) over three tanh units of width 13 at `dtype`, stepped
    /// on a [4, 2, 13] input: the output, then the gradients of the input, of every topology and
    /// unit parameter, from two backward passes through the retained graph. The parameters, the
    /// input and the output's gradient are fixed patterns (not draws from the generator other
    /// tests share), made in fp32 and cast, so that fp32 and fp64 runs start from the same values.
    fn multi_stream_grads(kind: &str, options: &str, dtype: Kind) -> Vec<Tensor> {
        let pattern = |phase: f64, shape: &[i64]| {
            let n: i64 = shape.iter().product();
            (Tensor::arange(n, (Kind::Float, Device::Cpu)) * phase).sin().reshape(shape)
        };
        let d = 13;
        let stack = StackInfo { sublayers: 3, block_size: 1, width: d, pre_norm: true, ports: false };
        let opts: serde_yaml::Mapping = serde_yaml::from_str(options).unwrap();
        let mut vs = nn::VarStore::new(Device::Cpu);
        // Products in fp32 (fp64 states still take the fused CPU kernels in fp64).
        let topology = crate::topology::parse(kind, &opts, stack).unwrap().build(&vs.root(), Kind::Float);
        let units: Vec<TanhUnit> =
            (0..3).map(|i| TanhUnit(vs.root().zeros(&format!("unit{i}"), &[d as i64, d as i64]))).collect();
        // By name: the store's own order is a hash map's.
        let named: Vec<(String, Tensor)> = {
            let mut v: Vec<(String, Tensor)> = vs.variables().into_iter().filter(|(_, t)| t.requires_grad()).collect();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v
        };
        // Every parameter away from its init, so that every mixing weight and its gradient matters.
        tch::no_grad(|| {
            for (i, (_, v)) in named.iter().enumerate() {
                v.shallow_clone().copy_(&(pattern(0.37 + 0.11 * i as f64, &v.size()) * 0.4));
            }
        });
        let x0 = pattern(0.71, &[4, 2, d as i64]);
        let g = pattern(1.13, &[4, 2, d as i64]).to_kind(dtype);
        if dtype == Kind::Double {
            vs.double();
        }
        let x0 = x0.to_kind(dtype).set_requires_grad(true);
        let refs: Vec<&dyn Unit> = units.iter().map(|u| u as &dyn Unit).collect();
        let y = topology.forward(&x0, &refs, true);
        let loss = (&y * &g).sum(dtype);
        let inputs: Vec<&Tensor> = std::iter::once(&x0).chain(named.iter().map(|(_, t)| t)).collect();
        let mut out = vec![y.detach()];
        for _ in 0..2 {
            out.extend(Tensor::run_backward(&[&loss], &inputs, true, false));
        }
        out
    }

    /// One gradient per stream state (`native::choice::gather_stream_grads`, `native/src/stream_grad.h`):
    /// the write's backward writes it, the read's (and on the GPU's paths the dynamic logits')
    /// add theirs in the same pass, and the rest (HC's fused pre step, mHC's RMS projection, the
    /// final mean) reach it through autograd; against autograd adding every reader's gradient, the
    /// output and every gradient, twice through a retained graph (the second must not see the
    /// first's sums). Bit for bit in the baseline instruction set and on the GPU's paths (the same
    /// sums in the same order, none contracted into a fused multiply-add). Where a wide
    /// instruction set contracts the read's product into the sum, one rounding per element
    /// differs, which the backward carries on through the earlier units (and a scalar gradient
    /// summed over tokens, such as mHC's α_res, may cancel far below its terms): there, within 4×
    /// the distance of autograd's sums in the same instruction set from the baseline fp64 run,
    /// plus 4 units of the dtype of the run's largest value. Hyper-Connections static and dynamic, mHC; n = 4 (register
    /// loops) and 3 (generic); fp32 and fp64.
    #[test]
    fn gathered_stream_gradients_equal_autograds_sums() {
        let cases = [
            ("hyper", "{n: 4, dynamic: false}"),
            ("hyper", "{n: 3, dynamic: true}"),
            ("hyper", "{n: 4, dynamic: true}"),
            ("mhc", "{n: 4, sinkhorn_iters: 5}"),
            ("mhc", "{n: 3, sinkhorn_iters: 5}"),
        ];
        let mut settings: Vec<(String, bool, native::setting::KernelIsa)> =
            native::setting::kernel_isas().into_iter().map(|isa| (isa.name().to_string(), false, isa)).collect();
        settings.push(("the GPU's paths".into(), true, native::setting::KernelIsa::Baseline));
        let max = |t: &Tensor| t.abs().max().to_kind(Kind::Double).double_value(&[]);
        for (kind, options) in cases {
            let truth = native::setting::with_kernel_isa(native::setting::KernelIsa::Baseline, || {
                native::setting::with_stream_grads_gathered(false, || multi_stream_grads(kind, options, Kind::Double))
            });
            let largest = truth.iter().map(max).fold(0.0, f64::max);
            for dtype in [Kind::Float, Kind::Double] {
                for (name, gpu_paths, isa) in &settings {
                    if *gpu_paths && dtype == Kind::Double && options.contains("dynamic: true") {
                        continue; // the GPU's dynamic logits are fp32 (as its streams)
                    }
                    let run = |gathered: bool| {
                        native::setting::with_gpu_paths_on_cpu(*gpu_paths, || {
                            native::setting::with_kernel_isa(*isa, || {
                                native::setting::with_stream_grads_gathered(gathered, || {
                                    multi_stream_grads(kind, options, dtype)
                                })
                            })
                        })
                    };
                    let (one, autograd) = (run(true), run(false));
                    assert_eq!((one.len(), autograd.len()), (truth.len(), truth.len()));
                    for (i, ((a, b), t)) in one.iter().zip(&autograd).zip(&truth).enumerate() {
                        let case = format!("{kind} {options} {dtype:?} {name}: output {i}");
                        if *isa == native::setting::KernelIsa::Baseline {
                            assert!(a.equal(b), "{case}: not the same bits");
                        } else {
                            let err = |x: &Tensor| max(&(x.to_kind(Kind::Double) - t));
                            let unit = if dtype == Kind::Float { f64::from(f32::EPSILON) } else { f64::EPSILON };
                            let floor = 4.0 * unit * largest;
                            assert!(err(a) <= 4.0 * err(b) + floor, "{case}: {:e} against {:e}", err(a), err(b));
                        }
                    }
                }
            }
        }
    }

    /// A small dense graph over a [`History`]: six states, each the tanh of a weighted sum of
    /// earlier ones plus half the newest (a state read directly and through sums), sums over
    /// contiguous (`0..k`), evenly spaced (a strided view of the buffer, as DenseFormer's dilation)
    /// and unevenly spaced slots (the gather path). Returns the output and, from two backward
    /// passes through the retained graph, the gradients of x0 and of every weight vector.
    fn dense_graph(x0: &Tensor, ws: &[Tensor], g: &Tensor) -> Vec<Tensor> {
        let slots: [&[usize]; 5] = [&[0], &[0, 1], &[1, 2], &[0, 1, 3], &[0, 2, 4]];
        let mut h = History::new(6, x0);
        h.push(x0 * 1.0);
        for (k, sl) in slots.iter().enumerate() {
            let next = h.mix(sl, &ws[k]).tanh() + h.state(h.len() - 1) * 0.5;
            h.push(next);
        }
        let y = h.mix(&[1, 3, 5], &ws[5]);
        let loss = (&y * g).sum(Kind::Double) + h.state(5).sum(Kind::Double) * 0.25;
        let inputs: Vec<&Tensor> = std::iter::once(x0).chain(ws).collect();
        let mut out = vec![y.detach()];
        for _ in 0..2 {
            out.extend(Tensor::run_backward(&[&loss], &inputs, true, false));
        }
        out
    }

    /// The history buffer (`native/src/history.cpp`) against per-state sums ([`weighted_sum`],
    /// what `PLEXUS_FUSED_KERNELS=0` runs) in fp64: the output and every gradient, twice through a
    /// retained graph (each state's gradient row is zeroed once taken, so the second pass is not
    /// doubled); and without autograd (no_grad) the same output.
    #[test]
    fn the_history_buffer_matches_per_state_sums() {
        tch::manual_seed(3);
        let opts = (Kind::Double, Device::Cpu);
        let x0 = Tensor::randn([3, 7], opts).set_requires_grad(true);
        let ws: Vec<Tensor> =
            [1, 2, 2, 3, 3, 3].iter().map(|&k| Tensor::randn([k], opts).set_requires_grad(true)).collect();
        let g = Tensor::randn([3, 7], opts);
        let buffered = native::setting::with_fused_kernels(true, || dense_graph(&x0, &ws, &g));
        let per_state = native::setting::with_fused_kernels(false, || dense_graph(&x0, &ws, &g));
        assert_eq!(buffered.len(), 15);
        for (i, (a, b)) in buffered.iter().zip(&per_state).enumerate() {
            assert_eq!(a.size(), b.size(), "output {i}");
            let err = (a - b).abs().max().double_value(&[]);
            assert!(err < 1e-12, "output {i} (0 = y, then x0 and w1…w6, twice) off by {err:e}");
        }
        let y_no_grad = tch::no_grad(|| {
            native::setting::with_fused_kernels(true, || {
                let mut h = History::new(2, &x0);
                h.push(x0.shallow_clone());
                h.push(x0.tanh());
                h.mix(&[0, 1], &ws[1])
            })
        });
        let want = weighted_sum(&[&x0, &x0.tanh()], &ws[1]);
        assert!((y_no_grad - want).abs().max().double_value(&[]) < 1e-12);
    }
}
