// The simulator: cluster files, collectives against their analytic times, bulk against
// step-by-step, the replay engine's stream/dependency semantics, schedule replays against the
// validator, memory curves, errors; folded copies and merged compute runs against the replay of
// every rank and op.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "cai/core/error.h"
#include "cai/dist/communicator.h"
#include "cai/schedule/schedule.h"
#include "cluster.h"
#include "expand.h"
#include "from_config.h"
#include "platform.h"
#include "replay.h"
#include "report.h"
#include "sim_test_inputs.h"

using namespace cai::sim;
using cai::sim::test::fmnist;
namespace fs = std::filesystem;

namespace {

// A cluster with round numbers: 100 GB/s and 10 µs inside a node, one 200 Gb/s NIC (25 GB/s) and
// 20 µs between nodes.
std::string test_cluster_text(int nodes, int gpus_per_node) {
  return fmt::format(R"(
name = "test"
nodes = {}
gpus_per_node = {}
[gpu]
model = "test gpu"
tflops = {{ fp32 = 10.0, bf16 = 100.0, fp16 = 100.0 }}
memory_gib = 16
memory_bandwidth_tbytes_per_s = 1.0
[intra_node]
fabric = "nvswitch"
bandwidth_gbytes_per_s = 100.0
latency_us = 10.0
[inter_node]
nics_per_node = 1
nic_gbits_per_s = 200.0
latency_us = 20.0
topology = "fat-tree"
[host_link]
bandwidth_gbytes_per_s = 20.0
latency_us = 5.0
)",
                     nodes, gpus_per_node);
}

Cluster test_cluster(int nodes, int gpus_per_node) {
  return parse_cluster(test_cluster_text(nodes, gpus_per_node), "test.toml");
}

// One collective over ranks [0, n), nothing else.
Workload one_collective(OpKind kind, int n, int64_t bytes) {
  Workload w;
  w.name = std::string(op_kind_name(kind));
  std::vector<int> g(n);
  for (int r = 0; r < n; ++r) g[r] = r;
  const int gid = w.add_group(g);
  w.ranks.resize(n);
  for (int r = 0; r < n; ++r) w.ranks[r].ops.push_back(Op::collective(kind, "coll", gid, bytes, 1));
  return w;
}

double simulate(const Workload& w, const Cluster& c, CollectiveModel m) {
  ReplayOptions o;
  o.collectives = m;
  return replay(w, c, o).step_s;
}

std::string error_of(const std::string& text, const std::string& origin = "bad.toml") {
  try {
    parse_cluster(text, origin);
  } catch (const cai::Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(ClusterFiles, EveryShippedFileLoads) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(CAI_CLUSTER_DIR)) {
    if (e.path().extension() != ".toml") continue;
    SCOPED_TRACE(e.path().string());
    const Cluster c = load_cluster(e.path().string());
    EXPECT_EQ(c.name, e.path().stem().string());
    EXPECT_GT(c.gpu.peak_flops(DType::BF16), 0);
    EXPECT_GT(c.gpu.memory_bytes, 0);
    ++n;
  }
  EXPECT_GE(n, 7);
  const std::string d = CAI_CLUSTER_DIR;
  EXPECT_EQ(load_cluster(d + "/h100-1.toml").gpus(), 1);
  EXPECT_EQ(load_cluster(d + "/h200-2.toml").gpus(), 2);
  EXPECT_EQ(load_cluster(d + "/h200-4.toml").gpus(), 4);
  EXPECT_EQ(load_cluster(d + "/cpu-2.toml").intra.fabric, Fabric::SharedMemory);
  EXPECT_EQ(load_cluster(d + "/h100-1024.toml").gpus(), 1024);
  EXPECT_EQ(load_cluster(d + "/h100-16384.toml").gpus(), 16384);
  const Cluster dgx = load_cluster(d + "/dgx-h100-64.toml");
  EXPECT_EQ(dgx.gpus(), 64);
  EXPECT_EQ(dgx.inter.nics_per_node, 8);
  EXPECT_DOUBLE_EQ(dgx.inter.nic_bandwidth, 50e9);  // 400 Gb/s
  EXPECT_DOUBLE_EQ(dgx.gpu.flops_bf16, 989e12);
  EXPECT_DOUBLE_EQ(dgx.intra.bandwidth, 450e9);
}

// Found by the fuzzer (issue 16): memory_gib = 2^63 (or inf) overflowed the int64 byte count
// (undefined behaviour, a negative memory in practice).
TEST(ClusterFiles, MemoryBeyondInt64AndInfinitiesAreErrors) {
  const std::string good = test_cluster_text(2, 4);
  for (const std::string v : {"9223372036854775807", "4611686018427387904", "inf", "1e300"}) {
    std::string s = good;
    const size_t p = s.find("memory_gib = 16\n");
    ASSERT_NE(p, std::string::npos);
    s.replace(p, 15, "memory_gib = " + v);
    EXPECT_THROW(parse_cluster(s, "big.toml"), cai::Error) << v;
  }
  std::string s = good;
  s.replace(s.find("bandwidth_gbytes_per_s = "), 25, "bandwidth_gbytes_per_s = inf #");
  EXPECT_THROW(parse_cluster(s, "inf.toml"), cai::Error);
}

TEST(ClusterFiles, NonAsciiOutsideStringsIsAnError) {
  const std::string good = test_cluster_text(2, 4);
  EXPECT_NO_THROW(parse_cluster("# caf\xC3\xA9\n" + good, "comment.toml"));
  try {
    parse_cluster(good + "\xC2\xA1\n", "odd.toml");
    ADD_FAILURE() << "accepted";
  } catch (const cai::Error& e) {
    EXPECT_NE(std::string(e.what()).find("odd.toml: line "), std::string::npos) << e.what();
  }
}

TEST(ClusterFiles, BadFilesNameTheFileAndTheKey) {
  const std::string good = test_cluster_text(2, 4);
  auto replace = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const size_t p = s.find(from);
    EXPECT_NE(p, std::string::npos) << from;
    return s.replace(p, from.size(), to);
  };
  std::string e = error_of(replace("memory_gib = 16\n", ""));
  EXPECT_NE(e.find("[cluster] bad.toml: missing key 'gpu.memory_gib'"), std::string::npos) << e;
  e = error_of(replace("memory_gib = 16", "memory_gib = \"lots\""));
  EXPECT_NE(e.find("gpu.memory_gib = \"lots\" is not a finite number"), std::string::npos) << e;
  e = error_of(replace("latency_us = 10.0", "latency_us = 10.0\nlatency_ms = 1"));
  EXPECT_NE(e.find("unknown key 'intra_node.latency_ms' in [intra_node]: expected fabric"),
            std::string::npos)
      << e;
  e = error_of(replace("fabric = \"nvswitch\"", "fabric = \"nvlink\""));
  EXPECT_NE(e.find("intra_node.fabric = \"nvlink\" is not one of \"nvswitch\", \"pcie\""),
            std::string::npos)
      << e;
  e = error_of(replace("nodes = 2", "nodes = 0"));
  EXPECT_NE(e.find("nodes = 0 must be >= 1"), std::string::npos) << e;
  e = error_of(replace("bf16 = 100.0", "bf16 = -1.0"));
  EXPECT_NE(e.find("gpu.tflops.bf16 = -1 must be > 0"), std::string::npos) << e;
  e = error_of(good + "\n[storage]\nx = 1\n");
  EXPECT_NE(e.find("unknown key 'storage': expected name, description, nodes"), std::string::npos)
      << e;
  e = error_of(replace("[inter_node]", "[inter]"));
  EXPECT_NE(e.find("missing key 'inter_node'"), std::string::npos) << e;  // 2 nodes need it
  e = error_of(replace("fabric = \"nvswitch\"", "fabric = \"nvswitch\"\nplacement = \"pinned\""));
  EXPECT_NE(e.find("intra_node.placement is for fabric = \"shared_memory\""), std::string::npos)
      << e;
  {
    std::string cpu = replace("fabric = \"nvswitch\"", "fabric = \"shared_memory\"");
    cpu.replace(cpu.find("fabric = \"shared_memory\""), 24,
                "fabric = \"shared_memory\"\nplacement = \"bound\"");
    e = error_of(cpu);
    EXPECT_NE(e.find("intra_node.placement = \"bound\" is not one of \"shared\", \"pinned\""),
              std::string::npos)
        << e;
  }
  e = error_of("nodes = [");
  EXPECT_NE(e.find("[cluster] bad.toml:1:"), std::string::npos) << e;
  try {
    load_cluster("/nonexistent/x.toml");
    FAIL();
  } catch (const cai::Error& ex) {
    EXPECT_NE(std::string(ex.what()).find("cannot read /nonexistent/x.toml"), std::string::npos);
  }
}

TEST(Calibration, DefaultsFileAndErrors) {
  const Calibration d = default_calibration();
  EXPECT_DOUBLE_EQ(d.of("gemm").flops, 0.7);
  EXPECT_DOUBLE_EQ(d.of("no such op").flops, d.fallback.flops);
  const Calibration c = parse_calibration(
      R"({"device": "x", "default": {"flops": 0.5, "bytes": 0.5}, "ops": {"gemm": {"flops": 1.0}}})",
      "cal.json");
  EXPECT_DOUBLE_EQ(c.of("gemm").flops, 1.0);
  EXPECT_DOUBLE_EQ(c.of("other").bytes, 0.5);
  EXPECT_THROW(parse_calibration(R"({"ops": {"gemm": {"flops": 1.5}}})", "c"), cai::Error);
  EXPECT_THROW(parse_calibration(R"({"fudge": 1})", "c"), cai::Error);
  // The roofline: max(flops / (peak eff), bytes / (bw eff)).
  Workload w;
  w.ranks.resize(1);
  Op a = Op::compute("gemm", -1);
  a.op_kind = "gemm";
  a.flops = 100e12;  // 1 s at 100 TFLOP/s and efficiency 1
  a.mem_bytes = 1e9;
  Op b = a;
  b.op_kind = "other";
  b.flops = 1;
  b.mem_bytes = 1e12;  // 2 s at 1 TB/s · 0.5
  w.ranks[0].ops = {a, b};
  const auto t = compute_durations(w, test_cluster(1, 1), c);
  EXPECT_NEAR(t[0][0], 1.0, 1e-12);
  EXPECT_NEAR(t[0][1], 2.0, 1e-12);
}

// Found by the fuzzer (issue 16): a number beyond double's range made nlohmann::json throw
// out_of_range, which escaped as a non-cai::Error.
TEST(Calibration, NumberBeyondDoubleIsCaiError) {
  try {
    parse_calibration(R"({"default": {"flops": 1e309}})", "big.json");
    FAIL() << "no error";
  } catch (const cai::Error& e) {
    EXPECT_NE(std::string(e.what()).find("[calibration] big.json: not JSON"), std::string::npos)
        << e.what();
  }
}

TEST(Calibration, MeasuredSamplesTimeTheOpsTheyMatch) {
  const Calibration c = parse_calibration(
      R"({"samples": {"attn.qkv|fwd": [[4e9, 1e6, 0.004], [1e9, 1e6, 0.002]],
                      "optimizer|step": [[1e6, 3.6e7, 0.001]]},
          "layer_scale": {"blocks.0|fwd b1": 1.1}})",
      "cal.json");
  bool interp = true;
  EXPECT_DOUBLE_EQ(c.seconds_of("attn.qkv|fwd", 1e9, &interp), 0.002);  // sorted on load
  EXPECT_FALSE(interp);
  // Between samples: log-log, so 2e9 FLOPs (halfway in log) takes √(0.002 · 0.004).
  EXPECT_NEAR(c.seconds_of("attn.qkv|fwd", 2e9, &interp), std::sqrt(0.002 * 0.004), 1e-12);
  EXPECT_TRUE(interp);
  EXPECT_NEAR(c.seconds_of("attn.qkv|fwd", 8e9, nullptr), 0.008, 1e-12);  // the last rate
  EXPECT_DOUBLE_EQ(c.seconds_of("mlp.fc1|fwd", 1e9, nullptr), -1);
  for (const char* bad : {R"({"samples": {"x|fwd": [[0, 1, 1]]}})",
                          R"({"samples": {"x|fwd": [[1, 1]]}})", R"({"samples": []})"})
    EXPECT_THROW(parse_calibration(bad, "c"), cai::Error) << bad;
  // compute_durations: measured, interpolated (never below the peak roofline), roofline.
  Workload w;
  w.ranks.resize(1);
  Op a = Op::compute("blocks.0 attn.qkv", -1);
  a.op_kind = "gemm";
  a.cal_key = "attn.qkv|fwd";
  a.flops = 1e9;
  Op b = a;
  b.flops = 2e9;
  Op d = a;
  d.cal_key = "mlp.fc1|fwd";
  w.ranks[0].ops = {a, b, d};
  TimingSources src;
  const auto t = compute_durations(w, test_cluster(1, 1), c, &src);
  EXPECT_DOUBLE_EQ(t[0][0], 0.002);
  EXPECT_NEAR(t[0][1], std::sqrt(0.002 * 0.004), 1e-12);
  EXPECT_GT(t[0][2], 0.0);
  EXPECT_EQ(src.measured, 1);
  EXPECT_EQ(src.interpolated, 1);
  EXPECT_EQ(src.roofline, 1);
}

// A plan op that moves bytes without FLOPs (a device copy) takes the streaming bandwidth the
// profile measured for its elementwise reference kernel (GELU forward), by bytes; without that
// reference, the roofline.
TEST(Calibration, DeviceCopiesTakeTheMeasuredStreamingBandwidth) {
  // GELU forward: 8 FLOPs and 4 bytes (bf16 in and out) an element; 100 MB in 0.4 ms, 200 MB in 0.7
  // (slower than the test cluster's 1 TB/s, whose roofline bounds an interpolation from below).
  const Calibration c = parse_calibration(
      R"({"samples": {"mlp.act|fwd": [[2e8, 1e8, 4e-4], [4e8, 2e8, 7e-4]]}})", "c");
  EXPECT_NEAR(c.copy_seconds(1e8), 4e-4, 1e-15);
  EXPECT_NEAR(c.copy_seconds(std::sqrt(2.0) * 1e8), std::sqrt(4e-4 * 7e-4), 1e-12);
  EXPECT_NEAR(c.copy_seconds(4e8), 1.4e-3, 1e-12);  // beyond: the last sample's rate
  Workload w;
  w.ranks.resize(1);
  Op copy = Op::compute("blocks.0 sp.tokens_copy", -1);
  copy.op_kind = "copy";
  copy.mem_bytes = 2e8;
  w.ranks[0].ops = {copy};
  TimingSources src;
  EXPECT_NEAR(compute_durations(w, test_cluster(1, 1), c, &src)[0][0], 7e-4, 1e-15);
  EXPECT_EQ(src.interpolated, 1);
  // No reference samples: the roofline at the fallback bytes efficiency.
  const Calibration none = parse_calibration(R"({"samples": {"x|fwd": [[1, 1, 1]]}})", "c");
  EXPECT_DOUBLE_EQ(none.copy_seconds(1e9), -1);
  const Cluster cl = test_cluster(1, 1);
  TimingSources roof;
  EXPECT_NEAR(compute_durations(w, cl, none, &roof)[0][0],
              2e8 / (cl.gpu.memory_bandwidth * none.fallback.bytes), 1e-15);
  EXPECT_EQ(roof.roofline, 1);
}

