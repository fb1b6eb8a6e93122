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

// The host side of ZeRO-Offload (calibrate_offload.cpp): pinned copies of `copy_bytes` each way
// between the host and `dev` (0 on a CPU: no copies to time), optim::HybridAdam over
// `adam_elements` host parameters and y += x over copy_bytes of x on the default CPU pool.
struct HostRates {
  double h2d_bytes_per_s = 0, d2h_bytes_per_s = 0, adam_elements_per_s = 0, add_bytes_per_s = 0;
};
HostRates time_host_offload(Device dev, int64_t copy_bytes = int64_t{256} << 20,
                            int64_t adam_elements = int64_t{64} << 20);

}  // namespace cai::app::detail
