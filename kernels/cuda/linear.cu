// Linear layer on cuBLAS in plain FP32 (no TF32: the CUDA twins are compared with the CPU at
// 1e-5). Row-major data go through column-major cuBLAS by transposition: a row-major [r, c]
// matrix is a column-major [c, r] one with leading dimension c.
#include <climits>
#include <mutex>
#include <unordered_map>

#include "kernels/cuda/blas.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"
#include "kernels/linear.h"

namespace cai::kernels::cuda {

namespace {

void check_dims(const char* op, int64_t m, int64_t k, int64_t n) {
  CAI_CHECK(m >= 0 && k >= 0 && n >= 0 && m <= INT_MAX && k <= INT_MAX && n <= INT_MAX,
            "[{}] m = {}, k = {}, n = {}: cuBLAS needs each in [0, {}]", op, m, k, n, INT_MAX);
}

// y[i, j] = b[j] (b == nullptr: 0) for y[m, n].
__global__ void broadcast_rows_kernel(const float* b, float* y, int64_t m, int64_t n) {
  const int64_t total = m * n;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += stride)
    y[t] = b ? b[t % n] : 0.0f;
}

// db[j] += Σ_i dy[i, j] over dy[m, n], accumulated in double as the CPU does. Block (32, kRows):
// threadIdx.x picks the column inside a tile of 32 columns (blockIdx.x), threadIdx.y a residue
// class of rows; the kRows partial sums of a column are then added in a fixed order.
constexpr int kColTile = 32;
constexpr int kRows = 16;
__global__ void column_sum_kernel(const float* dy, float* db, int64_t m, int64_t n) {
  __shared__ double part[kRows][kColTile];
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  double s = 0.0;
  if (j < n)
    for (int64_t i = threadIdx.y; i < m; i += kRows) s += static_cast<double>(dy[i * n + j]);
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && j < n) {
    double total = 0.0;
    for (int r = 0; r < kRows; ++r) total += part[r][threadIdx.x];
    db[j] += static_cast<float>(total);
  }
}

void launch_column_sum(const float* dy, float* db, int64_t m, int64_t n, cudaStream_t stream) {
  const int64_t tiles = (n + kColTile - 1) / kColTile;
  CAI_CHECK(tiles <= INT_MAX, "[linear_bwd] n = {} is too large", n);
  column_sum_kernel<<<static_cast<unsigned>(tiles), dim3(kColTile, kRows), 0, stream>>>(dy, db, m,
                                                                                        n);
  CAI_CUDA_CHECK_LAUNCH();
}

}  // namespace

void linear_fwd(const float* x, const float* w, const float* b, float* y, int64_t m, int64_t k,
                int64_t n, void* stream) {
  check_dims("linear_fwd", m, k, n);
  if (m == 0 || n == 0) return;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  // y = b broadcast over rows (or 0 when there is no bias and the GEMM has no k to sum over).
  const bool bias = b != nullptr;
  if (bias || k == 0) {
    broadcast_rows_kernel<<<grid_for(m * n), kBlock, 0, s>>>(b, y, m, n);
    CAI_CUDA_CHECK_LAUNCH();
  }
  if (k == 0) return;
  // Column-major: y^T[n, m] = (w as col-major [k, n])^T · (x as col-major [k, m]) (+ y^T).
  const float alpha = 1.0f, beta = bias ? 1.0f : 0.0f;
  std::lock_guard<std::mutex> lock(cublas_mutex());
  cublasHandle_t h = cublas_handle_locked(s);
  CAI_CUDA_CHECK(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                             static_cast<int>(k), &alpha, w, static_cast<int>(k), x,
                             static_cast<int>(k), &beta, y, static_cast<int>(n)));
}

void linear_bwd(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                int64_t m, int64_t k, int64_t n, void* stream) {
  check_dims("linear_bwd", m, k, n);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  // dx[m, k] = dy[m, n] · w[n, k], overwritten (all zeros when n == 0).
  if (dx && m > 0 && k > 0) {
    if (n == 0) {
      CAI_CUDA_CHECK(cudaMemsetAsync(dx, 0, static_cast<size_t>(m * k) * sizeof(float), s));
    } else {
      const float alpha = 1.0f, beta = 0.0f;
      std::lock_guard<std::mutex> lock(cublas_mutex());
      cublasHandle_t h = cublas_handle_locked(s);
      // Column-major: dx^T[k, m] = (w as col-major [k, n]) · (dy as col-major [n, m]).
      CAI_CUDA_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(k),
                                 static_cast<int>(m), static_cast<int>(n), &alpha, w,
                                 static_cast<int>(k), dy, static_cast<int>(n), &beta, dx,
                                 static_cast<int>(k)));
    }
  }
  if (m == 0 || n == 0) return;  // dw and db gain nothing
  // dw[n, k] += dy^T · x.
  if (dw && k > 0) {
    const float alpha = 1.0f, beta = 1.0f;
    std::lock_guard<std::mutex> lock(cublas_mutex());
    cublasHandle_t h = cublas_handle_locked(s);
    // Column-major: dw^T[k, n] += (x as col-major [k, m]) · (dy as col-major [n, m])^T.
    CAI_CUDA_CHECK(cublasSgemm(
        h, CUBLAS_OP_N, CUBLAS_OP_T, static_cast<int>(k), static_cast<int>(n), static_cast<int>(m),
        &alpha, x, static_cast<int>(k), dy, static_cast<int>(n), &beta, dw, static_cast<int>(k)));
  }
  // db[n] += Σ_rows dy.
  if (db) launch_column_sum(dy, db, m, n, s);
}

}  // namespace cai::kernels::cuda
