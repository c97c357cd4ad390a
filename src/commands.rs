//! What the verbs of the command line do, one function per verb (`cli.rs` parses the command
//! line and calls them): resolving configs and run directories, training sets of runs, the demo,
//! benchmarks, analysis, sampling, parity and connectivity reports, `plexus rl`. Tables and CSVs
//! are formatted in `crate::report`.

use crate::analysis::{self, AnalyzeOptions};
use crate::config::Override;
use crate::experiment::Experiment;
use crate::kinds::{Launch, RunKind};
use crate::plot;
use crate::plot::Style;
use crate::run_dir::{atomic_write, RunDir};
use crate::sets;
use crate::train::{self, Summary, TrainOptions};
use anyhow::{bail, Context, Result};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

pub mod bench;
pub mod runs;
pub mod study;

/// Expands directories into their `*.yaml` files (sorted) and resolves every config before any
/// run starts, so one bad file stops the whole set before work.
pub fn resolve_paths(paths: &[PathBuf], overrides: &[Override]) -> Result<Vec<Experiment>> {
    config_files(paths)?.iter().map(|f| Ok(Experiment::from_file(f, overrides)?)).collect()
}

/// The config files named by `paths`: files as given, directories as their `*.yaml` / `*.yml`
/// files, sorted (a directory holding none is an error). Shared by `train` and `rl`.
pub fn config_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut yamls: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("reading {}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.extension().is_some_and(|x| x == "yaml" || x == "yml"))
                .collect();
            yamls.sort();
            if yamls.is_empty() {
                bail!("{} holds no *.yaml config", p.display());
            }
            files.extend(yamls);
        } else {
            files.push(p.clone());
        }
    }
    Ok(files)
}

/// One run directory per experiment; names must be unique within a set.
pub fn run_dirs(exps: &[Experiment], out: Option<&Path>) -> Result<Vec<PathBuf>> {
    let names: Vec<&str> = exps.iter().map(|e| e.config().name.as_str()).collect();
    dirs_of(&names, out)
}

/// The run directory of each run name (of any kind): `out` itself for one run, `out/<name>` for
/// several, `runs/<name>` without `out`; names must be unique within one command.
fn dirs_of(names: &[&str], out: Option<&Path>) -> Result<Vec<PathBuf>> {
    let mut seen = std::collections::HashSet::new();
    for n in names {
        if !seen.insert(*n) {
            bail!("two configs share the name `{n}`; run names must be unique within one command");
        }
    }
    Ok(names
        .iter()
        .map(|n| match (out, names.len()) {
            (Some(o), 1) => o.to_path_buf(),
            (Some(o), _) => o.join(n),
            (None, _) => Path::new("runs").join(n),
        })
        .collect())
}

/// Trains every experiment into its directory with `opts` (`overwrite[i]`: clear a non-empty
/// one). Every directory is checked before the first run starts, so a set fails before any work.
pub fn train_all(
    exps: &[Experiment],
    dirs: &[PathBuf],
    opts: &TrainOptions,
    overwrite: &[bool],
) -> Result<Vec<Summary>> {
    let main = crate::dist::DistInfo::is_main(opts.dist.as_ref());
    if main {
        for (d, &o) in dirs.iter().zip(overwrite) {
            crate::run_dir::check_new(d, o)?;
        }
    }
    let mut out = Vec::new();
    for ((e, d), &overwrite) in exps.iter().zip(dirs).zip(overwrite) {
        let dir = RunDir::new(d);
        if !opts.progress && main {
            eprintln!("training {} → {}", e.config().name, d.display());
        }
        out.push(train::train(e, &dir, &TrainOptions { overwrite, ..opts.clone() })?);
    }
    Ok(out)
}

/// `PLEXUS_CRASH_AFTER=N`: stop with an error once N units of the run's length are done (updates
/// of `plexus train`, environment steps of `plexus rl`), after the checkpoint due then, as a crash
/// would (for testing that resumed runs, distributed ones included, match uninterrupted ones).
pub fn crash_after() -> Result<Option<u64>> {
    match std::env::var("PLEXUS_CRASH_AFTER") {
        Ok(v) => Ok(Some(v.trim().parse().map_err(|_| {
            anyhow::anyhow!(
                "environment variable PLEXUS_CRASH_AFTER={v:?}: expected a number of updates or environment steps"
            )
        })?)),
        Err(_) => Ok(None),
    }
}

