//! The training loop: build data and model from an [`Experiment`], optimise with parameter groups,
//! a schedule, clipping and gradient accumulation; log `metrics.csv` and `eval.csv`; save the
//! connectivity matrix C, resumable checkpoints and `summary.json` into a run directory.
//!
//! Reproducibility: model init is seeded by `seed`; libtorch's generator is reseeded from
//! `(seed, step)` at every step (dropout), and training batches are addressed by index. So a
//! CPU run is a pure function of its config, and a run resumed from a checkpoint writes the same
//! `metrics.csv` as an uninterrupted one.

pub mod checkpoint;
pub mod eval;
pub mod lifecycle;
pub mod optim;
pub mod schedule;
pub mod step;
pub mod trained;

use crate::data::prefetch::Prefetcher;
use crate::device;
use crate::experiment::Experiment;
use crate::host;
use crate::model::Model;
use crate::run_dir::{MetricsRow, RunDir};
use anyhow::{bail, Context, Result};
use checkpoint::TrainerState;
use eval::{EvalResult, EvalSet};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use optim::Optim;
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
    /// Abort (with an error, writing nothing more) once this many updates are done: simulates a
    /// crash, for testing that resumed runs match uninterrupted ones.
    pub crash_after: Option<u64>,
    /// This process's place in a data-parallel run (see [`crate::dist`]); `None`: one process.
    pub dist: Option<crate::dist::DistInfo>,
}

/// What `summary.json` holds.
#[derive(Debug, Clone, Serialize)]
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
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "view_as_rows")]
    pub parameter_view: Option<(String, crate::run_dir::Matrix)>,
    /// Device → host reads of each step this process ran (evaluation, connectivity and the
    /// step's own numbers included), in order: what `tests/device_discipline.rs` checks.
    #[serde(skip)]
    pub host_reads: Vec<u64>,
    /// Host-device syncs of each step as libtorch's dispatcher ran them ([`crate::native::SyncCount`]:
    /// a read hidden inside an operator counts too), when counting is on (`PLEXUS_COUNT_SYNCS=1`, or
    /// [`crate::native::watch_syncs`] called before); empty otherwise.
    #[serde(skip)]
    pub device_syncs: Vec<u64>,
}

