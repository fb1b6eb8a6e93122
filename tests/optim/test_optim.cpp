// Optimizers against PyTorch (tests/data/optim_golden.bin, scripts/golden/make_optim_golden.py),
// the ViT + AdamW training losses against timm, LR schedules against their formulas, clipping
// and state save/load.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "cai/core/error.h"
#include "cai/nn/vit.h"
#include "cai/optim/lr_scheduler.h"
#include "cai/optim/optimizer.h"
#include "golden.h"

using namespace cai;
using namespace cai::optim;

namespace {
struct TwoParams {
  nn::Parameter w = nn::make_parameter("w", {6, 5}, true);
  nn::Parameter b = nn::make_parameter("b", {5}, false);
};

std::unique_ptr<Optimizer> make(const std::string& name, TwoParams& tp) {
  auto groups = [&](double lr, double wd) {
    std::vector<ParamGroup> g(2);
    g[0].params = {&tp.w}, g[0].lr = lr, g[0].weight_decay = wd;
    g[1].params = {&tp.b}, g[1].lr = lr, g[1].weight_decay = 0;
    return g;
  };
  if (name == "sgd") return std::make_unique<SGD>(groups(0.1, 0.01));
  if (name == "sgd_momentum") return std::make_unique<SGD>(groups(0.1, 0.01), 0.9);
  if (name == "sgd_nesterov") return std::make_unique<SGD>(groups(0.1, 0.01), 0.9, 0.0, true);
  if (name == "adam") return std::make_unique<Adam>(groups(0.01, 0.01));
  if (name == "adamw") return std::make_unique<AdamW>(groups(0.01, 0.05));
  if (name == "lamb") return std::make_unique<Lamb>(groups(0.01, 0.05));
  throw std::runtime_error(name);
}
}  // namespace

class OptimizerGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(OptimizerGolden, MatchesPyTorchForFourSteps) {
  const auto g = test::load_golden(test::data_path("optim_golden.bin"));
  TwoParams tp;
  tp.w.value.copy_from(g.at("init.w"));
  tp.b.value.copy_from(g.at("init.b"));
  auto opt = make(GetParam(), tp);
  for (int t = 0; t < 4; ++t) {
    tp.w.grad.copy_from(g.at("grad" + std::to_string(t) + ".w"));
    tp.b.grad.copy_from(g.at("grad" + std::to_string(t) + ".b"));
    opt->step();
    const std::string k = GetParam() + ".step" + std::to_string(t);
    EXPECT_LE(test::rel_error(tp.w.value, g.at(k + ".w")), 1e-6) << k;
    EXPECT_LE(test::rel_error(tp.b.value, g.at(k + ".b")), 1e-6) << k;
    EXPECT_LE(test::tolerance_ratio(tp.w.value, g.at(k + ".w"), 1e-5, 1e-6), 1.0) << k;
  }
}
INSTANTIATE_TEST_SUITE_P(All, OptimizerGolden,
                         ::testing::Values("sgd", "sgd_momentum", "sgd_nesterov", "adam", "adamw",
                                           "lamb"));

TEST(OptimizerState, SaveAndLoadContinuesIdentically) {
  const auto g = test::load_golden(test::data_path("optim_golden.bin"));
  TwoParams a, b;
  for (TwoParams* tp : {&a, &b}) {
    tp->w.value.copy_from(g.at("init.w"));
    tp->b.value.copy_from(g.at("init.b"));
  }
  auto oa = make("adamw", a);
  auto ob = make("adamw", b);
  auto feed = [&](TwoParams& tp, int t) {
    tp.w.grad.copy_from(g.at("grad" + std::to_string(t) + ".w"));
    tp.b.grad.copy_from(g.at("grad" + std::to_string(t) + ".b"));
  };
  for (int t = 0; t < 2; ++t) feed(a, t), oa->step();
  // b resumes from a's saved parameters and state.
  b.w.value.copy_from(a.w.value);
  b.b.value.copy_from(a.b.value);
  ob->load_state_dict(oa->state_dict());
  EXPECT_EQ(ob->steps(), 2);
  EXPECT_EQ(oa->state_bytes(), 2 * (30 + 5) * 4);
  for (int t = 2; t < 4; ++t) feed(a, t), oa->step(), feed(b, t), ob->step();
  EXPECT_EQ(a.w.value.to_vector(), b.w.value.to_vector());
  auto bad = oa->state_dict();
  bad.emplace("nonexistent.exp_avg", Tensor::zeros({1}));
  EXPECT_THROW(ob->load_state_dict(bad), Error);
}

TEST(ClipGradNorm, ScalesToMaxNormAndReportsTheNorm) {
  TwoParams tp;
  tp.w.grad = Tensor::full({6, 5}, 1.0f);  // norm² = 30
  tp.b.grad = Tensor::full({5}, 2.0f);     // norm² = 20
  std::vector<nn::Parameter*> ps{&tp.w, &tp.b};
  const double n = clip_grad_norm(ps, 1.0);
  EXPECT_NEAR(n, std::sqrt(50.0), 1e-6);
  EXPECT_NEAR(grad_norm(ps), 1.0, 1e-5);
  EXPECT_NEAR(clip_grad_norm(ps, 10.0), 1.0, 1e-5);  // below max: unchanged
  EXPECT_NEAR(grad_norm(ps), 1.0, 1e-5);
  EXPECT_THROW(clip_grad_norm(ps, 0.0), Error);
}

