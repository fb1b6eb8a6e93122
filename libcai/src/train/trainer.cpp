#include "cai/train/trainer.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "cai/core/error.h"
#include "cai/core/log.h"
#include "cai/ops/ops.h"

namespace cai::train {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Batches come from the loader on the host; the model may live on a GPU.
void to_device(data::Batch& b, Device dev) {
  if (b.images.device() == dev) return;
  b.images = b.images.to(dev);
  b.labels = b.labels.to(dev);
}

}  // namespace

int64_t count_correct(const Tensor& logits, const Tensor& labels) {
  const auto l = logits.to_vector();
  const auto y = labels.to_vector();
  const int64_t b = logits.size(0), k = logits.size(1);
  int64_t correct = 0;
  for (int64_t i = 0; i < b; ++i) {
    int64_t arg = 0;
    for (int64_t j = 1; j < k; ++j)
      if (l[i * k + j] > l[i * k + arg]) arg = j;
    correct += arg == static_cast<int64_t>(y[i]);
  }
  return correct;
}

double sum_of(const Tensor& t) {
  double s = 0;
  for (float v : t.to_vector()) s += v;
  return s;
}

Trainer::Trainer(nn::ViT& model, optim::Optimizer& opt, Criterion criterion,
                 data::DataLoader& train, data::DataLoader* eval, std::shared_ptr<Plugin> plugin,
                 TrainerConfig cfg)
    : model_(model),
      opt_(opt),
      crit_(criterion),
      train_(train),
      eval_(eval),
      plugin_(plugin ? std::move(plugin) : std::make_shared<Plugin>()),
      cfg_(cfg) {
  CAI_CHECK(cfg_.num_epochs >= 1, "[trainer] num_epochs {} must be at least 1", cfg_.num_epochs);
  CAI_CHECK(cfg_.gradient_accumulation >= 1, "[trainer] gradient_accumulation {} must be >= 1",
            cfg_.gradient_accumulation);
  CAI_CHECK(cfg_.clip_grad_norm >= 0, "[trainer] clip_grad_norm {} must be >= 0 (0 = off)",
            cfg_.clip_grad_norm);
  CAI_CHECK(train_.num_batches() > 0, "[trainer] the training loader yields no batch ({})",
            train_.dataset().describe());
  model_.set_compute_dtype(cfg_.precision);
  if (cfg_.precision == DType::F16)
    scaler_ = std::make_unique<optim::DynamicGradScaler>(cfg_.grad_scaler);
}

int64_t Trainer::steps_per_epoch() const {
  int64_t steps =
      (train_.num_batches() + cfg_.gradient_accumulation - 1) / cfg_.gradient_accumulation;
  if (cfg_.max_steps_per_epoch > 0) steps = std::min(steps, cfg_.max_steps_per_epoch);
  return steps;
}

StepMetrics Plugin::forward_backward(nn::ViT& model, const std::vector<data::Batch>& batches,
                                     float weight, const Criterion& crit,
                                     const nn::ForwardCtx& step_ctx) {
  StepMetrics m;
  int64_t offset = 0;  // position of this batch's global batch within the step
  for (size_t i = 0; i < batches.size(); ++i) {
    const data::Batch& b = batches[i];
    nn::ForwardCtx ctx = step_ctx;
    ctx.sample_offset = offset + b.sample_offset;
    offset += b.global_batch_size;
    const nn::LayerHooks* hooks = train_hooks(i + 1 == batches.size());
    std::vector<std::unique_ptr<nn::Cache>> caches;
    Tensor logits = model.forward(b.images, caches, ctx, hooks);
    m.loss_sum += sum_of(ops::cross_entropy_fwd(logits, b.labels, crit.label_smoothing));
    m.correct += static_cast<double>(count_correct(logits, b.labels));
    m.samples += static_cast<double>(b.labels.numel());
    model.backward(ops::cross_entropy_bwd(logits, b.labels, crit.label_smoothing, weight), caches,
                   ctx, hooks);
  }
  return m;
}

StepMetrics Plugin::eval_batch(nn::ViT& model, const data::Batch& b) {
  std::vector<std::unique_ptr<nn::Cache>> caches;
  Tensor logits = model.forward(b.images, caches, nn::ForwardCtx{}, eval_hooks());
  StepMetrics m;
  m.loss_sum = sum_of(ops::cross_entropy_fwd(logits, b.labels, 0.0f));
  m.correct = static_cast<double>(count_correct(logits, b.labels));
  m.samples = static_cast<double>(b.labels.numel());
  return m;
}

