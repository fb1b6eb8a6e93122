// Dropout and drop-path on the GPU: the twins of kernels/cpu/dropout.cpp. The mask element i is
// philox::uniform(seed, stream, offset + i) >= p, computed with the same integer arithmetic as on
// the host, so masks are bit-identical to the CPU ones.
#include "kernels/base/philox.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"
#include "kernels/dropout.h"

namespace cai::kernels::cuda {

namespace {

// y = keep ? x · keep_scale : 0 with keep = uniform(offset + i) >= p (forward on x, backward on
// dy).
__global__ void masked_scale_kernel(const float* x, float* y, int64_t n, float p, float keep_scale,
                                    uint64_t seed, uint64_t stream, uint64_t offset) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += step)
    y[i] = philox::uniform(seed, stream, offset + static_cast<uint64_t>(i)) >= p ? x[i] * keep_scale
                                                                                 : 0.0f;
}

// x[b, per]: sample s is kept when uniform(offset + s) >= p.
__global__ void sample_scale_kernel(const float* x, float* y, int64_t n, int64_t per, float p,
                                    float keep_scale, uint64_t seed, uint64_t stream,
                                    uint64_t offset) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += step) {
    const int64_t s = i / per;
    const float f =
        philox::uniform(seed, stream, offset + static_cast<uint64_t>(s)) >= p ? keep_scale : 0.0f;
    y[i] = x[i] * f;
  }
}

void masked_scale(const float* x, float* y, int64_t n, float p, uint64_t seed, uint64_t stream,
                  uint64_t offset, void* cuda_stream) {
  if (n <= 0) return;
  const float keep_scale = 1.0f / (1.0f - p);
  masked_scale_kernel<<<grid_for(n), kBlock, 0, static_cast<cudaStream_t>(cuda_stream)>>>(
      x, y, n, p, keep_scale, seed, stream, offset);
  CAI_CUDA_CHECK_LAUNCH();
}

void sample_scale(const float* x, float* y, int64_t b, int64_t per, float p, uint64_t seed,
                  uint64_t stream, uint64_t offset, void* cuda_stream) {
  if (b <= 0 || per <= 0) return;
  const int64_t n = b * per;
  const float keep_scale = 1.0f / (1.0f - p);
  sample_scale_kernel<<<grid_for(n), kBlock, 0, static_cast<cudaStream_t>(cuda_stream)>>>(
      x, y, n, per, p, keep_scale, seed, stream, offset);
  CAI_CUDA_CHECK_LAUNCH();
}
}  // namespace

void dropout_fwd(const float* x, float* y, int64_t n, float p, uint64_t seed, uint64_t stream,
                 uint64_t offset, void* cuda_stream) {
  masked_scale(x, y, n, p, seed, stream, offset, cuda_stream);
}
void dropout_bwd(const float* dy, float* dx, int64_t n, float p, uint64_t seed, uint64_t stream,
                 uint64_t offset, void* cuda_stream) {
  masked_scale(dy, dx, n, p, seed, stream, offset, cuda_stream);
}
void drop_path_fwd(const float* x, float* y, int64_t b, int64_t per_sample, float p, uint64_t seed,
                   uint64_t stream, uint64_t offset, void* cuda_stream) {
  sample_scale(x, y, b, per_sample, p, seed, stream, offset, cuda_stream);
}
void drop_path_bwd(const float* dy, float* dx, int64_t b, int64_t per_sample, float p,
                   uint64_t seed, uint64_t stream, uint64_t offset, void* cuda_stream) {
  sample_scale(dy, dx, b, per_sample, p, seed, stream, offset, cuda_stream);
}

}  // namespace cai::kernels::cuda
