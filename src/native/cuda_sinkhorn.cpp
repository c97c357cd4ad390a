// mHC's Sinkhorn–Knopp on a CUDA GPU: the kernels of src/native/sinkhorn.cu, compiled at run time
// with NVRTC for the GPU at hand and the number of streams n, loaded and launched through the CUDA
// driver API, behind one autograd function. Rust reaches it through src/native.rs
// (`sinkhorn_cuda`), and src/topology/mhc.rs uses it on CUDA tensors.
//
// No CUDA header and no link to a CUDA library (as in plexus_native.cpp): NVRTC (libnvrtc, which the
// torch wheel ships in nvidia/cu*/lib) and the driver (libcuda.so.1) are opened with dlopen, and the
// few C functions used are declared below; their signatures are CUDA's stable C ABI. Compiling needs
// no GPU, so the tests compile the kernels for real architectures on a CPU machine
// (`plexus_sinkhorn_cuda_compile`), and run their per-token arithmetic on the CPU
// (`plexus_sinkhorn_host`).
//
// On a GPU, the first use for a device and n compiles, loads and then checks the kernels against
// the same per-token functions run on the CPU in double (`self_check`). Any failure (no NVRTC, no
// driver, a compile error, a disagreement) is kept and returned on every later call for that
// device and n, and the Rust side falls back to the composite libtorch graph with one warning.

#include "guarded.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/custom_function.h>

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#define PLEXUS_SINKHORN_HOST
#include "sinkhorn.cu"

using plexus_native::dup_string;
using plexus_native::guarded;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

// The text of sinkhorn.cu, as a string literal (build.rs writes it to OUT_DIR).
const char kSource[] =
#include "sinkhorn_cu_source.inc"
    ;

// The largest n the kernels are built for: a thread keeps 2·n² values in registers backward.
constexpr int64_t kMaxStreams = 8;
constexpr unsigned kThreads = 128;  // = __launch_bounds__ in sinkhorn.cu

// Calls f with std::integral_constant<int, n> for n in 1..=kMaxStreams.
template <typename F>
void with_n(int64_t n, F&& f) {
  switch (n) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    case 8: return f(std::integral_constant<int, 8>{});
    default:
      throw std::invalid_argument("the CUDA Sinkhorn takes 1 ≤ n ≤ " + std::to_string(kMaxStreams) +
                                  " streams (n = " + std::to_string(n) + ")");
  }
}

// ----------------------------------------------------------------------------------------------
// The per-token functions on the CPU: P (and, with `grad`, the logits' gradient) for logits
// [M, n, n], every token in turn. T = float or double.

template <typename T>
void host_sinkhorn(const T* logits, const T* grad, T* out, T* grad_logits, int64_t m_total, int64_t n,
                   int iters) {
  with_n(n, [&](auto fixed) {
    constexpr int N = decltype(fixed)::value;
    for (int64_t m = 0; m < m_total; ++m) plexus_sinkhorn::forward_token<T, N>(logits, out, m, iters);
    if (grad != nullptr) {
      std::vector<T> sums(static_cast<size_t>(2 * iters * N * m_total));
      for (int64_t m = 0; m < m_total; ++m) {
        plexus_sinkhorn::backward_token<T, N>(logits, grad, grad_logits, sums.data(), m, m_total, iters);
      }
    }
  });
}

// ----------------------------------------------------------------------------------------------
// NVRTC, opened at run time.

using nvrtcResult = int;
using nvrtcProgram = struct _nvrtcProgram*;

struct Nvrtc {
  std::string path;
  const char* (*GetErrorString)(nvrtcResult);
  nvrtcResult (*Version)(int*, int*);
  nvrtcResult (*GetNumSupportedArchs)(int*);
  nvrtcResult (*GetSupportedArchs)(int*);
  nvrtcResult (*CreateProgram)(nvrtcProgram*, const char*, const char*, int, const char* const*, const char* const*);
  nvrtcResult (*DestroyProgram)(nvrtcProgram*);
  nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char* const*);
  nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t*);
  nvrtcResult (*GetProgramLog)(nvrtcProgram, char*);
  nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t*);
  nvrtcResult (*GetCUBIN)(nvrtcProgram, char*);
  nvrtcResult (*GetPTXSize)(nvrtcProgram, size_t*);
  nvrtcResult (*GetPTX)(nvrtcProgram, char*);

  void check(nvrtcResult r, const char* what) const {
    if (r != 0) throw std::runtime_error(std::string("NVRTC ") + what + ": " + GetErrorString(r));
  }

  std::vector<int> supported_archs() const {
    int count = 0;
    check(GetNumSupportedArchs(&count), "nvrtcGetNumSupportedArchs");
    std::vector<int> archs(static_cast<size_t>(count));
    check(GetSupportedArchs(archs.data()), "nvrtcGetSupportedArchs");
    return archs;
  }
};

