// The LayerNorm CUDA kernels at ViT-H and wider widths against the CPU reference (kernels/cpu):
// the register path at d = 1280 (tier 10) and 1536 (tier 12), the block-per-row fallbacks just
// past it (d = 1282: not a multiple of 4; d = 1540: beyond the largest tier), and the parameter
// gradients' (column tile × row chunk) reduction with few rows (one chunk) and many (8224 rows,
// ViT-H/14 at batch 32: many chunks): through the fp32 entry point (double partials, ≤ 1e-6),
// the typed fallback (fp32 partials) and the fused backward with residual, half copy (bf16 and
// fp16) and column sums. Reductions must repeat bit for bit. Errors are norm-wise relative
// (‖gpu − cpu‖ / ‖cpu‖), printed; fp32 outputs ≤ 1e-5. The Timings case only prints.
// Runs on a GPU host; without a GPU every case skips, saying why.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "cai/core/tensor.h"
#include "gradcheck.h"
#include "kernels/device.h"
#include "kernels/layernorm.h"

#ifdef CAI_HAVE_CUDA
#include <cuda_runtime.h>
#endif

using namespace cai;
using cai::kernels::DT;
using cai::test::random_tensor;
namespace kc = cai::kernels::cuda;
namespace kh = cai::kernels::cpu;

namespace {

const Device kGpu = Device::cuda(0);

class CudaLayerNorm : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kc::device_count() == 0) GTEST_SKIP() << "no GPU: " << kc::runtime_info().device_error;
  }
};

DT kdt(DType t) {
  return t == DType::F32 ? DT::F32 : t == DType::BF16 ? DT::BF16 : DT::F16;
}

// fp32 values of t on the host.
std::vector<float> host(const Tensor& t) {
  return t.to(Device::cpu()).to(DType::F32).to_vector();
}

// Random values rounded to `t` (the CPU reference runs on the rounded values).
Tensor random_of(DType t, const Shape& s, uint64_t seed, float scale = 1.0f) {
  return random_tensor(s, seed, scale).to(t);
}

// `t` on the GPU, `pad` elements into its buffer (pad = 1: aligned to its element size only, so
// the kernels take their scalar fallbacks).
Tensor on_gpu(const Tensor& t, int64_t pad = 0) {
  if (pad == 0) return t.to(kGpu);
  std::vector<float> v(static_cast<size_t>(pad), 0.0f);
  const std::vector<float> body = host(t);
  v.insert(v.end(), body.begin(), body.end());
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())})
      .to(t.dtype())
      .to(kGpu)
      .narrow(pad, t.numel());
}

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i])) return std::numeric_limits<double>::infinity();
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num) / (std::sqrt(den) + 1e-30);
}

void expect_close(const std::vector<float>& gpu, const std::vector<float>& ref, double tolerance,
                  const std::string& what) {
  ASSERT_EQ(gpu.size(), ref.size()) << what;
  const double e = rel_err(gpu, ref);
  std::printf("  %-66s rel err %.3e (tol %.0e)\n", what.c_str(), e, tolerance);
  EXPECT_LE(e, tolerance) << what;
}

