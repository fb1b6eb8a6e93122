// The booster/trainer loop (Colossal-AI's shape): boost(model, optimizer, criterion, loader,
// scheduler) wires a Plugin (the parallel strategy: single process now; DDP, ZeRO and pipeline
// plug in here), then Trainer::fit runs epochs of steps with gradient accumulation, clipping,
// evaluation each epoch and hooks (LR scheduler, progress, epoch log, metrics file).
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cai/data/data.h"
#include "cai/nn/vit.h"
#include "cai/optim/grad_scaler.h"
#include "cai/optim/lr_scheduler.h"
#include "cai/optim/optimizer.h"

namespace cai::train {

// Cross-entropy with label smoothing, averaged over the global batch.
struct Criterion {
  float label_smoothing = 0.0f;
};

// What the hooks see after every optimizer step. The counters, lr, loss_scale, skipped and
// images are always set. loss, accuracy and grad_norm are values of this very step, but they live
// on the device until read: the trainer reads them (one device-to-host copy of every step's sums
// since the last read, then a reduction over the ranks) only at the steps where some hook's
// needs_values() asks for them, and has_values says whether it did. Unread, they are NaN.
struct StepInfo {
  int64_t epoch = 0, num_epochs = 0;
  int64_t step_in_epoch = 0, steps_per_epoch = 0;  // optimizer steps
  int64_t global_step = 0;
  bool has_values = false;    // loss, accuracy and grad_norm were read for this step
  double loss = 0;            // mean loss of this step's global batch
  double accuracy = 0;        // top-1 on this step's training samples
  double lr = 0;              // lr used by this step
  double grad_norm = 0;       // before clipping (0 when not computed)
  double loss_scale = 0;      // fp16: the loss scale this step used (0 otherwise)
  bool skipped = false;       // fp16: the step overflowed and the optimizer step was skipped
  int64_t images = 0;         // images this step, over all ranks
  double images_per_sec = 0;  // over the epoch so far
  // The model FLOP/s that images_per_sec stands for (3 × ViTConfig::forward_flops an image, all
  // ranks; recompute not counted), in TFLOP/s, and their share of TrainerConfig::peak_tflops
  // (-1 when no peak is known).
  double tflops = 0, mfu = -1;
  double epoch_seconds = 0;  // elapsed in this epoch (at a read step: once the step has run)
  // On a GPU with NVML, at a read step: rank 0's GPU's energy since train() began (joules; -1
  // when not read), its SM clock and power draw, from the newest reading the sensor thread has
  // done (SensorThread): the one asked for at global step energy_step (this step or an earlier
  // read step), taken energy_seconds after training began.
  double energy_j = -1, sm_mhz = 0, power_w = 0;
  int64_t energy_step = -1;
  double energy_seconds = 0;
  // The trainer thread's time in this step by phase, in order (milliseconds; "hooks" is the
  // previous step's hooks): where the host spends a step, beside the kernel profile.
  std::vector<std::pair<const char*, double>> host_ms;
  // On a GPU: the background task that staged this step's batches (pinned copy, issue of the
  // device copies), by part, in milliseconds; it overlaps the step before.
  std::vector<std::pair<const char*, double>> staging_ms;
};

struct EpochInfo {
  int64_t epoch = 0, num_epochs = 0, global_step = 0;
  double train_loss = 0, train_accuracy = 0;
  double eval_loss = -1, eval_accuracy = -1;  // -1 when there is no evaluation set
  double seconds = 0, images_per_sec = 0, lr = 0;
  double tflops = 0, mfu = -1;  // as StepInfo's, over the epoch
};

// Top-1 correct predictions of logits [B, K] against int32 labels [B], and the sum of a
// tensor's elements (in double): the metrics the trainer and plugins accumulate.
int64_t count_correct(const Tensor& logits, const Tensor& labels);
double sum_of(const Tensor& t);
// Every parameter of the optimizer's groups.
std::vector<nn::Parameter*> optimizer_params(const optim::Optimizer& opt);

// This rank's sums over a step's (or an evaluation batch's) samples. `sums` is fp32 [2] (loss
// sum, correct top-1 predictions) on the model's device, accumulated there by add() without a
// host read; undefined when this rank computed no loss (a pipeline's non-last stages).
struct StepMetrics {
  Tensor sums;
  double samples = 0;
  // Adds a batch: its per-sample losses (ops::cross_entropy_fwd) and its logits [B, K] against
  // the int32 labels [B].
  void add(const Tensor& losses, const Tensor& logits, const Tensor& labels);
};

struct EvalResult {
  double loss = 0, accuracy = 0;
  int64_t samples = 0;
};

class Trainer;

// Where a run stopped on request (preemption: SIGTERM / SIGUSR1 in vit_train): every rank stops
// at the same step boundary, after the optimizer step of `global_step` (the state a checkpoint
// records: resuming continues in `epoch` after its first `step_in_epoch` steps).
struct StopPoint {
  int reason = 0;  // what was asked: in vit_train the signal number (the largest over the ranks)
  int64_t epoch = 0, step_in_epoch = 0, global_step = 0;
};
// "SIGTERM", "SIGUSR1", ... for a StopPoint's reason ("signal N" for others).
std::string stop_reason_name(int reason);

class Hook {
 public:
  virtual ~Hook() = default;
  virtual void before_train(Trainer&) {}
  virtual void before_epoch(Trainer&, int64_t /*epoch*/) {}
  // Whether after_step() at this step needs loss, accuracy and grad_norm (counters of `s` set,
  // values not yet). Reading them waits for the device and reduces over the ranks, so the answer
  // must depend only on the counters, never on the rank or on time. The default, true, reads
  // every step; hooks that print or write every n steps say so to keep the step asynchronous.
  virtual bool needs_values(const Trainer&, const StepInfo&) const { return true; }
  virtual void after_step(Trainer&, const StepInfo&) {}
  virtual void after_epoch(Trainer&, const EpochInfo&) {}
  virtual void after_train(Trainer&) {}
  // The run stops here on request (TrainerConfig::stop_requested), on every rank, after this
  // boundary's after_step / after_epoch: save what a resume needs (collective hooks may
  // communicate: every rank calls it). after_train is not called after it.
  virtual void on_stop(Trainer&, const StopPoint&) {}
};

// A piece of a tensor that one rank writes in a per-rank checkpoint: elements [begin, end) of the
// row-major flattened tensor-parallel part `spec` of the full tensor `name` (spec without cuts:
// the whole tensor). Loading puts the pieces back together with nn::unshard and cuts them for
// the new layout the way full states are cut.
struct OwnedSlice {
  std::string name;        // timm's name; optimizer state "<param>.<slot>" or "step"
  bool optimizer = false;  // optimizer state (else a model weight)
  nn::ShardSpec spec;      // which tensor-parallel part
  Shape full;              // the full tensor's shape
  int64_t begin = 0, end = 0;
  Tensor data;  // CPU fp32, [end - begin]
};

// What a parallel strategy changes in a step. The default is one process. Call setup() before
// building the optimizer, over optimizer_parameters() (ZeRO shards them).
class Plugin {
 public:
  virtual ~Plugin() = default;
  virtual std::string name() const { return "single-process"; }
  virtual int rank() const { return 0; }
  virtual int world_size() const { return 1; }
  // Once, before training: e.g. broadcast parameters from rank 0, build buckets and shards.
  virtual void setup(nn::ViT&) {}
  // The parameters the optimizer updates on this rank.
  virtual std::vector<nn::Parameter*> optimizer_parameters(nn::ViT& model) {
    return model.parameters();
  }
  // Forward and backward of one optimizer step's batches (gradient accumulation: several),
  // each sample's loss weighted by `weight` (1 / samples in the global step). step_ctx carries
  // the training flag, seed and step; sample offsets come from the batches. The default runs the
  // whole model per batch with train_hooks(); the pipeline executor runs its schedule instead.
  virtual StepMetrics forward_backward(nn::ViT& model, const std::vector<data::Batch>& batches,
                                       float weight, const Criterion& crit,
                                       const nn::ForwardCtx& step_ctx);
  // Evaluation forward of one batch (no label smoothing).
  virtual StepMetrics eval_batch(nn::ViT& model, const data::Batch& batch);
  // Hooks for a training micro-batch (last: the final micro-batch of the step), and for
  // evaluation forwards. Null: none.
  virtual const nn::LayerHooks* train_hooks(bool /*last_micro_batch*/) { return nullptr; }
  virtual const nn::LayerHooks* eval_hooks() { return nullptr; }
  // After the backward of every micro-batch of a step, before clipping.
  virtual void sync_gradients(nn::ViT&) {}
  // Makes the gradient tensors final where sync_gradients left their sum over the ranks to the
  // clip and the optimizer step that read them (DataParallelPlugin's copy-engine exchange):
  // whoever reads the gradients otherwise (the fp16 overflow check) calls it first.
  virtual void finish_gradients(nn::ViT&) {}
  // Global-norm clipping over what this rank's optimizer sees; returns the global norm before
  // clipping as a 1-element fp32 tensor (optim::clip_grad_norm_async: on the device and unread
  // when no reduction over ranks is needed, else after one host read). Where the sum of squares
  // needs no reduction over ranks and the parameters are on a GPU, the factor is applied by
  // opt's next step (Optimizer::defer_clip), which optimizer_step runs next: the gradients are
  // then left unscaled.
  virtual Tensor clip_grad_norm(optim::Optimizer& opt, double max_norm);
  virtual void optimizer_step(optim::Optimizer& opt) { opt.step(); }
  virtual void zero_grad(nn::ViT&, optim::Optimizer& opt) { opt.zero_grad(); }
  // Sum of a metric over the data-parallel ranks.
  virtual double all_reduce_sum(double v) { return v; }
  // Maximum over every rank whose gradients differ (data-parallel shards, pipeline stages,
  // tensor-parallel shards): how ranks agree on an fp16 overflow.
  virtual double all_reduce_max(double v) { return v; }

