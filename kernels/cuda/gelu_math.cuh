// The GELU's device math (exact erf form and tanh approximation, forward and gradient), shared by
// the GELU kernels and the fused GELU-backward + bias-gradient column sum (linear.cu).
#pragma once
#include <cuda_runtime.h>

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
__device__ __forceinline__ float gelu_grad_f(float x, float dy) {
  const float cdf = 0.5f * (1.0f + erff(x * 0.7071067811865476f));
  return dy * (cdf + x * normal_pdf_f(x));
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

}  // namespace cai::kernels::cuda
