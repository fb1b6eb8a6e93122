// Every CUDA kernel against its CPU reference (fp32: ≤ 1e-5 relative), through the ops layer so
// the dispatch is tested too; the ViT against timm on the GPU; one optimizer step on the GPU.
// Runs on a GPU host (scripts/gpu-test); without a GPU every case skips, saying why.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cai/core/error.h"
#include "cai/nn/vit.h"
#include "cai/ops/ops.h"
#include "cai/optim/optimizer.h"
#include "cai/train/trainer.h"
#include "golden.h"
#include "gradcheck.h"
#include "kernels/device.h"
#include "kernels/optim.h"

using namespace cai;
using cai::test::random_tensor;
using cai::test::rel_error;

namespace {
const Device kGpu = Device::cuda(0);

class Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kernels::cuda::device_count() == 0)
      GTEST_SKIP() << "no GPU: " << kernels::cuda::runtime_info().device_error;
  }
};

Tensor gpu(const Tensor& t) {
  return t.to(kGpu);
}

// ≤ 1e-5 relative (norm-wise), with a floor for all-zero references.
void expect_close(const Tensor& cuda, const Tensor& cpu, const char* what, double tol = 1e-5) {
  ASSERT_TRUE(cuda.is_cuda()) << what;
  const Tensor h = cuda.to(Device::cpu());
  double num = 0, den = 0;
  const auto a = h.to_vector(), b = cpu.to_vector();
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_FALSE(std::isnan(a[i])) << what << " element " << i;
    num += std::pow(double(a[i]) - b[i], 2), den += std::pow(double(b[i]), 2);
  }
  EXPECT_LE(std::sqrt(num), tol * std::sqrt(den) + 1e-12) << what;
}
}  // namespace

TEST_F(Cuda, Linear) {
  for (auto [m, k, n] : {std::tuple{5, 7, 3}, {1, 1, 1}, {300, 192, 576}}) {
    Tensor x = random_tensor({m, k}, 1), w = random_tensor({n, k}, 2), b = random_tensor({n}, 3);
    Tensor dy = random_tensor({m, n}, 4);
    Tensor dw = random_tensor({n, k}, 5), db = random_tensor({n}, 6);  // accumulate onto these
    Tensor gx = gpu(x), gw = gpu(w), gb = gpu(b), gdw = gpu(dw), gdb = gpu(db);
    Tensor gbias = gpu(b);
    expect_close(ops::linear_fwd(gx, gw, &gbias), ops::linear_fwd(x, w, &b), "linear fwd");
    Tensor dx = ops::linear_bwd(x, w, dy, &dw, &db);
    Tensor gdx = ops::linear_bwd(gx, gw, gpu(dy), &gdw, &gdb);
    expect_close(gdx, dx, "linear dx");
    expect_close(gdw, dw, "linear dw (accumulated)");
    expect_close(gdb, db, "linear db (accumulated)");
  }
}

// The residual add in the GEMM's epilogue (r + x·wᵀ + b, fp32 out) against the CPU's linear then
// add: bf16 and fp16 inputs, with and without a bias, a bias at an odd address (no epilogue: the
// copy, bias and in-place GEMM path), and shapes cuBLASLt may refuse (n = 3).
TEST_F(Cuda, LinearForwardResidual) {
  for (DType t : {DType::BF16, DType::F16, DType::F32})
    for (auto [m, k, n] : {std::tuple{300, 192, 576}, {5, 7, 3}, {394, 64, 768}})
      for (int bias = 0; bias < 3; ++bias) {
        Tensor x = random_tensor({m, k}, 31).to(t), w = random_tensor({n, k}, 32);
        Tensor r = random_tensor({m, n}, 33), b_all = random_tensor({n + 1}, 34);
        // bias 1: a 16-byte aligned bias; bias 2: the same values one element in (4-byte aligned).
        Tensor b = bias == 2 ? b_all.narrow(1, n) : b_all.narrow(0, n).clone();
        Tensor gb = bias == 2 ? gpu(b_all).narrow(1, n) : gpu(b);
        const Tensor* bp = bias ? &b : nullptr;
        const Tensor* gbp = bias ? &gb : nullptr;
        const std::string what = fmt::format("linear_fwd_residual {} [{}, {}, {}] bias {}",
                                             dtype_name(t), m, k, n, bias);
        Tensor ref = ops::linear_fwd_residual(x, w, bp, r);
        Tensor got = ops::linear_fwd_residual(gpu(x), gpu(w), gbp, gpu(r));
        ASSERT_EQ(got.dtype(), DType::F32) << what;
        expect_close(got, ref, what.c_str());
        // The reference is the unfused pair on the CPU, fp32 product of the rounded operands.
        Tensor unfused = ops::add(r, ops::linear_fwd(x, w, bp, DType::F32));
        expect_close(got, unfused, (what + " against linear + add").c_str());
      }
}

// to_dtype: fp32 tensors to bf16/fp16 in batched launches, equal bit for bit to Tensor::to, with
// sizes that are not multiples of the vector width and misaligned views (the scalar path), and
// more tensors than one launch takes.
// upload_async: every table lands whole, whatever its size (over and under a staging block),
// with more copies queued than the pool's blocks (the rest take the pageable path), the source
// overwritten and freed right after each call.
TEST_F(Cuda, UploadAsyncCopiesEveryTable) {
  std::vector<Tensor> dst;
  std::vector<std::vector<float>> want;
  for (int i = 0; i < 80; ++i) {
    const int64_t n = i % 3 == 0 ? 1 + i : i % 3 == 1 ? 40000 + 7 * i : 100000 + i;
    std::vector<float> host(static_cast<size_t>(n));
    for (int64_t k = 0; k < n; ++k) host[k] = static_cast<float>(i * 1000003 + k);
    dst.push_back(Tensor::empty({n}, DType::F32, kGpu));
    kernels::cuda::upload_async(dst.back().raw(), host.data(), host.size() * sizeof(float),
                                nullptr);
    want.push_back(host);
    std::fill(host.begin(), host.end(), -1.0f);  // the call copied it: this must not show
  }
  for (size_t i = 0; i < dst.size(); ++i) EXPECT_EQ(dst[i].to_vector(), want[i]) << "table " << i;
}

