//! `topology.kind: graph` (issue 58): a graph with another topology's C computes what that topology
//! computes, in fp64 (the topologies are driven directly, on tanh units, with the VarStore in
//! fp64): outputs, the gradients of the input and of every unit weight, and C from
//! `connectivity`; where both learn the same weights (LayerComb), the same weight gradients. Also
//! the patterns' sources, softmax normalisation, `init: {from}` and the option errors.

use plexus::topology::{self, Norm, StackInfo, Topology, Unit};
use tch::{nn, Device, Kind, Tensor};

const D: i64 = 7;

/// A unit `tanh(x W)`, W `[D, D]`.
struct TanhUnit(Tensor);

impl Unit for TanhUnit {
    fn forward(&self, x: &Tensor, _norm: Norm, _train: bool) -> Tensor {
        x.matmul(&self.0).tanh()
    }
}

/// A topology built from YAML options for `l` units of width D, its parameters in fp64.
fn build(kind: &str, options: &str, l: usize) -> (nn::VarStore, Box<dyn Topology>) {
    let stack = StackInfo { sublayers: l, block_size: 1, width: D as usize, pre_norm: true, ports: false };
    let opts: serde_yaml::Mapping = serde_yaml::from_str(options).unwrap();
    let mut vs = nn::VarStore::new(Device::Cpu);
    let spec = topology::parse(kind, &opts, stack).unwrap_or_else(|e| panic!("{kind} {options}: {e:?}"));
    let t = spec.build(&(vs.root() / "topology"), Kind::Float);
    vs.double();
    (vs, t)
}

/// The fixed inputs of a comparison: x0 `[3, 4, D]`, the unit weights and the output cotangent,
/// fp64, drawn from `seed`.
struct Setup {
    x0: Tensor,
    ws: Vec<Tensor>,
    g: Tensor,
}

fn setup(l: usize, seed: i64) -> Setup {
    // Under the process's seed lock: the tests of this binary share libtorch's generator.
    plexus::device::with_seed(seed as u64, || {
        let opts = (Kind::Double, Device::Cpu);
        let x0 = Tensor::randn([3, 4, D], opts);
        let ws = (0..l).map(|_| Tensor::randn([D, D], opts) / (D as f64).sqrt()).collect();
        Setup { x0, ws, g: Tensor::randn([3, 4, D], opts) }
    })
}

/// Output, then the gradients of x0, of every unit weight, and of `params` (the topology's own
/// weights to differentiate, if any), from `loss = Σ y·g`.
fn run(t: &dyn Topology, s: &Setup, params: &[Tensor]) -> Vec<Tensor> {
    let x0 = s.x0.detach().set_requires_grad(true);
    let ws: Vec<Tensor> = s.ws.iter().map(|w| w.detach().set_requires_grad(true)).collect();
    let units: Vec<TanhUnit> = ws.iter().map(|w| TanhUnit(w.shallow_clone())).collect();
    let refs: Vec<&dyn Unit> = units.iter().map(|u| u as &dyn Unit).collect();
    let y = t.forward(&x0, &refs, true);
    assert_eq!(y.kind(), Kind::Double);
    let loss = (&y * &s.g).sum(Kind::Double);
    let inputs: Vec<&Tensor> = std::iter::once(&x0).chain(&ws).chain(params).collect();
    let grads = Tensor::run_backward(&[&loss], &inputs, false, false);
    std::iter::once(y.detach()).chain(grads).collect()
}

/// C of a topology on the setup's units.
fn connectivity(t: &dyn Topology, s: &Setup) -> Tensor {
    let units: Vec<TanhUnit> = s.ws.iter().map(|w| TanhUnit(w.shallow_clone())).collect();
    let refs: Vec<&dyn Unit> = units.iter().map(|u| u as &dyn Unit).collect();
    tch::no_grad(|| t.connectivity(&s.x0, &refs))
}

/// max |a − b| / max(1, max |b|).
fn rel(a: &Tensor, b: &Tensor) -> f64 {
    let scale = b.abs().max().double_value(&[]).max(1.0);
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double)).abs().max().double_value(&[]) / scale
}

