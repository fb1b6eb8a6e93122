// Linear layer kernels: y[M,N] = x[M,K] · w[N,K]^T + b[N] (PyTorch's weight layout), fp32.
// Backward accumulates into dw/db (so micro-batches and gradient accumulation add up) and
// overwrites dx. Any of dx, dw, db, b may be null.
#pragma once
#include <cstdint>

namespace cai::kernels {
namespace cpu {
void linear_fwd(const float* x, const float* w, const float* b, float* y, int64_t m, int64_t k,
                int64_t n);
void linear_bwd(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                int64_t m, int64_t k, int64_t n);
}  // namespace cpu
namespace cuda {
void linear_fwd(const float* x, const float* w, const float* b, float* y, int64_t m, int64_t k,
                int64_t n, void* stream = nullptr);
void linear_bwd(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                int64_t m, int64_t k, int64_t n, void* stream = nullptr);
}  // namespace cuda
}  // namespace cai::kernels
