// The explorer's memory and curves panels: per-rank memory over the step and the per-step /
// per-epoch line plots (panels.h's memory_panel and curves_panel).
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
  // Each run's layout as it really ran (its "run" record).
  for (size_t i = 0; i < model.runs.size(); ++i) {
    const MetricsRun& r = model.runs[i];
    if (!r.layout) continue;
    const Rgb c = rank_colour(static_cast<int>(i));
    ImGui::TextColored(ImVec4(c.r / 255.f, c.g / 255.f, c.b / 255.f, 1), "%s: %s", r.label.c_str(),
                       r.layout->describe().c_str());
    ++drawn.curves_layouts;
  }
  // The test accuracy curves' colours (one per run with an evaluation).
  bool first = true;
  for (size_t i = 0; i < model.runs.size(); ++i) {
    const MetricsRun& r = model.runs[i];
    if (std::none_of(r.epochs.begin(), r.epochs.end(),
                     [](const MetricsRow& e) { return e.test_accuracy >= 0; }))
      continue;
    const Rgb c = rank_colour(static_cast<int>(model.runs.size() + i));
    if (!first) ImGui::SameLine();
    first = false;
    ImGui::TextColored(ImVec4(c.r / 255.f, c.g / 255.f, c.b / 255.f, 1), "%s: test accuracy",
                       r.label.c_str());
  }
  const char* titles[4] = {"loss", "accuracy (train; test per epoch)", "learning rate",
                           "images / s"};
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
      if (k == 1) {  // the test accuracy after each epoch, at the epoch's last step
        Series t{r.label + " test", rank_colour(static_cast<int>(model.runs.size() + i)), {}};
        for (const MetricsRow& e : r.epochs)
          if (e.test_accuracy >= 0)
            t.xy.emplace_back(
                ui.curves_x == 0 ? static_cast<double>(e.step) : static_cast<double>(e.epoch),
                e.test_accuracy);
        if (!t.xy.empty()) {
          ++drawn.curves_plotted;
          ++drawn.test_accuracy_curves;
          ss.push_back(std::move(t));
        }
      }
    }
    line_plot(fmt::format("{} per {}", titles[k], ui.curves_x == 0 ? "step" : "epoch").c_str(), ss,
              size);
    if (k % 2 == 0) ImGui::SameLine();
  }
}

}  // namespace cai::gui
