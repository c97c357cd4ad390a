//! `plexus sweep` in stages: the spec it runs (a spec file, configs and flags, or a sweep folder
//! to resume), the plan checked before anything is created (claims judgeable, a Slurm array that
//! fits), the sweep folder (its lock, and a record compatible with the one already there), then
//! one of three ends — a Slurm job script, a dry run's table, or the runs ([`runner`]).

use super::spec::{PlannedRun, SweepSpec};
use super::{runner, Manifest, Registration, MANIFEST};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// What `plexus sweep` was asked (see `cli::SweepArgs`).
pub struct SweepRequest {
    pub inputs: Vec<PathBuf>,
    pub resume: Option<PathBuf>,
    pub grid: Vec<String>,
    pub seeds: Vec<u64>,
    pub overrides: Vec<crate::config::Override>,
    pub out: Option<PathBuf>,
    pub jobs: usize,
    pub gpus: Option<String>,
    pub slurm: Option<PathBuf>,
    pub only: Vec<String>,
    pub dry_run: bool,
    pub quiet: bool,
    /// `--extend`: the spec's `extend`.
    pub extend: Option<crate::config::ExtendRule>,
}

/// The sweep a request stands for, before its plan.
struct Opened {
    spec: SweepSpec,
    out: PathBuf,
    /// Where the spec came from, for errors: the spec file, the sweep folder's record, or "the
    /// sweep flags".
    origin: String,
    registration: Option<Registration>,
}

/// Runs the sweep `r` asks for, its configs and spec files `inputs` (folders already expanded into
/// their configs). Returns the sweep folder when the whole grid was trained (so that the caller
/// reports it); `None` after a Slurm script, a dry run or `--only` runs.
pub fn sweep(r: &SweepRequest, inputs: &[PathBuf]) -> Result<Option<PathBuf>> {
    let Opened { spec, out, origin, registration } = match &r.resume {
        Some(dir) => reopen(dir)?,
        None => open(r, inputs)?,
    };
    let runs = spec.plan(&origin)?;
    // Every claim must be judgeable on what the sweep plans: refused now, not after the training.
    let planned = super::planned_records(&runs)?;
    super::claims::check_against_plan(&spec.claims, &planned)
        .and_then(|()| check_vector_sizes(&spec.claims, &runs, &planned))
        .with_context(|| format!("{origin}: the claims against the planned runs"))?;
    let manifest = Manifest { spec, runs, registration };
    if r.slurm.is_some() && manifest.runs.len() > runner::SLURM_MAX_ARRAY {
        bail!(
            "{origin}: {} runs, but a Slurm job array holds at most {} tasks by default (MaxArraySize); \
             split the sweep, or run parts of it with --only",
            manifest.runs.len(),
            runner::SLURM_MAX_ARRAY
        );
    }
    // The outputs, before anything is created: the sweep folder is one (or a link to one), the job
    // script a new path or a regular file. A sweep folder this command creates goes again if it
    // fails before its record (and, with --slurm, the script) is written.
    crate::run_dir::check_output_dir(&out, "the sweep folder")?;
    if let Some(file) = &r.slurm {
        crate::run_dir::check_output_file(file, "--slurm")?;
    }
    let created = crate::run_dir::CreatedDir::if_absent(&out);
    // The sweep folder's lock, held to the end: a whole sweep holds it alone, so that a second
    // one on the same folder is refused before it reads a run's state (it could otherwise plan a
    // fresh start of a run the first is finishing, and delete it); `--only` runs (Slurm's array
    // tasks) share it with each other, each run guarded by its own directory's lock.
    let _lock = if !r.dry_run || r.slurm.is_some() {
        Some(crate::run_dir::lock_dir_as(&out, "sweep folder", "give another --out", !r.only.is_empty())?)
    } else {
        None
    };
    // `--slurm --dry-run` writes the record too: the job script it writes reads it.
    if r.resume.is_none() && (!r.dry_run || r.slurm.is_some()) {
        check_compatible(&out, &manifest)?;
        std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
        manifest.write(&out)?;
    }
    if let Some(file) = &r.slurm {
        write_slurm(file, &out, &manifest, r.gpus.is_some())?;
        created.keep();
        return Ok(None);
    }
    created.keep();
    if r.dry_run {
        print_plan(&out, &manifest)?;
        return Ok(None);
    }
    train_runs(r, &out, &manifest)?;
    Ok(r.only.is_empty().then_some(out))
}

