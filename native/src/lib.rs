//! plexus-native, plexus' native layer as its own crate (as candle keeps candle-kernels): the
//! libtorch calls tch does not expose and plexus' CPU and CUDA kernels, in C++ (`native/src/*.cpp`,
//! `*.cu`, compiled by `native/build.rs` against the same libtorch headers and with the same flags
//! as torch-sys's own C++), behind this safe API. Nothing else in the workspace touches FFI, and
//! nothing here knows of plexus.
//!
//! Every C++ entry point catches all exceptions and returns them as an error block whose first
//! byte is the error's kind, so a libtorch error becomes a [`NativeError`] here (one variant per
//! kind, never told apart by its text) and never unwinds or aborts across the boundary. Every
//! binding returns [`Result`]`<T>` = `Result<T, NativeError>`.
//!
//! The modules, reached by path (`plexus_native::choice::stream_read`; plexus re-exports the crate
//! as `crate::native`):
//! * [`cuda`]: CUDA facts and memory statistics that `tch::Cuda` lacks
//!   ([`cuda::cuda_device_info`], [`cuda::cuda_memory_stats`], …) and the float32 matmul precision
//!   (TF32) switch;
//! * [`cuda_graph`]: whole-step CUDA graphs and their shared memory pool;
//! * [`process_group`]: data-parallel collectives on PyTorch's own distributed engine, c10d
//!   ([`process_group::ProcessGroup`]): TCPStore rendezvous, then ProcessGroupGloo (CPU tensors) or
//!   ProcessGroupNCCL (CUDA tensors); pinned memory;
//! * [`optim`]: the training step's tensor-list operations: gradients dropped
//!   ([`optim::clear_grads`]) and the fused AdamW kernel ([`optim::fused_adamw`]);
//! * [`profile`]: the operator counter behind `bench`'s kernels per step, the host-device sync
//!   watch, the operator trace; [`kineto`]: libtorch's profiler and plexus' scopes;
//! * [`kernels`], the kernels' bindings only: the fused CPU kernels of the multi-stream topologies,
//!   autograd functions with hand-written backwards (`native/src/stream_kernels.cpp`:
//!   [`kernels::stream_read_fused`], [`kernels::stream_write_fused`], [`kernels::sinkhorn_fused`],
//!   [`kernels::norm_project`], [`kernels::rms_project`], [`kernels::hyper_pre`]), whose row loops
//!   are built for baseline x86-64, AVX2 + FMA and AVX-512 and picked by the CPU
//!   ([`setting::KernelIsa`]); one gradient per stream state ([`kernels::StreamGrad`],
//!   `native/src/stream_grad.h`); the language-model loss on bf16 logits without their fp32 copy
//!   (`native/src/losses.cpp`, [`kernels::cross_entropy_chunked`]); the dense topologies' history
//!   buffer (`native/src/history.cpp`, [`kernels::history_push`], [`kernels::history_mix`]); the
//!   CUDA kernels compiled at run time with NVRTC (`native/src/cuda_kernels.cpp`, the kernels in
//!   `native/src/sinkhorn.cu`, `streams.cu`, `losses.cu`, `norms.cu`, `norm_project.cu`,
//!   `activations.cu`, `hacn.cu`, `rope.cu` and `attnres.cu`: [`kernels::sinkhorn_cuda`], the
//!   stream read and write, [`kernels::cross_entropy_cuda`], [`kernels::norm_cuda`],
//!   [`kernels::swiglu_cuda`], [`kernels::rope_cuda`], [`kernels::norm_project_cuda`],
//!   [`kernels::hacn_step`], [`kernels::history_attend`]) and their host builds, which run the
//!   same arithmetic on the CPU for the tests and `doctor` ([`kernels::sinkhorn_cuda_host`],
//!   [`kernels::streams_host`], [`kernels::norm_project_host`], …);
//! * [`composite`]: the libtorch code the kernels fuse (the same values);
//! * [`choice`]: which of the two runs for the tensors at hand ([`choice::stream_read`],
//!   [`choice::stream_write`], [`choice::sinkhorn`], … — the topologies call these), and what a
//!   CUDA kernel's error means ([`choice::cuda_result`]);
//! * [`setting`]: `PLEXUS_FUSED_KERNELS`, the instruction set, the tests' switches.
//!
//! A CPU-only libtorch builds this crate too; the CUDA functions then return an error saying so.
//!
//! The tests of what the crate ships: the unit tests here, and `native/tests/` (the kernels' CPU
//! host builds and fused loops against the composite computation), run by
//! `cargo test -p plexus-native`.
// Every `unsafe` block says why it is sound (clippy, with -D warnings in the checks).
#![warn(clippy::undocumented_unsafe_blocks)]
use std::ffi::{c_char, CStr};

pub mod torch_panic;

/// Whether libtorch is a CUDA build (build.rs found `libtorch_cuda.so`): the C++ was then compiled
/// with the CUDA queries and kernels, and [`cuda_built`] says so too.
pub const BUILT_WITH_CUDA: bool = matches!(env!("PLEXUS_NATIVE_WITH_CUDA").as_bytes(), b"1");

/// Why the C++ was compiled without NCCL (what build.rs did not find, and where it looked); empty
/// when NCCL is in.
pub const NCCL_MISSING: &str = env!("PLEXUS_NATIVE_NCCL_MISSING");

mod ffi {
    use std::ffi::{c_char, c_int, c_void};
    use torch_sys::C_tensor;

