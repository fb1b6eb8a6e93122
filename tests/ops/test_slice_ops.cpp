// Ops that tensor parallelism uses on slices of a bigger logical tensor: dropout with a strided
// RngKey (a slice's mask must be, bit for bit, the matching slice of the whole tensor's mask) and
// copy_tokens_ (token ranges of [B, N, F] tensors, with the errors naming the wrong values),
// tokens_from_ranks_ / tokens_to_ranks_ (the CPU reference of sequence parallelism's staging).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "cai/core/error.h"
#include "cai/ops/ops.h"
#include "gradcheck.h"
#include "kernels/tokens.h"

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

// --- copy_tokens_
// --------------------------------------------------------------------------------

namespace {

// A [b, n, f] tensor of dtype d holding small integers (exact in every dtype), distinct per seed.
Tensor iota(const Shape& s, DType d, int seed) {
  const int64_t n = shape_numel(s);
  if (d == DType::I32) {
    std::vector<int32_t> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>((i * 7 + seed * 31) % 201 - 100);
    return Tensor::from_vector(v, s);
  }
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 7 + seed * 31) % 201 - 100);
  return Tensor::from_vector(v, s).to(d);
}
std::vector<float> host(const Tensor& t) {
  if (t.dtype() != DType::I32) return t.to_vector();
  const int32_t* p = t.data<int32_t>();
  return std::vector<float>(p, p + t.numel());
}
// The reference: element by element on host vectors.
std::vector<float> copy_ref(std::vector<float> dst, const Shape& ds, const std::vector<float>& src,
                            const Shape& ss, int64_t dt, int64_t st, int64_t count) {
  const int64_t b = ds[0], nd = ds[1], ns = ss[1], f = ds[2];
  for (int64_t i = 0; i < b; ++i)
    for (int64_t t = 0; t < count; ++t)
      for (int64_t j = 0; j < f; ++j)
        dst[(i * nd + dt + t) * f + j] = src[(i * ns + st + t) * f + j];
  return dst;
}
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST(CopyTokens, CopiesTokenRangesOfEverySample) {
  struct Case {
    Shape ds, ss;
    int64_t dt, st, count;
  };
  const Case cases[] = {
      {{2, 5, 3}, {2, 7, 3}, 1, 2, 3},  // middle to middle
      {{3, 4, 8}, {3, 4, 8}, 0, 0, 4},  // everything
      {{1, 9, 2}, {1, 3, 2}, 6, 0, 3},  // into the tail
      {{4, 2, 5}, {4, 6, 5}, 0, 4, 2},  // from the tail
      {{2, 5, 3}, {2, 7, 3}, 5, 7, 0},  // count 0 at the ends: nothing
  };
  for (DType d : {DType::F32, DType::BF16, DType::F16, DType::I32}) {
    for (const Case& c : cases) {
      const std::string what = fmt::format("{} dst {} [{}] src {} [{}] count {}", dtype_name(d),
                                           shape_str(c.ds), c.dt, shape_str(c.ss), c.st, c.count);
      Tensor dst = iota(c.ds, d, 1);
      const Tensor src = iota(c.ss, d, 2);
      const auto want = copy_ref(host(dst), c.ds, host(src), c.ss, c.dt, c.st, c.count);
      ops::copy_tokens_(dst, c.dt, src, c.st, c.count);
      EXPECT_EQ(host(dst), want) << what;
    }
  }
}

TEST(CopyTokens, ViewsWithAnOffset) {
  for (DType d : {DType::F32, DType::BF16, DType::I32}) {
    const Tensor dst_all = iota({5, 6, 4}, d, 3), src_all = iota({7, 3, 4}, d, 4);
    const auto before = host(dst_all);
    Tensor dst = dst_all.narrow(2, 2);  // samples 2, 3
    const Tensor src = src_all.narrow(4, 2);
    const auto want = copy_ref(host(dst), dst.shape(), host(src), src.shape(), 3, 1, 2);
    ops::copy_tokens_(dst, 3, src, 1, 2);
    EXPECT_EQ(host(dst), want) << dtype_name(d);
    // The samples outside the view are untouched.
    const auto after = host(dst_all);
    const int64_t per = 6 * 4;
    for (int64_t i = 0; i < 5 * per; ++i) {
      if (i / per < 2 || i / per >= 4) {
        EXPECT_EQ(after[i], before[i]) << dtype_name(d) << " " << i;
      }
    }
  }
}

