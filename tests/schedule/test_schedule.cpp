// Pipeline schedules: exact programs for small cases, properties (validation, bubble fractions,
// peak activations) over p <= 8, m <= 32, v <= 4, the validator's error reports on broken
// programs, and layer partitioning.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <string>

#include "cai/core/error.h"
#include "cai/schedule/schedule.h"
#include "schedule_test_util.h"

using namespace cai::schedule;
using namespace cai::schedule::testutil;

namespace {

// A partition with 2 layers per virtual stage (enough layers for any p, v).
Partition part2(int p, int v = 1) {
  return partition_uniform(2 * p * v, p * v);
}

double formula(int p, int m, int v = 1) {
  return double(p - 1) / (v * m + p - 1);
}

}  // namespace

// --- IR ------------------------------------------------------------------------------------

TEST(ScheduleIR, NamesAndStrings) {
  EXPECT_STREQ(op_name(Op::LoadMicroBatch), "LoadMicroBatch");
  EXPECT_STREQ(op_name(Op::BackwardWeight), "BackwardWeight");
  EXPECT_STREQ(op_name(Op::OptimizerStep), "OptimizerStep");
  EXPECT_EQ((Instr{Op::Forward, 3, 0}).str(), "F(mb=3,c=0)");
  EXPECT_EQ((Instr{Op::SendActivation, 3, 0, 2}).str(), "SendAct(mb=3,c=0,->2)");
  EXPECT_EQ((Instr{Op::RecvGrad, 1, 1, 0}).str(), "RecvGrad(mb=1,c=1,<-0)");
  EXPECT_EQ((Instr{Op::BackwardInput, 2, 1}).str(), "BI(mb=2,c=1)");
  EXPECT_TRUE(is_compute(Op::BackwardInput));
  EXPECT_FALSE(is_compute(Op::SendGrad));
  EXPECT_TRUE(is_send(Op::SendGrad));
  EXPECT_TRUE(is_recv(Op::RecvActivation));
  Schedule s;
  s.stages = 4, s.chunks = 2;
  EXPECT_EQ(s.virtual_stages(), 8);
  EXPECT_EQ(s.virtual_stage(1, 1), 5);
  EXPECT_EQ(s.rank_of(5), 1);
  EXPECT_EQ(s.chunk_of(5), 1);
  EXPECT_EQ(gpipe(opts(2, 1), part2(2)).str(),
            "rank 0: Load(mb=0) F(mb=0,c=0) SendAct(mb=0,c=0,->1) RecvGrad(mb=0,c=0,<-1) "
            "B(mb=0,c=0) ReduceGrads OptStep\n"
            "rank 1: Load(mb=0) RecvAct(mb=0,c=0,<-0) F(mb=0,c=0) B(mb=0,c=0) "
            "SendGrad(mb=0,c=0,->0) ReduceGrads OptStep\n");
}

// --- Exact programs -------------------------------------------------------------------------

