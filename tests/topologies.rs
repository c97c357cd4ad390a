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