/// The config set `name` embedded in the binary ([`sets::SETS`]) and each of its configs resolved
/// with `overrides`; an unknown name is an error listing the sets there are.
pub fn embedded(name: &str, overrides: &[Override]) -> Result<(&'static sets::ConfigSet, Vec<Experiment>)> {
    let set = sets::find(name).with_context(|| {
        format!(
            "no embedded config set `{name}`; available: {}",
            sets::SETS.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
        )
    })?;
    let exps = set
        .configs
        .iter()
        .map(|c| Experiment::from_str(c.yaml, &format!("<embedded:configs/{}>", c.path), overrides))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((set, exps))
}

/// Trains an embedded set into `out/<set>/`, prints its table, writes results.csv; returns the
/// run directories.
pub fn run_set(set: &sets::ConfigSet, exps: &[Experiment], out: &Path) -> Result<Vec<PathBuf>> {
    println!("\n== {} — {}", set.name, set.about);
    let dirs = run_dirs(exps, Some(out))?;
    // The demo regenerates its runs: a previous demo's run directories are replaced, anything
    // else in the way is refused like for `plexus train`.
    let replace: Vec<bool> = dirs.iter().map(|d| d.join("config.yaml").is_file()).collect();
    let opts = TrainOptions { progress: std::io::stderr().is_terminal(), ..Default::default() };
    let summaries = train_all(exps, &dirs, &opts, &replace)?;
    crate::kinds::print_table(&summaries);
    atomic_write(&out.join("results.csv"), crate::report::results_csv(&summaries)?.as_bytes())?;
    Ok(dirs)
}

/// `plexus demo FIGURE`: trains the embedded config set `figure` into `out` and draws its figures
/// there; `showcase` also analyses its runs (exits, pruning, noise, Γ, Δ_t) and adds the linear
/// networks' case study (`lnn-fig2b`). Prints the PNGs' paths.
pub fn demo(figure: &str, out: &Path, overrides: &[Override]) -> Result<()> {
    crate::run_dir::check_output_dir(out, "--out")?;
    let started = std::time::Instant::now();
    let (style, mut figures) = (Style::default(), Vec::new());
    if figure == "showcase" {
        let (set, exps) = embedded("showcase", overrides)?;
        let dir = out.join("showcase");
        let runs = run_set(set, &exps, &dir)?;
        eprintln!("analysing {} runs (layer-wise exits, pruning, noise, Γ, Δ_t)…", runs.len());
        let summaries =
            runs.iter().map(|r| analysis::analyze(r, &AnalyzeOptions::default())).collect::<Result<Vec<_>>>()?;
        crate::report::print_analysis(&summaries);
        figures.extend(plot::write_all(
            &plot::figures::all(&runs, Some(set.about), None)?,
            &style,
            &dir.join("figures"),
        )?);
        // The ANCRe case study rides along: seconds, and the clearest picture of why topology matters.
        let (set, exps) = embedded("lnn-fig2b", &[])?;
        let dir = out.join("lnn-fig2b");
        let runs = run_set(set, &exps, &dir)?;
        let losses = plot::figures::losses(&plot::figures::open_runs(&runs)?, Some(set.about))?;
        figures.extend(plot::write_all(&losses, &style, &dir.join("figures"))?);
    } else {
        let (set, exps) = embedded(figure, overrides)?;
        let runs = run_set(set, &exps, out)?;
        figures.extend(plot::write_all(
            &plot::figures::all(&runs, Some(set.about), None)?,
            &style,
            &out.join("figures"),
        )?);
    }
    println!();
    for f in figures.iter().filter(|f| f.extension().is_some_and(|e| e == "png")) {
        println!("figure: {}", f.display());
    }
    println!("(SVG and PDF next to each PNG; done in {:.0} s)", started.elapsed().as_secs_f64());
    Ok(())
}

/// The run directories among `paths` (those with a `config.yaml`). A shell glob over a folder of
/// runs also matches what plexus writes beside them (`figures/`, `correlation.csv`, a sweep's
/// `logs/` and `report/`): when several paths are given and some are runs, the others are
/// skipped with one line saying so (`verb` names the command); a path that is not a run is an
/// error when none is.
pub fn runs_among(paths: &[PathBuf], verb: &str) -> Result<Vec<PathBuf>> {
    let (runs, others): (Vec<PathBuf>, Vec<PathBuf>) =
        paths.iter().cloned().partition(|p| p.join("config.yaml").is_file());
    if runs.is_empty() || others.is_empty() {
        return Ok(paths.to_vec());
    }
    let names: Vec<String> = others.iter().map(|p| p.display().to_string()).collect();
    eprintln!(
        "{verb}: skipped {} path(s) that are not run directories (no config.yaml): {}",
        others.len(),
        names.join(", ")
    );
    Ok(runs)
}