TEST(ScheduleExact, OneFOneBTwoStagesThreeMicroBatches) {
  Schedule s = one_f_one_b(opts(2, 3), partition_uniform(6, 2));
  EXPECT_EQ(s.name, "1f1b");
  ASSERT_EQ(s.programs.size(), 2u);
  EXPECT_EQ(strs(s.programs[0]),
            (std::vector<std::string>{
                "Load(mb=0)", "F(mb=0,c=0)", "SendAct(mb=0,c=0,->1)",                  // warm-up
                "Load(mb=1)", "F(mb=1,c=0)", "SendAct(mb=1,c=0,->1)",                  // steady
                "RecvGrad(mb=0,c=0,<-1)", "B(mb=0,c=0)",                               //
                "Load(mb=2)", "F(mb=2,c=0)", "SendAct(mb=2,c=0,->1)",                  //
                "RecvGrad(mb=1,c=0,<-1)", "B(mb=1,c=0)",                               //
                "RecvGrad(mb=2,c=0,<-1)", "B(mb=2,c=0)", "ReduceGrads", "OptStep"}));  // drain
  EXPECT_EQ(strs(s.programs[1]),
            (std::vector<std::string>{
                "Load(mb=0)", "RecvAct(mb=0,c=0,<-0)", "F(mb=0,c=0)", "B(mb=0,c=0)",
                "SendGrad(mb=0,c=0,->0)", "Load(mb=1)", "RecvAct(mb=1,c=0,<-0)", "F(mb=1,c=0)",
                "B(mb=1,c=0)", "SendGrad(mb=1,c=0,->0)", "Load(mb=2)", "RecvAct(mb=2,c=0,<-0)",
                "F(mb=2,c=0)", "B(mb=2,c=0)", "SendGrad(mb=2,c=0,->0)", "ReduceGrads", "OptStep"}));
  // Layer ranges and bytes: rank 0 holds layers [0, 3), rank 1 [3, 6).
  for (int r = 0; r < 2; ++r)
    for (const Instr& in : s.programs[r]) {
      if (in.op == Op::ReduceGrads || in.op == Op::OptimizerStep) continue;
      EXPECT_EQ(in.first_layer, 3 * r) << in.str();
      EXPECT_EQ(in.num_layers, 3) << in.str();
      EXPECT_EQ(in.bytes, is_send(in.op) || is_recv(in.op) ? 4096 : 0) << in.str();
    }
  ValidationResult res = validate(s);
  ASSERT_TRUE(res.ok) << res.error;
  EXPECT_EQ(res.peak_activations, (std::vector<int>{2, 1}));
  // F=1, B=2: (m + p - 1)(f + b) = 12.
  EXPECT_DOUBLE_EQ(res.makespan, 12.0);
  EXPECT_NEAR(res.bubble_fraction, 0.25, 1e-12);
  EXPECT_EQ(res.times[1][2].start, 1.0);  // rank 1's F(mb=0) waits for rank 0's
  EXPECT_EQ(res.times[1][2].end, 2.0);
}

TEST(ScheduleExact, GPipeTwoStagesTwoMicroBatches) {
  Schedule s = gpipe(opts(2, 2), partition_uniform(5, 2));
  EXPECT_EQ(s.name, "gpipe");
  EXPECT_EQ(strs(s.programs[0]),
            (std::vector<std::string>{
                "Load(mb=0)", "F(mb=0,c=0)", "SendAct(mb=0,c=0,->1)", "Load(mb=1)", "F(mb=1,c=0)",
                "SendAct(mb=1,c=0,->1)", "RecvGrad(mb=0,c=0,<-1)", "B(mb=0,c=0)",
                "RecvGrad(mb=1,c=0,<-1)", "B(mb=1,c=0)", "ReduceGrads", "OptStep"}));
  EXPECT_EQ(strs(s.programs[1]),
            (std::vector<std::string>{"Load(mb=0)", "RecvAct(mb=0,c=0,<-0)", "F(mb=0,c=0)",
                                      "Load(mb=1)", "RecvAct(mb=1,c=0,<-0)", "F(mb=1,c=0)",
                                      "B(mb=0,c=0)", "SendGrad(mb=0,c=0,->0)", "B(mb=1,c=0)",
                                      "SendGrad(mb=1,c=0,->0)", "ReduceGrads", "OptStep"}));
  EXPECT_EQ(s.programs[0][1].num_layers, 3);  // 5 layers over 2: 3, 2
  EXPECT_EQ(s.programs[1][2].first_layer, 3);
  EXPECT_EQ(s.programs[1][2].num_layers, 2);
  EXPECT_EQ(s.programs[1].back().num_layers, 2);  // OptimizerStep: the layers the rank holds
  ValidationResult res = validate(s);
  ASSERT_TRUE(res.ok) << res.error;
  EXPECT_EQ(res.peak_activations, (std::vector<int>{2, 2}));
  EXPECT_NEAR(res.bubble_fraction, 1.0 / 3.0, 1e-12);
}

