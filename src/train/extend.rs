//! Lengthening a run: `plexus train --resume RUN --set train.steps=N [--extend RULE]`.
//!
//! Raising `train.steps` on a run whose schedule depends on its length (cosine) would silently
//! re-plan every update left, so the resumed run must say what the added updates do
//! ([`ExtendRule`]: hold the last rate, restart a cosine cycle, or stretch the schedule), and that
//! choice is recorded in `train.extensions` of its `config.yaml` (see [`super::schedule`]). A
//! schedule that does not depend on the length (constant, or a held rate) is continued as planned,
//! and `--extend` is then refused as meaningless.

use super::schedule::{depends_on_length, lr_at};
use crate::config::{Config, ExtendRule, Extension};
use crate::run_dir::RunDir;
use anyhow::{bail, Context, Result};

/// The config the run in `dir` was trained with (its `config.yaml`).
fn run_config(dir: &RunDir) -> Result<Config> {
    let text = crate::config::read_config_text(&dir.config_file())
        .map_err(|e| anyhow::anyhow!("--resume {}: {e}", dir.path.display()))?;
    serde_yaml::from_str(&text).with_context(|| {
        format!("--resume: reading the config the run was trained with, {}", dir.config_file().display())
    })
}

/// Whether continuing `run` (the config a run was trained with) for `steps` updates lengthens a
/// schedule that depends on its length, so that the added updates need an [`ExtendRule`].
pub fn needs_rule(run: &Config, steps: u64) -> bool {
    steps > run.train.steps && depends_on_length(&run.train)
}

/// The rule a resumed run of `dir` that continues with `cfg` takes: `None` when it lengthens no
/// schedule that depends on its length, `rule` when it does; an error naming the choices (with the
/// learning rate each gives where the run continues) when it does and `rule` is `None`.
pub fn rule_for(dir: &RunDir, cfg: &Config, rule: Option<ExtendRule>) -> Result<Option<ExtendRule>> {
    let run = run_config(dir)?;
    if !needs_rule(&run, cfg.train.steps) {
        return Ok(None);
    }
    if rule.is_some() {
        return Ok(rule);
    }
    let (before, after) = (run.train.steps, cfg.train.steps);
    let at = resumed_at(dir)?;
    let with = |r: ExtendRule| lengthened(&run, after, Extension { at, from_steps: before, rule: r });
    let choices: Vec<String> = ExtendRule::ALL
        .iter()
        .map(|&r| {
            let what = match r {
                ExtendRule::Hold => "continue at the last update's learning rate",
                ExtendRule::Restart => "a new cosine cycle over the added updates, from the peak lr",
                ExtendRule::Stretch => "the cosine planned again over the new length",
            };
            format!("--extend {r} ({what}: {:.3e} at update {at})", lr_at(&with(r), at))
        })
        .collect();
    bail!(
        "--resume {}: train.steps grows from {before} to {after}, and the run's {} depends on its length: its \
         update {} had learning rate {:.3e}, and re-planned over {after} updates update {at} would have {:.3e}. Say \
         what the added updates do: {}. The choice is recorded in the run's config.yaml (train.extensions)",
        dir.path.display(),
        describe(&run),
        at - 1,
        lr_at(&run.train, at - 1),
        lr_at(&with(ExtendRule::Stretch), at),
        choices.join("; ")
    );
}

/// `run`'s train section lengthened to `steps` by `e`.
fn lengthened(run: &Config, steps: u64, e: Extension) -> crate::config::TrainConfig {
    let mut c = run.train.clone();
    c.steps = steps;
    c.extensions.push(e);
    c
}

/// The step a resumed run continues from: that of the run's latest complete checkpoint.
fn resumed_at(dir: &RunDir) -> Result<u64> {
    Ok(crate::train::checkpoint::latest(dir)?
        .with_context(|| format!("--resume: no complete checkpoint in {}", dir.checkpoints_dir().display()))?
        .step)
}

/// Makes `cfg` (the config a resumed run continues with) what the run in `dir` trains from here:
/// the lengthenings the run recorded (where `cfg` names none: a run's record is not undone by a
/// config that predates it), and, when `cfg.train.steps` lengthens a schedule that depends on the
/// length, the one `rule` says, from the step of the run's latest checkpoint. An error when the
/// schedule needs a rule and none is given ([`rule_for`]), or when a rule is given and nothing is
/// lengthened.
pub fn plan(cfg: &mut Config, dir: &RunDir, rule: Option<ExtendRule>) -> Result<()> {
    let run = run_config(dir)?;
    if cfg.train.extensions.is_empty() {
        cfg.train.extensions = run.train.extensions.clone();
    }
    let (before, after) = (run.train.steps, cfg.train.steps);
    match rule_for(dir, cfg, rule)? {
        Some(rule) => {
            cfg.train.extensions.push(Extension { at: resumed_at(dir)?, from_steps: before, rule });
            cfg.validate().map_err(|e| {
                let value = e.value.unwrap_or_default();
                anyhow::anyhow!(
                    "--resume {}: --extend {rule}: {} = {value}: expected {}",
                    dir.path.display(),
                    e.key,
                    e.allowed
                )
            })
        }
        None => match rule {
            Some(r) => {
                let why = if after <= before {
                    format!("train.steps stays at {before} (raise it with --set train.steps=N to lengthen the run)")
                } else {
                    format!(
                        "the run's learning rate does not depend on its length ({}), so the {} added updates \
                         continue as planned",
                        describe(&run),
                        after - before
                    )
                };
                bail!("--resume {}: --extend {r} has nothing to decide: {why}", dir.path.display())
            }
            None => Ok(()),
        },
    }
}

/// The run's schedule in words (`cosine schedule`, `cosine schedule (lengthened twice)`).
fn describe(run: &Config) -> String {
    let name = format!("{:?} schedule", run.train.schedule).to_lowercase();
    let held = run.train.extensions.last().is_some_and(|e| e.rule == ExtendRule::Hold);
    let name = if held { format!("{name} held at its last rate") } else { name };
    match run.train.extensions.len() {
        0 => name,
        1 => format!("{name} (lengthened once)"),
        n => format!("{name} (lengthened {n} times)"),
    }
}