TEST_F(Cuda, CastMultiEqualsCast) {
  for (DType t : {DType::BF16, DType::F16}) {
    std::vector<Tensor> src;
    for (int i = 0; i < 21; ++i) {
      const int64_t n = i % 3 == 0 ? 1024 * (i + 1) : i % 3 == 1 ? 7 * i + 1 : 4 * i + 4;
      Tensor base = gpu(random_tensor({n + 1}, 40 + i, 3.0f));
      src.push_back(i % 4 == 3 ? base.narrow(1, n) : base.narrow(0, n));
    }
    std::vector<const Tensor*> ptrs;
    for (const Tensor& x : src) ptrs.push_back(&x);
    const std::vector<Tensor> got = ops::to_dtype(ptrs, t);
    ASSERT_EQ(got.size(), src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      ASSERT_EQ(got[i].dtype(), t);
      ASSERT_TRUE(got[i].is_cuda());
      EXPECT_EQ(got[i].to(DType::F32).to_vector(), src[i].to(t).to(DType::F32).to_vector())
          << "tensor " << i << " of " << src[i].numel() << " elements, " << dtype_name(t);
    }
  }
}

// zero_all on the GPU: 150 tensors (three launches of up to 64), fp32 and bf16, whole and
// narrowed views at odd offsets and lengths (single-byte ranges), against the CPU: only the
// views' elements become 0, their neighbours keep their values.
TEST_F(Cuda, ZeroAllClearsExactlyTheTensors) {
  std::vector<Tensor> base, view;
  for (int i = 0; i < 150; ++i) {
    const int64_t n = i % 3 == 0 ? 768 * (i % 7 + 1) : i % 3 == 1 ? 5 * i + 3 : 4 * i + 4;
    Tensor b = random_tensor({n + 2}, 70 + i, 2.0f);
    if (i % 5 == 4) b = b.to(DType::BF16);
    base.push_back(gpu(b));
    view.push_back(i % 2 ? base.back().narrow(1, n) : base.back().narrow(0, n));
  }
  std::vector<std::vector<float>> before;
  for (const Tensor& b : base) before.push_back(b.to(DType::F32).to_vector());
  std::vector<Tensor*> ptrs;
  for (Tensor& v : view) ptrs.push_back(&v);
  zero_all(ptrs);
  for (size_t i = 0; i < base.size(); ++i) {
    std::vector<float> want = before[i];
    const size_t off = i % 2, n = static_cast<size_t>(view[i].numel());
    for (size_t k = 0; k < n; ++k) want[off + k] = 0.0f;
    EXPECT_EQ(base[i].to(DType::F32).to_vector(), want) << "tensor " << i << " of " << n;
  }
}

TEST_F(Cuda, LayerNorm) {
  for (auto [m, d] : {std::pair{4, 9}, {1, 1}, {394, 768}, {8224, 1280}, {33, 1536}, {9, 1282}}) {
    Tensor x = random_tensor({m, d}, 1), g = random_tensor({d}, 2), b = random_tensor({d}, 3);
    Tensor dy = random_tensor({m, d}, 4), dg = random_tensor({d}, 5), dbt = random_tensor({d}, 6);
    Tensor mean, rstd, gmean, grstd;
    Tensor y = ops::layernorm_fwd(x, g, b, 1e-6f, &mean, &rstd);
    Tensor gy = ops::layernorm_fwd(gpu(x), gpu(g), gpu(b), 1e-6f, &gmean, &grstd);
    expect_close(gy, y, "layernorm fwd");
    expect_close(gmean, mean, "layernorm mean");
    expect_close(grstd, rstd, "layernorm rstd");
    Tensor gdg = gpu(dg), gdb = gpu(dbt);
    Tensor dx = ops::layernorm_bwd(x, g, mean, rstd, dy, &dg, &dbt);
    Tensor gdx = ops::layernorm_bwd(gpu(x), gpu(g), gmean, grstd, gpu(dy), &gdg, &gdb);
    expect_close(gdx, dx, "layernorm dx");
    expect_close(gdg, dg, "layernorm dgamma");
    expect_close(gdb, dbt, "layernorm dbeta");
  }
}

// The residual stream's LayerNorm backward in one pass: dx = layernorm_bwd + residual (fp32),
// dy in bf16 (the GEMM's output), and the bf16 copy of dx, against the CPU's three steps.
TEST_F(Cuda, LayerNormBackwardAdd) {
  for (auto [m, d] : {std::pair{394, 768}, {5, 9}, {64, 1024}, {8224, 1280}, {33, 1536}}) {
    Tensor x = random_tensor({m, d}, 11), g = random_tensor({d}, 12), b = random_tensor({d}, 13);
    Tensor dy = random_tensor({m, d}, 14).to(DType::BF16);
    Tensor res = random_tensor({m, d}, 15), dg = random_tensor({d}, 16),
           dbt = random_tensor({d}, 17);
    Tensor mean, rstd, gmean, grstd;
    ops::layernorm_fwd(x, g, b, 1e-6f, &mean, &rstd);
    ops::layernorm_fwd(gpu(x), gpu(g), gpu(b), 1e-6f, &gmean, &grstd);
    Tensor gdg = gpu(dg), gdb = gpu(dbt), half, ghalf;
    Tensor dx = ops::layernorm_bwd_add(x, g, mean, rstd, dy, res, &dg, &dbt, DType::BF16, &half);
    Tensor gdx = ops::layernorm_bwd_add(gpu(x), gpu(g), gmean, grstd, gpu(dy), gpu(res), &gdg, &gdb,
                                        DType::BF16, &ghalf);
    const std::string shape = fmt::format("[{}, {}]", m, d);
    expect_close(gdx, dx, ("layernorm_bwd_add dx " + shape).c_str());
    expect_close(gdg, dg, ("layernorm_bwd_add dgamma " + shape).c_str());
    expect_close(gdb, dbt, ("layernorm_bwd_add dbeta " + shape).c_str());
    ASSERT_EQ(ghalf.dtype(), DType::BF16);
    // The copy is dx rounded once: equal to rounding the GPU's own fp32 dx.
    expect_close(ghalf.to(DType::F32), gdx.to(DType::BF16).to(DType::F32).to(Device::cpu()),
                 ("layernorm_bwd_add half copy " + shape).c_str(), 0.0);
    // Without the copy: the same dx.
    Tensor gdg2 = gpu(dg), gdx2 = ops::layernorm_bwd_add(gpu(x), gpu(g), gmean, grstd, gpu(dy),
                                                         gpu(res), &gdg2, nullptr);
    expect_close(gdx2, gdx.to(Device::cpu()), ("layernorm_bwd_add no copy " + shape).c_str(), 0.0);
  }
}

namespace {
// init + Σ_rows t[rows, d] (fp32 on the CPU, summed in double).
Tensor plus_column_sums(const Tensor& init, const Tensor& t) {
  const auto v = t.to(DType::F32).to(Device::cpu()).to_vector();
  std::vector<float> r = init.to(Device::cpu()).to_vector();
  const int64_t d = static_cast<int64_t>(r.size()), m = static_cast<int64_t>(v.size()) / d;
  for (int64_t j = 0; j < d; ++j) {
    double acc = 0.0;
    for (int64_t i = 0; i < m; ++i) acc += v[i * d + j];
    r[j] += static_cast<float>(acc);  // as linear_bwd's bias gradient adds its sums
  }
  return Tensor::from_vector(r, {d});
}
}  // namespace

