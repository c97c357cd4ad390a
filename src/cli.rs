//! The command line: `plexus train | sweep | report | demo | analyze | plot | bench | connectivity | parity | sample | fd | doctor | tokenize | rl | list`.

pub mod args;

use crate::commands;
use crate::config::{ConfigError, Override};
use anyhow::Result;
use args::{SamplingArgs, SweepArgs};
use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(name = "plexus", version, about = "Study how the layers of deep networks connect across depth")]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Train from YAML configs: files, or directories whose *.yaml files form a set (one figure).
    #[command(
        after_help = "Examples:\n  plexus train configs/showcase/res.yaml --set train.steps=200\n  plexus train configs/mixer-cifar10/cpu --out runs/mixer      # every config of a set\n  plexus train --resume runs/mixer/hacn --set train.steps=2000 --extend hold   # lengthen a run"
    )]
    Train(args::TrainArgs),
    /// Run a study: configs × a grid of --set values × seeds, each an ordinary run directory in
    /// one sweep folder, on free slots (--jobs N on the CPU, one run per GPU with --gpus) or as a
    /// Slurm job array. Re-running skips finished runs and resumes killed ones; then prints the
    /// report. A SPEC file holds configs, set, grid, seeds, out and report (see docs/studies.md).
    #[command(
        after_help = "Examples:\n  plexus sweep configs/studies/hacn-mu.yaml --jobs 2\n  plexus sweep configs/lnn/fig2b/1-none.yaml --seeds 0,1,2 --grid model.depth=3,6 --out runs/sw\n  plexus sweep --resume runs/sw                                  # continue a sweep"
    )]
    Sweep(SweepArgs),
    /// Tables and figures over runs or sweep folders: runs grouped by config keys, each metric's
    /// mean ± sd, n and 95 % interval, the paired difference against a baseline on the same
    /// seeds; markdown, CSV and LaTeX, and curves with a band over seeds (PNG, SVG and PDF).
    #[command(
        after_help = "Example:\n  plexus report runs/studies/hacn-mu --baseline topology.init.mu=1.0 --format latex"
    )]
    Report {
        /// Sweep folders, run directories, or folders of run directories; or the runs.csv of
        /// earlier reports (with --spec: a study recomputed from its committed per-run values).
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// A sweep spec whose `report:` settings and `claims:` apply (default: the sweep folder's
        /// own); each claim gets its verdict. With --format verdicts, one per path (in order) for
        /// several studies at once.
        #[arg(long, value_name = "SPEC.yaml")]
        spec: Vec<PathBuf>,
        /// Config keys to group by, comma-separated (default: the sweep's report.by, else every
        /// key whose value differs between the runs, except seed).
        #[arg(long, value_delimiter = ',')]
        by: Vec<String>,
        /// Metrics, comma-separated: summary.json's numbers (eval.accuracy, final_loss, gamma,
        /// success, …), best.eval.`<column>` (best over the run's evaluations) and a curve's value
        /// at a step, CURVE@STEP (eval.accuracy@400, fd.fd@500).
        #[arg(long = "metric", value_delimiter = ',')]
        metrics: Vec<String>,
        /// The setting to compare the others with, paired by seed, e.g. topology.kind=residual.
        #[arg(long, value_name = "KEY=VALUE")]
        baseline: Option<String>,
        /// Curves to draw with a band over seeds, comma-separated (loss, gamma, eval.accuracy, …).
        #[arg(long, value_delimiter = ',')]
        curves: Vec<String>,
        /// What to print: md, csv or latex (all three are written to --out), summary (the first
        /// table and the claims' verdicts), or verdicts (one row per claim, of one study or of
        /// several: one --spec per path).
        #[arg(long, default_value = "md", value_parser = ["md", "csv", "latex", "summary", "verdicts"])]
        format: String,
        /// Figure files of the curves, comma-separated: png, svg, pdf [default: the spec's
        /// report.formats, else png,svg,pdf].
        #[arg(long)]
        formats: Option<String>,
        /// Printed width of the figures: single (a column, 3.25 in), double (the text width, 6.75
        /// in) or inches; text is set at 8–9 pt at that width [default: the spec's report.width,
        /// else double].
        #[arg(long)]
        width: Option<String>,
        /// Folder for report.{md,csv,tex} and the curves. Default: `<folder>/report` for one
        /// sweep folder or folder of runs; nothing is written for a list of runs without it.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// The main job on an embedded default. `showcase` (default): train residual, ACN and H-ACN
    /// Mixers on Fashion-MNIST, analyse them, draw every figure, then the ANCRe Fig. 2b case study.
    /// Any other set: train it, print the table, draw its figures. Sets: showcase, lnn-fig2b,
    /// lnn-fig2a, lnn-fig2c (`plexus list` shows them with what each is).
    #[command(after_help = "Example:\n  plexus demo --figure lnn-fig2b --out runs/demo")]
    Demo {
        /// Which embedded set (see `plexus list`).
        #[arg(long, default_value = "showcase")]
        figure: String,
        /// Parent directory of the set's runs (each in `<out>/<set>/<run>`).
        #[arg(long, default_value = "runs/demo")]
        out: PathBuf,
        /// Override a key of every run of the set, e.g. --set train.steps=100 (lower
        /// train.warmup_steps with it where the set warms up for longer).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<Override>,
    },
    /// Draw every figure the runs have data for (PNG, SVG and PDF): training/eval loss, C heatmaps and
    /// their evolution grid, ANCRe's log(p/max p), Γ and Δ_t, layer-wise exits, pruning, noise.
    #[command(
        after_help = "Examples:\n  plexus plot runs/mixer/*          # folders that are not runs (figures/) are skipped\n  plexus plot configs/showcase/hacn.yaml --out figures   # the C it will train with"
    )]
    Plot {
        /// Run directories (with several, folders that are not runs are skipped), or one config file:
        /// the C heatmap of its initialised model, before any training.
        #[arg(required = true)]
        runs: Vec<PathBuf>,
        /// Output directory. Default: `<run>/figures` for one run, `<parent of the runs>/figures` for
        /// several, `figures` for a config.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Title of the loss figure.
        #[arg(long)]
        title: Option<String>,
        /// Step of the C heatmap (default: the last saved).
        #[arg(long)]
        step: Option<u64>,
        /// Figure files to write, comma-separated: png, svg, pdf (vector, fonts embedded).
        #[arg(long, default_value = "png,svg,pdf")]
        formats: String,
        /// Printed width of the figures: single (a column, 3.25 in), double (the text width, 6.75
        /// in) or inches; text is set at 8–9 pt at that width.
        #[arg(long, default_value = "double")]
        width: String,
    },
    /// Analyse trained runs: layer-wise exits, depth pruning, input-noise robustness, Γ and Δ_t
    /// (CSVs into each run directory); with --correlate, the Pearson correlation of the converged
    /// residual weights across the runs (e.g. seeds).
    #[command(after_help = "Example:\n  plexus analyze runs/mixer/* --sigmas 0,0.1,0.3 --repeats 5")]
    Analyze {
        /// Run directories (with several, folders that are not runs are skipped).
        #[arg(required = true)]
        runs: Vec<PathBuf>,
        /// Gaussian input-noise standard deviations (image/vector inputs), comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "0,0.1,0.2,0.3,0.5,1.0")]
        sigmas: Vec<f64>,
        /// Character-noise probabilities (text inputs), comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "0,0.02,0.05,0.1,0.2")]
        probs: Vec<f64>,
        /// Noise draws per σ or p (each with its own seed); the table gives their mean ± std.
        #[arg(long, default_value_t = 3)]
        repeats: usize,
        /// Also write correlation.csv (next to the runs): the pairwise Pearson correlation of the
        /// runs' converged residual weights a (H-ACN runs, e.g. the seeds of one config).
        #[arg(long)]
        correlate: bool,
        /// Device to analyse on (`cpu`, `cuda`, `cuda:N`, `auto`); default: each run's own.
        #[arg(long)]
        device: Option<String>,
    },
    /// Draw class-conditional samples from a diffusion run (`model.kind: dit`): a PNG grid, one
    /// row per class, written into the run's figures directory.
    #[command(after_help = "Example:\n  plexus sample runs/dit --sampler ddim --steps 50 --cfg 4 --per-class 8")]
    Sample {
        /// A diffusion run directory (`model.kind: dit`).
        run: PathBuf,
        /// Images per class.
        #[arg(long, default_value_t = 8)]
        per_class: usize,
        #[command(flatten)]
        sampling: SamplingArgs,
    },
    /// Fréchet distance between images sampled from a diffusion run and real held-out images, in
    /// the features of a classifier run plexus trained (not FID-50K: no Inception network).
    #[command(after_help = "Example:\n  plexus fd runs/dit --extractor runs/mixer-fmnist --samples 1000")]
    Fd {
        /// A diffusion run directory (`model.kind: dit`).
        run: PathBuf,
        /// A classifier run (e.g. a Mixer or ViT on the same dataset) whose pooled features are used.
        #[arg(long)]
        extractor: PathBuf,
        /// Generated and real images, each.
        #[arg(long, default_value_t = 1000)]
        samples: usize,
        /// Measure each checkpoint the run kept (its raw weights), with the same noise: the
        /// distance over training, one row per step in the run's fd_steps.csv (`plexus report`
        /// curves `fd.fd`, metrics `fd.fd@STEP`). `--step N` measures one.
        #[arg(long, conflicts_with = "step")]
        every_checkpoint: bool,
        #[command(flatten)]
        sampling: SamplingArgs,
    },
    /// Check every topology and backbone against its PyTorch reference (parity/), forward and
    /// every gradient. Prints one line per case; exits non-zero if any fails.
    #[command(after_help = "Example:\n  plexus parity --only hyper --threads 1")]
    Parity(args::ParityArgs),
    /// Print the direct layer connectivity matrix C as CSV (row = source node, column = target):
    /// of the initialised model for a config, of the final checkpoint (or a saved step) for a run.
    #[command(after_help = "Example:\n  plexus connectivity runs/mixer/hacn --step 500 > C.csv")]
    Connectivity {
        /// A config file (C of the initialised model) or a run directory (C of its final weights).
        config_or_run: PathBuf,
        /// A step saved in the run's connectivity/ directory (see log.connectivity_every).
        #[arg(long)]
        step: Option<u64>,
        /// Override a config key (configs only), e.g. --set topology.init.mu=0.5.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<Override>,
    },
    /// Time full training steps (forward, backward, optimizer) of a config: ms/step (median, p10,
    /// p90), samples or tokens/s, memory, parameters, analytic FLOPs and model FLOP utilisation
    /// against the device's measured matmul peak. With --depths, a cost-versus-depth sweep over
    /// --topologies with a log-log plot and the fitted growth exponent of time and memory.
    #[command(
        after_help = "Examples:\n  plexus bench configs/gpt-owt/res.yaml --device cuda --profile\n  plexus bench CONFIG --compare residual,hacn,mhc --csv bench.csv"
    )]
    Bench(args::BenchArgs),
    /// Report the torch version, the CUDA driver and runtime, each GPU (name, compute capability,
    /// memory), bf16 support and threads; exit non-zero on a broken CUDA set-up. With
    /// --selftest, also train every topology on every backbone at tiny size on the device
    /// (connectivity, checkpoints, --resume, analyze, bf16 against fp32): the first command to
    /// run on a new GPU machine.
    #[command(after_help = "Example:\n  plexus doctor --selftest --device cuda")]
    Doctor {
        /// Also train every topology on every backbone at tiny size on the device and check
        /// connectivity, checkpoints, --resume, analyze and bf16 against fp32 (minutes).
        #[arg(long)]
        selftest: bool,
        /// Device of the self-test (`auto`: the GPU when there is one).
        #[arg(long, default_value = "auto")]
        device: String,
    },
    /// Tokenise text files into nanoGPT's format for `data.kind: tokens`: DIR/train.bin and
    /// DIR/val.bin (uint16 little-endian token ids) and DIR/meta.json. Streams and encodes on
    /// several threads; the output does not depend on the thread count.
    #[command(
        after_help = "Example:\n  plexus tokenize corpus/*.txt --out $PLEXUS_DATA/mycorpus --encoding gpt2   # then data: {kind: tokens, dir: mycorpus}\n  (a relative dir is under the data root; an absolute --out and dir work anywhere)"
    )]
    Tokenize {
        /// Text files (UTF-8 for gpt2; any bytes for char), each once; with gpt2 each is a document.
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
    /// Goal-conditioned contrastive RL on the point maze (ANCRe §5.3): train each config (a
    /// directory stands for its *.yaml files) and draw success rate against environment steps;
    /// with --plot, only draw the figure for finished run directories; with --eval, evaluate them
    /// again on held-out tasks.
    #[command(
        after_help = "Examples:\n  plexus rl configs/crl-maze/cpu --out runs/crl\n  plexus rl --plot runs/crl/*\n  \
                      plexus rl --eval runs/crl/* --episodes 2000"
    )]
    Rl(args::RlArgs),
}

