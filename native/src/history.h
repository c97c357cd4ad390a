// The two buffers of one history of the dense topologies (native/src/history.cpp), shared with the
// autograd functions that read a history elsewhere (AttnRes' depth attention in cuda_kernels.cpp).
#pragma once

#include <ATen/ATen.h>

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

}  // namespace plexus_history
