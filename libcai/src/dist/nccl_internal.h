// Internal to libcai/src/dist: the NCCL communicator's channel machinery (split from
// nccl_communicator.cpp, whose file comment describes the design): the NCCL type mappings, a
// Channel (one NCCL communicator and its stream), the Watchdog that polls channels and aborts
// them on an NCCL error or a timeout, the bounded ncclCommInitRank, the Work handle, and the
// peer regions of the copy-engine all-reduce and the gradient exchange. Included by
// nccl_communicator.cpp only (CUDA builds). Not installed.
#pragma once

#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "cai/core/error.h"
#include "cai/dist/abort_gate.h"
#include "cai/dist/nccl.h"
#include "cai/dist/stall_monitor.h"
#include "cai/schedule/buckets.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/p2p.h"
#include "kernels/cuda/stream.h"
#include "kernels/device.h"

namespace cai::dist::detail {

inline ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32:
      return ncclFloat32;
    case DType::BF16:
      return ncclBfloat16;
    case DType::F16:
      return ncclFloat16;
    case DType::I32:
      return ncclInt32;
  }
  return ncclFloat32;
}

inline ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return ncclSum;
    case ReduceOp::Max:
      return ncclMax;
    case ReduceOp::Min:
      return ncclMin;
  }
  return ncclSum;
}

inline void activate(int device) {
  CAI_CUDA_CHECK(cudaSetDevice(device));
}

// Bounded host wait for a predicate (event or stream query); false on timeout.
template <typename Done>
bool poll(Done done, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int spins = 0;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    if (++spins > 2000)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    else
      std::this_thread::yield();
  }
  return true;
}

// One NCCL communicator and the stream its operations run on. Shared by the communicator, its
// outstanding Work handles and its watchdog.
struct Channel {
  Channel(int dev, double timeout_s, std::string label)
      : device((activate(dev), dev)), timeout(timeout_s), label(std::move(label)) {}
  ~Channel() {
    if (!comm || !gate.live()) return;  // an aborted communicator is gone already
    cudaSetDevice(device);
    // Destroying with operations in flight would block on them: abort what does not finish.
    bool idle = false;
    try {
      idle = poll([&] { return stream.idle(); }, timeout);
    } catch (const Error&) {
    }
    if (idle)
      ncclCommDestroy(comm);
    else
      ncclCommAbort(comm);
  }
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  // Aborts the NCCL communicator once (the watchdog and the host may both get here), after any
  // operation being issued on it (AbortGate); `why` becomes the error every later use reports.
  void abort(const std::string& why) {
    gate.abort(
        why,
        [this] {
          if (comm) ncclCommAbort(comm);
        },
        std::min(timeout, kDrainSeconds));
  }
  bool aborted() const { return !gate.live(); }
  std::string why() const { return gate.why(); }
  // An asynchronous NCCL error on this communicator ("" when none); never during the abort.
  std::string async_error() {
    return gate.with_live<std::string>(
        [&]() -> std::string {
          if (!comm) return "";
          ncclResult_t e = ncclSuccess;
          if (ncclCommGetAsyncError(comm, &e) != ncclSuccess || e == ncclSuccess ||
              e == ncclInProgress)
            return "";
          return ncclGetErrorString(e);
        },
        std::string());
  }
  // How long an abort waits for an operation being issued: enqueueing takes microseconds, so
  // a host thread still inside NCCL after this is blocked on a peer.
  static constexpr double kDrainSeconds = 5.0;
  // Operations in flight, for the watchdog: completion event, deadline, description.
  struct InFlight {
    std::shared_ptr<cuda::Event> done;
    std::chrono::steady_clock::time_point deadline;
    std::string what;
  };
  void track(std::shared_ptr<cuda::Event> done, const std::string& what) {
    std::lock_guard<std::mutex> l(mu);
    in_flight.push_back(
        {std::move(done),
         std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                std::chrono::duration<double>(timeout)),
         what});
  }

  int device;
  double timeout;
  std::string label;          // "group 'tp[dp=0,pp=0]' (rank 1 of 2)"
  cuda::Stream stream;        // created on `device` (made current above)
  ncclComm_t comm = nullptr;  // set once, before the channel is shared; freed by the abort
  bool copy_engine = false;   // the copy-engine all-reduce's channel: no NCCL communicator
  AbortGate gate;
  std::mutex mu;  // in_flight
  std::deque<InFlight> in_flight;
};