    extern "C" {
        pub fn plexus_nccl_built() -> c_int;
        pub fn plexus_gloo_built() -> c_int;
        pub fn plexus_pg_new(
            backend: c_int,
            addr: *const c_char,
            port: u16,
            rank: i64,
            world: i64,
            timeout_ms: i64,
            out: *mut *mut c_void,
        ) -> *mut c_char;
        pub fn plexus_pg_free(pg: *mut c_void);
        pub fn plexus_pg_all_reduce_sum(pg: *mut c_void, tensors: *mut *mut C_tensor, n: usize) -> *mut c_char;
        pub fn plexus_pg_broadcast(pg: *mut c_void, tensor: *mut C_tensor, root: i64) -> *mut c_char;
        pub fn plexus_pg_barrier(pg: *mut c_void) -> *mut c_char;
        pub fn plexus_free_string(s: *mut c_char);
        #[cfg(test)]
        pub fn plexus_fail_with(kind: c_int, message: *const c_char) -> *mut c_char;
        pub fn plexus_cuda_built() -> c_int;
        pub fn plexus_cuda_driver_version(out: *mut c_int) -> *mut c_char;
        pub fn plexus_cuda_runtime_version(out: *mut c_int) -> *mut c_char;
        pub fn plexus_cuda_device_info(
            index: i64,
            name: *mut *mut c_char,
            major: *mut c_int,
            minor: *mut c_int,
            total_memory: *mut u64,
            multiprocessors: *mut c_int,
        ) -> *mut c_char;
        pub fn plexus_cuda_memory_stats(index: i64, out: *mut u64) -> *mut c_char;
        pub fn plexus_cuda_reset_peak_memory(index: i64) -> *mut c_char;
        pub fn plexus_set_float32_matmul_precision(p: *const c_char) -> *mut c_char;
        pub fn plexus_float32_matmul_precision(out: *mut *mut c_char) -> *mut c_char;
        pub fn plexus_pin_memory(t: *mut C_tensor, out: *mut *mut C_tensor) -> *mut c_char;
        pub fn plexus_op_count_begin() -> *mut c_char;
        pub fn plexus_clear_grads(ts: *mut *mut C_tensor, n: i64) -> *mut c_char;
        pub fn plexus_fused_adamw(
            params: *mut *mut C_tensor,
            grads: *mut *mut C_tensor,
            exp_avgs: *mut *mut C_tensor,
            exp_avg_sqs: *mut *mut C_tensor,
            n: i64,
            step: *mut C_tensor,
            lr: *mut C_tensor,
            beta1: f64,
            beta2: f64,
            weight_decay: f64,
            eps: f64,
        ) -> *mut c_char;
        pub fn plexus_op_count_end(out: *mut u64, names: *mut *mut c_char) -> *mut c_char;
        pub fn plexus_cuda_graphs_built() -> c_int;
        pub fn plexus_cuda_graph_new(device: i64, out: *mut *mut c_void) -> *mut c_char;
        pub fn plexus_cuda_graph_free(g: *mut c_void);
        pub fn plexus_cuda_graph_enter(g: *mut c_void) -> *mut c_char;
        pub fn plexus_cuda_graph_leave(g: *mut c_void) -> *mut c_char;
        pub fn plexus_op_is_metadata(name: *const c_char) -> c_int;
        pub fn plexus_kineto_begin(cuda: c_int) -> *mut c_char;
        pub fn plexus_kineto_end(trace: *const c_char, events: *mut *mut c_char) -> *mut c_char;
        pub fn plexus_scope_begin(name: *const c_char) -> *mut c_void;
        pub fn plexus_scope_end(scope: *mut c_void);
        pub fn plexus_cuda_graph_pool_handle(out: *mut u64) -> *mut c_char;
        pub fn plexus_cuda_graph_capture_begin(g: *mut c_void, pool_first: u64, pool_second: u64) -> *mut c_char;
        pub fn plexus_cuda_graph_capture_end(g: *mut c_void) -> *mut c_char;
        pub fn plexus_cuda_graph_replay(g: *mut c_void) -> *mut c_char;
        pub fn plexus_op_trace_begin() -> *mut c_char;
        pub fn plexus_op_trace_end(text: *mut *mut c_char) -> *mut c_char;
        pub fn plexus_sync_watch_start() -> *mut c_char;
        pub fn plexus_sync_watch_read(
            active: *mut c_int,
            total: *mut u64,
            thread: *mut u64,
            names: *mut *mut c_char,
        ) -> *mut c_char;
        pub fn plexus_sinkhorn_fits(n: i64, iters: i64) -> c_int;
        pub fn plexus_stream_kernels_best_isa() -> i64;
        pub fn plexus_stream_kernels_cpu_runs(isa: i64) -> c_int;
        pub fn plexus_stream_gather(h: *mut C_tensor, cell: *mut C_tensor, out: *mut *mut C_tensor) -> *mut c_char;
        pub fn plexus_stream_read(
            h: *mut C_tensor,
            pre: *mut C_tensor,
            isa: i64,
            cell: *mut C_tensor,
            out: *mut *mut C_tensor,
        ) -> *mut c_char;
        pub fn plexus_stream_write(
            h: *mut C_tensor,
            res: *mut C_tensor,
            post: *mut C_tensor,
            o: *mut C_tensor,
            isa: i64,
            cell: *mut C_tensor,
            out: *mut *mut C_tensor,
        ) -> *mut c_char;
        pub fn plexus_sinkhorn(logits: *mut C_tensor, iters: i64, isa: i64, out: *mut *mut C_tensor) -> *mut c_char;
        pub fn plexus_rms_project(
            v: *mut C_tensor,
            phi: *mut C_tensor,
            bf16: i64,
            out: *mut *mut C_tensor,
        ) -> *mut c_char;
        pub fn plexus_sinkhorn_cuda(logits: *mut C_tensor, iters: i64, out: *mut *mut C_tensor) -> *mut c_char;
        pub fn plexus_sinkhorn_host(
            logits: *mut C_tensor,
            grad: *mut C_tensor,
            iters: i64,
            out: *mut *mut C_tensor,
            grad_logits: *mut *mut C_tensor,
        ) -> *mut c_char;
        pub fn plexus_streams_host(
            write: i64,
            threads: i64,
            a: *mut C_tensor,
            b: *mut C_tensor,
            c: *mut C_tensor,
            d: *mut C_tensor,
            e: *mut C_tensor,
            out: *mut *mut C_tensor,
        ) -> *mut c_char;
        pub fn plexus_cuda_kernels_compile(
            n: i64,
            arch: i64,
            image_bytes: *mut i64,
            target: *mut *mut c_char,
            log: *mut *mut c_char,
        ) -> *mut c_char;
        pub fn plexus_nvrtc_version(version: *mut c_int, path: *mut *mut c_char) -> *mut c_char;
        pub fn plexus_rope_cuda(
            x: *mut C_tensor,
            cs: *mut C_tensor,
            sn: *mut C_tensor,
            heads: i64,
            out: *mut *mut C_tensor,
        ) -> *mut c_char;
        pub fn plexus_rope_host(
            x: *mut C_tensor,
            cs: *mut C_tensor,
            sn: *mut C_tensor,
            gy: *mut C_tensor,
            heads: i64,
            out: *mut *mut C_tensor,
        ) -> *mut c_char;
        pub fn plexus_swiglu_cuda(g: *mut C_tensor, u: *mut C_tensor, out: *mut *mut C_tensor) -> *mut c_char;
        pub fn plexus_swiglu_host(
            g: *mut C_tensor,
            u: *mut C_tensor,
            gh: *mut C_tensor,
            out: *mut *mut C_tensor,
        ) -> *mut c_char;
        pub fn plexus_norm_cuda(
            x: *mut C_tensor,
            w: *mut C_tensor,
            b: *mut C_tensor,
            eps: f64,
            layer: i64,
            out: *mut *mut C_tensor,
        ) -> *mut c_char;
        pub fn plexus_norm_host(
            x: *mut C_tensor,
            w: *mut C_tensor,
            b: *mut C_tensor,
            gy: *mut C_tensor,
            eps: f64,
            layer: i64,
            threads: i64,
            out: *mut *mut C_tensor,
        ) -> *mut c_char;
        pub fn plexus_hacn_step(
            x: *mut C_tensor,
            acc: *mut C_tensor,
            h: *mut C_tensor,
            a: *mut C_tensor,
            out: *mut *mut C_tensor,
        ) -> *mut c_char;
        pub fn plexus_norm_project_cuda(
            x: *mut C_tensor,
            gamma: *mut C_tensor,
            beta: *mut C_tensor,
            w: *mut C_tensor,
            eps: f64,
            round: i64,
            cell: *mut C_tensor,
            out: *mut *mut C_tensor,
        ) -> *mut c_char;
        pub fn plexus_norm_project_host(
            x: *mut C_tensor,
            gamma: *mut C_tensor,
            beta: *mut C_tensor,
            w: *mut C_tensor,
            gz: *mut C_tensor,
            eps: f64,
            round: i64,
            threads: i64,
            gx_in: *mut C_tensor,
            out: *mut *mut C_tensor,
        ) -> *mut c_char;
        pub fn plexus_cross_entropy_cuda(
            logits: *mut C_tensor,
            target: *mut C_tensor,
            out: *mut *mut C_tensor,
        ) -> *mut c_char;
        pub fn plexus_cross_entropy_host(
            logits: *mut C_tensor,
            target: *mut C_tensor,
            scale: f64,
            threads: i64,
            out: *mut *mut C_tensor,
        ) -> *mut c_char;
        pub fn plexus_cross_entropy_chunked(
            logits: *mut C_tensor,
            target: *mut C_tensor,
            chunk: i64,
            out: *mut *mut C_tensor,
        ) -> *mut c_char;
        pub fn plexus_history_push(
            buf: *mut C_tensor,
            gbuf: *mut C_tensor,
            slot: i64,
            x: *mut C_tensor,
            out: *mut *mut C_tensor,
        ) -> *mut c_char;
        pub fn plexus_history_mix(
            buf: *mut C_tensor,
            gbuf: *mut C_tensor,
            slots: *const i64,
            states: *mut *mut C_tensor,
            k: i64,
            w: *mut C_tensor,
            out: *mut *mut C_tensor,
        ) -> *mut c_char;
        pub fn plexus_history_attend(
            buf: *mut C_tensor,
            gbuf: *mut C_tensor,
            slots: *const i64,
            states: *mut *mut C_tensor,
            k: i64,
            q: *mut C_tensor,
            out: *mut *mut C_tensor,
        ) -> *mut c_char;
        pub fn plexus_history_attend_rows(
            buf: *mut C_tensor,
            gbuf: *mut C_tensor,
            slots: *const i64,
            states: *mut *mut C_tensor,
            k: i64,
            q: *mut C_tensor,
            isa: i64,
            outs: *mut *mut C_tensor,
        ) -> *mut c_char;
        pub fn plexus_norm_project(
            x: *mut C_tensor,
            gamma: *mut C_tensor,
            beta: *mut C_tensor,
            w: *mut C_tensor,
            eps: f64,
            isa: i64,
            out: *mut *mut C_tensor,
        ) -> *mut c_char;
        /// `params`: γ, β, W_a, w_b, A_static, B_static, s_a, s_b ([`super::HyperPreParams`]).
        pub fn plexus_hyper_pre(
            h: *mut C_tensor,
            params: *const *mut C_tensor,
            eps: f64,
            isa: i64,
            outs: *mut *mut C_tensor,
        ) -> *mut c_char;
        pub fn plexus_parallel_for_threads(tasks: i64) -> i64;
    }
}

