// Launch helpers shared by the CUDA kernels: block size, grid sizes for grid-stride loops, the
// stream cast. Element kernels loop `for (i = first_index(); i < n; i += grid_step())`, so the
// grid may be capped without losing elements.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/check.h"

namespace cai::kernels::cuda {

constexpr int kBlock = 256;
constexpr int64_t kMaxGrid = int64_t{1} << 20;

// Blocks for n elements at `block` threads each, capped at kMaxGrid (grid-stride loops).
inline unsigned grid_for(int64_t n, int block = kBlock) {
  const int64_t g = (n + block - 1) / block;
  return static_cast<unsigned>(g < kMaxGrid ? g : kMaxGrid);
}
// One block per row, capped at kMaxGrid (kernels loop over rows with a grid stride).
inline unsigned row_grid(int64_t rows) {
  return static_cast<unsigned>(rows < kMaxGrid ? rows : kMaxGrid);
}
// The current device's multiprocessors.
inline int multiprocessors() {
  int dev = 0, sms = 0;
  CAI_CUDA_CHECK(cudaGetDevice(&dev));
  CAI_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}
// Blocks of `kernel` (`threads` threads, `shmem` bytes of dynamic shared memory) the current
// device holds at once: a grid of that many is one wave, no block waiting for a slot.
template <typename K>
int64_t resident_blocks(K kernel, int threads, size_t shmem = 0) {
  int per_sm = 0;
  CAI_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, shmem));
  return static_cast<int64_t>(std::max(per_sm, 1)) * multiprocessors();
}
inline cudaStream_t as_stream(void* s) {
  return static_cast<cudaStream_t>(s);
}

__device__ __forceinline__ int64_t first_index() {
  return blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_step() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

}  // namespace cai::kernels::cuda

#define CAI_GRID_STRIDE(i, n)                                    \
  for (int64_t i = ::cai::kernels::cuda::first_index(); i < (n); \
       i += ::cai::kernels::cuda::grid_step())
