// A vit_train config on N processes as a simulator workload: the analytic plan (libcai's `plan`,
// the same model `vit_train --dry-run` prints) gives every layer's FLOPs and bytes per micro-batch
// and its tensor-parallel collectives, and each rank's gradient reductions and memory; the
// schedule expansion (expand.h) lays them along the program the executor runs (one stage's
// 1F1B for pp = 1, the plan's validated pipeline schedule otherwise).
//
// Ranks: sim rank = (dp · tp + tp_rank) · stages + stage. Per compute instruction the layers of
// its virtual stage run as compute ops (roofline time from the cluster and calibration), each
// followed by its tensor-parallel collectives over the rank's tp group on the compute stream (the
// executor's compute waits for them; the column-parallel overlap with the weight gradient is not
// modelled, an upper bound). Data parallelism as DataParallelPlugin runs it, over the dp group on
// stream 3 (one NCCL communicator: its operations run in issue order): each gradient bucket's
// reduction goes out after the backward of the layer that completes it (schedule::
// gradient_buckets; DDP / ZeRO-1 all-reduce in the last micro-batch, ZeRO-2/3 pack and
// reduce-scatter in every one, at most zero_max_inflight_buckets in flight, the host waiting for
// the oldest: schedule::InflightWindow); ZeRO-3 gathers each layer's parameters before its
// forward and its backward, prefetching as schedule::GatherWindow says, the layer waiting for
// its own; ReduceGrads waits for the reductions, then the shard updates; ZeRO-1/2's all-gathers
// of the stepped shards are deferred to the next forward (schedule::ParamGatherQueue: the
// replayed forward carries the last step's). The plugin's packing, unpacking
// and shard adds are memory-bound compute ops (roofline). Memory: the plan's persistent bytes
// from the start, each layer's working tensors and saved activations as the plan's replay
// counts them, and ZeRO's gradients, bucket buffers and gathers as the plugin holds them.
#pragma once
#include <string>
#include <vector>

#include "cai/config/config.h"
#include "cai/plan/plan.h"
#include "cluster.h"
#include "workload.h"

namespace cai::sim {

struct ConfigWorkload {
  plan::StepPlan plan;
  Workload workload;
  // The program the workload expands (the plan's schedule, or one stage's 1F1B for pp = 1):
  // every op's Op::instr indexes schedule.programs[its rank's stage].
  schedule::Schedule schedule;
};

// Throws (naming the value) for a config that does not run on `nproc` processes, as vit_train
// would, or a cluster with fewer ranks. `fold`: list one copy of the identical data-parallel
// replicas where the platform allows it (replay.h: replicas_per_copy; Workload::copies), so the
// replay simulates T · P ranks (or the few replicas that fill whole nodes) instead of nproc;
// with one data-parallel replica and no pipeline, a 2d layout lists whole rows of its q × q grid
// and a 2.5d layout of depth > 1 whole depth slices (the other rows / slices are identical
// copies: every sub-group's ring is checked to run through the copies in order, the SUMMA
// broadcasts are rounds rooted at every member in turn); 3d and 1d do not fold. false lists
// every rank (the step-by-step collective model needs that).
// `plan`: the config's plan when the caller made it already (make_plan of plan_layout).
ConfigWorkload workload_from_config(const config::TrainConfig& cfg, int nproc,
                                    const Cluster& cluster, bool fold = true,
                                    const plan::StepPlan* plan = nullptr);

// The same for a plan layout directly (colossalai benchmark's --model block and mlp: a
// plan::Layout with body Blocks or Linears and the sequence length as tokens): the layout's
// checks are the plan's. `fold` as above; 2d/2.5d layouts of one data-parallel replica also fold
// their identical tensor slices (rows of 2d, depth slices of 2.5d) into copies.
ConfigWorkload workload_from_plan(const nn::ViTConfig& model, const plan::Layout& layout,
                                  const Cluster& cluster, bool fold = true);

// A lower bound on the step time replay() gives workload_from_config's workload under the bulk
// collective model, without building or replaying it: per pipeline stage, the first micro-batch's
// forward through the stages before it, every micro-batch's forward and backward on the compute
// stream (compute timed as the replay times it, tensor-parallel collectives at their uncontended
// bulk time), the stages before it's last backwards after it (split backwards: after its
// forwards and input parts, its weight parts a bound of their own); or the compute before its last
// backward plus its data-parallel reductions back to back. Contention, bubbles from uneven stages
// and receive waits are left out, so the replay is never faster. For the layout search.
double step_lower_bound(const config::TrainConfig& cfg, int nproc, const Cluster& cluster,
                        const Calibration& cal, const plan::StepPlan* plan = nullptr);

// The calibration entry a plan op is timed with: gemm, attention, layernorm or elementwise.
std::string op_kind_of(const std::string& op);

}  // namespace cai::sim
