// The collectives' link model (sim/link_fit.h) and the replay's flow model
// (CollectiveModel::Flows): the fit reproduces its own samples, unmeasured group sizes come from
// the link model, a collective replayed as flows matches its samples, and concurrent collectives on
// shared links contend.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "cai/core/error.h"
#include "cluster.h"
#include "link_fit.h"
#include "replay.h"

using namespace cai::sim;
namespace fs = std::filesystem;

namespace {

Calibration profile(const std::string& name) {
  return load_calibration(std::string(CAI_CALIBRATION_DIR) + "/" + name);
}

// A calibration whose samples follow the ring model exactly: launch 10 µs, 1 µs per step,
// 100 GB/s per link above 1 MiB, 20 GB/s below (a protocol switch), on the given group sizes.
Calibration synthetic(const std::vector<int>& groups) {
  Calibration c;
  for (const char* op : {"all_reduce", "all_gather", "reduce_scatter", "broadcast"})
    for (int n : groups)
      for (double b = 1024; b <= 1 << 30; b *= 4) {
        const RingSteps s = ring_steps(op, n, b);
        const double bw = b >= (1 << 20) ? 100e9 : 20e9;
        c.collectives[{op, n}].push_back({b, 10e-6 + s.steps * 1e-6 + s.link_bytes / bw});
      }
  return c;
}

Cluster cluster(const std::string& name) {
  return load_cluster(std::string(CAI_CLUSTER_DIR) + "/" + name);
}

// Collectives of `kind` over each group (every member's op on stream `stream + k` for group k, so
// the groups run at once), `bytes` each.
Workload collectives(OpKind kind, const std::vector<std::vector<int>>& groups, int64_t bytes,
                     int ranks) {
  Workload w;
  w.name = "collectives";
  w.ranks.resize(ranks);
  for (size_t k = 0; k < groups.size(); ++k) {
    const int g = w.add_group(groups[k]);
    for (int r : groups[k])
      w.ranks[r].ops.push_back(
          Op::collective(kind, fmt::format("c{}", k), g, bytes, 1 + static_cast<int>(k)));
  }
  return w;
}

Workload one_send(int64_t bytes) {
  Workload w;
  w.name = "send";
  w.ranks.resize(2);
  w.ranks[0].ops.push_back(Op::send("send", 1, 7, bytes));
  w.ranks[1].ops.push_back(Op::recv("recv", 0, 7, bytes));
  return w;
}

double replay_s(const Workload& w, const Cluster& c, const Calibration& cal,
                CollectiveModel m = CollectiveModel::Flows) {
  ReplayOptions o;
  o.collectives = m;
  o.calibration = cal;
  return replay(w, c, o).step_s;
}

std::vector<int> first(int n) {
  std::vector<int> v(n);
  for (int r = 0; r < n; ++r) v[r] = r;
  return v;
}

OpKind kind_of(const std::string& op) {
  return op == "all_reduce"       ? OpKind::AllReduce
         : op == "all_gather"     ? OpKind::AllGather
         : op == "reduce_scatter" ? OpKind::ReduceScatter
                                  : OpKind::Broadcast;
}

}  // namespace

TEST(LinkFit, RingSteps) {
  EXPECT_EQ(ring_steps("all_reduce", 4, 8).steps, 6);
  EXPECT_DOUBLE_EQ(ring_steps("all_reduce", 4, 8).link_bytes, 12);
  EXPECT_EQ(ring_steps("all_gather", 4, 8).steps, 3);
  EXPECT_DOUBLE_EQ(ring_steps("reduce_scatter", 4, 8).link_bytes, 6);
  EXPECT_DOUBLE_EQ(ring_steps("broadcast", 4, 8).link_bytes, 8);
  EXPECT_EQ(ring_steps("p2p", 2, 8).steps, 1);
  try {
    ring_steps("gather", 2, 8);
    FAIL() << "no error";
  } catch (const cai::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'gather'"), std::string::npos) << e.what();
  }
}

// Samples that follow the model: recovered (alpha exactly, every sample), and an unmeasured group
// size (3 between 2 and 4; 8 beyond) predicted through the links.
TEST(LinkFit, RecoversTheRingModel) {
  const LinkModel m = fit_links(synthetic({2, 4}), 5e-6);
  ASSERT_TRUE(m.covers("all_reduce"));
  EXPECT_NEAR(m.ops.at("all_reduce").alpha, 1e-6, 0.02e-6);
  EXPECT_LT(m.max_error(), 0.01) << link_fit_report(m);
  const Calibration truth = synthetic({3, 8});
  for (const auto& [key, v] : truth.collectives)
    for (const CollectiveSample& s : v)
      EXPECT_NEAR(m.seconds(key.first, key.second, s.bytes) / s.seconds, 1.0, 0.02)
          << key.first << " over " << key.second << " ranks, " << s.bytes << " bytes";
  EXPECT_NEAR(m.capacity, 100e9, 1e9);
}

