// The trainer: a short Fashion-MNIST run drives the loss down; gradient accumulation equals one
// large batch; hooks and the metrics file.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <optional>

#include <fmt/format.h>

#include "cai/core/error.h"
#include "cai/data/data.h"
#include "cai/nn/vit.h"
#include "cai/ops/ops.h"
#include "cai/optim/lr_scheduler.h"
#include "cai/optim/optimizer.h"
#include "cai/train/trainer.h"

using namespace cai;

namespace {
const char* kFmnist = "/usr/share/datasets/fashion-mnist";

nn::ViTConfig tiny() {
  nn::ViTConfig c;
  c.img_size = 28, c.patch_size = 7, c.in_chans = 1, c.num_classes = 10, c.embed_dim = 32;
  c.depth = 2, c.num_heads = 2, c.mlp_ratio = 2.0;
  return c;
}

data::LoaderConfig loader_config(int64_t batch) {
  data::LoaderConfig lc;
  lc.batch_size = batch;
  lc.seed = 3;
  lc.num_workers = 1;
  lc.transform.normalize = data::normalization_for("fashion_mnist");
  return lc;
}
}  // namespace

TEST(Trainer, ShortFashionMnistRunLearns) {
  auto train_set = data::subset(data::load_mnist_dir(kFmnist, true, "fashion-mnist"), 3000);
  auto eval_set = data::subset(data::load_mnist_dir(kFmnist, false, "fashion-mnist"), 1000);
  data::DataLoader train(train_set, loader_config(64));
  auto ec = loader_config(256);
  ec.shuffle = false, ec.train = false;
  data::DataLoader eval(eval_set, ec);
  nn::ViT model(tiny());
  model.init(1);
  optim::AdamW opt(optim::weight_decay_groups(model.parameters(), 2e-3, 0.05));
  train::TrainerConfig tc;
  tc.num_epochs = 5;
  tc.clip_grad_norm = 1.0;
  auto sched = optim::make_scheduler("cosine", opt, 5 * 47, 10);
  train::Booster booster;
  auto trainer =
      booster.boost(model, opt, train::Criterion{0.0f}, train, &eval, sched.get(), false, tc);
  const std::string metrics = ::testing::TempDir() + "metrics.jsonl";
  trainer->add_hook(std::make_shared<train::MetricsFileHook>(metrics, 10));
  const double before = trainer->evaluate(eval).loss;
  trainer->fit();
  const auto& h = trainer->history();
  ASSERT_EQ(h.size(), 5u);
  std::printf("eval loss %.3f -> %.3f, accuracy %.3f; train loss %.3f -> %.3f\n", before,
              h.back().eval_loss, h.back().eval_accuracy, h.front().train_loss,
              h.back().train_loss);
  EXPECT_LT(h.back().eval_loss, 0.5 * before);
  EXPECT_LT(h.back().train_loss, h.front().train_loss);
  EXPECT_GT(h.back().eval_accuracy, 0.6);  // chance is 0.1
  EXPECT_EQ(trainer->global_step(), 5 * 47);
  EXPECT_NEAR(opt.groups()[0].lr, 0.0, 1e-9);  // cosine reached its end

  // JSON lines: step records every 10 steps, one epoch record per epoch.
  std::ifstream f(metrics);
  int steps = 0, epochs = 0;
  for (std::string line; std::getline(f, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["type"] == "step") {
      ++steps;
      EXPECT_TRUE(j.contains("loss"));
    }
    if (j["type"] == "epoch") {
      ++epochs;
      EXPECT_TRUE(j.contains("test_accuracy"));
    }
  }
  EXPECT_EQ(steps, 5 * 47 / 10);
  EXPECT_EQ(epochs, 5);
}

TEST(Trainer, GradientAccumulationEqualsOneLargeBatch) {
  // 2 accumulated batches of 8 = 1 batch of 16: same data, same dropout masks, same update.
  auto ds = data::subset(data::load_mnist_dir(kFmnist, true, "fashion-mnist"), 64);
  nn::ViTConfig c = tiny();
  c.drop_rate = 0.1f, c.drop_path_rate = 0.2f;
  std::vector<std::vector<float>> params;
  for (int64_t accum : {1, 2}) {
    data::DataLoader loader(ds, loader_config(16 / accum));
    nn::ViT model(c);
    model.init(5);
    optim::SGD opt(optim::weight_decay_groups(model.parameters(), 0.1, 0.0), 0.9);
    train::TrainerConfig tc;
    tc.gradient_accumulation = accum;
    tc.max_steps_per_epoch = 2;
    tc.seed = 11;
    train::Trainer t(model, opt, train::Criterion{0.1f}, loader, nullptr, nullptr, tc);
    t.fit();
    EXPECT_EQ(t.global_step(), 2);
    std::vector<float> all;
    for (auto* p : model.parameters())
      for (float v : p->value.to_vector()) all.push_back(v);
    params.push_back(all);
  }
  double num = 0, den = 0;
  for (size_t i = 0; i < params[0].size(); ++i)
    num += std::pow(params[0][i] - params[1][i], 2), den += std::pow(params[0][i], 2);
  EXPECT_LE(std::sqrt(num / den), 1e-6);
}

