// Attention Residuals' depth attention on a CUDA GPU: for every row r (a token) of the m sources
// v_i [R, D] (fp32, rows of the dense topologies' history buffer, native/src/history.cpp) and the
// unit's query q [D],
//
//   forward:   ρ_i = 1/√(v_i·v_i / D + ε),  z_i = ρ_i (v_i·q),  α = softmax(z),  y = Σ_i α_i v_i
//   backward:  a_i = gy·v_i,  gz_i = α_i (a_i − Σ_j α_j a_j),
//              gv_i = α_i gy + gz_i ρ_i q − gz_i (v_i·q) ρ_i³ v_i / D,   gq = Σ_rows Σ_i gz_i ρ_i v_i
//
// in one kernel each way: forward reads the m sources twice (their sums, then the mixture: the
// second read mostly from cache) and writes y and α [R, m]; backward reads them and gy, recomputes
// the sums (nothing of the forward is saved but its outputs) and adds gv_i into the sources'
// gradient rows of the history (gbuf, which each source's push returns as its gradient). The
// composite (src/topology/attnres.rs) runs per unit a norm per new source, a product per source, a
// stack, a softmax and an addcmul per source, forward, and about three times as many kernels
// backward, where autograd adds each source's gradient from every later unit that read it.
//
// Compiled like norm_project.cu, in the same NVRTC program, and as plain C++ with
// PLEXUS_KERNELS_ON_HOST, where a "thread" is the loop over d = d0, d0 + step, … and a block's sums
// are the threads' partial sums added in thread order. Forward, one block per row; backward, one
// block per chunk of `rows` rows, whose threads own columns d and add their share of gq over the
// chunk into part[block] [D]; the caller sums over blocks.

// PLEXUS_DEVICE: cuda_prelude.cuh; block_sum_of: streams.cu.

#define PLEXUS_ATTNRES_MAX_SOURCES 64

namespace plexus_attnres {

constexpr float kEps = 1e-6f;  // inside the RMS, as the composite's and the reference's

// Where the m sources start in the buffer (element offsets of their rows' first element: the slot
// times the buffer's row length), passed by value as a kernel argument (520 bytes; no copy to the
// device, and a CUDA graph keeps it with the launch).
struct Sources {
  long long at[PLEXUS_ATTNRES_MAX_SOURCES];
  int m;
};

// This thread's share of one source's sums on its row (v: the source's row [D]): v·q, v·v and, with
// g, v·g (else 0).
PLEXUS_DEVICE void source_sums(const float* v, const float* q, const float* g, long long D, long long d0,
                               long long step, float* out) {
  float vq = 0.0f, vv = 0.0f, vg = 0.0f;
  for (long long d = d0; d < D; d += step) {
    const float x = v[d];
    vq += x * q[d];
    vv += x * x;
    if (g != nullptr) vg += x * g[d];
  }
  out[0] = vq;
  out[1] = vv;
  out[2] = vg;
}

// A row's weights from its sums (stats: [vq, vv, vg] per source): α and ρ [m]; with `grad`, the
// backward's coefficients c2_i = gz_i ρ_i (of q) and c3_i = −gz_i (v_i·q) ρ_i³ / D (of v_i).
PLEXUS_DEVICE void row_weights(const float* stats, int m, long long D, bool grad, float* alpha, float* rho, float* c2,
                               float* c3) {
  float top = -PLEXUS_INFINITY;
  for (int i = 0; i < m; ++i) {
    rho[i] = 1.0f / sqrtf(stats[3 * i + 1] / (float)D + kEps);
    alpha[i] = rho[i] * stats[3 * i];
    top = alpha[i] > top ? alpha[i] : top;
  }
  float total = 0.0f;
  for (int i = 0; i < m; ++i) {
    alpha[i] = expf(alpha[i] - top);
    total += alpha[i];
  }
  for (int i = 0; i < m; ++i) alpha[i] /= total;
  if (!grad) return;
  float mean = 0.0f;
  for (int i = 0; i < m; ++i) mean += alpha[i] * stats[3 * i + 2];
  for (int i = 0; i < m; ++i) {
    const float gz = alpha[i] * (stats[3 * i + 2] - mean);
    c2[i] = gz * rho[i];
    c3[i] = -gz * stats[3 * i] * rho[i] * rho[i] * rho[i] / (float)D;
  }
}

// y[r, d] = Σ_i α_i v_i[r, d] for this thread's d.
PLEXUS_DEVICE void mix(const float* buf, const Sources& s, long long r, long long D, const float* alpha, float* y,
                       long long d0, long long step) {
  for (long long d = d0; d < D; d += step) {
    float acc = 0.0f;
    for (int i = 0; i < s.m; ++i) acc += alpha[i] * buf[s.at[i] + r * D + d];
    y[r * D + d] = acc;
  }
}

// For this thread's d of row r: gbuf rows of the sources += gv_i, and gq_part[d] += Σ_i c2_i v_i.
PLEXUS_DEVICE void mix_backward(const float* buf, float* gbuf, const Sources& s, long long r, long long D,
                                const float* q, const float* gy, const float* alpha, const float* c2, const float* c3,
                                float* gq_part, long long d0, long long step) {
  for (long long d = d0; d < D; d += step) {
    const float g = gy[r * D + d], qd = q[d];
    float gq = 0.0f;
    for (int i = 0; i < s.m; ++i) {
      const long long at = s.at[i] + r * D + d;
      const float v = buf[at];
      gbuf[at] += alpha[i] * g + c2[i] * qd + c3[i] * v;
      gq += c2[i] * v;
    }
    gq_part[d] += gq;
  }
}

}  // namespace plexus_attnres

