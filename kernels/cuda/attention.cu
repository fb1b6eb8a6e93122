// Multi-head softmax attention, fp32, with the summation orders of kernels/cpu/attention.cpp:
// dot products over hd run in order c = 0..hd-1, sums over keys in order j = 0..n-1, sums over
// queries in order i = 0..n-1; the softmax normaliser and Σ_j P_ij dP_ij are accumulated in double
// (the CPU adds them in j order, here they are block-reduced: same value up to double rounding).
//
// Forward: one block per (b, h, i) query row. Backward: dv (one thread per (b, h, j, c)), then
// one block per (b, h, i) row for dS (kept in a temporary [b, h, n, n] buffer) and dq, then dk
// (one thread per (b, h, j, c)). Every element of dqkv is written, so nothing needs zeroing.
#include <climits>
#include <cmath>

#include "kernels/attention.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"

namespace cai::kernels::cuda {

namespace {

constexpr int kRowThreads = 128;  // threads of a per-row block: a multiple of 32, at most 1024
constexpr int kWarps = kRowThreads / 32;
constexpr int kElemThreads = 256;

// Offsets into qkv[b, n, 3, h, hd] (the same helper as the CPU's).
struct Qkv {
  int64_t n, h, hd;
  __device__ int64_t row() const { return 3 * h * hd; }
  __device__ int64_t at(int64_t bi, int64_t t, int64_t which, int64_t hi) const {
    return (bi * n + t) * row() + (which * h + hi) * hd;
  }
};

// Block-wide reductions for blocks of kRowThreads threads; every thread gets the result.
// `scratch` must hold kWarps values; callers may reuse it after the call returns.
__device__ float block_max(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = scratch[0];
  for (int w = 1; w < kWarps; ++w) r = fmaxf(r, scratch[w]);
  return r;
}
__device__ double block_sum(double v, double* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  double r = 0.0;
  for (int w = 0; w < kWarps; ++w) r += scratch[w];
  return r;
}

// Block (b, h, i), blockIdx.x = (bi·h + hi)·n + i. Dynamic shared memory: q_i (hd floats).
// The probability row is built in place in probs (global), shared by the block through
// __syncthreads.
__global__ void __launch_bounds__(kRowThreads)
    attention_fwd_kernel(const float* qkv, float* out, float* probs, int64_t n, int64_t h,
                         int64_t hd, float scale) {
  extern __shared__ float q_s[];
  __shared__ float fscratch[kWarps];
  __shared__ double dscratch[kWarps];
  const Qkv L{n, h, hd};
  const int64_t row = blockIdx.x;  // (bi·h + hi)·n + i
  const int64_t i = row % n, bh = row / n;
  const int64_t bi = bh / h, hi = bh % h;
  const float* q = qkv + L.at(bi, i, 0, hi);
  for (int64_t c = threadIdx.x; c < hd; c += blockDim.x) q_s[c] = q[c];
  __syncthreads();

  float* p = probs + row * n;
  // Scores s_j = scale·(q_i · k_j), and their maximum.
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float* k = qkv + L.at(bi, j, 1, hi);
    float s = 0.0f;
    for (int64_t c = 0; c < hd; ++c) s += q_s[c] * k[c];
    s *= scale;
    p[j] = s;
    mx = fmaxf(mx, s);
  }
  mx = block_max(mx, fscratch);
  // e_j = exp(s_j - max) and Σ_j e_j in double.
  double sum = 0.0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float e = expf(p[j] - mx);
    p[j] = e;
    sum += static_cast<double>(e);
  }
  sum = block_sum(sum, dscratch);
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) p[j] *= inv;
  __syncthreads();  // the whole row of probabilities is visible to the block
  // out_i[c] = Σ_j P_ij v_j[c], j in order.
  float* o = out + (bi * n + i) * h * hd + hi * hd;
  for (int64_t c = threadIdx.x; c < hd; c += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < n; ++j) acc += p[j] * qkv[L.at(bi, j, 2, hi) + c];
    o[c] = acc;
  }
}

// dv_j[c] = Σ_i P_ij dout_i[c]; one thread per (b, h, j, c), t = ((bi·h + hi)·n + j)·hd + c.
__global__ void attention_dv_kernel(const float* probs, const float* dout, float* dqkv, int64_t b,
                                    int64_t n, int64_t h, int64_t hd) {
  const Qkv L{n, h, hd};
  const int64_t total = b * h * n * hd;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += stride) {
    const int64_t c = t % hd, j = (t / hd) % n, bh = t / (hd * n);
    const int64_t bi = bh / h, hi = bh % h;
    const float* P = probs + bh * n * n;
    float acc = 0.0f;
    for (int64_t i = 0; i < n; ++i) acc += P[i * n + j] * dout[(bi * n + i) * h * hd + hi * hd + c];
    dqkv[L.at(bi, j, 2, hi) + c] = acc;
  }
}

