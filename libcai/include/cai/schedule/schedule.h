// Pipeline-parallel schedules as data: an instruction list per pipeline rank, the generators for
// GPipe, 1F1B (PipeDream-flush), Megatron's interleaved 1F1B and the zero-bubble schedules ZB-H1
// and ZB-V (Qi et al., ICLR 2024), layer partitioning, and a validator that replays the programs
// concurrently (dependencies, pairing, deadlocks, memory, timing).
//
// Pure functions: no devices, no communication. Consumed by the pipeline executor
// (cai/parallel), the SimGrid simulator and the schedule GUI.
//
// Model pieces. The model has L layers in a global order (layer 0 = embedding, layer L-1 = final
// norm + head). A schedule with p stages (pipeline ranks) and v chunks per rank cuts them into
// V = p * v contiguous virtual stages. A schedule's placement says which rank holds each virtual
// stage; a rank's chunks are its virtual stages in increasing order (chunk 0 the earliest). The
// default placement is Megatron's interleaving, vs = chunk * p + rank (rank r holds r, p + r,
// 2p + r, ...); ZB-V places two chunks per rank in a V: rank r holds r and 2p-1-r, so rank 0
// holds the first and the last virtual stage. Consumers map through Schedule::virtual_stage /
// rank_of / chunk_of, never through the formula.
//
// Program semantics (what an executor must honour, what validate() checks):
//  - LoadMicroBatch(mb): the rank holding vs 0 loads the images of mb before Forward(mb, vs 0);
//    the rank holding the last virtual stage loads the labels of mb before its Forward(mb, V-1)
//    (one Load, images and labels, when one rank holds both: p == 1, or ZB-V's rank 0).
//  - RecvActivation / RecvGrad block until the matching send has been executed; SendActivation /
//    SendGrad never block (buffered / isend). Messages between one (src, dst) pair of one kind
//    (activation or grad) are received in the order they were sent (FIFO).
//  - A Recv immediately precedes the compute that consumes it; a Send immediately follows the
//    compute that produced it. Activations go from vs to vs+1, gradients from vs+1 to vs.
//  - Split backward: BackwardInput(mb, chunk) computes the gradient of the chunk's input (sent on
//    at once by the SendGrad after it) and BackwardWeight(mb, chunk), later on the same rank, the
//    gradients of its parameters. The executor keeps what the weight gradient needs (the layers'
//    saved inputs and output gradients) from the BackwardInput until that BackwardWeight. With
//    ScheduleOptions::split_backward every BackwardWeight follows its BackwardInput's SendGrad
//    at once; the zero-bubble schedules move them into what would be bubbles.
//  - Every program ends with ReduceGrads then OptimizerStep (once, covering all its chunks).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace cai::schedule {

enum class Op {
  LoadMicroBatch,
  Forward,
  Backward,
  BackwardInput,
  BackwardWeight,
  SendActivation,
  RecvActivation,
  SendGrad,
  RecvGrad,
  ReduceGrads,
  OptimizerStep,
};
const char* op_name(Op op);  // "Forward", "SendActivation", ...
bool is_compute(Op op);      // Forward, Backward, BackwardInput, BackwardWeight
bool is_send(Op op);         // SendActivation, SendGrad
bool is_recv(Op op);         // RecvActivation, RecvGrad

struct Instr {
  Op op = Op::Forward;
  int mb = -1;    // micro-batch index, -1 when not applicable (ReduceGrads, OptimizerStep)
  int chunk = 0;  // model chunk on this rank (its virtual stage: Schedule::virtual_stage)
  int peer = -1;  // pipeline rank of the peer for send/recv, -1 otherwise
  // The global layer range [first_layer, first_layer + num_layers) of this rank's (mb, chunk):
  // computed by Forward/Backward*, produced (Send) or consumed (Recv) by the transfer, fed
  // (LoadMicroBatch). ReduceGrads/OptimizerStep: first_layer of chunk 0 and num_layers = all the
  // layers the rank holds (not one contiguous range when chunks > 1).
  int first_layer = 0, num_layers = 0;
  int64_t bytes = 0;  // bytes moved by send/recv (ScheduleOptions::activation_bytes), 0 otherwise

  // "Load(mb=3)", "F(mb=3,c=0)", "B(..)", "BI(..)", "BW(..)", "SendAct(mb=3,c=0,->2)",
  // "RecvAct(mb=3,c=0,<-1)", "SendGrad(..)", "RecvGrad(..)", "ReduceGrads", "OptStep".
  std::string str() const;
  bool operator==(const Instr&) const = default;
};

using Program = std::vector<Instr>;  // one rank's ordered instructions

