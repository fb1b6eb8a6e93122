#include "panels.h"

#include <fmt/format.h>
#include <imgui.h>
#include <imgui_stdlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "cai/core/error.h"
#include "sim_source.h"

namespace cai::gui {

namespace {

ImU32 col(Rgb c, int alpha = 255) {
  return IM_COL32(c.r, c.g, c.b, alpha);
}

std::string bytes_str(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::abs(b) >= 1024 && u < 4) b /= 1024, ++u;
  return fmt::format("{:.{}f} {}", b, u == 0 ? 0 : 2, units[u]);
}

std::string time_str(double t, const std::string& unit) {
  return fmt::format("{:.4g} {}", t, unit);
}

Rect item_rect() {
  const ImVec2 a = ImGui::GetItemRectMin(), b = ImGui::GetItemRectMax();
  return Rect{a.x, a.y, b.x, b.y};
}

// "-" and "+" buttons around an integer field; records the buttons' rects as id.minus/id.plus.
bool int_knob(const char* id, const char* label, int64_t& v, int64_t lo, int64_t hi, Drawn& drawn) {
  bool changed = false;
  ImGui::PushID(id);
  if (ImGui::Button("-")) v = std::max(lo, v - 1), changed = true;
  drawn.widgets[std::string(id) + ".minus"] = item_rect();
  ImGui::SameLine(0, 2);
  if (ImGui::Button("+")) v = std::min(hi, v + 1), changed = true;
  drawn.widgets[std::string(id) + ".plus"] = item_rect();
  ImGui::SameLine();
  ImGui::SetNextItemWidth(70);
  int64_t tmp = v;
  if (ImGui::InputScalar("##v", ImGuiDataType_S64, &tmp, nullptr, nullptr, "%lld",
                         ImGuiInputTextFlags_EnterReturnsTrue)) {
    v = std::clamp(tmp, lo, hi);
    changed = true;
  }
  drawn.widgets[std::string(id) + ".field"] = item_rect();
  ImGui::SameLine();
  ImGui::TextUnformatted(label);
  ImGui::PopID();
  return changed;
}

bool double_knob(const char* label, double& v, double lo, double hi, const char* fmt_) {
  ImGui::SetNextItemWidth(120);
  return ImGui::DragScalar(label, ImGuiDataType_Double, &v, static_cast<float>((hi - lo) / 400),
                           &lo, &hi, fmt_);
}

// A file knob: a combo of `shipped` files (by name) with `none` first (the empty path), and a
// path field with a "use" button for any other file. Returns true when `value` changed.
bool file_choice(const char* id, const char* none, const std::vector<std::string>& shipped,
                 std::string& value, std::string& input, Drawn& drawn) {
  bool changed = false;
  ImGui::PushID(id);
  const std::string shown =
      value.empty() ? std::string(none) : std::filesystem::path(value).filename().string();
  ImGui::SetNextItemWidth(200);
  if (ImGui::BeginCombo(id, shown.c_str())) {
    if (ImGui::Selectable(none, value.empty())) value.clear(), changed = true;
    for (const std::string& f : shipped)
      if (ImGui::Selectable(std::filesystem::path(f).filename().c_str(), value == f))
        value = f, changed = true;
    ImGui::EndCombo();
  }
  drawn.widgets[std::string(id) + ".combo"] = item_rect();
  ImGui::SetNextItemWidth(200);
  ImGui::InputText("##path", &input);
  ImGui::SameLine();
  if (ImGui::Button("use") && !input.empty()) value = input, changed = true;
  ImGui::PopID();
  return changed;
}

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

// A line plot of several series into the next `size` pixels; returns the plot rect.
struct Series {
  std::string label;
  Rgb colour;
  std::vector<std::pair<double, double>> xy;
};
void line_plot(const char* title, const std::vector<Series>& series, ImVec2 size) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const ImVec2 o = ImGui::GetCursorScreenPos();
  ImGui::Dummy(size);
  dl->AddRectFilled(o, ImVec2(o.x + size.x, o.y + size.y), IM_COL32(24, 26, 30, 255));
  dl->AddText(ImVec2(o.x + 4, o.y + 2), IM_COL32(220, 220, 220, 255), title);
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const auto& s : series)
    for (auto [x, yv] : s.xy)
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, yv), y1 = std::max(y1, yv);
  if (x0 > x1) {
    dl->AddText(ImVec2(o.x + 4, o.y + 20), IM_COL32(140, 140, 140, 255), "(no data)");
    return;
  }
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + std::max(1e-9, std::abs(y0) * 0.1);
  const double pad = (y1 - y0) * 0.08;
  y0 -= pad, y1 += pad;
  const Rect p{o.x + 48, o.y + 18, o.x + size.x - 6, o.y + size.y - 16};
  auto px = [&](double x) {
    return p.x0 + static_cast<float>((x - x0) / (x1 - x0)) * (p.x1 - p.x0);
  };
  auto py = [&](double yv) {
    return p.y1 - static_cast<float>((yv - y0) / (y1 - y0)) * (p.y1 - p.y0);
  };
  dl->AddRect(ImVec2(p.x0, p.y0), ImVec2(p.x1, p.y1), IM_COL32(70, 70, 80, 255));
  for (double v : {y0 + pad, (y0 + y1) / 2, y1 - pad})
    dl->AddText(ImVec2(o.x + 2, py(v) - 6), IM_COL32(160, 160, 160, 255),
                fmt::format("{:.3g}", v).c_str());
  dl->AddText(ImVec2(p.x0, p.y1 + 1), IM_COL32(160, 160, 160, 255),
              fmt::format("{:g}", x0).c_str());
  const std::string xe = fmt::format("{:g}", x1);
  dl->AddText(ImVec2(p.x1 - ImGui::CalcTextSize(xe.c_str()).x, p.y1 + 1),
              IM_COL32(160, 160, 160, 255), xe.c_str());
  for (const auto& s : series) {
    std::vector<ImVec2> pts;
    for (auto [x, yv] : s.xy) pts.emplace_back(px(x), py(yv));
    if (pts.size() == 1) dl->AddCircleFilled(pts[0], 3, col(s.colour));
    dl->AddPolyline(pts.data(), static_cast<int>(pts.size()), col(s.colour), 0, 2.0f);
  }
}

}  // namespace