template <typename Fn>
void symbol(void* lib, const std::string& path, const char* name, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(lib, name));
  if (*out == nullptr) throw std::runtime_error(path + " has no " + name);
}

// The directory of libtorch_cpu.so in this process (where the wheel's nvidia/ packages are found).
std::string torch_lib_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&at::globalContext), &info) == 0 || info.dli_fname == nullptr) return "";
  std::string file = info.dli_fname;
  const auto slash = file.rfind('/');
  return slash == std::string::npos ? "." : file.substr(0, slash);
}

// NVRTC opens libnvrtc-builtins.so.<major>.<minor> by name when it compiles, which the dynamic linker
// finds only on its search path; the wheel keeps it next to libnvrtc. Opened here first, from
// there, the name resolves to the loaded library. (A failure is left to the compile's error.)
void preload_builtins(const Nvrtc& n) {
  int major = 0, minor = 0;
  Dl_info info{};
  if (n.Version(&major, &minor) != 0 || dladdr(reinterpret_cast<void*>(n.Version), &info) == 0 ||
      info.dli_fname == nullptr) {
    return;
  }
  std::string dir = info.dli_fname;
  const auto slash = dir.rfind('/');
  dir = slash == std::string::npos ? "." : dir.substr(0, slash);
  const std::string name = "libnvrtc-builtins.so." + std::to_string(major) + "." + std::to_string(minor);
  if (dlopen((dir + "/" + name).c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) dlopen(name.c_str(), RTLD_NOW | RTLD_GLOBAL);
}

// libnvrtc: the torch wheel's (CUDA 13: nvidia/cu13/lib; CUDA 12: nvidia/cuda_nvrtc/lib), else the
// dynamic linker's search path (LD_LIBRARY_PATH, a system CUDA).
const Nvrtc& nvrtc() {
  static const std::pair<std::unique_ptr<Nvrtc>, std::string> loaded = []() {
    const std::string dir = torch_lib_dir();
    std::vector<std::string> candidates;
    if (!dir.empty()) {
      candidates.push_back(dir + "/../../nvidia/cu13/lib/libnvrtc.so.13");
      candidates.push_back(dir + "/../../nvidia/cuda_nvrtc/lib/libnvrtc.so.12");
    }
    for (const char* name : {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"}) candidates.emplace_back(name);
    std::string tried;
    for (const auto& path : candidates) {
      void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib == nullptr) {
        tried += (tried.empty() ? "" : ", ") + path;
        continue;
      }
      try {
        auto n = std::make_unique<Nvrtc>();
        n->path = path;
        symbol(lib, path, "nvrtcGetErrorString", &n->GetErrorString);
        symbol(lib, path, "nvrtcVersion", &n->Version);
        symbol(lib, path, "nvrtcGetNumSupportedArchs", &n->GetNumSupportedArchs);
        symbol(lib, path, "nvrtcGetSupportedArchs", &n->GetSupportedArchs);
        symbol(lib, path, "nvrtcCreateProgram", &n->CreateProgram);
        symbol(lib, path, "nvrtcDestroyProgram", &n->DestroyProgram);
        symbol(lib, path, "nvrtcCompileProgram", &n->CompileProgram);
        symbol(lib, path, "nvrtcGetProgramLogSize", &n->GetProgramLogSize);
        symbol(lib, path, "nvrtcGetProgramLog", &n->GetProgramLog);
        symbol(lib, path, "nvrtcGetCUBINSize", &n->GetCUBINSize);
        symbol(lib, path, "nvrtcGetCUBIN", &n->GetCUBIN);
        symbol(lib, path, "nvrtcGetPTXSize", &n->GetPTXSize);
        symbol(lib, path, "nvrtcGetPTX", &n->GetPTX);
        preload_builtins(*n);
        return std::make_pair(std::move(n), std::string());
      } catch (const std::exception& e) {
        return std::make_pair(std::unique_ptr<Nvrtc>(), std::string(e.what()));
      }
    }
    return std::make_pair(std::unique_ptr<Nvrtc>(),
                          "NVRTC (libnvrtc) was not found (tried " + tried +
                              "); it comes with PyTorch's CUDA wheels (nvidia/cu13/lib)");
  }();
  if (!loaded.first) throw std::runtime_error(loaded.second);
  return *loaded.first;
}

// The compiled kernels for n streams and one architecture: a CUBIN for `sm_<arch>` when NVRTC
// knows that architecture, else PTX for the newest `compute_<a>` it knows below it (the driver
// compiles PTX for newer GPUs). Throws with NVRTC's log on a compile error.
struct Image {
  std::string bytes;
  std::string target;  // sm_90, compute_120, ...
  bool cubin;
};

Image compile(int64_t n, int arch) {
  const Nvrtc& lib = nvrtc();
  const auto archs = lib.supported_archs();
  Image image;
  image.cubin = std::find(archs.begin(), archs.end(), arch) != archs.end();
  int target = arch;
  if (!image.cubin) {
    target = -1;
    for (int a : archs) {
      if (a < arch) target = std::max(target, a);
    }
    if (target < 0) {
      throw std::runtime_error("NVRTC (" + lib.path + ") compiles for none of the architectures up to sm_" +
                               std::to_string(arch));
    }
  }
  image.target = (image.cubin ? "sm_" : "compute_") + std::to_string(target);
  const std::string arch_opt = "--gpu-architecture=" + image.target;
  const std::string n_opt = "-DPLEXUS_N=" + std::to_string(n);
  const char* opts[] = {arch_opt.c_str(), n_opt.c_str(), "--std=c++17"};
  nvrtcProgram prog = nullptr;
  lib.check(lib.CreateProgram(&prog, kSource, "plexus_sinkhorn.cu", 0, nullptr, nullptr), "nvrtcCreateProgram");
  struct Destroy {
    const Nvrtc& lib;
    nvrtcProgram& prog;
    ~Destroy() { lib.DestroyProgram(&prog); }
  } destroy{lib, prog};
  const nvrtcResult r = lib.CompileProgram(prog, 3, opts);
  if (r != 0) {
    size_t size = 0;
    std::string log;
    if (lib.GetProgramLogSize(prog, &size) == 0 && size > 0) {
      log.resize(size);
      lib.GetProgramLog(prog, log.data());
    }
    throw std::runtime_error("NVRTC could not compile the Sinkhorn kernels for " + image.target + " (n = " +
                             std::to_string(n) + "): " + lib.GetErrorString(r) + "\n" + log);
  }
  size_t size = 0;
  if (image.cubin) {
    lib.check(lib.GetCUBINSize(prog, &size), "nvrtcGetCUBINSize");
    image.bytes.resize(size);
    lib.check(lib.GetCUBIN(prog, image.bytes.data()), "nvrtcGetCUBIN");
  } else {
    lib.check(lib.GetPTXSize(prog, &size), "nvrtcGetPTXSize");
    image.bytes.resize(size);
    lib.check(lib.GetPTX(prog, image.bytes.data()), "nvrtcGetPTX");
  }
  return image;
}

// ----------------------------------------------------------------------------------------------
// The CUDA driver, opened at run time (libtorch has loaded it already on a GPU machine).

using CUresult = int;
using CUdevice = int;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;
// cuda.h's CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR.
constexpr int kAttrCcMajor = 75;
constexpr int kAttrCcMinor = 76;

struct Driver {
  CUresult (*GetErrorString)(CUresult, const char**);
  CUresult (*DeviceGet)(CUdevice*, int);
  CUresult (*DeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*CtxGetCurrent)(CUcontext*);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*ModuleLoadData)(CUmodule*, const void*);
  CUresult (*ModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                           void**, void**);

  void check(CUresult r, const char* what) const {
    if (r == 0) return;
    const char* text = nullptr;
    GetErrorString(r, &text);
    throw std::runtime_error(std::string("CUDA driver ") + what + ": " + (text != nullptr ? text : "?") + " (" +
                             std::to_string(r) + ")");
  }
};

const Driver& driver() {
  static const std::pair<std::unique_ptr<Driver>, std::string> loaded = []() {
    const std::string path = "libcuda.so.1";
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (lib == nullptr) {
      return std::make_pair(std::unique_ptr<Driver>(), std::string("the CUDA driver (libcuda.so.1) is not installed"));
    }
    try {
      auto d = std::make_unique<Driver>();
      symbol(lib, path, "cuGetErrorString", &d->GetErrorString);
      symbol(lib, path, "cuDeviceGet", &d->DeviceGet);
      symbol(lib, path, "cuDeviceGetAttribute", &d->DeviceGetAttribute);
      symbol(lib, path, "cuDevicePrimaryCtxRetain", &d->DevicePrimaryCtxRetain);
      symbol(lib, path, "cuCtxGetCurrent", &d->CtxGetCurrent);
      symbol(lib, path, "cuCtxSetCurrent", &d->CtxSetCurrent);
      symbol(lib, path, "cuModuleLoadData", &d->ModuleLoadData);
      symbol(lib, path, "cuModuleGetFunction", &d->ModuleGetFunction);
      symbol(lib, path, "cuLaunchKernel", &d->LaunchKernel);
      return std::make_pair(std::move(d), std::string());
    } catch (const std::exception& e) {
      return std::make_pair(std::unique_ptr<Driver>(), std::string(e.what()));
    }
  }();
  if (!loaded.first) throw std::runtime_error(loaded.second);
  return *loaded.first;
}

// The kernels loaded for one device and n.
struct Kernels {
  CUcontext context = nullptr;  // the device's primary context, which libtorch's runtime calls use
  CUfunction forward = nullptr;
  CUfunction backward = nullptr;
  int64_t n = 0;
  std::string target;
};

// Makes the device's primary context current on this thread (a thread on which libtorch has made
// no CUDA runtime call yet, an autograd worker say, may have none) and launches f over m tokens on
// libtorch's current stream of that device.
void launch(const Kernels& k, CUfunction f, c10::Device device, int64_t m, void** args) {
  if (m == 0) return;
  const Driver& d = driver();
  CUcontext current = nullptr;
  d.check(d.CtxGetCurrent(&current), "cuCtxGetCurrent");
  if (current != k.context) d.check(d.CtxSetCurrent(k.context), "cuCtxSetCurrent");
  const c10::Stream stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device);
  const auto blocks = static_cast<unsigned>((m + kThreads - 1) / kThreads);
  d.check(d.LaunchKernel(f, blocks, 1, 1, kThreads, 1, 1, 0, static_cast<CUstream>(stream.native_handle()), args,
                         nullptr),
          "cuLaunchKernel");
}

