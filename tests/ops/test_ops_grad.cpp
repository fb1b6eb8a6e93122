// Every op's backward against central finite differences, including odd shapes
// (1 token, 1 head, batch 1, 1 feature).
#include <gtest/gtest.h>

#include <cmath>

#include "cai/core/error.h"
#include "cai/ops/ops.h"
#include "gradcheck.h"
#include "kernels/base/philox.h"

using namespace cai;
using cai::test::dot;
using cai::test::gradcheck;
using cai::test::random_tensor;

namespace {
constexpr double kOk = 1.0;  // gradcheck ratio bound (1 = within atol + rtol·|g|)
}

class LinearGrad : public ::testing::TestWithParam<std::tuple<int, int, int>> {};
TEST_P(LinearGrad, MatchesFiniteDifferences) {
  const auto [m, k, n] = GetParam();
  Tensor x = random_tensor({m, k}, 1), w = random_tensor({n, k}, 2), b = random_tensor({n}, 3);
  Tensor r = random_tensor({m, n}, 4);
  Tensor dw = Tensor::zeros({n, k}), db = Tensor::zeros({n});
  Tensor dx = ops::linear_bwd(x, w, r, &dw, &db);
  auto L = [&] { return dot(r, ops::linear_fwd(x, w, &b)); };
  EXPECT_LE(gradcheck(L, x, dx), kOk);
  EXPECT_LE(gradcheck(L, w, dw), kOk);
  EXPECT_LE(gradcheck(L, b, db), kOk);
}
INSTANTIATE_TEST_SUITE_P(Shapes, LinearGrad,
                         ::testing::Values(std::make_tuple(5, 7, 3), std::make_tuple(1, 1, 1),
                                           std::make_tuple(3, 16, 9)));

TEST(LinearGrad, AccumulatesIntoParameterGrads) {
  Tensor x = random_tensor({4, 3}, 1), w = random_tensor({2, 3}, 2), r = random_tensor({4, 2}, 3);
  Tensor dw = Tensor::zeros({2, 3});
  ops::linear_bwd(x, w, r, &dw, nullptr, false);
  const auto once = dw.to_vector();
  ops::linear_bwd(x, w, r, &dw, nullptr, false);
  const auto twice = dw.to_vector();
  for (size_t i = 0; i < once.size(); ++i) EXPECT_NEAR(twice[i], 2 * once[i], 1e-5);
}

TEST(LinearGrad, ShapeErrorsNameTheSizes) {
  Tensor x = Tensor::zeros({2, 384}), w = Tensor::zeros({10, 768});
  try {
    ops::linear_fwd(x, w, nullptr);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "[linear] input has 384 features, weight expects 768");
  }
}

class LayerNormGrad : public ::testing::TestWithParam<std::pair<int, int>> {};
TEST_P(LayerNormGrad, MatchesFiniteDifferences) {
  const auto [m, d] = GetParam();
  Tensor x = random_tensor({m, d}, 1), g = random_tensor({d}, 2), b = random_tensor({d}, 3);
  Tensor r = random_tensor({m, d}, 4), mean, rstd;
  ops::layernorm_fwd(x, g, b, 1e-5f, &mean, &rstd);
  Tensor dg = Tensor::zeros({d}), db = Tensor::zeros({d});
  Tensor dx = ops::layernorm_bwd(x, g, mean, rstd, r, &dg, &db);
  auto L = [&] {
    Tensor mu, rs;
    return dot(r, ops::layernorm_fwd(x, g, b, 1e-5f, &mu, &rs));
  };
  EXPECT_LE(gradcheck(L, x, dx, 5e-3f), kOk);
  EXPECT_LE(gradcheck(L, g, dg), kOk);
  EXPECT_LE(gradcheck(L, b, db), kOk);
}
INSTANTIATE_TEST_SUITE_P(Shapes, LayerNormGrad,
                         ::testing::Values(std::make_pair(4, 9), std::make_pair(1, 2),
                                           std::make_pair(3, 64), std::make_pair(1, 1)));

TEST(GeluGrad, MatchesFiniteDifferencesAndReference) {
  Tensor x = random_tensor({3, 11}, 1, 2.0f), r = random_tensor({3, 11}, 2);
  Tensor dx = ops::gelu_bwd(x, r);
  EXPECT_LE(gradcheck([&] { return dot(r, ops::gelu_fwd(x)); }, x, dx, 1e-2f), kOk);
  Tensor y = ops::gelu_fwd(Tensor::from_vector(std::vector<float>{-1.0f, 0.0f, 2.0f}, {3}));
  const auto v = y.to_vector();
  EXPECT_NEAR(v[0], -0.15865525f, 1e-6);  // x·Φ(x) from tables
  EXPECT_EQ(v[1], 0.0f);
  EXPECT_NEAR(v[2], 1.95449974f, 1e-6);
}

