//! Run directories and atomic file writes.
//!
//! Layout: `config.yaml` (resolved), `resolved.yaml` (derived values: shapes, normalisation, the
//! held-out rows; written by the trainer), `inputs.yaml` (the pinned inputs), `numerics.yaml` (the
//! trainers' settings record), `metrics.csv`, `summary.json`, `connectivity/`,
//! `checkpoints/`, `figures/`. Every file is written to a temporary file in the same directory and
//! renamed into place, so a crash leaves either the old file or the new one, never half of one.
//! Temporary files left by a crash (`.tmp-*`) are removed when a run starts or resumes
//! ([`RunDir::clean_leftovers`]).
//!
//! A process that trains into a run directory holds an exclusive lock on its `.lock` file
//! ([`RunDir::lock`]): an advisory `flock`, which the kernel releases when the process exits,
//! however it exits, so a lock is never stale.

use anyhow::{bail, Context, Result};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

/// The lock file of a run directory.
pub const LOCK_FILE: &str = ".lock";

/// A temporary-file builder for outputs: mode `0666`, which the kernel masks with the umask when
/// it creates the file, as for any file a program creates (tempfile's default is `0600`, which
/// would make every output private whatever the umask says).
fn output_tempfile() -> tempfile::Builder<'static, 'static> {
    let mut b = tempfile::Builder::new();
    b.prefix(".tmp-");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        b.permissions(std::fs::Permissions::from_mode(0o666));
    }
    b
}

fn parent_dir(path: &Path) -> &Path {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// What is at `path`, for an output check: `None` when nothing is; else its kind in words ("a
/// regular file", "a directory", "a symbolic link to a character device", …) and whether it is a
/// regular file (not through a link) and whether it is a directory (a link to one included).
fn output_kind(path: &Path) -> Result<Option<(String, bool, bool)>> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot inspect {}", path.display())),
    };
    let kind = meta.file_type();
    if kind.is_file() {
        return Ok(Some(("a regular file".into(), true, false)));
    }
    if kind.is_symlink() {
        let to = std::fs::read_link(path).map(|t| format!(" ({})", t.display())).unwrap_or_default();
        return Ok(Some(match std::fs::metadata(path) {
            Ok(m) if m.is_file() => (format!("a symbolic link to a regular file{to}"), false, false),
            Ok(m) => {
                (format!("a symbolic link to {}{to}", crate::input_file::kind_name(&m.file_type())), false, m.is_dir())
            }
            Err(_) => (format!("a symbolic link to nothing{to}"), false, false),
        }));
    }
    Ok(Some((crate::input_file::kind_name(&kind).to_string(), false, kind.is_dir())))
}

/// An existing ancestor of `path` that is not a directory, as an error (a file cannot go inside it).
fn check_ancestors(path: &Path) -> Result<()> {
    if let Some(a) = path.ancestors().skip(1).find(|a| !a.as_os_str().is_empty() && a.exists() && !a.is_dir()) {
        bail!("{} exists and is not a directory ({} would go inside it)", a.display(), path.display());
    }
    Ok(())
}

/// Checks an output file before any work: `path` must be absent (it is created) or a regular file
/// (replaced whole, atomically); a directory, a device (`/dev/null`, `/dev/full`), a FIFO, a socket
/// or a symbolic link (whatever it points to) is refused, naming the path and what it is, so that a
/// verb never replaces what it did not create. `what` names the path in the error (`--trace`).
pub fn check_output_file(path: &Path, what: &str) -> Result<()> {
    check_ancestors(path).with_context(|| format!("{what} {}", path.display()))?;
    match output_kind(path)? {
        None | Some((_, true, _)) => Ok(()),
        Some((kind, false, _)) => bail!(
            "{what} {} is {kind}: an output file must be a new path or a regular file, which plexus replaces \
             whole; give another path",
            path.display()
        ),
    }
}

/// [`check_output_file`] for a file that rows are appended to (`bench --csv`): the same paths are
/// refused, with words that say what happens to the file (its rows kept, the new ones added).
pub fn check_append_file(path: &Path, what: &str) -> Result<()> {
    check_ancestors(path).with_context(|| format!("{what} {}", path.display()))?;
    match output_kind(path)? {
        None | Some((_, true, _)) => Ok(()),
        Some((kind, false, _)) => bail!(
            "{what} {} is {kind}: the CSV rows are appended to must be a new path or a regular file (its rows kept, \
             the new ones added after them); give another path",
            path.display()
        ),
    }
}

/// Checks an output folder before any work: `path` must be absent (it is created) or a directory (a
/// symbolic link to one included: the files go inside it); a regular file, a device, a FIFO, a
/// socket or a link to one of them is refused, naming the path and what it is.
pub fn check_output_dir(path: &Path, what: &str) -> Result<()> {
    check_ancestors(path).with_context(|| format!("{what} {}", path.display()))?;
    match output_kind(path)? {
        None | Some((_, _, true)) => Ok(()),
        Some((kind, _, false)) => bail!(
            "{what} {} is {kind}: an output folder must be a new path or a directory; give another path",
            path.display()
        ),
    }
}