// The shipped profiles: every sample of every measured group size reproduced within 3% (the
// plateau's noise is all that is left), on GPUs (NCCL) and CPUs (MPI).
TEST(LinkFit, ReproducesShippedProfiles) {
  int fitted = 0;
  for (const auto& e : fs::directory_iterator(CAI_CALIBRATION_DIR)) {
    const Calibration cal = load_calibration(e.path().string());
    if (cal.collectives.empty()) continue;
    const LinkModel m = fit_links(cal, 2e-6);
    ++fitted;
    EXPECT_LT(m.max_error(), 0.03) << e.path().filename() << "\n" << link_fit_report(m);
    EXPECT_GT(m.capacity, 0) << e.path().filename();
  }
  EXPECT_GE(fitted, 5);
}

// Group sizes left out of the fit, on the 4-GPU H200 profile: 3 ranks from {2, 4} and 4 ranks
// from {2} alone (alpha then the cluster's 2 µs). Large messages (>= 16 MiB, where the bandwidth
// term dominates) within the stated tolerances (15% for 3 ranks' all-reduce and broadcast; 35%,
// mean 20%, for 4 ranks from 2); the figures are printed.
// The calibration's samples and the link model are keyed by one op name per kind
// (measured_op_name, the table op_kind_name shares): a broadcast round is timed as broadcasts by
// both, a send as "p2p", and kinds that move nothing over a link have none.
TEST(LinkFit, OneMeasuredOpPerKindForSamplesAndLinks) {
  const Calibration cal = synthetic({2, 4});
  const LinkModel m = fit_links(cal, 5e-6);
  for (OpKind k : {OpKind::AllReduce, OpKind::ReduceScatter, OpKind::AllGather, OpKind::Broadcast,
                   OpKind::BroadcastRound}) {
    EXPECT_TRUE(m.covers(measured_op_name(k))) << op_kind_name(k);
    EXPECT_GT(calibrated_collective_seconds(cal, k, 4, 1 << 20), 0) << op_kind_name(k);
  }
  EXPECT_STREQ(measured_op_name(OpKind::BroadcastRound), "broadcast");
  EXPECT_STREQ(op_kind_name(OpKind::BroadcastRound), "broadcast_round");
  EXPECT_DOUBLE_EQ(calibrated_collective_seconds(cal, OpKind::BroadcastRound, 4, 1 << 20),
                   4 * calibrated_collective_seconds(cal, OpKind::Broadcast, 4, 1 << 20));
  EXPECT_STREQ(measured_op_name(OpKind::Send), "p2p");
  for (OpKind k : {OpKind::Compute, OpKind::Recv, OpKind::HostCopy})
    EXPECT_STREQ(measured_op_name(k), "") << op_kind_name(k);
}

TEST(LinkFit, UnmeasuredGroupSizesFromTheLinks) {
  const Calibration cal = profile("h200x4-vit_base_patch16_224-bf16-nccl.json");
  auto errors = [&](const LinkModel& m, int n, double min_bytes) {
    double worst = 0, sum = 0;
    int k = 0;
    for (const char* op : {"all_reduce", "all_gather", "reduce_scatter", "broadcast"})
      for (const CollectiveSample& s : cal.collectives.at({op, n})) {
        if (s.bytes < min_bytes) continue;
        const double e = m.seconds(op, n, s.bytes) / s.seconds - 1;
        worst = std::max(worst, std::abs(e)), sum += std::abs(e), ++k;
      }
    return std::pair{worst, sum / k};
  };
  const LinkModel m24 = fit_links(cal, 2e-6, {2, 4});
  const LinkModel m2 = fit_links(cal, 2e-6, {2});
  const auto [w3, mean3] = errors(m24, 3, 16 << 20);
  const auto [w4, mean4] = errors(m2, 4, 16 << 20);
  const auto [w3all, mean3all] = errors(m24, 3, 0);
  const auto [w4all, mean4all] = errors(m2, 4, 0);
  fmt::print(
      "h200x4: 3 ranks from {{2, 4}}: >= 16 MiB max {:.1f}% mean {:.1f}%, all sizes max {:.1f}% "
      "mean {:.1f}%\n        4 ranks from {{2}}: >= 16 MiB max {:.1f}% mean {:.1f}%, all sizes "
      "max {:.1f}% mean {:.1f}%\n",
      100 * w3, 100 * mean3, 100 * w3all, 100 * mean3all, 100 * w4, 100 * mean4, 100 * w4all,
      100 * mean4all);
  // all_reduce and broadcast at 3 ranks follow the ring between 2 and 4; NCCL's 3-rank
  // reduce-scatter and all-gather run slower than both neighbours (a latency floor of 44 µs
  // against 20 and 23 µs), which no link model between them predicts.
  for (const char* op : {"all_reduce", "broadcast"})
    for (const CollectiveSample& s : cal.collectives.at({op, 3}))
      if (s.bytes >= (16 << 20))
        EXPECT_NEAR(m24.seconds(op, 3, s.bytes) / s.seconds, 1.0, 0.15) << op << " " << s.bytes;
  // NCCL's per-link bandwidth on 2 ranks is below its 4-rank one (all-gather 246 against 300
  // GB/s at 512 MiB): 4 ranks from the 2-rank profile are up to 32% slow (mean 16%).
  EXPECT_LT(w4, 0.35);
  EXPECT_LT(mean4, 0.20);
}

