// Internal to libcai/src/parallel: DataParallelPlugin::Impl (the buckets, the ZeRO shards and
// gathers, the gradient hooks) and its helpers, split from data_parallel.cpp, which holds the
// plugin's public methods. Included by data_parallel.cpp only. Not installed.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "cai/core/error.h"
#include "cai/core/span_copy.h"
#include "cai/ops/ops.h"
#include "cai/parallel/data_parallel.h"
#include "cai/schedule/buckets.h"
#include "cai/schedule/param_gathers.h"
#include "kernels/device.h"
#include "offload_lane.h"

namespace cai::parallel {

namespace detail {

// Milliseconds since t0 (the offload's host timings).
inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Rank r's chunk of an n-element parameter: [n·r/dp, n·(r+1)/dp) (shared with cai/plan).
inline int64_t chunk_begin(int64_t n, int r, int dp) {
  return schedule::zero_chunk_begin(n, r, dp);
}
inline int64_t chunk_size(int64_t n, int r, int dp) {
  return schedule::zero_chunk_size(n, r, dp);
}

// Elements [offset, offset + n) of t as a 1-D view (any device).
inline Tensor span(const Tensor& t, int64_t offset, int64_t n) {
  return t.reshape({t.numel()}).narrow(offset, n);
}

// dst[doff, doff + n) = src[soff, soff + n): a memcpy on the host, a device copy on the GPU (on
// the compute stream, so it is ordered with the kernels that produced or consume the values).
inline void copy_span(const Tensor& dst, int64_t doff, const Tensor& src, int64_t soff, int64_t n) {
  if (n == 0) return;
  if (dst.dtype() == src.dtype())
    span(dst, doff, n).copy_from(span(src, soff, n));
  else  // a bf16 bucket: rounded on the way in, widened on the way out
    span(dst, doff, n).copy_from(span(src, soff, n).to(dst.dtype()));
}

// Copies gathered for one copy_spans call (one kernel launch per bucket or gather on a GPU),
// counted into `stats` when given (DataParallelPlugin::take_copy_stats: the simulator's copy ops
// are tested against them).
struct Copies {
  explicit Copies(DataParallelPlugin::CopyStats* stats = nullptr) : stats(stats) {}
  DataParallelPlugin::CopyStats* stats;
  std::vector<SpanCopy> spans;
  void add(const Tensor& dst, int64_t doff, const Tensor& src, int64_t soff, int64_t n) {
    if (n > 0) spans.push_back(SpanCopy{dst, doff, src, soff, n});
  }
  void run() {
    count(false);
    copy_spans(spans);
    spans.clear();
  }
  void run_add() {  // dst += src instead
    count(true);
    add_spans(spans);
    spans.clear();
  }

