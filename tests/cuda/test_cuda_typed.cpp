// The typed (fp32/bf16/fp16) CUDA kernels against the CPU fp32 kernels: inputs are rounded to
// their type on the host (cai::float_to_bf16 / float_to_fp16), the CPU kernel runs on the rounded
// values, and the GPU output is compared norm-wise (‖gpu − cpu‖ / ‖cpu‖ ≤ 1e-5 for an fp32
// output, 1e-2 for bf16, 2e-3 for fp16; every error is printed). Dropout masks must equal the fp32
// kernel's exactly, casts must round bit for bit as the host, and the multi-tensor optimizers
// must match the per-tensor CUDA kernels (≤ 1e-6). The Timings case only prints.
// Runs on a GPU host; without a GPU every case skips, saying why.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "cai/core/tensor.h"
#include "cai/ops/ops.h"
#include "kernels/base/error.h"
#include "kernels/device.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/embed.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/optim.h"

#ifdef CAI_HAVE_CUDA
#include <cuda_runtime.h>
#endif

using namespace cai;
using cai::kernels::DT;
namespace kc = cai::kernels::cuda;
namespace kh = cai::kernels::cpu;

namespace {

class CudaTyped : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kc::device_count() == 0) GTEST_SKIP() << "no GPU: " << kc::runtime_info().device_error;
  }
};

const DT kTypes[] = {DT::F32, DT::BF16, DT::F16};

double tol(DT t) {
  return t == DT::F32 ? 1e-5 : t == DT::BF16 ? 1e-2 : 2e-3;
}