Rgb category_colour(Category c, int mb) {
  // forward blue, backward (B) green, comm amber, optimizer purple, load grey, reduce orange,
  // weight gradient (W) cyan.
  static constexpr Rgb base[kNumCategories] = {{70, 130, 230}, {60, 180, 95},   {235, 175, 40},
                                               {175, 95, 210}, {130, 160, 170}, {215, 110, 60},
                                               {40, 205, 215}};
  const Rgb b = base[static_cast<int>(c)];
  const float f = 1.0f - 0.3f * static_cast<float>(mb < 0 ? 0 : mb % 4) / 3.0f;
  return Rgb{static_cast<uint8_t>(b.r * f), static_cast<uint8_t>(b.g * f),
             static_cast<uint8_t>(b.b * f)};
}

Rgb rank_colour(int rank) {
  // Golden-ratio hues, full saturation: neighbouring ranks far apart.
  const float h = std::fmod(0.07f + 0.618034f * static_cast<float>(rank), 1.0f);
  float r, g, b;
  ImGui::ColorConvertHSVtoRGB(h, 0.75f, 1.0f, r, g, b);
  return Rgb{static_cast<uint8_t>(r * 255), static_cast<uint8_t>(g * 255),
             static_cast<uint8_t>(b * 255)};
}

bool knobs_panel(ExplorerModel& model, UiState& ui, Drawn& drawn) {
  bool changed = false;
  config::TrainConfig& c = model.knobs.config;
  ImGui::TextColored(ImVec4(0.9f, 0.8f, 0.4f, 1), "timeline: %s", model.current.source.c_str());
  if (model.current.compute_ms > 0) {
    ImGui::SameLine();
    ImGui::TextDisabled("(%.0f ms)", model.current.compute_ms);
  }
  ImGui::TextUnformatted("source");
  for (const Source src : {Source::Simulator, Source::Replay}) {
    ImGui::SameLine();
    const bool off = src == Source::Simulator && !simulator_available();
    if (off) ImGui::BeginDisabled();
    if (ImGui::RadioButton(src == Source::Simulator ? "simulator" : "ideal replay",
                           model.knobs.source == src)) {
      model.knobs.source = src;
      changed = true;
    }
    if (off) ImGui::EndDisabled();
    drawn.widgets[std::string("source.") + source_name(src)] = item_rect();
  }
  if (!simulator_available()) ImGui::TextDisabled("(built without SimGrid: no simulator)");
  if (ImGui::CollapsingHeader("config", ImGuiTreeNodeFlags_DefaultOpen)) {
    ImGui::SetNextItemWidth(200);
    ImGui::InputText("##cfg", &ui.config_path_input);
    ImGui::SameLine();
    if (ImGui::Button("load")) model.load_config(ui.config_path_input);
    ImGui::SetNextItemWidth(200);
    ImGui::InputText("##save", &ui.save_path_input);
    ImGui::SameLine();
    if (ImGui::Button("save")) model.save_config(ui.save_path_input);
    if (!model.config_path.empty()) ImGui::TextDisabled("loaded: %s", model.config_path.c_str());
  }
  if (ImGui::CollapsingHeader("layout", ImGuiTreeNodeFlags_DefaultOpen)) {
    int64_t world = model.knobs.world_size();
    const std::string gpus_label = fmt::format(
        "GPUs (data parallel {})", model.knobs.world_size() / static_cast<int>(std::max<int64_t>(
                                                                  1, c.pipeline * c.tensor_size)));
    if (int_knob("gpus", gpus_label.c_str(), world, 1, 4096, drawn)) {
      model.knobs.world = static_cast<int>(world);
      changed = true;
    }
    changed |= int_knob("pp", "pipeline stages", c.pipeline, 1, 512, drawn);
    ImGui::TextUnformatted("schedule");
    for (const char* s : {"gpipe", "1f1b", "interleaved", "zbh1", "zbv"}) {
      // The zero-bubble styles on a second row: the panel is too narrow for five.
      if (std::string(s) == "zbh1")
        ImGui::Indent(ImGui::CalcTextSize("schedule").x + ImGui::GetStyle().ItemSpacing.x);
      else
        ImGui::SameLine();
      if (ImGui::RadioButton(s, c.pp_style == s)) {
        c.pp_style = s;
        if (c.pp_style == "interleaved" && c.num_model_chunks < 2) c.num_model_chunks = 2;
        if (c.pp_style == "zbv") c.num_model_chunks = 2;  // its V: two chunks per rank
        if (c.pp_style != "interleaved" && c.pp_style != "zbv") c.num_model_chunks = 1;
        changed = true;
      }
      drawn.widgets[std::string("schedule.") + s] = item_rect();
    }
    ImGui::Unindent(ImGui::CalcTextSize("schedule").x + ImGui::GetStyle().ItemSpacing.x);
    if (c.pp_style == "interleaved")
      changed |= int_knob("chunks", "chunks per rank", c.num_model_chunks, 1, 16, drawn);
    int64_t m = model.knobs.micro_batches();
    if (int_knob("mb", "micro-batches", m, 1, 4096, drawn)) {
      c.num_microbatches = m;
      c.microbatch_size = 0;
      changed = true;
    }
    changed |= int_knob("tp", "tensor size", c.tensor_size, 1, 64, drawn);
    ImGui::TextUnformatted("tensor mode");
    for (const char* s : {"1d", "2d", "2.5d", "3d"}) {
      ImGui::SameLine();
      if (ImGui::RadioButton(
              s, c.tensor_mode == s || (c.tensor_mode == "none" && std::string(s) == "1d"))) {
        c.tensor_mode = s;
        if (c.tensor_mode != "2.5d") c.tensor_depth = 1;
        changed = true;
      }
      drawn.widgets[std::string("tensor_mode.") + s] = item_rect();
    }
    if (c.tensor_mode == "2.5d")
      changed |= int_knob("tdepth", "2.5d depth", c.tensor_depth, 1, 64, drawn);
    // Size 1 is no tensor parallelism; a size above 1 needs a mode (1d unless one was picked).
    if (c.tensor_size > 1 && c.tensor_mode == "none") c.tensor_mode = "1d";
    if (c.tensor_size == 1) c.tensor_mode = "none", c.tensor_depth = 1;
    {
      // Sequence parallelism: Megatron's split over the 1d tensor-parallel group.
      bool sp = c.sequence_parallel;
      if (ImGui::Checkbox("sequence parallel", &sp)) c.sequence_parallel = sp, changed = true;
      drawn.widgets["sp"] = item_rect();
    }
    ImGui::SameLine();
    if (ImGui::Checkbox("CPU offload", &c.cpu_offload)) changed = true;
    drawn.widgets["offload"] = item_rect();
    changed |= int_knob("zero", "ZeRO stage", c.zero_stage, 0, 3, drawn);
    changed |= int_knob("batch", "batch per replica", c.batch_size, 1, 1 << 20, drawn);
  }
  if (ImGui::CollapsingHeader("model", ImGuiTreeNodeFlags_DefaultOpen)) {
    // Explicit keys win over a named model (vit_train's rule), so a turned knob takes effect.
    auto model_knob = [&](const char* id, const char* label, int64_t& v, const char* key,
                          int64_t lo, int64_t hi) {
      if (!int_knob(id, label, v, lo, hi, drawn)) return false;
      c.explicitly_set.insert(key);
      return true;
    };
    changed |= model_knob("depth", "depth (blocks)", c.depth, "model.depth", 1, 256);
    changed |= model_knob("hidden", "hidden", c.hidden_size, "model.hidden_size", 8, 65536);
    changed |= model_knob("heads", "heads", c.num_heads, "model.num_heads", 1, 256);
    changed |= ImGui::Checkbox("activation checkpointing", &c.checkpoint);
    ImGui::TextUnformatted("precision");
    for (const char* p : {"fp32", "bf16", "fp16"}) {
      ImGui::SameLine();
      if (ImGui::RadioButton(p, c.precision == p)) c.precision = p, changed = true;
      drawn.widgets[std::string("precision.") + p] = item_rect();
    }
    ImGui::TextUnformatted("device");
    for (const char* d : {"cpu", "cuda"}) {
      ImGui::SameLine();
      if (ImGui::RadioButton(d, c.device == d)) c.device = d, changed = true;
      drawn.widgets[std::string("device.") + d] = item_rect();
    }
    ImGui::TextDisabled("img %lld, patch %lld%s", static_cast<long long>(c.img_size),
                        static_cast<long long>(c.patch_size),
                        c.model_name.empty() ? "" : (", " + c.model_name).c_str());
  }
  if (model.knobs.source == Source::Simulator &&
      ImGui::CollapsingHeader("cluster (simulator)", ImGuiTreeNodeFlags_DefaultOpen)) {
    const std::string automatic =
        model.cluster_in_use.empty()
            ? std::string("auto")
            : "auto: " + std::filesystem::path(model.cluster_in_use).filename().string();
    changed |= file_choice("cluster", automatic.c_str(), model.shipped_clusters,
                           model.knobs.cluster, ui.cluster_path_input, drawn);
    changed |= file_choice("calibration", "none (built-in)", model.shipped_calibrations,
                           model.knobs.calibration, ui.calibration_path_input, drawn);
  }
  if (model.knobs.source == Source::Replay &&
      ImGui::CollapsingHeader("costs (replay)", ImGuiTreeNodeFlags_DefaultOpen)) {
    changed |= double_knob("forward / layer", model.knobs.forward_per_layer, 0.01, 100, "%.3g u");
    changed |= double_knob("backward ratio", model.knobs.backward_ratio, 0.1, 10, "%.2f");
    changed |= double_knob("message latency", model.knobs.comm, 0, 100, "%.3g u");
    changed |= double_knob("capacity", model.knobs.capacity_gib, 0.1, 1024, "%.3g GiB");
  }
  if (ImGui::CollapsingHeader("recorded", ImGuiTreeNodeFlags_DefaultOpen)) {
    ImGui::SetNextItemWidth(200);
    ImGui::InputText("##trace", &ui.trace_path_input);
    ImGui::SameLine();
    if (ImGui::Button("open trace")) model.open_trace(ui.trace_path_input);
    if (model.trace) {
      const int n = static_cast<int>(model.trace->steps.size());
      int step = (model.knobs.trace_step < 0 ? n - 1 : model.knobs.trace_step) + 1;  // 1-based
      ImGui::SetNextItemWidth(150);
      if (ImGui::SliderInt("trace step", &step, 1, n)) {
        model.knobs.trace_step = step - 1;
        changed = true;
      }
    }
    ImGui::SetNextItemWidth(200);
    ImGui::InputText("##metrics", &ui.metrics_path_input);
    ImGui::SameLine();
    if (ImGui::Button("open metrics")) model.open_metrics(ui.metrics_path_input);
  }
  if (!model.knob_error.empty()) {
    ImGui::PushStyleColor(ImGuiCol_Text, ImVec4(1, 0.4f, 0.4f, 1));
    ImGui::TextWrapped("invalid: %s", model.knob_error.c_str());
    ImGui::TextWrapped("(showing the last valid layout)");
    ImGui::PopStyleColor();
  }
  return changed;
}

