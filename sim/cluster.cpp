#define TOML_HEADER_ONLY 1
#include "cluster.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <toml++/toml.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <vector>

#include "cai/core/error.h"
#include "cai/core/toml_text.h"

namespace cai::sim {

DType parse_dtype(const std::string& s) {
  if (s == "fp32") return DType::F32;
  if (s == "bf16") return DType::BF16;
  if (s == "fp16") return DType::F16;
  fail("[sim] unknown dtype '{}': expected fp32, bf16 or fp16", s);
}

const char* dtype_name(DType d) {
  switch (d) {
    case DType::F32:
      return "fp32";
    case DType::BF16:
      return "bf16";
    case DType::F16:
      return "fp16";
  }
  return "?";
}

double GpuSpec::peak_flops(DType d) const {
  switch (d) {
    case DType::F32:
      return flops_fp32;
    case DType::BF16:
      return flops_bf16;
    case DType::F16:
      return flops_fp16;
  }
  return flops_fp32;
}

const char* fabric_name(Fabric f) {
  switch (f) {
    case Fabric::NvSwitch:
      return "nvswitch";
    case Fabric::Pcie:
      return "pcie";
    case Fabric::SharedMemory:
      return "shared_memory";
  }
  return "?";
}

namespace {

std::string read_file(const std::string& path, const char* what) {
  std::ifstream f(path);
  CAI_CHECK(f.good(), "[{}] cannot read {}", what, path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string show(const toml::node& n) {
  if (auto v = n.value_exact<std::string>()) return fmt::format("\"{}\"", *v);
  if (auto v = n.value_exact<int64_t>()) return fmt::format("{}", *v);
  if (auto v = n.value_exact<double>()) return fmt::format("{}", *v);
  if (auto v = n.value_exact<bool>()) return *v ? "true" : "false";
  if (n.is_table()) return "a table";
  if (n.is_array()) return "an array";
  return "a value";
}

// Reads one TOML table strictly: every key read is remembered, finish() rejects the others.
class Section {
 public:
  Section(const toml::table& t, std::string origin, std::string prefix)
      : t_(t), origin_(std::move(origin)), prefix_(std::move(prefix)) {}

  std::string key(const std::string& k) const { return prefix_.empty() ? k : prefix_ + "." + k; }
  bool has(const std::string& k) const { return t_.contains(k); }

  double number(const std::string& k, const std::string& what, double lo, bool lo_open = true) {
    const toml::node* n = get(k, "a number (" + what + ")");
    std::optional<double> v = n->is_integer() ? std::optional<double>(double(*n->value<int64_t>()))
                                              : n->value_exact<double>();
    if (!v || !std::isfinite(*v)) bad(k, *n, "a finite number (" + what + ")");
    if (lo_open ? !(*v > lo) : !(*v >= lo))
      fail("[cluster] {}: {} = {} must be {} {}", origin_, key(k), show(*n),
           lo_open ? ">" : ">=", lo);
    return *v;
  }
  int integer(const std::string& k, const std::string& what, int64_t lo) {
    const toml::node* n = get(k, "an integer (" + what + ")");
    auto v = n->value_exact<int64_t>();
    if (!v) bad(k, *n, "an integer (" + what + ")");
    if (*v < lo || *v > std::numeric_limits<int>::max())
      fail("[cluster] {}: {} = {} must be >= {}", origin_, key(k), *v, lo);
    return static_cast<int>(*v);
  }
  std::string string(const std::string& k, const std::vector<std::string>& choices = {}) {
    const std::string want =
        choices.empty() ? "a string" : fmt::format("one of \"{}\"", fmt::join(choices, "\", \""));
    const toml::node* n = get(k, want);
    auto v = n->value_exact<std::string>();
    if (!v) bad(k, *n, want);
    if (!choices.empty() && std::find(choices.begin(), choices.end(), *v) == choices.end())
      bad(k, *n, want);
    return *v;
  }
  std::string optional_string(const std::string& k) { return has(k) ? string(k) : ""; }
  Section table(const std::string& k) {
    const toml::node* n = get(k, "a table");
    if (!n->is_table()) bad(k, *n, "a table");
    return Section(*n->as_table(), origin_, key(k));
  }
  // Unknown keys are errors: a misspelt key must not silently fall back to nothing.
  void finish() const {
    for (auto&& [k, v] : t_) {
      const std::string name(k.str());
      if (used_.count(name)) continue;
      std::vector<std::string> allowed(order_.begin(), order_.end());
      fail("[cluster] {}: unknown key '{}'{}: expected {}", origin_, key(name),
           prefix_.empty() ? "" : fmt::format(" in [{}]", prefix_), fmt::join(allowed, ", "));
    }
  }
  // Declares the keys this section accepts (for finish()'s message), in the file's order.
  Section& accepts(std::vector<std::string> keys) {
    order_ = std::move(keys);
    return *this;
  }

 private:
  const toml::node* get(const std::string& k, const std::string& want) {
    used_.insert(k);
    const toml::node* n = t_.get(k);
    if (!n) fail("[cluster] {}: missing key '{}': expected {}", origin_, key(k), want);
    return n;
  }
  [[noreturn]] void bad(const std::string& k, const toml::node& n, const std::string& want) const {
    fail("[cluster] {}: {} = {} is not {}", origin_, key(k), show(n), want);
  }

  const toml::table& t_;
  std::string origin_, prefix_;
  std::set<std::string> used_;
  std::vector<std::string> order_;
};

constexpr double kTera = 1e12, kGiga = 1e9, kGiB = 1024.0 * 1024.0 * 1024.0, kMicro = 1e-6;

}  // namespace

Cluster parse_cluster(const std::string& text, const std::string& origin) {
  toml::table root;
  const std::string_view body = strip_utf8_bom(text);
  if (const std::string why = toml_text_problem(body); !why.empty())
    fail("[cluster] {}: {}", origin, why);
  try {
    root = toml::parse(body, origin);
  } catch (const toml::parse_error& e) {
    fail("[cluster] {}:{}:{}: {}", origin, e.source().begin.line, e.source().begin.column,
         e.description());
  }
  Cluster c;
  c.origin = origin;
  Section top(root, origin, "");
  top.accepts({"name", "description", "nodes", "gpus_per_node", "max_ranks_per_gpu", "gpu",
               "intra_node", "inter_node", "host_link"});
  c.name = top.string("name");
  c.description = top.optional_string("description");
  c.nodes = top.integer("nodes", "node count", 1);
  c.gpus_per_node = top.integer("gpus_per_node", "GPUs (or processes) per node", 1);
  if (top.has("max_ranks_per_gpu"))
    c.max_ranks_per_gpu = top.integer("max_ranks_per_gpu", "ranks sharing one GPU or core", 1);

  Section g = top.table("gpu");
  g.accepts({"model", "tflops", "memory_gib", "memory_bandwidth_tbytes_per_s"});
  c.gpu.model = g.string("model");
  Section tf = g.table("tflops");
  tf.accepts({"fp32", "bf16", "fp16"});
  c.gpu.flops_fp32 = tf.number("fp32", "dense peak TFLOP/s", 0) * kTera;
  c.gpu.flops_bf16 = tf.number("bf16", "dense peak TFLOP/s", 0) * kTera;
  c.gpu.flops_fp16 = tf.number("fp16", "dense peak TFLOP/s", 0) * kTera;
  tf.finish();
  const double memory_gib = g.number("memory_gib", "usable GiB", 0);
  if (memory_gib > 1e9)  // beyond int64 bytes near 2^33 GiB; an exabyte is plenty
    fail("[cluster] {}: gpu.memory_gib = {} must be <= 1e9", origin, memory_gib);
  c.gpu.memory_bytes = static_cast<int64_t>(memory_gib * kGiB);
  c.gpu.memory_bandwidth = g.number("memory_bandwidth_tbytes_per_s", "TB/s", 0) * kTera;
  g.finish();

  Section in = top.table("intra_node");
  in.accepts({"fabric", "bandwidth_gbytes_per_s", "latency_us", "placement"});
  const std::string fabric = in.string("fabric", {"nvswitch", "pcie", "shared_memory"});
  c.intra.fabric = fabric == "nvswitch" ? Fabric::NvSwitch
                   : fabric == "pcie"   ? Fabric::Pcie
                                        : Fabric::SharedMemory;
  if (in.has("placement")) {
    if (c.intra.fabric != Fabric::SharedMemory)
      fail(
          "[cluster] {}: intra_node.placement is for fabric = \"shared_memory\" (processes on "
          "cores), not \"{}\"",
          origin, fabric);
    c.intra.pinned = in.string("placement", {"shared", "pinned"}) == "pinned";
  }
  c.intra.bandwidth = in.number("bandwidth_gbytes_per_s", "GB/s per GPU per direction", 0) * kGiga;
  c.intra.latency = in.number("latency_us", "microseconds", 0, false) * kMicro;
  in.finish();

  if (top.has("inter_node") || c.nodes > 1) {
    Section ie = top.table("inter_node");
    ie.accepts({"nics_per_node", "nic_gbits_per_s", "latency_us", "topology"});
    c.inter.nics_per_node = ie.integer("nics_per_node", "NICs per node", 1);
    c.inter.nic_bandwidth =
        ie.number("nic_gbits_per_s", "Gb/s per NIC per direction", 0) * kGiga / 8;
    c.inter.latency = ie.number("latency_us", "microseconds", 0, false) * kMicro;
    c.inter.topology = ie.string("topology", {"fat-tree", "non-blocking"});
    ie.finish();
  }

  Section h = top.table("host_link");
  h.accepts({"bandwidth_gbytes_per_s", "latency_us", "memory_gib_per_gpu"});
  c.host.bandwidth = h.number("bandwidth_gbytes_per_s", "GB/s per GPU per direction", 0) * kGiga;
  c.host.latency = h.number("latency_us", "microseconds", 0, false) * kMicro;
  if (h.has("memory_gib_per_gpu")) {
    const double gib = h.number("memory_gib_per_gpu", "host GiB per GPU", 0);
    if (gib > 1e9)
      fail("[cluster] {}: host_link.memory_gib_per_gpu = {} must be <= 1e9", origin, gib);
    c.host.memory_bytes = static_cast<int64_t>(gib * kGiB);
  }
  h.finish();
  top.finish();
  return c;
}

Cluster load_cluster(const std::string& path) {
  return parse_cluster(read_file(path, "cluster"), path);
}

const Efficiency& Calibration::of(const std::string& kind) const {
  auto it = ops.find(kind);
  return it == ops.end() ? fallback : it->second;
}

double Calibration::seconds_of(const std::string& key, double flops, bool* interpolated) const {
  const auto it = samples.find(key);
  if (it == samples.end() || it->second.empty()) return -1;
  const std::vector<Sample>& v = it->second;
  if (interpolated) *interpolated = true;
  for (const Sample& s : v)
    if (std::abs(s.flops - flops) <= 1e-3 * std::max(s.flops, 1.0)) {
      if (interpolated) *interpolated = false;
      return s.seconds;
    }
  if (flops <= v.front().flops) return v.front().seconds * flops / v.front().flops;
  if (flops >= v.back().flops) return v.back().seconds * flops / v.back().flops;
  size_t i = 1;
  while (v[i].flops < flops) ++i;
  const Sample &a = v[i - 1], &b = v[i];
  const double t = std::log(flops / a.flops) / std::log(b.flops / a.flops);
  return std::exp(std::log(a.seconds) + t * (std::log(b.seconds) - std::log(a.seconds)));
}

double Calibration::copy_seconds(double bytes) const {
  const auto it = samples.find(kCopyReference);
  if (it == samples.end() || it->second.empty() || it->second.back().bytes <= 0) return -1;
  // The reference's FLOPs are proportional to its bytes: the same bytes are these FLOPs.
  const Sample& s = it->second.back();
  return seconds_of(kCopyReference, bytes * s.flops / s.bytes, nullptr);
}

double Calibration::posted_share_at(double batch) const {
  if (posted_shares.empty() || batch <= 0) return posted_share;
  if (batch <= posted_shares.front().first) return posted_shares.front().second;
  if (batch >= posted_shares.back().first) return posted_shares.back().second;
  for (size_t i = 1; i < posted_shares.size(); ++i) {
    const auto [b1, s1] = posted_shares[i];
    if (batch > b1) continue;
    const auto [b0, s0] = posted_shares[i - 1];
    const double t = std::log(batch / b0) / std::log(b1 / b0);
    return s0 + t * (s1 - s0);
  }
  return posted_shares.back().second;
}

double Calibration::collective_seconds(const std::string& op, int group_size, double bytes,
                                       bool* interpolated) const {
  const auto it = collectives.find({op, group_size});
  if (it == collectives.end() || it->second.empty() || bytes <= 0) return -1;
  const std::vector<CollectiveSample>& v = it->second;
  auto near = [&](double b) { return std::abs(b - bytes) <= 1e-3 * std::max(b, 1.0); };
  for (const CollectiveSample& s : v)
    if (near(s.bytes)) {
      if (interpolated) *interpolated = false;
      return s.seconds;
    }
  if (bytes < v.front().bytes || bytes > v.back().bytes) return -1;
  if (interpolated) *interpolated = true;
  size_t i = 1;
  while (v[i].bytes < bytes) ++i;
  const CollectiveSample &a = v[i - 1], &b = v[i];
  const double t = std::log(bytes / a.bytes) / std::log(b.bytes / a.bytes);
  return std::exp(std::log(a.seconds) + t * (std::log(b.seconds) - std::log(a.seconds)));
}

Calibration default_calibration() {
  Calibration c;
  c.device = "any";
  c.origin = "built-in defaults";
  c.fallback = {0.6, 0.8};
  c.ops["gemm"] = {0.7, 0.85};
  c.ops["attention"] = {0.5, 0.8};
  for (const char* k : {"layernorm", "elementwise", "optimizer"}) c.ops[k] = {0.5, 0.85};
  return c;
}

Calibration parse_calibration(const std::string& text, const std::string& origin) {
  using nlohmann::json;
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for 1e999
    fail("[calibration] {}: not JSON: {}", origin, e.what());
  }
  CAI_CHECK(j.is_object(), "[calibration] {}: expected a JSON object at the top", origin);
  Calibration c = default_calibration();
  c.origin = origin;
  auto eff = [&](const json& e, const std::string& where) {
    CAI_CHECK(e.is_object(), "[calibration] {}: {} is not an object {{\"flops\": f, \"bytes\": b}}",
              origin, where);
    Efficiency out;
    for (auto& [k, v] : e.items()) {
      CAI_CHECK(k == "flops" || k == "bytes",
                "[calibration] {}: unknown key '{}' in {}: expected flops, bytes", origin, k,
                where);
      CAI_CHECK(v.is_number() && v.get<double>() > 0 && v.get<double>() <= 1,
                "[calibration] {}: {}.{} = {} is not a fraction in (0, 1]", origin, where, k,
                v.dump());
      (k == "flops" ? out.flops : out.bytes) = v.get<double>();
    }
    return out;
  };
  for (auto& item : j.items()) {  // not a structured binding: clang < 16 cannot capture one
    const std::string& k = item.key();
    const json& v = item.value();
    if (k == "device") {
      CAI_CHECK(v.is_string(), "[calibration] {}: device is not a string", origin);
      c.device = v.get<std::string>();
    } else if (k == "default") {
      c.fallback = eff(v, "default");
    } else if (k == "ops") {
      CAI_CHECK(v.is_object(), "[calibration] {}: ops is not an object", origin);
      for (auto& [op, e] : v.items()) c.ops[op] = eff(e, "ops." + op);
    } else if (k == "layer_scale") {  // informative: how the kernels were scaled to layers
      CAI_CHECK(v.is_object(), "[calibration] {}: layer_scale is not an object", origin);
    } else if (k == "layer_warmup_s") {  // informative: the sustained load before those timings
      CAI_CHECK(v.is_number() && v.get<double>() >= 0,
                "[calibration] {}: layer_warmup_s is not a number of seconds >= 0", origin);
    } else if (k == "samples") {
      CAI_CHECK(v.is_object(), "[calibration] {}: samples is not an object", origin);
      for (auto& [op, list] : v.items()) {
        CAI_CHECK(list.is_array(), "[calibration] {}: samples.{} is not a list", origin, op);
        std::vector<Sample>& out = c.samples[op];
        for (const json& e : list) {
          CAI_CHECK(e.is_array() && e.size() == 3 && e[0].is_number() && e[1].is_number() &&
                        e[2].is_number() && e[0].get<double>() > 0 && e[1].get<double>() >= 0 &&
                        e[2].get<double>() > 0,
                    "[calibration] {}: samples.{} entry {} is not [flops > 0, bytes >= 0, "
                    "seconds > 0]",
                    origin, op, e.dump());
          out.push_back({e[0].get<double>(), e[1].get<double>(), e[2].get<double>()});
        }
        std::sort(out.begin(), out.end(),
                  [](const Sample& a, const Sample& b) { return a.flops < b.flops; });
      }
    } else if (k == "collectives") {
      CAI_CHECK(v.is_array(), "[calibration] {}: collectives is not a list", origin);
      for (const json& e : v) {
        const bool has_layout = e.is_object() && e.contains("layout");
        const bool ok = e.is_object() && e.size() == (has_layout ? 5u : 4u) && e.contains("op") &&
                        e["op"].is_string() && e.contains("group") &&
                        e["group"].is_number_integer() && e.contains("bytes") &&
                        e["bytes"].is_number() && e.contains("seconds") && e["seconds"].is_number();
        CAI_CHECK(ok,
                  "[calibration] {}: collectives entry {} is not {{\"op\": name, \"group\": n, "
                  "\"bytes\": b, \"seconds\": s}} (and optionally \"layout\")",
                  origin, e.dump());
        const std::string op = e["op"].get<std::string>();
        CAI_CHECK(op == "all_reduce" || op == "reduce_scatter" || op == "all_gather" ||
                      op == "broadcast" || op == "p2p",
                  "[calibration] {}: collectives entry {}: unknown op '{}': expected all_reduce, "
                  "reduce_scatter, all_gather, broadcast or p2p",
                  origin, e.dump(), op);
        const int64_t g = e["group"].get<int64_t>();
        const double b = e["bytes"].get<double>(), sec = e["seconds"].get<double>();
        CAI_CHECK(g >= 2 && g <= (1 << 24) && b > 0 && sec > 0 && std::isfinite(b) &&
                      std::isfinite(sec) && (op != "p2p" || g == 2),
                  "[calibration] {}: collectives entry {} needs group >= 2 (p2p: 2), bytes > 0 "
                  "and seconds > 0",
                  origin, e.dump());
        if (has_layout) {
          const json& l = e["layout"];
          const std::string layout = l.is_string() ? l.get<std::string>() : "";
          CAI_CHECK(layout == "strided" || layout == "strided_concurrent" || layout == "concurrent",
                    "[calibration] {}: collectives entry {}: layout {}: expected \"strided\", "
                    "\"strided_concurrent\" or \"concurrent\"",
                    origin, e.dump(), l.dump());
          c.collective_layouts[{op, static_cast<int>(g), layout}].push_back({b, sec});
          continue;
        }
        c.collectives[{op, static_cast<int>(g)}].push_back({b, sec});
      }
      auto by_bytes = [](const CollectiveSample& a, const CollectiveSample& b) {
        return a.bytes < b.bytes;
      };
      for (auto& [key, list] : c.collectives) std::sort(list.begin(), list.end(), by_bytes);
      for (auto& [key, list] : c.collective_layouts) std::sort(list.begin(), list.end(), by_bytes);
    } else if (k == "host") {
      const char* form =
          "{\"h2d_bytes_per_s\", \"d2h_bytes_per_s\", \"adam_elements_per_s\", "
          "\"add_bytes_per_s\"} (each optional)";
      CAI_CHECK(v.is_object(), "[calibration] {}: host is not an object {}", origin, form);
      for (auto& [key, x] : v.items()) {
        double* to = key == "h2d_bytes_per_s"       ? &c.h2d_bytes_per_s
                     : key == "d2h_bytes_per_s"     ? &c.d2h_bytes_per_s
                     : key == "adam_elements_per_s" ? &c.host_adam_elements_per_s
                     : key == "add_bytes_per_s"     ? &c.host_add_bytes_per_s
                                                    : nullptr;
        CAI_CHECK(to, "[calibration] {}: unknown key '{}' in host: expected {}", origin, key, form);
        CAI_CHECK(x.is_number() && std::isfinite(x.get<double>()) && x.get<double>() > 0,
                  "[calibration] {}: host.{} = {} is not a number > 0", origin, key, x.dump());
        *to = x.get<double>();
      }
    } else if (k == "gpu_speeds") {
      const char* form = "{\"sustained_seconds\": s, \"block_seconds\": [t0, t1, ...]}";
      CAI_CHECK(v.is_object() && v.contains("block_seconds") && v["block_seconds"].is_array() &&
                    !v["block_seconds"].empty(),
                "[calibration] {}: gpu_speeds needs block_seconds, one time per GPU ({})", origin,
                form);
      for (auto& [key, x] : v.items())
        CAI_CHECK(key == "block_seconds" || key == "sustained_seconds",
                  "[calibration] {}: unknown key '{}' in gpu_speeds: expected {}", origin, key,
                  form);
      std::vector<double> t;
      for (const json& x : v["block_seconds"]) {
        CAI_CHECK(x.is_number() && std::isfinite(x.get<double>()) && x.get<double>() > 0,
                  "[calibration] {}: gpu_speeds.block_seconds entry {} is not a number > 0", origin,
                  x.dump());
        t.push_back(x.get<double>());
      }
      c.gpu_time_factors.clear();
      for (double s : t) c.gpu_time_factors.push_back(s / t[0]);
    } else if (k == "wake") {
      const char* form = "{\"group\", \"poll_seconds\", \"base_seconds\", \"late_seconds\"}";
      auto num = [&](const char* key) {
        CAI_CHECK(v.is_object() && v.contains(key) && v[key].is_number() &&
                      std::isfinite(v[key].get<double>()) && v[key].get<double>() > 0,
                  "[calibration] {}: wake.{} is missing or not a number > 0 (wake: {})", origin,
                  key, form);
        return v[key].get<double>();
      };
      const double g = num("group");
      CAI_CHECK(g >= 2 && g == std::floor(g),
                "[calibration] {}: wake.group is {}: expected a whole number of ranks >= 2", origin,
                g);
      c.wake_poll_s = num("poll_seconds");
      c.wake_s = std::max(0.0, num("late_seconds") - num("base_seconds"));
    } else if (k == "posted" && v.is_array()) {
      // A block's compute alone and beside a posted receive, at several batch sizes.
      const char* form =
          "[{\"op\", \"bytes\", \"batch\", \"max_ctas\", \"gemm_sm_margin\", "
          "\"alone_seconds\", \"beside_seconds\"}, ...]";
      CAI_CHECK(!v.empty(), "[calibration] {}: posted is an empty list: expected {}", origin, form);
      c.posted_shares.clear();
      for (const json& e : v) {
        auto num = [&](const char* key, double lo) {
          CAI_CHECK(e.is_object() && e.contains(key) && e[key].is_number() &&
                        std::isfinite(e[key].get<double>()) && e[key].get<double>() >= lo,
                    "[calibration] {}: posted entry {}: {} is missing or not a number >= {} "
                    "(posted: {})",
                    origin, e.dump(), key, lo, form);
          return e[key].get<double>();
        };
        const double batch = num("batch", 1), alone = num("alone_seconds", 1e-300),
                     beside = num("beside_seconds", 1e-300);
        num("bytes", 1e-300);
        const int ctas = e.contains("max_ctas") ? static_cast<int>(num("max_ctas", 0)) : 0;
        const int margin =
            e.contains("gemm_sm_margin") ? static_cast<int>(num("gemm_sm_margin", 0)) : 0;
        CAI_CHECK(c.posted_shares.empty() ||
                      (ctas == c.posted_max_ctas && margin == c.posted_gemm_sm_margin),
                  "[calibration] {}: posted entry {} has max_ctas {} and gemm_sm_margin {}, an "
                  "earlier one {} and {}: expected one setting for the list",
                  origin, e.dump(), ctas, margin, c.posted_max_ctas, c.posted_gemm_sm_margin);
        c.posted_max_ctas = ctas;
        c.posted_gemm_sm_margin = margin;
        for (const auto& [b, s] : c.posted_shares)
          CAI_CHECK(b != batch, "[calibration] {}: posted lists batch {} twice", origin, batch);
        c.posted_shares.emplace_back(batch, std::clamp(1.0 - alone / beside, 0.0, 0.9));
      }
      std::sort(c.posted_shares.begin(), c.posted_shares.end());
      c.posted_share = c.posted_shares.back().second;  // at the largest batch
    } else if (k == "overlap" || k == "posted" || k == "contention") {
      // Each entry is a block's compute timed two ways: positive numbers.
      const bool contention = k == "contention";
      const char* form = k == "overlap" ? "{\"op\", \"group\", \"bytes\", \"alone_seconds\", "
                                          "\"beside_seconds\"}"
                         : k == "posted"
                             ? "{\"op\", \"bytes\", \"alone_seconds\", \"beside_seconds\"}"
                             : "{\"group\", \"alone_seconds\", \"together_seconds\"}";
      auto num = [&](const char* key) {
        CAI_CHECK(v.is_object() && v.contains(key) && v[key].is_number() &&
                      std::isfinite(v[key].get<double>()) && v[key].get<double>() > 0,
                  "[calibration] {}: {}.{} is missing or not a number > 0 ({}: {})", origin, k, key,
                  k, form);
        return v[key].get<double>();
      };
      const double alone = num("alone_seconds"), g = k == "posted" ? 0.0 : num("group");
      if (!contention) {
        const double beside = num("beside_seconds");
        num("bytes");
        // Slower beside the collectives (overlap) or the waiting receive (posted): that share of
        // the GPU's compute went to their kernels. Faster (noise) is no share.
        (k == "overlap" ? c.overlap_share : c.posted_share) =
            std::clamp(1.0 - alone / beside, 0.0, 0.9);
        if (k == "posted") {  // the older single entry: NCCL's blocks, the whole device
          c.posted_max_ctas = v.contains("max_ctas") ? static_cast<int>(num("max_ctas")) : 0;
          c.posted_gemm_sm_margin =
              v.contains("gemm_sm_margin") ? static_cast<int>(num("gemm_sm_margin")) : 0;
        }
      } else {
        const double together = num("together_seconds");
        CAI_CHECK(g >= 2 && g == std::floor(g),
                  "[calibration] {}: contention.group is {}: expected a whole number of ranks >= 2",
                  origin, g);
        // Each of the group - 1 others computing took that share of a rank's speed. Faster
        // together (noise) is no share.
        c.contention_share = std::clamp((1.0 - alone / together) / (g - 1.0), 0.0, 0.45);
      }
    } else {
      fail(
          "[calibration] {}: unknown key '{}': expected device, default, ops, samples, "
          "layer_scale, layer_warmup_s, collectives, overlap, posted, contention, gpu_speeds, "
          "wake, host",
          origin, k);
    }
  }
  return c;
}

Calibration load_calibration(const std::string& path) {
  return parse_calibration(read_file(path, "calibration"), path);
}

}  // namespace cai::sim
