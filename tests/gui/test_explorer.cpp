// The schedule explorer with the ideal schedule replay as its source (every build has it): the
// model headless, then what the panels draw, read back from the pixels of an offscreen frame
// (run under Xvfb by tests/gui/xvfb.sh), and scripted input through ImGui's IO. The simulator
// source's tests are in test_sim_source.cpp (builds with SimGrid).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "app.h"
#include "cai/core/error.h"
#include "cai/core/trace.h"
#include "explorer_model.h"
#include "helpers.h"

using namespace cai::gui;
namespace fs = std::filesystem;

using namespace cai::gui::testing;

// --- the model, headless --------------------------------------------------------------------

TEST(ExplorerModel, ReplayBubbleIsTheSchedules) {
  ExplorerModel m = pipeline_model(4, 8, "1f1b");
  EXPECT_EQ(m.current.source, "schedule replay (ideal)");
  ASSERT_EQ(m.current.ranks.size(), 4u);
  ASSERT_EQ(m.current.bubbles.size(), 4u);
  for (const auto& b : m.current.bubbles) {
    EXPECT_NEAR(b.ideal, 3.0 / 11.0, 1e-9);  // (p-1)/(m+p-1)
    EXPECT_NEAR(b.achieved, b.ideal, 1e-9);
  }
  // Spans: 8 forwards and 8 backwards per rank, shaded by micro-batch.
  for (const auto& r : m.current.ranks) EXPECT_EQ(r.spans.size(), 16u);
  // Memory: stage 0 holds the most micro-batches under 1F1B.
  int top = -1;
  double peak = 0;
  for (const auto& c : m.current.memory)
    if (c.peak() > peak) peak = c.peak(), top = c.rank;
  EXPECT_EQ(top, 0);
  ExplorerModel il = pipeline_model(4, 8, "interleaved", 2);
  EXPECT_LT(il.current.bubbles[0].ideal, m.current.bubbles[0].ideal);
}

// Zero-bubble schedules: B (BackwardInput) drawn as backward, W (BackwardWeight) in a category
// and colour of its own, labelled "W<mb>"; the ideal bubbles order as the schedule tests assert.
TEST(ExplorerModel, ZeroBubbleDrawsBAndWApart) {
  const ExplorerModel one = pipeline_model(4, 8, "1f1b");
  const ExplorerModel h1 = pipeline_model(4, 8, "zbh1");
  const ExplorerModel zv = pipeline_model(4, 8, "zbv", 2);
  EXPECT_EQ(zv.current.chunks, 2);
  EXPECT_LT(h1.current.bubbles[0].ideal, one.current.bubbles[0].ideal);
  EXPECT_LT(zv.current.bubbles[0].ideal, h1.current.bubbles[0].ideal);
  for (const ExplorerModel* m : {&h1, &zv}) {
    const size_t per_kind = 8u * m->current.chunks;
    for (const auto& r : m->current.ranks) {
      size_t f = 0, b = 0, w = 0;
      for (const Span& s : r.spans) {
        f += s.category == Category::Forward;
        b += s.category == Category::Backward;
        if (s.category == Category::Weight) {
          ++w;
          EXPECT_EQ(s.name.rfind("BW(", 0), 0u) << s.name;
        }
      }
      EXPECT_EQ(f, per_kind);
      EXPECT_EQ(b, per_kind);
      EXPECT_EQ(w, per_kind);
    }
  }
  EXPECT_EQ(category_of(cai::schedule::Op::BackwardWeight), Category::Weight);
  EXPECT_EQ(category_of(cai::schedule::Op::BackwardInput), Category::Backward);
  EXPECT_STREQ(category_name(Category::Weight), "weight grad");
  EXPECT_EQ(span_from_name("BW(mb=2,c=1)", "compute").category, Category::Weight);
  EXPECT_EQ(span_from_name("BI(mb=2,c=1)", "compute").category, Category::Backward);
  const Span w = span_from_name("W3.1", "compute");
  EXPECT_EQ(w.category, Category::Weight);
  EXPECT_EQ(w.mb, 3);
  EXPECT_EQ(w.chunk, 1);
  const Rgb cb = category_colour(Category::Backward, 0), cw = category_colour(Category::Weight, 0);
  EXPECT_TRUE(cb.r != cw.r || cb.g != cw.g || cb.b != cw.b);
}