  // Checkpoints (collective; every rank receives the result): the full model under timm's names
  // and the full optimizer state ("<param>.<slot>" in the parameter's full shape, and "step"),
  // CPU fp32, gathered from whatever this plugin shards; load_optimizer_state() cuts this rank's
  // part of a full state (any layout can load what any layout saved). The defaults are the
  // single process's; sharding plugins override them.
  virtual std::map<std::string, Tensor> full_model_state(nn::ViT& model);
  virtual std::map<std::string, Tensor> full_optimizer_state(nn::ViT& model, optim::Optimizer& opt);
  virtual void load_optimizer_state(nn::ViT& model, optim::Optimizer& opt,
                                    const std::map<std::string, Tensor>& full);
  // Per-rank (sharded) checkpoints, without communication: what this rank writes, every element
  // of the model and the optimizer state written by exactly one rank over the world. The
  // default (one process) owns everything whole.
  virtual std::vector<OwnedSlice> owned_state(nn::ViT& model, optim::Optimizer& opt);
  virtual void barrier() {}
};

struct TrainerConfig {
  int64_t num_epochs = 1;
  int64_t gradient_accumulation = 1;  // batches per optimizer step
  double clip_grad_norm = 0.0;        // 0: off
  uint64_t seed = 42;                 // dropout / drop-path masks
  int64_t max_steps_per_epoch = 0;    // 0: the whole loader (a cap for smoke runs and tests)
  // Mixed precision: the compute dtype set on the model (fp32, bf16 or fp16; master weights and
  // gradients stay fp32). fp16 scales the loss with a DynamicGradScaler configured by
  // `grad_scaler`, skipping (and logging) steps whose gradients overflow.
  DType precision = DType::F32;
  // The job's dense peak in TFLOP/s (every device of it, at `precision`): StepInfo::mfu and
  // EpochInfo::mfu divide the model FLOP/s by it; 0 = unknown (no MFU reported).
  double peak_tflops = 0;
  optim::GradScalerConfig grad_scaler;
  // Stopping on request (preemption). When set (on every rank, or on none: the check is
  // collective), fit() asks it at step boundaries: after every `stop_check_interval`-th optimizer
  // step (by global step) that does not end an epoch, and after each epoch's evaluation but the
  // last. The ranks take the maximum of their answers (one all_reduce_max of a scalar over the
  // world), so a request that reached any rank stops every rank at the same boundary; a positive
  // maximum ends fit() there after the hooks' on_stop (stopped() says where). The run's last
  // boundary is its end: a request that arrives in the last step finishes the run as usual.
  std::function<int()> stop_requested;
  int64_t stop_check_interval = 1;
};

class Trainer {
 public:
  Trainer(nn::ViT& model, optim::Optimizer& opt, Criterion criterion, data::DataLoader& train,
          data::DataLoader* eval, std::shared_ptr<Plugin> plugin, TrainerConfig cfg);

