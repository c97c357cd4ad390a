//! The arguments of the verbs whose flags are many (`plexus bench`, `parity`, `sweep`) and those
//! several verbs share (data parallelism, sampling), each with the request it makes for
//! [`crate::commands`]: clap's side of the command line, so that `cli::run` only dispatches.

use crate::commands::{ResumeRequest, RunRequest};
use crate::config::Override;
use anyhow::Result;
use std::path::PathBuf;
use std::time::Duration;

/// Data parallelism of `plexus train` and `plexus bench` (which times the data-parallel step and
/// the share of the gradient all-reduce in it).
#[derive(Debug, Clone, clap::Args)]
pub struct DistArgs {
    /// Data-parallel training in N processes on this machine (Gloo on CPUs, NCCL on GPUs, rank r
    /// on cuda:r). The config's batch is the global batch. Under torchrun or srun (RANK,
    /// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT set) leave this at 1.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub nproc: u16,
    /// Seconds a rank waits for the others (rendezvous, each all-reduce) before failing.
    #[arg(long = "dist-timeout", value_name = "SECONDS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: u64,
}

impl DistArgs {
    /// `--nproc N > 1` typed by a user (not inside a rank, which has WORLD_SIZE set): launch.
    pub fn launches(&self) -> bool {
        self.nproc > 1 && std::env::var_os("WORLD_SIZE").is_none()
    }
    /// `--dist-timeout` as a duration.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout)
    }
}

/// `plexus sweep`'s spec flags and where its runs go.
#[derive(Debug, Clone, clap::Args)]
pub struct SweepArgs {
    /// A sweep spec (YAML: configs, set, grid, seeds, out, report) or config files; flags
    /// below extend the spec.
    #[arg(required_unless_present = "resume")]
    pub inputs: Vec<PathBuf>,
    /// Continue the sweep in this folder with the spec it recorded (sweep.json).
    #[arg(long, value_name = "SWEEP_DIR", conflicts_with_all = ["inputs", "out", "grid", "seeds", "overrides"])]
    pub resume: Option<PathBuf>,
    /// A grid axis, e.g. --grid topology.init.mu=0.25,0.75,1 (repeatable; replaces the spec's axis of that key).
    #[arg(long, value_name = "KEY=V1,V2,…")]
    pub grid: Vec<String>,
    /// Seeds, comma-separated (replace the spec's; default 0).
    #[arg(long, value_delimiter = ',')]
    pub seeds: Vec<u64>,
    /// Override a config key in every run (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<Override>,
    /// The sweep folder (default: the spec's `out`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Runs at a time on the CPU (each with its share of the cores).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub jobs: u16,
    /// One run per GPU: `all` (those in CUDA_VISIBLE_DEVICES) or indices such as 0,1.
    #[arg(long, conflicts_with = "jobs")]
    pub gpus: Option<String>,
    /// Write a Slurm job-array script (one task per run) to this file instead of running.
    #[arg(long, value_name = "FILE")]
    pub slurm: Option<PathBuf>,
    /// Run only these runs of the sweep (names as in the sweep folder; repeatable).
    #[arg(long, value_name = "RUN")]
    pub only: Vec<String>,
    /// What the updates do that a raised train.steps adds to runs on a cosine schedule: `hold`,
    /// `restart` or `stretch` (as `plexus train --resume --extend`; the spec's `extend`),
    /// recorded in the sweep.
    #[arg(long, value_name = "RULE", conflicts_with = "resume")]
    pub extend: Option<crate::config::ExtendRule>,
    /// Print the plan (each run and whether it is done, to resume or new) and stop.
    #[arg(long)]
    pub dry_run: bool,
    /// No progress bar or per-run lines.
    #[arg(long)]
    pub quiet: bool,
}

/// How `plexus sample` and `plexus fd` draw from a diffusion run, and on which device.
#[derive(Debug, Clone, clap::Args)]
pub struct SamplingArgs {
    #[command(flatten)]
    pub options: crate::diffusion::SampleOptions,
    /// `auto` (a GPU if there is one), `cpu`, `cuda` or `cuda:N`.
    #[arg(long, default_value = "auto")]
    pub device: String,
}

impl From<SweepArgs> for crate::commands::study::SweepRequest {
    fn from(a: SweepArgs) -> Self {
        crate::commands::study::SweepRequest {
            inputs: a.inputs,
            resume: a.resume,
            grid: a.grid,
            seeds: a.seeds,
            overrides: a.overrides,
            out: a.out,
            jobs: a.jobs as usize,
            gpus: a.gpus,
            slurm: a.slurm,
            only: a.only,
            dry_run: a.dry_run,
            quiet: a.quiet,
            extend: a.extend,
        }
    }
}

