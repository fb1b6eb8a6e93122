// Ops that tensor parallelism uses on slices of a bigger logical tensor: dropout with a strided
// RngKey (a slice's mask must be, bit for bit, the matching slice of the whole tensor's mask).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "cai/core/error.h"
#include "cai/ops/ops.h"
#include "gradcheck.h"

using namespace cai;
using cai::test::random_tensor;

namespace {

// The fp32 values of t (exact for every float dtype).
std::vector<float> values(const Tensor& t) {
  return t.to_vector();
}

// x[rows, cols] as a host vector -> x[:, c0:c0+n] as a [rows, n] tensor of dtype d.
Tensor column_slice(const std::vector<float>& x, int64_t rows, int64_t cols, int64_t c0, int64_t n,
                    DType d) {
  std::vector<float> s;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = c0; c < c0 + n; ++c) s.push_back(x[r * cols + c]);
  return Tensor::from_vector(s, {rows, n}).to(d);
}

// Bitwise equality of two fp32 vectors (so -0.0 != 0.0 and a NaN would show).
void expect_bits_equal(const std::vector<float>& a, const std::vector<float>& b,
                       const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  int64_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  EXPECT_EQ(differ, 0) << what;
}

Tensor dropout(bool fwd, const Tensor& x, float p, ops::RngKey k) {
  return fwd ? ops::dropout_fwd(x, p, k) : ops::dropout_bwd(x, p, k);
}

}  // namespace

// --- dropout with a strided key
// ------------------------------------------------------------------

TEST(StridedDropout, ColumnSliceEqualsTheSliceOfTheWholeMask) {
  const int64_t rows = 5, f = 12;
  const uint64_t base = 1000;
  const float p = 0.4f;
  const Tensor whole32 = random_tensor({rows, f}, 7);
  for (DType d : {DType::F32, DType::BF16}) {
    const Tensor whole = whole32.to(d);
    const auto wv = values(whole);
    for (bool fwd : {true, false}) {
      const auto ref = values(dropout(fwd, whole, p, {3, 4, base}));
      for (int64_t t : {2, 3}) {
        const int64_t w = f / t;
        for (int64_t r = 0; r < t; ++r) {
          const std::string what =
              fmt::format("{} {} T {} rank {}", dtype_name(d), fwd ? "fwd" : "bwd", t, r);
          const Tensor x = column_slice(wv, rows, f, r * w, w, d);
          ops::RngKey k{3, 4, base + static_cast<uint64_t>(r * w)};
          k.row = static_cast<uint64_t>(w);
          k.row_stride = static_cast<uint64_t>(f);
          const Tensor y = dropout(fwd, x, p, k);
          EXPECT_EQ(y.dtype(), d) << what;
          expect_bits_equal(values(y), values(column_slice(ref, rows, f, r * w, w, DType::F32)),
                            what);
        }
      }
    }
  }
}

TEST(StridedDropout, UnevenTokenSliceEqualsTheSliceOfTheWholeMask) {
  const int64_t b = 3, n = 7, dd = 5;
  const uint64_t base = 77;
  const float p = 0.3f;
  const Tensor whole32 = random_tensor({b, n, dd}, 8);
  for (DType d : {DType::F32, DType::BF16}) {
    const Tensor whole = whole32.to(d);
    const auto wv = values(whole);
    for (bool fwd : {true, false}) {
      const auto ref = values(dropout(fwd, whole, p, {9, 1, base}));
      // Tokens [0, 4) and [4, 7): a [B, N·D] tensor's column slices.
      for (auto [t0, len] : {std::pair<int64_t, int64_t>{0, 4}, {4, 3}}) {
        const std::string what =
            fmt::format("{} {} tokens [{}, {})", dtype_name(d), fwd ? "fwd" : "bwd", t0, t0 + len);
        const Tensor x = column_slice(wv, b, n * dd, t0 * dd, len * dd, d).reshape({b, len, dd});
        ops::RngKey k{9, 1, base + static_cast<uint64_t>(t0 * dd)};
        k.row = static_cast<uint64_t>(len * dd);
        k.row_stride = static_cast<uint64_t>(n * dd);
        const Tensor y = dropout(fwd, x, p, k);
        EXPECT_EQ(y.shape(), (Shape{b, len, dd})) << what;
        expect_bits_equal(
            values(y), values(column_slice(ref, b, n * dd, t0 * dd, len * dd, DType::F32)), what);
      }
    }
  }
}

TEST(StridedDropout, ContiguousRowsAndRowZeroKeepTheContiguousMask) {
  const Tensor x = random_tensor({6, 10}, 9);
  const auto ref = values(ops::dropout_fwd(x, 0.5f, {1, 2, 33}));
  ops::RngKey k{1, 2, 33};
  k.row = 10;
  k.row_stride = 10;  // rows that follow each other
  expect_bits_equal(values(ops::dropout_fwd(x, 0.5f, k)), ref, "row_stride == row");
  k.row = 0;
  k.row_stride = 123;  // ignored when row is 0
  expect_bits_equal(values(ops::dropout_fwd(x, 0.5f, k)), ref, "row 0");
  int64_t dropped = 0;
  for (float v : ref) dropped += v == 0.0f;
  EXPECT_GT(dropped, 0);
  EXPECT_LT(dropped, 60);
}

TEST(StridedDropout, OverlappingRowsAreAnError) {
  ops::RngKey k{1, 2, 0};
  k.row = 8;
  k.row_stride = 4;
  try {
    ops::dropout_fwd(random_tensor({2, 8}, 1), 0.5f, k);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("[dropout]", 0), 0u) << m;
    EXPECT_NE(m.find("row_stride 4"), std::string::npos) << m;
    EXPECT_NE(m.find("row 8"), std::string::npos) << m;
  }
}

TEST(StridedDropout, DropPathIgnoresRow) {
  const Tensor x = random_tensor({16, 3}, 10);
  ops::RngKey k{5, 6, 7};
  const auto ref = values(ops::drop_path_fwd(x, 0.5f, k));
  k.row = 2;
  k.row_stride = 100;
  expect_bits_equal(values(ops::drop_path_fwd(x, 0.5f, k)), ref, "drop_path");
}
