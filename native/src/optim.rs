//! The training step's tensor-list operations: gradients dropped and libtorch's fused AdamW.

use super::{check, ffi, NativeError, Result};
use tch::Tensor;

/// Drops the gradient of every tensor in `ts` (`.grad = None`, PyTorch's
/// `zero_grad(set_to_none=True)`): the next backward stores its gradient instead of adding it to
/// a zeroed one — no `zero_` and no `add_` per parameter and step (tch's `zero_grad` zeroes in place).
pub fn clear_grads(ts: &[Tensor]) -> Result<()> {
    let mut ptrs: Vec<*mut torch_sys::C_tensor> = ts.iter().map(|t| t.as_ptr() as *mut _).collect();
    // SAFETY: every pointer is a live `at::Tensor*` for the call; the C++ side resets their grads.
    check(unsafe { ffi::plexus_clear_grads(ptrs.as_mut_ptr(), ptrs.len() as i64) })
}

/// AdamW's hyper-parameters for one [`fused_adamw`] call (one parameter group).
#[derive(Debug, Clone, Copy)]
pub struct AdamwHyper {
    pub betas: [f64; 2],
    pub weight_decay: f64,
    pub eps: f64,
}

/// One AdamW update of `params` in place, with their gradients and moments, as
/// `torch.optim.AdamW(fused=True)`: libtorch's fused kernel, a single pass over the four tensors
/// per parameter (CPU and CUDA) instead of eight elementwise kernels. `step`: a 0-dim float32
/// tensor on the parameters' device holding the number of updates including this one; `lr`: the
/// learning rate as a 0-dim tensor there (float32 on CUDA, float64 on the CPU), so that nothing
/// that changes from step to step enters as a host number (a CUDA graph replays the update). All
/// the tensors are on one device with one dtype; the four lists are parallel.
pub fn fused_adamw(
    params: &[Tensor],
    grads: &[Tensor],
    exp_avgs: &[Tensor],
    exp_avg_sqs: &[Tensor],
    step: &Tensor,
    lr: &Tensor,
    h: AdamwHyper,
) -> Result<()> {
    let n = params.len();
    if grads.len() != n || exp_avgs.len() != n || exp_avg_sqs.len() != n {
        return Err(NativeError::InvalidArgument(format!(
            "fused_adamw: {n} parameters but {} gradients, {} and {} moments",
            grads.len(),
            exp_avgs.len(),
            exp_avg_sqs.len()
        )));
    }
    let ptrs = |ts: &[Tensor]| -> Vec<*mut torch_sys::C_tensor> { ts.iter().map(|t| t.as_ptr() as *mut _).collect() };
    let (mut p, mut g, mut m, mut v) = (ptrs(params), ptrs(grads), ptrs(exp_avgs), ptrs(exp_avg_sqs));
    let [beta1, beta2] = h.betas;
    // SAFETY: every pointer is a live `at::Tensor*` for the call (borrowed from the slices); the C++
    // side copies the handles and updates the tensors' data in place.
    check(unsafe {
        ffi::plexus_fused_adamw(
            p.as_mut_ptr(),
            g.as_mut_ptr(),
            m.as_mut_ptr(),
            v.as_mut_ptr(),
            n as i64,
            step.as_ptr() as *mut _,
            lr.as_ptr() as *mut _,
            beta1,
            beta2,
            h.weight_decay,
            h.eps,
        )
    })
}
