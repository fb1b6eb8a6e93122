// The typed CUDA GEMM kernels against the CPU fp32 kernels: linear_fwd_t / linear_bwd_t on
// cuBLASLt (fp32, fp32 with TF32, bf16, fp16), linear_gelu_fwd_t / linear_bwd_dgelu_t (the GELU
// epilogues or their fallback; each case prints which ran) and attention_fwd_t / attention_bwd_t.
// Inputs are rounded to the half type on the host and the CPU kernel runs on the rounded values,
// so the error measured is the GPU's own: fp32 accumulation, half outputs. Norm-wise relative
// error bounds: fp32 1e-5, TF32 5e-3, bf16 1e-2, fp16 2e-3; every case prints what it measured.
// A disabled case (run with --gtest_also_run_disabled_tests) times the ViT-B/16 shapes.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cai/core/tensor.h"
#include "cuda_buffers.h"
#include "kernels/attention.h"
#include "kernels/device.h"
#include "kernels/linear.h"

#ifdef CAI_HAVE_CUDA
#include <cuda_runtime.h>
#endif
#include "kernels/gelu.h"

#ifdef CAI_HAVE_CUDA
namespace cai::kernels::cuda {
uint64_t lt_gelu_epilogue_runs();  // test hooks of kernels/cuda/blas.h (no cuBLAS headers here)
uint64_t lt_in_step_runs();
}  // namespace cai::kernels::cuda
#endif

using namespace cai;
using kernels::DT;
namespace kc = kernels::cuda;
using test::Buf;
using test::expect_close;
using test::random_values;
using test::round_to;
using test::rounded;

namespace {

class CudaGemm : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kc::device_count() == 0) GTEST_SKIP() << "no GPU: " << kc::runtime_info().device_error;
  }
};

double tolerance(DT t, bool tf32) {
  if (t == DT::F32) return tf32 ? 5e-3 : 1e-5;
  return t == DT::BF16 ? 1e-2 : 2e-3;
}

std::string type_name(DT t, bool tf32) {
  return t == DT::F32 && tf32 ? "tf32" : kernels::dt_name(t);
}

struct Mode {
  DT t;
  bool tf32;
};
const Mode kLinearModes[] = {
    {DT::F32, false}, {DT::F32, true}, {DT::BF16, false}, {DT::F16, false}};

struct LinearShape {
  int64_t m, k, n;
};
const LinearShape kLinearShapes[] = {{5, 7, 3}, {1, 1, 1}, {2 * 197, 768, 2304}};

std::string shape_name(const char* op, Mode md, const LinearShape& s) {
  return std::string(op) + " " + type_name(md.t, md.tf32) + " m=" + std::to_string(s.m) +
         " k=" + std::to_string(s.k) + " n=" + std::to_string(s.n);
}

}  // namespace

// y = x·wᵀ (+ b): without bias, with a bias in the input type, with bf16/fp16 inputs writing fp32
// (bias fp32), and with a bias at a 2-byte-aligned address (not the epilogue: y = b, y += x·wᵀ).
TEST_F(CudaGemm, LinearForward) {
  for (const Mode md : kLinearModes) {
    for (const LinearShape s : kLinearShapes) {
      const DT t = md.t;
      const auto x = random_values(s.m * s.k, 1, 1.0f, t), w = random_values(s.n * s.k, 2, 1.0f, t);
      const auto b32 = random_values(s.n + 1, 3, 1.0f, DT::F32);
      Buf gx(t, x), gw(t, w);
      struct Case {
        const char* name;
        bool bias;
        DT yt;
        bool odd_bias;
      };
      std::vector<Case> cases = {{"no bias", false, t, false}, {"bias", true, t, false}};
      if (t != DT::F32) cases.push_back({"bias, fp32 output", true, DT::F32, false});
      if (t == DT::BF16) cases.push_back({"bias at an odd address", true, t, true});
      for (const Case& c : cases) {
        // The bias lives in yt; an odd-address bias is element 1 of an n + 1 buffer.
        const auto bias_all = rounded(c.yt, b32);
        const std::vector<float> bias(bias_all.begin() + (c.odd_bias ? 1 : 0),
                                      bias_all.begin() + (c.odd_bias ? 1 : 0) + s.n);
        std::vector<float> ref(s.m * s.n);
        kernels::cpu::linear_fwd(x.data(), w.data(), c.bias ? bias.data() : nullptr, ref.data(),
                                 s.m, s.k, s.n);
        Buf gb(c.yt, bias_all), gy(c.yt, static_cast<size_t>(s.m * s.n));
        const char* bptr =
            static_cast<const char*>(gb.p) + (c.odd_bias ? kernels::dt_size(c.yt) : 0);
        kc::linear_fwd_t(t, gx.p, gw.p, c.bias ? bptr : nullptr, c.yt, gy.p, s.m, s.k, s.n,
                         md.tf32);
        // Half inputs, fp32 output: exact products, fp32 sums (a half output would be ~1e-3).
        const double tol = c.yt == DT::F32 && t != DT::F32 ? 1e-4 : tolerance(t, md.tf32);
        expect_close(gy.download(), ref, tol, shape_name("linear_fwd", md, s) + " " + c.name);
      }
    }
  }
}

