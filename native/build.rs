//! plexus-native's build script: the C++ of the native layer (see `src/lib.rs`), compiled with the
//! `cc` crate against the headers of the same libtorch and with the same flags torch-sys uses for
//! its own C++ (C++17, the libtorch C++11 ABI), so that `torch::Tensor*` means the same thing on
//! both sides of tch's FFI; with OpenMP against libtorch's own libgomp, so that its
//! `at::parallel_for` loops run on libtorch's threads (see `openmp_runtime`); and the link set-up
//! for this crate's test binaries (`build-support/libtorch.rs`, shared with plexus's build.rs).
use std::path::{Path, PathBuf};

include!("../build-support/libtorch.rs");

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=../build-support/libtorch.rs");
    let lib_dir = libtorch_lib_dir();
    build_native(lib_dir.as_deref());
    link_libtorch(lib_dir.as_deref());
}

/// The first directory among `candidates` that holds `file`.
fn find_include(candidates: &[PathBuf], file: &str) -> Option<PathBuf> {
    candidates.iter().find(|d| d.join(file).is_file()).cloned()
}

/// Compiles `src/plexus_native.cpp`, `src/stream_kernels.cpp` (the fused CPU kernels
/// of the multi-stream topologies), `src/history.cpp` (the dense topologies' history
/// buffer, any device), `src/losses.cpp` (the chunked cross-entropy, any device),
/// `src/cuda_graph.cpp` (whole-step CUDA graphs, with the CUDA headers NCCL needs too),
/// `src/kineto.cpp` (libtorch's profiler and plexus' profiler scopes) and
/// `src/cuda_kernels.cpp` (mHC's Sinkhorn and the stream read and
/// write on CUDA: the kernels of `src/*.cu`, compiled at run time with NVRTC) into a static
/// library linked into the crate.
///
/// * `PLEXUS_WITH_CUDA` when libtorch is a CUDA build (`libtorch_cuda.so`). The CUDA queries need no
///   CUDA header (see the top of the C++ file): PyTorch's CUDA 13 wheels ship
///   `nvidia/cu13/include/cuda_runtime_api.h` without the `crt/` headers it includes.
/// * `PLEXUS_WITH_NCCL` when, in addition, CUDA headers that compile and `nccl.h` are found:
///   `cuda_runtime_api.h`, the `crt/host_defines.h` it includes and CCCL's `nv/target` (which
///   `cuda_fp16.h` includes), in the wheel's `nvidia/*/include` next to `torch/` (the torch wheel
///   lacks the last two: `pip install nvidia-cuda-crt nvidia-cuda-cccl` of the wheel's CUDA version
///   adds them to `nvidia/cu13/include`), `$CUDA_HOME/include`, or `/usr/local/cuda/include`.
///   ProcessGroupNCCL's header pulls in c10/cuda and the CUDA math headers, which need them.
/// * `PLEXUS_WITH_GLOO` when libtorch ships `ProcessGroupGloo.hpp`.
///
/// A CPU-only libtorch builds with none of them; the functions then return "not built with …".
fn build_native(lib_dir: Option<&Path>) {
    let src = "src/plexus_native.cpp";
    let kernels = "src/stream_kernels.cpp";
    let history = "src/history.cpp";
    let losses = "src/losses.cpp";
    let cuda_graph = "src/cuda_graph.cpp";
    let kineto = "src/kineto.cpp";
    let cuda_kernels = "src/cuda_kernels.cpp";
    let cuda_sources = [
        "src/cuda_prelude.cuh",
        "src/sinkhorn.cu",
        "src/streams.cu",
        "src/losses.cu",
        "src/norms.cu",
        "src/norm_project.cu",
        "src/activations.cu",
        "src/hacn.cu",
        "src/rope.cu",
        "src/attnres.cu",
    ];
    let shim = "src/gloo_decl";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-changed={kernels}");
    println!("cargo:rerun-if-changed={history}");
    println!("cargo:rerun-if-changed={losses}");
    println!("cargo:rerun-if-changed={cuda_graph}");
    println!("cargo:rerun-if-changed={kineto}");
    println!("cargo:rerun-if-changed={cuda_kernels}");
    println!("cargo:rerun-if-changed=src/cuda_kernels.h");
    for cu in cuda_sources {
        println!("cargo:rerun-if-changed={cu}");
    }
    println!("cargo:rerun-if-changed=src/guarded.h");
    println!("cargo:rerun-if-changed=src/history.h");
    println!("cargo:rerun-if-changed=src/record.h");
    println!("cargo:rerun-if-changed=src/stream_rows.inc");
    println!("cargo:rerun-if-changed={shim}");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
    let Some(lib_dir) = lib_dir else {
        panic!("DEP_TCH_LIBTORCH_LIB is not set: torch-sys did not report its libtorch directory");
    };
    let torch_root = lib_dir.join("..");
    let include = torch_root.join("include");
    let cxx11_abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".into());

    // Candidate CUDA include directories: the wheel's nvidia/* packages (CUDA 13 wheels bundle the
    // toolkit headers in nvidia/cu13, CUDA 12 wheels split them per library), then $CUDA_HOME.
    let mut cuda_dirs: Vec<PathBuf> = Vec::new();
    let nvidia = torch_root.join("..").join("nvidia");
    if let Ok(entries) = std::fs::read_dir(&nvidia) {
        let mut dirs: Vec<PathBuf> = entries.flatten().map(|e| e.path().join("include")).collect();
        dirs.sort();
        // Headers installed later (scripts/setup.sh adds crt/ and nv/target for NCCL) rebuild this.
        for d in dirs.iter().filter(|d| d.is_dir()) {
            println!("cargo:rerun-if-changed={}", d.display());
        }
        cuda_dirs.extend(dirs);
    }
    let wheel_dirs = cuda_dirs.clone();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(home) = std::env::var_os(var) {
            cuda_dirs.push(PathBuf::from(home).join("include"));
        }
    }
    cuda_dirs.push(PathBuf::from("/usr/local/cuda/include"));

    let has_torch_cuda = lib_dir.join("libtorch_cuda.so").exists();
    let cuda_inc = find_include(&cuda_dirs, "cuda_runtime_api.h");
    let nccl_inc = find_include(&cuda_dirs, "nccl.h");
    let c10d = include.join("torch/csrc/distributed/c10d");
    let crt_inc = find_include(&cuda_dirs, "crt/host_defines.h");
    let cccl_inc = find_include(&cuda_dirs, "nv/target");
    let with_cuda = has_torch_cuda;
    let with_nccl = with_cuda
        && cuda_inc.is_some()
        && crt_inc.is_some()
        && cccl_inc.is_some()
        && nccl_inc.is_some()
        && c10d.join("ProcessGroupNCCL.hpp").is_file();
    let with_gloo = c10d.join("ProcessGroupGloo.hpp").is_file();
    // Why NCCL is left out, for the error ProcessGroup::new(Backend::Nccl, ..) returns.
    let nccl_missing = if !has_torch_cuda {
        "libtorch is not a CUDA build".to_string()
    } else if cuda_inc.is_none() {
        "no cuda_runtime_api.h was found".to_string()
    } else if crt_inc.is_none() {
        "cuda_runtime_api.h was found but not the crt/host_defines.h it includes \
         (pip install nvidia-cuda-crt matching the wheel's CUDA, or set CUDA_HOME)"
            .to_string()
    } else if cccl_inc.is_none() {
        "no nv/target (CUDA's CCCL headers, which cuda_fp16.h includes; pip install nvidia-cuda-cccl \
         matching the wheel's CUDA, or set CUDA_HOME)"
            .to_string()
    } else if nccl_inc.is_none() {
        "no nccl.h was found".to_string()
    } else {
        String::new()
    };
    let searched = cuda_dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ");

    // The CUDA kernels' source (the .cu files, in order), as a C++ string literal that
    // cuda_kernels.cpp hands to NVRTC.
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let mut cu = String::new();
    for file in cuda_sources {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("reading {file}: {e}"));
        assert!(!text.contains(")plexus_cu\""), "{file} contains the raw string's delimiter");
        cu.push_str(&format!("// ---- {file}\n{text}\n"));
    }
    std::fs::write(out_dir.join("cuda_kernels_source.inc"), format!("R\"plexus_cu({cu})plexus_cu\"\n"))
        .expect("writing cuda_kernels_source.inc");

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .pic(true)
        .warnings(false)
        // The stream kernels are loops that must be optimised even in a debug build.
        .opt_level(3)
        .file(src)
        .file(kernels)
        .file(history)
        .file(losses)
        .file(cuda_graph)
        .file(kineto)
        .file(cuda_kernels)
        .include(&out_dir)
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        // As libtorch itself is built: its headers' debug-only checks (RecordFunction::inputs()
        // asserts for operators recorded without inputs, which the operator trace meets) compile
        // out, as in the library they belong to.
        .define("NDEBUG", None)
        .flag(format!("-D_GLIBCXX_USE_CXX11_ABI={cxx11_abi}"))
        .flag("-DGLOG_USE_GLOG_EXPORT");
    if openmp_runtime(lib_dir).is_some() {
        build.flag("-fopenmp");
    } else {
        println!(
            "cargo:warning=no libgomp.so.1 in {}: plexus' fused CPU kernels are built without OpenMP and run \
             on one thread",
            lib_dir.display()
        );
    }
    if with_gloo {
        // The wheel ships ProcessGroupGloo.hpp but not the gloo headers it includes; gloo_decl
        // declares the four gloo types that header names (see gloo_decl/gloo/plexus_gloo_decl.h).
        build.include(shim).define("USE_C10D_GLOO", None).define("PLEXUS_WITH_GLOO", None);
    }
    if with_cuda {
        build.define("PLEXUS_WITH_CUDA", None);
    }
    if with_nccl {
        // c10/cuda and cuBLAS/cuSPARSE headers come along with ProcessGroupNCCL.hpp; CUDA 12 wheels
        // keep them in separate nvidia/<lib>/include directories, so add every wheel directory.
        for dir in [&cuda_inc, &crt_inc, &cccl_inc, &nccl_inc].into_iter().flatten().chain(&wheel_dirs) {
            if dir.is_dir() {
                build.include(dir);
            }
        }
        // The same headers let cuda_graph.cpp include ATen/cuda's CUDAGraph.
        build.define("USE_C10D_NCCL", None).define("PLEXUS_WITH_NCCL", None).define("PLEXUS_WITH_CUDA_GRAPHS", None);
    }
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-env=PLEXUS_NATIVE_WITH_CUDA={}", u8::from(with_cuda));
    println!("cargo:rustc-env=PLEXUS_NATIVE_WITH_NCCL={}", u8::from(with_nccl));
    let why = if with_nccl { String::new() } else { format!("{nccl_missing} (searched {searched})") };
    println!("cargo:rustc-env=PLEXUS_NATIVE_NCCL_MISSING={why}");
    build.compile("plexus_native");
}
