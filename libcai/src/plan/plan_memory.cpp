// The plan's memory timeline: replays one rank's step program (data-parallel buckets, ZeRO
// gathers, pipeline buffers) and tracks its live bytes and their peak (split from plan.cpp).
#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <map>

#include "cai/core/error.h"
#include "cai/schedule/buckets.h"
#include "cai/schedule/offload.h"
#include "cai/schedule/param_gathers.h"
#include "plan_internal.h"

namespace cai::plan::detail {

namespace {

// The step replay: live bytes of one rank over its program.

struct Tracker {
  int64_t live = 0, peak = 0;
  std::string at;
  // What is alive at the peak, by kind.
  int64_t act = 0, win = 0;
  int in_flight = 0;
  int64_t peak_act = 0, peak_win = 0;
  int peak_in_flight = 0;
  void add(int64_t bytes, const std::string& where) {
    live += bytes;
    if (live > peak) {
      peak = live;
      at = where;
      peak_act = act;
      peak_win = win;
      peak_in_flight = in_flight;
    }
  }
  void touch(int64_t bytes, const std::string& where) {  // a transient: up and down
    add(bytes, where);
    live -= bytes;
  }
};

struct Replay {
  const StepPlan& plan;
  const Layout& l;
  RankPlan& rank;
  Tracker t;
  int d = 1, me = 0;  // data-parallel size and rank
  // Data parallelism (parallel/data_parallel.cpp): per held parameter, its layer position.
  std::vector<int64_t> numels;
  std::vector<char> decays;   // per parameter: kept in the compute dtype under offload
  std::vector<int> layer_of;  // position in rank.layers
  std::vector<std::vector<int>> buckets;
  std::vector<int> bucket_of;
  std::vector<int> ready;
  schedule::InflightWindow inflight;  // stage 2/3 launched buckets (DataParallelPlugin's window)
  std::vector<int64_t> inflight_bytes;
  std::vector<int> first_param;  // per layer position: index of its first parameter
  bool hooks = false;
  // ZeRO-3: the gathers issued ahead (DataParallelPlugin's window), with their buffer bytes.
  schedule::GatherWindow window;
  std::map<int, int64_t> pending;
  std::vector<bool> grads_alive;
  // ZeRO-1/2: the last step's parameter gathers, deferred to this step's forward
  // (schedule::ParamGatherQueue, as the executor and the simulator run them).
  schedule::ParamGatherQueue params;
  bool params_begun = false;
  std::vector<std::vector<int>> buckets_of_pos;

  Replay(const StepPlan& p, RankPlan& r)
      : plan(p),
        l(p.layout),
        rank(r),
        inflight(schedule::InflightWindow::for_reductions(p.layout.zero_max_inflight_buckets,
                                                          p.layout.dp())) {
    d = l.dp();
    me = r.dp_rank;
    for (size_t i = 0; i < r.layer_plans.size(); ++i) {
      first_param.push_back(static_cast<int>(numels.size()));
      const LayerPlan& lp = r.layer_plans[i];
      for (size_t k = 0; k < lp.parameter_numels.size(); ++k) {
        numels.push_back(lp.parameter_numels[k]);
        decays.push_back(k < lp.parameter_decays.size() ? lp.parameter_decays[k] : 0);
        layer_of.push_back(static_cast<int>(i));
      }
    }
    first_param.push_back(static_cast<int>(numels.size()));
    if (plugin())
      buckets = schedule::gradient_buckets(numels, layer_of, l.zero_stage, l.ddp_bucket_cap_mb,
                                           l.zero_bucket_size_in_m);
    bucket_of.assign(numels.size(), -1);
    for (size_t b = 0; b < buckets.size(); ++b)
      for (int i : buckets[b]) bucket_of[i] = static_cast<int>(b);
    buckets_of_pos.resize(r.layer_plans.size());
    std::vector<int> firsts(buckets.size(), static_cast<int>(r.layer_plans.size()));
    for (size_t i = 0; i < numels.size(); ++i) {
      if (bucket_of[i] < 0) continue;
      auto& at = buckets_of_pos[layer_of[i]];
      if (at.empty() || at.back() != bucket_of[i]) at.push_back(bucket_of[i]);
      firsts[bucket_of[i]] = std::min(firsts[bucket_of[i]], layer_of[i]);
    }
    params = schedule::ParamGatherQueue(schedule::param_gather_order(firsts),
                                        std::max(1, p.layout.zero_max_inflight_buckets));
    ready.assign(buckets.size(), 0);
    inflight_bytes.assign(buckets.size(), 0);
    grads_alive.assign(r.layer_plans.size(), false);
    std::vector<char> has_params;
    for (size_t i = 0; i < r.layer_plans.size(); ++i) has_params.push_back(layer_numel(i) > 0);
    window = schedule::GatherWindow(has_params, l.zero3_prefetch);
    // DataParallelPlugin::train_hooks: none for one DDP rank.
    hooks = plugin() && !(d == 1 && l.zero_stage == 0);
  }