// The next GEMM's bias gradient from the LayerNorm backward's pass: the column sums of the half
// copy when there is one (of dx without), added or written, on the fused shapes and on one the
// fused kernel does not take (d = 9), against the sums of the GPU's own outputs and the CPU's.
TEST_F(Cuda, LayerNormBackwardAddColumnSums) {
  for (auto [m, d] : {std::pair{394, 768}, {5, 9}, {1000, 1024}, {2056, 1280}, {300, 1536}})
    for (bool with_half : {true, false})
      for (bool add : {true, false}) {
        Tensor x = random_tensor({m, d}, 31), g = random_tensor({d}, 32),
               b = random_tensor({d}, 33);
        Tensor dy = random_tensor({m, d}, 34).to(DType::BF16), res = random_tensor({m, d}, 35);
        Tensor init = random_tensor({d}, 36);
        Tensor mean, rstd, gmean, grstd;
        ops::layernorm_fwd(x, g, b, 1e-6f, &mean, &rstd);
        ops::layernorm_fwd(gpu(x), gpu(g), gpu(b), 1e-6f, &gmean, &grstd);
        Tensor half, ghalf, sum = init.clone(), gsum = gpu(init);
        Tensor* hp = with_half ? &half : nullptr;
        Tensor* ghp = with_half ? &ghalf : nullptr;
        Tensor dx = ops::layernorm_bwd_add(x, g, mean, rstd, dy, res, nullptr, nullptr, DType::BF16,
                                           hp, &sum, add);
        Tensor gdx = ops::layernorm_bwd_add(gpu(x), gpu(g), gmean, grstd, gpu(dy), gpu(res),
                                            nullptr, nullptr, DType::BF16, ghp, &gsum, add);
        const std::string what =
            fmt::format("layernorm_bwd_add column sums [{}, {}]{}{}", m, d,
                        with_half ? " of the bf16 copy" : " of dx", add ? " added" : " written");
        const Tensor zero = Tensor::zeros({d}, DType::F32);
        const Tensor& start = add ? init : zero;
        // Each side's sums are of its own outputs, as the GEMM's bias gradient would be.
        expect_close(gsum, plus_column_sums(start, with_half ? ghalf : gdx), what.c_str());
        const Tensor cpu_ref = plus_column_sums(start, with_half ? half : dx);
        const auto a = sum.to_vector(), r = cpu_ref.to_vector();
        for (int64_t j = 0; j < d; ++j) ASSERT_EQ(a[j], r[j]) << what << " (CPU) feature " << j;
        expect_close(gsum, sum, (what + " against the CPU").c_str(), with_half ? 1e-2 : 1e-5);
      }
}

// The GELU's backward with fc1's bias gradient in the same pass, against the CPU's GELU backward
// and column sums: fp32 and bf16, exact and tanh, a vectorised shape and an odd one (the fallback).
TEST_F(Cuda, GeluBackwardWithBiasGradient) {
  for (DType t : {DType::F32, DType::BF16})
    for (ops::Gelu kind : {ops::Gelu::Exact, ops::Gelu::Tanh})
      for (auto [m, n] : {std::pair{394, 3072}, {7, 9}, {1100, 64}, {20000, 64}}) {
        Tensor x = random_tensor({m, n}, 21, 2.0f).to(t), dy = random_tensor({m, n}, 22).to(t);
        Tensor db = random_tensor({n}, 23), gdb = gpu(db);
        Tensor dx = ops::gelu_bwd_bias(x, dy, kind, &db);
        Tensor gdx = ops::gelu_bwd_bias(gpu(x), gpu(dy), kind, &gdb);
        const std::string what = fmt::format("gelu_bwd_bias {} {} [{}, {}]", dtype_name(t),
                                             kind == ops::Gelu::Tanh ? "tanh" : "exact", m, n);
        const double tol = t == DType::F32 ? 1e-5 : 1e-2;
        expect_close(gdx.to(DType::F32), dx.to(DType::F32), (what + " dx").c_str(), tol);
        // The bias gradient sums the rounded dx each side computed: against the GPU's own dx.
        expect_close(gdb, plus_column_sums(random_tensor({n}, 23), gdx), (what + " db").c_str());
        expect_close(gdb, db, (what + " db against the CPU").c_str(),
                     t == DType::F32 ? 1e-5 : 1e-2);
        // With the output made again: the same dx and db, and y equal to the forward's.
        Tensor db2 = random_tensor({n}, 23), gdb2 = gpu(db2), y, gy;
        Tensor dx2 = ops::gelu_bwd_bias(x, dy, kind, &db2, &y);
        Tensor gdx2 = ops::gelu_bwd_bias(gpu(x), gpu(dy), kind, &gdb2, &gy);
        ASSERT_EQ(gdx2.to(DType::F32).to(Device::cpu()).to_vector(),
                  gdx.to(DType::F32).to(Device::cpu()).to_vector())
            << what << " dx with y";
        // (The kernel with y may split the rows into other chunks: the same sums in double in
        // another order.)
        expect_close(gdb2, gdb.to(Device::cpu()), (what + " db with y").c_str(), 1e-6);
        ASSERT_EQ(dx2.to(DType::F32).to_vector(), dx.to(DType::F32).to_vector()) << what;
        ASSERT_EQ(gy.dtype(), t);
        ASSERT_EQ(gy.to(DType::F32).to(Device::cpu()).to_vector(),
                  ops::gelu_fwd(gpu(x), kind).to(DType::F32).to(Device::cpu()).to_vector())
            << what << " y against the GPU's forward";
        ASSERT_EQ(y.to(DType::F32).to_vector(), ops::gelu_fwd(x, kind).to(DType::F32).to_vector())
            << what << " y (CPU)";
        expect_close(gy.to(DType::F32), y.to(DType::F32), (what + " y").c_str(), tol);
      }
}

namespace {
// x[rows, cols] -> x[:, c0:c0+n] (a 1-D x: its elements [c0, c0+n)), fp32 on the CPU.
Tensor columns(const Tensor& x, int64_t c0, int64_t n) {
  const auto v = x.to(Device::cpu()).to_vector();
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  std::vector<float> s;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = c0; c < c0 + n; ++c) s.push_back(v[r * cols + c]);
  return Tensor::from_vector(s, x.dim() == 1 ? Shape{n} : Shape{rows, n});
}

