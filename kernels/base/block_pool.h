// The caching pool behind the device allocator (kernels/cuda/device.cu), in plain C++ so that its
// bookkeeping is tested on any machine (tests/core/test_block_pool.cpp) with a fake backend.
//
// Requests round up to 512 bytes below 1 MiB and to 2 MiB above. A freed block stays cached and a
// request of exactly its size takes it back, so a training step makes no backend call. A size not
// cached goes to the backend (cudaMalloc: one block per call). When the backend refuses (the
// device near its capacity), every cached block goes back to it and the request is retried once (a
// flush, counted: on a GPU it synchronises the device).
// Two other answers to a refusal lost on a GPU at 136.8 of 139 GiB (the 6.4B ViT, dp 2 x ZeRO 1,
// whose transient buffers change size within a step; 2-3 flushes a step, 711-741 ms): serving the
// request from the front of a larger cached block (splitting it) left parts too small for the next
// larger request and ran out of memory where flushing survived; handing back only as many cached
// blocks as the request needed flushed 18 times a step (806 ms). Not thread-safe: the caller locks.
#pragma once
#include <algorithm>
#include <cstddef>
#include <functional>
#include <map>
#include <unordered_map>
#include <utility>

namespace cai::kernels {

class BlockPool {
 public:
  using Malloc = std::function<void*(size_t)>;  // nullptr when the backend refuses
  using Free = std::function<void(void*)>;
  struct Stats {
    size_t in_use = 0, cached = 0, peak = 0;  // bytes (rounded sizes)
    size_t flushes = 0;  // backend refusals answered by handing the cached blocks back
    size_t blocks = 0;   // backend allocations held now (in use or cached)
  };

  BlockPool(Malloc m, Free f) : malloc_(std::move(m)), free_fn_(std::move(f)) {}
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;
  ~BlockPool() = default;  // a process-lifetime pool: the driver reclaims its blocks at exit

  static size_t round_size(size_t bytes) {
    const size_t unit = bytes < (size_t{1} << 20) ? 512 : (size_t{2} << 20);
    return (bytes + unit - 1) / unit * unit;
  }

  // nullptr when even after a flush the backend refuses (the caller reports it).
  void* alloc(size_t bytes) {
    if (bytes == 0) return nullptr;
    const size_t size = round_size(bytes);
    void* p = nullptr;
    if (auto it = cached_.find(size); it != cached_.end()) {
      p = it->second;
      cached_.erase(it);
      stats_.cached -= size;
    } else {
      p = malloc_(size);
      if (!p && !cached_.empty()) {
        ++stats_.flushes;
        release_cached();
        p = malloc_(size);
      }
      if (!p) return nullptr;
      ++stats_.blocks;
    }
    live_[p] = size;
    stats_.in_use += size;
    stats_.peak = std::max(stats_.peak, stats_.in_use);
    return p;
  }

  // false when `ptr` is not a live block of this pool (nothing changes).
  bool free(void* ptr) {
    auto it = live_.find(ptr);
    if (it == live_.end()) return false;
    const size_t size = it->second;
    live_.erase(it);
    stats_.in_use -= size;
    cached_.emplace(size, ptr);
    stats_.cached += size;
    return true;
  }

  // Hands every cached block back to the backend.
  void release_cached() {
    for (auto& [size, p] : cached_) {
      free_fn_(p);
      --stats_.blocks;
    }
    cached_.clear();
    stats_.cached = 0;
  }

  void reset_peak() { stats_.peak = stats_.in_use; }
  const Stats& stats() const { return stats_; }

 private:
  Malloc malloc_;
  Free free_fn_;
  std::unordered_map<void*, size_t> live_;  // blocks in use: size by address
  std::multimap<size_t, void*> cached_;     // free blocks by size
  Stats stats_;
};

}  // namespace cai::kernels
