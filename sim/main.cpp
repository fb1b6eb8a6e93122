// colossalai-sim: replays a training step on a virtual cluster (SimGrid).
//
//   colossalai-sim --cluster hostfiles/clusters/h100-1.toml --nproc 4 --schedule 1f1b --stages 4
//       --microbatches 8 --fwd-ms 10 --bwd-ms 20 --act-bytes 1e6 --json out.json --trace out.trace
//   colossalai-sim --cluster hostfiles/clusters/h100-1024.toml --nproc 1024 --data-parallel
//       --fwd-ms 100 --bwd-ms 200 --grad-bytes 2e9
//   colossalai-sim --config apps/vit_train/configs/fmnist_tiny.toml [--set k=v] --nproc 2
//       --cluster hostfiles/clusters/cpu-2.toml --json out.json   (the plan's workload)
#include <simgrid/engine.h>
#include <simgrid/version.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "bench_layouts.h"
#include "cai/core/error.h"
#include "cai/schedule/schedule.h"
#include "cluster.h"
#include "expand.h"
#include "from_config.h"
#include "link_fit.h"
#include "replay.h"
#include "report.h"
#include "search.h"

namespace {

struct Options {
  std::string cluster, json, trace, calibration, config, schedule, dtype = "bf16";
  std::string collectives = "calibrated";
  std::vector<std::string> sets;
  int nproc = 0, stages = 1, microbatches = 0, chunks = 0;
  double fwd_ms = 1, bwd_ms = 2, optimizer_ms = 0, act_bytes = 0, grad_bytes = 0;
  int64_t global_batch = 0;
  bool data_parallel = false, version = false, quiet = false, search = false, no_fold = false;
  bool exhaustive = false, benchmark_layouts = false;
  std::string model = "vit", precision = "fp32", device;
  std::vector<std::string> layouts;
  int64_t batch = 8, seq_len = 512, dimension = 1024, layers = 2;
  int top = 10;
  std::string out;
};

void write(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  CAI_CHECK(f.good(), "[sim] cannot write {}", path);
  f << text;
}

int run(const Options& o) {
  using namespace cai::sim;
  if (o.benchmark_layouts) {
    CAI_CHECK(o.nproc > 0 && !o.cluster.empty(),
              "[sim] --benchmark-layouts needs --nproc N and --cluster FILE");
    BenchOptions bo;
    bo.gpus = o.nproc;
    bo.model = o.model;
    bo.config = o.config;
    bo.sets = o.sets;
    bo.batch = o.batch;
    bo.seq_len = o.seq_len;
    bo.dimension = o.dimension;
    bo.layers = o.layers;
    bo.precision = o.precision;
    bo.device = o.device;
    for (const auto& l : o.layouts) bo.layouts.push_back(parse_bench_layout(l, o.nproc));
    const Calibration cal =
        o.calibration.empty() ? default_calibration() : load_calibration(o.calibration);
    const std::string j = benchmark_layouts_json(bo, load_cluster(o.cluster), cal);
    if (o.json.empty())
      std::cout << j << "\n";
    else
      write(o.json, j + "\n");
    return 0;
  }
  if (o.search) {
    CAI_CHECK(!o.config.empty() && o.nproc > 0 && !o.cluster.empty(),
              "[sim] --search needs --config FILE, --nproc N and --cluster FILE");
    const cai::config::TrainConfig cfg = cai::config::load_config(o.config, o.sets);
    const Cluster cluster = load_cluster(o.cluster);
    SearchOptions so;
    so.keep = std::max(o.top, 1);
    so.exhaustive = o.exhaustive;
    if (!o.calibration.empty()) so.replay.calibration = load_calibration(o.calibration);
    const SearchResult r = search_layouts(cfg, o.nproc, cluster, so);
    std::cout << fmt::format(
        "layout search: {} on {} processes of {}: {} layouts considered, {} refused by "
        "vit_train's checks, {} over {:.1f} GiB per GPU{}; {} fit: {} simulated{} ({:.2f} s)\n",
        o.config, o.nproc, o.cluster, r.considered, r.invalid, r.too_big,
        static_cast<double>(cluster.gpu.memory_bytes) / double(1ull << 30),
        r.host_too_big > 0
            ? fmt::format(", {} over the host's {:.1f} GiB per GPU (offload)", r.host_too_big,
                          static_cast<double>(cluster.host.memory_bytes) / double(1ull << 30))
            : "",
        r.simulated + r.bounded, r.simulated,
        r.bounded > 0 ? fmt::format(", {} left out: their lower bound is not below the {}th best "
                                    "(--exhaustive simulates them)",
                                    r.bounded, so.keep)
                      : "",
        r.wall_s);
    std::cout << search_start_line(r, o.nproc) << "\n";
    std::cout << fmt::format("{:>4}  {:<62} {:>10} {:>11} {:>8} {:>9} {:>9}\n", "rank", "layout",
                             "step ms", "img/s", "bubble", "bound ms", "peak GiB");
    for (size_t i = 0; i < r.ranked.size() && static_cast<int>(i) < o.top; ++i) {
      const Candidate& c = r.ranked[i];
      std::cout << fmt::format("{:>4}  {:<62} {:>10.3f} {:>11.1f} {:>8.3f} {:>9.3f} {:>9.3f}\n",
                               i + 1, c.layout, c.step_ms, c.img_per_s, c.bubble, c.bound_ms,
                               static_cast<double>(c.peak_mem_bytes) / double(1ull << 30));
    }
    if (!o.json.empty()) {
      // Every simulated layout, best first, with the vit_train config that runs it (the
      // validation of the search measures these configs: scripts/gpu-layouts search).
      nlohmann::json j;
      j["config"] = o.config;
      j["nproc"] = o.nproc;
      j["cluster"] = o.cluster;
      j["calibration"] = o.calibration;
      j["considered"] = r.considered;
      j["simulated"] = r.simulated;
      j["bounded"] = r.bounded;
      j["base_layout"] = r.base_layout;
      j["base_processes"] = r.base_processes;
      j["global_batch"] = r.global_batch;
      j["refused"] = nlohmann::json::array();
      for (const auto& [why, n] : r.refusals)
        j["refused"].push_back({{"reason", why}, {"count", n}});
      j["ranked"] = nlohmann::json::array();
      for (size_t i = 0; i < r.ranked.size(); ++i) {
        const Candidate& c = r.ranked[i];
        j["ranked"].push_back({{"rank", i + 1},
                               {"layout", c.layout},
                               {"step_ms", c.step_ms},
                               {"img_per_s", c.img_per_s},
                               {"bubble", c.bubble},
                               {"bound_ms", c.bound_ms},
                               {"peak_mem_bytes", c.peak_mem_bytes},
                               {"host_mem_bytes", c.host_mem_bytes},
                               {"toml", cai::config::to_toml(c.config)}});
      }
      write(o.json, j.dump(1) + "\n");
    }
    if (!o.out.empty()) {
      write(o.out, search_out_header(r, o.nproc, o.cluster) +
                       cai::config::to_toml(r.ranked.front().config));
      std::cout << "best layout written to " << o.out << " (the whole config; run it with "
                << "colossalai run --nproc_per_node " << o.nproc << " vit_train --config " << o.out
                << ")\n";
    }
    return 0;
  }
  CAI_CHECK(!o.schedule.empty() || o.data_parallel || !o.config.empty(),
            "[sim] nothing to replay: give --schedule gpipe|1f1b|interleaved|zbh1|zbv, "
            "--data-parallel or --config FILE");
  CAI_CHECK(!o.cluster.empty(), "[sim] --cluster FILE is required");
  const Cluster c = load_cluster(o.cluster);
  ReplayOptions ro;
  if (!o.calibration.empty()) ro.calibration = load_calibration(o.calibration);
  ro.collectives = parse_collective_model(o.collectives);
  const int nproc = o.nproc > 0 ? o.nproc : (o.data_parallel ? c.gpus() : o.stages);
  // Identical data-parallel replicas are simulated once (replay.h: replicas_per_copy) unless
  // --no-fold or the step-by-step model asks for every rank.
  const bool fold = !o.no_fold && ro.collectives != CollectiveModel::Step;
  Workload w;
  std::string plan_line;
  if (!o.config.empty()) {
    // The vit_train config on nproc processes, through the analytic plan.
    const cai::config::TrainConfig cfg = cai::config::load_config(o.config, o.sets);
    ConfigWorkload cw = workload_from_config(cfg, o.nproc > 0 ? o.nproc : 1, c, fold);
    w = std::move(cw.workload);
    plan_line = fmt::format("plan: predicted peak {:.3f} GiB per rank (the largest stage)\n",
                            static_cast<double>(cw.plan.peak()) / double(1ull << 30));
  } else if (!o.schedule.empty()) {
    CAI_CHECK(o.stages >= 1 && nproc % o.stages == 0,
              "[sim] --nproc {} is not a multiple of --stages {}", nproc, o.stages);
    cai::schedule::ScheduleOptions so;
    so.stages = o.stages;
    so.micro_batches = o.microbatches > 0 ? o.microbatches : o.stages;
    const int chunks = o.chunks > 0 ? o.chunks : o.schedule == "zbv" ? 2 : 1;
    so.chunks = chunks;
    so.activation_bytes = static_cast<int64_t>(o.act_bytes);
    // The zero-bubble generators order their work by these times (the split's halves as
    // ExpandOptions::backward_input_share divides them below).
    if (o.fwd_ms > 0 && o.bwd_ms > 0) {
      const double share = ExpandOptions{}.backward_input_share;
      so.cost_forward = o.fwd_ms;
      so.cost_input = o.bwd_ms * share;
      so.cost_weight = o.bwd_ms * (1 - share);
    }
    const int V = o.stages * chunks;
    const auto s = cai::schedule::make(o.schedule, so, cai::schedule::partition_uniform(V, V));
    cai::schedule::validate_or_throw(s);
    ExpandOptions eo;
    eo.forward_s = {o.fwd_ms * 1e-3 / chunks};
    eo.backward_s = {o.bwd_ms * 1e-3 / chunks};
    eo.optimizer_s = o.optimizer_ms * 1e-3;
    const int dp = nproc / o.stages;
    eo.dp = fold ? replicas_per_copy(c, o.stages, dp) : dp;
    eo.copies = dp / eo.dp;
    if (o.grad_bytes > 0) eo.grad_bytes = {static_cast<int64_t>(o.grad_bytes)};
    eo.activation_bytes = {static_cast<int64_t>(o.act_bytes)};
    eo.global_batch = o.global_batch > 0 ? o.global_batch : int64_t(so.micro_batches) * dp;
    eo.dtype = parse_dtype(o.dtype);
    w = expand_schedule(s, eo);
  } else {
    // Data parallel: forward, backward, one all-reduce of the gradients over every rank, step.
    w.name = fmt::format("data parallel ×{}", nproc);
    w.dtype = parse_dtype(o.dtype);
    w.global_batch = o.global_batch > 0 ? o.global_batch : nproc;
    const int listed = fold ? replicas_per_copy(c, 1, nproc) : nproc;
    w.copies = nproc / listed;
    std::vector<int> all(listed);
    for (int r = 0; r < listed; ++r) all[r] = r;
    const int world = w.add_group(all, w.copies > 1);
    w.ranks.resize(listed);
    for (int r = 0; r < listed; ++r) {
      auto& ops = w.ranks[r].ops;
      ops.push_back(Op::compute("F(mb=0,c=0)", o.fwd_ms * 1e-3, 0));
      ops.push_back(Op::compute("B(mb=0,c=0)", o.bwd_ms * 1e-3, 0));
      Op ar = Op::collective(OpKind::AllReduce, "ReduceGrads", world,
                             static_cast<int64_t>(o.grad_bytes), 0);
      ar.category = "reduce";
      ops.push_back(ar);
      ops.push_back(Op::compute("OptStep", o.optimizer_ms * 1e-3, -1, "optimizer"));
    }
  }
  const ReplayResult r = replay(w, c, ro);
  const std::vector<std::string> warnings = result_warnings(w, r, c, ro.calibration);
  if (!o.json.empty()) {
    nlohmann::json j = nlohmann::json::parse(result_json(w, r));
    j["warnings"] = warnings;
    write(o.json, j.dump(1) + "\n");
  }
  if (!o.trace.empty()) write(o.trace, result_trace(w, r));
  if (!o.quiet) {
    std::cout << result_summary(w, r) << plan_line;
    if (ro.collectives == CollectiveModel::Flows && !ro.calibration.collectives.empty()) {
      // The links the flows ran over (the replay's fit of the same profile).
      const LinkModel lm = fit_links(ro.calibration, c.intra.latency);
      std::cout << "  " << link_fit_report(lm).substr(0, link_fit_report(lm).find('\n') + 1);
    }
    for (const std::string& s : warnings) std::cout << "  warning: " << s << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"colossalai-sim: replay a training step on a virtual cluster (SimGrid)"};
  Options o;
  app.add_flag("--version", o.version, "Print the version and the SimGrid linked");
  app.add_option("--cluster", o.cluster, "Cluster description (hostfiles/clusters/*.toml)");
  app.add_option("--nproc", o.nproc, "Ranks (GPUs or CPU processes) the layout runs on");
  app.add_option("--json", o.json,
                 "Write the result JSON here (--search: every simulated layout, best first, with "
                 "the vit_train config that runs it)");
  app.add_flag("--search", o.search,
               "With --config, --nproc and --cluster: rank every dp × pp × tensor layout of "
               "--nproc processes that fits by simulated throughput. The config's [parallel] "
               "section is the starting point, not a constraint (it need not divide --nproc); "
               "its other keys and its global batch are kept");
  CLI::Option* o_top =
      app.add_option("--top", o.top, "--search: how many layouts to print (and rank exactly)")
          ->capture_default_str();
  CLI::Option* o_exhaustive =
      app.add_flag("--exhaustive", o.exhaustive,
                   "--search: simulate every layout that fits (default: stop once the plan's lower "
                   "bound of the others cannot beat the --top-th best)");
  CLI::Option* o_out =
      app.add_option("--out", o.out,
                     "--search: write the best layout as a complete vit_train config (the "
                     "config with its [parallel] keys, model.checkpoint and train.batch_size "
                     "replaced) that runs as written on --nproc processes");
  CLI::Option* o_trace = app.add_option("--trace", o.trace,
                                        "Write a Chrome trace here (the vit_train --trace format)");
  app.add_option("--calibration", o.calibration,
                 "Calibration profile (JSON, colossalai benchmark --calibrate; sim/calibrations/)");
  CLI::Option* o_collectives =
      app.add_option("--collectives", o.collectives,
                     "Collective model: calibrated (= bulk: a collective whose op and group size "
                     "the calibration measured takes its measured time, slept; one of an op it "
                     "measured on other group sizes runs as flows over links fitted to those "
                     "samples; others the network model, one flow per ring edge), flows (every "
                     "collective and send of "
                     "an op the calibration measured runs as flows over links fitted to its "
                     "samples: contention, unmeasured group sizes and nodes from the link model) "
                     "or step (the network model step by step, exact)")
          ->capture_default_str()
          ->check(CLI::IsMember({"calibrated", "bulk", "flows", "step"}));
  CLI::Option* o_dtype = app.add_option("--dtype", o.dtype, "Compute dtype: fp32, bf16, fp16")
                             ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  CLI::Option* o_global_batch =
      app.add_option("--global-batch", o.global_batch,
                     "Samples per step for img/s (default: one per micro-batch per replica)");
  app.add_option("--config", o.config,
                 "vit_train TOML: its step on --nproc processes, from the analytic plan");
  CLI::Option* o_set =
      app.add_option("--set", o.sets, "Override a config key (section.key=value), with --config");
  app.add_option("--schedule", o.schedule, "Pipeline schedule to replay")
      ->check(CLI::IsMember(cai::schedule::styles()));
  CLI::Option* o_stages =
      app.add_option("--stages", o.stages, "Pipeline stages (nproc / stages pipeline replicas)");
  CLI::Option* o_microbatches =
      app.add_option("--microbatches", o.microbatches, "Micro-batches per step (default: stages)");
  CLI::Option* o_chunks =
      app.add_option("--chunks", o.chunks,
                     "Model chunks per rank (interleaved: >= 2; zbv: 2, its default; else 1)");
  CLI::Option* o_fwd =
      app.add_option("--fwd-ms", o.fwd_ms, "Forward of one micro-batch on one stage, ms");
  CLI::Option* o_bwd =
      app.add_option("--bwd-ms", o.bwd_ms, "Backward of one micro-batch on one stage, ms");
  CLI::Option* o_optms = app.add_option("--optimizer-ms", o.optimizer_ms, "Optimizer step, ms");
  CLI::Option* o_act =
      app.add_option("--act-bytes", o.act_bytes, "Boundary activation bytes per micro-batch");
  CLI::Option* o_grad =
      app.add_option("--grad-bytes", o.grad_bytes, "Gradient bytes all-reduced over data parallel");
  app.add_flag("--benchmark-layouts", o.benchmark_layouts,
               "colossalai benchmark --simulate: simulate every tensor layout of --nproc GPUs "
               "(dp = nproc / tensor size) and write the rows as JSON (--json, else stdout)");
  CLI::Option* o_model =
      app.add_option("--model", o.model, "--benchmark-layouts: vit (--config), block or mlp")
          ->check(CLI::IsMember({"vit", "block", "mlp"}));
  CLI::Option* o_batch =
      app.add_option("--batch", o.batch, "--benchmark-layouts: samples per data-parallel rank")
          ->capture_default_str();
  CLI::Option* o_seq =
      app.add_option("--seq-len", o.seq_len, "--benchmark-layouts: tokens (block, mlp)");
  CLI::Option* o_dim =
      app.add_option("--dimension", o.dimension, "--benchmark-layouts: hidden size (block, mlp)");
  CLI::Option* o_layers =
      app.add_option("--layers", o.layers, "--benchmark-layouts: layers (block, mlp)");
  CLI::Option* o_precision =
      app.add_option("--precision", o.precision, "--benchmark-layouts: compute dtype")
          ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  CLI::Option* o_device =
      app.add_option("--device", o.device,
                     "--benchmark-layouts: cpu or cuda (default: cpu on a shared-memory cluster)")
          ->check(CLI::IsMember({"cpu", "cuda"}));
  CLI::Option* o_layout = app.add_option(
      "--layout", o.layouts,
      "--benchmark-layouts: MODE[:SIZE[:DEPTH]] (repeatable; default: none and every "
      "mode of --nproc)");
  app.add_flag("--data-parallel", o.data_parallel,
               "Replay a data-parallel step: forward, backward, all-reduce of --grad-bytes");
  app.add_flag("--quiet", o.quiet, "No summary on stdout");
  CLI::Option* o_nofold =
      app.add_flag("--no-fold", o.no_fold,
                   "Simulate every data-parallel replica (default: one copy of the identical "
                   "replicas that fill whole nodes, the same result; docs/SIMULATOR.md)");
  CLI11_PARSE(app, argc, argv);
  // Flags that do not apply to the chosen mode are errors, not silently ignored.
  const std::string mode = o.benchmark_layouts   ? "--benchmark-layouts"
                           : o.search            ? "--search"
                           : !o.config.empty()   ? "--config"
                           : !o.schedule.empty() ? "--schedule"
                           : o.data_parallel     ? "--data-parallel"
                                                 : "";
  std::string misuse;
  auto only = [&](CLI::Option* opt, std::initializer_list<const char*> modes) {
    if (!misuse.empty() || opt->count() == 0) return;
    std::vector<std::string> m(modes.begin(), modes.end());
    if (std::find(m.begin(), m.end(), mode) != m.end()) return;
    misuse = fmt::format("{} applies to {}, not to {}", opt->get_name(), fmt::join(m, " or "),
                         mode.empty() ? std::string("no mode") : mode);
  };
  for (CLI::Option* opt : {o_fwd, o_bwd, o_optms, o_act, o_grad, o_global_batch, o_dtype})
    only(opt, {"--schedule", "--data-parallel"});
  for (CLI::Option* opt : {o_stages, o_microbatches, o_chunks}) only(opt, {"--schedule"});
  for (CLI::Option* opt : {o_top, o_exhaustive, o_out}) only(opt, {"--search"});
  for (CLI::Option* opt :
       {o_model, o_batch, o_seq, o_dim, o_layers, o_precision, o_device, o_layout})
    only(opt, {"--benchmark-layouts"});
  only(o_set, {"--config", "--search", "--benchmark-layouts"});
  only(o_trace, {"--config", "--schedule", "--data-parallel"});
  only(o_nofold, {"--config", "--schedule", "--data-parallel"});
  only(o_collectives, {"--config", "--schedule", "--data-parallel"});
  const int modes = (o.benchmark_layouts ? 1 : 0) + (o.search ? 1 : 0) +
                    (!o.schedule.empty() ? 1 : 0) + (o.data_parallel ? 1 : 0) +
                    (!o.config.empty() && !o.benchmark_layouts && !o.search ? 1 : 0);
  if (misuse.empty() && modes > 1)
    misuse = "choose one of --benchmark-layouts, --search, --config, --schedule, --data-parallel";
  if (!misuse.empty()) {
    std::fprintf(stderr, "colossalai-sim: %s\n", misuse.c_str());
    return 2;
  }
  if (o.version) {
    int major = 0, minor = 0, patch = 0;
    sg_version_get(&major, &minor, &patch);
    std::printf("colossalai-sim (SimGrid %d.%d.%d)\n", major, minor, patch);
    return 0;
  }
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "colossalai-sim: %s\n", e.what());
    return 1;
  }
}
