//! The safe wrappers of the fused kernels (CPU autograd functions, CUDA kernels compiled with
//! NVRTC and their host builds), the chunked language-model loss and the dense topologies' history
//! buffer: each calls its C++ entry point and nothing else (choice.rs, above, decides which runs).

use super::setting::kernel_isa;
use super::{check, ffi, take_string, NativeError, Result};
use std::ffi::{c_char, c_int};
use tch::{Kind, Tensor};

/// How many threads the fused kernels' parallel loops (`at::parallel_for` in the native layer) run
/// on, measured with `tasks` tasks: libtorch's intra-op threads ([`tch::get_num_threads`], at most
/// `tasks`) when the native layer is built with OpenMP against libtorch's own runtime (build.rs),
/// 1 when not.
pub fn parallel_for_threads(tasks: usize) -> usize {
    // SAFETY: no pointers; the function only runs a parallel loop.
    unsafe { ffi::plexus_parallel_for_threads(tasks as i64) as usize }
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

/// One gradient tensor for a multi-stream state `H` `[.., n, D]` (`native/src/stream_grad.h`):
/// the fused backwards of H's readers (the write, the read, the dynamic logits' kernel) write or
/// add their gradients into it in the pass that computes them, and [`stream_gather`]'s
/// pass-through hands the sum to autograd, instead of autograd adding three `[.., n, D]`
/// temporaries. A reader given the cell must read the gather's output.
pub struct StreamGrad(Tensor);

impl StreamGrad {
    fn ptr(grad: Option<&StreamGrad>) -> *mut torch_sys::C_tensor {
        grad.map_or(std::ptr::null_mut(), |g| g.0.as_ptr() as *mut _)
    }
}

/// The streams `h` `[.., n, D]` (fp32/fp64) through the pass-through that owns their gradient
/// cell: `(h, the cell)`, the cell to be handed to every fused reader of the returned tensor.
pub fn stream_gather(h: &Tensor) -> Result<(Tensor, StreamGrad)> {
    let cell = Tensor::empty([0], (h.kind(), h.device()));
    let mut out: *mut torch_sys::C_tensor = std::ptr::null_mut();
    // SAFETY: live handles for the call; the C++ side writes a new, caller-owned tensor.
    let err = unsafe { ffi::plexus_stream_gather(h.as_ptr() as *mut _, cell.as_ptr() as *mut _, &mut out) };
    Ok((fused_result(err, out)?, StreamGrad(cell)))
}

/// The read of a multi-stream unit, `u = Σ_s pre[s] H[s]`, as one fused pass forward and one
/// backward (an autograd function): `h` `[.., n, D]`, `pre` `[.., n]` (per token) or `[n]`
/// (static) → `u` `[.., D]`. CPU fp32/fp64 tensors of one dtype (`fused_streams_take`), or fp32
/// tensors on one CUDA device with n ≤ [`CUDA_KERNELS_MAX_STREAMS`] (the CUDA kernels; an error if
/// they cannot run there). `grad`: h's gradient cell, which the backward adds into (or none).
pub fn stream_read_fused(h: &Tensor, pre: &Tensor, grad: Option<&StreamGrad>) -> Result<Tensor> {
    let mut out: *mut torch_sys::C_tensor = std::ptr::null_mut();
    // SAFETY: the inputs are live `at::Tensor*` for the call (the cell null or live); the C++ side
    // only reads them and writes a new, caller-owned handle to `out` when it returns no error.
    let err = unsafe {
        ffi::plexus_stream_read(
            h.as_ptr() as *mut _,
            pre.as_ptr() as *mut _,
            kernel_isa().code(),
            StreamGrad::ptr(grad),
            &mut out,
        )
    };
    fused_result(err, out)
}

/// The write of a multi-stream unit, `H'[t] = Σ_s res[s,t] H[s] + post[t] · o`, as one fused
/// pass forward and one backward: `h` `[.., n, D]`, `res` `[.., n, n]` or `[n, n]`, `post`
/// `[.., n]` or `[n]` (per token or static, as `res`), `o` `[.., D]` → `[.., n, D]`. Devices and
/// dtypes as [`stream_read_fused`]; `grad`: h's gradient cell, which the backward writes (or none).
pub fn stream_write_fused(
    h: &Tensor,
    res: &Tensor,
    post: &Tensor,
    o: &Tensor,
    grad: Option<&StreamGrad>,
) -> Result<Tensor> {
    let mut out: *mut torch_sys::C_tensor = std::ptr::null_mut();
    // SAFETY: as in `stream_read_fused`.
    let err = unsafe {
        ffi::plexus_stream_write(
            h.as_ptr() as *mut _,
            res.as_ptr() as *mut _,
            post.as_ptr() as *mut _,
            o.as_ptr() as *mut _,
            kernel_isa().code(),
            StreamGrad::ptr(grad),
            &mut out,
        )
    };
    fused_result(err, out)
}

/// Whether `sinkhorn` takes `n` streams and `iters` iterations (its per-token scratch,
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

/// The largest number of streams the CUDA kernels take ([`sinkhorn_cuda`], and `stream_read` and
/// `stream_write` on CUDA tensors): a Sinkhorn thread keeps 2·n² values in registers.
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
/// i + threads, …), their partial sums added as the GPU's block sum does. `added_to` (the read
/// only): gH `[M, n, D]` is added to it, as into a stream's gradient cell ([`StreamGrad`]).
pub fn streams_host(
    h: &Tensor,
    weights: &[&Tensor],
    grad: &Tensor,
    threads: usize,
    added_to: Option<&Tensor>,
) -> Result<StreamsHost> {
    let write = match (weights.len(), added_to) {
        (1, None) => 0,
        (1, Some(_)) => 2,
        (3, None) => 1,
        (3, Some(_)) => {
            return Err(NativeError::InvalidArgument("streams_host adds into a gradient for the read only".into()))
        }
        (k, _) => {
            return Err(NativeError::InvalidArgument(format!(
                "streams_host takes [pre] or [res, post, o], not {k} weights"
            )))
        }
    };
    let mut ins: Vec<*mut torch_sys::C_tensor> = weights.iter().map(|t| t.as_ptr() as *mut _).collect();
    ins.push(grad.as_ptr() as *mut _);
    if write != 1 {
        // The read: pre, gu, (nothing), gH₀.
        ins.push(std::ptr::null_mut());
        ins.push(added_to.map_or(std::ptr::null_mut(), |t| t.as_ptr() as *mut _));
    }
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
    Ok(out[..3 + (write == 1) as usize].iter().map(|&p| unsafe { Tensor::from_ptr(p) }).collect())
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

/// `cross_entropy_lm` through plexus' CUDA loss kernels (`native/src/losses.cu`): forward one
/// block per row reads the logits once (an online softmax: the row's log-sum-exp and its loss),
/// backward one block per row reads them once more and writes the gradient in their dtype. bf16 or
/// fp32 logits on a CUDA device; an error (of kind [`NativeError::KernelsUnavailable`] where the
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

/// `rope_heads` through the kernels, or an error.
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

/// `swiglu` through plexus' CUDA kernels (`native/src/activations.cu`): fp32 arithmetic, one
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

/// `norm_to_bf16` through plexus' CUDA norm kernels (`native/src/norms.cu`): forward one block
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

/// Hyper-Connections' dynamic logits through plexus' kernels (chosen by `norm_project_gpu`): `x`
/// `[.., D]`, `gamma`, `beta` `[D]`, `w` `[D, K]` fp32 on a CUDA device or the CPU (the host build),
/// bf16 roundings where `round`; an error where they cannot run. `grad`: x's gradient cell (x being
/// the streams), which the backward adds into (or none).
pub fn norm_project_cuda(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    w: &Tensor,
    eps: f64,
    round: bool,
    grad: Option<&StreamGrad>,
) -> Result<Tensor> {
    let mut out: *mut torch_sys::C_tensor = std::ptr::null_mut();
    // SAFETY: live handles for the call; the C++ side writes a new, caller-owned tensor.
    let err = unsafe {
        ffi::plexus_norm_project_cuda(
            x.as_ptr() as *mut _,
            gamma.as_ptr() as *mut _,
            beta.as_ptr() as *mut _,
            w.as_ptr() as *mut _,
            eps,
            round as i64,
            StreamGrad::ptr(grad),
            &mut out,
        )
    };
    fused_result(err, out)
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

/// The norm-project kernels' per-thread arithmetic run on the CPU (each block as `threads`
/// threads): `[z [R, K], gx [R, D], gγ [D], gβ [D], gW [D, K]]` for `x` `[R, D]`, `γ`, `β` `[D]`,
/// `W` `[D, K]` and `gz` `[R, K]` (fp32), with bf16 roundings where `round`; gx added to
/// `added_to` `[R, D]` where given (as into a gradient cell). For the tests.
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
    added_to: Option<&Tensor>,
) -> Result<[Tensor; 5]> {
    let ts: Vec<Tensor> = [x, gamma, beta, w, gz].iter().map(|t| t.contiguous()).collect();
    let gx0 = added_to.map(|t| t.contiguous());
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
            gx0.as_ref().map_or(std::ptr::null_mut(), |t| t.as_ptr() as *mut _),
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
        return Err(NativeError::InvalidArgument(format!("{what}: {} slots but {} states", slots.len(), states.len())));
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
    attend_through("history_attend", slots, states, |slots, states, k, out| {
        // SAFETY: as in `history_mix`; on success two new, caller-owned tensors in `out`.
        unsafe {
            ffi::plexus_history_attend(
                buf.as_ptr() as *mut _,
                gbuf.as_ptr() as *mut _,
                slots,
                states,
                k,
                q.as_ptr() as *mut _,
                out,
            )
        }
    })
}

/// [`history_attend`]'s arithmetic on the CPU as the fused row loops (`native/src/stream_rows.inc`,
/// in the instruction set of [`kernel_isa`]): rows in parallel, each source read once per row each
/// way, backward adding each source's gradient into its row of `gbuf`. fp32 or fp64 CPU tensors,
/// 1 to [`ATTNRES_MAX_SOURCES`] sources; `(y [.., D], α [.., k])`, α without gradient.
pub fn history_attend_rows(
    buf: &Tensor,
    gbuf: &Tensor,
    slots: &[usize],
    states: &[&Tensor],
    q: &Tensor,
) -> Result<(Tensor, Tensor)> {
    attend_through("history_attend_rows", slots, states, |slots, states, k, out| {
        // SAFETY: as in `history_attend`.
        unsafe {
            ffi::plexus_history_attend_rows(
                buf.as_ptr() as *mut _,
                gbuf.as_ptr() as *mut _,
                slots,
                states,
                k,
                q.as_ptr() as *mut _,
                kernel_isa().code(),
                out,
            )
        }
    })
}

/// One AttnRes entry point: the checked slots and state pointers handed to `call`
/// `(slots, states, k, out) → error string or null`, its two results `(y, α)` taken back.
fn attend_through(
    what: &str,
    slots: &[usize],
    states: &[&Tensor],
    call: impl FnOnce(*const i64, *mut *mut torch_sys::C_tensor, i64, *mut *mut torch_sys::C_tensor) -> *mut c_char,
) -> Result<(Tensor, Tensor)> {
    let (slots, mut ptrs) = history_reads(what, slots, states)?;
    let mut out: [*mut torch_sys::C_tensor; 2] = [std::ptr::null_mut(); 2];
    let err = call(slots.as_ptr(), ptrs.as_mut_ptr(), slots.len() as i64, out.as_mut_ptr());
    let [y, alpha] = fused_results(err, out)?;
    Ok((y, alpha))
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
