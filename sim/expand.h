// Schedule IR -> Workload: what the pipeline executor (libcai/src/parallel/pipeline.cpp) does with
// each instruction, as simulator ops. Durations and sizes come from the caller (uniform numbers
// today; the plan's per-layer costs later): the expansion owns only the executor's ordering.
//
// Per pipeline rank (executor rank = d · stages + s: dp outermost, tensor parallel size 1):
//  - stream 0 (the host thread and compute stream, in program order): LoadMicroBatch, Forward,
//    Backward / BackwardInput / BackwardWeight, RecvActivation / RecvGrad (blocking: the op is the
//    wait for data that was posted ahead), ReduceGrads, OptStep;
//  - SendActivation on stream 1 and SendGrad on stream 2 (isend on the pp and pp-grad
//    communicators), each after the compute just before it in the program;
//  - ReduceGrads waits for every send and every op on another stream issued before it (gradient
//    buckets launched during backward), then all-reduces grad_bytes over the stage's dp group
//    (one all-reduce; zero bytes: none).
//  - A compute instruction becomes one op of forward_s / backward_s, or, when `compute` is set,
//    the ops it returns (per layer: compute with FLOPs and bytes, tensor-parallel collectives,
//    bucket all-reduces on a stream of their own, ...): that is where the plan's per-layer costs
//    plug in while the executor's ordering stays here.
// Tags are schedule::message_tag(mb, producing virtual stage, V, kind), as the executor sends them.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <vector>

#include "cai/schedule/schedule.h"
#include "workload.h"

namespace cai::sim {

struct ExpandOptions {
  // Seconds per virtual stage (size V), or one value for all. A virtual stage of an interleaved
  // schedule is 1/chunks of a rank's model: divide per-rank costs by chunks.
  std::vector<double> forward_s{1.0}, backward_s{2.0};
  double backward_input_share = 0.5;  // BackwardInput = share · backward (split_backward)
  double load_s = 0, optimizer_s = 0;
  // Per stage: the parameter elements its optimizer steps (clipping, the step and zero_grad),
  // timed by the calibration's "optimizer|step" samples or the memory roofline; when set, it
  // replaces optimizer_s.
  std::vector<double> optimizer_elements;
  // Bytes the step moves per element: AdamW reads p, g, m, v and writes p, m, v, clipping reads
  // g, zero_grad writes it (36); the copy-engine exchange's step also reads every other rank's
  // copy of g in the clip and the update (+8 per other rank).
  double optimizer_bytes_per_element = 36.0;
  // ZeRO-Offload: the step runs on the host (an OpKind::Host "host_adam" op over
  // optimizer_elements, the clip's factor applied inside it), not on the GPU, after the clip's
  // sum of squares over host_clip_elements (per stage: ZeRO-1's whole host shard; 0 where the
  // last micro-batch's host adds computed it) as a "host_sum" op.
  bool optimizer_on_host = false;
  std::vector<double> host_clip_elements;
  // Boundary tensor bytes per micro-batch; < 0: the instructions' own bytes.
  int64_t boundary_bytes = -1;
  int dp = 1;  // pipeline replicas (data parallel)
  // The job is `copies` copies of these dp replicas (Workload::copies): ReduceGrads' all-reduce
  // rings go on through every copy (dp · copies members).
  int copies = 1;
  std::vector<int64_t> grad_bytes;  // per stage, all-reduced over dp at ReduceGrads (empty: none)
  // Memory: what each stage holds from the start (size stages, or empty), and the activations one
  // micro-batch keeps per virtual stage from its Forward to its Backward (size V, one, or empty).
  std::vector<std::array<int64_t, kMemKinds>> static_mem;
  std::vector<int64_t> activation_bytes;
  int64_t global_batch = 0;
  DType dtype = DType::BF16;
  // Optional: the ops of one compute instruction (Forward, Backward, BackwardInput,
  // BackwardWeight) on `rank` (global) for virtual stage `vstage`, in issue order; the first
  // takes index `base` of the rank's program. Their `deps` index the returned list (the
  // expansion offsets them), or, when negative, name an earlier op of the program by index
  // (-1 - index: a host wait on a collective issued by an earlier instruction); stream-0 ops
  // follow the program's previous stream-0 op by stream order, ops on other streams get it as a
  // dependency (the host issues them in program order) and ReduceGrads waits for them.
  // Collective ops name groups of `w` (w.add_group). With it, forward_s / backward_s /
  // activation_bytes do not apply to compute instructions (the ops carry their own memory
  // events); the boundary buffers are still accounted on the last stream-0 op.
  std::function<std::vector<Op>(const schedule::Instr& in, int rank, int vstage, int base,
                                Workload& w)>
      compute;
  // Optional: ops issued right after a ReduceGrads or OptimizerStep instruction's own op (the
  // data-parallel plugin's completions after the reductions, ZeRO-1/2's parameter all-gathers
  // after the step), with `compute`'s conventions.
  std::function<std::vector<Op>(const schedule::Instr& in, int rank, int base, Workload& w)> after;
};

// Throws "[sim] ..." when the option vectors have the wrong sizes.
Workload expand_schedule(const schedule::Schedule& s, const ExpandOptions& opt);

}  // namespace cai::sim