TEST(CopyTokens, ErrorsNameTheWrongValues) {
  Tensor dst = Tensor::zeros({2, 5, 3});
  const Tensor src = Tensor::zeros({2, 7, 3});
  auto expect_error = [](const std::string& m, std::vector<std::string> parts) {
    EXPECT_EQ(m.rfind("[copy_tokens]", 0), 0u) << m;
    for (const auto& p : parts) EXPECT_NE(m.find(p), std::string::npos) << p << " in: " << m;
  };
  Tensor flat = Tensor::zeros({10, 3});
  expect_error(error_of([&] { ops::copy_tokens_(flat, 0, src, 0, 1); }), {"dst", "rank 2"});
  expect_error(error_of([&] {
                 ops::copy_tokens_(dst, 0, Tensor::zeros({14, 3}), 0, 1);
               }),
               {"src", "rank 2"});
  expect_error(error_of([&] {
                 ops::copy_tokens_(dst, 0, Tensor::zeros({3, 7, 3}), 0, 1);
               }),
               {"[2, 5, 3]", "[3, 7, 3]"});
  expect_error(error_of([&] {
                 ops::copy_tokens_(dst, 0, Tensor::zeros({2, 7, 4}), 0, 1);
               }),
               {"[2, 5, 3]", "[2, 7, 4]"});
  expect_error(error_of([&] { ops::copy_tokens_(dst, 0, src.to(DType::BF16), 0, 1); }),
               {"fp32", "bf16"});
  expect_error(error_of([&] { ops::copy_tokens_(dst, 3, src, 0, 3); }),
               {"dst tokens [3, 6)", "[0, 5)"});
  expect_error(error_of([&] { ops::copy_tokens_(dst, -1, src, 0, 1); }), {"dst tokens [-1, 0)"});
  expect_error(error_of([&] { ops::copy_tokens_(dst, 0, src, 5, 3); }),
               {"src tokens [5, 8)", "[0, 7)"});
  expect_error(error_of([&] { ops::copy_tokens_(dst, 0, src, 0, -2); }), {"count -2"});
}

// --- tokens_from_ranks_ / tokens_to_ranks_ (sequence parallelism's rank-major staging)
// --------------------------------------------------------------------------------

namespace {

// The definition, rank by rank with copy_tokens_: block r is rank r's tokens [N·r/T, N·(r+1)/T)
// of every sample, at B·(N·r/T)·F (packed) or r·B·⌈N/T⌉·F (padded, the padding zero).
Tensor staged_ref(const Tensor& full, int T, bool padded) {
  const int64_t B = full.size(0), N = full.size(1), F = full.size(2), most = (N + T - 1) / T;
  Tensor staged = Tensor::empty({kernels::staged_numel(B, N, F, T, padded)}, full.dtype());
  std::memset(staged.raw(), 0, staged.nbytes());
  for (int r = 0; r < T; ++r) {
    const int64_t t0 = N * r / T, n = N * (r + 1) / T - t0;
    const int64_t off = padded ? r * B * most * F : B * t0 * F;
    Tensor block = staged.narrow(off, B * n * F).reshape({B, n, F});
    ops::copy_tokens_(block, 0, full, t0, n);
  }
  return staged;
}

}  // namespace

TEST(TokensRanks, PermuteTheWholeStagingBufferBothWays) {
  struct Case {
    Shape s;
    int T;
  };
  // Even and uneven splits, ViT-H's 257 tokens over 4, one token per rank, odd features.
  const Case cases[] = {{{2, 10, 3}, 3}, {{3, 10, 4}, 4}, {{2, 8, 5}, 4},  {{1, 257, 6}, 4},
                        {{4, 5, 1}, 5},  {{2, 7, 8}, 1},  {{3, 197, 2}, 2}};
  for (DType d : {DType::F32, DType::BF16, DType::F16, DType::I32})
    for (const Case& c : cases)
      for (bool padded : {false, true}) {
        const std::string what = fmt::format("{} {} over {} ({})", dtype_name(d), shape_str(c.s),
                                             c.T, padded ? "padded" : "packed");
        const Tensor full = iota(c.s, d, 5);
        const Tensor want = staged_ref(full, c.T, padded);
        Tensor staged = iota({want.numel()}, d, 6);  // garbage where the padding goes
        ops::tokens_to_ranks_(staged, full, c.T, padded);
        EXPECT_EQ(host(staged), host(want)) << what;
        Tensor back = iota(c.s, d, 7);
        ops::tokens_from_ranks_(back, want, c.T, padded);
        EXPECT_EQ(host(back), host(full)) << what;
      }
}

TEST(TokensRanks, ErrorsNameTheWrongValues) {
  Tensor full = Tensor::zeros({2, 10, 3});
  Tensor staged = Tensor::zeros({kernels::staged_numel(2, 10, 3, 4, true)});  // 72
  auto expect_error = [](const std::string& m, const char* op, std::vector<std::string> parts) {
    EXPECT_EQ(m.rfind(op, 0), 0u) << m;
    for (const auto& p : parts) EXPECT_NE(m.find(p), std::string::npos) << p << " in: " << m;
  };
  expect_error(error_of([&] { ops::tokens_from_ranks_(full, staged, 4, false); }),
               "[tokens_from_ranks]", {"72 elements", "packed", "4 ranks", "60"});
  expect_error(error_of([&] { ops::tokens_to_ranks_(staged, full, 11, true); }),
               "[tokens_to_ranks]", {"11 ranks", "[2, 10, 3]"});
  Tensor flat = Tensor::zeros({60});
  expect_error(error_of([&] { ops::tokens_to_ranks_(staged, flat, 4, true); }), "[tokens_to_ranks]",
               {"[B, N, F]", "[60]"});
  Tensor half = Tensor::zeros({72}).to(DType::BF16);
  expect_error(error_of([&] { ops::tokens_from_ranks_(full, half, 4, true); }),
               "[tokens_from_ranks]", {"fp32", "bf16"});
}