/// A folder a verb is about to create, removed with everything in it if the verb fails before
/// [`CreatedDir::keep`] (dropped armed: on an error's early return): a failed `sweep --slurm` or
/// `report` leaves no folder of its own behind. A folder that existed before is never removed.
#[derive(Debug)]
pub struct CreatedDir(Option<PathBuf>);

impl CreatedDir {
    /// Arms the guard for `dir` if nothing is there yet (call it before creating the folder).
    pub fn if_absent(dir: &Path) -> Self {
        Self(std::fs::symlink_metadata(dir).is_err().then(|| dir.to_path_buf()))
    }
    /// The verb succeeded: the folder stays.
    pub fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for CreatedDir {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Writes a set of files into the folder `dir` all or nothing: `write` writes them into a private
/// temporary folder (`.tmp-*`) inside `dir` and returns their paths; once it has succeeded, and none
/// of the final paths is anything but absent or a regular file ([`check_output_file`]), each is
/// renamed into place. On any failure the temporary folder goes, and `dir` too if this call created
/// it: a failed report leaves no half-written folder. Returns the final paths, in `write`'s order.
pub fn write_all_or_nothing(dir: &Path, write: impl FnOnce(&Path) -> Result<Vec<PathBuf>>) -> Result<Vec<PathBuf>> {
    check_output_dir(dir, "the output folder")?;
    let created = CreatedDir::if_absent(dir);
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let staging = tempfile::Builder::new()
        .prefix(".tmp-")
        .tempdir_in(dir)
        .with_context(|| format!("creating a temporary folder in {}", dir.display()))?;
    // Errors name the final paths, not the temporary folder's.
    let (inside, instead) = (format!("{}/", staging.path().display()), format!("{}/", dir.display()));
    let written = write(staging.path()).map_err(|e| anyhow::anyhow!(format!("{e:#}").replace(&inside, &instead)))?;
    let moves = written
        .iter()
        .map(|p| {
            let rel = p
                .strip_prefix(staging.path())
                .with_context(|| format!("{} is not in the staging folder", p.display()))?;
            Ok((p.clone(), dir.join(rel)))
        })
        .collect::<Result<Vec<_>>>()?;
    for (_, to) in &moves {
        check_output_file(to, "the output")?;
    }
    for (from, to) in &moves {
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::rename(from, to).with_context(|| format!("writing {}", to.display()))?;
    }
    created.keep();
    Ok(moves.into_iter().map(|(_, to)| to).collect())
}

/// Writes `bytes` to `path` atomically (temp file in the same directory, fsync, rename). Errors
/// name `path`, never the temporary file.
pub fn atomic_write(path: &Path, bytes: &[u8]) -> Result<()> {
    atomic_write_with(path, |tmp| {
        let mut f = std::fs::OpenOptions::new().write(true).truncate(true).open(tmp)?;
        f.write_all(bytes)?;
        Ok(())
    })
}

/// Runs `write` on a temporary path in `path`'s directory, then renames it to `path`. For writers
/// that want a path (libtorch's safetensors saver). Errors name `path` (the temporary file, which
/// is removed on failure, is an implementation detail). `path` must be absent or a regular file
/// ([`check_output_file`]): a rename would replace a link, a device or an empty directory.
pub fn atomic_write_with(path: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let result = (|| -> Result<()> {
        let dir = parent_dir(path);
        if let Some(file) = dir.ancestors().find(|a| a.exists() && !a.is_dir()) {
            bail!("{} exists and is not a directory (the file goes inside it)", file.display());
        }
        if let Some((kind, false, _)) = output_kind(path)? {
            bail!("it is {kind}, not a regular file plexus may replace");
        }
        std::fs::create_dir_all(dir).with_context(|| format!("creating the directory {}", dir.display()))?;
        // Keep the extension: some writers pick the format from it (tch: `.safetensors`).
        let suffix = path.extension().map(|e| format!(".{}", e.to_string_lossy())).unwrap_or_default();
        let tmp = output_tempfile()
            .suffix(&suffix)
            .tempfile_in(dir)
            // tempfile's message ends in the name it tried (`at path "/proc/.tmp-siXdP0.csv"`): a
            // name nobody asked for, which the user cannot act on.
            .map_err(|e| {
                let plain = std::io::Error::new(
                    e.kind(),
                    e.to_string().split(" at path \"").next().unwrap_or_default().to_string(),
                );
                anyhow::anyhow!("creating a temporary file in {}: {plain}", dir.display())
            })?
            .into_temp_path();
        write(&tmp).map_err(|e| anyhow::anyhow!(strip_path(&format!("{e:#}"), &tmp)))?;
        std::fs::File::open(&tmp).and_then(|f| f.sync_all()).context("syncing to disk")?;
        tmp.persist(path).map_err(|e| e.error).context("renaming the temporary file into place")?;
        Ok(())
    })();
    result.with_context(|| format!("writing {}", path.display()))
}

/// A writer's message with the temporary path it was given replaced by `<temporary file>`.
fn strip_path(msg: &str, tmp: &Path) -> String {
    msg.replace(&tmp.display().to_string(), "<temporary file>")
}

/// A run directory: where a run writes. [`RunDir::new`] names one without touching the disk (the
/// trainer creates it once data and model are built); [`RunDir::open`] requires an existing run.
#[derive(Debug, Clone)]
pub struct RunDir {
    pub path: PathBuf,
}

/// The exclusive lock of a run directory, held until dropped (or the process exits).
#[derive(Debug)]
pub struct RunLock {
    _file: std::fs::File,
}

impl RunDir {
    /// A run directory at `path`, not yet created (nothing is written until training starts).
    pub fn new(path: &Path) -> Self {
        Self { path: path.to_path_buf() }
    }

    /// Creates the directory (and `figures/`).
    pub fn create(path: &Path) -> Result<Self> {
        std::fs::create_dir_all(path.join("figures"))
            .with_context(|| format!("creating run directory {}", path.display()))?;
        Ok(Self { path: path.to_path_buf() })
    }

    /// An existing run directory: an error unless `path` holds a `config.yaml`.
    pub fn open(path: &Path) -> Result<Self> {
        anyhow::ensure!(
            path.join("config.yaml").is_file(),
            "{} is not a plexus run directory (no config.yaml)",
            path.display()
        );
        Ok(Self { path: path.to_path_buf() })
    }

    /// The path of `name` in the run directory.
    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Takes the exclusive lock of this run directory (creating the directory if needed), or fails
    /// naming the process that holds it. The lock file records the holder's pid.
    pub fn lock(&self) -> Result<RunLock> {
        lock_dir(&self.path, "run directory", "train into another directory")
    }

    /// Removes what a killed or failed run leaves behind: temporary files (`.tmp-*`) anywhere in
    /// the run directory, and checkpoint files of a step whose marker (`step_N.json`) was never
    /// written. Returns the removed paths. Call it holding the lock.
    pub fn clean_leftovers(&self) -> Result<Vec<PathBuf>> {
        let mut removed = Vec::new();
        let mut dirs = vec![self.path.clone()];
        while let Some(d) = dirs.pop() {
            let Ok(entries) = std::fs::read_dir(&d) else { continue };
            for e in entries {
                let e = e.with_context(|| format!("listing {}", d.display()))?;
                let p = e.path();
                let name = e.file_name().to_string_lossy().into_owned();
                let kind = e.file_type().with_context(|| format!("reading {}", p.display()))?;
                if kind.is_dir() {
                    dirs.push(p);
                } else if name.starts_with(".tmp-") {
                    std::fs::remove_file(&p).with_context(|| format!("removing the leftover {}", p.display()))?;
                    removed.push(p);
                }
            }
        }
        let ck = self.path.join("checkpoints");
        if let Ok(entries) = std::fs::read_dir(&ck) {
            for e in entries {
                let p = e.with_context(|| format!("listing {}", ck.display()))?.path();
                let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                let step = name
                    .strip_prefix("step_")
                    .and_then(|r| r.strip_suffix(".optim.safetensors").or_else(|| r.strip_suffix(".safetensors")));
                if let Some(step) = step.filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())) {
                    if !ck.join(format!("step_{step}.json")).exists() {
                        std::fs::remove_file(&p)
                            .with_context(|| format!("removing the incomplete checkpoint file {}", p.display()))?;
                        removed.push(p);
                    }
                }
            }
        }
        removed.sort();
        Ok(removed)
    }
}

