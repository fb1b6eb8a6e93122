#include "gradcheck.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "cai/core/rng.h"
#include "kernels/base/philox.h"

namespace cai::test {

Tensor random_tensor(const Shape& s, uint64_t seed, float scale) {
  Tensor t = Tensor::empty(s);
  rng::normal_(t, seed, 7, 0.0f, scale);
  return t;
}

double dot(const Tensor& r, const Tensor& y) {
  const float* a = r.data<float>();
  const float* b = y.data<float>();
  double s = 0.0;
  for (int64_t i = 0; i < r.numel(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

double gradcheck(const std::function<double()>& loss, Tensor& input, const Tensor& analytic,
                 float h, double rtol, double atol, int max_elems) {
  float* x = input.data<float>();
  const float* g = analytic.data<float>();
  const int64_t n = input.numel();
  const int64_t stride = n <= max_elems ? 1 : n / max_elems;
  double worst = 0.0;
  for (int64_t i = 0; i < n; i += stride) {
    const float orig = x[i];
    x[i] = orig + h;
    const double lp = loss();
    x[i] = orig - h;
    const double lm = loss();
    x[i] = orig;
    const double num = (lp - lm) / (2.0 * h);
    const double r = std::abs(num - g[i]) / (atol + rtol * std::abs(g[i]));
    if (getenv("CAI_GRADCHECK_DEBUG") && r > 1)
      fprintf(stderr, "  elem %ld num %.8g ana %.8g\n", (long)i, num, (double)g[i]);
    if (!(r <= worst)) worst = std::isnan(r) ? INFINITY : r;
  }
  return worst;
}

}  // namespace cai::test
