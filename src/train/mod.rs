//! The training loop: build data and model from an [`Experiment`], optimise with parameter groups,
//! a schedule, clipping and gradient accumulation; log `metrics.csv` and `eval.csv`; save the
//! connectivity matrix C, resumable checkpoints and `summary.json` into a run directory.
//!
//! Reproducibility: model init is seeded by `seed`; libtorch's generator is reseeded from
//! `(seed, step)` at every step (dropout), and training batches are addressed by index. So a
//! CPU run is a pure function of its config, and a run resumed from a checkpoint writes the same
//! `metrics.csv` as an uninterrupted one.

pub mod checkpoint;
pub mod divergence;
pub mod engine;
pub mod eval;
pub mod extend;
pub mod lifecycle;
pub mod numerics;
pub mod optim;
pub mod resolved;
pub mod run_log;
pub mod schedule;
pub mod step;
pub mod trained;

use crate::data::prefetch::Prefetcher;
use crate::device;
use crate::experiment::Experiment;
use crate::host;
use crate::model::Model;
use crate::run_dir::RunDir;
use anyhow::{bail, Result};
use checkpoint::Checkpointer;
use eval::{EvalResult, EvalSet};
use optim::Optim;
use run_log::{LogRow, Resumed, TrainLog};
use serde::Serialize;
use std::time::Instant;
use step::Stepper;

#[derive(Debug, Clone, Default)]
pub struct TrainOptions {
    /// Show a progress bar (on stderr).
    pub progress: bool,
    /// Without a terminal (nohup, Slurm, `> log`): the device line, and a plain line per logged
    /// step (step, loss, lr, throughput, ms/step, MFU on a GPU whose peak is known, ETA), on stderr.
    pub log_lines: bool,
    /// Continue from the run directory's latest checkpoint instead of starting afresh. The config
    /// may differ from the run's `config.yaml` only in a larger `train.steps` and in `log.*`
    /// (which `config.yaml` then records).
    pub resume: bool,
    /// A new run into a directory that holds files clears it first (without this, it is refused).
    pub overwrite: bool,
    /// Abort (with an error, writing nothing more) once this many updates are done, after the
    /// checkpoint due then ([`engine::CrashAfter`], as `plexus rl`'s): simulates a crash, for
    /// testing that resumed runs match uninterrupted ones.
    pub crash_after: Option<u64>,
    /// This process's place in a data-parallel run (see [`crate::dist`]); `None`: one process.
    pub dist: Option<crate::dist::DistInfo>,
}

/// The least-squares slope of log10(loss / first loss) against the step, per 1,000 steps, over
/// `(step, loss)` up to and including the first point at 1e-9 of the first loss (before fp32's
/// round-off floor); `None` with fewer than 2 such points or a loss that is not positive.
pub fn loss_rate(points: &[(f64, f64)]) -> Option<f64> {
    let first = points.first()?.1;
    if first.is_nan() || first <= 0.0 {
        return None;
    }
    let end = points.iter().position(|p| p.1 <= 1e-9 * first).map_or(points.len(), |i| i + 1);
    let pts: Vec<(f64, f64)> =
        points[..end].iter().filter(|p| p.1 > 0.0).map(|&(x, y)| (x, (y / first).log10())).collect();
    if pts.len() < 2 {
        return None;
    }
    let n = pts.len() as f64;
    let (mx, my) = (pts.iter().map(|p| p.0).sum::<f64>() / n, pts.iter().map(|p| p.1).sum::<f64>() / n);
    let sxx: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    (sxx > 0.0).then(|| 1000.0 * sxy / sxx)
}

