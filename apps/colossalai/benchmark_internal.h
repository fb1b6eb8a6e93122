// What cmd_benchmark.cpp (the command, the tables, the simulation) and cmd_benchmark_worker.cpp
// (the measuring ranks) share; not part of cmd_benchmark.h's interface.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cmd_benchmark.h"

namespace cai::app::detail {

struct Row {
  TpLayout layout;
  std::string status = "ok", reason;
  double forward_ms = 0, backward_ms = 0, optimizer_ms = 0, step_ms = 0, samples_per_s = 0;
  int gpus = 1;       // ranks of the row: samples_per_s / gpus is its throughput per GPU
  double tflops = 0;  // achieved forward + backward TFLOP/s per GPU (the plan's FLOPs of a rank)
  int64_t peak_mem_bytes = 0, comm_bytes = 0;
  bool simulated = false;
  bool optimizer_known = true;  // simulated rows: the plan has no optimizer cost
  bool fits = true;             // simulated rows: the peak fits the cluster's GPU
};

// The table, best first, and --json when asked.
void print_table(const BenchmarkOptions& o, int n, const std::string& device,
                 std::vector<Row> rows);
// Measured beside simulated step times, per layout.
void print_compare(const BenchmarkOptions& o, const std::vector<Row>& measured,
                   const std::string& sim_path);

}  // namespace cai::app::detail