TEST(Trainer, RejectsBadSettings) {
  auto ds = data::subset(data::load_mnist_dir(kFmnist, true, "fashion-mnist"), 8);
  data::DataLoader loader(ds, loader_config(4));
  nn::ViT model(tiny());
  optim::SGD opt(optim::weight_decay_groups(model.parameters(), 0.1, 0.0));
  train::TrainerConfig tc;
  tc.gradient_accumulation = 0;
  EXPECT_THROW(train::Trainer(model, opt, {}, loader, nullptr, nullptr, tc), cai::Error);
  tc = {};
  tc.num_epochs = 0;
  EXPECT_THROW(train::Trainer(model, opt, {}, loader, nullptr, nullptr, tc), cai::Error);
}

namespace {
// Records what after_step saw; reads values every `every` steps (0: the default, every step).
class Recorder : public train::Hook {
 public:
  Recorder(std::vector<train::StepInfo>* out, int64_t every) : out_(out), every_(every) {}
  bool needs_values(const train::Trainer& t, const train::StepInfo& s) const override {
    return every_ == 0 ? train::Hook::needs_values(t, s) : s.global_step % every_ == 0;
  }
  void after_step(train::Trainer&, const train::StepInfo& s) override { out_->push_back(s); }

 private:
  std::vector<train::StepInfo>* out_;
  int64_t every_;
};

struct RunResult {
  std::vector<train::StepInfo> steps;
  std::vector<train::EpochInfo> epochs;
};

RunResult run_synthetic(int64_t every, double clip) {
  auto ds = data::synthetic(96, 1, 28, 10, 9);
  data::DataLoader loader(ds, loader_config(16));
  nn::ViT model(tiny());
  model.init(2);
  optim::AdamW opt(optim::weight_decay_groups(model.parameters(), 1e-3, 0.05));
  train::TrainerConfig tc;
  tc.num_epochs = 2;
  tc.clip_grad_norm = clip;
  train::Trainer t(model, opt, train::Criterion{0.0f}, loader, nullptr, nullptr, tc);
  RunResult r;
  t.add_hook(std::make_shared<Recorder>(&r.steps, every));
  t.fit();
  r.epochs = t.history();
  return r;
}
}  // namespace

TEST(Trainer, StepValuesAreReadOnlyWhereAHookNeedsThemAndEqualTheEveryStepOnes) {
  // A hook that reads every step (the default) and one that reads every 4th step see the same
  // values at the steps both read, the others are NaN with has_values false, and the epoch
  // totals (accumulated on the device) agree.
  const RunResult all = run_synthetic(0, 0.5), sparse = run_synthetic(4, 0.5);
  ASSERT_EQ(all.steps.size(), 12u);
  ASSERT_EQ(sparse.steps.size(), 12u);
  for (size_t i = 0; i < all.steps.size(); ++i) {
    const auto &a = all.steps[i], &s = sparse.steps[i];
    EXPECT_TRUE(a.has_values);
    EXPECT_TRUE(std::isfinite(a.loss) && a.grad_norm > 0) << "step " << a.global_step;
    EXPECT_EQ(s.global_step, a.global_step);
    if (s.global_step % 4 == 0) {
      ASSERT_TRUE(s.has_values) << "step " << s.global_step;
      EXPECT_DOUBLE_EQ(s.loss, a.loss);
      EXPECT_DOUBLE_EQ(s.accuracy, a.accuracy);
      EXPECT_DOUBLE_EQ(s.grad_norm, a.grad_norm);
    } else {
      EXPECT_FALSE(s.has_values) << "step " << s.global_step;
      EXPECT_TRUE(std::isnan(s.loss));
      EXPECT_TRUE(std::isnan(s.grad_norm));
    }
  }
  ASSERT_EQ(all.epochs.size(), 2u);
  for (size_t e = 0; e < 2; ++e) {
    EXPECT_NEAR(sparse.epochs[e].train_loss, all.epochs[e].train_loss, 1e-6);
    EXPECT_NEAR(sparse.epochs[e].train_accuracy, all.epochs[e].train_accuracy, 1e-9);
    double mean = 0;  // the epoch loss is the mean of its steps' losses (equal batches)
    for (size_t i = 6 * e; i < 6 * e + 6; ++i) mean += all.steps[i].loss / 6;
    EXPECT_NEAR(all.epochs[e].train_loss, mean, 1e-5);
  }
}

