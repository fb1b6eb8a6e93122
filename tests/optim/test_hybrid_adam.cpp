// HybridAdam: the vectorised (AVX2 when built with CAI_NATIVE_SIMD) multi-threaded CPU Adam step
// against the scalar formula on sizes around the vector width, and HybridAdam against AdamW.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cai/core/error.h"
#include "cai/optim/optimizer.h"
#include "kernels/optim.h"

using namespace cai;

namespace {
// The scalar reference: PyTorch's Adam / AdamW element update, one element at a time, in fp32 as
// the kernel (the formula kernels/cpu/optim.cpp had before it was vectorised).
void reference_adam(std::vector<float>& p, const std::vector<float>& g, std::vector<float>& m,
                    std::vector<float>& v, float lr, float beta1, float beta2, float eps, float wd,
                    int64_t step, bool decoupled) {
  const float bc1 = 1.0f - std::pow(beta1, static_cast<float>(step));
  const float bc2_sqrt = std::sqrt(1.0f - std::pow(beta2, static_cast<float>(step)));
  const float step_size = lr / bc1;
  for (size_t i = 0; i < p.size(); ++i) {
    float gi = g[i];
    if (decoupled)
      p[i] *= 1.0f - lr * wd;
    else
      gi += wd * p[i];
    m[i] = beta1 * m[i] + (1.0f - beta1) * gi;
    v[i] = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
    p[i] -= step_size * (m[i] / denom);
  }
}

// p, m and v of n elements in one 64-byte aligned block, each `shift` elements past a 64-byte
// boundary (the same misalignment for all three), p drawn from N(0, 1) with `seed`, m and v zero;
// rp, rm, rv: a copy of them for a reference run.
struct AlignedAdamState {
  AlignedAdamState(int64_t n, int64_t shift, unsigned seed)
      : buf(static_cast<float*>(std::aligned_alloc(64, 3 * (n + 64) * sizeof(float)))),
        rp(n),
        rm(n, 0.0f),
        rv(n, 0.0f),
        rng(seed) {
    p = buf + shift, m = buf + (n + 64) + shift, v = buf + 2 * (n + 64) + shift;
    for (int64_t i = 0; i < n; ++i) p[i] = rp[i] = dist(rng), m[i] = v[i] = 0.0f;
  }
  ~AlignedAdamState() { std::free(buf); }
  AlignedAdamState(const AlignedAdamState&) = delete;
  AlignedAdamState& operator=(const AlignedAdamState&) = delete;
  float* buf;
  float *p = nullptr, *m = nullptr, *v = nullptr;
  std::vector<float> rp, rm, rv;
  std::mt19937 rng;
  std::normal_distribution<float> dist{0.0f, 1.0f};
};

double rel_err(const std::vector<float>& a, const std::vector<float>& ref) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst,
                     std::abs(double(a[i]) - ref[i]) / std::max(std::abs(double(ref[i])), 1e-30));
  return worst;
}
}  // namespace

class AdamStepSizes : public ::testing::TestWithParam<int64_t> {};

TEST_P(AdamStepSizes, VectorisedKernelMatchesScalarFormula) {
  const int64_t n = GetParam();
  for (bool decoupled : {true, false}) {
    std::mt19937 rng(static_cast<unsigned>(n) + decoupled);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f);
    for (float& x : p) x = dist(rng);
    std::vector<float> rp = p, rm = m, rv = v;
    for (int64_t step = 1; step <= 3; ++step) {
      std::vector<float> g(n);
      // Gradients of one sign per element across steps, so m never cancels towards 0 (where a
      // relative error means nothing).
      for (int64_t i = 0; i < n; ++i) g[i] = (i % 2 ? 1.0f : -1.0f) * (0.1f + std::abs(dist(rng)));
      kernels::cpu::adam_step(p.data(), g.data(), m.data(), v.data(), n, 1e-2f, 0.9f, 0.999f, 1e-8f,
                              0.05f, step, decoupled);
      reference_adam(rp, g, rm, rv, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.05f, step, decoupled);
    }
    EXPECT_LE(rel_err(p, rp), 1e-6) << "n " << n << " decoupled " << decoupled;
    EXPECT_LE(rel_err(m, rm), 1e-6) << "n " << n << " decoupled " << decoupled;
    EXPECT_LE(rel_err(v, rv), 1e-6) << "n " << n << " decoupled " << decoupled;
    // The step moved the parameters (a kernel that did nothing would fail above only through
    // the reference: check it directly too).
    std::mt19937 rng0(static_cast<unsigned>(n) + decoupled);
    EXPECT_NE(p[0], dist(rng0));
  }
}

