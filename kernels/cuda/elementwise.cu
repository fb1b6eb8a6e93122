// Elementwise helpers (fp32) and the sum of squares (accumulated in double, returned to the host).
#include <algorithm>

#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"
#include "kernels/elementwise.h"

namespace cai::kernels::cuda {

namespace {

__global__ void add_kernel(const float* a, const float* b, float* y, int64_t n) {
  CAI_GRID_STRIDE(i, n) y[i] = a[i] + b[i];
}
__global__ void axpy_kernel(float alpha, const float* x, float* y, int64_t n) {
  CAI_GRID_STRIDE(i, n) y[i] += alpha * x[i];
}
__global__ void scale_kernel(float alpha, float* x, int64_t n) {
  CAI_GRID_STRIDE(i, n) x[i] *= alpha;
}
__global__ void fill_kernel(float value, float* x, int64_t n) {
  CAI_GRID_STRIDE(i, n) x[i] = value;
}

// Sum of squares: kPartBlocks (or fewer) blocks of kBlock threads each reduce a grid-stride slice
// in double into part[blockIdx.x]; one block then adds the parts in a fixed order. The grid size
// depends only on n, so the result is deterministic.
constexpr int kPartBlocks = 1024;

__device__ double block_sum(double v) {
  __shared__ double scratch[kBlock / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  double r = 0.0;
  if (threadIdx.x == 0)
    for (int w = 0; w < kBlock / 32; ++w) r += scratch[w];
  return r;  // valid in thread 0 only
}

__global__ void __launch_bounds__(kBlock)
    sum_squares_part_kernel(const float* x, int64_t n, double* part) {
  double acc = 0.0;
  CAI_GRID_STRIDE(i, n) {
    const double v = static_cast<double>(x[i]);
    acc += v * v;
  }
  const double r = block_sum(acc);
  if (threadIdx.x == 0) part[blockIdx.x] = r;
}

__global__ void __launch_bounds__(kBlock)
    sum_parts_kernel(const double* part, int parts, double* total) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < parts; i += blockDim.x) acc += part[i];
  const double r = block_sum(acc);
  if (threadIdx.x == 0) *total = r;
}

}  // namespace

void add(const float* a, const float* b, float* y, int64_t n, void* stream) {
  if (n <= 0) return;
  add_kernel<<<grid_for(n), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(a, b, y, n);
  CAI_CUDA_CHECK_LAUNCH();
}
void axpy(float alpha, const float* x, float* y, int64_t n, void* stream) {
  if (n <= 0) return;
  axpy_kernel<<<grid_for(n), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(alpha, x, y, n);
  CAI_CUDA_CHECK_LAUNCH();
}
void scale(float alpha, float* x, int64_t n, void* stream) {
  if (n <= 0) return;
  scale_kernel<<<grid_for(n), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(alpha, x, n);
  CAI_CUDA_CHECK_LAUNCH();
}
void fill(float value, float* x, int64_t n, void* stream) {
  if (n <= 0) return;
  fill_kernel<<<grid_for(n), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(value, x, n);
  CAI_CUDA_CHECK_LAUNCH();
}

double sum_squares(const float* x, int64_t n, void* stream) {
  if (n <= 0) return 0.0;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const unsigned parts = std::min<unsigned>(grid_for(n), kPartBlocks);
  // part[0, parts) then the total at part[parts]; freed stream-ordered, also when a check throws.
  struct Temp {
    double* p = nullptr;
    cudaStream_t s;
    ~Temp() {
      if (p) cudaFreeAsync(p, s);
    }
  } buf{nullptr, s};
  CAI_CUDA_CHECK(
      cudaMallocAsync(reinterpret_cast<void**>(&buf.p), (parts + 1) * sizeof(double), s));
  sum_squares_part_kernel<<<parts, kBlock, 0, s>>>(x, n, buf.p);
  CAI_CUDA_CHECK_LAUNCH();
  sum_parts_kernel<<<1, kBlock, 0, s>>>(buf.p, static_cast<int>(parts), buf.p + parts);
  CAI_CUDA_CHECK_LAUNCH();
  double total = 0.0;
  CAI_CUDA_CHECK(cudaMemcpyAsync(&total, buf.p + parts, sizeof(double), cudaMemcpyDeviceToHost, s));
  CAI_CUDA_CHECK(cudaStreamSynchronize(s));  // the value goes to the host
  return total;
}

}  // namespace cai::kernels::cuda
