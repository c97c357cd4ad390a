// plexus' native layer: the few libtorch / c10d calls tch does not expose, behind a C ABI that
// src/native.rs (the only Rust code touching it) wraps into a safe API.
//
// Conventions of every entry point:
// * it catches every exception and returns it as a malloc'd error string (NULL on success), so no
//   C++ exception ever unwinds into Rust; Rust frees the string with plexus_free_string;
// * results go through out-parameters;
// * a tensor is tch's `*mut C_tensor`, which torch-sys defines as `torch::Tensor*` (= at::Tensor*).
//
// Compile-time switches (set by build.rs):
// * PLEXUS_WITH_CUDA: libtorch is a CUDA build (libtorch_cuda.so). The CUDA queries below need no
//   CUDA header: they go through libtorch's device-generic interfaces (CUDA hooks, the registered
//   CUDA DeviceAllocator, which is the CUDACachingAllocator) and through the CUDA runtime/driver C
//   ABI looked up with dlsym. This matters because a PyTorch CUDA 13 wheel ships
//   nvidia/cu13/include/cuda_runtime_api.h without the crt/ headers it includes (those come with
//   the separate nvidia-cuda-crt package), so no c10/cuda or ATen/cuda header compiles against it.
// * PLEXUS_WITH_NCCL: CUDA runtime headers that do compile (crt/ included) and nccl.h were found.
// * PLEXUS_WITH_GLOO: ProcessGroupGloo.hpp is present; USE_C10D_GLOO is defined with it and the gloo
//   types come from src/native/gloo_decl (the wheel has no gloo headers).

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#ifdef PLEXUS_WITH_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif

#ifdef PLEXUS_WITH_CUDA
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <dlfcn.h>
#endif

#ifdef PLEXUS_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

char* dup_string(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p != nullptr) {
    std::memcpy(p, s.c_str(), s.size() + 1);
  }
  return p;
}

// Runs `f`, turning any exception into an error string. c10::Error's what() carries a C++
// backtrace of libtorch frames; the message without it is what a Rust caller wants to read.
template <typename F>
char* guarded(F&& f) {
  try {
    f();
    return nullptr;
  } catch (const c10::Error& e) {
    return dup_string(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return dup_string(e.what());
  } catch (...) {
    return dup_string("unknown C++ exception");
  }
}

#ifdef PLEXUS_WITH_CUDA
// The CUDA runtime (libcudart) is loaded with libtorch_cuda, but plexus does not link it (the wheel
// keeps it in nvidia/cu*/lib, off the link path) and cannot include its headers (see the top of
// this file): look up the few C functions needed at run time. Their signatures and the enum values
// used below are part of CUDA's stable C ABI.
template <typename Fn>
Fn cudart_symbol(const char* symbol) {
  auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, symbol));
  if (fn == nullptr) {
    throw std::runtime_error(std::string("the CUDA runtime is not loaded (") + symbol + " not found)");
  }
  return fn;
}

int cudart_version(const char* symbol) {
  int v = 0;
  int err = cudart_symbol<int (*)(int*)>(symbol)(&v);
  if (err != 0) {
    throw std::runtime_error(std::string(symbol) + " failed with CUDA error " + std::to_string(err));
  }
  return v;
}

// The driver API (libcuda.so.1, installed with the NVIDIA driver): device name and total memory
// have no cudaDeviceGetAttribute equivalent, so all properties are read from the driver.
void* libcuda() {
  static void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    throw std::runtime_error("no CUDA driver: libcuda.so.1 cannot be loaded");
  }
  return handle;
}

template <typename Fn>
Fn cuda_driver_symbol(const char* symbol) {
  auto fn = reinterpret_cast<Fn>(dlsym(libcuda(), symbol));
  if (fn == nullptr) {
    throw std::runtime_error(std::string("the CUDA driver has no ") + symbol);
  }
  return fn;
}

void check_cu(int result, const char* what) {
  if (result != 0) {
    throw std::runtime_error(std::string(what) + " failed with CUDA driver error " + std::to_string(result));
  }
}

// Validates a device index against libtorch's view of the devices (0 without a driver or GPU).
c10::DeviceIndex checked_device(int64_t index) {
  int64_t n = at::detail::getCUDAHooks().getNumGPUs();
  if (n == 0) {
    throw std::runtime_error("no CUDA device is available");
  }
  if (index < 0 || index >= n) {
    throw std::runtime_error("CUDA device " + std::to_string(index) + " does not exist (" +
                             std::to_string(n) + " device(s))");
  }
  return static_cast<c10::DeviceIndex>(index);
}

c10::DeviceAllocator* cuda_allocator() {
  return c10::getDeviceAllocator(c10::DeviceType::CUDA);
}
#endif

const char* kNoCuda = "plexus was built without CUDA support (no CUDA headers or no libtorch_cuda)";

}  // namespace

