//! TensorBoard event files, read back with the official `tensorboard` package's event reader
//! (`EventAccumulator`, what `tensorboard --logdir` runs): the scalars are metrics.csv's numbers,
//! a killed and resumed run shows each step once, C is an image per connectivity step, and the
//! config is there as text.

use crate::common;

use common::{plexus, text};
use plexus::experiment::Experiment;
use plexus::run_dir::RunDir;
use plexus::train::{self, TrainOptions};
use std::path::Path;

const TINY: &str = "name: tb\nseed: 3\ndevice: cpu\nmodel: {kind: lnn, depth: 3}\ntopology: {kind: hacn}\n\
data: {kind: whitened_regression, dim: 8, samples: 16, rank: 4}\ntrain: {lr: 0.05, steps: 12}\n\
log: {every: 1, checkpoint_every: 4, connectivity_every: 3}\n";

/// What TensorBoard reads from a run's event files, as JSON: scalars per tag as [step, value],
/// image steps per tag, texts per tag.
fn read_events(run: &Path) -> serde_json::Value {
    let script = r#"
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
ea = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0, "images": 0, "tensors": 0})
ea.Reload()
tags = ea.Tags()
print(json.dumps({
    "scalars": {t: [[e.step, e.value] for e in ea.Scalars(t)] for t in tags["scalars"]},
    "images": {t: [[e.step, e.width, e.height] for e in ea.Images(t)] for t in tags["images"]},
    "texts": {t: [e.tensor_proto.string_val[0].decode() for e in ea.Tensors(t)] for t in tags["tensors"]},
}))
"#;
    let o = std::process::Command::new(plexus::parity::python())
        .args(["-c", script])
        .arg(run.join("tensorboard"))
        .output()
        .unwrap();
    assert!(o.status.success(), "reading the events: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// `(step, loss)` of metrics.csv.
fn losses(run: &Path) -> Vec<(u64, f64)> {
    RunDir::open(run).unwrap().metrics().unwrap().iter().map(|r| (r.step, r.loss)).collect()
}

fn scalar(events: &serde_json::Value, tag: &str) -> Vec<(u64, f64)> {
    events["scalars"][tag]
        .as_array()
        .unwrap_or_else(|| panic!("no scalar {tag}: {events}"))
        .iter()
        .map(|p| (p[0].as_u64().unwrap(), p[1].as_f64().unwrap()))
        .collect()
}

#[test]
fn tensorboard_shows_metrics_csv_once_per_step_even_after_a_kill_and_a_resume() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("tiny.yaml");
    std::fs::write(&path, TINY).unwrap();
    let e = Experiment::from_file(&path, &[]).unwrap();
    let run = tmp.path().join("run");
    let crash = TrainOptions { crash_after: Some(7), ..Default::default() };
    let err = train::train(&e, &RunDir::create(&run).unwrap(), &crash).unwrap_err();
    assert!(err.to_string().contains("simulated crash"), "{err}");
    let resume = TrainOptions { resume: true, ..Default::default() };
    let summary = train::train(&e, &RunDir::open(&run).unwrap(), &resume).unwrap();
    assert_eq!(summary.resumed_from, Some(4));
    let files = std::fs::read_dir(run.join("tensorboard")).unwrap().count();
    assert_eq!(files, 2, "one event file per process");

    let events = read_events(&run);
    let tb = scalar(&events, "train/loss");
    let csv = losses(&run);
    assert_eq!(tb.iter().map(|p| p.0).collect::<Vec<_>>(), (0..=12).collect::<Vec<_>>(), "each step once: {tb:?}");
    // Event files hold float32 (serde_json's parse of the reader's output is within an f64 ulp).
    for ((s, v), (cs, cv)) in tb.iter().zip(&csv) {
        assert_eq!((s, *v as f32), (cs, *cv as f32), "step {s}");
    }
    assert_eq!(scalar(&events, "train/gamma").len(), 13);
    let images: Vec<u64> =
        events["images"]["connectivity/C"].as_array().unwrap().iter().map(|p| p[0].as_u64().unwrap()).collect();
    assert_eq!(images, [0, 3, 6, 9, 12], "C at every connectivity step, once each");
    let config = events["texts"]["config"][0].as_str().unwrap();
    assert!(config.contains("kind: hacn") && config.contains("steps: 12"), "{config}");
}

