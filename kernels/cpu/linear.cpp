#include "kernels/linear.h"

#include <cblas.h>
#include "kernels/cpu/parallel.h"

#include <algorithm>

namespace cai::kernels::cpu {

namespace {
// One thread pool for everything (kernels/cpu/parallel.h): OpenBLAS runs single-threaded and
// GEMMs are split into row blocks across the pool. OpenBLAS's own pthread pool beside an OpenMP
// one made both spin against each other (80% of a 2-core run in spin-waits).
template <typename Fn>
void parallel_rows(int64_t rows, double flops, Fn fn) {
  if (flops < 2e5) {
    fn(int64_t{0}, rows);
    return;
  }
  parallel_for(rows, 1, fn);
}
}  // namespace

void linear_fwd(const float* x, const float* w, const float* b, float* y, int64_t m, int64_t k,
                int64_t n) {
  parallel_rows(m, 2.0 * m * n * k, [&](int64_t r0, int64_t r1) {
    float beta = 0.0f;
    if (b) {
      for (int64_t i = r0; i < r1; ++i) std::copy(b, b + n, y + i * n);
      beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, n, k, 1.0f, x + r0 * k, k, w, k,
                beta, y + r0 * n, n);
  });
}

void linear_bwd(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                int64_t m, int64_t k, int64_t n) {
  // dx[m, k] = dy[m, n] · w[n, k]: blocks of rows of dx.
  if (dx)
    parallel_rows(m, 2.0 * m * n * k, [&](int64_t r0, int64_t r1) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, k, n, 1.0f, dy + r0 * n, n, w,
                  k, 0.0f, dx + r0 * k, k);
    });
  // dw[n, k] += dy^T · x and db[n] += Σ_rows dy: blocks of output features.
  if (dw || db)
    parallel_rows(n, 2.0 * m * n * k, [&](int64_t c0, int64_t c1) {
      if (dw)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c1 - c0, k, m, 1.0f, dy + c0, n, x, k,
                    1.0f, dw + c0 * k, k);
      if (db)
        for (int64_t j = c0; j < c1; ++j) {
          double s = 0.0;
          for (int64_t i = 0; i < m; ++i) s += dy[i * n + j];
          db[j] += static_cast<float>(s);
        }
    });
}

}  // namespace cai::kernels::cpu