// k = 0: nothing to sum, y is the bias on every row (or zeros).
TEST_F(CudaGemm, LinearForwardEmptyK) {
  for (DT t : {DT::F32, DT::BF16, DT::F16}) {
    const auto b = random_values(3, 3, 1.0f, t);
    Buf gb(t, b), gy(t, 4 * 3);
    gy.upload(std::vector<float>(12, 7.0f));
    kc::linear_fwd_t(t, nullptr, nullptr, gb.p, t, gy.p, 4, 0, 3);
    std::vector<float> ref(12);
    for (int i = 0; i < 12; ++i) ref[i] = b[i % 3];
    expect_close(gy.download(), ref, 0.0, std::string("linear_fwd k=0 ") + kernels::dt_name(t));
    kc::linear_fwd_t(t, nullptr, nullptr, nullptr, t, gy.p, 4, 0, 3);
    for (float v : gy.download()) EXPECT_EQ(v, 0.0f);
  }
}

// dx = dy·w (type t), dw += dyᵀ·x and db += Σ dy (fp32, onto non-zero values); then with dx
// null, and with only dx.
TEST_F(CudaGemm, LinearBackward) {
  for (const Mode md : kLinearModes) {
    for (const LinearShape s : kLinearShapes) {
      const DT t = md.t;
      const auto x = random_values(s.m * s.k, 1, 1.0f, t), w = random_values(s.n * s.k, 2, 1.0f, t);
      const auto dy = random_values(s.m * s.n, 4, 1.0f, t);
      const auto dw0 = random_values(s.n * s.k, 5, 1.0f, DT::F32);
      const auto db0 = random_values(s.n, 6, 1.0f, DT::F32);
      std::vector<float> dx_ref(s.m * s.k), dw_ref = dw0, db_ref = db0;
      kernels::cpu::linear_bwd(x.data(), w.data(), dy.data(), dx_ref.data(), dw_ref.data(),
                               db_ref.data(), s.m, s.k, s.n);
      Buf gx(t, x), gw(t, w), gdy(t, dy), gdx(t, dx_ref.size()), gdw(DT::F32, dw0),
          gdb(DT::F32, db0);
      // fp32 master gradients: exact products of the rounded inputs, fp32 sums (TF32 rounds).
      const double tol_w = t == DT::F32 ? tolerance(t, md.tf32) : 1e-4;
      const std::string name = shape_name("linear_bwd", md, s);
      kc::linear_bwd_t(t, gx.p, gw.p, gdy.p, gdx.p, static_cast<float*>(gdw.p),
                       static_cast<float*>(gdb.p), s.m, s.k, s.n, md.tf32);
      expect_close(gdx.download(), dx_ref, tolerance(t, md.tf32), name + " dx");
      expect_close(gdw.download(), dw_ref, tol_w, name + " dw (accumulated)");
      expect_close(gdb.download(), db_ref, tol_w, name + " db (accumulated)");

      // dx null: dw and db accumulate once more (on the GPU results).
      std::vector<float> dw2 = dw_ref, db2 = db_ref;
      for (size_t i = 0; i < dw2.size(); ++i) dw2[i] += dw_ref[i] - dw0[i];
      for (size_t i = 0; i < db2.size(); ++i) db2[i] += db_ref[i] - db0[i];
      gdx.upload(std::vector<float>(dx_ref.size(), 3.0f));
      kc::linear_bwd_t(t, gx.p, gw.p, gdy.p, nullptr, static_cast<float*>(gdw.p),
                       static_cast<float*>(gdb.p), s.m, s.k, s.n, md.tf32);
      expect_close(gdw.download(), dw2, tol_w, name + " dw, null dx");
      expect_close(gdb.download(), db2, tol_w, name + " db, null dx");
      for (float v : gdx.download()) ASSERT_EQ(v, 3.0f) << name << ": dx written when null";

      // Only dx.
      kc::linear_bwd_t(t, gx.p, gw.p, gdy.p, gdx.p, nullptr, nullptr, s.m, s.k, s.n, md.tf32);
      expect_close(gdx.download(), dx_ref, tolerance(t, md.tf32), name + " dx only");
    }
  }
}