INSTANTIATE_TEST_SUITE_P(OddSizes, AdamStepSizes,
                         ::testing::Values(int64_t{1}, int64_t{7}, int64_t{8}, int64_t{9},
                                           int64_t{1000}, int64_t{70001}));

// p, m and v 32-byte aligned alike (ZeRO-Offload's host shards): the kernel stores past the caches
// (non-temporal) after a scalar head; the results equal those of buffers misaligned against each
// other (ordinary stores) bit for bit, head, body and tail.
TEST(AdamStep, StreamedStoresEqualOrdinaryStores) {
  const int64_t n = 100003;
  for (int64_t shift : {0, 3}) {  // the same misalignment for all three: streamed after a head
    AlignedAdamState st(n, shift, 11);
    ASSERT_NE(st.buf, nullptr);
    std::vector<float> g(n);
    // The reference's p one element off its m and v: never aligned alike, ordinary stores.
    std::vector<float> rp_shifted(n + 1);
    for (int64_t step = 1; step <= 2; ++step) {
      for (float& x : g) x = st.dist(st.rng);
      kernels::cpu::adam_step(st.p, g.data(), st.m, st.v, n, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.05f,
                              step, true);
      std::copy(st.rp.begin(), st.rp.end(), rp_shifted.begin() + 1);
      kernels::cpu::adam_step(rp_shifted.data() + 1, g.data(), st.rm.data(), st.rv.data(), n, 1e-2f,
                              0.9f, 0.999f, 1e-8f, 0.05f, step, true);
      std::copy(rp_shifted.begin() + 1, rp_shifted.end(), st.rp.begin());
    }
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(st.p[i], st.rp[i]) << "shift " << shift << " element " << i;
      ASSERT_EQ(st.m[i], st.rm[i]) << "shift " << shift << " element " << i;
      ASSERT_EQ(st.v[i], st.rv[i]) << "shift " << shift << " element " << i;
    }
  }
}

TEST(HybridAdam, EqualsAdamWBitForBitOnCpuParameters) {
  auto make_params = [] {
    std::vector<nn::Parameter> ps;
    ps.push_back(nn::make_parameter("w", {37, 19}, true));
    ps.push_back(nn::make_parameter("b", {19}, false));
    ps.push_back(nn::make_parameter("e", {1, 5, 3}, false));
    std::mt19937 rng(3);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (auto& p : ps) {
      std::vector<float> v(p.value.numel());
      for (float& x : v) x = d(rng);
      p.value = Tensor::from_vector(v, p.value.shape());
      p.grad = Tensor::zeros(p.value.shape());
    }
    return ps;
  };
  auto a = make_params(), b = make_params();
  auto ptrs = [](std::vector<nn::Parameter>& ps) {
    std::vector<nn::Parameter*> out;
    for (auto& p : ps) out.push_back(&p);
    return out;
  };
  optim::OptimizerOptions oh, ow;
  oh.name = "hybrid_adam", ow.name = "adamw";
  auto hybrid = optim::make_optimizer(oh, optim::weight_decay_groups(ptrs(a), 1e-2, 0.05));
  auto adamw = optim::make_optimizer(ow, optim::weight_decay_groups(ptrs(b), 1e-2, 0.05));
  EXPECT_EQ(hybrid->name(), "hybrid_adam");
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (int step = 0; step < 4; ++step) {
    for (size_t i = 0; i < a.size(); ++i) {
      std::vector<float> g(a[i].value.numel());
      for (float& x : g) x = d(rng);
      a[i].grad = Tensor::from_vector(g, a[i].value.shape());
      b[i].grad = Tensor::from_vector(g, b[i].value.shape());
    }
    hybrid->step();
    adamw->step();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    const auto va = a[i].value.to_vector(), vb = b[i].value.to_vector();
    ASSERT_EQ(va.size(), vb.size());
    EXPECT_EQ(std::memcmp(va.data(), vb.data(), va.size() * sizeof(float)), 0) << a[i].name;
  }
  EXPECT_NE(a[0].value.to_vector()[0], make_params()[0].value.to_vector()[0]);  // it stepped
  EXPECT_EQ(hybrid->state_bytes(), adamw->state_bytes());
  EXPECT_EQ(hybrid->state_bytes(false), hybrid->state_bytes());  // all in host memory
  EXPECT_EQ(hybrid->state_bytes(true), 0);
}

