// plexus' native layer: the few libtorch / c10d calls tch does not expose, behind a C ABI that
// native/src/lib.rs (the only Rust code touching it) wraps into a safe API.
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
//   types come from native/src/gloo_decl (the wheel has no gloo headers).

#include "guarded.h"

#include <ATen/Context.h>
#include <ATen/record_function.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
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

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using plexus_native::dup_string;
using plexus_native::guarded;

namespace {

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

// ---------------------------------------------------------------------------------------------
// Part 2: c10d process groups (TCPStore rendezvous + ProcessGroupGloo / ProcessGroupNCCL).

}  // extern "C"

namespace {

enum BackendKind : int { kGloo = 0, kNccl = 1 };

// What a plexus ProcessGroup owns: the store (kept alive for the backend's lifetime, as
// torch.distributed does) and the backend, used only through the c10d::Backend virtual interface.
struct PlexusProcessGroup {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
  std::chrono::milliseconds timeout;
};

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr == "::1" || addr.rfind("127.", 0) == 0;
}

[[noreturn]] void rethrow_with(const std::string& context) {
  try {
    throw;
  } catch (const c10::Error& e) {
    throw std::runtime_error(context + ": " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw std::runtime_error(context + ": " + e.what());
  }
}

// What can be known to fail before the rendezvous, so that a rank does not make its peers wait.
void precheck_backend(int kind) {
  if (kind == kGloo) {
#ifndef PLEXUS_WITH_GLOO
    throw std::runtime_error("this libtorch has no ProcessGroupGloo (torch/csrc/distributed/c10d/ProcessGroupGloo.hpp)");
#endif
  } else if (kind == kNccl) {
#ifdef PLEXUS_WITH_NCCL
    if (at::detail::getCUDAHooks().getNumGPUs() == 0) {
      throw std::runtime_error("NCCL needs a CUDA device and none is available");
    }
#else
    throw std::runtime_error("plexus was built without NCCL");
#endif
  } else {
    throw std::invalid_argument("unknown backend " + std::to_string(kind));
  }
}

c10::intrusive_ptr<c10d::Backend> make_backend(int kind, const c10::intrusive_ptr<c10d::Store>& store,
                                               const std::string& addr, int rank, int world,
                                               std::chrono::milliseconds timeout) {
  if (kind == kGloo) {
#ifdef PLEXUS_WITH_GLOO
    // Gloo needs a local network device to bind. Within one machine (a loopback rendezvous
    // address) bind that address; otherwise use torch's default: GLOO_SOCKET_IFNAME if set, else
    // this host's name, else loopback (what torch.distributed does).
    c10::intrusive_ptr<c10d::ProcessGroupGloo::Options> opts;
    if (is_loopback(addr)) {
      opts = c10d::ProcessGroupGloo::Options::create(timeout);
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(addr));
    } else {
      opts = c10d::ProcessGroupGloo::Options::create_default(timeout);
    }
    opts->timeout = timeout;
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, opts);
#else
    throw std::runtime_error("this libtorch has no ProcessGroupGloo (torch/csrc/distributed/c10d/ProcessGroupGloo.hpp)");
#endif
  }
  if (kind == kNccl) {
#ifdef PLEXUS_WITH_NCCL
    // Blocking wait makes Work::wait block the host and throw on timeout or a communicator error,
    // instead of NCCL's default of tearing the whole process down from its watchdog thread. It is
    // read when the process group is constructed; a value set by the user is kept.
    setenv("TORCH_NCCL_BLOCKING_WAIT", "1", /*overwrite=*/0);
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world, opts);
#else
    throw std::runtime_error("plexus was built without NCCL");
#endif
  }
  throw std::invalid_argument("unknown backend " + std::to_string(kind));
}

// Waits for `work`. The backend enforces the process group's timeout itself (Gloo through its
// context timeout, NCCL through blocking wait); the host-side bound here is a backstop against a
// backend that never completes the work: it is larger so that the backend's own, more precise
// error wins.
void wait_for(PlexusProcessGroup* pg, const c10::intrusive_ptr<c10d::Work>& work) {
  work->wait(pg->timeout * 2 + std::chrono::milliseconds(5000));
}

