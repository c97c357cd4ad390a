//! glibc malloc: its settings for libtorch's CPU tensors, and what it holds.
//!
//! libtorch allocates every CPU tensor with `malloc`. glibc's defaults suit programs that allocate
//! and free small objects: a block above the mmap threshold (128 KiB at first, raised
//! dynamically up to the largest block freed so far) gets its own `mmap`, and when more than
//! twice that threshold lies free at the top of the heap it is handed back to the kernel. A
//! training step does the opposite: it allocates hundreds of megabytes of activations and
//! gradients, frees nearly all of them at the end of backward, and allocates the same sizes again
//! in the next step. With the defaults part of that memory goes back to the kernel every step and
//! comes back as fresh pages, each a page fault that zeroes 4 KiB on first touch inside whichever
//! kernel writes it first. On this project's 2-core benchmark machine that was ~5,300 faults per
//! step on the GPT case with Hyper-Connections (21 MB of fresh pages, ~9 % of the step), most of
//! them charged to the stream kernels, whose outputs are 4 MB tensors.
//!
//! [`keep_freed_memory`] fixes the thresholds instead: blocks up to 32 MiB (glibc's largest mmap
//! threshold) come from the heap, and up to 256 MiB freed at its top stay mapped, with 64 MiB of
//! headroom kept when it does shrink. The step then reuses the same pages (no faults per step,
//! measured); the cost is that the process keeps up to that much freed memory resident, as
//! PyTorch's CUDA caching allocator keeps GPU memory. `PLEXUS_MALLOC=default`, or any of glibc's
//! own `MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`, `MALLOC_TOP_PAD_` variables, leaves
//! malloc as it is.

/// Largest block served from the heap rather than its own mmap (glibc's maximum on 64-bit).
pub const MMAP_THRESHOLD: usize = 32 << 20;
/// Free memory at the top of the heap kept before glibc returns any to the kernel.
pub const TRIM_THRESHOLD: usize = 256 << 20;
/// Headroom kept above the heap's top when it grows or shrinks.
pub const TOP_PAD: usize = 64 << 20;

/// What [`keep_freed_memory`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MallocSettings {
    /// The thresholds above are set.
    Kept,
    /// `PLEXUS_MALLOC=default` or a `MALLOC_*_` variable of glibc's: malloc left as configured.
    LeftToEnvironment,
    /// Not glibc (or mallopt refused a value): malloc left as it is.
    Unavailable,
}

impl MallocSettings {
    /// One line for `plexus doctor`.
    pub fn describe(self) -> String {
        match self {
            MallocSettings::Kept => format!(
                "glibc, freed memory kept for reuse (heap blocks up to {} MiB, {} MiB kept at the top; \
                 PLEXUS_MALLOC=default for glibc's defaults)",
                MMAP_THRESHOLD >> 20,
                TRIM_THRESHOLD >> 20
            ),
            MallocSettings::LeftToEnvironment => {
                "as the environment sets it (PLEXUS_MALLOC=default or MALLOC_*_ variables)".into()
            }
            MallocSettings::Unavailable => "the platform's defaults".into(),
        }
    }
}

/// Whether the environment asks to leave malloc alone.
fn left_to_environment(var: impl Fn(&str) -> Option<String>) -> bool {
    let plexus_default = var("PLEXUS_MALLOC").is_some_and(|v| v.trim().eq_ignore_ascii_case("default"));
    plexus_default
        || ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_"].iter().any(|k| var(k).is_some())
}

/// Sets glibc's thresholds so that a training step's freed tensors are reused, not returned to
/// the kernel and faulted in again (see the module docs). Process-wide; call it once at start-up,
/// before the first large allocation. Later calls return what the first one did.
pub fn keep_freed_memory() -> MallocSettings {
    static DONE: std::sync::OnceLock<MallocSettings> = std::sync::OnceLock::new();
    *DONE.get_or_init(|| {
        if left_to_environment(|k| std::env::var(k).ok()) {
            MallocSettings::LeftToEnvironment
        } else {
            set_thresholds()
        }
    })
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_thresholds() -> MallocSettings {
    use libc::{mallopt, M_MMAP_THRESHOLD, M_TOP_PAD, M_TRIM_THRESHOLD};
    let settings = [(M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD), (M_TOP_PAD, TOP_PAD)];
    // SAFETY: mallopt takes two ints and only changes malloc's parameters; it returns 0 on error.
    let ok = settings.iter().all(|&(param, value)| unsafe { mallopt(param, value as i32) } == 1);
    if ok {
        MallocSettings::Kept
    } else {
        MallocSettings::Unavailable
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_thresholds() -> MallocSettings {
    MallocSettings::Unavailable
}

/// Bytes currently allocated through malloc (heap + mmapped chunks, glibc's `mallinfo2`); `None`
/// where this is not glibc. libtorch allocates CPU tensors with malloc, so differences of this
/// around a computation are the bytes it left allocated.
pub fn heap_in_use() -> Option<usize> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 takes no arguments and returns a plain struct (glibc ≥ 2.33).
        let m = unsafe { libc::mallinfo2() };
        Some(m.uordblks + m.hblkhd)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}

/// Minor page faults so far: of the calling thread (`thread = true`) or of the process. `None`
/// where getrusage is not available (not Linux).
pub fn minor_faults(thread: bool) -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        let who = if thread { libc::RUSAGE_THREAD } else { libc::RUSAGE_SELF };
        // SAFETY: `rusage` is plain old data; zeroed is a valid value, and getrusage only writes it.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `u` is a valid, writable `struct rusage` for the duration of the call.
        let rc = unsafe { libc::getrusage(who, &mut u) };
        (rc == 0).then_some(u.ru_minflt as u64)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = thread;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_can_keep_glibcs_defaults() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        assert!(!left_to_environment(env(&[])));
        assert!(!left_to_environment(env(&[("PLEXUS_MALLOC", "keep")])));
        assert!(left_to_environment(env(&[("PLEXUS_MALLOC", " Default ")])));
        assert!(left_to_environment(env(&[("MALLOC_TOP_PAD_", "0")])));
        assert!(left_to_environment(env(&[("MALLOC_MMAP_THRESHOLD_", "131072")])));
    }

    /// What a training step does, in miniature: 48 MB of 4 MB buffers written, all freed, three
    /// times. With the thresholds set the third round reuses the pages of the first: no page
    /// faults on this thread. With glibc's defaults it faults all 12,288 pages in again (the
    /// freed top of the heap went back to the kernel), as each step of a training run did.
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn a_freed_step_is_reused_without_page_faults() {
        assert_eq!(set_thresholds(), MallocSettings::Kept);
        let round = || {
            let bufs: Vec<Vec<f32>> = (0..12).map(|_| std::hint::black_box(vec![1.0f32; 1 << 20])).collect();
            let s: f64 = bufs.iter().map(|b| b[b.len() / 2] as f64 + b[b.len() - 1] as f64).sum();
            assert_eq!(s, 24.0);
        };
        round();
        round();
        let before = minor_faults(true).expect("getrusage");
        round();
        let faults = minor_faults(true).expect("getrusage") - before;
        assert!(faults < 200, "{faults} page faults in the third round (12,288 pages were freed and reused)");
    }
}
