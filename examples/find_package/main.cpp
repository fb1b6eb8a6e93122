// One training step of a tiny ViT on the CPU through libcai's public API, built against an
// installed libcai (find_package(cai)): the model from a config as vit_train reads it, random
// images and labels, forward, cross-entropy, backward, AdamW. Prints the loss.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include "cai/config/config.h"
#include "cai/core/error.h"
#include "cai/core/rng.h"
#include "cai/core/tensor.h"
#include "cai/nn/vit.h"
#include "cai/ops/ops.h"
#include "cai/optim/optimizer.h"

int main() try {
  using namespace cai;
  const config::TrainConfig cfg = config::parse_config(R"(
[model]
img_size = 8
patch_size = 4
hidden_size = 16
depth = 1
num_heads = 2
num_classes = 3
[data]
dataset = "synthetic"
)",
                                                       "example.toml", {});
  config::validate(cfg, 1);
  const nn::ViTConfig vc = cfg.vit();
  nn::ViT model(vc);
  model.init(42);
  optim::AdamW opt(optim::weight_decay_groups(model.parameters(), 1e-3, 0.05));

  const int64_t batch = 4;
  Tensor images = Tensor::empty({batch, vc.in_chans, vc.img_size, vc.img_size});
  rng::uniform_(images, 7, rng::stream_of("images"), -1.0f, 1.0f);
  const Tensor labels = Tensor::from_vector(std::vector<int32_t>{0, 1, 2, 1}, {batch});

  nn::ForwardCtx ctx;
  ctx.training = true;
  std::vector<std::unique_ptr<nn::Cache>> caches;
  const Tensor logits = model.forward(images, caches, ctx);
  double loss = 0;
  for (float l : ops::cross_entropy_fwd(logits, labels, 0.0f).to_vector()) loss += l / batch;
  model.backward(ops::cross_entropy_bwd(logits, labels, 0.0f, 1.0f / batch), caches, ctx);
  opt.step();
  std::printf("loss %.6f\n", loss);
  return 0;
} catch (const cai::Error& e) {
  std::fprintf(stderr, "vit_step: %s\n", e.what());
  return 1;
}
