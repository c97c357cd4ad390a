// plexus' CUDA kernels, compiled at run time with NVRTC for the GPU at hand and the number of
// streams n, loaded and launched through the CUDA driver API:
// * mHC's Sinkhorn–Knopp (native/src/sinkhorn.cu), behind one autograd function here; Rust reaches
//   it through native/src/lib.rs (`sinkhorn_cuda`), and src/topology/mhc.rs uses it on CUDA tensors;
// * the multi-stream read and write (native/src/streams.cu), the CUDA half of the autograd functions
//   of stream_kernels.cpp, which call `plexus_cuda::stream_*` (cuda_kernels.h) for CUDA tensors.
//
// No CUDA header and no link to a CUDA library (as in plexus_native.cpp): NVRTC (libnvrtc, which the
// torch wheel ships in nvidia/cu*/lib) and the driver (libcuda.so.1) are opened with dlopen, and the
// few C functions used are declared below; their signatures are CUDA's stable C ABI. Compiling needs
// no GPU, so the tests compile the kernels for real architectures on a CPU machine
// (`plexus_cuda_kernels_compile`), and run their per-token arithmetic on the CPU
// (`plexus_sinkhorn_host`, `plexus_streams_host`).
//
// On a GPU, the first use for a device and n compiles, loads and then checks every kernel against
// the same per-token functions run on the CPU in double (`self_check`). Any failure (no NVRTC, no
// driver, a compile error, a disagreement) is kept and returned on every later call for that
// device and n, and the Rust side falls back to the composite libtorch graph with one warning.

#include "cuda_kernels.h"
#include "guarded.h"
#include "history.h"
#include "record.h"
#include "stream_grad.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/custom_function.h>

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#define PLEXUS_KERNELS_ON_HOST
#include "cuda_prelude.cuh"
#include "sinkhorn.cu"
#include "streams.cu"
#include "losses.cu"
#include "norms.cu"
#include "norm_project.cu"
#include "activations.cu"
#include "hacn.cu"
#include "rope.cu"
#include "attnres.cu"

using plexus_native::dup_string;
using plexus_native::guarded;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

// The text of cuda_prelude.cuh, sinkhorn.cu and streams.cu, as a string literal (build.rs writes it
// to OUT_DIR).
const char kSource[] =
#include "cuda_kernels_source.inc"
    ;

// The largest n the kernels are built for: a Sinkhorn thread keeps 2·n² values in registers
// backward, a stream write thread n² + n partial sums.
constexpr int64_t kMaxStreams = 8;
constexpr unsigned kThreads = 128;        // Sinkhorn: threads per block (= __launch_bounds__), one per token
constexpr unsigned kStreamThreads = 128;  // the stream kernels: threads per block, one block per token
constexpr unsigned kLossThreads = 256;    // the loss kernels: threads per block, one block per row of logits
constexpr unsigned kNormThreads = 256;    // the norm kernels: threads per block (forward: a row; backward: rows)
constexpr int64_t kNormRows = 32;         // the norm's backward: rows per block (their weight gradients summed there)
constexpr int64_t kNormProjectRows = 64;  // HC's dynamic logits, backward: rows per block (their partial gradients)
constexpr int64_t kAttnResRows = 16;      // AttnRes' depth attention, backward: rows per block (their share of gq)

// Calls f with std::integral_constant<int, n> for n in 1..=kMaxStreams.
template <typename F>
void with_n(int64_t n, F&& f) {
  switch (n) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    case 8: return f(std::integral_constant<int, 8>{});
    default:
      throw std::invalid_argument("the CUDA kernels take 1 ≤ n ≤ " + std::to_string(kMaxStreams) +
                                  " streams (n = " + std::to_string(n) + ")");
  }
}

// ----------------------------------------------------------------------------------------------
// The per-token functions on the CPU: P (and, with `grad`, the logits' gradient) for logits
// [M, n, n], every token in turn. T = float or double.

template <typename T>
void host_sinkhorn(const T* logits, const T* grad, T* out, T* grad_logits, int64_t m_total, int64_t n,
                   int iters) {
  with_n(n, [&](auto fixed) {
    constexpr int N = decltype(fixed)::value;
    for (int64_t m = 0; m < m_total; ++m) plexus_sinkhorn::forward_token<T, N>(logits, out, m, iters);
    if (grad != nullptr) {
      std::vector<T> sums(static_cast<size_t>(2 * iters * N * m_total));
      for (int64_t m = 0; m < m_total; ++m) {
        plexus_sinkhorn::backward_token<T, N>(logits, grad, grad_logits, sums.data(), m, m_total, iters);
      }
    }
  });
}

// The stream kernels' per-token functions on the CPU, a token's block emulated by `threads` calls
// (thread i takes d = i, i + threads, …) whose partial sums are added in thread order: u (and, with
// gu, gh and the per-token gpre [M, n]) for the read; out (and, with g, gh, go and the per-token
// gws [M, n² + n]: gres, then gpost) for the write. `per_token`: the weights hold M sets, else one.
template <typename T>
void host_stream_read(const T* h, const T* pre, const T* gu, T* u, T* gh, T* gpre, int64_t m_total, int64_t n,
                      int64_t d, bool per_token, int64_t threads, bool accumulate = false) {
  with_n(n, [&](auto fixed) {
    constexpr int N = decltype(fixed)::value;
    for (int64_t m = 0; m < m_total; ++m) {
      T* sum = gu != nullptr ? gpre + m * N : nullptr;
      if (sum != nullptr) std::fill(sum, sum + N, T(0));
      for (int64_t i = 0; i < threads; ++i) {
        plexus_streams::read_forward<T, N>(h, pre, u, m, d, per_token, i, threads);
        if (sum == nullptr) continue;
        T part[N];
        plexus_streams::read_backward<T, N>(h, pre, gu, gh, m, d, per_token, i, threads, part, accumulate);
        for (int k = 0; k < N; ++k) sum[k] += part[k];
      }
    }
  });
}

template <typename T>
void host_stream_write(const T* h, const T* res, const T* post, const T* o, const T* g, T* out, T* gh, T* go, T* gws,
                       int64_t m_total, int64_t n, int64_t d, bool per_token, int64_t threads) {
  with_n(n, [&](auto fixed) {
    constexpr int N = decltype(fixed)::value;
    for (int64_t m = 0; m < m_total; ++m) {
      T* sum = g != nullptr ? gws + m * (N * N + N) : nullptr;
      if (sum != nullptr) std::fill(sum, sum + N * N + N, T(0));
      for (int64_t i = 0; i < threads; ++i) {
        plexus_streams::write_forward<T, N>(h, res, post, o, out, m, d, per_token, i, threads);
        if (sum == nullptr) continue;
        T part[N * N + N];
        plexus_streams::write_backward<T, N>(h, res, post, o, g, gh, go, m, d, per_token, i, threads, part);
        for (int k = 0; k < N * N + N; ++k) sum[k] += part[k];
      }
    }
  });
}

// The loss kernels' per-row functions on the CPU, a row's block emulated by `threads` calls whose
// online-softmax states merge in thread order: lse and loss [N] (fp32), and with `grad` the
// logits' gradient at scale `scale` (x: [N, V] bf16 as raw bits, or fp32).
template <typename T>
void host_cross_entropy(const T* x, const long long* target, float scale, float* lse, float* loss, T* grad, int64_t n,
                        int64_t v, int64_t threads) {
  for (int64_t r = 0; r < n; ++r) {
    plexus_losses::Online s = plexus_losses::online_empty();
    for (int64_t i = 0; i < threads; ++i) s = plexus_losses::online_merge(s, plexus_losses::row_online(x, r, v, i, threads));
    plexus_losses::row_finish(x, target, lse, loss, r, v, s);
    if (grad == nullptr) continue;
    for (int64_t i = 0; i < threads; ++i) plexus_losses::row_backward(x, target, lse, scale, grad, r, v, i, threads);
  }
}

// The norm kernels' per-row functions on the CPU, each block emulated by `threads` calls whose
// partial sums add in thread order: y (bf16 bits), mean and rstd [R]; with gy, gx [R, D] and the
// weight's (and, with gb, the bias's) gradient summed over all rows in row order. b and gb may be
// null; `layer`: LayerNorm, else RMSNorm.
void host_norm(const float* x, const float* w, const float* b, const unsigned short* gy, unsigned short* y, float* mean,
               float* rstd, float* gx, float* gw, float* gb, int64_t rows, int64_t d, float eps, bool layer,
               int64_t threads) {
  for (int64_t r = 0; r < rows; ++r) {
    float s = 0.0f, q = 0.0f;
    if (layer) {
      for (int64_t t = 0; t < threads; ++t) s += plexus_norms::row_sum(x, r, d, t, threads);
    }
    const float m = layer ? s / static_cast<float>(d) : 0.0f;
    for (int64_t t = 0; t < threads; ++t) q += plexus_norms::row_sq(x, r, d, m, t, threads);
    const float rs = 1.0f / std::sqrt(q / static_cast<float>(d) + eps);
    for (int64_t t = 0; t < threads; ++t) plexus_norms::row_write(x, w, b, y, r, d, m, rs, t, threads);
    mean[r] = m;
    rstd[r] = rs;
  }
  if (gy == nullptr) return;
  std::fill(gw, gw + d, 0.0f);
  if (gb != nullptr) std::fill(gb, gb + d, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    float sg = 0.0f, sgx = 0.0f;
    for (int64_t t = 0; t < threads; ++t) {
      float a = 0.0f, c = 0.0f;
      plexus_norms::row_grad_sums(x, gy, w, r, d, mean[r], rstd[r], t, threads, &a, &c);
      sg += a;
      sgx += c;
    }
    const float mg = layer ? sg / static_cast<float>(d) : 0.0f, mgx = sgx / static_cast<float>(d);
    for (int64_t t = 0; t < threads; ++t) {
      plexus_norms::row_grad(x, gy, w, gx, gw, gb, r, d, mean[r], rstd[r], mg, mgx, t, threads);
    }
  }
}

// HC's dynamic logits on the CPU (norm_project.cu's per-thread functions, each block emulated by
// `threads` calls whose partial sums add in thread order): z [R, K] (K = n + 2), mean and rstd [R];
// with gz, gx [R, D] and the parameters' gradients summed over all rows in row order (gW rounded as
// the kernels' caller does).
void host_norm_project(const float* x, const float* gamma, const float* beta, const float* w, const float* gz, float* z,
                       float* mean, float* rstd, float* gx, float* ggamma, float* gbeta, float* gw, int64_t rows,
                       int64_t d, int64_t n, float eps, bool round, int64_t threads, bool accumulate = false) {
  with_n(n, [&](auto fixed) {
    constexpr int K = decltype(fixed)::value + 2;
    for (int64_t r = 0; r < rows; ++r) {
      float s = 0.0f, q = 0.0f;
      for (int64_t t = 0; t < threads; ++t) s += plexus_norms::row_sum(x, r, d, t, threads);
      const float m = s / static_cast<float>(d);
      for (int64_t t = 0; t < threads; ++t) q += plexus_norms::row_sq(x, r, d, m, t, threads);
      const float rs = 1.0f / std::sqrt(q / static_cast<float>(d) + eps);
      float acc[K] = {};
      for (int64_t t = 0; t < threads; ++t) {
        float part[K];
        plexus_norm_project::forward_partial<K>(x, gamma, beta, w, r, d, m, rs, round, t, threads, part);
        for (int k = 0; k < K; ++k) acc[k] += part[k];
      }
      for (int k = 0; k < K; ++k) z[r * K + k] = plexus_norm_project::rho(acc[k], round);
      mean[r] = m;
      rstd[r] = rs;
    }
    if (gz == nullptr) return;
    std::vector<float> part(static_cast<size_t>(2 * d + d * K), 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      float g[K];
      plexus_norm_project::load_gz<K>(gz, r, round, g);
      float sg = 0.0f, sgx = 0.0f;
      for (int64_t t = 0; t < threads; ++t) {
        float a = 0.0f, c = 0.0f;
        plexus_norm_project::backward_sums<K>(x, gamma, w, g, r, d, mean[r], rstd[r], round, t, threads, &a, &c);
        sg += a;
        sgx += c;
      }
      const float mg = sg / static_cast<float>(d), mgx = sgx / static_cast<float>(d);
      for (int64_t t = 0; t < threads; ++t) {
        plexus_norm_project::backward_row<K>(x, gamma, beta, w, g, gx, part.data(), r, d, mean[r], rstd[r], mg, mgx,
                                             round, t, threads, accumulate);
      }
    }
    std::copy(part.begin(), part.begin() + d, ggamma);
    std::copy(part.begin() + d, part.begin() + 2 * d, gbeta);
    for (int64_t i = 0; i < d * K; ++i) gw[i] = plexus_norm_project::rho(part[2 * d + i], round);
  });
}

// SwiGLU's per-element functions on the CPU over n elements (bf16 as raw bits, or fp32): h, and
// with gh, gg and gu.
template <typename T>
void host_swiglu(const T* g, const T* u, const T* gh, T* h, T* gg, T* gu, int64_t n) {
  plexus_activations::swiglu_forward(g, u, h, n, 0, 1);
  if (gh != nullptr) plexus_activations::swiglu_backward(g, u, gh, gg, gu, n, 0, 1);
}

// RoPE's per-element functions on the CPU: y [B, H, T, hd] from x (rows `stride` apart), and with
// gy, gx [B, T, H·hd].
template <typename T>
void host_rope(const T* x, const T* cs, const T* sn, const T* gy, T* y, T* gx, int64_t b, int64_t t, int64_t h,
               int64_t hd, int64_t stride) {
  plexus_rope::rope_forward(x, cs, sn, y, b, t, h, hd, stride, 0, 1);
  if (gy != nullptr) plexus_rope::rope_backward(gy, cs, sn, gx, b, t, h, hd, 0, 1);
}

// ----------------------------------------------------------------------------------------------
// The GPU paths on the CPU. The autograd functions of the loss, norm, SwiGLU and RoPE kernels (below)
// take CPU tensors too: each launch_* has a run_*_on_host twin that runs the same per-row and
// per-element functions on the CPU, a row's block as its kernel's thread count with partial sums in
// thread order. Under PLEXUS_FUSED_KERNELS=cuda-host the Rust side sends a CPU step down the paths a
// GPU step takes, so that their wiring and autograd are checked end to end against the PyTorch
// reference (`plexus parity`) and a CPU counts the kernels a GPU step launches (`plexus bench`).

// Calls f with a value of the element type of `t` as the kernels see it: float, or bf16 as raw bits.
template <typename F>
void with_element(const at::Tensor& t, F&& f) {
  if (t.scalar_type() == at::kFloat) {
    f(float{});
  } else if (t.scalar_type() == at::kBFloat16) {
    f(static_cast<unsigned short>(0));
  } else {
    throw std::invalid_argument("plexus' kernels take bf16 or fp32 tensors");
  }
}

template <typename T>
const T* cptr(const at::Tensor& t) {
  return reinterpret_cast<const T*>(t.const_data_ptr());
}
template <typename T>
T* mptr(const at::Tensor& t) {
  return reinterpret_cast<T*>(t.mutable_data_ptr());
}

void run_ce_forward_on_host(const at::Tensor& logits, const at::Tensor& target, const at::Tensor& lse,
                            const at::Tensor& loss) {
  with_element(logits, [&](auto e) {
    using T = decltype(e);
    host_cross_entropy<T>(cptr<T>(logits), cptr<long long>(target), 0.0f, mptr<float>(lse), mptr<float>(loss), nullptr,
                          logits.size(0), logits.size(1), kLossThreads);
  });
}

// scale: one fp32 on the CPU (g/N).
void run_ce_backward_on_host(const at::Tensor& logits, const at::Tensor& target, const at::Tensor& lse,
                             const at::Tensor& scale, const at::Tensor& grad) {
  const float s = *cptr<float>(scale);
  with_element(logits, [&](auto e) {
    using T = decltype(e);
    for (int64_t r = 0; r < logits.size(0); ++r) {
      plexus_losses::row_backward(cptr<T>(logits), cptr<long long>(target), cptr<float>(lse), s, mptr<T>(grad), r,
                                  logits.size(1), 0, 1);
    }
  });
}

void run_norm_forward_on_host(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const at::Tensor& y,
                              const at::Tensor& mean, const at::Tensor& rstd, double eps, bool layer) {
  host_norm(cptr<float>(x), cptr<float>(w), b.defined() ? cptr<float>(b) : nullptr, nullptr, mptr<unsigned short>(y),
            mptr<float>(mean), mptr<float>(rstd), nullptr, nullptr, nullptr, x.size(0), x.size(1),
            static_cast<float>(eps), layer, kNormThreads);
}

// → (gx, gw, gb; gb undefined without a bias). The statistics are computed again, as the forward's.
std::tuple<at::Tensor, at::Tensor, at::Tensor> run_norm_backward_on_host(const at::Tensor& x, const at::Tensor& gy,
                                                                         const at::Tensor& w, const at::Tensor& b,
                                                                         double eps, bool layer) {
  const int64_t rows = x.size(0), d = x.size(1);
  auto y = at::empty({rows, d}, x.options().dtype(at::kBFloat16));
  auto mean = at::empty({rows}, x.options()), rstd = at::empty({rows}, x.options());
  auto gx = at::empty_like(x), gw = at::empty({d}, x.options());
  auto gb = b.defined() ? at::empty({d}, x.options()) : at::Tensor();
  host_norm(cptr<float>(x), cptr<float>(w), b.defined() ? cptr<float>(b) : nullptr, cptr<unsigned short>(gy),
            mptr<unsigned short>(y), mptr<float>(mean), mptr<float>(rstd), mptr<float>(gx), mptr<float>(gw),
            b.defined() ? mptr<float>(gb) : nullptr, rows, d, static_cast<float>(eps), layer, kNormThreads);
  return {gx, gw, gb};
}

void run_swiglu_forward_on_host(const at::Tensor& g, const at::Tensor& u, const at::Tensor& h) {
  with_element(g, [&](auto e) {
    using T = decltype(e);
    plexus_activations::swiglu_forward(cptr<T>(g), cptr<T>(u), mptr<T>(h), g.numel(), 0, 1);
  });
}

void run_swiglu_backward_on_host(const at::Tensor& g, const at::Tensor& u, const at::Tensor& gh, const at::Tensor& gg,
                                 const at::Tensor& gu) {
  with_element(g, [&](auto e) {
    using T = decltype(e);
    plexus_activations::swiglu_backward(cptr<T>(g), cptr<T>(u), cptr<T>(gh), mptr<T>(gg), mptr<T>(gu), g.numel(), 0, 1);
  });
}