fn assert_same(got: &[Tensor], want: &[Tensor], what: &str) {
    assert_close(got, want, 1e-12, what);
}

fn assert_close(got: &[Tensor], want: &[Tensor], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert_eq!(a.size(), b.size(), "{what}: tensor {i}");
        let e = rel(a, b);
        assert!(e < tol, "{what}: tensor {i} (0 = output, 1 = grad x0, then unit weights, …) off by {e:e}");
    }
}

/// The topology's parameters by name, sorted.
fn params(vs: &nn::VarStore) -> Vec<(String, Tensor)> {
    let mut v: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// Sets a learnable `pattern: all` graph's weights (`topology.weights.{j-1}` `[j]`) to C's columns.
fn set_weights_to(vs: &nn::VarStore, c: &Tensor) {
    let n = c.size()[0];
    tch::no_grad(|| {
        for (name, t) in vs.variables() {
            let j: i64 = name.strip_prefix("topology.weights.").expect("a weight vector").parse::<i64>().unwrap() + 1;
            assert!(j < n);
            t.shallow_clone().copy_(&c.narrow(0, 0, j).select(1, j));
        }
    });
}

#[test]
fn patterns_compute_what_plain_residual_and_acn_compute() {
    let l = 5;
    let s = setup(l, 1);
    let cases = [
        ("plain", "{pattern: chain, readout: last}"),
        ("plain", "{pattern: chain, weights: fixed}"),
        ("residual", "{}"),
        ("residual", "{weights: fixed, pattern: all}"),
        ("acn", "{pattern: chain, readout: all}"),
        ("acn", "{init: acn}"),
        ("acn", "{edges: [\"0:1\", \"1:2\", \"2:3\", \"3:4\", \"4:5\"], readout: all, weights: fixed}"),
    ];
    for (kind, options) in cases {
        let (_, reference) = build(kind, "{}", l);
        let (_, graph) = build("graph", options, l);
        assert_same(
            &run(graph.as_ref(), &s, &[]),
            &run(reference.as_ref(), &s, &[]),
            &format!("{kind} = graph {options}"),
        );
        let (cg, cr) = (connectivity(graph.as_ref(), &s), connectivity(reference.as_ref(), &s));
        assert!(rel(&cg, &cr) < 1e-15, "{kind} = graph {options}: C {cg} against {cr}");
    }
    // The comparison can fail: plain, residual and ACN differ on these units.
    let out = |k: &str| run(build(k, "{}", l).1.as_ref(), &s, &[]).remove(0);
    let (p, r, a) = (out("plain"), out("residual"), out("acn"));
    assert!(rel(&p, &r) > 1e-2 && rel(&r, &a) > 1e-2 && rel(&p, &a) > 1e-2);
}

/// A learnable `pattern: all` graph is LayerComb: the same parameters (names, shapes, values) and
/// the same gradients for all of them, at both of LayerComb's inits and at random weights.
#[test]
fn a_learnable_dense_graph_is_layercomb_and_learns_the_same() {
    let l = 4;
    let s = setup(l, 2);
    for init in ["residual", "acn", "random"] {
        let lc_init = if init == "random" { "residual" } else { init };
        let (lvs, lc) = build("layercomb", &format!("{{init: {lc_init}}}"), l);
        let (gvs, g) = build("graph", &format!("{{init: {lc_init}}}"), l);
        if init == "random" {
            plexus::device::with_seed(9, || {
                tch::no_grad(|| {
                    for ((_, a), (_, b)) in params(&lvs).iter().zip(params(&gvs)) {
                        let r = a.randn_like();
                        a.shallow_clone().copy_(&r);
                        b.shallow_clone().copy_(&r);
                    }
                })
            });
        }
        let (lp, gp) = (params(&lvs), params(&gvs));
        assert_eq!(lp.len(), l + 1);
        for ((na, a), (nb, b)) in lp.iter().zip(&gp) {
            assert_eq!((na, a.size()), (nb, b.size()));
            assert!(a.equal(b), "{init}: {na} starts elsewhere");
        }
        let lt: Vec<Tensor> = lp.into_iter().map(|p| p.1).collect();
        let gt: Vec<Tensor> = gp.into_iter().map(|p| p.1).collect();
        let (want, got) = (run(lc.as_ref(), &s, &lt), run(g.as_ref(), &s, &gt));
        assert_eq!(got.len(), 1 + 1 + l + (l + 1));
        assert_same(&got, &want, &format!("layercomb init {init}"));
        assert!(got[2 + l..].iter().any(|t| t.abs().max().double_value(&[]) > 1e-3), "{init}: no weight gradient");
    }
}

/// With its weights set to C of a topology that mixes streams with learned scalars (DenseFormer,
/// ANCRe with ingoing softmax, H-ACN, ReZero, shortcuts), at random parameters, a learnable
/// `pattern: all` graph computes what that topology computes (output, input and unit gradients),
/// and reports the same C.
#[test]
fn a_graph_with_another_topologys_c_computes_what_it_computes() {
    let l = 5;
    let s = setup(l, 3);
    let others = [
        ("denseformer", "{}"),
        ("denseformer", "{dilation: 2}"),
        ("ancre", "{tau: 1.0, placement: module}"),
        ("hacn", "{long: false}"),
        // H-ACN's long path adds h in fp32 (`h.to_kind(Float)`), so in fp64 it agrees to fp32's
        // rounding only.
        ("hacn", "{}"),
        ("rezero", "{norm: keep}"),
        ("shortcuts", "{edges: [\"0:2\", \"1:3\", \"2:5\"]}"),
    ];
    for (n, (kind, options)) in others.iter().enumerate() {
        let (vs, reference) = build(kind, options, l);
        plexus::device::with_seed(20 + n as u64, || {
            tch::no_grad(|| {
                for (_, t) in vs.variables() {
                    let r = t.randn_like() * 0.5 + t.detach();
                    t.shallow_clone().copy_(&r);
                }
            })
        });
        let c = connectivity(reference.as_ref(), &s);
        let (gvs, graph) = build("graph", "{}", l);
        set_weights_to(&gvs, &c);
        let what = format!("graph with the C of {kind} {options}");
        let tol = if *kind == "hacn" && !options.contains("long: false") { 1e-6 } else { 1e-12 };
        assert_close(&run(graph.as_ref(), &s, &[]), &run(reference.as_ref(), &s, &[]), tol, &what);
        let cg = connectivity(graph.as_ref(), &s);
        assert!(rel(&cg, &c) < 1e-15, "{what}: C");
        // And not merely because every C is alike: residual's C gives another output.
        let (_, residual) = build("residual", "{}", l);
        assert!(rel(&run(graph.as_ref(), &s, &[])[0], &run(residual.as_ref(), &s, &[])[0]) > 1e-3, "{what}");
    }
}

/// The sources of each pattern, written out by hand for L = 5 (nodes 1..5 units, 6 the readout).
#[test]
fn each_pattern_wires_the_sources_it_documents() {
    let l = 5;
    let s = setup(l, 4);
    let cases: [(&str, [&[usize]; 6]); 7] = [
        ("{pattern: {window: 2}}", [&[0], &[0, 1], &[1, 2], &[2, 3], &[3, 4], &[4, 5]]),
        ("{pattern: {dilation: 2}}", [&[0], &[1], &[0, 2], &[1, 3], &[0, 2, 4], &[1, 3, 5]]),
        ("{pattern: {blocks: 2}}", [&[0], &[0, 1], &[2], &[2, 3], &[4], &[4, 5]]),
        ("{pattern: {blocks: 5}}", [&[0], &[0, 1], &[0, 1, 2], &[0, 1, 2, 3], &[0, 1, 2, 3, 4], &[5]]),
        ("{pattern: chain, readout: [0, 3]}", [&[0], &[1], &[2], &[3], &[4], &[0, 3]]),
        ("{pattern: {window: 2}, readout: last}", [&[0], &[0, 1], &[1, 2], &[2, 3], &[3, 4], &[5]]),
        (
            "{edges: [\"0:1\", \"0:2\", \"1:3\", \"0:4\", \"2:4\", \"4:5\", \"1:6\", \"5:6\"]}",
            [&[0], &[0], &[1], &[0, 2], &[4], &[1, 5]],
        ),
    ];
    for (options, want) in cases {
        // Weights 1 + i/10 + j/100, so that C tells the edges apart.
        let (vs, g) = build("graph", options, l);
        tch::no_grad(|| {
            for (name, t) in vs.variables() {
                let j: usize = name.rsplit('.').next().unwrap().parse::<usize>().unwrap() + 1;
                let vals: Vec<f64> = want[j - 1].iter().map(|&i| 1.0 + i as f64 / 10.0 + j as f64 / 100.0).collect();
                t.shallow_clone().copy_(&Tensor::from_slice(&vals));
            }
        });
        let c = topology::common::to_matrix(&connectivity(g.as_ref(), &s));
        assert_eq!(c.dim(), (l + 2, l + 2));
        for j in 1..=l + 1 {
            for i in 0..l + 2 {
                let expected = if want[j - 1].contains(&i) { 1.0 + i as f64 / 10.0 + j as f64 / 100.0 } else { 0.0 };
                assert!((c[[i, j]] - expected).abs() < 1e-12, "{options}: C[{i}][{j}] = {} not {expected}", c[[i, j]]);
            }
        }
        // The parameter view is the same C.
        let (name, view) = g.parameter_view().unwrap();
        assert_eq!(name, "C");
        assert!(rel(&view, &connectivity(g.as_ref(), &s)) < 1e-15, "{options}: view");
    }
}

/// `normalize: softmax`: each node's incoming weights are softmax(logits / τ) (C's columns sum to
/// 1), the graph computes what the unnormalised graph with those weights computes, and the logits'
/// gradient is the softmax's Jacobian applied to the weights' gradient.
#[test]
fn softmax_normalises_each_nodes_incoming_weights() {
    let l = 4;
    let s = setup(l, 5);
    let tau = 0.7;
    let (svs, soft) = build("graph", &format!("{{pattern: {{window: 3}}, normalize: softmax, temperature: {tau}}}"), l);
    // At init (residual: equal weights) every column is uniform over the node's sources.
    let c0 = topology::common::to_matrix(&connectivity(soft.as_ref(), &s));
    for j in 1..=l + 1 {
        let n = j.min(3);
        for i in j - n..j {
            assert!((c0[[i, j]] - 1.0 / n as f64).abs() < 1e-7, "init C[{i}][{j}] = {}", c0[[i, j]]);
        }
    }
    plexus::device::with_seed(11, || {
        tch::no_grad(|| {
            for (_, t) in svs.variables() {
                t.shallow_clone().copy_(&t.randn_like());
            }
        })
    });
    let logits: Vec<Tensor> = params(&svs).into_iter().map(|p| p.1).collect();
    let c = connectivity(soft.as_ref(), &s);
    let cm = topology::common::to_matrix(&c);
    for j in 1..=l + 1 {
        let col: f64 = (0..j).map(|i| cm[[i, j]]).sum();
        assert!((col - 1.0).abs() < 1e-12, "column {j} sums to {col}");
    }
    let (pvs, plain_w) = build("graph", "{pattern: {window: 3}}", l);
    let weights: Vec<Tensor> = params(&pvs).into_iter().map(|p| p.1).collect();
    tch::no_grad(|| {
        for (w, z) in weights.iter().zip(&logits) {
            w.shallow_clone().copy_(&(z / tau).softmax(0, Kind::Double));
        }
    });
    let got = run(soft.as_ref(), &s, &logits);
    let want = run(plain_w.as_ref(), &s, &weights);
    let k = 2 + l;
    assert_same(&got[..k], &want[..k], "softmax graph = graph with the softmax's weights");
    for (j0, (gz, gw)) in got[k..].iter().zip(&want[k..]).enumerate() {
        let p = (&logits[j0] / tau).softmax(0, Kind::Double);
        let expect = &p * (gw - (&p * gw).sum(Kind::Double)) / tau;
        assert!(rel(gz, &expect) < 1e-12, "node {}: logits' gradient {gz} against {expect}", j0 + 1);
    }
}

/// `init: {from: RUN_DIR, step: N}` starts at the C a run saved; `frozen` keeps the parameters
/// without a gradient; fixed weights are no parameters at all.
#[test]
fn init_from_a_run_frozen_and_fixed() {
    let l = 3;
    let s = setup(l, 6);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.yaml"), "name: saved\n").unwrap();
    std::fs::create_dir(dir.path().join("connectivity")).unwrap();
    let mut saved = ndarray::Array2::<f64>::zeros((l + 2, l + 2));
    for j in 1..l + 2 {
        for i in 0..j {
            saved[[i, j]] = 0.25 + (i * 7 + j) as f64 / 16.0;
        }
    }
    let csv = plexus::run_dir::matrix_csv(&saved);
    std::fs::write(dir.path().join("connectivity/step_40.csv"), &csv).unwrap();
    std::fs::write(dir.path().join("connectivity/step_10.csv"), csv.replace("0.25", "9")).unwrap();
    let from = |extra: &str| format!("{{init: {{from: {:?}, step: 40}}{extra}}}", dir.path().display().to_string());
    for extra in ["", ", weights: fixed", ", frozen: true"] {
        let (vs, g) = build("graph", &from(extra), l);
        let c = topology::common::to_matrix(&connectivity(g.as_ref(), &s));
        let off = (&c - &saved).iter().fold(0.0f64, |m, x| m.max(x.abs()));
        assert!(off < 1e-6, "{extra}: {c} against {saved}");
        let trainable = vs.variables().values().filter(|t| t.requires_grad()).count();
        let registered = vs.variables().len();
        assert_eq!(
            (registered, trainable),
            if extra.is_empty() {
                (l + 1, l + 1)
            } else if extra.contains("fixed") {
                (0, 0)
            } else {
                (l + 1, 0)
            },
            "{extra}"
        );
    }
    // Without `step`, the last saved step (40, not 10).
    let last = format!("{{init: {{from: {:?}}}}}", dir.path().display().to_string());
    let c = topology::common::to_matrix(&connectivity(build("graph", &last, l).1.as_ref(), &s));
    assert!((c[[2, 3]] - saved[[2, 3]]).abs() < 1e-6 && (c[[0, 3]] - saved[[0, 3]]).abs() < 1e-6, "{c}");
    // A step it did not save names the ones it did.
    let err = parse_err(&format!("{{init: {{from: {:?}, step: 5}}}}", dir.path().display().to_string()), l);
    assert!(err.contains("init.from") && err.contains("10, 40"), "{err}");
    // `init: {file}`: the same C from its CSV alone (a study commits the exact C it transplants).
    let file = dir.path().join("connectivity/step_40.csv").display().to_string();
    let c = topology::common::to_matrix(&connectivity(
        build("graph", &format!("{{init: {{file: {file:?}}}, weights: fixed}}"), l).1.as_ref(),
        &s,
    ));
    let off = (&c - &saved).iter().fold(0.0f64, |m, x| m.max(x.abs()));
    assert!(off < 1e-6, "init.file: {c} against {saved}");
    // Both sources, or a step with a file, or a C of another size: refused, naming the key.
    let both = format!("{{init: {{file: {file:?}, from: {:?}}}}}", dir.path().display().to_string());
    assert!(parse_err(&both, l).contains("init"), "both sources");
    assert!(parse_err(&format!("{{init: {{file: {file:?}, step: 40}}}}"), l).contains("init"), "a step with a file");
    let err = parse_err(&format!("{{init: {{file: {file:?}}}}}"), l + 1);
    assert!(err.contains("init.file") && err.contains("this one is 5×5"), "{err}");
}

/// A C given as data is checked against the graph it starts: rows and columns are matched by
/// their labels (a file with its rows in another order reads the same), and an entry the graph has
/// no edge for — on or below the diagonal (a transposed C), or off the pattern — is an error naming
/// it, as are a NaN, a weight past fp32's range, a duplicated label and a C of another size; an
/// `init` number or a softmax temperature that fp32 cannot hold is refused too.
#[test]
fn a_c_given_as_data_is_checked_against_the_graph() {
    let l = 3;
    let s = setup(l, 7);
    let dir = tempfile::tempdir().unwrap();
    let mut c = ndarray::Array2::<f64>::zeros((l + 2, l + 2));
    for j in 1..l + 2 {
        for i in 0..j {
            c[[i, j]] = 0.5 + (i + 2 * j) as f64 / 8.0;
        }
    }
    let csv = plexus::run_dir::matrix_csv(&c);
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        format!("{{init: {{file: {:?}}}}}", path.display().to_string())
    };
    // Rows in reverse order, matched by label.
    let mut lines: Vec<&str> = csv.lines().collect();
    lines[1..].reverse();
    let (_, g) = build("graph", &write("reversed.csv", &(lines.join("\n") + "\n")), l);
    let got = topology::common::to_matrix(&connectivity(g.as_ref(), &s));
    let off = (&got - &c).iter().fold(0.0f64, |m, x| m.max(x.abs()));
    assert!(off < 1e-6, "{got} against {c}");
    let transposed = plexus::run_dir::matrix_csv(&c.t().to_owned());
    for (name, text, extra, words) in [
        ("t.csv", transposed.clone(), "", "C[1][0] = 0.75: on or below the diagonal"),
        ("t.csv", transposed, "", "a transposed C?"),
        ("chain.csv", csv.clone(), ", pattern: chain", "C[0][2] = 1: node 0 is not a source of node 2"),
        ("nan.csv", csv.replace("0.75", "NaN"), "", "C[0][1] = `NaN` is not a finite number"),
        ("big.csv", csv.replace("0.75", "1e39"), "", "C[0][1] = 1e39: weights are fp32"),
        ("dup.csv", csv.replacen("\n1,", "\n0,", 1), "", "row label 0: each node 0..4 labels one row"),
        ("cols.csv", csv.replacen("node,0,1", "node,0,0", 1), "", "the columns are labelled [0, 0, 2, 3, 4]"),
        ("label.csv", csv.replacen("\n2,", "\nx,", 1), "", "the row label `x` is not a node number"),
    ] {
        let options = write(name, &text);
        let options = format!("{}{extra}}}", options.strip_suffix('}').unwrap());
        let err = parse_err(&options, l);
        assert!(err.contains("key: \"init.file\"") && err.contains(words), "{name}{extra}: {err}");
    }
    for (options, key, words) in [
        ("{init: 1e39}", "init", "within fp32's range"),
        ("{init: .nan}", "init", "finite weights"),
        ("{normalize: softmax, temperature: 1e-300}", "temperature", "fp32's normal range"),
        ("{normalize: softmax, temperature: 1e39}", "temperature", "fp32's normal range"),
        (
            "{normalize: softmax, temperature: 1e37, init: 1e-30}",
            "temperature",
            "hold the initial weights (weight 1e-30",
        ),
    ] {
        let err = parse_err(options, l);
        assert!(err.contains(&format!("key: \"{key}\"")) && err.contains(words), "{options}: {err}");
    }
}

