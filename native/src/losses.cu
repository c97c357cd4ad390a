// The language-model loss on a CUDA GPU: the mean cross-entropy of logits [N, V] (bf16 or fp32)
// against targets [N], one block per row, each pass reading the logits once. Forward, the row's
// log-sum-exp by an online softmax (a running maximum and the sum of exp(x − max), rescaled when the
// maximum grows) and the row's loss lse − x[target]; backward, the gradient
// (exp(x − lse) − [j = target]) · g/N written straight into the logits' dtype. No fp32 copy of the
// logits, no log_softmax output saved: what losses.cpp's chunked composite path writes, saves and
// reads again (three fp32 copies of every chunk) is gone. fp32 arithmetic throughout, as
// autocast's cross_entropy.
//
// Compiled like streams.cu, in the same NVRTC program (PLEXUS_LOSS_THREADS: the block size), and as
// plain C++ with PLEXUS_KERNELS_ON_HOST, where a "thread" is the loop over j = j0, j0 + step, …:
// the tests run that arithmetic on the CPU (cuda_kernels.cpp, `plexus_cross_entropy_host`), with
// the threads' partial states combined in thread order (on the GPU, a tree of warp shuffles).
//
// A target outside 0..V gives the row a NaN loss (and the step a non-finite loss, which the
// trainer reports), where libtorch's kernel would stop the device with an assertion.

// PLEXUS_DEVICE: from cuda_prelude.cuh.

namespace plexus_losses {

// bf16 ↔ fp32 as c10::BFloat16: a bf16 is the top half of an fp32; rounding to nearest, ties to
// even, NaN to the canonical quiet NaN.
PLEXUS_DEVICE float bf16_to_float(unsigned short b) { return plexus_bits_float(static_cast<unsigned int>(b) << 16); }

PLEXUS_DEVICE unsigned short float_to_bf16(float f) {
  if (f != f) return 0x7FC0;
  const unsigned int u = plexus_float_bits(f);
  return static_cast<unsigned short>((u + (((u >> 16) & 1u) + 0x7FFFu)) >> 16);
}

PLEXUS_DEVICE float load(const unsigned short* x, long long i) { return bf16_to_float(x[i]); }
PLEXUS_DEVICE float load(const float* x, long long i) { return x[i]; }
PLEXUS_DEVICE void store(unsigned short* x, long long i, float v) { x[i] = float_to_bf16(v); }
PLEXUS_DEVICE void store(float* x, long long i, float v) { x[i] = v; }

// An online softmax state: the largest value seen and the sum of exp(x − max) over what was seen.
struct Online {
  float max;
  float sum;
};

PLEXUS_DEVICE Online online_empty() { return Online{-PLEXUS_INFINITY, 0.0f}; }

PLEXUS_DEVICE Online online_merge(Online a, Online b) {
  if (b.max == -PLEXUS_INFINITY) return a;
  if (a.max == -PLEXUS_INFINITY) return b;
  const float m = a.max > b.max ? a.max : b.max;
  return Online{m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

// This thread's state over row r's j = j0, j0 + step, … (x [N, V]).
template <typename T>
PLEXUS_DEVICE Online row_online(const T* x, long long r, long long V, long long j0, long long step) {
  Online s = online_empty();
  const T* row = x + r * V;
  for (long long j = j0; j < V; j += step) {
    const float v = load(row, j);
    if (v > s.max) {
      s.sum = s.sum * expf(s.max - v) + 1.0f;  // exp(−inf) = 0 on the first element
      s.max = v;
    } else {
      s.sum += expf(v - s.max);
    }
  }
  return s;
}

// Row r's log-sum-exp from the block's merged state, and its loss lse − x[target] (NaN for a target
// outside 0..V).
template <typename T>
PLEXUS_DEVICE void row_finish(const T* x, const long long* target, float* lse, float* loss, long long r, long long V,
                              Online s) {
  const float l = s.max + logf(s.sum);
  lse[r] = l;
  const long long t = target[r];
  loss[r] = (t >= 0 && t < V) ? l - load(x + r * V, t) : PLEXUS_NAN;
}

// This thread's share of row r's gradient: (exp(x − lse) − [j = target]) · scale.
template <typename T>
PLEXUS_DEVICE void row_backward(const T* x, const long long* target, const float* lse, float scale, T* grad,
                                long long r, long long V, long long j0, long long step) {
  const T* row = x + r * V;
  T* g = grad + r * V;
  const float l = lse[r];
  const long long t = target[r];
  for (long long j = j0; j < V; j += step) {
    const float p = expf(load(row, j) - l);
    store(g, j, (j == t ? p - 1.0f : p) * scale);
  }
}

}  // namespace plexus_losses

#ifndef PLEXUS_KERNELS_ON_HOST
// The block's merge of every thread's state (every thread of the block calls it; thread 0 gets it).
__device__ __forceinline__ plexus_losses::Online block_online(plexus_losses::Online s) {
  __shared__ float maxes[PLEXUS_LOSS_THREADS / 32], sums[PLEXUS_LOSS_THREADS / 32];
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const plexus_losses::Online o{__shfl_xor_sync(0xffffffffu, s.max, off), __shfl_xor_sync(0xffffffffu, s.sum, off)};
    s = plexus_losses::online_merge(s, o);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    maxes[warp] = s.max;
    sums[warp] = s.sum;
  }
  __syncthreads();
  plexus_losses::Online all = plexus_losses::online_empty();
  if (threadIdx.x == 0) {
#pragma unroll
    for (int w = 0; w < PLEXUS_LOSS_THREADS / 32; ++w) all = plexus_losses::online_merge(all, {maxes[w], sums[w]});
  }
  return all;
}

// One block of PLEXUS_LOSS_THREADS threads per row (blockIdx.x): lse [N] and loss [N] (fp32).
#define PLEXUS_CE_KERNELS(SUFFIX, T)                                                                                 \
  extern "C" __global__ void __launch_bounds__(PLEXUS_LOSS_THREADS)                                                   \
      plexus_cross_entropy_forward_##SUFFIX(const T* x, const long long* target, float* lse, float* loss, long long V) { \
    const long long r = blockIdx.x;                                                                                   \
    const plexus_losses::Online s = block_online(plexus_losses::row_online(x, r, V, threadIdx.x, blockDim.x));      \
    if (threadIdx.x == 0) plexus_losses::row_finish(x, target, lse, loss, r, V, s);                                  \
  }                                                                                                                   \
  /* scale: one fp32 on the device (g/N), read there, so that a captured step reads it at replay. */                 \
  extern "C" __global__ void __launch_bounds__(PLEXUS_LOSS_THREADS) plexus_cross_entropy_backward_##SUFFIX(         \
      const T* x, const long long* target, const float* lse, const float* scale, T* grad, long long V) {             \
    plexus_losses::row_backward(x, target, lse, *scale, grad, blockIdx.x, V, threadIdx.x, blockDim.x);              \
  }

PLEXUS_CE_KERNELS(bf16, unsigned short)
PLEXUS_CE_KERNELS(f32, float)
#undef PLEXUS_CE_KERNELS
#endif
