//! The Transformer backbones (`vit`, `gpt`, `llama`): they build under the paper topologies, train,
//! respect causality, and have the parameters their definitions say (parity with PyTorch is in
//! tests/it/parity.rs).

use plexus::data::Batch;
use plexus::experiment::Experiment;
use plexus::model::Model;
use tch::{nn, nn::OptimizerConfig, Device, Kind, Tensor};

const VIT: &str = "model: {kind: vit, patch: 4, width: 16, depth: 2, heads: 2}\n\
                   data: {kind: synthetic_images, image_size: 8, channels: 3, classes: 5, samples: 32, batch_size: 16}\n";
const GPT: &str = "model: {kind: gpt, width: 16, depth: 2, heads: 2}\n\
                   data: {kind: synthetic_tokens, vocab: 32, seq_len: 8, batch_size: 8}\n";
const LLAMA: &str = "model: {kind: llama, width: 16, depth: 2, heads: 2}\n\
                     data: {kind: synthetic_tokens, vocab: 32, seq_len: 8, batch_size: 8}\n";
const TOPOLOGIES: [&str; 4] = ["{kind: residual}", "{kind: hacn}", "{kind: ancre, tau: 0.5}", "{kind: acn}"];

fn exp(backbone: &str, topology: &str) -> Experiment {
    let yaml = format!("name: t\nseed: 5\n{backbone}topology: {topology}\n");
    Experiment::from_str(&yaml, "<test>", &[]).unwrap_or_else(|e| panic!("{e}"))
}

fn build(backbone: &str, topology: &str) -> (Experiment, Model, Batch) {
    let e = exp(backbone, topology);
    let batch = e.data.load().unwrap().train_batch(0).unwrap();
    let model =
        plexus::device::with_seed(5, || Model::new(e.model.as_ref(), e.topology.as_ref(), Device::Cpu, Kind::Float));
    (e, model, batch)
}

fn max_abs(t: &Tensor) -> f64 {
    t.abs().max().double_value(&[])
}

#[test]
fn every_backbone_builds_under_the_paper_topologies_and_a_few_adamw_steps_reduce_the_loss() {
    for (bb, name) in [(VIT, "vit"), (GPT, "gpt"), (LLAMA, "llama")] {
        for topo in TOPOLOGIES {
            let (e, model, batch) = build(bb, topo);
            let task = e.data.info().task;
            let out = model.forward(&batch.input, true);
            let want: Vec<i64> = match name {
                "vit" => vec![16, 5],
                _ => vec![8, 8, 32],
            };
            assert_eq!(out.size(), want, "{name} {topo}: output shape");
            let mut opt = nn::AdamW::default().build(&model.vs, 3e-3).unwrap();
            let first = task.loss(&out, &batch.target).double_value(&[]);
            for _ in 0..8 {
                let loss = task.loss(&model.forward(&batch.input, true), &batch.target);
                opt.backward_step(&loss);
            }
            let last = tch::no_grad(|| task.loss(&model.forward(&batch.input, false), &batch.target)).double_value(&[]);
            assert!(first.is_finite() && last < first - 0.1, "{name} {topo}: loss {first} -> {last}");
        }
    }
}

#[test]
fn language_models_are_causal() {
    for bb in [GPT, LLAMA] {
        for topo in TOPOLOGIES {
            let (_, model, batch) = build(bb, topo);
            let x = batch.input;
            let t = 4;
            let y = x.copy();
            y.narrow(1, t, 1).copy_(&((x.narrow(1, t, 1) + 1).remainder(32)));
            let (a, b) = tch::no_grad(|| (model.forward(&x, false), model.forward(&y, false)));
            let before = max_abs(&(a.narrow(1, 0, t) - b.narrow(1, 0, t)));
            let after = max_abs(&(a.narrow(1, t, 8 - t) - b.narrow(1, t, 8 - t)));
            assert!(before <= 1e-6, "{topo}: changing token {t} moved earlier logits by {before:e}");
            assert!(after > 1e-4, "{topo}: changing token {t} did not change logits from {t} on ({after:e})");
        }
    }
}

