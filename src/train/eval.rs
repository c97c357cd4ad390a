//! Evaluation on the held-out batches: mean loss, accuracy, perplexity.

use crate::data::{Batch, DeviceTransform, InputTransform, Task};
use crate::model::Model;
use tch::{Device, Kind, Tensor};

/// An `eval.csv` row (the type lives with the run-directory format).
pub use crate::run_dir::EvalResult;
use crate::task::ddpm::{Diffusion, BUCKETS, EVAL_SEED, STEPS};

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

    /// Whether the dataset has no held-out batches.
    pub fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }

    /// The number of held-out batches.
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

/// The evaluation the trainer runs at an evaluation step: the task's loss and metrics, or for a
/// diffusion model the validation ε-MSE with its value per timestep bucket. `None` without a
/// held-out set.
pub fn evaluate_for_run(model: &Model, task: Task, set: &EvalSet, step: u64) -> Option<(EvalResult, Option<Vec<f64>>)> {
    match task {
        Task::Diffusion(d) => {
            evaluate_diffusion(&d, set, step, |x| model.forward(x, false)).map(|(e, buckets)| (e, Some(buckets)))
        }
        _ => evaluate(model, task, set, step).map(|e| (e, None)),
    }
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

/// Validation: the ε-MSE over the held-out images at timesteps and noise drawn from
/// [`EVAL_SEED`] (diffusion validation) (the same at every evaluation), in total and per bucket of `STEPS/BUCKETS`
/// timesteps (`[BUCKETS]`, bucket `k` = `t ∈ [100k, 100k+100)`). One read. `None` if the set
/// is empty. Labels are kept (no dropout).
pub fn evaluate_diffusion(
    d: &Diffusion,
    set: &EvalSet,
    step: u64,
    mut forward: impl FnMut(&Tensor) -> Tensor,
) -> Option<(EvalResult, Vec<f64>)> {
    if set.is_empty() {
        return None;
    }
    let dev = set.device();
    let (mut sums, mut counts) =
        (Tensor::zeros([BUCKETS], (Kind::Double, dev)), Tensor::zeros([BUCKETS], (Kind::Double, dev)));
    let _seed = crate::device::seed_guard(EVAL_SEED);
    tch::no_grad(|| {
        set.for_each(|b| {
            let batch = d.prepare(&b.input, &b.target, false);
            let out = forward(&batch.input);
            let e = out.to_kind(Kind::Float).narrow(1, 0, d.channels);
            let per =
                (e - batch.target.narrow(1, 0, d.channels)).square().flatten(1, -1).mean_dim(1, false, Kind::Double);
            let t = batch.input.select(1, batch.input.size()[1] - 2).to_kind(Kind::Int64);
            let k = t.divide_scalar_mode(STEPS / BUCKETS, "floor");
            sums = sums.scatter_add(0, &k, &per);
            counts = counts.scatter_add(0, &k, &per.ones_like());
        })
    });
    let v = crate::host::values(&Tensor::cat(&[&sums, &counts], 0));
    let (s, c) = v.split_at(BUCKETS as usize);
    let total: f64 = s.iter().sum::<f64>() / c.iter().sum::<f64>();
    let buckets = s.iter().zip(c).map(|(s, c)| if *c > 0.0 { s / c } else { f64::NAN }).collect();
    Some((EvalResult { step, loss: total, accuracy: None, perplexity: None }, buckets))
}
