// LayerNorm over the last dimension d of x[m, d]. Forward saves mean[m] and rstd[m] for the
// backward, which overwrites dx and accumulates dgamma/dbeta.
#pragma once
#include <cstdint>

#include "kernels/base/dtype.h"

namespace cai::kernels {
namespace cpu {
void layernorm_fwd(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                   float* rstd, int64_t m, int64_t d, float eps);
void layernorm_bwd(const float* x, const float* gamma, const float* mean, const float* rstd,
                   const float* dy, float* dx, float* dgamma, float* dbeta, int64_t m, int64_t d);
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
}  // namespace cuda
}  // namespace cai::kernels
