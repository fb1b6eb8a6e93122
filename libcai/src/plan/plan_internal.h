// Internal to libcai/src/plan: what plan.cpp (the per-layer costs) and plan_memory.cpp (the
// step replay's memory timeline) share. Not installed.
#pragma once

#include <cstdint>
#include <string>

#include "cai/plan/plan.h"

namespace cai::plan::detail {

struct Shapes {
  int64_t b, n, nr, d, dt, heads, hid, k, np, patch;
  // lr: the residual stream's rows on this rank (b·nr, or b/T·n when sequence parallelism cuts
  // by samples: nn::TensorParallel::seq_part).
  int64_t lr;
  int T;
  bool tp, sp, fused;
  bool sp_samples;  // sequence parallel, cut by samples (no staging copies)
  int64_t e;        // compute dtype bytes
  int64_t es;       // bytes a half tensor travels in on the CPU (widened to fp32) or as is
};

// The per-rank tensor shapes of a micro-batch of b rows on tensor-parallel rank r.
Shapes shapes_of(const nn::ViTConfig& c, const Layout& l, int64_t b, int r);
// Optimizer state slots per parameter (sgd: 0 or 1, the adams and lamb: 2).
int optimizer_slots(const Layout& l);
// The step replay: fills r.memory (live bytes of one rank over its program).
void replay(const StepPlan& plan, RankPlan& r);

// Plan ops that move bytes without FLOPs (plan_copies.cpp): sequence parallelism's token copies
// (the reduce-scatter after fc2 named apart: a checkpointed block does not recompute it), 2d /
// 2.5d SUMMA linears' partial sums, casts and staging, the split LayerNorm's extra passes.
inline constexpr const char* kSpTokensCopy = "sp.tokens_copy";
inline constexpr const char* kSpTokensCopyOut = "sp.tokens_copy_out";
inline constexpr const char* kNdCopies = "nd.copies";
using plan::kNdLnPasses;  // cai/plan/plan.h
// regather: backward gathers the normalised inputs again (no checkpointing).
void add_sequence_parallel_copies(LayerPlan& p, const Layout& l, const Shapes& s, bool regather);
OpCost summa_linear_copies(const std::string& layer, int64_t rows, int64_t I, int64_t O, int q,
                           Phase ph, int64_t e, bool grad_fp32);

}  // namespace cai::plan::detail