// P [M, n, n] of contiguous fp32 logits on the kernels' device.
void launch_forward(const Kernels& k, const at::Tensor& logits, const at::Tensor& out, int64_t iters) {
  const float* lp = logits.const_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  long long m = logits.numel() / (k.n * k.n);
  int it = static_cast<int>(iters);
  void* args[] = {&lp, &op, &m, &it};
  launch(k, k.forward, logits.device(), m, args);
}

// The logits' gradient [M, n, n] from that of P; the line sums' scratch comes from libtorch's
// allocator.
void launch_backward(const Kernels& k, const at::Tensor& logits, const at::Tensor& grad, const at::Tensor& gl,
                     int64_t iters) {
  long long m = logits.numel() / (k.n * k.n);
  auto sums = at::empty({2 * iters * k.n, m}, logits.options());
  const float* lp = logits.const_data_ptr<float>();
  const float* gp = grad.const_data_ptr<float>();
  float* glp = gl.mutable_data_ptr<float>();
  float* sp = sums.mutable_data_ptr<float>();
  int it = static_cast<int>(iters);
  void* args[] = {&lp, &gp, &glp, &sp, &m, &it};
  launch(k, k.backward, logits.device(), m, args);
}

// Compares freshly loaded kernels with the per-token functions run on the CPU in double, on logits
// and gradients that depend on nothing random (the check must not move any generator), one more
// token than a block so that the bounds check is crossed.
void self_check(const Kernels& k, c10::Device device) {
  const int64_t n = k.n, m = kThreads + 1, iters = 20;
  auto logits = at::empty({m, n, n}, at::kDouble);
  auto grad = at::empty({m, n, n}, at::kDouble);
  double* lp = logits.mutable_data_ptr<double>();
  double* gp = grad.mutable_data_ptr<double>();
  for (int64_t i = 0; i < logits.numel(); ++i) {
    lp[i] = 3.0 * std::sin(0.37 * static_cast<double>(i) + 0.11 * static_cast<double>(i % 7));
    gp[i] = std::cos(1.3 * static_cast<double>(i));
  }
  // The reference from the fp32-rounded logits, so that only the arithmetic differs.
  logits = logits.to(at::kFloat).to(at::kDouble);
  auto p_ref = at::empty_like(logits), gl_ref = at::empty_like(logits);
  host_sinkhorn<double>(logits.const_data_ptr<double>(), grad.const_data_ptr<double>(),
                        p_ref.mutable_data_ptr<double>(), gl_ref.mutable_data_ptr<double>(), m, n,
                        static_cast<int>(iters));
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(device);
  const auto l_dev = logits.to(opts), g_dev = grad.to(opts);
  auto p_dev = at::empty_like(l_dev), gl_dev = at::empty_like(l_dev);
  launch_forward(k, l_dev, p_dev, iters);
  launch_backward(k, l_dev, g_dev, gl_dev, iters);
  const double dp = (p_dev.to(at::kCPU).to(at::kDouble) - p_ref).abs().max().item<double>();
  const double scale = std::max(1.0, gl_ref.abs().max().item<double>());
  const double dg = (gl_dev.to(at::kCPU).to(at::kDouble) - gl_ref).abs().max().item<double>() / scale;
  constexpr double tol = 1e-4;
  if (!(dp <= tol && dg <= tol)) {
    throw std::runtime_error("the CUDA Sinkhorn kernels (n = " + std::to_string(n) + ", " + k.target +
                             ") disagree with their CPU reference: largest deviation " + std::to_string(dp) +
                             " forward, " + std::to_string(dg) + " (relative) backward; tolerance " +
                             std::to_string(tol));
  }
}

