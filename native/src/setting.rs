//! What `PLEXUS_FUSED_KERNELS` and the tests set: the fused kernels on or off, a CPU step on the
//! GPU's paths (`cuda-host`), and the CPU instruction set of the fused kernels' row loops. The
//! bindings read the instruction set; the choice between paths (choice.rs) reads the rest.

use super::ffi;
use super::{NativeError, Result};

/// The environment variable that sets the fused CPU kernels: `1`/`true` or unset: on, with the
/// widest instruction set the CPU has ([`KernelIsa::best`]); `avx2`: on, with the AVX2 loops even
/// where AVX-512 exists; `baseline`: on, with the baseline x86-64 loops (what a CPU without AVX2
/// runs; to compare, or to rule the wider loops out);
/// `0`/`false`: off, the composite libtorch code everywhere, as a GPU runs (an escape hatch, and
/// what makes `bench --compare`'s kernels per step stand for a GPU on hyper and mHC);
/// `cuda-host`: on, and a CPU step also takes the fused paths a GPU step takes — the
/// language-model loss, the pre-norms written in bf16, RoPE into heads, SwiGLU, Hyper-Connections'
/// dynamic logits, mHC's RMS projection, H-ACN's update, AttnRes' depth attention — through the
/// CUDA kernels' host build
/// ([`gpu_paths_on_cpu`]; slow: for parity of those paths on a CPU and for counting the kernels
/// and bytes of a GPU step).
pub const FUSED_KERNELS_VAR: &str = "PLEXUS_FUSED_KERNELS";

/// A value of [`FUSED_KERNELS_VAR`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FusedKernels {
    /// The composite libtorch code.
    Off,
    /// The fused kernels with the baseline loops.
    Baseline,
    /// The fused kernels with the AVX2 loops at most (baseline on a CPU without AVX2).
    Avx2,
    /// The fused kernels with the widest loops the CPU has (the default).
    Best,
    /// [`Best`](FusedKernels::Best), and the GPU step's fused paths taken on the CPU through the
    /// CUDA kernels' host build.
    CudaHost,
}

/// The instruction set of the fused kernels' row loops (`native/src/stream_rows.inc`, built once
/// per set): libtorch dispatches its own CPU kernels by the CPU's vector width, and so do these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum KernelIsa {
    /// Baseline x86-64 (SSE2), or whatever the target's default is elsewhere.
    Baseline,
    /// AVX2 with fused multiply-add (x86-64 CPUs since 2013, in a GCC build).
    Avx2Fma,
    /// AVX-512 F/VL/BW/DQ: 16 floats per instruction, 32 registers (server x86-64 CPUs; in a GCC build).
    Avx512,
}

impl KernelIsa {
    /// Every set, narrowest first.
    pub(super) const ALL: [KernelIsa; 3] = [KernelIsa::Baseline, KernelIsa::Avx2Fma, KernelIsa::Avx512];

    /// The widest set this build and this CPU have, and no wider than libtorch's own CPU kernels
    /// use (`torch.backends.cpu.get_cpu_capability()`, which `ATEN_CPU_CAPABILITY` lowers): where
    /// libtorch keeps off AVX-512, so do these.
    pub fn best() -> KernelIsa {
        // SAFETY: a pure query of the CPU and of libtorch (cached on the C++ side).
        let code = unsafe { ffi::plexus_stream_kernels_best_isa() };
        KernelIsa::ALL.into_iter().find(|i| i.code() == code).unwrap_or(KernelIsa::Baseline)
    }

    /// Whether this build and this CPU run the set (whatever libtorch uses).
    pub fn runs_here(self) -> bool {
        // SAFETY: a pure query of the CPU.
        unsafe { ffi::plexus_stream_kernels_cpu_runs(self.code()) != 0 }
    }

    /// The `isa` argument of the C++ entry points.
    pub(crate) fn code(self) -> i64 {
        match self {
            KernelIsa::Baseline => 0,
            KernelIsa::Avx2Fma => 1,
            KernelIsa::Avx512 => 2,
        }
    }

    /// How reports name it.
    pub fn name(self) -> &'static str {
        match self {
            KernelIsa::Baseline => "baseline",
            KernelIsa::Avx2Fma => "avx2+fma",
            KernelIsa::Avx512 => "avx512",
        }
    }
}

