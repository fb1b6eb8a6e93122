// The Communicator: collectives and point-to-point over a group of processes, with an MPI backend
// (CPU tensors), an in-process fake (threads) for unit tests and NCCL (CUDA tensors, cai/dist/
// nccl.h). Non-blocking calls return a Work handle; every wait is bounded by the communicator's
// timeout and raises cai::Error naming the operation and the group instead of hanging.
// Communicators are explicit objects passed to whoever needs them: no globals.
//
// Point to point: MPI matches a receive by (peer, tag); NCCL has no tags and matches in issue
// order per (source, destination). Code that must run on both keeps each independent stream of
// messages on its own communicator (the pipeline: activations and gradients) and declares the
// (source, destination) pairs it will use with connect_p2p() before the first send.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cai/core/tensor.h"

namespace cai::dist {

enum class ReduceOp { Sum, Max, Min };

// How connect_p2p builds its channels.
struct P2POptions {
  // NCCL: the most thread blocks (CTAs) a channel's send/receive kernel takes
  // (ncclConfig_t::maxCTAs); 0: NCCL's choice (16 on an H200). A pipeline's posted receive holds
  // its blocks' SMs until its data is in: the GEMMs beside it that want every SM (cuBLASLt's
  // persistent kernels) wait for them (docs/bench/h200x2-pipeline-microbatch). Ignored by MPI.
  int max_ctas = 0;
};

class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;  // throws on timeout naming the operation and group
  virtual bool test() = 0;  // true when complete
  // Orders what is issued afterwards on the compute stream after this operation without
  // blocking the host, where the backend can (NCCL: the compute stream waits for the operation's
  // completion event). Everything issued afterwards on the device is then ordered after the
  // operation (every NCCL operation first waits for the compute stream, and the trainer's copy
  // stream waits for it before writing new buffers), so the NCCL Work lets its buffers go back to
  // the allocator here; keep the Work until test() or wait() reports completion, which is where
  // a failure is reported. Host backends (MPI, fake) simply wait().
  virtual void wait_on_device() { wait(); }
};

// Operations the compute stream waits for on the device (Work::wait_on_device), kept until the
// host has seen them complete, where a failure is reported: add() prunes the completed ones from
// the front (test()) and, with a bound, waits for the oldest beyond it; drain() waits for all.
// Tensor-parallel collectives, DDP / ZeRO buckets and the clip's reduction go through it.
class DeviceWaits {
 public:
  explicit DeviceWaits(size_t bound = 0) : bound_(bound) {}  // 0: no bound
  void add(std::unique_ptr<Work> w) {
    w->wait_on_device();
    pending_.push_back(std::move(w));
    while (!pending_.empty() && pending_.front()->test()) pending_.pop_front();
    while (bound_ > 0 && pending_.size() > bound_) {
      pending_.front()->wait();
      pending_.pop_front();
    }
  }
  void drain() {
    for (auto& w : pending_) w->wait();
    pending_.clear();
  }
  size_t size() const { return pending_.size(); }

 private:
  size_t bound_;
  std::deque<std::unique_ptr<Work>> pending_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // e.g. "world", "dp[0,2]"
  void set_timeout(double seconds) { timeout_ = seconds; }
  double timeout() const { return timeout_; }
  // Whether tensors on `d` can be passed to this communicator's operations.
  virtual bool supports(Device d) const { return !d.is_cuda(); }

  // In place: t becomes the reduction over the group.
  virtual std::unique_ptr<Work> all_reduce_async(Tensor& t, ReduceOp op) = 0;
  // in has Σ counts[r] elements laid out rank-major; out receives this rank's counts[rank()]
  // elements of the reduction.
  virtual std::unique_ptr<Work> reduce_scatter_async(const Tensor& in, Tensor& out,
                                                     const std::vector<int64_t>& counts,
                                                     ReduceOp op) = 0;
  // out (Σ counts[r] elements) receives every rank's `in` (counts[r] elements), rank-major.
  virtual std::unique_ptr<Work> all_gather_async(const Tensor& in, Tensor& out,
                                                 const std::vector<int64_t>& counts) = 0;
  virtual std::unique_ptr<Work> broadcast_async(Tensor& t, int root) = 0;
  virtual std::unique_ptr<Work> send_async(const Tensor& t, int peer, int tag) = 0;
  virtual std::unique_ptr<Work> recv_async(Tensor& t, int peer, int tag) = 0;
  virtual void barrier() = 0;
  // A sub-group of the ranks with the same color, ordered by key (MPI_Comm_split).
  virtual std::unique_ptr<Communicator> split(int color, int key, const std::string& name) = 0;
  // Collective: every rank passes the same (source, destination) pairs it will send along.
  // NCCL builds one channel per pair (a 2-rank communicator with its own stream, so messages in
  // opposite directions never queue behind each other) and refuses sends on undeclared pairs;
  // MPI and the fake need nothing. A pair declared before keeps its channel (and its options).
  void connect_p2p(const std::vector<std::pair<int, int>>& pairs) {
    connect_p2p(pairs, P2POptions{});
  }
  virtual void connect_p2p(const std::vector<std::pair<int, int>>& /*pairs*/,
                           const P2POptions& /*options*/) {}

