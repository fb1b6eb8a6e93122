// LayerNorm over a hidden dimension split across ranks (2D/2.5D/3D tensor parallelism), on the
// CPU: with the whole row on one rank the split ops are layernorm_fwd/layernorm_bwd; cut into
// column blocks whose per-row partial sums are added by hand (as the all-reduce would), each
// block gets its columns of the whole row's results; half inputs keep the dtype contract; bad
// shapes throw, naming the values.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cai/core/error.h"
#include "cai/ops/ops.h"
#include "golden.h"
#include "gradcheck.h"

using namespace cai;
using cai::test::random_tensor;

namespace {

constexpr float kEps = 1e-5f;

// Random values in [-1, 1) plus `shift`, so that the rows' means are not near zero.
Tensor shifted(const Shape& s, uint64_t seed, float shift) {
  auto v = random_tensor(s, seed).to_vector();
  for (auto& e : v) e += shift;
  return Tensor::from_vector(v, s);
}

// x[rows, cols] -> x[:, c0:c0+n] as a [rows, n] fp32 tensor (rows = numel / cols).
Tensor columns(const Tensor& x, int64_t c0, int64_t n) {
  const auto v = x.to_vector();
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  std::vector<float> s;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = c0; c < c0 + n; ++c) s.push_back(v[r * cols + c]);
  return Tensor::from_vector(s, x.dim() == 1 ? Shape{n} : Shape{rows, n});
}

// a += b, elementwise (the all-reduce of per-row partial sums over the ranks of a row).
void accumulate(Tensor& a, const Tensor& b) {
  if (!a.defined()) {
    a = b.clone();
    return;
  }
  ops::add_(a, b);
}

// Every result of one split LayerNorm forward and backward, for one rank's column block.
struct Block {
  Tensor y, dx, dgamma, dbeta;
};
struct SplitRun {
  Tensor mean, sqdev, rstd, sums;
  std::vector<Block> blocks;
};

// The whole protocol over column blocks of width `w` of x[rows, F]: each step's per-row partials
// are summed over the blocks before the next step. dgamma0/dbeta0 are the gradients accumulated
// onto. x and dy are converted to `t` per block; y comes out in `out`.
SplitRun run_split(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& dy,
                   const Tensor& dgamma0, const Tensor& dbeta0, int64_t w, DType t, DType out,
                   DType dyt) {
  const int64_t F = x.size(-1), nb = F / w;
  std::vector<Tensor> xs, dys;
  for (int64_t k = 0; k < nb; ++k) {
    xs.push_back(columns(x, k * w, w).to(t));
    dys.push_back(columns(dy, k * w, w).to(dyt));
  }
  SplitRun r;
  Tensor s;
  for (const Tensor& xk : xs) accumulate(s, ops::layernorm_row_sums(xk, Tensor()));
  r.mean = s.clone();
  ops::scale_(r.mean, 1.0f / static_cast<float>(F));
  for (const Tensor& xk : xs) accumulate(r.sqdev, ops::layernorm_row_sums(xk, r.mean));
  r.blocks.resize(nb);
  for (int64_t k = 0; k < nb; ++k) {
    Tensor rstd;
    r.blocks[k].y =
        ops::layernorm_split_fwd(xs[k], columns(gamma, k * w, w), columns(beta, k * w, w), r.mean,
                                 r.sqdev, F, kEps, out, &rstd);
    if (k == 0) r.rstd = rstd;
    EXPECT_EQ(cai::test::rel_error(rstd, r.rstd), 0.0) << "every block computes the same rstd";
  }
  for (int64_t k = 0; k < nb; ++k) {
    Block& b = r.blocks[k];
    b.dgamma = columns(dgamma0, k * w, w);
    b.dbeta = columns(dbeta0, k * w, w);
    accumulate(r.sums, ops::layernorm_split_bwd_sums(xs[k], columns(gamma, k * w, w), r.mean,
                                                     r.rstd, dys[k], &b.dgamma, &b.dbeta));
  }
  for (int64_t k = 0; k < nb; ++k)
    r.blocks[k].dx = ops::layernorm_split_bwd(xs[k], columns(gamma, k * w, w), r.mean, r.rstd,
                                              dys[k], r.sums, F);
  return r;
}

// The unsplit reference: layernorm_fwd/bwd on the whole rows.
struct Whole {
  Tensor y, mean, rstd, dx, dgamma, dbeta;
};
Whole run_whole(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& dy,
                const Tensor& dgamma0, const Tensor& dbeta0) {
  Whole r;
  r.y = ops::layernorm_fwd(x, gamma, beta, kEps, &r.mean, &r.rstd);
  r.dgamma = dgamma0.clone();
  r.dbeta = dbeta0.clone();
  r.dx = ops::layernorm_bwd(x, gamma, r.mean, r.rstd, dy, &r.dgamma, &r.dbeta);
  return r;
}

