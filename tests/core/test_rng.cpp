#include <gtest/gtest.h>

#include <cmath>

#include "cai/core/rng.h"
#include "kernels/base/philox.h"

using namespace cai;

TEST(Philox, KnownAnswer) {
  // Random123's Philox4x32-10 known-answer test: counter 0, key 0.
  const auto b = philox::block(0, 0, 0);
  EXPECT_EQ(b.v[0], 0x6627e8d5u);
  EXPECT_EQ(b.v[1], 0xe169c58du);
  EXPECT_EQ(b.v[2], 0xbc57ac4cu);
  EXPECT_EQ(b.v[3], 0x9b00dbd8u);
  const auto m = philox::block(~0ull, ~0ull, ~0ull);
  EXPECT_EQ(m.v[0], 0x408f276du);
  EXPECT_EQ(m.v[3], 0x6d5451fdu);
  // counter (243f6a88 85a308d3 13198a2e 03707344), key (a4093822 299f31d0)
  const auto pi =
      philox::block(0x299f31d0a4093822ull, 0x0370734413198a2eull, 0x85a308d3243f6a88ull);
  EXPECT_EQ(pi.v[0], 0xd16cfe09u);
  EXPECT_EQ(pi.v[1], 0x94fdccebu);
  EXPECT_EQ(pi.v[2], 0x5001e420u);
  EXPECT_EQ(pi.v[3], 0x24126ea1u);
}

TEST(Rng, ShardsEqualSlicesOfTheWhole) {
  // A tensor initialised whole equals its shards initialised at their offsets: the layout does not
  // change the values.
  Tensor whole = Tensor::empty({10, 7});
  rng::trunc_normal_(whole, 5, rng::stream_of("blocks.0.attn.qkv.weight"), 0, 0.02f, -2, 2);
  const auto w = whole.to_vector();
  for (int64_t start : {0, 3, 9}) {
    Tensor shard = Tensor::empty({1, 7});
    rng::trunc_normal_(shard, 5, rng::stream_of("blocks.0.attn.qkv.weight"), 0, 0.02f, -2, 2,
                       start * 7);
    const auto s = shard.to_vector();
    for (int j = 0; j < 7; ++j) EXPECT_EQ(s[j], w[start * 7 + j]);
  }
}

TEST(Rng, DistributionsHaveTheirMoments) {
  Tensor t = Tensor::empty({200000});
  auto moments = [&](double* mean, double* var) {
    const auto v = t.to_vector();
    double s = 0, s2 = 0;
    for (float x : v) s += x, s2 += double(x) * x;
    *mean = s / v.size();
    *var = s2 / v.size() - *mean * *mean;
  };
  double m, v;
  rng::uniform_(t, 1, 2, -1.0f, 3.0f);
  moments(&m, &v);
  EXPECT_NEAR(m, 1.0, 0.02);
  EXPECT_NEAR(v, 16.0 / 12.0, 0.02);
  rng::normal_(t, 1, 3, 0.5f, 2.0f);
  moments(&m, &v);
  EXPECT_NEAR(m, 0.5, 0.02);
  EXPECT_NEAR(v, 4.0, 0.05);
  rng::trunc_normal_(t, 1, 4, 0.0f, 1.0f, -1.0f, 1.0f);
  moments(&m, &v);
  EXPECT_NEAR(m, 0.0, 0.01);
  EXPECT_NEAR(v, 0.2911, 0.01);  // variance of N(0,1) truncated to [-1, 1]
  for (float x : t.to_vector()) ASSERT_TRUE(x >= -1.0f && x <= 1.0f);
  // Different streams and seeds give different numbers.
  EXPECT_NE(philox::word(1, 2, 0), philox::word(1, 3, 0));
  EXPECT_NE(philox::word(1, 2, 0), philox::word(2, 2, 0));
}