void check_tensors(const std::vector<at::Tensor*>& ts) {
  for (size_t i = 0; i < ts.size(); ++i) {
    if (ts[i] == nullptr || !ts[i]->defined()) {
      throw std::invalid_argument("tensor " + std::to_string(i) + " is undefined");
    }
    if (ts[i]->is_sparse()) {
      throw std::invalid_argument("tensor " + std::to_string(i) + " is sparse; only dense tensors are supported");
    }
  }
}

// In-place sum over the group of one tensor. c10d needs contiguous (dense, non-overlapping)
// tensors, so a strided view is reduced through a contiguous copy and written back.
void all_reduce_one(PlexusProcessGroup* pg, at::Tensor& t) {
  at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
  std::vector<at::Tensor> v{buf};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::SUM;
  opts.timeout = pg->timeout;
  wait_for(pg, pg->backend->allreduce(v, opts));
  if (!buf.is_same(t)) {
    t.copy_(buf);
  }
}

}  // namespace

extern "C" {

// backend: 0 = Gloo, 1 = NCCL. On success *out receives a handle for the other plexus_pg_*.
char* plexus_pg_new(int backend, const char* addr, uint16_t port, int64_t rank, int64_t world,
                    int64_t timeout_ms, void** out) {
  return guarded([&] {
    std::string host(addr);
    if (world < 1) {
      throw std::invalid_argument("world size must be at least 1, got " + std::to_string(world));
    }
    if (rank < 0 || rank >= world) {
      throw std::invalid_argument("rank " + std::to_string(rank) + " is out of range for world size " +
                                  std::to_string(world));
    }
    if (port == 0) {
      throw std::invalid_argument("port 0 cannot be used: every rank must know rank 0's store port");
    }
    if (timeout_ms <= 0) {
      throw std::invalid_argument("timeout must be positive");
    }
    auto timeout = std::chrono::milliseconds(timeout_ms);
    std::string where = host + ":" + std::to_string(port) + " as rank " + std::to_string(rank) + " of " +
                        std::to_string(world);

    precheck_backend(backend);

    // Rendezvous: rank 0 hosts the store; with waitWorkers every rank's store constructor returns
    // only once all world-size ranks have connected, or throws after `timeout`.
    c10::intrusive_ptr<c10d::Store> store;
    try {
      c10d::TCPStoreOptions o;
      o.port = port;
      o.isServer = rank == 0;
      o.numWorkers = static_cast<size_t>(world);
      o.waitWorkers = true;
      o.timeout = timeout;
      store = c10::make_intrusive<c10d::TCPStore>(host, o);
    } catch (...) {
      rethrow_with("rendezvous (TCPStore) at " + where + " failed");
    }
    // Keys of this process group live under their own prefix, as torch.distributed does, so the
    // store can later serve other groups.
    store = c10::make_intrusive<c10d::PrefixStore>("plexus_pg/", store);

    auto pg = std::make_unique<PlexusProcessGroup>();
    pg->store = store;
    pg->timeout = timeout;
    try {
      pg->backend = make_backend(backend, store, host, static_cast<int>(rank), static_cast<int>(world), timeout);
    } catch (...) {
      rethrow_with(std::string(backend == kNccl ? "ProcessGroupNCCL" : "ProcessGroupGloo") + " set-up at " + where +
                   " failed");
    }
    *out = pg.release();
  });
}

void plexus_pg_free(void* pg) {
  // Destroying a backend joins its worker threads; nothing here is expected to throw, but no
  // exception may cross into Rust's Drop.
  try {
    delete static_cast<PlexusProcessGroup*>(pg);
  } catch (...) {
  }
}

// Sums `n` tensors over the group, in place. Several tensors (a gradient bucket) go through one
// collective on a flat buffer: one round of latency instead of n.
char* plexus_pg_all_reduce_sum(void* handle, at::Tensor** tensors, size_t n) {
  return guarded([&] {
    auto* pg = static_cast<PlexusProcessGroup*>(handle);
    std::vector<at::Tensor*> ts(tensors, tensors + n);
    check_tensors(ts);
    c10::AutoGradMode no_grad(false);
    if (n == 0) {
      return;
    }
    if (n == 1) {
      all_reduce_one(pg, *ts[0]);
      return;
    }
    for (size_t i = 1; i < n; ++i) {
      if (ts[i]->scalar_type() != ts[0]->scalar_type() || ts[i]->device() != ts[0]->device()) {
        throw std::invalid_argument("all tensors of a bucket must share dtype and device: tensor 0 is " +
                                    std::string(c10::toString(ts[0]->scalar_type())) + " on " +
                                    ts[0]->device().str() + ", tensor " + std::to_string(i) + " is " +
                                    std::string(c10::toString(ts[i]->scalar_type())) + " on " +
                                    ts[i]->device().str());
      }
    }
    std::vector<at::Tensor> flat;
    flat.reserve(n);
    for (auto* t : ts) {
      flat.push_back(t->reshape({-1}));
    }
    at::Tensor buf = at::cat(flat);
    all_reduce_one(pg, buf);
    int64_t offset = 0;
    for (auto* t : ts) {
      int64_t k = t->numel();
      t->copy_(buf.narrow(0, offset, k).view(t->sizes()));
      offset += k;
    }
  });
}

char* plexus_pg_broadcast(void* handle, at::Tensor* t, int64_t root) {
  return guarded([&] {
    auto* pg = static_cast<PlexusProcessGroup*>(handle);
    check_tensors({t});
    int64_t world = pg->backend->getSize();
    if (root < 0 || root >= world) {
      throw std::invalid_argument("broadcast root " + std::to_string(root) + " is out of range for world size " +
                                  std::to_string(world));
    }
    c10::AutoGradMode no_grad(false);
    at::Tensor buf = t->is_contiguous() ? *t : t->contiguous();
    std::vector<at::Tensor> v{buf};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    opts.rootTensor = 0;
    opts.timeout = pg->timeout;
    wait_for(pg, pg->backend->broadcast(v, opts));
    if (!buf.is_same(*t)) {
      t->copy_(buf);
    }
  });
}

char* plexus_pg_barrier(void* handle) {
  return guarded([&] {
    auto* pg = static_cast<PlexusProcessGroup*>(handle);
    c10d::BarrierOptions opts;
    opts.timeout = pg->timeout;
    wait_for(pg, pg->backend->barrier(opts));
  });
}

// `t` copied into page-locked host memory (`out` receives a new tensor owned by the caller).
// tch's `Tensor::pin_memory(device)` passes the device argument that libtorch deprecated, and
// libtorch then warns on every call (every batch); `at::Tensor::pin_memory()` without it does not.
char* plexus_pin_memory(at::Tensor* t, at::Tensor** out) {
  return guarded([&] {
    if (t == nullptr || !t->defined()) throw std::invalid_argument("pin_memory of an undefined tensor");
    *out = new at::Tensor(t->is_pinned() ? *t : t->pin_memory());
  });
}

// Drops the gradients of `n` tensors (`.grad = None`, as torch.optim's zero_grad(set_to_none=True)
// does): the next backward then stores its gradient instead of adding it to a zeroed buffer, which
// saves a zero_ and an add_ kernel per parameter and per step.
char* plexus_clear_grads(at::Tensor** ts, int64_t n) {
  return guarded([&] {
    for (int64_t i = 0; i < n; ++i) {
      if (ts[i] == nullptr || !ts[i]->defined()) throw std::invalid_argument("clear_grads of an undefined tensor");
      ts[i]->mutable_grad().reset();
    }
  });
}

// AdamW over `n` parameter tensors in one fused libtorch kernel (`at::_fused_adamw_`, what
// torch.optim.AdamW(fused=True) runs on CPU and CUDA; tch binds no tensor-list operator): per
// element it reads the parameter, gradient and both moments once and writes them once, in the
// parameters' precision with fp32 arithmetic for bf16/fp16. `step` is a 0-dim float32 tensor on the
// parameters' device holding the update count including this update (bias correction reads it
// there, so a CUDA step needs no host value). All tensors share one device and dtype.
// `lr`: a 0-dim tensor on the parameters' device (the tensor-lr overload: a CUDA graph replays the
// update with whatever the tensor holds; libtorch's CUDA kernel reads it as float32, its CPU kernel
// as a double).
char* plexus_fused_adamw(at::Tensor** params, at::Tensor** grads, at::Tensor** exp_avgs, at::Tensor** exp_avg_sqs,
                         int64_t n, at::Tensor* step, at::Tensor* lr, double beta1, double beta2, double weight_decay,
                         double eps) {
  return guarded([&] {
    if (step == nullptr || !step->defined()) throw std::invalid_argument("fused_adamw without a step tensor");
    if (lr == nullptr || !lr->defined() || lr->dim() != 0) throw std::invalid_argument("fused_adamw: lr must be 0-dim");
    std::vector<at::Tensor> p, g, m, v, steps;
    for (int64_t i = 0; i < n; ++i) {
      for (at::Tensor** list : {params, grads, exp_avgs, exp_avg_sqs}) {
        if (list[i] == nullptr || !list[i]->defined()) throw std::invalid_argument("fused_adamw of an undefined tensor");
      }
      p.push_back(*params[i]);
      g.push_back(*grads[i]);
      m.push_back(*exp_avgs[i]);
      v.push_back(*exp_avg_sqs[i]);
      steps.push_back(*step);
    }
    at::NoGradGuard no_grad;
    at::_fused_adamw_(p, g, m, v, {}, steps, *lr, beta1, beta2, weight_decay, eps, /*amsgrad=*/false,
                      /*maximize=*/false);
  });
}

// ---------------------------------------------------------------------------------------------
// Part 3: counting the operators that do work (a CPU-measurable proxy of GPU kernel launches).
//
// A RecordFunction callback sees every operator call through the dispatcher, nested: composite
// operators (linear, reshape, cross-entropy, autograd nodes) call others. A call that calls no
// working operator — none, or only views and allocations (a kernel allocating its output through
// `empty` is still one kernel) — is what runs a kernel, unless it only makes a view or allocates
// itself (view, select, transpose, expand, empty, …): those are counted apart. Only the thread that
// began counting is counted (on the CPU, autograd runs a backward on the thread that calls it), so
// other threads — data loading, tests running beside — do not enter the count.
//
// Each counted call's wall time is added to its name too (a product's includes what it calls): a
// step's time by operator, like torch.profiler's table. The callback costs every call about a
// microsecond, so small operators read slower than they run.
//
// And the bytes each counted call writes, by dtype: the sizes of its output tensors (an in-place
// operator's output is the tensor it wrote; an operator that returns nothing, like the fused AdamW
// step, adds none), and the bytes of its tensor operands (what it reads, at most: an embedding's
// lookup counts its whole table). On a GPU, where the step's elementwise work is bound by memory
// traffic, these are its traffic; the fp32 bytes written are the step's fp32 temporaries, which a
// bf16 path or a fused kernel saves.

namespace op_count {
std::atomic<uint64_t> leaves{0}, metadata{0}, calls{0};
std::optional<at::CallbackHandle> handle;
std::thread::id counted_thread;
// Leaf operators that do work, by name: calls and nanoseconds (only the counting thread writes it).
struct NameStats {
  uint64_t calls = 0;
  uint64_t ns = 0;
  uint64_t bytes_f32 = 0;   // fp32 (and fp64) outputs
  uint64_t bytes_half = 0;  // bf16 and fp16 outputs
  uint64_t bytes_other = 0;
  uint64_t bytes_read = 0;  // tensor operands, every dtype
};

// The bytes of the tensors in `values` (tensors and tensor lists).
uint64_t tensor_bytes(c10::ArrayRef<c10::IValue> values) {
  uint64_t total = 0;
  const auto add = [&](const at::Tensor& t) {
    if (t.defined()) total += static_cast<uint64_t>(t.numel()) * t.element_size();
  };
  for (const auto& v : values) {
    if (v.isTensor()) {
      add(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) add(t);
    }
  }
  return total;
}

// Adds the bytes of the tensors in `outputs` (tensors and tensor lists) to `st`, by dtype.
void add_output_bytes(const std::vector<c10::IValue>& outputs, NameStats& st) {
  const auto add = [&](const at::Tensor& t) {
    if (!t.defined()) return;
    const uint64_t b = static_cast<uint64_t>(t.numel()) * t.element_size();
    switch (t.scalar_type()) {
      case at::kFloat:
      case at::kDouble: st.bytes_f32 += b; break;
      case at::kBFloat16:
      case at::kHalf: st.bytes_half += b; break;
      default: st.bytes_other += b;
    }
  };
  for (const auto& v : outputs) {
    if (v.isTensor()) {
      add(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) add(t);
    }
  }
}
std::map<std::string, NameStats> by_name;
// Per thread: the open calls, innermost last: whether each has called another operator, and
// whether it is a matrix product (counted as one kernel, whatever it calls: a CPU `bmm` of many
// small matrices calls `mm` and `copy_` per matrix, where a GPU runs one batched kernel).
struct OpenCall {
  bool had_work_child = false;
  bool product = false;
  uint64_t bytes_in = 0;  // its tensor operands (read at the start: the end callback may not see them)
  std::chrono::steady_clock::time_point start;
};
thread_local std::vector<OpenCall> open_calls;
thread_local int inside_product = 0;

bool is_product(const char* name) {
  static const char* const kNames[] = {"aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::addbmm",
                                       "aten::mv", "aten::addmv", "aten::dot", "aten::addr"};
  for (const char* n : kNames) {
    if (std::strcmp(n, name) == 0) return true;
  }
  return false;
}

bool is_metadata(const char* name) {
  static const char* const kNames[] = {
      "aten::view", "aten::_unsafe_view", "aten::reshape", "aten::_reshape_alias", "aten::as_strided",
      "aten::select", "aten::slice", "aten::narrow", "aten::t", "aten::transpose", "aten::permute",
      "aten::unsqueeze", "aten::squeeze", "aten::expand", "aten::expand_as", "aten::detach", "aten::alias",
      "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::resize_", "aten::lift_fresh",
      "aten::unbind", "aten::split", "aten::chunk", "aten::to", "aten::contiguous", "aten::flatten",
      "aten::unflatten", "aten::view_as", "aten::result_type", "aten::set_", "aten::numpy_T",
      "aten::split_with_sizes", "aten::movedim", "aten::swapaxes", "aten::diagonal", "aten::unfold",
      "aten::type_as", "aten::is_nonzero", "aten::item", "aten::_local_scalar_dense", "aten::size",
      "aten::stride", "aten::is_same_size", "aten::_has_compatible_shallow_copy_type", "aten::resolve_conj",
      "aten::resolve_neg", "aten::conj", "aten::_conj", "aten::_neg_view", "detach_", "aten::detach_", "detach"};
  for (const char* n : kNames) {
    if (std::strcmp(n, name) == 0) return true;
  }
  return false;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (std::this_thread::get_id() != counted_thread) return nullptr;
  OpenCall call;
  if (inside_product == 0 && fn.scope() == at::RecordScope::FUNCTION && is_product(fn.name())) {
    call.product = true;
    inside_product++;
  }
  call.bytes_in = tensor_bytes(fn.inputs());
  call.start = std::chrono::steady_clock::now();
  open_calls.push_back(call);
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (std::this_thread::get_id() != counted_thread) return;
  if (open_calls.empty()) return;  // began before counting started
  OpenCall call = open_calls.back();
  open_calls.pop_back();
  auto count = [&] {
    auto& stats = by_name[fn.name()];
    stats.calls++;
    add_output_bytes(fn.outputs(), stats);
    stats.bytes_read += call.bytes_in;
    stats.ns += static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - call.start).count());
  };
  auto work_done = [] {
    if (!open_calls.empty()) open_calls.back().had_work_child = true;
  };
  // Autograd nodes and the engine's records around them: their operators count, not they.
  if (fn.scope() != at::RecordScope::FUNCTION || std::strncmp(fn.name(), "autograd::", 10) == 0) {
    if (call.had_work_child) work_done();
    return;
  }
  calls++;
  if (call.product) {
    inside_product--;
    leaves++;
    count();
    work_done();
    return;
  }
  if (inside_product > 0) return;
  if (call.had_work_child) {  // composite: its working operators were counted
    work_done();
    return;
  }
  if (is_metadata(fn.name())) {
    metadata++;
    return;
  }
  leaves++;
  count();
  work_done();
}
}  // namespace op_count