/// Takes the exclusive lock of `dir` (its `.lock` file; the directory is created if needed), or
/// fails naming the process that holds it. `what` names the directory in the message ("run
/// directory", "token folder") and `instead` says what else to do. The lock file records the
/// holder's pid.
pub fn lock_dir(dir: &Path, what: &str, instead: &str) -> Result<RunLock> {
    lock_dir_as(dir, what, instead, false)
}

/// [`lock_dir`], or with `shared` a shared lock: any number of shared holders at once, none while
/// an exclusive holder has it (and the other way round). A shared holder records no pid.
pub fn lock_dir_as(dir: &Path, what: &str, instead: &str, shared: bool) -> Result<RunLock> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {what} {}", dir.display()))?;
    let path = dir.join(LOCK_FILE);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("opening the lock file {}", path.display()))?;
    match if shared { file.try_lock_shared() } else { file.try_lock() } {
        Ok(()) if shared => return Ok(RunLock { _file: file }),
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = match holder.trim().parse::<u32>() {
                Ok(pid) => format!("pid {pid}"),
                Err(_) if !shared => "processes that share it, or one that has not written its pid yet".to_string(),
                Err(_) => "a process that has not written its pid yet".to_string(),
            };
            bail!(
                "{what} {} is in use by another plexus process ({holder}, which holds {}); wait for it \
                     to finish or stop it, or {instead}",
                dir.display(),
                path.display()
            );
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(e).with_context(|| format!("locking {}", path.display()));
        }
    }
    (|| -> std::io::Result<()> {
        file.set_len(0)?;
        file.rewind()?;
        writeln!(file, "{}", std::process::id())?;
        file.sync_all()
    })()
    .with_context(|| format!("writing the lock file {}", path.display()))?;
    Ok(RunLock { _file: file })
}