TEST(ScheduleExact, InterleavedTwoStagesFourMicroBatchesTwoChunks) {
  Schedule s = interleaved(opts(2, 4, 2), partition_uniform(8, 4));
  EXPECT_EQ(s.name, "interleaved");
  // Rank 0 warms up with 2(p-1) + (v-1)p = 4 forwards: mb 0,1 on chunk 0, then mb 0,1 on chunk 1
  // (virtual stage 2, fed by rank 1's chunk 0), then 1F1B starts with F(mb=2,c=0), B(mb=0,c=1).
  EXPECT_EQ(
      strs(s.programs[0], 17),
      (std::vector<std::string>{"Load(mb=0)", "F(mb=0,c=0)", "SendAct(mb=0,c=0,->1)", "Load(mb=1)",
                                "F(mb=1,c=0)", "SendAct(mb=1,c=0,->1)", "RecvAct(mb=0,c=1,<-1)",
                                "F(mb=0,c=1)", "SendAct(mb=0,c=1,->1)", "RecvAct(mb=1,c=1,<-1)",
                                "F(mb=1,c=1)", "SendAct(mb=1,c=1,->1)", "Load(mb=2)", "F(mb=2,c=0)",
                                "SendAct(mb=2,c=0,->1)", "RecvGrad(mb=0,c=1,<-1)", "B(mb=0,c=1)"}));
  // Rank 1 warms up with 2 forwards (chunk 0), then F(mb=0,c=1) (the last virtual stage: it
  // loads the labels) and its backward at once.
  EXPECT_EQ(strs(s.programs[1], 14),
            (std::vector<std::string>{
                "RecvAct(mb=0,c=0,<-0)", "F(mb=0,c=0)", "SendAct(mb=0,c=0,->0)",
                "RecvAct(mb=1,c=0,<-0)", "F(mb=1,c=0)", "SendAct(mb=1,c=0,->0)", "Load(mb=0)",
                "RecvAct(mb=0,c=1,<-0)", "F(mb=0,c=1)", "B(mb=0,c=1)", "SendGrad(mb=0,c=1,->0)",
                "Load(mb=1)", "RecvAct(mb=1,c=1,<-0)", "F(mb=1,c=1)"}));
  // Virtual stage v = c * p + r holds layers [2v, 2v + 2).
  EXPECT_EQ(s.programs[1][8].first_layer, 6);  // F(mb=0,c=1) on rank 1 = virtual stage 3
  EXPECT_EQ(s.programs[0][7].first_layer, 4);  // F(mb=0,c=1) on rank 0 = virtual stage 2
  ValidationResult res = validate(s);
  ASSERT_TRUE(res.ok) << res.error;
  EXPECT_NEAR(res.bubble_fraction, formula(2, 4, 2), 1e-9);
}

TEST(ScheduleExact, SplitBackwardSendsAfterBackwardInput) {
  Schedule s = one_f_one_b(opts(2, 1, 1, true), part2(2));
  EXPECT_EQ(strs(s.programs[1]),
            (std::vector<std::string>{"Load(mb=0)", "RecvAct(mb=0,c=0,<-0)", "F(mb=0,c=0)",
                                      "BI(mb=0,c=0)", "SendGrad(mb=0,c=0,->0)", "BW(mb=0,c=0)",
                                      "ReduceGrads", "OptStep"}));
  // F=1, BI=1, BW=1: rank 1 sends the grad at 3 (not 4), so rank 0 finishes at 5 (not 6).
  ValidationResult res = validate(s);
  ASSERT_TRUE(res.ok) << res.error;
  EXPECT_DOUBLE_EQ(res.makespan, 5.0);
  ValidationResult whole = validate(one_f_one_b(opts(2, 1), part2(2)));
  EXPECT_DOUBLE_EQ(whole.makespan, 6.0);
}

TEST(ScheduleExact, SingleStageHasNoTransfers) {
  Schedule s = one_f_one_b(opts(1, 2), partition_uniform(3, 1));
  EXPECT_EQ(strs(s.programs[0]),
            (std::vector<std::string>{"Load(mb=0)", "F(mb=0,c=0)", "B(mb=0,c=0)", "Load(mb=1)",
                                      "F(mb=1,c=0)", "B(mb=1,c=0)", "ReduceGrads", "OptStep"}));
  ValidationResult res = validate(s);
  ASSERT_TRUE(res.ok) << res.error;
  EXPECT_EQ(res.bubble_fraction, 0.0);
}

// --- Timing ---------------------------------------------------------------------------------