  void add_hook(std::shared_ptr<Hook> hook) { hooks_.push_back(std::move(hook)); }
  // Runs epochs [start_epoch, num_epochs), or from where resume_at() put it.
  void fit(int64_t start_epoch = 0);
  // Resuming a checkpoint: the next fit() starts in `epoch` after its first `step_in_epoch`
  // optimizer steps (their batches are drawn and skipped, so the data order is the
  // uninterrupted run's) with the global step counter at `global_step` (masks are keyed by it).
  // `from` names the checkpoint for the hooks (the metrics file's resume record).
  void resume_at(int64_t epoch, int64_t step_in_epoch, int64_t global_step, std::string from = {});
  // Where resume_at() put this trainer (null for a fresh run): hooks that keep files across the
  // runs of one training (MetricsFileHook) continue them instead of starting anew.
  struct ResumePoint {
    int64_t epoch = 0, step_in_epoch = 0, global_step = 0;
    std::string from;
  };
  const ResumePoint* resumed() const { return resumed_ ? &*resumed_ : nullptr; }
  // Before fit(): the optimizer steps it will run, from where resume_at() put it (else from the
  // start): 0 when a resumed run had finished all num_epochs.
  int64_t steps_left() const;
  EvalResult evaluate(data::DataLoader& loader);