// The deferred clip on host parameters (ZeRO-Offload's host step): clip_grad_norm_async(...,
// defer) returns the norm and leaves the gradients unscaled for the step to scale as it reads
// them (tests/optim/test_hybrid_adam.cpp: the same parameters as clipping in place); defer_clip
// refuses a sum of squares that is not fp32 with a message that names it.
TEST(ClipGradNorm, DeferredClipOnTheHostLeavesTheGradientsToTheStep) {
  TwoParams tp;
  tp.w.grad = Tensor::full({6, 5}, 1.0f);
  tp.b.grad = Tensor::full({5}, 2.0f);
  std::vector<nn::Parameter*> ps{&tp.w, &tp.b};
  auto opt = make_optimizer(OptimizerOptions{}, weight_decay_groups(ps, 0.01, 0.05));
  EXPECT_TRUE(opt->can_defer_clip(Device::cpu()));
  const Tensor norm = clip_grad_norm_async(ps, 1.0, nullptr, nullptr, nullptr, opt.get());
  EXPECT_NEAR(norm.item(), std::sqrt(50.0), 1e-6);
  EXPECT_NEAR(grad_norm(ps), std::sqrt(50.0), 1e-5);  // left to the step
  try {
    opt->defer_clip(Tensor::zeros({2}, DType::I32), 1.0f);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("deferred clip needs the fp32 sum of squares"),
              std::string::npos)
        << e.what();
  }
}

TEST(WeightDecayGroups, FollowTimm) {
  nn::ViTConfig c;
  c.img_size = 8, c.patch_size = 4, c.embed_dim = 8, c.depth = 1, c.num_heads = 2,
  c.num_classes = 3;
  nn::ViT m(c);
  auto groups = weight_decay_groups(m.parameters(), 1e-3, 0.05);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].weight_decay, 0.05);
  EXPECT_EQ(groups[1].weight_decay, 0.0);
  // Decay: patch proj, qkv, proj, fc1, fc2, head weights.
  EXPECT_EQ(groups[0].params.size(), 6u);
  for (nn::Parameter* p : groups[1].params) EXPECT_FALSE(p->weight_decay) << p->name;
}

TEST(ViTTraining, AdamWLossesMatchTimm) {
  const auto g = test::load_golden(test::data_path("vit_golden.bin"));
  const nn::ViTConfig c = test::vit_config(g);
  const float eps = g.at("config.label_smoothing").item();
  nn::ViT m(c);
  for (nn::Parameter* p : m.parameters()) p->value.copy_from(g.at("param." + p->name));
  AdamW opt(weight_decay_groups(m.parameters(), 1e-3, 0.05));
  const Tensor& img = g.at("input.images");
  const Tensor& labels = g.at("input.labels");
  const auto want = g.at("train.adamw_losses").to_vector();
  const int64_t B = img.size(0);
  for (size_t step = 0; step < want.size(); ++step) {
    std::vector<std::unique_ptr<nn::Cache>> caches;
    nn::ForwardCtx ctx{true, 0, step, 0};
    Tensor logits = m.forward(img, caches, ctx);
    double loss = 0;
    for (float l : ops::cross_entropy_fwd(logits, labels, eps).to_vector()) loss += l / B;
    EXPECT_NEAR(loss, want[step], 1e-5 * want[step]) << "step " << step;
    if (step + 1 == want.size()) break;
    opt.zero_grad();
    m.backward(ops::cross_entropy_bwd(logits, labels, eps, 1.0f / B), caches, ctx);
    opt.step();
  }
}

TEST(LRSchedule, CosineAnnealingWarmupFollowsItsFormula) {
  TwoParams tp;
  std::vector<ParamGroup> g(1);
  g[0].params = {&tp.w}, g[0].lr = 0.1;
  SGD opt(g);
  const int64_t T = 20, W = 5;
  const double eta_min = 0.001;
  CosineAnnealingWarmupLR s(opt, T, W, eta_min);
  for (int64_t t = 0; t < T; ++t) {
    const double want =
        t < W ? (t + 1.0) / W * 0.1
              : eta_min + (0.1 - eta_min) * (1 + std::cos(M_PI * (t - W) / double(T - W))) / 2;
    EXPECT_NEAR(opt.groups()[0].lr, want, 1e-12) << t;
    s.step();
  }
  EXPECT_NEAR(opt.groups()[0].lr, eta_min, 1e-12);  // t = T
  EXPECT_THROW(CosineAnnealingWarmupLR(opt, 5, 5), Error);
}

TEST(LRSchedule, LinearWarmupFollowsItsFormula) {
  TwoParams tp;
  std::vector<ParamGroup> g(1);
  g[0].params = {&tp.w}, g[0].lr = 0.2;
  SGD opt(g);
  LinearWarmupLR s(opt, 10, 3);
  const double want[] = {0.05,        0.1,         0.15,        0.2,     0.2 * 6 / 7, 0.2 * 5 / 7,
                         0.2 * 4 / 7, 0.2 * 3 / 7, 0.2 * 2 / 7, 0.2 / 7, 0.0};
  for (double w : want) {
    EXPECT_NEAR(opt.groups()[0].lr, w, 1e-12) << s.last();
    s.step();
  }
  EXPECT_THROW(make_scheduler("exponential", opt, 10, 0), Error);
}