/// Where figures of `runs` go when no `--out` is given: `figures/` in the run for one run, beside
/// the runs (in their parent) for several.
pub fn default_figure_dir(runs: &[PathBuf]) -> PathBuf {
    match runs {
        [one] => one.join("figures"),
        _ => runs[0].parent().map(|p| p.join("figures")).unwrap_or_else(|| PathBuf::from("figures")),
    }
}

/// What `plexus <verb> CONFIG_OR_DIR...` asks of a kind of run: its configs (a directory stands
/// for its `*.yaml` files), where the runs go, the `--set`s, and how to run them.
pub struct RunRequest<'a> {
    pub inputs: &'a [PathBuf],
    pub out: Option<&'a Path>,
    pub overrides: &'a [Override],
    pub overwrite: bool,
    /// Only draw the kind's figure of finished runs (`plexus rl --plot`).
    pub plot_only: bool,
    pub quiet: bool,
    /// How long a data-parallel rank waits for the others (`--dist-timeout`).
    pub dist_timeout: std::time::Duration,
}

/// `plexus <verb> CONFIG_OR_DIR... [--out DIR] [--set k=v ...] [--overwrite] [--quiet]`, one path
/// for every kind of run (`plexus train`, `plexus rl`): every config and run directory checked
/// before the first run starts, each config trained into its directory (rank 0 of a
/// data-parallel run alone writes and prints), then the runs' table and the kind's own figure.
pub fn kind_run(kind: &dyn RunKind, r: &RunRequest) -> Result<()> {
    let verb = kind.verb();
    if r.plot_only {
        let inputs = runs_among(r.inputs, &format!("{verb} --plot"))?;
        let dir = r.out.map(Path::to_path_buf).unwrap_or_else(|| default_figure_dir(&inputs));
        crate::run_dir::check_output_dir(&dir, "the figure folder")?;
        for p in plot::write_all(&plot::curves::kind_figure(kind, &inputs)?, &Style::default(), &dir)? {
            println!("{}", p.display());
        }
        return Ok(());
    }
    let files = config_files(r.inputs)?;
    let loaded: Vec<crate::kinds::Loaded> = files.iter().map(|f| kind.load(f, r.overrides)).collect::<Result<_>>()?;
    let launch = launch_of(kind, r.quiet, r.dist_timeout, files.len())?;
    let main = crate::dist::DistInfo::is_main(launch.dist.as_ref());
    let names: Vec<&str> = loaded.iter().map(|l| l.name.as_str()).collect();
    let dirs = dirs_of(&names, r.out)?;
    for d in dirs.iter().filter(|_| main) {
        crate::run_dir::check_new(d, r.overwrite)?;
    }
    for ((f, l), d) in files.iter().zip(&loaded).zip(&dirs) {
        if main && !launch.progress {
            eprintln!("{verb} {} → {}", l.name, d.display());
        }
        kind.train(f, r.overrides, d, &Launch { overwrite: r.overwrite, ..launch.clone() })?;
    }
    if main {
        finished(kind, &dirs)?;
    }
    Ok(())
}

/// How this process launches its runs of `kind`: quiet or not, with a progress bar where stderr
/// is a terminal, `PLEXUS_CRASH_AFTER`, and its place in a data-parallel run (from the
/// environment torchrun, srun or `--nproc` set), which trains one config (`configs`).
fn launch_of(kind: &dyn RunKind, quiet: bool, dist_timeout: std::time::Duration, configs: usize) -> Result<Launch> {
    let dist = crate::dist::DistInfo::from_env(dist_timeout)?;
    if dist.is_some() && !kind.data_parallel() {
        bail!("`plexus {}` trains in one process; it has no data-parallel runs", kind.verb());
    }
    if dist.is_some() && configs != 1 {
        bail!("a data-parallel run trains one config; {configs} were given");
    }
    let main = crate::dist::DistInfo::is_main(dist.as_ref());
    let progress = main && !quiet && std::io::stderr().is_terminal();
    Ok(Launch { quiet, progress, crash_after: crash_after()?, dist, ..Default::default() })
}

/// After a kind's runs: their table, the kind's own figure of each run and of all of them.
fn finished(kind: &dyn RunKind, dirs: &[PathBuf]) -> Result<()> {
    for d in dirs {
        plot::write_all(
            &plot::curves::kind_figure(kind, std::slice::from_ref(d))?,
            &Style::default(),
            &d.join("figures"),
        )?;
    }
    kind.print(dirs)?;
    if dirs.len() > 1 {
        for p in plot::write_all(&plot::curves::kind_figure(kind, dirs)?, &Style::default(), &default_figure_dir(dirs))?
        {
            println!("figure: {}", p.display());
        }
    } else if let Some(f) = kind.figure() {
        println!("figure: {}", dirs[0].join("figures").join(format!("{}.png", f.file)).display());
    }
    Ok(())
}

