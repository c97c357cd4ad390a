//! One optimisation step — exactly what `plexus train` runs and what `plexus bench` times.
//!
//! The step reads nothing back from the device: the loss is summed there, the gradient norm is
//! one fused reduction, the clip coefficient stays there, and a non-finite loss or gradient is
//! recorded there (step and kind) by [`Stepper::step`]. The trainer reads all of it in one read
//! ([`Stepper::read`]) on logging and checkpoint steps only. See `crate::host`.

use super::divergence::DivergenceGuard;
use super::optim::Optim;
use crate::config::CudaGraphs;
use crate::data::{Batch, DeviceTransform, InputTransform, Task};
use crate::dist::Dist;
use crate::model::Model;
use tch::{Device, Kind, Tensor};

/// The numbers whose first non-finite step the step records, in the order a divergence names
/// them: a non-finite loss is what to report, even where the gradient went with it.
const WATCHED: &[&str] = &["the loss", "the gradient"];

/// What a step leaves on the device.
pub struct StepStats {
    /// Mean training loss over the micro-batches, 0-dim f64 (before the update); this rank's own
    /// in a data-parallel run ([`Stepper::read`] gives the global one).
    pub loss: Tensor,
    /// Global gradient norm before clipping, 0-dim fp32.
    pub grad_norm: Tensor,
    /// Examples (sequences for language models) and tokens (language models) in the step.
    pub samples: u64,
    pub tokens: u64,
}

/// What a logging step reads, in one read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Logged {
    pub loss: f64,
    pub grad_norm: f64,
    pub gamma: Option<f64>,
    /// The first step whose loss or gradient was non-finite, if any, and what went non-finite
    /// ("the loss", or "the gradient" where the loss stayed finite).
    pub diverged: Option<(u64, &'static str)>,
}

impl Logged {
    /// The `metrics.csv` row of these numbers at `step` (`epoch`: batches seen / batches per epoch).
    pub fn row(&self, step: u64, epoch: f64, lr: f64) -> crate::run_dir::MetricsRow {
        let (loss, grad_norm, gamma) = (self.loss, self.grad_norm, self.gamma);
        crate::run_dir::MetricsRow { step, epoch, loss, lr, grad_norm, gamma }
    }
}

/// How the step runs: eagerly, or captured once as CUDA graphs and replayed.
enum Execution {
    Eager,
    /// `warmup` more eager steps on the graphs' side stream, then one capture, then replays. One
    /// graph holds the whole step; data-parallel steps have two, forward and backward in the first,
    /// the update in the second, and the gradients' all-reduce runs eagerly between them.
    Graph {
        graphs: Vec<crate::native::cuda_graph::CudaGraph>,
        warmup: u32,
        captured: bool,
    },
}

/// A part of the step that one graph holds (see [`Execution::Graph`]).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Part {
    /// Everything: one process.
    Whole,
    /// Forward and backward of every micro-batch, the loss (data parallel: before the all-reduce).
    Gradients,
    /// The gradient norm, divergence record, clipping and update (data parallel: after it).
    Update,
}

/// Eager steps on the side stream before the capture (cuBLAS workspaces, the NVRTC kernels'
/// compilation and self-check, autograd's per-stream state: none of it may happen while
/// capturing).
const GRAPH_WARMUP_STEPS: u32 = 3;

