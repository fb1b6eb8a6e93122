// Multi-head attention on the GPU from fused qkv[b, n, 3, h, hd]: the twin of
// kernels/cpu/attention.cpp. The four products per (batch, head) run as batched cuBLAS SGEMMs
// (FP32, no TF32) addressed straight into the qkv/out/dqkv layouts, one call per product for all
// b·h heads (pointer arrays built on the device); the row softmax and its backward are kernels
// with double accumulation. Row-major [r, c] data are column-major [c, r] to cuBLAS.
//   S = scale·Q·Kᵀ   P = softmax_rows(S) (kept in probs)   O = P·V
//   dV = Pᵀ·dO   dP = dO·Vᵀ   dS = P ⊙ (dP − rowsum(P ⊙ dP))·scale   dQ = dS·K   dK = dSᵀ·Q
// (Version 1, a row-per-block kernel without cuBLAS, was 8.5 ms forward / 10.7 ms backward for
// b 64, n 197, h 12, hd 64 on an H200.)
// The bf16/fp16 twins (attention_fwd_t / attention_bwd_t) run the same products through
// cublasGemmBatchedEx with half inputs and fp32 accumulation. Scores and dP land in an fp32
// scratch [b, h, n, n]; a warp-per-row softmax writes the half probs; the softmax backward
// writes dS (half) in place over the first half of each fp32 dP row, so the dS products read it
// with a leading dimension of 2n half elements and no second n² buffer is needed.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cmath>
#include <memory>
#include <type_traits>

#include "kernels/attention.h"
#include "kernels/cuda/blas.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/typed.cuh"
#include "kernels/device.h"
#include "kernels/elementwise.h"

namespace cai::kernels::cuda {

namespace {

// ptrs[i] = base + (i / h)·batch_stride + (i % h)·head_stride for i < count.
__global__ void fill_ptrs_kernel(const float** ptrs, const float* base, int64_t count, int64_t h,
                                 int64_t batch_stride, int64_t head_stride) {
  CAI_GRID_STRIDE(i, count) ptrs[i] = base + (i / h) * batch_stride + (i % h) * head_stride;
}

// Block-wide sum in double (blockDim.x = kBlock, a multiple of 32).
__device__ double block_sum(double v, double* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) total += scratch[w];
  return total;
}

__device__ float block_max(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float m = -INFINITY;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) m = fmaxf(m, scratch[w]);
  return m;
}

// In place over rows of n scores: p = exp(s − max) / Σ exp(s − max) (sum in double, as the CPU).
__global__ void softmax_rows_kernel(float* p, int64_t rows, int64_t n) {
  __shared__ double dscratch[kBlock / 32];
  __shared__ float fscratch[kBlock / 32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float* row = p + r * n;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mx = fmaxf(mx, row[j]);
    mx = block_max(mx, fscratch);
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float e = expf(row[j] - mx);
      row[j] = e;
      s += e;
    }
    const float inv = static_cast<float>(1.0 / block_sum(s, dscratch));
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) row[j] *= inv;
  }
}

// In place over rows: dP ← P ⊙ (dP − Σ_j P ⊙ dP)·scale.
__global__ void softmax_bwd_rows_kernel(const float* p, float* dp, int64_t rows, int64_t n,
                                        float scale) {
  __shared__ double scratch[kBlock / 32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* pr = p + r * n;
    float* dr = dp + r * n;
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += static_cast<double>(pr[j]) * dr[j];
    const float dot = static_cast<float>(block_sum(s, scratch));
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) dr[j] = pr[j] * (dr[j] - dot) * scale;
  }
}

// Pointer arrays for one batched product over b·h heads.
struct Ptrs {
  const float** a;
  const float** b;
  float** c;
};

struct Geometry {
  int64_t b, n, h, hd;
  int64_t count() const { return b * h; }
  int64_t d() const { return h * hd; }
  int64_t qkv_batch() const { return n * 3 * d(); }  // qkv / dqkv: per sample
  int64_t out_batch() const { return n * d(); }      // out / dout: per sample
  int64_t nn() const { return n * n; }
};

