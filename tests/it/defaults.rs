//! The default of every option: parsing a section that leaves the options out gives exactly the
//! spec that spelling the documented defaults out gives, for every data kind, backbone, topology
//! with options, and the `train` / `log` sections. A changed default, or one lost in a refactor,
//! fails here; so does a required option that stops being required.

use plexus::config::{Config, LogConfig, TrainConfig};
use plexus::data::{self, DataInfo, Task};
use plexus::model;
use plexus::topology::{self, StackInfo};

fn yaml(s: &str) -> serde_yaml::Mapping {
    serde_yaml::from_str(s).unwrap()
}

/// `implicit` (the defaults left out) and `explicit` (the defaults written out) parse to the same
/// spec, and one changed value gives another spec (so the comparison sees the options).
fn same<T: std::fmt::Debug, E: std::fmt::Debug>(
    what: &str,
    parse: impl Fn(&serde_yaml::Mapping) -> Result<T, E>,
    implicit: &str,
    explicit: &str,
    changed: &str,
) {
    let show = |s: &str| format!("{:?}", parse(&yaml(s)).unwrap_or_else(|e| panic!("{what} {s}: {e:?}")));
    assert_eq!(show(implicit), show(explicit), "{what}: the defaults are not {explicit}");
    assert_ne!(show(implicit), show(changed), "{what}: the spec does not show its options");
}

#[test]
fn data_defaults_are_the_documented_ones() {
    let d = |kind: &'static str| move |m: &serde_yaml::Mapping| data::parse(kind, m);
    same(
        "whitened_regression",
        d("whitened_regression"),
        "{}",
        "{dim: 16, samples: 64, rank: 8, sigma_min: 1.0, sigma_max: 2.0, seed: 0}",
        "{dim: 16, samples: 64, rank: 7}",
    );
    same(
        "synthetic_images",
        d("synthetic_images"),
        "{}",
        "{image_size: 8, channels: 3, classes: 10, samples: 256, noise: 1.0, batch_size: 32, seed: 0}",
        "{batch_size: 31}",
    );
    same(
        "synthetic_tokens",
        d("synthetic_tokens"),
        "{}",
        "{vocab: 64, seq_len: 32, batch_size: 16, eval_batches: 4, seed: 0}",
        "{eval_batches: 5}",
    );
    same(
        "cifar10",
        d("cifar10"),
        "{}",
        "{format: auto, normalize: true, augment: none, batch_size: 64, seed: 0}",
        "{normalize: false}",
    );
    same(
        "mnist",
        d("mnist"),
        "{}",
        "{dataset: fashion-mnist, normalize: true, batch_size: 64, seed: 0}",
        "{dataset: mnist}",
    );
    same(
        "text",
        d("text"),
        "{file: a.txt}",
        "{file: a.txt, tokenizer: char, seq_len: 128, batch_size: 16, val_fraction: 0.1, eval_batches: 8, seed: 0}",
        "{file: a.txt, val_fraction: 0.2}",
    );
    same(
        "imagefolder",
        d("imagefolder"),
        "{dir: x, classes: 3}",
        "{dir: x, classes: 3, train_split: train, eval_split: val, image_size: 224, normalize: true, \
         augment: random_resized_crop,
 batch_size: 64, eval_samples: 1000, skip_bad: false, seed: 0}",
        "{dir: x, classes: 3, eval_samples: 999}",
    );
    same(
        "tokens",
        d("tokens"),
        "{dir: owt}",
        "{dir: owt, seq_len: 1024, batch_size: 12, vocab: 50304, eval_batches: 20, seed: 0}",
        "{dir: owt, vocab: 50257}",
    );
}

#[test]
fn required_data_options_are_still_required() {
    for (kind, options, field) in [
        ("text", "{}", "file"),
        ("imagefolder", "{classes: 3}", "dir"),
        ("imagefolder", "{}", "dir"),
        ("imagefolder", "{dir: x}", "classes"),
        ("tokens", "{}", "dir"),
    ] {
        let e = data::parse(kind, &yaml(options)).unwrap_err();
        assert_eq!((e.key.as_str(), e.value.as_deref()), ("", None), "{kind} {options}: {e:?}");
        assert_eq!(e.allowed, format!("missing field `{field}`"), "{kind} {options}");
    }
}

fn images(c: usize, s: usize, classes: usize) -> DataInfo {
    DataInfo { input_shape: vec![c, s, s], output_dim: classes, task: Task::Classification }
}

fn tokens(seq_len: usize, vocab: usize) -> DataInfo {
    DataInfo { input_shape: vec![seq_len], output_dim: vocab, task: Task::LanguageModel }
}

