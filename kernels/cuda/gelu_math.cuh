// The GELU's device math (exact erf form and tanh approximation, forward and gradient), shared by
// the GELU kernels and the fused GELU-backward + bias-gradient column sum (linear.cu).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>

namespace cai::kernels::cuda {

__device__ __forceinline__ float gelu_f(float x) {
  return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
}
// The normal density φ(x) = e^(−x²/2)/√(2π) as 2^(−x²·log2(e)/2) on the SFU (ex2.approx.ftz,
// about 2 ulp; where e^(−x²/2) would be subnormal, |x| > 13.2, it is 0): expf's range reduction
// was the larger part of the backward's arithmetic, which is as long as its memory traffic.
__device__ __forceinline__ float normal_pdf_f(float x) {
  float e;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(-0.7213475204444817f * x * x));
  return 0.3989422804014327f * e;
}
// The GELU's slope gelu'(x) = Φ(x) + x·φ(x); its gradient is dy times it.
__device__ __forceinline__ float gelu_slope_f(float x) {
  const float cdf = 0.5f * (1.0f + erff(x * 0.7071067811865476f));
  return cdf + x * normal_pdf_f(x);
}
__device__ __forceinline__ float gelu_grad_f(float x, float dy) {
  return dy * gelu_slope_f(x);
}

// gelu_f(x) into *y and gelu_grad_f(x, dy) as the result, from one erf: the fused backward that
// makes the forward's output again (the same expressions, so the same values as those two).
__device__ __forceinline__ float gelu_and_grad_f(float x, float dy, float* y) {
  const float e = erff(x * 0.7071067811865476f);
  *y = 0.5f * x * (1.0f + e);
  const float cdf = 0.5f * (1.0f + e);
  return dy * (cdf + x * normal_pdf_f(x));
}

// The tanh approximation: 0.5·x·(1 + tanh(u)), u = √(2/π)·(x + 0.044715·x³), and its exact
// derivative 0.5·(1 + tanh u) + 0.5·x·(1 − tanh² u)·√(2/π)·(1 + 3·0.044715·x²). Written with
// 0.5·(1 + tanh u) = σ(2u) = 1 / (1 + e^(−2u)) and 0.5·(1 − tanh² u) = 2·σ(2u)·σ(−2u): no
// cancellation in 1 + tanh u for negative x (where tanhf's rounding near −1 would be the result).
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;
__device__ __forceinline__ float gelu_tanh_f(float x) {
  const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  return x / (1.0f + expf(-2.0f * u));  // e^(−2u) = inf: −0
}
__device__ __forceinline__ float gelu_tanh_grad_f(float x, float dy) {
  const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  const float s = 1.0f / (1.0f + expf(-2.0f * u)), sn = 1.0f / (1.0f + expf(2.0f * u));
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
  return dy * (s + 2.0f * x * s * sn * du);
}

// The exact GELU of bf16 inputs by table. On an H200 the erf-form kernels issue about 25
// instructions an element (erff's two polynomials and a branch) and ran compute-bound, below the
// memory's speed; a bf16 input has only 256 values an exponent, so a block computes gelu_f and
// gelu_slope_f once for each value with 2^-8 <= |x| < 16 (3,072 values: 6 KB of bf16 results, 12
// KB of fp32 slopes) into shared memory with the very functions above, and looks the elements up:
// the same bits as computing them. Smaller |x| take two terms of the series (x·(1/2 + x/√(2π)) and
// 1/2 + 2x/√(2π) − (2/3)·x³/√(2π), within an fp32 rounding of the erf forms there), larger ones
// and inf/NaN the functions themselves (a rare, divergent branch).
namespace gelu_table {
constexpr unsigned kLoBits = 119u << 7;                // |x| = 2^-8: exponent 119, mantissa 0
constexpr unsigned kHalf = (131u << 7) - kLoBits;      // the values of one sign below 2^4: 1,536
constexpr int kEntries = static_cast<int>(2 * kHalf);  // negative ones after the positive ones

// The slot of bf16 bits b, or kEntries when b is outside the table.
__device__ __forceinline__ unsigned slot(unsigned b) {
  const unsigned r = (b & 0x7fffu) - kLoBits;  // wraps to a large value below the table
  return r < kHalf ? r + (b >> 15) * kHalf : static_cast<unsigned>(kEntries);
}
// The input of slot i.
__device__ __forceinline__ float input(int i) {
  const unsigned u = static_cast<unsigned>(i), neg = u >= kHalf ? 1u : 0u;
  return __uint_as_float(((u - neg * kHalf + kLoBits) | (neg << 15)) << 16);
}
__device__ __forceinline__ float bf16_input(unsigned b) {
  return __uint_as_float(b << 16);
}
// Outside the table (x from bf16 bits outside it).
__device__ __forceinline__ float gelu_outside(float x) {
  return fabsf(x) < 0.00390625f ? x * fmaf(0.3989422804014327f, x, 0.5f) : gelu_f(x);
}
__device__ __forceinline__ float slope_outside(float x) {
  return fabsf(x) < 0.00390625f
             ? fmaf(x, fmaf(-0.2659615202676218f * x, x, 0.7978845608028654f), 0.5f)
             : gelu_slope_f(x);
}
// Whether the bf16 kernels take the tables: yes unless CAI_GELU_TABLE=0 (the erf forms then, for
// an A/B in one build).
inline bool enabled() {
  static const bool on = [] {
    const char* v = std::getenv("CAI_GELU_TABLE");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}
// Fill the tables (either may be null) with the block's threads; the caller syncs before use.
__device__ __forceinline__ void fill(unsigned short* fwd, float* slope) {
  for (int i = threadIdx.y * blockDim.x + threadIdx.x; i < kEntries; i += blockDim.x * blockDim.y) {
    const float x = input(i);
    if (fwd) fwd[i] = __bfloat16_as_ushort(__float2bfloat16_rn(gelu_f(x)));
    if (slope) slope[i] = gelu_slope_f(x);
  }
}
}  // namespace gelu_table

}  // namespace cai::kernels::cuda