void fill(const float** dst, const float* base, const Geometry& g, int64_t batch_stride,
          int64_t head_stride, cudaStream_t s) {
  fill_ptrs_kernel<<<grid_for(g.count()), kBlock, 0, s>>>(dst, base, g.count(), g.h, batch_stride,
                                                          head_stride);
  CAI_CUDA_CHECK_LAUNCH();
}

// The probs/dP buffers are [b, h, n, n]: head (bi, hi) at (bi·h + hi)·n² = batch n²·h, head n².
void gemm(cublasHandle_t hnd, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t nn,
          int64_t k, float alpha, const float* const* a, int64_t lda, const float* const* b,
          int64_t ldb, float* const* c, int64_t ldc, int64_t count) {
  const float beta = 0.0f;
  CAI_CUDA_CHECK(cublasSgemmBatched(hnd, ta, tb, static_cast<int>(m), static_cast<int>(nn),
                                    static_cast<int>(k), &alpha, a, static_cast<int>(lda), b,
                                    static_cast<int>(ldb), &beta, c, static_cast<int>(ldc),
                                    static_cast<int>(count)));
}

void check_sizes(const char* op, const Geometry& g) {
  CAI_CHECK(g.b >= 0 && g.n >= 0 && g.h >= 0 && g.hd >= 0, "[{}] b = {}, n = {}, h = {}, hd = {}",
            op, g.b, g.n, g.h, g.hd);
  CAI_CHECK(g.count() <= INT_MAX && 3 * g.d() <= INT_MAX && g.n <= INT_MAX,
            "[{}] b·h = {} heads or 3·dim = {} exceed cuBLAS's int sizes", op, g.count(),
            3 * g.d());
}

}  // namespace

