//! Data-parallel collectives on c10d: TCPStore rendezvous, ProcessGroupGloo or ProcessGroupNCCL;
//! pinned host memory for asynchronous copies.

use super::{check, ffi, NativeError, Result};
use std::ffi::{c_int, c_void, CString};
use std::ptr::NonNull;
use std::time::Duration;
use tch::Tensor;

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

/// The c10d backend a [`ProcessGroup`] runs on (defined at the crate's root, below every module,
/// as the errors that name it are).
pub use super::Backend;

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
            return Err(NativeError::InvalidArgument("process group: world size must be at least 1".into()));
        }
        if rank >= world_size {
            return Err(NativeError::InvalidArgument(format!(
                "process group: rank {rank} is out of range for world size {world_size}"
            )));
        }
        if port == 0 {
            return Err(NativeError::InvalidArgument(
                "process group: port 0 cannot be used, every rank must know rank 0's store port".into(),
            ));
        }
        let timeout_ms = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
        if timeout_ms == 0 {
            return Err(NativeError::InvalidArgument(format!(
                "process group: the timeout must be at least 1 ms, got {timeout:?}"
            )));
        }
        if backend == Backend::Nccl && !nccl_built() {
            return Err(NativeError::InvalidArgument(format!(
                "process group: plexus was built without NCCL: {}",
                crate::NCCL_MISSING
            )));
        }
        let c_addr = CString::new(addr).map_err(|_| {
            NativeError::InvalidArgument(format!("process group: address {addr:?} contains a NUL byte"))
        })?;
        // rank < world_size, both counts of processes.
        let (rank_i, world_i) = (rank as i64, world_size as i64);
        let kind: c_int = match backend {
            Backend::Gloo => 0,
            Backend::Nccl => 1,
        };
        let mut handle: *mut c_void = std::ptr::null_mut();
        // SAFETY: `c_addr` and `handle` outlive the call; `handle` is set only on success.
        check(unsafe { ffi::plexus_pg_new(kind, c_addr.as_ptr(), port, rank_i, world_i, timeout_ms, &mut handle) })?;
        let handle = NonNull::new(handle)
            .ok_or_else(|| NativeError::Malformed("process group: set-up returned no handle".into()))?;
        Ok(Self { handle, backend, rank, world_size })
    }

    /// This process's rank in the group, `0..world_size`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of processes in the group.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The c10d backend the group communicates through (NCCL on GPUs, Gloo on CPUs).
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
            return Err(NativeError::InvalidArgument(format!(
                "process group: broadcast root {root} is out of range for world size {}",
                self.world_size
            )));
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

    fn context(&self, e: NativeError, op: &'static str) -> NativeError {
        NativeError::Collective {
            op,
            rank: self.rank,
            world_size: self.world_size,
            backend: self.backend,
            error: Box::new(e),
        }
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
