// The explorer with the SimGrid simulator as its source (builds with SimGrid): the timeline is
// colossalai-sim's replay of the config (the same functions, compared here figure by figure),
// the drawn rows' idle shares are the simulated bubbles, the highest memory curve is on the rank
// the plan predicts, knobs clicked through ImGui's IO re-simulate, A/B comparison and a recorded
// trace over the simulation; printed: re-simulation and frame times.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <chrono>
#include <cstdio>

#include "cai/core/trace.h"
#include "from_config.h"
#include "helpers.h"
#include "replay.h"
#include "sim_source.h"

using namespace cai::gui;
using namespace cai::gui::testing;
namespace fs = std::filesystem;

namespace {

// A ViT-B-wide model with 8 blocks on 4 GPUs (train.device = cuda: the explorer picks the
// smallest GPU cluster that holds them), batch 64 in bf16: compute dominates the step, so the
// bubble is the schedule's shape plus what the cluster adds.
ExplorerModel sim_model(int p, int m, const std::string& style, int chunks = 1) {
  ExplorerModel model;
  EXPECT_EQ(model.knobs.source, Source::Simulator);
  auto& c = model.knobs.config;
  c.device = "cuda";
  c.precision = "bf16";
  c.batch_size = 64;
  c.depth = 8;
  c.hidden_size = 768;
  c.num_heads = 12;
  c.img_size = 224;
  c.patch_size = 16;
  c.mlp_ratio = 4;
  c.pipeline = p;
  c.num_microbatches = m;
  c.pp_style = style;
  c.num_model_chunks = chunks;
  EXPECT_TRUE(model.recompute()) << model.knob_error;
  return model;
}

const DrawnTimeline& timeline(const GuiApp& app, const std::string& role = "") {
  for (const DrawnTimeline& t : app.drawn().timelines)
    if (t.role == role) return t;
  ADD_FAILURE() << "no timeline with role '" << role << "' was drawn";
  return app.drawn().timelines.at(0);
}

// The seeds' 64-GPU layout: ViT hidden 4096, depth 32, 32 heads, 224/16, pp 4 × tp 4 (1d) × dp 4,
// 16 micro-batches of a batch of 256 per replica.
ExplorerModel seeds64(const std::string& style) {
  ExplorerModel model;
  auto& c = model.knobs.config;
  c.device = "cuda";
  c.precision = "bf16";
  c.hidden_size = 4096;
  c.depth = 32;
  c.num_heads = 32;
  c.img_size = 224;
  c.patch_size = 16;
  c.batch_size = 256;
  c.tensor_mode = "1d";
  c.tensor_size = 4;
  c.pipeline = 4;
  c.num_microbatches = 16;
  c.pp_style = style;
  c.num_model_chunks = style == "interleaved" ? 2 : 1;
  c.checkpoint = true;
  model.knobs.world = 64;
  return model;
}

}  // namespace

// --- the model, headless --------------------------------------------------------------------

