//! What a model learns from a batch: the [`Task`] (the loss, and for diffusion the noising of the
//! batch into model inputs and targets) and the [`Batch`] itself. Below the data and the models,
//! which both name their task; the DDPM maths of the diffusion task is in [`ddpm`].

pub mod ddpm;

use tch::{Device, Tensor};

/// The objective, fixed by the dataset (or by the backbone: `dit` makes it [`Task::Diffusion`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Task {
    /// Regression with `½‖f(X) − Y‖²_F` summed over the batch (the LNN case study's loss).
    HalfSumSquares,
    /// Classification with the mean cross-entropy of logits `[n, classes]` against labels `[n]`.
    Classification,
    /// Next-token prediction: logits `[B, T, vocab]` against tokens `[B, T]`, mean cross-entropy
    /// (perplexity = exp of it).
    LanguageModel,
    /// DDPM ε-prediction on class-labelled images (see [`ddpm`]): the trainer turns an
    /// image batch into noisy model inputs and noise targets ([`Task::prepare`]); the loss is
    /// `MSE(ε̂, ε)` on the ε channels of the output.
    Diffusion(ddpm::Diffusion),
}

impl Task {
    /// Returns a scalar, computed in fp32 (shapes: see the variants). `output` may come in the
    /// compute dtype (`Model::forward_compute`): language-model logits in bf16 go
    /// to [`crate::native::choice::cross_entropy_lm`], the same fp32 arithmetic without an fp32 copy of
    /// the `[B·T, vocab]` logits (on a GPU, one fused kernel each way).
    pub fn loss(&self, output: &Tensor, target: &Tensor) -> Tensor {
        match self {
            Task::HalfSumSquares => {
                let diff = output.to_kind(tch::Kind::Float) - target.to_kind(tch::Kind::Float);
                diff.square().sum(tch::Kind::Float) * 0.5
            }
            Task::Classification => output.to_kind(tch::Kind::Float).cross_entropy_for_logits(target),
            Task::LanguageModel => {
                let v = *output.size().last().expect("logits have a vocabulary dimension");
                let (logits, target) = (output.reshape([-1, v]), target.reshape([-1]));
                if logits.kind() == tch::Kind::Float {
                    logits.cross_entropy_for_logits(&target)
                } else {
                    crate::native::choice::cross_entropy_lm(&logits, &target)
                        .unwrap_or_else(|e| panic!("language-model loss: {e:#}"))
                }
            }
            Task::Diffusion(d) => d.loss(output, target),
        }
    }

    /// The model input and loss target of a batch (`input` already through the input transform):
    /// the batch itself, except for diffusion, which draws `t`, the noise and the label dropout
    /// from libtorch's global generator (the trainer reseeds it from `(seed, step)`).
    pub fn prepare(&self, batch: Batch) -> Batch {
        match self {
            Task::Diffusion(d) => d.prepare(&batch.input, &batch.target, true),
            _ => batch,
        }
    }
}

/// One batch: `input` for the model (raw: see `data::InputTransform`), `target` for the loss. On the
/// CPU unless the source is resident on the training device (`DataSource::make_resident`).
#[derive(Debug)]
pub struct Batch {
    pub input: Tensor,
    pub target: Tensor,
}

impl Batch {
    /// A copy on `device` (a plain, blocking copy: for set-up and tests, not the training step).
    pub fn to_device(&self, device: Device) -> Batch {
        Batch { input: self.input.to_device(device), target: self.target.to_device(device) }
    }

    /// Pins a CPU batch in page-locked memory for an asynchronous copy to the CUDA `device`
    /// (done on the data thread, off the training thread); anything else is returned as it is.
    pub fn pinned_for(self, device: Device) -> anyhow::Result<Batch> {
        if device.is_cuda() && self.input.device() == Device::Cpu {
            Ok(Batch {
                input: crate::native::process_group::pin_memory(&self.input)?,
                target: crate::native::process_group::pin_memory(&self.target)?,
            })
        } else {
            Ok(self)
        }
    }

    /// Rank `rank` of `world`'s rows of this (global) batch ([`crate::dist::shard`]); the batch
    /// itself for one process.
    pub fn shard(&self, rank: usize, world: usize) -> Batch {
        let part = |t: &Tensor| if world == 1 { t.shallow_clone() } else { crate::dist::shard(t, rank, world) };
        Batch { input: part(&self.input), target: part(&self.target) }
    }

    /// The batch on `device` without waiting: from pinned memory the copy is queued on the
    /// current stream and the training thread goes on (a no-op when it is there already).
    pub fn to_device_async(&self, device: Device) -> Batch {
        let copy = |t: &Tensor| t.to_device_(device, t.kind(), true, false);
        Batch { input: copy(&self.input), target: copy(&self.target) }
    }
}
