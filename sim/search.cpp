#include "search.h"

#include <algorithm>
#include <chrono>
#include <map>

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

// "dp 2 × pp 2 × tp 1d 2 (sp), zero 1, 1f1b m 4, checkpointing" (dp left out when 0: a layout
// that does not divide the processes has none).
std::string describe_layout(const config::TrainConfig& c, int64_t dp) {
  const TensorChoice tc{c.tensor_size == 1 ? "none" : c.tensor_mode,
                        static_cast<int>(c.tensor_depth), c.sequence_parallel};
  std::string pipe;
  if (c.pipeline > 1) {
    const std::string chunks =
        c.num_model_chunks > 1 ? fmt::format(" ×{}", c.num_model_chunks) : "";
    const std::string m = c.num_microbatches > 0 ? fmt::format(" m {}", c.num_microbatches)
                          : c.microbatch_size > 0
                              ? fmt::format(" micro-batch {}", c.microbatch_size)
                              : "";
    pipe = fmt::format(", {}{}{}", c.pp_style, chunks, m);
  }
  const std::string accumulate =
      c.pipeline == 1 && c.gradient_accumulation > 1
          ? fmt::format(", accumulation {} × {}", c.gradient_accumulation, c.batch_size)
          : "";
  return fmt::format("{}pp {} × tp {}, zero {}{}{}{}{}", dp > 0 ? fmt::format("dp {} × ", dp) : "",
                     c.pipeline, tc.describe(static_cast<int>(c.tensor_size)), c.zero_stage,
                     c.cpu_offload && c.zero_stage > 0 ? " (offload)" : "", pipe, accumulate,
                     c.checkpoint ? ", checkpointing" : "");
}

void count_refusal(std::map<std::string, int>& reasons, const std::string& what) {
  ++reasons[what.substr(0, what.find('\n'))];
}

}  // namespace

std::string search_start_line(const SearchResult& r, int nproc) {
  return fmt::format(
      "config layout: {} ({} process{} a replica{}), the starting point: every layout of {} "
      "processes searched; global batch {} kept ({}), batch_size = {} / dp",
      r.base_layout, r.base_processes, r.base_processes == 1 ? "" : "es",
      nproc % r.base_processes == 0 ? "" : fmt::format(", which does not divide {}", nproc), nproc,
      r.global_batch, r.global_batch_from, r.global_batch);
}

std::string search_out_header(const SearchResult& r, int nproc, const std::string& cluster) {
  const Candidate& best = r.ranked.front();
  const int64_t dp = nproc / (best.config.tensor_size * best.config.pipeline);
  return fmt::format(
      "# The fastest layout colossalai-sim --search found for {} processes on {}:\n"
      "#   {} ({:.3f} ms a step simulated, {:.1f} img/s)\n"
      "# The config's own layout, {}, was the starting point.\n"
      "# This is the whole config: its [parallel] keys, model.checkpoint, train.batch_size and\n"
      "# train.gradient_accumulation are the pick's, every other key is the config's.\n"
      "# Global batch {} ({}) = batch_size {} × gradient_accumulation {} × dp {}.\n"
      "# Run: colossalai run --nproc_per_node {} vit_train --config THIS_FILE\n",
      nproc, cluster, best.layout, best.step_ms, best.img_per_s, r.base_layout, r.global_batch,
      r.global_batch_from, best.config.batch_size, best.config.gradient_accumulation, dp, nproc);
}

