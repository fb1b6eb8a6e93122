// The explorer's timeline panel: one timeline per layout (A/B) and the recorded trace, drawn
// span by span with hover details and zoom/pan (panels.h's timeline_panel).
#include "panels.h"

#include <fmt/format.h>
#include <imgui.h>
#include <imgui_stdlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "cai/core/error.h"
#include "panels_internal.h"
#include "sim_source.h"

namespace cai::gui {

using namespace detail;

namespace {

double nice_step(double range, int target) {
  const double raw = range / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag) return m * mag;
  return 10 * mag;
}

const Span* span_at(const RankTrack& tr, double t, int lane) {
  const Span* found = nullptr;
  for (const Span& s : tr.spans)
    if (s.lane == lane && s.start <= t && t < s.end) found = &s;  // the last drawn (on top)
  return found;
}

Rgb lighter(Rgb c) {
  return Rgb{static_cast<uint8_t>((c.r + 255) / 2), static_cast<uint8_t>((c.g + 255) / 2),
             static_cast<uint8_t>((c.b + 255) / 2)};
}

// Filled rectangles of one lane, merged while they touch and share a colour: thousands of spans
// narrower than a pixel become a few rectangles (the frame time of 64 ranks × 32 micro-batches).
class RectBatch {
 public:
  RectBatch(ImDrawList* dl, float ya, float yb) : dl_(dl), ya_(ya), yb_(yb) {}
  ~RectBatch() { flush(); }
  void add(float xa, float xb, ImU32 c) {
    if (open_ && c == c_ && xa <= xb_ + 0.5f) {
      xb_ = std::max(xb_, xb);
      return;
    }
    flush();
    open_ = true, xa_ = xa, xb_ = xb, c_ = c;
  }
  void flush() {
    if (open_) dl_->AddRectFilled(ImVec2(xa_, ya_), ImVec2(std::max(xb_, xa_ + 0.5f), yb_), c_);
    open_ = false;
  }

 private:
  ImDrawList* dl_;
  float ya_, yb_, xa_ = 0, xb_ = 0;
  ImU32 c_ = 0;
  bool open_ = false;
};

struct TimelineView {
  const char* id = "##timeline";
  std::string role;                   // "", "A", "B", "recorded"
  double axis = 0;                    // > 0: the time axis runs from t_begin to t_begin + axis
  const Timeline* overlay = nullptr;  // a recorded trace outlined over the rows (same unit)
};

// One timeline into `height` pixels of the current window.
void draw_timeline(const Timeline& t, const TimelineView& v, UiState& ui, Drawn& drawn,
                   float height) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const std::string role = v.role.empty() || v.role == "recorded" ? "" : v.role + ": ";
  ImGui::Text("%s%s  |  %s, %d stages x %d micro-batches%s  |  step %s  |  mean bubble %.1f%%",
              role.c_str(), t.source.c_str(), t.schedule.c_str(), t.stages, t.micro_batches,
              t.chunks > 1 ? fmt::format(", {} chunks", t.chunks).c_str() : "",
              time_str(t.step(), t.time_unit).c_str(), t.mean_bubble() * 100);
  float header = ImGui::GetTextLineHeightWithSpacing();
  if (!t.detail.empty() || v.overlay) {
    ImGui::TextDisabled("%s%s", t.detail.c_str(),
                        v.overlay ? fmt::format("{}outlined over the rows: {} (step {})",
                                                t.detail.empty() ? "" : "  |  ", v.overlay->source,
                                                time_str(v.overlay->step(), v.overlay->time_unit))
                                        .c_str()
                                  : "");
    header += ImGui::GetTextLineHeightWithSpacing();
  }
  const ImVec2 origin = ImGui::GetCursorScreenPos();
  const float width = ImGui::GetContentRegionAvail().x;
  height = std::max(40.0f, height - header);
  ImGui::InvisibleButton(v.id, ImVec2(width, height));
  const bool hovered = ImGui::IsItemHovered(), active = ImGui::IsItemActive();
  constexpr float kLeft = 92, kRight = 210, kAxis = 18;
  Rect plot{origin.x + kLeft, origin.y, origin.x + width - kRight, origin.y + height - kAxis};
  if (plot.x1 - plot.x0 < 20 || t.empty()) return;
  double T = v.axis > 0 ? v.axis : t.step();
  if (v.overlay) T = std::max(T, v.overlay->step());
  T = std::max(1e-12, T);
  const double t0 = t.t_begin + ui.view_begin * T, t1 = t.t_begin + ui.view_end * T;
  const float pw = plot.x1 - plot.x0;
  auto x_of = [&](double tt) { return plot.x0 + static_cast<float>((tt - t0) / (t1 - t0)) * pw; };
  auto t_of = [&](float x) { return t0 + (x - plot.x0) / pw * (t1 - t0); };

