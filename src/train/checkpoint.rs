//! Resumable checkpoints. A checkpoint at step N (N updates done) is three files in
//! `checkpoints/`: `step_N.safetensors` (model, PyTorch `state_dict` names), `step_N.optim.safetensors`
//! (optimizer state) and `step_N.json` (trainer state). Each is written atomically and the JSON
//! last: it is the commit marker, so a run killed mid-checkpoint leaves the previous checkpoint as
//! the latest loadable one. The RNG needs no saving: the trainer reseeds libtorch from
//! `(seed, step)` every step, and data batches are addressed by index.
//!
//! The marker records the CRC-32 of both safetensors files (and of any other file the trainer
//! keeps with the checkpoint, [`TrainerState::files_crc32`]), checked when the checkpoint is loaded:
//! a flipped bit or a truncated file is an error naming the file, not a silently different model.
//! Weights are checked against the model's parameter names and shapes before they are copied in.
//!
//! The weights a finished run leaves (`final.safetensors`, `final_ema.safetensors`) are written
//! with [`save_weights`], which records each file's CRC-32 in `weights.json` beside it;
//! [`load_final`] checks it, and refuses weights that are not finite, so `analyze`, `sample`, `fd`
//! and `connectivity` never report numbers of a damaged or diverged model.

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
    /// CRC-32 of every other file of the checkpoint that a resume reads, by name in
    /// `checkpoints/` (RL: the loop state and the replay buffer); see [`crc32_of`].
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub files_crc32: std::collections::BTreeMap<String, u32>,
}

impl TrainerState {
    /// The marker of the checkpoint at `step` (`step_<step>.safetensors` and
    /// `step_<step>.optim.safetensors`, whose checksums [`save`] fills in), `data_index` into the
    /// data stream, and a trainer's own `files` with their checksums.
    pub fn at(step: u64, data_index: u64, files: std::collections::BTreeMap<String, u32>) -> Self {
        TrainerState {
            step,
            data_index,
            model_file: format!("step_{step}.safetensors"),
            optim_file: format!("step_{step}.optim.safetensors"),
            model_crc32: None,
            optim_crc32: None,
            files_crc32: files,
        }
    }
}

/// CRC-32 of a file's bytes (also for [`TrainerState::files_crc32`]).
pub fn crc32_of(path: &Path) -> Result<u32> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let mut crc = flate2::Crc::new();
    crc.update(&bytes);
    Ok(crc.sum())
}

