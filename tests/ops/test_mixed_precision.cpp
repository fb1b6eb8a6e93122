// Mixed precision on the CPU reference path: the dtype contract of every op (what comes out in
// which dtype), half results against full fp32 within half-precision error, the ViT in bf16 and
// fp16 against fp32, and the trainer's fp16 loss scaler (overflowing steps are skipped and leave
// the parameters untouched; the scale backs off after `hysteresis` overflows).
#include <gtest/gtest.h>

#include <cmath>

#include "cai/core/error.h"
#include "cai/data/data.h"
#include "cai/nn/vit.h"
#include "cai/ops/ops.h"
#include "cai/optim/optimizer.h"
#include "cai/train/trainer.h"
#include "gradcheck.h"

using namespace cai;
using cai::test::random_tensor;

namespace {
// Norm-wise relative error ‖a − b‖ / ‖b‖ of two tensors of any float dtypes.
double rel(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector(), y = b.to_vector();
  EXPECT_EQ(x.size(), y.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += std::pow(double(x[i]) - y[i], 2);
    den += std::pow(double(y[i]), 2);
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}
}  // namespace

TEST(MixedPrecision, TensorConversionRoundsToNearestEven) {
  // 1 + 2^-8 is halfway between two bf16 values: ties go to the even mantissa (1.0).
  Tensor t = Tensor::from_vector(
      std::vector<float>{1.0f + 1.0f / 256, 1.0f + 3.0f / 256, -2.5f, 65504.0f}, {4});
  const auto b = t.to(DType::BF16).to_vector();
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[1], 1.0f + 4.0f / 256);
  EXPECT_EQ(b[2], -2.5f);
  const auto h = t.to(DType::F16).to_vector();
  EXPECT_EQ(h[3], 65504.0f);  // the largest fp16
  EXPECT_EQ(t.to(DType::BF16).to(DType::F32).dtype(), DType::F32);
}

TEST(MixedPrecision, OpsKeepTheDtypeContract) {
  for (DType t : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(t));
    Tensor x = random_tensor({6, 8}, 1).to(t), w = random_tensor({4, 8}, 2),
           b = random_tensor({4}, 3);
    EXPECT_EQ(ops::linear_fwd(x, w, &b).dtype(), t);
    EXPECT_EQ(ops::linear_fwd(x, w, &b, DType::F32).dtype(), DType::F32);
    Tensor dw = Tensor::zeros({4, 8}), db = Tensor::zeros({4});
    Tensor dx = ops::linear_bwd(x, w, random_tensor({6, 4}, 4), &dw, &db);  // fp32 dy is cast
    EXPECT_EQ(dx.dtype(), t);
    EXPECT_EQ(dw.dtype(), DType::F32);

    Tensor xf = random_tensor({6, 8}, 5), g = Tensor::full({8}, 1.0f), be = Tensor::zeros({8});
    Tensor mean, rstd;
    Tensor y = ops::layernorm_fwd(xf, g, be, 1e-6f, &mean, &rstd, t);
    EXPECT_EQ(y.dtype(), t);
    EXPECT_EQ(mean.dtype(), DType::F32);
    EXPECT_EQ(ops::layernorm_bwd(xf, g, mean, rstd, y, nullptr, nullptr).dtype(), DType::F32);

    EXPECT_EQ(ops::add(xf, x).dtype(), DType::F32);  // the residual stream stays fp32
    EXPECT_EQ(ops::add(x, x).dtype(), t);
    EXPECT_EQ(ops::gelu_fwd(x).dtype(), t);
    EXPECT_EQ(ops::dropout_fwd(x, 0.5f, {1, 2, 3}).dtype(), t);

    Tensor qkv = random_tensor({2, 3, 12}, 6).to(t), probs;
    EXPECT_EQ(ops::attention_fwd(qkv, 2, &probs).dtype(), t);
    EXPECT_EQ(probs.dtype(), t);

    Tensor img = random_tensor({2, 1, 4, 4}, 7), pw = random_tensor({8, 1, 2, 2}, 8),
           pb = random_tensor({8}, 9), patches;
    Tensor tok = ops::patch_embed_fwd(img, pw, pb, &patches, t);
    EXPECT_EQ(tok.dtype(), t);
    EXPECT_EQ(patches.dtype(), t);
    Tensor cls = random_tensor({1, 1, 8}, 10), pos = random_tensor({1, 5, 8}, 11);
    Tensor out = ops::cls_pos_fwd(tok, cls, pos);
    EXPECT_EQ(out.dtype(), DType::F32);
    Tensor dcls = Tensor::zeros({1, 1, 8}), dpos = Tensor::zeros({1, 5, 8});
    EXPECT_EQ(ops::cls_pos_bwd(out, &dcls, &dpos, t).dtype(), t);

    Tensor logits = random_tensor({3, 5}, 12).to(t);
    Tensor labels = Tensor::from_vector(std::vector<int32_t>{0, 4, 2}, {3});
    EXPECT_EQ(ops::cross_entropy_fwd(logits, labels, 0.1f).dtype(), DType::F32);
  }
}