  nn::ViT& model() { return model_; }
  optim::Optimizer& optimizer() { return opt_; }
  Plugin& plugin() { return *plugin_; }
  const TrainerConfig& config() const { return cfg_; }
  int64_t steps_per_epoch() const;
  int64_t global_step() const { return global_step_; }
  const std::vector<EpochInfo>& history() const { return history_; }
  // The fp16 loss scaler (null for fp32 and bf16) and the steps it skipped.
  optim::DynamicGradScaler* grad_scaler() { return scaler_ ? scaler_.get() : nullptr; }
  int64_t skipped_steps() const { return skipped_steps_; }
  // Where fit() stopped on request (TrainerConfig::stop_requested); null when it ran to the end.
  const StopPoint* stopped() const { return stopped_ ? &*stopped_ : nullptr; }

 private:
  nn::ViT& model_;
  optim::Optimizer& opt_;
  Criterion crit_;
  data::DataLoader& train_;
  data::DataLoader* eval_;
  std::shared_ptr<Plugin> plugin_;
  TrainerConfig cfg_;
  std::vector<std::shared_ptr<Hook>> hooks_;
  // The epoch's per-step values [steps, 3] (loss sum, correct, grad norm) where the model lives,
  // their host copy up to read_, and the epoch totals over the ranks up to read_.
  struct StepValues;
  void stage_values(StepValues& v, int64_t upto);
  // `phase` (when given) is called after the wait for the device and after the reduction over
  // the ranks, with those parts' names (the trainer's per-phase host times).
  void read_values(StepValues& v, int64_t upto, int64_t epoch, StepInfo* info,
                   const std::function<void(const char*)>& phase = {});
  int64_t global_step_ = 0;
  int64_t resume_epoch_ = -1, resume_step_ = 0;
  std::optional<ResumePoint> resumed_;
  std::vector<EpochInfo> history_;
  std::unique_ptr<optim::DynamicGradScaler> scaler_;
  int64_t skipped_steps_ = 0;
  // The collective stop check at a boundary; true when every rank stops there.
  bool stop_here(int64_t epoch, int64_t step_in_epoch, bool epoch_end);
  std::optional<StopPoint> stopped_;
};

// Colossal-AI's Booster: holds the plugin and boosts the training objects into a Trainer.
class Booster {
 public:
  explicit Booster(std::shared_ptr<Plugin> plugin = nullptr);
  std::unique_ptr<Trainer> boost(nn::ViT& model, optim::Optimizer& opt, Criterion criterion,
                                 data::DataLoader& train, data::DataLoader* eval,
                                 optim::LRScheduler* scheduler, bool schedule_by_epoch,
                                 TrainerConfig cfg);
  Plugin& plugin() { return *plugin_; }