// Polls a communicator's channels until stopped (see the file comment). Its thread makes the
// communicator's device current before anything else: a thread's CUDA calls (the event queries,
// an event's destruction) otherwise go to device 0, whose primary context the first of them
// creates; on 4 H100 ranks 1-3 each held 1,118 MiB on GPU 0 that way.
class Watchdog {
 public:
  explicit Watchdog(int device) : device_(device), thread_([this] { loop(); }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void watch(const std::shared_ptr<Channel>& ch) {
    std::lock_guard<std::mutex> l(mu_);
    channels_.push_back(ch);
    // A round of this loop takes milliseconds, an abort at most the drain limit plus
    // ncclCommAbort. Far past the collective timeout, the loop is held inside the driver by a
    // wedged device, and the process ends with a message instead of hanging (stall_monitor.h).
    if (!stall_)
      stall_ = std::make_unique<StallMonitor>(
          ch->timeout + Channel::kDrainSeconds + 30, "the NCCL watchdog of " + ch->label,
          [](const std::string& m) {
            std::fprintf(stderr,
                         "[nccl] %s: it is held inside a CUDA or NCCL call, so the device is "
                         "stuck (a kernel waiting for a peer that waits for this process); "
                         "ending this process so that the launcher ends the job\n",
                         m.c_str());
            std::fflush(stderr);
            std::abort();
          });
  }

 private:
  void loop() {
    // An error here shows again at the first CUDA call of a check, which aborts the channel.
    cudaSetDevice(device_);
    std::unique_lock<std::mutex> l(mu_);
    while (!stop_) {
      cv_.wait_for(l, std::chrono::milliseconds(100));
      if (stop_) break;
      std::vector<std::shared_ptr<Channel>> live;
      for (auto& w : channels_)
        if (auto ch = w.lock()) live.push_back(ch);
      l.unlock();
      for (auto& ch : live)
        if (check(*ch) && !aborted_at_) aborted_at_ = std::chrono::steady_clock::now();
      // After an abort the host thread gets the error at its next use of the communicator and
      // the app ends; a host thread held inside the device never gets there.
      if (aborted_at_ && std::chrono::steady_clock::now() - *aborted_at_ >
                             std::chrono::duration<double>(kAfterAbortSeconds)) {
        std::fprintf(stderr,
                     "[nccl] this process is still running %.0f s after its watchdog aborted a "
                     "communicator (reason above): the host thread is held inside the device; "
                     "ending the process so that the launcher ends the job\n",
                     kAfterAbortSeconds);
        std::fflush(stderr);
        std::abort();
      }
      l.lock();
      if (stall_) stall_->beat();
      channels_.erase(std::remove_if(channels_.begin(), channels_.end(),
                                     [](const std::weak_ptr<Channel>& w) { return w.expired(); }),
                      channels_.end());
    }
  }
  // Aborts the channel on an NCCL error or a late operation and says so at once on stderr (the
  // host thread may never come back to report it); true when it aborted it now.
  static bool check(Channel& ch) {
    if (ch.aborted()) return false;
    std::string why;
    const std::string e = ch.async_error();
    if (!e.empty()) {
      why = fmt::format("[nccl] {}: NCCL reported an error ({}); the communicator was aborted",
                        ch.label, e);
    } else {
      const auto now = std::chrono::steady_clock::now();
      std::string late;
      {
        std::lock_guard<std::mutex> l(ch.mu);
        while (!ch.in_flight.empty() && ch.in_flight.front().done->query())
          ch.in_flight.pop_front();
        for (const auto& f : ch.in_flight)
          if (now > f.deadline && !f.done->query()) {
            late = f.what;
            break;
          }
      }
      if (late.empty()) return false;
      why = fmt::format(
          "[nccl] {} did not complete within {} s: a peer has died or hung (the watchdog aborted "
          "the {}; set CAI_COLLECTIVE_TIMEOUT to change the limit)",
          late, ch.timeout, ch.copy_engine ? "copy-engine all-reduce" : "NCCL communicator");
    }
    std::fprintf(stderr, "%s\n", why.c_str());
    std::fflush(stderr);
    ch.abort(why);
    return true;
  }

  static constexpr double kAfterAbortSeconds = Channel::kDrainSeconds + 60;
  const int device_;  // before thread_: the thread reads it
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<std::weak_ptr<Channel>> channels_;
  std::unique_ptr<StallMonitor> stall_;                              // from the first channel on
  std::optional<std::chrono::steady_clock::time_point> aborted_at_;  // the watchdog's first abort
  std::thread thread_;
};

// ncclCommInitRank on a helper thread, bounded by the channel's timeout. On timeout the thread is
// left behind (blocked in NCCL until the process ends) and the error names the group and rank.
// max_ctas > 0: the communicator's kernels take at most that many thread blocks
// (ncclCommInitRankConfig, ncclConfig_t::maxCTAs).
inline void init_comm(Channel& ch, int nranks, const ncclUniqueId& id, int rank, int max_ctas = 0) {
  struct State {
    ncclComm_t comm = nullptr;
    ncclResult_t result = ncclSuccess;
    std::string cuda_error;
  };
  auto st = std::make_shared<State>();
  std::promise<void> done;
  auto fut = done.get_future();
  const int device = ch.device;
  // NCCL allocates its buffers with the driver, beside the caching pool: a communicator built at
  // the first collective of a step near the GPU's capacity found the memory held by the pool's
  // free blocks (6.4B ViT, dp 2 × ZeRO 1, plan 136.7 of 139 GiB on an H200: "Failed to CUDA
  // calloc"). The free blocks go back to the driver first (live tensors stay).
  kernels::cuda::empty_cache(device);
  std::thread t([st, id, nranks, rank, device, max_ctas, p = std::move(done)]() mutable {
    if (cudaSetDevice(device) != cudaSuccess) st->cuda_error = "cudaSetDevice failed";
    if (max_ctas > 0) {
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.minCTAs = 1;
      config.maxCTAs = max_ctas;
      st->result = ncclCommInitRankConfig(&st->comm, nranks, id, rank, &config);
    } else {
      st->result = ncclCommInitRank(&st->comm, nranks, id, rank);
    }
    p.set_value();
  });
  if (fut.wait_for(std::chrono::duration<double>(ch.timeout)) != std::future_status::ready) {
    t.detach();
    fail(
        "[nccl] initialising the NCCL communicator of {} did not finish within {} s: a peer did "
        "not join (it died or never reached this group's first collective); set "
        "CAI_COLLECTIVE_TIMEOUT to change the limit",
        ch.label, ch.timeout);
  }
  t.join();
  CAI_CHECK(st->cuda_error.empty() && st->result == ncclSuccess,
            "[nccl] ncclCommInitRank for {} failed: {}", ch.label,
            st->cuda_error.empty() ? ncclGetErrorString(st->result) : st->cuda_error);
  ch.comm = st->comm;
}

class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<Channel> ch, std::string what, double timeout)
      : done(std::make_shared<cuda::Event>()),
        ch_(std::move(ch)),
        what_(std::move(what)),
        timeout_(timeout) {}
  ~NcclWork() override {
    if (done_ || ch_->aborted() || (!ch_->comm && !ch_->copy_engine)) return;
    // Dropped before completion: the buffers must outlive the NCCL kernel.
    try {
      if (!poll([&] { return done->query() || ch_->aborted(); }, timeout_))
        ch_->abort(fmt::format("[nccl] {} was dropped unfinished after {} s", what_, timeout_));
    } catch (const Error&) {
    }
  }

  bool test() override {
    if (done_) return true;
    throw_if_aborted();
    const std::string e = ch_->async_error();
    if (!e.empty()) {
      ch_->abort(fmt::format("[nccl] {}: NCCL reported an error ({}); the communicator was aborted",
                             what_, e));
      throw_if_aborted();
    }
    done_ = done->query();
    if (done_) keep.clear();
    return done_;
  }
  void wait() override {
    if (poll([&] { return test(); }, timeout_)) return;
    ch_->abort(fmt::format(
        "[nccl] {} did not complete within {} s: a peer has died or hung (the {} was aborted; set "
        "CAI_COLLECTIVE_TIMEOUT to change the limit)",
        what_, timeout_, ch_->copy_engine ? "copy-engine all-reduce" : "NCCL communicator"));
    fail("{}", ch_->why());
  }

  void wait_on_device() override {
    throw_if_aborted();
    if (done_) return;
    activate(ch_->device);
    CAI_CUDA_CHECK(cudaStreamWaitEvent(cudaStreamLegacy, done->get(), 0));
    // Whatever reuses these buffers' memory from now on is issued later, on the compute stream
    // (ordered after this wait) or on a stream that first waits for it (NCCL operations, the
    // trainer's copies into new buffers): they need not stay allocated until the host sees the
    // completion. Tensor parallelism kept up to 16 activations alive this way (1.2 GB for
    // ViT-B/16 batch 256 on 2 GPUs, about the gap between its measured and planned peaks; not
    // re-measured on a GPU since).
    keep.clear();
  }

  std::shared_ptr<cuda::Event> done;  // recorded on the channel's stream after the NCCL call
  std::vector<Tensor> keep;           // user tensors and staging buffers, alive until completion

 private:
  void throw_if_aborted() {
    if (ch_->aborted())
      fail("[nccl] {}: the communicator was aborted earlier: {}", what_, ch_->why());
  }
  std::shared_ptr<Channel> ch_;
  std::string what_;
  double timeout_;
  bool done_ = false;
};