TEST(MixedPrecision, BadDtypesAreErrorsThatNameThem) {
  Tensor xi = Tensor::from_vector(std::vector<int32_t>{1, 2}, {1, 2});
  Tensor w = random_tensor({3, 2}, 1);
  try {
    ops::linear_fwd(xi, w, nullptr);
    FAIL() << "int32 input accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("int32"), std::string::npos) << e.what();
  }
  Tensor xb = random_tensor({1, 2}, 2).to(DType::BF16);
  try {
    ops::linear_fwd(xb, w, nullptr, DType::F16);
    FAIL() << "fp16 output of a bf16 GEMM accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("output dtype fp16"), std::string::npos) << e.what();
  }
  Tensor g = xb;
  EXPECT_THROW(ops::scale_(g, 2.0f), Error);  // fp32 only
}

// linear_fwd_residual on the CPU: the fp32 product of the rounded operands plus b and r (the
// reference its GPU epilogue is tested against), fp32 out for any input dtype; a residual that is
// not fp32 of the output's shape is an error that names it.
TEST(MixedPrecision, LinearWithResidualIsLinearThenAdd) {
  Tensor w = random_tensor({3, 4}, 1), b = random_tensor({3}, 2), r = random_tensor({5, 3}, 3);
  for (DType t : {DType::F32, DType::BF16}) {
    Tensor x = random_tensor({5, 4}, 4).to(t);
    Tensor y = ops::linear_fwd_residual(x, w, &b, r);
    ASSERT_EQ(y.dtype(), DType::F32);
    const auto got = y.to_vector(),
               ref = ops::add(r, ops::linear_fwd(x, w, &b, DType::F32)).to_vector();
    EXPECT_EQ(got, ref) << dtype_name(t);
  }
  Tensor x = random_tensor({5, 4}, 4);
  for (const Tensor& bad : {random_tensor({5, 4}, 5), r.to(DType::BF16)}) {
    try {
      ops::linear_fwd_residual(x, w, &b, bad);
      FAIL() << "residual " << bad.str() << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("residual " + bad.str()), std::string::npos) << e.what();
    }
  }
}

// The LayerNorm backward's column sums are the bias gradient the next linear's backward computes
// from the tensor it takes (the half copy, or dx in fp32), bit for bit, added or written; a sum
// tensor of the wrong size is an error that names it.
TEST(MixedPrecision, LayerNormBackwardColumnSumsAreTheNextBiasGradient) {
  const Tensor x = random_tensor({7, 8}, 1), g = random_tensor({8}, 2), b = random_tensor({8}, 3);
  const Tensor dy = random_tensor({7, 8}, 4), res = random_tensor({7, 8}, 5);
  const Tensor w = random_tensor({8, 6}, 6), start = random_tensor({8}, 7);
  Tensor mean, rstd;
  ops::layernorm_fwd(x, g, b, 1e-6f, &mean, &rstd);
  for (DType t : {DType::F32, DType::BF16})
    for (bool add : {true, false}) {
      Tensor half, sum = add ? start.clone() : random_tensor({8}, 8);
      Tensor dx = ops::layernorm_bwd_add(x, g, mean, rstd, dy, res, nullptr, nullptr, t,
                                         t == DType::F32 ? nullptr : &half, &sum, add);
      Tensor taken = t == DType::F32 ? dx : half, db = add ? start.clone() : Tensor::zeros({8});
      ops::linear_bwd(random_tensor({7, 6}, 9).to(t), w, taken, nullptr, &db, false);
      EXPECT_EQ(sum.to_vector(), db.to_vector()) << dtype_name(t) << (add ? " added" : " written");
    }
  Tensor bad = Tensor::zeros({7});
  try {
    ops::layernorm_bwd_add(x, g, mean, rstd, dy, res, nullptr, nullptr, DType::F32, nullptr, &bad);
    FAIL() << "column sums " << bad.str() << " accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad.str()), std::string::npos) << e.what();
  }
}