void attention_fwd(const float* qkv, float* out, float* probs, int64_t b, int64_t n, int64_t h,
                   int64_t hd, void* stream) {
  const Geometry g{b, n, h, hd};
  check_sizes("attention_fwd", g);
  if (b == 0 || n == 0 || h == 0) return;
  const cudaStream_t s = as_stream(stream);
  if (hd == 0) {  // no features: every score is 0, so the weights are uniform
    fill(1.0f / static_cast<float>(n), probs, g.count() * g.nn(), stream);
    return;
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t c = g.count(), D = g.d();
  Scratch ptrs(sizeof(float*) * 6 * c);
  const float** p = ptrs.as<const float*>();
  const float **q = p, **k = p + c, **v = p + 2 * c, **pr = p + 3 * c, **o = p + 4 * c;
  fill(q, qkv, g, g.qkv_batch(), hd, s);
  fill(k, qkv + D, g, g.qkv_batch(), hd, s);
  fill(v, qkv + 2 * D, g, g.qkv_batch(), hd, s);
  fill(pr, probs, g, h * g.nn(), g.nn(), s);
  fill(o, out, g, g.out_batch(), hd, s);
  std::lock_guard<std::mutex> lock(cublas_mutex());
  cublasHandle_t hnd = cublas_handle_locked(s);
  // Sᵀ (col-major n_k × n_q) = K · Qᵀ: A = K as (hd × n_k) transposed, B = Q as (hd × n_q).
  gemm(hnd, CUBLAS_OP_T, CUBLAS_OP_N, n, n, hd, scale, k, 3 * D, q, 3 * D,
       const_cast<float* const*>(pr), n, c);
  softmax_rows_kernel<<<row_grid(c * n), kBlock, 0, s>>>(probs, c * n, n);
  CAI_CUDA_CHECK_LAUNCH();
  // Oᵀ (hd × n_q) = Vᵀ (hd × n_k) · Pᵀ (n_k × n_q).
  gemm(hnd, CUBLAS_OP_N, CUBLAS_OP_N, hd, n, n, 1.0f, v, 3 * D, pr, n, const_cast<float* const*>(o),
       D, c);
}

void attention_bwd(const float* qkv, const float* probs, const float* dout, float* dqkv, int64_t b,
                   int64_t n, int64_t h, int64_t hd, void* stream) {
  const Geometry g{b, n, h, hd};
  check_sizes("attention_bwd", g);
  if (b == 0 || n == 0 || h == 0 || hd == 0) return;
  const cudaStream_t s = as_stream(stream);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t c = g.count(), D = g.d();
  Scratch dp_buf(sizeof(float) * c * g.nn());
  float* dp = dp_buf.as<float>();
  Scratch ptrs(sizeof(float*) * 10 * c);
  const float** p = ptrs.as<const float*>();
  const float **q = p, **k = p + c, **v = p + 2 * c, **pr = p + 3 * c, **dO = p + 4 * c,
              **dq = p + 5 * c, **dk = p + 6 * c, **dv = p + 7 * c, **dP = p + 8 * c;
  fill(q, qkv, g, g.qkv_batch(), hd, s);
  fill(k, qkv + D, g, g.qkv_batch(), hd, s);
  fill(v, qkv + 2 * D, g, g.qkv_batch(), hd, s);
  fill(pr, probs, g, h * g.nn(), g.nn(), s);
  fill(dO, dout, g, g.out_batch(), hd, s);
  fill(dq, dqkv, g, g.qkv_batch(), hd, s);
  fill(dk, dqkv + D, g, g.qkv_batch(), hd, s);
  fill(dv, dqkv + 2 * D, g, g.qkv_batch(), hd, s);
  fill(dP, dp, g, h * g.nn(), g.nn(), s);
  auto mut = [](const float** x) { return const_cast<float* const*>(x); };
  std::lock_guard<std::mutex> lock(cublas_mutex());
  cublasHandle_t hnd = cublas_handle_locked(s);
  // dVᵀ (hd × n_k) = dOᵀ (hd × n_q) · P (n_q × n_k).
  gemm(hnd, CUBLAS_OP_N, CUBLAS_OP_T, hd, n, n, 1.0f, dO, D, pr, n, mut(dv), 3 * D, c);
  // dPᵀ (n_k × n_q) = V (n_k × hd) · dOᵀ (hd × n_q).
  gemm(hnd, CUBLAS_OP_T, CUBLAS_OP_N, n, n, hd, 1.0f, v, 3 * D, dO, D, mut(dP), n, c);
  softmax_bwd_rows_kernel<<<row_grid(c * n), kBlock, 0, s>>>(probs, dp, c * n, n, scale);
  CAI_CUDA_CHECK_LAUNCH();
  // dQᵀ (hd × n_q) = Kᵀ (hd × n_k) · dSᵀ (n_k × n_q).
  gemm(hnd, CUBLAS_OP_N, CUBLAS_OP_N, hd, n, n, 1.0f, k, 3 * D, dP, n, mut(dq), 3 * D, c);
  // dKᵀ (hd × n_k) = Qᵀ (hd × n_q) · dS (n_q × n_k).
  gemm(hnd, CUBLAS_OP_N, CUBLAS_OP_T, hd, n, n, 1.0f, q, 3 * D, dP, n, mut(dk), 3 * D, c);
}

// ---- bf16 / fp16 -----------------------------------------------------------------------------

namespace {

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

constexpr int kWarps = kBlock / 32;  // rows per block in the warp-per-row kernels

__device__ __forceinline__ int64_t warp_row() {
  return static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
}
__device__ __forceinline__ int64_t warp_rows_step() {
  return static_cast<int64_t>(gridDim.x) * kWarps;
}

// p[r, :] = softmax(s[r, :]) for fp32 scores s[rows, n] (already scaled) into half p[rows, n].
// One warp per row; the row stays in registers (kPer values per lane, n ≤ 32·kPer).
template <typename T, int kPer>
__global__ void softmax_fwd_kernel(const float* s, T* p, int64_t rows, int n) {
  const int lane = threadIdx.x & 31;
  for (int64_t r = warp_row(); r < rows; r += warp_rows_step()) {
    const float* sr = s + r * n;
    float v[kPer];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int j = lane + 32 * i;
      v[i] = j < n ? sr[j] : -INFINITY;
      mx = fmaxf(mx, v[i]);
    }
    mx = warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      v[i] = lane + 32 * i < n ? expf(v[i] - mx) : 0.0f;
      sum += v[i];
    }
    const float inv = 1.0f / warp_sum(sum);
    T* pr = p + r * n;
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (lane + 32 * i < n) pr[lane + 32 * i] = from_f32<T>(v[i] * inv);
  }
}

