// The analytic model of one training step (DESIGN's `plan` layer): what every op computes and
// moves, what every collective carries over which group, and what every rank holds in memory,
// for a ViT (or, for colossalai benchmark, its blocks alone or a stack of Linears: Layout::body)
// under a parallel layout (dp × pp × tp, sequence parallelism, ZeRO 0-3 with offload,
// GPipe / 1F1B / interleaved, gradient accumulation, fp32/bf16/fp16, activation checkpointing).
//
// One source of truth: the partition, the micro-batch count, the pipeline program and its peak
// micro-batches in flight (schedule::validate), the ZeRO chunks and the gradient buckets
// (schedule/buckets.h) come from the code the executor runs. What the model adds is the
// executor's allocation pattern, written from libcai/src/nn/vit.cpp (what each layer's Cache
// keeps and the gradients its backward holds at once), parallel/data_parallel_impl.h (buckets,
// shards, the ZeRO-3 gather window) and parallel/pipeline.cpp (posted receives, sends):
// make_plan replays one rank's step program over those allocations (src/plan/plan_memory.cpp)
// and reports its peak.
// tests/parallel/plan_memory.cpp holds the prediction against measured peaks per rank.
//
// Units: bytes and FLOPs (a multiply-add is 2) of one micro-batch on one rank (tp/sp-sharded),
// in the compute dtype; memory in bytes per rank.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cai/core/tensor.h"
#include "cai/nn/vit.h"
#include "cai/schedule/schedule.h"

namespace cai::plan {

// What one step runs (colossalai benchmark's --model): the whole ViT (embedding, blocks, head,
// loss, gradient reduction and optimizer), its `depth` blocks alone (-m block: nn::Block on
// [batch, tokens, embed_dim]), or `depth` × Linear(embed_dim, embed_dim) (-m mlp, Colossal-AI's
// benchmark MLP: nn::ParallelLinear, 1d alternating column and row, 2d/2.5d/3d with the input
// layout alternating). Blocks and Linears: forward, then the backward of mean(output); no loss,
// optimizer, data-parallel reduction or pipeline; the input [batch, tokens, embed_dim] (this
// rank's chunk under 2d/2.5d/3d) is in the compute dtype and alive through the step.
enum class Body { ViT, Blocks, Linears };
const char* body_name(Body b);  // "vit", "blocks", "linears"

// The split LayerNorm of the 2d/2.5d/3d layouts (nn::nd_layernorm_fwd / _bwd) in the plan: its
// norm op ("norm1", "norm2", "norm": counted as the whole-row LayerNorm at the rank's block) and
// a kNdLnPasses op (the extra passes over its fp32 input). A calibration that times the split
// LayerNorm itself at a 2D block (forward: the two row-sum passes and the normalisation;
// backward: the sums pass with the parameter gradients, then the input gradient) records it
// under kNdNormCalibration + "|fwd" / "|bwd", by the norm op's FLOPs; the simulator then times
// the norm op by those samples and the passes op as part of them.
inline constexpr const char* kNdNormCalibration = "nd.norm";
inline constexpr const char* kNdLnPasses = "nd.ln_passes";

struct Layout {
  Body body = Body::ViT;
  int64_t tokens = 0;  // tokens per sample; 0: the ViT's patches + 1 (Blocks and Linears: >= 1)
  int world = 1;       // processes; the data-parallel size is world / (tp · pp)
  int tp = 1, pp = 1;
  std::string tp_mode = "1d";  // 1d | 2d | 2.5d | 3d (cai/nn/tensor_parallel.h)
  int tp_depth = 1;            // 2.5d
  bool sequence_parallel = false;
  int zero_stage = 0;  // 0 (DDP), 1, 2, 3
  bool cpu_offload = false;
  bool offload_step_overlap = true;  // DataParallelConfig::offload_step_overlap
  // Pipeline (pp > 1): parallel::PipelineConfig's settings.
  std::string pp_style = "1f1b";  // gpipe | 1f1b | interleaved | zbh1 | zbv (chunks 2)
  int num_microbatches = 0, microbatch_size = 0, chunks = 1;
  // Each Backward as BackwardInput + BackwardWeight (parallel.split_backward); zbh1 and zbv
  // always split, whatever this says.
  bool split_backward = false;
  std::string partition = "uniform";  // uniform | balanced
  std::vector<int> num_layers_per_stage;
  int64_t batch = 1;                  // samples per data-parallel rank per forward/backward
  int64_t gradient_accumulation = 1;  // batches per optimizer step (pp = 1)
  DType precision = DType::F32;       // compute dtype (master weights stay fp32)
  std::string optimizer = "adamw";    // sgd | adam | adamw | hybrid_adam | lamb
  double momentum = 0.9;              // sgd: a momentum buffer when > 0
  double ddp_bucket_cap_mb = 25.0, zero_bucket_size_in_m = 12.0;
  int zero_max_inflight_buckets = 2, zero3_prefetch = 1;
  DType bucket_dtype = DType::F32;  // stage 0/1 buckets' dtype (parallel.gradient_comm_dtype)
  // Stage 0/1 fp32 buckets all-reduced by the copy engines (parallel.ddp_copy_engine): a staging
  // region per rank (schedule::copy_engine_region_bytes) among the buffers.
  bool ddp_copy_engine = false;
  // Stage 0 fp32 buckets exchanged by the copy engines (parallel.ddp_exchange): receive slots of
  // every bucket for each other rank (schedule::copy_engine_exchange_region_bytes) among the
  // buffers.
  bool ddp_exchange = false;
  // Stage 0/1 buckets held until this share of the gradients is final (parallel.ddp_bucket_hold,
  // schedule::launch_held_buckets): when the simulator launches them.
  double ddp_bucket_hold = 0.0;
  bool gpu = false;  // parameters on a GPU: fused attention in half, offload moves to the host
  // GPUs: the pipeline's NCCL channels' thread blocks (parallel.p2p_max_ctas) and the SMs its
  // GEMMs leave (config::gemm_sm_margin_for): which posted-receive share applies (the simulator
  // warns when its profile measured other ones).
  int p2p_max_ctas = 0, gemm_sm_margin = 0;
  // Gradients go through parallel::DataParallelPlugin (every multi-process run, ZeRO, pipeline):
  // DDP's flat bucket buffers exist. False: one process without a plugin.
  bool data_parallel_plugin = true;
  // Allocator overhead as a fraction of the peak (CPU accounting counts exact bytes: 0; a GPU
  // caching allocator rounds and fragments).
  double allocator_overhead = 0.0;
  // Steps' worth of input batches (fp32 images and int32 labels) the trainer holds on this
  // rank's device through the step: vit_train on a GPU 2 (its prefetcher's device slots: this
  // step's and the next one's), on the CPU 1 (the step's batches) plus what the loader's workers
  // build ahead (num_workers + prefetch). 0: a bare plugin step (nothing beyond its inputs).
  int input_batches = 0;