// The host Adam's fused extras (ZeRO-Offload's step): gradients read times grad_scale equal
// gradients scaled in place first, and the bf16 copy written in the same pass equals rounding the
// updated values (float_to_bf16), NaN included, over the streamed body, the head and the tail.
TEST(AdamStep, ScaledGradientsAndBf16CopyEqualTheSeparatePasses) {
  const int64_t n = 70007;
  for (int64_t shift : {0, 5}) {
    AlignedAdamState st(n, shift, 17);
    ASSERT_NE(st.buf, nullptr);
    std::vector<float> g(n);
    std::vector<uint16_t> copy(n, 0);
    const float scale = 0.3719f;
    for (int64_t step = 1; step <= 2; ++step) {
      for (float& x : g) x = st.dist(st.rng);
      if (step == 2) g[n / 2] = std::nanf("");  // one NaN update: its copy a quiet NaN
      kernels::cpu::adam_step(st.p, g.data(), st.m, st.v, n, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.05f,
                              step, true, scale, copy.data());
      std::vector<float> scaled = g;
      for (float& x : scaled) x *= scale;
      kernels::cpu::adam_step(st.rp.data(), scaled.data(), st.rm.data(), st.rv.data(), n, 1e-2f,
                              0.9f, 0.999f, 1e-8f, 0.05f, step, true);
    }
    EXPECT_TRUE(std::isnan(st.p[n / 2]));
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::memcmp(&st.p[i], &st.rp[i], 4), 0) << "shift " << shift << " element " << i;
      ASSERT_EQ(std::memcmp(&st.m[i], &st.rm[i], 4), 0) << "shift " << shift << " element " << i;
      ASSERT_EQ(copy[i], float_to_bf16(st.rp[i])) << "shift " << shift << " element " << i;
    }
  }
}

namespace {
std::vector<nn::Parameter> random_params(unsigned seed) {
  std::vector<nn::Parameter> ps;
  ps.push_back(nn::make_parameter("w", {37, 19}, true));
  ps.push_back(nn::make_parameter("b", {19}, false));
  ps.push_back(nn::make_parameter("w2", {5, 2003}, true));
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (auto& p : ps) {
    std::vector<float> v(p.value.numel()), g(p.value.numel());
    for (float& x : v) x = d(rng);
    for (float& x : g) x = 3.0f * d(rng);  // a norm well above 1: the clip scales
    p.value = Tensor::from_vector(v, p.value.shape());
    p.grad = Tensor::from_vector(g, p.value.shape());
  }
  return ps;
}
std::vector<nn::Parameter*> pointers(std::vector<nn::Parameter>& ps) {
  std::vector<nn::Parameter*> out;
  for (auto& p : ps) out.push_back(&p);
  return out;
}
// Optimizer `name` over ps, timm's weight-decay groups (lr 1e-2, weight decay 0.05).
std::unique_ptr<optim::Optimizer> named(const char* name, std::vector<nn::Parameter>& ps) {
  optim::OptimizerOptions o;
  o.name = name;
  return optim::make_optimizer(o, optim::weight_decay_groups(pointers(ps), 1e-2, 0.05));
}
void expect_same_values(std::vector<nn::Parameter>& a, std::vector<nn::Parameter>& b,
                        const std::string& what) {
  for (size_t i = 0; i < a.size(); ++i) {
    const auto va = a[i].value.to_vector(), vb = b[i].value.to_vector();
    ASSERT_EQ(va.size(), vb.size());
    EXPECT_EQ(std::memcmp(va.data(), vb.data(), va.size() * sizeof(float)), 0)
        << what << ": " << a[i].name;
  }
}
}  // namespace

// Host parameters: the clip left to the optimizer (clip_grad_norm_async with `defer`, as
// ZeRO-Offload's host step) gives the parameters of clipping in place then stepping, bit for bit,
// for the Adam family (fused: the gradients stay unscaled) and for SGD and LAMB (scaled in place
// at the start of their step); the same norm is returned; a reduction (reduce_sq) keeps it.
TEST(ClipGradNorm, DeferredOnTheHostEqualsClippingInPlace) {
  for (const char* name : {"adamw", "hybrid_adam", "adam", "sgd", "lamb"}) {
    for (bool reduced : {false, true}) {
      auto a = random_params(7), b = random_params(7);
      auto oa = named(name, a), ob = named(name, b);
      std::function<double(double)> reduce;
      if (reduced) reduce = [](double sq) { return sq; };  // one rank
      ASSERT_TRUE(ob->can_defer_clip(Device::cpu()));
      for (int step = 0; step < 2; ++step) {
        // Fresh gradients each step, as a backward writes them (the in-place clip scaled a's).
        const auto fresh = random_params(100 + step);
        for (size_t i = 0; i < a.size(); ++i) {
          a[i].grad.copy_from(fresh[i].grad);
          b[i].grad.copy_from(fresh[i].grad);
        }
        const double na = optim::clip_grad_norm(pointers(a), 1.0, reduce);
        const Tensor nb =
            optim::clip_grad_norm_async(pointers(b), 1.0, reduce, nullptr, nullptr, ob.get());
        EXPECT_FLOAT_EQ(static_cast<float>(na), nb.item()) << name;
        EXPECT_GT(na, 1.5) << name;  // the clip did scale
        oa->step();
        ob->step();
      }
      expect_same_values(a, b, std::string(name) + (reduced ? " reduced" : ""));
    }
  }
  // Adam's fused path leaves the gradients as they were.
  auto c = random_params(7);
  const auto g0 = c[0].grad.to_vector();
  auto oc = optim::make_optimizer(optim::OptimizerOptions{},
                                  optim::weight_decay_groups(pointers(c), 1e-2, 0.05));
  optim::clip_grad_norm_async(pointers(c), 1.0, nullptr, nullptr, nullptr, oc.get());
  oc->step();
  EXPECT_EQ(c[0].grad.to_vector(), g0);
}