TEST(ScheduleTiming, CommLatencyAndPerLayerCosts) {
  // p=2, m=1, comm 0.5: F0 [0,1], arrives 1.5, F1 [1.5,2.5], B1 [2.5,4.5], arrives 5, B0 [5,7].
  CostModel cost;
  cost.comm = 0.5;
  Schedule s = one_f_one_b(opts(2, 1), part2(2));
  ValidationResult res = validate(s, cost);
  ASSERT_TRUE(res.ok) << res.error;
  EXPECT_DOUBLE_EQ(res.makespan, 7.0);
  EXPECT_EQ(res.times.size(), 2u);
  ASSERT_EQ(res.times[1].size(), s.programs[1].size());
  EXPECT_DOUBLE_EQ(res.times[1][1].start, 0.0);  // RecvAct waits from 0 ...
  EXPECT_DOUBLE_EQ(res.times[1][1].end, 1.5);    // ... to the arrival
  EXPECT_DOUBLE_EQ(res.times[0][3].start, 1.0);  // RecvGrad on rank 0
  EXPECT_DOUBLE_EQ(res.times[0][3].end, 5.0);
  EXPECT_DOUBLE_EQ(res.busy[0], 3.0);
  EXPECT_DOUBLE_EQ(res.busy[1], 3.0);
  EXPECT_NEAR(res.bubble_fraction, 1.0 - 6.0 / 14.0, 1e-12);

  // Bytes add comm_per_byte * bytes to the latency.
  cost.comm = 0;
  cost.comm_per_byte = 0.5 / 4096;
  EXPECT_DOUBLE_EQ(validate(s, cost).makespan, 7.0);

  // Per-layer costs: 7 layers as 4 + 3; a rank's busy time is m (f + b) * its layers.
  CostModel per_layer;
  per_layer.per_layer = true;
  ValidationResult pl = validate(gpipe(opts(2, 3), partition_uniform(7, 2)), per_layer);
  ASSERT_TRUE(pl.ok) << pl.error;
  EXPECT_DOUBLE_EQ(pl.busy[0], 3 * 3.0 * 4);
  EXPECT_DOUBLE_EQ(pl.busy[1], 3 * 3.0 * 3);
}

// --- Properties -----------------------------------------------------------------------------

TEST(ScheduleProperties, GPipeAndOneFOneB) {
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 32; ++m)
      for (bool split : {false, true}) {
        SCOPED_TRACE(testing::Message() << "p=" << p << " m=" << m << " split=" << split);
        Schedule f1b = one_f_one_b(opts(p, m, 1, split), part2(p));
        Schedule gp = gpipe(opts(p, m, 1, split), part2(p));
        ValidationResult a = validate(f1b), b = validate(gp);
        ASSERT_TRUE(a.ok) << a.error;
        ASSERT_TRUE(b.ok) << b.error;
        for (int s = 0; s < p; ++s) {
          EXPECT_EQ(a.peak_activations[s], std::min(p - s, m)) << "1f1b stage " << s;
          EXPECT_EQ(b.peak_activations[s], m) << "gpipe stage " << s;
        }
        if (!split) {
          EXPECT_NEAR(a.bubble_fraction, formula(p, m), 1e-9);
          EXPECT_NEAR(b.bubble_fraction, formula(p, m), 1e-9);
          EXPECT_NEAR(a.makespan, (m + p - 1) * 3.0, 1e-9);
        } else {
          // Sending the grad before the weight backward never makes it slower.
          EXPECT_LE(a.bubble_fraction, formula(p, m) + 1e-9);
        }
        if (p == 1) {
          for (const Instr& in : f1b.programs[0])
            EXPECT_FALSE(is_send(in.op) || is_recv(in.op)) << in.str();
        }
        for (const Schedule* sch : {&f1b, &gp})
          for (const Program& prog : sch->programs) {
            ASSERT_GE(prog.size(), 2u);
            EXPECT_EQ(prog[prog.size() - 2].op, Op::ReduceGrads);
            EXPECT_EQ(prog.back().op, Op::OptimizerStep);
          }
      }
}