// Device buffer from the caching allocator; `offset` elements of slack in front let a test pass
// a misaligned pointer (at()).
class Buf {
 public:
  explicit Buf(size_t bytes) : bytes_(bytes) { p_ = kc::alloc(bytes ? bytes : 1, 0); }
  ~Buf() { kc::free(p_, 0); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  void* get() const { return p_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

float round_to(DT t, float f) {
  if (t == DT::BF16) return bf16_to_float(float_to_bf16(f));
  if (t == DT::F16) return fp16_to_float(float_to_fp16(f));
  return f;
}
std::vector<float> rounded(DT t, std::vector<float> v) {
  for (float& e : v) e = round_to(t, e);
  return v;
}
// Host bytes of v in type t.
std::vector<unsigned char> encode(DT t, const std::vector<float>& v) {
  std::vector<unsigned char> out(v.size() * kernels::dt_size(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DT::F32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else {
      const uint16_t h = t == DT::BF16 ? float_to_bf16(v[i]) : float_to_fp16(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}
std::vector<float> decode(DT t, const std::vector<unsigned char>& b, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    if (t == DT::F32) {
      std::memcpy(&v[i], b.data() + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, b.data() + 2 * i, 2);
      v[i] = t == DT::BF16 ? bf16_to_float(h) : fp16_to_float(h);
    }
  }
  return v;
}

// A device copy of v in type t (v is rounded to t on the way).
struct Typed {
  DT t;
  size_t n;
  Buf buf;
  Typed(DT type, const std::vector<float>& v)
      : t(type), n(v.size()), buf(v.size() * kernels::dt_size(type)) {
    const auto b = encode(t, v);
    if (!b.empty()) kc::copy_h2d(buf.get(), b.data(), b.size());
  }
  Typed(DT type, size_t count) : t(type), n(count), buf(count * kernels::dt_size(type)) {
    if (n) kc::memset_zero(buf.get(), n * kernels::dt_size(t));
  }
  void* get() const { return buf.get(); }
  float* f32() const { return buf.as<float>(); }
  std::vector<float> host() const {
    std::vector<unsigned char> b(n * kernels::dt_size(t));
    if (n) kc::copy_d2h(b.data(), buf.get(), b.size());
    return decode(t, b, n);
  }
};

std::vector<float> uniform(size_t n, unsigned seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& e : v) e = u(rng);
  return v;
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

// Checks and prints ‖gpu − ref‖ / ‖ref‖.
void expect_close(const std::vector<float>& gpu, const std::vector<float>& ref, double tolerance,
                  const std::string& what) {
  ASSERT_EQ(gpu.size(), ref.size()) << what;
  const double e = rel_err(gpu, ref);
  std::printf("  %-58s rel err %.3e (tol %.0e)\n", what.c_str(), e, tolerance);
  EXPECT_LE(e, tolerance) << what;
}

std::string name(DT t) {
  return kernels::dt_name(t);
}

}  // namespace

// --- layernorm
// -------------------------------------------------------------------------------------

// (m, d): odd d (block-per-row fallback), every register tier (d = 20, 256, 768, 1024, 1028 and
// 1280: tier 10, 1536: tier 12), d past the largest tier (1540) or not a multiple of 4 (1282): the
// fallbacks; d = 1. tests/cuda/test_cuda_layernorm.cpp holds the wide shapes with many rows.
const std::pair<int64_t, int64_t> kLnShapes[] = {{4, 9},    {1, 1},     {7, 20},   {33, 256},
                                                 {37, 768}, {64, 1024}, {3, 1028}, {5, 1280},
                                                 {9, 1536}, {3, 1540},  {6, 1282}};

TEST_F(CudaTyped, LayerNormForward) {
  for (auto [m, d] : kLnShapes) {
    for (DT xt : kTypes) {
      for (DT yt : kTypes) {
        const auto x = rounded(xt, uniform(m * d, 1, -2.0f, 2.5f));
        const auto g = uniform(d, 2, 0.5f, 1.5f), b = uniform(d, 3);
        std::vector<float> y(m * d), mean(m), rstd(m);
        kh::layernorm_fwd(x.data(), g.data(), b.data(), y.data(), mean.data(), rstd.data(), m, d,
                          1e-6f);
        Typed gx(xt, x), gg(DT::F32, g), gb(DT::F32, b), gy(yt, m * d), gm(DT::F32, m),
            gr(DT::F32, m);
        kc::layernorm_fwd_t(xt, gx.get(), gg.f32(), gb.f32(), yt, gy.get(), gm.f32(), gr.f32(), m,
                            d, 1e-6f);
        const std::string tag = fmt::format("layernorm fwd {}x{} {}->{}", m, d, name(xt), name(yt));
        expect_close(gy.host(), y, tol(yt), tag + " y");
        expect_close(gm.host(), mean, 1e-5, tag + " mean");
        expect_close(gr.host(), rstd, 1e-5, tag + " rstd");
      }
    }
  }
}

// The ViT sizes (ViT-B: 256 images × 197 tokens, d = 768; ViT-H/14: 32 × 257, d = 1280): fp32
// residual in, bf16 out (and all-bf16).
TEST_F(CudaTyped, LayerNormViTSize) {
  for (auto [m, d, xt, yt, dyt, dxt] :
       {std::tuple{int64_t{256 * 197}, int64_t{768}, DT::F32, DT::BF16, DT::BF16, DT::F32},
        std::tuple{int64_t{256 * 197}, int64_t{768}, DT::BF16, DT::BF16, DT::BF16, DT::BF16},
        std::tuple{int64_t{32 * 257}, int64_t{1280}, DT::F32, DT::BF16, DT::BF16, DT::F32},
        std::tuple{int64_t{32 * 257}, int64_t{1280}, DT::BF16, DT::BF16, DT::BF16, DT::BF16}}) {
    const auto x = rounded(xt, uniform(m * d, 11, -2.0f, 2.5f));
    const auto g = uniform(d, 12, 0.5f, 1.5f), b = uniform(d, 13);
    const auto dy = rounded(dyt, uniform(m * d, 14));
    std::vector<float> y(m * d), mean(m), rstd(m), dx(m * d);
    std::vector<float> dg = uniform(d, 15), db = uniform(d, 16);
    Typed gdg(DT::F32, dg), gdb(DT::F32, db);
    kh::layernorm_fwd(x.data(), g.data(), b.data(), y.data(), mean.data(), rstd.data(), m, d,
                      1e-6f);
    kh::layernorm_bwd(x.data(), g.data(), mean.data(), rstd.data(), dy.data(), dx.data(), dg.data(),
                      db.data(), m, d);
    Typed gx(xt, x), gg(DT::F32, g), gb(DT::F32, b), gy(yt, m * d), gm(DT::F32, m), gr(DT::F32, m);
    kc::layernorm_fwd_t(xt, gx.get(), gg.f32(), gb.f32(), yt, gy.get(), gm.f32(), gr.f32(), m, d,
                        1e-6f);
    const std::string tag = fmt::format("layernorm {}x{} x {} y {} dy {} dx {}", m, d, name(xt),
                                        name(yt), name(dyt), name(dxt));
    expect_close(gy.host(), y, tol(yt), tag + " y");
    // The backward from the CPU statistics, so that dx compares the backward alone.
    Typed cm(DT::F32, mean), cr(DT::F32, rstd), gdy(dyt, dy), gdx(dxt, m * d);
    kc::layernorm_bwd_t(xt, gx.get(), gg.f32(), cm.f32(), cr.f32(), dyt, gdy.get(), dxt, gdx.get(),
                        gdg.f32(), gdb.f32(), m, d);
    expect_close(gdx.host(), dx, tol(dxt), tag + " dx");
    expect_close(gdg.host(), dg, 1e-5, tag + " dgamma (accumulated)");
    expect_close(gdb.host(), db, 1e-5, tag + " dbeta (accumulated)");
  }
}

TEST_F(CudaTyped, LayerNormBackward) {
  for (auto [m, d] : kLnShapes) {
    for (DT xt : kTypes) {
      for (DT dyt : kTypes) {
        for (DT dxt : kTypes) {
          const auto x = rounded(xt, uniform(m * d, 21, -2.0f, 2.5f));
          const auto g = uniform(d, 22, 0.5f, 1.5f), b = uniform(d, 23);
          const auto dy = rounded(dyt, uniform(m * d, 24));
          std::vector<float> y(m * d), mean(m), rstd(m), dx(m * d);
          std::vector<float> dg = uniform(d, 25), db = uniform(d, 26);
          Typed gdg(DT::F32, dg), gdb(DT::F32, db);
          kh::layernorm_fwd(x.data(), g.data(), b.data(), y.data(), mean.data(), rstd.data(), m, d,
                            1e-6f);
          kh::layernorm_bwd(x.data(), g.data(), mean.data(), rstd.data(), dy.data(), dx.data(),
                            dg.data(), db.data(), m, d);
          Typed gx(xt, x), gg(DT::F32, g), gm(DT::F32, mean), gr(DT::F32, rstd), gdy(dyt, dy),
              gdx(dxt, m * d);
          kc::layernorm_bwd_t(xt, gx.get(), gg.f32(), gm.f32(), gr.f32(), dyt, gdy.get(), dxt,
                              gdx.get(), gdg.f32(), gdb.f32(), m, d);
          const std::string tag = fmt::format("layernorm bwd {}x{} x {} dy {} dx {}", m, d,
                                              name(xt), name(dyt), name(dxt));
          expect_close(gdx.host(), dx, tol(dxt), tag + " dx");
          expect_close(gdg.host(), dg, 1e-5, tag + " dgamma");
          expect_close(gdb.host(), db, 1e-5, tag + " dbeta");
        }
      }
    }
  }
}

TEST_F(CudaTyped, LayerNormBackwardPartialOutputs) {
  // dx only (no parameter gradients), then parameter gradients only (no dx), and the misaligned
  // fallback (x one element into its buffer).
  const int64_t m = 50, d = 768;
  const auto x = rounded(DT::BF16, uniform(m * d + 1, 31)),
             dy = rounded(DT::BF16, uniform(m * d, 32));
  const auto g = uniform(d, 33, 0.5f, 1.5f), b = uniform(d, 34);
  const std::vector<float> xs(x.begin() + 1, x.end());
  std::vector<float> y(m * d), mean(m), rstd(m), dx(m * d), dg(d, 0.0f), db(d, 0.0f);
  kh::layernorm_fwd(xs.data(), g.data(), b.data(), y.data(), mean.data(), rstd.data(), m, d, 1e-6f);
  kh::layernorm_bwd(xs.data(), g.data(), mean.data(), rstd.data(), dy.data(), dx.data(), dg.data(),
                    db.data(), m, d);
  Typed gx(DT::BF16, x), gg(DT::F32, g), gm(DT::F32, mean), gr(DT::F32, rstd), gdy(DT::BF16, dy);
  const void* x1 = gx.buf.as<uint16_t>() + 1;  // 2-byte aligned only
  Typed gdx(DT::F32, m * d), gdg(DT::F32, d), gdb(DT::F32, d);
  kc::layernorm_bwd_t(DT::BF16, x1, gg.f32(), gm.f32(), gr.f32(), DT::BF16, gdy.get(), DT::F32,
                      gdx.get(), nullptr, nullptr, m, d);
  expect_close(gdx.host(), dx, 1e-5, "layernorm bwd misaligned x, dx only");
  EXPECT_EQ(gdg.host(), std::vector<float>(d, 0.0f));
  kc::layernorm_bwd_t(DT::BF16, x1, gg.f32(), gm.f32(), gr.f32(), DT::BF16, gdy.get(), DT::F32,
                      nullptr, gdg.f32(), gdb.f32(), m, d);
  expect_close(gdg.host(), dg, 1e-5, "layernorm bwd misaligned x, dgamma only");
  expect_close(gdb.host(), db, 1e-5, "layernorm bwd misaligned x, dbeta only");
  // Aligned: the warp kernel with parameter gradients only.
  Typed ax(DT::BF16, xs), adg(DT::F32, d), adb(DT::F32, d);
  kc::layernorm_bwd_t(DT::BF16, ax.get(), gg.f32(), gm.f32(), gr.f32(), DT::BF16, gdy.get(),
                      DT::F32, nullptr, adg.f32(), adb.f32(), m, d);
  expect_close(adg.host(), dg, 1e-5, "layernorm bwd aligned, dgamma only");
  expect_close(adb.host(), db, 1e-5, "layernorm bwd aligned, dbeta only");
  EXPECT_THROW(kc::layernorm_fwd_t(DT::F32, gx.get(), gg.f32(), gg.f32(), DT::F32, gdx.get(),
                                   nullptr, nullptr, m, 0, 1e-6f),
               Error);
}

// --- gelu
// ------------------------------------------------------------------------------------------

TEST_F(CudaTyped, Gelu) {
  for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{1001}, int64_t{4098}, int64_t{1} << 20}) {
    for (DT t : kTypes) {
      for (int shift : {0, 1}) {  // 1: misaligned pointers, the scalar path
        const auto x = rounded(t, uniform(n + shift, 41, -4.0f, 4.0f));
        const auto dy = rounded(t, uniform(n + shift, 42));
        const std::vector<float> xs(x.begin() + shift, x.end()), dys(dy.begin() + shift, dy.end());
        std::vector<float> y(n), dx(n);
        kh::gelu_fwd(xs.data(), y.data(), n);
        kh::gelu_bwd(xs.data(), dys.data(), dx.data(), n);
        Typed gx(t, x), gdy(t, dy), gy(t, n + shift), gdx(t, n + shift);
        const size_t sz = kernels::dt_size(t) * shift;
        auto at = [&](const Typed& b) { return static_cast<char*>(b.get()) + sz; };
        kc::gelu_fwd_t(t, at(gx), at(gy), n);
        kc::gelu_bwd_t(t, at(gx), at(gdy), at(gdx), n);
        auto hy = gy.host(), hdx = gdx.host();
        hy.erase(hy.begin(), hy.begin() + shift);
        hdx.erase(hdx.begin(), hdx.begin() + shift);
        const std::string tag =
            fmt::format("gelu n {} {}{}", n, name(t), shift ? " misaligned" : "");
        expect_close(hy, y, tol(t), tag + " fwd");
        expect_close(hdx, dx, tol(t), tag + " bwd");
      }
    }
  }
}

// bf16's exact GELU by table (every bf16 value, NaN and inf included) against the fp32 kernels on
// the same values rounded to bf16 as the host rounds: the forward the same bits except below
// 2^-8, where a series stands for erf (at most one bf16 step); the backward's slope (dy = 1, with
// and without the output made again) at most one bf16 step apart (its fp32 kernel takes expf for
// the density, the bf16 one ex2.approx.ftz, which is 0 beyond |x| = 13.2: there both are below
// 1e-30), and the fused backward's output made again equal to the forward's bits. Both sides
// compute in fp32, so a slot read for the wrong value fails here.
TEST_F(CudaTyped, GeluBf16EveryValue) {
  const int64_t m = 64, n = 1024;  // all 2^16 bit patterns, a row of n at a time
  std::vector<float> x(m * n);
  for (uint32_t b = 0; b < (1u << 16); ++b) x[b] = bf16_to_float(static_cast<uint16_t>(b));
  const std::vector<float> ones(m * n, 1.0f);
  Typed bx(DT::BF16, x), by(DT::BF16, m * n), bdx(DT::BF16, m * n), bdx2(DT::BF16, m * n),
      by2(DT::BF16, m * n), fx(DT::F32, x), fy(DT::F32, m * n), fdx(DT::F32, m * n),
      fdy(DT::F32, ones), bdy(DT::BF16, ones), db(DT::F32, n), db2(DT::F32, n);
  kc::gelu_fwd_t(DT::BF16, bx.get(), by.get(), m * n);
  kc::gelu_bwd_bias_t(DT::BF16, false, bx.get(), bdy.get(), bdx.get(), db.f32(), m, n, nullptr);
  kc::gelu_bwd_bias_t(DT::BF16, false, bx.get(), bdy.get(), bdx2.get(), db2.f32(), m, n, by2.get());
  kc::gelu_fwd(fx.f32(), fy.f32(), m * n);
  kc::gelu_bwd(fx.f32(), fdy.f32(), fdx.f32(), m * n);
  const auto y = by.host(), dx = bdx.host(), dx2 = bdx2.host(), y2 = by2.host(), ref_y = fy.host(),
             ref_dx = fdx.host();
  // Steps of bf16 between a and b (same sign side), NaN only with NaN.
  auto steps = [](float a, float b) -> int64_t {
    if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b) ? 0 : 1 << 20;
    if (a == b) return 0;  // +0 == -0
    auto ordered = [](float f) {
      const int32_t h = float_to_bf16(f);
      return h & 0x8000 ? -(h & 0x7fff) : h;
    };
    return std::abs(static_cast<int64_t>(ordered(a)) - ordered(b));
  };
  int tiny_off = 0;
  for (int64_t i = 0; i < m * n; ++i) {
    const float want = round_to(DT::BF16, ref_y[i]);
    const bool tiny = std::fabs(x[i]) < 0.00390625f;
    const int64_t d = steps(y[i], want);
    ASSERT_LE(d, tiny ? 1 : 0) << "gelu(" << x[i] << ") = " << y[i] << ", fp32 kernel " << ref_y[i];
    tiny_off += d != 0;
    // (Beyond |x| = 13.2 the density is subnormal: ex2.approx.ftz makes it 0, expf does not.)
    const float want_dx = round_to(DT::BF16, ref_dx[i]);
    ASSERT_TRUE(steps(dx[i], want_dx) <= 1 || std::fabs(dx[i] - want_dx) < 1e-30f)
        << "gelu'(" << x[i] << ") = " << dx[i] << ", fp32 kernel " << ref_dx[i];
    ASSERT_EQ(steps(dx2[i], dx[i]), 0) << "gelu'(" << x[i] << ") with y";
    ASSERT_EQ(steps(y2[i], y[i]), 0) << "gelu(" << x[i] << ") made again";
  }
  EXPECT_LT(tiny_off, 64) << "values below 2^-8 off by a step";
}

// The tanh approximation against its formula in double (not the CPU kernel): fwd
// 0.5·x·(1 + tanh(u)), u = √(2/π)·(x + 0.044715·x³), bwd dy·gelu'(x) with the exact derivative.
TEST_F(CudaTyped, GeluTanh) {
  const double c = std::sqrt(2.0 / 3.141592653589793), a3 = 0.044715;
  for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{1001}, int64_t{4098}, int64_t{1} << 20}) {
    for (DT t : kTypes) {
      for (int shift : {0, 1}) {  // 1: misaligned pointers, the scalar path
        const auto x = rounded(t, uniform(n + shift, 43, -5.0f, 5.0f));
        const auto dy = rounded(t, uniform(n + shift, 44));
        std::vector<float> y(n), dx(n);
        for (int64_t i = 0; i < n; ++i) {
          const double v = x[i + shift], th = std::tanh(c * (v + a3 * v * v * v));
          y[i] = static_cast<float>(0.5 * v * (1.0 + th));
          const double d =
              0.5 * (1.0 + th) + 0.5 * v * (1.0 - th * th) * c * (1.0 + 3.0 * a3 * v * v);
          dx[i] = static_cast<float>(dy[i + shift] * d);
        }
        Typed gx(t, x), gdy(t, dy), gy(t, n + shift), gdx(t, n + shift);
        const size_t sz = kernels::dt_size(t) * shift;
        auto at = [&](const Typed& b) { return static_cast<char*>(b.get()) + sz; };
        kc::gelu_tanh_fwd_t(t, at(gx), at(gy), n);
        kc::gelu_tanh_bwd_t(t, at(gx), at(gdy), at(gdx), n);
        auto hy = gy.host(), hdx = gdx.host();
        hy.erase(hy.begin(), hy.begin() + shift);
        hdx.erase(hdx.begin(), hdx.begin() + shift);
        const std::string tag =
            fmt::format("gelu_tanh n {} {}{}", n, name(t), shift ? " misaligned" : "");
        expect_close(hy, y, tol(t), tag + " fwd");
        expect_close(hdx, dx, tol(t), tag + " bwd");
      }
    }
  }
}