TEST(ExplorerModel, InvalidKnobsGiveVitTrainsText) {
  ExplorerModel m = pipeline_model(4, 8, "1f1b");
  const Timeline before = m.current;
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
  EXPECT_EQ(m.current.ranks.size(), before.ranks.size());  // the last valid one stays
  m.knobs.config.zero_stage = 0;
  m.knobs.config.pp_style = "interleaved";
  m.knobs.config.num_model_chunks = 2;
  m.knobs.config.num_microbatches = 6;
  EXPECT_FALSE(m.recompute());
  EXPECT_NE(m.knob_error.find("micro-batch count (6) to be a multiple of the stage count (4)"),
            std::string::npos)
      << m.knob_error;
  m.knobs.config.num_microbatches = 8;
  EXPECT_TRUE(m.recompute()) << m.knob_error;
}

TEST(ExplorerModel, MalformedFilesAreErrorsNamingTheFile) {
  ExplorerModel m = pipeline_model(2, 4, "1f1b");
  const std::string bad = temp_file("bad.json", "{\"traceEvents\": [ {\"ph\": \"X\"");
  EXPECT_FALSE(m.open_trace(bad));
  ASSERT_EQ(m.errors.size(), 1u);
  EXPECT_NE(m.errors[0].find("[gui] trace " + bad + ": not JSON"), std::string::npos);
  const std::string nodur =
      temp_file("nodur.json",
                R"js({"traceEvents": [{"name": "F(mb=0,c=0)", "ph": "X", "tid": 0, "ts": 1}]})js");
  EXPECT_FALSE(m.open_trace(nodur));
  EXPECT_NE(m.errors[1].find("event 0 has no numeric \"dur\""), std::string::npos) << m.errors[1];
  EXPECT_FALSE(m.open_trace("/nonexistent/t.json"));
  EXPECT_NE(m.errors[2].find("cannot open"), std::string::npos);
  const std::string badm = temp_file("bad.jsonl",
                                     "{\"type\":\"step\",\"epoch\":1,\"step\":1,"
                                     "\"loss\":2.0}\n{oops\n");
  EXPECT_FALSE(m.open_metrics(badm));
  EXPECT_NE(m.errors[3].find("[gui] metrics " + badm + " line 2: not JSON"), std::string::npos)
      << m.errors[3];
  EXPECT_FALSE(m.trace.has_value());
  EXPECT_FALSE(m.current.empty());  // still running with the replay
  EXPECT_EQ(m.take_new_errors().size(), 4u);
  EXPECT_TRUE(m.take_new_errors().empty());
}

// Found by the fuzzer (issue 16): a number beyond double's range made nlohmann::json throw
// out_of_range, which escaped parse_trace / load_metrics as a non-cai::Error.
TEST(ExplorerModel, NumberBeyondDoubleIsCaiError) {
  EXPECT_THROW(parse_trace(R"({"traceEvents": [{"ph": "X", "ts": 1e309}]})", "t.json"), cai::Error);
  ExplorerModel m = pipeline_model(2, 4, "1f1b");
  EXPECT_FALSE(m.open_metrics(temp_file("big.jsonl", "{\"type\": \"step\", \"loss\": 1e999}\n")));
  ASSERT_EQ(m.errors.size(), 1u);
  EXPECT_NE(m.errors[0].find("line 1: not JSON"), std::string::npos) << m.errors[0];
}

