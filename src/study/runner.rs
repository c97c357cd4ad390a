//! Running a sweep: each planned run in its own `plexus train|rl` process, on free slots (CPU
//! jobs, or one run per GPU), skipping finished runs and resuming killed ones; or a Slurm job
//! array that runs each one as a task.

use super::spec::PlannedRun;
use super::Manifest;
use crate::config::ExtendRule;
use crate::run_dir::RunDir;
use crate::train::lifecycle;
use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where runs go: `n` at a time on the CPU, or one per GPU (the ids CUDA_VISIBLE_DEVICES gets).
#[derive(Debug, Clone, PartialEq)]
pub enum Slots {
    Cpu(usize),
    Gpus(Vec<String>),
}

impl Slots {
    fn count(&self) -> usize {
        match self {
            Slots::Cpu(n) => *n,
            Slots::Gpus(g) => g.len(),
        }
    }
}

/// The GPUs of `--gpus all|0,1,…`: positions in CUDA_VISIBLE_DEVICES when it is set (so `all`
/// is exactly the GPUs the job was given), else device ordinals; `count` is how many CUDA
/// devices this process sees.
pub fn gpu_slots(arg: &str, visible: Option<&str>, count: usize) -> Result<Vec<String>> {
    let visible: Vec<String> = match visible {
        Some(v) => v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect(),
        None => (0..count).map(|i| i.to_string()).collect(),
    };
    if visible.is_empty() {
        bail!("--gpus {arg}: no CUDA device is visible (CUDA_VISIBLE_DEVICES is empty or no GPU was found); use --jobs N on the CPU");
    }
    if arg.trim() == "all" {
        return Ok(visible);
    }
    let mut out = Vec::new();
    for p in arg.split(',') {
        let i: usize = p.trim().parse().map_err(|_| {
            anyhow::anyhow!("--gpus {arg}: `{p}` is not a GPU index; allowed: `all` or indices such as 0,1")
        })?;
        let Some(id) = visible.get(i) else {
            bail!("--gpus {arg}: GPU {i} does not exist; {} are visible (0–{})", visible.len(), visible.len() - 1);
        };
        if out.contains(id) {
            bail!("--gpus {arg}: GPU {i} is listed twice");
        }
        out.push(id.clone());
    }
    Ok(out)
}

/// What a run directory needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunState {
    /// `summary.json` is there and the run is as long as planned, and its files are whole
    /// ([`damage`]).
    Done,
    /// Finished once, but a file it left is damaged (the reason): neither skipped nor retrained
    /// (retraining would delete what is left); the sweep reports it as failed.
    Damaged(String),
    /// Killed (or planned longer since): continue from its latest checkpoint.
    Resume,
    /// Not started, or killed before its first checkpoint: start it (clearing what is there).
    Fresh,
}

/// The config key of a run's length for `verb` (`train.steps`): a sweep may raise it to extend
/// finished runs, as `train --resume` allows.
pub fn length_key(verb: &str) -> Result<&'static str> {
    Ok(crate::kinds::by_verb(verb)?.resume_policy().length)
}

/// The resolved config a planned run trains (checks the config and its overrides).
pub fn resolved_yaml(run: &PlannedRun) -> Result<String> {
    Ok(crate::kinds::by_verb(&run.verb)?.load(&run.config, &run.overrides)?.yaml)
}

/// The state of `run` in `dir`; an error when the directory holds a run of another config.
pub fn state_of(dir: &Path, run: &PlannedRun, yaml: &str) -> Result<RunState> {
    let rd = RunDir::new(dir);
    if !rd.config_file().is_file() {
        return Ok(RunState::Fresh);
    }
    let kind = crate::kinds::by_verb(&run.verb)?;
    let p = kind.resume_policy();
    let diff = lifecycle::config_diff(&rd, yaml, p).with_context(|| format!("sweep run {}", run.name))?;
    if let [(key, old, new)] = diff.refused.as_slice() {
        if key == p.length {
            bail!(
                "sweep run {}: {} trained it with {key} = {old}, and the sweep now plans {new}; a sweep may lengthen \
                 its runs, not shorten them (give the shorter runs another --out)",
                run.name,
                dir.display()
            );
        }
    }
    if !diff.refused.is_empty() {
        let list: Vec<String> =
            diff.refused.iter().map(|(k, a, b)| format!("`{k}` is `{a}` there but `{b}` in the sweep")).collect();
        bail!(
            "sweep run {}: {} holds a run of another config ({}): a different sweep in the same folder? Give this \
             one another --out",
            run.name,
            dir.display(),
            list.join("; ")
        );
    }
    let changed = diff.allowed;
    if rd.summary_file().is_file() && !changed.iter().any(|k| k == p.length) {
        return Ok(match damage(&rd, kind) {
            None => RunState::Done,
            Some(why) => RunState::Damaged(why),
        });
    }
    Ok(match crate::train::checkpoint::latest(&rd)? {
        Some(_) => RunState::Resume,
        None => RunState::Fresh,
    })
}

