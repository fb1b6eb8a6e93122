// The per-device cuBLAS and cuBLASLt state shared by the CUDA kernels (linear, attention).
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

#include "kernels/base/dtype.h"

namespace cai::kernels::cuda {

// Serialises cublasSetStream + the calls that follow, per process.
std::mutex& cublas_mutex();
// The current device's handle (created on first use, FP32 math without TF32), bound to `stream`.
// Call with cublas_mutex() held.
cublasHandle_t cublas_handle_locked(cudaStream_t stream);

inline cudaDataType_t cuda_dtype(DT t) {
  return t == DT::F32 ? CUDA_R_32F : t == DT::BF16 ? CUDA_R_16BF : CUDA_R_16F;
}

// One cuBLASLt GEMM in cuBLAS's column-major terms: D[m, n] = alpha·op(A)·op(B) + beta·D (C is D),
// then + bias[m] broadcast over the columns when a bias is given (CUBLASLT_EPILOGUE_BIAS; the
// bias has D's type). op(A) is m × k, op(B) is k × n.
struct LtGemm {
  cudaDataType_t ab = CUDA_R_32F;  // A and B
  cudaDataType_t cd = CUDA_R_32F;  // C, D and the bias
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldd = 0;
};

// Runs `g` on `stream` with the current device's cuBLASLt handle, a 32 MiB workspace of that
// (device, stream) and the algorithm the heuristic chose the first time this problem (types,
// sizes, leading dimensions, epilogue, pointer alignments) was seen. Returns false, running
// nothing, when cuBLASLt has no algorithm for it; throws cai::CudaError when a call fails.
// Thread-safe (one process-wide mutex around the plan lookup and the enqueue).
bool lt_matmul(const LtGemm& g, const void* a, const void* b, void* d, const void* bias,
               float alpha, float beta, cudaStream_t stream);

}  // namespace cai::kernels::cuda
