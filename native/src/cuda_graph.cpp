// Whole-step CUDA graphs: libtorch's at::cuda::CUDAGraph behind a C ABI (native/src/lib.rs wraps it in
// `CudaGraph`; src/train/step.rs drives it).
//
// Why: a training step of plexus on a GPU is hundreds to thousands of kernels; for the multi-stream
// and dense topologies most are small, and the step is bound by launching them (bench/gpu). A
// captured graph replays the whole step — forward, backward, clipping, AdamW — as one launch.
//
// The protocol (as torch.cuda.graph's):
// * warm-up steps run eagerly on a side stream (`enter_side_stream` / `leave_side_stream`): cuBLAS
//   workspaces, NVRTC kernels and autograd's per-stream state are created there, outside capture;
// * the device is synchronised and the allocator's cached blocks given back (the warm-up's, kept
//   for the side stream, would otherwise sit beside the graph's pool: two steps' memory);
// * `capture_begin` (on the side stream) → the step's operators are recorded, not run →
//   `capture_end`; then `replay` runs the recorded step, on the current stream, once per step;
// * capture mode is thread-local: the data thread may pin memory and copy meanwhile;
// * graphs alive at the same time record into one memory pool (chosen by the caller, see below);
// * the default CUDA generator is registered by libtorch at capture_begin, so dropout and diffusion
//   noise in a replay draw from the generator's seed at replay time (`manual_seed(step_seed)`
//   before each replay keeps them a function of (seed, step)).
// What a replay reads and writes must keep its storage (src/train/step.rs keeps it so), and nothing
// that changes between steps may enter the step as a host number.
//
// Built with PLEXUS_WITH_CUDA_GRAPHS (CUDA headers that compile were found, as for NCCL); else every
// entry point returns an error saying so.

#include "guarded.h"

#include <ATen/ATen.h>

#ifdef PLEXUS_WITH_CUDA_GRAPHS
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#endif

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>

using plexus_native::guarded;

#ifdef PLEXUS_WITH_CUDA_GRAPHS
namespace {

// Streams and events through libtorch's device-generic interface (implemented in libc10_cuda), as
// cuda_kernels.cpp does: the c10/cuda stream and event classes are header code that calls the
// CUDA runtime itself, which this library does not link.
const c10::impl::DeviceGuardImplInterface& cuda() { return *c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA); }

struct Graph {
  c10::Device device;
  c10::Stream side;
  std::optional<c10::Stream> previous;  // set while the side stream is current
  at::cuda::CUDAGraph graph;
  bool capturing = false;
  bool captured = false;

  explicit Graph(c10::DeviceIndex d)
      : device(c10::DeviceType::CUDA, d), side(cuda().getStreamFromGlobalPool(device, /*isHighPriority=*/false)) {}
};

// The memory pool is chosen on the Rust side (native/src/cuda_graph.rs, `SharedPool`): graphs
// alive at the same time share one (`bench --compare` holds a graph per topology; separate pools
// would each keep a step's peak), and a capture after every earlier graph is gone gets a new one,
// because libtorch refuses a capture into a pool that outlived all of its graphs.

// After a failed capture_begin or capture_end, libtorch may leave the default CUDA generator of
// the device marked as capturing (CUDAGraph::capture_begin marks it before its checks, and only
// capture_end clears it): every later random draw of the process then fails ("Offset increment
// outside graph capture encountered unexpectedly"). A draw of length 0 tells (it throws only in
// that state, and advances nothing otherwise); the generator then gets a fresh state with the same
// seed and offset. Only on the failure path: a generator that works is left as it is, with the
// other graphs registered on it.
// (The probe is libtorch's own: if the stream still captured, it would take the capture branch and
// not throw, and nothing is replaced.)
void release_generator(c10::DeviceIndex device) {
  at::Generator gen = at::cuda::detail::getDefaultCUDAGenerator(device);  // shares the impl
  std::lock_guard<std::mutex> lock(gen.mutex());
  auto* impl = gen.get<at::CUDAGeneratorImpl>();
  try {
    impl->philox_cuda_state(0);
    return;
  } catch (const std::exception&) {
  }
  auto state = c10::make_intrusive<at::CUDAGeneratorState>(impl->current_seed(), impl->philox_offset_per_thread());
  impl->graphsafe_set_state(c10::make_intrusive<at::CUDAGeneratorImpl>(device, std::move(state)));
}

// Runs `step` (a capture_begin or capture_end); if it throws, the generator is released before the
// error goes on.
template <typename F>
void releasing_generator_on_error(const Graph& graph, F&& step) {
  try {
    step();
  } catch (...) {
    release_generator(graph.device.index());
    throw;
  }
}

// `waiter` waits for the work queued so far on `done`.
void order(const c10::Stream& done, const c10::Stream& waiter) {
  c10::Event event(c10::DeviceType::CUDA);
  event.record(done);
  event.block(waiter);
}

}  // namespace
#endif