TEST(SimSource, IsTheDefaultAndIsColossalaiSimsReplay) {
  ASSERT_TRUE(simulator_available());
  ExplorerModel m = sim_model(4, 8, "1f1b");
  const Timeline& t = m.current;
  EXPECT_EQ(t.source, "simulator (SimGrid)");
  EXPECT_EQ(t.time_unit, "ms");
  // The smallest shipped GPU cluster of 4 ranks, the first by name: h100-4 (then h200-4).
  EXPECT_EQ(fs::path(m.cluster_in_use).filename(), "h100-4.toml");
  EXPECT_NE(t.detail.find("h100-4"), std::string::npos) << t.detail;
  // The same step through the simulator library directly (colossalai-sim --config's path).
  const cai::sim::Cluster cluster = cai::sim::load_cluster(m.cluster_in_use);
  const cai::sim::ConfigWorkload cw =
      cai::sim::workload_from_config(m.knobs.config, 4, cluster, true);
  const cai::sim::ReplayResult r = cai::sim::replay(cw.workload, cluster);
  EXPECT_NEAR(t.step(), r.step_s * 1e3, 1e-9);
  EXPECT_NEAR(t.img_per_s, r.img_per_s, 1e-6);
  ASSERT_EQ(t.bubbles.size(), 4u);
  ASSERT_EQ(t.ranks.size(), 4u);
  for (int s = 0; s < 4; ++s) {
    EXPECT_DOUBLE_EQ(t.bubbles[s].achieved, r.bubble[s]);
    EXPECT_NEAR(t.bubbles[s].ideal, 3.0 / 11.0, 1e-9);  // (p - 1) / (m + p - 1)
    // Drawn: the rank's forward/backward spans cover 1 - bubble of the step.
    EXPECT_NEAR(non_compute_fraction(t.ranks[s], t.t_begin, t.t_end), r.bubble[s], 1e-9);
  }
  // Per rank: 8 forwards and 8 backwards named as the executor names them, one OptStep.
  for (const RankTrack& rt : t.ranks) {
    int f = 0, b = 0, opt = 0;
    for (const Span& s : rt.spans) {
      if (s.lane != 0) continue;
      f += s.category == Category::Forward;
      b += s.category == Category::Backward;
      opt += s.name == "OptStep";
    }
    EXPECT_EQ(f, 8) << rt.label;
    EXPECT_EQ(b, 8) << rt.label;
    EXPECT_EQ(opt, 1) << rt.label;
    EXPECT_EQ(rt.spans.front().name, "F(mb=0,c=0)") << rt.label;
  }
  // Sends on the communication lane: stage 0 sends 8 activations, stage 3 8 gradients.
  int sends0 = 0;
  for (const Span& s : t.ranks[0].spans) sends0 += s.lane == 1 && s.name.rfind("SendAct", 0) == 0;
  EXPECT_EQ(sends0, 8);
  // Memory: the counter split by kind, adding up to the simulator's curve; the plan's peak.
  ASSERT_EQ(t.memory.size(), 4u);
  for (int k = 0; k < 4; ++k) {
    const auto& curve = r.ranks[k].memory;
    ASSERT_GE(t.memory[k].points.size(), curve.size());
    for (size_t i = 0; i < curve.size(); ++i)
      EXPECT_NEAR(t.memory[k].points[i].total(), static_cast<double>(curve[i].bytes), 0.5);
    EXPECT_NEAR(t.memory[k].peak(), static_cast<double>(r.ranks[k].peak_mem), 0.5);
    const MemoryPoint* at = t.memory[k].at(t.step() / 2);
    ASSERT_NE(at, nullptr);
    EXPECT_GT(at->parameters, 0);
    EXPECT_GT(at->optimizer_state, 0);
  }
  EXPECT_DOUBLE_EQ(t.capacity_bytes, static_cast<double>(cluster.gpu.memory_bytes));
  EXPECT_EQ(t.plan_peak_rank, 0);  // 1F1B: stage 0 keeps the most micro-batches
  EXPECT_EQ(t.peak_rank(), t.plan_peak_rank);
  std::printf(
      "[explorer] simulator p4 m8 1f1b on h100-4: step %.3f ms, bubbles %.2f %.2f %.2f "
      "%.2f%% (ideal %.2f%%), re-simulated in %.0f ms\n",
      t.step(), t.bubbles[0].achieved * 100, t.bubbles[1].achieved * 100,
      t.bubbles[2].achieved * 100, t.bubbles[3].achieved * 100, t.bubbles[0].ideal * 100,
      t.compute_ms);
}