/// What `summary.json` holds (read back to print a finished run's table).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Summary {
    pub name: String,
    pub model: String,
    pub topology: String,
    pub topology_label: String,
    pub steps: u64,
    pub initial_loss: f64,
    pub final_loss: f64,
    pub min_loss: f64,
    /// First logged step whose loss is ≤ 1e-3 × the initial loss (a convergence-speed measure
    /// that, unlike the final loss, does not depend on where fp32 round-off stops progress).
    pub steps_to_1e3: Option<u64>,
    /// The same at 1e-6 and 1e-9 of the initial loss: the rate question of convergence claims
    /// asked at several depths of the descent, each before fp32's round-off floor (~1e-12 × the
    /// initial loss of the linear-network case study).
    pub steps_to_1e6: Option<u64>,
    pub steps_to_1e9: Option<u64>,
    /// The fitted linear rate: the least-squares slope of log10(loss / initial loss) against the
    /// step, per 1,000 steps, over the logged steps up to the first at 1e-9 of the initial loss
    /// (before the floor), or all of them (negative: decades gained per 1,000 steps).
    pub loss_rate: Option<f64>,
    /// The last evaluation on the held-out set, if the dataset has one.
    pub eval: Option<EvalResult>,
    /// Γ = ‖a‖₂/√L at the end, for topologies with residual weights.
    pub gamma: Option<f64>,
    pub num_params: i64,
    pub device: String,
    pub precision: String,
    /// Wall time of this process's training (a resumed run counts only its own part).
    pub wall_seconds: f64,
    /// Training examples per second (sequences for language models).
    pub samples_per_second: f64,
    /// Training tokens per second (language models).
    pub tokens_per_second: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resumed_from: Option<u64>,
    /// The topology's own parameter view at the end (e.g. ANCRe `p`), rows = sources.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "view_as_rows", skip_deserializing)]
    pub parameter_view: Option<(String, crate::run_dir::Matrix)>,
    /// Device → host reads of each step this process ran (evaluation, connectivity and the
    /// step's own numbers included), in order: what `tests/it/device_discipline.rs` checks.
    #[serde(skip)]
    pub host_reads: Vec<u64>,
    /// Host-device syncs of each step as libtorch's dispatcher ran them ([`crate::native::profile::SyncCount`]:
    /// a read hidden inside an operator counts too), when counting is on (`PLEXUS_COUNT_SYNCS=1`, or
    /// [`crate::native::profile::watch_syncs`] called before); empty otherwise.
    #[serde(skip)]
    pub device_syncs: Vec<u64>,
}

/// Trains `exp` into the run directory `dir` (new, or resumed from its latest checkpoint with
/// `opts.resume`) and returns what `summary.json` records. The run engine ([`engine::run`]) drives
/// [`Steps`]: at each step evaluate and record C when due, take one optimizer step, read its
/// numbers when they are logged (the divergence check included), checkpoint when due; the jobs are
/// the components of [`run_log`], [`eval`], [`checkpoint`] and [`Recorder`].
pub fn train(exp: &Experiment, dir: &RunDir, opts: &TrainOptions) -> Result<Summary> {
    let cfg = exp.config();
    // Rank 0 alone writes the run directory (every rank reads its checkpoints on resume).
    let main = crate::dist::DistInfo::is_main(opts.dist.as_ref());
    // The run directory is checked first (cheap, and the most likely mistake), but nothing is
    // created until data and model are built: a data or device error leaves no directory behind.
    let config_yaml = cfg.to_yaml();
    if main || opts.resume {
        lifecycle::precheck(dir, &config_yaml, opts.resume, opts.overwrite, &RESUME_POLICY)?;
    }
    let mut setup = Setup::new(exp, opts)?;
    let dev = setup.dev;
    let mut t = setup.stepper(exp);
    // One writer per run directory, until this function returns (or the process dies).
    let (_run, resumed) = open_run(exp, dir, opts, &config_yaml, &mut setup, &mut t)?;
    let start = resumed.start;
    join_and_capture(exp, &mut t, opts, dev, main)?;
    let batches = setup.batches(start * cfg.train.accumulation);
    let output = run_log::LogOutput { progress: opts.progress, log_lines: opts.log_lines, main };
    let log = TrainLog::new(exp, dev, dir, output, &config_yaml, resumed)?;
    let checkpoints = Checkpointer::of(cfg);
    let clock = Instant::now();
    let mut steps =
        Steps { exp, dir, setup: &setup, t, log, batches, checkpoints, main, step: start, start, clock, wall: 0.0 };
    engine::run(&mut steps, engine::CrashAfter(opts.crash_after), &cfg.name)?;
    let time = TrainingTime { wall: steps.wall, start, resumed: opts.resume };
    let summary = summarize(exp, &steps.t.model, &steps.log, &setup, time);
    if main {
        lifecycle::finish(dir, &summary)?;
    }
    Ok(summary)
}

