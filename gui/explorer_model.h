// The schedule explorer's model: plain structs for the knobs, the timeline being shown (per rank
// a list of spans), per-rank memory curves with their breakdown, per-stage bubbles, recorded
// traces, training-curve files and errors. No ImGui, no OpenGL: a headless test drives this and
// reads back what the panels (panels.h) would draw.
//
// Where timelines come from: a TimelineSource turns knobs into a Timeline. Today that is
// replay_schedule() (the schedule IR's validator replay with ideal unit costs, labelled
// "schedule replay (ideal)"); the SimGrid simulator will be a second source filling the same
// struct (spans with simulated times, achieved bubbles, memory curves with the plan's breakdown).
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "config.h"  // apps/vit_train: TrainConfig, load_config, validate

namespace cai::gui {

enum class Category { Forward, Backward, Comm, Optimizer, Load, Reduce };
inline constexpr int kNumCategories = 6;
const char* category_name(Category c);  // "forward", "backward", "comm", ...

// One timed instruction on one rank. Times are in Timeline::time_unit from the timeline's origin.
struct Span {
  std::string name;  // the instruction as the executor names it: "F(mb=3,c=0)", "OptStep", ...
  Category category = Category::Forward;
  int mb = -1;  // micro-batch, -1 when the instruction has none (ReduceGrads, OptStep)
  int chunk = 0;
  double start = 0, end = 0;
};

struct RankTrack {
  int rank = 0, stage = 0;  // global rank and its pipeline stage
  std::string label;        // "rank 0 (pp 0, dp 0)"
  std::vector<Span> spans;  // sorted by start
};

// Bytes held by one rank at time t, split as the plan splits memory.
struct MemoryPoint {
  double t = 0;
  double parameters = 0, gradients = 0, optimizer_state = 0, activations = 0, buffers = 0;
  double total() const { return parameters + gradients + optimizer_state + activations + buffers; }
};

struct MemoryCurve {
  int rank = 0, stage = 0;
  std::vector<MemoryPoint> points;  // sorted by t; a step function (value holds until the next)
  bool breakdown = true;            // false: only the total is known (recorded traces: buffers)
  double peak() const;
  const MemoryPoint* at(double t) const;  // the point in force at t (nullptr before the first)
};

struct StageBubble {
  int stage = 0;
  double ideal = -1;     // the schedule's bubble fraction with ideal costs (-1: unknown)
  double achieved = -1;  // 1 - compute time / step time of the stage's ranks (mean)
};

struct Timeline {
  std::string source;           // "schedule replay (ideal)" | "trace: <file> (step k)"
  std::string time_unit = "u";  // "u" (cost units) | "ms"
  std::string schedule;         // "1f1b", ...
  int stages = 1, micro_batches = 1, chunks = 1;
  std::vector<RankTrack> ranks;  // rank order
  double t_begin = 0, t_end = 0;
  std::vector<StageBubble> bubbles;  // per stage
  std::vector<MemoryCurve> memory;   // per rank (may be empty)
  double capacity_bytes = 0;         // device memory (0: unknown)
  bool empty() const { return ranks.empty(); }
};

// Fraction of [t0, t1] on `track` covered by no span (the bubble as drawn), and by no compute
// span (forward/backward: the bubble as the executor measures it).
double idle_fraction(const RankTrack& track, double t0, double t1);
double non_compute_fraction(const RankTrack& track, double t0, double t1);

// What the explorer lets one turn. The parallel layout and the model are vit_train's own config,
// so loading/saving a config and validating it use vit_train's code and error text.
struct Knobs {
  app::TrainConfig config;
  int world = 0;                   // GPUs (0: pipeline × tensor size, one data-parallel replica)
  double forward_per_layer = 1.0;  // cost units per layer and micro-batch
  double backward_ratio = 2.0;     // backward cost / forward cost
  double comm = 0.0;               // latency of one activation/gradient message, cost units
  double capacity_gib = 80.0;      // device memory for the capacity line
  int trace_step = -1;             // step of a recorded trace to show (-1: the last)

