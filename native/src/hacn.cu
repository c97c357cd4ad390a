// H-ACN's update of one unit with its long path, on a CUDA GPU: for the stream x and the long
// path's running sum acc (fp32) and the unit's output h (bf16 or fp32), with the unit's residual
// weight a (one fp32 on the device),
//
//   forward:   x' = h + a·x,   acc' = acc + h
//   backward:  gx = a·gx',   gacc = gacc',   gh = ρ(gx' + gacc'),   ga = Σ gx'·x
//
// in one pass each way (ρ: rounding to h's dtype). The composite casts h to fp32 (a kernel and an
// fp32 copy), then runs an addcmul and an add; backward, the addcmul's gradients (a product, and a
// product and a sum for ga), the accumulation of h's two fp32 gradients and their cast back: per
// element about 30 bytes moved forward and 42 backward, here 18 and 22. h's two gradients are
// added in fp32 and rounded once, as the composite does (so the numbers are the composite's up to
// the order of ga's sum).
//
// Elementwise with a grid-stride loop, compiled like activations.cu; backward, each block's share
// of ga summed in the block (block_sum_of, streams.cu) into ga_part[block], which the caller adds.
// As plain C++ with PLEXUS_KERNELS_ON_HOST the same functions run over i0 = 0, step = 1.

// PLEXUS_DEVICE, load/store: from cuda_prelude.cuh and losses.cu.

namespace plexus_hacn {

template <typename T>
PLEXUS_DEVICE void forward(const float* x, const float* acc, const T* h, float a, float* xo, float* acco, long long n,
                           long long i0, long long step) {
  for (long long i = i0; i < n; i += step) {
    const float hv = plexus_losses::load(h, i);
    xo[i] = hv + a * x[i];
    acco[i] = acc[i] + hv;
  }
}

// gx and gh for this thread's elements; returns its share of ga. gacc_out may be null (zero).
template <typename T>
PLEXUS_DEVICE float backward(const float* x, const float* gx_out, const float* gacc_out, float a, float* gx, T* gh,
                             long long n, long long i0, long long step) {
  float ga = 0.0f;
  for (long long i = i0; i < n; i += step) {
    const float g = gx_out[i];
    gx[i] = a * g;
    plexus_losses::store(gh, i, gacc_out != nullptr ? g + gacc_out[i] : g);
    ga += g * x[i];
  }
  return ga;
}

}  // namespace plexus_hacn

#ifndef PLEXUS_KERNELS_ON_HOST
#define PLEXUS_HACN_KERNELS(SUFFIX, T)                                                                              \
  extern "C" __global__ void __launch_bounds__(PLEXUS_LOSS_THREADS) plexus_hacn_forward_##SUFFIX(                   \
      const float* x, const float* acc, const T* h, const float* a, float* xo, float* acco, long long n) {          \
    plexus_hacn::forward(x, acc, h, *a, xo, acco, n, (long long)blockIdx.x * blockDim.x + threadIdx.x,              \
                         (long long)gridDim.x * blockDim.x);                                                         \
  }                                                                                                                  \
  /* gacc_out may be null; ga_part [gridDim.x]. */                                                                   \
  extern "C" __global__ void __launch_bounds__(PLEXUS_LOSS_THREADS) plexus_hacn_backward_##SUFFIX(                  \
      const float* x, const float* gx_out, const float* gacc_out, const float* a, float* gx, T* gh, float* ga_part,  \
      long long n) {                                                                                                 \
    float part[1] = {plexus_hacn::backward(x, gx_out, gacc_out, *a, gx, gh, n,                                      \
                                           (long long)blockIdx.x * blockDim.x + threadIdx.x,                          \
                                           (long long)gridDim.x * blockDim.x)};                                      \
    float total = 0.0f;                                                                                              \
    block_sum_of<1, PLEXUS_LOSS_THREADS>(part, &total);                                                              \
    if (threadIdx.x == 0) ga_part[blockIdx.x] = total;                                                               \
  }

PLEXUS_HACN_KERNELS(bf16, unsigned short)
PLEXUS_HACN_KERNELS(f32, float)
#undef PLEXUS_HACN_KERNELS
#endif
