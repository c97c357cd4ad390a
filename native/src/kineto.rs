//! libtorch's profiler (Kineto, `native/src/kineto.cpp`): the CPU operators of a closure and, on a
//! GPU, the CUDA runtime calls and the kernels (CUPTI), as events; and plexus' scopes, named ranges
//! that tell which part of plexus asked for an operator (the topology, a unit, RoPE, the loss,
//! the optimizer), as `torch.profiler.record_function` does in PyTorch.

use super::{check, ffi, take_string, NativeError, Result};
use std::ffi::{c_void, CStr, CString};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// What an event is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// A libtorch operator on the host (`aten::addmm`, a backward node, …).
    Op,
    /// A plexus scope ([`scope`]).
    Scope,
    /// A CUDA runtime or driver call on the host (a kernel launch, a copy, a sync).
    Launch,
    /// A kernel on the device.
    Kernel,
    /// A copy or a fill on the device.
    Memcpy,
    Memset,
    Other,
}

/// One event of a profile; times in ns on the profiler's clock.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileEvent {
    pub kind: EventKind,
    pub name: String,
    pub thread: u64,
    pub start_ns: u64,
    pub duration_ns: u64,
    /// An operator's: the `linked` of the kernels and runtime calls it made. A kernel's: its
    /// runtime call's.
    pub correlation: u64,
    /// A kernel's or a runtime call's: the `correlation` of the operator that made it (0: none).
    pub linked: u64,
    /// An operator's autograd sequence number: a backward node has the number of the forward
    /// operator that made it (on `forward_thread`); −1 where none.
    pub sequence_nr: i64,
    pub forward_thread: u64,
}

impl ProfileEvent {
    /// When the event ended, in the profiler's clock (ns).
    pub fn end_ns(&self) -> u64 {
        self.start_ns + self.duration_ns
    }
}

static PROFILING: AtomicBool = AtomicBool::new(false);
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs `f` under libtorch's profiler: the host's operators, and with `cuda` the CUDA runtime
/// calls and the kernels. With `trace`, the Chrome trace (chrome://tracing, ui.perfetto.dev) is
/// written there. One profile at a time per process (another waits).
pub fn profile_events<T>(cuda: bool, trace: Option<&Path>, f: impl FnOnce() -> T) -> Result<(T, Vec<ProfileEvent>)> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let trace = trace
        .map(|p| {
            CString::new(p.to_string_lossy().as_bytes())
                .map_err(|_| NativeError::InvalidArgument(format!("a trace path with a NUL byte: {p:?}")))
        })
        .transpose()?;
    // SAFETY: plain value argument.
    check(unsafe { ffi::plexus_kineto_begin(cuda as i32) })?;
    PROFILING.store(true, Ordering::SeqCst);
    // Ends the profiler however `f` ends (a panic included), so that the next profile can start.
    struct End(Option<Option<CString>>);
    impl End {
        fn end(&mut self) -> Result<String> {
            let Some(trace) = self.0.take() else {
                return Err(NativeError::InvalidArgument("the profile was ended already".into()));
            };
            PROFILING.store(false, Ordering::SeqCst);
            let mut text: *mut std::ffi::c_char = std::ptr::null_mut();
            let path = trace.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
            // SAFETY: `path` is null or a NUL-terminated string that outlives the call; `text`
            // receives a malloc'd string on success.
            check(unsafe { ffi::plexus_kineto_end(path, &mut text) })?;
            Ok(take_string(text))
        }
    }
    impl Drop for End {
        fn drop(&mut self) {
            if self.0.is_some() {
                let _ = self.end();
            }
        }
    }
    let mut end = End(Some(trace));
    let value = f();
    let text = end.end()?;
    Ok((value, parse_events(&text)?))
}