  int world_size() const;
  int micro_batches() const;  // num_microbatches, or from microbatch_size, or the stage count
};

// The knobs as vit_train checks them (app::validate with world_size()), then the schedule's own
// constraints: throws cai::Error with vit_train's / the schedule's text.
void validate_knobs(const Knobs& k);

// knobs -> timeline. Throws cai::Error on invalid knobs.
using TimelineSource = std::function<Timeline(const Knobs&)>;
// The schedule IR replayed by schedule::validate(): per_layer costs (forward_per_layer ×
// layers, backward ×ratio), every rank of a stage shares its stage's program; memory = the
// rank's parameters, gradients and optimizer state (fp32, Adam: 2 slots, ZeRO-1 shards them over
// data parallelism, tensor parallelism splits everything) + live micro-batches × the activation
// bytes of its layers + two boundary buffers.
Timeline replay_schedule(const Knobs& k);

// A Chrome trace written by `vit_train --trace` (or the simulator): every rank's spans and
// memory counters, split into steps by the "step" spans.
struct RecordedTrace {
  std::string path;
  std::vector<RankTrack> ranks;                                // all spans of all steps
  std::vector<std::vector<std::pair<double, double>>> memory;  // per rank: (t_us, bytes)
  std::vector<std::pair<double, double>> steps;  // per step: [min start, max end] over ranks
};
// Throws cai::Error "[gui] trace <path>: <what is wrong>" on unreadable or malformed files.
RecordedTrace load_trace(const std::string& path);
RecordedTrace parse_trace(const std::string& json_text, const std::string& path);
// One step of a trace as a Timeline in ms from the step's start (step -1: the last).
Timeline trace_step(const RecordedTrace& t, int step);

struct MetricsRow {
  int64_t epoch = 0, step = 0;
  double loss = 0, accuracy = 0, lr = 0, img_per_s = 0;
  double test_accuracy = -1;  // epoch rows with an evaluation
};
struct MetricsRun {
  std::string path, label;  // label: the file name
  std::vector<MetricsRow> steps, epochs;
};
// vit_train's metrics file (JSON lines, "type": "step" | "epoch"). Throws "[gui] metrics
// <path> line N: ..." on malformed lines; an empty file is an error too.
MetricsRun load_metrics(const std::string& path);

// Parses "[spans] name" forms: "F(mb=3,c=0)", "B(mb=3,c=1)", "BI(..)", "BW(..)",
// "SendAct(mb=3,c=0,->2)", "RecvGrad(..)", "Load(mb=3)", "ReduceGrads", "OptStep", and the short
// "F3.1" (micro-batch 3, chunk 1). Unknown names fall back on the trace category.
Span span_from_name(const std::string& name, const std::string& trace_category);

class ExplorerModel {
 public:
  ExplorerModel();

  Knobs knobs;
  TimelineSource source;   // replay_schedule until the simulator lands
  Timeline current;        // the last valid timeline from the knobs
  std::string knob_error;  // why the current knobs are invalid ("" when valid; current is stale)
  std::optional<RecordedTrace> trace;
  Timeline recorded;  // trace_step(*trace, knobs.trace_step) when a trace is open
  std::vector<MetricsRun> runs;
  std::vector<std::string> errors;  // file errors, oldest first (the window lists them)
  std::string config_path;

  // Re-generates `current` (and `recorded`) from the knobs; false when the knobs are invalid.
  bool recompute();
  // Each returns false and appends to errors (the explorer keeps running) on failure.
  bool load_config(const std::string& path, const std::vector<std::string>& overrides = {});
  bool apply_overrides(const std::vector<std::string>& overrides);
  bool save_config(const std::string& path);
  bool open_trace(const std::string& path);
  bool open_metrics(const std::string& path);
  void add_error(std::string message);
  // Errors added since the last call (printed on stderr by the headless app).
  std::vector<std::string> take_new_errors();

 private:
  size_t errors_reported_ = 0;
};

}  // namespace cai::gui