/// What is wrong with the files of a finished run, if anything: `summary.json` must parse as a
/// JSON object, `metrics.csv` hold a header and whole rows of its width, ending in a newline, and
/// the final weights (where `kind` keeps them) match the checksum recorded when they were written.
pub fn damage(rd: &RunDir, kind: &dyn crate::kinds::RunKind) -> Option<String> {
    use crate::input_file::{read_bounded, read_json, MAX_RECORD_BYTES};
    let summary = rd.summary_file();
    let check = || -> Result<()> {
        let json: serde_json::Value = read_json(&summary, "a run summary")?;
        anyhow::ensure!(json.is_object(), "{} is not a run summary (a JSON object)", summary.display());
        let metrics = rd.metrics_file();
        let bytes = read_bounded(&metrics, MAX_RECORD_BYTES, "a metrics file")?;
        if !bytes.ends_with(b"\n") {
            bail!("{} is empty or ends in the middle of a row (truncated)", metrics.display());
        }
        let mut reader = csv::ReaderBuilder::new().flexible(false).from_reader(bytes.as_slice());
        let width = reader.headers().map(|h| h.len()).unwrap_or(0);
        let mut rows = 0usize;
        for (i, row) in reader.records().enumerate() {
            row.with_context(|| format!("{}: row {} is not whole", metrics.display(), i + 2))?;
            rows += 1;
        }
        if width < 2 || rows == 0 {
            bail!("{} holds no rows of metrics", metrics.display());
        }
        let weights = kind.final_weights(rd);
        if !weights.exists() {
            bail!("{} is missing", weights.display());
        }
        crate::train::checkpoint::verify_weights(&weights, true)
    };
    check().err().map(|e| format!("{e:#}"))
}

/// The rule the resumed sweep run `run` (in `out`, continuing with `yaml`) gives the updates a
/// lengthening adds: the sweep's `extend` where its schedule needs one, an error naming the
/// choices where it needs one and the sweep gives none.
fn lengthening(out: &Path, run: &PlannedRun, yaml: &str, manifest: &Manifest) -> Result<Option<ExtendRule>> {
    let kind = crate::kinds::by_verb(&run.verb)?;
    kind.lengthening(&RunDir::new(&out.join(&run.name)), yaml, manifest.spec.extend_rule).with_context(|| {
        format!(
            "sweep run {}: the sweep lengthens it; give the sweep `extend: hold|restart|stretch` (or --extend) for \
             every run it lengthens",
            run.name
        )
    })
}

/// The command line of one attempt at `run` (`rule`: what a lengthening's added updates do).
fn command(exe: &Path, dir: &Path, run: &PlannedRun, state: &RunState, rule: Option<ExtendRule>) -> Command {
    let mut cmd = Command::new(exe);
    cmd.arg(&run.verb);
    match state {
        RunState::Resume => {
            cmd.arg("--resume").arg(dir);
            if let Some(r) = rule {
                cmd.arg("--extend").arg(r.name());
            }
        }
        _ => {
            cmd.arg(&run.config).arg("--out").arg(dir).arg("--overwrite");
        }
    }
    cmd.arg("--quiet");
    for o in &run.overrides {
        cmd.arg("--set").arg(o.to_string());
    }
    cmd
}

/// How a sweep went.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Runs finished before this invocation.
    pub skipped: usize,
    /// Runs this invocation finished (resumed ones included).
    pub finished: usize,
    pub resumed: usize,
    /// `(run, log file, last lines of its log)`.
    pub failed: Vec<(String, PathBuf, String)>,
}

struct Running {
    slot: usize,
    index: usize,
    child: Child,
    started: Instant,
}

