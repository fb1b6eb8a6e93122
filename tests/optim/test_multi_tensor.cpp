// The CPU multi-tensor optimizers (kernels::cpu::multi_tensor_adam/lamb) against the per-tensor
// kernels: tensors of odd sizes (an empty one included), per-tensor weight decay, two steps, the
// gradients scaled by grad_scale first. Adam must match bit for bit (same kernel on the same
// scaled values); LAMB's trust ratio is recomputed here from plain loops.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/parallel.h"
#include "kernels/elementwise.h"
#include "kernels/optim.h"

using namespace cai::kernels;

namespace {
struct State {
  std::vector<std::vector<float>> p, g, m, v;
  std::vector<int64_t> n;
  std::vector<float> wd;

  State(const std::vector<int64_t>& sizes, const std::vector<float>& decays, unsigned seed)
      : n(sizes), wd(decays) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int64_t s : sizes) {
      auto fill = [&](float lo) {
        std::vector<float> x(static_cast<size_t>(s));
        for (float& e : x) e = lo < 0 ? u(rng) : lo + std::abs(u(rng)) * 0.01f;
        return x;
      };
      p.push_back(fill(-1));
      g.push_back(fill(-1));
      m.push_back(fill(-1));
      for (float& e : m.back()) e *= 0.1f;
      v.push_back(fill(0.0f));  // second moments are non-negative
    }
  }
  int count() const { return static_cast<int>(n.size()); }
  template <typename T>
  static std::vector<T*> ptrs(std::vector<std::vector<float>>& x) {
    std::vector<T*> r;
    for (auto& e : x) r.push_back(e.data());
    return r;
  }
  void new_grads(unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (auto& t : g)
      for (float& e : t) e = u(rng);
  }
};

std::vector<float> scaled(const std::vector<float>& g, float s) {
  std::vector<float> r(g);
  for (float& e : r) e *= s;
  return r;
}

double rel(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num) / (std::sqrt(den) + 1e-30);
}

const std::vector<int64_t> kSizes = {1, 3, 0, 1000, 70000};
const std::vector<float> kDecays = {0.05f, 0.0f, 0.05f, 0.1f, 0.02f};
}  // namespace

TEST(MultiTensorCpu, AdamMatchesPerTensorAdamStep) {
  for (bool decoupled : {true, false}) {
    for (float grad_scale : {1.0f, 0.5f}) {
      State multi(kSizes, kDecays, 7), ref(kSizes, kDecays, 7);
      const std::vector<float> p0 = multi.p[4];
      for (int64_t step = 1; step <= 2; ++step) {
        multi.new_grads(100 + step);
        ref.new_grads(100 + step);
        cpu::multi_tensor_adam(
            multi.count(), State::ptrs<float>(multi.p).data(), State::ptrs<float>(multi.g).data(),
            State::ptrs<float>(multi.m).data(), State::ptrs<float>(multi.v).data(), multi.n.data(),
            multi.wd.data(), 1e-2f, 0.9f, 0.999f, 1e-8f, step, decoupled, grad_scale);
        for (int i = 0; i < ref.count(); ++i) {
          const std::vector<float> gs = scaled(ref.g[i], grad_scale);
          cpu::adam_step(ref.p[i].data(), gs.data(), ref.m[i].data(), ref.v[i].data(), ref.n[i],
                         1e-2f, 0.9f, 0.999f, 1e-8f, ref.wd[i], step, decoupled);
        }
      }
      for (int i = 0; i < ref.count(); ++i) {
        EXPECT_EQ(multi.p[i], ref.p[i]) << "p of tensor " << i << " decoupled " << decoupled;
        EXPECT_EQ(multi.m[i], ref.m[i]) << "m of tensor " << i;
        EXPECT_EQ(multi.v[i], ref.v[i]) << "v of tensor " << i;
      }
      EXPECT_GT(rel(multi.p[4], p0), 1e-4) << "the parameters moved";
    }
  }
}

TEST(MultiTensorCpu, AdamGradScaleIsApplied) {
  // The same step with grad_scale 0.5 on g equals grad_scale 1 on g/2 and differs from g.
  State a(kSizes, kDecays, 3), b(kSizes, kDecays, 3), c(kSizes, kDecays, 3);
  for (auto& t : b.g)
    for (float& e : t) e *= 0.5f;
  auto run = [](State& s, float scale) {
    cpu::multi_tensor_adam(s.count(), State::ptrs<float>(s.p).data(),
                           State::ptrs<float>(s.g).data(), State::ptrs<float>(s.m).data(),
                           State::ptrs<float>(s.v).data(), s.n.data(), s.wd.data(), 1e-2f, 0.9f,
                           0.999f, 1e-8f, 1, true, scale);
  };
  run(a, 0.5f), run(b, 1.0f), run(c, 1.0f);
  EXPECT_EQ(a.p[4], b.p[4]);
  EXPECT_NE(a.p[4], c.p[4]);
}