fn parse_events(text: &str) -> Result<Vec<ProfileEvent>> {
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|line| {
            let f: Vec<&str> = line.split('\t').collect();
            let [kind, name, thread, start, dur, corr, linked, seq, fwd] = f[..] else {
                return Err(NativeError::Malformed(format!("a profiler event of {} fields, not 9: {line:?}", f.len())));
            };
            let kind = match kind {
                "op" => EventKind::Op,
                "scope" => EventKind::Scope,
                "launch" => EventKind::Launch,
                "kernel" => EventKind::Kernel,
                "memcpy" => EventKind::Memcpy,
                "memset" => EventKind::Memset,
                _ => EventKind::Other,
            };
            let bad = |_| NativeError::Malformed(format!("profiler event {line:?}"));
            let n = |s: &str| s.parse::<u64>().map_err(bad);
            Ok(ProfileEvent {
                kind,
                name: name.to_string(),
                thread: n(thread)?,
                start_ns: n(start)?,
                duration_ns: n(dur)?,
                correlation: n(corr)?,
                linked: n(linked)?,
                sequence_nr: seq.parse().map_err(bad)?,
                forward_thread: n(fwd)?,
            })
        })
        .collect()
}

/// Whether a libtorch operator only makes a view or allocates (`aten::view`, `aten::empty`, …):
/// those `profile::count_ops` does not count as kernels (one list, the C++ side's).
pub fn is_metadata_op(name: &str) -> bool {
    let Ok(c) = CString::new(name) else { return false };
    // SAFETY: a NUL-terminated string that outlives the call.
    unsafe { ffi::plexus_op_is_metadata(c.as_ptr()) != 0 }
}

/// The scopes plexus opens, by what runs under them (`plexus bench --profile` sorts time by them).
pub mod scopes {
    use std::ffi::CStr;
    /// A topology's own work: its forward minus the units' (opened around the topology's forward).
    pub const TOPOLOGY: &CStr = c"plexus::topology";
    /// A backbone unit, inside the topology's scope (its work is the backbone's).
    pub const UNIT: &CStr = c"plexus::unit";
    /// Rotary position embedding of the queries and keys.
    pub const ROPE: &CStr = c"plexus::rope";
    /// The task's loss on the model output.
    pub const LOSS: &CStr = c"plexus::loss";
    /// Gradient norm, clipping, the update, dropping the gradients.
    pub const OPTIMIZER: &CStr = c"plexus::optimizer";
}

/// An open plexus scope (see [`scope`]); closed on drop.
pub struct Scope(*mut c_void);

impl Drop for Scope {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: a scope `plexus_scope_begin` returned, ended once.
            unsafe { ffi::plexus_scope_end(self.0) }
        }
    }
}

/// Opens the scope `name` until the returned guard drops, on this thread: the operators run
/// meanwhile are attributed to it in a [`profile_events`]. Free while no profile runs (nothing crosses
/// into C++).
pub fn scope(name: &'static CStr) -> Scope {
    if !PROFILING.load(Ordering::Relaxed) {
        return Scope(std::ptr::null_mut());
    }
    // SAFETY: `name` has static storage, as libtorch's RecordFunction keeps the pointer.
    Scope(unsafe { ffi::plexus_scope_begin(name.as_ptr()) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind, Tensor};

    /// On the CPU: the operators of the closure, nested in the scope that was open, with a
    /// duration; a Chrome trace written; nothing recorded outside a profile.
    #[test]
    fn the_profiler_records_operators_and_scopes() {
        let dir = tempfile::tempdir().unwrap();
        let trace = dir.path().join("t.json");
        drop(scope(c"plexus::outside"));
        let a = Tensor::ones([64, 64], (Kind::Float, Device::Cpu));
        let (_, events) = profile_events(false, Some(&trace), || {
            let _s = scope(c"plexus::test");
            a.mm(&a).sum(Kind::Float)
        })
        .unwrap();
        let s = events.iter().find(|e| e.kind == EventKind::Scope && e.name == "plexus::test").expect("the scope");
        let mm = events.iter().find(|e| e.kind == EventKind::Op && e.name == "aten::mm").expect("aten::mm");
        assert!(s.start_ns <= mm.start_ns && mm.end_ns() <= s.end_ns() && mm.thread == s.thread, "{s:?} {mm:?}");
        assert!(mm.duration_ns > 0);
        assert!(!events.iter().any(|e| e.name == "plexus::outside"));
        let json = std::fs::read_to_string(&trace).unwrap();
        assert!(json.contains("\"traceEvents\"") && json.contains("aten::mm"), "{}", &json[..json.len().min(300)]);
        assert!(is_metadata_op("aten::view") && !is_metadata_op("aten::mm"));
        // The next profile starts (the first was ended).
        profile_events(false, None, || ()).unwrap();
    }
}