TEST(MixedPrecision, HalfOpsStayWithinHalfPrecisionOfFp32) {
  // The unrounded fp32 computation against the half path: the error is the rounding of the
  // operands and the result, about 2^-8 for bf16 and 2^-11 for fp16 relative.
  const Tensor x = random_tensor({64, 96}, 1), w = random_tensor({48, 96}, 2, 0.1f),
               b = random_tensor({48}, 3);
  const Tensor ref = ops::linear_fwd(x, w, &b);
  const double ebf = rel(ops::linear_fwd(x.to(DType::BF16), w, &b), ref);
  const double eh = rel(ops::linear_fwd(x.to(DType::F16), w, &b), ref);
  std::printf("linear: bf16 %.2e, fp16 %.2e relative to fp32\n", ebf, eh);
  EXPECT_LT(ebf, 1e-2);
  EXPECT_GT(ebf, 1e-5);  // it really ran in half precision
  EXPECT_LT(eh, 2e-3);

  const Tensor qkv = random_tensor({2, 17, 48}, 4);
  Tensor p32, pbf;
  const Tensor a32 = ops::attention_fwd(qkv, 4, &p32);
  const Tensor abf = ops::attention_fwd(qkv.to(DType::BF16), 4, &pbf);
  const double ea = rel(abf, a32);
  std::printf("attention: bf16 %.2e\n", ea);
  EXPECT_LT(ea, 1e-2);
  EXPECT_LT(rel(ops::attention_bwd(qkv.to(DType::BF16), abf, pbf, a32, 4),
                ops::attention_bwd(qkv, a32, p32, a32, 4)),
            2e-2);
}

namespace {
nn::ViTConfig tiny() {
  nn::ViTConfig c;
  c.img_size = 16, c.patch_size = 4, c.in_chans = 3, c.num_classes = 10, c.embed_dim = 32;
  c.depth = 2, c.num_heads = 4, c.mlp_ratio = 4.0;
  c.drop_rate = 0.1f, c.drop_path_rate = 0.1f;
  return c;
}

struct StepResult {
  Tensor logits;
  std::vector<Tensor> grads;
};

StepResult step(DType compute) {
  nn::ViT m(tiny());
  m.init(7);
  m.set_compute_dtype(compute);
  const Tensor img = random_tensor({4, 3, 16, 16}, 21);
  const Tensor labels = Tensor::from_vector(std::vector<int32_t>{1, 3, 5, 7}, {4});
  nn::ForwardCtx ctx{true, 5, 2, 0};
  std::vector<std::unique_ptr<nn::Cache>> caches;
  StepResult r;
  r.logits = m.forward(img, caches, ctx);
  m.backward(ops::cross_entropy_bwd(r.logits, labels, 0.1f, 0.25f), caches, ctx);
  for (nn::Parameter* p : m.parameters()) r.grads.push_back(p->grad.clone());
  return r;
}
}  // namespace

TEST(MixedPrecision, ViTInHalfPrecisionTracksFp32) {
  const StepResult ref = step(DType::F32);
  for (auto [t, logit_tol, grad_tol] :
       {std::tuple{DType::BF16, 2e-2, 6e-2}, std::tuple{DType::F16, 3e-3, 1e-2}}) {
    const StepResult r = step(t);
    EXPECT_EQ(r.logits.dtype(), DType::F32);  // the loss is computed in fp32
    const double el = rel(r.logits, ref.logits);
    double worst = 0;
    for (size_t i = 0; i < ref.grads.size(); ++i) {
      EXPECT_EQ(r.grads[i].dtype(), DType::F32);
      worst = std::max(worst, rel(r.grads[i], ref.grads[i]));
    }
    std::printf("%s: logits %.2e, worst gradient %.2e relative to fp32\n", dtype_name(t), el,
                worst);
    EXPECT_LT(el, logit_tol) << dtype_name(t);
    EXPECT_LT(worst, grad_tol) << dtype_name(t);
    EXPECT_GT(el, 0.0) << dtype_name(t);  // the compute dtype was honoured
  }
}

