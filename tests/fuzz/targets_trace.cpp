// The explorer's Chrome-trace reader (built only where the GUI's model library is).
#include <stdexcept>

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

}  // namespace cai::fuzz