/// The runs of `manifest` (those in `only`, when given) that `run` trains, with their resolved
/// configs, and the outcome so far: finished ones skipped, damaged ones failed. A lengthening
/// whose schedule needs a rule the sweep does not give is refused here, before any run starts.
fn plan(out: &Path, manifest: &Manifest, only: &[String], logs: &Path) -> Result<(Vec<(usize, String)>, Outcome)> {
    let mut todo = Vec::new();
    let mut outcome = Outcome::default();
    for (i, r) in manifest.runs.iter().enumerate() {
        if !only.is_empty() && !only.contains(&r.name) {
            continue;
        }
        let yaml = resolved_yaml(r).with_context(|| format!("sweep run {}", r.name))?;
        match state_of(&out.join(&r.name), r, &yaml)? {
            RunState::Done => outcome.skipped += 1,
            RunState::Damaged(why) => outcome.failed.push((
                r.name.clone(),
                logs.join(format!("{}.log", r.name)),
                format!(
                    "finished before, but {why}; it is left as it is: move or delete {} to train it anew",
                    out.join(&r.name).display()
                ),
            )),
            // Fresh or to resume: which, is read again just before the run starts.
            RunState::Resume => {
                lengthening(out, r, &yaml, manifest)?;
                todo.push((i, yaml))
            }
            RunState::Fresh => todo.push((i, yaml)),
        }
    }
    Ok((todo, outcome))
}

/// Runs `manifest`'s runs (only those named in `only`, when given) in `out`, `slots` at a time.
/// Each run's output goes to `out/logs/<name>.log`. Finished runs are skipped, killed ones
/// resumed; a failed run does not stop the others.
pub fn run(out: &Path, manifest: &Manifest, only: &[String], slots: &Slots, quiet: bool) -> Result<Outcome> {
    let logs = out.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    for name in only {
        if !manifest.runs.iter().any(|r| &r.name == name) {
            bail!("--only {name}: the sweep in {} has no such run", out.display());
        }
    }
    // Every run's config is checked, and every directory's state read, before the first starts.
    let (todo, outcome) = plan(out, manifest, only, &logs)?;
    let mut sweep = Sweep::new(out, manifest, slots, outcome, todo.len(), quiet)?;
    let mut free: Vec<usize> = (0..slots.count()).rev().collect();
    let mut running: Vec<Running> = Vec::new();
    let mut queue = todo.into_iter();
    loop {
        while let Some(slot) = free.pop() {
            let Some((i, yaml)) = queue.next() else {
                free.push(slot);
                break;
            };
            match sweep.start(slot, i, &yaml)? {
                Some(started) => running.push(started),
                None => free.push(slot),
            }
        }
        if running.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        let mut k = 0;
        while k < running.len() {
            let Some(status) = running[k].child.try_wait()? else {
                k += 1;
                continue;
            };
            let done = running.swap_remove(k);
            free.push(done.slot);
            sweep.finished(done, status);
        }
        sweep.show_state(queue.len() + running.len(), running.len());
    }
    sweep.progress.finish_and_clear();
    Ok(sweep.outcome)
}

/// A sweep under way: where it starts runs, with what, and how it has gone so far.
struct Sweep<'a> {
    out: &'a Path,
    manifest: &'a Manifest,
    slots: &'a Slots,
    exe: PathBuf,
    logs: PathBuf,
    /// OMP_NUM_THREADS for a CPU slot: the cores shared evenly.
    threads: usize,
    outcome: Outcome,
    /// How long each run this invocation finished took, seconds (for the ETA).
    durations: Vec<f64>,
    progress: ProgressBar,
    /// The bar is drawn (a terminal, not --quiet); else lines go to stderr unless quiet.
    show: bool,
    quiet: bool,
}

impl<'a> Sweep<'a> {
    /// A sweep of `todo` runs still to make after `outcome` (what [`plan`] found).
    fn new(
        out: &'a Path,
        manifest: &'a Manifest,
        slots: &'a Slots,
        outcome: Outcome,
        todo: usize,
        quiet: bool,
    ) -> Result<Self> {
        let exe = std::env::current_exe().context("locating the plexus binary")?;
        let logs = out.join("logs");
        let total = outcome.skipped + todo;
        let show = !quiet && std::io::stderr().is_terminal();
        let progress = if show { ProgressBar::new(total as u64) } else { ProgressBar::hidden() };
        progress.set_style(
            ProgressStyle::with_template("{bar:30.cyan/blue} {pos}/{len} runs done · {msg}")
                .expect("static template")
                .progress_chars("=> "),
        );
        progress.set_position(outcome.skipped as u64);
        let threads = match slots {
            Slots::Cpu(n) => (std::thread::available_parallelism().map_or(1, |c| c.get()) / n).max(1),
            Slots::Gpus(_) => 0,
        };
        let sweep =
            Sweep { out, manifest, slots, exe, logs, threads, outcome, durations: Vec::new(), progress, show, quiet };
        if sweep.outcome.skipped > 0 {
            sweep.say(format!(
                "sweep {}: {} of {total} runs already finished, skipped",
                out.display(),
                sweep.outcome.skipped
            ));
        }
        Ok(sweep)
    }

