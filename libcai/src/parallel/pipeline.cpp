#include "cai/parallel/pipeline.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>

#include "cai/core/error.h"
#include "cai/ops/ops.h"
#include "step_timer.h"

namespace cai::parallel {

namespace {

using schedule::Message;
constexpr Message kActivation = Message::Activation, kGrad = Message::Grad, kEval = Message::Eval;

// The communicator's tag of a message (schedule::message_tag, which the simulator uses too).
int tag_of(int mb, int vs, int virtual_stages, Message kind) {
  return static_cast<int>(schedule::message_tag(mb, vs, virtual_stages, kind));
}

const char* category_of(schedule::Op op) {
  using schedule::Op;
  if (schedule::is_compute(op)) return "compute";
  if (schedule::is_send(op) || schedule::is_recv(op)) return "comm";
  if (op == Op::LoadMicroBatch) return "load";
  return "reduce";
}

}  // namespace

struct PipelinePlugin::Impl {
  bool warm = false;  // a training step has completed (receives may be posted ahead, see below)
  dist::Communicator& world;
  dist::ProcessMesh mesh;
  PipelineConfig cfg;
  dist::MeshCoord me;
  std::vector<int> place;  // the pipeline rank holding each virtual stage
  // pp carries activations (and evaluation forwards), pp_grad the gradients: NCCL matches
  // messages per (source, destination) in issue order, and the schedules keep that order per
  // kind of message only.
  std::unique_ptr<dist::Communicator> pp, pp_grad, dp;
  Device device;  // where this stage's parameters and boundary tensors live
  std::unique_ptr<DataParallelPlugin> inner;
  nn::ViT* model = nullptr;
  schedule::Partition part;
  std::map<std::pair<int, int64_t>, schedule::Schedule> schedules;  // by (micro-batches, batch)
  // This rank's receive posting per schedule and `ahead` (schedule::receive_posting replays every
  // rank's program: computed once, not every step).
  std::map<std::pair<const schedule::Schedule*, bool>, std::vector<std::vector<size_t>>> postings;
  std::vector<nn::Layer*> owned;  // this rank's layers, model order
  // The instructions' spans and each step's bubble: host time on the CPU, device time on a GPU
  // (step_timer.h). Made in setup(), once the device is known.
  std::unique_ptr<detail::StepTimer> timer;
  int64_t tokens = 0, dim = 0;

  Impl(dist::Communicator& w, const dist::ProcessMesh& m, PipelineConfig c)
      : world(w), mesh(m), cfg(std::move(c)) {
    CAI_CHECK(mesh.world() == world.size(),
              "[pipeline] the mesh describes {} processes but the communicator has {}",
              mesh.world(), world.size());
    CAI_CHECK(cfg.dp.zero_stage <= 1,
              "[pipeline] zero_stage {} with pipeline parallelism: ZeRO 2/3 need whole-model "
              "gradient and parameter ownership per rank; use zero_stage 0 or 1",
              cfg.dp.zero_stage);
    CAI_CHECK(cfg.chunks >= 1, "[pipeline] num_model_chunks {} must be >= 1", cfg.chunks);
    CAI_CHECK(cfg.style == "interleaved" || cfg.style == "zbv" || cfg.chunks == 1,
              "[pipeline] num_model_chunks = {} needs pp_style = \"interleaved\" (or \"zbv\", 2 "
              "chunks; got \"{}\")",
              cfg.chunks, cfg.style);
    CAI_CHECK(cfg.style != "zbv" || cfg.chunks == 2,
              "[pipeline] pp_style = \"zbv\" places 2 model chunks per rank in a V: "
              "num_model_chunks must be 2 (got {})",
              cfg.chunks);
    me = mesh.coord(world.rank());
    // The style's placement (ZB-V: rank r holds virtual stages r and 2p-1-r), the one its
    // schedules carry (get_schedule checks): the layers, the transfers and evaluation follow it.
    place = schedule::placement_table(schedule::placement_of(cfg.style, mesh.pp_size(), cfg.chunks),
                                      mesh.pp_size(), cfg.chunks);
    // pp group: same dp (and tp), ordered by pp; dp group: same pp, ordered by dp.
    pp = world.split(me.dp * mesh.tp_size() + me.tp, me.pp, fmt::format("pp[dp={}]", me.dp));
    pp_grad =
        world.split(me.dp * mesh.tp_size() + me.tp, me.pp, fmt::format("pp-grad[dp={}]", me.dp));
    dp = world.split(me.pp * mesh.tp_size() + me.tp, me.dp, fmt::format("dp[pp={}]", me.pp));
  }

