// StallMonitor (cai/dist/stall_monitor.h): fires once when its loop stops beating, never while
// it beats, and stops promptly.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "cai/dist/stall_monitor.h"

using cai::dist::StallMonitor;
using namespace std::chrono_literals;

TEST(StallMonitor, QuietWhileBeating) {
  std::atomic<int> calls{0};
  {
    StallMonitor m(
        0.15, "watchdog", [&](const std::string&) { ++calls; }, 0.01);
    for (int i = 0; i < 40; ++i) {
      m.beat();
      std::this_thread::sleep_for(10ms);
    }
    EXPECT_FALSE(m.fired());
  }
  EXPECT_EQ(calls.load(), 0);
}

TEST(StallMonitor, FiresOnceNamingWhatStalled) {
  std::atomic<int> calls{0};
  std::string msg;
  std::mutex mu;
  StallMonitor m(
      0.1, "the NCCL watchdog of rank 3",
      [&](const std::string& s) {
        std::lock_guard<std::mutex> l(mu);
        msg = s;
        ++calls;
      },
      0.01);
  const auto t0 = std::chrono::steady_clock::now();
  while (!m.fired() && std::chrono::steady_clock::now() - t0 < 5s) std::this_thread::sleep_for(5ms);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(m.fired());
  EXPECT_GE(waited, 0.09);
  std::this_thread::sleep_for(150ms);  // stalled still: no second call
  std::lock_guard<std::mutex> l(mu);
  EXPECT_EQ(calls.load(), 1);
  EXPECT_NE(msg.find("the NCCL watchdog of rank 3 made no progress for"), std::string::npos) << msg;
  EXPECT_NE(msg.find("limit 0 s"), std::string::npos) << msg;
}

TEST(StallMonitor, StopsPromptlyWithALongPoll) {
  const auto t0 = std::chrono::steady_clock::now();
  {
    StallMonitor m(
        100, "x", [](const std::string&) {}, 30.0);
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
}
