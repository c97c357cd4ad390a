//! Whole-step CUDA graphs (`native/src/cuda_graph.cpp`, libtorch's `at::cuda::CUDAGraph`) and
//! the memory pool the graphs of a process share.
//!
//! The lifecycle a process must survive (the first GPU slot's self-test did not): a run captures
//! a graph, ends, and the next run in the same process (the self-test, a directory of configs, a
//! sweep's `--only` loop, `bench --compare`) captures another. libtorch's caching allocator keeps
//! a graph pool alive while any block allocated in it is alive, even after every graph that used
//! it is gone, and then refuses a new capture into it (`use_count > 0` assertion) — after it has
//! already marked the default CUDA generator as capturing, so that every later random draw of
//! the process fails ("Offset increment outside graph capture encountered unexpectedly").
//! Hence:
//! * graphs alive at the same time share one pool (their step's temporaries reuse each other's
//!   memory), and the first capture after every earlier graph is gone gets a new pool
//!   ([`SharedPool`]);
//! * a capture that fails on the C++ side gives the default generator back a state that is not
//!   capturing (same seed and offset), so that the process can go on (cuda_graph.cpp).

use super::{check, ffi, NativeError, Result};
use std::ffi::{c_char, c_void};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

/// Whether this build has CUDA graphs (CUDA headers that compile were found at build time, as
/// for NCCL; `scripts/setup.sh` installs them).
pub fn cuda_graphs_built() -> bool {
    // SAFETY: no arguments, returns a constant.
    unsafe { ffi::plexus_cuda_graphs_built() != 0 }
}

/// A libtorch graph memory pool id (`c10::MempoolId_t`, a pair).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolId(pub u64, pub u64);

/// One value shared by everything that holds it at the same time, and a new one (from `mint`)
/// once every holder has dropped its handle: the graph pool's rule (see the module doc), kept
/// apart from CUDA so that a CPU test can check it.
pub struct SharedPool<T> {
    live: Mutex<Weak<T>>,
}

impl<T> SharedPool<T> {
    /// A pool that holds nothing yet (the first [`get_or_mint`](Self::get_or_mint) mints).
    pub const fn new() -> Self {
        Self { live: Mutex::new(Weak::new()) }
    }

    /// The value someone holds now, or a new one from `mint` if nobody does.
    pub fn get_or_mint(&self, mint: impl FnOnce() -> Result<T>) -> Result<Arc<T>> {
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(held) = live.upgrade() {
            return Ok(held);
        }
        let fresh = Arc::new(mint()?);
        *live = Arc::downgrade(&fresh);
        Ok(fresh)
    }
}

impl<T> Default for SharedPool<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// The pool of the process's graphs, held by every graph whose capture began.
static POOL: SharedPool<PoolId> = SharedPool::new();

fn new_pool_id() -> Result<PoolId> {
    let mut id = [0u64; 2];
    // SAFETY: `id` has the two slots the C++ side writes.
    check(unsafe { ffi::plexus_cuda_graph_pool_handle(id.as_mut_ptr()) })?;
    Ok(PoolId(id[0], id[1]))
}

/// A whole-step CUDA graph on one device: warm-up steps run between [`CudaGraph::enter`] and
/// [`CudaGraph::leave`] on its side stream; one step is recorded between
/// [`CudaGraph::capture_begin`] and [`CudaGraph::capture_end`] (on the side stream, nothing runs);
/// [`CudaGraph::replay`] then runs it on the current stream. Drop frees the graph and gives its
/// share of the pool back.
pub struct CudaGraph {
    ptr: NonNull<c_void>,
    /// Set once the capture began: the graph then holds the pool until it is freed.
    pool: OnceLock<Arc<PoolId>>,
}

impl CudaGraph {
    /// An empty graph on CUDA device `device` (nothing captured yet).
    pub fn new(device: usize) -> Result<Self> {
        let mut out: *mut c_void = std::ptr::null_mut();
        // SAFETY: out-parameter only; a non-null handle is owned by the returned value.
        check(unsafe { ffi::plexus_cuda_graph_new(device as i64, &mut out) })?;
        Ok(Self {
            ptr: NonNull::new(out).ok_or_else(|| NativeError::Malformed("cuda graph: null handle".into()))?,
            pool: OnceLock::new(),
        })
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

    /// Starts recording into the process's shared pool. On an error nothing is recording, and
    /// the default CUDA generator is not left capturing.
    pub fn capture_begin(&self) -> Result<()> {
        let pool = POOL.get_or_mint(new_pool_id)?;
        // SAFETY: live handle; plain value arguments.
        check(unsafe { ffi::plexus_cuda_graph_capture_begin(self.ptr.as_ptr(), pool.0, pool.1) })?;
        // Held only once libtorch counts this graph as a user of the pool (a capture that failed
        // before may not have), so that the pool is never handed to a capture after its last
        // counted user is gone.
        let _ = self.pool.set(pool);
        Ok(())
    }

    /// Ends the capture begun by `capture_begin`; on an error the default CUDA generator is
    /// released (cuda_graph.cpp's `release_generator`) and the graph is not replayable.
    pub fn capture_end(&self) -> Result<()> {
        self.call(ffi::plexus_cuda_graph_capture_end)
    }

    /// Launches the captured work again, on the current stream, with the same buffers.
    pub fn replay(&self) -> Result<()> {
        self.call(ffi::plexus_cuda_graph_replay)
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        // SAFETY: the handle is live and dropped once. libtorch gives its count on the pool back
        // here; this value's hold on the pool (`self.pool`) is dropped after.
        unsafe { ffi::plexus_cuda_graph_free(self.ptr.as_ptr()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Holders at the same time share the value; once every one is gone, the next gets a new one
    /// (never the old, whose libtorch pool may still exist with no counted user).
    #[test]
    fn a_pool_is_shared_while_held_and_new_once_released() {
        let pool = SharedPool::new();
        let minted = std::cell::Cell::new(0);
        let get = || {
            pool.get_or_mint(|| {
                minted.set(minted.get() + 1);
                Ok(minted.get())
            })
            .unwrap()
        };
        let (a, b) = (get(), get());
        assert_eq!((*a, *b, minted.get()), (1, 1, 1));
        drop(a);
        assert_eq!(*get(), 1, "still held by b");
        drop(b);
        assert_eq!(*get(), 2, "every holder gone: a new pool");
        assert_eq!(minted.get(), 2);
        // A failed mint leaves nothing held.
        let e = pool.get_or_mint(|| Err(NativeError::Failed("no CUDA".into()))).unwrap_err();
        assert_eq!(e.to_string(), "no CUDA");
        assert_eq!(*get(), 3);
    }
}