/// Exit code for configuration errors (usage errors), as opposed to 1 for failures at run time.
pub const EXIT_CONFIG: u8 = 2;

/// The process's exit code for `err`: [`EXIT_CONFIG`] when a [`ConfigError`] is anywhere in its
/// chain (a usage error), 1 for any other failure.
pub fn exit_code(err: &anyhow::Error) -> u8 {
    if err.chain().any(|e| e.downcast_ref::<ConfigError>().is_some()) {
        EXIT_CONFIG
    } else {
        1
    }
}

/// `--device D` is `--set device=D`, given last so that it wins.
pub(crate) fn with_device(mut overrides: Vec<Override>, device: Option<String>) -> Result<Vec<Override>> {
    if let Some(d) = device {
        overrides.push(Override::of("device", &d).map_err(|e| anyhow::anyhow!("--device {d}: {e}"))?);
    }
    Ok(overrides)
}

/// Runs the command `cli` parsed: checks `PLEXUS_FUSED_KERNELS` first, then dispatches each verb
/// to its function in [`crate::commands`] (or the launcher of `--nproc` ranks); no work of its own.
pub fn run(cli: Cli) -> Result<()> {
    crate::native::setting::check_fused_kernels_setting()?;
    match cli.cmd {
        Cmd::Train(a) => a.run(),
        Cmd::Sweep(a) => commands::study::sweep(&a.into()),
        Cmd::Report { paths, spec, by, metrics, baseline, curves, format, formats, width, out } => {
            // Checked here, set from the report (the flag, else the spec's) when it draws.
            formats.as_deref().map(crate::plot::Formats::parse).transpose()?;
            width.as_deref().map(crate::plot::Width::parse).transpose()?;
            let options = crate::study::ReportOptions {
                by,
                metrics,
                baseline,
                curves,
                width,
                formats,
                labels: Default::default(),
            };
            commands::study::report(&paths, &spec, &options, &format, out.as_deref())
        }
        Cmd::Demo { figure, out, overrides } => commands::demo(&figure, &out, &overrides),
        Cmd::Bench(a) if a.dist.launches() => crate::dist::launch(a.dist.nproc as usize),
        Cmd::Bench(a) => commands::bench::bench(&a.request()?),
        Cmd::Plot { runs, out, title, step, formats, width } => {
            let style = crate::plot::Style::parse(&formats, &width)?;
            commands::runs::plot(&runs, &style, out.as_deref(), title.as_deref(), step)
        }
        Cmd::Analyze { runs, sigmas, probs, repeats, correlate, device } => {
            commands::runs::analyze(&runs, sigmas, probs, repeats, correlate, device.as_deref())
        }
        Cmd::Sample { run, per_class, sampling } => {
            commands::runs::sample(&run, per_class, &sampling.options, &sampling.device)
        }
        Cmd::Fd { run, extractor, samples, every_checkpoint, sampling } => {
            commands::runs::fd(&run, &extractor, samples, &sampling.options, every_checkpoint, &sampling.device)
        }
        Cmd::Parity(a) => a.run(),
        Cmd::Connectivity { config_or_run, step, overrides } => {
            commands::runs::connectivity(&config_or_run, step, &overrides)
        }
        Cmd::Doctor { selftest, device } => commands::doctor(selftest, &device),
        Cmd::Tokenize { files, out, encoding, val_fraction, threads, quiet } => {
            commands::tokenize(&files, &out, &encoding, val_fraction, threads, quiet)
        }
        Cmd::Rl(a) => a.run(),
        Cmd::List => {
            crate::report::print_registries();
            Ok(())
        }
    }
}
