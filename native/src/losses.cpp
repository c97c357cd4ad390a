// The language-model loss on bf16 logits without a full fp32 copy of them, on any device. Rust
// reaches it through native/src/lib.rs (`cross_entropy_chunked`), used by `Task::loss` for logits in a
// compute dtype other than fp32.
//
// Why: autocast's rule (and plexus's, parity/SPEC.md "Precision") computes the cross-entropy in
// fp32. Written with libtorch operators that means an fp32 copy of the [N, V] logits and an fp32
// log_softmax output saved for backward: for GPT-2 at 16×1024 tokens and a 50,304-token vocabulary,
// 3.3 GB written, saved and read again, where the bf16 logits are 1.65 GB. Here the rows are taken
// a chunk at a time: forward, each chunk is cast to fp32, and only its log-sum-exp (one fp32 per
// row) and the loss leave it; backward recomputes softmax = exp(x − lse) chunk by chunk and writes
// the gradient straight into the logits' dtype. Saved for backward: the logits themselves (in their
// own dtype) and lse [N]. The arithmetic is fp32 throughout, as autocast's cross_entropy is: the
// same numbers to fp32 summation order (checked against it in src/data/mod.rs's tests).

#include "guarded.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>

using plexus_native::guarded;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

// Mean over rows of lse(x_r) − x_r[target_r], x = logits [N, V] (any floating dtype) read in fp32;
// target [N] int64. → 0-dim fp32.
class ChunkedCrossEntropy : public torch::autograd::Function<ChunkedCrossEntropy> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& target,
                            int64_t chunk) {
    const int64_t n = logits.size(0);
    const auto f32 = logits.options().dtype(at::kFloat);
    auto lse = at::empty({n}, f32);
    auto total = at::zeros({}, f32);
    for (int64_t r = 0; r < n; r += chunk) {
      const int64_t c = std::min(chunk, n - r);
      const auto x = logits.narrow(0, r, c).to(at::kFloat);
      auto l = lse.narrow(0, r, c);
      at::logsumexp_out(l, x, {1}, false);
      const auto picked = x.gather(1, target.narrow(0, r, c).unsqueeze(1)).squeeze(1);
      total.add_(at::sub(l, picked).sum());
    }
    ctx->save_for_backward({logits, target, lse});
    ctx->saved_data["chunk"] = chunk;
    return total.div_(static_cast<double>(std::max<int64_t>(n, 1)));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& logits = saved[0];
    const auto& target = saved[1];
    const auto& lse = saved[2];
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const int64_t n = logits.size(0);
    // d(mean)/dx_r = (softmax(x_r) − onehot(target_r)) · g / N; g stays on the device.
    const auto scale = grads[0].to(at::kFloat) / static_cast<double>(std::max<int64_t>(n, 1));
    auto grad = at::empty_like(logits, at::MemoryFormat::Contiguous);
    for (int64_t r = 0; r < n; r += chunk) {
      const int64_t c = std::min(chunk, n - r);
      // A copy even for fp32 logits: it is modified in place below.
      auto p = logits.narrow(0, r, c).to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
      p.sub_(lse.narrow(0, r, c).unsqueeze(1)).exp_();
      const auto t = target.narrow(0, r, c).unsqueeze(1);
      p.scatter_add_(1, t, at::full({c, 1}, -1.0, p.options()));
      auto out = grad.narrow(0, r, c);
      at::mul_out(out, p, scale);
    }
    return {grad, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

extern "C" {

// logits [N, V] (floating), target [N] int64 on the same device; rows per chunk ≥ 1.
char* plexus_cross_entropy_chunked(at::Tensor* logits, at::Tensor* target, int64_t chunk, at::Tensor** out) {
  return guarded([&] {
    const auto& x = *logits;
    const auto& t = *target;
    if (x.dim() != 2 || !at::isFloatingType(x.scalar_type())) {
      throw std::invalid_argument("cross_entropy_chunked: logits must be a floating [N, V] tensor");
    }
    if (t.dim() != 1 || t.size(0) != x.size(0) || t.scalar_type() != at::kLong || t.device() != x.device()) {
      throw std::invalid_argument("cross_entropy_chunked: target must be int64 [N] on the logits' device");
    }
    if (chunk < 1) throw std::invalid_argument("cross_entropy_chunked: chunk must be at least 1 row");
    *out = new at::Tensor(ChunkedCrossEntropy::apply(x.contiguous(), t.contiguous(), chunk));
  });
}

}  // extern "C"
