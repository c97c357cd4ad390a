//! The run log: [`RunLog`], what every trainer keeps and shows of its rows (any [`LogRow`]: the
//! table, its TensorBoard scalars, the progress bar, lines above it), and [`TrainLog`], `plexus
//! train`'s on top of it: evaluation rows (written through [`RunDir`]), a plain line per logged
//! step without a terminal, throughput scalars, and the count of host reads and device syncs per
//! step with the report that checks it.

use super::eval::EvalResult;
use crate::device;
use crate::experiment::Experiment;
use crate::run_dir::{MetricsRow, RunDir};
use anyhow::Result;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::time::Instant;

/// A row of a run's `metrics.csv`, of any trainer: it names its columns and its TensorBoard
/// scalars, and is written and read back (on resume) as its trainer's table.
pub trait LogRow: Sized {
    /// The table's columns.
    const COLUMNS: &'static [&'static str];
    /// Where the row is in the run, in its length unit (TensorBoard's step).
    fn step(&self) -> u64;
    /// The row's TensorBoard scalars, by tag (`train/loss`, `eval/success`, …).
    fn scalars(&self) -> Vec<(String, f64)>;
    /// What the progress bar shows of the row (`loss 1.234e0`).
    fn message(&self) -> String;
    /// Writes `rows` as the run's `metrics.csv` (atomically).
    fn write(dir: &RunDir, rows: &[Self]) -> Result<()>;
    /// The rows of the run's `metrics.csv` up to `step` (a resumed run's, at its checkpoint).
    fn read(dir: &RunDir, step: u64) -> Result<Vec<Self>>;
}

impl LogRow for MetricsRow {
    const COLUMNS: &'static [&'static str] = &crate::run_dir::METRICS_COLUMNS;

    fn step(&self) -> u64 {
        self.step
    }

    fn scalars(&self) -> Vec<(String, f64)> {
        let mut v = vec![("train/loss", self.loss), ("train/lr", self.lr), ("train/grad_norm", self.grad_norm)];
        v.push(("train/epoch", self.epoch));
        v.extend(self.gamma.map(|g| ("train/gamma", g)));
        v.into_iter().map(|(k, x)| (k.to_string(), x)).collect()
    }

    fn message(&self) -> String {
        format!("loss {:.3e}", self.loss)
    }

    fn write(dir: &RunDir, rows: &[Self]) -> Result<()> {
        dir.write_metrics(rows)
    }

    /// The rows up to `step` (the checkpoint's step; a row there is a finished run's last
    /// measurement, which a lengthened run keeps).
    fn read(dir: &RunDir, step: u64) -> Result<Vec<Self>> {
        Ok(dir.metrics()?.into_iter().filter(|r| r.step <= step).collect())
    }
}

/// What a run has logged so far and where it shows it, for a trainer whose rows are `R`: the
/// rows (with those of the run it resumes), the TensorBoard events where the run keeps them, and a
/// progress bar over the run's length unit or, without a terminal, plain lines.
pub struct RunLog<R: LogRow> {
    name: String,
    /// `metrics.csv`'s rows, including those of the run this one resumes.
    pub rows: Vec<R>,
    bar: ProgressBar,
    /// Plain lines instead of a bar (no terminal).
    plain: bool,
    board: Option<crate::tensorboard::EventWriter>,
}

impl<R: LogRow> RunLog<R> {
    /// The log of the run `name`, `total` units long, from `start` (where `rows` end: a resumed
    /// run's), shown as `output` says; `board`: the run's TensorBoard writer, where it keeps one.
    pub fn new(
        name: &str,
        start: u64,
        total: u64,
        rows: Vec<R>,
        output: LogOutput,
        board: Option<crate::tensorboard::EventWriter>,
    ) -> Self {
        RunLog {
            name: name.to_string(),
            rows,
            bar: progress_bar(total, start, name, output.progress),
            plain: output.log_lines,
            board,
        }
    }

    /// A line above the bar, or a plain line without a terminal (nothing under `--quiet`).
    pub fn say(&self, line: String) {
        if self.plain {
            eprintln!("{line}");
        } else {
            self.bar.println(line);
        }
    }