TEST(Calibration, EveryShippedProfileLoadsWithSamples) {
  int n = 0, with_collectives = 0;
  for (const auto& e : std::filesystem::directory_iterator(CAI_CALIBRATION_DIR)) {
    if (e.path().extension() != ".json") continue;
    const Calibration c = load_calibration(e.path().string());
    EXPECT_FALSE(c.samples.empty()) << e.path();
    EXPECT_TRUE(c.samples.count("attn.qkv|fwd") && c.samples.count("optimizer|step")) << e.path();
    for (const auto& [key, v] : c.collectives) {  // measured on several processes
      EXPECT_GE(v.size(), 2u) << e.path() << " " << key.first;
      for (size_t i = 1; i < v.size(); ++i) EXPECT_GT(v[i].bytes, v[i - 1].bytes) << e.path();
    }
    with_collectives += c.collectives.empty() ? 0 : 1;
    ++n;
  }
  EXPECT_GE(n, 3);
  EXPECT_GE(with_collectives, 1);
}

// 2(N-1)/N · S/B + 2(N-1) · α, with B and α of the slowest ring edge.
TEST(Collectives, RingAllReduceMatchesAnalytic) {
  struct Case {
    int nodes, gpn;
    double B, alpha;
  };
  const Case cases[] = {{1, 2, 100e9, 10e-6},
                        {1, 4, 100e9, 10e-6},
                        {1, 8, 100e9, 10e-6},
                        {2, 4, 25e9, 30e-6},
                        {4, 2, 25e9, 30e-6}};
  for (const Case& k : cases) {
    const Cluster c = test_cluster(k.nodes, k.gpn);
    const int n = k.nodes * k.gpn;
    for (double S : {1e6, 64e6, 1e9}) {
      const double analytic = 2.0 * (n - 1) / n * S / k.B + 2.0 * (n - 1) * k.alpha;
      const Workload w = one_collective(OpKind::AllReduce, n, static_cast<int64_t>(S));
      const double step = simulate(w, c, CollectiveModel::Step);
      const double bulk = simulate(w, c, CollectiveModel::Bulk);
      EXPECT_NEAR(step / analytic, 1.0, 1e-3) << n << " ranks, " << S << " bytes";
      EXPECT_NEAR(bulk / analytic, 1.0, 1e-3) << n << " ranks, " << S << " bytes";
    }
  }
  // The shipped DGX cluster: 16 GPUs on 2 nodes, 1 GB; the NIC edge (8 × 50 GB/s against
  // 450 GB/s NVLink, 2 + 5 µs) is the slowest.
  const Cluster dgx = load_cluster(std::string(CAI_CLUSTER_DIR) + "/dgx-h100-64.toml");
  const double analytic = 2.0 * 15 / 16 * 1e9 / 400e9 + 2.0 * 15 * 7e-6;
  EXPECT_NEAR(
      simulate(one_collective(OpKind::AllReduce, 16, 1000000000), dgx, CollectiveModel::Step) /
          analytic,
      1.0, 1e-3);
}

TEST(Collectives, BulkAgreesWithStepByStep) {
  const OpKind kinds[] = {OpKind::AllReduce, OpKind::ReduceScatter, OpKind::AllGather,
                          OpKind::Broadcast};
  const std::pair<int, int> shapes[] = {{1, 2}, {1, 3}, {1, 8}, {2, 4}, {4, 4}};
  for (auto [nodes, gpn] : shapes) {
    const Cluster c = test_cluster(nodes, gpn);
    for (OpKind k : kinds)
      for (int64_t S : {int64_t(4096), int64_t(1) << 20, int64_t(256) << 20}) {
        const Workload w = one_collective(k, nodes * gpn, S);
        const double step = simulate(w, c, CollectiveModel::Step);
        const double bulk = simulate(w, c, CollectiveModel::Bulk);
        EXPECT_NEAR(bulk / step, 1.0, 0.01)
            << op_kind_name(k) << " over " << nodes * gpn << " ranks, " << S << " bytes";
      }
  }
}

// A broadcast round (SUMMA's q broadcasts, member t the root of the t-th): the step model runs the
// n chains; the bulk round equals n bulk broadcasts rooted at each member in turn, and the step
// model's chains up to 4 ranks (beyond, they overlap: the bulk round is an upper bound).
TEST(Collectives, BroadcastRoundIsItsBroadcasts) {
  const std::pair<int, int> shapes[] = {{1, 2}, {1, 4}, {1, 8}, {2, 2}, {2, 4}, {4, 2}};
  for (auto [nodes, gpn] : shapes) {
    const Cluster c = test_cluster(nodes, gpn);
    const int n = nodes * gpn;
    for (int64_t S : {int64_t(4096), int64_t(1) << 20, int64_t(64) << 20}) {
      const Workload round = one_collective(OpKind::BroadcastRound, n, S);
      Workload each = one_collective(OpKind::Broadcast, n, S);
      for (int r = 0; r < n; ++r) {
        const Op one = each.ranks[r].ops[0];
        each.ranks[r].ops.clear();
        for (int t = 0; t < n; ++t) {
          Op o = one;
          o.root = t;
          each.ranks[r].ops.push_back(o);
        }
      }
      const double bulk = simulate(round, c, CollectiveModel::Bulk);
      const double step = simulate(round, c, CollectiveModel::Step);
      const double broadcasts = simulate(each, c, CollectiveModel::Bulk);
      const std::string what = fmt::format("{} × {} ranks, {} bytes", nodes, gpn, S);
      EXPECT_NEAR(bulk / broadcasts, 1.0, 1e-9) << what;
      // The step model pipelines the chains (a member starts the next one once its part of the
      // previous is done), which the bulk model's meeting per broadcast does not: equal up to 4
      // ranks, the bulk round up to 4/3 of the step model's at 8 (an upper bound).
      if (n <= 4)
        EXPECT_NEAR(bulk / step, 1.0, 0.01) << what;
      else
        EXPECT_TRUE(bulk >= step * (1 - 1e-9) && bulk <= step * 1.34)
            << what << ": " << bulk / step;
      EXPECT_NEAR(simulate(each, c, CollectiveModel::Step) / step, 1.0, 1e-9) << what;
      std::vector<int> ring(n);
      for (int r = 0; r < n; ++r) ring[r] = r;
      EXPECT_LE(collective_lower_bound(c, n, OpKind::BroadcastRound, S, ring, 0), bulk * (1 + 1e-9))
          << what;
    }
  }
}

TEST(Collectives, PointToPoint) {
  const Cluster c = test_cluster(2, 2);
  Workload w;
  w.ranks.resize(4);
  w.ranks[0].ops.push_back(Op::send("s", 1, 7, 1000000000));  // same node: 100 GB/s, 10 µs
  w.ranks[1].ops.push_back(Op::recv("r", 0, 7, 1000000000));
  w.ranks[2].ops.push_back(Op::send("s", 0, 7, 1000000000));  // across: one NIC, 25 GB/s
  w.ranks[0].ops.push_back(Op::recv("r", 2, 7, 1000000000));
  const ReplayResult r = replay(w, c);
  EXPECT_NEAR(r.ranks[1].spans[0].end, 1e9 / 100e9 + 10e-6, 1e-9);
  EXPECT_NEAR(r.ranks[0].spans[1].end, 1e9 / 25e9 + 30e-6, 1e-9);
}

// Streams and dependencies: a gradient all-reduce launched after backward overlaps the next
// compute; the optimizer waits for it.
TEST(Replay, StreamsOverlapAndDependenciesWait) {
  const Cluster c = test_cluster(1, 2);
  Workload w;
  const int g = w.add_group({0, 1});
  w.ranks.resize(2);
  for (auto& rp : w.ranks) {
    rp.ops.push_back(Op::compute("B(layer 1)", 1.0));                         // 0
    Op ar = Op::collective(OpKind::AllReduce, "bucket", g, 100000000000, 1);  // 1: 1 s + 20 µs
    ar.deps = {0};
    rp.ops.push_back(ar);
    rp.ops.push_back(Op::compute("B(layer 0)", 0.5));  // 2: overlaps the all-reduce
    Op opt = Op::compute("OptStep", 0.25, -1, "optimizer");
    opt.deps = {1};
    rp.ops.push_back(opt);  // 3: waits for the bucket
  }
  const ReplayResult r = replay(w, c);
  const auto& s = r.ranks[0].spans;
  EXPECT_NEAR(s[1].start, 1.0, 1e-9);
  EXPECT_NEAR(s[2].start, 1.0, 1e-9);
  EXPECT_NEAR(s[2].end, 1.5, 1e-9);
  EXPECT_NEAR(s[1].end, 2.0 + 20e-6, 1e-9);
  EXPECT_NEAR(s[3].start, s[1].end, 1e-12);
  EXPECT_NEAR(r.step_s, 2.25 + 20e-6, 1e-9);
  EXPECT_NEAR(r.ranks[0].compute_s, 1.75, 1e-9);
  EXPECT_NEAR(r.ranks[0].comm_s, 0.5 + 20e-6, 1e-9);  // the all-reduce not hidden by compute
  EXPECT_NEAR(r.ranks[0].idle_s, 0.0, 1e-9);
}

TEST(Replay, PipelineSchedulesMatchTheValidator) {
  const Cluster c = test_cluster(1, 4);
  double bubble_1f1b = 0, bubble_interleaved = 0;
  for (const char* style : {"gpipe", "1f1b", "interleaved"}) {
    SCOPED_TRACE(style);
    cai::schedule::ScheduleOptions so;
    so.stages = 4;
    so.micro_batches = 8;
    so.chunks = std::string(style) == "interleaved" ? 2 : 1;
    const int V = so.stages * so.chunks;
    const auto s = cai::schedule::make(style, so, cai::schedule::partition_uniform(V, V));
    // Uniform op times, a chunk 1/v of a stage; negligible communication.
    cai::schedule::CostModel cm;
    cm.forward = 1.0 / so.chunks;
    cm.backward = 2.0 / so.chunks;
    const auto v = cai::schedule::validate_or_throw(s, cm);
    ExpandOptions eo;
    eo.forward_s = {cm.forward};
    eo.backward_s = {cm.backward};
    eo.global_batch = 64;
    const Workload w = expand_schedule(s, eo);
    const ReplayResult r = replay(w, c);
    EXPECT_NEAR(r.step_s, v.makespan, 1e-3);  // 10 µs latencies over seconds
    EXPECT_NEAR(r.bubble_mean, v.bubble_fraction, 1e-4);
    ASSERT_EQ(r.bubble.size(), 4u);
    if (std::string(style) == "1f1b") {
      bubble_1f1b = r.bubble_mean;
      EXPECT_NEAR(r.step_s, (8 + 4 - 1) * 3.0, 1e-3);
      EXPECT_NEAR(r.bubble_mean, 3.0 / 11.0, 1e-4);  // (p - 1) / (m + p - 1)
      EXPECT_NEAR(r.img_per_s, 64 / r.step_s, 1e-9);
      // measured_bubble's definition: the last stage's own wall ends (p - 1) backwards early.
      EXPECT_NEAR(r.bubble_measured[0], 3.0 / 11.0, 1e-4);
      EXPECT_NEAR(r.bubble_measured[3], 1.0 - 24.0 / (33.0 - 3 * 2.0), 1e-4);
    }
    if (std::string(style) == "interleaved") bubble_interleaved = r.bubble_mean;
  }
  EXPECT_LT(bubble_interleaved, bubble_1f1b - 0.05);
}

// The zero-bubble schedules replayed with the paper's unit costs (a stage's F = B = W = 1, a
// ZB-V chunk half of that): the simulator's step and bubble are the validator's, and the
// bubbles order as the schedule tests assert (tests/schedule/test_zero_bubble.cpp).
TEST(Replay, ZeroBubbleSchedulesMatchTheValidator) {
  for (auto [p, m] : {std::pair{4, 8}, std::pair{2, 4}}) {
    const Cluster c = test_cluster(1, p);
    std::map<std::string, double> bubble;
    for (const char* style : {"1f1b", "zbh1", "zbv"}) {
      SCOPED_TRACE(fmt::format("{} p={} m={}", style, p, m));
      cai::schedule::ScheduleOptions so;
      so.stages = p;
      so.micro_batches = m;
      so.chunks = std::string(style) == "zbv" ? 2 : 1;
      const int V = so.stages * so.chunks;
      const auto s = cai::schedule::make(style, so, cai::schedule::partition_uniform(V, V));
      cai::schedule::CostModel cm;
      cm.forward = 1.0 / so.chunks;
      cm.backward = 2.0 / so.chunks;  // B + W, half each
      const auto v = cai::schedule::validate_or_throw(s, cm);
      ExpandOptions eo;
      eo.forward_s = {cm.forward};
      eo.backward_s = {cm.backward};
      eo.backward_input_share = cm.backward_input_share;
      eo.global_batch = 8 * m;
      const ReplayResult r = replay(expand_schedule(s, eo), c);
      EXPECT_NEAR(r.step_s, v.makespan, 1e-3);  // 10 µs latencies over seconds
      EXPECT_NEAR(r.bubble_mean, v.bubble_fraction, 1e-4);
      bubble[style] = r.bubble_mean;
      std::printf("sim p=%d m=%d %-5s step %.3f s, bubble %.4f (validator %.4f)\n", p, m, style,
                  r.step_s, r.bubble_mean, v.bubble_fraction);
    }
    EXPECT_NEAR(bubble["1f1b"], (p - 1.0) / (m + p - 1.0), 1e-4);
    EXPECT_NEAR(bubble["zbh1"], (p - 1.0) / (3.0 * m + p - 1.0), 1e-4);  // the paper's ZB-H1
    EXPECT_LT(bubble["zbv"], bubble["zbh1"]);
  }
}

