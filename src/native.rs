//! plexus' small native layer: the libtorch calls tch does not expose, in C++
//! (`src/native/plexus_native.cpp`, compiled by `build.rs` against the same libtorch headers and
//! with the same flags as torch-sys's own C++), behind this safe module. Nothing else in the crate
//! touches FFI.
//!
//! Every C++ entry point catches all exceptions and returns them as an error string, so a libtorch
//! error becomes an [`anyhow::Error`] here and never unwinds or aborts across the boundary.
//!
//! What is here:
//! * CUDA facts and memory statistics ([`cuda_device_info`], [`cuda_memory_stats`], …) that
//!   `tch::Cuda` lacks, and the float32 matmul precision (TF32) switch;
//! * data-parallel collectives on PyTorch's own distributed engine, c10d ([`ProcessGroup`]):
//!   TCPStore rendezvous, then ProcessGroupGloo (CPU tensors) or ProcessGroupNCCL (CUDA tensors);
//! * the training step's tensor-list operations: gradients dropped ([`clear_grads`]) and the fused
//!   AdamW kernel ([`fused_adamw`]); the operator counter behind `bench`'s kernels per step;
//! * fused CPU kernels of the multi-stream topologies, autograd functions with hand-written
//!   backwards (`src/native/stream_kernels.cpp`): [`stream_read`], [`stream_write`], [`sinkhorn`],
//!   [`norm_project`], [`rms_project`], [`hyper_pre`] (HC's mixing weights and read in one); the
//!   read's, the write's, `norm_project`'s and `hyper_pre`'s row loops are
//!   built for baseline x86-64, AVX2 + FMA and AVX-512 and picked by the CPU ([`KernelIsa`],
//!   [`kernel_isa`]);
//! * the language-model loss on bf16 logits without their fp32 copy (`src/native/losses.cpp`, any
//!   device): [`cross_entropy_chunked`];
//! * the dense topologies' history buffer (`src/native/history.cpp`, any device):
//!   [`history_push`], [`history_mix`] (used through `topology::common::History`);
//! * CUDA kernels compiled at run time with NVRTC (`src/native/cuda_kernels.cpp`, the kernels in
//!   `src/native/sinkhorn.cu` and `streams.cu`): mHC's Sinkhorn ([`sinkhorn_cuda`]) and the stream
//!   read and write, which [`stream_read`] and [`stream_write`] run for fp32 CUDA tensors; for the
//!   tests and `doctor`, [`sinkhorn_cuda_host`], [`streams_host`], [`cuda_kernels_compile`],
//!   [`nvrtc_version`].
//!
//! A CPU-only libtorch builds this module too; the CUDA functions then return an error saying so.
use anyhow::{anyhow, bail, Result};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr::NonNull;
use std::time::Duration;
use tch::Tensor;

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
        pub fn plexus_cuda_graph_capture_begin(g: *mut c_void) -> *mut c_char;
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
        pub fn plexus_stream_read(
            h: *mut C_tensor,
            pre: *mut C_tensor,
            isa: i64,
            out: *mut *mut C_tensor,
        ) -> *mut c_char;
        pub fn plexus_stream_write(
            h: *mut C_tensor,
            res: *mut C_tensor,
            post: *mut C_tensor,
            o: *mut C_tensor,
            isa: i64,
            out: *mut *mut C_tensor,
        ) -> *mut c_char;
        pub fn plexus_sinkhorn(logits: *mut C_tensor, iters: i64, isa: i64, out: *mut *mut C_tensor) -> *mut c_char;
        pub fn plexus_rms_project(v: *mut C_tensor, phi: *mut C_tensor, out: *mut *mut C_tensor) -> *mut c_char;
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
    unsafe { ffi::plexus_free_string(s) };
    out
}

/// Turns the error-string convention of every entry point into a `Result`.
fn check(err: *mut c_char) -> Result<()> {
    if err.is_null() {
        Ok(())
    } else {
        Err(anyhow!(take_string(err)))
    }
}

fn device_index(index: usize) -> Result<i64> {
    i64::try_from(index).map_err(|_| anyhow!("CUDA device index {index} is out of range"))
}

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
        bail!("float32 matmul precision must be \"highest\", \"high\" or \"medium\", got {p:?}");
    }
    let c = CString::new(p)?;
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

