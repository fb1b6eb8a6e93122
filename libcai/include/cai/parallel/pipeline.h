// The pipeline executor: runs a schedule::Schedule (GPipe, 1F1B, interleaved, ZB-H1, ZB-V) on
// real processes as a train::Plugin. Every rank builds the whole ViT and keeps only the layers of
// its virtual stages, placed as the style's schedules place them (schedule::placement_of: ZB-V's
// rank r holds virtual stages r and 2p-1-r; the others' parameters are freed); micro-batches flow
// between stages with the Communicator's non-blocking sends (each released as soon as it completes)
// and receives posted ahead where schedule::receive_posting allows (once their matching send no
// longer waits for this rank; one per kind, in program order; a Recv instruction waits for data
// already in flight): the semantics the schedule validator proves deadlock-free. With tensor
// parallelism (through HybridParallelPlugin) boundary tensors have the model's residual shape
// (sequence parallel: this rank's tokens). Data parallelism across pipeline replicas (pp × dp) and
// ZeRO-1 come from a DataParallelPlugin over the data-parallel group, applied to the stage's
// layers. Every instruction is recorded as a timed span with the memory in use, for Chrome traces:
// host time on the CPU; on a GPU device time, from timed CUDA events on the compute stream (the
// kernels run asynchronously to the host, so host spans would show the launches), placed on the
// host clock at each step's start and resolved once the device has completed them (never with a
// wait inside a step).
// On GPUs (the model moved to its device before setup, an NCCL world communicator) boundary
// tensors live on the device and travel over per-direction NCCL channels: activations on one
// communicator, gradients on another (NCCL matches messages in order, not by tag).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "cai/core/trace.h"
#include "cai/dist/communicator.h"
#include "cai/dist/mesh.h"
#include "cai/parallel/data_parallel.h"
#include "cai/schedule/schedule.h"
#include "cai/train/trainer.h"

namespace cai::parallel {

struct PipelineConfig {
  std::string style = "1f1b";  // gpipe | 1f1b | interleaved | zbh1 | zbv
  int num_microbatches = 0;    // per step; 0: from microbatch_size, else the stage count
  int microbatch_size = 0;
  int chunks = 1;  // model chunks per rank (interleaved: >= 2; zbv: 2)
  // Each Backward as BackwardInput (input gradient, sent on at once) + BackwardWeight (parameter
  // gradients, which the data-parallel reduction waits for): Layer::backward_input/weight.
  // zbh1 and zbv always run split (their schedules are made of BackwardInput/BackwardWeight).
  bool split_backward = false;
  // uniform: blocks spread evenly, the embedding with the first virtual stage and norm + head
  // with the last (all layers spread evenly when there are fewer blocks than virtual stages);
  // balanced: contiguous split minimising the largest per-stage parameter count.
  std::string partition = "uniform";
  std::vector<int> num_layers_per_stage;  // explicit partition (per virtual stage), overrides
  // NCCL: thread blocks each send/receive channel's kernel takes at most (dist::P2POptions;
  // parallel.p2p_max_ctas, whose default this is). 0: NCCL's choice.
  int p2p_max_ctas = 2;
  DataParallelConfig dp;  // zero_stage 0 or 1 across pipeline replicas
};

class PipelinePlugin : public train::Plugin {
 public:
  // world: every process; mesh: its dp × pp × tp layout (tp must be 1 here).
  PipelinePlugin(dist::Communicator& world, const dist::ProcessMesh& mesh, PipelineConfig cfg);
  ~PipelinePlugin() override;

  std::string name() const override;
  int rank() const override;
  int world_size() const override;
  void setup(nn::ViT& model) override;
  std::vector<nn::Parameter*> optimizer_parameters(nn::ViT& model) override;
  train::StepMetrics forward_backward(nn::ViT& model, const std::vector<data::Batch>& batches,
                                      float weight, const train::Criterion& crit,
                                      const nn::ForwardCtx& step_ctx) override;
  train::StepMetrics eval_batch(nn::ViT& model, const data::Batch& batch) override;
  Tensor clip_grad_norm(optim::Optimizer& opt, double max_norm) override;
  void optimizer_step(optim::Optimizer& opt) override;
  // ZeRO-1: completes the step's deferred parameter all-gathers of this stage's layers
  // (DataParallelPlugin::materialize_parameters); eval_batch does it itself.
  void materialize_parameters();
  void zero_grad(nn::ViT& model, optim::Optimizer& opt) override;
  double all_reduce_sum(double v) override;
  double all_reduce_max(double v) override;
  // Checkpoints of sharded state go through HybridParallelPlugin: these throw saying so.
  std::map<std::string, Tensor> full_model_state(nn::ViT& model) override;
  std::map<std::string, Tensor> full_optimizer_state(nn::ViT& model,
                                                     optim::Optimizer& opt) override;
  void load_optimizer_state(nn::ViT& model, optim::Optimizer& opt,
                            const std::map<std::string, Tensor>& full) override;

  int micro_batches_for(int64_t batch_size) const;
  // The schedule for a batch of `batch` samples (validated when built; its transfers carry the
  // bytes of one boundary tensor).
  const schedule::Schedule& schedule_for(int64_t batch);
  const schedule::Partition& partition() const;
  // Mean over the steps (the first left out when there are more) of 1 − busy / step on this
  // rank: busy the union of its compute instructions' spans (F, B, W), step from the step's
  // first instruction to the end of ReduceGrads; device time on a GPU (it waits for the device
  // to finish the steps run so far), host time on the CPU.
  double measured_bubble() const;
  int pipeline_rank() const;
  int stages() const;
  // Collective over the world: every rank's spans and memory go to rank 0, which writes one
  // Chrome-trace JSON with one track per rank (on GPUs device times: each rank's on its own host
  // clock, aligned at its steps' starts). Returns the per-rank measured bubble fractions (on
  // every rank).
  std::vector<double> write_trace(const std::string& path);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cai::parallel
