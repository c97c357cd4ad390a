//! The command line: `plexus train | demo | analyze | plot | bench | connectivity | parity | doctor | tokenize | list`.

use crate::analysis::{self, AnalyzeOptions};
use crate::config::ConfigError;
use crate::dist::DistInfo;
use crate::experiment::Experiment;
use crate::run_dir::{atomic_write, RunDir};
use crate::train::{self, Summary, TrainOptions};
use crate::{data, doctor, model, sets, topology};
use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(name = "plexus", version, about = "Study how the layers of deep networks connect across depth")]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Train from YAML configs: files, or directories whose *.yaml files form a set (one figure).
    Train {
        #[arg(required_unless_present = "resume")]
        configs: Vec<PathBuf>,
        /// Continue the run in this directory from its latest checkpoint. The config is the run's
        /// config.yaml, or the one CONFIG given; either way only train.steps (to extend the run)
        /// and log.* may differ from what the run was trained with.
        #[arg(long, value_name = "RUN_DIR", conflicts_with_all = ["out", "overwrite"])]
        resume: Option<PathBuf>,
        /// Clear a run directory that already holds files before training into it (a new run
        /// into a non-empty directory is refused otherwise).
        #[arg(long)]
        overwrite: bool,
        /// Run directory (one config) or parent directory of the runs (several). Default: runs/<name>.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Override a config key, e.g. --set model.depth=4 (repeatable; validated like the file).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
        /// Hide the progress bar.
        #[arg(long)]
        quiet: bool,
        /// Data-parallel training in N processes on this machine (Gloo on CPUs, NCCL on GPUs,
        /// rank r on cuda:r). The config's batch is the global batch. Under torchrun or srun
        /// (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT set) leave this at 1.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
        nproc: u16,
        /// Seconds a rank waits for the others (rendezvous, each all-reduce) before failing.
        #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
        dist_timeout: u64,
    },
    /// The main job on an embedded default. `showcase` (default): train residual, ACN and H-ACN
    /// Mixers on Fashion-MNIST, analyse them, draw every figure, then the ANCRe Fig. 2b case study.
    /// Any other set: train it, print the table, draw its figures.
    Demo {
        /// Which embedded set (see `plexus list`).
        #[arg(long, default_value = "showcase")]
        figure: String,
        #[arg(long, default_value = "runs/demo")]
        out: PathBuf,
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
    },
    /// Draw every figure the runs have data for (PNG and SVG): training/eval loss, C heatmaps and
    /// their evolution grid, ANCRe's log(p/max p), Γ and Δ_t, layer-wise exits, pruning, noise.
    Plot {
        #[arg(required = true)]
        runs: Vec<PathBuf>,
        /// Output directory. Default: <run>/figures for one run, <parent of the runs>/figures for several.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Title of the loss figure.
        #[arg(long)]
        title: Option<String>,
        /// Step of the C heatmap (default: the last saved).
        #[arg(long)]
        step: Option<u64>,
    },
    /// Analyse trained runs: layer-wise exits, depth pruning, input-noise robustness, Γ and Δ_t
    /// (CSVs into each run directory); with --correlate, the Pearson correlation of the converged
    /// residual weights across the runs (e.g. seeds).
    Analyze {
        #[arg(required = true)]
        runs: Vec<PathBuf>,
        /// Gaussian input-noise standard deviations (image/vector inputs), comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "0,0.1,0.2,0.3,0.5,1.0")]
        sigmas: Vec<f64>,
        /// Character-noise probabilities (text inputs), comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "0,0.02,0.05,0.1,0.2")]
        probs: Vec<f64>,
        #[arg(long, default_value_t = 3)]
        repeats: usize,
        /// Also write correlation.csv (next to the runs) with the pairwise Pearson correlation of a.
        #[arg(long)]
        correlate: bool,
        /// Device to analyse on (`cpu`, `cuda`, `cuda:N`, `auto`); default: each run's own.
        #[arg(long)]
        device: Option<String>,
    },
    /// Check every topology and backbone against its PyTorch reference (parity/), forward and
    /// every gradient. Prints one line per case; exits non-zero if any fails.
    Parity {
        /// Only cases whose name contains this.
        #[arg(long)]
        only: Option<String>,
        /// Directory of the references and their cases.
        #[arg(long, default_value = "parity")]
        dir: PathBuf,
        /// Keep the reference files here (default: a temporary directory).
        #[arg(long)]
        keep: Option<PathBuf>,
        /// Device of both sides, the Rust model and the PyTorch reference (`cpu`, `cuda`, `cuda:N`).
        #[arg(long, default_value = "cpu")]
        device: String,
    },
    /// Print the direct layer connectivity matrix C as CSV (row = source node, column = target):
    /// of the initialised model for a config, of the final checkpoint (or a saved step) for a run.
    Connectivity {
        config_or_run: PathBuf,
        /// A step saved in the run's connectivity/ directory.
        #[arg(long)]
        step: Option<u64>,
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
    },
    /// Time full training steps (forward, backward, optimizer) of a config: ms/step (median, p10,
    /// p90), samples or tokens/s, memory, parameters, analytic FLOPs and model FLOP utilisation
    /// against the device's measured matmul peak. With --depths, a cost-versus-depth sweep over
    /// --topologies with a log-log plot and the fitted growth exponent of time and memory.
    Bench {
        config: PathBuf,
        /// Timed steps.
        #[arg(long, default_value_t = 20)]
        steps: usize,
        /// Time the data-parallel step in N processes (as `train --nproc N`) and the share of
        /// the gradient all-reduce in it.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
        nproc: u16,
        /// Seconds a rank waits for the others before failing (data-parallel benchmark).
        #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
        dist_timeout: u64,
        /// Untimed warm-up steps.
        #[arg(long, default_value_t = 5)]
        warmup: usize,
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
        /// Append the row(s) to this CSV (header written when the file is new).
        #[arg(long)]
        csv: Option<PathBuf>,
        /// Name of the case in the CSV (default: the config's name).
        #[arg(long)]
        case: Option<String>,
        /// Also print where a step's time goes: forward + loss, backward, optimizer (medians).
        #[arg(long)]
        profile: bool,
        /// Topology overhead in one process: these topologies (the first is the baseline) stepped
        /// round-robin; prints the paired overhead and appends rows to --csv.
        #[arg(long, value_delimiter = ',')]
        compare: Vec<String>,
        /// Depth sweep: values of model.depth, e.g. 8,16,32,64.
        #[arg(long, value_delimiter = ',')]
        depths: Vec<usize>,
        /// Topologies of the sweep, comma-separated; options after `+`, e.g. attnres+blocks=4.
        #[arg(long, value_delimiter = ',', default_value = "residual")]
        topologies: Vec<String>,
        /// Directory of the sweep's CSV and figures.
        #[arg(long, default_value = "bench/depth")]
        out: PathBuf,
    },
    /// Report the torch version, the CUDA driver and runtime, each GPU (name, compute capability,
    /// memory), bf16 support and threads; exit non-zero on a broken CUDA set-up. With
    /// --selftest, also train every topology on every backbone at tiny size on the device
    /// (connectivity, checkpoints, --resume, analyze, bf16 against fp32): the first command to
    /// run on a new GPU machine.
    Doctor {
        #[arg(long)]
        selftest: bool,
        /// Device of the self-test (`auto`: the GPU when there is one).
        #[arg(long, default_value = "auto")]
        device: String,
    },
    /// Tokenise text files into nanoGPT's format for `data.kind: tokens`: DIR/train.bin and
    /// DIR/val.bin (uint16 little-endian token ids) and DIR/meta.json. Streams and encodes on
    /// several threads; the output does not depend on the thread count.
    Tokenize {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Output directory (created if missing; existing files are replaced atomically).
        #[arg(long)]
        out: PathBuf,
        /// gpt2 (GPT-2 BPE, r50k_base; <|endoftext|> after each file) or char (one token per byte).
        #[arg(long, default_value = "gpt2", value_parser = ["gpt2", "char"])]
        encoding: String,
        /// The tail of the tokens written to val.bin.
        #[arg(long, default_value_t = 0.0005)]
        val_fraction: f64,
        /// Encoding threads (default: the machine's cores).
        #[arg(long)]
        threads: Option<usize>,
        /// Hide the progress bar.
        #[arg(long)]
        quiet: bool,
    },
    /// List the registered topologies, backbones, datasets and embedded config sets.
    List,
}

