//! The run engine of both trainers (`plexus train`, `plexus rl`): a run directory opened and, on
//! resume, its checkpoint handed to the trainer ([`open`]); then the loop ([`run`]): one iteration,
//! its checkpoint when due, the crash hook, until the last iteration, whose checkpoint and final
//! weights end the run. A trainer implements only what differs ([`Trainer`]): its iteration (a
//! training step with its evaluations and row when due; a rollout with its updates and evaluation
//! row when due), its checkpoint (with its extra files, [`super::checkpoint::Checkpointer`]) and its
//! final weights; the divergence guard runs inside the iteration, where the trainer reads its
//! numbers.
//!
//! One crash hook for both ([`CrashAfter`], `PLEXUS_CRASH_AFTER`): after the iteration that brings
//! the run to N units of its length (updates, environment steps) or past them, and after the
//! checkpoint due then, the run stops with an error as a crash would.

use super::checkpoint::TrainerState;
use super::lifecycle::{self, OpenRun, ResumePolicy};
use super::numerics::{self, Numerics};
use crate::run_dir::RunDir;
use anyhow::{bail, Result};

/// What one kind of trainer does in the engine's loop.
pub trait Trainer {
    /// The run's progress in its length unit: updates done (train), environment steps (rl).
    fn progress(&self) -> u64;
    /// The unit of [`Trainer::progress`] in words, for the crash hook's message.
    fn unit(&self) -> &'static str;
    /// Whether no iteration is left (a resumed run may have none).
    fn done(&self) -> bool;
    /// One iteration, with the evaluations and rows due in it; an error when it diverged (after
    /// writing what was logged).
    fn iterate(&mut self) -> Result<()>;
    /// Whether a resumable checkpoint is due after the iteration just done (not the last).
    fn checkpoint_due(&self) -> bool;
    /// Writes the resumable checkpoint at the current progress (`last`: the run's end).
    fn checkpoint(&mut self, last: bool) -> Result<()>;
    /// Writes the final weights, after the last checkpoint.
    fn final_weights(&mut self) -> Result<()>;
}

/// Abort after this many units of the run's length (updates, environment steps), as a crash
/// would: for testing that resumed runs match uninterrupted ones (`PLEXUS_CRASH_AFTER`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CrashAfter(pub Option<u64>);

impl CrashAfter {
    /// Whether the iteration that took the run from `before` to `now` reached the crash point.
    pub fn reached(&self, before: u64, now: u64) -> bool {
        self.0.is_some_and(|c| before < c && c <= now)
    }
}

/// Whether a schedule of every `n` steps (0: never) is due at `step` of a run of `steps`: the
/// last step always is.
pub fn every(n: u64, step: u64, steps: u64) -> bool {
    (n > 0 && step.is_multiple_of(n)) || step == steps
}

/// How a run directory is opened ([`open`]).
#[derive(Debug, Clone, Copy)]
pub struct OpenMode {
    /// Continue the run from its latest checkpoint.
    pub resume: bool,
    /// Replace a finished or foreign run in the directory.
    pub overwrite: bool,
    /// This process writes the directory (rank 0 of a data-parallel run; every RL run).
    pub writer: bool,
}

/// Opens `dir` ([`lifecycle::open`]: its one writer, the returned guard, when `mode.writer`) and,
/// on resume, hands its latest checkpoint to `load` (the trainer loads weights, optimizer and its
/// own files) before recording a changed config. The writer records the settings the run's
/// numbers depend on (`numerics`, this process's) when the run starts, and compares them on resume
/// ([`numerics`]).
pub fn open(
    dir: &RunDir,
    config_yaml: &str,
    mode: OpenMode,
    policy: &ResumePolicy,
    numerics: &Numerics,
    load: impl FnOnce(&TrainerState, &OpenRun) -> Result<()>,
) -> Result<OpenRun> {
    let OpenMode { resume, overwrite, writer } = mode;
    let mut run = lifecycle::open(dir, config_yaml, resume, overwrite, policy, writer)?;
    match run.checkpoint.clone() {
        Some(state) => {
            load(&state, &run)?;
            run.resumed(dir)?;
            if writer {
                numerics::resumed(dir, state.step, numerics)?;
            }
        }
        None if writer => numerics::started(dir, numerics)?,
        None => {}
    }
    Ok(run)
}

/// The loop of every trainer: iterate; after each iteration but the last, the checkpoint when due,
/// then the crash hook; after the last, its checkpoint; then the final weights. `name` names the
/// run in the crash's error.
pub fn run(t: &mut impl Trainer, crash: CrashAfter, name: &str) -> Result<()> {
    while !t.done() {
        let before = t.progress();
        t.iterate()?;
        if t.done() {
            t.checkpoint(true)?;
            break;
        }
        if t.checkpoint_due() {
            t.checkpoint(false)?;
        }
        if crash.reached(before, t.progress()) {
            bail!("{name}: simulated crash after {} {}", t.progress(), t.unit());
        }
    }
    t.final_weights()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The crash point is reached by the one iteration that gets to it or past it.
    #[test]
    fn the_crash_point_is_reached_once() {
        let c = CrashAfter(Some(640));
        assert!(!c.reached(320, 480) && c.reached(480, 640) && !c.reached(640, 800));
        assert!(CrashAfter(Some(5)).reached(4, 5) && CrashAfter(Some(5)).reached(0, 160));
        assert!(!CrashAfter(None).reached(0, u64::MAX));
    }
}