/// Whether ProcessGroupNCCL is compiled in (needs CUDA runtime headers that compile and `nccl.h` at
/// build time; see `build.rs`).
pub fn nccl_built() -> bool {
    // SAFETY: no arguments, no side effects.
    unsafe { ffi::plexus_nccl_built() != 0 }
}

/// Whether ProcessGroupGloo is compiled in (libtorch ships its header).
pub fn gloo_built() -> bool {
    // SAFETY: no arguments, no side effects.
    unsafe { ffi::plexus_gloo_built() != 0 }
}

/// The c10d backend a [`ProcessGroup`] runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Gloo: CPU tensors, TCP between processes.
    Gloo,
    /// NCCL: CUDA tensors, one GPU per rank.
    Nccl,
}

/// A group of `world_size` processes running the same sequence of collectives (c10d's contract:
/// every rank issues the same collectives in the same order, with tensors of the same shapes).
///
/// Rank 0 hosts a `c10d::TCPStore` at `addr:port` through which all ranks meet; the backend then
/// connects every pair of ranks. One `timeout` bounds the rendezvous and every collective, so a
/// rank that never arrives or dies mid-way turns into an `Err` on the others instead of a hang.
/// `Send` (it can move to a worker thread) but not `Sync`: collectives must be issued in one order.
pub struct ProcessGroup {
    handle: NonNull<c_void>,
    backend: Backend,
    rank: usize,
    world_size: usize,
}

// SAFETY: the C++ process group has no thread affinity (c10d backends are driven from any thread;
// torch.distributed hands them between threads); `&self` methods are not shared across threads
// because ProcessGroup is not Sync.
unsafe impl Send for ProcessGroup {}