std::vector<nn::Parameter*> optimizer_params(const optim::Optimizer& opt) {
  std::vector<nn::Parameter*> ps;
  for (const auto& g : opt.groups()) ps.insert(ps.end(), g.params.begin(), g.params.end());
  return ps;
}

std::map<std::string, Tensor> Plugin::full_model_state(nn::ViT& model) {
  std::map<std::string, Tensor> out;
  for (nn::Parameter* p : model.parameters()) {
    CAI_CHECK(p->value.defined() && !p->shard.sharded(),
              "[checkpoint] {}: the {} plugin cannot gather sharded parameter {}", name(), name(),
              p->name);
    out[p->name] = p->value.to(Device::cpu()).clone();
  }
  return out;
}

std::map<std::string, Tensor> Plugin::full_optimizer_state(nn::ViT&, optim::Optimizer& opt) {
  std::map<std::string, Tensor> out;
  for (auto& [k, v] : opt.state_dict()) out[k] = v.to(Device::cpu());
  return out;
}

void Plugin::load_optimizer_state(nn::ViT&, optim::Optimizer& opt,
                                  const std::map<std::string, Tensor>& full) {
  opt.load_state_dict(full);
}

double Plugin::clip_grad_norm(optim::Optimizer& opt, double max_norm) {
  return optim::clip_grad_norm(optimizer_params(opt), max_norm);
}

void Trainer::resume_at(int64_t epoch, int64_t step_in_epoch, int64_t global_step) {
  CAI_CHECK(epoch >= 0 && step_in_epoch >= 0 && global_step >= 0,
            "[trainer] cannot resume at epoch {} step {} (global step {})", epoch, step_in_epoch,
            global_step);
  CAI_CHECK(step_in_epoch <= steps_per_epoch(),
            "[trainer] resume at step {} of epoch {}, which has {} steps", step_in_epoch, epoch,
            steps_per_epoch());
  resume_epoch_ = epoch;
  resume_step_ = step_in_epoch;
  global_step_ = global_step;
}