TEST(Replay, PipelineMemoryCurve) {
  // 1F1B keeps min(p - s, m) micro-batches' activations on stage s.
  const Cluster c = test_cluster(1, 4);
  cai::schedule::ScheduleOptions so;
  so.stages = 4;
  so.micro_batches = 8;
  const auto s = cai::schedule::make("1f1b", so, cai::schedule::partition_uniform(4, 4));
  ExpandOptions eo;
  eo.activation_bytes = {1000};
  eo.static_mem.assign(4, {});
  for (auto& m : eo.static_mem) m[static_cast<int>(MemKind::Parameters)] = 50;
  const ReplayResult r = replay(expand_schedule(s, eo), c);
  for (int st = 0; st < 4; ++st) {
    EXPECT_EQ(r.ranks[st].peak_mem, 50 + 1000 * (4 - st)) << "stage " << st;
    EXPECT_EQ(r.ranks[st].mem_at_peak[static_cast<int>(MemKind::Activations)], 1000 * (4 - st));
    EXPECT_EQ(r.ranks[st].memory.back().bytes, 50);  // everything freed by the end
    // The curve split by kind adds up at every point; at the peak it is mem_at_peak.
    for (const MemPoint& m : r.ranks[st].memory) {
      int64_t sum = 0;
      for (int64_t b : m.kinds) sum += b;
      EXPECT_EQ(sum, m.bytes);
      if (m.bytes == r.ranks[st].peak_mem) {
        EXPECT_EQ(m.kinds, r.ranks[st].mem_at_peak);
      }
    }
  }
  // Every op carries the index of the program instruction that issued it.
  const Workload w = expand_schedule(s, eo);
  for (int st = 0; st < 4; ++st)
    for (const Op& op : w.ranks[st].ops) {
      ASSERT_GE(op.instr, 0);
      ASSERT_LT(op.instr, static_cast<int>(s.programs[st].size()));
      EXPECT_EQ(op.name, s.programs[st][op.instr].str()) << "stage " << st;
    }
  // Every receive is posted where the executor posts it (schedule::receive_posting): after the
  // last op of the instruction before the one it is posted before (-1: before the first).
  for (int st = 0; st < 4; ++st) {
    const auto before = cai::schedule::receive_posting(s, st, true);
    std::map<size_t, size_t> posted_before;  // receive position -> instruction it precedes
    for (size_t i = 0; i < before.size(); ++i)
      for (size_t k : before[i]) posted_before[k] = i;
    const auto& ops = w.ranks[st].ops;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].kind != OpKind::Recv) continue;
      const size_t at = posted_before.at(static_cast<size_t>(ops[i].instr));
      const int after = ops[i].posted_after;
      ASSERT_GE(after, -1);
      ASSERT_LT(after, static_cast<int>(i));
      if (after < 0) {
        for (size_t j = 0; j < i; ++j) EXPECT_GE(static_cast<size_t>(ops[j].instr), at);
      } else {
        EXPECT_LT(static_cast<size_t>(ops[after].instr), at) << ops[i].name;
        for (size_t j = after + 1; j < i; ++j)
          if (ops[j].stream == 0) EXPECT_GE(static_cast<size_t>(ops[j].instr), at) << ops[i].name;
      }
    }
  }
}

TEST(Replay, OutputsJsonAndTrace) {
  const Cluster c = test_cluster(1, 2);
  cai::schedule::ScheduleOptions so;
  so.stages = 2;
  so.micro_batches = 2;
  so.activation_bytes = 1 << 20;
  const auto s = cai::schedule::make("1f1b", so, cai::schedule::partition_uniform(2, 2));
  ExpandOptions eo;
  eo.forward_s = {0.01};
  eo.backward_s = {0.02};
  eo.global_batch = 8;
  const Workload w = expand_schedule(s, eo);
  const ReplayResult r = replay(w, c);
  const auto j = nlohmann::json::parse(result_json(w, r));
  for (const char* k : {"step_ms", "img_per_s", "bubble", "peak_mem_bytes", "compute_ms", "comm_ms",
                        "idle_ms", "wall_s"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["peak_mem_bytes"].size(), 2u);
  const auto t = nlohmann::json::parse(result_trace(w, r));
  int forwards = 0, counters = 0;
  for (const auto& e : t["traceEvents"]) {
    if (e["ph"] == "X" && e["name"] == "F(mb=0,c=0)") ++forwards;
    if (e["ph"] == "C") ++counters;
  }
  EXPECT_EQ(forwards, 2);  // one per stage, the executor's instruction name
  EXPECT_GT(counters, 0);
}

TEST(Replay, Errors) {
  const Cluster c = test_cluster(1, 2);
  auto message = [&](const Workload& w) -> std::string {
    try {
      replay(w, c);
    } catch (const cai::Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  Workload w;
  w.ranks.resize(2);
  w.ranks[0].ops.push_back(Op::send("s", 1, 3, 10));
  EXPECT_NE(message(w).find("1 send(s) from rank 0 to rank 1 with tag 3 against 0 receive(s)"),
            std::string::npos);
  // Receives in crossed order with blocking waits on one stream: a deadlock, named per rank.
  Workload d;
  d.ranks.resize(2);
  d.ranks[0].ops = {Op::recv("r", 1, 1, 10, 0), Op::send("s", 1, 2, 10, 0)};
  d.ranks[1].ops = {Op::recv("r", 0, 2, 10, 0), Op::send("s", 0, 1, 10, 0)};
  EXPECT_NE(message(d).find("deadlocks: rank 0 op 0 (recv 'r'); rank 1 op 0 (recv 'r')"),
            std::string::npos)
      << message(d);
  Workload m = one_collective(OpKind::AllReduce, 2, 100);
  m.ranks[1].ops[0].bytes = 200;
  EXPECT_NE(message(m).find("all_reduce of 200 bytes here but all_reduce of 100 bytes"),
            std::string::npos);
  EXPECT_NE(message(one_collective(OpKind::AllReduce, 3, 1)).find("has 2 GPUs"), std::string::npos);
}

// cpu-2 runs up to 4 processes on 2 cores: ranks r and r + 2 time-share core r and exchange
// through a loopback at the shared-memory bandwidth.
TEST(Replay, OversubscribedCpuCluster) {
  const Cluster c = load_cluster(std::string(CAI_CLUSTER_DIR) + "/cpu-2.toml");
  ASSERT_EQ(c.max_ranks(), 4);
  Workload w;
  w.ranks.resize(4);
  for (auto& rp : w.ranks) rp.ops.push_back(Op::compute("F", 1.0));
  w.ranks[0].ops.push_back(Op::send("s", 2, 1, 5000000000));  // same core: 5 GB/s, 1 µs
  w.ranks[0].ops.back().deps = {0};                           // after the compute
  w.ranks[2].ops.push_back(Op::recv("r", 0, 1, 5000000000));
  const ReplayResult r = replay(w, c);
  EXPECT_NEAR(r.ranks[0].spans[0].end, 2.0, 1e-9);  // two processes on one core
  EXPECT_NEAR(r.ranks[2].spans[1].end, 3.0 + 1e-6, 1e-9);
  Workload five;
  five.ranks.resize(5);
  EXPECT_THROW(replay(five, c), cai::Error);
}

// The per-layer hook: a compute instruction becomes several ops, a gradient bucket all-reduce is
// launched on a stream of its own during the last micro-batch's backward, overlaps the next
// layer's backward, and ReduceGrads waits for it.
TEST(Replay, ExpansionHookPerLayerOpsAndBuckets) {
  const Cluster c = test_cluster(1, 4);
  cai::schedule::ScheduleOptions so;
  so.stages = 2;
  so.micro_batches = 2;
  const auto s = cai::schedule::make("1f1b", so, cai::schedule::partition_uniform(4, 2));
  ExpandOptions eo;
  eo.dp = 2;
  eo.compute = [&](const cai::schedule::Instr& in, int rank, int, int, Workload& w) {
    std::vector<Op> ops;
    const bool fwd = in.op == cai::schedule::Op::Forward;
    ops.push_back(Op::compute(fwd ? "F layer a" : "B layer b", fwd ? 0.25 : 0.5));
    if (!fwd && in.mb == so.micro_batches - 1) {  // bucket of layer b: 10 GB at 100 GB/s
      const int st = rank % 2;
      Op bucket =
          Op::collective(OpKind::AllReduce, "bucket b", w.add_group({st, 2 + st}), 10000000000, 3);
      bucket.deps = {0};
      ops.push_back(bucket);
    }
    ops.push_back(Op::compute(fwd ? "F layer b" : "B layer a", fwd ? 0.25 : 0.5));
    return ops;
  };
  const Workload w = expand_schedule(s, eo);
  const ReplayResult r = replay(w, c);
  for (int rank = 0; rank < 4; ++rank) {
    const auto& ops = w.ranks[rank].ops;
    int bucket = -1, after = -1, reduce = -1;
    for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
      if (ops[i].name == "bucket b") bucket = i, after = i + 1;
      if (ops[i].name == "ReduceGrads") reduce = i;
    }
    ASSERT_GE(bucket, 0);
    const auto& sp = r.ranks[rank].spans;
    EXPECT_NEAR(sp[bucket].start, sp[bucket - 1].end, 1e-9);  // launched after its layer
    EXPECT_LT(sp[bucket].start, sp[after].end);               // overlaps the next layer
    EXPECT_NEAR(sp[bucket].end - sp[bucket].start, 2 * 0.5 * 1e10 / 100e9 + 2 * 10e-6, 1e-6);
    EXPECT_GE(sp[reduce].start, sp[bucket].end - 1e-12);  // ReduceGrads waits for it
  }
}

namespace {

// Gradient all-reduce of a data-parallel step: compute, `bytes` over the group, compute.
Workload data_parallel(int listed, int copies, int64_t bytes) {
  Workload w;
  w.copies = copies;
  std::vector<int> all(listed);
  for (int r = 0; r < listed; ++r) all[r] = r;
  const int g = w.add_group(all, copies > 1);
  w.ranks.resize(listed);
  for (int r = 0; r < listed; ++r) {
    w.ranks[r].ops.push_back(Op::compute("B", 0.001 * (1 + r % 2)));  // alike in every copy
    w.ranks[r].ops.push_back(Op::collective(OpKind::AllReduce, "grads", g, bytes, 0));
    w.ranks[r].ops.push_back(Op::compute("OptStep", 0.0005, -1, "optimizer"));
  }
  return w;
}

}  // namespace

TEST(Fold, ReplicasPerCopy) {
  const Cluster dgx = load_cluster(std::string(CAI_CLUSTER_DIR) + "/dgx-h100-64.toml");
  EXPECT_EQ(replicas_per_copy(dgx, 16, 4), 1);  // pp 4 × tp 4: two nodes per replica
  EXPECT_EQ(replicas_per_copy(dgx, 1, 64), 8);  // data parallel: a node per copy
  EXPECT_EQ(replicas_per_copy(dgx, 2, 16), 4);
  EXPECT_EQ(replicas_per_copy(dgx, 6, 10), 10);  // no whole nodes: not folded
  EXPECT_EQ(replicas_per_copy(dgx, 64, 1), 1);
  const Cluster cpu = load_cluster(std::string(CAI_CLUSTER_DIR) + "/cpu-2.toml");
  EXPECT_EQ(replicas_per_copy(cpu, 1, 4), 4);  // ranks sharing cores: never folded
  EXPECT_EQ(replicas_per_copy(cpu, 1, 2), 2);  // one node holds the job
}

// One copy with its rings to the next copy gives the whole job's times: data parallel over 4
// nodes (NIC-bound rings), a pipeline's dp rings, and vit_train configs through the plan.
TEST(Fold, CopiesReplayLikeEveryRank) {
  const Cluster c = test_cluster(4, 2);
  for (int64_t bytes : {int64_t(4096), int64_t(100) << 20}) {
    const double whole = replay(data_parallel(8, 1, bytes), c).step_s;
    const ReplayResult folded = replay(data_parallel(2, 4, bytes), c);
    EXPECT_NEAR(folded.step_s / whole, 1.0, 1e-9) << bytes;
    const double analytic = 0.002 + 2.0 * 7 / 8 * bytes / 25e9 + 2 * 7 * 30e-6 + 0.0005;
    EXPECT_NEAR(folded.step_s / analytic, 1.0, 1e-3) << bytes;
    const auto j = nlohmann::json::parse(result_json(data_parallel(2, 4, bytes), folded));
    EXPECT_EQ(j["nproc"], 8);
    EXPECT_EQ(j["simulated_ranks"], 2);
    EXPECT_EQ(j["compute_ms"].size(), 8u);
  }
  // 1F1B over 2 stages × dp 4, gradients all-reduced per stage (2 ranks per replica, 1 per node).
  cai::schedule::ScheduleOptions so;
  so.stages = 2;
  so.micro_batches = 4;
  const auto s = cai::schedule::make("1f1b", so, cai::schedule::partition_uniform(2, 2));
  ExpandOptions eo;
  eo.forward_s = {0.01};
  eo.backward_s = {0.02};
  eo.boundary_bytes = 50 << 20;
  eo.grad_bytes = {200 << 20};
  eo.dp = 4;
  const double whole = replay(expand_schedule(s, eo), c).step_s;
  eo.dp = replicas_per_copy(c, 2, 4);
  eo.copies = 4 / eo.dp;
  ASSERT_EQ(eo.copies, 4);
  EXPECT_NEAR(replay(expand_schedule(s, eo), c).step_s / whole, 1.0, 1e-9);
  // The plan's workloads: dp 8 × tp 2 and dp 4 × pp 2 × tp 2 (ZeRO 1) on 16 GPUs of 2 nodes.
  const Cluster dgx = load_cluster(std::string(CAI_CLUSTER_DIR) + "/dgx-h100-64.toml");
  const std::vector<std::vector<std::string>> layouts = {
      {"parallel.tensor.mode=1d", "parallel.tensor.size=2"},
      {"parallel.tensor.mode=1d", "parallel.tensor.size=2", "parallel.pipeline=2",
       "parallel.num_microbatches=4", "parallel.zero_stage=1", "train.batch_size=32"}};
  for (const auto& sets : layouts) {
    const auto cfg = fmnist(sets);
    const ConfigWorkload all = workload_from_config(cfg, 16, dgx, false);
    const ConfigWorkload one = workload_from_config(cfg, 16, dgx, true);
    ASSERT_EQ(all.workload.copies, 1);
    ASSERT_GT(one.workload.copies, 1);
    ASSERT_EQ(one.workload.job_ranks(), 16);
    const ReplayResult a = replay(all.workload, dgx), b = replay(one.workload, dgx);
    EXPECT_NEAR(b.step_s / a.step_s, 1.0, 1e-9) << sets.size();
    for (size_t r = 0; r < b.ranks.size(); ++r) {
      EXPECT_NEAR(b.ranks[r].end_s, a.ranks[r].end_s, 1e-12);
      EXPECT_EQ(b.ranks[r].peak_mem, a.ranks[r].peak_mem);
    }
  }
  // Only the bulk model replays copies.
  ReplayOptions step;
  step.collectives = CollectiveModel::Step;
  EXPECT_THROW(replay(data_parallel(2, 4, 4096), c, step), cai::Error);
}

// 2d / 2.5d layouts of one replica: one copy of identical tensor slices (2d: rows of q ranks;
// 2.5d of depth > 1: depth slices of q² ranks), its column / depth / column×depth rings going on
// through the copies, replays like every rank: colossalai benchmark -m block and -m mlp, and a
// vit_train config, on 16 and 64 GPUs of dgx-h100-64 (8 per node).
TEST(Fold, TensorSlicesReplayLikeEveryRank) {
  const Cluster dgx = load_cluster(std::string(CAI_CLUSTER_DIR) + "/dgx-h100-64.toml");
  struct Case {
    cai::plan::Body body;
    std::string mode;
    int tp, depth, listed;  // listed: the ranks one copy holds
    int64_t batch;
  };
  using cai::plan::Body;
  const Case cases[] = {
      {Body::Blocks, "2d", 16, 1, 8, 8},     {Body::Blocks, "2.5d", 16, 4, 8, 8},
      {Body::Linears, "2d", 16, 1, 8, 8},    {Body::Blocks, "2d", 64, 1, 8, 16},
      {Body::Blocks, "2.5d", 64, 4, 16, 16}, {Body::Linears, "2.5d", 64, 16, 8, 32},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(
        fmt::format("{} {} {} depth {}", cai::plan::body_name(k.body), k.mode, k.tp, k.depth));
    cai::nn::ViTConfig m;
    m.embed_dim = 256, m.depth = 2, m.num_heads = 8;
    cai::plan::Layout l;
    l.body = k.body;
    l.tokens = 16;
    l.world = l.tp = k.tp;
    l.tp_mode = k.mode;
    l.tp_depth = k.depth;
    l.batch = k.batch;
    l.precision = cai::DType::BF16;
    l.gpu = true;
    l.data_parallel_plugin = false;
    const ConfigWorkload all = workload_from_plan(m, l, dgx, false);
    const ConfigWorkload one = workload_from_plan(m, l, dgx, true);
    ASSERT_EQ(all.workload.copies, 1);
    ASSERT_EQ(static_cast<int>(one.workload.ranks.size()), k.listed);
    ASSERT_EQ(one.workload.job_ranks(), k.tp);
    const ReplayResult a = replay(all.workload, dgx), b = replay(one.workload, dgx);
    EXPECT_NEAR(b.step_s / a.step_s, 1.0, 1e-9);
    for (size_t r = 0; r < b.ranks.size(); ++r) {
      EXPECT_EQ(b.ranks[r].spans.size(), a.ranks[r].spans.size());
      for (size_t i = 0; i < b.ranks[r].spans.size(); ++i) {
        EXPECT_NEAR(b.ranks[r].spans[i].start, a.ranks[r].spans[i].start, 1e-12) << r << " " << i;
        EXPECT_NEAR(b.ranks[r].spans[i].end, a.ranks[r].spans[i].end, 1e-12) << r << " " << i;
      }
      EXPECT_EQ(b.ranks[r].peak_mem, a.ranks[r].peak_mem);
    }
  }
  // A vit_train config (fmnist_tiny, 2d on 16 GPUs): folded into copies of 8 ranks.
  const auto cfg = fmnist({"parallel.tensor.mode=2d", "parallel.tensor.size=16",
                           "model.hidden_size=64", "model.num_heads=4", "train.batch_size=16"});
  const ConfigWorkload all = workload_from_config(cfg, 16, dgx, false);
  const ConfigWorkload one = workload_from_config(cfg, 16, dgx, true);
  ASSERT_EQ(one.workload.copies, 2);
  EXPECT_NEAR(replay(one.workload, dgx).step_s / replay(all.workload, dgx).step_s, 1.0, 1e-9);
  // 3d does not fold.
  cai::nn::ViTConfig m;
  m.embed_dim = 256, m.depth = 1, m.num_heads = 4;
  cai::plan::Layout l;
  l.body = Body::Blocks, l.tokens = 4, l.world = l.tp = 64, l.tp_mode = "3d", l.batch = 16;
  l.data_parallel_plugin = false;
  EXPECT_EQ(workload_from_plan(m, l, dgx, true).workload.copies, 1);
}

// Runs of compute ops merged into one activity give the spans op-by-op execution gives.
TEST(Replay, MergedComputeRunsGiveTheSameSpans) {
  const Cluster dgx = load_cluster(std::string(CAI_CLUSTER_DIR) + "/dgx-h100-64.toml");
  const auto cfg =
      fmnist({"parallel.tensor.mode=1d", "parallel.tensor.size=2", "parallel.pipeline=2",
              "parallel.num_microbatches=4", "train.batch_size=64"});
  const Workload w = workload_from_config(cfg, 8, dgx, false).workload;
  ReplayOptions each;
  each.merge_compute = false;
  const ReplayResult a = replay(w, dgx, each), b = replay(w, dgx);
  EXPECT_NEAR(b.step_s / a.step_s, 1.0, 1e-9);
  for (size_t r = 0; r < w.ranks.size(); ++r)
    for (size_t i = 0; i < w.ranks[r].ops.size(); ++i) {
      EXPECT_NEAR(b.ranks[r].spans[i].start, a.ranks[r].spans[i].start, 1e-10) << r << " " << i;
      EXPECT_NEAR(b.ranks[r].spans[i].end, a.ranks[r].spans[i].end, 1e-10) << r << " " << i;
    }
}

// The bound's collective times are the bulk replay's when the flows share no link.
TEST(Bound, CollectiveLowerBoundIsTheUncontendedReplay) {
  for (auto [nodes, gpn] : {std::pair{1, 4}, std::pair{2, 2}, std::pair{4, 1}}) {
    const Cluster c = test_cluster(nodes, gpn);
    const int n = nodes * gpn;
    std::vector<int> ring(n);
    for (int r = 0; r < n; ++r) ring[r] = r;
    for (OpKind k :
         {OpKind::AllReduce, OpKind::ReduceScatter, OpKind::AllGather, OpKind::Broadcast})
      for (int64_t S : {int64_t(4096), int64_t(64) << 20}) {
        const double sim = simulate(one_collective(k, n, S), c, CollectiveModel::Bulk);
        EXPECT_NEAR(collective_lower_bound(c, n, k, S, ring, 0) / sim, 1.0, 1e-9)
            << op_kind_name(k) << " " << nodes << "×" << gpn << " " << S;
      }
  }
}

// vit_train's ranks sit on the GPU of their mesh rank (tensor-parallel ranks consecutive, then
// stages, data parallel outermost), whatever order the workload numbers them in: a tensor group
// is one node's NVLink, not a ring across nodes.
TEST(Placement, ConfigRanksSitOnTheirMeshGpus) {
  const Cluster dgx = load_cluster(std::string(CAI_CLUSTER_DIR) + "/dgx-h100-64.toml");
  const auto cfg =
      fmnist({"parallel.tensor.mode=1d", "parallel.tensor.size=4", "parallel.pipeline=4",
              "parallel.num_microbatches=4", "train.batch_size=64"});
  const Workload w = workload_from_config(cfg, 16, dgx, false).workload;
  ASSERT_EQ(w.gpus.size(), 16u);
  int tp_collectives = 0;
  for (size_t r = 0; r < w.ranks.size(); ++r) {
    const int s = static_cast<int>(r) % 4, t = static_cast<int>(r) / 4;
    EXPECT_EQ(w.gpus[r], s * 4 + t);
    for (const Op& o : w.ranks[r].ops)
      if (is_collective(o.kind) && o.stream == 0) {
        ++tp_collectives;
        std::vector<int> g;
        for (int m : w.groups[o.group]) g.push_back(w.gpu_of(m));
        EXPECT_EQ(*std::max_element(g.begin(), g.end()) - *std::min_element(g.begin(), g.end()), 3);
      }
  }
  EXPECT_GT(tp_collectives, 0);
  // Numbered as the workload does, a tensor ring would cross the two nodes: slower.
  Workload strided = w;
  strided.gpus.clear();
  EXPECT_LT(replay(w, dgx).step_s, replay(strided, dgx).step_s);
}

// Calibrated collectives (`colossalai benchmark -g N --calibrate`): per op and group size,
// exact at a sample, log-log between samples, nothing outside the sampled range or group sizes.
TEST(CalibratedCollectives, InterpolateInLogBytesPerGroupSize) {
  const Calibration c = parse_calibration(
      R"({"collectives": [
            {"op": "all_reduce", "group": 2, "bytes": 4096, "seconds": 4e-5},
            {"op": "all_reduce", "group": 2, "bytes": 1024, "seconds": 1e-5},
            {"op": "all_reduce", "group": 4, "bytes": 1024, "seconds": 3e-5},
            {"op": "p2p", "group": 2, "bytes": 1024, "seconds": 2e-6}]})",
      "cal.json");
  bool interp = true;
  EXPECT_DOUBLE_EQ(c.collective_seconds("all_reduce", 2, 1024, &interp), 1e-5);  // sorted
  EXPECT_FALSE(interp);
  // 2048 bytes is halfway in log-bytes: the geometric mean of the neighbours' times.
  EXPECT_NEAR(c.collective_seconds("all_reduce", 2, 2048, &interp), std::sqrt(1e-5 * 4e-5), 1e-15);
  EXPECT_TRUE(interp);
  EXPECT_DOUBLE_EQ(c.collective_seconds("all_reduce", 4, 1024, nullptr), 3e-5);
  // Outside the sampled bytes, another group size or op: the network model (-1).
  EXPECT_EQ(c.collective_seconds("all_reduce", 2, 512, nullptr), -1);
  EXPECT_EQ(c.collective_seconds("all_reduce", 2, 8192, nullptr), -1);
  EXPECT_EQ(c.collective_seconds("all_reduce", 3, 1024, nullptr), -1);
  EXPECT_EQ(c.collective_seconds("all_gather", 2, 1024, nullptr), -1);
  // A broadcast round is n broadcasts; a send uses the p2p samples.
  EXPECT_DOUBLE_EQ(calibrated_collective_seconds(c, OpKind::Send, 2, 1024), 2e-6);
  EXPECT_EQ(calibrated_collective_seconds(c, OpKind::Broadcast, 2, 1024), -1);
  for (const char* bad :
       {R"({"collectives": {}})", R"({"collectives": [{"op": "all_reduce", "group": 2}]})",
        R"({"collectives": [{"op": "gossip", "group": 2, "bytes": 1, "seconds": 1}]})",
        R"({"collectives": [{"op": "all_reduce", "group": 1, "bytes": 1, "seconds": 1}]})",
        R"({"collectives": [{"op": "p2p", "group": 4, "bytes": 1, "seconds": 1}]})",
        R"({"collectives": [{"op": "all_reduce", "group": 2, "bytes": 1, "seconds": 0}]})",
        R"({"collectives": [{"op": "all_reduce", "group": 2, "bytes": 1, "seconds": 1, "x": 1}]})"})
    EXPECT_THROW(parse_calibration(bad, "c"), cai::Error) << bad;
}