// The split LayerNorm over column blocks of width w of x[rows, F] on `dev`, the per-row partials
// summed over the blocks between the steps (the all-reduce). Returns, in order: mean, sqdev,
// rstd, the backward's row sums, then per block y, dx, dgamma, dbeta.
std::vector<Tensor> split_layernorm(Device dev, DType t, const Tensor& x, const Tensor& gamma,
                                    const Tensor& beta, const Tensor& dy, int64_t w) {
  const int64_t F = x.size(-1), nb = F / w;
  auto on = [&](const Tensor& h) { return h.to(dev); };
  auto sum = [](Tensor& a, const Tensor& b) {
    if (a.defined())
      ops::add_(a, b);
    else
      a = b.clone();
  };
  std::vector<Tensor> xs, dys, gs, bs;
  for (int64_t k = 0; k < nb; ++k) {
    xs.push_back(on(columns(x, k * w, w).to(t)));
    dys.push_back(on(columns(dy, k * w, w).to(t)));
    gs.push_back(on(columns(gamma, k * w, w)));
    bs.push_back(on(columns(beta, k * w, w)));
  }
  Tensor mean, sqdev, rstd, sums;
  for (const Tensor& xk : xs) sum(mean, ops::layernorm_row_sums(xk, Tensor()));
  ops::scale_(mean, 1.0f / static_cast<float>(F));
  for (const Tensor& xk : xs) sum(sqdev, ops::layernorm_row_sums(xk, mean));
  std::vector<Tensor> ys, dgs, dbs;
  for (int64_t k = 0; k < nb; ++k)
    ys.push_back(ops::layernorm_split_fwd(xs[k], gs[k], bs[k], mean, sqdev, F, 1e-6f, t, &rstd));
  for (int64_t k = 0; k < nb; ++k) {
    dgs.push_back(on(Tensor::full({w}, 0.5f)));  // accumulated onto
    dbs.push_back(on(Tensor::full({w}, -0.25f)));
    sum(sums, ops::layernorm_split_bwd_sums(xs[k], gs[k], mean, rstd, dys[k], &dgs[k], &dbs[k]));
  }
  std::vector<Tensor> r{mean, sqdev, rstd, sums};
  for (int64_t k = 0; k < nb; ++k) {
    r.push_back(ys[k]);
    r.push_back(ops::layernorm_split_bwd(xs[k], gs[k], mean, rstd, dys[k], sums, F));
    r.push_back(dgs[k]);
    r.push_back(dbs[k]);
  }
  return r;
}
}  // namespace

TEST_F(Cuda, LayerNormSplit) {
  struct S {
    int64_t m, F, w;
  };
  // The last: ViT-L/16's 2D rank shape (many rows: the parameter sums over many row chunks).
  for (S s : {S{4, 12, 4}, S{1, 1, 1}, S{7, 300, 100}, S{394, 768, 192}, S{12608, 1024, 512}}) {
    Tensor x = random_tensor({s.m, s.F}, 1), dy = random_tensor({s.m, s.F}, 4);
    Tensor g = random_tensor({s.F}, 2), b = random_tensor({s.F}, 3);
    for (DType t : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(fmt::format("m {} F {} w {} {}", s.m, s.F, s.w, dtype_name(t)));
      const auto cpu = split_layernorm(Device::cpu(), t, x, g, b, dy, s.w);
      const auto gpu_r = split_layernorm(kGpu, t, x, g, b, dy, s.w);
      ASSERT_EQ(cpu.size(), gpu_r.size());
      const char* stats[] = {"mean", "sqdev", "rstd", "sums"};
      const char* grads[] = {"y", "dx", "dgamma", "dbeta"};
      for (size_t i = 0; i < cpu.size(); ++i) {
        const bool block = i >= 4;
        const bool half_out = t != DType::F32 && block && (i - 4) % 4 < 2;  // y, dx are in t
        EXPECT_EQ(gpu_r[i].dtype(), cpu[i].dtype());
        const std::string what =
            block ? fmt::format("split layernorm block {} {}", (i - 4) / 4, grads[(i - 4) % 4])
                  : fmt::format("split layernorm {}", stats[i]);
        expect_close(gpu_r[i], cpu[i], what.c_str(), half_out ? 1e-2 : 1e-5);
      }
    }
  }
}

TEST_F(Cuda, Gelu) {
  Tensor x = random_tensor({1000, 3}, 1, 3.0f), dy = random_tensor({1000, 3}, 2);
  expect_close(ops::gelu_fwd(gpu(x)), ops::gelu_fwd(x), "gelu fwd");
  expect_close(ops::gelu_bwd(gpu(x), gpu(dy)), ops::gelu_bwd(x, dy), "gelu bwd");
}

TEST_F(Cuda, Attention) {
  struct S {
    int b, n, h, hd;
  };
  for (S s : {S{2, 5, 2, 3}, S{1, 1, 1, 4}, S{2, 197, 12, 64}, S{3, 17, 4, 16}}) {
    const int d = s.h * s.hd;
    Tensor qkv = random_tensor({s.b, s.n, 3 * d}, 1), dout = random_tensor({s.b, s.n, d}, 2);
    Tensor probs, gprobs;
    Tensor out = ops::attention_fwd(qkv, s.h, &probs);
    Tensor gout = ops::attention_fwd(gpu(qkv), s.h, &gprobs);
    expect_close(gout, out, "attention out");
    expect_close(gprobs, probs, "attention probs");
    expect_close(ops::attention_bwd(gpu(qkv), gout, gprobs, gpu(dout), s.h),
                 ops::attention_bwd(qkv, out, probs, dout, s.h), "attention dqkv");
  }
}

TEST_F(Cuda, DropoutMasksAreIdenticalToTheCpu) {
  Tensor x = random_tensor({64, 50}, 1);
  const ops::RngKey key{11, 22, 333};
  // Identical masks: the values match exactly, not just closely.
  EXPECT_EQ(ops::dropout_fwd(gpu(x), 0.3f, key).to_vector(),
            ops::dropout_fwd(x, 0.3f, key).to_vector());
  EXPECT_EQ(ops::dropout_bwd(gpu(x), 0.3f, key).to_vector(),
            ops::dropout_bwd(x, 0.3f, key).to_vector());
  Tensor t = random_tensor({16, 3, 4}, 2);
  EXPECT_EQ(ops::drop_path_fwd(gpu(t), 0.5f, key).to_vector(),
            ops::drop_path_fwd(t, 0.5f, key).to_vector());
  EXPECT_EQ(ops::drop_path_bwd(gpu(t), 0.5f, key).to_vector(),
            ops::drop_path_bwd(t, 0.5f, key).to_vector());
}

