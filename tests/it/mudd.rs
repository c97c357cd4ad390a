//! `mudd` (docs/topologies.md, "`mudd`"): at its initialisation it is the residual Transformer,
//! bit for bit, with every way's C residual's; its traced C decomposes each unit's input exactly
//! (per token) and equals the probe's where the weights are static; it trains; and the configs it
//! refuses say why. Parity with the PyTorch reference is in tests/it/parity.rs
//! (parity/cases/*mudd*).

use plexus::experiment::Experiment;
use plexus::model::Model;
use plexus::topology::{common, Norm, StackInfo, Unit};
use std::cell::RefCell;
use tch::{nn, nn::OptimizerConfig, Device, Kind, Tensor};

const LLAMA: &str = "model: {kind: llama, width: 16, depth: 3, heads: 2}\n\
                     data: {kind: synthetic_tokens, vocab: 32, seq_len: 8, batch_size: 4}\n";
const GPT: &str = "model: {kind: gpt, width: 16, depth: 3, heads: 2}\n\
                   data: {kind: synthetic_tokens, vocab: 32, seq_len: 8, batch_size: 4}\n";

fn exp(backbone: &str, topology: &str) -> Result<Experiment, String> {
    let yaml = format!("name: t\nseed: 4\n{backbone}topology: {topology}\n");
    Experiment::from_str(&yaml, "<test>", &[]).map_err(|e| format!("{e:#}"))
}

fn model(e: &Experiment, kind: Kind) -> Model {
    plexus::device::with_seed(4, || Model::new(e.model.as_ref(), e.topology.as_ref(), Device::Cpu, kind))
}

/// At init (`b_i` one-hot on the latest state, `w2 = 0`) every way reads `X_i` exactly, so the
/// output is residual's at block granularity bit for bit on LLaMA (the ports' three norms compute
/// what the one norm does, the mixes add exact zeros), and on GPT, whose ports split `qkv` into
/// three products (another GEMM blocking), within a few fp32 units of the logits. Every way's C is
/// residual's.
#[test]
fn mudd_starts_as_the_residual_transformer() {
    for (bb, kind, tol) in [(LLAMA, Kind::Float, 0.0), (GPT, Kind::Float, 1e-5)] {
        let e = exp(bb, "{kind: residual, granularity: block}").unwrap();
        let batch = e.data.load().unwrap().train_batch(0).unwrap();
        let residual = model(&e, kind);
        let (y0, c0) = tch::no_grad(|| (residual.forward(&batch.input, false), residual.connectivity(&batch.input)));
        for topo in ["{kind: mudd}", "{kind: mudd, dynamic: false}", "{kind: mudd, ways: l}"] {
            let m = model(&exp(bb, topo).unwrap(), kind);
            let y = tch::no_grad(|| m.forward(&batch.input, false));
            let diff = (&y - &y0).abs().max().double_value(&[]);
            assert!(diff <= tol, "{topo}: the output differs from residual's by {diff}");
            let c = m.connectivity(&batch.input);
            assert!(c.allclose(&c0, 0.0, 1e-12, false), "{topo}: C at init\n{c}\nresidual's\n{c0}");
            let (name, ways) = m.parameter_view(&batch.input).expect("mudd's view");
            assert_eq!(name, "ways");
            let n = if topo.contains("ways: l") { 1 } else { 4 };
            assert_eq!(ways.size(), [n * 5, 5], "{topo}: one C per way");
            for w in ways.chunk(n, 0) {
                assert!(w.allclose(&c0, 0.0, 1e-12, false), "{topo}: a way's C at init");
            }
        }
    }
}

/// A unit `tanh(x W)` that records its input and output (fp64).
struct Recording {
    w: Tensor,
    seen: RefCell<Option<(Tensor, Tensor)>>,
}

impl Unit for Recording {
    fn forward(&self, x: &Tensor, _norm: Norm, _train: bool) -> Tensor {
        let h = x.matmul(&self.w).tanh();
        *self.seen.borrow_mut() = Some((x.copy(), h.copy()));
        h
    }
}