impl ProcessGroup {
    /// Joins the group as `rank` of `world_size`: rank 0 hosts the TCPStore at `addr:port` (and
    /// fails if the port is taken), the others connect to it. Returns once all ranks have arrived
    /// and the backend has connected them, or with an error after `timeout`.
    ///
    /// With Gloo, a loopback `addr` (127.x, localhost, ::1) keeps all traffic on loopback; otherwise
    /// each rank binds the device torch.distributed would (`GLOO_SOCKET_IFNAME`, else its hostname).
    /// With NCCL, collectives run on the CUDA tensors' devices (one GPU per rank), and
    /// `TORCH_NCCL_BLOCKING_WAIT=1` is set unless already set, so that a failing or timed-out
    /// collective returns an error rather than NCCL's watchdog ending the process.
    pub fn new(
        backend: Backend,
        addr: &str,
        port: u16,
        rank: usize,
        world_size: usize,
        timeout: Duration,
    ) -> Result<Self> {
        if world_size == 0 {
            bail!("process group: world size must be at least 1");
        }
        if rank >= world_size {
            bail!("process group: rank {rank} is out of range for world size {world_size}");
        }
        if port == 0 {
            bail!("process group: port 0 cannot be used, every rank must know rank 0's store port");
        }
        let timeout_ms = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
        if timeout_ms == 0 {
            bail!("process group: the timeout must be at least 1 ms, got {timeout:?}");
        }
        if backend == Backend::Nccl && !nccl_built() {
            bail!("process group: plexus was built without NCCL: {}", env!("PLEXUS_NATIVE_NCCL_MISSING"));
        }
        let c_addr = CString::new(addr).map_err(|_| anyhow!("process group: address {addr:?} contains a NUL byte"))?;
        let (rank_i, world_i) = (i64::try_from(rank)?, i64::try_from(world_size)?);
        let kind: c_int = match backend {
            Backend::Gloo => 0,
            Backend::Nccl => 1,
        };
        let mut handle: *mut c_void = std::ptr::null_mut();
        // SAFETY: `c_addr` and `handle` outlive the call; `handle` is set only on success.
        check(unsafe { ffi::plexus_pg_new(kind, c_addr.as_ptr(), port, rank_i, world_i, timeout_ms, &mut handle) })?;
        let handle = NonNull::new(handle).ok_or_else(|| anyhow!("process group: set-up returned no handle"))?;
        Ok(Self { handle, backend, rank, world_size })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world_size(&self) -> usize {
        self.world_size
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Replaces `t` (any shape; CPU for Gloo, CUDA for NCCL) by its sum over all ranks, in place,
    /// and waits for the result. Runs without autograd: meant for gradients and buffers.
    pub fn all_reduce_sum(&self, t: &mut Tensor) -> Result<()> {
        self.all_reduce_sum_many(std::slice::from_mut(t))
    }

    /// [`all_reduce_sum`](Self::all_reduce_sum) for a bucket of tensors of any shapes but one dtype
    /// and device, in a single collective over their concatenation (one network round trip per
    /// bucket instead of one per tensor).
    pub fn all_reduce_sum_many(&self, ts: &mut [Tensor]) -> Result<()> {
        let mut ptrs: Vec<*mut torch_sys::C_tensor> = ts.iter_mut().map(|t| t.as_mut_ptr()).collect();
        // SAFETY: the pointers are live tch tensors (torch::Tensor*), exclusively borrowed for the call.
        check(unsafe { ffi::plexus_pg_all_reduce_sum(self.handle.as_ptr(), ptrs.as_mut_ptr(), ptrs.len()) })
            .map_err(|e| self.context(e, "all_reduce"))
    }

    /// Overwrites `t` on every rank with rank `root`'s `t` (same shape and dtype on all ranks).
    pub fn broadcast(&self, t: &mut Tensor, root: usize) -> Result<()> {
        if root >= self.world_size {
            bail!("process group: broadcast root {root} is out of range for world size {}", self.world_size);
        }
        // SAFETY: `t` is a live tch tensor, exclusively borrowed for the call.
        check(unsafe { ffi::plexus_pg_broadcast(self.handle.as_ptr(), t.as_mut_ptr(), root as i64) })
            .map_err(|e| self.context(e, "broadcast"))
    }

    /// Returns once every rank has reached its barrier (or errors after the timeout).
    pub fn barrier(&self) -> Result<()> {
        // SAFETY: plain handle.
        check(unsafe { ffi::plexus_pg_barrier(self.handle.as_ptr()) }).map_err(|e| self.context(e, "barrier"))
    }

    fn context(&self, e: anyhow::Error, op: &str) -> anyhow::Error {
        anyhow!("{op} on rank {} of {} ({:?}) failed: {e}", self.rank, self.world_size, self.backend)
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // SAFETY: the handle came from plexus_pg_new and is freed exactly once, here.
        unsafe { ffi::plexus_pg_free(self.handle.as_ptr()) }
    }
}

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessGroup")
            .field("backend", &self.backend)
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .finish()
    }
}

/// `t` (a CPU tensor) copied into page-locked memory, for an asynchronous copy to a GPU; a tensor
/// already pinned is returned as it is. tch's `Tensor::pin_memory(device)` passes an argument that
/// libtorch deprecated and then prints a warning on every call, i.e. on every batch.
pub fn pin_memory(t: &Tensor) -> Result<Tensor> {
    let mut out: *mut torch_sys::C_tensor = std::ptr::null_mut();
    // SAFETY: `t.as_ptr()` is a live `at::Tensor*` for the call; the C++ side only reads it and
    // writes a new, caller-owned `at::Tensor*` to `out` when it returns no error.
    check(unsafe { ffi::plexus_pin_memory(t.as_ptr() as *mut _, &mut out) })?;
    // SAFETY: on success `out` is a fresh tensor handle that nothing else owns.
    Ok(unsafe { Tensor::from_ptr(out) })
}

/// Operators libtorch ran on this thread during [`count_ops`], from its dispatcher's own records
/// (on the CPU a backward runs on the thread that calls it, so it is included).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OpCount {
    /// Leaf operator calls that do work (a kernel each, mostly): a CPU-measurable proxy of the
    /// kernel launches the same code makes on a GPU, where a step of many small operators is
    /// bound by launches, not by arithmetic.
    pub kernels: u64,
    /// Leaf calls that only make views or allocate (`view`, `select`, `expand`, `empty`, …).
    pub metadata: u64,
    /// Every operator call, composite ones (`linear`, `reshape`, …) included.
    pub calls: u64,
    /// The working leaf operators by name, most frequent first.
    pub by_name: Vec<(String, u64)>,
    /// The same operators by wall time in ms, longest first (a product's includes what it calls;
    /// the counting callback inflates small operators by about a microsecond per call).
    pub ms_by_name: Vec<(String, f64)>,
}