// What a pipeline message carries, and its tag: the tensor virtual stage `vs` produced for
// micro-batch `mb` (an activation goes to vs + 1, a gradient to vs - 1; Eval: evaluation's
// forward). The executor's sends and receives and the simulator's expansion use this one
// definition.
enum class Message { Activation = 0, Grad = 1, Eval = 2 };
inline int64_t message_tag(int mb, int vs, int virtual_stages, Message kind) {
  return (static_cast<int64_t>(mb) * virtual_stages + vs) * 3 + static_cast<int>(kind);
}

struct Schedule {
  // "gpipe" | "1f1b" | "interleaved" | "zbh1" | "zbv" (or anything for hand-made ones)
  std::string name;
  int stages = 1, micro_batches = 1, chunks = 1;
  std::vector<Program> programs;  // index = pipeline rank
  // The rank holding each virtual stage (size V = stages * chunks), every rank `chunks` times;
  // empty: Megatron's interleaving (vs = chunk * stages + rank). See v_placement.
  std::vector<int> placement;

  int virtual_stages() const { return stages * chunks; }
  // The virtual stage of a rank's chunk (its chunk-th lowest), the rank holding a virtual stage
  // and its chunk index there. Throw "[schedule] ..." naming the value out of range.
  int virtual_stage(int rank, int chunk) const;
  int rank_of(int vstage) const;
  int chunk_of(int vstage) const;
  // One line per rank: "rank 0: Load(mb=0) F(mb=0,c=0) SendAct(mb=0,c=0,->1) ..."
  std::string str() const;
};

// Layers per virtual stage (in virtual-stage order), each >= 1; they sum to the layer count.
// Contiguity puts the embedding (layer 0) in virtual stage 0 and the head in the last one.
struct Partition {
  std::vector<int> layers_per_virtual_stage;

  int virtual_stages() const { return static_cast<int>(layers_per_virtual_stage.size()); }
  int total_layers() const;
  int first_layer(int vstage) const;  // sum of the layers of the virtual stages before it
  int num_layers(int vstage) const { return layers_per_virtual_stage.at(vstage); }
};

// ZB-V's placement over p ranks (2p virtual stages): rank r holds virtual stages r and 2p-1-r.
std::vector<int> v_placement(int stages);
// The placement the named style uses for p stages and v chunks: v_placement for "zbv", empty
// (interleaving) otherwise. What the executor should build its chunks from before it has a
// Schedule (it can also read Schedule::placement of make()'s result).
std::vector<int> placement_of(const std::string& style, int stages, int chunks);
// An empty placement's table, or the placement checked: size stages * chunks, ranks in range,
// each rank exactly `chunks` times. Throws "[schedule] ..." naming the bad entry.
std::vector<int> placement_table(const std::vector<int>& placement, int stages, int chunks);

// Uniform by count: every virtual stage gets num_layers / V layers and the first num_layers % V
// get one more (14 over 4 -> 4,4,3,3). Throws "[partition] ..." when num_layers < V or V < 1.
Partition partition_uniform(int num_layers, int virtual_stages);
// Contiguous split minimising the largest stage cost (sum of layer_costs, e.g. parameter counts);
// among the optimal splits the one with the smallest sum of squared stage costs, then the one
// giving earlier stages more layers. Costs must be >= 0; throws when fewer layers than stages.
Partition partition_balanced(const std::vector<int64_t>& layer_costs, int virtual_stages);
// The given list, checked: every entry >= 1, sum == num_layers, and (when virtual_stages > 0)
// exactly virtual_stages entries.
Partition partition_explicit(const std::vector<int>& num_layers_per_stage, int num_layers,
                             int virtual_stages = 0);

// The pipeline executor's partition of a model's layers over V virtual stages, also what the
// step model (cai/plan) assumes. explicit_layers non-empty: that list (partition_explicit).
// how = "uniform": the middle layers (a ViT's blocks) spread evenly, the first layer (embedding)
// joining the first virtual stage and the last (norm + head) the last one; all layers spread
// evenly when there are fewer middle layers than virtual stages. how = "balanced":
// partition_balanced over layer_costs (e.g. parameters per layer). Throws naming a bad `how`.
Partition partition_layers(int num_layers, int virtual_stages, const std::string& how,
                           const std::vector<int64_t>& layer_costs,
                           const std::vector<int>& explicit_layers);
// Micro-batches per step for a batch of `batch` samples on `stages` stages: num_microbatches if
// set, else ceil(batch / microbatch_size) if set, else the stage count. Throws when interleaved
// and not a multiple of the stages, or when the batch has fewer samples than micro-batches.
int micro_batch_count(int64_t batch, int num_microbatches, int microbatch_size, int stages,
                      const std::string& style);