  // Gradients through parallel::DataParallelPlugin: a whole ViT's, or a Blocks or Linears step's
  // when it runs data parallel (colossalai benchmark's `none` on N ranks).
  bool plugin() const { return l.data_parallel_plugin; }
  int64_t layer_numel(int pos) const { return rank.layer_plans[pos].parameters; }
  int64_t layer_chunk(int pos, int r) const {
    int64_t c = 0;
    for (int64_t v : rank.layer_plans[pos].parameter_numels)
      c += schedule::zero_chunk_size(v, r, d);
    return c;
  }
  int64_t bucket_numel(int b) const {
    int64_t n = 0;
    for (int i : buckets[b]) n += numels[i];
    return n;
  }
  // Stage 0/1 with fp32 buckets: the gradients are views into the buckets, each at a 64-element
  // boundary (schedule::bucket_view_numel): the bucket's elements, padding included.
  bool grad_views() const {
    return schedule::gradients_in_buckets(l.zero_stage, l.bucket_dtype == DType::F32);
  }
  int64_t bucket_view_numel(int b) const {
    int64_t n = 0;
    for (int i : buckets[b]) n += schedule::bucket_view_numel(numels[i]);
    return n;
  }
  int64_t bucket_chunk(int b) const {
    int64_t n = 0;
    for (int i : buckets[b]) n += schedule::zero_chunk_size(numels[i], me, d);
    return n;
  }

  // ZeRO-3 gathers (DataParallelPlugin::Impl::fetch): the window's gathers start (their
  // buffers: this rank's chunk and the gathered layer), then pos's completes into the full values.
  void fetch(int pos, bool backward, const std::string& where) {
    if (layer_numel(pos) == 0) return;
    for (int i : window.fetch(pos, backward)) {
      const int64_t bytes = 4 * (layer_chunk(i, me) + layer_numel(i));
      pending[i] = bytes;
      t.win += bytes;
      t.add(bytes, where);
    }
    const int64_t bytes = pending.at(pos);
    pending.erase(pos);
    t.add(4 * layer_numel(pos), where);  // the full values, while the gather's buffers live
    t.win -= bytes;
    t.live -= bytes;
  }
  void release(int pos) {
    if (l.zero_stage == 3) t.live -= 4 * layer_numel(pos);
  }
  // ZeRO-1/2 gather actions: an issue allocates this rank's chunk and the gathered bucket, a
  // completion (the unpack into the parameters' storage) frees them.
  void param_actions(const std::vector<schedule::ParamGatherQueue::Action>& acts,
                     const std::string& where) {
    for (const auto& a : acts) {
      const int64_t bytes = 4 * (bucket_numel(a.bucket) + bucket_chunk(a.bucket));
      if (a.issue) {
        t.win += bytes;
        t.add(bytes, where);
      } else {
        t.win -= bytes;
        t.live -= bytes;
      }
    }
  }
  // Before pos's forward: the first layer begins the last step's gathers; pos's buckets complete.
  void params_ready(int pos, const std::string& where) {
    if (!params_begun) {
      params_begun = true;
      param_actions(params.begin(), where + " all-gather");
    }
    for (int b : buckets_of_pos[pos]) param_actions(params.need(b), where + " all-gather");
  }