/// Takes ownership of a string malloc'd by the C++ side (NULL gives an empty string).
fn take_string(s: *mut c_char) -> String {
    if s.is_null() {
        return String::new();
    }
    // SAFETY: the C++ side returns NUL-terminated strings allocated with malloc, freed only here.
    let out = unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned();
    // SAFETY: as above; not used after this.
    unsafe { ffi::plexus_free_string(s) };
    out
}

/// The error of a native call. The C++ side's errors arrive as one of the first three variants,
/// chosen by the kind byte that opens its error block (`ErrorKind` in `native/src/guarded.h`, in
/// that order), never by their text; the others are what the Rust side refuses or cannot read
/// before or after a call. Each displays as its message alone, as libtorch or plexus wrote it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NativeError {
    /// Kind byte 1 (or any byte this side does not know): a libtorch error, a bad argument the C++
    /// side caught, a failed kernel launch.
    #[error("{0}")]
    Failed(String),
    /// Kind byte 2: plexus' CUDA kernels cannot run here (no NVRTC or driver, a failed first-use
    /// check); [`choice::cuda_result`] then falls back to the composite code for good.
    #[error("{0}")]
    KernelsUnavailable(String),
    /// Kind byte 3: the kernels' first use would fall inside a CUDA graph capture; refused for
    /// this call only.
    #[error("{0}")]
    UnavailableInCapture(String),
    /// An argument or a call refused on the Rust side before any C++ runs: lists of different
    /// lengths, a rank or device index out of range, a NUL byte in a string, a feature this build
    /// lacks, a count or profile inside another.
    #[error("{0}")]
    InvalidArgument(String),
    /// An environment variable the native layer reads (`PLEXUS_FUSED_KERNELS`,
    /// `PLEXUS_COUNT_SYNCS`) set to a value it does not take.
    #[error("{0}")]
    InvalidSetting(String),
    /// What the C++ side handed back could not be read: a null handle, a profiler event line of
    /// the wrong shape.
    #[error("{0}")]
    Malformed(String),
    /// A collective of a process group failed: which one, on which rank, and the error of the call
    /// (kept whole, so its kind is still there to match).
    #[error("{op} on rank {rank} of {world_size} ({backend:?}) failed: {error}")]
    Collective {
        /// The collective: `all_reduce`, `broadcast` or `barrier`.
        op: &'static str,
        /// This process's rank.
        rank: usize,
        /// The group's size.
        world_size: usize,
        /// The group's backend.
        backend: Backend,
        /// The call's own error.
        error: Box<NativeError>,
    },
}

/// The c10d backend a process group runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Gloo: CPU tensors, TCP between processes.
    Gloo,
    /// NCCL: CUDA tensors, one GPU per rank.
    Nccl,
}

/// What every binding of this crate returns.
pub type Result<T> = std::result::Result<T, NativeError>;

/// Turns the error convention of every entry point (NULL, or a malloc'd block: the kind's byte,
/// then the NUL-terminated message) into a `Result` with a [`NativeError`].
fn check(err: *mut c_char) -> Result<()> {
    if err.is_null() {
        return Ok(());
    }
    // SAFETY: a non-null error is a block from `dup_error` (guarded.h): one byte of kind, then a
    // NUL-terminated message; it is freed here, once, after both are read.
    let (code, message) = unsafe { (*err.cast::<u8>(), CStr::from_ptr(err.add(1)).to_string_lossy().into_owned()) };
    // SAFETY: allocated with malloc by the C++ side and not used after this.
    unsafe { ffi::plexus_free_string(err) };
    Err(match code {
        2 => NativeError::KernelsUnavailable(message),
        3 => NativeError::UnavailableInCapture(message),
        _ => NativeError::Failed(message),
    })
}

fn device_index(index: usize) -> Result<i64> {
    i64::try_from(index).map_err(|_| NativeError::InvalidArgument(format!("CUDA device index {index} is out of range")))
}

pub mod choice;
pub mod composite;
pub mod cuda;
pub mod cuda_graph;
pub mod kernels;
pub mod kineto;
pub mod optim;
pub mod process_group;
pub mod profile;
pub mod setting;

#[cfg(test)]
mod tests {
    use super::choice::{self, cuda_result};
    use super::cuda_graph::{cuda_graphs_built, CudaGraph};
    use super::kernels::*;
    use super::profile::{sync_count, trace_ops, watch_syncs};
    use super::setting::*;
    use super::*;
    use tch::Tensor;

    /// The value of a one-element tensor as f64 (a host read).
    fn scalar(t: &Tensor) -> f64 {
        t.to_kind(tch::Kind::Double).double_value(&[])
    }

    /// libtorch's own record of the operators that wait for the device: a read through tch
    /// (`double_value`, `int64_value`), a `nonzero`, a bool of a tensor, each counted once;
    /// `masked_select` once although it may call `nonzero`; arithmetic, views and a CPU → CPU copy
    /// not at all. Counted on this thread, so tests running beside it do not enter the count.
    #[test]
    fn the_sync_watch_counts_reads_hidden_in_operators() {
        let mine = || sync_count().map(|c| c.this_thread);
        watch_syncs().unwrap();
        watch_syncs().unwrap();
        let start = mine().expect("watching");
        let t = Tensor::from_slice(&[1.0f32, -2.0, 3.0]);
        let u = (&t * 2.0 + 1.0).view([3, 1]).transpose(0, 1).contiguous();
        let _ = u.copy();
        assert_eq!(mine().unwrap() - start, 0, "no sync in arithmetic, views and copies on the CPU");
        assert_eq!(t.sum(tch::Kind::Float).double_value(&[]), 2.0);
        assert_eq!(mine().unwrap() - start, 1);
        assert_eq!(t.gt(0.0).nonzero().size(), [2, 1]);
        assert_eq!(mine().unwrap() - start, 2);
        assert_eq!(t.masked_select(&t.gt(0.0)).size(), [2]);
        assert_eq!(mine().unwrap() - start, 3);
        assert_eq!(t.argmax(0, false).int64_value(&[]), 2);
        assert_eq!(mine().unwrap() - start, 4);
        let count = sync_count().unwrap();
        assert!(count.total >= 4, "{count:?}");
        assert!(count.by_name.iter().any(|(n, c)| n == "aten::_local_scalar_dense" && *c >= 2), "{count:?}");
    }