// A device region of this rank that every other rank of the group maps (CUDA IPC), starting
// with kFlagBytes of 32-bit flags that the peers raise with stream memory operations
// (kernels/cuda/p2p.h); the copy-engine all-reduce and the gradient exchange build on it.
// `seq` is the largest value a wait on this rank's flags may be waiting for: a stream still
// waiting when the region goes (a peer died) is released by raising every flag past it. `side`:
// a second stream for waits that must not queue behind the channel stream's copies.
struct PeerRegion {
  static constexpr int kMaxRanks = kernels::cuda::kMaxSumSources;
  static constexpr size_t kFlagBytes = 256;

  PeerRegion(int n_, int me_, size_t bytes, std::shared_ptr<Channel> channel)
      : n(n_), me(me_), ch(std::move(channel)) {
    CAI_CUDA_CHECK(cudaMalloc(&region, bytes));
    CAI_CUDA_CHECK(cudaMemset(region, 0, kFlagBytes));
    CAI_CUDA_CHECK(cudaDeviceSynchronize());
    peer.assign(n, nullptr);
  }
  ~PeerRegion() {
    cudaSetDevice(ch->device);
    bool idle = false;
    const auto both_idle = [&] { return ch->stream.idle() && side.idle(); };
    try {
      idle = poll(both_idle, 1.0);
    } catch (const Error&) {
    }
    if (!idle) {
      try {
        cuda::Stream aux;
        for (size_t i = 0; i < kFlagBytes / sizeof(uint32_t); ++i)
          kernels::cuda::stream_write_flag(aux.get(), flags(region) + i, seq + (1u << 30));
        poll(both_idle, 5.0);
      } catch (const Error&) {
      }
    }
    for (char* p : peer)
      if (p) cudaIpcCloseMemHandle(p);
    if (region) cudaFree(region);
  }
  PeerRegion(const PeerRegion&) = delete;
  PeerRegion& operator=(const PeerRegion&) = delete;