TEST(ExplorerModel, MetricsCountsBeyondInt64AreErrors) {
  // libFuzzer + UBSan (fuzz_metrics): an epoch of 7.8e182 was cast to int64_t (undefined).
  ExplorerModel m = pipeline_model(2, 4, "1f1b");
  EXPECT_FALSE(m.open_metrics(temp_file(
      "huge.jsonl", "{\"type\": \"step\", \"epoch\": 7.7e182, \"step\": 1, \"loss\": 2.0}\n")));
  ASSERT_EQ(m.errors.size(), 1u);
  EXPECT_NE(m.errors[0].find("\"epoch\" 7.7e+182 is beyond a 64-bit integer"), std::string::npos)
      << m.errors[0];
}

TEST(ExplorerModel, HugeStageAndMicroBatchIndicesAreErrors) {
  // A stage label of 2^31 - 1 would size the per-stage tables; an index beyond int was UB.
  const std::string stage =
      R"J({"traceEvents": [{"ph": "M", "tid": 0, "name": "thread_name", "args": {"name":
      "rank 0 (pp 2147483647, dp 0)"}}, {"ph": "X", "tid": 0, "ts": 0, "dur": 1, "name":
      "F(mb=0,c=0)", "cat": "compute"}]})J";
  EXPECT_THROW(parse_trace(stage, "t.json"), cai::Error);
  const std::string mb = R"J({"traceEvents": [{"ph": "X", "tid": 0, "ts": 0, "dur": 1,
      "name": "F99999999999", "cat": "compute"}]})J";
  EXPECT_THROW(parse_trace(mb, "t.json"), cai::Error);
}

// A trace in vit_train's format (cai::trace::Recorder, one track per rank, "step" spans and
// memory counters), made from the replay: the explorer reads back the same spans and bubbles.
TEST(ExplorerModel, ReadsVitTrainTraceFormat) {
  ExplorerModel m = pipeline_model(4, 8, "1f1b");
  std::vector<std::string> arrays;
  for (const auto& r : m.current.ranks) {
    cai::trace::Recorder rec;
    for (int step = 0; step < 2; ++step) {
      const double base = 1e6 + step * 1000.0;  // µs; a replay unit = 10 µs
      rec.span("step", "step", base, base + m.current.t_end * 10);
      for (const auto& s : r.spans) {
        rec.span(s.name, s.category == Category::Comm ? "comm" : "compute", base + s.start * 10,
                 base + s.end * 10);
        rec.memory(base + s.end * 10, 1000 * (r.stage + 1) + static_cast<int64_t>(s.mb));
      }
    }
    arrays.push_back(rec.events_json(
        r.rank, "rank " + std::to_string(r.rank) + " (pp " + std::to_string(r.stage) + ", dp 0)",
        1e6));
  }
  const std::string path = temp_file("trace.json", cai::trace::chrome_trace(arrays));
  ASSERT_TRUE(m.open_trace(path)) << m.errors.back();
  EXPECT_EQ(m.trace->steps.size(), 2u);
  const Timeline& t = m.recorded;
  EXPECT_EQ(t.stages, 4);
  EXPECT_EQ(t.micro_batches, 8);
  EXPECT_EQ(t.time_unit, "ms");
  ASSERT_EQ(t.ranks.size(), 4u);
  EXPECT_EQ(t.ranks[2].stage, 2);
  EXPECT_EQ(t.ranks[2].spans.size(), 16u);
  EXPECT_EQ(t.ranks[2].spans[0].name, "F(mb=0,c=0)");
  EXPECT_EQ(t.ranks[2].spans[0].mb, 0);
  for (int s = 0; s < 4; ++s) {
    EXPECT_NEAR(t.bubbles[s].achieved, 3.0 / 11.0, 1e-6);
    EXPECT_NEAR(t.bubbles[s].ideal, 3.0 / 11.0, 1e-9);  // from the replay of the same shape
  }
  ASSERT_FALSE(t.memory[1].points.empty());
  EXPECT_FALSE(t.memory[1].breakdown);
  EXPECT_GE(t.memory[1].peak(), 2000);
  // The short instruction names ("F3.1") parse too.
  const Span s = span_from_name("B3.1", "compute");
  EXPECT_EQ(s.category, Category::Backward);
  EXPECT_EQ(s.mb, 3);
  EXPECT_EQ(s.chunk, 1);
}