  int p() const { return mesh.pp_size(); }
  int V() const { return p() * cfg.chunks; }
  // The virtual stage of this rank's chunk (its chunk-th lowest) and a virtual stage's chunk on
  // its rank: Schedule::virtual_stage / chunk_of over the same placement.
  int my_vs(int chunk) const {
    for (int vs = 0, c = 0; vs < V(); ++vs)
      if (place[vs] == me.pp && c++ == chunk) return vs;
    fail("[pipeline] rank {} has no chunk {} ({} chunks)", me.pp, chunk, cfg.chunks);
  }
  int chunk_of(int vs) const {
    int c = 0;
    for (int u = 0; u < vs; ++u) c += place[u] == place[vs];
    return c;
  }
  bool local(int vs) const { return vs >= 0 && vs < V() && place[vs] == me.pp; }
  std::vector<nn::Layer*> chunk_layers(int chunk) const {
    std::vector<nn::Layer*> out;
    const int vs = my_vs(chunk);
    for (int i = 0; i < part.num_layers(vs); ++i)
      out.push_back(model->layers()[part.first_layer(vs) + i].get());
    return out;
  }

  // The schedule for m micro-batches of a batch of `batch` samples; its send/recv instructions
  // carry the bytes of one boundary tensor [batch/m, tokens, dim] (fp32).
  const schedule::Schedule& get_schedule(int m, int64_t batch) {
    auto it = schedules.find({m, batch});
    if (it != schedules.end()) return it->second;
    schedule::ScheduleOptions so;
    so.stages = p();
    so.micro_batches = m;
    so.chunks = cfg.chunks;
    so.split_backward = cfg.split_backward;
    schedule::set_zero_bubble_costs(so, model->config().checkpoint);  // as the plan's
    so.activation_bytes = shape_numel(model->residual_shape((batch + m - 1) / m)) *
                          static_cast<int64_t>(sizeof(float));
    schedule::Schedule s = schedule::make(cfg.style, so, part);
    schedule::validate_or_throw(s);
    CAI_CHECK(schedule::placement_table(s.placement, s.stages, s.chunks) == place,
              "[pipeline] the {} schedule places its virtual stages differently from the layers "
              "(placement_of)",
              cfg.style);
    return schedules.emplace(std::make_pair(m, batch), std::move(s)).first->second;
  }

  int micro_batches(int64_t batch) const {
    return schedule::micro_batch_count(batch, cfg.num_microbatches, cfg.microbatch_size, p(),
                                       cfg.style);
  }

  // Micro-batch i of a batch of n samples split in m nearly equal parts.
  static std::pair<int64_t, int64_t> slice(int64_t n, int m, int i) {
    return schedule::micro_batch_slice(n, m, i);
  }

  // The residual stream between stages: [rows, tokens, dim], with sequence parallelism this
  // rank's tokens.
  Tensor boundary(int64_t rows) const {
    return Tensor::empty(model->residual_shape(rows), DType::F32, device);
  }

  // The (source, destination) ranks of every activation transfer: virtual stage vs -> vs + 1
  // (none between two virtual stages of one rank: ZB-V's rank p-1).
  std::vector<std::pair<int, int>> activation_pairs() const {
    std::vector<std::pair<int, int>> out;
    for (int vs = 0; vs + 1 < V(); ++vs) {
      const std::pair<int, int> e{place[vs], place[vs + 1]};
      if (e.first != e.second && std::find(out.begin(), out.end(), e) == out.end())
        out.push_back(e);
    }
    return out;
  }

