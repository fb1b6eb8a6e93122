#include "kernels/elementwise.h"

namespace cai::kernels::cpu {

void add(const float* a, const float* b, float* y, int64_t n) {
#pragma omp parallel for simd if (n > 65536)
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}
void axpy(float alpha, const float* x, float* y, int64_t n) {
#pragma omp parallel for simd if (n > 65536)
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}
void scale(float alpha, float* x, int64_t n) {
#pragma omp parallel for simd if (n > 65536)
  for (int64_t i = 0; i < n; ++i) x[i] *= alpha;
}
void fill(float value, float* x, int64_t n) {
#pragma omp parallel for simd if (n > 65536)
  for (int64_t i = 0; i < n; ++i) x[i] = value;
}
double sum_squares(const float* x, int64_t n) {
  double s = 0.0;
#pragma omp parallel for reduction(+ : s) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

}  // namespace cai::kernels::cpu
