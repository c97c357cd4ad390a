//! `compose` (docs/topologies.md, "compose"): its reductions in fp64 — one stream gives each depth
//! rule alone, a residual depth rule gives each width rule alone, both trivial give `residual` —
//! in output, every gradient and C; and the configs it refuses, with their reasons.

use plexus::experiment::Experiment;
use plexus::topology::{Norm, StackInfo, Unit};
use std::collections::BTreeMap;
use tch::{nn, Device, Kind, Tensor};

const MIXER: &str = "model: {kind: mixer, patch: 4, width: 8, token_hidden: 6, channel_hidden: 12, depth: 3}\ndata: {kind: synthetic_images, image_size: 8, channels: 3, classes: 5, samples: 12}\n";

fn exp(backbone: &str, topology: &str) -> Result<Experiment, String> {
    let yaml = format!("name: t\nseed: 3\n{backbone}topology: {topology}\n");
    Experiment::from_str(&yaml, "<test>", &[]).map_err(|e| format!("{e:#}"))
}

/// A unit for the reductions: `tanh(s·x W)`, `W` `[D, D]`, `s` the pre-norm scale a topology
/// passes (H-ACN's Depth-adaptive LN), 1 otherwise. Pure fp64 where its input is.
struct TanhUnit(Tensor);

impl Unit for TanhUnit {
    fn forward(&self, x: &Tensor, norm: Norm, _train: bool) -> Tensor {
        let x = match norm {
            Norm::Scaled(s) => x * s,
            Norm::Default | Norm::Off => x.shallow_clone(),
        };
        x.matmul(&self.0).tanh()
    }
}

/// What a run yields, every tensor fp64: the output, the gradient of the input and of every
/// parameter (by its name with `depth.` / `width.` dropped, so that a composition's parameters
/// meet the part's), C, and the parameter view on the batch.
struct Run {
    y: Tensor,
    grads: BTreeMap<String, Tensor>,
    c: Tensor,
    view: Option<(String, Tensor)>,
}

/// A parameter's name as the part alone names it.
fn part_name(name: &str) -> String {
    name.replace("topology.depth.", "topology.").replace("topology.width.", "topology.")
}

/// A fixed pattern of `shape` keyed by `name`: nothing drawn from a generator other tests share.
fn pattern(name: &str, shape: &[i64]) -> Tensor {
    let phase = 0.3 + (name.bytes().map(u64::from).sum::<u64>() % 97) as f64 * 0.013;
    let n: i64 = shape.iter().product();
    (Tensor::arange(n, (Kind::Double, Device::Cpu)) * phase + phase).sin().reshape(shape)
}

/// `topology` over `depth` tanh units of width `d` in fp64 (parameters, streams, products), on
/// an input `[3, 5, d]`: every parameter set away from its init to a pattern of its part name
/// (scaled by 0.4, units' by 0.6: the two sides of a reduction start from the same values and no
/// mixing weight sits at a special point), then the output, the gradients against a fixed
/// cotangent, C and the parameter view.
fn run_with(topology: &str, depth: usize, d: i64) -> Run {
    run_keeping(topology, depth, d, None)
}

