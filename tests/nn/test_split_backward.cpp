// Split backward (zero-bubble pipelines): every layer's backward_input (B) then backward_weight
// (W) gives exactly backward()'s input and parameter gradients (bitwise on the CPU in fp32, from
// zeroed gradients), B leaves every Parameter::grad untouched, the cache between B and W holds
// only W's steps (the forward's activations are released), and W releases it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <typeinfo>

#include "cai/nn/tensor_parallel.h"
#include "cai/nn/vit.h"
#include "cai/ops/ops.h"
#include "vit_test_inputs.h"

using namespace cai;
using namespace cai::nn;
using namespace cai::nn::vit_inputs;

namespace {

struct Variant {
  const char* name;
  std::string act = "gelu";
  float drop = 0, drop_path = 0;
  bool checkpoint = false;
  DType dtype = DType::F32;
};

ViTConfig config_of(const Variant& v) {
  ViTConfig c;
  c.img_size = 8, c.patch_size = 4, c.in_chans = 2, c.num_classes = 5, c.embed_dim = 8;
  c.depth = 3, c.num_heads = 2, c.mlp_ratio = 2.0;
  c.act = v.act, c.drop_rate = v.drop, c.drop_path_rate = v.drop_path, c.checkpoint = v.checkpoint;
  return c;
}

bool all_zero(const Tensor& t) {
  for (float v : t.to_vector())
    if (v != 0.0f) return false;
  return true;
}

// Forward of a micro-batch of 3 samples at global offset `offset`; returns dlogits.
Tensor forward(ViT& m, std::vector<std::unique_ptr<Cache>>& caches, const ForwardCtx& ctx,
               float phase) {
  const int64_t b = 3;
  Tensor logits = m.forward(images(m.config(), b, phase), caches, ctx);
  return ops::cross_entropy_bwd(logits, labels(b), 0.1f, 1.0f / 6);
}

}  // namespace

class SplitBackward : public ::testing::TestWithParam<Variant> {};

TEST_P(SplitBackward, InputThenWeightIsTheCombinedBackward) {
  const Variant v = GetParam();
  const ViTConfig c = config_of(v);
  ViT ref(c), split(c);
  for (ViT* m : {&ref, &split}) {
    m->init(3);
    m->set_compute_dtype(v.dtype);
  }
  const ForwardCtx ctx{true, 5, 2, 4};
  std::vector<std::unique_ptr<Cache>> rc, sc;
  Tensor g_ref = forward(ref, rc, ctx, 0.37f);
  Tensor g_split = forward(split, sc, ctx, 0.37f);
  ASSERT_TRUE(bitwise_equal(g_ref, g_split));
  auto& rl = ref.layers();
  auto& sl = split.layers();
  // B of every layer (each input gradient against backward()'s), then W of every layer.
  for (size_t i = rl.size(); i-- > 0;) {
    SCOPED_TRACE(rl[i]->name());
    g_ref = rl[i]->backward(g_ref, rc[i], ctx);
    g_split = sl[i]->backward_input(g_split, sc[i], ctx);
    EXPECT_EQ(rc[i], nullptr);
    ASSERT_NE(sc[i], nullptr);
    EXPECT_EQ(typeid(*sc[i]), typeid(Cache)) << "the forward's activations outlive B";
    EXPECT_FALSE(sc[i]->weight_steps.empty());
    if (i > 0) {
      ASSERT_TRUE(bitwise_equal(g_ref, g_split));
    }
  }
  for (Parameter* p : split.parameters()) EXPECT_TRUE(all_zero(p->grad)) << p->name << " after B";
  for (size_t i = sl.size(); i-- > 0;) {
    sl[i]->backward_weight(sc[i]);
    EXPECT_EQ(sc[i], nullptr) << sl[i]->name() << ": W keeps its cache";
  }
  auto rp = ref.parameters(), sp = split.parameters();
  ASSERT_EQ(rp.size(), sp.size());
  for (size_t k = 0; k < rp.size(); ++k) {
    EXPECT_FALSE(all_zero(rp[k]->grad)) << rp[k]->name << ": a test that cannot fail";
    EXPECT_TRUE(bitwise_equal(rp[k]->grad, sp[k]->grad)) << rp[k]->name;
  }
}