/// Exit code for configuration errors (usage errors), as opposed to 1 for failures at run time.
pub const EXIT_CONFIG: u8 = 2;

pub fn exit_code(err: &anyhow::Error) -> u8 {
    if err.chain().any(|e| e.downcast_ref::<ConfigError>().is_some()) {
        EXIT_CONFIG
    } else {
        1
    }
}

pub fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Train { nproc, .. } if nproc > 1 && std::env::var_os("WORLD_SIZE").is_none() => launch(nproc as usize),
        Cmd::Train { configs, resume: Some(run), overrides, quiet, dist_timeout, .. } => {
            let dist = DistInfo::from_env(Duration::from_secs(dist_timeout))?;
            let main = dist.as_ref().is_none_or(|d| d.rank == 0);
            let dir = RunDir::open(&run)?;
            let config = match configs.as_slice() {
                [] => dir.config_file(),
                [one] if !one.is_dir() => one.clone(),
                _ => bail!(
                    "--resume {} continues one run: give at most one config file (its config.yaml is used when none \
                     is given), not {}",
                    run.display(),
                    configs.iter().map(|c| c.display().to_string()).collect::<Vec<_>>().join(", ")
                ),
            };
            let exp = Experiment::from_file(&config, &overrides)?;
            let progress = main && !quiet && std::io::stderr().is_terminal();
            let opts = TrainOptions { progress, resume: true, crash_after: crash_after()?, dist, ..Default::default() };
            let s = train::train(&exp, &dir, &opts)?;
            if main {
                print_table(&[s]);
            }
            Ok(())
        }
        Cmd::Train { configs, resume: None, out, overrides, quiet, overwrite, dist_timeout, .. } => {
            let dist = DistInfo::from_env(Duration::from_secs(dist_timeout))?;
            let main = dist.as_ref().is_none_or(|d| d.rank == 0);
            let exps = resolve_paths(&configs, &overrides)?;
            if dist.is_some() && exps.len() != 1 {
                bail!("a data-parallel run trains one config; {} were given", exps.len());
            }
            let progress = main && !quiet && std::io::stderr().is_terminal();
            let dirs = run_dirs(&exps, out.as_deref())?;
            let opts = TrainOptions { progress, crash_after: crash_after()?, dist, ..Default::default() };
            let summaries = train_all(&exps, &dirs, &opts, &vec![overwrite; dirs.len()])?;
            if main {
                print_table(&summaries);
            }
            Ok(())
        }
        Cmd::Demo { figure, out, overrides } => demo(&figure, &out, &overrides),
        Cmd::Bench { nproc, .. } if nproc > 1 && std::env::var_os("WORLD_SIZE").is_none() => launch(nproc as usize),
        Cmd::Bench {
            config,
            steps,
            warmup,
            overrides,
            csv,
            case,
            profile,
            compare,
            depths,
            topologies,
            out,
            dist_timeout,
            ..
        } => {
            let opts = crate::bench::BenchOptions { steps, warmup, case, profile };
            if let Some(info) = DistInfo::from_env(Duration::from_secs(dist_timeout))? {
                anyhow::ensure!(
                    compare.is_empty() && depths.is_empty() && !profile && csv.is_none(),
                    "a data-parallel benchmark (--nproc) times one config: --compare, --depths, --profile and \
                     --csv are for single-process benchmarks"
                );
                let exp = Experiment::from_file(&config, &overrides)?;
                if let Some(r) = crate::bench::bench_distributed(&exp, &opts, info)? {
                    println!(
                        "{:<24} {:>5} {:>7} {:>6} {:>10} {:>10} {:>10} {:>12} {:>12} {:>9}",
                        "case",
                        "procs",
                        "backend",
                        "batch",
                        "ms/step",
                        "p10",
                        "p90",
                        "samples/s",
                        "all-reduce",
                        "share"
                    );
                    println!(
                        "{:<24} {:>5} {:>7} {:>6} {:>10.2} {:>10.2} {:>10.2} {:>12.1} {:>9.2} ms {:>8.1}%",
                        r.case,
                        r.world_size,
                        r.backend,
                        r.batch,
                        r.ms[0],
                        r.ms[1],
                        r.ms[2],
                        r.samples_per_s,
                        r.allreduce_ms,
                        100.0 * r.allreduce_share()
                    );
                    println!(
                        "gradient all-reduced per step and rank: {:.2} MiB",
                        r.gradient_bytes as f64 / (1u64 << 20) as f64
                    );
                }
                return Ok(());
            }
            if !compare.is_empty() {
                compare_topologies(&config, &overrides, &opts, &compare, csv.as_deref())
            } else if depths.is_empty() {
                let exp = Experiment::from_file(&config, &overrides)?;
                let row = crate::bench::bench(&exp, &opts)?;
                print_bench(std::slice::from_ref(&row));
                if let Some(path) = csv {
                    append_csv(&path, crate::bench::CSV_HEADER, &format!("{}\n", row.csv()))?;
                }
                Ok(())
            } else {
                depth_sweep(&config, &overrides, &opts, &depths, &topologies, &out)
            }
        }
        Cmd::Plot { runs, out, title, step } => {
            let out = out.unwrap_or_else(|| default_figure_dir(&runs));
            for p in crate::plot::figures::all(&runs, &out, title.as_deref(), step)? {
                println!("{}", p.display());
            }
            Ok(())
        }
        Cmd::Analyze { runs, sigmas, probs, repeats, correlate, device } => {
            let device = match device {
                Some(d) => Some(crate::device::resolve(
                    crate::device::parse_device(&d)
                        .map_err(|allowed| anyhow::anyhow!("--device {d}: expected {allowed}"))?,
                )?),
                None => None,
            };
            let opts = AnalyzeOptions { sigmas, char_probs: probs, repeats, seed: 0, device };
            let summaries = runs.iter().map(|r| analysis::analyze(r, &opts)).collect::<Result<Vec<_>>>()?;
            print_analysis(&summaries);
            if correlate {
                let m = analysis::correlate(&runs)?;
                let path = default_figure_dir(&runs).parent().map(|p| p.join("correlation.csv")).unwrap_or_default();
                let mut s = String::from("run");
                for r in &runs {
                    s += &format!(",{}", r.display());
                }
                s.push('\n');
                for (r, row) in runs.iter().zip(&m) {
                    s += &r.display().to_string();
                    for v in row {
                        s += &format!(",{v}");
                    }
                    s.push('\n');
                }
                atomic_write(&path, s.as_bytes())?;
                println!("\nPearson correlation of the converged residual weights a:\n{s}→ {}", path.display());
            }
            Ok(())
        }
        Cmd::Parity { only, dir, keep, device } => parity(&dir, only.as_deref(), keep.as_deref(), &device),
        Cmd::Connectivity { config_or_run, step, overrides } => {
            print!("{}", connectivity_csv(&config_or_run, step, &overrides)?);
            Ok(())
        }
        Cmd::Doctor { selftest, device } => {
            if !doctor::run() {
                bail!("libtorch is not fully usable (see above)")
            }
            if selftest {
                println!();
                if !doctor::selftest(&device)? {
                    bail!("the self-test failed (see the table above)")
                }
            }
            Ok(())
        }
        Cmd::Tokenize { files, out, encoding, val_fraction, threads, quiet } => {
            use crate::data::{text::Tokenizer, tokenize};
            let encoding = if encoding == "char" { Tokenizer::Char } else { Tokenizer::Gpt2 };
            let defaults = tokenize::TokenizeOptions::default();
            let opts = tokenize::TokenizeOptions {
                encoding,
                val_fraction,
                threads: threads.unwrap_or(defaults.threads),
                progress: !quiet && std::io::stderr().is_terminal(),
                ..defaults
            };
            let r = tokenize::tokenize(&files, &out, &opts)?;
            println!(
                "{}: train.bin {} tokens, val.bin {} tokens ({} MB of text in {:.1}s, {:.1} MB/s, {} threads)",
                out.display(),
                r.train_tokens,
                r.val_tokens,
                r.bytes / 1_000_000,
                r.seconds,
                r.bytes as f64 / 1e6 / r.seconds.max(1e-9),
                opts.threads
            );
            Ok(())
        }
        Cmd::List => {
            println!("topologies (topology.kind):");
            for e in topology::REGISTRY {
                println!("  {:<12} {}", e.name, e.about);
            }
            println!("backbones (model.kind):");
            for e in model::REGISTRY {
                println!("  {:<12} {}", e.name, e.about);
            }
            println!("datasets (data.kind):");
            for e in data::REGISTRY {
                println!("  {:<20} {}", e.name, e.about);
            }
            println!("embedded config sets (plexus demo --figure NAME):");
            for s in sets::SETS {
                println!("  {:<12} {}", s.name, s.about);
            }
            Ok(())
        }
    }
}

