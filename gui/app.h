// The window: GLFW, the OpenGL 3 context and the Dear ImGui context in one object (no other
// globals). Headless (Xvfb) it renders into an offscreen framebuffer that capture() reads back.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "panels.h"

struct GLFWwindow;
struct ImGuiContext;

namespace cai::gui {

struct AppOptions {
  int width = 1280, height = 800;
  bool headless = false;  // invisible window, offscreen framebuffer
};

// Input injected through ImGui's own IO for one frame (tests, scripted demos): replaces what
// the GLFW backend read from the (invisible) window.
struct ScriptedInput {
  float x = -1, y = -1;  // mouse position in pixels; < 0: outside the window
  bool left_down = false;
  float wheel = 0;
};

struct Image {
  int width = 0, height = 0;
  std::vector<uint8_t> rgba;  // top row first
  Rgb at(int x, int y) const {
    const size_t i = (static_cast<size_t>(y) * width + x) * 4;
    return Rgb{rgba[i], rgba[i + 1], rgba[i + 2]};
  }
};

class GuiApp {
 public:
  explicit GuiApp(const AppOptions& opt);  // throws cai::Error "[gui] ..." (no display, no GL 3.3)
  ~GuiApp();
  GuiApp(const GuiApp&) = delete;
  GuiApp& operator=(const GuiApp&) = delete;

  bool should_close() const;
  // One frame: events, the panels over the model (recomputing it when a knob changed), render.
  // Returns the frame's CPU+GPU time in milliseconds (glFinish included).
  double frame(ExplorerModel& model, UiState& ui, const ScriptedInput* input = nullptr);
  Image capture() const;                          // the last frame's pixels
  void write_png(const std::string& path) const;  // throws "[gui] cannot write <path>"
  const Drawn& drawn() const { return drawn_; }
  int width() const { return width_; }
  int height() const { return height_; }

 private:
  AppOptions opt_;
  GLFWwindow* window_ = nullptr;
  ImGuiContext* imgui_ = nullptr;
  unsigned fbo_ = 0, colour_ = 0;
  int width_ = 0, height_ = 0;
  Drawn drawn_;
  bool glfw_ready_ = false, backends_ready_ = false;
};

}  // namespace cai::gui
