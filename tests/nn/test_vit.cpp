#include <gtest/gtest.h>

#include <cmath>

#include "cai/core/error.h"
#include "cai/nn/vit.h"
#include "cai/ops/ops.h"
#include "gradcheck.h"

using namespace cai;
using namespace cai::nn;

namespace {
ViTConfig small_config() {
  ViTConfig c;
  c.img_size = 8, c.patch_size = 4, c.in_chans = 2, c.num_classes = 5, c.embed_dim = 8;
  c.depth = 2, c.num_heads = 2, c.mlp_ratio = 2.0;
  return c;
}

// Mean cross-entropy loss and its backward through the model; returns the loss.
double train_step(ViT& m, const Tensor& img, const Tensor& labels, const ForwardCtx& ctx,
                  float weight) {
  std::vector<std::unique_ptr<Cache>> caches;
  Tensor logits = m.forward(img, caches, ctx);
  double loss = 0;
  for (float l : ops::cross_entropy_fwd(logits, labels, 0.1f).to_vector()) loss += l * weight;
  m.backward(ops::cross_entropy_bwd(logits, labels, 0.1f, weight), caches, ctx);
  return loss;
}

std::vector<std::vector<float>> grads(ViT& m) {
  std::vector<std::vector<float>> g;
  for (Parameter* p : m.parameters()) g.push_back(p->grad.to_vector());
  return g;
}
}  // namespace

TEST(ViT, ParameterCountsMatchTimm) {
  EXPECT_EQ(ViT(ViTConfig::named("vit_base_patch16_224")).num_parameters(), 86567656);
  for (const auto& n : ViTConfig::names())  // counted without building the model
    EXPECT_EQ(ViTConfig::named(n).num_parameters(), ViT(ViTConfig::named(n)).num_parameters()) << n;
  ViTConfig odd = small_config();
  odd.mlp_ratio = 1.5, odd.num_classes = 7;
  EXPECT_EQ(odd.num_parameters(), ViT(odd).num_parameters());
  EXPECT_EQ(ViT(ViTConfig::named("vit_small_patch16_224")).num_parameters(), 22050664);
  EXPECT_EQ(ViT(ViTConfig::named("vit_tiny_patch16_224")).num_parameters(), 5717416);
  EXPECT_THROW(ViTConfig::named("vit_gigantic"), Error);
}

TEST(ViT, ParameterNamesAndWeightDecayFollowTimm) {
  ViT m(small_config());
  EXPECT_EQ(m.parameter("blocks.1.attn.qkv.weight").value.shape(), (Shape{24, 8}));
  EXPECT_EQ(m.parameter("patch_embed.proj.weight").value.shape(), (Shape{8, 2, 4, 4}));
  EXPECT_EQ(m.parameter("pos_embed").value.shape(), (Shape{1, 5, 8}));
  EXPECT_TRUE(m.parameter("blocks.0.mlp.fc1.weight").weight_decay);
  EXPECT_TRUE(m.parameter("patch_embed.proj.weight").weight_decay);
  for (const char* n :
       {"cls_token", "pos_embed", "blocks.0.norm1.weight", "head.bias", "patch_embed.proj.bias"})
    EXPECT_FALSE(m.parameter(n).weight_decay) << n;
  EXPECT_THROW(m.parameter("blocks.9.norm1.weight"), Error);
}

TEST(ViT, ConfigErrorsNameTheValues) {
  ViTConfig c = small_config();
  c.num_heads = 3;
  try {
    ViT m(c);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("hidden size 8 must be divisible by num_heads 3"),
              std::string::npos)
        << e.what();
  }
  c = small_config();
  c.img_size = 10;
  EXPECT_THROW(ViT{c}, Error);
}

