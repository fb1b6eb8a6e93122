// The trainer's hooks: LR scheduler, progress, kernel profile, metric log and metrics file
// (split from trainer.cpp).
#include "cai/train/trainer.h"

#include <csignal>

#include <nlohmann/json.hpp>

#include <unistd.h>
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <future>
#include <mutex>
#include <string_view>
#include <thread>

#include "cai/core/error.h"
#include "cai/core/kernel_profile.h"
#include "cai/core/log.h"
#include "cai/ops/ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/device.h"
#include "trainer_internal.h"

namespace cai::train {

using detail::Clock;
using detail::seconds_since;

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

std::string format_rate(double tflops, double mfu) {
  std::string r = fmt::format("{:.3g} TFLOP/s", tflops);
  if (mfu >= 0) r += fmt::format("  MFU {:.1f}%", 100 * mfu);
  return r;
}

double dense_peak_tflops(const std::string& device_name, const std::string& precision) {
  if (precision != "bf16" && precision != "fp16") return 0;
  auto has = [&](const char* model) {  // a whole word of the name: "H20" is not "H200"
    const std::string m(model);
    for (size_t at = device_name.find(m); at != std::string::npos;
         at = device_name.find(m, at + 1)) {
      const size_t end = at + m.size();
      const bool starts = at == 0 || !std::isalnum(static_cast<unsigned char>(device_name[at - 1]));
      const bool ends =
          end == device_name.size() || !std::isalnum(static_cast<unsigned char>(device_name[end]));
      if (starts && ends) return true;
    }
    return false;
  };
  for (const char* m : {"H100", "H200", "H800", "GH200"})
    if (has(m)) return has("PCIe") ? 756.0 : has("NVL") ? 835.0 : 989.0;
  if (has("H20")) return 148.0;
  for (const char* m : {"A100", "A800"})
    if (has(m)) return 312.0;
  return 0;
}

ProgressHook::ProgressHook(bool terminal, int64_t interval)
    : terminal_(terminal), interval_(interval) {}

int64_t ProgressHook::every(const StepInfo& s) const {
  if (interval_ > 0) return interval_;
  return std::max<int64_t>(1, s.steps_per_epoch / (terminal_ ? 50 : 10));
}

void ProgressHook::before_train(Trainer& t) {
  // Ranks whose terminal-ness differed asked for values at different steps, and the values'
  // reduction over the ranks then matched unlike collectives (an MPI error on the CPU).
  Plugin& p = t.plugin();
  terminal_ = p.all_reduce_sum(p.rank() == 0 && terminal_ ? 1.0 : 0.0) > 0.5;
}

bool ProgressHook::needs_values(const Trainer&, const StepInfo& s) const {
  return s.step_in_epoch % every(s) == 0 || s.step_in_epoch == s.steps_per_epoch;
}

void ProgressHook::after_step(Trainer& t, const StepInfo& s) {
  if (t.plugin().rank() != 0) return;
  if (s.has_values) loss_ = s.loss, accuracy_ = s.accuracy;
  const double eta =
      s.epoch_seconds / s.step_in_epoch * static_cast<double>(s.steps_per_epoch - s.step_in_epoch);
  auto value = [](double v, int digits) {
    return std::isnan(v) ? std::string("-") : fmt::format("{:.{}f}", v, digits);
  };
  const std::string stats =
      fmt::format("{:>4}/{}  {:.0f} img/s  loss {}  acc {}  lr {:.2e}  ETA {}  {}", s.step_in_epoch,
                  s.steps_per_epoch, s.images_per_sec, value(loss_, 4), value(accuracy_, 3), s.lr,
                  format_duration(eta), format_rate(s.tflops, s.mfu));
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
  } else if (s.has_values && needs_values(t, s)) {
    log::info("epoch {}/{} step {}", s.epoch + 1, s.num_epochs, stats);
  }
}

KernelProfileHook::KernelProfileHook(std::string path, int64_t start, int64_t steps,
                                     std::string title)
    : path_(std::move(path)), title_(std::move(title)), start_(start), steps_(steps) {
  CAI_CHECK(start_ >= 0 && steps_ >= 1,
            "[profile] kernel profile of steps ({}, {}]: expected a "
            "start >= 0 and at least 1 step",
            start_, start_ + steps_);
}