// --- dropout
// ---------------------------------------------------------------------------------------

TEST_F(CudaTyped, DropoutMasksEqualTheFp32Kernel) {
  const uint64_t seed = 1234, stream = 77;
  for (uint64_t offset : {uint64_t{0}, uint64_t{13}, uint64_t{1} << 33}) {
    for (int64_t n : {int64_t{1}, int64_t{5}, int64_t{10007}}) {
      const auto x = uniform(n, 51, 0.5f, 2.0f);  // no zeros: a zero output is a dropped element
      Typed fx(DT::F32, x), fy(DT::F32, n);
      kc::dropout_fwd(fx.f32(), fy.f32(), n, 0.3f, seed, stream, offset);
      const auto ref = fy.host();
      for (DT t : kTypes) {
        const auto xt = rounded(t, x);
        std::vector<float> cpu(n);
        kh::dropout_fwd(xt.data(), cpu.data(), n, 0.3f, seed, stream, offset);
        Typed gx(t, xt), gy(t, n);
        kc::dropout_fwd_t(t, gx.get(), gy.get(), n, 0.3f, seed, stream, offset);
        const auto h = gy.host();
        int64_t mismatched = 0, dropped = 0;
        for (int64_t i = 0; i < n; ++i) {
          mismatched += (h[i] == 0.0f) != (ref[i] == 0.0f);
          dropped += ref[i] == 0.0f;
        }
        EXPECT_EQ(mismatched, 0) << name(t) << " n " << n << " offset " << offset;
        if (n > 1000) {
          EXPECT_NEAR(double(dropped) / n, 0.3, 0.03);
        }
        expect_close(h, rounded(t, cpu), tol(t),
                     fmt::format("dropout {} n {} offset {}", name(t), n, offset));
      }
    }
  }
}