/// [`run_with`], the parameters whose names start with `keep` left at their init.
fn run_keeping(topology: &str, depth: usize, d: i64, keep: Option<&str>) -> Run {
    let opts: serde_yaml::Mapping = serde_yaml::from_str(topology).unwrap();
    let mut opts = opts;
    let kind = opts.remove("kind").and_then(|k| k.as_str().map(String::from)).expect("a kind");
    let stack = StackInfo { sublayers: depth, block_size: 1, width: d as usize, pre_norm: true, ports: false };
    let spec = plexus::topology::parse(&kind, &opts, stack).unwrap_or_else(|e| panic!("{topology}: {e:?}"));
    let mut vs = nn::VarStore::new(Device::Cpu);
    let built = spec.build(&(vs.root() / "topology"), Kind::Double);
    let units: Vec<TanhUnit> = (0..depth).map(|i| TanhUnit(vs.root().zeros(&format!("unit{i}"), &[d, d]))).collect();
    vs.double();
    let mut named: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    tch::no_grad(|| {
        for (name, v) in named.iter().filter(|(name, _)| !keep.is_some_and(|k| name.starts_with(k))) {
            let scale = if name.starts_with("unit") { 0.6 } else { 0.4 };
            v.shallow_clone().copy_(&(pattern(&part_name(name), &v.size()) * scale));
        }
    });
    let refs: Vec<&dyn Unit> = units.iter().map(|u| u as &dyn Unit).collect();
    let x0 = pattern("x0", &[3, 5, d]).set_requires_grad(true);
    let y = built.forward(&x0, &refs, true);
    let g = pattern("g", &y.size());
    let loss =
        (&y * &g).sum(Kind::Double) + built.regularizer().map_or(Tensor::from(0.0f64), |r| r.to_kind(Kind::Double));
    let trainable: Vec<(String, Tensor)> = named.into_iter().filter(|(_, t)| t.requires_grad()).collect();
    let inputs: Vec<&Tensor> = std::iter::once(&x0).chain(trainable.iter().map(|(_, t)| t)).collect();
    let got = Tensor::run_backward(&[&loss], &inputs, false, false);
    let names = std::iter::once("input".to_string()).chain(trainable.iter().map(|(n, _)| part_name(n)));
    let grads = names.zip(got).collect();
    let x0 = x0.detach();
    let c = tch::no_grad(|| built.connectivity(&x0, &refs));
    let view = tch::no_grad(|| built.parameter_view_on(&x0, &refs));
    Run { y: y.detach(), grads, c, view }
}

/// [`run_with`] over 4 units of width 8.
fn run(topology: &str) -> Run {
    run_with(topology, 4, 8)
}

/// e(a, b) = max |a − b| / max(1, max |b|).
fn err(a: &Tensor, b: &Tensor) -> f64 {
    let scale = b.abs().max().double_value(&[]).max(1.0);
    (a - b).abs().max().double_value(&[]) / scale
}

/// Compares two runs: `bits` demands the same bits (output and gradients), else within `tol` of
/// e(·); C within `c_tol` (C is an average over tokens on both sides, summed in other orders).
fn same(case: &str, a: &Run, b: &Run, bits: bool, tol: f64, c_tol: f64) {
    assert_eq!(a.y.size(), b.y.size(), "{case}: output shape");
    let check = |what: &str, x: &Tensor, y: &Tensor| {
        if bits {
            assert!(x.equal(y), "{case}: {what} not the same bits (off by {:e})", err(x, y));
        } else {
            assert!(err(x, y) <= tol, "{case}: {what} off by {:e} > {tol:e}", err(x, y));
        }
    };
    check("output", &a.y, &b.y);
    assert_eq!(a.grads.keys().collect::<Vec<_>>(), b.grads.keys().collect::<Vec<_>>(), "{case}: parameters");
    for (name, g) in &a.grads {
        check(&format!("gradient of {name}"), g, &b.grads[name]);
    }
    assert_eq!(a.c.size(), b.c.size(), "{case}: C's shape");
    assert!(err(&a.c, &b.c) <= c_tol, "{case}: C off by {:e}\n{}\n{}", err(&a.c, &b.c), a.c, b.c);
}

/// The depth rules, each with options that leave no part of it at a trivial setting.
const DEPTH_RULES: &[&str] = &[
    "{kind: residual}",
    "{kind: hacn}",
    "{kind: hacn, depth_ln: true}",
    "{kind: ancre}",
    "{kind: ancre, tsallis: {weight: 0.1, q: 2.0}}",
    "{kind: denseformer}",
    "{kind: denseformer, dilation: 2}",
    "{kind: layercomb}",
    "{kind: attnres}",
    "{kind: attnres, blocks: 2}",
    "{kind: graph, pattern: {window: 2}, weights: learnable}",
    "{kind: graph, pattern: {window: 2}, weights: learnable, normalize: softmax}",
];

