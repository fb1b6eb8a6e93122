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

// Gradient statistics and global-norm clipping over `count` fp32 tensors x[i] of n[i] elements
// (every gradient in one pass; the CUDA versions are two launches, never one per tensor):
//  multi_tensor_grad_stats: multiplies every tensor by `scale` first when scale != 1 (the fp16
//    unscale), then writes out[0] = Σ_i weight[i]·Σ_j x_i[j]² (weight: a host array, null = all
//    1; a weight of 0 skips the tensor's squares) and out[1] = the number of inf/NaN elements of
//    every tensor. `out` is 2 floats where the tensors live (device memory for CUDA); the sums are
//    accumulated in double.
//  multi_tensor_clip: x_i *= c for every tensor with c = max_norm / (√sq[0] + 1e-6) when c < 1
//    (PyTorch's clip_grad_norm_), sq[0] read where it lies (device memory for CUDA: no host
//    read); writes norm[0] = √sq[0] when `norm` is not null.

namespace cai::kernels {

// Gradients whose sum over the ranks is taken where they are read (the copy-engine gradient
// exchange, DDP): with n > 0, gradient element x at address a is read as
// a[delta[0]] + a[delta[1]] + ... + a[delta[n-1]], added in that order in fp32 (delta: element
// offsets from the gradient memory to every rank's copy of it in rank order, 0 for the own
// copy; multiples of 4, so float4 accesses stay aligned). n = 0: the gradients as they are.
constexpr int kMaxGradReplicas = 8;
struct GradReplicas {
  int n = 0;
  int64_t delta[kMaxGradReplicas] = {};
};

namespace cpu {
void sgd_step(float* p, const float* grad, float* buf, int64_t n, float lr, float momentum,
              float dampening, float weight_decay, bool nesterov, bool first);
// grad_scale: the gradients read multiplied by it (a deferred clip's factor; the products of
// scaling them in place first). out_bf16 (may be null): the updated values also written there
// rounded to bf16 (round to nearest even; ZeRO-Offload's device copy staged in the same pass).
void adam_step(float* p, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
               float beta2, float eps, float weight_decay, int64_t step, bool decoupled,
               float grad_scale = 1.0f, uint16_t* out_bf16 = nullptr);
void lamb_update(const float* p, const float* grad, float* m, float* v, float* update, int64_t n,
                 float beta1, float beta2, float eps, float weight_decay, int64_t step);
// The CUDA multi-tensor updates' twins (below): a loop over the tensors through adam_step and
// lamb_update (+ trust ratio), the gradients multiplied by grad_scale first.
void multi_tensor_adam(int count, float* const* p, const float* const* g, float* const* m,
                       float* const* v, const int64_t* n, const float* wd, float lr, float beta1,
                       float beta2, float eps, int64_t step, bool decoupled,
                       float grad_scale = 1.0f);
void multi_tensor_lamb(int count, float* const* p, const float* const* g, float* const* m,
                       float* const* v, const int64_t* n, const float* wd, float lr, float beta1,
                       float beta2, float eps, int64_t step, float grad_scale = 1.0f);
void multi_tensor_grad_stats(int count, float* const* x, const int64_t* n, const float* weight,
                             float scale, float* out);
void multi_tensor_clip(int count, float* const* x, const int64_t* n, const float* sq,
                       float max_norm, float* norm);
// The blocks (elements from a tensor's start) over which the statistics sum a tensor's squares.
constexpr int64_t kSquaresBlock = 65536;
// y = x (assign) or y += x over [0, n), then *sq = Σ y² (double) and *bad = the inf/NaN count of
// y, summed exactly as multi_tensor_grad_stats sums one tensor (same blocks, same order): the
// statistics of a gradient taken as its last addition makes it (ZeRO-Offload's host adds of the
// last micro-batch) equal a pass over it afterwards, bit for bit.
void add_with_squares(float* y, const float* x, int64_t n, bool assign, double* sq, int64_t* bad);
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

// Multi-tensor fused updates: one pass (a few launches, not one per tensor) over `count` tensors
// given as host arrays of device pointers, lengths n[i] and weight decays wd[i]. Gradients are
// multiplied by grad_scale first (1/loss scale; 1 otherwise). Same formulas as adam_step and, for
// LAMB, lamb_update followed by p -= lr·trust·u with trust = ‖p‖/‖u‖ when wd[i] != 0 and both norms
// are positive, else 1 (timm's Lamb, as Lamb::update does it).
// clip_sq (device, may be null): the global-norm clip folded in: the gradients are multiplied by
// c = clip_max / (√clip_sq[0] + 1e-6) first when c < 1 (multi_tensor_clip's factor and product,
// so the update equals clipping in place and then stepping), the gradient memory left as it is.
// replicas (may be null): the gradients read as their sum over the ranks (GradReplicas).
void multi_tensor_adam(int count, float* const* p, const float* const* g, float* const* m,
                       float* const* v, const int64_t* n, const float* wd, float lr, float beta1,
                       float beta2, float eps, int64_t step, bool decoupled,
                       float grad_scale = 1.0f, void* stream = nullptr,
                       const float* clip_sq = nullptr, float clip_max = 0.0f,
                       const GradReplicas* replicas = nullptr);
void multi_tensor_lamb(int count, float* const* p, const float* const* g, float* const* m,
                       float* const* v, const int64_t* n, const float* wd, float lr, float beta1,
                       float beta2, float eps, int64_t step, float grad_scale = 1.0f,
                       void* stream = nullptr);
// replicas (may be null; only with scale = 1): the statistics of the sum over the ranks.
void multi_tensor_grad_stats(int count, float* const* x, const int64_t* n, const float* weight,
                             float scale, float* out, void* stream = nullptr,
                             const GradReplicas* replicas = nullptr);
void multi_tensor_clip(int count, float* const* x, const int64_t* n, const float* sq,
                       float max_norm, float* norm, void* stream = nullptr);
}  // namespace cuda
}  // namespace cai::kernels