impl OpCount {
    /// Wall time of all the working leaf operators, in ms.
    pub fn total_ms(&self) -> f64 {
        self.ms_by_name.iter().map(|(_, ms)| ms).sum()
    }
}

/// Runs `f` while counting the operators libtorch executes (see [`OpCount`]). Counting slows
/// every operator call; time nothing inside. One count at a time per process.
pub fn count_ops<T>(f: impl FnOnce() -> T) -> Result<(T, OpCount)> {
    // SAFETY: no arguments; the C++ side registers a global callback.
    check(unsafe { ffi::plexus_op_count_begin() })?;
    let value = f();
    let mut out = [0u64; 3];
    let mut names: *mut c_char = std::ptr::null_mut();
    // SAFETY: `out` has the 3 slots the C++ side writes; `names` receives a malloc'd string.
    check(unsafe { ffi::plexus_op_count_end(out.as_mut_ptr(), &mut names) })?;
    // "name calls nanoseconds" per line; a name may contain spaces, the two numbers do not.
    let rows: Vec<(String, u64, u64)> = take_string(names)
        .lines()
        .filter_map(|l| {
            let (rest, ns) = l.rsplit_once(' ')?;
            let (name, calls) = rest.rsplit_once(' ')?;
            Some((name.to_string(), calls.parse().ok()?, ns.parse().ok()?))
        })
        .collect();
    let mut by_name: Vec<(String, u64)> = rows.iter().map(|(n, c, _)| (n.clone(), *c)).collect();
    by_name.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut ms_by_name: Vec<(String, f64)> = rows.iter().map(|(n, _, ns)| (n.clone(), *ns as f64 / 1e6)).collect();
    ms_by_name.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    Ok((value, OpCount { kernels: out[0], metadata: out[1], calls: out[2], by_name, ms_by_name }))
}

/// Whether this build has CUDA graphs (CUDA headers that compile were found at build time, as
/// for NCCL; `scripts/setup.sh` installs them).
pub fn cuda_graphs_built() -> bool {
    // SAFETY: no arguments, returns a constant.
    unsafe { ffi::plexus_cuda_graphs_built() != 0 }
}

/// A whole-step CUDA graph on one device (`src/native/cuda_graph.cpp`, libtorch's
/// `at::cuda::CUDAGraph`): warm-up steps run between [`CudaGraph::enter`] and
/// [`CudaGraph::leave`] on its side stream; one step is recorded between
/// [`CudaGraph::capture_begin`] and [`CudaGraph::capture_end`] (on the side stream, nothing runs);
/// [`CudaGraph::replay`] then runs it on the current stream. Drop frees the graph and its memory
/// pool.
pub struct CudaGraph {
    ptr: NonNull<c_void>,
}

impl CudaGraph {
    pub fn new(device: usize) -> Result<Self> {
        let mut out: *mut c_void = std::ptr::null_mut();
        // SAFETY: out-parameter only; a non-null handle is owned by the returned value.
        check(unsafe { ffi::plexus_cuda_graph_new(device as i64, &mut out) })?;
        Ok(Self { ptr: NonNull::new(out).ok_or_else(|| anyhow!("cuda graph: null handle"))? })
    }

    fn call(&self, f: unsafe extern "C" fn(*mut c_void) -> *mut c_char) -> Result<()> {
        // SAFETY: `ptr` is the live handle this value owns; the C++ side checks the call order.
        check(unsafe { f(self.ptr.as_ptr()) })
    }

    /// Its side stream becomes the current stream (after waiting for the current one's work).
    pub fn enter(&self) -> Result<()> {
        self.call(ffi::plexus_cuda_graph_enter)
    }

    /// Back to the stream that was current, which waits for the side stream's work.
    pub fn leave(&self) -> Result<()> {
        self.call(ffi::plexus_cuda_graph_leave)
    }

    pub fn capture_begin(&self) -> Result<()> {
        self.call(ffi::plexus_cuda_graph_capture_begin)
    }

