// Transforms: flip, padded random crop, center crop, resize and normalisation on small CHW images.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "cai/core/error.h"
#include "cai/data/data.h"

using namespace cai;
using namespace cai::data;

namespace {

// c × h × w with value 1 + index, so zero means padding.
std::vector<float> ramp(int64_t c, int64_t h, int64_t w) {
  std::vector<float> v(static_cast<size_t>(c * h * w));
  for (size_t k = 0; k < v.size(); ++k) v[k] = static_cast<float>(k + 1);
  return v;
}

std::vector<float> run(const TransformConfig& t, const std::vector<float>& in, int64_t c, int64_t h,
                       int64_t w, bool train, uint64_t seed, uint64_t epoch, uint64_t key) {
  std::vector<float> out(static_cast<size_t>(c * t.out_height(h) * t.out_width(w)));
  apply_transform(t, in.data(), c, h, w, out.data(), train, seed, epoch, key);
  return out;
}

// The window of size oh × ow at (top, left) of the zero-padded image (top/left may be negative).
std::vector<float> window(const std::vector<float>& in, int64_t c, int64_t h, int64_t w,
                          int64_t top, int64_t left, int64_t oh, int64_t ow, bool flip = false) {
  std::vector<float> out;
  for (int64_t k = 0; k < c; ++k)
    for (int64_t y = 0; y < oh; ++y)
      for (int64_t x = 0; x < ow; ++x) {
        const int64_t sy = y + top, sx = (flip ? ow - 1 - x : x) + left;
        out.push_back(sy >= 0 && sy < h && sx >= 0 && sx < w ? in[(k * h + sy) * w + sx] : 0.0f);
      }
  return out;
}

}  // namespace

TEST(Transform, OutputSize) {
  TransformConfig t;
  EXPECT_EQ(t.out_height(28), 28);
  EXPECT_EQ(t.out_width(30), 30);
  t.resize = 32;
  EXPECT_EQ(t.out_height(28), 32);
  EXPECT_EQ(t.out_width(30), 32);
  t.random_crop = 24;
  EXPECT_EQ(t.out_height(28), 24);
  EXPECT_EQ(t.out_width(30), 24);
}

TEST(Transform, IdentityWithoutOptions) {
  const auto in = ramp(2, 3, 5);
  EXPECT_EQ(run(TransformConfig{}, in, 2, 3, 5, true, 1, 0, 7), in);
}

TEST(Transform, FlipReversesColumnsExactlyAboutHalfTheTime) {
  TransformConfig t;
  t.horizontal_flip = true;
  const auto in = ramp(3, 4, 5);
  const auto flipped = window(in, 3, 4, 5, 0, 0, 4, 5, true);
  int flips = 0, same = 0;
  for (uint64_t key = 0; key < 200; ++key) {
    const auto out = run(t, in, 3, 4, 5, true, 42, 3, key);
    if (out == flipped)
      ++flips;
    else if (out == in)
      ++same;
    EXPECT_EQ(out, run(t, in, 3, 4, 5, true, 42, 3, key)) << "not deterministic, key " << key;
    EXPECT_EQ(run(t, in, 3, 4, 5, false, 42, 3, key), in) << "eval must not flip";
  }
  EXPECT_EQ(flips + same, 200);
  EXPECT_GT(flips, 60);
  EXPECT_GT(same, 60);
  // The decision changes with the epoch and the seed for some samples.
  int epoch_diff = 0, seed_diff = 0;
  for (uint64_t key = 0; key < 64; ++key) {
    epoch_diff += run(t, in, 3, 4, 5, true, 42, 3, key) != run(t, in, 3, 4, 5, true, 42, 4, key);
    seed_diff += run(t, in, 3, 4, 5, true, 42, 3, key) != run(t, in, 3, 4, 5, true, 43, 3, key);
  }
  EXPECT_GT(epoch_diff, 0);
  EXPECT_GT(seed_diff, 0);
}

TEST(Transform, PaddedRandomCropCoversEveryOffset) {
  TransformConfig t;
  t.random_crop = 4;
  t.crop_padding = 2;
  const auto in = ramp(2, 4, 4);
  std::set<std::pair<int64_t, int64_t>> seen;
  for (uint64_t key = 0; key < 600; ++key) {
    const auto out = run(t, in, 2, 4, 4, true, 7, 0, key);
    ASSERT_EQ(out.size(), 32u);
    bool matched = false;
    for (int64_t top = -2; top <= 2 && !matched; ++top)
      for (int64_t left = -2; left <= 2 && !matched; ++left)
        if (out == window(in, 2, 4, 4, top, left, 4, 4)) {
          seen.insert({top, left});
          matched = true;
        }
    EXPECT_TRUE(matched) << "key " << key << " is not a window of the padded image";
  }
  EXPECT_EQ(seen.size(), 25u);  // all (2·2+1)² offsets occur
}

