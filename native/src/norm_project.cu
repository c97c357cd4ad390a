// Hyper-Connections' dynamic logits on a CUDA GPU: z = LayerNorm(x; γ, β) · W for every row of the
// streams x [R, D] (R = tokens · n), W = [W_a | w_b] [D, K] (K = n + 2), in one kernel each way. The
// composite writes the normalised streams in fp32, casts them to bf16, reads them back for the
// product and keeps the bf16 copy for backward; backward it runs the product's two gradients, a
// cast and LayerNorm's backward over [R, D] tensors. Here the normalised row lives in registers:
// forward reads x once and writes z [R, K]; backward reads x once more and writes gx.
//
//   forward:   x̂ = (x − mean) · rstd,  y = ρ(x̂ · γ + β),  z[k] = ρ(Σ_d y[d] ρ(W[d, k]))
//   backward:  gz' = ρ(gz),  gy[d] = ρ(Σ_k gz'[k] ρ(W[d, k])),  g = gy · γ
//              gx = rstd · (g − mean(g) − x̂ · mean(g · x̂)),  gγ = Σ_rows gy · x̂,  gβ = Σ_rows gy,
//              gW[d, k] = ρ(Σ_rows y[d] gz'[k])
//
// ρ is the rounding to bf16 when the product runs in bf16 (`round`), the identity in fp32: the
// roundings of the composite under `precision: bf16` (an fp32 LayerNorm, its output cast to bf16
// for a bf16 product with W cast to bf16 that accumulates in fp32, its result rounded to bf16 and
// cast back to fp32 for tanh; backward the same casts' gradients), so that the kernels and the
// composite differ only in the order of their fp32 sums. gW's last ρ is the caller's, after it adds
// the blocks' partial sums.
//
// Compiled like norms.cu, in the same NVRTC program (K = PLEXUS_N + 2 on the GPU; the host build is
// instantiated per K), and as plain C++ with PLEXUS_KERNELS_ON_HOST, where a "thread" is the loop
// over d = d0, d0 + step, … and a block's sums are the threads' partial sums added in thread order.
// Forward, one block per row; backward, one block per chunk of `rows` rows, whose threads own
// columns d and add their gradients over the chunk into part[block] = [gγ (D), gβ (D), gW (D·K)];
// the caller sums over blocks.

// PLEXUS_DEVICE, bf16 helpers, plexus_norms::row_sum/row_sq, norm_block_sum, block_sum_of: from
// cuda_prelude.cuh, losses.cu, norms.cu and streams.cu.

namespace plexus_norm_project {

PLEXUS_DEVICE float rho(float v, bool round) {
  return round ? plexus_losses::bf16_to_float(plexus_losses::float_to_bf16(v)) : v;
}

// This thread's partial sums of row r's z (K of them, into part) for its d = d0, d0 + step, …
template <int K>
PLEXUS_DEVICE void forward_partial(const float* x, const float* gamma, const float* beta, const float* w, long long r,
                                   long long D, float mean, float rstd, bool round, long long d0, long long step,
                                   float* part) {
#pragma unroll
  for (int k = 0; k < K; ++k) part[k] = 0.0f;
  for (long long d = d0; d < D; d += step) {
    const float y = rho((x[r * D + d] - mean) * rstd * gamma[d] + beta[d], round);
#pragma unroll
    for (int k = 0; k < K; ++k) part[k] += y * rho(w[d * K + k], round);
  }
}

// Row r's gz' (K values) from gz [R, K].
template <int K>
PLEXUS_DEVICE void load_gz(const float* gz, long long r, bool round, float* g) {
#pragma unroll
  for (int k = 0; k < K; ++k) g[k] = rho(gz[r * K + k], round);
}

// gy[d] of row r, given its gz'.
template <int K>
PLEXUS_DEVICE float grad_y(const float* w, const float* g, long long d, bool round) {
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < K; ++k) s += g[k] * rho(w[d * K + k], round);
  return rho(s, round);
}

// This thread's partial sums of row r's backward: Σ g and Σ g · x̂ (g = gy · γ).
template <int K>
PLEXUS_DEVICE void backward_sums(const float* x, const float* gamma, const float* w, const float* g, long long r,
                                 long long D, float mean, float rstd, bool round, long long d0, long long step,
                                 float* sum_g, float* sum_gx) {
  float a = 0.0f, c = 0.0f;
  for (long long d = d0; d < D; d += step) {
    const float gd = grad_y<K>(w, g, d, round) * gamma[d];
    a += gd;
    c += gd * (x[r * D + d] - mean) * rstd;
  }
  *sum_g = a;
  *sum_gx = c;
}

