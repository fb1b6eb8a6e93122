#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"
#include "kernels/gelu.h"

namespace cai::kernels::cuda {

namespace {
__global__ void gelu_fwd_kernel(const float* x, float* y, int64_t n) {
  CAI_GRID_STRIDE(i, n) y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.7071067811865476f));
}
__global__ void gelu_bwd_kernel(const float* x, const float* dy, float* dx, int64_t n) {
  CAI_GRID_STRIDE(i, n) {
    const float cdf = 0.5f * (1.0f + erff(x[i] * 0.7071067811865476f));
    const float pdf = 0.3989422804014327f * expf(-0.5f * x[i] * x[i]);
    dx[i] = dy[i] * (cdf + x[i] * pdf);
  }
}
}  // namespace

void gelu_fwd(const float* x, float* y, int64_t n, void* stream) {
  if (n == 0) return;
  gelu_fwd_kernel<<<grid_for(n), kBlock, 0, as_stream(stream)>>>(x, y, n);
  CAI_CUDA_CHECK_LAUNCH();
}
void gelu_bwd(const float* x, const float* dy, float* dx, int64_t n, void* stream) {
  if (n == 0) return;
  gelu_bwd_kernel<<<grid_for(n), kBlock, 0, as_stream(stream)>>>(x, dy, dx, n);
  CAI_CUDA_CHECK_LAUNCH();
}

}  // namespace cai::kernels::cuda