    pub fn capture_end(&self) -> Result<()> {
        self.call(ffi::plexus_cuda_graph_capture_end)
    }

    pub fn replay(&self) -> Result<()> {
        self.call(ffi::plexus_cuda_graph_replay)
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        // SAFETY: the handle is live and dropped once.
        unsafe { ffi::plexus_cuda_graph_free(self.ptr.as_ptr()) }
    }
}

/// Operators that make the host wait for a CUDA device, as libtorch's dispatcher ran them since
/// [`watch_syncs`] started, process-wide: `_local_scalar_dense` (behind `item`, `is_nonzero` and
/// tch's `*_value`), `nonzero`, `equal`, the `unique` family, `masked_select`, and a copy from a
/// CUDA tensor into a CPU one; the outermost of nested ones. Unlike `crate::host`'s count, which
/// sees the reads plexus makes on purpose, this sees a read hidden inside any operator.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SyncCount {
    /// Every thread's (on a GPU a backward runs on libtorch's device threads).
    pub total: u64,
    /// The calling thread's alone (on the CPU, its backward's too): exact when tests run beside it.
    pub this_thread: u64,
    /// By operator name, most frequent first.
    pub by_name: Vec<(String, u64)>,
}

/// Starts counting host-device syncs (see [`SyncCount`]); idempotent, stays on for the process.
/// Every operator call then costs a little more: for tests and `PLEXUS_COUNT_SYNCS=1`.
pub fn watch_syncs() -> Result<()> {
    // SAFETY: no arguments; the C++ side registers a global callback once.
    check(unsafe { ffi::plexus_sync_watch_start() })
}

/// Whether `PLEXUS_COUNT_SYNCS` asks the trainer to count syncs (`1`/`true` or `0`/`false`,
/// unset: no); another value is an error that names it.
pub fn count_syncs_requested() -> Result<bool> {
    match std::env::var("PLEXUS_COUNT_SYNCS") {
        Err(_) => Ok(false),
        Ok(v) => match v.trim().to_ascii_lowercase().as_str() {
            "" | "0" | "false" => Ok(false),
            "1" | "true" => Ok(true),
            _ => bail!("PLEXUS_COUNT_SYNCS={v:?}: allowed are 1 (count host-device syncs per step) and 0"),
        },
    }
}

/// The syncs counted so far, or `None` if [`watch_syncs`] was never called.
pub fn sync_count() -> Option<SyncCount> {
    let (mut active, mut total, mut this_thread): (c_int, u64, u64) = (0, 0, 0);
    let mut names: *mut c_char = std::ptr::null_mut();
    // SAFETY: the out-pointers are valid for the call; `names` receives a malloc'd string.
    check(unsafe { ffi::plexus_sync_watch_read(&mut active, &mut total, &mut this_thread, &mut names) }).ok()?;
    let text = take_string(names);
    if active == 0 {
        return None;
    }
    let mut by_name: Vec<(String, u64)> = text
        .lines()
        .filter_map(|l| {
            let (name, n) = l.rsplit_once(' ')?;
            Some((name.to_string(), n.parse().ok()?))
        })
        .collect();
    by_name.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    Some(SyncCount { total, this_thread, by_name })
}

/// Runs `f` while recording every operator call libtorch's dispatcher runs on this thread, one line
/// each: the operator's name, its non-tensor arguments (numbers, bools, lists) and its tensors'
/// dtypes and shapes. Two runs of a step that a CUDA graph can replay give the same trace: a host
/// number that changes between them (a learning rate, a step index) would be frozen into the
/// graph. Slow (every input is inspected); one trace at a time per process.
pub fn trace_ops<T>(f: impl FnOnce() -> T) -> Result<(T, Vec<String>)> {
    // SAFETY: no arguments; the C++ side registers a global callback.
    check(unsafe { ffi::plexus_op_trace_begin() })?;
    let value = f();
    let mut text: *mut c_char = std::ptr::null_mut();
    // SAFETY: `text` receives a malloc'd string on success.
    check(unsafe { ffi::plexus_op_trace_end(&mut text) })?;
    Ok((value, take_string(text).lines().map(str::to_string).collect()))
}