void KernelProfileHook::after_step(Trainer& t, const StepInfo& s) {
  if (t.plugin().rank() != 0) return;
  const bool cuda = t.model().device().is_cuda();
  if (!running_ && s.global_step == start_) {
    CAI_CHECK(cuda, "[profile] train.kernel_profile needs train.device = \"cuda\"");
    const auto began = Clock::now();
    kernels::cuda::synchronize();
    profile::kernel_profile_start();
    start_ms_ = 1e3 * std::chrono::duration<double>(Clock::now() - began).count();
    running_ = true;
    t0_ = seconds_since(Clock::time_point{});
    host_ms_.clear();
    staging_ms_.clear();
    return;
  }
  if (!running_) return;
  // Host phases of the profiled steps. A step's "hooks" are the hooks after the step before it:
  // the first profiled step's include this hook's start (a device synchronisation and CUPTI's
  // start), which is taken out.
  // Each phase's time in each profiled step (a table row per phase, a column per step).
  const auto step = static_cast<size_t>(s.global_step - start_ - 1);
  auto add = [&](Phases& rows, const char* name, double ms) {
    auto it = std::find_if(rows.begin(), rows.end(),
                           [&](const auto& e) { return std::string_view(e.first) == name; });
    if (it == rows.end()) it = rows.insert(rows.end(), {name, std::vector<double>(steps_, 0.0)});
    it->second[step] += ms;
  };
  for (auto [name, ms] : s.host_ms) {
    if (step == 0 && std::string_view(name) == "hooks") ms = std::max(0.0, ms - start_ms_);
    add(host_ms_, name, ms);
  }
  for (const auto& [name, ms] : s.staging_ms) add(staging_ms_, name, ms);
  if (s.global_step == start_ + steps_) {
    kernels::cuda::synchronize();
    const double wall = seconds_since(Clock::time_point{}) - t0_;
    running_ = false;
    auto table = [&](const Phases& rows, const char* what) {
      std::string t = fmt::format("| {} |", what), rule = "| --- |";
      for (int64_t k = 1; k <= steps_; ++k) t += fmt::format(" step {} |", k), rule += " ---: |";
      t += " mean |\n" + rule + " ---: |\n";
      for (const auto& [name, ms] : rows) {
        t += fmt::format("| {} |", name);
        double sum = 0;
        for (double v : ms) t += fmt::format(" {:.2f} |", v), sum += v;
        t += fmt::format(" {:.2f} |\n", sum / static_cast<double>(steps_));
      }
      return t + "\n";
    };
    std::string host =
        "## Host time per step by trainer phase (rank 0, ms)\n\n" + table(host_ms_, "phase");
    if (!staging_ms_.empty())
      host +=
          "## Batch staging per step (rank 0, ms): the staging thread's parts overlap the step "
          "before; the trainer thread's are in \"wait for the batch\"\n\n" +
          table(staging_ms_, "part");
    profile::write_kernel_profile(path_, profile::kernel_profile_stop(), static_cast<int>(steps_),
                                  1e3 * wall / steps_, title_, host);
    log::info("[profile] kernel profile of steps {}-{} in {}", start_ + 1, start_ + steps_, path_);
  }
}

void KernelProfileHook::after_train(Trainer&) {
  if (!running_) return;
  running_ = false;
  profile::kernel_profile_stop();
  log::warn("[profile] training ended before step {}: no kernel profile written to {}",
            start_ + steps_, path_);
}

bool stdout_is_terminal() {
  if (const char* v = std::getenv("CAI_STDOUT_TTY"); v && *v) return std::string(v) == "1";
  return isatty(STDOUT_FILENO) != 0;
}

void ProgressHook::after_epoch(Trainer&, const EpochInfo&) {
  last_draw_ = -1;
  loss_ = accuracy_ = NAN;
}

void LogMetricByEpochHook::after_epoch(Trainer& t, const EpochInfo& e) {
  if (t.plugin().rank() != 0) return;
  std::string eval = e.eval_accuracy >= 0 ? fmt::format("  test loss {:.4f}  test acc {:.2f}%",
                                                        e.eval_loss, 100 * e.eval_accuracy)
                                          : std::string();
  log::info(
      "epoch {}/{} done: train loss {:.4f}  train acc {:.2f}%{}  {} ({:.0f} img/s, {})  lr {:.2e}",
      e.epoch + 1, e.num_epochs, e.train_loss, 100 * e.train_accuracy, eval,
      format_duration(e.seconds), e.images_per_sec, format_rate(e.tflops, e.mfu), e.lr);
}

