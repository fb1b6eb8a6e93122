#include "cai/schedule/offload.h"

#include <algorithm>

#include "cai/core/error.h"
#include "cai/schedule/buckets.h"

namespace cai::schedule {

OffloadLayout offload_layout(const std::vector<int64_t>& numels, const std::vector<char>& rounded,
                             const std::vector<std::vector<int>>& buckets, int zero_stage,
                             int dp_rank, int dp, int64_t compute_bytes, int slots,
                             bool step_casts) {
  CAI_CHECK(numels.size() == rounded.size(),
            "[offload] {} parameter sizes but {} dtype flags: expected one per parameter",
            numels.size(), rounded.size());
  CAI_CHECK(zero_stage >= 1 && zero_stage <= 3,
            "[offload] zero_stage {}: offload needs stage 1, 2 or 3", zero_stage);
  CAI_CHECK(dp >= 1 && dp_rank >= 0 && dp_rank < dp, "[offload] rank {} of {}: expected 0..{}",
            dp_rank, dp, dp - 1);
  CAI_CHECK(compute_bytes == 2 || compute_bytes == 4,
            "[offload] compute element size {}: expected 2 or 4 bytes", compute_bytes);
  CAI_CHECK(slots >= 0, "[offload] {} optimizer slots: expected >= 0", slots);
  OffloadLayout o;
  auto line = [](int64_t c) {
    return (c + kOffloadHostAlign - 1) / kOffloadHostAlign * kOffloadHostAlign;
  };
  for (size_t i = 0; i < numels.size(); ++i) {
    const int64_t c = zero_chunk_size(numels[i], dp_rank, dp);
    o.shard += c;
    if (rounded[i]) o.rounded += c, o.host_rounded_elements += line(c);
    o.host_elements += line(c);
  }
  int64_t at_rounded = 0, at_fp32 = o.host_rounded_elements;
  for (size_t i = 0; i < numels.size(); ++i) {
    int64_t& at = rounded[i] ? at_rounded : at_fp32;
    o.host_offset.push_back(at);
    at += line(zero_chunk_size(numels[i], dp_rank, dp));
  }
  int64_t most = 1;
  for (const auto& b : buckets) {
    int64_t c = 0;
    for (int i : b) {
      CAI_CHECK(i >= 0 && i < static_cast<int>(numels.size()),
                "[offload] bucket parameter {}: expected 0..{}", i, numels.size() - 1);
      c += zero_chunk_size(numels[i], dp_rank, dp);
    }
    most = std::max(most, c);
    if (zero_stage >= 2) o.bucket_download.push_back(4 * c);
  }
  o.largest_chunk = most;
  o.device_value_bytes = o.rounded * compute_bytes + 4 * (o.shard - o.rounded);
  o.device_grad_bytes = zero_stage == 1 ? 4 * o.shard : 0;
  o.step_download = zero_stage == 1 ? 4 * o.shard : 0;
  // The upload: the rounded part, then the fp32 part, each in copies of at most `piece` elements
  // (a staging buffer holds `most` fp32 values: the cast copies; the step's own bf16 copies fill
  // it with 4 / compute_bytes times as many).
  auto cut = [&](int64_t n, int64_t e, int64_t piece) {
    for (int64_t off = 0; off < n; off += piece) {
      o.upload_numel.push_back(std::min(piece, n - off));
      o.upload.push_back(o.upload_numel.back() * e);
    }
  };
  o.host_state_bytes = 4 * (2 + slots) * o.shard;
  // No buckets (the executor asks for the host layout before it builds them): no transfers.
  // (Cut in copies of one element each, a 6.4B model's lists took 100 GB and minutes.)
  if (buckets.empty()) return o;
  const bool fused = step_casts && compute_bytes == 2;
  cut(o.rounded, compute_bytes, fused ? most * 4 / compute_bytes : most);
  if (fused) o.fused_copies = static_cast<int>(o.upload.size());
  cut(o.shard - o.rounded, 4, most);
  o.staging_bytes = 2 * kOffloadStagingSlots * most * 4;
  return o;
}

}  // namespace cai::schedule
