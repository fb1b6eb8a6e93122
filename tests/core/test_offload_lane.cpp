// ZeRO-Offload's staged upload (libcai/src/parallel/offload_lane.h, internal): on the CPU the lane
// packs ranges into its staging buffers and copies each buffer to the destination as on a GPU
// (a memcpy for the copy), so the packing is tested here: ranges sharing a buffer, the padding
// between them zeroed, a buffer sent when the next range does not fit, a range larger than a
// buffer refused (nullptr: upload() it instead), and nothing left unsent after end_staged().
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cai/core/error.h"
#include "cai/core/tensor.h"
#include "parallel/offload_lane.h"

using namespace cai;

TEST(OffloadLane, StagedUploadPacksRangesAndSendsEveryBuffer) {
  // Buffers of 10 fp32 values: 20 bf16 elements each.
  parallel::detail::OffloadLane lane(Device::cpu(), 10);
  Tensor dst = Tensor::empty({100}, DType::BF16);
  auto* d = static_cast<uint16_t*>(dst.raw());
  for (int i = 0; i < 100; ++i) d[i] = 0xBEEF;  // stale bytes the upload must replace
  auto fill = [](void* at, int64_t n, uint16_t base) {
    auto* p = static_cast<uint16_t*>(at);
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<uint16_t>(base + i);
  };
  lane.begin_staged(dst);
  void* a = lane.stage(0, 8);
  ASSERT_NE(a, nullptr);
  fill(a, 8, 100);
  void* b = lane.stage(8, 4);  // the same buffer, right after
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(static_cast<uint16_t*>(b), static_cast<uint16_t*>(a) + 8);
  fill(b, 4, 200);
  void* c = lane.stage(16, 4);  // padding 12..15 zeroed
  ASSERT_NE(c, nullptr);
  fill(c, 4, 300);
  EXPECT_EQ(lane.stage(20, 30), nullptr);  // more than a buffer: the caller uploads it
  std::vector<float> big(30, 1.5f);
  lane.upload(Tensor::from_vector(big, {30}), 0, dst, 20, 30);
  void* e = lane.stage(50, 15);
  ASSERT_NE(e, nullptr);
  fill(e, 15, 400);
  void* f = lane.stage(70, 20);  // 50..90 does not fit one buffer: the next one
  ASSERT_NE(f, nullptr);
  fill(f, 20, 500);
  lane.end_staged();
  for (int i = 0; i < 8; ++i) EXPECT_EQ(d[i], 100 + i) << i;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(d[8 + i], 200 + i) << i;
  for (int i = 12; i < 16; ++i) EXPECT_EQ(d[i], 0) << i;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(d[16 + i], 300 + i) << i;
  for (int i = 20; i < 50; ++i) EXPECT_EQ(d[i], float_to_bf16(1.5f)) << i;
  for (int i = 0; i < 15; ++i) EXPECT_EQ(d[50 + i], 400 + i) << i;
  for (int i = 65; i < 70; ++i) EXPECT_EQ(d[i], 0xBEEF) << i;  // never staged: untouched
  for (int i = 0; i < 20; ++i) EXPECT_EQ(d[70 + i], 500 + i) << i;
  for (int i = 90; i < 100; ++i) EXPECT_EQ(d[i], 0xBEEF) << i;
  EXPECT_EQ(lane.bytes_uploaded(), 2 * (20 + 30 + 15 + 20));
  // A range outside the destination, or staging before begin_staged, names what was wrong.
  lane.begin_staged(dst);
  EXPECT_THROW(lane.stage(95, 10), Error);
  lane.end_staged();
  EXPECT_THROW(lane.stage(0, 1), Error);
}