TEST_F(Cuda, EmbeddingOps) {
  Tensor img = random_tensor({2, 3, 32, 32}, 1), w = random_tensor({64, 3, 8, 8}, 2),
         b = random_tensor({64}, 3), patches, gpatches;
  Tensor y = ops::patch_embed_fwd(img, w, b, &patches);
  expect_close(ops::patch_embed_fwd(gpu(img), gpu(w), gpu(b), &gpatches), y, "patch embed");
  expect_close(gpatches, patches, "patchify");
  Tensor cls = random_tensor({1, 1, 64}, 4), pos = random_tensor({1, 17, 64}, 5);
  expect_close(ops::cls_pos_fwd(gpu(y), gpu(cls), gpu(pos)), ops::cls_pos_fwd(y, cls, pos),
               "cls_pos fwd");
  Tensor dout = random_tensor({2, 17, 64}, 6);
  Tensor dcls = random_tensor({1, 1, 64}, 7), dpos = random_tensor({1, 17, 64}, 8);
  Tensor gdcls = gpu(dcls), gdpos = gpu(dpos);
  expect_close(ops::cls_pos_bwd(gpu(dout), &gdcls, &gdpos), ops::cls_pos_bwd(dout, &dcls, &dpos),
               "cls_pos dtokens");
  expect_close(gdcls, dcls, "cls_pos dcls");
  expect_close(gdpos, dpos, "cls_pos dpos");
  expect_close(ops::select_token_fwd(gpu(dout), 0), ops::select_token_fwd(dout, 0), "select");
  Tensor dsel = random_tensor({2, 64}, 9);
  expect_close(ops::select_token_bwd(gpu(dsel), 17, 0), ops::select_token_bwd(dsel, 17, 0),
               "select bwd");
}

TEST_F(Cuda, CrossEntropy) {
  Tensor logits = random_tensor({37, 10}, 1, 3.0f);
  std::vector<int32_t> lab(37);
  for (int i = 0; i < 37; ++i) lab[i] = (7 * i) % 10;
  Tensor labels = Tensor::from_vector(lab, {37});
  for (float eps : {0.0f, 0.1f}) {
    expect_close(ops::cross_entropy_fwd(gpu(logits), gpu(labels), eps),
                 ops::cross_entropy_fwd(logits, labels, eps), "ce fwd");
    expect_close(ops::cross_entropy_bwd(gpu(logits), gpu(labels), eps, 1.0f / 37),
                 ops::cross_entropy_bwd(logits, labels, eps, 1.0f / 37), "ce bwd");
  }
}

TEST_F(Cuda, LossMetricsMatchTheCpu) {
  // k = 37: the scalar path; k = 1000 (ImageNet's classes): whole float4s; k = 1000 from element 1
  // of its buffer: not 16-byte aligned, the scalar path again.
  struct Case {
    int64_t b, k, offset;
  };
  for (const Case cs : {Case{300, 37, 0}, Case{256, 1000, 0}, Case{64, 1000, 1}}) {
    SCOPED_TRACE(::testing::Message() << cs.b << " x " << cs.k << " from " << cs.offset);
    const int64_t b = cs.b, k = cs.k;
    auto lv = random_tensor({b * k + cs.offset}, 5, 3.0f).to_vector();
    std::vector<int32_t> lab(static_cast<size_t>(b));
    for (int64_t i = 0; i < b; ++i) lab[i] = static_cast<int32_t>((11 * i + 1) % k);
    float* row0 = lv.data() + cs.offset;
    int64_t right = 0;
    for (int64_t i = 0; i < b; ++i) {
      float* x = row0 + i * k;
      if (i % 3 == 0) {  // right: the label is the row's maximum
        x[lab[i]] = 100.0f, ++right;
      } else if (i % 3 == 1) {  // a tie, first at index 0: the first maximum is not the label
        x[0] = x[lab[i]] = 100.0f;
      } else if (i % 6 == 2) {  // a tie, first at the label: right
        x[lab[i]] = x[k - 1] = 100.0f, ++right;
      }
    }
    Tensor logits = Tensor::from_vector(lv, {b * k + cs.offset});
    Tensor labels = Tensor::from_vector(lab, {b});
    Tensor g_all = gpu(logits);
    Tensor cl = logits.narrow(cs.offset, b * k).reshape({b, k});
    Tensor gl = g_all.narrow(cs.offset, b * k).reshape({b, k});
    Tensor cpu_sums = Tensor::zeros({2}), gpu_sums = Tensor::zeros({2}, DType::F32, kGpu);
    for (int rep = 0; rep < 2; ++rep) {  // accumulates
      ops::loss_metrics_(cpu_sums, ops::cross_entropy_fwd(cl, labels, 0.1f), cl, labels);
      ops::loss_metrics_(gpu_sums, ops::cross_entropy_fwd(gl, gpu(labels), 0.1f), gl, gpu(labels));
    }
    const auto c = cpu_sums.to_vector(), g = gpu_sums.to_vector();
    EXPECT_NEAR(g[0], c[0], 1e-5 * std::abs(c[0]));
    EXPECT_EQ(g[1], c[1]);
    EXPECT_GE(c[1], 2.0f * static_cast<float>(right));
    EXPECT_LT(c[1], 2.0f * static_cast<float>(right) + 0.2f * static_cast<float>(b));
  }
}

TEST_F(Cuda, GradStatsAndClipMatchTheCpu) {
  // Many tensors (one launch covers them all), odd sizes, unaligned views, weights, an unscale.
  std::vector<Tensor> cpu_t, gpu_t;
  const std::vector<int64_t> sizes = {1, 3, 0, 1000, 70000, 5, 40000};
  for (size_t i = 0; i < sizes.size(); ++i) {
    // Views from element 1: not 16-byte aligned, so the scalar path runs too.
    const Tensor t = random_tensor({sizes[i] + 1}, 20 + static_cast<uint64_t>(i));
    cpu_t.push_back(t.clone().narrow(1, sizes[i]));
    gpu_t.push_back(gpu(t).narrow(1, sizes[i]));
  }
  cpu_t.back() = cpu_t.back().clone(), gpu_t.back() = gpu_t.back().clone();  // aligned: float4
  std::vector<float*> cp, gp;
  for (size_t i = 0; i < sizes.size(); ++i)
    cp.push_back(cpu_t[i].data<float>()), gp.push_back(gpu_t[i].data<float>());
  const std::vector<float> w = {1, 0, 1, 2, 1, 1, 0.5f};
  const int n = static_cast<int>(sizes.size());
  Tensor cs = Tensor::zeros({2}), gs = Tensor::zeros({2}, DType::F32, kGpu);
  kernels::cpu::multi_tensor_grad_stats(n, cp.data(), sizes.data(), w.data(), 0.25f,
                                        cs.data<float>());
  kernels::cuda::multi_tensor_grad_stats(n, gp.data(), sizes.data(), w.data(), 0.25f,
                                         gs.data<float>());
  const auto c = cs.to_vector(), g = gs.to_vector();
  EXPECT_NEAR(g[0], c[0], 1e-5 * c[0]);
  EXPECT_EQ(g[1], 0.0f);
  for (size_t i = 0; i < sizes.size(); ++i) expect_close(gpu_t[i], cpu_t[i], "unscaled");
  // Clip with the device sum (no host read), below and above max_norm.
  for (float max_norm : {1e6f, 0.3f}) {
    Tensor cn = Tensor::zeros({1}), gn = Tensor::zeros({1}, DType::F32, kGpu);
    kernels::cpu::multi_tensor_clip(n, cp.data(), sizes.data(), cs.data<float>(), max_norm,
                                    cn.data<float>());
    kernels::cuda::multi_tensor_clip(n, gp.data(), sizes.data(), gs.data<float>(), max_norm,
                                     gn.data<float>());
    EXPECT_NEAR(gn.item(), cn.item(), 1e-5 * cn.item());
    for (size_t i = 0; i < sizes.size(); ++i) expect_close(gpu_t[i], cpu_t[i], "clipped");
  }
  // An inf is counted.
  std::vector<float> bad(5, 1.0f);
  bad[3] = NAN;
  gpu_t[5].copy_from(Tensor::from_vector(bad, {5}));
  kernels::cuda::multi_tensor_grad_stats(n, gp.data(), sizes.data(), nullptr, 1.0f,
                                         gs.data<float>());
  EXPECT_EQ(gs.to_vector()[1], 1.0f);
}