/// `plexus bench`'s flags.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// The config whose training step is timed.
    pub config: PathBuf,
    /// Timed steps.
    #[arg(long, default_value_t = 20)]
    pub steps: usize,
    #[command(flatten)]
    pub dist: DistArgs,
    /// Untimed warm-up steps.
    #[arg(long, default_value_t = 5)]
    pub warmup: usize,
    /// Override a config key, e.g. --set data.batch_size=32 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<Override>,
    /// Device to time on (`auto`, `cpu`, `cuda`, `cuda:N`): the same as --set device=…
    #[arg(long)]
    pub device: Option<String>,
    /// Append the row(s) to this CSV (header written when the file is new).
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Name of the case in the CSV (default: the config's name).
    #[arg(long)]
    pub case: Option<String>,
    /// Also print where a step's time goes: forward + loss, backward, optimizer (medians); one
    /// eager step under libtorch's profiler, its GPU kernel time (CPU operator time on the CPU)
    /// by category — GEMM, attention, norm, activation, RoPE, loss, cast/copy, optimizer,
    /// topology-own, other — with a Chrome trace (--trace); on the CPU also the operators of
    /// one step, counted and timed (PLEXUS_OPS_ALL=1 lists them all).
    #[arg(long)]
    pub profile: bool,
    /// With --profile: the Chrome trace of the profiled step (chrome://tracing or
    /// ui.perfetto.dev) [default: runs/bench-profile/CASE.json]; a new path or a regular file,
    /// which is replaced.
    #[arg(long, value_name = "FILE", requires = "profile")]
    pub trace: Option<PathBuf>,
    /// Topology overhead in one process: these topologies (the first is the baseline) stepped
    /// round-robin; prints the paired overhead and appends rows to --csv.
    #[arg(long, value_delimiter = ',')]
    pub compare: Vec<String>,
    /// Depth sweep: values of model.depth, e.g. 8,16,32,64.
    #[arg(long, value_delimiter = ',')]
    pub depths: Vec<usize>,
    /// Topologies of the sweep, comma-separated; options after `+`, e.g. attnres+blocks=4.
    #[arg(long, value_delimiter = ',', default_value = "residual")]
    pub topologies: Vec<String>,
    /// Directory of the sweep's CSV and figures.
    #[arg(long, default_value = "runs/bench-depth")]
    pub out: PathBuf,
}

impl BenchArgs {
    /// What `plexus bench` is asked to time (`--device D` as `--set device=D`, given last).
    pub fn request(self) -> Result<crate::commands::bench::BenchRequest> {
        Ok(crate::commands::bench::BenchRequest {
            config: self.config,
            overrides: super::with_device(self.overrides, self.device)?,
            options: crate::bench::BenchOptions {
                steps: self.steps,
                warmup: self.warmup,
                case: self.case,
                profile: self.profile,
                trace: self.trace,
            },
            csv: self.csv,
            compare: self.compare,
            depths: self.depths,
            topologies: self.topologies,
            out: self.out,
            dist_timeout: self.dist.timeout(),
        })
    }
}

/// `plexus parity`'s flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ParityArgs {
    /// Only cases whose name contains this.
    #[arg(long)]
    pub only: Option<String>,
    /// Directory of the references and their cases.
    #[arg(long, default_value = "parity")]
    pub dir: PathBuf,
    /// Keep the reference files here (default: a temporary directory), and reuse them: a case
    /// whose file is already there from the same case file, parity/*.py, draw, device, thread
    /// count, kernel path and torch version is not run again (DIR/references.json records
    /// each). The reference is most of a parity run's time.
    #[arg(long, value_name = "DIR")]
    pub keep: Option<PathBuf>,
    /// Device of both sides, the Rust model and the PyTorch reference (`cpu`, `cuda`, `cuda:N`).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// CPU threads of both sides (libtorch's intra-op threads; default: libtorch's, at most one
    /// per core). More threads than cores are allowed: the order of the sums changes with it.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,
    /// Run every case on N random draws instead of the one it is written with: draw k (1..=N)
    /// seeds the reference's weights, input and cotangent with the case's seed + 1000003·k.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub draws: Option<u64>,
    /// Also write every tensor's errors here, one row per case, draw and tensor (plexus's,
    /// the reference's run and its furthest spread run against float64, direct, bound).
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
}

impl ParityArgs {
    /// Runs `plexus parity` as asked.
    pub fn run(&self) -> Result<()> {
        crate::parity::command::run(&crate::parity::command::ParityRequest {
            dir: &self.dir,
            only: self.only.as_deref(),
            keep: self.keep.as_deref(),
            device: &self.device,
            threads: self.threads,
            draws: self.draws,
            csv: self.csv.as_deref(),
        })
    }
}