// The algorithm timing's in-step stage: a shape's calls after the first each run one of its
// finalists in turn until each has been timed a few times. Every call computes the product (the
// forward, and a weight gradient accumulated call after call), during the stage and after it, and
// the stage ends: a shape's calls stop running finalists after at most 4 × 4 of them.
TEST_F(CudaGemm, InStepTimingEveryCallComputes) {
  const bool timing = kc::gemm_timing();
  kc::set_gemm_timing(true);
  const int64_t m = 1000, k = 768, n = 640;  // a shape no other case here runs
  const DT t = DT::BF16;
  const auto x = random_values(m * k, 11, 1.0f, t), w = random_values(n * k, 12, 1.0f, t);
  const auto dy = random_values(m * n, 13, 1.0f, t);
  const auto b = rounded(t, random_values(n, 14, 1.0f, DT::F32));
  std::vector<float> y_ref(m * n), dx_ref(m * k), dw_once(n * k, 0.0f);
  kernels::cpu::linear_fwd(x.data(), w.data(), b.data(), y_ref.data(), m, k, n);
  kernels::cpu::linear_bwd(x.data(), w.data(), dy.data(), dx_ref.data(), dw_once.data(), nullptr, m,
                           k, n);
  Buf gx(t, x), gw(t, w), gdy(t, dy), gb(t, b), gy(t, static_cast<size_t>(m * n)),
      gdx(t, static_cast<size_t>(m * k)), gdw(DT::F32, std::vector<float>(n * k, 0.0f));
  const uint64_t r0 = kc::lt_in_step_runs();
  uint64_t r1 = 0;
  for (int call = 1; call <= 30; ++call) {
    if (call == 21) r1 = kc::lt_in_step_runs();
    const std::string name = "call " + std::to_string(call);
    kc::linear_fwd_t(t, gx.p, gw.p, gb.p, t, gy.p, m, k, n);
    expect_close(gy.download(), y_ref, tolerance(t, false), name + " y");
    kc::linear_bwd_t(t, gx.p, gw.p, gdy.p, gdx.p, static_cast<float*>(gdw.p), nullptr, m, k, n);
    expect_close(gdx.download(), dx_ref, tolerance(t, false), name + " dx");
    std::vector<float> dw_ref = dw_once;
    for (float& v : dw_ref) v *= static_cast<float>(call);
    expect_close(gdw.download(), dw_ref, 1e-4,
                 name + " dw accumulated " + std::to_string(call) + " times");
  }
  const uint64_t r2 = kc::lt_in_step_runs();
  std::printf("in-step runs: %llu in the first 20 calls of each of 3 shapes, %llu after\n",
              static_cast<unsigned long long>(r1 - r0), static_cast<unsigned long long>(r2 - r1));
  EXPECT_LE(r1 - r0, 3u * 4u * 4u);
  EXPECT_EQ(r2, r1) << "the in-step stage did not end";
  kc::set_gemm_timing(timing);
}

// The SMs the GEMMs leave to other kernels (kc::set_gemm_sm_margin): a setting with or without
// CUDA, 0 or more; negative is refused and leaves it as it was.
TEST(GemmSmMargin, SettingAndRange) {
  const int was = kc::gemm_sm_margin();
  kc::set_gemm_sm_margin(16);
  EXPECT_EQ(kc::gemm_sm_margin(), 16);
  EXPECT_THROW(kc::set_gemm_sm_margin(-1), std::exception);
  EXPECT_EQ(kc::gemm_sm_margin(), 16);
  kc::set_gemm_sm_margin(was);
}

