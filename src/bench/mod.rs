//! `plexus bench`: the cost of one full training step (forward, backward, optimizer update) of a
//! config, measured the way `parity/bench.py` measures the same model in PyTorch, into the same
//! CSV columns ([`CSV_HEADER`]).
//!
//! Protocol (both sides): one fixed batch of the config's data is reused for every step (data
//! loading is not timed); `warmup` untimed steps, then `steps` timed ones, each timed on its own
//! (after a device synchronisation on CUDA). Memory, on CPU: `peak_rss_mb` is the peak resident
//! set size of the process (`VmHWM`, reset after warm-up through `/proc/self/clear_refs`) during
//! the timed steps (allocator caching makes it history-dependent); `act_mem_mb`, measured after
//! timing with glibc's exact accounting ([`crate::malloc::heap_in_use`]), is what forward + loss leave allocated
//! for backward: the activation memory of the step. On CUDA `act_mem_mb` is the same difference
//! in the caching allocator's allocated bytes ([`crate::native::cuda::cuda_memory_stats`], exact like
//! glibc's), `peak_gpu_mb` the allocator's peak of allocated bytes during the timed steps (reset
//! after warm-up: parameters, optimizer state, activations and temporaries), and `peak_rss_mb`
//! the host process; on CPU `peak_gpu_mb` is `nan`. FLOPs are the backbone's analytic
//! matmul count ([`crate::model::ModelSpec::forward_flops`]) × 3 × batch; the machine's own limit is
//! the best FLOP/s of a large square matmul in the compute dtype, measured in the same process.

pub mod depth;
pub mod kernel_profile;
pub mod table;

use crate::config::Precision;
use crate::device;
use crate::experiment::Experiment;
use crate::model::Model;
use crate::train::optim::Optim;
use crate::train::step::Stepper;
use anyhow::{Context, Result};
use std::time::Instant;
use tch::{Device, Kind, Tensor};

/// Columns of a benchmark CSV row, shared with `parity/bench.py`.
pub const CSV_HEADER: &str = "impl,case,backbone,topology,depth,device,precision,threads,batch,steps,ms_median,\
ms_p10,ms_p90,samples_per_s,tokens_per_s,peak_rss_mb,act_mem_mb,params,flops_per_step,achieved_gflops,\
peak_gflops,mfu,peak_gpu_mb,spec_gflops,mfu_spec";

#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub steps: usize,
    pub warmup: usize,
    /// Case name written in the `case` column (default: the config's name).
    pub case: Option<String>,
    /// Also measure the median time of forward + loss, backward and the optimizer update, and
    /// profile one step's kernels (GPU) or operators (CPU) by category ([`kernel_profile`]).
    pub profile: bool,
    /// With `profile`: where the profiled step's Chrome trace goes (none if unset).
    pub trace: Option<std::path::PathBuf>,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self { steps: 20, warmup: 5, case: None, profile: false, trace: None }
    }
}

/// One measured configuration (one CSV row).
#[derive(Debug, Clone)]
pub struct BenchRow {
    pub case: String,
    pub backbone: String,
    pub topology: String,
    pub depth: usize,
    pub device: String,
    pub precision: String,
    pub threads: i32,
    pub batch: i64,
    pub steps: usize,
    /// Per-step wall time: median, 10th and 90th percentiles (ms).
    pub ms: [f64; 3],
    pub samples_per_s: f64,
    pub tokens_per_s: Option<f64>,
    pub peak_rss_mb: f64,
    /// Bytes held after forward + loss and before backward (activations saved for backward), MiB.
    pub act_mem_mb: f64,
    pub params: i64,
    pub flops_per_step: f64,
    pub peak_gflops: f64,
    /// The GPU's data-sheet dense peak in the compute dtype ([`device::spec_peak_flops`]), GFLOP/s:
    /// what MFU is conventionally reported against; `None` on the CPU, in fp32, or for a GPU not
    /// listed.
    pub spec_gflops: Option<f64>,
    /// CUDA: the allocator's peak of allocated bytes during the timed steps, MiB; `nan` on CPU.
    pub peak_gpu_mb: f64,
    /// With `profile`: median ms of forward + loss, backward, optimizer (clip + update).
    pub phase_ms: Option<[f64; 3]>,
    /// Minor page faults of the process per timed step (fresh memory touched for the first time,
    /// see [`crate::malloc`]); `None` where getrusage is not available.
    pub page_faults_per_step: Option<f64>,
    /// With `profile`, on the CPU: the operators of one step ([`crate::native::profile::count_ops`]).
    pub ops: Option<crate::native::profile::OpCount>,
    /// With `profile`: one eager step's kernel (GPU) or operator (CPU) time by category.
    pub kernels: Option<kernel_profile::KernelProfile>,
}

