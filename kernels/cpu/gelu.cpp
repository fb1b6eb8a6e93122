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

}  // namespace cai::kernels::cpu
