#include "app.h"

#define GL_GLEXT_PROTOTYPES
#include <GL/gl.h>
#include <GL/glext.h>
#include <GLFW/glfw3.h>
#include <backends/imgui_impl_glfw.h>
#include <backends/imgui_impl_opengl3.h>
#include <imgui.h>
#include <stb_image_write.h>  // implementation inside Debian's libstb

#include <chrono>

#include "cai/core/error.h"

namespace cai::gui {

GuiApp::GuiApp(const AppOptions& opt) : opt_(opt), width_(opt.width), height_(opt.height) {
  CAI_CHECK(opt.width >= 200 && opt.height >= 150, "[gui] window {}x{} is too small (>= 200x150)",
            opt.width, opt.height);
  if (glfwInit() != GLFW_TRUE) {
    const char* why = nullptr;
    glfwGetError(&why);
    fail(
        "[gui] cannot initialise GLFW: {} (no display? run under xvfb-run -a -s \"-screen 0 "
        "1280x800x24\")",
        why ? why : "no reason given");
  }
  glfw_ready_ = true;
  glfwWindowHint(GLFW_CONTEXT_VERSION_MAJOR, 3);
  glfwWindowHint(GLFW_CONTEXT_VERSION_MINOR, 3);
  glfwWindowHint(GLFW_OPENGL_PROFILE, GLFW_OPENGL_CORE_PROFILE);
  glfwWindowHint(GLFW_OPENGL_FORWARD_COMPAT, GLFW_TRUE);
  glfwWindowHint(GLFW_VISIBLE, opt.headless ? GLFW_FALSE : GLFW_TRUE);
  window_ = glfwCreateWindow(opt.width, opt.height, "colossalai-gui: schedule explorer", nullptr,
                             nullptr);
  if (!window_) {
    glfwTerminate();
    glfw_ready_ = false;
    fail("[gui] cannot create a {}x{} OpenGL 3.3 window", opt.width, opt.height);
  }
  glfwMakeContextCurrent(window_);
  glfwSwapInterval(opt.headless ? 0 : 1);
  IMGUI_CHECKVERSION();
  imgui_ = ImGui::CreateContext();
  ImGui::SetCurrentContext(imgui_);
  ImGuiIO& io = ImGui::GetIO();
  io.IniFilename = nullptr;  // no imgui.ini: the layout is fixed
  ImGui::StyleColorsDark();
  ImGui_ImplGlfw_InitForOpenGL(window_, /*install_callbacks=*/true);
  ImGui_ImplOpenGL3_Init("#version 330");
  backends_ready_ = true;
  if (opt.headless) {
    // Offscreen target: the invisible window's own framebuffer has no defined contents.
    glGenFramebuffers(1, &fbo_);
    glGenRenderbuffers(1, &colour_);
    glBindRenderbuffer(GL_RENDERBUFFER, colour_);
    glRenderbufferStorage(GL_RENDERBUFFER, GL_RGBA8, width_, height_);
    glBindFramebuffer(GL_FRAMEBUFFER, fbo_);
    glFramebufferRenderbuffer(GL_FRAMEBUFFER, GL_COLOR_ATTACHMENT0, GL_RENDERBUFFER, colour_);
    CAI_CHECK(glCheckFramebufferStatus(GL_FRAMEBUFFER) == GL_FRAMEBUFFER_COMPLETE,
              "[gui] offscreen framebuffer {}x{} is incomplete", width_, height_);
  }
}

GuiApp::~GuiApp() {
  if (fbo_) glDeleteFramebuffers(1, &fbo_);
  if (colour_) glDeleteRenderbuffers(1, &colour_);
  if (backends_ready_) {
    ImGui_ImplOpenGL3_Shutdown();
    ImGui_ImplGlfw_Shutdown();
  }
  if (imgui_) ImGui::DestroyContext(imgui_);
  if (window_) glfwDestroyWindow(window_);
  if (glfw_ready_) glfwTerminate();
}

bool GuiApp::should_close() const {
  return glfwWindowShouldClose(window_);
}

double GuiApp::frame(ExplorerModel& model, UiState& ui, const ScriptedInput* input) {
  const auto t0 = std::chrono::steady_clock::now();
  ImGui::SetCurrentContext(imgui_);
  glfwPollEvents();
  if (!opt_.headless) glfwGetFramebufferSize(window_, &width_, &height_);
  ImGui_ImplOpenGL3_NewFrame();
  ImGui_ImplGlfw_NewFrame();
  ImGuiIO& io = ImGui::GetIO();
  if (opt_.headless) {
    io.DisplaySize = ImVec2(static_cast<float>(width_), static_cast<float>(height_));
    io.DisplayFramebufferScale = ImVec2(1, 1);
  }
  if (input) {
    io.MousePos = input->x < 0 ? ImVec2(-FLT_MAX, -FLT_MAX) : ImVec2(input->x, input->y);
    for (bool& d : io.MouseDown) d = false;
    io.MouseDown[0] = input->left_down;
    io.MouseWheel = input->wheel;
  } else if (opt_.headless) {
    io.MousePos = ImVec2(-FLT_MAX, -FLT_MAX);
    for (bool& d : io.MouseDown) d = false;
  }
  ImGui::NewFrame();
  if (draw_explorer(model, ui, drawn_, io.DisplaySize.x, io.DisplaySize.y)) model.recompute();
  ImGui::Render();
  if (fbo_) glBindFramebuffer(GL_FRAMEBUFFER, fbo_);
  glViewport(0, 0, width_, height_);
  glClearColor(0.08f, 0.08f, 0.09f, 1.0f);
  glClear(GL_COLOR_BUFFER_BIT);
  ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());
  if (opt_.headless) {
    glFinish();
  } else {
    glfwSwapBuffers(window_);
  }
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

Image GuiApp::capture() const {
  Image img;
  img.width = width_;
  img.height = height_;
  img.rgba.resize(static_cast<size_t>(width_) * height_ * 4);
  if (fbo_) {
    glBindFramebuffer(GL_READ_FRAMEBUFFER, fbo_);
    glReadBuffer(GL_COLOR_ATTACHMENT0);
  } else {
    glReadBuffer(GL_FRONT);
  }
  glPixelStorei(GL_PACK_ALIGNMENT, 1);
  std::vector<uint8_t> raw(img.rgba.size());
  glReadPixels(0, 0, width_, height_, GL_RGBA, GL_UNSIGNED_BYTE, raw.data());
  const size_t row = static_cast<size_t>(width_) * 4;
  for (int y = 0; y < height_; ++y)  // OpenGL's rows start at the bottom
    std::copy_n(raw.data() + (height_ - 1 - y) * row, row, img.rgba.data() + y * row);
  for (size_t i = 3; i < img.rgba.size(); i += 4) img.rgba[i] = 255;
  return img;
}

void GuiApp::write_png(const std::string& path) const {
  const Image img = capture();
  CAI_CHECK(
      stbi_write_png(path.c_str(), img.width, img.height, 4, img.rgba.data(), img.width * 4) != 0,
      "[gui] cannot write {}", path);
}

}  // namespace cai::gui
