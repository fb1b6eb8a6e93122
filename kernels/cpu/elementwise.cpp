#include "kernels/elementwise.h"

#include <vector>

#include "kernels/cpu/parallel.h"

namespace cai::kernels::cpu {

namespace {
constexpr int64_t kGrain = 32768;
}

void add(const float* a, const float* b, float* y, int64_t n) {
  parallel_for(n, kGrain, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) y[i] = a[i] + b[i];
  });
}
void axpy(float alpha, const float* x, float* y, int64_t n) {
  parallel_for(n, kGrain, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) y[i] += alpha * x[i];
  });
}
void scale(float alpha, float* x, int64_t n) {
  parallel_for(n, kGrain, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) x[i] *= alpha;
  });
}
void fill(float value, float* x, int64_t n) {
  parallel_for(n, kGrain, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) x[i] = value;
  });
}
double sum_squares(const float* x, int64_t n) {
  // Fixed blocks so the result does not depend on the thread count.
  constexpr int64_t kBlock = 65536;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> part(blocks, 0.0);
  parallel_for(blocks, 1, [&](int64_t s, int64_t e) {
    for (int64_t b = s; b < e; ++b) {
      double acc = 0.0;
      for (int64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i)
        acc += static_cast<double>(x[i]) * x[i];
      part[b] = acc;
    }
  });
  double total = 0.0;
  for (double p : part) total += p;
  return total;
}

}  // namespace cai::kernels::cpu
