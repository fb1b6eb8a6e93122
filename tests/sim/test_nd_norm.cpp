// The LayerNorms and the residual stream in the simulator as the executor runs them, where a
// profile timed them so, and as before where an older profile did not:
// - 2d/2.5d (plan.h: kNdNormCalibration): a profile that timed the split LayerNorm ("nd.norm|fwd"
//   / "|bwd", colossalai benchmark --calibrate on 4 ranks' layouts) times the norm ops by those
//   samples and its extra passes (kNdLnPasses) as part of them; an older profile times the norm
//   ops as the whole-row LayerNorm and the passes as device copies;
// - 1D: a profile that timed the LayerNorm backwards with the residual gradient's add
//   ("norm1|bwd_add", ops::layernorm_bwd_add) has the block's "residual" backward inside them, and
//   the unfused residual adds by their compute-dtype samples ("residual|fwd_ct").
#include <gtest/gtest.h>

#include <string>

#include "cai/plan/plan.h"
#include "cluster.h"
#include "from_config.h"
#include "replay.h"
#include "sim_test_inputs.h"

using namespace cai;
using cai::sim::test::fmnist;

namespace {

// Samples at `ns` nanoseconds a FLOP for `keys` (fwd and bwd of each), spanning the tiny model's
// ops (1 to 1e9 FLOPs), and the copy reference (the passes as copies).
void add_samples(sim::Calibration* c, const std::vector<std::string>& keys, double ns) {
  for (const std::string& k : keys)
    for (const char* ph : {"|fwd", "|bwd"})
      for (double f : {1.0, 1e9}) c->samples[k + ph].push_back({f, f, f * ns * 1e-9});
}

TEST(NdNorm, SplitLayerNormTimedByItsOwnSamples) {
  const sim::Cluster c = sim::test::cluster("h200-4");
  const config::TrainConfig cfg = fmnist({"parallel.tensor.mode=2d", "parallel.tensor.size=4"});
  const sim::ConfigWorkload cw = sim::workload_from_config(cfg, 4, c, false);
  const auto& ops = cw.workload.ranks.at(0).ops;
  int norms = 0, passes = 0;
  for (const sim::Op& o : ops) {
    const bool norm = o.cal_fallback.rfind("norm", 0) == 0;
    if (norm) {
      ++norms;
      EXPECT_EQ(o.cal_key.rfind(std::string(plan::kNdNormCalibration) + "|", 0), 0u) << o.name;
      EXPECT_EQ(o.cal_key.substr(o.cal_key.size() - 4),
                o.cal_fallback.substr(o.cal_fallback.size() - 4))
          << o.name;
    }
    if (!o.covered_by.empty()) {
      ++passes;
      EXPECT_NE(o.name.find(plan::kNdLnPasses), std::string::npos) << o.name;
      EXPECT_EQ(o.covered_by.rfind(std::string(plan::kNdNormCalibration) + "|", 0), 0u) << o.name;
    }
  }
  // Four blocks' norm1 and norm2 and the head's norm, forward and backward; a passes op each.
  EXPECT_EQ(norms, 2 * (2 * 4 + 1));
  EXPECT_EQ(passes, norms);

  sim::Calibration old_profile;
  add_samples(&old_profile, {"norm1", "norm2", "norm", "mlp.act"}, 1.0);
  sim::Calibration split = old_profile;
  add_samples(&split, {plan::kNdNormCalibration}, 5.0);
  const auto before = sim::compute_durations(cw.workload, c, old_profile);
  const auto after = sim::compute_durations(cw.workload, c, split);
  for (size_t i = 0; i < ops.size(); ++i) {
    const sim::Op& o = ops[i];
    if (!o.cal_fallback.empty()) {
      ASSERT_GT(before[0][i], 0) << o.name;
      EXPECT_NEAR(after[0][i] / before[0][i], 5.0, 1e-6) << o.name;  // the split samples
    } else if (!o.covered_by.empty()) {
      EXPECT_GT(before[0][i], 0) << o.name;  // a device copy at the reference's bandwidth
      EXPECT_EQ(after[0][i], 0) << o.name;   // inside the split LayerNorm's samples
    } else {
      EXPECT_EQ(after[0][i], before[0][i]) << o.name;
    }
  }
  // 1D tensor parallelism: no split LayerNorm.
  const sim::ConfigWorkload one_d = sim::workload_from_config(
      fmnist({"parallel.tensor.mode=1d", "parallel.tensor.size=4"}), 4, c, false);
  for (const sim::Op& o : one_d.workload.ranks.at(0).ops) {
    EXPECT_EQ(o.cal_key.find(plan::kNdNormCalibration), std::string::npos) << o.name;
    EXPECT_EQ(o.name.find(plan::kNdLnPasses), std::string::npos) << o.name;
  }
}

TEST(NdNorm, OneDimensionalResidualStreamAsTheBlockRunsIt) {
  const sim::Cluster c = sim::test::cluster("h200-4");
  const sim::ConfigWorkload cw = sim::workload_from_config(
      fmnist({"parallel.tensor.mode=1d", "parallel.tensor.size=4"}), 4, c, false);
  const auto& ops = cw.workload.ranks.at(0).ops;
  int norm_bwd = 0, residual_bwd = 0, residual_fwd = 0;
  for (const sim::Op& o : ops) {
    if (o.cal_key == "norm1|bwd_add" || o.cal_key == "norm2|bwd_add") {
      ++norm_bwd;
      EXPECT_EQ(o.cal_fallback, o.cal_key.substr(0, 5) + "|bwd") << o.name;
    }
    if (o.covered_by == "norm1|bwd_add") ++residual_bwd;
    if (o.cal_key == "residual|fwd_ct") {
      ++residual_fwd;
      EXPECT_EQ(o.cal_fallback, "residual|fwd") << o.name;
    }
  }
  EXPECT_EQ(norm_bwd, 2 * 4);  // four blocks
  EXPECT_EQ(residual_bwd, 4);
  EXPECT_EQ(residual_fwd, 4);  // fp32 on the CPU config: never fused into a GEMM

  sim::Calibration old_profile;
  add_samples(&old_profile, {"norm1", "norm2", "residual", "norm"}, 1.0);
  sim::Calibration fused = old_profile;
  for (const char* k : {"norm1|bwd_add", "norm2|bwd_add", "residual|fwd_ct"})
    for (double f : {1.0, 1e9}) fused.samples[k].push_back({f, f, f * 3e-9});
  const auto before = sim::compute_durations(cw.workload, c, old_profile);
  const auto after = sim::compute_durations(cw.workload, c, fused);
  for (size_t i = 0; i < ops.size(); ++i) {
    const sim::Op& o = ops[i];
    if (!o.cal_fallback.empty() && o.cal_key.find("|bwd_add") != std::string::npos) {
      EXPECT_NEAR(after[0][i] / before[0][i], 3.0, 1e-6) << o.name;
    } else if (o.cal_key == "residual|fwd_ct") {
      EXPECT_NEAR(after[0][i] / before[0][i], 3.0, 1e-6) << o.name;
    } else if (o.covered_by == "norm1|bwd_add") {
      EXPECT_GT(before[0][i], 0) << o.name;
      EXPECT_EQ(after[0][i], 0) << o.name;
    } else {
      EXPECT_EQ(after[0][i], before[0][i]) << o.name;
    }
  }
}

}  // namespace
