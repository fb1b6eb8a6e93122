#include "search.h"

#include <algorithm>
#include <chrono>

#include "cai/core/error.h"
#include "cai/nn/tensor_parallel.h"
#include "from_config.h"

namespace cai::sim {

namespace {

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// A tensor layout of one size: mode, depth (2.5d), sequence parallelism (1d).
struct TensorChoice {
  std::string mode;
  int depth = 1;
  bool sp = false;
  std::string describe(int size) const {
    if (mode == "none") return "1";
    if (mode == "2.5d") return fmt::format("2.5d {} (depth {})", size, depth);
    return fmt::format("{} {}{}", mode, size, sp ? " (sp)" : "");
  }
};

std::vector<TensorChoice> tensor_choices(int size) {
  if (size == 1) return {{"none", 1, false}};
  std::vector<TensorChoice> out;
  for (const auto& m : nn::TensorParallel::modes_for(size)) {
    out.push_back({m.mode, m.depth, false});
    if (m.mode == "1d") out.push_back({m.mode, m.depth, true});
  }
  return out;
}

}  // namespace

SearchResult search_layouts(const config::TrainConfig& base, int nproc, const Cluster& cluster,
                            const SearchOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  // The config's parallel section is where the search starts, not a constraint: its layout need
  // not fit nproc. The global batch kept is the one it has on nproc processes (batch_size × its
  // data-parallel size there, at least one replica).
  const nn::ViTConfig vc = base.vit();
  const int64_t base_dp = std::max<int64_t>(1, nproc / (base.tensor_size * base.pipeline));
  const int64_t global = base.batch_size * base_dp * base.gradient_accumulation;
  const int layers = static_cast<int>(vc.depth) + 2;
  SearchResult out;
  // Every layout that runs and fits, with its bound.
  std::vector<Candidate> fit;
  for (int tp : divisors(nproc))
    for (const TensorChoice& tc : tensor_choices(tp))
      for (int pp : divisors(nproc / tp)) {
        if (pp > layers) continue;
        const int dp = nproc / (tp * pp);
        if (global % dp != 0) continue;
        const int64_t per_dp = global / dp;
        std::vector<int> zeros = pp > 1 ? std::vector<int>{0, 1} : std::vector<int>{0, 1, 2, 3};
        if (dp == 1) zeros = {0};
        std::vector<int> mbs = {1};
        if (pp > 1) mbs = {pp, 2 * pp, 4 * pp};
        // Every schedule style: GPipe, 1F1B, interleaved 1F1B with 2 or 4 model chunks per stage
        // (vit_train's checks refuse the chunk counts the layers do not fill), and the
        // zero-bubble ZB-H1 and ZB-V (2 chunks in a V; the executor's split backward runs them).
        std::vector<std::pair<std::string, int>> schedules = {{"1f1b", 1}};
        if (pp > 1)
          schedules = {{"gpipe", 1},       {"1f1b", 1}, {"interleaved", 2},
                       {"interleaved", 4}, {"zbh1", 1}, {"zbv", 2}};
        for (int zero : zeros)
          for (int m : mbs)
            for (const auto& [style, chunks] : schedules) {
              if (m > per_dp) continue;
              if (chunks * pp > layers) continue;
              for (int ck = 0; ck <= 1; ++ck) {
                config::TrainConfig c = base;
                c.tensor_mode = tc.mode;
                c.tensor_size = tp;
                c.tensor_depth = tc.depth;
                c.sequence_parallel = tc.sp;
                c.pipeline = pp;
                c.pp_style = style;
                c.num_model_chunks = chunks;
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
                  config::validate(c, nproc);
                  const plan::StepPlan plan =
                      plan::make_plan(c.vit(), config::plan_layout(c, nproc));
                  cand.peak_mem_bytes = plan.peak();
                  if (cand.peak_mem_bytes > cluster.gpu.memory_bytes) {
                    ++out.too_big;
                    continue;
                  }
                  cand.bound_ms =
                      step_lower_bound(c, nproc, cluster, opt.replay.calibration, &plan) * 1e3;
                } catch (const Error&) {
                  ++out.invalid;  // a layout vit_train refuses (shapes that do not divide, ...)
                  continue;
                }
                cand.config = std::move(c);
                cand.layout = fmt::format(
                    "dp {} × pp {} × tp {}, zero {}{}{}", dp, pp, tc.describe(tp), zero,
                    pp > 1 ? fmt::format(", {}{} m {}", style,
                                         chunks > 1 ? fmt::format(" ×{}", chunks) : "", m)
                           : "",
                    ck ? ", checkpointing" : "");
                fit.push_back(std::move(cand));
              }
            }
      }
  // Best first: simulate in the order of the bounds until no bound can beat the keep-th best.
  std::stable_sort(fit.begin(), fit.end(),
                   [](const Candidate& a, const Candidate& b) { return a.bound_ms < b.bound_ms; });
  const size_t keep = static_cast<size_t>(std::max(opt.keep, 1));
  std::vector<double> best;  // simulated step times, sorted
  for (size_t i = 0; i < fit.size(); ++i) {
    Candidate& cand = fit[i];
    if (!opt.exhaustive && best.size() >= keep && cand.bound_ms >= best[keep - 1]) {
      out.bounded = static_cast<int>(fit.size() - i);
      break;
    }
    try {
      const ConfigWorkload cw = workload_from_config(cand.config, nproc, cluster);
      const ReplayResult r = replay(cw.workload, cluster, opt.replay);
      cand.step_ms = r.step_s * 1e3;
      cand.img_per_s = r.img_per_s;
      cand.bubble = r.bubble_mean;
    } catch (const Error&) {
      ++out.invalid;
      continue;
    }
    ++out.simulated;
    best.insert(std::upper_bound(best.begin(), best.end(), cand.step_ms), cand.step_ms);
    out.ranked.push_back(std::move(cand));
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
