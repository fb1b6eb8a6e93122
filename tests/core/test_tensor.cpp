#include <gtest/gtest.h>

#include <cstring>

#include <cmath>

#include "cai/core/error.h"
#include "cai/core/tensor.h"
#include "cai/ops/ops.h"
#include "kernels/device.h"

using namespace cai;

TEST(Tensor, ShapeStridesAndViews) {
  Tensor t = Tensor::from_vector(std::vector<float>{0, 1, 2, 3, 4, 5}, {2, 3});
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.strides(), (Shape{3, 1}));
  EXPECT_EQ(t.size(-1), 3);
  Tensor r = t.reshape({3, -1});
  EXPECT_EQ(r.shape(), (Shape{3, 2}));
  r.data<float>()[0] = 42;  // views share storage
  EXPECT_EQ(t.data<float>()[0], 42);
  Tensor row = t.narrow(1, 1);
  EXPECT_EQ(row.shape(), (Shape{1, 3}));
  EXPECT_EQ(row.to_vector(), (std::vector<float>{3, 4, 5}));
  Tensor c = t.clone();
  c.data<float>()[1] = -1;
  EXPECT_EQ(t.data<float>()[1], 1);
}

TEST(Tensor, ZeroAllClearsOnlyTheViews) {
  Tensor a = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {6});
  Tensor b = Tensor::from_vector(std::vector<float>{7, 8}, {2});
  Tensor mid = a.narrow(2, 3);
  zero_all({&mid, &b});
  EXPECT_EQ(a.to_vector(), (std::vector<float>{1, 2, 0, 0, 0, 6}));
  EXPECT_EQ(b.to_vector(), (std::vector<float>{0, 0}));
  zero_all({});
}

TEST(Tensor, ErrorsNameTheValues) {
  Tensor t = Tensor::zeros({2, 3});
  try {
    t.reshape({4, 2});
    FAIL() << "reshape should throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[4, 2]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(t.narrow(1, 2), Error);
  EXPECT_THROW(t.data<int32_t>(), Error);
  EXPECT_THROW(Tensor::from_vector(std::vector<float>{1, 2}, {3}), Error);
  EXPECT_THROW(dtype_from_name("fp8"), Error);
}

TEST(Tensor, HalfConversionsRoundTrip) {
  std::vector<float> v{0.0f, 1.0f, -2.5f, 3.14159f, 65504.0f, 1e-7f, -1e-3f};
  Tensor t = Tensor::from_vector(v, {7});
  const auto bf = t.to(DType::BF16).to(DType::F32).to_vector();
  const auto hf = t.to(DType::F16).to(DType::F32).to_vector();
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_NEAR(bf[i], v[i], std::abs(v[i]) * 4e-3 + 1e-30) << i;
    if (std::abs(v[i]) > 6e-5f) {
      EXPECT_NEAR(hf[i], v[i], std::abs(v[i]) * 1e-3) << i;
    } else {
      EXPECT_NEAR(hf[i], v[i], 6e-8) << i;  // fp16 subnormal spacing
    }
  }
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00);  // rounds to infinity
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(NAN))));
}

TEST(Tensor, CudaWithoutGpuThrowsCleanly) {
  // On a machine without a GPU (or a build without CUDA) CUDA allocation must throw, not crash.
  if (cai::kernels::cuda::device_count() > 0)
    GTEST_SKIP() << "a GPU is present: the GPU suite covers CUDA tensors";
  EXPECT_THROW(Tensor::empty({4}, DType::F32, Device::cuda(0)), Error);
}

// Host zeros come from zeroed memory (calloc) without a pass over them: they must still read as
// zeros where a freed, written block of the same size is reused, and stay 64-byte aligned.
TEST(Tensor, HostZerosReadAsZerosAfterReuseAndAreAligned) {
  // 20M elements: 80 MB, past kernels::cpu::alloc's 64 MiB: a mapping on a 2 MiB boundary.
  for (int64_t n : {int64_t{1}, int64_t{17}, int64_t{4096}, int64_t{3} << 20, int64_t{20} << 20}) {
    for (int round = 0; round < 3; ++round) {
      {
        Tensor dirty = Tensor::empty({n});
        ops::fill_(dirty, 7.0f);
      }
      Tensor z = Tensor::zeros({n});
      EXPECT_EQ(reinterpret_cast<uintptr_t>(z.data<float>()) % 64, 0u) << n;
      const float* p = z.data<float>();
      int64_t nonzero = 0;
      for (int64_t i = 0; i < n; ++i) nonzero += p[i] != 0.0f;
      EXPECT_EQ(nonzero, 0) << n << " elements, round " << round;
      Tensor e = Tensor::empty({n + 3});
      EXPECT_EQ(reinterpret_cast<uintptr_t>(e.data<float>()) % 64, 0u) << n;
      if (n * 4 >= (int64_t{64} << 20))
        EXPECT_EQ(reinterpret_cast<uintptr_t>(z.data<float>()) % (2 << 20), 0u) << n;
      // A host copy (over the CPU pool in pieces) copies every byte.
      ops::fill_(z, 3.0f);
      z.data<float>()[n - 1] = 5.0f;
      Tensor c = Tensor::empty({n});
      c.copy_from(z);
      if (n > 2) EXPECT_EQ(c.data<float>()[n / 2], 3.0f);
      EXPECT_EQ(c.data<float>()[n - 1], 5.0f);
      EXPECT_EQ(std::memcmp(c.data<float>(), z.data<float>(), static_cast<size_t>(n) * 4), 0);
    }
  }
}
