#include "cai/optim/lr_scheduler.h"

#include <algorithm>
#include <cmath>

#include "cai/core/error.h"

namespace cai::optim {

void LRScheduler::apply() {
  for (auto& g : opt_.groups()) g.lr = lr_at(g.base_lr, t_);
}

void LRScheduler::step() {
  ++t_;
  apply();
}

void LRScheduler::set_last(int64_t t) {
  CAI_CHECK(t >= 0, "[lr_scheduler] step {} must be non-negative", t);
  t_ = t;
  apply();
}

double LRScheduler::lr() const {
  return opt_.groups().empty() ? 0.0 : opt_.groups().front().lr;
}

LinearWarmupLR::LinearWarmupLR(Optimizer& opt, int64_t total_steps, int64_t warmup_steps)
    : LRScheduler(opt), total_(total_steps), warmup_(warmup_steps) {
  CAI_CHECK(total_steps > 0 && warmup_steps >= 0 && warmup_steps < total_steps,
            "[LinearWarmupLR] needs 0 <= warmup_steps < total_steps, got warmup {} total {}",
            warmup_steps, total_steps);
  apply();
}

double LinearWarmupLR::lr_at(double base, int64_t t) const {
  if (t < warmup_) return static_cast<double>(t + 1) / static_cast<double>(warmup_ + 1) * base;
  return std::max(0.0, static_cast<double>(total_ - t) / static_cast<double>(total_ - warmup_)) *
         base;
}

CosineAnnealingWarmupLR::CosineAnnealingWarmupLR(Optimizer& opt, int64_t total_steps,
                                                 int64_t warmup_steps, double eta_min)
    : LRScheduler(opt), total_(total_steps), warmup_(warmup_steps), eta_min_(eta_min) {
  CAI_CHECK(total_steps > 0 && warmup_steps >= 0 && warmup_steps < total_steps,
            "[CosineAnnealingWarmupLR] needs 0 <= warmup_steps < total_steps, got warmup {} "
            "total {}",
            warmup_steps, total_steps);
  apply();
}

double CosineAnnealingWarmupLR::lr_at(double base, int64_t t) const {
  if (t < warmup_) return static_cast<double>(t + 1) / static_cast<double>(warmup_) * base;
  const double progress =
      std::min(1.0, static_cast<double>(t - warmup_) / static_cast<double>(total_ - warmup_));
  return eta_min_ + (base - eta_min_) * (1.0 + std::cos(M_PI * progress)) / 2.0;
}

std::unique_ptr<LRScheduler> make_scheduler(const std::string& name, Optimizer& opt,
                                            int64_t total_steps, int64_t warmup_steps,
                                            double eta_min) {
  if (name == "cosine")
    return std::make_unique<CosineAnnealingWarmupLR>(opt, total_steps, warmup_steps, eta_min);
  if (name == "linear") return std::make_unique<LinearWarmupLR>(opt, total_steps, warmup_steps);
  if (name == "constant") return std::make_unique<ConstantLR>(opt);
  fail("[lr_scheduler] unknown schedule '{}': expected cosine, linear or constant", name);
}

}  // namespace cai::optim