/// The files of `dir` that make it "not empty" for a new run: anything but the lock file and
/// empty directories. `None` when `dir` does not exist.
pub fn contents(dir: &Path) -> Result<Option<Vec<PathBuf>>> {
    if !dir.exists() {
        return Ok(None);
    }
    anyhow::ensure!(dir.is_dir(), "{} exists and is not a directory", dir.display());
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("listing {}", d.display()))? {
            let e = e.with_context(|| format!("listing {}", d.display()))?;
            let p = e.path();
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                dirs.push(p);
            } else if !(d == dir && e.file_name() == LOCK_FILE) {
                found.push(p);
            }
        }
    }
    found.sort();
    Ok(Some(found))
}

/// Checks that a new run may be written into `dir`: it does not exist, or holds nothing (see
/// [`contents`]), or `overwrite` was asked for.
pub fn check_new(dir: &Path, overwrite: bool) -> Result<()> {
    check_output_dir(dir, "the run directory")?;
    if overwrite {
        return check_overwritable(dir);
    }
    if let Some(files) = contents(dir)? {
        if let Some(first) = files.first() {
            let what = if dir.join("config.yaml").is_file() { "a plexus run" } else { "files" };
            bail!(
                "{} already holds {what} ({} file(s), e.g. {}); a new run is not written over it: pass --overwrite \
                 to clear it first, or --resume {} to continue that run (or choose another --out)",
                dir.display(),
                files.len(),
                first.display(),
                dir.display()
            );
        }
    }
    Ok(())
}

/// `--overwrite` clears the directory: refuse the current directory, its ancestors and the root.
fn check_overwritable(dir: &Path) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    let canon = std::fs::canonicalize(dir).with_context(|| format!("resolving {}", dir.display()))?;
    let cwd = std::env::current_dir().ok().and_then(|c| std::fs::canonicalize(c).ok());
    if canon.parent().is_none() || cwd.is_some_and(|c| c.starts_with(&canon)) {
        bail!(
            "--overwrite would delete everything in {} (the current directory or one of its parents); \
             choose a run directory with --out",
            dir.display()
        );
    }
    Ok(())
}

/// Removes everything in `dir` except its lock file (for `--overwrite`; call it holding the lock).
pub fn clear(dir: &Path) -> Result<()> {
    check_overwritable(dir)?;
    for e in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let e = e.with_context(|| format!("listing {}", dir.display()))?;
        if e.file_name() == LOCK_FILE {
            continue;
        }
        let p = e.path();
        let r = if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            std::fs::remove_dir_all(&p)
        } else {
            std::fs::remove_file(&p)
        };
        r.with_context(|| format!("--overwrite: removing {}", p.display()))?;
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------------
// The run-directory format. Every file name of a run lives here; trainers, analysis, plots and
// the command line read and write runs through these methods only.

/// One `metrics.csv` row: the training loss of step `step` (before its update), the learning rate
/// of that update, the gradient norm before clipping, and Γ if the topology defines it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MetricsRow {
    pub step: u64,
    pub epoch: f64,
    pub loss: f64,
    pub lr: f64,
    pub grad_norm: f64,
    pub gamma: Option<f64>,
}

/// One `eval.csv` row: the held-out metrics after step `step`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EvalResult {
    pub step: u64,
    /// Mean loss per example (classification) or per token (language model).
    pub loss: f64,
    /// Top-1 accuracy (classification, and next-token accuracy for language models).
    pub accuracy: Option<f64>,
    /// `exp(loss)` for language models.
    pub perplexity: Option<f64>,
}

impl std::fmt::Display for EvalResult {
    /// `loss 0.4178, accuracy 84.00%` / `…, perplexity 7.15`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "loss {:.4}", self.loss)?;
        if let Some(a) = self.accuracy {
            write!(f, ", accuracy {:.2}%", 100.0 * a)?;
        }
        if let Some(p) = self.perplexity {
            write!(f, ", perplexity {p:.2}")?;
        }
        Ok(())
    }
}

/// The columns of a `plexus train` run's `metrics.csv` ([`MetricsRow`]).
pub const METRICS_COLUMNS: [&str; 6] = ["step", "epoch", "loss", "lr", "grad_norm", "gamma"];
const EVAL_COLUMNS: [&str; 4] = ["step", "loss", "accuracy", "perplexity"];

/// A matrix as saved in a run (C, a parameter view): `[rows, columns]` f64.
pub type Matrix = ndarray::Array2<f64>;

