// LayerNorm on the GPU: the twin of kernels/cpu/layernorm.cpp. Reductions run in double, as on
// the CPU, so results agree to rounding; every reduction has a fixed order (deterministic).
#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"
#include "kernels/layernorm.h"

namespace cai::kernels::cuda {

namespace {

__device__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}

// Sum of v over the block; every thread gets the result. All threads of the block must call it.
__device__ double block_sum(double v) {
  __shared__ double partial[32];
  __shared__ double total;
  __syncthreads();  // the previous call's readers are done with partial/total
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int nwarps = (blockDim.x + 31) >> 5;
    double w = lane < nwarps ? partial[lane] : 0.0;
    w = warp_sum(w);
    if (lane == 0) total = w;
  }
  __syncthreads();
  return total;
}

// One block per row (grid-stride over rows).
__global__ void layernorm_fwd_kernel(const float* __restrict__ x, const float* __restrict__ gamma,
                                     const float* __restrict__ beta, float* __restrict__ y,
                                     float* __restrict__ mean, float* __restrict__ rstd, int64_t m,
                                     int64_t d, float eps) {
  for (int64_t i = blockIdx.x; i < m; i += gridDim.x) {
    const float* xi = x + i * d;
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) s += xi[j];
    const double mu = block_sum(s) / static_cast<double>(d);
    double v = 0.0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      const double c = xi[j] - mu;
      v += c * c;
    }
    const double rs = 1.0 / sqrt(block_sum(v) / static_cast<double>(d) + static_cast<double>(eps));
    float* yi = y + i * d;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
      // One fused multiply-add, as the CPU kernel compiles with -mfma (CAI_NATIVE_SIMD, default).
      yi[j] = fmaf(static_cast<float>((xi[j] - mu) * rs), gamma[j], beta[j]);
    if (threadIdx.x == 0) {
      mean[i] = static_cast<float>(mu);
      rstd[i] = static_cast<float>(rs);
    }
  }
}

// dx = rstd · (g - mean(g) - xhat · mean(g · xhat)), g = dy · gamma; one block per row.
__global__ void layernorm_bwd_dx_kernel(const float* __restrict__ x,
                                        const float* __restrict__ gamma,
                                        const float* __restrict__ mean,
                                        const float* __restrict__ rstd,
                                        const float* __restrict__ dy, float* __restrict__ dx,
                                        int64_t m, int64_t d) {
  for (int64_t i = blockIdx.x; i < m; i += gridDim.x) {
    const float* xi = x + i * d;
    const float* dyi = dy + i * d;
    const float mi = mean[i], ri = rstd[i];
    double sg = 0.0, sgx = 0.0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      const double g = static_cast<double>(dyi[j]) * gamma[j];
      sg += g;
      sgx += g * (xi[j] - mi) * ri;
    }
    sg = block_sum(sg) / static_cast<double>(d);
    sgx = block_sum(sgx) / static_cast<double>(d);
    float* dxi = dx + i * d;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      const double xhat = (xi[j] - mi) * static_cast<double>(ri);
      const double g = static_cast<double>(dyi[j]) * gamma[j];
      dxi[j] = static_cast<float>(ri * (g - sg - xhat * sgx));
    }
  }
}

// dgamma[j] += Σ_i dy·xhat, dbeta[j] += Σ_i dy. A block covers kTile consecutive features
// (threadIdx.x, coalesced) and splits the rows over kRowLanes lanes (threadIdx.y, rows
// i ≡ threadIdx.y mod kRowLanes); the lanes' partial sums are added in a fixed order.
constexpr int kTile = 32;
constexpr int kRowLanes = 16;

__global__ void layernorm_bwd_param_kernel(const float* __restrict__ x,
                                           const float* __restrict__ mean,
                                           const float* __restrict__ rstd,
                                           const float* __restrict__ dy, float* dgamma,
                                           float* dbeta, int64_t m, int64_t d) {
  __shared__ double sg_part[kRowLanes][kTile];
  __shared__ double sb_part[kRowLanes][kTile];
  const int64_t tiles = (d + kTile - 1) / kTile;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t j = t * kTile + threadIdx.x;
    double sg = 0.0, sb = 0.0;
    if (j < d) {
      for (int64_t i = threadIdx.y; i < m; i += kRowLanes) {
        const double xhat = (x[i * d + j] - mean[i]) * static_cast<double>(rstd[i]);
        const float g = dy[i * d + j];
        sg += g * xhat;
        sb += g;
      }
    }
    __syncthreads();  // the previous tile's readers are done with the shared arrays
    sg_part[threadIdx.y][threadIdx.x] = sg;
    sb_part[threadIdx.y][threadIdx.x] = sb;
    __syncthreads();
    if (threadIdx.y == 0 && j < d) {
      double tg = 0.0, tb = 0.0;
      for (int r = 0; r < kRowLanes; ++r) {
        tg += sg_part[r][threadIdx.x];
        tb += sb_part[r][threadIdx.x];
      }
      if (dgamma) dgamma[j] += static_cast<float>(tg);
      if (dbeta) dbeta[j] += static_cast<float>(tb);
    }
  }
}
}  // namespace

void layernorm_fwd(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                   float* rstd, int64_t m, int64_t d, float eps, void* stream) {
  if (m <= 0) return;
  layernorm_fwd_kernel<<<row_grid(m), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
      x, gamma, beta, y, mean, rstd, m, d, eps);
  CAI_CUDA_CHECK_LAUNCH();
}

void layernorm_bwd(const float* x, const float* gamma, const float* mean, const float* rstd,
                   const float* dy, float* dx, float* dgamma, float* dbeta, int64_t m, int64_t d,
                   void* stream) {
  if (m <= 0 || d <= 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  if (dx) {
    layernorm_bwd_dx_kernel<<<row_grid(m), kBlock, 0, s>>>(x, gamma, mean, rstd, dy, dx, m, d);
    CAI_CUDA_CHECK_LAUNCH();
  }
  if (dgamma || dbeta) {
    const int64_t tiles = (d + kTile - 1) / kTile;
    layernorm_bwd_param_kernel<<<row_grid(tiles), dim3(kTile, kRowLanes), 0, s>>>(
        x, mean, rstd, dy, dgamma, dbeta, m, d);
    CAI_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace cai::kernels::cuda