/// Checks `path` against the checksum recorded in its marker.
fn verify(path: &Path, expected: Option<u32>, marker: &Path) -> Result<()> {
    if expected.is_some() && !path.is_file() {
        bail!(
            "checkpoint file {} is missing, though {} lists it; delete {} to resume from the checkpoint before it",
            path.display(),
            marker.display(),
            marker.display()
        );
    }
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

/// Writes the checkpoint for `step` and keeps only the newest `keep` (with the files each one lists
/// in `files_crc32`: every trainer prunes through here).
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
        // A trainer's own files of that checkpoint (the RL loop state and replay buffer).
        for name in old.files_crc32.keys() {
            // Plain names in the checkpoint folder only, whatever a damaged marker says.
            if Path::new(name).file_name().is_some_and(|n| n == name.as_str()) {
                let _ = std::fs::remove_file(d.join(name));
            }
        }
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

/// The model weights of the complete checkpoint at `step` (for sampling or measuring a run part
/// way through training), checked against the CRC-32 its marker recorded; an error lists the steps
/// there are.
pub fn weights_at_step(run: &RunDir, step: u64) -> Result<PathBuf> {
    let all = list(run)?;
    let Some((_, state)) = all.iter().find(|(_, s)| s.step == step) else {
        let steps: Vec<String> = all.iter().map(|(_, s)| s.step.to_string()).collect();
        bail!(
            "--step {step}: {} has no complete checkpoint at step {step}; it has {} (a run keeps the last \
             log.keep_checkpoints of them, every log.checkpoint_every steps)",
            dir(run).display(),
            if steps.is_empty() { "none".to_string() } else { format!("steps {}", steps.join(", ")) }
        );
    };
    let path = dir(run).join(&state.model_file);
    if let Some(want) = state.model_crc32 {
        let got = crc32_of(&path)?;
        if got != want {
            bail!("{} is corrupt: CRC-32 {got:08x}, but its checkpoint marker recorded {want:08x}", path.display());
        }
    }
    Ok(path)
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
    for (name, &crc) in &state.files_crc32 {
        verify(&d.join(name), Some(crc), &marker)?;
    }
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

/// The file beside final weights that records their checksums: `{"<file name>": {"crc32":
/// "xxxxxxxx", "bytes": N}}`.
pub const WEIGHTS_MANIFEST: &str = "weights.json";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct Recorded {
    crc32: String,
    bytes: u64,
}

fn manifest_path(weights: &Path) -> PathBuf {
    weights.parent().unwrap_or(Path::new(".")).join(WEIGHTS_MANIFEST)
}

fn read_manifest(path: &Path) -> Result<std::collections::BTreeMap<String, Recorded>> {
    crate::input_file::read_json(path, "a weights manifest")
}

/// Writes weights to `path` atomically with `write` (given a temporary path), then records the
/// file's CRC-32 and size in `weights.json` in the same directory (also atomically).
pub fn save_weights(path: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let mut recorded = None;
    atomic_write_with(path, |p| {
        write(p).map_err(|e| plain_io_error(e, path))?;
        let bytes = std::fs::metadata(p)?.len();
        recorded = Some(Recorded { crc32: format!("{:08x}", crc32_of(p)?), bytes });
        Ok(())
    })?;
    let manifest = manifest_path(path);
    let mut all = if manifest.is_file() { read_manifest(&manifest)? } else { Default::default() };
    let name = path.file_name().expect("a weights file name").to_string_lossy().into_owned();
    all.insert(name, recorded.expect("written"));
    atomic_write(&manifest, (serde_json::to_string_pretty(&all)? + "\n").as_bytes())
}

/// An I/O error of tch's safetensors writer (a full disk) said plainly: its own text is Rust debug
/// output (`IoError(Os { code: 28, … })`).
fn plain_io_error(e: anyhow::Error, path: &Path) -> anyhow::Error {
    match e.downcast_ref::<tch::TchError>() {
        Some(tch::TchError::SafeTensorError { err: safetensors::SafeTensorError::IoError(io), .. }) => {
            anyhow::anyhow!("writing {}: {io}", path.display())
        }
        _ => e,
    }
}

/// Checks weights written by [`save_weights`] against the CRC-32 and size recorded beside them in
/// `weights.json`. A file with no record passes unless `require_record` (runs written before
/// checksums have none; a sweep asks for one).
pub fn verify_weights(path: &Path, require_record: bool) -> Result<()> {
    let manifest = manifest_path(path);
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let recorded = if manifest.is_file() { read_manifest(&manifest)?.get(&name).cloned() } else { None };
    if require_record && recorded.is_none() {
        bail!("{} records no checksum of {}", manifest.display(), path.display());
    }
    if let Some(want) = recorded {
        let bytes = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?.len();
        let got = Recorded { crc32: format!("{:08x}", crc32_of(path)?), bytes };
        if got != want {
            bail!(
                "{} is corrupt: {} bytes with CRC-32 {}, but {} recorded {} bytes with CRC-32 {} when it was \
                 written (a flipped bit, a truncated or a replaced file); restore it from a copy, or re-create \
                 it with `plexus train --resume` from a checkpoint",
                path.display(),
                got.bytes,
                got.crc32,
                manifest.display(),
                want.bytes,
                want.crc32
            );
        }
    }
    Ok(())
}

/// Loads the final weights `path` of the run `run` into `vs`: the file must exist (a missing one
/// says how far the run got, and how to finish it: `trainer` is the verb that trained it, `train`
/// or `rl`), match the checksum recorded when it was written (runs written before checksums have
/// none), hold exactly the model's parameters, and be finite.
pub fn load_final(vs: &mut tch::nn::VarStore, run: &RunDir, path: &Path, trainer: &str) -> Result<()> {
    // Something else at the path (a directory, a device) is damage, not an unfinished run.
    if let Ok(meta) = std::fs::metadata(path) {
        if !meta.is_file() {
            bail!(
                "{} is {}, not a weights file: the run's final weights are damaged (retrain it with `plexus \
                 {trainer} … --overwrite`, or restore the file)",
                path.display(),
                crate::input_file::kind_name(&meta.file_type())
            );
        }
    }
    if !path.is_file() {
        let how_far = match latest(run) {
            Ok(Some(s)) => format!(
                "the run's latest checkpoint is at step {}; finish it with `plexus {trainer} --resume {}`",
                s.step,
                run.path.display()
            ),
            _ => format!("{} holds no checkpoint: did the run start, or stop with an error?", run.path.display()),
        };
        bail!("{} is missing: the run has not finished ({how_far})", path.display());
    }
    verify_weights(path, false)?;
    load_weights(vs, path)?;
    if let Some(bad) = first_non_finite(&vs.variables()) {
        bail!(
            "{}: parameter `{bad}` holds values that are not finite (NaN or inf): these weights come from a run \
             that diverged, or were damaged after they were written; nothing was measured on them",
            path.display()
        );
    }
    Ok(())
}

/// The first tensor (in name order) that holds a NaN or an infinity, if any. One read for all of
/// them; then one per tensor only when one is not finite.
pub fn first_non_finite(named: &std::collections::HashMap<String, Tensor>) -> Option<String> {
    let float: Vec<(&String, &Tensor)> = named.iter().filter(|(_, t)| t.is_floating_point()).collect();
    if float.is_empty() {
        return None;
    }
    let all: Vec<Tensor> = float.iter().map(|(_, t)| t.detach().isfinite().all().view([1])).collect();
    if crate::host::scalar(&Tensor::cat(&all, 0).all()) != 0.0 {
        return None;
    }
    let mut names: Vec<&String> = float.iter().map(|(n, _)| *n).collect();
    names.sort();
    names.into_iter().find(|n| crate::host::scalar(&named[*n].detach().isfinite().all()) == 0.0).cloned()
}

/// A file a trainer keeps with its checkpoint (RL: the loop state and the replay buffer): its name
/// in `checkpoints/` and how to write it (given a temporary path). [`Checkpointer::save_with`]
/// records its CRC-32 in the marker, [`load`] verifies it, and pruning removes it with its
/// checkpoint.
pub struct ExtraFile<'a> {
    pub name: String,
    pub write: WriteFile<'a>,
}

/// How an [`ExtraFile`] is written, given a temporary path.
pub type WriteFile<'a> = Box<dyn FnOnce(&Path) -> Result<()> + 'a>;

/// When and how `plexus train` checkpoints: every `every` updates (not at the end, which writes the
/// final checkpoint instead), keeping the `keep` latest; at the end also the final weights and,
/// with an EMA, the averaged ones (PyTorch `state_dict`s).
pub struct Checkpointer {
    pub every: u64,
    pub keep: usize,
    /// Batches per update: a checkpoint records where the data stream is.
    pub accumulation: u64,
}

impl Checkpointer {
    /// The config's schedule: `log.checkpoint_every`, `log.keep_checkpoints`.
    pub fn of(cfg: &crate::config::Config) -> Self {
        Checkpointer {
            every: cfg.log.checkpoint_every,
            keep: cfg.log.keep_checkpoints,
            accumulation: cfg.train.accumulation,
        }
    }

    /// Whether a checkpoint is due after `done` updates of `steps`.
    pub fn due(&self, done: u64, steps: u64) -> bool {
        self.every > 0 && done.is_multiple_of(self.every) && done < steps
    }

    /// A resumable checkpoint after `done` updates.
    pub fn save(
        &self,
        dir: &RunDir,
        model: &crate::model::Model,
        optim: &super::optim::Optim,
        done: u64,
    ) -> Result<()> {
        self.save_with(dir, &model.vs, &optim.state(), (done, done * self.accumulation), Vec::new())
    }

    /// A resumable checkpoint of the variables `vs` and the optimizer state `optim` at `(step,
    /// data_index)` (progress in the run's length unit, and the next batch or update), with the
    /// trainer's `extra` files: written first, each atomically; the marker, last, lists their
    /// CRC-32s with those of the weights and the optimizer state.
    pub fn save_with(
        &self,
        dir: &RunDir,
        vs: &tch::nn::VarStore,
        optim: &[(String, Tensor)],
        (step, data_index): (u64, u64),
        extra: Vec<ExtraFile<'_>>,
    ) -> Result<()> {
        let mut files = std::collections::BTreeMap::new();
        for f in extra {
            let name = f.name;
            let write = f.write;
            atomic_write_with(&dir.checkpoints_dir().join(&name), |p| {
                write(p)?;
                files.insert(name.clone(), crc32_of(p)?);
                Ok(())
            })?;
        }
        save(dir, &TrainerState::at(step, data_index, files), vs, optim, self.keep)
    }

    /// The final weights of a run: `final.safetensors` and, with an EMA of the parameters,
    /// `final_ema.safetensors` (every variable, the averaged value where there is one).
    pub fn final_weights(&self, dir: &RunDir, model: &crate::model::Model, optim: &super::optim::Optim) -> Result<()> {
        save_weights(&dir.final_checkpoint(), |p| {
            model.vs.save(p).with_context(|| format!("saving checkpoint {}", p.display()))
        })?;
        if let Some(ema) = optim.ema() {
            let mut named: Vec<(String, Tensor)> = model.vs.variables().into_iter().collect();
            for (name, value) in named.iter_mut() {
                if let Some((_, e)) = ema.iter().find(|(n, _)| n == name) {
                    *value = e.shallow_clone();
                }
            }
            named.sort_by(|a, b| a.0.cmp(&b.0));
            save_weights(&dir.final_ema_checkpoint(), |p| {
                let refs: Vec<(&str, &Tensor)> = named.iter().map(|(n, t)| (n.as_str(), t)).collect();
                Tensor::write_safetensors(&refs, p).with_context(|| format!("saving {}", p.display()))
            })?;
        }
        Ok(())
    }
}