// A dp 2 step with a hand-written profile: the gradient all-reduce of 1 MiB takes exactly its
// measured 12.3 ms (not the network's time), counted as measured; without samples for the group
// size it is the network model again. Both collective models; and folded copies (the job's
// group size, 8, is what the profile is looked up with).
TEST(CalibratedCollectives, ReplayTakesTheMeasuredTimeExactly) {
  const Cluster cpu = load_cluster(std::string(CAI_CLUSTER_DIR) + "/cpu-2.toml");
  const double t = 0.0123;
  const int64_t bytes = 1 << 20;
  ReplayOptions opt;
  opt.calibration = parse_calibration(fmt::format(R"({{"collectives": [
            {{"op": "all_reduce", "group": 2, "bytes": {}, "seconds": {}}},
            {{"op": "all_reduce", "group": 8, "bytes": {}, "seconds": {}}},
            {{"op": "p2p", "group": 2, "bytes": {}, "seconds": 0.004}}]}})",
                                                  bytes, t, bytes, 2 * t, bytes),
                                      "cal.json");
  for (CollectiveModel m : {CollectiveModel::Bulk, CollectiveModel::Step}) {
    opt.collectives = m;
    const ReplayResult r = replay(data_parallel(2, 1, bytes), cpu, opt);
    // Rank 1 computes 2 ms, then the all-reduce (rank 0 waits for it from 1 ms), then 0.5 ms.
    EXPECT_NEAR(r.step_s, 0.002 + t + 0.0005, 1e-12) << collective_model_name(m);
    EXPECT_NEAR(r.ranks[1].comm_total_s, t, 1e-12);
    EXPECT_EQ(r.timing.comm_measured, 1);
    EXPECT_EQ(r.timing.comm_network, 0);
    const auto j = nlohmann::json::parse(result_json(data_parallel(2, 1, bytes), r));
    EXPECT_EQ(j["comm_ops_timed"]["measured"], 1);
  }
  // Bytes outside the samples: bulk runs it as flows over the links fitted to the profile (not
  // over cpu-2's nominal shared memory, 10 times faster), counted so; exactly what the flows
  // model gives.
  opt.collectives = CollectiveModel::Bulk;
  const ReplayResult net = replay(data_parallel(2, 1, bytes / 2), cpu, opt);
  EXPECT_EQ(net.timing.comm_network, 0);
  EXPECT_EQ(net.timing.comm_flows, 1);
  EXPECT_EQ(net.timing.comm_measured, 0);
  // One sample cannot split latency from bandwidth: the fit gives about the sample's time.
  EXPECT_GT(net.ranks[1].comm_total_s, t / 2);
  EXPECT_LT(net.ranks[1].comm_total_s, 1.1 * t);
  ReplayOptions fl = opt;
  fl.collectives = CollectiveModel::Flows;
  EXPECT_NEAR(replay(data_parallel(2, 1, bytes / 2), cpu, fl).step_s, net.step_s, 1e-12);
  // Without samples of collectives the bulk model keeps the cluster's network.
  ReplayOptions none;
  const ReplayResult nominal = replay(data_parallel(2, 1, bytes / 2), cpu, none);
  EXPECT_EQ(nominal.timing.comm_network, 1);
  EXPECT_LT(nominal.ranks[1].comm_total_s, t / 10);
  // Folded: 2 listed ranks × 4 copies, a ring of 8 timed by the group-8 sample.
  const ReplayResult folded = replay(data_parallel(2, 4, bytes), test_cluster(4, 2), opt);
  EXPECT_NEAR(folded.step_s, 0.002 + 2 * t + 0.0005, 1e-12);
  EXPECT_EQ(folded.timing.comm_measured, 1);
  // A p2p send: the measured one-way time from the send's start to the receive's end.
  Workload p2p;
  p2p.ranks.resize(2);
  p2p.ranks[0].ops.push_back(Op::send("SendActivation", 1, 5, bytes));
  p2p.ranks[1].ops.push_back(Op::recv("RecvActivation", 0, 5, bytes));
  const ReplayResult pr = replay(p2p, cpu, opt);
  EXPECT_NEAR(pr.ranks[1].spans[0].end, 0.004, 1e-12);
  EXPECT_EQ(pr.timing.comm_measured, 1);
}