TEST_F(CudaTyped, DropPathMasksEqualTheFp32Kernel) {
  const int64_t b = 37, per = 1001;
  const auto x = uniform(b * per, 52, 0.5f, 2.0f);
  Typed fx(DT::F32, x), fy(DT::F32, b * per);
  kc::drop_path_fwd(fx.f32(), fy.f32(), b, per, 0.4f, 9, 5, 3);
  const auto ref = fy.host();
  for (DT t : kTypes) {
    const auto xt = rounded(t, x);
    std::vector<float> cpu(b * per);
    kh::drop_path_fwd(xt.data(), cpu.data(), b, per, 0.4f, 9, 5, 3);
    Typed gx(t, xt), gy(t, b * per);
    kc::drop_path_fwd_t(t, gx.get(), gy.get(), b, per, 0.4f, 9, 5, 3);
    const auto h = gy.host();
    int64_t mismatched = 0, dropped = 0;
    for (int64_t i = 0; i < b * per; ++i) {
      mismatched += (h[i] == 0.0f) != (ref[i] == 0.0f);
      dropped += ref[i] == 0.0f;
    }
    EXPECT_EQ(mismatched, 0) << name(t);
    EXPECT_GT(dropped, 0);
    EXPECT_LT(dropped, b * per);
    expect_close(h, rounded(t, cpu), tol(t), fmt::format("drop_path {}", name(t)));
  }
}

// Strided keys (a tensor-parallel slice): element i draws at offset + (i / row)·row_stride +
// (i % row). Masks must equal the CPU kernel's exactly; row_stride == row and n <= row take the
// contiguous kernel and must give the same masks too.
TEST_F(CudaTyped, StridedDropoutEqualsTheCpuKernel) {
  const uint64_t seed = 4321, stream = 9;
  struct Case {
    int64_t n, row, row_stride;
    uint64_t offset;
  };
  const Case cases[] = {{5 * 6, 6, 12, 1000},
                        {4 * 1000, 1000, 3000, 7},
                        {3 * 4 * 40, 4 * 40, 7 * 40, 13},
                        {10007, 331, 1000, uint64_t{1} << 33},
                        {600, 100, 100, 3},
                        {50, 100, 300, 5}};
  for (const Case& c : cases) {
    const auto x = uniform(c.n, 53, 0.5f, 2.0f);
    for (DT t : kTypes) {
      const std::string what = fmt::format("strided dropout {} n {} row {} stride {} offset {}",
                                           name(t), c.n, c.row, c.row_stride, c.offset);
      const auto xt = rounded(t, x);
      std::vector<float> cpu(c.n);
      kh::dropout_strided(xt.data(), cpu.data(), c.n, 0.3f, seed, stream, c.offset, c.row,
                          c.row_stride);
      Typed gx(t, xt), gy(t, c.n);
      kc::dropout_strided_t(t, gx.get(), gy.get(), c.n, 0.3f, seed, stream, c.offset, c.row,
                            c.row_stride);
      const auto h = gy.host();
      int64_t mismatched = 0;
      for (int64_t i = 0; i < c.n; ++i) mismatched += (h[i] == 0.0f) != (cpu[i] == 0.0f);
      EXPECT_EQ(mismatched, 0) << what;
      expect_close(h, rounded(t, cpu), tol(t), what);
    }
  }
}

// ops::dropout_fwd/bwd with a strided key on GPU tensors against the same ops on the CPU.
TEST_F(CudaTyped, StridedDropoutOpEqualsTheCpuOp) {
  const auto x = uniform(4 * 3 * 10, 54, 0.5f, 2.0f);
  ops::RngKey k{11, 12, 500};
  k.row = 3 * 10;
  k.row_stride = 8 * 10;
  for (DType d : {DType::F32, DType::BF16, DType::F16}) {
    const Tensor cpu_x = Tensor::from_vector(x, {4, 3, 10}).to(d);
    const Tensor gpu_x = cpu_x.to(Device::cuda());
    for (bool fwd : {true, false}) {
      const Tensor c = fwd ? ops::dropout_fwd(cpu_x, 0.25f, k) : ops::dropout_bwd(cpu_x, 0.25f, k);
      const Tensor g = fwd ? ops::dropout_fwd(gpu_x, 0.25f, k) : ops::dropout_bwd(gpu_x, 0.25f, k);
      EXPECT_EQ(g.dtype(), d);
      EXPECT_EQ(g.to_vector(), c.to_vector()) << dtype_name(d) << (fwd ? " fwd" : " bwd");
    }
  }
}

// --- copy_tokens_
// -------------------------------------------------------------------------------------

TEST_F(CudaTyped, CopyTokensEqualsTheCpu) {
  for (DType d : {DType::F32, DType::BF16, DType::F16, DType::I32}) {
    const Shape ds{5, 9, 6}, ss{5, 4, 6};
    const auto dv = uniform(shape_numel(ds), 55, -100.0f, 100.0f);
    const auto sv = uniform(shape_numel(ss), 56, -100.0f, 100.0f);
    auto make = [&](const std::vector<float>& v, const Shape& s) {
      if (d != DType::I32) return Tensor::from_vector(v, s).to(d);
      std::vector<int32_t> iv(v.begin(), v.end());
      return Tensor::from_vector(iv, s);
    };
    auto host = [](const Tensor& t) {
      const Tensor h = t.to(Device::cpu());
      if (h.dtype() != DType::I32) return h.to_vector();
      const int32_t* p = h.data<int32_t>();
      return std::vector<float>(p, p + h.numel());
    };
    // Whole tensors and views narrowed along dim 0 (an element offset).
    for (bool view : {false, true}) {
      Tensor cd = make(dv, ds), gd_all = cd.to(Device::cuda());
      const Tensor cs = make(sv, ss), gs_all = cs.to(Device::cuda());
      Tensor cdv = view ? cd.narrow(1, 3) : cd, gd = view ? gd_all.narrow(1, 3) : gd_all;
      const Tensor csv = view ? cs.narrow(2, 3) : cs, gs = view ? gs_all.narrow(2, 3) : gs_all;
      ops::copy_tokens_(cdv, 5, csv, 1, 3);
      ops::copy_tokens_(gd, 5, gs, 1, 3);
      kc::synchronize();
      EXPECT_EQ(host(gd_all), host(cd)) << dtype_name(d) << (view ? " view" : "");
    }
  }
  // Mixed devices are an error.
  Tensor d = Tensor::zeros({2, 3, 4}, DType::F32, Device::cuda());
  try {
    ops::copy_tokens_(d, 0, Tensor::zeros({2, 3, 4}), 0, 1);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("[copy_tokens]", 0), 0u) << e.what();
  }
}

