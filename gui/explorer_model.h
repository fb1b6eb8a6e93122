// The schedule explorer's model: plain structs for the knobs, the timeline being shown (per rank
// a list of spans), per-rank memory curves with their breakdown, per-stage bubbles, recorded
// traces, training-curve files and errors. No ImGui, no OpenGL: a headless test drives this and
// reads back what the panels (panels.h) would draw.
//
// Where timelines come from: a TimelineSource turns knobs into a Timeline. Two sources, chosen by
// Knobs::source: the SimGrid simulator (sim_source.h: the config's step through sim/'s
// workload_from_config and replay, as `colossalai-sim --config` runs it: spans with simulated
// times, achieved bubbles, memory curves with the plan's breakdown), the default when the build
// has SimGrid; and replay_schedule() (the schedule IR's validator replay with ideal unit costs,
// labelled "schedule replay (ideal)"), the fallback without it.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cai/config/config.h"
#include "cai/schedule/schedule.h"

namespace cai::gui {

// Backward: a whole backward or a split one's BackwardInput (B); Weight: its BackwardWeight (W).
enum class Category { Forward, Backward, Comm, Optimizer, Load, Reduce, Weight };
// The category a schedule instruction is drawn in (the replay and the simulator source alike).
Category category_of(schedule::Op op);
inline constexpr int kNumCategories = 7;
const char* category_name(Category c);  // "forward", "backward", "comm", ..., "weight grad"

// One timed instruction on one rank. Times are in Timeline::time_unit from the timeline's origin.
struct Span {
  std::string name;  // the instruction as the executor names it: "F(mb=3,c=0)", "OptStep", ...
  Category category = Category::Forward;
  int mb = -1;  // micro-batch, -1 when the instruction has none (ReduceGrads, OptStep)
  int chunk = 0;
  double start = 0, end = 0;
  // 0: the rank's program (host thread and compute stream, collectives that run on it
  // included: what the bubble is measured on); 1: its communication streams (sends, gradient
  // reductions), drawn in a band below.
  int lane = 0;
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
  // "simulator (SimGrid)" | "schedule replay (ideal)" | "trace: <file> (step k)"
  std::string source;
  std::string detail;           // the simulator: cluster, ranks simulated, time to simulate
  std::string time_unit = "u";  // "u" (cost units) | "ms"
  std::string schedule;         // "1f1b", ...
  int stages = 1, micro_batches = 1, chunks = 1;
  std::vector<RankTrack> ranks;  // rank order
  double t_begin = 0, t_end = 0;
  std::vector<StageBubble> bubbles;  // per stage
  std::vector<MemoryCurve> memory;   // per rank (may be empty)
  double capacity_bytes = 0;         // device memory (0: unknown)
  double img_per_s = 0;              // the simulator: global batch / step (0: unknown)
  // The plan's predicted peak (the simulator): the largest over the stages and the rank it is on
  // (the stage's data-parallel 0, tensor-parallel 0 rank); -1: no prediction.
  int plan_peak_rank = -1;
  double plan_peak_bytes = 0;
  double compute_ms = 0;  // host time that made this timeline (re-simulation time)
  bool empty() const { return ranks.empty(); }
  double step() const { return t_end - t_begin; }
  double mean_bubble() const;  // mean of the stages' achieved bubbles
  double peak_memory() const;  // the highest curve's peak (0 without curves)
  int peak_rank() const;       // its rank (-1 without curves)
};

// Layout A (pinned) against layout B (the current knobs): B - A of each figure; relative ones
// are fractions of A (0 when A's is 0). Times in the timelines' unit.
struct Comparison {
  double step_a = 0, step_b = 0, bubble_a = 0, bubble_b = 0, peak_a = 0, peak_b = 0;
  double step_diff() const { return step_b - step_a; }
  double step_rel() const { return step_a > 0 ? step_b / step_a - 1 : 0; }
  double bubble_diff() const { return bubble_b - bubble_a; }
  double peak_diff() const { return peak_b - peak_a; }
  double peak_rel() const { return peak_a > 0 ? peak_b / peak_a - 1 : 0; }
};
Comparison compare(const Timeline& a, const Timeline& b);

// Fraction of [t0, t1] on `track` covered by no lane-0 span (the bubble as drawn on the row's
// centre line), and by no compute span (forward/backward: the bubble as the executor measures
// it).
double idle_fraction(const RankTrack& track, double t0, double t1);
double non_compute_fraction(const RankTrack& track, double t0, double t1);

enum class Source { Simulator, Replay };
const char* source_name(Source s);  // "simulator" | "replay"

// What the explorer lets one turn. The parallel layout and the model are vit_train's own config,
// so loading/saving a config and validating it use vit_train's code and error text.
struct Knobs {
  config::TrainConfig config;
  int world = 0;  // GPUs (0: pipeline × tensor size, one data-parallel replica)
  Source source = Source::Simulator;  // ExplorerModel sets Replay when built without SimGrid
  // The simulator's inputs: a cluster description (hostfiles/clusters/*.toml; "" = the smallest
  // shipped one that fits, see cluster_path) and an optional calibration profile
  // (sim/calibrations/*.json; "" = the built-in efficiencies).
  std::string cluster, calibration;
  // The ideal replay's costs and capacity:
  double forward_per_layer = 1.0;  // cost units per layer and micro-batch
  double backward_ratio = 2.0;     // backward cost / forward cost
  double comm = 0.0;               // latency of one activation/gradient message, cost units
  double capacity_gib = 80.0;      // device memory for the capacity line (the simulator: the
                                   // cluster's GPU memory)
  int trace_step = -1;             // step of a recorded trace to show (-1: the last)