extern "C" {

void plexus_free_string(char* s) { std::free(s); }

// ---------------------------------------------------------------------------------------------
// Part 1: CUDA information and matmul precision.

int plexus_cuda_built() {
#ifdef PLEXUS_WITH_CUDA
  return 1;
#else
  return 0;
#endif
}

int plexus_nccl_built() {
#ifdef PLEXUS_WITH_NCCL
  return 1;
#else
  return 0;
#endif
}

int plexus_gloo_built() {
#ifdef PLEXUS_WITH_GLOO
  return 1;
#else
  return 0;
#endif
}

char* plexus_cuda_driver_version(int* out) {
  return guarded([&] {
#ifdef PLEXUS_WITH_CUDA
    int v = cudart_version("cudaDriverGetVersion");
    // cudaDriverGetVersion reports 0 (with success) when no driver is installed.
    if (v == 0) {
      throw std::runtime_error("no CUDA driver is installed");
    }
    *out = v;
#else
    (void)out;
    throw std::runtime_error(kNoCuda);
#endif
  });
}

char* plexus_cuda_runtime_version(int* out) {
  return guarded([&] {
#ifdef PLEXUS_WITH_CUDA
    *out = cudart_version("cudaRuntimeGetVersion");
#else
    (void)out;
    throw std::runtime_error(kNoCuda);
#endif
  });
}

// `name` receives a malloc'd string (free with plexus_free_string).
char* plexus_cuda_device_info(int64_t index, char** name, int* major, int* minor, uint64_t* total_memory,
                              int* multiprocessors) {
  return guarded([&] {
#ifdef PLEXUS_WITH_CUDA
    c10::DeviceIndex device = checked_device(index);
    // CUdevice is an int; CU_DEVICE_ATTRIBUTE_{MULTIPROCESSOR_COUNT, COMPUTE_CAPABILITY_MAJOR,
    // COMPUTE_CAPABILITY_MINOR} are 16, 75, 76 in cuda.h.
    check_cu(cuda_driver_symbol<int (*)(unsigned)>("cuInit")(0), "cuInit");
    int dev = 0;
    check_cu(cuda_driver_symbol<int (*)(int*, int)>("cuDeviceGet")(&dev, device), "cuDeviceGet");
    char buf[256] = {0};
    check_cu(cuda_driver_symbol<int (*)(char*, int, int)>("cuDeviceGetName")(buf, sizeof(buf) - 1, dev),
             "cuDeviceGetName");
    size_t bytes = 0;
    check_cu(cuda_driver_symbol<int (*)(size_t*, int)>("cuDeviceTotalMem_v2")(&bytes, dev), "cuDeviceTotalMem");
    auto attr = cuda_driver_symbol<int (*)(int*, int, int)>("cuDeviceGetAttribute");
    check_cu(attr(major, 75, dev), "cuDeviceGetAttribute");
    check_cu(attr(minor, 76, dev), "cuDeviceGetAttribute");
    check_cu(attr(multiprocessors, 16, dev), "cuDeviceGetAttribute");
    *total_memory = static_cast<uint64_t>(bytes);
    *name = dup_string(buf);
#else
    (void)index, (void)name, (void)major, (void)minor, (void)total_memory, (void)multiprocessors;
    throw std::runtime_error(kNoCuda);
#endif
  });
}

// out = [allocated, reserved, peak_allocated, peak_reserved] in bytes (aggregate pool), from the
// registered CUDA DeviceAllocator: the same object as c10::cuda::CUDACachingAllocator::get().
char* plexus_cuda_memory_stats(int64_t index, uint64_t* out) {
  return guarded([&] {
#ifdef PLEXUS_WITH_CUDA
    auto stats = cuda_allocator()->getDeviceStats(checked_device(index));
    constexpr auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    out[0] = static_cast<uint64_t>(stats.allocated_bytes[agg].current);
    out[1] = static_cast<uint64_t>(stats.reserved_bytes[agg].current);
    out[2] = static_cast<uint64_t>(stats.allocated_bytes[agg].peak);
    out[3] = static_cast<uint64_t>(stats.reserved_bytes[agg].peak);
#else
    (void)index, (void)out;
    throw std::runtime_error(kNoCuda);
#endif
  });
}

char* plexus_cuda_reset_peak_memory(int64_t index) {
  return guarded([&] {
#ifdef PLEXUS_WITH_CUDA
    cuda_allocator()->resetPeakStats(checked_device(index));
#else
    (void)index;
    throw std::runtime_error(kNoCuda);
#endif
  });
}

char* plexus_set_float32_matmul_precision(const char* p) {
  return guarded([&] {
    std::string s(p);
    // libtorch only warns on an unknown value; plexus wants an error.
    if (s != "highest" && s != "high" && s != "medium") {
      throw std::invalid_argument("float32 matmul precision must be \"highest\", \"high\" or \"medium\", got \"" +
                                  s + "\"");
    }
    at::globalContext().setFloat32MatmulPrecision(s);
  });
}

// `out` receives a malloc'd string.
char* plexus_float32_matmul_precision(char** out) {
  return guarded([&] {
    switch (at::globalContext().float32MatmulPrecision()) {
      case at::Float32MatmulPrecision::HIGHEST:
        *out = dup_string("highest");
        break;
      case at::Float32MatmulPrecision::HIGH:
        *out = dup_string("high");
        break;
      case at::Float32MatmulPrecision::MEDIUM:
        *out = dup_string("medium");
        break;
    }
  });
}

}  // extern "C"
