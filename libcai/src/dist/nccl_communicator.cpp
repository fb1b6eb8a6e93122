// NCCL backend of the Communicator (see cai/dist/nccl.h). Built only with CUDA; nccl_stub.cpp
// stands in otherwise.
//
// Streams: every NCCL communicator here has its own non-blocking stream. The kernels run on the
// legacy default stream, which a non-blocking stream does not synchronise with, so each
// operation first makes the communication stream wait for an event recorded on the default
// stream (everything issued so far, e.g. the backward kernels that produced a gradient bucket)
// and the compute stream keeps going while NCCL runs: that is the DDP overlap. Buffers stay
// referenced by the Work until its completion event has been seen, because the caching
// allocator knows no streams and would hand a freed block to the next kernel at once.
//
// Faults: a watchdog thread per communicator polls every channel's ncclCommGetAsyncError and the
// completion events of the operations in flight; an NCCL error, or an operation still running
// past the collective timeout, aborts the channel's NCCL communicator (its kernels return, so no
// device synchronisation hangs) and records why, naming the operation, the group and the rank;
// the next test(), wait() or operation on it throws that message. The hand-off is an AbortGate
// (cai/dist/abort_gate.h): operations are issued inside a Use of the channel's gate, so
// ncclCommAbort runs once, never while the host thread is inside an NCCL call on that
// communicator (unless that call has been blocked past the drain limit: then the abort is what
// unblocks it), and every later use throws the recorded reason. ncclCommInitRank runs on a
// helper thread, bounded by the same timeout (a peer that never joins is named instead of
// hanging the job).
//
// Point to point: one 2-rank NCCL communicator and stream per declared (source, destination)
// pair. On a single NCCL communicator every operation is serialised, so a send of a large
// activation could wait for a receive that the peer has queued behind its own send of a
// gradient in the other direction (deadlock); per-direction channels rule that out.
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "cai/core/error.h"
#include "cai/dist/abort_gate.h"
#include "cai/dist/nccl.h"
#include "cai/schedule/buckets.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/p2p.h"
#include "kernels/cuda/stream.h"
#include "kernels/device.h"