#[test]
fn backbone_defaults_are_the_documented_ones() {
    let m = |kind: &'static str, info: DataInfo| move |o: &serde_yaml::Mapping| model::parse(kind, o, &info);
    let vec16 = DataInfo { input_shape: vec![16], output_dim: 16, task: Task::HalfSumSquares };
    same("lnn", m("lnn", vec16.clone()), "{depth: 3}", "{depth: 3, init_std: 0.05}", "{depth: 3, init_std: 0.1}");
    same("mlp", m("mlp", vec16), "{depth: 3}", "{depth: 3, width: 64}", "{depth: 3, width: 32}");
    same(
        "mixer",
        m("mixer", images(3, 32, 10)),
        "{depth: 2}",
        "{depth: 2, patch: 4, width: 128, token_hidden: 64, channel_hidden: 512}",
        "{depth: 2, token_hidden: 32}",
    );
    same(
        "vit",
        m("vit", images(3, 32, 10)),
        "{depth: 2}",
        "{depth: 2, patch: 16, width: 384, heads: 6}",
        "{depth: 2, heads: 12}",
    );
    same(
        "gpt",
        m("gpt", tokens(32, 64)),
        "{depth: 2}",
        "{depth: 2, width: 768, heads: 12, dropout: 0.0, bias: true}",
        "{depth: 2, bias: false}",
    );
    same("llama", m("llama", tokens(32, 64)), "{depth: 2}", "{depth: 2, width: 512, heads: 8}", "{depth: 2, heads: 4}");
}

#[test]
fn backbones_still_require_their_depth() {
    let vec16 = DataInfo { input_shape: vec![16], output_dim: 16, task: Task::HalfSumSquares };
    for (kind, info) in [
        ("lnn", vec16.clone()),
        ("mlp", vec16),
        ("mixer", images(3, 32, 10)),
        ("vit", images(3, 32, 10)),
        ("gpt", tokens(32, 64)),
        ("llama", tokens(32, 64)),
    ] {
        let e = model::parse(kind, &yaml("{}"), &info).unwrap_err();
        assert_eq!((e.key.as_str(), e.value.as_deref()), ("", None), "{kind}: {e:?}");
        assert_eq!(e.allowed, "missing field `depth`", "{kind}");
    }
}

#[test]
fn topology_defaults_are_the_documented_ones() {
    let stack = StackInfo { sublayers: 8, block_size: 2, width: 32, pre_norm: true, ports: false };
    let t = |kind: &'static str| move |o: &serde_yaml::Mapping| topology::parse(kind, o, stack);
    same("hyper", t("hyper"), "{}", "{n: 4, dynamic: true}", "{n: 2}");
    same("rezero", t("rezero"), "{}", "{norm: off}", "{norm: keep}");
    same(
        "ancre",
        t("ancre"),
        "{}",
        "{normalization: ingoing, tau: 0.01, learnable: true, weights: softmax, placement: block}",
        "{tau: 1.0}",
    );
    same(
        "ancre tsallis",
        t("ancre"),
        "{tsallis: {weight: 0.1}}",
        "{tsallis: {weight: 0.1, q: 2.0}}",
        "{tsallis: {weight: 0.1, q: 1.5}}",
    );
    same("ancre tsallis weight", t("ancre"), "{tsallis: {}}", "{tsallis: {weight: 0.0}}", "{tsallis: {weight: 0.1}}");
    same("layercomb", t("layercomb"), "{}", "{init: residual}", "{init: acn}");
    same(
        "hacn",
        t("hacn"),
        "{}",
        "{init: {kind: normal, mu: 0.25, sigma: 0.005}, depth_ln: false, long: true, convention: alpha, learnable: true}",
        "{long: false}",
    );
    same(
        "hacn half_layers",
        t("hacn"),
        "{init: {kind: half_layers}}",
        "{init: {kind: half_layers, mu_first: 0.4, mu_second: 0.15, sigma: 0.005}}",
        "{init: {kind: half_layers, mu_first: 0.5}}",
    );
    same(
        "hacn exp_decay",
        t("hacn"),
        "{init: {kind: exp_decay}}",
        "{init: {kind: exp_decay, mu_start: 0.25, mu_end: 0.1, sigma: 0.005}}",
        "{init: {kind: exp_decay, mu_end: 0.2}}",
    );
    same("laurel", t("laurel"), "{}", "{variant: rw, rank: 4, history: 2}", "{variant: lr}");
    same("mhc", t("mhc"), "{}", "{n: 4, sinkhorn_iters: 20, init: residual}", "{init: symmetric}");
    same("denseformer", t("denseformer"), "{}", "{dilation: 1, period: 1}", "{dilation: 2}");
}

#[test]
fn train_and_log_defaults_are_the_documented_ones() {
    let head = "name: t\nmodel: {kind: lnn, depth: 3}\ntopology: {kind: plain}\ndata: {kind: whitened_regression}\n";
    let parse = |s: &str| serde_yaml::from_str::<Config>(&format!("{head}{s}")).unwrap();
    let implicit = parse("");
    let explicit = parse(
        "seed: 0\ndevice: auto\nprecision: fp32\ntf32: false\n\
         train: {optimizer: gd, lr: 0.001, steps: 1000, weight_decay: 0.0, betas: [0.9, 0.999], eps: 1.0e-8, \
         schedule: constant, warmup_steps: 0, min_lr_ratio: 0.0, accumulation: 1, topology_lr_mult: 1.0, topology_decay: false}\n\
         log: {every: 10, connectivity_every: 0, eval_every: 0, checkpoint_every: 0, keep_checkpoints: 2}\n",
    );
    assert_eq!(implicit, explicit);
    assert_eq!(implicit.train, TrainConfig::default());
    assert_eq!(implicit.log, LogConfig::default());
    assert_ne!(implicit.train, parse("train: {steps: 999}\n").train);
}
