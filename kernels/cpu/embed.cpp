#include "kernels/embed.h"
#include "kernels/cpu/parallel.h"

#include <algorithm>

namespace cai::kernels::cpu {

void patchify(const float* img, float* patches, int64_t b, int64_t c, int64_t hh, int64_t ww,
              int64_t p) {
  const int64_t gh = hh / p, gw = ww / p, row = c * p * p;
  parallel_for(b * gh, 1, [&](int64_t s, int64_t e) {
    for (int64_t f = s; f < e; ++f) {
      const int64_t bi = f / gh, py = f % gh;
      for (int64_t px = 0; px < gw; ++px) {
        float* dst = patches + ((bi * gh + py) * gw + px) * row;
        for (int64_t ci = 0; ci < c; ++ci)
          for (int64_t ky = 0; ky < p; ++ky) {
            const float* src = img + ((bi * c + ci) * hh + py * p + ky) * ww + px * p;
            std::copy(src, src + p, dst + (ci * p + ky) * p);
          }
      }
    }
  });
}

void cls_pos_fwd(const float* tokens, const float* cls, const float* pos, float* out, int64_t b,
                 int64_t np, int64_t d) {
  parallel_for(b, 4, [&](int64_t s, int64_t e) {
    for (int64_t bi = s; bi < e; ++bi) {
      float* o = out + bi * (np + 1) * d;
      for (int64_t j = 0; j < d; ++j) o[j] = cls[j] + pos[j];
      const float* t = tokens + bi * np * d;
      for (int64_t i = 0; i < np * d; ++i) o[d + i] = t[i] + pos[d + i];
    }
  });
}

void cls_pos_bwd(const float* dout, float* dtokens, float* dcls, float* dpos, int64_t b, int64_t np,
                 int64_t d) {
  if (dtokens) {
    parallel_for(b, 4, [&](int64_t s, int64_t e) {
      for (int64_t bi = s; bi < e; ++bi)
        std::copy(dout + bi * (np + 1) * d + d, dout + (bi + 1) * (np + 1) * d,
                  dtokens + bi * np * d);
    });
  }
  const int64_t n = (np + 1) * d;
  parallel_for(n, 4096, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) {
      double s = 0.0;
      for (int64_t bi = 0; bi < b; ++bi) s += dout[bi * n + i];
      if (dpos) dpos[i] += static_cast<float>(s);
      if (dcls && i < d) dcls[i] += static_cast<float>(s);
    }
  });
}

void select_token_fwd(const float* x, float* out, int64_t b, int64_t n, int64_t d, int64_t index) {
  for (int64_t bi = 0; bi < b; ++bi)
    std::copy(x + (bi * n + index) * d, x + (bi * n + index + 1) * d, out + bi * d);
}

void select_token_bwd(const float* dout, float* dx, int64_t b, int64_t n, int64_t d,
                      int64_t index) {
  std::fill(dx, dx + b * n * d, 0.0f);
  for (int64_t bi = 0; bi < b; ++bi)
    std::copy(dout + bi * d, dout + (bi + 1) * d, dx + (bi * n + index) * d);
}

}  // namespace cai::kernels::cpu
