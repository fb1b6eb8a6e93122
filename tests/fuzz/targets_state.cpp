// The loss scaler's state in trainer_state.json, as `vit_train --resume` reads it: the file's
// text through checkpoint::parse_training_state, then DynamicGradScaler::load_state under two
// scaler settings (Colossal-AI's defaults and a narrow range). The oracle: a state that is
// accepted leaves a scaler that keeps its invariants (a finite scale in [min_scale, max_scale],
// 0 <= growth step < growth_interval, hysteresis step >= 0) through overflowing and clean
// steps, and reports back exactly the state it was given.
#include <cmath>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "cai/checkpoint/checkpoint.h"
#include "cai/core/error.h"
#include "cai/optim/grad_scaler.h"
#include "fuzz.h"

namespace cai::fuzz {

namespace {

void expect(bool ok, const std::string& what) {
  if (!ok) throw std::logic_error("fuzz: loss scaler " + what);
}

void check_invariants(const optim::DynamicGradScaler& s, const optim::GradScalerConfig& c,
                      const char* when) {
  const double scale = s.scale();
  expect(std::isfinite(scale) && scale >= c.min_scale && scale <= c.max_scale,
         fmt::format("{}: scale {} outside [{}, {}]", when, scale, c.min_scale, c.max_scale));
  expect(
      s.growth_step() >= 0 && s.growth_step() < c.growth_interval,
      fmt::format("{}: growth step {} outside [0, {})", when, s.growth_step(), c.growth_interval));
  expect(s.hysteresis_step() >= 0,
         fmt::format("{}: hysteresis step {} is negative", when, s.hysteresis_step()));
}

}  // namespace

Target loss_scaler_state_target() {
  Target t;
  t.name = "loss_scaler_state";
  // What save_checkpoint writes (to_json), fp16 after some growth and overflow, and without fp16.
  t.seeds = {
      R"({
 "epoch": 1,
 "format": "colossalai-cpp checkpoint 1",
 "global_step": 12,
 "layout": "dp 2 × pp 1 × tp 1",
 "loss_scaler": [
  32768.0,
  3.0,
  1.0
 ],
 "run_id": "2026-11-27T23:00:00Z-0123456789abcdef",
 "scheduler_last": 12,
 "step_in_epoch": 4,
 "version": "0.1.0"
}
)",
      R"({"epoch": 0, "step_in_epoch": 0, "global_step": 0, "scheduler_last": 0,
"loss_scaler": [65536.0, 0.0, 0.0], "layout": "", "version": ""})",
      R"({"epoch": 3, "step_in_epoch": 2, "global_step": 2000, "scheduler_last": 2000,
"loss_scaler": [], "layout": "dp 1 × pp 2 × tp 2", "version": "0.1.0"})"};
  t.run = [](const std::string& in) {
    const checkpoint::TrainingState st = checkpoint::parse_training_state(in, "trainer_state.json");
    expect(st.epoch >= 0 && st.step_in_epoch >= 0 && st.global_step >= 0 && st.scheduler_last >= 0,
           "counters: a negative epoch/step was accepted");
    if (st.scaler.empty()) return;  // not an fp16 run's checkpoint: the scaler starts afresh
    optim::GradScalerConfig narrow;
    narrow.initial_scale = 1024;
    narrow.min_scale = 1;
    narrow.max_scale = 65536;
    narrow.growth_interval = 3;
    narrow.hysteresis = 2;
    for (const optim::GradScalerConfig& c : {optim::GradScalerConfig{}, narrow}) {
      optim::DynamicGradScaler s(c);
      try {
        s.load_state(st.scaler);
      } catch (const Error&) {
        continue;  // refused under these settings (the other may accept it)
      }
      check_invariants(s, c, "after load_state");
      const std::vector<double> back = s.state();
      expect(back == st.scaler, "state() does not give back the loaded state");
      for (bool overflow : {true, true, true, false, false, false, false})
        s.update(overflow), check_invariants(s, c, overflow ? "after an overflow" : "after a step");
    }
  };
  return t;
}

}  // namespace cai::fuzz