TEST(GeluGrad, TanhApproximationMatchesFiniteDifferencesAndPyTorch) {
  Tensor x = random_tensor({3, 11}, 1, 2.0f), r = random_tensor({3, 11}, 2);
  Tensor dx = ops::gelu_bwd(x, r, ops::Gelu::Tanh);
  EXPECT_LE(gradcheck([&] { return dot(r, ops::gelu_fwd(x, ops::Gelu::Tanh)); }, x, dx, 1e-2f),
            kOk);
  const auto v = ops::gelu_fwd(Tensor::from_vector(std::vector<float>{-1.0f, 0.0f, 2.0f}, {3}),
                               ops::Gelu::Tanh)
                     .to_vector();
  // torch.nn.functional.gelu(torch.tensor([-1., 0., 2.]), approximate="tanh")
  EXPECT_NEAR(v[0], -0.15880801f, 1e-6);
  EXPECT_EQ(v[1], 0.0f);
  EXPECT_NEAR(v[2], 1.95459769f, 1e-6);
  // It differs from the exact GELU (so the option is really honoured).
  EXPECT_GT(std::abs(v[0] - (-0.15865525f)), 1e-4);
}

TEST(LinearGelu, FusedOpsEqualTheComposition) {
  Tensor x = random_tensor({5, 7}, 1), w = random_tensor({6, 7}, 2), b = random_tensor({6}, 3);
  Tensor pre;
  Tensor y = ops::linear_gelu_fwd(x, w, b, &pre);
  Tensor pre2 = ops::linear_fwd(x, w, &b);
  EXPECT_EQ(pre.to_vector(), pre2.to_vector());
  EXPECT_EQ(y.to_vector(), ops::gelu_fwd(pre2, ops::Gelu::Tanh).to_vector());
  // The next linear's backward through the GELU.
  Tensor w2 = random_tensor({4, 6}, 4), dy = random_tensor({5, 4}, 5);
  Tensor dw = Tensor::zeros({4, 6}), db = Tensor::zeros({4});
  Tensor dw2 = Tensor::zeros({4, 6}), db2 = Tensor::zeros({4});
  Tensor dpre = ops::linear_dgelu_bwd(y, w2, dy, pre, &dw, &db);
  Tensor dpre2 = ops::gelu_bwd(pre, ops::linear_bwd(y, w2, dy, &dw2, &db2), ops::Gelu::Tanh);
  EXPECT_EQ(dpre.to_vector(), dpre2.to_vector());
  EXPECT_EQ(dw.to_vector(), dw2.to_vector());
  EXPECT_EQ(db.to_vector(), db2.to_vector());
}

struct AttnShape {
  int b, n, h, hd;
};
class AttentionGrad : public ::testing::TestWithParam<AttnShape> {};
TEST_P(AttentionGrad, MatchesFiniteDifferences) {
  const auto s = GetParam();
  const int d = s.h * s.hd;
  Tensor qkv = random_tensor({s.b, s.n, 3 * d}, 1), r = random_tensor({s.b, s.n, d}, 2), probs;
  Tensor out = ops::attention_fwd(qkv, s.h, &probs);
  Tensor dqkv = ops::attention_bwd(qkv, out, probs, r, s.h);
  auto L = [&] {
    Tensor p;
    return dot(r, ops::attention_fwd(qkv, s.h, &p));
  };
  EXPECT_LE(gradcheck(L, qkv, dqkv, 1e-2f, 2e-2, 2e-3, 200), kOk);
}
INSTANTIATE_TEST_SUITE_P(Shapes, AttentionGrad,
                         ::testing::Values(AttnShape{2, 5, 2, 3}, AttnShape{1, 1, 1, 4},
                                           AttnShape{1, 3, 1, 1}, AttnShape{2, 4, 4, 2}));

