// Replays a Workload on a cluster with SimGrid and measures it.
//
// Each replay runs SimGrid in a forked child process: SimGrid allows one Engine per process and
// cannot be initialised twice, and the fork keeps every replay independent (tests, the GUI and
// layout searches call replay() many times). The child returns the start and end of every op; the
// metrics are computed here.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "cluster.h"
#include "workload.h"

namespace cai::sim {

// Bulk: one flow per ring edge carrying every step's bytes, plus (steps - 1) route latencies;
// Step: every ring (or broadcast chain) step a message over the links. Bulk scales (1,024 ranks in
// milliseconds); Step is the exact reference the tests hold Bulk against. Both time a collective
// that the calibration measured ({op, group size} with samples around its bytes) as a sleep of the
// measured time ("calibrated" is another name for bulk); Bulk runs one whose op the calibration
// measured on other group sizes (or other bytes) as Flows does, over the links fitted to it, not
// over the cluster file's nominal links.
// Flows: every collective and send whose op the calibration measured (any group size, any bytes)
// runs as SimGrid flows over intra-node links fitted to the samples (link_fit.h, flows.h), so
// concurrent collectives on shared links contend and unmeasured group sizes and node counts come
// from the link model; ops without samples as in Bulk.
enum class CollectiveModel { Bulk, Step, Flows };
// "bulk" | "calibrated" (Bulk) | "step" | "flows"
CollectiveModel parse_collective_model(const std::string& s);
const char* collective_model_name(CollectiveModel m);

struct ReplayOptions {
  CollectiveModel collectives = CollectiveModel::Bulk;
  Calibration calibration = default_calibration();
  // Consecutive compute ops of a rank that nothing else computes beside run as one sleep when
  // their dependencies are met (the same spans; SimGrid sees one activity instead of several).
  // false: one execution per op, the reference the tests hold the merged replay against.
  bool merge_compute = true;
};

struct Span {
  double start = 0, end = 0;  // simulated seconds from the step's start
};

struct MemPoint {
  double t = 0;
  int64_t bytes = 0;                       // all kinds together, after the events at t
  std::array<int64_t, kMemKinds> kinds{};  // the same split by MemKind
};

struct RankResult {
  std::vector<Span> spans;  // per op, same index as RankProgram::ops
  double end_s = 0;         // the rank's last op end
  double wall_s = 0;        // end of its last op before the optimizer (forward_backward's wall)
  double compute_s = 0;     // time with a compute op running (any category)
  double pipeline_compute_s = 0;  // time in ops of category "compute" (Forward/Backward)
  double comm_s = 0;              // communication time not overlapped by compute
  double comm_total_s = 0;        // time with any communication running (recv waits included)
  double idle_s = 0;              // step - compute - comm
  int64_t peak_mem = 0;
  std::array<int64_t, kMemKinds> mem_at_peak{};
  std::vector<MemPoint> memory;  // the curve, starting at t = 0 with initial_mem
};

// How the compute ops of a replay were timed: given durations, calibration samples matched
// exactly, interpolated between samples, or the roofline with the op kind's efficiency.
struct TimingSources {
  int64_t given = 0, measured = 0, interpolated = 0, roofline = 0;
  // How the communication was timed, each collective call (all its members together) and each
  // send once: the calibration's collective samples matched exactly, interpolated between them,
  // or the cluster's network model (no samples of that op and group size, or bytes outside the
  // sampled range).
  int64_t comm_measured = 0, comm_interpolated = 0, comm_network = 0;
  // CollectiveModel::Flows: those run as flows over the links fitted to the calibration (counted
  // instead of measured / interpolated).
  int64_t comm_flows = 0;
  // ZeRO-Offload's host copies and host work (rank 0): timed by the profile's "host" entry, or by
  // the cluster's host link and the placeholders below.
  int64_t host_measured = 0, host_placeholder = 0;
  // The compute time factor of each GPU of a node the ranks ran on (Calibration::gpu_time_factor),
  // by GPU; empty when the profile measured no GPU speeds.
  std::vector<double> gpu_time_factors;
  // GPU workloads with receives: the share of its GPU a posted receive holds
  // (Calibration::posted_share_at the workload's micro-batch, else the overlap share) and that
  // micro-batch (0: not known); posted_share < 0 when no receive takes one.
  double posted_share = -1;
  int64_t posted_micro_batch = 0;
};

// Placeholders for the host side of ZeRO-Offload when the profile has no "host" entry (or lacks
// a figure): optim::HybridAdam over ~16 cores, memory-bound at 28 bytes an element (p, g, m, v
// read, p, m, v written) near 30 GB/s; y += x at 10 GB/s of x. The summary's warnings name them.
constexpr double kHostAdamElementsPerS = 1e9;
constexpr double kHostAddBytesPerS = 10e9;

struct ReplayResult {
  std::string cluster;
  CollectiveModel collectives = CollectiveModel::Bulk;
  int copies = 1;        // Workload::copies: `ranks` holds one copy's ranks, the others run alike
  double step_s = 0;     // latest end over all ranks
  double img_per_s = 0;  // global_batch / step_s (0 when the workload has no global_batch)
  // Per pipeline stage: mean over its ranks of 1 - pipeline_compute / step. (PipelinePlugin's
  // measured_bubble divides by the rank's own forward_backward wall time; here every rank's step
  // ends with the slowest, as the next step's collectives make it in a real run.)
  std::vector<double> bubble;
  double bubble_mean = 0;  // 1 - sum(pipeline_compute) / (ranks · step): the validator's fraction
  // Per stage, PipelinePlugin::measured_bubble's definition: 1 - pipeline_compute / the rank's
  // own forward_backward wall time (RankResult::wall_s), averaged over the stage's ranks. For
  // laying a recorded run's bubbles beside the simulated ones.
  std::vector<double> bubble_measured;
  int64_t memory_limit = 0;  // the GPU's usable memory; peak_mem above it does not fit
  double wall_s = 0;         // host time of the whole replay (check, fork, platform, run, metrics)
  double simgrid_s = 0;      // host time inside the SimGrid process (platform + run)
  TimingSources timing;      // how the compute ops were timed (rank 0's program)
  std::vector<RankResult> ranks;
};

// Folding identical replicas (Workload::copies). A job of `replicas` data-parallel replicas, each
// `ranks_per_replica` consecutive ranks running the same program, whose only exchanges between
// replicas are rings over every replica in replica order (all-reduce, reduce-scatter,
// all-gather; no broadcast), runs alike in every copy of k consecutive replicas when a copy
// fills whole nodes: the platform (identical nodes on a full-bisection root with no backbone) is
// then symmetric under shifting the job by one copy, the max-min bandwidth sharing SimGrid
// solves has a unique solution that keeps that symmetry, so every copy's flows get the same rates
// and every rank's timeline equals its image's in the first copy. Replaying one copy, whose
// ring flows to the next copy cross the same links of the sender's node (Platform::next), gives
// the whole job's times. Returns k, the smallest divisor of `replicas` with k ·
// ranks_per_replica a multiple of gpus_per_node, or `replicas` (no folding) when there is none
// or ranks share GPUs (max_ranks_per_gpu).
int replicas_per_copy(const Cluster& c, int ranks_per_replica, int replicas);

// Compute durations in seconds per [rank][op] (0 for communication): `seconds`, the
// calibration's samples of the op's cal_key (never below the roofline at full peak), or the
// roofline with the op kind's efficiency; host copies and host work (ZeRO-Offload) at the
// profile's host rates, else the cluster's host link and the kHost* placeholders.
std::vector<std::vector<double>> compute_durations(const Workload& w, const Cluster& c,
                                                   const Calibration& cal,
                                                   TimingSources* sources = nullptr);

// Calibrated communication: seconds per collective instance of `m` (detail::check_and_match)
// and per send op [rank][op] (-1: the network model times it) from the calibration's
// collective samples (Calibration::collective_seconds; a BroadcastRound is n broadcasts, a send
// the "p2p" samples of group size 2). Counts each into `sources` (comm_*).
// Seconds of one collective of `kind` over n ranks of `bytes` from the calibration's samples
// (BroadcastRound: n broadcasts; Send: the "p2p" samples), or -1 when they do not cover it.
double calibrated_collective_seconds(const Calibration& cal, OpKind kind, int n, int64_t bytes,
                                     bool* interpolated = nullptr);
struct CommDurations {
  std::vector<double> instance;           // per collective instance
  std::vector<std::vector<double>> send;  // per [rank][op]: sends only, else -1
};
CommDurations comm_durations(const Workload& w, const detail::Matching& m, const Calibration& cal,
                             TimingSources* sources = nullptr);

// Throws "[sim] ..." for an invalid workload (check()), too many ranks for the cluster, a deadlock
// (naming every rank's first unfinished op) or a failed SimGrid process.
ReplayResult replay(const Workload& w, const Cluster& c, const ReplayOptions& opt = {});

}  // namespace cai::sim
