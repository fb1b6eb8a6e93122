// Per-kernel GPU time from CUPTI's activity records (no nsys needed): every kernel, memcpy and
// memset the process runs between kernel_profile_start() and kernel_profile_stop(), with device
// timestamps. CUPTI is loaded at run time (dlopen libcupti.so.13, then libcupti.so): nothing links
// it, and a host without it gets an error naming the library when a profile is asked for. CUPTI
// delivers records through C callbacks into one collector per process (CUPTI's activity API is
// itself per process): one profile at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cai::profile {

struct KernelRecord {
  std::string name;  // demangled, template arguments kept
  uint64_t start_ns = 0, end_ns = 0;
  uint32_t stream = 0;
  int grid = 0, block = 0;  // grid.x*y*z, block.x*y*z (0 for copies)
};

// True in CUDA builds (CUPTI may still be missing at run time: start() then throws).
bool kernel_profile_available();
void kernel_profile_start();
// Flushes and returns every record since start(), sorted by start time.
std::vector<KernelRecord> kernel_profile_stop();

// Writes `path` (Markdown): the per-kernel table (calls, ms per step, share of kernel time, mean
// µs), kernel time per category (GEMM, attention, layernorm, GELU, optimizer, ...), the GPU's busy
// time (union of intervals) against `wall_ms_per_step`, and `path`.csv with the profiled steps'
// kernels in order (name, start offset, duration, stream) for attributing kernels to layers and
// finding the device's idle gaps.
// `extra` (Markdown) goes after the summary line (the trainer's host time per phase).
void write_kernel_profile(const std::string& path, const std::vector<KernelRecord>& records,
                          int steps, double wall_ms_per_step, const std::string& title,
                          const std::string& extra = "");

}  // namespace cai::profile