#[test]
fn gpt_head_is_tied_to_the_embedding() {
    let (_, model, batch) = build(GPT, "{kind: residual}");
    let vars = model.vs.variables();
    assert!(vars.contains_key("wte.weight"));
    assert!(!vars.keys().any(|k| k.contains("head")), "a separate head weight: {:?}", vars.keys());
    let vocab_sized: Vec<&String> = vars.iter().filter(|(_, v)| v.size() == [32, 16]).map(|(k, _)| k).collect();
    assert_eq!(vocab_sized, [&"wte.weight".to_string()]);
    // Both uses feed its gradient: on an input made of token 0 only, the embedding gives a
    // gradient to row 0 alone, so gradients on every row come from the head.
    let zeros = batch.input.zeros_like();
    let loss = model.forward(&zeros, true).square().sum(Kind::Float);
    loss.backward();
    let g = vars["wte.weight"].grad();
    let rows_with_grad = g.abs().sum_dim_intlist(1, false, Kind::Float).gt(0.0).sum(Kind::Int64).int64_value(&[]);
    assert_eq!(rows_with_grad, 32, "the tied head should give every vocabulary row a gradient");
}

#[test]
fn vit_head_starts_at_zero() {
    for topo in TOPOLOGIES {
        let (_, model, batch) = build(VIT, topo);
        let vars = model.vs.variables();
        assert_eq!(max_abs(&vars["head.weight"]), 0.0);
        assert_eq!(max_abs(&vars["head.bias"]), 0.0);
        let out = tch::no_grad(|| model.forward(&batch.input, false));
        assert_eq!(max_abs(&out), 0.0, "{topo}: initial logits are not exactly 0");
    }
}

fn params(backbone: &str) -> i64 {
    build(backbone, "{kind: residual}").1.num_params()
}

#[test]
fn parameter_counts_match_the_definitions() {
    let (v, d, l) = (32i64, 16i64, 2i64);
    // GPT with biases: wte V·D; per layer LN 2D + qkv 3D²+3D + proj D²+D + LN 2D + fc1 4D²+4D +
    // fc2 4D²+D = 12D² + 13D; final LN 2D; no head (tied).
    assert_eq!(params(GPT), v * d + l * (12 * d * d + 13 * d) + 2 * d);
    assert_eq!(params(GPT), 7104);
    // Without biases: 12D² and the two LN gains per layer, the final gain.
    let nb = GPT.replace("heads: 2}", "heads: 2, bias: false}");
    assert_eq!(params(&nb), v * d + l * (12 * d * d + 2 * d) + d);
    // LLaMA: embedding and untied head V·D each; per layer 4D² + 3·D·F + two RMSNorm gains; final
    // gain. F defaults to ⌊8·16/3⌋ = 42 rounded up to 64.
    let f = 64;
    assert_eq!(params(LLAMA), 2 * v * d + l * (4 * d * d + 3 * d * f + 2 * d) + d);
    // ViT: stem (C·p·p)·D + D, per layer 2 LNs 4D + attention 4D² + 4D + MLP (H = 4D) 2DH + H + D,
    // final LN 2D, head D·classes + classes.
    let (pd, h, c) = (48i64, 64i64, 5i64);
    assert_eq!(params(VIT), pd * d + d + l * (4 * d + 4 * d * d + 4 * d + 2 * d * h + h + d) + 2 * d + d * c + c);
}