void run_rope_forward_on_host(const at::Tensor& x, const at::Tensor& cs, const at::Tensor& sn, const at::Tensor& y,
                              int64_t heads) {
  with_element(x, [&](auto e) {
    using T = decltype(e);
    plexus_rope::rope_forward(cptr<T>(x), cptr<T>(cs), cptr<T>(sn), mptr<T>(y), y.size(0), y.size(2), heads, y.size(3),
                              x.stride(1), 0, 1);
  });
}

// H-ACN's update (hacn.cu): as launch_hacn_forward/backward, CPU tensors.
void run_hacn_forward_on_host(const at::Tensor& x, const at::Tensor& acc, const at::Tensor& h, const at::Tensor& a,
                              const at::Tensor& xo, const at::Tensor& acco) {
  with_element(h, [&](auto e) {
    using T = decltype(e);
    plexus_hacn::forward(cptr<float>(x), cptr<float>(acc), cptr<T>(h), *cptr<float>(a), mptr<float>(xo),
                         mptr<float>(acco), x.numel(), 0, 1);
  });
}

// → ga.
float run_hacn_backward_on_host(const at::Tensor& x, const at::Tensor& gx_out, const at::Tensor& gacc_out,
                                const at::Tensor& a, const at::Tensor& gx, const at::Tensor& gh) {
  float ga = 0.0f;
  with_element(gh, [&](auto e) {
    using T = decltype(e);
    ga = plexus_hacn::backward(cptr<float>(x), cptr<float>(gx_out),
                               gacc_out.defined() ? cptr<float>(gacc_out) : nullptr, *cptr<float>(a),
                               mptr<float>(gx), mptr<T>(gh), x.numel(), 0, 1);
  });
  return ga;
}

// AttnRes' depth attention (attnres.cu) on the CPU, each block emulated by `threads` calls whose
// partial sums add in thread order: y [R, D] and alpha [R, m] of the sources `s` in buf; with gy
// [R, D], instead the sources' gradients added into gbuf and gq [D] (overwritten) summed over rows
// in row order.
void host_attnres(const float* buf, const plexus_attnres::Sources& s, const float* q, const float* gy, float* y,
                  float* alpha_out, float* gbuf, float* gq, int64_t rows, int64_t d, int64_t threads) {
  const int m = s.m;
  std::vector<float> stats(3 * m), alpha(m), rho(m), c2(m), c3(m);
  if (gq != nullptr) std::fill(gq, gq + d, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int i = 0; i < m; ++i) {
      float total[3] = {0.0f, 0.0f, 0.0f};
      for (int64_t t = 0; t < threads; ++t) {
        float part[3];
        plexus_attnres::source_sums(buf + s.at[i] + r * d, q, gy != nullptr ? gy + r * d : nullptr, d, t, threads,
                                    part);
        for (int j = 0; j < 3; ++j) total[j] += part[j];
      }
      std::copy(total, total + 3, stats.begin() + 3 * i);
    }
    plexus_attnres::row_weights(stats.data(), m, d, gy != nullptr, alpha.data(), rho.data(), c2.data(), c3.data());
    if (gy == nullptr) {
      std::copy(alpha.begin(), alpha.end(), alpha_out + r * m);
      for (int64_t t = 0; t < threads; ++t) plexus_attnres::mix(buf, s, r, d, alpha.data(), y, t, threads);
    } else {
      for (int64_t t = 0; t < threads; ++t) {
        plexus_attnres::mix_backward(buf, gbuf, s, r, d, q, gy, alpha.data(), c2.data(), c3.data(), gq, t, threads);
      }
    }
  }
}

// HC's dynamic logits: x [R, D], gamma, beta [D], w [D, K] fp32 contiguous CPU tensors; z [R, K], mean,
// rstd [R]. Backward recomputes the statistics, as the forward's.
void run_norm_project_forward_on_host(const at::Tensor& x, const at::Tensor& gamma, const at::Tensor& beta,
                                      const at::Tensor& w, const at::Tensor& z, const at::Tensor& mean,
                                      const at::Tensor& rstd, double eps, bool round) {
  host_norm_project(cptr<float>(x), cptr<float>(gamma), cptr<float>(beta), cptr<float>(w), nullptr, mptr<float>(z),
                    mptr<float>(mean), mptr<float>(rstd), nullptr, nullptr, nullptr, nullptr, x.size(0), x.size(1),
                    w.size(1) - 2, static_cast<float>(eps), round, kNormThreads);
}

// gx [R, D] written, or with `accumulate` added to.
std::tuple<at::Tensor, at::Tensor, at::Tensor> run_norm_project_backward_on_host(
    const at::Tensor& x, const at::Tensor& gamma, const at::Tensor& beta, const at::Tensor& w, const at::Tensor& gz,
    double eps, bool round, const at::Tensor& gx, bool accumulate) {
  const int64_t rows = x.size(0), d = x.size(1), kk = w.size(1);
  auto z = at::empty({rows, kk}, x.options()), mean = at::empty({rows}, x.options()), rstd = at::empty({rows}, x.options());
  auto gg = at::empty({d}, x.options()), gb = at::empty({d}, x.options()), gw = at::empty({d, kk}, x.options());
  host_norm_project(cptr<float>(x), cptr<float>(gamma), cptr<float>(beta), cptr<float>(w), cptr<float>(gz),
                    mptr<float>(z), mptr<float>(mean), mptr<float>(rstd), mptr<float>(gx), mptr<float>(gg),
                    mptr<float>(gb), mptr<float>(gw), rows, d, kk - 2, static_cast<float>(eps), round, kNormThreads,
                    accumulate);
  return {gg, gb, gw};
}

void run_rope_backward_on_host(const at::Tensor& gy, const at::Tensor& cs, const at::Tensor& sn, const at::Tensor& gx) {
  with_element(gy, [&](auto e) {
    using T = decltype(e);
    plexus_rope::rope_backward(cptr<T>(gy), cptr<T>(cs), cptr<T>(sn), mptr<T>(gx), gy.size(0), gy.size(2), gy.size(1),
                               gy.size(3), 0, 1);
  });
}

// ----------------------------------------------------------------------------------------------
// NVRTC, opened at run time.

using nvrtcResult = int;
using nvrtcProgram = struct _nvrtcProgram*;

struct Nvrtc {
  std::string path;
  const char* (*GetErrorString)(nvrtcResult);
  nvrtcResult (*Version)(int*, int*);
  nvrtcResult (*GetNumSupportedArchs)(int*);
  nvrtcResult (*GetSupportedArchs)(int*);
  nvrtcResult (*CreateProgram)(nvrtcProgram*, const char*, const char*, int, const char* const*, const char* const*);
  nvrtcResult (*DestroyProgram)(nvrtcProgram*);
  nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char* const*);
  nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t*);
  nvrtcResult (*GetProgramLog)(nvrtcProgram, char*);
  nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t*);
  nvrtcResult (*GetCUBIN)(nvrtcProgram, char*);
  nvrtcResult (*GetPTXSize)(nvrtcProgram, size_t*);
  nvrtcResult (*GetPTX)(nvrtcProgram, char*);

  void check(nvrtcResult r, const char* what) const {
    if (r != 0) throw std::runtime_error(std::string("NVRTC ") + what + ": " + GetErrorString(r));
  }

  std::vector<int> supported_archs() const {
    int count = 0;
    check(GetNumSupportedArchs(&count), "nvrtcGetNumSupportedArchs");
    std::vector<int> archs(static_cast<size_t>(count));
    check(GetSupportedArchs(archs.data()), "nvrtcGetSupportedArchs");
    return archs;
  }
};

template <typename Fn>
void symbol(void* lib, const std::string& path, const char* name, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(lib, name));
  if (*out == nullptr) throw std::runtime_error(path + " has no " + name);
}

// The directory of libtorch_cpu.so in this process (where the wheel's nvidia/ packages are found).
std::string torch_lib_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&at::globalContext), &info) == 0 || info.dli_fname == nullptr) return "";
  std::string file = info.dli_fname;
  const auto slash = file.rfind('/');
  return slash == std::string::npos ? "." : file.substr(0, slash);
}

// NVRTC opens libnvrtc-builtins.so.<major>.<minor> by name when it compiles, which the dynamic linker
// finds only on its search path; the wheel keeps it next to libnvrtc. Opened here first, from
// there, the name resolves to the loaded library. (A failure is left to the compile's error.)
void preload_builtins(const Nvrtc& n) {
  int major = 0, minor = 0;
  Dl_info info{};
  if (n.Version(&major, &minor) != 0 || dladdr(reinterpret_cast<void*>(n.Version), &info) == 0 ||
      info.dli_fname == nullptr) {
    return;
  }
  std::string dir = info.dli_fname;
  const auto slash = dir.rfind('/');
  dir = slash == std::string::npos ? "." : dir.substr(0, slash);
  const std::string name = "libnvrtc-builtins.so." + std::to_string(major) + "." + std::to_string(minor);
  if (dlopen((dir + "/" + name).c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) dlopen(name.c_str(), RTLD_NOW | RTLD_GLOBAL);
}

// libnvrtc: the torch wheel's (CUDA 13: nvidia/cu13/lib; CUDA 12: nvidia/cuda_nvrtc/lib), else the
// dynamic linker's search path (LD_LIBRARY_PATH, a system CUDA).
const Nvrtc& nvrtc() {
  static const std::pair<std::unique_ptr<Nvrtc>, std::string> loaded = []() {
    const std::string dir = torch_lib_dir();
    std::vector<std::string> candidates;
    if (!dir.empty()) {
      candidates.push_back(dir + "/../../nvidia/cu13/lib/libnvrtc.so.13");
      candidates.push_back(dir + "/../../nvidia/cuda_nvrtc/lib/libnvrtc.so.12");
    }
    for (const char* name : {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"}) candidates.emplace_back(name);
    std::string tried;
    for (const auto& path : candidates) {
      void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib == nullptr) {
        tried += (tried.empty() ? "" : ", ") + path;
        continue;
      }
      try {
        auto n = std::make_unique<Nvrtc>();
        n->path = path;
        symbol(lib, path, "nvrtcGetErrorString", &n->GetErrorString);
        symbol(lib, path, "nvrtcVersion", &n->Version);
        symbol(lib, path, "nvrtcGetNumSupportedArchs", &n->GetNumSupportedArchs);
        symbol(lib, path, "nvrtcGetSupportedArchs", &n->GetSupportedArchs);
        symbol(lib, path, "nvrtcCreateProgram", &n->CreateProgram);
        symbol(lib, path, "nvrtcDestroyProgram", &n->DestroyProgram);
        symbol(lib, path, "nvrtcCompileProgram", &n->CompileProgram);
        symbol(lib, path, "nvrtcGetProgramLogSize", &n->GetProgramLogSize);
        symbol(lib, path, "nvrtcGetProgramLog", &n->GetProgramLog);
        symbol(lib, path, "nvrtcGetCUBINSize", &n->GetCUBINSize);
        symbol(lib, path, "nvrtcGetCUBIN", &n->GetCUBIN);
        symbol(lib, path, "nvrtcGetPTXSize", &n->GetPTXSize);
        symbol(lib, path, "nvrtcGetPTX", &n->GetPTX);
        preload_builtins(*n);
        return std::make_pair(std::move(n), std::string());
      } catch (const std::exception& e) {
        return std::make_pair(std::unique_ptr<Nvrtc>(), std::string(e.what()));
      }
    }
    return std::make_pair(std::unique_ptr<Nvrtc>(),
                          "NVRTC (libnvrtc) was not found (tried " + tried +
                              "); it comes with PyTorch's CUDA wheels (nvidia/cu13/lib)");
  }();
  if (!loaded.first) throw std::runtime_error(loaded.second);
  return *loaded.first;
}

// The compiled kernels for n streams and one architecture: a CUBIN for `sm_<arch>` when NVRTC
// knows that architecture, else PTX for the newest `compute_<a>` it knows below it (the driver
// compiles PTX for newer GPUs). Throws with NVRTC's log on a compile error.
struct Image {
  std::string bytes;
  std::string target;  // sm_90, compute_120, ...
  bool cubin;
  std::string log;  // NVRTC's log; for a CUBIN with ptxas' resource usage (registers, spills)
};

Image compile(int64_t n, int arch) {
  const Nvrtc& lib = nvrtc();
  const auto archs = lib.supported_archs();
  Image image;
  image.cubin = std::find(archs.begin(), archs.end(), arch) != archs.end();
  int target = arch;
  if (!image.cubin) {
    target = -1;
    for (int a : archs) {
      if (a < arch) target = std::max(target, a);
    }
    if (target < 0) {
      throw std::runtime_error("NVRTC (" + lib.path + ") compiles for none of the architectures up to sm_" +
                               std::to_string(arch));
    }
  }
  image.target = (image.cubin ? "sm_" : "compute_") + std::to_string(target);
  const std::string arch_opt = "--gpu-architecture=" + image.target;
  const std::string n_opt = "-DPLEXUS_N=" + std::to_string(n);
  const std::string threads_opt = "-DPLEXUS_STREAM_THREADS=" + std::to_string(kStreamThreads);
  const std::string loss_threads_opt = "-DPLEXUS_LOSS_THREADS=" + std::to_string(kLossThreads);
  const std::string norm_threads_opt = "-DPLEXUS_NORM_THREADS=" + std::to_string(kNormThreads);
  // ptxas -v writes each kernel's registers and spill bytes into the log: a register spill (local
  // memory traffic in the inner loop) fails the compile test.
  const char* opts[] = {arch_opt.c_str(),       n_opt.c_str(),  threads_opt.c_str(), loss_threads_opt.c_str(),
                        norm_threads_opt.c_str(), "--std=c++17", "--ptxas-options=-v"};
  const int n_opts = image.cubin ? 7 : 6;
  nvrtcProgram prog = nullptr;
  lib.check(lib.CreateProgram(&prog, kSource, "plexus_kernels.cu", 0, nullptr, nullptr), "nvrtcCreateProgram");
  struct Destroy {
    const Nvrtc& lib;
    nvrtcProgram& prog;
    ~Destroy() { lib.DestroyProgram(&prog); }
  } destroy{lib, prog};
  const nvrtcResult r = lib.CompileProgram(prog, n_opts, opts);
  std::string log;
  {
    size_t size = 0;
    if (lib.GetProgramLogSize(prog, &size) == 0 && size > 1) {
      log.resize(size);
      lib.GetProgramLog(prog, log.data());
      log.resize(size - 1);  // the terminating NUL
    }
  }
  if (r != 0) {
    throw std::runtime_error("NVRTC could not compile plexus' CUDA kernels for " + image.target + " (n = " +
                             std::to_string(n) + "): " + lib.GetErrorString(r) + "\n" + log);
  }
  image.log = log;
  size_t size = 0;
  if (image.cubin) {
    lib.check(lib.GetCUBINSize(prog, &size), "nvrtcGetCUBINSize");
    image.bytes.resize(size);
    lib.check(lib.GetCUBIN(prog, image.bytes.data()), "nvrtcGetCUBIN");
  } else {
    lib.check(lib.GetPTXSize(prog, &size), "nvrtcGetPTXSize");
    image.bytes.resize(size);
    lib.check(lib.GetPTX(prog, image.bytes.data()), "nvrtcGetPTX");
  }
  return image;
}

// ----------------------------------------------------------------------------------------------
// The CUDA driver, opened at run time (libtorch has loaded it already on a GPU machine).

using CUresult = int;
using CUdevice = int;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;
// cuda.h's CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR.
constexpr int kAttrCcMajor = 75;
constexpr int kAttrCcMinor = 76;

struct Driver {
  CUresult (*Init)(unsigned);
  CUresult (*GetErrorString)(CUresult, const char**);
  CUresult (*DeviceGet)(CUdevice*, int);
  CUresult (*DeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*CtxGetCurrent)(CUcontext*);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*ModuleLoadData)(CUmodule*, const void*);
  CUresult (*ModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                           void**, void**);
  CUresult (*StreamSynchronize)(CUstream);
  CUresult (*StreamIsCapturing)(CUstream, int*);

  void check(CUresult r, const char* what) const {
    if (r == 0) return;
    const char* text = nullptr;
    GetErrorString(r, &text);
    throw std::runtime_error(std::string("CUDA driver ") + what + ": " + (text != nullptr ? text : "?") + " (" +
                             std::to_string(r) + ")");
  }
};

const Driver& driver() {
  static const std::pair<std::unique_ptr<Driver>, std::string> loaded = []() {
    const std::string path = "libcuda.so.1";
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (lib == nullptr) {
      return std::make_pair(std::unique_ptr<Driver>(), std::string("the CUDA driver (libcuda.so.1) is not installed"));
    }
    try {
      auto d = std::make_unique<Driver>();
      symbol(lib, path, "cuInit", &d->Init);
      symbol(lib, path, "cuGetErrorString", &d->GetErrorString);
      symbol(lib, path, "cuDeviceGet", &d->DeviceGet);
      symbol(lib, path, "cuDeviceGetAttribute", &d->DeviceGetAttribute);
      symbol(lib, path, "cuDevicePrimaryCtxRetain", &d->DevicePrimaryCtxRetain);
      symbol(lib, path, "cuCtxGetCurrent", &d->CtxGetCurrent);
      symbol(lib, path, "cuCtxSetCurrent", &d->CtxSetCurrent);
      symbol(lib, path, "cuModuleLoadData", &d->ModuleLoadData);
      symbol(lib, path, "cuModuleGetFunction", &d->ModuleGetFunction);
      symbol(lib, path, "cuLaunchKernel", &d->LaunchKernel);
      symbol(lib, path, "cuStreamSynchronize", &d->StreamSynchronize);
      symbol(lib, path, "cuStreamIsCapturing", &d->StreamIsCapturing);
      // libtorch's runtime has initialised the driver before any CUDA tensor exists; this costs
      // nothing then, and makes the driver calls below valid on their own.
      d->check(d->Init(0), "cuInit");
      return std::make_pair(std::move(d), std::string());
    } catch (const std::exception& e) {
      return std::make_pair(std::unique_ptr<Driver>(), std::string(e.what()));
    }
  }();
  if (!loaded.first) throw std::runtime_error(loaded.second);
  return *loaded.first;
}

// The start of the message of every error that means "these kernels cannot run here" (no driver,
// no NVRTC, a failed first-use check; thrown as ErrorKind::KernelsUnavailable, or
// UnavailableInCapture for a first use inside a CUDA graph capture): the Rust side
// (native::cuda_result) reads the kind and runs the composite code instead. Any other error of a
// kernel call (a failed launch, a fault that PLEXUS_CUDA_SYNC_CHECK pins) is a failure of the run.
constexpr const char* kUnavailable = "plexus' CUDA kernels are unavailable: ";

// driver(), its failure marked as the kernels' unavailability.
const Driver& driver_or_unavailable() {
  try {
    return driver();
  } catch (const std::exception& e) {
    throw plexus_native::KindedError(plexus_native::ErrorKind::KernelsUnavailable,
                                     kUnavailable + std::string(e.what()));
  }
}

// The kernels loaded for one device and n.
struct Kernels {
  CUcontext context = nullptr;  // the device's primary context, which libtorch's runtime calls use
  CUfunction forward = nullptr;   // Sinkhorn
  CUfunction backward = nullptr;  // Sinkhorn
  CUfunction read = nullptr, read_backward = nullptr, write = nullptr, write_backward = nullptr;
  // The loss, by the logits' dtype: [0] bf16, [1] fp32.
  CUfunction ce_forward[2] = {nullptr, nullptr}, ce_backward[2] = {nullptr, nullptr};
  CUfunction norm_forward = nullptr, norm_backward = nullptr;  // pre-norms written in bf16
  CUfunction norm_project_forward = nullptr, norm_project_backward = nullptr;  // HC's dynamic logits (K = n + 2)
  CUfunction swiglu_forward[2] = {nullptr, nullptr}, swiglu_backward[2] = {nullptr, nullptr};  // [0] bf16, [1] fp32
  CUfunction rope_forward[2] = {nullptr, nullptr}, rope_backward[2] = {nullptr, nullptr};      // [0] bf16, [1] fp32
  CUfunction hacn_forward[2] = {nullptr, nullptr}, hacn_backward[2] = {nullptr, nullptr};      // by h: [0] bf16, [1] fp32
  CUfunction attnres_forward = nullptr, attnres_backward = nullptr;  // AttnRes' depth attention
  int64_t n = 0;
  std::string target;
};

// PLEXUS_CUDA_SYNC_CHECK=1: synchronise the stream after every launch of these kernels, so that a
// fault inside one (an illegal address, a trap) is reported as that kernel's, here, instead of by
// whichever later libtorch call happens to meet the sticky error. Slow; for debugging and the GPU
// slot plan's kernel group. Read once.
bool sync_check() {
  static const bool on = [] {
    const char* v = std::getenv("PLEXUS_CUDA_SYNC_CHECK");
    return v != nullptr && (std::strcmp(v, "1") == 0 || std::strcmp(v, "true") == 0);
  }();
  return on;
}

// Makes the device's primary context current on this thread (a thread on which libtorch has made
// no CUDA runtime call yet, an autograd worker say, may have none) and launches f (named `what` in
// errors) with `blocks` blocks of `threads` on libtorch's current stream of that device.
// cuLaunchKernel's own result is the driver API's counterpart of cudaGetLastError after a
// runtime launch: a bad configuration or an unloadable kernel fails here, with the kernel's name.
void launch(const Kernels& k, CUfunction f, const char* what, c10::Device device, int64_t blocks, unsigned threads,
            void** args) {
  if (blocks == 0) return;
  if (blocks > 0x7fffffff) throw std::invalid_argument("too many tokens for one CUDA launch");
  const Driver& d = driver();
  CUcontext current = nullptr;
  d.check(d.CtxGetCurrent(&current), "cuCtxGetCurrent");
  if (current != k.context) d.check(d.CtxSetCurrent(k.context), "cuCtxSetCurrent");
  const c10::Stream stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device);
  const auto cu_stream = static_cast<CUstream>(stream.native_handle());
  const auto named = [&](const char* call) {
    return std::string(call) + " of plexus' " + what + " kernel (n = " + std::to_string(k.n) + ", " + k.target +
           ", " + std::to_string(blocks) + " blocks of " + std::to_string(threads) + ")";
  };
  const CUresult launched =
      d.LaunchKernel(f, static_cast<unsigned>(blocks), 1, 1, threads, 1, 1, 0, cu_stream, args, nullptr);
  if (launched != 0) d.check(launched, named("cuLaunchKernel").c_str());
  // Not while a CUDA graph records the stream: a synchronisation there would end the capture.
  int capture_status = 0;  // CU_STREAM_CAPTURE_STATUS_NONE
  if (sync_check() && d.StreamIsCapturing(cu_stream, &capture_status) == 0 && capture_status == 0) {
    const CUresult synced = d.StreamSynchronize(cu_stream);
    if (synced != 0) d.check(synced, named("PLEXUS_CUDA_SYNC_CHECK: cuStreamSynchronize after").c_str());
  }
}

