// The history of the dense topologies (ANCRe, DenseFormer, LayerComb; AttnRes on a GPU, whose
// depth attention reads it in cuda_kernels.cpp) in one buffer, so that a
// weighted sum over earlier states is one matrix-vector product forward and two kernels backward,
// on any device. Rust reaches these through native/src/lib.rs (`history_push`, `history_mix`) and
// src/topology/common.rs (`History`).
//
// Why: written with libtorch operators, `Σ_i w_i x_i` over k earlier states is k kernels forward
// (a mul, then an addcmul per state, each reading the running sum again) and about 3k backward,
// and every state's gradient is accumulated from every later sum that read it: O(L²) kernels per
// step over L units, launches that dominate on a GPU. A stacked history (`w @ stack(states)`)
// would copy O(L²) states instead; a buffer written slot by slot is an in-place write into a
// tensor the earlier products saved for backward, which autograd's version check rejects. Here:
//
// * buf  [cap, N]: row s holds state s, flattened (N elements). Written once per state by
//   HistoryPush; read by HistoryMix as a strided [k, N] view, one mv forward.
// * gbuf [cap, N]: row s gathers the gradient every sum sends to state s (one rank-1 update, addr_,
//   per sum backward), allocated and zeroed by the first backward that needs it.
// * HistoryPush (x → x, a pass-through) owns state s's gradient: its backward returns the gradient
//   the state's other consumers sent plus gbuf[s], and zeroes gbuf[s] (so a second backward through
//   a retained graph starts from zero). Every HistoryMix that reads slot s takes push s's output as
//   an input (and returns no gradient for it): the autograd engine then runs push s's backward
//   only after every such sum's backward has added to gbuf[s].
//
// Neither buffer is saved through save_for_backward (they are written in place after the products
// that read them): they live in the nodes' saved_data. Rows are written once and read only after.

#include "guarded.h"
#include "history.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

using plexus_native::guarded;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

using HistoryBuffers = plexus_history::Buffers;

void check_buffers(const HistoryBuffers& h) {
  if (!h.buf.defined() || h.buf.dim() != 2 || !h.buf.is_contiguous()) {
    throw std::invalid_argument("history buffer must be a contiguous [cap, N] tensor");
  }
  if (!h.gbuf.defined() || h.gbuf.scalar_type() != h.buf.scalar_type() || h.gbuf.device() != h.buf.device()) {
    throw std::invalid_argument("history gradient buffer must be a tensor of the buffer's dtype and device");
  }
}

// Rows `slots` of a [cap, N] buffer as one [k, N] view when they are evenly spaced (every run of
// the dense topologies: 0..k, or DenseFormer's dilated i, i − d, … in ascending order), else null.
bool rows_view(const at::Tensor& t, const std::vector<int64_t>& slots, at::Tensor* out) {
  const int64_t k = static_cast<int64_t>(slots.size());
  const int64_t step = k > 1 ? slots[1] - slots[0] : 1;
  for (int64_t i = 1; i < k; ++i) {
    if (slots[i] - slots[i - 1] != step) return false;
  }
  if (step < 1) return false;
  const int64_t n = t.size(1);
  *out = t.as_strided({k, n}, {step * n, 1}, t.storage_offset() + slots[0] * n);
  return true;
}

struct HistoryPush : public torch::autograd::Function<HistoryPush> {
  // x [..] (N elements) → x, and row `slot` of buf ← x
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, HistoryBuffers h, int64_t slot) {
    check_buffers(h);
    if (slot < 0 || slot >= h.buf.size(0)) {
      throw std::invalid_argument("history slot " + std::to_string(slot) + " is outside the buffer's " +
                                  std::to_string(h.buf.size(0)) + " rows");
    }
    if (x.numel() != h.buf.size(1) || x.scalar_type() != h.buf.scalar_type() || x.device() != h.buf.device()) {
      throw std::invalid_argument("a history state must have the buffer's row size, dtype and device");
    }
    h.buf.select(0, slot).copy_(x.reshape({-1}));
    ctx->saved_data["buf"] = h.buf;
    ctx->saved_data["gbuf"] = h.gbuf;
    ctx->saved_data["slot"] = slot;
    ctx->saved_data["sizes"] = x.sizes().vec();
    return x;
  }

  // g (the gradient from the state's other consumers, possibly undefined) → g + gbuf[slot]
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    HistoryBuffers h{ctx->saved_data["buf"].toTensor(), ctx->saved_data["gbuf"].toTensor()};
    const auto sizes = ctx->saved_data["sizes"].toIntVector();
    const auto& g = grads[0];
    at::Tensor gx;
    if (h.gbuf.numel() == 0) {  // no sum has read this history in this backward
      gx = g.defined() ? g : at::zeros(sizes, h.buf.options());
    } else {
      auto row = h.gbuf.select(0, ctx->saved_data["slot"].toInt());
      gx = g.defined() ? g.reshape({-1}) + row : row.clone();
      row.zero_();
      gx = gx.view(sizes);
    }
    return {gx, at::Tensor(), at::Tensor()};
  }
};

