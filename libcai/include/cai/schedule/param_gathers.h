// ZeRO-1/2's parameter all-gathers after the optimizer step, deferred to their first use: the
// order the executor (DataParallelPlugin) issues and completes them in, which the simulator's step
// program follows (one source of truth).
//
// The step leaves every bucket's full values stale. begin() (right after the step) issues the
// first max_inflight gathers in gather order (the forward order of each bucket's first layer:
// param_gather_order); need(b), called before a layer reading bucket b's values runs its forward,
// completes the gathers up to and including b in that order, issuing the next one after each
// completion (at most max_inflight in flight); need_all() completes every stale bucket (the
// "materialize" before anything else reads the full values between steps: evaluation outside the
// hooks, checkpoints, comparisons). The same calls on every rank give the same collectives in the
// same order.
#pragma once
#include <cstddef>
#include <vector>

namespace cai::schedule {

// Buckets ordered by the first (lowest) layer position among their parameters, ties by index.
// first_layer[b]: that position for bucket b.
std::vector<int> param_gather_order(const std::vector<int>& first_layer);

class ParamGatherQueue {
 public:
  struct Action {
    bool issue;  // true: start bucket's gather; false: complete it (its values become current)
    int bucket;
    bool operator==(const Action&) const = default;
  };
  ParamGatherQueue() = default;
  ParamGatherQueue(std::vector<int> order, int max_inflight);
  std::vector<Action> begin();           // every bucket stale; the first gathers issued
  std::vector<Action> need(int bucket);  // nothing when `bucket` is current
  std::vector<Action> need_all();        // completes every stale bucket
  bool stale(int bucket) const;
  bool any_stale() const { return next_complete_ < order_.size(); }
  int in_flight() const { return static_cast<int>(next_issue_ - next_complete_); }

 private:
  void issue(std::vector<Action>& out);
  void complete_next(std::vector<Action>& out);
  std::vector<int> order_;
  std::vector<int> rank_;  // bucket -> position in order_
  int max_ = 1;
  std::size_t next_issue_ = 0, next_complete_ = 0;
};

}  // namespace cai::schedule