// Blocks of kThreads for m tokens, one thread each (Sinkhorn).
int64_t token_blocks(int64_t m) { return (m + kThreads - 1) / kThreads; }

// P [M, n, n] of contiguous fp32 logits on the kernels' device.
void launch_forward(const Kernels& k, const at::Tensor& logits, const at::Tensor& out, int64_t iters) {
  const float* lp = logits.const_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  long long m = logits.numel() / (k.n * k.n);
  int it = static_cast<int>(iters);
  void* args[] = {&lp, &op, &m, &it};
  launch(k, k.forward, "Sinkhorn forward", logits.device(), token_blocks(m), kThreads, args);
}

// The logits' gradient [M, n, n] from that of P; the line sums' scratch comes from libtorch's
// allocator.
void launch_backward(const Kernels& k, const at::Tensor& logits, const at::Tensor& grad, const at::Tensor& gl,
                     int64_t iters) {
  long long m = logits.numel() / (k.n * k.n);
  auto sums = at::empty({2 * iters * k.n, m}, logits.options());
  const float* lp = logits.const_data_ptr<float>();
  const float* gp = grad.const_data_ptr<float>();
  float* glp = gl.mutable_data_ptr<float>();
  float* sp = sums.mutable_data_ptr<float>();
  int it = static_cast<int>(iters);
  void* args[] = {&lp, &gp, &glp, &sp, &m, &it};
  launch(k, k.backward, "Sinkhorn backward", logits.device(), token_blocks(m), kThreads, args);
}

// The stream kernels, one block of kStreamThreads per token; fp32 contiguous tensors on the kernels'
// device, shapes as in streams.cu (m tokens, width d; `per_token`: M sets of weights, else one).
void launch_read(const Kernels& k, const at::Tensor& h, const at::Tensor& pre, const at::Tensor& u, int64_t m,
                 int64_t d, bool per_token) {
  const float* hp = h.const_data_ptr<float>();
  const float* pp = pre.const_data_ptr<float>();
  float* up = u.mutable_data_ptr<float>();
  long long dd = d;
  int pt = per_token ? 1 : 0;
  void* args[] = {&hp, &pp, &up, &dd, &pt};
  launch(k, k.read, "stream read", h.device(), m, kStreamThreads, args);
}

void launch_read_backward(const Kernels& k, const at::Tensor& h, const at::Tensor& pre, const at::Tensor& gu,
                          const at::Tensor& gh, const at::Tensor& gpre, int64_t m, int64_t d, bool per_token,
                          bool accumulate) {
  const float* hp = h.const_data_ptr<float>();
  const float* pp = pre.const_data_ptr<float>();
  const float* gp = gu.const_data_ptr<float>();
  float* ghp = gh.mutable_data_ptr<float>();
  float* gwp = gpre.mutable_data_ptr<float>();
  long long dd = d;
  int pt = per_token ? 1 : 0, acc = accumulate ? 1 : 0;
  void* args[] = {&hp, &pp, &gp, &ghp, &gwp, &dd, &pt, &acc};
  launch(k, k.read_backward, "stream read backward", h.device(), m, kStreamThreads, args);
}

void launch_write(const Kernels& k, const at::Tensor& h, const at::Tensor& res, const at::Tensor& post,
                  const at::Tensor& o, const at::Tensor& out, int64_t m, int64_t d, bool per_token) {
  const float* hp = h.const_data_ptr<float>();
  const float* rp = res.const_data_ptr<float>();
  const float* pp = post.const_data_ptr<float>();
  const float* op = o.const_data_ptr<float>();
  float* outp = out.mutable_data_ptr<float>();
  long long dd = d;
  int pt = per_token ? 1 : 0;
  void* args[] = {&hp, &rp, &pp, &op, &outp, &dd, &pt};
  launch(k, k.write, "stream write", h.device(), m, kStreamThreads, args);
}

void launch_write_backward(const Kernels& k, const at::Tensor& h, const at::Tensor& res, const at::Tensor& post,
                           const at::Tensor& o, const at::Tensor& g, const at::Tensor& gh, const at::Tensor& go,
                           const at::Tensor& gws, int64_t m, int64_t d, bool per_token) {
  const float* hp = h.const_data_ptr<float>();
  const float* rp = res.const_data_ptr<float>();
  const float* pp = post.const_data_ptr<float>();
  const float* op = o.const_data_ptr<float>();
  const float* gp = g.const_data_ptr<float>();
  float* ghp = gh.mutable_data_ptr<float>();
  float* gop = go.mutable_data_ptr<float>();
  float* gwp = gws.mutable_data_ptr<float>();
  long long dd = d;
  int pt = per_token ? 1 : 0;
  void* args[] = {&hp, &rp, &pp, &op, &gp, &ghp, &gop, &gwp, &dd, &pt};
  launch(k, k.write_backward, "stream write backward", h.device(), m, kStreamThreads, args);
}

// The loss kernels: one block of kLossThreads per row; logits [N, V] contiguous bf16 or fp32 on the
// kernels' device, target [N] int64, lse and loss [N] fp32; grad like the logits; scale a one-element
// fp32 tensor on the device (g/N).
int loss_kind(const at::Tensor& logits) {
  if (logits.scalar_type() == at::kBFloat16) return 0;
  if (logits.scalar_type() == at::kFloat) return 1;
  throw std::invalid_argument("the CUDA loss kernels take bf16 or fp32 logits");
}

void launch_ce_forward(const Kernels& k, const at::Tensor& logits, const at::Tensor& target, const at::Tensor& lse,
                       const at::Tensor& loss) {
  const void* xp = logits.const_data_ptr();
  const long long* tp = reinterpret_cast<const long long*>(target.const_data_ptr<int64_t>());
  float* lp = lse.mutable_data_ptr<float>();
  float* op = loss.mutable_data_ptr<float>();
  long long v = logits.size(1);
  void* args[] = {&xp, &tp, &lp, &op, &v};
  launch(k, k.ce_forward[loss_kind(logits)], "cross-entropy forward", logits.device(), logits.size(0), kLossThreads,
         args);
}

void launch_ce_backward(const Kernels& k, const at::Tensor& logits, const at::Tensor& target, const at::Tensor& lse,
                        const at::Tensor& scale, const at::Tensor& grad) {
  const void* xp = logits.const_data_ptr();
  const long long* tp = reinterpret_cast<const long long*>(target.const_data_ptr<int64_t>());
  const float* lp = lse.const_data_ptr<float>();
  const float* sp = scale.const_data_ptr<float>();
  void* gp = grad.mutable_data_ptr();
  long long v = logits.size(1);
  void* args[] = {&xp, &tp, &lp, &sp, &gp, &v};
  launch(k, k.ce_backward[loss_kind(logits)], "cross-entropy backward", logits.device(), logits.size(0), kLossThreads,
         args);
}

// The norm kernels: x [R, D] fp32 contiguous, w (and b, or an undefined tensor) [D] fp32 on the
// kernels' device; y [R, D] bf16, mean and rstd [R] fp32. Backward: gy [R, D] bf16 → gx [R, D] fp32,
// gw and gb [D] (libtorch sums the blocks' partial rows).
void launch_norm_forward(const Kernels& k, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                         const at::Tensor& y, const at::Tensor& mean, const at::Tensor& rstd, double eps, bool layer) {
  const float* xp = x.const_data_ptr<float>();
  const float* wp = w.const_data_ptr<float>();
  const float* bp = b.defined() ? b.const_data_ptr<float>() : nullptr;
  void* yp = y.mutable_data_ptr();
  float* mp = mean.mutable_data_ptr<float>();
  float* rp = rstd.mutable_data_ptr<float>();
  long long d = x.size(1);
  float e = static_cast<float>(eps);
  int l = layer ? 1 : 0;
  void* args[] = {&xp, &wp, &bp, &yp, &mp, &rp, &d, &e, &l};
  launch(k, k.norm_forward, "norm forward", x.device(), x.size(0), kNormThreads, args);
}

// → (gx, gw, gb; gb undefined without a bias).
std::tuple<at::Tensor, at::Tensor, at::Tensor> launch_norm_backward(const Kernels& k, const at::Tensor& x,
                                                                    const at::Tensor& gy, const at::Tensor& w,
                                                                    const at::Tensor& mean, const at::Tensor& rstd,
                                                                    bool layer, bool with_bias) {
  const int64_t rows_total = x.size(0), d = x.size(1);
  const int64_t blocks = (rows_total + kNormRows - 1) / kNormRows;
  auto gx = at::empty_like(x);
  auto part = at::zeros({2 * std::max<int64_t>(blocks, 1), d}, x.options());
  const float* xp = x.const_data_ptr<float>();
  const void* gp = gy.const_data_ptr();
  const float* wp = w.const_data_ptr<float>();
  const float* mp = mean.const_data_ptr<float>();
  const float* rp = rstd.const_data_ptr<float>();
  float* gxp = gx.mutable_data_ptr<float>();
  float* pp = part.mutable_data_ptr<float>();
  long long rr = rows_total, dd = d, per = kNormRows;
  int l = layer ? 1 : 0, wb = with_bias ? 1 : 0;
  void* args[] = {&xp, &gp, &wp, &mp, &rp, &gxp, &pp, &rr, &dd, &per, &l, &wb};
  launch(k, k.norm_backward, "norm backward", x.device(), blocks, kNormThreads, args);
  const int64_t nb = std::max<int64_t>(blocks, 1);
  auto gw = part.narrow(0, 0, nb).sum(0);
  auto gb = with_bias ? part.narrow(0, nb, nb).sum(0) : at::Tensor();
  return {gx, gw, gb};
}

// HC's dynamic logits (K = n + 2 of the kernels): x [R, D], gamma, beta [D], w [D, K] fp32 contiguous on the
// kernels' device; z [R, K], mean and rstd [R] fp32. Backward: gz [R, K] fp32 → (gx [R, D], gγ, gβ [D],
// gW [D, K]; libtorch sums the blocks' partial gradients, and rounds gW when `round`).
void launch_norm_project_forward(const Kernels& k, const at::Tensor& x, const at::Tensor& gamma,
                                 const at::Tensor& beta, const at::Tensor& w, const at::Tensor& z,
                                 const at::Tensor& mean, const at::Tensor& rstd, double eps, bool round) {
  const float* xp = x.const_data_ptr<float>();
  const float* gp = gamma.const_data_ptr<float>();
  const float* bp = beta.const_data_ptr<float>();
  const float* wp = w.const_data_ptr<float>();
  float* zp = z.mutable_data_ptr<float>();
  float* mp = mean.mutable_data_ptr<float>();
  float* rp = rstd.mutable_data_ptr<float>();
  long long d = x.size(1);
  float e = static_cast<float>(eps);
  int rd = round ? 1 : 0;
  void* args[] = {&xp, &gp, &bp, &wp, &zp, &mp, &rp, &d, &e, &rd};
  launch(k, k.norm_project_forward, "norm-project forward", x.device(), x.size(0), kNormThreads, args);
}

// gx [R, D] written, or with `accumulate` added to; returns gγ, gβ, gW.
std::tuple<at::Tensor, at::Tensor, at::Tensor> launch_norm_project_backward(
    const Kernels& k, const at::Tensor& x, const at::Tensor& gamma, const at::Tensor& beta, const at::Tensor& w,
    const at::Tensor& gz, const at::Tensor& mean, const at::Tensor& rstd, bool round, const at::Tensor& gx,
    bool accumulate) {
  const int64_t rows_total = x.size(0), d = x.size(1), kk = w.size(1);
  const int64_t blocks = std::max<int64_t>((rows_total + kNormProjectRows - 1) / kNormProjectRows, 1);
  auto part = at::zeros({blocks, 2 * d + d * kk}, x.options());
  const float* xp = x.const_data_ptr<float>();
  const float* gp = gamma.const_data_ptr<float>();
  const float* bp = beta.const_data_ptr<float>();
  const float* wp = w.const_data_ptr<float>();
  const float* zp = gz.const_data_ptr<float>();
  const float* mp = mean.const_data_ptr<float>();
  const float* rp = rstd.const_data_ptr<float>();
  float* gxp = gx.mutable_data_ptr<float>();
  float* pp = part.mutable_data_ptr<float>();
  long long rr = rows_total, dd = d, per = kNormProjectRows;
  int rd = round ? 1 : 0, acc = accumulate ? 1 : 0;
  void* args[] = {&xp, &gp, &bp, &wp, &zp, &mp, &rp, &gxp, &pp, &rr, &dd, &per, &rd, &acc};
  launch(k, k.norm_project_backward, "norm-project backward", x.device(), blocks, kNormThreads, args);
  const auto sums = part.sum(0);
  auto gw = sums.narrow(0, 2 * d, d * kk).view({d, kk});
  if (round) gw = gw.to(at::kBFloat16).to(at::kFloat);
  return {sums.narrow(0, 0, d), sums.narrow(0, d, d), gw};
}

// SwiGLU: g, u (and gh) contiguous bf16 or fp32 on the kernels' device; h (gg, gu) alike. Blocks
// of kLossThreads threads, a grid-stride loop over the elements.
int64_t elementwise_blocks(int64_t n) {
  return std::max<int64_t>(1, std::min<int64_t>((n + kLossThreads - 1) / kLossThreads, 65536));
}

void launch_swiglu_forward(const Kernels& k, const at::Tensor& g, const at::Tensor& u, const at::Tensor& h) {
  const void* gp = g.const_data_ptr();
  const void* up = u.const_data_ptr();
  void* hp = h.mutable_data_ptr();
  long long n = g.numel();
  void* args[] = {&gp, &up, &hp, &n};
  launch(k, k.swiglu_forward[loss_kind(g)], "SwiGLU forward", g.device(), elementwise_blocks(n), kLossThreads, args);
}