/// Drops the gradient of every tensor in `ts` (`.grad = None`, PyTorch's
/// `zero_grad(set_to_none=True)`): the next backward stores its gradient instead of adding it to
/// a zeroed one — no `zero_` and no `add_` per parameter and step (tch's `zero_grad` zeroes in place).
pub fn clear_grads(ts: &[Tensor]) -> Result<()> {
    let mut ptrs: Vec<*mut torch_sys::C_tensor> = ts.iter().map(|t| t.as_ptr() as *mut _).collect();
    // SAFETY: every pointer is a live `at::Tensor*` for the call; the C++ side resets their grads.
    check(unsafe { ffi::plexus_clear_grads(ptrs.as_mut_ptr(), ptrs.len() as i64) })
}

/// AdamW's hyper-parameters for one [`fused_adamw`] call (one parameter group).
#[derive(Debug, Clone, Copy)]
pub struct AdamwHyper {
    pub betas: [f64; 2],
    pub weight_decay: f64,
    pub eps: f64,
}

/// One AdamW update of `params` in place, with their gradients and moments, as
/// `torch.optim.AdamW(fused=True)`: libtorch's fused kernel, a single pass over the four tensors
/// per parameter (CPU and CUDA) instead of eight elementwise kernels. `step`: a 0-dim float32
/// tensor on the parameters' device holding the number of updates including this one; `lr`: the
/// learning rate as a 0-dim tensor there (float32 on CUDA, float64 on the CPU), so that nothing
/// that changes from step to step enters as a host number (a CUDA graph replays the update). All
/// the tensors are on one device with one dtype; the four lists are parallel.
pub fn fused_adamw(
    params: &[Tensor],
    grads: &[Tensor],
    exp_avgs: &[Tensor],
    exp_avg_sqs: &[Tensor],
    step: &Tensor,
    lr: &Tensor,
    h: AdamwHyper,
) -> Result<()> {
    let n = params.len();
    if grads.len() != n || exp_avgs.len() != n || exp_avg_sqs.len() != n {
        bail!(
            "fused_adamw: {n} parameters but {} gradients, {} and {} moments",
            grads.len(),
            exp_avgs.len(),
            exp_avg_sqs.len()
        );
    }
    let ptrs = |ts: &[Tensor]| -> Vec<*mut torch_sys::C_tensor> { ts.iter().map(|t| t.as_ptr() as *mut _).collect() };
    let (mut p, mut g, mut m, mut v) = (ptrs(params), ptrs(grads), ptrs(exp_avgs), ptrs(exp_avg_sqs));
    let [beta1, beta2] = h.betas;
    // SAFETY: every pointer is a live `at::Tensor*` for the call (borrowed from the slices); the C++
    // side copies the handles and updates the tensors' data in place.
    check(unsafe {
        ffi::plexus_fused_adamw(
            p.as_mut_ptr(),
            g.as_mut_ptr(),
            m.as_mut_ptr(),
            v.as_mut_ptr(),
            n as i64,
            step.as_ptr() as *mut _,
            lr.as_ptr() as *mut _,
            beta1,
            beta2,
            h.weight_decay,
            h.eps,
        )
    })
}

/// The environment variable that sets the fused CPU kernels: `1`/`true` or unset: on, with the
/// widest instruction set the CPU has ([`KernelIsa::best`]); `avx2`: on, with the AVX2 loops even
/// where AVX-512 exists; `baseline`: on, with the baseline x86-64 loops (what a CPU without AVX2
/// runs; to compare, or to rule the wider loops out);
/// `0`/`false`: off, the composite libtorch code everywhere, as a GPU runs (an escape hatch, and
/// what makes `bench --compare`'s kernels per step stand for a GPU on hyper and mHC).
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
}

