// Fused CPU kernels of the multi-stream topologies (Hyper-Connections, mHC), as libtorch autograd
// functions with hand-written backwards. Rust reaches them through native/src/lib.rs
// (`stream_read`, `stream_write`, `sinkhorn`, `norm_project`); src/topology/common.rs, hyper.rs and
// mhc.rs call them for fp32/fp64 CPU tensors (unless PLEXUS_FUSED_KERNELS=0) and keep their
// composite libtorch code for every other device and dtype.
//
// Why: with n = 4 streams of width D the stream update of one unit is a few FLOPs per element, so
// its cost is memory traffic and per-operator overhead. The composite version runs per-token
// batched matrix products of [n, n] by [n, D] and their backwards (several passes over the
// [.., n, D] streams, each with a fresh allocation), and mHC's Sinkhorn–Knopp normalisation is an
// autograd graph of 2·iters log-softmaxes over [.., n, n] tensors. Here each is one pass forward and
// one pass backward over the tokens:
//
// * stream_read:  u[m]       = Σ_s pre[m,s] H[m,s]                    H [M, n, D] → u [M, D]
// * stream_write: H'[m,t]    = Σ_s res[m,s,t] H[m,s] + post[m,t] o[m]  → H' [M, n, D]
// * sinkhorn:     P          = Sinkhorn–Knopp(exp(logits)), iters × (rows, then columns), [M, n, n]
// * norm_project: z          = LayerNorm(x) @ W, row by row (HC's dynamic weights)     [R, D] → [R, K]
// * rms_project:  q          = (v @ φ) / RMS(v), row by row (mHC's mixing logits)      [R, N] → [R, K]
// * hyper_pre:    (u, res, post) from H: norm_project, HC's tanh-scaled mixing weights and the
//                 read, per token in one pass (HC's whole pre-unit step)  [M, n, D] → [M, D], [M, n, n], [M, n]
//
// `m` runs over the flattened leading dimensions (batch, tokens); the mixing weights either have
// them too (dynamic, input-dependent mixing: Mr = M) or not (static mixing: Mr = 1, the gradient
// is then summed over the tokens). The backward of sinkhorn recomputes the forward of a group of
// tokens, keeping its line sums, and walks back through them by hand, saving only the logits for
// backward where autograd would keep 2·iters [M, n, n] tensors; its arithmetic is sinkhorn.cu's,
// the CUDA kernels' (one lane per token here, one thread per token there).
//
// The row loops of the stream read, write and norm_project live in stream_rows.inc, built three
// times: for baseline x86-64, for AVX2 + FMA and for AVX-512 (the last two with GCC on x86-64).
// The Rust side passes which to use (`isa`, the widest the CPU has unless
// PLEXUS_FUSED_KERNELS=baseline), and the backward uses the forward's.
// Sinkhorn for n = 2, 4, 8 is there too (register-resident, a vector of tokens at a time); any other
// n runs the block loops below, baseline only.
//
// The stream read and write also take fp32 CUDA tensors: their autograd functions then call the
// CUDA kernels of streams.cu (cuda_kernels.h; compiled with NVRTC), with the same shapes and the
// same per-token weight gradients, summed here for static weights as on the CPU.
//
// Entry points follow plexus_native.cpp's convention (guarded.h): an error string or NULL, results
// through out-parameters, tensors as tch's `at::Tensor*`.

#include "cuda_kernels.h"
#include "guarded.h"
#include "history.h"
#include "record.h"
#include "stream_grad.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <atomic>
#include <type_traits>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

using plexus_native::guarded;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

// The value of a one-element CPU tensor, read from memory. These kernels take CPU tensors only, so
// this waits for nothing; `item()` would do the same through the dispatcher, where the sync count
// (`plexus::native::watch_syncs`) cannot tell it from a read that stalls a GPU.
double cpu_scalar(const at::Tensor& t) {
  TORCH_CHECK(t.is_cpu() && t.numel() == 1, "cpu_scalar: a one-element CPU tensor");
  return t.to(at::kDouble).contiguous().const_data_ptr<double>()[0];
}

// The row loops, once per instruction set (see stream_rows.inc); the Sinkhorn's arithmetic among
// them is sinkhorn.cu's, compiled as host code.
#define PLEXUS_KERNELS_ON_HOST
#include "cuda_prelude.cuh"

#define PLEXUS_VECTOR_BYTES 16
namespace isa_baseline {
#include "stream_rows.inc"
}  // namespace isa_baseline
#undef PLEXUS_VECTOR_BYTES

// GCC only: clang has no `#pragma GCC target` (it would build the baseline copy twice), and other
// architectures have their own vector widths, which the baseline build already uses.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PLEXUS_WIDE_VARIANTS 1
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define PLEXUS_VECTOR_BYTES 32
namespace isa_avx2 {
#include "stream_rows.inc"
}  // namespace isa_avx2
#undef PLEXUS_VECTOR_BYTES
#pragma GCC pop_options

// AVX-512 (F, VL, BW, DQ: the set libtorch's own AVX512 kernels require): 16 floats per
// instruction and 32 vector registers. `prefer-vector-width=512` makes GCC widen the plain loops
// (axpy, the reductions) too; its default tuning keeps them at 256 bits.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,fma,prefer-vector-width=512")
#define PLEXUS_VECTOR_BYTES 64
namespace isa_avx512 {
#include "stream_rows.inc"
}  // namespace isa_avx512
#undef PLEXUS_VECTOR_BYTES
#pragma GCC pop_options
#else
#define PLEXUS_WIDE_VARIANTS 0
#endif

// Instruction sets of the row loops; the numbers are the `isa` argument of the entry points.
constexpr int64_t kIsaBaseline = 0;
constexpr int64_t kIsaAvx2Fma = 1;
constexpr int64_t kIsaAvx512 = 2;

// Whether the CPU runs the row loops of `isa` (libtorch's choice aside: the tests run every set the
// CPU has).
bool cpu_runs_isa(int64_t isa) {
  if (isa == kIsaBaseline) return true;
#if PLEXUS_WIDE_VARIANTS
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (isa == kIsaAvx2Fma) return avx2;
  if (isa == kIsaAvx512) {
    return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
  }
#endif
  return false;
}

// The widest instruction set this build and this CPU have, and no wider than the one libtorch
// dispatches its own CPU kernels to (`at::get_cpu_capability()`: "DEFAULT", "AVX2", "AVX512", ...,
// which ATEN_CPU_CAPABILITY lowers), so that one setting rules both, and a CPU where libtorch
// avoids AVX-512 (clock throttling) keeps these loops off it too.
int64_t best_isa() {
  static const int64_t best = [] {
    const std::string aten = at::get_cpu_capability();
    const bool aten_avx512 = aten.rfind("AVX512", 0) == 0;
    if (aten_avx512 && cpu_runs_isa(kIsaAvx512)) return kIsaAvx512;
    if ((aten_avx512 || aten == "AVX2") && cpu_runs_isa(kIsaAvx2Fma)) return kIsaAvx2Fma;
    return kIsaBaseline;
  }();
  return best;
}

void check_isa(int64_t isa) {
  if (cpu_runs_isa(isa)) return;
  throw std::invalid_argument("fused stream kernels: instruction set " + std::to_string(isa) +
                              " is not available (0 = baseline; 1 = AVX2 + FMA and 2 = AVX-512, on x86-64 CPUs "
                              "that have them, in a GCC build)");
}

