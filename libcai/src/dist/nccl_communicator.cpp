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
#include "nccl_internal.h"

#include <memory>
#include <string>
#include <vector>

#include "cai/core/error.h"
#include "cai/dist/nccl.h"
#include "cai/schedule/buckets.h"
#include "kernels/cuda/check.h"
#include "kernels/device.h"

namespace cai::dist {

namespace {

using namespace detail;  // the channel machinery (nccl_internal.h)

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

  using Communicator::connect_p2p;
  void connect_p2p(const std::vector<std::pair<int, int>>& pairs,
                   const P2POptions& options) override {
    CAI_CHECK(options.max_ctas >= 0,
              "[nccl] connect_p2p on group '{}': max_ctas is {}: expected 0 (NCCL's choice) or a "
              "number of thread blocks >= 1",
              name(), options.max_ctas);
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
      init_comm(*ch, 2, id, rank() == src ? 0 : 1, options.max_ctas);
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
    if (!watchdog_) watchdog_ = std::make_unique<Watchdog>(device_);
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