// A vit_train config on 2 processes of cpu-2 (DDP, ZeRO 2): every data-parallel collective the
// plan emits comes from the profile (samples spanning every size), none from the network model;
// the same layout with a profile of another group size runs its all-reduces as flows over the
// links fitted to that profile, none as measured.
TEST(CalibratedCollectives, ConfigCollectivesUseTheProfile) {
  const Cluster cpu = load_cluster(std::string(CAI_CLUSTER_DIR) + "/cpu-2.toml");
  std::string entries;
  for (const char* op : {"all_reduce", "reduce_scatter", "all_gather", "broadcast"})
    for (const char* sample :
         {"\"bytes\": 1, \"seconds\": 1e-6", "\"bytes\": 1e12, \"seconds\": 1e3"})
      entries += std::string(entries.empty() ? "" : ", ") + "{\"op\": \"" + op +
                 "\", \"group\": 2, " + sample + "}";
  ReplayOptions two, three;
  two.calibration = parse_calibration(R"({"collectives": [)" + entries + "]}", "two.json");
  for (const auto& sets : std::vector<std::vector<std::string>>{{}, {"parallel.zero_stage=2"}}) {
    const ConfigWorkload cw = workload_from_config(fmnist(sets), 2, cpu, true);
    const ReplayResult r = replay(cw.workload, cpu, two);
    EXPECT_GT(r.timing.comm_measured + r.timing.comm_interpolated, 0) << sets.size();
    EXPECT_EQ(r.timing.comm_network, 0) << sets.size();
  }
  three.calibration = parse_calibration(
      R"({"collectives": [{"op": "all_reduce", "group": 3, "bytes": 1, "seconds": 1}]})", "3");
  const ReplayResult n =
      replay(workload_from_config(fmnist({}), 2, cpu, true).workload, cpu, three);
  EXPECT_EQ(n.timing.comm_measured + n.timing.comm_interpolated, 0);
  EXPECT_GT(n.timing.comm_flows, 0);
}

// 1D tensor parallelism on GPUs as nn::column_linear_bwd runs it: a column linear's backward
// (attn.qkv, mlp.fc1) computes the input gradient, starts its all-reduce on a communication
// stream (NCCL's), computes the weight gradient meanwhile and then waits; the row linears' forward
// all-reduces stay on the compute stream. So in every block's backward the op is two halves with
// the all-reduce between them, and a replay where the all-reduce takes as long as the
// weight-gradient half costs no more than the compute alone (exactly: the collectives measured at a
// fixed time below the halves').
TEST(TensorParallel, ColumnBackwardAllReduceOverlapsTheWeightGradient) {
  const Cluster cpu = load_cluster(std::string(CAI_CLUSTER_DIR) + "/cpu-2.toml");
  // On CPUs the MPI all-reduce progresses only in the wait: every collective on the compute
  // stream, no op split.
  const ConfigWorkload on_cpu = workload_from_config(
      fmnist({"parallel.tensor.mode=1d", "parallel.tensor.size=2"}), 2, cpu, true);
  for (const Op& o : on_cpu.workload.ranks[0].ops) {
    EXPECT_EQ(o.share, 1.0) << o.name;
    if (is_collective(o.kind)) {
      EXPECT_EQ(o.stream, 0) << o.name;
    }
  }
  const ConfigWorkload cw = workload_from_config(
      fmnist({"parallel.tensor.mode=1d", "parallel.tensor.size=2", "train.device=cuda"}), 2, cpu,
      true);
  const auto& ops = cw.workload.ranks[0].ops;
  int split = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& o = ops[i];
    const std::string& n = o.name;
    if (o.kind != OpKind::AllReduce || n.find("input grad") == std::string::npos) continue;
    ++split;
    ASSERT_EQ(o.stream, 1) << n;
    ASSERT_FALSE(o.deps.empty()) << n;
    for (int d : o.deps) EXPECT_EQ(d, o.deps[0]) << n;  // the input-gradient half (issued after it)
    const Op& dx = ops[o.deps[0]];
    ASSERT_LT(i + 2, ops.size());
    const Op& dw = ops[i + 1];
    const Op& wait = ops[i + 2];
    EXPECT_NE(dx.name.find(" bwd dx"), std::string::npos) << dx.name;
    EXPECT_NE(dw.name.find(" bwd dw"), std::string::npos) << dw.name;
    EXPECT_EQ(dx.share, 0.5);
    EXPECT_EQ(dw.share, 0.5);
    EXPECT_EQ(dx.cal_key, dw.cal_key);
    EXPECT_EQ(wait.seconds, 0.0);
    EXPECT_EQ(wait.deps, std::vector<int>{static_cast<int>(i)}) << wait.name;
  }
  EXPECT_EQ(split, 2 * 4);  // fmnist_tiny: 4 blocks, attn.qkv and mlp.fc1 each
  for (const Op& o : ops) {
    if (o.kind == OpKind::AllReduce && o.name.find("input grad") == std::string::npos &&
        o.name.find("attn.proj") != std::string::npos) {
      EXPECT_EQ(o.stream, 0) << o.name;
    }
  }
  // Every all-reduce measured at τ: the serial ones (the blocks' 8 forward ones and the step's
  // others) add τ each to the step; the 8 backward ones, shorter than their weight-gradient
  // halves, nothing (8τ more if they did not overlap).
  auto at = [](double tau) {
    ReplayOptions o;
    o.calibration = parse_calibration(
        fmt::format(R"({{"collectives": [{{"op": "all_reduce", "group": 2, "bytes": 1,
                                           "seconds": {0}}},
                                          {{"op": "all_reduce", "group": 2, "bytes": 1e12,
                                           "seconds": {0}}}]}})",
                    tau),
        "cal.json");
    return o;
  };
  const double tiny = 1e-12;  // the profile's entries need a time
  const ReplayResult zero = replay(cw.workload, cpu, at(tiny));
  double shortest = 1e300;
  for (size_t i = 0; i < ops.size(); ++i)
    if (ops[i].name.find(" bwd dw") != std::string::npos)
      shortest = std::min(shortest, zero.ranks[0].spans[i].end - zero.ranks[0].spans[i].start);
  ASSERT_GT(shortest, 0);
  ASSERT_LT(shortest, 1);
  const double tau = 0.5 * shortest;
  const ReplayResult r = replay(cw.workload, cpu, at(tau));
  int serial = 0;  // the blocks' 8 forward ones and the rest of the step's (the head, the norm)
  for (const Op& o : ops)
    serial += is_collective(o.kind) && o.name.find("input grad") == std::string::npos;
  EXPECT_GE(serial, 8);
  EXPECT_NEAR(r.step_s - zero.step_s, serial * (tau - tiny), 1e-9) << "tau " << tau;
}

// The replay's memory curve counts each layer as the plan's replay does (its cache from the
// start of its forward to the end of its backward, the output, the output's gradient and the
// working tensors while its ops run), and ZeRO's buffers as DataParallelPlugin holds them (the
// stage 2/3 layer gradients until their bucket is packed, the packed buckets in flight, the
// stage 3 gathers and gathered values, the stage 1/2 all-gathers after the step), so the
// simulated peak is the plan's predicted one: one process, DDP and ZeRO 1-3 on 2 (with gradient
// accumulation too), tensor 1d. Before, the working tensors were missing (the CPU peaks were
// 10-20% below the measured ones), and then ZeRO-2/3's windows.
TEST(Memory, SimulatedPeakIsThePlansWhereLayersSetIt) {
  const Cluster cpu = load_cluster(std::string(CAI_CLUSTER_DIR) + "/cpu-2.toml");
  const std::vector<std::pair<int, std::vector<std::string>>> cases = {
      {1, {}},
      {2, {}},
      {2, {"parallel.zero_stage=1"}},
      {2, {"parallel.zero_stage=2", "train.batch_size=4"}},  // batch 2 per rank: the
      {2, {"parallel.zero_stage=3", "train.batch_size=4"}},  // windows are much of the peak
      {2, {"parallel.zero_stage=2", "train.batch_size=8", "train.gradient_accumulation=2"}},
      {2, {"parallel.zero_stage=3", "train.batch_size=8", "train.gradient_accumulation=2"}},
      {2, {"parallel.tensor.mode=1d", "parallel.tensor.size=2"}}};
  for (const auto& [n, sets] : cases) {
    const ConfigWorkload cw = workload_from_config(fmnist(sets), n, cpu, false);
    const ReplayResult r = replay(cw.workload, cpu);
    const double plan_peak = static_cast<double>(cw.plan.peak());
    EXPECT_NEAR(static_cast<double>(r.ranks[0].peak_mem) / plan_peak, 1.0, 0.005)
        << n << " processes, " << fmt::format("{}", fmt::join(sets, " ")) << ": simulated "
        << r.ranks[0].peak_mem << ", plan " << cw.plan.peak();
  }
  // Pipelines: the boundary buffers as the executor holds them (a receive posted ahead per kind,
  // each received buffer the consumer's input, each output alive until its send completes; the
  // plan's replay drops a send's buffer at the next instruction, so the replay is a little
  // above it). Before, the compute instructions of the plan's programs carried no boundary bytes
  // and the sends freed buffers nobody had counted: the stage 0 peaks were 1-3% below the
  // plan's and 4-7% below the measured ones.
  for (const char* style : {"gpipe", "1f1b", "interleaved", "zbh1", "zbv"}) {
    std::vector<std::string> sets = {"parallel.pipeline=2", "parallel.num_microbatches=4",
                                     std::string("parallel.pp_style=") + style};
    if (std::string(style) == "interleaved" || std::string(style) == "zbv")
      sets.push_back("parallel.num_model_chunks=2");
    const ConfigWorkload cw = workload_from_config(fmnist(sets), 2, cpu, false);
    const ReplayResult r = replay(cw.workload, cpu);
    const double plan_peak = static_cast<double>(cw.plan.stages[0].memory.peak);
    const double ratio = static_cast<double>(r.ranks[0].peak_mem) / plan_peak;
    EXPECT_GE(ratio, 0.999) << style << ": simulated " << r.ranks[0].peak_mem << ", plan "
                            << plan_peak;
    EXPECT_LE(ratio, 1.03) << style << ": simulated " << r.ranks[0].peak_mem << ", plan "
                           << plan_peak;
  }
}

// DDP's bucket all-reduces where DataParallelPlugin starts them: a bucket completed by a layer's
// backward waits for the next overlap point: the next block's, before its attention backward (its
// MLP and projection backward done, last to first as the executor runs them), or the embedding's,
// before its backward; the embedding's own buckets go at the end of the backward, before
// ReduceGrads. Small buckets: several per layer.
TEST(DataParallel, DdpBucketsStartAtTheNextOverlapPoint) {
  const Cluster cpu = load_cluster(std::string(CAI_CLUSTER_DIR) + "/cpu-2.toml");
  const ConfigWorkload cw =
      workload_from_config(fmnist({"parallel.ddp_bucket_cap_mb=0.02"}), 2, cpu, false);
  const auto& ops = cw.workload.ranks[0].ops;
  auto index = [&](const std::string& name) {
    for (int i = 0; i < static_cast<int>(ops.size()); ++i)
      if (ops[i].name == name) return i;
    return -1;
  };
  int buckets = 0, at_points = 0, at_embedding = 0;
  while (index(fmt::format("bucket {} all_reduce", buckets)) >= 0) ++buckets;
  ASSERT_GE(buckets, 3);
  const int reduce = index("ReduceGrads");
  ASSERT_GE(reduce, 0);
  for (int b = 0; b < buckets; ++b) {
    const int ar = index(fmt::format("bucket {} all_reduce", b));
    EXPECT_LT(ar, reduce) << b;
    int n = ar + 1;  // past the buckets launched at the same point
    while (n < reduce && ops[n].name.rfind("bucket ", 0) == 0) ++n;
    const std::string& next = ops[n].name;
    if (next.size() > 9 && next.substr(next.size() - 9) == " attn bwd") {
      ++at_points;
      const std::string block = next.substr(0, next.size() - 9);
      EXPECT_LT(index(block + " mlp.fc2 bwd"), ar) << b;
      EXPECT_LT(index(block + " attn.proj bwd"), ar) << b;
      EXPECT_GT(index(block + " attn.qkv bwd"), ar) << b;
    } else if (next == "embedding cls_pos bwd") {  // completed by blocks.0
      ++at_embedding;
      EXPECT_LT(index("blocks.0 attn.qkv bwd"), ar) << b;
    } else {  // the embedding's: no point follows
      EXPECT_EQ(next, "ReduceGrads") << b;
      EXPECT_GT(ar, index("embedding patch_embed.proj bwd")) << b;
    }
  }
  EXPECT_GE(at_points, buckets / 2);
  EXPECT_GE(at_embedding, 1);
  EXPECT_LT(at_points + at_embedding, buckets);
}

// parallel.ddp_bucket_hold: completed buckets wait at the overlap points until that share of the
// gradients is final, then launch together (schedule::launch_held_buckets, the executor's rule):
// 0 as above, 0.5 a first burst holding at least half the bytes and fewer bursts, 1 one burst at
// the end of the backward.
TEST(DataParallel, HeldBucketsLaunchTogetherOnceTheShareIsFinal) {
  const Cluster cpu = load_cluster(std::string(CAI_CLUSTER_DIR) + "/cpu-2.toml");
  struct Bursts {
    std::vector<double> bytes;  // per burst (a run of bucket launches with no op between)
    int first = -1, reduce = -1, last = -1;
  };
  auto bursts = [&](double hold) {
    const ConfigWorkload cw =
        workload_from_config(fmnist({"parallel.ddp_bucket_cap_mb=0.02",
                                     fmt::format("parallel.ddp_bucket_hold={}", hold)}),
                             2, cpu, false);
    const auto& ops = cw.workload.ranks[0].ops;
    Bursts b;
    for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
      if (ops[i].name == "ReduceGrads") b.reduce = i;
      if (ops[i].name.rfind("bucket ", 0) != 0) continue;
      if (b.first < 0) b.first = i;
      if (b.last != i - 1 || b.bytes.empty()) b.bytes.push_back(0);
      b.bytes.back() += ops[i].bytes;
      b.last = i;
    }
    return b;
  };
  const Bursts none = bursts(0), half = bursts(0.5), all = bursts(1);
  auto total = [](const Bursts& b) {
    double t = 0;
    for (double x : b.bytes) t += x;
    return t;
  };
  ASSERT_GE(none.bytes.size(), 3u);
  EXPECT_DOUBLE_EQ(total(half), total(none));
  EXPECT_GE(half.bytes[0], 0.5 * total(half));
  EXPECT_LT(half.bytes[0], total(half));
  EXPECT_GT(half.first, none.first);
  EXPECT_LT(half.bytes.size(), none.bytes.size());
  ASSERT_EQ(all.bytes.size(), 1u);
  EXPECT_DOUBLE_EQ(all.bytes[0], total(none));
  EXPECT_EQ(all.last + 1, all.reduce);
}

