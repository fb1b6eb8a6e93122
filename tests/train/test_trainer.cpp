// The trainer: a short Fashion-MNIST run drives the loss down; gradient accumulation equals one
// large batch; hooks and the metrics file.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>

#include "cai/core/error.h"
#include "cai/data/data.h"
#include "cai/nn/vit.h"
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