/// The instruction set of the fused kernels' row loops (`src/native/stream_rows.inc`, built once
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
    const ALL: [KernelIsa; 3] = [KernelIsa::Baseline, KernelIsa::Avx2Fma, KernelIsa::Avx512];

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
        Some(v) => bail!(
            "environment variable {FUSED_KERNELS_VAR}={v:?}: expected 1/true (the default), avx2 (on, at most \
             AVX2), baseline (on, without AVX2) or 0/false (off)"
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
fn fused_result(err: *mut c_char, out: *mut torch_sys::C_tensor) -> Result<Tensor> {
    check(err)?;
    // SAFETY: on success `out` is a fresh tensor handle that nothing else owns.
    Ok(unsafe { Tensor::from_ptr(out) })
}

/// The read of a multi-stream unit, `u = Σ_s pre[s] H[s]`, as one fused pass forward and one
/// backward (an autograd function): `h` `[.., n, D]`, `pre` `[.., n]` (per token) or `[n]`
/// (static) → `u` `[.., D]`. CPU fp32/fp64 tensors of one dtype ([`fused_streams_take`]), or fp32
/// tensors on one CUDA device with n ≤ [`CUDA_KERNELS_MAX_STREAMS`] (the CUDA kernels; an error if
/// they cannot run there).
pub fn stream_read(h: &Tensor, pre: &Tensor) -> Result<Tensor> {
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
/// dtypes as [`stream_read`].
pub fn stream_write(h: &Tensor, res: &Tensor, post: &Tensor, o: &Tensor) -> Result<Tensor> {
    let mut out: *mut torch_sys::C_tensor = std::ptr::null_mut();
    // SAFETY: as in `stream_read`.
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
pub fn sinkhorn(logits: &Tensor, iters: usize) -> Result<Tensor> {
    let mut out: *mut torch_sys::C_tensor = std::ptr::null_mut();
    // SAFETY: as in `stream_read`.
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
    // SAFETY: as in `stream_read`.
    let err = unsafe { ffi::plexus_sinkhorn_cuda(logits.as_ptr() as *mut _, iters as i64, &mut out) };
    fused_result(err, out)
}

/// The per-token arithmetic of [`sinkhorn_cuda`]'s kernels, run on the CPU: `logits` `[.., n, n]`
/// (contiguous fp32 or fp64 CPU) → P, and with `grad` (P's gradient) the logits' gradient. The
/// same source as the kernels (`src/native/sinkhorn.cu`), so a CPU test checks their arithmetic.
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

/// The per-token arithmetic of the CUDA stream kernels (`src/native/streams.cu`), run on the CPU,
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
/// (`src/native/losses.cpp`). → 0-dim fp32.
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
/// read the slot put its share (`src/native/history.cpp`). Any device. Use the returned tensor, not
/// `x`, downstream, and pass it to the sums that read the slot.
pub fn history_push(buf: &Tensor, gbuf: &Tensor, slot: usize, x: &Tensor) -> Result<Tensor> {
    let mut out: *mut torch_sys::C_tensor = std::ptr::null_mut();
    // SAFETY: as in `stream_read`; the C++ side writes into `buf` (a tensor the caller owns) and
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

/// `Σ_i w[i] · state slots[i]` from a history buffer (see [`history_push`]): one matrix-vector
/// product forward; backward, `dw` (another) and one rank-1 update of the slots' rows of `gbuf`.
/// `states`: the pushes' outputs of those slots (autograd orders the pushes' backwards after this
/// one's through them); `w` `[k]` in the buffer's dtype → a tensor shaped like the states.
pub fn history_mix(buf: &Tensor, gbuf: &Tensor, slots: &[usize], states: &[&Tensor], w: &Tensor) -> Result<Tensor> {
    let slots: Vec<i64> = slots.iter().map(|&s| s as i64).collect();
    let mut ptrs: Vec<*mut torch_sys::C_tensor> = states.iter().map(|t| t.as_ptr() as *mut _).collect();
    if ptrs.len() != slots.len() {
        bail!("history_mix: {} slots but {} states", slots.len(), ptrs.len());
    }
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

/// `(v @ phi) / rms(v)` row by row, `rms(v) = ‖v‖₂ / √N` (mHC's mixing logits): `v` `[.., N]`,
/// `phi` `[N, K]` → `[.., K]`, one autograd function whose backward forms the input gradient in one
/// pass (the products are libtorch's). CPU fp32/fp64 tensors of one dtype.
pub fn rms_project(v: &Tensor, phi: &Tensor) -> Result<Tensor> {
    let mut out: *mut torch_sys::C_tensor = std::ptr::null_mut();
    // SAFETY: as in `stream_read`.
    let err = unsafe { ffi::plexus_rms_project(v.as_ptr() as *mut _, phi.as_ptr() as *mut _, &mut out) };
    fused_result(err, out)
}

/// `LayerNorm(x; gamma, beta, eps) @ w` row by row, without materialising the normalised rows
/// (one pass forward, one backward): `x` `[.., D]`, `gamma`, `beta` `[D]`, `w` `[D, K]` →
/// `[.., K]`. CPU fp32/fp64 tensors of one dtype.
pub fn norm_project(x: &Tensor, gamma: &Tensor, beta: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let mut out: *mut torch_sys::C_tensor = std::ptr::null_mut();
    // SAFETY: as in `stream_read`.
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
    // SAFETY: as in `stream_read`; on success the C++ side writes three fresh, caller-owned
    // handles to `outs`.
    let err = unsafe {
        ffi::plexus_hyper_pre(h.as_ptr() as *mut _, p.handles().as_ptr(), p.eps, kernel_isa().code(), outs.as_mut_ptr())
    };
    check(err)?;
    // SAFETY: on success each handle is a fresh tensor that nothing else owns.
    let [u, res, post] = outs.map(|t| unsafe { Tensor::from_ptr(t) });
    Ok((u, res, post))
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn the_fused_kernels_switch_takes_0_1_true_false_avx2_baseline_and_names_itself_otherwise() {
        assert_eq!(parse_fused_kernels(None).unwrap(), FusedKernels::Best);
        for (v, want) in [
            ("1", FusedKernels::Best),
            ("true", FusedKernels::Best),
            (" TRUE ", FusedKernels::Best),
            ("Baseline", FusedKernels::Baseline),
            ("avx2", FusedKernels::Avx2),
            ("0", FusedKernels::Off),
            ("false", FusedKernels::Off),
        ] {
            assert_eq!(parse_fused_kernels(Some(v)).unwrap(), want, "{v:?}");
        }
        let e = parse_fused_kernels(Some("maybe")).unwrap_err().to_string();
        assert!(
            e.contains("PLEXUS_FUSED_KERNELS") && e.contains("maybe") && e.contains("avx2") && e.contains("0/false"),
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
            // SAFETY: as in `stream_read`.
            let err = unsafe { ffi::plexus_stream_read(h.as_ptr() as *mut _, pre.as_ptr() as *mut _, bad, &mut out) };
            let e = fused_result(err, out).unwrap_err().to_string();
            assert!(e.contains("instruction set") && e.contains(&bad.to_string()), "{e}");
        }
        let u = with_kernel_isa(KernelIsa::Baseline, || stream_read(&h, &pre)).unwrap();
        assert_eq!(u.size(), [3, 8]);
        assert_eq!(u.sum(tch::Kind::Float).double_value(&[]), 48.0);
        for isa in KernelIsa::ALL {
            let result = with_kernel_isa(isa, || stream_read(&h, &pre));
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
                let (w, v) = (crate::host::scalar(&want), crate::host::scalar(&got));
                assert!((w - v).abs() <= 1e-6 * w.abs(), "{kind:?} rows {rows}: loss {v} against {w}");
                let (gx, gr) = (x.grad(), x_ref.grad());
                assert_eq!(gx.kind(), kind);
                let scale = crate::host::scalar(&gr.abs().max());
                let err =
                    crate::host::scalar(&(gx.to_kind(tch::Kind::Double) - gr.to_kind(tch::Kind::Double)).abs().max());
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

    /// NVRTC (from the torch wheel) compiles the CUDA kernels (`src/native/*.cu`: Sinkhorn, the
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
            }
        }
        let k = cuda_kernels_compile(4, 990).unwrap();
        let ptx_arch: u32 = k.target.strip_prefix("compute_").and_then(|a| a.parse().ok()).expect("a PTX target");
        assert!((90..990).contains(&ptx_arch) && k.bytes > 1000, "{}: {} bytes", k.target, k.bytes);
        assert_eq!(k.spill_bytes(), None, "PTX: ptxas does not run");
        assert!(cuda_kernels_compile(9, 90).is_err_and(|e| e.to_string().contains("1 ≤ n ≤ 8")));
    }
}