// What the fused GPU backward gives as qkv's bias gradient instead of dqkv's column sums (the
// GPU's own test checks the kernel; this checks the identities on the CPU's fp32 attention):
// Σ_rows dK = 0 (the softmax ignores a shift of a whole score row) and Σ_rows dV = Σ_rows dout
// (the softmax's rows sum to 1), per column. The unfused paths do not take dbias.
TEST(AttentionBiasGradient, KeysSumToZeroAndValuesToTheOutputGradient) {
  const int b = 2, n = 7, h = 3, hd = 4, d = h * hd;
  Tensor qkv = random_tensor({b, n, 3 * d}, 11, 2.0f), dout = random_tensor({b, n, d}, 12), probs;
  Tensor out = ops::attention_fwd(qkv, h, &probs);
  const auto g = ops::attention_bwd(qkv, out, probs, dout, h).to_vector();
  const auto o = dout.to_vector();
  for (int j = 0; j < d; ++j) {
    double k = 0, k_abs = 0, v = 0, ov = 0;
    for (int r = 0; r < b * n; ++r) {
      k += g[r * 3 * d + d + j], k_abs += std::abs(g[r * 3 * d + d + j]);
      v += g[r * 3 * d + 2 * d + j], ov += o[r * d + j];
    }
    EXPECT_GT(k_abs, 1e-3) << "column " << j << ": dK is all zeros, the check cannot fail";
    EXPECT_LE(std::abs(k), 1e-5 * k_abs) << "column " << j;
    EXPECT_NEAR(v, ov, 1e-5 * (std::abs(ov) + 1)) << "column " << j;
  }
  EXPECT_FALSE(ops::attention_bwd_sums_bias(probs));
  Tensor db = Tensor::zeros({3 * d});
  EXPECT_THROW(ops::attention_bwd(qkv, out, probs, dout, h, &db), Error);
}

TEST(Attention, SingleTokenIsIdentityOnValues) {
  // With one token softmax is 1: the output is v.
  Tensor qkv = random_tensor({1, 1, 6}, 3), probs;
  const auto out = ops::attention_fwd(qkv, 2, &probs).to_vector();
  const auto in = qkv.to_vector();
  for (int i = 0; i < 2; ++i) EXPECT_FLOAT_EQ(out[i], in[4 + i]);
  EXPECT_THROW(ops::attention_fwd(random_tensor({1, 2, 9}, 1), 2, &probs), Error);
}

TEST(DropoutGrad, MaskIsDeterministicAndScaled) {
  const float p = 0.3f;
  const ops::RngKey key{11, 22, 100};
  Tensor x = random_tensor({4, 50}, 1), r = random_tensor({4, 50}, 2);
  Tensor y = ops::dropout_fwd(x, p, key);
  const auto xv = x.to_vector(), yv = y.to_vector();
  int dropped = 0;
  for (size_t i = 0; i < xv.size(); ++i) {
    const bool keep = philox::uniform(11, 22, 100 + i) >= p;
    EXPECT_FLOAT_EQ(yv[i], keep ? xv[i] / (1 - p) : 0.0f);
    dropped += !keep;
  }
  EXPECT_GT(dropped, 30);
  EXPECT_LT(dropped, 90);
  Tensor dx = ops::dropout_bwd(r, p, key);
  EXPECT_LE(gradcheck([&] { return dot(r, ops::dropout_fwd(x, p, key)); }, x, dx), kOk);
  // The second half of a batch drawn at its offset equals the second half of the whole.
  Tensor half = ops::dropout_fwd(x.narrow(2, 2), p, {11, 22, 100 + 100});
  const auto hv = half.to_vector();
  for (size_t i = 0; i < hv.size(); ++i) EXPECT_EQ(hv[i], yv[100 + i]);
  EXPECT_THROW(ops::dropout_fwd(x, 1.0f, key), Error);
}

TEST(DropPathGrad, DropsWholeSamples) {
  const float p = 0.5f;
  const ops::RngKey key{3, 4, 0};
  Tensor x = random_tensor({16, 2, 3}, 1), r = random_tensor({16, 2, 3}, 2);
  const auto yv = ops::drop_path_fwd(x, p, key).to_vector(), xv = x.to_vector();
  int dropped = 0;
  for (int s = 0; s < 16; ++s) {
    const bool keep = philox::uniform(3, 4, s) >= p;
    dropped += !keep;
    for (int j = 0; j < 6; ++j) EXPECT_FLOAT_EQ(yv[s * 6 + j], keep ? 2 * xv[s * 6 + j] : 0.0f);
  }
  EXPECT_GT(dropped, 0);
  EXPECT_LT(dropped, 16);
  Tensor dx = ops::drop_path_bwd(r, p, key);
  EXPECT_LE(gradcheck([&] { return dot(r, ops::drop_path_fwd(x, p, key)); }, x, dx), kOk);
}