TEST(ScheduleProperties, Interleaved) {
  int cases = 0;
  for (int p = 1; p <= 8; ++p)
    for (int m = p; m <= 32; m += p)
      for (int v = 2; v <= 4; ++v)
        for (bool split : {false, true}) {
          SCOPED_TRACE(testing::Message()
                       << "p=" << p << " m=" << m << " v=" << v << " split=" << split);
          Schedule s = interleaved(opts(p, m, v, split), part2(p, v));
          ValidationResult r = validate(s);
          ASSERT_TRUE(r.ok) << r.error;
          ++cases;
          if (split) continue;
          EXPECT_NEAR(r.bubble_fraction, formula(p, m, v), 1e-9);
          if (p > 1) {
            ValidationResult base = validate(one_f_one_b(opts(p, m), part2(p)));
            EXPECT_LT(r.bubble_fraction, base.bubble_fraction);
          }
          for (int rank = 0; rank < p; ++rank) {
            // Megatron's warm-up depth + 1 forwards in flight (chunk-forwards, across chunks).
            const int warmup = std::min(2 * (p - rank - 1) + (v - 1) * p, m * v);
            EXPECT_EQ(r.peak_activations[rank], std::min(warmup + 1, m * v)) << "rank " << rank;
          }
        }
  EXPECT_GT(cases, 300);
}

// --- Validator errors -----------------------------------------------------------------------

TEST(ScheduleValidator, MissingRecv) {
  Schedule s = one_f_one_b(opts(2, 3), part2(2));
  auto& prog = s.programs[1];
  ASSERT_EQ(prog[6].str(), "RecvAct(mb=1,c=0,<-0)");
  prog.erase(prog.begin() + 6);
  ValidationResult r = validate(s);
  EXPECT_FALSE(r.ok);
  expect_contains(r.error, {"[schedule]", "rank 1", "F(mb=1,c=0)", "not received"});
  expect_error([&] { validate_or_throw(s); }, {"rank 1", "F(mb=1,c=0)"});
}

TEST(ScheduleValidator, UnreceivedSend) {
  Schedule s = gpipe(opts(2, 2), part2(2));
  // A second SendAct(mb=0) just before ReduceGrads: rank 1 never receives it.
  auto& prog = s.programs[0];
  prog.insert(prog.end() - 2, prog[2]);
  ValidationResult r = validate(s);
  EXPECT_FALSE(r.ok);
  expect_contains(r.error, {"rank 0 #10 SendAct(mb=0,c=0,->1)", "never received by rank 1"});
}

TEST(ScheduleValidator, Deadlock) {
  Schedule s = one_f_one_b(opts(2, 3), part2(2));
  auto& prog = s.programs[0];
  // Move rank 0's first RecvGrad before the SendAct it depends on: a receive cycle.
  ASSERT_EQ(prog[6].str(), "RecvGrad(mb=0,c=0,<-1)");
  Instr recv = prog[6];
  prog.erase(prog.begin() + 6);
  prog.insert(prog.begin() + 2, recv);
  ValidationResult r = validate(s);
  EXPECT_FALSE(r.ok);
  expect_contains(r.error, {"deadlock", "rank 0 waits at #2 RecvGrad(mb=0,c=0,<-1)",
                            "rank 1 waits at #1 RecvAct(mb=0,c=0,<-0)"});
}

TEST(ScheduleValidator, OutOfOrderPairing) {
  Schedule s = gpipe(opts(2, 2), part2(2));
  auto& prog = s.programs[1];
  ASSERT_EQ(prog[1].str(), "RecvAct(mb=0,c=0,<-0)");
  ASSERT_EQ(prog[4].str(), "RecvAct(mb=1,c=0,<-0)");
  std::swap(prog[1], prog[4]);
  ValidationResult r = validate(s);
  EXPECT_FALSE(r.ok);
  expect_contains(r.error, {"rank 1 #1 RecvAct(mb=1,c=0,<-0)", "different order"});
}