/// `plexus train`'s flags.
#[derive(Debug, Clone, clap::Args)]
pub struct TrainArgs {
    /// Config files (YAML), or directories whose *.yaml files are trained one after another.
    #[arg(required_unless_present = "resume")]
    pub configs: Vec<PathBuf>,
    /// Continue the run in this directory from its latest checkpoint. The config is the run's
    /// config.yaml, or the one CONFIG given; either way only train.steps (to extend the run),
    /// log.*, train.cuda_graphs and device may differ from what the run was trained with.
    #[arg(long, value_name = "RUN_DIR", conflicts_with_all = ["out", "overwrite"])]
    pub resume: Option<PathBuf>,
    /// With --resume and a larger train.steps on a cosine schedule: what the added updates
    /// do: `hold` (continue at the last update's learning rate), `restart` (a new cosine cycle
    /// from the peak lr over them) or `stretch` (the cosine planned again over the new length:
    /// the rate jumps up). Recorded in the run's config.yaml (train.extensions).
    #[arg(long, value_name = "RULE", requires = "resume")]
    pub extend: Option<crate::config::ExtendRule>,
    /// Clear a run directory that already holds files before training into it (a new run
    /// into a non-empty directory is refused otherwise).
    #[arg(long)]
    pub overwrite: bool,
    /// Run directory (one config) or parent directory of the runs (several). Default: `runs/<name>`.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Override a config key, e.g. --set model.depth=4 (repeatable; validated like the file).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<Override>,
    /// Device of the run (`auto`, `cpu`, `cuda`, `cuda:N`): the same as --set device=…
    #[arg(long)]
    pub device: Option<String>,
    /// Hide the progress bar.
    #[arg(long)]
    pub quiet: bool,
    #[command(flatten)]
    pub dist: DistArgs,
}

impl TrainArgs {
    /// Trains the configs (or continues the run), through the registry of run kinds; `--nproc N`
    /// launches N ranks of this command instead.
    pub fn run(self) -> Result<()> {
        if self.dist.launches() {
            return crate::dist::launch(self.dist.nproc as usize);
        }
        let overrides = super::with_device(self.overrides, self.device)?;
        let (quiet, dist_timeout) = (self.quiet, self.dist.timeout());
        match &self.resume {
            Some(run) => {
                let (configs, extend) = (&self.configs, self.extend);
                let r = ResumeRequest { run, configs, overrides: &overrides, extend, quiet, dist_timeout };
                crate::commands::kind_resume(&crate::kinds::TRAIN, &r)
            }
            None => {
                let (inputs, out, overwrite) = (&self.configs, self.out.as_deref(), self.overwrite);
                let r =
                    RunRequest { inputs, out, overrides: &overrides, overwrite, plot_only: false, quiet, dist_timeout };
                crate::commands::kind_run(&crate::kinds::TRAIN, &r)
            }
        }
    }
}

/// `plexus rl`'s flags.
#[derive(Debug, Clone, clap::Args)]
pub struct RlArgs {
    /// Config files or directories of configs to train; with --plot, run directories.
    #[arg(required_unless_present = "resume", value_name = "CONFIG_OR_DIR|RUN_DIR")]
    pub inputs: Vec<PathBuf>,
    /// Continue the run in this directory from its latest checkpoint, with its own config
    /// (`--set train.env_steps=N` extends it; other keys may not change).
    #[arg(long, value_name = "RUN_DIR", conflicts_with_all = ["inputs", "out", "overwrite", "plot", "eval"])]
    pub resume: Option<PathBuf>,
    /// Run directory (one config) or parent of the runs (several); with --plot, the figure
    /// directory. Default: `runs/<name>`.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Override a config key, e.g. --set network.depth=16 (repeatable; validated like the file).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<Override>,
    /// Device of the runs (`auto`, `cpu`, `cuda`, `cuda:N`): the same as --set device=…
    #[arg(long, conflicts_with = "plot")]
    pub device: Option<String>,
    /// Clear a run directory that already holds files first.
    #[arg(long)]
    pub overwrite: bool,
    /// Only draw the success figure of existing run directories.
    #[arg(long, conflicts_with_all = ["overrides", "overwrite"])]
    pub plot: bool,
    /// Evaluate finished runs again: each final policy, the straight-line walker and the
    /// random policy on --episodes tasks the run never saw (writes held_out_eval.json).
    #[arg(long, conflicts_with_all = ["overrides", "overwrite", "plot", "out"])]
    pub eval: bool,
    /// Tasks of --eval, one episode each (at most 1,000,000: every task is held in memory).
    #[arg(long, default_value_t = 1000, requires = "eval", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub episodes: u32,
    /// No per-evaluation lines on stderr.
    #[arg(long)]
    pub quiet: bool,
}

impl RlArgs {
    /// Trains the RL configs (or continues the run, draws the success figure, or evaluates
    /// finished runs on held-out tasks), through the registry of run kinds.
    pub fn run(self) -> Result<()> {
        if self.eval {
            return crate::commands::runs::held_out_eval(&self.inputs, self.episodes as usize, self.device.as_deref());
        }
        let overrides = super::with_device(self.overrides, self.device)?;
        // One process always: no data-parallel RL runs to wait for.
        let (quiet, dist_timeout) = (self.quiet, Duration::MAX);
        match &self.resume {
            Some(run) => {
                let r = ResumeRequest { run, configs: &[], overrides: &overrides, extend: None, quiet, dist_timeout };
                crate::commands::kind_resume(&crate::kinds::RL, &r)
            }
            None => {
                let (inputs, out, overwrite, plot_only) =
                    (&self.inputs, self.out.as_deref(), self.overwrite, self.plot);
                let r = RunRequest { inputs, out, overrides: &overrides, overwrite, plot_only, quiet, dist_timeout };
                crate::commands::kind_run(&crate::kinds::RL, &r)
            }
        }
    }
}
