// Link set-up for libtorch, shared by the build scripts of the workspace (plexus's build.rs and
// native/build.rs include this file): each crate's own binaries (the plexus binary, the test
// binaries of either crate) get the same link arguments, since a dependency's `rustc-link-arg`
// does not reach a dependent's binaries.
//
// * rpath to the libtorch directory, so a binary runs without LD_LIBRARY_PATH;
// * `--no-as-needed` before the torch libraries: nothing in our objects references a symbol of
//   `libtorch_cuda.so` directly (CUDA kernels register themselves at load time), so with the
//   default `--as-needed` the linker would drop it and CUDA would be silently unavailable;
// * libtorch's own OpenMP runtime (see `openmp_runtime`).

/// libtorch's `lib/` directory, as torch-sys reports it to the crates that depend on it directly.
fn libtorch_lib_dir() -> Option<std::path::PathBuf> {
    std::env::var_os("DEP_TCH_LIBTORCH_LIB").map(std::path::PathBuf::from)
}

/// Prints the link arguments above for this crate's binaries (on Linux and Windows).
fn link_libtorch(lib_dir: Option<&std::path::Path>) {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if os != "linux" && os != "windows" {
        return;
    }
    if let Some(dir) = lib_dir {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    }
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
    if let Some(dir) = lib_dir {
        if dir.join("libtorch_cuda.so").exists() {
            println!("cargo:rustc-link-arg=-ltorch_cuda");
        }
    }
    println!("cargo:rustc-link-arg=-ltorch");
    if let Some(gomp) = lib_dir.and_then(openmp_runtime) {
        println!("cargo:rustc-link-arg={}", gomp.display());
    }
}

/// libtorch's OpenMP runtime, when its `lib/` ships one: `libgomp.so.1` in the PyPI wheels,
/// `libgomp-<hash>.so.1` in the libtorch archives.
///
/// `at::parallel_for` is a header template: it runs its loop on libtorch's intra-op threads only in
/// a file compiled with OpenMP (`_OPENMP` defined), and on the calling thread alone otherwise. The
/// native layer's fused kernels call it, so they are compiled with `-fopenmp` and linked against
/// this very file — not the system compiler's libgomp — so that the process keeps one OpenMP
/// runtime, one thread pool, and `torch::set_num_threads` governs both. Without it (a libtorch
/// built with another OpenMP, or none) they build without OpenMP and run on one thread.
fn openmp_runtime(lib_dir: &std::path::Path) -> Option<std::path::PathBuf> {
    let wheel = lib_dir.join("libgomp.so.1");
    if wheel.is_file() {
        return Some(wheel);
    }
    let mut bundled: Vec<std::path::PathBuf> = std::fs::read_dir(lib_dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with("libgomp-") && name.ends_with(".so.1")
        })
        .collect();
    bundled.sort();
    bundled.into_iter().next()
}