// With an SM margin the shapes get plans of their own (cuBLASLt's SM count target), which compute
// the same products: the forward and an accumulated weight gradient under a margin of 32 SMs.
TEST_F(CudaGemm, SmMarginPlansComputeTheSame) {
  const int was = kc::gemm_sm_margin();
  kc::set_gemm_sm_margin(32);
  const int64_t m = 1500, k = 768, n = 1024;
  const DT t = DT::BF16;
  const auto x = random_values(m * k, 21, 1.0f, t), w = random_values(n * k, 22, 1.0f, t);
  const auto dy = random_values(m * n, 23, 1.0f, t);
  std::vector<float> y_ref(m * n), dx_ref(m * k), dw_ref(n * k, 0.0f);
  kernels::cpu::linear_fwd(x.data(), w.data(), nullptr, y_ref.data(), m, k, n);
  kernels::cpu::linear_bwd(x.data(), w.data(), dy.data(), dx_ref.data(), dw_ref.data(), nullptr, m,
                           k, n);
  Buf gx(t, x), gw(t, w), gdy(t, dy), gy(t, static_cast<size_t>(m * n)),
      gdx(t, static_cast<size_t>(m * k)), gdw(DT::F32, std::vector<float>(n * k, 0.0f));
  kc::linear_fwd_t(t, gx.p, gw.p, nullptr, t, gy.p, m, k, n);
  kc::linear_bwd_t(t, gx.p, gw.p, gdy.p, gdx.p, static_cast<float*>(gdw.p), nullptr, m, k, n);
  kc::set_gemm_sm_margin(was);
  expect_close(gy.download(), y_ref, tolerance(t, false), "margin 32 y");
  expect_close(gdx.download(), dx_ref, tolerance(t, false), "margin 32 dx");
  expect_close(gdw.download(), dw_ref, 1e-4, "margin 32 dw");
}

// The fp32 entry points are the typed ones (t = F32, no TF32): ≤ 1e-5 on a tall dy whose column
// sum takes the chunked path (m > 1024 rows).
TEST_F(CudaGemm, LinearFp32WrappersTallColumnSum) {
  const int64_t m = 5000, k = 33, n = 70;
  const auto x = random_values(m * k, 1, 1.0f, DT::F32), w = random_values(n * k, 2, 1.0f, DT::F32);
  const auto b = random_values(n, 3, 1.0f, DT::F32), dy = random_values(m * n, 4, 1.0f, DT::F32);
  const auto dw0 = random_values(n * k, 5, 1.0f, DT::F32), db0 = random_values(n, 6, 1.0f, DT::F32);
  std::vector<float> y_ref(m * n), dx_ref(m * k), dw_ref = dw0, db_ref = db0;
  kernels::cpu::linear_fwd(x.data(), w.data(), b.data(), y_ref.data(), m, k, n);
  kernels::cpu::linear_bwd(x.data(), w.data(), dy.data(), dx_ref.data(), dw_ref.data(),
                           db_ref.data(), m, k, n);
  Buf gx(DT::F32, x), gw(DT::F32, w), gb(DT::F32, b), gdy(DT::F32, dy), gy(DT::F32, y_ref.size()),
      gdx(DT::F32, dx_ref.size()), gdw(DT::F32, dw0), gdb(DT::F32, db0);
  auto f = [](const Buf& bf) { return static_cast<float*>(bf.p); };
  kc::linear_fwd(f(gx), f(gw), f(gb), f(gy), m, k, n);
  kc::linear_bwd(f(gx), f(gw), f(gdy), f(gdx), f(gdw), f(gdb), m, k, n);
  expect_close(gy.download(), y_ref, 1e-5, "linear_fwd fp32 wrapper m=5000 k=33 n=70");
  expect_close(gdx.download(), dx_ref, 1e-5, "linear_bwd fp32 wrapper dx");
  expect_close(gdw.download(), dw_ref, 1e-5, "linear_bwd fp32 wrapper dw");
  expect_close(gdb.download(), db_ref, 1e-5, "linear_bwd fp32 wrapper db (chunked column sum)");
}

// The tanh GELU in double (the formula, not a CPU kernel): value and derivative.
double gelu_tanh_ref(double v) {
  const double c = std::sqrt(2.0 / 3.141592653589793);
  return 0.5 * v * (1.0 + std::tanh(c * (v + 0.044715 * v * v * v)));
}
double gelu_tanh_grad_ref(double v) {
  const double c = std::sqrt(2.0 / 3.141592653589793);
  const double th = std::tanh(c * (v + 0.044715 * v * v * v));
  return 0.5 * (1.0 + th) + 0.5 * v * (1.0 - th * th) * c * (1.0 + 3.0 * 0.044715 * v * v);
}

// Whether the last GEMM+GELU call ran cuBLASLt's epilogue (the hook counts epilogue runs).
const char* path_name(uint64_t before) {
#ifdef CAI_HAVE_CUDA
  return kc::lt_gelu_epilogue_runs() > before ? "fused" : "fallback";
#else
  (void)before;
  return "?";
#endif
}
uint64_t epilogue_runs() {
#ifdef CAI_HAVE_CUDA
  return kc::lt_gelu_epilogue_runs();
#else
  return 0;
#endif
}