// Issue 42: a resumed vit_train appends its records after {"type": "resume", ...}; a run stopped
// on request (preemption) ends with {"type": "preempted", ...}.
TEST(ExplorerModel, MetricsOfAResumedRunLoad) {
  ExplorerModel m;
  const std::string path =
      temp_file("resumed.jsonl",
                "{\"type\":\"step\",\"epoch\":1,\"step\":1,\"loss\":2.3}\n"
                "{\"type\":\"preempted\",\"epoch\":1,\"step_in_epoch\":1,\"step\":1,"
                "\"signal\":\"SIGTERM\"}\n"
                "{\"type\":\"resume\",\"epoch\":1,\"step_in_epoch\":1,\"step\":1,"
                "\"checkpoint\":\"ck/step-000000001\"}\n"
                "{\"type\":\"step\",\"epoch\":1,\"step\":2,\"loss\":2.1}\n");
  ASSERT_TRUE(m.open_metrics(path)) << m.errors.back();
  ASSERT_EQ(m.runs[0].steps.size(), 2u);
  EXPECT_EQ(m.runs[0].steps[1].step, 2);
}

TEST(ExplorerModel, MetricsAndConfigRoundTrip) {
  ExplorerModel m;
  const std::string path = temp_file(
      "metrics.jsonl",
      "{\"type\":\"step\",\"epoch\":1,\"step\":10,\"loss\":2.1,\"accuracy\":0.3,\"lr\":0.001,"
      "\"img_per_s\":900}\n"
      "{\"type\":\"epoch\",\"epoch\":1,\"step\":10,\"train_loss\":2.0,\"train_accuracy\":0.35,"
      "\"seconds\":3,\"img_per_s\":880,\"lr\":0.001,\"test_loss\":1.9,\"test_accuracy\":0.4}\n");
  ASSERT_TRUE(m.open_metrics(path));
  ASSERT_EQ(m.runs[0].steps.size(), 1u);
  EXPECT_DOUBLE_EQ(m.runs[0].epochs[0].test_accuracy, 0.4);
  // Save the knobs as a vit_train config and load them back.
  m.knobs.config.pipeline = 2;
  m.knobs.config.pp_style = "gpipe";
  m.knobs.config.num_microbatches = 6;
  const std::string cfg = (fs::temp_directory_path() / "cai_gui_knobs.toml").string();
  ASSERT_TRUE(m.save_config(cfg));
  ExplorerModel n;
  ASSERT_TRUE(n.load_config(cfg, {"parallel.num_microbatches=4"})) << n.errors.back();
  EXPECT_EQ(n.knobs.config.pipeline, 2);
  EXPECT_EQ(n.knobs.config.pp_style, "gpipe");
  EXPECT_EQ(n.current.micro_batches, 4);
  EXPECT_FALSE(n.load_config("/nonexistent.toml"));
  EXPECT_NE(n.errors.back().find("/nonexistent.toml"), std::string::npos);
}

