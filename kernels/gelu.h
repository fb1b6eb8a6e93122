// GELU with the exact erf form, 0.5·x·(1 + erf(x/√2)), as nn.GELU() in PyTorch.
#pragma once
#include <cstdint>

#include "kernels/base/dtype.h"

namespace cai::kernels {
namespace cpu {
void gelu_fwd(const float* x, float* y, int64_t n);
void gelu_bwd(const float* x, const float* dy, float* dx, int64_t n);
// The tanh approximation, 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))): nn.GELU(approximate="tanh")
// and cuBLASLt's GELU epilogue.
void gelu_tanh_fwd(const float* x, float* y, int64_t n);
void gelu_tanh_bwd(const float* x, const float* dy, float* dx, int64_t n);
}  // namespace cpu
namespace cuda {
void gelu_fwd(const float* x, float* y, int64_t n, void* stream = nullptr);
void gelu_bwd(const float* x, const float* dy, float* dx, int64_t n, void* stream = nullptr);

// Typed: x, y, dy, dx all in t; math in fp32.
void gelu_fwd_t(DT t, const void* x, void* y, int64_t n, void* stream = nullptr);
void gelu_bwd_t(DT t, const void* x, const void* dy, void* dx, int64_t n, void* stream = nullptr);
// The tanh approximation (as cpu::gelu_tanh_*), any t including F32.
void gelu_tanh_fwd_t(DT t, const void* x, void* y, int64_t n, void* stream = nullptr);
void gelu_tanh_bwd_t(DT t, const void* x, const void* dy, void* dx, int64_t n,
                     void* stream = nullptr);
// The GELU's backward over x[m, n] (exact, or tanh) with the bias gradient of the linear that
// produced x: dx = gelu'(x)·dy in t, and db[j] += Σ_i dx[i, j] (dx as rounded to t, summed in
// double in a fixed order, as linear_bwd_t's column sum) in one pass (linear.cu). y (optional,
// [m, n] in t): the GELU's output made again in the same pass, equal to gelu_fwd_t's (or
// gelu_tanh_fwd_t's) for a backward that did not keep it from the forward.
void gelu_bwd_bias_t(DT t, bool tanh, const void* x, const void* dy, void* dx, float* db, int64_t m,
                     int64_t n, void* y = nullptr, void* stream = nullptr);
}  // namespace cuda
}  // namespace cai::kernels