/// A model, its optimizer, and what a step needs besides the batches.
///
/// The step is written so that a CUDA graph can capture it (`train.cuda_graphs`), and it is the
/// same step eager: what changes from one step to the next enters through tensors that keep their
/// storage — the micro-batches are copied into static buffers, the learning rate and the update
/// count into the optimizer's device tensors ([`Optim::stage`]), the step index into a device
/// scalar — and what it leaves (loss, gradient norm, divergence record) is written in place into
/// tensors that live across steps. `tests/it/train.rs` checks both on the CPU: the storage, and an
/// operator trace with every scalar argument, identical from step to step.
pub struct Stepper {
    pub model: Model,
    pub optim: Optim,
    pub task: Task,
    pub accumulation: u64,
    pub clip: Option<f64>,
    pub device: Device,
    transform: DeviceTransform,
    /// The first step whose loss or gradient norm went non-finite, on the device; its index
    /// tensor holds the step's index.
    divergence: DivergenceGuard,
    /// The step's raw micro-batches, on the device: copied in before each step.
    inputs: Vec<Batch>,
    /// Mean loss of the last step, 0-dim f64; global gradient norm before clipping, 0-dim fp32.
    loss: Tensor,
    grad_norm: Tensor,
    /// The last micro-batch (model input, on the device), kept to diagnose a divergence.
    last: Option<Batch>,
    /// Data-parallel group and the factor applied to the summed gradients and losses (`1/world`
    /// for mean losses, 1 for losses that sum over the batch).
    dist: Option<(Dist, f64)>,
    execution: Execution,
    /// A line for the log about how the step runs, once (see [`Stepper::take_note`]).
    note: Option<String>,
}

impl Stepper {
    /// A step over `model` and `optim` for `task`: `accumulation` micro-batches per update, the
    /// global gradient norm clipped to `clip` where given, raw batches made model inputs by
    /// `transform` on the model's device.
    pub fn new(
        model: Model,
        optim: Optim,
        task: Task,
        accumulation: u64,
        clip: Option<f64>,
        transform: &InputTransform,
    ) -> Self {
        let device = model.vs.device();
        let divergence = DivergenceGuard::new(WATCHED, device);
        Self {
            model,
            optim,
            task,
            accumulation: accumulation.max(1),
            clip,
            device,
            transform: transform.on(device),
            divergence,
            inputs: Vec::new(),
            loss: Tensor::zeros([], (Kind::Double, device)),
            grad_norm: Tensor::zeros([], (Kind::Float, device)),
            last: None,
            dist: None,
            execution: Execution::Eager,
            note: None,
        }
    }

    /// Makes the step data-parallel: gradients and the logged loss are reduced over `dist`'s
    /// ranks (see [`crate::dist`]); the parameters are broadcast from rank 0 now.
    pub fn distribute(&mut self, dist: Dist) -> anyhow::Result<()> {
        anyhow::ensure!(
            !matches!(self.execution, Execution::Graph { captured: true, .. }),
            "data parallelism must be set up before the step is captured"
        );
        let world = dist.info.world_size as f64;
        let scale = if self.task == Task::HalfSumSquares { 1.0 } else { 1.0 / world };
        // Every rank must broadcast in the same order: by name.
        let mut named: Vec<(String, Tensor)> = self.model.vs.variables().into_iter().collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        let mut params: Vec<Tensor> = named.into_iter().map(|(_, t)| t).collect();
        dist.broadcast_parameters(&mut params)?;
        self.dist = Some((dist, scale));
        // Graphs set up for one process capture the whole step; with the all-reduce it takes two
        // (an all-reduce waits on the host, which a capture does not allow): set up again.
        if matches!(self.execution, Execution::Graph { .. }) {
            self.note = self.use_cuda_graphs(CudaGraphs::On)?;
        }
        Ok(())
    }

    /// The data-parallel group, if any.
    pub fn dist(&self) -> Option<&Dist> {
        self.dist.as_ref().map(|(d, _)| d)
    }