// The row loops of one instruction set, for one dtype.
template <typename T>
struct RowKernels {
  decltype(&isa_baseline::read_rows<T>) read;
  decltype(&isa_baseline::read_rows_backward<T>) read_backward;
  decltype(&isa_baseline::write_rows<T>) write;
  decltype(&isa_baseline::write_rows_backward<T>) write_backward;
  decltype(&isa_baseline::norm_project_rows<T>) norm_project;
  decltype(&isa_baseline::norm_project_rows_backward<T>) norm_project_backward;
  decltype(&isa_baseline::sinkhorn_rows<T>) sinkhorn;
  decltype(&isa_baseline::sinkhorn_rows_backward<T>) sinkhorn_backward;
  decltype(&isa_baseline::hyper_pre_rows<T>) hyper_pre;
  decltype(&isa_baseline::hyper_pre_rows_backward<T>) hyper_pre_backward;
  decltype(&isa_baseline::attnres_rows<T>) attnres;
  decltype(&isa_baseline::attnres_rows_backward<T>) attnres_backward;
};

// The table of namespace `k`'s copy.
#define PLEXUS_ROW_KERNELS(k)                                                                        \
  RowKernels<T> {                                                                                    \
    &k::read_rows<T>, &k::read_rows_backward<T>, &k::write_rows<T>, &k::write_rows_backward<T>,      \
        &k::norm_project_rows<T>, &k::norm_project_rows_backward<T>, &k::sinkhorn_rows<T>,           \
        &k::sinkhorn_rows_backward<T>, &k::hyper_pre_rows<T>, &k::hyper_pre_rows_backward<T>,        \
        &k::attnres_rows<T>, &k::attnres_rows_backward<T>                                            \
  }

template <typename T>
RowKernels<T> row_kernels(int64_t isa) {
  check_isa(isa);
#if PLEXUS_WIDE_VARIANTS
  if (isa == kIsaAvx512) return PLEXUS_ROW_KERNELS(isa_avx512);
  if (isa == kIsaAvx2Fma) return PLEXUS_ROW_KERNELS(isa_avx2);
#endif
  return PLEXUS_ROW_KERNELS(isa_baseline);
}
#undef PLEXUS_ROW_KERNELS

// Tokens per parallel task: enough elements that a task is worth a thread (~32 Ki).
int64_t grain(int64_t elems_per_token) {
  return std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, elems_per_token));
}

void check_cpu_float(const at::Tensor& t, const char* what, at::ScalarType dtype) {
  if (!t.defined()) throw std::invalid_argument(std::string(what) + " is undefined");
  if (!t.device().is_cpu()) throw std::invalid_argument(std::string(what) + " is not a CPU tensor");
  if (t.scalar_type() != dtype) {
    throw std::invalid_argument(std::string(what) + " has dtype " + c10::toString(t.scalar_type()) + ", expected " +
                                c10::toString(dtype));
  }
}

// Shapes of a stream operation: H [.., n, D] flattened to [M, n, D]; the mixing weights hold
// either M or 1 (static) sets of `per_token` values.
struct StreamShape {
  int64_t m, n, d, mr;
};

// A tensor of a stream operation: on the CPU as check_cpu_float; on CUDA, fp32 on the streams' device
// with n streams the CUDA kernels take.
void check_stream_tensor(const at::Tensor& t, const char* what, const at::Tensor& h) {
  if (!h.is_cuda()) return check_cpu_float(t, what, h.scalar_type());
  if (!t.defined()) throw std::invalid_argument(std::string(what) + " is undefined");
  if (t.device() != h.device() || t.scalar_type() != at::kFloat) {
    throw std::invalid_argument(std::string(what) + " is not an fp32 tensor on the streams' device " +
                                h.device().str() + " (the CUDA stream kernels take fp32)");
  }
}

StreamShape stream_shape(const at::Tensor& h, const at::Tensor& weights, int64_t per_token, const char* what) {
  if (h.dim() < 2) throw std::invalid_argument("streams must be [.., n, D]");
  if (!(h.scalar_type() == at::kFloat || h.scalar_type() == at::kDouble)) {
    throw std::invalid_argument("fused stream kernels take float32 or float64 tensors");
  }
  if (h.is_cuda() && !plexus_cuda::takes_streams(h.size(-2))) {
    throw std::invalid_argument("the CUDA stream kernels take 1 ≤ n ≤ 8 streams (n = " +
                                std::to_string(h.size(-2)) + ")");
  }
  check_stream_tensor(h, "streams", h);
  check_stream_tensor(weights, what, h);
  StreamShape s{0, h.size(-2), h.size(-1), 0};
  s.m = s.n * s.d == 0 ? 0 : h.numel() / (s.n * s.d);
  const int64_t sets = weights.numel() / std::max<int64_t>(1, per_token);
  if (weights.numel() != sets * per_token || !(sets == 1 || sets == s.m)) {
    throw std::invalid_argument(std::string(what) + " has " + std::to_string(weights.numel()) +
                                " elements, not 1 or M = " + std::to_string(s.m) + " sets of " +
                                std::to_string(per_token));
  }
  s.mr = sets;
  return s;
}

// ----------------------------------------------------------------------------------------------
// One gradient per multi-stream state (stream_grad.h): the cell in a node's saved data (not through
// save_for_backward: the readers resize it after their forward), and the pass-through that owns it.

using plexus_stream_grad::add;
using plexus_stream_grad::Cell;
using plexus_stream_grad::cell_of;
using plexus_stream_grad::gathers;
using plexus_stream_grad::target;

void save_cell(AutogradContext* ctx, const Cell& cell) {
  if (gathers(cell)) ctx->saved_data["cell"] = cell.grad;
}

Cell saved_cell(AutogradContext* ctx) {
  const auto it = ctx->saved_data.find("cell");
  return it == ctx->saved_data.end() ? Cell{} : Cell{it->second.toTensor()};
}

struct StreamGather : public torch::autograd::Function<StreamGather> {
  // h [.., n, D] → h; `cell`: an empty tensor of h's dtype and device, which h's readers are given
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, Cell cell) {
    if (!gathers(cell) || cell.grad.numel() != 0 || cell.grad.scalar_type() != h.scalar_type() ||
        cell.grad.device() != h.device()) {
      throw std::invalid_argument("a stream gradient cell must be an empty tensor of the streams' dtype and device");
    }
    ctx->saved_data["cell"] = cell.grad;
    ctx->saved_data["sizes"] = h.sizes().vec();
    // Where every reader used the cell, no gradient comes through autograd: take it undefined, not
    // as a tensor of zeros written (and then added) for nothing.
    ctx->set_materialize_grads(false);
    return h;
  }

  // g (from readers outside the cell, possibly undefined) → the cell's sum + g; the cell emptied
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Cell cell = saved_cell(ctx);
    const auto sizes = ctx->saved_data["sizes"].toIntVector();
    const auto& g = grads[0];
    if (cell.grad.numel() == 0) return {g.defined() ? g : at::zeros(sizes, cell.grad.options()), at::Tensor()};
    // A view of the sum keeps its storage, which the cell lets go of.
    auto gh = cell.grad.view(sizes);
    plexus_stream_grad::release(cell);
    if (g.defined()) gh.add_(g);
    return {gh, at::Tensor()};
  }
};

// ----------------------------------------------------------------------------------------------
// stream_read: u = Σ_s pre[s] H[s]