SearchResult search_layouts(const config::TrainConfig& base, int nproc, const Cluster& cluster,
                            const SearchOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  // The config's parallel section is where the search starts, not a constraint: its layout need
  // not fit nproc. The global batch kept is the one it has on nproc processes (batch_size ×
  // gradient_accumulation × its data-parallel size there), or one replica's when its layout does
  // not divide nproc.
  CAI_CHECK(nproc >= 1, "[search] --nproc {} must be at least 1", nproc);
  CAI_CHECK(nproc <= cluster.max_ranks(),
            "[search] {} processes do not fit cluster {}: it has {} GPUs × {} rank(s) each = {}",
            nproc, cluster.name, cluster.gpus(), cluster.max_ranks_per_gpu, cluster.max_ranks());
  const nn::ViTConfig vc = base.vit();
  SearchResult out;
  out.base_processes = static_cast<int>(base.tensor_size * base.pipeline);
  const bool base_fits = nproc % out.base_processes == 0;
  const int64_t base_dp = base_fits ? nproc / out.base_processes : 1;
  const int64_t global = base.batch_size * base_dp * base.gradient_accumulation;
  out.base_layout = describe_layout(base, base_fits ? base_dp : 0);
  out.global_batch = global;
  out.global_batch_from = fmt::format(
      "train.batch_size {}{} × {}", base.batch_size,
      base.gradient_accumulation > 1
          ? fmt::format(" × gradient_accumulation {}", base.gradient_accumulation)
          : "",
      base_fits ? fmt::format("dp {} of the config's layout on {} processes", base_dp, nproc)
                : std::string("1 replica, as the config's layout does not fit"));
  std::map<std::string, int> reasons;
  int64_t smallest_too_big = 0;  // the least memory a layout over the limit asked for
  std::string smallest_too_big_layout;
  const int layers = static_cast<int>(vc.depth) + 2;
  // Every layout that runs and fits, with its bound.
  std::vector<Candidate> fit;
  for (int tp : divisors(nproc))
    for (const TensorChoice& tc : tensor_choices(tp))
      for (int pp : divisors(nproc / tp)) {
        if (pp > layers) continue;
        const int dp = nproc / (tp * pp);
        if (global % dp != 0) {
          ++out.considered;
          ++out.invalid;
          count_refusal(reasons, fmt::format("[search] the global batch {} does not split into "
                                             "{} equal data-parallel parts",
                                             global, dp));
          continue;
        }
        const int64_t per_dp = global / dp;
        std::vector<int> zeros = pp > 1 ? std::vector<int>{0, 1} : std::vector<int>{0, 1, 2, 3};
        // One replica shards nothing; with offload, ZeRO moves its state to the host.
        if (dp == 1 && !base.cpu_offload) zeros = {0};
        std::vector<int> mbs = {1};
        if (pp > 1) mbs = {pp, 2 * pp, 4 * pp};
        // Without a pipeline, gradient accumulation: the per-dp batch in 1, 2, 4, 8 or 16
        // micro-batches where it divides (the global batch kept); pipelines split it into their
        // micro-batches instead.
        std::vector<int64_t> accumulations = {1};
        if (pp == 1)
          for (int64_t a : {2, 4, 8, 16})
            if (per_dp % a == 0) accumulations.push_back(a);
        // Every schedule style: GPipe, 1F1B, interleaved 1F1B with 2 or 4 model chunks per stage
        // (vit_train's checks refuse the chunk counts the layers do not fill), and the
        // zero-bubble ZB-H1 and ZB-V (2 chunks in a V; the executor's split backward runs them).
        std::vector<std::pair<std::string, int>> schedules = {{"1f1b", 1}};
        if (pp > 1)
          schedules = {{"gpipe", 1},       {"1f1b", 1}, {"interleaved", 2},
                       {"interleaved", 4}, {"zbh1", 1}, {"zbv", 2}};
        for (int zero : zeros)
          for (int m : mbs)
            for (const auto& [style, chunks] : schedules)
              for (int64_t acc : accumulations) {
                if (m > per_dp) continue;
                if (chunks * pp > layers) continue;
                for (int ck = 0; ck <= 1; ++ck) {
                  config::TrainConfig c = base;
                  c.tensor_mode = tc.mode;
                  c.tensor_size = tp;
                  c.tensor_depth = tc.depth;
                  c.sequence_parallel = tc.sp;
                  c.pipeline = pp;
                  c.split_backward = base.split_backward && pp > 1;
                  c.pp_style = style;
                  c.num_model_chunks = chunks;
                  c.num_layers_per_stage.clear();
                  c.num_microbatches = pp > 1 ? m : 0;
                  c.microbatch_size = 0;
                  c.zero_stage = zero;
                  c.checkpoint = ck != 0;
                  c.explicitly_set.insert("model.checkpoint");
                  c.batch_size = per_dp / acc;
                  c.gradient_accumulation = acc;
                  c.explicitly_set.insert("train.gradient_accumulation");
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
                      if (smallest_too_big == 0 || cand.peak_mem_bytes < smallest_too_big) {
                        smallest_too_big = cand.peak_mem_bytes;
                        smallest_too_big_layout = describe_layout(c, dp);
                      }
                      continue;
                    }
                    // ZeRO-Offload's host state must fit the host's memory per GPU.
                    for (const plan::RankPlan& st : plan.stages)
                      cand.host_mem_bytes = std::max(cand.host_mem_bytes, st.memory.host);
                    if (cluster.host.memory_bytes > 0 &&
                        cand.host_mem_bytes > cluster.host.memory_bytes) {
                      ++out.host_too_big;
                      count_refusal(reasons,
                                    fmt::format("[search] offload's host state above the {:.1f} "
                                                "GiB of host memory per GPU",
                                                static_cast<double>(cluster.host.memory_bytes) /
                                                    double(1ull << 30)));
                      continue;
                    }
                    cand.bound_ms =
                        step_lower_bound(c, nproc, cluster, opt.replay.calibration, &plan) * 1e3;
                  } catch (const Error& e) {
                    ++out.invalid;  // a layout vit_train refuses (shapes that do not divide, ...)
                    count_refusal(reasons, e.what());
                    continue;
                  }
                  cand.layout = describe_layout(c, dp);
                  cand.config = std::move(c);
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
    } catch (const Error& e) {
      ++out.invalid;
      count_refusal(reasons, e.what());
      continue;
    }
    ++out.simulated;
    best.insert(std::upper_bound(best.begin(), best.end(), cand.step_ms), cand.step_ms);
    out.ranked.push_back(std::move(cand));
  }
  std::stable_sort(out.ranked.begin(), out.ranked.end(),
                   [](const Candidate& a, const Candidate& b) { return a.step_ms < b.step_ms; });
  out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.refusals.assign(reasons.begin(), reasons.end());
  std::stable_sort(out.refusals.begin(), out.refusals.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string why;
  for (size_t i = 0; i < out.refusals.size() && i < 3; ++i)
    why += fmt::format("\n  {}× {}", out.refusals[i].second, out.refusals[i].first);
  if (out.refusals.size() > 3)
    why += fmt::format("\n  ... and {} other reasons", out.refusals.size() - 3);
  const auto gib = [](int64_t b) { return static_cast<double>(b) / double(1ull << 30); };
  CAI_CHECK(
      !out.ranked.empty(),
      "[search] no layout of {} processes fits (the config's layout: {}; global batch {}): "
      "{} considered, {} refused by vit_train's checks, {} above the {:.1f} GiB of a {}{}{}{}",
      nproc, out.base_layout, global, out.considered, out.invalid, out.too_big,
      gib(cluster.gpu.memory_bytes), cluster.gpu.model,
      smallest_too_big > 0 ? fmt::format(" (the smallest, {}, needs {:.1f} GiB)",
                                         smallest_too_big_layout, gib(smallest_too_big))
                           : "",
      why.empty() ? "" : "; the most frequent refusals:", why);
  return out;
}

}  // namespace cai::sim