fn parse_err(options: &str, l: usize) -> String {
    let stack = StackInfo { sublayers: l, block_size: 1, width: D as usize, pre_norm: true, ports: false };
    let opts: serde_yaml::Mapping = serde_yaml::from_str(options).unwrap();
    match topology::parse("graph", &opts, stack) {
        Ok(spec) => panic!("{options} parsed: {spec:?}"),
        Err(e) => format!("{e:?}"),
    }
}

/// Strict options: every bad value names its key, the value and what is allowed.
#[test]
fn bad_options_name_the_key_the_value_and_what_is_allowed() {
    let l = 4;
    for (options, key, words) in [
        ("{patern: all}", "patern", "unknown field `patern`"),
        ("{pattern: dense}", "pattern", "`all`, `chain`"),
        ("{pattern: {window: 6}}", "pattern.window", "1..=5"),
        ("{pattern: {dilation: 0}}", "pattern.dilation", "1..=4"),
        ("{pattern: {stride: 2}}", "pattern", "{blocks: b}"),
        ("{pattern: all, edges: [\"0:1\"]}", "pattern", "absent when `edges`"),
        ("{edges: [\"0:7\"]}", "edges[0]", "0 ≤ i < j ≤ 5"),
        ("{edges: [\"0:1\", \"0:1\"]}", "edges[1]", "each edge at most once"),
        ("{edges: [\"0:1\", \"1:2\", \"2:3\", \"3:5\"]}", "edges", "unit 4 has none"),
        ("{edges: [\"0:1\", \"1:2\", \"2:3\", \"3:4\"]}", "edges", "the readout (node 5) has none"),
        (
            "{edges: [\"0:1\", \"1:2\", \"2:3\", \"3:4\", \"4:5\"], readout: all}",
            "edges[4]",
            "no edge into the readout",
        ),
        ("{readout: [0, 9]}", "readout[1]", "0..=4"),
        ("{readout: first}", "readout", "`pattern`, `last`, `all`"),
        ("{weights: learned}", "weights", "fixed"),
        ("{init: ones}", "init", "`residual`, `acn`, `uniform`"),
        ("{init: {from: /nonexistent/run}}", "init.from", "a run directory"),
        ("{init: {form: x}}", "init.form", "unknown field `form`"),
        ("{weights: fixed, frozen: true}", "frozen", "`weights: learnable`"),
        ("{temperature: 2}", "temperature", "unless `normalize: softmax`"),
        ("{normalize: softmax, temperature: 0}", "temperature", "> 0"),
        ("{normalize: softmax, init: acn}", "init", "weights > 0"),
        ("{normalize: l1}", "normalize", "softmax"),
    ] {
        let err = parse_err(options, l);
        assert!(err.contains(&format!("key: \"{key}\"")), "{options}: {err}");
        assert!(err.contains(words), "{options}: {err}");
    }
}