pub fn train(exp: &Experiment, dir: &RunDir, opts: &TrainOptions) -> Result<Summary> {
    let cfg = exp.config();
    let tc = &cfg.train;
    // Rank 0 alone writes the run directory (every rank reads its checkpoints on resume).
    let main = crate::dist::DistInfo::is_main(opts.dist.as_ref());
    // The run directory is checked first (cheap, and the most likely mistake), but nothing is
    // created until data and model are built: a data or device error leaves no directory behind.
    let config_yaml = cfg.to_yaml();
    if main || opts.resume {
        lifecycle::precheck(dir, &config_yaml, opts.resume, opts.overwrite, &RESUME_POLICY)?;
    }
    let dev = device::resolve(cfg.device_request())?;
    let dev = match opts.dist.as_ref() {
        Some(d) => d.device(dev, device::Machine::current().cuda_devices)?,
        None => dev,
    };
    device::apply_matmul_precision(cfg.tf32)?;
    if opts.progress || opts.log_lines {
        eprintln!("{}: training on {}", cfg.name, device::describe(dev));
    }
    let compute = cfg.precision.compute_kind();
    let mut data = exp.data.load()?;
    let transform = data.input_transform();
    let eval_set = EvalSet::new(data.eval_batches(), &transform, dev);
    data.make_resident(dev);
    let per_epoch = data.batches_per_epoch().max(1);
    // The batch the connectivity of input-dependent topologies is averaged over.
    let first_batch = data.train_batch(0)?;
    let task = exp.task();
    let probe_input = transform.on(dev).apply(&first_batch.input.to_device(dev));
    // Diffusion models read noisy inputs: the probe is the first batch noised (drawn from the seed).
    let probe_input = device::with_seed(cfg.seed, || {
        task.prepare(crate::data::Batch { input: probe_input, target: first_batch.target.to_device(dev) }).input
    });
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

    let model = device::with_seed(cfg.seed, || Model::new(exp.model.as_ref(), exp.topology.as_ref(), dev, compute));
    let optim = Optim::new(tc, model.trainable());
    let mut t = Stepper::new(model, optim, task, tc.accumulation, tc.clip_grad_norm, &transform);
    // One writer per run directory, until this function returns (or the process dies).
    let mut run = lifecycle::open(dir, &config_yaml, opts.resume, opts.overwrite, &RESUME_POLICY, main)?;
    let (mut rows, mut evals, start) = match run.checkpoint.clone() {
        Some(state) => {
            let optim_state = checkpoint::load(dir, &state, &mut t.model.vs)?;
            t.optim.load_state(&optim_state, state.step)?;
            // `device` changed in words (`cpu` → `auto`) need not change the device: said only
            // when the run's own device, resolved here, is another one.
            let started_on = || -> Option<tch::Device> {
                let text = crate::config::read_config_text(&dir.config_file()).ok()?;
                let old: serde_yaml::Value = serde_yaml::from_str(&text).ok()?;
                device::resolve(device::parse_device(old.get("device")?.as_str()?).ok()?).ok()
            };
            if main && run.changed.iter().any(|k| k == "device") && started_on() != Some(dev) {
                eprintln!(
                    "{}: resumed at step {} on {} (another device than the run's start): from here its numbers are \
                     not bit-identical to an uninterrupted run (kernels and random streams differ by device)",
                    cfg.name,
                    state.step,
                    device::describe(dev)
                );
            }
            run.resumed(dir)?;
            let rows: Vec<MetricsRow> = dir.metrics()?.into_iter().filter(|r| r.step < state.step).collect();
            let evals: Vec<EvalResult> = dir.evals()?.into_iter().filter(|e| e.step < state.step).collect();
            (rows, evals, state.step)
        }
        None => (Vec::new(), Vec::new(), 0),
    };

    if let Some(info) = &opts.dist {
        // After any resume: every rank loaded the same checkpoint, and rank 0's values win anyway.
        t.distribute(crate::dist::Dist::join(info.clone(), dev)?)?;
    }
    if let Some(note) = t.use_cuda_graphs(tc.cuda_graphs)? {
        if main {
            eprintln!("{}: {note}", cfg.name);
        }
    }
    let mut eps_by_t: Vec<(u64, Vec<f64>)> =
        if main { dir.eps_by_t()?.into_iter().filter(|r| r.0 < start).collect() } else { Vec::new() };
    let steps = tc.steps;
    let accum = tc.accumulation;
    let mut batches = Prefetcher::new(data, start * accum, 4, dev, (rank, world));
    let bar = progress_bar(steps, start, &cfg.name, opts.progress);
    // A line above the bar, or a plain line without a terminal.
    let say = |line: String| {
        if opts.log_lines {
            eprintln!("{line}");
        } else {
            bar.println(line);
        }
    };
    // What changed how the run trains (a CUDA graph given up, say): shown under --quiet too, where
    // the bar is hidden and `say` prints nothing.
    let warn = |line: String| {
        if bar.is_hidden() {
            eprintln!("{line}");
        } else {
            say(line);
        }
    };
    let clock = Instant::now();
    let mut log_line = opts.log_lines.then(|| LogLine::new(exp, dev, start));
    // Rank 0 alone writes the run's TensorBoard events, as it alone writes metrics.csv.
    let mut board = match main && cfg.log.tensorboard {
        true => Some(Board::new(exp, dev, dir, start, &config_yaml)?),
        false => None,
    };
    let (mut samples, mut tokens) = (0u64, 0u64);
    let mut host_reads = Vec::new();
    let mut device_syncs = Vec::new();
    if crate::native::count_syncs_requested()? {
        crate::native::watch_syncs()?;
    }
    let syncs = || crate::native::sync_count().map(|c| c.total);
    let every = |n: u64, step: u64| (n > 0 && step.is_multiple_of(n)) || step == steps;
    for step in start..=steps {
        let reads_before = host::reads();
        let syncs_before = syncs();
        // Rank 0 alone evaluates and saves C (the others wait at the next all-reduce).
        if main && every(cfg.log.eval_every, step) {
            if let crate::data::Task::Diffusion(d) = task {
                if let Some((e, buckets)) = eval::evaluate_diffusion(&d, &eval_set, step, |x| t.model.forward(x, false))
                {
                    say(format!("{} step {step}: eval ε-MSE {:.4}", cfg.name, e.loss));
                    if let Some(b) = board.as_mut() {
                        b.eval(&e)?;
                    }
                    evals.push(e);
                    eps_by_t.push((step, buckets));
                    dir.write_eps_by_t(&eps_by_t, crate::task::ddpm::STEPS as usize)?;
                }
            } else if let Some(e) = eval::evaluate(&t.model, task, &eval_set, step) {
                say(format!("{} step {step}: eval {e}", cfg.name));
                if let Some(b) = board.as_mut() {
                    b.eval(&e)?;
                }
                evals.push(e);
            }
        }
        if main && every(cfg.log.connectivity_every, step) {
            let c = t.model.connectivity(&probe_input);
            dir.write_connectivity(step, &c)?;
            if let Some(b) = board.as_mut() {
                b.writer.matrix_image(step, "connectivity/C", &host::matrix(&c), 16)?;
            }
            // The topology's own view (H-ACN's a, ANCRe's p, …), for Δ_t and correlations later.
            if let Some((name, view)) = t.model.parameter_view(&probe_input) {
                dir.write_param_view(&name, step, &view)?;
            }
        }

        let lr = schedule::lr_at(tc, step.min(steps - 1));
        // Reseeded from (seed, step), under the process-wide seed lock: dropout masks are a pure
        // function of the step, so a resumed run redraws exactly the masks it would have drawn.
        // (Each rank draws its own dropout masks; rank 0 draws those of a single-process run.)
        let rng = device::seed_guard(step_seed(cfg.seed ^ (rank as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93), step));
        // The last step only measures the final loss: no update after it. Each rank trains on its
        // slice of the global batch (the data thread makes only that slice).
        let next = || batches.next_batch();
        let stats = t.step(step, next, (step < steps).then_some(lr))?;
        drop(rng);
        if let Some(note) = t.take_note() {
            if main {
                warn(format!("{}: {note}", cfg.name));
            }
        }
        samples += stats.samples;
        tokens += stats.tokens;

        let done = step + 1;
        let checkpoint_due = cfg.log.checkpoint_every > 0 && done % cfg.log.checkpoint_every == 0 && done < steps;
        // Logging and checkpoint steps read the step's numbers (one read); other steps read nothing.
        if every(cfg.log.every, step) || checkpoint_due {
            let logged = t.read(&stats)?;
            if let Some((first, what)) = logged.diverged {
                if main {
                    write_logs(dir, &rows, &evals)?;
                }
                let what = match what {
                    step::NonFinite::Loss => "the loss",
                    step::NonFinite::Gradient => "the gradient",
                };
                bail!(
                    "{}: step {first}: {what} went non-finite: {}; metrics up to here are in {}, and no checkpoint \
                     after the divergence was kept",
                    cfg.name,
                    t.diagnose(first, step),
                    dir.metrics_file().display()
                );
            }
            if every(cfg.log.every, step) {
                let epoch = (step * accum) as f64 / per_epoch as f64;
                let (loss, grad_norm, gamma) = (logged.loss, logged.grad_norm, logged.gamma);
                rows.push(MetricsRow { step, epoch, loss, lr, grad_norm, gamma });
                if let (Some(b), Some(row)) = (board.as_mut(), rows.last()) {
                    b.row(row, samples, tokens)?;
                }
                bar.set_message(format!("{loss:.3e}"));
                if let (Some(l), Some(row), true) = (log_line.as_mut(), rows.last(), main) {
                    eprintln!("{}", l.line(row, samples, tokens));
                }
            }
        }
        host_reads.push(host::reads() - reads_before);
        if let (Some(before), Some(now)) = (syncs_before, syncs()) {
            device_syncs.push(now - before);
        }
        if step == steps {
            break;
        }
        bar.inc(1);
        if opts.crash_after == Some(done) {
            bail!("{}: simulated crash after {done} updates", cfg.name);
        }
        if checkpoint_due && main {
            write_logs(dir, &rows, &evals)?;
            save_checkpoint(dir, &t.model, &t.optim, done, done * accum, cfg.log.keep_checkpoints)?;
        }
    }
    bar.finish_and_clear();
    let wall = clock.elapsed().as_secs_f64();
    if main && !device_syncs.is_empty() {
        eprintln!("{}", sync_report(&cfg.name, &host_reads, &device_syncs));
    }

    if main {
        write_logs(dir, &rows, &evals)?;
        save_checkpoint(dir, &t.model, &t.optim, steps, steps * accum, cfg.log.keep_checkpoints)?;
        checkpoint::save_weights(&dir.final_checkpoint(), |p| {
            t.model.vs.save(p).with_context(|| format!("saving checkpoint {}", p.display()))
        })?;
        if let Some(ema) = t.optim.ema() {
            // Every variable of the model, the averaged value where there is one (a PyTorch
            // `state_dict` like final.safetensors).
            let mut named: Vec<(String, tch::Tensor)> = t.model.vs.variables().into_iter().collect();
            for (name, value) in named.iter_mut() {
                if let Some((_, e)) = ema.iter().find(|(n, _)| n == name) {
                    *value = e.shallow_clone();
                }
            }
            named.sort_by(|a, b| a.0.cmp(&b.0));
            checkpoint::save_weights(&dir.final_ema_checkpoint(), |p| {
                let refs: Vec<(&str, &tch::Tensor)> = named.iter().map(|(n, t)| (n.as_str(), t)).collect();
                tch::Tensor::write_safetensors(&refs, p).with_context(|| format!("saving {}", p.display()))
            })?;
        }
    }
    // Throughput of the whole group: every rank trains on as many examples as this one.
    let (samples, tokens) = (samples * world as u64, tokens * world as u64);
    let model = &t.model;
    let losses: Vec<f64> = rows.iter().map(|r| r.loss).collect();
    let summary = Summary {
        name: cfg.name.clone(),
        model: exp.model.kind().to_string(),
        topology: exp.topology.kind().to_string(),
        topology_label: exp.topology.label(),
        steps,
        initial_loss: losses[0],
        final_loss: *losses.last().expect("at least one row"),
        min_loss: losses.iter().cloned().fold(f64::INFINITY, f64::min),
        steps_to_1e3: rows.iter().find(|r| r.loss <= 1e-3 * rows[0].loss).map(|r| r.step),
        eval: evals.last().cloned(),
        gamma: rows.last().and_then(|r| r.gamma),
        num_params: model.num_params(),
        device: format!("{dev:?}"),
        precision: format!("{:?}", cfg.precision).to_lowercase(),
        wall_seconds: wall,
        samples_per_second: samples as f64 / wall.max(1e-9),
        tokens_per_second: (tokens > 0).then(|| tokens as f64 / wall.max(1e-9)),
        resumed_from: opts.resume.then_some(start),
        parameter_view: model.parameter_view(&probe_input).map(|(n, m)| (n, host::matrix(&m))),
        host_reads,
        device_syncs,
    };
    if main {
        lifecycle::finish(dir, &summary)?;
    }
    Ok(summary)
}