// Runs `f`, expecting cai::Error with a message that starts with "[layernorm]" and contains
// `names` (one of the values it is about).
template <typename F>
void expect_layernorm_error(F&& f, const std::string& names) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one naming " << names;
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("[layernorm]", 0), 0u) << what;
    EXPECT_NE(what.find(names), std::string::npos) << what << " does not name " << names;
  }
}

}  // namespace

// F = f: one rank holds the whole row, and the split ops reproduce the unsplit ones.
TEST(LayerNormSplit, UnsplitEqualsLayerNorm) {
  for (const Shape& shape : {Shape{5, 8}, Shape{2, 3, 7}, Shape{1, 3}, Shape{4, 768}}) {
    SCOPED_TRACE(shape_str(shape));
    const int64_t d = shape.back();
    const Tensor x = shifted(shape, 1, 0.7f), dy = random_tensor(shape, 4);
    const Tensor g = random_tensor({d}, 2), b = random_tensor({d}, 3);
    const Tensor dg0 = random_tensor({d}, 5), db0 = random_tensor({d}, 6);
    const Whole ref = run_whole(x, g, b, dy, dg0, db0);

    const Tensor s = ops::layernorm_row_sums(x, Tensor());
    Tensor mean = s.clone();
    ops::scale_(mean, 1.0f / static_cast<float>(d));
    const Tensor v = ops::layernorm_row_sums(x, mean);
    Tensor rstd;
    const Tensor y = ops::layernorm_split_fwd(x, g, b, mean, v, d, kEps, DType::F32, &rstd);
    EXPECT_EQ(y.shape(), x.shape());
    EXPECT_EQ(rstd.shape(), ref.rstd.shape());
    EXPECT_LE(cai::test::rel_error(y, ref.y), 1e-6);
    EXPECT_LE(cai::test::rel_error(mean, ref.mean), 1e-6);
    EXPECT_LE(cai::test::rel_error(rstd, ref.rstd), 1e-6);

    Tensor dg = dg0.clone(), db = db0.clone();
    const Tensor sums = ops::layernorm_split_bwd_sums(x, g, mean, rstd, dy, &dg, &db);
    EXPECT_EQ(sums.shape(), (Shape{x.numel() / d, 2}));
    const Tensor dx = ops::layernorm_split_bwd(x, g, mean, rstd, dy, sums, d);
    EXPECT_EQ(dx.shape(), x.shape());
    EXPECT_EQ(dx.dtype(), DType::F32);
    EXPECT_LE(cai::test::rel_error(dx, ref.dx), 1e-6);
    EXPECT_LE(cai::test::rel_error(dg, ref.dgamma), 1e-6);
    EXPECT_LE(cai::test::rel_error(db, ref.dbeta), 1e-6);
  }
}

// x[rows, 12] cut into column blocks (3 of 4, and 2 of 6, 4 of 3): the per-block results are the
// whole row's columns.
TEST(LayerNormSplit, ColumnBlocksMatchTheWholeRow) {
  const int64_t rows = 7, F = 12;
  const Tensor x = shifted({rows, F}, 11, -0.4f), dy = random_tensor({rows, F}, 14);
  const Tensor g = random_tensor({F}, 12), b = random_tensor({F}, 13);
  const Tensor dg0 = random_tensor({F}, 15), db0 = random_tensor({F}, 16);
  const Whole ref = run_whole(x, g, b, dy, dg0, db0);
  for (int64_t w : {4, 6, 3}) {
    SCOPED_TRACE("block width " + std::to_string(w));
    const SplitRun r = run_split(x, g, b, dy, dg0, db0, w, DType::F32, DType::F32, DType::F32);
    ASSERT_EQ(static_cast<int64_t>(r.blocks.size()), F / w);
    EXPECT_LE(cai::test::rel_error(r.mean, ref.mean), 1e-5);
    EXPECT_LE(cai::test::rel_error(r.rstd, ref.rstd), 1e-5);
    for (int64_t k = 0; k < F / w; ++k) {
      SCOPED_TRACE("block " + std::to_string(k));
      const Block& bk = r.blocks[k];
      EXPECT_LE(cai::test::rel_error(bk.y, columns(ref.y, k * w, w)), 1e-5);
      EXPECT_LE(cai::test::rel_error(bk.dx, columns(ref.dx, k * w, w)), 1e-5);
      EXPECT_LE(cai::test::rel_error(bk.dgamma, columns(ref.dgamma, k * w, w)), 1e-5);
      EXPECT_LE(cai::test::rel_error(bk.dbeta, columns(ref.dbeta, k * w, w)), 1e-5);
    }
  }
}