/// One stream is the depth rule alone, bit for bit: the width step's increment is
/// `(1 − 1)·H + 1·f(1·H)`, which is `f(H)` exactly, and the depth rule's own code does the rest
/// on `[.., 1, D]` as it does on `[.., D]`. C within 2⁻⁴⁰ (the two sides average per-token
/// weights over tokens in different orders). The view is the depth rule's.
#[test]
fn one_stream_gives_each_depth_rule_alone() {
    for depth in DEPTH_RULES {
        let alone = run(depth);
        for composed in [
            format!("{{kind: compose, depth: {depth}}}"),
            format!("{{kind: compose, depth: {depth}, width: {{kind: single}}}}"),
        ] {
            let got = run(&composed);
            same(&composed, &got, &alone, true, 0.0, 2f64.powi(-40));
            let names = |r: &Run| r.view.as_ref().map(|v| v.0.clone());
            assert_eq!(names(&got), names(&alone), "{composed}: the view");
        }
    }
}

/// The width rules, every init.
const WIDTH_RULES: &[&str] = &[
    "{kind: hyper, n: 3, dynamic: false}",
    "{kind: hyper, n: 4, dynamic: true}",
    "{kind: mhc, n: 4, sinkhorn_iters: 6}",
    "{kind: mhc, n: 3, sinkhorn_iters: 6, init: lucidrains}",
    "{kind: mhc, n: 2, sinkhorn_iters: 6, init: symmetric}",
    "{kind: mhc, n: 4, sinkhorn_iters: 6, res_bias: identity}",
];

/// Bound of a `depth: residual` reduction: the composition adds `H + ((res − I)ᵀH + post ⊗ o)`
/// where the width rule alone computes `resᵀH + post ⊗ o`: each stream element is rounded
/// differently once per unit (≤ 2 units of fp64 roundoff ε of the stream's size). The difference
/// travels to the output and back to every gradient through the units, HC's and mHC's mixing
/// maps and Sinkhorn's iterations, and a scalar's gradient (mHC's `α_res`) sums it over 15 tokens
/// × n² entries that cancel: 2ε per unit × L = 4 units × an amplification of 512 allowed for
/// those sums. (The worst seen here is 52ε, mHC's gradients; a wrong rule is off by 10⁻², 10¹³ε.)
const RESIDUAL_TOL: f64 = 4096.0 * f64::EPSILON;

/// A residual depth rule is the width rule alone: output, gradients, C and the stream-mixing view.
#[test]
fn a_residual_depth_rule_gives_each_width_rule_alone() {
    for width in WIDTH_RULES {
        let alone = run(width);
        let composed = format!("{{kind: compose, width: {width}}}");
        let got = run(&composed);
        same(&composed, &got, &alone, false, RESIDUAL_TOL, RESIDUAL_TOL);
        let (a, b) = (got.view.expect("a view"), alone.view.expect("a view"));
        assert_eq!(a.0, b.0, "{composed}: the view's name");
        assert!(err(&a.1, &b.1) <= RESIDUAL_TOL, "{composed}: the view off by {:e}", err(&a.1, &b.1));
        // Not the same bits: the arithmetic differs, and the bound is not loose by orders of
        // magnitude (the test could not tell a wrong rule from rounding otherwise).
        assert!(err(&got.y, &alone.y) > 0.0, "{composed}: same bits, where one more rounding was expected");
    }
}

/// Both trivial: `compose` with nothing given, and residual over one stream, are `residual`.
#[test]
fn both_trivial_give_residual() {
    let residual = run("{kind: residual}");
    for composed in ["{kind: compose}", "{kind: compose, depth: {kind: residual}, width: {kind: single}}"] {
        same(composed, &run(composed), &residual, true, 0.0, 2f64.powi(-40));
    }
}

/// The width rule's init carries over: under HC's static init (`pre` one-hot, `res = I`,
/// `post = 1`) each increment is `f_k` written to every stream, the streams stay copies, and the
/// composition computes its depth rule alone, to roundings: the same sums over other shapes
/// (AttnRes' softmax over `[.., 4, D]`) and the gradients' sums over the streams in another order.
/// Most depth rules give the same output bits (n = 4: the mean of 4 copies is exact).
#[test]
fn under_hyper_static_init_the_composition_starts_as_its_depth_rule() {
    for depth in DEPTH_RULES {
        let alone = run(depth);
        let composed = format!("{{kind: compose, depth: {depth}, width: {{kind: hyper, n: 4, dynamic: false}}}}");
        let mut got = run_keeping(&composed, 4, 8, Some("topology.width."));
        got.grads.retain(|name, _| !name.contains(".layers."));
        same(&composed, &got, &alone, false, RESIDUAL_TOL, RESIDUAL_TOL);
    }
}