TEST(ScheduleValidator, DependencyAndCountErrors) {
  {  // Backward before forward.
    Schedule s = one_f_one_b(opts(1, 1), part2(1));
    std::swap(s.programs[0][1], s.programs[0][2]);
    expect_contains(validate(s).error, {"rank 0 #1 B(mb=0,c=0)", "before its Forward"});
  }
  {  // A missing backward: ReduceGrads notices.
    Schedule s = one_f_one_b(opts(1, 2), part2(1));
    s.programs[0].erase(s.programs[0].begin() + 5);
    expect_contains(validate(s).error, {"ReduceGrads", "backward of (mb=1"});
  }
  {  // A duplicated forward.
    Schedule s = gpipe(opts(1, 2), part2(1));
    s.programs[0].insert(s.programs[0].begin() + 2, s.programs[0][1]);
    expect_contains(validate(s).error, {"second Forward"});
  }
  {  // Wrong peer.
    Schedule s = one_f_one_b(opts(3, 2), part2(3));
    ASSERT_EQ(s.programs[0][2].op, Op::SendActivation);
    s.programs[0][2].peer = 2;
    expect_contains(validate(s).error, {"rank 0 #2", "peer 2 is wrong"});
  }
  {  // BackwardWeight without BackwardInput.
    Schedule s = one_f_one_b(opts(1, 1, 1, true), part2(1));
    ASSERT_EQ(s.programs[0][2].op, Op::BackwardInput);
    s.programs[0].erase(s.programs[0].begin() + 2);
    expect_contains(validate(s).error, {"BW(mb=0,c=0)", "without a BackwardInput"});
  }
  {  // Missing OptimizerStep.
    Schedule s = one_f_one_b(opts(2, 1), part2(2));
    s.programs[1].pop_back();
    expect_contains(validate(s).error, {"rank 1", "OptimizerStep"});
  }
  {  // Layer ranges that do not tile the model.
    Schedule s = one_f_one_b(opts(2, 1), part2(2));
    for (Instr& in : s.programs[1])
      if (is_compute(in.op)) in.first_layer = 3;
    expect_contains(validate(s).error, {"virtual stage 1", "expected to start at 2"});
  }
}

TEST(ScheduleGenerators, InvalidOptionsThrow) {
  expect_error([] { interleaved(opts(4, 6, 2), part2(4, 2)); },
               {"[schedule]", "micro_batches (6)", "multiple of stages (4)"});
  expect_error([] { interleaved(opts(2, 4, 1), part2(2, 1)); }, {"[schedule]", "chunks", ">= 2"});
  expect_error([] { one_f_one_b(opts(0, 4), Partition{}); }, {"[schedule]", "stages", "got 0"});
  expect_error([] { gpipe(opts(2, 0), part2(2)); }, {"[schedule]", "micro_batches", "got 0"});
  expect_error([] { gpipe(opts(2, 2, 2), part2(2, 2)); }, {"[schedule]", "chunks must be 1"});
  expect_error([] { one_f_one_b(opts(4, 4), part2(2)); },
               {"[schedule]", "2 virtual stages", "needs 4"});
  expect_error(
      [] {
        interleaved(opts(4, 4, 2), Partition{{1, 1, 1, 0, 1, 1, 1, 1}});
      },
      {"[schedule]", "virtual stage 3 has 0 layers"});
  // More virtual stages than layers: the partition refuses.
  expect_error([] { partition_uniform(7, 8); }, {"[partition]", "7 layers", "8 virtual stages"});
  expect_error([] { make("zb", opts(2, 2), part2(2)); }, {"[schedule]", "unknown style 'zb'"});
  EXPECT_EQ(make("interleaved", opts(2, 2, 2), part2(2, 2)).name, "interleaved");
  EXPECT_EQ(make("gpipe", opts(2, 2), part2(2)).name, "gpipe");
}

// --- Partitions -----------------------------------------------------------------------------

TEST(SchedulePartition, Uniform) {
  EXPECT_EQ(partition_uniform(14, 4).layers_per_virtual_stage, (std::vector<int>{4, 4, 3, 3}));
  EXPECT_EQ(partition_uniform(12, 4).layers_per_virtual_stage, (std::vector<int>{3, 3, 3, 3}));
  EXPECT_EQ(partition_uniform(5, 5).layers_per_virtual_stage, (std::vector<int>{1, 1, 1, 1, 1}));
  Partition p = partition_uniform(14, 4);
  EXPECT_EQ(p.total_layers(), 14);
  EXPECT_EQ(p.first_layer(0), 0);
  EXPECT_EQ(p.first_layer(2), 8);
  EXPECT_EQ(p.num_layers(3), 3);
  expect_error([] { partition_uniform(4, 0); }, {"[partition]", "got 0"});
}

