// DistributedSampler: shards are disjoint (padding aside), cover the set, and every global batch
// holds the samples of the single-process batch of batch_size × world.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>
#include <set>
#include <vector>

#include "cai/core/error.h"
#include "cai/data/data.h"

using namespace cai;
using namespace cai::data;

TEST(Sampler, ShardsMatchTheSingleProcessGlobalBatch) {
  for (int64_t n : {10, 17, 64})
    for (int world : {1, 2, 3, 4})
      for (int64_t bs : {1, 3, 8})
        for (bool shuffle : {false, true})
          for (bool drop_last : {false, true})
            for (int64_t epoch : {0, 5}) {
              SCOPED_TRACE(::testing::Message()
                           << "n " << n << " world " << world << " bs " << bs << " shuffle "
                           << shuffle << " drop_last " << drop_last << " epoch " << epoch);
              const uint64_t seed = 1234;
              DistributedSampler ref(n, bs * world, 1, 0, shuffle, drop_last, seed);
              const int64_t nb = ref.num_batches();
              const auto ref_all = ref.indices(epoch);
              std::vector<DistributedSampler> ranks;
              for (int r = 0; r < world; ++r)
                ranks.emplace_back(n, bs, world, r, shuffle, drop_last, seed);

              std::multiset<int64_t> all;
              std::vector<int64_t> concat_all;
              for (int r = 0; r < world; ++r) {
                ASSERT_EQ(ranks[r].num_batches(), nb);
                const auto idx = ranks[r].indices(epoch);
                // indices() is the concatenation of the rank's batches.
                std::vector<int64_t> cat;
                for (int64_t b = 0; b < nb; ++b) {
                  const auto part = ranks[r].batch(epoch, b, nullptr);
                  cat.insert(cat.end(), part.begin(), part.end());
                }
                EXPECT_EQ(idx, cat);
                all.insert(idx.begin(), idx.end());
                for (int64_t i : idx) {
                  ASSERT_GE(i, 0);
                  ASSERT_LT(i, n);
                }
              }

              int64_t ref_pos = 0;
              for (int64_t b = 0; b < nb; ++b) {
                const auto want = ref.batch(epoch, b, nullptr);
                std::vector<int64_t> got;  // the global batch, ranks in order
                for (int r = 0; r < world; ++r) {
                  int64_t off = -1;
                  const auto part = ranks[r].batch(epoch, b, &off);
                  EXPECT_EQ(off, static_cast<int64_t>(got.size()));
                  EXPECT_EQ(part.size() * world,
                            static_cast<size_t>(ranks[r].global_batch_size(b)));
                  if (b + 1 < nb) {
                    EXPECT_EQ(static_cast<int64_t>(part.size()), bs);
                  }
                  got.insert(got.end(), part.begin(), part.end());
                }
                EXPECT_EQ(static_cast<int64_t>(got.size()), ranks[0].global_batch_size(b));
                ASSERT_GE(got.size(), want.size());
                // The single-process batch, in the same order; anything beyond is padding that
                // repeats the first indices of the epoch, fewer than `world` of them.
                EXPECT_EQ(std::vector<int64_t>(got.begin(), got.begin() + want.size()), want);
                const size_t pad = got.size() - want.size();
                EXPECT_LT(pad, static_cast<size_t>(world));
                if (pad > 0) {
                  EXPECT_EQ(b, nb - 1) << "only the last global batch is padded";
                  for (size_t k = 0; k < pad; ++k) EXPECT_EQ(got[want.size() + k], ref_all[k]);
                }
                EXPECT_EQ(std::set<int64_t>(got.begin(), got.begin() + want.size()).size(),
                          want.size());
                ref_pos += static_cast<int64_t>(want.size());
              }
              EXPECT_EQ(ref_pos, static_cast<int64_t>(ref_all.size()));

              // Coverage: every index exactly once, apart from padding (not drop_last) or the
              // dropped tail (drop_last).
              const std::set<int64_t> distinct(all.begin(), all.end());
              if (drop_last) {
                const int64_t kept = n / (bs * world) * (bs * world);
                EXPECT_EQ(static_cast<int64_t>(all.size()), kept);
                EXPECT_EQ(static_cast<int64_t>(distinct.size()), kept);
                EXPECT_EQ(distinct, std::set<int64_t>(ref_all.begin(), ref_all.end()));
              } else {
                EXPECT_EQ(static_cast<int64_t>(distinct.size()), n);
                EXPECT_EQ(static_cast<int64_t>(all.size()), (n + world - 1) / world * world);
              }
            }
}