void Trainer::fit(int64_t start_epoch) {
  if (resume_epoch_ >= 0) start_epoch = resume_epoch_;
  for (auto& h : hooks_) h->before_train(*this);
  plugin_->zero_grad(model_, opt_);
  const int64_t steps = steps_per_epoch();
  const Device device = model_.device();
  for (int64_t epoch = start_epoch; epoch < cfg_.num_epochs; ++epoch) {
    for (auto& h : hooks_) h->before_epoch(*this, epoch);
    train_.start_epoch(epoch);
    const auto t0 = Clock::now();
    double loss_sum = 0, correct_sum = 0, seen = 0;
    int64_t batches_left = train_.num_batches();
    int64_t first = 0;
    if (epoch == resume_epoch_) {
      // Resuming: draw and drop the batches of the steps already done in this epoch.
      for (; first < resume_step_; ++first) {
        const int64_t micro = std::min(cfg_.gradient_accumulation, batches_left);
        batches_left -= micro;
        data::Batch skipped;
        for (int64_t i = 0; i < micro; ++i)
          CAI_CHECK(train_.next(skipped), "[trainer] the loader ended early in epoch {}", epoch);
      }
      resume_epoch_ = -1;
    }
    for (int64_t s = first; s < steps; ++s) {
      const int64_t micro = std::min(cfg_.gradient_accumulation, batches_left);
      batches_left -= micro;
      // Load the step's batches first: the loss weight is 1 / (samples in the global step).
      std::vector<data::Batch> batches(micro);
      int64_t step_samples = 0;
      for (auto& b : batches) {
        CAI_CHECK(train_.next(b), "[trainer] the loader ended early in epoch {}", epoch);
        step_samples += b.global_batch_size;
        to_device(b, device);
      }
      // fp16: the loss (so every gradient) is multiplied by the loss scale.
      const double scale = scaler_ ? scaler_->scale() : 1.0;
      const float weight = static_cast<float>(scale / static_cast<double>(step_samples));
      const StepMetrics local = plugin_->forward_backward(
          model_, batches, weight, crit_,
          nn::ForwardCtx{true, cfg_.seed, static_cast<uint64_t>(global_step_), 0});
      const double local_loss = local.loss_sum, local_correct = local.correct;
      plugin_->sync_gradients(model_);
      StepInfo info;
      info.lr = opt_.groups().empty() ? 0 : opt_.groups().front().lr;
      if (scaler_) {
        // Unscale what this rank's optimizer sees, then agree on overflow over every rank that
        // holds other gradients (data-parallel shards, pipeline stages).
        const auto params = optimizer_params(opt_);
        scaler_->unscale(params);
        const double bad =
            plugin_->all_reduce_max(static_cast<double>(optim::count_nonfinite_grads(params)));
        std::string message;
        info.loss_scale = scale;
        info.skipped = scaler_->update(bad > 0, &message);
        if (!message.empty()) log::info("[grad_scaler] step {}: {}", global_step_ + 1, message);
      }
      if (info.skipped) {
        ++skipped_steps_;
      } else {
        if (cfg_.clip_grad_norm > 0)
          info.grad_norm = plugin_->clip_grad_norm(opt_, cfg_.clip_grad_norm);
        plugin_->optimizer_step(opt_);
      }
      plugin_->zero_grad(model_, opt_);
      ++global_step_;
      const double step_loss = plugin_->all_reduce_sum(local_loss);
      const double step_correct = plugin_->all_reduce_sum(local_correct);
      CAI_CHECK(std::isfinite(step_loss), "[trainer] loss became {} at epoch {} step {}", step_loss,
                epoch, s);
      loss_sum += step_loss;
      correct_sum += step_correct;
      seen += static_cast<double>(step_samples);
      info.epoch = epoch, info.num_epochs = cfg_.num_epochs;
      info.step_in_epoch = s + 1, info.steps_per_epoch = steps;
      info.global_step = global_step_;
      info.loss = step_loss / static_cast<double>(step_samples);
      info.accuracy = step_correct / static_cast<double>(step_samples);
      info.images = step_samples;
      info.epoch_seconds = seconds_since(t0);
      info.images_per_sec = seen / std::max(info.epoch_seconds, 1e-9);
      for (auto& h : hooks_) h->after_step(*this, info);
    }
    EpochInfo e;
    e.epoch = epoch, e.num_epochs = cfg_.num_epochs, e.global_step = global_step_;
    e.train_loss = loss_sum / std::max(seen, 1.0);
    e.train_accuracy = correct_sum / std::max(seen, 1.0);
    e.seconds = seconds_since(t0);
    e.images_per_sec = seen / std::max(e.seconds, 1e-9);
    e.lr = opt_.groups().empty() ? 0 : opt_.groups().front().lr;
    if (eval_) {
      const EvalResult r = evaluate(*eval_);
      e.eval_loss = r.loss, e.eval_accuracy = r.accuracy;
    }
    history_.push_back(e);
    for (auto& h : hooks_) h->after_epoch(*this, e);
  }
  for (auto& h : hooks_) h->after_train(*this);
}

EvalResult Trainer::evaluate(data::DataLoader& loader) {
  loader.start_epoch(0);
  double loss = 0, correct = 0, n = 0;
  data::Batch b;
  const Device device = model_.device();
  while (loader.next(b)) {
    to_device(b, device);
    const StepMetrics m = plugin_->eval_batch(model_, b);
    loss += m.loss_sum;
    correct += m.correct;
    n += m.samples;
  }
  EvalResult r;
  n = plugin_->all_reduce_sum(n);
  r.samples = static_cast<int64_t>(n);
  r.loss = plugin_->all_reduce_sum(loss) / std::max(n, 1.0);
  r.accuracy = plugin_->all_reduce_sum(correct) / std::max(n, 1.0);
  return r;
}

Booster::Booster(std::shared_ptr<Plugin> plugin)
    : plugin_(plugin ? std::move(plugin) : std::make_shared<Plugin>()) {}

std::unique_ptr<Trainer> Booster::boost(nn::ViT& model, optim::Optimizer& opt, Criterion criterion,
                                        data::DataLoader& train, data::DataLoader* eval,
                                        optim::LRScheduler* scheduler, bool schedule_by_epoch,
                                        TrainerConfig cfg) {
  auto t = std::make_unique<Trainer>(model, opt, criterion, train, eval, plugin_, cfg);
  if (scheduler) t->add_hook(std::make_shared<LRSchedulerHook>(*scheduler, schedule_by_epoch));
  return t;
}

// --- hooks ------------------------------------------------------------------------------------

void LRSchedulerHook::after_step(Trainer&, const StepInfo&) {
  if (!by_epoch_) s_.step();
}
void LRSchedulerHook::after_epoch(Trainer&, const EpochInfo&) {
  if (by_epoch_) s_.step();
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
  return fmt::format("{}:{:02}", s / 60, s % 60);
}