TEST(MultiTensorCpu, LambMatchesPerTensorLambUpdateWithTrustRatio) {
  for (float grad_scale : {1.0f, 0.5f}) {
    State multi(kSizes, kDecays, 11), ref(kSizes, kDecays, 11);
    for (int64_t step = 1; step <= 2; ++step) {
      multi.new_grads(200 + step);
      ref.new_grads(200 + step);
      cpu::multi_tensor_lamb(multi.count(), State::ptrs<float>(multi.p).data(),
                             State::ptrs<float>(multi.g).data(), State::ptrs<float>(multi.m).data(),
                             State::ptrs<float>(multi.v).data(), multi.n.data(), multi.wd.data(),
                             1e-2f, 0.9f, 0.999f, 1e-6f, step, grad_scale);
      for (int i = 0; i < ref.count(); ++i) {
        const int64_t n = ref.n[i];
        const std::vector<float> gs = scaled(ref.g[i], grad_scale);
        std::vector<float> u(static_cast<size_t>(n));
        cpu::lamb_update(ref.p[i].data(), gs.data(), ref.m[i].data(), ref.v[i].data(), u.data(), n,
                         0.9f, 0.999f, 1e-6f, ref.wd[i], step);
        double pp = 0, uu = 0;
        for (int64_t j = 0; j < n; ++j) pp += double(ref.p[i][j]) * ref.p[i][j];
        for (int64_t j = 0; j < n; ++j) uu += double(u[j]) * u[j];
        double trust = 1.0;
        if (ref.wd[i] != 0 && pp > 0 && uu > 0) trust = std::sqrt(pp) / std::sqrt(uu);
        const float alpha = static_cast<float>(-1e-2 * trust);
        for (int64_t j = 0; j < n; ++j) ref.p[i][j] += alpha * u[j];
      }
    }
    for (int i = 0; i < ref.count(); ++i) {
      if (ref.n[i] == 0) continue;
      EXPECT_LE(rel(multi.p[i], ref.p[i]), 1e-6) << "p of tensor " << i;
      EXPECT_EQ(multi.m[i], ref.m[i]) << "m of tensor " << i;
      EXPECT_EQ(multi.v[i], ref.v[i]) << "v of tensor " << i;
    }
  }
}

TEST(MultiTensorCpu, LambTrustRatioScalesTheStep) {
  // With weight decay the step of a tensor is lr·‖p‖ in norm (‖trust·u‖ = ‖p‖); without it the
  // trust ratio is 1 and the step is lr·‖u‖.
  State s({5000}, {0.1f}, 5);
  const std::vector<float> p0 = s.p[0];
  cpu::multi_tensor_lamb(1, State::ptrs<float>(s.p).data(), State::ptrs<float>(s.g).data(),
                         State::ptrs<float>(s.m).data(), State::ptrs<float>(s.v).data(), s.n.data(),
                         s.wd.data(), 1e-2f, 0.9f, 0.999f, 1e-6f, 1, 1.0f);
  double step = 0, norm = 0;
  for (size_t j = 0; j < p0.size(); ++j) {
    step += (double(s.p[0][j]) - p0[j]) * (double(s.p[0][j]) - p0[j]);
    norm += double(p0[j]) * p0[j];
  }
  EXPECT_NEAR(std::sqrt(step) / std::sqrt(norm), 1e-2, 1e-5);
}

