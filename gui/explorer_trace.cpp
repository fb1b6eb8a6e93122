// The explorer's recorded inputs (explorer_model.h): a --trace JSON (Chrome trace of a vit_train
// run) parsed into spans and cut into one step's Timeline, and a --metrics JSON-lines file.
#include "explorer_model.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "cai/core/error.h"
#include "cai/dist/mesh.h"
#include "cai/schedule/schedule.h"
#include "cluster.h"
#include "sim_source.h"

namespace cai::gui {

namespace {

using nlohmann::json;

std::string read_file(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  CAI_CHECK(f.good(), "[gui] {} {}: cannot open the file", what, path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int parse_int_after(const std::string& s, const std::string& key, int fallback) {
  const auto pos = s.find(key);
  if (pos == std::string::npos) return fallback;
  try {
    return std::stoi(s.substr(pos + key.size()));
  } catch (const std::exception&) {
    return fallback;
  }
}

// A micro-batch or chunk index in an instruction name ("F12.1"): digits at p, at most 10^6.
int small_index(const std::string& name, size_t p) {
  int64_t v = 0;
  for (; p < name.size() && std::isdigit(static_cast<unsigned char>(name[p])); ++p) {
    v = v * 10 + (name[p] - '0');
    CAI_CHECK(v <= 1000000, "[gui] instruction '{}' has an index beyond 1000000", name);
  }
  return static_cast<int>(v);
}

}  // namespace

Span span_from_name(const std::string& name, const std::string& cat) {
  Span s;
  s.name = name;
  auto starts = [&](const char* p) { return name.rfind(p, 0) == 0; };
  if (starts("SendAct") || starts("RecvAct") || starts("SendGrad") || starts("RecvGrad")) {
    s.category = Category::Comm;
  } else if (starts("BW(")) {
    s.category = Category::Weight;
  } else if (starts("BI(") || starts("B(")) {
    s.category = Category::Backward;
  } else if (starts("F(")) {
    s.category = Category::Forward;
  } else if (starts("Load")) {
    s.category = Category::Load;
  } else if (starts("ReduceGrads")) {
    s.category = Category::Reduce;
  } else if (starts("OptStep")) {
    s.category = Category::Optimizer;
  } else if ((starts("F") || starts("B") || starts("W")) && name.size() > 1 &&
             std::isdigit(name[1])) {
    // Short form "F3.1": micro-batch 3, chunk 1 ("W3.1": its weight gradient).
    s.category = name[0] == 'F'   ? Category::Forward
                 : name[0] == 'W' ? Category::Weight
                                  : Category::Backward;
    s.mb = small_index(name, 1);
    const auto dot = name.find('.');
    s.chunk = dot == std::string::npos ? 0 : small_index(name, dot + 1);
    return s;
  } else if (cat == "comm") {
    s.category = Category::Comm;
  } else if (cat == "load") {
    s.category = Category::Load;
  } else if (cat == "optimizer") {
    s.category = Category::Optimizer;
  } else if (cat == "reduce") {
    s.category = Category::Reduce;
  } else {
    s.category = Category::Forward;
  }
  s.mb = parse_int_after(name, "mb=", -1);
  s.chunk = parse_int_after(name, "c=", 0);
  return s;
}

RecordedTrace parse_trace(const std::string& text, const std::string& path) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for 1e999
    fail("[gui] trace {}: not JSON ({})", path, e.what());
  }
  const json* events = nullptr;
  if (doc.is_object() && doc.contains("traceEvents")) {
    events = &doc["traceEvents"];
  } else if (doc.is_array()) {
    events = &doc;
  }
  CAI_CHECK(events && events->is_array(),
            "[gui] trace {}: no \"traceEvents\" array (not a Chrome trace)", path);
  RecordedTrace t;
  t.path = path;
  std::map<int, RankTrack> tracks;
  std::map<int, std::vector<std::pair<double, double>>> memory;
  std::map<int, std::vector<std::pair<double, double>>> steps;  // per rank
  for (size_t i = 0; i < events->size(); ++i) {
    const json& e = (*events)[i];
    CAI_CHECK(e.is_object(), "[gui] trace {}: event {} is not an object", path, i);
    auto str = [&](const char* key) -> std::string {
      CAI_CHECK(e.contains(key) && e[key].is_string(),
                "[gui] trace {}: event {} has no string \"{}\"", path, i, key);
      return e[key].get<std::string>();
    };
    auto num = [&](const char* key) -> double {
      CAI_CHECK(e.contains(key) && e[key].is_number(),
                "[gui] trace {}: event {} has no numeric \"{}\"", path, i, key);
      return e[key].get<double>();
    };
    const std::string ph = str("ph");
    const int tid = e.contains("tid") && e["tid"].is_number_integer() ? e["tid"].get<int>() : 0;
    CAI_CHECK(tid >= 0 && tid < 1000000, "[gui] trace {}: event {} has track id {}", path, i, tid);
    RankTrack& tr = tracks[tid];
    tr.rank = tid;
    if (ph == "M") {
      if (str("name") == "thread_name" && e.contains("args") && e["args"].contains("name") &&
          e["args"]["name"].is_string()) {
        tr.label = e["args"]["name"].get<std::string>();
        tr.stage = parse_int_after(tr.label, "pp ", tid);
        CAI_CHECK(tr.stage >= 0 && tr.stage < 1000000,
                  "[gui] trace {}: track {} ('{}') names pipeline stage {}; expected 0..999999",
                  path, tid, tr.label, tr.stage);
      }
    } else if (ph == "X") {
      const std::string name = str("name");
      const double ts = num("ts"), dur = num("dur");
      CAI_CHECK(dur >= 0, "[gui] trace {}: event {} (\"{}\") has negative duration {}", path, i,
                name, dur);
      const std::string cat =
          e.contains("cat") && e["cat"].is_string() ? e["cat"].get<std::string>() : std::string();
      if (name == "step" || cat == "step") {
        steps[tid].emplace_back(ts, ts + dur);
        continue;
      }
      Span s = span_from_name(name, cat);
      s.start = ts;
      s.end = ts + dur;
      tr.spans.push_back(std::move(s));
    } else if (ph == "C") {
      const double ts = num("ts");
      CAI_CHECK(e.contains("args") && e["args"].is_object() && !e["args"].empty(),
                "[gui] trace {}: counter event {} has no \"args\"", path, i);
      const json& a = e["args"].contains("bytes") ? e["args"]["bytes"] : e["args"].begin().value();
      CAI_CHECK(a.is_number(), "[gui] trace {}: counter event {} has a non-numeric value", path, i);
      memory[tid].emplace_back(ts, a.get<double>());
    }
  }
  size_t n_spans = 0;
  for (auto& [tid, tr] : tracks) n_spans += tr.spans.size();
  CAI_CHECK(n_spans > 0, "[gui] trace {}: no complete (\"ph\": \"X\") instruction events", path);
  for (auto& [tid, tr] : tracks) {
    if (tr.label.empty()) tr.label = fmt::format("track {}", tid);
    std::sort(tr.spans.begin(), tr.spans.end(),
              [](const Span& a, const Span& b) { return a.start < b.start; });
    auto& mem = memory[tid];
    std::sort(mem.begin(), mem.end());
    t.ranks.push_back(tr);
    t.memory.push_back(mem);
  }
  // Steps: the k-th "step" span of every rank; without them the whole trace is one step.
  size_t n_steps = 0;
  for (auto& [tid, s] : steps) n_steps = std::max(n_steps, s.size());
  for (size_t k = 0; k < n_steps; ++k) {
    double a = 1e300, b = -1e300;
    for (auto& [tid, s] : steps) {
      std::sort(s.begin(), s.end());
      if (k < s.size()) a = std::min(a, s[k].first), b = std::max(b, s[k].second);
    }
    t.steps.emplace_back(a, b);
  }
  if (t.steps.empty()) {
    double a = 1e300, b = -1e300;
    for (const auto& tr : t.ranks)
      for (const auto& s : tr.spans) a = std::min(a, s.start), b = std::max(b, s.end);
    t.steps.emplace_back(a, b);
  }
  return t;
}

RecordedTrace load_trace(const std::string& path) {
  return parse_trace(read_file(path, "trace"), path);
}

Timeline trace_step(const RecordedTrace& rt, int step) {
  const int n = static_cast<int>(rt.steps.size());
  CAI_CHECK(n > 0, "[gui] trace {}: no steps", rt.path);
  CAI_CHECK(step >= -1 && step < n, "[gui] trace {}: step {} out of range (the trace has {})",
            rt.path, step, n);
  const int k = step < 0 ? n - 1 : step;
  const auto [w0, w1] = rt.steps[k];
  Timeline t;
  t.source = fmt::format("trace: {} (step {} of {})",
                         std::filesystem::path(rt.path).filename().string(), k + 1, n);
  t.time_unit = "ms";
  t.schedule = "recorded";
  t.t_begin = 0;
  t.t_end = (w1 - w0) / 1000.0;
  int max_stage = 0, max_mb = -1, max_chunk = 0;
  for (size_t r = 0; r < rt.ranks.size(); ++r) {
    const RankTrack& src = rt.ranks[r];
    RankTrack tr;
    tr.rank = src.rank;
    tr.stage = src.stage;
    tr.label = src.label;
    for (const Span& s : src.spans) {
      if (s.start < w0 || s.start >= w1) continue;
      Span c = s;
      c.start = (s.start - w0) / 1000.0;
      c.end = (std::min(s.end, w1) - w0) / 1000.0;
      max_mb = std::max(max_mb, c.mb);
      max_chunk = std::max(max_chunk, c.chunk);
      tr.spans.push_back(std::move(c));
    }
    max_stage = std::max(max_stage, tr.stage);
    MemoryCurve mc;
    mc.rank = tr.rank;
    mc.stage = tr.stage;
    mc.breakdown = false;
    const auto& mem = rt.memory[r];
    for (size_t i = 0; i < mem.size(); ++i) {
      const auto [ts, bytes] = mem[i];
      const bool before = ts < w0, next_inside = i + 1 < mem.size() && mem[i + 1].first >= w0;
      if ((before && (next_inside || i + 1 == mem.size())) || (ts >= w0 && ts <= w1)) {
        MemoryPoint p;
        p.t = std::max(0.0, (ts - w0) / 1000.0);
        p.buffers = bytes;
        mc.points.push_back(p);
      }
    }
    if (!mc.points.empty()) {
      MemoryPoint last = mc.points.back();
      last.t = t.t_end;
      mc.points.push_back(last);
    }
    t.ranks.push_back(std::move(tr));
    t.memory.push_back(std::move(mc));
  }
  t.stages = max_stage + 1;
  t.micro_batches = max_mb + 1;
  t.chunks = max_chunk + 1;
  for (int s = 0; s < t.stages; ++s) {
    StageBubble b;
    b.stage = s;
    double sum = 0;
    int cnt = 0;
    for (const auto& tr : t.ranks)
      if (tr.stage == s) sum += non_compute_fraction(tr, t.t_begin, t.t_end), ++cnt;
    if (cnt) b.achieved = sum / cnt;
    t.bubbles.push_back(b);
  }
  return t;
}

std::string MetricsLayout::describe() const {
  std::string s = fmt::format("{} process{} (dp {} × pp {} × tp {}", processes,
                              processes == 1 ? "" : "es", dp, pp, tp);
  if (tp > 1 && !tensor_mode.empty() && tensor_mode != "none") s += " " + tensor_mode;
  if (zero_stage > 0) s += fmt::format(", ZeRO {}", zero_stage);
  s += fmt::format("), {} samples per data-parallel rank per step (global batch {})",
                   batch_per_process, global_batch);
  if (!model.empty()) s += ", " + model;
  if (!device.empty()) s += " on " + device;
  return s;
}

MetricsRun load_metrics(const std::string& path) {
  const std::string text = read_file(path, "metrics");
  MetricsRun run;
  run.path = path;
  run.label = std::filesystem::path(path).filename().string();
  std::istringstream in(text);
  std::string line;
  int no = 0;
  while (std::getline(in, line)) {
    ++no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      fail("[gui] metrics {} line {}: not JSON ({})", path, no, e.what());
    }
    CAI_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(),
              "[gui] metrics {} line {}: no \"type\" (step or epoch)", path, no);
    auto num = [&](const char* key, bool required) -> double {
      if (!j.contains(key)) {
        CAI_CHECK(!required, "[gui] metrics {} line {}: no \"{}\"", path, no, key);
        return 0;
      }
      CAI_CHECK(j[key].is_number(), "[gui] metrics {} line {}: \"{}\" is not a number", path, no,
                key);
      return j[key].get<double>();
    };
    const std::string type = j["type"].get<std::string>();
    // Where a run was stopped on request and where its resumed run appended (no values).
    if (type == "resume" || type == "preempted") continue;
    if (type == "run") {
      auto whole = [&](const char* key, double lo) {
        const double v = num(key, true);
        CAI_CHECK(v >= lo && v <= 1e9 && v == std::floor(v),
                  "[gui] metrics {} line {}: \"{}\" {} is not a whole number in [{}, 1e9]", path,
                  no, key, v, lo);
        return v;
      };
      auto text = [&](const char* key) {
        if (!j.contains(key)) return std::string();
        CAI_CHECK(j[key].is_string(), "[gui] metrics {} line {}: \"{}\" is not a string", path, no,
                  key);
        return j[key].get<std::string>();
      };
      MetricsLayout l;
      l.processes = static_cast<int>(whole("processes", 1));
      l.dp = static_cast<int>(whole("dp", 1));
      l.pp = static_cast<int>(whole("pp", 1));
      l.tp = static_cast<int>(whole("tp", 1));
      l.zero_stage = j.contains("zero_stage") ? static_cast<int>(whole("zero_stage", 0)) : 0;
      l.batch_per_process = static_cast<int64_t>(whole("batch_per_process", 1));
      l.global_batch = j.contains("global_batch") ? static_cast<int64_t>(whole("global_batch", 1))
                                                  : l.batch_per_process * l.dp;
      CAI_CHECK(static_cast<int64_t>(l.dp) * l.pp * l.tp == l.processes,
                "[gui] metrics {} line {}: dp {} × pp {} × tp {} is not the {} processes", path, no,
                l.dp, l.pp, l.tp, l.processes);
      l.tensor_mode = j.contains("tensor_mode") ? text("tensor_mode") : "none";
      l.model = text("model");
      l.device = text("device");
      l.layout = text("layout");
      run.layout = l;
      continue;
    }
    MetricsRow r;
    // A count beyond int64_t would be undefined when cast (libFuzzer + UBSan: 7.8e182).
    auto count = [&](const char* key) {
      const double v = num(key, true);
      CAI_CHECK(v >= -9223372036854775808.0 && v < 9223372036854775808.0,
                "[gui] metrics {} line {}: \"{}\" {} is beyond a 64-bit integer", path, no, key, v);
      return static_cast<int64_t>(v);
    };
    r.epoch = count("epoch");
    r.step = count("step");
    r.img_per_s = num("img_per_s", false);
    r.lr = num("lr", false);
    if (type == "step") {
      r.loss = num("loss", true);
      r.accuracy = num("accuracy", false);
      run.steps.push_back(r);
    } else if (type == "epoch") {
      r.loss = num("train_loss", true);
      r.accuracy = num("train_accuracy", false);
      if (j.contains("test_accuracy")) r.test_accuracy = num("test_accuracy", true);
      run.epochs.push_back(r);
    } else {
      fail("[gui] metrics {} line {}: type \"{}\" is not step, epoch, run, resume or preempted",
           path, no, type);
    }
  }
  CAI_CHECK(!run.steps.empty() || !run.epochs.empty(), "[gui] metrics {}: no step or epoch lines",
            path);
  return run;
}

}  // namespace cai::gui