  // Zoom (wheel, around the cursor), pan (drag), reset (double click).
  ImGuiIO& io = ImGui::GetIO();
  if (hovered && io.MouseWheel != 0) {
    const double f = std::clamp((io.MousePos.x - plot.x0) / pw, 0.0f, 1.0f);
    const double span = ui.view_end - ui.view_begin;
    const double ns = std::clamp(span * std::pow(0.8, io.MouseWheel), 1e-4, 1.0);
    const double c = ui.view_begin + f * span;
    ui.view_begin = std::clamp(c - f * ns, 0.0, 1.0 - ns);
    ui.view_end = ui.view_begin + ns;
  }
  if (active && io.MouseDelta.x != 0) {
    const double span = ui.view_end - ui.view_begin;
    const double d = -io.MouseDelta.x / pw * span;
    ui.view_begin = std::clamp(ui.view_begin + d, 0.0, 1.0 - span);
    ui.view_end = ui.view_begin + span;
  }
  if (hovered && ImGui::IsMouseDoubleClicked(0)) ui.view_begin = 0, ui.view_end = 1;

  DrawnTimeline dt;
  dt.source = t.source;
  dt.role = v.role;
  dt.plot = plot;
  dt.t0 = t0;
  dt.t1 = t1;
  dt.step_x0 = std::clamp(x_of(t.t_begin), plot.x0, plot.x1);
  dt.step_x1 = std::clamp(x_of(t.t_end), plot.x0, plot.x1);