#ifdef PLEXUS_WITH_CUDA_GRAPHS
namespace {
// An entry point's body on its graph, under `guarded`, with the graph's device current: capture,
// replay and the generator libtorch registers at capture_begin use the current device, and the
// rank of a data-parallel run on cuda:r (r ≥ 1) has not made it current otherwise.
template <typename F>
char* on_graph(void* g, F&& f) {
  return guarded([&] {
    Graph& graph = *static_cast<Graph*>(g);
    const c10::DeviceGuard device(graph.device);
    f(graph);
  });
}
}  // namespace

extern "C" {

int plexus_cuda_graphs_built() { return 1; }

// A new graph memory pool id (`out`: its two halves).
char* plexus_cuda_graph_pool_handle(uint64_t* out) {
  return guarded([&] {
    const c10::MempoolId_t id = at::cuda::graph_pool_handle();
    out[0] = id.first;
    out[1] = id.second;
  });
}

char* plexus_cuda_graph_new(int64_t device, void** out) {
  return guarded([&] {
    const c10::Device on(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device));
    const c10::DeviceGuard guard(on);
    *out = new Graph(on.index());
  });
}

void plexus_cuda_graph_free(void* g) { delete static_cast<Graph*>(g); }

// The side stream becomes the current stream of the graph's device, after it waits for the work
// queued on the stream that was current.
char* plexus_cuda_graph_enter(void* g) {
  return on_graph(g, [](Graph& graph) {
    if (graph.previous) throw std::runtime_error("cuda graph: already on the side stream");
    const c10::Stream current = cuda().getStream(graph.device);
    order(current, graph.side);
    graph.previous = cuda().exchangeStream(graph.side);
  });
}

// Back to the stream that was current before `enter`, which then waits for the side stream.
char* plexus_cuda_graph_leave(void* g) {
  return on_graph(g, [](Graph& graph) {
    if (!graph.previous) throw std::runtime_error("cuda graph: not on the side stream");
    const c10::Stream previous = *graph.previous;
    graph.previous.reset();
    cuda().exchangeStream(previous);
    order(graph.side, previous);
  });
}

// Starts recording on the side stream (`enter` first) into the memory pool `pool_first/second`.
// Nothing runs until `replay`.
char* plexus_cuda_graph_capture_begin(void* g, uint64_t pool_first, uint64_t pool_second) {
  return on_graph(g, [&](Graph& graph) {
    if (!graph.previous) throw std::runtime_error("cuda graph: capture must begin on the side stream");
    if (graph.captured || graph.capturing) throw std::runtime_error("cuda graph: captured already");
    // As torch.cuda.graph does: the warm-up steps' blocks, cached for the side stream, are given
    // back first, so that the graph's pool can take that memory instead of a second step's worth.
    cuda().synchronizeDevice(graph.device.index());
    if (auto* allocator = dynamic_cast<c10::DeviceAllocator*>(c10::GetAllocator(c10::DeviceType::CUDA))) {
      allocator->emptyCache();
    }
    releasing_generator_on_error(graph, [&] {
      graph.graph.capture_begin(c10::MempoolId_t{pool_first, pool_second}, cudaStreamCaptureModeThreadLocal);
    });
    graph.capturing = true;
  });
}

char* plexus_cuda_graph_capture_end(void* g) {
  return on_graph(g, [](Graph& graph) {
    if (!graph.capturing) throw std::runtime_error("cuda graph: not capturing");
    graph.capturing = false;
    releasing_generator_on_error(graph, [&] { graph.graph.capture_end(); });
    graph.captured = true;
  });
}

// Runs the recorded step on the current stream.
char* plexus_cuda_graph_replay(void* g) {
  return on_graph(g, [](Graph& graph) {
    if (!graph.captured) throw std::runtime_error("cuda graph: nothing captured");
    graph.graph.replay();
  });
}

}  // extern "C"

#else  // no CUDA headers: every entry point says so.

namespace {
char* not_built() {
  return plexus_native::dup_error(plexus_native::ErrorKind::Failed,
                                  "plexus was built without CUDA headers: no CUDA graphs (scripts/setup.sh installs them)");
}
}  // namespace

extern "C" {
int plexus_cuda_graphs_built() { return 0; }
char* plexus_cuda_graph_new(int64_t, void**) { return not_built(); }
void plexus_cuda_graph_free(void*) {}
char* plexus_cuda_graph_enter(void*) { return not_built(); }
char* plexus_cuda_graph_leave(void*) { return not_built(); }
char* plexus_cuda_graph_pool_handle(uint64_t*) { return not_built(); }
char* plexus_cuda_graph_capture_begin(void*, uint64_t, uint64_t) { return not_built(); }
char* plexus_cuda_graph_capture_end(void*) { return not_built(); }
char* plexus_cuda_graph_replay(void*) { return not_built(); }
}  // extern "C"

#endif
