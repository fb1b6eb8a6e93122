// Optimizer updates over one parameter tensor of n fp32 elements (PyTorch's formulas).
//  sgd_step:  g = grad + wd·p; buf = first ? g : momentum·buf + (1 − dampening)·g;
//             d = nesterov ? g + momentum·buf : buf (d = g without momentum); p −= lr·d
//  adam_step: decoupled (AdamW): p ·= 1 − lr·wd, else g = grad + wd·p; m = β1·m + (1 − β1)·g;
//             v = β2·v + (1 − β2)·g²; p −= lr/(1 − β1^t) · m / (√v/√(1 − β2^t) + eps)
//  lamb_update: m, v as Adam with grad averaging; writes the raw update
//             u = (m/(1 − β1^t)) / (√(v/(1 − β2^t)) + eps) + wd·p  (the caller applies the trust
//             ratio ‖p‖/‖u‖ and the learning rate, as timm's Lamb)
#pragma once
#include <cstdint>

namespace cai::kernels {
namespace cpu {
void sgd_step(float* p, const float* grad, float* buf, int64_t n, float lr, float momentum,
              float dampening, float weight_decay, bool nesterov, bool first);
void adam_step(float* p, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
               float beta2, float eps, float weight_decay, int64_t step, bool decoupled);
void lamb_update(const float* p, const float* grad, float* m, float* v, float* update, int64_t n,
                 float beta1, float beta2, float eps, float weight_decay, int64_t step);
}  // namespace cpu
namespace cuda {
void sgd_step(float* p, const float* grad, float* buf, int64_t n, float lr, float momentum,
              float dampening, float weight_decay, bool nesterov, bool first,
              void* stream = nullptr);
void adam_step(float* p, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
               float beta2, float eps, float weight_decay, int64_t step, bool decoupled,
               void* stream = nullptr);
void lamb_update(const float* p, const float* grad, float* m, float* v, float* update, int64_t n,
                 float beta1, float beta2, float eps, float weight_decay, int64_t step,
                 void* stream = nullptr);
}  // namespace cuda
}  // namespace cai::kernels
