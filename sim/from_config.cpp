#include "from_config.h"

#include <algorithm>
#include <map>

#include "cai/core/error.h"
#include "cai/nn/tensor_parallel.h"
#include "cai/nn/vit.h"
#include "cai/schedule/buckets.h"
#include "cai/schedule/offload.h"
#include "cai/schedule/param_gathers.h"
#include "dp_ops.h"
#include "expand.h"
#include "platform.h"
#include "replay.h"

namespace cai::sim {

std::string op_kind_of(const std::string& op) {
  auto has = [&](const char* s) { return op.find(s) != std::string::npos; };
  if (has("qkv") || has("proj") || has("fc1") || has("fc2") || has("head")) return "gemm";
  if (has("attn")) return "attention";
  if (has("norm")) return "layernorm";
  if (has("optim")) return "optimizer";
  return "elementwise";
}

namespace {

// Which part of a compute instruction ops() expands: a Forward or a whole Backward, or a split
// backward's BackwardInput (everything but the linears' weight-gradient GEMMs) or its
// BackwardWeight (those GEMMs, and the gradient buckets they complete).
enum class Part { Whole, Input, Weight };

Part part_of(schedule::Op op) {
  return op == schedule::Op::BackwardInput    ? Part::Input
         : op == schedule::Op::BackwardWeight ? Part::Weight
                                              : Part::Whole;
}

// A linear's backward: an input-gradient and a weight-gradient GEMM of the same FLOPs.
bool has_weight_gemm(const plan::OpCost& c) {
  return c.phase == plan::Phase::Backward && op_kind_of(c.op) == "gemm";
}

OpKind kind_of(plan::CollectiveKind k) {
  switch (k) {
    case plan::CollectiveKind::AllReduce:
      return OpKind::AllReduce;
    case plan::CollectiveKind::ReduceScatter:
      return OpKind::ReduceScatter;
    case plan::CollectiveKind::AllGather:
      return OpKind::AllGather;
    case plan::CollectiveKind::Broadcast:
      return OpKind::Broadcast;
    case plan::CollectiveKind::Send:
      return OpKind::Send;
    case plan::CollectiveKind::Recv:
      return OpKind::Recv;
  }
  return OpKind::AllReduce;
}

DType sim_dtype(cai::DType t) {
  return t == cai::DType::BF16 ? DType::BF16 : t == cai::DType::F16 ? DType::F16 : DType::F32;
}

}  // namespace

namespace {

// A config's step on nproc processes as the executor runs it: the plan, the program every stage
// runs, and the ops of each compute instruction (layers, tensor-parallel collectives, the
// data-parallel reductions of the last backward). Sim rank = (dp · tp + tp_rank) · stages + stage;
// the first `listed_dp` data-parallel replicas are listed, their dp rings spanning the copies
// when listed_dp < dp.
class ConfigProgram {
 public:
  ConfigProgram(const config::TrainConfig& cfg, int nproc, const Cluster& cluster,
                const plan::StepPlan* plan)
      : ConfigProgram(cfg.vit(), validated_layout(cfg, nproc), nproc, cluster, plan) {}
  ConfigProgram(const nn::ViTConfig& vc, const plan::Layout& layout, int nproc,
                const Cluster& cluster, const plan::StepPlan* plan)
      : layout_(layout) {
    CAI_CHECK(nproc == layout_.world, "[sim] {} processes for a layout of {}", nproc,
              layout_.world);
    CAI_CHECK(nproc <= cluster.max_ranks(),
              "[sim] {} processes do not fit cluster {} ({} GPUs × {} ranks each)", nproc,
              cluster.name, cluster.gpus(), cluster.max_ranks_per_gpu);
    plan_ = plan ? *plan : plan::make_plan(vc, layout_);
    P_ = layout_.pp;
    T_ = layout_.tp;
    D_ = plan_.dp;
    listed_dp_ = D_;
    listed_tp_ = T_;
    // The program: the plan's pipeline schedule, or one stage running its micro-batches 1F1B
    // (forward then backward per batch, as the data-parallel executor does).
    sched_ = plan_.schedule;
    part_ = plan_.partition;
    if (P_ == 1) {
      schedule::ScheduleOptions so;
      so.stages = 1;
      so.micro_batches = plan_.micro_batches;
      part_ = schedule::partition_uniform(static_cast<int>(plan_.stages[0].layers.size()), 1);
      sched_ = schedule::make("1f1b", so, part_);
    }
    // Layer index -> its plan (from the stage that holds it).
    for (const plan::RankPlan& r : plan_.stages)
      for (size_t i = 0; i < r.layers.size(); ++i) layer_plan_[r.layers[i]] = &r.layer_plans[i];
  }