// The same for any n: three passes over the row.
template <typename T>
__global__ void softmax_fwd_long_kernel(const float* s, T* p, int64_t rows, int n) {
  const int lane = threadIdx.x & 31;
  for (int64_t r = warp_row(); r < rows; r += warp_rows_step()) {
    const float* sr = s + r * n;
    float mx = -INFINITY;
    for (int j = lane; j < n; j += 32) mx = fmaxf(mx, sr[j]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int j = lane; j < n; j += 32) sum += expf(sr[j] - mx);
    const float inv = 1.0f / warp_sum(sum);
    T* pr = p + r * n;
    for (int j = lane; j < n; j += 32) pr[j] = from_f32<T>(expf(sr[j] - mx) * inv);
  }
}

// Row r of dp (fp32, [rows, n]) becomes dS_r = P_r ⊙ (dP_r − Σ_j P_rj·dP_rj)·scale, written as
// T over the first half of the same row (T row stride 2n). One warp per row; the whole row is
// read before any of it is written.
template <typename T, int kPer>
__global__ void softmax_bwd_kernel(const T* p, float* dp, int64_t rows, int n, float scale) {
  const int lane = threadIdx.x & 31;
  for (int64_t r = warp_row(); r < rows; r += warp_rows_step()) {
    const T* pr = p + r * n;
    float* dr = dp + r * n;
    float pv[kPer], dv[kPer];
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int j = lane + 32 * i;
      pv[i] = j < n ? to_f32(pr[j]) : 0.0f;
      dv[i] = j < n ? dr[j] : 0.0f;
      dot += pv[i] * dv[i];
    }
    dot = warp_sum(dot);
    __syncwarp();  // every lane has read its part of the row before any of it is overwritten
    T* ds = reinterpret_cast<T*>(dr);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int j = lane + 32 * i;
      if (j < n) ds[j] = from_f32<T>(pv[i] * (dv[i] - dot) * scale);
    }
  }
}

// Any n: a dot pass, then chunks of 32 read, warp-synchronised, then written. dS[j] (2 bytes at
// 2j) overlaps dP[j / 2], which an earlier chunk or this chunk's read has already consumed.
template <typename T>
__global__ void softmax_bwd_long_kernel(const T* p, float* dp, int64_t rows, int n, float scale) {
  const int lane = threadIdx.x & 31;
  for (int64_t r = warp_row(); r < rows; r += warp_rows_step()) {
    const T* pr = p + r * n;
    float* dr = dp + r * n;
    float dot = 0.0f;
    for (int j = lane; j < n; j += 32) dot += to_f32(pr[j]) * dr[j];
    dot = warp_sum(dot);
    T* ds = reinterpret_cast<T*>(dr);
    for (int base = 0; base < n; base += 32) {
      const int j = base + lane;
      const float g = j < n ? to_f32(pr[j]) * (dr[j] - dot) * scale : 0.0f;
      __syncwarp();
      if (j < n) ds[j] = from_f32<T>(g);
      __syncwarp();
    }
  }
}

template <typename T>
__global__ void fill_value_kernel(T* p, int64_t count, float v) {
  CAI_GRID_STRIDE(i, count) p[i] = from_f32<T>(v);
}

// Per-head pointer arrays: array a of `count` holds, for head x = bi·h + hi, the address
// base + (bi·batch_stride + hi·head_stride)·elem bytes. All arrays in one launch.
struct PtrSpec {
  const void* base;
  int64_t batch_stride, head_stride, elem;
};
constexpr int kMaxPtrSpecs = 10;
struct PtrSpecs {
  PtrSpec s[kMaxPtrSpecs];
  int count = 0;
};
__global__ void fill_ptr_arrays_kernel(const void** out, PtrSpecs specs, int64_t heads, int64_t h) {
  CAI_GRID_STRIDE(i, heads * specs.count) {
    const int64_t a = i / heads, x = i % heads;
    const PtrSpec& sp = specs.s[a];
    out[i] = static_cast<const char*>(sp.base) +
             ((x / h) * sp.batch_stride + (x % h) * sp.head_stride) * sp.elem;
  }
}