/// The plain progress line of a run without a terminal, one per logged step (nanoGPT's `iter …:
/// loss …, time … ms, mfu …`): throughput and ms/step since the previous logged step (a logged
/// step reads from the device, so the interval's time is the device's too), MFU against the GPU's
/// data-sheet peak where it is known ([`device::spec_peak_flops`]), ETA from the mean so far.
/// `summary.json`'s `parameter_view`: `[name, [[row], …]]`, as numpy's `tolist()` writes a matrix.
fn view_as_rows<S: serde::Serializer>(v: &Option<(String, crate::run_dir::Matrix)>, s: S) -> Result<S::Ok, S::Error> {
    use serde::Serialize;
    let rows: Option<(&String, Vec<Vec<f64>>)> =
        v.as_ref().map(|(n, m)| (n, m.rows().into_iter().map(|r| r.to_vec()).collect()));
    rows.serialize(s)
}

/// Throughput between two logged rows of this process: what the log line and the TensorBoard
/// events both report, measured once.
struct Rates {
    /// Training FLOPs per example (3 × the forward's), and the device's dense peak.
    flops_per_sample: f64,
    peak: Option<f64>,
    /// When, at which step and after how many examples and tokens the previous row was logged.
    last: (Instant, u64, u64, u64),
}

/// What [`Rates::since_last`] measured.
struct Rate {
    secs: f64,
    steps: u64,
    examples_per_s: f64,
    /// Language models only.
    tokens_per_s: Option<f64>,
    /// Where the device's peak is known.
    mfu: Option<f64>,
}

