#include "cai/schedule/buckets.h"

#include <algorithm>

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

GatherWindow::GatherWindow(std::vector<char> has_params, int prefetch)
    : has_params_(std::move(has_params)), prefetch_(prefetch) {
  CAI_CHECK(prefetch >= 0, "[buckets] zero3_prefetch {} must be at least 0", prefetch);
}

bool GatherWindow::is_pending(int pos) const {
  return std::find(pending_.begin(), pending_.end(), pos) != pending_.end();
}

std::vector<int> GatherWindow::fetch(int pos, bool backward) {
  const int L = static_cast<int>(has_params_.size());
  CAI_CHECK(pos >= 0 && pos < L, "[buckets] gather window: layer position {} of {}", pos, L);
  std::vector<int> issued;
  if (!has_params_[pos]) return issued;
  auto issue = [&](int i) {
    if (is_pending(i)) return;
    pending_.push_back(i);
    issued.push_back(i);
  };
  issue(pos);
  const int step = backward ? -1 : 1;
  int ahead = 0;
  for (int i = pos + step; i >= 0 && i < L && ahead < prefetch_; i += step) {
    if (!has_params_[i]) continue;
    ++ahead;
    if (static_cast<int>(pending_.size()) > prefetch_) break;
    issue(i);
  }
  pending_.erase(std::find(pending_.begin(), pending_.end(), pos));
  return issued;
}

InflightWindow InflightWindow::for_reductions(int zero_max_inflight_buckets, int dp) {
  return InflightWindow(dp <= 1 ? 1 : std::max(1, zero_max_inflight_buckets));
}

InflightWindow::InflightWindow(int max_inflight) : max_(max_inflight) {
  CAI_CHECK(max_inflight >= 1, "[buckets] zero_max_inflight_buckets {} must be at least 1",
            max_inflight);
}

std::vector<int> InflightWindow::launch(int b) {
  std::vector<int> first;
  if (std::find(inflight_.begin(), inflight_.end(), b) != inflight_.end()) {
    first.push_back(b);
    finish(b);
  }
  while (static_cast<int>(inflight_.size()) >= max_) {
    first.push_back(inflight_.front());
    inflight_.erase(inflight_.begin());
  }
  inflight_.push_back(b);
  return first;
}

void InflightWindow::finish(int b) {
  auto it = std::find(inflight_.begin(), inflight_.end(), b);
  if (it != inflight_.end()) inflight_.erase(it);
}

}  // namespace cai::schedule
