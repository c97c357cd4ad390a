//! plexus's build script: the link set-up for libtorch (`build-support/libtorch.rs`, shared with
//! native/build.rs: rpath, `--no-as-needed`, libtorch's OpenMP runtime) and the torch version we
//! compile against, for `plexus doctor` (PyTorch wheels ship `version.py` next to `lib/`). The
//! native layer (C++ and CUDA) is its own crate, `native/` (plexus-native), with its own build
//! script.

include!("build-support/libtorch.rs");

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=build-support/libtorch.rs");
    let lib_dir = libtorch_lib_dir();
    let version = lib_dir
        .as_ref()
        .and_then(|d| std::fs::read_to_string(d.join("..").join("version.py")).ok())
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("__version__ = ").map(|v| v.trim_matches(['\'', '"']).to_string()))
        })
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=PLEXUS_TORCH_BUILD_VERSION={version}");
    link_libtorch(lib_dir.as_deref());
}
