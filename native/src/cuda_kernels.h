// The CUDA half of the multi-stream read and write (native/src/streams.cu, compiled at run time
// with NVRTC by cuda_kernels.cpp), called by the autograd functions of stream_kernels.cpp for CUDA
// tensors. Every tensor is fp32, contiguous and on one CUDA device; shapes as the CPU row loops':
// m tokens, n streams, width d, weights per token (`per_token`) or one shared set. The first call
// for a device and n compiles, loads and checks the kernels (any failure throws, then and after).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace plexus_cuda {

// Whether the kernels are built for n streams (1 ≤ n ≤ 8).
bool takes_streams(int64_t n);

// u [m, d] = Σ_s pre[s] h[s]: h [m, n, d], pre [m, n] or [n].
void stream_read(const at::Tensor& h, const at::Tensor& pre, const at::Tensor& u, int64_t m, int64_t n, int64_t d,
                 bool per_token);

// gh [m, n, d] (written, or with `accumulate` added to) and the per-token gpre [m, n] from gu [m, d].
void stream_read_backward(const at::Tensor& h, const at::Tensor& pre, const at::Tensor& gu, const at::Tensor& gh,
                          const at::Tensor& gpre, int64_t m, int64_t n, int64_t d, bool per_token, bool accumulate);

// out [m, n, d]: out[t] = Σ_s res[s, t] h[s] + post[t] o; res [m, n, n] or [n, n], post [m, n] or [n].
void stream_write(const at::Tensor& h, const at::Tensor& res, const at::Tensor& post, const at::Tensor& o,
                  const at::Tensor& out, int64_t m, int64_t n, int64_t d, bool per_token);

// gh [m, n, d], go [m, d] and the per-token gws [m, n² + n] (gres [s, t] row-major, then gpost) from
// g [m, n, d].
void stream_write_backward(const at::Tensor& h, const at::Tensor& res, const at::Tensor& post, const at::Tensor& o,
                           const at::Tensor& g, const at::Tensor& gh, const at::Tensor& go, const at::Tensor& gws,
                           int64_t m, int64_t n, int64_t d, bool per_token);

}  // namespace plexus_cuda