  int world_size() const;
  int micro_batches() const;  // num_microbatches, or from microbatch_size, or the stage count
};

// The knobs as vit_train checks them (config::validate with world_size()), then the schedule's own
// constraints: throws cai::Error with vit_train's / the schedule's text.
void validate_knobs(const Knobs& k);

// The cluster and calibration files shipped with the sources (hostfiles/clusters/*.toml,
// sim/calibrations/*.json), sorted by name.
std::vector<std::string> shipped_clusters();
std::vector<std::string> shipped_calibrations();
// The cluster file the simulator uses for these knobs: Knobs::cluster, or the shipped one with
// the fewest ranks that holds world_size() ranks — among CPU clusters (more ranks than cores)
// for train.device = "cpu" when one fits, else among GPU clusters. Throws "[gui] ..." when none
// fits.
std::string cluster_path(const Knobs& k);

// knobs -> timeline. Throws cai::Error on invalid knobs.
using TimelineSource = std::function<Timeline(const Knobs&)>;
// Knobs::source's timeline: simulate_step (sim_source.h) or replay_schedule.
Timeline timeline_for(const Knobs& k);
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
// The layout a run really had: its "run" record (the last one: a resumed run may have another).
struct MetricsLayout {
  int processes = 1, dp = 1, pp = 1, tp = 1, zero_stage = 0;
  int64_t batch_per_process = 0, global_batch = 0;
  std::string tensor_mode = "none", model, device, layout;
  // "2 processes (dp 2 × pp 1 × tp 1), 64 samples each per step (global batch 128)"
  std::string describe() const;
};
struct MetricsRun {
  std::string path, label;  // label: the file name
  std::vector<MetricsRow> steps, epochs;
  std::optional<MetricsLayout> layout;
};
// vit_train's metrics file (JSON lines, "type": "step" | "epoch" | "run" | "resume" |
// "preempted"). Throws "[gui] metrics <path> line N: ..." on malformed lines; an empty file is an
// error too.
MetricsRun load_metrics(const std::string& path);

// Parses "[spans] name" forms: "F(mb=3,c=0)", "B(mb=3,c=1)", "BI(..)", "BW(..)",
// "SendAct(mb=3,c=0,->2)", "RecvGrad(..)", "Load(mb=3)", "ReduceGrads", "OptStep", and the short
// "F3.1" (micro-batch 3, chunk 1). Unknown names fall back on the trace category.
Span span_from_name(const std::string& name, const std::string& trace_category);

class ExplorerModel {
 public:
  ExplorerModel();

  Knobs knobs;
  TimelineSource source;  // timeline_for (tests may plug in another)
  Timeline current;       // the last valid timeline from the knobs (layout B when one is pinned)
  std::optional<Timeline> pinned;  // layout A of an A/B comparison
  Knobs pinned_knobs;              // the knobs that made it
  std::string knob_error;  // why the current knobs are invalid ("" when valid; current is stale)
  std::optional<RecordedTrace> trace;
  Timeline recorded;  // trace_step(*trace, knobs.trace_step) when a trace is open
  std::vector<MetricsRun> runs;
  std::vector<std::string> errors;  // file errors, oldest first (the window lists them)
  std::string config_path;
  // shipped_clusters() / shipped_calibrations() when the model was made, and the cluster the
  // knobs resolve to (cluster_path) at the last recompute ("" when none fits).
  std::vector<std::string> shipped_clusters, shipped_calibrations;
  std::string cluster_in_use;

  // Re-generates `current` (and `recorded`) from the knobs; false when the knobs are invalid.
  bool recompute();
  // A/B: keep the current layout as A (false when the knobs are invalid); unpin drops it.
  bool pin();
  void unpin();
  // Each returns false and appends to errors (the explorer keeps running) on failure.
  bool load_config(const std::string& path, const std::vector<std::string>& overrides = {});
  bool apply_overrides(const std::vector<std::string>& overrides);
  bool save_config(const std::string& path);
  bool open_trace(const std::string& path);
  bool open_metrics(const std::string& path);
  // The knobs take the layout run `i` really had (its "run" record: processes, pipeline, tensor
  // size and mode, ZeRO stage, batch per process); false (and an error) when it has none or the
  // layout is not valid for the knobs.
  bool adopt_run_layout(size_t i);
  void add_error(std::string message);
  // Errors added since the last call (printed on stderr by the headless app).
  std::vector<std::string> take_new_errors();

 private:
  size_t errors_reported_ = 0;
};

}  // namespace cai::gui
