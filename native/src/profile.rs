//! What ran: operators counted per step (`plexus bench`), host-device syncs seen by the
//! dispatcher, and the operator trace of a closure (the CUDA-graph safety tests).

use super::{check, ffi, take_string, NativeError, Result};
use std::cell::Cell;
use std::ffi::{c_char, c_int};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread::LocalKey;

/// The C++ side keeps one operator callback of each kind (counting, tracing) for the process, so
/// one count and one trace run at a time: a count on another thread (a test beside, a benchmark
/// thread) waits for this one instead of failing, and a count nested in a count on the same
/// thread is an error instead of a deadlock. If the closure panics, dropping this ends the C++
/// side's session, so that the next one can start.
struct OneAtATime {
    _lock: MutexGuard<'static, ()>,
    busy: &'static LocalKey<Cell<bool>>,
    /// Ends the C++ session after a panic in the closure; taken once the caller ends it itself.
    end_on_unwind: Option<fn()>,
}

impl OneAtATime {
    fn begin(
        lock: &'static Mutex<()>,
        busy: &'static LocalKey<Cell<bool>>,
        nested: &str,
        begin: impl FnOnce() -> Result<()>,
        end: fn(),
    ) -> Result<Self> {
        if busy.get() {
            return Err(NativeError::InvalidArgument(nested.to_string()));
        }
        let guard = lock.lock().unwrap_or_else(PoisonError::into_inner);
        begin()?;
        busy.set(true);
        Ok(OneAtATime { _lock: guard, busy, end_on_unwind: Some(end) })
    }

    /// The closure returned: the caller ends the C++ session itself and reads its results.
    fn finished(&mut self) {
        self.end_on_unwind = None;
    }
}

impl Drop for OneAtATime {
    fn drop(&mut self) {
        if let Some(end) = self.end_on_unwind.take() {
            end();
        }
        self.busy.set(false);
    }
}

static COUNT_LOCK: Mutex<()> = Mutex::new(());
static TRACE_LOCK: Mutex<()> = Mutex::new(());
thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static TRACING: Cell<bool> = const { Cell::new(false) };
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
    /// Bytes the working operators wrote (their outputs' sizes, by dtype) and read.
    pub bytes: OpBytes,
    /// The same operators by fp32 bytes written, most first (those that wrote none left out).
    pub f32_bytes_by_name: Vec<(String, u64)>,
}

/// Bytes a step's working operators wrote, by the dtype of what they wrote, and read: on a GPU,
/// where elementwise work is bound by memory traffic, a proxy of that traffic which a CPU measures
/// exactly (the fp32 bytes written are the step's fp32 temporaries: norm outputs, casts, fp32
/// gradients). An operator that writes in place counts the tensor it wrote; one that returns
/// nothing (the fused AdamW step) counts nothing; plexus' own kernels count what they return.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpBytes {
    /// fp32 (and fp64) outputs.
    pub f32: u64,
    /// bf16 (and fp16) outputs.
    pub half: u64,
    /// Integer and boolean outputs.
    pub other: u64,
    /// The working operators' tensor operands, every dtype: what they read, at most (an in-place
    /// operator's tensor, or a copy's destination, counts as an operand and as written; an
    /// embedding lookup counts its table).
    pub read: u64,
}

impl OpBytes {
    /// Every byte written, any dtype.
    pub fn written(&self) -> u64 {
        self.f32 + self.half + self.other
    }
}

impl OpCount {
    /// Wall time of all the working leaf operators, in ms.
    pub fn total_ms(&self) -> f64 {
        self.ms_by_name.iter().map(|(_, ms)| ms).sum()
    }
}