struct StreamRead : public torch::autograd::Function<StreamRead> {
  // h [.., n, D], pre [.., n] or [n] → u [.., D]; `isa`: the row loops' instruction set
  // `cell`: where h's gradient goes (stream_grad.h), or none (autograd's).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h_in, const at::Tensor& pre_in, int64_t isa,
                            Cell cell) {
    const auto h = h_in.contiguous();
    const auto pre = pre_in.contiguous();
    const auto sh = stream_shape(h, pre, sh_n(h), "pre");
    auto out_sizes = h.sizes().vec();
    out_sizes.erase(out_sizes.end() - 2);
    auto u = at::empty(out_sizes, h.options());
    if (h.is_cuda()) {
      plexus_cuda::stream_read(h, pre, u, sh.m, sh.n, sh.d, sh.mr != 1);
    } else {
      RECORD_FUNCTION("plexus::stream_read", std::vector<c10::IValue>({h, pre}));
      PLEXUS_RECORD_OUTPUTS(u);
      AT_DISPATCH_FLOATING_TYPES(h.scalar_type(), "stream_read", [&] {
        const scalar_t* hp = h.const_data_ptr<scalar_t>();
        const scalar_t* pp = pre.const_data_ptr<scalar_t>();
        scalar_t* up = u.mutable_data_ptr<scalar_t>();
        const auto rows = row_kernels<scalar_t>(isa).read;
        at::parallel_for(0, sh.m, grain(sh.n * sh.d), [&](int64_t b, int64_t e) {
          rows(hp, pp, up, b, e, sh.n, sh.d, sh.mr != 1);
        });
      });
    }
    ctx->save_for_backward({h, pre});
    ctx->saved_data["pre_sizes"] = pre_in.sizes().vec();
    ctx->saved_data["isa"] = isa;
    save_cell(ctx, cell);
    return u;
  }

  // gu [.., D] → (gh [.., n, D], gpre like pre)
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& h = saved[0];
    const auto& pre = saved[1];
    const auto gu = grads[0].contiguous();
    const auto sh = stream_shape(h, pre, sh_n(h), "pre");
    const Cell cell = saved_cell(ctx);
    // gh: h's gradient, written (a fresh tensor, or the cell's first) or added into the cell.
    const auto [gh, accumulate] = gathers(cell) ? target(cell, h.sizes()) : std::make_pair(at::empty_like(h), false);
    auto gpre_tok = at::empty({sh.m, sh.n}, h.options());
    if (h.is_cuda()) {
      plexus_cuda::stream_read_backward(h, pre, gu, gh, gpre_tok, sh.m, sh.n, sh.d, sh.mr != 1, accumulate);
    } else {
      // Adding into the cell reads it too.
      RECORD_FUNCTION("plexus::stream_read_backward",
                      accumulate ? std::vector<c10::IValue>({h, pre, gu, gh}) : std::vector<c10::IValue>({h, pre, gu}));
      PLEXUS_RECORD_OUTPUTS(gh, gpre_tok);
      AT_DISPATCH_FLOATING_TYPES(h.scalar_type(), "stream_read_backward", [&] {
        const scalar_t* hp = h.const_data_ptr<scalar_t>();
        const scalar_t* pp = pre.const_data_ptr<scalar_t>();
        const scalar_t* gp = gu.const_data_ptr<scalar_t>();
        scalar_t* ghp = gh.mutable_data_ptr<scalar_t>();
        scalar_t* gwp = gpre_tok.mutable_data_ptr<scalar_t>();
        const auto rows = row_kernels<scalar_t>(ctx->saved_data["isa"].toInt()).read_backward;
        at::parallel_for(0, sh.m, grain(sh.n * sh.d), [&](int64_t b, int64_t e) {
          rows(hp, pp, gp, ghp, gwp, b, e, sh.n, sh.d, sh.mr != 1, accumulate);
        });
      });
    }
    auto gpre = sh.mr == 1 ? gpre_tok.sum(0) : gpre_tok;
    return {gathers(cell) ? at::Tensor() : gh, gpre.view(ctx->saved_data["pre_sizes"].toIntVector()), at::Tensor(),
            at::Tensor()};
  }

  static int64_t sh_n(const at::Tensor& h) { return h.dim() >= 2 ? h.size(-2) : 1; }
};

// ----------------------------------------------------------------------------------------------
// stream_write: H'[t] = Σ_s res[s,t] H[s] + post[t] o

struct StreamWrite : public torch::autograd::Function<StreamWrite> {
  // h [.., n, D], res [.., n, n] or [n, n], post [.., n] or [n] (as res), o [.., D] → H' [.., n, D]
  // `cell`: where h's gradient goes (stream_grad.h), or none (autograd's).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h_in, const at::Tensor& res_in,
                            const at::Tensor& post_in, const at::Tensor& o_in, int64_t isa, Cell cell) {
    const auto h = h_in.contiguous();
    const auto res = res_in.contiguous();
    const auto post = post_in.contiguous();
    const auto o = o_in.contiguous();
    const auto sh = shape(h, res, post, o);
    auto out = at::empty_like(h);
    if (h.is_cuda()) {
      plexus_cuda::stream_write(h, res, post, o, out, sh.m, sh.n, sh.d, sh.mr != 1);
    } else {
      RECORD_FUNCTION("plexus::stream_write", std::vector<c10::IValue>({h, res, post, o}));
      PLEXUS_RECORD_OUTPUTS(out);
      AT_DISPATCH_FLOATING_TYPES(h.scalar_type(), "stream_write", [&] {
        const scalar_t* hp = h.const_data_ptr<scalar_t>();
        const scalar_t* rp = res.const_data_ptr<scalar_t>();
        const scalar_t* pp = post.const_data_ptr<scalar_t>();
        const scalar_t* op = o.const_data_ptr<scalar_t>();
        scalar_t* outp = out.mutable_data_ptr<scalar_t>();
        const auto rows = row_kernels<scalar_t>(isa).write;
        at::parallel_for(0, sh.m, grain(sh.n * sh.d), [&](int64_t b, int64_t e) {
          rows(hp, rp, pp, op, outp, b, e, sh.n, sh.d, sh.mr != 1);
        });
      });
    }
    ctx->save_for_backward({h, res, post, o});
    ctx->saved_data["res_sizes"] = res_in.sizes().vec();
    ctx->saved_data["post_sizes"] = post_in.sizes().vec();
    ctx->saved_data["isa"] = isa;
    save_cell(ctx, cell);
    return out;
  }

  // g [.., n, D] → (gh, gres, gpost, go)
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &h = saved[0], &res = saved[1], &post = saved[2], &o = saved[3];
    const auto g = grads[0].contiguous();
    const auto sh = shape(h, res, post, o);
    const int64_t n = sh.n, d = sh.d;
    // The write's backward is the first of the streams' readers (stream_grad.h): it writes the cell.
    // (Were it not, its gradient would be added to the cell's after the kernel.)
    const Cell cell = saved_cell(ctx);
    const bool into_cell = gathers(cell) && cell.grad.numel() == 0;
    const auto gh = into_cell ? target(cell, h.sizes()).first : at::empty_like(h);
    auto go = at::empty_like(o);
    at::Tensor gres_tok, gpost_tok;
    if (h.is_cuda()) {
      // One [M, n² + n] tensor: each token's gres, then its gpost.
      auto gws = at::empty({sh.m, n * n + n}, h.options());
      plexus_cuda::stream_write_backward(h, res, post, o, g, gh, go, gws, sh.m, n, d, sh.mr != 1);
      gres_tok = gws.narrow(1, 0, n * n).view({sh.m, n, n});
      gpost_tok = gws.narrow(1, n * n, n);
    } else {
      gres_tok = at::empty({sh.m, n, n}, h.options());
      gpost_tok = at::empty({sh.m, n}, h.options());
      RECORD_FUNCTION("plexus::stream_write_backward", std::vector<c10::IValue>({h, res, post, o, g}));
      PLEXUS_RECORD_OUTPUTS(gh, go, gres_tok, gpost_tok);
      AT_DISPATCH_FLOATING_TYPES(h.scalar_type(), "stream_write_backward", [&] {
        const scalar_t* hp = h.const_data_ptr<scalar_t>();
        const scalar_t* rp = res.const_data_ptr<scalar_t>();
        const scalar_t* pp = post.const_data_ptr<scalar_t>();
        const scalar_t* op = o.const_data_ptr<scalar_t>();
        const scalar_t* gp = g.const_data_ptr<scalar_t>();
        scalar_t* ghp = gh.mutable_data_ptr<scalar_t>();
        scalar_t* gop = go.mutable_data_ptr<scalar_t>();
        scalar_t* grp = gres_tok.mutable_data_ptr<scalar_t>();
        scalar_t* gpp = gpost_tok.mutable_data_ptr<scalar_t>();
        const auto rows = row_kernels<scalar_t>(ctx->saved_data["isa"].toInt()).write_backward;
        at::parallel_for(0, sh.m, grain(n * d), [&](int64_t b, int64_t e) {
          rows(hp, rp, pp, op, gp, ghp, grp, gpp, gop, b, e, n, d, sh.mr != 1);
        });
      });
    }
    if (gathers(cell) && !into_cell) add(cell, gh);
    auto gres = sh.mr == 1 ? gres_tok.sum(0) : gres_tok;
    auto gpost = sh.mr == 1 ? gpost_tok.sum(0) : gpost_tok;
    return {gathers(cell) ? at::Tensor() : gh, gres.view(ctx->saved_data["res_sizes"].toIntVector()),
            gpost.view(ctx->saved_data["post_sizes"].toIntVector()), go, at::Tensor(), at::Tensor()};
  }

  static StreamShape shape(const at::Tensor& h, const at::Tensor& res, const at::Tensor& post, const at::Tensor& o) {
    const int64_t n = h.dim() >= 2 ? h.size(-2) : 1;
    auto sh = stream_shape(h, res, n * n, "res");
    const auto post_sh = stream_shape(h, post, n, "post");
    if (post_sh.mr != sh.mr) throw std::invalid_argument("res and post differ in having per-token sets");
    check_stream_tensor(o, "the unit output", h);
    if (o.numel() != sh.m * sh.d) throw std::invalid_argument("the unit output is not [.., D] of the streams");
    return sh;
  }
};

