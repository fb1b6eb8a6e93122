// Training checkpoints that any layout can resume and timm can load.
//
//   DIR/step-000000123/model.safetensors           the full model under timm's names (fp32, or
//                     (model-0000k-of-0000K.*      bf16/fp16 on export), sharded by size with a
//                      + model.safetensors.index.json)  Hugging Face index beyond max_shard_bytes
//   DIR/step-000000123/optimizer.safetensors       the full optimizer state ("<param>.<slot>")
//   DIR/step-000000123/trainer_state.json          epoch, step, LR scheduler, loss scaler, the
//                                                  layout and versions that wrote it
//   DIR/latest                                     the newest complete checkpoint's name
//
// Every state is gathered to full shapes first (Plugin::full_model_state / full_optimizer_state),
// so a checkpoint does not depend on the layout that wrote it: loading cuts each rank's part
// (tensor shards, ZeRO shards, pipeline stages) for the current layout. Saves are atomic: the
// directory is written under a temporary name, fsync'd and renamed; `latest` is replaced by a
// rename; keep_last removes older checkpoints only after the new one is complete, so a job killed
// during a save leaves the previous checkpoint loadable. Rank 0 writes; the others wait.
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "cai/checkpoint/safetensors.h"
#include "cai/optim/lr_scheduler.h"
#include "cai/train/trainer.h"

namespace cai::checkpoint {

struct CheckpointConfig {
  std::string dir;
  int64_t every_steps = 0, every_epochs = 0;  // 0: never (by that measure)
  int64_t keep_last = 0;                      // 0: keep all
  int64_t max_shard_bytes = int64_t{5} << 30;
  DType export_dtype = DType::F32;  // model weights; bf16/fp16 for a lighter export
  std::string layout;               // recorded in trainer_state.json, e.g. "dp 2 × pp 1 × tp 2"
};

// Where training stands (trainer_state.json).
struct TrainingState {
  int64_t epoch = 0;          // the epoch to continue in
  int64_t step_in_epoch = 0;  // optimizer steps of that epoch already done
  int64_t global_step = 0;
  int64_t scheduler_last = 0;  // LRScheduler::last()
  std::vector<double> scaler;  // DynamicGradScaler::state(); empty without fp16
  std::string layout, version;
};

// Collective: gathers the model and optimizer states and writes DIR/step-<global_step>.
// Returns the checkpoint's directory.
std::string save_checkpoint(const CheckpointConfig& cfg, train::Trainer& trainer,
                            optim::LRScheduler* scheduler, const TrainingState& state);

struct Checkpoint {
  std::string path;
  std::map<std::string, Tensor> model, optimizer;
  TrainingState state;
};
// DIR's newest complete checkpoint (from DIR/latest), or a checkpoint directory itself. Errors
// name the file and what was wrong.
std::string resolve_checkpoint(const std::string& dir_or_checkpoint);
Checkpoint load_checkpoint(const std::string& path);

// Full weights into a model built for any layout, before its plugin's setup(): each parameter
// gets its part of the full tensor. Names and full shapes must match (errors name the tensor);
// parameters in `skip` keep their values (e.g. a head of another class count); a tensor the
// model does not have is an error unless `allow_unexpected`.
void load_model_state(nn::ViT& model, const std::map<std::string, Tensor>& full,
                      const std::set<std::string>& skip = {}, bool allow_unexpected = false);

// Saves every `every_steps` optimizer steps and/or at the end of every `every_epochs` epochs.
class CheckpointHook : public train::Hook {
 public:
  CheckpointHook(CheckpointConfig cfg, optim::LRScheduler* scheduler);
  void after_step(train::Trainer& t, const train::StepInfo& s) override;
  void after_epoch(train::Trainer& t, const train::EpochInfo& e) override;
  bool needs_values(const train::Trainer&, const train::StepInfo&) const override { return false; }

 private:
  CheckpointConfig cfg_;
  optim::LRScheduler* scheduler_;
};

}  // namespace cai::checkpoint
