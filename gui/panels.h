// The explorer's panels: one function per panel, drawing an ExplorerModel with Dear ImGui.
// Panels own nothing: the app owns the model and the view state (zoom, selections), and each
// panel records where it drew what in `Drawn`, so tests can find rows, plots and widgets in a
// screenshot.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "explorer_model.h"

namespace cai::gui {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
};

// Colours the panels use (tests classify pixels with them).
Rgb category_colour(Category c, int mb);        // base hue per category, shaded by micro-batch
Rgb rank_colour(int rank);                      // memory curves
inline constexpr Rgb kIdleColour{96, 44, 52};   // bubble (no span) inside the step
inline constexpr Rgb kTrackColour{34, 36, 42};  // row background outside the step
inline constexpr Rgb kCapacityColour{230, 40, 40};

enum class Layout { All, Timeline, Memory, Curves };

// How a recorded trace is shown: below the simulation on its own axis, over its rows (outlines
// on the simulation's time axis, rows matched by rank), or not at all.
enum class TraceView { Beside, Over, Hidden };

// View state (the app's, changed by the panels on input).
struct UiState {
  Layout layout = Layout::All;
  // Visible part of the time axis, fractions (zoom and pan). The axis runs over the step, or over
  // the longest of the timelines drawn together (A/B, a trace over the simulation).
  double view_begin = 0, view_end = 1;
  TraceView trace_view = TraceView::Beside;
  int curves_x = 0;       // 0: per step, 1: per epoch
  int memory_source = 0;  // 0: the current timeline (B), 1: recorded trace, 2: layout A
  std::string config_path_input, trace_path_input, metrics_path_input, cluster_path_input,
      calibration_path_input, save_path_input = "explorer.toml";
};

struct Rect {
  float x0 = 0, y0 = 0, x1 = 0, y1 = 0;
  float cx() const { return (x0 + x1) / 2; }
  float cy() const { return (y0 + y1) / 2; }
};

// What the panels drew in the last frame, in framebuffer pixels (top-left origin).
struct DrawnRow {
  int rank = 0, stage = 0;
  float y0 = 0, y1 = 0;
};
struct DrawnTimeline {
  std::string source;
  std::string role;                // "" (the only one), "A", "B", "recorded"
  Rect plot;                       // the span area
  double t0 = 0, t1 = 0;           // times at plot.x0 and plot.x1
  float step_x0 = 0, step_x1 = 0;  // x of the step's begin and end (clipped to the plot)
  std::vector<DrawnRow> rows;
  int overlaid_spans = 0;  // recorded spans outlined over the rows (TraceView::Over)
};
struct DrawnMemory {
  Rect plot;
  double y_max = 0;        // bytes at plot.y0
  std::vector<int> ranks;  // curves drawn, in drawing order
  int highest_rank = -1;   // the rank whose curve reaches highest
  Rect legend;             // rank names in rank colours (not curves)
};
struct Drawn {
  // The current timeline (after A when one is pinned), then the recorded trace when beside.
  std::vector<DrawnTimeline> timelines;
  std::string comparison;  // the A/B line drawn (empty without a pinned layout)
  DrawnMemory memory;
  std::map<std::string, Rect> widgets;  // clickable knobs by id ("schedule.interleaved", ...)
  int curves_plotted = 0;               // runs × metrics drawn (test accuracy included)
  int test_accuracy_curves = 0;         // runs whose test accuracy per epoch is drawn
  int curves_layouts = 0;               // runs whose layout line ("run" record) is drawn
  void clear() { *this = Drawn(); }
};

// The whole window: lays the panels out over `width` × `height` pixels. Returns true when a knob
// changed (the app then calls model.recompute()).
bool draw_explorer(ExplorerModel& model, UiState& ui, Drawn& drawn, float width, float height);

// The panels (each inside the current ImGui window).
bool knobs_panel(ExplorerModel& model, UiState& ui, Drawn& drawn);
void errors_panel(const ExplorerModel& model);
void timeline_panel(ExplorerModel& model, UiState& ui, Drawn& drawn);  // pins layout A
void memory_panel(const ExplorerModel& model, UiState& ui, Drawn& drawn);
void curves_panel(const ExplorerModel& model, UiState& ui, Drawn& drawn);

}  // namespace cai::gui
