#include "from_config.h"

#include <algorithm>
#include <map>

#include "cai/core/error.h"
#include "cai/nn/tensor_parallel.h"
#include "expand.h"
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

ConfigWorkload workload_from_config(const app::TrainConfig& cfg, int nproc, const Cluster& cluster,
                                    bool fold) {
  app::validate(cfg, nproc);
  const nn::ViTConfig vc = cfg.vit();
  plan::Layout layout = app::plan_layout(cfg, nproc);
  ConfigWorkload out;
  out.plan = plan::make_plan(vc, layout);
  const plan::StepPlan& sp = out.plan;
  const int P = layout.pp, T = layout.tp, D = sp.dp;
  CAI_CHECK(nproc <= cluster.max_ranks(),
            "[sim] {} processes do not fit cluster {} ({} GPUs × {} ranks each)", nproc,
            cluster.name, cluster.gpus(), cluster.max_ranks_per_gpu);
  // The program: the plan's pipeline schedule, or one stage running its micro-batches 1F1B
  // (forward then backward per batch, as the data-parallel executor does).
  schedule::Schedule sched = sp.schedule;
  schedule::Partition part = sp.partition;
  const int L = static_cast<int>(vc.depth) + 2;
  if (P == 1) {
    schedule::ScheduleOptions so;
    so.stages = 1;
    so.micro_batches = sp.micro_batches;
    part = schedule::partition_uniform(L, 1);
    sched = schedule::make("1f1b", so, part);
  }
  // Layer index -> its plan (from the stage that holds it).
  std::map<int, const plan::LayerPlan*> layer_plan;
  for (const plan::RankPlan& r : sp.stages)
    for (size_t i = 0; i < r.layers.size(); ++i) layer_plan[r.layers[i]] = &r.layer_plans[i];

  // Identical data-parallel replicas (T · P consecutive ranks each, exchanging only through the
  // dp rings) fold into copies of Dk replicas (replay.h: replicas_per_copy).
  bool foldable = fold;
  for (const plan::RankPlan& r : sp.stages)
    for (const plan::Collective& c : r.collectives)
      if (c.group == plan::Group::Dp && c.kind == plan::CollectiveKind::Broadcast) foldable = false;
  const int Dk = foldable ? replicas_per_copy(cluster, T * P, D) : D;
  const int copies = D / Dk;
  ExpandOptions eo;
  eo.dp = Dk * T;  // replicas of each stage's program: dp × tp (of one copy)
  eo.global_batch = layout.batch * D * (P == 1 ? layout.gradient_accumulation : 1);
  eo.dtype = sim_dtype(layout.precision);
  for (int s = 0; s < P; ++s) {
    const plan::Memory& m = sp.stages[s].memory;
    std::array<int64_t, kMemKinds> mem{};
    mem[static_cast<int>(MemKind::Parameters)] = m.parameters + m.shards;
    mem[static_cast<int>(MemKind::Gradients)] = m.gradients;
    mem[static_cast<int>(MemKind::Optimizer)] = m.optimizer_state;
    mem[static_cast<int>(MemKind::Buffers)] = m.buffers;
    eo.static_mem.push_back(mem);
  }
  const int last_mb = sp.micro_batches - 1;
  eo.compute = [&, P, T, D, Dk, copies, layout](const schedule::Instr& in, int rank, int vstage,
                                                Workload& w) -> std::vector<Op> {
    const int s = rank % P, replica = rank / P, t = replica % T, d = replica / T;
    std::vector<int> tp_ranks, dp_ranks;
    for (int k = 0; k < T; ++k) tp_ranks.push_back(((d * T + k) * P) + s);
    for (int k = 0; k < Dk; ++k) dp_ranks.push_back(((k * T + t) * P) + s);
    const int tp_group = T > 1 ? w.add_group(tp_ranks) : -1;
    // 2d/2.5d/3d sub-groups (row, col, input, ...) of this rank's tensor group.
    std::map<std::string, int> sub_groups;
    auto group_of = [&](const std::string& name) {
      if (name == "tp") return tp_group;
      auto it = sub_groups.find(name);
      if (it != sub_groups.end()) return it->second;
      std::vector<int> ranks;
      for (int k : nn::tp_group_members(layout.tp_mode, T, layout.tp_depth, name, t))
        ranks.push_back(((d * T + k) * P) + s);
      return sub_groups[name] = w.add_group(ranks);
    };
    const bool fwd = in.op == schedule::Op::Forward;
    std::vector<int> layers;
    for (int i = 0; i < part.num_layers(vstage); ++i)
      layers.push_back(part.first_layer(vstage) + i);
    if (!fwd) std::reverse(layers.begin(), layers.end());
    std::vector<Op> ops;
    // The data-parallel reductions go out during the last backward of the step (chunk 0 is the
    // last a rank runs), spread over its layers as the hooks launch buckets.
    std::vector<const plan::Collective*> dp_colls;
    if (!fwd && in.mb == last_mb && in.chunk == 0 && D > 1)
      for (const plan::Collective& c : sp.stages[s].collectives)
        if (c.group == plan::Group::Dp)
          for (int k = 0; k < c.count; ++k) dp_colls.push_back(&c);
    const int dp_group = dp_colls.empty() ? -1 : w.add_group(dp_ranks, copies > 1);
    size_t next_dp = 0;
    for (size_t li = 0; li < layers.size(); ++li) {
      const plan::LayerPlan& lp = *layer_plan.at(layers[li]);
      for (const plan::OpCost& c : lp.ops) {
        const bool mine =
            fwd ? c.phase == plan::Phase::Forward
                : c.phase == plan::Phase::Backward || c.phase == plan::Phase::Recompute;
        if (!mine) continue;
        Op op;
        op.kind = OpKind::Compute;
        op.name = fmt::format("{} {}{}", lp.name, c.op, fwd ? "" : " bwd");
        op.category = "compute";
        op.mb = in.mb;
        op.flops = c.flops;
        op.mem_bytes = static_cast<double>(c.bytes_read + c.bytes_written);
        op.op_kind = op_kind_of(c.op);
        ops.push_back(std::move(op));
      }
      if (!ops.empty() && lp.saved > 0) {
        // The layer's cache: kept from its forward to its backward.
        ops.back().mem_end.push_back({MemKind::Activations, fwd ? lp.saved : -lp.saved});
      }
      if (tp_group >= 0)
        for (const plan::Collective& c : lp.collectives) {
          const bool mine =
              fwd ? c.phase == plan::Phase::Forward
                  : c.phase == plan::Phase::Backward || c.phase == plan::Phase::Recompute;
          if (!mine || c.group != plan::Group::Tp) continue;
          for (int k = 0; k < c.count; ++k)
            ops.push_back(Op::collective(
                kind_of(c.kind),
                fmt::format("{} {} {}", lp.name, c.op, plan::collective_name(c.kind)),
                group_of(c.subgroup), c.bytes, 0));
        }
      // This layer's share of the gradient reductions, on stream 3 after its backward.
      const size_t until = (li + 1) * dp_colls.size() / layers.size();
      for (; next_dp < until; ++next_dp) {
        const plan::Collective& c = *dp_colls[next_dp];
        Op op = Op::collective(
            kind_of(c.kind),
            fmt::format("{} {}", c.op.empty() ? c.layer : c.op, plan::collective_name(c.kind)),
            dp_group, c.bytes, 3);
        op.category = "reduce";
        if (!ops.empty()) op.deps.push_back(static_cast<int>(ops.size()) - 1);
        ops.push_back(std::move(op));
      }
    }
    return ops;
  };
  out.workload = expand_schedule(sched, eo);
  out.workload.copies = copies;
  out.workload.name =
      fmt::format("{} on {} processes ({})", cfg.model_name.empty() ? "vit" : cfg.model_name, nproc,
                  sp.layout.pp > 1 ? sp.layout.pp_style : "data parallel");
  // Label the ranks as the executor's traces do (mesh coordinates).
  for (int r = 0; r < static_cast<int>(out.workload.ranks.size()); ++r) {
    const int s = r % P, replica = r / P, t = replica % T, d = replica / T;
    out.workload.ranks[r].label =
        fmt::format("rank {} (pp {}, dp {}, tp {})", d * P * T + s * T + t, s, d, t);
  }
  return out;
}

}  // namespace cai::sim