// The count the settings ask for, unchecked: num_microbatches, else ceil(batch /
// microbatch_size), else the stage count (micro_batch_count's rule before its checks).
int requested_micro_batches(int64_t batch, int num_microbatches, int microbatch_size, int stages);
// Micro-batch i of a batch of n samples split in m nearly equal parts: (first sample, rows).
inline std::pair<int64_t, int64_t> micro_batch_slice(int64_t n, int m, int i) {
  const int64_t b = n * i / m, e = n * (i + 1) / m;
  return {b, e - b};
}

struct ScheduleOptions {
  int stages = 1;                // p, pipeline ranks
  int micro_batches = 1;         // m, per optimizer step
  int chunks = 1;                // v, model chunks per rank (interleaved: >= 2; zbv: 2)
  int64_t activation_bytes = 0;  // size of one micro-batch's boundary tensor (activation = grad)
  bool split_backward = false;   // BackwardInput + BackwardWeight instead of Backward
  // zbh1 / zbv: the relative times of a virtual stage's Forward, BackwardInput and
  // BackwardWeight that their list scheduler orders the work by (the paper's F = B = W by
  // default; set_zero_bubble_costs gives the trainer's).
  double cost_forward = 1.0, cost_input = 1.0, cost_weight = 1.0;
};

// The relative F / B / W times the zero-bubble generators plan with: a chunk's forward (F = 1),
// input gradient (B = 1.5; 2.5 under activation checkpointing, which recomputes the forward) and
// weight gradient (W = 0.5). B + W = 2F as the FLOPs go; B takes the larger part because the
// attention, LayerNorm and GELU backwards and every input-gradient GEMM run there and only the
// weight GEMMs in W (a ViT-L/16 chunk of 3 blocks on an H100 profile: 1.34 / 1.9 / 0.8 ms). With
// the paper's F = B = W the list scheduler's ties put ZB-V's ranks idle once real B and W differ
// (measured: +4.9% over 1F1B on 4 H100; docs/PARALLELISM.md). The executor, the plan and the
// simulator all take these, so they run one program.
void set_zero_bubble_costs(ScheduleOptions& opt, bool recompute);

// GPipe: all forwards (mb 0..m-1), then all backwards (mb 0..m-1). Peak live activations m.
Schedule gpipe(const ScheduleOptions& opt, const Partition& part);
// PipeDream-flush 1F1B: stage s runs min(p-s-1, m) warm-up forwards, then alternates one forward
// and one backward, then drains the remaining backwards. Peak live activations min(p-s, m).
Schedule one_f_one_b(const ScheduleOptions& opt, const Partition& part);
// Megatron's interleaved 1F1B with v = chunks >= 2 chunks per rank; m must be a multiple of p
// (micro-batches advance through the chunks in groups of p). Rank r warms up with
// min(2(p-r-1) + (v-1)p, m v) forwards; forward k runs chunk (k mod pv) / p of micro-batch
// (k / pv) p + k mod p, backward k the chunk v-1 - (k mod pv) / p of the same micro-batch.
Schedule interleaved(const ScheduleOptions& opt, const Partition& part);
// Zero-bubble schedules (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): every
// backward split into BackwardInput (B, on the critical path) and BackwardWeight (W, free to
// move), W's placed into what 1F1B leaves idle. Both are found by one greedy list scheduler
// replaying the pipeline with ScheduleOptions' costs (no communication time):
// a free rank runs, in this order of preference, a ready F if its memory limits allow (the chunk
// nearest the loss first), a ready B (oldest micro-batch first), a pending W (oldest first); it
// idles only when none is there. Any order this produces is deadlock-free
// under any real timing (the replay is an execution of the programs), and validate() checks it.
//
// ZB-H1: one chunk per rank. Rank r keeps at most p - r micro-batches between F and B (1F1B's
// warm-up, so the same critical path) and at most p between F and W: every rank's peak of live
// activations (W's inputs included) is <= p, 1F1B's peak (rank 0's). Ideal bubble
// (p-1)(F+B-W) = p-1 units against 1F1B's (p-1)(F+B+W) = 3(p-1): a third.
Schedule zbh1(const ScheduleOptions& opt, const Partition& part);
// ZB-V: chunks must be 2; placement v_placement(p). Each rank keeps at most 2p chunk activations
// between F and W, as many bytes as 1F1B's rank 0 (a chunk is half a stage), and at most 2p - 1
// chunk-0 ones (room for the chunk leading to the loss). Any m >= 1 (the generator's tests: no
// deadlock and the limits held for p <= 8, m <= 32); its bubble is smallest with m >= 2p.
Schedule zbv(const ScheduleOptions& opt, const Partition& part);
// By name: "gpipe" | "1f1b" | "interleaved" | "zbh1" | "zbv"; throws "[schedule] unknown style
// ..." otherwise. zbh1 and zbv always split the backward (split_backward is ignored).
Schedule make(const std::string& style, const ScheduleOptions& opt, const Partition& part);
// The styles make() knows, in that order.
const std::vector<std::string>& styles();