// Shapes of the GELU linears: tiny (fallback), n = 20 (forward's aux ld not a multiple of 8:
// fallback; backward's k = 24 may fuse), k = 20 (the backward's fallback), ViT-B/16's MLP.
const LinearShape kGeluShapes[] = {{5, 7, 3}, {33, 24, 20}, {40, 20, 24}, {2 * 197, 768, 3072}};

// pre = x·wᵀ + b, y = gelu_tanh(pre) against cpu::linear_fwd + the formula in double. w is scaled
// by 2/√k so that pre spreads over GELU's curved part (|pre| ≲ 2).
TEST_F(CudaGemm, LinearGeluForward) {
  for (DT t : {DT::F32, DT::BF16, DT::F16}) {
    for (const LinearShape s : kGeluShapes) {
      const Mode md{t, false};
      const auto x = random_values(s.m * s.k, 21, 1.0f, t);
      const auto w = random_values(s.n * s.k, 22, 2.0f / std::sqrt(float(s.k)), t);
      const auto b = random_values(s.n, 23, 0.5f, t);
      std::vector<float> pre_ref(s.m * s.n), y_ref(s.m * s.n);
      kernels::cpu::linear_fwd(x.data(), w.data(), b.data(), pre_ref.data(), s.m, s.k, s.n);
      for (size_t i = 0; i < y_ref.size(); ++i)
        y_ref[i] = static_cast<float>(gelu_tanh_ref(pre_ref[i]));
      Buf gx(t, x), gw(t, w), gb(t, b), gpre(t, pre_ref.size()), gy(t, y_ref.size());
      const uint64_t before = epilogue_runs();
      kc::linear_gelu_fwd_t(t, gx.p, gw.p, gb.p, gpre.p, gy.p, s.m, s.k, s.n);
      const std::string name =
          shape_name("linear_gelu_fwd", md, s) + " (" + path_name(before) + ")";
      expect_close(gpre.download(), pre_ref, tolerance(t, false), name + " pre");
      expect_close(gy.download(), y_ref, tolerance(t, false), name + " y");
    }
  }
}

// The backward of the layer after the GELU: x = gelu_tanh(pre) (rounded to t), dpre =
// (dy·w) ∘ gelu_tanh'(pre), dw and db accumulated onto non-zero fp32 values, against
// cpu::linear_bwd + the formula in double.
TEST_F(CudaGemm, LinearBackwardDGelu) {
  for (DT t : {DT::F32, DT::BF16, DT::F16}) {
    for (const LinearShape s : kGeluShapes) {
      const Mode md{t, false};
      const auto pre = random_values(s.m * s.k, 31, 2.5f, t);
      std::vector<float> x(pre.size());
      for (size_t i = 0; i < x.size(); ++i)
        x[i] = round_to(t, static_cast<float>(gelu_tanh_ref(pre[i])));
      const auto w = random_values(s.n * s.k, 32, 1.0f, t);
      const auto dy = random_values(s.m * s.n, 33, 1.0f, t);
      const auto dw0 = random_values(s.n * s.k, 34, 1.0f, DT::F32);
      const auto db0 = random_values(s.n, 35, 1.0f, DT::F32);
      std::vector<float> dx(s.m * s.k), dw_ref = dw0, db_ref = db0, dpre_ref(s.m * s.k);
      kernels::cpu::linear_bwd(x.data(), w.data(), dy.data(), dx.data(), dw_ref.data(),
                               db_ref.data(), s.m, s.k, s.n);
      for (size_t i = 0; i < dpre_ref.size(); ++i)
        dpre_ref[i] = static_cast<float>(dx[i] * gelu_tanh_grad_ref(pre[i]));
      Buf gx(t, x), gw(t, w), gdy(t, dy), gpre(t, pre), gdpre(t, dpre_ref.size()),
          gdw(DT::F32, dw0), gdb(DT::F32, db0);
      gdpre.upload(std::vector<float>(dpre_ref.size(), 9.0f));  // overwritten
      const uint64_t before = epilogue_runs();
      kc::linear_bwd_dgelu_t(t, gx.p, gw.p, gdy.p, gpre.p, gdpre.p, static_cast<float*>(gdw.p),
                             static_cast<float*>(gdb.p), s.m, s.k, s.n);
      const std::string name =
          shape_name("linear_bwd_dgelu", md, s) + " (" + path_name(before) + ")";
      const double tol_w = t == DT::F32 ? 1e-5 : 1e-4;
      expect_close(gdpre.download(), dpre_ref, tolerance(t, false), name + " dpre");
      expect_close(gdw.download(), dw_ref, tol_w, name + " dw (accumulated)");
      expect_close(gdb.download(), db_ref, tol_w, name + " db (accumulated)");
    }
  }
}

