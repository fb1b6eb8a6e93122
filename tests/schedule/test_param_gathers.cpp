// schedule::ParamGatherQueue: ZeRO-1/2's deferred parameter gathers (the order the executor and
// the simulator share).
#include <gtest/gtest.h>

#include "cai/core/error.h"
#include "cai/schedule/param_gathers.h"

using namespace cai;
using schedule::ParamGatherQueue;
using A = ParamGatherQueue::Action;

TEST(ParamGathers, OrderFollowsTheFirstLayer) {
  // Buckets are in backward order: the last layers' bucket first.
  EXPECT_EQ(schedule::param_gather_order({5, 3, 3, 0}), (std::vector<int>{3, 1, 2, 0}));
}

TEST(ParamGathers, IssuesAWindowAndCompletesOnUse) {
  ParamGatherQueue q({3, 2, 1, 0}, 2);
  EXPECT_FALSE(q.any_stale());  // nothing to gather before the first step
  EXPECT_EQ(q.begin(), (std::vector<A>{{true, 3}, {true, 2}}));
  EXPECT_TRUE(q.any_stale());
  EXPECT_EQ(q.in_flight(), 2);
  // The first layer's bucket: complete it, then the window issues the next.
  EXPECT_EQ(q.need(3), (std::vector<A>{{false, 3}, {true, 1}}));
  EXPECT_TRUE(q.need(3).empty());  // current now
  // A later bucket completes the ones before it first (same order on every rank).
  EXPECT_EQ(q.need(1), (std::vector<A>{{false, 2}, {true, 0}, {false, 1}}));
  EXPECT_TRUE(q.stale(0));
  EXPECT_FALSE(q.stale(2));
  EXPECT_EQ(q.need_all(), (std::vector<A>{{false, 0}}));
  EXPECT_FALSE(q.any_stale());
  EXPECT_TRUE(q.need_all().empty());
}

TEST(ParamGathers, WindowOfOne) {
  ParamGatherQueue q({0, 1, 2}, 1);
  EXPECT_EQ(q.begin(), (std::vector<A>{{true, 0}}));
  EXPECT_EQ(q.need_all(),
            (std::vector<A>{{false, 0}, {true, 1}, {false, 1}, {true, 2}, {false, 2}}));
  // The next step starts the same way.
  EXPECT_EQ(q.begin(), (std::vector<A>{{true, 0}}));
}

TEST(ParamGathers, RejectsBadInput) {
  EXPECT_THROW(ParamGatherQueue({0, 0}, 1), Error);
  EXPECT_THROW(ParamGatherQueue({0, 1}, 0), Error);
  ParamGatherQueue q({0, 1}, 1);
  EXPECT_THROW(q.need(2), Error);
  q.begin();
  EXPECT_THROW(q.begin(), Error);  // the last step's gathers are not complete
}