#[test]
fn gpt_dropout_is_active_only_in_training() {
    let drop = GPT.replace("heads: 2}", "heads: 2, dropout: 0.5}");
    let (_, model, batch) = build(&drop, "{kind: residual}");
    let (_, plain, _) = build(GPT, "{kind: residual}");
    tch::no_grad(|| {
        let eval = model.forward(&batch.input, false);
        assert_eq!(max_abs(&(&eval - plain.forward(&batch.input, false))), 0.0, "eval differs from dropout 0");
        // Dropout draws from libtorch's generator: under the seed lock, which this binary's tests share.
        let (a, b) =
            plexus::device::with_seed(4, || (model.forward(&batch.input, true), model.forward(&batch.input, true)));
        assert!(max_abs(&(a - b)) > 1e-3, "dropout 0.5 in training should be random");
    });
}

#[test]
fn backbones_reject_the_wrong_kind_of_data() {
    let err = |yaml: &str| {
        let yaml = format!("name: t\n{yaml}topology: {{kind: residual}}\n");
        Experiment::from_str(&yaml, "<test>", &[]).expect_err("should be rejected").to_string()
    };
    let images = "data: {kind: synthetic_images, image_size: 8, channels: 3, classes: 5, samples: 16}\n";
    let tokens = "data: {kind: synthetic_tokens, vocab: 32, seq_len: 8}\n";
    for kind in ["gpt", "llama"] {
        let e = err(&format!("model: {{kind: {kind}, width: 16, depth: 2, heads: 2}}\n{images}"));
        assert!(e.contains("language-model data"), "{e}");
        let e = err(&format!("model: {{kind: {kind}, width: 16, depth: 2, heads: 2, vocab_size: 16}}\n{tokens}"));
        assert!(e.contains("vocab_size"), "{e}");
        let e = err(&format!("model: {{kind: {kind}, width: 16, depth: 2, heads: 16}}\n{tokens}"));
        assert!(e.contains("even head dimension"), "{e}");
    }
    let e = err(&format!("model: {{kind: vit, patch: 4, width: 16, depth: 2, heads: 2}}\n{tokens}"));
    assert!(e.contains("image data"), "{e}");
    let e = err(&format!("model: {{kind: vit, patch: 4, width: 16, depth: 2, heads: 2, num_classes: 7}}\n{images}"));
    assert!(e.contains("num_classes"), "{e}");
}

/// The bf16 precision rule (src/model/layers.rs): inside a branch, activations are bf16 (the last
/// `Linear` of every unit returns bf16); what the topology and the loss see is fp32 — the stem's
/// output, each unit's output as [`Model::with_units`] hands it over, and the model output; the
/// master weights stay fp32. The DLN (`lnn`) has no `Linear` branch and computes in its input's
/// dtype (fp32 throughout).
#[test]
fn under_bf16_branches_compute_in_bf16_and_the_stream_and_outputs_stay_fp32() {
    use plexus::topology::Norm;
    for m in plexus::model::REGISTRY {
        let yaml = format!(
            "name: t\nseed: 5\nprecision: bf16\n{}topology: {{kind: residual}}\n",
            plexus::doctor::tiny_backbone(m.name).unwrap()
        );
        let e = Experiment::from_str(&yaml, "<test>", &[]).unwrap_or_else(|e| panic!("{e}"));
        let batch = e.data.load().unwrap().train_batch(0).unwrap();
        // DiT reads a packed (image, timestep, label) input.
        let input = match m.name {
            "dit" => plexus::model::dit::pack(
                &batch.input,
                &Tensor::full([4], 500, (Kind::Int64, Device::Cpu)),
                &batch.target,
            ),
            _ => batch.input.shallow_clone(),
        };
        let model = plexus::device::with_seed(5, || {
            Model::new(e.model.as_ref(), e.topology.as_ref(), Device::Cpu, Kind::BFloat16)
        });
        let x0 = model.embed(&input, false);
        assert_eq!(x0.kind(), Kind::Float, "{}: the stem's output", m.name);
        let raw = model.backbone.units()[0].forward(&x0, Norm::Default, false).kind();
        let want = if m.name == "lnn" { Kind::Float } else { Kind::BFloat16 };
        assert_eq!(raw, want, "{}: a branch's own output (its last Linear)", m.name);
        let seen = model.with_units(|units| units[0].forward(&x0, Norm::Default, false).kind());
        assert_eq!(seen, Kind::Float, "{}: a unit's output as the topology sees it", m.name);
        let out = model.forward(&input, true);
        assert_eq!(out.kind(), Kind::Float, "{}: the model output", m.name);
        // Any scalar of the output reaches every parameter (DiT's output is not a class score).
        out.square().mean(Kind::Float).backward();
        for (name, p) in model.trainable() {
            assert_eq!(p.kind(), Kind::Float, "{}: parameter {name}", m.name);
            let g = p.grad();
            assert!(g.defined() && g.kind() == Kind::Float, "{}: gradient of {name}", m.name);
            assert!(g.isfinite().all().int64_value(&[]) == 1, "{}: gradient of {name} is not finite", m.name);
        }
    }
}