impl RunDir {
    /// The resolved config the run was trained with.
    pub fn config_file(&self) -> PathBuf {
        self.path.join("config.yaml")
    }
    /// The training metrics, one row per logged step (`metrics.csv`).
    pub fn metrics_file(&self) -> PathBuf {
        self.path.join("metrics.csv")
    }
    /// The held-out evaluations, one row per evaluation (`eval.csv`).
    pub fn eval_file(&self) -> PathBuf {
        self.path.join("eval.csv")
    }
    /// Diffusion runs: the validation ε-MSE per bucket of timesteps, one row per evaluation.
    pub fn eps_by_t_file(&self) -> PathBuf {
        self.path.join("eps_by_t.csv")
    }
    /// The run's summary, written when training ends (`summary.json`).
    pub fn summary_file(&self) -> PathBuf {
        self.path.join("summary.json")
    }
    /// Where the run's own figures go (`figures/`).
    pub fn figures_dir(&self) -> PathBuf {
        self.path.join("figures")
    }
    /// The checkpoints, periodic and final (`checkpoints/`).
    pub fn checkpoints_dir(&self) -> PathBuf {
        self.path.join("checkpoints")
    }
    /// The model at the end of training.
    pub fn final_checkpoint(&self) -> PathBuf {
        self.checkpoints_dir().join("final.safetensors")
    }
    /// The final weights as a finished run of any kind holds them: [`RunDir::final_checkpoint`],
    /// or, in a `plexus rl` run of plexus before 2026-11-27, `final.safetensors` in the run's root.
    /// The one place that knows both layouts (a sweep's check of finished runs and `rl --eval`
    /// read it).
    pub fn final_weights(&self) -> PathBuf {
        let current = self.final_checkpoint();
        let legacy = self.path.join("final.safetensors");
        if !current.exists() && legacy.exists() {
            legacy
        } else {
            current
        }
    }
    /// With `train.ema`: the moving average of the parameters at the end of training (the same
    /// `state_dict` names as [`RunDir::final_checkpoint`]).
    pub fn final_ema_checkpoint(&self) -> PathBuf {
        self.checkpoints_dir().join("final_ema.safetensors")
    }
    /// C at `step` (`connectivity/step_N.csv`).
    pub fn connectivity_file(&self, step: u64) -> PathBuf {
        self.path.join("connectivity").join(format!("step_{step}.csv"))
    }
    /// The topology's parameter view `name` at `step` (`params/<name>_step_N.csv`).
    pub fn param_view_file(&self, name: &str, step: u64) -> PathBuf {
        self.path.join("params").join(format!("{name}_step_{step}.csv"))
    }

    /// Files `plexus analyze` writes.
    pub fn layerwise_file(&self) -> PathBuf {
        self.path.join("layerwise.csv")
    }
    /// `plexus analyze`: the metric with the top units dropped (`pruning.csv`).
    pub fn pruning_file(&self) -> PathBuf {
        self.path.join("pruning.csv")
    }
    /// `plexus analyze`: the metric under input noise (`noise.csv`).
    pub fn noise_file(&self) -> PathBuf {
        self.path.join("noise.csv")
    }
    /// `plexus analyze`: Γ over training (`gamma.csv`).
    pub fn gamma_file(&self) -> PathBuf {
        self.path.join("gamma.csv")
    }
    /// `plexus analyze`: Δ_t over training (`delta.csv`).
    pub fn delta_file(&self) -> PathBuf {
        self.path.join("delta.csv")
    }
    /// `plexus analyze`: the analysis' summary (`analysis.json`).
    pub fn analysis_file(&self) -> PathBuf {
        self.path.join("analysis.json")
    }

    /// The rows of `metrics.csv` (none if the run has not written it yet).
    pub fn metrics(&self) -> Result<Vec<MetricsRow>> {
        read_rows(&self.metrics_file())
    }

    /// The rows of `eval.csv` (none if the dataset has no held-out set).
    pub fn evals(&self) -> Result<Vec<EvalResult>> {
        read_rows(&self.eval_file())
    }

    /// Writes `rows` as `metrics.csv` (its fixed columns; the header alone when there are none).
    pub fn write_metrics(&self, rows: &[MetricsRow]) -> Result<()> {
        write_rows(&self.metrics_file(), rows, &METRICS_COLUMNS)
    }

    /// Writes the table `name` (a file in the run directory) atomically: `header`, then `rows` of
    /// cells already formatted (a trainer with its own columns, e.g. `plexus rl`'s metrics.csv).
    pub fn write_table(&self, name: &str, header: &[&str], rows: &[Vec<String>]) -> Result<()> {
        let mut w = csv::Writer::from_writer(Vec::new());
        w.write_record(header)?;
        for r in rows {
            w.write_record(r)?;
        }
        atomic_write(&self.file(name), &w.into_inner()?)
    }

    /// Writes `eval.csv` (nothing when there are no evaluations).
    pub fn write_evals(&self, rows: &[EvalResult]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        write_rows(&self.eval_file(), rows, &EVAL_COLUMNS)
    }

    /// Writes `eps_by_t.csv`: `step` then one column per bucket of timesteps `t{lo}_{hi}`
    /// (inclusive), the ε-MSE of the validation set there (see `train::eval::evaluate_diffusion`).
    /// `timesteps` is the number of diffusion steps the buckets split evenly.
    pub fn write_eps_by_t(&self, rows: &[(u64, Vec<f64>)], timesteps: usize) -> Result<()> {
        let Some((_, first)) = rows.first() else { return Ok(()) };
        let width = timesteps / first.len();
        let mut text = String::from("step");
        for k in 0..first.len() {
            text += &format!(",t{}_{}", k * width, (k + 1) * width - 1);
        }
        text.push('\n');
        for (step, v) in rows {
            text += &step.to_string();
            for x in v {
                text += &format!(",{x:e}");
            }
            text.push('\n');
        }
        atomic_write(&self.eps_by_t_file(), text.as_bytes())
    }

