// Shared by plexus' CUDA kernel sources (sinkhorn.cu, streams.cu, losses.cu), which NVRTC compiles as one
// program with this first (build.rs concatenates them) and cuda_kernels.cpp includes as plain C++
// with PLEXUS_KERNELS_ON_HOST defined: their per-thread functions are device functions in one, and
// inline host functions in the other.

#ifdef PLEXUS_KERNELS_ON_HOST
#define PLEXUS_DEVICE inline
#else
#define PLEXUS_DEVICE __device__ __forceinline__
#endif

// fp32 bits, infinity and NaN: the CUDA intrinsics on the GPU, the standard library on the host
// (NVRTC has neither <cstring> nor <limits>).
#ifdef PLEXUS_KERNELS_ON_HOST
#include <cmath>
#include <cstring>
#include <limits>
inline float plexus_bits_float(unsigned int u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline unsigned int plexus_float_bits(float f) {
  unsigned int u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
#define PLEXUS_INFINITY (std::numeric_limits<float>::infinity())
#define PLEXUS_NAN (std::numeric_limits<float>::quiet_NaN())
#else
__device__ __forceinline__ float plexus_bits_float(unsigned int u) { return __uint_as_float(u); }
__device__ __forceinline__ unsigned int plexus_float_bits(float f) { return __float_as_uint(f); }
#define PLEXUS_INFINITY __int_as_float(0x7f800000)
#define PLEXUS_NAN __int_as_float(0x7fffffff)
#endif

// a + b, never contracted with a product in b into a fused multiply-add: a kernel that adds its
// gradient into another's (stream_grad.h) rounds as autograd's separate addition did. (The host
// build targets baseline x86-64, which has no fused multiply-add.)
#ifdef PLEXUS_KERNELS_ON_HOST
template <typename T>
inline T plexus_add_rn(T a, T b) {
  return a + b;
}
#else
__device__ __forceinline__ float plexus_add_rn(float a, float b) { return __fadd_rn(a, b); }
#endif
