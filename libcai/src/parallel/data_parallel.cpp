#include "cai/parallel/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "cai/core/error.h"
#include "cai/ops/ops.h"
#include "cai/schedule/buckets.h"
#include "cai/schedule/offload.h"
#include "data_parallel_impl.h"
#include "kernels/cpu/parallel.h"
#include "kernels/device.h"

namespace cai::parallel {

using detail::ms_since;

DataParallelPlugin::DataParallelPlugin(dist::Communicator& dp, DataParallelConfig cfg)
    : impl_(std::make_unique<Impl>(dp, cfg)) {}

DataParallelPlugin::~DataParallelPlugin() = default;

std::string DataParallelPlugin::name() const {
  const std::string comm = impl_->cfg.bucket_dtype != DType::F32 ? " (bf16 buckets)"
                           : impl_->copy_engine                  ? " (copy-engine all-reduce)"
                           : impl_->exchange                     ? " (copy-engine exchange)"
                                                                 : "";
  return impl_->cfg.zero_stage == 0
             ? fmt::format("ddp×{}{}", impl_->size, comm)
             : fmt::format("zero-{}×{}{}", impl_->cfg.zero_stage, impl_->size, comm);
}
int DataParallelPlugin::rank() const {
  return impl_->rank;
}
int DataParallelPlugin::world_size() const {
  return impl_->size;
}
std::pair<int64_t, int64_t> DataParallelPlugin::shard_range(int64_t n, int r, int size) {
  return {chunk_begin(n, r, size), chunk_begin(n, r + 1, size)};
}

bool DataParallelPlugin::uses_copy_engine_all_reduce() const {
  return impl_->copy_engine;
}

bool DataParallelPlugin::uses_copy_engine_exchange() const {
  return impl_->exchange;
}

int DataParallelPlugin::num_buckets() const {
  return static_cast<int>(impl_->buckets.size());
}

std::vector<int> DataParallelPlugin::launch_bursts() const {
  return impl_->last_bursts;
}

std::vector<int64_t> DataParallelPlugin::bucket_numels() const {
  std::vector<int64_t> out;
  for (const Bucket& b : impl_->buckets) out.push_back(b.numel);
  return out;
}

void DataParallelPlugin::setup(nn::ViT& model) {
  std::vector<nn::Layer*> all;
  for (auto& l : model.layers()) all.push_back(l.get());
  setup_layers(all);
}

void DataParallelPlugin::setup_layers(const std::vector<nn::Layer*>& layers) {
  Impl& m = *impl_;
  CAI_CHECK(m.params.empty() && m.layers.empty(), "[data_parallel] setup() called twice");
  m.layers = layers;
  for (size_t i = 0; i < layers.size(); ++i) m.layer_pos[layers[i]] = static_cast<int>(i);
  for (nn::Layer* l : layers) l->collect(m.params);
  if (!m.params.empty()) m.device = m.params.front()->value.device();
  for (size_t i = 0; i < m.params.size(); ++i) {
    const nn::Parameter& p = *m.params[i];
    CAI_CHECK(p.value.defined() && p.value.device() == m.device && p.value.dtype() == DType::F32,
              "[data_parallel] parameter {} is {}: every parameter must be an fp32 tensor on {} "
              "(the first one's device)",
              p.name, p.value.defined() ? p.value.str() : "undefined", m.device.str());
    m.index[m.params[i]] = i;
    m.shapes.push_back(p.value.shape());
  }
  CAI_CHECK(m.dp.supports(m.device),
            "[data_parallel] the parameters are on {} but communicator '{}' cannot move tensors "
            "there (MPI moves CPU tensors: build an NCCL communicator with dist::make_nccl for "
            "GPU parameters)",
            m.device.str(), m.dp.name());
  CAI_CHECK(!m.cfg.cpu_offload || m.cfg.zero_stage >= 1,
            "[data_parallel] cpu_offload = true needs zero_stage >= 1 (got {}): the host holds "
            "the optimizer's shard",
            m.cfg.zero_stage);
  std::vector<char> has_params;
  for (nn::Layer* l : layers) {
    std::vector<nn::Parameter*> ps;
    l->collect(ps);
    has_params.push_back(!ps.empty());
    m.layer_params[l] = ps;
  }
  m.window = schedule::GatherWindow(has_params, m.cfg.zero3_prefetch);
  // Every rank starts from rank 0's parameters: broadcast through a staging buffer of at most
  // kBroadcastElements (64M, 256 MiB; a 6.4B model's parameters are 26 GB), parameters packed
  // whole or split across fills.
  if (m.size > 1) {
    constexpr int64_t kBroadcastElements = int64_t{1} << 26;
    int64_t total = 0;
    for (nn::Parameter* p : m.params) total += p->value.numel();
    Tensor flat = Tensor::empty({std::min(total, kBroadcastElements)}, DType::F32, m.device);
    size_t i = 0;
    int64_t at = 0;  // elements of params[i] already sent
    while (i < m.params.size()) {
      struct Piece {
        nn::Parameter* p;
        int64_t from, n, to;
      };
      std::vector<Piece> pieces;
      int64_t fill = 0;
      Copies in;
      while (i < m.params.size() && fill < flat.numel()) {
        nn::Parameter* p = m.params[i];
        const int64_t n = std::min(p->value.numel() - at, flat.numel() - fill);
        in.add(flat, fill, p->value, at, n);
        pieces.push_back({p, at, n, fill});
        fill += n;
        at += n;
        if (at == p->value.numel()) ++i, at = 0;
      }
      in.run();
      Tensor part = flat.narrow(0, fill);
      m.dp.broadcast(part, 0);
      Copies out;
      for (const Piece& pc : pieces) out.add(pc.p->value, pc.from, flat, pc.to, pc.n);
      out.run();
    }
  }
  if (m.offload()) {
    CAI_CHECK(m.cfg.offload_dtype == DType::F32 || m.cfg.offload_dtype == DType::BF16 ||
                  m.cfg.offload_dtype == DType::F16,
              "[data_parallel] offload dtype {}: expected fp32, bf16 or fp16",
              dtype_name(m.cfg.offload_dtype));
    // The host layout (schedule::offload_layout, which the plan and the simulator read too): the
    // rounded parameters' chunks first, then the fp32 ones, so each device part is one contiguous
    // upload, every chunk on a 64-byte line.
    std::vector<int64_t> numels;
    std::vector<char> rounded_flags;
    for (nn::Parameter* p : m.params) {
      numels.push_back(p->value.numel());
      rounded_flags.push_back(Impl::rounded_on_device(*p) ? 1 : 0);
    }
    const schedule::OffloadLayout layout =
        schedule::offload_layout(numels, rounded_flags, {}, m.cfg.zero_stage, m.rank, m.size,
                                 static_cast<int64_t>(dtype_size(m.cfg.offload_dtype)), 2);
    const int64_t rounded = layout.host_rounded_elements, mine = layout.host_elements;
    m.shard_elements = layout.shard;
    m.host_offset = layout.host_offset;
    // The masters in host memory first; stage 3 then frees the full values before the device
    // copy is made (setup's peak: the full values, not the full values and the copy).
    m.host_value = Tensor::zeros({mine}, DType::F32, Device::cpu());
    m.host_grad = Tensor::zeros({mine}, DType::F32, Device::cpu());
    for (size_t i = 0; i < m.params.size(); ++i) {
      nn::Parameter* p = m.params[i];
      const int64_t n = p->value.numel();
      const int64_t c0 = chunk_begin(n, m.rank, m.size), c = chunk_size(n, m.rank, m.size);
      nn::Parameter h;
      h.name = p->name;
      h.weight_decay = p->weight_decay;
      h.value = span(m.host_value, m.host_offset[i], c);
      if (c > 0) h.value.copy_from(span(p->value, c0, c));
      h.grad = span(m.host_grad, m.host_offset[i], c);
      m.host.push_back(std::move(h));
      if (m.cfg.zero_stage == 3) p->value = m.released();
    }
    // The device copy (uploaded once the lane exists, below) and, stage 1 only, the gradient
    // shard the buckets' sums land in (the host's layout).
    m.dev_value = Tensor::empty({rounded}, m.cfg.offload_dtype, m.device);
    m.dev_value32 = Tensor::empty({mine - rounded}, DType::F32, m.device);
    if (!m.sharded_grads()) m.dev_grad = Tensor::zeros({mine}, DType::F32, m.device);
    for (size_t i = 0; i < m.params.size(); ++i) {
      const nn::Parameter& h = m.host[i];
      const int64_t off = m.host_offset[i], c = h.value.numel();
      nn::Parameter s;
      s.name = h.name;
      s.weight_decay = h.weight_decay;
      s.value = Impl::rounded_on_device(*m.params[i]) ? span(m.dev_value, off, c)
                                                      : span(m.dev_value32, off - rounded, c);
      if (m.dev_grad.defined()) s.grad = span(m.dev_grad, off, c);
      m.shards.push_back(std::move(s));
    }
  } else if (m.cfg.zero_stage >= 1) {
    for (nn::Parameter* p : m.params) {
      const int64_t n = p->value.numel();
      const int64_t c0 = chunk_begin(n, m.rank, m.size), c = chunk_size(n, m.rank, m.size);
      nn::Parameter s;
      s.name = p->name;
      s.weight_decay = p->weight_decay;
      s.value = Tensor::empty({c}, DType::F32, m.device);
      copy_span(s.value, 0, p->value, c0, c);
      // Stage 1: set below, once the gradients have their final storage.
      if (m.cfg.zero_stage >= 2) s.grad = Tensor::zeros({c}, DType::F32, m.device);
      m.shards.push_back(std::move(s));
    }
  }
  m.build_buckets();
  if (schedule::shard_grads_are_views(m.cfg.zero_stage, m.offload())) {
    // Stage 1 keeps the full gradients (in the buckets or beside them), all-reduced in place:
    // each shard's gradient is a view of this rank's chunk of its parameter's, not a copy (no
    // copy after the last reduction, 4 bytes an element of the shard less; the plan and the
    // simulator follow schedule::shard_grads_are_views).
    for (size_t i = 0; i < m.params.size(); ++i) {
      const Tensor& g = m.params[i]->grad;
      const int64_t n = m.params[i]->value.numel();
      CAI_CHECK(g.defined() && g.numel() == n && g.dtype() == DType::F32,
                "[data_parallel] ZeRO-1: parameter {} has no fp32 gradient of its {} elements",
                m.params[i]->name, n);
      m.shards[i].grad = span(g, chunk_begin(n, m.rank, m.size), chunk_size(n, m.rank, m.size));
    }
  }
  m.build_param_queue();
  if (m.offload()) {
    int64_t most = 1;  // the largest reduced chunk: the staging buffers' size
    for (const Bucket& b : m.buckets) most = std::max(most, b.counts[m.rank]);
    m.lane = std::make_unique<detail::OffloadLane>(m.device, most);
    m.host_stale.assign(m.buckets.size(), 1);
    m.host_sq.assign(m.host.size(), 0.0);
    m.host_bad.assign(m.host.size(), 0);
    m.host_sq_valid.assign(m.host.size(), 0);
    m.upload();
  }
  if (m.cfg.copy_engine_all_reduce && m.device.is_cuda() && m.grad_views()) {
    int64_t most = 0;
    for (const auto& b : m.buckets) most = std::max(most, b.numel);
    m.copy_engine = most > 0 && m.dp.enable_copy_engine_all_reduce(most);
  }
  if (m.one_allocation() && m.all.numel() > 0) {
    m.exchange = m.dp.enable_copy_engine_exchange(m.all.numel());
    if (m.exchange) {
      // Element offsets from `all` to every rank's copy of it (16-byte multiples: both 256-byte
      // aligned allocations).
      const auto received = m.dp.exchange_received();
      const auto base = reinterpret_cast<intptr_t>(m.all.data<float>());
      for (int r = 0; r < m.size; ++r) {
        const intptr_t bytes = r == m.rank ? 0 : reinterpret_cast<intptr_t>(received[r]) - base;
        CAI_CHECK(bytes % 16 == 0,
                  "[data_parallel] rank {}'s copy of the gradients lies {} bytes from them: "
                  "expected a multiple of 16",
                  r, static_cast<int64_t>(bytes));
        m.replica_delta.push_back(static_cast<int64_t>(bytes / 4));
      }
    }
  }
  if (m.cfg.zero_stage >= 2)
    for (nn::Parameter* p : m.params) p->grad = Tensor();  // created per layer in backward
  if (m.cfg.zero_stage == 3) {
    for (nn::Parameter* p : m.params) p->value = m.released();
    // Its parameters live between the passes as this rank's shards only: no rounded copies kept.
    for (nn::Layer* l : m.layers) l->keep_compute_copies = false;
  }

  // Hooks. Final micro-batch (and every micro-batch for stage 2/3): reduce as layers finish.
  auto before_fwd = [&m](nn::Layer& l) {
    if (m.cfg.zero_stage >= 1) m.fetch(l, false);  // stage 1/2: the step's deferred gathers
  };
  auto after_fwd = [&m](nn::Layer& l) { m.release_values(l); };
  auto before_bwd = [&m](nn::Layer& l) { m.gather_layer(l, m.cfg.zero_stage >= 2); };
  auto after_bwd_reduce = [&m](nn::Layer& l) {
    m.grads_ready(l);
    m.release_values(l);
  };
  m.last_hooks = nn::LayerHooks{before_fwd, after_fwd, before_bwd, after_bwd_reduce,
                                [&m] { m.launch_waiting(); }};
  m.accumulate_hooks = m.sharded_grads()
                           ? m.last_hooks
                           : nn::LayerHooks{before_fwd, after_fwd, before_bwd,
                                            [&m](nn::Layer& l) { m.release_values(l); }, nullptr};
  m.eval = nn::LayerHooks{before_fwd, after_fwd, nullptr, nullptr, nullptr};
}

std::vector<nn::Parameter*> DataParallelPlugin::optimizer_parameters(nn::ViT&) {
  Impl& m = *impl_;
  if (m.cfg.zero_stage == 0) return m.params;
  CAI_CHECK(!m.shards.empty() || m.params.empty(),
            "[data_parallel] call setup(model) before optimizer_parameters()");
  std::vector<nn::Parameter*> out;
  for (auto& s : m.offload() ? m.host : m.shards) out.push_back(&s);
  return out;
}

const nn::LayerHooks* DataParallelPlugin::train_hooks(bool last_micro_batch) {
  impl_->last_micro = last_micro_batch;
  if (impl_->size == 1 && impl_->cfg.zero_stage == 0) return nullptr;
  return last_micro_batch || impl_->sharded_grads() ? &impl_->last_hooks : &impl_->accumulate_hooks;
}

const nn::LayerHooks* DataParallelPlugin::eval_hooks() {
  return impl_->cfg.zero_stage >= 1 ? &impl_->eval : nullptr;
}

void DataParallelPlugin::sync_gradients(nn::ViT&) {
  sync_layer_gradients();
}

void DataParallelPlugin::sync_layer_gradients() {
  Impl& m = *impl_;
  m.settle_host_step();  // a host step beside a forward that had no backward (the lane's reads)
  // Buckets not launched yet: waiting for an overlap point that did not come, overlap off, or a
  // layer that never ran (stage 2/3: reduce what has gradients, zeros for the rest).
  int at_sync = 0;  // what waited and what no overlap point launched: one burst
  for (const Bucket& b : m.buckets) at_sync += b.launched ? 0 : 1;
  m.launch_waiting(/*at_sync=*/true);
  for (size_t i = 0; i < m.buckets.size(); ++i) {
    Bucket& b = m.buckets[i];
    if (b.launched) continue;
    if (m.sharded_grads()) {
      bool any = false;
      for (nn::Parameter* p : b.params) any = any || p->grad.defined();
      if (!any) continue;
      for (nn::Parameter* p : b.params)
        if (!p->grad.defined()) p->grad = Tensor::zeros(m.shapes[m.index[p]], DType::F32, m.device);
    }
    m.launch(i);
  }
  if (!m.sharded_grads()) {
    if (at_sync > 0) m.bursts.push_back(at_sync);
    m.last_bursts = std::exchange(m.bursts, {});
  }
  if (m.exchange) {
    // Every bucket pushed. The compute stream waits for the peers' copies to land (the host goes
    // on); their sum is left to the clip and the optimizer step, which read it fused
    // (sum_exchange otherwise).
    m.settle_pushes();
    for (Bucket& b : m.buckets) {
      m.pushing.push_back(std::move(b.work));
      b.launched = false;
    }
    m.settling.add(m.dp.exchange_wait_async());
    m.exchange_pending = true;
  }
  for (size_t i = 0; i < m.buckets.size(); ++i) m.finish(i);
  m.first_step = false;
  // Stage 1 with offload: this rank's chunk of the summed gradients feeds its device shard
  // (without offload the shard gradients are views of that chunk).
  if (m.cfg.zero_stage == 1 && !schedule::shard_grads_are_views(1, m.offload())) {
    Copies cp(&m.copy_stats);  // one launch
    for (size_t i = 0; i < m.params.size(); ++i) {
      const int64_t n = m.params[i]->grad.numel();
      cp.add(m.shards[i].grad, 0, m.params[i]->grad, chunk_begin(n, m.rank, m.size),
             m.shards[i].grad.numel());
    }
    cp.run();
  }
  // Offload: the reduced gradient shard is in host memory, where the optimizer (and the clipping
  // and the fp16 overflow check before it) reads it: stage 2/3 once the lane's last adds are
  // done, stage 1 by one copy of its device shard.
  if (m.streams()) {
    const auto t0 = std::chrono::steady_clock::now();
    m.lane->flush();
    // Buckets that streamed nothing this step (no layer of theirs ran): zeros, as zero_grad's
    // would have been.
    for (size_t i = 0; i < m.buckets.size(); ++i) {
      if (!m.host_stale[i]) continue;
      for (nn::Parameter* p : m.buckets[i].params) {
        const size_t k = m.index[p];
        m.host[k].grad.zero_();
        m.host_sq[k] = 0.0, m.host_bad[k] = 0, m.host_sq_valid[k] = 1;
      }
      m.host_stale[i] = 0;
    }
    m.flush_ms += ms_since(t0);
  } else if (m.offload()) {
    m.host_grad.copy_from(m.dev_grad);  // the same layout
  }
}

void DataParallelPlugin::finish_gradients(nn::ViT&) {
  impl_->sum_exchange();
}

void DataParallelPlugin::sum_pending_gradients() {
  impl_->sum_exchange();
}

Tensor DataParallelPlugin::clip_grad_norm(optim::Optimizer& opt, double max_norm) {
  Impl& m = *impl_;
  m.settle_host_step();
  if (m.exchange_pending) {
    // The sum of squares of the sum over the ranks, the factor left to the step, which sums too.
    if (m.fuses_exchange(opt))
      return optim::clip_grad_norm_async(train::optimizer_params(opt), max_norm, nullptr, nullptr,
                                         nullptr, &opt, &m.replica_delta);
    m.sum_exchange();
  }
  // DDP: every rank holds the full (identical) gradients; ZeRO: each holds its shard.
  std::function<double(double)> reduce;
  if (m.cfg.zero_stage >= 1) reduce = [&m](double sq) { return m.dp.all_reduce_scalar(sq); };
  // The factor applied by opt's next step (optimizer_step follows) where it can be (DDP on a
  // GPU; offload's host shards: the sum of squares read here, the factor in the host Adam).
  const auto t0 = std::chrono::steady_clock::now();
  if (Tensor norm = m.clip_from_streamed(opt, max_norm, reduce); norm.defined()) {
    m.clip_ms += ms_since(t0);
    return norm;
  }
  Tensor norm = optim::clip_grad_norm_async(train::optimizer_params(opt), max_norm, reduce, nullptr,
                                            nullptr, &opt);
  if (m.offload()) m.clip_ms += ms_since(t0);
  return norm;
}

void DataParallelPlugin::optimizer_step(optim::Optimizer& opt) {
  Impl& m = *impl_;
  m.settle_host_step();
  m.drain();  // ZeRO-3 gathers issued ahead of a use that did not come: stale after the step
  // ZeRO-1/2: the last step's gathers of layers that did not run forward (their packs read the
  // shards before this step writes them; the fresh gathers below supersede them).
  m.materialize_params();
  if (m.exchange_pending) {
    if (m.fuses_exchange(opt)) {
      opt.sum_replicas(m.replica_delta);
      opt.step();
      m.end_exchange();  // after the step's reads
      return;
    }
    m.sum_exchange();
  }
  const auto t0 = std::chrono::steady_clock::now();
  if (m.offload() && m.step_uploading(opt)) {
    if (m.cfg.zero_stage == 1 || m.cfg.zero_stage == 2) m.run_param_actions(m.param_queue.begin());
    return;
  }
  opt.step();
  if (m.offload()) {
    m.step_ms += ms_since(t0);
    // The updated shard back to the device, in offload_dtype (the compute stream waits for it).
    const auto t1 = std::chrono::steady_clock::now();
    m.upload();
    m.upload_ms += ms_since(t1);
  }
  // Every rank needs the updated full parameters for the next forward: the first gathers start
  // now, the rest as the next forward reaches them (materialize_parameters for other readers).
  if (m.cfg.zero_stage == 1 || m.cfg.zero_stage == 2) m.run_param_actions(m.param_queue.begin());
}

Tensor DataParallelPlugin::Impl::clip_from_streamed(optim::Optimizer& opt, double max_norm,
                                                    const std::function<double(double)>& reduce) {
  // Only where the statistics are those of what the step reads: every host gradient final from
  // the last micro-batch's adds (or zeroed), no fp16 loss scale (its unscale rewrites them), and
  // an optimizer stepping exactly the host shards in host memory.
  if (!streams() || cfg.offload_dtype == DType::F16 || !opt.can_defer_clip(Device::cpu()) ||
      !steps_host_shards(opt))
    return Tensor();
  for (char v : host_sq_valid)
    if (!v) return Tensor();
  // The sums in clip_grad_norm_async's order and precision: per tensor in the optimizer's
  // order, in double, rounded to fp32 (the statistics' output), then reduced over the ranks.
  double local = 0.0;
  for (const nn::Parameter* p : train::optimizer_params(opt))
    if (p->grad.defined() && p->grad.numel() > 0)
      local += host_sq[static_cast<size_t>(p - host.data())];
  double sq = static_cast<float>(local);
  if (reduce) sq = reduce(sq);
  opt.defer_clip(Tensor::from_vector(std::vector<float>{static_cast<float>(sq)}, {1}),
                 static_cast<float>(max_norm));
  ++clips_streamed;
  return Tensor::from_vector(std::vector<float>{static_cast<float>(std::sqrt(sq))}, {1});
}

bool DataParallelPlugin::Impl::steps_host_shards(const optim::Optimizer& opt) const {
  std::set<const nn::Parameter*> mine;
  for (const auto& g : opt.groups())
    for (const nn::Parameter* p : g.params)
      if (p < host.data() || p >= host.data() + host.size() || !mine.insert(p).second) return false;
  return mine.size() == host.size();
}

bool DataParallelPlugin::Impl::step_uploading(optim::Optimizer& opt) {
  if (cfg.offload_dtype != DType::BF16 || !dev_value.defined() || !steps_host_shards(opt))
    return false;
  const int64_t r = dev_value.numel();
  // The fp32 part (biases, norms, tokens: few elements, one upload) first, then the rounded
  // weights in model order, so the next forward's first layers find theirs first (the order
  // and the copies the plan and the simulator read: schedule::offload_layout's upload).
  step_order = schedule::offload_step_order(host_offset, r);
  step_pos.assign(host.size(), 0);
  size_t n32 = 0;
  std::vector<nn::Parameter*> ps;
  for (size_t k = 0; k < step_order.size(); ++k) {
    step_pos[step_order[k]] = k;
    ps.push_back(&host[step_order[k]]);
    n32 += host_offset[step_order[k]] >= r ? 1 : 0;
  }
  step_staged.assign(ps.size(), 0);
  // Each parameter is sent as soon as it is stepped (a reader waits for it, not for a buffer).
  auto mirror = [this, r](size_t k) -> uint16_t* {
    const size_t i = step_order[k];
    const int64_t c = host[i].value.numel();
    if (host_offset[i] >= r || c == 0) return nullptr;  // the fp32 part: uploaded whole
    void* at = lane->stage(host_offset[i], c);
    step_staged[k] = at != nullptr;
    return static_cast<uint16_t*>(at);
  };
  auto done = [this, r, n32](size_t k) {
    const size_t i = step_order[k];
    const int64_t c = host[i].value.numel();
    if (host_offset[i] >= r) {
      if (k + 1 == n32) {
        const auto t0 = std::chrono::steady_clock::now();
        lane->upload(host_value, r, dev_value32, 0, dev_value32.numel());
        upload_ms += ms_since(t0);
      }
    } else if (step_staged[k]) {
      lane->send_staged();
    } else if (c > 0) {  // larger than a staging buffer: cast and sent by the plain upload
      lane->upload(host_value, host_offset[i], dev_value, host_offset[i], c);
    }
    {
      std::lock_guard<std::mutex> l(step_m);
      step_sent = k + 1;
    }
    step_cv.notify_all();
  };
  // On this thread: after the compute stream's reads so far (the last gathers' packs).
  lane->begin_staged(dev_value);
  std::function<void()> run = opt.ordered_step(ps, mirror, done);
  step_sent = 0;
  step_running = true;
  const bool threaded = cfg.offload_step_overlap;
  auto body = [this, threaded, run = std::move(run)] {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      // A new thread's CUDA calls go to device 0 until it sets the parameters' device; its
      // parallel_for calls wait for the CPU pool instead of running on one core.
      if (threaded && device.is_cuda()) kernels::cuda::set_device(device.index);
      std::optional<kernels::cpu::PoolWaits> waits;
      if (threaded) waits.emplace();
      run();
      lane->end_staged();
    } catch (...) {
      step_error = std::current_exception();
    }
    step_ms += ms_since(t0);
    {
      std::lock_guard<std::mutex> l(step_m);
      step_running = false;
    }
    step_cv.notify_all();
  };
  if (!threaded) {
    body();
    if (step_error) std::rethrow_exception(std::exchange(step_error, nullptr));
    return true;
  }
  ++steps_overlapped;
  step_thread = std::thread(std::move(body));
  return true;
}