void launch_swiglu_backward(const Kernels& k, const at::Tensor& g, const at::Tensor& u, const at::Tensor& gh,
                            const at::Tensor& gg, const at::Tensor& gu) {
  const void* gp = g.const_data_ptr();
  const void* up = u.const_data_ptr();
  const void* ghp = gh.const_data_ptr();
  void* ggp = gg.mutable_data_ptr();
  void* gup = gu.mutable_data_ptr();
  long long n = g.numel();
  void* args[] = {&gp, &up, &ghp, &ggp, &gup, &n};
  launch(k, k.swiglu_backward[loss_kind(g)], "SwiGLU backward", g.device(), elementwise_blocks(n), kLossThreads,
         args);
}

// H-ACN's update: x, acc [N] fp32, h [N] bf16 or fp32 (contiguous, one size), a one fp32, all on the
// kernels' device; xo, acco [N] fp32. Backward: gx_out [N] fp32, gacc_out [N] fp32 or undefined (zero)
// → gx [N] fp32, gh [N] in h's dtype, and ga's partial sums, one per block (the caller adds them).
void launch_hacn_forward(const Kernels& k, const at::Tensor& x, const at::Tensor& acc, const at::Tensor& h,
                         const at::Tensor& a, const at::Tensor& xo, const at::Tensor& acco) {
  const float* xp = x.const_data_ptr<float>();
  const float* cp = acc.const_data_ptr<float>();
  const void* hp = h.const_data_ptr();
  const float* ap = a.const_data_ptr<float>();
  float* xop = xo.mutable_data_ptr<float>();
  float* cop = acco.mutable_data_ptr<float>();
  long long n = x.numel();
  void* args[] = {&xp, &cp, &hp, &ap, &xop, &cop, &n};
  launch(k, k.hacn_forward[loss_kind(h)], "H-ACN forward", x.device(), elementwise_blocks(n), kLossThreads, args);
}

at::Tensor launch_hacn_backward_parts(const Kernels& k, const at::Tensor& x, const at::Tensor& gx_out,
                                const at::Tensor& gacc_out, const at::Tensor& a, const at::Tensor& gx,
                                const at::Tensor& gh) {
  const int64_t n = x.numel(), blocks = elementwise_blocks(n);
  auto part = at::empty({blocks}, x.options());
  const float* xp = x.const_data_ptr<float>();
  const float* gp = gx_out.const_data_ptr<float>();
  const float* cp = gacc_out.defined() ? gacc_out.const_data_ptr<float>() : nullptr;
  const float* ap = a.const_data_ptr<float>();
  float* gxp = gx.mutable_data_ptr<float>();
  void* ghp = gh.mutable_data_ptr();
  float* pp = part.mutable_data_ptr<float>();
  long long nn = n;
  void* args[] = {&xp, &gp, &cp, &ap, &gxp, &ghp, &pp, &nn};
  launch(k, k.hacn_backward[loss_kind(gh)], "H-ACN backward", x.device(), blocks, kLossThreads, args);
  return part;
}

// AttnRes' depth attention: the sources `s` in buf [cap, N] (fp32, contiguous, on the kernels'
// device), q [D] fp32 contiguous there; y [R, D], alpha [R, m] (R = N / D). Backward: gy [R, D] →
// the sources' gradients added into gbuf [cap, N], and gq's partial sums [blocks, D] (the caller
// adds them).
void launch_attnres_forward(const Kernels& k, const at::Tensor& buf, const plexus_attnres::Sources& s,
                            const at::Tensor& q, const at::Tensor& y, const at::Tensor& alpha) {
  const float* bp = buf.const_data_ptr<float>();
  plexus_attnres::Sources sv = s;
  const float* qp = q.const_data_ptr<float>();
  float* yp = y.mutable_data_ptr<float>();
  float* ap = alpha.mutable_data_ptr<float>();
  long long d = q.numel();
  void* args[] = {&bp, &sv, &qp, &yp, &ap, &d};
  launch(k, k.attnres_forward, "AttnRes forward", buf.device(), y.size(0), kNormThreads, args);
}

at::Tensor launch_attnres_backward_parts(const Kernels& k, const at::Tensor& buf, const at::Tensor& gbuf,
                                         const plexus_attnres::Sources& s, const at::Tensor& q, const at::Tensor& gy) {
  const int64_t rows = gy.size(0), d = q.numel();
  const int64_t blocks = std::max<int64_t>((rows + kAttnResRows - 1) / kAttnResRows, 1);
  auto part = at::zeros({blocks, d}, q.options());
  const float* bp = buf.const_data_ptr<float>();
  float* gbp = gbuf.mutable_data_ptr<float>();
  plexus_attnres::Sources sv = s;
  const float* qp = q.const_data_ptr<float>();
  const float* gp = gy.const_data_ptr<float>();
  float* pp = part.mutable_data_ptr<float>();
  long long rr = rows, dd = d, per = kAttnResRows;
  void* args[] = {&bp, &gbp, &sv, &qp, &gp, &pp, &rr, &dd, &per};
  launch(k, k.attnres_backward, "AttnRes backward", buf.device(), blocks, kNormThreads, args);
  return part;
}

// RoPE: x [B, T, ≥ H·hd] with rows `stride` apart (its last dimension contiguous), tables cs, sn
// [≥ T, hd] contiguous, all of one dtype on the kernels' device; y [B, H, T, hd]; gx [B, T, H·hd].
void launch_rope_forward(const Kernels& k, const at::Tensor& x, const at::Tensor& cs, const at::Tensor& sn,
                         const at::Tensor& y, int64_t heads) {
  const void* xp = x.const_data_ptr();
  const void* cp = cs.const_data_ptr();
  const void* sp = sn.const_data_ptr();
  void* yp = y.mutable_data_ptr();
  long long b = y.size(0), h = heads, t = y.size(2), hd = y.size(3), stride = x.stride(1);
  void* args[] = {&xp, &cp, &sp, &yp, &b, &t, &h, &hd, &stride};
  launch(k, k.rope_forward[loss_kind(x)], "RoPE forward", x.device(), elementwise_blocks(y.numel()), kLossThreads,
         args);
}

void launch_rope_backward(const Kernels& k, const at::Tensor& gy, const at::Tensor& cs, const at::Tensor& sn,
                          const at::Tensor& gx) {
  const void* gp = gy.const_data_ptr();
  const void* cp = cs.const_data_ptr();
  const void* sp = sn.const_data_ptr();
  void* xp = gx.mutable_data_ptr();
  long long b = gy.size(0), h = gy.size(1), t = gy.size(2), hd = gy.size(3);
  void* args[] = {&gp, &cp, &sp, &xp, &b, &t, &h, &hd};
  launch(k, k.rope_backward[loss_kind(gy)], "RoPE backward", gy.device(), elementwise_blocks(gy.numel()),
         kLossThreads, args);
}

// A deterministic fp64 CPU tensor whose values are fp32 numbers (so that only the arithmetic
// differs between the kernels and their reference).
at::Tensor pattern(at::IntArrayRef sizes, double phase) {
  auto t = at::empty(sizes, at::kDouble);
  double* p = t.mutable_data_ptr<double>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    p[i] = std::sin(phase * static_cast<double>(i + 1) + 0.11 * static_cast<double>(i % 7));
  }
  return t.to(at::kFloat).to(at::kDouble);
}

// The largest deviation of a device result from its fp64 reference, relative to the reference's
// largest magnitude (at least 1).
double deviation(const at::Tensor& got, const at::Tensor& ref) {
  if (ref.numel() == 0) return 0.0;
  const double scale = std::max(1.0, ref.abs().max().item<double>());
  return (got.to(at::kCPU).to(at::kDouble) - ref).abs().max().item<double>() / scale;
}

// The stream kernels against their per-token functions in double: 3 tokens of width
// kStreamThreads + 72 (some threads loop twice), per-token and shared weights.
void self_check_streams(const Kernels& k, c10::Device device) {
  const int64_t n = k.n, m = 3, d = kStreamThreads + 72;
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(device);
  for (const bool per_token : {true, false}) {
    const int64_t sets = per_token ? m : 1;
    const auto h = pattern({m, n, d}, 0.3), pre = pattern({sets, n}, 0.7), res = pattern({sets, n, n}, 1.1),
               post = pattern({sets, n}, 1.7), o = pattern({m, d}, 2.3), gu = pattern({m, d}, 2.9),
               g = pattern({m, n, d}, 3.7);
    // With shared weights, the read's backward adds into a gradient already there (a stream's
    // gradient cell, stream_grad.h).
    const bool accumulate = !per_token;
    const auto gh0 = accumulate ? pattern({m, n, d}, 4.3) : at::zeros({m, n, d}, at::kDouble);
    auto u = at::empty({m, d}, at::kDouble), gh_r = gh0.clone(), gpre = at::empty({m, n}, at::kDouble);
    host_stream_read<double>(h.const_data_ptr<double>(), pre.const_data_ptr<double>(), gu.const_data_ptr<double>(),
                             u.mutable_data_ptr<double>(), gh_r.mutable_data_ptr<double>(),
                             gpre.mutable_data_ptr<double>(), m, n, d, per_token, 1, accumulate);
    auto out = at::empty({m, n, d}, at::kDouble), gh_w = at::empty({m, n, d}, at::kDouble),
         go = at::empty({m, d}, at::kDouble), gws = at::empty({m, n * n + n}, at::kDouble);
    host_stream_write<double>(h.const_data_ptr<double>(), res.const_data_ptr<double>(),
                              post.const_data_ptr<double>(), o.const_data_ptr<double>(), g.const_data_ptr<double>(),
                              out.mutable_data_ptr<double>(), gh_w.mutable_data_ptr<double>(),
                              go.mutable_data_ptr<double>(), gws.mutable_data_ptr<double>(), m, n, d, per_token, 1);
    const auto hd = h.to(opts), pred = pre.to(opts), resd = res.to(opts), postd = post.to(opts), od = o.to(opts),
               gud = gu.to(opts), gd = g.to(opts);
    auto u_d = at::empty({m, d}, opts), gh_rd = gh0.to(opts), gpre_d = at::empty({m, n}, opts);
    launch_read(k, hd, pred, u_d, m, d, per_token);
    launch_read_backward(k, hd, pred, gud, gh_rd, gpre_d, m, d, per_token, accumulate);
    auto out_d = at::empty({m, n, d}, opts), gh_wd = at::empty({m, n, d}, opts), go_d = at::empty({m, d}, opts),
         gws_d = at::empty({m, n * n + n}, opts);
    launch_write(k, hd, resd, postd, od, out_d, m, d, per_token);
    launch_write_backward(k, hd, resd, postd, od, gd, gh_wd, go_d, gws_d, m, d, per_token);
    const std::pair<const char*, double> checks[] = {
        {"read", deviation(u_d, u)},          {"read backward (streams)", deviation(gh_rd, gh_r)},
        {"read backward (weights)", deviation(gpre_d, gpre)}, {"write", deviation(out_d, out)},
        {"write backward (streams)", deviation(gh_wd, gh_w)}, {"write backward (unit output)", deviation(go_d, go)},
        {"write backward (weights)", deviation(gws_d, gws)}};
    for (const auto& [what, dev] : checks) {
      if (!(dev <= 1e-4)) {
        throw std::runtime_error(std::string("the CUDA stream kernels (n = ") + std::to_string(n) + ", " + k.target +
                                 (per_token ? ", per-token" : ", shared") + " weights) disagree with their CPU " +
                                 "reference: " + what + " off by " + std::to_string(dev) + " (relative; tolerance 1e-4)");
      }
    }
  }
}

// The loss kernels against their per-row functions on the CPU (float arithmetic, threads merged in
// order; the GPU merges them as a tree): 3 rows of 2·kLossThreads + 37 logits (some threads loop
// three times), bf16 and fp32, a target in each row, one out of range (its loss must be NaN).
void self_check_loss(const Kernels& k, c10::Device device) {
  const int64_t n = 3, v = 2 * kLossThreads + 37;
  const auto x64 = pattern({n, v}, 0.9) * 4.0;
  const auto target = at::tensor(std::vector<int64_t>{5, v - 1, v}, at::kLong);
  for (const auto dtype : {at::kBFloat16, at::kFloat}) {
    const auto x = x64.to(dtype).contiguous();
    auto lse = at::empty({n}, at::kFloat), loss = at::empty({n}, at::kFloat), grad = at::empty_like(x);
    const float scale = 0.5f;
    if (dtype == at::kFloat) {
      host_cross_entropy<float>(x.const_data_ptr<float>(), reinterpret_cast<const long long*>(target.const_data_ptr<int64_t>()), scale,
                                lse.mutable_data_ptr<float>(), loss.mutable_data_ptr<float>(),
                                grad.mutable_data_ptr<float>(), n, v, kLossThreads);
    } else {
      host_cross_entropy<unsigned short>(reinterpret_cast<const unsigned short*>(x.const_data_ptr()),
                                         reinterpret_cast<const long long*>(target.const_data_ptr<int64_t>()), scale, lse.mutable_data_ptr<float>(),
                                         loss.mutable_data_ptr<float>(),
                                         reinterpret_cast<unsigned short*>(grad.mutable_data_ptr()), n, v,
                                         kLossThreads);
    }
    const auto opts = at::TensorOptions().device(device);
    const auto xd = x.to(device), td = target.to(device);
    auto lse_d = at::empty({n}, opts.dtype(at::kFloat)), loss_d = at::empty({n}, opts.dtype(at::kFloat)),
         grad_d = at::empty_like(xd), scale_d = at::full({1}, scale, opts.dtype(at::kFloat));
    launch_ce_forward(k, xd, td, lse_d, loss_d);
    launch_ce_backward(k, xd, td, lse_d, scale_d, grad_d);
    const auto loss_h = loss_d.to(at::kCPU);
    const bool nan_kept = std::isnan(loss_h[2].item<float>());
    const double dl = deviation(lse_d, lse.to(at::kDouble)),
                 dv = deviation(loss_h.narrow(0, 0, 2), loss.narrow(0, 0, 2).to(at::kDouble)),
                 dg = deviation(grad_d.to(at::kFloat), grad.to(at::kFloat).to(at::kDouble));
    // bf16 gradients may round the other way where the two merge orders differ in the last fp32 bit.
    const double tol_g = dtype == at::kFloat ? 1e-4 : 1e-2;
    if (!(dl <= 1e-4 && dv <= 1e-4 && dg <= tol_g && nan_kept)) {
      throw std::runtime_error(std::string("the CUDA loss kernels (") + (dtype == at::kFloat ? "fp32" : "bf16") + ", " +
                               k.target + ") disagree with their CPU reference: log-sum-exp off by " +
                               std::to_string(dl) + ", loss by " + std::to_string(dv) + ", gradient by " +
                               std::to_string(dg) + (nan_kept ? "" : ", an out-of-range target's loss is not NaN"));
    }
  }
}

// The norm kernels against their per-row functions on the CPU (float arithmetic, threads merged in
// order): 70 rows (three backward blocks, the last partial) of 2·kNormThreads + 19 features, LayerNorm
// with a bias and RMSNorm.
void self_check_norm(const Kernels& k, c10::Device device) {
  const int64_t rows = 2 * kNormRows + 6, d = 2 * kNormThreads + 19;
  const auto x = pattern({rows, d}, 0.43).to(at::kFloat) * 3.0 + 0.5;
  const auto w = pattern({d}, 1.3).to(at::kFloat) + 1.0, b = pattern({d}, 2.1).to(at::kFloat);
  const auto gy = pattern({rows, d}, 0.77).to(at::kBFloat16);
  for (const bool layer : {true, false}) {
    const at::Tensor bias = layer ? b : at::Tensor();
    auto y = at::empty({rows, d}, at::kBFloat16), mean = at::empty({rows}, at::kFloat),
         rstd = at::empty({rows}, at::kFloat), gx = at::empty({rows, d}, at::kFloat), gw = at::empty({d}, at::kFloat),
         gb = at::empty({d}, at::kFloat);
    host_norm(x.const_data_ptr<float>(), w.const_data_ptr<float>(), layer ? b.const_data_ptr<float>() : nullptr,
              reinterpret_cast<const unsigned short*>(gy.const_data_ptr()),
              reinterpret_cast<unsigned short*>(y.mutable_data_ptr()), mean.mutable_data_ptr<float>(),
              rstd.mutable_data_ptr<float>(), gx.mutable_data_ptr<float>(), gw.mutable_data_ptr<float>(),
              layer ? gb.mutable_data_ptr<float>() : nullptr, rows, d, 1e-5f, layer, kNormThreads);
    const auto xd = x.to(device), wd = w.to(device), bd = layer ? b.to(device) : at::Tensor(), gyd = gy.to(device);
    auto y_d = at::empty({rows, d}, xd.options().dtype(at::kBFloat16)), mean_d = at::empty({rows}, xd.options()),
         rstd_d = at::empty({rows}, xd.options());
    launch_norm_forward(k, xd, wd, bd, y_d, mean_d, rstd_d, 1e-5, layer);
    const auto [gx_d, gw_d, gb_d] = launch_norm_backward(k, xd, gyd, wd, mean_d, rstd_d, layer, layer);
    const double dy = deviation(y_d.to(at::kFloat), y.to(at::kDouble)), dx = deviation(gx_d, gx.to(at::kDouble)),
                 dw = deviation(gw_d, gw.to(at::kDouble)), db = layer ? deviation(gb_d, gb.to(at::kDouble)) : 0.0;
    // bf16 outputs may round the other way where the two summation orders differ in the last bit.
    if (!(dy <= 1e-2 && dx <= 1e-4 && dw <= 1e-4 && db <= 1e-4)) {
      throw std::runtime_error(std::string("the CUDA norm kernels (") + (layer ? "LayerNorm" : "RMSNorm") + ", " +
                               k.target + ") disagree with their CPU reference: output off by " + std::to_string(dy) +
                               ", input gradient by " + std::to_string(dx) + ", weight gradient by " +
                               std::to_string(dw) + ", bias gradient by " + std::to_string(db));
    }
  }
}