// --- embedding
// -------------------------------------------------------------------------------------

// Widths and patch sizes that take the 4-element kernels (d = 40, p = 16) and that do not (d = 42,
// p = 6 on a 42-pixel-wide image): every path against the host kernels.
TEST_F(CudaTyped, Embedding) {
  struct Shape {
    int64_t ww, p, d, index;
  };
  for (const Shape sh : {Shape{48, 16, 40, 0}, Shape{42, 6, 42, 2}}) {
    const int64_t b = 3, c = 3, hh = 32 / sh.p * sh.p, ww = sh.ww, p = sh.p, d = sh.d;
    const int64_t np = (hh / p) * (ww / p);
    const auto img = uniform(b * c * hh * ww, 61);
    std::vector<float> patches(b * np * c * p * p);
    kh::patchify(img.data(), patches.data(), b, c, hh, ww, p);
    Typed gimg(DT::F32, img);
    const auto cls = uniform(d, 62), pos = uniform((np + 1) * d, 63);
    Typed gcls(DT::F32, cls), gpos(DT::F32, pos);
    for (DT t : kTypes) {
      Typed gp(t, patches.size());
      kc::patchify_t(gimg.f32(), t, gp.get(), b, c, hh, ww, p);
      expect_close(gp.host(), rounded(t, patches), tol(t), "patchify " + name(t));
      EXPECT_EQ(gp.host(), rounded(t, patches)) << "patchify rounds each pixel once";

      const auto tokens = rounded(t, uniform(b * np * d, 64));
      std::vector<float> out(b * (np + 1) * d);
      kh::cls_pos_fwd(tokens.data(), cls.data(), pos.data(), out.data(), b, np, d);
      Typed gt(t, tokens), gout(DT::F32, out.size());
      kc::cls_pos_fwd_t(t, gt.get(), gcls.f32(), gpos.f32(), gout.f32(), b, np, d);
      expect_close(gout.host(), out, 1e-5, "cls_pos fwd tokens " + name(t));

      const auto dout = uniform(out.size(), 65);
      std::vector<float> dtok(b * np * d), dcls = uniform(d, 66), dpos = uniform((np + 1) * d, 67);
      Typed gdcls(DT::F32, dcls), gdpos(DT::F32, dpos), gdout(DT::F32, dout), gdtok(t, dtok.size());
      kh::cls_pos_bwd(dout.data(), dtok.data(), dcls.data(), dpos.data(), b, np, d);
      kc::cls_pos_bwd_t(gdout.f32(), t, gdtok.get(), gdcls.f32(), gdpos.f32(), b, np, d);
      expect_close(gdtok.host(), rounded(t, dtok), tol(t), "cls_pos bwd dtokens " + name(t));
      expect_close(gdcls.host(), dcls, 1e-5, "cls_pos bwd dcls (accumulated) " + name(t));
      expect_close(gdpos.host(), dpos, 1e-5, "cls_pos bwd dpos (accumulated) " + name(t));

      const int64_t n = np + 1, index = sh.index;
      const auto xs = rounded(t, uniform(b * n * d, 68));
      std::vector<float> sel(b * d), dsel = rounded(t, uniform(b * d, 69)), dxs(b * n * d);
      kh::select_token_fwd(xs.data(), sel.data(), b, n, d, index);
      kh::select_token_bwd(dsel.data(), dxs.data(), b, n, d, index);
      Typed gxs(t, xs), gsel(t, sel.size()), gdsel(t, dsel), gdxs(t, dxs.size());
      kc::select_token_fwd_t(t, gxs.get(), gsel.get(), b, n, d, index);
      kc::select_token_bwd_t(t, gdsel.get(), gdxs.get(), b, n, d, index);
      expect_close(gsel.host(), sel, tol(t), "select_token fwd " + name(t));
      expect_close(gdxs.host(), dxs, tol(t), "select_token bwd " + name(t));
      EXPECT_THROW(kc::select_token_fwd_t(t, gxs.get(), gsel.get(), b, n, d, n), Error);
    }
  }
}

// --- elementwise
// -----------------------------------------------------------------------------------

TEST_F(CudaTyped, CastRoundsAsTheHost) {
  // Random values over many binades, ties, specials, subnormals of both half types.
  std::vector<float> v = uniform(100003, 71, -3e4f, 3e4f);
  const auto small = uniform(1000, 72, -1e-3f, 1e-3f);
  v.insert(v.end(), small.begin(), small.end());
  const float inf = std::numeric_limits<float>::infinity();
  for (float s : {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(),
                  -std::numeric_limits<float>::quiet_NaN(), 65504.0f, 65520.0f, 65519.0f,
                  std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::denorm_min(), 1e-40f, 5.9604645e-8f, 2.98e-8f,
                  1.0f + 1.0f / 256, 1.0f + 3.0f / 256, 1.0f + 1.0f / 2048, 3.0e38f})
    v.push_back(s);
  const int64_t n = static_cast<int64_t>(v.size());
  Typed src(DT::F32, v);
  for (int shift : {0, 1}) {
    const float* s = src.f32() + shift;
    const int64_t len = n - shift;
    Buf b16(len * 2), h16(len * 2);
    kc::cast(DT::F32, s, DT::BF16, b16.get(), len);
    kc::cast(DT::F32, s, DT::F16, h16.get(), len);
    std::vector<uint16_t> bb(len), hb(len);
    kc::copy_d2h(bb.data(), b16.get(), len * 2);
    kc::copy_d2h(hb.data(), h16.get(), len * 2);
    int64_t bad_bf16 = 0, bad_fp16 = 0;
    for (int64_t i = 0; i < len; ++i) {
      const float f = v[i + shift];
      bad_bf16 += bb[i] != float_to_bf16(f);
      // NaN: any NaN (the payload of CUDA's conversion is its own).
      bad_fp16 += std::isnan(f) ? !std::isnan(fp16_to_float(hb[i])) : hb[i] != float_to_fp16(f);
    }
    EXPECT_EQ(bad_bf16, 0) << "fp32 -> bf16 bits, shift " << shift;
    EXPECT_EQ(bad_fp16, 0) << "fp32 -> fp16 bits, shift " << shift;
    // Back to fp32 exactly, and between the half types through fp32.
    Typed back_b(DT::F32, len), back_h(DT::F32, len);
    kc::cast(DT::BF16, b16.get(), DT::F32, back_b.get(), len);
    kc::cast(DT::F16, h16.get(), DT::F32, back_h.get(), len);
    const auto fb = back_b.host(), fh = back_h.host();
    int64_t bad_back = 0;
    for (int64_t i = 0; i < len; ++i) {
      const float eb = bf16_to_float(bb[i]), eh = fp16_to_float(hb[i]);
      bad_back += std::isnan(eb) ? !std::isnan(fb[i]) : std::memcmp(&fb[i], &eb, 4) != 0;
      bad_back += std::isnan(eh) ? !std::isnan(fh[i]) : std::memcmp(&fh[i], &eh, 4) != 0;
    }
    EXPECT_EQ(bad_back, 0) << "half -> fp32, shift " << shift;
    Buf b2h(len * 2);
    kc::cast(DT::BF16, b16.get(), DT::F16, b2h.get(), len);
    std::vector<uint16_t> b2hh(len);
    kc::copy_d2h(b2hh.data(), b2h.get(), len * 2);
    int64_t bad_cross = 0;
    for (int64_t i = 0; i < len; ++i) {
      const float f = bf16_to_float(bb[i]);
      if (!std::isnan(f)) bad_cross += b2hh[i] != float_to_fp16(f);
    }
    EXPECT_EQ(bad_cross, 0) << "bf16 -> fp16, shift " << shift;
    // Same type: a copy.
    Typed same(DT::F32, len);
    kc::cast(DT::F32, s, DT::F32, same.get(), len);
    const auto hs = same.host();
    EXPECT_EQ(std::memcmp(hs.data(), v.data() + shift, len * 4), 0);
  }
  std::printf("  cast: %lld values, fp32->bf16 / fp32->fp16 / back / bf16->fp16 bit-exact\n",
              static_cast<long long>(n));
}