// Scratch (typed.cuh) is device memory from the caching allocator for the length of one call.
// The allocator is not stream-ordered: returning a block right after enqueueing its users is
// safe because every later user of the block runs on the same stream (as everywhere here).

// The pointer arrays of one call: add() returns the array's index.
class HeadPtrs {
 public:
  explicit HeadPtrs(const Geometry& g) : g_(g) {}
  int add(const void* base, int64_t batch_stride, int64_t head_stride, int64_t elem) {
    specs_.s[specs_.count] = PtrSpec{base, batch_stride, head_stride, elem};
    return specs_.count++;
  }
  // Allocates and fills every array added so far (one kernel).
  void upload(cudaStream_t s) {
    buf_ = std::make_unique<Scratch>(sizeof(void*) * g_.count() * specs_.count);
    fill_ptr_arrays_kernel<<<grid_for(g_.count() * specs_.count), kBlock, 0, s>>>(
        buf_->as<const void*>(), specs_, g_.count(), g_.h);
    CAI_CUDA_CHECK_LAUNCH();
  }
  void* const* operator[](int a) const { return buf_->as<void* const>() + a * g_.count(); }

 private:
  Geometry g_;
  PtrSpecs specs_;
  std::unique_ptr<Scratch> buf_;
};

const void* byte_offset(const void* p, int64_t bytes) {
  return static_cast<const char*>(p) + bytes;
}