TEST(Trainer, ClippingOnTheDeviceMatchesTheHostFormula) {
  // The norm the trainer reports is the one clip_grad_norm computes, and clipped gradients
  // have norm max_norm (checked through optim::clip_grad_norm directly).
  nn::ViT model(tiny());
  model.init(4);
  auto ps = model.parameters();
  uint64_t k = 0;
  double sq = 0;
  for (auto* p : ps) {
    std::vector<float> g(static_cast<size_t>(p->grad.numel()));
    for (float& v : g)
      v = 0.01f * static_cast<float>(static_cast<int64_t>(k++ % 7) - 3), sq += double(v) * v;
    p->grad.copy_from(Tensor::from_vector(g, p->grad.shape()));
  }
  const Tensor norm = optim::clip_grad_norm_async(ps, 0.5);
  EXPECT_NEAR(norm.item(), std::sqrt(sq), 1e-4 * std::sqrt(sq));
  EXPECT_NEAR(optim::grad_norm(ps), 0.5, 1e-5);
  // Weights: a weight of 0 leaves a parameter's squares out of the norm (not out of clipping).
  const Tensor stats =
      optim::grad_stats(ps, [&](const nn::Parameter& p) { return &p == ps.front() ? 0.0 : 1.0; });
  const auto v = stats.to_vector();
  EXPECT_NEAR(v[0], 0.25 - optim::grad_norm({ps.front()}) * optim::grad_norm({ps.front()}), 1e-5);
  EXPECT_EQ(v[1], 0.0f);
}

// The reduction over ranks done where the gradients live (reduce_on_device, as the hybrid plugin
// does on GPUs) gives the norm and the clipped gradients of the host reduction: here a stand-in
// for two ranks holding equal squares (the sum doubles), against reduce_sq doing the same.
TEST(Trainer, ClippingReducedOnTheDeviceMatchesTheHostReduction) {
  auto grads = [](nn::ViT& m) {
    auto ps = m.parameters();
    uint64_t k = 0;
    for (auto* p : ps) {
      std::vector<float> g(static_cast<size_t>(p->grad.numel()));
      for (float& v : g) v = 0.01f * static_cast<float>(static_cast<int64_t>(k++ % 5) - 2);
      p->grad.copy_from(Tensor::from_vector(g, p->grad.shape()));
    }
    return ps;
  };
  nn::ViT a(tiny()), b(tiny());
  a.init(4), b.init(4);
  auto pa = grads(a), pb = grads(b);
  int device_calls = 0;
  const double host = optim::clip_grad_norm_async(pa, 0.5, [](double sq) { return 2 * sq; }).item();
  const double dev =
      optim::clip_grad_norm_async(
          pb, 0.5, [](double) -> double { throw Error("host reduction used"); }, nullptr,
          [&](Tensor& stats) {
            ++device_calls;
            ops::add_(stats, stats.clone());
          })
          .item();
  EXPECT_EQ(device_calls, 1);
  EXPECT_NEAR(dev, host, 1e-5 * host);
  for (size_t i = 0; i < pa.size(); ++i) {
    const auto x = pa[i]->grad.to_vector(), y = pb[i]->grad.to_vector();
    for (size_t j = 0; j < x.size(); ++j) ASSERT_NEAR(x[j], y[j], 1e-7) << pa[i]->name << j;
  }
}