 private:
  // Bytes moved: each element read from the source and written to the destination (an add reads
  // the destination too).
  void count(bool add) {
    if (!stats || spans.empty()) return;
    ++stats->launches;
    for (const SpanCopy& c : spans)
      stats->bytes += c.n * static_cast<int64_t>(dtype_size(c.src.dtype()) +
                                                 (add ? 2 : 1) * dtype_size(c.dst.dtype()));
  }
};

struct Bucket {
  std::vector<nn::Parameter*> params;  // full parameters, in backward order
  int ready = 0;                       // parameters whose gradient is final this micro-batch
  bool launched = false;
  // Stage 0/1: all gradients back to back, allocated once (as PyTorch DDP's buckets). Stage 2/3:
  // rank-major chunks, allocated at launch and dropped when the reduction has completed, so only
  // the in-flight buckets hold full-size gradient bytes.
  Tensor flat;
  Tensor recv;                  // stage 2/3: this rank's chunk of the reduction (while in flight)
  std::vector<int64_t> counts;  // elements per rank
  std::unique_ptr<dist::Work> work;
  int64_t numel = 0;
  int64_t elements = 0;  // the gradients' elements (numel without the views' padding)
  int64_t offset = 0;  // stage 0/1: elements of the buckets before this one (the exchange's range)
};

// An all-gather of some parameters' shards in flight. The buffers stay referenced until the
// Work has completed: on a GPU the collective runs on the communicator's stream and the caching
// allocator knows no streams.
struct Gather {
  std::vector<nn::Parameter*> params;
  Tensor mine, all;  // this rank's packed chunks; every rank's, rank-major
  std::unique_ptr<dist::Work> work;
};

}  // namespace detail

using detail::Bucket;
using detail::chunk_begin;
using detail::chunk_size;
using detail::Copies;
using detail::copy_span;
using detail::Gather;
using detail::span;

struct DataParallelPlugin::Impl {
  dist::Communicator& dp;
  DataParallelConfig cfg;
  int rank = 0, size = 1;
  Device device;                       // where the parameters, gradients, buckets and shards live
  std::vector<nn::Parameter*> params;  // model parameters, model order
  std::vector<nn::Parameter> shards;   // ZeRO: this rank's chunk of each parameter
  // cpu_offload (ZeRO-Offload): the optimizer steps `host`, this rank's chunks in host memory
  // (views into host_value/host_grad, fp32; host_offset: where each parameter's chunk starts:
  // the rounded parameters first, then the rest). `shards` are the device copy the gathers read:
  // views into dev_value (cfg.offload_dtype) for the parameters rounded_on_device, into
  // dev_value32 (fp32) for the rest, and, stage 1 only, into dev_grad (fp32, the host's layout:
  // the buckets' sums land there). Stage 2/3 stream each bucket's reduced chunk
  // into host_grad through `lane` (no device gradient shard); stage 1 copies dev_grad over once
  // in sync_gradients. After the step the lane uploads host_value into both device parts.
  std::vector<nn::Parameter> host;
  Tensor dev_value, dev_value32, dev_grad, host_value, host_grad;
  std::vector<int64_t> host_offset;
  int64_t shard_elements = 0;  // this rank's chunks (host_value adds alignment padding)
  std::unique_ptr<detail::OffloadLane> lane;
  // Stage 2/3 offload, per bucket: its host gradients hold nothing of this step yet (zero_grad
  // sets it instead of zeroing them): its first chunk is copied in, not added.
  std::vector<char> host_stale;
  // Stage 2/3 offload, per parameter: its host gradient's sum of squares and inf/NaN count as
  // the last micro-batch's add left them (valid: that add was the step's last one into it; zero
  // for the stale buckets' zeroed gradients), which the clip reads instead of a pass over the
  // gradients. last_micro: train_hooks' flag of the micro-batch running now.
  std::vector<double> host_sq;
  std::vector<int64_t> host_bad;
  std::vector<char> host_sq_valid;
  bool last_micro = true;
  int64_t clips_streamed = 0;  // steps whose clip read the streamed statistics
  // Host milliseconds: waiting for the streamed gradients in sync_gradients, the host optimizer
  // step, the upload (offload_traffic()).
  double flush_ms = 0, step_ms = 0, upload_ms = 0, clip_ms = 0;
  // Whether the device copy of p holds it in cfg.offload_dtype: the weights that decay (timm's
  // split: the GEMM weights, which the forward rounds to the compute dtype anyway); biases,
  // norms, tokens and the position embedding stay fp32, as the forward reads them.
  static bool rounded_on_device(const nn::Parameter& p) { return p.weight_decay; }
  void upload() {
    const int64_t r = dev_value.numel();
    lane->upload(host_value, 0, dev_value, 0, r);
    lane->upload(host_value, r, dev_value32, 0, dev_value32.numel());
  }
  // The host step with the upload fused (bf16 device copies): the rounded parameters step in
  // host-layout order, each writing its bf16 copy into the lane's staging as it updates, the
  // staging buffers going to the device while the next parameters step; then the fp32 part.
  // Returns false (nothing done) where that does not apply: another offload dtype, or an
  // optimizer that steps more than the host shards. step_ms / upload_ms: the step, the rest.
  // With cfg.offload_step_overlap the step runs on `step_thread` beside the next forward: the
  // fp32 part first (one upload), then the rounded weights in model order, each sent once
  // stepped; a gather waits (await_host) only for the parameters it reads.
  bool step_uploading(optim::Optimizer& opt);
  // The host step beside the next forward: its thread, its order (host indices: step_order[k]
  // is the k-th parameter stepped, step_pos the inverse) and how many of them are stepped and
  // on their way to the device (copies issued, the compute stream waiting for them).
  std::thread step_thread;
  std::mutex step_m;
  std::condition_variable step_cv;
  size_t step_sent = 0;
  bool step_running = false;
  std::exception_ptr step_error;
  std::vector<size_t> step_order, step_pos;
  std::vector<char> step_staged;  // per position: its bf16 copy went into a staging buffer
  double wait_ms = 0;             // the host waiting in await_host
  int64_t steps_overlapped = 0;
  int64_t gathers_beside = 0;  // gathers issued while the host step still ran
  // Before reading the device copies of `ps` (model parameters): returns once the running host
  // step has sent them (at once when none runs). Rethrows the step's error.
  void await_host(const std::vector<nn::Parameter*>& ps) {
    if (!step_thread.joinable()) return;
    size_t need = 0;
    for (nn::Parameter* p : ps) need = std::max(need, step_pos[index[p]] + 1);
    const auto t0 = std::chrono::steady_clock::now();
    bool running = true;
    {
      std::unique_lock<std::mutex> l(step_m);
      step_cv.wait(l, [&] { return step_sent >= need || !step_running; });
      running = step_running;
    }
    wait_ms += detail::ms_since(t0);
    if (!running) return settle_host_step();
    ++gathers_beside;
  }
  // Waits for the running host step to end (every reader of the host state, the optimizer's or
  // the lane's, calls it first) and rethrows its error.
  void settle_host_step() {
    if (!step_thread.joinable()) return;
    const auto t0 = std::chrono::steady_clock::now();
    step_thread.join();
    wait_ms += detail::ms_since(t0);
    if (step_error) std::rethrow_exception(std::exchange(step_error, nullptr));
  }
  // Whether opt steps exactly the host shards (`host`), each once: what the host step and the
  // streamed clip assume.
  bool steps_host_shards(const optim::Optimizer& opt) const;
  // The clip from the statistics the last micro-batch's host adds left (stage 2/3 offload): the
  // factor deferred to opt's step, the norm returned; undefined (nothing done) where they do not
  // stand for what opt steps (then the clip reads the gradients).
  Tensor clip_from_streamed(optim::Optimizer& opt, double max_norm,
                            const std::function<double(double)>& reduce);
  std::map<const nn::Parameter*, size_t> index;  // parameter -> position in params/shards
  std::vector<Bucket> buckets;
  // Finished reductions the compute stream waits for (finish()), until the host sees them done.
  dist::DeviceWaits settling;
  // Stage 2/3: the launched reductions, oldest first, at most zero_max_inflight_buckets.
  schedule::InflightWindow inflight;
  std::map<const nn::Parameter*, size_t> bucket_of;
  std::map<const nn::Layer*, std::vector<nn::Parameter*>> layer_params;
  std::vector<Shape> shapes;  // full shapes (stage 3 frees the values)
  nn::LayerHooks last_hooks, accumulate_hooks, eval;