  const plan::StepPlan& plan() const { return plan_; }
  const plan::Layout& layout() const { return layout_; }
  const schedule::Schedule& schedule() const { return sched_; }
  const schedule::Partition& partition() const { return part_; }
  int P() const { return P_; }
  int T() const { return T_; }
  int D() const { return D_; }
  int listed_dp() const { return listed_dp_; }
  int listed_tp() const { return listed_tp_; }
  // The mesh rank (= GPU) of sim rank r.
  int mesh_rank(int r) const {
    const int s = r % P_, replica = r / P_, t = replica % T_, d = replica / T_;
    return d * P_ * T_ + s * T_ + t;
  }
  void set_listed_dp(int k) { listed_dp_ = k; }
  // Identical tensor-parallel slices (2d/2.5d, one data-parallel replica, no pipeline): the
  // job's tensor ranks 0..T-1 as T / listed copies of its first `listed` ranks, whole depth
  // slices of q² ranks for 2.5d with depth > 1, whole rows of q ranks for 2d (depth 1), k of
  // them with k · unit filling whole nodes (replicas_per_copy). Exact when every sub-group's
  // ring lies inside a copy or is its listed members followed by the same members of each next
  // copy, which is checked for every sub-group the plan uses (2d: row inside a copy, column
  // through the copies; 2.5d: row and column inside, depth and column×depth through them); the
  // SUMMA broadcasts are rounds rooted at every member in turn, so every copy runs the same
  // program (replay.h).
  // Returns the listed tensor ranks: T when nothing folds.
  int tensor_ranks_per_copy(const Cluster& cluster) const {
    if (D_ != 1 || P_ != 1 || !layout_.nd() || layout_.tp_mode == "3d") return T_;
    const nn::TensorParallel::Grid g =
        nn::TensorParallel::grid(layout_.tp_mode, T_, layout_.tp_depth);
    const int depth = layout_.tp_depth, unit = depth > 1 ? g.q * g.q : g.q;
    const int units = T_ / unit;
    const int k = replicas_per_copy(cluster, unit, units);
    if (k >= units) return T_;
    const int listed = k * unit;
    std::vector<std::string> names{"tp"};
    for (const plan::RankPlan& r : plan_.stages)
      for (const plan::LayerPlan& lp : r.layer_plans)
        for (const plan::Collective& c : lp.collectives) {
          if (c.group != plan::Group::Tp) continue;
          if (std::find(names.begin(), names.end(), c.subgroup) == names.end())
            names.push_back(c.subgroup);
          // A broadcast with one root would make the copies differ.
          if (c.kind == plan::CollectiveKind::Broadcast &&
              !(c.rotating_root && c.count == c.group_size))
            return T_;
        }
    for (const std::string& name : names)
      for (int t = 0; t < listed; ++t) {
        const std::vector<int> full = tp_members(name, t);
        std::vector<int> mine, want;
        for (int m : full)
          if (m < listed) mine.push_back(m);
        for (int c = 0; c * listed < T_; ++c)
          for (int m : mine) want.push_back(c * listed + m);
        if (mine.size() < full.size() && full != want) return T_;
      }
    return listed;
  }
  void set_listed_tp(int k) { listed_tp_ = k; }
  // The tensor ranks of sub-group `name` ("tp": all) holding tensor rank t, in ring order.
  std::vector<int> tp_members(const std::string& name, int t) const {
    if (name == "tp") {
      std::vector<int> all(T_);
      for (int k = 0; k < T_; ++k) all[k] = k;
      return all;
    }
    return nn::tp_group_members(layout_.tp_mode, T_, layout_.tp_depth, name, t);
  }

  // No broadcast over the dp group (one root would make the copies differ).
  bool foldable() const {
    for (const plan::RankPlan& r : plan_.stages)
      for (const plan::Collective& c : r.collectives)
        if (c.group == plan::Group::Dp && c.kind == plan::CollectiveKind::Broadcast) return false;
    return true;
  }

