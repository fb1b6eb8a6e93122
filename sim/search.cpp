#include "search.h"

#include <algorithm>
#include <chrono>

#include "cai/core/error.h"
#include "from_config.h"
#include "replay.h"

namespace cai::sim {

namespace {
std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}
}  // namespace

SearchResult search_layouts(const app::TrainConfig& base, int nproc, const Cluster& cluster) {
  const auto t0 = std::chrono::steady_clock::now();
  app::validate(base, nproc);
  const nn::ViTConfig vc = base.vit();
  const int64_t base_dp = nproc / (base.tensor_size * base.pipeline);
  const int64_t global = base.batch_size * base_dp * base.gradient_accumulation;
  const int layers = static_cast<int>(vc.depth) + 2;
  SearchResult out;
  for (int tp : divisors(nproc)) {
    for (int sp = 0; sp <= (tp > 1 ? 1 : 0); ++sp) {
      for (int pp : divisors(nproc / tp)) {
        if (pp > layers) continue;
        const int dp = nproc / (tp * pp);
        if (global % dp != 0) continue;
        const int64_t per_dp = global / dp;
        std::vector<int> zeros = pp > 1 ? std::vector<int>{0, 1} : std::vector<int>{0, 1, 2, 3};
        if (dp == 1) zeros = {0};
        std::vector<int> mbs = {1};
        if (pp > 1) mbs = {pp, 2 * pp, 4 * pp};
        for (int zero : zeros)
          for (int m : mbs) {
            if (m > per_dp) continue;
            for (int ck = 0; ck <= 1; ++ck) {
              app::TrainConfig c = base;
              c.tensor_mode = tp > 1 ? "1d" : "none";
              c.tensor_size = tp;
              c.sequence_parallel = sp != 0;
              c.pipeline = pp;
              c.pp_style = "1f1b";
              c.num_model_chunks = 1;
              c.num_layers_per_stage.clear();
              c.num_microbatches = pp > 1 ? m : 0;
              c.microbatch_size = 0;
              c.zero_stage = zero;
              c.checkpoint = ck != 0;
              c.explicitly_set.insert("model.checkpoint");
              c.batch_size = per_dp;
              c.gradient_accumulation = 1;
              if (c.cpu_offload && zero == 0) c.cpu_offload = false;
              ++out.considered;
              Candidate cand;
              try {
                ConfigWorkload cw = workload_from_config(c, nproc, cluster);
                cand.peak_mem_bytes = cw.plan.peak();
                if (cand.peak_mem_bytes > cluster.gpu.memory_bytes) {
                  ++out.too_big;
                  continue;
                }
                const ReplayResult r = replay(cw.workload, cluster);
                cand.step_ms = r.step_s * 1e3;
                cand.img_per_s = r.img_per_s;
                cand.bubble = r.bubble_mean;
              } catch (const Error&) {
                ++out.invalid;  // a layout vit_train refuses (shapes that do not divide, ...)
                continue;
              }
              cand.config = c;
              cand.layout = fmt::format(
                  "dp {} × pp {} × tp {}{}, zero {}{}{}", dp, pp, tp, sp ? " (sp)" : "", zero,
                  pp > 1 ? fmt::format(", m {}", m) : "", ck ? ", checkpointing" : "");
              out.ranked.push_back(std::move(cand));
            }
          }
      }
    }
  }
  std::stable_sort(out.ranked.begin(), out.ranked.end(),
                   [](const Candidate& a, const Candidate& b) { return a.step_ms < b.step_ms; });
  out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CAI_CHECK(!out.ranked.empty(),
            "[search] no layout of {} processes fits: {} considered, {} refused by vit_train's "
            "checks, {} above the {} GiB of a {}",
            nproc, out.considered, out.invalid, out.too_big,
            static_cast<double>(cluster.gpu.memory_bytes) / double(1ull << 30), cluster.gpu.model);
  return out;
}

}  // namespace cai::sim