#ifndef PLEXUS_KERNELS_ON_HOST
// Sources in chunks of 4 per block sum (12 values; PLEXUS_ATTNRES_MAX_SOURCES is a multiple of 4).
#define PLEXUS_ATTNRES_CHUNK 4

// The sums of row r's sources (with gy, their products with it too) into stats [3·m] in shared
// memory, visible to every thread on return.
__device__ __forceinline__ void attnres_stats(const float* buf, const plexus_attnres::Sources& s, const float* q,
                                              const float* gy, long long r, long long D, float* stats) {
  for (int i0 = 0; i0 < s.m; i0 += PLEXUS_ATTNRES_CHUNK) {
    float part[3 * PLEXUS_ATTNRES_CHUNK];
#pragma unroll
    for (int c = 0; c < PLEXUS_ATTNRES_CHUNK; ++c) {
      if (i0 + c < s.m) {
        plexus_attnres::source_sums(buf + s.at[i0 + c] + r * D, q, gy != nullptr ? gy + r * D : nullptr, D,
                                    threadIdx.x, blockDim.x, part + 3 * c);
      } else {
        part[3 * c] = part[3 * c + 1] = part[3 * c + 2] = 0.0f;
      }
    }
    block_sum_of<3 * PLEXUS_ATTNRES_CHUNK, PLEXUS_NORM_THREADS>(part, stats + 3 * i0);  // streams.cu
    __syncthreads();
  }
}

// One block per row (blockIdx.x): y [R, D], alpha_out [R, m].
extern "C" __global__ void __launch_bounds__(PLEXUS_NORM_THREADS)
    plexus_attnres_forward(const float* buf, const plexus_attnres::Sources s, const float* q, float* y,
                           float* alpha_out, long long D) {
  __shared__ float stats[3 * PLEXUS_ATTNRES_MAX_SOURCES], alpha[PLEXUS_ATTNRES_MAX_SOURCES],
      rho[PLEXUS_ATTNRES_MAX_SOURCES];
  const long long r = blockIdx.x;
  attnres_stats(buf, s, q, nullptr, r, D, stats);
  if (threadIdx.x == 0) {
    plexus_attnres::row_weights(stats, s.m, D, false, alpha, rho, nullptr, nullptr);
    for (int i = 0; i < s.m; ++i) alpha_out[r * s.m + i] = alpha[i];
  }
  __syncthreads();
  plexus_attnres::mix(buf, s, r, D, alpha, y, threadIdx.x, blockDim.x);
}

// One block per `rows` rows: the sources' gradient rows of gbuf += gv, part [blocks, D] (zeroed by
// the caller) += the block's share of gq.
extern "C" __global__ void __launch_bounds__(PLEXUS_NORM_THREADS)
    plexus_attnres_backward(const float* buf, float* gbuf, const plexus_attnres::Sources s, const float* q,
                            const float* gy, float* part, long long R, long long D, long long rows) {
  __shared__ float stats[3 * PLEXUS_ATTNRES_MAX_SOURCES], alpha[PLEXUS_ATTNRES_MAX_SOURCES],
      rho[PLEXUS_ATTNRES_MAX_SOURCES], c2[PLEXUS_ATTNRES_MAX_SOURCES], c3[PLEXUS_ATTNRES_MAX_SOURCES];
  float* p = part + (long long)blockIdx.x * D;
  const long long end = (blockIdx.x + 1) * rows < R ? (blockIdx.x + 1) * rows : R;
  for (long long r = blockIdx.x * rows; r < end; ++r) {
    attnres_stats(buf, s, q, gy, r, D, stats);
    if (threadIdx.x == 0) plexus_attnres::row_weights(stats, s.m, D, true, alpha, rho, c2, c3);
    __syncthreads();
    plexus_attnres::mix_backward(buf, gbuf, s, r, D, q, gy, alpha, c2, c3, p, threadIdx.x, blockDim.x);
    __syncthreads();  // the row's weights stay until every thread has used them
  }
}
#undef PLEXUS_ATTNRES_CHUNK
#endif