    fn say(&self, line: String) {
        if self.show {
            self.progress.println(line)
        } else if !self.quiet {
            eprintln!("{line}")
        }
    }

    fn log_of(&self, name: &str) -> PathBuf {
        self.logs.join(format!("{name}.log"))
    }

    /// Starts planned run `i` (its resolved config `yaml`) on `slot`, or returns `None` when it
    /// needs no start after all (finished meanwhile, or found damaged).
    fn start(&mut self, slot: usize, i: usize, yaml: &str) -> Result<Option<Running>> {
        let r = &self.manifest.runs[i];
        let dir = self.out.join(&r.name);
        // Read again just before starting: another process (a Slurm task of the same run, a
        // sweep with --only) may have finished it since, and a fresh start would delete it.
        let state = match state_of(&dir, r, yaml)? {
            RunState::Done => {
                self.outcome.skipped += 1;
                self.progress.inc(1);
                self.say(format!("{} was finished by another process meanwhile; skipped", r.name));
                return Ok(None);
            }
            RunState::Damaged(why) => {
                self.outcome.failed.push((r.name.clone(), self.log_of(&r.name), why));
                return Ok(None);
            }
            now => now,
        };
        let log_path = self.log_of(&r.name);
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        let rule = match state {
            RunState::Resume => lengthening(self.out, r, yaml, self.manifest)?,
            _ => None,
        };
        let mut cmd = command(&self.exe, &dir, r, &state, rule);
        use std::io::Write;
        writeln!(log, "=== {cmd:?}").ok();
        cmd.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
        match self.slots {
            Slots::Cpu(_) if std::env::var_os("OMP_NUM_THREADS").is_none() => {
                cmd.env("OMP_NUM_THREADS", self.threads.to_string());
            }
            Slots::Gpus(ids) => {
                cmd.env("CUDA_VISIBLE_DEVICES", &ids[slot]);
            }
            _ => {}
        }
        crate::dist::stop_with_parent(&mut cmd);
        let child = cmd.spawn().with_context(|| format!("starting {}", self.exe.display()))?;
        let verb = if state == RunState::Resume { "resumed" } else { "started" };
        let place = match self.slots {
            Slots::Gpus(ids) => format!(" on GPU {}", ids[slot]),
            Slots::Cpu(_) => String::new(),
        };
        self.say(format!("{verb} {}{place}", r.name));
        if state == RunState::Resume {
            self.outcome.resumed += 1;
        }
        Ok(Some(Running { slot, index: i, child, started: Instant::now() }))
    }

    /// Records a run that exited with `status`: a finished one gets its hparams and the
    /// registration it was made under; a failed one, the last lines of its log.
    fn finished(&mut self, done: Running, status: std::process::ExitStatus) {
        let r = &self.manifest.runs[done.index];
        let secs = done.started.elapsed().as_secs_f64();
        if !status.success() {
            let log = self.log_of(&r.name);
            let tail = match last_lines(&log, 3) {
                t if t.is_empty() => format!("it exited ({status}) without writing a line to its log"),
                t => t,
            };
            self.say(format!("FAILED {} ({status}): {tail} (log: {})", r.name, log.display()));
            self.outcome.failed.push((r.name.clone(), log, tail));
            return;
        }
        self.durations.push(secs);
        self.outcome.finished += 1;
        self.progress.inc(1);
        self.say(format!("finished {} ({secs:.0} s)", r.name));
        if let Err(e) = write_hparams(&self.out.join(&r.name), r) {
            self.say(format!("{}: its TensorBoard hparams were not written: {e:#}", r.name));
        }
        if let Some(reg) = &self.manifest.registration {
            let file = self.out.join(&r.name).join(super::REGISTRATION_FILE);
            let json = serde_json::to_string_pretty(reg).expect("a registration serialises") + "\n";
            if let Err(e) = crate::run_dir::atomic_write(&file, json.as_bytes()) {
                self.say(format!("{}: what it was made under was not recorded ({}): {e:#}", r.name, file.display()));
            }
        }
    }

    /// The bar's message: how many run and failed, and when the `left` runs should be done.
    fn show_state(&self, left: usize, running: usize) {
        let eta = match self.durations.len() {
            0 => String::new(),
            n => {
                let mean = self.durations.iter().sum::<f64>() / n as f64;
                let secs = mean * left as f64 / self.slots.count() as f64;
                format!(" · ETA {}", indicatif::HumanDuration(Duration::from_secs_f64(secs)))
            }
        };
        self.progress.set_message(format!("{running} running, {} failed{eta}", self.outcome.failed.len()));
    }
}

