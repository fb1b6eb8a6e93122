// Shared by the explorer's tests: models of pipeline layouts, pixels of an offscreen frame read
// back by colour, and scripted clicks through ImGui's IO.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "app.h"
#include "cai/core/error.h"
#include "explorer_model.h"

namespace cai::gui::testing {

// p stages × m micro-batches of `style` (the tiny default ViT with 8 blocks) from `source`.
inline ExplorerModel pipeline_model(int p, int m, const std::string& style, int chunks = 1,
                                    Source source = Source::Replay) {
  ExplorerModel model;
  model.knobs.source = source;
  auto& c = model.knobs.config;
  c.pipeline = p;
  c.num_microbatches = m;
  c.pp_style = style;
  c.num_model_chunks = chunks;
  c.depth = 8;
  EXPECT_TRUE(model.recompute()) << model.knob_error;
  return model;
}

inline std::string temp_file(const std::string& name, const std::string& text) {
  const std::filesystem::path p = std::filesystem::temp_directory_path() / ("cai_gui_" + name);
  std::ofstream(p) << text;
  return p.string();
}

inline bool near(Rgb a, Rgb b, int tol) {
  return std::abs(a.r - b.r) <= tol && std::abs(a.g - b.g) <= tol && std::abs(a.b - b.b) <= tol;
}

// Pixels of the step on the row's centre line (lane 0, the rank's program).
template <typename Pred>
double row_share(const Image& img, const DrawnTimeline& t, const DrawnRow& row, Pred pred) {
  const int y = static_cast<int>((row.y0 + row.y1) / 2);
  const int x0 = static_cast<int>(std::lround(t.step_x0)),
            x1 = static_cast<int>(std::lround(t.step_x1));
  int n = 0;
  for (int x = x0; x < x1; ++x) n += pred(img.at(x, y));
  return static_cast<double>(n) / std::max(1, x1 - x0);
}

// Share painted in the idle (bubble) colour.
inline double idle_share(const Image& img, const DrawnTimeline& t, const DrawnRow& row) {
  return row_share(img, t, row, [](Rgb c) { return near(c, kIdleColour, 2); });
}

// Share not spent in forward/backward: idle, or a span of another category (optimizer, load,
// reduce, communication) — the simulator's and the executor's bubble, 1 - compute / step.
inline bool is_shade_of(Rgb c, Category cat) {
  for (int mb = 0; mb < 4; ++mb)
    if (near(c, category_colour(cat, mb), 2)) return true;
  return false;
}
inline double non_compute_share(const Image& img, const DrawnTimeline& t, const DrawnRow& row) {
  return row_share(img, t, row, [](Rgb c) {
    return near(c, kIdleColour, 2) || is_shade_of(c, Category::Optimizer) ||
           is_shade_of(c, Category::Load) || is_shade_of(c, Category::Reduce) ||
           is_shade_of(c, Category::Comm);
  });
}

inline double mean_idle_share(const Image& img, const DrawnTimeline& t) {
  double s = 0;
  for (const auto& r : t.rows) s += idle_share(img, t, r);
  return s / static_cast<double>(t.rows.size());
}

inline std::unique_ptr<GuiApp> make_app(int w = 1280, int h = 800) {
  try {
    return std::make_unique<GuiApp>(AppOptions{w, h, true});
  } catch (const cai::Error& e) {
    std::fprintf(stderr, "[explorer] no window: %s\n", e.what());
    return nullptr;
  }
}

// Skips without a display; under tests/gui/xvfb.sh (CAI_GUI_REQUIRE_DISPLAY set) a window that
// cannot be made fails the test.
#define REQUIRE_APP(app)                                                 \
  auto app = make_app();                                                 \
  if (!app && std::getenv("CAI_GUI_REQUIRE_DISPLAY"))                    \
    FAIL() << "no window although tests/gui/xvfb.sh provides a display"; \
  if (!app) GTEST_SKIP() << "no display/OpenGL 3.3 (run under tests/gui/xvfb.sh)"

inline void render(GuiApp& app, ExplorerModel& model, UiState& ui, int frames = 3) {
  for (int i = 0; i < frames; ++i) app.frame(model, ui);
}

// Press and release the left button on the centre of a recorded widget.
inline void click(GuiApp& app, ExplorerModel& model, UiState& ui, const std::string& widget) {
  const auto it = app.drawn().widgets.find(widget);
  ASSERT_NE(it, app.drawn().widgets.end()) << "widget " << widget << " was not drawn";
  const Rect r = it->second;
  ScriptedInput in{r.cx(), r.cy(), false};
  app.frame(model, ui, &in);
  in.left_down = true;
  app.frame(model, ui, &in);
  in.left_down = false;
  app.frame(model, ui, &in);
  ScriptedInput away{-1, -1, false};
  app.frame(model, ui, &away);
}

// The rank whose colour the topmost curve pixel of the memory plot has (the legend aside).
inline int topmost_curve_rank(const Image& img, const DrawnMemory& dm, int* found_y = nullptr) {
  for (int y = static_cast<int>(dm.plot.y0) + 1; y < static_cast<int>(dm.plot.y1); ++y)
    for (int x = static_cast<int>(dm.plot.x0) + 1; x < static_cast<int>(dm.plot.x1) - 1; ++x) {
      if (x < dm.legend.x1 && y < dm.legend.y1) continue;
      for (int r : dm.ranks)
        if (near(img.at(x, y), rank_colour(r), 6)) {
          if (found_y) *found_y = y;
          return r;
        }
    }
  return -1;
}

}  // namespace cai::gui::testing
