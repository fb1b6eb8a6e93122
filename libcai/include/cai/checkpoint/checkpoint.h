// Training checkpoints that any layout can resume and timm can load. Two formats, one reader:
//
// Consolidated (default; what timm and Hugging Face load as they are):
//   DIR/step-000000123/model.safetensors           the full model under timm's names (fp32, or
//                     (model-0000k-of-0000K.*      bf16/fp16 on export), sharded by size with a
//                      + model.safetensors.index.json)  Hugging Face index beyond max_shard_bytes
//   DIR/step-000000123/optimizer.safetensors       the full optimizer state ("<param>.<slot>")
//   DIR/step-000000123/trainer_state.json          epoch, step, LR scheduler, loss scaler, the
//                                                  layout and versions that wrote it
// Every state is gathered to full shapes first (Plugin::full_model_state / full_optimizer_state)
// and rank 0 writes; the others wait.
//
// Per-rank (CheckpointConfig::per_rank, Colossal-AI's save_model(shard=True) / PyTorch DCP):
// no gathering; every rank writes what it owns (Plugin::owned_state: its tensor-parallel part,
// pipeline stage and ZeRO shard, fp32) in parallel:
//   DIR/step-000000123/model-rank0000r-of-0000W.safetensors      1-D slices, keyed by timm name
//   DIR/step-000000123/optimizer-rank0000r-of-0000W.safetensors  the same for "<param>.<slot>"
//   DIR/step-000000123/checkpoint.index.json   per tensor: its full shape and its slices (file,
//                      tensor-parallel cut, element range), the world size and layout
//   DIR/step-000000123/trainer_state.json      as above
// Loading puts each tensor back together from its slices (nn::unshard), so both formats come
// out as full tensors, and load_model_state / Plugin::load_optimizer_state cut this rank's part
// for the current layout: resharding has one code path whatever wrote the checkpoint.
// export_consolidated() turns either format into timm-loadable weights.
//
//   DIR/latest                                     the newest complete checkpoint's name
//   DIR/run.json                                   the run that owns DIR (RunRecord)
//   DIR/.lock                                      flock'd by the job using DIR (DirLock)
//
// Saves are atomic: the directory is written under "<name>.tmp", every file fsync'd (per-rank:
// each rank its own, after which ranks agree that all succeeded), trainer_state.json last, then
// renamed; `latest` is replaced by a rename (the new file fsync'd before it, the directory
// after); keep_last removes older checkpoints only after the new one is complete, so a job killed
// during a save leaves the previous checkpoint loadable and nothing that looks complete. A failed
// save throws on every rank and removes the temporary.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

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
  bool per_rank = false;            // every rank writes its own shard files (see above)
  // The run saving (rank 0's; claim_run_dir's): recorded in each trainer_state.json. keep_last
  // removes only checkpoints of this run, and none while DIR/run.json names another run.
  std::string run_id;
};

// Where training stands (trainer_state.json).
struct TrainingState {
  int64_t epoch = 0;          // the epoch to continue in
  int64_t step_in_epoch = 0;  // optimizer steps of that epoch already done
  int64_t global_step = 0;
  int64_t scheduler_last = 0;  // LRScheduler::last()
  std::vector<double> scaler;  // DynamicGradScaler::state(); empty without fp16
  std::string layout, version;
  std::string run_id;  // the run that saved it ("" before run records)
};

// trainer_state.json's text as load_checkpoint reads it (`path` names it in errors): counters
// that are integers >= 0, loss_scaler a list of numbers (DynamicGradScaler::load_state checks
// its values against the run's scaler settings). Anything else is a cai::Error.
TrainingState parse_training_state(const std::string& text, const std::string& path);

// Collective: writes DIR/step-<global_step> (consolidated: gathered, rank 0 writes; per_rank:
// every rank writes its part). Returns the checkpoint's directory.
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
// Either format, as full CPU fp32 tensors. Errors name the file and what was expected (a
// truncated or missing shard, an index naming a file that is not there, slices that do not
// cover a tensor or disagree with its shape).
Checkpoint load_checkpoint(const std::string& path);
// Model weights (full, CPU) from a checkpoint of either format or its parent directory, a
// safetensors file, or a Hugging Face directory (model.safetensors or an index).
std::map<std::string, Tensor> load_weights(const std::string& path);
// The model weights of a checkpoint of either format (or a safetensors file / Hugging Face
// directory) written as timm-loadable safetensors into `out_dir` (atomically; it must not exist):
// model.safetensors, or shards of max_shard_bytes with model.safetensors.index.json.
void export_consolidated(const std::string& checkpoint, const std::string& out_dir,
                         int64_t max_shard_bytes = int64_t{5} << 30, DType dtype = DType::F32);