TEST(Trainer, SyntheticDatasetIsFixedPerIndex) {
  auto a = data::synthetic(10, 3, 8, 5, 7), b = data::synthetic(10, 3, 8, 5, 7);
  std::vector<float> x(3 * 8 * 8), y(3 * 8 * 8);
  std::vector<int> counts(5, 0);
  for (int64_t i = 0; i < 10; ++i) {
    const int32_t la = a->get(i, x.data()), lb = b->get(i, y.data());
    EXPECT_EQ(la, lb);
    EXPECT_EQ(x, y);
    ASSERT_GE(la, 0);
    ASSERT_LT(la, 5);
    for (float v : x) ASSERT_TRUE(v >= 0.0f && v < 1.0f);
  }
  a->get(0, x.data());
  a->get(1, y.data());
  EXPECT_NE(x, y);
  EXPECT_THROW(a->get(10, x.data()), Error);
  EXPECT_THROW(data::synthetic(0, 3, 8, 5, 7), Error);
  EXPECT_NE(a->describe().find("synthetic"), std::string::npos);
}

namespace {
// Records the hooks' calls around a stop on request.
struct StopRecorder : train::Hook {
  std::vector<std::string> calls;
  bool needs_values(const train::Trainer&, const train::StepInfo&) const override { return false; }
  void after_step(train::Trainer&, const train::StepInfo& s) override {
    calls.push_back("step " + std::to_string(s.global_step));
  }
  void after_epoch(train::Trainer&, const train::EpochInfo& e) override {
    calls.push_back("epoch " + std::to_string(e.epoch));
  }
  void after_train(train::Trainer&) override { calls.push_back("after_train"); }
  void on_stop(train::Trainer&, const train::StopPoint& p) override {
    calls.push_back(fmt::format("stop {} at epoch {} step {} global {}", p.reason, p.epoch,
                                p.step_in_epoch, p.global_step));
  }
};

struct StopRun {
  std::vector<std::string> calls;
  std::optional<train::StopPoint> stopped;
  int asked = 0;  // stop_requested() calls
};

// 6 steps per epoch, 2 epochs; stop_requested says 15 from global step `from` on.
StopRun run_stopping(int64_t from, int64_t interval) {
  auto ds = data::synthetic(96, 1, 28, 10, 9);
  data::DataLoader loader(ds, loader_config(16));
  nn::ViT model(tiny());
  model.init(2);
  optim::AdamW opt(optim::weight_decay_groups(model.parameters(), 1e-3, 0.05));
  train::TrainerConfig tc;
  tc.num_epochs = 2;
  StopRun r;
  train::Trainer* self = nullptr;
  tc.stop_requested = [&] {
    ++r.asked;
    return self->global_step() >= from ? 15 : 0;
  };
  tc.stop_check_interval = interval;
  train::Trainer t(model, opt, train::Criterion{0.0f}, loader, nullptr, nullptr, tc);
  self = &t;
  auto rec = std::make_shared<StopRecorder>();
  t.add_hook(rec);
  t.fit();
  r.calls = rec->calls;
  if (t.stopped()) r.stopped = *t.stopped();
  return r;
}
}  // namespace

TEST(Trainer, StopsOnRequestAtTheNextCheckedBoundary) {
  // Asked from step 3, checked every step: stops right after step 3's hooks.
  StopRun a = run_stopping(3, 1);
  ASSERT_TRUE(a.stopped);
  EXPECT_EQ(a.stopped->global_step, 3);
  EXPECT_EQ(a.stopped->epoch, 0);
  EXPECT_EQ(a.stopped->step_in_epoch, 3);
  EXPECT_EQ(a.calls, (std::vector<std::string>{"step 1", "step 2", "step 3",
                                               "stop 15 at epoch 0 step 3 global 3"}));
  EXPECT_EQ(a.asked, 3);
  // Checked every 2nd step: the request of step 3 is seen after step 4.
  StopRun b = run_stopping(3, 2);
  ASSERT_TRUE(b.stopped);
  EXPECT_EQ(b.stopped->global_step, 4);
  EXPECT_EQ(b.asked, 2);
  // At an epoch's last step the check waits for the epoch's end (its evaluation and hooks):
  // the run resumes at the start of the next epoch.
  StopRun c = run_stopping(6, 1);
  ASSERT_TRUE(c.stopped);
  EXPECT_EQ(c.stopped->global_step, 6);
  EXPECT_EQ(c.stopped->epoch, 1);
  EXPECT_EQ(c.stopped->step_in_epoch, 0);
  ASSERT_GE(c.calls.size(), 2u);
  EXPECT_EQ(c.calls[c.calls.size() - 2], "epoch 0");
  EXPECT_EQ(c.calls.back(), "stop 15 at epoch 1 step 0 global 6");
  // A request in the last step: the run ends as usual.
  StopRun d = run_stopping(12, 1);
  EXPECT_FALSE(d.stopped);
  EXPECT_EQ(d.calls.back(), "after_train");
  EXPECT_EQ(d.asked, 11);  // 5 boundaries inside each epoch, and the end of the first
  // Never asked: the same run.
  StopRun e = run_stopping(1000, 1);
  EXPECT_FALSE(e.stopped);
  EXPECT_EQ(e.calls.size(), 12u + 2u + 1u);
}

