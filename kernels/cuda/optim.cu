// Optimizer updates, one thread per element, with the formulas of kernels/cpu/optim.cpp. The bias
// corrections are computed on the host in float exactly as the CPU does and passed in.
#include <cmath>

#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"
#include "kernels/optim.h"

namespace cai::kernels::cuda {

namespace {

__global__ void sgd_kernel(float* p, const float* grad, float* buf, int64_t n, float lr,
                           float momentum, float dampening, float weight_decay, bool nesterov,
                           bool first) {
  CAI_GRID_STRIDE(i, n) {
    float g = grad[i];
    if (weight_decay != 0.0f) g += weight_decay * p[i];
    if (momentum != 0.0f) {
      const float b = first ? g : momentum * buf[i] + (1.0f - dampening) * g;
      buf[i] = b;
      g = nesterov ? g + momentum * b : b;
    }
    p[i] -= lr * g;
  }
}

// decay = 1 − lr·wd (decoupled), step_size = lr / (1 − β1^t), bc2_sqrt = √(1 − β2^t).
__global__ void adam_kernel(float* p, const float* grad, float* m, float* v, int64_t n, float beta1,
                            float beta2, float eps, float weight_decay, float decay,
                            float step_size, float bc2_sqrt, bool decoupled) {
  CAI_GRID_STRIDE(i, n) {
    float g = grad[i];
    float pi = p[i];
    if (decoupled)
      pi *= decay;
    else if (weight_decay != 0.0f)
      g += weight_decay * pi;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) / bc2_sqrt + eps;
    p[i] = pi - step_size * (mi / denom);
  }
}

// bc1 = 1 − β1^t, bc2_sqrt = √(1 − β2^t).
__global__ void lamb_kernel(const float* p, const float* grad, float* m, float* v, float* update,
                            int64_t n, float beta1, float beta2, float eps, float weight_decay,
                            float bc1, float bc2_sqrt) {
  CAI_GRID_STRIDE(i, n) {
    const float g = grad[i];
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) / bc2_sqrt + eps;
    update[i] = (mi / bc1) / denom + weight_decay * p[i];
  }
}

}  // namespace

void sgd_step(float* p, const float* grad, float* buf, int64_t n, float lr, float momentum,
              float dampening, float weight_decay, bool nesterov, bool first, void* stream) {
  if (n <= 0) return;
  sgd_kernel<<<grid_for(n), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
      p, grad, buf, n, lr, momentum, dampening, weight_decay, nesterov, first);
  CAI_CUDA_CHECK_LAUNCH();
}

void adam_step(float* p, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
               float beta2, float eps, float weight_decay, int64_t step, bool decoupled,
               void* stream) {
  if (n <= 0) return;
  // As the CPU: float pow of float step.
  const float bc1 = 1.0f - std::pow(beta1, static_cast<float>(step));
  const float bc2_sqrt = std::sqrt(1.0f - std::pow(beta2, static_cast<float>(step)));
  const float step_size = lr / bc1;
  const float decay = 1.0f - lr * weight_decay;
  adam_kernel<<<grid_for(n), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
      p, grad, m, v, n, beta1, beta2, eps, weight_decay, decay, step_size, bc2_sqrt, decoupled);
  CAI_CUDA_CHECK_LAUNCH();
}

void lamb_update(const float* p, const float* grad, float* m, float* v, float* update, int64_t n,
                 float beta1, float beta2, float eps, float weight_decay, int64_t step,
                 void* stream) {
  if (n <= 0) return;
  const float bc1 = 1.0f - std::pow(beta1, static_cast<float>(step));
  const float bc2 = 1.0f - std::pow(beta2, static_cast<float>(step));
  const float bc2_sqrt = std::sqrt(bc2);
  lamb_kernel<<<grid_for(n), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
      p, grad, m, v, update, n, beta1, beta2, eps, weight_decay, bc1, bc2_sqrt);
  CAI_CUDA_CHECK_LAUNCH();
}

}  // namespace cai::kernels::cuda