TEST(Sampler, ShuffleIsASeededPermutationPerEpoch) {
  DistributedSampler s(1000, 10, 1, 0, true, false, 7);
  const auto e0 = s.indices(0);
  const auto e1 = s.indices(1);
  std::vector<int64_t> sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> iota(1000);
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(sorted, iota);
  EXPECT_NE(e0, iota);
  EXPECT_NE(e0, e1);
  EXPECT_EQ(e0, DistributedSampler(1000, 10, 1, 0, true, false, 7).indices(0));
  EXPECT_NE(e0, DistributedSampler(1000, 10, 1, 0, true, false, 8).indices(0));
  // The epoch's order does not depend on the batch size or world: rank 0 of 4 with batch 5 sees
  // the first 5 of every 20 of the single-process order.
  const auto r0 = DistributedSampler(1000, 5, 4, 0, true, false, 7).indices(1);
  for (size_t k = 0; k < r0.size(); ++k) EXPECT_EQ(r0[k], e1[k / 5 * 20 + k % 5]);
  // Position of every index is roughly uniform: index 0 is not always near the front.
  std::map<int64_t, int> first_half;
  for (int64_t e = 0; e < 40; ++e) {
    const auto o = s.indices(e);
    const auto it = std::find(o.begin(), o.end(), 0);
    first_half[it - o.begin() < 500]++;
  }
  EXPECT_GT(first_half[0], 5);
  EXPECT_GT(first_half[1], 5);
  // Without shuffle, the order is the identity.
  EXPECT_EQ(DistributedSampler(1000, 10, 1, 0, false, false, 7).indices(3), iota);
}

TEST(Sampler, PaddingAndShortLastBatch) {
  // n = 10, world 4, batch 2: global batches of 8, then the 2 remaining + 2 padded split in 4
  // blocks of 1.
  for (int r = 0; r < 4; ++r) {
    DistributedSampler s(10, 2, 4, r, false, false, 0);
    EXPECT_EQ(s.num_batches(), 2);
    EXPECT_EQ(s.global_batch_size(0), 8);
    EXPECT_EQ(s.global_batch_size(1), 4);
    int64_t off = -1;
    EXPECT_EQ(s.batch(0, 0, &off), (std::vector<int64_t>{2 * r, 2 * r + 1}));
    EXPECT_EQ(off, 2 * r);
    const std::vector<int64_t> last[4] = {{8}, {9}, {0}, {1}};
    EXPECT_EQ(s.batch(0, 1, &off), last[r]);
    EXPECT_EQ(off, r);
  }
  // More ranks than samples: every rank gets one sample, repeating from the start.
  DistributedSampler tiny(1, 4, 3, 2, true, false, 0);
  EXPECT_EQ(tiny.indices(0), (std::vector<int64_t>{0}));
  // drop_last with fewer samples than a global batch: nothing.
  EXPECT_EQ(DistributedSampler(10, 4, 4, 1, true, true, 0).num_batches(), 0);
  EXPECT_TRUE(DistributedSampler(0, 4, 2, 1, true, false, 0).indices(0).empty());
}

TEST(Sampler, BadArguments) {
  EXPECT_THROW(DistributedSampler(10, 0, 1, 0, true, false, 0), Error);
  EXPECT_THROW(DistributedSampler(10, 2, 0, 0, true, false, 0), Error);
  EXPECT_THROW(DistributedSampler(10, 2, 2, 2, true, false, 0), Error);
  EXPECT_THROW(DistributedSampler(10, 2, 2, -1, true, false, 0), Error);
  DistributedSampler s(10, 2, 2, 0, true, false, 0);
  EXPECT_THROW(s.batch(0, 3, nullptr), Error);
  EXPECT_THROW(s.global_batch_size(-1), Error);
}
