// GELU on the GPU: the twin of kernels/cpu/gelu.cpp. The typed kernels move 4 elements per access
// when the pointers allow it and compute in fp32.
#include <algorithm>

#include "kernels/cuda/check.h"
#include "kernels/cuda/gelu_math.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/typed.cuh"
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

// 16-byte accesses: 4 fp32 or 8 halves per thread and step.
template <typename T>
constexpr int kVecOf = 16 / static_cast<int>(sizeof(T));

// vec: n/V vectors of V first (aligned pointers), then the tail one by one.
// Tanh: the tanh approximation instead of erf.
// A thread takes kIlp vectors a grid step apart per iteration, all loaded before any is computed
// (launched with a grid for nv / kIlp vectors). On an H100, ViT-B/16's fc1 output (bf16, 155M
// elements): one 16-byte load in flight per thread 228.9 us (2.71 TB/s), two 217.6 us (2.85
// TB/s; a device copy of as many bytes 3.01 TB/s); ViT-L/16's 154.0 -> 146.9 us.
constexpr int kIlp = 2;
template <typename T, bool Tanh, int kVec = kVecOf<T>>
__global__ void gelu_fwd_t_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n, bool vec) {
  const int64_t nv = vec ? n / kVec : 0, stride = grid_step();
  for (int64_t k = first_index(); k < nv; k += kIlp * stride) {
    float a[kIlp][kVec];
#pragma unroll
    for (int u = 0; u < kIlp; ++u)
      if (k + u * stride < nv) load_vec(x + (k + u * stride) * kVec, a[u]);
#pragma unroll
    for (int u = 0; u < kIlp; ++u) {
      if (k + u * stride >= nv) break;
#pragma unroll
      for (int e = 0; e < kVec; ++e) a[u][e] = Tanh ? gelu_tanh_f(a[u][e]) : gelu_f(a[u][e]);
      store_vec(y + (k + u * stride) * kVec, a[u]);
    }
  }
  for (int64_t i = nv * kVec + first_index(); i < n; i += grid_step()) {
    const float v = to_f32(x[i]);
    y[i] = from_f32<T>(Tanh ? gelu_tanh_f(v) : gelu_f(v));
  }
}

// The bf16 exact form by table (gelu_table in gelu_math.cuh): a wave of blocks, each filling the
// table once, then 16-byte accesses of 8 elements, kIlp of them loaded before any is looked up.
// ViT-B/16's fc1 output on an H200: 197.8 us (3.13 TB/s) with erff, 172.2 us (3.60 TB/s) by the
// table; 1 or 4 vectors in flight a thread measured the same (169.6, 168.3 us).
__device__ __forceinline__ unsigned gelu_bits(const unsigned short* tab, unsigned b) {
  const unsigned s = gelu_table::slot(b);
  if (s < gelu_table::kEntries) return tab[s];
  return __bfloat16_as_ushort(from_f32<bf16>(gelu_table::gelu_outside(gelu_table::bf16_input(b))));
}
__device__ __forceinline__ unsigned gelu_pair(const unsigned short* tab, unsigned w) {
  return gelu_bits(tab, w & 0xffffu) | (gelu_bits(tab, w >> 16) << 16);
}
__global__ void __launch_bounds__(kBlock)
    gelu_fwd_bf16_table_kernel(const uint4* __restrict__ x, uint4* __restrict__ y, int64_t nv) {
  __shared__ unsigned short tab[gelu_table::kEntries];
  gelu_table::fill(tab, nullptr);
  __syncthreads();
  const int64_t stride = grid_step();
  for (int64_t k = first_index(); k < nv; k += kIlp * stride) {
    uint4 a[kIlp];
#pragma unroll
    for (int u = 0; u < kIlp; ++u)
      if (k + u * stride < nv) a[u] = x[k + u * stride];
#pragma unroll
    for (int u = 0; u < kIlp; ++u) {
      if (k + u * stride >= nv) break;
      y[k + u * stride] = make_uint4(gelu_pair(tab, a[u].x), gelu_pair(tab, a[u].y),
                                     gelu_pair(tab, a[u].z), gelu_pair(tab, a[u].w));
    }
  }
}