// ----------------------------------------------------------------------------------------------
// sinkhorn for any n (the register-resident loops of stream_rows.inc take n = 2, 4, 8): blocks of
// kBlock tokens, each matrix entry a vector of the block's tokens (`Lanes`, one lane per token, as
// wide as the baseline build splits into its registers), through sinkhorn.cu's arithmetic with n at
// run time — the CUDA kernels' and the register-resident loops' arithmetic, lane by lane.

constexpr int64_t kBlock = 16;

template <typename T>
struct SinkhornBlock {
  typedef T Lanes __attribute__((vector_size(kBlock * sizeof(T))));
  int n, iters;
  // Whether the line sums are kept (for the backward); without, one slot takes them all.
  bool keep;
  // x (the state, n² entries), then with `keep` x0 (the first state, kept where the GPU recomputes
  // it), g (the gradient, n²) and the line sums (2·iters·n), in `storage`, aligned by hand:
  // std::allocator does not honour a vector type's alignment.
  std::vector<T> storage;
  Lanes* x;
  Lanes* x0;
  Lanes* g;
  Lanes* sums;
  std::vector<T> token;  // one token's n² values, for sinkhorn_load

  SinkhornBlock(int64_t n_, int64_t iters_, bool keep_)
      : n(static_cast<int>(n_)),
        iters(static_cast<int>(iters_)),
        keep(keep_),
        storage(((keep_ ? 3 * n_ * n_ + 2 * iters_ * n_ : n_ * n_) + 1) * kBlock),
        token(n_ * n_) {
    const auto base = reinterpret_cast<std::uintptr_t>(storage.data());
    x = reinterpret_cast<Lanes*>((base + sizeof(Lanes) - 1) / sizeof(Lanes) * sizeof(Lanes));
    x0 = keep ? x + n * n : nullptr;
    g = keep ? x0 + n * n : nullptr;
    sums = keep ? g + n * n : nullptr;
  }

  // Loads tokens [m0, m0 + cnt) of `logits` ([M, n, n]) and runs the iterations; x is then P.
  void forward(const T* logits, int64_t m0, int64_t cnt) {
    isa_baseline::sinkhorn_load<T, 0>(logits, m0, cnt, x, n, token.data());
    if (keep) {
      std::copy(x, x + n * n, x0);
      isa_baseline::plexus_sinkhorn::iterate_keeping_sums<T, 0>(x, sums, 1, n, iters);
    } else {
      isa_baseline::plexus_sinkhorn::iterate<T, 0>(x, n, iters);
    }
  }

  // After `forward` with `keep`: turns g (the gradient of P, n² entries, set by the caller) into
  // the gradient of the logits, in place.
  void backward() {
    isa_baseline::plexus_sinkhorn::iterate_backward<T, 0>(x, g, sums, 1, n, iters);
    isa_baseline::plexus_sinkhorn::exp_rows_backward<0>(g, x0, n);
  }
};

// Scratch per block of tokens in the backward: 3·n² + 2·iters·n values per token (the state, the
// first state, the gradient and the line sums). Larger problems (many streams and iterations) are
// refused; the caller then uses the composite version.
int64_t sinkhorn_scratch(int64_t n, int64_t iters) { return (3 * n * n + 2 * iters * n) * kBlock; }
constexpr int64_t kMaxSinkhornScratch = int64_t{1} << 22;
// Tokens per parallel task of the register-resident loops (each token is 2·iters·n² operations).
constexpr int64_t kSinkhornGrain = 64;

struct Sinkhorn : public torch::autograd::Function<Sinkhorn> {
  // logits [.., n, n] → P [.., n, n]; `isa`: the instruction set of the register-resident loops
  // (stream_rows.inc, n = 2, 4, 8), which run where they take n; the block loops above otherwise.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits_in, int64_t iters, int64_t isa) {
    const auto logits = logits_in.contiguous();
    const int64_t n = check(logits, iters);
    const int64_t m = logits.numel() / (n * n);
    auto out = at::empty_like(logits);
    {
      RECORD_FUNCTION("plexus::sinkhorn", std::vector<c10::IValue>({logits}));
      PLEXUS_RECORD_OUTPUTS(out);
      AT_DISPATCH_FLOATING_TYPES(logits.scalar_type(), "sinkhorn", [&] {
        const scalar_t* lp = logits.const_data_ptr<scalar_t>();
        scalar_t* op = out.mutable_data_ptr<scalar_t>();
        if (isa_baseline::sinkhorn_fixed_n(n)) {
          const auto rows = row_kernels<scalar_t>(isa).sinkhorn;
          at::parallel_for(0, m, kSinkhornGrain, [&](int64_t b, int64_t e) { rows(lp, op, b, e, n, iters); });
          return;
        }
        const int64_t blocks = (m + kBlock - 1) / kBlock;
        at::parallel_for(0, blocks, 1, [&](int64_t b, int64_t e) {
          SinkhornBlock<scalar_t> blk(n, iters, /*keep=*/false);
          for (int64_t bi = b; bi < e; ++bi) {
            const int64_t m0 = bi * kBlock, cnt = std::min(kBlock, m - m0);
            blk.forward(lp, m0, cnt);
            for (int64_t w = 0; w < cnt; ++w) {
              for (int64_t e2 = 0; e2 < n * n; ++e2) op[(m0 + w) * n * n + e2] = blk.x[e2][w];
            }
          }
        });
      });
    }
    ctx->save_for_backward({logits});
    ctx->saved_data["iters"] = iters;
    ctx->saved_data["isa"] = isa;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto logits = ctx->get_saved_variables()[0];
    const int64_t iters = ctx->saved_data["iters"].toInt();
    const int64_t n = check(logits, iters);
    const int64_t m = logits.numel() / (n * n);
    const auto g = grads[0].contiguous();
    auto gl = at::empty_like(logits);
    {
      RECORD_FUNCTION("plexus::sinkhorn_backward", std::vector<c10::IValue>({logits, g}));
      PLEXUS_RECORD_OUTPUTS(gl);
      AT_DISPATCH_FLOATING_TYPES(logits.scalar_type(), "sinkhorn_backward", [&] {
        const scalar_t* lp = logits.const_data_ptr<scalar_t>();
        const scalar_t* gp = g.const_data_ptr<scalar_t>();
        scalar_t* glp = gl.mutable_data_ptr<scalar_t>();
        if (isa_baseline::sinkhorn_fixed_n(n)) {
          const auto rows = row_kernels<scalar_t>(ctx->saved_data["isa"].toInt()).sinkhorn_backward;
          at::parallel_for(0, m, kSinkhornGrain, [&](int64_t b, int64_t e) { rows(lp, gp, glp, b, e, n, iters); });
          return;
        }
        const int64_t blocks = (m + kBlock - 1) / kBlock;
        at::parallel_for(0, blocks, 1, [&](int64_t b, int64_t e) {
          SinkhornBlock<scalar_t> blk(n, iters, /*keep=*/true);
          for (int64_t bi = b; bi < e; ++bi) {
            const int64_t m0 = bi * kBlock, cnt = std::min(kBlock, m - m0);
            blk.forward(lp, m0, cnt);
            for (int64_t e2 = 0; e2 < n * n; ++e2) {
              for (int64_t w = 0; w < kBlock; ++w) {
                blk.g[e2][w] = w < cnt ? gp[(m0 + w) * n * n + e2] : scalar_t(0);
              }
            }
            blk.backward();
            for (int64_t w = 0; w < cnt; ++w) {
              for (int64_t e2 = 0; e2 < n * n; ++e2) glp[(m0 + w) * n * n + e2] = blk.g[e2][w];
            }
          }
        });
      });
    }
    return {gl, at::Tensor(), at::Tensor()};
  }

  // Checks the input; returns n.
  static int64_t check(const at::Tensor& logits, int64_t iters) {
    if (logits.dim() < 2 || logits.size(-1) != logits.size(-2)) {
      throw std::invalid_argument("sinkhorn takes logits [.., n, n]");
    }
    if (!(logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kDouble)) {
      throw std::invalid_argument("the fused sinkhorn takes float32 or float64 logits");
    }
    check_cpu_float(logits, "logits", logits.scalar_type());
    const int64_t n = logits.size(-1);
    if (iters < 1 || sinkhorn_scratch(n, iters) > kMaxSinkhornScratch) {
      throw std::invalid_argument("the fused sinkhorn takes 1 ≤ iters and 3·n² + 2·iters·n ≤ " +
                                  std::to_string(kMaxSinkhornScratch / kBlock) + " (n = " + std::to_string(n) +
                                  ", iters = " + std::to_string(iters) + ")");
    }
    return n;
  }
};

