// The NCCL watchdog's hand-off (cai/dist/abort_gate.h) without a GPU: a fake communicator whose
// "library calls" check that it is still alive, a user thread issuing operations through the
// gate and a watchdog thread aborting it at an arbitrary moment.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <atomic>
#include <thread>

#include "cai/dist/abort_gate.h"

using cai::Error;
using cai::dist::AbortGate;

namespace {

std::string error_of(AbortGate& g, const std::string& what) {
  try {
    const AbortGate::Use u = g.enter(what);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(AbortGate, AbortsOnceAndEveryLaterUseThrowsTheFirstReason) {
  AbortGate g;
  EXPECT_TRUE(g.live());
  { const AbortGate::Use u = g.enter("[nccl] all_reduce"); }
  int aborts = 0;
  EXPECT_TRUE(g.abort(
      "[nccl] group 'dp' (rank 1 of 2): peer rank 0 died", [&] { ++aborts; }, 1));
  EXPECT_FALSE(g.abort(
      "[nccl] a later timeout", [&] { ++aborts; }, 1));
  EXPECT_EQ(aborts, 1);
  EXPECT_EQ(g.state(), AbortGate::State::Aborted);
  EXPECT_TRUE(g.drained());
  EXPECT_EQ(error_of(g, "[nccl] all_reduce of 4 elements"),
            "[nccl] all_reduce of 4 elements: the communicator was aborted earlier: [nccl] group "
            "'dp' (rank 1 of 2): peer rank 0 died");
  EXPECT_EQ(g.with_live<int>([] { return 1; }, 0), 0);  // no query on an aborted communicator
}

TEST(AbortGate, TheAbortWaitsForTheOperationBeingIssued) {
  AbortGate g;
  std::atomic<bool> issuing{false}, issued{false}, aborted_during_issue{false};
  std::thread user([&] {
    const AbortGate::Use u = g.enter("[nccl] send");
    issuing = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // inside the library call
    issued = true;
  });
  while (!issuing) std::this_thread::yield();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(g.abort(
      "timeout", [&] { aborted_during_issue = !issued; }, 10));
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  user.join();
  EXPECT_FALSE(aborted_during_issue) << "ncclCommAbort ran while the host was inside NCCL";
  EXPECT_TRUE(g.drained());
  EXPECT_LT(waited, 5.0);
  // Meanwhile (Aborting) no new operation starts.
  EXPECT_NE(error_of(g, "[nccl] recv").find("aborted earlier: timeout"), std::string::npos);
}

TEST(AbortGate, AUseBlockedPastTheDrainLimitDoesNotHoldTheAbortBack) {
  AbortGate g;
  std::atomic<bool> release{false}, entered{false};
  int aborts = 0;
  std::thread user([&] {
    const AbortGate::Use u = g.enter("[nccl] all_reduce");
    entered = true;
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  while (!entered) std::this_thread::yield();
  EXPECT_TRUE(g.abort(
      "peer hung", [&] { ++aborts, release = true; }, 0.05));
  user.join();
  EXPECT_EQ(aborts, 1);
  EXPECT_FALSE(g.drained());
  EXPECT_EQ(g.users(), 0);
}

// Many rounds of a user issuing as fast as it can against a watchdog aborting at a random
// moment: the fake communicator is never used after its abort, the abort runs once per round,
// and the user always ends with the watchdog's reason.
TEST(AbortGate, NoUseAfterAbortUnderRaces) {
  for (int round = 0; round < 200; ++round) {
    AbortGate g;
    std::atomic<bool> alive{true}, used_dead{false};
    std::atomic<int> aborts{0};
    std::string user_error;
    std::thread user([&] {
      for (;;) {
        try {
          const AbortGate::Use u = g.enter("[nccl] all_reduce");
          if (!alive) used_dead = true;  // the library call on a freed communicator
        } catch (const Error& e) {
          user_error = e.what();
          return;
        }
      }
    });
    std::this_thread::sleep_for(std::chrono::microseconds((round * 37) % 500));
    std::thread watchdog([&] {
      g.abort(
          fmt::format("round {}: peer rank 1 died", round), [&] { alive = false, ++aborts; }, 5);
    });
    // The host's own timeout may race the watchdog: still one abort.
    g.abort(
        "host timeout", [&] { alive = false, ++aborts; }, 5);
    watchdog.join();
    user.join();
    ASSERT_FALSE(used_dead) << "round " << round;
    ASSERT_EQ(aborts, 1) << "round " << round;
    ASSERT_NE(user_error.find("the communicator was aborted earlier: "), std::string::npos);
    ASSERT_EQ(user_error.find(g.why()) != std::string::npos, true) << user_error;
  }
}
