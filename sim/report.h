// Outputs of a replay: the JSON summary, a Chrome trace in the format `vit_train --trace` writes
// (cai/core/trace.h: one track per rank with the executor's instruction names, memory as counter
// events; communication streams on tracks of their own), and a human summary.
#pragma once
#include <string>
#include <vector>

#include "replay.h"

namespace cai::sim {

// {"workload", "cluster", "nproc", "simulated_ranks", "copies", "dtype", "collectives", "step_ms",
// "img_per_s", "bubble" (per stage), "bubble_mean", "bubble_measured" (per stage),
// "memory_limit_bytes", "fits_memory", "peak_mem_bytes", "compute_ms", "comm_ms", "comm_total_ms",
// "idle_ms" (per rank), "mem_at_peak" (per rank, per kind), "wall_s", "simgrid_s"}. Per-rank arrays
// cover every rank of the job (copies repeat the simulated ranks' figures); the trace shows the
// simulated ranks only.
std::string result_json(const Workload& w, const ReplayResult& r);
// Chrome-trace JSON: rank r's stream 0 on tid r (named by RankProgram::label) with its memory
// counter and a "step" span; stream k > 0 on tid k · ranks + r ("<label> stream k").
std::string result_trace(const Workload& w, const ReplayResult& r);
// A few lines: step, images/s, bubbles, peak memory, compute/comm/idle extremes, wall time.
std::string result_summary(const Workload& w, const ReplayResult& r);
// What makes the result a guess, one sentence each: compute ops timed by the roofline's
// placeholder efficiencies (no profile sample), collectives or sends timed by the cluster file's
// nominal links, a profile measured on another device family than the cluster's GPU (H100 vs
// H200, a CPU vs a GPU) or in another dtype than the workload's. Empty: every time came from a
// profile of this device. colossalai-sim prints them under its summary and in --json
// ("warnings").
std::vector<std::string> result_warnings(const Workload& w, const ReplayResult& r, const Cluster& c,
                                         const Calibration& cal);

}  // namespace cai::sim