TEST(SimSource, SeedsLayoutOn64GpusFoldsAndStaysUnderASecond) {
  for (const std::string style : {"1f1b", "interleaved"}) {
    ExplorerModel m = seeds64(style);
    ASSERT_TRUE(m.recompute()) << m.knob_error;
    const Timeline& t = m.current;
    EXPECT_EQ(fs::path(m.cluster_in_use).filename(), "dgx-h100-64.toml");
    ASSERT_EQ(t.ranks.size(), 64u);  // every rank of the job, the copies repeated
    for (int r = 0; r < 64; ++r) EXPECT_EQ(t.ranks[r].rank, r);
    EXPECT_EQ(t.ranks[17].stage, 0);  // mesh rank 17: dp 1, pp 0, tp 1
    EXPECT_EQ(t.ranks[17].label, "rank 17 (pp 0, dp 1, tp 1)");
    EXPECT_NE(t.detail.find("16 of 64 ranks simulated (4 identical data-parallel copies)"),
              std::string::npos)
        << t.detail;
    // The tensor-parallel all-reduces on the compute stream are drawn as communication: each
    // rank's forward/backward spans cover 1 - the simulated bubble of its stage.
    for (const RankTrack& rt : t.ranks)
      EXPECT_NEAR(non_compute_fraction(rt, t.t_begin, t.t_end), t.bubbles[rt.stage].achieved, 1e-6)
          << rt.label;
    // Best of three: the machine is shared.
    double best = 1e300;
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(m.recompute());
      best = std::min(best, m.current.compute_ms);
    }
    std::printf(
        "[explorer] seeds' 64-GPU layout (pp 4 x tp 4 x dp 4, %s): step %.1f ms, mean "
        "bubble %.2f%% (ideal %.2f%%), peak %.2f GiB, re-simulated in %.0f ms (best of "
        "3)\n",
        style.c_str(), t.step(), t.mean_bubble() * 100, t.bubbles[0].ideal * 100,
        t.peak_memory() / (1 << 30), best);
  }
}

TEST(SimSource, InvalidKnobsAndFilesGiveTheirText) {
  ExplorerModel m = sim_model(4, 8, "1f1b");
  m.knobs.config.zero_stage = 2;
  EXPECT_FALSE(m.recompute());
  std::string expected;
  try {
    cai::config::validate(m.knobs.config, m.knobs.world_size());
  } catch (const cai::Error& e) {
    expected = e.what();
  }
  ASSERT_FALSE(expected.empty());
  EXPECT_EQ(m.knob_error, expected);
  EXPECT_EQ(m.current.source, "simulator (SimGrid)");  // the last valid one stays
  m.knobs.config.zero_stage = 0;
  // A cluster that is too small, and a malformed one: the simulator's text naming the file.
  m.knobs.cluster = fs::path(m.cluster_in_use).parent_path() / "h200-2.toml";
  EXPECT_FALSE(m.recompute());
  EXPECT_NE(m.knob_error.find("4 processes do not fit cluster"), std::string::npos) << m.knob_error;
  const std::string bad = temp_file("bad_cluster.toml", "name = \"x\"\nnodes = \"many\"\n");
  m.knobs.cluster = bad;
  EXPECT_FALSE(m.recompute());
  EXPECT_NE(m.knob_error.find("[cluster] " + bad), std::string::npos) << m.knob_error;
  m.knobs.cluster.clear();
  m.knobs.calibration = "/nonexistent/cal.json";
  EXPECT_FALSE(m.recompute());
  EXPECT_NE(m.knob_error.find("/nonexistent/cal.json"), std::string::npos) << m.knob_error;
  m.knobs.calibration.clear();
  EXPECT_TRUE(m.recompute()) << m.knob_error;
}