TEST(ViT, InitialisationFollowsTimm) {
  ViTConfig c = ViTConfig::named("vit_tiny_patch16_224");
  c.depth = 1;
  ViT m(c);
  m.init(42);
  auto stats = [](const Tensor& t, double* mean, double* sd) {
    const auto v = t.to_vector();
    double s = 0, s2 = 0;
    for (float x : v) s += x, s2 += double(x) * x;
    *mean = s / v.size();
    *sd = std::sqrt(s2 / v.size() - *mean * *mean);
  };
  double mean, sd;
  stats(m.parameter("blocks.0.attn.qkv.weight").value, &mean, &sd);
  EXPECT_NEAR(sd, 0.02, 0.001);
  EXPECT_NEAR(mean, 0.0, 0.001);
  stats(m.parameter("cls_token").value, &mean, &sd);
  EXPECT_LT(sd, 1e-5);
  EXPECT_GT(sd, 1e-7);
  stats(m.parameter("patch_embed.proj.weight").value, &mean, &sd);
  EXPECT_NEAR(sd, 1.0 / std::sqrt(768.0) / std::sqrt(3.0), 0.002);  // U(±1/√fan_in)
  for (float v : m.parameter("blocks.0.norm1.weight").value.to_vector()) EXPECT_EQ(v, 1.0f);
  for (float v : m.parameter("blocks.0.mlp.fc1.bias").value.to_vector()) EXPECT_EQ(v, 0.0f);
  // Same seed, same values; another seed, other values.
  ViT m2(c);
  m2.init(42);
  EXPECT_EQ(m.parameter("pos_embed").value.to_vector(),
            m2.parameter("pos_embed").value.to_vector());
  m2.init(43);
  EXPECT_NE(m.parameter("pos_embed").value.to_vector(),
            m2.parameter("pos_embed").value.to_vector());
}

class WholeModel : public ::testing::TestWithParam<std::pair<const char*, float>> {};
INSTANTIATE_TEST_SUITE_P(Activations, WholeModel,
                         ::testing::Values(std::make_pair("gelu", 0.1f),
                                           std::make_pair("gelu_tanh", 0.1f),
                                           std::make_pair("gelu_tanh", 0.0f)));

// act × dropout: gelu_tanh without MLP dropout takes the fused linear+GELU backward path.
TEST_P(WholeModel, GradientsMatchFiniteDifferences) {
  ViTConfig c = small_config();
  c.act = GetParam().first;
  c.drop_rate = GetParam().second;
  c.drop_path_rate = 0.2f;
  ViT m(c);
  // O(1) parameters keep LayerNorm inputs well-conditioned for finite differences (timm's init
  // gives tokens of std 0.02, where a step of 1e-2 is far from linear).
  uint64_t seed = 100;
  for (Parameter* p : m.parameters()) {
    Tensor r = test::random_tensor(p->value.shape(), seed++, 0.3f);
    if (p->name.find("norm") != std::string::npos && p->name.find("weight") != std::string::npos)
      ops::fill_(p->value, 1.0f), ops::add_(p->value, r);
    else
      p->value.copy_from(r);
  }
  Tensor img = test::random_tensor({3, 2, 8, 8}, 5);
  Tensor labels = Tensor::from_vector(std::vector<int32_t>{0, 4, 2}, {3});
  ForwardCtx ctx{true, 9, 3, 0};
  m.zero_grad();
  train_step(m, img, labels, ctx, 1.0f / 3);
  auto L = [&] {
    std::vector<std::unique_ptr<Cache>> caches;
    double s = 0;
    for (float l : ops::cross_entropy_fwd(m.forward(img, caches, ctx), labels, 0.1f).to_vector())
      s += l / 3.0;
    return s;
  };
  for (const char* n :
       {"patch_embed.proj.weight", "cls_token", "pos_embed", "blocks.0.attn.qkv.weight",
        "blocks.0.attn.proj.bias", "blocks.1.norm2.weight", "blocks.1.mlp.fc1.weight",
        "blocks.1.mlp.fc2.bias", "norm.bias", "head.weight"}) {
    Parameter& p = m.parameter(n);
    EXPECT_LE(test::gradcheck(L, p.value, p.grad, 1e-2f, 2e-2, 1e-3, 24), 1.0) << n;
  }
}