  int dp() const { return world / (tp * pp); }
  bool nd() const { return tp > 1 && tp_mode != "1d"; }
  void validate(const nn::ViTConfig& model) const;  // throws "[plan] ..." naming the bad values
};

enum class Phase { Forward, Backward, Recompute, OptimizerStep };
const char* phase_name(Phase p);

struct OpCost {
  std::string layer, op;  // "blocks.3", "attn.qkv"
  Phase phase = Phase::Forward;
  double flops = 0;
  int64_t bytes_read = 0, bytes_written = 0;
  // Device calls (kernels, copies) the op stands for when it is more than one launch (sequence
  // parallelism's staging: one per collective); the simulator times such an op at least
  // calls × the calibration's "copy|call". 0: one.
  int64_t calls = 0;
};

enum class CollectiveKind { AllReduce, ReduceScatter, AllGather, Broadcast, Send, Recv };
enum class Group { Tp, Pp, Dp };
const char* collective_name(CollectiveKind k);
const char* group_name(Group g);

// One collective as a rank issues it. bytes as nn::TensorParallel::comm_bytes counts them
// (all-reduce: the tensor; all-gather: the gathered result; reduce-scatter: the input; send /
// recv: the message), in the dtype it travels in.
struct Collective {
  CollectiveKind kind = CollectiveKind::AllReduce;
  Group group = Group::Tp;
  int group_size = 1;
  int64_t bytes = 0;
  std::string layer, op;  // the layer and the op or phase it belongs to ("mlp.fc2", "bucket 3")
  Phase phase = Phase::Forward;
  int count = 1;  // times per optimizer step (per micro-batch ones: × micro-batches)
  // Tensor parallel: the sub-group (nn::tp_group_name: "tp" the whole group, "row", "col",
  // "depth", "col×depth", "input", "weight", "output", "input×weight", "output×weight").
  std::string subgroup = "tp";
  // Broadcasts (2d/2.5d SUMMA): the `count` broadcasts take every member in turn as the root
  // (the t-th of a round of group_size ones is rooted at member t); false: member 0 each time.
  bool rotating_root = false;
};

// One layer for one micro-batch on one rank.
struct LayerPlan {
  std::string name;                       // "embedding", "blocks.i", "head"
  int64_t parameters = 0;                 // elements held by this rank (tensor-parallel shard)
  std::vector<int64_t> parameter_numels;  // per parameter, in collect() order
  // Per parameter: whether it decays (the linear weights; nn::Parameter::weight_decay), which
  // ZeRO-Offload keeps on the device in the compute dtype (cai/schedule/offload.h).
  std::vector<char> parameter_decays;
  std::vector<OpCost> ops;
  std::vector<Collective> collectives;  // tensor-parallel, per micro-batch
  // Memory of one micro-batch: what the Cache keeps from forward to backward (a block's input
  // included), the layer's output, the largest transient bytes on top of those in forward and
  // in backward (the input gradient, which the backward returns, included), the input gradient.
  int64_t saved = 0, input = 0, output = 0, forward_extra = 0, backward_extra = 0, grad_input = 0;
  bool keeps_input = false;
  // A split backward (BackwardInput, then BackwardWeight; nn::WeightGrads deferred): the
  // BackwardInput's peak above `saved` and the output gradient (the input gradient included);
  // what it leaves alive for the BackwardWeight in place of the Cache and the output gradient
  // (the tensors the weight-gradient steps captured: GEMM inputs, output gradients, fp32 partial
  // sums); and the BackwardWeight's transient bytes on top of that.
  int64_t split_backward_extra = 0, weight_held = 0, weight_extra = 0;
};

struct Memory {
  int64_t parameters = 0;  // full (tp-sharded) values held through the step (not ZeRO-3)
  int64_t gradients = 0;   // full gradients (stage 0/1) held through the step
  int64_t shards = 0;  // ZeRO: this rank's chunk of values and gradients (offload: on the device)
  int64_t optimizer_state = 0;  // slots × what the optimizer steps (on the device)
  int64_t buffers = 0;          // DDP / ZeRO-1 persistent flat buckets
  int64_t host = 0;  // cpu_offload (GPU): fp32 values, gradients, optimizer state, pinned staging
  int64_t data = 0;  // the trainer's input batches on the device (Layout::input_batches)
  int64_t activations = 0;  // saved activations of the micro-batches in flight at the peak
  int micro_batches_in_flight = 0;
  int64_t window = 0;     // communication buffers alive at the peak (buckets, gathers, p2p)
  int64_t transient = 0;  // everything else alive at the peak (working tensors of a layer)
  int64_t allocator = 0;
  int64_t peak = 0;     // the sum of the above (host excluded): the predicted peak
  std::string peak_at;  // "Backward(mb=1) blocks.5"
  int64_t persistent() const {
    return parameters + gradients + shards + optimizer_state + buffers + data;
  }
};

struct RankPlan {
  int rank = 0, dp_rank = 0, pp_rank = 0, tp_rank = 0;
  std::vector<int> layers;              // global layer indices this rank holds
  int64_t parameter_elements = 0;       // of those layers, tp-sharded
  std::vector<LayerPlan> layer_plans;   // per held layer (tp rank's token split)
  std::vector<Collective> collectives;  // per step: DDP/ZeRO, pipeline p2p (tp ones in layers)
  Memory memory;
};

struct StepPlan {
  nn::ViTConfig model;
  Layout layout;
  int dp = 1;
  int micro_batches = 1;                // per optimizer step (pipeline) or accumulation
  int64_t micro_batch_rows = 0;         // the largest micro-batch
  schedule::Partition partition;        // pp > 1
  schedule::Schedule schedule;          // pp > 1: the executor's program per stage
  std::vector<int> peak_micro_batches;  // per pipeline stage, from schedule::validate
  std::vector<RankPlan> stages;         // per pipeline stage: its dp 0, tp 0 rank
  int64_t peak() const;                 // the largest predicted peak over the stages
};

// The model of one step. Throws cai::Error ("[plan] ...", or the schedule's / partition's).
StepPlan make_plan(const nn::ViTConfig& model, const Layout& layout);
// Any rank of the world (ZeRO chunks, token splits and stages differ by rank).
RankPlan plan_rank(const StepPlan& plan, int rank);
// Optimizer slots per stepped element (AdamW 2, SGD with momentum 1); throws on an unknown
// optimizer.
int optimizer_slots(const Layout& l);
// Forward + backward FLOPs of one micro-batch over the layers a rank holds.
double flops(const RankPlan& r);
// Human summary: per stage (or one line when stages are alike) memory by kind and the peak.
std::string summary(const StepPlan& plan);

}  // namespace cai::plan