impl BenchRow {
    /// The model FLOPs of one step over its median wall time (`ms[0]`), in GFLOP/s.
    pub fn achieved_gflops(&self) -> f64 {
        self.flops_per_step / (self.ms[0] * 1e-3) / 1e9
    }

    /// Model FLOP utilisation against the data-sheet peak (the convention), where there is one.
    pub fn mfu_spec(&self) -> Option<f64> {
        self.spec_gflops.map(|p| self.achieved_gflops() / p)
    }

    /// The row as one line of the benchmark CSV, in [`CSV_HEADER`]'s columns (the same columns as
    /// `parity/bench.py` writes); absent values are empty fields.
    pub fn csv(&self) -> String {
        let opt = |v: Option<f64>| v.map(|v| format!("{v:.2}")).unwrap_or_default();
        format!(
            "plexus,{},{},{},{},{},{},{},{},{},{:.4},{:.4},{:.4},{:.2},{},{:.1},{:.1},{},{:.6e},{:.3},{:.3},{:.4},{:.1},{},{}",
            self.case,
            self.backbone,
            self.topology,
            self.depth,
            self.device,
            self.precision,
            self.threads,
            self.batch,
            self.steps,
            self.ms[0],
            self.ms[1],
            self.ms[2],
            self.samples_per_s,
            opt(self.tokens_per_s),
            self.peak_rss_mb,
            self.act_mem_mb,
            self.params,
            self.flops_per_step,
            self.achieved_gflops(),
            self.peak_gflops,
            self.achieved_gflops() / self.peak_gflops,
            self.peak_gpu_mb,
            self.spec_gflops.map(|g| format!("{g:.1}")).unwrap_or_default(),
            self.mfu_spec().map(|m| format!("{m:.4}")).unwrap_or_default()
        )
    }
}

/// `q`-quantile (0..=1) of `xs` by linear interpolation (numpy's default).
pub fn quantile(xs: &[f64], q: f64) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let pos = q * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

