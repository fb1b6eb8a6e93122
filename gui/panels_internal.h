// Helpers that the explorer's panels (panels.cpp, panels_timeline.cpp, panels_memory.cpp)
// share; not part of panels.h's interface.
#pragma once
#include <fmt/format.h>
#include <imgui.h>

#include <cmath>
#include <string>

#include "panels.h"

namespace cai::gui::detail {

inline ImU32 col(Rgb c, int alpha = 255) {
  return IM_COL32(c.r, c.g, c.b, alpha);
}

inline std::string bytes_str(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::abs(b) >= 1024 && u < 4) b /= 1024, ++u;
  return fmt::format("{:.{}f} {}", b, u == 0 ? 0 : 2, units[u]);
}

inline std::string time_str(double t, const std::string& unit) {
  return fmt::format("{:.4g} {}", t, unit);
}

inline Rect item_rect() {
  const ImVec2 a = ImGui::GetItemRectMin(), b = ImGui::GetItemRectMax();
  return Rect{a.x, a.y, b.x, b.y};
}

}  // namespace cai::gui::detail
