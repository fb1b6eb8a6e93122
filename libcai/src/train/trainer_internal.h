// Internal to libcai/src/train: the clock helpers that trainer.cpp (the step loop) and
// trainer_hooks.cpp (the progress, profile and metrics hooks) share. Not installed.
#pragma once

#include <chrono>

namespace cai::train::detail {

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace cai::train::detail
