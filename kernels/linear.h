// Linear layer kernels: y[M,N] = x[M,K] · w[N,K]^T + b[N] (PyTorch's weight layout), fp32.
// Backward accumulates into dw/db (so micro-batches and gradient accumulation add up) and
// overwrites dx. Any of dx, dw, db, b may be null.
#pragma once
#include <cstdint>

#include "kernels/base/dtype.h"

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

// Typed linear on cuBLASLt (fp32 accumulation). x, w, b are in `t`; y is in `yt` (t or F32) and b,
// when given, must be in yt. t == F32 runs plain FP32 (tf32 = true allows TF32 tensor cores).
void linear_fwd_t(DT t, const void* x, const void* w, const void* b, DT yt, void* y, int64_t m,
                  int64_t k, int64_t n, bool tf32 = false, void* stream = nullptr);
// The residual stream's add in the GEMM's epilogue: y[m, n] = r + x·wᵀ + b, y, r and b fp32
// (b may be null), x and w in t. y must not overlap r.
void linear_fwd_residual_t(DT t, const void* x, const void* w, const float* b, const float* r,
                           float* y, int64_t m, int64_t k, int64_t n, void* stream = nullptr);
// x, w, dy, dx in `t`: dx = dy·w (overwritten); dw[n, k] += dy^T·x and db[n] += Σ_rows dy, both
// fp32 (the master gradients) and accumulated. Any of dx, dw, db may be null.
void linear_bwd_t(DT t, const void* x, const void* w, const void* dy, void* dx, float* dw,
                  float* db, int64_t m, int64_t k, int64_t n, bool tf32 = false,
                  void* stream = nullptr);
// db[n] += Σ_rows y for y[m, n] in `t`: linear_bwd_t's bias gradient alone (fp32, summed in
// double in a fixed order).
void column_sum_t(DT t, const void* y, float* db, int64_t m, int64_t n, void* stream = nullptr);
// The MLP's first linear with cuBLASLt's bias + GELU epilogue (GELU's tanh approximation): x, w,
// b, pre, y in t (BF16, F16 or F32 without TF32); pre[m, n] = x·wᵀ + b is saved for the backward
// (the epilogue's aux output), y = gelu_tanh(pre). Where cuBLASLt refuses the epilogue it runs
// the GEMM with the bias epilogue and a separate gelu_tanh kernel (same results within rounding).
void linear_gelu_fwd_t(DT t, const void* x, const void* w, const void* b, void* pre, void* y,
                       int64_t m, int64_t k, int64_t n, void* stream = nullptr);
// linear_bwd_t of the layer AFTER the GELU (x = gelu_tanh(pre) [m, k], w [n, k], dy [m, n]),
// whose input gradient goes through the GELU's backward in the GEMM epilogue (DGELU, aux = pre):
// dpre[m, k] = gelu_tanh'(pre) ∘ (dy·w) (type t, overwritten); dw, db (fp32) accumulate.
void linear_bwd_dgelu_t(DT t, const void* x, const void* w, const void* dy, const void* pre,
                        void* dpre, float* dw, float* db, int64_t m, int64_t k, int64_t n,
                        void* stream = nullptr);
}  // namespace cuda
}  // namespace cai::kernels