  static uint32_t* flags(void* base) { return static_cast<uint32_t*>(base); }
  static float* data(void* base) {
    return reinterpret_cast<float*>(static_cast<char*>(base) + kFlagBytes);
  }

  int n, me;
  std::shared_ptr<Channel> ch;
  cuda::Stream side;
  void* region = nullptr;
  std::vector<char*> peer;  // the other ranks' regions mapped here (nullptr for this rank)
  uint32_t seq = 0;
};

// The copy-engine all-reduce's state (Communicator::enable_copy_engine_all_reduce). Each rank's
// region holds:
//   flags:   push[r] (rank r has pushed its contribution to this rank's chunk), ready[r] (rank r
//            has summed its own chunk) for r < kMaxRanks, each the sequence number of the last
//            all-reduce that did so;
//   scratch: one slot of chunk_max floats per rank (rank r's contribution to this rank's chunk);
//   result:  this rank's chunk of the sum, which the others pull.
// A tensor of numel elements is cut into n chunks of round_up(ceil(numel / n), 64) elements (the
// last ones shorter or empty); rank r owns chunk r. One all-reduce, on the channel's stream:
// push the other ranks' chunks into their scratch slots (copy engine) and raise their push
// flags; wait for every push flag; sum the own chunk (contributions in rank order) into the
// tensor and the result region; raise every other rank's ready flag; for each other rank, wait
// for its ready flag and pull its chunk of the sum into the tensor. A single scratch and result
// region serves every operation: a rank pushes into a peer's scratch (or overwrites its own
// result) for operation k+1 only after its stream has finished operation k, whose last waits
// imply that every peer's stream has consumed what operation k left there.
struct CopyEngine : PeerRegion {
  CopyEngine(int n_, int me_, int64_t max_numel_, std::shared_ptr<Channel> channel)
      : PeerRegion(n_, me_, static_cast<size_t>(schedule::copy_engine_region_bytes(max_numel_, n_)),
                   std::move(channel)),
        max_numel(max_numel_),
        chunk_max(schedule::copy_engine_chunk(max_numel_, n_)) {}

