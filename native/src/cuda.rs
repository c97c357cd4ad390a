//! CUDA facts the tch crate lacks (versions, device properties, allocator statistics), the
//! float32 matmul precision switch, and the NVRTC compile of the kernels (CUDA graphs: `cuda_graph`).

use super::{check, device_index, ffi, take_string, NativeError, Result};
use std::ffi::{c_char, c_int, CString};

/// Whether this build of plexus has its CUDA parts (libtorch is a CUDA build). Says nothing about
/// whether a driver or a GPU is present: see [`cuda_driver_version`] and `tch::Cuda`.
pub fn cuda_built() -> bool {
    // SAFETY: no arguments, no side effects.
    unsafe { ffi::plexus_cuda_built() != 0 }
}

/// The CUDA driver's version as `cudaDriverGetVersion` reports it (1000·major + 10·minor, e.g.
/// 13000); an error where no driver is installed or plexus was built without CUDA.
pub fn cuda_driver_version() -> Result<i32> {
    let mut v: c_int = 0;
    // SAFETY: `v` outlives the call.
    check(unsafe { ffi::plexus_cuda_driver_version(&mut v) })?;
    Ok(v)
}

/// The version of the CUDA runtime libtorch loaded (`cudaRuntimeGetVersion`, same encoding).
pub fn cuda_runtime_version() -> Result<i32> {
    let mut v: c_int = 0;
    // SAFETY: `v` outlives the call.
    check(unsafe { ffi::plexus_cuda_runtime_version(&mut v) })?;
    Ok(v)
}

/// Static properties of one CUDA device (what `torch.cuda.get_device_properties` shows).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaDeviceInfo {
    pub index: usize,
    pub name: String,
    /// Compute capability, e.g. 9.0 for an H100.
    pub major: i32,
    pub minor: i32,
    /// Bytes of device memory.
    pub total_memory: u64,
    pub multiprocessors: i32,
}

/// Properties of CUDA device `index` (as numbered under `CUDA_VISIBLE_DEVICES`); an error when
/// there is no such device, no driver, or no CUDA in this build.
pub fn cuda_device_info(index: usize) -> Result<CudaDeviceInfo> {
    let mut name: *mut c_char = std::ptr::null_mut();
    let (mut major, mut minor, mut mps): (c_int, c_int, c_int) = (0, 0, 0);
    let mut total: u64 = 0;
    // SAFETY: every out-pointer outlives the call; `name` is set only on success.
    let err = unsafe {
        ffi::plexus_cuda_device_info(device_index(index)?, &mut name, &mut major, &mut minor, &mut total, &mut mps)
    };
    check(err)?;
    Ok(CudaDeviceInfo { index, name: take_string(name), major, minor, total_memory: total, multiprocessors: mps })
}

/// The CUDA caching allocator's byte counts for one device (aggregate over its pools), as
/// `torch.cuda.memory_stats` reports `allocated_bytes.all.*` and `reserved_bytes.all.*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CudaMemoryStats {
    /// Bytes in live tensors now.
    pub allocated: u64,
    /// Bytes the allocator holds from the driver now (allocated + cached).
    pub reserved: u64,
    /// Highest `allocated` since start or the last [`cuda_reset_peak_memory`].
    pub peak_allocated: u64,
    pub peak_reserved: u64,
}

/// Memory statistics of CUDA device `index`; an error without such a device.
pub fn cuda_memory_stats(index: usize) -> Result<CudaMemoryStats> {
    let mut out = [0u64; 4];
    // SAFETY: `out` has the 4 slots the C++ side writes.
    check(unsafe { ffi::plexus_cuda_memory_stats(device_index(index)?, out.as_mut_ptr()) })?;
    Ok(CudaMemoryStats { allocated: out[0], reserved: out[1], peak_allocated: out[2], peak_reserved: out[3] })
}

/// Resets the peaks of [`cuda_memory_stats`] to the current values (per-phase measurements).
pub fn cuda_reset_peak_memory(index: usize) -> Result<()> {
    // SAFETY: plain value argument.
    check(unsafe { ffi::plexus_cuda_reset_peak_memory(device_index(index)?) })
}

/// Sets libtorch's float32 matmul precision, process-wide, as `torch.set_float32_matmul_precision`:
/// `"highest"` (full fp32), `"high"` (TF32 tensor cores allowed on Ampere and later), `"medium"`
/// (bf16-based). Anything else is an error.
pub fn set_float32_matmul_precision(p: &str) -> Result<()> {
    if !matches!(p, "highest" | "high" | "medium") {
        return Err(NativeError::InvalidArgument(format!(
            "float32 matmul precision must be \"highest\", \"high\" or \"medium\", got {p:?}"
        )));
    }
    let c = CString::new(p).expect("one of three names, without NUL");
    // SAFETY: `c` is a NUL-terminated string that outlives the call.
    check(unsafe { ffi::plexus_set_float32_matmul_precision(c.as_ptr()) })
}

/// The current float32 matmul precision: `"highest"`, `"high"` or `"medium"`.
pub fn float32_matmul_precision() -> String {
    let mut out: *mut c_char = std::ptr::null_mut();
    // SAFETY: `out` outlives the call and receives a malloc'd string on success.
    match check(unsafe { ffi::plexus_float32_matmul_precision(&mut out) }) {
        Ok(()) => take_string(out),
        // Reading an enum from the global context cannot fail; keep the signature infallible.
        Err(e) => format!("unknown ({e})"),
    }
}