TEST(SimSource, KnobsReachTheSimulation) {
  // Precision, sequence parallelism, offload, a calibration and the cluster each change what is
  // simulated.
  ExplorerModel m = sim_model(2, 4, "1f1b");
  const double base = m.current.step();
  m.knobs.config.precision = "fp32";
  ASSERT_TRUE(m.recompute()) << m.knob_error;
  EXPECT_GT(m.current.step(), base * 1.5);  // fp32's peak is a fraction of bf16's
  m.knobs.config.precision = "bf16";
  m.knobs.config.pipeline = 1;
  m.knobs.config.tensor_mode = "1d";
  m.knobs.config.tensor_size = 2;
  ASSERT_TRUE(m.recompute()) << m.knob_error;
  const double tp_peak = m.current.peak_memory();
  m.knobs.config.sequence_parallel = true;
  ASSERT_TRUE(m.recompute()) << m.knob_error;
  EXPECT_LT(m.current.peak_memory(), tp_peak);  // activations split over the sequence
  m.knobs.config.sequence_parallel = false;
  m.knobs.config.tensor_mode = "none";
  m.knobs.config.tensor_size = 1;
  m.knobs.world = 4;
  m.knobs.config.zero_stage = 1;
  ASSERT_TRUE(m.recompute()) << m.knob_error;
  const double zero_peak = m.current.peak_memory();
  m.knobs.config.cpu_offload = true;
  ASSERT_TRUE(m.recompute()) << m.knob_error;
  EXPECT_LT(m.current.peak_memory(), zero_peak);  // optimizer state on the host
  const double step = m.current.step();
  ASSERT_FALSE(m.shipped_calibrations.empty());
  m.knobs.calibration = m.shipped_calibrations.front();
  ASSERT_TRUE(m.recompute()) << m.knob_error;
  EXPECT_NE(m.current.step(), step);
  EXPECT_NE(m.current.detail.find("calibration"), std::string::npos);
}

// --- what is drawn (offscreen frame under Xvfb) ---------------------------------------------

TEST(SimScreenshot, IdleShareOfEachRowIsTheSimulatedBubble) {
  REQUIRE_APP(app);
  ExplorerModel model = sim_model(4, 8, "1f1b");
  UiState ui;
  render(*app, model, ui);
  const Image img = app->capture();
  const DrawnTimeline& t = timeline(*app);
  EXPECT_EQ(t.source, "simulator (SimGrid)");
  ASSERT_EQ(t.rows.size(), 4u);
  for (const auto& row : t.rows) {
    const double px = non_compute_share(img, t, row), idle = idle_share(img, t, row);
    const double want = model.current.bubbles[row.stage].achieved;
    std::printf(
        "[explorer] simulator 1f1b p4 m8 stage %d: idle pixels %.2f%% (+ optimizer etc. "
        "%.2f%%), simulated bubble %.2f%%, ideal %.2f%%\n",
        row.stage, idle * 100, px * 100, want * 100, model.current.bubbles[row.stage].ideal * 100);
    EXPECT_NEAR(px, want, 0.02) << "stage " << row.stage;
    EXPECT_GT(idle, 0.5 * want) << "stage " << row.stage;  // the bubble is drawn as idle
  }
  app->write_png((fs::temp_directory_path() / "cai_gui_sim_1f1b.png").string());
}

TEST(SimScreenshot, TensorParallelCommunicationIsPartOfTheDrawnBubble) {
  // pp 2 × tp 2 (1d): the tensor-parallel all-reduces on the compute stream are drawn as
  // communication inside the forwards and backwards; idle + communication pixels per row are
  // the simulated bubble.
  REQUIRE_APP(app);
  ExplorerModel model = sim_model(2, 4, "1f1b");
  model.knobs.config.tensor_mode = "1d";
  model.knobs.config.tensor_size = 2;
  ASSERT_TRUE(model.recompute()) << model.knob_error;
  UiState ui;
  render(*app, model, ui);
  const Image img = app->capture();
  const DrawnTimeline& t = timeline(*app);
  ASSERT_EQ(t.rows.size(), 4u);
  for (const auto& row : t.rows) {
    const double comm =
        row_share(img, t, row, [](Rgb c) { return is_shade_of(c, Category::Comm); });
    const double px = non_compute_share(img, t, row);
    const double want = model.current.bubbles[row.stage].achieved;
    std::printf(
        "[explorer] simulator pp2 x tp2 rank %d: communication pixels %.2f%%, idle + "
        "communication + optimizer %.2f%%, simulated bubble %.2f%%\n",
        row.rank, comm * 100, px * 100, want * 100);
    EXPECT_GT(comm, 0.01) << "rank " << row.rank;
    EXPECT_NEAR(px, want, 0.02) << "rank " << row.rank;
  }
}