 private:
  std::shared_ptr<Plugin> plugin_;
};

// --- hooks ------------------------------------------------------------------------------------

// Steps the LR scheduler after every optimizer step, or after every epoch.
class LRSchedulerHook : public Hook {
 public:
  LRSchedulerHook(optim::LRScheduler& s, bool by_epoch) : s_(s), by_epoch_(by_epoch) {}
  bool needs_values(const Trainer&, const StepInfo&) const override { return false; }
  void after_step(Trainer&, const StepInfo&) override;
  void after_epoch(Trainer&, const EpochInfo&) override;

 private:
  optim::LRScheduler& s_;
  bool by_epoch_;
};

// A progress bar on a terminal (epoch, step/total, img/s, loss, lr, ETA), redrawn in place at
// most every 0.1 s; plain lines every `interval` steps (0: 10 per epoch) otherwise, and always at
// an epoch's last step. Loss and accuracy are read only at those steps (on a terminal at every
// interval = steps / 50 by default); the bar shows the latest read ones. Prints on rank 0 only.
// `terminal` decides bar or lines: see stdout_is_terminal().
class ProgressHook : public Hook {
 public:
  explicit ProgressHook(bool terminal, int64_t interval = 0);
  // Every rank takes rank 0's `terminal` (the one that prints): the steps that read values must
  // be the same on every rank, and a rank's stdout may be a terminal where rank 0's is not.
  void before_train(Trainer&) override;
  bool needs_values(const Trainer&, const StepInfo&) const override;
  void after_step(Trainer&, const StepInfo&) override;
  void after_epoch(Trainer&, const EpochInfo&) override;

