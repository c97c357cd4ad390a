// One gradient tensor per multi-stream state (Hyper-Connections, mHC), shared by the autograd
// functions that read the state (stream_kernels.cpp's read and write, cuda_kernels.cpp's norm
// projection) and the pass-through that owns it (StreamGather in stream_kernels.cpp).
//
// Why: a unit reads its streams H [.., n, D] three times (the write's H_resᵀ H, the read's
// H_pre H, and the dynamic weights' norm projection), and autograd adds the three [.., n, D]
// gradients: two temporaries written, then two `add_`s that read two tensors and write one, about
// 7 passes over an n·D-wide fp32 tensor per unit. Here the first backward writes the gradient into
// the cell and the later ones add theirs in the same pass that computes it (3 passes, and no
// temporaries). The order is autograd's own: the write's backward comes first (the read's needs
// the unit's input gradient, which needs the write's), then the read's, then the projection's, so
// the sums are the ones autograd formed, in the same order (the kernels add without contracting
// the product into a fused multiply-add).
//
// The protocol, as the dense topologies' history (history.h):
// * StreamGather (h → h, an autograd pass-through) creates nothing; its caller makes the cell, a
//   tensor of no elements on the streams' device and dtype, one per state and step.
// * A reader given the cell returns no gradient for h (autograd sees none) and instead either
//   writes its gradient into the cell (the first: `claim` resizes it) or adds it.
// * Every reader takes the gather's output as its input, so the engine runs the gather's backward
//   after every reader's; it returns the cell's sum plus what other readers (composite operators)
//   sent through autograd, and empties the cell for a second backward through a retained graph.
#pragma once

#include <ATen/ATen.h>

#include <utility>

namespace plexus_stream_grad {

// A cell, passed as a non-tensor argument so that autograd does not track it as an input.
// `grad` undefined: the caller gathers nothing (autograd adds the gradients as usual).
struct Cell {
  at::Tensor grad;
};

inline bool gathers(const Cell& c) { return c.grad.defined(); }

// The cell an entry point was handed (NULL: none).
inline Cell cell_of(const at::Tensor* t) { return t != nullptr ? Cell{*t} : Cell{}; }

// Where a reader writes h's gradient (`sizes` h's): the cell, resized on the first write (then
// `accumulate` false: write) or as it is (true: add into it). The cell's storage is contiguous.
inline std::pair<at::Tensor, bool> target(const Cell& c, at::IntArrayRef sizes) {
  if (c.grad.numel() == 0) {
    c.grad.resize_(sizes);
    return {c.grad, false};
  }
  return {c.grad.view(sizes), true};
}

// Empties the cell, letting go of its storage (a view taken before keeps it). Through the
// TensorImpl, not set_: that operator records a storage pointer, which changes every step and which
// a captured step must not take (tests/it/train.rs holds the step's trace to the same operators).
inline void release(const Cell& c) {
  auto* impl = c.grad.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(at::empty({0}, c.grad.options()).storage());
  impl->set_storage_offset(0);
  impl->set_sizes_contiguous({0});
}

// A reader whose kernel cannot add in place: its gradient `g` added into the cell (copied when
// first; not adopted with set_, which records a storage pointer a captured step must not take).
inline void add(const Cell& c, const at::Tensor& g) {
  if (c.grad.numel() == 0) {
    c.grad.resize_(g.sizes()).copy_(g);
  } else {
    c.grad.view(g.sizes()).add_(g);
  }
}

}  // namespace plexus_stream_grad
