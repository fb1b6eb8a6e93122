// Host-side helpers of the typed CUDA kernel tests: values rounded to a half type, and a device
// buffer of fp32/bf16/fp16 elements filled from and read back as fp32.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cai/core/tensor.h"
#include "kernels/base/dtype.h"
#include "kernels/device.h"

#ifdef CAI_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace cai::test {

using kernels::DT;
namespace kc = kernels::cuda;

inline float round_to(DT t, float v) {
  switch (t) {
    case DT::BF16:
      return bf16_to_float(float_to_bf16(v));
    case DT::F16:
      return fp16_to_float(float_to_fp16(v));
    default:
      return v;
  }
}

// Uniform in [-scale, scale), rounded to t.
inline std::vector<float> random_values(size_t count, uint64_t seed, float scale, DT t) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(count);
  for (auto& x : v) x = round_to(t, u(gen));
  return v;
}

inline std::vector<float> rounded(DT t, std::vector<float> v) {
  for (auto& x : v) x = round_to(t, x);
  return v;
}

// A device buffer of `count` elements of type t (GPU 0, caching allocator).
struct Buf {
  DT t;
  size_t count;
  void* p = nullptr;
  Buf(DT type, size_t n) : t(type), count(n) {
    p = kc::alloc(std::max<size_t>(n, 1) * kernels::dt_size(t), 0);
  }
  Buf(DT type, const std::vector<float>& v) : Buf(type, v.size()) { upload(v); }
  ~Buf() { kc::free(p, 0); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;

  void upload(const std::vector<float>& v) {
    ASSERT_EQ(v.size(), count);
    if (t == DT::F32) {
      kc::copy_h2d(p, v.data(), count * 4);
      return;
    }
    std::vector<uint16_t> h(count);
    for (size_t i = 0; i < count; ++i)
      h[i] = t == DT::BF16 ? float_to_bf16(v[i]) : float_to_fp16(v[i]);
    kc::copy_h2d(p, h.data(), count * 2);
  }
  std::vector<float> download() const {
    std::vector<float> v(count);
    if (t == DT::F32) {
      kc::copy_d2h(v.data(), p, count * 4);
      return v;
    }
    std::vector<uint16_t> h(count);
    kc::copy_d2h(h.data(), p, count * 2);
    for (size_t i = 0; i < count; ++i)
      v[i] = t == DT::BF16 ? bf16_to_float(h[i]) : fp16_to_float(h[i]);
    return v;
  }
};

// ‖got − ref‖ / ‖ref‖ ≤ tol, printed. The reference must not be all zeros (a test that cannot
// fail is a defect) and the result must hold no NaN.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& ref, double tol,
                         const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << ": element " << i << " is " << got[i];
    num += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  ASSERT_GT(den, 0.0) << what << ": the reference is all zeros";
  const double err = std::sqrt(num / den);
  std::printf("  %-60s rel err %.3e (tol %.0e)\n", what.c_str(), err, tol);
  EXPECT_LE(err, tol) << what;
}

// For the print-only timing cases: a device buffer filled with a fixed pseudo-random bf16 pattern
// in [-1, 1), and the mean time of `iters` calls of f (after 3 warm-up calls) between two events.
inline void fill_bf16_pattern(Buf& b) {
  std::vector<uint16_t> v(b.count);
  uint64_t s = 0x9E3779B97F4A7C15ull;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = float_to_bf16((static_cast<float>(s >> 40) / 16777216.0f - 0.5f) * 2.0f);
  }
  kc::copy_h2d(b.p, v.data(), v.size() * 2);
}

#ifdef CAI_HAVE_CUDA
class EventTimer {
 public:
  EventTimer() {
    EXPECT_EQ(cudaEventCreate(&e0_), cudaSuccess);
    EXPECT_EQ(cudaEventCreate(&e1_), cudaSuccess);
  }
  ~EventTimer() {
    cudaEventDestroy(e0_);
    cudaEventDestroy(e1_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  template <typename F>
  double ms(int iters, const F& f) {
    for (int i = 0; i < 3; ++i) f();
    cudaEventRecord(e0_);
    for (int i = 0; i < iters; ++i) f();
    cudaEventRecord(e1_);
    cudaEventSynchronize(e1_);
    float total = 0;
    cudaEventElapsedTime(&total, e0_, e1_);
    return static_cast<double>(total) / iters;
  }

 private:
  cudaEvent_t e0_ = nullptr, e1_ = nullptr;
};
#endif

}  // namespace cai::test
