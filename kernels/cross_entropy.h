// Cross-entropy with label smoothing eps over logits[b, k], labels[b] in [0, k):
//   loss_i = (1 - eps)·(-log p_i[y_i]) + eps·mean_j(-log p_i[j])   (PyTorch and timm agree)
// forward writes per-row losses[b]; backward writes dlogits = dloss·(softmax - target) where
// target = (1 - eps)·onehot + eps/k.
// loss_metrics adds Σ_i losses[i] to sums[0] and the number of rows whose first maximum of
// logits[i, :] is labels[i] to sums[1]: the trainer's loss and accuracy, accumulated where the
// logits live (device memory for CUDA: nothing is read back to the host).
#pragma once
#include <cstdint>

namespace cai::kernels {
namespace cpu {
void cross_entropy_fwd(const float* logits, const int32_t* labels, float* losses, int64_t b,
                       int64_t k, float eps);
void cross_entropy_bwd(const float* logits, const int32_t* labels, float dloss, float* dlogits,
                       int64_t b, int64_t k, float eps);
void loss_metrics(const float* losses, const float* logits, const int32_t* labels, int64_t b,
                  int64_t k, float* sums);
}  // namespace cpu
namespace cuda {
void cross_entropy_fwd(const float* logits, const int32_t* labels, float* losses, int64_t b,
                       int64_t k, float eps, void* stream = nullptr);
void cross_entropy_bwd(const float* logits, const int32_t* labels, float dloss, float* dlogits,
                       int64_t b, int64_t k, float eps, void* stream = nullptr);
void loss_metrics(const float* losses, const float* logits, const int32_t* labels, int64_t b,
                  int64_t k, float* sums, void* stream = nullptr);
}  // namespace cuda
}  // namespace cai::kernels
