#include "kernels/attention.h"
#include "kernels/cpu/parallel.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace cai::kernels::cpu {

// Index helpers for qkv[b, n, 3, h, hd].
namespace {
struct Qkv {
  int64_t n, h, hd;
  int64_t row() const { return 3 * h * hd; }
  int64_t at(int64_t bi, int64_t t, int64_t which, int64_t hi) const {
    return (bi * n + t) * row() + (which * h + hi) * hd;
  }
};
}  // namespace

void attention_fwd(const float* qkv, float* out, float* probs, int64_t b, int64_t n, int64_t h,
                   int64_t hd) {
  const Qkv L{n, h, hd};
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  parallel_for(b * h, 1, [&](int64_t s, int64_t e) {
    for (int64_t f = s; f < e; ++f) {
      const int64_t bi = f / h, hi = f % h;
      float* P = probs + (bi * h + hi) * n * n;
      for (int64_t i = 0; i < n; ++i) {
        const float* q = qkv + L.at(bi, i, 0, hi);
        float* p = P + i * n;
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          const float* k = qkv + L.at(bi, j, 1, hi);
          float s = 0.0f;
          for (int64_t c = 0; c < hd; ++c) s += q[c] * k[c];
          p[j] = s * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j < n; ++j) {
          p[j] = std::exp(p[j] - mx);
          sum += p[j];
        }
        const float inv = static_cast<float>(1.0 / sum);
        float* o = out + (bi * n + i) * h * hd + hi * hd;
        std::fill(o, o + hd, 0.0f);
        for (int64_t j = 0; j < n; ++j) {
          p[j] *= inv;
          const float* v = qkv + L.at(bi, j, 2, hi);
          for (int64_t c = 0; c < hd; ++c) o[c] += p[j] * v[c];
        }
      }
    }
  });
}

void attention_bwd(const float* qkv, const float* probs, const float* dout, float* dqkv, int64_t b,
                   int64_t n, int64_t h, int64_t hd) {
  const Qkv L{n, h, hd};
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  parallel_for(b * h, 1, [&](int64_t s, int64_t e) {
    for (int64_t f = s; f < e; ++f) {
      const int64_t bi = f / h, hi = f % h;
      const float* P = probs + (bi * h + hi) * n * n;
      std::vector<float> ds(n);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t w = 0; w < 3; ++w) std::fill_n(dqkv + L.at(bi, t, w, hi), hd, 0.0f);
      for (int64_t i = 0; i < n; ++i) {
        const float* p = P + i * n;
        const float* go = dout + (bi * n + i) * h * hd + hi * hd;
        // dP_ij = dout_i·v_j ; dv_j += P_ij·dout_i
        double dot = 0.0;
        for (int64_t j = 0; j < n; ++j) {
          const float* v = qkv + L.at(bi, j, 2, hi);
          float* dv = dqkv + L.at(bi, j, 2, hi);
          float s = 0.0f;
          for (int64_t c = 0; c < hd; ++c) {
            s += go[c] * v[c];
            dv[c] += p[j] * go[c];
          }
          ds[j] = s;
          dot += static_cast<double>(p[j]) * s;
        }
        // dS_ij = P_ij (dP_ij - Σ_j P_ij dP_ij), then through S = scale·q·k.
        const float* q = qkv + L.at(bi, i, 0, hi);
        float* dq = dqkv + L.at(bi, i, 0, hi);
        for (int64_t j = 0; j < n; ++j) {
          const float g = p[j] * (ds[j] - static_cast<float>(dot)) * scale;
          const float* k = qkv + L.at(bi, j, 1, hi);
          float* dk = dqkv + L.at(bi, j, 1, hi);
          for (int64_t c = 0; c < hd; ++c) {
            dq[c] += g * k[c];
            dk[c] += g * q[c];
          }
        }
      }
    }
  });
}

}  // namespace cai::kernels::cpu