  // Blocking conveniences.
  void all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum) { all_reduce_async(t, op)->wait(); }
  void reduce_scatter(const Tensor& in, Tensor& out, const std::vector<int64_t>& counts,
                      ReduceOp op = ReduceOp::Sum) {
    reduce_scatter_async(in, out, counts, op)->wait();
  }
  void all_gather(const Tensor& in, Tensor& out, const std::vector<int64_t>& counts) {
    all_gather_async(in, out, counts)->wait();
  }
  void broadcast(Tensor& t, int root) { broadcast_async(t, root)->wait(); }
  void send(const Tensor& t, int peer, int tag = 0) { send_async(t, peer, tag)->wait(); }
  void recv(Tensor& t, int peer, int tag = 0) { recv_async(t, peer, tag)->wait(); }
  // A scalar reduced in double precision.
  virtual double all_reduce_scalar(double v, ReduceOp op = ReduceOp::Sum);

  // Sum all-reduces of fp32 device tensors moved by the GPUs' copy engines instead of kernels
  // (NCCL): each rank pushes every other rank's chunk of the tensor into that rank's staging
  // buffer, sums its own chunk (a short kernel, the contributions in rank order) and the others
  // pull the sum. No SM is held while a transfer runs or while a rank waits for a slower one
  // (the stream waits on a flag): the kernels beside it lose SMs only to the short sums (on
  // 2 H100 those cost about what NCCL's kernels took: no faster for ViT-B/16 DDP). Collective:
  // every rank calls it with the same max_numel; true where every rank of the group can map every
  // other's memory (one host, CUDA peer access), false otherwise (and on backends without it).
  virtual bool enable_copy_engine_all_reduce(int64_t /*max_numel*/) { return false; }
  // After enable_copy_engine_all_reduce() returned true: in place, fp32, at most max_numel
  // elements, issued in the same order on every rank (they pair up by that order).
  virtual std::unique_ptr<Work> copy_engine_all_reduce_async(Tensor& t);

  // The copy-engine gradient exchange (DDP with no reduction kernel beside the backward): every
  // rank's copy of each range of a `numel`-element fp32 space is copied by the copy engines into
  // every other rank's memory as soon as it is final, and the sum over the ranks is taken once,
  // at the round's end, by one pass over the whole space on an otherwise idle GPU. Collective:
  // every rank calls it with the same numel; true where every rank of the group can map every
  // other's memory (one host, CUDA peer access), false otherwise (and on backends without it).
  // Costs (size - 1) · numel · 4 bytes of receive slots per rank.
  virtual bool enable_copy_engine_exchange(int64_t /*numel*/) { return false; }
  // Copies `t` (fp32, this rank's GPU, after what the compute stream has issued) into every
  // other rank's slot for this rank at [offset, offset + t.numel()). A round's first push waits
  // (on the communication stream) until every peer has ended the previous round. Every rank
  // pushes the same number of times per round, in the same order.
  virtual std::unique_ptr<Work> exchange_push_async(const Tensor& t, int64_t offset);
  // Ends the round: once every peer's pushes of the round have landed here, each ts[i] (this
  // rank's own copy of [offsets[i], offsets[i] + ts[i].numel()), in place) becomes the sum of
  // every rank's copies, added in rank order (the same bits on every rank); then the peers may
  // push the next round. The ranges together cover what the round pushed.
  virtual std::unique_ptr<Work> exchange_sum_async(const std::vector<Tensor>& ts,
                                                   const std::vector<int64_t>& offsets);
  // Or, for a consumer that sums as it reads (Optimizer::sum_replicas): the round's arrivals,
  // complete (for a stream that waits on the Work) once every peer's pushes of the round have
  // landed here; rank r's copy of element k then lies at exchange_received()[r] + k on this GPU
  // (rank order, null for this rank) until the round ends with exchange_end_async(), after what
  // the compute stream has issued by then (the reads), when the peers may push the next round.
  virtual std::unique_ptr<Work> exchange_wait_async();
  virtual std::unique_ptr<Work> exchange_end_async();
  virtual std::vector<const float*> exchange_received();

 protected:
  double timeout_ = 300.0;
};

// How the MPI communicator's waits poll (MPI progresses an operation only inside MPI calls), which
// the simulator models: `busy_polls` tests back to back, then, until `yield_seconds` after the
// wait began, tests with a yield of the core between them, then naps `nap_seconds` between tests.
// A peer arriving after the naps began finds the waiting process asleep: the operation completes
// when it wakes (on a VM a 50 µs nap stretches to 0.3-0.6 ms). With more processes than cores
// (oversubscribed) a wait yields no time: it naps after its busy polls, leaving the core to a
// process that computes.
struct WaitPolicy {
  int busy_polls = 1000;
  double yield_seconds = 2e-3;
  double nap_seconds = 50e-6;
};
WaitPolicy mpi_wait_policy(bool oversubscribed);

// MPI: initialised (MPI_THREAD_FUNNELED) by the first MpiEnvironment and finalised when it goes.
// Owned by main(); the library never initialises MPI behind the caller's back.
class MpiEnvironment {
 public:
  MpiEnvironment(int* argc, char*** argv);
  ~MpiEnvironment();
  MpiEnvironment(const MpiEnvironment&) = delete;
  MpiEnvironment& operator=(const MpiEnvironment&) = delete;
  // The world communicator; timeout in seconds (CAI_COLLECTIVE_TIMEOUT overrides when set).
  std::unique_ptr<Communicator> world(double timeout_seconds = 300.0);
  // Ends the whole job (MPI_Abort) after printing why: for a rank that cannot go on.
  [[noreturn]] static void abort(int code);
  static bool initialized();

 private:
  bool initialized_here_ = false;  // MPI_Finalize only what this object initialised
};

// n communicators of one in-process group, to be used from n threads (rank i uses the i-th).
std::vector<std::unique_ptr<Communicator>> make_fake_group(int n, double timeout_seconds = 30.0);

// A one-rank communicator: every collective is the identity.
std::unique_ptr<Communicator> make_single();

}  // namespace cai::dist
