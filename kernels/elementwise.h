// Small elementwise helpers used by the ops and optimizers (fp32).
#pragma once
#include <cstdint>

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
}  // namespace cuda
}  // namespace cai::kernels
