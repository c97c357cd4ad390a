//! One optimisation step — exactly what `plexus train` runs and what `plexus bench` times.
//!
//! The step reads nothing back from the device: the loss is summed there, the gradient norm is
//! one fused reduction, the clip coefficient stays there, and a non-finite loss or gradient is
//! recorded there (step and kind) by [`Stepper::step`]. The trainer reads all of it in one read
//! ([`Stepper::read`]) on logging and checkpoint steps only. See `crate::host`.

use super::optim::Optim;
use crate::data::{Batch, DeviceTransform, InputTransform, Task};
use crate::dist::Dist;
use crate::model::Model;
use tch::{Device, Kind, Tensor};

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
    /// The first step whose loss or gradient was non-finite, if any, and what went non-finite.
    pub diverged: Option<(u64, NonFinite)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NonFinite {
    Loss,
    Gradient,
}

/// A model, its optimizer, and what a step needs besides the batches.
pub struct Stepper {
    pub model: Model,
    pub optim: Optim,
    pub task: Task,
    pub accumulation: u64,
    pub clip: Option<f64>,
    pub device: Device,
    transform: DeviceTransform,
    /// `[first non-finite step or −1, 1 = loss | 2 = gradient]`, int64 on the device.
    divergence: Tensor,
    /// The last micro-batch (model input, on the device), kept to diagnose a divergence.
    last: Option<Batch>,
    /// Data-parallel group and the factor applied to the summed gradients and losses (`1/world`
    /// for mean losses, 1 for losses that sum over the batch).
    dist: Option<(Dist, f64)>,
}

impl Stepper {
    pub fn new(
        model: Model,
        optim: Optim,
        task: Task,
        accumulation: u64,
        clip: Option<f64>,
        transform: &InputTransform,
    ) -> Self {
        let device = model.vs.device();
        let divergence = Tensor::from_slice(&[-1i64, 0]).to_device(device);
        Self {
            model,
            optim,
            task,
            accumulation: accumulation.max(1),
            clip,
            device,
            transform: transform.on(device),
            divergence,
            last: None,
            dist: None,
        }
    }

    /// Makes the step data-parallel: gradients and the logged loss are reduced over `dist`'s
    /// ranks (see [`crate::dist`]); the parameters are broadcast from rank 0 now.
    pub fn distribute(&mut self, dist: Dist) -> anyhow::Result<()> {
        let world = dist.info.world_size as f64;
        let scale = if self.task == Task::HalfSumSquares { 1.0 } else { 1.0 / world };
        // Every rank must broadcast in the same order: by name.
        let mut named: Vec<(String, Tensor)> = self.model.vs.variables().into_iter().collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        let mut params: Vec<Tensor> = named.into_iter().map(|(_, t)| t).collect();
        dist.broadcast_parameters(&mut params)?;
        self.dist = Some((dist, scale));
        Ok(())
    }

    /// The data-parallel group, if any.
    pub fn dist(&self) -> Option<&Dist> {
        self.dist.as_ref().map(|(d, _)| d)
    }

    /// A raw batch input (on the device) as the model sees it.
    pub fn model_input(&self, raw: &Tensor) -> Tensor {
        self.transform.apply(raw)
    }

    /// One step: forward and backward over `accumulation` micro-batches drawn from `next` (raw
    /// batches, on the CPU — pinned for a GPU — or resident on the device), the gradient norm,
    /// and, if `lr` is given, clipping and the update. `step` is recorded if the loss or the
    /// gradient is non-finite. No read.
    pub fn step(
        &mut self,
        step: u64,
        mut next: impl FnMut() -> anyhow::Result<Batch>,
        lr: Option<f64>,
    ) -> anyhow::Result<StepStats> {
        self.optim.zero_grad();
        let (mut samples, mut tokens) = (0u64, 0u64);
        let mut loss_sum: Option<Tensor> = None;
        for _ in 0..self.accumulation {
            let raw = next()?.to_device_async(self.device);
            let batch = self.task.prepare(Batch { input: self.transform.apply(&raw.input), target: raw.target });
            samples += batch.input.size()[0] as u64;
            if self.task == Task::LanguageModel {
                tokens += batch.input.numel() as u64;
            }
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
        if let Some((dist, scale)) = &self.dist {
            dist.reduce_gradients(&self.optim.parameters(), *scale)?;
        }
        let grad_norm = self.optim.grad_norm();
        self.record_divergence(step, &loss, &grad_norm);
        if let Some(lr) = lr {
            if let Some(max) = self.clip {
                self.optim.clip(&grad_norm, max);
            }
            self.optim.step(lr);
        }
        Ok(StepStats { loss, grad_norm, samples, tokens })
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
        let loss = self.task.loss(&out, &batch.target);
        match self.model.topology.regularizer() {
            Some(r) => loss + r,
            None => loss,
        }
    }

    /// Keeps the first step whose loss (1) or gradient norm (2) is non-finite, on the device.
    fn record_divergence(&mut self, step: u64, loss: &Tensor, grad_norm: &Tensor) {
        tch::no_grad(|| {
            let code =
                Tensor::where_scalar(&grad_norm.isfinite(), 0i64, 2i64).where_scalarother(&loss.isfinite(), 1i64);
            let bad_step = Tensor::where_scalar(&code.gt(0), step as i64, -1i64);
            let now = Tensor::stack(&[bad_step, code], 0);
            let seen = self.divergence.get(0).ge(0);
            self.divergence = self.divergence.where_self(&seen, &now);
        })
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
            self.divergence.to_kind(Kind::Double),
        ];
        if let Some(g) = &gamma {
            parts.push(g.to_kind(Kind::Double).to_device(self.device).view([1]));
        }
        let parts: Vec<Tensor> = parts.iter().map(|t| t.view([-1])).collect();
        let v = crate::host::values(&Tensor::cat(&parts, 0));
        let diverged =
            (v[2] >= 0.0).then(|| (v[2] as u64, if v[3] == 1.0 { NonFinite::Loss } else { NonFinite::Gradient }));
        Ok(Logged { loss: v[0], grad_norm: v[1], gamma: gamma.map(|_| v[4]), diverged })
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