// Whether `name` is an operator that only makes a view or allocates (see op_count::is_metadata).
int plexus_op_is_metadata(const char* name) { return op_count::is_metadata(name) ? 1 : 0; }

char* plexus_op_count_begin() {
  return guarded([&] {
    if (op_count::handle) throw std::runtime_error("operator counting is already running");
    op_count::leaves = 0;
    op_count::metadata = 0;
    op_count::calls = 0;
    op_count::counted_thread = std::this_thread::get_id();
    op_count::by_name.clear();
    op_count::open_calls.clear();
    op_count::inside_product = 0;
    op_count::handle = at::addGlobalCallback(
        at::RecordFunctionCallback(op_count::on_start, op_count::on_end)
            .needsInputs(true)
            .needsOutputs(true)
            .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
  });
}

// out: [leaf operators that do work, leaf view/allocation operators, all operator calls];
// names: "name calls nanoseconds fp32-bytes half-bytes other-bytes read-bytes" lines of the working
// leaf operators (malloc'd).
char* plexus_op_count_end(uint64_t* out, char** names) {
  return guarded([&] {
    if (!op_count::handle) throw std::runtime_error("operator counting is not running");
    at::removeCallback(*op_count::handle);
    op_count::handle.reset();
    out[0] = op_count::leaves;
    out[1] = op_count::metadata;
    out[2] = op_count::calls;
    std::string text;
    for (const auto& [name, st] : op_count::by_name) {
      text += name + " " + std::to_string(st.calls) + " " + std::to_string(st.ns) + " " + std::to_string(st.bytes_f32) +
              " " + std::to_string(st.bytes_half) + " " + std::to_string(st.bytes_other) + " " +
              std::to_string(st.bytes_read) + "\n";
    }
    *names = dup_string(text);
  });
}

}  // extern "C"