TEST(SimScreenshot, InterleavedShowsLessIdleThan1F1B) {
  REQUIRE_APP(app);
  UiState ui;
  ExplorerModel a = sim_model(4, 8, "1f1b");
  render(*app, a, ui);
  const double idle_1f1b = mean_idle_share(app->capture(), timeline(*app));
  ExplorerModel b = sim_model(4, 8, "interleaved", 2);
  render(*app, b, ui);
  const Image img = app->capture();
  const double idle_il = mean_idle_share(img, timeline(*app));
  std::printf(
      "[explorer] simulator idle pixels: 1f1b %.2f%% (bubble %.2f%%), interleaved v=2 "
      "%.2f%% (bubble %.2f%%)\n",
      idle_1f1b * 100, a.current.mean_bubble() * 100, idle_il * 100, b.current.mean_bubble() * 100);
  EXPECT_LT(b.current.mean_bubble(), a.current.mean_bubble());
  EXPECT_LT(idle_il, idle_1f1b - 0.05);
  for (const auto& row : timeline(*app).rows)
    EXPECT_NEAR(non_compute_share(img, timeline(*app), row), b.current.bubbles[row.stage].achieved,
                0.02);
}

TEST(SimScreenshot, HighestMemoryCurveIsOnTheRankThePlanPredicts) {
  REQUIRE_APP(app);
  // (GPipe is left out: every stage holds every micro-batch, and the plan's peak, which counts a
  // layer's working tensors, and the simulated counter, which does not, rank the nearly equal
  // stages differently.)
  for (const std::string style : {"1f1b", "interleaved"}) {
    ExplorerModel model = sim_model(4, 8, style, style == "interleaved" ? 2 : 1);
    UiState ui;
    render(*app, model, ui);
    const Image img = app->capture();
    const DrawnMemory& dm = app->drawn().memory;
    ASSERT_EQ(dm.ranks.size(), 4u);
    int y = -1;
    const int found = topmost_curve_rank(img, dm, &y);
    std::printf(
        "[explorer] simulator %s: highest memory curve drawn: rank %d at y=%d; the plan "
        "predicts rank %d (%.1f MiB), the simulation peaks on rank %d\n",
        style.c_str(), found, y, model.current.plan_peak_rank,
        model.current.plan_peak_bytes / (1 << 20), model.current.peak_rank());
    EXPECT_GE(model.current.plan_peak_rank, 0);
    EXPECT_EQ(found, model.current.plan_peak_rank) << style;
    EXPECT_EQ(dm.highest_rank, model.current.plan_peak_rank) << style;
  }
}

// --- scripted input through ImGui's IO ------------------------------------------------------