ProgressHook::ProgressHook(bool terminal, int64_t interval)
    : terminal_(terminal), interval_(interval) {}

void ProgressHook::after_step(Trainer& t, const StepInfo& s) {
  if (t.plugin().rank() != 0) return;
  const double eta =
      s.epoch_seconds / s.step_in_epoch * static_cast<double>(s.steps_per_epoch - s.step_in_epoch);
  const std::string stats = fmt::format(
      "{:>4}/{}  {:.0f} img/s  loss {:.4f}  acc {:.3f}  lr {:.2e}  ETA {}", s.step_in_epoch,
      s.steps_per_epoch, s.images_per_sec, s.loss, s.accuracy, s.lr, format_duration(eta));
  if (terminal_) {
    const bool last = s.step_in_epoch == s.steps_per_epoch;
    if (!last && s.epoch_seconds - last_draw_ < 0.1) return;
    last_draw_ = last ? -1 : s.epoch_seconds;
    const int width = 24;
    const int filled = static_cast<int>(width * s.step_in_epoch / s.steps_per_epoch);
    std::string bar;
    for (int i = 0; i < width; ++i) bar += i < filled ? "█" : "░";
    std::fprintf(stdout, "\r\033[2Kepoch %lld/%lld |%s| %s", static_cast<long long>(s.epoch + 1),
                 static_cast<long long>(s.num_epochs), bar.c_str(), stats.c_str());
    if (last) std::fprintf(stdout, "\n");
    std::fflush(stdout);
  } else {
    const int64_t every = interval_ > 0 ? interval_ : std::max<int64_t>(1, s.steps_per_epoch / 10);
    if (s.step_in_epoch % every == 0 || s.step_in_epoch == s.steps_per_epoch)
      log::info("epoch {}/{} step {}", s.epoch + 1, s.num_epochs, stats);
  }
}

void ProgressHook::after_epoch(Trainer&, const EpochInfo&) {
  last_draw_ = -1;
}

void LogMetricByEpochHook::after_epoch(Trainer& t, const EpochInfo& e) {
  if (t.plugin().rank() != 0) return;
  std::string eval = e.eval_accuracy >= 0 ? fmt::format("  test loss {:.4f}  test acc {:.2f}%",
                                                        e.eval_loss, 100 * e.eval_accuracy)
                                          : std::string();
  log::info(
      "epoch {}/{} done: train loss {:.4f}  train acc {:.2f}%{}  {} ({:.0f} img/s)  lr {:.2e}",
      e.epoch + 1, e.num_epochs, e.train_loss, 100 * e.train_accuracy, eval,
      format_duration(e.seconds), e.images_per_sec, e.lr);
}

MetricsFileHook::MetricsFileHook(std::string path, int64_t interval)
    : path_(std::move(path)), interval_(interval) {}

void MetricsFileHook::write(const std::string& line) {
  std::ofstream f(path_, std::ios::app);
  CAI_CHECK(f.good(), "[metrics] cannot write {}", path_);
  f << line << "\n";
}

void MetricsFileHook::before_train(Trainer& t) {
  if (t.plugin().rank() != 0) return;
  std::ofstream f(path_, std::ios::trunc);
  CAI_CHECK(f.good(), "[metrics] cannot create {}", path_);
}

void MetricsFileHook::after_step(Trainer& t, const StepInfo& s) {
  if (t.plugin().rank() != 0 || interval_ <= 0 || s.global_step % interval_ != 0) return;
  nlohmann::json j = {{"type", "step"},
                      {"epoch", s.epoch + 1},
                      {"step", s.global_step},
                      {"loss", s.loss},
                      {"accuracy", s.accuracy},
                      {"lr", s.lr},
                      {"img_per_s", s.images_per_sec}};
  if (s.grad_norm > 0) j["grad_norm"] = s.grad_norm;
  write(j.dump());
}

void MetricsFileHook::after_epoch(Trainer& t, const EpochInfo& e) {
  if (t.plugin().rank() != 0) return;
  nlohmann::json j = {{"type", "epoch"},
                      {"epoch", e.epoch + 1},
                      {"step", e.global_step},
                      {"train_loss", e.train_loss},
                      {"train_accuracy", e.train_accuracy},
                      {"seconds", e.seconds},
                      {"img_per_s", e.images_per_sec},
                      {"lr", e.lr}};
  if (e.eval_accuracy >= 0) j["test_loss"] = e.eval_loss, j["test_accuracy"] = e.eval_accuracy;
  write(j.dump());
}

}  // namespace cai::train