// Half x and dy: y in `out`, dx in x's dtype, statistics and sums fp32; the values are the fp32
// path's on the rounded inputs, rounded (bit for bit), and close to the unrounded fp32 results.
TEST(LayerNormSplit, HalfInputsKeepTheDtypeContract) {
  const int64_t rows = 6, F = 12, w = 4;
  const Tensor x = shifted({rows, F}, 21, 0.3f), dy = random_tensor({rows, F}, 24);
  const Tensor g = random_tensor({F}, 22), b = random_tensor({F}, 23);
  const Tensor dg0 = Tensor::zeros({F}), db0 = Tensor::zeros({F});
  const SplitRun full = run_split(x, g, b, dy, dg0, db0, w, DType::F32, DType::F32, DType::F32);
  for (DType t : {DType::BF16, DType::F16}) {
    for (DType out : {t, DType::F32}) {
      for (DType dyt : {t, DType::F32}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " out " + dtype_name(out) + " dy " +
                     dtype_name(dyt));
        const SplitRun h = run_split(x, g, b, dy, dg0, db0, w, t, out, dyt);
        // The fp32 path on the same rounded inputs.
        const Tensor xr = x.to(t).to(DType::F32), dyr = dy.to(dyt).to(DType::F32);
        const SplitRun ref =
            run_split(xr, g, b, dyr, dg0, db0, w, DType::F32, DType::F32, DType::F32);
        for (const Tensor* s : {&h.mean, &h.sqdev, &h.rstd, &h.sums})
          EXPECT_EQ(s->dtype(), DType::F32);
        EXPECT_EQ(cai::test::rel_error(h.mean, ref.mean), 0.0);
        EXPECT_EQ(cai::test::rel_error(h.rstd, ref.rstd), 0.0);
        EXPECT_EQ(cai::test::rel_error(h.sums, ref.sums), 0.0);
        const double tol = t == DType::BF16 ? 2e-2 : 4e-3;
        EXPECT_LE(cai::test::rel_error(h.rstd, full.rstd), tol);
        for (size_t k = 0; k < h.blocks.size(); ++k) {
          const Block &hb = h.blocks[k], &rb = ref.blocks[k], &fb = full.blocks[k];
          EXPECT_EQ(hb.y.dtype(), out);
          EXPECT_EQ(hb.dx.dtype(), t);
          EXPECT_EQ(hb.dgamma.dtype(), DType::F32);
          EXPECT_EQ(cai::test::rel_error(hb.y, rb.y.to(out)), 0.0);
          EXPECT_EQ(cai::test::rel_error(hb.dx, rb.dx.to(t)), 0.0);
          EXPECT_EQ(cai::test::rel_error(hb.dgamma, rb.dgamma), 0.0);
          EXPECT_EQ(cai::test::rel_error(hb.dbeta, rb.dbeta), 0.0);
          EXPECT_LE(cai::test::rel_error(hb.y, fb.y), tol);
          EXPECT_LE(cai::test::rel_error(hb.dx, fb.dx), tol);
          EXPECT_LE(cai::test::rel_error(hb.dgamma, fb.dgamma), tol);
          EXPECT_LE(cai::test::rel_error(hb.dbeta, fb.dbeta), tol);
        }
      }
    }
  }
}

