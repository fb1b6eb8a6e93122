#include "kernels/optim.h"
#include "kernels/cpu/parallel.h"

#include <cmath>

namespace cai::kernels::cpu {

void sgd_step(float* p, const float* grad, float* buf, int64_t n, float lr, float momentum,
              float dampening, float weight_decay, bool nesterov, bool first) {
  parallel_for(n, 16384, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) {
      float g = grad[i];
      if (weight_decay != 0.0f) g += weight_decay * p[i];
      if (momentum != 0.0f) {
        buf[i] = first ? g : momentum * buf[i] + (1.0f - dampening) * g;
        g = nesterov ? g + momentum * buf[i] : buf[i];
      }
      p[i] -= lr * g;
    }
  });
}

void adam_step(float* p, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
               float beta2, float eps, float weight_decay, int64_t step, bool decoupled) {
  const float bc1 = 1.0f - std::pow(beta1, static_cast<float>(step));
  const float bc2_sqrt = std::sqrt(1.0f - std::pow(beta2, static_cast<float>(step)));
  const float step_size = lr / bc1;
  parallel_for(n, 16384, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) {
      float g = grad[i];
      if (decoupled)
        p[i] *= 1.0f - lr * weight_decay;
      else if (weight_decay != 0.0f)
        g += weight_decay * p[i];
      m[i] = beta1 * m[i] + (1.0f - beta1) * g;
      v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
      const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
      p[i] -= step_size * (m[i] / denom);
    }
  });
}

void lamb_update(const float* p, const float* grad, float* m, float* v, float* update, int64_t n,
                 float beta1, float beta2, float eps, float weight_decay, int64_t step) {
  const float bc1 = 1.0f - std::pow(beta1, static_cast<float>(step));
  const float bc2 = 1.0f - std::pow(beta2, static_cast<float>(step));
  const float bc2_sqrt = std::sqrt(bc2);
  parallel_for(n, 16384, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) {
      const float g = grad[i];
      m[i] = beta1 * m[i] + (1.0f - beta1) * g;
      v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
      const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
      update[i] = (m[i] / bc1) / denom + weight_decay * p[i];
    }
  });
}

}  // namespace cai::kernels::cpu