/// Resident set size and its peak since the last reset (`VmRSS`, `VmHWM`), in MiB (Linux).
pub fn rss_mb() -> Option<(f64, f64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .map(|kb| kb / 1024.0)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// Resets the peak resident set size to the current one (Linux ≥ 4.0; ignored elsewhere).
pub fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn sync(dev: Device) {
    if let Device::Cuda(i) = dev {
        tch::Cuda::synchronize(i as i64);
    }
}

/// Best FLOP/s of an `n×n` matmul in `kind` on `dev` (the device's practical matmul limit).
pub fn peak_matmul_flops(dev: Device, kind: Kind) -> f64 {
    let n: i64 = if dev.is_cuda() { 8192 } else { 1024 };
    let a = Tensor::randn([n, n], (kind, dev));
    let b = Tensor::randn([n, n], (kind, dev));
    let mut best = f64::INFINITY;
    for i in 0..8 {
        sync(dev);
        let t = Instant::now();
        let c = a.matmul(&b);
        sync(dev);
        let s = t.elapsed().as_secs_f64();
        drop(c);
        if i >= 2 {
            best = best.min(s);
        }
    }
    2.0 * (n * n * n) as f64 / best
}

/// A [`Stepper`] (model, optimizer: the training step of `plexus train`) and one fixed raw batch,
/// resident on the device like an in-memory dataset's: what a benchmark steps.
struct Trainee {
    stepper: Stepper,
    batch: crate::data::Batch,
    lr: f64,
    dev: Device,
    steps_done: u64,
}

impl Trainee {
    fn new(exp: &Experiment) -> Result<Self> {
        let cfg = exp.config();
        let dev = device::resolve(cfg.device_request())?;
        device::apply_matmul_precision(cfg.tf32)?;
        let compute = cfg.precision.compute_kind();
        let data = exp.data.load().with_context(|| format!("{}: loading the benchmark batch", cfg.name))?;
        let batch = data.train_batch(0)?.to_device(dev);
        let model = device::with_seed(cfg.seed, || Model::new(exp.model.as_ref(), exp.topology.as_ref(), dev, compute));
        let optim = Optim::new(&cfg.train, model.trainable());
        let tc = &cfg.train;
        let mut stepper =
            Stepper::new(model, optim, exp.task(), tc.accumulation, tc.clip_grad_norm, &data.input_transform());
        if let Some(note) = stepper.use_cuda_graphs(tc.cuda_graphs)? {
            eprintln!("{}: {note}", cfg.name);
        }
        Ok(Self { stepper, batch, lr: cfg.train.lr, dev, steps_done: 0 })
    }

    fn model(&self) -> &Model {
        &self.stepper.model
    }

    /// The model input of the benchmark batch (transformed as the step does it).
    fn input(&self) -> Tensor {
        self.stepper.model_input(&self.batch.input)
    }

    /// The benchmark batch as the step feeds it to the model and the loss (diffusion: noised, drawn
    /// from the generator the benchmark has seeded and holds the seed lock of).
    fn prepared(&self) -> crate::data::Batch {
        let b = crate::data::Batch { input: self.input(), target: self.batch.target.shallow_clone() };
        self.stepper.task.prepare(b)
    }

    /// One training step, exactly `plexus train`'s (all micro-batches are the fixed batch). Fails
    /// where training would: a CUDA graph capture that fails, an all-reduce that times out.
    fn step(&mut self) -> Result<()> {
        let b = &self.batch;
        let next = || Ok(crate::data::Batch { input: b.input.shallow_clone(), target: b.target.shallow_clone() });
        self.stepper.step(self.steps_done, next, Some(self.lr))?;
        self.steps_done += 1;
        Ok(())
    }

    /// The `--profile` breakdown of one step: forward + loss, backward, and clipping + update, each
    /// after a device synchronisation (so these steps are not the timed ones).
    fn profiled_step(&mut self) -> [f64; 3] {
        let t0 = Instant::now();
        let batch = self.prepared();
        let s = &mut self.stepper;
        s.optim.zero_grad();
        let loss = s.loss(&batch);
        sync(self.dev);
        let t1 = Instant::now();
        loss.backward();
        sync(self.dev);
        let t2 = Instant::now();
        let norm = s.optim.grad_norm();
        if let Some(max) = s.clip {
            s.optim.clip(&norm, max);
        }
        s.optim.step(self.lr);
        sync(self.dev);
        let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
        [ms(t0, t1), ms(t1, t2), ms(t2, Instant::now())]
    }

    /// Untimed steps until a CUDA graph, if the step uses one, is captured: what is timed then is
    /// the replayed step, as in training.
    fn settle(&mut self) -> Result<()> {
        while self.stepper.capture_pending() {
            self.step()?;
        }
        if let Some(note) = self.stepper.take_note() {
            eprintln!("{note}");
        }
        Ok(())
    }

    /// One step's wall time in ms, synchronised.
    fn timed_step(&mut self) -> Result<f64> {
        let t = Instant::now();
        self.step()?;
        sync(self.dev);
        Ok(t.elapsed().as_secs_f64() * 1e3)
    }

    /// Activation memory (MiB): bytes allocated and still held after forward + loss, before
    /// backward (what autograd saved for backward, plus the output), from glibc's accounting.
    fn activation_mb(&mut self) -> f64 {
        let batch = self.prepared();
        let dev = self.dev;
        // Bytes in use: glibc's on the CPU, the caching allocator's on CUDA (after a sync, so
        // that the count is of finished work).
        let in_use = || match dev {
            Device::Cuda(i) => {
                sync(dev);
                crate::native::cuda::cuda_memory_stats(i).ok().map(|m| m.allocated as usize)
            }
            _ => crate::malloc::heap_in_use(),
        };
        let s = &self.stepper;
        s.optim.zero_grad();
        let before = in_use();
        let loss = s.loss(&batch);
        let after = in_use();
        loss.backward();
        match (before, after) {
            (Some(b), Some(a)) => (a as f64 - b as f64) / (1024.0 * 1024.0),
            _ => f64::NAN,
        }
    }
}

/// Times `opts.steps` training steps of `exp` (after `opts.warmup` untimed ones).
pub fn bench(exp: &Experiment, opts: &BenchOptions) -> Result<BenchRow> {
    anyhow::ensure!(opts.steps >= 1, "--steps must be at least 1");
    let cfg = exp.config();
    let info = exp.data.info();
    let mut t = Trainee::new(exp)?;
    let dev = t.dev;
    let compute = cfg.precision.compute_kind();
    let _seed = device::seed_guard(cfg.seed);
    for _ in 0..opts.warmup {
        t.step()?;
    }
    t.settle()?;
    sync(dev);
    reset_peak_rss();
    if let Device::Cuda(i) = dev {
        crate::native::cuda::cuda_reset_peak_memory(i)?;
    }
    let faults_before = crate::malloc::minor_faults(false);
    let times: Vec<f64> = (0..opts.steps).map(|_| t.timed_step()).collect::<Result<_>>()?;
    let page_faults_per_step = faults_before
        .zip(crate::malloc::minor_faults(false))
        .map(|(a, b)| b.saturating_sub(a) as f64 / opts.steps as f64);
    let peak_gpu_mb = match dev {
        Device::Cuda(i) => crate::native::cuda::cuda_memory_stats(i)?.peak_allocated as f64 / (1024.0 * 1024.0),
        _ => f64::NAN,
    };
    // The breakdown is measured in steps of its own, after the timed ones, so that its
    // synchronisations do not enter the step times.
    let phase_ms = opts.profile.then(|| {
        let phases: Vec<[f64; 3]> = (0..opts.steps).map(|_| t.profiled_step()).collect();
        let col = |k: usize| quantile(&phases.iter().map(|p| p[k]).collect::<Vec<_>>(), 0.5);
        [col(0), col(1), col(2)]
    });
    let ops = if opts.profile && dev == Device::Cpu {
        let (stepped, ops) = crate::native::profile::count_ops(|| t.step())?;
        stepped?;
        Some(ops)
    } else {
        None
    };
    let kernels = if opts.profile {
        let (_, events) =
            crate::native::kineto::profile_events(dev.is_cuda(), opts.trace.as_deref(), || t.profiled_step())?;
        Some(kernel_profile::categorize(&events, dev.is_cuda()))
    } else {
        None
    };
    let peak_rss_mb = rss_mb().map_or(f64::NAN, |m| m.1);
    let act_mem_mb = t.activation_mb();
    drop(_seed);
    let (model, batch) = (t.model(), &t.batch);
    let b = batch.input.size()[0];
    let ms = [quantile(&times, 0.5), quantile(&times, 0.1), quantile(&times, 0.9)];
    let per_s = 1e3 / ms[0];
    let tokens = (info.task == crate::data::Task::LanguageModel).then(|| batch.input.numel() as f64 * per_s);
    let samples = b;
    Ok(BenchRow {
        case: opts.case.clone().unwrap_or_else(|| cfg.name.clone()),
        backbone: exp.model.kind().into(),
        topology: exp.topology.kind().into(),
        depth: model.depth(),
        device: format!("{dev:?}").to_lowercase(),
        precision: match cfg.precision {
            Precision::Fp32 => "fp32".into(),
            Precision::Bf16 => "bf16".into(),
        },
        threads: tch::get_num_threads(),
        batch: samples,
        steps: opts.steps,
        ms,
        samples_per_s: samples as f64 * per_s,
        tokens_per_s: tokens,
        peak_rss_mb,
        act_mem_mb,
        params: model.num_params(),
        flops_per_step: 3.0 * exp.model.forward_flops() * samples as f64,
        peak_gflops: peak_matmul_flops(dev, compute) / 1e9,
        spec_gflops: device::spec_peak_of(dev, compute).map(|f| f / 1e9),
        peak_gpu_mb,
        phase_ms,
        page_faults_per_step,
        ops,
        kernels,
    })
}

/// Bytes the stream update of one unit must move, forward and backward, for `n` streams of
/// `elems` elements each (`B·T·D`) of `dtype_bytes`: the memory-traffic lower bound of a fully
/// fused implementation that touches every tensor once per pass.
///
/// * `n = 1` (residual, `x' = x + f(x)`): forward reads `x` and `o`, writes `x'`; backward reads
///   `dx'` and the unit's input gradient, writes `dx` (`do` is `dx'` itself): 6 tensors.
/// * `n > 1` (HC, mHC, `u = preᵀH`, `H' = resᵀH + post ⊗ o`): forward reads `H` (n), writes `u`,
///   reads `o`, writes `H'` (n); backward reads `dH'` (n) and `H` (n, for the gradients of the
///   mixing weights), reads `du`, writes `do` and `dH` (n): `(2n + 2) + (3n + 2) = 5n + 4` tensors.
pub fn stream_update_bytes(n: usize, elems: u64, dtype_bytes: u64) -> u64 {
    let [forward, backward] = stream_update_tensors(n);
    (forward + backward) * elems * dtype_bytes
}

/// The tensors of [`stream_update_bytes`] by phase, `[forward, backward]`: `[3, 3]` for one stream,
/// `[2n + 2, 3n + 2]` for n.
pub fn stream_update_tensors(n: usize) -> [u64; 2] {
    if n <= 1 {
        [3, 3]
    } else {
        [2 * n as u64 + 2, 3 * n as u64 + 2]
    }
}

/// The memory-traffic lower bound of an `n`-stream topology's overhead over residual, in % of the
/// residual step `residual_ms`: the extra bytes of [`stream_update_bytes`] over `units` units at the
/// measured copy bandwidth `bytes_per_s`. `None` for one stream.
pub fn traffic_bound_pct(
    n: usize,
    units: usize,
    elems: u64,
    dtype_bytes: u64,
    bytes_per_s: f64,
    residual_ms: f64,
) -> Option<f64> {
    (n > 1).then(|| {
        let extra =
            (stream_update_bytes(n, elems, dtype_bytes) - stream_update_bytes(1, elems, dtype_bytes)) * units as u64;
        share_of_step_pct(extra as f64, bytes_per_s, residual_ms)
    })
}

/// `amount` of work at `per_s` per second, in % of a `step_ms` step.
fn share_of_step_pct(amount: f64, per_s: f64, step_ms: f64) -> f64 {
    100.0 * (amount / per_s * 1e3) / step_ms
}

/// The arithmetic lower bound of a topology's overhead over residual, in % of the residual step
/// `residual_ms`: its connection's FLOPs ([`crate::topology::TopologySpec::connection_flops`], per
/// token and unit) over `units` units and `tokens` tokens at the device's square-matmul rate
/// `flops_per_s` — nothing the connection computes runs faster than that. `None` when the
/// connection has no such arithmetic.
///
/// Next to [`traffic_bound_pct`] it says which resource bounds the stream update: on a GPU the
/// bytes (its matmul rate is high against its bandwidth), on a few CPU cores often the FLOPs.
pub fn flop_bound_pct(
    flops_per_token: u64,
    units: usize,
    tokens: u64,
    flops_per_s: f64,
    residual_ms: f64,
) -> Option<f64> {
    (flops_per_token > 0)
        .then(|| share_of_step_pct(flops_per_token as f64 * units as f64 * tokens as f64, flops_per_s, residual_ms))
}

/// Best memory bandwidth of a large tensor copy on `dev` (bytes read + written per second): the
/// fastest of 20 copies, since a lower bound wants the most the memory gives (on a shared VM the
/// best of 5 moved by 2× between runs).
pub fn copy_bandwidth(dev: Device) -> f64 {
    let n: i64 = 16 << 20; // 16 Mi floats = 64 MiB, beyond any cache
    let src = Tensor::ones([n], (Kind::Float, dev));
    let mut dst = Tensor::empty([n], (Kind::Float, dev));
    let mut best = f64::INFINITY;
    for i in 0..21 {
        sync(dev);
        let t = Instant::now();
        dst.copy_(&src);
        sync(dev);
        if i >= 1 {
            best = best.min(t.elapsed().as_secs_f64());
        }
    }
    2.0 * 4.0 * n as f64 / best
}

/// One topology of a [`compare`] run.
#[derive(Debug, Clone)]
pub struct CompareRow {
    pub label: String,
    /// Median ms per step.
    pub ms: f64,
    /// Overhead over the first entry, from paired steps: the median, 10th and 90th percentile of
    /// `t_i / t_first − 1` over rounds (%), each ratio taken between steps adjacent in time.
    pub overhead_pct: [f64; 3],
    pub act_mem_mb: f64,
    /// Streams the topology carries (see [`crate::topology::TopologySpec::streams`]).
    pub streams: usize,
    /// For multi-stream topologies: the memory-traffic lower bound of the overhead over the first
    /// entry, % ([`traffic_bound_pct`] with the stream's `B·T·D` and dtype).
    pub traffic_bound_pct: Option<f64>,
    /// For topologies whose connection does matrix arithmetic (HC, mHC): its arithmetic lower
    /// bound of the overhead over the first entry, % ([`flop_bound_pct`] at the fp32 square-matmul
    /// rate measured in the same process).
    pub flop_bound_pct: Option<f64>,
    /// Operators that do work in one training step ([`crate::native::profile::OpCount::kernels`]): on a
    /// GPU, about the kernel launches, which bound a step of many small operators. Counted on the
    /// CPU only (a CUDA backward runs on another thread); `None` on a GPU.
    pub kernels: Option<u64>,
    /// With `profile`: one eager step's kernel (GPU) or operator (CPU) time by category, whose
    /// topology-own row is what this topology's connection costs as its kernels run now.
    pub kernel_profile: Option<kernel_profile::KernelProfile>,
    /// For multi-stream topologies: the traffic bound's time, forward and backward, ms (the extra
    /// bytes of [`stream_update_bytes`] per phase over every unit, at the measured copy bandwidth).
    pub traffic_bound_ms: Option<[f64; 2]>,
    /// The bytes one training step's operators write and read ([`crate::native::profile::OpBytes`]), counted
    /// on the CPU (`None` on a GPU): under `PLEXUS_FUSED_KERNELS=cuda-host` a GPU step's paths.
    pub op_bytes: Option<crate::native::profile::OpBytes>,
    /// Units of the stack, and the extra bytes per unit over residual that the stream update must
    /// move at least, forward and backward ([`stream_update_bytes`]; 0 for one stream).
    pub units: usize,
    pub bound_bytes_per_unit: u64,
}

/// Topology overhead measured in one process: every experiment is built, warmed up, then stepped
/// round-robin (`opts.steps` rounds, the starting entry rotating each round), so that machine
/// drift falls on all of them alike and the overhead is a ratio of neighbouring steps.
pub fn compare(exps: &[(String, Experiment)], opts: &BenchOptions) -> Result<Vec<CompareRow>> {
    anyhow::ensure!(!exps.is_empty() && opts.steps >= 1, "compare needs experiments and at least one step");
    let mut ts = exps.iter().map(|(_, e)| Trainee::new(e)).collect::<Result<Vec<_>>>()?;
    let _seed = device::seed_guard(exps[0].1.config().seed);
    for t in ts.iter_mut() {
        for _ in 0..opts.warmup {
            t.step()?;
        }
        t.settle()?;
    }
    let n = ts.len();
    let mut times = vec![Vec::with_capacity(opts.steps); n];
    for round in 0..opts.steps {
        for k in 0..n {
            let i = (round + k) % n;
            times[i].push(ts[i].timed_step()?);
        }
    }
    // The stream update's shape: `x0` `[B, .., D]` of the benchmark batch, in its dtype.
    let (elems, tokens, dtype_bytes) = tch::no_grad(|| {
        let x0 = ts[0].model().embed(&ts[0].input(), false);
        let width = x0.size().last().copied().unwrap_or(1).max(1) as u64;
        (x0.numel() as u64, x0.numel() as u64 / width, x0.kind().elt_size_in_bytes() as u64)
    });
    let bandwidth = copy_bandwidth(ts[0].dev);
    // Measured only when some topology has a FLOP bound (a few hundred ms on a CPU).
    let matmul_rate =
        exps.iter().any(|(_, e)| e.topology.connection_flops() > 0).then(|| peak_matmul_flops(ts[0].dev, Kind::Float));
    let first_ms = quantile(&times[0], 0.5);
    let kernels = ts
        .iter_mut()
        .map(|t| {
            if t.dev != Device::Cpu {
                return Ok(None);
            }
            let (stepped, ops) = crate::native::profile::count_ops(|| t.step())?;
            stepped?;
            Ok(Some((ops.kernels, ops.bytes)))
        })
        .collect::<Result<Vec<_>>>()?;
    let profiles = ts
        .iter_mut()
        .map(|t| {
            if !opts.profile {
                return Ok(None);
            }
            let (_, events) = crate::native::kineto::profile_events(t.dev.is_cuda(), None, || t.profiled_step())?;
            Ok(Some(kernel_profile::categorize(&events, t.dev.is_cuda())))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(exps
        .iter()
        .enumerate()
        .map(|(i, (label, e))| {
            let streams = e.topology.streams();
            let units = ts[i].model().depth();
            let phase_ms = |phase: [u64; 2]| {
                let extra = phase[0].saturating_sub(phase[1]) * elems * dtype_bytes * units as u64;
                1e3 * extra as f64 / bandwidth
            };
            let ratios: Vec<f64> = times[i].iter().zip(&times[0]).map(|(a, b)| 100.0 * (a / b - 1.0)).collect();
            CompareRow {
                label: label.clone(),
                ms: quantile(&times[i], 0.5),
                overhead_pct: [quantile(&ratios, 0.5), quantile(&ratios, 0.1), quantile(&ratios, 0.9)],
                act_mem_mb: ts[i].activation_mb(),
                streams,
                traffic_bound_pct: traffic_bound_pct(streams, units, elems, dtype_bytes, bandwidth, first_ms),
                flop_bound_pct: matmul_rate
                    .and_then(|rate| flop_bound_pct(e.topology.connection_flops(), units, tokens, rate, first_ms)),
                kernels: kernels[i].map(|k| k.0),
                op_bytes: kernels[i].map(|k| k.1),
                units,
                bound_bytes_per_unit: if streams > 1 {
                    stream_update_bytes(streams, elems, dtype_bytes) - stream_update_bytes(1, elems, dtype_bytes)
                } else {
                    0
                },
                kernel_profile: profiles[i].clone(),
                traffic_bound_ms: (streams > 1).then(|| {
                    let [f, b] = stream_update_tensors(streams);
                    let [f1, b1] = stream_update_tensors(1);
                    [phase_ms([f, f1]), phase_ms([b, b1])]
                }),
            }
        })
        .collect())
}

/// What a data-parallel benchmark measures (rank 0's view).
#[derive(Debug, Clone)]
pub struct DistBenchRow {
    pub case: String,
    pub world_size: usize,
    pub backend: String,
    /// Global batch (examples per step over all ranks).
    pub batch: i64,
    /// Per-step wall time of the data-parallel step (median, p10, p90), ms.
    pub ms: [f64; 3],
    pub samples_per_s: f64,
    /// Median time of the gradient all-reduce alone (every bucket, then the 1/world scaling), ms.
    pub allreduce_ms: f64,
    /// Bytes of gradient each rank sends into the all-reduce per step.
    pub gradient_bytes: i64,
}

impl DistBenchRow {
    /// The all-reduce's share of the step.
    pub fn allreduce_share(&self) -> f64 {
        self.allreduce_ms / self.ms[0]
    }
}

/// Times the data-parallel training step of `exp` as rank `info.rank` (every rank runs this; the
/// ranks step in lock-step), then the gradient all-reduce alone over the same gradients. Returns
/// the row on rank 0, `None` elsewhere.
pub fn bench_distributed(
    exp: &Experiment,
    opts: &BenchOptions,
    info: crate::dist::DistInfo,
) -> Result<Option<DistBenchRow>> {
    anyhow::ensure!(opts.steps >= 1, "--steps must be at least 1");
    let cfg = exp.config();
    let mut t = Trainee::new(exp)?;
    let (rank, world) = (info.rank, info.world_size);
    let global = t.batch.input.size()[0];
    anyhow::ensure!(
        global % world as i64 == 0,
        "{}: the global batch of {global} does not split evenly over {world} processes",
        cfg.name
    );
    t.batch = t.batch.shard(rank, world);
    let dev = info.device(t.dev, crate::device::Machine::current().cuda_devices)?;
    anyhow::ensure!(dev == t.dev, "data-parallel benchmarks on GPUs need `device: cuda` in the config");
    t.stepper.distribute(crate::dist::Dist::join(info, dev)?)?;
    let _seed = device::seed_guard(cfg.seed);
    for _ in 0..opts.warmup {
        t.step()?;
    }
    // Every rank takes the same untimed steps until its graphs are captured.
    t.settle()?;
    sync(dev);
    let times: Vec<f64> = (0..opts.steps).map(|_| t.timed_step()).collect::<Result<_>>()?;
    let params = t.stepper.optim.parameters();
    let gradient_bytes: i64 = params
        .iter()
        .map(|p| p.grad())
        .filter(|g| g.defined())
        .map(|g| g.numel() as i64 * g.kind().elt_size_in_bytes() as i64)
        .sum();
    let world_f = world as f64;
    let dist = t.stepper.dist().expect("distributed above");
    let mut reduce = Vec::with_capacity(opts.steps);
    for _ in 0..opts.steps {
        sync(dev);
        let s = Instant::now();
        dist.reduce_gradients(&params, 1.0 / world_f)?;
        sync(dev);
        reduce.push(s.elapsed().as_secs_f64() * 1e3);
    }
    if rank != 0 {
        return Ok(None);
    }
    let ms = [quantile(&times, 0.5), quantile(&times, 0.1), quantile(&times, 0.9)];
    Ok(Some(DistBenchRow {
        case: opts.case.clone().unwrap_or_else(|| cfg.name.clone()),
        world_size: world,
        backend: if dev.is_cuda() { "nccl".into() } else { "gloo".into() },
        batch: global,
        ms,
        samples_per_s: global as f64 * 1e3 / ms[0],
        allreduce_ms: quantile(&reduce, 0.5),
        gradient_bytes,
    }))
}

/// A least-squares fit of `log y = k·log x + c`: the growth exponent `k` (1: O(L), 2: O(L²)).
pub fn growth_exponent(points: &[(f64, f64)]) -> f64 {
    let pts: Vec<(f64, f64)> =
        points.iter().filter(|(x, y)| *x > 0.0 && *y > 0.0).map(|(x, y)| (x.ln(), y.ln())).collect();
    let n = pts.len() as f64;
    let (mx, my) = (pts.iter().map(|p| p.0).sum::<f64>() / n, pts.iter().map(|p| p.1).sum::<f64>() / n);
    let cov: f64 = pts.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let var: f64 = pts.iter().map(|(x, _)| (x - mx) * (x - mx)).sum();
    cov / var
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_like_numpy() {
        let xs = [4.0, 1.0, 3.0, 2.0, 5.0];
        assert_eq!(quantile(&xs, 0.5), 3.0);
        assert!((quantile(&xs, 0.1) - 1.4).abs() < 1e-12);
        assert!((quantile(&xs, 0.9) - 4.6).abs() < 1e-12);
    }

    /// Mixer bench case: B = 64, T = 64, D = 128 fp32, n = 4, 8 units, 10 GB/s, residual 100 ms:
    /// per unit (5·4 + 4 − 6) · 524288 · 4 B = 37,748,736 B; × 8 = 301,989,888 B = 30.2 ms = 30.2 %.
    #[test]
    fn traffic_bound_of_a_hand_computed_case() {
        let e = 64 * 64 * 128;
        assert_eq!(stream_update_bytes(1, e, 4), 6 * 524_288 * 4);
        assert_eq!(stream_update_bytes(4, e, 4), 24 * 524_288 * 4);
        let pct = traffic_bound_pct(4, 8, e, 4, 10e9, 100.0).unwrap();
        assert!((pct - 30.198_988_8).abs() < 1e-6, "{pct}");
        assert_eq!(traffic_bound_pct(1, 8, e, 4, 10e9, 100.0), None);
    }

    /// GPT bench case: B·T = 16 · 128 = 2048 tokens, D = 128, n = 4, 8 units, residual 100 ms at
    /// 100 GFLOP/s. Dynamic HC: read + write 6 · (16 + 8) · 128 = 18,432 FLOPs per token and unit,
    /// projection 6 · 4 · 128 · 6 = 18,432; × 2048 × 8 = 603,979,776 FLOPs = 6.04 ms = 6.04 %.
    /// mHC: φ 6 · 4 · 128 · 24 = 73,728 more than the read and write: 92,160 → 30.2 %.
    #[test]
    fn flop_bound_of_hand_computed_cases() {
        use crate::topology::common::stream_read_write_flops;
        // The GPT case's stack: 4 blocks of 2 sublayers, width 128.
        let stack =
            crate::topology::StackInfo { sublayers: 8, block_size: 2, width: 128, pre_norm: true, ports: false };
        let spec = |kind: &str, options: &str| {
            let options: serde_yaml::Mapping = serde_yaml::from_str(options).unwrap();
            crate::topology::parse(kind, &options, stack).unwrap()
        };
        assert_eq!(stream_read_write_flops(4, 128), 18_432);
        let hyper = spec("hyper", "{}").connection_flops();
        assert_eq!(hyper, 36_864);
        assert_eq!(spec("hyper", "{dynamic: false}").connection_flops(), 18_432);
        assert_eq!(spec("mhc", "{}").connection_flops(), 92_160);
        assert_eq!(spec("residual", "{}").connection_flops(), 0);
        let pct = flop_bound_pct(hyper, 8, 2048, 100e9, 100.0).unwrap();
        assert!((pct - 6.039_797_76).abs() < 1e-9, "{pct}");
        assert_eq!(flop_bound_pct(0, 8, 2048, 100e9, 100.0), None);
    }

    #[test]
    fn growth_exponent_recovers_linear_and_quadratic_growth() {
        let lin: Vec<(f64, f64)> = [8.0, 16.0, 32.0, 64.0].iter().map(|&l| (l, 3.0 * l + 0.0)).collect();
        let quad: Vec<(f64, f64)> = [8.0, 16.0, 32.0, 64.0].iter().map(|&l| (l, 0.5 * l * l)).collect();
        assert!((growth_exponent(&lin) - 1.0).abs() < 1e-9);
        assert!((growth_exponent(&quad) - 2.0).abs() < 1e-9);
    }
}
