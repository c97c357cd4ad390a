// mHC's Sinkhorn–Knopp: the one arithmetic of every fused path. One token's n×n matrix goes through
// the functions of `plexus_sinkhorn` below, whether it sits in a CUDA thread's registers, in one
// lane of a CPU vector of tokens or in one lane of a block of 16 tokens; only the composite graph
// (native/src/composite.rs, the log-domain reference and fallback) computes it another way.
//
// This file is compiled three ways:
// * at run time with NVRTC (native/src/cuda_kernels.cpp, one program with streams.cu), with PLEXUS_N
//   the number of streams, into the two `extern "C"` kernels at the bottom: one thread per token,
//   its matrix in registers, the whole iteration one kernel forward and one backward (the composite
//   graph launches 4·iters kernels forward and more backward). NVRTC has no standard headers:
//   built-ins only;
// * into cuda_kernels.cpp as plain C++, with PLEXUS_KERNELS_ON_HOST defined, where V is the scalar:
//   the kernels' own arithmetic on the CPU, which the tests check against an fp64 log-domain
//   reference (src/topology/mhc.rs) and a GPU's first use of each n checks the kernels against (in
//   double, `self_check` in cuda_kernels.cpp);
// * into the fused CPU kernels (stream_kernels.cpp), inside each instruction set's namespace of
//   stream_rows.inc, where V is a vector of tokens (one lane each): the register-resident loops for
//   n = 2, 4, 8 and the block loops for any other n (N = 0: n at run time). The tests check that the
//   baseline CPU loops and the host build of the kernels give the same bits.
//
// The arithmetic: x = exp(L − rowmax) (normalising the rows first makes the result independent of a
// per-row shift, and the shift has no gradient), then iters × (rows, columns), each line scaled by
// 1 / its sum (a sum of 0, every entry underflowed, leaves the line 0).
//
// The backward recomputes the forward, keeping only each normalisation's n line sums (a GPU thread
// has no room for 2·iters matrices; on the GPU they sit in a global scratch laid out [2·iters·n, M],
// so a warp's accesses are contiguous), and walks back from the final matrix: the state before a
// normalisation is the state after it times the line sums, and the gradient goes through
// y = x ⊙ inv as g ← (g − ⟨g, y⟩_line) ⊙ inv.

// PLEXUS_DEVICE: from cuda_prelude.cuh.

