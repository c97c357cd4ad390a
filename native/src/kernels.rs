//! The fused kernels of the topologies (CPU autograd functions, CUDA kernels compiled with NVRTC),
//! the chunked language-model loss and the dense topologies' history buffer; `PLEXUS_FUSED_KERNELS`
//! and the CPU instruction set they run with.

use super::{check, ffi, take_string};
use anyhow::{bail, Result};
use std::ffi::{c_char, c_int};
use tch::{Kind, Tensor};

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
    fn code(self) -> i64 {
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

/// Parses a value of [`FUSED_KERNELS_VAR`] (`None`: unset).
pub fn parse_fused_kernels(value: Option<&str>) -> Result<FusedKernels> {
    match value.map(|v| v.trim().to_ascii_lowercase()) {
        None => Ok(FusedKernels::Best),
        Some(v) if v == "1" || v == "true" => Ok(FusedKernels::Best),
        Some(v) if v == "baseline" => Ok(FusedKernels::Baseline),
        Some(v) if v == "avx2" => Ok(FusedKernels::Avx2),
        Some(v) if v == "0" || v == "false" => Ok(FusedKernels::Off),
        Some(v) if v == "cuda-host" => Ok(FusedKernels::CudaHost),
        Some(v) => bail!(
            "environment variable {FUSED_KERNELS_VAR}={v:?}: expected 1/true (the default), avx2 (on, at most \
             AVX2), baseline (on, without AVX2), 0/false (off) or cuda-host (on, and a CPU step takes a GPU \
             step's fused paths through the CUDA kernels' host build)"
        ),
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

/// Whether `t`'s device takes the GPU step's fused paths: a CUDA device with the kernels on and not
/// found unavailable, or the CPU under [`gpu_paths_on_cpu`].
pub fn takes_gpu_paths(t: &Tensor) -> bool {
    match t.device() {
        tch::Device::Cpu => gpu_paths_on_cpu(),
        d if d.is_cuda() => fused_kernels_on() && !cuda_kernels_unavailable(),
        _ => false,
    }
}

/// Whether a step on `device` takes the GPU step's fused paths ([`gpu_paths_on_cpu`]'s list): on
/// the CPU under [`gpu_paths_on_cpu`]; on a CUDA device
/// when the kernels are on and run there (a one-element call makes their first use, which compiles
/// and checks them). `plexus parity` asks, so that its reference rounds as those kernels do.
pub fn gpu_paths_taken(device: tch::Device) -> bool {
    match device {
        tch::Device::Cpu => gpu_paths_on_cpu(),
        d if d.is_cuda() => {
            if !fused_kernels_on() || cuda_kernels_unavailable() {
                return false;
            }
            let t = Tensor::zeros([1], (Kind::Float, d));
            cuda_result(swiglu_cuda(&t, &t)).is_some()
        }
        _ => false,
    }
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

/// How many threads the fused kernels' parallel loops (`at::parallel_for` in the native layer) run
/// on, measured with `tasks` tasks: libtorch's intra-op threads ([`tch::get_num_threads`], at most
/// `tasks`) when the native layer is built with OpenMP against libtorch's own runtime (build.rs),
/// 1 when not.
pub fn parallel_for_threads(tasks: usize) -> usize {
    // SAFETY: no pointers; the function only runs a parallel loop.
    unsafe { ffi::plexus_parallel_for_threads(tasks as i64) as usize }
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

/// Fails with a clear message when [`FUSED_KERNELS_VAR`] holds a value other than
/// 0/1/true/false/avx2/baseline.
pub fn check_fused_kernels_setting() -> Result<()> {
    parse_fused_kernels(std::env::var(FUSED_KERNELS_VAR).ok().as_deref()).map(|_| ())
}

/// Whether the fused kernels take tensors of this device and dtype: fp32 or fp64 on the CPU, and
/// [`fused_kernels_on`]. Elsewhere (CUDA, bf16) the topologies use their composite libtorch code.
pub fn fused_streams_take(t: &Tensor) -> bool {
    t.device() == tch::Device::Cpu && matches!(t.kind(), tch::Kind::Float | tch::Kind::Double) && fused_kernels_on()
}

/// A tensor returned through an out-parameter of a fused kernel.
pub(super) fn fused_result(err: *mut c_char, out: *mut torch_sys::C_tensor) -> Result<Tensor> {
    check(err)?;
    // SAFETY: on success `out` is a fresh tensor handle that nothing else owns.
    Ok(unsafe { Tensor::from_ptr(out) })
}

/// The tensors of a native call that writes `N` of them into `out` on success: its error, else
/// the tensors, now owned here.
fn fused_results<const N: usize>(err: *mut c_char, out: [*mut torch_sys::C_tensor; N]) -> Result<[Tensor; N]> {
    check(err)?;
    // SAFETY: on success each handle is a fresh tensor that nothing else owns.
    Ok(out.map(|p| unsafe { Tensor::from_ptr(p) }))
}

/// The read of a multi-stream unit, `u = Σ_s pre[s] H[s]`, as one fused pass forward and one
/// backward (an autograd function): `h` `[.., n, D]`, `pre` `[.., n]` (per token) or `[n]`
/// (static) → `u` `[.., D]`. CPU fp32/fp64 tensors of one dtype ([`fused_streams_take`]), or fp32
/// tensors on one CUDA device with n ≤ [`CUDA_KERNELS_MAX_STREAMS`] (the CUDA kernels; an error if
/// they cannot run there).
pub fn stream_read_fused(h: &Tensor, pre: &Tensor) -> Result<Tensor> {
    let mut out: *mut torch_sys::C_tensor = std::ptr::null_mut();
    // SAFETY: the inputs are live `at::Tensor*` for the call; the C++ side only reads them and
    // writes a new, caller-owned handle to `out` when it returns no error.
    let err =
        unsafe { ffi::plexus_stream_read(h.as_ptr() as *mut _, pre.as_ptr() as *mut _, kernel_isa().code(), &mut out) };
    fused_result(err, out)
}

/// The write of a multi-stream unit, `H'[t] = Σ_s res[s,t] H[s] + post[t] · o`, as one fused
/// pass forward and one backward: `h` `[.., n, D]`, `res` `[.., n, n]` or `[n, n]`, `post`
/// `[.., n]` or `[n]` (per token or static, as `res`), `o` `[.., D]` → `[.., n, D]`. Devices and
/// dtypes as [`stream_read_fused`].
pub fn stream_write_fused(h: &Tensor, res: &Tensor, post: &Tensor, o: &Tensor) -> Result<Tensor> {
    let mut out: *mut torch_sys::C_tensor = std::ptr::null_mut();
    // SAFETY: as in `stream_read_fused`.
    let err = unsafe {
        ffi::plexus_stream_write(
            h.as_ptr() as *mut _,
            res.as_ptr() as *mut _,
            post.as_ptr() as *mut _,
            o.as_ptr() as *mut _,
            kernel_isa().code(),
            &mut out,
        )
    };
    fused_result(err, out)
}

/// Whether [`sinkhorn`] takes `n` streams and `iters` iterations (its per-token scratch,
/// `(2·iters + 1)·n²` values, is bounded).
pub fn sinkhorn_fits(n: usize, iters: usize) -> bool {
    // SAFETY: a pure function of two integers.
    unsafe { ffi::plexus_sinkhorn_fits(n as i64, iters as i64) == 1 }
}

/// Sinkhorn–Knopp of `exp(logits)` (`[.., n, n]`, CPU fp32/fp64): `iters` × (normalise rows,
/// then columns), one fused pass per group of tokens (for n = 2, 4, 8 a vector's width of tokens
/// with the matrices in registers, in the instruction set of [`kernel_isa`]); the backward
/// recomputes the iterates and saves only the logits. Rows and columns of 0 (every entry
/// underflowed) stay 0.
pub fn sinkhorn_fused(logits: &Tensor, iters: usize) -> Result<Tensor> {
    let mut out: *mut torch_sys::C_tensor = std::ptr::null_mut();
    // SAFETY: as in `stream_read_fused`.
    let err = unsafe { ffi::plexus_sinkhorn(logits.as_ptr() as *mut _, iters as i64, kernel_isa().code(), &mut out) };
    fused_result(err, out)
}

/// The largest number of streams the CUDA kernels take ([`sinkhorn_cuda`], and [`stream_read`] and
/// [`stream_write`] on CUDA tensors): a Sinkhorn thread keeps 2·n² values in registers.
pub const CUDA_KERNELS_MAX_STREAMS: usize = 8;

/// Sinkhorn–Knopp of `exp(logits)` on a CUDA device: `logits` `[.., n, n]` fp32, 1 ≤ n ≤
/// [`CUDA_KERNELS_MAX_STREAMS`] → `[.., n, n]`, differentiable; one kernel forward and one backward
/// (the backward recomputes the iterates). The first call for a device and n compiles the kernels
/// with NVRTC and checks them against [`sinkhorn_cuda_host`] in double; a failure there (no NVRTC,
/// no driver, a disagreement) is returned by that call and every later one for the device and n.
pub fn sinkhorn_cuda(logits: &Tensor, iters: usize) -> Result<Tensor> {
    let mut out: *mut torch_sys::C_tensor = std::ptr::null_mut();
    // SAFETY: as in `stream_read_fused`.
    let err = unsafe { ffi::plexus_sinkhorn_cuda(logits.as_ptr() as *mut _, iters as i64, &mut out) };
    fused_result(err, out)
}

/// The per-token arithmetic of [`sinkhorn_cuda`]'s kernels, run on the CPU: `logits` `[.., n, n]`
/// (contiguous fp32 or fp64 CPU) → P, and with `grad` (P's gradient) the logits' gradient. The
/// same source as the kernels (`native/src/sinkhorn.cu`), so a CPU test checks their arithmetic.
pub fn sinkhorn_cuda_host(logits: &Tensor, grad: Option<&Tensor>, iters: usize) -> Result<(Tensor, Option<Tensor>)> {
    let mut out: *mut torch_sys::C_tensor = std::ptr::null_mut();
    let mut gl: *mut torch_sys::C_tensor = std::ptr::null_mut();
    let g = grad.map_or(std::ptr::null_mut(), |g| g.as_ptr() as *mut _);
    // SAFETY: the inputs are live `at::Tensor*` (or null) for the call; on success the C++ side
    // writes fresh caller-owned handles to `out` and, with a gradient, `gl`.
    let err = unsafe { ffi::plexus_sinkhorn_host(logits.as_ptr() as *mut _, g, iters as i64, &mut out, &mut gl) };
    let p = fused_result(err, out)?;
    // SAFETY: non-null only when a gradient was given, a fresh handle that nothing else owns.
    let gl = (!gl.is_null()).then(|| unsafe { Tensor::from_ptr(gl) });
    Ok((p, gl))
}

/// The stream kernels' outputs on the CPU ([`streams_host`]): read → `[u, gH, gpre]`, write →
/// `[H', gH, go, gws]`.
pub type StreamsHost = Vec<Tensor>;

/// The per-token arithmetic of the CUDA stream kernels (`native/src/streams.cu`), run on the CPU,
/// for the tests: contiguous fp32 or fp64 CPU tensors of one dtype, `h` `[M, n, D]`.
/// `weights` = `[pre]` (the read; `[M, n]` or `[n]`) with `grad` = gu `[M, D]` → `[u, gH, gpre
/// [M, n]]`; `weights` = `[res, post, o]` (the write; `[M, n, n]` or `[n, n]`, `[M, n]` or `[n]`,
/// `[M, D]`) with `grad` = g `[M, n, D]` → `[H', gH, go, gws [M, n² + n]]` (each token's gres,
/// row-major `[s, t]`, then its gpost). The weights' gradients are per token, unsummed.
/// Each token's block runs as `threads` calls of the per-thread function (thread i takes d = i,
/// i + threads, …), their partial sums added as the GPU's block sum does.
pub fn streams_host(h: &Tensor, weights: &[&Tensor], grad: &Tensor, threads: usize) -> Result<StreamsHost> {
    let write = match weights.len() {
        1 => 0,
        3 => 1,
        k => bail!("streams_host takes [pre] or [res, post, o], not {k} weights"),
    };
    let mut ins: Vec<*mut torch_sys::C_tensor> = weights.iter().map(|t| t.as_ptr() as *mut _).collect();
    ins.push(grad.as_ptr() as *mut _);
    ins.resize(4, std::ptr::null_mut());
    let mut out: [*mut torch_sys::C_tensor; 4] = [std::ptr::null_mut(); 4];
    // SAFETY: the inputs are live `at::Tensor*` (null past the ones the operation takes) for the
    // call; on success the C++ side writes 3 (read) or 4 (write) fresh caller-owned handles.
    let err = unsafe {
        ffi::plexus_streams_host(
            write,
            threads as i64,
            h.as_ptr() as *mut _,
            ins[0],
            ins[1],
            ins[2],
            ins[3],
            out.as_mut_ptr(),
        )
    };
    check(err)?;
    // SAFETY: fresh handles that nothing else owns (see above).
    Ok(out[..3 + write as usize].iter().map(|&p| unsafe { Tensor::from_ptr(p) }).collect())
}

/// The CUDA kernels as NVRTC compiled them ([`cuda_kernels_compile`]).
#[derive(Debug, Clone)]
pub struct CompiledKernels {
    /// The image's size in bytes.
    pub bytes: usize,
    /// `sm_90` for a CUBIN; `compute_<a>` for PTX (a GPU newer than NVRTC knows).
    pub target: String,
    /// NVRTC's log: for a CUBIN, ptxas' resource usage of every kernel (`-v`).
    pub log: String,
}

impl CompiledKernels {
    /// Bytes of register spills (stores + loads to local memory) over every kernel, from ptxas'
    /// "N bytes spill stores, M bytes spill loads" lines; `None` for PTX (ptxas did not run) or
    /// a log without them.
    pub fn spill_bytes(&self) -> Option<u64> {
        let mut total = None;
        for line in self.log.lines().filter(|l| l.contains("bytes spill stores")) {
            let numbers: Vec<u64> = line
                .split(|c: char| !c.is_ascii_digit())
                .filter(|w| !w.is_empty())
                .filter_map(|w| w.parse().ok())
                .collect();
            // "N bytes stack frame, S bytes spill stores, L bytes spill loads"
            let (s, l) = match numbers.as_slice() {
                [.., s, l] => (*s, *l),
                _ => continue,
            };
            *total.get_or_insert(0) += s + l;
        }
        total
    }

    /// Each kernel's "Compiling entry function" and its resource lines, for a report.
    pub fn usage(&self) -> Vec<&str> {
        self.log.lines().filter(|l| l.contains("ptxas info")).collect()
    }
}

/// Compiles the CUDA kernels ([`sinkhorn_cuda`], the stream read and write) for `n` streams and
/// compute capability `arch` (major·10 + minor, 90 for an H100) with NVRTC, without a GPU.
pub fn cuda_kernels_compile(n: usize, arch: u32) -> Result<CompiledKernels> {
    let mut bytes = 0i64;
    let mut target: *mut c_char = std::ptr::null_mut();
    let mut log: *mut c_char = std::ptr::null_mut();
    // SAFETY: out-parameters only; `target` and `log` are malloc'd strings on success.
    let err = unsafe { ffi::plexus_cuda_kernels_compile(n as i64, i64::from(arch), &mut bytes, &mut target, &mut log) };
    check(err)?;
    Ok(CompiledKernels { bytes: bytes as usize, target: take_string(target), log: take_string(log) })
}

/// NVRTC's version (major·1000 + minor·10) and the path it was opened from.
pub fn nvrtc_version() -> Result<(i32, String)> {
    let mut version: c_int = 0;
    let mut path: *mut c_char = std::ptr::null_mut();
    // SAFETY: out-parameters only; `path` is a malloc'd string on success.
    let err = unsafe { ffi::plexus_nvrtc_version(&mut version, &mut path) };
    check(err)?;
    Ok((version, take_string(path)))
}

/// The language-model loss on logits in a compute dtype other than fp32: the mean cross-entropy of
/// `logits` `[N, V]` against `target` `[N]` (int64, same device), in fp32 arithmetic as autocast's
/// `cross_entropy`, without an fp32 copy of the logits. On a GPU, plexus' CUDA loss kernels
/// ([`cross_entropy_cuda`]: one pass over the logits each way); elsewhere, and where those cannot
/// run or `PLEXUS_FUSED_KERNELS=0`, [`cross_entropy_chunked`]. → 0-dim fp32.
pub fn cross_entropy_lm(logits: &Tensor, target: &Tensor) -> Result<Tensor> {
    let takes = takes_gpu_paths(logits) && matches!(logits.kind(), Kind::BFloat16 | Kind::Float);
    if takes {
        if let Some(loss) = cuda_result(cross_entropy_cuda(logits, target)) {
            return Ok(loss);
        }
    }
    cross_entropy_chunked(logits, target)
}

/// [`cross_entropy_lm`] through plexus' CUDA loss kernels (`native/src/losses.cu`): forward one
/// block per row reads the logits once (an online softmax: the row's log-sum-exp and its loss),
/// backward one block per row reads them once more and writes the gradient in their dtype. bf16 or
/// fp32 logits on a CUDA device; an error (starting [`CUDA_KERNELS_UNAVAILABLE_PREFIX`] where the
/// kernels cannot run) otherwise.
pub fn cross_entropy_cuda(logits: &Tensor, target: &Tensor) -> Result<Tensor> {
    let mut out: *mut torch_sys::C_tensor = std::ptr::null_mut();
    // SAFETY: both handles are live for the call; the C++ side writes a new, caller-owned tensor.
    let err = unsafe { ffi::plexus_cross_entropy_cuda(logits.as_ptr() as *mut _, target.as_ptr() as *mut _, &mut out) };
    fused_result(err, out)
}

/// The CUDA loss kernels' per-row arithmetic run on the CPU (each row's block as `threads`
/// threads, their states merged in thread order): `(lse [N], the rows' losses [N], the logits'
/// gradient at `scale`)`. `logits` `[N, V]` bf16 or fp32 on the CPU, `target` `[N]` int64. For
/// the tests: what the kernels compute, against libtorch's composite loss and an fp64 reference.
pub fn cross_entropy_host(
    logits: &Tensor,
    target: &Tensor,
    scale: f64,
    threads: i64,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (logits, target) = (logits.contiguous(), target.contiguous());
    let mut out: [*mut torch_sys::C_tensor; 3] = [std::ptr::null_mut(); 3];
    // SAFETY: both handles are live for the call; on success the C++ side writes three new,
    // caller-owned tensors into `out`.
    let err = unsafe {
        ffi::plexus_cross_entropy_host(
            logits.as_ptr() as *mut _,
            target.as_ptr() as *mut _,
            scale,
            threads,
            out.as_mut_ptr(),
        )
    };
    let [a, b, c] = fused_results(err, out)?;
    Ok((a, b, c))
}

/// Rotary position embedding of `x` `[B, T, H·hd]` (a query or key projection; its token rows may
/// lie further apart, as a block of a packed qkv does) into heads `[B, H, T, hd]`, with RoPE's tables
/// `cos`, `sin_signed` `[≥ T, hd]` (see `model::layers::Rope`), through plexus' CUDA kernels
/// (`native/src/rope.cu`: the split, the layout and the rotation in one pass each way). `None`
/// where they do not apply (not CUDA, `PLEXUS_FUSED_KERNELS=0`, another dtype or layout, or the
/// kernels cannot run here): the caller then runs its composite.
pub fn rope_heads(x: &Tensor, cos: &Tensor, sin_signed: &Tensor, heads: i64) -> Option<Tensor> {
    let s = x.stride();
    let takes = takes_gpu_paths(x)
        && matches!(x.kind(), Kind::BFloat16 | Kind::Float)
        && cos.kind() == x.kind()
        && x.dim() == 3
        && s[2] == 1
        && s[0] == x.size()[1] * s[1];
    if !takes {
        return None;
    }
    cuda_result(rope_cuda(x, cos, sin_signed, heads))
}

/// [`rope_heads`] through the kernels, or an error.
pub fn rope_cuda(x: &Tensor, cos: &Tensor, sin_signed: &Tensor, heads: i64) -> Result<Tensor> {
    let mut out: *mut torch_sys::C_tensor = std::ptr::null_mut();
    // SAFETY: live handles for the call; the C++ side writes a new, caller-owned tensor.
    let err = unsafe {
        ffi::plexus_rope_cuda(
            x.as_ptr() as *mut _,
            cos.as_ptr() as *mut _,
            sin_signed.as_ptr() as *mut _,
            heads,
            &mut out,
        )
    };
    fused_result(err, out)
}

/// The RoPE kernels' per-element arithmetic run on the CPU: `[y [B, H, T, hd], gx [B, T, H·hd]]`
/// for `x` `[B, T, H·hd]`, the tables and `gy` `[B, H, T, hd]` (one dtype, bf16 or fp32). For the
/// tests.
pub fn rope_host(x: &Tensor, cos: &Tensor, sin_signed: &Tensor, gy: &Tensor, heads: i64) -> Result<[Tensor; 2]> {
    let (x, cos, sin_signed, gy) = (x.contiguous(), cos.contiguous(), sin_signed.contiguous(), gy.contiguous());
    let mut out: [*mut torch_sys::C_tensor; 2] = [std::ptr::null_mut(); 2];
    // SAFETY: live handles for the call; on success two new, caller-owned tensors in `out`.
    let err = unsafe {
        ffi::plexus_rope_host(
            x.as_ptr() as *mut _,
            cos.as_ptr() as *mut _,
            sin_signed.as_ptr() as *mut _,
            gy.as_ptr() as *mut _,
            heads,
            out.as_mut_ptr(),
        )
    };
    fused_results(err, out)
}

/// SwiGLU's gate `silu(g) · u` (LLaMA's MLP; `g`, `u` the gate and up projections, one shape and
/// dtype): on a GPU one CUDA kernel each way ([`swiglu_cuda`]; libtorch runs silu, the product,
/// and three kernels backward, and keeps silu(g)); elsewhere, and where the kernels cannot run or
/// `PLEXUS_FUSED_KERNELS=0`, libtorch's `silu` and product.
pub fn swiglu(g: &Tensor, u: &Tensor) -> Tensor {
    let takes = takes_gpu_paths(g)
        && g.kind() == u.kind()
        && matches!(g.kind(), Kind::BFloat16 | Kind::Float)
        && g.size() == u.size()
        && u.device() == g.device();
    if takes {
        if let Some(h) = cuda_result(swiglu_cuda(g, u)) {
            return h;
        }
    }
    g.silu() * u
}

/// [`swiglu`] through plexus' CUDA kernels (`native/src/activations.cu`): fp32 arithmetic, one
/// rounding per output. An error where they cannot run.
pub fn swiglu_cuda(g: &Tensor, u: &Tensor) -> Result<Tensor> {
    let mut out: *mut torch_sys::C_tensor = std::ptr::null_mut();
    // SAFETY: live handles for the call; the C++ side writes a new, caller-owned tensor.
    let err = unsafe { ffi::plexus_swiglu_cuda(g.as_ptr() as *mut _, u.as_ptr() as *mut _, &mut out) };
    fused_result(err, out)
}

/// The SwiGLU kernels' per-element arithmetic run on the CPU: `[h, gg, gu]` for `g`, `u` and the
/// output's gradient `gh` (one shape, bf16 or fp32). For the tests.
pub fn swiglu_host(g: &Tensor, u: &Tensor, gh: &Tensor) -> Result<[Tensor; 3]> {
    let (g, u, gh) = (g.contiguous(), u.contiguous(), gh.contiguous());
    let mut out: [*mut torch_sys::C_tensor; 3] = [std::ptr::null_mut(); 3];
    // SAFETY: live handles for the call; on success three new, caller-owned tensors in `out`.
    let err = unsafe {
        ffi::plexus_swiglu_host(g.as_ptr() as *mut _, u.as_ptr() as *mut _, gh.as_ptr() as *mut _, out.as_mut_ptr())
    };
    fused_results(err, out)
}

/// Which pre-norm: LayerNorm (with its bias, if any) or RMSNorm (a weight only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormKind {
    Layer,
    Rms,
}

/// A unit's pre-norm of the fp32 stream `x` `[.., D]` (weight `w` `[D]`, bias `b` `[D]` for
/// LayerNorm), written in bf16 for the unit's bf16 branch: on a GPU one CUDA kernel each way
/// ([`norm_cuda`]: the norm and the cast in one pass, no fp32 output); elsewhere, and where the
/// kernels cannot run or `PLEXUS_FUSED_KERNELS=0`, libtorch's `layer_norm`/`rms_norm` and a cast
/// (`composite`, the same values to fp32 summation order).
pub fn norm_to_bf16(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    eps: f64,
    kind: NormKind,
    composite: impl FnOnce() -> Tensor,
) -> Tensor {
    let takes = takes_gpu_paths(x)
        && x.kind() == Kind::Float
        && w.kind() == Kind::Float
        && b.is_none_or(|b| b.kind() == Kind::Float);
    if takes {
        if let Some(y) = cuda_result(norm_cuda(x, w, b, eps, kind)) {
            return y;
        }
    }
    composite().to_kind(Kind::BFloat16)
}

/// [`norm_to_bf16`] through plexus' CUDA norm kernels (`native/src/norms.cu`): forward one block
/// per row (mean and variance in two passes over the row, the output in bf16, mean and rstd saved),
/// backward one block per 32 rows (the input's gradient in fp32, the weight's and bias's summed
/// per block, then over blocks). fp32 tensors on one CUDA device; an error otherwise.
pub fn norm_cuda(x: &Tensor, w: &Tensor, b: Option<&Tensor>, eps: f64, kind: NormKind) -> Result<Tensor> {
    let mut out: *mut torch_sys::C_tensor = std::ptr::null_mut();
    let b_ptr = b.map_or(std::ptr::null_mut(), |b| b.as_ptr() as *mut _);
    // SAFETY: the handles are live for the call (the bias null or live); the C++ side writes a new,
    // caller-owned tensor.
    let err = unsafe {
        ffi::plexus_norm_cuda(
            x.as_ptr() as *mut _,
            w.as_ptr() as *mut _,
            b_ptr,
            eps,
            (kind == NormKind::Layer) as i64,
            &mut out,
        )
    };
    fused_result(err, out)
}

/// The CUDA norm kernels' per-row arithmetic run on the CPU (each block as `threads` threads):
/// `[y (bf16), gx, gw, gb]` for `x` `[R, D]` fp32, `w` (`b`) `[D]` fp32 and `gy` `[R, D]` bf16 (gb
/// only meaningful with `b`). For the tests.
pub fn norm_host(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    gy: &Tensor,
    eps: f64,
    kind: NormKind,
    threads: i64,
) -> Result<[Tensor; 4]> {
    let (x, w, gy) = (x.contiguous(), w.contiguous(), gy.contiguous());
    let b = b.map(Tensor::contiguous);
    let b_ptr = b.as_ref().map_or(std::ptr::null_mut(), |b| b.as_ptr() as *mut _);
    let mut out: [*mut torch_sys::C_tensor; 4] = [std::ptr::null_mut(); 4];
    // SAFETY: the handles are live for the call; on success the C++ side writes four new,
    // caller-owned tensors into `out`.
    let err = unsafe {
        ffi::plexus_norm_host(
            x.as_ptr() as *mut _,
            w.as_ptr() as *mut _,
            b_ptr,
            gy.as_ptr() as *mut _,
            eps,
            (kind == NormKind::Layer) as i64,
            threads,
            out.as_mut_ptr(),
        )
    };
    fused_results(err, out)
}

/// H-ACN's update of one unit with its long path: `(x' = h + a·x, acc' = acc + h)` for the stream
/// `x` and the long path's sum `acc` (fp32), the unit's output `h` in its compute dtype (bf16 or
/// fp32) and its residual weight `a` (one fp32), through plexus' kernels (`native/src/hacn.cu`: one
/// pass each way; h's two gradients added in fp32 and rounded once, as the composite's cast does).
/// On a CUDA device or the CPU (the host build); an error otherwise.
pub fn hacn_step(x: &Tensor, acc: &Tensor, h: &Tensor, a: &Tensor) -> Result<(Tensor, Tensor)> {
    let mut out: [*mut torch_sys::C_tensor; 2] = [std::ptr::null_mut(); 2];
    // SAFETY: live handles for the call; on success two new, caller-owned tensors in `out`.
    let err = unsafe {
        ffi::plexus_hacn_step(
            x.as_ptr() as *mut _,
            acc.as_ptr() as *mut _,
            h.as_ptr() as *mut _,
            a.as_ptr() as *mut _,
            out.as_mut_ptr(),
        )
    };
    let [x, acc] = fused_results(err, out)?;
    Ok((x, acc))
}

/// [`hacn_step`] where a step takes the GPU's fused paths (a CUDA device, or the CPU under
/// [`gpu_paths_on_cpu`]) and the tensors fit it; `None` elsewhere or where the kernels cannot run
/// (the caller runs its composite).
pub fn hacn_step_gpu(x: &Tensor, acc: &Tensor, h: &Tensor, a: &Tensor) -> Option<(Tensor, Tensor)> {
    let takes = takes_gpu_paths(x)
        && x.kind() == Kind::Float
        && acc.kind() == Kind::Float
        && matches!(h.kind(), Kind::BFloat16 | Kind::Float)
        && a.kind() == Kind::Float
        && a.numel() == 1
        && acc.size() == x.size()
        && h.size() == x.size();
    if !takes {
        return None;
    }
    match hacn_step(x, acc, h, a) {
        Ok(pair) => Some(pair),
        Err(e) => {
            // Unavailable kernels: None (and the composite from now on); any other error stops.
            let _ = cuda_result(Err(e));
            None
        }
    }
}

/// Hyper-Connections' dynamic logits `z = LayerNorm(x; γ, β, eps) · W` of the streams `x` `[.., D]`
/// (fp32) with `W = [W_a | w_b]` `[D, K]` (K = n + 2) → `[.., K]` fp32, through plexus' kernels
/// (`native/src/norm_project.cu`: one pass over x each way, the normalised streams never written)
/// where a step takes the GPU's fused paths (a CUDA device, or the CPU under
/// [`gpu_paths_on_cpu`]); `None` elsewhere, where the kernels cannot run, or for K outside 3..=10.
/// With `compute` bf16 the kernels round where the composite's bf16 product does (the normalised
/// streams and W before the product, z after it; backward the same), so that the two differ only
/// in the order of their fp32 sums.
pub fn norm_project_gpu(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    w: &Tensor,
    eps: f64,
    compute: Kind,
) -> Option<Tensor> {
    let k = w.size().get(1).copied().unwrap_or(0);
    let takes = takes_gpu_paths(x)
        && [x, gamma, beta, w].iter().all(|t| t.kind() == Kind::Float)
        && matches!(compute, Kind::Float | Kind::BFloat16)
        && (3..=10).contains(&k);
    if !takes {
        return None;
    }
    let mut out: *mut torch_sys::C_tensor = std::ptr::null_mut();
    // SAFETY: live handles for the call; the C++ side writes a new, caller-owned tensor.
    let err = unsafe {
        ffi::plexus_norm_project_cuda(
            x.as_ptr() as *mut _,
            gamma.as_ptr() as *mut _,
            beta.as_ptr() as *mut _,
            w.as_ptr() as *mut _,
            eps,
            (compute == Kind::BFloat16) as i64,
            &mut out,
        )
    };
    cuda_result(fused_result(err, out))
}

/// The norm-project kernels' per-thread arithmetic run on the CPU (each block as `threads`
/// threads): `[z [R, K], gx [R, D], gγ [D], gβ [D], gW [D, K]]` for `x` `[R, D]`, `γ`, `β` `[D]`,
/// `W` `[D, K]` and `gz` `[R, K]` (fp32), with bf16 roundings where `round`. For the tests.
#[allow(clippy::too_many_arguments)]
pub fn norm_project_host(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    w: &Tensor,
    gz: &Tensor,
    eps: f64,
    round: bool,
    threads: i64,
) -> Result<[Tensor; 5]> {
    let ts: Vec<Tensor> = [x, gamma, beta, w, gz].iter().map(|t| t.contiguous()).collect();
    let mut out: [*mut torch_sys::C_tensor; 5] = [std::ptr::null_mut(); 5];
    // SAFETY: live handles for the call; on success five new, caller-owned tensors in `out`.
    let err = unsafe {
        ffi::plexus_norm_project_host(
            ts[0].as_ptr() as *mut _,
            ts[1].as_ptr() as *mut _,
            ts[2].as_ptr() as *mut _,
            ts[3].as_ptr() as *mut _,
            ts[4].as_ptr() as *mut _,
            eps,
            round as i64,
            threads,
            out.as_mut_ptr(),
        )
    };
    fused_results(err, out)
}

/// Elements of a chunk of [`cross_entropy_chunked`] (its fp32 temporaries): large on a GPU, where
/// each chunk is a few kernels (2²⁶ = 268 MB of fp32), cache-sized on a CPU (2²² = 16 MB).
fn cross_entropy_chunk_elems(device: tch::Device) -> i64 {
    if device.is_cuda() {
        1 << 26
    } else {
        1 << 22
    }
}

/// Mean cross-entropy of `logits` `[N, V]` (any floating dtype) against `target` `[N]` (int64, same
/// device), computed in fp32 as autocast's `cross_entropy` is, without a full fp32 copy of the
/// logits: chunks of rows are cast and reduced one at a time, backward recomputes softmax from the
/// saved logits and the per-row log-sum-exp and writes the gradient in the logits' dtype
/// (`native/src/losses.cpp`). → 0-dim fp32.
pub fn cross_entropy_chunked(logits: &Tensor, target: &Tensor) -> Result<Tensor> {
    let v = logits.size().last().copied().unwrap_or(1).max(1);
    cross_entropy_in_chunks(logits, target, (cross_entropy_chunk_elems(logits.device()) / v).max(1))
}

/// [`cross_entropy_chunked`] with `rows` rows per chunk (≥ 1).
pub fn cross_entropy_in_chunks(logits: &Tensor, target: &Tensor, rows: i64) -> Result<Tensor> {
    let chunk = rows;
    let mut out: *mut torch_sys::C_tensor = std::ptr::null_mut();
    // SAFETY: both handles are live `at::Tensor*` for the call; the C++ side writes a new,
    // caller-owned tensor to `out` on success.
    let err = unsafe {
        ffi::plexus_cross_entropy_chunked(logits.as_ptr() as *mut _, target.as_ptr() as *mut _, chunk, &mut out)
    };
    fused_result(err, out)
}

/// Pushes state `x` into row `slot` of a history buffer `buf` `[cap, N]` (`x` has N elements, the
/// buffer's dtype and device) and returns `x` through an autograd function that owns its gradient:
/// the gradient of its other consumers plus row `slot` of `gbuf`, where every [`history_mix`] that
/// read the slot put its share (`native/src/history.cpp`). Any device. Use the returned tensor, not
/// `x`, downstream, and pass it to the sums that read the slot.
pub fn history_push(buf: &Tensor, gbuf: &Tensor, slot: usize, x: &Tensor) -> Result<Tensor> {
    let mut out: *mut torch_sys::C_tensor = std::ptr::null_mut();
    // SAFETY: as in `stream_read_fused`; the C++ side writes into `buf` (a tensor the caller owns) and
    // keeps references to `buf` and `gbuf` in the autograd node.
    let err = unsafe {
        ffi::plexus_history_push(
            buf.as_ptr() as *mut _,
            gbuf.as_ptr() as *mut _,
            slot as i64,
            x.as_ptr() as *mut _,
            &mut out,
        )
    };
    fused_result(err, out)
}

/// The slots a reader of a history takes and its states' handles, for the FFI: one state per slot.
fn history_reads(what: &str, slots: &[usize], states: &[&Tensor]) -> Result<(Vec<i64>, Vec<*mut torch_sys::C_tensor>)> {
    if states.len() != slots.len() {
        bail!("{what}: {} slots but {} states", slots.len(), states.len());
    }
    Ok((slots.iter().map(|&s| s as i64).collect(), states.iter().map(|t| t.as_ptr() as *mut _).collect()))
}

/// `Σ_i w[i] · state slots[i]` from a history buffer (see [`history_push`]): one matrix-vector
/// product forward; backward, `dw` (another) and one rank-1 update of the slots' rows of `gbuf`.
/// `states`: the pushes' outputs of those slots (autograd orders the pushes' backwards after this
/// one's through them); `w` `[k]` in the buffer's dtype → a tensor shaped like the states.
pub fn history_mix(buf: &Tensor, gbuf: &Tensor, slots: &[usize], states: &[&Tensor], w: &Tensor) -> Result<Tensor> {
    let (slots, mut ptrs) = history_reads("history_mix", slots, states)?;
    let mut out: *mut torch_sys::C_tensor = std::ptr::null_mut();
    // SAFETY: as in `history_push`; `slots` and `ptrs` hold k live entries for the call.
    let err = unsafe {
        ffi::plexus_history_mix(
            buf.as_ptr() as *mut _,
            gbuf.as_ptr() as *mut _,
            slots.as_ptr(),
            ptrs.as_mut_ptr(),
            slots.len() as i64,
            w.as_ptr() as *mut _,
            &mut out,
        )
    };
    fused_result(err, out)
}

/// The most sources one call of [`history_attend`] takes (`PLEXUS_ATTNRES_MAX_SOURCES` of
/// `native/src/attnres.cu`).
pub const ATTNRES_MAX_SOURCES: usize = 64;

/// Attention Residuals' depth attention over a history buffer (see [`history_push`]): for the
/// sources at rows `slots` of `buf` (fp32; at most [`ATTNRES_MAX_SOURCES`]) and the unit's query `q`
/// `[D]` fp32, per row (token) `α = softmax_i(q · rms(v_i))` and `y = Σ_i α_i v_i`
/// (`native/src/attnres.cu`: one kernel each way, reading the sources in place; backward recomputes
/// the weights and adds each source's gradient into its row of `gbuf`). `states`: the pushes'
/// outputs of those slots, `[.., D]`. Returns `(y [.., D], α [.., k])`, α without gradient. On a
/// CUDA device or the CPU (the kernels' host build); an error otherwise.
pub fn history_attend(
    buf: &Tensor,
    gbuf: &Tensor,
    slots: &[usize],
    states: &[&Tensor],
    q: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let (slots, mut ptrs) = history_reads("history_attend", slots, states)?;
    let mut out: [*mut torch_sys::C_tensor; 2] = [std::ptr::null_mut(); 2];
    // SAFETY: as in `history_mix`; on success two new, caller-owned tensors in `out`.
    let err = unsafe {
        ffi::plexus_history_attend(
            buf.as_ptr() as *mut _,
            gbuf.as_ptr() as *mut _,
            slots.as_ptr(),
            ptrs.as_mut_ptr(),
            slots.len() as i64,
            q.as_ptr() as *mut _,
            out.as_mut_ptr(),
        )
    };
    let [y, alpha] = fused_results(err, out)?;
    Ok((y, alpha))
}

/// [`history_attend`] where a step takes the GPU's fused paths (a CUDA device, or the CPU under
/// [`gpu_paths_on_cpu`]) and the call fits the kernels (fp32, 1 to [`ATTNRES_MAX_SOURCES`]
/// sources); `None` elsewhere or where the kernels cannot run (the caller runs its composite).
pub fn history_attend_gpu(
    buf: &Tensor,
    gbuf: &Tensor,
    slots: &[usize],
    states: &[&Tensor],
    q: &Tensor,
) -> Option<(Tensor, Tensor)> {
    let takes = takes_gpu_paths(buf)
        && buf.kind() == Kind::Float
        && q.kind() == Kind::Float
        && (1..=ATTNRES_MAX_SOURCES).contains(&slots.len());
    if !takes {
        return None;
    }
    match history_attend(buf, gbuf, slots, states, q) {
        Ok(pair) => Some(pair),
        Err(e) => {
            // Unavailable kernels: None (and the composite from now on); any other error stops.
            let _ = cuda_result(Err(e));
            None
        }
    }
}

/// `(v @ phi) / rms(v)` row by row, `rms(v) = ‖v‖₂ / √N` (mHC's mixing logits): `v` `[.., N]`,
/// `phi` `[N, K]` → `[.., K]`, one autograd function whose backward forms the input gradient in one
/// pass (the products are libtorch's) and keeps nothing of `v`'s size but `v`. fp32/fp64 tensors
/// of one dtype on one device; with `compute` bf16 the products run in bf16 with the composite's
/// roundings.
pub fn rms_project(v: &Tensor, phi: &Tensor, compute: Kind) -> Result<Tensor> {
    let mut out: *mut torch_sys::C_tensor = std::ptr::null_mut();
    let bf16 = (compute == Kind::BFloat16) as i64;
    // SAFETY: as in `stream_read_fused`.
    let err = unsafe { ffi::plexus_rms_project(v.as_ptr() as *mut _, phi.as_ptr() as *mut _, bf16, &mut out) };
    fused_result(err, out)
}

/// mHC's mixing logits ([`rms_project`]) where a step takes the GPU's fused paths (a CUDA device,
/// or the CPU under [`gpu_paths_on_cpu`]) and `v`, `phi` are fp32 with `compute` fp32 or bf16;
/// `None` elsewhere (the caller runs its own code).
pub fn rms_project_gpu(v: &Tensor, phi: &Tensor, compute: Kind) -> Option<Tensor> {
    let takes = takes_gpu_paths(v)
        && v.kind() == Kind::Float
        && phi.kind() == Kind::Float
        && phi.device() == v.device()
        && matches!(compute, Kind::Float | Kind::BFloat16);
    takes.then(|| rms_project(v, phi, compute).unwrap_or_else(|e| panic!("mHC's rms projection: {e:#}")))
}

/// `LayerNorm(x; gamma, beta, eps) @ w` row by row, without materialising the normalised rows
/// (one pass forward, one backward): `x` `[.., D]`, `gamma`, `beta` `[D]`, `w` `[D, K]` →
/// `[.., K]`. CPU fp32/fp64 tensors of one dtype.
pub fn norm_project(x: &Tensor, gamma: &Tensor, beta: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let mut out: *mut torch_sys::C_tensor = std::ptr::null_mut();
    // SAFETY: as in `stream_read_fused`.
    let err = unsafe {
        ffi::plexus_norm_project(
            x.as_ptr() as *mut _,
            gamma.as_ptr() as *mut _,
            beta.as_ptr() as *mut _,
            w.as_ptr() as *mut _,
            eps,
            kernel_isa().code(),
            &mut out,
        )
    };
    fused_result(err, out)
}

/// The parameters of Hyper-Connections' dynamic mixing weights for [`hyper_pre`].
pub struct HyperPreParams<'a> {
    /// The weights' LayerNorm, `[D]` each.
    pub gamma: &'a Tensor,
    pub beta: &'a Tensor,
    /// `W_a` `[D, n+1]` and `w_b` `[D]`.
    pub w_a: &'a Tensor,
    pub w_b: &'a Tensor,
    /// `A_static` `[n, n+1]` and `B_static` `[n]`.
    pub a_static: &'a Tensor,
    pub b_static: &'a Tensor,
    /// The scales `s_a`, `s_b`, one value each.
    pub s_a: &'a Tensor,
    pub s_b: &'a Tensor,
    /// ε of the LayerNorm.
    pub eps: f64,
}

impl<'a> HyperPreParams<'a> {
    /// The parameters from eight tensors in the order of the fields (γ, β, W_a, w_b, A_static,
    /// B_static, s_a, s_b), as tests and benchmarks hold them.
    pub fn from_slice(t: &'a [Tensor; 8], eps: f64) -> Self {
        let [gamma, beta, w_a, w_b, a_static, b_static, s_a, s_b] = t;
        HyperPreParams { gamma, beta, w_a, w_b, a_static, b_static, s_a, s_b, eps }
    }

    /// The eight tensors' handles in the order of the fields, as the C++ entry points take them.
    fn handles(&self) -> [*mut torch_sys::C_tensor; 8] {
        [self.gamma, self.beta, self.w_a, self.w_b, self.a_static, self.b_static, self.s_a, self.s_b]
            .map(|t| t.as_ptr() as *mut _)
    }
}

/// Everything Hyper-Connections computes from a unit's input streams before the unit runs, as one
/// autograd function with one pass per token each way: with `Z = LayerNorm(H) [W_a | w_b]`,
/// `A = A_static + s_a·tanh(Z[.., :n+1])` and `B = B_static + s_b·tanh(Z[.., n+1])`, it returns
/// `(u, res, post)` = (`Σ_s A[s,0] H_s` `[.., D]`, `A[.., 1:]` `[.., n, n]`, `B` `[.., n]`) for
/// streams `h` `[.., n, D]` (1 ≤ n ≤ 64). CPU fp32/fp64 tensors of one dtype.
pub fn hyper_pre(h: &Tensor, p: &HyperPreParams) -> Result<(Tensor, Tensor, Tensor)> {
    let mut outs: [*mut torch_sys::C_tensor; 3] = [std::ptr::null_mut(); 3];
    // SAFETY: as in `stream_read_fused`; on success the C++ side writes three fresh, caller-owned
    // handles to `outs`.
    let err = unsafe {
        ffi::plexus_hyper_pre(h.as_ptr() as *mut _, p.handles().as_ptr(), p.eps, kernel_isa().code(), outs.as_mut_ptr())
    };
    check(err)?;
    // SAFETY: on success each handle is a fresh tensor that nothing else owns.
    let [u, res, post] = outs.map(|t| unsafe { Tensor::from_ptr(t) });
    Ok((u, res, post))
}

// ---- Fused or composite: the dispatching operations the topologies call. Each runs the fused CPU
// kernel, plexus' CUDA kernel or the composite libtorch graph (same values), whichever applies.

/// Whether the fused CPU kernels take these tensors: all fp32 or all fp64 on the CPU.
pub fn fused_streams_take_all(ts: &[&Tensor]) -> bool {
    ts.iter().all(|t| fused_streams_take(t) && t.kind() == ts[0].kind())
}

/// Whether plexus' CUDA kernels (compiled at run time with NVRTC, `native/src/cuda_kernels.cpp`)
/// take an operation on these tensors: all fp32 on one CUDA device, `n` streams within what they
/// are built for, `PLEXUS_FUSED_KERNELS` not 0, and the kernels not found unavailable earlier in
/// this process.
pub fn cuda_fused(ts: &[&Tensor], n: i64) -> bool {
    let dev = ts[0].device();
    dev.is_cuda()
        && fused_kernels_on()
        && !cuda_kernels_unavailable()
        && (1..=CUDA_KERNELS_MAX_STREAMS as i64).contains(&n)
        && ts.iter().all(|t| t.device() == dev && t.kind() == Kind::Float)
}

/// Set once the CUDA kernels have said they cannot run here: later calls go straight to the
/// composite code, without a call into the native layer.
static CUDA_KERNELS_UNAVAILABLE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// How the native layer starts the errors that mean "the kernels cannot run here"
/// (`kUnavailable` in `native/src/cuda_kernels.cpp`).
pub const CUDA_KERNELS_UNAVAILABLE_PREFIX: &str = "plexus' CUDA kernels are unavailable: ";

/// Whether the CUDA kernels said they cannot run here, earlier in this process.
pub fn cuda_kernels_unavailable() -> bool {
    CUDA_KERNELS_UNAVAILABLE.load(std::sync::atomic::Ordering::Relaxed)
}

/// Forgets [`cuda_kernels_unavailable`] (for the test that sets it).
#[cfg(test)]
pub(crate) fn reset_cuda_kernels_unavailable() {
    CUDA_KERNELS_UNAVAILABLE.store(false, std::sync::atomic::Ordering::Relaxed);
}

/// A CUDA kernel's result, or `None` when the kernels cannot run on this machine (no NVRTC, no
/// driver, their first-use check failed, a first use inside a CUDA graph capture), after one
/// warning per process; the caller then runs its composite code, which computes the same values.
/// Any other error (a failed launch, a fault pinned by `PLEXUS_CUDA_SYNC_CHECK`, a bad argument)
/// panics: after a fault the device is unusable, and carrying on would report it somewhere else.
pub fn cuda_result(r: anyhow::Result<Tensor>) -> Option<Tensor> {
    let e = match r {
        Ok(t) => return Some(t),
        Err(e) => format!("{e:#}"),
    };
    if !e.contains(CUDA_KERNELS_UNAVAILABLE_PREFIX) {
        match crate::torch_panic::hint(&e) {
            Some(hint) => panic!("plexus' CUDA kernel failed: {e}\n  hint: {hint}"),
            None => panic!("plexus' CUDA kernel failed: {e}"),
        }
    }
    // A first use inside a capture is refused for that call only (the C++ side does not keep it):
    // the kernels may still load on a later eager call.
    if !e.contains("inside a CUDA graph capture") {
        CUDA_KERNELS_UNAVAILABLE.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| {
        eprintln!(
            "warning: plexus' CUDA kernels cannot run here, so Hyper-Connections' and mHC's stream mixing, \
             the language-model loss, the bf16 pre-norms and SwiGLU run as composite libtorch operators (the same values, more \
             kernels; PLEXUS_FUSED_KERNELS=0 chooses that without this warning): {e}"
        )
    });
    None
}

/// The read of unit k, `u = Σ_s pre[s] H_s`: `h` `[.., n, D]`, `pre` `[.., n]` or `[n]` → `[.., D]`.
/// On the CPU in fp32/fp64 one fused pass forward and one backward ([`stream_read_fused`]); in
/// fp32 on a GPU the same through plexus' CUDA kernels ([`cuda_fused`]); elsewhere, and if those
/// cannot run, [`stream_read_composite`].
pub fn stream_read(h: &Tensor, pre: &Tensor) -> Tensor {
    if fused_streams_take_all(&[h, pre]) {
        return stream_read_fused(h, pre).unwrap_or_else(|e| panic!("fused stream read: {e:#}"));
    }
    if cuda_fused(&[h, pre], stream_count(h)) {
        if let Some(u) = cuda_result(stream_read_fused(h, pre)) {
            return u;
        }
    }
    stream_read_composite(h, pre)
}

/// n of streams `[.., n, D]`.
fn stream_count(h: &Tensor) -> i64 {
    let s = h.size();
    if s.len() >= 2 {
        s[s.len() - 2]
    } else {
        0
    }
}

/// [`stream_read`] in libtorch operators: `pre [.., 1, n] @ H [.., n, D]`, one (batched) matmul
/// that reads H once, instead of `(pre ⊗ 1) * H` (an `[.., n, D]` temporary, forward and
/// backward) and a sum.
pub fn stream_read_composite(h: &Tensor, pre: &Tensor) -> Tensor {
    pre.unsqueeze(-2).matmul(h).squeeze_dim(-2)
}

/// The write of unit k, `H'_t = Σ_s res[s, t] H_s + post[t] · o`: `h` `[.., n, D]`, `res`
/// `[.., n, n]` or `[n, n]`, `post` `[.., n]` or `[n]`, `o` `[.., D]` → `[.., n, D]`. On the CPU in
/// fp32/fp64 one fused pass forward and one backward ([`stream_write_fused`]): the composite
/// version's per-token matrix products and their backwards were most of Hyper-Connections'
/// overhead over residual there. On a GPU with fp32 streams, one kernel each way through plexus'
/// CUDA kernels ([`cuda_fused`]). Elsewhere, and if those cannot run, [`stream_write_composite`].
pub fn stream_write(h: &Tensor, res: &Tensor, post: &Tensor, o: &Tensor) -> Tensor {
    if fused_streams_take_all(&[h, res, post, o]) {
        return stream_write_fused(h, res, post, o).unwrap_or_else(|e| panic!("fused stream write: {e:#}"));
    }
    // On a GPU the unit output may be bf16 (autocast's rule) where the streams are fp32: the
    // composite addcmul promotes it, exactly as this conversion does.
    if h.device().is_cuda() {
        let o32 =
            if matches!(o.kind(), Kind::BFloat16 | Kind::Half) { o.to_kind(Kind::Float) } else { o.shallow_clone() };
        if cuda_fused(&[h, res, post, &o32], stream_count(h)) {
            if let Some(out) = cuda_result(stream_write_fused(h, res, post, &o32)) {
                return out;
            }
        }
    }
    stream_write_composite(h, res, post, o)
}

/// [`stream_write`] in libtorch operators: `resᵀ H` as a (batched) matmul with the rank-1 term
/// fused into one addcmul (`post [.., n, 1]` times `o [.., 1, D]` added to the `[.., n, D]` matmul
/// output), not a materialised outer product and a separate add. (A `baddbmm` with the outer
/// product as a k = 1 bmm measured slower on CPU: its batch operands are stride-0 expansions for
/// static mixing.)
pub fn stream_write_composite(h: &Tensor, res: &Tensor, post: &Tensor, o: &Tensor) -> Tensor {
    res.transpose(-1, -2).matmul(h).addcmul(&post.unsqueeze(-1), &o.unsqueeze(-2))
}

/// Sinkhorn–Knopp on `exp(logits)` `[.., n, n]` → `[.., n, n]`: alternate row and column
/// normalisation; the result is doubly stochastic (columns exactly, rows to the iteration's
/// accuracy).
///
/// On the CPU in fp32/fp64 the fused [`sinkhorn_fused`] runs (the iteration on `exp(logits)`, one
/// pass per block of tokens, a hand-written backward that recomputes the iterates and saves only
/// the logits): the composite graph was most of mHC's overhead over Hyper-Connections there.
/// On a CUDA device, [`sinkhorn_cuda`] (n ≤ 8, any logits dtype, fp32 result): one thread
/// per token, one kernel each way, where the composite graph launches 4·iters kernels forward.
/// If it cannot run (no NVRTC, no driver, a failed self-check), one warning and the composite
/// graph from then on. Elsewhere, and with `PLEXUS_FUSED_KERNELS=0`, [`sinkhorn_composite`].
pub fn sinkhorn(logits: &Tensor, iters: usize) -> Tensor {
    let n = logits.size().last().copied().unwrap_or(0) as usize;
    if fused_streams_take(logits) && sinkhorn_fits(n, iters) {
        return sinkhorn_fused(logits, iters).unwrap_or_else(|e| panic!("fused sinkhorn: {e:#}"));
    }
    if logits.device().is_cuda() {
        // Both ways in fp32: the conversion made once (the composite's own is then a no-op).
        let logits32 = logits.to_kind(Kind::Float);
        // The CUDA backward's scratch grows with `iters` as the CPU kernel's does: the same bound.
        if cuda_fused(&[&logits32], n as i64) && sinkhorn_fits(n, iters) {
            if let Some(p) = cuda_result(sinkhorn_cuda(&logits32, iters)) {
                return p;
            }
        }
        return sinkhorn_composite(&logits32, iters);
    }
    sinkhorn_composite(logits, iters)
}

/// [`sinkhorn`] in libtorch operators, in the log domain: normalising the rows of `exp(L)` is a
/// softmax over each row of `L`, so each half-iteration is one `log_softmax` — one kernel forward
/// and one backward — where a sum and a division take two forward and about five backward. On a
/// GPU, where these `[.., n, n]` tensors are tiny and every kernel is a launch, that matters when
/// the CUDA kernel cannot run.
///
/// The kernels iterate on `exp(L − rowmax)` instead, where a column whose every entry underflows
/// is 0 and stays 0 (a log-domain iteration would spread it to 1/n): such columns are found once
/// (`exp(L − rowmax)` summing to 0 over the column) and held at `−10³⁰` after every column
/// normalisation, so that they carry no mass into the row sums and end at exactly 0. Composite,
/// CPU kernel and CUDA kernel then give the same matrix and gradient on saturated logits too
/// (tested), at one more kernel per iteration (an addition, whose backward is free).
pub fn sinkhorn_composite(logits: &Tensor, iters: usize) -> Tensor {
    let mut l = logits.to_kind(Kind::Float);
    let dead = tch::no_grad(|| {
        let x = (&l - l.amax([-1i64], true)).exp();
        x.sum_dim_intlist(-2, true, Kind::Float).eq(0.0).to_kind(Kind::Float) * -1e30
    });
    for _ in 0..iters {
        l = l.log_softmax(-1, Kind::Float).log_softmax(-2, Kind::Float) + &dead;
    }
    l.exp()
}