TEST(SchedulePartition, Balanced) {
  // Equal costs reproduce the uniform rule.
  EXPECT_EQ(partition_balanced(std::vector<int64_t>(14, 5), 4).layers_per_virtual_stage,
            (std::vector<int>{4, 4, 3, 3}));
  // A ViT-like model: cheap embedding and head around six equal blocks.
  EXPECT_EQ(partition_balanced({1, 10, 10, 10, 10, 10, 10, 1}, 3).layers_per_virtual_stage,
            (std::vector<int>{3, 2, 3}));
  // A heavy first layer stands alone; the rest split evenly.
  EXPECT_EQ(partition_balanced({8, 1, 1, 1, 1, 1, 1, 1, 1}, 3).layers_per_virtual_stage,
            (std::vector<int>{1, 4, 4}));
  // Against brute force on random costs: same optimal maximum and sum of squares.
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + rng() % 9, k = 1 + rng() % n;
    std::vector<int64_t> c(n);
    for (auto& x : c) x = rng() % 20;
    auto stage_costs = [&](const std::vector<int>& sizes) {
      std::vector<int64_t> out;
      int at = 0;
      for (int sz : sizes) {
        int64_t s = 0;
        for (int i = 0; i < sz; ++i) s += c[at + i];
        out.push_back(s);
        at += sz;
      }
      return out;
    };
    auto score = [&](const std::vector<int>& sizes) {
      auto sc = stage_costs(sizes);
      int64_t mx = 0, sq = 0;
      for (auto s : sc) mx = std::max(mx, s), sq += s * s;
      return std::pair<int64_t, int64_t>(mx, sq);
    };
    std::pair<int64_t, int64_t> best{INT64_MAX, INT64_MAX};
    std::vector<int> sizes;
    std::function<void(int, int)> rec = [&](int left, int stages) {
      if (stages == 0) {
        if (left == 0) best = std::min(best, score(sizes));
        return;
      }
      for (int sz = 1; sz <= left - (stages - 1); ++sz) {
        sizes.push_back(sz);
        rec(left - sz, stages - 1);
        sizes.pop_back();
      }
    };
    rec(n, k);
    Partition p = partition_balanced(c, k);
    ASSERT_EQ(p.virtual_stages(), k);
    EXPECT_EQ(p.total_layers(), n);
    for (int s : p.layers_per_virtual_stage) EXPECT_GE(s, 1);
    EXPECT_EQ(score(p.layers_per_virtual_stage), best) << "trial " << trial;
  }
  expect_error([] { partition_balanced({1, 2, 3}, 4); }, {"[partition]", "3 layers", "4 virtual"});
  expect_error([] { partition_balanced({1, -2, 3}, 2); }, {"[partition]", "layer 1", "-2"});
}

TEST(SchedulePartition, Explicit) {
  EXPECT_EQ(partition_explicit({2, 5, 3}, 10).layers_per_virtual_stage,
            (std::vector<int>{2, 5, 3}));
  EXPECT_EQ(partition_explicit({2, 5, 3}, 10, 3).virtual_stages(), 3);
  expect_error([] { partition_explicit({2, 5, 3}, 11); }, {"[partition]", "sums to 10", "11"});
  expect_error([] { partition_explicit({2, 0, 3}, 5); }, {"[partition]", "[1] = 0"});
  expect_error([] { partition_explicit({2, 5, 3}, 10, 4); }, {"[partition]", "3 entries", "4"});
  expect_error([] { partition_explicit({}, 10); }, {"[partition]", "empty"});
  // The schedule also rejects an explicit list of the wrong length.
  expect_error(
      [] {
        one_f_one_b(opts(4, 4), partition_explicit({2, 5, 3}, 10));
      },
      {"[schedule]", "3 virtual stages", "needs 4"});
}
