//! libtorch APIs that tch does not bind (CUDA device properties, the float32 matmul precision).
//!
//! Interim version: the C++ layer that reaches these APIs is not in this commit yet, so every
//! query reports that it is unavailable and `tf32: true` is refused rather than silently ignored.
use anyhow::{bail, Result};

pub struct CudaDeviceInfo {
    pub index: usize,
    pub name: String,
    pub major: i32,
    pub minor: i32,
    pub total_memory: u64,
    pub multiprocessors: i32,
}

const MISSING: &str = "plexus was built without its native layer";

pub fn cuda_built() -> bool {
    false
}
pub fn cuda_driver_version() -> Result<i32> {
    bail!("{MISSING}")
}
pub fn cuda_runtime_version() -> Result<i32> {
    bail!("{MISSING}")
}
pub fn cuda_device_info(index: usize) -> Result<CudaDeviceInfo> {
    bail!("cuda:{index}: {MISSING}")
}
/// `highest` is libtorch's default and needs no call; anything else needs the native layer.
pub fn set_float32_matmul_precision(p: &str) -> Result<()> {
    if p != "highest" {
        bail!("float32 matmul precision `{p}` (`tf32: true`): {MISSING}");
    }
    Ok(())
}