// parallel.ddp_exchange: the DDP buckets go where the all-reduces went, as the plan's all-gathers
// of dp × the bucket ("bucket b exchange"), moved by the copy engines (no share of the GPU), and
// the step reads every other rank's copy too (AdamW's 36 bytes per element + 8 per other rank).
TEST(DataParallel, CopyEngineExchangeBucketsAreCopiesTheStepReads) {
  const Cluster c = load_cluster(std::string(CAI_CLUSTER_DIR) + "/h200-2.toml");
  auto make = [&](bool ex) {
    return workload_from_config(
        fmnist({"train.device=cuda", "parallel.ddp_bucket_cap_mb=0.02",
                fmt::format("parallel.ddp_exchange={}", ex ? "true" : "false")}),
        2, c, false);
  };
  const ConfigWorkload nccl = make(false), ex = make(true);
  const auto& a = nccl.workload.ranks[0].ops;
  const auto& b = ex.workload.ranks[0].ops;
  ASSERT_EQ(a.size(), b.size());
  int buckets = 0;
  double opt_a = 0, opt_b = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].name == "OptStep") opt_a = a[i].mem_bytes, opt_b = b[i].mem_bytes;
    if (a[i].name.rfind("bucket ", 0) != 0) continue;
    ++buckets;
    EXPECT_EQ(a[i].kind, OpKind::AllReduce);
    EXPECT_FALSE(a[i].copy_engine);
    EXPECT_EQ(b[i].kind, OpKind::AllGather) << b[i].name;
    EXPECT_TRUE(b[i].copy_engine) << b[i].name;
    EXPECT_EQ(b[i].name, a[i].name.substr(0, a[i].name.size() - 10) + "exchange");
    EXPECT_EQ(b[i].bytes, 2 * a[i].bytes) << b[i].name;
  }
  EXPECT_GE(buckets, 3);
  ASSERT_GT(opt_a, 0);
  EXPECT_DOUBLE_EQ(opt_b / opt_a, 44.0 / 36.0);
}

// ZeRO's collectives where DataParallelPlugin issues them, with its host waits (the simulator
// once put every data-parallel collective, ZeRO-3's forward gathers and ZeRO-1/2's parameter
// all-gathers included, behind the last backward): ZeRO-3 gathers each layer before its forward
// and backward, the next layer's gather issued before this layer computes (prefetch 1), and the
// layer waits for its own; ZeRO-2 keeps at most 2 reduce-scatters in flight (the pack of bucket
// b after bucket b-2's completion); ZeRO-1/2's all-gathers of the stepped shards are deferred to
// the next forward (schedule::ParamGatherQueue).
TEST(DataParallel, ZeroCollectivesWhereTheExecutorIssuesThem) {
  const Cluster cpu = load_cluster(std::string(CAI_CLUSTER_DIR) + "/cpu-2.toml");
  auto index = [](const Workload& w, const std::string& name, int from = 0) {
    const auto& ops = w.ranks[0].ops;
    for (int i = from; i < static_cast<int>(ops.size()); ++i)
      if (ops[i].name == name) return i;
    return -1;
  };
  {  // ZeRO-3
    const ConfigWorkload cw =
        workload_from_config(fmnist({"parallel.zero_stage=3"}), 2, cpu, false);
    const Workload& w = cw.workload;
    const ReplayResult r = replay(w, cpu);
    const auto& sp = r.ranks[0].spans;
    for (int b = 0; b < 4; ++b) {
      const std::string layer = fmt::format("blocks.{}", b);
      const int gather = index(w, layer + " parameters all_gather");
      const int first = index(w, layer + " norm1");
      const int unpack = index(w, layer + " gather unpack");
      ASSERT_GE(gather, 0) << layer;
      ASSERT_GT(first, unpack);
      EXPECT_EQ(w.ranks[0].ops[gather].stream, 3);
      EXPECT_GE(sp[unpack].start, sp[gather].end - 1e-12) << layer;  // the host waits for it
      EXPECT_GE(sp[first].start, sp[unpack].end - 1e-12) << layer;
      if (b < 3) {  // the next layer's gather goes out before this layer computes
        EXPECT_LT(index(w, fmt::format("blocks.{} parameters all_gather", b + 1)), first) << layer;
      }
      // and again before its backward, after the forward's
      const int again = index(w, layer + " parameters all_gather", gather + 1);
      EXPECT_GT(again, index(w, "blocks.3 norm1")) << layer;
      EXPECT_LT(again, index(w, layer + " norm1 bwd")) << layer;
    }
  }
  {  // ZeRO-2, ~14 buckets
    const ConfigWorkload cw = workload_from_config(
        fmnist({"parallel.zero_stage=2", "parallel.zero_bucket_size_in_m=0.01"}), 2, cpu, false);
    const Workload& w = cw.workload;
    const ReplayResult r = replay(w, cpu);
    const auto& sp = r.ranks[0].spans;
    int buckets = 0;
    while (index(w, fmt::format("bucket {} reduce_scatter", buckets)) >= 0) ++buckets;
    ASSERT_GE(buckets, 4);
    // Launch order: the backward's, and within a layer completing several buckets the order its
    // parameters (model order) complete them, as the executor's grads_ready.
    std::vector<int> launched;
    for (int b = 0; b < buckets; ++b) launched.push_back(b);
    std::sort(launched.begin(), launched.end(), [&](int a, int b) {
      return index(w, fmt::format("bucket {} pack", a)) <
             index(w, fmt::format("bucket {} pack", b));
    });
    EXPECT_NE(launched, [&] {
      std::vector<int> v(launched);
      std::sort(v.begin(), v.end());
      return v;
    }()) << "the embedding's buckets launch in its parameters' order, not the buckets'";
    for (int j = 0; j < buckets; ++j) {
      const int b = launched[j];
      const int rs = index(w, fmt::format("bucket {} reduce_scatter", b));
      const int add = index(w, fmt::format("bucket {} shard add", b));
      ASSERT_GT(add, rs);
      EXPECT_GE(sp[add].start, sp[rs].end - 1e-12) << b;
      if (j >= 2) {  // the window is full: the bucket launched two before completes first
        EXPECT_LT(index(w, fmt::format("bucket {} shard add", launched[j - 2])),
                  index(w, fmt::format("bucket {} pack", b)))
            << b;
      }
    }
    // The step's gathers are deferred to the next forward (schedule::ParamGatherQueue; the
    // replayed step's forward carries the last step's): nothing is gathered after the step; the
    // first layers' bucket (the last in backward order) is unpacked before the first block runs,
    // and bucket 0 (the last layers') is issued only after that, while the blocks compute.
    const int step = index(w, "OptStep");
    EXPECT_EQ(index(w, "bucket 0 parameters all_gather", step), -1);
    const int gather = index(w, "bucket 0 parameters all_gather");
    const int unpack = index(w, "bucket 0 parameters unpack");
    const int first_unpack = index(w, fmt::format("bucket {} parameters unpack", buckets - 1));
    ASSERT_GE(gather, 0);
    ASSERT_GT(unpack, gather);
    EXPECT_LT(first_unpack, index(w, "blocks.0 norm1"));
    EXPECT_LT(first_unpack, gather);
    EXPECT_LT(index(w, "blocks.0 norm1"), gather);
    EXPECT_LT(unpack, index(w, "blocks.3 norm1 bwd"));
    EXPECT_EQ(w.ranks[0].ops[gather].stream, 3);
    EXPECT_GE(sp[unpack].start, sp[gather].end - 1e-12);
  }
  {  // The plugin's copies are one copy_spans launch per bucket or gather: with a profile's
     // "copy|call" of 1 ms, an unpack of a block's gathered values takes 1 ms, whatever the
     // roofline says.
    const Calibration cal =
        parse_calibration(R"({"samples": {"copy|call": [[1, 512, 1e-3]]}})", "calls.json");
    const ConfigWorkload cw =
        workload_from_config(fmnist({"parallel.zero_stage=3"}), 2, cpu, false);
    ReplayOptions opt;
    opt.calibration = cal;
    const ReplayResult r = replay(cw.workload, cpu, opt);
    const int unpack = index(cw.workload, "blocks.0 gather unpack");
    const int pack = index(cw.workload, "blocks.1 gather pack");
    ASSERT_GE(unpack, 0);
    const auto& lp = cw.plan.stages[0].layer_plans[1];  // blocks.0
    ASSERT_EQ(lp.name, "blocks.0");
    ASSERT_GT(lp.parameter_numels.size(), 1u);
    EXPECT_NEAR(r.ranks[0].spans[unpack].end - r.ranks[0].spans[unpack].start, 1e-3, 1e-9);
    EXPECT_NEAR(r.ranks[0].spans[pack].end - r.ranks[0].spans[pack].start, 1e-3, 1e-9);
    // Without the entry, the roofline: microseconds.
    const ReplayResult bare = replay(cw.workload, cpu);
    EXPECT_LT(bare.ranks[0].spans[unpack].end - bare.ranks[0].spans[unpack].start, 1e-4);
  }
  {  // ZeRO-1: DDP's all-reduces; the shards' all-gathers of the last step in the forward
    const ConfigWorkload cw =
        workload_from_config(fmnist({"parallel.zero_stage=1"}), 2, cpu, false);
    const Workload& w = cw.workload;
    EXPECT_LT(index(w, "bucket 0 all_reduce"), index(w, "ReduceGrads"));
    const int gather = index(w, "bucket 0 parameters all_gather");
    ASSERT_GE(gather, 0);
    EXPECT_LT(gather, index(w, "blocks.0 norm1"));
    EXPECT_EQ(index(w, "bucket 0 parameters all_gather", index(w, "OptStep")), -1);
  }
}

// SM sharing (the profile's "overlap"): while a collective moves data, the compute of its ranks
// runs at 1 - share of the GPU; waiting for a late peer takes nothing. Rank 0 computes 10 ms on
// stream 0 beside an all-reduce on stream 1 that rank 1 joins after computing 5 ms; the
// all-reduce then moves 4 ms (calibrated), during which rank 0 does 3 ms of its work: it ends
// at 11 ms. Rank 1's compute ended before the transfer: untouched.
TEST(Overlap, ComputeBesideMovingDataRunsAtTheRestOfTheGpu) {
  const Cluster c = load_cluster(std::string(CAI_CLUSTER_DIR) + "/h200-2.toml");
  const int64_t bytes = 1 << 20;
  auto profile = [&](const char* overlap) {
    return parse_calibration(
        fmt::format(R"({{"collectives": [{{"op": "all_reduce", "group": 2, "bytes": {},
                         "seconds": 0.004}}]{}}})",
                    bytes, overlap),
        "cal.json");
  };
  Workload w;
  const int g = w.add_group({0, 1});
  w.ranks.resize(2);
  w.ranks[0].ops.push_back(Op::compute("F", 0.010));
  w.ranks[0].ops.push_back(Op::collective(OpKind::AllReduce, "grads", g, bytes, 1));
  w.ranks[1].ops.push_back(Op::compute("F", 0.005));
  w.ranks[1].ops.push_back(Op::collective(OpKind::AllReduce, "grads", g, bytes, 1));
  w.ranks[1].ops.back().deps = {0};
  ReplayOptions opt;
  opt.calibration = profile(
      R"(, "overlap": {"op": "all_reduce", "group": 2, "bytes": 1e6, "alone_seconds": 0.3,
                       "beside_seconds": 0.4})");
  EXPECT_NEAR(opt.calibration.overlap_share, 0.25, 1e-12);
  for (bool merge : {true, false}) {
    opt.merge_compute = merge;
    const ReplayResult r = replay(w, c, opt);
    EXPECT_NEAR(r.ranks[0].spans[0].end, 0.011, 1e-9) << merge;
    EXPECT_NEAR(r.ranks[0].spans[1].end, 0.009, 1e-9);
    EXPECT_NEAR(r.ranks[1].spans[0].end, 0.005, 1e-9);
  }
  {  // Moved by the copy engines (the copy-engine exchange): no kernel, no share.
    Workload ce = w;
    for (auto& rk : ce.ranks) rk.ops[1].copy_engine = true;
    const ReplayResult r = replay(ce, c, opt);
    EXPECT_NEAR(r.ranks[0].spans[0].end, 0.010, 1e-9);
    EXPECT_NEAR(r.ranks[0].spans[1].end, 0.009, 1e-9);
  }
  // Without the entry (or beside faster than alone): no share.
  opt.calibration = profile("");
  EXPECT_EQ(opt.calibration.overlap_share, 0);
  EXPECT_NEAR(replay(w, c, opt).ranks[0].spans[0].end, 0.010, 1e-9);
  opt.calibration = profile(
      R"(, "overlap": {"op": "all_reduce", "group": 2, "bytes": 1e6, "alone_seconds": 0.4,
                       "beside_seconds": 0.3})");
  EXPECT_EQ(opt.calibration.overlap_share, 0);
  EXPECT_THROW(profile(R"(, "overlap": {"alone_seconds": 0.4})"), cai::Error);
}

