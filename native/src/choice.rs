//! The choice between plexus' fused CPU kernel, its CUDA kernel and the composite libtorch code
//! ([`crate::composite`]) for each operation the topologies and models call, by device, dtype,
//! [`crate::setting`] and whether the CUDA kernels run here; and what a CUDA kernel's error means
//! ([`cuda_result`]: fall back where they are unavailable, stop otherwise). Above the bindings
//! ([`crate::kernels`]), which only call the C++.

use super::composite::{sinkhorn_composite, stream_read_composite, stream_write_composite};
use super::kernels::*;
use super::setting::{fused_kernels_on, gpu_paths_on_cpu, stream_grads_gathered};
use super::{NativeError, Result};
use tch::{Kind, Tensor};

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

/// Whether the fused kernels take tensors of this device and dtype: fp32 or fp64 on the CPU, and
/// [`fused_kernels_on`]. Elsewhere (CUDA, bf16) the topologies use their composite libtorch code.
pub fn fused_streams_take(t: &Tensor) -> bool {
    t.device() == tch::Device::Cpu && matches!(t.kind(), tch::Kind::Float | tch::Kind::Double) && fused_kernels_on()
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
    cuda_result(hacn_step(x, acc, h, a))
}

/// Hyper-Connections' dynamic logits `z = LayerNorm(x; γ, β, eps) · W` of the streams `x` `[.., D]`
/// (fp32) with `W = [W_a | w_b]` `[D, K]` (K = n + 2) → `[.., K]` fp32, through plexus' kernels
/// (`native/src/norm_project.cu`: one pass over x each way, the normalised streams never written)
/// where a step takes the GPU's fused paths (a CUDA device, or the CPU under
/// [`gpu_paths_on_cpu`]); `None` elsewhere, where the kernels cannot run, or for K outside 3..=10.
/// With `compute` bf16 the kernels round where the composite's bf16 product does (the normalised
/// streams and W before the product, z after it; backward the same), so that the two differ only
/// in the order of their fp32 sums. `grad`: x's gradient cell (x being the streams of
/// [`gather_stream_grads`]), which the backward adds into.
pub fn norm_project_gpu(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    w: &Tensor,
    eps: f64,
    compute: Kind,
    grad: Option<&StreamGrad>,
) -> Option<Tensor> {
    let k = w.size().get(1).copied().unwrap_or(0);
    let takes = takes_gpu_paths(x)
        && [x, gamma, beta, w].iter().all(|t| t.kind() == Kind::Float)
        && matches!(compute, Kind::Float | Kind::BFloat16)
        && (3..=10).contains(&k);
    if !takes {
        return None;
    }
    cuda_result(norm_project_cuda(x, gamma, beta, w, eps, compute == Kind::BFloat16, grad))
}

