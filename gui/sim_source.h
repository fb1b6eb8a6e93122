// The SimGrid simulator as the explorer's timeline source: the knobs' vit_train config on
// world_size() ranks of the knobs' cluster, through the same functions `colossalai-sim --config
// FILE --cluster FILE --nproc N` calls (sim/from_config.h: workload_from_config, which lays the
// analytic plan's per-layer ops along the schedule expansion; sim/replay.h: replay, with
// identical data-parallel replicas folded). Built only with SimGrid (sim_source.cpp); without it
// no_sim.cpp says so and the explorer falls back on the ideal schedule replay.
#pragma once
#include "explorer_model.h"

namespace cai::gui {

// Whether this build links the simulator (cai_sim).
bool simulator_available();

// The simulated step as a Timeline in ms:
//  - per rank (every rank of the job: folded copies repeat their simulated image, labelled with
//    the mesh rank), lane 0 (the compute stream): per program instruction one span (a Forward /
//    Backward from its first to its last op, Load, OptStep, ReduceGrads when it takes time),
//    split where a collective runs on that stream (the tensor-parallel all-reduces, drawn as
//    communication, as the simulator counts them: not forward/backward time); receive waits
//    are left idle. Lane 1: the communication streams (sends, data-parallel reductions);
//  - bubbles: achieved = the replay's per-stage bubble (1 - forward/backward time / step), ideal =
//    the schedule's bubble with uniform stage costs (schedule::validate);
//  - memory: each rank's counter split by kind (parameters, gradients, optimizer state,
//    activations, buffers), the cluster's GPU memory as capacity, the plan's predicted peak and
//    its rank.
// Throws cai::Error: vit_train's text for invalid knobs, "[cluster] <file>: ..." or
// "[calibration] <file>: ..." for bad files, "[sim] ..." when the layout does not fit the
// cluster, "[gui] ..." in a build without SimGrid.
Timeline simulate_step(const Knobs& k);

// The bubble of every stage of `s` replayed with uniform costs (forward 1, backward 2, no
// communication): the schedule's own, (p - 1) / (m + p - 1) for 1F1B.
std::vector<double> ideal_bubbles(const schedule::Schedule& s);

}  // namespace cai::gui
