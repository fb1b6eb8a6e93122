// CAI_CUDA_CHECK(call): throws cai::CudaError naming the call, file and line. One template serves
// CUDA runtime, cuBLAS and NCCL status codes.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "kernels/base/error.h"

namespace cai::cuda_detail {
inline const char* status_string(cudaError_t e) {
  return cudaGetErrorString(e);
}
inline const char* status_string(cublasStatus_t e) {
  return cublasGetStatusString(e);
}
inline const char* status_string(ncclResult_t e) {
  return ncclGetErrorString(e);
}
inline bool ok(cudaError_t e) {
  return e == cudaSuccess;
}
inline bool ok(cublasStatus_t e) {
  return e == CUBLAS_STATUS_SUCCESS;
}
inline bool ok(ncclResult_t e) {
  return e == ncclSuccess;
}

template <typename Status>
void check(Status s, const char* call, const char* file, int line) {
  if (!ok(s))
    throw CudaError(fmt::format("[cuda] {} failed: {} (code {}) at {}:{}", call, status_string(s),
                                static_cast<int>(s), file, line));
}
}  // namespace cai::cuda_detail

#define CAI_CUDA_CHECK(call) ::cai::cuda_detail::check((call), #call, __FILE__, __LINE__)
#define CAI_CUDA_CHECK_LAUNCH() CAI_CUDA_CHECK(cudaGetLastError())
