// The measured bubble's arithmetic (trace::covered_us, trace::idle_fraction: the union of
// overlapping spans in a window) and the pipeline's step timer on the CPU (host clock): which
// spans are busy, the step's window, spans after the step (the optimizer step), lazy resolution.
// On a GPU the same timer reads timed CUDA events (the pipeline's GPU cases run it).
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "cai/core/error.h"
#include "cai/core/trace.h"
#include "parallel/step_timer.h"

using namespace cai;
using trace::Interval;

TEST(TraceBubble, CoveredCountsOverlapsOnce) {
  EXPECT_DOUBLE_EQ(trace::covered_us({}, 0, 10), 0.0);
  // Disjoint.
  EXPECT_DOUBLE_EQ(trace::covered_us({{1, 2}, {4, 7}}, 0, 10), 4.0);
  // Overlapping and nested, given out of order: [1, 6] and [8, 9].
  EXPECT_DOUBLE_EQ(trace::covered_us({{8, 9}, {2, 3}, {1, 4}, {3.5, 6}, {2, 5}}, 0, 10), 6.0);
  // Touching spans join without a gap.
  EXPECT_DOUBLE_EQ(trace::covered_us({{0, 2}, {2, 5}}, 0, 10), 5.0);
  // Clipped to the window; outside, empty and reversed spans count nothing.
  EXPECT_DOUBLE_EQ(trace::covered_us({{-5, 3}, {8, 20}, {11, 12}, {-3, -1}, {4, 4}, {7, 6}}, 0, 10),
                   5.0);
  // A window inside one span.
  EXPECT_DOUBLE_EQ(trace::covered_us({{0, 100}}, 10, 20), 10.0);
}

TEST(TraceBubble, IdleFraction) {
  // A 1F1B-like stage: busy 0-2, 3-5 and 6-8 of a 10 µs step.
  EXPECT_DOUBLE_EQ(trace::idle_fraction({{0, 2}, {3, 5}, {6, 8}}, 0, 10), 0.4);
  // Overlapping busy spans (device spans of two compute instructions can touch or overlap):
  // counted once, never a negative bubble.
  EXPECT_DOUBLE_EQ(trace::idle_fraction({{0, 6}, {4, 10}}, 0, 10), 0.0);
  EXPECT_DOUBLE_EQ(trace::idle_fraction({{0, 6}, {4, 8}, {5, 7}}, 0, 10), 0.2);
  EXPECT_DOUBLE_EQ(trace::idle_fraction({}, 0, 10), 1.0);
  // An empty or reversed window.
  EXPECT_DOUBLE_EQ(trace::idle_fraction({{0, 1}}, 5, 5), 0.0);
  EXPECT_DOUBLE_EQ(trace::idle_fraction({{0, 1}}, 5, 4), 0.0);
}

namespace {
void sleep_ms(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}
const trace::Span& find(const trace::Recorder& r, const std::string& name) {
  for (const auto& s : r.spans())
    if (s.name == name) return s;
  throw std::runtime_error("no span " + name);
}
}  // namespace

TEST(TraceBubble, StepTimerOnTheHost) {
  parallel::detail::StepTimer t(Device::cpu());
  for (int step = 0; step < 2; ++step) {
    t.begin_step();
    const std::string s = std::to_string(step);
    auto a = t.mark();
    sleep_ms(2);
    t.span("Recv" + s, "comm", a, 1);
    a = t.mark();
    sleep_ms(3);
    t.span("F" + s, "compute", a, 2);
    a = t.mark();
    sleep_ms(2);
    t.span("Send" + s, "comm", a, 3);
    a = t.mark();
    sleep_ms(3);
    t.span("B" + s, "compute", a, 4);
    t.end_step();
    a = t.mark();  // after the step: with it in the trace, not in its bubble
    sleep_ms(1);
    t.span("OptStep" + s, "optimizer", a, 5);
  }
  // The second step and both optimizer steps are resolved by flush() only.
  EXPECT_EQ(t.bubbles().size(), 1u);
  t.flush();
  ASSERT_EQ(t.bubbles().size(), 2u);
  const trace::Recorder& r = t.recorder();
  EXPECT_EQ(r.spans().size(), 2u * 6);  // 5 instructions and the step, per step
  EXPECT_EQ(r.memory_samples().size(), 2u * 5);
  std::vector<const trace::Span*> steps;
  for (const auto& s : r.spans())
    if (s.category == "step") steps.push_back(&s);
  ASSERT_EQ(steps.size(), 2u);
  for (int step = 0; step < 2; ++step) {
    const std::string s = std::to_string(step);
    const trace::Span& w = *steps[step];
    const trace::Span &f = find(r, "F" + s), &b = find(r, "B" + s), &o = find(r, "OptStep" + s);
    // The step's window holds its instructions, not the optimizer step.
    EXPECT_LE(w.start_us, find(r, "Recv" + s).start_us);
    EXPECT_GE(w.end_us, b.end_us);
    EXPECT_GE(o.start_us, w.end_us);
    // Busy: F and B only (disjoint on the host).
    const double busy = (f.end_us - f.start_us) + (b.end_us - b.start_us);
    EXPECT_NEAR(t.bubbles()[step], 1.0 - busy / (w.end_us - w.start_us), 1e-12);
    EXPECT_GT(t.bubbles()[step], 0.0);  // 4 ms of sleeps outside F and B
  }
  // Marks after a flush (an optimizer step after write_trace) go into a group of their own.
  const auto a = t.mark();
  t.span("late", "optimizer", a, 0);
  t.flush();
  EXPECT_NO_THROW(find(t.recorder(), "late"));
  EXPECT_EQ(t.bubbles().size(), 2u);
}

TEST(TraceBubble, StepTimerStepLeftOpen) {
  // A step whose forward_backward threw: its spans stay, it gives no bubble, the next one does.
  parallel::detail::StepTimer t(Device::cpu());
  t.begin_step();
  auto a = t.mark();
  t.span("F", "compute", a, 0);
  t.begin_step();
  a = t.mark();
  t.span("F2", "compute", a, 0);
  t.end_step();
  t.flush();
  EXPECT_EQ(t.bubbles().size(), 1u);
  EXPECT_NO_THROW(find(t.recorder(), "F"));
  EXPECT_THROW(t.end_step(), Error);  // none open
}
