// The device allocator's caching pool (kernels/base/block_pool.h) over a fake backend of bounded
// capacity: exact reuse without backend calls, a flush (every cached block back, then a retry)
// when the backend refuses, and a random run that checks the bookkeeping and that live blocks
// never overlap.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "kernels/base/block_pool.h"

namespace {
using cai::kernels::BlockPool;
constexpr size_t MiB = size_t{1} << 20;

// Host memory standing in for a device of `capacity` bytes.
struct Backend {
  size_t capacity, used = 0, calls = 0;
  std::map<void*, size_t> live;
  explicit Backend(size_t cap) : capacity(cap) {}
  ~Backend() {
    for (auto& [p, n] : live) std::free(p);
  }
  BlockPool pool() {
    return BlockPool(
        [this](size_t n) -> void* {
          ++calls;
          if (used + n > capacity) return nullptr;
          void* p = std::malloc(n);
          live[p] = n;
          used += n;
          return p;
        },
        [this](void* p) {
          used -= live.at(p);
          live.erase(p);
          std::free(p);
        });
  }
};

TEST(BlockPool, ExactSizesComeBackWithoutTheBackend) {
  Backend be(64 * MiB);
  BlockPool p = be.pool();
  void* a = p.alloc(3 * MiB);  // rounds to 4 MiB
  void* s = p.alloc(100);      // rounds to 512 bytes
  EXPECT_EQ(p.stats().in_use, 4 * MiB + 512);
  ASSERT_TRUE(p.free(a));
  ASSERT_TRUE(p.free(s));
  EXPECT_FALSE(p.free(a));  // twice
  int x = 0;
  EXPECT_FALSE(p.free(&x));  // not the pool's
  const size_t calls = be.calls;
  EXPECT_EQ(p.alloc(4 * MiB), a);
  EXPECT_EQ(p.alloc(512), s);
  EXPECT_EQ(be.calls, calls);
  EXPECT_EQ(p.stats().cached, 0u);
  EXPECT_EQ(p.stats().peak, 4 * MiB + 512);
}

// A refusal hands every cached block back, then the request fits.
TEST(BlockPool, AtCapacityAFlushHandsBackEveryCachedBlock) {
  Backend be(16 * MiB);
  BlockPool p = be.pool();
  void* s2 = p.alloc(2 * MiB);
  void* s4 = p.alloc(4 * MiB);
  void* s6 = p.alloc(6 * MiB);
  void* live = p.alloc(4 * MiB);  // full
  ASSERT_NE(live, nullptr);
  p.free(s2);
  p.free(s4);
  p.free(s6);
  const size_t calls = be.calls;
  EXPECT_EQ(p.alloc(3 * MiB), s4);  // rounds to 4: cached exactly, no backend call
  EXPECT_EQ(be.calls, calls);
  p.free(s4);
  void* c = p.alloc(8 * MiB);  // refused: all three go back, then it fits
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(p.stats().flushes, 1u);
  EXPECT_EQ(p.stats().cached, 0u);
  EXPECT_EQ(p.stats().blocks, 2u);
  EXPECT_EQ(be.used, 12 * MiB);
  // Refused with nothing cached: nullptr, nothing changed, no flush counted.
  EXPECT_EQ(p.alloc(6 * MiB), nullptr);
  EXPECT_EQ(p.stats().flushes, 1u);
  EXPECT_EQ(p.stats().in_use, 12 * MiB);
  // Refused even after the flush (someone else holds the memory): nullptr, the cache emptied.
  p.free(c);
  be.capacity = 8 * MiB;  // the device shrinks to 8 MiB: 10 does not fit even after the flush
  EXPECT_EQ(p.alloc(10 * MiB), nullptr);
  EXPECT_EQ(p.stats().flushes, 2u);
  EXPECT_EQ(p.stats().cached, 0u);
  EXPECT_EQ(p.stats().blocks, 1u);
  EXPECT_EQ(be.used, 4 * MiB);
}

// Random requests against a 256 MiB backend: the stats add up, live blocks never overlap and
// keep what was written into them, and at the end everything goes back.
TEST(BlockPool, RandomRunKeepsTheBooks) {
  Backend be(256 * MiB);
  BlockPool p = be.pool();
  std::mt19937_64 rng(7);
  std::map<char*, size_t> live;  // ptr -> requested bytes
  std::map<char*, unsigned char> tag;
  size_t in_use = 0;
  for (int step = 0; step < 4000; ++step) {
    if (live.empty() || rng() % 100 < 55) {
      const size_t n = rng() % 4 == 0 ? 1 + rng() % (MiB - 1) : 1 + rng() % (40 * MiB);
      char* q = static_cast<char*>(p.alloc(n));
      if (!q) continue;  // full, even after a flush
      // No overlap with any live block.
      auto next = live.lower_bound(q);
      if (next != live.end()) {
        ASSERT_LE(q + n, next->first) << step;
      }
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second, q) << step;
      }
      live[q] = n;
      tag[q] = static_cast<unsigned char>(rng());
      std::memset(q, tag[q], std::min<size_t>(n, 4096));
      in_use += BlockPool::round_size(n);
    } else {
      auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
      const size_t n = std::min<size_t>(it->second, 4096);
      for (size_t i = 0; i < n; i += 511) {
        ASSERT_EQ(static_cast<unsigned char>(it->first[i]), tag[it->first]);
      }
      ASSERT_TRUE(p.free(it->first));
      in_use -= BlockPool::round_size(it->second);
      tag.erase(it->first);
      live.erase(it);
    }
    ASSERT_EQ(p.stats().in_use, in_use);
    ASSERT_EQ(p.stats().in_use + p.stats().cached, be.used) << step;
    ASSERT_EQ(p.stats().blocks, be.live.size());
  }
  EXPECT_GT(p.stats().flushes, 0u);
  for (auto& [q, n] : live) p.free(q);
  p.release_cached();
  EXPECT_EQ(be.used, 0u);
  EXPECT_EQ(p.stats().blocks, 0u);
  EXPECT_EQ(p.stats().cached, 0u);
}

}  // namespace