// The H-ACN kernels against their per-element functions on the CPU, h in bf16 and fp32, over more
// elements than one grid-stride pass of a block; the backward with and without gacc.
void self_check_hacn(const Kernels& k, c10::Device device) {
  const int64_t n = 3 * kLossThreads + 53;
  const auto x = pattern({n}, 0.31).to(at::kFloat), acc = pattern({n}, 1.7).to(at::kFloat);
  const auto gxo = pattern({n}, 2.3).to(at::kFloat), gacc = pattern({n}, 0.9).to(at::kFloat);
  const auto a = at::full({}, 0.75, at::kFloat);
  for (const auto dtype : {at::kBFloat16, at::kFloat}) {
    const auto h = pattern({n}, 1.1).to(dtype);
    for (const bool with_acc : {true, false}) {
      const at::Tensor gc = with_acc ? gacc : at::Tensor();
      auto xo = at::empty_like(x), acco = at::empty_like(x), gx = at::empty_like(x), gh = at::empty_like(h);
      run_hacn_forward_on_host(x, acc, h, a, xo, acco);
      const double ga = run_hacn_backward_on_host(x, gxo, gc, a, gx, gh);
      const auto xd = x.to(device), ad = a.to(device), hd = h.to(device);
      auto xo_d = at::empty_like(xd), acco_d = at::empty_like(xd), gx_d = at::empty_like(xd), gh_d = at::empty_like(hd);
      launch_hacn_forward(k, xd, acc.to(device), hd, ad, xo_d, acco_d);
      const auto ga_d =
          launch_hacn_backward_parts(k, xd, gxo.to(device), with_acc ? gacc.to(device) : at::Tensor(), ad, gx_d, gh_d).sum();
      const double worst = std::max({deviation(xo_d, xo.to(at::kDouble)), deviation(acco_d, acco.to(at::kDouble)),
                                     deviation(gx_d, gx.to(at::kDouble)), deviation(gh_d.to(at::kFloat), gh.to(at::kDouble)),
                                     deviation(ga_d.reshape({1}), at::full({1}, ga, at::kDouble))});
      if (!(worst <= 1e-4)) {
        throw std::runtime_error(std::string("the CUDA H-ACN kernels (h ") + (dtype == at::kFloat ? "fp32" : "bf16") + ", " +
                                 k.target + ") disagree with their CPU reference by " + std::to_string(worst));
      }
    }
  }
}

// The sources of buffer rows `slots` (row length n) for the AttnRes kernels.
plexus_attnres::Sources attnres_sources(const std::vector<int64_t>& slots, int64_t n) {
  if (slots.empty() || slots.size() > PLEXUS_ATTNRES_MAX_SOURCES) {
    throw std::invalid_argument("AttnRes' kernels take 1 to " + std::to_string(PLEXUS_ATTNRES_MAX_SOURCES) +
                                " sources (" + std::to_string(slots.size()) + " given)");
  }
  plexus_attnres::Sources s{};
  s.m = static_cast<int>(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) s.at[i] = slots[i] * n;
  return s;
}

// The AttnRes kernels against their per-thread functions on the CPU: sources at uneven slots, more
// rows than one backward block, a width some threads loop over twice, a gradient buffer that
// already holds gradients (the kernels add to it).
void self_check_attnres(const Kernels& k, c10::Device device) {
  const int64_t rows = 2 * kAttnResRows + 5, d = kNormThreads + 37, n = rows * d;
  const std::vector<int64_t> slots{0, 2, 3, 5, 6};
  const auto s = attnres_sources(slots, n);
  const auto buf = pattern({7, n}, 0.37).to(at::kFloat), q = (pattern({d}, 1.3) * 0.2).to(at::kFloat);
  const auto gy = pattern({rows, d}, 2.1).to(at::kFloat), gbuf0 = pattern({7, n}, 0.9).to(at::kFloat);
  auto y = at::empty({rows, d}, buf.options()), alpha = at::empty({rows, s.m}, buf.options());
  auto gbuf = gbuf0.clone(), gq = at::empty({d}, buf.options());
  host_attnres(cptr<float>(buf), s, cptr<float>(q), nullptr, mptr<float>(y), mptr<float>(alpha), nullptr, nullptr,
               rows, d, kNormThreads);
  host_attnres(cptr<float>(buf), s, cptr<float>(q), cptr<float>(gy), nullptr, nullptr, mptr<float>(gbuf),
               mptr<float>(gq), rows, d, kNormThreads);
  const auto buf_d = buf.to(device), q_d = q.to(device), gbuf_d = gbuf0.to(device);
  auto y_d = at::empty({rows, d}, buf_d.options()), alpha_d = at::empty({rows, s.m}, buf_d.options());
  launch_attnres_forward(k, buf_d, s, q_d, y_d, alpha_d);
  const auto gq_d = launch_attnres_backward_parts(k, buf_d, gbuf_d, s, q_d, gy.to(device)).sum(0);
  const double worst = std::max({deviation(y_d, y.to(at::kDouble)), deviation(alpha_d, alpha.to(at::kDouble)),
                                 deviation(gbuf_d, gbuf.to(at::kDouble)), deviation(gq_d, gq.to(at::kDouble))});
  if (!(worst <= 1e-4)) {
    throw std::runtime_error("the CUDA AttnRes kernels (" + k.target + ") disagree with their CPU reference by " +
                             std::to_string(worst));
  }
}

// HC's dynamic-logit kernels (K = n + 2) against their per-thread functions on the CPU, fp32 and
// bf16 roundings: more rows than one backward block, a width some threads loop over twice.
void self_check_norm_project(const Kernels& k, c10::Device device) {
  const int64_t n = k.n, kk = n + 2, rows = 2 * kNormProjectRows + 5, d = kNormThreads + 37;
  const auto x = pattern({rows, d}, 0.37).to(at::kFloat) * 2.0 + 0.3;
  const auto gamma = pattern({d}, 1.1).to(at::kFloat) + 1.0, beta = pattern({d}, 2.3).to(at::kFloat);
  const auto w = pattern({d, kk}, 0.9).to(at::kFloat), gz = pattern({rows, kk}, 1.7).to(at::kFloat);
  for (const bool round : {false, true}) {
    // The bf16 case adds gx into a gradient already there (a stream's gradient cell, stream_grad.h).
    const bool accumulate = round;
    const auto gx0 = accumulate ? pattern({rows, d}, 3.1).to(at::kFloat) : at::zeros({rows, d}, at::kFloat);
    auto z = at::empty({rows, kk}, at::kFloat), mean = at::empty({rows}, at::kFloat), rstd = at::empty({rows}, at::kFloat),
         gx = gx0.clone(), gg = at::empty({d}, at::kFloat), gb = at::empty({d}, at::kFloat),
         gw = at::empty({d, kk}, at::kFloat);
    host_norm_project(x.const_data_ptr<float>(), gamma.const_data_ptr<float>(), beta.const_data_ptr<float>(),
                      w.const_data_ptr<float>(), gz.const_data_ptr<float>(), z.mutable_data_ptr<float>(),
                      mean.mutable_data_ptr<float>(), rstd.mutable_data_ptr<float>(), gx.mutable_data_ptr<float>(),
                      gg.mutable_data_ptr<float>(), gb.mutable_data_ptr<float>(), gw.mutable_data_ptr<float>(), rows, d,
                      n, 1e-5f, round, kNormThreads, accumulate);
    const auto xd = x.to(device), gd = gamma.to(device), bd = beta.to(device), wd = w.to(device), gzd = gz.to(device);
    auto z_d = at::empty({rows, kk}, xd.options()), mean_d = at::empty({rows}, xd.options()),
         rstd_d = at::empty({rows}, xd.options());
    launch_norm_project_forward(k, xd, gd, bd, wd, z_d, mean_d, rstd_d, 1e-5, round);
    const auto gx_d = gx0.to(device);
    const auto [gg_d, gb_d, gw_d] =
        launch_norm_project_backward(k, xd, gd, bd, wd, gzd, mean_d, rstd_d, round, gx_d, accumulate);
    // bf16-rounded values may round the other way where the two summation orders differ in the last bit.
    const double tol = round ? 1e-2 : 1e-4;
    const double dz = deviation(z_d, z.to(at::kDouble)), dx = deviation(gx_d, gx.to(at::kDouble)),
                 dg = deviation(gg_d, gg.to(at::kDouble)), db = deviation(gb_d, gb.to(at::kDouble)),
                 dw = deviation(gw_d, gw.to(at::kDouble));
    if (!(dz <= tol && dx <= tol && dg <= tol && db <= tol && dw <= tol)) {
      throw std::runtime_error("the CUDA norm-project kernels (n = " + std::to_string(n) + ", " +
                               (round ? "bf16" : "fp32") + ", " + k.target +
                               ") disagree with their CPU reference: z off by " + std::to_string(dz) + ", gx by " +
                               std::to_string(dx) + ", gγ by " + std::to_string(dg) + ", gβ by " + std::to_string(db) +
                               ", gW by " + std::to_string(dw));
    }
  }
}

// The SwiGLU kernels against their per-element functions on the CPU, bf16 and fp32, over more
// elements than one block (a grid-stride loop): the same arithmetic, expf apart.
void self_check_swiglu(const Kernels& k, c10::Device device) {
  const int64_t n = 3 * kLossThreads + 41;
  for (const auto dtype : {at::kBFloat16, at::kFloat}) {
    const auto g = (pattern({n}, 0.61) * 4.0).to(dtype), u = pattern({n}, 1.9).to(dtype), gh = pattern({n}, 2.7).to(dtype);
    auto h = at::empty_like(g), gg = at::empty_like(g), gu = at::empty_like(g);
    if (dtype == at::kFloat) {
      host_swiglu<float>(g.const_data_ptr<float>(), u.const_data_ptr<float>(), gh.const_data_ptr<float>(),
                         h.mutable_data_ptr<float>(), gg.mutable_data_ptr<float>(), gu.mutable_data_ptr<float>(), n);
    } else {
      const auto bits = [](const at::Tensor& t) { return reinterpret_cast<const unsigned short*>(t.const_data_ptr()); };
      const auto out = [](at::Tensor& t) { return reinterpret_cast<unsigned short*>(t.mutable_data_ptr()); };
      host_swiglu<unsigned short>(bits(g), bits(u), bits(gh), out(h), out(gg), out(gu), n);
    }
    const auto gd = g.to(device), ud = u.to(device), ghd = gh.to(device);
    auto h_d = at::empty_like(gd), gg_d = at::empty_like(gd), gu_d = at::empty_like(gd);
    launch_swiglu_forward(k, gd, ud, h_d);
    launch_swiglu_backward(k, gd, ud, ghd, gg_d, gu_d);
    const auto dev = [](const at::Tensor& a, const at::Tensor& b) {
      return deviation(a.to(at::kFloat), b.to(at::kFloat).to(at::kDouble));
    };
    const double tol = dtype == at::kFloat ? 1e-5 : 1e-2;
    const double dh = dev(h_d, h), dg = dev(gg_d, gg), du = dev(gu_d, gu);
    if (!(dh <= tol && dg <= tol && du <= tol)) {
      throw std::runtime_error(std::string("the CUDA SwiGLU kernels (") + (dtype == at::kFloat ? "fp32" : "bf16") +
                               ", " + k.target + ") disagree with their CPU reference: output off by " +
                               std::to_string(dh) + ", gate gradient by " + std::to_string(dg) +
                               ", up gradient by " + std::to_string(du));
    }
  }
}

// The RoPE kernels against their per-element functions on the CPU: q read from a packed [B, T, 3D]
// projection (rows 3D apart), bf16 and fp32.
void self_check_rope(const Kernels& k, c10::Device device) {
  const int64_t b = 2, t = 5, h = 3, hd = 8, d = h * hd;
  for (const auto dtype : {at::kBFloat16, at::kFloat}) {
    const auto qkv = pattern({b, t, 3 * d}, 0.37).to(dtype), cs = pattern({t + 2, hd}, 0.9).to(dtype),
               sn = pattern({t + 2, hd}, 1.7).to(dtype), gy = pattern({b, h, t, hd}, 2.3).to(dtype);
    auto y = at::empty({b, h, t, hd}, dtype), gx = at::empty({b, t, d}, dtype);
    if (dtype == at::kFloat) {
      host_rope<float>(qkv.const_data_ptr<float>(), cs.const_data_ptr<float>(), sn.const_data_ptr<float>(),
                       gy.const_data_ptr<float>(), y.mutable_data_ptr<float>(), gx.mutable_data_ptr<float>(), b, t, h,
                       hd, 3 * d);
    } else {
      const auto bits = [](const at::Tensor& x) { return reinterpret_cast<const unsigned short*>(x.const_data_ptr()); };
      const auto w = [](at::Tensor& x) { return reinterpret_cast<unsigned short*>(x.mutable_data_ptr()); };
      host_rope<unsigned short>(bits(qkv), bits(cs), bits(sn), bits(gy), w(y), w(gx), b, t, h, hd, 3 * d);
    }
    const auto qkv_d = qkv.to(device), cs_d = cs.to(device), sn_d = sn.to(device), gy_d = gy.to(device);
    auto y_d = at::empty({b, h, t, hd}, qkv_d.options()), gx_d = at::empty({b, t, d}, qkv_d.options());
    launch_rope_forward(k, qkv_d.narrow(2, 0, d), cs_d, sn_d, y_d, h);
    launch_rope_backward(k, gy_d, cs_d, sn_d, gx_d);
    const double tol = dtype == at::kFloat ? 1e-5 : 1e-2;
    const double dy = deviation(y_d.to(at::kFloat), y.to(at::kDouble)), dx = deviation(gx_d.to(at::kFloat), gx.to(at::kDouble));
    if (!(dy <= tol && dx <= tol)) {
      throw std::runtime_error(std::string("the CUDA RoPE kernels (") + (dtype == at::kFloat ? "fp32" : "bf16") + ", " +
                               k.target + ") disagree with their CPU reference: output off by " + std::to_string(dy) +
                               ", input gradient by " + std::to_string(dx));
    }
  }
}

// Compares freshly loaded kernels with the per-token functions run on the CPU in double, on logits
// and gradients that depend on nothing random (the check must not move any generator), one more
// token than a block so that the bounds check is crossed.
void self_check(const Kernels& k, c10::Device device) {
  const int64_t n = k.n, m = kThreads + 1, iters = 20;
  auto logits = at::empty({m, n, n}, at::kDouble);
  auto grad = at::empty({m, n, n}, at::kDouble);
  double* lp = logits.mutable_data_ptr<double>();
  double* gp = grad.mutable_data_ptr<double>();
  for (int64_t i = 0; i < logits.numel(); ++i) {
    lp[i] = 3.0 * std::sin(0.37 * static_cast<double>(i) + 0.11 * static_cast<double>(i % 7));
    gp[i] = std::cos(1.3 * static_cast<double>(i));
  }
  // The reference from the fp32-rounded logits, so that only the arithmetic differs.
  logits = logits.to(at::kFloat).to(at::kDouble);
  auto p_ref = at::empty_like(logits), gl_ref = at::empty_like(logits);
  host_sinkhorn<double>(logits.const_data_ptr<double>(), grad.const_data_ptr<double>(),
                        p_ref.mutable_data_ptr<double>(), gl_ref.mutable_data_ptr<double>(), m, n,
                        static_cast<int>(iters));
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(device);
  const auto l_dev = logits.to(opts), g_dev = grad.to(opts);
  auto p_dev = at::empty_like(l_dev), gl_dev = at::empty_like(l_dev);
  launch_forward(k, l_dev, p_dev, iters);
  launch_backward(k, l_dev, g_dev, gl_dev, iters);
  const double dp = (p_dev.to(at::kCPU).to(at::kDouble) - p_ref).abs().max().item<double>();
  const double scale = std::max(1.0, gl_ref.abs().max().item<double>());
  const double dg = (gl_dev.to(at::kCPU).to(at::kDouble) - gl_ref).abs().max().item<double>() / scale;
  constexpr double tol = 1e-4;
  if (!(dp <= tol && dg <= tol)) {
    throw std::runtime_error("the CUDA Sinkhorn kernels (n = " + std::to_string(n) + ", " + k.target +
                             ") disagree with their CPU reference: largest deviation " + std::to_string(dp) +
                             " forward, " + std::to_string(dg) + " (relative) backward; tolerance " +
                             std::to_string(tol));
  }
}