// Compiles, loads and checks the kernels for a device and n, once; a failure is kept and thrown
// again on every later call.
const Kernels& kernels_for(c10::Device device, int64_t n) {
  static std::mutex mutex;
  static std::map<std::pair<int, int64_t>, std::pair<std::unique_ptr<Kernels>, std::string>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(static_cast<int>(device.index()), n);
  auto it = cache.find(key);
  if (it == cache.end()) {
    std::unique_ptr<Kernels> k;
    std::string error;
    try {
      const Driver& d = driver();
      CUdevice dev = 0;
      d.check(d.DeviceGet(&dev, device.index()), "cuDeviceGet");
      int major = 0, minor = 0;
      d.check(d.DeviceGetAttribute(&major, kAttrCcMajor, dev), "cuDeviceGetAttribute");
      d.check(d.DeviceGetAttribute(&minor, kAttrCcMinor, dev), "cuDeviceGetAttribute");
      const Image image = compile(n, major * 10 + minor);
      k = std::make_unique<Kernels>();
      k->n = n;
      k->target = image.target;
      d.check(d.DevicePrimaryCtxRetain(&k->context, dev), "cuDevicePrimaryCtxRetain");
      CUcontext current = nullptr;
      d.check(d.CtxGetCurrent(&current), "cuCtxGetCurrent");
      if (current != k->context) d.check(d.CtxSetCurrent(k->context), "cuCtxSetCurrent");
      CUmodule module = nullptr;
      d.check(d.ModuleLoadData(&module, image.bytes.data()), "cuModuleLoadData");
      d.check(d.ModuleGetFunction(&k->forward, module, "plexus_sinkhorn_forward"), "cuModuleGetFunction");
      d.check(d.ModuleGetFunction(&k->backward, module, "plexus_sinkhorn_backward"), "cuModuleGetFunction");
      self_check(*k, device);
    } catch (const c10::Error& e) {
      k.reset();
      error = e.what_without_backtrace();
    } catch (const std::exception& e) {
      k.reset();
      error = e.what();
    }
    it = cache.emplace(key, std::make_pair(std::move(k), error)).first;
  }
  if (!it->second.first) throw std::runtime_error(it->second.second);
  return *it->second.first;
}

