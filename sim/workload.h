// What the simulator replays: per rank an ordered list of operations on streams, with explicit
// dependencies and memory events. The workload is the simulator's only input besides the cluster:
// schedule expansions (expand.h) and, later, the analytic plan fill it; the replay (replay.h) never
// looks at a model or a schedule itself.
//
// Semantics:
//  - A rank has streams 0 (compute), 1, 2, ... (communication). Ops of one stream run in their
//    order in `ops`; an op starts when the previous op of its stream and every op in `deps`
//    (indices of earlier ops of the same rank, on any stream) have completed.
//  - Compute: `seconds` when >= 0, else a roofline on the rank's GPU:
//    max(flops / (peak[dtype] · eff.flops), mem_bytes / (memory_bandwidth · eff.bytes)) with the
//    efficiency of `op_kind` from the calibration.
//  - Collectives (AllReduce, ReduceScatter, AllGather, Broadcast): `group` indexes
//    Workload::groups (global ranks in ring order, stored once: a 16,384-rank data-parallel group
//    is not copied into every op); the k-th collective a rank issues on a group matches the k-th
//    of every other member (NCCL's communicator order); kind and bytes must agree. `bytes` is the
//    full buffer: all-reduce's buffer, reduce-scatter's input, all-gather's output, broadcast's
//    buffer. A collective starts when every member has reached it. BroadcastRound: n broadcasts
//    of `bytes` one after the other over the group's n members, the t-th rooted at member t
//    (SUMMA's q steps along a row or a column); every member plays the same part in it, so
//    unlike a single broadcast it keeps identical copies alike.
//  - Send/Recv: point to point with `peer` (global rank) and `tag`; each Send pairs with exactly
//    one Recv of the same (source, destination, tag). The transfer runs as soon as its send
//    starts (the receive's buffer is there); a Recv op completes when the data is there (its span
//    is the wait). Where the receive is posted (Op::posted_after) only decides from when its
//    kernel holds a share of the GPU.
//  - HostCopy: `bytes` between the GPU and pinned host memory (ZeRO-Offload; `to_device` says
//    which way), at the calibration's measured bandwidth of that direction, else the cluster's
//    host link (latency + bytes / bandwidth). It takes no share of the GPU's compute (the copy
//    engines move it): on a stream other than 0 it overlaps the compute.
//  - Host: work of the rank's host threads (ZeRO-Offload's gradient adds, host optimizer step,
//    upload casts, the clip's sum of squares), `op_kind` "host_add" / "host_cast" / "host_sum"
//    (`bytes` of fp32 read) or "host_adam"
//    (`flops` = elements), timed by the calibration's host rates or documented placeholders
//    (replay.h: kHost*); it holds no GPU.
//  - Copies (Workload::copies > 1): the listed ranks stand for every copy of a job of identical
//    replicas; collectives over a group spanning the copies count every copy's members.
//  - Memory: `mem_start` deltas apply when the op starts, `mem_end` when it ends (+ allocates,
//    - frees); `initial_mem` is what the rank holds before its first op.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "cluster.h"

namespace cai::sim {

enum class MemKind { Parameters, Gradients, Optimizer, Activations, Buffers };
constexpr int kMemKinds = 5;
const char* mem_kind_name(MemKind k);  // "parameters", "gradients", ...

struct MemDelta {
  MemKind kind = MemKind::Activations;
  int64_t bytes = 0;  // > 0 allocates, < 0 frees
};

enum class OpKind {
  Compute,
  AllReduce,
  ReduceScatter,
  AllGather,
  Broadcast,
  BroadcastRound,
  Send,
  Recv,
  HostCopy,
  Host,
};
const char* op_kind_name(OpKind k);  // "compute", "all_reduce", ...
// The op a kind's time is measured and modelled as: the calibration's collective samples and the
// link model's fits ("all_reduce", "reduce_scatter", "all_gather", "broadcast" for Broadcast and
// BroadcastRound, "p2p" for a Send); "" for kinds that move nothing over a link. One table with
// op_kind_name (workload.cpp).
const char* measured_op_name(OpKind k);
bool is_collective(OpKind k);
// Bytes a collective of `bytes` hands over on a group of n members, as
// nn::TensorParallel::comm_bytes counts a call: `bytes`, n × bytes for a BroadcastRound.
int64_t issued_bytes(OpKind k, int64_t bytes, int n);

struct Op {
  OpKind kind = OpKind::Compute;
  std::string name;      // trace name: the executor's instruction names ("F(mb=0,c=0)", ...)
  std::string category;  // trace category: compute | comm | load | reduce | optimizer
  int mb = -1;           // micro-batch, -1 when none
  int stream = 0;        // 0 = compute stream
  std::vector<int> deps;
  // The schedule instruction that issued it: its index in the stage's program (expand_schedule
  // sets it; -1 for ops of other producers). Lets a viewer draw one span per instruction.
  int instr = -1;

