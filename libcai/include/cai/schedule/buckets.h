// Data-parallel layout as data: ZeRO's per-rank chunks of a parameter and the gradient buckets
// of DDP / ZeRO, shared by the executor (cai/parallel/data_parallel) and the step model
// (cai/plan), so the two cannot disagree on what a rank holds.
#pragma once
#include <cstdint>
#include <vector>

namespace cai::schedule {

// Rank r's chunk of an n-element parameter under ZeRO over d ranks: [n·r/d, n·(r+1)/d).
inline int64_t zero_chunk_begin(int64_t n, int r, int d) {
  return n * r / d;
}
inline int64_t zero_chunk_size(int64_t n, int r, int d) {
  return zero_chunk_begin(n, r + 1, d) - zero_chunk_begin(n, r, d);
}

// DDP / ZeRO-1 with fp32 buckets: each parameter's gradient is a view into its bucket (no copies
// in or out, PyTorch's gradient_as_bucket_view), starting at a multiple of 64 elements (256 bytes,
// the alignment of an allocation). The vectorised kernels need 16 bytes, but cuBLASLt's heuristic
// offers other algorithms for a 64-byte aligned output than for a 256-byte one (kernels::cuda
// plans by alignment): with 16-element padding the weight-gradient GEMMs writing into the
// buckets got slower kernels than one GPU's (2 H100, ViT-B/16 DDP: 0.5-2.1 ms more GEMM time a
// step per rank). Elements a parameter takes in its bucket, padding included.
inline int64_t bucket_view_numel(int64_t n) {
  return (n + 63) / 64 * 64;
}
// Whether the gradients are such views: stages 0/1 (whole gradients all-reduced) with fp32
// buckets; bf16 buckets are a cast copy, stages 2/3 pack rank-major chunks per launch.
inline bool gradients_in_buckets(int zero_stage, bool fp32_buckets) {
  return zero_stage <= 1 && fp32_buckets;
}
// ZeRO-1 without offload keeps the full gradients, all-reduced in place: each shard's gradient
// is a view of this rank's chunk of its parameter's (no memory of its own, no copy after the last
// reduction). With offload the chunk is copied into the device shard the host reads; stages 2/3
// reduce-scatter into shard gradients of their own.
inline bool shard_grads_are_views(int zero_stage, bool offload) {
  return zero_stage == 1 && !offload;
}

// The copy-engine all-reduce (dist::Communicator::enable_copy_engine_all_reduce) over d ranks:
// a tensor of numel elements is cut into d chunks of this many elements (the last ones shorter
// or empty), and each rank holds a staging region of 256 bytes of flags, one chunk slot per rank
// and its own chunk of the sum, sized for the largest tensor (DDP: the largest bucket).
inline int64_t copy_engine_chunk(int64_t numel, int d) {
  return ((numel + d - 1) / d + 63) / 64 * 64;
}
inline int64_t copy_engine_region_bytes(int64_t max_numel, int d) {
  return 256 + 4 * copy_engine_chunk(max_numel, d) * (d + 1);
}
// The copy-engine gradient exchange (dist::Communicator::enable_copy_engine_exchange) of a
// numel-element space over d ranks: each rank's region, 256 bytes of flags and a slot of numel
// floats for each other rank.
inline int64_t copy_engine_exchange_region_bytes(int64_t numel, int d) {
  return 256 + 4 * numel * (d - 1);
}

// DDP / ZeRO-1's bucket hold (DataParallelConfig::bucket_hold, parallel.ddp_bucket_hold): whether
// the buckets waiting at an overlap point are launched now. They are once the gradients final in
// this step's backward (the elements of the buckets launched so far and of those waiting,
// padding not counted) reach `hold` of the `total` elements of every bucket; hold 0: always,
// each bucket at the next overlap point. The executor and the simulator both ask this.
inline bool launch_held_buckets(int64_t ready, int64_t total, double hold) {
  return hold <= 0 || static_cast<double>(ready) >= hold * static_cast<double>(total);
}

// Gradient buckets in launch (backward) order, each a list of parameter indices (model order).
// numels: elements per parameter (model order); layer_of: the layer index of each parameter.
// Stage 3: one bucket per layer that has parameters, last layer first. Stages 0-2: parameters in
// reverse model order, a bucket closed once it holds at least the cap (stage 2:
// zero_bucket_size_in_m million elements; 0/1: ddp_bucket_cap_mb MiB of fp32).
std::vector<std::vector<int>> gradient_buckets(const std::vector<int64_t>& numels,
                                               const std::vector<int>& layer_of, int zero_stage,
                                               double ddp_bucket_cap_mb,
                                               double zero_bucket_size_in_m);

// ZeRO-3's parameter all-gathers ahead of their layer's use (DataParallelPlugin's fetch, the
// plan's memory replay and the simulator's step program all follow this one window). Layers are
// positions 0..L-1; those without parameters are never gathered. fetch(pos, backward) is called
// before layer `pos` runs: it returns the positions whose gathers start now, in issue order (pos
// unless already pending, then the next `prefetch` layers with parameters in the direction of
// travel: forward the following positions, backward the preceding ones, skipping pending ones
// and stopping once more than `prefetch` are pending), and takes pos off the pending list: the
// caller waits for pos's gather and uses its values while the prefetched ones run.
class GatherWindow {
 public:
  GatherWindow() = default;
  GatherWindow(std::vector<char> has_params, int prefetch);
  std::vector<int> fetch(int pos, bool backward);
  const std::vector<int>& pending() const { return pending_; }  // issue order
  void clear() { pending_.clear(); }  // the pending gathers were completed and dropped

 private:
  bool is_pending(int pos) const;
  std::vector<char> has_params_;
  int prefetch_ = 0;
  std::vector<int> pending_;
};

// At most `max_inflight` of a run of collectives in flight, oldest first: ZeRO-2/3's
// gradient-bucket reductions (DataParallelPlugin's launch); the plan's replay and the simulator
// follow the same window (ZeRO-1/2's parameter all-gathers: schedule::ParamGatherQueue). launch(b)
// returns the operations that must complete before b's starts, in order (b's own previous one if
// still in flight, then the oldest while `max_inflight` are in flight), drops them and records b as
// in flight. finish(b) records a completion found earlier (no-op when b is not in flight). On one
// communicator the operations complete in launch order, so finishing the ones found complete early
// never changes which launch must wait.
class InflightWindow {
 public:
  // ZeRO-2/3's reduction window for zero_max_inflight_buckets on dp ranks: that many (at least 1),
  // and 1 on one rank, where a reduction is a local copy with nothing to overlap (the executor
  // found it complete at its next test anyway, so a wider window only modelled buffers it had
  // already freed).
  static InflightWindow for_reductions(int zero_max_inflight_buckets, int dp);
  // Whether such a reduction is finished right after its launch: one rank on the host, where
  // the communicator completes the local copy at once and the executor's progress() after the
  // launch (DataParallelPlugin::grads_ready) finishes it, buffers freed. (A GPU's is found
  // complete at the next launch: the window of 1 above.) The plan and the simulator ask this.
  static bool finished_at_launch(int dp, bool gpu) { return dp == 1 && !gpu; }
  explicit InflightWindow(int max_inflight = 1);
  std::vector<int> launch(int b);
  void finish(int b);
  const std::vector<int>& inflight() const { return inflight_; }  // launch order

 private:
  int max_;
  std::vector<int> inflight_;
};

}  // namespace cai::schedule