    /// What changed how the run trains (a CUDA graph given up, say): shown under `--quiet` too.
    pub fn warn(&self, line: String) {
        if self.bar.is_hidden() {
            eprintln!("{line}");
        } else {
            self.say(line);
        }
    }

    /// A row: kept, its scalars and `extra` ones to TensorBoard at its step, its message on the bar.
    /// A row at a step the log already holds (a finished run's last measurement, when the run is
    /// lengthened from there) is not replaced: a resumed run never rewrites a row its files hold;
    /// the held row's scalars go to TensorBoard again (a resumed run's events restart at its step).
    pub fn row(&mut self, row: R, extra: Vec<(String, f64)>) -> Result<()> {
        // Rows come in step order: only one at or before the last held step can be held already.
        let relogged = self.rows.last().is_some_and(|last| last.step() >= row.step());
        let held = if relogged { self.rows.iter().rev().find(|r| r.step() == row.step()) } else { None };
        if let Some(held) = held {
            if let Some(b) = self.board.as_mut() {
                let values = held.scalars();
                let refs: Vec<(&str, f64)> = values.iter().map(|(k, v)| (k.as_str(), *v)).collect();
                b.scalars(held.step(), &refs)?;
            }
            return Ok(());
        }
        if let Some(b) = self.board.as_mut() {
            let mut values = row.scalars();
            values.extend(extra);
            let refs: Vec<(&str, f64)> = values.iter().map(|(k, v)| (k.as_str(), *v)).collect();
            b.scalars(row.step(), &refs)?;
        }
        self.bar.set_message(row.message());
        self.rows.push(row);
        Ok(())
    }

    /// The run's TensorBoard writer, where it keeps one (for what is not a row: evaluations, C).
    pub fn board(&mut self) -> Option<&mut crate::tensorboard::EventWriter> {
        self.board.as_mut()
    }

    /// The bar at `done` units of the run.
    pub fn at(&self, done: u64) {
        self.bar.set_position(done);
    }

    /// `metrics.csv` as it stands.
    pub fn write(&self, dir: &RunDir) -> Result<()> {
        R::write(dir, &self.rows)
    }

    /// The bar cleared.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }

    /// The run's name, as the lines say it.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// A run's TensorBoard writer, its events from step `first` on (a resumed run drops what the
/// killed process logged from there), with the resolved config as text at step `at`.
pub fn open_board(
    run: &std::path::Path,
    first: u64,
    at: u64,
    config_yaml: &str,
) -> Result<crate::tensorboard::EventWriter> {
    let mut writer = crate::tensorboard::EventWriter::create(run, first)?;
    writer.text(at, "config", &format!("```yaml\n{config_yaml}```"))?;
    Ok(writer)
}

/// `plexus train`'s log: a [`RunLog`] of metrics rows with the evaluations, the plain line per
/// logged step, the throughput scalars and the per-step counts of reads and syncs. Rank 0 of a
/// data-parallel run writes; the others keep their rows (for the summary) and print nothing.
pub struct TrainLog {
    log: RunLog<MetricsRow>,
    /// `eval.csv`'s rows, including those of the run this one resumes.
    pub evals: Vec<EvalResult>,
    /// A diffusion run's validation ε-MSE per timestep bucket, by evaluation step.
    pub eps_by_t: Vec<(u64, Vec<f64>)>,
    line: Option<LogLine>,
    /// The throughput between TensorBoard rows (rank 0, where the config keeps events).
    rates: Option<Rates>,
    main: bool,
    /// Examples and tokens this process trained on.
    pub samples: u64,
    pub tokens: u64,
    /// Per step: device → host reads, and host-device syncs where they are counted.
    pub host_reads: Vec<u64>,
    pub device_syncs: Vec<u64>,
    /// The run trains on the CPU (its syncs are counted on this thread: [`syncs`]).
    cpu: bool,
}

/// Where a [`TrainLog`] starts: the rows of the run it resumes (empty for a new run) and the step.
pub struct Resumed {
    pub rows: Vec<MetricsRow>,
    pub evals: Vec<EvalResult>,
    pub eps_by_t: Vec<(u64, Vec<f64>)>,
    pub start: u64,
}

/// How a run shows and keeps its log ([`RunLog::new`], [`TrainLog::new`]).
#[derive(Debug, Clone, Copy)]
pub struct LogOutput {
    /// A progress bar on stderr.
    pub progress: bool,
    /// A plain line per logged step instead of the bar.
    pub log_lines: bool,
    /// This process writes the run directory (and its TensorBoard events, when the config asks).
    pub main: bool,
}

impl LogOutput {
    /// Nothing shown (a log that only keeps rows).
    pub fn hidden() -> Self {
        LogOutput { progress: false, log_lines: false, main: true }
    }
}

/// The counters at the start of a step ([`TrainLog::step_start`]).
#[derive(Debug, Clone, Copy)]
pub struct StepCounters {
    /// Device → host reads so far.
    host_reads: u64,
    /// libtorch's host-device syncs so far, where they are counted.
    device_syncs: Option<u64>,
}

impl TrainLog {
    /// The log of a run in `dir`, shown and kept as `output` says, from the step `resumed` gives.
    pub fn new(
        exp: &Experiment,
        dev: tch::Device,
        dir: &RunDir,
        output: LogOutput,
        config_yaml: &str,
        resumed: Resumed,
    ) -> Result<Self> {
        let cfg = exp.config();
        let start = resumed.start;
        if crate::native::profile::count_syncs_requested()? {
            crate::native::profile::watch_syncs()?;
        }
        let board = match output.main && cfg.log.tensorboard {
            true => Some(open_board(&dir.path, start, start, config_yaml)?),
            false => None,
        };
        Ok(TrainLog {
            rates: board.is_some().then(|| Rates::new(exp, dev, start)),
            log: RunLog::new(&cfg.name, start, cfg.train.steps, resumed.rows, output, board),
            evals: resumed.evals,
            eps_by_t: resumed.eps_by_t,
            line: output.log_lines.then(|| LogLine::new(exp, dev, start)),
            main: output.main,
            samples: 0,
            tokens: 0,
            host_reads: Vec::new(),
            device_syncs: Vec::new(),
            cpu: !dev.is_cuda(),
        })
    }

    /// `metrics.csv`'s rows so far.
    pub fn rows(&self) -> &[MetricsRow] {
        &self.log.rows
    }

    /// A line above the bar ([`RunLog::say`]).
    pub fn say(&self, line: String) {
        self.log.say(line);
    }

    /// A line shown under `--quiet` too ([`RunLog::warn`]).
    pub fn warn(&self, line: String) {
        self.log.warn(line);
    }

    /// An evaluation (with a diffusion run's ε-MSE per timestep bucket), said and kept. One at a
    /// step `eval.csv` already holds (a finished run's last, when the run is lengthened from
    /// there) is not replaced: the held one is kept, and sent to TensorBoard again.
    pub fn eval(&mut self, dir: &RunDir, e: EvalResult, buckets: Option<Vec<f64>>) -> Result<()> {
        let e = match self.evals.iter().rposition(|h| h.step == e.step) {
            Some(i) => {
                let held = self.evals[i].clone();
                return self.eval_scalars(&held);
            }
            None => e,
        };
        let name = self.log.name();
        match &buckets {
            Some(_) => self.say(format!("{name} step {}: eval ε-MSE {:.4}", e.step, e.loss)),
            None => self.say(format!("{name} step {}: eval {e}", e.step)),
        }
        self.eval_scalars(&e)?;
        let step = e.step;
        self.evals.push(e);
        if let Some(buckets) = buckets {
            self.eps_by_t.push((step, buckets));
            dir.write_eps_by_t(&self.eps_by_t, crate::task::ddpm::STEPS as usize)?;
        }
        Ok(())
    }