/// `mudd, ways: l` over `l` recording units of width `d` in fp64, every parameter moved off its
/// init (a fixed pattern): the topology and its units.
fn traced(topology: &str, l: usize, d: i64) -> (Box<dyn plexus::topology::Topology>, Vec<Recording>, nn::VarStore) {
    let opts: serde_yaml::Mapping = serde_yaml::from_str(topology).unwrap();
    let stack = StackInfo { sublayers: l, block_size: 1, width: d as usize, pre_norm: true, ports: false };
    let spec = plexus::topology::parse("mudd", &opts, stack).unwrap();
    let mut vs = nn::VarStore::new(Device::Cpu);
    let built = spec.build(&(vs.root() / "topology"), Kind::Double);
    vs.double();
    tch::no_grad(|| {
        for (i, (_, v)) in vs.variables().into_iter().enumerate() {
            let n = v.numel() as i64;
            let p = (Tensor::arange(n, (Kind::Double, Device::Cpu)) * (0.37 + 0.05 * i as f64)).sin() * 0.5;
            v.shallow_clone().copy_(&p.reshape(v.size()));
        }
    });
    let units = (0..l)
        .map(|k| Recording {
            w: (Tensor::arange(d * d, (Kind::Double, Device::Cpu)) * (0.11 + 0.03 * k as f64)).cos().reshape([d, d])
                * 0.4,
            seen: RefCell::new(None),
        })
        .collect();
    (built, units, vs)
}

/// On one token the traced coefficients are exact: every unit's recorded input is
/// `Σ_i C[i][k] h_i` (h_0 = x0, h_i the recorded outputs), dynamic or static; with static weights
/// C is data-independent and equals the probe's (`common::probe_connectivity`) on any batch.
#[test]
fn the_traced_connectivity_decomposes_every_input_and_matches_the_probe_where_static() {
    let (l, d) = (4usize, 6i64);
    for topo in ["{ways: l}", "{ways: l, dynamic: false}"] {
        let (built, units, _vs) = traced(topo, l, d);
        let refs: Vec<&dyn Unit> = units.iter().map(|u| u as &dyn Unit).collect();
        let x0 = (Tensor::arange(d, (Kind::Double, Device::Cpu)) * 0.7).sin().reshape([1, 1, d]);
        let c = built.connectivity(&x0, &refs);
        let _ = tch::no_grad(|| built.forward(&x0, &refs, false));
        let h: Vec<Tensor> = std::iter::once(x0.shallow_clone())
            .chain(units.iter().map(|u| u.seen.borrow().as_ref().unwrap().1.shallow_clone()))
            .collect();
        for (k, u) in units.iter().enumerate() {
            let input = u.seen.borrow().as_ref().unwrap().0.shallow_clone();
            let sum = h[..=k]
                .iter()
                .enumerate()
                .fold(Tensor::zeros_like(&x0), |s, (i, hi)| s + hi * c.double_value(&[i as i64, k as i64 + 1]));
            let diff = (&input - sum).abs().max().double_value(&[]);
            assert!(diff < 1e-12, "{topo}: unit {} input vs Σ C h: {diff}", k + 1);
        }
        if topo.contains("false") {
            let batch = Tensor::randn([3, 5, d], (Kind::Double, Device::Cpu));
            let traced = built.connectivity(&batch, &refs);
            let probed = common::probe_connectivity(|x, u| built.forward(x, u, false), l, Device::Cpu);
            assert!(traced.allclose(&probed, 0.0, 1e-12, false), "static: traced\n{traced}\nprobed\n{probed}");
        }
    }
}