/// `plexus train`'s loop state as the run engine drives it: one iteration is one step (the last,
/// at `train.steps`, only measures the final loss).
struct Steps<'a> {
    exp: &'a Experiment,
    dir: &'a RunDir,
    setup: &'a Setup,
    t: Stepper,
    log: TrainLog,
    batches: Prefetcher,
    checkpoints: Checkpointer,
    /// This process writes the run directory (rank 0).
    main: bool,
    /// The step the next iteration takes (= updates done).
    step: u64,
    /// The step this process started from (a resumed run's checkpoint; 0 for a new run).
    start: u64,
    /// When the loop started, and this process's training time once it ended.
    clock: Instant,
    wall: f64,
}

impl Steps<'_> {
    /// The error of a run whose loss or gradient (`what`) went non-finite at step `first`, found
    /// at the read of this step, after writing the metrics logged so far; no checkpoint after it
    /// is kept.
    fn diverged(&self, first: u64, what: &str) -> anyhow::Error {
        if self.main {
            if let Err(e) = self.log.write(self.dir) {
                return e;
            }
        }
        anyhow::anyhow!(
            "{}: step {first}: {what} went non-finite: {}; metrics up to here are in {}, and no checkpoint after \
             the divergence was kept",
            self.exp.config().name,
            self.t.diagnose(first, self.step),
            self.dir.metrics_file().display()
        )
    }
}

impl engine::Trainer for Steps<'_> {
    fn progress(&self) -> u64 {
        self.step
    }

    fn unit(&self) -> &'static str {
        "updates"
    }

    fn done(&self) -> bool {
        self.step > self.exp.config().train.steps
    }

    fn iterate(&mut self) -> Result<()> {
        let (cfg, tc, step) = (self.exp.config(), &self.exp.config().train, self.step);
        let every = |n: u64| engine::every(n, step, tc.steps);
        let counts = self.log.step_start();
        // Rank 0 alone evaluates and saves C (the others wait at the next all-reduce).
        if self.main && every(cfg.log.eval_every) {
            if let Some((e, buckets)) =
                eval::evaluate_for_run(&self.t.model, self.exp.task(), &self.setup.eval_set, step)
            {
                self.log.eval(self.dir, e, buckets)?;
            }
        }
        // A C the run's files already hold at the step it resumed from (a finished run's last,
        // when it is lengthened) is kept, as its rows are.
        let c = self.dir.connectivity_file(step);
        let held = step == self.start && step > 0 && c.is_file() && c.with_extension("npy").is_file();
        if self.main && every(cfg.log.connectivity_every) && !held {
            self.setup.recorder.record(self.dir, &mut self.log, &self.t.model, step)?;
        }
        let lr = schedule::lr_at(tc, step.min(tc.steps - 1));
        // The last step only measures the final loss: no update after it.
        let stats = {
            let rank = self.setup.place.0 as u64;
            let _rng = device::seed_guard(step_seed(cfg.seed ^ rank.wrapping_mul(RANK_MIX), step));
            let batches = &mut self.batches;
            self.t.step(step, || batches.next_batch(), (step < tc.steps).then_some(lr))?
        };
        if let (Some(note), true) = (self.t.take_note(), self.main) {
            self.log.warn(format!("{}: {note}", cfg.name));
        }
        (self.log.samples, self.log.tokens) = (self.log.samples + stats.samples, self.log.tokens + stats.tokens);
        // Logging and checkpoint steps read the step's numbers (one read); other steps read nothing.
        if every(cfg.log.every) || self.checkpoints.due(step + 1, tc.steps) {
            let logged = self.t.read(&stats)?;
            if let Some((first, what)) = logged.diverged {
                return Err(self.diverged(first, what));
            }
            if every(cfg.log.every) {
                let epoch = (step * tc.accumulation) as f64 / self.setup.per_epoch as f64;
                self.log.row(logged.row(step, epoch, lr))?;
            }
        }
        self.log.step_done(counts, step, step == tc.steps);
        self.step += 1;
        Ok(())
    }

    fn checkpoint_due(&self) -> bool {
        self.main && self.checkpoints.due(self.step, self.exp.config().train.steps)
    }

    fn checkpoint(&mut self, last: bool) -> Result<()> {
        if last {
            self.log.finish();
            self.wall = self.clock.elapsed().as_secs_f64();
        }
        if !self.main {
            return Ok(());
        }
        self.log.write(self.dir)?;
        // The last iteration took no update: the run's end is at `train.steps` updates.
        self.checkpoints.save(self.dir, &self.t.model, &self.t.optim, self.step.min(self.exp.config().train.steps))
    }

    fn final_weights(&mut self) -> Result<()> {
        match self.main {
            true => self.checkpoints.final_weights(self.dir, &self.t.model, &self.t.optim),
            false => Ok(()),
        }
    }
}