struct HistoryMix : public torch::autograd::Function<HistoryMix> {
  // w [k], the states at `slots` (for the engine's ordering only: the values come from buf) →
  // Σ_i w[i] buf[slots[i]], shaped like the states
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& w, at::TensorList states, HistoryBuffers h,
                            std::vector<int64_t> slots) {
    check_buffers(h);
    const int64_t k = static_cast<int64_t>(slots.size());
    if (k == 0 || w.dim() != 1 || w.size(0) != k || static_cast<int64_t>(states.size()) != k) {
      throw std::invalid_argument("a history sum takes k ≥ 1 slots, k states and weights [k]");
    }
    for (const auto s : slots) {
      if (s < 0 || s >= h.buf.size(0)) throw std::invalid_argument("history slot out of range");
    }
    if (w.scalar_type() != h.buf.scalar_type() || w.device() != h.buf.device()) {
      throw std::invalid_argument("history weights must have the buffer's dtype and device");
    }
    at::Tensor rows;
    if (!rows_view(h.buf, slots, &rows)) rows = h.buf.index_select(0, at::tensor(slots, h.buf.options().dtype(at::kLong)));
    auto y = at::mv(rows.t(), w.contiguous());
    ctx->save_for_backward({w});
    ctx->saved_data["buf"] = h.buf;
    ctx->saved_data["gbuf"] = h.gbuf;
    ctx->saved_data["slots"] = slots;
    ctx->saved_data["sizes"] = states[0].sizes().vec();
    return y.view(states[0].sizes());
  }

  // gy → (gw [k], no gradient for the states: it goes to gbuf, which their pushes return)
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    HistoryBuffers h{ctx->saved_data["buf"].toTensor(), ctx->saved_data["gbuf"].toTensor()};
    const auto w = ctx->get_saved_variables()[0];
    const auto slots = ctx->saved_data["slots"].toIntVector();
    const auto g = grads[0].reshape({-1});
    plexus_history::ensure_gradient_buffer(h);
    at::Tensor rows, grows;
    at::Tensor gw;
    if (rows_view(h.buf, slots, &rows)) {
      rows_view(h.gbuf, slots, &grows);
      gw = at::mv(rows, g);
      grows.addr_(w, g);
    } else {
      const auto index = at::tensor(slots, h.buf.options().dtype(at::kLong));
      gw = at::mv(h.buf.index_select(0, index), g);
      h.gbuf.index_add_(0, index, at::outer(w, g));
    }
    variable_list out{gw};
    out.resize(1 + slots.size() + 2);  // the states, the buffers and the slots: no gradient
    return out;
  }
};

}  // namespace

extern "C" {

// x → x (an autograd pass-through that owns the state's gradient), row `slot` of buf ← x.
char* plexus_history_push(at::Tensor* buf, at::Tensor* gbuf, int64_t slot, at::Tensor* x, at::Tensor** out) {
  return guarded([&] { *out = new at::Tensor(HistoryPush::apply(*x, HistoryBuffers{*buf, *gbuf}, slot)); });
}

// Σ_i w[i] · state slots[i], from buf; `states` are the pushes' outputs of those slots.
char* plexus_history_mix(at::Tensor* buf, at::Tensor* gbuf, const int64_t* slots, at::Tensor** states, int64_t k,
                         at::Tensor* w, at::Tensor** out) {
  return guarded([&] {
    std::vector<int64_t> s(slots, slots + k);
    std::vector<at::Tensor> xs;
    xs.reserve(k);
    for (int64_t i = 0; i < k; ++i) xs.push_back(*states[i]);
    *out = new at::Tensor(HistoryMix::apply(*w, at::TensorList(xs), HistoryBuffers{*buf, *gbuf}, s));
  });
}

}  // extern "C"
