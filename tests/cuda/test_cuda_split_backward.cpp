// Split backward (zero-bubble B and W) on the GPU: every layer's backward_input then
// backward_weight against backward() on the GPU (the same kernels: ≤ 1e-6 relative; the fused
// passes' bias and LayerNorm sums go through partials), and against the CPU's split (fp32:
// ≤ 1e-5). Covers the GPU-only fused paths: the DGELU epilogue, the flash attention's qkv bias
// sums, the LayerNorm pass's proj bias sums and the next block's fc2 bias sums (bf16).
// Runs on a GPU host (scripts/gpu-test); without a GPU every case skips, saying why.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cai/nn/vit.h"
#include "cai/ops/ops.h"
#include "gradcheck.h"
#include "kernels/device.h"

using namespace cai;
using namespace cai::nn;
using cai::test::random_tensor;

namespace {
const Device kGpu = Device::cuda(0);

class CudaSplit : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kernels::cuda::device_count() == 0)
      GTEST_SKIP() << "no GPU: " << kernels::cuda::runtime_info().device_error;
  }
};

double rel(const Tensor& a, const Tensor& b) {
  const auto x = a.to(Device::cpu()).to_vector(), y = b.to(Device::cpu()).to_vector();
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) || std::isnan(y[i])) return INFINITY;
    num += std::pow(double(x[i]) - y[i], 2), den += std::pow(double(y[i]), 2);
  }
  return std::sqrt(num) / (std::sqrt(den) + 1e-30);
}

ViTConfig config(const std::string& act, float drop, bool checkpoint) {
  ViTConfig c;
  c.img_size = 16, c.patch_size = 4, c.in_chans = 3, c.num_classes = 7, c.embed_dim = 64;
  c.depth = 3, c.num_heads = 2, c.mlp_ratio = 4.0;  // head size 32: the flash kernel in half
  c.act = act, c.drop_rate = drop, c.drop_path_rate = drop, c.checkpoint = checkpoint;
  return c;
}

// Parameter gradients after one forward and a combined or split backward on `dev`.
std::vector<Tensor> gradients(const ViTConfig& c, DType dtype, Device dev, bool split) {
  ViT m(c);
  m.init(4);
  m.to(dev);
  m.set_compute_dtype(dtype);
  const ForwardCtx ctx{true, 3, 1, 2};
  const int64_t b = 4;
  const Tensor img = random_tensor({b, c.in_chans, c.img_size, c.img_size}, 11).to(dev);
  std::vector<int32_t> yv(b);
  for (int64_t i = 0; i < b; ++i) yv[i] = static_cast<int32_t>(i % c.num_classes);
  const Tensor y = Tensor::from_vector(yv, {b}).to(dev);
  std::vector<std::unique_ptr<Cache>> caches;
  Tensor g = ops::cross_entropy_bwd(m.forward(img, caches, ctx), y, 0.1f, 1.0f / b);
  if (split) {
    auto& L = m.layers();
    for (size_t i = L.size(); i-- > 0;) g = L[i]->backward_input(g, caches[i], ctx);
    for (Parameter* p : m.parameters())
      EXPECT_EQ(ops::sum_squares(p->grad), 0.0) << p->name << " changed in B";
    for (size_t i = L.size(); i-- > 0;) L[i]->backward_weight(caches[i]);
    for (auto& cc : caches) EXPECT_EQ(cc, nullptr);
  } else {
    m.backward(g, caches, ctx);
  }
  std::vector<Tensor> out;
  for (Parameter* p : m.parameters()) out.push_back(p->grad.to(Device::cpu()));
  return out;
}

struct Case {
  std::string act;
  float drop;
  bool checkpoint;
  DType dtype;
};

}  // namespace

TEST_F(CudaSplit, InputThenWeightIsTheCombinedBackward) {
  const std::vector<Case> cases = {{"gelu", 0.1f, false, DType::F32},
                                   {"gelu_tanh", 0.0f, false, DType::F32},
                                   {"gelu_tanh", 0.0f, false, DType::BF16},
                                   {"gelu", 0.0f, false, DType::F16},
                                   {"gelu_tanh", 0.1f, true, DType::BF16}};
  for (const Case& k : cases) {
    SCOPED_TRACE(k.act + " drop " + std::to_string(k.drop) + (k.checkpoint ? " checkpoint " : " ") +
                 dtype_name(k.dtype));
    const ViTConfig c = config(k.act, k.drop, k.checkpoint);
    const auto whole = gradients(c, k.dtype, kGpu, false);
    const auto split = gradients(c, k.dtype, kGpu, true);
    ASSERT_EQ(whole.size(), split.size());
    for (size_t i = 0; i < whole.size(); ++i) {
      EXPECT_GT(ops::sum_squares(whole[i]), 0.0) << i;
      EXPECT_LE(rel(split[i], whole[i]), 1e-6) << i;
    }
    if (k.dtype == DType::F32) {
      const auto cpu = gradients(c, k.dtype, Device::cpu(), true);
      for (size_t i = 0; i < cpu.size(); ++i) EXPECT_LE(rel(split[i], cpu[i]), 1e-5) << i;
    }
  }
}

TEST_F(CudaSplit, LinearWeightGradientAloneIsLinearBackwards) {
  for (DType t : {DType::F32, DType::BF16}) {
    const Tensor x = random_tensor({6, 5, 24}, 1).to(kGpu).to(t);
    const Tensor w = random_tensor({16, 24}, 2).to(kGpu);
    const Tensor dy = random_tensor({6, 5, 16}, 3).to(kGpu);
    Tensor dw1 = Tensor::zeros({16, 24}, DType::F32, kGpu),
           db1 = Tensor::zeros({16}, DType::F32, kGpu);
    Tensor dw2 = Tensor::zeros({16, 24}, DType::F32, kGpu),
           db2 = Tensor::zeros({16}, DType::F32, kGpu);
    ops::linear_bwd(x, w, dy, &dw1, &db1);
    ops::linear_bwd_weight(x, dy, &dw2, &db2);
    EXPECT_EQ(rel(dw2, dw1), 0.0) << dtype_name(t);
    EXPECT_EQ(rel(db2, db1), 0.0) << dtype_name(t);
    EXPECT_GT(ops::sum_squares(dw1), 0.0);
  }
}
