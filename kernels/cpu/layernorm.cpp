#include "kernels/layernorm.h"
#include "kernels/cpu/parallel.h"

#include <cmath>
#include <vector>

namespace cai::kernels::cpu {

void layernorm_fwd(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                   float* rstd, int64_t m, int64_t d, float eps) {
  parallel_for(m, 32, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) {
      const float* xi = x + i * d;
      double s = 0.0;
      for (int64_t j = 0; j < d; ++j) s += xi[j];
      const double mu = s / d;
      double v = 0.0;
      for (int64_t j = 0; j < d; ++j) v += (xi[j] - mu) * (xi[j] - mu);
      const double rs = 1.0 / std::sqrt(v / d + eps);
      float* yi = y + i * d;
      for (int64_t j = 0; j < d; ++j)
        yi[j] = static_cast<float>((xi[j] - mu) * rs) * gamma[j] + beta[j];
      mean[i] = static_cast<float>(mu);
      rstd[i] = static_cast<float>(rs);
    }
  });
}

void layernorm_bwd(const float* x, const float* gamma, const float* mean, const float* rstd,
                   const float* dy, float* dx, float* dgamma, float* dbeta, int64_t m, int64_t d) {
  // dx = rstd · (g - mean(g) - xhat · mean(g · xhat)), g = dy · gamma.
  if (dx) {
    parallel_for(m, 32, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) {
        const float* xi = x + i * d;
        const float* dyi = dy + i * d;
        double sg = 0.0, sgx = 0.0;
        for (int64_t j = 0; j < d; ++j) {
          const double g = static_cast<double>(dyi[j]) * gamma[j];
          sg += g;
          sgx += g * (xi[j] - mean[i]) * rstd[i];
        }
        sg /= d;
        sgx /= d;
        float* dxi = dx + i * d;
        for (int64_t j = 0; j < d; ++j) {
          const double xhat = (xi[j] - mean[i]) * static_cast<double>(rstd[i]);
          const double g = static_cast<double>(dyi[j]) * gamma[j];
          dxi[j] = static_cast<float>(rstd[i] * (g - sg - xhat * sgx));
        }
      }
    });
  }
  if (dgamma || dbeta) {
    parallel_for(d, 8, [&](int64_t s, int64_t e) {
      for (int64_t j = s; j < e; ++j) {
        double sg = 0.0, sb = 0.0;
        for (int64_t i = 0; i < m; ++i) {
          const double xhat = (x[i * d + j] - mean[i]) * static_cast<double>(rstd[i]);
          sg += dy[i * d + j] * xhat;
          sb += dy[i * d + j];
        }
        if (dgamma) dgamma[j] += static_cast<float>(sg);
        if (dbeta) dbeta[j] += static_cast<float>(sb);
      }
    });
  }
}

// --- split hidden dimension: per-row partial sums over this rank's f columns -------------------

void layernorm_row_sums(const float* x, const float* mean, float* sums, int64_t m, int64_t f) {
  parallel_for(m, 32, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) {
      const float* xi = x + i * f;
      double a = 0.0;
      if (mean) {
        const double mu = mean[i];
        for (int64_t j = 0; j < f; ++j) a += (xi[j] - mu) * (xi[j] - mu);
      } else {
        for (int64_t j = 0; j < f; ++j) a += xi[j];
      }
      sums[i] = static_cast<float>(a);
    }
  });
}

void layernorm_split_fwd(const float* x, const float* gamma, const float* beta, const float* mean,
                         const float* sqdev, float* y, float* rstd, int64_t m, int64_t f,
                         int64_t features, float eps) {
  parallel_for(m, 32, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) {
      const double mu = mean[i];
      const double rs = 1.0 / std::sqrt(static_cast<double>(sqdev[i]) / features + eps);
      const float* xi = x + i * f;
      float* yi = y + i * f;
      // As layernorm_fwd, so that with f = F the two agree to rounding.
      for (int64_t j = 0; j < f; ++j)
        yi[j] = static_cast<float>((xi[j] - mu) * rs) * gamma[j] + beta[j];
      rstd[i] = static_cast<float>(rs);
    }
  });
}

void layernorm_split_bwd_sums(const float* x, const float* gamma, const float* mean,
                              const float* rstd, const float* dy, float* sums, float* dgamma,
                              float* dbeta, int64_t m, int64_t f) {
  parallel_for(m, 32, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) {
      const float* xi = x + i * f;
      const float* dyi = dy + i * f;
      const double mu = mean[i], rs = rstd[i];
      double sg = 0.0, sgx = 0.0;
      for (int64_t j = 0; j < f; ++j) {
        const double g = static_cast<double>(dyi[j]) * gamma[j];
        sg += g;
        sgx += g * ((xi[j] - mu) * rs);
      }
      sums[2 * i] = static_cast<float>(sg);
      sums[2 * i + 1] = static_cast<float>(sgx);
    }
  });
  // The column sums are the unsplit backward's, over this rank's columns.
  if (dgamma || dbeta) layernorm_bwd(x, gamma, mean, rstd, dy, nullptr, dgamma, dbeta, m, f);
}

void layernorm_split_bwd(const float* x, const float* gamma, const float* mean, const float* rstd,
                         const float* dy, const float* sums, float* dx, int64_t m, int64_t f,
                         int64_t features) {
  parallel_for(m, 32, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) {
      const float* xi = x + i * f;
      const float* dyi = dy + i * f;
      const double mu = mean[i], rs = rstd[i];
      const double sg = static_cast<double>(sums[2 * i]) / features;
      const double sgx = static_cast<double>(sums[2 * i + 1]) / features;
      float* dxi = dx + i * f;
      for (int64_t j = 0; j < f; ++j) {
        const double xhat = (xi[j] - mu) * rs;
        const double g = static_cast<double>(dyi[j]) * gamma[j];
        dxi[j] = static_cast<float>(rs * (g - sg - xhat * sgx));
      }
    }
  });
}

}  // namespace cai::kernels::cpu