// Durations for the timing replay. Compute costs are per virtual stage (every chunk costs the
// same) unless per_layer, where they are multiplied by the instruction's num_layers. Bubble
// fractions compare across chunk counts as they are; absolute times only with per_layer (or with
// forward/backward divided by chunks), since a chunk of an interleaved model is a 1/v model piece.
struct CostModel {
  double forward = 1.0;
  double backward = 2.0;              // a whole Backward (= BackwardInput + BackwardWeight)
  double backward_input_share = 0.5;  // BackwardInput = share * backward, BackwardWeight = rest
  bool per_layer = false;
  double comm = 0.0;           // latency of a message: send end -> earliest recv end
  double comm_per_byte = 0.0;  // added per Instr::bytes
  double load = 0.0, reduce = 0.0, optimizer = 0.0;  // LoadMicroBatch, ReduceGrads, OptimizerStep
};

struct InstrTime {
  double start = 0.0, end = 0.0;  // a recv's start..end is its wait; a send takes no time
};

struct ValidationResult {
  bool ok = false;
  std::string error;  // empty when ok; "[schedule] ..." naming the rank(s) and instruction(s)
  // Per rank: max over time of forwards - completed backwards, a split backward completing at
  // its BackwardWeight (so the inputs held for W count as live activations), in chunks.
  std::vector<int> peak_activations;
  // Per rank: max over time of BackwardInputs whose BackwardWeight has not run yet.
  std::vector<int> peak_pending_weights;
  std::vector<double> busy;      // per rank: time spent in anything but waiting on a recv
  double makespan = 0.0;         // latest end over all ranks
  double bubble_fraction = 0.0;  // 1 - sum(busy) / (stages * makespan)
  std::vector<std::vector<InstrTime>> times;  // [rank][instruction index], same shape as programs
  explicit operator bool() const { return ok; }
};

// Replays all programs concurrently (rank-local program counters, blocking receives, buffered
// sends) and checks: instruction fields in range (mb, chunk, peer, layer range, bytes); each
// recv pairs with the oldest pending send of its (peer -> rank, kind) channel carrying the same
// micro-batch and the adjacent virtual stage; data dependencies (Forward(mb, vs) after the output
// of Forward(mb, vs-1) is here, Backward(mb, vs) after Forward(mb, vs) and the grad of vs+1, the
// loss stage after its labels were loaded, BackwardWeight after BackwardInput, sends after what
// they send was computed); exactly one Forward and one Backward (or BackwardInput +
// BackwardWeight) per (mb, vs); every send received; ReduceGrads after the rank's last backward
// and OptimizerStep last. A state where no rank can progress is a deadlock: the error names every
// stuck rank and its next instruction. Stops at the first error (times filled up to there).
// max_live_activations > 0: also fails when a Forward makes a rank's live activations (as
// peak_activations counts them) exceed it, naming the rank, the count and the limit.
ValidationResult validate(const Schedule& schedule, const CostModel& cost = {},
                          int max_live_activations = 0);
// Where each receive may be posted ahead of its instruction: points[rank][i], for a receive at
// position i of the rank's program, is the earliest position before whose instruction it may be
// posted (<= i): just after the last instruction of this rank that its matching send depends on
// (through program order and earlier messages; sends and receives of a (kind, src, dst) channel
// pair in order, as NCCL's do). Posted earlier, a receive could wait on the device for a send that
// needs this rank to get further first: NCCL keeps such a receive spinning, and a CUDA call of
// this rank that waits for the device (an allocation, a module load, an event or stream wait on
// work queued behind it) then never returns. For other instructions points[rank][i] = i.
// Throws "[schedule] ..." when a receive has no matching send or the programs deadlock.
std::vector<std::vector<size_t>> receive_post_points(const Schedule& schedule);

// The executor's receive posting for one rank: before[i] lists the receive positions to post just
// before instruction i runs. ahead: each receive as soon as its receive_post_points entry allows,
// with at most one posted and not yet taken per kind (activation, gradient) and each kind in
// program order (the order its peer sends in), so a posted receive overlaps this rank's compute;
// a receive not posted by then is posted at its own position. !ahead: every receive at its own
// position.
std::vector<std::vector<size_t>> receive_posting(const Schedule& schedule, int rank, bool ahead);

// validate(), throwing cai::Error with the message when it fails.
ValidationResult validate_or_throw(const Schedule& schedule, const CostModel& cost = {},
                                   int max_live_activations = 0);

}  // namespace cai::schedule
