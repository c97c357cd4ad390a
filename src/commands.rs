//! What the verbs of the command line do, beyond parsing them (`crate::cli`): resolving configs
//! and run directories, training sets of runs, the demo, parity and connectivity reports.

use crate::analysis::{self, AnalyzeOptions};
use crate::experiment::Experiment;
use crate::run_dir::{atomic_write, RunDir};
use crate::sets;
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
    let mut seen = std::collections::HashSet::new();
    for e in exps {
        if !seen.insert(e.config().name.clone()) {
            bail!("two configs share the name `{}`; run names must be unique within one command", e.config().name);
        }
    }
    Ok(exps
        .iter()
        .map(|e| match (out, exps.len()) {
            (Some(o), 1) => o.to_path_buf(),
            (Some(o), _) => o.join(&e.config().name),
            (None, _) => Path::new("runs").join(&e.config().name),
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

/// `PLEXUS_CRASH_AFTER=N`: stop with an error after N updates, as a crash would (for testing that
/// resumed runs, distributed ones included, match uninterrupted ones).
pub fn crash_after() -> Result<Option<u64>> {
    match std::env::var("PLEXUS_CRASH_AFTER") {
        Ok(v) => Ok(Some(v.trim().parse().map_err(|_| {
            anyhow::anyhow!("environment variable PLEXUS_CRASH_AFTER={v:?}: expected a number of updates")
        })?)),
        Err(_) => Ok(None),
    }
}

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
    crate::report::print_table(&summaries);
    atomic_write(&out.join("results.csv"), crate::report::results_csv(&summaries)?.as_bytes())?;
    Ok(dirs)
}

pub fn demo(figure: &str, out: &Path, overrides: &[String]) -> Result<()> {
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
    println!("(SVG next to each PNG; done in {:.0} s)", started.elapsed().as_secs_f64());
    Ok(())
}

pub fn default_figure_dir(runs: &[PathBuf]) -> PathBuf {
    match runs {
        [one] => one.join("figures"),
        _ => runs[0].parent().map(|p| p.join("figures")).unwrap_or_else(|| PathBuf::from("figures")),
    }
}

pub fn parity(dir: &Path, only: Option<&str>, keep: Option<&Path>, device: &str) -> Result<()> {
    let device = crate::device::resolve(
        crate::device::parse_device(device)
            .map_err(|allowed| anyhow::anyhow!("--device {device}: expected {allowed}"))?,
    )?;
    let cases = crate::parity::cases(&dir.join("cases"), only)?;
    if cases.is_empty() {
        bail!("no parity case in {} matches {:?}", dir.join("cases").display(), only.unwrap_or(""));
    }
    let tmp = tempfile::tempdir()?;
    let work = keep.unwrap_or(tmp.path());
    eprintln!("running {} PyTorch references on {}…", cases.len(), crate::device::describe(device));
    let results = crate::parity::run_all(dir, &cases, work, device)?;
    println!(
        "{:<28} {:>5} {:>11} {:>11} {:<34} {:>8} {:>7}  result",
        "case", "prec", "output err", "grad err", "(worst gradient)", "tol", "params"
    );
    let mut failed = 0;
    for (case, r) in cases.iter().zip(results) {
        match r {
            Ok(r) => {
                if !r.pass {
                    failed += 1;
                }
                println!(
                    "{:<28} {:>5} {:>11.3e} {:>11.3e} {:<34} {:>8.0e} {:>7}  {}",
                    r.name,
                    format!("{:?}", r.precision).to_lowercase(),
                    r.output_err,
                    r.grad_err,
                    format!("({})", r.worst_grad),
                    r.tolerance,
                    r.params,
                    if r.pass { "pass" } else { "FAIL" }
                );
            }
            Err(e) => {
                failed += 1;
                println!("{:<28} ERROR {e:#}", crate::parity::case_name(case));
            }
        }
    }
    println!("parity: {} passed, {failed} failed", cases.len() - failed);
    if failed > 0 {
        bail!("{failed} parity case(s) failed");
    }
    Ok(())
}

/// C as CSV for a config (initialised model) or a run directory (final checkpoint, or a saved step).
pub fn connectivity_csv(path: &Path, step: Option<u64>, overrides: &[String]) -> Result<String> {
    let (exp, checkpoint) = if path.is_dir() {
        let run = RunDir::open(path)?;
        if let Some(step) = step {
            let f = run.connectivity_file(step);
            return std::fs::read_to_string(&f)
                .with_context(|| format!("no C saved at step {step}: {} (see log.connectivity_every)", f.display()));
        }
        (Experiment::from_file(&run.config_file(), overrides)?, Some(run))
    } else {
        anyhow::ensure!(step.is_none(), "--step needs a run directory, not a config");
        (Experiment::from_file(path, overrides)?, None)
    };
    let cfg = exp.config();
    let dev = tch::Device::Cpu;
    let mut model = crate::device::with_seed(cfg.seed, || {
        crate::model::Model::new(exp.model.as_ref(), exp.topology.as_ref(), dev, tch::Kind::Float)
    });
    if let Some(run) = checkpoint {
        crate::train::checkpoint::load_final(&mut model.vs, &run, &run.final_checkpoint())?;
    }
    // The model's input for a batch (the trainer's probe: transformed, and for diffusion models
    // noised and packed as training does, from the seed).
    let model_input = |batch: crate::data::Batch| match exp.task() {
        crate::data::Task::Diffusion(_) => crate::device::with_seed(cfg.seed, || exp.task().prepare(batch).input),
        _ => batch.input,
    };
    let c = match exp.data.load() {
        Ok(data) => {
            let batch = data.train_batch(0)?;
            let input = data.input_transform().on(dev).apply(&batch.input);
            model.connectivity(&model_input(crate::data::Batch { input, target: batch.target }))
        }
        // C needs the model and the data's shape, not the data: without it, a random batch of
        // that shape, and a second one to say whether C depends on the input at all.
        Err(e) => {
            let info = exp.data.info();
            let on = |seed: u64| model.connectivity(&model_input(random_batch(&info, seed)));
            let (c, other) = (on(cfg.seed), on(cfg.seed.wrapping_add(1)));
            let differs = crate::host::scalar(&(&c - other).abs().max()) > 1e-9;
            let shape: Vec<usize> =
                [RANDOM_BATCH as usize].into_iter().chain(info.input_shape.iter().copied()).collect();
            eprintln!(
                "note: the data is not available ({}); C is computed on a random batch of the data's shape {shape:?}. {}",
                format!("{e:#}").lines().next().unwrap_or(""),
                if differs {
                    "This topology's C depends on the input (two random batches give different C): on real data it \
                     will differ; put the data where data.root says (or set PLEXUS_DATA) for C on it"
                        .to_string()
                } else {
                    "This topology's C does not depend on the input (two random batches give the same C): it is \
                     exact"
                        .to_string()
                }
            );
            c
        }
    };
    Ok(crate::run_dir::matrix_csv(&c))
}

/// Examples in [`random_batch`].
const RANDOM_BATCH: i64 = 8;

/// A batch of the data's shape drawn from `seed`, in the model's input space: N(0, 1) images or
/// vectors, uniform token ids for language models, with uniform labels where there are classes.
fn random_batch(info: &crate::data::DataInfo, seed: u64) -> crate::data::Batch {
    use crate::data::Task;
    let b = RANDOM_BATCH;
    let shape: Vec<i64> = [b].into_iter().chain(info.input_shape.iter().map(|&d| d as i64)).collect();
    let opts = (tch::Kind::Float, tch::Device::Cpu);
    crate::device::with_seed(seed, || match &info.task {
        Task::LanguageModel => {
            let tokens =
                tch::Tensor::randint(info.output_dim as i64, shape.as_slice(), (tch::Kind::Int64, tch::Device::Cpu));
            crate::data::Batch { target: tokens.shallow_clone(), input: tokens }
        }
        Task::Classification | Task::Diffusion(_) => {
            let classes = match &info.task {
                Task::Diffusion(d) => d.num_classes,
                _ => info.output_dim as i64,
            };
            crate::data::Batch {
                input: tch::Tensor::randn(shape.as_slice(), opts),
                target: tch::Tensor::randint(classes, [b], (tch::Kind::Int64, tch::Device::Cpu)),
            }
        }
        Task::HalfSumSquares => crate::data::Batch {
            input: tch::Tensor::randn(shape.as_slice(), opts),
            target: tch::Tensor::randn([b, info.output_dim as i64], opts),
        },
    })
}