namespace cai::dist {

namespace {

ncclDataType_t nccl_type(DType t) {
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

ncclRedOp_t nccl_op(ReduceOp op) {
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

void activate(int device) {
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

// Polls a communicator's channels until stopped (see the file comment).
class Watchdog {
 public:
  Watchdog() : thread_([this] { loop(); }) {}
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
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> l(mu_);
    while (!stop_) {
      cv_.wait_for(l, std::chrono::milliseconds(100));
      if (stop_) break;
      std::vector<std::shared_ptr<Channel>> live;
      for (auto& w : channels_)
        if (auto ch = w.lock()) live.push_back(ch);
      l.unlock();
      for (auto& ch : live) check(*ch);
      l.lock();
      channels_.erase(std::remove_if(channels_.begin(), channels_.end(),
                                     [](const std::weak_ptr<Channel>& w) { return w.expired(); }),
                      channels_.end());
    }
  }
  static void check(Channel& ch) {
    if (ch.aborted()) return;
    const std::string e = ch.async_error();
    if (!e.empty()) {
      ch.abort(fmt::format("[nccl] {}: NCCL reported an error ({}); the communicator was aborted",
                           ch.label, e));
      return;
    }
    const auto now = std::chrono::steady_clock::now();
    std::string late;
    {
      std::lock_guard<std::mutex> l(ch.mu);
      while (!ch.in_flight.empty() && ch.in_flight.front().done->query()) ch.in_flight.pop_front();
      for (const auto& f : ch.in_flight)
        if (now > f.deadline && !f.done->query()) {
          late = f.what;
          break;
        }
    }
    if (!late.empty())
      ch.abort(fmt::format(
          "[nccl] {} did not complete within {} s: a peer has died or hung (the watchdog aborted "
          "the {}; set CAI_COLLECTIVE_TIMEOUT to change the limit)",
          late, ch.timeout, ch.copy_engine ? "copy-engine all-reduce" : "NCCL communicator"));
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<std::weak_ptr<Channel>> channels_;
  std::thread thread_;
};

// ncclCommInitRank on a helper thread, bounded by the channel's timeout. On timeout the thread is
// left behind (blocked in NCCL until the process ends) and the error names the group and rank.
void init_comm(Channel& ch, int nranks, const ncclUniqueId& id, int rank) {
  struct State {
    ncclComm_t comm = nullptr;
    ncclResult_t result = ncclSuccess;
    std::string cuda_error;
  };
  auto st = std::make_shared<State>();
  std::promise<void> done;
  auto fut = done.get_future();
  const int device = ch.device;
  std::thread t([st, id, nranks, rank, device, p = std::move(done)]() mutable {
    if (cudaSetDevice(device) != cudaSuccess) st->cuda_error = "cudaSetDevice failed";
    st->result = ncclCommInitRank(&st->comm, nranks, id, rank);
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

constexpr int64_t kWarmUpElements = 1 << 16;
constexpr int kIdWords = static_cast<int>(sizeof(ncclUniqueId) / sizeof(int32_t));
static_assert(sizeof(ncclUniqueId) % sizeof(int32_t) == 0);

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(Communicator* host, std::unique_ptr<Communicator> owned, int device)
      : owned_(std::move(owned)), host_(owned_ ? owned_.get() : host), device_(device) {
    CAI_CHECK(host_, "[nccl] needs a CPU communicator to build on");
    const int n = kernels::cuda::device_count();
    CAI_CHECK(device >= 0 && device < n, "[nccl] CUDA device {} does not exist ({} visible)",
              device, n);
    timeout_ = host_->timeout();
    activate(device_);
    ready_ = std::make_unique<cuda::Event>();
  }

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::string name() const override { return host_->name(); }
  bool supports(Device d) const override { return !d.is_cuda() || d.index == device_; }

  std::unique_ptr<Work> all_reduce_async(Tensor& t, ReduceOp op) override {
    if (!t.is_cuda()) return host_->all_reduce_async(t, op);
    on_device(t, "all_reduce");
    auto ch = collective_channel();
    return launch(ch, describe("all_reduce", t.numel()), {t}, [&](cudaStream_t s) {
      CAI_CUDA_CHECK(ncclAllReduce(t.raw(), t.raw(), static_cast<size_t>(t.numel()),
                                   nccl_type(t.dtype()), nccl_op(op), ch->comm, s));
    });
  }

  std::unique_ptr<Work> reduce_scatter_async(const Tensor& in, Tensor& out,
                                             const std::vector<int64_t>& counts,
                                             ReduceOp op) override {
    if (!in.is_cuda() && !out.is_cuda()) return host_->reduce_scatter_async(in, out, counts, op);
    on_device(in, "reduce_scatter");
    on_device(out, "reduce_scatter");
    check_counts("reduce_scatter", in, out, counts);
    auto ch = collective_channel();
    const int64_t most = *std::max_element(counts.begin(), counts.end());
    const bool even =
        std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == most; });
    const size_t es = dtype_size(in.dtype());
    const ncclDataType_t type = nccl_type(in.dtype());
    std::vector<Tensor> keep{in, out};
    if (even) {
      return launch(ch, describe("reduce_scatter", in.numel()), keep, [&](cudaStream_t s) {
        CAI_CUDA_CHECK(ncclReduceScatter(in.raw(), out.raw(), static_cast<size_t>(most), type,
                                         nccl_op(op), ch->comm, s));
      });
    }
    // Uneven: every rank's block padded to the largest count (the padding's sums are dropped).
    const int n = size();
    Tensor staged_in = Tensor::empty({n * most}, in.dtype(), in.device());
    Tensor staged_out = Tensor::empty({most}, in.dtype(), in.device());
    keep.push_back(staged_in);
    keep.push_back(staged_out);
    return launch(ch, describe("reduce_scatter", in.numel()), keep, [&](cudaStream_t s) {
      const char* src = static_cast<const char*>(in.raw());
      char* dst = static_cast<char*>(staged_in.raw());
      int64_t off = 0;
      for (int r = 0; r < n; ++r) {
        if (counts[r] > 0)
          CAI_CUDA_CHECK(cudaMemcpyAsync(dst + r * most * es, src + off * es, counts[r] * es,
                                         cudaMemcpyDeviceToDevice, s));
        off += counts[r];
      }
      CAI_CUDA_CHECK(ncclReduceScatter(staged_in.raw(), staged_out.raw(), static_cast<size_t>(most),
                                       type, nccl_op(op), ch->comm, s));
      if (counts[rank()] > 0)
        CAI_CUDA_CHECK(cudaMemcpyAsync(out.raw(), staged_out.raw(), counts[rank()] * es,
                                       cudaMemcpyDeviceToDevice, s));
    });
  }

  std::unique_ptr<Work> all_gather_async(const Tensor& in, Tensor& out,
                                         const std::vector<int64_t>& counts) override {
    if (!in.is_cuda() && !out.is_cuda()) return host_->all_gather_async(in, out, counts);
    on_device(in, "all_gather");
    on_device(out, "all_gather");
    check_counts("all_gather", out, in, counts);
    auto ch = collective_channel();
    const int64_t most = *std::max_element(counts.begin(), counts.end());
    const bool even =
        std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == most; });
    const size_t es = dtype_size(in.dtype());
    const ncclDataType_t type = nccl_type(in.dtype());
    std::vector<Tensor> keep{in, out};
    if (even) {
      return launch(ch, describe("all_gather", out.numel()), keep, [&](cudaStream_t s) {
        CAI_CUDA_CHECK(
            ncclAllGather(in.raw(), out.raw(), static_cast<size_t>(most), type, ch->comm, s));
      });
    }
    const int n = size();
    Tensor staged_in = Tensor::empty({most}, in.dtype(), in.device());
    Tensor staged_out = Tensor::empty({n * most}, in.dtype(), in.device());
    keep.push_back(staged_in);
    keep.push_back(staged_out);
    return launch(ch, describe("all_gather", out.numel()), keep, [&](cudaStream_t s) {
      if (counts[rank()] > 0)
        CAI_CUDA_CHECK(cudaMemcpyAsync(staged_in.raw(), in.raw(), counts[rank()] * es,
                                       cudaMemcpyDeviceToDevice, s));
      CAI_CUDA_CHECK(ncclAllGather(staged_in.raw(), staged_out.raw(), static_cast<size_t>(most),
                                   type, ch->comm, s));
      const char* src = static_cast<const char*>(staged_out.raw());
      char* dst = static_cast<char*>(out.raw());
      int64_t off = 0;
      for (int r = 0; r < n; ++r) {
        if (counts[r] > 0)
          CAI_CUDA_CHECK(cudaMemcpyAsync(dst + off * es, src + r * most * es, counts[r] * es,
                                         cudaMemcpyDeviceToDevice, s));
        off += counts[r];
      }
    });
  }

  std::unique_ptr<Work> broadcast_async(Tensor& t, int root) override {
    if (!t.is_cuda()) return host_->broadcast_async(t, root);
    on_device(t, "broadcast");
    CAI_CHECK(root >= 0 && root < size(), "[nccl] broadcast root {} outside group '{}' of {}", root,
              name(), size());
    auto ch = collective_channel();
    return launch(ch, describe("broadcast", t.numel()), {t}, [&](cudaStream_t s) {
      CAI_CUDA_CHECK(ncclBroadcast(t.raw(), t.raw(), static_cast<size_t>(t.numel()),
                                   nccl_type(t.dtype()), root, ch->comm, s));
    });
  }

  std::unique_ptr<Work> send_async(const Tensor& t, int peer, int tag) override {
    if (!t.is_cuda()) return host_->send_async(t, peer, tag);
    on_device(t, "send");
    auto ch = p2p_channel("send", rank(), peer);
    return launch(ch, describe(fmt::format("send to {} (tag {})", peer, tag), t.numel()), {t},
                  [&](cudaStream_t s) {
                    CAI_CUDA_CHECK(ncclSend(t.raw(), static_cast<size_t>(t.numel()),
                                            nccl_type(t.dtype()), 1, ch->comm, s));
                  });
  }

  std::unique_ptr<Work> recv_async(Tensor& t, int peer, int tag) override {
    if (!t.is_cuda()) return host_->recv_async(t, peer, tag);
    on_device(t, "recv");
    auto ch = p2p_channel("recv", peer, rank());
    return launch(ch, describe(fmt::format("recv from {} (tag {})", peer, tag), t.numel()), {t},
                  [&](cudaStream_t s) {
                    CAI_CUDA_CHECK(ncclRecv(t.raw(), static_cast<size_t>(t.numel()),
                                            nccl_type(t.dtype()), 0, ch->comm, s));
                  });
  }

  void barrier() override {
    if (size() == 1) return;
    auto ch = collective_channel();
    Tensor one = Tensor::zeros({1}, DType::F32, Device::cuda(device_));
    launch(ch, describe("barrier", 0), {one}, [&](cudaStream_t s) {
      CAI_CUDA_CHECK(ncclAllReduce(one.raw(), one.raw(), 1, ncclFloat32, ncclSum, ch->comm, s));
    })->wait();
  }

  // A host value (the trainer's metrics, the fp16 overflow vote): the CPU communicator reduces
  // it in doubles, exactly, with no device work (staged through the GPU it was a copy in,
  // NCCL's kernel, a copy out and a wait, several per read of the trainer's step values).
  double all_reduce_scalar(double v, ReduceOp op) override {
    return host_->all_reduce_scalar(v, op);
  }

  bool enable_copy_engine_all_reduce(int64_t max_numel) override {
    CAI_CHECK(max_numel > 0,
              "[nccl] enable_copy_engine_all_reduce on group '{}': max_numel {} "
              "must be positive",
              name(), max_numel);
    if (size() == 1) return false;
    if (copy_engine_) {
      CAI_CHECK(max_numel <= copy_engine_->max_numel,
                "[nccl] group '{}': the copy-engine all-reduce was enabled for {} elements, "
                "asked again for {}",
                name(), copy_engine_->max_numel, max_numel);
      return true;
    }
    copy_engine_ = open_peer_region<CopyEngine>("copy-engine all-reduce", max_numel);
    return copy_engine_ != nullptr;
  }

  std::unique_ptr<Work> copy_engine_all_reduce_async(Tensor& t) override {
    CAI_CHECK(copy_engine_,
              "[nccl] copy_engine_all_reduce_async on group '{}': not enabled "
              "(enable_copy_engine_all_reduce() returned false or was not called)",
              name());
    on_device(t, "copy_engine_all_reduce");
    CAI_CHECK(t.dtype() == DType::F32 && t.numel() <= copy_engine_->max_numel,
              "[nccl] copy_engine_all_reduce on group '{}': needs fp32 of at most {} elements "
              "(enabled for that), got {}",
              name(), copy_engine_->max_numel, t.str());
    auto& ch = copy_engine_->ch;
    CAI_CHECK(!ch->aborted(),
              "[nccl] group '{}' (rank {}): the copy-engine all-reduce was aborted: {}", name(),
              rank(), ch->why());
    return launch(ch, describe("copy-engine all_reduce", t.numel()), {t}, [&](cudaStream_t s) {
      copy_engine_->issue(static_cast<float*>(t.raw()), t.numel(), s);
    });
  }

  bool enable_copy_engine_exchange(int64_t numel) override {
    CAI_CHECK(numel > 0,
              "[nccl] enable_copy_engine_exchange on group '{}': numel {} must be positive", name(),
              numel);
    if (size() == 1) return false;
    if (exchange_) {
      CAI_CHECK(numel == exchange_->numel,
                "[nccl] group '{}': the copy-engine gradient exchange was enabled for {} "
                "elements, asked again for {}",
                name(), exchange_->numel, numel);
      return true;
    }
    exchange_ = open_peer_region<Exchange>("copy-engine exchange", numel);
    return exchange_ != nullptr;
  }

  std::unique_ptr<Work> exchange_push_async(const Tensor& t, int64_t offset) override {
    Exchange& ex = exchange("exchange_push_async");
    on_device(t, "exchange_push");
    CAI_CHECK(t.dtype() == DType::F32 && offset >= 0 && offset + t.numel() <= ex.numel,
              "[nccl] exchange_push on group '{}': needs fp32 elements within the {} enabled, "
              "got {} at offset {}",
              name(), ex.numel, t.str(), offset);
    return launch(
        ex.ch, describe("copy-engine exchange push", t.numel()), {t},
        [&](cudaStream_t s) { ex.push(static_cast<const float*>(t.raw()), t.numel(), offset, s); });
  }

  std::unique_ptr<Work> exchange_sum_async(const std::vector<Tensor>& ts,
                                           const std::vector<int64_t>& offsets) override {
    Exchange& ex = exchange("exchange_sum_async");
    CAI_CHECK(ts.size() == offsets.size(),
              "[nccl] exchange_sum on group '{}': {} tensors but {} offsets", name(), ts.size(),
              offsets.size());
    std::vector<std::pair<float*, int64_t>> ranges;
    int64_t total = 0;
    for (size_t i = 0; i < ts.size(); ++i) {
      on_device(ts[i], "exchange_sum");
      CAI_CHECK(
          ts[i].dtype() == DType::F32 && offsets[i] >= 0 && offsets[i] + ts[i].numel() <= ex.numel,
          "[nccl] exchange_sum on group '{}': needs fp32 elements within the {} enabled, "
          "got {} at offset {}",
          name(), ex.numel, ts[i].str(), offsets[i]);
      ranges.emplace_back(static_cast<float*>(ts[i].raw()), ts[i].numel());
      total += ts[i].numel();
    }
    return launch(ex.ch, describe("copy-engine exchange sum", total), ts,
                  [&](cudaStream_t s) { ex.end_round(ranges, offsets, s); });
  }

  std::unique_ptr<Work> exchange_wait_async() override {
    Exchange& ex = exchange("exchange_wait_async");
    activate(device_);
    const std::string what = describe("copy-engine exchange arrivals", ex.numel);
    ex.arrivals(ex.side.get());
    auto w = std::make_unique<NcclWork>(ex.ch, what, timeout_);
    w->done->record(ex.side.get());
    ex.ch->track(w->done, what);
    return w;
  }

  std::unique_ptr<Work> exchange_end_async() override {
    Exchange& ex = exchange("exchange_end_async");
    return launch(ex.ch, describe("copy-engine exchange end", ex.numel), {},
                  [&](cudaStream_t s) { ex.end(s); });
  }

  std::vector<const float*> exchange_received() override {
    Exchange& ex = exchange("exchange_received");
    std::vector<const float*> out(ex.n, nullptr);
    for (int r = 0; r < ex.n; ++r)
      if (r != ex.me) out[r] = ex.slot(ex.region, r, ex.me);
    return out;
  }

  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    // The CPU group splits first; its members then build their NCCL communicator from a fresh
    // unique id at their first collective.
    return std::make_unique<NcclCommunicator>(nullptr, host_->split(color, key, name), device_);
  }

  void connect_p2p(const std::vector<std::pair<int, int>>& pairs) override {
    std::vector<std::pair<int, int>> want;
    for (const auto& p : pairs) {
      CAI_CHECK(p.first >= 0 && p.first < size() && p.second >= 0 && p.second < size() &&
                    p.first != p.second,
                "[nccl] connect_p2p: ({} -> {}) is not a pair of distinct ranks of group '{}' "
                "({} ranks)",
                p.first, p.second, name(), size());
      if (std::find(want.begin(), want.end(), p) == want.end()) want.push_back(p);
    }
    std::sort(want.begin(), want.end());
    // Every rank must declare the same pairs: compare a checksum.
    double sum = 0;
    for (const auto& p : want) sum = std::fmod(sum * 131.0 + p.first * 1009.0 + p.second, 1e12);
    const double lo = host_->all_reduce_scalar(sum, ReduceOp::Min);
    const double hi = host_->all_reduce_scalar(sum, ReduceOp::Max);
    CAI_CHECK(lo == hi,
              "[nccl] connect_p2p on group '{}': the ranks declared different pairs (rank {} "
              "declared {})",
              name(), rank(), want.size());
    std::vector<std::pair<int, int>> fresh;
    for (const auto& p : want)
      if (!pairs_.count(p)) fresh.push_back(p);
    if (fresh.empty()) return;
    // The source of each new pair makes its unique id (and hosts its bootstrap root), every
    // rank learns all ids by one sum over the CPU group (the other slots are zeros); then, in
    // the same global order on every rank, each pair's two members build their 2-rank
    // communicator (a rank waits only for pairs earlier in that order: no deadlock).
    Tensor ids = Tensor::zeros({static_cast<int64_t>(fresh.size()) * kIdWords}, DType::I32);
    for (size_t i = 0; i < fresh.size(); ++i)
      if (fresh[i].first == rank()) {
        ncclUniqueId id;
        CAI_CUDA_CHECK(ncclGetUniqueId(&id));
        std::memcpy(ids.data<int32_t>() + i * kIdWords, &id, sizeof(id));
      }
    host_->all_reduce(ids, ReduceOp::Sum);
    for (size_t i = 0; i < fresh.size(); ++i) {
      const auto [src, dst] = fresh[i];
      if (rank() != src && rank() != dst) {
        pairs_[fresh[i]] = nullptr;  // declared, not ours
        continue;
      }
      ncclUniqueId id;
      std::memcpy(&id, ids.data<int32_t>() + i * kIdWords, sizeof(id));
      auto ch = std::make_shared<Channel>(device_, timeout_,
                                          fmt::format("group '{}' pair {} -> {} (rank {} of {})",
                                                      name(), src, dst, rank(), size()));
      init_comm(*ch, 2, id, rank() == src ? 0 : 1);
      watchdog().watch(ch);
      // NCCL connects a peer at its first send/recv, blocking the host until the peer's matching
      // call: do that now, while both members are at this pair, so that later sends return at
      // once whatever the peer is doing.
      Tensor warm = Tensor::zeros({kWarmUpElements}, DType::F32, Device::cuda(device_));
      launch(ch, describe(fmt::format("connect_p2p warm-up {} -> {}", src, dst), kWarmUpElements),
             {warm},
             [&](cudaStream_t s) {
               if (rank() == src)
                 CAI_CUDA_CHECK(ncclSend(warm.raw(), kWarmUpElements, ncclFloat32, 1, ch->comm, s));
               else
                 CAI_CUDA_CHECK(ncclRecv(warm.raw(), kWarmUpElements, ncclFloat32, 0, ch->comm, s));
             })
          ->wait();
      pairs_[fresh[i]] = ch;
    }
  }

 private:
  std::string describe(const std::string& op, int64_t n) const {
    return fmt::format("{} of {} elements on group '{}' ({} ranks, rank {})", op, n, name(), size(),
                       rank());
  }

  void on_device(const Tensor& t, const char* op) const {
    CAI_CHECK(t.is_cuda() && t.device().index == device_,
              "[nccl] {} on group '{}' needs tensors on cuda:{} (this communicator's device), "
              "got {}",
              op, name(), device_, t.str());
  }

  void check_counts(const char* op, const Tensor& whole, const Tensor& part,
                    const std::vector<int64_t>& counts) const {
    CAI_CHECK(static_cast<int>(counts.size()) == size(),
              "[nccl] {} needs {} counts for group '{}', got {}", op, size(), name(),
              counts.size());
    int64_t total = 0;
    for (int64_t c : counts) {
      CAI_CHECK(c >= 0, "[nccl] {} on group '{}': negative count {}", op, name(), c);
      total += c;
    }
    CAI_CHECK(
        whole.numel() == total && part.numel() == counts[rank()] && whole.dtype() == part.dtype(),
        "[nccl] {} on group '{}': buffers of {} and {} elements do not match counts summing "
        "to {} with {} for rank {}",
        op, name(), whole.numel(), part.numel(), total, counts[rank()], rank());
  }

  // The group's own NCCL communicator, built at the first collective: every rank issues
  // collectives in the same order, so this is collective too, and a group used only for point
  // to point never builds one.
  std::shared_ptr<Channel> collective_channel() {
    if (main_) {
      CAI_CHECK(!main_->aborted(), "[nccl] group '{}' (rank {}): the communicator was aborted: {}",
                name(), rank(), main_->why());
      return main_;
    }
    Tensor id_words = Tensor::zeros({kIdWords}, DType::I32);
    if (rank() == 0) {
      ncclUniqueId id;
      CAI_CUDA_CHECK(ncclGetUniqueId(&id));
      std::memcpy(id_words.raw(), &id, sizeof(id));
    }
    host_->broadcast(id_words, 0);
    ncclUniqueId id;
    std::memcpy(&id, id_words.raw(), sizeof(id));
    auto ch = std::make_shared<Channel>(
        device_, timeout_, fmt::format("group '{}' (rank {} of {})", name(), rank(), size()));
    init_comm(*ch, size(), id, rank());
    watchdog().watch(ch);
    main_ = ch;
    return main_;
  }

  std::shared_ptr<Channel> p2p_channel(const char* op, int src, int dst) {
    const int peer = src == rank() ? dst : src;
    CAI_CHECK(peer >= 0 && peer < size() && peer != rank(),
              "[nccl] {} peer {} is not another rank of group '{}' ({} ranks, this is rank {})", op,
              peer, name(), size(), rank());
    auto it = pairs_.find({src, dst});
    CAI_CHECK(it != pairs_.end() && it->second,
              "[nccl] {} on group '{}': the pair ({} -> {}) was not declared with connect_p2p() "
              "(collective, before the first send; NCCL matches messages per pair, in order)",
              op, name(), src, dst);
    CAI_CHECK(!it->second->aborted(),
              "[nccl] {} on group '{}' ({} -> {}): the channel was aborted: {}", op, name(), src,
              dst, it->second->why());
    return it->second;
  }

  // The comm stream waits for the compute stream, `issue` enqueues the NCCL call (and copies)
  // on it, and the returned Work holds the completion event and the buffers.
  template <typename Issue>
  std::unique_ptr<Work> launch(const std::shared_ptr<Channel>& ch, std::string what,
                               std::vector<Tensor> keep, Issue issue) {
    activate(device_);
    ready_->record(cudaStreamLegacy);
    ch->stream.wait(ready_->get());
    {
      // Inside the gate: the watchdog's abort waits for this issue to end (and a channel aborted
      // since the caller looked throws here, naming why).
      const AbortGate::Use use = ch->gate.enter("[nccl] " + what);
      try {
        issue(ch->stream.get());
      } catch (const Error&) {
        if (ch->aborted())
          fail("[nccl] {}: the communicator was aborted while this was issued: {}", what,
               ch->why());
        throw;
      }
    }
    auto w = std::make_unique<NcclWork>(ch, what, timeout_);
    w->done->record(ch->stream.get());
    ch->track(w->done, what);
    w->keep = std::move(keep);
    return w;
  }

  std::unique_ptr<Communicator> owned_;
  Communicator* host_;
  int device_;
  std::unique_ptr<cuda::Event> ready_;  // recorded on the compute stream before each operation
  std::shared_ptr<Channel> main_;
  std::map<std::pair<int, int>, std::shared_ptr<Channel>> pairs_;  // (src, dst) -> channel
  std::unique_ptr<Watchdog> watchdog_;  // started with the first NCCL communicator
  std::unique_ptr<CopyEngine> copy_engine_;
  std::unique_ptr<Exchange> exchange_;

  Exchange& exchange(const char* op) {
    CAI_CHECK(exchange_,
              "[nccl] {} on group '{}': the copy-engine gradient exchange is not enabled "
              "(enable_copy_engine_exchange() returned false or was not called)",
              op, name());
    CAI_CHECK(!exchange_->ch->aborted(),
              "[nccl] group '{}' (rank {}): the copy-engine gradient exchange was aborted: {}",
              name(), rank(), exchange_->ch->why());
    return *exchange_;
  }

  // Collective: whether every rank of the group is on this host with CUDA peer access to every
  // other rank's GPU (and the group is small enough for the copy-engine paths).
  bool peers_mappable() {
    const int n = size(), me = rank();
    activate(device_);
    bool ok = n <= PeerRegion::kMaxRanks;
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    const double h =
        static_cast<double>(std::hash<std::string>{}(host) & ((uint64_t{1} << 40) - 1));
    ok = ok &&
         host_->all_reduce_scalar(h, ReduceOp::Min) == host_->all_reduce_scalar(h, ReduceOp::Max);
    constexpr int kBusWords = 8;
    Tensor bus = Tensor::zeros({n * kBusWords}, DType::I32);
    CAI_CUDA_CHECK(cudaDeviceGetPCIBusId(
        reinterpret_cast<char*>(bus.data<int32_t>() + me * kBusWords), kBusWords * 4 - 1, device_));
    host_->all_reduce(bus, ReduceOp::Sum);
    for (int r = 0; r < n && ok; ++r) {
      if (r == me) continue;
      int dev = -1, can = 0;
      const char* id = reinterpret_cast<const char*>(bus.data<int32_t>() + r * kBusWords);
      if (cudaDeviceGetByPCIBusId(&dev, id) != cudaSuccess || dev == device_ ||
          cudaDeviceCanAccessPeer(&can, device_, dev) != cudaSuccess || !can) {
        cudaGetLastError();
        ok = false;
      }
    }
    return host_->all_reduce_scalar(ok ? 1.0 : 0.0, ReduceOp::Min) >= 1.0;
  }

  // Collective: a copy-engine peer region R(size, rank, numel, channel) on a channel of its own
  // labelled `what` (watched for timeouts), mapped by every other rank; null on every rank where
  // some rank is not on this host with peer access or could not map the others' regions.
  template <typename R>
  std::unique_ptr<R> open_peer_region(const char* what, int64_t numel) {
    if (!peers_mappable()) return nullptr;
    auto ch = std::make_shared<Channel>(
        device_, timeout_,
        fmt::format("group '{}' {} (rank {} of {})", name(), what, rank(), size()));
    ch->copy_engine = true;
    auto region = std::make_unique<R>(size(), rank(), numel, ch);
    if (!map_peer_regions(*region)) return nullptr;
    watchdog().watch(ch);
    return region;
  }

  // Collective: maps every other rank's region of `pr` here (CUDA IPC); false (on every rank)
  // when some rank could not. Ends with a barrier: every region's flags are zero before any rank
  // writes them.
  bool map_peer_regions(PeerRegion& pr) {
    const int n = size(), me = rank();
    constexpr int kHandleWords = sizeof(cudaIpcMemHandle_t) / 4;
    static_assert(sizeof(cudaIpcMemHandle_t) % 4 == 0);
    Tensor handles = Tensor::zeros({n * kHandleWords}, DType::I32);
    cudaIpcMemHandle_t mine;
    CAI_CUDA_CHECK(cudaIpcGetMemHandle(&mine, pr.region));
    std::memcpy(handles.data<int32_t>() + me * kHandleWords, &mine, sizeof(mine));
    host_->all_reduce(handles, ReduceOp::Sum);
    bool ok = true;
    for (int r = 0; r < n && ok; ++r) {
      if (r == me) continue;
      cudaIpcMemHandle_t theirs;
      std::memcpy(&theirs, handles.data<int32_t>() + r * kHandleWords, sizeof(theirs));
      void* p = nullptr;
      if (cudaIpcOpenMemHandle(&p, theirs, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) {
        cudaGetLastError();
        ok = false;
      } else {
        pr.peer[r] = static_cast<char*>(p);
      }
    }
    if (host_->all_reduce_scalar(ok ? 1.0 : 0.0, ReduceOp::Min) < 1.0) return false;
    host_->barrier();
    return true;
  }

  Watchdog& watchdog() {
    if (!watchdog_) watchdog_ = std::make_unique<Watchdog>();
    return *watchdog_;
  }
};

}  // namespace

bool nccl_compiled() {
  return true;
}

std::unique_ptr<Communicator> make_nccl(Communicator& host, int device) {
  return std::make_unique<NcclCommunicator>(&host, nullptr, device);
}

std::unique_ptr<Communicator> make_nccl(std::unique_ptr<Communicator> host, int device) {
  CAI_CHECK(host != nullptr, "[nccl] make_nccl needs a CPU communicator");
  return std::make_unique<NcclCommunicator>(nullptr, std::move(host), device);
}

int select_cuda_device(int local_rank, int local_world_size) {
  const int n = kernels::cuda::device_count();
  CAI_CHECK(n > 0, "[cuda] no GPU is visible ({})", kernels::cuda::runtime_info().device_error);
  CAI_CHECK(local_world_size <= n,
            "[cuda] {} processes on this node but {} GPU(s): NCCL needs one GPU per process",
            local_world_size, n);
  const int d = local_rank % n;
  activate(d);
  return d;
}

}  // namespace cai::dist