  static float* scratch(void* base) { return data(base); }
  float* result(void* base) const { return scratch(base) + chunk_max * n; }

  void issue(float* x, int64_t numel, cudaStream_t s) {
    namespace kc = kernels::cuda;
    const uint32_t id = ++seq;
    const int64_t chunk = schedule::copy_engine_chunk(numel, n);
    auto off = [&](int r) { return std::min<int64_t>(r * chunk, numel); };
    auto count = [&](int r) { return std::min<int64_t>(chunk, numel - off(r)); };
    const size_t f = sizeof(float);
    for (int k = 1; k < n; ++k) {
      const int r = (me + k) % n;
      if (count(r) > 0)
        CAI_CUDA_CHECK(cudaMemcpyAsync(scratch(peer[r]) + me * chunk_max, x + off(r), count(r) * f,
                                       cudaMemcpyDeviceToDevice, s));
      kc::stream_write_flag(s, flags(peer[r]) + me, id);
    }
    for (int r = 0; r < n; ++r)
      if (r != me) kc::stream_wait_flag(s, flags(region) + r, id);
    const float* src[kMaxRanks];
    for (int r = 0; r < n; ++r) src[r] = r == me ? x + off(me) : scratch(region) + r * chunk_max;
    kc::sum_sources_f32(src, n, x + off(me), result(region), count(me), s);
    for (int r = 0; r < n; ++r)
      if (r != me) kc::stream_write_flag(s, flags(peer[r]) + kMaxRanks + me, id);
    for (int k = 1; k < n; ++k) {
      const int r = (me + k) % n;
      kc::stream_wait_flag(s, flags(region) + kMaxRanks + r, id);
      if (count(r) > 0)
        CAI_CUDA_CHECK(cudaMemcpyAsync(x + off(r), result(peer[r]), count(r) * f,
                                       cudaMemcpyDeviceToDevice, s));
    }
  }