// One problem: x[m, d], gamma, beta, dy, the CPU's statistics (uploaded as they are, so that the
// GPU backward is compared alone) and initial dgamma/dbeta to accumulate onto.
struct Problem {
  int64_t m, d;
  Tensor x, dy, gamma, beta;
  std::vector<float> xv, dyv, g, b, mean, rstd, dg0, db0;
  Problem(int64_t rows, int64_t cols, DType xt, DType dyt) : m(rows), d(cols) {
    x = random_of(xt, {m, d}, 101, 2.0f), dy = random_of(dyt, {m, d}, 102);
    gamma = random_tensor({d}, 103), beta = random_tensor({d}, 104);
    xv = host(x), dyv = host(dy), g = host(gamma), b = host(beta);
    dg0 = host(random_tensor({d}, 105)), db0 = host(random_tensor({d}, 106));
    std::vector<float> y(xv.size());
    mean.resize(m), rstd.resize(m);
    kh::layernorm_fwd(xv.data(), g.data(), b.data(), y.data(), mean.data(), rstd.data(), m, d,
                      1e-6f);
  }
  // The CPU's dx (null: not computed), dgamma and dbeta (from dg0/db0).
  void reference(std::vector<float>* dx, std::vector<float>* dg, std::vector<float>* db) const {
    *dg = dg0, *db = db0;
    if (dx) dx->resize(xv.size());
    kh::layernorm_bwd(xv.data(), g.data(), mean.data(), rstd.data(), dyv.data(),
                      dx ? dx->data() : nullptr, dg->data(), db->data(), m, d);
  }
  Tensor gpu_mean() const { return Tensor::from_vector(mean, {m}).to(kGpu); }
  Tensor gpu_rstd() const { return Tensor::from_vector(rstd, {m}).to(kGpu); }
  Tensor gpu_dg0() const { return Tensor::from_vector(dg0, {d}).to(kGpu); }
  Tensor gpu_db0() const { return Tensor::from_vector(db0, {d}).to(kGpu); }
};

// (m, d): wide tiers with few rows and with ViT-H/14 b32's 8224 (and 4112) rows, the fallbacks
// past them, and ViT-L/16's 2D-split shape (12608 rows of 512 of the 1024 features).
struct Shape2 {
  int64_t m, d;
};
const Shape2 kWide[] = {{5, 1280}, {8224, 1280}, {9, 1536}, {4112, 1536},
                        {7, 1282}, {8224, 1282}, {3, 1540}, {2056, 1540}};

}  // namespace

// The fp32 entry point's parameter gradients (the split/2D path and fp32 runs): double partials
// per (tile, chunk) block, summed over the chunks in double, as the CPU reduces.
TEST_F(CudaLayerNorm, Fp32EntryParameterGradients) {
  std::vector<Shape2> shapes(std::begin(kWide), std::end(kWide));
  shapes.push_back({12608, 512});
  shapes.push_back({1, 1});
  for (const Shape2& s : shapes) {
    const Problem p(s.m, s.d, DType::F32, DType::F32);
    std::vector<float> dx, dg, db;
    p.reference(&dx, &dg, &db);
    const Tensor x = p.x.to(kGpu), dy = p.dy.to(kGpu), g = p.gamma.to(kGpu);
    const Tensor mean = p.gpu_mean(), rstd = p.gpu_rstd();
    Tensor gdx = Tensor::zeros({s.m, s.d}, DType::F32, kGpu), gdg = p.gpu_dg0(), gdb = p.gpu_db0();
    kc::layernorm_bwd(x.data<float>(), g.data<float>(), mean.data<float>(), rstd.data<float>(),
                      dy.data<float>(), gdx.data<float>(), gdg.data<float>(), gdb.data<float>(),
                      s.m, s.d);
    const std::string tag = fmt::format("fp32 entry {}x{}", s.m, s.d);
    expect_close(host(gdx), dx, 1e-5, tag + " dx");
    expect_close(host(gdg), dg, 1e-6, tag + " dgamma (accumulated)");
    expect_close(host(gdb), db, 1e-6, tag + " dbeta (accumulated)");
    // Again from the same start, parameter gradients only: the same bits (fixed order).
    Tensor gdg2 = p.gpu_dg0(), gdb2 = p.gpu_db0();
    kc::layernorm_bwd(x.data<float>(), g.data<float>(), mean.data<float>(), rstd.data<float>(),
                      dy.data<float>(), nullptr, gdg2.data<float>(), gdb2.data<float>(), s.m, s.d);
    EXPECT_EQ(host(gdg2), host(gdg)) << tag << " dgamma repeated";
    EXPECT_EQ(host(gdb2), host(gdb)) << tag << " dbeta repeated";
    // One of the two only: the other left alone.
    Tensor gdg3 = p.gpu_dg0(), gdb3 = p.gpu_db0();
    kc::layernorm_bwd(x.data<float>(), g.data<float>(), mean.data<float>(), rstd.data<float>(),
                      dy.data<float>(), nullptr, gdg3.data<float>(), nullptr, s.m, s.d);
    kc::layernorm_bwd(x.data<float>(), g.data<float>(), mean.data<float>(), rstd.data<float>(),
                      dy.data<float>(), nullptr, nullptr, gdb3.data<float>(), s.m, s.d);
    EXPECT_EQ(host(gdg3), host(gdg)) << tag << " dgamma alone";
    EXPECT_EQ(host(gdb3), host(gdb)) << tag << " dbeta alone";
  }
}