impl Rates {
    fn new(exp: &Experiment, dev: tch::Device, start: u64) -> Self {
        Rates {
            flops_per_sample: 3.0 * exp.model.forward_flops(),
            peak: device::spec_peak_of(dev, exp.config().precision.compute_kind()),
            last: (Instant::now(), start, 0, 0),
        }
    }

    /// The rate since the previous call, for a row at `step` with `samples`, `tokens` counted since
    /// this process started; `None` when no step ran since.
    fn since_last(&mut self, step: u64, samples: u64, tokens: u64) -> Option<Rate> {
        let now = Instant::now();
        let (then, last_step, last_samples, last_tokens) =
            std::mem::replace(&mut self.last, (now, step, samples, tokens));
        let secs = (now - then).as_secs_f64().max(1e-9);
        let steps = step.saturating_sub(last_step);
        (steps > 0 && samples > last_samples).then(|| {
            let examples_per_s = (samples - last_samples) as f64 / secs;
            Rate {
                secs,
                steps,
                examples_per_s,
                tokens_per_s: (tokens > last_tokens).then(|| (tokens - last_tokens) as f64 / secs),
                mfu: self.peak.map(|peak| examples_per_s * self.flops_per_sample / peak),
            }
        })
    }
}

/// The TensorBoard events of a run (rank 0): each metrics row as scalars with the throughput
/// since the previous row (and the model FLOP utilisation where the device's peak is known), each
/// evaluation, C as an image, the resolved config as text.
struct Board {
    writer: crate::tensorboard::EventWriter,
    rates: Rates,
}

