// The device copies a step makes beside its GEMMs and collectives, as plan ops that move bytes
// without FLOPs (the simulator times them at the profile's measured streaming bandwidth):
// sequence parallelism's token staging and SUMMA's partial sums, casts and staging.
#include "plan_internal.h"

namespace cai::plan::detail {

// The device copies around a block's sequence-parallel collectives (bytes read and written, and
// the calls), as nn::TensorParallel makes them. Cut by samples (a micro-batch divisible by the
// group) none but the casts below; cut by tokens every collective moves a rank-major staging
// buffer, permuted from or into [batch, tokens, features] by one kernel (ops::tokens_from_ranks_
// / tokens_to_ranks_; kernels/tokens.h), packed on the CPU, padded on a GPU (every rank's block
// as long as the largest, so NCCL's even-count collectives copy nothing themselves):
// - a gather's permutation reads and writes the whole tensor; on a GPU a rank holding fewer than
//   the largest count of tokens (tokens % T != 0) first copies its part into a padded buffer;
// - a reduce-scatter's permutation reads the whole tensor and writes the staging buffer, padding
//   included (zeroed); its result is the head of a padded output (a view: no copy).
// - in half precision the fp32 output gradients of fc2 and proj are cast to the compute dtype
//   on this rank's part before they are gathered (Block::backward), where without sequence
//   parallelism the next block hands over a half copy made in its LayerNorm pass.
// Forward: the two gathers and proj's reduce-scatter (recomputed under checkpointing) and fc2's
// reduce-scatter (kSpTokensCopyOut: not recomputed); backward: the two output-gradient
// gathers, without checkpointing the two re-gathers of the normalised inputs, the casts and the
// two input-gradient reduce-scatters.
void add_sequence_parallel_copies(LayerPlan& p, const Layout& l, const Shapes& s, bool regather) {
  const int64_t full = s.b * s.n * s.d, part = s.lr * s.d;
  const bool cast = l.gpu && s.e != 4;
  if (s.sp_samples) {
    // Cut by samples (nn::TensorParallel::seq_part): the collectives move the tensors as they
    // are; only the casts of the output gradients remain.
    if (cast)
      p.ops.push_back(
          {p.name, kSpTokensCopy, Phase::Backward, 0.0, 2 * part * 4, 2 * part * s.e, 2});
    return;
  }
  const int64_t most = s.b * ((s.n + s.T - 1) / s.T) * s.d;
  const bool padded = l.gpu;
  const bool short_part = padded && part < most;
  struct Moved {
    int64_t bytes = 0, calls = 0;
    Moved& operator+=(const Moved& o) {
      bytes += o.bytes, calls += o.calls;
      return *this;
    }
  };
  // One gather / reduce-scatter of `es`-byte elements.
  auto gather = [&](int64_t es) {
    return Moved{2 * full * es + (short_part ? 2 * part * es : 0), short_part ? 2 : 1};
  };
  auto scatter = [&](int64_t es) {
    return Moved{full * es + (padded ? s.T * most : full) * es, 1};
  };
  auto times = [](int k, Moved m) { return Moved{k * m.bytes, k * m.calls}; };
  auto add = [&](const char* op, Phase ph, Moved m) {
    p.ops.push_back({p.name, op, ph, 0.0, m.bytes / 2, m.bytes - m.bytes / 2, m.calls});
  };
  Moved fwd = times(2, gather(s.es));
  fwd += scatter(s.es);
  add(kSpTokensCopy, Phase::Forward, fwd);
  add(kSpTokensCopyOut, Phase::Forward, scatter(s.es));
  Moved bwd = times(2, gather(s.es));
  if (regather) bwd += times(2, gather(s.es));
  bwd += times(2, scatter(s.es));
  if (cast) bwd += Moved{2 * part * (4 + s.e), 2};
  add(kSpTokensCopy, Phase::Backward, bwd);
}

// The device work of SUMMA's nd_linear_fwd / nd_linear_bwd beside its GEMMs on `rows` rows of
// local I x O blocks (bytes read, written): the weight cast to the compute dtype (weight_as) each
// call; forward: q GEMMs writing fp32 partials (a GEMM of the compute dtype writes e bytes),
// q - 1 adds into the sum, the sum cast back; backward: the output gradient cast when it comes
// in fp32 (`grad_fp32`), q input-gradient partials copied into the reduce-scatter's staging
// buffer, the q weight-gradient partials zeroed, the reduced weight gradient added to the
// parameter's.
OpCost summa_linear_copies(const std::string& layer, int64_t rows, int64_t I, int64_t O, int q,
                           Phase ph, int64_t e, bool grad_fp32) {
  const bool half = e != 4;
  int64_t rd = 0, wr = 0;
  if (half) rd += O * I * 4, wr += O * I * e;
  if (ph != Phase::Backward) {
    if (half) wr += q * rows * O * (4 - e);
    rd += (q - 1) * 2 * rows * O * 4, wr += (q - 1) * rows * O * 4;
    if (half) rd += rows * O * 4, wr += rows * O * e;
  } else {
    if (half && grad_fp32) rd += rows * O * 4, wr += rows * O * e;
    rd += q * rows * I * e, wr += q * rows * I * e;
    wr += q * O * I * 4;
    rd += 2 * O * I * 4, wr += O * I * 4;
  }
  return {layer, kNdCopies, ph, 0.0, rd, wr};
}

}  // namespace cai::plan::detail
