// Parity with timm: scripts/golden/make_vit_golden.py builds a timm VisionTransformer, fixes its
// weights and a batch, and dumps logits, loss and every gradient (tests/data/vit_golden.bin).
#include <gtest/gtest.h>

#include <cstdio>
#include <set>

#include "cai/nn/vit.h"
#include "cai/ops/ops.h"
#include "golden.h"

using namespace cai;
using namespace cai::nn;

TEST(Golden, ForwardAndBackwardMatchTimm) {
  auto g = test::load_golden(test::data_path("vit_golden.bin"));
  const ViTConfig c = test::vit_config(g);
  const float smoothing = g.at("config.label_smoothing").item();
  ViT m(c);

  // Every timm parameter exists here with the same shape, and nothing else does.
  std::set<std::string> ours;
  for (Parameter* p : m.parameters()) ours.insert(p->name);
  size_t n_timm = 0;
  for (auto& [name, t] : g) {
    if (name.rfind("param.", 0) != 0) continue;
    ++n_timm;
    const std::string pn = name.substr(6);
    ASSERT_TRUE(ours.count(pn)) << "timm parameter " << pn << " missing";
    Parameter& p = m.parameter(pn);
    ASSERT_EQ(p.value.shape(), t.shape()) << pn;
    p.value.copy_from(t);
  }
  EXPECT_EQ(n_timm, ours.size());

  const Tensor& images = g.at("input.images");
  const Tensor& labels = g.at("input.labels");
  std::vector<std::unique_ptr<Cache>> caches;
  ForwardCtx ctx{true, 0, 0, 0};
  Tensor logits = m.forward(images, caches, ctx);
  EXPECT_LE(test::rel_error(logits, g.at("output.logits")), 1e-5);
  const int64_t B = images.size(0);
  double loss = 0;
  for (float l : ops::cross_entropy_fwd(logits, labels, smoothing).to_vector()) loss += l / B;
  const double want = g.at("output.loss").item();
  EXPECT_LE(std::abs(loss - want), 1e-5 * std::abs(want));

  std::printf("logits rel error %.3g, loss %.9g vs timm %.9g\n",
              test::rel_error(logits, g.at("output.logits")), loss, want);
  m.zero_grad();
  m.backward(ops::cross_entropy_bwd(logits, labels, smoothing, 1.0f / B), caches, ctx);
  double worst = 0;
  for (Parameter* p : m.parameters()) {
    const Tensor& ref = g.at("grad." + p->name);
    EXPECT_LE(test::rel_error(p->grad, ref), 1e-5) << p->name;
    worst = std::max(worst, test::rel_error(p->grad, ref));
  }
  std::printf("worst gradient rel error over %zu parameters: %.3g\n", m.parameters().size(), worst);
}
