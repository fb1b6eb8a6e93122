// colossalai-gui: the schedule explorer. Interactive by default; --screenshot renders headless
// (under Xvfb) and writes a PNG. Errors in files are shown in the window and, headless, printed
// on stderr; only bad command lines and a missing display end the program.
#include <CLI/CLI.hpp>

#include <iostream>

#include "app.h"
#include "cai/core/error.h"

int main(int argc, char** argv) {
  CLI::App cli{"colossalai-gui: pipeline schedules, bubbles and memory per rank"};
  std::string screenshot, config, trace, schedule, layout = "all", cluster, calibration, source,
                                                   trace_view = "beside";
  std::vector<std::string> overrides, metrics, ab;
  int frames = 3, pp = 0, microbatches = 0, chunks = 0, depth = 0, gpus = 0, width = 1280,
      height = 800;
  bool bench = false;
  cli.add_option("--screenshot", screenshot, "Render headless and write this PNG");
  cli.add_option("-c,--config", config, "vit_train TOML config for the knobs");
  cli.add_option("--set", overrides, "Override a config key: section.key=value (repeatable)");
  cli.add_option("--trace", trace, "Chrome trace written by vit_train --trace");
  cli.add_option("--trace-view", trace_view, "The trace beside the simulation, over it, or hidden")
      ->check(CLI::IsMember({"beside", "over", "hidden"}));
  cli.add_option("--source", source,
                 "Timeline source: simulator (SimGrid; the default when built with it) or replay "
                 "(the schedule with ideal costs)")
      ->check(CLI::IsMember({"simulator", "replay"}));
  cli.add_option("--cluster", cluster,
                 "Cluster file for the simulator (default: the smallest shipped one that fits)");
  cli.add_option("--calibration", calibration, "Calibration profile for the simulator (JSON)");
  cli.add_option("--ab", ab,
                 "A/B: pin the layout the other options give as A, then apply these overrides "
                 "(section.key=value, repeatable) for B");
  cli.add_option("--metrics", metrics, "vit_train metrics files (JSON lines), overlaid")
      ->expected(1, -1);
  cli.add_option("--frames", frames, "Frames rendered before the screenshot")
      ->check(CLI::Range(1, 10000));
  cli.add_option("--pp", pp, "Pipeline stages")->check(CLI::Range(1, 4096));
  cli.add_option("--schedule", schedule, "gpipe | 1f1b | interleaved | zbh1 | zbv")
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved", "zbh1", "zbv"}));
  cli.add_option("--microbatches", microbatches, "Micro-batches per step")
      ->check(CLI::Range(1, 1 << 20));
  cli.add_option("--chunks", chunks, "Model chunks per rank (interleaved; zbv: 2, its default)")
      ->check(CLI::Range(1, 64));
  cli.add_option("--depth", depth, "Transformer blocks")->check(CLI::Range(1, 4096));
  cli.add_option("--gpus", gpus, "GPUs (data parallel = GPUs / (pipeline x tensor))")
      ->check(CLI::Range(1, 1 << 16));
  cli.add_option("--layout", layout, "Panels shown: all | timeline | memory | curves")
      ->check(CLI::IsMember({"all", "timeline", "memory", "curves"}));
  cli.add_option("--width", width, "Window width")->check(CLI::Range(200, 8192));
  cli.add_option("--height", height, "Window height")->check(CLI::Range(150, 8192));
  cli.add_flag("--bench-frames", bench, "Headless: print the mean frame time of --frames frames");
  CLI11_PARSE(cli, argc, argv);

  using namespace cai::gui;
  ExplorerModel model;
  UiState ui;
  ui.layout = layout == "timeline" ? Layout::Timeline
              : layout == "memory" ? Layout::Memory
              : layout == "curves" ? Layout::Curves
                                   : Layout::All;
  if (!config.empty()) {
    model.load_config(config, overrides);
    ui.config_path_input = config;
  } else {
    model.apply_overrides(overrides);
  }
  auto& c = model.knobs.config;
  if (pp) c.pipeline = pp;
  if (!schedule.empty()) c.pp_style = schedule;
  if (schedule == "interleaved" && !chunks && c.num_model_chunks < 2) c.num_model_chunks = 2;
  if (schedule == "zbv" && !chunks) c.num_model_chunks = 2;
  if (chunks) c.num_model_chunks = chunks;
  if (microbatches) c.num_microbatches = microbatches, c.microbatch_size = 0;
  if (depth) c.depth = depth, c.explicitly_set.insert("model.depth");
  if (gpus) model.knobs.world = gpus;
  if (!source.empty()) model.knobs.source = source == "replay" ? Source::Replay : Source::Simulator;
  model.knobs.cluster = cluster;
  model.knobs.calibration = calibration;
  ui.cluster_path_input = cluster;
  ui.calibration_path_input = calibration;
  ui.trace_view = trace_view == "over"     ? TraceView::Over
                  : trace_view == "hidden" ? TraceView::Hidden
                                           : TraceView::Beside;
  model.recompute();
  if (!ab.empty()) {
    if (!model.pin())
      std::cerr << "colossalai-gui: --ab: layout A is invalid: " << model.knob_error << "\n";
    model.apply_overrides(ab);
  }
  if (!trace.empty()) {
    model.open_trace(trace);
    ui.trace_path_input = trace;
  }
  for (const auto& m : metrics) model.open_metrics(m);
  // The knobs show the layout the (last) run really had, unless the command line set one.
  if (!model.runs.empty() && model.runs.back().layout && !gpus && !pp)
    model.adopt_run_layout(model.runs.size() - 1);
  if (!metrics.empty()) ui.metrics_path_input = metrics.back();

  const bool headless = !screenshot.empty();
  try {
    GuiApp app(AppOptions{width, height, headless});
    if (headless) {
      double total = 0;
      for (int i = 0; i < frames; ++i) total += app.frame(model, ui);
      for (const auto& e : model.take_new_errors()) std::cerr << "colossalai-gui: " << e << "\n";
      if (!model.knob_error.empty())
        std::cerr << "colossalai-gui: invalid knobs: " << model.knob_error << "\n";
      app.write_png(screenshot);
      if (bench) std::cout << "mean frame time: " << total / frames << " ms\n";
      if (!app.drawn().comparison.empty()) std::cout << app.drawn().comparison << "\n";
      std::cout << "wrote " << screenshot << " (" << app.width() << "x" << app.height() << ", "
                << model.current.source << ", made in " << model.current.compute_ms << " ms)\n";
      return 0;
    }
    while (!app.should_close()) {
      app.frame(model, ui);
      for (const auto& e : model.take_new_errors()) std::cerr << "colossalai-gui: " << e << "\n";
    }
  } catch (const cai::Error& e) {
    std::cerr << "colossalai-gui: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
