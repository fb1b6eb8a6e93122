// The kernel profile's table from known records: per-kernel sums, categories, the busy time as
// the union of overlapping intervals, and one step's kernels in the CSV.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "cai/core/kernel_profile.h"

using namespace cai;

namespace {
std::string slurp(const std::string& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}
}  // namespace

TEST(KernelProfile, TableFromRecords) {
  using profile::KernelRecord;
  // Two steps of three kernels; in each, the second overlaps the first by 1 µs on another stream.
  std::vector<KernelRecord> r;
  for (uint64_t s = 0; s < 2; ++s) {
    const uint64_t t = s * 100000;
    r.push_back(
        {"void cai::kernels::cuda::(anonymous namespace)::gelu_fwd_t_kernel<float, false>"
         "(float const*, float*, long)",
         t, t + 4000, 7, 10, 256});
    r.push_back(
        {"nvjet_sm90_tst_192x192_64x4_1x2_h_bz_coopB_bias_TNN", t + 3000, t + 10000, 8, 4, 384});
    r.push_back(
        {"void cai::kernels::cuda::(anonymous namespace)::gelu_fwd_t_kernel<float, false>"
         "(float const*, float*, long)",
         t + 20000, t + 24000, 7, 10, 256});
  }
  const std::string path = ::testing::TempDir() + "/kp.md";
  profile::write_kernel_profile(path, r, 2, 0.1, "test profile",
                                "## Host time per step by trainer phase\n\n");
  const std::string md = slurp(path);
  // Busy per step: [0, 10] ∪ [20, 24] µs = 14 µs = 0.014 ms; kernel sum 15 µs.
  EXPECT_NE(md.find("GPU busy (union of kernels and copies) 0.01 ms (14.0%)"), std::string::npos)
      << md;
  EXPECT_NE(md.find("3 kernels per step"), std::string::npos) << md;
  // The GELU kernel: 2 calls per step, 8 µs per step, the parameter list and namespaces dropped.
  EXPECT_NE(md.find("| `gelu_fwd_t_kernel<float, false>` | GELU | 2 | 0.008 | 53.3% | 4.0 |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| GEMM (cuBLAS) | 0.01 | 46.7% |"), std::string::npos) << md;
  const std::string csv = slurp(path + ".csv");
  EXPECT_NE(csv.find("1,3.0,7.0,8,4,384,nvjet_sm90"), std::string::npos) << csv;
  // Every profiled step's kernels, in order (the second step from 100 µs on).
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 7) << csv;
  EXPECT_NE(csv.find("4,103.0,7.0,8,4,384,nvjet_sm90"), std::string::npos) << csv;
  // The extra section sits between the summary and the tables.
  EXPECT_LT(md.find("## Host time per step"), md.find("## By category")) << md;
}

// The Hopper attention kernels hold "sm90" like cuBLAS's GEMMs; they count as attention.
TEST(KernelProfile, HopperAttentionIsAttention) {
  using profile::KernelRecord;
  std::vector<KernelRecord> r = {
      {"void cai::kernels::cuda::(anonymous namespace)::flash_fwd_sm90_kernel<__nv_bfloat16>"
       "(__nv_bfloat16 const*, __nv_bfloat16*, float*, int, int, int, float)",
       0, 2000, 7, 10, 256},
      {"nvjet_sm90_tst_192x192_64x4_1x2_h_bz_coopB_bias_TNN", 3000, 4000, 7, 4, 384}};
  const std::string path = ::testing::TempDir() + "/kp_sm90.md";
  profile::write_kernel_profile(path, r, 1, 0.1, "test profile", "");
  const std::string md = slurp(path);
  EXPECT_NE(md.find("| `flash_fwd_sm90_kernel<__nv_bfloat16>` | attention | 1 | 0.002 |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| attention | 0.00 | 66.7% |"), std::string::npos) << md;
  EXPECT_NE(md.find("| GEMM (cuBLAS) | 0.00 | 33.3% |"), std::string::npos) << md;
}

// NCCL's kernels are communication, whatever words their names hold ("Broadcast" holds "cast",
// "ReduceScatter" "reduce"): a 2D step's broadcasts were listed as casts.
TEST(KernelProfile, NcclKernelsAreCommunication) {
  using profile::KernelRecord;
  std::vector<KernelRecord> r{
      {"ncclDevKernel_Broadcast_RING_LL", 0, 2000, 9, 8, 512},
      {"ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", 2000, 3000, 9, 8, 512},
      {"void cai::kernels::cuda::cast_kernel<float, __nv_bfloat16>(long)", 3000, 4000, 7, 8, 256}};
  const std::string path = ::testing::TempDir() + "/kp_nccl.md";
  profile::write_kernel_profile(path, r, 1, 0.004, "nccl");
  const std::string md = slurp(path);
  EXPECT_NE(md.find("| communication (NCCL) | 0.00 | 75.0% |"), std::string::npos) << md;
  EXPECT_NE(md.find("| casts | 0.00 | 25.0% |"), std::string::npos) << md;
}