  Impl(dist::Communicator& c, DataParallelConfig g)
      : dp(c),
        cfg(g),
        inflight(schedule::InflightWindow::for_reductions(g.zero_max_inflight_buckets, c.size())) {
    rank = dp.rank();
    size = dp.size();
    CAI_CHECK(cfg.zero_stage >= 0 && cfg.zero_stage <= 3,
              "[data_parallel] zero_stage {} is not 0, 1, 2 or 3", cfg.zero_stage);
    CAI_CHECK(cfg.ddp_bucket_cap_mb > 0 && cfg.zero_bucket_size_in_m > 0,
              "[data_parallel] bucket sizes must be positive (ddp_bucket_cap_mb {}, "
              "zero_bucket_size_in_m {})",
              cfg.ddp_bucket_cap_mb, cfg.zero_bucket_size_in_m);
    CAI_CHECK(cfg.zero_max_inflight_buckets >= 1,
              "[data_parallel] zero_max_inflight_buckets {} must be at least 1",
              cfg.zero_max_inflight_buckets);
    CAI_CHECK(cfg.zero3_prefetch >= 0, "[data_parallel] zero3_prefetch {} must be at least 0",
              cfg.zero3_prefetch);
    CAI_CHECK(cfg.bucket_dtype == DType::F32 || cfg.bucket_dtype == DType::BF16,
              "[data_parallel] bucket dtype {}: expected fp32 or bf16",
              dtype_name(cfg.bucket_dtype));
    CAI_CHECK(!cfg.copy_engine_exchange || (cfg.zero_stage == 0 && cfg.bucket_dtype == DType::F32 &&
                                            !cfg.copy_engine_all_reduce),
              "[data_parallel] the copy-engine gradient exchange sums whole fp32 gradients: it "
              "needs zero_stage 0 (got {}), fp32 buckets (got {}) and no copy-engine all-reduce",
              cfg.zero_stage, dtype_name(cfg.bucket_dtype));
    CAI_CHECK(cfg.bucket_hold >= 0 && cfg.bucket_hold <= 1 &&
                  (cfg.zero_stage <= 1 || cfg.bucket_hold == 0),
              "[data_parallel] bucket_hold {}: expected a fraction from 0 to 1 of the gradients, "
              "with zero_stage 0 or 1 (got {})",
              cfg.bucket_hold, cfg.zero_stage);
    CAI_CHECK(cfg.bucket_dtype == DType::F32 || cfg.zero_stage <= 1,
              "[data_parallel] bf16 gradient buckets apply to ZeRO stages 0 and 1 (all-reduced "
              "buckets); stage {} reduce-scatters fp32 shards",
              cfg.zero_stage);
  }