  // ZeRO-Offload stages 2/3 (schedule/offload.h): a finished bucket's reduced chunk goes to the
  // host through one of the lane's two slots, which holds it until the slot is taken again two
  // chunks later (or the lane is flushed in sync_gradients); its packed buffer goes at once.
  bool streams = false;
  std::deque<int64_t> lane;
  void lane_free(int64_t bytes) {
    t.live -= bytes;
    t.win -= bytes;
  }
  void flush_lane() {
    for (int64_t c : lane) lane_free(c);
    lane.clear();
  }
  void finish(int b) {
    const int64_t bytes = inflight_bytes[b];
    if (streams) {
      const int64_t chunk = 4 * bucket_chunk(b);
      if (lane.size() == 2) {
        lane_free(lane.front());
        lane.pop_front();
      }
      lane.push_back(chunk);
      lane_free(bytes - chunk);
    } else {
      lane_free(bytes);
    }
    inflight_bytes[b] = 0;
    inflight.finish(b);
  }
  void launch(int b, const std::string& where) {
    if (l.zero_stage < 2) return;  // the persistent flat buffer
    for (int k : inflight.launch(b)) finish(k);
    const int64_t bytes = 4 * (bucket_numel(b) + bucket_chunk(b));
    inflight_bytes[b] = bytes;
    t.win += bytes;
    t.add(bytes, where);
    t.live -= 4 * bucket_numel(b);  // the packed full gradients are freed
    if (schedule::InflightWindow::finished_at_launch(d, l.gpu)) finish(b);
  }

  void before_backward(int pos, const std::string& where) {
    if (!hooks) return;
    if (l.zero_stage == 3) fetch(pos, true, where);
    if (l.zero_stage >= 2 && layer_numel(pos) > 0) t.add(4 * layer_numel(pos), where);
  }
  void after_backward(int pos, const std::string& where) {
    if (!hooks) return;
    for (int i = first_param[pos]; i < first_param[pos + 1]; ++i) {
      const int b = bucket_of[i];
      if (++ready[b] == static_cast<int>(buckets[b].size())) {
        ready[b] = 0;
        launch(b, where);
      }
    }
    release(pos);
  }

  // One micro-batch's forward over this rank's layers [first, last] (positions).
  void forward(int first, int last, bool holds_input, const std::string& tag) {
    for (int pos = first; pos <= last; ++pos) {
      const LayerPlan& lp = rank.layer_plans[pos];
      const std::string where = tag + " " + lp.name;
      if (hooks && l.zero_stage == 3) fetch(pos, false, where);
      if (hooks && (l.zero_stage == 1 || l.zero_stage == 2)) params_ready(pos, where);
      t.act += lp.saved - (lp.keeps_input ? lp.input : 0);
      t.add(lp.saved - (lp.keeps_input ? lp.input : 0) + lp.output, where);
      t.touch(lp.forward_extra, where);
      const bool input_alive = pos > first || holds_input;
      if (!lp.keeps_input && input_alive) t.live -= lp.input;
      if (lp.keeps_input && !input_alive) t.add(lp.input, where);  // (not reached)
      if (hooks) release(pos);
    }
  }

  // What a BackwardInput leaves alive for its BackwardWeight: per layer in backward order, the
  // bytes its weight-gradient steps hold (counted as activations) and their transient bytes;
  // `extra` (the loss stage's dlogits) goes with the last.
  struct Held {
    std::vector<std::pair<int64_t, int64_t>> layers;  // (weight_held, weight_extra)
    int64_t extra = 0;
  };