impl FusedKernels {
    /// The value of [`FUSED_KERNELS_VAR`] that selects it (`1` for the default).
    pub fn name(self) -> &'static str {
        match self {
            FusedKernels::Off => "0",
            FusedKernels::Baseline => "baseline",
            FusedKernels::Avx2 => "avx2",
            FusedKernels::Best => "1",
            FusedKernels::CudaHost => "cuda-host",
        }
    }
}

/// The process's [`FUSED_KERNELS_VAR`] setting (not a thread's override of it).
pub fn fused_kernels_setting() -> FusedKernels {
    fused_kernels_env()
}

/// Parses a value of [`FUSED_KERNELS_VAR`] (`None`: unset).
pub fn parse_fused_kernels(value: Option<&str>) -> Result<FusedKernels> {
    match value.map(|v| v.trim().to_ascii_lowercase()) {
        None => Ok(FusedKernels::Best),
        Some(v) if v.is_empty() => Err(NativeError::InvalidSetting(format!(
            "environment variable {FUSED_KERNELS_VAR} is set to {}: give a value (1, avx2, baseline, 0 or \
             cuda-host) or unset it for the default",
            if value.is_some_and(str::is_empty) {
                "nothing".to_string()
            } else {
                format!("only blanks ({:?})", value.unwrap_or_default())
            }
        ))),
        Some(v) if v == "1" || v == "true" => Ok(FusedKernels::Best),
        Some(v) if v == "baseline" => Ok(FusedKernels::Baseline),
        Some(v) if v == "avx2" => Ok(FusedKernels::Avx2),
        Some(v) if v == "0" || v == "false" => Ok(FusedKernels::Off),
        Some(v) if v == "cuda-host" => Ok(FusedKernels::CudaHost),
        Some(v) => Err(NativeError::InvalidSetting(format!(
            "environment variable {FUSED_KERNELS_VAR}=`{}`: expected 1/true (the default), avx2 (on, at most \
             AVX2), baseline (on, without AVX2), 0/false (off) or cuda-host (on, and a CPU step takes a GPU \
             step's fused paths through the CUDA kernels' host build)",
            v.chars().take(40).collect::<String>()
        ))),
    }
}

/// [`FUSED_KERNELS_VAR`]'s setting, read once; an unreadable value counts as the default (the CLI
/// checks the value at start: [`check_fused_kernels_setting`]).
fn fused_kernels_env() -> FusedKernels {
    static SETTING: std::sync::OnceLock<FusedKernels> = std::sync::OnceLock::new();
    *SETTING.get_or_init(|| {
        parse_fused_kernels(std::env::var(FUSED_KERNELS_VAR).ok().as_deref()).unwrap_or(FusedKernels::Best)
    })
}

thread_local! {
    /// [`with_fused_kernels`]'s setting for this thread, over the environment's.
    static FUSED_OVERRIDE: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
    /// [`with_gpu_paths_on_cpu`]'s setting for this thread, over the environment's.
    static GPU_PATHS_OVERRIDE: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
    /// [`with_kernel_isa`]'s setting for this thread, over the environment's.
    static ISA_OVERRIDE: std::cell::Cell<Option<KernelIsa>> = const { std::cell::Cell::new(None) };
    /// [`with_stream_grads_gathered`]'s setting for this thread (on by default).
    static STREAM_GRADS_OVERRIDE: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with a thread-local cell set to `value`, restoring it afterwards (also on panic).
fn with_override<V: Copy + 'static, T>(
    cell: &'static std::thread::LocalKey<std::cell::Cell<Option<V>>>,
    value: V,
    f: impl FnOnce() -> T,
) -> T {
    struct Restore<V: Copy + 'static>(&'static std::thread::LocalKey<std::cell::Cell<Option<V>>>, Option<V>);
    impl<V: Copy + 'static> Drop for Restore<V> {
        fn drop(&mut self) {
            self.0.with(|c| c.set(self.1));
        }
    }
    let _restore = Restore(cell, cell.with(|c| c.replace(Some(value))));
    f()
}

/// Whether the fused CPU kernels are on for this thread: [`with_fused_kernels`]'s setting if inside
/// one, else [`FUSED_KERNELS_VAR`]'s.
pub fn fused_kernels_on() -> bool {
    FUSED_OVERRIDE.with(|o| o.get()).unwrap_or_else(|| fused_kernels_env() != FusedKernels::Off)
}

