// SwiGLU's gate on a CUDA GPU: h = silu(g) · u for the gate and up projections g, u (bf16 or fp32,
// LLaMA's MLP), one kernel forward and one backward, where libtorch runs silu, then the product
// (and keeps silu(g) for backward), and backward two products and silu's backward:
//
//   σ = 1/(1 + e^−g),   h = g·σ·u,   gu = gh · g·σ,   gg = gh · u · σ · (1 + g·(1 − σ))
//
// fp32 arithmetic and one rounding to the tensors' dtype per output (libtorch rounds silu(g) to
// bf16 before the product: the two differ by at most one bf16 unit). Elementwise, so a "thread" on
// the host is the loop over i = i0, i0 + step, …; the same functions run on the GPU (a grid-stride
// loop). Compiled like losses.cu.

// PLEXUS_DEVICE, load/store: from cuda_prelude.cuh and losses.cu.

namespace plexus_activations {

template <typename T>
PLEXUS_DEVICE void swiglu_forward(const T* g, const T* u, T* h, long long n, long long i0, long long step) {
  for (long long i = i0; i < n; i += step) {
    const float x = plexus_losses::load(g, i);
    const float s = x / (1.0f + expf(-x));
    plexus_losses::store(h, i, s * plexus_losses::load(u, i));
  }
}

template <typename T>
PLEXUS_DEVICE void swiglu_backward(const T* g, const T* u, const T* gh, T* gg, T* gu, long long n, long long i0,
                                   long long step) {
  for (long long i = i0; i < n; i += step) {
    const float x = plexus_losses::load(g, i), y = plexus_losses::load(u, i), d = plexus_losses::load(gh, i);
    const float sig = 1.0f / (1.0f + expf(-x));
    plexus_losses::store(gu, i, d * x * sig);
    plexus_losses::store(gg, i, d * y * sig * (1.0f + x * (1.0f - sig)));
  }
}

}  // namespace plexus_activations

#ifndef PLEXUS_KERNELS_ON_HOST
#define PLEXUS_SWIGLU_KERNELS(SUFFIX, T)                                                                         \
  extern "C" __global__ void __launch_bounds__(PLEXUS_LOSS_THREADS)                                               \
      plexus_swiglu_forward_##SUFFIX(const T* g, const T* u, T* h, long long n) {                                 \
    plexus_activations::swiglu_forward(g, u, h, n, (long long)blockIdx.x * blockDim.x + threadIdx.x,               \
                                       (long long)gridDim.x * blockDim.x);                                         \
  }                                                                                                               \
  extern "C" __global__ void __launch_bounds__(PLEXUS_LOSS_THREADS)                                               \
      plexus_swiglu_backward_##SUFFIX(const T* g, const T* u, const T* gh, T* gg, T* gu, long long n) {           \
    plexus_activations::swiglu_backward(g, u, gh, gg, gu, n, (long long)blockIdx.x * blockDim.x + threadIdx.x,     \
                                        (long long)gridDim.x * blockDim.x);                                        \
  }

PLEXUS_SWIGLU_KERNELS(bf16, unsigned short)
PLEXUS_SWIGLU_KERNELS(f32, float)
#undef PLEXUS_SWIGLU_KERNELS
#endif