TEST(ViT, CheckpointingGivesIdenticalGradients) {
  ViTConfig c = small_config();
  c.drop_rate = 0.2f;
  c.drop_path_rate = 0.3f;
  Tensor img = test::random_tensor({4, 2, 8, 8}, 5);
  Tensor labels = Tensor::from_vector(std::vector<int32_t>{0, 1, 2, 3}, {4});
  ForwardCtx ctx{true, 7, 11, 0};
  ViT a(c);
  a.init(3);
  c.checkpoint = true;
  ViT b(c);
  b.init(3);
  const double la = train_step(a, img, labels, ctx, 0.25f);
  const double lb = train_step(b, img, labels, ctx, 0.25f);
  EXPECT_EQ(la, lb);
  EXPECT_EQ(grads(a), grads(b));
}

// LayerHooks::overlap_point (where data parallelism starts the gradient all-reduces that waited):
// once inside each block's backward and once inside the embedding's, between the layer's
// before_backward and after_backward, with or without checkpointing; the gradients are those of
// a backward without hooks.
TEST(ViT, OverlapPointOnceInsideEachBlockAndTheEmbeddingBackward) {
  for (bool checkpoint : {false, true}) {
    ViTConfig c = small_config();
    c.depth = 3;
    c.checkpoint = checkpoint;
    Tensor img = test::random_tensor({2, 2, 8, 8}, 5);
    Tensor labels = Tensor::from_vector(std::vector<int32_t>{0, 1}, {2});
    ViT a(c), b(c);
    a.init(3);
    b.init(3);
    Layer* current = nullptr;
    std::vector<Layer*> points;
    LayerHooks hooks;
    hooks.before_backward = [&](Layer& l) { current = &l; };
    hooks.after_backward = [&](Layer&) { current = nullptr; };
    hooks.overlap_point = [&] { points.push_back(current); };
    const ForwardCtx ctx{true, 7, 11, 0};
    std::vector<std::unique_ptr<Cache>> caches;
    Tensor logits = a.forward(img, caches, ctx, &hooks);
    a.backward(ops::cross_entropy_bwd(logits, labels, 0.1f, 0.5f), caches, ctx, &hooks);
    ASSERT_EQ(points.size(), 4u) << "checkpoint " << checkpoint;
    for (size_t i = 0; i < points.size(); ++i) {
      // Backward order: the last block first, the embedding (layers()[0]) last.
      EXPECT_EQ(points[i], a.layers()[3 - i].get()) << "point " << i;
    }
    train_step(b, img, labels, ctx, 0.5f);
    EXPECT_EQ(grads(a), grads(b)) << "checkpoint " << checkpoint;
  }
}

TEST(ViT, MicroBatchesAddUpToTheFullBatch) {
  // Dropout and drop-path masks depend on the global sample index, so two micro-batches of 2 give
  // the gradients of one batch of 4: what data and pipeline parallelism rely on.
  ViTConfig c = small_config();
  c.drop_rate = 0.2f;
  c.drop_path_rate = 0.3f;
  Tensor img = test::random_tensor({4, 2, 8, 8}, 5);
  Tensor labels = Tensor::from_vector(std::vector<int32_t>{0, 1, 2, 3}, {4});
  ViT full(c), micro(c);
  full.init(3);
  micro.init(3);
  const double lf = train_step(full, img, labels, ForwardCtx{true, 7, 11, 0}, 0.25f);
  double lm = 0;
  for (int64_t s : {0, 2})
    lm +=
        train_step(micro, img.narrow(s, 2), labels.narrow(s, 2), ForwardCtx{true, 7, 11, s}, 0.25f);
  EXPECT_NEAR(lf, lm, 1e-6 * std::abs(lf));
  const auto gf = grads(full), gm = grads(micro);
  for (size_t i = 0; i < gf.size(); ++i) {
    double num = 0, den = 0;
    for (size_t j = 0; j < gf[i].size(); ++j)
      num += std::pow(gf[i][j] - gm[i][j], 2), den += std::pow(gf[i][j], 2);
    EXPECT_LE(std::sqrt(num), 1e-5 * std::sqrt(den) + 1e-12) << full.parameters()[i]->name;
  }
  // Evaluation mode draws no masks at all: twice the same logits.
  std::vector<std::unique_ptr<Cache>> c1, c2;
  EXPECT_EQ(full.forward(img, c1, ForwardCtx{}).to_vector(),
            full.forward(img, c2, ForwardCtx{false, 1, 2, 0}).to_vector());
}

