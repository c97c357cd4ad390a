// The multi-stream topologies' read and write (Hyper-Connections, mHC) on a CUDA GPU: one block per
// token, its threads over the width D, each thread's share of the n streams in registers. One
// kernel each way replaces a batched matmul of thousands of [1, n] × [n, D] (read) or [n, n] × [n, D]
// (write) products and, for the write, an addcmul over the whole [.., n, D] output; backward, the
// batched products' transposes, two broadcast products and their sums.
//
//   read:   u[d]     = Σ_s pre[s] H[s, d]                        gH[s, d] = pre[s] gu[d]  (or += it)
//                                                               gpre[s]  = Σ_d H[s, d] gu[d]
//   write:  H'[t, d] = Σ_s res[s, t] H[s, d] + post[t] o[d]      gH[s, d] = Σ_t res[s, t] g[t, d]
//                                                               go[d]    = Σ_t post[t] g[t, d]
//                                                               gres[s, t] = Σ_d H[s, d] g[t, d]
//                                                               gpost[t] = Σ_d o[d] g[t, d]
//
// for every token m (H [M, n, D], u and o [M, D]); the mixing weights are per token (pre [M, n],
// res [M, n, n], post [M, n]) or shared (static: [n], [n, n], [n], read with stride 0). The weights'
// gradients are per token; for static weights the caller sums them over the tokens.
//
// Compiled like sinkhorn.cu, in the same NVRTC program (with PLEXUS_N and PLEXUS_STREAM_THREADS,
// the block size; and as plain C++ with PLEXUS_KERNELS_ON_HOST, where a
// "thread" is the loop over d = d0, d0 + step, … and its partial sums are the whole sums: the tests
// run exactly that arithmetic on the CPU). On the GPU, the block adds its threads' partial sums
// (`block_sum`), which only the first-use check on a GPU exercises.

// PLEXUS_DEVICE: from cuda_prelude.cuh.

namespace plexus_streams {

// u[m, d] for d = d0, d0 + step, …
template <typename T, int N>
PLEXUS_DEVICE void read_forward(const T* h, const T* pre, T* u, long long m, long long D, bool per_token, long long d0,
                                long long step) {
  const T* p = pre + (per_token ? m * N : 0);
  T w[N];
#pragma unroll
  for (int s = 0; s < N; ++s) w[s] = p[s];
  const T* hm = h + m * N * D;
  for (long long d = d0; d < D; d += step) {
    T acc = w[0] * hm[d];
#pragma unroll
    for (int s = 1; s < N; ++s) acc += w[s] * hm[s * D + d];
    u[m * D + d] = acc;
  }
}

// gH[m] for this thread's d, and its partial sums of gpre[m] in part[N]. With `accumulate`, gH[m]
// is added to what gh holds (the streams' gradient cell, stream_grad.h), the product rounded
// before the sum as a separate addition would (plexus_add_rn: no fused multiply-add).
template <typename T, int N>
PLEXUS_DEVICE void read_backward(const T* h, const T* pre, const T* gu, T* gh, long long m, long long D,
                                 bool per_token, long long d0, long long step, T* part, bool accumulate) {
  const T* p = pre + (per_token ? m * N : 0);
  T w[N];
#pragma unroll
  for (int s = 0; s < N; ++s) {
    w[s] = p[s];
    part[s] = T(0);
  }
  const T* hm = h + m * N * D;
  T* ghm = gh + m * N * D;
  for (long long d = d0; d < D; d += step) {
    const T g = gu[m * D + d];
#pragma unroll
    for (int s = 0; s < N; ++s) {
      ghm[s * D + d] = accumulate ? plexus_add_rn(ghm[s * D + d], w[s] * g) : w[s] * g;
      part[s] += hm[s * D + d] * g;
    }
  }
}

// H'[m] for this thread's d.
template <typename T, int N>
PLEXUS_DEVICE void write_forward(const T* h, const T* res, const T* post, const T* o, T* out, long long m, long long D,
                                 bool per_token, long long d0, long long step) {
  const T* r = res + (per_token ? m * N * N : 0);
  const T* p = post + (per_token ? m * N : 0);
  T rw[N * N], pw[N];
#pragma unroll
  for (int e = 0; e < N * N; ++e) rw[e] = r[e];
#pragma unroll
  for (int t = 0; t < N; ++t) pw[t] = p[t];
  const T* hm = h + m * N * D;
  T* om = out + m * N * D;
  for (long long d = d0; d < D; d += step) {
    T x[N];
#pragma unroll
    for (int s = 0; s < N; ++s) x[s] = hm[s * D + d];
    const T od = o[m * D + d];
#pragma unroll
    for (int t = 0; t < N; ++t) {
      T acc = pw[t] * od;
#pragma unroll
      for (int s = 0; s < N; ++s) acc += rw[s * N + t] * x[s];
      om[t * D + d] = acc;
    }
  }
}

// gH[m] and go[m] for this thread's d, and its partial sums of gres[m] (part[0, N²)) and gpost[m]
// (part[N², N² + N)).
template <typename T, int N>
PLEXUS_DEVICE void write_backward(const T* h, const T* res, const T* post, const T* o, const T* g, T* gh, T* go,
                                  long long m, long long D, bool per_token, long long d0, long long step, T* part) {
  const T* r = res + (per_token ? m * N * N : 0);
  const T* p = post + (per_token ? m * N : 0);
  T rw[N * N], pw[N];
#pragma unroll
  for (int e = 0; e < N * N; ++e) {
    rw[e] = r[e];
    part[e] = T(0);
  }
#pragma unroll
  for (int t = 0; t < N; ++t) {
    pw[t] = p[t];
    part[N * N + t] = T(0);
  }
  const T* hm = h + m * N * D;
  const T* gm = g + m * N * D;
  T* ghm = gh + m * N * D;
  for (long long d = d0; d < D; d += step) {
    T x[N], gt[N];
#pragma unroll
    for (int s = 0; s < N; ++s) {
      x[s] = hm[s * D + d];
      gt[s] = gm[s * D + d];
    }
    const T od = o[m * D + d];
    T god = T(0);
#pragma unroll
    for (int t = 0; t < N; ++t) {
      god += pw[t] * gt[t];
      part[N * N + t] += od * gt[t];
    }
    go[m * D + d] = god;
#pragma unroll
    for (int s = 0; s < N; ++s) {
      T acc = T(0);
#pragma unroll
      for (int t = 0; t < N; ++t) {
        acc += rw[s * N + t] * gt[t];
        part[s * N + t] += x[s] * gt[t];
      }
      ghm[s * D + d] = acc;
    }
  }
}

}  // namespace plexus_streams