  // The ops of a Forward or Backward of virtual stage `vstage` for micro-batch `mb` on sim rank
  // `rank`; groups are registered in `w` (one Workload per ConfigProgram: the ids are cached).
  // A split backward (part Input, then Weight): the linears' GEMMs in halves, dx in the
  // BackwardInput, dw in the BackwardWeight; a layer with linears keeps what its weight-gradient
  // steps captured until its BackwardWeight (LayerPlan::weight_held, as the plan's memory replay
  // counts); the gradient buckets complete in the BackwardWeight.
  std::vector<Op> ops(bool fwd, int mb, int rank, int vstage, Workload& w, int base = 0,
                      Part part = Part::Whole) {
    const bool input_only = !fwd && part == Part::Input;
    const bool weight_only = !fwd && part == Part::Weight;
    const int P = P_, T = T_, s = rank % P, replica = rank / P, t = replica % T, d = replica / T;
    Groups& g = groups_[rank];
    // The sim ranks of a tensor sub-group ("tp": the whole group); with folded tensor slices
    // its listed members, the ring going on through the copies when some are not listed.
    auto tp_group = [&](const std::string& name) {
      std::vector<int> ranks;
      for (int k : tp_members(name, t))
        if (k < listed_tp_) ranks.push_back(((d * T + k) * P) + s);
      const bool spans =
          static_cast<int>(ranks.size()) < static_cast<int>(tp_members(name, t).size());
      return w.add_group(ranks, spans);
    };
    if (!g.made) {
      g.made = true;
      g.tp = T > 1 ? tp_group("tp") : -1;
    }
    // 2d/2.5d/3d sub-groups (row, col, input, ...) of this rank's tensor group.
    auto group_of = [&](const std::string& name) {
      if (name == "tp") return g.tp;
      auto it = g.sub.find(name);
      if (it != g.sub.end()) return it->second;
      return g.sub[name] = tp_group(name);
    };
    std::vector<int> layers;
    for (int i = 0; i < part_.num_layers(vstage); ++i)
      layers.push_back(part_.first_layer(vstage) + i);
    if (!fwd) std::reverse(layers.begin(), layers.end());
    std::vector<Op> ops;
    Dp* dp = data_parallel(rank, w);
    auto at = [&](size_t i) { return base + static_cast<int>(i); };
    // Bucket b's reduction on the data-parallel stream.
    auto reduce_bucket = [&](OpKind kind, int b) {
      Op r = Op::collective(kind,
                            fmt::format("bucket {} {}", b,
                                        kind == OpKind::AllReduce   ? "all_reduce"
                                        : kind == OpKind::AllGather ? "exchange"
                                                                    : "reduce_scatter"),
                            dp->group, dp->bucket_wire[b], 3);
      r.copy_engine = dp->exchange;
      r.category = "reduce";
      dp->reduce_op[b] = at(ops.size());
      ops.push_back(std::move(r));
    };
    // Stage 0/1: the waiting buckets' all-reduces (bf16 buckets: each after its cast), issued
    // where the executor's overlap point or its fallback launches them, unless held
    // (parallel.ddp_bucket_hold: until that share of the gradients is final).
    auto launch_waiting = [&] {
      if (!dp || dp->waiting.empty() ||
          !schedule::launch_held_buckets(dp->ready_numel, dp->numel_total, layout_.ddp_bucket_hold))
        return;
      for (int b : dp->waiting) {
        if (dp->cast_bytes > 0)  // bf16 buckets: the gradients cast into the bucket
          ops.push_back(dp_copy(fmt::format("bucket {} cast", b),
                                dp->cast_bytes * dp->bucket_numel[b],
                                1));  // one copy_spans launch, casting
        reduce_bucket(dp->exchange ? OpKind::AllGather : OpKind::AllReduce, b);
      }
      dp->waiting.clear();
    };
    for (size_t li = 0; li < layers.size(); ++li) {
      const plan::LayerPlan& lp = *layer_plan_.at(layers[li]);
      const int pos = dp ? dp->pos.at(layers[li]) : -1;
      const bool has_w = std::any_of(lp.ops.begin(), lp.ops.end(), has_weight_gemm);
      if (dp && fwd) begin_host_step(*dp, base, ops);
      // ZeRO-1/2: the last step's deferred gathers (begun at the first layer) this layer needs.
      if (dp && fwd && (layout_.zero_stage == 1 || layout_.zero_stage == 2)) {
        if (!dp->params_begun) {
          dp->params_begun = true;
          param_actions(*dp, dp->params.begin(), base, ops);
        }
        for (int b : dp->buckets_of_pos[pos]) param_actions(*dp, dp->params.need(b), base, ops);
      }
      // ZeRO-3: the gathers the window starts now, then this layer's completes into its values.
      if (dp && layout_.zero_stage == 3 && dp->layer_numel[pos] > 0 && !weight_only) {
        for (int i : dp->window.fetch(pos, !fwd)) {
          await_host_step(*dp, dp->params_of_pos[i], base, ops);
          ops.push_back(
              dp_copy(fmt::format("{} gather pack", dp->name[i]), 8 * dp->layer_chunk[i], 1));
          Op ag = Op::collective(OpKind::AllGather,
                                 fmt::format("{} parameters all_gather", dp->name[i]), dp->group,
                                 4 * dp->layer_numel[i], 3);
          ag.category = "reduce";
          ag.mem_start.push_back({MemKind::Buffers, 4 * (dp->layer_chunk[i] + dp->layer_numel[i])});
          dp->gather_op[i] = at(ops.size());
          ops.push_back(std::move(ag));
        }
        Op un = dp_copy(fmt::format("{} gather unpack", lp.name), 8 * dp->layer_numel[pos], 1);
        un.deps.push_back(dep_on(dp->gather_op.at(pos), base));
        dp->gather_op.erase(pos);
        // The full values are allocated while the gather's buffers still live.
        un.mem_start.push_back({MemKind::Parameters, 4 * dp->layer_numel[pos]});
        un.mem_end.push_back(
            {MemKind::Buffers, -4 * (dp->layer_chunk[pos] + dp->layer_numel[pos])});
        ops.push_back(std::move(un));
      }
      // 1D tensor parallelism: a column linear's backward (nn::column_linear_bwd) starts the
      // input gradient's all-reduce (reduce-scatter with sequence parallelism) after the
      // input-gradient GEMM and runs the weight-gradient GEMM meanwhile, then waits for it:
      // the op as its two halves, the collective on stream 1 between them, and a wait. On GPUs
      // only: NCCL moves the data on its own stream, while an MPI collective of CPU processes
      // progresses only inside the wait, after the GEMM.
      auto overlapped = [&](const plan::Collective& c) {
        return !fwd && layout_.gpu && g.tp >= 0 && !layout_.nd() && c.group == plan::Group::Tp &&
               c.phase == plan::Phase::Backward && c.subgroup == "tp" &&
               (c.kind == plan::CollectiveKind::AllReduce ||
                c.kind == plan::CollectiveKind::ReduceScatter) &&
               std::any_of(lp.ops.begin(), lp.ops.end(), [&](const plan::OpCost& o) {
                 return c.op == o.op + " input grad" && o.phase == plan::Phase::Backward;
               });
      };
      const size_t first_op = ops.size();
      // The executor's order: the forward's ops; in backward a checkpointed layer's recompute
      // (forward order), then the backward's ops last to first.
      std::vector<const plan::OpCost*> order;
      for (const plan::OpCost& c : lp.ops)
        if (c.phase == (fwd ? plan::Phase::Forward : plan::Phase::Recompute) && !weight_only)
          order.push_back(&c);
      if (!fwd)
        for (auto it = lp.ops.rbegin(); it != lp.ops.rend(); ++it)
          if (it->phase == plan::Phase::Backward && (!weight_only || has_weight_gemm(*it)))
            order.push_back(&*it);
      for (const plan::OpCost* cp : order) {
        const plan::OpCost& c = *cp;
        // The layer's overlap point: before the backward of the op the executor's layers reach
        // it at (nn::backward_overlap_op, the one definition: a block's attention, the
        // embedding's position and class-token gradients; none on the 2d/2.5d/3d path).
        if (c.phase == plan::Phase::Backward) {
          const char* at = nn::backward_overlap_op(lp.name, layout_.nd());
          if (at && c.op == at) launch_waiting();
        }
        Op op;
        op.kind = OpKind::Compute;
        op.name = fmt::format("{} {}{}", lp.name, c.op, fwd ? "" : " bwd");
        op.category = "compute";
        op.mb = mb;
        op.flops = c.flops;
        op.mem_bytes = static_cast<double>(c.bytes_read + c.bytes_written);
        // A plan op that moves bytes without FLOPs (sequence parallelism's token copies, SUMMA's
        // partial sums and casts) is a device copy: timed at the profile's measured streaming
        // bandwidth (op_seconds).
        op.op_kind = c.flops == 0 && c.bytes_read + c.bytes_written > 0 ? "copy" : op_kind_of(c.op);
        op.calls = c.calls;  // sequence parallelism's staging: a launch per collective
        const char* ph = c.phase == plan::Phase::Backward ? "|bwd" : "|fwd";
        op.cal_key = c.op + ph;
        if (layout_.nd() && (c.op == "norm1" || c.op == "norm2" || c.op == "norm")) {
          // The split LayerNorm: its own samples where the profile timed it, else the
          // whole-row LayerNorm's (plan.h: kNdNormCalibration).
          op.cal_fallback = op.cal_key;
          op.cal_key = std::string(plan::kNdNormCalibration) + ph;
        } else if (c.op == plan::kNdLnPasses) {
          op.covered_by = std::string(plan::kNdNormCalibration) + ph;
        } else if (!layout_.nd() && lp.name.rfind("blocks.", 0) == 0) {
          // The 1D block's residual stream (nn::Block::backward, apps/colossalai/calibrate.cpp):
          // its LayerNorm backwards add the residual gradient in their pass, so a profile that
          // timed them so has the "residual" backward inside them; its unfused residual adds
          // take the linears' outputs in the compute dtype. Older profiles: the plain keys.
          const bool bwd = c.phase == plan::Phase::Backward;
          if ((c.op == "norm1" || c.op == "norm2") && bwd) {
            op.cal_fallback = op.cal_key;
            op.cal_key = c.op + "|bwd_add";
          } else if (c.op == "residual" && bwd) {
            op.covered_by = "norm1|bwd_add";
          } else if (c.op == "residual") {
            op.cal_fallback = op.cal_key;
            op.cal_key = "residual|fwd_ct";
          }
        }
        if ((input_only || weight_only) && has_weight_gemm(c)) {
          op.name += input_only ? " dx" : " dw";
          op.share = 0.5;
        }
        std::vector<const plan::Collective*> during;
        if (c.phase == plan::Phase::Backward && !weight_only)
          for (const plan::Collective& k : lp.collectives)
            if (k.op == c.op + " input grad" && overlapped(k)) during.push_back(&k);
        if (during.empty()) {
          ops.push_back(std::move(op));
          continue;
        }
        Op dw = op;
        if (!input_only) op.name += " dx", dw.name += " dw";
        op.share = dw.share = 0.5;  // two GEMMs of the same FLOPs
        const int dx_at = static_cast<int>(ops.size());
        ops.push_back(std::move(op));
        std::vector<int> started;
        for (const plan::Collective* k : during)
          for (int n = 0; n < k->count; ++n) {
            Op x = Op::collective(
                kind_of(k->kind),
                fmt::format("{} {} {}", lp.name, k->op, plan::collective_name(k->kind)), g.tp,
                k->bytes, 1);
            x.deps.push_back(dx_at);
            started.push_back(static_cast<int>(ops.size()));
            ops.push_back(std::move(x));
          }
        if (!input_only) ops.push_back(std::move(dw));  // split: in the BackwardWeight
        Op wait = Op::compute(fmt::format("{} {} bwd wait", lp.name, c.op), 0.0, mb);
        wait.deps = started;
        ops.push_back(std::move(wait));
      }
      if (ops.size() > first_op) {
        // The layer's memory as the plan's replay counts it (plan_memory.cpp): its cache, kept from
        // its forward to its backward, built during the forward (with the output and the forward's
        // working tensors on top), and in backward the output's gradient and the backward's
        // working tensors (the input gradient included) on top of it; the working tensors, the
        // output and its gradient are counted while the layer's ops run (the plan's peak is
        // inside a layer), the cache until its backward ends.
        // Split: the BackwardInput's working tensors (LayerPlan::split_backward_extra), and what
        // the weight-gradient steps captured stays to the BackwardWeight (weight_held, in place
        // of the cache and the output gradient), whose own working tensors are weight_extra.
        const int64_t work = fwd           ? lp.forward_extra + lp.output
                             : weight_only ? lp.weight_extra
                             : input_only  ? lp.split_backward_extra + lp.output
                                           : lp.backward_extra + lp.output;
        const int64_t held = has_w && (input_only || weight_only) ? lp.weight_held : 0;
        const int64_t release = fwd           ? work
                                : weight_only ? held + work
                                : input_only  ? work + lp.saved - held
                                              : work + lp.saved;
        if (fwd && lp.saved + work > 0)
          ops[first_op].mem_start.push_back({MemKind::Activations, lp.saved + work});
        if (!fwd && work > 0) ops[first_op].mem_start.push_back({MemKind::Activations, work});
        if (release > 0) ops.back().mem_end.push_back({MemKind::Activations, -release});
        if (dp && !fwd && !weight_only && layout_.zero_stage >= 2 && dp->layer_numel[pos] > 0)
          ops[first_op].mem_start.push_back({MemKind::Gradients, 4 * dp->layer_numel[pos]});
        if (dp && !weight_only && layout_.zero_stage == 3 && dp->layer_numel[pos] > 0)
          ops.back().mem_end.push_back({MemKind::Parameters, -4 * dp->layer_numel[pos]});
      }
      if (g.tp >= 0 && !weight_only)
        for (const plan::Collective& c : lp.collectives) {
          const bool mine =
              fwd ? c.phase == plan::Phase::Forward
                  : c.phase == plan::Phase::Backward || c.phase == plan::Phase::Recompute;
          if (!mine || c.group != plan::Group::Tp || overlapped(c)) continue;
          if (c.kind == plan::CollectiveKind::Broadcast && c.rotating_root &&
              c.count == c.group_size && c.group_size > 1) {
            // SUMMA's q broadcasts, each member the root of one: one round.
            ops.push_back(Op::collective(OpKind::BroadcastRound,
                                         fmt::format("{} {} broadcast ×{}", lp.name, c.op, c.count),
                                         group_of(c.subgroup), c.bytes, 0));
            continue;
          }
          for (int k = 0; k < c.count; ++k)
            ops.push_back(Op::collective(
                kind_of(c.kind),
                fmt::format("{} {} {}", lp.name, c.op, plan::collective_name(c.kind)),
                group_of(c.subgroup), c.bytes, 0));
        }
      // The buckets this layer's backward completes: DDP / ZeRO-1 in the step's last
      // micro-batch (all-reduced in place at the next overlap point, what waited from before
      // launched now), ZeRO-2/3 in every micro-batch (packed, then reduce-scattered, at most
      // zero_max_inflight_buckets in flight).
      const bool reduces =
          (layout_.zero_stage >= 2 || mb == plan_.micro_batches - 1) && !input_only;
      if (dp && !fwd && reduces && layout_.zero_stage < 2) {
        launch_waiting();
        for (int b : dp->launch_at[pos]) {
          dp->waiting.push_back(b);
          dp->ready_numel += dp->bucket_numel[b];
        }
      } else if (dp && !fwd && reduces) {
        for (int b : dp->launch_at[pos]) {
          const std::string bn = fmt::format("bucket {}", b);
          for (int k : dp->inflight.launch(b)) dp_finish(*dp, k, base, ops);
          Op pack = dp_copy(bn + " pack", 8 * dp->bucket_numel[b], 1);  // one copy_spans launch
          // The bucket's buffers while the gradients are packed into them, then those go.
          pack.mem_start.push_back(
              {MemKind::Buffers, 4 * (dp->bucket_numel[b] + dp->bucket_chunk[b])});
          pack.mem_end.push_back({MemKind::Gradients, -4 * dp->bucket_numel[b]});
          ops.push_back(std::move(pack));
          reduce_bucket(OpKind::ReduceScatter, b);
          if (schedule::InflightWindow::finished_at_launch(D_, layout_.gpu)) {
            dp->inflight.finish(b);
            dp_finish(*dp, b, base, ops);
          }
        }
      }
    }
    // The end of a chunk's backward is an overlap point too (what waits goes before other
    // micro-batches' work).
    if (!fwd) launch_waiting();
    // A chunk without linears still has its BackwardWeight instruction: an empty op marks it.
    if (weight_only &&
        std::none_of(ops.begin(), ops.end(), [](const Op& o) { return o.stream == 0; }))
      ops.push_back(Op::compute(fmt::format("vs {} no weight gradients", vstage), 0.0, mb));
    return ops;
  }