// Forward (out, probs) and backward (dqkv, from the CPU's probs rounded to t) per type and shape:
// odd sizes, one token, ViT-B/16 (b 2), and rows longer than the register path (n > 1024).
TEST_F(CudaGemm, Attention) {
  struct Shape {
    int64_t b, n, h, hd;
  };
  const Shape shapes[] = {{1, 5, 2, 3},     {2, 7, 3, 5},    {3, 1, 2, 8},
                          {2, 197, 12, 64}, {1, 300, 2, 16}, {1, 1100, 1, 8}};
  for (DT t : {DT::BF16, DT::F16}) {
    for (const Shape s : shapes) {
      const std::string name = std::string("attention ") + kernels::dt_name(t) +
                               " b=" + std::to_string(s.b) + " n=" + std::to_string(s.n) +
                               " h=" + std::to_string(s.h) + " hd=" + std::to_string(s.hd);
      const int64_t d = s.h * s.hd, heads = s.b * s.h;
      const auto qkv = random_values(s.b * s.n * 3 * d, 11, 2.0f, t);
      const auto dout = random_values(s.b * s.n * d, 12, 1.0f, t);
      std::vector<float> out_ref(s.b * s.n * d), probs_ref(heads * s.n * s.n);
      kernels::cpu::attention_fwd(qkv.data(), out_ref.data(), probs_ref.data(), s.b, s.n, s.h,
                                  s.hd);
      Buf gqkv(t, qkv), gout(t, out_ref.size()), gprobs(t, probs_ref.size());
      kc::attention_fwd_t(t, gqkv.p, gout.p, gprobs.p, s.b, s.n, s.h, s.hd);
      expect_close(gout.download(), out_ref, tolerance(t, false), name + " out");
      expect_close(gprobs.download(), probs_ref, tolerance(t, false), name + " probs");

      const auto probs_t = rounded(t, probs_ref);
      std::vector<float> dqkv_ref(qkv.size());
      kernels::cpu::attention_bwd(qkv.data(), probs_t.data(), dout.data(), dqkv_ref.data(), s.b,
                                  s.n, s.h, s.hd);
      Buf gp(t, probs_t), gdout(t, dout), gdqkv(t, qkv.size());
      gdqkv.upload(std::vector<float>(qkv.size(), 5.0f));  // overwritten, not accumulated
      kc::attention_bwd_t(t, gqkv.p, gp.p, gdout.p, gdqkv.p, s.b, s.n, s.h, s.hd);
      if (s.n == 1) {  // one token: dQ = dK = 0 (softmax of one score), dV = dout
        const auto got = gdqkv.download();
        for (int64_t r = 0; r < s.b; ++r)
          for (int64_t j = 0; j < 2 * d; ++j) ASSERT_EQ(got[r * 3 * d + j], 0.0f) << name;
      }
      expect_close(gdqkv.download(), dqkv_ref, tolerance(t, false), name + " dqkv");
    }
  }
}