TEST(LinkFit, Errors) {
  EXPECT_THROW(fit_links(synthetic({2}), -1), cai::Error);
  const LinkModel none = fit_links(Calibration{}, 1e-6);
  EXPECT_FALSE(none.covers("all_reduce"));
  EXPECT_EQ(none.seconds("all_reduce", 2, 1e6), -1);
}

// A collective replayed through the flow model (SimGrid flows over the fitted links) against its
// own calibration samples: every op and group size of the 4-GPU H200 profile, every 4th size
// (and the largest), and p2p sends; within 3%.
TEST(Flows, ReplayMatchesItsSamples) {
  const Calibration cal = profile("h200x4-vit_base_patch16_224-bf16-nccl.json");
  const Cluster c = cluster("h200-4.toml");
  double worst = 0;
  int n_checked = 0;
  for (const auto& [key, v] : cal.collectives)
    for (size_t i = 0; i < v.size(); ++i) {
      if (i % 4 != 0 && i + 1 != v.size()) continue;
      const auto& [op, n] = key;
      const auto bytes = static_cast<int64_t>(v[i].bytes);
      const Workload w =
          op == "p2p" ? one_send(bytes) : collectives(kind_of(op), {first(n)}, bytes, n);
      const double e = replay_s(w, c, cal) / v[i].seconds - 1;
      EXPECT_LT(std::abs(e), 0.03) << op << " over " << n << " ranks, " << bytes << " bytes";
      worst = std::max(worst, std::abs(e)), ++n_checked;
    }
  fmt::print("flows against their own samples: {} replays, max |error| {:.3f}%\n", n_checked,
             100 * worst);
  EXPECT_GE(n_checked, 80);
}

// A group size the profile lacks (3 ranks, samples of 2 and 4 only) replays as the link model
// predicts it (the same time), not as the network model's nominal links.
TEST(Flows, UnmeasuredGroupSizeThroughTheLinks) {
  Calibration cal = profile("h200x4-vit_base_patch16_224-bf16-nccl.json");
  const Calibration full = cal;
  for (const char* op : {"all_reduce", "all_gather", "reduce_scatter", "broadcast"})
    cal.collectives.erase({op, 3});
  const LinkModel lm = fit_links(cal, cluster("h200-4.toml").intra.latency);
  const Cluster c = cluster("h200-4.toml");
  for (const int64_t bytes : {int64_t(1) << 16, int64_t(1) << 26}) {
    const Workload w = collectives(OpKind::AllReduce, {first(3)}, bytes, 3);
    const double t = replay_s(w, c, cal);
    EXPECT_NEAR(t / lm.seconds("all_reduce", 3, static_cast<double>(bytes)), 1.0, 1e-6) << bytes;
    EXPECT_NEAR(t / full.collective_seconds("all_reduce", 3, static_cast<double>(bytes), nullptr),
                1.0, 0.15)
        << bytes;
  }
}

