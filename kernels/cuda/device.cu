#include <sstream>

#include "kernels/cuda/check.h"
#include "kernels/device.h"

namespace cai::kernels::cuda {

RuntimeInfo runtime_info() {
  RuntimeInfo r;
  r.compiled = true;
  r.compiled_version = CUDART_VERSION;
  cudaRuntimeGetVersion(&r.runtime_version);
  cudaDriverGetVersion(&r.driver_version);
  int major = 0, minor = 0, patch = 0;
  if (cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS)
    r.cublas_version = major * 10000 + minor * 100 + patch;
  ncclGetVersion(&r.nccl_version);
  std::istringstream archs(CAI_CUDA_ARCHS);
  for (std::string a; std::getline(archs, a, ';');)
    if (!a.empty()) r.architectures.push_back(std::stoi(a));
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    r.device_error = cudaGetErrorString(e);
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return r;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    r.devices.push_back(
        DeviceInfo{i, p.name, p.major, p.minor, p.totalGlobalMem, p.multiProcessorCount});
  }
  return r;
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

void* alloc(size_t bytes, int device) {
  if (bytes == 0) return nullptr;
  CAI_CUDA_CHECK(cudaSetDevice(device));
  void* p = nullptr;
  CAI_CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}
void free(void* p, int device) {
  if (!p) return;
  cudaSetDevice(device);
  cudaFree(p);  // no throw from a destructor path
}
void copy_h2d(void* dst, const void* src, size_t bytes) {
  CAI_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}
void copy_d2h(void* dst, const void* src, size_t bytes) {
  CAI_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}
void copy_d2d(void* dst, const void* src, size_t bytes) {
  CAI_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
}
void memset_zero(void* p, size_t bytes) {
  CAI_CUDA_CHECK(cudaMemset(p, 0, bytes));
}
void synchronize() {
  CAI_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace cai::kernels::cuda
