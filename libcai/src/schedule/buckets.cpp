#include "cai/schedule/buckets.h"

#include "cai/core/error.h"

namespace cai::schedule {

std::vector<std::vector<int>> gradient_buckets(const std::vector<int64_t>& numels,
                                               const std::vector<int>& layer_of, int zero_stage,
                                               double ddp_bucket_cap_mb,
                                               double zero_bucket_size_in_m) {
  CAI_CHECK(numels.size() == layer_of.size(), "[buckets] {} parameter sizes but {} layer indices",
            numels.size(), layer_of.size());
  CAI_CHECK(ddp_bucket_cap_mb > 0 && zero_bucket_size_in_m > 0,
            "[buckets] bucket sizes must be positive (ddp_bucket_cap_mb {}, zero_bucket_size_in_m "
            "{})",
            ddp_bucket_cap_mb, zero_bucket_size_in_m);
  std::vector<std::vector<int>> out;
  const int n = static_cast<int>(numels.size());
  if (zero_stage == 3) {  // one chunk per layer, last layer first
    for (int i = n - 1; i >= 0; --i) {
      if (out.empty() || layer_of[out.back().front()] != layer_of[i]) out.emplace_back();
      out.back().insert(out.back().begin(), i);  // model order inside the layer
    }
    return out;
  }
  const int64_t cap = zero_stage == 2 ? static_cast<int64_t>(zero_bucket_size_in_m * 1e6)
                                      : static_cast<int64_t>(ddp_bucket_cap_mb * 1024 * 1024 / 4);
  std::vector<int> cur;
  int64_t fill = 0;
  for (int i = n - 1; i >= 0; --i) {
    cur.push_back(i);
    fill += numels[i];
    if (fill >= cap) {
      out.push_back(std::move(cur));
      cur.clear();
      fill = 0;
    }
  }
  if (!cur.empty()) out.push_back(std::move(cur));
  return out;
}

}  // namespace cai::schedule
