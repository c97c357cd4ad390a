// Shared by plexus' CUDA kernel sources (sinkhorn.cu, streams.cu), which NVRTC compiles as one
// program with this first (build.rs concatenates them) and cuda_kernels.cpp includes as plain C++
// with PLEXUS_KERNELS_ON_HOST defined: their per-thread functions are device functions in one, and
// inline host functions in the other.

#ifdef PLEXUS_KERNELS_ON_HOST
#define PLEXUS_DEVICE inline
#else
#define PLEXUS_DEVICE __device__ __forceinline__
#endif