// ----------------------------------------------------------------------------------------------
// norm_project: z = LayerNorm(x; γ, β, eps) @ W, row by row: x [R, D], γ, β [D], W [D, K] → z [R, K].
// Hyper-Connections' dynamic mixing weights come from exactly this with the rows being every
// stream of every token (R = M·n) and K = n + 2 small: computed together, the normalised streams
// (an [.., n, D] tensor, forward and backward) are never materialised and x is read once each way.
// Mean and variance are two-pass; the backward recomputes x̂ from the saved per-row mean and 1/σ,
// and sums the parameter gradients in one buffer per parallel task.

struct NormProject : public torch::autograd::Function<NormProject> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& gamma_in,
                            const at::Tensor& beta_in, const at::Tensor& w_in, double eps, int64_t isa) {
    const auto x = x_in.contiguous();
    const auto gamma = gamma_in.contiguous();
    const auto beta = beta_in.contiguous();
    const auto wt = w_in.t().contiguous();  // [K, D]: each output is a dot product with a row
    const auto dtype = x.scalar_type();
    if (!(dtype == at::kFloat || dtype == at::kDouble)) throw std::invalid_argument("norm_project takes float32/64");
    for (const auto* t : {&x, &gamma, &beta, &wt}) check_cpu_float(*t, "norm_project input", dtype);
    const int64_t d = x.size(-1), k = wt.size(0);
    if (gamma.numel() != d || beta.numel() != d || wt.size(1) != d) {
      throw std::invalid_argument("norm_project: γ, β must be [D] and W [D, K] for x [.., D]");
    }
    const int64_t rows = d == 0 ? 0 : x.numel() / d;
    auto z_sizes = x.sizes().vec();
    z_sizes.back() = k;
    auto z = at::empty(z_sizes, x.options());
    auto stats = at::empty({rows, 2}, x.options());  // mean, 1/σ
    {
      RECORD_FUNCTION("plexus::norm_project", std::vector<c10::IValue>({x, gamma, beta, wt}));
      PLEXUS_RECORD_OUTPUTS(z, stats);
      AT_DISPATCH_FLOATING_TYPES(dtype, "norm_project", [&] {
        const scalar_t* xp = x.const_data_ptr<scalar_t>();
        const scalar_t* gp = gamma.const_data_ptr<scalar_t>();
        const scalar_t* bp = beta.const_data_ptr<scalar_t>();
        const scalar_t* wp = wt.const_data_ptr<scalar_t>();
        scalar_t* zp = z.mutable_data_ptr<scalar_t>();
        scalar_t* sp = stats.mutable_data_ptr<scalar_t>();
        const auto kernel = row_kernels<scalar_t>(isa).norm_project;
        at::parallel_for(0, rows, grain(d * (k + 2)), [&](int64_t b, int64_t e) {
          std::vector<scalar_t> scratch((k + 2) * d);
          kernel(xp, gp, bp, wp, zp, sp, b, e, d, k, scalar_t(eps), scratch.data());
        });
      });
    }
    ctx->save_for_backward({x, gamma, beta, wt, stats});
    ctx->saved_data["isa"] = isa;
    return z;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &gamma = saved[1], &beta = saved[2], &wt = saved[3], &stats = saved[4];
    const auto gz = grads[0].contiguous();
    const int64_t d = x.size(-1), k = wt.size(0);
    const int64_t rows = d == 0 ? 0 : x.numel() / d;
    // One slice of parameter-gradient partial sums per task: [tasks, K + 2, D] (dWᵀ, dγ, dβ).
    const int64_t tasks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), rows));
    auto partial = at::zeros({tasks, k + 2, d}, x.options());
    auto gx = at::empty_like(x);
    {
      RECORD_FUNCTION("plexus::norm_project_backward", std::vector<c10::IValue>({x, gamma, beta, wt, stats, gz}));
      PLEXUS_RECORD_OUTPUTS(gx, partial);
      AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "norm_project_backward", [&] {
        const scalar_t* xp = x.const_data_ptr<scalar_t>();
        const scalar_t* gp = gamma.const_data_ptr<scalar_t>();
        const scalar_t* bp = beta.const_data_ptr<scalar_t>();
        const scalar_t* wp = wt.const_data_ptr<scalar_t>();
        const scalar_t* sp = stats.const_data_ptr<scalar_t>();
        const scalar_t* gzp = gz.const_data_ptr<scalar_t>();
        scalar_t* gxp = gx.mutable_data_ptr<scalar_t>();
        scalar_t* pp = partial.mutable_data_ptr<scalar_t>();
        const auto kernel = row_kernels<scalar_t>(ctx->saved_data["isa"].toInt()).norm_project_backward;
        at::parallel_for(0, tasks, 1, [&](int64_t tb, int64_t te) {
          std::vector<scalar_t> xhat(2 * d), normed(d), dnormed(d);
          for (int64_t task = tb; task < te; ++task) {
            kernel(xp, gp, bp, wp, sp, gzp, gxp, pp + task * (k + 2) * d, task * rows / tasks,
                   (task + 1) * rows / tasks, d, k, xhat.data(), normed.data(), dnormed.data());
          }
        });
      });
    }
    const auto sums = partial.sum(0);  // [K + 2, D]
    return {gx, sums.narrow(0, k, 1).view(gamma.sizes()), sums.narrow(0, k + 1, 1).view(beta.sizes()),
            sums.narrow(0, 0, k).t(), at::Tensor(), at::Tensor()};
  }
};