void DataParallelPlugin::zero_grad(nn::ViT&, optim::Optimizer& opt) {
  Impl& m = *impl_;
  // The copy-engine exchange: a skipped step read nothing; this rank's copies have left the
  // buckets before they are zeroed.
  m.end_exchange();
  m.settle_pushes();
  // Offload: the host gradients are overwritten, not zeroed: stage 2/3 by the next step's first
  // chunks, stage 1 by sync_gradients' copy of its device shard.
  if (m.streams()) {
    std::fill(m.host_stale.begin(), m.host_stale.end(), 1);
    std::fill(m.host_sq_valid.begin(), m.host_sq_valid.end(), 0);
  } else if (schedule::shard_grads_are_views(m.cfg.zero_stage, m.offload())) {
    opt.drop_deferred();  // the shard gradients are zeroed with the full ones below
  } else if (!m.offload() && (m.cfg.zero_stage >= 1 || !m.grad_views())) {
    opt.zero_grad();  // else: the buckets below
  }
  if (m.dev_grad.defined()) m.dev_grad.zero_();
  if (m.cfg.zero_stage >= 2) return;  // full gradients are created per layer
  if (m.all.defined()) {
    m.all.zero_();  // every gradient, one fill
    return;
  }
  if (m.grad_views()) {
    for (Bucket& b : m.buckets) b.flat.zero_();  // every gradient, one fill per bucket
    return;
  }
  std::vector<Tensor*> grads;
  for (nn::Parameter* p : m.params) grads.push_back(&p->grad);
  zero_all(grads);
}