TEST(LayerNormSplit, BadShapesThrowNamingTheValues) {
  const int64_t rows = 3, f = 4, F = 12;
  const Tensor x = random_tensor({rows, f}, 1), dy = random_tensor({rows, f}, 2);
  const Tensor g = random_tensor({f}, 3), b = random_tensor({f}, 4);
  const Tensor mean = Tensor::zeros({rows}), v = Tensor::full({rows}, 1.0f);
  const Tensor rstd = Tensor::full({rows}, 1.0f), sums = Tensor::zeros({rows, 2});
  const Tensor bad_rows = Tensor::zeros({rows + 1}), bad_cols = Tensor::zeros({f + 1});
  Tensor dg = Tensor::zeros({f}), db = Tensor::zeros({f});
  Tensor bad_dg = Tensor::zeros({f + 1});

  // The inputs above are consistent: none of these throws.
  Tensor rs;
  EXPECT_NO_THROW(ops::layernorm_row_sums(x, mean));
  EXPECT_NO_THROW(ops::layernorm_split_fwd(x, g, b, mean, v, F, kEps, DType::F32, &rs));
  EXPECT_NO_THROW(ops::layernorm_split_bwd_sums(x, g, mean, rstd, dy, &dg, &db));
  EXPECT_NO_THROW(ops::layernorm_split_bwd(x, g, mean, rstd, dy, sums, F));

  // layernorm_row_sums
  expect_layernorm_error([&] { ops::layernorm_row_sums(x, bad_rows); }, "Tensor[4] fp32");
  expect_layernorm_error([&] { ops::layernorm_row_sums(x, mean.to(DType::BF16)); }, "bf16");
  expect_layernorm_error(
      [&] {
        ops::layernorm_row_sums(Tensor::from_vector(std::vector<int32_t>{1, 2}, {2}), {});
      },
      "int32");
  expect_layernorm_error(
      [&] {
        ops::layernorm_row_sums(Tensor::zeros({3, 0}), Tensor());
      },
      "Tensor[3, 0]");
  // layernorm_split_fwd
  expect_layernorm_error(
      [&] { ops::layernorm_split_fwd(x, bad_cols, b, mean, v, F, kEps, DType::F32, &rs); },
      "weight Tensor[5] fp32 cpu does not match the 4 features");
  expect_layernorm_error(
      [&] { ops::layernorm_split_fwd(x, g, bad_cols, mean, v, F, kEps, DType::F32, &rs); },
      "bias Tensor[5] fp32 cpu does not match the 4 features");
  expect_layernorm_error(
      [&] { ops::layernorm_split_fwd(x, g, b, bad_rows, v, F, kEps, DType::F32, &rs); },
      "mean Tensor[4] fp32 cpu must hold one value for each of the 3 rows");
  expect_layernorm_error(
      [&] { ops::layernorm_split_fwd(x, g, b, mean, bad_rows, F, kEps, DType::F32, &rs); },
      "squared deviation sum Tensor[4]");
  expect_layernorm_error(
      [&] { ops::layernorm_split_fwd(x, g, b, mean, v, 3, kEps, DType::F32, &rs); },
      "3 features in all are fewer than this rank's 4");
  expect_layernorm_error(
      [&] { ops::layernorm_split_fwd(x, g, b, mean, v, F, kEps, DType::I32, &rs); }, "int32");
  // layernorm_split_bwd_sums
  expect_layernorm_error(
      [&] {
        ops::layernorm_split_bwd_sums(x, g, mean, rstd, random_tensor({rows, f + 1}, 5), &dg, &db);
      },
      "grad Tensor[3, 5] fp32 cpu does not match input Tensor[3, 4] fp32 cpu");
  expect_layernorm_error([&] { ops::layernorm_split_bwd_sums(x, g, mean, bad_rows, dy, &dg, &db); },
                         "rstd Tensor[4]");
  expect_layernorm_error([&] { ops::layernorm_split_bwd_sums(x, g, mean, rstd, dy, &bad_dg, &db); },
                         "weight");
  expect_layernorm_error([&] { ops::layernorm_split_bwd_sums(x, g, mean, rstd, dy, &dg, &bad_dg); },
                         "bias");
  expect_layernorm_error(
      [&] { ops::layernorm_split_bwd_sums(x, bad_cols, mean, rstd, dy, &dg, &db); }, "weight");
  // layernorm_split_bwd
  expect_layernorm_error(
      [&] { ops::layernorm_split_bwd(x, g, mean, rstd, dy, Tensor::zeros({rows}), F); },
      "row sums Tensor[3] fp32 cpu must be [3, 2]");
  expect_layernorm_error(
      [&] {
        ops::layernorm_split_bwd(x, g, mean, rstd, dy, Tensor::zeros({rows, 3}), F);
      },
      "Tensor[3, 3]");
  expect_layernorm_error([&] { ops::layernorm_split_bwd(x, g, mean, rstd, dy, sums, 2); },
                         "2 features in all");
  expect_layernorm_error([&] { ops::layernorm_split_bwd(x, g, bad_rows, rstd, dy, sums, F); },
                         "mean Tensor[4]");
  // Nothing was accumulated by the calls that threw.
  const Tensor dg_before = dg.clone();
  expect_layernorm_error([&] { ops::layernorm_split_bwd_sums(x, g, mean, rstd, dy, &dg, &bad_dg); },
                         "bias");
  EXPECT_EQ(cai::test::rel_error(dg, dg_before), 0.0);
}
