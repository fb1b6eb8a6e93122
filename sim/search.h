// Layout search: every dp × pp × tensor 1D size (± sequence parallelism) × ZeRO stage ×
// micro-batch count × activation checkpointing of a vit_train config on N processes that
// vit_train accepts, keeps the global batch, and fits the cluster's GPU memory by the plan's
// predicted peak, ranked by simulated throughput (workload_from_config + replay).
#pragma once
#include <string>
#include <vector>

#include "cluster.h"
#include "config.h"

namespace cai::sim {

struct Candidate {
  app::TrainConfig config;  // the layout as a vit_train config (batch_size per dp rank)
  std::string layout;       // "dp 2 × pp 2 × tp 1d 2 (sp), zero 1, m 4, ckpt"
  double step_ms = 0, img_per_s = 0, bubble = 0;
  int64_t peak_mem_bytes = 0;  // the plan's largest predicted peak over the ranks
};

struct SearchResult {
  std::vector<Candidate> ranked;  // fitting layouts, fastest first
  int considered = 0, invalid = 0, too_big = 0;
  double wall_s = 0;
};

// `base`: the config whose model, data, optimizer and global batch (batch_size × its dp size on
// nproc) are kept. Throws when nothing fits.
SearchResult search_layouts(const app::TrainConfig& base, int nproc, const Cluster& cluster);

}  // namespace cai::sim
