//! The arithmetic of what plexus-native ships, from outside the crate (its public API only): the
//! fused CPU kernels and the CUDA kernels' host builds (their per-token functions run on the CPU)
//! against the composite computation they replace — libtorch operators in fp64, or the crate's own
//! composite code ([`plexus_native::composite`]) — values and gradients. The tests that need
//! plexus (a topology, a model) or PyTorch's references stay in the plexus crate.

mod norm_project;
mod sinkhorn;
mod streams;

use tch::{Kind, Tensor};

/// The largest absolute difference of two tensors, in fp64.
fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double)).abs().max().double_value(&[])
}

/// A tensor's values in order, as f32 (a host read).
fn values(t: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(t.to_kind(Kind::Float).flatten(0, -1)).expect("a CPU tensor")
}

/// Whether every value of `t` is finite.
fn all_finite(t: &Tensor) -> bool {
    values(t).iter().all(|v| v.is_finite())
}
