//! `plexus doctor`: what libtorch this binary runs on and what it can use.

use crate::device::{loaded_torch_lib_dir, torch_version};
use tch::{Device, Kind, Tensor};

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

/// Prints the report; returns false if something required is missing or the CUDA set-up is
/// broken (an NVIDIA GPU on the machine that libtorch cannot use, or a GPU failing bf16 matmuls).
pub fn run() -> bool {
    let version = torch_version();
    let lib = loaded_torch_lib_dir().map(|p| p.display().to_string()).unwrap_or_else(|| "?".into());
    let machine = crate::device::Machine::current();
    let n = machine.cuda_devices;
    let mut ok = machine.cuda_linked && version != "unknown";
    println!("plexus {}", env!("CARGO_PKG_VERSION"));
    println!("torch             {version} (built against {})", env!("PLEXUS_TORCH_BUILD_VERSION"));
    println!("libtorch          {lib}");
    println!(
        "libtorch_cuda.so  {}",
        if machine.cuda_linked { "loaded" } else { "NOT loaded (CUDA unavailable even on a GPU machine)" }
    );
    let version_text = |v: Result<i32, crate::native::NativeError>| match v {
        Ok(v) => format!("{}.{}", v / 1000, (v % 1000) / 10),
        Err(e) => format!("none ({e:#})"),
    };
    println!("NVIDIA GPU node   {}", if machine.nvidia_node { "/dev/nvidia0 present" } else { "none" });
    println!("CUDA driver       {}", version_text(crate::native::cuda::cuda_driver_version()));
    println!("CUDA runtime      {}", version_text(crate::native::cuda::cuda_runtime_version()));
    println!("CUDA devices      {n}");
    println!(
        "data parallel     Gloo {}, NCCL {}",
        if crate::native::process_group::gloo_built() { "built" } else { "NOT built" },
        if crate::native::process_group::nccl_built() {
            "built"
        } else {
            "NOT built (re-run scripts/setup.sh; GPU runs need it)"
        }
    );
    println!("cuDNN available   {}", tch::Cuda::cudnn_is_available());
    // NVRTC compiles mHC's CUDA Sinkhorn at run time; `doctor --selftest --device cuda` checks it.
    match crate::native::kernels::nvrtc_version() {
        Ok((v, path)) => println!("NVRTC             {} ({path})", version_text(Ok(v))),
        Err(e) => println!("NVRTC             none ({e:#}): on a GPU, mHC's Sinkhorn runs as composite libtorch ops"),
    }
    println!(
        "CPU threads       {} (plexus' fused kernels: {}, row loops {})",
        tch::get_num_threads(),
        crate::native::kernels::parallel_for_threads(64),
        crate::native::setting::kernel_isa().name()
    );
    println!("malloc            {}", crate::malloc::keep_freed_memory().describe());
    println!("MKL / OpenMP      {} / {}", tch::utils::has_mkl(), tch::utils::has_openmp());
    let cpu_bf16 = bf16_works(Device::Cpu);
    println!("bf16 on CPU       {}", cpu_bf16.as_ref().map(|_| "ok".to_string()).unwrap_or_else(|e| e.clone()));
    for i in 0..n {
        println!("cuda:{i}            {}", crate::device::describe(Device::Cuda(i)));
        let r = bf16_works(Device::Cuda(i));
        ok &= r.is_ok();
        println!("bf16 on cuda:{i}     {}", r.map(|_| "ok".to_string()).unwrap_or_else(|e| e));
    }
    if let Err(e) = crate::device::resolve_on(crate::device::DeviceRequest::Auto, machine) {
        println!("BROKEN            {e:#}");
        ok = false;
    } else if n == 0 {
        println!("device: auto      cpu (no NVIDIA GPU on this machine)");
    }
    ok
}

