#include "cai/schedule/param_gathers.h"

#include <algorithm>
#include <numeric>

#include "cai/core/error.h"

namespace cai::schedule {

std::vector<int> param_gather_order(const std::vector<int>& first_layer) {
  std::vector<int> order(first_layer.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return first_layer[a] < first_layer[b]; });
  return order;
}

ParamGatherQueue::ParamGatherQueue(std::vector<int> order, int max_inflight)
    : order_(std::move(order)), rank_(order_.size(), -1), max_(max_inflight) {
  CAI_CHECK(max_inflight >= 1, "[param_gathers] zero_max_inflight_buckets {} must be at least 1",
            max_inflight);
  for (size_t i = 0; i < order_.size(); ++i) {
    const int b = order_[i];
    CAI_CHECK(b >= 0 && b < static_cast<int>(order_.size()) && rank_[b] < 0,
              "[param_gathers] gather order entry {} is bucket {}: expected a permutation of 0..{}",
              i, b, order_.size() - 1);
    rank_[b] = static_cast<int>(i);
  }
  next_issue_ = next_complete_ = order_.size();  // nothing stale before the first step
}

bool ParamGatherQueue::stale(int bucket) const {
  CAI_CHECK(bucket >= 0 && bucket < static_cast<int>(rank_.size()),
            "[param_gathers] bucket {}: expected 0 to {}", bucket, rank_.size() - 1);
  return static_cast<size_t>(rank_[bucket]) >= next_complete_;
}

void ParamGatherQueue::issue(std::vector<Action>& out) {
  while (next_issue_ < order_.size() && next_issue_ - next_complete_ < static_cast<size_t>(max_))
    out.push_back({true, order_[next_issue_++]});
}

void ParamGatherQueue::complete_next(std::vector<Action>& out) {
  if (next_issue_ == next_complete_) issue(out);
  out.push_back({false, order_[next_complete_++]});
  issue(out);
}

std::vector<ParamGatherQueue::Action> ParamGatherQueue::begin() {
  CAI_CHECK(!any_stale(), "[param_gathers] begin() with {} buckets still stale: need_all() first",
            order_.size() - next_complete_);
  next_issue_ = next_complete_ = 0;
  std::vector<Action> out;
  issue(out);
  return out;
}

std::vector<ParamGatherQueue::Action> ParamGatherQueue::need(int bucket) {
  std::vector<Action> out;
  while (stale(bucket)) complete_next(out);
  return out;
}

std::vector<ParamGatherQueue::Action> ParamGatherQueue::need_all() {
  std::vector<Action> out;
  while (any_stale()) complete_next(out);
  return out;
}

}  // namespace cai::schedule
