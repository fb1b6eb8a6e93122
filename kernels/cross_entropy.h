// Cross-entropy with label smoothing eps over logits[b, k], labels[b] in [0, k):
//   loss_i = (1 - eps)·(-log p_i[y_i]) + eps·mean_j(-log p_i[j])   (PyTorch and timm agree)
// forward writes per-row losses[b]; backward writes dlogits = dloss·(softmax - target) where
// target = (1 - eps)·onehot + eps/k.
#pragma once
#include <cstdint>

namespace cai::kernels {
namespace cpu {
void cross_entropy_fwd(const float* logits, const int32_t* labels, float* losses, int64_t b,
                       int64_t k, float eps);
void cross_entropy_bwd(const float* logits, const int32_t* labels, float dloss, float* dlogits,
                       int64_t b, int64_t k, float eps);
}  // namespace cpu
namespace cuda {
void cross_entropy_fwd(const float* logits, const int32_t* labels, float* losses, int64_t b,
                       int64_t k, float eps, void* stream = nullptr);
void cross_entropy_bwd(const float* logits, const int32_t* labels, float dloss, float* dlogits,
                       int64_t b, int64_t k, float eps, void* stream = nullptr);
}  // namespace cuda
}  // namespace cai::kernels
