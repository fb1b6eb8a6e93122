// Reader for golden files written by scripts/golden/goldenio.py (format documented there and in
// tests/data/README.md).
#pragma once
#include <map>
#include <string>

#include "cai/core/tensor.h"
#include "cai/nn/vit.h"

namespace cai::test {

std::map<std::string, Tensor> load_golden(const std::string& path);

// Worst |a - b| / (atol + rtol·|b|) over elements; ≤ 1 means within tolerance.
double tolerance_ratio(const Tensor& a, const Tensor& b, double rtol, double atol);
// ‖a − b‖ / ‖b‖.
double rel_error(const Tensor& a, const Tensor& b);

std::string data_path(const std::string& file);  // CAI_TEST_DATA_DIR/file

// The ViT configuration stored in a golden file ("config.ints": img, patch, in_chans, classes,
// dim, depth, heads, mlp hidden).
nn::ViTConfig vit_config(const std::map<std::string, Tensor>& golden);

}  // namespace cai::test