TEST(SimInteraction, ClickedKnobsReSimulate) {
  REQUIRE_APP(app);
  ExplorerModel model = sim_model(4, 8, "1f1b");
  UiState ui;
  render(*app, model, ui);
  const double idle0 = mean_idle_share(app->capture(), timeline(*app));
  const double bubble0 = model.current.mean_bubble(), step0 = model.current.step();

  click(*app, model, ui, "schedule.interleaved");
  EXPECT_EQ(model.knobs.config.pp_style, "interleaved");
  EXPECT_EQ(model.current.schedule, "interleaved");
  EXPECT_EQ(model.current.source, "simulator (SimGrid)");
  EXPECT_LT(model.current.mean_bubble(), bubble0);
  render(*app, model, ui, 1);
  Image img = app->capture();
  const double idle1 = mean_idle_share(img, timeline(*app));
  EXPECT_LT(idle1, idle0 - 0.05);
  for (const auto& row : timeline(*app).rows)
    EXPECT_NEAR(non_compute_share(img, timeline(*app), row),
                model.current.bubbles[row.stage].achieved, 0.02);

  // 9 micro-batches: refused with the executor's text, the last simulation stays drawn.
  click(*app, model, ui, "mb.plus");
  EXPECT_NE(model.knob_error.find("multiple of the stage count (4)"), std::string::npos)
      << model.knob_error;
  EXPECT_EQ(model.current.micro_batches, 8);
  for (int i = 0; i < 3; ++i) click(*app, model, ui, "mb.plus");
  ASSERT_TRUE(model.knob_error.empty()) << model.knob_error;
  EXPECT_EQ(model.current.micro_batches, 12);
  const double bubble2 = model.current.mean_bubble();
  render(*app, model, ui, 1);
  img = app->capture();
  const double idle2 = mean_idle_share(img, timeline(*app));
  std::printf(
      "[explorer] simulator, scripted clicks: idle pixels 1f1b m8 %.2f%% -> interleaved "
      "m8 %.2f%% -> interleaved m12 %.2f%% (simulated mean bubble %.2f%% -> %.2f%%), "
      "step %.3f -> %.3f ms\n",
      idle0 * 100, idle1 * 100, idle2 * 100, bubble0 * 100, bubble2 * 100, step0,
      model.current.step());
  EXPECT_LT(idle2, idle1);
  for (const auto& row : timeline(*app).rows)
    EXPECT_NEAR(non_compute_share(img, timeline(*app), row),
                model.current.bubbles[row.stage].achieved, 0.02);

  // Precision through its radio button: bf16 -> fp32 re-simulates a slower step.
  const double step_bf16 = model.current.step();
  click(*app, model, ui, "precision.fp32");
  EXPECT_EQ(model.knobs.config.precision, "fp32");
  EXPECT_GT(model.current.step(), step_bf16 * 1.5);

  // The ideal replay is one click away, and back.
  click(*app, model, ui, "source.replay");
  EXPECT_EQ(model.current.source, "schedule replay (ideal)");
  click(*app, model, ui, "source.simulator");
  EXPECT_EQ(model.current.source, "simulator (SimGrid)");
}

TEST(SimInteraction, ABComparisonOnASharedTimeAxis) {
  REQUIRE_APP(app);
  ExplorerModel model = sim_model(4, 8, "1f1b");
  UiState ui;
  render(*app, model, ui);
  click(*app, model, ui, "pin");  // A = 1F1B
  ASSERT_TRUE(model.pinned.has_value());
  click(*app, model, ui, "schedule.gpipe");  // B = GPipe
  ASSERT_EQ(model.current.schedule, "gpipe");
  EXPECT_EQ(model.pinned->schedule, "1f1b");
  render(*app, model, ui, 1);
  const Image img = app->capture();
  ASSERT_EQ(app->drawn().timelines.size(), 2u);
  const DrawnTimeline& a = timeline(*app, "A");
  const DrawnTimeline& b = timeline(*app, "B");
  // One time axis: both plots span the same times; each step ends where its time says.
  EXPECT_DOUBLE_EQ(a.t1, b.t1);
  const double axis = std::max(model.pinned->step(), model.current.step());
  EXPECT_NEAR(a.t1, axis, 1e-9);
  for (const auto* d : {&a, &b}) {
    const Timeline& t = d == &a ? *model.pinned : model.current;
    const double x = d->plot.x0 + t.step() / axis * (d->plot.x1 - d->plot.x0);
    EXPECT_NEAR(d->step_x1, x, 1.0) << d->role;
    ASSERT_EQ(d->rows.size(), 4u);
    for (const auto& row : d->rows)
      EXPECT_NEAR(non_compute_share(img, *d, row), t.bubbles[row.stage].achieved, 0.02)
          << d->role << " stage " << row.stage;
  }
  EXPECT_LT(a.rows.back().y1, b.rows.front().y0);  // stacked: A above B
  // The comparison: each layout's figures and B - A.
  const Comparison c = compare(*model.pinned, model.current);
  EXPECT_DOUBLE_EQ(c.step_diff(), model.current.step() - model.pinned->step());
  EXPECT_GT(c.peak_diff(), 0);  // GPipe keeps every micro-batch's activations
  const std::string& line = app->drawn().comparison;
  EXPECT_NE(line.find("B - A"), std::string::npos) << line;
  EXPECT_NE(line.find(fmt::format("{:+.1f} pts", c.bubble_diff() * 100)), std::string::npos)
      << line;
  std::printf("[explorer] A/B: %s\n", line.c_str());
  app->write_png((fs::temp_directory_path() / "cai_gui_ab.png").string());
  click(*app, model, ui, "unpin");
  EXPECT_FALSE(model.pinned.has_value());
  EXPECT_EQ(app->drawn().timelines.size(), 1u);
}