/// Topologies that add a unit's output once to the fp32 stream (`h + x`, `h + a·x`, `x + α·h`)
/// read it in the branch's compute dtype ([`plexus::topology::Unit::forward_compute`]), so that
/// on a GPU the add reads the bf16 output directly instead of an fp32 copy made by a cast kernel.
/// Type promotion makes that add fp32: the output and every gradient must equal, bit for bit, the
/// same topology run on units that cast their output to fp32 first — on every backbone, on
/// sublayers and on blocks, with H-ACN's long path (which reads `h` twice and keeps the cast).
#[test]
fn adding_a_bf16_unit_output_to_the_stream_equals_casting_it_first_bit_for_bit() {
    use plexus::topology::{Norm, Unit};
    /// A unit whose output is always the fp32 cast, whichever way it is asked for.
    struct CastFirst<'a>(&'a dyn Unit);
    impl Unit for CastFirst<'_> {
        fn forward(&self, x: &Tensor, norm: Norm, train: bool) -> Tensor {
            self.0.forward(x, norm, train)
        }
        fn forward_compute(&self, x: &Tensor, norm: Norm, train: bool) -> Tensor {
            self.0.forward(x, norm, train)
        }
    }
    let topologies = [
        "{kind: residual}",
        "{kind: residual, granularity: block}",
        "{kind: hacn, long: false}",
        "{kind: hacn, long: true, depth_ln: true}",
        "{kind: ancre, tau: 0.5}",
        "{kind: denseformer}",
        "{kind: rezero}",
    ];
    for m in plexus::model::REGISTRY.iter().filter(|m| !matches!(m.name, "lnn" | "dit")) {
        for topology in topologies {
            let yaml = format!(
                "name: t\nseed: 5\nprecision: bf16\n{}topology: {topology}\n",
                plexus::doctor::tiny_backbone(m.name).unwrap()
            );
            let e = Experiment::from_str(&yaml, "<test>", &[]).unwrap_or_else(|e| panic!("{e}"));
            let batch = e.data.load().unwrap().train_batch(0).unwrap();
            let model = plexus::device::with_seed(5, || {
                Model::new(e.model.as_ref(), e.topology.as_ref(), Device::Cpu, Kind::BFloat16)
            });
            // ReZero's α starts at 0, which would hide the branch: move every parameter off its init.
            tch::no_grad(|| {
                for (_, mut p) in model.trainable() {
                    let _ = p.g_add_(&(p.randn_like() * 0.1));
                }
            });
            let case = format!("{} {topology}", m.name);
            // A block's output is the fp32 delta of its sublayers' sum (which adds them in bf16 itself).
            let blocks = e.topology.granularity() == plexus::topology::Granularity::Block;
            let run = |cast_first: bool| {
                for (_, p) in model.trainable() {
                    let mut g = p.grad();
                    if g.defined() {
                        let _ = g.zero_();
                    }
                }
                let x0 = model.embed(&batch.input, true);
                let y = model.with_units(|units| {
                    let wrapped: Vec<CastFirst> = units.iter().map(|&u| CastFirst(u)).collect();
                    let refs: Vec<&dyn Unit> = wrapped.iter().map(|u| u as &dyn Unit).collect();
                    if cast_first {
                        assert_eq!(
                            units[0].forward_compute(&x0, Norm::Default, true).kind(),
                            if blocks { Kind::Float } else { Kind::BFloat16 },
                            "{case}: a unit's own output dtype"
                        );
                    }
                    model.topology.forward(&x0, if cast_first { &refs } else { units }, true)
                });
                let out = model.readout(&y, true);
                out.square().mean(Kind::Float).backward();
                // Parameters the output does not reach (DenseFormer's unused tail) have no gradient.
                let grads: Vec<(String, Option<Tensor>)> = model
                    .trainable()
                    .into_iter()
                    .map(|(n, p)| (n, Some(p.grad()).filter(|g| g.defined()).map(|g| g.copy())))
                    .collect();
                (out, grads)
            };
            let (out_cast, grads_cast) = run(true);
            let (out, grads) = run(false);
            assert!(out.equal(&out_cast), "{case}: output differs from casting first");
            for ((name, g), (_, g_cast)) in grads.iter().zip(&grads_cast) {
                let same = match (g, g_cast) {
                    (Some(g), Some(g_cast)) => g.equal(g_cast),
                    (g, g_cast) => g.is_none() && g_cast.is_none(),
                };
                assert!(same, "{case}: gradient of {name} differs from casting first");
            }
        }
    }
}