    /// Chooses how the step runs (`train.cuda_graphs`; call after [`Stepper::distribute`]). With
    /// `auto`, a CUDA device captures the step unless something prevents it, which the note says;
    /// with `on`, that is an error. Returns the line to log, if any.
    pub fn use_cuda_graphs(&mut self, mode: CudaGraphs) -> anyhow::Result<Option<String>> {
        let why_not = match self.device {
            _ if mode == CudaGraphs::Off => return Ok(None),
            Device::Cuda(_) if !crate::native::cuda_graph::cuda_graphs_built() => Some(format!(
                "this plexus was built without the CUDA and NCCL headers its CUDA graphs are compiled with ({}; \
                 scripts/setup.sh installs them)",
                crate::native::NCCL_MISSING
            )),
            Device::Cuda(_) => None,
            _ if mode == CudaGraphs::Auto => return Ok(None),
            _ => Some("the run is on the CPU".to_string()),
        };
        match (why_not, self.device) {
            (None, Device::Cuda(i)) => {
                let n = if self.dist.is_some() { 2 } else { 1 };
                let graphs =
                    (0..n).map(|_| crate::native::cuda_graph::CudaGraph::new(i)).collect::<Result<Vec<_>, _>>()?;
                self.execution = Execution::Graph { graphs, warmup: GRAPH_WARMUP_STEPS, captured: false };
                let how =
                    if n == 2 { "as two graphs with the gradients' all-reduce between them" } else { "and replayed" };
                Ok(Some(format!(
                    "CUDA graph: the step is captured after {GRAPH_WARMUP_STEPS} warm-up steps {how} \
                     (train.cuda_graphs: off to run it eagerly)"
                )))
            }
            (Some(why), _) if mode == CudaGraphs::On => {
                anyhow::bail!("train.cuda_graphs: on, but the step cannot be captured: {why}")
            }
            (why, _) => Ok(why.map(|w| format!("CUDA graph: off ({w}); eager steps"))),
        }
    }

    /// Whether a CUDA graph is still to be captured (warm-up steps or the capture ahead): a
    /// benchmark steps until it is not, so that it times replays.
    pub fn capture_pending(&self) -> bool {
        matches!(self.execution, Execution::Graph { captured: false, .. })
    }

    /// A line for the log about how the step runs (a CUDA graph given up, and why), once.
    pub fn take_note(&mut self) -> Option<String> {
        self.note.take()
    }

    /// A raw batch input (on the device) as the model sees it.
    pub fn model_input(&self, raw: &Tensor) -> Tensor {
        self.transform.apply(raw)
    }

    /// The training loss of a prepared batch (model input, target): forward, the task's loss and
    /// the topology's regularizer, 0-dim fp32. What a step and `plexus bench` differentiate.
    pub fn loss(&self, batch: &Batch) -> Tensor {
        // Language models hand the loss their logits in the compute dtype (no fp32 copy of
        // [B, T, vocab]); the model output goes out of scope here, so only what autograd saved
        // stays alive through backward.
        let out = if self.task == Task::LanguageModel {
            self.model.forward_compute(&batch.input, true)
        } else {
            self.model.forward(&batch.input, true)
        };
        let loss = {
            let _scope = crate::native::kineto::scope(crate::native::kineto::scopes::LOSS);
            self.task.loss(&out, &batch.target)
        };
        let _scope = crate::native::kineto::scope(crate::native::kineto::scopes::TOPOLOGY);
        match self.model.topology.regularizer() {
            Some(r) => loss + r,
            None => loss,
        }
    }

    /// One step: forward and backward over `accumulation` micro-batches drawn from `next` (raw
    /// batches, on the CPU — pinned for a GPU — or resident on the device), the gradient norm,
    /// and, if `lr` is given, clipping and the update. `step` is recorded if the loss or the
    /// gradient is non-finite. No read. The returned tensors are the stepper's own: read them
    /// before the next step.
    pub fn step(
        &mut self,
        step: u64,
        next: impl FnMut() -> anyhow::Result<Batch>,
        lr: Option<f64>,
    ) -> anyhow::Result<StepStats> {
        self.step_with(step, next, lr, false).map(|(stats, _)| stats)
    }

    /// An eager [`Stepper::step`] with an update that also returns the trace of the part a CUDA
    /// graph captures ([`crate::native::profile::trace_ops`]): every operator with its host arguments. Two
    /// steps must give the same trace for a replay to compute what an eager step would.
    pub fn step_traced(
        &mut self,
        step: u64,
        next: impl FnMut() -> anyhow::Result<Batch>,
        lr: f64,
    ) -> anyhow::Result<(StepStats, Vec<String>)> {
        anyhow::ensure!(matches!(self.execution, Execution::Eager), "a traced step runs eagerly");
        let (stats, trace) = self.step_with(step, next, Some(lr), true)?;
        Ok((stats, trace.expect("traced")))
    }