/// Mixes the rank into a step's seed: each rank draws its own dropout masks; rank 0 draws those
/// of a single-process run.
const RANK_MIX: u64 = 0xD6E8_FEB8_6659_FD93;

/// What a run needs before its model: the device, the data (not yet streaming), the held-out set,
/// the connectivity probe, and this process's place in a data-parallel group.
struct Setup {
    dev: tch::Device,
    /// Taken by the batch prefetcher when training starts.
    data: Option<Box<dyn crate::data::DataSource>>,
    transform: crate::data::InputTransform,
    /// The held-out set as the data's files number it, for `resolved.yaml`.
    eval_record: Option<serde_yaml::Mapping>,
    eval_set: EvalSet,
    per_epoch: u64,
    recorder: Recorder,
    /// `(rank, world size)`.
    place: (usize, usize),
    /// The dataset's files ([`crate::data::DataSource::files`]), whose hashes the run records.
    files: Vec<std::path::PathBuf>,
}

impl Setup {
    fn new(exp: &Experiment, opts: &TrainOptions) -> Result<Self> {
        let cfg = exp.config();
        let dev = device::resolve(cfg.device_request())?;
        let dev = match opts.dist.as_ref() {
            Some(d) => d.device(dev, device::Machine::current().cuda_devices)?,
            None => dev,
        };
        device::apply_matmul_precision(cfg.tf32)?;
        if opts.progress || opts.log_lines {
            eprintln!("{}: training on {}", cfg.name, device::describe(dev));
        }
        let mut data = exp.data.load()?;
        let files = data.files();
        let transform = data.input_transform();
        let eval_set = EvalSet::new(data.eval_batches(), &transform, dev);
        let eval_record = data.eval_record();
        data.make_resident(dev);
        let per_epoch = data.batches_per_epoch().max(1);
        // The batch the connectivity of input-dependent topologies is averaged over.
        let first_batch = data.train_batch(0)?;
        let recorder = Recorder::new(exp, &first_batch, &transform, dev);
        let world = opts.dist.as_ref().map_or(1, |d| d.world_size);
        let rank = opts.dist.as_ref().map_or(0, |d| d.rank);
        let global_batch = first_batch.input.size()[0] as usize;
        if !global_batch.is_multiple_of(world) {
            bail!(
                "{}: the global batch of {global_batch} examples (data.batch_size) does not split evenly over {world} \
                 processes: use a batch size that is a multiple of {world}",
                cfg.name
            );
        }
        let place = (rank, world);
        Ok(Setup { dev, data: Some(data), transform, eval_record, eval_set, per_epoch, recorder, place, files })
    }