// A recorded trace (here: written in vit_train's format from a simulation of the same config,
// stretched by 1.5) beside, then over the simulation.
TEST(SimInteraction, RecordedTraceBesideAndOver) {
  REQUIRE_APP(app);
  ExplorerModel model = sim_model(2, 4, "1f1b");
  std::vector<std::string> arrays;
  int lane0 = 0;
  for (const auto& r : model.current.ranks) {
    cai::trace::Recorder rec;
    const double base = 5e5, k = 1.5e3;  // ms -> µs, 1.5 times slower
    rec.span("step", "step", base, base + model.current.step() * k);
    for (const auto& s : r.spans) {
      if (s.lane != 0) continue;
      rec.span(s.name, "compute", base + s.start * k, base + s.end * k);
      ++lane0;
    }
    arrays.push_back(rec.events_json(
        r.rank, "rank " + std::to_string(r.rank) + " (pp " + std::to_string(r.stage) + ", dp 0)",
        0));
  }
  ASSERT_TRUE(model.open_trace(temp_file("sim_trace.json", cai::trace::chrome_trace(arrays))))
      << model.errors.back();
  UiState ui;
  render(*app, model, ui);
  ASSERT_EQ(app->drawn().timelines.size(), 2u);
  EXPECT_EQ(timeline(*app, "recorded").rows.size(), 2u);
  click(*app, model, ui, "trace.over");
  EXPECT_EQ(ui.trace_view, TraceView::Over);
  render(*app, model, ui, 1);
  ASSERT_EQ(app->drawn().timelines.size(), 1u);
  const DrawnTimeline& t = timeline(*app);
  EXPECT_EQ(t.overlaid_spans, lane0);
  // The axis runs over the longer (recorded) step.
  EXPECT_NEAR(t.t1, model.recorded.step(), 1e-9);
  EXPECT_NEAR(model.recorded.step(), 1.5 * model.current.step(), 1e-6);
  app->write_png((fs::temp_directory_path() / "cai_gui_over.png").string());
}

// Printed, not asserted: frame time with 64 ranks × 32 micro-batches from the simulator on
// Mesa's software renderer.
TEST(SimBenchmark, FrameTime64RanksBy32MicroBatches) {
  REQUIRE_APP(app);
  ExplorerModel model;
  auto& c = model.knobs.config;
  c.device = "cuda";
  c.pipeline = 64;
  c.depth = 64;
  c.num_microbatches = 32;
  c.batch_size = 128;
  c.pp_style = "1f1b";
  ASSERT_TRUE(model.recompute()) << model.knob_error;
  double best = model.current.compute_ms;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(model.recompute());
    best = std::min(best, model.current.compute_ms);
  }
  UiState ui;
  render(*app, model, ui, 2);
  double total = 0;
  const int frames = 10;
  for (int i = 0; i < frames; ++i) total += app->frame(model, ui);
  size_t spans = 0;
  for (const auto& r : model.current.ranks) spans += r.spans.size();
  std::printf(
      "[explorer] simulator source, 64 ranks x 32 micro-batches (pp 64 on %s, %zu "
      "spans): re-simulation %.0f ms (best of 3), mean frame %.1f ms over %d frames (Mesa "
      "software renderer under Xvfb)\n",
      fs::path(model.cluster_in_use).filename().c_str(), spans, best, total / frames, frames);
}