    fn step_with(
        &mut self,
        step: u64,
        mut next: impl FnMut() -> anyhow::Result<Batch>,
        lr: Option<f64>,
        trace: bool,
    ) -> anyhow::Result<(StepStats, Option<Vec<String>>)> {
        // Outside any graph: the micro-batches into the static buffers, the step index and the
        // learning rate into device tensors.
        let (mut samples, mut tokens) = (0u64, 0u64);
        let mut reshaped = false;
        for i in 0..self.accumulation as usize {
            let raw = next()?.to_device_async(self.device);
            samples += raw.input.size()[0] as u64;
            if self.task == Task::LanguageModel {
                tokens += raw.input.numel() as u64;
            }
            let fits = |buf: &Tensor, t: &Tensor| buf.size() == t.size() && buf.kind() == t.kind();
            match self.inputs.get(i) {
                Some(b) if fits(&b.input, &raw.input) && fits(&b.target, &raw.target) => tch::no_grad(|| {
                    b.input.shallow_clone().copy_(&raw.input);
                    b.target.shallow_clone().copy_(&raw.target);
                }),
                _ => {
                    reshaped |= i < self.inputs.len();
                    let fresh = tch::no_grad(|| Batch { input: raw.input.copy(), target: raw.target.copy() });
                    if i < self.inputs.len() {
                        self.inputs[i] = fresh;
                    } else {
                        self.inputs.push(fresh);
                    }
                }
            }
        }
        if reshaped && !matches!(self.execution, Execution::Eager) {
            // A captured step reads the old buffers: from here on, eager steps.
            self.execution = Execution::Eager;
            self.note = Some(format!("CUDA graph: off from step {step} (the batch shape changed); eager steps"));
        }
        self.divergence.at(step);
        let Some(lr) = lr else {
            // A measuring step (the last one): no update, eager.
            self.run(false)?;
            return Ok((self.stats(samples, tokens), None));
        };
        self.optim.stage(lr);
        if trace {
            let (ran, lines) = crate::native::profile::trace_ops(|| self.run(true))?;
            ran?;
            return Ok((self.stats(samples, tokens), Some(lines)));
        }
        let execution = std::mem::replace(&mut self.execution, Execution::Eager);
        self.execution = match execution {
            Execution::Eager => {
                self.run(true)?;
                Execution::Eager
            }
            Execution::Graph { graphs, warmup, captured: false } if warmup > 0 => {
                self.by_parts(&graphs, true, |s, graph, part| {
                    graph.enter()?;
                    let ran = s.part(part, true);
                    graph.leave()?;
                    ran
                })?;
                Execution::Graph { graphs, warmup: warmup - 1, captured: false }
            }
            Execution::Graph { graphs, captured: false, .. } => {
                // Recorded without the all-reduce between the parts (nothing runs while recording),
                // then replayed with it.
                // A failed capture ends the run: libtorch's CUDA state after one (the default
                // generator still marked as capturing, the allocator still recording into the
                // graphs' pool) does not let the process go on eagerly.
                self.by_parts(&graphs, false, |s, graph, part| s.capture(graph, part)).map_err(|e| {
                    e.context(format!(
                        "CUDA graph: the capture of the training step failed at step {step}; \
                         set train.cuda_graphs: off to train without CUDA graphs"
                    ))
                })?;
                self.by_parts(&graphs, true, |_, graph, _| Ok(graph.replay()?))?;
                Execution::Graph { graphs, warmup: 0, captured: true }
            }
            Execution::Graph { graphs, captured: true, warmup } => {
                self.by_parts(&graphs, true, |_, graph, _| Ok(graph.replay()?))?;
                Execution::Graph { graphs, warmup, captured: true }
            }
        };
        Ok((self.stats(samples, tokens), None))
    }