// Batched C = alpha·op(A)·op(B) over the heads, fp32 accumulation; A and B in `ab`, C in `c`.
void gemm_ex(cublasHandle_t hnd, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t nn,
             int64_t k, float alpha, void* const* a, int64_t lda, void* const* b, int64_t ldb,
             cudaDataType_t ab, void* const* c, int64_t ldc, cudaDataType_t ct, int64_t count) {
  const float beta = 0.0f;
  CAI_CUDA_CHECK(cublasGemmBatchedEx(
      hnd, ta, tb, static_cast<int>(m), static_cast<int>(nn), static_cast<int>(k), &alpha,
      const_cast<const void* const*>(a), ab, static_cast<int>(lda),
      const_cast<const void* const*>(b), ab, static_cast<int>(ldb), &beta, c, ct,
      static_cast<int>(ldc), static_cast<int>(count), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// Calls f(T{}) with T the device half type of t (BF16 or F16).
template <typename F>
void dispatch_half(DT t, F&& f) {
  if (t == DT::BF16)
    f(__nv_bfloat16{});
  else
    f(__half{});
}

unsigned warp_grid(int64_t rows) {
  const int64_t g = (rows + kWarps - 1) / kWarps;
  return static_cast<unsigned>(g < kMaxGrid ? g : kMaxGrid);
}

// Calls f(std::integral_constant<int, kPer>) with the smallest kPer in {1, 2, 4, 8, 16, 32}
// such that 32·kPer ≥ n, or f(std::integral_constant<int, 0>) when n > 1024.
template <typename F>
void dispatch_per_lane(int64_t n, F&& f) {
  if (n <= 32)
    f(std::integral_constant<int, 1>{});
  else if (n <= 64)
    f(std::integral_constant<int, 2>{});
  else if (n <= 128)
    f(std::integral_constant<int, 4>{});
  else if (n <= 256)
    f(std::integral_constant<int, 8>{});
  else if (n <= 512)
    f(std::integral_constant<int, 16>{});
  else if (n <= 1024)
    f(std::integral_constant<int, 32>{});
  else
    f(std::integral_constant<int, 0>{});
}

void softmax_fwd(DT t, const float* s, void* p, int64_t rows, int64_t n, cudaStream_t st) {
  dispatch_half(t, [&](auto tag) {
    using T = decltype(tag);
    dispatch_per_lane(n, [&](auto per) {
      constexpr int kPer = decltype(per)::value;
      if constexpr (kPer == 0)
        softmax_fwd_long_kernel<T>
            <<<warp_grid(rows), kBlock, 0, st>>>(s, static_cast<T*>(p), rows, static_cast<int>(n));
      else
        softmax_fwd_kernel<T, kPer>
            <<<warp_grid(rows), kBlock, 0, st>>>(s, static_cast<T*>(p), rows, static_cast<int>(n));
    });
  });
  CAI_CUDA_CHECK_LAUNCH();
}

void softmax_bwd(DT t, const void* p, float* dp, int64_t rows, int64_t n, float scale,
                 cudaStream_t st) {
  dispatch_half(t, [&](auto tag) {
    using T = decltype(tag);
    dispatch_per_lane(n, [&](auto per) {
      constexpr int kPer = decltype(per)::value;
      if constexpr (kPer == 0)
        softmax_bwd_long_kernel<T><<<warp_grid(rows), kBlock, 0, st>>>(
            static_cast<const T*>(p), dp, rows, static_cast<int>(n), scale);
      else
        softmax_bwd_kernel<T, kPer><<<warp_grid(rows), kBlock, 0, st>>>(
            static_cast<const T*>(p), dp, rows, static_cast<int>(n), scale);
    });
  });
  CAI_CUDA_CHECK_LAUNCH();
}

}  // namespace

void attention_fwd_t(DT t, const void* qkv, void* out, void* probs, int64_t b, int64_t n, int64_t h,
                     int64_t hd, void* stream) {
  if (t == DT::F32)
    return attention_fwd(static_cast<const float*>(qkv), static_cast<float*>(out),
                         static_cast<float*>(probs), b, n, h, hd, stream);
  const Geometry g{b, n, h, hd};
  check_sizes("attention_fwd", g);
  if (b == 0 || n == 0 || h == 0) return;
  const cudaStream_t s = as_stream(stream);
  if (hd == 0) {  // no features: every score is 0, so the weights are uniform
    dispatch_half(t, [&](auto tag) {
      using T = decltype(tag);
      fill_value_kernel<T><<<grid_for(g.count() * g.nn()), kBlock, 0, s>>>(
          static_cast<T*>(probs), g.count() * g.nn(), 1.0f / static_cast<float>(n));
    });
    CAI_CUDA_CHECK_LAUNCH();
    return;
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t c = g.count(), D = g.d(), es = dt_size(t);
  const cudaDataType_t ct = cuda_dtype(t);
  Scratch scores(sizeof(float) * c * g.nn());
  // Q, K, V of head (bi, hi) in qkv[b, n, 3, h, hd]; K and V start D and 2·D after Q.
  HeadPtrs ptrs(g);
  const int q = ptrs.add(qkv, g.qkv_batch(), hd, es);
  const int k = ptrs.add(byte_offset(qkv, D * es), g.qkv_batch(), hd, es);
  const int v = ptrs.add(byte_offset(qkv, 2 * D * es), g.qkv_batch(), hd, es);
  const int sc = ptrs.add(scores.as<void>(), h * g.nn(), g.nn(), sizeof(float));
  const int pr = ptrs.add(probs, h * g.nn(), g.nn(), es);
  const int o = ptrs.add(out, g.out_batch(), hd, es);
  ptrs.upload(s);
  std::lock_guard<std::mutex> lock(cublas_mutex());
  cublasHandle_t hnd = cublas_handle_locked(s);
  // Sᵀ (col-major n_k × n_q) = scale·K·Qᵀ into the fp32 scores.
  gemm_ex(hnd, CUBLAS_OP_T, CUBLAS_OP_N, n, n, hd, scale, ptrs[k], 3 * D, ptrs[q], 3 * D, ct,
          ptrs[sc], n, CUDA_R_32F, c);
  softmax_fwd(t, static_cast<const float*>(scores.as<void>()), probs, c * n, n, s);
  // Oᵀ (hd × n_q) = Vᵀ (hd × n_k) · Pᵀ (n_k × n_q).
  gemm_ex(hnd, CUBLAS_OP_N, CUBLAS_OP_N, hd, n, n, 1.0f, ptrs[v], 3 * D, ptrs[pr], n, ct, ptrs[o],
          D, ct, c);
}

void attention_bwd_t(DT t, const void* qkv, const void* probs, const void* dout, void* dqkv,
                     int64_t b, int64_t n, int64_t h, int64_t hd, void* stream) {
  if (t == DT::F32)
    return attention_bwd(static_cast<const float*>(qkv), static_cast<const float*>(probs),
                         static_cast<const float*>(dout), static_cast<float*>(dqkv), b, n, h, hd,
                         stream);
  const Geometry g{b, n, h, hd};
  check_sizes("attention_bwd", g);
  CAI_CHECK(2 * n <= INT_MAX,
            "[attention_bwd] n = {} tokens: dS's leading dimension 2·n exceeds "
            "cuBLAS's int",
            n);
  if (b == 0 || n == 0 || h == 0 || hd == 0) return;
  const cudaStream_t s = as_stream(stream);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t c = g.count(), D = g.d(), es = dt_size(t);
  const cudaDataType_t ct = cuda_dtype(t);
  Scratch dp_buf(sizeof(float) * c * g.nn());
  float* dp = dp_buf.as<float>();
  HeadPtrs ptrs(g);
  const int q = ptrs.add(qkv, g.qkv_batch(), hd, es);
  const int k = ptrs.add(byte_offset(qkv, D * es), g.qkv_batch(), hd, es);
  const int v = ptrs.add(byte_offset(qkv, 2 * D * es), g.qkv_batch(), hd, es);
  const int pr = ptrs.add(probs, h * g.nn(), g.nn(), es);
  const int dO = ptrs.add(dout, g.out_batch(), hd, es);
  const int dq = ptrs.add(dqkv, g.qkv_batch(), hd, es);
  const int dk = ptrs.add(byte_offset(dqkv, D * es), g.qkv_batch(), hd, es);
  const int dv = ptrs.add(byte_offset(dqkv, 2 * D * es), g.qkv_batch(), hd, es);
  // dP (fp32, row stride n) and, over it, dS (t, row stride 2·n): the same head addresses.
  const int dP = ptrs.add(dp, h * g.nn(), g.nn(), sizeof(float));
  ptrs.upload(s);
  std::lock_guard<std::mutex> lock(cublas_mutex());
  cublasHandle_t hnd = cublas_handle_locked(s);
  // dVᵀ (hd × n_k) = dOᵀ (hd × n_q) · P (n_q × n_k).
  gemm_ex(hnd, CUBLAS_OP_N, CUBLAS_OP_T, hd, n, n, 1.0f, ptrs[dO], D, ptrs[pr], n, ct, ptrs[dv],
          3 * D, ct, c);
  // dPᵀ (n_k × n_q) = V (n_k × hd) · dOᵀ (hd × n_q), fp32.
  gemm_ex(hnd, CUBLAS_OP_T, CUBLAS_OP_N, n, n, hd, 1.0f, ptrs[v], 3 * D, ptrs[dO], D, ct, ptrs[dP],
          n, CUDA_R_32F, c);
  softmax_bwd(t, probs, dp, c * n, n, scale, s);
  // dQᵀ (hd × n_q) = Kᵀ (hd × n_k) · dSᵀ (n_k × n_q).
  gemm_ex(hnd, CUBLAS_OP_N, CUBLAS_OP_N, hd, n, n, 1.0f, ptrs[k], 3 * D, ptrs[dP], 2 * n, ct,
          ptrs[dq], 3 * D, ct, c);
  // dKᵀ (hd × n_k) = Qᵀ (hd × n_q) · dS (n_q × n_k).
  gemm_ex(hnd, CUBLAS_OP_N, CUBLAS_OP_T, hd, n, n, 1.0f, ptrs[q], 3 * D, ptrs[dP], 2 * n, ct,
          ptrs[dk], 3 * D, ct, c);
}

}  // namespace cai::kernels::cuda