/// Runs `f` while counting the operators libtorch executes (see [`OpCount`]). Counting slows
/// every operator call; time nothing inside. One count at a time per process: a count on another
/// thread waits for this one; nested in a count on this thread it is an error.
pub fn count_ops<T>(f: impl FnOnce() -> T) -> Result<(T, OpCount)> {
    let mut session = OneAtATime::begin(
        &COUNT_LOCK,
        &COUNTING,
        "operator counting is already running on this thread (count_ops inside count_ops)",
        // SAFETY: no arguments; the C++ side registers a global callback.
        || check(unsafe { ffi::plexus_op_count_begin() }),
        || drop(end_count()),
    )?;
    let value = f();
    session.finished();
    let (out, names) = end_count()?;
    let rows = parse_count_rows(&names);
    let mut by_name: Vec<(String, u64)> = rows.iter().map(|r| (r.name.clone(), r.calls)).collect();
    by_name.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut ms_by_name: Vec<(String, f64)> = rows.iter().map(|r| (r.name.clone(), r.ns as f64 / 1e6)).collect();
    ms_by_name.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut f32_bytes_by_name: Vec<(String, u64)> =
        rows.iter().filter(|r| r.bytes.f32 > 0).map(|r| (r.name.clone(), r.bytes.f32)).collect();
    f32_bytes_by_name.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let bytes = rows.iter().fold(OpBytes::default(), |t, r| OpBytes {
        f32: t.f32 + r.bytes.f32,
        half: t.half + r.bytes.half,
        other: t.other + r.bytes.other,
        read: t.read + r.bytes.read,
    });
    let count =
        OpCount { kernels: out[0], metadata: out[1], calls: out[2], by_name, ms_by_name, bytes, f32_bytes_by_name };
    Ok((value, count))
}

/// One line of the C++ side's count.
struct CountRow {
    name: String,
    calls: u64,
    ns: u64,
    bytes: OpBytes,
}

/// "name calls ns fp32-bytes half-bytes other-bytes read-bytes" per line; a name may contain
/// spaces, the numbers do not.
fn parse_count_rows(text: &str) -> Vec<CountRow> {
    text.lines()
        .filter_map(|l| {
            let mut fields = l.rsplitn(7, ' ');
            let mut num = || fields.next()?.parse::<u64>().ok();
            let (read, other, half, f32, ns, calls) = (num()?, num()?, num()?, num()?, num()?, num()?);
            let name = fields.next()?.to_string();
            Some(CountRow { name, calls, ns, bytes: OpBytes { f32, half, other, read } })
        })
        .collect()
}

/// Ends the C++ side's count: [working leaf operators, view/allocation leaves, all calls] and the
/// "name calls nanoseconds" lines.
fn end_count() -> Result<([u64; 3], String)> {
    let mut out = [0u64; 3];
    let mut names: *mut c_char = std::ptr::null_mut();
    // SAFETY: `out` has the 3 slots the C++ side writes; `names` receives a malloc'd string.
    check(unsafe { ffi::plexus_op_count_end(out.as_mut_ptr(), &mut names) })?;
    Ok((out, take_string(names)))
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
            _ => Err(NativeError::InvalidSetting(format!(
                "PLEXUS_COUNT_SYNCS={v:?}: allowed are 1 (count host-device syncs per step) and 0"
            ))),
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
/// graph. Slow (every input is inspected); one trace at a time per process (as [`count_ops`]).
pub fn trace_ops<T>(f: impl FnOnce() -> T) -> Result<(T, Vec<String>)> {
    let mut session = OneAtATime::begin(
        &TRACE_LOCK,
        &TRACING,
        "an operator trace is already being recorded on this thread (trace_ops inside trace_ops)",
        // SAFETY: no arguments; the C++ side registers a global callback.
        || check(unsafe { ffi::plexus_op_trace_begin() }),
        || drop(end_trace()),
    )?;
    let value = f();
    session.finished();
    Ok((value, end_trace()?.lines().map(str::to_string).collect()))
}

/// Ends the C++ side's trace: one line per operator call.
fn end_trace() -> Result<String> {
    let mut text: *mut c_char = std::ptr::null_mut();
    // SAFETY: `text` receives a malloc'd string on success.
    check(unsafe { ffi::plexus_op_trace_end(&mut text) })?;
    Ok(take_string(text))
}