// ComputeCopies: the weights and biases in the compute dtype for its lifetime, rounded as
// Tensor::to rounds; nothing for fp32; an inner scope leaves an enclosing scope's copies alone
// (a checkpointed block recomputes its forward inside its backward's scope).
TEST(ViT, ComputeCopiesHoldRoundedWeightsForTheirScope) {
  Linear a("a", 6, 5), b("b", 4, 3, /*bias=*/false);
  for (Parameter* p : {&a.weight, &a.bias, &b.weight})
    p->value = Tensor::from_vector(std::vector<float>(p->value.numel(), 1.0f + 1.0f / 1024),
                                   p->value.shape());
  {
    const ComputeCopies none(DType::F32, {&a, &b});
    EXPECT_FALSE(a.weight_c.defined());
    EXPECT_EQ(&a.w(), &a.weight.value);
  }
  {
    const ComputeCopies outer(DType::BF16, {&a});
    ASSERT_TRUE(a.weight_c.defined() && a.bias_c.defined());
    EXPECT_EQ(a.w().dtype(), DType::BF16);
    EXPECT_EQ(a.b().dtype(), DType::BF16);
    EXPECT_EQ(a.w().to(DType::F32).to_vector(),
              a.weight.value.to(DType::BF16).to(DType::F32).to_vector());
    EXPECT_FALSE(b.weight_c.defined());
    {
      const ComputeCopies inner(DType::BF16, {&a, &b});
      EXPECT_TRUE(b.weight_c.defined());
      EXPECT_FALSE(b.bias_c.defined());  // no bias
    }
    EXPECT_TRUE(a.weight_c.defined()) << "the inner scope cleared the outer scope's copy";
    EXPECT_FALSE(b.weight_c.defined());
  }
  EXPECT_FALSE(a.weight_c.defined() || a.bias_c.defined());
  EXPECT_EQ(a.w().dtype(), DType::F32);
}

// In bf16 a block hands the block before it its input gradient rounded in the LayerNorm pass
// that makes it, instead of that block's fc2 backward rounding it again: the gradients are the
// same bits as when the hand-off cannot happen (each gradient a fresh copy between the layers).
TEST(ViT, RoundedGradientHandOffChangesNothing) {
  ViTConfig c = small_config();
  c.depth = 3;
  Tensor img = test::random_tensor({4, 2, 8, 8}, 5);
  Tensor labels = Tensor::from_vector(std::vector<int32_t>{0, 1, 2, 3}, {4});
  const ForwardCtx ctx{true, 7, 11, 0};
  ViT a(c), b(c);
  for (ViT* m : {&a, &b}) {
    m->init(3);
    m->set_compute_dtype(DType::BF16);
  }
  train_step(a, img, labels, ctx, 0.25f);
  // b: the layers by hand, every gradient cloned before the layer below takes it.
  std::vector<std::unique_ptr<Cache>> caches(b.layers().size());
  Tensor x = img;
  for (size_t i = 0; i < b.layers().size(); ++i) x = b.layers()[i]->forward(x, caches[i], ctx);
  Tensor g = ops::cross_entropy_bwd(x, labels, 0.1f, 0.25f);
  for (size_t i = b.layers().size(); i-- > 0;)
    g = b.layers()[i]->backward(g.clone(), caches[i], ctx);
  EXPECT_EQ(grads(a), grads(b));
}