template <typename T, bool Tanh, int kVec = kVecOf<T>>
__global__ void gelu_bwd_t_kernel(const T* __restrict__ x, const T* __restrict__ dy,
                                  T* __restrict__ dx, int64_t n, bool vec) {
  const int64_t nv = vec ? n / kVec : 0;
  CAI_GRID_STRIDE(k, nv) {
    float a[kVec], g[kVec];
    load_vec(x + k * kVec, a);
    load_vec(dy + k * kVec, g);
#pragma unroll
    for (int e = 0; e < kVec; ++e)
      a[e] = Tanh ? gelu_tanh_grad_f(a[e], g[e]) : gelu_grad_f(a[e], g[e]);
    store_vec(dx + k * kVec, a);
  }
  for (int64_t i = nv * kVec + first_index(); i < n; i += grid_step()) {
    const float v = to_f32(x[i]), g = to_f32(dy[i]);
    dx[i] = from_f32<T>(Tanh ? gelu_tanh_grad_f(v, g) : gelu_grad_f(v, g));
  }
}

template <bool Tanh>
void launch_fwd_t(DT t, const void* x, void* y, int64_t n, void* stream) {
  if (n <= 0) return;
  dispatch_dt(t, Tanh ? "gelu_tanh" : "gelu", [&](auto tag) {
    using T = decltype(tag);
    constexpr int kVec = kVecOf<T>;
    const bool vec = vec_aligned<T, kVec>(x) && vec_aligned<T, kVec>(y);
    if constexpr (std::is_same_v<T, bf16> && !Tanh) {
      if (vec && n >= kVec && gelu_table::enabled()) {
        // The table kernel for the whole vectors (one wave at most), the tail below.
        const int64_t nv = n / kVec, threads = (nv + kIlp - 1) / kIlp;
        const int64_t blocks = std::min<int64_t>(
            resident_blocks(gelu_fwd_bf16_table_kernel, kBlock), (threads + kBlock - 1) / kBlock);
        gelu_fwd_bf16_table_kernel<<<static_cast<unsigned>(blocks), kBlock, 0, as_stream(stream)>>>(
            static_cast<const uint4*>(x), static_cast<uint4*>(y), nv);
        CAI_CUDA_CHECK_LAUNCH();
        if (n % kVec == 0) return;
        x = static_cast<const T*>(x) + nv * kVec;
        y = static_cast<T*>(y) + nv * kVec;
        n -= nv * kVec;
      }
    }
    // Vectorised: a thread per kIlp vectors (at least one block, for the tail); else one per
    // element.
    const int64_t threads = vec ? std::max<int64_t>((n / kVec + kIlp - 1) / kIlp, 1) : n;
    gelu_fwd_t_kernel<T, Tanh><<<grid_for(threads), kBlock, 0, as_stream(stream)>>>(
        static_cast<const T*>(x), static_cast<T*>(y), n, vec);
    CAI_CUDA_CHECK_LAUNCH();
  });
}

template <bool Tanh>
void launch_bwd_t(DT t, const void* x, const void* dy, void* dx, int64_t n, void* stream) {
  if (n <= 0) return;
  dispatch_dt(t, Tanh ? "gelu_tanh" : "gelu", [&](auto tag) {
    using T = decltype(tag);
    constexpr int kVec = kVecOf<T>;
    const bool vec =
        vec_aligned<T, kVec>(x) && vec_aligned<T, kVec>(dy) && vec_aligned<T, kVec>(dx);
    gelu_bwd_t_kernel<T, Tanh>
        <<<grid_for(vec ? (n + kVec - 1) / kVec : n), kBlock, 0, as_stream(stream)>>>(
            static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(dx), n, vec);
    CAI_CUDA_CHECK_LAUNCH();
  });
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

void gelu_fwd_t(DT t, const void* x, void* y, int64_t n, void* stream) {
  launch_fwd_t<false>(t, x, y, n, stream);
}

void gelu_bwd_t(DT t, const void* x, const void* dy, void* dx, int64_t n, void* stream) {
  launch_bwd_t<false>(t, x, dy, dx, n, stream);
}

void gelu_tanh_fwd_t(DT t, const void* x, void* y, int64_t n, void* stream) {
  launch_fwd_t<true>(t, x, y, n, stream);
}

void gelu_tanh_bwd_t(DT t, const void* x, const void* dy, void* dx, int64_t n, void* stream) {
  launch_bwd_t<true>(t, x, dy, dx, n, stream);
}

}  // namespace cai::kernels::cuda