  ~Impl() {
    // Nothing should be in flight after a step; if an exception left something, let it
    // complete before its buffers go (a timeout here has nowhere to be reported).
    try {
      settle_host_step();
      drain();
      for (Bucket& b : buckets)
        if (b.work) b.work->wait();
      for (auto& w : pushing) w->wait();
      for (auto& e : param_gathers) e.second.work->wait();
      settling.drain();
      if (lane) lane->flush();
    } catch (...) {
    }
  }

  bool sharded_grads() const { return cfg.zero_stage >= 2; }
  // The buckets go through the copy-engine all-reduce (cfg.copy_engine_all_reduce, where the
  // communicator could enable it).
  bool copy_engine = false;
  // The buckets go through the copy-engine gradient exchange (cfg.copy_engine_exchange, where
  // the communicator could enable it).
  bool exchange = false;
  bool offload() const { return cfg.cpu_offload && cfg.zero_stage >= 1; }
  // Stage 2/3 offload: the reduced chunks go to the host as each bucket completes.
  bool streams() const { return offload() && sharded_grads(); }

  // The copy-engine exchange asked for: every bucket a view of one allocation (`all`), so that
  // each rank's received copy of a gradient lies a fixed distance from it (replica_delta).
  bool one_allocation() const {
    return cfg.copy_engine_exchange && device.is_cuda() && grad_views();
  }
  Tensor all;
  std::vector<int64_t> replica_delta;  // Optimizer::sum_replicas's offsets, rank order
  // sync_gradients waited for the peers' copies but left their sum to the readers.
  bool exchange_pending = false;
  // This rank's pushes of the last round: the compute stream waits for them only before it
  // zeroes the gradients (zero_grad), not before the clip and the step read them.
  std::vector<std::unique_ptr<dist::Work>> pushing;
  void settle_pushes() {
    for (auto& w : pushing) settling.add(std::move(w));
    pushing.clear();
  }

  // The round's sum in place (for readers other than the fused clip and step), or its end after
  // a fused reader: the peers may then push the next round.
  void sum_exchange() {
    if (!exchange_pending) return;
    std::vector<Tensor> flats;
    std::vector<int64_t> offsets;
    for (Bucket& b : buckets) {
      flats.push_back(b.flat);
      offsets.push_back(b.offset);
    }
    settling.add(dp.exchange_sum_async(flats, offsets));
    exchange_pending = false;
  }
  void end_exchange() {
    if (!exchange_pending) return;
    settling.add(dp.exchange_end_async());
    exchange_pending = false;
  }
  // Whether `opt` can read the gradients as their sum over the ranks: a fused GPU update over
  // parameters whose gradients all lie in `all`.
  bool fuses_exchange(const optim::Optimizer& opt) const {
    if (!opt.can_sum_replicas(device)) return false;
    const auto* lo = all.data<float>();
    const auto* hi = lo + all.numel();
    for (const auto& g : opt.groups())
      for (const nn::Parameter* p : g.params)
        if (p->grad.numel() > 0 &&
            (p->grad.data<float>() < lo || p->grad.data<float>() + p->grad.numel() > hi))
          return false;
    return true;
  }

  // ---- buckets ------------------------------------------------------------------------------

  std::vector<nn::Layer*> layers;  // the layers this plugin manages (a pipeline stage's subset)