double DataParallelPlugin::all_reduce_sum(double v) {
  return impl_->dp.all_reduce_scalar(v);
}

double DataParallelPlugin::all_reduce_max(double v) {
  return impl_->dp.all_reduce_scalar(v, dist::ReduceOp::Max);
}

void DataParallelPlugin::wait_host_step() {
  impl_->settle_host_step();
}

void DataParallelPlugin::materialize_parameters() {
  Impl& m = *impl_;
  m.settle_host_step();
  m.materialize_params();  // ZeRO-1/2: the step's deferred gathers
  // Offload with a rounded device copy: the full values from the fp32 masters in host memory
  // (checkpoints and exports hold them), a layer at a time.
  const bool master = m.offload() && m.cfg.offload_dtype != DType::F32;
  if (m.cfg.zero_stage != 3 && !master) return;
  m.drain();
  for (nn::Layer* l : m.layers)
    if (!m.layer_params[l].empty()) {
      Gather g = m.start_gather(m.layer_params[l], master);
      m.complete(g, m.cfg.zero_stage == 3);
    }
}

bool DataParallelPlugin::parameters_stale() const {
  return impl_->param_queue.any_stale();
}

DataParallelPlugin::CopyStats DataParallelPlugin::take_copy_stats() {
  return std::exchange(impl_->copy_stats, {});
}