TEST_F(CudaTyped, AddAndAxpy) {
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{100003}}) {
    for (DT at : kTypes) {
      for (DT bt : kTypes) {
        for (DT yt : kTypes) {
          const auto a = rounded(at, uniform(n, 81)), b = rounded(bt, uniform(n, 82));
          std::vector<float> y(n);
          kh::add(a.data(), b.data(), y.data(), n);
          Typed ga(at, a), gb(bt, b), gy(yt, n);
          kc::add_t(at, ga.get(), bt, gb.get(), yt, gy.get(), n);
          const auto h = gy.host();
          const std::string tag =
              fmt::format("add n {} {} + {} -> {}", n, name(at), name(bt), name(yt));
          const auto want = rounded(yt, y);
          if (n > 1000) expect_close(h, want, tol(yt), tag);
          // The fp32 sum rounded once: exactly the host's rounding of the fp32 sum.
          int64_t wrong = 0;
          for (int64_t i = 0; i < n; ++i) wrong += h[i] != want[i];
          EXPECT_EQ(wrong, 0) << tag;
        }
      }
    }
    for (DT xt : kTypes) {
      const auto x = rounded(xt, uniform(n, 83));
      auto y = uniform(n, 84);
      Typed gx(xt, x), gy(DT::F32, y);
      kh::axpy(-0.37f, x.data(), y.data(), n);
      kc::axpy_t(-0.37f, xt, gx.get(), gy.f32(), n);
      expect_close(gy.host(), y, 1e-6, fmt::format("axpy n {} x {}", n, name(xt)));
    }
  }
  // Misaligned operands (the scalar path).
  const int64_t n = 1001;
  const auto a = rounded(DT::BF16, uniform(n + 1, 85)), b = uniform(n + 1, 86);
  Typed ga(DT::BF16, a), gb(DT::F32, b), gy(DT::F32, n + 1);
  kc::add_t(DT::BF16, ga.buf.as<uint16_t>() + 1, DT::F32, gb.f32() + 1, DT::F32, gy.f32() + 1, n);
  const auto h = gy.host();
  for (int64_t i = 1; i <= n; ++i) ASSERT_EQ(h[i], a[i] + b[i]) << i;
}

TEST_F(CudaTyped, CountNonfinite) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  for (int64_t n : {int64_t{1}, int64_t{6}, int64_t{1} << 20, (int64_t{1} << 20) + 3}) {
    for (int shift : {0, 1}) {
      auto v = uniform(n + shift, 91, -1e30f, 1e30f);
      int64_t planted = 0;
      if (n == 1) {
        v[shift] = nan, planted = 1;
      } else {
        for (int64_t i : {int64_t{0}, n / 3, n / 2, n - 1}) {
          v[shift + i] = i % 2 ? -inf : (i == n / 2 ? nan : inf);
          ++planted;
        }
        v[shift + 1] = std::numeric_limits<float>::max();  // large but finite
      }
      Typed g(DT::F32, v);
      EXPECT_EQ(kc::count_nonfinite(g.f32() + shift, n), planted)
          << "n " << n << " shift " << shift;
    }
  }
  Typed clean(DT::F32, uniform(4096, 92));
  EXPECT_EQ(kc::count_nonfinite(clean.f32(), 4096), 0);
  EXPECT_EQ(kc::count_nonfinite(clean.f32(), 0), 0);
}

// --- multi-tensor optimizers
// -----------------------------------------------------------------------

namespace {
// Tensors p, g, m, v on the device; `shift` puts tensor 2 one float into its buffers (misaligned:
// the scalar path of the multi-tensor kernels).
struct DeviceParams {
  std::vector<int64_t> n;
  std::vector<float> wd;
  std::vector<std::unique_ptr<Typed>> p, g, m, v;
  std::vector<float*> pp, mp, vp;
  std::vector<const float*> gp;
  DeviceParams(const std::vector<int64_t>& sizes, const std::vector<float>& decays, unsigned seed,
               bool misaligned)
      : n(sizes), wd(decays) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      const int sh = misaligned && i == 2 ? 1 : 0;
      const size_t len = sizes[i] + sh;
      p.push_back(std::make_unique<Typed>(DT::F32, uniform(len, seed + 10 * i)));
      g.push_back(std::make_unique<Typed>(DT::F32, uniform(len, seed + 10 * i + 1)));
      auto mv = uniform(len, seed + 10 * i + 2);
      for (float& e : mv) e *= 0.1f;
      m.push_back(std::make_unique<Typed>(DT::F32, mv));
      v.push_back(std::make_unique<Typed>(DT::F32, uniform(len, seed + 10 * i + 3, 0.0f, 0.01f)));
      pp.push_back(p.back()->f32() + sh);
      gp.push_back(g.back()->f32() + sh);
      mp.push_back(m.back()->f32() + sh);
      vp.push_back(v.back()->f32() + sh);
    }
  }
  void new_grads(unsigned seed) {
    for (size_t i = 0; i < n.size(); ++i) {
      const auto x = uniform(g[i]->n, seed + i);
      kc::copy_h2d(g[i]->get(), x.data(), x.size() * 4);
    }
  }
  int count() const { return static_cast<int>(n.size()); }
};

const std::vector<int64_t> kOptSizes = {1, 3, 1000, 70000, 0, 40000};
const std::vector<float> kOptDecays = {0.05f, 0.0f, 0.05f, 0.1f, 0.05f, 0.0f};
}  // namespace