TEST_F(Cuda, TrainerOnTheGpuMatchesTheCpu) {
  // The whole trainer path on the GPU (batches staged through pinned memory on the copy stream,
  // metrics and clipping on the device, values read every 3rd step) against the CPU run: the
  // same losses, norms and epoch totals.
  struct Rec : train::Hook {
    std::vector<train::StepInfo>* out;
    bool needs_values(const train::Trainer&, const train::StepInfo& s) const override {
      return s.global_step % 3 == 0;
    }
    void after_step(train::Trainer&, const train::StepInfo& s) override { out->push_back(s); }
  };
  std::vector<train::StepInfo> steps[2];
  std::vector<train::EpochInfo> epochs[2];
  for (int dev = 0; dev < 2; ++dev) {
    auto ds = data::synthetic(100, 1, 28, 10, 3);  // 7 batches of 16, the last of 4
    data::LoaderConfig lc;
    lc.batch_size = 16, lc.num_workers = 2, lc.seed = 1;
    data::DataLoader loader(ds, lc), eval(ds, lc);
    nn::ViTConfig c;
    c.img_size = 28, c.patch_size = 7, c.in_chans = 1, c.num_classes = 10, c.embed_dim = 32;
    c.depth = 2, c.num_heads = 2, c.mlp_ratio = 2.0;
    nn::ViT model(c);
    model.init(1);
    if (dev == 1) model.to(kGpu);
    optim::AdamW opt(optim::weight_decay_groups(model.parameters(), 1e-3, 0.05));
    train::TrainerConfig tc;
    tc.num_epochs = 2, tc.clip_grad_norm = 0.5, tc.gradient_accumulation = 2;
    train::Trainer t(model, opt, train::Criterion{0.0f}, loader, &eval, nullptr, tc);
    auto rec = std::make_shared<Rec>();
    rec->out = &steps[dev];
    t.add_hook(rec);
    t.fit();
    epochs[dev] = t.history();
  }
  ASSERT_EQ(steps[1].size(), steps[0].size());
  for (size_t i = 0; i < steps[0].size(); ++i) {
    EXPECT_EQ(steps[1][i].has_values, steps[0][i].has_values);
    if (!steps[0][i].has_values) continue;
    EXPECT_NEAR(steps[1][i].loss, steps[0][i].loss, 1e-4) << "step " << i;
    EXPECT_NEAR(steps[1][i].grad_norm, steps[0][i].grad_norm, 1e-4 * steps[0][i].grad_norm);
  }
  for (size_t e = 0; e < 2; ++e) {
    EXPECT_NEAR(epochs[1][e].train_loss, epochs[0][e].train_loss, 1e-4);
    EXPECT_NEAR(epochs[1][e].eval_loss, epochs[0][e].eval_loss, 1e-4);
    EXPECT_NEAR(epochs[1][e].eval_accuracy, epochs[0][e].eval_accuracy, 0.02);
  }
}

TEST_F(Cuda, ElementwiseAndNorms) {
  Tensor a = random_tensor({100001}, 1), b = random_tensor({100001}, 2);
  expect_close(ops::add(gpu(a), gpu(b)), ops::add(a, b), "add");
  Tensor ga = gpu(a);
  ops::axpy_(ga, 0.5f, gpu(b));
  ops::axpy_(a, 0.5f, b);
  expect_close(ga, a, "axpy");
  ops::scale_(ga, -2.0f);
  ops::scale_(a, -2.0f);
  expect_close(ga, a, "scale");
  EXPECT_NEAR(ops::sum_squares(ga), ops::sum_squares(a), 1e-9 * ops::sum_squares(a));
  ops::fill_(ga, 3.0f);
  EXPECT_EQ(ga.to_vector(), std::vector<float>(100001, 3.0f));
}

// Tensor::full fills on the device (the benchmark's d mean(out) / d out, which a host fill and
// pageable copy made longer than the backward it fed), and the allocator's peak resets to what is
// in use (the benchmark's per-layout peak).
TEST_F(Cuda, FullOnTheDeviceAndPeakReset) {
  const Tensor t = Tensor::full({3, 100001}, -1.25f, kGpu);
  ASSERT_TRUE(t.is_cuda());
  EXPECT_EQ(t.to_vector(), std::vector<float>(300003, -1.25f));
  {
    const Tensor big = Tensor::empty({64, 1 << 20}, DType::F32, kGpu);  // 256 MiB
    EXPECT_GE(kernels::cuda::allocator_stats(0).peak, size_t{256} << 20);
  }
  kernels::cuda::reset_peak(0);
  const kernels::cuda::AllocatorStats s = kernels::cuda::allocator_stats(0);
  EXPECT_EQ(s.peak, s.in_use);
  EXPECT_LT(s.peak, size_t{256} << 20);
}

TEST_F(Cuda, OptimizersMatchTheCpu) {
  const auto g = test::load_golden(test::data_path("optim_golden.bin"));
  for (const std::string name : {"sgd", "adamw", "lamb"}) {
    auto w = nn::make_parameter("w", {6, 5}, true);
    w.value.copy_from(g.at("init.w"));
    auto wg = w;
    wg.value = gpu(w.value), wg.grad = gpu(w.grad);
    std::vector<optim::ParamGroup> cpu(1), cuda(1);
    cpu[0].params = {&w}, cpu[0].lr = 0.01, cpu[0].weight_decay = 0.05;
    cuda[0] = cpu[0];
    cuda[0].params = {&wg};
    optim::OptimizerOptions o;
    o.name = name;
    auto oc = optim::make_optimizer(o, cpu), og = optim::make_optimizer(o, cuda);
    for (int t = 0; t < 4; ++t) {
      w.grad.copy_from(g.at("grad" + std::to_string(t) + ".w"));
      wg.grad.copy_from(w.grad);
      oc->step();
      og->step();
    }
    expect_close(wg.value, w.value, name.c_str());
  }
}