    /// The rows of `eps_by_t.csv` (none if absent).
    pub fn eps_by_t(&self) -> Result<Vec<(u64, Vec<f64>)>> {
        let path = self.eps_by_t_file();
        if !path.exists() {
            return Ok(Vec::new());
        }
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        text.lines()
            .skip(1)
            .filter(|l| !l.is_empty())
            .map(|l| {
                let mut it = l.split(',');
                let step =
                    it.next().unwrap_or_default().parse().with_context(|| format!("{}: bad step", path.display()))?;
                let v = it
                    .map(|x| x.parse::<f64>())
                    .collect::<Result<Vec<_>, _>>()
                    .with_context(|| format!("{}: bad value", path.display()))?;
                Ok((step, v))
            })
            .collect()
    }

    /// Saves C at `step`.
    pub fn write_connectivity(&self, step: u64, c: &tch::Tensor) -> Result<()> {
        write_matrix(&self.connectivity_file(step), &crate::host::matrix(c))
    }

    /// Saves the parameter view `name` at `step`.
    pub fn write_param_view(&self, name: &str, step: u64, view: &tch::Tensor) -> Result<()> {
        write_matrix(&self.param_view_file(name, step), &crate::host::matrix(view))
    }

    /// The steps at which C was saved, ascending.
    pub fn connectivity_steps(&self) -> Result<Vec<u64>> {
        steps_in(&self.path.join("connectivity"), "step_")
    }

    /// C at `step`: square, at least 2×2.
    pub fn connectivity(&self, step: u64) -> Result<Matrix> {
        read_square_matrix(&self.connectivity_file(step))
    }

    /// The steps at which the parameter view `name` was saved, ascending.
    pub fn param_view_steps(&self, name: &str) -> Result<Vec<u64>> {
        steps_in(&self.path.join("params"), &format!("{name}_step_"))
    }

    /// The parameter view `name` at `step`.
    pub fn param_view(&self, name: &str, step: u64) -> Result<Matrix> {
        read_matrix(&self.param_view_file(name, step))
    }
}

/// Steps `N` of the files `<prefix>N.csv` in `dir`, ascending (none if `dir` does not exist).
fn steps_in(dir: &Path, prefix: &str) -> Result<Vec<u64>> {
    let mut out = Vec::new();
    if dir.is_dir() {
        for e in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
            let name = e?.file_name();
            let step = name
                .to_str()
                .and_then(|n| n.strip_prefix(prefix))
                .and_then(|n| n.strip_suffix(".csv"))
                .and_then(|n| n.parse::<u64>().ok());
            out.extend(step);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// The rows of the CSV at `path` as `T` (none if the file does not exist); errors name the file
/// and the row.
pub fn read_rows<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Vec<T>> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let mut r = csv::Reader::from_reader(crate::input_file::open_regular(path)?);
    r.deserialize()
        .enumerate()
        .map(|(i, row)| row.with_context(|| format!("{}: row {}", path.display(), i + 2)))
        .collect()
}

fn write_rows<T: serde::Serialize>(path: &Path, rows: &[T], header: &[&str]) -> Result<()> {
    let mut w = csv::Writer::from_writer(Vec::new());
    if rows.is_empty() {
        w.write_record(header)?;
    }
    for r in rows {
        w.serialize(r)?;
    }
    atomic_write(path, &w.into_inner()?)
}

/// A matrix saved by [`matrix_csv`]: header `node,0,1,…`, then `i,v,v,…` rows. Errors name the
/// file and what is wrong (a truncated file, a bad number).
pub fn read_matrix(path: &Path) -> Result<Matrix> {
    let text = crate::input_file::read_text(path, crate::input_file::MAX_RECORD_BYTES, "a matrix CSV")?;
    let cols = text.lines().next().map_or(0, |h| h.split(',').count().saturating_sub(1));
    let mut values = Vec::new();
    let mut rows = 0;
    for (i, l) in text.lines().skip(1).enumerate() {
        let before = values.len();
        for c in l.split(',').skip(1) {
            values.push(c.parse::<f64>().with_context(|| format!("{}: bad number `{c}`", path.display()))?);
        }
        if values.len() - before != cols {
            bail!(
                "{}: row {} has {} values but the header names {cols} columns (a truncated file?)",
                path.display(),
                i + 2,
                values.len() - before
            );
        }
        rows += 1;
    }
    if rows == 0 || cols == 0 {
        bail!("{}: no matrix (a header row `node,0,1,…` and at least one row are expected)", path.display());
    }
    Ok(Matrix::from_shape_vec((rows, cols), values).expect("rows × cols values"))
}

/// The numbers of a JSON record (`summary.json`, `analysis.json`) as flat keys: `eval.accuracy`
/// for `{"eval": {"accuracy": …}}`; other values are left out.
pub fn flatten_json(v: &serde_json::Value, prefix: &str, out: &mut std::collections::BTreeMap<String, f64>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                flatten_json(v, &if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") }, out);
            }
        }
        serde_json::Value::Number(n) => {
            if let Some(x) = n.as_f64() {
                out.insert(prefix.to_string(), x);
            }
        }
        _ => {}
    }
}