// ----------------------------------------------------------------------------------------------
// rms_project: q = (v @ φ) / r with r = ‖v‖₂ / √N per row: v [R, N], φ [N, K] → q [R, K]. mHC's
// mixing logits come from exactly this, v being a token's flattened streams (N = n·D) and K = n² + 2n.
// The matrix products are libtorch's (BLAS, cuBLAS); what the function saves is autograd's graph
// around them: the norm's backward (a masked fill, a product and a quotient over [R, N]) and the
// addition of the two [R, N] input gradients become one pass, dv = (dq/r) φᵀ − c ⊙ v with
// c = Σ_j dq_j q_j / (r² N). On any device. With `bf16` the products run in bf16 with the composite's
// roundings (v and φ rounded before the product, its result rounded and read back in fp32; backward
// the same for both gradients), and the bf16 copy of v is made again in backward instead of being
// kept: nothing of size [R, N] is saved but v, which the caller keeps anyway.

struct RmsProject : public torch::autograd::Function<RmsProject> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& v_in, const at::Tensor& phi_in, bool bf16) {
    const auto dtype = v_in.scalar_type();
    if (!(dtype == at::kFloat || dtype == at::kDouble) || phi_in.scalar_type() != dtype ||
        phi_in.device() != v_in.device()) {
      throw std::invalid_argument("rms_project takes float32/64 v and φ of one dtype on one device");
    }
    if (v_in.dim() < 1 || phi_in.dim() != 2 || phi_in.size(0) != v_in.size(-1)) {
      throw std::invalid_argument("rms_project: v must be [.., N] and φ [N, K]");
    }
    const int64_t n = v_in.size(-1);
    const auto v = v_in.contiguous().view({-1, n});
    const auto phi = phi_in.contiguous();
    const auto r = at::linalg_vector_norm(v, 2, {1}, /*keepdim=*/true).mul_(1.0 / std::sqrt(double(n)));
    auto q = product(v, phi, bf16).div_(r);
    ctx->save_for_backward({v, phi, r, q});
    ctx->saved_data["sizes"] = v_in.sizes().vec();
    ctx->saved_data["bf16"] = bf16;
    auto out_sizes = v_in.sizes().vec();
    out_sizes.back() = phi.size(1);
    return q.view(out_sizes);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &v = saved[0], &phi = saved[1], &r = saved[2], &q = saved[3];
    const bool bf16 = ctx->saved_data["bf16"].toBool();
    const auto dq = grads[0].contiguous().view({-1, phi.size(1)});
    const auto a = dq / r;                                                              // [R, K]
    const auto c = (dq * q).sum(1, /*keepdim=*/true).div_(r * r * double(v.size(1)));  // [R, 1]
    // (dq/r) φᵀ (bf16 under bf16: the composite's rounding), then − c ⊙ v in the same pass, in v's dtype.
    auto dv = bf16 ? at::addcmul(at::mm(a.to(at::kBFloat16), phi.to(at::kBFloat16).t()), v, c, -1.0)
                   : at::mm(a, phi.t()).addcmul_(v, c, -1.0);
    auto dphi = product(v.t(), a, bf16);
    return {dv.view(ctx->saved_data["sizes"].toIntVector()), dphi, at::Tensor()};
  }

  // a @ b in fp32 (or fp64), or with both rounded to bf16 and the bf16 result read back in a's dtype.
  static at::Tensor product(const at::Tensor& a, const at::Tensor& b, bool bf16) {
    if (!bf16) return at::mm(a, b);
    return at::mm(a.to(at::kBFloat16), b.to(at::kBFloat16)).to(a.scalar_type());
  }
};


// ----------------------------------------------------------------------------------------------
// hyper_pre: Hyper-Connections' dynamic mixing weights and the unit's read in one pass per token
// (stream_rows.inc, `hyper_pre_rows`): H [.., n, D] → u [.., D], res [.., n, n], post [.., n].
// Parameters: the weights' LayerNorm γ, β [D]; W_a [D, n+1], w_b [D]; A_static [n, n+1],
// B_static [n]; the scales s_a, s_b (one value each).