    /// An evaluation's TensorBoard scalars.
    fn eval_scalars(&mut self, e: &EvalResult) -> Result<()> {
        if let Some(b) = self.log.board() {
            let mut values = vec![("eval/loss", e.loss)];
            values.extend(e.accuracy.map(|a| ("eval/accuracy", a)));
            values.extend(e.perplexity.map(|p| ("eval/perplexity", p)));
            b.scalars(e.step, &values)?;
        }
        Ok(())
    }

    /// The connectivity matrix C at `step`, as a TensorBoard image.
    pub fn connectivity(&mut self, step: u64, c: &crate::run_dir::Matrix) -> Result<()> {
        match self.log.board() {
            Some(b) => b.matrix_image(step, "connectivity/C", c, 16),
            None => Ok(()),
        }
    }

    /// A metrics row: kept, sent to TensorBoard with the throughput since the previous row, shown
    /// on the bar or as a plain line.
    pub fn row(&mut self, row: MetricsRow) -> Result<()> {
        let (samples, tokens) = (self.samples, self.tokens);
        let mut perf = Vec::new();
        if let Some(r) = self.rates.as_mut().and_then(|r| r.since_last(row.step, samples, tokens)) {
            perf.push(("perf/examples_per_s".to_string(), r.examples_per_s));
            perf.extend(r.tokens_per_s.map(|t| ("perf/tokens_per_s".to_string(), t)));
            perf.extend(r.mfu.map(|m| ("perf/mfu".to_string(), m)));
        }
        if let (Some(l), true) = (self.line.as_mut(), self.main) {
            eprintln!("{}", l.line(&row, samples, tokens));
        }
        self.log.row(row, perf)
    }

    /// The counters at the start of a step, for [`TrainLog::step_done`].
    pub fn step_start(&self) -> StepCounters {
        StepCounters { host_reads: crate::host::reads(), device_syncs: syncs(self.cpu) }
    }

    /// One step done: its reads and syncs since `start` counted, the bar moved (but after the last).
    pub fn step_done(&mut self, start: StepCounters, step: u64, last: bool) {
        self.host_reads.push(crate::host::reads() - start.host_reads);
        if let (Some(before), Some(now)) = (start.device_syncs, syncs(self.cpu)) {
            self.device_syncs.push(now - before);
        }
        if !last {
            self.log.at(step + 1);
        }
    }

    /// `metrics.csv` and `eval.csv` as they stand.
    pub fn write(&self, dir: &RunDir) -> Result<()> {
        self.log.write(dir)?;
        dir.write_evals(&self.evals)
    }

    /// The bar cleared, and the sync report where syncs were counted.
    pub fn finish(&self) {
        self.log.finish();
        if self.main && !self.device_syncs.is_empty() {
            eprintln!("{}", sync_report(self.log.name(), &self.host_reads, &self.device_syncs));
        }
    }
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

/// libtorch's host-device syncs so far in this process, when they are counted.
/// The host-device syncs libtorch's dispatcher counted so far, where counting is on: on a CPU
/// the calling thread's (a step runs there, its backward included, so runs beside it in one
/// process — tests, a sweep's in-process runs — do not add theirs), on a GPU every thread's (its
/// backward runs on libtorch's device threads).
fn syncs(cpu: bool) -> Option<u64> {
    crate::native::profile::sync_count().map(|c| if cpu { c.this_thread } else { c.total })
}

/// The plain progress line of a run without a terminal, one per logged step (nanoGPT's `iter …:
/// loss …, time … ms, mfu …`): throughput and ms/step since the previous logged step (a logged
/// step reads from the device, so the interval's time is the device's too), MFU against the GPU's
/// data-sheet peak where it is known ([`device::spec_peak_flops`]), ETA from the mean so far.
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
    let ops = crate::native::profile::sync_count()
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

fn progress_bar(steps: u64, start: u64, name: &str, show: bool) -> ProgressBar {
    let bar = ProgressBar::new(steps);
    if !show {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar.set_style(
        ProgressStyle::with_template("{prefix:>20} [{bar:30}] {pos}/{len} {msg} {per_sec} ETA {eta}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(name.to_string());
    bar.set_position(start);
    bar
}
