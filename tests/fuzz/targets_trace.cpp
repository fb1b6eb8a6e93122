// The explorer's Chrome-trace and metrics-file readers (built only where the GUI's model library
// is).
#include <fstream>
#include <stdexcept>
#include <string>

#include "explorer_model.h"
#include "fuzz.h"

namespace cai::fuzz {

Target trace_target() {
  Target t;
  t.name = "chrome_trace";
  t.seeds = {
      R"json({"traceEvents": [
{"ph": "M", "name": "thread_name", "pid": 0, "tid": 0, "args": {"name": "rank 0 (pp 0)"}},
{"ph": "M", "name": "thread_name", "pid": 0, "tid": 1, "args": {"name": "rank 1 (pp 1)"}},
{"ph": "X", "name": "step", "cat": "step", "pid": 0, "tid": 0, "ts": 0, "dur": 100},
{"ph": "X", "name": "Fwd mb=0 c=0", "cat": "compute", "pid": 0, "tid": 0, "ts": 1, "dur": 10},
{"ph": "X", "name": "F1.0", "pid": 0, "tid": 1, "ts": 12, "dur": 10},
{"ph": "X", "name": "Bwd mb=1 c=0", "cat": "compute", "pid": 0, "tid": 1, "ts": 30, "dur": 20},
{"ph": "X", "name": "SendAct mb=0", "cat": "comm", "pid": 0, "tid": 0, "ts": 11, "dur": 1},
{"ph": "X", "name": "OptStep", "cat": "optimizer", "pid": 0, "tid": 0, "ts": 90, "dur": 5},
{"ph": "C", "name": "memory", "pid": 0, "tid": 0, "ts": 5, "args": {"bytes": 1048576}},
{"ph": "C", "name": "memory", "pid": 0, "tid": 1, "ts": 6, "args": {"other": 2.5e6}},
{"ph": "X", "name": "step", "cat": "step", "pid": 0, "tid": 0, "ts": 100, "dur": 100},
{"ph": "X", "name": "B0.1", "pid": 0, "tid": 0, "ts": 120, "dur": 10}
]})json",
      R"json([{"ph": "X", "name": "Load", "tid": 3, "ts": 0.5, "dur": 2}])json"};
  t.run = [](const std::string& in) {
    const gui::RecordedTrace rt = gui::parse_trace(in, "fuzz.json");
    // What the explorer does next with it: the last step and the first as timelines.
    gui::trace_step(rt, -1);
    gui::trace_step(rt, 0);
  };
  return t;
}

// vit_train's metrics file (JSON lines) as the explorer's training-curves panel reads it.
Target metrics_target(const std::string& tmp) {
  const std::string path = tmp + "/metrics.jsonl";
  Target t;
  t.name = "metrics";
  t.seeds = {
      R"({"type": "step", "epoch": 1, "step": 10, "loss": 2.3, "accuracy": 0.1, "lr": 0.001, "img_per_s": 1600.5, "seconds": 1.5, "grad_norm": 0.8}
{"type": "preempted", "epoch": 1, "step_in_epoch": 3, "step": 10, "signal": "SIGTERM"}
{"type": "resume", "epoch": 1, "step_in_epoch": 3, "step": 10, "checkpoint": "ckpt/step-10"}
{"type": "step", "epoch": 1, "step": 20, "loss": 2.1, "accuracy": 0.2, "lr": 0.001, "img_per_s": 1610.0, "seconds": 3.0}
{"type": "epoch", "epoch": 1, "step": 20, "train_loss": 2.2, "train_accuracy": 0.15, "test_loss": 2.0, "test_accuracy": 0.3, "seconds": 3.1}
)"};
  t.run = [path](const std::string& in) {
    {
      std::ofstream f(path, std::ios::binary | std::ios::trunc);
      f.write(in.data(), static_cast<std::streamsize>(in.size()));
    }
    gui::load_metrics(path);
  };
  return t;
}

}  // namespace cai::fuzz