/// Runs `f` with the fused CPU kernels on or off on this thread (where a CPU forward and its
/// backward run), e.g. to count the kernels of the composite code a GPU runs.
pub fn with_fused_kernels<T>(on: bool, f: impl FnOnce() -> T) -> T {
    with_override(&FUSED_OVERRIDE, on, f)
}

/// Whether a CPU step on this thread takes the fused paths a GPU step takes (the language-model
/// loss, the pre-norms written in bf16, RoPE into heads, SwiGLU, Hyper-Connections' dynamic
/// logits, mHC's RMS projection, H-ACN's update, AttnRes' depth attention), their arithmetic run
/// by the CUDA kernels' host
/// build (`native/src/cuda_kernels.cpp`, "The GPU paths on the CPU"): [`with_gpu_paths_on_cpu`]'s
/// setting if inside one, else `PLEXUS_FUSED_KERNELS=cuda-host`. The multi-stream read, write and
/// Sinkhorn keep their CPU kernels (whose arithmetic the tests hold to the CUDA kernels' host
/// build); the CPU-only ones a GPU lacks (HC's `hyper_pre`) are left out.
pub fn gpu_paths_on_cpu() -> bool {
    GPU_PATHS_OVERRIDE.with(|o| o.get()).unwrap_or_else(|| fused_kernels_env() == FusedKernels::CudaHost)
}

/// Runs `f` with [`gpu_paths_on_cpu`] set to `on` on this thread (where a CPU forward and its
/// backward run).
pub fn with_gpu_paths_on_cpu<T>(on: bool, f: impl FnOnce() -> T) -> T {
    with_override(&GPU_PATHS_OVERRIDE, on, f)
}

/// The instruction set the fused kernels use on this thread: [`with_kernel_isa`]'s if inside one,
/// else [`KernelIsa::Baseline`] under `PLEXUS_FUSED_KERNELS=baseline`, at most
/// [`KernelIsa::Avx2Fma`] under `avx2`, and [`KernelIsa::best`] otherwise.
pub fn kernel_isa() -> KernelIsa {
    ISA_OVERRIDE.with(|o| o.get()).unwrap_or_else(|| match fused_kernels_env() {
        FusedKernels::Baseline => KernelIsa::Baseline,
        FusedKernels::Avx2 => KernelIsa::best().min(KernelIsa::Avx2Fma),
        _ => KernelIsa::best(),
    })
}

/// Every instruction set this build and CPU can run the fused kernels' row loops with, narrowest
/// first (the tests run each: they are separate copies of the loops).
pub fn kernel_isas() -> Vec<KernelIsa> {
    KernelIsa::ALL.into_iter().filter(|i| i.runs_here()).collect()
}

/// Runs `f` with the fused kernels' row loops of `isa` on this thread — the tests run every set the
/// machine has. A set the CPU lacks makes the kernels fail with an error naming it.
pub fn with_kernel_isa<T>(isa: KernelIsa, f: impl FnOnce() -> T) -> T {
    with_override(&ISA_OVERRIDE, isa, f)
}

/// Whether the multi-stream topologies gather each state's gradient in one tensor where the fused
/// kernels run (`native/src/stream_grad.h`): yes, unless inside [`with_stream_grads_gathered`]
/// with `false`.
pub fn stream_grads_gathered() -> bool {
    STREAM_GRADS_OVERRIDE.with(|o| o.get()).unwrap_or(true)
}

/// Runs `f` with the streams' gradients gathered in one tensor or not, on this thread (where the
/// forward runs): the tests hold the two to the same gradients, the benchmarks compare their bytes.
pub fn with_stream_grads_gathered<T>(on: bool, f: impl FnOnce() -> T) -> T {
    with_override(&STREAM_GRADS_OVERRIDE, on, f)
}

/// Fails with a clear message when [`FUSED_KERNELS_VAR`] holds a value other than
/// 0/1/true/false/avx2/baseline.
pub fn check_fused_kernels_setting() -> Result<()> {
    parse_fused_kernels(std::env::var(FUSED_KERNELS_VAR).ok().as_deref()).map(|_| ())
}