// GPU speeds (the profile's "gpu_speeds": every GPU of the measuring host timing one block at
// once): a rank on GPU g computes at block_seconds[0] / block_seconds[g] of the profile's speed,
// and a data-parallel step follows the slower GPU. Each rank computes 10 ms (as GPU 0) and then
// all-reduces (4 ms, calibrated): GPU 1 takes 10.5 ms, so the all-reduce ends at 14.5 ms on both.
// A cluster with more GPUs than the profile measured repeats the measured ones.
TEST(GpuSpeeds, ADataParallelStepFollowsTheSlowerGpu) {
  const int64_t bytes = 1 << 20;
  auto profile = [&](const std::string& speeds) {
    return parse_calibration(
        fmt::format(R"({{"collectives": [{{"op": "all_reduce", "group": 2, "bytes": {0},
                         "seconds": 0.004}}, {{"op": "all_reduce", "group": 4, "bytes": {0},
                         "seconds": 0.004}}]{1}}})",
                    bytes, speeds),
        "cal.json");
  };
  auto dp = [&](int n) {
    Workload w;
    std::vector<int> all(n);
    for (int r = 0; r < n; ++r) all[r] = r;
    const int g = w.add_group(all);
    w.ranks.resize(n);
    for (auto& rk : w.ranks) {
      rk.ops.push_back(Op::compute("F", 0.010));
      rk.ops.push_back(Op::collective(OpKind::AllReduce, "grads", g, bytes, 1));
      rk.ops.back().deps = {0};
    }
    return w;
  };
  ReplayOptions opt;
  opt.calibration =
      profile(R"(, "gpu_speeds": {"sustained_seconds": 3.0, "block_seconds": [0.002, 0.0021]})");
  ASSERT_EQ(opt.calibration.gpu_time_factors.size(), 2u);
  EXPECT_NEAR(opt.calibration.gpu_time_factor(1), 1.05, 1e-12);
  EXPECT_NEAR(opt.calibration.gpu_time_factor(3), 1.05, 1e-12);
  {
    const Cluster c = load_cluster(std::string(CAI_CLUSTER_DIR) + "/h200-2.toml");
    const ReplayResult r = replay(dp(2), c, opt);
    EXPECT_NEAR(r.ranks[0].spans[0].end, 0.010, 1e-9);
    EXPECT_NEAR(r.ranks[1].spans[0].end, 0.0105, 1e-9);
    EXPECT_NEAR(r.step_s, 0.0145, 1e-9);
    ASSERT_EQ(r.timing.gpu_time_factors.size(), 2u);
    EXPECT_NEAR(r.timing.gpu_time_factors[1], 1.05, 1e-12);
    // Without the entry every GPU is GPU 0.
    ReplayOptions plain;
    plain.calibration = profile("");
    EXPECT_TRUE(plain.calibration.gpu_time_factors.empty());
    EXPECT_NEAR(replay(dp(2), c, plain).step_s, 0.014, 1e-9);
  }
  {
    const Cluster c = load_cluster(std::string(CAI_CLUSTER_DIR) + "/h200-4.toml");
    const ReplayResult r = replay(dp(4), c, opt);
    EXPECT_NEAR(r.ranks[2].spans[0].end, 0.010, 1e-9);
    EXPECT_NEAR(r.ranks[3].spans[0].end, 0.0105, 1e-9);
    EXPECT_NEAR(r.step_s, 0.0145, 1e-9);
  }
  for (const char* bad : {R"(, "gpu_speeds": {"block_seconds": []})",
                          R"(, "gpu_speeds": {"block_seconds": [0.002, -1]})",
                          R"(, "gpu_speeds": {"block_seconds": [0.002], "clock": 1})",
                          R"(, "gpu_speeds": {"sustained_seconds": 3.0})"})
    EXPECT_THROW(profile(bad), cai::Error) << bad;
}

namespace {
// Rank 0 computes 10 ms and sends `bytes` to rank 1, which computes 4 ms with the receive
// posted, receives, and computes 2 ms more.
Workload posted_receive_workload(int64_t bytes) {
  Workload w;
  w.ranks.resize(2);
  w.ranks[0].ops.push_back(Op::compute("F", 0.010));
  w.ranks[0].ops.push_back(Op::send("SendActivation", 1, 5, bytes));
  w.ranks[0].ops.back().deps = {0};
  w.ranks[1].ops.push_back(Op::compute("F", 0.004));
  w.ranks[1].ops.push_back(Op::recv("RecvActivation", 0, 5, bytes));
  w.ranks[1].ops.push_back(Op::compute("F", 0.002));
  return w;
}
}  // namespace

// A posted receive holds the share from its posting (the start, for the first of its kind) until
// its data is in, as NCCL's receive kernel waits on its SMs: rank 1 computes 4 ms while its
// receive is posted (5.33 ms at 0.75 of the GPU), then waits for rank 0's send, which leaves
// after 10 ms of compute and takes 1 ms (p2p calibrated).
TEST(Overlap, PostedReceiveHoldsItsShareUntilItsDataIsIn) {
  const Cluster c = load_cluster(std::string(CAI_CLUSTER_DIR) + "/h200-2.toml");
  const int64_t bytes = 1 << 20;
  ReplayOptions opt;
  opt.calibration = parse_calibration(
      fmt::format(R"({{"collectives": [{{"op": "p2p", "group": 2, "bytes": {}, "seconds": 0.001}}],
                   "overlap": {{"op": "all_reduce", "group": 2, "bytes": 1e6,
                                "alone_seconds": 0.3, "beside_seconds": 0.4}}}})",
                  bytes),
      "cal.json");
  Workload w = posted_receive_workload(bytes);
  for (bool merge : {true, false}) {
    opt.merge_compute = merge;
    const ReplayResult r = replay(w, c, opt);
    EXPECT_NEAR(r.ranks[1].spans[0].end, 0.004 / 0.75, 1e-9) << merge;
    EXPECT_NEAR(r.ranks[1].spans[1].end, 0.011, 1e-9);
    EXPECT_NEAR(r.ranks[1].spans[2].end, 0.013, 1e-9);  // nothing posted after: full speed
    EXPECT_NEAR(r.ranks[0].spans[0].end, 0.010, 1e-9);
  }
  // With the profile's own "posted" entry (a block 0.3 ms alone, 0.32 beside a waiting receive:
  // 1/16 of the GPU), the receive holds that share instead: 4 ms at 15/16.
  opt.calibration = parse_calibration(
      fmt::format(R"({{"collectives": [{{"op": "p2p", "group": 2, "bytes": {}, "seconds": 0.001}}],
                   "overlap": {{"op": "all_reduce", "group": 2, "bytes": 1e6,
                                "alone_seconds": 0.3, "beside_seconds": 0.4}},
                   "posted": {{"op": "p2p", "bytes": 1e6, "alone_seconds": 0.3,
                               "beside_seconds": 0.32}}}})",
                  bytes),
      "cal.json");
  EXPECT_NEAR(opt.calibration.posted_share, 1.0 / 16, 1e-12);
  for (bool merge : {true, false}) {
    opt.merge_compute = merge;
    const ReplayResult r = replay(w, c, opt);
    EXPECT_NEAR(r.ranks[1].spans[0].end, 0.004 * 16 / 15, 1e-9) << merge;
    EXPECT_NEAR(r.ranks[1].spans[1].end, 0.011, 1e-9);
  }
  EXPECT_EQ(parse_calibration("{}", "cal.json").posted_share, -1);
  EXPECT_THROW(parse_calibration(R"({"posted": {"op": "p2p", "bytes": 1e6, "alone_seconds": 0.3}})",
                                 "cal.json"),
               cai::Error);
}

// A "posted" list (the block at several batches: the share grows as the batch shrinks) gives the
// share at the workload's micro-batch, interpolated in log(batch) between the entries and the
// end's beyond them: at 64 samples 1/4 of the GPU (1 - 0.3 / 0.4), at 256 1/16, at 128 halfway
// (5/32), below 64 and above 256 the ends'; a workload without a micro-batch takes the largest
// batch's. Rank 1's 4 ms beside its posted receive stretch accordingly.
TEST(Overlap, PostedShareFollowsTheMicroBatch) {
  const Cluster c = load_cluster(std::string(CAI_CLUSTER_DIR) + "/h200-2.toml");
  const int64_t bytes = 1 << 20;
  ReplayOptions opt;
  opt.calibration = parse_calibration(
      fmt::format(R"({{"collectives": [{{"op": "p2p", "group": 2, "bytes": {}, "seconds": 0.001}}],
                   "overlap": {{"op": "all_reduce", "group": 2, "bytes": 1e6,
                                "alone_seconds": 0.3, "beside_seconds": 0.4}},
                   "posted": [{{"op": "p2p", "bytes": 1e6, "batch": 256, "max_ctas": 2,
                                "alone_seconds": 0.3, "beside_seconds": 0.32}},
                              {{"op": "p2p", "bytes": 1e6, "batch": 64, "max_ctas": 2,
                                "alone_seconds": 0.3, "beside_seconds": 0.4}}]}})",
                  bytes),
      "cal.json");
  const Calibration& cal = opt.calibration;
  EXPECT_NEAR(cal.posted_share, 1.0 / 16, 1e-12);
  EXPECT_NEAR(cal.posted_share_at(64), 0.25, 1e-12);
  EXPECT_NEAR(cal.posted_share_at(128), 0.5 * (0.25 + 1.0 / 16), 1e-12);
  EXPECT_NEAR(cal.posted_share_at(16), 0.25, 1e-12);
  EXPECT_NEAR(cal.posted_share_at(1024), 1.0 / 16, 1e-12);
  EXPECT_NEAR(cal.posted_share_at(0), 1.0 / 16, 1e-12);
  Workload w = posted_receive_workload(bytes);
  for (const auto& [mb, share] : std::vector<std::pair<int64_t, double>>{
           {64, 0.25}, {128, 5.0 / 32}, {256, 1.0 / 16}, {0, 1.0 / 16}}) {
    w.micro_batch = mb;
    const ReplayResult r = replay(w, c, opt);
    EXPECT_NEAR(r.ranks[1].spans[0].end, 0.004 / (1 - share), 1e-9) << mb;
    EXPECT_NEAR(r.ranks[1].spans[2].end, 0.013, 1e-9) << mb;
  }
  // The summary says which share the receives held.
  w.micro_batch = 64;
  EXPECT_NE(
      result_summary(w, replay(w, c, opt)).find("posted receives: each holds 25.0% of its GPU"),
      std::string::npos);
  // Without an "overlap" entry (transfers hold nothing) the posted receive still holds its share.
  ReplayOptions posted_only;
  posted_only.calibration = parse_calibration(
      fmt::format(R"({{"collectives": [{{"op": "p2p", "group": 2, "bytes": {}, "seconds": 0.001}}],
                   "posted": [{{"op": "p2p", "bytes": 1e6, "batch": 64,
                                "alone_seconds": 0.3, "beside_seconds": 0.4}}]}})",
                  bytes),
      "cal.json");
  EXPECT_NEAR(replay(w, c, posted_only).ranks[1].spans[0].end, 0.004 / 0.75, 1e-9);
  // A repeated batch, an entry without its batch or an empty list is refused, naming it.
  for (const char* bad :
       {R"({"posted": [{"op": "p2p", "bytes": 1e6, "batch": 64, "alone_seconds": 0.3,
                        "beside_seconds": 0.4},
                       {"op": "p2p", "bytes": 1e6, "batch": 64, "alone_seconds": 0.3,
                        "beside_seconds": 0.5}]})",
        R"({"posted": [{"op": "p2p", "bytes": 1e6, "alone_seconds": 0.3, "beside_seconds": 0.4}]})",
        R"({"posted": []})"})
    EXPECT_THROW(parse_calibration(bad, "cal.json"), cai::Error) << bad;
}

// A config-built pipeline workload carries its micro-batch (the batch over the micro-batches),
// a data-parallel one its batch.
TEST(Overlap, ConfigWorkloadsCarryTheirMicroBatch) {
  const Cluster c = test::cluster("cpu-2");
  EXPECT_EQ(workload_from_config(test::fmnist({"train.batch_size=64", "parallel.pipeline=2",
                                               "parallel.num_microbatches=8"}),
                                 2, c)
                .workload.micro_batch,
            8);
  EXPECT_EQ(workload_from_config(test::fmnist({"train.batch_size=64"}), 2, c).workload.micro_batch,
            64);
}

// A GPU pipeline's workload carries its channels' blocks and GEMM margin; the simulator warns when
// the profile's posted receive was measured with others (an older profile: NCCL's blocks, no
// margin) and not when they match.
TEST(Overlap, WarnsWhenThePostedReceiveWasMeasuredOtherwise) {
  const Cluster c = load_cluster(std::string(CAI_CLUSTER_DIR) + "/h200-2.toml");
  const Workload w =
      workload_from_config(test::fmnist({"train.device=cuda", "parallel.pipeline=2"}), 2, c)
          .workload;
  EXPECT_EQ(w.p2p_max_ctas, 2);
  EXPECT_EQ(w.gemm_sm_margin, 4);
  auto posted_warnings = [&](const std::string& posted) {
    const Calibration cal = parse_calibration(fmt::format(R"({{"posted": {}}})", posted), "c.json");
    int n = 0;
    for (const std::string& s : result_warnings(w, ReplayResult{}, c, cal))
      n += s.find("posted receive") != std::string::npos;
    return n;
  };
  EXPECT_EQ(posted_warnings(R"({"op": "p2p", "bytes": 1e6, "alone_seconds": 0.3,
                                "beside_seconds": 0.32})"),
            1);
  EXPECT_EQ(posted_warnings(R"([{"op": "p2p", "bytes": 1e6, "batch": 64, "max_ctas": 2,
                                 "gemm_sm_margin": 4, "alone_seconds": 0.3,
                                 "beside_seconds": 0.32}])"),
            0);
  EXPECT_EQ(posted_warnings(R"([{"op": "p2p", "bytes": 1e6, "batch": 64, "max_ctas": 2,
                                 "alone_seconds": 0.3, "beside_seconds": 0.32}])"),
            1);
  // One setting per list.
  EXPECT_THROW(posted_warnings(R"([{"op": "p2p", "bytes": 1e6, "batch": 64, "max_ctas": 2,
                                    "alone_seconds": 0.3, "beside_seconds": 0.32},
                                   {"op": "p2p", "bytes": 1e6, "batch": 32, "max_ctas": 0,
                                    "alone_seconds": 0.3, "beside_seconds": 0.32}])"),
               cai::Error);
}

