#include "cmd_benchmark.h"

#include <nlohmann/json.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "../cli_checks.h"
#include "benchmark_internal.h"
#include "cai/config/config.h"
#include "cai/core/error.h"
#include "cai/core/rng.h"
#include "cai/dist/communicator.h"
#include "cai/dist/launch.h"
#include "cai/dist/nccl.h"
#include "cai/nn/tensor_parallel.h"
#include "cai/nn/vit.h"
#include "cai/ops/ops.h"
#include "cai/optim/optimizer.h"
#include "cai/parallel/data_parallel.h"
#include "cai/plan/plan.h"
#include "calibrate.h"
#include "cmd_run.h"
#include "kernels/cpu/parallel.h"
#include "kernels/device.h"

namespace cai::app {

std::string TpLayout::describe() const {
  if (mode == "none") return "none";
  if (mode == "2.5d") return fmt::format("2.5d (size {}, depth {})", size, depth);
  return fmt::format("{} (size {})", mode, size);
}

int64_t integer_root(int64_t n, int k) {
  CAI_CHECK(n >= 0 && k >= 1, "[benchmark] integer_root({}, {}): need n >= 0 and k >= 1", n, k);
  auto pow_le = [&](int64_t r) {  // r^k <= n without overflow
    int64_t p = 1;
    for (int i = 0; i < k; ++i) {
      if (p > n / std::max<int64_t>(r, 1)) return r == 0;
      p *= r;
    }
    return p <= n;
  };
  int64_t lo = 0, hi = 1;
  while (pow_le(hi)) hi *= 2;
  while (hi - lo > 1) {  // lo^k <= n < hi^k
    const int64_t mid = lo + (hi - lo) / 2;
    (pow_le(mid) ? lo : hi) = mid;
  }
  return lo;
}

std::vector<TpLayout> enumerate_layouts(int n) {
  CAI_CHECK(n >= 1, "[benchmark] --gpus {} must be at least 1", n);
  // The modes TensorParallel runs for n ranks, in Colossal-AI's order (1d first).
  std::vector<TpLayout> out{{"none", 1, 1}, {"1d", n, 1}};
  for (const auto& m : nn::TensorParallel::modes_for(n))
    if (m.mode != "1d") out.push_back({m.mode, n, m.depth});
  return out;
}

using namespace detail;

namespace {

// Returns the --compare option (it may come without a file).
CLI::Option* add_flags(CLI::App* sub, BenchmarkOptions& o) {
  sub->add_option("-g,--gpus", o.gpus, "Number of devices (GPUs, or CPU processes) to use")
      ->required()
      ->check(cli::positive());
  sub->add_option("-b,--batch_size", o.batch_size, "Samples per data-parallel rank")
      ->capture_default_str()
      ->check(cli::positive());
  sub->add_option("-s,--seq_len", o.seq_len, "Sequence length (tokens)")
      ->capture_default_str()
      ->check(cli::positive());
  sub->add_option("-d,--dimension", o.dimension, "Hidden dimension")
      ->capture_default_str()
      ->check(cli::positive());
  sub->add_option("-w,--warmup_steps", o.warmup_steps, "Steps run before timing")
      ->capture_default_str()
      ->check(cli::non_negative());
  sub->add_option("-p,--profile_steps", o.profile_steps, "Steps timed")
      ->capture_default_str()
      ->check(cli::positive());
  sub->add_option("-l,--layers", o.layers, "Layers of the mlp or block model")
      ->capture_default_str()
      ->check(cli::positive());
  sub->add_option("-m,--model", o.model,
                  "mlp: layers × Linear(d, d) (Colossal-AI's); block: ViT blocks of hidden d; "
                  "vit: the model of --config")
      ->capture_default_str()
      ->check(CLI::IsMember({"mlp", "block", "vit"}));
  sub->add_option("--config", o.config, "A vit_train TOML (--model vit)");
  sub->add_option("--set", o.overrides, "section.key=value overrides of --config (repeatable)")
      ->allow_extra_args(false);
  sub->add_option("--device", o.device, "cpu or cuda (default: cuda when a GPU is visible)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_option("--precision", o.precision, "fp32, bf16 or fp16 compute")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  sub->add_option("--hostfile", o.hostfile, "Hosts to run on (as colossalai run)");
  sub->add_option("--json", o.json,
                  "Also write the table as JSON to this file (--search: every layout that fits, "
                  "simulated, best first, each with the vit_train config that runs it)");
  sub->add_flag("--simulate", o.simulate, "Estimate with colossalai-sim instead of measuring");
  sub->add_option("--cluster", o.cluster, "Virtual cluster file (hostfiles/clusters/*.toml)");
  sub->add_option("--calibration", o.calibration,
                  "--simulate/--compare/--search: the simulator's calibration profile "
                  "(--calibrate's output, sim/calibrations/*.json)");
  auto* compare =
      sub->add_option(
             "--compare", o.compare,
             "After measuring, print each layout's simulated step time beside it: from this "
             "JSON (colossalai-sim --benchmark-layouts or benchmark --simulate --json), or "
             "simulated now with --cluster when no file is given")
          ->expected(0, 1);
  sub->add_flag("--search", o.search,
                "Rank whole layouts of --gpus processes by simulated throughput (needs --config "
                "and --cluster): the config's [parallel] section is the starting point, not a "
                "constraint; its other keys and its global batch are kept");
  sub->add_option("--out", o.out,
                  "--search: write the best layout as a whole vit_train config (the config with "
                  "the pick's [parallel] keys, model.checkpoint and train.batch_size) that "
                  "`colossalai run --nproc_per_node N vit_train --config FILE` runs as written");
  sub->add_option("--calibrate", o.calibrate, "Time kernels and collectives, write JSON");
  sub->add_option("--calibrate-warmup", o.calibrate_warmup_s,
                  "--calibrate on a GPU: seconds of the model's steps before each batch size's "
                  "layers are timed in place, so that they run at the clocks of a GPU that has "
                  "been training (power cap, temperature); 0 times a cool GPU")
      ->check(cli::seconds_up_to(600))
      ->capture_default_str();
  return compare;
}

std::string model_line(const BenchmarkOptions& o) {
  if (o.model == "mlp")
    return fmt::format("mlp: {} × Linear({}, {}) on [{}, {}, {}]", o.layers, o.dimension,
                       o.dimension, o.batch_size, o.seq_len, o.dimension);
  if (o.model == "block")
    return fmt::format("block: {} ViT block(s) of hidden {} ({} heads) on [{}, {}, {}]", o.layers,
                       o.dimension, std::max<int64_t>(1, o.dimension / 64), o.batch_size, o.seq_len,
                       o.dimension);
  return fmt::format("vit: {} ({} images per step, AdamW)", o.config, o.batch_size);
}

void sort_rows(std::vector<Row>& rows) {
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    if ((a.status == "ok") != (b.status == "ok")) return a.status == "ok";
    return a.status == "ok" && a.samples_per_s > b.samples_per_s;  // most samples/s first
  });
}

// The table, best first. `how`: "measured" or the simulation's description.
void print_rows(const BenchmarkOptions& o, const std::string& title, std::vector<Row> rows) {
  sort_rows(rows);
  std::cout << title << "\n";
  const bool vit = o.model == "vit";
  std::cout << fmt::format(
      "{:<28} {:<8} {:>11} {:>12}{} {:>10} {:>10} {:>12} {:>9} {:>14} {:>14}\n", "layout", "status",
      "forward ms", "backward ms", vit ? fmt::format(" {:>9}", "optim ms") : "", "step ms",
      "samples/s", "samples/s/GPU", "TFLOP/s", "peak MiB/rank", "comm MiB/step");
  for (const Row& r : rows) {
    if (r.status != "ok") {
      std::cout << fmt::format("{:<28} {:<8} {}\n", r.layout.describe(), r.status, r.reason);
      continue;
    }
    std::cout << fmt::format(
        "{:<28} {:<8} {:>11.3f} {:>12.3f}{} {:>10.3f} {:>10.1f} {:>12.1f} {:>9} {:>14.1f} "
        "{:>14.2f}{}\n",
        r.layout.describe(), r.status, r.forward_ms, r.backward_ms,
        !vit                ? ""
        : r.optimizer_known ? fmt::format(" {:>9.3f}", r.optimizer_ms)
                            : fmt::format(" {:>9}", "-"),
        r.step_ms, r.samples_per_s, r.samples_per_s / std::max(r.gpus, 1),
        r.tflops > 0 ? fmt::format("{:.3g}", r.tflops) : std::string("-"),
        static_cast<double>(r.peak_mem_bytes) / (1 << 20),
        static_cast<double>(r.comm_bytes) / (1 << 20), r.fits ? "" : "  (does not fit)");
  }
}

}  // namespace