  void build_buckets() {
    // The layout rule is shared with the step model (cai/plan): schedule::gradient_buckets.
    std::vector<int64_t> numels;
    std::vector<int> layer_of;
    for (size_t l = 0; l < layers.size(); ++l)
      for (size_t k = 0; k < layer_params[layers[l]].size(); ++k) {
        numels.push_back(shape_numel(shapes[index[layer_params[layers[l]][k]]]));
        layer_of.push_back(static_cast<int>(l));
      }
    CAI_CHECK(numels.size() == params.size(),
              "[data_parallel] {} parameters collected by layer but {} in the model", numels.size(),
              params.size());
    for (const auto& ids : schedule::gradient_buckets(
             numels, layer_of, cfg.zero_stage, cfg.ddp_bucket_cap_mb, cfg.zero_bucket_size_in_m)) {
      Bucket b;
      for (int i : ids) b.params.push_back(params[i]);
      buckets.push_back(std::move(b));
    }
    if (one_allocation()) {
      int64_t total = 0;
      for (const Bucket& k : buckets)
        for (nn::Parameter* p : k.params)
          total += schedule::bucket_view_numel(shape_numel(shapes[index[p]]));
      all = Tensor::zeros({total}, DType::F32, device);
    }
    int64_t offset = 0;
    elements_total = 0;
    for (size_t b = 0; b < buckets.size(); ++b) {
      Bucket& k = buckets[b];
      k.numel = 0;
      k.elements = 0;
      k.counts.assign(size, 0);
      for (nn::Parameter* p : k.params) {
        bucket_of[p] = b;
        const int64_t n = shape_numel(shapes[index[p]]);
        k.numel += grad_views() ? schedule::bucket_view_numel(n) : n;
        k.elements += n;
        for (int r = 0; r < size; ++r) k.counts[r] += chunk_size(n, r, size);
      }
      elements_total += k.elements;
      k.offset = offset;
      offset += k.numel;
      if (one_allocation()) k.flat = all.narrow(k.offset, k.numel);
      if (!sharded_grads() && !one_allocation())
        k.flat = Tensor::zeros({k.numel}, cfg.bucket_dtype, device);
      if (!grad_views()) continue;
      // The gradients become views into the bucket (their values so far copied in).
      int64_t off = 0;
      for (nn::Parameter* p : k.params) {
        const Shape& shape = shapes[index[p]];
        const int64_t n = shape_numel(shape);
        Tensor view = span(k.flat, off, n).reshape(shape);
        if (p->grad.defined()) copy_span(view, 0, p->grad, 0, n);
        p->grad = view;
        off += schedule::bucket_view_numel(n);
      }
    }
  }

  // The gradients live in the buckets (see build_buckets): the all-reduce works on them in place.
  // Otherwise (bf16 buckets) they are packed (cast) and copied back.
  bool grad_views() const {
    return schedule::gradients_in_buckets(cfg.zero_stage, cfg.bucket_dtype == DType::F32);
  }

  // Stage 0/1: the bucket's gradients back to back. Stage 2/3: rank-major chunks.
  void pack(Bucket& b) {
    int64_t out = 0;
    if (grad_views()) return;  // in place already
    Copies cp(&copy_stats);
    if (!sharded_grads()) {
      for (nn::Parameter* p : b.params) {
        cp.add(b.flat, out, p->grad, 0, p->grad.numel());
        out += p->grad.numel();
      }
    } else {
      for (int r = 0; r < size; ++r)
        for (nn::Parameter* p : b.params) {
          const int64_t n = p->grad.numel(), c0 = chunk_begin(n, r, size);
          const int64_t c = chunk_size(n, r, size);
          cp.add(b.flat, out, p->grad, c0, c);
          out += c;
        }
    }
    cp.run();  // one launch for the bucket
  }

  // Starts bucket i's reduction. Stage 2/3: at most zero_max_inflight_buckets in flight (the
  // oldest completes first); the gradients are packed into a fresh rank-major buffer and freed
  // at once (on a GPU the pack is ordered before any reuse of their memory by the compute
  // stream), so a layer's full gradients live from its backward to its bucket's launch.
  void launch(size_t i) {
    Bucket& b = buckets[i];
    if (!sharded_grads()) {
      if (b.launched) return;
      pack(b);
      b.work = exchange      ? dp.exchange_push_async(b.flat, b.offset)
               : copy_engine ? dp.copy_engine_all_reduce_async(b.flat)
                             : dp.all_reduce_async(b.flat, dist::ReduceOp::Sum);
    } else {
      // The previous micro-batch's reduction of this bucket, then the oldest while the window
      // is full (schedule::InflightWindow, which the plan and the simulator follow too).
      for (int k : inflight.launch(static_cast<int>(i))) finish(static_cast<size_t>(k));
      b.flat = Tensor::empty({b.numel}, DType::F32, device);
      b.recv = Tensor::empty({b.counts[rank]}, DType::F32, device);
      pack(b);
      for (nn::Parameter* p : b.params) p->grad = Tensor();
      b.work = dp.reduce_scatter_async(b.flat, b.recv, b.counts, dist::ReduceOp::Sum);
    }
    b.launched = true;
    b.ready = 0;
  }