// Block (b, h, i): dP_ij = dout_i · v_j, D_i = Σ_j P_ij dP_ij (double),
// dS_ij = P_ij (dP_ij − D_i)·scale into ds[b, h, n, n], then dq_i[c] = Σ_j dS_ij k_j[c].
// Dynamic shared memory: dout_i (hd floats).
__global__ void __launch_bounds__(kRowThreads)
    attention_ds_dq_kernel(const float* qkv, const float* probs, const float* dout, float* ds,
                           float* dqkv, int64_t n, int64_t h, int64_t hd, float scale) {
  extern __shared__ float go_s[];
  __shared__ double dscratch[kWarps];
  const Qkv L{n, h, hd};
  const int64_t row = blockIdx.x;  // (bi·h + hi)·n + i
  const int64_t i = row % n, bh = row / n;
  const int64_t bi = bh / h, hi = bh % h;
  const float* go = dout + (bi * n + i) * h * hd + hi * hd;
  for (int64_t c = threadIdx.x; c < hd; c += blockDim.x) go_s[c] = go[c];
  __syncthreads();

  const float* p = probs + row * n;
  float* g = ds + row * n;
  double dot = 0.0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float* v = qkv + L.at(bi, j, 2, hi);
    float s = 0.0f;
    for (int64_t c = 0; c < hd; ++c) s += go_s[c] * v[c];
    g[j] = s;  // dP_ij for now
    dot += static_cast<double>(p[j]) * s;
  }
  dot = block_sum(dot, dscratch);
  const float dotf = static_cast<float>(dot);
  // Each thread rewrites only the entries it wrote above, so no barrier is needed before.
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) g[j] = p[j] * (g[j] - dotf) * scale;
  __syncthreads();  // the whole dS row is visible to the block
  float* dq = dqkv + L.at(bi, i, 0, hi);
  for (int64_t c = threadIdx.x; c < hd; c += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < n; ++j) acc += g[j] * qkv[L.at(bi, j, 1, hi) + c];
    dq[c] = acc;
  }
}

// dk_j[c] = Σ_i dS_ij q_i[c]; one thread per (b, h, j, c) as attention_dv_kernel.
__global__ void attention_dk_kernel(const float* qkv, const float* ds, float* dqkv, int64_t b,
                                    int64_t n, int64_t h, int64_t hd) {
  const Qkv L{n, h, hd};
  const int64_t total = b * h * n * hd;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += stride) {
    const int64_t c = t % hd, j = (t / hd) % n, bh = t / (hd * n);
    const int64_t bi = bh / h, hi = bh % h;
    const float* S = ds + bh * n * n;
    float acc = 0.0f;
    for (int64_t i = 0; i < n; ++i) acc += S[i * n + j] * qkv[L.at(bi, i, 0, hi) + c];
    dqkv[L.at(bi, j, 1, hi) + c] = acc;
  }
}

// Bytes of dynamic shared memory for one row of hd floats, rounded up to 16 bytes: the compiler
// reads the tail of the row with 16-byte vector loads (harmless on the hardware, but
// compute-sanitizer's memcheck reports the bytes past an unrounded allocation).
size_t row_smem(int64_t hd) {
  return static_cast<size_t>((hd + 3) / 4 * 4) * sizeof(float);
}

// Rows are blocks along gridDim.x (at most 2^31 − 1); q_i / dout_i live in dynamic shared memory.
void check_rows(const char* op, int64_t b, int64_t n, int64_t h, int64_t hd) {
  CAI_CHECK(b >= 0 && n >= 0 && h >= 0 && hd >= 0, "[{}] b = {}, n = {}, h = {}, hd = {}", op, b, n,
            h, hd);
  CAI_CHECK(b * h * n <= INT_MAX, "[{}] b·h·n = {} rows exceed the grid limit {}", op, b * h * n,
            INT_MAX);
  CAI_CHECK(hd <= 8192, "[{}] head dim {} exceeds 8192 (the shared-memory row)", op, hd);
}

}  // namespace

void attention_fwd(const float* qkv, float* out, float* probs, int64_t b, int64_t n, int64_t h,
                   int64_t hd, void* stream) {
  check_rows("attention_fwd", b, n, h, hd);
  if (b == 0 || n == 0 || h == 0) return;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const size_t smem = row_smem(hd);
  attention_fwd_kernel<<<static_cast<unsigned>(b * h * n), kRowThreads, smem, s>>>(qkv, out, probs,
                                                                                   n, h, hd, scale);
  CAI_CUDA_CHECK_LAUNCH();
}

void attention_bwd(const float* qkv, const float* probs, const float* dout, float* dqkv, int64_t b,
                   int64_t n, int64_t h, int64_t hd, void* stream) {
  check_rows("attention_bwd", b, n, h, hd);
  if (b == 0 || n == 0 || h == 0 || hd == 0) return;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t elems = b * h * n * hd;
  attention_dv_kernel<<<grid_for(elems, kElemThreads), kElemThreads, 0, s>>>(probs, dout, dqkv, b,
                                                                             n, h, hd);
  CAI_CUDA_CHECK_LAUNCH();

  // dS for every (b, h, i, j): stream-ordered temporary, freed after the kernels that read it
  // (also when a launch check throws).
  struct Temp {
    float* p = nullptr;
    cudaStream_t s;
    ~Temp() {
      if (p) cudaFreeAsync(p, s);
    }
  } ds{nullptr, s};
  CAI_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&ds.p),
                                 static_cast<size_t>(b * h * n * n) * sizeof(float), s));
  const size_t smem = row_smem(hd);
  attention_ds_dq_kernel<<<static_cast<unsigned>(b * h * n), kRowThreads, smem, s>>>(
      qkv, probs, dout, ds.p, dqkv, n, h, hd, scale);
  CAI_CUDA_CHECK_LAUNCH();
  attention_dk_kernel<<<grid_for(elems, kElemThreads), kElemThreads, 0, s>>>(qkv, ds.p, dqkv, b, n,
                                                                             h, hd);
  CAI_CUDA_CHECK_LAUNCH();
}

}  // namespace cai::kernels::cuda