TEST(Transform, CropAndFlipTogether) {
  TransformConfig t;
  t.random_crop = 3;
  t.crop_padding = 1;
  t.horizontal_flip = true;
  const auto in = ramp(1, 5, 5);
  for (uint64_t key = 0; key < 100; ++key) {
    const auto out = run(t, in, 1, 5, 5, true, 9, 1, key);
    bool matched = false;
    for (int64_t top = -1; top <= 3 && !matched; ++top)
      for (int64_t left = -1; left <= 3 && !matched; ++left)
        for (bool flip : {false, true})
          if (out == window(in, 1, 5, 5, top, left, 3, 3, flip)) matched = true;
    EXPECT_TRUE(matched) << key;
  }
}

TEST(Transform, CenterCropInEval) {
  TransformConfig t;
  t.random_crop = 3;
  t.crop_padding = 4;
  t.horizontal_flip = true;
  const auto in = ramp(2, 5, 5);
  for (uint64_t key = 0; key < 20; ++key)
    EXPECT_EQ(run(t, in, 2, 5, 5, false, 1, 0, key), window(in, 2, 5, 5, 1, 1, 3, 3));
  // Larger than the image: centred with a zero border.
  t.random_crop = 6;
  const auto in4 = ramp(1, 4, 4);
  EXPECT_EQ(run(t, in4, 1, 4, 4, false, 1, 0, 0), window(in4, 1, 4, 4, -1, -1, 6, 6));
  // Odd difference: floor((4 - 3) / 2) = 0.
  t.random_crop = 3;
  EXPECT_EQ(run(t, in4, 1, 4, 4, false, 1, 0, 0), window(in4, 1, 4, 4, 0, 0, 3, 3));
}

TEST(Transform, CropTooLargeIsAnError) {
  TransformConfig t;
  t.random_crop = 9;
  t.crop_padding = 2;
  const auto in = ramp(1, 4, 4);
  EXPECT_THROW(run(t, in, 1, 4, 4, true, 0, 0, 0), Error);
}

TEST(Transform, ResizeBilinearHalfPixel) {
  TransformConfig t;
  t.resize = 4;
  // 1x2x2 [[0, 1], [2, 3]] -> 4x4: sources at -0.25(clamped to 0), 0.25, 0.75, 1.25(clamped).
  const std::vector<float> in = {0, 1, 2, 3};
  const auto out = run(t, in, 1, 2, 2, false, 0, 0, 0);
  const float f[4] = {0.0f, 0.25f, 0.75f, 1.0f};
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 4; ++x) EXPECT_FLOAT_EQ(out[y * 4 + x], 2 * f[y] + f[x]) << y << x;
  // 4x4 -> 2x2 averages 2x2 blocks' centres (sources at 0.5 and 2.5).
  t.resize = 2;
  const auto in4 = ramp(1, 4, 4);  // value 1 + 4y + x
  const auto down = run(t, in4, 1, 4, 4, false, 0, 0, 0);
  ASSERT_EQ(down.size(), 4u);
  EXPECT_FLOAT_EQ(down[0], 1 + 4 * 0.5f + 0.5f);
  EXPECT_FLOAT_EQ(down[1], 1 + 4 * 0.5f + 2.5f);
  EXPECT_FLOAT_EQ(down[3], 1 + 4 * 2.5f + 2.5f);
  // Non-square input to a square output.
  t.resize = 3;
  EXPECT_EQ(run(t, ramp(2, 2, 5), 2, 2, 5, false, 0, 0, 0).size(), 18u);
}

TEST(Transform, NormalizePerChannelAndBroadcast) {
  TransformConfig t;
  t.normalize = {{0.5f, 0.25f, 0.0f}, {0.5f, 0.25f, 2.0f}};
  const std::vector<float> in = {0.0f, 1.0f, 0.25f, 0.5f, 1.0f, 3.0f};  // 3 channels of 1x2
  const auto out = run(t, in, 3, 1, 2, true, 0, 0, 0);
  const std::vector<float> want = {-1.0f, 1.0f, 0.0f, 1.0f, 0.5f, 1.5f};
  for (size_t k = 0; k < want.size(); ++k) EXPECT_FLOAT_EQ(out[k], want[k]) << k;
  t.normalize = normalization_for("fashion_mnist");
  const auto one = run(t, in, 3, 1, 2, true, 0, 0, 0);
  for (size_t k = 0; k < in.size(); ++k) EXPECT_FLOAT_EQ(one[k], (in[k] - 0.2860f) / 0.3530f) << k;
  // Padding is normalised like a black pixel (pad, then normalise).
  t.random_crop = 3;
  t.crop_padding = 0;
  const auto padded = run(t, ramp(1, 1, 1), 1, 1, 1, false, 0, 0, 0);
  EXPECT_FLOAT_EQ(padded[0], -0.2860f / 0.3530f);
  EXPECT_FLOAT_EQ(padded[4], (1.0f - 0.2860f) / 0.3530f);
  // Two means for three channels.
  t = TransformConfig{};
  t.normalize = {{0.1f, 0.2f}, {1.0f, 1.0f}};
  EXPECT_THROW(run(t, in, 3, 1, 2, true, 0, 0, 0), Error);
  t.normalize = {{0.1f}, {0.0f}};
  EXPECT_THROW(run(t, in, 3, 1, 2, true, 0, 0, 0), Error);
}