// The typed backward on every wide shape: x fp32 or bf16, dy bf16 or fp32, dx fp32 (and bf16), on
// aligned buffers (the register path where d allows) and with x one element into its buffer (the
// block-per-row dx and the (tile, chunk) parameter gradients with fp32 partials).
TEST_F(CudaLayerNorm, TypedBackwardWide) {
  for (const Shape2& s : kWide)
    for (auto [xt, dyt, dxt] : {std::tuple{DType::F32, DType::BF16, DType::F32},
                                std::tuple{DType::BF16, DType::BF16, DType::BF16},
                                std::tuple{DType::F32, DType::F32, DType::F32}})
      for (int64_t pad : {0, 1}) {
        if (pad && (s.d % 4 != 0 || s.d > 1536)) continue;  // the fallback either way
        const Problem p(s.m, s.d, xt, dyt);
        std::vector<float> dx, dg, db;
        p.reference(&dx, &dg, &db);
        const Tensor x = on_gpu(p.x, pad), dy = p.dy.to(kGpu), g = p.gamma.to(kGpu);
        const Tensor mean = p.gpu_mean(), rstd = p.gpu_rstd();
        Tensor gdx = Tensor::zeros({s.m, s.d}, dxt, kGpu), gdg = p.gpu_dg0(), gdb = p.gpu_db0();
        kc::layernorm_bwd_t(kdt(xt), x.raw(), g.data<float>(), mean.data<float>(),
                            rstd.data<float>(), kdt(dyt), dy.raw(), kdt(dxt), gdx.raw(),
                            gdg.data<float>(), gdb.data<float>(), s.m, s.d);
        const std::string tag =
            fmt::format("bwd_t {}x{} x {}{} dy {} dx {}", s.m, s.d, dtype_name(xt),
                        pad ? " (misaligned)" : "", dtype_name(dyt), dtype_name(dxt));
        expect_close(host(gdx), dx, dxt == DType::F32 ? 1e-5 : 1e-2, tag + " dx");
        expect_close(host(gdg), dg, 1e-5, tag + " dgamma");
        expect_close(host(gdb), db, 1e-5, tag + " dbeta");
        Tensor gdg2 = p.gpu_dg0(), gdb2 = p.gpu_db0();
        kc::layernorm_bwd_t(kdt(xt), x.raw(), g.data<float>(), mean.data<float>(),
                            rstd.data<float>(), kdt(dyt), dy.raw(), kdt(dxt), nullptr,
                            gdg2.data<float>(), gdb2.data<float>(), s.m, s.d);
        // Without dx: the same kernels and grids for the sums, so the same bits.
        EXPECT_EQ(host(gdg2), host(gdg)) << tag << " dgamma without dx";
        EXPECT_EQ(host(gdb2), host(gdb)) << tag << " dbeta without dx";
      }
}