  // Completes bucket i's reduction: stage 0/1 copy the sums back into the gradients (unless the
  // gradients are the bucket); stage 2/3 add this rank's chunk into the shard gradients and drop
  // the bucket's buffers.
  void finish(size_t i) {
    Bucket& b = buckets[i];
    if (!b.launched) return;
    // What reads the sums is issued on the compute stream, which waits for the reduction there:
    // the host does not wait for the backward's end (NCCL; host backends wait here).
    settling.add(std::move(b.work));
    if (!sharded_grads()) {
      int64_t in = 0;
      Copies cp(&copy_stats);
      if (!grad_views())
        for (nn::Parameter* p : b.params) {
          cp.add(p->grad, 0, b.flat, in, p->grad.numel());
          in += p->grad.numel();
        }
      cp.run();
    } else {
      int64_t in = 0;
      if (streams()) {
        // Into the host gradient shard, off the compute stream (the lane holds b.recv until
        // its copy has left the device).
        std::vector<detail::OffloadLane::Add> to_host;
        for (nn::Parameter* p : b.params) {
          const size_t k = index[p];
          const int64_t c = host[k].grad.numel();
          if (c > 0) {
            detail::OffloadLane::Add a{host_grad, host_offset[k], in, c, host_stale[i] != 0};
            // The last micro-batch's add makes the gradient final: its statistics come with it.
            if (last_micro) a.sq = &host_sq[k], a.bad = &host_bad[k];
            to_host.push_back(a);
          }
          host_sq_valid[k] = last_micro ? 1 : 0;
          in += c;
        }
        host_stale[i] = 0;
        settle_host_step();  // the last step's reads of the host gradients are over
        lane->push(b.recv, std::move(to_host));
      } else {
        Copies adds(&copy_stats);  // one launch for the bucket
        for (nn::Parameter* p : b.params) {
          nn::Parameter& s = shards[index[p]];
          const int64_t c = s.grad.numel();
          adds.add(s.grad, 0, b.recv, in, c);
          in += c;
        }
        adds.run_add();
      }
      b.flat = Tensor();
      b.recv = Tensor();
      inflight.finish(static_cast<int>(i));
    }
    b.launched = false;
  }

  // What a ZeRO-3 parameter holds between its uses: nothing on the host; an empty tensor on a
  // GPU, so the model still reports where it lives (the trainer moves batches there).
  Tensor released() const {
    return device.is_cuda() ? Tensor::empty({0}, DType::F32, device) : Tensor();
  }

  // Drives the reductions (MPI progresses inside test()); stage 2/3 complete the finished ones
  // now, releasing their buffers, without blocking.
  void progress() {
    if (!sharded_grads()) {
      for (Bucket& b : buckets)
        if (b.launched && b.work) b.work->test();
      return;
    }
    const std::vector<int> now = inflight.inflight();
    for (int i : now)
      if (buckets[i].work->test()) finish(static_cast<size_t>(i));
  }

  // The first step's backward on a GPU: no reductions beside it while the GEMMs time their
  // algorithms there (kernels::cuda: once per shape, on the call's own operands), or NCCL's
  // kernels beside the timing pick algorithms for a shared GPU that are slower alone (2 H100,
  // ViT-B/16: the step's GEMMs 38.4 against one GPU's 35.0 ms). The in-step stage of the timing
  // that follows (the next calls of each shape) runs beside them on purpose: it times the step as
  // it runs. Stage 0/1 only: stage 2/3 bound the full-size gradients alive during backward by
  // launching early.
  bool first_step = true;
  bool hold_first_step() const {
    return first_step && !sharded_grads() && device.is_cuda() && kernels::cuda::gemm_timing();
  }