  // Compute
  double seconds = -1;              // >= 0: given duration
  double flops = 0, mem_bytes = 0;  // roofline when seconds < 0
  std::string op_kind = "default";  // calibration entry
  std::string cal_key;              // calibration samples ("attn.qkv|fwd"); empty: none
  // Samples taken where the profile has none of cal_key (a 2D LayerNorm timed as the whole-row
  // one by older profiles: "norm1|fwd" where "nd.norm|fwd" is missing); empty: none.
  std::string cal_fallback;
  // The op's work is inside the timing of these samples when the profile has them: it then takes
  // no time (the split LayerNorm's extra passes, in "nd.norm|fwd"); empty: never.
  std::string covered_by;
  // Device calls the op stands for (the data-parallel plugin's copies, one per parameter and
  // rank): it takes at least calls × the calibration's "copy|call" seconds (0: no floor).
  int64_t calls = 0;
  // The share of the timed op this one is (a linear's backward split into its input-gradient
  // and weight-gradient GEMMs, half each): its duration is that share of the op's.
  double share = 1.0;
  // Communication
  int64_t bytes = 0;
  int group = -1;   // collectives: index into Workload::groups (must contain this rank)
  int root = -1;    // broadcast: global rank of the root (-1: the group's first rank)
  int peer = -1;    // send/recv: the other global rank
  int64_t tag = 0;  // send/recv matching tag
  // Moved by the GPUs' copy engines (the copy-engine gradient exchange): no kernel, so it holds
  // no share of the GPU's compute while in flight (Calibration::overlap_share).
  bool copy_engine = false;
  // HostCopy: host -> device (true) or device -> host.
  bool to_device = false;
  // Recv: when its receive is posted (NCCL's receive kernel holding a share of the GPU from then
  // until its data is in, Calibration::posted_share): after op `posted_after` of this rank ends,
  // -1 at the rank's start; -2 (unset): the first receive of its kind at the start and each next
  // one when the previous one of its kind completes.
  int posted_after = -2;

  std::vector<MemDelta> mem_start, mem_end;

  // Builders for the common cases.
  static Op compute(std::string name, double seconds, int mb = -1,
                    std::string category = "compute");
  static Op collective(OpKind kind, std::string name, int group, int64_t bytes, int stream = 1);
  static Op send(std::string name, int peer, int64_t tag, int64_t bytes, int stream = 1);
  static Op recv(std::string name, int peer, int64_t tag, int64_t bytes, int stream = 0);
};

struct RankProgram {
  std::string label;  // trace track name ("rank 3 (pp 1, dp 0)"); empty: "rank <r>"
  int stage = 0;      // pipeline stage, for the per-stage bubble
  std::array<int64_t, kMemKinds> initial_mem{};
  std::vector<Op> ops;
};

struct Workload {
  std::string name;
  DType dtype = DType::BF16;  // compute dtype: hosts run at the GPU's peak of it
  int64_t global_batch = 0;   // samples per step, for img_per_s (0: not reported)
  // Samples one forward or backward op works on (a pipeline's micro-batch), which picks the
  // posted receive's share of the GPU (Calibration::posted_share_at); 0: not known.
  int64_t micro_batch = 0;
  // The config's parallel.p2p_max_ctas and the GEMMs' SM margin under it (config::
  // gemm_sm_margin_for), which the profile's posted share was measured with or not; -1: not known.
  int p2p_max_ctas = -1, gemm_sm_margin = -1;
  std::vector<RankProgram> ranks;
  std::vector<std::vector<int>> groups;  // communicator groups, global ranks in ring order
  // Identical copies (folded data-parallel replicas): the job is `copies` copies of `ranks` side
  // by side (copy c's rank r is job rank c · ranks.size() + r, on GPU c · ranks.size() + r), each
  // running the same program. A group whose `across_copies` flag is set is one ring through every
  // copy: the listed members, then the same members of copy 1, and so on (n = members × copies),
  // so its last listed member sends to the first member of the next copy. The replay simulates
  // the listed ranks only; see replay.h for when that is exact.
  int copies = 1;
  std::vector<char> across_copies;  // per group (missing entries: 0)
  // Placement: per listed rank, the GPU slot it runs on (a permutation of 0..ranks-1; slot g is
  // GPU g of the cluster, or g mod GPUs when ranks share GPUs). Empty: rank r on slot r. Lets a
  // producer number ranks its own way while they sit where the launcher puts them (vit_train's
  // mesh rank = GPU).
  std::vector<int> gpus;
  int gpu_of(int rank) const { return gpus.empty() ? rank : gpus[rank]; }
  int stages() const;  // 1 + the largest RankProgram::stage
  int job_ranks() const { return static_cast<int>(ranks.size()) * copies; }
  bool spans_copies(int group) const {
    return group >= 0 && group < static_cast<int>(across_copies.size()) && across_copies[group];
  }
  // Ranks of group `g` in the whole job (members × copies when it spans the copies).
  int group_size(int g) const;
  // The index of `ranks_in_ring_order` (with that across-copies flag) in groups, appended when new.
  int add_group(const std::vector<int>& ranks_in_ring_order, bool spans_copies = false);
};

// Structural checks before a replay; throws "[sim] rank R op I (name): ..." naming what is wrong:
// stream < 0, deps not earlier ops, collective group without this rank or with duplicates or
// ranks out of range, members disagreeing on a collective's kind/bytes or count per group,
// sends without their receive (and the reverse), negative sizes or times.
void check(const Workload& w);

namespace detail {
// The collectives of a workload matched across ranks (check() builds it; the replay uses it).
struct Instance {
  OpKind kind = OpKind::AllReduce;
  int64_t bytes = 0;
  int group_id = 0;  // index into Workload::groups
  int root_pos = 0;  // broadcast: the root's position in the group
};
struct Matching {
  std::vector<Instance> instances;            // one per collective call (all members)
  std::vector<std::vector<int>> instance_of;  // [rank][op]: instance, -1 for other ops
  std::vector<std::vector<int>> position_of;  // [rank][op]: this rank's position in the group
};
Matching check_and_match(const Workload& w);
}  // namespace detail

}  // namespace cai::sim