// Compiles, loads and checks the kernels for a device and n, once; a failure is kept and thrown
// again on every later call; every error thrown here starts with kUnavailable.
const Kernels& kernels_for(c10::Device device, int64_t n) {
  static std::mutex mutex;
  static std::map<std::pair<int, int64_t>, std::pair<std::unique_ptr<Kernels>, std::string>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(static_cast<int>(device.index()), n);
  auto it = cache.find(key);
  if (it == cache.end()) {
    // The first-use check synchronises (copies to the CPU), which a CUDA graph being recorded
    // does not allow: refuse without keeping the refusal (the step's eager warm-up normally
    // makes the first use).
    {
      const Driver& d = driver_or_unavailable();
      const c10::Stream stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device);
      int capture_status = 0;
      if (d.StreamIsCapturing(static_cast<CUstream>(stream.native_handle()), &capture_status) == 0 &&
          capture_status != 0) {
        throw plexus_native::KindedError(plexus_native::ErrorKind::UnavailableInCapture,
                                         std::string(kUnavailable) +
                                             "their first use on this device is inside a CUDA graph capture");
      }
    }
    std::unique_ptr<Kernels> k;
    std::string error;
    try {
      const Driver& d = driver();
      CUdevice dev = 0;
      d.check(d.DeviceGet(&dev, device.index()), "cuDeviceGet");
      int major = 0, minor = 0;
      d.check(d.DeviceGetAttribute(&major, kAttrCcMajor, dev), "cuDeviceGetAttribute");
      d.check(d.DeviceGetAttribute(&minor, kAttrCcMinor, dev), "cuDeviceGetAttribute");
      const Image image = compile(n, major * 10 + minor);
      k = std::make_unique<Kernels>();
      k->n = n;
      k->target = image.target;
      d.check(d.DevicePrimaryCtxRetain(&k->context, dev), "cuDevicePrimaryCtxRetain");
      CUcontext current = nullptr;
      d.check(d.CtxGetCurrent(&current), "cuCtxGetCurrent");
      if (current != k->context) d.check(d.CtxSetCurrent(k->context), "cuCtxSetCurrent");
      CUmodule module = nullptr;
      d.check(d.ModuleLoadData(&module, image.bytes.data()), "cuModuleLoadData");
      d.check(d.ModuleGetFunction(&k->forward, module, "plexus_sinkhorn_forward"), "cuModuleGetFunction");
      d.check(d.ModuleGetFunction(&k->backward, module, "plexus_sinkhorn_backward"), "cuModuleGetFunction");
      d.check(d.ModuleGetFunction(&k->read, module, "plexus_stream_read"), "cuModuleGetFunction");
      d.check(d.ModuleGetFunction(&k->read_backward, module, "plexus_stream_read_backward"), "cuModuleGetFunction");
      d.check(d.ModuleGetFunction(&k->write, module, "plexus_stream_write"), "cuModuleGetFunction");
      d.check(d.ModuleGetFunction(&k->write_backward, module, "plexus_stream_write_backward"), "cuModuleGetFunction");
      const char* suffix[2] = {"bf16", "f32"};
      for (int i = 0; i < 2; ++i) {
        const std::string fwd = std::string("plexus_cross_entropy_forward_") + suffix[i];
        const std::string bwd = std::string("plexus_cross_entropy_backward_") + suffix[i];
        d.check(d.ModuleGetFunction(&k->ce_forward[i], module, fwd.c_str()), "cuModuleGetFunction");
        d.check(d.ModuleGetFunction(&k->ce_backward[i], module, bwd.c_str()), "cuModuleGetFunction");
      }
      d.check(d.ModuleGetFunction(&k->norm_forward, module, "plexus_norm_forward_bf16"), "cuModuleGetFunction");
      for (int i = 0; i < 2; ++i) {
        const std::string fwd = std::string("plexus_swiglu_forward_") + suffix[i];
        const std::string bwd = std::string("plexus_swiglu_backward_") + suffix[i];
        d.check(d.ModuleGetFunction(&k->swiglu_forward[i], module, fwd.c_str()), "cuModuleGetFunction");
        d.check(d.ModuleGetFunction(&k->swiglu_backward[i], module, bwd.c_str()), "cuModuleGetFunction");
        const std::string rf = std::string("plexus_rope_forward_") + suffix[i];
        const std::string rb = std::string("plexus_rope_backward_") + suffix[i];
        d.check(d.ModuleGetFunction(&k->rope_forward[i], module, rf.c_str()), "cuModuleGetFunction");
        d.check(d.ModuleGetFunction(&k->rope_backward[i], module, rb.c_str()), "cuModuleGetFunction");
        const std::string hf = std::string("plexus_hacn_forward_") + suffix[i];
        const std::string hb = std::string("plexus_hacn_backward_") + suffix[i];
        d.check(d.ModuleGetFunction(&k->hacn_forward[i], module, hf.c_str()), "cuModuleGetFunction");
        d.check(d.ModuleGetFunction(&k->hacn_backward[i], module, hb.c_str()), "cuModuleGetFunction");
      }
      d.check(d.ModuleGetFunction(&k->norm_backward, module, "plexus_norm_backward_bf16"), "cuModuleGetFunction");
      d.check(d.ModuleGetFunction(&k->norm_project_forward, module, "plexus_norm_project_forward"), "cuModuleGetFunction");
      d.check(d.ModuleGetFunction(&k->norm_project_backward, module, "plexus_norm_project_backward"), "cuModuleGetFunction");
      d.check(d.ModuleGetFunction(&k->attnres_forward, module, "plexus_attnres_forward"), "cuModuleGetFunction");
      d.check(d.ModuleGetFunction(&k->attnres_backward, module, "plexus_attnres_backward"), "cuModuleGetFunction");
      self_check(*k, device);
      self_check_streams(*k, device);
      self_check_norm_project(*k, device);
      if (n == 1) {
        self_check_loss(*k, device);
        self_check_norm(*k, device);
        self_check_swiglu(*k, device);
        self_check_rope(*k, device);
        self_check_hacn(*k, device);
        self_check_attnres(*k, device);
      }
    } catch (const c10::Error& e) {
      k.reset();
      error = e.what_without_backtrace();
    } catch (const std::exception& e) {
      k.reset();
      error = e.what();
    }
    it = cache.emplace(key, std::make_pair(std::move(k), error)).first;
  }
  if (!it->second.first) {
    throw plexus_native::KindedError(plexus_native::ErrorKind::KernelsUnavailable, kUnavailable + it->second.second);
  }
  return *it->second.first;
}

}  // namespace

namespace plexus_cuda {

bool takes_streams(int64_t n) { return n >= 1 && n <= kMaxStreams; }

void stream_read(const at::Tensor& h, const at::Tensor& pre, const at::Tensor& u, int64_t m, int64_t n, int64_t d,
                 bool per_token) {
  const c10::DeviceGuard device_guard(h.device());
  launch_read(kernels_for(h.device(), n), h, pre, u, m, d, per_token);
}

void stream_read_backward(const at::Tensor& h, const at::Tensor& pre, const at::Tensor& gu, const at::Tensor& gh,
                          const at::Tensor& gpre, int64_t m, int64_t n, int64_t d, bool per_token, bool accumulate) {
  const c10::DeviceGuard device_guard(h.device());
  launch_read_backward(kernels_for(h.device(), n), h, pre, gu, gh, gpre, m, d, per_token, accumulate);
}

void stream_write(const at::Tensor& h, const at::Tensor& res, const at::Tensor& post, const at::Tensor& o,
                  const at::Tensor& out, int64_t m, int64_t n, int64_t d, bool per_token) {
  const c10::DeviceGuard device_guard(h.device());
  launch_write(kernels_for(h.device(), n), h, res, post, o, out, m, d, per_token);
}

void stream_write_backward(const at::Tensor& h, const at::Tensor& res, const at::Tensor& post, const at::Tensor& o,
                           const at::Tensor& g, const at::Tensor& gh, const at::Tensor& go, const at::Tensor& gws,
                           int64_t m, int64_t n, int64_t d, bool per_token) {
  const c10::DeviceGuard device_guard(h.device());
  launch_write_backward(kernels_for(h.device(), n), h, res, post, o, g, gh, go, gws, m, d, per_token);
}

}  // namespace plexus_cuda

namespace {

// The checks of a CUDA call; returns n.
int64_t check_cuda_logits(const at::Tensor& logits, int64_t iters) {
  if (logits.dim() < 2 || logits.size(-1) != logits.size(-2)) {
    throw std::invalid_argument("sinkhorn takes logits [.., n, n]");
  }
  if (!logits.is_cuda() || logits.scalar_type() != at::kFloat) {
    throw std::invalid_argument("the CUDA Sinkhorn takes float32 logits on a CUDA device");
  }
  if (iters < 1 || iters > 100000) throw std::invalid_argument("the CUDA Sinkhorn takes 1 ≤ iters ≤ 100000");
  const int64_t n = logits.size(-1);
  with_n(n, [](auto) {});
  return n;
}

struct SinkhornCuda : public torch::autograd::Function<SinkhornCuda> {
  // logits [.., n, n] fp32 on a CUDA device → P [.., n, n].
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits_in, int64_t iters) {
    const int64_t n = check_cuda_logits(logits_in, iters);
    const c10::DeviceGuard device_guard(logits_in.device());
    const auto logits = logits_in.contiguous();
    const Kernels& k = kernels_for(logits.device(), n);
    auto out = at::empty_like(logits);
    launch_forward(k, logits, out, iters);
    ctx->save_for_backward({logits});
    ctx->saved_data["iters"] = iters;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto logits = ctx->get_saved_variables()[0];
    const int64_t iters = ctx->saved_data["iters"].toInt();
    const c10::DeviceGuard device_guard(logits.device());
    const Kernels& k = kernels_for(logits.device(), logits.size(-1));
    const auto g = grads[0].to(at::kFloat).contiguous();
    auto gl = at::empty_like(logits);
    launch_backward(k, logits, g, gl, iters);
    return {gl, at::Tensor()};
  }
};

// LayerNorm (`layer`, with a bias or not) or RMSNorm of x [.., D] fp32 on a CUDA device with weight
// w [D] fp32 → [.., D] bf16, the norm kernels of norms.cu each way. Saved: x, w, mean and rstd [R].
struct NormCuda : public torch::autograd::Function<NormCuda> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& w, const at::Tensor& b,
                            double eps, bool layer) {
    const c10::DeviceGuard device_guard(x_in.device());
    const int64_t d = x_in.size(-1);
    const auto x = x_in.reshape({-1, d}).contiguous();
    RECORD_FUNCTION("plexus::norm_bf16", std::vector<c10::IValue>({x_in}));
    auto y = at::empty(x.sizes(), x.options().dtype(at::kBFloat16));
    auto mean = at::empty({x.size(0)}, x.options()), rstd = at::empty({x.size(0)}, x.options());
    // An empty b: no bias (see plexus_norm_cuda).
    const auto bc = b.numel() > 0 ? b.contiguous() : at::Tensor();
    if (x.is_cpu()) {
      run_norm_forward_on_host(x, w.contiguous(), bc, y, mean, rstd, eps, layer);
    } else {
      launch_norm_forward(kernels_for(x.device(), 1), x, w.contiguous(), bc, y, mean, rstd, eps, layer);
    }
    PLEXUS_RECORD_OUTPUTS(y, mean, rstd);
    ctx->save_for_backward({x, w, mean, rstd, bc});
    ctx->saved_data["layer"] = layer;
    ctx->saved_data["bias"] = bc.defined();
    ctx->saved_data["eps"] = eps;
    return y.view(x_in.sizes());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const c10::DeviceGuard device_guard(x.device());
    const bool layer = ctx->saved_data["layer"].toBool(), with_bias = ctx->saved_data["bias"].toBool();
    const auto gy = grads[0].to(at::kBFloat16).reshape({-1, x.size(1)}).contiguous();
    RECORD_FUNCTION("plexus::norm_bf16_backward", std::vector<c10::IValue>({gy}));
    auto [gx, gw, gb] =
        x.is_cpu() ? run_norm_backward_on_host(x, gy, saved[1].contiguous(), saved[4], ctx->saved_data["eps"].toDouble(),
                                               layer)
                   : launch_norm_backward(kernels_for(x.device(), 1), x, gy, saved[1].contiguous(), saved[2], saved[3],
                                          layer, with_bias);
    PLEXUS_RECORD_OUTPUTS(gx, gw, gb);
    return {gx.view(grads[0].sizes()), gw, with_bias ? gb : at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// H-ACN's update with its long path (hacn.cu): x, acc fp32 and h (bf16 or fp32) of one shape, a one
// fp32 → (x' = h + a·x, acc' = acc + h), fp32. Saved: x, a; h's dtype for its gradient.
struct HacnStep : public torch::autograd::Function<HacnStep> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& acc_in,
                               const at::Tensor& h_in, const at::Tensor& a) {
    const c10::DeviceGuard device_guard(x_in.device());
    const auto x = x_in.contiguous(), acc = acc_in.contiguous(), h = h_in.contiguous();
    auto xo = at::empty_like(x), acco = at::empty_like(x);
    {
      RECORD_FUNCTION("plexus::hacn_step", std::vector<c10::IValue>({x, acc, h}));
      PLEXUS_RECORD_OUTPUTS(xo, acco);
      if (x.is_cpu()) {
        run_hacn_forward_on_host(x, acc, h, a, xo, acco);
      } else {
        launch_hacn_forward(kernels_for(x.device(), 1), x, acc, h, a, xo, acco);
      }
    }
    ctx->save_for_backward({x, a});
    ctx->saved_data["h_bf16"] = h.scalar_type() == at::kBFloat16;
    return {xo.view(x_in.sizes()), acco.view(x_in.sizes())};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &a = saved[1];
    const c10::DeviceGuard device_guard(x.device());
    // x' unused (the last unit's, whose stream the long path does not read): its gradient is zero.
    const auto gxo = grads[0].defined() ? grads[0].to(at::kFloat).contiguous() : at::zeros_like(x);
    const auto gacc = grads[1].defined() ? grads[1].to(at::kFloat).contiguous() : at::Tensor();
    auto gx = at::empty_like(x);
    auto gh = at::empty_like(x, x.options().dtype(ctx->saved_data["h_bf16"].toBool() ? at::kBFloat16 : at::kFloat));
    at::Tensor parts;
    float host_ga = 0.0f;
    {  // the kernel alone in the operator's scope (ga's sum over blocks below is libtorch's)
      RECORD_FUNCTION("plexus::hacn_step_backward", std::vector<c10::IValue>({x, gxo, gacc}));
      PLEXUS_RECORD_OUTPUTS(gx, gh);
      if (x.is_cpu()) {
        host_ga = run_hacn_backward_on_host(x, gxo, gacc, a, gx, gh);
      } else {
        parts = launch_hacn_backward_parts(kernels_for(x.device(), 1), x, gxo, gacc, a, gx, gh);
      }
    }
    const auto ga = x.is_cpu() ? at::full(a.sizes(), host_ga, a.options()) : parts.sum().view(a.sizes());
    return {gx.view(grads[0].defined() ? grads[0].sizes() : x.sizes()), grads[1], gh.view(x.sizes()), ga};
  }
};

// AttnRes' depth attention (attnres.cu) over the history rows `slots` (buf [cap, N] fp32) with the
// query q [D] fp32 → (y shaped like the states [.., D], α [.., m] without gradient). `states`: the
// pushes' outputs of those slots, inputs only so that autograd runs their pushes' backwards after
// this one's, which adds the sources' gradients into gbuf (history.cpp). Saved: q; the buffers.
// Records name the rows of a history they read or write (plexus_history::record_rows).
struct HistoryAttend : public torch::autograd::Function<HistoryAttend> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q_in, at::TensorList states,
                               plexus_history::Buffers h, std::vector<int64_t> slots) {
    const c10::DeviceGuard device_guard(h.buf.device());
    const auto q = q_in.contiguous();
    const int64_t d = q.numel(), n = h.buf.size(1), rows = n / d;
    const auto s = attnres_sources(slots, n);
    auto y = at::empty({rows, d}, h.buf.options()), alpha = at::empty({rows, s.m}, h.buf.options());
    {
      RECORD_FUNCTION("plexus::history_attend", plexus_history::record_rows({q}, slots, {h.buf}));
      PLEXUS_RECORD_OUTPUTS(y, alpha);
      if (h.buf.is_cpu()) {
        host_attnres(cptr<float>(h.buf), s, cptr<float>(q), nullptr, mptr<float>(y), mptr<float>(alpha), nullptr,
                     nullptr, rows, d, kNormThreads);
      } else {
        launch_attnres_forward(kernels_for(h.buf.device(), 1), h.buf, s, q, y, alpha);
      }
    }
    ctx->save_for_backward({q});
    ctx->saved_data["buf"] = h.buf;
    ctx->saved_data["gbuf"] = h.gbuf;
    ctx->saved_data["slots"] = slots;
    ctx->mark_non_differentiable({alpha});
    auto alpha_sizes = states[0].sizes().vec();
    alpha_sizes.back() = s.m;
    return {y.view(states[0].sizes()), alpha.view(alpha_sizes)};
  }

  // (gy, -) → (gq [D], no gradient for the states: it goes to gbuf, which their pushes return)
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    plexus_history::Buffers h{ctx->saved_data["buf"].toTensor(), ctx->saved_data["gbuf"].toTensor()};
    const auto q = ctx->get_saved_variables()[0];
    const auto slots = ctx->saved_data["slots"].toIntVector();
    variable_list out(1 + slots.size() + 2);  // q, the states, the buffers and the slots
    if (!grads[0].defined()) return out;
    const c10::DeviceGuard device_guard(h.buf.device());
    const int64_t d = q.numel(), n = h.buf.size(1);
    const auto s = attnres_sources(slots, n);
    const auto gy = grads[0].to(at::kFloat).reshape({-1, d}).contiguous();
    plexus_history::ensure_gradient_buffer(h);
    at::Tensor gq, parts;
    {  // the kernel alone in the operator's scope (gq's sum over blocks below is libtorch's)
      RECORD_FUNCTION("plexus::history_attend_backward", plexus_history::record_rows({q, gy}, slots, {h.buf, h.gbuf}));
      if (h.buf.is_cpu()) {
        gq = at::empty({d}, q.options());
        host_attnres(cptr<float>(h.buf), s, cptr<float>(q), cptr<float>(gy), nullptr, nullptr, mptr<float>(h.gbuf),
                     mptr<float>(gq), gy.size(0), d, kNormThreads);
      } else {
        parts = launch_attnres_backward_parts(kernels_for(h.buf.device(), 1), h.buf, h.gbuf, s, q, gy);
      }
      if (guard.needsOutputs()) guard.setOutputs(plexus_history::record_rows({}, slots, {h.gbuf}));
    }
    out[0] = h.buf.is_cpu() ? gq : parts.sum(0);
    return out;
  }
};

