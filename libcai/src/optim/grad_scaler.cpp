#include "cai/optim/grad_scaler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "cai/core/error.h"
#include "cai/ops/ops.h"

namespace cai::optim {

DynamicGradScaler::DynamicGradScaler(GradScalerConfig cfg) : cfg_(cfg), scale_(cfg.initial_scale) {
  CAI_CHECK(
      cfg.min_scale > 0 && cfg.min_scale <= cfg.initial_scale && cfg.initial_scale <= cfg.max_scale,
      "[grad_scaler] need 0 < min_scale ({}) <= initial_scale ({}) <= max_scale ({})",
      cfg.min_scale, cfg.initial_scale, cfg.max_scale);
  CAI_CHECK(cfg.growth_factor > 1, "[grad_scaler] growth_factor {} must be > 1", cfg.growth_factor);
  CAI_CHECK(cfg.backoff_factor > 0 && cfg.backoff_factor < 1,
            "[grad_scaler] backoff_factor {} must be in (0, 1)", cfg.backoff_factor);
  CAI_CHECK(cfg.growth_interval >= 1 && cfg.hysteresis >= 1,
            "[grad_scaler] growth_interval {} and hysteresis {} must be >= 1", cfg.growth_interval,
            cfg.hysteresis);
}

bool DynamicGradScaler::update(bool overflow, std::string* message) {
  if (overflow) {
    ++hysteresis_step_;
    growth_step_ = 0;
    std::string what = "overflow: step skipped";
    if (hysteresis_step_ >= cfg_.hysteresis) {
      scale_ = std::max(scale_ * cfg_.backoff_factor, cfg_.min_scale);
      what += fmt::format(", loss scale backed off to {}", scale_);
    } else {
      what += fmt::format(" ({} of {} overflows before backing off), loss scale stays {}",
                          hysteresis_step_, cfg_.hysteresis, scale_);
    }
    if (message) *message = what;
    return true;
  }
  ++growth_step_;
  if (growth_step_ == cfg_.growth_interval) {
    growth_step_ = 0;
    hysteresis_step_ = 0;
    scale_ = std::min(scale_ * cfg_.growth_factor, cfg_.max_scale);
    if (message) *message = fmt::format("loss scale grown to {}", scale_);
  }
  return false;
}

void DynamicGradScaler::unscale(const std::vector<nn::Parameter*>& params) const {
  const float inv = static_cast<float>(1.0 / scale_);
  for (nn::Parameter* p : params) ops::scale_(p->grad, inv);
}

std::vector<double> DynamicGradScaler::state() const {
  return {scale_, static_cast<double>(growth_step_), static_cast<double>(hysteresis_step_)};
}

void DynamicGradScaler::load_state(const std::vector<double>& s) {
  CAI_CHECK(s.size() == 3,
            "[grad_scaler] state needs 3 values (scale, growth step, hysteresis step), got {}",
            s.size());
  // What update() keeps true, so that a resumed scaler behaves as the saved one would have (a
  // growth step at or past growth_interval would never grow the scale again).
  CAI_CHECK(std::isfinite(s[0]) && s[0] >= cfg_.min_scale && s[0] <= cfg_.max_scale,
            "[grad_scaler] saved loss scale {} is outside [min_scale {}, max_scale {}] of this "
            "run's precision settings",
            s[0], cfg_.min_scale, cfg_.max_scale);
  // Counts are whole numbers that int64_t holds exactly (beyond 2^53 a double skips integers, and
  // casting 1e300 to int64_t is undefined).
  auto whole = [](double v) {
    return std::isfinite(v) && v >= 0 && v <= 9007199254740992.0 && std::floor(v) == v;
  };
  CAI_CHECK(whole(s[1]) && s[1] < static_cast<double>(cfg_.growth_interval),
            "[grad_scaler] saved growth step {} must be a whole number in [0, growth_interval "
            "{})",
            s[1], cfg_.growth_interval);
  CAI_CHECK(whole(s[2]), "[grad_scaler] saved hysteresis step {} must be a whole number >= 0",
            s[2]);
  scale_ = s[0];
  growth_step_ = static_cast<int64_t>(s[1]);
  hysteresis_step_ = static_cast<int64_t>(s[2]);
}

int64_t count_nonfinite_grads(const std::vector<nn::Parameter*>& params) {
  int64_t n = 0;
  for (const nn::Parameter* p : params) n += ops::count_nonfinite(p->grad);
  return n;
}

bool grads_finite(const std::vector<nn::Parameter*>& params) {
  return count_nonfinite_grads(params) == 0;
}

}  // namespace cai::optim