/// A wiring is seen before it is trained: `plexus connectivity CONFIG` prints the pattern's C and
/// `plexus plot CONFIG` draws it, from the config alone (no run directory is made).
#[test]
fn a_configs_c_is_printed_and_drawn_before_training() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("blocks.yaml");
    std::fs::write(
        &config,
        "name: graph-blocks\nseed: 0\ndevice: cpu\nmodel: {kind: lnn, depth: 6}\n\
         topology: {kind: graph, pattern: {blocks: 3}, readout: all}\n\
         data: {kind: whitened_regression, dim: 8, samples: 16, rank: 4}\ntrain: {optimizer: gd, lr: 1.0e-3, steps: 2}\n",
    )
    .unwrap();
    let plexus = |args: &[&str]| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_plexus")).args(args).current_dir(tmp.path()).output();
        let o = o.unwrap();
        assert!(o.status.success(), "plexus {args:?}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    let csv = plexus(&["connectivity", "blocks.yaml"]);
    let rows: Vec<Vec<f64>> =
        csv.lines().skip(1).map(|l| l.split(',').skip(1).map(|v| v.parse().unwrap()).collect()).collect();
    // Blocks of 3 units: unit 4 reads the node before its block (3) and nothing earlier; unit 5
    // reads 3 and 4; the readout (7) reads every node.
    assert_eq!(rows.len(), 8, "{csv}");
    assert_eq!((rows[3][4], rows[2][4], rows[0][4]), (1.0, 0.0, 0.0), "{csv}");
    assert_eq!((rows[3][5], rows[4][5]), (1.0, 1.0), "{csv}");
    assert!((0..7).all(|i| rows[i][7] == 1.0), "{csv}");
    let written = plexus(&["plot", "blocks.yaml", "--out", "figs"]);
    for ext in ["png", "svg", "pdf"] {
        let f = tmp.path().join(format!("figs/connectivity_graph-blocks.{ext}"));
        assert!(f.is_file() && std::fs::metadata(&f).unwrap().len() > 1000, "{} not written: {written}", f.display());
    }
    let figures = plexus::plot::figures::config_connectivity(&tmp.path().join("blocks.yaml")).unwrap();
    assert_eq!(figures[0].chart.title(), "Direct connectivity C — Graph at initialisation");
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 2, "only the config and the figures' folder");
}