// The forward on every wide shape, x fp32/bf16 → y bf16/fp32, against the CPU's (statistics too).
TEST_F(CudaLayerNorm, TypedForwardWide) {
  for (const Shape2& s : kWide)
    for (auto [xt, yt] : {std::pair{DType::F32, DType::BF16}, std::pair{DType::BF16, DType::BF16},
                          std::pair{DType::F32, DType::F32}}) {
      const Problem p(s.m, s.d, xt, DType::F32);
      std::vector<float> y(p.xv.size());
      const Tensor x = p.x.to(kGpu), g = p.gamma.to(kGpu), b = p.beta.to(kGpu);
      Tensor gy = Tensor::zeros({s.m, s.d}, yt, kGpu);
      Tensor gm = Tensor::zeros({s.m}, DType::F32, kGpu),
             gr = Tensor::zeros({s.m}, DType::F32, kGpu);
      std::vector<float> mean(s.m), rstd(s.m);
      kh::layernorm_fwd(p.xv.data(), p.g.data(), p.b.data(), y.data(), mean.data(), rstd.data(),
                        s.m, s.d, 1e-6f);
      kc::layernorm_fwd_t(kdt(xt), x.raw(), g.data<float>(), b.data<float>(), kdt(yt), gy.raw(),
                          gm.data<float>(), gr.data<float>(), s.m, s.d, 1e-6f);
      const std::string tag =
          fmt::format("fwd_t {}x{} {} -> {}", s.m, s.d, dtype_name(xt), dtype_name(yt));
      expect_close(host(gy), y, yt == DType::F32 ? 1e-5 : 1e-2, tag + " y");
      expect_close(host(gm), mean, 1e-5, tag + " mean");
      expect_close(host(gr), rstd, 1e-5, tag + " rstd");
    }
}

// The residual stream's backward (vit.cpp's): x fp32, dy bf16, dx fp32 = the backward + residual,
// its half copy (bf16 or fp16) and the column sums of that copy (added or written), with and
// without dgamma, on every wide shape.
TEST_F(CudaLayerNorm, BackwardAddWide) {
  for (const Shape2& s : kWide)
    for (DType half_t : {DType::BF16, DType::F16})
      for (bool add : {true, false}) {
        const Problem p(s.m, s.d, DType::F32, DType::BF16);
        std::vector<float> dx, dg, db;
        p.reference(&dx, &dg, &db);
        const Tensor res = random_tensor({s.m, s.d}, 107);
        const std::vector<float> rv = host(res);
        for (size_t i = 0; i < dx.size(); ++i) dx[i] += rv[i];
        const std::vector<float> sum0 = host(random_tensor({s.d}, 108));
        const Tensor x = p.x.to(kGpu), dy = p.dy.to(kGpu), g = p.gamma.to(kGpu),
                     gres = res.to(kGpu);
        const Tensor mean = p.gpu_mean(), rstd = p.gpu_rstd();
        Tensor gdx = Tensor::zeros({s.m, s.d}, DType::F32, kGpu),
               ghalf = Tensor::zeros({s.m, s.d}, half_t, kGpu), gdg = p.gpu_dg0(),
               gdb = p.gpu_db0(), gsum = Tensor::from_vector(sum0, {s.d}).to(kGpu);
        // dgamma left out when adding (the kernel's sums then go to dbeta and dsum only).
        kc::layernorm_bwd_add_t(DT::F32, x.raw(), g.data<float>(), mean.data<float>(),
                                rstd.data<float>(), DT::BF16, dy.raw(), DT::F32, gdx.raw(),
                                gres.raw(), kdt(half_t), ghalf.raw(),
                                add ? nullptr : gdg.data<float>(), gdb.data<float>(),
                                gsum.data<float>(), add, s.m, s.d);
        const std::string tag = fmt::format("bwd_add_t {}x{} half {} dsum {}", s.m, s.d,
                                            dtype_name(half_t), add ? "added" : "written");
        const std::vector<float> gdxv = host(gdx), halfv = host(ghalf);
        expect_close(gdxv, dx, 1e-5, tag + " dx");
        // The copy is the GPU's own dx rounded once.
        EXPECT_EQ(halfv, host(Tensor::from_vector(gdxv, {s.m, s.d}).to(half_t))) << tag;
        if (add) {
          EXPECT_EQ(host(gdg), p.dg0) << tag << " dgamma left alone";
        } else {
          expect_close(host(gdg), dg, 1e-5, tag + " dgamma");
        }
        expect_close(host(gdb), db, 1e-5, tag + " dbeta");
        // The column sums of the copy, as the next GEMM's bias gradient would sum it.
        std::vector<float> want(s.d);
        for (int64_t j = 0; j < s.d; ++j) {
          double acc = 0.0;
          for (int64_t i = 0; i < s.m; ++i) acc += halfv[i * s.d + j];
          want[j] = (add ? sum0[j] : 0.0f) + static_cast<float>(acc);
        }
        expect_close(host(gsum), want, 1e-5, tag + " column sums");
      }
}