namespace detail {

void print_table(const BenchmarkOptions& o, int n, const std::string& device,
                 std::vector<Row> rows) {
  sort_rows(rows);
  print_rows(o,
             fmt::format("colossalai benchmark: {} rank(s) ({}, {}), {}; {} warmup + {} profile "
                         "steps (measured)",
                         n, device, o.precision, model_line(o), o.warmup_steps, o.profile_steps),
             rows);
  if (o.json.empty()) return;
  nlohmann::json j;
  j["gpus"] = n;
  j["device"] = device;
  j["precision"] = o.precision;
  j["model"] = o.model;
  j["batch_size"] = o.batch_size;
  j["seq_len"] = o.seq_len;
  j["dimension"] = o.dimension;
  j["layers"] = o.layers;
  for (const Row& r : rows) {
    nlohmann::json e;
    e["mode"] = r.layout.mode == "none" ? nlohmann::json() : nlohmann::json(r.layout.mode);
    e["size"] = r.layout.size;
    e["depth"] = r.layout.depth;
    e["status"] = r.status;
    e["reason"] = r.reason;
    e["simulated"] = false;
    if (r.status == "ok") {
      e["forward_ms"] = r.forward_ms;
      e["backward_ms"] = r.backward_ms;
      e["optimizer_ms"] = r.optimizer_ms;
      e["step_ms"] = r.step_ms;
      e["samples_per_s"] = r.samples_per_s;
      e["samples_per_s_per_gpu"] = r.samples_per_s / std::max(r.gpus, 1);
      e["tflops"] = r.tflops;
      e["peak_mem_bytes"] = r.peak_mem_bytes;
      e["comm_bytes"] = r.comm_bytes;
    }
    j["layouts"].push_back(e);
  }
  std::ofstream f(o.json);
  CAI_CHECK(f.good(), "[benchmark] cannot write --json {}", o.json);
  f << j.dump(1) << "\n";
}

}  // namespace detail