    /// The training batches from the `index`-th on (batches are addressed by index over the run),
    /// prepared on another thread; this process's slice of each in a data-parallel run.
    fn batches(&mut self, index: u64) -> Prefetcher {
        let data = self.data.take().expect("the data is streamed once");
        Prefetcher::new(data, index, 4, self.dev, self.place)
    }

    /// The model (initialised from the run's seed), its optimizer and the step that drives them.
    fn stepper(&self, exp: &Experiment) -> Stepper {
        let (cfg, tc) = (exp.config(), &exp.config().train);
        let model = device::with_seed(cfg.seed, || {
            Model::new(exp.model.as_ref(), exp.topology.as_ref(), self.dev, cfg.precision.compute_kind())
        });
        let optim = Optim::new(tc, model.trainable());
        Stepper::new(model, optim, exp.task(), tc.accumulation, tc.clip_grad_norm, &self.transform)
    }
}

/// Records the connectivity matrix C and the topology's own parameter view (H-ACN's a, ANCRe's
/// p, …) into the run directory, for heatmaps, Δ_t and correlations later, on one fixed input.
pub struct Recorder {
    /// The model input C is measured on: the first training batch, `[B, …]` (noised by the
    /// diffusion task, from the run's seed, for a diffusion model).
    probe: tch::Tensor,
}

impl Recorder {
    /// The probe is `first_batch` (raw, `[B, …]`) made a model input on `dev` (see
    /// [`Experiment::probe_input`]).
    pub fn new(
        exp: &Experiment,
        first_batch: &crate::data::Batch,
        transform: &crate::data::InputTransform,
        dev: tch::Device,
    ) -> Self {
        Recorder { probe: exp.probe_input(first_batch, transform, dev) }
    }

    /// C (`[L+2, L+2]`) and the parameter view at `step`; C also as a TensorBoard image.
    pub fn record(&self, dir: &RunDir, log: &mut TrainLog, model: &Model, step: u64) -> Result<()> {
        let c = model.connectivity(&self.probe);
        dir.write_connectivity(step, &c)?;
        log.connectivity(step, &host::matrix(&c))?;
        if let Some((name, view)) = model.parameter_view(&self.probe) {
            dir.write_param_view(&name, step, &view)?;
        }
        Ok(())
    }

    /// The topology's parameter view now, for `summary.json`.
    pub fn view(&self, model: &Model) -> Option<(String, crate::run_dir::Matrix)> {
        model.parameter_view(&self.probe).map(|(n, m)| (n, host::matrix(&m)))
    }
}

/// Joins the data-parallel group (after any resume: every rank loaded the same checkpoint, and
/// rank 0's values win anyway), then captures the step as a CUDA graph where the config and the
/// device allow, saying why not where they do not.
fn join_and_capture(
    exp: &Experiment,
    t: &mut Stepper,
    opts: &TrainOptions,
    dev: tch::Device,
    main: bool,
) -> Result<()> {
    if let Some(info) = &opts.dist {
        t.distribute(crate::dist::Dist::join(info.clone(), dev)?)?;
    }
    if let (Some(note), true) = (t.use_cuda_graphs(exp.config().train.cuda_graphs)?, main) {
        eprintln!("{}: {note}", exp.config().name);
    }
    Ok(())
}

