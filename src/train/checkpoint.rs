//! Resumable checkpoints. A checkpoint at step N (N updates done) is three files in
//! `checkpoints/`: `step_N.safetensors` (model, PyTorch `state_dict` names), `step_N.optim.safetensors`
//! (optimizer state) and `step_N.json` (trainer state). Each is written atomically and the JSON
//! last: it is the commit marker, so a run killed mid-checkpoint leaves the previous checkpoint as
//! the latest loadable one. The RNG needs no saving: the trainer reseeds libtorch from
//! `(seed, step)` every step, and data batches are addressed by index.

use crate::run_dir::{atomic_write, atomic_write_with, RunDir};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use tch::Tensor;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainerState {
    /// Optimizer updates done.
    pub step: u64,
    /// Index of the next training batch.
    pub data_index: u64,
    pub model_file: String,
    pub optim_file: String,
}

fn dir(run: &RunDir) -> PathBuf {
    run.path.join("checkpoints")
}

/// Writes the checkpoint for `step` and keeps only the newest `keep`.
pub fn save(
    run: &RunDir,
    state: &TrainerState,
    model: &tch::nn::VarStore,
    optim: &[(String, Tensor)],
    keep: usize,
) -> Result<()> {
    let d = dir(run);
    atomic_write_with(&d.join(&state.model_file), |p| {
        model.save(p).with_context(|| format!("saving {}", p.display()))
    })?;
    atomic_write_with(&d.join(&state.optim_file), |p| {
        let named: Vec<(&str, &Tensor)> = optim.iter().map(|(n, t)| (n.as_str(), t)).collect();
        Tensor::write_safetensors(&named, p).with_context(|| format!("saving {}", p.display()))
    })?;
    atomic_write(&d.join(format!("step_{}.json", state.step)), serde_json::to_string_pretty(state)?.as_bytes())?;
    let mut all = list(run)?;
    while all.len() > keep {
        let (_, old) = all.remove(0);
        // Marker first: a half-pruned checkpoint is never mistaken for a complete one.
        std::fs::remove_file(d.join(format!("step_{}.json", old.step)))?;
        let _ = std::fs::remove_file(d.join(&old.model_file));
        let _ = std::fs::remove_file(d.join(&old.optim_file));
    }
    Ok(())
}

/// Complete checkpoints (those with a JSON marker), oldest first.
pub fn list(run: &RunDir) -> Result<Vec<(PathBuf, TrainerState)>> {
    let d = dir(run);
    if !d.is_dir() {
        return Ok(Vec::new());
    }
    let mut v = Vec::new();
    for e in std::fs::read_dir(&d)? {
        let p = e?.path();
        let is_marker = p.extension().is_some_and(|x| x == "json")
            && p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("step_"));
        if is_marker {
            let s: TrainerState = serde_json::from_str(&std::fs::read_to_string(&p)?)
                .with_context(|| format!("reading checkpoint marker {}", p.display()))?;
            v.push((p, s));
        }
    }
    v.sort_by_key(|(_, s)| s.step);
    Ok(v)
}

/// The newest complete checkpoint.
pub fn latest(run: &RunDir) -> Result<Option<TrainerState>> {
    Ok(list(run)?.pop().map(|(_, s)| s))
}

/// Loads a checkpoint's model weights into `vs` and returns its optimizer state.
pub fn load(
    run: &RunDir,
    state: &TrainerState,
    vs: &mut tch::nn::VarStore,
) -> Result<std::collections::HashMap<String, Tensor>> {
    let d = dir(run);
    vs.load(d.join(&state.model_file)).with_context(|| format!("loading {}", d.join(&state.model_file).display()))?;
    let optim = Tensor::read_safetensors(d.join(&state.optim_file))
        .with_context(|| format!("loading {}", d.join(&state.optim_file).display()))?;
    Ok(optim.into_iter().collect())
}