/// The event file of a sweep run's hyperparameters, in its `tensorboard/` folder.
pub const HPARAMS_EVENTS: &str = "events.out.tfevents.hparams.plexus";

/// Writes a finished run's grid point and seed as TensorBoard hparams (its HPARAMS dashboard then
/// lists a sweep's runs by them, and groups the seeds of one point), where the run logs
/// TensorBoard events.
pub fn write_hparams(dir: &Path, run: &PlannedRun) -> Result<()> {
    if !dir.join(crate::tensorboard::DIR).is_dir() {
        return Ok(());
    }
    let mut hparams = run.point.clone();
    hparams.push(("seed".into(), run.seed.to_string()));
    let group: Vec<String> = run.point.iter().map(|(k, v)| format!("{k}={v}")).collect();
    crate::tensorboard::EventWriter::replace(dir, HPARAMS_EVENTS, |w| w.hparams(&hparams, &group.join(",")))?;
    Ok(())
}

/// The last `n` non-empty lines of a log, joined by ` | `.
fn last_lines(path: &Path, n: usize) -> String {
    use std::io::{Read, Seek, SeekFrom};
    // The last 64 KiB hold the last lines of any log; a run's log can be far longer.
    let mut bytes = Vec::new();
    if let Ok(mut f) = crate::input_file::open_regular(path) {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f
            .seek(SeekFrom::Start(len.saturating_sub(64 << 10)))
            .and_then(|_| f.take(64 << 10).read_to_end(&mut bytes));
    }
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty() && !l.starts_with("=== ")).collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

/// The most tasks of one Slurm job array under Slurm's default `MaxArraySize` (1001: indices
/// 0–1000).
pub const SLURM_MAX_ARRAY: usize = 1001;

/// A Slurm batch script that runs the sweep in `out` as a job array: task `i` runs the `i`-th
/// run (`plexus sweep --resume OUT --only NAME`, so a requeued task skips or resumes). `gpus`:
/// request one GPU per task.
pub fn slurm_script(exe: &Path, out: &Path, manifest: &Manifest, gpus: bool) -> String {
    let name = out.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "sweep".into());
    let mut s = String::from("#!/bin/bash\n");
    s.push_str(&format!("#SBATCH --job-name=plexus-{name}\n"));
    s.push_str(&format!("#SBATCH --array=0-{}\n", manifest.runs.len().saturating_sub(1)));
    if gpus {
        s.push_str("#SBATCH --gres=gpu:1\n");
    }
    s.push_str(&format!("#SBATCH --output={}/logs/slurm-%A_%a.out\n", out.display()));
    s.push_str(
        "# Written by `plexus sweep --slurm`: one array task per run of the sweep. Each task runs\n\
         # `plexus sweep --resume <folder> --only <run>`, which skips a finished run and resumes a\n\
         # killed one, so a requeued or re-submitted array continues where it stopped. Add the\n\
         # partition, time and account lines of your cluster above.\n",
    );
    s.push_str("set -euo pipefail\nRUNS=(\n");
    for r in &manifest.runs {
        s.push_str(&format!("  {}\n", shell_quote(&r.name)));
    }
    s.push_str(")\n");
    s.push_str(&format!(
        "exec {} sweep --resume {} --only \"${{RUNS[$SLURM_ARRAY_TASK_ID]}}\" --quiet\n",
        shell_quote(&exe.display().to_string()),
        shell_quote(&out.display().to_string())
    ));
    s
}

fn shell_quote(s: &str) -> String {
    if s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.,=/+:@".contains(c)) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpus_are_positions_in_cuda_visible_devices() {
        assert_eq!(gpu_slots("all", Some("2,3"), 2).unwrap(), vec!["2", "3"]);
        assert_eq!(gpu_slots("1", Some("2,3"), 2).unwrap(), vec!["3"]);
        assert_eq!(gpu_slots("all", None, 2).unwrap(), vec!["0", "1"]);
        let e = gpu_slots("0,2", Some("5,6"), 2).unwrap_err().to_string();
        assert!(e.contains("GPU 2 does not exist"), "{e}");
        assert!(gpu_slots("all", None, 0).unwrap_err().to_string().contains("--jobs"));
        assert!(gpu_slots("x", None, 1).unwrap_err().to_string().contains("not a GPU index"));
    }
}
