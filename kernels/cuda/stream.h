// RAII handles for CUDA streams and events. Creation errors throw cai::CudaError naming the
// failing call (CAI_CUDA_CHECK); destructors never throw. A handle belongs to the device that was
// current when it was created.
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "kernels/cuda/check.h"

namespace cai::cuda {

class Stream {
 public:
  // cudaStreamNonBlocking: no implicit synchronisation with the legacy default stream, on which
  // the kernels run; ordering against it goes through events.
  explicit Stream(unsigned flags = cudaStreamNonBlocking) {
    CAI_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, flags));
  }
  ~Stream() {
    if (s_) cudaStreamDestroy(s_);
  }
  Stream(Stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  Stream& operator=(Stream&& o) noexcept {
    if (this != &o) {
      if (s_) cudaStreamDestroy(s_);
      s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t get() const { return s_; }
  // Later work on this stream waits for everything recorded in `e` (no host block).
  void wait(cudaEvent_t e) const { CAI_CUDA_CHECK(cudaStreamWaitEvent(s_, e, 0)); }
  bool idle() const {
    const cudaError_t r = cudaStreamQuery(s_);
    if (r == cudaErrorNotReady) return false;
    CAI_CUDA_CHECK(r);
    return true;
  }

 private:
  cudaStream_t s_ = nullptr;
};

class Event {
 public:
  // Timing off: recording and querying stay cheap.
  explicit Event(unsigned flags = cudaEventDisableTiming) {
    CAI_CUDA_CHECK(cudaEventCreateWithFlags(&e_, flags));
  }
  ~Event() {
    if (e_) cudaEventDestroy(e_);
  }
  Event(Event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  Event& operator=(Event&& o) noexcept {
    if (this != &o) {
      if (e_) cudaEventDestroy(e_);
      e_ = std::exchange(o.e_, nullptr);
    }
    return *this;
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  cudaEvent_t get() const { return e_; }
  void record(cudaStream_t s) { CAI_CUDA_CHECK(cudaEventRecord(e_, s)); }
  // True once the work recorded before it has completed; throws on a device error.
  bool query() const {
    const cudaError_t r = cudaEventQuery(e_);
    if (r == cudaErrorNotReady) return false;
    CAI_CUDA_CHECK(r);
    return true;
  }
  void synchronize() const { CAI_CUDA_CHECK(cudaEventSynchronize(e_)); }

 private:
  cudaEvent_t e_ = nullptr;
};

}  // namespace cai::cuda
