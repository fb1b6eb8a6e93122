// LayerNorm over the last dimension d of x[m, d]. Forward saves mean[m] and rstd[m] for the
// backward, which overwrites dx and accumulates dgamma/dbeta.
//
// The split kernels serve a hidden dimension split across ranks: x[m, f] holds f of the F
// (`features`) columns of every row, and the caller sums each per-row partial over the ranks of a
// row between the steps (all-reduce). In order:
//   layernorm_row_sums(mean = null) -> sums[i] = Σ_j x; mean = all-reduced sums / F
//   layernorm_row_sums(mean)        -> sums[i] = Σ_j (x − mean)²; sqdev = all-reduced sums
//   layernorm_split_fwd             -> y = x̂·γ + β, rstd[i] = 1/√(sqdev[i]/F + eps)
//   layernorm_split_bwd_sums        -> sums[i] = {Σ_j dy·γ, Σ_j dy·γ·x̂}; dgamma/dbeta accumulate
//   layernorm_split_bwd             -> dx = rstd·(dy·γ − (sums[i][0] + x̂·sums[i][1]) / F)
// with x̂ = (x − mean)·rstd. All fp32; every pointer but dgamma/dbeta non-null.
#pragma once
#include <cstdint>

#include "kernels/base/dtype.h"

namespace cai::kernels {
namespace cpu {
void layernorm_fwd(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                   float* rstd, int64_t m, int64_t d, float eps);
void layernorm_bwd(const float* x, const float* gamma, const float* mean, const float* rstd,
                   const float* dy, float* dx, float* dgamma, float* dbeta, int64_t m, int64_t d);

void layernorm_row_sums(const float* x, const float* mean, float* sums, int64_t m, int64_t f);
void layernorm_split_fwd(const float* x, const float* gamma, const float* beta, const float* mean,
                         const float* sqdev, float* y, float* rstd, int64_t m, int64_t f,
                         int64_t features, float eps);
void layernorm_split_bwd_sums(const float* x, const float* gamma, const float* mean,
                              const float* rstd, const float* dy, float* sums, float* dgamma,
                              float* dbeta, int64_t m, int64_t f);
void layernorm_split_bwd(const float* x, const float* gamma, const float* mean, const float* rstd,
                         const float* dy, const float* sums, float* dx, int64_t m, int64_t f,
                         int64_t features);
}  // namespace cpu
namespace cuda {
void layernorm_fwd(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                   float* rstd, int64_t m, int64_t d, float eps, void* stream = nullptr);
void layernorm_bwd(const float* x, const float* gamma, const float* mean, const float* rstd,
                   const float* dy, float* dx, float* dgamma, float* dbeta, int64_t m, int64_t d,
                   void* stream = nullptr);

// Typed: x in xt, y in yt; gamma, beta, mean, rstd fp32. Backward: dy in dyt, dx in dxt
// (overwritten); dgamma, dbeta fp32, accumulated. Statistics in fp32.
void layernorm_fwd_t(DT xt, const void* x, const float* gamma, const float* beta, DT yt, void* y,
                     float* mean, float* rstd, int64_t m, int64_t d, float eps,
                     void* stream = nullptr);
void layernorm_bwd_t(DT xt, const void* x, const float* gamma, const float* mean, const float* rstd,
                     DT dyt, const void* dy, DT dxt, void* dx, float* dgamma, float* dbeta,
                     int64_t m, int64_t d, void* stream = nullptr);
// As layernorm_bwd_t, then dx += residual (dxt, same shape; null: nothing added) and, when half is
// not null, a copy of the final dx rounded to half_t (bf16 or fp16) — one pass where the fused
// (vectorised) kernel applies, else separate add and cast passes. dx must not be null then.
// With dsum not null (fp32 [d]), also the column sums Σ_rows of the final dx as the half copy holds
// it (dx itself without one): the bias gradient of the GEMM that takes it as its output gradient,
// added to dsum when dsum_add, else written (from the fused kernel's partial sums, or a separate
// column-sum pass).
void layernorm_bwd_add_t(DT xt, const void* x, const float* gamma, const float* mean,
                         const float* rstd, DT dyt, const void* dy, DT dxt, void* dx,
                         const void* residual, DT half_t, void* half, float* dgamma, float* dbeta,
                         float* dsum, bool dsum_add, int64_t m, int64_t d, void* stream = nullptr);

// The split kernels, as on the CPU (fp32; the ops layer converts half tensors).
void layernorm_row_sums(const float* x, const float* mean, float* sums, int64_t m, int64_t f,
                        void* stream = nullptr);
void layernorm_split_fwd(const float* x, const float* gamma, const float* beta, const float* mean,
                         const float* sqdev, float* y, float* rstd, int64_t m, int64_t f,
                         int64_t features, float eps, void* stream = nullptr);
void layernorm_split_bwd_sums(const float* x, const float* gamma, const float* mean,
                              const float* rstd, const float* dy, float* sums, float* dgamma,
                              float* dbeta, int64_t m, int64_t f, void* stream = nullptr);
void layernorm_split_bwd(const float* x, const float* gamma, const float* mean, const float* rstd,
                         const float* dy, const float* sums, float* dx, int64_t m, int64_t f,
                         int64_t features, void* stream = nullptr);
}  // namespace cuda
}  // namespace cai::kernels
