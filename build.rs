//! Link-time settings for libtorch, as tch-rs's own top-level build.rs does.
//!
//! * rpath to the libtorch directory, so the binary runs without LD_LIBRARY_PATH;
//! * `--no-as-needed` before the torch libraries: nothing in our objects references a symbol of
//!   `libtorch_cuda.so` directly (CUDA kernels register themselves at load time), so with the default
//!   `--as-needed` the linker would drop it and CUDA would be silently unavailable;
//! * the torch version we compile against, for `plexus doctor` (PyTorch wheels ship `version.py`
//!   next to `lib/`).
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let lib_dir = std::env::var_os("DEP_TCH_LIBTORCH_LIB").map(PathBuf::from);
    let version = lib_dir
        .as_ref()
        .and_then(|d| std::fs::read_to_string(d.join("..").join("version.py")).ok())
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("__version__ = ").map(|v| v.trim_matches(['\'', '"']).to_string()))
        })
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=PLEXUS_TORCH_BUILD_VERSION={version}");

    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if os != "linux" && os != "windows" {
        return;
    }
    if let Some(dir) = &lib_dir {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    }
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
    if let Some(dir) = &lib_dir {
        if dir.join("libtorch_cuda.so").exists() {
            println!("cargo:rustc-link-arg=-ltorch_cuda");
        }
    }
    println!("cargo:rustc-link-arg=-ltorch");
}