  // What DataParallelPlugin does after the reductions (ReduceGrads: sync_gradients) and after
  // the optimizer step (ZeRO-1/2: every rank's stepped shards gathered into the parameters).
  std::vector<Op> after(const schedule::Instr& in, int rank, int base, Workload& w) {
    std::vector<Op> ops;
    Dp* dp = data_parallel(rank, w);
    if (!dp) return ops;
    if (in.op == schedule::Op::ReduceGrads) {
      dp->ready_numel = 0;
      if (layout_.zero_stage >= 2) {
        const std::vector<int> left = dp->inflight.inflight();
        for (int k : left) {
          dp_finish(*dp, k, base, ops);
          dp->inflight.finish(k);
        }
      }
      if (dp->offload && layout_.zero_stage >= 2) dp->lane.flush(base, ops);
      if (dp->cast_bytes > 0)  // bf16 buckets: the sums cast back into the gradients
        ops.push_back(dp_copy("buckets unpack", dp->cast_bytes * dp->numel_total,
                              static_cast<int64_t>(dp->bucket_numel.size())));  // one per bucket
      // This rank's chunk of the sums into its shard (without offload the shard's gradients
      // are views of that chunk: nothing to copy).
      if (layout_.zero_stage == 1 && !schedule::shard_grads_are_views(1, dp->offload))
        ops.push_back(dp_copy("shard gradients", 8 * dp->chunk_total, 1));  // one launch
      if (dp->offload && layout_.zero_stage == 1)  // the device gradient shard to the host
        ops.push_back(host_copy("gradient shard to host", dp->lane.off.step_download, false, 0));
      return ops;
    }
    if (in.op != schedule::Op::OptimizerStep) return ops;
    if (dp->offload && !dp->step_beside_forward) dp->lane.upload(base, ops, true);
    dp->window.clear();  // ZeRO-3: gathers issued ahead are dropped after the step
    dp->gather_op.clear();
    if (layout_.zero_stage != 1 && layout_.zero_stage != 2) return ops;
    // ZeRO-1/2: this step's forward carried the last step's gathers (ops above); the gathers
    // the step issues run into the next step's forward, which the next replay's forward
    // carries. Those of layers this forward did not reach complete here (need_all).
    param_actions(*dp, dp->params.need_all(), base, ops);
    dp->params_begun = false;
    return ops;
  }

