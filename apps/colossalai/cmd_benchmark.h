// `colossalai benchmark`: Colossal-AI's tensor-parallel micro-benchmark, brought back. For
// `--gpus N` it lists every tensor-parallel layout Colossal-AI enumerates (none, 1d, 2d when N is
// a square, 2.5d for each depth d with N/d a square, 3d when N is a cube; integer arithmetic),
// starts N ranks through the same launcher as `colossalai run` (a hidden `_benchmark_worker`
// subcommand, kept alive across layouts) and measures each layout it can run: forward, backward
// (and for `--model vit` the optimizer step) averaged over the profile steps, samples/s, peak
// memory per rank and tensor-parallel communication bytes per step. Rank 0 prints the table, best
// first; a layout this build cannot run, or whose shapes do not divide, is listed as skipped or
// failed with its reason.
//
//   colossalai benchmark -g N [-b 8] [-s 512] [-d 1024] [-w 10] [-p 50] [-l 2] [-m mlp|block|vit]
//                        [--config F [--set k=v]] [--device cpu|cuda] [--precision fp32|bf16|fp16]
//                        [--hostfile F] [--json OUT] [--compare [SIM.json] [--cluster C]]
//   colossalai benchmark -g N --simulate --cluster C -m vit --config F [--json OUT]
//   colossalai benchmark -g N --search --cluster C --config F [--out best.toml]
//
// Simulation runs colossalai-sim (beside this binary, else on PATH; this binary does not link
// SimGrid): --simulate prints the table for every layout as data parallel N / T × the layout,
// marked simulated (sim/bench_layouts.h says what each column means there); --compare prints a
// measured run's step times beside a simulated JSON's (simulated on the spot with --cluster when
// no file is given); --search runs colossalai-sim --search.
//
// Models: mlp (layers × Linear(d, d), no activation, Colossal-AI's), block (ViT blocks of hidden
// d, d/64 heads, on [b, s, d]), vit (the model of a vit_train config, with AdamW).
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace cai::app {

struct BenchmarkOptions {
  int gpus = 0;  // required
  int64_t batch_size = 8, seq_len = 512, dimension = 1024;
  int64_t warmup_steps = 10, profile_steps = 50, layers = 2;
  std::string model = "mlp";  // mlp | block | vit
  std::string config;         // --model vit: a vit_train TOML
  std::vector<std::string> overrides;
  std::string device;  // cpu | cuda; empty: cuda when a GPU is visible
  std::string precision = "fp32";
  std::string hostfile;
  std::string json;
  bool simulate = false, search = false;
  std::string cluster, compare, calibrate, out;
  std::string calibration;  // --simulate/--compare/--search: colossalai-sim --calibration FILE
  // --calibrate on a GPU: seconds of sustained load before each in-place timing of the layers.
  double calibrate_warmup_s = 6.0;
  bool compare_requested = false;  // --compare given (with or without a file)
  bool worker = false;             // the hidden _benchmark_worker subcommand
};

// Reads a benchmark JSON as --compare does (a --json of colossalai benchmark or colossalai-sim
// --benchmark-layouts) and returns its row count; anything malformed is a cai::Error naming the
// file and the entry (a fuzz target).
size_t read_benchmark_json(const std::string& path);

// One tensor-parallel layout of N devices. mode: "none", "1d", "2d", "2.5d" or "3d".
struct TpLayout {
  std::string mode;
  int size = 1;
  int depth = 1;                 // 2.5d only
  std::string describe() const;  // "2.5d (depth 2)"
  bool operator==(const TpLayout&) const = default;
};

// Colossal-AI's enumeration for n devices (n >= 1), in its order: none, 1d, 2d, 2.5d by depth,
// 3d. Exact integer square and cube roots (64 and 4096 are cubes).
std::vector<TpLayout> enumerate_layouts(int n);
// The largest r with r^k <= n (n >= 0, k >= 1), exactly.
int64_t integer_root(int64_t n, int k);

void setup_benchmark(CLI::App& app, BenchmarkOptions& opts);
// The launcher side: checks the options, starts the ranks, returns the exit code.
int run_benchmark(const BenchmarkOptions& opts);
// One rank (under mpirun): runs every layout and, on rank 0, prints the table.
int run_benchmark_worker(const BenchmarkOptions& opts);

}  // namespace cai::app
