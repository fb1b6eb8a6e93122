#include "kernels/cuda/blas.h"

#include <unordered_map>

#include "kernels/cuda/check.h"

namespace cai::kernels::cuda {

namespace {
// One cuBLAS handle per device, created lazily on first use and kept for the process lifetime
// (a compute resource like the CUDA context, not process-group state).
struct Blas {
  std::mutex mu;
  std::unordered_map<int, cublasHandle_t> handles;
};
Blas& blas() {
  static Blas* b = new Blas;  // never destroyed: handles must outlive static destructors
  return *b;
}
}  // namespace

std::mutex& cublas_mutex() {
  return blas().mu;
}

cublasHandle_t cublas_handle_locked(cudaStream_t stream) {
  int device = 0;
  CAI_CUDA_CHECK(cudaGetDevice(&device));
  auto& hs = blas().handles;
  auto it = hs.find(device);
  if (it == hs.end()) {
    cublasHandle_t h = nullptr;
    CAI_CUDA_CHECK(cublasCreate(&h));
    const cublasStatus_t s = cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);  // FP32, no TF32
    if (s != CUBLAS_STATUS_SUCCESS) cublasDestroy(h);
    CAI_CUDA_CHECK(s);
    it = hs.emplace(device, h).first;
  }
  CAI_CUDA_CHECK(cublasSetStream(it->second, stream));
  return it->second;
}

}  // namespace cai::kernels::cuda