void errors_panel(const ExplorerModel& model) {
  if (model.errors.empty()) return;
  ImGui::Separator();
  ImGui::TextColored(ImVec4(1, 0.4f, 0.4f, 1), "errors (%zu)", model.errors.size());
  ImGui::PushStyleColor(ImGuiCol_Text, ImVec4(1, 0.55f, 0.55f, 1));
  const size_t first = model.errors.size() > 6 ? model.errors.size() - 6 : 0;
  for (size_t i = first; i < model.errors.size(); ++i)
    ImGui::TextWrapped("%s", model.errors[i].c_str());
  ImGui::PopStyleColor();
}

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

void memory_panel(const ExplorerModel& model, UiState& ui, Drawn& drawn) {
  if (model.trace || model.pinned) {
    ImGui::RadioButton(model.pinned                                    ? "B"
                       : model.current.source == "simulator (SimGrid)" ? "simulation"
                                                                       : "replay",
                       &ui.memory_source, 0);
    if (model.trace) {
      ImGui::SameLine();
      ImGui::RadioButton("recorded", &ui.memory_source, 1);
    }
    if (model.pinned) {
      ImGui::SameLine();
      ImGui::RadioButton("A", &ui.memory_source, 2);
    }
    ImGui::SameLine();
  }
  const Timeline& t = ui.memory_source == 1 && model.trace    ? model.recorded
                      : ui.memory_source == 2 && model.pinned ? *model.pinned
                                                              : model.current;
  ImDrawList* dl = ImGui::GetWindowDrawList();
  double peak = 0;
  int top = -1;
  for (const auto& mc : t.memory)
    if (mc.peak() > peak) peak = mc.peak(), top = mc.rank;
  ImGui::Text("peak %s on rank %d%s", bytes_str(peak).c_str(), top,
              t.plan_peak_rank >= 0 ? fmt::format(" (plan: {} on rank {})",
                                                  bytes_str(t.plan_peak_bytes), t.plan_peak_rank)
                                          .c_str()
                                    : "");
  const ImVec2 o = ImGui::GetCursorScreenPos();
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  ImGui::InvisibleButton("##memory", ImVec2(avail.x, std::max(40.0f, avail.y)));
  const bool hovered = ImGui::IsItemHovered();
  const Rect p{o.x + 64, o.y + 4, o.x + avail.x - 8, o.y + std::max(40.0f, avail.y) - 18};
  dl->AddRectFilled(o, ImVec2(o.x + avail.x, o.y + std::max(40.0f, avail.y)),
                    IM_COL32(20, 21, 25, 255));
  if (t.memory.empty() || peak <= 0) return;
  const bool oom = t.capacity_bytes > 0 && peak > t.capacity_bytes;
  double y_max = peak * 1.3;  // headroom for the legend
  if (t.capacity_bytes > 0 && t.capacity_bytes < y_max * 1.5)
    y_max = std::max(y_max, t.capacity_bytes * 1.05);
  const double T = std::max(1e-12, t.t_end - t.t_begin);
  const double t0 = t.t_begin + ui.view_begin * T, t1 = t.t_begin + ui.view_end * T;
  auto px = [&](double tt) {
    return p.x0 + static_cast<float>((tt - t0) / (t1 - t0)) * (p.x1 - p.x0);
  };
  auto py = [&](double b) { return p.y1 - static_cast<float>(b / y_max) * (p.y1 - p.y0); };
  dl->AddRect(ImVec2(p.x0, p.y0), ImVec2(p.x1, p.y1), IM_COL32(70, 70, 80, 255));
  for (int i = 0; i <= 4; ++i) {
    const double b = y_max * i / 4;
    dl->AddText(ImVec2(o.x + 2, py(b) - 7), IM_COL32(160, 160, 160, 255), bytes_str(b).c_str());
  }
  DrawnMemory dm;
  dm.plot = p;
  dm.y_max = y_max;
  dm.highest_rank = top;
  dl->PushClipRect(ImVec2(p.x0, p.y0), ImVec2(p.x1 + 1, p.y1 + 1), true);
  // Lower curves first so the highest ends on top where curves share pixels.
  std::vector<const MemoryCurve*> curves;
  for (const auto& mc : t.memory) curves.push_back(&mc);
  std::stable_sort(curves.begin(), curves.end(), [](const MemoryCurve* a, const MemoryCurve* b) {
    // Equal curves (one stage's ranks): its first rank last, in the legend's colour.
    return a->peak() < b->peak() || (a->peak() == b->peak() && a->rank > b->rank);
  });
  for (const MemoryCurve* mc : curves) {
    std::vector<ImVec2> pts;
    for (size_t i = 0; i < mc->points.size(); ++i) {
      const MemoryPoint& m = mc->points[i];
      if (i > 0) pts.emplace_back(px(m.t), pts.back().y);
      pts.emplace_back(px(m.t), py(m.total()));
    }
    dl->AddPolyline(pts.data(), static_cast<int>(pts.size()), col(rank_colour(mc->rank)), 0, 2.0f);
    dm.ranks.push_back(mc->rank);
  }
  if (t.capacity_bytes > 0 && t.capacity_bytes <= y_max) {
    dl->AddLine(ImVec2(p.x0, py(t.capacity_bytes)), ImVec2(p.x1, py(t.capacity_bytes)),
                col(kCapacityColour), 1.5f);
    dl->AddText(ImVec2(p.x0 + 4, py(t.capacity_bytes) - 15), col(kCapacityColour),
                oom ? "capacity: OUT OF MEMORY" : "capacity");
  }
  dl->PopClipRect();
  if (t.capacity_bytes > y_max)
    dl->AddText(ImVec2(p.x1 - 220, p.y1 - 16), IM_COL32(160, 160, 160, 255),
                fmt::format("capacity {} (off scale)", bytes_str(t.capacity_bytes)).c_str());
  // Legend: every rank, or with many ranks the first rank of each stage (a stage's ranks share
  // their curve in the replay).
  std::vector<const MemoryCurve*> legend;
  for (const auto& mc : t.memory)
    if (t.memory.size() <= 8 ||
        std::none_of(legend.begin(), legend.end(),
                     [&](const MemoryCurve* l) { return l->stage == mc.stage; }))
      legend.push_back(&mc);
  legend.resize(std::min<size_t>(legend.size(), 8));
  dm.legend = Rect{p.x0, p.y0, p.x0 + 170, p.y0 + 4 + 14 * static_cast<float>(legend.size())};
  float ly = p.y0 + 4;
  for (const MemoryCurve* mc : legend) {
    dl->AddText(ImVec2(p.x0 + 6, ly), col(rank_colour(mc->rank)),
                fmt::format("r{} s{} {}{}", mc->rank, mc->stage, bytes_str(mc->peak()),
                            t.memory.size() > 8 ? " (stage)" : "")
                    .c_str());
    ly += 14;
  }
  // Breakdown at the cursor: the curve nearest the mouse.
  ImGuiIO& io = ImGui::GetIO();
  if (hovered && io.MousePos.x >= p.x0 && io.MousePos.x <= p.x1) {
    const double tm = t0 + (io.MousePos.x - p.x0) / (p.x1 - p.x0) * (t1 - t0);
    const MemoryCurve* best = nullptr;
    const MemoryPoint* bp = nullptr;
    float bd = 1e30f;
    for (const auto& mc : t.memory)
      if (const MemoryPoint* m = mc.at(tm)) {
        const float d = std::abs(py(m->total()) - io.MousePos.y);
        if (d < bd) bd = d, best = &mc, bp = m;
      }
    dl->AddLine(ImVec2(io.MousePos.x, p.y0), ImVec2(io.MousePos.x, p.y1),
                IM_COL32(200, 200, 200, 120));
    if (best) {
      ImGui::BeginTooltip();
      ImGui::Text("rank %d (stage %d) at %s: %s", best->rank, best->stage,
                  time_str(tm, t.time_unit).c_str(), bytes_str(bp->total()).c_str());
      if (best->breakdown) {
        ImGui::Text("parameters      %s", bytes_str(bp->parameters).c_str());
        ImGui::Text("gradients       %s", bytes_str(bp->gradients).c_str());
        ImGui::Text("optimizer state %s", bytes_str(bp->optimizer_state).c_str());
        ImGui::Text("activations     %s", bytes_str(bp->activations).c_str());
        ImGui::Text("buffers         %s", bytes_str(bp->buffers).c_str());
      } else {
        ImGui::TextUnformatted("(recorded: total in use only)");
      }
      ImGui::EndTooltip();
    }
  }
  drawn.memory = dm;
}

