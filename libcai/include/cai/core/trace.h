// Timed spans and memory samples of one process, written as Chrome-trace JSON (viewable in
// Perfetto or chrome://tracing). Real runs and simulations produce the same format: one track
// per rank, complete events ("ph": "X") for instructions and counter events for memory.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace cai::trace {

struct Span {
  std::string name;      // e.g. "F(mb=3,c=0)"
  std::string category;  // compute | comm | load | reduce | optimizer | step
  double start_us = 0, end_us = 0;
};

struct MemorySample {
  double t_us = 0;
  int64_t bytes = 0;
};

class Recorder {
 public:
  // Microseconds on the machine's monotonic clock (comparable between processes of one host).
  static double now_us();
  void span(std::string name, std::string category, double start_us, double end_us);
  void memory(double t_us, int64_t bytes);
  const std::vector<Span>& spans() const { return spans_; }
  const std::vector<MemorySample>& memory_samples() const { return memory_; }
  // This recorder's events as a JSON array for track `tid`, times relative to `origin_us`.
  std::string events_json(int tid, const std::string& track_name, double origin_us) const;

 private:
  std::vector<Span> spans_;
  std::vector<MemorySample> memory_;
};

// A time interval [start_us, end_us] (microseconds on any one clock).
struct Interval {
  double start_us = 0, end_us = 0;
};
// The length of the union of `spans` clipped to [lo, hi]: overlapping spans count once, spans
// (or parts) outside the window not at all, empty or reversed ones nothing.
double covered_us(std::vector<Interval> spans, double lo, double hi);
// 1 − covered_us(busy, lo, hi) / (hi − lo): the share of the window [lo, hi] in which none of
// `busy` runs. A pipeline stage's measured bubble, with its compute instructions' spans and its
// step (host times on the CPU; device times on a GPU, where the kernels run asynchronously to the
// host). 0 for an empty window.
double idle_fraction(const std::vector<Interval>& busy, double lo, double hi);

// {"traceEvents": [...], "displayTimeUnit": "ms"} from per-track event arrays.
std::string chrome_trace(const std::vector<std::string>& event_arrays);

}  // namespace cai::trace