namespace {
// A synthetic dataset of random 16×16 RGB images with random labels.
class Noise : public data::Dataset {
 public:
  int64_t size() const override { return 64; }
  int64_t channels() const override { return 3; }
  int64_t height() const override { return 16; }
  int64_t width() const override { return 16; }
  int64_t num_classes() const override { return 10; }
  int32_t get(int64_t i, float* out) const override {
    const Tensor t = random_tensor({3 * 16 * 16}, 100 + static_cast<uint64_t>(i));
    const auto v = t.to_vector();
    std::copy(v.begin(), v.end(), out);
    return static_cast<int32_t>(i % 10);
  }
  std::string describe() const override { return "noise"; }
};
}  // namespace

TEST(MixedPrecision, Fp16LossScalerSkipsOverflowingStepsAndBacksOff) {
  data::LoaderConfig lc;
  lc.batch_size = 8;
  lc.num_workers = 0;
  data::DataLoader loader(std::make_shared<Noise>(), lc);
  nn::ViT model(tiny());
  model.init(3);
  optim::AdamW opt(optim::weight_decay_groups(model.parameters(), 1e-3, 0.05));
  train::TrainerConfig tc;
  tc.num_epochs = 1;
  tc.max_steps_per_epoch = 3;
  tc.precision = DType::F16;
  // 2^100 times the loss overflows fp16 gradients on every step: step 1 is skipped with the
  // scale kept (hysteresis 2), step 2 is skipped and backs the scale off.
  tc.grad_scaler.initial_scale = std::ldexp(1.0, 100);
  tc.grad_scaler.max_scale = std::ldexp(1.0, 120);
  train::Booster booster;
  auto trainer = booster.boost(model, opt, train::Criterion{}, loader, nullptr, nullptr, false, tc);
  ASSERT_NE(trainer->grad_scaler(), nullptr);
  EXPECT_EQ(model.compute_dtype(), DType::F16);
  std::vector<std::vector<float>> before;
  for (nn::Parameter* p : model.parameters()) before.push_back(p->value.to_vector());
  std::vector<train::StepInfo> infos;
  struct Record : train::Hook {
    std::vector<train::StepInfo>* out;
    void after_step(train::Trainer&, const train::StepInfo& i) override { out->push_back(i); }
  };
  auto rec = std::make_shared<Record>();
  rec->out = &infos;
  trainer->add_hook(rec);
  trainer->fit();
  ASSERT_EQ(infos.size(), 3u);
  EXPECT_TRUE(infos[0].skipped);
  EXPECT_TRUE(infos[1].skipped);
  EXPECT_EQ(infos[0].loss_scale, std::ldexp(1.0, 100));
  EXPECT_EQ(infos[1].loss_scale, std::ldexp(1.0, 100));
  EXPECT_EQ(infos[2].loss_scale, std::ldexp(1.0, 99));  // backed off by 0.5 after 2 overflows
  EXPECT_TRUE(infos[2].skipped);                        // 2^99 still overflows
  EXPECT_EQ(trainer->skipped_steps(), 3);
  EXPECT_EQ(opt.steps(), 0);
  size_t i = 0;
  for (nn::Parameter* p : model.parameters())
    EXPECT_EQ(p->value.to_vector(), before[i++]) << p->name;

  // With a sane scale the same run steps the optimizer and the loss is finite.
  nn::ViT model2(tiny());
  model2.init(3);
  optim::AdamW opt2(optim::weight_decay_groups(model2.parameters(), 1e-3, 0.05));
  tc.grad_scaler = optim::GradScalerConfig{};  // Colossal-AI's defaults: 2^16
  loader.start_epoch(0);
  auto trainer2 =
      booster.boost(model2, opt2, train::Criterion{}, loader, nullptr, nullptr, false, tc);
  trainer2->fit();
  EXPECT_EQ(trainer2->skipped_steps(), 0);
  EXPECT_EQ(opt2.steps(), 3);
  EXPECT_EQ(trainer2->grad_scaler()->scale(), 65536.0);
}
