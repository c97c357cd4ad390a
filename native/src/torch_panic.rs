//! libtorch errors that reach the user as panics, said in a few lines.
//!
//! tch's infallible methods (`matmul`, `to_device`, …) panic on a libtorch error with the whole
//! C++ exception: the message, then 40 frames of `libtorch_cpu.so` addresses, in one Rust debug
//! string (`called Result::unwrap() on an Err value: Torch("…")`). The error a user can act on —
//! "CUDA out of memory. Tried to allocate 2.00 GiB …", "invalid device ordinal" — is its first
//! line. [`install`] sets a panic hook that prints that line and a hint for the common causes
//! instead; with `RUST_BACKTRACE` set, the default report (with the Rust backtrace) follows.

/// The concise report of a panic message, if it is a libtorch error: `libtorch: <first line>`,
/// then a hint line where the cause is a known one. `None` for other panics (plexus bugs),
/// which keep Rust's default report.
pub fn describe(panic_message: &str) -> Option<String> {
    let start = panic_message.find("Torch(\"")? + "Torch(\"".len();
    let inner = &panic_message[start..];
    // The Debug string escapes newlines; the first line is libtorch's message proper.
    let first = inner.split("\\n").next().unwrap_or(inner).trim_end_matches("\")").trim();
    let hint = hint(first);
    let mut out = format!("libtorch: {first}");
    if let Some(h) = hint {
        out.push_str("\n  hint: ");
        out.push_str(h);
    }
    if std::env::var_os("RUST_BACKTRACE").is_none() {
        out.push_str("\n  (RUST_BACKTRACE=1 shows where in plexus it happened)");
    }
    Some(out)
}

/// What to do about a libtorch error, for the common causes (out of memory, a GPU index beyond
/// the machine's, a CUDA failure), from its message.
pub fn hint(message: &str) -> Option<&'static str> {
    let lower = message.to_lowercase();
    if lower.contains("out of memory") || lower.contains("can't allocate memory") {
        Some(
            "the model, batch or sequence does not fit: lower data.batch_size (train.accumulation keeps the \
             effective batch), use precision: bf16, or a smaller model; `plexus bench CONFIG` reports the \
             memory of a step",
        )
    } else if lower.contains("invalid device ordinal") {
        Some("a GPU index beyond the GPUs this machine has: check `device:` and --nproc against `plexus doctor`")
    } else if lower.contains("cuda error") || lower.contains("cublas") || lower.contains("cudnn") {
        Some(
            "a CUDA failure: `plexus doctor` checks the driver and runtime; CUDA_LAUNCH_BLOCKING=1 reports the \
             failing kernel where it happens",
        )
    } else {
        None
    }
}

/// The text of a panic payload (`&str` or `String`; anything else has none).
pub fn payload_text(payload: &(dyn std::any::Any + Send)) -> Option<&str> {
    payload.downcast_ref::<&str>().copied().or_else(|| payload.downcast_ref::<String>().map(String::as_str))
}

/// Installs the hook: libtorch errors as [`describe`] says them (plus the default report when
/// `RUST_BACKTRACE` is set), every other panic as before.
pub fn install() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| match payload_text(info.payload()).and_then(describe) {
        Some(text) => {
            eprintln!("error: {text}");
            if std::env::var_os("RUST_BACKTRACE").is_some() {
                default(info);
            }
        }
        None => default(info),
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind, Tensor};

    #[test]
    fn a_real_libtorch_panic_is_said_in_its_first_line() {
        // A shape error libtorch raises on the CPU, caught as the panic a user would see.
        let payload = std::panic::catch_unwind(|| {
            let a = Tensor::zeros([2, 3], (Kind::Float, Device::Cpu));
            let _ = a.matmul(&Tensor::zeros([4, 5], (Kind::Float, Device::Cpu)));
        })
        .expect_err("a 2×3 by 4×5 matmul must fail");
        let raw = payload_text(payload.as_ref()).expect("tch panics with a String");
        assert!(raw.contains("Exception raised from"), "the raw message carries the C++ trace: {raw}");
        let said = describe(raw).expect("a libtorch error");
        let first = said.lines().next().unwrap();
        assert!(first.starts_with("libtorch: ") && first.contains("cannot be multiplied"), "{said}");
        assert!(!said.contains("Exception raised from") && !said.contains("frame #"), "{said}");
    }

    #[test]
    fn known_causes_get_a_hint_and_other_panics_keep_the_default_report() {
        let oom = "called `Result::unwrap()` on an `Err` value: Torch(\"CUDA out of memory. Tried to allocate \
                   2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB is free.\\nException \
                   raised from malloc at /pytorch/c10/cuda/CUDACachingAllocator.cpp:1370\")";
        let said = describe(oom).unwrap();
        assert!(said.starts_with("libtorch: CUDA out of memory. Tried to allocate 2.00 GiB."), "{said}");
        assert!(said.contains("data.batch_size") && !said.contains("CUDACachingAllocator"), "{said}");
        // As seen on an H100 with --nproc 2 (before that was refused up front).
        let ordinal = "Torch(\"CUDA error: invalid device ordinal\\nGPU device may be out of range\")";
        assert!(describe(ordinal).unwrap().contains("--nproc"));
        assert!(describe("index out of bounds: the len is 3 but the index is 5").is_none());
    }
}