/// A composition is neither part: AttnRes over mHC differs from each alone in output and C, its
/// C is finite, and its view is mHC's stream mixing.
#[test]
fn a_composition_is_neither_of_its_parts() {
    let attnres = run("{kind: attnres}");
    let mhc = run("{kind: mhc, n: 4}");
    let composed = run("{kind: compose, depth: {kind: attnres}, width: {kind: mhc, n: 4}}");
    assert!(err(&composed.y, &attnres.y) > 1e-3 && err(&composed.y, &mhc.y) > 1e-3);
    assert!(err(&composed.c, &attnres.c) > 1e-3 && err(&composed.c, &mhc.c) > 1e-3);
    assert_eq!(composed.c.isfinite().all().int64_value(&[]), 1);
    let view = composed.view.expect("a view");
    assert_eq!((view.0.as_str(), view.1.size()), ("H_res", vec![16, 4]));
}

/// Where D < L + 2 the paired trace carries the coefficients in chunks of D channels, one run
/// each: 12 units of width 8 (14 nodes, two chunks) give the width rule's own C, which it traces
/// in one pass, and AttnRes's own (its weights computed from the values in every chunk).
#[test]
fn the_traced_connectivity_does_not_depend_on_the_chunking() {
    for (alone, composed) in [
        ("{kind: hyper, n: 2}", "{kind: compose, width: {kind: hyper, n: 2}}"),
        ("{kind: attnres}", "{kind: compose, depth: {kind: attnres}}"),
    ] {
        let (a, b) = (run_with(alone, 12, 8), run_with(composed, 12, 8));
        let last = plexus::topology::common::to_matrix(&b.c)[[12, 13]];
        assert!(last.abs() > 1e-3, "{composed}: C[12][13] = {last}, the second chunk's column is empty");
        assert!(err(&b.c, &a.c) <= RESIDUAL_TOL, "{composed}: chunked C off by {:e}", err(&b.c, &a.c));
    }
}

/// What `compose` refuses at config load, each with its reason.
#[test]
fn compositions_that_make_no_sense_are_refused_with_the_reason() {
    let cases = [
        ("{kind: compose, depth: {kind: plain}}", "topology.depth.kind", "carries no stream"),
        ("{kind: compose, depth: {kind: mhc}}", "topology.depth.kind", "width rule"),
        ("{kind: compose, depth: {kind: densenet}}", "topology.depth.kind", "projections"),
        ("{kind: compose, depth: {kind: compose}}", "topology.depth.kind", "composition already"),
        ("{kind: compose, width: {kind: attnres}}", "topology.width.kind", "`single`, `hyper`, `mhc`"),
        ("{kind: compose, width: {kind: single, n: 2}}", "topology.width.n", "one stream"),
        ("{kind: compose, width: {kind: mhc, n: 0}}", "topology.width.n", "1..=64"),
        ("{kind: compose, depth: {kind: attnres, blocks: 99}}", "topology.depth.blocks", "groups"),
        (
            "{kind: compose, depth: {kind: denseformer}, width: {kind: mhc, granularity: sublayer}}",
            "topology.width.granularity",
            "both rules wire the same units",
        ),
        (
            "{kind: compose, granularity: block, depth: {kind: attnres, granularity: sublayer}}",
            "topology.depth.granularity",
            "same units",
        ),
        ("{kind: compose, depth: {kind: attnres}, widht: {kind: mhc}}", "widht", "unknown field"),
    ];
    for (topology, key, reason) in cases {
        let e = exp(MIXER, topology).err().unwrap_or_else(|| panic!("{topology} was accepted"));
        assert!(e.contains(key) && e.contains(reason), "{topology}: {e}");
    }
    // One granularity given once reaches both parts.
    let e = exp(MIXER, "{kind: compose, granularity: block, depth: {kind: attnres}, width: {kind: mhc}}").unwrap();
    assert_eq!(e.topology.granularity(), plexus::topology::Granularity::Block);
    assert_eq!(e.topology.label(), "AttnRes (full) × mHC (n=4)");
    assert_eq!(e.topology.display(), "AttnRes × mHC");
    assert_eq!(e.topology.streams(), 4);
}
