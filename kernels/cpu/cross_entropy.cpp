#include "kernels/cross_entropy.h"
#include "kernels/cpu/parallel.h"

#include <algorithm>
#include <cmath>

#include "kernels/base/error.h"

namespace cai::kernels::cpu {

namespace {
void check_labels(const int32_t* labels, int64_t b, int64_t k) {
  for (int64_t i = 0; i < b; ++i)
    CAI_CHECK(labels[i] >= 0 && labels[i] < k,
              "[cross_entropy] label {} of sample {} is outside [0, {})", labels[i], i, k);
}
double log_sum_exp(const float* x, int64_t k) {
  const float mx = *std::max_element(x, x + k);
  double s = 0.0;
  for (int64_t j = 0; j < k; ++j) s += std::exp(static_cast<double>(x[j]) - mx);
  return mx + std::log(s);
}
}  // namespace

void cross_entropy_fwd(const float* logits, const int32_t* labels, float* losses, int64_t b,
                       int64_t k, float eps) {
  check_labels(labels, b, k);
  parallel_for(b, 64, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) {
      const float* x = logits + i * k;
      const double lse = log_sum_exp(x, k);
      double mean = 0.0;
      for (int64_t j = 0; j < k; ++j) mean += x[j];
      mean /= k;
      losses[i] = static_cast<float>((1.0 - eps) * (lse - x[labels[i]]) + eps * (lse - mean));
    }
  });
}

void cross_entropy_bwd(const float* logits, const int32_t* labels, float dloss, float* dlogits,
                       int64_t b, int64_t k, float eps) {
  check_labels(labels, b, k);
  parallel_for(b, 64, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) {
      const float* x = logits + i * k;
      const double lse = log_sum_exp(x, k);
      float* g = dlogits + i * k;
      for (int64_t j = 0; j < k; ++j) {
        double t = eps / static_cast<double>(k) + (j == labels[i] ? 1.0 - eps : 0.0);
        g[j] = static_cast<float>(dloss * (std::exp(x[j] - lse) - t));
      }
    }
  });
}

void loss_metrics(const float* losses, const float* logits, const int32_t* labels, int64_t b,
                  int64_t k, float* sums) {
  double loss = 0.0, correct = 0.0;
  for (int64_t i = 0; i < b; ++i) {
    loss += losses[i];
    const float* x = logits + i * k;
    int64_t arg = 0;
    for (int64_t j = 1; j < k; ++j)
      if (x[j] > x[arg]) arg = j;
    correct += arg == static_cast<int64_t>(labels[i]);
  }
  sums[0] += static_cast<float>(loss);
  sums[1] += static_cast<float>(correct);
}

}  // namespace cai::kernels::cpu