void curves_panel(const ExplorerModel& model, UiState& ui, Drawn& drawn) {
  ImGui::RadioButton("per step", &ui.curves_x, 0);
  ImGui::SameLine();
  ImGui::RadioButton("per epoch", &ui.curves_x, 1);
  for (size_t i = 0; i < model.runs.size(); ++i) {
    ImGui::SameLine();
    ImGui::TextColored(ImVec4(rank_colour(static_cast<int>(i)).r / 255.f,
                              rank_colour(static_cast<int>(i)).g / 255.f,
                              rank_colour(static_cast<int>(i)).b / 255.f, 1),
                       "%s", model.runs[i].label.c_str());
  }
  if (model.runs.empty()) {
    ImGui::TextDisabled("open vit_train metrics files (train.metrics_file, JSON lines)");
    return;
  }
  const char* titles[4] = {"loss", "accuracy", "learning rate", "images / s"};
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const ImVec2 size(avail.x / 2 - 4, avail.y / 2 - 4);
  for (int k = 0; k < 4; ++k) {
    std::vector<Series> ss;
    for (size_t i = 0; i < model.runs.size(); ++i) {
      const MetricsRun& r = model.runs[i];
      Series s{r.label, rank_colour(static_cast<int>(i)), {}};
      for (const MetricsRow& row : ui.curves_x == 0 ? r.steps : r.epochs) {
        const double x =
            ui.curves_x == 0 ? static_cast<double>(row.step) : static_cast<double>(row.epoch);
        const double v = k == 0   ? row.loss
                         : k == 1 ? row.accuracy
                         : k == 2 ? row.lr
                                  : row.img_per_s;
        s.xy.emplace_back(x, v);
      }
      if (!s.xy.empty()) ++drawn.curves_plotted;
      ss.push_back(std::move(s));
    }
    line_plot(fmt::format("{} per {}", titles[k], ui.curves_x == 0 ? "step" : "epoch").c_str(), ss,
              size);
    if (k % 2 == 0) ImGui::SameLine();
  }
}