/// AttnRes' depth attention over a history where a fused kernel takes it (1 to
/// [`ATTNRES_MAX_SOURCES`] sources): where a step takes the GPU's fused paths (a CUDA device, or
/// the CPU under [`gpu_paths_on_cpu`]) and `buf`, `q` are fp32, [`history_attend`]; on the CPU
/// otherwise, with fp32 or fp64 tensors and the kernels on, its row loops ([`history_attend_rows`]).
/// `None` elsewhere or where the GPU's kernels cannot run (the caller runs its composite).
pub fn history_attend_fused(
    buf: &Tensor,
    gbuf: &Tensor,
    slots: &[usize],
    states: &[&Tensor],
    q: &Tensor,
) -> Option<(Tensor, Tensor)> {
    if !(1..=ATTNRES_MAX_SOURCES).contains(&slots.len()) {
        return None;
    }
    if takes_gpu_paths(buf) {
        let fp32 = buf.kind() == Kind::Float && q.kind() == Kind::Float;
        return if fp32 { cuda_result(history_attend(buf, gbuf, slots, states, q)) } else { None };
    }
    fused_streams_take_all(&[buf, q]).then(|| {
        history_attend_rows(buf, gbuf, slots, states, q).unwrap_or_else(|e| panic!("AttnRes' CPU kernel: {e:#}"))
    })
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
pub fn cuda_result<T>(r: Result<T>) -> Option<T> {
    let e = match r {
        Ok(t) => return Some(t),
        Err(e) => e,
    };
    match e {
        NativeError::KernelsUnavailable(_) => {
            CUDA_KERNELS_UNAVAILABLE.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        // Refused for that call only (the C++ side does not keep it): the kernels may still load
        // on a later eager call.
        NativeError::UnavailableInCapture(_) => {}
        _ => match crate::torch_panic::hint(&e.to_string()) {
            Some(hint) => panic!("plexus' CUDA kernel failed: {e}\n  hint: {hint}"),
            None => panic!("plexus' CUDA kernel failed: {e}"),
        },
    }
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| {
        eprintln!(
            "warning: plexus' CUDA kernels cannot run here, so the step's fused paths (the multi-stream \
             mixing, the language-model loss, the bf16 pre-norms, RoPE, SwiGLU, H-ACN's update, AttnRes' attention) \
             run as composite libtorch operators (the same values, more kernels; PLEXUS_FUSED_KERNELS=0 chooses \
             that without this warning): {e}"
        )
    });
    None
}

/// The read of unit k, `u = Σ_s pre[s] H_s`: `h` `[.., n, D]`, `pre` `[.., n]` or `[n]` → `[.., D]`.
/// On the CPU in fp32/fp64 one fused pass forward and one backward ([`stream_read_fused`]); in
/// fp32 on a GPU the same through plexus' CUDA kernels ([`cuda_fused`]); elsewhere, and if those
/// cannot run, [`stream_read_composite`].
/// `grad`: h's gradient cell ([`gather_stream_grads`]), which the fused backward adds into.
pub fn stream_read(h: &Tensor, pre: &Tensor, grad: Option<&StreamGrad>) -> Tensor {
    if fused_streams_take_all(&[h, pre]) {
        return stream_read_fused(h, pre, grad).unwrap_or_else(|e| panic!("fused stream read: {e:#}"));
    }
    if cuda_fused(&[h, pre], stream_count(h)) {
        if let Some(u) = cuda_result(stream_read_fused(h, pre, grad)) {
            return u;
        }
    }
    stream_read_composite(h, pre)
}

/// The streams `h` `[.., n, D]` of a step that will run backward, through the pass-through that
/// owns their one gradient ([`StreamGrad`], `native/src/stream_grad.h`), where the fused stream
/// kernels take them (fp32/fp64 on the CPU, fp32 on a GPU with the kernels on): `(h, Some(cell))`,
/// the cell for every fused reader of the returned `h` ([`stream_read`], [`stream_write`],
/// [`norm_project_gpu`]); otherwise `(h, None)`, and autograd adds the readers' gradients.
pub fn gather_stream_grads(h: Tensor) -> (Tensor, Option<StreamGrad>) {
    let takes =
        stream_grads_gathered() && h.requires_grad() && (fused_streams_take(&h) || cuda_fused(&[&h], stream_count(&h)));
    if !takes {
        return (h, None);
    }
    match stream_gather(&h) {
        Ok((gathered, cell)) => (gathered, Some(cell)),
        Err(e) => panic!("stream gradient gather: {e:#}"),
    }
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

/// The write of unit k, `H'_t = Σ_s res[s, t] H_s + post[t] · o`: `h` `[.., n, D]`, `res`
/// `[.., n, n]` or `[n, n]`, `post` `[.., n]` or `[n]`, `o` `[.., D]` → `[.., n, D]`. On the CPU in
/// fp32/fp64 one fused pass forward and one backward ([`stream_write_fused`]): the composite
/// version's per-token matrix products and their backwards were most of Hyper-Connections'
/// overhead over residual there. On a GPU with fp32 streams, one kernel each way through plexus'
/// CUDA kernels ([`cuda_fused`]). Elsewhere, and if those cannot run, [`stream_write_composite`].
/// `grad`: h's gradient cell ([`gather_stream_grads`]), which the fused backward writes.
pub fn stream_write(h: &Tensor, res: &Tensor, post: &Tensor, o: &Tensor, grad: Option<&StreamGrad>) -> Tensor {
    if fused_streams_take_all(&[h, res, post, o]) {
        return stream_write_fused(h, res, post, o, grad).unwrap_or_else(|e| panic!("fused stream write: {e:#}"));
    }
    // On a GPU the unit output may be bf16 (autocast's rule) where the streams are fp32: the
    // composite addcmul promotes it, exactly as this conversion does.
    if h.device().is_cuda() {
        let o32 =
            if matches!(o.kind(), Kind::BFloat16 | Kind::Half) { o.to_kind(Kind::Float) } else { o.shallow_clone() };
        if cuda_fused(&[h, res, post, &o32], stream_count(h)) {
            if let Some(out) = cuda_result(stream_write_fused(h, res, post, &o32, grad)) {
                return out;
            }
        }
    }
    stream_write_composite(h, res, post, o)
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