// HC's dynamic logits z = LayerNorm(x; γ, β) · W (norm_project.cu) of x [.., D] fp32 with γ, β [D] and
// W [D, K] fp32 (K = n + 2, 3 ≤ K ≤ kMaxStreams + 2) → z [.., K] fp32, its values bf16-rounded with
// `round`. Saved: x, γ, β, W, mean and rstd [R].
struct NormProjectCuda : public torch::autograd::Function<NormProjectCuda> {
  // `cell`: where x's gradient goes (x being a multi-stream state, stream_grad.h), or none.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& gamma_in,
                            const at::Tensor& beta_in, const at::Tensor& w_in, double eps, bool round,
                            plexus_stream_grad::Cell cell) {
    const c10::DeviceGuard device_guard(x_in.device());
    const int64_t d = x_in.size(-1), kk = w_in.size(1);
    const auto x = x_in.reshape({-1, d}).contiguous();
    const auto gamma = gamma_in.contiguous(), beta = beta_in.contiguous(), w = w_in.contiguous();
    RECORD_FUNCTION("plexus::norm_project", std::vector<c10::IValue>({x}));
    auto z = at::empty({x.size(0), kk}, x.options());
    auto mean = at::empty({x.size(0)}, x.options()), rstd = at::empty({x.size(0)}, x.options());
    if (x.is_cpu()) {
      run_norm_project_forward_on_host(x, gamma, beta, w, z, mean, rstd, eps, round);
    } else {
      launch_norm_project_forward(kernels_for(x.device(), kk - 2), x, gamma, beta, w, z, mean, rstd, eps, round);
    }
    PLEXUS_RECORD_OUTPUTS(z, mean, rstd);
    ctx->save_for_backward({x, gamma, beta, w, mean, rstd});
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["round"] = round;
    if (plexus_stream_grad::gathers(cell)) ctx->saved_data["cell"] = cell.grad;
    auto sizes = x_in.sizes().vec();
    sizes.back() = kk;
    return z.view(sizes);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &gamma = saved[1], &beta = saved[2], &w = saved[3];
    const c10::DeviceGuard device_guard(x.device());
    const bool round = ctx->saved_data["round"].toBool();
    const auto gz = grads[0].to(at::kFloat).reshape({-1, w.size(1)}).contiguous();
    const auto cell_at = ctx->saved_data.find("cell");
    const plexus_stream_grad::Cell cell{cell_at == ctx->saved_data.end() ? at::Tensor() : cell_at->second.toTensor()};
    // gx: x's gradient, written (a fresh tensor, or the cell's first) or added into the cell (then
    // read too, as x is).
    const auto [gx, accumulate] = plexus_stream_grad::gathers(cell) ? plexus_stream_grad::target(cell, x.sizes())
                                                                     : std::make_pair(at::empty_like(x), false);
    RECORD_FUNCTION("plexus::norm_project_backward",
                    accumulate ? std::vector<c10::IValue>({x, gz, gx}) : std::vector<c10::IValue>({x, gz}));
    auto [gg, gb, gw] =
        x.is_cpu() ? run_norm_project_backward_on_host(x, gamma, beta, w, gz, ctx->saved_data["eps"].toDouble(), round,
                                                       gx, accumulate)
                   : launch_norm_project_backward(kernels_for(x.device(), w.size(1) - 2), x, gamma, beta, w, gz,
                                                  saved[4], saved[5], round, gx, accumulate);
    PLEXUS_RECORD_OUTPUTS(gx, gg, gb, gw);
    auto sizes = grads[0].sizes().vec();
    sizes.back() = x.size(1);
    return {plexus_stream_grad::gathers(cell) ? at::Tensor() : gx.view(sizes), gg, gb, gw, at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

// RoPE of x [B, T, H·hd] (rows possibly further apart: a block of a packed projection, its last
// dimension contiguous) into heads [B, H, T, hd], with Rope's tables cs, sn [≥ T, hd] (constants).
struct RopeCuda : public torch::autograd::Function<RopeCuda> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cs, const at::Tensor& sn,
                            int64_t heads) {
    const c10::DeviceGuard device_guard(x.device());
    RECORD_FUNCTION("plexus::rope_heads", std::vector<c10::IValue>({x}));
    const int64_t b = x.size(0), t = x.size(1), hd = x.size(2) / heads;
    auto y = at::empty({b, heads, t, hd}, x.options());
    if (x.is_cpu()) {
      run_rope_forward_on_host(x, cs, sn, y, heads);
    } else {
      launch_rope_forward(kernels_for(x.device(), 1), x, cs, sn, y, heads);
    }
    PLEXUS_RECORD_OUTPUTS(y);
    ctx->save_for_backward({cs, sn});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const c10::DeviceGuard device_guard(saved[0].device());
    const auto gy = grads[0].to(saved[0].scalar_type()).contiguous();
    RECORD_FUNCTION("plexus::rope_heads_backward", std::vector<c10::IValue>({gy}));
    auto gx = at::empty({gy.size(0), gy.size(2), gy.size(1) * gy.size(3)}, gy.options());
    if (gy.is_cpu()) {
      run_rope_backward_on_host(gy, saved[0], saved[1], gx);
    } else {
      launch_rope_backward(kernels_for(saved[0].device(), 1), gy, saved[0], saved[1], gx);
    }
    PLEXUS_RECORD_OUTPUTS(gx);
    return {gx, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// silu(g) · u for g, u of one shape and dtype (bf16 or fp32) on a CUDA device, one kernel each way.
struct SwigluCuda : public torch::autograd::Function<SwigluCuda> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& g_in, const at::Tensor& u_in) {
    const c10::DeviceGuard device_guard(g_in.device());
    const auto g = g_in.contiguous(), u = u_in.contiguous();
    RECORD_FUNCTION("plexus::swiglu", std::vector<c10::IValue>({g, u}));
    auto h = at::empty_like(g, at::MemoryFormat::Contiguous);
    if (g.is_cpu()) {
      run_swiglu_forward_on_host(g, u, h);
    } else {
      launch_swiglu_forward(kernels_for(g.device(), 1), g, u, h);
    }
    PLEXUS_RECORD_OUTPUTS(h);
    ctx->save_for_backward({g, u});
    return h;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& g = saved[0];
    const c10::DeviceGuard device_guard(g.device());
    const auto gh = grads[0].to(g.scalar_type()).contiguous();
    RECORD_FUNCTION("plexus::swiglu_backward", std::vector<c10::IValue>({gh}));
    auto gg = at::empty_like(g), gu = at::empty_like(g);
    if (g.is_cpu()) {
      run_swiglu_backward_on_host(g, saved[1], gh, gg, gu);
    } else {
      launch_swiglu_backward(kernels_for(g.device(), 1), g, saved[1], gh, gg, gu);
    }
    PLEXUS_RECORD_OUTPUTS(gg, gu);
    return {gg, gu};
  }
};

// Mean cross-entropy of logits [N, V] (bf16 or fp32, CUDA) against target [N] int64 → 0-dim fp32;
// the loss kernels of losses.cu each way. Saved for backward: the logits (their own dtype) and the
// row log-sum-exps [N].
struct CrossEntropyCuda : public torch::autograd::Function<CrossEntropyCuda> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits_in, const at::Tensor& target_in) {
    const c10::DeviceGuard device_guard(logits_in.device());
    const auto logits = logits_in.contiguous();
    const auto target = target_in.contiguous();
    loss_kind(logits);
    const int64_t n = logits.size(0);
    const auto f32 = logits.options().dtype(at::kFloat);
    auto lse = at::empty({n}, f32), loss = at::empty({n}, f32);
    {  // the kernel alone in the operator's scope (the mean below is libtorch's)
      RECORD_FUNCTION("plexus::cross_entropy", std::vector<c10::IValue>({logits}));
      if (logits.is_cpu()) {
        run_ce_forward_on_host(logits, target, lse, loss);
      } else {
        launch_ce_forward(kernels_for(logits.device(), 1), logits, target, lse, loss);
      }
      PLEXUS_RECORD_OUTPUTS(lse, loss);
    }
    ctx->save_for_backward({logits, target, lse});
    return loss.sum().div_(static_cast<double>(std::max<int64_t>(n, 1)));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& logits = saved[0];
    const c10::DeviceGuard device_guard(logits.device());
    // g/N on the device: no read, so that a captured step takes the replay's g.
    const auto scale = (grads[0].to(at::kFloat) / static_cast<double>(std::max<int64_t>(logits.size(0), 1)))
                           .reshape({1})
                           .contiguous();
    RECORD_FUNCTION("plexus::cross_entropy_backward", std::vector<c10::IValue>({logits}));
    auto grad = at::empty_like(logits, at::MemoryFormat::Contiguous);
    if (logits.is_cpu()) {
      run_ce_backward_on_host(logits, saved[1], saved[2], scale, grad);
    } else {
      launch_ce_backward(kernels_for(logits.device(), 1), logits, saved[1], saved[2], scale, grad);
    }
    PLEXUS_RECORD_OUTPUTS(grad);
    return {grad, at::Tensor()};
  }
};

}  // namespace

namespace {
// Where the loss, norm, SwiGLU and RoPE functions run: a CUDA device, or the CPU through the kernels'
// host build (PLEXUS_FUSED_KERNELS=cuda-host; see "The GPU paths on the CPU").
bool on_kernel_device(const at::Tensor& t) { return t.is_cuda() || t.is_cpu(); }
}  // namespace