// Issue 45: the curves show the layout the run really had ("run" record) and its test accuracy.
TEST(ExplorerModel, MetricsRunRecordGivesTheRealLayout) {
  ExplorerModel m;
  const std::string path = temp_file(
      "demo.jsonl",
      "{\"type\":\"run\",\"processes\":2,\"dp\":2,\"pp\":1,\"tp\":1,\"tensor_mode\":"
      "\"none\",\"zero_stage\":0,\"batch_per_process\":64,\"global_batch\":128,\"model\":"
      "\"custom ViT\",\"device\":\"cpu\",\"layout\":\"dp 2 × pp 1 × tp 1\"}\n"
      "{\"type\":\"step\",\"epoch\":1,\"step\":10,\"loss\":2.1}\n"
      "{\"type\":\"epoch\",\"epoch\":1,\"step\":10,\"train_loss\":2.0,\"test_accuracy\":0.4}\n");
  ASSERT_TRUE(m.open_metrics(path)) << m.errors.back();
  ASSERT_TRUE(m.runs[0].layout.has_value());
  const MetricsLayout& l = *m.runs[0].layout;
  EXPECT_EQ(l.processes, 2);
  EXPECT_EQ(l.dp, 2);
  EXPECT_EQ(l.batch_per_process, 64);
  EXPECT_EQ(l.global_batch, 128);
  EXPECT_EQ(l.describe(),
            "2 processes (dp 2 × pp 1 × tp 1), 64 samples per data-parallel rank per step (global "
            "batch 128), custom ViT on cpu");
  // The explorer's defaults differ; adopting the run's layout sets the knobs to it.
  m.knobs.world = 4;
  m.knobs.config.pipeline = 4;
  ASSERT_TRUE(m.adopt_run_layout(0)) << m.errors.back();
  EXPECT_EQ(m.knobs.world, 2);
  EXPECT_EQ(m.knobs.config.pipeline, 1);
  EXPECT_EQ(m.knobs.config.batch_size, 64);
  EXPECT_EQ(m.knob_error, "");
  // A file without a run record has no layout to adopt, and says so.
  const std::string old =
      temp_file("old.jsonl", "{\"type\":\"step\",\"epoch\":1,\"step\":1,\"loss\":2.3}\n");
  ASSERT_TRUE(m.open_metrics(old));
  EXPECT_FALSE(m.adopt_run_layout(1));
  EXPECT_NE(m.errors.back().find("no \"run\" record"), std::string::npos) << m.errors.back();
  // A run record whose ranks do not multiply to its processes is an error naming the values.
  const std::string bad = temp_file(
      "bad_run.jsonl",
      "{\"type\":\"run\",\"processes\":3,\"dp\":2,\"pp\":1,\"tp\":1,\"batch_per_process\":64}\n"
      "{\"type\":\"step\",\"epoch\":1,\"step\":1,\"loss\":2.3}\n");
  EXPECT_FALSE(m.open_metrics(bad));
  EXPECT_NE(m.errors.back().find("dp 2 × pp 1 × tp 1 is not the 3 processes"), std::string::npos)
      << m.errors.back();
  const std::string negative = temp_file(
      "neg_run.jsonl",
      "{\"type\":\"run\",\"processes\":1,\"dp\":1,\"pp\":1,\"tp\":1,\"batch_per_process\":-64}\n");
  EXPECT_FALSE(m.open_metrics(negative));
  EXPECT_NE(m.errors.back().find("\"batch_per_process\" -64"), std::string::npos)
      << m.errors.back();
}

// --- what is drawn (offscreen frame under Xvfb) ---------------------------------------------

TEST(ReplayScreenshot, IdleShareOfEachRowIsTheStagesBubble) {
  REQUIRE_APP(app);
  ExplorerModel model = pipeline_model(4, 8, "1f1b");
  UiState ui;
  ui.layout = Layout::All;
  render(*app, model, ui);
  const Image img = app->capture();
  ASSERT_EQ(app->drawn().timelines.size(), 1u);
  const DrawnTimeline& t = app->drawn().timelines[0];
  ASSERT_EQ(t.rows.size(), 4u);
  for (const auto& row : t.rows) {
    const double px = idle_share(img, t, row), want = model.current.bubbles[row.stage].ideal;
    std::printf("[explorer] 1f1b p4 m8 stage %d: idle pixels %.2f%%, schedule bubble %.2f%%\n",
                row.stage, px * 100, want * 100);
    EXPECT_NEAR(px, want, 0.02) << "stage " << row.stage;
  }
  app->write_png((fs::temp_directory_path() / "cai_gui_1f1b.png").string());
}