 private:
  int64_t every(const StepInfo& s) const;
  bool terminal_;
  int64_t interval_;
  double last_draw_ = -1;
  double loss_ = NAN, accuracy_ = NAN;  // the latest values read
};

// Whether the progress output goes to a terminal: CAI_STDOUT_TTY (set by `colossalai run` for
// its ranks to "1" or "0": whether the launcher's own stdout is a terminal, since a rank's stdout
// is a pipe or pty of mpirun's whatever the user's is) when set, else isatty(stdout).
bool stdout_is_terminal();

// One log line per epoch: train loss/accuracy, eval loss/accuracy, time, img/s, lr.
class LogMetricByEpochHook : public Hook {
 public:
  bool needs_values(const Trainer&, const StepInfo&) const override { return false; }
  void after_epoch(Trainer&, const EpochInfo&) override;
};

// JSON lines for plotting: {"type": "step", ...} every `interval` global steps (loss, accuracy,
// lr, img/s, seconds into the epoch, grad_norm when clipping; read at those steps only),
// {"type": "epoch", ...} after each epoch. Written by rank 0. The file is truncated at the start
// of a fresh training; a resumed trainer (Trainer::resumed()) appends to it, first
// {"type": "resume", "epoch", "step_in_epoch", "step", "checkpoint"}: the epoch it continues in
// (from 1, as step records count), the optimizer steps of that epoch already done, the global
// step, and the checkpoint's name when resume_at() was given one. A run stopped on request ends
// with {"type": "preempted", "epoch", "step_in_epoch", "step", "signal"} (StopPoint, the signal
// by name). With a MetricsRunInfo, every run (fresh, and each resumed one after its "resume"
// record) first writes {"type": "run", "processes", "dp", "pp", "tp", "zero_stage",
// "tensor_mode", "batch_per_process" (samples per data-parallel rank per micro-batch: the
// config's train.batch_size), "gradient_accumulation", "global_batch" (samples per optimizer
// step: batch_per_process × gradient_accumulation × dp), "model", "device", "layout"}: the
// layout the run really had (a resumed run may have another).
struct MetricsRunInfo {
  int processes = 1, dp = 1, pp = 1, tp = 1, zero_stage = 0;
  int64_t batch_per_process = 0;  // per data-parallel rank (the config's train.batch_size)
  int64_t gradient_accumulation = 1;
  std::string tensor_mode = "none", model, device, layout;
};

class MetricsFileHook : public Hook {
 public:
  MetricsFileHook(std::string path, int64_t interval,
                  std::optional<MetricsRunInfo> run = std::nullopt);
  bool needs_values(const Trainer&, const StepInfo& s) const override;
  void before_train(Trainer&) override;
  void after_step(Trainer&, const StepInfo&) override;
  void after_epoch(Trainer&, const EpochInfo&) override;
  void on_stop(Trainer&, const StopPoint&) override;

 private:
  void write(const std::string& line);
  void write_run();
  std::string path_;
  int64_t interval_;
  std::optional<MetricsRunInfo> run_;
};

// The per-kernel GPU table (cai/core/kernel_profile.h) of global steps (start, start + steps]:
// the device is synchronised after step `start` and after the last profiled one, CUPTI records
// every kernel in between, and `path` (Markdown, with path.csv) is written by rank 0, which alone
// profiles. Training goes on unchanged; the two synchronisations cost one step's overlap each.
class KernelProfileHook : public Hook {
 public:
  KernelProfileHook(std::string path, int64_t start, int64_t steps, std::string title);
  bool needs_values(const Trainer&, const StepInfo&) const override { return false; }
  void after_step(Trainer&, const StepInfo&) override;
  void after_train(Trainer&) override;

 private:
  std::string path_, title_;
  int64_t start_, steps_;
  bool running_ = false;
  double t0_ = 0;
  // Per phase, its time in each profiled step (StepInfo::host_ms, StepInfo::staging_ms).
  using Phases = std::vector<std::pair<const char*, std::vector<double>>>;
  Phases host_ms_, staging_ms_;
  double start_ms_ = 0;  // host time of the profile's start (out of the first step's "hooks")
};

std::string format_duration(double seconds);  // "1:02:03" or "2:03"
// "429 TFLOP/s  MFU 43.4%" (the MFU part only when mfu >= 0).
std::string format_rate(double tflops, double mfu);
// The dense peak of one device in TFLOP/s for training at `precision` ("bf16", "fp16", "fp32")
// by its name as the driver reports it: 989 for the H100 / H200 / H800 / GH200 (bf16, fp16; 835
// for their NVL, 756 for their PCIe cards), 148 for the H20, 312 for the A100 / A800; 0 when not
// known (fp32, other devices, the CPU): train.peak_tflops gives it then.
double dense_peak_tflops(const std::string& device_name, const std::string& precision);

}  // namespace cai::train
