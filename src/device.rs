//! Device and precision selection.

use tch::{Device, Kind};

/// Parses `auto | cpu | cuda | cuda:N` without touching the GPU. The error is the allowed set.
pub fn parse_device(s: &str) -> Result<DeviceRequest, String> {
    const ALLOWED: &str = "one of `auto`, `cpu`, `cuda`, `cuda:N` (N a GPU index)";
    match s {
        "auto" => Ok(DeviceRequest::Auto),
        "cpu" => Ok(DeviceRequest::Cpu),
        "cuda" => Ok(DeviceRequest::Cuda(0)),
        _ => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(i)) => Ok(DeviceRequest::Cuda(i)),
            _ => Err(ALLOWED.to_string()),
        },
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceRequest {
    Auto,
    Cpu,
    Cuda(usize),
}

/// Resolves a request against what libtorch sees; asking for a GPU that is not there is an error,
/// not a silent fall-back to the CPU.
pub fn resolve(req: DeviceRequest) -> anyhow::Result<Device> {
    match req {
        DeviceRequest::Cpu => Ok(Device::Cpu),
        DeviceRequest::Auto => Ok(Device::cuda_if_available()),
        DeviceRequest::Cuda(i) => {
            let n = tch::Cuda::device_count() as usize;
            if i < n {
                Ok(Device::Cuda(i))
            } else {
                anyhow::bail!(
                    "device cuda:{i} requested but libtorch sees {n} CUDA device(s); run `plexus doctor`, or use `device: cpu`"
                )
            }
        }
    }
}

/// The dtype that matmuls run in for a precision setting.
pub fn compute_kind(p: crate::config::Precision) -> Kind {
    match p {
        crate::config::Precision::Fp32 => Kind::Float,
        crate::config::Precision::Bf16 => Kind::BFloat16,
    }
}

static SEED_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Seeds libtorch's global generator and holds the seed lock until the guard is dropped.
pub fn seed_guard(seed: u64) -> std::sync::MutexGuard<'static, ()> {
    let guard = SEED_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    tch::manual_seed(seed as i64);
    guard
}

/// Seeds libtorch's global generator and runs `f` while holding a process-wide lock, so that
/// "seed, then draw" is atomic even when several runs share a process (tests, sweeps): the same
/// seed always gives the same tensors.
pub fn with_seed<R>(seed: u64, f: impl FnOnce() -> R) -> R {
    let _guard = SEED_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    tch::manual_seed(seed as i64);
    f()
}
