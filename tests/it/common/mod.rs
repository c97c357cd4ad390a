//! Helpers shared by the integration tests.
#![allow(dead_code)]

use plexus::experiment::Experiment;
use plexus::run_dir::RunDir;
use plexus::train::{self, Summary, TrainOptions};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Trains a config from the repository into `dir`, with overrides.
pub fn train_config(config: &str, dir: &Path, overrides: &[&str]) -> Summary {
    let ov: Vec<plexus::config::Override> = overrides.iter().map(|s| s.parse().unwrap()).collect();
    let exp = Experiment::from_file(&repo().join(config), &ov).unwrap_or_else(|e| panic!("{e}"));
    let run = RunDir::create(dir).unwrap();
    train::train(&exp, &run, &TrainOptions::default()).unwrap()
}

/// Runs the plexus binary.
pub fn plexus(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_plexus")).args(args).current_dir(cwd).output().expect("run plexus")
}

pub fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

pub fn read_losses(run: &Path) -> Vec<(f64, f64)> {
    plexus::report::read_losses(run).unwrap()
}

/// The tiny config (model and data sections) of a backbone: its registry entry's `tiny`.
pub fn tiny_backbone(name: &str) -> &'static str {
    plexus::doctor::tiny_backbone(name).unwrap_or_else(|| panic!("no backbone `{name}` in plexus::model::REGISTRY"))
}

/// Every `.rs` file below `dir`, recursively, appended to `out`.
pub fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// A goal-conditioned RL run of seconds on CPU (8 environments, a 4-layer residual encoder, 320
/// environment steps, evaluated at 160 and 320): the run the resume and sweep tests extend.
pub const TINY_RL_CONFIG: &str = "name: t\nseed: 1\ndevice: cpu\nenv: {layout: u, num_envs: 8, episode_length: 20, \
     max_step: 0.1, goal_radius: 0.1}\nnetwork: {width: 16, depth: 4, block_size: 4, repr_dim: 8, topology: {kind: \
     residual}}\ntrain: {env_steps: 320, batch_size: 32, updates_per_rollout: 2, replay_episodes: 64}\n\
     log: {eval_every: 160, eval_envs: 8}\n";
