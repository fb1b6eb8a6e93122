#include "kernels/gelu.h"

#include <cmath>

#include "kernels/cpu/parallel.h"

namespace cai::kernels::cpu {

void gelu_fwd(const float* x, float* y, int64_t n) {
  parallel_for(n, 16384, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * float(M_SQRT1_2)));
  });
}

void gelu_bwd(const float* x, const float* dy, float* dx, int64_t n) {
  // d/dx [x·Φ(x)] = Φ(x) + x·φ(x)
  const float inv_sqrt_2pi = 0.3989422804014327f;
  parallel_for(n, 16384, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) {
      const float cdf = 0.5f * (1.0f + std::erf(x[i] * float(M_SQRT1_2)));
      const float pdf = inv_sqrt_2pi * std::exp(-0.5f * x[i] * x[i]);
      dx[i] = dy[i] * (cdf + x[i] * pdf);
    }
  });
}

// 0.5·x·(1 + tanh(u)), u = √(2/π)·(x + 0.044715·x³);
// d/dx = 0.5·(1 + tanh u) + 0.5·x·(1 − tanh² u)·√(2/π)·(1 + 3·0.044715·x²).
namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;
}  // namespace

void gelu_tanh_fwd(const float* x, float* y, int64_t n) {
  parallel_for(n, 16384, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) {
      const float v = x[i];
      y[i] = 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + kCubic * v * v * v)));
    }
  });
}

void gelu_tanh_bwd(const float* x, const float* dy, float* dx, int64_t n) {
  parallel_for(n, 16384, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) {
      const float v = x[i];
      const float t = std::tanh(kSqrt2OverPi * (v + kCubic * v * v * v));
      const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * v * v);
      dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
    }
  });
}

}  // namespace cai::kernels::cpu