  int64_t max_numel, chunk_max;
};

// The copy-engine gradient exchange's state (Communicator::enable_copy_engine_exchange). Each
// rank's region holds:
//   flags: arrive[r] (the pushes of rank r that have landed here, counted over every round) and
//          ended[r] (the rounds rank r has ended: it has read what this rank pushed there), for
//          r < kMaxRanks;
//   slots: numel floats for each other rank (rank r's slot is r below this rank, r - 1 above).
// On the channel's stream, in issue order: a push copies a range into every peer's slot for
// this rank (copy engine) and raises that peer's arrive flag to this rank's push count; a
// round's first push first waits for every peer's ended flag to reach the previous round (the
// peer has read its slots). The summed round's end waits for every peer's arrive flag to reach
// this rank's own push count (every rank pushes alike), sums each range in rank order in place
// (one kernel per range) and raises the peers' ended flags. A reader that sums as it reads waits
// for the arrivals on the side stream instead (not behind this rank's own last copies, which
// only the next zeroing of the gradients needs to see done) and ends the round on the channel's
// stream after its reads.
struct Exchange : PeerRegion {
  Exchange(int n_, int me_, int64_t numel_, std::shared_ptr<Channel> channel)
      : PeerRegion(n_, me_,
                   static_cast<size_t>(schedule::copy_engine_exchange_region_bytes(numel_, n_)),
                   std::move(channel)),
        numel(numel_) {}

  uint32_t* arrive(void* base) const { return flags(base); }
  uint32_t* ended(void* base) const { return flags(base) + kMaxRanks; }
  // Rank r's slot in rank q's region.
  float* slot(void* base, int r, int q) const {
    return data(base) + static_cast<int64_t>(r < q ? r : r - 1) * numel;
  }

  void push(const float* x, int64_t count, int64_t offset, cudaStream_t s) {
    namespace kc = kernels::cuda;
    if (!in_round) {
      for (int r = 0; r < n; ++r)
        if (r != me) kc::stream_wait_flag(s, ended(region) + r, rounds);
      in_round = true;
    }
    ++pushes;
    seq = std::max(pushes, rounds + 1);
    for (int k = 1; k < n; ++k) {
      const int r = (me + k) % n;
      if (count > 0)
        CAI_CUDA_CHECK(cudaMemcpyAsync(slot(peer[r], me, r) + offset, x, count * sizeof(float),
                                       cudaMemcpyDeviceToDevice, s));
      kc::stream_write_flag(s, arrive(peer[r]) + me, pushes);
    }
  }

  // Waits until every peer's pushes of the round have landed here.
  void arrivals(cudaStream_t s) {
    for (int r = 0; r < n; ++r)
      if (r != me) kernels::cuda::stream_wait_flag(s, arrive(region) + r, pushes);
  }
  // The peers may push the next round.
  void end(cudaStream_t s) {
    ++rounds;
    seq = std::max(pushes, rounds + 1);
    in_round = false;
    for (int r = 0; r < n; ++r)
      if (r != me) kernels::cuda::stream_write_flag(s, ended(peer[r]) + me, rounds);
  }
  void end_round(const std::vector<std::pair<float*, int64_t>>& ranges,
                 const std::vector<int64_t>& offsets, cudaStream_t s) {
    arrivals(s);
    for (size_t i = 0; i < ranges.size(); ++i) {
      const float* src[kMaxRanks];
      for (int r = 0; r < n; ++r)
        src[r] = r == me ? ranges[i].first : slot(region, r, me) + offsets[i];
      kernels::cuda::sum_sources_f32(src, n, ranges[i].first, nullptr, ranges[i].second, s);
    }
    end(s);
  }

  int64_t numel;
  uint32_t pushes = 0, rounds = 0;
  bool in_round = false;
};

}  // namespace cai::dist::detail