  // Rows: one per rank, stages separated by a gap.
  const int n = static_cast<int>(t.ranks.size());
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return t.ranks[a].stage < t.ranks[b].stage; });
  int groups = 0;
  std::map<int, int> stage_rows;
  for (int i = 0; i < n; ++i) {
    if (i == 0 || t.ranks[order[i]].stage != t.ranks[order[i - 1]].stage) ++groups;
    ++stage_rows[t.ranks[order[i]].stage];
  }
  const float gap = n > 32 ? 1.0f : 3.0f;
  const float row_h =
      std::clamp((plot.y1 - plot.y0 - gap * static_cast<float>(groups - 1)) / n, 1.0f, 24.0f);
  bool has_lane1 = false;
  for (const RankTrack& tr : t.ranks)
    for (const Span& s : tr.spans) has_lane1 = has_lane1 || s.lane == 1;
  // Lane 1 (communication streams) below lane 0 when the rows have room for it.
  const bool two_lanes = has_lane1 && row_h >= 6;
  std::map<int, const RankTrack*> overlay_rows;
  if (v.overlay)
    for (const RankTrack& tr : v.overlay->ranks) overlay_rows.emplace(tr.rank, &tr);
  dl->AddRectFilled(ImVec2(origin.x, origin.y), ImVec2(origin.x + width, plot.y1),
                    IM_COL32(20, 21, 25, 255));
  float y = plot.y0;
  const float text_h = ImGui::GetTextLineHeight();
  for (int i = 0; i < n; ++i) {
    const RankTrack& tr = t.ranks[order[i]];
    const bool first_of_stage = i == 0 || tr.stage != t.ranks[order[i - 1]].stage;
    if (first_of_stage && i > 0) y += gap;
    DrawnRow row{tr.rank, tr.stage, y, y + row_h};
    const float pad = row_h >= 8 ? 1.0f : 0.0f;
    const float ya = y + pad, yb = y + row_h - pad;
    const float ym = two_lanes ? ya + std::floor((yb - ya) * 0.68f) : yb;  // lane 0 | lane 1
    dl->PushClipRect(ImVec2(plot.x0, plot.y0), ImVec2(plot.x1, plot.y1), true);
    dl->AddRectFilled(ImVec2(plot.x0, ya), ImVec2(plot.x1, yb), col(kTrackColour));
    dl->AddRectFilled(ImVec2(dt.step_x0, ya), ImVec2(dt.step_x1, ym), col(kIdleColour));
    struct Label {
      ImVec2 at;
      std::string text;
    };
    std::vector<Label> labels;
    {
      RectBatch lane0(dl, ya, ym), lane1(dl, ym + 1, yb);
      for (const Span& s : tr.spans) {
        if (s.end < t0 || s.start > t1 || (s.lane == 1 && !two_lanes)) continue;
        const float xa = x_of(s.start), xb = x_of(s.end);
        (s.lane == 0 ? lane0 : lane1).add(xa, xb, col(category_colour(s.category, s.mb)));
        if (s.lane == 0 && xb - xa > 16 && ym - ya >= text_h && s.mb >= 0) {
          // A weight gradient (W) is labelled "W3": it sits beside its B's "3".
          const std::string lab =
              (s.category == Category::Weight ? "W" : "") +
              (t.chunks > 1 ? fmt::format("{}.{}", s.mb, s.chunk) : fmt::format("{}", s.mb));
          const ImVec2 ts = ImGui::CalcTextSize(lab.c_str());
          if (ts.x + 2 < xb - xa)
            labels.push_back({ImVec2((xa + xb - ts.x) / 2, (ya + ym - ts.y) / 2), lab});
        }
      }
    }
    for (const Label& l : labels) dl->AddText(l.at, IM_COL32(15, 15, 20, 255), l.text.c_str());
    // A recorded trace over the row: its spans of the same rank as outlines.
    if (const auto it = overlay_rows.find(tr.rank); it != overlay_rows.end()) {
      for (const Span& s : it->second->spans) {
        if (s.end < t0 || s.start > t1 || s.lane != 0) continue;
        dl->AddRect(ImVec2(x_of(s.start), ya), ImVec2(std::max(x_of(s.end), x_of(s.start) + 1), ym),
                    col(lighter(category_colour(s.category, s.mb))), 0, 0, 1.0f);
        ++dt.overlaid_spans;
      }
    }
    dl->PopClipRect();
    if (row_h >= text_h - 2) {
      dl->AddText(ImVec2(origin.x + 2, y + (row_h - text_h) / 2), IM_COL32(200, 200, 200, 255),
                  fmt::format("s{} r{}", tr.stage, tr.rank).c_str());
    } else if (first_of_stage) {
      dl->AddText(ImVec2(origin.x + 2, y), IM_COL32(200, 200, 200, 255),
                  fmt::format("stage {}", tr.stage).c_str());
    }
    if (first_of_stage && tr.stage < static_cast<int>(t.bubbles.size())) {
      const StageBubble& b = t.bubbles[tr.stage];
      const std::string txt = b.ideal >= 0 ? fmt::format("bubble {:.1f}%, ideal {:.1f}%",
                                                         b.achieved * 100, b.ideal * 100)
                                           : fmt::format("bubble {:.1f}%", b.achieved * 100);
      if (row_h >= text_h - 2 || n <= 64)
        dl->AddText(ImVec2(plot.x1 + 6, y + std::max(0.0f, (row_h - text_h) / 2)),
                    IM_COL32(230, 200, 120, 255), txt.c_str());
      // Below, where the stage's rows leave room: its idle share, when communication on the
      // compute stream (tensor-parallel collectives) makes part of the bubble.
      const double idle = idle_fraction(tr, t.t_begin, t.t_end);
      const float group_h = row_h * static_cast<float>(stage_rows[tr.stage]);
      double comm = 0;  // lane-0 spans do not overlap
      for (const Span& s : tr.spans)
        if (s.lane == 0 && s.category == Category::Comm)
          comm += std::max(0.0, std::min(s.end, t.t_end) - std::max(s.start, t.t_begin));
      if (std::abs(idle - b.achieved) > 0.005 && group_h >= 2 * text_h + 2)
        dl->AddText(ImVec2(plot.x1 + 6, y + std::max(0.0f, (row_h - text_h) / 2) + text_h),
                    IM_COL32(200, 170, 100, 255),
                    fmt::format("idle {:.1f}%, comm {:.1f}%", idle * 100,
                                comm / std::max(1e-300, t.step()) * 100)
                        .c_str());
    }
    // Hover tooltip: the instruction (or communication) under the cursor.
    if (hovered && io.MousePos.y >= y && io.MousePos.y < y + row_h && io.MousePos.x >= plot.x0 &&
        io.MousePos.x < plot.x1) {
      const double tm = t_of(io.MousePos.x);
      const int lane = two_lanes && io.MousePos.y >= ym ? 1 : 0;
      if (const Span* s = span_at(tr, tm, lane)) {
        ImGui::BeginTooltip();
        ImGui::Text("%s  (%s)", s->name.c_str(), category_name(s->category));
        ImGui::Text("rank %d, stage %d%s", tr.rank, tr.stage,
                    lane == 1 ? ", communication stream" : "");
        if (s->mb >= 0) ImGui::Text("micro-batch %d, chunk %d", s->mb, s->chunk);
        ImGui::Text("start %s, duration %s", time_str(s->start, t.time_unit).c_str(),
                    time_str(s->end - s->start, t.time_unit).c_str());
        ImGui::EndTooltip();
      } else if (lane == 0 && tm >= t.t_begin && tm <= t.t_end) {
        ImGui::SetTooltip("idle (bubble) on rank %d at %s", tr.rank,
                          time_str(tm, t.time_unit).c_str());
      }
    }
    dt.rows.push_back(row);
    y += row_h;
  }
  // Time axis.
  const double step = nice_step(t1 - t0, 8);
  for (double tick = std::ceil(t0 / step) * step; tick <= t1 + 1e-12; tick += step) {
    const float x = x_of(tick);
    dl->AddLine(ImVec2(x, plot.y1), ImVec2(x, plot.y1 + 4), IM_COL32(180, 180, 180, 255));
    dl->AddText(ImVec2(x + 2, plot.y1 + 2), IM_COL32(180, 180, 180, 255),
                fmt::format("{:.4g}", tick).c_str());
  }
  dl->AddText(ImVec2(origin.x + 2, plot.y1 + 2), IM_COL32(180, 180, 180, 255),
              fmt::format("time ({})", t.time_unit).c_str());
  drawn.timelines.push_back(std::move(dt));
}

}  // namespace