/// The largest deviation of mHC's Sinkhorn kernel on `device` (CUDA: [`crate::native::kernels::sinkhorn_cuda`],
/// called directly so that a failure is an error here rather than the composite fallback; CPU: the
/// fused [`crate::native::kernels::sinkhorn_fused`]) from the log-domain graph in fp64 on the CPU: values, and gradients
/// relative to their largest magnitude, for n = 4 (mHC's default) and 3 over 257 tokens (a block
/// of 128 threads twice, and one more), 20 iterations; and on saturated logits (a column that
/// underflows), against the composite graph on the same device. The inputs depend on no generator.
/// `plexus doctor --selftest` runs it on the device it tests. (Here, not in the topology: it
/// reads results back to the CPU.)
pub fn sinkhorn_error_on(device: tch::Device) -> anyhow::Result<f64> {
    let mut worst = 0.0f64;
    for n in [4i64, 3] {
        let i = Tensor::arange(257 * n * n, (Kind::Double, tch::Device::Cpu)).reshape([257, n, n]);
        let logits = (&i * 0.37).sin() * 3.0;
        let g = (&i * 1.3).cos();
        let reference = |l: &Tensor| {
            let mut l = l.shallow_clone();
            for _ in 0..20 {
                l = l.log_softmax(-1, Kind::Double).log_softmax(-2, Kind::Double);
            }
            l.exp()
        };
        let run = |f: &dyn Fn(&Tensor) -> Result<Tensor, crate::native::NativeError>,
                   l: Tensor|
         -> anyhow::Result<(Tensor, Tensor)> {
            let l = l.set_requires_grad(true);
            let p = f(&l)?;
            (&p * g.to_device(p.device()).to_kind(p.kind())).sum(Kind::Double).backward();
            Ok((p.detach().to_device(tch::Device::Cpu).to_kind(Kind::Double), l.grad().to_kind(Kind::Double)))
        };
        let l32 = logits.to_kind(Kind::Float);
        let (p_ref, g_ref) = run(&|l| Ok(reference(l)), l32.to_kind(Kind::Double))?;
        let (p, gl) = if device.is_cuda() {
            run(&|l| crate::native::kernels::sinkhorn_cuda(l, 20), l32.to_device(device))?
        } else {
            run(&|l| crate::native::kernels::sinkhorn_fused(l, 20), l32)?
        };
        let gl = gl.to_device(tch::Device::Cpu);
        let dp = (&p - &p_ref).abs().max().double_value(&[]);
        let dg = (&gl - &g_ref).abs().max().double_value(&[]) / g_ref.abs().max().double_value(&[]).max(1.0);
        worst = worst.max(dp).max(dg);
        anyhow::ensure!(worst.is_finite(), "n = {n}: a non-finite value or gradient");
    }
    // Saturated logits (a column ~200 below the rest underflows to 0): the kernel against the
    // composite graph on the same device, which must leave that column at 0 as the kernel does.
    let i = Tensor::arange(3 * 16, (Kind::Double, tch::Device::Cpu)).reshape([3, 4, 4]);
    let col = Tensor::arange(4, (Kind::Double, tch::Device::Cpu)).eq(3).to_kind(Kind::Double);
    let saturated = ((&i * 0.37).sin() * 3.0 - col * 200.0).to_kind(Kind::Float).to_device(device);
    let g = (&i * 1.3).cos();
    let run = |f: &dyn Fn(&Tensor) -> Result<Tensor, crate::native::NativeError>| -> anyhow::Result<(Tensor, Tensor)> {
        let l = saturated.detach().set_requires_grad(true);
        let p = f(&l)?;
        (&p * g.to_device(device).to_kind(p.kind())).sum(Kind::Double).backward();
        Ok((
            p.detach().to_device(tch::Device::Cpu).to_kind(Kind::Double),
            l.grad().to_device(tch::Device::Cpu).to_kind(Kind::Double),
        ))
    };
    let (p_c, g_c) = run(&|l| Ok(crate::native::composite::sinkhorn_composite(l, 20)))?;
    let (p_k, g_k) = if device.is_cuda() {
        run(&|l| crate::native::kernels::sinkhorn_cuda(l, 20))?
    } else {
        run(&|l| crate::native::kernels::sinkhorn_fused(l, 20))?
    };
    let dp = (&p_k - &p_c).abs().max().double_value(&[]);
    let dg = (&g_k - &g_c).abs().max().double_value(&[]) / g_c.abs().max().double_value(&[]).max(1.0);
    worst = worst.max(dp).max(dg);
    anyhow::ensure!(worst.is_finite(), "saturated logits: a non-finite value or gradient");
    Ok(worst)
}