// ---------------------------------------------------------------------------------------------
// Part 3b: the operator trace of a step, with every host number that enters it.
//
// A CUDA graph replays the kernels it captured with the arguments they had then: a learning rate
// or a step index passed as a host number is frozen into the graph. Recording every operator call
// on this thread with its non-tensor arguments (numbers, bools, lists, strings) and its tensors'
// shapes and dtypes, two steps of a graph-safe step must give the same trace (tests/it/train.rs). On a
// CPU a 0-dim tensor cannot be told from a host number this way, so those are compared by shape.

namespace op_trace {
std::optional<at::CallbackHandle> handle;
std::thread::id traced_thread;
std::vector<std::string> lines;

void describe(const c10::IValue& v, std::string& out) {
  if (v.isTensor()) {
    const auto& t = v.toTensor();
    if (!t.defined()) {
      out += "undef";
      return;
    }
    out += std::string(c10::toString(t.scalar_type())) + "[";
    for (int64_t d = 0; d < t.dim(); ++d) out += (d ? "," : "") + std::to_string(t.size(d));
    out += "]";
  } else if (v.isTensorList()) {
    out += "tensors(" + std::to_string(v.toTensorList().size()) + ")";
  } else if (v.isNone()) {
    out += "none";
  } else {
    std::ostringstream os;
    os << v;  // numbers, bools, int lists, strings, devices, dtypes
    out += os.str();
  }
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (std::this_thread::get_id() != traced_thread) return nullptr;
  std::string line = fn.name();
  line += "(";
  bool first = true;
  for (const auto& v : fn.inputs()) {
    if (!first) line += ", ";
    first = false;
    describe(v, line);
  }
  line += ")";
  lines.push_back(std::move(line));
  return nullptr;
}
}  // namespace op_trace