void timeline_panel(ExplorerModel& model, UiState& ui, Drawn& drawn) {
  // Legend.
  for (int c = 0; c < kNumCategories; ++c) {
    const ImVec2 p = ImGui::GetCursorScreenPos();
    ImGui::GetWindowDrawList()->AddRectFilled(p, ImVec2(p.x + 10, p.y + 10),
                                              col(category_colour(static_cast<Category>(c), 0)));
    ImGui::Dummy(ImVec2(10, 10));
    ImGui::SameLine();
    ImGui::TextUnformatted(category_name(static_cast<Category>(c)));
    ImGui::SameLine();
  }
  {
    const ImVec2 p = ImGui::GetCursorScreenPos();
    ImGui::GetWindowDrawList()->AddRectFilled(p, ImVec2(p.x + 10, p.y + 10), col(kIdleColour));
    ImGui::Dummy(ImVec2(10, 10));
    ImGui::SameLine();
    ImGui::TextUnformatted("idle (bubble)   shade = micro-batch; wheel zoom, drag pan");
  }
  // A/B: pin the current layout as A, turn the knobs for B.
  if (ImGui::Button(model.pinned ? "re-pin as A" : "pin as A")) model.pin();
  drawn.widgets["pin"] = item_rect();
  if (model.pinned) {
    ImGui::SameLine();
    if (ImGui::Button("unpin A")) model.unpin(), ui.memory_source = 0;
    drawn.widgets["unpin"] = item_rect();
  }
  ImGui::SameLine();
  ImGui::TextDisabled(model.pinned ? "A: pinned, B: the knobs" : "(then turn knobs: B)");
  if (model.trace) {
    ImGui::SameLine(0, 24);
    ImGui::TextUnformatted("recorded trace:");
    const std::pair<TraceView, const char*> views[] = {
        {TraceView::Beside, "beside"}, {TraceView::Over, "over"}, {TraceView::Hidden, "hidden"}};
    for (const auto& [view, name] : views) {
      ImGui::SameLine();
      if (ImGui::RadioButton(name, ui.trace_view == view)) ui.trace_view = view;
      drawn.widgets[std::string("trace.") + name] = item_rect();
    }
  }
  const bool has_trace = model.trace && !model.recorded.empty();
  // Over the simulation only on a common time unit (the ideal replay counts cost units):
  // otherwise beside.
  const bool same_unit = model.recorded.time_unit == model.current.time_unit;
  const bool over = has_trace && ui.trace_view == TraceView::Over && same_unit;
  const bool beside = has_trace && (ui.trace_view == TraceView::Beside ||
                                    (ui.trace_view == TraceView::Over && !same_unit));
  const Timeline* a = model.pinned ? &*model.pinned : nullptr;
  if (a) {
    // A/B: the figures of both and B - A.
    const Comparison c = compare(*a, model.current);
    const std::string& u = model.current.time_unit;
    drawn.comparison = fmt::format(
        "A: step {}, bubble {:.1f}%, peak {}   B: step {}, bubble {:.1f}%, peak {}   B - A: step "
        "{:+.4g} {} ({:+.1f}%), bubble {:+.1f} pts, peak {}{} ({:+.1f}%)",
        time_str(c.step_a, a->time_unit), c.bubble_a * 100, bytes_str(c.peak_a),
        time_str(c.step_b, u), c.bubble_b * 100, bytes_str(c.peak_b), c.step_diff(), u,
        c.step_rel() * 100, c.bubble_diff() * 100, c.peak_diff() >= 0 ? "+" : "-",
        bytes_str(std::abs(c.peak_diff())), c.peak_rel() * 100);
    ImGui::PushStyleColor(ImGuiCol_Text, ImVec4(0.55f, 0.85f, 1.0f, 1));
    ImGui::TextWrapped("%s%s", drawn.comparison.c_str(),
                       a->time_unit == u ? "" : "  (different time units: separate axes)");
    ImGui::PopStyleColor();
  }
  const int count = 1 + (a ? 1 : 0) + (beside ? 1 : 0);
  const float h = ImGui::GetContentRegionAvail().y / static_cast<float>(count) - 4;
  // A and B on one time axis: the longer step's.
  double axis = 0;
  if (a && a->time_unit == model.current.time_unit)
    axis = std::max(a->step(), model.current.step());
  if (a) {
    TimelineView va;
    va.id = "##layout_a";
    va.role = "A";
    va.axis = axis;
    draw_timeline(*a, va, ui, drawn, h);
  }
  TimelineView vb;
  vb.id = "##current";
  vb.role = a ? "B" : "";
  vb.axis = axis;
  vb.overlay = over ? &model.recorded : nullptr;
  draw_timeline(model.current, vb, ui, drawn, h);
  if (beside) {
    TimelineView vr;
    vr.id = "##recorded";
    vr.role = "recorded";
    draw_timeline(model.recorded, vr, ui, drawn, h);
  }
}

}  // namespace cai::gui