namespace {

// Rows of a benchmark JSON (measured or simulated: colossalai-sim --benchmark-layouts).
std::vector<Row> read_rows(const std::string& path, bool* simulated = nullptr) {
  std::ifstream f(path);
  CAI_CHECK(f.good(), "[benchmark] cannot read {}", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    fail("[benchmark] {} is not a benchmark JSON: {}", path, e.what());
  }
  CAI_CHECK(j.contains("layouts") && j["layouts"].is_array(),
            "[benchmark] {} has no \"layouts\" array (a --json of colossalai benchmark or "
            "colossalai-sim --benchmark-layouts)",
            path);
  // Every field checked for its type and range: a file that is not what benchmark or
  // colossalai-sim wrote is a cai::Error naming the file and the entry, never a crash.
  std::vector<Row> rows;
  size_t at = 0;
  try {
    auto flag = [&](const nlohmann::json& o, const char* k, bool def) {
      if (!o.contains(k)) return def;
      CAI_CHECK(o[k].is_boolean(), "\"{}\" must be true or false", k);
      return o[k].get<bool>();
    };
    auto integer = [&](const nlohmann::json& o, const char* k, int64_t def, int64_t hi) {
      if (!o.contains(k)) return def;
      CAI_CHECK(o[k].is_number_integer() && o[k].get<int64_t>() >= 1 && o[k].get<int64_t>() <= hi,
                "\"{}\" must be a whole number in [1, {}]", k, hi);
      return o[k].get<int64_t>();
    };
    auto text = [&](const nlohmann::json& o, const char* k, const std::string& def) {
      if (!o.contains(k)) return def;
      CAI_CHECK(o[k].is_string(), "\"{}\" must be a string", k);
      return o[k].get<std::string>();
    };
    // Milliseconds, rates and bytes: absent, null or a number in [0, 2^62].
    auto num = [&](const nlohmann::json& o, const char* k) {
      if (!o.contains(k) || o[k].is_null()) return 0.0;
      CAI_CHECK(o[k].is_number(), "\"{}\" must be a number", k);
      const double v = o[k].get<double>();
      CAI_CHECK(std::isfinite(v) && v >= 0 && v <= 4.6e18, "\"{}\" = {} is outside [0, 2^62]", k,
                v);
      return v;
    };
    if (simulated) *simulated = flag(j, "simulated", false);
    const int gpus = static_cast<int>(integer(j, "gpus", 1, 1 << 24));
    for (const auto& e : j["layouts"]) {
      CAI_CHECK(e.is_object(), "a layout must be an object");
      Row r;
      CAI_CHECK(!e.contains("mode") || e["mode"].is_null() || e["mode"].is_string(),
                "\"mode\" must be null or a string");
      r.layout.mode =
          !e.contains("mode") || e["mode"].is_null() ? "none" : e["mode"].get<std::string>();
      CAI_CHECK(r.layout.mode == "none" || r.layout.mode == "1d" || r.layout.mode == "2d" ||
                    r.layout.mode == "2.5d" || r.layout.mode == "3d",
                "\"mode\" = \"{}\" is not null, 1d, 2d, 2.5d or 3d", r.layout.mode);
      r.layout.size = static_cast<int>(integer(e, "size", 1, 1 << 24));
      r.layout.depth = static_cast<int>(integer(e, "depth", 1, 1 << 24));
      r.status = text(e, "status", "ok");
      r.reason = text(e, "reason", "");
      r.simulated = flag(e, "simulated", false);
      if (r.status == "ok") {
        r.forward_ms = num(e, "forward_ms");
        r.backward_ms = num(e, "backward_ms");
        r.optimizer_known = e.contains("optimizer_ms") && e["optimizer_ms"].is_number();
        r.optimizer_ms = num(e, "optimizer_ms");
        r.step_ms = num(e, "step_ms");
        r.samples_per_s = num(e, "samples_per_s");
        r.gpus = gpus;
        r.tflops = num(e, "tflops");
        r.peak_mem_bytes = static_cast<int64_t>(num(e, "peak_mem_bytes"));
        r.comm_bytes = static_cast<int64_t>(num(e, "comm_bytes"));
        r.fits = flag(e, "fits_memory", true);
      }
      rows.push_back(r);
      ++at;
    }
  } catch (const Error& e) {
    fail("[benchmark] {}: layout {}: {}", path, at, e.what());
  } catch (const nlohmann::json::exception& e) {
    fail("[benchmark] {}: layout {}: {}", path, at, e.what());
  }
  return rows;
}

// colossalai-sim beside this binary, else on PATH; the error names both places.
std::string find_sim() {
  namespace fs = std::filesystem;
  const fs::path beside = fs::path(self_exe()).parent_path() / "colossalai-sim";
  if (::access(beside.c_str(), X_OK) == 0) return beside.string();
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  for (size_t from = 0; from <= dirs.size();) {
    const size_t at = std::min(dirs.find(':', from), dirs.size());
    const std::string dir = dirs.substr(from, at - from);
    if (!dir.empty()) {
      const fs::path p = fs::path(dir) / "colossalai-sim";
      if (::access(p.c_str(), X_OK) == 0) return p.string();
    }
    from = at + 1;
  }
  fail(
      "[benchmark] colossalai-sim is neither beside this binary ({}) nor on PATH: build it "
      "(cmake --build build --target colossalai-sim; it needs SimGrid) or put its directory on "
      "PATH",
      beside.string());
}

// Runs argv (argv[0] a path) with our stdout and stderr; its exit code.
int run_program(const std::vector<std::string>& argv) {
  std::fflush(stdout);
  std::cout.flush();
  std::vector<char*> c;
  for (const auto& a : argv) c.push_back(const_cast<char*>(a.c_str()));
  c.push_back(nullptr);
  const pid_t pid = ::fork();
  CAI_CHECK(pid >= 0, "[benchmark] fork: {}", std::strerror(errno));
  if (pid == 0) {
    ::execv(c[0], c.data());
    std::fprintf(stderr, "colossalai benchmark: cannot run %s: %s\n", c[0], std::strerror(errno));
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

// A fresh file name under the temporary directory.
std::string temp_json() {
  std::string p =
      (std::filesystem::temp_directory_path() / "colossalai-benchmark-XXXXXX.json").string();
  const int fd = ::mkstemps(p.data(), 5);
  CAI_CHECK(fd >= 0, "[benchmark] cannot create a temporary file {}: {}", p, std::strerror(errno));
  ::close(fd);
  return p;
}

// colossalai-sim --benchmark-layouts for the benchmark's layouts and model; writes its JSON to
// `out`. Throws when colossalai-sim is missing or fails.
void simulate_layouts(const BenchmarkOptions& o, const std::string& out) {
  CAI_CHECK(!o.cluster.empty(),
            "[benchmark] --simulate and --compare without a file need --cluster FILE (a virtual "
            "cluster, hostfiles/clusters/*.toml)");
  std::vector<std::string> a = {find_sim(),    "--benchmark-layouts",
                                "--nproc",     std::to_string(o.gpus),
                                "--cluster",   o.cluster,
                                "--model",     o.model,
                                "--batch",     std::to_string(o.batch_size),
                                "--seq-len",   std::to_string(o.seq_len),
                                "--dimension", std::to_string(o.dimension),
                                "--layers",    std::to_string(o.layers),
                                "--precision", o.precision,
                                "--json",      out};
  if (!o.device.empty()) a.insert(a.end(), {"--device", o.device});
  if (!o.config.empty()) a.insert(a.end(), {"--config", o.config});
  if (!o.calibration.empty()) a.insert(a.end(), {"--calibration", o.calibration});
  for (const auto& s : o.overrides) a.insert(a.end(), {"--set", s});
  for (const TpLayout& l : enumerate_layouts(o.gpus))
    a.insert(a.end(), {"--layout", fmt::format("{}:{}:{}", l.mode, l.size, l.depth)});
  const int rc = run_program(a);
  CAI_CHECK(rc == 0, "[benchmark] {} --benchmark-layouts failed (exit {})", a[0], rc);
}

}  // namespace

namespace detail {

// Measured beside simulated step times, per layout.
void print_compare(const BenchmarkOptions& o, const std::vector<Row>& measured,
                   const std::string& sim_path) {
  bool simulated = false;
  const std::vector<Row> sim = read_rows(sim_path, &simulated);
  std::cout << fmt::format("measured against {} ({}):\n", sim_path,
                           simulated ? "simulated" : "not marked simulated");
  std::cout << fmt::format("{:<28} {:>16} {:>16} {:>10}\n", "layout", "measured step ms",
                           "simulated ms", "rel. error");
  for (const Row& m : measured) {
    const Row* s = nullptr;
    for (const Row& r : sim)
      if (r.layout == m.layout) s = &r;
    auto cell = [](const Row* r) {
      return r && r->status == "ok" ? fmt::format("{:>16.3f}", r->step_ms)
                                    : fmt::format("{:>16}", r ? r->status : "absent");
    };
    std::string err = "-";
    if (m.status == "ok" && s && s->status == "ok" && m.step_ms > 0)
      err = fmt::format("{:+.1f}%", 100.0 * (s->step_ms - m.step_ms) / m.step_ms);
    std::cout << fmt::format("{:<28} {} {} {:>10}\n", m.layout.describe(), cell(&m), cell(s), err);
  }
  if (o.model == "vit")
    std::cout << "(simulated: dp = ranks / tensor size with its gradient all-reduce, and no "
                 "optimizer cost; the measured none layout runs independent replicas)\n";
  else
    std::cout << "(simulated: forward and backward of the same layers with the same "
                 "tensor-parallel collectives; ranks / tensor size independent groups, as "
                 "measured)\n";
}

}  // namespace detail

namespace {

std::vector<std::string> worker_args(const BenchmarkOptions& o, const std::string& device) {
  std::vector<std::string> a = {"_benchmark_worker",
                                "--gpus",
                                std::to_string(o.gpus),
                                "-b",
                                std::to_string(o.batch_size),
                                "-s",
                                std::to_string(o.seq_len),
                                "-d",
                                std::to_string(o.dimension),
                                "-w",
                                std::to_string(o.warmup_steps),
                                "-p",
                                std::to_string(o.profile_steps),
                                "-l",
                                std::to_string(o.layers),
                                "-m",
                                o.model,
                                "--device",
                                device,
                                "--precision",
                                o.precision};
  if (!o.config.empty()) a.insert(a.end(), {"--config", o.config});
  for (const auto& s : o.overrides) a.insert(a.end(), {"--set", s});
  if (!o.json.empty()) a.insert(a.end(), {"--json", o.json});
  if (!o.compare.empty()) a.insert(a.end(), {"--compare", o.compare});
  if (!o.calibrate.empty())
    a.insert(a.end(), {"--calibrate", o.calibrate, "--calibrate-warmup",
                       fmt::format("{}", o.calibrate_warmup_s)});
  return a;
}

}  // namespace

void setup_benchmark(CLI::App& app, BenchmarkOptions& opts) {
  auto* sub = app.add_subcommand(
      "benchmark",
      "Colossal-AI's tensor-parallel micro-benchmark: every layout of --gpus N (none, 1d, 2d, "
      "2.5d, 3d) measured on N ranks started like `colossalai run`");
  CLI::Option* compare = add_flags(sub, opts);
  sub->callback([&opts, compare] { opts.compare_requested = compare->count() > 0; });
  sub->footer(
      "Every layout takes -b samples per data-parallel rank: `none` is N-way data parallel "
      "(each rank its own b samples, gradients all-reduced as vit_train's DDP, N·b samples a "
      "step), a tensor layout one group of N ranks (b samples a step), measured or simulated "
      "alike. Rows are sorted by samples/s; samples/s/GPU, the achieved forward + backward "
      "TFLOP/s per GPU (the plan's FLOPs) and the measured peak per rank stand beside each. "
      "Shapes that do not divide are listed as failed with the reason. --simulate (with "
      "--cluster) prints the same table from colossalai-sim, found beside this binary or on "
      "PATH: every layout as data parallel N / tensor size × that layout, simulated through the "
      "plan (-m vit: the --config model with its gradient all-reduce; -m block and mlp: the "
      "measured layers and their collectives). --compare [SIM.json] prints "
      "measured and simulated step times side by side; --search ranks whole layouts "
      "(colossalai-sim --search: dp × pp × tensor mode and size × ZeRO stage × schedule × "
      "micro-batches × gradient accumulation × checkpointing; with parallel.cpu_offload ZeRO "
      "with offload also on one replica, host memory checked) of --gpus processes, starting "
      "from the config's [parallel] layout even when it does not divide --gpus, keeping its "
      "other keys and its global batch (batch_size × gradient_accumulation × the config's dp "
      "on --gpus, or one replica's when its layout does not divide; each layout's batch_size × "
      "gradient_accumulation = global / its dp), "
      "and --out writes the best as the whole config with those layout keys replaced. "
      "--calibrate OUT --config F times the "
      "model's kernels for the simulator, scaled to its layers timed in place (-g 1), and with "
      "-g N > 1 the collectives over message sizes on N ranks (MPI on CPU, NCCL on GPUs) and, on "
      "GPUs, a block's compute beside all-reduces (the SM sharing), beside a posted receive at "
      "the config's batch and its halves (over the pipeline's channels, parallel.p2p_max_ctas, "
      "with its GEMMs' margin) and on every GPU at once (their speeds under sustained load), on "
      "CPUs a block's compute on "
      "one rank alone and on one rank per core at once (the contention).");
  auto* worker = app.add_subcommand("_benchmark_worker", "one rank of colossalai benchmark");
  worker->group("");  // hidden
  add_flags(worker, opts);
  worker->callback([&opts] { opts.worker = true; });
}

size_t read_benchmark_json(const std::string& path) {
  return read_rows(path).size();
}

int run_benchmark(const BenchmarkOptions& o) {
  if (!o.calibrate.empty()) {
    // One process: the kernels. N: the collectives too, on N ranks (already under mpirun or
    // `colossalai run`, or started here like the benchmark's workers).
    if (o.gpus <= 1) return run_calibrate(o);
    if (dist::launch_from_env().world_size > 1) return run_calibrate_ranks(o);
    CAI_CHECK(!o.config.empty(),
              "[benchmark] --calibrate needs --config (a vit_train TOML whose model it times)");
    (void)config::load_config(o.config, o.overrides);  // errors before launching
  }
  CAI_CHECK(o.model != "vit" || !o.config.empty(),
            "[benchmark] --model vit needs --config (a vit_train TOML)");
  if (!o.config.empty())
    (void)config::load_config(o.config, o.overrides);  // errors before launching
  if (o.search) {
    CAI_CHECK(!o.config.empty() && !o.cluster.empty(),
              "[benchmark] --search needs --config FILE (a vit_train TOML) and --cluster FILE");
    std::vector<std::string> a = {find_sim(),  "--search", "--config",
                                  o.config,    "--nproc",  std::to_string(o.gpus),
                                  "--cluster", o.cluster};
    for (const auto& s : o.overrides) a.insert(a.end(), {"--set", s});
    if (!o.calibration.empty()) a.insert(a.end(), {"--calibration", o.calibration});
    if (!o.out.empty()) a.insert(a.end(), {"--out", o.out});
    if (!o.json.empty()) a.insert(a.end(), {"--json", o.json, "--exhaustive"});
    return run_program(a);
  }
  if (o.simulate) {
    const std::string out = o.json.empty() ? temp_json() : o.json;
    try {
      simulate_layouts(o, out);
    } catch (...) {
      if (o.json.empty()) std::filesystem::remove(out);
      throw;
    }
    bool simulated = false;
    const std::vector<Row> rows = read_rows(out, &simulated);
    if (o.json.empty()) std::filesystem::remove(out);
    print_rows(o,
               fmt::format("colossalai benchmark: {} GPU(s) of {} ({}), {}; dp = GPUs / tensor "
                           "size (simulated by colossalai-sim, bulk collectives{})",
                           o.gpus, o.cluster, o.precision, model_line(o),
                           o.model == "vit" ? "; optimizer step not modelled" : ""),
               rows);
    return 0;
  }
  BenchmarkOptions measured = o;
  std::string sim_json;
  if (o.compare_requested && o.compare.empty()) {
    // No file: simulate the layouts first, then measure and compare.
    sim_json = temp_json();
    simulate_layouts(o, sim_json);
    measured.compare = sim_json;
  }
  std::string device = o.device;
  if (device.empty()) device = kernels::cuda::device_count() > 0 ? "cuda" : "cpu";
  RunOptions ro;
  ro.nproc_per_node = o.gpus;
  if (!o.hostfile.empty()) {
    const auto hosts = read_hostfile(o.hostfile);
    const int h = static_cast<int>(hosts.size());
    CAI_CHECK(o.gpus % h == 0, "[benchmark] --gpus {} is not divisible by the {} hosts of {}",
              o.gpus, h, o.hostfile);
    ro.hostfile = o.hostfile;
    ro.nproc_per_node = o.gpus / h;
  }
  if (device == "cuda") ro.env.push_back("NCCL_NVLS_ENABLE=0");
  const int cores = kernels::cpu::job_cores();
  if (device == "cpu" && o.hostfile.empty() && o.gpus > cores)
    std::cerr << fmt::format(
        "[benchmark] {} processes share {} CPU core(s): every layout is measured {}x "
        "oversubscribed, far slower than on {} devices. To estimate {} GPUs instead: colossalai "
        "benchmark --gpus {} --simulate --cluster hostfiles/clusters/<cluster>.toml\n",
        o.gpus, cores, (o.gpus + cores - 1) / cores, o.gpus, o.gpus, o.gpus);
  std::cerr << fmt::format("[benchmark] {} layout(s) on {} {} rank(s), {} + {} steps each\n",
                           enumerate_layouts(o.gpus).size(), o.gpus, device, o.warmup_steps,
                           o.profile_steps);
  ro.command = worker_args(measured, device);
  ro.command.insert(ro.command.begin(), self_exe());
  const int rc = run_launch(ro);
  if (!sim_json.empty()) std::filesystem::remove(sim_json);
  return rc;
}

}  // namespace cai::app
