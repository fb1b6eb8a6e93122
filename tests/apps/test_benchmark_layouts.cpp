// colossalai benchmark's layout enumeration against Colossal-AI's definition, for every N up to
// 4096, with exact integer roots (its float cube root missed 64).
#include <gtest/gtest.h>

#include "cai/core/error.h"
#include "cmd_benchmark.h"

using cai::app::enumerate_layouts;
using cai::app::integer_root;
using cai::app::TpLayout;

namespace {
bool square(int n) {
  for (int r = 1; r * r <= n; ++r)
    if (r * r == n) return true;
  return false;
}
bool cube(int n) {
  for (int r = 1; r * r * r <= n; ++r)
    if (r * r * r == n) return true;
  return false;
}
}  // namespace

TEST(BenchmarkLayouts, MatchTheDefinitionUpTo4096) {
  for (int n = 1; n <= 4096; ++n) {
    std::vector<TpLayout> want{{"none", 1, 1}, {"1d", n, 1}};
    if (n > 1 && square(n)) want.push_back({"2d", n, 1});
    for (int d = 1; d < n; ++d)
      if (n % d == 0 && square(n / d)) want.push_back({"2.5d", n, d});
    if (n > 1 && cube(n)) want.push_back({"3d", n, 1});
    ASSERT_EQ(enumerate_layouts(n), want) << "n = " << n;
  }
}

TEST(BenchmarkLayouts, ColossalAiExamples) {
  auto modes = [](int n) {
    std::vector<std::string> out;
    for (const auto& l : enumerate_layouts(n))
      out.push_back(l.mode == "2.5d" ? "2.5d:" + std::to_string(l.depth) : l.mode);
    return out;
  };
  EXPECT_EQ(modes(1), (std::vector<std::string>{"none", "1d"}));
  EXPECT_EQ(modes(4), (std::vector<std::string>{"none", "1d", "2d", "2.5d:1"}));
  EXPECT_EQ(modes(8), (std::vector<std::string>{"none", "1d", "2.5d:2", "3d"}));
  EXPECT_EQ(modes(16), (std::vector<std::string>{"none", "1d", "2d", "2.5d:1", "2.5d:4"}));
  EXPECT_EQ(modes(64),
            (std::vector<std::string>{"none", "1d", "2d", "2.5d:1", "2.5d:4", "2.5d:16", "3d"}));
  const auto l4096 = modes(4096);
  EXPECT_EQ(l4096.back(), "3d");  // 16³
  EXPECT_THROW(enumerate_layouts(0), cai::Error);
}

TEST(BenchmarkLayouts, IntegerRootsAreExact) {
  EXPECT_EQ(integer_root(64, 3), 4);
  EXPECT_EQ(integer_root(63, 3), 3);
  EXPECT_EQ(integer_root(4096, 3), 16);
  EXPECT_EQ(integer_root(1, 2), 1);
  EXPECT_EQ(integer_root(0, 2), 0);
  EXPECT_EQ(integer_root(int64_t(1) << 62, 2), int64_t(1) << 31);
  EXPECT_EQ(integer_root(1000000000000000000LL, 3), 1000000);
  EXPECT_EQ(integer_root(999999999999999999LL, 3), 999999);
}
