#include <cuda.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/p2p.h"

namespace cai::kernels::cuda {

namespace {

// The driver's stream memory operations, found through the runtime (no link against libcuda,
// whose absence on a machine without a GPU driver would stop every binary from loading).
using WaitFn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using WriteFn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

template <typename Fn>
Fn driver_entry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  CAI_CUDA_CHECK(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found));
  if (found != cudaDriverEntryPointSuccess || fn == nullptr)
    throw CudaError(fmt::format("[cuda] the driver has no {} (stream memory operations)", name));
  return reinterpret_cast<Fn>(fn);
}

void check_driver(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS)
    throw CudaError(fmt::format("[cuda] {} failed (driver error {})", what, static_cast<int>(r)));
}

struct Sources {
  const float* p[kMaxSumSources];
};

__global__ void sum_sources_kernel(Sources src, int n, float* dst0, float* dst1, int64_t count) {
  // float4 where every pointer is 16-byte aligned (the callers' chunks start at 256-byte
  // offsets of 256-byte aligned buffers), else one element at a time.
  bool vec = (reinterpret_cast<uintptr_t>(dst0) % 16 == 0) &&
             (dst1 == nullptr || reinterpret_cast<uintptr_t>(dst1) % 16 == 0);
  for (int k = 0; k < n; ++k) vec = vec && reinterpret_cast<uintptr_t>(src.p[k]) % 16 == 0;
  const int64_t head = vec ? count / 4 * 4 : 0;
  for (int64_t i = first_index() * 4; i < head; i += grid_step() * 4) {
    float4 acc = *reinterpret_cast<const float4*>(src.p[0] + i);
    for (int k = 1; k < n; ++k) {
      const float4 v = *reinterpret_cast<const float4*>(src.p[k] + i);
      acc.x += v.x;
      acc.y += v.y;
      acc.z += v.z;
      acc.w += v.w;
    }
    *reinterpret_cast<float4*>(dst0 + i) = acc;
    if (dst1) *reinterpret_cast<float4*>(dst1 + i) = acc;
  }
  for (int64_t i = head + first_index(); i < count; i += grid_step()) {
    float acc = src.p[0][i];
    for (int k = 1; k < n; ++k) acc += src.p[k][i];
    dst0[i] = acc;
    if (dst1) dst1[i] = acc;
  }
}

}  // namespace

void stream_wait_flag(cudaStream_t s, uint32_t* flag, uint32_t value) {
  static const WaitFn wait = driver_entry<WaitFn>("cuStreamWaitValue32");
  check_driver(wait(reinterpret_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(flag), value,
                    CU_STREAM_WAIT_VALUE_GEQ),
               "cuStreamWaitValue32");
}

void stream_write_flag(cudaStream_t s, uint32_t* flag, uint32_t value) {
  static const WriteFn write = driver_entry<WriteFn>("cuStreamWriteValue32");
  check_driver(write(reinterpret_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(flag), value,
                     CU_STREAM_WRITE_VALUE_DEFAULT),
               "cuStreamWriteValue32");
}

void sum_sources_f32(const float* const* srcs, int n, float* dst0, float* dst1, int64_t count,
                     cudaStream_t s) {
  if (n < 1 || n > kMaxSumSources)
    throw Error(fmt::format("[cuda] sum_sources_f32: {} sources (1 to {})", n, kMaxSumSources));
  if (count <= 0) return;
  Sources src{};
  for (int k = 0; k < n; ++k) src.p[k] = srcs[k];
  // The whole GPU for a short time (a grid of 32 blocks, which leaves the compute stream's kernels
  // more SMs for longer, measured no different on 2 H100).
  sum_sources_kernel<<<grid_for((count + 3) / 4), kBlock, 0, s>>>(src, n, dst0, dst1, count);
  CAI_CUDA_CHECK_LAUNCH();
}

}  // namespace cai::kernels::cuda