TEST(MultiTensorCpu, GradStatsAndClipMatchPlainLoops) {
  // Tensors of odd sizes (an empty one included), weights 0/1/2, an unscale by 0.5, an inf.
  State s(kSizes, kDecays, 11);
  const std::vector<float> weight = {1.0f, 2.0f, 1.0f, 0.0f, 1.0f};
  s.g[1][2] = INFINITY;
  double sq = 0, bad = 0;
  for (int i = 0; i < s.count(); ++i)
    for (float v : s.g[i]) {
      const float x = v * 0.5f;
      if (std::isfinite(x)) sq += weight[i] * double(x) * x;
      bad += !std::isfinite(x);
    }
  float out[2];
  auto g = State::ptrs<float>(s.g);
  cpu::multi_tensor_grad_stats(s.count(), g.data(), s.n.data(), weight.data(), 0.5f, out);
  EXPECT_TRUE(std::isinf(out[0]));  // the inf is counted in the squares too
  EXPECT_EQ(out[1], bad);
  EXPECT_EQ(bad, 1.0);
  s.g[1][2] = 0.0f;  // finite again: the squares match
  cpu::multi_tensor_grad_stats(s.count(), g.data(), s.n.data(), weight.data(), 1.0f, out);
  EXPECT_NEAR(out[0], sq, 1e-5 * sq);
  EXPECT_EQ(out[1], 0.0f);
  // Clip to norm 1 (unweighted): every tensor scaled by 1 / (norm + 1e-6).
  cpu::multi_tensor_grad_stats(s.count(), g.data(), s.n.data(), nullptr, 1.0f, out);
  const std::vector<float> before = s.g[4];
  float norm = 0;
  cpu::multi_tensor_clip(s.count(), g.data(), s.n.data(), out, 1.0f, &norm);
  EXPECT_NEAR(norm, std::sqrt(out[0]), 1e-6 * norm);
  const float c = 1.0f / (norm + 1e-6f);
  for (size_t j = 0; j < before.size(); ++j) ASSERT_EQ(s.g[4][j], before[j] * c);
  // Below max_norm: untouched.
  cpu::multi_tensor_grad_stats(s.count(), g.data(), s.n.data(), nullptr, 1.0f, out);
  const std::vector<float> kept = s.g[4];
  cpu::multi_tensor_clip(s.count(), g.data(), s.n.data(), out, 10.0f, nullptr);
  EXPECT_EQ(s.g[4], kept);
}

// The vectorised sum of squares (16 elements an iteration over blocks of 65536) against a plain
// double loop on tensors spanning several blocks with odd tails, a NaN and infinities in the
// vector body counted, and the result the same whatever the thread count.
TEST(MultiTensorCpu, GradStatsOverBlocksMatchPlainLoopAndThreadCount) {
  std::mt19937 rng(23);
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::vector<std::vector<float>> t = {std::vector<float>(200003), std::vector<float>(65536 + 17),
                                       std::vector<float>(31)};
  for (auto& v : t)
    for (float& x : v) x = d(rng);
  double sq = 0;
  for (auto& v : t)
    for (float x : v) sq += double(x) * x;
  std::vector<float*> g;
  std::vector<int64_t> n;
  for (auto& v : t) g.push_back(v.data()), n.push_back(static_cast<int64_t>(v.size()));
  float out[2];
  cpu::multi_tensor_grad_stats(3, g.data(), n.data(), nullptr, 1.0f, out);
  EXPECT_NEAR(out[0], sq, 1e-6 * sq);
  EXPECT_EQ(out[1], 0.0f);
  const int threads = cpu::num_threads();
  cpu::set_num_threads(1);
  float one[2];
  cpu::multi_tensor_grad_stats(3, g.data(), n.data(), nullptr, 1.0f, one);
  cpu::set_num_threads(3);
  float three[2];
  cpu::multi_tensor_grad_stats(3, g.data(), n.data(), nullptr, 1.0f, three);
  cpu::set_num_threads(threads);
  EXPECT_EQ(one[0], out[0]);
  EXPECT_EQ(three[0], out[0]);
  t[0][1000] = std::nanf("");
  t[0][1001] = INFINITY;
  t[1][65536 + 3] = -INFINITY;
  cpu::multi_tensor_grad_stats(3, g.data(), n.data(), nullptr, 1.0f, out);
  EXPECT_EQ(out[1], 3.0f);
  EXPECT_TRUE(std::isnan(out[0]));
}

// add_with_squares (ZeRO-Offload's last host add of a step): y = x or y += x, and the statistics
// of the result equal multi_tensor_grad_stats of it afterwards bit for bit (same blocks, same
// order), across blocks and tails, with an inf counted.
TEST(MultiTensorCpu, AddWithSquaresEqualsAddThenStats) {
  std::mt19937 rng(29);
  std::normal_distribution<float> d(0.0f, 1.5f);
  for (int64_t n : {int64_t{5}, int64_t{65536}, int64_t{200017}}) {
    for (bool assign : {false, true}) {
      std::vector<float> x(n), y(n);
      for (float& v : x) v = d(rng);
      for (float& v : y) v = d(rng);
      if (n > 100) x[n - 7] = INFINITY;
      std::vector<float> ref = y;
      for (int64_t i = 0; i < n; ++i) ref[i] = assign ? x[i] : ref[i] + x[i];
      double sq = 0;
      int64_t bad = 0;
      cpu::add_with_squares(y.data(), x.data(), n, assign, &sq, &bad);
      ASSERT_EQ(y, ref) << n;
      float* p = ref.data();
      float out[2];
      cpu::multi_tensor_grad_stats(1, &p, &n, nullptr, 1.0f, out);
      EXPECT_EQ(static_cast<float>(sq), out[0]) << n << " assign " << assign;
      EXPECT_EQ(static_cast<float>(bad), out[1]) << n;
      EXPECT_EQ(bad, n > 100 ? 1 : 0);
    }
  }
}
