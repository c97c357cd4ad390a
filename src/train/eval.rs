//! Evaluation on the held-out batches: mean loss, accuracy, perplexity.

use crate::data::{Batch, DeviceTransform, InputTransform, Task};
use crate::model::Model;
use serde::Serialize;
use tch::{Device, Kind, Tensor};

#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct EvalResult {
    pub step: u64,
    /// Mean loss per example (classification) or per token (language model).
    pub loss: f64,
    /// Top-1 accuracy (classification, and next-token accuracy for language models).
    pub accuracy: Option<f64>,
    /// `exp(loss)` for language models.
    pub perplexity: Option<f64>,
}

impl std::fmt::Display for EvalResult {
    /// `loss 0.4178, accuracy 84.00%` / `…, perplexity 7.15`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "loss {:.4}", self.loss)?;
        if let Some(a) = self.accuracy {
            write!(f, ", accuracy {:.2}%", 100.0 * a)?;
        }
        if let Some(p) = self.perplexity {
            write!(f, ", perplexity {p:.2}")?;
        }
        Ok(())
    }
}

/// Evaluation sets up to this size (as model inputs) stay on the device for the whole run; larger
/// ones (ImageNet's 50,000 validation images are 30 GB in fp32) are moved batch by batch.
pub const RESIDENT_BYTES: i64 = 2 << 30;

/// The held-out batches for a device: raw batches plus the transform that makes model inputs of
/// them. Resident sets are moved and transformed once, at construction.
pub struct EvalSet {
    batches: Vec<Batch>,
    resident: bool,
    device: Device,
    transform: DeviceTransform,
}

impl EvalSet {
    /// `batches`: raw batches from [`crate::data::DataSource::eval_batches`].
    pub fn new(batches: Vec<Batch>, transform: &InputTransform, device: Device) -> Self {
        let transform = transform.on(device);
        // Model inputs are fp32 (4 bytes per element) whatever the raw dtype.
        let bytes: i64 = batches.iter().map(|b| 4 * b.input.numel() as i64 + 8 * b.target.numel() as i64).sum();
        if bytes <= RESIDENT_BYTES {
            let batches = batches
                .iter()
                .map(|b| {
                    let b = b.to_device(device);
                    Batch { input: transform.apply(&b.input), target: b.target }
                })
                .collect();
            Self { batches, resident: true, device, transform: DeviceTransform::Identity }
        } else {
            Self { batches, resident: false, device, transform }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }

    pub fn len(&self) -> usize {
        self.batches.len()
    }

    /// Batch `i`, on the device and ready for the model.
    pub fn batch(&self, i: usize) -> Batch {
        let b = &self.batches[i];
        if self.resident {
            Batch { input: b.input.shallow_clone(), target: b.target.shallow_clone() }
        } else {
            let b = b.to_device(self.device);
            Batch { input: self.transform.apply(&b.input), target: b.target }
        }
    }

    /// Whether the set lives on the device.
    pub fn resident(&self) -> bool {
        self.resident
    }

    /// The device the batches are evaluated on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Calls `f` with every batch, in order, on the device and ready for the model.
    pub fn for_each(&self, mut f: impl FnMut(&Batch)) {
        for b in &self.batches {
            if self.resident {
                f(b);
            } else {
                let b = b.to_device(self.device);
                f(&Batch { input: self.transform.apply(&b.input), target: b.target });
            }
        }
    }
}

/// Evaluates `model` on `set`. `None` if the set is empty.
pub fn evaluate(model: &Model, task: Task, set: &EvalSet, step: u64) -> Option<EvalResult> {
    evaluate_with(task, set, step, |x| model.forward(x, false))
}

/// Like [`evaluate`] with any input → output function (early exits, noisy inputs, …), called on
/// the batches in order. The sums stay on the device: one read for the whole evaluation.
pub fn evaluate_with(
    task: Task,
    set: &EvalSet,
    step: u64,
    mut forward: impl FnMut(&Tensor) -> Tensor,
) -> Option<EvalResult> {
    if set.is_empty() {
        return None;
    }
    let zero = || Tensor::zeros([], (Kind::Double, set.device()));
    let (mut loss_sum, mut correct, mut count) = (zero(), zero(), 0.0f64);
    tch::no_grad(|| {
        set.for_each(|b| {
            let out = forward(&b.input);
            let n = b.target.numel() as f64;
            loss_sum = &loss_sum + task.loss(&out, &b.target).to_kind(Kind::Double) * n;
            count += n;
            if task != Task::HalfSumSquares {
                let hits = out.argmax(-1, false).eq_tensor(&b.target).sum(Kind::Double);
                correct = &correct + hits;
            }
        })
    });
    let sums = crate::host::values(&Tensor::stack(&[loss_sum, correct], 0));
    let loss = sums[0] / count;
    Some(EvalResult {
        step,
        loss,
        accuracy: (task != Task::HalfSumSquares).then_some(sums[1] / count),
        perplexity: (task == Task::LanguageModel).then(|| loss.exp()),
    })
}