struct HyperPre : public torch::autograd::Function<HyperPre> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& h_in, const at::Tensor& gamma_in,
                               const at::Tensor& beta_in, const at::Tensor& w_a, const at::Tensor& w_b,
                               const at::Tensor& a_static, const at::Tensor& b_static, const at::Tensor& s_a,
                               const at::Tensor& s_b, double eps, int64_t isa) {
    const auto h = h_in.contiguous();
    const auto dtype = h.scalar_type();
    if (!(dtype == at::kFloat || dtype == at::kDouble)) throw std::invalid_argument("hyper_pre takes float32/64");
    for (const auto* t : {&h, &gamma_in, &beta_in, &w_a, &w_b, &a_static, &b_static, &s_a, &s_b}) {
      check_cpu_float(*t, "hyper_pre input", dtype);
    }
    if (h.dim() < 2) throw std::invalid_argument("hyper_pre: streams must be [.., n, D]");
    const int64_t n = h.size(-2), d = h.size(-1), k = n + 2;
    if (n < 1 || n > 64 || gamma_in.numel() != d || beta_in.numel() != d || w_a.dim() != 2 || w_a.size(0) != d ||
        w_a.size(1) != n + 1 || w_b.numel() != d || a_static.numel() != n * (n + 1) || b_static.numel() != n ||
        s_a.numel() != 1 || s_b.numel() != 1) {
      throw std::invalid_argument("hyper_pre: for H [.., n, D] (1 ≤ n ≤ 64) it takes γ, β, w_b [D], W_a [D, n+1], "
                                  "A_static [n, n+1], B_static [n] and one-value scales");
    }
    const int64_t m = n * d == 0 ? 0 : h.numel() / (n * d);
    const auto gamma = gamma_in.contiguous(), beta = beta_in.contiguous(), sa = a_static.contiguous();
    const auto sb = b_static.contiguous();
    const auto wt = at::cat({w_a, w_b.reshape({d, 1})}, 1).t().contiguous();  // [K, D]
    auto lead = h.sizes().vec();
    lead.pop_back();
    lead.pop_back();
    auto u_sizes = lead, res_sizes = lead, post_sizes = lead;
    u_sizes.push_back(d);
    res_sizes.insert(res_sizes.end(), {n, n});
    post_sizes.push_back(n);
    auto u = at::empty(u_sizes, h.options());
    auto res = at::empty(res_sizes, h.options());
    auto post = at::empty(post_sizes, h.options());
    auto t = at::empty({m * n, k}, h.options());
    auto stats = at::empty({m * n, 2}, h.options());
    const double scale_a = cpu_scalar(s_a), scale_b = cpu_scalar(s_b);
    {
      RECORD_FUNCTION("plexus::hyper_pre", std::vector<c10::IValue>({h, gamma, beta, wt, sa, sb}));
      PLEXUS_RECORD_OUTPUTS(u, res, post, t, stats);
      AT_DISPATCH_FLOATING_TYPES(dtype, "hyper_pre", [&] {
        const auto kernel = row_kernels<scalar_t>(isa).hyper_pre;
        at::parallel_for(0, m, grain(n * d * (k + 1)), [&](int64_t b, int64_t e) {
          std::vector<scalar_t> scratch((k + 2) * d);
          kernel(h.const_data_ptr<scalar_t>(), gamma.const_data_ptr<scalar_t>(), beta.const_data_ptr<scalar_t>(),
                 wt.const_data_ptr<scalar_t>(), sa.const_data_ptr<scalar_t>(), sb.const_data_ptr<scalar_t>(),
                 scalar_t(scale_a), scalar_t(scale_b), u.mutable_data_ptr<scalar_t>(),
                 res.mutable_data_ptr<scalar_t>(), post.mutable_data_ptr<scalar_t>(), t.mutable_data_ptr<scalar_t>(),
                 stats.mutable_data_ptr<scalar_t>(), b, e, n, d, scalar_t(eps), scratch.data());
        });
      });
    }
    ctx->save_for_backward({h, gamma, beta, wt, sa, t, stats});
    ctx->saved_data["scale_a"] = scale_a;
    ctx->saved_data["scale_b"] = scale_b;
    ctx->saved_data["isa"] = isa;
    ctx->saved_data["a_static_sizes"] = a_static.sizes().vec();
    ctx->saved_data["b_static_sizes"] = b_static.sizes().vec();
    ctx->saved_data["s_a_sizes"] = s_a.sizes().vec();
    ctx->saved_data["s_b_sizes"] = s_b.sizes().vec();
    return {u, res, post};
  }

  // (gu, gres, gpost) → gradients of (H, γ, β, W_a, w_b, A_static, B_static, s_a, s_b); an output
  // nothing used has an undefined gradient, taken as zeros.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &h = saved[0], &gamma = saved[1], &beta = saved[2], &wt = saved[3], &sa = saved[4], &t = saved[5],
               &stats = saved[6];
    const int64_t n = h.size(-2), d = h.size(-1), k = n + 2;
    const int64_t m = n * d == 0 ? 0 : h.numel() / (n * d);
    const auto given = [&](size_t i, std::initializer_list<int64_t> shape) {
      return grads[i].defined() ? grads[i].contiguous() : at::zeros(shape, h.options());
    };
    const auto gu = given(0, {m, d}), gres = given(1, {m, n, n}), gpost = given(2, {m, n});
    // One slice of parameter-gradient partial sums per task: [tasks, K + 2, D] (dWᵀ, dγ, dβ), and
    // [tasks, n(n+1) + n + 2] in double for the static weights and the scales.
    const int64_t tasks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), m));
    const int64_t small_len = n * (n + 1) + n + 2;
    auto partial = at::zeros({tasks, k + 2, d}, h.options());
    auto small = at::zeros({tasks, small_len}, h.options().dtype(at::kDouble));
    auto gh = at::empty_like(h);
    auto gz = at::empty({m * n, k}, h.options());
    {
      RECORD_FUNCTION("plexus::hyper_pre_backward", std::vector<c10::IValue>({h, gamma, beta, wt, sa, t, stats, gu, gres, gpost}));
      PLEXUS_RECORD_OUTPUTS(gh, gz, partial);
      AT_DISPATCH_FLOATING_TYPES(h.scalar_type(), "hyper_pre_backward", [&] {
        const auto kernel = row_kernels<scalar_t>(ctx->saved_data["isa"].toInt()).hyper_pre_backward;
        const auto scale_a = scalar_t(ctx->saved_data["scale_a"].toDouble());
        const auto scale_b = scalar_t(ctx->saved_data["scale_b"].toDouble());
        at::parallel_for(0, tasks, 1, [&](int64_t tb, int64_t te) {
          std::vector<scalar_t> xhat(2 * d), normed(d), dnormed(d);
          for (int64_t task = tb; task < te; ++task) {
            kernel(h.const_data_ptr<scalar_t>(), gamma.const_data_ptr<scalar_t>(), beta.const_data_ptr<scalar_t>(),
                   wt.const_data_ptr<scalar_t>(), sa.const_data_ptr<scalar_t>(), scale_a, scale_b,
                   t.const_data_ptr<scalar_t>(), stats.const_data_ptr<scalar_t>(), gu.const_data_ptr<scalar_t>(),
                   gres.const_data_ptr<scalar_t>(), gpost.const_data_ptr<scalar_t>(),
                   gh.mutable_data_ptr<scalar_t>(), gz.mutable_data_ptr<scalar_t>(),
                   partial.mutable_data_ptr<scalar_t>() + task * (k + 2) * d,
                   small.mutable_data_ptr<double>() + task * small_len, task * m / tasks, (task + 1) * m / tasks, n,
                   d, xhat.data(), normed.data(), dnormed.data());
          }
        });
      });
    }
    const auto sums = partial.sum(0);                     // [K + 2, D]
    const auto small_sum = small.sum(0).to(h.scalar_type());  // [n(n+1) + n + 2]
    const auto sizes = [&](const char* key) { return ctx->saved_data[key].toIntVector(); };
    return {gh,
            sums.narrow(0, k, 1).view({d}),
            sums.narrow(0, k + 1, 1).view({d}),
            sums.narrow(0, 0, n + 1).t(),
            sums.narrow(0, n + 1, 1).view({d}),
            small_sum.narrow(0, 0, n * (n + 1)).view(sizes("a_static_sizes")),
            small_sum.narrow(0, n * (n + 1), n).view(sizes("b_static_sizes")),
            small_sum.narrow(0, n * (n + 2), 1).view(sizes("s_a_sizes")),
            small_sum.narrow(0, n * (n + 2) + 1, 1).view(sizes("s_b_sizes")),
            at::Tensor(),
            at::Tensor()};
  }
};

// ----------------------------------------------------------------------------------------------
// history_attend_rows: AttnRes' depth attention over rows `slots` of a history buffer on the CPU
// (history.cpp: buf [cap, N], fp32 or fp64) with the unit's query q [D] → (y shaped like the
// states [.., D], α [.., m] without gradient), the row loops of stream_rows.inc: one pass over the
// sources each way, rows in parallel. The autograd contract is cuda_kernels.cpp's HistoryAttend
// (which runs attnres.cu's kernels, or their host build under PLEXUS_FUSED_KERNELS=cuda-host): the
// states are inputs only so that their pushes' backwards run after this one's, which adds the
// sources' gradients into gbuf. Saved: q; the buffers live in saved_data, as every reader's of a
// history. gq's partial sums, one [D] per task, are added in task order.

constexpr int64_t kAttnResRowsMaxSources = 64;  // PLEXUS_ATTNRES_MAX_SOURCES of attnres.cu

// Element offsets of rows `slots` of a [cap, N] buffer, checked.
std::vector<int64_t> attnres_row_offsets(const plexus_history::Buffers& h, const std::vector<int64_t>& slots) {
  const int64_t m = static_cast<int64_t>(slots.size());
  if (m < 1 || m > kAttnResRowsMaxSources) {
    throw std::invalid_argument("AttnRes' CPU kernel takes 1 to " + std::to_string(kAttnResRowsMaxSources) +
                                " sources (" + std::to_string(m) + " given)");
  }
  std::vector<int64_t> src;
  src.reserve(m);
  for (const auto s : slots) {
    if (s < 0 || s >= h.buf.size(0)) throw std::invalid_argument("history slot out of range");
    src.push_back(s * h.buf.size(1));
  }
  return src;
}

