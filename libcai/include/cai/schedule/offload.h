// ZeRO-Offload as data (parallel.cpu_offload with zero_stage >= 1, parameters on a GPU): what
// DataParallelPlugin (libcai/src/parallel/data_parallel.cpp, offload_lane.{h,cpp}) keeps on the
// device and in host memory and what it moves between them, per rank and step. The plan's memory
// model (cai/plan) and the simulator's step program (sim/from_config.cpp) both read it, so they
// cannot disagree on the offload's sizes.
//
// The executor, for this rank's shard of S elements (the sum of its ZeRO chunks):
//  - device: the shard's values in the compute dtype for the parameters that decay (the weights:
//    `rounded`), fp32 for the rest (biases, norms, tokens, position embedding); stage 1 also an
//    fp32 gradient shard (the buckets' sums land there); stages 2/3 none;
//  - host: fp32 values and gradients (8 S), the optimizer's slots (4 S each), and the lane's
//    page-locked staging: two download slots and two upload slots of the largest bucket chunk,
//    all fp32-sized (an upload slot holds either dtype);
//  - download: stages 2/3 copy each bucket's reduced chunk (fp32) to the host after its
//    reduction, every micro-batch, and a host thread adds it into the host gradients; stage 1
//    copies the device gradient shard (4 S) once after the backward;
//  - upload after the host step: the values cast to the device copy's dtype, in copies of at most
//    the largest chunk over the rounded part, then over the fp32 part. Under bf16 (step_casts)
//    the host step writes the weights' bf16 copies itself: it steps the fp32 part first (one
//    upload, cast), then each rounded parameter in model order, each sent as soon as it is
//    stepped (offload_step_order); with DataParallelConfig::offload_step_overlap that runs beside
//    the next step's forward, each layer's gathers waiting for their own parameters only.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace cai::schedule {

// The lane's page-locked staging buffers each way (OffloadLane), and the host layout's line: every
// parameter's chunk starts on a multiple of this many elements (64 bytes: the CPU Adam's streamed
// stores need p, m and v aligned alike).
constexpr int kOffloadStagingSlots = 2;
constexpr int64_t kOffloadHostAlign = 16;

struct OffloadLayout {
  int64_t shard = 0;                     // S: elements of this rank's shard
  int64_t rounded = 0;                   // of S, held on the device in the compute dtype
  int64_t largest_chunk = 1;             // elements of the largest bucket chunk (at least 1)
  int64_t device_value_bytes = 0;        // rounded · e + (S − rounded) · 4
  int64_t device_grad_bytes = 0;         // stage 1: 4 S; stages 2/3: 0
  std::vector<int64_t> bucket_download;  // per bucket: bytes copied to the host per micro-batch
  int64_t step_download = 0;             // stage 1: bytes copied once after the backward
  // One copy of the upload, in order: `numel` elements (`bytes` in the device copy's dtype),
  // preceded on the host by `step` elements of the host optimizer (step_casts: the step writes
  // the piece's staging buffer itself as it updates them) and, where `cast`, a pass casting the
  // piece's fp32 values into the buffer. `param`: the parameter (model order) it carries, -1 for
  // the fp32 part (several parameters) and for the copies of a step that is not step_casts'.
  struct UploadPiece {
    int64_t numel = 0, bytes = 0, step = 0;
    bool cast = false;
    int param = -1;
  };
  std::vector<UploadPiece> upload;
  int64_t host_state_bytes = 0;  // values, gradients and optimizer slots: 4 (2 + slots) S
  int64_t staging_bytes = 0;     // page-locked: 4 slots × largest chunk × 4
  int64_t host_bytes() const { return host_state_bytes + staging_bytes; }
  // The host arrays' layout, which the executor allocates: per parameter (model order) where its
  // chunk starts, the rounded parameters first, each chunk on a kOffloadHostAlign line; the
  // arrays' elements (S and the lines' padding) and where the fp32 part begins.
  std::vector<int64_t> host_offset;
  int64_t host_elements = 0, host_rounded_elements = 0;
  // Elements the host optimizer steps (clipping reads them too): S.
  int64_t host_step_elements() const { return shard; }
};

// The order the host step (step_casts) steps the parameters in, as indices into host_offset
// (model order): the fp32 part (offsets from host_rounded_elements up) first, then the rounded
// parameters, each by offset. DataParallelPlugin steps in it; offload_layout's pieces follow it.
std::vector<std::size_t> offload_step_order(const std::vector<int64_t>& host_offset,
                                            int64_t host_rounded_elements);

// The layout for one rank. numels / rounded: per parameter (model order) its elements and
// whether the device keeps it in the compute dtype (it decays); buckets: schedule::
// gradient_buckets' lists of parameter indices (none: the host layout and sizes only, no
// transfers, staging or largest chunk); dp_rank / dp: this rank's ZeRO chunks;
// compute_bytes: the compute dtype's element size (4 in fp32 runs, 2 under bf16 / fp16);
// slots: optimizer slots per element (AdamW 2); step_casts: the device copy is bf16, which the
// host Adam writes in its own pass (the upload's pieces). Throws "[offload] ..." on bad sizes.
OffloadLayout offload_layout(const std::vector<int64_t>& numels, const std::vector<char>& rounded,
                             const std::vector<std::vector<int>>& buckets, int zero_stage,
                             int dp_rank, int dp, int64_t compute_bytes, int slots,
                             bool step_casts = false);

}  // namespace cai::schedule
