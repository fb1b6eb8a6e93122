#include "step_timer.h"

#include <algorithm>

#include "cai/core/error.h"
#include "kernels/device.h"

namespace cai::parallel::detail {

StepTimer::StepTimer(Device device) : device_(device) {}

StepTimer::~StepTimer() {
  // Destroying an event whose work is still queued is allowed: CUDA releases it once done.
  for (Group& g : open_)
    for (void* e : g.events) kernels::cuda::event_destroy(e);
  for (void* e : free_) kernels::cuda::event_destroy(e);
  kernels::cuda::event_destroy(anchor_);
}

void StepTimer::begin_step() {
  // A step left open (its forward_backward threw) gives its spans but no bubble.
  if (!open_.empty() && open_.back().step && !open_.back().ended) open_.back().step = false;
  while (!open_.empty() && done(open_.front())) resolve_front();
  while (open_.size() >= kMaxOpen) {
    // kMaxOpen steps back: long done on the device.
    if (device_.is_cuda() && open_.front().last)
      kernels::cuda::event_synchronize(open_.front().last);
    resolve_front();
  }
  open_.emplace_back();
  open_.back().step = true;
  mark();  // the step's start
}

StepTimer::Mark StepTimer::mark() {
  if (open_.empty()) open_.emplace_back();  // outside any step, none before: a group of its own
  Group& g = open_.back();
  Mark m;
  if (device_.is_cuda()) {
    if (free_.empty()) {
      // Events belong to the device current when they are made; this process's must be its own
      // (another current device means a CUDA context on a GPU this process does not use).
      const int current = kernels::cuda::current_device();
      CAI_CHECK(current == device_.index,
                "[pipeline] timing events for GPU {} but GPU {} is this thread's current device",
                device_.index, current);
      free_.push_back(kernels::cuda::event_create_timed());
    }
    m.event = free_.back();
    free_.pop_back();
    kernels::cuda::event_record(m.event, nullptr);  // the compute stream
    g.events.push_back(m.event);
    g.last = m.event;
  }
  m.host_us = trace::Recorder::now_us();
  if (!g.started) g.start = m, g.started = true;  // the group's first mark: its origin
  return m;
}

void StepTimer::span(std::string name, std::string category, Mark from, int64_t memory_bytes) {
  const Mark to = mark();
  open_.back().spans.push_back(
      Pending{std::move(name), std::move(category), from, to, memory_bytes});
}

void StepTimer::end_step() {
  CAI_CHECK(!open_.empty() && open_.back().step && !open_.back().ended,
            "[pipeline] end_step() without an open step");
  const Mark end = mark();
  open_.back().end = end;
  open_.back().ended = true;
}

void StepTimer::flush() {
  while (!open_.empty()) {
    const Group& g = open_.front();
    if (g.step && !g.ended) break;  // the step in progress (not from between steps)
    if (device_.is_cuda() && g.last) kernels::cuda::event_synchronize(g.last);
    resolve_front();
  }
}

bool StepTimer::done(const Group& g) const {
  if (g.step && !g.ended) return false;
  return !device_.is_cuda() || !g.last || kernels::cuda::event_query(g.last);
}

double StepTimer::time_of(const Group& g, double origin_us, const Mark& m) const {
  if (!device_.is_cuda()) return m.host_us;
  return origin_us + 1000.0 * kernels::cuda::event_elapsed_ms(g.start.event, m.event);
}

void StepTimer::resolve_front() {
  Group g = std::move(open_.front());
  open_.pop_front();
  // On a GPU, the host time of the group's first event: not before the host recorded it, and
  // not before the previous group's first event plus the device time between the two (the
  // device may reach it well after the host went on), so that the device's order holds on the
  // timeline (a step's spans never overlap the next step's).
  double origin = g.start.host_us;
  if (device_.is_cuda() && anchor_)
    origin = std::max(
        origin, anchor_us_ + 1000.0 * kernels::cuda::event_elapsed_ms(anchor_, g.start.event));
  std::vector<trace::Interval> busy;
  for (const Pending& p : g.spans) {
    const double a = time_of(g, origin, p.from), b = time_of(g, origin, p.to);
    rec_.span(p.name, p.category, a, b);
    rec_.memory(b, p.memory);
    if (p.category == "compute") busy.push_back({a, b});
  }
  if (g.step && g.ended) {
    const double a = time_of(g, origin, g.start), b = time_of(g, origin, g.end);
    bubbles_.push_back(trace::idle_fraction(busy, a, b));
    rec_.span("step", "step", a, b);
  }
  // The group's first event is the next one's anchor; the previous anchor goes back to the pool.
  for (void* e : g.events)
    if (e != g.start.event) free_.push_back(e);
  if (g.start.event) {
    if (anchor_) free_.push_back(anchor_);
    anchor_ = g.start.event;
    anchor_us_ = origin;
  }
}

}  // namespace cai::parallel::detail