// Two micro-batches as a zero-bubble stage runs them: B0, B1, W1, W0 (W of the later one first),
// against backward() of each in turn: the same sums in another order (1e-6 relative).
TEST_P(SplitBackward, InterleavedMicroBatchesAccumulate) {
  const Variant v = GetParam();
  const ViTConfig c = config_of(v);
  ViT ref(c), split(c);
  for (ViT* m : {&ref, &split}) {
    m->init(3);
    m->set_compute_dtype(v.dtype);
  }
  ForwardCtx c0{true, 5, 2, 0}, c1{true, 5, 2, 3};
  std::vector<std::unique_ptr<Cache>> r0, r1, s0, s1;
  Tensor gr0 = forward(ref, r0, c0, 0.37f);
  ref.backward(gr0, r0, c0);
  Tensor gr1 = forward(ref, r1, c1, 0.11f);
  ref.backward(gr1, r1, c1);
  Tensor gs0 = forward(split, s0, c0, 0.37f);
  Tensor gs1 = forward(split, s1, c1, 0.11f);
  auto& L = split.layers();
  for (size_t i = L.size(); i-- > 0;) gs0 = L[i]->backward_input(gs0, s0[i], c0);
  for (size_t i = L.size(); i-- > 0;) gs1 = L[i]->backward_input(gs1, s1[i], c1);
  for (size_t i = L.size(); i-- > 0;) L[i]->backward_weight(s1[i]);
  for (size_t i = L.size(); i-- > 0;) L[i]->backward_weight(s0[i]);
  auto rp = ref.parameters(), sp = split.parameters();
  for (size_t k = 0; k < rp.size(); ++k) {
    const auto a = rp[k]->grad.to_vector(), b = sp[k]->grad.to_vector();
    for (size_t j = 0; j < a.size(); ++j)
      ASSERT_NEAR(a[j], b[j], 1e-6 * (1 + std::abs(a[j]))) << rp[k]->name << "[" << j << "]";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layers, SplitBackward,
    ::testing::Values(Variant{"plain"}, Variant{"masked", "gelu", 0.1f, 0.2f},
                      Variant{"gelu_tanh", "gelu_tanh"},
                      Variant{"checkpoint", "gelu", 0.1f, 0.2f, true},
                      Variant{"bf16", "gelu", 0, 0, false, DType::BF16},
                      Variant{"bf16_tanh_checkpoint", "gelu_tanh", 0, 0, true, DType::BF16}),
    [](const ::testing::TestParamInfo<Variant>& i) { return std::string(i.param.name); });

// The benchmark's ParallelLinear (Whole kind): the same contract.
TEST(SplitBackwardLinear, WholeLinear) {
  ParallelLinear a("fc", 6, 4, ParallelLinear::Kind::Whole),
      b("fc", 6, 4, ParallelLinear::Kind::Whole);
  for (ParallelLinear* l : {&a, &b}) {
    for (int64_t i = 0; i < l->lin.weight.value.numel(); ++i)
      l->lin.weight.value.data<float>()[i] = std::sin(0.3f * static_cast<float>(i));
    ops::fill_(l->lin.bias.value, 0.1f);
  }
  std::vector<float> xv(5 * 6), dyv(5 * 4);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::cos(0.7f * static_cast<float>(i));
  for (size_t i = 0; i < dyv.size(); ++i) dyv[i] = std::sin(0.9f * static_cast<float>(i));
  const Tensor x = Tensor::from_vector(xv, {5, 6}), dy = Tensor::from_vector(dyv, {5, 4});
  std::unique_ptr<Cache> ca, cb;
  a.forward(x, ca, ForwardCtx{});
  b.forward(x, cb, ForwardCtx{});
  const Tensor dxa = a.backward(dy, ca, ForwardCtx{});
  const Tensor dxb = b.backward_input(dy, cb, ForwardCtx{});
  EXPECT_TRUE(all_zero(b.lin.weight.grad) && all_zero(b.lin.bias.grad));
  b.backward_weight(cb);
  EXPECT_EQ(cb, nullptr);
  EXPECT_TRUE(bitwise_equal(dxa, dxb));
  EXPECT_FALSE(all_zero(a.lin.weight.grad));
  EXPECT_TRUE(bitwise_equal(a.lin.weight.grad, b.lin.weight.grad));
  EXPECT_TRUE(bitwise_equal(a.lin.bias.grad, b.lin.bias.grad));
}

// What W holds between B and W, per block: the four linears' inputs and output gradients (fc2:
// m [T, 4D] and dy [T, D]; fc1: b [T, D] and its output gradient [T, 4D]; proj: o [T, D] and
// dy [T, D]; qkv: a [T, D] and dqkv [T, 3D]), 16·D values per token, and the partial sums of the
// norms (4·D) and of fc1's bias (4·D), which do not grow with the batch. Measured as what the
// block's W releases (dropout on: its output gradients are W's own masked copies).
TEST(SplitBackwardMemory, BlockHoldsSixteenValuesPerTokenAndFeature) {
  ViTConfig c;
  c.img_size = 16, c.patch_size = 4, c.in_chans = 1, c.num_classes = 5, c.embed_dim = 8;
  c.depth = 1, c.num_heads = 2, c.mlp_ratio = 4.0, c.drop_rate = 0.1f;
  ViT m(c);
  m.init(1);
  const ForwardCtx ctx{true, 1, 1, 0};
  const int64_t n = c.num_patches() + 1, d = c.embed_dim;
  for (int64_t b : {1, 3}) {
    std::vector<std::unique_ptr<Cache>> caches;
    Tensor logits = m.forward(images(c, b, 0.2f), caches, ctx);
    Tensor g = ops::cross_entropy_bwd(logits, labels(b), 0.0f, 1.0f);
    g = m.layers()[2]->backward_input(g, caches[2], ctx);
    Tensor gx = m.layers()[1]->backward_input(g, caches[1], ctx);
    g = Tensor();
    const int64_t held = memory_in_use(DeviceType::CPU);
    m.layers()[1]->backward_weight(caches[1]);
    const int64_t freed = held - memory_in_use(DeviceType::CPU);
    EXPECT_EQ(freed, (16 * d * n * b + 8 * d) * static_cast<int64_t>(sizeof(float))) << b;
    m.layers()[2]->backward_weight(caches[2]);
    m.layers()[0]->backward_input(gx, caches[0], ctx);
    m.layers()[0]->backward_weight(caches[0]);
  }
}
