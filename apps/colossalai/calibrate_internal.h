// Helpers that calibrate.cpp (the kernels, the run) and calibrate_comm.cpp (collectives, overlap,
// contention) share; not part of calibrate.h's interface.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>

#include "cai/core/tensor.h"

namespace cai::app::detail {

using Clock = std::chrono::steady_clock;

// Inputs of the timed kernels: constant values made where they are used (the host RNG would
// take longer than the kernels for the large shapes; the timings do not depend on the values).
Tensor randn(const Shape& s, DType t, Device dev, uint64_t stream);
// Seconds per call of f: warm twice, then repeat until 20 ms or 30 calls (at least 3).
double time_it(const std::function<void()>& f, Device dev);
double seconds_since(Clock::time_point t0);

}  // namespace cai::app::detail
