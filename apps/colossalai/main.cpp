// colossalai: one binary, one file per subcommand. main only wires the setups.
#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>

#include "cai/core/error.h"
#include "cai/core/version.h"
#include "cai/dist/launch.h"
#include "cmd_benchmark.h"
#include "cmd_check.h"
#include "cmd_run.h"

int main(int argc, char** argv) {
  // A rank of a multi-process benchmark or calibration: before any CUDA call (see launch.h).
  try {
    cai::dist::prefer_eager_cuda_module_loading(cai::dist::launch_from_env());
  } catch (const cai::Error&) {
    // A malformed launcher environment is reported by the subcommand that needs it.
  }
  CLI::App app{
      "ColossalAI-cpp: train Vision Transformers with data, pipeline, tensor and ZeRO "
      "parallelism"};
  app.set_version_flag("--version",
                       std::string("colossalai ") + cai::version() + " (" + cai::git_hash() + ")");
  app.require_subcommand(1);
  cai::app::CheckOptions check;
  cai::app::setup_check(app, check);
  cai::app::RunOptions run;
  cai::app::setup_run(app, run);
  cai::app::BenchmarkOptions bench;
  cai::app::setup_benchmark(app, bench);
  CLI11_PARSE(app, argc, argv);
  const std::string self_dir =
      std::filesystem::weakly_canonical(std::filesystem::path(argv[0])).parent_path().string();
  try {
    if (app.got_subcommand("check")) return cai::app::run_check(check, self_dir);
    if (app.got_subcommand("run")) return cai::app::run_launch(run);
    if (app.got_subcommand("_rank_wrapper")) return cai::app::run_rank_wrapper(run);
    if (app.got_subcommand("benchmark")) return cai::app::run_benchmark(bench);
    if (app.got_subcommand("_benchmark_worker")) return cai::app::run_benchmark_worker(bench);
  } catch (const cai::Error& e) {
    std::cerr << "colossalai: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
