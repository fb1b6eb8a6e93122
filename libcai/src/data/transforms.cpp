// Image transforms on CHW fp32: bilinear resize, (random) crop with zero padding, horizontal flip,
// per-channel normalisation. Random choices come from philox(seed, stream(epoch), sample key), so
// a sample's augmentation does not depend on which worker or batch handles it.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "cai/core/error.h"
#include "cai/core/rng.h"
#include "cai/data/data.h"
#include "kernels/base/philox.h"

namespace cai::data {
namespace {

// Offsets of the draws of one sample within its epoch's stream.
constexpr uint64_t kDrawsPerSample = 4;
constexpr uint64_t kDrawTop = 0, kDrawLeft = 1, kDrawFlip = 2;

// Source coordinate and weights of bilinear interpolation with half-pixel centres
// (align_corners=False, as torch.nn.functional.interpolate / torchvision without antialias).
struct Tap {
  int64_t i0, i1;
  float l0, l1;
};

std::vector<Tap> taps(int64_t in, int64_t out) {
  std::vector<Tap> t(static_cast<size_t>(out));
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  for (int64_t o = 0; o < out; ++o) {
    double src = (static_cast<double>(o) + 0.5) * scale - 0.5;
    if (src < 0) src = 0;
    int64_t i0 = static_cast<int64_t>(src);
    if (i0 > in - 1) i0 = in - 1;
    const int64_t i1 = i0 < in - 1 ? i0 + 1 : i0;
    const float l1 = static_cast<float>(src - static_cast<double>(i0));
    t[static_cast<size_t>(o)] = {i0, i1, 1.0f - l1, l1};
  }
  return t;
}

void resize_bilinear(const float* in, int64_t c, int64_t h, int64_t w, float* out, int64_t oh,
                     int64_t ow) {
  const std::vector<Tap> ty = taps(h, oh), tx = taps(w, ow);
  for (int64_t ch = 0; ch < c; ++ch) {
    const float* src = in + ch * h * w;
    float* dst = out + ch * oh * ow;
    for (int64_t y = 0; y < oh; ++y) {
      const Tap& a = ty[static_cast<size_t>(y)];
      const float* r0 = src + a.i0 * w;
      const float* r1 = src + a.i1 * w;
      for (int64_t x = 0; x < ow; ++x) {
        const Tap& b = tx[static_cast<size_t>(x)];
        dst[y * ow + x] =
            a.l0 * (b.l0 * r0[b.i0] + b.l1 * r0[b.i1]) + a.l1 * (b.l0 * r1[b.i0] + b.l1 * r1[b.i1]);
      }
    }
  }
}

int64_t floor_half(int64_t d) {
  return d >= 0 ? d / 2 : -((-d + 1) / 2);
}

// A uniform integer in [0, m] from one Philox word.
int64_t draw_int(uint64_t seed, uint64_t stream, uint64_t offset, int64_t m) {
  return static_cast<int64_t>(philox::word(seed, stream, offset) % static_cast<uint64_t>(m + 1));
}

}  // namespace

int64_t TransformConfig::out_height(int64_t h) const {
  if (random_crop > 0) return random_crop;
  return resize > 0 ? resize : h;
}

int64_t TransformConfig::out_width(int64_t w) const {
  if (random_crop > 0) return random_crop;
  return resize > 0 ? resize : w;
}

void apply_transform(const TransformConfig& t, const float* in, int64_t c, int64_t h, int64_t w,
                     float* out, bool train, uint64_t seed, uint64_t epoch, uint64_t sample_key) {
  CAI_CHECK(c > 0 && h > 0 && w > 0, "[transform] input {}x{}x{} (CxHxW) must be non-empty", c, h,
            w);
  CAI_CHECK(t.resize >= 0 && t.random_crop >= 0 && t.crop_padding >= 0,
            "[transform] resize {}, random_crop {}, crop_padding {} must be >= 0", t.resize,
            t.random_crop, t.crop_padding);
  const auto& mean = t.normalize.mean;
  const auto& stdv = t.normalize.std;
  CAI_CHECK(mean.size() == stdv.size(),
            "[transform] normalize has {} means but {} standard deviations", mean.size(),
            stdv.size());
  CAI_CHECK(
      mean.empty() || mean.size() == 1 || static_cast<int64_t>(mean.size()) == c,
      "[transform] normalize has {} means/stds for an image of {} channels (expected {} or 1)",
      mean.size(), c, c);
  for (size_t k = 0; k < stdv.size(); ++k)
    CAI_CHECK(stdv[k] > 0, "[transform] normalize std[{}] = {} must be > 0", k, stdv[k]);

  // 1. Resize.
  std::vector<float> resized;
  const float* cur = in;
  int64_t ch = h, cw = w;
  if (t.resize > 0 && (t.resize != h || t.resize != w)) {
    resized.resize(static_cast<size_t>(c * t.resize * t.resize));
    resize_bilinear(in, c, h, w, resized.data(), t.resize, t.resize);
    cur = resized.data();
    ch = cw = t.resize;
  }

  // 2. Crop: output (y, x) reads source (y + top, x + left); outside the source is zero padding.
  const uint64_t stream = rng::stream_of("augment") ^ philox::mix64(epoch);
  const uint64_t base = sample_key * kDrawsPerSample;
  const int64_t oh = t.out_height(h), ow = t.out_width(w);
  int64_t top = 0, left = 0;
  if (t.random_crop > 0) {
    if (train) {
      const int64_t p = t.crop_padding;
      CAI_CHECK(t.random_crop <= ch + 2 * p && t.random_crop <= cw + 2 * p,
                "[transform] random crop {} does not fit an image of {}x{} padded by {}",
                t.random_crop, ch, cw, p);
      top = draw_int(seed, stream, base + kDrawTop, ch + 2 * p - t.random_crop) - p;
      left = draw_int(seed, stream, base + kDrawLeft, cw + 2 * p - t.random_crop) - p;
    } else {
      top = floor_half(ch - t.random_crop);  // center crop (negative: zero-padded)
      left = floor_half(cw - t.random_crop);
    }
  }

  // 3. Flip.
  const bool flip =
      train && t.horizontal_flip && philox::uniform(seed, stream, base + kDrawFlip) < 0.5f;

  // 4. Write, normalising per channel.
  for (int64_t k = 0; k < c; ++k) {
    float m = 0, s = 1;
    if (!mean.empty()) {
      const size_t j = mean.size() == 1 ? 0 : static_cast<size_t>(k);
      m = mean[j];
      s = stdv[j];
    }
    const float* src = cur + k * ch * cw;
    float* dst = out + k * oh * ow;
    for (int64_t y = 0; y < oh; ++y) {
      const int64_t sy = y + top;
      const bool row_in = sy >= 0 && sy < ch;
      for (int64_t x = 0; x < ow; ++x) {
        const int64_t sx = (flip ? ow - 1 - x : x) + left;
        const float v = row_in && sx >= 0 && sx < cw ? src[sy * cw + sx] : 0.0f;
        dst[y * ow + x] = (v - m) / s;
      }
    }
  }
}

}  // namespace cai::data