// clip_grad_norm_async with `defer`: the factor applied by the next step() (AdamW's kernel; SGD and
// LAMB scale in place at the start of step()) gives the parameters of clipping in place and then
// stepping, bit for bit, over steps that clip and steps that do not; AdamW leaves the gradients
// unscaled; zero_grad() drops a pending clip. The same with the sum of squares reduced on the
// device (reduce_on_device, as the hybrid plugin's ZeRO, tensor and pipeline layouts clip).
TEST_F(Cuda, DeferredClipStepsAsClippingInPlace) {
  for (const std::string name : {"adamw", "sgd", "lamb"}) {
    std::vector<nn::Parameter> a, b, r, c;  // r, c: the sum of squares reduced on the device
    for (int i = 0; i < 3; ++i) {
      const Shape shape = i == 1 ? Shape{37} : Shape{i + 5, 9};
      auto p = nn::make_parameter("p" + std::to_string(i), shape, i != 1);
      p.value = gpu(random_tensor(shape, 40 + static_cast<uint64_t>(i)));
      p.grad = Tensor::zeros(shape, DType::F32, kGpu);
      for (auto* v : {&a, &b, &r, &c}) {
        v->push_back(p);
        p.value = p.value.clone(), p.grad = p.grad.clone();
      }
    }
    std::vector<nn::Parameter*> pa, pb, pr, pc;
    for (int i = 0; i < 3; ++i)
      pa.push_back(&a[i]), pb.push_back(&b[i]), pr.push_back(&r[i]), pc.push_back(&c[i]);
    optim::OptimizerOptions o;
    o.name = name;
    auto oa = optim::make_optimizer(o, optim::weight_decay_groups(pa, 0.01, 0.05));
    auto ob = optim::make_optimizer(o, optim::weight_decay_groups(pb, 0.01, 0.05));
    auto orr = optim::make_optimizer(o, optim::weight_decay_groups(pr, 0.01, 0.05));
    auto oc = optim::make_optimizer(o, optim::weight_decay_groups(pc, 0.01, 0.05));
    ASSERT_TRUE(ob->can_defer_clip(kGpu));
    for (int t = 0; t < 4; ++t) {
      const float grad_size = t == 2 ? 1e-3f : 3.0f;  // step 2 clips nothing
      for (int i = 0; i < 3; ++i) {
        const Tensor g = gpu(random_tensor(a[i].grad.shape(), 50 + 3 * t + i, grad_size));
        a[i].grad.copy_from(g), b[i].grad.copy_from(g), r[i].grad.copy_from(g),
            c[i].grad.copy_from(g);
      }
      const Tensor na = optim::clip_grad_norm_async(pa, 1.0);
      const Tensor nb = optim::clip_grad_norm_async(pb, 1.0, nullptr, nullptr, nullptr, ob.get());
      EXPECT_EQ(nb.to_vector(), na.to_vector()) << name << " step " << t << ": the norm";
      // The sum of squares reduced on the device (as over two ranks holding these gradients:
      // doubled there), in place and deferred: the same norm, and the steps below the same
      // parameters.
      const auto doubled = [](Tensor& stats) { ops::scale_(stats, 2.0f); };
      const auto host = [](double sq) { return 2.0 * sq; };
      const Tensor nr = optim::clip_grad_norm_async(pr, 1.0, host, nullptr, doubled);
      const Tensor nc = optim::clip_grad_norm_async(pc, 1.0, host, nullptr, doubled, oc.get());
      EXPECT_EQ(nc.to_vector(), nr.to_vector()) << name << " step " << t << ": the reduced norm";
      if (name == "adamw" && t != 2) {  // unscaled until the step, which reads them scaled
        EXPECT_NE(b[0].grad.to_vector(), a[0].grad.to_vector()) << name;
      }
      oa->step();
      ob->step();
      orr->step();
      oc->step();
      for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(b[i].value.to_vector(), a[i].value.to_vector())
            << name << " step " << t << " parameter " << i;
        EXPECT_EQ(c[i].value.to_vector(), r[i].value.to_vector())
            << name << " step " << t << " parameter " << i << ", reduced on the device";
      }
    }
    // A pending clip dropped by zero_grad: the next step is unclipped.
    for (int i = 0; i < 3; ++i)
      b[i].grad.copy_from(gpu(random_tensor(b[i].grad.shape(), 90, 3.0f)));
    optim::clip_grad_norm_async(pb, 1.0, nullptr, nullptr, nullptr, ob.get());
    ob->zero_grad();
    for (int i = 0; i < 3; ++i) {
      const Tensor g = gpu(random_tensor(a[i].grad.shape(), 91 + i, 3.0f));
      a[i].grad.copy_from(g), b[i].grad.copy_from(g);
    }
    oa->step();
    ob->step();
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(b[i].value.to_vector(), a[i].value.to_vector()) << name << " after zero_grad";
  }
}

