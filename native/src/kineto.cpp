// libtorch's profiler (Kineto: CPU operators, and on a GPU the CUDA runtime calls and the kernels
// CUPTI reports) behind a C ABI, for `plexus bench --profile` (native/src/kineto.rs reads the
// events and sorts the time into categories), and plexus' own scopes (RecordFunction user
// scopes, as torch.profiler.record_function) that tell where a kernel was asked for.
//
// The events go to Rust as text, one per line, tab-separated:
//   kind  name  thread  start_ns  duration_ns  correlation  linked  sequence_nr  forward_thread
// with kind one of op (a CPU operator), scope (a plexus scope), launch (a CUDA runtime or driver
// call on the host), kernel, memcpy, memset (on the device), other. An operator's `correlation`
// is the `linked` of the kernels and runtime calls it made (as torch.profiler pairs them), a
// kernel's `correlation` its runtime call's; an operator's `sequence_nr` ties a backward node to
// the forward operator that made it (`forward_thread`: the thread that ran that forward).

#include "guarded.h"

#include <ATen/record_function.h>
#include <kineto/ActivityType.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <atomic>
#include <cstdlib>
#include <set>
#include <string>

using plexus_native::dup_string;
using plexus_native::guarded;

namespace {

namespace prof = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

std::atomic<bool> running{false};

const char* kind_of(uint8_t activity) {
  switch (static_cast<libkineto::ActivityType>(activity)) {
    case libkineto::ActivityType::CPU_OP:
      return "op";
    case libkineto::ActivityType::USER_ANNOTATION:
      return "scope";
    case libkineto::ActivityType::CUDA_RUNTIME:
    case libkineto::ActivityType::CUDA_DRIVER:
      return "launch";
    case libkineto::ActivityType::CONCURRENT_KERNEL:
      return "kernel";
    case libkineto::ActivityType::GPU_MEMCPY:
      return "memcpy";
    case libkineto::ActivityType::GPU_MEMSET:
      return "memset";
    default:
      return "other";
  }
}

// Tabs and newlines cannot occur in a field.
std::string field(std::string s) {
  for (char& c : s) {
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  }
  return s;
}

}  // namespace

extern "C" {

// Starts recording CPU operators, and with `cuda` also the CUDA runtime and kernels.
char* plexus_kineto_begin(int cuda) {
  return guarded([&] {
    if (running.load()) throw std::runtime_error("the profiler is already running");
    const ProfilerConfig config(ProfilerState::KINETO, /*report_input_shapes=*/false, /*profile_memory=*/false,
                                /*with_stack=*/false, /*with_flops=*/false, /*with_modules=*/false);
    // Without a GPU to profile, Kineto's complaint that it found none (on every CPU machine with a
    // CUDA build of libtorch) is noise; the user's own setting wins.
    if (!cuda) setenv("KINETO_LOG_LEVEL", "5", /*overwrite=*/0);
    std::set<ActivityType> activities{ActivityType::CPU};
    if (cuda) activities.insert(ActivityType::CUDA);
    prof::prepareProfiler(config, activities);
    prof::enableProfiler(config, activities);
    running.store(true);
  });
}

// Stops it; `events` gets the lines described above (malloc'd); with a non-empty `trace`, the Chrome
// trace (chrome://tracing, Perfetto) is written there.
char* plexus_kineto_end(const char* trace, char** events) {
  return guarded([&] {
    if (!running.load()) throw std::runtime_error("the profiler is not running");
    running.store(false);
    const auto result = prof::disableProfiler();
    std::string text;
    for (const auto& e : result->events()) {
      text += kind_of(e.activityType());
      text += '\t' + field(e.name());
      text += '\t' + std::to_string(e.startThreadId());
      text += '\t' + std::to_string(e.startNs());
      text += '\t' + std::to_string(e.durationNs());
      text += '\t' + std::to_string(e.correlationId());
      text += '\t' + std::to_string(e.linkedCorrelationId());
      text += '\t' + std::to_string(e.sequenceNr());
      text += '\t' + std::to_string(e.fwdThreadId());
      text += '\n';
    }
    if (trace && *trace) result->save(trace);
    *events = dup_string(text);
  });
}

// A plexus scope: a RecordFunction user scope named `name` (static storage), open until
// `plexus_scope_end`. Null while the profiler is not running (nothing is recorded then).
void* plexus_scope_begin(const char* name) {
  if (!running.load(std::memory_order_relaxed)) return nullptr;
  try {
    auto* scope = new at::RecordFunction(at::RecordScope::USER_SCOPE);
    if (scope->isActive()) scope->before(name);
    return scope;
  } catch (...) {
    return nullptr;
  }
}

void plexus_scope_end(void* scope) {
  try {
    delete static_cast<at::RecordFunction*>(scope);
  } catch (...) {
  }
}

}  // extern "C"