extern "C" {

char* plexus_op_trace_begin() {
  return guarded([&] {
    if (op_trace::handle) throw std::runtime_error("an operator trace is already being recorded");
    op_trace::lines.clear();
    op_trace::traced_thread = std::this_thread::get_id();
    op_trace::handle = at::addGlobalCallback(
        at::RecordFunctionCallback(op_trace::on_start).needsInputs(true).scopes({at::RecordScope::FUNCTION}));
  });
}

// The trace since begin, one operator call a line (malloc'd).
char* plexus_op_trace_end(char** text) {
  return guarded([&] {
    if (!op_trace::handle) throw std::runtime_error("no operator trace is being recorded");
    at::removeCallback(*op_trace::handle);
    op_trace::handle.reset();
    std::string all;
    for (const auto& l : op_trace::lines) all += l + "\n";
    op_trace::lines.clear();
    *text = dup_string(all);
  });
}

}  // extern "C"

// ---------------------------------------------------------------------------------------------
// Part 4: the operators that make the host wait for the device, counted by libtorch itself.
//
// `plexus::host` counts the reads plexus makes on purpose; this counts what libtorch's dispatcher
// runs, so a read hidden inside an operator (an `.item()` in some composite, a `nonzero`, a copy to
// the CPU) is seen at run time, not only by the source scan of tests/it/device_discipline.rs. The
// operators that wait for a CUDA device: `_local_scalar_dense` (what `item`, `is_nonzero` and every
// `*_value` call), `nonzero`, `equal`, the `unique` family, `masked_select`, and a `copy_` from a
// CUDA tensor into a CPU one. Only the outermost of nested ones counts (`masked_select` may call
// `nonzero`). Process-wide, every thread (on a GPU the backward runs on libtorch's device threads);
// once started it stays on. The callback costs each operator call a little (inputs are looked at
// only where a CUDA device exists, for `copy_`), so it is started by the tests and on request
// (PLEXUS_COUNT_SYNCS=1), never by default.