namespace plexus_sinkhorn {

PLEXUS_DEVICE float exp_(float x) { return expf(x); }
PLEXUS_DEVICE double exp_(double x) { return exp(x); }

// The line length: N when it is fixed at compile time (the loops unroll), else n.
template <int N>
PLEXUS_DEVICE int lines(int n) {
  return N > 0 ? N : n;
}

// Entry (a, b) of line a of an n×n matrix: row a (ROWS) or column a.
template <bool ROWS>
PLEXUS_DEVICE int at(int a, int b, int n) {
  return ROWS ? a * n + b : b * n + a;
}

// 1 / s, or 1 where s = 0 (the line's every entry underflowed: it stays 0). V: T, or a vector of T
// (GCC/clang vector extensions, compared and selected lane by lane).
template <typename T, typename V>
PLEXUS_DEVICE V inverse(const V& s) {
  const V one = V{} + T(1);
  return s > V{} ? one / s : one;
}

// x[e] = exp(l[e] − the maximum of its row), for one token's logits l [n, n] (T: float or double).
template <typename T, int N>
PLEXUS_DEVICE void exp_rows(const T* l, T* x, int n_) {
  const int n = lines<N>(n_);
#pragma unroll
  for (int i = 0; i < n; ++i) {
    T mx = l[i * n];
#pragma unroll
    for (int j = 1; j < n; ++j) mx = l[i * n + j] > mx ? l[i * n + j] : mx;
#pragma unroll
    for (int j = 0; j < n; ++j) x[i * n + j] = exp_(l[i * n + j] - mx);
  }
}

// One normalisation of every row (ROWS) or column of x [n, n]; s[a·stride] = the sum of line a
// before it.
template <typename T, int N, bool ROWS, typename V>
PLEXUS_DEVICE void normalise(V* x, V* s, long long stride, int n_) {
  const int n = lines<N>(n_);
#pragma unroll
  for (int a = 0; a < n; ++a) {
    V sum = x[at<ROWS>(a, 0, n)];
#pragma unroll
    for (int b = 1; b < n; ++b) sum += x[at<ROWS>(a, b, n)];
    s[a * stride] = sum;
    const V inv = inverse<T>(sum);
#pragma unroll
    for (int b = 0; b < n; ++b) x[at<ROWS>(a, b, n)] *= inv;
  }
}

// The backward of one normalisation whose line sums were s (s[a·stride]), given y (the state after
// it, turned into the state before it here) and g (the gradient of y, turned into that of x).
template <typename T, int N, bool ROWS, typename V>
PLEXUS_DEVICE void normalise_backward(V* y, V* g, const V* s, long long stride, int n_) {
  const int n = lines<N>(n_);
#pragma unroll
  for (int a = 0; a < n; ++a) {
    V dot = g[at<ROWS>(a, 0, n)] * y[at<ROWS>(a, 0, n)];
#pragma unroll
    for (int b = 1; b < n; ++b) dot += g[at<ROWS>(a, b, n)] * y[at<ROWS>(a, b, n)];
    const V sum = s[a * stride];
    const V inv = inverse<T>(sum);
    const V back = sum > V{} ? sum : V{} + T(1);
#pragma unroll
    for (int b = 0; b < n; ++b) {
      g[at<ROWS>(a, b, n)] = (g[at<ROWS>(a, b, n)] - dot) * inv;
      y[at<ROWS>(a, b, n)] *= back;
    }
  }
}

// iters × (rows, columns) on x [n, n], the state exp_rows gave.
template <typename T, int N, typename V>
PLEXUS_DEVICE void iterate(V* x, int n_, int iters) {
  const int n = lines<N>(n_);
  V dropped;  // the line sums, not kept (stride 0: every one lands here)
  for (int k = 0; k < iters; ++k) {
    normalise<T, N, true>(x, &dropped, 0, n);
    normalise<T, N, false>(x, &dropped, 0, n);
  }
}

// `iterate`, keeping the line sums for the backward: those of normalisation k (rows for even k,
// columns for odd) at sums[(k·n + a)·stride], 2·iters·n of them.
template <typename T, int N, typename V>
PLEXUS_DEVICE void iterate_keeping_sums(V* x, V* sums, long long stride, int n_, int iters) {
  const int n = lines<N>(n_);
  for (int k = 0; k < 2 * iters; k += 2) {
    normalise<T, N, true>(x, sums + (long long)k * n * stride, stride, n);
    normalise<T, N, false>(x, sums + (long long)(k + 1) * n * stride, stride, n);
  }
}

// The backward of `iterate`: x is the final matrix (walked back to the first state on the way), g
// the gradient of P (turned into that of the first state), sums the line sums
// `iterate_keeping_sums` kept, laid out as there.
template <typename T, int N, typename V>
PLEXUS_DEVICE void iterate_backward(V* x, V* g, const V* sums, long long stride, int n_, int iters) {
  const int n = lines<N>(n_);
  for (int k = 2 * iters - 1; k >= 1; k -= 2) {
    normalise_backward<T, N, false>(x, g, sums + (long long)k * n * stride, stride, n);
    normalise_backward<T, N, true>(x, g, sums + (long long)(k - 1) * n * stride, stride, n);
  }
}

// The logits' gradient from that of the first state g, in place: x0 = exp(L − rowmax), so
// dL = dx0 ⊙ x0 (the row maximum's gradient is zero). x0 is exp_rows' result, recomputed by the
// callers rather than taken from the walk back.
template <int N, typename V>
PLEXUS_DEVICE void exp_rows_backward(V* g, const V* x0, int n_) {
  const int n = lines<N>(n_);
#pragma unroll
  for (int e = 0; e < n * n; ++e) g[e] *= x0[e];
}

// P = Sinkhorn(exp(L)) for token m: logits and out [M, N, N] (N > 0).
template <typename T, int N>
PLEXUS_DEVICE void forward_token(const T* logits, T* out, long long m, int iters) {
  T x[N * N];
  exp_rows<T, N>(logits + m * (N * N), x, N);
  iterate<T, N>(x, N, iters);
  T* o = out + m * (N * N);
#pragma unroll
  for (int e = 0; e < N * N; ++e) o[e] = x[e];
}

// The gradient of the logits of token m, grad_logits [M, N, N], from that of P, grad [M, N, N];
// sums: scratch of 2·iters·N·M values ([2·iters·N, M]).
template <typename T, int N>
PLEXUS_DEVICE void backward_token(const T* logits, const T* grad, T* grad_logits, T* sums, long long m,
                                  long long M, int iters) {
  T x[N * N], g[N * N];
  const T* l = logits + m * (N * N);
  exp_rows<T, N>(l, x, N);
  iterate_keeping_sums<T, N>(x, sums + m, M, N, iters);
  const T* gm = grad + m * (N * N);
#pragma unroll
  for (int e = 0; e < N * N; ++e) g[e] = gm[e];
  iterate_backward<T, N>(x, g, sums + m, M, N, iters);
  exp_rows<T, N>(l, x, N);
  exp_rows_backward<N>(g, x, N);
  T* gl = grad_logits + m * (N * N);
#pragma unroll
  for (int e = 0; e < N * N; ++e) gl[e] = g[e];
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
