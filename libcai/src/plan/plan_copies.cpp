// The device copies a step makes beside its GEMMs and collectives, as plan ops that move bytes
// without FLOPs (the simulator times them at the profile's measured streaming bandwidth):
// sequence parallelism's token staging and SUMMA's partial sums, casts and staging.
#include "plan_internal.h"

namespace cai::plan::detail {

// The device copies around a block's sequence-parallel collectives (bytes read and written), as
// nn::TensorParallel and the communicator make them:
// - gather_tokens copies the gathered [batch, tokens, features] out of the rank-major staging
//   buffer, reduce_scatter_tokens copies its input into one (ops::copy_tokens_: the whole tensor);
// - NCCL (GPU) with uneven token counts (tokens % T != 0) pads every rank's block to the largest:
//   an all-gather copies this rank's part in and the whole result out, a reduce-scatter the whole
//   input in and this rank's part out (nccl_communicator.cpp, cudaMemcpyAsync on its stream);
// - in half precision the gathered fp32 output gradients are cast to the compute dtype by
//   fc2's and proj's backward GEMMs (ops::linear_bwd: `as(dy, t)`), where without sequence
//   parallelism the next block hands over a half copy made in its LayerNorm pass.
// Forward: the two gathers and proj's reduce-scatter (recomputed under checkpointing) and fc2's
// reduce-scatter (kSpTokensCopyOut: not recomputed); backward: the two fp32 gathers, the casts
// and the two input-gradient reduce-scatters.
void add_sequence_parallel_copies(LayerPlan& p, const Layout& l, const Shapes& s) {
  const int64_t full = s.b * s.n * s.d, part = s.b * s.nr * s.d;
  const bool uneven = l.gpu && s.n % s.T != 0;
  // Bytes moved by one gather (reduce-scatter: the same, mirrored) of `es`-byte elements.
  auto moved = [&](int64_t es) { return 2 * full * es + (uneven ? 2 * (full + part) * es : 0); };
  auto add = [&](const char* op, Phase ph, int64_t bytes) {
    p.ops.push_back({p.name, op, ph, 0.0, bytes / 2, bytes - bytes / 2});
  };
  add(kSpTokensCopy, Phase::Forward, 3 * moved(s.es));
  add(kSpTokensCopyOut, Phase::Forward, moved(s.es));
  const bool cast = l.gpu && s.e != 4;
  add(kSpTokensCopy, Phase::Backward,
      2 * moved(4) + 2 * moved(s.es) + (cast ? 2 * full * (4 + s.e) : 0));
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
