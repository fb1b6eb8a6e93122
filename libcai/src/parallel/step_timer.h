// Internal to libcai/src/parallel: the pipeline executor's clock for its instructions' spans (the
// Chrome trace) and its measured bubble. On the CPU it is the host clock: the instructions run on
// the calling thread, so their host spans are what the stage did. On a GPU the kernels run
// asynchronously to the host: a host span measures the launches, and the wait in the next receive
// absorbs the device time (4 H100, ViT-L/16 pp 4 1F1B: 0.81 measured where the step time allowed
// at most 0.45). There every mark records a timed CUDA event on the compute stream (the legacy
// default stream, where the kernels run), and a step's spans are resolved once its last event
// has completed: at a later step's start when the device got there already (no wait), else when
// kMaxOpen steps are open (the oldest, long done), or in flush(); never inside a step. Device
// times are placed on the host clock at each step's start event: the host time it was recorded
// at, or later where the device time since the previous step's start says so (device order kept).
// The events come from a pool and are reused. The bubble of a step is trace::idle_fraction of its
// compute spans over the step, on either clock.
#pragma once
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "cai/core/tensor.h"
#include "cai/core/trace.h"

namespace cai::parallel::detail {

class StepTimer {
 public:
  // A point in time: the host clock, and on a GPU the event recorded there.
  struct Mark {
    double host_us = 0;
    void* event = nullptr;
  };

  // The device the stage computes on (on a GPU, the current device of the calling thread).
  explicit StepTimer(Device device);
  ~StepTimer();
  StepTimer(const StepTimer&) = delete;
  StepTimer& operator=(const StepTimer&) = delete;

  // Resolves the finished steps the device has completed, then opens a step now.
  void begin_step();
  // Now. Marks and spans outside a step (the optimizer step) go with the last step, if any.
  Mark mark();
  // The span from `from` to now, with the memory in use at its end. Spans of category "compute"
  // are the stage's busy time for the bubble.
  void span(std::string name, std::string category, Mark from, int64_t memory_bytes);
  // Closes the step opened last.
  void end_step();
  // Waits for the device where steps are still open and resolves them all.
  void flush();

  // What has been resolved so far (all of it after flush()): spans and memory samples, and the
  // bubble of each step, in order.
  const trace::Recorder& recorder() const { return rec_; }
  const std::vector<double>& bubbles() const { return bubbles_; }

  static constexpr size_t kMaxOpen = 4;

 private:
  struct Pending {
    std::string name, category;
    Mark from, to;
    int64_t memory = 0;
  };
  // A step (or marks made outside any: no bubble), its spans and the events it holds.
  struct Group {
    bool step = false, ended = false, started = false;
    Mark start, end;  // start: the first mark (a step's begin_step)
    std::vector<Pending> spans;
    std::vector<void*> events;
    void* last = nullptr;  // the event recorded last: all the group's are done when it is
  };
  bool done(const Group& g) const;
  // A mark's time: the host's on the CPU; on a GPU origin_us + the device time from g's first
  // event.
  double time_of(const Group& g, double origin_us, const Mark& m) const;
  void resolve_front();  // resolves open_.front() (completed) and pops it

  Device device_;
  std::vector<void*> free_;  // pooled events, ready for reuse
  std::deque<Group> open_;
  void* anchor_ = nullptr;  // GPU: the first event of the group resolved last, at anchor_us_
  double anchor_us_ = 0;
  trace::Recorder rec_;
  std::vector<double> bubbles_;
};

}  // namespace cai::parallel::detail