/// Each `across_seeds` claim's `size` against the vector its arm's planned runs will have, where
/// their config tells it ([`crate::kinds::RunKind::vector_len`]): a `size` past the vector would
/// leave the claim without a verdict after the whole sweep has trained, one short of it would test
/// a prefix. `planned`: the runs' records, in `runs`' order.
fn check_vector_sizes(
    claims: &[super::claims::Claim],
    runs: &[PlannedRun],
    planned: &[super::collect::RunRecord],
) -> Result<()> {
    for c in claims.iter().filter(|c| c.across_seeds.is_some()) {
        let Some(run) = runs.iter().zip(planned).find(|(_, r)| super::claims::in_an_arm(c, r)).map(|(run, _)| run)
        else {
            continue;
        };
        let kind = crate::kinds::by_verb(&run.verb)?;
        if let (Some(len), Some(size)) = (kind.vector_len(&run.config, &run.overrides, &c.metric)?, c.size) {
            if len != size {
                bail!(
                    "claim `{}`: `size: {size}`, but the runs of arm a ({}) will have {len} entries of `{}` ({}[0..{len}]); \
                     `size` must be the vector's length",
                    c.id,
                    c.a,
                    c.metric,
                    c.metric
                );
            }
        }
    }
    Ok(())
}

/// The sweep recorded in the folder `dir` (`--resume DIR`).
fn reopen(dir: &Path) -> Result<Opened> {
    let m = Manifest::read(dir)
        .with_context(|| format!("--resume {}: not a sweep folder (it has no readable {MANIFEST})", dir.display()))?;
    Ok(Opened {
        spec: m.spec,
        out: dir.to_path_buf(),
        origin: dir.join(MANIFEST).display().to_string(),
        registration: m.registration,
    })
}

/// The sweep of a spec file and/or configs, with the flags' grid, seeds and overrides. A YAML file
/// with none of a config's sections is a sweep spec (one at most); the rest are configs. The
/// spec's configs become absolute paths; what the runs are made under is recorded (the spec's
/// commit and its claims' fingerprint).
fn open(r: &SweepRequest, inputs: &[PathBuf]) -> Result<Opened> {
    let mut spec = SweepSpec::default();
    let mut spec_file: Option<PathBuf> = None;
    let mut configs = Vec::new();
    for p in inputs {
        if super::spec::is_spec_file(p)? {
            if let Some(first) = &spec_file {
                bail!("plexus sweep takes one sweep spec; {} and {} were given", first.display(), p.display());
            }
            spec = SweepSpec::from_file(p)?;
            spec_file = Some(p.clone());
        } else {
            configs.push(p.clone());
        }
    }
    let origin = spec_file.as_ref().map_or_else(|| "the sweep flags".to_string(), |p| p.display().to_string());
    spec.extend(&configs, &r.overrides, &r.grid, &r.seeds)?;
    if r.extend.is_some() {
        spec.extend_rule = r.extend;
    }
    let Some(out) = r.out.clone().or(spec.out.clone()) else {
        bail!("{origin}: where should the runs go? Give --out DIR (or `out:` in the sweep spec)");
    };
    for c in &mut spec.configs {
        *c = std::path::absolute(&*c).with_context(|| format!("config {}", c.display()))?;
    }
    spec.out = Some(out.clone());
    let registration = Registration::of(&spec, spec_file.as_deref());
    Ok(Opened { spec, out, origin, registration: Some(registration) })
}