std::vector<schedule::ParamGatherQueue::Action> DataParallelPlugin::take_param_gather_log() {
  return std::exchange(impl_->gather_log, {});
}

int64_t DataParallelPlugin::parameter_bytes() const {
  int64_t b = 0;
  for (nn::Parameter* p : impl_->params)
    if (p->value.defined()) b += static_cast<int64_t>(p->value.nbytes());
  // Stage 1/2 also hold the full parameters: their shard values are the optimizer's copies.
  // (With cpu_offload the host copies of the shards are not counted: host memory.)
  for (const auto& s : impl_->shards) b += static_cast<int64_t>(s.value.nbytes());
  return b;
}

DataParallelPlugin::OffloadTraffic DataParallelPlugin::offload_traffic() const {
  impl_->settle_host_step();
  const Impl& m = *impl_;
  OffloadTraffic t;
  if (!m.lane) return t;
  t.shard_elements = m.shard_elements;
  t.device_gradient_bytes = m.dev_grad.defined() ? static_cast<int64_t>(m.dev_grad.nbytes()) : 0;
  t.chunks_down = m.lane->chunks_pushed();
  t.bytes_down = m.lane->bytes_downloaded();
  t.bytes_up = m.lane->bytes_uploaded();
  t.staging_bytes = m.lane->staging_bytes();
  t.flush_ms = m.flush_ms;
  t.step_ms = m.step_ms;
  t.upload_ms = m.upload_ms;
  t.clip_ms = m.clip_ms;
  t.clips_streamed = m.clips_streamed;
  t.wait_ms = m.wait_ms;
  t.steps_overlapped = m.steps_overlapped;
  t.gathers_beside = m.gathers_beside;
  return t;
}

std::map<std::string, Tensor> DataParallelPlugin::full_model_state(nn::ViT&) {
  throw NotImplemented(
      "[checkpoint] DataParallelPlugin alone does not gather checkpoints: wrap it in "
      "HybridParallelPlugin (what vit_train does)");
}
std::map<std::string, Tensor> DataParallelPlugin::full_optimizer_state(nn::ViT& model,
                                                                       optim::Optimizer&) {
  return full_model_state(model);
}
std::vector<train::OwnedSlice> DataParallelPlugin::owned_state(nn::ViT& model,
                                                               optim::Optimizer& opt) {
  impl_->settle_host_step();
  return train::Plugin::owned_state(model, opt);
}

void DataParallelPlugin::load_optimizer_state(nn::ViT& model, optim::Optimizer&,
                                              const std::map<std::string, Tensor>&) {
  full_model_state(model);
}

}  // namespace cai::parallel
