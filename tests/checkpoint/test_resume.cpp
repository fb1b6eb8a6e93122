// Checkpoint and resume in one process: a run interrupted after step k and resumed from its
// checkpoint (a fresh model, optimizer, scheduler and loader) continues bit for bit like the run
// that was never interrupted — losses of every later step and the final parameters — with dropout,
// gradient accumulation, a step-based cosine schedule and fp16 loss scaling; a checkpoint loads in
// timm's names; keep_last keeps the newest.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "cai/checkpoint/checkpoint.h"
#include "cai/core/error.h"
#include "cai/data/data.h"
#include "cai/nn/vit.h"
#include "cai/optim/lr_scheduler.h"
#include "cai/optim/optimizer.h"
#include "cai/train/trainer.h"

using namespace cai;
namespace fs = std::filesystem;

namespace {
const char* kFmnist = "/usr/share/datasets/fashion-mnist";

class Losses : public train::Hook {
 public:
  std::vector<double> v;
  void after_step(train::Trainer&, const train::StepInfo& s) override { v.push_back(s.loss); }
};

struct Run {
  std::vector<double> losses;
  std::map<std::string, Tensor> params;
};

// 2 epochs of 5 steps (batch 8, 2 micro-batches of 4), optionally checkpointing every 3 steps,
// optionally resuming from `resume`.
Run train(const std::string& ckpt_dir, const std::string& resume, DType precision) {
  auto ds = data::subset(data::load_mnist_dir(kFmnist, true, "fashion-mnist"), 40);
  data::LoaderConfig lc;
  lc.batch_size = 4;
  lc.seed = 3;
  lc.num_workers = 1;
  lc.transform.normalize = data::normalization_for("fashion_mnist");
  lc.transform.random_crop = 28, lc.transform.crop_padding = 2;
  data::DataLoader loader(ds, lc);
  nn::ViTConfig c;
  c.img_size = 28, c.patch_size = 7, c.in_chans = 1, c.num_classes = 10, c.embed_dim = 16;
  c.depth = 2, c.num_heads = 2, c.mlp_ratio = 2.0, c.drop_rate = 0.1f, c.drop_path_rate = 0.1f;
  nn::ViT model(c);
  model.init(1);
  checkpoint::Checkpoint ck;
  if (!resume.empty()) {
    ck = checkpoint::load_checkpoint(resume);
    checkpoint::load_model_state(model, ck.model);
  }
  auto plugin = std::make_shared<train::Plugin>();
  plugin->setup(model);
  optim::AdamW opt(optim::weight_decay_groups(model.parameters(), 5e-3, 0.05));
  auto sched = optim::make_scheduler("cosine", opt, 10, 2);
  train::TrainerConfig tc;
  tc.num_epochs = 2;
  tc.gradient_accumulation = 2;
  tc.clip_grad_norm = 1.0;
  tc.precision = precision;
  tc.grad_scaler.initial_scale = 1024;
  tc.grad_scaler.growth_interval = 2;  // the scale changes during the run
  tc.seed = 9;
  train::Booster booster(plugin);
  auto t =
      booster.boost(model, opt, train::Criterion{0.1f}, loader, nullptr, sched.get(), false, tc);
  auto losses = std::make_shared<Losses>();
  t->add_hook(losses);
  if (!ckpt_dir.empty()) {
    checkpoint::CheckpointConfig cc;
    cc.dir = ckpt_dir;
    cc.every_steps = 3;
    cc.keep_last = 2;
    t->add_hook(std::make_shared<checkpoint::CheckpointHook>(cc, sched.get()));
  }
  if (!resume.empty()) {
    plugin->load_optimizer_state(model, opt, ck.optimizer);
    sched->set_last(ck.state.scheduler_last);
    if (auto* s = t->grad_scaler()) s->load_state(ck.state.scaler);
    t->resume_at(ck.state.epoch, ck.state.step_in_epoch, ck.state.global_step);
  }
  t->fit();
  Run r;
  r.losses = losses->v;
  for (nn::Parameter* p : model.parameters()) r.params[p->name] = p->value.clone();
  return r;
}

void expect_bit_exact_resume(DType precision) {
  const std::string dir =
      (fs::temp_directory_path() / ("cai_resume_" + std::string(dtype_name(precision)))).string();
  fs::remove_all(dir);
  const Run whole = train(dir, "", precision);
  ASSERT_EQ(whole.losses.size(), 10u);
  // every 3 steps: step 3 (epoch 0), 6 (epoch 1 step 1), 9; keep_last 2 keeps 6 and 9.
  EXPECT_FALSE(fs::exists(dir + "/step-000000003"));
  ASSERT_TRUE(fs::exists(dir + "/step-000000006/model.safetensors"));
  EXPECT_EQ(checkpoint::resolve_checkpoint(dir), dir + "/step-000000009");
  for (const char* from : {"step-000000006", "step-000000009"}) {
    SCOPED_TRACE(from);
    const Run resumed = train("", dir + "/" + from, precision);
    const size_t k = whole.losses.size() - resumed.losses.size();
    ASSERT_EQ(k, std::string(from) == "step-000000006" ? 6u : 9u);
    for (size_t i = 0; i < resumed.losses.size(); ++i)
      EXPECT_EQ(resumed.losses[i], whole.losses[k + i]) << "step " << k + i + 1;
    for (const auto& [name, v] : whole.params) {
      const Tensor& w = resumed.params.at(name);
      EXPECT_EQ(std::memcmp(v.raw(), w.raw(), v.nbytes()), 0) << name;
    }
  }
}
}  // namespace

TEST(Checkpoint, ResumeIsBitExactInFp32) {
  expect_bit_exact_resume(DType::F32);
}

TEST(Checkpoint, ResumeIsBitExactWithFp16LossScaling) {
  expect_bit_exact_resume(DType::F16);
}

TEST(Checkpoint, ModelWeightsLoadByTimmNamesAndShapes) {
  nn::ViTConfig c;
  c.img_size = 8, c.patch_size = 4, c.in_chans = 1, c.num_classes = 3, c.embed_dim = 8;
  c.depth = 1, c.num_heads = 2;
  nn::ViT a(c), b(c);
  a.init(1);
  b.init(2);
  std::map<std::string, Tensor> w;
  for (nn::Parameter* p : a.parameters()) w[p->name] = p->value;
  checkpoint::load_model_state(b, w);
  for (nn::Parameter* p : b.parameters())
    EXPECT_EQ(std::memcmp(p->value.raw(), a.parameter(p->name).value.raw(), p->value.nbytes()), 0);
  // A head of another class count: refused naming it, or kept as initialised when skipped.
  w["head.weight"] = Tensor::zeros({5, 8});
  try {
    checkpoint::load_model_state(b, w);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'head.weight' is [5, 8] in the weights"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(checkpoint::load_model_state(b, w, {"head.weight", "head.bias"}));
  w["extra"] = Tensor::zeros({1});
  EXPECT_THROW(checkpoint::load_model_state(b, w, {"head.weight", "head.bias"}), Error);
  w.erase("pos_embed");
  EXPECT_THROW(checkpoint::load_model_state(b, w, {"head.weight", "head.bias"}, true), Error);
}