  // Stage 0/1: a bucket whose gradients are final waits for the next overlap point
  // (LayerHooks::overlap_point; 2 H100, ViT-B/16: each bucket's all-reduce, 24 blocks of NCCL for
  // 0.17 ms, launched at once ran beside the next block's fc2 weight-gradient GEMM, which waited
  // for those SMs: 302 -> 460 µs; beside the attention backward it costs about 0.03 ms). A layer
  // without one launches what waits when its own gradients are ready; sync_gradients launches the
  // rest. With cfg.bucket_hold, what waits stays until that share of the gradients is final.
  std::vector<size_t> waiting;
  // Stage 0/1: buckets launched together at each point of this step's backward, in order (the
  // last entry: sync_gradients'), and the last step's (launch_bursts).
  std::vector<int> bursts, last_bursts;
  int64_t elements_total = 0;  // the gradients' elements in every bucket (Bucket::elements)
  // at_sync: sync_gradients launches what waits, unheld, and records the burst itself.
  void launch_waiting(bool at_sync = false) {
    if (waiting.empty()) return;
    if (!at_sync && cfg.bucket_hold > 0) {
      int64_t ready = 0;
      for (const Bucket& b : buckets)
        if (b.launched) ready += b.elements;
      for (size_t i : waiting) ready += buckets[i].elements;
      if (!schedule::launch_held_buckets(ready, elements_total, cfg.bucket_hold)) return;
    }
    if (!at_sync) bursts.push_back(static_cast<int>(waiting.size()));
    for (size_t i : waiting) launch(i);
    waiting.clear();
  }

  void grads_ready(nn::Layer& layer) {
    const bool hold = !cfg.overlap || hold_first_step();
    launch_waiting();
    const bool defer = !sharded_grads();
    for (nn::Parameter* p : layer_params[&layer]) {
      const size_t i = bucket_of[p];
      Bucket& b = buckets[i];
      if (++b.ready == static_cast<int>(b.params.size()) && !hold) {
        if (defer)
          waiting.push_back(i);
        else
          launch(i);
      }
    }
    progress();
  }

  // ---- parameter gathering ------------------------------------------------------------------

  std::map<const nn::Layer*, int> layer_pos;  // index in `layers`
  // ZeRO-3: all-gathers issued ahead of their layer's use, by layer position, in the order of
  // schedule::GatherWindow (shared with the plan and the simulator; the same on every rank).
  schedule::GatherWindow window;
  std::map<int, Gather> pending;

  // Starts the all-gather of the shards of `ps` (fp32). master: of the fp32 master values in
  // host memory instead of the device copy (offload: what a checkpoint must hold).
  Gather start_gather(const std::vector<nn::Parameter*>& ps, bool master = false) {
    if (!master) await_host(ps);  // the device copies the pack reads
    Gather g;
    g.params = ps;
    std::vector<int64_t> counts(size, 0);
    for (nn::Parameter* p : ps)
      for (int r = 0; r < size; ++r)
        counts[r] += chunk_size(shape_numel(shapes[index[p]]), r, size);
    // fp32 whatever the shards' dtype (offload's rounded device copy is widened by the pack).
    g.mine = Tensor::empty({counts[rank]}, DType::F32, device);
    int64_t o = 0;
    Copies cp(&copy_stats);
    for (nn::Parameter* p : ps) {
      const Tensor& v = master ? host[index[p]].value : shards[index[p]].value;
      if (master)
        span(g.mine, o, v.numel()).copy_from(v);
      else
        cp.add(g.mine, o, v, 0, v.numel());
      o += v.numel();
    }
    cp.run();
    int64_t total = 0;
    for (int64_t c : counts) total += c;
    g.all = Tensor::empty({total}, DType::F32, device);
    g.work = dp.all_gather_async(g.mine, g.all, counts);
    return g;
  }

  // Completes `g` and writes the full values (one copy_spans launch): into fresh tensors
  // (ZeRO-3) or into the parameters' existing storage (ZeRO-1/2 after the step). The host does not
  // wait for the gather: the compute stream does (Work::wait_on_device, kept in `settling` until
  // the host sees it done), so the buffers go back to the allocator once the unpack is issued
  // (every later NCCL operation waits for the compute stream first). Host backends wait here.
  void complete(Gather& g, bool allocate) {
    settling.add(std::move(g.work));
    if (allocate)
      for (nn::Parameter* p : g.params)
        p->value = Tensor::empty(shapes[index[p]], DType::F32, device);
    int64_t in = 0;
    Copies cp(&copy_stats);
    for (int r = 0; r < size; ++r)
      for (nn::Parameter* p : g.params) {
        const int64_t n = p->value.numel(), c = chunk_size(n, r, size);
        cp.add(p->value, chunk_begin(n, r, size), g.all, in, c);
        in += c;
      }
    cp.run();
    g.mine = Tensor();
    g.all = Tensor();
  }