// step_ordered: the same values as step() in any order, with and without a pending clip; the
// bf16 mirror holds the updated values rounded (Adam's kernel writes it; SGD's is cast after);
// done() runs after each parameter; a list that is not the groups' parameters is an error.
TEST(Optimizer, OrderedStepEqualsStepAndMirrorsBf16) {
  for (const char* name : {"adamw", "sgd"}) {
    for (bool clip : {false, true}) {
      auto a = random_params(9), b = random_params(9);
      auto oa = named(name, a), ob = named(name, b);
      std::vector<nn::Parameter*> order{&b[2], &b[0], &b[1]};
      std::vector<std::vector<uint16_t>> mirror(3);
      for (int step = 0; step < 2; ++step) {
        const auto fresh = random_params(200 + step);
        for (size_t i = 0; i < a.size(); ++i) {
          a[i].grad.copy_from(fresh[i].grad);
          b[i].grad.copy_from(fresh[i].grad);
        }
        if (clip) {
          optim::clip_grad_norm_async(pointers(a), 1.0, nullptr, nullptr, nullptr, oa.get());
          optim::clip_grad_norm_async(pointers(b), 1.0, nullptr, nullptr, nullptr, ob.get());
        }
        oa->step();
        std::vector<size_t> done;
        ob->step_ordered(
            order,
            [&](size_t k) -> uint16_t* {
              if (k == 2) return nullptr;  // no copy for this one
              mirror[k].assign(order[k]->value.numel(), 0);
              return mirror[k].data();
            },
            [&](size_t k) { done.push_back(k); });
        EXPECT_EQ(done, (std::vector<size_t>{0, 1, 2}));
      }
      expect_same_values(a, b, std::string(name) + (clip ? " clipped" : ""));
      for (size_t k = 0; k < 2; ++k) {
        const auto vals = order[k]->value.to_vector();
        for (size_t i = 0; i < vals.size(); ++i)
          ASSERT_EQ(mirror[k][i], float_to_bf16(vals[i])) << name << " " << order[k]->name << i;
      }
      EXPECT_EQ(ob->steps(), 2);
      std::vector<nn::Parameter*> short_order{&b[0], &b[1]};
      EXPECT_THROW(ob->step_ordered(short_order, nullptr, nullptr), Error);
      std::vector<nn::Parameter*> twice{&b[0], &b[0], &b[1]};
      EXPECT_THROW(ob->step_ordered(twice, nullptr, nullptr), Error);
    }
  }
}

// ordered_step: the step counted and the groups' hyperparameters taken when it is prepared, the
// updates run later on another thread (ZeRO-Offload's host step beside the next forward): a
// scheduler setting the next step's lr meanwhile changes nothing in this one.
TEST(Optimizer, OrderedStepTakesTheHyperparametersWhenPrepared) {
  auto a = random_params(11), b = random_params(11);
  auto oa = named("adamw", a), ob = named("adamw", b);
  std::vector<nn::Parameter*> order{&b[0], &b[1], &b[2]};
  for (int step = 0; step < 2; ++step) {
    const auto fresh = random_params(300 + step);
    for (size_t i = 0; i < a.size(); ++i) {
      a[i].grad.copy_from(fresh[i].grad);
      b[i].grad.copy_from(fresh[i].grad);
    }
    oa->step();
    std::function<void()> run = ob->ordered_step(order, nullptr, nullptr);
    EXPECT_EQ(ob->steps(), step + 1);         // counted when prepared
    for (auto& g : ob->groups()) g.lr *= 10;  // the next step's lr, set before this one runs
    std::thread t(run);
    t.join();
    for (auto& g : ob->groups()) g.lr /= 10;
  }
  expect_same_values(a, b, "adamw ordered_step with the lr changed meanwhile");
}