    /// An error of each kind crosses the boundary as that variant with its message (the C++ side's
    /// `ErrorKind`, guarded.h: read from the error block, not from the text); the CUDA kernels'
    /// unavailability falls back to the composite code and keeps later calls off the kernels, a
    /// refusal inside a capture holds for that call only, and any other kernel error ends the run.
    #[test]
    fn native_errors_keep_their_kind_and_only_unavailable_kernels_fall_back() {
        let fail = |kind: i32, message: &str| {
            let text = std::ffi::CString::new(message).unwrap();
            // SAFETY: a NUL-terminated message live for the call; the error block is freed by check.
            check(unsafe { ffi::plexus_fail_with(kind, text.as_ptr()) }).unwrap_err()
        };
        let m = || "the message".to_string();
        for (code, want) in [
            (1, NativeError::Failed(m())),
            (2, NativeError::KernelsUnavailable(m())),
            (3, NativeError::UnavailableInCapture(m())),
            (9, NativeError::Failed(m())),
        ] {
            assert_eq!(fail(code, "the message"), want);
        }
        assert_eq!(format!("{}", fail(2, "libnvrtc.so.13 not found")), "libnvrtc.so.13 not found");
        // Any other error of an entry point (a bad argument here) is a failure.
        let (buf, q) = (
            Tensor::zeros([2, 6], (tch::Kind::Float, tch::Device::Cpu)),
            Tensor::zeros([4], (tch::Kind::Float, tch::Device::Cpu)),
        );
        let e = history_attend(&buf, &buf, &[0], &[&buf.get(0)], &q).unwrap_err();
        assert!(matches!(e, NativeError::Failed(_)), "{e:?}");

        let unavailable = fail(2, "plexus' CUDA kernels are unavailable: libnvrtc.so.13 not found");
        assert!(cuda_result::<Tensor>(Err(unavailable)).is_none());
        assert!(choice::cuda_kernels_unavailable(), "later calls skip the kernels");
        choice::reset_cuda_kernels_unavailable();
        assert!(cuda_result::<Tensor>(Err(fail(3, "their first use on this device is inside a CUDA graph capture")))
            .is_none());
        assert!(!choice::cuda_kernels_unavailable(), "a refusal inside a capture holds for that call only");
        // The kind decides, not the text: an unavailability's words in a failure still end the run.
        let failed = std::panic::catch_unwind(|| {
            cuda_result::<Tensor>(Err(fail(
                1,
                "cuLaunchKernel: an illegal address (plexus' CUDA kernels are unavailable: )",
            )))
        });
        let message = failed.expect_err("a launch failure must not fall back");
        let text = message.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(text.contains("illegal address"), "{text}");
        assert!(!choice::cuda_kernels_unavailable());
        let oom = std::panic::catch_unwind(|| {
            cuda_result::<Tensor>(Err(NativeError::Failed("CUDA out of memory. Tried to allocate".into())))
        });
        let text = oom.expect_err("out of memory").downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(text.contains("data.batch_size"), "the out-of-memory advice: {text}");
    }

    #[test]
    fn the_fused_kernels_switch_takes_0_1_true_false_avx2_baseline_cuda_host_and_names_itself_otherwise() {
        assert_eq!(parse_fused_kernels(None).unwrap(), FusedKernels::Best);
        for (v, want) in [
            ("1", FusedKernels::Best),
            ("true", FusedKernels::Best),
            (" TRUE ", FusedKernels::Best),
            ("Baseline", FusedKernels::Baseline),
            ("avx2", FusedKernels::Avx2),
            ("0", FusedKernels::Off),
            ("false", FusedKernels::Off),
            ("cuda-host", FusedKernels::CudaHost),
        ] {
            assert_eq!(parse_fused_kernels(Some(v)).unwrap(), want, "{v:?}");
        }
        for (blank, said) in [("", "set to nothing"), (" ", "only blanks (\" \")")] {
            let e = parse_fused_kernels(Some(blank)).unwrap_err().to_string();
            assert!(e.contains(said) && e.contains("unset it"), "{e}");
        }
        let e = parse_fused_kernels(Some("maybe")).unwrap_err().to_string();
        assert!(
            e.contains("PLEXUS_FUSED_KERNELS")
                && e.contains("maybe")
                && e.contains("avx2")
                && e.contains("0/false")
                && e.contains("cuda-host"),
            "{e}"
        );
        let outer = fused_kernels_on();
        assert!(!with_fused_kernels(false, fused_kernels_on));
        assert!(with_fused_kernels(false, || with_fused_kernels(true, fused_kernels_on)));
        assert_eq!(fused_kernels_on(), outer, "the setting is restored");
        let outer = kernel_isa();
        assert_eq!(with_kernel_isa(KernelIsa::Baseline, kernel_isa), KernelIsa::Baseline);
        assert_eq!(kernel_isa(), outer, "the instruction set is restored");
    }

    /// The fused kernels' loops use libtorch's threads: `at::parallel_for` is a header template that
    /// runs on one thread in a file compiled without OpenMP, as the native layer was until build.rs
    /// passed `-fopenmp` (the kernels ran half as fast as they could on 2 cores).
    #[test]
    fn the_fused_kernels_run_on_libtorch_threads() {
        let threads = tch::get_num_threads().max(1) as usize;
        assert_eq!(parallel_for_threads(64), threads.min(64), "libtorch has {threads} intra-op threads");
        assert_eq!(parallel_for_threads(1), 1);
    }

    /// A wider instruction set than the CPU has is refused with an error naming it, not run.
    #[test]
    fn an_instruction_set_the_cpu_lacks_is_refused() {
        let h = Tensor::ones([3, 2, 8], (tch::Kind::Float, tch::Device::Cpu));
        let pre = Tensor::ones([2], (tch::Kind::Float, tch::Device::Cpu));
        let mut out: *mut torch_sys::C_tensor = std::ptr::null_mut();
        for bad in [3i64, -1] {
            // SAFETY: as in `stream_read_fused`.
            let err = unsafe {
                ffi::plexus_stream_read(
                    h.as_ptr() as *mut _,
                    pre.as_ptr() as *mut _,
                    bad,
                    std::ptr::null_mut(),
                    &mut out,
                )
            };
            let e = fused_result(err, out).unwrap_err().to_string();
            assert!(e.contains("instruction set") && e.contains(&bad.to_string()), "{e}");
        }
        let u = with_kernel_isa(KernelIsa::Baseline, || stream_read_fused(&h, &pre, None)).unwrap();
        assert_eq!(u.size(), [3, 8]);
        assert_eq!(u.sum(tch::Kind::Float).double_value(&[]), 48.0);
        for isa in KernelIsa::ALL {
            let result = with_kernel_isa(isa, || stream_read_fused(&h, &pre, None));
            if isa.runs_here() {
                assert_eq!(result.unwrap().sum(tch::Kind::Float).double_value(&[]), 48.0, "{}", isa.name());
            } else {
                let e = result.unwrap_err().to_string();
                assert!(e.contains("instruction set") && e.contains("AVX-512"), "{e}");
            }
        }
        assert!(KernelIsa::best().runs_here(), "the default set runs here");
        assert_eq!(kernel_isas().first(), Some(&KernelIsa::Baseline));
    }

    /// The chunked cross-entropy against libtorch's own `cross_entropy` on fp32 logits (what
    /// PyTorch's autocast runs: the bf16 logits cast to fp32): the loss and the logits' gradient,
    /// for bf16 (the gradient then rounded once to bf16 either way: at most one bf16 unit apart),
    /// fp32 and fp64 logits, one chunk and chunks of 1, 3 and 7 rows over 10; bad shapes refused.
    #[test]
    fn the_chunked_cross_entropy_equals_autocasts_fp32_cross_entropy() {
        let cpu = tch::Device::Cpu;
        let target = Tensor::from_slice(&[3i64, 0, 12, 7, 7, 1, 12, 5, 0, 2]);
        for kind in [tch::Kind::BFloat16, tch::Kind::Float, tch::Kind::Double] {
            for rows in [100, 1, 3, 7] {
                let base = (Tensor::arange(10 * 13, (tch::Kind::Double, cpu)).reshape([10, 13]) * 0.71).sin() * 6.0;
                let g = Tensor::from_slice(&[1.7f32]).reshape([]);
                let x_ref = base.to_kind(kind).detach().set_requires_grad(true);
                let want = x_ref.to_kind(tch::Kind::Float).cross_entropy_for_logits(&target);
                (&want * &g).backward();
                let x = base.to_kind(kind).detach().set_requires_grad(true);
                let got = cross_entropy_in_chunks(&x, &target, rows).unwrap();
                assert_eq!((got.kind(), got.dim()), (tch::Kind::Float, 0));
                (&got * &g).backward();
                let (w, v) = (scalar(&want), scalar(&got));
                assert!((w - v).abs() <= 1e-6 * w.abs(), "{kind:?} rows {rows}: loss {v} against {w}");
                let (gx, gr) = (x.grad(), x_ref.grad());
                assert_eq!(gx.kind(), kind);
                let scale = scalar(&gr.abs().max());
                let err = scalar(&(gx.to_kind(tch::Kind::Double) - gr.to_kind(tch::Kind::Double)).abs().max());
                let tol = if kind == tch::Kind::BFloat16 { scale / 128.0 } else { 1e-6 * scale };
                assert!(err <= tol, "{kind:?} rows {rows}: gradient off by {err:e} (scale {scale:e})");
            }
        }
        let x = Tensor::zeros([4, 5], (tch::Kind::Float, cpu));
        let e = cross_entropy_in_chunks(&x, &Tensor::zeros([3], (tch::Kind::Int64, cpu)), 2).unwrap_err();
        assert!(e.to_string().contains("target must be int64 [N]"), "{e}");
        let e = cross_entropy_in_chunks(&x, &Tensor::zeros([4], (tch::Kind::Int64, cpu)), 0).unwrap_err();
        assert!(e.to_string().contains("at least 1 row"), "{e}");
    }