#ifdef CAI_HAVE_CUDA
// Not a check: times the MLP's memory-bound kernels on the ViT-B/16 (batch 256) and ViT-L/16
// (batch 128) shapes in bf16 and prints the bytes they move per second, beside a device-to-device
// copy of as many bytes (read + write) as a reference.
TEST_F(CudaGemm, DISABLED_ElementwiseTiming) {
  const auto fill = [](Buf& b) { test::fill_bf16_pattern(b); };
  test::EventTimer timer;
  const DT t = DT::BF16;
  struct Shape {
    const char* name;
    int64_t m, d, hidden;
  };
  for (const Shape sh : {Shape{"B/16", 50432, 768, 3072}, Shape{"L/16", 25216, 1024, 4096}}) {
    const int64_t m = sh.m, n = sh.hidden, e = m * n;
    Buf pre(t, e), y(t, e), dy(t, e), dpre(t, e), db(DT::F32, n), src(t, 2 * e), dst(t, 2 * e);
    fill(pre), fill(dy), fill(src);
    kc::memset_zero(db.p, n * 4);
    const double bytes = 2.0 * static_cast<double>(e);  // one bf16 matrix [m, hidden]
    const auto report = [&](const char* what, double ms, double matrices) {
      std::printf("TIMING %s %-34s %8.1f us  %5.2f TB/s\n", sh.name, what, ms * 1e3,
                  matrices * bytes / (ms * 1e-3) * 1e-12);
    };
    report(
        "copy (read + write 2 matrices)",
        timer.ms(20, [&] { cudaMemcpyAsync(dst.p, src.p, 2 * bytes, cudaMemcpyDeviceToDevice); }),
        4);
    report("gelu_fwd_t", timer.ms(20, [&] { kc::gelu_fwd_t(t, pre.p, y.p, e); }), 2);
    report("gelu_bwd_bias_t (erf)",
           timer.ms(20,
                    [&] {
                      kc::gelu_bwd_bias_t(t, false, pre.p, dy.p, dpre.p, static_cast<float*>(db.p),
                                          m, n);
                    }),
           3);
    report("gelu_bwd_bias_t (erf) + y again",
           timer.ms(20,
                    [&] {
                      kc::gelu_bwd_bias_t(t, false, pre.p, dy.p, dpre.p, static_cast<float*>(db.p),
                                          m, n, y.p);
                    }),
           4);
    report("column_sum_t [m, d]",
           timer.ms(20, [&] { kc::column_sum_t(t, dy.p, static_cast<float*>(db.p), m, sh.d); }),
           static_cast<double>(sh.d) / n);
  }
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
}

