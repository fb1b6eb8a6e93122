// DistributedSampler: the epoch's order (a Philox-seeded Fisher-Yates permutation when shuffling)
// cut into global batches of batch_size × world, rank r taking block r of each global batch.
#include <algorithm>
#include <numeric>
#include <utility>
#include <vector>

#include "cai/core/error.h"
#include "cai/core/rng.h"
#include "cai/data/data.h"
#include "kernels/base/philox.h"

namespace cai::data {

DistributedSampler::DistributedSampler(int64_t dataset_size, int64_t batch_size, int world,
                                       int rank, bool shuffle, bool drop_last, uint64_t seed)
    : n_(dataset_size),
      bs_(batch_size),
      world_(world),
      rank_(rank),
      shuffle_(shuffle),
      drop_last_(drop_last),
      seed_(seed) {
  CAI_CHECK(n_ >= 0, "[sampler] dataset size {} must be >= 0", n_);
  CAI_CHECK(bs_ > 0, "[sampler] batch size {} must be > 0", bs_);
  CAI_CHECK(world_ > 0, "[sampler] world size {} must be > 0", world_);
  CAI_CHECK(rank_ >= 0 && rank_ < world_, "[sampler] rank {} is outside [0, {})", rank_, world_);
  const int64_t global = bs_ * world_;
  if (drop_last_)
    total_ = n_ / global * global;
  else
    total_ = (n_ + world_ - 1) / world_ * world_;
}

std::vector<int64_t> DistributedSampler::epoch_order(int64_t epoch) const {
  std::vector<int64_t> order(static_cast<size_t>(n_));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (shuffle_) {
    const uint64_t stream = rng::stream_of("shuffle") ^ philox::mix64(static_cast<uint64_t>(epoch));
    for (int64_t i = n_ - 1; i > 0; --i) {
      const uint64_t off = 2 * static_cast<uint64_t>(i);
      const uint64_t r =
          (uint64_t{philox::word(seed_, stream, off)} << 32) | philox::word(seed_, stream, off + 1);
      const int64_t j = static_cast<int64_t>(r % static_cast<uint64_t>(i + 1));
      std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
    }
  }
  if (total_ <= n_) {
    order.resize(static_cast<size_t>(total_));
  } else {
    // Pad to a multiple of the world size by repeating the first indices of the order.
    for (int64_t i = n_; i < total_; ++i) order.push_back(order[static_cast<size_t>(i % n_)]);
  }
  return order;
}

int64_t DistributedSampler::num_batches() const {
  const int64_t global = bs_ * world_;
  return (total_ + global - 1) / global;
}

int64_t DistributedSampler::global_batch_size(int64_t b) const {
  CAI_CHECK(b >= 0 && b < num_batches(), "[sampler] batch {} is outside [0, {})", b, num_batches());
  const int64_t global = bs_ * world_;
  return std::min(global, total_ - b * global);
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  const std::vector<int64_t> order = epoch_order(epoch);
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(total_ / world_));
  const int64_t global = bs_ * world_;
  for (int64_t b = 0; b < num_batches(); ++b) {
    const int64_t block = global_batch_size(b) / world_;
    const int64_t start = b * global + rank_ * block;
    out.insert(out.end(), order.begin() + start, order.begin() + start + block);
  }
  return out;
}

std::vector<int64_t> DistributedSampler::batch(int64_t epoch, int64_t b,
                                               int64_t* offset_in_global_batch) const {
  CAI_CHECK(b >= 0 && b < num_batches(), "[sampler] batch {} is outside [0, {})", b, num_batches());
  const std::vector<int64_t> order = epoch_order(epoch);
  const int64_t block = global_batch_size(b) / world_;
  const int64_t start = b * bs_ * world_ + rank_ * block;
  if (offset_in_global_batch) *offset_in_global_batch = rank_ * block;
  return {order.begin() + start, order.begin() + start + block};
}

}  // namespace cai::data