// Full weights into a model built for any layout, before its plugin's setup(): each parameter
// gets its part of the full tensor. Names and full shapes must match (errors name the tensor);
// parameters in `skip` keep their values (e.g. a head of another class count); a tensor the
// model does not have is an error unless `allow_unexpected`.
// `origin` names the weights in errors (e.g. the checkpoint's path).
void load_model_state(nn::ViT& model, const std::map<std::string, Tensor>& full,
                      const std::set<std::string>& skip = {}, bool allow_unexpected = false,
                      const std::string& origin = "the weights");

// --- Run identity ------------------------------------------------------------------------------
// DIR/run.json records the run that owns a checkpoint directory. A new run is refused a
// directory holding another run's step directories (unless `overwrite`), keep_last
// deletes only the owner's checkpoints, and DIR/.lock keeps a second live job out.
struct RunRecord {
  std::string run_id;       // new_run_id()
  std::string config_hash;  // text_hash() of the resolved config's canonical text
  int64_t seed = 0;
  std::string model;  // a model name, or a description of a custom one
  int world_size = 1, dp = 1, pp = 1, tp = 1, zero_stage = 0;
  std::string layout;   // e.g. "dp 2 × pp 1 × tp 2"
  std::string started;  // UTC, ISO 8601 (claim_run_dir: now, when empty)
  std::string host;     // claim_run_dir: this host, when empty
  int64_t pid = 0;      // claim_run_dir: this process, when 0
  struct Resume {
    std::string time, checkpoint, config_hash, layout;
  };
  std::vector<Resume> resumed;  // each --resume that continued the run, oldest first
};

std::string new_run_id();                        // "<UTC time>-<16 random hex digits>"
std::string utc_now();                           // "2026-01-31T12:00:00Z"
std::string text_hash(const std::string& text);  // 16 hex digits (FNV-1a 64)
// One line for messages: run id, model, seed, config hash, layout, start time and host.
std::string describe(const RunRecord& r);

// DIR/run.json, or nullopt when there is none; a record that does not parse is an error naming it.
std::optional<RunRecord> read_run_record(const std::string& dir);

// Rank 0, under the DirLock, before training: makes `dir` this run's and returns the record that
// owns it now (its run_id goes into CheckpointConfig::run_id).
//  - A new run (`resume_from` empty) into a directory holding step directories (step-*) is
//    refused with an Error naming both runs (the record's, or "a run without a run record") and
//    the ways on (--resume, another checkpoint.dir, checkpoint.overwrite = true); nothing in the
//    directory changes. With `overwrite`, the step directories and `latest` are removed first,
//    then `run` becomes the record. A record without step directories (a run that ended before
//    its first save) is replaced.
//  - A resume from a checkpoint inside `dir` continues the directory's run: its record stays
//    (with this resume appended); a directory without one (written before run records) gets
//    one. A resume from elsewhere continues the resumed checkpoint's run (its run id): into a
//    directory owned by that run, or an empty one; another run's directory is refused as above.
RunRecord claim_run_dir(const std::string& dir, RunRecord run, const std::string& resume_from,
                        bool overwrite);

// An exclusive flock on DIR/.lock (created with DIR if missing), held by one job's rank 0 while
// it runs, holding its pid, host and start time. A second holder is refused with an Error naming
// the first's pid and host. Released on destruction, and by the kernel when the process dies.
class DirLock {
 public:
  DirLock() = default;
  explicit DirLock(const std::string& dir);
  ~DirLock();
  DirLock(DirLock&& o) noexcept;
  DirLock& operator=(DirLock&& o) noexcept;
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  bool held() const { return fd_ >= 0; }
  void release();

 private:
  int fd_ = -1;
};

// Saves every `every_steps` optimizer steps and/or at the end of every `every_epochs` epochs.
class CheckpointHook : public train::Hook {
 public:
  CheckpointHook(CheckpointConfig cfg, optim::LRScheduler* scheduler);
  void after_step(train::Trainer& t, const train::StepInfo& s) override;
  void after_epoch(train::Trainer& t, const train::EpochInfo& e) override;
  // A run stopped on request (preemption) saves where it stopped, unless this boundary's
  // after_step / after_epoch just did. last_saved() then names that checkpoint.
  void on_stop(train::Trainer& t, const train::StopPoint& p) override;
  bool needs_values(const train::Trainer&, const train::StepInfo&) const override { return false; }
  const std::string& last_saved() const { return last_path_; }

 private:
  void save(train::Trainer& t, const TrainingState& st);
  CheckpointConfig cfg_;
  optim::LRScheduler* scheduler_;
  int64_t last_step_ = -1;  // global step of the last save by this hook
  std::string last_path_;
};

}  // namespace cai::checkpoint
