//! Evaluation on the held-out batches: mean loss, accuracy, perplexity.

use crate::data::{Batch, Task};
use crate::model::Model;
use serde::Serialize;
use tch::{Device, Kind};

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EvalResult {
    pub step: u64,
    /// Mean loss per example (classification) or per token (language model).
    pub loss: f64,
    /// Top-1 accuracy (classification, and next-token accuracy for language models).
    pub accuracy: Option<f64>,
    /// `exp(loss)` for language models.
    pub perplexity: Option<f64>,
}

/// Evaluates `model` on `batches` (CPU batches, moved to `device`). `None` if there are none.
pub fn evaluate(model: &Model, task: Task, batches: &[Batch], device: Device, step: u64) -> Option<EvalResult> {
    evaluate_with(task, batches, device, step, |x| model.forward(x, false))
}

/// Like [`evaluate`] with any input → output function (early exits, noisy inputs, …).
pub fn evaluate_with(
    task: Task,
    batches: &[Batch],
    device: Device,
    step: u64,
    forward: impl Fn(&tch::Tensor) -> tch::Tensor,
) -> Option<EvalResult> {
    if batches.is_empty() {
        return None;
    }
    let (mut loss_sum, mut correct, mut count) = (0.0f64, 0.0f64, 0.0f64);
    tch::no_grad(|| {
        for b in batches {
            let b = b.to_device(device);
            let out = forward(&b.input);
            let n = b.target.numel() as f64;
            loss_sum += task.loss(&out, &b.target).double_value(&[]) * n;
            count += n;
            if task != Task::HalfSumSquares {
                let pred = out.argmax(-1, false);
                correct += pred.eq_tensor(&b.target).to_kind(Kind::Double).sum(Kind::Double).double_value(&[]);
            }
        }
    });
    let loss = loss_sum / count;
    Some(EvalResult {
        step,
        loss,
        accuracy: (task != Task::HalfSumSquares).then_some(correct / count),
        perplexity: (task == Task::LanguageModel).then(|| loss.exp()),
    })
}
