//! Identities between topologies, connectivity matrices, and the registry (issue: topology library).

use plexus::experiment::Experiment;
use plexus::model::Model;
use plexus::topology::common::to_matrix;

/// A 2-D tensor's rows.
fn to_rows(t: &tch::Tensor) -> Vec<Vec<f64>> {
    to_matrix(t).rows().into_iter().map(|r| r.to_vec()).collect()
}
use tch::{Device, Kind, Tensor};

const MLP: &str =
    "model: {kind: mlp, width: 8, hidden: 16, depth: 4}\ndata: {kind: whitened_regression, dim: 6, samples: 12}\n";
const MIXER: &str = "model: {kind: mixer, patch: 4, width: 8, token_hidden: 6, channel_hidden: 12, depth: 3}\ndata: {kind: synthetic_images, image_size: 8, channels: 3, classes: 5, samples: 12}\n";

fn exp(backbone: &str, topology: &str) -> Experiment {
    let yaml = format!("name: t\nseed: 3\n{backbone}topology: {topology}\n");
    Experiment::from_str(&yaml, "<test>", &[]).unwrap_or_else(|e| panic!("{e}"))
}

/// Builds the model (seed 3: backbone weights are drawn first, so they agree across topologies)
/// and returns it with one input batch.
fn build(backbone: &str, topology: &str) -> (Model, Tensor) {
    let e = exp(backbone, topology);
    let input = e.data.load().unwrap().train_batch(0).unwrap().input;
    let model =
        plexus::device::with_seed(3, || Model::new(e.model.as_ref(), e.topology.as_ref(), Device::Cpu, Kind::Float));
    (model, input)
}

