#include "cai/core/trace.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>

namespace cai::trace {

double Recorder::now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void Recorder::span(std::string name, std::string category, double start_us, double end_us) {
  spans_.push_back(Span{std::move(name), std::move(category), start_us, end_us});
}

void Recorder::memory(double t_us, int64_t bytes) {
  memory_.push_back(MemorySample{t_us, bytes});
}

std::string Recorder::events_json(int tid, const std::string& track_name, double origin_us) const {
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"name", "thread_name"},
                    {"ph", "M"},
                    {"pid", 0},
                    {"tid", tid},
                    {"args", {{"name", track_name}}}});
  for (const Span& s : spans_)
    events.push_back({{"name", s.name},
                      {"cat", s.category},
                      {"ph", "X"},
                      {"pid", 0},
                      {"tid", tid},
                      {"ts", s.start_us - origin_us},
                      {"dur", s.end_us - s.start_us}});
  for (const MemorySample& m : memory_)
    events.push_back({{"name", "memory " + track_name},
                      {"ph", "C"},
                      {"pid", 0},
                      {"tid", tid},
                      {"ts", m.t_us - origin_us},
                      {"args", {{"bytes", m.bytes}}}});
  return events.dump();
}

double covered_us(std::vector<Interval> spans, double lo, double hi) {
  std::sort(spans.begin(), spans.end(),
            [](const Interval& a, const Interval& b) { return a.start_us < b.start_us; });
  double total = 0, run_start = 0, run_end = 0;
  bool open = false;
  for (const Interval& s : spans) {
    const double a = std::max(s.start_us, lo), b = std::min(s.end_us, hi);
    if (!(b > a)) continue;  // empty, reversed or outside the window
    if (open && a <= run_end) {
      run_end = std::max(run_end, b);
    } else {
      if (open) total += run_end - run_start;
      run_start = a, run_end = b, open = true;
    }
  }
  if (open) total += run_end - run_start;
  return total;
}

double idle_fraction(const std::vector<Interval>& busy, double lo, double hi) {
  if (!(hi > lo)) return 0.0;
  return 1.0 - covered_us(busy, lo, hi) / (hi - lo);
}

std::string chrome_trace(const std::vector<std::string>& event_arrays) {
  nlohmann::json all = nlohmann::json::array();
  for (const std::string& a : event_arrays)
    for (auto& e : nlohmann::json::parse(a)) all.push_back(std::move(e));
  return nlohmann::json{{"traceEvents", all}, {"displayTimeUnit", "ms"}}.dump();
}

}  // namespace cai::trace