// --- timings (printed, not asserted) ------------------------------------------------------------

namespace {
template <typename F>
double time_ms(F&& f, int iters = 20) {
  f();
  f();
#ifdef CAI_HAVE_CUDA
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a);
  for (int i = 0; i < iters; ++i) f();
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / iters;
#else
  (void)iters;
  return 0.0;
#endif
}
void report(const std::string& what, double ms, double bytes) {
  std::printf("  TIMING %-60s %9.1f us  %7.0f GB/s\n", what.c_str(), ms * 1e3, bytes / ms * 1e-6);
}
}  // namespace

// ViT-H/14 b32 (8224 × 1280) as vit_train runs it, ViT-L/16's 2D split (12608 × 512, fp32 entry)
// and the typed fallback's parameter gradients (x misaligned).
TEST_F(CudaLayerNorm, Timings) {
  for (const Shape2 s : {Shape2{8224, 1280}, Shape2{4112, 1536}, Shape2{12608, 512}}) {
    const int64_t m = s.m, d = s.d, n = m * d;
    const Tensor x = random_tensor({m, d}, 1).to(kGpu), g = random_tensor({d}, 2).to(kGpu),
                 b = random_tensor({d}, 3).to(kGpu),
                 dy = random_of(DType::BF16, {m, d}, 4).to(kGpu),
                 dy32 = random_tensor({m, d}, 5).to(kGpu), res = random_tensor({m, d}, 6).to(kGpu);
    const Tensor xm = on_gpu(random_tensor({m, d}, 1), 1);
    Tensor y = Tensor::zeros({m, d}, DType::BF16, kGpu),
           dx = Tensor::zeros({m, d}, DType::F32, kGpu),
           half = Tensor::zeros({m, d}, DType::BF16, kGpu),
           mean = Tensor::zeros({m}, DType::F32, kGpu), rstd = Tensor::zeros({m}, DType::F32, kGpu),
           dg = Tensor::zeros({d}, DType::F32, kGpu), db = Tensor::zeros({d}, DType::F32, kGpu),
           dsum = Tensor::zeros({d}, DType::F32, kGpu);
    const auto fm = mean.data<float>(), fr = rstd.data<float>();
    report(fmt::format("layernorm_fwd_t fp32->bf16 {}x{}", m, d), time_ms([&] {
             kc::layernorm_fwd_t(DT::F32, x.raw(), g.data<float>(), b.data<float>(), DT::BF16,
                                 y.raw(), fm, fr, m, d, 1e-6f);
           }),
           n * 6.0);
    report(fmt::format("layernorm_bwd_add_t +res, bf16 copy, dsum {}x{}", m, d), time_ms([&] {
             kc::layernorm_bwd_add_t(DT::F32, x.raw(), g.data<float>(), fm, fr, DT::BF16, dy.raw(),
                                     DT::F32, dx.raw(), res.raw(), DT::BF16, half.raw(),
                                     dg.data<float>(), db.data<float>(), dsum.data<float>(), false,
                                     m, d);
           }),
           n * 16.0);
    report(fmt::format("layernorm_bwd fp32 entry, dgamma/dbeta only {}x{}", m, d), time_ms([&] {
             kc::layernorm_bwd(x.data<float>(), g.data<float>(), fm, fr, dy32.data<float>(),
                               nullptr, dg.data<float>(), db.data<float>(), m, d);
           }),
           n * 8.0);
    report(fmt::format("layernorm_bwd_t fallback (x misaligned) dgamma/dbeta {}x{}", m, d),
           time_ms([&] {
             kc::layernorm_bwd_t(DT::F32, xm.raw(), g.data<float>(), fm, fr, DT::BF16, dy.raw(),
                                 DT::F32, nullptr, dg.data<float>(), db.data<float>(), m, d);
           }),
           n * 6.0);
  }
}