namespace sync_watch {
std::mutex mu;
std::optional<at::CallbackHandle> handle;
std::atomic<uint64_t> total{0};
std::map<std::string, uint64_t> by_name;  // under mu
thread_local int inside = 0;
thread_local uint64_t on_this_thread = 0;
bool with_inputs = false;

struct Marker : at::ObserverContext {};

bool is_sync(const at::RecordFunction& fn) {
  static const char* const kNames[] = {"aten::_local_scalar_dense", "aten::nonzero",  "aten::equal",
                                       "aten::_unique",             "aten::_unique2", "aten::unique_dim",
                                       "aten::unique_consecutive",  "aten::masked_select"};
  const char* name = fn.name();
  for (const char* n : kNames) {
    if (std::strcmp(n, name) == 0) return true;
  }
  if (with_inputs && std::strcmp(name, "aten::copy_") == 0) {
    const auto inputs = fn.inputs();
    if (inputs.size() >= 2 && inputs[0].isTensor() && inputs[1].isTensor()) {
      const auto& dst = inputs[0].toTensor();
      const auto& src = inputs[1].toTensor();
      return dst.defined() && src.defined() && dst.is_cpu() && src.is_cuda();
    }
  }
  return false;
}

// libtorch's CPU kernel of the fused AdamW reads each parameter's step count with `item()`; its
// CUDA kernel reads them on the device. On the CPU that read waits for nothing, and counting it would
// hide what the count is for: a read that would stall a GPU. So nothing inside a CPU `_fused_adamw_`
// counts (where inputs are looked at, a CUDA one is counted like any operator).
bool is_cpu_fused_adamw(const at::RecordFunction& fn) {
  if (std::strcmp(fn.name(), "aten::_fused_adamw_") != 0) return false;
  if (!with_inputs) return true;
  const auto inputs = fn.inputs();
  if (inputs.empty() || !inputs[0].isTensorList()) return true;
  const auto params = inputs[0].toTensorList();
  return params.size() == 0 || static_cast<at::Tensor>(params.get(0)).is_cpu();
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (inside > 0) {
    inside++;  // nested in a counted (or exempt) one: each start is paired with its end below
    return std::make_unique<Marker>();
  }
  if (is_cpu_fused_adamw(fn)) {
    inside = 1;
    return std::make_unique<Marker>();
  }
  if (!is_sync(fn)) return nullptr;
  inside = 1;
  total++;
  on_this_thread++;
  std::lock_guard<std::mutex> lock(mu);
  by_name[std::strcmp(fn.name(), "aten::copy_") == 0 ? "device-to-host aten::copy_" : fn.name()]++;
  return std::make_unique<Marker>();
}

void on_end(const at::RecordFunction&, at::ObserverContext* ctx) {
  if (ctx != nullptr && inside > 0) inside--;
}
}  // namespace sync_watch