// Not a check: times the ViT-B/16 shapes (bf16) and prints the TFLOP/s reached.
TEST_F(CudaGemm, DISABLED_Timing) {
  const auto fill = [](Buf& b) { test::fill_bf16_pattern(b); };
  test::EventTimer timer;
  const auto time_ms = [&](int iters, const auto& f) { return timer.ms(iters, f); };
  const DT t = DT::BF16;
  const int64_t m = 50432, k = 768;
  for (int64_t n : {3072, 2304}) {
    Buf x(t, m * k), w(t, n * k), b(t, n), y(t, m * n), dx(t, m * k), dw(DT::F32, n * k),
        db(DT::F32, n);
    fill(x), fill(w), fill(b), fill(y);
    kc::memset_zero(dw.p, n * k * 4), kc::memset_zero(db.p, n * 4);
    const double flop = 2.0 * m * k * n;
    const double fwd = time_ms(20, [&] { kc::linear_fwd_t(t, x.p, w.p, b.p, t, y.p, m, k, n); });
    const double nobias =
        time_ms(20, [&] { kc::linear_fwd_t(t, x.p, w.p, nullptr, t, y.p, m, k, n); });
    const double bwd = time_ms(10, [&] {
      kc::linear_bwd_t(t, x.p, w.p, y.p, dx.p, static_cast<float*>(dw.p), static_cast<float*>(db.p),
                       m, k, n);
    });
    const double dwdb = time_ms(10, [&] {
      kc::linear_bwd_t(t, x.p, w.p, y.p, nullptr, static_cast<float*>(dw.p),
                       static_cast<float*>(db.p), m, k, n);
    });
    std::printf(
        "TIMING linear_fwd_t bf16+bias m=%lld k=%lld n=%lld: %.3f ms, %.1f TFLOP/s (no bias "
        "%.3f ms)\n",
        (long long)m, (long long)k, (long long)n, fwd, flop / fwd * 1e-9, nobias);
    std::printf(
        "TIMING linear_bwd_t bf16 (dx, dw fp32, db) m=%lld k=%lld n=%lld: %.3f ms, %.1f TFLOP/s; "
        "dw+db only %.3f ms\n",
        (long long)m, (long long)k, (long long)n, bwd, 2 * flop / bwd * 1e-9, dwdb);
  }
  {  // The MLP's fc1 + GELU (n = 3072) and fc2's dx through the GELU (k = 3072): the cuBLASLt
     // epilogues against the GEMM + a separate tanh-GELU kernel.
    const int64_t n = 3072;
    Buf x(t, m * k), w(t, n * k), b(t, n), pre(t, m * n), y(t, m * n), dy(t, m * k), dpre(t, m * n),
        tmp(t, m * n);
    fill(x), fill(w), fill(b), fill(dy), fill(pre);
    const uint64_t r0 = kc::lt_gelu_epilogue_runs();
    const double fused =
        time_ms(20, [&] { kc::linear_gelu_fwd_t(t, x.p, w.p, b.p, pre.p, y.p, m, k, n); });
    const uint64_t r1 = kc::lt_gelu_epilogue_runs();
    const double split = time_ms(20, [&] {
      kc::linear_fwd_t(t, x.p, w.p, b.p, t, pre.p, m, k, n);
      kc::gelu_tanh_fwd_t(t, pre.p, y.p, m * n);
    });
    // fc2: x = gelu(pre) [m, 3072], w [768, 3072], dy [m, 768]; dx only (dw, db null).
    const double dfused = time_ms(10, [&] {
      kc::linear_bwd_dgelu_t(t, y.p, w.p, dy.p, pre.p, dpre.p, nullptr, nullptr, m, n, k);
    });
    const uint64_t r2 = kc::lt_gelu_epilogue_runs();
    const double dsplit = time_ms(10, [&] {
      kc::linear_bwd_t(t, y.p, w.p, dy.p, tmp.p, nullptr, nullptr, m, n, k);
      kc::gelu_tanh_bwd_t(t, pre.p, tmp.p, dpre.p, m * n);
    });
    std::printf(
        "TIMING linear_gelu_fwd_t bf16 m=%lld k=%lld n=%lld: %.3f ms (%s); linear_fwd_t + "
        "gelu_tanh_fwd_t %.3f ms\n",
        (long long)m, (long long)k, (long long)n, fused, r1 > r0 ? "fused" : "fallback", split);
    std::printf(
        "TIMING linear_bwd_dgelu_t bf16 dx m=%lld k=%lld n=%lld: %.3f ms (%s); linear_bwd_t dx + "
        "gelu_tanh_bwd_t %.3f ms\n",
        (long long)m, (long long)n, (long long)k, dfused, r2 > r1 ? "fused" : "fallback", dsplit);
  }
  {
    Buf x(t, m * k), w(t, 1000 * k), b(DT::F32, 1000), y(DT::F32, m * 1000);
    fill(x), fill(w), kc::memset_zero(b.p, 4000);
    const double ms =
        time_ms(20, [&] { kc::linear_fwd_t(t, x.p, w.p, b.p, DT::F32, y.p, m, k, 1000); });
    std::printf("TIMING linear_fwd_t bf16 -> fp32 logits m=%lld k=%lld n=1000: %.3f ms\n",
                (long long)m, (long long)k, ms);
  }
  const int64_t bb = 256, n = 197, h = 12, hd = 64, d = h * hd;
  Buf qkv(t, bb * n * 3 * d), out(t, bb * n * d), probs(t, bb * h * n * n), dout(t, bb * n * d),
      dqkv(t, bb * n * 3 * d);
  fill(qkv), fill(dout);
  const double flop = 4.0 * bb * h * n * n * hd;  // two products of 2·n²·hd per head
  const double fwd =
      time_ms(10, [&] { kc::attention_fwd_t(t, qkv.p, out.p, probs.p, bb, n, h, hd); });
  const double bwd =
      time_ms(10, [&] { kc::attention_bwd_t(t, qkv.p, probs.p, dout.p, dqkv.p, bb, n, h, hd); });
  std::printf("TIMING attention_fwd_t bf16 b=%lld n=%lld h=%lld hd=%lld: %.3f ms, %.1f TFLOP/s\n",
              (long long)bb, (long long)n, (long long)h, (long long)hd, fwd, flop / fwd * 1e-9);
  std::printf("TIMING attention_bwd_t bf16 b=%lld n=%lld h=%lld hd=%lld: %.3f ms, %.1f TFLOP/s\n",
              (long long)bb, (long long)n, (long long)h, (long long)hd, bwd, 2 * flop / bwd * 1e-9);
  // The fp32 twins on the same shape, for comparison.
  {
    Buf qkv32(DT::F32, bb * n * 3 * d), out32(DT::F32, bb * n * d), p32(DT::F32, bb * h * n * n),
        dout32(DT::F32, bb * n * d), dqkv32(DT::F32, bb * n * 3 * d);
    kc::memset_zero(qkv32.p, qkv32.count * 4), kc::memset_zero(dout32.p, dout32.count * 4);
    auto f = [](Buf& bf) { return static_cast<float*>(bf.p); };
    const double f32 =
        time_ms(5, [&] { kc::attention_fwd(f(qkv32), f(out32), f(p32), bb, n, h, hd); });
    const double b32 = time_ms(
        5, [&] { kc::attention_bwd(f(qkv32), f(p32), f(dout32), f(dqkv32), bb, n, h, hd); });
    std::printf("TIMING attention fp32 (same shape): fwd %.3f ms, bwd %.3f ms\n", f32, b32);
  }
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
}
#endif
