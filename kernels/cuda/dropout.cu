// Dropout and drop-path on the GPU: the twins of kernels/cpu/dropout.cpp. The mask element i is
// philox::uniform(seed, stream, offset + i) >= p, computed with the same integer arithmetic as on
// the host, so masks are bit-identical to the CPU ones.
#include <algorithm>

#include "kernels/base/philox.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/typed.cuh"
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

// Typed dropout: one thread per Philox block of 4 words, i.e. the elements i with
// (offset + i) >> 2 == q, so each block is computed once instead of once per element. Element i
// is kept when to_uniform(word offset + i) >= p, as philox::uniform: the fp32 kernel's mask.
template <typename T>
__global__ void masked_scale_t_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n,
                                      float p, float keep_scale, uint64_t seed, uint64_t stream,
                                      uint64_t offset) {
  const uint64_t q0 = offset >> 2;
  const int64_t blocks =
      static_cast<int64_t>(((offset + static_cast<uint64_t>(n) - 1) >> 2) - q0 + 1);
  CAI_GRID_STRIDE(b, blocks) {
    const uint64_t q = q0 + static_cast<uint64_t>(b);
    const philox::U32x4 w = philox::block(seed, stream, q);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const uint64_t pos = (q << 2) + r;  // word position offset + i
      if (pos < offset) continue;
      const uint64_t i = pos - offset;
      if (i >= static_cast<uint64_t>(n)) break;
      y[i] = philox::to_uniform(w.v[r]) >= p ? from_f32<T>(to_f32(x[i]) * keep_scale)
                                             : from_f32<T>(0.0f);
    }
  }
}

// Typed drop-path: blockIdx.y walks the samples (grid-stride), the x dimension their elements;
// each thread draws its sample's keep flag once.
template <typename T>
__global__ void sample_scale_t_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t b,
                                      int64_t per, float p, float keep_scale, uint64_t seed,
                                      uint64_t stream, uint64_t offset) {
  for (int64_t s = blockIdx.y; s < b; s += gridDim.y) {
    const float f =
        philox::uniform(seed, stream, offset + static_cast<uint64_t>(s)) >= p ? keep_scale : 0.0f;
    const T* xs = x + s * per;
    T* ys = y + s * per;
    CAI_GRID_STRIDE(j, per) ys[j] = from_f32<T>(to_f32(xs[j]) * f);
  }
}

// Strided dropout: one thread per element, element i drawing at
// offset + (i / row) · row_stride + (i % row) (the CPU's integer arithmetic, so the same mask).
template <typename T>
__global__ void strided_scale_t_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n,
                                       float p, float keep_scale, uint64_t seed, uint64_t stream,
                                       uint64_t offset, uint64_t row, uint64_t row_stride) {
  CAI_GRID_STRIDE(i, n) {
    const uint64_t u = static_cast<uint64_t>(i);
    const uint64_t pos = offset + (u / row) * row_stride + (u % row);
    y[i] = philox::uniform(seed, stream, pos) >= p ? from_f32<T>(to_f32(x[i]) * keep_scale)
                                                   : from_f32<T>(0.0f);
  }
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

void dropout_fwd_t(DT t, const void* x, void* y, int64_t n, float p, uint64_t seed, uint64_t stream,
                   uint64_t offset, void* cuda_stream) {
  if (n <= 0) return;
  const float keep_scale = 1.0f / (1.0f - p);
  const int64_t blocks =
      static_cast<int64_t>(((offset + static_cast<uint64_t>(n) - 1) >> 2) - (offset >> 2) + 1);
  dispatch_dt(t, "dropout", [&](auto tag) {
    using T = decltype(tag);
    masked_scale_t_kernel<T><<<grid_for(blocks), kBlock, 0, as_stream(cuda_stream)>>>(
        static_cast<const T*>(x), static_cast<T*>(y), n, p, keep_scale, seed, stream, offset);
    CAI_CUDA_CHECK_LAUNCH();
  });
}

void dropout_strided_t(DT t, const void* x, void* y, int64_t n, float p, uint64_t seed,
                       uint64_t stream, uint64_t offset, int64_t row, int64_t row_stride,
                       void* cuda_stream) {
  // Contiguous (no rows, or rows that follow each other): the Philox-block kernel.
  if (row <= 0 || row_stride == row || n <= row) {
    dropout_fwd_t(t, x, y, n, p, seed, stream, offset, cuda_stream);
    return;
  }
  if (n <= 0) return;
  const float keep_scale = 1.0f / (1.0f - p);
  dispatch_dt(t, "dropout", [&](auto tag) {
    using T = decltype(tag);
    strided_scale_t_kernel<T><<<grid_for(n), kBlock, 0, as_stream(cuda_stream)>>>(
        static_cast<const T*>(x), static_cast<T*>(y), n, p, keep_scale, seed, stream, offset,
        static_cast<uint64_t>(row), static_cast<uint64_t>(row_stride));
    CAI_CUDA_CHECK_LAUNCH();
  });
}

void drop_path_fwd_t(DT t, const void* x, void* y, int64_t b, int64_t per_sample, float p,
                     uint64_t seed, uint64_t stream, uint64_t offset, void* cuda_stream) {
  if (b <= 0 || per_sample <= 0) return;
  const float keep_scale = 1.0f / (1.0f - p);
  const dim3 grid(std::min<unsigned>(grid_for(per_sample), 1024u),
                  static_cast<unsigned>(std::min<int64_t>(b, 65535)));
  dispatch_dt(t, "drop_path", [&](auto tag) {
    using T = decltype(tag);
    sample_scale_t_kernel<T><<<grid, kBlock, 0, as_stream(cuda_stream)>>>(
        static_cast<const T*>(x), static_cast<T*>(y), b, per_sample, p, keep_scale, seed, stream,
        offset);
    CAI_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace cai::kernels::cuda