extern "C" {

// Starts counting (idempotent).
char* plexus_sync_watch_start() {
  return guarded([&] {
    std::lock_guard<std::mutex> lock(sync_watch::mu);
    if (sync_watch::handle) return;
#ifdef PLEXUS_WITH_CUDA
    sync_watch::with_inputs = at::detail::getCUDAHooks().getNumGPUs() > 0;
#endif
    sync_watch::handle = at::addGlobalCallback(at::RecordFunctionCallback(sync_watch::on_start, sync_watch::on_end)
                                                   .needsInputs(sync_watch::with_inputs)
                                                   .scopes({at::RecordScope::FUNCTION}));
  });
}

// active: whether counting runs; total: syncs so far, process-wide; thread: those on the calling
// thread; names: "name count" lines (malloc'd).
char* plexus_sync_watch_read(int* active, uint64_t* total, uint64_t* thread, char** names) {
  return guarded([&] {
    std::lock_guard<std::mutex> lock(sync_watch::mu);
    *active = sync_watch::handle ? 1 : 0;
    *total = sync_watch::total;
    *thread = sync_watch::on_this_thread;
    std::string text;
    for (const auto& [name, count] : sync_watch::by_name) text += name + " " + std::to_string(count) + "\n";
    *names = dup_string(text);
  });
}

}  // extern "C"