/// What `plexus <verb> --resume RUN_DIR [CONFIG]` continues: the run, the config given (none: its
/// `config.yaml`), the `--set`s, the rule for the updates a lengthening adds.
pub struct ResumeRequest<'a> {
    pub run: &'a Path,
    pub configs: &'a [PathBuf],
    pub overrides: &'a [Override],
    pub extend: Option<crate::config::ExtendRule>,
    pub quiet: bool,
    pub dist_timeout: std::time::Duration,
}

/// `plexus <verb> --resume RUN_DIR [CONFIG] [--set <length key>=N] [--extend RULE]` for every kind
/// of run: continues a run from its latest checkpoint with the config it was trained with (or the
/// one given), plus the changes its trainer accepts.
pub fn kind_resume(kind: &dyn RunKind, r: &ResumeRequest) -> Result<()> {
    let verb = kind.verb();
    let dir = RunDir::open(r.run)?;
    crate::kinds::expect_kind(&dir, kind).map_err(|e| {
        anyhow::anyhow!(
            "{e:#}; to continue it, `plexus {} --resume {}`",
            crate::kinds::of_run(&dir).verb(),
            r.run.display()
        )
    })?;
    let file = match r.configs {
        [] => dir.config_file(),
        [one] if !one.is_dir() => one.clone(),
        _ => bail!(
            "--resume {} continues one run: give at most one config file (its config.yaml is used when none is \
             given), not {}",
            r.run.display(),
            r.configs.iter().map(|c| c.display().to_string()).collect::<Vec<_>>().join(", ")
        ),
    };
    if !file.is_file() {
        bail!("--resume: {} is not a `plexus {verb}` run directory (no config.yaml)", r.run.display());
    }
    let launch = Launch { resume: true, extend: r.extend, ..launch_of(kind, r.quiet, r.dist_timeout, 1)? };
    let main = crate::dist::DistInfo::is_main(launch.dist.as_ref());
    if main && !launch.progress {
        eprintln!("{verb} {} (resuming)", r.run.display());
    }
    kind.train(&file, r.overrides, r.run, &launch)?;
    if main {
        finished(kind, &[r.run.to_path_buf()])?;
    }
    Ok(())
}

// ---- The verbs, one function each (cli.rs parses and calls them).

/// `plexus doctor [--selftest]`.
pub fn doctor(selftest: bool, device: &str) -> Result<()> {
    if !crate::doctor::run() {
        bail!("libtorch is not fully usable (see above)")
    }
    if selftest {
        println!();
        if !crate::doctor::selftest(device)? {
            bail!("the self-test failed (see the table above)")
        }
    }
    Ok(())
}

/// `plexus tokenize FILE... --out DIR`.
pub fn tokenize(
    files: &[PathBuf],
    out: &Path,
    encoding: &str,
    val_fraction: f64,
    threads: Option<usize>,
    quiet: bool,
) -> Result<()> {
    use crate::data::{text::Tokenizer, tokenize};
    crate::run_dir::check_output_dir(out, "--out")?;
    let encoding = if encoding == "char" { Tokenizer::Char } else { Tokenizer::Gpt2 };
    let defaults = tokenize::TokenizeOptions::default();
    let opts = tokenize::TokenizeOptions {
        encoding,
        val_fraction,
        threads: threads.unwrap_or(defaults.threads),
        progress: !quiet && std::io::stderr().is_terminal(),
        ..defaults
    };
    let r = tokenize::tokenize(files, out, &opts)?;
    crate::report::print_tokenize(out, &r, opts.threads);
    // GPT-2's context is 1024 tokens: an evaluation window needs 1025.
    if r.val_tokens > 0 && r.val_tokens <= 1024 {
        eprintln!(
            "warning: {} holds only {} tokens (--val-fraction {val_fraction} of {}): fewer than one 1024-token \
             window plus its target; a run with a longer seq_len cannot evaluate on it (give a larger \
             --val-fraction)",
            out.join("val.bin").display(),
            r.val_tokens,
            r.train_tokens + r.val_tokens
        );
    }
    if r.val_tokens == 0 && val_fraction > 0.0 {
        eprintln!(
            "warning: {} holds no tokens: {val_fraction} of {} tokens rounds to 0; a run on this folder has no \
             validation split (give more text, or a larger --val-fraction)",
            out.join("val.bin").display(),
            r.train_tokens
        );
    }
    Ok(())
}