/// `log.tensorboard: false` writes no event files; under `--nproc 2` rank 0 alone writes them.
#[test]
fn tensorboard_is_optional_and_rank_zero_alone_writes_it() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("tiny.yaml");
    std::fs::write(&path, TINY).unwrap();
    let c = path.to_str().unwrap();
    let o = plexus(&["train", c, "--out", "off", "--set", "log.tensorboard=false"], tmp.path());
    assert!(o.status.success(), "{:?}", text(&o));
    assert!(!tmp.path().join("off/tensorboard").exists());
    let o = plexus(&["train", c, "--out", "dp", "--nproc", "2", "--set", "data.samples=32"], tmp.path());
    assert!(o.status.success(), "{:?}", text(&o));
    assert_eq!(std::fs::read_dir(tmp.path().join("dp/tensorboard")).unwrap().count(), 1);
    let events = read_events(&tmp.path().join("dp"));
    let tb = scalar(&events, "train/loss");
    let csv = losses(&tmp.path().join("dp"));
    assert_eq!(tb.len(), csv.len());
    assert!(tb.iter().zip(&csv).all(|(a, b)| a.0 == b.0 && a.1 as f32 == b.1 as f32), "{tb:?} vs {csv:?}");
}

/// An RL run killed after a checkpoint and resumed: TensorBoard's success curve is metrics.csv's,
/// each evaluation once.
#[test]
fn an_rl_run_logs_its_evaluations_once_after_a_kill_and_a_resume() {
    use plexus::rl::config::RlExperiment;
    use plexus::rl::trainer::{self, RlOptions};
    let tmp = tempfile::tempdir().unwrap();
    let cfg = "name: rl\nseed: 1\ndevice: cpu\nenv: {layout: u, num_envs: 8, episode_length: 20}\n\
               network: {width: 16, depth: 4, block_size: 4, repr_dim: 8, topology: {kind: residual}}\n\
               train: {env_steps: 800, prefill_env_steps: 160, batch_size: 32, updates_per_rollout: 2, replay_episodes: 64}\n\
               log: {eval_every: 320, eval_envs: 8, checkpoint_every: 160}\n";
    let path = tmp.path().join("rl.yaml");
    std::fs::write(&path, cfg).unwrap();
    let exp = RlExperiment::from_file(&path, &[]).unwrap();
    let run = tmp.path().join("run");
    let crash = RlOptions { crash_after: Some(640), ..Default::default() };
    assert!(trainer::train(&exp, &run, &crash).unwrap_err().to_string().contains("simulated crash"));
    trainer::train(&exp, &run, &RlOptions { resume: true, ..Default::default() }).unwrap();
    let events = read_events(&run);
    let tb = scalar(&events, "eval/success");
    let text = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    let csv: Vec<(u64, f64)> = text
        .lines()
        .skip(1)
        .map(|l| {
            let c: Vec<&str> = l.split(',').collect();
            (c[0].parse().unwrap(), c[2].parse().unwrap())
        })
        .collect();
    assert_eq!(tb.len(), csv.len(), "{tb:?} vs {csv:?}");
    assert!(tb.iter().zip(&csv).all(|(a, b)| a.0 == b.0 && a.1 as f32 == b.1 as f32), "{tb:?} vs {csv:?}");
    assert!(events["scalars"]["train/critic_loss"].as_array().is_some_and(|v| !v.is_empty()), "{events}");
}