    /// The CUDA loss kernels' arithmetic (run on the CPU, each row's block as 1, 7 and 256 threads)
    /// against libtorch's fp32 `cross_entropy` of the same logits and an fp64 reference: the loss
    /// and the log-sum-exps no further from fp64 than 8× libtorch's error plus 4 fp32 units; the
    /// gradient, in the logits' dtype, at most one bf16 unit (bf16) or 1e-6 (fp32) from libtorch's
    /// rounded once; a target outside 0..V gives a NaN loss for its row only.
    #[test]
    fn the_cuda_loss_kernels_arithmetic_equals_libtorchs_cross_entropy() {
        use tch::Kind;
        let (n, v) = (6i64, 1000i64);
        let target = Tensor::from_slice(&[3i64, 0, 999, 517, 517, 12]);
        let base = (Tensor::arange(n * v, (Kind::Double, tch::Device::Cpu)).reshape([n, v]) * 0.37).sin() * 8.0;
        let scale = 1.7 / n as f64;
        for kind in [Kind::BFloat16, Kind::Float] {
            let x = base.to_kind(kind);
            // libtorch's fp32 loss and gradient (g = 1.7), and the fp64 truth of the same inputs.
            let x_ref = x.detach().set_requires_grad(true);
            let want = x_ref.to_kind(Kind::Float).cross_entropy_for_logits(&target);
            (&want * 1.7).backward();
            let x64 = x.to_kind(Kind::Double);
            let lse64 = x64.logsumexp([1], false);
            let loss64 = (&lse64 - x64.gather(1, &target.unsqueeze(1), false).squeeze_dim(1)).mean(Kind::Double);
            for threads in [1, 7, 256] {
                let (lse, rows, grad) = cross_entropy_host(&x, &target, scale, threads).unwrap();
                assert_eq!((lse.kind(), rows.kind(), grad.kind()), (Kind::Float, Kind::Float, kind));
                let ulp = f64::from(f32::EPSILON);
                let err = |a: &Tensor, b: &Tensor| {
                    scalar(&(a.to_kind(Kind::Double) - b).abs().max()) / scalar(&b.abs().max()).max(1.0)
                };
                let (e_lse, e_loss) = (err(&lse, &lse64), err(&rows.mean(Kind::Double), &loss64));
                let e_ref = err(&want.detach(), &loss64);
                assert!(e_lse <= 4.0 * ulp, "{kind:?} threads {threads}: lse off by {e_lse:e}");
                assert!(
                    e_loss <= 8.0 * e_ref + 4.0 * ulp,
                    "{kind:?} threads {threads}: loss {e_loss:e}, libtorch {e_ref:e}"
                );
                let gr = x_ref.grad();
                let g_scale = scalar(&gr.abs().max());
                let g_err = scalar(&(grad.to_kind(Kind::Double) - gr.to_kind(Kind::Double)).abs().max());
                let tol = if kind == Kind::BFloat16 { g_scale / 128.0 } else { 1e-6 * g_scale };
                assert!(g_err <= tol, "{kind:?} threads {threads}: gradient off by {g_err:e} (scale {g_scale:e})");
            }
        }
        let bad = Tensor::from_slice(&[3i64, 0, 1000, 517, -1, 12]);
        let (_, rows, _) = cross_entropy_host(&base.to_kind(Kind::Float), &bad, 1.0, 32).unwrap();
        let nan: Vec<bool> = (0..n).map(|i| scalar(&rows.get(i)).is_nan()).collect();
        assert_eq!(nan, [false, false, true, false, true, false]);
    }

    /// The CUDA norm kernels' arithmetic (run on the CPU, each block as 1, 7 and 256 threads)
    /// against libtorch's fp32 `layer_norm` / `rms_norm` followed by the cast to bf16, and fp64:
    /// the bf16 output at most one bf16 unit from libtorch's, the input's, weight's and bias's
    /// gradients no further from fp64 than 8× libtorch's error plus 4 fp32 units.
    #[test]
    fn the_cuda_norm_kernels_arithmetic_equals_libtorchs_norms() {
        use tch::{Device, Kind};
        let (r, d) = (70i64, 300i64);
        let grid = |phase: f64, shape: &[i64]| {
            let n: i64 = shape.iter().product();
            (Tensor::arange(n, (Kind::Double, Device::Cpu)) * phase).sin().reshape(shape)
        };
        let x = (grid(0.43, &[r, d]) * 3.0 + 0.5).to_kind(Kind::Float);
        let w = (grid(1.3, &[d]) + 1.0).to_kind(Kind::Float);
        let b = grid(2.1, &[d]).to_kind(Kind::Float);
        let gy = grid(0.77, &[r, d]).to_kind(Kind::BFloat16);
        for kind in [NormKind::Layer, NormKind::Rms] {
            let bias = (kind == NormKind::Layer).then_some(&b);
            // libtorch at `dtype` (fp32, or fp64 for the truth): output, then the gradients of x, w, b.
            let libtorch = |dtype: Kind| {
                let leaf = |t: &Tensor| t.to_kind(dtype).detach().set_requires_grad(true);
                let (xv, wv, bv) = (leaf(&x), leaf(&w), leaf(&b));
                let y = match kind {
                    NormKind::Layer => xv.layer_norm([d], Some(&wv), Some(&bv), 1e-5, false),
                    NormKind::Rms => xv.rms_norm([d], Some(&wv), 1e-5),
                };
                (&y * gy.to_kind(dtype)).sum(dtype).backward();
                (y.detach(), xv.grad(), wv.grad(), bv.grad())
            };
            let (y32, gx32, gw32, gb32) = libtorch(Kind::Float);
            let (_, gx64, gw64, gb64) = libtorch(Kind::Double);
            let err = |a: &Tensor, truth: &Tensor| {
                scalar(&(a.to_kind(Kind::Double) - truth).abs().max()) / scalar(&truth.abs().max()).max(1e-30)
            };
            let ulp = f64::from(f32::EPSILON);
            for threads in [1, 7, 256] {
                let [y, gx, gw, gb] = norm_host(&x, &w, bias, &gy, 1e-5, kind, threads).unwrap();
                assert_eq!(y.kind(), Kind::BFloat16);
                let scale = scalar(&y32.abs().max());
                let dy =
                    scalar(&(y.to_kind(Kind::Double) - y32.to_kind(Kind::BFloat16).to_kind(Kind::Double)).abs().max());
                assert!(dy <= scale / 128.0, "{kind:?} threads {threads}: output off by {dy:e}");
                let mut pairs = vec![("input", &gx, &gx32, &gx64), ("weight", &gw, &gw32, &gw64)];
                if kind == NormKind::Layer {
                    pairs.push(("bias", &gb, &gb32, &gb64));
                }
                for (what, got, lt, truth) in pairs {
                    let (e, e_ref) = (err(got, truth), err(lt, truth));
                    assert!(
                        e <= 8.0 * e_ref + 4.0 * ulp,
                        "{kind:?} threads {threads}: {what} gradient {e:e}, libtorch {e_ref:e}"
                    );
                }
            }
        }
    }

