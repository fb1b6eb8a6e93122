// Small elementwise helpers used by the ops and optimizers (fp32).
#pragma once
#include <cstdint>

#include "kernels/base/dtype.h"

namespace cai::kernels {
namespace cpu {
void add(const float* a, const float* b, float* y, int64_t n);  // y = a + b
void axpy(float alpha, const float* x, float* y, int64_t n);    // y += alpha·x
void scale(float alpha, float* x, int64_t n);                   // x *= alpha
void fill(float value, float* x, int64_t n);
double sum_squares(const float* x, int64_t n);  // accumulated in double
}  // namespace cpu
namespace cuda {
void add(const float* a, const float* b, float* y, int64_t n, void* stream = nullptr);
void axpy(float alpha, const float* x, float* y, int64_t n, void* stream = nullptr);
void scale(float alpha, float* x, int64_t n, void* stream = nullptr);
void fill(float value, float* x, int64_t n, void* stream = nullptr);
double sum_squares(const float* x, int64_t n, void* stream = nullptr);

// Typed elementwise.
// cast: dst[i] = src[i] converted (round to nearest even).
void cast(DT src_t, const void* src, DT dst_t, void* dst, int64_t n, void* stream = nullptr);
// cast_multi: dst_i[k] = src_i[k] rounded to dst_t (bf16 or fp16) for i < count ≤ kCastMulti,
// tensors of n_i fp32 elements, in one launch (a module's weights in the compute dtype).
constexpr int kCastMulti = 16;
void cast_multi(int count, const float* const* src, DT dst_t, void* const* dst, const int64_t* n,
                void* stream = nullptr);
// zero_multi: bytes_i bytes at p_i set to 0 for i < count ≤ kZeroMulti, in one launch (a model's
// gradients: one launch instead of a memset per tensor, 152 for ViT-B).
constexpr int kZeroMulti = 64;
void zero_multi(int count, void* const* p, const int64_t* bytes, void* stream = nullptr);
// y = a + b with each operand in its own type (math in fp32).
void add_t(DT at, const void* a, DT bt, const void* b, DT yt, void* y, int64_t n,
           void* stream = nullptr);
// y += alpha·x, y fp32, x in xt.
void axpy_t(float alpha, DT xt, const void* x, float* y, int64_t n, void* stream = nullptr);
// Number of elements of fp32 x that are inf or NaN (the loss scaler's overflow check).
int64_t count_nonfinite(const float* x, int64_t n, void* stream = nullptr);
}  // namespace cuda
}  // namespace cai::kernels
