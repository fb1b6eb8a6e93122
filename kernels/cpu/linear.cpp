#include "kernels/linear.h"

#include <cblas.h>

#include <algorithm>

namespace cai::kernels::cpu {

void linear_fwd(const float* x, const float* w, const float* b, float* y, int64_t m, int64_t k,
                int64_t n) {
  float beta = 0.0f;
  if (b) {
#pragma omp parallel for if (m * n > 16384)
    for (int64_t i = 0; i < m; ++i) std::copy(b, b + n, y + i * n);
    beta = 1.0f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x, k, w, k, beta, y, n);
}

void linear_bwd(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                int64_t m, int64_t k, int64_t n) {
  if (dx)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, k, n, 1.0f, dy, n, w, k, 0.0f, dx, k);
  if (dw)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, k, m, 1.0f, dy, n, x, k, 1.0f, dw, k);
  if (db) {
    // Column sums of dy, accumulated in double per output feature.
#pragma omp parallel for if (m * n > 16384)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t i = 0; i < m; ++i) s += dy[i * n + j];
      db[j] += static_cast<float>(s);
    }
  }
}

}  // namespace cai::kernels::cpu