    /// Hyper-Connections' dynamic-logit kernels' arithmetic (run on the CPU, each block as 1, 7 and
    /// 256 threads, n = 1, 4, 8) against the composite they replace — libtorch's LayerNorm and
    /// product, in fp32, and with the bf16 product's casts — and fp64. fp32: z and every gradient
    /// (x, γ, β, W) no further from fp64 than 8× the composite's error plus 4 units of fp32. bf16:
    /// the roundings are the composite's, so the two differ only where an fp32 sum taken in another
    /// order tips a bf16 rounding to its neighbour — rare, and by one bf16 unit — and otherwise by
    /// fp32 roundoff: at most 2 % of the elements of each tensor more than 2⁻¹⁶ of its largest
    /// magnitude apart, none more than 2⁻⁷ (a rounding left out would move most elements by about
    /// 2⁻⁹); z and W's gradient are bf16 values.
    #[test]
    fn the_norm_project_kernels_arithmetic_equals_the_composite() {
        use tch::{Device, Kind};
        let (r, d) = (70i64, 300i64);
        let grid = |phase: f64, shape: &[i64]| {
            let n: i64 = shape.iter().product();
            (Tensor::arange(n, (Kind::Double, Device::Cpu)) * phase).sin().reshape(shape)
        };
        let x = (grid(0.43, &[r, d]) * 3.0 + 0.5).to_kind(Kind::Float);
        let gamma = (grid(1.3, &[d]) + 1.0).to_kind(Kind::Float);
        let beta = grid(2.1, &[d]).to_kind(Kind::Float);
        for n in [1i64, 4, 8] {
            let k = n + 2;
            let w = (grid(0.91, &[d, k]) * 0.1).to_kind(Kind::Float);
            let gz = grid(1.7, &[r, k]).to_kind(Kind::Float);
            // The composite at `dtype`, its product in `compute`: [z, gx, gγ, gβ, gW].
            let composite = |dtype: Kind, compute: Kind| {
                let leaf = |t: &Tensor| t.to_kind(dtype).detach().set_requires_grad(true);
                let (xv, gv, bv, wv) = (leaf(&x), leaf(&gamma), leaf(&beta), leaf(&w));
                let normed = xv.layer_norm([d], Some(&gv), Some(&bv), 1e-5, false);
                let z = normed.to_kind(compute).matmul(&wv.to_kind(compute)).to_kind(dtype);
                (&z * gz.to_kind(dtype)).sum(dtype).backward();
                [z.detach(), xv.grad(), gv.grad(), bv.grad(), wv.grad()]
            };
            let truth = composite(Kind::Double, Kind::Double);
            let max = |t: &Tensor| scalar(&t.to_kind(Kind::Double).abs().max());
            let names = ["z", "x gradient", "γ gradient", "β gradient", "W gradient"];
            for round in [false, true] {
                let want = composite(Kind::Float, if round { Kind::BFloat16 } else { Kind::Float });
                for threads in [1, 7, 256] {
                    let got = norm_project_host(&x, &gamma, &beta, &w, &gz, 1e-5, round, threads, None).unwrap();
                    // Added into a gradient already there (a stream's gradient cell): the same
                    // value, added without a fused multiply-add, so the bits of gx₀ + gx.
                    let gx0 = grid(2.9, &[r, d]).to_kind(Kind::Float);
                    let added =
                        norm_project_host(&x, &gamma, &beta, &w, &gz, 1e-5, round, threads, Some(&gx0)).unwrap();
                    assert!(added[1].equal(&(&gx0 + &got[1])), "n {n} threads {threads}: gx added to gx₀");
                    for (i, what) in names.iter().enumerate() {
                        let case = format!("n {n} {} threads {threads}: {what}", if round { "bf16" } else { "fp32" });
                        if round {
                            let gap =
                                (got[i].to_kind(Kind::Double) - want[i].to_kind(Kind::Double)).abs() / max(&want[i]);
                            let apart = scalar(&gap.gt(2f64.powi(-16)).to_kind(Kind::Double).mean(Kind::Double));
                            let largest = max(&gap);
                            assert!(apart <= 0.02 && largest <= 2f64.powi(-7), "{case}: {apart} apart, {largest:e}");
                            if i == 0 || i == 4 {
                                let bf16 = got[i].to_kind(Kind::BFloat16).to_kind(Kind::Float);
                                assert!(got[i].equal(&bf16), "{case}: not bf16 values");
                            }
                        } else {
                            let err = |a: &Tensor| max(&(a.to_kind(Kind::Double) - &truth[i])) / max(&truth[i]);
                            let (e, e_ref) = (err(&got[i]), err(&want[i]));
                            let floor = 4.0 * f64::from(f32::EPSILON);
                            assert!(e <= 8.0 * e_ref + floor, "{case}: {e:e} against the composite's {e_ref:e}");
                        }
                    }
                }
            }
        }
    }

    /// H-ACN's update kernels' arithmetic (run on the CPU: [`hacn_step`] on CPU tensors runs their
    /// host build) against the composite they replace — `h` cast to fp32, `h.addcmul(x, a)` and
    /// `acc + h` — and fp64: both outputs and the gradients of x, acc, h and a, with h in fp32
    /// (within 8× the composite's error from fp64 plus 4 units of fp32) and in bf16 (h's gradient
    /// rounded once from the same fp32 sum, so equal to the composite's but where an fp32 sum taken
    /// in another order tips the rounding: at most 1 % of its elements, one bf16 unit each), with
    /// and without a gradient for the last x' (the long path does not read the last stream).
    #[test]
    fn the_hacn_kernels_arithmetic_equals_the_composite() {
        use tch::{Device, Kind};
        let n = 3000i64;
        let grid = |phase: f64| (Tensor::arange(n, (Kind::Double, Device::Cpu)) * phase).sin().reshape([3, 1000]);
        let (x0, acc0, h0, gx0, gacc0) = (grid(0.31), grid(1.7), grid(1.1) * 2.0, grid(2.3), grid(0.9));
        let a0 = Tensor::from(0.75f64);
        for h_kind in [Kind::Float, Kind::BFloat16] {
            for last in [false, true] {
                // [x', acc', gx, gacc, gh, ga] at `dtype`, through the kernels or the composite.
                let run = |dtype: Kind, kernels: bool| {
                    let leaf = |t: &Tensor, k: Kind| t.to_kind(k).detach().set_requires_grad(true);
                    let x = leaf(&x0, dtype);
                    let acc = leaf(&acc0, dtype);
                    let h = leaf(&h0.to_kind(h_kind), if dtype == Kind::Double { Kind::Double } else { h_kind });
                    let a = leaf(&a0, dtype);
                    let (xo, acco) = if kernels {
                        hacn_step(&x, &acc, &h, &a).unwrap()
                    } else {
                        let h32 = h.to_kind(dtype);
                        (h32.addcmul(&x, &a), &acc + &h32)
                    };
                    let g = (&acco * gacc0.to_kind(dtype)).sum(dtype);
                    let loss = if last { g } else { g + (&xo * gx0.to_kind(dtype)).sum(dtype) };
                    loss.backward();
                    // The composite leaves an unused input's gradient undefined: zero.
                    let grad = |t: &Tensor| if t.grad().defined() { t.grad() } else { t.zeros_like() };
                    [xo.detach(), acco.detach(), grad(&x), grad(&acc), grad(&h), grad(&a)]
                };
                let (got, want, truth) = (run(Kind::Float, true), run(Kind::Float, false), run(Kind::Double, false));
                let names = ["x'", "acc'", "x gradient", "acc gradient", "h gradient", "a gradient"];
                let max = |t: &Tensor| scalar(&t.to_kind(Kind::Double).abs().max());
                for (i, what) in names.iter().enumerate() {
                    let case = format!("h {h_kind:?}, last {last}: {what}");
                    assert_eq!(got[i].kind(), want[i].kind(), "{case}: dtype");
                    if i == 4 && h_kind == Kind::BFloat16 {
                        let gap = (got[i].to_kind(Kind::Double) - want[i].to_kind(Kind::Double)).abs();
                        let apart = scalar(&gap.gt(0.0).to_kind(Kind::Double).mean(Kind::Double));
                        assert!(apart <= 0.01 && max(&gap) <= max(&want[i]) / 128.0, "{case}: {apart} apart");
                        continue;
                    }
                    let err = |t: &Tensor| max(&(t.to_kind(Kind::Double) - &truth[i])) / max(&truth[i]).max(1e-30);
                    let (e, e_ref) = (err(&got[i]), err(&want[i]));
                    let floor = 4.0 * f64::from(f32::EPSILON);
                    assert!(e <= 8.0 * e_ref + floor, "{case}: {e:e} against the composite's {e_ref:e}");
                }
            }
        }
    }

