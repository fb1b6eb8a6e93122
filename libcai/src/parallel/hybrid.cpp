#include "cai/parallel/hybrid.h"

#include <set>

#include "cai/core/error.h"
#include "cai/optim/optimizer.h"

namespace cai::parallel {

struct HybridParallelPlugin::Impl {
  dist::Communicator& world;
  HybridParallelConfig cfg;
  dist::ProcessMesh mesh;
  dist::MeshCoord me;
  std::unique_ptr<dist::Communicator> tp_comm, pp_comm, dp_comm;
  std::shared_ptr<nn::TensorParallel> tp;
  std::unique_ptr<PipelinePlugin> pipe;
  std::unique_ptr<DataParallelPlugin> dp;
  train::Plugin* inner = nullptr;
  std::set<std::string> sharded;        // names of tensor-parallel-sharded parameters
  std::set<std::string> primary;        // of those, the ones whose part this rank counts once
  std::map<std::string, Shape> shapes;  // every parameter's shape on this rank
  Device device;

  Impl(dist::Communicator& w, HybridParallelConfig c)
      : world(w), cfg(std::move(c)), mesh(w.size(), cfg.tp_size, cfg.pp_size) {
    me = mesh.coord(world.rank());
    CAI_CHECK(cfg.pp_size == 1 || cfg.dp.zero_stage <= 1,
              "[hybrid] zero_stage {} with pipeline {}: ZeRO 2/3 need whole-model gradient and "
              "parameter ownership per rank; use zero_stage 0 or 1 with pipeline parallelism",
              cfg.dp.zero_stage, cfg.pp_size);
    // Groups: tp (same dp and pp, by tp), pp (same dp and tp, by pp), dp (same pp and tp, by dp).
    tp_comm = world.split(me.dp * mesh.pp_size() + me.pp, me.tp,
                          fmt::format("tp[dp={},pp={}]", me.dp, me.pp));
    pp_comm = world.split(me.dp * mesh.tp_size() + me.tp, me.pp,
                          fmt::format("pp-state[dp={},tp={}]", me.dp, me.tp));
    if (cfg.tp_size > 1)
      tp = std::make_shared<nn::TensorParallel>(*tp_comm, cfg.tp_mode, cfg.sequence_parallel,
                                                cfg.tp_depth);
    else
      CAI_CHECK(!cfg.sequence_parallel,
                "[hybrid] sequence_parallel = true needs a tensor-parallel size above 1 (got {})",
                cfg.tp_size);
    dp_comm = world.split(me.pp * mesh.tp_size() + me.tp, me.dp,
                          fmt::format("dp[pp={},tp={}]", me.pp, me.tp));
    if (cfg.pp_size > 1 || cfg.pipeline_executor) {
      PipelineConfig pc = cfg.pipeline;
      pc.dp = cfg.dp;
      pipe = std::make_unique<PipelinePlugin>(world, mesh, pc);
      inner = pipe.get();
    } else {
      dp = std::make_unique<DataParallelPlugin>(*dp_comm, cfg.dp);
      inner = dp.get();
    }
  }

  // The clip's reduction of the squared norm, which the compute stream waits for on the device.
  dist::DeviceWaits settling;

  // Drains the tensor-parallel operations and the clip's reduction still pending, bounded by the
  // timeout: a dead peer is named here rather than hanging a later device read.
  void drain() {
    if (tp) tp->drain();
    settling.drain();
  }

