// Whole-step CUDA graphs: libtorch's at::cuda::CUDAGraph behind a C ABI (src/native.rs wraps it in
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
// * every graph of the process records into one memory pool (`shared_pool`);
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

// One memory pool for every graph of the process: the temporaries of one step are reused by the
// next graph's (`bench --compare` holds a graph per topology; separate pools would each keep a
// step's peak). Safe because plexus replays its graphs one after another on one stream, and what
// outlives a replay (gradients, outputs) stays allocated.
c10::MempoolId_t shared_pool() {
  static const c10::MempoolId_t pool = at::cuda::graph_pool_handle();
  return pool;
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

// Starts recording on the side stream (`enter` first). Nothing runs until `replay`.
char* plexus_cuda_graph_capture_begin(void* g) {
  return on_graph(g, [](Graph& graph) {
    if (!graph.previous) throw std::runtime_error("cuda graph: capture must begin on the side stream");
    if (graph.captured || graph.capturing) throw std::runtime_error("cuda graph: captured already");
    // As torch.cuda.graph does: the warm-up steps' blocks, cached for the side stream, are given
    // back first, so that the graph's pool can take that memory instead of a second step's worth.
    cuda().synchronizeDevice(graph.device.index());
    if (auto* allocator = dynamic_cast<c10::DeviceAllocator*>(c10::GetAllocator(c10::DeviceType::CUDA))) {
      allocator->emptyCache();
    }
    graph.capturing = true;
    graph.graph.capture_begin(shared_pool(), cudaStreamCaptureModeThreadLocal);
  });
}

char* plexus_cuda_graph_capture_end(void* g) {
  return on_graph(g, [](Graph& graph) {
    if (!graph.capturing) throw std::runtime_error("cuda graph: not capturing");
    graph.capturing = false;
    graph.graph.capture_end();
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
  return plexus_native::dup_string(
      "plexus was built without CUDA headers: no CUDA graphs (scripts/setup.sh installs them)");
}
}  // namespace

extern "C" {
int plexus_cuda_graphs_built() { return 0; }
char* plexus_cuda_graph_new(int64_t, void**) { return not_built(); }
void plexus_cuda_graph_free(void*) {}
char* plexus_cuda_graph_enter(void*) { return not_built(); }
char* plexus_cuda_graph_leave(void*) { return not_built(); }
char* plexus_cuda_graph_capture_begin(void*) { return not_built(); }
char* plexus_cuda_graph_capture_end(void*) { return not_built(); }
char* plexus_cuda_graph_replay(void*) { return not_built(); }
}  // extern "C"

#endif