/// The tiny config (model and data sections) of a backbone: its registry entry's.
pub fn tiny_backbone(name: &str) -> Option<&'static str> {
    crate::model::REGISTRY.iter().find(|e| e.name == name).map(|e| e.tiny)
}

/// bf16 against fp32: the initial losses (same weights, same batch) may differ by this fraction.
pub const BF16_TOLERANCE: f64 = 0.02;

/// `plexus doctor --selftest`: on `device`, AdamW against its update rule, then every topology on
/// every backbone at tiny size, for 6 steps with connectivity, parameter views, evaluation and
/// checkpoints; then a crash after 3 updates and `--resume` (must match the uninterrupted run:
/// exactly on the CPU, to 1e-4 relative on a GPU, whose kernels need not be deterministic),
/// `analyze`, and bf16 against fp32. Prints a table; returns whether every case passed.
pub fn selftest(device: &str) -> anyhow::Result<bool> {
    let tmp = tempfile::tempdir()?;
    let dev = crate::device::from_flag("--device", device)?;
    println!("self-test on {}", crate::device::describe(dev));
    println!(
        "{:<8} {:<12} {:>11} {:>11} {:>11} {:>8}  result",
        "backbone", "topology", "fp32 loss", "bf16 loss", "eval", "time"
    );
    let clock = std::time::Instant::now();
    let (mut passed, mut failed) = (0, 0);
    // The optimizer first: every case below trains with it, and on a GPU it is libtorch's fused
    // CUDA kernel, which no CPU test runs.
    let adamw = crate::train::optim::adamw_error_on(dev);
    let adamw_ok = adamw < 1e-6;
    println!(
        "AdamW on {dev:?} against the f64 update rule: largest deviation {adamw:.1e} (tolerance 1e-6)  {}",
        if adamw_ok { "ok" } else { "FAILED" }
    );
    if adamw_ok {
        passed += 1;
    } else {
        failed += 1;
    }
    // mHC's Sinkhorn: on a GPU the NVRTC-compiled CUDA kernel, which no CPU test launches; its
    // first use also checks the stream read and write kernels (a failure here means
    // Hyper-Connections and mHC run their slower composite graphs, with a warning).
    let kernel = if dev.is_cuda() {
        "CUDA kernel (NVRTC; with the stream read/write kernels' check)"
    } else {
        "fused CPU kernel"
    };
    match sinkhorn_error_on(dev) {
        Ok(err) if err < 1e-4 => {
            passed += 1;
            println!("mHC Sinkhorn, {kernel}, against the f64 log-domain graph (saturated logits: against the composite): largest deviation {err:.1e} (tolerance 1e-4)  ok");
        }
        r => {
            failed += 1;
            let why =
                r.map(|e| format!("largest deviation {e:.1e} (tolerance 1e-4)")).unwrap_or_else(|e| format!("{e:#}"));
            println!("mHC Sinkhorn, {kernel}, against the f64 log-domain graph (saturated logits: against the composite): {why}  FAILED");
        }
    }
    // Every topology with its defaults, then compositions of two parts (`compose` alone defaults
    // to residual over one stream).
    let topologies: Vec<(String, String)> = crate::topology::REGISTRY
        .iter()
        .map(|t| (t.name.to_string(), format!("{{kind: {}}}", t.name)))
        .chain(crate::topology::compose::EXAMPLES.iter().map(|(label, yaml)| (label.to_string(), yaml.to_string())))
        .collect();
    for m in crate::model::REGISTRY {
        for (name, topology) in &topologies {
            let start = std::time::Instant::now();
            let r = selftest_case(m.name, name, topology, device, tmp.path());
            let secs = start.elapsed().as_secs_f64();
            match r {
                Ok((l32, l16, eval)) => {
                    passed += 1;
                    println!("{:<8} {:<12} {l32:>11.4} {l16:>11.4} {eval:>11.4} {secs:>7.2}s  ok", m.name, name);
                }
                Err(e) => {
                    failed += 1;
                    println!("{:<8} {:<12} {:>11} {:>11} {:>11} {secs:>7.2}s  FAILED: {e:#}", m.name, name, "", "", "");
                }
            }
        }
    }
    println!("{passed} passed, {failed} failed ({:.0} s)", clock.elapsed().as_secs_f64());
    Ok(failed == 0)
}

