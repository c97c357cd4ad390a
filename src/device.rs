//! Device and precision selection.

use std::path::PathBuf;
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

/// What the machine offers, as far as device resolution cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Machine {
    /// CUDA devices libtorch can use.
    pub cuda_devices: usize,
    /// Whether `libtorch_cuda.so` is mapped into the process (a CUDA build of libtorch).
    pub cuda_linked: bool,
    /// Whether the kernel exposes an NVIDIA GPU (`/dev/nvidia0`).
    pub nvidia_node: bool,
}

impl Machine {
    /// This process on this machine.
    pub fn current() -> Self {
        Self {
            cuda_devices: tch::Cuda::device_count().max(0) as usize,
            cuda_linked: cuda_linked(),
            nvidia_node: std::path::Path::new("/dev/nvidia0").exists(),
        }
    }
}

/// Whether `libtorch_cuda.so` is loaded into this process.
pub fn cuda_linked() -> bool {
    std::fs::read_to_string("/proc/self/maps").map(|m| m.contains("libtorch_cuda.so")).unwrap_or(false)
}

/// Resolves a request against what libtorch sees; asking for a GPU that is not there is an error,
/// not a silent fall-back to the CPU.
/// The device a command-line flag names (`--device cuda:1`), resolved: the one parse of a device
/// string given on the command line; errors name the flag, the value and what is allowed.
pub fn from_flag(flag: &str, value: &str) -> anyhow::Result<Device> {
    resolve(parse_device(value).map_err(|allowed| anyhow::anyhow!("{flag} {value}: expected {allowed}"))?)
}

/// The device `req` asks for on this machine ([`resolve_on`] against [`Machine::current`]).
pub fn resolve(req: DeviceRequest) -> anyhow::Result<Device> {
    resolve_on(req, Machine::current())
}

