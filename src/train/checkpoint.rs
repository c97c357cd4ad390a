//! Resumable checkpoints. A checkpoint at step N (N updates done) is three files in
//! `checkpoints/`: `step_N.safetensors` (model, PyTorch `state_dict` names), `step_N.optim.safetensors`
//! (optimizer state) and `step_N.json` (trainer state). Each is written atomically and the JSON
//! last: it is the commit marker, so a run killed mid-checkpoint leaves the previous checkpoint as
//! the latest loadable one. The RNG needs no saving: the trainer reseeds libtorch from
//! `(seed, step)` every step, and data batches are addressed by index.
//!
//! The marker records the CRC-32 of both safetensors files, checked when the checkpoint is loaded:
//! a flipped bit or a truncated file is an error naming the file, not a silently different model.
//! Weights are checked against the model's parameter names and shapes before they are copied in.

use crate::run_dir::{atomic_write, atomic_write_with, RunDir};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use tch::Tensor;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainerState {
    /// Optimizer updates done.
    pub step: u64,
    /// Index of the next training batch.
    pub data_index: u64,
    pub model_file: String,
    pub optim_file: String,
    /// CRC-32 of the model file's bytes (absent in checkpoints written before checksums).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_crc32: Option<u32>,
    /// CRC-32 of the optimizer file's bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optim_crc32: Option<u32>,
}

/// CRC-32 of a file's bytes.
fn crc32_of(path: &Path) -> Result<u32> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let mut crc = flate2::Crc::new();
    crc.update(&bytes);
    Ok(crc.sum())
}

/// Checks `path` against the checksum recorded in its marker.
fn verify(path: &Path, expected: Option<u32>, marker: &Path) -> Result<()> {
    if let Some(want) = expected {
        let got = crc32_of(path)?;
        if got != want {
            bail!(
                "checkpoint file {} is corrupt: its CRC-32 is {got:08x}, but {} recorded {want:08x} when it was \
                 written (a flipped bit or a damaged copy); delete {} to resume from the checkpoint before it",
                path.display(),
                marker.display(),
                marker.display()
            );
        }
    }
    Ok(())
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
    let mut state = state.clone();
    let mut model_crc = None;
    atomic_write_with(&d.join(&state.model_file), |p| {
        model.save(p)?;
        model_crc = Some(crc32_of(p)?);
        Ok(())
    })?;
    let mut optim_crc = None;
    atomic_write_with(&d.join(&state.optim_file), |p| {
        let named: Vec<(&str, &Tensor)> = optim.iter().map(|(n, t)| (n.as_str(), t)).collect();
        Tensor::write_safetensors(&named, p)?;
        optim_crc = Some(crc32_of(p)?);
        Ok(())
    })?;
    (state.model_crc32, state.optim_crc32) = (model_crc, optim_crc);
    atomic_write(&d.join(format!("step_{}.json", state.step)), serde_json::to_string_pretty(&state)?.as_bytes())?;
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
        // `step_<N>.json` exactly (other JSON files may sit beside the markers, e.g. RL loop states).
        let is_marker = p.file_name().is_some_and(|n| {
            let n = n.to_string_lossy();
            n.strip_prefix("step_").and_then(|r| r.strip_suffix(".json")).is_some_and(|v| v.parse::<u64>().is_ok())
        });
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

/// Loads a checkpoint's model weights into `vs` and returns its optimizer state, after checking
/// both files against the marker's checksums.
pub fn load(
    run: &RunDir,
    state: &TrainerState,
    vs: &mut tch::nn::VarStore,
) -> Result<std::collections::HashMap<String, Tensor>> {
    let d = dir(run);
    let marker = d.join(format!("step_{}.json", state.step));
    let (model_file, optim_file) = (d.join(&state.model_file), d.join(&state.optim_file));
    verify(&model_file, state.model_crc32, &marker)?;
    verify(&optim_file, state.optim_crc32, &marker)?;
    load_weights(vs, &model_file)?;
    let optim = Tensor::read_safetensors(&optim_file)
        .map_err(|e| anyhow::anyhow!("loading {}: {}", optim_file.display(), torch_message(&e)))?;
    Ok(optim.into_iter().collect())
}

/// The first line of a libtorch error, without the C++ frames that follow it.
pub fn torch_message(e: &tch::TchError) -> String {
    let s = e.to_string();
    let s = s.split("\nException raised from").next().unwrap_or(&s);
    s.lines().take(3).collect::<Vec<_>>().join(" ")
}

/// Loads the safetensors weights at `path` into `vs`, after checking that they hold exactly the
/// model's parameters with the model's shapes (a mismatch names the parameter and both shapes).
pub fn load_weights(vs: &mut tch::nn::VarStore, path: &Path) -> Result<()> {
    let saved = Tensor::read_safetensors(path)
        .map_err(|e| anyhow::anyhow!("loading {}: {}", path.display(), torch_message(&e)))?;
    let saved: std::collections::HashMap<String, Tensor> = saved.into_iter().collect();
    let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, var) in &vars {
        match saved.get(name) {
            None => bail!(
                "{} does not match this model: it has no parameter `{name}` (shape {:?}); was it written by another \
                 config?",
                path.display(),
                var.size()
            ),
            Some(t) if t.size() != var.size() => bail!(
                "{} does not match this model: parameter `{name}` has shape {:?} in the file but {:?} in the model \
                 (was the run trained with another width or depth?)",
                path.display(),
                t.size(),
                var.size()
            ),
            _ => {}
        }
    }
    if let Some(extra) = saved.keys().filter(|k| !vars.iter().any(|(n, _)| n == *k)).min() {
        bail!("{} does not match this model: it has a parameter `{extra}` that the model does not", path.display());
    }
    vs.load(path).map_err(|e| anyhow::anyhow!("loading {}: {}", path.display(), torch_message(&e)))
}