bool draw_explorer(ExplorerModel& model, UiState& ui, Drawn& drawn, float width, float height) {
  drawn.clear();
  constexpr ImGuiWindowFlags kFixed = ImGuiWindowFlags_NoMove | ImGuiWindowFlags_NoResize |
                                      ImGuiWindowFlags_NoCollapse |
                                      ImGuiWindowFlags_NoSavedSettings;
  const float left = std::min(340.0f, width * 0.3f);
  ImGui::SetNextWindowPos(ImVec2(0, 0));
  ImGui::SetNextWindowSize(ImVec2(left, height));
  bool changed = false;
  if (ImGui::Begin("knobs", nullptr, kFixed)) {
    changed = knobs_panel(model, ui, drawn);
    errors_panel(model);
  }
  ImGui::End();
  const float rw = width - left;
  auto window = [&](const char* title, float x, float y, float w, float h, auto&& body) {
    ImGui::SetNextWindowPos(ImVec2(x, y));
    ImGui::SetNextWindowSize(ImVec2(w, h));
    if (ImGui::Begin(title, nullptr, kFixed | ImGuiWindowFlags_NoScrollbar)) body();
    ImGui::End();
  };
  auto timeline = [&] { timeline_panel(model, ui, drawn); };
  auto memory = [&] { memory_panel(model, ui, drawn); };
  auto curves = [&] { curves_panel(model, ui, drawn); };
  switch (ui.layout) {
    case Layout::All:
      window("timeline", left, 0, rw, height * 0.55f, timeline);
      window("memory", left, height * 0.55f, rw / 2, height * 0.45f, memory);
      window("training curves", left + rw / 2, height * 0.55f, rw / 2, height * 0.45f, curves);
      break;
    case Layout::Timeline:
      window("timeline", left, 0, rw, height, timeline);
      break;
    case Layout::Memory:
      window("memory", left, 0, rw, height, memory);
      break;
    case Layout::Curves:
      window("training curves", left, 0, rw, height, curves);
      break;
  }
  return changed;
}

}  // namespace cai::gui