TEST(ReplayScreenshot, InterleavedShowsLessIdleThan1F1B) {
  REQUIRE_APP(app);
  UiState ui;
  ExplorerModel a = pipeline_model(4, 8, "1f1b");
  render(*app, a, ui);
  const double idle_1f1b = mean_idle_share(app->capture(), app->drawn().timelines[0]);
  ExplorerModel b = pipeline_model(4, 8, "interleaved", 2);
  render(*app, b, ui);
  const Image img = app->capture();
  const double idle_il = mean_idle_share(img, app->drawn().timelines[0]);
  std::printf(
      "[explorer] idle pixels: 1f1b %.2f%% (bubble %.2f%%), interleaved v=2 %.2f%% "
      "(bubble %.2f%%)\n",
      idle_1f1b * 100, a.current.bubbles[0].ideal * 100, idle_il * 100,
      b.current.bubbles[0].ideal * 100);
  EXPECT_LT(idle_il, idle_1f1b - 0.05);
  for (const auto& row : app->drawn().timelines[0].rows)
    EXPECT_NEAR(idle_share(img, app->drawn().timelines[0], row), b.current.bubbles[row.stage].ideal,
                0.02);
}

TEST(ReplayScreenshot, HighestMemoryCurveIsStage0Under1F1B) {
  REQUIRE_APP(app);
  ExplorerModel model = pipeline_model(4, 8, "1f1b");
  UiState ui;
  render(*app, model, ui);
  const Image img = app->capture();
  const DrawnMemory& dm = app->drawn().memory;
  ASSERT_EQ(dm.ranks.size(), 4u);
  // The topmost curve pixel of the plot (the legend aside): whose colour is it?
  int found_y = -1;
  const int found = topmost_curve_rank(img, dm, &found_y);
  std::printf("[explorer] highest memory curve: rank %d at y=%d (model predicts rank %d)\n", found,
              found_y, dm.highest_rank);
  EXPECT_EQ(found, 0);
  EXPECT_EQ(dm.highest_rank, 0);
}

// --- scripted input through ImGui's IO ------------------------------------------------------

TEST(ReplayInteraction, ScheduleAndMicroBatchKnobs) {
  REQUIRE_APP(app);
  ExplorerModel model = pipeline_model(4, 8, "1f1b");
  UiState ui;
  render(*app, model, ui);
  const double idle0 = mean_idle_share(app->capture(), app->drawn().timelines[0]);
  const double bubble0 = model.current.bubbles[0].ideal;

  click(*app, model, ui, "schedule.interleaved");
  EXPECT_EQ(model.knobs.config.pp_style, "interleaved");
  EXPECT_EQ(model.knobs.config.num_model_chunks, 2);
  EXPECT_EQ(model.current.schedule, "interleaved");
  EXPECT_LT(model.current.bubbles[0].ideal, bubble0);
  render(*app, model, ui, 1);
  const double idle1 = mean_idle_share(app->capture(), app->drawn().timelines[0]);
  EXPECT_LT(idle1, idle0 - 0.05);

  // 9 micro-batches on 4 stages: interleaving refuses, with the executor's text; the last valid
  // timeline stays drawn.
  click(*app, model, ui, "mb.plus");
  EXPECT_EQ(model.knobs.micro_batches(), 9);
  EXPECT_NE(model.knob_error.find("multiple of the stage count (4)"), std::string::npos)
      << model.knob_error;
  EXPECT_EQ(model.current.micro_batches, 8);
  for (int i = 0; i < 3; ++i) click(*app, model, ui, "mb.plus");
  EXPECT_TRUE(model.knob_error.empty()) << model.knob_error;
  EXPECT_EQ(model.current.micro_batches, 12);
  render(*app, model, ui, 1);
  const double idle2 = mean_idle_share(app->capture(), app->drawn().timelines[0]);
  std::printf(
      "[explorer] scripted clicks: idle pixels 1f1b m8 %.2f%% -> interleaved m8 %.2f%% "
      "-> interleaved m12 %.2f%% (bubble %.2f%%)\n",
      idle0 * 100, idle1 * 100, idle2 * 100, model.current.bubbles[0].ideal * 100);
  EXPECT_LT(idle2, idle1);
  EXPECT_NEAR(idle2, model.current.bubbles[0].ideal, 0.02);

  // Zoom with the wheel over the timeline: the view narrows around the cursor.
  const Rect plot = app->drawn().timelines[0].plot;
  ScriptedInput wheel{plot.cx(), plot.cy(), false, 2.0f};
  app->frame(model, ui, &wheel);
  EXPECT_LT(ui.view_end - ui.view_begin, 0.7);
}