 private:
  // vit_train's checks (and their messages) before the plan's.
  static plan::Layout validated_layout(const config::TrainConfig& cfg, int nproc) {
    config::validate(cfg, nproc);
    return config::plan_layout(cfg, nproc);
  }
  struct Groups {
    bool made = false;
    int tp = -1, dp = -1;
    std::map<std::string, int> sub;
  };
  // One rank's data parallelism as DataParallelPlugin runs it (parallel/data_parallel.cpp):
  // its stage's parameters in buckets (schedule::gradient_buckets, the plan's and the
  // executor's rule), this rank's ZeRO chunks, the ZeRO-3 gather window and the ZeRO-2/3
  // reduction window (schedule::GatherWindow / InflightWindow), and where the ops issued so
  // far sit in the program (for the host's waits on them).
  struct Dp {
    int group = -1;
    std::map<int, int> pos;  // global layer -> position in the stage
    std::vector<std::string> name;
    std::vector<int64_t> layer_numel, layer_chunk, layer_params;  // per position
    std::vector<int64_t> bucket_numel, bucket_chunk, bucket_params, bucket_wire, gather_bytes;
    std::vector<std::vector<int>> launch_at;  // per position: buckets its backward completes
    int64_t numel_total = 0, chunk_total = 0, params_total = 0;
    // bf16 buckets: bytes per element of a cast (0: the gradients are the bucket).
    int64_t cast_bytes = 0;
    // The copy-engine exchange (parallel.ddp_exchange): each bucket gathered whole by every rank
    // on the copy engines (the plan's all-gather of dp × the bucket) instead of all-reduced.
    bool exchange = false;
    schedule::GatherWindow window;
    schedule::InflightWindow inflight;
    std::map<int, int> gather_op;  // position -> program index of its pending all-gather
    // ZeRO-1/2: the step's parameter all-gathers deferred to the next forward (the executor's
    // schedule::ParamGatherQueue); a step's forward carries the last step's: begun at its first
    // layer (those the last step issued), completed as its layers reach their buckets.
    schedule::ParamGatherQueue params;
    bool params_begun = false;
    std::vector<std::vector<int>> buckets_of_pos;  // per position: buckets holding its parameters
    std::map<int, int> param_gather_op;            // bucket -> program index of its all-gather
    std::vector<int> reduce_op;  // per bucket: program index of its latest reduction
    // ZeRO-Offload (schedule/offload.h; dp_ops.h's OffloadLaneOps).
    bool offload = false;
    OffloadLaneOps lane;
    // parallel.offload_step_overlap under bf16: the last step's host step and upload run at the
    // start of this step's program, beside its forward (the steady state of the executor's step
    // thread), each gather waiting for the copies of its own parameters: per parameter (stage
    // order) the program index of its last copy, and the fp32 part's (-1: none).
    bool step_beside_forward = false, uploaded = false;
    std::vector<int> param_copy;
    int fp32_copy = -1;
    std::vector<std::vector<int>> params_of_pos, params_of_bucket;
    // Stage 0/1: buckets complete but not launched, waiting for the next overlap point
    // (nn::LayerHooks::overlap_point: a block's attention backward, the embedding's position and
    // class-token gradients, a chunk's end).
    std::vector<int> waiting;
    int64_t ready_numel = 0;  // elements of this step's buckets launched or waiting
  };
  // The rank's data-parallel state, made on first use; null without data parallelism.
  Dp* data_parallel(int rank, Workload& w) {
    // One process with ZeRO runs the plugin too (its buckets, packs and, with offload, the lane).
    if ((D_ <= 1 && layout_.zero_stage == 0) || !layout_.data_parallel_plugin) return nullptr;
    auto it = dp_.find(rank);
    if (it != dp_.end()) return &it->second;
    const int P = P_, T = T_, s = rank % P, replica = rank / P, t = replica % T, d = replica / T;
    Dp& x = dp_[rank];
    std::vector<int> ranks;
    for (int k = 0; k < listed_dp_; ++k) ranks.push_back(((k * T + t) * P) + s);
    x.group = w.add_group(ranks, listed_dp_ < D_);
    const plan::RankPlan& r = plan_.stages[s];
    std::vector<int64_t> numels;
    std::vector<char> decays;  // per parameter: kept in the compute dtype under offload
    std::vector<int> layer_of;
    std::vector<char> has;
    for (size_t i = 0; i < r.layers.size(); ++i) {
      const plan::LayerPlan& lp = r.layer_plans[i];
      x.pos[r.layers[i]] = static_cast<int>(i);
      x.name.push_back(lp.name);
      int64_t n = 0, c = 0;
      decays.insert(decays.end(), lp.parameter_decays.begin(), lp.parameter_decays.end());
      decays.resize(numels.size() + lp.parameter_numels.size(), 0);
      x.params_of_pos.emplace_back();
      for (int64_t v : lp.parameter_numels) {
        x.params_of_pos.back().push_back(static_cast<int>(numels.size()));
        numels.push_back(v);
        layer_of.push_back(static_cast<int>(i));
        n += v;
        c += schedule::zero_chunk_size(v, d, D_);
      }
      x.layer_numel.push_back(n);
      x.layer_chunk.push_back(c);
      x.layer_params.push_back(static_cast<int64_t>(lp.parameter_numels.size()));
      x.params_total += static_cast<int64_t>(lp.parameter_numels.size());
      x.numel_total += n;
      x.chunk_total += c;
      has.push_back(n > 0);
    }
    const std::vector<std::vector<int>> buckets =
        schedule::gradient_buckets(numels, layer_of, layout_.zero_stage, layout_.ddp_bucket_cap_mb,
                                   layout_.zero_bucket_size_in_m);
    x.params_of_bucket = buckets;
    x.launch_at.resize(r.layers.size());
    x.buckets_of_pos.resize(r.layers.size());
    std::vector<int> firsts, completes;
    for (size_t b = 0; b < buckets.size(); ++b) {
      int64_t n = 0, c = 0;
      int first = static_cast<int>(r.layers.size());
      for (int i : buckets[b]) {
        n += numels[i];
        c += schedule::zero_chunk_size(numels[i], d, D_);
        first = std::min(first, layer_of[i]);
        auto& at = x.buckets_of_pos[layer_of[i]];
        if (at.empty() || at.back() != static_cast<int>(b)) at.push_back(static_cast<int>(b));
      }
      firsts.push_back(first);
      x.bucket_numel.push_back(n);
      x.bucket_chunk.push_back(c);
      x.bucket_params.push_back(static_cast<int64_t>(buckets[b].size()));
      x.launch_at[first].push_back(static_cast<int>(b));  // the backward reaches it last
      int last = -1;  // its last parameter (model order) in that layer: what completes it
      for (int i : buckets[b])
        if (layer_of[i] == first) last = std::max(last, i);
      completes.push_back(last);
    }
    // A layer completing several buckets launches them in the order its parameters complete
    // them (DataParallelPlugin's grads_ready walks the layer's parameters in model order): with
    // one bucket in flight that order decides which stays.
    for (auto& at : x.launch_at)
      std::stable_sort(at.begin(), at.end(),
                       [&](int a, int b) { return completes[a] < completes[b]; });
    // The wire bytes are the plan's collectives' ("bucket b": its reduction in the backward,
    // ZeRO-1/2's all-gather of the stepped shards, phase OptimizerStep: issued by the step and
    // completed in the next forward).
    x.bucket_wire.assign(buckets.size(), 0);
    x.gather_bytes.assign(buckets.size(), 0);
    for (const plan::Collective& c : r.collectives) {
      if (c.group != plan::Group::Dp || c.op.rfind("bucket ", 0) != 0) continue;
      const size_t b = std::stoul(c.op.substr(7));
      CAI_CHECK(b < buckets.size(), "[sim] the plan's {} of {} buckets", c.op, buckets.size());
      (c.phase == plan::Phase::OptimizerStep ? x.gather_bytes : x.bucket_wire)[b] = c.bytes;
    }
    if (!schedule::gradients_in_buckets(layout_.zero_stage,
                                        layout_.bucket_dtype == cai::DType::F32) &&
        layout_.zero_stage <= 1)
      x.cast_bytes = 4 + static_cast<int64_t>(cai::dtype_size(layout_.bucket_dtype));
    x.exchange = layout_.ddp_exchange && layout_.zero_stage == 0 && layout_.gpu &&
                 schedule::gradients_in_buckets(0, layout_.bucket_dtype == cai::DType::F32);
    x.window = schedule::GatherWindow(has, layout_.zero3_prefetch);
    x.inflight = schedule::InflightWindow::for_reductions(layout_.zero_max_inflight_buckets, D_);
    x.params = schedule::ParamGatherQueue(schedule::param_gather_order(firsts),
                                          std::max(1, layout_.zero_max_inflight_buckets));
    x.reduce_op.assign(buckets.size(), -1);
    if (layout_.cpu_offload && layout_.gpu && layout_.zero_stage >= 1 &&
        layout_.body == plan::Body::ViT) {
      x.offload = true;
      x.lane.off = schedule::offload_layout(
          numels, decays, buckets, layout_.zero_stage, d, D_,
          static_cast<int64_t>(cai::dtype_size(layout_.precision)), plan::optimizer_slots(layout_),
          layout_.precision == cai::DType::BF16);
      x.step_beside_forward = layout_.precision == cai::DType::BF16 && layout_.offload_step_overlap;
      x.param_copy.assign(numels.size(), -1);
    }
    return &x;
  }
  // A device copy of the plugin (packing, unpacking, shard updates): memory-bound elementwise
  // work on the compute stream, `calls` copies or adds (one per parameter, and per rank where
  // the plugin loops over the ranks' chunks), timed by the roofline with at least the
  // calibration's "copy|call" per call.
  void param_actions(Dp& dp, const std::vector<schedule::ParamGatherQueue::Action>& acts, int base,
                     std::vector<Op>& ops) {
    for (const auto& a : acts) {
      if (a.issue) await_host_step(dp, dp.params_of_bucket[a.bucket], base, ops);
      param_gather_ops({a}, dp.group, {dp.bucket_numel, dp.bucket_chunk, dp.gather_bytes},
                       dp.param_gather_op, base, ops);
    }
  }
  // The last step's host step beside this forward (Dp::step_beside_forward): its ops at the
  // program's first forward layer, once.
  static void begin_host_step(Dp& dp, int base, std::vector<Op>& ops) {
    if (!dp.offload || !dp.step_beside_forward || dp.uploaded) return;
    dp.uploaded = true;
    const std::vector<int> copies = dp.lane.upload(base, ops, false);
    for (size_t k = 0; k < copies.size(); ++k) {
      const int p = dp.lane.off.upload[k].param;
      (p < 0 ? dp.fp32_copy : dp.param_copy.at(static_cast<size_t>(p))) = copies[k];
    }
  }
  // Before a gather reads the device copies of `params` (stage order): the compute stream waits
  // for their copies not waited for yet (the executor's host blocks in Impl::await_host, so
  // nothing it issues after runs before them).
  static void await_host_step(Dp& dp, const std::vector<int>& params, int base,
                              std::vector<Op>& ops) {
    if (!dp.uploaded) return;
    Op w = Op::compute("wait for the host step", 0.0, -1, "offload");
    auto need = [&](int& copy) {
      if (copy >= 0) w.deps.push_back(dep_on(copy, base));
      copy = -1;  // waited for: later gathers need not wait again
    };
    need(dp.fp32_copy);
    for (int p : params) need(dp.param_copy.at(static_cast<size_t>(p)));
    if (!w.deps.empty()) ops.push_back(std::move(w));
  }
  // ZeRO-2/3: the host waits for bucket k's reduce-scatter and adds its chunk into the shard's
  // gradients (the list starts at program index `base`); offload: pushes it into the lane.
  static void dp_finish(Dp& x, int k, int base, std::vector<Op>& ops) {
    if (!x.offload) {
      Op o = dp_copy(fmt::format("bucket {} shard add", k), 12 * x.bucket_chunk[k], 1);
      o.deps.push_back(dep_on(x.reduce_op[k], base));
      o.mem_end.push_back({MemKind::Buffers, -4 * (x.bucket_numel[k] + x.bucket_chunk[k])});
      ops.push_back(std::move(o));
      return;
    }
    x.lane.push(k, x.reduce_op[k], 4 * x.bucket_numel[k], 4 * x.bucket_chunk[k], base, ops);
  }
  plan::Layout layout_;
  plan::StepPlan plan_;
  int P_ = 1, T_ = 1, D_ = 1, listed_dp_ = 1, listed_tp_ = 1;
  schedule::Schedule sched_;
  schedule::Partition part_;
  std::map<int, const plan::LayerPlan*> layer_plan_;
  std::map<int, Groups> groups_;
  std::map<int, Dp> dp_;
};

}  // namespace

namespace {

ConfigWorkload build_workload(ConfigProgram& prog, const std::string& name, int nproc,
                              const Cluster& cluster, bool fold) {
  const plan::StepPlan& sp = prog.plan();
  const plan::Layout& layout = prog.layout();
  const int P = prog.P(), T = prog.T(), D = prog.D();
  // Identical data-parallel replicas (T · P consecutive ranks each, exchanging only through the
  // dp rings) fold into copies of Dk replicas (replay.h: replicas_per_copy); with one replica,
  // identical 2d/2.5d tensor slices fold into copies of Tk tensor ranks.
  const int Dk = fold && prog.foldable() ? replicas_per_copy(cluster, T * P, D) : D;
  const int Tk = fold && Dk == D ? prog.tensor_ranks_per_copy(cluster) : T;
  prog.set_listed_dp(Dk);
  prog.set_listed_tp(Tk);
  ExpandOptions eo;
  eo.dp = Dk * Tk;  // replicas of each stage's program: dp × tp (of one copy)
  eo.global_batch = layout.batch * D * (P == 1 ? layout.gradient_accumulation : 1);
  eo.dtype = sim_dtype(layout.precision);
  if (layout.ddp_exchange && layout.zero_stage == 0 && layout.gpu && D > 1)
    eo.optimizer_bytes_per_element += 8.0 * (D - 1);
  // ZeRO-Offload: the host steps this rank's shard (dp rank 0's chunks: S of schedule/offload.h).
  eo.optimizer_on_host =
      layout.cpu_offload && layout.gpu && layout.zero_stage >= 1 && layout.body == plan::Body::ViT;
  // Under bf16 the whole host step runs inside the lane's upload instead (OffloadLaneOps::upload:
  // the fp32 part, then each weight stepped into its staging buffer and sent while the next
  // steps), so the step op here has nothing left to step.
  const bool step_casts = eo.optimizer_on_host && layout.precision == cai::DType::BF16;
  if (layout.body == plan::Body::ViT)  // Blocks and Linears have no optimizer step
    for (int s = 0; s < P; ++s) {
      double all = 0;
      for (const plan::LayerPlan& lp : sp.stages[s].layer_plans)
        for (int64_t v : lp.parameter_numels)
          all += static_cast<double>(schedule::zero_chunk_size(v, 0, D));
      const double shard = step_casts ? 0.0 : all;
      // Stage 2/3: the sums of squares come with the last micro-batch's host adds (the block
      // is in cache as it is added: no further read); stage 1's clip reads the copied shard.
      if (eo.optimizer_on_host) eo.host_clip_elements.push_back(layout.zero_stage == 1 ? all : 0.0);
      eo.optimizer_elements.push_back(eo.optimizer_on_host
                                          ? shard
                                          : static_cast<double>(sp.stages[s].parameter_elements) /
                                                (layout.zero_stage >= 1 ? D : 1));
    }
  for (int s = 0; s < P; ++s) {
    const plan::Memory& m = sp.stages[s].memory;
    std::array<int64_t, kMemKinds> mem{};
    mem[static_cast<int>(MemKind::Parameters)] = m.parameters + m.shards;
    mem[static_cast<int>(MemKind::Gradients)] = m.gradients;
    mem[static_cast<int>(MemKind::Optimizer)] = m.optimizer_state;
    mem[static_cast<int>(MemKind::Buffers)] = m.buffers + m.data;  // with the input batches
    eo.static_mem.push_back(mem);
  }
  eo.compute = [&prog](const schedule::Instr& in, int rank, int vstage, int base, Workload& w) {
    return prog.ops(in.op == schedule::Op::Forward, in.mb, rank, vstage, w, base, part_of(in.op));
  };
  eo.after = [&prog](const schedule::Instr& in, int rank, int base, Workload& w) {
    return prog.after(in, rank, base, w);
  };
  ConfigWorkload out;
  out.workload = expand_schedule(prog.schedule(), eo);
  out.workload.copies = (D / Dk) * (T / Tk);
  out.workload.micro_batch = P > 1 ? layout.batch / std::max(1, sp.micro_batches) : layout.batch;
  if (P > 1 && layout.gpu) {
    out.workload.p2p_max_ctas = layout.p2p_max_ctas;
    out.workload.gemm_sm_margin = layout.gemm_sm_margin;
  }
  out.workload.name = fmt::format("{} on {} processes ({})", name, nproc,
                                  sp.layout.pp > 1 ? sp.layout.pp_style : "data parallel");
  // Label and place the ranks as the launcher does: mesh rank = GPU (tensor-parallel ranks
  // consecutive, then stages, data parallel outermost).
  out.workload.gpus.resize(out.workload.ranks.size());
  for (int r = 0; r < static_cast<int>(out.workload.ranks.size()); ++r) {
    const int s = r % P, replica = r / P, t = replica % T, d = replica / T;
    out.workload.ranks[r].label =
        fmt::format("rank {} (pp {}, dp {}, tp {})", prog.mesh_rank(r), s, d, t);
    out.workload.gpus[r] = prog.mesh_rank(r);
  }
  out.plan = prog.plan();
  out.schedule = prog.schedule();
  return out;
}

}  // namespace

ConfigWorkload workload_from_config(const config::TrainConfig& cfg, int nproc,
                                    const Cluster& cluster, bool fold, const plan::StepPlan* plan) {
  ConfigProgram prog(cfg, nproc, cluster, plan);
  return build_workload(prog, cfg.model_name.empty() ? "vit" : cfg.model_name, nproc, cluster,
                        fold);
}

ConfigWorkload workload_from_plan(const nn::ViTConfig& model, const plan::Layout& layout,
                                  const Cluster& cluster, bool fold) {
  ConfigProgram prog(model, layout, layout.world, cluster, nullptr);
  const std::string name =
      layout.body == plan::Body::ViT
          ? std::string("vit")
          : fmt::format("{} × {}", model.depth,
                        layout.body == plan::Body::Blocks ? "block" : "Linear");
  return build_workload(prog, name, layout.world, cluster, fold);
}

double step_lower_bound(const config::TrainConfig& cfg, int nproc, const Cluster& cluster,
                        const Calibration& cal, const plan::StepPlan* plan) {
  ConfigProgram prog(cfg, nproc, cluster, plan);
  const int P = prog.P(), m = prog.plan().micro_batches;
  const schedule::Schedule& sched = prog.schedule();
  const int V = sched.virtual_stages();
  // One rank per stage (tp 0, dp 0): its compute and stream-0 collectives of one micro-batch per
  // virtual stage, timed as the replay times them, and its data-parallel reductions.
  Workload w;
  w.dtype = sim_dtype(prog.layout().precision);
  w.ranks.resize(1);
  std::vector<double> fwd(V, 0.0), bwd(V, 0.0), bwd_input(V, 0.0), dp(P, 0.0);
  // Split backwards (zbh1, zbv): the drain waits only for the earlier stages' BackwardInputs.
  bool split = false;
  for (const schedule::Instr& in : sched.programs[0]) split |= in.op == schedule::Op::BackwardInput;
  auto time_of = [&](std::vector<Op> ops, bool stream0) {
    w.ranks[0].ops = std::move(ops);
    const auto dur = compute_durations(w, cluster, cal);
    double t = 0;
    for (size_t i = 0; i < w.ranks[0].ops.size(); ++i) {
      const Op& o = w.ranks[0].ops[i];
      if ((o.stream == 0) != stream0) continue;
      // ZeRO-Offload's copies and host adds overlap the reductions: left out of the bound.
      if (o.kind == OpKind::HostCopy || o.kind == OpKind::Host) continue;
      if (o.kind == OpKind::Compute) {
        t += dur[0][i];
        continue;
      }
      std::vector<int> ring;
      for (int r : w.groups[o.group]) ring.push_back(prog.mesh_rank(r));
      // A calibrated collective takes its measured time in the replay (replay.h).
      const double measured =
          calibrated_collective_seconds(cal, o.kind, static_cast<int>(ring.size()), o.bytes);
      t += measured >= 0 ? measured
                         : collective_lower_bound(cluster, nproc, o.kind, o.bytes, ring, 0);
    }
    return t;
  };
  for (int s = 0; s < P; ++s) {
    for (int c = 0; c < sched.chunks; ++c) {
      const int v = sched.virtual_stage(s, c);
      fwd[v] = time_of(prog.ops(true, 0, s, v, w), true);
      bwd[v] = time_of(prog.ops(false, 0, s, v, w), true);
      bwd_input[v] = split ? time_of(prog.ops(false, 0, s, v, w, 0, Part::Input), true) : bwd[v];
    }
    dp[s] = time_of(prog.ops(false, m - 1, s, sched.virtual_stage(s, 0), w), false);
  }
  // Stage s starts its first forward after the first micro-batch's forward went through the
  // stages before it, runs every micro-batch's forward and backward on its stream 0, and the
  // stages before it run their last backward (input part, when split) after its own; its
  // data-parallel reductions (on their stream, in order) start after its last backward started and
  // end before the step.
  double bound = 0;
  double fill = 0, drain = 0;
  for (int s = 0; s < P; ++s) {
    double per_mb = 0, per_mb_input = 0;
    for (int c = 0; c < sched.chunks; ++c) {
      const int v = sched.virtual_stage(s, c);
      per_mb += fwd[v] + bwd[v];
      per_mb_input += fwd[v] + bwd_input[v];
    }
    const double last_bwd = bwd[sched.virtual_stage(s, 0)];
    // Split: the stage's last BackwardInput may come before some of its W's, so the drain
    // follows its forwards and input parts only; its whole work is a bound of its own.
    bound = std::max(bound, fill + m * per_mb);
    bound = std::max(bound, fill + m * per_mb_input + drain);
    bound = std::max(bound, fill + m * per_mb - last_bwd + dp[s]);
    fill += fwd[sched.virtual_stage(s, 0)];
    drain += bwd_input[sched.virtual_stage(s, 0)];
  }
  return bound;
}

}  // namespace cai::sim
