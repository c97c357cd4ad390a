//! What the verbs of the command line do, one function per verb (`cli.rs` parses the command
//! line and calls them): resolving configs and run directories, training sets of runs, the demo,
//! benchmarks, analysis, sampling, parity and connectivity reports, `plexus rl`. Tables and CSVs
//! are formatted in `crate::report`.

use crate::analysis::{self, AnalyzeOptions};
use crate::experiment::Experiment;
use crate::kinds::{Launch, RunKind};
use crate::run_dir::{atomic_write, RunDir};
use crate::sets;
pub use crate::study::sweep::SweepRequest;
use crate::train::{self, Summary, TrainOptions};
use anyhow::{bail, Context, Result};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

/// Expands directories into their `*.yaml` files (sorted) and resolves every config before any
/// run starts, so one bad file stops the whole set before work.
pub fn resolve_paths(paths: &[PathBuf], overrides: &[String]) -> Result<Vec<Experiment>> {
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
pub fn embedded(name: &str, overrides: &[String]) -> Result<(&'static sets::ConfigSet, Vec<Experiment>)> {
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
pub fn demo(figure: &str, out: &Path, overrides: &[String]) -> Result<()> {
    crate::run_dir::check_output_dir(out, "--out")?;
    let started = std::time::Instant::now();
    let mut figures = Vec::new();
    if figure == "showcase" {
        let (set, exps) = embedded("showcase", overrides)?;
        let dir = out.join("showcase");
        let runs = run_set(set, &exps, &dir)?;
        eprintln!("analysing {} runs (layer-wise exits, pruning, noise, Γ, Δ_t)…", runs.len());
        let summaries =
            runs.iter().map(|r| analysis::analyze(r, &AnalyzeOptions::default())).collect::<Result<Vec<_>>>()?;
        crate::report::print_analysis(&summaries);
        figures.extend(crate::plot::figures::all(&runs, &dir.join("figures"), Some(set.about), None)?);
        // The ANCRe case study rides along: seconds, and the clearest picture of why topology matters.
        let (set, exps) = embedded("lnn-fig2b", &[])?;
        let dir = out.join("lnn-fig2b");
        let runs = run_set(set, &exps, &dir)?;
        figures.extend(crate::plot::figures::losses(
            &crate::plot::figures::open_runs(&runs)?,
            &dir.join("figures"),
            Some(set.about),
        )?);
    } else {
        let (set, exps) = embedded(figure, overrides)?;
        let runs = run_set(set, &exps, out)?;
        figures.extend(crate::plot::figures::all(&runs, &out.join("figures"), Some(set.about), None)?);
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

/// `plexus connectivity CONFIG_OR_RUN [--step N]`: C as CSV on stdout.
pub fn connectivity(path: &Path, step: Option<u64>, overrides: &[String]) -> Result<()> {
    print!("{}", crate::analysis::connectivity::csv(path, step, overrides)?);
    Ok(())
}

/// `plexus <verb> CONFIG_OR_DIR... [--out DIR] [--set k=v ...] [--overwrite] [--quiet]` for a kind
/// of run the registry launches (`plexus rl`): trains each config (a directory stands for its
/// `*.yaml` files) and draws the kind's own figure; with `plot_only`, only draws it for finished
/// runs.
pub fn kind_run(
    kind: &dyn RunKind,
    inputs: &[PathBuf],
    out: Option<&Path>,
    overrides: &[String],
    overwrite: bool,
    plot_only: bool,
    quiet: bool,
) -> Result<()> {
    let verb = kind.verb();
    if plot_only {
        let inputs = runs_among(inputs, &format!("{verb} --plot"))?;
        let dir = out.map(Path::to_path_buf).unwrap_or_else(|| default_figure_dir(&inputs));
        crate::run_dir::check_output_dir(&dir, "the figure folder")?;
        for p in crate::plot::curves::kind_figure(kind, &inputs, &dir)? {
            println!("{}", p.display());
        }
        return Ok(());
    }
    // Every config is checked, and every run directory, before the first run starts.
    let files = config_files(inputs)?;
    let loaded: Vec<crate::kinds::Loaded> = files.iter().map(|f| kind.load(f, overrides)).collect::<Result<_>>()?;
    let names: Vec<&str> = loaded.iter().map(|l| l.name.as_str()).collect();
    let dirs = dirs_of(&names, out)?;
    for d in &dirs {
        crate::run_dir::check_new(d, overwrite)?;
    }
    let launch = Launch { overwrite, quiet, crash_after: crash_after()?, ..Default::default() };
    for ((f, l), d) in files.iter().zip(&loaded).zip(&dirs) {
        eprintln!("{verb} {} → {}", l.name, d.display());
        kind.train(f, overrides, d, &launch)?;
        crate::plot::curves::kind_figure(kind, std::slice::from_ref(d), &d.join("figures"))?;
    }
    kind.print(&dirs)?;
    if dirs.len() > 1 {
        for p in crate::plot::curves::kind_figure(kind, &dirs, &default_figure_dir(&dirs))? {
            println!("figure: {}", p.display());
        }
    } else if let Some(f) = kind.figure() {
        println!("figure: {}", dirs[0].join("figures").join(format!("{}.png", f.file)).display());
    }
    Ok(())
}

/// `plexus rl --eval RUN_DIR... [--episodes N]`: each finished run's final policy, the
/// straight-line walker and the random policy on the same `episodes` tasks the run never saw;
/// a table on stdout, and `held_out_eval.json` in each run directory.
pub fn rl_eval(runs: &[PathBuf], episodes: usize, device: Option<&str>) -> Result<()> {
    anyhow::ensure!(episodes >= 1, "--episodes must be at least 1");
    let device = device
        .map(|d| crate::device::parse_device(d).map_err(anyhow::Error::msg).and_then(crate::device::resolve))
        .transpose()?;
    let mut rows = Vec::new();
    for r in &runs_among(runs, "rl --eval")? {
        let run = crate::rl::trained::open(r, device)?;
        let e = crate::rl::trained::held_out(&run, episodes);
        let row = crate::report::RlHeldOutRow::new(&run.exp.config.name, r, &e);
        crate::run_dir::atomic_write(&r.join("held_out_eval.json"), serde_json::to_string_pretty(&row)?.as_bytes())?;
        rows.push(row);
    }
    crate::report::print_rl_held_out(&rows, episodes);
    Ok(())
}

/// `plexus <verb> --resume RUN_DIR [--set <length key>=N]` for a kind the registry launches
/// (`plexus rl`): continues a run from its latest checkpoint with the config it was trained with
/// (plus the overrides the trainer accepts).
pub fn kind_resume(kind: &dyn RunKind, run: &Path, overrides: &[String], quiet: bool) -> Result<()> {
    let verb = kind.verb();
    let file = run.join("config.yaml");
    if !file.is_file() {
        bail!("--resume: {} is not a `plexus {verb}` run directory (no config.yaml)", run.display());
    }
    let loaded = kind.load(&file, overrides)?;
    eprintln!("{verb} {} → {} (resuming)", loaded.name, run.display());
    let launch = Launch { resume: true, quiet, crash_after: crash_after()?, ..Default::default() };
    kind.train(&file, overrides, run, &launch)?;
    let runs = [run.to_path_buf()];
    crate::plot::curves::kind_figure(kind, &runs, &run.join("figures"))?;
    kind.print(&runs)?;
    if let Some(f) = kind.figure() {
        println!("figure: {}", run.join("figures").join(format!("{}.png", f.file)).display());
    }
    Ok(())
}

// ---- The verbs, one function each (cli.rs parses and calls them).

/// `plexus train --resume RUN [CONFIG]`: continues a run (its config.yaml, or the one CONFIG).
pub fn train_resume(
    run: &Path,
    configs: &[PathBuf],
    overrides: &[String],
    quiet: bool,
    dist_timeout: std::time::Duration,
) -> Result<()> {
    let dist = crate::dist::DistInfo::from_env(dist_timeout)?;
    let main = crate::dist::DistInfo::is_main(dist.as_ref());
    let dir = RunDir::open(run)?;
    let config = match configs {
        [] => dir.config_file(),
        [one] if !one.is_dir() => one.clone(),
        _ => bail!(
            "--resume {} continues one run: give at most one config file (its config.yaml is used when none is \
             given), not {}",
            run.display(),
            configs.iter().map(|c| c.display().to_string()).collect::<Vec<_>>().join(", ")
        ),
    };
    let exp = match Experiment::from_file(&config, overrides) {
        Ok(exp) => exp,
        // The run's config is fine and a --set makes it invalid: name the --set that changes what
        // a resumed run keeps (`topology.kind=residual` on an H-ACN run leaves `topology.init`
        // behind, and the error would otherwise blame the run's own config.yaml).
        Err(e) if !overrides.is_empty() && Experiment::from_file(&config, &[]).is_ok() => {
            let p = &crate::train::RESUME_POLICY;
            let refused: Vec<&str> = overrides
                .iter()
                .map(String::as_str)
                .filter(|o| {
                    let k = o.split_once('=').map_or(*o, |(k, _)| k).trim();
                    k != p.length && !(p.may_change)(k)
                })
                .collect();
            if refused.is_empty() {
                return Err(e.into());
            }
            bail!(
                "--resume {}: --set {} would change what the run trains; only {} (which may grow, to extend the \
                 run, but not shrink) and {} may change on resume; start a new run (another --out, or \
                 --overwrite) for anything else",
                run.display(),
                refused.join(" --set "),
                p.length,
                p.describe
            );
        }
        Err(e) => return Err(e.into()),
    };
    let progress = main && !quiet && std::io::stderr().is_terminal();
    let opts = TrainOptions {
        progress,
        log_lines: main && !quiet && !progress,
        resume: true,
        crash_after: crash_after()?,
        dist,
        ..Default::default()
    };
    train::train(&exp, &dir, &opts)?;
    if main {
        crate::kinds::TRAIN.print(&[run.to_path_buf()])?;
    }
    Ok(())
}

/// `plexus train CONFIG...`: new runs (one per config; a directory is a set).
pub fn train_new(
    configs: &[PathBuf],
    out: Option<&Path>,
    overrides: &[String],
    quiet: bool,
    overwrite: bool,
    dist_timeout: std::time::Duration,
) -> Result<()> {
    let dist = crate::dist::DistInfo::from_env(dist_timeout)?;
    let main = crate::dist::DistInfo::is_main(dist.as_ref());
    let exps = resolve_paths(configs, overrides)?;
    if dist.is_some() && exps.len() != 1 {
        bail!("a data-parallel run trains one config; {} were given", exps.len());
    }
    let progress = main && !quiet && std::io::stderr().is_terminal();
    let dirs = run_dirs(&exps, out)?;
    let opts = TrainOptions {
        progress,
        log_lines: main && !quiet && !progress,
        crash_after: crash_after()?,
        dist,
        ..Default::default()
    };
    train_all(&exps, &dirs, &opts, &vec![overwrite; dirs.len()])?;
    if main {
        crate::kinds::TRAIN.print(&dirs)?;
    }
    Ok(())
}

/// What `plexus bench` was asked.
pub struct BenchRequest {
    pub config: PathBuf,
    pub overrides: Vec<String>,
    pub options: crate::bench::BenchOptions,
    pub csv: Option<PathBuf>,
    pub compare: Vec<String>,
    pub depths: Vec<usize>,
    pub topologies: Vec<String>,
    pub out: PathBuf,
    pub dist_timeout: std::time::Duration,
}

/// `plexus bench`: one config, a paired topology comparison, a depth sweep, or (as a rank of
/// `--nproc`) the data-parallel step.
pub fn bench(r: &BenchRequest) -> Result<()> {
    let opts = &r.options;
    if let Some(info) = crate::dist::DistInfo::from_env(r.dist_timeout)? {
        anyhow::ensure!(
            r.compare.is_empty() && r.depths.is_empty() && !opts.profile && r.csv.is_none(),
            "a data-parallel benchmark (--nproc) times one config: --compare, --depths, --profile and --csv are \
             for single-process benchmarks"
        );
        let exp = Experiment::from_file(&r.config, &r.overrides)?;
        if let Some(row) = crate::bench::bench_distributed(&exp, opts, info)? {
            crate::bench::table::print_dist_bench(&row);
        }
        return Ok(());
    }
    if opts.trace.is_some() && (!r.compare.is_empty() || !r.depths.is_empty()) {
        bail!("--trace is the Chrome trace of one config's profiled step: not with --compare or --depths");
    }
    // Every output is checked before anything is measured: a CSV to append to (bounded, its
    // columns), the depth sweep's folder; the trace below.
    if let Some(path) = &r.csv {
        let header =
            if r.compare.is_empty() { crate::bench::CSV_HEADER } else { crate::bench::table::COMPARE_CSV_HEADER };
        crate::report::csv_to_append_to(path, header)?;
    }
    if !r.compare.is_empty() {
        crate::bench::depth::compare(&r.config, &r.overrides, opts, &r.compare, r.csv.as_deref())
    } else if r.depths.is_empty() {
        let exp = Experiment::from_file(&r.config, &r.overrides)?;
        let mut opts = opts.clone();
        let trace = match (&opts.trace, opts.profile) {
            (Some(t), true) => Some(t.clone()),
            (None, true) => {
                let case = opts.case.clone().unwrap_or_else(|| exp.config().name.clone());
                Some(Path::new("runs/bench-profile").join(format!("{case}.json")))
            }
            (_, false) => None,
        };
        // The profiler writes the trace into a private folder beside it (libtorch writes a
        // temporary file of its own and renames it, and says nothing when that fails); the trace
        // is renamed into place once it is there, and the folder goes with whatever else is in it.
        let staging = match &trace {
            Some(t) => {
                crate::run_dir::check_output_file(t, "--trace")?;
                let dir = t.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
                std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
                let staging = tempfile::Builder::new().prefix(".tmp-trace-").tempdir_in(dir).with_context(|| {
                    format!("--trace {}: creating a temporary folder in {}", t.display(), dir.display())
                })?;
                opts.trace = Some(staging.path().join("trace.json"));
                Some(staging)
            }
            None => None,
        };
        let row = crate::bench::bench(&exp, &opts)?;
        if let (Some(trace), Some(staging)) = (&trace, &staging) {
            let written = staging.path().join("trace.json");
            if !written.is_file() {
                bail!(
                    "--trace {}: the profiler wrote no Chrome trace (libtorch's profiler failed to save it)",
                    trace.display()
                );
            }
            crate::run_dir::check_output_file(trace, "--trace")?;
            std::fs::rename(&written, trace)
                .with_context(|| format!("writing the Chrome trace {}", trace.display()))?;
        }
        crate::bench::table::print_bench(std::slice::from_ref(&row));
        if let Some(trace) = &trace {
            println!("Chrome trace of the profiled step: {} (chrome://tracing or ui.perfetto.dev)", trace.display());
        }
        if let Some(path) = &r.csv {
            crate::report::append_csv(path, crate::bench::CSV_HEADER, &format!("{}\n", row.csv()))?;
        }
        Ok(())
    } else {
        crate::run_dir::check_output_dir(&r.out, "--out")?;
        crate::bench::depth::sweep(&r.config, &r.overrides, opts, &r.depths, &r.topologies, &r.out)
    }
}

/// `plexus plot RUN...`: the paper figures of runs; `plexus plot CONFIG`: the C the config will
/// train with, before any training.
pub fn plot(runs: &[PathBuf], out: Option<&Path>, title: Option<&str>, step: Option<u64>) -> Result<()> {
    if let [config] = runs {
        if config.is_file() {
            let out = out.map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("figures"));
            crate::run_dir::check_output_dir(&out, "the figure folder")?;
            for p in crate::plot::figures::config_connectivity(config, &out)? {
                println!("{}", p.display());
            }
            return Ok(());
        }
    }
    let runs = &runs_among(runs, "plot")?;
    let out = out.map(Path::to_path_buf).unwrap_or_else(|| default_figure_dir(runs));
    crate::run_dir::check_output_dir(&out, "the figure folder")?;
    let written = crate::plot::figures::all(runs, &out, title, step)?;
    if written.is_empty() {
        let names: Vec<String> = runs.iter().map(|r| r.display().to_string()).collect();
        bail!(
            "nothing to plot in {}: no metrics.csv, connectivity or eval rows yet (has the run started? it writes \
             them as it trains)",
            names.join(", ")
        );
    }
    for p in written {
        println!("{}", p.display());
    }
    Ok(())
}

/// `plexus analyze RUN...`: layer-wise exits, pruning, noise; with `correlate`, the Pearson
/// correlation of the runs' converged residual weights (`correlation.csv`).
pub fn analyze(
    runs: &[PathBuf],
    sigmas: Vec<f64>,
    probs: Vec<f64>,
    repeats: usize,
    correlate: bool,
    device: Option<&str>,
) -> Result<()> {
    let device = match device {
        Some(d) => Some(crate::device::from_flag("--device", d)?),
        None => None,
    };
    let runs = &runs_among(runs, "analyze")?;
    let opts = AnalyzeOptions { sigmas, char_probs: probs, repeats, seed: 0, device };
    let correlation = default_figure_dir(runs).parent().map(|p| p.join("correlation.csv")).unwrap_or_default();
    if correlate {
        crate::run_dir::check_output_file(&correlation, "--correlate's output")?;
    }
    let summaries = runs.iter().map(|r| analysis::analyze(r, &opts)).collect::<Result<Vec<_>>>()?;
    crate::report::print_analysis(&summaries);
    if correlate {
        let m = analysis::correlate(runs)?;
        let path = correlation;
        let csv = crate::report::correlation_csv(runs, &m);
        atomic_write(&path, csv.as_bytes())?;
        println!("\nPearson correlation of the converged residual weights a:\n{csv}→ {}", path.display());
    }
    Ok(())
}

/// `plexus sample RUN`: a grid of samples of a diffusion run.
pub fn sample(run: &Path, per_class: usize, o: &crate::diffusion::SampleOptions, device: &str) -> Result<()> {
    let out = crate::diffusion::sample_run(run, per_class, o, device)?;
    let (sampler, steps) = match o.sampler {
        crate::diffusion::Sampler::Ddim => ("ddim", o.steps),
        crate::diffusion::Sampler::Ddpm => ("ddpm", 1000),
    };
    println!("samples ({sampler}, {steps} steps, cfg {}): {}", o.cfg, out.display());
    Ok(())
}

/// `plexus fd RUN --extractor CLASSIFIER_RUN`: a Fréchet distance of generated against real images.
pub fn fd(
    run: &Path,
    extractor: &Path,
    samples: usize,
    o: &crate::diffusion::SampleOptions,
    device: &str,
) -> Result<()> {
    let r = crate::fd::fd_command(run, extractor, samples, o, device)?;
    // The latest measurement stays with the run, for `plexus report` (metrics `fd.*`).
    let file = run.join("fd.json");
    crate::run_dir::atomic_write(&file, serde_json::to_string_pretty(&r)?.as_bytes())?;
    let at = o.step.map_or("the final weights".to_string(), |s| format!("the checkpoint of step {s}"));
    println!(
        "Fréchet distance {:.4} ({samples} generated from {at} vs {samples} real test images, features of the \
         plexus-trained classifier {}; NOT FID-50K: no Inception network, not comparable with published FIDs)",
        r.fd,
        extractor.display()
    );
    match r.real_floor {
        Some(f) => println!(
            "real-vs-real floor {f:.4} (two disjoint sets of {samples} real test images: the distance sampling alone \
             gives at this count; read the distance above against it)"
        ),
        None => println!("real-vs-real floor: not measured (needs {} held-out images, data.eval_samples)", 2 * samples),
    }
    println!(
        "class agreement {:.1} % (generated images the extractor classifies as the label they were drawn for; \
         chance {:.1} %, the extractor's accuracy on real test images {:.1} %)",
        100.0 * r.class_agreement,
        100.0 / r.classes as f64,
        100.0 * r.extractor_accuracy
    );
    println!("written: {}", file.display());
    Ok(())
}

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

/// `plexus sweep SPEC|CONFIG... [--grid K=V1,V2] [--seeds 0,1,2] [--set K=V] [--out DIR]
/// [--jobs N | --gpus all] [--slurm FILE] [--only RUN] [--dry-run]`, or `--resume DIR`: the
/// sweep ([`crate::study::sweep`]), then, when it trained the whole grid, its report.
pub fn sweep(r: &SweepRequest) -> Result<()> {
    // A folder among the inputs stands for its configs.
    let mut inputs = Vec::new();
    for p in &r.inputs {
        if p.is_dir() {
            inputs.extend(config_files(std::slice::from_ref(p))?);
        } else {
            inputs.push(p.clone());
        }
    }
    let Some(out) = crate::study::sweep::sweep(r, &inputs)? else {
        return Ok(());
    };
    // The runs are done whatever the report makes of them.
    if let Err(e) = report(std::slice::from_ref(&out), &[], &Default::default(), "md", None) {
        eprintln!("report: {e:#} (the runs are finished; see `plexus report --help`)");
    }
    Ok(())
}

/// `plexus report PATH... --spec SPEC... --format verdicts`: every claim of the studies, one row
/// each. One spec for all the paths (one study), or one spec per path, in order (a study each,
/// named by its spec's file stem).
fn report_verdicts(
    paths: &[PathBuf],
    specs: &[PathBuf],
    options: &crate::study::ReportOptions,
    out: Option<&Path>,
) -> Result<()> {
    let pairs: Vec<(Vec<PathBuf>, &PathBuf)> = match specs {
        [] => bail!("--format verdicts needs the studies' specs (--spec SPEC.yaml, one per path or one for all)"),
        [one] => vec![(paths.to_vec(), one)],
        many if many.len() == paths.len() => paths.iter().map(|p| vec![p.clone()]).zip(many).collect(),
        many => bail!(
            "--format verdicts takes one --spec for all the paths or one per path, in order: {} path(s), {} spec(s)",
            paths.len(),
            many.len()
        ),
    };
    let mut studies = Vec::new();
    if let Some(b) = &options.baseline {
        bail!("--baseline {b}: --format verdicts prints the claims only, which compare their own arms (leave it out)");
    }
    for (paths, spec_path) in pairs {
        let mut spec = crate::study::spec::SweepSpec::from_file(spec_path)?;
        // The verdicts read no table: a baseline the spec's tables use is no concern of theirs.
        spec.report.baseline = None;
        let r = crate::study::build(&paths, options, Some(&spec))
            .with_context(|| format!("the study of {}", spec_path.display()))?;
        let name =
            spec_path.file_stem().map_or_else(|| spec_path.display().to_string(), |s| s.to_string_lossy().into());
        studies.push((name, r.claims));
    }
    let table = crate::report::study::verdicts(&studies);
    print!("{table}");
    if let Some(out) = out {
        let written = crate::run_dir::write_all_or_nothing(out, |dir| {
            crate::run_dir::atomic_write(&dir.join("verdicts.md"), table.as_bytes())?;
            Ok(vec![dir.join("verdicts.md")])
        })?;
        eprintln!("report: {}", written[0].display());
    }
    Ok(())
}

/// `plexus report PATH... [--spec SPEC…] [--by K,…] [--metric M,…] [--baseline K=V] [--curves …]
/// [--format md|csv|latex|summary|verdicts] [--out DIR]`.
pub fn report(
    paths: &[PathBuf],
    specs: &[PathBuf],
    options: &crate::study::ReportOptions,
    format: &str,
    out: Option<&Path>,
) -> Result<()> {
    // Where the report goes, checked before anything is read: a folder (or a new path). Without
    // --out only the default markdown report writes `<folder>/report/`: a table printed in another
    // format (`--format latex` for a paper) leaves the folder as it is.
    let out = out.map(Path::to_path_buf).or_else(|| match paths {
        [one] if format == "md" && one.is_dir() && !one.join("config.yaml").is_file() => Some(one.join("report")),
        _ => None,
    });
    if let Some(out) = &out {
        crate::run_dir::check_output_dir(out, "the report folder")?;
    }
    if format == "verdicts" {
        return report_verdicts(paths, specs, options, out.as_deref());
    }
    if specs.len() > 1 {
        bail!("--spec is given {} times: several specs (one per path) go with --format verdicts only", specs.len());
    }
    let spec = specs.first().map(|p| crate::study::spec::SweepSpec::from_file(p)).transpose()?;
    let r = crate::study::build(paths, options, spec.as_ref())?;
    let md = crate::report::study::markdown(&r);
    let runs_csv = crate::report::study::runs_csv(&r)?;
    let summary = crate::report::study::summary(&r);
    let csv = crate::report::study::csv(&r)?;
    let tex = crate::report::study::latex(&r);
    print!(
        "{}",
        match format {
            "csv" => &csv,
            "latex" => &tex,
            "summary" => &summary,
            _ => &md,
        }
    );
    if let Some(out) = out {
        // The figures' width and formats: the flags, else the spec's `report:` section.
        crate::plot::set_formats(crate::plot::Formats::parse(r.formats.as_deref().unwrap_or("png,svg,pdf"))?);
        crate::plot::set_width(crate::plot::Width::parse(r.width.as_deref().unwrap_or("double"))?);
        // A sweep's own report/ (written by the sweep with its spec's settings) replaced by a
        // report of other settings: said, so that it is not lost by surprise.
        if options != &crate::study::ReportOptions::default() && out.join("report.md").is_file() {
            eprintln!(
                "report: replacing {} with this report's settings (give --out DIR to keep both)",
                out.join("report.md").display()
            );
        }
        // All or nothing: the tables and figures are written aside and moved in once all are.
        let tables = ["report.md", "report.csv", "report.tex", "runs.csv", "runs.curves.csv"];
        let curves_csv = crate::study::curves_csv(&r)?;
        let written = crate::run_dir::write_all_or_nothing(&out, |dir| {
            let mut files = Vec::new();
            for (name, text) in tables.iter().zip([&md, &csv, &tex, &runs_csv, &curves_csv]) {
                crate::run_dir::atomic_write(&dir.join(name), text.as_bytes())?;
                files.push(dir.join(name));
            }
            files.extend(crate::plot::study::band_curves(&r, dir)?);
            files.extend(crate::plot::study::claim_figures(&r, dir)?);
            Ok(files)
        })?;
        let figures = &written[tables.len()..];
        // The formats written, as the figures' extensions say (`--formats`).
        let mut kinds: Vec<String> = Vec::new();
        for f in figures {
            let ext = f.extension().map(|e| format!(".{}", e.to_string_lossy())).unwrap_or_default();
            if !kinds.contains(&ext) {
                kinds.push(ext);
            }
        }
        let claims = figures.iter().any(|f| f.file_name().is_some_and(|n| n.to_string_lossy().starts_with("claim-")));
        let stems = if claims { "curve-*, claim-*" } else { "curve-*" };
        eprintln!(
            "report: {} ({}){}",
            out.display(),
            tables.join(", "),
            if figures.is_empty() {
                String::new()
            } else {
                format!(", {} figure files ({stems}: {})", figures.len(), kinds.join(", "))
            }
        );
    }
    Ok(())
}
