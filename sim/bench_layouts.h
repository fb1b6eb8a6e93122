// `colossalai benchmark --simulate`'s half inside colossalai-sim (the benchmark binary does not
// link SimGrid): every tensor layout of N GPUs the benchmark enumerates, each as data parallel
// N / T × that tensor layout, simulated through the plan, as the rows the benchmark prints.
//
// Model vit (a vit_train config): per layout the config with pipeline 1, ZeRO 0, the layout's
// tensor mode and `batch` samples per data-parallel rank (the benchmark's -b), in the
// benchmark's precision; workload_from_config + replay (bulk). Rows:
//   forward_ms   the slowest rank's time to its first backward op (forward compute and its
//                tensor-parallel collectives);
//   backward_ms  the rest of the step: backward, its collectives and the data-parallel gradient
//                reduction's exposed part (the measured benchmark replicates "none" without one);
//   optimizer_ms null: the plan has no optimizer cost (the step's OptStep takes no time);
//   step_ms, samples_per_s (batch × dp / step), peak_mem_bytes (the largest rank's replayed
//   peak), comm_bytes (tensor-parallel bytes per step of the busiest rank, as
//   TensorParallel::comm_bytes counts them), dp_comm_bytes (its data-parallel reductions).
// A layout vit_train refuses is "failed" with its reason.
//
// Models block and mlp (the measured worker's models, cmd_benchmark_worker.cpp): the plan with body
// Blocks (-l nn::Block of hidden -d, d / 64 heads, MLP ratio 4) or Linears (-l ×
// nn::ParallelLinear(d, d)) on -b samples of -s tokens per tensor group, forward then backward
// of mean(output) and nothing else (no optimizer: optimizer_ms 0; no data-parallel reduction:
// the none layout is N independent replicas, as measured); workload_from_plan + replay. The
// tensor-parallel collectives are the ones the measured layers issue, so comm_bytes equals the
// measured row's; peak_mem_bytes is the plan's step replay of the worker's allocations. A shape
// that does not split is "failed" with the plan's reason.
//
// 2d/2.5d layouts of one data-parallel replica replay one copy of their identical tensor slices
// (from_config.h), so 1,024-GPU layouts take seconds.
#pragma once
#include <string>
#include <vector>

#include "cluster.h"

namespace cai::sim {

struct BenchLayout {
  std::string mode = "none";  // none | 1d | 2d | 2.5d | 3d
  int size = 1, depth = 1;
};
// "none", "1d:8", "2.5d:8:2" (size defaults to `gpus`, depth to 1); throws naming the text.
BenchLayout parse_bench_layout(const std::string& text, int gpus);
// none, then every mode TensorParallel::modes_for(gpus) lists at size gpus.
std::vector<BenchLayout> default_bench_layouts(int gpus);

struct BenchOptions {
  int gpus = 0;
  std::string model = "vit";  // vit | block | mlp
  std::string config;         // vit: the vit_train TOML
  std::vector<std::string> sets;
  int64_t batch = 8, seq_len = 512, dimension = 1024, layers = 2;
  std::string precision = "fp32";
  std::string device;  // cpu | cuda; empty: cpu on a shared-memory cluster, else cuda
  std::vector<BenchLayout> layouts;
};

// {"gpus", "cluster", "model", "batch_size", "precision", "simulated": true, "wall_s",
// "layouts": [{"mode" (null for none), "size", "depth", "status" (ok | failed | skipped),
// "reason", "simulated": true, "forward_ms", "backward_ms", "optimizer_ms", "step_ms",
// "samples_per_s", "peak_mem_bytes", "comm_bytes", "dp_comm_bytes", "dp"}]}.
std::string benchmark_layouts_json(const BenchOptions& o, const Cluster& cluster,
                                   const Calibration& cal);

}  // namespace cai::sim