TEST_F(CudaTyped, MultiTensorAdamMatchesPerTensorKernel) {
  const float grad_scale = 0.5f;
  for (bool decoupled : {true, false}) {
    for (bool misaligned : {false, true}) {
      DeviceParams multi(kOptSizes, kOptDecays, 100, misaligned);
      DeviceParams ref(kOptSizes, kOptDecays, 100, misaligned);
      for (int64_t step = 1; step <= 2; ++step) {
        multi.new_grads(500 + step);
        ref.new_grads(500 + step);
        kc::multi_tensor_adam(multi.count(), multi.pp.data(), multi.gp.data(), multi.mp.data(),
                              multi.vp.data(), multi.n.data(), multi.wd.data(), 1e-3f, 0.9f, 0.999f,
                              1e-8f, step, decoupled, grad_scale);
        for (int i = 0; i < ref.count(); ++i) {
          Buf gs(std::max<int64_t>(ref.n[i], 1) * 4);
          if (ref.n[i] == 0) continue;
          kc::copy_d2d(gs.get(), ref.gp[i], ref.n[i] * 4);
          kc::scale(grad_scale, gs.as<float>(), ref.n[i]);
          kc::adam_step(ref.pp[i], gs.as<float>(), ref.mp[i], ref.vp[i], ref.n[i], 1e-3f, 0.9f,
                        0.999f, 1e-8f, ref.wd[i], step, decoupled);
        }
      }
      for (int i = 0; i < ref.count(); ++i) {
        if (ref.n[i] == 0) continue;
        const std::string tag =
            fmt::format("multi_tensor_adam {} n {}{}", decoupled ? "adamw" : "adam", ref.n[i],
                        misaligned && i == 2 ? " misaligned" : "");
        expect_close(multi.p[i]->host(), ref.p[i]->host(), 1e-6, tag + " p");
        expect_close(multi.m[i]->host(), ref.m[i]->host(), 1e-6, tag + " m");
        expect_close(multi.v[i]->host(), ref.v[i]->host(), 1e-6, tag + " v");
      }
      // The step moved the parameters (against the initial values).
      DeviceParams init(kOptSizes, kOptDecays, 100, misaligned);
      EXPECT_GT(rel_err(multi.p[3]->host(), init.p[3]->host()), 1e-4);
    }
  }
}

TEST_F(CudaTyped, MultiTensorLambMatchesPerTensorKernels) {
  const float grad_scale = 0.5f, lr = 1e-2f;
  for (bool misaligned : {false, true}) {
    DeviceParams multi(kOptSizes, kOptDecays, 300, misaligned);
    DeviceParams ref(kOptSizes, kOptDecays, 300, misaligned);
    for (int64_t step = 1; step <= 2; ++step) {
      multi.new_grads(700 + step);
      ref.new_grads(700 + step);
      kc::multi_tensor_lamb(multi.count(), multi.pp.data(), multi.gp.data(), multi.mp.data(),
                            multi.vp.data(), multi.n.data(), multi.wd.data(), lr, 0.9f, 0.999f,
                            1e-6f, step, grad_scale);
      // Lamb::update per tensor: lamb_update, trust = ‖p‖/‖u‖ with weight decay, p += −lr·trust·u.
      for (int i = 0; i < ref.count(); ++i) {
        const int64_t n = ref.n[i];
        if (n == 0) continue;
        Buf gs(n * 4), u(n * 4);
        kc::copy_d2d(gs.get(), ref.gp[i], n * 4);
        kc::scale(grad_scale, gs.as<float>(), n);
        kc::lamb_update(ref.pp[i], gs.as<float>(), ref.mp[i], ref.vp[i], u.as<float>(), n, 0.9f,
                        0.999f, 1e-6f, ref.wd[i], step);
        double trust = 1.0;
        if (ref.wd[i] != 0) {
          const double w = std::sqrt(kc::sum_squares(ref.pp[i], n));
          const double un = std::sqrt(kc::sum_squares(u.as<float>(), n));
          if (w > 0 && un > 0) trust = w / un;
        }
        kc::axpy(static_cast<float>(-static_cast<double>(lr) * trust), u.as<float>(), ref.pp[i], n);
      }
    }
    for (int i = 0; i < ref.count(); ++i) {
      if (ref.n[i] == 0) continue;
      const std::string tag = fmt::format("multi_tensor_lamb n {} wd {}{}", ref.n[i], ref.wd[i],
                                          misaligned && i == 2 ? " misaligned" : "");
      expect_close(multi.p[i]->host(), ref.p[i]->host(), 1e-6, tag + " p");
      expect_close(multi.m[i]->host(), ref.m[i]->host(), 1e-6, tag + " m");
      expect_close(multi.v[i]->host(), ref.v[i]->host(), 1e-6, tag + " v");
    }
    DeviceParams init(kOptSizes, kOptDecays, 300, misaligned);
    EXPECT_GT(rel_err(multi.p[3]->host(), init.p[3]->host()), 1e-3);
  }
}

TEST_F(CudaTyped, MultiTensorMatchesTheCpuTwin) {
  // The CUDA and CPU multi-tensor updates on the same data (AdamW and LAMB, one step).
  for (bool lamb : {false, true}) {
    DeviceParams dev(kOptSizes, kOptDecays, 900, false);
    std::vector<std::vector<float>> p, g, m, v;
    for (int i = 0; i < dev.count(); ++i) {
      p.push_back(dev.p[i]->host()), g.push_back(dev.g[i]->host());
      m.push_back(dev.m[i]->host()), v.push_back(dev.v[i]->host());
    }
    std::vector<float*> pp, mp, vp;
    std::vector<const float*> gp;
    for (int i = 0; i < dev.count(); ++i)
      pp.push_back(p[i].data()), gp.push_back(g[i].data()), mp.push_back(m[i].data()),
          vp.push_back(v[i].data());
    if (lamb) {
      kc::multi_tensor_lamb(dev.count(), dev.pp.data(), dev.gp.data(), dev.mp.data(), dev.vp.data(),
                            dev.n.data(), dev.wd.data(), 1e-2f, 0.9f, 0.999f, 1e-6f, 3, 0.25f);
      kh::multi_tensor_lamb(dev.count(), pp.data(), gp.data(), mp.data(), vp.data(), dev.n.data(),
                            dev.wd.data(), 1e-2f, 0.9f, 0.999f, 1e-6f, 3, 0.25f);
    } else {
      kc::multi_tensor_adam(dev.count(), dev.pp.data(), dev.gp.data(), dev.mp.data(), dev.vp.data(),
                            dev.n.data(), dev.wd.data(), 1e-3f, 0.9f, 0.999f, 1e-8f, 3, true,
                            0.25f);
      kh::multi_tensor_adam(dev.count(), pp.data(), gp.data(), mp.data(), vp.data(), dev.n.data(),
                            dev.wd.data(), 1e-3f, 0.9f, 0.999f, 1e-8f, 3, true, 0.25f);
    }
    for (int i = 0; i < dev.count(); ++i) {
      if (dev.n[i] == 0) continue;
      expect_close(
          dev.p[i]->host(), p[i], 1e-6,
          fmt::format("multi_tensor_{} cuda vs cpu n {} p", lamb ? "lamb" : "adam", dev.n[i]));
    }
  }
}

// --- timings (printed, not asserted)
// ---------------------------------------------------------------

namespace {
// Mean milliseconds of f over `iters` runs after two warm-up runs, by CUDA events (a build
// without CUDA has no runtime to link: it skips before timing anything).
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
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) f();
  kc::synchronize();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
         iters;
#endif
}
void report(const std::string& what, double ms, double bytes) {
  std::printf("  TIMING %-52s %9.1f us  %7.0f GB/s\n", what.c_str(), ms * 1e3, bytes / ms * 1e-6);
}
}  // namespace