  // Checkpoint gathers, collective over the pipeline and tensor groups.
  // The owning stage's `part` (of `shape`, on `dev`) on every stage of this pipeline; returns
  // false when no stage holds it. With one stage: whether this rank holds it.
  bool from_owner(Tensor& part, const Shape& shape, bool mine, Device dev) {
    if (mesh.pp_size() == 1) return mine;
    const int owner =
        static_cast<int>(pp_comm->all_reduce_scalar(mine ? me.pp : -1, dist::ReduceOp::Max));
    if (owner < 0) return false;
    part = mine ? part.clone() : Tensor::zeros(shape, DType::F32, dev);
    pp_comm->broadcast(part, owner);
    return true;
  }
  // This rank's tensor-parallel part of `p`'s tensor -> the full tensor on the host.
  Tensor unshard_tp(const Tensor& part, const nn::Parameter& p) {
    if (!p.shard.sharded()) return part.to(Device::cpu()).clone();
    const int T = mesh.tp_size();
    const int64_t n = part.numel();
    Tensor all = Tensor::empty({n * T}, DType::F32, part.device());
    tp_comm->all_gather(part.reshape({n}), all, std::vector<int64_t>(T, n));
    const Tensor host = all.to(Device::cpu());
    std::vector<Tensor> parts;
    for (int r = 0; r < T; ++r)
      parts.push_back(host.narrow(r * n, n).reshape(part.shape()).clone());
    return nn::unshard(parts, p.shard);
  }
};

HybridParallelPlugin::HybridParallelPlugin(dist::Communicator& world, HybridParallelConfig cfg)
    : impl_(std::make_unique<Impl>(world, std::move(cfg))) {}

HybridParallelPlugin::~HybridParallelPlugin() = default;

const dist::ProcessMesh& HybridParallelPlugin::mesh() const {
  return impl_->mesh;
}
dist::MeshCoord HybridParallelPlugin::coord() const {
  return impl_->me;
}
std::shared_ptr<nn::TensorParallel> HybridParallelPlugin::tensor_parallel() const {
  return impl_->tp;
}
PipelinePlugin* HybridParallelPlugin::pipeline() {
  return impl_->pipe.get();
}
DataParallelPlugin* HybridParallelPlugin::data_parallel() {
  return impl_->dp.get();
}

std::string HybridParallelPlugin::name() const {
  const Impl& m = *impl_;
  return fmt::format("hybrid {}: {}{}", m.mesh.describe(),
                     m.tp ? m.tp->describe() + ", " : std::string(), m.inner->name());
}
int HybridParallelPlugin::rank() const {
  return impl_->world.rank();
}
int HybridParallelPlugin::world_size() const {
  return impl_->world.size();
}

void HybridParallelPlugin::setup(nn::ViT& model) {
  Impl& m = *impl_;
  const nn::TensorParallel* mt = model.tensor_parallel();
  const int model_tp = mt ? mt->size() : 1;
  CAI_CHECK(model_tp == m.mesh.tp_size() && (!m.tp || mt == m.tp.get()),
            "[hybrid] the model is split over {} tensor-parallel ranks but the plugin's mesh has "
            "tp {}: build the ViT with plugin.tensor_parallel()",
            model_tp, m.mesh.tp_size());
  m.device = model.device();
  for (nn::Parameter* p : model.parameters()) {
    m.shapes[p->name] = p->value.shape();
    if (p->shard.sharded()) m.sharded.insert(p->name);
    if (p->shard.sharded() && p->shard.primary()) m.primary.insert(p->name);
  }
  m.inner->setup(model);
}

std::vector<nn::Parameter*> HybridParallelPlugin::optimizer_parameters(nn::ViT& model) {
  return impl_->inner->optimizer_parameters(model);
}

train::StepMetrics HybridParallelPlugin::forward_backward(nn::ViT& model,
                                                          const std::vector<data::Batch>& batches,
                                                          float weight,
                                                          const train::Criterion& crit,
                                                          const nn::ForwardCtx& step_ctx) {
  train::StepMetrics r = impl_->pipe
                             ? impl_->pipe->forward_backward(model, batches, weight, crit, step_ctx)
                             : Plugin::forward_backward(model, batches, weight, crit, step_ctx);
  impl_->drain();
  return r;
}

train::StepMetrics HybridParallelPlugin::eval_batch(nn::ViT& model, const data::Batch& batch) {
  train::StepMetrics r =
      impl_->pipe ? impl_->pipe->eval_batch(model, batch) : Plugin::eval_batch(model, batch);
  impl_->drain();
  return r;
}

const nn::LayerHooks* HybridParallelPlugin::train_hooks(bool last_micro_batch) {
  return impl_->inner->train_hooks(last_micro_batch);
}
const nn::LayerHooks* HybridParallelPlugin::eval_hooks() {
  return impl_->inner->eval_hooks();
}

void HybridParallelPlugin::sync_gradients(nn::ViT& model) {
  impl_->drain();
  // The pipeline reduces its gradients inside its schedule (ReduceGrads).
  if (!impl_->pipe) impl_->inner->sync_gradients(model);
}

void HybridParallelPlugin::finish_gradients(nn::ViT& model) {
  impl_->inner->finish_gradients(model);
}

Tensor HybridParallelPlugin::clip_grad_norm(optim::Optimizer& opt, double max_norm) {
  Impl& m = *impl_;
  // DDP alone: every rank clips the same gradients by itself, as DataParallelPlugin does (no
  // reduction; the factor folded into the optimizer step; the copy-engine exchange's sum taken as
  // the gradients are read).
  if (m.dp && !m.tp && m.cfg.dp.zero_stage == 0) return m.dp->clip_grad_norm(opt, max_norm);
  // ZeRO-Offload alone: the shards' sum of squares read on the host and reduced over the ranks,
  // the factor folded into the host Adam (no pass that scales the host gradients).
  if (m.dp && !m.tp && !m.pipe && m.cfg.dp.cpu_offload) return m.dp->clip_grad_norm(opt, max_norm);
  if (m.dp) m.dp->sum_pending_gradients();  // read below
  // Every parameter once: tensor-parallel shards are disjoint over tp (2.5d/3d parts held by
  // several ranks: the lowest counts them), whole parameters the same on every tp rank (tp
  // rank 0 counts them); ZeRO shards are disjoint over dp, DDP gradients the
  // same on every dp rank (dp rank 0 counts them); pipeline stages hold disjoint layers.
  const bool dp_disjoint = m.cfg.dp.zero_stage >= 1;
  const bool dp_counts = dp_disjoint || m.me.dp == 0;
  auto weight = [&m, dp_counts](const nn::Parameter& p) {
    const bool counts = m.sharded.count(p.name) ? m.primary.count(p.name) > 0 : m.me.tp == 0;
    return dp_counts && counts ? 1.0 : 0.0;
  };
  // On a GPU the sum of squares is reduced there (no host read: the host runs on into the next
  // step while the clip and the optimizer run) and the factor is left to the optimizer step,
  // which applies it as it reads each gradient (no pass that scales the gradients: 0.64 ms a
  // step of ViT-H/14 ZeRO-1 on 2 H200); on the CPU through the host, scaled here.
  std::function<void(Tensor&)> on_device;
  if (m.device.is_cuda() && m.world.supports(m.device))
    on_device = [&m](Tensor& stats) {
      m.settling.add(m.world.all_reduce_async(stats, dist::ReduceOp::Sum));
    };
  return optim::clip_grad_norm_async(
      train::optimizer_params(opt), max_norm,
      [&m](double sq) { return m.world.all_reduce_scalar(sq); }, weight, on_device,
      on_device ? &opt : nullptr);
}

void HybridParallelPlugin::optimizer_step(optim::Optimizer& opt) {
  impl_->inner->optimizer_step(opt);
}

void HybridParallelPlugin::zero_grad(nn::ViT& model, optim::Optimizer& opt) {
  impl_->inner->zero_grad(model, opt);
}

double HybridParallelPlugin::all_reduce_sum(double v) {
  // Metrics: every rank of a tensor-parallel group computed the same numbers.
  return impl_->world.all_reduce_scalar(impl_->me.tp == 0 ? v : 0.0);
}

double HybridParallelPlugin::all_reduce_max(double v) {
  return impl_->world.all_reduce_scalar(v, dist::ReduceOp::Max);
}

void HybridParallelPlugin::barrier() {
  impl_->world.barrier();
}

namespace {
// Part `r` of `size` (ZeRO's cut) of n elements.
int64_t zero_count(int64_t n, int r, int size) {
  const auto [b, e] = DataParallelPlugin::shard_range(n, r, size);
  return e - b;
}
}  // namespace

std::map<std::string, Tensor> HybridParallelPlugin::full_optimizer_state(nn::ViT& model,
                                                                         optim::Optimizer& opt) {
  Impl& m = *impl_;
  if (m.dp) m.dp->wait_host_step();  // the optimizer state, not mid-step
  const bool zero = m.cfg.dp.zero_stage >= 1;
  const int D = m.mesh.dp_size();
  std::map<std::string, Tensor> local;
  for (auto& [k, v] : opt.state_dict()) local[k] = v.to(Device::cpu());
  // The slots ("exp_avg", ...) this optimizer keeps: the same on every rank once it has stepped.
  std::set<std::string> slots;
  for (nn::Parameter* p : model.parameters())
    for (const auto& [k, v] : local)
      if (k.size() > p->name.size() + 1 && k.compare(0, p->name.size(), p->name) == 0 &&
          k[p->name.size()] == '.' && k.find('.', p->name.size() + 1) == std::string::npos)
        slots.insert(k.substr(p->name.size() + 1));
  const double n_slots = static_cast<double>(slots.size());
  CAI_CHECK(m.world.all_reduce_scalar(n_slots, dist::ReduceOp::Max) == n_slots &&
                m.world.all_reduce_scalar(n_slots, dist::ReduceOp::Min) == n_slots,
            "[checkpoint] ranks keep different optimizer slots ({} here)", slots.size());
  std::map<std::string, Tensor> out;
  for (nn::Parameter* p : model.parameters()) {
    const Shape& shape = m.shapes.at(p->name);  // this rank's tensor-parallel part
    const int64_t n = shape_numel(shape);
    for (const std::string& s : slots) {
      const std::string key = p->name + "." + s;
      const auto it = local.find(key);
      const bool mine = it != local.end();
      Tensor part;  // this rank's tp-local [shape] tensor, whole over dp
      if (zero) {
        std::vector<int64_t> counts(D);
        for (int r = 0; r < D; ++r) counts[r] = zero_count(n, r, D);
        Tensor chunk = mine ? it->second.reshape({it->second.numel()})
                            : Tensor::zeros({counts[m.me.dp]}, DType::F32);
        CAI_CHECK(chunk.numel() == counts[m.me.dp],
                  "[checkpoint] optimizer state {} has {} elements, ZeRO's part is {}", key,
                  chunk.numel(), counts[m.me.dp]);
        part = Tensor::empty({n}, DType::F32);
        m.dp_comm->all_gather(chunk, part, counts);
        part = part.reshape(shape);
      } else {
        part = mine ? it->second.reshape(shape) : Tensor::zeros(shape, DType::F32);
      }
      // A parameter without this slot (it never stepped) is left out.
      if (!m.from_owner(part, shape, mine, Device::cpu())) continue;
      out[key] = m.unshard_tp(part, *p);
    }
  }
  out["step"] = local.at("step").clone();
  return out;
}

void HybridParallelPlugin::load_optimizer_state(nn::ViT& model, optim::Optimizer& opt,
                                                const std::map<std::string, Tensor>& full) {
  Impl& m = *impl_;
  if (m.dp) m.dp->wait_host_step();  // the optimizer state, not mid-step
  const bool zero = m.cfg.dp.zero_stage >= 1;
  const int D = m.mesh.dp_size();
  std::map<std::string, const nn::Parameter*> by_name;
  for (nn::Parameter* p : model.parameters()) by_name[p->name] = p;
  std::set<std::string> mine;
  for (nn::Parameter* q : train::optimizer_params(opt)) mine.insert(q->name);
  std::map<std::string, Tensor> local;
  for (const auto& [key, v] : full) {
    if (key == "step") {
      local[key] = v;
      continue;
    }
    const auto dot = key.rfind('.');
    CAI_CHECK(dot != std::string::npos && by_name.count(key.substr(0, dot)),
              "[checkpoint] optimizer state '{}' belongs to no parameter of the model", key);
    const nn::Parameter& p = *by_name.at(key.substr(0, dot));
    if (!mine.count(p.name)) continue;  // another pipeline stage's
    // Not p.full_shape(): a ZeRO-3 parameter holds no value between its uses.
    const Shape want = p.shard.sharded() ? p.shard.full : m.shapes.at(p.name);
    CAI_CHECK(v.shape() == want, "[checkpoint] optimizer state '{}' is {}, the parameter is {}",
              key, shape_str(v.shape()), shape_str(want));
    Tensor part = p.shard.sharded() ? nn::shard_of(v, p.shard) : v;
    if (zero) {
      const auto [b, e] = DataParallelPlugin::shard_range(part.numel(), m.me.dp, D);
      part = part.reshape({part.numel()}).narrow(b, e - b).clone();
    }
    local[key] = part;
  }
  opt.load_state_dict(local);
}

std::vector<train::OwnedSlice> HybridParallelPlugin::owned_state(nn::ViT& model,
                                                                 optim::Optimizer& opt) {
  Impl& m = *impl_;
  if (m.dp) m.dp->wait_host_step();  // the optimizer state, not mid-step
  const bool zero = m.cfg.dp.zero_stage >= 1;
  const int D = m.mesh.dp_size();
  std::map<std::string, const nn::Parameter*> by_name;
  for (nn::Parameter* p : model.parameters()) by_name[p->name] = p;
  const std::map<std::string, Tensor> state = opt.state_dict();
  std::vector<train::OwnedSlice> out;
  for (nn::Parameter* q : train::optimizer_params(opt)) {
    const auto pit = by_name.find(q->name);
    CAI_CHECK(pit != by_name.end(), "[checkpoint] optimizer parameter {} is not the model's",
              q->name);
    const nn::Parameter& p = *pit->second;
    if (p.shard.sharded() ? !p.shard.primary() : m.me.tp != 0) continue;  // a copy
    const int64_t n = shape_numel(m.shapes.at(p.name));
    const auto [b, e] = DataParallelPlugin::shard_range(n, m.me.dp, D);
    // ZeRO: q and its state are this rank's shard already; DDP: the whole part, cut here.
    auto cut = [&, b = b, e = e](const std::string& key, const Tensor& t) {
      Tensor flat = t.to(Device::cpu());
      flat = flat.reshape({flat.numel()});
      CAI_CHECK(flat.numel() == (zero ? e - b : n),
                "[checkpoint] {} has {} elements on this rank, expected {}", key, flat.numel(),
                zero ? e - b : n);
      return zero ? flat.clone() : flat.narrow(b, e - b).clone();
    };
    // Not p.full_shape(): a ZeRO-3 parameter holds no value between its uses.
    const Shape full = p.shard.sharded() ? p.shard.full : m.shapes.at(p.name);
    out.push_back(train::OwnedSlice{p.name, false, p.shard, full, b, e, cut(p.name, q->value)});
    for (auto it = state.lower_bound(p.name + "."); it != state.end(); ++it) {
      const std::string& k = it->first;
      if (k.compare(0, p.name.size() + 1, p.name + ".") != 0) break;
      if (k.find('.', p.name.size() + 1) != std::string::npos) continue;  // another parameter's
      out.push_back(train::OwnedSlice{k, true, p.shard, full, b, e, cut(k, it->second)});
    }
  }
  if (m.world.rank() == 0) {
    const Tensor step = state.at("step").to(Device::cpu());
    out.push_back(train::OwnedSlice{"step", true, nn::ShardSpec{}, step.shape(), 0, step.numel(),
                                    step.reshape({step.numel()}).clone()});
  }
  return out;
}

std::map<std::string, Tensor> HybridParallelPlugin::full_state(nn::ViT& model) {
  Impl& m = *impl_;
  // ZeRO-1/2: the step's deferred gathers complete; ZeRO-3: gather the shards.
  if (m.dp) m.dp->materialize_parameters();
  if (m.pipe) m.pipe->materialize_parameters();
  std::map<std::string, Tensor> out;
  for (nn::Parameter* p : model.parameters()) {
    const auto it = m.shapes.find(p->name);
    CAI_CHECK(it != m.shapes.end(), "[hybrid] full_state before setup(): {} unknown", p->name);
    // The stage that owns the layer sends it to the others of its pipeline.
    const bool mine = p->value.defined() && p->value.numel() == shape_numel(it->second);
    Tensor v = mine ? p->value : Tensor();
    CAI_CHECK(m.from_owner(v, it->second, mine, m.device), "[hybrid] no pipeline stage holds {}",
              p->name);
    out[p->name] = m.unshard_tp(v, *p);
  }
  return out;
}

}  // namespace cai::parallel