    /// AttnRes' depth-attention kernels' arithmetic — the CUDA kernels' (run on the CPU:
    /// [`history_attend`] on CPU tensors runs their host build) and the CPU row loops'
    /// ([`history_attend_rows`], in every instruction set this CPU runs) — against the composite
    /// they replace — per source `(v·q)/rms(v)`, a softmax over the sources, the weighted sum —
    /// and fp64: both outputs, α, and the gradients of both queries and of every source, through a
    /// history whose sources are read by two attentions (all five, and three at uneven slots, as
    /// block AttnRes reads them) and one of them also directly (as the next partial sum reads it):
    /// within 8× the composite's error from fp64 plus 4 units of fp32, for a width under one block
    /// of threads and one that some threads loop over twice (and, for the row loops, under one
    /// vector and with a tail). The row loops in fp64 (what the fp64 tests of the topologies run)
    /// within 64 units of fp64 of the fp64 composite.
    #[test]
    fn the_attnres_kernels_arithmetic_equals_the_composite() {
        use tch::{Device, Kind};
        for d in [5i64, 37, 300] {
            let grid = |phase: f64, scale: f64| {
                (Tensor::arange(21 * d, (Kind::Double, Device::Cpu)) * phase).sin().reshape([3, 7, d]) * scale
            };
            let v0: Vec<Tensor> = (0..5).map(|i| grid(0.31 + 0.17 * i as f64, 0.5 + i as f64)).collect();
            let (q1, q2) = (grid(0.7, 0.3).get(0).get(0), grid(1.3, 0.8).get(1).get(2));
            let (g1, g2, g3) = (grid(2.3, 1.0), grid(0.9, 1.0), grid(1.9, 1.0));
            let picks = [0usize, 2, 4];
            // [y1, y2, α1, α2, gq1, gq2, gv_0 .. gv_4] at `dtype`, through the CUDA kernels' host
            // build (`Host`), the row loops (`Rows`) or the composite (`Composite`).
            #[derive(Clone, Copy, PartialEq)]
            enum Path {
                Composite,
                Host,
                Rows,
            }
            let run = |dtype: Kind, path: Path| {
                let kernels = path != Path::Composite;
                let leaf = |t: &Tensor| t.to_kind(dtype).detach().set_requires_grad(true);
                let vs: Vec<Tensor> = v0.iter().map(leaf).collect();
                let (q1, q2) = (leaf(&q1), leaf(&q2));
                let composite = |xs: &[&Tensor], q: &Tensor| {
                    let logits: Vec<Tensor> = xs
                        .iter()
                        .map(|v| v.matmul(q) * (v.square().mean_dim(-1, false, dtype) + 1e-6).rsqrt())
                        .collect();
                    let alpha = Tensor::stack(&logits, -1).softmax(-1, dtype);
                    let y = xs
                        .iter()
                        .enumerate()
                        .fold(Tensor::zeros_like(xs[0]), |y, (i, v)| y + *v * alpha.select(-1, i as i64).unsqueeze(-1));
                    (y, alpha)
                };
                let (buf, gbuf) =
                    (Tensor::zeros([5, 21 * d], (dtype, Device::Cpu)), Tensor::empty([0], (dtype, Device::Cpu)));
                let states: Vec<Tensor> = if kernels {
                    vs.iter().enumerate().map(|(i, v)| history_push(&buf, &gbuf, i, v).unwrap()).collect()
                } else {
                    vs.iter().map(|v| v.shallow_clone()).collect()
                };
                let all: Vec<&Tensor> = states.iter().collect();
                let some: Vec<&Tensor> = picks.iter().map(|&i| &states[i]).collect();
                let attend = if path == Path::Host { history_attend } else { history_attend_rows };
                let ((y1, a1), (y2, a2)) = if kernels {
                    (
                        attend(&buf, &gbuf, &[0, 1, 2, 3, 4], &all, &q1).unwrap(),
                        attend(&buf, &gbuf, &picks, &some, &q2).unwrap(),
                    )
                } else {
                    (composite(&all, &q1), composite(&some, &q2))
                };
                let g = |t: &Tensor| t.to_kind(dtype);
                let loss = (&y1 * g(&g1)).sum(dtype) + (&y2 * g(&g2)).sum(dtype) + (&states[3] * g(&g3)).sum(dtype);
                loss.backward();
                let mut out = vec![y1.detach(), y2.detach(), a1.detach(), a2.detach(), q1.grad(), q2.grad()];
                out.extend(vs.iter().map(|v| v.grad()));
                out
            };
            let (want, truth) = (run(Kind::Float, Path::Composite), run(Kind::Double, Path::Composite));
            let mut cases = vec![("host build".to_string(), run(Kind::Float, Path::Host))];
            for isa in setting::kernel_isas() {
                cases.push((
                    format!("row loops ({})", isa.name()),
                    setting::with_kernel_isa(isa, || run(Kind::Float, Path::Rows)),
                ));
            }
            let exact = setting::with_kernel_isa(setting::KernelIsa::best(), || run(Kind::Double, Path::Rows));
            let max = |t: &Tensor| scalar(&t.to_kind(Kind::Double).abs().max());
            for (kernel, got) in &cases {
                for (i, ((g, w), t)) in got.iter().zip(&want).zip(&truth).enumerate() {
                    let what = ["y1", "y2", "α1", "α2", "q1 gradient", "q2 gradient"]
                        .get(i)
                        .map_or_else(|| format!("v{} gradient", i - 6), |s| s.to_string());
                    assert_eq!(g.size(), w.size(), "D {d}, {kernel}: {what}: shape");
                    let err = |x: &Tensor| max(&(x.to_kind(Kind::Double) - t)) / max(t).max(1e-30);
                    let (e, e_ref) = (err(g), err(w));
                    let floor = 4.0 * f64::from(f32::EPSILON);
                    assert!(
                        e <= 8.0 * e_ref + floor,
                        "D {d}, {kernel}: {what}: {e:e} against the composite's {e_ref:e}"
                    );
                    let e64 = max(&(&exact[i] - t)) / max(t).max(1e-30);
                    assert!(
                        e64 <= 64.0 * f64::EPSILON,
                        "D {d}, fp64 row loops: {what}: {e64:e} from the fp64 composite"
                    );
                }
            }
        }
    }

    /// The CUDA SwiGLU kernels' arithmetic (run on the CPU) against libtorch's `silu(g) · u` and its
    /// gradients, and fp64: fp32 within 8× libtorch's error plus 4 units of fp32; bf16 (one rounding
    /// where libtorch rounds twice) at most one bf16 unit from libtorch's.
    #[test]
    fn the_cuda_swiglu_kernels_arithmetic_equals_libtorchs() {
        use tch::{Device, Kind};
        let n = 4000i64;
        let grid = |phase: f64| (Tensor::arange(n, (Kind::Double, Device::Cpu)) * phase).sin();
        let (g0, u0, gh0) = (grid(0.61) * 6.0, grid(1.9) * 2.0, grid(2.7));
        for kind in [Kind::Float, Kind::BFloat16] {
            let (g, u, gh) = (g0.to_kind(kind), u0.to_kind(kind), gh0.to_kind(kind));
            let libtorch = |dtype: Kind| {
                let leaf = |t: &Tensor| t.to_kind(dtype).detach().set_requires_grad(true);
                let (gv, uv) = (leaf(&g), leaf(&u));
                let h = gv.silu() * &uv;
                (&h * gh.to_kind(dtype)).sum(dtype).backward();
                [h.detach(), gv.grad(), uv.grad()]
            };
            let want = libtorch(kind);
            let truth = libtorch(Kind::Double);
            let got = swiglu_host(&g, &u, &gh).unwrap();
            for (i, what) in ["output", "gate gradient", "up gradient"].iter().enumerate() {
                let diff =
                    |a: &Tensor, b: &Tensor| scalar(&(a.to_kind(Kind::Double) - b.to_kind(Kind::Double)).abs().max());
                let scale = scalar(&truth[i].abs().max());
                if kind == Kind::Float {
                    let (e, e_ref) = (diff(&got[i], &truth[i]), diff(&want[i], &truth[i]));
                    let floor = 4.0 * f64::from(f32::EPSILON) * scale;
                    assert!(e <= 8.0 * e_ref + floor, "fp32 {what}: {e:e} against libtorch's {e_ref:e}");
                } else {
                    let e = diff(&got[i], &want[i]);
                    assert!(e <= scale / 128.0, "bf16 {what}: {e:e} from libtorch's (scale {scale:e})");
                }
            }
        }
    }