/// A few AdamW steps lower the loss on LLaMA and GPT for every form; the dynamic generator's
/// `w2` (zero at init) moves, so the per-token weights take part.
#[test]
fn mudd_trains_on_both_language_models_in_every_form() {
    for bb in [LLAMA, GPT] {
        for topo in ["{kind: mudd}", "{kind: mudd, ways: l}", "{kind: mudd, dynamic: false}"] {
            let e = exp(bb, topo).unwrap();
            let task = e.data.info().task;
            let batch = e.data.load().unwrap().train_batch(0).unwrap();
            let m = model(&e, Kind::Float);
            let mut opt = nn::AdamW::default().build(&m.vs, 3e-3).unwrap();
            let first = tch::no_grad(|| task.loss(&m.forward(&batch.input, false), &batch.target)).double_value(&[]);
            for _ in 0..10 {
                opt.backward_step(&task.loss(&m.forward(&batch.input, true), &batch.target));
            }
            let last = tch::no_grad(|| task.loss(&m.forward(&batch.input, false), &batch.target)).double_value(&[]);
            assert!(last < first - 0.1, "{topo}: loss {first} -> {last}");
            if !topo.contains("false") {
                let w2 = &m.vs.variables()["topology.dynamic.1.w2.weight"];
                assert!(w2.abs().max().double_value(&[]) > 0.0, "{topo}: w2 never moved");
            }
        }
    }
}

#[test]
fn mudd_refuses_what_it_cannot_wire_and_says_why() {
    let mixer = "model: {kind: mixer, patch: 4, width: 8, token_hidden: 6, channel_hidden: 12, depth: 2}\n\
                 data: {kind: synthetic_images, image_size: 8, channels: 3, classes: 5, samples: 12}\n";
    let err = exp(mixer, "{kind: mudd, ways: qkvr}").map(|_| ()).unwrap_err();
    for want in ["topology.ways", "qkvr", "ports", "`l`"] {
        assert!(err.contains(want), "qkvr on a mixer: the error names {want:?}: {err}");
    }
    assert!(exp(mixer, "{kind: mudd, ways: l}").is_ok(), "`l` runs on any backbone");
    let l = exp(mixer, "{kind: mudd}").unwrap();
    assert_eq!(l.topology.label(), "l, dynamic", "the default on a backbone without ports is `l`");
    assert_eq!(exp(LLAMA, "{kind: mudd}").unwrap().topology.label(), "qkvr, dynamic");
    assert!(exp(mixer, "{kind: mudd, granularity: sublayer}").is_ok(), "`l` also runs on sublayers");
    let err = exp(LLAMA, "{kind: mudd, granularity: sublayer}").map(|_| ()).unwrap_err();
    assert!(err.contains("granularity") && err.contains("block"), "{err}");
    let err = exp(LLAMA, "{kind: mudd, ways: qkv}").map(|_| ()).unwrap_err();
    assert!(err.contains("qkvr") && err.contains("`l`"), "{err}");
}

/// Built with ports, every layer after the first has the key and value ports' norms (LLaMA
/// `layers.{b}.key_layernorm`, `value_layernorm`; GPT `blocks.{b}.attn.key_norm`, `value_norm`),
/// and the topology's parameters have the docs' shapes.
#[test]
fn mudd_parameters_are_named_and_shaped_as_the_docs_say() {
    let m = model(&exp(LLAMA, "{kind: mudd}").unwrap(), Kind::Float);
    let vars = m.vs.variables();
    for b in 1..3 {
        for n in ["key_layernorm", "value_layernorm"] {
            assert_eq!(vars[&format!("layers.{b}.{n}.weight")].size(), [16]);
        }
    }
    assert!(!vars.contains_key("layers.0.key_layernorm.weight"), "the first layer reads x0 alone");
    // L = 3 blocks: b_1 [4, 2], b_2 [4, 3], b_3 [1, 4]; H = round64(C·(i+1)·e).
    for (i, shape, hidden) in [(1, [4, 2], 64), (2, [4, 3], 64), (3, [1, 4], 64)] {
        assert_eq!(vars[&format!("topology.dense.{i}")].size(), shape);
        assert_eq!(vars[&format!("topology.dynamic.{i}.w1.weight")].size(), [hidden, 16]);
        assert_eq!(vars[&format!("topology.dynamic.{i}.w2.weight")].size(), [shape[0] * shape[1], hidden]);
    }
    assert_eq!(plexus::topology::mudd::round64(64), 128, "the authors' rounding moves a multiple of 64 up");
    let g = model(&exp(GPT, "{kind: mudd}").unwrap(), Kind::Float);
    let vars = g.vs.variables();
    for n in ["key_norm", "value_norm"] {
        assert!(vars.contains_key(&format!("blocks.2.attn.{n}.bias")));
    }
}