TEST(Trainer, StopCheckIntervalMustBePositive) {
  EXPECT_THROW(run_stopping(3, 0), Error);
}

TEST(Trainer, ModelFlopsOfViTBase) {
  // ViT-B/16 by hand: patch embedding 2·196·768·(3·16·16), per block 2·197·(4·768² + 2·768·3072)
  // + 4·197²·768, 12 blocks, head 2·768·1000: 35,127,656,448 (3× = 105.4 GFLOP a training image,
  // the figure the benchmarks' MFU uses).
  nn::ViTConfig c;
  c.img_size = 224, c.patch_size = 16, c.in_chans = 3, c.num_classes = 1000, c.embed_dim = 768;
  c.depth = 12, c.num_heads = 12, c.mlp_ratio = 4.0;
  EXPECT_DOUBLE_EQ(c.forward_flops(), 35127656448.0);
}

TEST(Trainer, DensePeakByDeviceName) {
  EXPECT_EQ(train::dense_peak_tflops("NVIDIA H100 80GB HBM3", "bf16"), 989.0);
  EXPECT_EQ(train::dense_peak_tflops("NVIDIA H200", "fp16"), 989.0);
  EXPECT_EQ(train::dense_peak_tflops("NVIDIA GH200 480GB", "bf16"), 989.0);
  EXPECT_EQ(train::dense_peak_tflops("NVIDIA H100 PCIe", "bf16"), 756.0);
  EXPECT_EQ(train::dense_peak_tflops("NVIDIA H100 NVL", "bf16"), 835.0);
  EXPECT_EQ(train::dense_peak_tflops("NVIDIA H20", "bf16"), 148.0);  // not an H200
  EXPECT_EQ(train::dense_peak_tflops("NVIDIA A100-SXM4-80GB", "bf16"), 312.0);
  EXPECT_EQ(train::dense_peak_tflops("NVIDIA H200", "fp32"), 0.0);  // not known: no MFU
  EXPECT_EQ(train::dense_peak_tflops("NVIDIA GeForce RTX 4090", "bf16"), 0.0);
  EXPECT_EQ(train::format_rate(429.14, 0.43392), "429 TFLOP/s  MFU 43.4%");
  EXPECT_EQ(train::format_rate(0.01234, -1), "0.0123 TFLOP/s");
}

TEST(Trainer, MetricsRecordsCarryModelFlopsAndMfu) {
  // Each step and epoch record: tflops = 3 × forward FLOPs an image × img/s; mfu = tflops over
  // the configured peak (absent without one).
  auto ds = data::subset(data::load_mnist_dir(kFmnist, true, "fashion-mnist"), 64);
  for (double peak : {0.0, 0.5}) {
    data::DataLoader loader(ds, loader_config(16));
    nn::ViT model(tiny());
    model.init(2);
    optim::SGD opt(optim::weight_decay_groups(model.parameters(), 0.1, 0.0), 0.9);
    train::TrainerConfig tc;
    tc.peak_tflops = peak;
    train::Trainer t(model, opt, train::Criterion{0.0f}, loader, nullptr, nullptr, tc);
    const std::string metrics = ::testing::TempDir() + "metrics_flops.jsonl";
    t.add_hook(std::make_shared<train::MetricsFileHook>(metrics, 1));
    t.fit();
    const double step_flops = 3.0 * tiny().forward_flops();
    std::ifstream f(metrics);
    int rows = 0;
    for (std::string line; std::getline(f, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j["type"] != "step" && j["type"] != "epoch") continue;
      ++rows;
      const double ips = j["img_per_s"].get<double>(), tflops = j["tflops"].get<double>();
      EXPECT_GT(ips, 0.0);
      EXPECT_NEAR(tflops, step_flops * ips / 1e12, 1e-12 * std::max(1.0, tflops)) << line;
      if (peak > 0) {
        ASSERT_TRUE(j.contains("mfu")) << line;
        EXPECT_NEAR(j["mfu"].get<double>(), tflops / peak, 1e-12) << line;
      } else {
        EXPECT_FALSE(j.contains("mfu")) << line;
      }
    }
    EXPECT_EQ(rows, 5);  // 4 steps and the epoch
  }
}
