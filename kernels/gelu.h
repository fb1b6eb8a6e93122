// GELU with the exact erf form, 0.5·x·(1 + erf(x/√2)), as nn.GELU() in PyTorch.
#pragma once
#include <cstdint>

namespace cai::kernels {
namespace cpu {
void gelu_fwd(const float* x, float* y, int64_t n);
void gelu_bwd(const float* x, const float* dy, float* dx, int64_t n);
}  // namespace cpu
namespace cuda {
void gelu_fwd(const float* x, float* y, int64_t n, void* stream = nullptr);
void gelu_bwd(const float* x, const float* dy, float* dx, int64_t n, void* stream = nullptr);
}  // namespace cuda
}  // namespace cai::kernels