// The copy-engine exchange's fused sum (Optimizer::sum_replicas, grad_stats and the deferred clip
// with replicas): three ranks' copies of the gradients in three allocations, this rank's in the
// middle (rank 1) with the gradients as padded views of it, as DDP's buckets; the statistics,
// norm and steps equal, bit for bit, those of the gradients summed in rank order first, and the
// gradient memory is left as it was. Optimizers without the fused read refuse it.
TEST_F(Cuda, ReplicaSumsStepAsSummedGradients) {
  const std::vector<Shape> shapes = {{5, 9}, {37}, {6, 9}};
  std::vector<int64_t> at;  // each gradient's offset in the allocation (64-element padding)
  int64_t total = 0;
  for (const Shape& s : shapes) at.push_back(total), total += (shape_numel(s) + 63) / 64 * 64;
  std::vector<Tensor> copies;  // rank order: 0, 1 (own), 2
  for (int r = 0; r < 3; ++r) copies.push_back(gpu(random_tensor({total}, 70 + r, 2.0f)));
  // The sum in rank order, rounded as the kernels add: (c0 + c1) + c2 in fp32.
  const auto c0 = copies[0].to_vector(), c1 = copies[1].to_vector(), c2 = copies[2].to_vector();
  std::vector<float> sum(total);
  for (int64_t i = 0; i < total; ++i) sum[i] = (c0[i] + c1[i]) + c2[i];
  const Tensor summed = gpu(Tensor::from_vector(sum, {total}));
  std::vector<int64_t> delta;
  const auto base = reinterpret_cast<intptr_t>(copies[1].data<float>());
  for (int r = 0; r < 3; ++r)
    delta.push_back((reinterpret_cast<intptr_t>(copies[r].data<float>()) - base) / 4);
  for (const std::string name : {"adamw", "sgd"}) {
    std::vector<nn::Parameter> a, b;
    for (size_t i = 0; i < shapes.size(); ++i) {
      auto p = nn::make_parameter("p" + std::to_string(i), shapes[i], i != 1);
      p.value = gpu(random_tensor(shapes[i], 80 + i));
      const int64_t n = shape_numel(shapes[i]);
      p.grad = summed.narrow(at[i], n).reshape(shapes[i]);
      a.push_back(p);
      p.value = p.value.clone();
      p.grad = copies[1].narrow(at[i], n).reshape(shapes[i]);
      b.push_back(p);
    }
    std::vector<nn::Parameter*> pa, pb;
    for (size_t i = 0; i < shapes.size(); ++i) pa.push_back(&a[i]), pb.push_back(&b[i]);
    optim::OptimizerOptions o;
    o.name = name;
    auto oa = optim::make_optimizer(o, optim::weight_decay_groups(pa, 0.01, 0.05));
    auto ob = optim::make_optimizer(o, optim::weight_decay_groups(pb, 0.01, 0.05));
    if (name != "adamw") {
      EXPECT_FALSE(ob->can_sum_replicas(kGpu)) << name;
      EXPECT_THROW(ob->sum_replicas(delta), Error) << name;
      continue;
    }
    ASSERT_TRUE(ob->can_sum_replicas(kGpu));
    EXPECT_EQ(optim::grad_stats(pb, nullptr, 1.0f, &delta).to_vector(),
              optim::grad_stats(pa).to_vector());
    EXPECT_THROW(optim::grad_stats(pb, nullptr, 0.5f, &delta), Error);  // an unscale writes
    const auto own = copies[1].to_vector();
    for (int t = 0; t < 3; ++t) {
      const bool clip = t != 1;
      if (clip) {
        const Tensor na = optim::clip_grad_norm_async(pa, 1.0, nullptr, nullptr, nullptr, oa.get());
        const Tensor nb =
            optim::clip_grad_norm_async(pb, 1.0, nullptr, nullptr, nullptr, ob.get(), &delta);
        EXPECT_EQ(nb.to_vector(), na.to_vector()) << "step " << t << ": the norm";
      }
      ob->sum_replicas(delta);
      oa->step();
      ob->step();
      for (size_t i = 0; i < shapes.size(); ++i)
        EXPECT_EQ(b[i].value.to_vector(), a[i].value.to_vector())
            << "step " << t << " parameter " << i;
    }
    EXPECT_EQ(copies[1].to_vector(), own) << "the gradient memory is left as it was";
    // The clip with replicas needs the deferred path.
    EXPECT_THROW(optim::clip_grad_norm_async(pb, 1.0, nullptr, nullptr, nullptr, nullptr, &delta),
                 Error);
  }
}

TEST_F(Cuda, VitMatchesTimmOnTheGpu) {
  auto g = test::load_golden(test::data_path("vit_golden.bin"));
  const nn::ViTConfig c = test::vit_config(g);
  const float eps = g.at("config.label_smoothing").item();
  nn::ViT m(c);
  for (nn::Parameter* p : m.parameters()) p->value.copy_from(g.at("param." + p->name));
  m.to(kGpu);
  std::vector<std::unique_ptr<nn::Cache>> caches;
  nn::ForwardCtx ctx{true, 0, 0, 0};
  Tensor labels = gpu(g.at("input.labels"));
  Tensor logits = m.forward(gpu(g.at("input.images")), caches, ctx);
  expect_close(logits, g.at("output.logits"), "logits");
  const int64_t B = logits.size(0);
  double loss = 0;
  for (float l : ops::cross_entropy_fwd(logits, labels, eps).to_vector()) loss += l / B;
  EXPECT_NEAR(loss, g.at("output.loss").item(), 1e-5 * loss);
  m.backward(ops::cross_entropy_bwd(logits, labels, eps, 1.0f / B), caches, ctx);
  for (nn::Parameter* p : m.parameters())
    expect_close(p->grad, g.at("grad." + p->name), p->name.c_str());
}

// The ViT with tanh GELU (fc1's bias+GELU epilogue and fc2's DGELU epilogue on the GPU) against
// the same model in fp32 on the CPU: in fp32 within 1e-5 (logits and every gradient); in bf16
// within the model-level bf16 bounds of the CPU suite (MixedPrecision.ViTInHalfPrecisionTracksFp32:
// logits 2e-2, gradients 6e-2; each op is held to 1e-2 by the kernel tests).
TEST_F(Cuda, VitWithFusedGeluEpiloguesMatchesTheCpu) {
  nn::ViTConfig c;
  c.img_size = 32, c.patch_size = 8, c.in_chans = 3, c.num_classes = 10, c.embed_dim = 64;
  c.depth = 2, c.num_heads = 4, c.mlp_ratio = 4.0, c.act = "gelu_tanh";
  nn::ViT cpu_m(c);
  cpu_m.init(11);
  Tensor img = random_tensor({8, 3, 32, 32}, 3);
  Tensor labels = Tensor::from_vector(std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}, {8});
  nn::ForwardCtx ctx{true, 0, 0, 0};
  std::vector<std::unique_ptr<nn::Cache>> cc;
  Tensor lc = cpu_m.forward(img, cc, ctx);
  cpu_m.backward(ops::cross_entropy_bwd(lc, labels, 0.1f, 0.125f), cc, ctx);
  for (DType t : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(t));
    const double logit_tol = t == DType::F32 ? 1e-5 : 2e-2,
                 grad_tol = t == DType::F32 ? 1e-5 : 6e-2;
    nn::ViT gpu_m(c);
    gpu_m.init(11);
    gpu_m.set_compute_dtype(t);
    gpu_m.to(kGpu);
    std::vector<std::unique_ptr<nn::Cache>> gc;
    Tensor lg = gpu_m.forward(gpu(img), gc, ctx);
    expect_close(lg, lc, "logits", logit_tol);
    gpu_m.backward(ops::cross_entropy_bwd(lg, gpu(labels), 0.1f, 0.125f), gc, ctx);
    auto pc = cpu_m.parameters(), pg = gpu_m.parameters();
    for (size_t i = 0; i < pc.size(); ++i)
      expect_close(pg[i]->grad, pc[i]->grad, pc[i]->name.c_str(), grad_tol);
  }
}