impl Board {
    fn new(exp: &Experiment, dev: tch::Device, dir: &RunDir, start: u64, config_yaml: &str) -> Result<Self> {
        let mut writer = crate::tensorboard::EventWriter::create(&dir.path, start)?;
        writer.text(start, "config", &format!("```yaml\n{config_yaml}```"))?;
        Ok(Board { writer, rates: Rates::new(exp, dev, start) })
    }

    /// A metrics row; `samples`, `tokens`: counted since this process started.
    fn row(&mut self, row: &MetricsRow, samples: u64, tokens: u64) -> Result<()> {
        let mut values = vec![("train/loss", row.loss), ("train/lr", row.lr), ("train/grad_norm", row.grad_norm)];
        values.push(("train/epoch", row.epoch));
        values.extend(row.gamma.map(|g| ("train/gamma", g)));
        if let Some(r) = self.rates.since_last(row.step, samples, tokens) {
            values.push(("perf/examples_per_s", r.examples_per_s));
            values.extend(r.tokens_per_s.map(|t| ("perf/tokens_per_s", t)));
            values.extend(r.mfu.map(|m| ("perf/mfu", m)));
        }
        self.writer.scalars(row.step, &values)
    }

    fn eval(&mut self, e: &EvalResult) -> Result<()> {
        let mut values = vec![("eval/loss", e.loss)];
        values.extend(e.accuracy.map(|a| ("eval/accuracy", a)));
        values.extend(e.perplexity.map(|p| ("eval/perplexity", p)));
        self.writer.scalars(e.step, &values)
    }
}

