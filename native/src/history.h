// The two buffers of one history of the dense topologies (native/src/history.cpp), shared with the
// autograd functions that read a history elsewhere (AttnRes' depth attention in cuda_kernels.cpp).
#pragma once

#include <ATen/ATen.h>

#include <initializer_list>
#include <vector>

namespace plexus_history {

// buf [cap, N]: row s holds state s, flattened. gbuf: row s gathers the gradient every reader of
// the history sends to state s, which state s's push returns. Passed as one non-tensor argument, so
// that autograd does not track the buffers as inputs.
struct Buffers {
  at::Tensor buf;
  at::Tensor gbuf;
};

// The gradient buffer, allocated and zeroed the first time a backward needs it. (gbuf is one
// TensorImpl shared by every node of the history, so resizing it here resizes it for all.)
inline void ensure_gradient_buffer(Buffers& h) {
  if (h.gbuf.numel() == 0) {
    h.gbuf.resize_(h.buf.sizes());
    h.gbuf.zero_();
  }
}

// For an operator's record: `first`, then rows `slots` of each of `histories` (what it reads or
// writes of a history, not the whole buffer). Built only while a record asks for them.
inline std::vector<c10::IValue> record_rows(std::vector<at::Tensor> first, const std::vector<int64_t>& slots,
                                            std::initializer_list<at::Tensor> histories) {
  std::vector<c10::IValue> out(first.begin(), first.end());
  for (const auto& t : histories) {
    for (const auto slot : slots) out.emplace_back(t.select(0, slot));
  }
  return out;
}

}  // namespace plexus_history
