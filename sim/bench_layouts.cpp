#include "bench_layouts.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>

#include "cai/config/config.h"
#include "cai/core/error.h"
#include "cai/nn/tensor_parallel.h"
#include "from_config.h"
#include "replay.h"

namespace cai::sim {

BenchLayout parse_bench_layout(const std::string& text, int gpus) {
  BenchLayout l;
  std::vector<std::string> parts;
  size_t from = 0;
  for (;;) {
    const size_t at = text.find(':', from);
    parts.push_back(text.substr(from, at == std::string::npos ? std::string::npos : at - from));
    if (at == std::string::npos) break;
    from = at + 1;
  }
  l.mode = parts[0];
  CAI_CHECK(
      l.mode == "none" || l.mode == "1d" || l.mode == "2d" || l.mode == "2.5d" || l.mode == "3d",
      "[benchmark] layout '{}': mode '{}' is not none, 1d, 2d, 2.5d or 3d", text, l.mode);
  try {
    l.size = parts.size() > 1 ? std::stoi(parts[1]) : (l.mode == "none" ? 1 : gpus);
    l.depth = parts.size() > 2 ? std::stoi(parts[2]) : 1;
  } catch (const std::exception&) {
    fail("[benchmark] layout '{}': expected MODE[:SIZE[:DEPTH]] with whole numbers", text);
  }
  CAI_CHECK(parts.size() <= 3 && l.size >= 1 && l.depth >= 1 && (l.mode != "none" || l.size == 1),
            "[benchmark] layout '{}': expected none or MODE[:SIZE[:DEPTH]], size and depth >= 1",
            text);
  return l;
}

std::vector<BenchLayout> default_bench_layouts(int gpus) {
  std::vector<BenchLayout> out{{"none", 1, 1}};
  for (const auto& m : nn::TensorParallel::modes_for(gpus)) out.push_back({m.mode, gpus, m.depth});
  return out;
}

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Model vit: the config with pipeline 1, ZeRO 0, the layout's tensor mode and -b samples per
// data-parallel rank, in the benchmark's precision.
config::TrainConfig vit_config(const config::TrainConfig& base, const BenchLayout& l,
                               const BenchOptions& o, const std::string& device) {
  config::TrainConfig c = config::tensor_layout_config(base, l.mode, l.size, l.depth, o.batch);
  c.precision = o.precision;
  c.device = device;
  return c;
}

// Replays a layout's workload and fills its row.
void add_results(nlohmann::json& row, const ConfigWorkload& cw, const Cluster& cluster,
                 const Calibration& cal, bool vit) {
  ReplayOptions ro;
  ro.calibration = cal;
  const ReplayResult r = replay(cw.workload, cluster, ro);
  const Workload& w = cw.workload;
  double forward = 0;
  int64_t peak = 0, tp_bytes = 0, dp_bytes = 0;
  for (size_t k = 0; k < w.ranks.size(); ++k) {
    const auto& ops = w.ranks[k].ops;
    int64_t tp = 0, dp = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ends_with(ops[i].name, " bwd")) {
        forward = std::max(forward, r.ranks[k].spans[i].start);
        break;
      }
    }
    for (const Op& op : ops) {
      if (!is_collective(op.kind)) continue;
      (op.category == "reduce" ? dp : tp) +=
          issued_bytes(op.kind, op.bytes, w.group_size(op.group));
    }
    tp_bytes = std::max(tp_bytes, tp);
    dp_bytes = std::max(dp_bytes, dp);
    peak = std::max(peak, r.ranks[k].peak_mem);
  }
  row["dp"] = cw.plan.dp;
  row["simulated_ranks"] = w.ranks.size();
  row["copies"] = w.copies;
  row["wall_s"] = r.wall_s;
  row["forward_ms"] = forward * 1e3;
  row["backward_ms"] = (r.step_s - forward) * 1e3;
  // vit: the plan has no optimizer cost; block and mlp have no optimizer step.
  row["optimizer_ms"] = vit ? nlohmann::json() : nlohmann::json(0.0);
  row["step_ms"] = r.step_s * 1e3;
  row["samples_per_s"] = r.img_per_s;
  // vit: the replay's memory curve; block and mlp: the plan's step replay of the worker's
  // allocations (the input, each layer's cache and output, the gradients of the backward).
  if (!vit) peak = cw.plan.peak();
  row["peak_mem_bytes"] = peak;
  row["comm_bytes"] = tp_bytes;
  row["dp_comm_bytes"] = dp_bytes;
  row["fits_memory"] = peak <= cluster.gpu.memory_bytes;
}

}  // namespace