/// `plexus analyze` adds Δ_t (over the training steps) and the early exits' loss (over the units
/// they keep) to the run's TensorBoard, with delta.csv's and layerwise.csv's numbers; a second
/// analysis replaces its file (each point once) and leaves the training's events as they were.
#[test]
fn analyze_adds_delta_t_and_the_exits_to_tensorboard_once() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("tiny.yaml");
    std::fs::write(&path, TINY).unwrap();
    let e = Experiment::from_file(&path, &[]).unwrap();
    let run = tmp.path().join("run");
    train::train(&e, &RunDir::create(&run).unwrap(), &TrainOptions::default()).unwrap();
    let opts = plexus::analysis::AnalyzeOptions { repeats: 1, ..Default::default() };
    for _ in 0..2 {
        plexus::analysis::analyze(&run, &opts).unwrap();
    }
    let events = read_events(&run);
    let read_pairs = |file: &str| -> Vec<(u64, f64)> {
        let text = std::fs::read_to_string(run.join(file)).unwrap();
        text.lines()
            .skip(1)
            .map(|l| {
                let mut f = l.split(',');
                (f.next().unwrap().parse().unwrap(), f.next().unwrap().parse().unwrap())
            })
            .collect()
    };
    let delta = read_pairs("delta.csv");
    let tb = scalar(&events, "analysis/delta_t");
    assert_eq!(tb.len(), delta.len(), "{tb:?} vs {delta:?}");
    for ((s, v), (cs, cv)) in tb.iter().zip(&delta) {
        assert_eq!((s, *v as f32), (cs, *cv as f32));
    }
    let exits = read_pairs("layerwise.csv");
    let tb = scalar(&events, "analysis/exit_loss");
    assert_eq!(tb.iter().map(|p| p.0).collect::<Vec<_>>(), exits.iter().map(|p| p.0).collect::<Vec<_>>());
    assert!(tb.iter().zip(&exits).all(|(a, b)| a.1 as f32 == b.1 as f32), "{tb:?} vs {exits:?}");
    assert_eq!(scalar(&events, "train/loss").len(), 13, "the training's events kept");
    assert_eq!(std::fs::read_dir(run.join("tensorboard")).unwrap().count(), 2);
}

/// `plexus sweep`: each finished run carries its grid point and seed as TensorBoard hparams (the
/// HPARAMS dashboard's table), numbers as numbers, grouped by point.
#[test]
fn a_sweeps_runs_carry_their_grid_point_as_tensorboard_hparams() {
    let tmp = tempfile::tempdir().unwrap();
    let config = common::repo().join("configs/lnn/fig2b/1-none.yaml");
    let args = ["sweep", config.to_str().unwrap(), "--grid", "train.lr=0.01,0.02", "--seeds", "3"];
    let o = plexus(&[&args[..], &["--set", "train.steps=4", "--quiet", "--out", "sw"]].concat(), tmp.path());
    assert!(o.status.success(), "{:?}", text(&o));
    let script = r#"
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2
ea = EventAccumulator(sys.argv[1])
ea.Reload()
content = ea.PluginTagToContent("hparams")["_hparams_/session_start_info"]
info = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
print(json.dumps({"hparams": {k: v.number_value for k, v in info.hparams.items()}, "group": info.group_name}))
"#;
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(tmp.path().join("sw")).unwrap() {
        let run = entry.unwrap().path();
        if !run.join("tensorboard").is_dir() {
            continue;
        }
        let o = std::process::Command::new(plexus::parity::python())
            .args(["-c", script])
            .arg(run.join("tensorboard"))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let lr = v["hparams"]["train.lr"].as_f64().unwrap();
        assert_eq!(v["hparams"]["seed"].as_f64(), Some(3.0), "{v}");
        assert_eq!(v["group"].as_str().unwrap(), format!("train.lr={lr}"), "{v}");
        seen.push(lr);
    }
    seen.sort_by(f64::total_cmp);
    assert_eq!(seen, [0.01, 0.02]);
}