// The checks of a CUDA call; returns n.
int64_t check_cuda_logits(const at::Tensor& logits, int64_t iters) {
  if (logits.dim() < 2 || logits.size(-1) != logits.size(-2)) {
    throw std::invalid_argument("sinkhorn takes logits [.., n, n]");
  }
  if (!logits.is_cuda() || logits.scalar_type() != at::kFloat) {
    throw std::invalid_argument("the CUDA Sinkhorn takes float32 logits on a CUDA device");
  }
  if (iters < 1 || iters > 100000) throw std::invalid_argument("the CUDA Sinkhorn takes 1 ≤ iters ≤ 100000");
  const int64_t n = logits.size(-1);
  with_n(n, [](auto) {});
  return n;
}

struct SinkhornCuda : public torch::autograd::Function<SinkhornCuda> {
  // logits [.., n, n] fp32 on a CUDA device → P [.., n, n].
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits_in, int64_t iters) {
    const int64_t n = check_cuda_logits(logits_in, iters);
    const c10::DeviceGuard guard(logits_in.device());
    const auto logits = logits_in.contiguous();
    const Kernels& k = kernels_for(logits.device(), n);
    auto out = at::empty_like(logits);
    launch_forward(k, logits, out, iters);
    ctx->save_for_backward({logits});
    ctx->saved_data["iters"] = iters;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto logits = ctx->get_saved_variables()[0];
    const int64_t iters = ctx->saved_data["iters"].toInt();
    const c10::DeviceGuard guard(logits.device());
    const Kernels& k = kernels_for(logits.device(), logits.size(-1));
    const auto g = grads[0].to(at::kFloat).contiguous();
    auto gl = at::empty_like(logits);
    launch_backward(k, logits, g, gl, iters);
    return {gl, at::Tensor()};
  }
};

}  // namespace