  // ZeRO-1/2 after the step: every rank's updated shards into the full parameters' storage,
  // bucket by bucket, deferred to their first use (schedule::ParamGatherQueue, which the
  // simulator follows): the step issues the first zero_max_inflight_buckets gathers (forward
  // order), each layer's forward completes those holding its parameters and issues the next, so
  // the gathers run beside the next step's forward; materialize() completes them all. No
  // full-size staging buffer: at most zero_max_inflight_buckets buckets' gather buffers live.
  schedule::ParamGatherQueue param_queue;
  std::map<int, Gather> param_gathers;
  DataParallelPlugin::CopyStats copy_stats;  // every Copies run since the last take
  // Stage 1/2: every gather action, in order, since the last take (tests of the ordering).
  std::vector<schedule::ParamGatherQueue::Action> gather_log;
  void build_param_queue() {
    std::vector<int> first(buckets.size(), static_cast<int>(layers.size()));
    for (size_t l = 0; l < layers.size(); ++l)
      for (nn::Parameter* p : layer_params[layers[l]]) {
        int& f = first[bucket_of[p]];
        f = std::min(f, static_cast<int>(l));
      }
    param_queue = schedule::ParamGatherQueue(schedule::param_gather_order(first),
                                             std::max(1, cfg.zero_max_inflight_buckets));
  }
  void run_param_actions(const std::vector<schedule::ParamGatherQueue::Action>& acts) {
    for (const auto& a : acts) {
      gather_log.push_back(a);
      if (a.issue) {
        param_gathers.emplace(a.bucket, start_gather(buckets[a.bucket].params));
      } else {
        auto it = param_gathers.find(a.bucket);
        Gather g = std::move(it->second);
        param_gathers.erase(it);
        complete(g, false);
      }
    }
  }
  // Before `layer`'s forward: its parameters' buckets gathered (and the next ones issued).
  void params_ready(const nn::Layer& layer) {
    if (!param_queue.any_stale()) return;
    const auto it = layer_params.find(&layer);
    if (it == layer_params.end()) return;  // not a layer of this plugin
    for (nn::Parameter* p : it->second)
      run_param_actions(param_queue.need(static_cast<int>(bucket_of[p])));
  }
  void materialize_params() { run_param_actions(param_queue.need_all()); }

  // ZeRO-3: makes `layer`'s full values available. Issues the gathers the window starts now (this
  // layer's unless a prefetch did, then the next zero3_prefetch layers': forward the following
  // ones in `layers`, backward the preceding ones), then waits on this layer's gather only: the
  // prefetched ones run on the communicator while this layer computes.
  void fetch(nn::Layer& layer, bool backward) {
    if (cfg.zero_stage == 1 || cfg.zero_stage == 2) return params_ready(layer);
    if (layer_params[&layer].empty()) return;
    const int pos = layer_pos[&layer];
    for (int i : window.fetch(pos, backward))
      pending.emplace(i, start_gather(layer_params[layers[i]]));
    auto it = pending.find(pos);
    Gather g = std::move(it->second);
    pending.erase(it);
    complete(g, true);
  }

  // Completes and discards the prefetched gathers (their values are stale after a step).
  void drain() {
    for (auto& e : pending) e.second.work->wait();
    pending.clear();
    window.clear();
  }

  void gather_layer(nn::Layer& layer, bool with_grads) {
    auto& ps = layer_params[&layer];
    if (ps.empty()) return;
    if (cfg.zero_stage == 3) fetch(layer, true);
    if (!with_grads) return;
    // Stage 2/3: the full gradients were freed when the previous micro-batch's bucket launched
    // (that reduction may still be in flight: it has its own buffer).
    std::vector<Tensor*> fresh;  // zeroed in one launch (zero_all), not a memset each
    for (nn::Parameter* p : ps)
      if (!p->grad.defined()) {
        p->grad = Tensor::empty(shapes[index[p]], DType::F32, device);
        fresh.push_back(&p->grad);
      }
    zero_all(fresh);
  }

  void release_values(nn::Layer& layer) {
    if (cfg.zero_stage != 3) return;
    for (nn::Parameter* p : layer_params[&layer]) p->value = released();
  }
};

}  // namespace cai::parallel
