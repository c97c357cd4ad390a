// Rotary position embedding of queries or keys on a CUDA GPU, fused with the split into heads: x
// [B, T, H·hd] (its token rows `stride` elements apart: a q or k column block of a packed qkv
// projection is read where it is) → y [B, H, T, hd] contiguous, the layout SDPA takes, in one kernel;
// backward one kernel from gy [B, H, T, hd] to gx [B, T, H·hd]. libtorch runs a transpose, a product,
// a roll (a copy) and an addcmul forward, and their backwards.
//
//   y[j] = x[j]·cos[t, j] + x[p(j)]·sin[t, j],   p(j) = (j + hd/2) mod hd   (rotate-half, the sign in sin)
//   gx[k] = gy[k]·cos[t, k] + gy[p(k)]·sin[t, p(k)]                         (p is its own inverse)
//
// The tables are Rope's (`[T_max, hd]` in the tensors' dtype, rows 0..T read). fp32 arithmetic, one
// rounding per output (libtorch rounds x·cos first: one bf16 unit apart at most). Elementwise,
// compiled like activations.cu.

// PLEXUS_DEVICE, load/store: from cuda_prelude.cuh and losses.cu.

namespace plexus_rope {

template <typename T>
PLEXUS_DEVICE void rope_forward(const T* x, const T* cs, const T* sn, T* y, long long B, long long Tn, long long H,
                                long long hd, long long stride, long long i0, long long step) {
  const long long n = B * H * Tn * hd, half = hd / 2;
  for (long long i = i0; i < n; i += step) {
    const long long j = i % hd, bht = i / hd, t = bht % Tn, bh = bht / Tn, h = bh % H, b = bh / H;
    const T* row = x + (b * Tn + t) * stride + h * hd;
    const long long p = j < half ? j + half : j - half;
    const float v = plexus_losses::load(row, j) * plexus_losses::load(cs, t * hd + j) +
                    plexus_losses::load(row, p) * plexus_losses::load(sn, t * hd + j);
    plexus_losses::store(y, i, v);
  }
}

template <typename T>
PLEXUS_DEVICE void rope_backward(const T* gy, const T* cs, const T* sn, T* gx, long long B, long long Tn, long long H,
                                 long long hd, long long i0, long long step) {
  const long long n = B * Tn * H * hd, half = hd / 2;
  for (long long i = i0; i < n; i += step) {
    const long long j = i % hd, bth = i / hd, h = bth % H, bt = bth / H, t = bt % Tn, b = bt / Tn;
    const T* g = gy + ((b * H + h) * Tn + t) * hd;
    const long long p = j < half ? j + half : j - half;
    const float v = plexus_losses::load(g, j) * plexus_losses::load(cs, t * hd + j) +
                    plexus_losses::load(g, p) * plexus_losses::load(sn, t * hd + p);
    plexus_losses::store(gx, i, v);
  }
}

}  // namespace plexus_rope

#ifndef PLEXUS_KERNELS_ON_HOST
#define PLEXUS_ROPE_KERNELS(SUFFIX, T)                                                                             \
  extern "C" __global__ void __launch_bounds__(PLEXUS_LOSS_THREADS) plexus_rope_forward_##SUFFIX(                 \
      const T* x, const T* cs, const T* sn, T* y, long long B, long long Tn, long long H, long long hd,            \
      long long stride) {                                                                                           \
    plexus_rope::rope_forward(x, cs, sn, y, B, Tn, H, hd, stride, (long long)blockIdx.x * blockDim.x + threadIdx.x, \
                              (long long)gridDim.x * blockDim.x);                                                   \
  }                                                                                                                 \
  extern "C" __global__ void __launch_bounds__(PLEXUS_LOSS_THREADS) plexus_rope_backward_##SUFFIX(                \
      const T* gy, const T* cs, const T* sn, T* gx, long long B, long long Tn, long long H, long long hd) {          \
    plexus_rope::rope_backward(gy, cs, sn, gx, B, Tn, H, hd, (long long)blockIdx.x * blockDim.x + threadIdx.x,     \
                               (long long)gridDim.x * blockDim.x);                                                  \
  }

PLEXUS_ROPE_KERNELS(bf16, unsigned short)
PLEXUS_ROPE_KERNELS(f32, float)
#undef PLEXUS_ROPE_KERNELS
#endif