    /// Runs `f` on each part of the step with its graph: the whole step with one graph; with two
    /// (data parallel), the gradients, then (if `reduce`) their all-reduce, eagerly, then the update.
    fn by_parts(
        &mut self,
        graphs: &[crate::native::cuda_graph::CudaGraph],
        reduce: bool,
        mut f: impl FnMut(&mut Self, &crate::native::cuda_graph::CudaGraph, Part) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        match graphs {
            [whole] => f(self, whole, Part::Whole),
            [gradients, update] => {
                f(self, gradients, Part::Gradients)?;
                if reduce {
                    self.all_reduce()?;
                }
                f(self, update, Part::Update)
            }
            _ => anyhow::bail!("a step is captured as one or two graphs, not {}", graphs.len()),
        }
    }

    /// Records one part of the step into `graph` (on its side stream; nothing runs).
    fn capture(&mut self, graph: &crate::native::cuda_graph::CudaGraph, part: Part) -> anyhow::Result<()> {
        graph.enter()?;
        let recorded = graph.capture_begin().map_err(anyhow::Error::from).and_then(|()| {
            // libtorch errors are panics in tch's operator calls: caught here, so that the capture
            // is ended (and the side stream left) before the error goes up.
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.part(part, true))).unwrap_or_else(
                |panic| {
                    let text = crate::torch_panic::payload_text(&*panic).unwrap_or("a panic without a message");
                    Err(anyhow::anyhow!("{}", crate::torch_panic::describe(text).unwrap_or_else(|| text.to_string())))
                },
            );
            // End the capture whatever happened, so that the side stream leaves capture mode.
            let ended = graph.capture_end();
            ran.and(ended.map_err(anyhow::Error::from))
        });
        let left = graph.leave();
        recorded.and(left.map_err(anyhow::Error::from))
    }

    fn stats(&self, samples: u64, tokens: u64) -> StepStats {
        StepStats { loss: self.loss.shallow_clone(), grad_norm: self.grad_norm.shallow_clone(), samples, tokens }
    }

    /// The step proper, from the static buffers and the staged tensors: forward and backward of
    /// every micro-batch, the losses' mean, the data-parallel reduction, the gradient norm, the
    /// divergence record and, with `update`, clipping and the update. No host number that changes
    /// between steps enters it, and its results are written in place.
    fn run(&mut self, update: bool) -> anyhow::Result<()> {
        self.gradients();
        self.all_reduce()?;
        self.finish(update);
        Ok(())
    }

    fn part(&mut self, part: Part, update: bool) -> anyhow::Result<()> {
        match part {
            Part::Whole => self.run(update),
            Part::Gradients => {
                self.gradients();
                Ok(())
            }
            Part::Update => {
                self.finish(update);
                Ok(())
            }
        }
    }

    /// Forward and backward of every micro-batch; their mean loss into `self.loss`.
    fn gradients(&mut self) {
        self.optim.zero_grad();
        let mut loss_sum: Option<Tensor> = None;
        for b in &self.inputs {
            let batch =
                self.task.prepare(Batch { input: self.transform.apply(&b.input), target: b.target.shallow_clone() });
            let loss = self.loss(&batch);
            (&loss / self.accumulation as f64).backward();
            let value = loss.detach().to_kind(Kind::Double);
            loss_sum = Some(match loss_sum {
                None => value,
                Some(s) => s + value,
            });
            self.last = Some(batch);
        }
        let loss = loss_sum.expect("at least one micro-batch") / self.accumulation as f64;
        tch::no_grad(|| self.loss.copy_(&loss));
    }

    /// Data parallel: the gradients summed over the ranks and scaled (eager: NCCL between graphs).
    fn all_reduce(&mut self) -> anyhow::Result<()> {
        if let Some((dist, scale)) = &self.dist {
            dist.reduce_gradients(&self.optim.parameters(), *scale)?;
        }
        Ok(())
    }

    /// The gradient norm, the divergence record and, with `update`, clipping and the update.
    fn finish(&mut self, update: bool) {
        let grad_norm = self.optim.grad_norm();
        tch::no_grad(|| self.grad_norm.copy_(&grad_norm));
        let loss = self.loss.shallow_clone();
        self.divergence.record(&[&loss, &grad_norm]);
        if update {
            if let Some(max) = self.clip {
                self.optim.clip(&grad_norm, max);
            }
            self.optim.update();
        }
    }

    /// Every tensor that lives across steps and that a step reads or writes: the static input
    /// buffers, the step index, the outputs, the divergence record, and the optimizer's
    /// ([`Optim::persistent_tensors`]). A captured graph keeps using their addresses.
    pub fn persistent_tensors(&self) -> Vec<(String, Tensor)> {
        let mut out = self.optim.persistent_tensors();
        for (i, b) in self.inputs.iter().enumerate() {
            out.push((format!("input{i}"), b.input.shallow_clone()));
            out.push((format!("target{i}"), b.target.shallow_clone()));
        }
        for (name, t) in [
            ("step_index", self.divergence.index_tensor()),
            ("loss", &self.loss),
            ("grad_norm", &self.grad_norm),
            ("divergence", self.divergence.record_tensor()),
        ] {
            out.push((name.to_string(), t.shallow_clone()));
        }
        out
    }

    /// Reads a step's loss and gradient norm, the divergence record and Γ (if the topology has
    /// one) in one read.
    /// In a data-parallel run every rank calls this on the same steps: the loss is reduced over
    /// the ranks here, on logging steps only, not in every step.
    pub fn read(&self, stats: &StepStats) -> anyhow::Result<Logged> {
        let gamma = self.model.topology.gamma();
        let loss = match &self.dist {
            Some((dist, scale)) => {
                let mut global = stats.loss.copy();
                dist.all_reduce_sum(&mut global)?;
                global * *scale
            }
            None => stats.loss.shallow_clone(),
        };
        let mut parts = vec![
            loss.to_kind(Kind::Double),
            stats.grad_norm.to_kind(Kind::Double),
            self.divergence.record_tensor().to_kind(Kind::Double),
        ];
        if let Some(g) = &gamma {
            parts.push(g.to_kind(Kind::Double).to_device(self.device).view([1]));
        }
        let parts: Vec<Tensor> = parts.iter().map(|t| t.view([-1])).collect();
        let v = crate::host::values(&Tensor::cat(&parts, 0));
        let record = &v[2..2 + WATCHED.len() + 1];
        let diverged = self.divergence.decode(record).map(|d| (d.index, d.first()));
        Ok(Logged { loss: v[0], grad_norm: v[1], gamma: gamma.map(|_| v[3 + WATCHED.len()]), diverged })
    }

    /// Names what went non-finite, for the error of a run that diverged at `first` and was found
    /// at `now`. When `first == now` nothing has been updated since, so the parameters,
    /// gradients and activations are those of the failing step and the first non-finite one is
    /// named exactly (an activation by its unit index); otherwise the non-finite update has
    /// already been applied and only the first non-finite parameter can be named. Reads freely:
    /// it runs once, at the end of a failed run.
    pub fn diagnose(&self, first: u64, now: u64) -> String {
        let param = self.optim.first_non_finite_param().map(|p| format!("parameter `{p}`"));
        if first != now {
            let found = param.map(|p| format!("; first non-finite {p}")).unwrap_or_default();
            return format!(
                "found at logging step {now}, after {} non-finite update(s){found}; log every step \
                 (`log.every: 1`) to have the tensor named",
                now - first
            );
        }
        let mut parts = Vec::new();
        if let Some(p) = param {
            parts.push(format!("first non-finite {p}"));
        } else if let Some(b) = &self.last {
            if let Some(a) = self.model.first_non_finite_activation(&b.input) {
                parts.push(format!("first non-finite activation: {a}"));
            }
        }
        if let Some(g) = self.optim.first_non_finite_grad() {
            parts.push(format!("first non-finite gradient: `{g}`"));
        }
        if parts.is_empty() {
            "parameters, activations and gradients are finite: the loss itself overflowed".into()
        } else {
            parts.join("; ")
        }
    }
}
