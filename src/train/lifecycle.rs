//! The life of a run directory, one for every trainer (`plexus train`, `plexus rl`):
//! - [`precheck`], before anything is built (cheap, and the likeliest mistakes): a new run's
//!   directory holds nothing (or `--overwrite` was given); a resumed run's config changes only
//!   what its trainer's [`ResumePolicy`] allows;
//! - [`open`]: the run's lock (held until the returned [`OpenRun`] is dropped, or the process
//!   exits), then for a new run: checked again under the lock, cleared with `--overwrite`, the
//!   leftovers of killed runs removed, `figures/` made and `config.yaml` written; for a resumed
//!   run: the config compared again, leftovers removed, and the latest complete checkpoint
//!   returned; once the trainer has loaded it, [`OpenRun::resumed`] rewrites `config.yaml` if an
//!   allowed key changed (a resume that fails to load changes nothing);
//! - [`finish`] writes `summary.json`.
//!
//! Checkpoints themselves are [`super::checkpoint`]'s.

use super::checkpoint::{self, TrainerState};
use crate::run_dir::{self, atomic_write, RunDir, RunLock};
use anyhow::{bail, Context, Result};

/// What a trainer lets a resumed run change.
pub struct ResumePolicy {
    /// The key of the run's length (`train.steps`, `train.env_steps`): it may grow, to extend
    /// the run, but not shrink.
    pub length: &'static str,
    /// Other keys that may change (they change no number the run computes, or only how often it
    /// logs and checkpoints).
    pub may_change: fn(&str) -> bool,
    /// Those keys in words, for the error.
    pub describe: &'static str,
}

/// How `config_yaml` differs from the config the run in `dir` was trained with, under `policy`:
/// the keys it allows, and those it refuses with both values.
pub fn config_diff(dir: &RunDir, config_yaml: &str, policy: &ResumePolicy) -> Result<crate::config::ResumeDiff> {
    let path = dir.config_file();
    let text = crate::config::read_config_text(&path).map_err(|e| {
        anyhow::anyhow!("--resume: {} is not a run directory (no readable config.yaml: {e})", dir.path.display())
    })?;
    let old: serde_yaml::Value = serde_yaml::from_str(&text)
        .with_context(|| format!("--resume: reading the config the run was trained with, {}", path.display()))?;
    let new: serde_yaml::Value = serde_yaml::from_str(config_yaml).context("the resolved config")?;
    Ok(crate::config::ResumeDiff::of_values(&old, &new, policy.length, &policy.may_change))
}

/// The keys in which `config_yaml` differs from the config the run in `dir` was trained with,
/// when `policy` allows every one of them; else an error naming each refused key with both values.
pub fn config_changes(dir: &RunDir, config_yaml: &str, policy: &ResumePolicy) -> Result<Vec<String>> {
    let path = dir.config_file();
    let diff = config_diff(dir, config_yaml, policy)?;
    if !diff.refused.is_empty() {
        let list: Vec<String> =
            diff.refused.iter().map(|(k, a, b)| format!("`{k}` is `{a}` in the run but `{b}` here")).collect();
        bail!(
            "--resume {}: the config differs from the one the run was trained with ({}): {}; resuming would train \
             something else. Only {} (which may grow, to extend the run, but not shrink) and {} may change on \
             resume; start a new run (another --out, or --overwrite) for anything else",
            dir.path.display(),
            path.display(),
            list.join("; "),
            policy.length,
            policy.describe
        );
    }
    Ok(diff.allowed)
}

/// The cheap checks of [`open`], before data and model are built: a data or device error then
/// leaves no directory behind, and a wrong directory is reported before minutes of loading.
pub fn precheck(dir: &RunDir, config_yaml: &str, resume: bool, overwrite: bool, policy: &ResumePolicy) -> Result<()> {
    if resume {
        config_changes(dir, config_yaml, policy).map(drop)
    } else {
        run_dir::check_new(&dir.path, overwrite)
    }
}

/// A run directory opened by [`open`]: its lock (the writer's), and on resume the checkpoint to
/// continue from.
pub struct OpenRun {
    _lock: Option<RunLock>,
    /// The latest complete checkpoint (resumed runs).
    pub checkpoint: Option<TrainerState>,
    /// The resumed run's `config.yaml`, when an allowed key changed (see [`OpenRun::resumed`]).
    new_config: Option<String>,
    /// The allowed keys the resumed run changed (`train.steps`, `log.*`, `device`).
    pub changed: Vec<String>,
}

impl OpenRun {
    /// Call once the checkpoint is loaded: records the resumed run's config (`config.yaml`) when
    /// it changed an allowed key.
    pub fn resumed(&mut self, dir: &RunDir) -> Result<()> {
        match self.new_config.take() {
            Some(yaml) if self._lock.is_some() => atomic_write(&dir.config_file(), yaml.as_bytes()),
            _ => Ok(()),
        }
    }
}

/// Opens `dir` for a new run (`resume` false) or to continue one; see the module docs. Only the
/// `writer` (rank 0 of a data-parallel run) locks and writes; the other ranks only check the
/// config and find the checkpoint to resume from.
pub fn open(
    dir: &RunDir,
    config_yaml: &str,
    resume: bool,
    overwrite: bool,
    policy: &ResumePolicy,
    writer: bool,
) -> Result<OpenRun> {
    if !writer {
        let checkpoint = match resume {
            true => {
                config_changes(dir, config_yaml, policy)?;
                Some(latest(dir)?)
            }
            false => None,
        };
        return Ok(OpenRun { _lock: None, checkpoint, new_config: None, changed: Vec::new() });
    }
    let lock = Some(dir.lock()?);
    if resume {
        let changed = config_changes(dir, config_yaml, policy)?;
        dir.clean_leftovers()?;
        let state = latest(dir)?;
        let new_config = (!changed.is_empty()).then(|| config_yaml.to_string());
        return Ok(OpenRun { _lock: lock, checkpoint: Some(state), new_config, changed });
    }
    // Checked again under the lock: another process may have written there meanwhile.
    run_dir::check_new(&dir.path, overwrite)?;
    if overwrite {
        run_dir::clear(&dir.path)?;
    }
    dir.clean_leftovers()?;
    let figures = dir.figures_dir();
    std::fs::create_dir_all(&figures).with_context(|| format!("creating {}", figures.display()))?;
    atomic_write(&dir.config_file(), config_yaml.as_bytes())?;
    Ok(OpenRun { _lock: lock, checkpoint: None, new_config: None, changed: Vec::new() })
}

fn latest(dir: &RunDir) -> Result<TrainerState> {
    checkpoint::latest(dir)?
        .with_context(|| format!("--resume: no complete checkpoint in {}", dir.checkpoints_dir().display()))
}

/// Writes the run's `summary.json`.
pub fn finish(dir: &RunDir, summary: &impl serde::Serialize) -> Result<()> {
    atomic_write(&dir.summary_file(), serde_json::to_string_pretty(summary)?.as_bytes())
}