struct HistoryAttendRows : public torch::autograd::Function<HistoryAttendRows> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q_in, at::TensorList states,
                               plexus_history::Buffers h, std::vector<int64_t> slots, int64_t isa) {
    const auto dtype = h.buf.scalar_type();
    if (!(dtype == at::kFloat || dtype == at::kDouble)) throw std::invalid_argument("history_attend_rows takes float32/64");
    check_cpu_float(h.buf, "history buffer", dtype);
    check_cpu_float(q_in, "AttnRes' query", dtype);
    if (h.buf.dim() != 2 || !h.buf.is_contiguous()) throw std::invalid_argument("history buffer must be [cap, N]");
    const auto q = q_in.contiguous();
    const int64_t d = q.numel(), n = h.buf.size(1);
    if (d == 0 || n % d != 0 || states.size() != slots.size()) {
      throw std::invalid_argument("history_attend_rows: q [D] must divide the buffer's rows, one state per slot");
    }
    const auto src = attnres_row_offsets(h, slots);
    const int64_t rows = n / d, m = static_cast<int64_t>(src.size());
    auto y = at::empty({rows, d}, h.buf.options()), alpha = at::empty({rows, m}, h.buf.options());
    {
      RECORD_FUNCTION("plexus::history_attend", plexus_history::record_rows({q}, slots, {h.buf}));
      PLEXUS_RECORD_OUTPUTS(y, alpha);
      AT_DISPATCH_FLOATING_TYPES(dtype, "history_attend_rows", [&] {
        const scalar_t* bp = h.buf.const_data_ptr<scalar_t>();
        const scalar_t* qp = q.const_data_ptr<scalar_t>();
        scalar_t* yp = y.mutable_data_ptr<scalar_t>();
        scalar_t* ap = alpha.mutable_data_ptr<scalar_t>();
        const auto kernel = row_kernels<scalar_t>(isa).attnres;
        at::parallel_for(0, rows, grain(m * d), [&](int64_t b, int64_t e) { kernel(bp, src.data(), m, qp, yp, ap, b, e, d); });
      });
    }
    ctx->save_for_backward({q});
    ctx->saved_data["buf"] = h.buf;
    ctx->saved_data["gbuf"] = h.gbuf;
    ctx->saved_data["slots"] = slots;
    ctx->saved_data["isa"] = isa;
    ctx->mark_non_differentiable({alpha});
    auto alpha_sizes = states[0].sizes().vec();
    alpha_sizes.back() = m;
    return {y.view(states[0].sizes()), alpha.view(alpha_sizes)};
  }

  // (gy, -) → (gq [D], no gradient for the states: it goes to gbuf, which their pushes return)
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    plexus_history::Buffers h{ctx->saved_data["buf"].toTensor(), ctx->saved_data["gbuf"].toTensor()};
    const auto q = ctx->get_saved_variables()[0];
    const auto slots = ctx->saved_data["slots"].toIntVector();
    variable_list out(1 + slots.size() + 3);  // q, the states, the buffers, the slots and isa
    if (!grads[0].defined()) return out;
    const int64_t d = q.numel(), n = h.buf.size(1), rows = n / d;
    const auto src = attnres_row_offsets(h, slots);
    const int64_t m = static_cast<int64_t>(src.size());
    const auto gy = grads[0].to(h.buf.scalar_type()).reshape({-1, d}).contiguous();
    plexus_history::ensure_gradient_buffer(h);
    const int64_t tasks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), rows));
    auto partial = at::zeros({tasks, d}, q.options());
    {
      RECORD_FUNCTION("plexus::history_attend_backward", plexus_history::record_rows({q, gy}, slots, {h.buf, h.gbuf}));
      if (guard.needsOutputs()) guard.setOutputs(plexus_history::record_rows({partial}, slots, {h.gbuf}));
      AT_DISPATCH_FLOATING_TYPES(h.buf.scalar_type(), "history_attend_rows_backward", [&] {
        const scalar_t* bp = h.buf.const_data_ptr<scalar_t>();
        scalar_t* gbp = h.gbuf.mutable_data_ptr<scalar_t>();
        const scalar_t* qp = q.const_data_ptr<scalar_t>();
        const scalar_t* gyp = gy.const_data_ptr<scalar_t>();
        scalar_t* pp = partial.mutable_data_ptr<scalar_t>();
        const auto kernel = row_kernels<scalar_t>(ctx->saved_data["isa"].toInt()).attnres_backward;
        at::parallel_for(0, tasks, 1, [&](int64_t tb, int64_t te) {
          for (int64_t task = tb; task < te; ++task) {
            kernel(bp, gbp, src.data(), m, qp, gyp, pp + task * d, task * rows / tasks, (task + 1) * rows / tasks, d);
          }
        });
      });
    }
    out[0] = partial.sum(0);
    return out;
  }
};

}  // namespace

extern "C" {

// How many threads an `at::parallel_for` of `tasks` one-token tasks runs on here, in the native
// layer: libtorch's intra-op threads where this file was compiled with OpenMP (as libtorch's own
// kernels are), 1 otherwise — the header template then runs the whole loop on the calling thread,
// which the fused kernels did until build.rs passed -fopenmp. (libtorch's OpenMP loop hands each
// thread of the team its share of the range up front, so the count does not depend on timing.)
int64_t plexus_parallel_for_threads(int64_t tasks) {
  std::atomic<uint64_t> seen{0};
  at::parallel_for(0, tasks, 1, [&](int64_t, int64_t) { seen |= uint64_t{1} << (at::get_thread_num() % 64); });
  return __builtin_popcountll(seen.load());
}

// Whether the fused sinkhorn handles `n` streams and `iters` iterations (its scratch is bounded).
int plexus_sinkhorn_fits(int64_t n, int64_t iters) {
  return iters >= 1 && n >= 1 && sinkhorn_scratch(n, iters) <= kMaxSinkhornScratch ? 1 : 0;
}

// The widest instruction set of the row loops this build, this CPU and libtorch's dispatch allow
// (0 = baseline, 1 = AVX2 + FMA, 2 = AVX-512); whether the CPU runs a given one. The `isa` argument
// below takes any the CPU runs (`row_kernels` refuses any other with an error).
int64_t plexus_stream_kernels_best_isa() { return best_isa(); }
int plexus_stream_kernels_cpu_runs(int64_t isa) { return cpu_runs_isa(isa) ? 1 : 0; }

// h → h, the pass-through that owns the state's gradient cell `cell` (stream_grad.h).
char* plexus_stream_gather(at::Tensor* h, at::Tensor* cell, at::Tensor** out) {
  return guarded([&] { *out = new at::Tensor(StreamGather::apply(*h, Cell{*cell})); });
}

// `cell`: h's gradient cell, or NULL.
char* plexus_stream_read(at::Tensor* h, at::Tensor* pre, int64_t isa, at::Tensor* cell, at::Tensor** out) {
  return guarded([&] { *out = new at::Tensor(StreamRead::apply(*h, *pre, isa, cell_of(cell))); });
}

char* plexus_stream_write(at::Tensor* h, at::Tensor* res, at::Tensor* post, at::Tensor* o, int64_t isa,
                          at::Tensor* cell, at::Tensor** out) {
  return guarded([&] { *out = new at::Tensor(StreamWrite::apply(*h, *res, *post, *o, isa, cell_of(cell))); });
}

char* plexus_norm_project(at::Tensor* x, at::Tensor* gamma, at::Tensor* beta, at::Tensor* w, double eps, int64_t isa,
                          at::Tensor** out) {
  return guarded([&] { *out = new at::Tensor(NormProject::apply(*x, *gamma, *beta, *w, eps, isa)); });
}

char* plexus_sinkhorn(at::Tensor* logits, int64_t iters, int64_t isa, at::Tensor** out) {
  return guarded([&] { *out = new at::Tensor(Sinkhorn::apply(*logits, iters, isa)); });
}

char* plexus_rms_project(at::Tensor* v, at::Tensor* phi, int64_t bf16, at::Tensor** out) {
  return guarded([&] { *out = new at::Tensor(RmsProject::apply(*v, *phi, bf16 != 0)); });
}

// params: γ, β, W_a, w_b, A_static, B_static, s_a, s_b. outs: u, res, post (three fresh handles on
// success).
char* plexus_hyper_pre(at::Tensor* h, at::Tensor* const* params, double eps, int64_t isa, at::Tensor** outs) {
  return guarded([&] {
    const auto& p = params;
    auto r = HyperPre::apply(*h, *p[0], *p[1], *p[2], *p[3], *p[4], *p[5], *p[6], *p[7], eps, isa);
    for (size_t i = 0; i < 3; ++i) outs[i] = new at::Tensor(std::move(r[i]));
  });
}

// AttnRes' depth attention over rows `slots` of a CPU history (history_attend_rows above); `states`:
// the pushes' outputs of those slots. outs: y, α (two fresh handles on success).
char* plexus_history_attend_rows(at::Tensor* buf, at::Tensor* gbuf, const int64_t* slots, at::Tensor** states,
                                 int64_t k, at::Tensor* q, int64_t isa, at::Tensor** outs) {
  return guarded([&] {
    std::vector<int64_t> s(slots, slots + k);
    std::vector<at::Tensor> xs;
    xs.reserve(k);
    for (int64_t i = 0; i < k; ++i) xs.push_back(*states[i]);
    auto r = HistoryAttendRows::apply(*q, at::TensorList(xs), plexus_history::Buffers{*buf, *gbuf}, s, isa);
    for (size_t i = 0; i < 2; ++i) outs[i] = new at::Tensor(std::move(r[i]));
  });
}

}  // extern "C"