// Two receive kinds posted at once (a pipeline's middle stage waits for activations from one side
// and gradients from the other): each NCCL receive holds SMs of its own, so the work runs at
// (1 - s)^2 until the first arrives, at 1 - s while the other waits, then at full speed.
TEST(Overlap, TwoPostedReceiveKindsCompound) {
  const Cluster c = load_cluster(std::string(CAI_CLUSTER_DIR) + "/h200-4.toml");
  const int64_t bytes = 1 << 20;
  ReplayOptions opt;
  opt.calibration = parse_calibration(
      fmt::format(R"({{"collectives": [{{"op": "p2p", "group": 2, "bytes": {}, "seconds": 0.001}}],
                   "overlap": {{"op": "all_reduce", "group": 2, "bytes": 1e6,
                                "alone_seconds": 0.3, "beside_seconds": 0.4}}}})",
                  bytes),
      "cal.json");
  Workload w;
  w.ranks.resize(3);
  w.ranks[0].ops.push_back(Op::compute("F", 0.010));
  w.ranks[0].ops.push_back(Op::send("SendActivation", 1, 5, bytes));
  w.ranks[0].ops.back().deps = {0};
  w.ranks[2].ops.push_back(Op::compute("B", 0.020));
  w.ranks[2].ops.push_back(Op::send("SendGradient", 1, 6, bytes));
  w.ranks[2].ops.back().deps = {0};
  w.ranks[1].ops.push_back(Op::compute("F", 0.004));
  w.ranks[1].ops.push_back(Op::recv("RecvActivation", 0, 5, bytes));
  w.ranks[1].ops.push_back(Op::compute("F", 0.002));
  w.ranks[1].ops.push_back(Op::recv("RecvGradient", 2, 6, bytes));
  w.ranks[1].ops.push_back(Op::compute("B", 0.002));
  for (bool merge : {true, false}) {
    opt.merge_compute = merge;
    const ReplayResult r = replay(w, c, opt);
    EXPECT_NEAR(r.ranks[1].spans[0].end, 0.004 / (0.75 * 0.75), 1e-9) << merge;
    EXPECT_NEAR(r.ranks[1].spans[1].end, 0.011, 1e-9) << merge;
    EXPECT_NEAR(r.ranks[1].spans[2].end, 0.011 + 0.002 / 0.75, 1e-9) << merge;
    EXPECT_NEAR(r.ranks[1].spans[3].end, 0.021, 1e-9) << merge;
    EXPECT_NEAR(r.ranks[1].spans[4].end, 0.023, 1e-9) << merge;  // nothing posted: full speed
  }
}

// A receive posted where the workload says (Op::posted_after, as expand_schedule sets it from
// the executor's receive_posting) holds its share from that op's end, not from the start: rank 1
// computes 4 ms at full speed, posts, computes 3 ms at 0.75 (4 ms), waits for rank 0's send (10 ms
// of compute, 1 ms of p2p) and computes 2 ms at full speed. Posted at the start (-1) both computes
// before it are slowed; a posting op not before the receive is an error.
TEST(Overlap, ReceiveHoldsItsShareFromWhereItIsPosted) {
  const Cluster c = load_cluster(std::string(CAI_CLUSTER_DIR) + "/h200-2.toml");
  const int64_t bytes = 1 << 20;
  ReplayOptions opt;
  opt.calibration = parse_calibration(
      fmt::format(R"({{"collectives": [{{"op": "p2p", "group": 2, "bytes": {}, "seconds": 0.001}}],
                   "overlap": {{"op": "all_reduce", "group": 2, "bytes": 1e6,
                                "alone_seconds": 0.3, "beside_seconds": 0.4}}}})",
                  bytes),
      "cal.json");
  Workload w;
  w.ranks.resize(2);
  w.ranks[0].ops.push_back(Op::compute("F", 0.010));
  w.ranks[0].ops.push_back(Op::send("SendActivation", 1, 5, bytes));
  w.ranks[0].ops.back().deps = {0};
  w.ranks[1].ops.push_back(Op::compute("F", 0.004));
  w.ranks[1].ops.push_back(Op::compute("F", 0.003));
  w.ranks[1].ops.push_back(Op::recv("RecvActivation", 0, 5, bytes));
  w.ranks[1].ops.back().posted_after = 0;
  w.ranks[1].ops.push_back(Op::compute("F", 0.002));
  for (bool merge : {true, false}) {
    opt.merge_compute = merge;
    const ReplayResult r = replay(w, c, opt);
    EXPECT_NEAR(r.ranks[1].spans[0].end, 0.004, 1e-9) << merge;
    EXPECT_NEAR(r.ranks[1].spans[1].end, 0.004 + 0.003 / 0.75, 1e-9) << merge;
    EXPECT_NEAR(r.ranks[1].spans[2].end, 0.011, 1e-9) << merge;
    EXPECT_NEAR(r.ranks[1].spans[3].end, 0.013, 1e-9) << merge;
  }
  w.ranks[1].ops[2].posted_after = -1;
  const ReplayResult r = replay(w, c, opt);
  EXPECT_NEAR(r.ranks[1].spans[1].end, 0.007 / 0.75, 1e-9);
  w.ranks[1].ops[2].posted_after = 2;
  EXPECT_THROW(replay(w, c, opt), cai::Error);
}

// Compute contention on CPUs (the profile's "contention"): while another rank of the same node
// computes, a rank computes at 1 - share of its core. On cpu-2 (two cores of one machine), rank 1
// computes 4 ms of work beside rank 0's 10 ms: both at 0.75 until rank 1 ends at 5.33 ms, rank 0
// then alone at full speed for its last 6 ms. A 4-rank group measured the same slowdown shares it
// over the 3 others.
TEST(Contention, ComputeBesideTheNodesOtherRanksRunsSlower) {
  const Cluster c = load_cluster(std::string(CAI_CLUSTER_DIR) + "/cpu-2.toml");
  auto profile = [](const std::string& entry) {
    return parse_calibration(entry.empty() ? "{}" : "{\"contention\": " + entry + "}", "cal.json");
  };
  Workload w;
  w.ranks.resize(2);
  w.ranks[0].ops.push_back(Op::compute("F", 0.010));
  w.ranks[1].ops.push_back(Op::compute("F", 0.004));
  ReplayOptions opt;
  opt.calibration = profile(R"({"group": 2, "alone_seconds": 0.3, "together_seconds": 0.4})");
  EXPECT_NEAR(opt.calibration.contention_share, 0.25, 1e-12);
  for (bool merge : {true, false}) {
    opt.merge_compute = merge;
    const ReplayResult r = replay(w, c, opt);
    EXPECT_NEAR(r.ranks[1].spans[0].end, 0.004 / 0.75, 1e-9) << merge;
    EXPECT_NEAR(r.ranks[0].spans[0].end, 0.004 / 0.75 + 0.006, 1e-9) << merge;
  }
  // One rank alone on the node: its own speed.
  Workload one;
  one.ranks.resize(1);
  one.ranks[0].ops.push_back(Op::compute("F", 0.010));
  EXPECT_NEAR(replay(one, c, opt).ranks[0].spans[0].end, 0.010, 1e-9);
  // Without the entry, or faster together (noise): no share.
  opt.calibration = profile("");
  EXPECT_NEAR(replay(w, c, opt).ranks[0].spans[0].end, 0.010, 1e-9);
  EXPECT_EQ(
      profile(R"({"group": 2, "alone_seconds": 0.4, "together_seconds": 0.3})").contention_share,
      0);
  EXPECT_NEAR(
      profile(R"({"group": 4, "alone_seconds": 0.3, "together_seconds": 0.4})").contention_share,
      0.25 / 3, 1e-12);
  for (const char* bad : {R"({"alone_seconds": 0.3, "together_seconds": 0.4})",
                          R"({"group": 1, "alone_seconds": 0.3, "together_seconds": 0.4})",
                          R"({"group": 2.5, "alone_seconds": 0.3, "together_seconds": 0.4})",
                          R"({"group": 2, "alone_seconds": -1, "together_seconds": 0.4})", "3"})
    EXPECT_THROW(profile(bad), cai::Error) << bad;
}

// Unbound CPU processes (intra_node.placement = "shared") share the node's cores, not a core
// each: on 2 cores four ranks of which two compute 10 ms at once take 10 ms (a core each,
// whichever ranks they are), and four computing at once take 20 ms (two per core), as the OS
// schedules them. Pinned (cpu-2 as shipped: rank r on core r mod 2), ranks 0 and 2 share core 0
// even while the other core idles: 20 ms.
TEST(Contention, CpuRanksTakeWhicheverCoresAreFree) {
  const std::string path = std::string(CAI_CLUSTER_DIR) + "/cpu-2.toml";
  const Cluster pinned = load_cluster(path);
  ASSERT_TRUE(pinned.intra.pinned);
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string text = ss.str();
  const std::string key = "placement = \"pinned\"";
  ASSERT_NE(text.find(key), std::string::npos);
  text.replace(text.find(key), key.size(), "placement = \"shared\"");
  const Cluster shared = parse_cluster(text, "cpu-2-shared.toml");
  ASSERT_FALSE(shared.intra.pinned);
  for (const std::vector<int>& busy : {std::vector<int>{0, 2}, {0, 1}, {1, 3}, {0, 1, 2, 3}}) {
    Workload w;
    w.ranks.resize(4);
    for (int r : busy) w.ranks[r].ops.push_back(Op::compute("F", 0.010));
    for (bool merge : {true, false}) {
      ReplayOptions opt;
      opt.merge_compute = merge;
      const ReplayResult res = replay(w, shared, opt);
      const ReplayResult pin = replay(w, pinned, opt);
      const bool same_core = busy.size() > 2 || busy[0] % 2 == busy[1] % 2;
      for (int r : busy) {
        EXPECT_NEAR(res.ranks[r].spans[0].end, busy.size() > 2 ? 0.020 : 0.010, 1e-9)
            << "shared: rank " << r << " of " << busy.size() << ", merge " << merge;
        EXPECT_NEAR(pin.ranks[r].spans[0].end, same_core ? 0.020 : 0.010, 1e-9)
            << "pinned: rank " << r << " of " << busy.size() << ", merge " << merge;
      }
    }
  }
}

// MPI waits that nap (the profile's "wake"): a rank that waited longer than its wait polls
// (dist::mpi_wait_policy: 1,000 tests of 1 µs and 2 ms of yields with a core per process) is
// asleep when the last member arrives, and the collective (or the receive) takes the calibrated
// wake-up (late - base = 0.1 ms) more. Rank 1 reaches the all-reduce (1 ms) 9 ms early: it ends at
// 11.1 ms; 1 ms early (still polling): 11 ms. The same for a receive.
TEST(Wake, AWaitThatNappedPaysTheWakeUp) {
  const Cluster c = load_cluster(std::string(CAI_CLUSTER_DIR) + "/cpu-2.toml");
  const int64_t bytes = 1 << 20;
  ReplayOptions opt;
  opt.calibration = parse_calibration(
      fmt::format(
          R"({{"collectives": [{{"op": "all_reduce", "group": 2, "bytes": {0}, "seconds": 0.001}},
                                       {{"op": "p2p", "group": 2, "bytes": {0}, "seconds": 0.001}}],
                   "wake": {{"group": 4, "poll_seconds": 1e-6, "base_seconds": 1e-5,
                             "late_seconds": 1.1e-4}}}})",
          bytes),
      "cal.json");
  EXPECT_NEAR(opt.calibration.wake_s, 1e-4, 1e-12);
  const cai::dist::WaitPolicy wp = cai::dist::mpi_wait_policy(false);
  const double window = wp.busy_polls * 1e-6 + wp.yield_seconds;
  for (const double early : {0.009, 0.001}) {
    ASSERT_NE(early > window, early < window);
    const double wake = early > window ? 1e-4 : 0;
    Workload w;
    w.ranks.resize(2);
    const int g = w.add_group({0, 1});
    w.ranks[0].ops.push_back(Op::compute("F", 0.010));
    w.ranks[1].ops.push_back(Op::compute("F", 0.010 - early));
    for (int r = 0; r < 2; ++r) {
      w.ranks[r].ops.push_back(Op::collective(OpKind::AllReduce, "ar", g, bytes, 0));
      w.ranks[r].ops.back().deps = {0};
    }
    // Then rank 0 computes `early` longer and sends; rank 1 waits in its receive.
    w.ranks[0].ops.push_back(Op::compute("F", early));
    w.ranks[0].ops.push_back(Op::send("SendActivation", 1, 5, bytes, 0));
    w.ranks[1].ops.push_back(Op::recv("RecvActivation", 0, 5, bytes));
    for (bool merge : {true, false}) {
      opt.merge_compute = merge;
      const ReplayResult r = replay(w, c, opt);
      EXPECT_NEAR(r.ranks[1].spans[1].end, 0.011 + wake, 1e-9) << early << " " << merge;
      EXPECT_NEAR(r.ranks[0].spans[1].end, 0.011 + wake, 1e-9) << early << " " << merge;
      EXPECT_NEAR(r.ranks[1].spans[2].end, 0.012 + early + 2 * wake, 1e-9) << early << " " << merge;
    }
  }
  // Without the entry: no wake-up.
  EXPECT_EQ(parse_calibration("{}", "cal.json").wake_s, 0);
  for (
      const char* bad :
      {R"({"wake": {"group": 2, "poll_seconds": 1e-6, "base_seconds": 1e-5}})",
       R"({"wake": {"group": 1, "poll_seconds": 1e-6, "base_seconds": 1e-5, "late_seconds": 1e-4}})",
       R"({"wake": {"group": 2, "poll_seconds": -1, "base_seconds": 1e-5, "late_seconds": 1e-4}})"})
    EXPECT_THROW(parse_calibration(bad, "cal.json"), cai::Error) << bad;
}

// A wait's busy polls take the core from a rank that shares it (cpu-2 pinned, 4 processes: ranks 0
// and 2 on core 0; dist::mpi_wait_policy(true): busy_polls tests of the profile's 1 µs, P = 1 ms
// of CPU). Rank 0 computes 1 ms and then waits for rank 1's send (after 10 ms); rank 2 computes
// 4 ms. Both compute at half speed until 2 ms; then rank 0's polls and rank 2 share the core until
// the polls are done (2P later, rank 2 at 1 + P ms of its 4), and rank 2 ends at 5 + P ms, not 5.
// Without the wake entry (no poll time measured) it ends at 5 ms.
TEST(Wake, BusyPollsTakeASharedCore) {
  const Cluster c = load_cluster(std::string(CAI_CLUSTER_DIR) + "/cpu-2.toml");
  ASSERT_TRUE(c.intra.pinned);
  const double P = cai::dist::mpi_wait_policy(true).busy_polls * 1e-6;
  ASSERT_LT(P, 0.003);
  Workload w;
  w.ranks.resize(4);
  w.ranks[0].ops.push_back(Op::compute("F", 0.001));
  w.ranks[0].ops.push_back(Op::recv("RecvActivation", 1, 5, 64, 0));
  w.ranks[1].ops.push_back(Op::compute("F", 0.010));
  w.ranks[1].ops.push_back(Op::send("SendActivation", 0, 5, 64, 0));
  w.ranks[2].ops.push_back(Op::compute("F", 0.004));
  for (const bool measured : {true, false}) {
    ReplayOptions opt;
    if (measured)
      opt.calibration = parse_calibration(
          R"({"wake": {"group": 4, "poll_seconds": 1e-6, "base_seconds": 1e-5,
                        "late_seconds": 1.1e-4}})",
          "cal.json");
    for (bool merge : {true, false}) {
      opt.merge_compute = merge;
      const ReplayResult r = replay(w, c, opt);
      EXPECT_NEAR(r.ranks[0].spans[0].end, 0.002, 1e-9) << measured << " " << merge;
      EXPECT_NEAR(r.ranks[2].spans[0].end, measured ? 0.005 + P : 0.005, 1e-9)
          << measured << " " << merge;
    }
  }
}
