// The GELU's output made again in the backward (ViTConfig::recompute_gelu) instead of kept from
// the forward: the same logits, input gradients and parameter gradients bit for bit (CPU, fp32
// and bf16), a forward that keeps exactly depth × rows × hidden fewer values, and a step whose peak
// is lower by at least (depth − 2) × rows × hidden values (the first block's backward holds fc2's
// input gradient, the GELU's and the output made again at once: two more than keeping it). Where it
// does not apply (MLP dropout, checkpointing, gelu_tanh) the forward keeps the same bytes either
// way.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "cai/core/tensor.h"
#include "cai/nn/vit.h"
#include "cai/ops/ops.h"
#include "vit_test_inputs.h"

using namespace cai;
using namespace cai::nn;
using namespace cai::nn::vit_inputs;

namespace {

ViTConfig tiny(bool recompute) {
  ViTConfig c;
  c.img_size = 16, c.patch_size = 4, c.in_chans = 2, c.num_classes = 5, c.embed_dim = 16;
  c.depth = 4, c.num_heads = 2, c.mlp_ratio = 4.0;
  c.recompute_gelu = recompute;
  return c;
}

struct Step {
  Tensor logits;
  std::vector<Tensor> grads;
  int64_t kept = 0;           // bytes the forward's caches hold (live after it, minus before)
  int64_t backward_peak = 0;  // the backward's peak above the live bytes before it
};

Step run(const ViTConfig& c, DType t, int64_t b) {
  ViT m(c);
  m.init(7);
  m.set_compute_dtype(t);
  const ForwardCtx ctx{true, 3, 1, 0};
  const Tensor img = images(c, b, 0.37f), y = labels(b);
  Step s;
  std::vector<std::unique_ptr<Cache>> caches;
  const int64_t before = memory_in_use(DeviceType::CPU);
  s.logits = m.forward(img, caches, ctx);
  s.kept = memory_in_use(DeviceType::CPU) - before - static_cast<int64_t>(s.logits.nbytes());
  Tensor g = ops::cross_entropy_bwd(s.logits, y, 0.1f, 1.0f / static_cast<float>(b));
  const int64_t start = memory_in_use(DeviceType::CPU);
  reset_peak_memory(DeviceType::CPU);
  m.backward(g, caches, ctx);
  s.backward_peak = peak_memory(DeviceType::CPU) - start;
  for (Parameter* p : m.parameters()) s.grads.push_back(p->grad.clone());
  return s;
}

}  // namespace

TEST(GeluRecompute, SameGradientsLessMemory) {
  for (DType t : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(t));
    const int64_t b = 4;
    const ViTConfig on = tiny(true), off = tiny(false);
    ASSERT_TRUE(on.gelu_recomputed(false));
    ASSERT_FALSE(off.gelu_recomputed(false));
    const Step r = run(on, t, b), k = run(off, t, b);
    ASSERT_TRUE(bitwise_equal(r.logits, k.logits));
    ASSERT_EQ(r.grads.size(), k.grads.size());
    for (size_t i = 0; i < r.grads.size(); ++i) {
      const auto v = k.grads[i].to_vector();
      bool nonzero = false;
      for (float x : v) nonzero |= x != 0.0f;
      EXPECT_TRUE(nonzero) << "parameter " << i << ": a test that cannot fail";
      EXPECT_TRUE(bitwise_equal(r.grads[i], k.grads[i])) << "parameter " << i;
    }
    const int64_t rows = b * (on.num_patches() + 1), hid = on.mlp_hidden();
    const int64_t m_bytes = rows * hid * static_cast<int64_t>(dtype_size(t));
    EXPECT_EQ(k.kept - r.kept, on.depth * m_bytes);
    EXPECT_GE((k.kept + k.backward_peak) - (r.kept + r.backward_peak), (on.depth - 2) * m_bytes)
        << "kept " << r.kept << " / " << k.kept << ", backward peak " << r.backward_peak << " / "
        << k.backward_peak;
  }
}

TEST(GeluRecompute, NotWhereItDoesNotApply) {
  for (int variant = 0; variant < 3; ++variant) {
    ViTConfig on = tiny(true), off = tiny(false);
    for (ViTConfig* c : {&on, &off}) {
      if (variant == 0) c->drop_rate = 0.1f;
      if (variant == 1) c->checkpoint = true;
      if (variant == 2) c->act = "gelu_tanh";
    }
    SCOPED_TRACE(variant);
    EXPECT_FALSE(on.gelu_recomputed(false));
    const Step r = run(on, DType::F32, 3), k = run(off, DType::F32, 3);
    EXPECT_EQ(r.kept, k.kept);
    EXPECT_GT(r.kept, 0);
    for (size_t i = 0; i < r.grads.size(); ++i)
      EXPECT_TRUE(bitwise_equal(r.grads[i], k.grads[i])) << "parameter " << i;
  }
  EXPECT_FALSE(tiny(true).gelu_recomputed(true)) << "2d/2.5d/3d blocks keep the GELU's output";
}