    /// The CUDA RoPE kernels' arithmetic (run on the CPU) against the composite rotation
    /// (`model::layers::Rope::apply` after the split into heads) and its gradient: fp32 to a few
    /// units of fp32, bf16 (one rounding where libtorch rounds twice) at most one bf16 unit apart.
    #[test]
    fn the_cuda_rope_kernels_arithmetic_equals_the_composite() {
        use tch::{Device, Kind};
        let (b, t, h, hd) = (2i64, 7i64, 3i64, 8i64);
        let grid = |n: i64, phase: f64| (Tensor::arange(n, (Kind::Double, Device::Cpu)) * phase).sin();
        let x0 = grid(b * t * h * hd, 0.37).reshape([b, t, h * hd]);
        let gy0 = grid(b * h * t * hd, 1.3).reshape([b, h, t, hd]);
        let (c0, s0) = (grid((t + 3) * hd, 0.9).reshape([t + 3, hd]), grid((t + 3) * hd, 1.7).reshape([t + 3, hd]));
        for kind in [Kind::Float, Kind::BFloat16] {
            let (x, gy, cs, sn) = (x0.to_kind(kind), gy0.to_kind(kind), c0.to_kind(kind), s0.to_kind(kind));
            // The composite, as Rope::apply computes it.
            let xv = x.detach().set_requires_grad(true);
            let heads = xv.reshape([b, t, h, hd]).transpose(1, 2);
            let (c, s) = (cs.narrow(0, 0, t), sn.narrow(0, 0, t));
            let y_ref = (&heads * &c).addcmul(&heads.roll([hd / 2], [-1]), &s);
            (&y_ref * &gy).sum(kind).backward();
            let [y, gx] = rope_host(&x, &cs, &sn, &gy, h).unwrap();
            let diff =
                |a: &Tensor, b: &Tensor| scalar(&(a.to_kind(Kind::Double) - b.to_kind(Kind::Double)).abs().max());
            let scale = |a: &Tensor| scalar(&a.abs().max());
            let (dy, dx) = (diff(&y, &y_ref), diff(&gx, &xv.grad()));
            let tol = |a: &Tensor| {
                if kind == Kind::Float {
                    8.0 * f64::from(f32::EPSILON) * scale(a)
                } else {
                    scale(a) / 128.0
                }
            };
            assert!(dy <= tol(&y_ref), "{kind:?}: output off by {dy:e}");
            assert!(dx <= tol(&xv.grad()), "{kind:?}: input gradient off by {dx:e}");
        }
    }

    /// CUDA graphs are built wherever NCCL is (the same CUDA headers), and without a GPU a graph
    /// cannot be made: an error, not a crash.
    #[test]
    fn cuda_graphs_are_built_with_the_cuda_headers_and_need_a_gpu() {
        assert_eq!(cuda_graphs_built(), env!("PLEXUS_NATIVE_WITH_NCCL") == "1");
        if !tch::Cuda::is_available() {
            assert!(CudaGraph::new(0).is_err());
        }
    }

    /// The operator trace shows the host numbers an operator takes: the same code with another
    /// number gives another trace; the same code and numbers the same trace.
    #[test]
    fn the_operator_trace_records_host_numbers() {
        let t = Tensor::ones([3], (tch::Kind::Float, tch::Device::Cpu));
        let run = |lr: f64| trace_ops(|| (&t * lr).sum(tch::Kind::Float)).unwrap().1;
        let (a, b, c) = (run(0.5), run(0.5), run(0.25));
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.iter().any(|l| l.starts_with("aten::mul(") && l.contains("0.5")), "{a:?}");
    }

    /// ptxas' resource lines as NVRTC's log holds them (CUDA 13): spills add up over the kernels; a
    /// log without them (PTX) has none to report.
    #[test]
    fn register_spills_are_read_from_ptxas_lines() {
        let log = "ptxas info    : Compiling entry function 'a' for 'sm_90'\n\
                   ptxas info    : Function properties for a\n\
                   ptxas         .     8 bytes stack frame, 16 bytes spill stores, 24 bytes spill loads\n\
                   ptxas info    : Used 255 registers, used 0 barriers\n\
                   ptxas info    : Function properties for b\n\
                   ptxas         .     0 bytes stack frame, 0 bytes spill stores, 4 bytes spill loads\n";
        let k = CompiledKernels { bytes: 1, target: "sm_90".into(), log: log.into() };
        assert_eq!(k.spill_bytes(), Some(44));
        assert_eq!(k.usage().len(), 4);
        let ptx = CompiledKernels { bytes: 1, target: "compute_90".into(), log: String::new() };
        assert_eq!(ptx.spill_bytes(), None);
    }

    /// NVRTC (from the torch wheel) compiles the CUDA kernels (`native/src/*.cu`: Sinkhorn, the
    /// stream read and write) on this CPU machine, for every n,
    /// as CUBINs for an A100 (sm_80) and an H100 (sm_90) without a register spill (ptxas' own
    /// report), and as PTX for a GPU newer than it knows.
    /// A CPU-only libtorch has no NVRTC: the error must say so.
    #[test]
    fn nvrtc_compiles_the_cuda_kernels() {
        if env!("PLEXUS_NATIVE_WITH_CUDA") != "1" {
            let e = cuda_kernels_compile(4, 90).unwrap_err();
            assert!(e.to_string().contains("NVRTC"), "{e:#}");
            return;
        }
        let (version, path) = nvrtc_version().unwrap();
        assert!(version >= 12000, "NVRTC {version} from {path}");
        for n in 1..=CUDA_KERNELS_MAX_STREAMS {
            for arch in [80, 90] {
                let k = cuda_kernels_compile(n, arch).unwrap_or_else(|e| panic!("{e:#}"));
                assert_eq!(k.target, format!("sm_{arch}"));
                assert!(k.bytes > 1000, "n = {n}, {}: {} bytes", k.target, k.bytes);
                // Six kernels, each with ptxas' resource line; none spills registers to local memory.
                assert!(k.usage().len() >= 6, "n = {n}, {}: ptxas wrote no resource usage:\n{}", k.target, k.log);
                assert_eq!(k.spill_bytes(), Some(0), "n = {n}, {}: register spills\n{}", k.target, k.log);
                for name in [
                    "plexus_cross_entropy_forward_bf16",
                    "plexus_cross_entropy_backward_f32",
                    "plexus_norm_forward_bf16",
                    "plexus_norm_backward_bf16",
                    "plexus_swiglu_forward_bf16",
                    "plexus_swiglu_backward_f32",
                    "plexus_rope_forward_bf16",
                    "plexus_rope_backward_f32",
                    "plexus_norm_project_forward",
                    "plexus_norm_project_backward",
                    "plexus_hacn_forward_bf16",
                    "plexus_hacn_backward_f32",
                    "plexus_attnres_forward",
                    "plexus_attnres_backward",
                ] {
                    assert!(k.log.contains(name), "n = {n}, {}: no {name} in ptxas' log", k.target);
                }
            }
        }
        let k = cuda_kernels_compile(4, 990).unwrap();
        let ptx_arch: u32 = k.target.strip_prefix("compute_").and_then(|a| a.parse().ok()).expect("a PTX target");
        assert!((90..990).contains(&ptx_arch) && k.bytes > 1000, "{}: {} bytes", k.target, k.bytes);
        assert_eq!(k.spill_bytes(), None, "PTX: ptxas does not run");
        assert!(cuda_kernels_compile(9, 90).is_err_and(|e| e.to_string().contains("1 ≤ n ≤ 8")));
    }
}
