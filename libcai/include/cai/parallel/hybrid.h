// Hybrid parallelism (Colossal-AI's HybridParallelPlugin): tensor × pipeline × data parallel on
// the process mesh dp × pp × tp (tensor-parallel ranks consecutive, then pipeline stages, data
// parallelism outermost). It builds the tensor-parallel group (hand tensor_parallel() to the ViT
// constructor so its layers are built split), then runs the pipeline executor (pp > 1) or data
// parallelism / ZeRO over the data-parallel group (pp = 1) on this rank's shards, and does what
// neither knows about tensor parallelism: global-norm clipping that counts every parameter once,
// metrics counted once per tensor-parallel group, overflow agreed over every rank, and gathering
// the full timm-named model state from any layout.
// ZeRO: stages 0-3 with pp = 1 (over dp, on the tp-sharded parameters); 0 or 1 with pp > 1.
#pragma once
#include <map>
#include <memory>
#include <string>

#include "cai/dist/communicator.h"
#include "cai/dist/mesh.h"
#include "cai/nn/tensor_parallel.h"
#include "cai/parallel/data_parallel.h"
#include "cai/parallel/pipeline.h"
#include "cai/train/trainer.h"

namespace cai::parallel {

struct HybridParallelConfig {
  int tp_size = 1, pp_size = 1;
  std::string tp_mode = "1d";  // 1d | 2d | 2.5d | 3d
  int tp_depth = 1;            // 2.5d: the depth d (tp_size / d a square)
  bool sequence_parallel = false;
  bool pipeline_executor = false;  // the pipeline executor even with pp 1 (it records traces)
  PipelineConfig pipeline;         // pp_size > 1 (its `dp` member is replaced by `dp` below)
  DataParallelConfig dp;
};

class HybridParallelPlugin : public train::Plugin {
 public:
  // world: every process (an MPI communicator for CPU parameters, NCCL for GPU ones); its size
  // must be divisible by tp_size × pp_size. Collective: every rank constructs it.
  HybridParallelPlugin(dist::Communicator& world, HybridParallelConfig cfg);
  ~HybridParallelPlugin() override;

  const dist::ProcessMesh& mesh() const;
  dist::MeshCoord coord() const;
  // The tensor-parallel context the model must be built with (null when tp_size is 1).
  std::shared_ptr<nn::TensorParallel> tensor_parallel() const;
  PipelinePlugin* pipeline();           // null when pp_size is 1
  DataParallelPlugin* data_parallel();  // null when pp_size > 1

  std::string name() const override;
  int rank() const override;
  int world_size() const override;
  void setup(nn::ViT& model) override;
  std::vector<nn::Parameter*> optimizer_parameters(nn::ViT& model) override;
  train::StepMetrics forward_backward(nn::ViT& model, const std::vector<data::Batch>& batches,
                                      float weight, const train::Criterion& crit,
                                      const nn::ForwardCtx& step_ctx) override;
  train::StepMetrics eval_batch(nn::ViT& model, const data::Batch& batch) override;
  const nn::LayerHooks* train_hooks(bool last_micro_batch) override;
  const nn::LayerHooks* eval_hooks() override;
  void sync_gradients(nn::ViT& model) override;
  void finish_gradients(nn::ViT& model) override;
  Tensor clip_grad_norm(optim::Optimizer& opt, double max_norm) override;
  void optimizer_step(optim::Optimizer& opt) override;
  void zero_grad(nn::ViT& model, optim::Optimizer& opt) override;
  double all_reduce_sum(double v) override;
  double all_reduce_max(double v) override;

  // Collective over the world: the full model state under timm's names (CPU fp32 tensors of the
  // full shapes), gathered from tensor-parallel shards, pipeline stages and ZeRO-3 shards. Every
  // rank receives it.
  std::map<std::string, Tensor> full_state(nn::ViT& model);
  std::map<std::string, Tensor> full_model_state(nn::ViT& model) override {
    return full_state(model);
  }
  // The optimizer's state gathered the same way (ZeRO shards over dp, then tp shards, then the
  // owning stage), and its inverse: this rank's part of a full state, whatever layout saved it.
  std::map<std::string, Tensor> full_optimizer_state(nn::ViT& model,
                                                     optim::Optimizer& opt) override;
  void load_optimizer_state(nn::ViT& model, optim::Optimizer& opt,
                            const std::map<std::string, Tensor>& full) override;
  // Per-rank checkpoints: of each parameter of this rank's stage, the tensor-parallel part's
  // lowest holder (whole parameters: tp rank 0) writes, and the dp ranks split it by ZeRO's cut
  // (dp rank r: elements shard_range(n, r, dp)), whatever the ZeRO stage: with ZeRO that is the
  // rank's own shard of the master weights and optimizer state, without it a slice of the copy,
  // so every rank writes about 1/world of the bytes. "step" is world rank 0's.
  std::vector<train::OwnedSlice> owned_state(nn::ViT& model, optim::Optimizer& opt) override;
  void barrier() override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cai::parallel
