//! `plexus doctor`: what libtorch this binary runs on and what it can use.

use std::path::PathBuf;
use tch::{Device, Kind, Tensor};

/// The directory of the `libtorch_cpu.so` actually mapped into this process, if any.
fn loaded_torch_lib_dir() -> Option<PathBuf> {
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

fn bf16_works(dev: Device) -> Result<(), String> {
    let r = std::panic::catch_unwind(|| {
        let a = Tensor::ones([8, 8], (Kind::BFloat16, dev));
        a.matmul(&a).to_kind(Kind::Float).sum(Kind::Float).double_value(&[])
    });
    match r {
        Ok(v) if (v - 512.0).abs() < 1e-3 => Ok(()),
        Ok(v) => Err(format!("bf16 matmul gave {v}, expected 512")),
        Err(_) => Err("bf16 matmul failed".into()),
    }
}

/// Prints the report; returns false if something required is missing.
pub fn run() -> bool {
    let version = torch_version();
    let lib = loaded_torch_lib_dir().map(|p| p.display().to_string()).unwrap_or_else(|| "?".into());
    let cuda = tch::Cuda::is_available();
    let n = tch::Cuda::device_count();
    let cuda_linked =
        std::fs::read_to_string("/proc/self/maps").map(|m| m.contains("libtorch_cuda.so")).unwrap_or(false);
    println!("plexus {}", env!("CARGO_PKG_VERSION"));
    println!("torch             {version} (built against {})", env!("PLEXUS_TORCH_BUILD_VERSION"));
    println!("libtorch          {lib}");
    println!(
        "libtorch_cuda.so  {}",
        if cuda_linked { "loaded" } else { "NOT loaded (CUDA unavailable even on a GPU machine)" }
    );
    println!("CUDA available    {cuda}");
    println!("CUDA devices      {n}");
    println!("cuDNN available   {}", tch::Cuda::cudnn_is_available());
    println!("CPU threads       {}", tch::get_num_threads());
    println!("MKL / OpenMP      {} / {}", tch::utils::has_mkl(), tch::utils::has_openmp());
    let cpu_bf16 = bf16_works(Device::Cpu);
    println!("bf16 on CPU       {}", cpu_bf16.as_ref().map(|_| "ok".to_string()).unwrap_or_else(|e| e.clone()));
    for i in 0..n.max(0) as usize {
        let r = bf16_works(Device::Cuda(i));
        println!("bf16 on cuda:{i}     {}", r.map(|_| "ok".to_string()).unwrap_or_else(|e| e));
    }
    cuda_linked && version != "unknown"
}
