// The per-device cuBLAS handle shared by the CUDA kernels (linear, attention).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <mutex>

namespace cai::kernels::cuda {

// Serialises cublasSetStream + the calls that follow, per process.
std::mutex& cublas_mutex();
// The current device's handle (created on first use, FP32 math without TF32), bound to `stream`.
// Call with cublas_mutex() held.
cublasHandle_t cublas_handle_locked(cudaStream_t stream);

}  // namespace cai::kernels::cuda
