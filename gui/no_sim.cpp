// A build without SimGrid: the explorer has only the ideal schedule replay.
#include "cai/core/error.h"
#include "sim_source.h"

namespace cai::gui {

bool simulator_available() {
  return false;
}

Timeline simulate_step(const Knobs&) {
  fail(
      "[gui] this colossalai-gui was built without SimGrid (the simulator): choose the schedule "
      "replay, or rebuild with SimGrid installed (scripts/setup)");
}

}  // namespace cai::gui