/// One self-test case, `topology` a flow mapping named `name`: `(fp32 final loss, bf16 final
/// loss, eval loss)`.
fn selftest_case(
    backbone: &str,
    name: &str,
    topology: &str,
    device: &str,
    root: &std::path::Path,
) -> anyhow::Result<(f64, f64, f64)> {
    use crate::train::{train, TrainOptions};
    use anyhow::{ensure, Context};
    let tiny = tiny_backbone(backbone).with_context(|| format!("no tiny config for backbone `{backbone}`"))?;
    let yaml = |precision: &str| {
        format!(
            "name: selftest-{backbone}-{name}\ndevice: {device}\nprecision: {precision}\n{tiny}topology: {topology}\n\
             train: {{optimizer: adamw, lr: 0.01, steps: 6, clip_grad_norm: 1.0}}\n\
             log: {{every: 1, eval_every: 3, connectivity_every: 3, checkpoint_every: 3}}\n"
        )
    };
    let exp32 = crate::experiment::Experiment::from_str(&yaml("fp32"), "selftest.yaml", &[])?;
    let dir = |part: &str| crate::run_dir::RunDir::create(&root.join(format!("{backbone}-{name}-{part}")));
    let full_dir = dir("full")?;
    let full = train(&exp32, &full_dir, &TrainOptions::default())?;
    ensure!(full.final_loss.is_finite(), "fp32 final loss {}", full.final_loss);
    for sub in ["connectivity/step_0.csv", "connectivity/step_6.csv", "checkpoints/final.safetensors"] {
        ensure!(full_dir.path.join(sub).exists(), "{sub} missing");
    }
    let crashed = dir("resumed")?;
    let crash = TrainOptions { crash_after: Some(4), ..Default::default() };
    // The crash must be the simulated one: any other error here (a failed CUDA graph capture,
    // say) would otherwise pass for it, and surface only in the next run.
    match train(&exp32, &crashed, &crash) {
        Ok(_) => anyhow::bail!("the simulated crash did not happen"),
        Err(e) if format!("{e:#}").contains("simulated crash") => {}
        Err(e) => return Err(e.context("the run to be crashed failed before its simulated crash")),
    }
    let resumed = train(&exp32, &crashed, &TrainOptions { resume: true, ..Default::default() })?;
    let tol = if full.device == "Cpu" { 0.0 } else { 1e-4 };
    ensure!(
        (resumed.final_loss - full.final_loss).abs() <= tol * full.final_loss.abs(),
        "resumed final loss {} vs uninterrupted {}",
        resumed.final_loss,
        full.final_loss
    );
    // `plexus analyze` measures classifiers and language models; a diffusion run reports its own
    // last validation ε-MSE.
    let eval = if exp32.model.diffusion().is_some() {
        full.eval.as_ref().map_or(f64::NAN, |e| e.loss)
    } else {
        let analysis = crate::analysis::analyze(
            &full_dir.path,
            &crate::analysis::AnalyzeOptions {
                repeats: 1,
                sigmas: vec![0.0, 0.5],
                char_probs: vec![0.0, 0.1],
                ..Default::default()
            },
        )?;
        analysis.final_eval.map_or(f64::NAN, |e| e.loss)
    };
    let exp16 = crate::experiment::Experiment::from_str(&yaml("bf16"), "selftest.yaml", &[])?;
    let b16 = train(&exp16, &dir("bf16")?, &TrainOptions::default())?;
    ensure!(
        (b16.initial_loss - full.initial_loss).abs() <= BF16_TOLERANCE * full.initial_loss.abs(),
        "bf16 initial loss {} vs fp32 {} (tolerance {}%)",
        b16.initial_loss,
        full.initial_loss,
        100.0 * BF16_TOLERANCE
    );
    ensure!(b16.final_loss.is_finite(), "bf16 final loss {}", b16.final_loss);
    Ok((full.final_loss, b16.final_loss, eval))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The self-test's measure, on the CPU (the fused kernel): it must see fp32 rounding only.
    #[test]
    fn the_sinkhorn_self_test_measures_the_cpu_kernel() {
        let err = sinkhorn_error_on(tch::Device::Cpu).unwrap();
        assert!(err > 0.0 && err < 1e-5, "{err:e}");
    }
}