extern "C" {

// For the tests of the error convention: fails with an error of `kind` (guarded.h's ErrorKind)
// and `message`, as an entry point whose work threw it.
char* plexus_fail_with(int kind, const char* message) {
  return guarded([&] {
    throw plexus_native::KindedError(static_cast<plexus_native::ErrorKind>(kind), message);
  });
}

// P = Sinkhorn(exp(logits)) on a CUDA device (fp32 logits [.., n, n], 1 ≤ n ≤ 8), differentiable.
char* plexus_sinkhorn_cuda(at::Tensor* logits, int64_t iters, at::Tensor** out) {
  return guarded([&] { *out = new at::Tensor(SinkhornCuda::apply(*logits, iters)); });
}

// The mean cross-entropy of logits [N, V] (bf16 or fp32 on a CUDA device) against target [N] int64
// on that device, through the loss kernels; differentiable (the logits).
char* plexus_cross_entropy_cuda(at::Tensor* logits, at::Tensor* target, at::Tensor** out) {
  return guarded([&] {
    const auto& x = *logits;
    const auto& t = *target;
    if (x.dim() != 2 || !on_kernel_device(x) || !(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat)) {
      throw std::invalid_argument("the CUDA loss takes bf16 or fp32 logits [N, V] on a CUDA device (or the CPU)");
    }
    if (t.dim() != 1 || t.size(0) != x.size(0) || t.scalar_type() != at::kLong || t.device() != x.device()) {
      throw std::invalid_argument("the CUDA loss takes an int64 target [N] on the logits' device");
    }
    *out = new at::Tensor(CrossEntropyCuda::apply(x, t));
  });
}

// A unit's pre-norm written in bf16 on a CUDA device: LayerNorm (`layer` 1; `b` may be null) or
// RMSNorm (`layer` 0) of x [.., D] fp32 with weight w [D] fp32, eps; differentiable (x, w, b).
char* plexus_norm_cuda(at::Tensor* x, at::Tensor* w, at::Tensor* b, double eps, int64_t layer, at::Tensor** out) {
  return guarded([&] {
    const int64_t d = x->dim() >= 1 ? x->size(-1) : 0;
    const auto fp32_on = [&](const at::Tensor& t) {
      return on_kernel_device(t) && t.scalar_type() == at::kFloat && t.device() == x->device();
    };
    if (!fp32_on(*x) || d < 1 || w->dim() != 1 || w->size(0) != d || !fp32_on(*w) ||
        (b != nullptr && (b->dim() != 1 || b->size(0) != d || !fp32_on(*b)))) {
      throw std::invalid_argument("the CUDA norm takes fp32 x [.., D] and weight (and bias) [D] on one CUDA device");
    }
    // No bias: an empty tensor, not an undefined one, which autograd's Function::apply cannot take
    // as an input (its VariableInfo asks every input for its device).
    *out = new at::Tensor(NormCuda::apply(*x, *w, b != nullptr ? *b : at::empty({0}, x->options()), eps, layer != 0));
  });
}

// The norm kernels' per-row arithmetic on the CPU, each block as `threads` threads: x [R, D] fp32,
// w (and b, may be null) [D] fp32, gy [R, D] bf16 (may be null) → out[0] = y [R, D] bf16, out[1] =
// gx, out[2] = gw, out[3] = gb (with gy; gb with b).
char* plexus_norm_host(at::Tensor* x, at::Tensor* w, at::Tensor* b, at::Tensor* gy, double eps, int64_t layer,
                       int64_t threads, at::Tensor** out) {
  return guarded([&] {
    const auto cpu_f32 = [](const at::Tensor& t) {
      return t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous();
    };
    if (x->dim() != 2 || !cpu_f32(*x) || !cpu_f32(*w) || w->numel() != x->size(1) ||
        (b != nullptr && (!cpu_f32(*b) || b->numel() != x->size(1))) ||
        (gy != nullptr && (gy->sizes() != x->sizes() || gy->scalar_type() != at::kBFloat16 || !gy->is_contiguous()))) {
      throw std::invalid_argument("plexus_norm_host takes contiguous CPU x [R, D] fp32, w (b) [D] fp32, gy [R, D] bf16");
    }
    if (threads < 1) throw std::invalid_argument("plexus_norm_host takes threads ≥ 1");
    const int64_t rows = x->size(0), d = x->size(1);
    auto y = at::empty({rows, d}, at::kBFloat16), mean = at::empty({rows}, at::kFloat),
         rstd = at::empty({rows}, at::kFloat), gx = at::empty({rows, d}, at::kFloat), gw = at::empty({d}, at::kFloat),
         gb = at::empty({d}, at::kFloat);
    host_norm(x->const_data_ptr<float>(), w->const_data_ptr<float>(), b ? b->const_data_ptr<float>() : nullptr,
              gy ? reinterpret_cast<const unsigned short*>(gy->const_data_ptr()) : nullptr,
              reinterpret_cast<unsigned short*>(y.mutable_data_ptr()), mean.mutable_data_ptr<float>(),
              rstd.mutable_data_ptr<float>(), gx.mutable_data_ptr<float>(), gw.mutable_data_ptr<float>(),
              b ? gb.mutable_data_ptr<float>() : nullptr, rows, d, static_cast<float>(eps), layer != 0, threads);
    out[0] = new at::Tensor(y);
    out[1] = new at::Tensor(gx);
    out[2] = new at::Tensor(gw);
    out[3] = new at::Tensor(gb);
  });
}

// H-ACN's update on a CUDA device (or the CPU, through the kernels' host build): x, acc [..] fp32 and h
// (bf16 or fp32) of one shape, a one fp32 value (a 0-dim or one-element tensor) on that device →
// out[0] = x' = h + a·x, out[1] = acc' = acc + h; differentiable (x, acc, h, a).
char* plexus_hacn_step(at::Tensor* x, at::Tensor* acc, at::Tensor* h, at::Tensor* a, at::Tensor** out) {
  return guarded([&] {
    const bool ok = on_kernel_device(*x) && x->scalar_type() == at::kFloat && acc->scalar_type() == at::kFloat &&
                    (h->scalar_type() == at::kBFloat16 || h->scalar_type() == at::kFloat) &&
                    a->scalar_type() == at::kFloat && a->numel() == 1 && acc->sizes() == x->sizes() &&
                    h->sizes() == x->sizes() && acc->device() == x->device() && h->device() == x->device() &&
                    a->device() == x->device();
    if (!ok) {
      throw std::invalid_argument(
          "the H-ACN kernels take fp32 x and acc, h (bf16 or fp32) of one shape and a one-value fp32 a, on one device");
    }
    auto r = HacnStep::apply(*x, *acc, *h, *a);
    out[0] = new at::Tensor(r[0]);
    out[1] = new at::Tensor(r[1]);
  });
}

// AttnRes' depth attention over a history of the dense topologies (history.cpp) on a CUDA device (or
// the CPU, through the kernels' host build): the k sources at rows `slots` of buf [cap, N] (fp32),
// `states` their pushes' outputs, q [D] fp32 (D divides N) → out[0] = y shaped like the states,
// out[1] = α [.., k] (no gradient); differentiable in q and, through gbuf, the states.
char* plexus_history_attend(at::Tensor* buf, at::Tensor* gbuf, const int64_t* slots, at::Tensor** states, int64_t k,
                            at::Tensor* q, at::Tensor** out) {
  return guarded([&] {
    const bool ok = buf->dim() == 2 && buf->is_contiguous() && buf->scalar_type() == at::kFloat &&
                    on_kernel_device(*buf) && gbuf->scalar_type() == at::kFloat && gbuf->device() == buf->device() &&
                    q->dim() == 1 && q->scalar_type() == at::kFloat && q->device() == buf->device() &&
                    q->numel() > 0 && buf->size(1) % q->numel() == 0;
    if (!ok) {
      throw std::invalid_argument(
          "AttnRes' kernels take a contiguous fp32 history [cap, N] with its gradient buffer and an fp32 query [D] "
          "(D dividing N) on one device");
    }
    std::vector<int64_t> s(slots, slots + std::max<int64_t>(k, 0));
    std::vector<at::Tensor> xs;
    for (int64_t i = 0; i < k; ++i) {
      if (s[i] < 0 || s[i] >= buf->size(0)) throw std::invalid_argument("history slot out of range");
      if (states[i]->numel() != buf->size(1) || states[i]->size(-1) != q->numel()) {
        throw std::invalid_argument("an AttnRes source must have the history's row size and the query's width");
      }
      xs.push_back(*states[i]);
    }
    attnres_sources(s, buf->size(1));  // the count's check
    auto r = HistoryAttend::apply(*q, at::TensorList(xs), plexus_history::Buffers{*buf, *gbuf}, s);
    out[0] = new at::Tensor(r[0]);
    out[1] = new at::Tensor(r[1]);
  });
}

// HC's dynamic logits on a CUDA device (or the CPU, through the kernels' host build): z = LayerNorm(x;
// γ, β, eps) · W for x [.., D] fp32, γ, β [D], W [D, K] fp32 (3 ≤ K ≤ 10), bf16 roundings with
// `round`; differentiable (x, γ, β, W).
// `cell`: x's gradient cell (x a multi-stream state, stream_grad.h), or NULL.
char* plexus_norm_project_cuda(at::Tensor* x, at::Tensor* gamma, at::Tensor* beta, at::Tensor* w, double eps,
                               int64_t round, at::Tensor* cell, at::Tensor** out) {
  return guarded([&] {
    const int64_t d = x->dim() >= 1 ? x->size(-1) : 0;
    const auto fp32_on = [&](const at::Tensor& t) {
      return on_kernel_device(t) && t.scalar_type() == at::kFloat && t.device() == x->device();
    };
    const bool ok = fp32_on(*x) && d >= 1 && fp32_on(*gamma) && fp32_on(*beta) && fp32_on(*w) && gamma->dim() == 1 &&
                    gamma->size(0) == d && beta->dim() == 1 && beta->size(0) == d && w->dim() == 2 &&
                    w->size(0) == d && w->size(1) >= 3 && w->size(1) <= kMaxStreams + 2;
    if (!ok) {
      throw std::invalid_argument(
          "the CUDA norm-project takes fp32 x [.., D], γ, β [D] and W [D, K] (3 ≤ K ≤ " +
          std::to_string(kMaxStreams + 2) + ") on one CUDA device (or the CPU)");
    }
    *out = new at::Tensor(NormProjectCuda::apply(*x, *gamma, *beta, *w, eps, round != 0, plexus_stream_grad::cell_of(cell)));
  });
}

// The norm-project kernels' per-thread arithmetic on the CPU, each block as `threads` threads: x [R, D],
// γ, β [D], W [D, K], gz [R, K] (fp32, contiguous) → out[0] = z, out[1] = gx (added to gx_in unless
// that is NULL), out[2] = gγ, out[3] = gβ, out[4] = gW.
char* plexus_norm_project_host(at::Tensor* x, at::Tensor* gamma, at::Tensor* beta, at::Tensor* w, at::Tensor* gz,
                               double eps, int64_t round, int64_t threads, at::Tensor* gx_in, at::Tensor** out) {
  return guarded([&] {
    const auto cpu_f32 = [](const at::Tensor& t) {
      return t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous();
    };
    const bool ok = x->dim() == 2 && cpu_f32(*x) && cpu_f32(*gamma) && cpu_f32(*beta) && cpu_f32(*w) && cpu_f32(*gz) &&
                    gamma->numel() == x->size(1) && beta->numel() == x->size(1) && w->dim() == 2 &&
                    w->size(0) == x->size(1) && w->size(1) >= 3 && w->size(1) <= kMaxStreams + 2 && gz->dim() == 2 &&
                    gz->size(0) == x->size(0) && gz->size(1) == w->size(1);
    if (!ok) throw std::invalid_argument("plexus_norm_project_host takes contiguous fp32 CPU x [R, D], γ, β [D], W [D, K], gz [R, K]");
    if (threads < 1) throw std::invalid_argument("plexus_norm_project_host takes threads ≥ 1");
    const int64_t rows = x->size(0), d = x->size(1), kk = w->size(1);
    if (gx_in != nullptr && !(cpu_f32(*gx_in) && gx_in->sizes() == x->sizes())) {
      throw std::invalid_argument("plexus_norm_project_host: the gradient added to must be like x");
    }
    auto z = at::empty({rows, kk}, at::kFloat), mean = at::empty({rows}, at::kFloat), rstd = at::empty({rows}, at::kFloat),
         gx = gx_in != nullptr ? gx_in->clone() : at::empty({rows, d}, at::kFloat), gg = at::empty({d}, at::kFloat),
         gb = at::empty({d}, at::kFloat), gw = at::empty({d, kk}, at::kFloat);
    host_norm_project(cptr<float>(*x), cptr<float>(*gamma), cptr<float>(*beta), cptr<float>(*w), cptr<float>(*gz),
                      mptr<float>(z), mptr<float>(mean), mptr<float>(rstd), mptr<float>(gx), mptr<float>(gg),
                      mptr<float>(gb), mptr<float>(gw), rows, d, kk - 2, static_cast<float>(eps), round != 0, threads,
                      gx_in != nullptr);
    out[0] = new at::Tensor(z);
    out[1] = new at::Tensor(gx);
    out[2] = new at::Tensor(gg);
    out[3] = new at::Tensor(gb);
    out[4] = new at::Tensor(gw);
  });
}

// RoPE into heads on a CUDA device: x [B, T, H·hd] (last dimension contiguous, token rows evenly
// apart), tables cs, sn [≥ T, hd] contiguous, one dtype (bf16 or fp32) → [B, H, T, hd];
// differentiable (x).
char* plexus_rope_cuda(at::Tensor* x, at::Tensor* cs, at::Tensor* sn, int64_t heads, at::Tensor** out) {
  return guarded([&] {
    const auto& v = *x;
    const bool ok = on_kernel_device(v) && v.dim() == 3 && heads >= 1 && v.size(2) % heads == 0 && (v.size(2) / heads) % 2 == 0 &&
                    v.stride(2) == 1 && v.stride(0) == v.size(1) * v.stride(1) && cs->is_contiguous() &&
                    sn->is_contiguous() && cs->dim() == 2 && cs->sizes() == sn->sizes() && cs->size(0) >= v.size(1) &&
                    cs->size(1) == v.size(2) / heads && cs->scalar_type() == v.scalar_type() &&
                    sn->scalar_type() == v.scalar_type() && cs->device() == v.device() && sn->device() == v.device() &&
                    (v.scalar_type() == at::kBFloat16 || v.scalar_type() == at::kFloat);
    if (!ok) throw std::invalid_argument("the CUDA RoPE takes x [B, T, H·hd] (rows evenly apart) and tables [≥ T, hd] of its dtype on its device");
    *out = new at::Tensor(RopeCuda::apply(v, *cs, *sn, heads));
  });
}

// RoPE's per-element arithmetic on the CPU: x [B, T, H·hd] contiguous, tables [≥ T, hd], gy
// [B, H, T, hd] (one dtype, bf16 or fp32) → out[0] = y [B, H, T, hd], out[1] = gx [B, T, H·hd].
char* plexus_rope_host(at::Tensor* x, at::Tensor* cs, at::Tensor* sn, at::Tensor* gy, int64_t heads, at::Tensor** out) {
  return guarded([&] {
    const auto& v = *x;
    if (!v.device().is_cpu() || v.dim() != 3 || !v.is_contiguous() || heads < 1 || v.size(2) % heads != 0 ||
        !(v.scalar_type() == at::kBFloat16 || v.scalar_type() == at::kFloat)) {
      throw std::invalid_argument("plexus_rope_host takes contiguous bf16/fp32 CPU x [B, T, H·hd]");
    }
    const int64_t b = v.size(0), t = v.size(1), hd = v.size(2) / heads;
    for (const at::Tensor* tab : {cs, sn}) {
      if (!tab->device().is_cpu() || !tab->is_contiguous() || tab->dim() != 2 || tab->size(0) < t ||
          tab->size(1) != hd || tab->scalar_type() != v.scalar_type()) {
        throw std::invalid_argument("plexus_rope_host takes tables [≥ T, hd] of x's dtype");
      }
    }
    if (gy->sizes() != at::IntArrayRef({b, heads, t, hd}) || gy->scalar_type() != v.scalar_type() || !gy->is_contiguous()) {
      throw std::invalid_argument("plexus_rope_host takes gy [B, H, T, hd] of x's dtype");
    }
    auto y = at::empty({b, heads, t, hd}, v.options()), gx = at::empty_like(v);
    if (v.scalar_type() == at::kFloat) {
      host_rope<float>(v.const_data_ptr<float>(), cs->const_data_ptr<float>(), sn->const_data_ptr<float>(),
                       gy->const_data_ptr<float>(), y.mutable_data_ptr<float>(), gx.mutable_data_ptr<float>(), b, t,
                       heads, hd, v.size(2));
    } else {
      const auto bits = [](const at::Tensor& a) { return reinterpret_cast<const unsigned short*>(a.const_data_ptr()); };
      const auto w = [](at::Tensor& a) { return reinterpret_cast<unsigned short*>(a.mutable_data_ptr()); };
      host_rope<unsigned short>(bits(v), bits(*cs), bits(*sn), bits(*gy), w(y), w(gx), b, t, heads, hd, v.size(2));
    }
    out[0] = new at::Tensor(y);
    out[1] = new at::Tensor(gx);
  });
}

// silu(g) · u on a CUDA device through the SwiGLU kernels (g, u of one shape and dtype, bf16 or
// fp32); differentiable.
char* plexus_swiglu_cuda(at::Tensor* g, at::Tensor* u, at::Tensor** out) {
  return guarded([&] {
    const bool ok = on_kernel_device(*g) && u->device() == g->device() && g->sizes() == u->sizes() &&
                    g->scalar_type() == u->scalar_type() &&
                    (g->scalar_type() == at::kBFloat16 || g->scalar_type() == at::kFloat);
    if (!ok) throw std::invalid_argument("the CUDA SwiGLU takes gate and up of one shape and dtype (bf16 or fp32) on one CUDA device");
    *out = new at::Tensor(SwigluCuda::apply(*g, *u));
  });
}

// SwiGLU's per-element arithmetic on the CPU: g, u, gh (contiguous CPU, one shape, bf16 or fp32) →
// out[0] = h, out[1] = gg, out[2] = gu.
char* plexus_swiglu_host(at::Tensor* g, at::Tensor* u, at::Tensor* gh, at::Tensor** out) {
  return guarded([&] {
    for (const at::Tensor* t : {u, gh}) {
      if (!t->device().is_cpu() || !t->is_contiguous() || t->sizes() != g->sizes() || t->scalar_type() != g->scalar_type()) {
        throw std::invalid_argument("plexus_swiglu_host takes contiguous CPU tensors of one shape and dtype");
      }
    }
    if (!g->device().is_cpu() || !g->is_contiguous() || !(g->scalar_type() == at::kBFloat16 || g->scalar_type() == at::kFloat)) {
      throw std::invalid_argument("plexus_swiglu_host takes contiguous bf16 or fp32 CPU tensors");
    }
    auto h = at::empty_like(*g), gg = at::empty_like(*g), gu = at::empty_like(*g);
    const int64_t n = g->numel();
    if (g->scalar_type() == at::kFloat) {
      host_swiglu<float>(g->const_data_ptr<float>(), u->const_data_ptr<float>(), gh->const_data_ptr<float>(),
                         h.mutable_data_ptr<float>(), gg.mutable_data_ptr<float>(), gu.mutable_data_ptr<float>(), n);
    } else {
      const auto bits = [](const at::Tensor& t) { return reinterpret_cast<const unsigned short*>(t.const_data_ptr()); };
      const auto w = [](at::Tensor& t) { return reinterpret_cast<unsigned short*>(t.mutable_data_ptr()); };
      host_swiglu<unsigned short>(bits(*g), bits(*u), bits(*gh), w(h), w(gg), w(gu), n);
    }
    out[0] = new at::Tensor(h);
    out[1] = new at::Tensor(gg);
    out[2] = new at::Tensor(gu);
  });
}

// The loss kernels' per-row arithmetic on the CPU, each row's block as `threads` threads: logits
// [N, V] (bf16 or fp32, CPU, contiguous), target [N] int64 → out[0] = lse [N], out[1] = the rows'
// losses [N] (fp32), out[2] = the logits' gradient at `scale` (the logits' dtype).
char* plexus_cross_entropy_host(at::Tensor* logits, at::Tensor* target, double scale, int64_t threads,
                                at::Tensor** out) {
  return guarded([&] {
    const auto& x = *logits;
    const auto& t = *target;
    if (x.dim() != 2 || !x.device().is_cpu() || !x.is_contiguous() ||
        !(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat)) {
      throw std::invalid_argument("plexus_cross_entropy_host takes contiguous bf16 or fp32 CPU logits [N, V]");
    }
    if (t.dim() != 1 || t.size(0) != x.size(0) || t.scalar_type() != at::kLong || !t.is_contiguous() ||
        !t.device().is_cpu()) {
      throw std::invalid_argument("plexus_cross_entropy_host takes a contiguous int64 CPU target [N]");
    }
    if (threads < 1) throw std::invalid_argument("plexus_cross_entropy_host takes threads ≥ 1");
    const int64_t n = x.size(0), v = x.size(1);
    auto lse = at::empty({n}, at::kFloat), loss = at::empty({n}, at::kFloat), grad = at::empty_like(x);
    const auto s = static_cast<float>(scale);
    if (x.scalar_type() == at::kFloat) {
      host_cross_entropy<float>(x.const_data_ptr<float>(), reinterpret_cast<const long long*>(t.const_data_ptr<int64_t>()), s,
                                lse.mutable_data_ptr<float>(), loss.mutable_data_ptr<float>(),
                                grad.mutable_data_ptr<float>(), n, v, threads);
    } else {
      host_cross_entropy<unsigned short>(reinterpret_cast<const unsigned short*>(x.const_data_ptr()),
                                         reinterpret_cast<const long long*>(t.const_data_ptr<int64_t>()), s, lse.mutable_data_ptr<float>(),
                                         loss.mutable_data_ptr<float>(),
                                         reinterpret_cast<unsigned short*>(grad.mutable_data_ptr()), n, v, threads);
    }
    out[0] = new at::Tensor(lse);
    out[1] = new at::Tensor(loss);
    out[2] = new at::Tensor(grad);
  });
}

// The CUDA kernels' per-token arithmetic on the CPU (contiguous fp32 or fp64 CPU tensors [.., n, n],
// 1 ≤ n ≤ 8): P, and with `grad` (P's gradient; may be null) the logits' gradient.
char* plexus_sinkhorn_host(at::Tensor* logits, at::Tensor* grad, int64_t iters, at::Tensor** out,
                           at::Tensor** grad_logits) {
  return guarded([&] {
    const auto& l = *logits;
    if (l.dim() < 2 || l.size(-1) != l.size(-2) || !l.device().is_cpu() || !l.is_contiguous() ||
        !(l.scalar_type() == at::kFloat || l.scalar_type() == at::kDouble)) {
      throw std::invalid_argument("plexus_sinkhorn_host takes contiguous fp32/fp64 CPU logits [.., n, n]");
    }
    if (grad != nullptr && (grad->sizes() != l.sizes() || grad->scalar_type() != l.scalar_type() ||
                            !grad->is_contiguous() || !grad->device().is_cpu())) {
      throw std::invalid_argument("plexus_sinkhorn_host takes a gradient like the logits");
    }
    if (iters < 1) throw std::invalid_argument("iters must be ≥ 1");
    const int64_t n = l.size(-1), m = l.numel() / std::max<int64_t>(1, n * n);
    auto p = at::empty_like(l);
    auto gl = at::empty_like(l);
    AT_DISPATCH_FLOATING_TYPES(l.scalar_type(), "sinkhorn_host", [&] {
      host_sinkhorn<scalar_t>(l.const_data_ptr<scalar_t>(), grad ? grad->const_data_ptr<scalar_t>() : nullptr,
                              p.mutable_data_ptr<scalar_t>(), gl.mutable_data_ptr<scalar_t>(), m, n,
                              static_cast<int>(iters));
    });
    *out = new at::Tensor(p);
    *grad_logits = grad != nullptr ? new at::Tensor(gl) : nullptr;
  });
}

// The stream kernels' per-token arithmetic on the CPU, each token's block as `threads` threads
// (contiguous fp32 or fp64 CPU tensors of one dtype): `write` 0, the read (a = h [M, n, D], b = pre [M, n] or [n], c = gu [M, D]: out[0] = u,
// out[1] = gH, out[2] = gpre [M, n]); `write` 2, the read with gH added to e = gH₀ [M, n, D]; `write` 1, the write (a = h, b = res [M, n, n] or [n, n],
// c = post [M, n] or [n], d = o [M, D], e = g [M, n, D]: out[0] = H', out[1] = gH, out[2] = go,
// out[3] = gws [M, n² + n], the per-token gres then gpost).
char* plexus_streams_host(int64_t write, int64_t threads, at::Tensor* a, at::Tensor* b, at::Tensor* c,
                          at::Tensor* d_in, at::Tensor* e_in, at::Tensor** out) {
  return guarded([&] {
    if (threads < 1) throw std::invalid_argument("plexus_streams_host takes threads ≥ 1");
    const auto& h = *a;
    if (h.dim() != 3 || !h.device().is_cpu() || !(h.scalar_type() == at::kFloat || h.scalar_type() == at::kDouble)) {
      throw std::invalid_argument("plexus_streams_host takes fp32/fp64 CPU streams [M, n, D]");
    }
    const int64_t m = h.size(0), n = h.size(1), d = h.size(2);
    if (write < 0 || write > 2) throw std::invalid_argument("plexus_streams_host: `write` is 0, 1 or 2");
    std::vector<const at::Tensor*> ins = {a, b, c};
    if (write == 1) ins.insert(ins.end(), {d_in, e_in});
    if (write == 2) ins.push_back(e_in);
    for (const at::Tensor* t : ins) {
      if (t == nullptr || !t->is_contiguous() || !t->device().is_cpu() || t->scalar_type() != h.scalar_type()) {
        throw std::invalid_argument("plexus_streams_host takes contiguous CPU tensors of the streams' dtype");
      }
    }
    if (write == 2 && e_in->sizes() != h.sizes()) throw std::invalid_argument("plexus_streams_host: gH₀ is not like h");
    const bool per_token = b->numel() != (write == 1 ? n * n : n);
    const auto opts = h.options();
    AT_DISPATCH_FLOATING_TYPES(h.scalar_type(), "streams_host", [&] {
      if (write != 1) {
        auto u = at::empty({m, d}, opts), gh = write == 2 ? e_in->clone() : at::empty({m, n, d}, opts),
             gpre = at::empty({m, n}, opts);
        host_stream_read<scalar_t>(h.const_data_ptr<scalar_t>(), b->const_data_ptr<scalar_t>(),
                                   c->const_data_ptr<scalar_t>(), u.mutable_data_ptr<scalar_t>(),
                                   gh.mutable_data_ptr<scalar_t>(), gpre.mutable_data_ptr<scalar_t>(), m, n, d,
                                   per_token, threads, write == 2);
        out[0] = new at::Tensor(u);
        out[1] = new at::Tensor(gh);
        out[2] = new at::Tensor(gpre);
      } else {
        auto o = at::empty({m, n, d}, opts), gh = at::empty({m, n, d}, opts), go = at::empty({m, d}, opts),
             gws = at::empty({m, n * n + n}, opts);
        host_stream_write<scalar_t>(h.const_data_ptr<scalar_t>(), b->const_data_ptr<scalar_t>(),
                                    c->const_data_ptr<scalar_t>(), d_in->const_data_ptr<scalar_t>(),
                                    e_in->const_data_ptr<scalar_t>(), o.mutable_data_ptr<scalar_t>(),
                                    gh.mutable_data_ptr<scalar_t>(), go.mutable_data_ptr<scalar_t>(),
                                    gws.mutable_data_ptr<scalar_t>(), m, n, d, per_token, threads);
        out[0] = new at::Tensor(o);
        out[1] = new at::Tensor(gh);
        out[2] = new at::Tensor(go);
        out[3] = new at::Tensor(gws);
      }
    });
  });
}

// Compiles the CUDA kernels for n streams and compute capability `arch` (major·10 + minor) with
// NVRTC, without loading them (no GPU needed): the image's size in bytes, and its target
// (sm_<arch> as a CUBIN, or compute_<a> as PTX) as a malloc'd string.
char* plexus_cuda_kernels_compile(int64_t n, int64_t arch, int64_t* image_bytes, char** target, char** log) {
  return guarded([&] {
    with_n(n, [](auto) {});
    const Image image = compile(n, static_cast<int>(arch));
    *image_bytes = static_cast<int64_t>(image.bytes.size());
    *target = dup_string(image.target);
    *log = dup_string(image.log);
  });
}

// NVRTC's version (major·1000 + minor·10, as CUDA writes versions) and the library's path (malloc'd).
char* plexus_nvrtc_version(int* version, char** path) {
  return guarded([&] {
    const Nvrtc& lib = nvrtc();
    int major = 0, minor = 0;
    lib.check(lib.Version(&major, &minor), "nvrtcVersion");
    *version = major * 1000 + minor * 10;
    *path = dup_string(lib.path);
  });
}

}  // extern "C"
