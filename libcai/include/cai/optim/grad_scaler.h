// Dynamic loss scaling for fp16 training with Colossal-AI's DynamicGradScaler rules and defaults:
// the loss is multiplied by scale() before backward; after backward, an overflow (any inf/NaN
// gradient) skips the optimizer step; `hysteresis` consecutive overflows back the scale off by
// backoff_factor (not below min_scale); growth_interval overflow-free steps grow it by
// growth_factor (not above max_scale) and reset the hysteresis count.
// (Used by the fp16 path of the CUDA backend; the arithmetic is device-independent.)
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cai/nn/module.h"

namespace cai::optim {

struct GradScalerConfig {
  double initial_scale = 65536.0;  // 2^16
  double min_scale = 1.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 1000;
  int64_t hysteresis = 2;
  double max_scale = 4294967296.0;  // 2^32
};

class DynamicGradScaler {
 public:
  explicit DynamicGradScaler(GradScalerConfig cfg = {});
  double scale() const { return scale_; }
  // Records one step's outcome; returns true when the optimizer step must be skipped.
  // `message` (optional) receives a log line when the scale changes or a step is skipped.
  bool update(bool overflow, std::string* message = nullptr);
  // Multiplies every gradient by 1/scale().
  void unscale(const std::vector<nn::Parameter*>& params) const;
  int64_t growth_step() const { return growth_step_; }
  int64_t hysteresis_step() const { return hysteresis_step_; }
  // State for checkpoints: {scale, growth_step, hysteresis_step}. load_state refuses (cai::Error
  // naming the value) a scale that is not finite or outside [min_scale, max_scale], and steps that
  // are not whole numbers >= 0 or a growth step >= growth_interval: what update() keeps true.
  std::vector<double> state() const;
  void load_state(const std::vector<double>& s);

 private:
  GradScalerConfig cfg_;
  double scale_;
  int64_t growth_step_ = 0, hysteresis_step_ = 0;
};

// Gradient elements that are inf or NaN over `params`, and false when there is any.
int64_t count_nonfinite_grads(const std::vector<nn::Parameter*>& params);
bool grads_finite(const std::vector<nn::Parameter*>& params);

}  // namespace cai::optim