// Printed, not asserted: frame time with 64 ranks × 32 micro-batches on Mesa's software renderer.
TEST(ReplayBenchmark, FrameTime64RanksBy32MicroBatches) {
  REQUIRE_APP(app);
  ExplorerModel model;
  model.knobs.source = Source::Replay;
  auto& c = model.knobs.config;
  c.pipeline = 64;
  c.depth = 64;
  c.num_microbatches = 32;
  c.pp_style = "1f1b";
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(model.recompute()) << model.knob_error;
  const double recompute_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  UiState ui;
  render(*app, model, ui, 2);
  double total = 0;
  const int frames = 10;
  for (int i = 0; i < frames; ++i) total += app->frame(model, ui);
  size_t spans = 0;
  for (const auto& r : model.current.ranks) spans += r.spans.size();
  std::printf(
      "[explorer] replay source, 64 ranks x 32 micro-batches (pp 64, %zu spans): replay %.1f ms, "
      "mean "
      "frame %.1f ms over %d frames (%s)\n",
      spans, recompute_ms, total / frames, frames, "Mesa software renderer under Xvfb");
}

// Issue 45: the demo's curves picture names the layout the run had and draws its test accuracy
// per epoch beside the per-step training accuracy (per step and per epoch).
TEST(ReplayScreenshot, CurvesShowTheRunsLayoutAndTestAccuracy) {
  REQUIRE_APP(app);
  ExplorerModel model;
  model.knobs.source = Source::Replay;
  const std::string path = temp_file(
      "curves_run.jsonl",
      "{\"type\":\"run\",\"processes\":2,\"dp\":2,\"pp\":1,\"tp\":1,\"batch_per_process\":64}\n"
      "{\"type\":\"step\",\"epoch\":1,\"step\":1,\"loss\":2.3,\"accuracy\":0.1}\n"
      "{\"type\":\"step\",\"epoch\":1,\"step\":2,\"loss\":2.0,\"accuracy\":0.3}\n"
      "{\"type\":\"epoch\",\"epoch\":1,\"step\":2,\"train_loss\":2.1,\"test_accuracy\":0.5}\n"
      "{\"type\":\"step\",\"epoch\":2,\"step\":3,\"loss\":1.8,\"accuracy\":0.5}\n"
      "{\"type\":\"step\",\"epoch\":2,\"step\":4,\"loss\":1.6,\"accuracy\":0.6}\n"
      "{\"type\":\"epoch\",\"epoch\":2,\"step\":4,\"train_loss\":1.7,\"test_accuracy\":0.7}\n");
  ASSERT_TRUE(model.open_metrics(path)) << model.errors.back();
  UiState ui;
  ui.layout = Layout::Curves;
  for (int per = 0; per < 2; ++per) {
    ui.curves_x = per;
    render(*app, model, ui);
    EXPECT_EQ(app->drawn().curves_layouts, 1) << "per " << (per ? "epoch" : "step");
    EXPECT_EQ(app->drawn().test_accuracy_curves, 1) << "per " << (per ? "epoch" : "step");
    EXPECT_EQ(app->drawn().curves_plotted, 5) << "per " << (per ? "epoch" : "step");
  }
}
