// mHC's Sinkhorn–Knopp on a CUDA GPU: one thread per token, its n×n matrix in registers, the whole
// iteration one kernel forward and one backward (the composite graph launches 4·iters kernels
// forward and more backward, most of mHC's step on a GPU).
//
// This file is compiled two ways:
// * at run time with NVRTC (native/src/cuda_kernels.cpp, one program with streams.cu), with PLEXUS_N
//   the number of streams, into the two `extern "C"` kernels at the bottom (NVRTC has no standard
//   headers: built-ins only);
// * into the native library as plain C++, with PLEXUS_KERNELS_ON_HOST defined, where the per-token
//   functions below run on the CPU: the tests check exactly this arithmetic against an fp64
//   log-domain reference (tests in src/topology/mhc.rs), and on a GPU the first use of each n checks
//   the kernels' results against these functions in double (`self_check` in cuda_kernels.cpp).
//
// The arithmetic is that of the CPU kernels (stream_kernels.cpp): x = exp(L − rowmax) (normalising
// the rows first makes the result independent of a per-row shift, and the shift has no gradient),
// then iters × (rows, columns), each line scaled by 1 / its sum (a sum of 0, every entry
// underflowed, leaves the line 0).
//
// The backward recomputes the forward, keeping only each normalisation's n line sums (in a global
// scratch laid out [2·iters·n, M], so a warp's accesses are contiguous), and walks back from the
// final matrix: the state before a normalisation is the state after it times the line sums, and
// the gradient goes through y = x ⊙ inv as g ← (g − ⟨g, y⟩_line) ⊙ inv.

// PLEXUS_DEVICE: from cuda_prelude.cuh.

namespace plexus_sinkhorn {

PLEXUS_DEVICE float exp_(float x) { return expf(x); }
PLEXUS_DEVICE double exp_(double x) { return exp(x); }

// Entry (a, b) of line a: row a (ROWS) or column a.
template <int N, bool ROWS>
PLEXUS_DEVICE int at(int a, int b) {
  return ROWS ? a * N + b : b * N + a;
}

// x[e] = exp(L[e] − its row's maximum), for token m of logits [M, N, N].
template <typename T, int N>
PLEXUS_DEVICE void load(const T* logits, long long m, T* x) {
  const T* l = logits + m * (N * N);
#pragma unroll
  for (int i = 0; i < N; ++i) {
    T mx = l[i * N];
#pragma unroll
    for (int j = 1; j < N; ++j) mx = l[i * N + j] > mx ? l[i * N + j] : mx;
#pragma unroll
    for (int j = 0; j < N; ++j) x[i * N + j] = exp_(l[i * N + j] - mx);
  }
}

// One normalisation of every row (ROWS) or column; s[a] = the sum of line a before it.
template <typename T, int N, bool ROWS>
PLEXUS_DEVICE void step(T* x, T* s) {
#pragma unroll
  for (int a = 0; a < N; ++a) {
    T sum = x[at<N, ROWS>(a, 0)];
#pragma unroll
    for (int b = 1; b < N; ++b) sum += x[at<N, ROWS>(a, b)];
    s[a] = sum;
    const T inv = sum > T(0) ? T(1) / sum : T(1);
#pragma unroll
    for (int b = 0; b < N; ++b) x[at<N, ROWS>(a, b)] *= inv;
  }
}

// The backward of one normalisation whose line sums were s, given y (the state after it, turned
// into the state before it here) and g (the gradient of y, turned into that of x).
template <typename T, int N, bool ROWS>
PLEXUS_DEVICE void step_backward(T* y, T* g, const T* s) {
#pragma unroll
  for (int a = 0; a < N; ++a) {
    T dot = g[at<N, ROWS>(a, 0)] * y[at<N, ROWS>(a, 0)];
#pragma unroll
    for (int b = 1; b < N; ++b) dot += g[at<N, ROWS>(a, b)] * y[at<N, ROWS>(a, b)];
    const bool positive = s[a] > T(0);
    const T inv = positive ? T(1) / s[a] : T(1);
    const T back = positive ? s[a] : T(1);
#pragma unroll
    for (int b = 0; b < N; ++b) {
      g[at<N, ROWS>(a, b)] = (g[at<N, ROWS>(a, b)] - dot) * inv;
      y[at<N, ROWS>(a, b)] *= back;
    }
  }
}

// P = Sinkhorn(exp(L)) for token m: logits and out [M, N, N].
template <typename T, int N>
PLEXUS_DEVICE void forward_token(const T* logits, T* out, long long m, int iters) {
  T x[N * N], s[N];
  load<T, N>(logits, m, x);
  for (int k = 0; k < iters; ++k) {
    step<T, N, true>(x, s);
    step<T, N, false>(x, s);
  }
  T* o = out + m * (N * N);
#pragma unroll
  for (int e = 0; e < N * N; ++e) o[e] = x[e];
}

// The gradient of the logits of token m, grad_logits [M, N, N], from that of P, grad [M, N, N];
// sums: scratch of 2·iters·N·M values.
template <typename T, int N>
PLEXUS_DEVICE void backward_token(const T* logits, const T* grad, T* grad_logits, T* sums, long long m,
                                  long long M, int iters) {
  T x[N * N], g[N * N], s[N];
  load<T, N>(logits, m, x);
  for (int k = 0; k < 2 * iters; k += 2) {
    step<T, N, true>(x, s);
#pragma unroll
    for (int a = 0; a < N; ++a) sums[((long long)k * N + a) * M + m] = s[a];
    step<T, N, false>(x, s);
#pragma unroll
    for (int a = 0; a < N; ++a) sums[((long long)(k + 1) * N + a) * M + m] = s[a];
  }
  const T* gm = grad + m * (N * N);
#pragma unroll
  for (int e = 0; e < N * N; ++e) g[e] = gm[e];
  for (int k = 2 * iters - 1; k >= 1; k -= 2) {
#pragma unroll
    for (int a = 0; a < N; ++a) s[a] = sums[((long long)k * N + a) * M + m];
    step_backward<T, N, false>(x, g, s);
#pragma unroll
    for (int a = 0; a < N; ++a) s[a] = sums[((long long)(k - 1) * N + a) * M + m];
    step_backward<T, N, true>(x, g, s);
  }
  // x0 = exp(L − rowmax), recomputed exactly rather than taken from the walk back: dL = dx0 ⊙ x0.
  load<T, N>(logits, m, x);
  T* gl = grad_logits + m * (N * N);
#pragma unroll
  for (int e = 0; e < N * N; ++e) gl[e] = g[e] * x[e];
}

}  // namespace plexus_sinkhorn

#ifndef PLEXUS_KERNELS_ON_HOST
// The kernels, for PLEXUS_N streams: one thread per token of M, blocks of 128 threads.
extern "C" __global__ void __launch_bounds__(128)
    plexus_sinkhorn_forward(const float* logits, float* out, long long M, int iters) {
  const long long m = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (m < M) plexus_sinkhorn::forward_token<float, PLEXUS_N>(logits, out, m, iters);
}

extern "C" __global__ void __launch_bounds__(128)
    plexus_sinkhorn_backward(const float* logits, const float* grad, float* grad_logits, float* sums,
                             long long M, int iters) {
  const long long m = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (m < M) plexus_sinkhorn::backward_token<float, PLEXUS_N>(logits, grad, grad_logits, sums, m, M, iters);
}
#endif