/// The folder holds at most one sweep: a run of the same name as one its record plans must be the
/// same run — the same config and overrides, but for the run's length, which may grow (the resume
/// rule of `train --resume`: that extends it).
fn check_compatible(out: &Path, manifest: &Manifest) -> Result<()> {
    if !out.join(MANIFEST).is_file() {
        return Ok(());
    }
    let old = Manifest::read(out)?;
    let but_length = |r: &PlannedRun| -> Result<Vec<crate::config::Override>> {
        let length = runner::length_key(&r.verb)?;
        Ok(r.overrides.iter().filter(|o| o.key() != length).cloned().collect())
    };
    for o in &old.runs {
        if let Some(n) = manifest.runs.iter().find(|n| n.name == o.name) {
            if n.config != o.config || but_length(n)? != but_length(o)? {
                bail!(
                    "{}: run {} was planned as `{} {}` before and is `{} {}` now; use another --out for another sweep",
                    out.display(),
                    o.name,
                    o.config.display(),
                    crate::config::join_overrides(&o.overrides),
                    n.config.display(),
                    crate::config::join_overrides(&n.overrides)
                );
            }
        }
    }
    Ok(())
}

/// Writes the Slurm job array of the sweep to `file` (one task per run, each `plexus sweep --resume
/// OUT --only RUN`), with the folder its logs go to (Slurm does not create the folder of
/// `#SBATCH --output`: without it every task fails), and says how to submit it.
fn write_slurm(file: &Path, out: &Path, manifest: &Manifest, gpus: bool) -> Result<()> {
    let exe = std::env::current_exe().context("locating the plexus binary")?;
    let out_abs = std::path::absolute(out)?;
    let script = runner::slurm_script(&exe, &out_abs, manifest, gpus);
    std::fs::create_dir_all(out.join("logs")).with_context(|| format!("creating {}", out.join("logs").display()))?;
    crate::run_dir::atomic_write(file, script.as_bytes())?;
    println!(
        "{}: a job array of {} tasks (one per run of {}); submit it with `sbatch {}`",
        file.display(),
        manifest.runs.len(),
        out.display(),
        file.display()
    );
    Ok(())
}

/// `--dry-run`: each planned run's state (fresh, resumable, finished, damaged and why) and command.
fn print_plan(out: &Path, manifest: &Manifest) -> Result<()> {
    for run in &manifest.runs {
        let yaml = runner::resolved_yaml(run).with_context(|| format!("sweep run {}", run.name))?;
        let state = match runner::state_of(&out.join(&run.name), run, &yaml)? {
            runner::RunState::Damaged(why) => format!("Damaged ({why})"),
            s => format!("{s:?}"),
        };
        println!(
            "{:<8} {}  ({} {} {})",
            state,
            run.name,
            run.verb,
            run.config.display(),
            crate::config::join_overrides(&run.overrides)
        );
    }
    Ok(())
}

/// Trains the planned runs (or `--only` ones) on CPU jobs or GPUs, says how many finished, and
/// fails naming each run that failed (the others are kept; a re-run retries only those).
fn train_runs(r: &SweepRequest, out: &Path, manifest: &Manifest) -> Result<()> {
    let slots = match &r.gpus {
        Some(g) => runner::Slots::Gpus(runner::gpu_slots(
            g,
            std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(),
            tch::Cuda::device_count().max(0) as usize,
        )?),
        None => runner::Slots::Cpu(r.jobs),
    };
    let outcome = runner::run(out, manifest, &r.only, &slots, r.quiet)?;
    let n = if r.only.is_empty() { manifest.runs.len() } else { r.only.len() };
    eprintln!(
        "sweep {}: {n} runs: {} finished before, {} finished now ({} of them resumed), {} failed",
        out.display(),
        outcome.skipped,
        outcome.finished,
        outcome.resumed,
        outcome.failed.len()
    );
    if !outcome.failed.is_empty() {
        let list: Vec<String> =
            outcome.failed.iter().map(|(name, log, tail)| format!("{name}: {tail} (log: {})", log.display())).collect();
        bail!(
            "{} of {n} runs failed; the others are kept, and re-running the sweep retries only these:\n  {}",
            outcome.failed.len(),
            list.join("\n  ")
        );
    }
    Ok(())
}
