// receive_post_points / receive_posting: where the pipeline executor posts each receive ahead
// (schedule.h). The old rule (a kind's next receive posted as soon as the previous one was taken,
// the first ones at program start) posted receives whose sends wait for this rank; on NCCL such a
// receive spins on the device, and dp 2 x pp 2 x ZeRO 1 interleaved x4 hung on 4 H100.
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "cai/core/error.h"
#include "cai/schedule/schedule.h"

using namespace cai::schedule;

namespace {

Schedule build(const std::string& style, int p, int m, int v) {
  ScheduleOptions o;
  o.stages = p;
  o.micro_batches = m;
  o.chunks = v;
  o.activation_bytes = 4096;
  return make(style, o, partition_uniform(4 * p * v, p * v));
}

// Where the old rule posted each receive (before which instruction).
std::vector<size_t> one_ahead(const Program& prog) {
  std::vector<size_t> at(prog.size(), 0);
  size_t last[2] = {0, 0};
  bool first[2] = {true, true};
  for (size_t i = 0; i < prog.size(); ++i) {
    if (!is_recv(prog[i].op)) continue;
    const int k = prog[i].op == Op::RecvGrad;
    at[i] = first[k] ? 0 : last[k] + 1;
    first[k] = false;
    last[k] = i;
  }
  return at;
}

const std::vector<std::tuple<std::string, int, int, int>> kLayouts = {
    {"gpipe", 2, 4, 1},       {"1f1b", 2, 8, 1},        {"1f1b", 4, 8, 1},
    {"1f1b", 4, 3, 1},        {"interleaved", 2, 4, 4}, {"interleaved", 2, 8, 2},
    {"interleaved", 4, 8, 2}, {"interleaved", 4, 4, 3}, {"zbh1", 2, 8, 1},
    {"zbh1", 4, 8, 1},        {"zbv", 2, 8, 2},         {"zbv", 4, 8, 2},
    {"zbv", 4, 3, 2}};

}  // namespace

// 1F1B on 2 ranks, 2 micro-batches, by hand. Rank 0: Load0 F0 SendAct0 Load1 F1 SendAct1
// RecvGrad0 B0 RecvGrad1 B1 ... Rank 1 sends grad 0 after B0, which needs act 0 only (rank 0's
// #2): RecvGrad0 may go out from #3. Grad 1 needs act 1 (rank 0's #5): safe from #6, posted
// before #7 (one receive of a kind at a time: grad 0 is taken at #6).
TEST(PrePost, OneFOneBByHand) {
  const Schedule s = build("1f1b", 2, 2, 1);
  const auto pts = receive_post_points(s);
  const Program& r0 = s.programs[0];
  ASSERT_EQ(r0[2].str(), "SendAct(mb=0,c=0,->1)");
  ASSERT_EQ(r0[5].str(), "SendAct(mb=1,c=0,->1)");
  ASSERT_EQ(r0[6].str(), "RecvGrad(mb=0,c=0,<-1)");
  ASSERT_EQ(r0[8].str(), "RecvGrad(mb=1,c=0,<-1)");
  EXPECT_EQ(pts[0][6], 3u);
  EXPECT_EQ(pts[0][8], 6u);
  // Rank 1's activations depend on nothing of rank 1: from the start.
  for (size_t i = 0; i < s.programs[1].size(); ++i)
    if (s.programs[1][i].op == Op::RecvActivation) EXPECT_EQ(pts[1][i], 0u) << i;
  const auto before = receive_posting(s, 0, true);
  EXPECT_EQ(before[3], std::vector<size_t>{6});
  EXPECT_EQ(before[7], std::vector<size_t>{8});
  EXPECT_TRUE(before[8].empty());
}

// Every layout: receive_posting posts each receive exactly once, at or after its safe point and
// at or before its own position, each kind in program order with at most one not taken; without
// `ahead`, at its own position.
TEST(PrePost, PostingKeepsTheRules) {
  for (const auto& [style, p, m, v] : kLayouts) {
    const Schedule s = build(style, p, m, v);
    ASSERT_TRUE(validate(s).ok) << style;
    const auto pts = receive_post_points(s);
    for (int r = 0; r < p; ++r) {
      const Program& prog = s.programs[r];
      for (bool ahead : {true, false}) {
        const auto before = receive_posting(s, r, ahead);
        ASSERT_EQ(before.size(), prog.size());
        std::vector<int> posted_at(prog.size(), -1);
        size_t last_posted[2] = {0, 0};
        bool any[2] = {false, false};
        int open[2] = {0, 0};
        for (size_t pos = 0; pos < prog.size(); ++pos) {
          for (size_t i : before[pos]) {
            ASSERT_LT(i, prog.size());
            ASSERT_TRUE(is_recv(prog[i].op)) << style << " rank " << r << " #" << i;
            EXPECT_EQ(posted_at[i], -1) << "posted twice";
            posted_at[i] = static_cast<int>(pos);
            EXPECT_GE(pos, pts[r][i]) << style << " rank " << r << " #" << i << " too early";
            EXPECT_LE(pos, i) << style << " rank " << r << " #" << i << " after its use";
            if (!ahead) EXPECT_EQ(pos, i);
            const int k = prog[i].op == Op::RecvGrad;
            if (any[k]) EXPECT_GT(i, last_posted[k]) << "out of order";
            any[k] = true;
            last_posted[k] = i;
            EXPECT_LE(++open[k], 1) << style << " rank " << r << " two of a kind open at #" << pos;
          }
          if (is_recv(prog[pos].op)) {
            EXPECT_GE(posted_at[pos], 0) << "never posted";
            --open[prog[pos].op == Op::RecvGrad];
          }
        }
      }
    }
  }
}

// The old rule broke the safe points in every schedule with more than one stage (e.g. rank 0's
// first RecvGrad went out before the activation it answers was sent); the new posting still
// posts ahead of the instruction wherever the safe point allows it.
TEST(PrePost, OldRuleWasUnsafeNewOneStillOverlaps) {
  for (const auto& [style, p, m, v] : kLayouts) {
    const Schedule s = build(style, p, m, v);
    const auto pts = receive_post_points(s);
    int unsafe = 0, early = 0;
    for (int r = 0; r < p; ++r) {
      const Program& prog = s.programs[r];
      const auto old = one_ahead(prog);
      const auto before = receive_posting(s, r, true);
      for (size_t i = 0; i < prog.size(); ++i)
        if (is_recv(prog[i].op) && old[i] < pts[r][i]) ++unsafe;
      for (size_t pos = 0; pos < prog.size(); ++pos)
        for (size_t i : before[pos]) early += pos < i;
    }
    EXPECT_GT(unsafe, 0) << style << " p " << p << " m " << m << " v " << v;
    EXPECT_GT(early, 0) << style << " p " << p << " m " << m << " v " << v;
  }
}

TEST(PrePost, BrokenProgramsAreNamed) {
  Schedule s = build("1f1b", 2, 2, 1);
  // Drop rank 1's first SendGrad: rank 0's RecvGrad has no send left for its second receive.
  auto& r1 = s.programs[1];
  for (auto it = r1.begin(); it != r1.end(); ++it)
    if (it->op == Op::SendGrad) {
      r1.erase(it);
      break;
    }
  try {
    receive_post_points(s);
    ADD_FAILURE() << "no error";
  } catch (const cai::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no matching send"), std::string::npos) << e.what();
  }
}
