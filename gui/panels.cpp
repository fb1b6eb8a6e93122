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