/// `PLEXUS_FUSED_KERNELS=cuda-host` sends a CPU step down the paths a GPU step takes: GPT's
/// pre-norms written in bf16, RoPE into heads and the loss on bf16 logits, LLaMA's SwiGLU,
/// Hyper-Connections' dynamic logits, H-ACN's update, AttnRes' depth attention (full and block),
/// each one operator of plexus' own each way (the
/// CUDA kernels' host build), none of them otherwise. What
/// they compute is held to the PyTorch reference by `plexus parity` under that setting
/// (tests/it/parity.rs); this test makes sure the setting is not silently ignored.
#[test]
fn the_gpu_paths_run_on_the_cpu_under_cuda_host_and_only_there() {
    for (backbone, topology, want) in [
        (GPT, "residual", &["plexus::norm_bf16", "plexus::rope_heads", "plexus::cross_entropy"][..]),
        (LLAMA, "residual", &["plexus::swiglu", "plexus::rope_heads", "plexus::cross_entropy"][..]),
        (GPT, "hyper", &["plexus::norm_project"][..]),
        (GPT, "hacn", &["plexus::hacn_step"][..]),
        (GPT, "attnres", &["plexus::history_attend"][..]),
        (GPT, "attnres, blocks: 2", &["plexus::history_attend"][..]),
    ] {
        let e = Experiment::from_str(
            &format!("name: t\nseed: 5\nprecision: bf16\n{backbone}topology: {{kind: {topology}}}\n"),
            "<test>",
            &[],
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let batch = e.data.load().unwrap().train_batch(0).unwrap();
        let model = plexus::device::with_seed(5, || {
            Model::new(e.model.as_ref(), e.topology.as_ref(), Device::Cpu, Kind::BFloat16)
        });
        let step = |host: bool| {
            plexus::native::setting::with_gpu_paths_on_cpu(host, || {
                let (loss, ops) = plexus::native::profile::count_ops(|| {
                    let loss = e.task().loss(&model.forward_compute(&batch.input, true), &batch.target);
                    loss.backward();
                    loss
                })
                .unwrap();
                let names: Vec<String> = ops.by_name.iter().map(|(n, _)| n.clone()).collect();
                (loss.double_value(&[]), names)
            })
        };
        let (composite_loss, composite) = step(false);
        let (host_loss, host) = step(true);
        for name in want {
            for op in [name.to_string(), format!("{name}_backward")] {
                assert!(host.contains(&op), "{backbone}: {op} not run under cuda-host: {host:?}");
                assert!(!composite.contains(&op), "{backbone}: {op} run without cuda-host");
            }
        }
        // The same model and batch: the two losses differ by bf16 roundings only (parity's floor:
        // 4 units of bf16 roundoff, 4 · 2⁻⁸, relative).
        let bound = 4.0 * 2f64.powi(-8) * composite_loss.abs();
        assert!((composite_loss - host_loss).abs() <= bound, "{composite_loss} vs {host_loss}");
    }
}

/// `value_residual` (docs/configs-and-runs.md): `learnable` with `λ = (0, 1)` in every later layer is
/// the backbone without it, bit for bit (output and the gradient of every shared parameter: `0·v₀`
/// adds exact zeros), and `fixed` is `learnable` at its initialisation `(0.5, 0.5)`, bit for bit.
/// `learnable` adds `value_lambda` `[2]` to every layer after the first.
#[test]
fn value_residual_reduces_to_the_backbone_and_its_fixed_form_exactly() {
    for (bb, names) in [(GPT, "blocks.{b}.attn.value_lambda"), (LLAMA, "layers.{b}.self_attn.value_lambda")] {
        let with = |mode: &str| bb.replace("heads: 2}", &format!("heads: 2, value_residual: {mode}}}"));
        let (_, plain, batch) = build(bb, "{kind: residual}");
        let (e, learnable, _) = build(&with("learnable"), "{kind: residual}");
        let (_, fixed, _) = build(&with("fixed"), "{kind: residual}");
        let task = e.data.info().task;
        assert_eq!(learnable.num_params(), plain.num_params() + 2, "{names}: one [2] per layer after the first");
        let lambdas: Vec<String> = (1..2).map(|b| names.replace("{b}", &b.to_string())).collect();
        let vars = learnable.vs.variables();
        for name in &lambdas {
            assert_eq!(Vec::<f32>::try_from(&vars[name]).unwrap(), vec![0.5, 0.5], "{name}: init");
        }
        // The gradients of every parameter after one backward pass, by name.
        let grads = |m: &Model| {
            for v in m.vs.trainable_variables() {
                let mut g = v.grad();
                if g.defined() {
                    let _ = g.zero_();
                }
            }
            task.loss(&m.forward(&batch.input, true), &batch.target).backward();
            m.vs.variables().into_iter().map(|(k, v)| (k, v.grad().copy())).collect::<std::collections::HashMap<_, _>>()
        };
        let same = |a: &Model, b: &Model, what: &str| {
            let (ga, gb) = (grads(a), grads(b));
            let (ya, yb) = tch::no_grad(|| (a.forward(&batch.input, false), b.forward(&batch.input, false)));
            assert!(ya.equal(&yb), "{names}: {what}: outputs differ");
            for (k, g) in &ga {
                assert!(g.equal(&gb[k]), "{names}: {what}: the gradient of {k} differs");
            }
        };
        same(&fixed, &learnable, "fixed vs learnable at init");
        tch::no_grad(|| {
            for name in &lambdas {
                vars[name].shallow_clone().copy_(&Tensor::from_slice(&[0.0f32, 1.0]));
            }
        });
        same(&plain, &learnable, "none vs learnable at λ = (0, 1)");
    }
}

#[test]
fn a_value_residual_that_is_not_one_of_the_three_is_refused_with_the_choices() {
    let yaml = format!(
        "name: t\n{}topology: {{kind: residual}}\n",
        LLAMA.replace("heads: 2}", "heads: 2, value_residual: yes}")
    );
    let err = Experiment::from_str(&yaml, "<test>", &[]).map(|_| ()).expect_err("refused").to_string();
    for want in ["value_residual", "yes", "none", "fixed", "learnable"] {
        assert!(err.contains(want), "the error names {want:?}: {err}");
    }
}
