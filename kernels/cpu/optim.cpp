#include "kernels/optim.h"
#include "kernels/cpu/parallel.h"
#include "kernels/elementwise.h"

#include <cmath>
#include <vector>

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

namespace {
// grad · grad_scale in `scaled` (grad itself when the scale is 1).
const float* scaled_grad(const float* grad, int64_t n, float grad_scale,
                         std::vector<float>& scaled) {
  if (grad_scale == 1.0f) return grad;
  scaled.resize(static_cast<size_t>(n));
  parallel_for(n, 16384, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) scaled[i] = grad[i] * grad_scale;
  });
  return scaled.data();
}
}  // namespace

void multi_tensor_adam(int count, float* const* p, const float* const* g, float* const* m,
                       float* const* v, const int64_t* n, const float* wd, float lr, float beta1,
                       float beta2, float eps, int64_t step, bool decoupled, float grad_scale) {
  std::vector<float> scaled;
  for (int i = 0; i < count; ++i) {
    if (n[i] <= 0) continue;
    adam_step(p[i], scaled_grad(g[i], n[i], grad_scale, scaled), m[i], v[i], n[i], lr, beta1, beta2,
              eps, wd[i], step, decoupled);
  }
}

void multi_tensor_lamb(int count, float* const* p, const float* const* g, float* const* m,
                       float* const* v, const int64_t* n, const float* wd, float lr, float beta1,
                       float beta2, float eps, int64_t step, float grad_scale) {
  std::vector<float> scaled, u;
  for (int i = 0; i < count; ++i) {
    if (n[i] <= 0) continue;
    u.resize(static_cast<size_t>(n[i]));
    lamb_update(p[i], scaled_grad(g[i], n[i], grad_scale, scaled), m[i], v[i], u.data(), n[i],
                beta1, beta2, eps, wd[i], step);
    // Trust ratio as Lamb::update (timm): ‖p‖/‖u‖ with weight decay and both norms positive.
    double trust = 1.0;
    if (wd[i] != 0.0f) {
      const double w_norm = std::sqrt(sum_squares(p[i], n[i]));
      const double u_norm = std::sqrt(sum_squares(u.data(), n[i]));
      if (w_norm > 0 && u_norm > 0) trust = w_norm / u_norm;
    }
    axpy(static_cast<float>(-static_cast<double>(lr) * trust), u.data(), p[i], n[i]);
  }
}

}  // namespace cai::kernels::cpu