// gx for this thread's d of row r (with `accumulate` added to gx, the streams' gradient cell of
// stream_grad.h, without a fused multiply-add), and its columns' shares of gγ, gβ, gW added into
// part ([gγ (D), gβ (D), gW (D·K)], the block's).
template <int K>
PLEXUS_DEVICE void backward_row(const float* x, const float* gamma, const float* beta, const float* w, const float* g,
                                float* gx, float* part, long long r, long long D, float mean, float rstd, float mean_g,
                                float mean_gx, bool round, long long d0, long long step, bool accumulate) {
  for (long long d = d0; d < D; d += step) {
    const float gy = grad_y<K>(w, g, d, round);
    const float xh = (x[r * D + d] - mean) * rstd;
    const float v = rstd * (gy * gamma[d] - mean_g - xh * mean_gx);
    gx[r * D + d] = accumulate ? plexus_add_rn(gx[r * D + d], v) : v;
    part[d] += gy * xh;
    part[D + d] += gy;
    const float y = rho(xh * gamma[d] + beta[d], round);
#pragma unroll
    for (int k = 0; k < K; ++k) part[2 * D + d * K + k] += y * g[k];
  }
}

}  // namespace plexus_norm_project

#ifndef PLEXUS_KERNELS_ON_HOST
#define PLEXUS_NP_K (PLEXUS_N + 2)

// One block per row (blockIdx.x): z [R, K] fp32 (bf16 values when `round`), mean and rstd [R].
extern "C" __global__ void __launch_bounds__(PLEXUS_NORM_THREADS)
    plexus_norm_project_forward(const float* x, const float* gamma, const float* beta, const float* w, float* z,
                                float* mean_out, float* rstd_out, long long D, float eps, int round) {
  const long long r = blockIdx.x;
  const float mean = norm_block_sum(plexus_norms::row_sum(x, r, D, threadIdx.x, blockDim.x)) / (float)D;
  const float var = norm_block_sum(plexus_norms::row_sq(x, r, D, mean, threadIdx.x, blockDim.x)) / (float)D;
  const float rstd = rsqrtf(var + eps);
  float part[PLEXUS_NP_K];
  plexus_norm_project::forward_partial<PLEXUS_NP_K>(x, gamma, beta, w, r, D, mean, rstd, round != 0, threadIdx.x,
                                                    blockDim.x, part);
  __shared__ float sums[PLEXUS_NP_K];
  block_sum_of<PLEXUS_NP_K, PLEXUS_NORM_THREADS>(part, sums);  // streams.cu
  __syncthreads();
  if (threadIdx.x == 0) {
#pragma unroll
    for (int k = 0; k < PLEXUS_NP_K; ++k) z[r * PLEXUS_NP_K + k] = plexus_norm_project::rho(sums[k], round != 0);
    mean_out[r] = mean;
    rstd_out[r] = rstd;
  }
}

// One block per `rows` rows: gx [R, D] (written, or with `accumulate` added to), part
// [blocks, 2·D + D·K] (zeroed by the caller).
extern "C" __global__ void __launch_bounds__(PLEXUS_NORM_THREADS)
    plexus_norm_project_backward(const float* x, const float* gamma, const float* beta, const float* w,
                                 const float* gz, const float* mean_in, const float* rstd_in, float* gx, float* part,
                                 long long R, long long D, long long rows, int round, int accumulate) {
  float* p = part + (long long)blockIdx.x * (2 * D + D * PLEXUS_NP_K);
  const long long end = (blockIdx.x + 1) * rows < R ? (blockIdx.x + 1) * rows : R;
  for (long long r = blockIdx.x * rows; r < end; ++r) {
    const float mean = mean_in[r], rstd = rstd_in[r];
    float g[PLEXUS_NP_K];
    plexus_norm_project::load_gz<PLEXUS_NP_K>(gz, r, round != 0, g);
    float sg = 0.0f, sgx = 0.0f;
    plexus_norm_project::backward_sums<PLEXUS_NP_K>(x, gamma, w, g, r, D, mean, rstd, round != 0, threadIdx.x,
                                                    blockDim.x, &sg, &sgx);
    const float mean_g = norm_block_sum(sg) / (float)D;
    const float mean_gx = norm_block_sum(sgx) / (float)D;
    plexus_norm_project::backward_row<PLEXUS_NP_K>(x, gamma, beta, w, g, gx, p, r, D, mean, rstd, mean_g, mean_gx,
                                                   round != 0, threadIdx.x, blockDim.x, accumulate != 0);
  }
}
#undef PLEXUS_NP_K
#endif