/// Opens the run directory on the run engine ([`engine::open`]: its one writer, the returned
/// guard), resumes from its checkpoint where there is one, and writes `resolved.yaml` (rank 0).
fn open_run(
    exp: &Experiment,
    dir: &RunDir,
    opts: &TrainOptions,
    config_yaml: &str,
    setup: &mut Setup,
    t: &mut Stepper,
) -> Result<(lifecycle::OpenRun, Resumed)> {
    let main = crate::dist::DistInfo::is_main(opts.dist.as_ref());
    let mut resumed = Resumed { rows: Vec::new(), evals: Vec::new(), eps_by_t: Vec::new(), start: 0 };
    let how = engine::OpenMode { resume: opts.resume, overwrite: opts.overwrite, writer: main };
    let files = crate::pins::data_file_keys(&setup.files);
    let numerics = numerics::Numerics::here(setup.dev, setup.place.1);
    let run = engine::open(dir, config_yaml, how, &RESUME_POLICY, &numerics, |state, run| {
        pinned_inputs(exp, dir, &files)?;
        resumed = resume(exp, dir, state, &run.changed, t, setup.dev, main)?;
        Ok(())
    })?;
    // A new run pins what it read from outside its directory, before its first checkpoint.
    if main && !opts.resume {
        crate::pins::write(&dir.path, &exp.inputs, &files)?;
    }
    if main {
        let text = resolved::resolved_yaml(exp, &setup.transform, setup.eval_record.take())?;
        crate::run_dir::atomic_write(&dir.path.join(resolved::RESOLVED_FILE), text.as_bytes())?;
    }
    Ok((run, resumed))
}

/// A resumed run continues on the inputs it pinned when it started: its config parsed against
/// its record ([`Experiment::of_run`]), and the dataset's `files` as they were (same content).
fn pinned_inputs(exp: &Experiment, dir: &RunDir, files: &[(String, std::path::PathBuf)]) -> Result<()> {
    let manifest = crate::pins::read(&dir.path)?;
    if manifest.is_some() && exp.pinned.is_none() {
        bail!(
            "--resume {}: the config was read without the inputs the run pinned ({}); resume it with plexus \
             train --resume",
            dir.path.display(),
            dir.path.join(crate::pins::MANIFEST_FILE).display()
        );
    }
    crate::pins::verify_files(&dir.path, manifest.as_ref(), files)
}

/// Loads the checkpoint `state` of a resumed run into `t` (saying so when the allowed keys that
/// `changed` moved it to another device) and returns the rows logged before it, and its step.
fn resume(
    exp: &Experiment,
    dir: &RunDir,
    state: &checkpoint::TrainerState,
    changed: &[String],
    t: &mut Stepper,
    dev: tch::Device,
    main: bool,
) -> Result<Resumed> {
    let optim_state = checkpoint::load(dir, state, &mut t.model.vs)?;
    t.optim.load_state(&optim_state, state.step)?;
    // `device` changed in words (`cpu` → `auto`) need not change the device: said only when the
    // run's own device, resolved here, is another one.
    let started_on = || -> Option<tch::Device> {
        let text = crate::config::read_config_text(&dir.config_file()).ok()?;
        let old: serde_yaml::Value = serde_yaml::from_str(&text).ok()?;
        device::resolve(device::parse_device(old.get("device")?.as_str()?).ok()?).ok()
    };
    if main && changed.iter().any(|k| k == "device") && started_on() != Some(dev) {
        eprintln!(
            "{}: resumed at step {} on {} (another device than the run's start): from here its numbers are \
             not bit-identical to an uninterrupted run (kernels and random streams differ by device)",
            exp.config().name,
            state.step,
            device::describe(dev)
        );
    }
    let start = state.step;
    Ok(Resumed {
        rows: crate::run_dir::MetricsRow::read(dir, start)?,
        // Up to the checkpoint's step: what a finished run measured there is kept when it is
        // lengthened (a resumed run never rewrites a row its files hold).
        evals: dir.evals()?.into_iter().filter(|e| e.step <= start).collect(),
        eps_by_t: if main { dir.eps_by_t()?.into_iter().filter(|r| r.0 <= start).collect() } else { Vec::new() },
        start,
    })
}

/// This process's part of a run, for its summary.
struct TrainingTime {
    /// Seconds of training in this process.
    wall: f64,
    /// The step it started from.
    start: u64,
    /// Whether it resumed a run.
    resumed: bool,
}

