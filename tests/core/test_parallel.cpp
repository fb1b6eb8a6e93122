#include <gtest/gtest.h>

#include <atomic>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kernels/cpu/parallel.h"

using cai::kernels::cpu::num_threads;
using cai::kernels::cpu::parallel_for;
using cai::kernels::cpu::set_num_threads;

TEST(ThreadPool, EveryIndexRunsExactlyOnce) {
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    EXPECT_EQ(num_threads(), threads);
    for (int64_t n : {0, 1, 2, 7, 100, 10001}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      parallel_for(n, 1, [&](int64_t s, int64_t e) {
        ASSERT_LE(s, e);
        for (int64_t i = s; i < e; ++i) hits[i]++;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n " << n << " i " << i;
    }
  }
}

TEST(ThreadPool, UsesSeveralThreadsAndRunsNestedCallsInline) {
  set_num_threads(2);
  std::atomic<int> blocks{0}, nested{0};
  parallel_for(1000, 1, [&](int64_t, int64_t) {
    blocks++;
    parallel_for(10, 1, [&](int64_t s, int64_t e) { nested += static_cast<int>(e - s); });
  });
  EXPECT_EQ(blocks.load(), 2);
  EXPECT_EQ(nested.load(), 20);
  // Below 2·grain the call runs as one block.
  blocks = 0;
  parallel_for(10, 8, [&](int64_t, int64_t) { blocks++; });
  EXPECT_EQ(blocks.load(), 1);
}

TEST(ThreadPool, ExceptionsReachTheCaller) {
  set_num_threads(2);
  EXPECT_THROW(parallel_for(100, 1,
                            [&](int64_t s, int64_t) {
                              if (s > 0) throw std::runtime_error("block failed");
                            }),
               std::runtime_error);
  // The pool still works afterwards.
  std::atomic<int64_t> sum{0};
  parallel_for(100, 1, [&](int64_t s, int64_t e) { sum += e - s; });
  EXPECT_EQ(sum.load(), 100);
}

// Another thread's call while the pool is in use runs inline (one block); under PoolWaits it
// waits for the pool and is split over its threads (the offload host step beside the forward).
TEST(ThreadPool, PoolWaitsWaitsForThePoolInsteadOfRunningInline) {
  set_num_threads(2);
  for (bool waits : {false, true}) {
    std::atomic<bool> holding{false}, release{false};
    std::thread holder([&] {
      parallel_for(2, 1, [&](int64_t s, int64_t) {
        if (s == 0) {
          holding = true;
          while (!release) std::this_thread::yield();
        }
      });
    });
    while (!holding) std::this_thread::yield();
    std::atomic<int> blocks{0};
    std::thread other([&] {
      std::optional<cai::kernels::cpu::PoolWaits> w;
      if (waits) w.emplace();
      parallel_for(1000, 1, [&](int64_t, int64_t) { blocks++; });
    });
    // Without PoolWaits the call has run inline by now; with it, it waits until the pool is free.
    if (!waits) other.join();
    EXPECT_EQ(blocks.load(), waits ? 0 : 1);
    release = true;
    holder.join();
    if (waits) other.join();
    EXPECT_EQ(blocks.load(), waits ? 2 : 1) << (waits ? "PoolWaits" : "inline");
  }
}