/// A CSV of numbers: its header, and its rows (an empty or non-numeric cell is `None`).
pub type NumberTable = (Vec<String>, Vec<Vec<Option<f64>>>);

/// A CSV of a run's numbers (`eval.csv`, `eps_by_t.csv`, a curve's file) as a [`NumberTable`].
pub fn read_number_table(path: &Path) -> Result<NumberTable> {
    let mut r = csv::Reader::from_reader(crate::input_file::open_regular(path)?);
    let cols: Vec<String> =
        r.headers().with_context(|| format!("reading {}", path.display()))?.iter().map(String::from).collect();
    let mut rows = Vec::new();
    for rec in r.records() {
        let rec = rec.with_context(|| format!("reading {}", path.display()))?;
        rows.push((0..cols.len()).map(|i| rec.get(i).and_then(|c| c.parse::<f64>().ok())).collect());
    }
    Ok((cols, rows))
}

/// A connectivity matrix C given as data (`topology.init: {file: C.csv}` of `graph`, or another
/// run's `connectivity/step_N.csv`), from the CSV text `text` that `origin` names: the layout
/// [`matrix_csv`] writes (a header `node,0,1,…`, then one row per source node, its label first),
/// with rows and columns matched by their labels, not their positions: the labels must be the node
/// numbers `0..n` (n ≥ 2), each once, in the header and in the rows. Every entry must be a finite
/// number. Errors name the file, the line and what is wrong.
pub fn parse_labelled_matrix(text: &str, origin: &str) -> Result<Matrix> {
    let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty());
    let Some((_, header)) = lines.next() else {
        bail!("{origin}: empty; a C is a header `node,0,1,…` and one row per node");
    };
    let label = |cell: &str, what: &str, line: usize| -> Result<usize> {
        cell.trim()
            .parse::<usize>()
            .ok()
            .with_context(|| format!("{origin} line {line}: {what} `{}` is not a node number (0, 1, …)", cell.trim()))
    };
    let columns: Vec<usize> =
        header.split(',').skip(1).map(|c| label(c, "the column label", 1)).collect::<Result<_>>()?;
    let n = columns.len();
    let is_permutation = |labels: &[usize]| {
        let mut seen = vec![false; labels.len()];
        labels.iter().all(|&l| l < labels.len() && !std::mem::replace(&mut seen[l], true))
    };
    if n < 2 || !is_permutation(&columns) {
        bail!(
            "{origin} line 1: the columns are labelled {columns:?}; a C of n ≥ 2 nodes labels them 0..n-1, each once \
             (`node,0,1,…`)"
        );
    }
    let mut m = Matrix::zeros((n, n));
    let mut rows = Vec::new();
    for (i, line) in lines {
        let cells: Vec<&str> = line.split(',').collect();
        let row = label(cells[0], "the row label", i + 1)?;
        if cells.len() != n + 1 {
            bail!("{origin} line {}: {} values, but the header names {n} columns", i + 1, cells.len() - 1);
        }
        if row >= n || rows.contains(&row) {
            bail!("{origin} line {}: row label {row}: each node 0..{} labels one row", i + 1, n - 1);
        }
        rows.push(row);
        for (&col, cell) in columns.iter().zip(&cells[1..]) {
            let v: f64 = cell.trim().parse().ok().filter(|v: &f64| v.is_finite()).with_context(|| {
                format!("{origin} line {}: C[{row}][{col}] = `{}` is not a finite number", i + 1, cell.trim())
            })?;
            m[[row, col]] = v;
        }
    }
    if rows.len() != n {
        bail!("{origin}: {} rows for {n} columns; a C has one row per node, labelled 0..{}", rows.len(), n - 1);
    }
    Ok(m)
}

/// A square matrix of at least 2×2 (C, or ANCRe's p), as [`read_matrix`].
pub fn read_square_matrix(path: &Path) -> Result<Matrix> {
    let m = read_matrix(path)?;
    if m.nrows() < 2 || !m.is_square() {
        bail!(
            "{}: a connectivity matrix is square with at least 2 nodes, this one is {}×{} (a truncated file?)",
            path.display(),
            m.nrows(),
            m.ncols()
        );
    }
    Ok(m)
}

/// Writes `m` as CSV at `path` ([`matrix_csv`]) and as a NumPy array beside it (`.npy`, float64:
/// `numpy.load("connectivity/step_100.npy")`), both atomically.
pub fn write_matrix(path: &Path, m: &Matrix) -> Result<()> {
    atomic_write(path, matrix_csv(m).as_bytes())?;
    let npy = path.with_extension("npy");
    atomic_write_with(&npy, |p| ndarray_npy::write_npy(p, m).with_context(|| format!("writing {}", npy.display())))
}

