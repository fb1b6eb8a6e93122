// Internal to libcai/src/parallel: the host side of ZeRO-Offload (DataParallelConfig::cpu_offload)
// for DataParallelPlugin. Not installed.
//
// Download (stage 2/3, every micro-batch): each gradient bucket's reduced chunk (this rank's part
// of its reduce-scatter, fp32, on the parameters' device) is copied into one of two page-locked
// staging buffers on a copy stream as soon as the bucket completes, and a host thread adds it into
// the fp32 gradient shards in host memory. The device chunk is released once its copy is done, so
// the GPU never holds a gradient shard of the whole model: at most the buckets in flight plus the
// two being copied. The compute stream does not wait for any of it.
// Upload (after the host optimizer step): the updated fp32 shard values are cast to the device
// copy's dtype (bf16 for the weights under bf16 mixed precision) by the host threads into two
// page-locked staging buffers in turn and copied to the device on the copy stream, chunk by chunk;
// the compute stream waits for each chunk's copy before anything after it (the parameter gathers)
// reads it.
//
// On the CPU (parameters in host memory: the tests) there is no copy stream: the "copy" is a
// memcpy into the staging buffer on the calling thread, and the same host thread, queue and
// staging rotation add it; the arithmetic (dst[k] += src[k], element by element) is add_spans'
// host reference, so results equal the plugin's path without offload bit for bit.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "cai/core/tensor.h"

namespace cai::parallel::detail {

class OffloadLane {
 public:
  // An add of `n` elements from offset `src_offset` of a pushed chunk into host tensor `dst`
  // (fp32) from element `dst_offset`; assign: a copy instead (the first chunk of a step: no
  // zeroing pass over the host gradients).
  // sq / bad (may be null): the result's sum of squares and inf/NaN count written there, summed
  // as the clip's statistics sum a tensor (kernels::cpu::add_with_squares): the last
  // micro-batch's adds give the clip its figures without another pass over the gradients.
  struct Add {
    Tensor dst;
    int64_t dst_offset = 0;
    int64_t src_offset = 0;
    int64_t n = 0;
    bool assign = false;
    double* sq = nullptr;
    int64_t* bad = nullptr;
  };
  // device: where the chunks come from and the uploads go; max_elements: the largest chunk (the
  // staging buffers' size).
  OffloadLane(Device device, int64_t max_elements);
  ~OffloadLane();  // finishes what is queued (errors then are dropped: call flush() to see them)
  OffloadLane(const OffloadLane&) = delete;
  OffloadLane& operator=(const OffloadLane&) = delete;

  // Queues chunk (fp32, contiguous, on the device, at most max_elements) to be added into host
  // memory by `adds`. The chunk is held until its copy has completed; the caller may drop its own
  // reference at once. Its producer must be ordered before the copy on the compute stream (GPU:
  // the copy stream waits for the compute stream's work issued so far).
  void push(const Tensor& chunk, std::vector<Add> adds);
  // Returns once every pushed chunk's adds are done (and rethrows the host thread's error).
  void flush();
  // dst[dst_offset, + n) = src[src_offset, + n) cast to dst's dtype (fp32, bf16 or fp16; round
  // to nearest even, as Tensor::to), in chunks of at most
  // max_elements: src fp32 in host memory, dst on the device. GPU: asynchronous; the compute
  // stream waits for each chunk before its later work.
  void upload(const Tensor& src, int64_t src_offset, const Tensor& dst, int64_t dst_offset,
              int64_t n);

  // The host step's fused upload (bf16 device copies): between begin_staged(dst) and
  // end_staged(), stage(offset, n) returns where the caller writes dst[offset, + n) in dst's dtype
  // before its next call: a part of a staging buffer (page-locked on a GPU; on the CPU the copy
  // is a memcpy, as push()'s), or nullptr when n is more than a buffer holds (then upload() that
  // range). Ranges that
  // follow each other (increasing offsets, small gaps zeroed) share a buffer; a buffer goes to the
  // device on the copy stream once the next range does not fit, and at end_staged(), while the
  // caller goes on writing the next one. The compute stream waits for each copy before its later
  // work, as upload()'s.
  // send_staged(): the buffer being filled goes now (what is staged so far is on its way once it
  // returns; the next stage() starts a new buffer). Between begin_staged and end_staged the lane
  // may be driven from another thread than the one that began it (the host step beside the next
  // forward), one thread at a time.
  void begin_staged(const Tensor& dst);
  void* stage(int64_t offset, int64_t n);
  void send_staged();
  void end_staged();

  // Counters for tests and reports.
  int64_t chunks_pushed() const { return pushed_; }
  int64_t bytes_downloaded() const { return down_bytes_; }
  int64_t bytes_uploaded() const { return up_bytes_; }
  // The staging buffers' host bytes (page-locked on a GPU; on the CPU the upload's too).
  int64_t staging_bytes() const;

 private:
  struct Slot {
    Tensor staging;          // fp32, max_elements
    Tensor chunk;            // the device chunk being copied (held until the copy is done)
    void* copied = nullptr;  // GPU: the copy's completion event
    bool busy = false;       // queued for the host thread
  };
  struct Task {
    int slot = 0;
    std::vector<Add> adds;
  };
  void worker();
  Slot& acquire();  // the next slot in turn, once the host thread is done with it

  Device device_;
  int64_t max_ = 0;
  void* stream_ = nullptr;   // GPU: the copy stream
  void* ordered_ = nullptr;  // GPU: marks the compute stream's work issued so far
  std::vector<Slot> slots_;
  int next_ = 0;
  // Upload staging (fp32-sized, holding either dtype) and its events (GPU), used in turn.
  std::vector<Tensor> up_staging_;
  std::vector<void*> up_done_;
  std::vector<bool> up_used_;
  int up_next_ = 0;
  int up_slot();             // the next upload staging buffer, once its last copy has left
  Tensor staged_dst_;        // begin_staged's destination (undefined: none)
  int staged_slot_ = -1;     // the buffer being filled (-1: none)
  int64_t staged_base_ = 0;  // dst's element offset at the buffer's start
  int64_t staged_end_ = 0;   // one past the last element staged in it

  std::mutex m_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;

  int64_t pushed_ = 0, down_bytes_ = 0, up_bytes_ = 0;
};

}  // namespace cai::parallel::detail