/// [`resolve`] against a given machine. `auto` is the CPU only where there is no GPU to use: on a
/// machine with an NVIDIA GPU and a CUDA build of libtorch that still sees no device, the CUDA
/// set-up is broken, and training for days on the CPU instead would be the worst outcome.
pub fn resolve_on(req: DeviceRequest, m: Machine) -> anyhow::Result<Device> {
    match req {
        DeviceRequest::Cpu => Ok(Device::Cpu),
        DeviceRequest::Auto if m.cuda_devices > 0 => Ok(Device::Cuda(0)),
        DeviceRequest::Auto if m.cuda_linked && m.nvidia_node => anyhow::bail!(
            "`device: auto` found no usable CUDA device, although this machine has an NVIDIA GPU (/dev/nvidia0) and \
             plexus runs on a CUDA build of libtorch: the driver or the CUDA runtime is broken (`plexus doctor` \
             says which). Set `device: cpu` (or `--set device=cpu`) to train on the CPU anyway."
        ),
        DeviceRequest::Auto => Ok(Device::Cpu),
        DeviceRequest::Cuda(i) => {
            let n = m.cuda_devices;
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

/// One line on a resolved device, printed when a run starts: the GPU's name, compute capability
/// and memory, or the CPU's thread count.
pub fn describe(dev: Device) -> String {
    match dev {
        Device::Cuda(i) => match crate::native::cuda::cuda_device_info(i) {
            Ok(d) => format!(
                "cuda:{i} ({}, compute capability {}.{}, {:.1} GiB)",
                d.name,
                d.major,
                d.minor,
                d.total_memory as f64 / (1u64 << 30) as f64
            ),
            Err(e) => format!("cuda:{i} (properties unavailable: {e:#})"),
        },
        _ => format!("cpu ({} threads)", tch::get_num_threads()),
    }
}

/// The dense tensor-core peak of a GPU by its name (as CUDA reports it), in FLOP/s, for bf16 and
/// fp16 matmuls with fp32 accumulation: the figure from the vendor's data sheet that MFU is
/// conventionally reported against (PaLM's and nanoGPT's MFU; torchtitan's). `None` for another
/// dtype or a GPU not listed here (the benchmark then reports MFU against the measured matmul rate
/// only). Sparse figures are half of nothing here: dense only.
pub fn spec_peak_flops(gpu_name: &str, kind: Kind) -> Option<f64> {
    if !matches!(kind, Kind::BFloat16 | Kind::Half) {
        return None;
    }
    let name = gpu_name.to_ascii_uppercase();
    let has = |s: &str| name.contains(s);
    let tflops = if has("GH200") || has("H200") {
        989.4
    } else if has("H100") || has("H800") {
        if has("PCIE") {
            756.0
        } else if has("NVL") {
            835.0
        } else {
            989.4 // SXM ("H100 80GB HBM3")
        }
    } else if has("B200") {
        2250.0
    } else if has("A100") || has("A800") {
        312.0
    } else if has("L40S") {
        362.0
    } else if has("L4") && !has("L40") {
        121.0
    } else {
        return None;
    };
    Some(tflops * 1e12)
}

/// [`spec_peak_flops`] of the GPU `dev` is (by the name CUDA reports), for matmuls in `kind`;
/// `None` on the CPU or for a GPU not listed.
pub fn spec_peak_of(dev: Device, kind: Kind) -> Option<f64> {
    match dev {
        Device::Cuda(i) => crate::native::cuda::cuda_device_info(i).ok().and_then(|d| spec_peak_flops(&d.name, kind)),
        _ => None,
    }
}

/// Applies the config's `tf32` switch to fp32 matmuls (cuBLAS and cuDNN on Ampere and later):
/// `tf32: true` trades fp32's 23-bit mantissa for TF32's 10 bits in matmul inputs, several times
/// faster on tensor cores. Off by default, so that fp32 runs match their PyTorch references.
pub fn apply_matmul_precision(tf32: bool) -> anyhow::Result<()> {
    Ok(crate::native::cuda::set_float32_matmul_precision(if tf32 { "high" } else { "highest" })?)
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

/// Memory this machine can give a new allocation now (`MemAvailable` of `/proc/meminfo`, bytes);
/// `None` where it cannot be read (not Linux).
pub fn host_memory_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

/// The directory of the `libtorch_cpu.so` actually mapped into this process, if any.
pub fn loaded_torch_lib_dir() -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().last())
        .find(|p| p.ends_with("/libtorch_cpu.so"))
        .and_then(|p| PathBuf::from(p).parent().map(|d| d.to_path_buf()))
}

/// The torch version of the loaded libtorch (from the wheel's `version.py`), else the one we
/// were built against.
pub fn torch_version() -> String {
    loaded_torch_lib_dir()
        .and_then(|d| std::fs::read_to_string(d.join("..").join("version.py")).ok())
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("__version__ = ").map(|v| v.trim_matches(['\'', '"']).to_string()))
        })
        .unwrap_or_else(|| env!("PLEXUS_TORCH_BUILD_VERSION").to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GPU_BOX: Machine = Machine { cuda_devices: 1, cuda_linked: true, nvidia_node: true };
    const BROKEN_GPU_BOX: Machine = Machine { cuda_devices: 0, cuda_linked: true, nvidia_node: true };
    const CPU_BOX: Machine = Machine { cuda_devices: 0, cuda_linked: true, nvidia_node: false };

    /// The names CUDA reports (nvidia-smi's, as seen on this project's GPU machines and in the
    /// vendors' docs), each to its data sheet's dense bf16 figure; fp32 and unknown GPUs have none.
    #[test]
    fn spec_peaks_by_gpu_name() {
        let tf = |name: &str| spec_peak_flops(name, Kind::BFloat16).map(|f| f / 1e12);
        assert_eq!(tf("NVIDIA H100 80GB HBM3"), Some(989.4));
        assert_eq!(tf("NVIDIA H100 PCIe"), Some(756.0));
        assert_eq!(tf("NVIDIA H100 NVL"), Some(835.0));
        assert_eq!(tf("NVIDIA H200"), Some(989.4));
        assert_eq!(tf("NVIDIA A100-SXM4-80GB"), Some(312.0));
        assert_eq!(tf("NVIDIA L4"), Some(121.0));
        assert_eq!(tf("NVIDIA L40S"), Some(362.0));
        assert_eq!(tf("NVIDIA L40"), None);
        assert_eq!(tf("Tesla T4"), None);
        assert_eq!(spec_peak_flops("NVIDIA H100 80GB HBM3", Kind::Half).map(|f| f / 1e12), Some(989.4));
        assert_eq!(spec_peak_flops("NVIDIA H100 80GB HBM3", Kind::Float), None);
    }

    #[test]
    fn auto_is_the_cpu_only_where_there_is_no_gpu() {
        assert_eq!(resolve_on(DeviceRequest::Auto, GPU_BOX).unwrap(), Device::Cuda(0));
        assert_eq!(resolve_on(DeviceRequest::Auto, CPU_BOX).unwrap(), Device::Cpu);
        // An NVIDIA GPU that libtorch cannot use is a broken set-up, not a reason to train on the CPU.
        let e = resolve_on(DeviceRequest::Auto, BROKEN_GPU_BOX).unwrap_err().to_string();
        assert!(e.contains("/dev/nvidia0") && e.contains("device: cpu") && e.contains("plexus doctor"), "{e}");
        // Asking for the CPU explicitly always works.
        assert_eq!(resolve_on(DeviceRequest::Cpu, BROKEN_GPU_BOX).unwrap(), Device::Cpu);
        let e = resolve_on(DeviceRequest::Cuda(1), GPU_BOX).unwrap_err().to_string();
        assert!(e.contains("cuda:1") && e.contains("1 CUDA device"), "{e}");
    }
}