MetricsFileHook::MetricsFileHook(std::string path, int64_t interval,
                                 std::optional<MetricsRunInfo> run)
    : path_(std::move(path)), interval_(interval), run_(std::move(run)) {}

void MetricsFileHook::write_run() {
  if (!run_) return;
  const MetricsRunInfo& r = *run_;
  write(nlohmann::json{{"type", "run"},
                       {"processes", r.processes},
                       {"dp", r.dp},
                       {"pp", r.pp},
                       {"tp", r.tp},
                       {"tensor_mode", r.tensor_mode},
                       {"zero_stage", r.zero_stage},
                       {"batch_per_process", r.batch_per_process},
                       {"gradient_accumulation", r.gradient_accumulation},
                       {"global_batch", r.batch_per_process * r.gradient_accumulation * r.dp},
                       {"model", r.model},
                       {"device", r.device},
                       {"layout", r.layout}}
            .dump());
}

void MetricsFileHook::write(const std::string& line) {
  std::ofstream f(path_, std::ios::app);
  CAI_CHECK(f.good(), "[metrics] cannot write {}", path_);
  f << line << "\n";
}

void MetricsFileHook::before_train(Trainer& t) {
  if (t.plugin().rank() != 0) return;
  if (const Trainer::ResumePoint* r = t.resumed()) {
    // The run this one continues wrote the records before it: they stay.
    nlohmann::json j = {{"type", "resume"},
                        {"epoch", r->epoch + 1},
                        {"step_in_epoch", r->step_in_epoch},
                        {"step", r->global_step}};
    if (!r->from.empty()) j["checkpoint"] = r->from;
    write(j.dump());
    write_run();
    return;
  }
  {
    std::ofstream f(path_, std::ios::trunc);
    CAI_CHECK(f.good(), "[metrics] cannot create {}", path_);
  }
  write_run();
}

bool MetricsFileHook::needs_values(const Trainer&, const StepInfo& s) const {
  return interval_ > 0 && s.global_step % interval_ == 0;
}

void MetricsFileHook::after_step(Trainer& t, const StepInfo& s) {
  if (t.plugin().rank() != 0 || !s.has_values || !needs_values(t, s)) return;
  nlohmann::json j = {{"type", "step"},
                      {"epoch", s.epoch + 1},
                      {"step", s.global_step},
                      {"loss", s.loss},
                      {"accuracy", s.accuracy},
                      {"lr", s.lr},
                      {"img_per_s", s.images_per_sec},
                      {"tflops", s.tflops},
                      {"seconds", s.epoch_seconds}};
  if (s.mfu >= 0) j["mfu"] = s.mfu;
  if (s.grad_norm > 0) j["grad_norm"] = s.grad_norm;
  if (s.energy_j >= 0) {  // rank 0's GPU (NVML)
    j["energy_j"] = s.energy_j;
    j["energy_step"] = s.energy_step;
    j["energy_seconds"] = s.energy_seconds;
    j["sm_mhz"] = s.sm_mhz;
    j["power_w"] = s.power_w;
  }
  write(j.dump());
}

void MetricsFileHook::on_stop(Trainer& t, const StopPoint& p) {
  if (t.plugin().rank() != 0) return;
  // Where the run stopped and why; the resumed run's "resume" record follows it.
  nlohmann::json j = {{"type", "preempted"},
                      {"epoch", p.epoch + 1},
                      {"step_in_epoch", p.step_in_epoch},
                      {"step", p.global_step},
                      {"signal", stop_reason_name(p.reason)}};
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
                      {"tflops", e.tflops},
                      {"lr", e.lr}};
  if (e.mfu >= 0) j["mfu"] = e.mfu;
  if (e.eval_accuracy >= 0) j["test_loss"] = e.eval_loss, j["test_accuracy"] = e.eval_accuracy;
  write(j.dump());
}

}  // namespace cai::train