  void record(const std::string& name, const char* cat, detail::StepTimer::Mark t0) {
    timer->span(name, cat, t0, memory_in_use(device.type));
  }
};

PipelinePlugin::PipelinePlugin(dist::Communicator& world, const dist::ProcessMesh& mesh,
                               PipelineConfig cfg)
    : impl_(std::make_unique<Impl>(world, mesh, std::move(cfg))) {}

PipelinePlugin::~PipelinePlugin() = default;

std::string PipelinePlugin::name() const {
  const Impl& m = *impl_;
  return fmt::format("pipeline {} ×{}{} (m per step from config), {}", m.cfg.style, m.p(),
                     m.cfg.chunks > 1 ? fmt::format(", {} chunks", m.cfg.chunks) : "",
                     m.inner ? m.inner->name() : "no dp");
}
int PipelinePlugin::rank() const {
  return impl_->world.rank();
}
int PipelinePlugin::world_size() const {
  return impl_->world.size();
}
int PipelinePlugin::pipeline_rank() const {
  return impl_->me.pp;
}
int PipelinePlugin::stages() const {
  return impl_->p();
}
const schedule::Partition& PipelinePlugin::partition() const {
  return impl_->part;
}
int PipelinePlugin::micro_batches_for(int64_t batch) const {
  return impl_->micro_batches(batch);
}
const schedule::Schedule& PipelinePlugin::schedule_for(int64_t batch) {
  return impl_->get_schedule(impl_->micro_batches(batch), batch);
}

void PipelinePlugin::setup(nn::ViT& model) {
  Impl& m = *impl_;
  m.model = &model;
  const int L = static_cast<int>(model.layers().size());
  // The rule is shared with the step model (cai/plan): schedule::partition_layers.
  std::vector<int64_t> costs;
  for (auto& l : model.layers()) {
    std::vector<nn::Parameter*> ps;
    l->collect(ps);
    int64_t n = 0;
    for (auto* p : ps) n += p->value.numel();
    costs.push_back(n);
  }
  m.part = schedule::partition_layers(L, m.V(), m.cfg.partition, costs, m.cfg.num_layers_per_stage);
  for (int c = 0; c < m.cfg.chunks; ++c)
    for (nn::Layer* l : m.chunk_layers(c)) m.owned.push_back(l);
  std::sort(m.owned.begin(), m.owned.end(), [&](nn::Layer* a, nn::Layer* b) {
    auto pos = [&](nn::Layer* x) {
      for (size_t i = 0; i < model.layers().size(); ++i)
        if (model.layers()[i].get() == x) return i;
      return size_t{0};
    };
    return pos(a) < pos(b);
  });
  // Free what this stage does not own.
  for (auto& l : model.layers()) {
    if (std::find(m.owned.begin(), m.owned.end(), l.get()) != m.owned.end()) continue;
    std::vector<nn::Parameter*> ps;
    l->collect(ps);
    for (nn::Parameter* p : ps) p->value = Tensor(), p->grad = Tensor();
  }
  const nn::ViTConfig& vc = model.config();
  m.tokens = vc.num_patches() + 1;
  m.dim = vc.embed_dim;
  m.device = model.device();
  m.timer = std::make_unique<detail::StepTimer>(m.device);
  // Declare the point-to-point channels (NCCL builds one per direction; MPI needs none).
  const auto act = m.activation_pairs();
  std::vector<std::pair<int, int>> grad;
  for (const auto& [a, b] : act) grad.emplace_back(b, a);
  const dist::P2POptions p2p{m.cfg.p2p_max_ctas};
  m.pp->connect_p2p(act, p2p);
  m.pp_grad->connect_p2p(grad, p2p);
  m.inner = std::make_unique<DataParallelPlugin>(*m.dp, m.cfg.dp);
  m.inner->setup_layers(m.owned);
}

std::vector<nn::Parameter*> PipelinePlugin::optimizer_parameters(nn::ViT& model) {
  CAI_CHECK(impl_->inner, "[pipeline] call setup(model) before optimizer_parameters()");
  return impl_->inner->optimizer_parameters(model);
}

train::StepMetrics PipelinePlugin::forward_backward(nn::ViT& model,
                                                    const std::vector<data::Batch>& batches,
                                                    float weight, const train::Criterion& crit,
                                                    const nn::ForwardCtx& step_ctx) {
  Impl& m = *impl_;
  CAI_CHECK(batches.size() == 1,
            "[pipeline] gradient_accumulation = {}: with pipeline parallelism accumulate through "
            "micro-batches (num_microbatches) instead",
            batches.size());
  const data::Batch& batch = batches[0];
  const int64_t n = batch.labels.numel();
  const int mbs = m.micro_batches(n);
  const schedule::Schedule& sched = m.get_schedule(mbs, n);
  const schedule::Program& prog = sched.programs[m.me.pp];
  const int V = m.V(), last_vs = V - 1;

  std::map<std::pair<int, int>, Tensor> input, output, grad_in, grad_out;  // key (mb, chunk)
  std::map<std::pair<int, int>, std::vector<std::unique_ptr<nn::Cache>>> caches;
  std::map<int, Tensor> dlogits;
  // Sends in flight: a send's buffer is released as soon as it has completed (polled between
  // instructions), not at the end of the step.
  std::deque<std::unique_ptr<dist::Work>> sends;
  auto release_sends = [&sends] {
    for (auto it = sends.begin(); it != sends.end();)
      it = (*it)->test() ? sends.erase(it) : std::next(it);
  };
  // Receives are posted ahead (schedule::receive_posting): each as soon as its matching send no
  // longer waits for anything this rank has still to do, at most one per kind at a time, in the
  // order the peer sends in, so the transfer runs while this stage computes instead of starting
  // when the program reaches it. Never earlier: NCCL keeps a posted receive spinning on the
  // device, and a receive whose send needed this rank to get further first would make any CUDA
  // call here that waits for the device wait forever (on 4 H100, dp 2 x pp 2 x ZeRO 1 with
  // interleaved x4, m 4 hung in its second step when every kind's next receive went out as soon
  // as the previous one was taken).
  struct Posted {
    Tensor buffer;
    std::unique_ptr<dist::Work> work;
  };
  // Per chunk, the micro-batch whose parameter gradients come last in the program (its Backward
  // or BackwardWeight): the data-parallel hooks reduce after that one (1F1B, GPipe: the last
  // micro-batch; a zero-bubble schedule may finish another one's W last).
  std::vector<int> last_weight_mb(m.cfg.chunks, mbs - 1);
  for (const schedule::Instr& i : prog)
    if (i.op == schedule::Op::Backward || i.op == schedule::Op::BackwardWeight)
      last_weight_mb[i.chunk] = i.mb;
  std::map<size_t, Posted> posted;  // by program position
  auto post = [&](size_t pos) {
    const schedule::Instr& r = prog[pos];
    const int rvs = m.my_vs(r.chunk);
    Posted p;
    p.buffer = m.boundary(m.slice(n, mbs, r.mb).second);
    p.work = r.op == schedule::Op::RecvActivation
                 ? m.pp->recv_async(p.buffer, r.peer, tag_of(r.mb, rvs - 1, V, kActivation))
                 : m.pp_grad->recv_async(p.buffer, r.peer, tag_of(r.mb, rvs + 1, V, kGrad));
    posted[pos] = std::move(p);
  };
  // On GPUs, not in the first step: the first step is where this process first builds cuBLAS
  // handles, grows the allocator and (with lazy module loading) loads kernels, calls that can wait
  // for the device to drain; its receives go out only when the program reaches them.
  const bool ahead = !m.device.is_cuda() || m.warm;
  auto [slot, fresh] = m.postings.try_emplace({&sched, ahead});
  if (fresh) slot->second = schedule::receive_posting(sched, m.me.pp, ahead);
  const std::vector<std::vector<size_t>>& posting = slot->second;
  auto take = [&](size_t pos) {
    Posted p = std::move(posted.at(pos));
    posted.erase(pos);
    p.work->wait();
    return p.buffer;
  };
  train::StepMetrics metrics;
  m.timer->begin_step();

  auto ctx_of = [&](int mb) {
    nn::ForwardCtx c = step_ctx;
    c.sample_offset = batch.sample_offset + m.slice(n, mbs, mb).first;
    return c;
  };

  for (size_t pos = 0; pos < prog.size(); ++pos) {
    const schedule::Instr& in = prog[pos];
    const auto t0 = m.timer->mark();
    release_sends();
    for (size_t r : posting[pos]) post(r);
    const auto key = std::make_pair(in.mb, in.chunk);
    const int vs = m.my_vs(in.chunk);
    using schedule::Op;
    switch (in.op) {
      case Op::LoadMicroBatch:
        break;  // every rank of the pipeline already holds the batch; slices are views
      case Op::RecvActivation:
        input[key] = take(pos);
        break;
      case Op::Forward: {
        const auto [off, rows] = m.slice(n, mbs, in.mb);
        // The input: the images, the previous virtual stage's output when this rank holds it
        // too (ZB-V's rank p-1: no transfer), else the received activation.
        Tensor x;
        if (vs == 0) {
          x = batch.images.narrow(off, rows);
        } else if (m.local(vs - 1)) {
          const auto prev = std::make_pair(in.mb, m.chunk_of(vs - 1));
          x = output.at(prev);
          output.erase(prev);
        } else {
          x = input.at(key);
          input.erase(key);
        }
        const nn::LayerHooks* hooks = m.inner->train_hooks(in.mb == mbs - 1);
        auto& cs = caches[key];
        const nn::ForwardCtx ctx = ctx_of(in.mb);
        for (nn::Layer* l : m.chunk_layers(in.chunk)) {
          if (hooks && hooks->before_forward) hooks->before_forward(*l);
          cs.emplace_back();
          x = l->forward(x, cs.back(), ctx);
          if (hooks && hooks->after_forward) hooks->after_forward(*l);
        }
        if (vs == last_vs) {
          const Tensor labels = batch.labels.narrow(off, rows);
          metrics.add(ops::cross_entropy_fwd(x, labels, crit.label_smoothing), x, labels);
          dlogits[in.mb] = ops::cross_entropy_bwd(x, labels, crit.label_smoothing, weight);
        } else {
          output[key] = x;
        }
        break;
      }
      case Op::SendActivation:
        sends.push_back(
            m.pp->send_async(output.at(key), in.peer, tag_of(in.mb, vs, V, kActivation)));
        output.erase(key);
        break;
      case Op::RecvGrad:
        grad_in[key] = take(pos);
        break;
      case Op::Backward:
      case Op::BackwardInput: {
        // BackwardInput (split backward): the input gradient only, sent on at once; the
        // parameter gradients stay in the caches for this micro-batch's BackwardWeight.
        const bool split = in.op == Op::BackwardInput;
        // The output gradient: the loss's, the next virtual stage's input gradient when this
        // rank holds it too (ZB-V's rank p-1), else the received one.
        Tensor g;
        if (vs == last_vs) {
          g = dlogits.at(in.mb);
          dlogits.erase(in.mb);
        } else if (m.local(vs + 1)) {
          const auto next = std::make_pair(in.mb, m.chunk_of(vs + 1));
          g = grad_out.at(next);
          grad_out.erase(next);
        } else {
          g = grad_in.at(key);
          grad_in.erase(key);
        }
        const nn::LayerHooks* hooks = m.inner->train_hooks(in.mb == last_weight_mb[in.chunk]);
        auto& cs = caches.at(key);
        nn::ForwardCtx ctx = ctx_of(in.mb);
        if (hooks && hooks->overlap_point) ctx.overlap_point = &hooks->overlap_point;
        const auto layers = m.chunk_layers(in.chunk);
        for (size_t i = layers.size(); i-- > 0;) {
          if (hooks && hooks->before_backward) hooks->before_backward(*layers[i]);
          if (split) {
            g = layers[i]->backward_input(g, cs[i], ctx);
          } else {
            g = layers[i]->backward(g, cs[i], ctx);
            if (hooks && hooks->after_backward) hooks->after_backward(*layers[i]);
          }
        }
        // What waits for an overlap point goes now: other micro-batches' work follows.
        if (hooks && hooks->overlap_point) hooks->overlap_point();
        if (!split) caches.erase(key);
        if (vs > 0) grad_out[key] = g;
        break;
      }
      case Op::BackwardWeight: {
        // The parameter gradients BackwardInput left, layer by layer in backward order: the
        // data-parallel hooks see a layer's gradients final here, so the W that completes a
        // bucket (of the chunk's last such micro-batch) starts its reduction.
        const nn::LayerHooks* hooks = m.inner->train_hooks(in.mb == last_weight_mb[in.chunk]);
        auto& cs = caches.at(key);
        const auto layers = m.chunk_layers(in.chunk);
        for (size_t i = layers.size(); i-- > 0;) {
          layers[i]->backward_weight(cs[i]);
          if (hooks && hooks->after_backward) hooks->after_backward(*layers[i]);
        }
        if (hooks && hooks->overlap_point) hooks->overlap_point();
        caches.erase(key);
        break;
      }
      case Op::SendGrad:
        sends.push_back(
            m.pp_grad->send_async(grad_out.at(key), in.peer, tag_of(in.mb, vs, V, kGrad)));
        grad_out.erase(key);
        break;
      case Op::ReduceGrads:
        CAI_CHECK(caches.empty(),
                  "[pipeline] ReduceGrads with {} micro-batches' backward (or BackwardWeight) "
                  "still pending on rank {}",
                  caches.size(), m.world.rank());
        for (auto& w : sends) w->wait();
        sends.clear();
        m.inner->sync_gradients(model);
        m.inner->finish_gradients(model);  // the stage's clip reads them
        break;
      case Op::OptimizerStep:
        break;  // the trainer clips, then calls optimizer_step()
    }
    if (in.op != schedule::Op::OptimizerStep) m.record(in.str(), category_of(in.op), t0);
  }
  m.warm = true;
  m.timer->end_step();
  return metrics;
}

// Evaluation goes through the stages in micro-batches of the training step's size (the count
// training asks for: schedule::requested_micro_batches, at most one per sample), one after the
// other: a stage then never holds more than a training micro-batch's forward, where a whole
// evaluation batch could take several times the training step's peak (no schedule: nothing is
// kept for a backward).
train::StepMetrics PipelinePlugin::eval_batch(nn::ViT&, const data::Batch& batch) {
  Impl& m = *impl_;
  // The evaluation runs no layer hooks: ZeRO-1's deferred parameter gathers complete first.
  if (m.inner) m.inner->materialize_parameters();
  const int V = m.V();
  const int64_t n = batch.labels.numel();
  const int want =
      schedule::requested_micro_batches(n, m.cfg.num_microbatches, m.cfg.microbatch_size, m.p());
  const int mbs = static_cast<int>(std::clamp<int64_t>(want, 1, std::max<int64_t>(n, 1)));
  train::StepMetrics metrics;
  for (int mb = 0; mb < mbs; ++mb) {
    const auto [off, rows] = m.slice(n, mbs, mb);
    std::vector<std::unique_ptr<dist::Work>> sends;
    Tensor x;
    for (int vs = 0; vs < V; ++vs) {
      if (m.part.num_layers(vs) == 0 || !m.local(vs)) continue;
      const int chunk = m.chunk_of(vs);
      if (vs == 0) {
        x = batch.images.narrow(off, rows);
      } else if (!m.local(vs - 1)) {  // else x is this rank's previous virtual stage's output
        x = m.boundary(rows);
        m.pp->recv(x, m.place[vs - 1], tag_of(mb, vs - 1, V, kEval));
      }
      for (nn::Layer* l : m.chunk_layers(chunk)) {
        std::unique_ptr<nn::Cache> cache;
        x = l->forward(x, cache, nn::ForwardCtx{});
      }
      if (vs == V - 1) {
        const Tensor labels = batch.labels.narrow(off, rows);
        metrics.add(ops::cross_entropy_fwd(x, labels, 0.0f), x, labels);
      } else if (!m.local(vs + 1)) {
        sends.push_back(m.pp->send_async(x, m.place[vs + 1], tag_of(mb, vs, V, kEval)));
      }
    }
    // The peer receives this micro-batch before its next one: done by the next micro-batch.
    for (auto& w : sends) w->wait();
  }
  return metrics;
}

Tensor PipelinePlugin::clip_grad_norm(optim::Optimizer& opt, double max_norm) {
  Impl& m = *impl_;
  // Stages hold disjoint layers; with ZeRO-1 the data-parallel ranks hold disjoint shards too.
  return optim::clip_grad_norm_async(train::optimizer_params(opt), max_norm, [&m](double sq) {
    return m.cfg.dp.zero_stage >= 1 ? m.world.all_reduce_scalar(sq) : m.pp->all_reduce_scalar(sq);
  });
}

void PipelinePlugin::optimizer_step(optim::Optimizer& opt) {
  const auto t0 = impl_->timer->mark();
  impl_->inner->optimizer_step(opt);
  impl_->record("OptStep", "optimizer", t0);
}

void PipelinePlugin::materialize_parameters() {
  if (impl_->inner) impl_->inner->materialize_parameters();
}

void PipelinePlugin::zero_grad(nn::ViT& model, optim::Optimizer& opt) {
  impl_->inner->zero_grad(model, opt);
}

double PipelinePlugin::all_reduce_sum(double v) {
  return impl_->world.all_reduce_scalar(v);
}

double PipelinePlugin::all_reduce_max(double v) {
  return impl_->world.all_reduce_scalar(v, dist::ReduceOp::Max);
}

double PipelinePlugin::measured_bubble() const {
  if (!impl_->timer) return 0.0;
  impl_->timer->flush();  // on a GPU: waits for the device to finish the steps run so far
  const auto& b = impl_->timer->bubbles();
  if (b.empty()) return 0.0;
  // The first step includes one-time allocation and warm-up: leave it out when there are more.
  const size_t first = b.size() > 1 ? 1 : 0;
  double s = 0;
  for (size_t i = first; i < b.size(); ++i) s += b[i];
  return s / static_cast<double>(b.size() - first);
}

std::vector<double> PipelinePlugin::write_trace(const std::string& path) {
  Impl& m = *impl_;
  CAI_CHECK(m.timer, "[pipeline] call setup(model) before write_trace()");
  const int R = m.world.size(), me = m.world.rank();
  m.timer->flush();
  const trace::Recorder& rec = m.timer->recorder();
  // Common origin: the earliest event of any rank.
  double first = trace::Recorder::now_us();
  for (const auto& sp : rec.spans()) first = std::min(first, sp.start_us);
  first = m.world.all_reduce_scalar(first, dist::ReduceOp::Min);
  const auto c = m.me;
  const std::string json =
      rec.events_json(me, fmt::format("rank {} (pp {}, dp {})", me, c.pp, c.dp), first);
  // Lengths, then the JSON text as int32 words, gathered on rank 0.
  std::vector<double> bubbles(R, 0.0);
  for (int r = 0; r < R; ++r)
    bubbles[r] = m.world.all_reduce_scalar(r == me ? measured_bubble() : 0.0);
  const int64_t words = (static_cast<int64_t>(json.size()) + 3) / 4;
  std::vector<int64_t> lengths(R, 0);
  for (int r = 0; r < R; ++r)
    lengths[r] = static_cast<int64_t>(
        m.world.all_reduce_scalar(r == me ? static_cast<double>(json.size()) : 0.0));
  std::vector<std::string> arrays(R);
  if (me == 0) {
    arrays[0] = json;
    for (int r = 1; r < R; ++r) {
      Tensor t = Tensor::empty({(lengths[r] + 3) / 4}, DType::I32);
      m.world.recv(t, r, 1 << 20);
      arrays[r].assign(static_cast<const char*>(t.raw()), static_cast<size_t>(lengths[r]));
    }
    std::ofstream f(path);
    CAI_CHECK(f.good(), "[trace] cannot write {}", path);
    f << trace::chrome_trace(arrays);
  } else {
    Tensor t = Tensor::zeros({words}, DType::I32);
    std::memcpy(t.raw(), json.data(), json.size());
    m.world.send(t, 0, 1 << 20);
  }
  m.world.barrier();
  return bubbles;
}

std::map<std::string, Tensor> PipelinePlugin::full_model_state(nn::ViT&) {
  throw NotImplemented(
      "[checkpoint] PipelinePlugin alone does not gather checkpoints: wrap it in "
      "HybridParallelPlugin (what vit_train does)");
}
std::map<std::string, Tensor> PipelinePlugin::full_optimizer_state(nn::ViT& model,
                                                                   optim::Optimizer&) {
  return full_model_state(model);
}
void PipelinePlugin::load_optimizer_state(nn::ViT& model, optim::Optimizer&,
                                          const std::map<std::string, Tensor>&) {
  full_model_state(model);
}

}  // namespace cai::parallel