/// Expands directories into their `*.yaml` files (sorted) and resolves every config before any
/// run starts, so one bad file stops the whole set before work.
pub fn resolve_paths(paths: &[PathBuf], overrides: &[String]) -> Result<Vec<Experiment>> {
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
    let mut exps = Vec::new();
    for f in files {
        exps.push(Experiment::from_file(&f, overrides)?);
    }
    Ok(exps)
}

/// One run directory per experiment; names must be unique within a set.
fn run_dirs(exps: &[Experiment], out: Option<&Path>) -> Result<Vec<PathBuf>> {
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
fn train_all(exps: &[Experiment], dirs: &[PathBuf], opts: &TrainOptions, overwrite: &[bool]) -> Result<Vec<Summary>> {
    let main = opts.dist.as_ref().is_none_or(|d| d.rank == 0);
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
fn crash_after() -> Result<Option<u64>> {
    match std::env::var("PLEXUS_CRASH_AFTER") {
        Ok(v) => Ok(Some(v.trim().parse().map_err(|_| {
            anyhow::anyhow!("environment variable PLEXUS_CRASH_AFTER={v:?}: expected a number of updates")
        })?)),
        Err(_) => Ok(None),
    }
}

/// `plexus train … --nproc N`: runs this same command in N processes on this machine, as torchrun
/// would (RANK = LOCAL_RANK = r, WORLD_SIZE = N, rendezvous on a free loopback port, each with
/// 1/N of the CPU threads unless OMP_NUM_THREADS is set). If one rank fails the others are
/// stopped, and the error names it.
fn launch(nproc: usize) -> Result<()> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .context("finding a free port for the rendezvous")?
        .port();
    let exe = std::env::current_exe().context("locating the plexus binary")?;
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let threads = (std::thread::available_parallelism().map_or(1, |n| n.get()) / nproc).max(1);
    let mut children = Vec::new();
    for rank in 0..nproc {
        let mut cmd = std::process::Command::new(&exe);
        cmd.args(&args)
            .env("WORLD_SIZE", nproc.to_string())
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string());
        if std::env::var_os("OMP_NUM_THREADS").is_none() {
            cmd.env("OMP_NUM_THREADS", threads.to_string());
        }
        match cmd.spawn() {
            Ok(c) => children.push(c),
            Err(e) => {
                for c in &mut children {
                    let _ = c.kill();
                }
                return Err(e).with_context(|| format!("starting rank {rank} ({})", exe.display()));
            }
        }
    }
    let mut done = vec![false; nproc];
    while done.iter().any(|d| !d) {
        for (rank, child) in children.iter_mut().enumerate() {
            if done[rank] {
                continue;
            }
            if let Some(status) = child.try_wait()? {
                done[rank] = true;
                if !status.success() {
                    for c in &mut children {
                        let _ = c.kill();
                        let _ = c.wait();
                    }
                    bail!(
                        "rank {rank} of {nproc} failed ({status}); the other ranks were stopped (see its error above)"
                    );
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

fn embedded(name: &str, overrides: &[String]) -> Result<(&'static sets::ConfigSet, Vec<Experiment>)> {
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
fn run_set(set: &sets::ConfigSet, exps: &[Experiment], out: &Path) -> Result<Vec<PathBuf>> {
    println!("\n== {} — {}", set.name, set.about);
    let dirs = run_dirs(exps, Some(out))?;
    // The demo regenerates its runs: a previous demo's run directories are replaced, anything
    // else in the way is refused like for `plexus train`.
    let replace: Vec<bool> = dirs.iter().map(|d| d.join("config.yaml").is_file()).collect();
    let opts = TrainOptions { progress: std::io::stderr().is_terminal(), ..Default::default() };
    let summaries = train_all(exps, &dirs, &opts, &replace)?;
    print_table(&summaries);
    atomic_write(&out.join("results.csv"), results_csv(&summaries)?.as_bytes())?;
    Ok(dirs)
}

fn demo(figure: &str, out: &Path, overrides: &[String]) -> Result<()> {
    let started = std::time::Instant::now();
    let mut figures = Vec::new();
    if figure == "showcase" {
        let (set, exps) = embedded("showcase", overrides)?;
        let dir = out.join("showcase");
        let runs = run_set(set, &exps, &dir)?;
        eprintln!("analysing {} runs (layer-wise exits, pruning, noise, Γ, Δ_t)…", runs.len());
        let summaries =
            runs.iter().map(|r| analysis::analyze(r, &AnalyzeOptions::default())).collect::<Result<Vec<_>>>()?;
        print_analysis(&summaries);
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

fn print_bench(rows: &[crate::bench::BenchRow]) {
    println!(
        "{:<30} {:>5} {:>10} {:>17} {:>12} {:>9} {:>9} {:>10} {:>8} {:>6}",
        "case", "depth", "ms/step", "(p10–p90)", "samples/s", "rss MB", "act MB", "params", "GFLOP/s", "MFU"
    );
    for r in rows {
        println!(
            "{:<30} {:>5} {:>10.2} {:>17} {:>12.1} {:>9.0} {:>9.1} {:>10} {:>8.2} {:>5.1}%",
            r.case,
            r.depth,
            r.ms[0],
            format!("({:.2}–{:.2})", r.ms[1], r.ms[2]),
            r.samples_per_s,
            r.peak_rss_mb,
            r.act_mem_mb,
            r.params,
            r.achieved_gflops(),
            100.0 * r.achieved_gflops() / r.peak_gflops
        );
        if let Some([f, b, o]) = r.phase_ms {
            println!("{:<30} profile: forward + loss {f:.2} ms, backward {b:.2} ms, optimizer {o:.2} ms", "");
        }
    }
}

/// Appends `rows` (CSV lines, each ending in a newline) to the CSV at `path`, writing `header`
/// first when the file is new.
fn append_csv(path: &Path, header: &str, rows: &str) -> Result<()> {
    use std::io::Write;
    let result = (|| -> std::io::Result<()> {
        if let Some(d) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(d)?;
        }
        let new = !path.exists();
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
        if new {
            writeln!(f, "{header}")?;
        }
        f.write_all(rows.as_bytes())
    })();
    result.with_context(|| format!("appending to the CSV {}", path.display()))
}

/// `--set` overrides selecting a topology written `kind` or `kind+key=value+…`.
fn topology_overrides(entry: &str) -> Vec<String> {
    let mut parts = entry.split('+');
    let kind = parts.next().unwrap_or_default();
    std::iter::once(format!("topology.kind={kind}")).chain(parts.map(|p| format!("topology.{p}"))).collect()
}

fn compare_topologies(
    config: &Path,
    overrides: &[String],
    opts: &crate::bench::BenchOptions,
    entries: &[String],
    csv: Option<&Path>,
) -> Result<()> {
    let exps = entries
        .iter()
        .map(|t| {
            let ov: Vec<String> = overrides.iter().cloned().chain(topology_overrides(t)).collect();
            Ok((t.clone(), Experiment::from_file(config, &ov)?))
        })
        .collect::<Result<Vec<_>>>()?;
    let case = opts.case.clone().unwrap_or_else(|| exps[0].1.config().name.clone());
    eprintln!("{case}: {} topologies, {} paired rounds…", exps.len(), opts.steps);
    let rows = crate::bench::compare(&exps, opts)?;
    println!(
        "{:<24} {:>10} {:>14} {:>20} {:>9} {:>14}",
        "topology", "ms/step", "overhead", "(p10 … p90)", "act MB", "traffic bound"
    );
    let mut text = String::new();
    for r in &rows {
        let [m, lo, hi] = r.overhead_pct;
        // The bound: the least overhead a fully fused n-stream update could have (bench.rs).
        let bound = r.traffic_bound_pct.map(|b| format!("≥ {b:+.1}%")).unwrap_or_default();
        println!(
            "{:<24} {:>10.2} {:>13.1}% {:>20} {:>9.1} {:>14}",
            r.label,
            r.ms,
            m,
            format!("({lo:+.1}% … {hi:+.1}%)"),
            r.act_mem_mb,
            bound
        );
        let bound_csv = r.traffic_bound_pct.map(|b| format!("{b:.3}")).unwrap_or_default();
        text += &format!("{case},{},{:.4},{m:.3},{lo:.3},{hi:.3},{:.2},{bound_csv}\n", r.label, r.ms, r.act_mem_mb);
    }
    if let Some(path) = csv {
        append_csv(
            path,
            "case,topology,ms_median,overhead_pct,overhead_p10,overhead_p90,act_mem_mb,traffic_bound_pct",
            &text,
        )?;
    }
    Ok(())
}

/// Cost versus depth: every topology at every depth, `depth.csv`, log-log figures of step time and
/// step memory, and the fitted exponent k of `cost ∝ L^k` per topology.
fn depth_sweep(
    config: &Path,
    overrides: &[String],
    opts: &crate::bench::BenchOptions,
    depths: &[usize],
    topologies: &[String],
    out: &Path,
) -> Result<()> {
    use crate::plot::{loglog_chart, topology_color, LineChart, Series};
    std::fs::create_dir_all(out).with_context(|| format!("creating the output directory {}", out.display()))?;
    let mut rows = Vec::new();
    for t in topologies {
        let kind = t.split('+').next().unwrap_or_default();
        for &l in depths {
            let mut ov = overrides.to_vec();
            ov.extend(topology_overrides(t));
            ov.push(format!("model.depth={l}"));
            let exp = Experiment::from_file(config, &ov)?;
            let o = crate::bench::BenchOptions { case: Some(format!("{t}@L{l}")), ..opts.clone() };
            eprintln!("bench {t} at depth {l}…");
            let row = crate::bench::bench(&exp, &o)?;
            print_bench(std::slice::from_ref(&row));
            rows.push((t.clone(), kind.to_string(), l, row));
        }
    }
    let mut csv = String::from(crate::bench::CSV_HEADER);
    csv.push('\n');
    for (_, _, _, r) in &rows {
        csv += &r.csv();
        csv.push('\n');
    }
    atomic_write(&out.join("depth.csv"), csv.as_bytes())?;
    let mut summary = String::from("topology,time_exponent,memory_exponent\n");
    println!("\n{:<24} {:>16} {:>18}", "topology", "time ∝ L^k, k =", "act. mem ∝ L^k, k =");
    let mut time_series = Vec::new();
    let mut mem_series = Vec::new();
    for (i, t) in topologies.iter().enumerate() {
        let mine: Vec<&(String, String, usize, crate::bench::BenchRow)> = rows.iter().filter(|r| &r.0 == t).collect();
        let time: Vec<(f64, f64)> = mine.iter().map(|r| (r.2 as f64, r.3.ms[0])).collect();
        let mem: Vec<(f64, f64)> = mine.iter().map(|r| (r.2 as f64, r.3.act_mem_mb)).collect();
        let (kt, km) = (crate::bench::growth_exponent(&time), crate::bench::growth_exponent(&mem));
        println!("{t:<24} {kt:>16.2} {km:>18.2}");
        summary += &format!("{t},{kt:.3},{km:.3}\n");
        let kind = mine.first().map(|r| r.1.clone()).unwrap_or_default();
        let color =
            Some(topology_color(&kind, topologies[..i].iter().filter(|o| o.split('+').next() == Some(&kind)).count()));
        time_series.push(Series { label: format!("{t} (k = {kt:.2})"), points: time, color });
        mem_series.push(Series { label: format!("{t} (k = {km:.2})"), points: mem, color });
    }
    atomic_write(&out.join("growth.csv"), summary.as_bytes())?;
    let name = config.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let mut files = loglog_chart(
        &LineChart {
            title: format!("Step time versus depth — {name}"),
            x_label: "model.depth L (log scale)".into(),
            y_label: "ms per training step (log scale)".into(),
            log_y: true,
            series: time_series,
        },
        &out.join("depth_time"),
    )?;
    files.extend(loglog_chart(
        &LineChart {
            title: format!("Activation memory versus depth — {name}"),
            x_label: "model.depth L (log scale)".into(),
            y_label: "activation memory (held for backward), MiB (log scale)".into(),
            log_y: true,
            series: mem_series,
        },
        &out.join("depth_memory"),
    )?);
    for f in files.iter().filter(|f| f.extension().is_some_and(|e| e == "png")) {
        println!("figure: {}", f.display());
    }
    println!("csv: {}", out.join("depth.csv").display());
    Ok(())
}

/// The analysis table: final metric, Γ, the exit at half depth, robustness at the largest noise.
pub fn print_analysis(rows: &[analysis::AnalysisSummary]) {
    println!(
        "\n{:<22} {:<24} {:>6} {:>14} {:>7} {:>20} {:>18}",
        "run", "topology", "units", "final", "Γ", "exit at L/2", "largest noise"
    );
    let metric = |acc: Option<f64>, ppl: Option<f64>, loss: f64| match (ppl, acc) {
        (Some(p), _) => format!("ppl {p:.2}"),
        (None, Some(a)) => format!("acc {:.2}%", 100.0 * a),
        _ => format!("loss {loss:.3e}"),
    };
    for r in rows {
        let fin = r.final_eval.as_ref().map(|e| metric(e.accuracy, e.perplexity, e.loss)).unwrap_or_default();
        let half = format!(
            "{} units: {}",
            r.half_depth.units,
            metric(r.half_depth.accuracy, r.half_depth.perplexity, r.half_depth.loss)
        );
        let noisy = r
            .noise
            .last()
            .map(|n| {
                format!(
                    "{}={}: {}",
                    if n.kind == "char" { "p" } else { "σ" },
                    n.level,
                    metric(n.mean_accuracy, n.mean_perplexity, n.mean_loss)
                )
            })
            .unwrap_or_default();
        let gamma = r.gamma.map(|g| format!("{g:.3}")).unwrap_or_else(|| "-".into());
        println!("{:<22} {:<24} {:>6} {:>14} {:>7} {:>20} {:>18}", r.run, r.topology, r.depth, fin, gamma, half, noisy);
    }
}

fn parity(dir: &Path, only: Option<&str>, keep: Option<&Path>, device: &str) -> Result<()> {
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
        (Experiment::from_file(&run.config_file(), overrides)?, Some(run.final_checkpoint()))
    } else {
        anyhow::ensure!(step.is_none(), "--step needs a run directory, not a config");
        (Experiment::from_file(path, overrides)?, None)
    };
    let cfg = exp.config();
    let dev = tch::Device::Cpu;
    let mut model = crate::device::with_seed(cfg.seed, || {
        crate::model::Model::new(exp.model.as_ref(), exp.topology.as_ref(), dev, tch::Kind::Float)
    });
    if let Some(ck) = checkpoint {
        crate::train::checkpoint::load_weights(&mut model.vs, &ck)?;
    }
    let data = exp.data.load()?;
    let c = model.connectivity(&data.train_batch(0)?.input);
    Ok(crate::run_dir::matrix_csv(&c))
}

fn results_csv(summaries: &[Summary]) -> Result<String> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record([
        "run",
        "topology",
        "layout",
        "steps",
        "initial_loss",
        "final_loss",
        "min_loss",
        "steps_to_1e-3",
        "params",
        "seconds",
    ])?;
    for s in summaries {
        w.write_record([
            s.name.clone(),
            s.topology.clone(),
            s.topology_label.clone(),
            s.steps.to_string(),
            s.initial_loss.to_string(),
            s.final_loss.to_string(),
            s.min_loss.to_string(),
            s.steps_to_1e3.map(|v| v.to_string()).unwrap_or_default(),
            s.num_params.to_string(),
            format!("{:.3}", s.wall_seconds),
        ])?;
    }
    Ok(String::from_utf8(w.into_inner()?)?)
}

pub fn print_table(summaries: &[Summary]) {
    let with_eval = summaries.iter().any(|s| s.eval.is_some());
    if with_eval {
        println!(
            "\n{:<28} {:<10} {:<16} {:>7} {:>11} {:>10} {:>14} {:>6} {:>9}",
            "run", "topology", "layout", "steps", "train loss", "eval loss", "eval metric", "Γ", "time"
        );
    } else {
        println!(
            "\n{:<28} {:<10} {:<16} {:>7} {:>12} {:>12} {:>11} {:>9}",
            "run", "topology", "layout", "steps", "final loss", "min loss", "to 1e-3·L0", "time"
        );
    }
    for s in summaries {
        if with_eval {
            let (loss, metric) = match &s.eval {
                Some(e) => (
                    format!("{:.4}", e.loss),
                    match (e.perplexity, e.accuracy) {
                        (Some(p), _) => format!("ppl {p:.2}"),
                        (None, Some(a)) => format!("acc {:.2}%", 100.0 * a),
                        _ => "-".into(),
                    },
                ),
                None => ("-".into(), "-".into()),
            };
            let gamma = s.gamma.map(|g| format!("{g:.3}")).unwrap_or_else(|| "-".into());
            println!(
                "{:<28} {:<10} {:<16} {:>7} {:>11.4} {:>10} {:>14} {:>6} {:>8.1}s",
                s.name, s.topology, s.topology_label, s.steps, s.final_loss, loss, metric, gamma, s.wall_seconds
            );
        } else {
            let reach = s.steps_to_1e3.map(|v| v.to_string()).unwrap_or_else(|| "never".into());
            println!(
                "{:<28} {:<10} {:<16} {:>7} {:>12.3e} {:>12.3e} {:>11} {:>8.2}s",
                s.name, s.topology, s.topology_label, s.steps, s.final_loss, s.min_loss, reach, s.wall_seconds
            );
        }
    }
}

fn default_figure_dir(runs: &[PathBuf]) -> PathBuf {
    match runs {
        [one] => one.join("figures"),
        _ => runs[0].parent().map(|p| p.join("figures")).unwrap_or_else(|| PathBuf::from("figures")),
    }
}

/// `(step, loss)` of every `metrics.csv` row of a run.
pub fn read_losses(run: &Path) -> Result<Vec<(f64, f64)>> {
    let dir = RunDir::new(run);
    anyhow::ensure!(dir.metrics_file().is_file(), "{}: no metrics.csv", run.display());
    Ok(dir.metrics()?.iter().map(|m| (m.step as f64, m.loss)).collect())
}