fn output(backbone: &str, topology: &str) -> Tensor {
    let (m, x) = build(backbone, topology);
    tch::no_grad(|| m.forward(&x, false))
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

/// "Bit for bit up to float reassociation": a few fp32 ulps of the output's scale.
const REASSOC: f64 = 1e-6;

#[test]
fn hacn_with_a_equal_1_is_residual_and_with_a_equal_0_is_acn() {
    for bb in [MLP, MIXER] {
        let res = output(bb, "{kind: residual}");
        let acn = output(bb, "{kind: acn}");
        let h1 = output(bb, "{kind: hacn, init: {kind: constant, value: 1.0}}");
        let h0 = output(bb, "{kind: hacn, init: {kind: constant, value: 0.0}}");
        assert!(max_diff(&h1, &res) < REASSOC, "a=1 vs residual: {:e}", max_diff(&h1, &res));
        assert!(max_diff(&h0, &acn) < REASSOC, "a=0 vs acn: {:e}", max_diff(&h0, &acn));
        assert!(max_diff(&res, &acn) > 1e-3, "residual and acn should differ");
        // The 1−α convention with α = 0 is the residual network too.
        let h = output(bb, "{kind: hacn, init: {kind: constant, value: 0.0}, convention: one_minus_alpha}");
        assert!(max_diff(&h, &res) < REASSOC);
    }
}

#[test]
fn topologies_that_start_as_the_residual_network_do() {
    for bb in [MLP, MIXER] {
        let res = output(bb, "{kind: residual}");
        for t in [
            "{kind: hyper}",
            "{kind: hyper, dynamic: false}",
            "{kind: layercomb}",
            "{kind: densenet}",
            "{kind: laurel, variant: lr}",
            "{kind: laurel, variant: pa}",
            "{kind: shortcuts, edges: [\"0:1\", \"1:2\", \"2:3\", \"3:4\"]}",
        ] {
            let t = if bb == MIXER { t.replace("\"3:4\"]", "\"3:4\", \"4:5\", \"5:6\"]") } else { t.to_string() };
            let d = max_diff(&output(bb, &t), &res);
            assert!(d < REASSOC, "{t}: {d:e} from residual");
        }
        // DenseFormer's DWA starts at "1 on the latest block output": the residual network, per block.
        let d = max_diff(&output(bb, "{kind: denseformer}"), &res);
        assert!(d < REASSOC, "denseformer: {d:e} from residual");
    }
}

/// With Depth-adaptive LayerNorm on both, H-ACN with a = 0 is ACN (both learn the same
/// per-unit strengths from 0.05; on the Mixer, whose units have pre-norms); per layer too.
#[test]
fn hacn_with_a_equal_0_is_acn_with_depth_ln_too() {
    for g in ["sublayer", "block"] {
        let h = output(
            MIXER,
            &format!("{{kind: hacn, init: {{kind: constant, value: 0.0}}, depth_ln: true, granularity: {g}}}"),
        );
        let a = output(MIXER, &format!("{{kind: acn, depth_ln: true, granularity: {g}}}"));
        assert!(max_diff(&h, &a) < REASSOC, "{g}: {:e}", max_diff(&h, &a));
        let plain = output(MIXER, &format!("{{kind: acn, granularity: {g}}}"));
        assert!(max_diff(&a, &plain) > 1e-4, "{g}: DepthLN changed nothing");
    }
}

#[test]
fn layercomb_with_acn_init_is_acn() {
    let d = max_diff(&output(MLP, "{kind: layercomb, init: acn}"), &output(MLP, "{kind: acn}"));
    assert!(d < REASSOC, "{d:e}");
}

#[test]
fn attnres_with_zero_queries_reads_the_uniform_mean_of_its_sources() {
    let (m, x) = build(MLP, "{kind: attnres}");
    let c = to_rows(&m.connectivity(&x));
    for k in 1..c.len() {
        for i in 0..k {
            assert!((c[i][k] - 1.0 / k as f64).abs() < 1e-6, "C[{i}][{k}] = {}", c[i][k]);
        }
    }
    // The same network as LayerComb with weights 1/k.
    let (lc, _) = build(MLP, "{kind: layercomb}");
    tch::no_grad(|| {
        for (name, t) in lc.vs.variables() {
            if let Some(k) = name.strip_prefix("topology.weights.") {
                let _ = t.shallow_clone().fill_(1.0 / (k.parse::<f64>().unwrap() + 1.0));
            }
        }
    });
    let lcc = to_rows(&lc.connectivity(&x));
    for k in 1..c.len() {
        for i in 0..k {
            assert!((lcc[i][k] - c[i][k]).abs() < 1e-6, "layercomb C[{i}][{k}] = {} vs attnres {}", lcc[i][k], c[i][k]);
        }
    }
    let a = tch::no_grad(|| m.forward(&x, false));
    let b = tch::no_grad(|| lc.forward(&x, false));
    assert!(max_diff(&a, &b) < REASSOC, "{:e}", max_diff(&a, &b));
}

fn connectivity(backbone: &str, topology: &str) -> Vec<Vec<f64>> {
    let (m, x) = build(backbone, topology);
    to_rows(&m.connectivity(&x))
}

#[test]
fn connectivity_matches_the_reference_formulas() {
    let l = 4; // MLP depth
    let plain = connectivity(MLP, "{kind: plain}");
    let res = connectivity(MLP, "{kind: residual}");
    let acn = connectivity(MLP, "{kind: acn}");
    for k in 1..=l + 1 {
        for i in 0..l + 2 {
            let upper = (i < k) as u8 as f64;
            assert_eq!(res[i][k], upper, "residual C[{i}][{k}]");
            let sub = (i + 1 == k) as u8 as f64;
            assert_eq!(plain[i][k], sub, "plain C[{i}][{k}]");
            assert_eq!(acn[i][k], if k == l + 1 { upper } else { sub }, "acn C[{i}][{k}]");
        }
    }
    // H-ACN: C[i][k] = Π_{l=i+1}^{k-1} a_l, readout all ones.
    let (m, x) = build(MLP, "{kind: hacn, init: {kind: normal, mu: 0.3, sigma: 0.1}}");
    let a = to_rows(&m.topology.parameter_view().unwrap().1)[0].clone();
    let c = to_rows(&m.connectivity(&x));
    for k in 1..=l {
        for i in 0..k {
            let expected: f64 = (i + 1..k).map(|j| a[j - 1]).product();
            assert!((c[i][k] - expected).abs() < 1e-6, "hacn C[{i}][{k}] = {} vs {expected}", c[i][k]);
        }
    }
    for i in 0..=l {
        assert!((c[i][l + 1] - 1.0).abs() < 1e-12);
    }
    let gamma = plexus::host::scalar(&m.topology.gamma().unwrap());
    let expected = (a.iter().map(|v| v * v).sum::<f64>() / l as f64).sqrt();
    assert!((gamma - expected).abs() < 1e-9);
}

#[test]
fn input_dependent_connectivity_is_a_proper_average() {
    // Hyper-connections at init read exactly the residual stream: C = residual's.
    let hyper = connectivity(MIXER, "{kind: hyper}");
    let res = connectivity(MIXER, "{kind: residual}");
    for (a, b) in hyper.iter().flatten().zip(res.iter().flatten()) {
        assert!((a - b).abs() < 1e-6, "{hyper:?}");
    }
    // mHC mixes with a doubly stochastic H_res: every column of C beyond the first unit is finite
    // and positive where a path exists.
    let mhc = connectivity(MIXER, "{kind: mhc}");
    for k in 1..mhc.len() {
        for i in 0..k {
            assert!(mhc[i][k].is_finite() && mhc[i][k] > 0.0, "mhc C[{i}][{k}] = {}", mhc[i][k]);
        }
    }
}

/// A tiny config per backbone for every registered topology: it builds, runs forward and
/// backward with finite values, and C has the right shape. New topologies are picked up here.
#[test]
fn every_registered_topology_runs_on_every_test_backbone() {
    for entry in plexus::topology::REGISTRY {
        for (bb, sublayers) in [(MLP, 4usize), (MIXER, 6)] {
            let (m, x) = build(bb, &format!("{{kind: {}}}", entry.name));
            let out = m.forward(&x, true);
            let loss =
                out.square().mean(Kind::Float) + m.topology.regularizer().unwrap_or_else(|| Tensor::from(0.0f32));
            loss.backward();
            assert!(loss.double_value(&[]).is_finite(), "{}", entry.name);
            for (name, v) in m.vs.trainable_variables().iter().enumerate() {
                let g = v.grad();
                assert!(!g.defined() || g.isfinite().all().int64_value(&[]) == 1, "{}: grad {name}", entry.name);
            }
            let depth = if m.granularity == plexus::topology::Granularity::Block {
                sublayers / m.block_size
            } else {
                sublayers
            };
            let c = m.connectivity(&x);
            assert_eq!(c.size(), [depth as i64 + 2, depth as i64 + 2], "{}", entry.name);
            let upper = c.triu(0).abs().sum(Kind::Double).double_value(&[]);
            assert!(
                upper > 0.0 && (c.tril(0).abs().sum(Kind::Double).double_value(&[])) == 0.0,
                "{}: C not strictly upper triangular",
                entry.name
            );
        }
    }
}

/// mHC's state at step 0, from its rule (docs/topologies.md, `init`): under the default
/// `init: residual` it is the pre-norm residual network — unit k reads stream k mod n (`H_pre`
/// one-hot to σ(−8)), `H_res` within (n − 1)·e⁻⁸ of the identity, `H_post = 1`, so its output is
/// residual's — and its streams are not interchangeable: each unit reads its own, so the streams'
/// post weights get gradients that differ by more than a tenth of their size. The symmetric start
/// (every map alike on every stream) is the planted wrong init: it must fail that last check.
#[test]
fn mhc_starts_as_the_residual_network_with_streams_that_differ() {
    let n = 4usize;
    let res = output(MIXER, "{kind: residual}");
    let mhc = output(MIXER, "{kind: mhc}");
    let d = max_diff(&mhc, &res) / res.abs().max().double_value(&[]).max(1.0);
    assert!(d < 1e-5, "mhc at init is {d:e} from the residual network");
    let (m, x) = build(MIXER, "{kind: mhc}");
    let (name, h_res) = tch::no_grad(|| m.parameter_view(&x)).unwrap();
    assert_eq!(name, "H_res");
    let eye = Tensor::eye(n as i64, (Kind::Double, Device::Cpu));
    let gap = (h_res.to_kind(Kind::Double).reshape([-1, n as i64, n as i64]) - eye).abs().max().double_value(&[]);
    assert!(gap <= (n - 1) as f64 * (-8f64).exp(), "H_res is {gap:e} from the identity");
    // The spread of each unit's post-weight gradient over the streams, relative to its largest.
    let spread = |topology: &str| -> f64 {
        let (m, x) = build(MIXER, topology);
        let y = m.forward(&x, true);
        let g = plexus::device::with_seed(11, || Tensor::randn(y.size(), (Kind::Float, Device::Cpu)));
        (&y * g).sum(Kind::Float).backward();
        let vars = m.vs.variables();
        let units = m.depth();
        // The last unit's streams are read only by the readout's mean: alike by construction.
        (0..units - 1)
            .map(|k| {
                let g = vars[&format!("topology.layers.{k}.bias_post")].grad();
                let (hi, lo) = (g.max().double_value(&[]), g.min().double_value(&[]));
                (hi - lo) / g.abs().max().double_value(&[])
            })
            .fold(f64::INFINITY, f64::min)
    };
    let own = spread("{kind: mhc}");
    assert!(own > 0.1, "the streams' post weights get gradients within {own:.3} of each other");
    let alike = spread("{kind: mhc, init: symmetric}");
    eprintln!(
        "mhc at init: {d:e} from residual, H_res {gap:e} from I; post-gradient spread {own:.3} (symmetric {alike:.3})"
    );
    assert!(alike < 0.1, "the planted symmetric start passes the check ({alike:.3}): it cannot fail");
}

/// A unit that returns a fixed vector whatever it reads, and keeps what it read.
struct Constant {
    out: Tensor,
    read: std::cell::RefCell<Option<Tensor>>,
}

impl plexus::topology::Unit for Constant {
    fn forward(&self, x: &Tensor, _norm: plexus::topology::Norm, _train: bool) -> Tensor {
        *self.read.borrow_mut() = Some(x.shallow_clone());
        self.out.expand_as(x)
    }
}

/// mHC's presets at step 0 against the ports they are named after, on one unit that returns a
/// constant c: the unit reads `Σ_s H_pre[s] · x0` and the output is `x0 + mean_t H_post[t] · c`
/// (the columns of a doubly stochastic H_res sum to 1). `lucidrains` is the static init of
/// lucidrains' `hyper-connections` port (manifold_constrained_hyper_connections.py at 4775103):
/// `H_pre = σ(one-hot)` (σ(1) on the unit's stream, σ(0) on the others) and `H_post = 2σ(1)`
/// (its static beta starts at 1); `residual` reads one stream (σ(8) + 3σ(−8)) and writes 1.
#[test]
fn mhc_presets_start_where_the_ports_they_are_named_after_do() {
    let (n, d) = (4.0f64, 5i64);
    let sigma = |x: f64| 1.0 / (1.0 + (-x).exp());
    for (init, reads, writes) in [
        ("lucidrains", sigma(1.0) + (n - 1.0) * sigma(0.0), 2.0 * sigma(1.0)),
        ("residual", sigma(8.0) + (n - 1.0) * sigma(-8.0), 1.0),
    ] {
        let stack = plexus::topology::StackInfo {
            sublayers: 1,
            block_size: 1,
            width: d as usize,
            pre_norm: true,
            ports: false,
        };
        let opts: serde_yaml::Mapping = serde_yaml::from_str(&format!("{{init: {init}}}")).unwrap();
        let vs = tch::nn::VarStore::new(Device::Cpu);
        let t = plexus::topology::parse("mhc", &opts, stack).unwrap().build(&(vs.root() / "topology"), Kind::Float);
        // No draw from libtorch's generator: other tests of this binary seed and draw from it.
        let x0 = (Tensor::arange(3 * d, (Kind::Float, Device::Cpu)).view([3, d]) * 0.37).sin();
        let c = Tensor::from_slice(&[0.5f32, -1.0, 2.0, 0.25, 1.5]);
        let unit = Constant { out: c.shallow_clone(), read: Default::default() };
        let y = tch::no_grad(|| t.forward(&x0, &[&unit], false));
        let read = unit.read.borrow().as_ref().unwrap().shallow_clone();
        assert!(max_diff(&read, &(&x0 * reads)) < 1e-5, "{init}: the unit reads {reads} · x0");
        assert!(max_diff(&y, &(&x0 + &c * writes)) < 1e-5, "{init}: the output is x0 + {writes} · c");
    }
}

/// ReZero at step 0 is the identity: every α is 0, so C takes node 0 (the stem) alone into every
/// unit and the readout, and no unit's output anywhere.
#[test]
fn rezero_starts_as_the_identity() {
    let c = connectivity(MLP, "{kind: rezero}");
    let l = c.len() - 2;
    for k in 1..=l + 1 {
        assert_eq!(c[0][k], 1.0, "C[0][{k}]");
        for (i, row) in c.iter().enumerate().take(k).skip(1) {
            assert_eq!(row[k], 0.0, "C[{i}][{k}]");
        }
    }
}