struct LogLine {
    name: String,
    steps: u64,
    rates: Rates,
    first_step: u64,
    started: Instant,
}

impl LogLine {
    fn new(exp: &Experiment, dev: tch::Device, start: u64) -> Self {
        let cfg = exp.config();
        Self {
            name: cfg.name.clone(),
            steps: cfg.train.steps,
            rates: Rates::new(exp, dev, start),
            first_step: start,
            started: Instant::now(),
        }
    }

    /// The line of a logged `row`; `samples`, `tokens`: counted since this process started.
    fn line(&mut self, row: &MetricsRow, samples: u64, tokens: u64) -> String {
        let (name, steps, step, loss, lr) = (&self.name, self.steps, row.step, row.loss, row.lr);
        let mut text = format!("{name} step {step}/{steps}: loss {loss:.4}, lr {lr:.3e}");
        if let Some(r) = self.rates.since_last(step, samples, tokens) {
            match r.tokens_per_s {
                Some(t) => text += &format!(", {t:.0} tokens/s"),
                None => text += &format!(", {:.1} examples/s", r.examples_per_s),
            }
            text += &format!(", {:.1} ms/step", 1e3 * r.secs / r.steps as f64);
            if let Some(mfu) = r.mfu {
                text += &format!(", MFU {:.1} %", 100.0 * mfu);
            }
            let per_step =
                (Instant::now() - self.started).as_secs_f64() / step.saturating_sub(self.first_step).max(1) as f64;
            let eta = per_step * steps.saturating_sub(step) as f64;
            text += &format!(", ETA {}", indicatif::HumanDuration(std::time::Duration::from_secs_f64(eta)));
        }
        text
    }
}

/// The line `PLEXUS_COUNT_SYNCS=1` prints at the end of a run: the syncs libtorch ran on steps that
/// read nothing on purpose (each is a stall on a GPU, and a CUDA graph cannot capture it), then on
/// the logging steps, and by operator.
fn sync_report(name: &str, host_reads: &[u64], device_syncs: &[u64]) -> String {
    let (mut quiet, mut quiet_syncs, mut logged_syncs) = (0, 0, 0);
    for (reads, syncs) in host_reads.iter().zip(device_syncs) {
        if *reads == 0 {
            quiet += 1;
            quiet_syncs += syncs;
        } else {
            logged_syncs += syncs;
        }
    }
    let ops = crate::native::sync_count()
        .map(|c| c.by_name.iter().map(|(n, k)| format!("{n} ×{k}")).collect::<Vec<_>>().join(", "))
        .unwrap_or_default();
    format!(
        "{name}: host-device syncs counted by libtorch: {quiet_syncs} on the {quiet} steps that read nothing \
         (must be 0){}, {logged_syncs} on the {} logging steps; by operator, process-wide: {}",
        if quiet_syncs == 0 { "" } else { " — a hidden sync in the step" },
        host_reads.len() - quiet,
        if ops.is_empty() { "none".to_string() } else { ops }
    )
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

fn save_checkpoint(dir: &RunDir, model: &Model, optim: &Optim, step: u64, data_index: u64, keep: usize) -> Result<()> {
    let state = TrainerState {
        step,
        data_index,
        model_file: format!("step_{step}.safetensors"),
        optim_file: format!("step_{step}.optim.safetensors"),
        model_crc32: None,
        optim_crc32: None,
        files_crc32: Default::default(),
    };
    checkpoint::save(dir, &state, &model.vs, &optim.state(), keep)
}

fn write_logs(dir: &RunDir, rows: &[MetricsRow], evals: &[EvalResult]) -> Result<()> {
    dir.write_metrics(rows)?;
    dir.write_evals(evals)
}

fn progress_bar(steps: u64, start: u64, name: &str, show: bool) -> ProgressBar {
    let bar = ProgressBar::new(steps);
    if !show {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar.set_style(
        ProgressStyle::with_template("{prefix:>20} [{bar:30}] {pos}/{len} loss {msg} {per_sec} ETA {eta}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(name.to_string());
    bar.set_position(start);
    bar
}