#ifndef PLEXUS_KERNELS_ON_HOST
// The sum over a block of THREADS threads of each thread's K partial sums, into out[K] (every
// thread of the block calls it; out[k] is written by thread k, so a reader in another thread waits
// for __syncthreads).
template <int K, int THREADS>
__device__ __forceinline__ void block_sum_of(float* part, float* out) {
  __shared__ float warps[THREADS / 32][K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    float v = part[k];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    part[k] = v;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < K; ++k) warps[warp][k] = part[k];
  }
  __syncthreads();
  for (int k = threadIdx.x; k < K; k += blockDim.x) {
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < THREADS / 32; ++w) s += warps[w][k];
    out[k] = s;
  }
}

// block_sum_of for the stream kernels' blocks.
template <int K>
__device__ __forceinline__ void block_sum(float* part, float* out) {
  block_sum_of<K, PLEXUS_STREAM_THREADS>(part, out);
}

// One block of PLEXUS_STREAM_THREADS threads per token (blockIdx.x), threads over d.
extern "C" __global__ void __launch_bounds__(PLEXUS_STREAM_THREADS)
    plexus_stream_read(const float* h, const float* pre, float* u, long long D, int per_token) {
  plexus_streams::read_forward<float, PLEXUS_N>(h, pre, u, blockIdx.x, D, per_token != 0, threadIdx.x, blockDim.x);
}

extern "C" __global__ void __launch_bounds__(PLEXUS_STREAM_THREADS)
    plexus_stream_read_backward(const float* h, const float* pre, const float* gu, float* gh, float* gpre, long long D,
                                int per_token, int accumulate) {
  float part[PLEXUS_N];
  plexus_streams::read_backward<float, PLEXUS_N>(h, pre, gu, gh, blockIdx.x, D, per_token != 0, threadIdx.x,
                                                 blockDim.x, part, accumulate != 0);
  block_sum<PLEXUS_N>(part, gpre + (long long)blockIdx.x * PLEXUS_N);
}

extern "C" __global__ void __launch_bounds__(PLEXUS_STREAM_THREADS)
    plexus_stream_write(const float* h, const float* res, const float* post, const float* o, float* out, long long D,
                        int per_token) {
  plexus_streams::write_forward<float, PLEXUS_N>(h, res, post, o, out, blockIdx.x, D, per_token != 0, threadIdx.x,
                                                 blockDim.x);
}

// gws: [M, N² + N], the token's gres (N², row-major [s, t]) then gpost (N).
extern "C" __global__ void __launch_bounds__(PLEXUS_STREAM_THREADS)
    plexus_stream_write_backward(const float* h, const float* res, const float* post, const float* o, const float* g,
                                 float* gh, float* go, float* gws, long long D, int per_token) {
  float part[PLEXUS_N * PLEXUS_N + PLEXUS_N];
  plexus_streams::write_backward<float, PLEXUS_N>(h, res, post, o, g, gh, go, blockIdx.x, D, per_token != 0,
                                                  threadIdx.x, blockDim.x, part);
  block_sum<PLEXUS_N * PLEXUS_N + PLEXUS_N>(part, gws + (long long)blockIdx.x * (PLEXUS_N * PLEXUS_N + PLEXUS_N));
}
#endif