/// `summary.json` of a finished run; `time`: this process's part of it.
fn summarize(exp: &Experiment, model: &Model, log: &TrainLog, setup: &Setup, time: TrainingTime) -> Summary {
    let TrainingTime { wall, start, resumed } = time;
    let cfg = exp.config();
    // Throughput of the whole group: every rank trains on as many examples as this one.
    let world = setup.place.1 as u64;
    let (samples, tokens) = (log.samples * world, log.tokens * world);
    let rows = log.rows();
    let losses: Vec<f64> = rows.iter().map(|r| r.loss).collect();
    Summary {
        name: cfg.name.clone(),
        model: exp.model.kind().to_string(),
        topology: exp.topology.kind().to_string(),
        topology_label: exp.topology.label(),
        steps: cfg.train.steps,
        initial_loss: losses[0],
        final_loss: *losses.last().expect("at least one row"),
        min_loss: losses.iter().cloned().fold(f64::INFINITY, f64::min),
        steps_to_1e3: rows.iter().find(|r| r.loss <= 1e-3 * rows[0].loss).map(|r| r.step),
        steps_to_1e6: rows.iter().find(|r| r.loss <= 1e-6 * rows[0].loss).map(|r| r.step),
        steps_to_1e9: rows.iter().find(|r| r.loss <= 1e-9 * rows[0].loss).map(|r| r.step),
        loss_rate: loss_rate(&rows.iter().map(|r| (r.step as f64, r.loss)).collect::<Vec<_>>()),
        eval: log.evals.last().cloned(),
        gamma: rows.last().and_then(|r| r.gamma),
        num_params: model.num_params(),
        device: format!("{:?}", setup.dev),
        precision: format!("{:?}", cfg.precision).to_lowercase(),
        wall_seconds: wall,
        samples_per_second: samples as f64 / wall.max(1e-9),
        tokens_per_second: (tokens > 0).then(|| tokens as f64 / wall.max(1e-9)),
        resumed_from: resumed.then_some(start),
        parameter_view: setup.recorder.view(model),
        host_reads: log.host_reads.clone(),
        device_syncs: log.device_syncs.clone(),
    }
}

/// `summary.json`'s `parameter_view`: `[name, [[row], …]]`, as numpy's `tolist()` writes a matrix.
fn view_as_rows<S: serde::Serializer>(v: &Option<(String, crate::run_dir::Matrix)>, s: S) -> Result<S::Ok, S::Error> {
    use serde::Serialize;
    let rows: Option<(&String, Vec<Vec<f64>>)> =
        v.as_ref().map(|(n, m)| (n, m.rows().into_iter().map(|r| r.to_vec()).collect()));
    rows.serialize(s)
}

/// What a resumed `plexus train` run may change (the config's own rule, [`ResumeDiff::between`]).
///
/// [`ResumeDiff::between`]: crate::config::ResumeDiff::between
pub const RESUME_POLICY: lifecycle::ResumePolicy = lifecycle::ResumePolicy {
    length: crate::config::RUN_LENGTH_KEY,
    may_change: crate::config::may_change_on_resume,
    describe: "log.*, train.cuda_graphs and device",
};

/// The libtorch seed of one step: a mix of the run seed and the step (SplitMix64 finaliser).
fn step_seed(seed: u64, step: u64) -> u64 {
    let mut z = seed ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) >> 1
}

#[cfg(test)]
mod tests {
    /// A loss falling two decades per 1,000 steps has rate −2; the points past 1e-9 of the first
    /// (a flat round-off floor) are left out of the fit; a loss that is not positive has none.
    #[test]
    fn the_loss_rate_is_the_slope_of_the_log_loss_before_the_floor() {
        let mut pts: Vec<(f64, f64)> =
            (0..=450).map(|k| (10.0 * k as f64, 3.0 * 10f64.powf(-0.02 * k as f64))).collect();
        pts.extend((451..600).map(|k| (10.0 * k as f64, 3e-12)));
        let r = super::loss_rate(&pts).unwrap();
        assert!((r + 2.0).abs() < 1e-9, "{r}");
        assert_eq!(super::loss_rate(&[(0.0, 0.0), (10.0, 1.0)]), None);
        assert_eq!(super::loss_rate(&[(0.0, 1.0)]), None);
    }
}
