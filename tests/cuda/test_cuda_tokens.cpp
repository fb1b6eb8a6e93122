// Sequence parallelism's staging permutation (kernels/tokens.h) on the GPU against the CPU
// reference, bit for bit: both directions, packed and padded, every element size (fp32, bf16,
// fp16, int32), uneven token splits (ViT-H's 257 tokens over 4 ranks), features that leave a row
// 2, 4 or 8 bytes wide and views that start off a 16-byte boundary (the kernel's narrower units),
// and the padding zeroed. Runs on a GPU host; without a GPU every case skips, saying why.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cai/core/tensor.h"
#include "cai/ops/ops.h"
#include "kernels/device.h"
#include "kernels/tokens.h"

using namespace cai;

namespace {

class CudaTokens : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kernels::cuda::device_count() == 0)
      GTEST_SKIP() << "no GPU: " << kernels::cuda::runtime_info().device_error;
  }
};

// n elements of dtype d, distinct where the dtype allows (int32 always; halves: integers in
// [-256, 256], exact), on the CPU.
Tensor values(int64_t n, DType d, int seed) {
  if (d == DType::I32) {
    std::vector<int32_t> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>(i * 13 + seed * 1000003);
    return Tensor::from_vector(v, {n});
  }
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 7 + seed * 31) % 513 - 256);
  return Tensor::from_vector(v, {n}).to(d);
}

std::vector<uint8_t> bytes(const Tensor& t) {
  const Tensor h = t.to(Device::cpu());
  const auto* p = static_cast<const uint8_t*>(h.raw());
  return std::vector<uint8_t>(p, p + h.nbytes());
}

}  // namespace

TEST_F(CudaTokens, MatchesTheCpuReferenceBitForBit) {
  const Device gpu = Device::cuda(0);
  struct Case {
    int64_t B, N, F;
    int T;
  };
  const Case cases[] = {{2, 10, 3, 3},     {3, 10, 4, 4},  {2, 8, 5, 4}, {4, 257, 24, 4},
                        {2, 197, 16, 2},   {1, 257, 1, 4}, {4, 5, 2, 5}, {2, 7, 8, 1},
                        {32, 257, 1280, 4}};  // the last: ViT-H/14 batch 32 over tp 4
  for (DType d : {DType::F32, DType::BF16, DType::F16, DType::I32})
    for (const Case& c : cases)
      for (bool padded : {false, true})
        for (int64_t lead : {0, 1, 3}) {  // elements before the views: misaligned starts
          if (c.B * c.N * c.F > 1000000 && (lead != 0 || d == DType::I32)) continue;
          const std::string what =
              fmt::format("{} [{}, {}, {}] over {} ({}, offset {})", dtype_name(d), c.B, c.N, c.F,
                          c.T, padded ? "padded" : "packed", lead);
          const int64_t full_n = c.B * c.N * c.F;
          const int64_t staged_n = kernels::staged_numel(c.B, c.N, c.F, c.T, padded);
          const Tensor full_h =
              values(lead + full_n, d, 1).narrow(lead, full_n).reshape({c.B, c.N, c.F});
          // To ranks: garbage where the padding goes, which both must zero.
          Tensor staged_h = values(lead + staged_n, d, 2).narrow(lead, staged_n);
          Tensor staged_g = values(lead + staged_n, d, 2).to(gpu).narrow(lead, staged_n);
          const Tensor full_g =
              values(lead + full_n, d, 1).to(gpu).narrow(lead, full_n).reshape({c.B, c.N, c.F});
          ops::tokens_to_ranks_(staged_h, full_h, c.T, padded);
          ops::tokens_to_ranks_(staged_g, full_g, c.T, padded);
          EXPECT_EQ(bytes(staged_g), bytes(staged_h)) << "to ranks: " << what;
          // From ranks: back to the full tensor.
          Tensor back_h = values(lead + full_n, d, 3).narrow(lead, full_n).reshape({c.B, c.N, c.F});
          Tensor back_g =
              values(lead + full_n, d, 3).to(gpu).narrow(lead, full_n).reshape({c.B, c.N, c.F});
          ops::tokens_from_ranks_(back_h, staged_h, c.T, padded);
          ops::tokens_from_ranks_(back_g, staged_h.to(gpu), c.T, padded);
          EXPECT_EQ(bytes(back_g), bytes(back_h)) << "from ranks: " << what;
          EXPECT_EQ(bytes(back_h), bytes(full_h)) << "round trip: " << what;
        }
}