TEST_F(CudaTyped, Timings) {
  const int64_t m = 256 * 197, d = 768;
  {
    Typed x(DT::F32, uniform(m * d, 1)), y(DT::BF16, m * d), g(DT::F32, uniform(d, 2)),
        b(DT::F32, uniform(d, 3)), mean(DT::F32, m), rstd(DT::F32, m), y32(DT::F32, m * d);
    report(fmt::format("layernorm_fwd_t fp32->bf16 {}x{}", m, d), time_ms([&] {
             kc::layernorm_fwd_t(DT::F32, x.get(), g.f32(), b.f32(), DT::BF16, y.get(), mean.f32(),
                                 rstd.f32(), m, d, 1e-6f);
           }),
           m * d * 6.0 + m * 8.0);
    report(fmt::format("layernorm_fwd (fp32 entry point) {}x{}", m, d), time_ms([&] {
             kc::layernorm_fwd(x.f32(), g.f32(), b.f32(), y32.f32(), mean.f32(), rstd.f32(), m, d,
                               1e-6f);
           }),
           m * d * 8.0 + m * 8.0);
    Typed dy(DT::BF16, uniform(m * d, 4)), dx(DT::F32, m * d), dxb(DT::BF16, m * d), dg(DT::F32, d),
        db(DT::F32, d), xb(DT::BF16, uniform(m * d, 5));
    report(fmt::format("layernorm_bwd_t x fp32 dy bf16 dx fp32 {}x{}", m, d), time_ms([&] {
             kc::layernorm_bwd_t(DT::F32, x.get(), g.f32(), mean.f32(), rstd.f32(), DT::BF16,
                                 dy.get(), DT::F32, dx.get(), dg.f32(), db.f32(), m, d);
           }),
           m * d * 10.0 + m * 8.0);
    report(fmt::format("layernorm_bwd_t x bf16 dy bf16 dx bf16 {}x{}", m, d), time_ms([&] {
             kc::layernorm_bwd_t(DT::BF16, xb.get(), g.f32(), mean.f32(), rstd.f32(), DT::BF16,
                                 dy.get(), DT::BF16, dxb.get(), dg.f32(), db.f32(), m, d);
           }),
           m * d * 6.0 + m * 8.0);
    report(fmt::format("layernorm_bwd (fp32 entry point) {}x{}", m, d), time_ms([&] {
             kc::layernorm_bwd(x.f32(), g.f32(), mean.f32(), rstd.f32(), y32.f32(), dx.f32(),
                               dg.f32(), db.f32(), m, d);
           }),
           m * d * 12.0 + m * 8.0);
    report(fmt::format("add_t fp32 + bf16 -> fp32 {}x{}", m, d), time_ms([&] {
             kc::add_t(DT::F32, x.get(), DT::BF16, dy.get(), DT::F32, dx.get(), m * d);
           }),
           m * d * 10.0);
    report(fmt::format("add_t bf16 + bf16 -> bf16 {}x{}", m, d), time_ms([&] {
             kc::add_t(DT::BF16, xb.get(), DT::BF16, dy.get(), DT::BF16, dxb.get(), m * d);
           }),
           m * d * 6.0);
    report(fmt::format("cast fp32 -> bf16 {}x{}", m, d),
           time_ms([&] { kc::cast(DT::F32, x.get(), DT::BF16, y.get(), m * d); }), m * d * 6.0);
    report(fmt::format("count_nonfinite fp32 {}x{}", m, d),
           time_ms([&] { kc::count_nonfinite(x.f32(), m * d); }), m * d * 4.0);
  }
  {
    const int64_t n = m * 3072;
    Typed x(DT::BF16, uniform(n, 6)), y(DT::BF16, n), dy(DT::BF16, uniform(n, 7));
    report(fmt::format("gelu_fwd_t bf16 {}x{}", m, 3072),
           time_ms([&] { kc::gelu_fwd_t(DT::BF16, x.get(), y.get(), n); }), n * 4.0);
    report(fmt::format("gelu_bwd_t bf16 {}x{}", m, 3072),
           time_ms([&] { kc::gelu_bwd_t(DT::BF16, x.get(), dy.get(), y.get(), n); }), n * 6.0);
    Typed db(DT::F32, 3072), y2(DT::BF16, n);
    report(fmt::format("gelu_bwd_bias_t bf16 {}x{}", m, 3072), time_ms([&] {
             kc::gelu_bwd_bias_t(DT::BF16, false, x.get(), dy.get(), y.get(), db.f32(), m, 3072);
           }),
           n * 6.0);
    report(fmt::format("gelu_bwd_bias_t bf16 with y {}x{}", m, 3072), time_ms([&] {
             kc::gelu_bwd_bias_t(DT::BF16, false, x.get(), dy.get(), y.get(), db.f32(), m, 3072,
                                 y2.get());
           }),
           n * 8.0);
  }
  {
    // The 152 parameter tensors of ViT-B/16 (timm vit_base_patch16_224, 1000 classes).
    std::vector<int64_t> sizes = {768 * 3 * 16 * 16, 768, 768, 197 * 768};
    for (int blk = 0; blk < 12; ++blk)
      for (int64_t s : {768, 768, 2304 * 768, 2304, 768 * 768, 768, 768, 768, 3072 * 768, 3072,
                        768 * 3072, 768})
        sizes.push_back(s);
    for (int64_t s : {768, 768, 1000 * 768, 1000}) sizes.push_back(s);
    ASSERT_EQ(sizes.size(), 152u);
    int64_t total = 0;
    for (int64_t s : sizes) total += s;
    std::vector<float> wd(sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) wd[i] = sizes[i] > 3072 ? 0.05f : 0.0f;
    // One slab per state, tensors back to back (as a flat parameter buffer would be).
    Buf p(total * 4), g(total * 4), mm(total * 4), vv(total * 4);
    kc::memset_zero(p.get(), total * 4), kc::memset_zero(g.get(), total * 4);
    kc::memset_zero(mm.get(), total * 4), kc::memset_zero(vv.get(), total * 4);
    std::vector<float*> pp, mp, vp;
    std::vector<const float*> gp;
    int64_t off = 0;
    for (int64_t s : sizes) {
      pp.push_back(p.as<float>() + off), gp.push_back(g.as<float>() + off);
      mp.push_back(mm.as<float>() + off), vp.push_back(vv.as<float>() + off);
      off += s;
    }
    int64_t step = 1;
    const double adam_bytes = total * 4.0 * 7;  // p, m, v read and written; g read
    report(fmt::format("multi_tensor_adam ViT-B/16 (152 tensors, {:.1f} M)", total * 1e-6),
           time_ms([&] {
             kc::multi_tensor_adam(152, pp.data(), gp.data(), mp.data(), vp.data(), sizes.data(),
                                   wd.data(), 1e-3f, 0.9f, 0.999f, 1e-8f, step++, true, 0.5f);
           }),
           adam_bytes);
    report("per-tensor adam_step x152 (same tensors)", time_ms([&] {
             for (size_t i = 0; i < sizes.size(); ++i)
               kc::adam_step(pp[i], gp[i], mp[i], vp[i], sizes[i], 1e-3f, 0.9f, 0.999f, 1e-8f,
                             wd[i], step, true);
             ++step;
           }),
           adam_bytes);
    step = 1;
    report("multi_tensor_lamb ViT-B/16 (2 passes)", time_ms([&] {
             kc::multi_tensor_lamb(152, pp.data(), gp.data(), mp.data(), vp.data(), sizes.data(),
                                   wd.data(), 1e-3f, 0.9f, 0.999f, 1e-6f, step++, 0.5f);
           }),
           total * 4.0 * 10);
  }
}
