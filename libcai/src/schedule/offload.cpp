#include "cai/schedule/offload.h"

#include <algorithm>

#include "cai/core/error.h"
#include "cai/schedule/buckets.h"

namespace cai::schedule {

std::vector<size_t> offload_step_order(const std::vector<int64_t>& host_offset,
                                       int64_t host_rounded_elements) {
  std::vector<size_t> order(host_offset.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const bool a32 = host_offset[a] >= host_rounded_elements;
    const bool b32 = host_offset[b] >= host_rounded_elements;
    return a32 != b32 ? a32 : host_offset[a] < host_offset[b];
  });
  return order;
}

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
  o.host_state_bytes = 4 * (2 + slots) * o.shard;
  // No buckets (the executor asks for the host layout before it builds them): no transfers.
  // (Cut in copies of one element each, a 6.4B model's lists took 100 GB and minutes.)
  if (buckets.empty()) return o;
  // Copies of at most `piece` elements over n, cast from fp32 (a staging buffer holds `most`
  // fp32 values); the first carries `step` elements of the host step before it.
  auto cut = [&](int64_t n, int64_t e, int64_t piece, int64_t step, int param) {
    for (int64_t off = 0; off < n; off += piece) {
      OffloadLayout::UploadPiece u;
      u.numel = std::min(piece, n - off);
      u.bytes = u.numel * e;
      u.step = off == 0 ? step : 0;
      u.cast = true;
      u.param = param;
      o.upload.push_back(u);
    }
  };
  if (step_casts && compute_bytes == 2) {
    // DataParallelPlugin::Impl::step_uploading: the fp32 part stepped and uploaded whole, then
    // each rounded parameter stepped into a staging buffer (its own: sent as soon as it is
    // stepped) or, larger than a buffer's compute-dtype capacity, stepped and then cast by the
    // plain upload.
    const int64_t cap = most * 4 / compute_bytes;
    cut(o.shard - o.rounded, 4, most, o.shard - o.rounded, -1);
    for (size_t i : offload_step_order(o.host_offset, o.host_rounded_elements)) {
      if (!rounded[i]) continue;
      const int64_t c = zero_chunk_size(numels[i], dp_rank, dp);
      if (c == 0) continue;
      if (c <= cap)
        o.upload.push_back({c, c * compute_bytes, c, false, static_cast<int>(i)});
      else
        cut(c, compute_bytes, most, c, static_cast<int>(i));
    }
  } else {
    cut(o.rounded, compute_bytes, most, 0, -1);
    cut(o.shard - o.rounded, 4, most, 0, -1);
  }
  o.staging_bytes = 2 * kOffloadStagingSlots * most * 4;
  return o;
}

}  // namespace cai::schedule