  // One micro-batch's backward; dy of the last layer alive on entry; returns with the first
  // layer's input gradient alive (0 for the embedding). hold_for_weight (a BackwardInput, the
  // weight gradients deferred): each layer's Cache and dy go at its end (WeightGrads::finish)
  // but for what its weight-gradient steps captured (LayerPlan::weight_held), returned as Held.
  Held backward(int first, int last, const std::string& tag, bool hold_for_weight = false) {
    Held held;
    for (int pos = last; pos >= first; --pos) {
      const LayerPlan& lp = rank.layer_plans[pos];
      const std::string where = tag + " " + lp.name;
      before_backward(pos, where);
      const int64_t extra = hold_for_weight ? lp.split_backward_extra : lp.backward_extra;
      t.add(extra, where);  // the input gradient included
      t.live -= extra - lp.grad_input;
      const int64_t act = lp.saved - (lp.keeps_input ? lp.input : 0);
      const int64_t dy = pos == static_cast<int>(rank.layer_plans.size()) - 1 &&
                                 rank.layers[pos] == plan.model.depth + 1
                             ? 0
                             : lp.output;  // dy (the head's dlogits are the caller's)
      t.live -= lp.saved + dy;
      t.act -= act;
      if (hold_for_weight) {
        t.act += lp.weight_held;
        t.add(lp.weight_held, where + " held for W");
        held.layers.push_back({lp.weight_held, lp.weight_extra});
      }
      after_backward(pos, where);
    }
    return held;
  }
  // The BackwardWeight: layer by layer in backward order, its steps run (their transient bytes)
  // and its hold is released (Layer::backward_weight).
  void weight(const Held& h, const std::string& tag) {
    for (const auto& [bytes, extra] : h.layers) {
      t.touch(extra, tag);
      t.live -= bytes;
      t.act -= bytes;
    }
    t.live -= h.extra;
  }
};

}  // namespace

void replay(const StepPlan& plan, RankPlan& r) {
  const Layout& l = plan.layout;
  Replay rp(plan, r);
  Memory& m = r.memory;
  const int d = l.dp();
  int64_t N = 0, S = 0;
  for (size_t i = 0; i < rp.numels.size(); ++i) {
    N += rp.numels[i];
    S += schedule::zero_chunk_size(rp.numels[i], r.dp_rank, d);
  }
  const bool vit = l.body == Body::ViT;
  const int slots = vit ? detail::optimizer_slots(l) : 0;  // Blocks, Linears: no optimizer
  // ZeRO-Offload (schedule/offload.h): the device keeps the shard's values (the weights in the
  // compute dtype) and, stage 1 only, its fp32 gradients; the host the fp32 values, gradients,
  // optimizer slots and the lane's staging.
  const bool offload = l.cpu_offload && l.gpu && l.zero_stage >= 1 && vit;
  schedule::OffloadLayout off;
  if (offload)
    off = schedule::offload_layout(rp.numels, rp.decays, rp.buckets, l.zero_stage, r.dp_rank, d,
                                   static_cast<int64_t>(dtype_size(l.precision)), slots,
                                   l.precision == DType::BF16);
  rp.streams = offload && l.zero_stage >= 2;
  m.parameters = l.zero_stage == 3 ? 0 : 4 * N;
  m.gradients = l.zero_stage >= 2 ? 0 : 4 * N;
  // Each shard's fp32 value, and its gradient unless that is a view of the full gradient's chunk.
  m.shards = offload ? off.device_value_bytes + off.device_grad_bytes
             : l.zero_stage >= 1
                 ? (schedule::shard_grads_are_views(l.zero_stage, false) ? 4 : 8) * S
                 : 0;
  m.optimizer_state = offload ? 0 : 4 * slots * (l.zero_stage >= 1 ? S : N);
  // The stage 0/1 buckets: fp32, the gradients themselves (only the alignment padding is extra);
  // bf16, a half-size copy the gradients are cast into.
  int64_t padded = 0;
  for (int64_t n : rp.numels) padded += schedule::bucket_view_numel(n);
  m.buffers = !rp.plugin() || l.zero_stage >= 2 ? 0
              : rp.grad_views()                 ? 4 * (padded - N)
                                : static_cast<int64_t>(dtype_size(l.bucket_dtype)) * N;
  // The copy-engine all-reduce's staging region, sized for the largest bucket.
  if (rp.plugin() && rp.grad_views() && l.ddp_copy_engine && l.gpu && d > 1) {
    int64_t most = 0;
    for (size_t b = 0; b < rp.buckets.size(); ++b)
      most = std::max(most, rp.bucket_view_numel(static_cast<int>(b)));
    if (most > 0) m.buffers += schedule::copy_engine_region_bytes(most, d);
  }
  // The copy-engine exchange's receive slots: every bucket, for each other rank.
  if (rp.plugin() && rp.grad_views() && l.ddp_exchange && l.zero_stage == 0 && l.gpu && d > 1 &&
      padded > 0)
    m.buffers += schedule::copy_engine_exchange_region_bytes(padded, d);
  m.host = offload ? off.host_bytes() : 0;
  // Every rank of a pipeline or tensor group holds the whole batch (the stages take their
  // micro-batches' slices from it; the last one reads the labels).
  if (vit && l.input_batches > 0) {
    const int64_t rows = l.batch * (l.pp == 1 ? l.gradient_accumulation : 1);
    const int64_t sample = 4 * plan.model.in_chans * plan.model.img_size * plan.model.img_size + 4;
    m.data = l.input_batches * rows * sample;
  }
  Tracker& t = rp.t;
  t.live = m.persistent();
  t.peak = t.live;
  t.at = "start of step";

  const int L = static_cast<int>(r.layers.size());
  const int last_layer = plan.model.depth + 1;
  const int64_t rows = plan.micro_batch_rows;
  const LayerPlan& head = r.layer_plans.back();
  const int64_t logits = rows * plan.model.num_classes * 4;
  if (!vit) {
    // colossalai benchmark's step: the input (alive throughout), forward, the output gradient
    // (mean's: a full tensor, first in fp32), backward; the output stays alive to the end.
    const LayerPlan& first = r.layer_plans.front();
    t.add(first.input, "input");
    rp.forward(0, L - 1, true, "F");
    const int64_t dy = head.output, e = static_cast<int64_t>(dtype_size(l.precision));
    const int64_t dy32 = e == 4 ? 0 : dy / e * 4;  // Tensor::full in fp32, then .to(dtype)
    t.add(dy + dy32, "B dy");
    t.live -= dy32;
    rp.backward(0, L - 1, "B");
  } else if (l.pp == 1) {
    // Plugin::forward_backward: the logits live through backward beside dlogits.
    for (int64_t a = 0; a < l.gradient_accumulation; ++a) {
      const std::string tag = fmt::format("F(mb={})", a);
      ++t.in_flight;
      rp.forward(0, L - 1, false, tag);
      t.touch(rows * 4, tag + " loss");
      t.add(logits, fmt::format("B(mb={}) loss", a));  // dlogits
      rp.backward(0, L - 1, fmt::format("B(mb={})", a));
      t.live -= logits + head.output;
      --t.in_flight;
    }
  } else {
    // The pipeline executor (parallel/pipeline.cpp): receives posted where
    // schedule::receive_posting puts them (steady state: ahead); a send's buffer released at the
    // next instruction; the loss stage keeps dlogits per micro-batch until its backward.
    const schedule::Program& prog = plan.schedule.programs[r.pp_rank];
    const Shapes s = shapes_of(plan.model, l, rows, r.tp_rank);
    const int64_t bnd = s.lr * s.d * 4;
    std::map<int, int> pos_of;  // global layer -> position
    for (int i = 0; i < L; ++i) pos_of[r.layers[i]] = i;
    int64_t sending = 0;
    std::map<std::pair<int, int>, Replay::Held> held_for_weight;  // (mb, chunk)
    const auto posting = schedule::receive_posting(plan.schedule, r.pp_rank, true);
    for (size_t i = 0; i < prog.size(); ++i) {
      const schedule::Instr& in = prog[i];
      t.live -= sending;  // released at the next instruction
      t.win -= sending;
      sending = 0;
      for (size_t k = 0; k < posting[i].size(); ++k) {
        t.win += bnd;
        t.add(bnd, "posted receive");
      }
      const int first = pos_of[in.first_layer], last = pos_of[in.first_layer + in.num_layers - 1];
      const std::string tag = in.str();
      using schedule::Op;
      switch (in.op) {
        case Op::RecvActivation:
        case Op::RecvGrad: {
          t.win -= bnd;  // the posted buffer becomes the consumer's
          break;
        }
        case Op::Forward:
          ++t.in_flight;
          rp.forward(first, last, in.first_layer > 0, tag);
          if (in.first_layer + in.num_layers - 1 == last_layer) {
            t.touch(rows * 4, tag + " loss");
            t.add(logits, tag + " loss");  // dlogits, kept until the backward
            t.live -= r.layer_plans[last].output;
          }
          break;
        case Op::Backward:
          rp.backward(first, last, tag);
          if (in.first_layer + in.num_layers - 1 == last_layer) t.live -= logits;
          --t.in_flight;
          break;
        case Op::BackwardInput: {
          // The weight gradients wait for the BackwardWeight: what they read stays (the loss
          // stage's dlogits included, the head's output gradient).
          Replay::Held h = rp.backward(first, last, tag, true);
          if (in.first_layer + in.num_layers - 1 == last_layer) h.extra += logits;
          held_for_weight[{in.mb, in.chunk}] = h;
          break;
        }
        case Op::BackwardWeight: {
          const auto it = held_for_weight.find({in.mb, in.chunk});
          CAI_CHECK(it != held_for_weight.end(), "[plan] {} without its BackwardInput", tag);
          rp.weight(it->second, tag);
          held_for_weight.erase(it);
          --t.in_flight;
          break;
        }
        case Op::SendActivation:
        case Op::SendGrad:
          sending = bnd;  // the output or input gradient, already counted, now the send's
          t.win += bnd;
          break;
        default:
          break;
      }
    }
    t.live -= sending;
    t.win -= sending;
  }
  // sync_gradients: the rest of the stage 2/3 buckets complete.
  while (!rp.inflight.inflight().empty()) rp.finish(rp.inflight.inflight().front());
  rp.flush_lane();  // offload: the host has every chunk
  // The optimizer step: ZeRO-1/2's all-gathers of the stepped shards are deferred to the next
  // forward (the forward above carried the last step's, begun at its first layer, at most
  // zero_max_inflight_buckets buckets' buffers alive); what that forward did not reach completes
  // here. LAMB's update buffer per parameter.
  if (rp.hooks && (l.zero_stage == 1 || l.zero_stage == 2))
    rp.param_actions(rp.params.need_all(), "OptStep all-gather");
  if (l.optimizer == "lamb") {
    int64_t big = 0;
    for (size_t i = 0; i < rp.numels.size(); ++i)
      big = std::max(big, l.zero_stage >= 1 ? schedule::zero_chunk_size(rp.numels[i], r.dp_rank, d)
                                            : rp.numels[i]);
    t.touch(4 * big, "OptStep lamb");
  }
  m.activations = t.peak_act;
  m.micro_batches_in_flight = t.peak_in_flight;
  m.window = t.peak_win;
  m.transient = t.peak - m.persistent() - m.activations - m.window;
  m.allocator = static_cast<int64_t>(l.allocator_overhead * static_cast<double>(t.peak));
  m.peak = t.peak + m.allocator;
  m.peak_at = t.at;

  // Per-step collectives of data parallelism and the pipeline.
  for (size_t b = 0; b < rp.buckets.size() && d > 1; ++b) {
    const int64_t bytes = 4 * rp.bucket_numel(b);
    const std::string name = fmt::format("bucket {}", b);
    if (l.zero_stage <= 1) {
      const int64_t wire = rp.grad_views() ? 4 * rp.bucket_view_numel(b)
                                           : static_cast<int64_t>(dtype_size(l.bucket_dtype)) *
                                                 rp.bucket_numel(b);  // bf16: half
      // The copy-engine exchange: every rank gathers every other's whole bucket.
      if (l.ddp_exchange && l.zero_stage == 0 && l.gpu && rp.grad_views())
        r.collectives.push_back(
            {CollectiveKind::AllGather, Group::Dp, d, d * wire, "", name, Phase::Backward, 1});
      else
        r.collectives.push_back(
            {CollectiveKind::AllReduce, Group::Dp, d, wire, "", name, Phase::Backward, 1});
    } else {
      const int per = l.pp == 1 ? static_cast<int>(l.gradient_accumulation) : 1;
      r.collectives.push_back(
          {CollectiveKind::ReduceScatter, Group::Dp, d, bytes, "", name, Phase::Backward, per});
    }
    if (l.zero_stage == 1 || l.zero_stage == 2)
      r.collectives.push_back(
          {CollectiveKind::AllGather, Group::Dp, d, bytes, "", name, Phase::OptimizerStep, 1});
  }
  if (l.zero_stage == 3 && d > 1)
    for (int pos = 0; pos < L; ++pos) {
      const int64_t bytes = 4 * rp.layer_numel(pos);
      const int per = static_cast<int>(l.gradient_accumulation);
      r.collectives.push_back({CollectiveKind::AllGather, Group::Dp, d, bytes,
                               r.layer_plans[pos].name, "parameters", Phase::Forward, per});
      r.collectives.push_back({CollectiveKind::AllGather, Group::Dp, d, bytes,
                               r.layer_plans[pos].name, "parameters", Phase::Backward, per});
    }
  if (l.pp > 1) {
    const Shapes s = shapes_of(plan.model, l, rows, r.tp_rank);
    const int64_t bnd = s.lr * s.d * 4;
    for (const schedule::Instr& in : plan.schedule.programs[r.pp_rank]) {
      using schedule::Op;
      if (!schedule::is_send(in.op) && !schedule::is_recv(in.op)) continue;
      r.collectives.push_back(
          {schedule::is_send(in.op) ? CollectiveKind::Send : CollectiveKind::Recv, Group::Pp, 2,
           bnd, "", in.str(),
           in.op == Op::SendActivation || in.op == Op::RecvActivation ? Phase::Forward
                                                                      : Phase::Backward,
           1});
    }
  }
}

}  // namespace cai::plan::detail