// Two all-reduces at once on the same two GPUs share their links: together they take longer
// than one alone (about twice at 256 MiB, the links' capacity being about one flow's bandwidth);
// on disjoint GPUs of an NVSwitch node they do not. The calibrated sleep sees neither.
TEST(Flows, ConcurrentCollectivesOnSharedLinksContend) {
  const Calibration cal = profile("h200x4-vit_base_patch16_224-bf16-nccl.json");
  const Cluster c = cluster("h200-4.toml");
  const int64_t b = int64_t(1) << 28;
  const double one = replay_s(collectives(OpKind::AllReduce, {{0, 1}}, b, 2), c, cal);
  const double shared = replay_s(collectives(OpKind::AllReduce, {{0, 1}, {0, 1}}, b, 2), c, cal);
  const double disjoint = replay_s(collectives(OpKind::AllReduce, {{0, 1}, {2, 3}}, b, 4), c, cal);
  EXPECT_GT(shared, 1.5 * one);
  EXPECT_NEAR(disjoint / one, 1.0, 1e-6);
  EXPECT_NEAR(replay_s(collectives(OpKind::AllReduce, {{0, 1}, {0, 1}}, b, 2), c, cal,
                       CollectiveModel::Bulk) /
                  one,
              1.0, 0.01);
  fmt::print("256 MiB all-reduce on 2 H200s: {:.3f} ms alone, {:.3f} ms beside another\n",
             1e3 * one, 1e3 * shared);
}

// Strided groups route over the links their ranks use: on 2 nodes of 2 GPUs, pairs {0, 2} and
// {1, 3} cross the nodes and share both NIC links (slower together than alone, slower than the
// consecutive pairs {0, 1}, {2, 3} inside the nodes).
TEST(Flows, StridedGroupsCrossTheNics) {
  const Calibration cal = profile("h200x4-vit_base_patch16_224-bf16-nccl.json");
  Cluster c = cluster("h200-4.toml");
  c.nodes = 2, c.gpus_per_node = 2;
  c.inter.nics_per_node = 1, c.inter.nic_bandwidth = 50e9, c.inter.latency = 5e-6;
  const int64_t b = int64_t(1) << 26;
  const double inside = replay_s(collectives(OpKind::AllReduce, {{0, 1}, {2, 3}}, b, 4), c, cal);
  const double across_one = replay_s(collectives(OpKind::AllReduce, {{0, 2}}, b, 4), c, cal);
  const double across = replay_s(collectives(OpKind::AllReduce, {{0, 2}, {1, 3}}, b, 4), c, cal);
  EXPECT_GT(across_one, 2 * inside);  // 50 GB/s NICs against ~330 GB/s links
  EXPECT_GT(across, 1.5 * across_one);
  fmt::print(
      "64 MiB all-reduce pairs: inside nodes {:.3f} ms; across {:.3f} ms alone, {:.3f} ms "
      "two at once\n",
      1e3 * inside, 1e3 * across_one, 1e3 * across);
}

// Profiles with the group layouts of `colossalai benchmark -g 4 --calibrate` (an entry's optional
// "layout") load: those samples go to collective_layouts, the others as before; a profile without
// them loads unchanged, and an unknown layout is refused naming it.
TEST(LinkFit, CalibrationLayouts) {
  const std::string text = R"({"device": "x", "collectives": [
    {"op": "all_reduce", "group": 2, "bytes": 1024, "seconds": 2e-5},
    {"op": "all_reduce", "group": 2, "bytes": 2048, "seconds": 3e-5, "layout": "strided"},
    {"op": "all_reduce", "group": 2, "bytes": 1024, "seconds": 2.5e-5, "layout": "concurrent"},
    {"op": "all_reduce", "group": 2, "bytes": 512, "seconds": 2.4e-5, "layout": "concurrent"}]})";
  const Calibration c = parse_calibration(text, "layouts.json");
  EXPECT_EQ(c.collectives.at({"all_reduce", 2}).size(), 1u);
  const auto& conc = c.collective_layouts.at({"all_reduce", 2, "concurrent"});
  ASSERT_EQ(conc.size(), 2u);
  EXPECT_EQ(conc[0].bytes, 512);  // sorted by bytes
  EXPECT_EQ(c.collective_layouts.at({"all_reduce", 2, "strided"}).size(), 1u);
  // A profile measured before the layouts (2 H100s): none; one measured with them (the 4 H200's
  // ViT-B/16 profile): some.
  EXPECT_TRUE(profile("h100x2-vit_large_patch16_224-bf16-nccl.json").collective_layouts.empty());
  EXPECT_FALSE(profile("h200x4-vit_base_patch16_224-bf16-nccl.json").collective_layouts.empty());
  try {
    parse_calibration(R"({"collectives": [{"op": "all_reduce", "group": 2, "bytes": 1024,
      "seconds": 2e-5, "layout": "diagonal"}]})",
                      "bad.json");
    FAIL() << "no error";
  } catch (const cai::Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"diagonal\""), std::string::npos) << e.what();
  }
}