extern "C" {

// P = Sinkhorn(exp(logits)) on a CUDA device (fp32 logits [.., n, n], 1 ≤ n ≤ 8), differentiable.
char* plexus_sinkhorn_cuda(at::Tensor* logits, int64_t iters, at::Tensor** out) {
  return guarded([&] { *out = new at::Tensor(SinkhornCuda::apply(*logits, iters)); });
}

// The CUDA kernels' per-token arithmetic on the CPU (contiguous fp32 or fp64 CPU tensors [.., n, n],
// 1 ≤ n ≤ 8): P, and with `grad` (P's gradient; may be null) the logits' gradient.
char* plexus_sinkhorn_host(at::Tensor* logits, at::Tensor* grad, int64_t iters, at::Tensor** out,
                           at::Tensor** grad_logits) {
  return guarded([&] {
    const auto& l = *logits;
    if (l.dim() < 2 || l.size(-1) != l.size(-2) || !l.device().is_cpu() || !l.is_contiguous() ||
        !(l.scalar_type() == at::kFloat || l.scalar_type() == at::kDouble)) {
      throw std::invalid_argument("plexus_sinkhorn_host takes contiguous fp32/fp64 CPU logits [.., n, n]");
    }
    if (grad != nullptr && (grad->sizes() != l.sizes() || grad->scalar_type() != l.scalar_type() ||
                            !grad->is_contiguous() || !grad->device().is_cpu())) {
      throw std::invalid_argument("plexus_sinkhorn_host takes a gradient like the logits");
    }
    if (iters < 1) throw std::invalid_argument("iters must be ≥ 1");
    const int64_t n = l.size(-1), m = l.numel() / std::max<int64_t>(1, n * n);
    auto p = at::empty_like(l);
    auto gl = at::empty_like(l);
    AT_DISPATCH_FLOATING_TYPES(l.scalar_type(), "sinkhorn_host", [&] {
      host_sinkhorn<scalar_t>(l.const_data_ptr<scalar_t>(), grad ? grad->const_data_ptr<scalar_t>() : nullptr,
                              p.mutable_data_ptr<scalar_t>(), gl.mutable_data_ptr<scalar_t>(), m, n,
                              static_cast<int>(iters));
    });
    *out = new at::Tensor(p);
    *grad_logits = grad != nullptr ? new at::Tensor(gl) : nullptr;
  });
}

// Compiles the CUDA kernels for n streams and compute capability `arch` (major·10 + minor) with
// NVRTC, without loading them (no GPU needed): the image's size in bytes, and its target
// (sm_<arch> as a CUBIN, or compute_<a> as PTX) as a malloc'd string.
char* plexus_sinkhorn_cuda_compile(int64_t n, int64_t arch, int64_t* image_bytes, char** target) {
  return guarded([&] {
    with_n(n, [](auto) {});
    const Image image = compile(n, static_cast<int>(arch));
    *image_bytes = static_cast<int64_t>(image.bytes.size());
    *target = dup_string(image.target);
  });
}

// NVRTC's version (major·1000 + minor·10, as CUDA writes versions) and the library's path (malloc'd).
char* plexus_nvrtc_version(int* version, char** path) {
  return guarded([&] {
    const Nvrtc& lib = nvrtc();
    int major = 0, minor = 0;
    lib.check(lib.Version(&major, &minor), "nvrtcVersion");
    *version = major * 1000 + minor * 10;
    *path = dup_string(lib.path);
  });
}

}  // extern "C"