TEST(PatchEmbedGrad, MatchesConvolutionAndFiniteDifferences) {
  // img [2, 3, 4, 6], patch 2 -> 2·3 = 6 patches, dim 5.
  const int B = 2, C = 3, H = 4, W = 6, p = 2, D = 5;
  Tensor img = random_tensor({B, C, H, W}, 1), w = random_tensor({D, C, p, p}, 2),
         b = random_tensor({D}, 3), patches;
  Tensor y = ops::patch_embed_fwd(img, w, b, &patches);
  ASSERT_EQ(y.shape(), (Shape{B, 6, D}));
  // Direct convolution reference.
  const auto iv = img.to_vector(), wv = w.to_vector(), bv = b.to_vector(), yv = y.to_vector();
  for (int bi = 0; bi < B; ++bi)
    for (int py = 0; py < H / p; ++py)
      for (int px = 0; px < W / p; ++px)
        for (int o = 0; o < D; ++o) {
          double s = bv[o];
          for (int c = 0; c < C; ++c)
            for (int ky = 0; ky < p; ++ky)
              for (int kx = 0; kx < p; ++kx)
                s += double(iv[((bi * C + c) * H + py * p + ky) * W + px * p + kx]) *
                     wv[((o * C + c) * p + ky) * p + kx];
          EXPECT_NEAR(yv[((bi * (H / p) + py) * (W / p) + px) * D + o], s, 1e-4);
        }
  Tensor r = random_tensor(y.shape(), 4), dw = Tensor::zeros(w.shape()), db = Tensor::zeros({D});
  ops::patch_embed_bwd(patches, w, r, &dw, &db);
  auto L = [&] {
    Tensor pt;
    return dot(r, ops::patch_embed_fwd(img, w, b, &pt));
  };
  EXPECT_LE(gradcheck(L, w, dw), kOk);
  EXPECT_LE(gradcheck(L, b, db), kOk);
  EXPECT_THROW(ops::patch_embed_fwd(random_tensor({1, 3, 5, 4}, 1), w, b, &patches), Error);
}

TEST(ClsPosGrad, MatchesFiniteDifferences) {
  for (int np : {1, 4}) {
    Tensor t = random_tensor({2, np, 3}, 1), cls = random_tensor({1, 1, 3}, 2),
           pos = random_tensor({1, np + 1, 3}, 3), r = random_tensor({2, np + 1, 3}, 4);
    Tensor dcls = Tensor::zeros(cls.shape()), dpos = Tensor::zeros(pos.shape());
    Tensor dt = ops::cls_pos_bwd(r, &dcls, &dpos);
    auto L = [&] { return dot(r, ops::cls_pos_fwd(t, cls, pos)); };
    EXPECT_LE(gradcheck(L, t, dt), kOk);
    EXPECT_LE(gradcheck(L, cls, dcls), kOk);
    EXPECT_LE(gradcheck(L, pos, dpos), kOk);
  }
}

TEST(SelectTokenGrad, MatchesFiniteDifferences) {
  Tensor x = random_tensor({3, 4, 5}, 1), r = random_tensor({3, 5}, 2);
  Tensor dx = ops::select_token_bwd(r, 4, 2);
  EXPECT_LE(gradcheck([&] { return dot(r, ops::select_token_fwd(x, 2)); }, x, dx), kOk);
}

TEST(CrossEntropyGrad, MatchesFormulaAndFiniteDifferences) {
  for (float eps : {0.0f, 0.1f}) {
    for (auto [b, k] : {std::pair{4, 10}, std::pair{1, 3}}) {
      Tensor logits = random_tensor({b, k}, 1, 2.0f);
      std::vector<int32_t> lab(b);
      for (int i = 0; i < b; ++i) lab[i] = (3 * i + 1) % k;
      Tensor labels = Tensor::from_vector(lab, {b});
      const auto losses = ops::cross_entropy_fwd(logits, labels, eps).to_vector();
      const auto lv = logits.to_vector();
      for (int i = 0; i < b; ++i) {
        double mx = -1e30, s = 0, mean = 0;
        for (int j = 0; j < k; ++j) mx = std::max<double>(mx, lv[i * k + j]);
        for (int j = 0; j < k; ++j) s += std::exp(lv[i * k + j] - mx), mean += lv[i * k + j];
        const double lse = mx + std::log(s);
        const double want = (1 - eps) * (lse - lv[i * k + lab[i]]) + eps * (lse - mean / k);
        EXPECT_NEAR(losses[i], want, 1e-5);
      }
      Tensor d = ops::cross_entropy_bwd(logits, labels, eps, 1.0f / b);
      auto L = [&] {
        double s = 0;
        for (float l : ops::cross_entropy_fwd(logits, labels, eps).to_vector()) s += l;
        return s / b;
      };
      EXPECT_LE(gradcheck(L, logits, d), kOk);
    }
  }
  Tensor bad = Tensor::from_vector(std::vector<int32_t>{10}, {1});
  try {
    ops::cross_entropy_fwd(random_tensor({1, 10}, 1), bad, 0.0f);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label 10"), std::string::npos) << e.what();
  }
}
