// The caching pool behind the device allocator (kernels/cuda/device.cu), in plain C++ so that its
// bookkeeping is tested on any machine (tests/core/test_block_pool.cpp) with a fake backend.
//
// Requests round up to 512 bytes below 1 MiB and to 2 MiB above. A freed block stays cached and a
// request of exactly its size takes it back, so a training step makes no backend call. A size not
// cached goes to the backend (cudaMalloc: one segment per call). When the backend refuses (the
// device near its capacity), the smallest cached block at least as large is split: the request
// takes its front, the rest stays cached as a block of its own, and a freed block merges with
// free neighbours of its segment. Only when no cached block is large enough are the cached whole
// segments handed back to the backend and the request retried (a flush: on a GPU it synchronises
// the device). Not thread-safe: the caller locks.
#pragma once
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <unordered_map>
#include <utility>

namespace cai::kernels {

class BlockPool {
 public:
  using Malloc = std::function<void*(size_t)>;  // nullptr when the backend refuses
  using Free = std::function<void(void*)>;
  struct Stats {
    size_t in_use = 0, cached = 0, peak = 0;  // bytes (rounded sizes)
    size_t flushes = 0;   // backend refusals answered by handing the cached segments back
    size_t splits = 0;    // backend refusals answered by a part of a larger cached block
    size_t segments = 0;  // backend allocations held now
  };

  BlockPool(Malloc m, Free f) : malloc_(std::move(m)), free_fn_(std::move(f)) {}
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;
  ~BlockPool() = default;  // a process-lifetime pool: the driver reclaims its segments at exit

  static size_t round_size(size_t bytes) {
    const size_t unit = bytes < (size_t{1} << 20) ? 512 : (size_t{2} << 20);
    return (bytes + unit - 1) / unit * unit;
  }

  // nullptr when even after a flush the backend refuses (the caller reports it).
  void* alloc(size_t bytes) {
    if (bytes == 0) return nullptr;
    const size_t size = round_size(bytes);
    Block* b = nullptr;
    if (auto it = cached_.find(size); it != cached_.end()) {
      b = it->second;
      uncache(b);
    } else if (void* p = malloc_(size)) {
      b = new_segment(p, size);
    } else if (auto fit = cached_.lower_bound(size); fit != cached_.end()) {
      b = fit->second;
      uncache(b);
      split(b, size);
      ++stats_.splits;
    } else {
      ++stats_.flushes;
      release_cached();
      void* p = malloc_(size);
      if (!p) return nullptr;
      b = new_segment(p, size);
    }
    stats_.in_use += b->size;
    stats_.peak = std::max(stats_.peak, stats_.in_use);
    return b->ptr;
  }

  // false when `ptr` is not a live block of this pool (nothing changes).
  bool free(void* ptr) {
    auto it = blocks_.find(ptr);
    if (it == blocks_.end() || it->second->free) return false;
    Block* b = it->second.get();
    stats_.in_use -= b->size;
    if (b->next && b->next->free) {
      uncache(b->next);
      absorb(b, b->next);
    }
    if (b->prev && b->prev->free) {
      Block* a = b->prev;
      uncache(a);
      absorb(a, b);
      b = a;
    }
    cache(b);
    return true;
  }

  // Hands every cached whole segment back to the backend; cached parts of segments in use stay.
  void release_cached() {
    for (auto it = cached_.begin(); it != cached_.end();) {
      Block* b = it->second;
      if (b->prev || b->next) {
        ++it;
        continue;
      }
      void* const p = b->ptr;
      stats_.cached -= b->size;
      it = cached_.erase(it);
      blocks_.erase(p);
      free_fn_(p);
      --stats_.segments;
    }
  }

  void reset_peak() { stats_.peak = stats_.in_use; }
  const Stats& stats() const { return stats_; }

 private:
  struct Block {
    char* ptr = nullptr;
    size_t size = 0;
    bool free = false;      // free blocks, and only they, are in cached_ (at `where`)
    Block* prev = nullptr;  // neighbours in the same segment (null at its ends)
    Block* next = nullptr;
    std::multimap<size_t, Block*>::iterator where;
  };

  Block* new_segment(void* p, size_t size) {
    auto b = std::make_unique<Block>();
    b->ptr = static_cast<char*>(p);
    b->size = size;
    Block* raw = b.get();
    blocks_.emplace(p, std::move(b));
    ++stats_.segments;
    return raw;
  }
  // `b` (taken from the cache) keeps its first `size` bytes; the rest becomes a cached block.
  void split(Block* b, size_t size) {
    if (b->size == size) return;
    auto rest = std::make_unique<Block>();
    rest->ptr = b->ptr + size;
    rest->size = b->size - size;
    rest->prev = b;
    rest->next = b->next;
    if (b->next) b->next->prev = rest.get();
    b->next = rest.get();
    b->size = size;
    Block* raw = rest.get();
    blocks_.emplace(raw->ptr, std::move(rest));
    cache(raw);
  }
  // a takes in its next neighbour b (neither cached).
  void absorb(Block* a, Block* b) {
    a->size += b->size;
    a->next = b->next;
    if (b->next) b->next->prev = a;
    void* const gone = b->ptr;
    blocks_.erase(gone);
  }
  void cache(Block* b) {
    b->free = true;
    b->where = cached_.emplace(b->size, b);
    stats_.cached += b->size;
  }
  void uncache(Block* b) {
    cached_.erase(b->where);
    b->free = false;
    stats_.cached -= b->size;
  }

  Malloc malloc_;
  Free free_fn_;
  std::unordered_map<void*, std::unique_ptr<Block>> blocks_;  // every block, by address
  std::multimap<size_t, Block*> cached_;                      // free blocks by size
  Stats stats_;
};

}  // namespace cai::kernels