/// A matrix as CSV: a header row `node,0,1,…` and the row index as first column (row = source,
/// column = target for connectivity matrices).
pub fn matrix_csv(m: &Matrix) -> String {
    let mut out = String::from("node");
    for j in 0..m.ncols() {
        out.push_str(&format!(",{j}"));
    }
    out.push('\n');
    for (i, r) in m.rows().into_iter().enumerate() {
        out.push_str(&i.to_string());
        for v in r {
            out.push_str(&format!(",{v}"));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_errors_name_the_final_path_and_leave_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("sub/model.safetensors");
        let e =
            atomic_write_with(&target, |tmp| anyhow::bail!("disk full while writing {}", tmp.display())).unwrap_err();
        let msg = format!("{e:#}");
        assert!(msg.contains(&target.display().to_string()) && msg.contains("disk full"), "{msg}");
        assert!(!msg.contains(".tmp-"), "the temporary name leaked: {msg}");
        let left: Vec<_> = std::fs::read_dir(dir.path().join("sub")).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
        let e = atomic_write(Path::new("/dev/null/x/y.csv"), b"1").unwrap_err();
        assert!(format!("{e:#}").contains("/dev/null/x/y.csv"), "{e:#}");
    }

    #[test]
    fn outputs_are_new_paths_or_regular_files_and_a_failed_set_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("file"), b"x").unwrap();
        std::fs::create_dir(d.join("folder")).unwrap();
        std::os::unix::fs::symlink("file", d.join("link")).unwrap();
        std::os::unix::fs::symlink("folder", d.join("folder-link")).unwrap();
        check_output_file(&d.join("new"), "--x").unwrap();
        check_output_file(&d.join("file"), "--x").unwrap();
        for (name, kind) in [("folder", "a directory"), ("link", "a symbolic link to a regular file (file)")] {
            let e = check_output_file(&d.join(name), "--x").unwrap_err().to_string();
            assert!(e.contains(&format!("--x {} is {kind}", d.join(name).display())), "{e}");
        }
        let e = check_output_file(Path::new("/dev/null"), "--x").unwrap_err().to_string();
        assert!(e.contains("/dev/null is a character device"), "{e}");
        let e = format!("{:#}", check_output_file(&d.join("file/x.csv"), "--x").unwrap_err());
        assert!(e.contains("file exists and is not a directory"), "{e}");
        check_output_dir(&d.join("folder"), "--out").unwrap();
        check_output_dir(&d.join("folder-link"), "--out").unwrap();
        let e = check_output_dir(&d.join("file"), "--out").unwrap_err().to_string();
        assert!(e.contains("file is a regular file"), "{e}");
        // The atomic write itself refuses too, and leaves the link as it was.
        let e = format!("{:#}", atomic_write(&d.join("link"), b"y").unwrap_err());
        assert!(e.contains("is a symbolic link"), "{e}");
        assert!(std::fs::symlink_metadata(d.join("link")).unwrap().file_type().is_symlink());

        // All or nothing: a failure leaves neither the files nor the folder it created.
        let out = d.join("report");
        let e = write_all_or_nothing(&out, |tmp| {
            atomic_write(&tmp.join("a.md"), b"a")?;
            bail!("drawing {} failed", tmp.join("b.png").display())
        })
        .unwrap_err();
        assert!(e.to_string().contains(&format!("drawing {} failed", out.join("b.png").display())), "{e}");
        assert!(!out.exists());
        std::fs::create_dir(&out).unwrap();
        std::fs::create_dir(out.join("b.png")).unwrap();
        let e = write_all_or_nothing(&out, |tmp| {
            atomic_write(&tmp.join("a.md"), b"a")?;
            atomic_write(&tmp.join("b.png"), b"b")?;
            Ok(vec![tmp.join("a.md"), tmp.join("b.png")])
        })
        .unwrap_err();
        assert!(e.to_string().contains("b.png is a directory"), "{e}");
        let left: Vec<_> = std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, ["b.png"]);
        std::fs::remove_dir(out.join("b.png")).unwrap();
        let written = write_all_or_nothing(&out, |tmp| {
            atomic_write(&tmp.join("a.md"), b"a")?;
            Ok(vec![tmp.join("a.md")])
        })
        .unwrap();
        assert_eq!(written, [out.join("a.md")]);
        let left: Vec<_> = std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, ["a.md"]);
    }

    #[test]
    fn leftovers_are_temporary_files_and_unmarked_checkpoints_only() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::new(dir.path());
        let ck = dir.path().join("checkpoints");
        std::fs::create_dir_all(&ck).unwrap();
        for f in ["step_2.json", "step_2.safetensors", "step_2.optim.safetensors", "step_3.safetensors", ".tmp-1"] {
            std::fs::write(ck.join(f), b"x").unwrap();
        }
        std::fs::write(dir.path().join("metrics.csv"), b"x").unwrap();
        let removed = run.clean_leftovers().unwrap();
        assert_eq!(removed, vec![ck.join(".tmp-1"), ck.join("step_3.safetensors")]);
        assert!(ck.join("step_2.safetensors").is_file() && dir.path().join("metrics.csv").is_file());
    }
}