std::string benchmark_layouts_json(const BenchOptions& o, const Cluster& cluster,
                                   const Calibration& cal) {
  using nlohmann::json;
  const auto t0 = std::chrono::steady_clock::now();
  CAI_CHECK(o.gpus >= 1, "[benchmark] --nproc {} must be at least 1", o.gpus);
  CAI_CHECK(o.model != "vit" || !o.config.empty(),
            "[benchmark] --model vit needs --config (a vit_train TOML)");
  const std::string device = !o.device.empty()                              ? o.device
                             : cluster.intra.fabric == Fabric::SharedMemory ? "cpu"
                                                                            : "cuda";
  config::TrainConfig base;
  if (o.model == "vit") base = config::load_config(o.config, o.sets);
  const std::vector<BenchLayout> layouts =
      o.layouts.empty() ? default_bench_layouts(o.gpus) : o.layouts;
  json rows = json::array();
  for (const BenchLayout& l : layouts) {
    json row;
    row["mode"] = l.mode == "none" ? json() : json(l.mode);
    row["size"] = l.size;
    row["depth"] = l.depth;
    row["simulated"] = true;
    row["status"] = "ok";
    row["reason"] = "";
    try {
      ConfigWorkload cw;
      if (o.model == "vit") {
        cw = workload_from_config(vit_config(base, l, o, device), o.gpus, cluster);
      } else {
        // The measured worker's model: -l blocks of hidden -d (d / 64 heads, MLP ratio 4) or
        // -l × Linear(d, d), on [b, s, d] per tensor group, forward and backward only.
        nn::ViTConfig m;
        m.embed_dim = o.dimension;
        m.depth = o.layers;
        m.num_heads = o.model == "block" ? std::max<int64_t>(1, o.dimension / 64) : 1;
        m.mlp_ratio = 4.0;
        plan::Layout pl;
        pl.body = o.model == "block" ? plan::Body::Blocks : plan::Body::Linears;
        pl.tokens = o.seq_len;
        pl.world = o.gpus;
        pl.tp = l.size;
        pl.tp_mode = l.mode == "none" ? "1d" : l.mode;
        pl.tp_depth = l.mode == "2.5d" ? l.depth : 1;
        pl.batch = o.batch;
        pl.precision = cai::dtype_from_name(o.precision);
        pl.gpu = device == "cuda";
        pl.data_parallel_plugin = l.mode == "none" && o.gpus > 1;  // as the measured worker
        cw = workload_from_plan(m, pl, cluster);
      }
      add_results(row, cw, cluster, cal, o.model == "vit");
    } catch (const Error& e) {
      row["status"] = "failed";
      row["reason"] = e.what();
    }
    rows.push_back(row);
  }
  json j;
  j["gpus"] = o.gpus;
  j["cluster"] = cluster.name;
  j["model"] = o.model;
  j["config"] = o.config;
  j["batch_size"] = o.batch;
  j["seq_len"] = o.seq_len;
  j["dimension"] = o.dimension;
  j["layers"] = o.layers;
  j["precision"] = o.precision;
  j["device"] = device;
  j["simulated"] = true;
  j["layouts"] = rows;
  j["wall_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return j.dump(1);
}

}  // namespace cai::sim
