// Layout search: every dp × pp × tensor layout (each mode TensorParallel::modes_for offers for the
// size: 1d with and without sequence parallelism, 2d, 2.5d per depth, 3d) × ZeRO stage ×
// pipeline schedule (GPipe, 1F1B, interleaved with 2 or 4 chunks, ZB-H1, ZB-V) × micro-batch count
// × activation checkpointing of a vit_train config on N processes that vit_train accepts, keeps the
// global batch, and fits the cluster's GPU memory by the plan's predicted peak, ranked by simulated
// throughput (workload_from_config + replay).
//
// Best first with a bound: every layout gets the plan's lower bound on its step time
// (step_lower_bound, cheap), layouts are simulated in the order of their bounds, and once `keep`
// layouts are simulated the rest whose bound is not below the keep-th best simulated step are
// left out: they cannot enter the first `keep` places, so those (and the best) are exactly what
// simulating every layout gives. `exhaustive` simulates every layout.
#pragma once
#include <string>
#include <vector>

#include "cai/config/config.h"
#include "cluster.h"
#include "replay.h"

namespace cai::sim {

struct Candidate {
  config::TrainConfig config;  // the layout as a vit_train config (batch_size per dp rank)
  std::string layout;          // "dp 2 × pp 2 × tp 1d 2 (sp), zero 1, m 4, checkpointing"
  double step_ms = 0, img_per_s = 0, bubble = 0;
  double bound_ms = 0;         // step_lower_bound
  int64_t peak_mem_bytes = 0;  // the plan's largest predicted peak over the ranks
  int64_t host_mem_bytes = 0;  // ZeRO-Offload: the plan's largest host memory over the ranks
};

struct SearchOptions {
  int keep = 10;            // places that must be exact (at least 1)
  bool exhaustive = false;  // simulate every layout that fits
  ReplayOptions replay;     // the bulk model (the bound holds for it)
};

struct SearchResult {
  std::vector<Candidate> ranked;  // simulated layouts, fastest first
  int considered = 0, invalid = 0, too_big = 0;
  // Fit the GPU but not the cluster's host memory per GPU (ZeRO-Offload's host state; counted
  // among the refusals too).
  int host_too_big = 0;
  int simulated = 0, bounded = 0;  // bounded: fit but left out by the bound
  double wall_s = 0;
  // Where the search started: the config's own layout ("pp 4 × tp 1d 4, zero 1, 1f1b m 8"), the
  // processes one replica of it needs, and the global batch every candidate keeps with how it
  // was derived from the config ("train.batch_size 64 × 1 replica").
  std::string base_layout;
  int base_processes = 1;
  int64_t global_batch = 0;
  std::string global_batch_from;
  // Why candidates were refused: each distinct first line of the error, with its count, most
  // frequent first.
  std::vector<std::pair<std::string, int>> refusals;
};

// `base`: the config whose model, data, optimizer, precision and global batch are kept; its
// parallel section is only the starting point (it need not divide nproc). The global batch is
// batch_size × gradient_accumulation × the config's data-parallel size on nproc processes when
// its tensor × pipeline size divides nproc, else one replica's (batch_size ×
// gradient_accumulation); each candidate takes global / its dp samples per data-parallel rank.
// Throws when nothing fits, naming the most frequent reasons.
SearchResult search_layouts(const config::TrainConfig& base, int nproc, const Cluster& cluster,
                            const SearchOptions& opt = {});

// One line for the top of the ranking: the config's layout, that every layout of nproc
// processes was searched from it, and the global batch kept.
std::string search_start_line(const SearchResult& r, int nproc);

// The header of the --out file: the pick, the config's layout it replaced, the global batch and
// the command that runs it ("# " lines).
std::string search_out_header(const SearchResult& r, int nproc, const std::string& cluster);

}  // namespace cai::sim
