// Deterministic inputs of the tiny-ViT layer tests (split backward, GELU recompute): images from
// a sine of the element index, labels cycling through 5 classes, and bitwise tensor comparison.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cai/core/tensor.h"
#include "cai/nn/vit.h"

namespace cai::nn::vit_inputs {

inline Tensor images(const ViTConfig& c, int64_t b, float phase) {
  std::vector<float> v(b * c.in_chans * c.img_size * c.img_size);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(phase * static_cast<float>(i + 1));
  return Tensor::from_vector(v, {b, c.in_chans, c.img_size, c.img_size});
}

inline Tensor labels(int64_t b) {
  std::vector<int32_t> v(b);
  for (int64_t i = 0; i < b; ++i) v[i] = static_cast<int32_t>((i * 3) % 5);
  return Tensor::from_vector(v, {b});
}

inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  const auto x = a.to_vector(), y = b.to_vector();
  return std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

}  // namespace cai::nn::vit_inputs
