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

// What runs after the product (cuBLASLt's epilogue). GELU is the tanh approximation.
enum class LtEpilogue : int32_t {
  kDefault,      // + bias when a bias is given (CUBLASLT_EPILOGUE_BIAS), nothing otherwise
  kGeluAuxBias,  // aux = A·B (+ bias), D = gelu(aux) (GELU_AUX_BIAS, or GELU_AUX without bias)
  kDGelu,        // D = (A·B) ∘ gelu'(aux), aux the GELU's input (CUBLASLT_EPILOGUE_DGELU)
};

// One cuBLASLt GEMM in cuBLAS's column-major terms: D[m, n] = alpha·op(A)·op(B) + beta·C (C is D
// unless lt_matmul is given another), then + bias[m] broadcast over the columns when a bias is
// given (CUBLASLT_EPILOGUE_BIAS; the bias has D's type), or the GELU epilogues. op(A) is m × k,
// op(B) is k × n. The GELU epilogues' aux matrix is column-major m × n of D's type with leading
// dimension ldaux (a multiple of 8, ≥ m, as cuBLASLt requires).
struct LtGemm {
  cudaDataType_t ab = CUDA_R_32F;  // A and B
  cudaDataType_t cd = CUDA_R_32F;  // C, D and the bias
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldd = 0;
  LtEpilogue epilogue = LtEpilogue::kDefault;
  int64_t ldaux = 0;  // the GELU epilogues only
};

// Runs `g` on `stream` with the current device's cuBLASLt handle, a 32 MiB workspace of that
// (device, stream) and an algorithm chosen the first time this problem (types, sizes, leading
// dimensions, epilogue, pointer alignments) was seen: the heuristic's first 8, each timed on the
// call's operands, the host waiting for the timing (D is written by the timing, or a scratch D
// where D is also C); then the fastest few again in the program's own following calls of this
// problem, each run in turn between two events (read back without waiting) until the lowest
// median time picks one; none of it while `stream` is capturing a graph. With CAI_GEMM_TUNE=0 in
// the environment: the heuristic's first. Returns false, running
// nothing, when cuBLASLt has no algorithm for it (or the epilogue's constraints do not hold);
// throws cai::CudaError when a call fails. `aux` is the GELU epilogues' matrix (written by
// kGeluAuxBias, read by kDGelu). `c` (null: D itself) is the C of beta·C, with D's type and
// layout. Thread-safe (one process-wide mutex around the plan lookup and the enqueue).
bool lt_matmul(const LtGemm& g, const void* a, const void* b, void* d, const void* bias,
               float alpha, float beta, cudaStream_t stream, const void* aux = nullptr,
               const void* c = nullptr);

// Test hook: how many lt_matmul calls of this process ran a GELU or DGELU epilogue.
uint64_t lt_gelu_epilogue_runs();
// Test hook: how many lt_matmul calls of this process ran a finalist of the in-step stage.
uint64_t lt_in_step_runs();

}  // namespace cai::kernels::cuda
