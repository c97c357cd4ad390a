//! The one choke point for device → host reads.
//!
//! On a GPU every read of a tensor's value (`double_value`, `Vec::try_from`, `.to_device(Cpu)` of
//! a result) waits for all queued kernels: one read per parameter or per micro-batch turns a
//! training step into a series of stalls. So the training step never reads a value directly: it
//! goes through these functions, which count what they do. `tests/it/device_discipline.rs` asserts
//! that a non-logging step reads nothing and a logging step exactly once, for every topology on
//! every backbone, and that `src/topology`, `src/model` and `src/train` call no reading method of
//! tch outside this module. A CPU run therefore catches a sync that would stall a GPU.
//!
//! The count is per thread (a training run reads on the thread that drives it), so tests that
//! train in parallel in one process do not see each other's reads.

use std::cell::Cell;
use tch::{Device, Kind, Tensor};

thread_local! {
    static READS: Cell<u64> = const { Cell::new(0) };
}

/// Device → host reads made so far on this thread.
pub fn reads() -> u64 {
    READS.with(|r| r.get())
}

fn count() {
    READS.with(|r| r.set(r.get() + 1));
}

/// The value of a one-element tensor (any dtype, any device), as f64. One read.
pub fn scalar(t: &Tensor) -> f64 {
    count();
    t.to_kind(Kind::Double).double_value(&[])
}

/// Whether every element of `t` is finite. One read.
pub fn all_finite(t: &Tensor) -> bool {
    count();
    t.isfinite().all().int64_value(&[]) != 0
}

/// Every element of `t` (any shape, dtype and device) as f64, in row-major order. One read.
pub fn values(t: &Tensor) -> Vec<f64> {
    count();
    let t = t.detach().to_kind(Kind::Double).to_device(Device::Cpu).contiguous().view([-1]);
    Vec::<f64>::try_from(&t).expect("a contiguous f64 CPU tensor converts")
}

/// A copy of `t` on the CPU (for logs and figures: C, parameter views). One read.
pub fn to_cpu(t: &Tensor) -> Tensor {
    count();
    t.detach().to_device(Device::Cpu)
}

/// A 2-D tensor `[r, c]` as an f64 matrix on the host. One read.
pub fn matrix(t: &Tensor) -> ndarray::Array2<f64> {
    let (r, c) = (t.size()[0] as usize, t.size()[1] as usize);
    ndarray::Array2::from_shape_vec((r, c), values(t)).expect("r·c values in row-major order")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_read_is_counted_once() {
        let before = reads();
        let t = Tensor::from_slice(&[1.0f32, 2.0, f32::NAN]);
        assert_eq!(values(&t)[1], 2.0);
        assert!(!all_finite(&t));
        assert_eq!(scalar(&t.get(0)), 1.0);
        let m = Tensor::from_slice(&[1.0f64, 2.0, 3.0, 4.0]).view([2, 2]);
        assert_eq!(matrix(&m), ndarray::array![[1.0, 2.0], [3.0, 4.0]]);
        assert_eq!(reads() - before, 4);
    }
}
