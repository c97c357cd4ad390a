// The pre-norm of a unit whose branch computes in bf16, on a CUDA GPU: LayerNorm (with or without
// bias) or RMSNorm of the fp32 stream x [R, D], written straight in bf16 — one kernel forward, where
// libtorch runs the norm (an fp32 output) and then a cast kernel, and one backward (plus libtorch's
// sum of the weight's per-block partial gradients), where it runs the cast's backward and the
// norm's.
//
//   layer:  x̂ = (x − mean) · rstd, rstd = 1/√(var + eps) (biased variance), y = x̂ · w + b
//   rms:    x̂ = x · rstd,          rstd = 1/√(mean(x²) + eps),              y = x̂ · w
//   backward, with g = gy · w:   gx = rstd · (g − [layer] mean(g) − x̂ · mean(g · x̂))
//                                gw = Σ_rows gy · x̂,   gb = Σ_rows gy
//
// fp32 arithmetic; mean and variance in two passes over the row (as many libraries, not Welford's
// one pass: the row is in registers or L1), so the roundings can differ from libtorch's in the last
// fp32 bit, and a bf16 output rarely by one unit.
//
// Compiled like losses.cu, in the same NVRTC program (PLEXUS_NORM_THREADS: the block size), and as
// plain C++ with PLEXUS_KERNELS_ON_HOST, where a "thread" is the loop over j = j0, j0 + step, …
// and a block's sums are the threads' partial sums added in thread order (on the GPU, a tree).
// Forward, one block per row; backward, one block per chunk of `rows` rows, whose threads own
// columns and add the weight's gradient over the chunk into part[block, D] (and the bias's into
// part[blocks + block, D]); the caller sums over blocks.

// PLEXUS_DEVICE, float_to_bf16 and friends: from cuda_prelude.cuh and losses.cu.

namespace plexus_norms {

// This thread's partial sums over row r's j = j0, j0 + step, …: Σ x (layer) and then, given the
// mean, Σ (x − mean)² — or Σ x² (rms, mean 0).
PLEXUS_DEVICE float row_sum(const float* x, long long r, long long D, long long j0, long long step) {
  float s = 0.0f;
  for (long long j = j0; j < D; j += step) s += x[r * D + j];
  return s;
}

PLEXUS_DEVICE float row_sq(const float* x, long long r, long long D, float mean, long long j0, long long step) {
  float s = 0.0f;
  for (long long j = j0; j < D; j += step) {
    const float c = x[r * D + j] - mean;
    s += c * c;
  }
  return s;
}

// y = x̂ · w (+ b) for this thread's j, in bf16 (raw bits).
PLEXUS_DEVICE void row_write(const float* x, const float* w, const float* b, unsigned short* y, long long r,
                             long long D, float mean, float rstd, long long j0, long long step) {
  for (long long j = j0; j < D; j += step) {
    float v = (x[r * D + j] - mean) * rstd * w[j];
    if (b != nullptr) v += b[j];
    y[r * D + j] = plexus_losses::float_to_bf16(v);
  }
}

// This thread's partial sums of row r's backward: Σ g and Σ g · x̂ (g = gy · w).
PLEXUS_DEVICE void row_grad_sums(const float* x, const unsigned short* gy, const float* w, long long r, long long D,
                                 float mean, float rstd, long long j0, long long step, float* sum_g, float* sum_gx) {
  float a = 0.0f, c = 0.0f;
  for (long long j = j0; j < D; j += step) {
    const float g = plexus_losses::bf16_to_float(gy[r * D + j]) * w[j];
    a += g;
    c += g * (x[r * D + j] - mean) * rstd;
  }
  *sum_g = a;
  *sum_gx = c;
}

// gx for this thread's j of row r, and its columns' shares of gw, gb added into pw, pb (the block's
// partial rows of the weight's and the bias's gradient; pb may be null).
PLEXUS_DEVICE void row_grad(const float* x, const unsigned short* gy, const float* w, float* gx, float* pw, float* pb,
                            long long r, long long D, float mean, float rstd, float mean_g, float mean_gx, long long j0,
                            long long step) {
  for (long long j = j0; j < D; j += step) {
    const float dy = plexus_losses::bf16_to_float(gy[r * D + j]);
    const float xh = (x[r * D + j] - mean) * rstd;
    gx[r * D + j] = rstd * (dy * w[j] - mean_g - xh * mean_gx);
    pw[j] += dy * xh;
    if (pb != nullptr) pb[j] += dy;
  }
}

}  // namespace plexus_norms

#ifndef PLEXUS_KERNELS_ON_HOST
// The block's sum of one value per thread, in every thread.
__device__ __forceinline__ float norm_block_sum(float v) {
  __shared__ float warps[PLEXUS_NORM_THREADS / 32];
  __shared__ float total;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warps[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < PLEXUS_NORM_THREADS / 32; ++i) s += warps[i];
    total = s;
  }
  __syncthreads();
  const float out = total;
  __syncthreads();  // `warps` and `total` are reused by the next call
  return out;
}

// One block per row (blockIdx.x): y [R, D] bf16, mean and rstd [R] fp32 (mean 0 for rms). b may be
// null; layer: 1 LayerNorm, 0 RMSNorm.
extern "C" __global__ void __launch_bounds__(PLEXUS_NORM_THREADS)
    plexus_norm_forward_bf16(const float* x, const float* w, const float* b, unsigned short* y, float* mean_out,
                             float* rstd_out, long long D, float eps, int layer) {
  const long long r = blockIdx.x;
  const float mean = layer ? norm_block_sum(plexus_norms::row_sum(x, r, D, threadIdx.x, blockDim.x)) / (float)D : 0.0f;
  const float var = norm_block_sum(plexus_norms::row_sq(x, r, D, mean, threadIdx.x, blockDim.x)) / (float)D;
  const float rstd = rsqrtf(var + eps);
  plexus_norms::row_write(x, w, b, y, r, D, mean, rstd, threadIdx.x, blockDim.x);
  if (threadIdx.x == 0) {
    mean_out[r] = mean;
    rstd_out[r] = rstd;
  }
}

// One block per `rows` rows: gx [R, D] fp32, part [2·blocks, D] (zeroed by the caller; rows
// 0..blocks the weight's partial gradients, blocks.. the bias's when with_bias).
extern "C" __global__ void __launch_bounds__(PLEXUS_NORM_THREADS)
    plexus_norm_backward_bf16(const float* x, const unsigned short* gy, const float* w, const float* mean_in,
                              const float* rstd_in, float* gx, float* part, long long R, long long D, long long rows,
                              int layer, int with_bias) {
  float* pw = part + (long long)blockIdx.x * D;
  float* pb = with_bias ? part + ((long long)gridDim.x + blockIdx.x) * D : nullptr;
  const long long end = (blockIdx.x + 1) * rows < R ? (blockIdx.x + 1) * rows : R;
  for (long long r = blockIdx.x * rows; r < end; ++r) {
    const float mean = mean_in[r], rstd = rstd_in[r];
    float sg = 0.0f, sgx = 0.0f;
    plexus_norms::row_grad_sums(x, gy, w, r, D, mean, rstd, threadIdx.x, blockDim.x, &sg, &sgx);
    const float mean_g = layer ? norm_block_sum(sg) / (float)D : 0.0f;
    const float mean_gx = norm_block_sum(sgx) / (float)D;
    plexus_norms::row_grad(x, gy, w, gx, pw, pb, r, D, mean, rstd, mean_g, mean_gx, threadIdx.x, blockDim.x);
  }
}
#endif
