#include "cai/plan/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "cai/core/error.h"
#include "cai/schedule/buckets.h"
#include "plan_internal.h"

namespace cai::plan {

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::Forward:
      return "forward";
    case Phase::Backward:
      return "backward";
    case Phase::Recompute:
      return "recompute";
    case Phase::OptimizerStep:
      return "optimizer step";
  }
  return "?";
}

const char* collective_name(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::AllReduce:
      return "all-reduce";
    case CollectiveKind::ReduceScatter:
      return "reduce-scatter";
    case CollectiveKind::AllGather:
      return "all-gather";
    case CollectiveKind::Broadcast:
      return "broadcast";
    case CollectiveKind::Send:
      return "send";
    case CollectiveKind::Recv:
      return "recv";
  }
  return "?";
}

const char* body_name(Body b) {
  return b == Body::ViT ? "vit" : b == Body::Blocks ? "blocks" : "linears";
}

const char* group_name(Group g) {
  return g == Group::Tp ? "tp" : g == Group::Pp ? "pp" : "dp";
}

void Layout::validate(const nn::ViTConfig& m) const {
  m.validate();
  CAI_CHECK(world >= 1 && tp >= 1 && pp >= 1 && world % (tp * pp) == 0,
            "[plan] {} processes are not divisible by tensor size {} × pipeline {}", world, tp, pp);
  CAI_CHECK(zero_stage >= 0 && zero_stage <= 3, "[plan] zero_stage {} is not 0, 1, 2 or 3",
            zero_stage);
  CAI_CHECK(pp == 1 || zero_stage <= 1,
            "[plan] zero_stage {} with pipeline {}: pipeline stages combine with ZeRO 0 or 1",
            zero_stage, pp);
  CAI_CHECK(!cpu_offload || zero_stage >= 1, "[plan] cpu_offload needs zero_stage >= 1");
  CAI_CHECK(!sequence_parallel || tp > 1, "[plan] sequence_parallel needs tp > 1 (got {})", tp);
  CAI_CHECK(tokens >= 0, "[plan] tokens {} must be >= 0 (0: the ViT's patches + 1)", tokens);
  if (body != Body::ViT) {
    CAI_CHECK(tokens >= 1, "[plan] a {} step needs tokens >= 1 (the sequence length)",
              body_name(body));
    CAI_CHECK(pp == 1 && zero_stage == 0 && !cpu_offload && gradient_accumulation == 1,
              "[plan] a {} step runs forward and backward only: pipeline {}, zero_stage {}, "
              "cpu_offload and gradient_accumulation {} are for whole ViTs",
              body_name(body), pp, zero_stage, gradient_accumulation);
  }
  if (body == Body::Linears) {
    // ParallelLinear: 1d cuts the features by tp (no sequence-parallel form); 2d/2.5d/3d by the
    // grid (3d: a linear's input features by q²).
    CAI_CHECK(!sequence_parallel, "[plan] Linear layers have no sequence-parallel form");
    const nn::TensorParallel::Grid g = tp > 1 && tp_mode != "1d"
                                           ? nn::TensorParallel::grid(tp_mode, tp, tp_depth)
                                           : nn::TensorParallel::Grid{tp, 1, tp};
    CAI_CHECK(m.embed_dim % g.in_cut == 0 && m.embed_dim % g.q == 0,
              "[plan] Linear({0}, {0}) does not split over tensor {1} ({2}): {0} is not divisible "
              "by {3}",
              m.embed_dim, tp, tp_mode, g.in_cut);
  } else if (tp > 1) {
    m.validate_tensor_parallel(tp_mode, tp, tp_depth, sequence_parallel);
  }
  CAI_CHECK(tp > 1 || (tp_mode == "1d" && tp_depth == 1),
            "[plan] tensor mode {} (depth {}) needs tp > 1", tp_mode, tp_depth);
  CAI_CHECK(batch >= 1 && gradient_accumulation >= 1,
            "[plan] batch {} and gradient_accumulation {} must be at least 1", batch,
            gradient_accumulation);
  CAI_CHECK(pp == 1 || gradient_accumulation == 1,
            "[plan] gradient_accumulation {} with pipeline {}: accumulate through micro-batches",
            gradient_accumulation, pp);
  CAI_CHECK(precision == DType::F32 || precision == DType::BF16 || precision == DType::F16,
            "[plan] precision {} must be fp32, bf16 or fp16", dtype_name(precision));
  CAI_CHECK(zero_max_inflight_buckets >= 1 && zero3_prefetch >= 0,
            "[plan] zero_max_inflight_buckets {} must be >= 1 and zero3_prefetch {} >= 0",
            zero_max_inflight_buckets, zero3_prefetch);
  CAI_CHECK(allocator_overhead >= 0, "[plan] allocator_overhead {} must be >= 0",
            allocator_overhead);
}

namespace {

using detail::add_sequence_parallel_copies;
using detail::kSpTokensCopy;
using detail::kSpTokensCopyOut;
using detail::Shapes;
using detail::shapes_of;
using detail::summa_linear_copies;

// 2d/2.5d/3d: q, the batch chunks and the parts a linear's input features are cut in.
using NdDims = nn::TensorParallel::Grid;
NdDims nd_dims(const Layout& l) {
  return l.nd() ? nn::TensorParallel::grid(l.tp_mode, l.tp, l.tp_depth) : NdDims{};
}

std::vector<std::vector<int64_t>> parameter_numels(const nn::ViTConfig& c, int T);

// Parameter sizes per layer on one tensor-parallel rank, in collect() order (nn/vit.cpp).
std::vector<std::vector<int64_t>> parameter_numels(const nn::ViTConfig& c, const Layout& l) {
  if (!l.nd()) return parameter_numels(c, l.tp);
  const NdDims nd = nd_dims(l);
  const int64_t q = nd.q, d = c.embed_dim / q, dfull = c.embed_dim, hid = c.mlp_hidden() / q,
                hfull = c.mlp_hidden(), n = c.num_patches() + 1;
  // Weights [out/q, in/in_cut]; biases, norms and the embedding cut on features by q.
  const int64_t ic = nd.in_cut;
  std::vector<std::vector<int64_t>> out;
  out.push_back({d, n * d, d * c.in_chans * c.patch_size * c.patch_size, d});
  for (int64_t i = 0; i < c.depth; ++i)
    out.push_back({d, d, 3 * d * (dfull / ic), 3 * d, d * (dfull / ic), d, d, d, hid * (dfull / ic),
                   hid, d * (hfull / ic), d});
  out.push_back({d, d, c.num_classes * d, c.num_classes});
  return out;
}

std::vector<std::vector<int64_t>> parameter_numels(const nn::ViTConfig& c, int T) {
  const int64_t d = c.embed_dim, hid = c.mlp_hidden(), n = c.num_patches() + 1;
  std::vector<std::vector<int64_t>> out;
  out.push_back({d, n * d, d * c.in_chans * c.patch_size * c.patch_size, d});
  for (int64_t i = 0; i < c.depth; ++i)
    out.push_back(
        {d, d, 3 * d / T * d, 3 * d / T, d * d / T, d, d, d, hid / T * d, hid / T, d * hid / T, d});
  out.push_back({d, d, c.num_classes * d / T, c.num_classes});
  return out;
}

// What a layer costs for one micro-batch of `b` rows on tensor-parallel rank `r`.
}  // namespace

namespace detail {

int optimizer_slots(const Layout& l) {
  if (l.optimizer == "sgd") return l.momentum > 0 ? 1 : 0;
  CAI_CHECK(l.optimizer == "adam" || l.optimizer == "adamw" || l.optimizer == "hybrid_adam" ||
                l.optimizer == "lamb",
            "[plan] optimizer '{}' is not sgd, adam, adamw, hybrid_adam or lamb", l.optimizer);
  return 2;
}

Shapes shapes_of(const nn::ViTConfig& c, const Layout& l, int64_t b, int r) {
  Shapes s{};
  s.b = b;
  s.n = l.tokens > 0 ? l.tokens : c.num_patches() + 1;
  s.T = l.tp;
  s.tp = l.tp > 1;
  s.sp = s.tp && l.sequence_parallel;
  // nn::TensorParallel::seq_part: by samples when the micro-batch divides, else by tokens.
  s.sp_samples = s.sp && b % l.tp == 0;
  s.nr = s.sp && !s.sp_samples ? s.n * (r + 1) / l.tp - s.n * r / l.tp : s.n;
  s.lr = s.sp_samples ? b / l.tp * s.n : b * s.nr;
  s.d = c.embed_dim;
  s.dt = c.embed_dim / l.tp;
  s.heads = c.num_heads / l.tp;
  s.hid = c.mlp_hidden() / l.tp;
  s.k = c.num_classes;
  s.np = c.num_patches();
  s.patch = c.in_chans * c.patch_size * c.patch_size;
  s.e = static_cast<int64_t>(dtype_size(l.precision));
  const int64_t hd = c.embed_dim / c.num_heads;
  s.fused = l.gpu && l.precision != DType::F32 && hd >= 8 && hd <= 128 && hd % 8 == 0;
  s.es = l.gpu ? s.e : 4;
  if (l.nd()) {
    // 2d/2.5d/3d: this rank's batch chunk and features; no 1d collectives (added apart).
    const NdDims nd = nd_dims(l);
    CAI_CHECK(b % nd.chunks == 0,
              "[plan] tensor mode {} splits a micro-batch into {} chunks: {} samples do not divide",
              l.tp_mode, nd.chunks, b);
    s.b = b / nd.chunks;
    s.tp = s.sp = s.sp_samples = false;
    s.nr = s.n;
    s.lr = s.b * s.n;
    s.d = s.dt = c.embed_dim / nd.q;
    s.heads = c.num_heads / nd.q;
    s.hid = c.mlp_hidden() / nd.q;
  }
  return s;
}

}  // namespace detail

namespace {

void add_linear(LayerPlan& p, const std::string& op, int64_t rows, int64_t in, int64_t out,
                int64_t e) {
  const double f = 2.0 * rows * in * out;
  p.ops.push_back({p.name, op, Phase::Forward, f, (rows * in + in * out) * e, rows * out * e});
  p.ops.push_back({p.name, op, Phase::Backward, 2 * f, (2 * rows * in + rows * out + in * out) * e,
                   (rows * in + in * out) * e});
}

void add_elementwise(LayerPlan& p, const std::string& op, int64_t elems, double flops_per,
                     int64_t e) {
  p.ops.push_back({p.name, op, Phase::Forward, flops_per * elems, elems * e, elems * e});
  p.ops.push_back({p.name, op, Phase::Backward, 2 * flops_per * elems, 2 * elems * e, elems * e});
}

LayerPlan embedding_plan(const nn::ViTConfig& c, const Layout& l, const Shapes& s) {
  LayerPlan p;
  p.name = "embedding";
  const int64_t b = s.b, e = s.e;
  add_linear(p, "patch_embed.proj", b * s.np, s.patch, s.d, e);
  p.ops.pop_back();  // no input gradient for the images: the weight gradient only
  p.ops.push_back({p.name, "patch_embed.proj", Phase::Backward, 2.0 * b * s.np * s.patch * s.d,
                   (b * s.np * s.patch + b * s.np * s.d) * e, s.patch * s.d * 4});
  add_elementwise(p, "cls_pos", b * s.n * s.d, 1, 4);
  p.input = b * c.in_chans * c.img_size * c.img_size * 4;
  p.saved = b * s.np * s.patch * e;  // the patches
  p.output = s.lr * s.d * 4;
  // The patch embedding's output lives until cls_pos; sequence parallel: the whole sequence
  // before the rank's tokens are cut.
  p.forward_extra = b * s.np * s.d * e + (s.sp ? b * s.n * s.d * 4 : 0);
  p.backward_extra = (s.sp ? b * s.n * s.d * 4 : 0) + b * s.np * s.d * e;
  // On the CPU a half weight GEMM (ops::linear_bwd_weight) takes the patches and dt up to fp32.
  if (!l.gpu && l.precision != DType::F32) p.backward_extra += b * s.np * (s.patch + s.d) * 4;
  if (s.sp) {
    // TensorParallel::slice_tokens keeps this rank's tokens (a copy); pad_tokens puts their
    // gradient into a zeroed whole sequence.
    const int64_t part = s.lr * s.d * 4;
    p.ops.push_back({p.name, kSpTokensCopy, Phase::Forward, 0.0, part, part});
    p.ops.push_back({p.name, kSpTokensCopy, Phase::Backward, 0.0, part, b * s.n * s.d * 4 + part});
    const int64_t numel = s.d + s.n * s.d + s.d * s.patch + s.d;
    p.collectives.push_back({CollectiveKind::AllReduce, Group::Tp, s.T, numel * 4, p.name,
                             "parameter gradients", Phase::Backward});
    p.backward_extra += numel * 4;
  }
  // Split (nn::Embedding::backward, WeightGrads deferred): without sequence parallelism nothing
  // runs in the BackwardInput; the BackwardWeight makes the parameter gradients from the patches
  // and dy it kept. Sequence parallel: they are made and summed in the BackwardInput, the
  // BackwardWeight adds the summed buffer.
  if (s.sp) {
    p.split_backward_extra = p.backward_extra;
    p.weight_held = (s.d + s.n * s.d + s.d * s.patch + s.d) * 4;
  } else {
    p.weight_held = p.saved + p.output;
    p.weight_extra = p.backward_extra;
  }
  return p;
}

LayerPlan block_plan(const nn::ViTConfig& c, const Layout& l, const Shapes& s, int64_t index) {
  LayerPlan p;
  p.name = fmt::format("blocks.{}", index);
  const int64_t b = s.b, n = s.n, lr = s.lr, d = s.d, e = s.e;
  const int64_t rows = b * n;
  // FLOPs: 24·N·D² + 4·N²·D per sample forward without tensor parallelism.
  add_elementwise(p, "norm1", lr * d, 8, e);
  add_linear(p, "attn.qkv", rows, d, 3 * s.dt, e);
  const double attn = 4.0 * b * n * n * s.dt;
  p.ops.push_back({p.name, "attn", Phase::Forward, attn,
                   rows * 3 * s.dt * e + (s.fused ? 0 : b * s.heads * n * n * e),
                   rows * s.dt * e + (s.fused ? b * s.heads * n * 4 : b * s.heads * n * n * e)});
  // The fused backward writes dSᵀ [b·heads, n, n rounded up to 8] once and reads it back.
  const int64_t dst = s.fused ? b * s.heads * n * ((n + 7) / 8 * 8) * e : 0;
  p.ops.push_back({p.name, "attn", Phase::Backward, (s.fused ? 2.5 : 2.0) * attn,
                   rows * (3 + 2) * s.dt * e + (s.fused ? dst : b * s.heads * n * n * e),
                   rows * 3 * s.dt * e + dst});
  // On a GPU in half precision the residual adds ride proj's and fc2's GEMMs when nothing sits
  // between (nn::ViTConfig::fused_residual): those forwards read the fp32 residual and write the
  // fp32 sum, and no separate add runs forward.
  const bool half = l.precision != DType::F32;
  const bool fused = half && c.fused_residual(index, l.tp, true);
  const bool fused_gpu = fused && l.gpu;
  auto add_residual_linear = [&](const std::string& op, int64_t in) {
    add_linear(p, op, rows, in, d, e);
    if (!fused_gpu) return;
    OpCost& f = p.ops[p.ops.size() - 2];  // the forward
    f.op += "+residual";
    f.flops += 2.0 * rows * d;
    f.bytes_read += rows * d * 4;
    f.bytes_written = rows * d * 4;
  };
  add_residual_linear("attn.proj", s.dt);
  add_elementwise(p, "norm2", lr * d, 8, e);
  add_linear(p, "mlp.fc1", rows, d, s.hid, e);
  add_elementwise(p, "mlp.act", rows * s.hid, 8, e);
  // The GELU's output made again in its backward pass (nn::ViTConfig::gelu_recomputed).
  const bool recompute_m = c.gelu_recomputed(l.nd());
  if (recompute_m) p.ops.back().bytes_written += rows * s.hid * e;
  add_residual_linear("mlp.fc2", s.hid);
  add_elementwise(p, "residual", 2 * lr * d, 1, 4);
  if (fused_gpu) p.ops.erase(p.ops.end() - 2);  // the forward adds
  if (s.sp) add_sequence_parallel_copies(p, l, s, !c.checkpoint);

  // Collectives as the block issues them (nn/vit.cpp, tensor_parallel.cpp).
  if (s.tp) {
    const auto fwd_row = s.sp ? CollectiveKind::ReduceScatter : CollectiveKind::AllReduce;
    const int64_t full = rows * d;
    auto add = [&](CollectiveKind k, int64_t bytes, const char* op, Phase ph) {
      p.collectives.push_back({k, Group::Tp, s.T, bytes, p.name, op, ph});
    };
    if (s.sp) add(CollectiveKind::AllGather, full * e, "norm1 → attn.qkv", Phase::Forward);
    add(fwd_row, full * e, "attn.proj", Phase::Forward);
    if (s.sp) add(CollectiveKind::AllGather, full * e, "norm2 → mlp.fc1", Phase::Forward);
    add(fwd_row, full * e, "mlp.fc2", Phase::Forward);
    // Sequence parallel without checkpointing: backward gathers fc1's and qkv's inputs again (the
    // forward keeps this rank's tokens; a recompute keeps them whole).
    const bool regather = s.sp && !c.checkpoint;
    if (s.sp) add(CollectiveKind::AllGather, full * e, "mlp.fc2 grad", Phase::Backward);
    if (regather) add(CollectiveKind::AllGather, full * e, "mlp.fc1 input again", Phase::Backward);
    add(fwd_row, full * e, "mlp.fc1 input grad", Phase::Backward);
    if (s.sp) add(CollectiveKind::AllGather, full * e, "attn.proj grad", Phase::Backward);
    if (regather) add(CollectiveKind::AllGather, full * e, "attn.qkv input again", Phase::Backward);
    add(fwd_row, full * e, "attn.qkv input grad", Phase::Backward);
    if (s.sp) add(CollectiveKind::AllReduce, 4 * d * 4, "norm grads", Phase::Backward);
  }

  // Memory: Block::Acts (x, mean1, rstd1, a, qkv, probs or log-sum-exp, o, h, mean2, rstd2, b, f,
  // m). x and h are the residual stream (fp32, this rank's tokens), the rest compute dtype; the
  // normalised inputs a and b are kept for this rank's tokens (sequence parallel) and gathered
  // whole again in backward (a recompute keeps them whole).
  const int64_t x = lr * d * 4, stats = 2 * lr * 4;
  const int64_t probs = s.fused ? b * s.heads * n * 4 : b * s.heads * n * n * e;
  const int64_t kept_ab = lr * d * e;  // a or b as kept (nr = n without sequence parallel)
  const int64_t ab_again = s.sp ? rows * d * e : 0;  // a or b gathered whole again in backward
  // fc1's output f, and the GELU's output m unless the backward makes it again.
  const int64_t full = x + stats + kept_ab + rows * 3 * s.dt * e + probs + rows * s.dt * e + x +
                       stats + kept_ab + (recompute_m ? 1 : 2) * rows * s.hid * e;
  // The recompute's a and b are whole: what a checkpointed block holds in backward.
  const int64_t full_recomputed = full + 2 * (ab_again > 0 ? ab_again - kept_ab : 0);
  p.keeps_input = true;
  p.input = x;
  p.output = x;
  p.grad_input = x;
  const int64_t y = rows * d * e;  // a row-parallel output before the reduction
  // A sequence-parallel collective's staging beside its input and result: by tokens the
  // rank-major buffer; by samples none (the tensors travel as they are), but on the CPU a half
  // tensor travels widened to fp32.
  const int64_t stage = !s.sp          ? 0
                        : s.sp_samples ? (!l.gpu && half ? rows * d * 4 : 0)
                                       : rows * d * s.es;
  // By tokens a gather's part shorter than the largest is first copied into a padded buffer.
  const int64_t pad_part = s.sp && !s.sp_samples ? lr * d * e : 0;
  // The fc2 output beside the new residual; under sequence parallelism its reduce-scatter's
  // staging buffer and result first.
  // Fused: none on a GPU; on the CPU the fp32 product before the add.
  const int64_t y_out = fused_gpu ? 0
                        : fused   ? rows * d * 4
                        : s.sp
                            ? std::max(y + stage + lr * d * e - x, lr * d * e)
                            : y + (s.tp && l.precision != DType::F32 && !l.gpu ? rows * d * 4 : 0);
  // Gathered dy and gy (sequence parallel: in the compute dtype, cast on this rank's part).
  const int64_t g_full = s.sp ? rows * d * e : 0;
  const int64_t gm = rows * s.hid * e, gf = rows * s.hid * e, gb = lr * d * e, gh = lr * d * 4,
                go = rows * s.dt * e, gq = rows * 3 * s.dt * e, ga = lr * d * e, gx = x;
  // This block takes dy rounded from the next one (nn::Block::half_dy) until fc2's backward.
  const bool takes_half = half && !l.nd() && !s.sp && index + 1 < c.depth && !c.block_masked(index);
  // Without checkpointing, fc1's input gathered again lives from fc2's backward to fc1's (and
  // qkv's from proj's backward to qkv's); a split backward holds both until its W.
  const int64_t again = c.checkpoint ? 0 : ab_again;
  // The block before this one takes dy rounded (nn::Block::takes_dy_as_is): the copy is made
  // with gx and lives until that block's fc2 backward.
  const bool sends_half = half && !l.nd() && !s.sp && index > 0 && !c.block_masked(index - 1);
  // The fused attention backward's scratch: D [b·heads, n] and dSᵀ.
  const int64_t scratch = s.fused ? dst + b * s.heads * n * 4 : 0;
  int64_t bwd = 0, bwd_split = 0;
  if (l.nd()) {
    // 2d/2.5d/3d (Block::backward_nd): function-scope gradients accumulate until the end.
    const int64_t at_gelu = g_full + gm + gf + (takes_half ? lr * d * e : 0) + again;
    const int64_t before_qkv = g_full + gf + gb + gh + g_full + go + gq;
    const int64_t at_qkv =
        before_qkv + again + (s.sp ? rows * d * e + stage + pad_part : rows * d * e);
    const int64_t at_end =
        before_qkv + ga + gx + (s.sp ? 4 * d * 4 : 0) + (sends_half ? lr * d * e : 0);
    const int64_t at_attn = before_qkv + again + scratch;
    bwd = std::max({at_gelu, at_qkv, at_end, at_attn});
    bwd_split = bwd;  // split: all of it in the BackwardInput, nothing held
  } else {
    // Block::backward's order: each working tensor and each part of the Cache released where
    // the executor releases it; the peak above the saved tensors and dy. Split (a BackwardInput,
    // WeightGrads deferred): what a weight-gradient step captures stays (`hold`, counted in
    // weight_held) and the partial sums WeightGrads::into hands out are made; the rest of the
    // Cache and dy go when the cache is reset (WeightGrads::finish).
    // The Cache's parts as this backward sees them (a checkpointed block's recompute: a and b
    // whole under sequence parallelism).
    const int64_t kept = c.checkpoint && s.sp ? rows * d * e : kept_ab;
    const int64_t m_bytes = rows * s.hid * e, f_bytes = rows * s.hid * e;
    const int64_t half_g = takes_half ? lr * d * e : 0;
    // g in the compute dtype when it comes in fp32 (recompute: rounded once for fc2's GEMMs).
    const int64_t g_cvt = recompute_m && half && !takes_half ? rows * d * e : 0;
    const bool dgelu = !recompute_m && c.act == "gelu_tanh" && !c.block_masked(index);
    const int64_t gh_half = half && !s.sp && !c.block_masked(index) ? lr * d * e : 0;
    const int64_t col = s.sp ? rows * d * e + stage + pad_part : rows * d * e;
    // On the CPU a half GEMM runs in fp32 (ops::linear_bwd and friends): copies of its operands
    // up to fp32 and the fp32 result, transient. k: the linear's inputs, o: its outputs.
    const bool cpu_half = half && !l.gpu && !s.tp;
    auto up_bwd = [&](int64_t k, int64_t o) {  // ops::linear_bwd: x, w, dy, dx
      return cpu_half ? (2 * rows * k + o * k + rows * o) * 4 : 0;
    };
    auto up_input = [&](int64_t k, int64_t o) {  // ops::linear_bwd_input: w, dy, dx
      return cpu_half ? (o * k + rows * o + rows * k) * 4 : 0;
    };
    auto up_weight = [&](int64_t k, int64_t o) {  // ops::linear_bwd_weight: x, dy
      return cpu_half ? (rows * k + rows * o) * 4 : 0;
    };
    // ops::gelu_bwd_bias: the input and dy up, the fp32 gradient; ops::gelu_fwd (the output
    // made again): the input up, the fp32 output, and the half one it replaces.
    const int64_t up_gelu_bwd = cpu_half ? 3 * rows * s.hid * 4 : 0;
    const int64_t up_gelu_fwd = cpu_half ? 2 * rows * s.hid * 4 + rows * s.hid * e : 0;
    // ops::attention_bwd: qkv, the probabilities and dout up, the fp32 dqkv, and the half one it
    // replaces.
    const int64_t up_attn =
        cpu_half ? (2 * rows * 3 * s.dt + b * s.heads * n * n + rows * s.dt) * 4 + gq : 0;
    struct Walk {
      int64_t peak = 0, held = 0;
    };
    // Without model.recompute_gelu the block's tensors live to the end of its backward
    // (Block::backward's `lean`): only g, gm and the ops' own temporaries go earlier.
    const bool lean = c.recompute_gelu;
    auto walk = [&](bool split) {
      Walk w;
      int64_t live = 0;
      auto add = [&](int64_t bytes) { w.peak = std::max(w.peak, live += bytes); };
      auto free_now = [&](int64_t bytes) { live -= bytes; };
      auto drop = [&](int64_t bytes) {
        if (lean) live -= bytes;
      };
      auto touch = [&](int64_t bytes) {
        add(bytes);
        free_now(bytes);
      };
      // Kept for the BackwardWeight (split) or released now.
      auto hold = [&](int64_t bytes) {
        if (split)
          w.held += bytes;
        else
          drop(bytes);
      };
      auto partial = [&](int64_t numel) {  // WeightGrads::into: a zeroed fp32 partial sum
        if (!split) return;
        add(numel * 4);
        w.held += numel * 4;
      };
      partial(s.sp ? 0 : 4 * d);  // the LayerNorms' (sequence parallel: ln_flat, below)
      add(half_g);                // g: the next block's rounded copy of dy
      add(g_full);                // g gathered whole (sequence parallel)
      add(again);                 // fc1's input gathered again, beside fc2's backward
      add(g_cvt);
      int64_t g_alive = half_g + g_full + g_cvt;
      // fc2's output gradient as its weight gradient reads it: the rounded copy, the converted
      // one, the gathered one or dy itself (x's bytes; not the walk's).
      const int64_t g_kept = takes_half ? half_g : g_cvt > 0 ? g_cvt : s.sp ? g_full : 0;
      if (split) w.held += g_kept > 0 ? g_kept : x;
      if (recompute_m && !(split && g_kept == g_full)) {
        drop(g_full);  // gathered g, once rounded
        g_alive -= g_full;
      }
      if (!dgelu) partial(s.hid);  // fc1's bias gradient from the GELU's backward pass
      if (recompute_m) {
        add(gm);  // fc2's input gradient
        touch(up_input(s.hid, d));
        add(gf);  // the GELU's backward: gf, and m made again
        touch(up_gelu_bwd);
        add(m_bytes);
        touch(up_gelu_fwd);
        drop(gm + f_bytes);  // gm, the Cache's f
        if (!split) touch(up_weight(s.hid, d));
        hold(m_bytes);  // fc2's weight gradient reads m
      } else if (dgelu) {
        add(gf);  // the DGELU epilogue's gf
        drop(f_bytes);
        hold(m_bytes);
      } else {
        add(gm);
        touch(up_bwd(s.hid, d));
        hold(m_bytes);  // the Cache's m, after fc2's GEMMs
        add(gf);
        touch(up_gelu_bwd);
        free_now(gm);  // its scope ends
        drop(f_bytes);
      }
      // g is done with (unless fc2's weight gradient keeps it).
      free_now(g_alive - (split ? g_kept : 0));
      // fc1's backward (column-parallel): the input gradient before its reduction (and the
      // reduce-scatter's staging) beside gf; then gf, its input and the re-gathered copy go
      // (split: gf and the input fc1's weight gradient reads stay).
      add(col);
      touch(up_bwd(d, s.hid));
      free_now(col - gb);
      hold(gf + (again > 0 ? again : kept));
      drop(again > 0 ? kept : 0);
      // norm2's backward: gh (fp32) and proj's copy of it in the compute dtype.
      partial(!s.sp && !c.block_masked(index) ? d : 0);  // proj's bias gradient, from that pass
      add(gh + gh_half);
      drop(gb + x + stats);  // gb, the Cache's h, mean2, rstd2
      add(g_full);           // gy gathered whole (sequence parallel)
      add(again);            // qkv's input gathered again, beside proj's and attention's backward
      add(go);
      touch(up_bwd(s.dt, d));
      // gy as proj's weight gradient reads it: the rounded copy, the gathered one, or gh.
      if (split) w.held += gh_half > 0 ? gh_half : s.sp ? g_full : gh;
      if (!split) drop(gh_half + g_full);  // gy
      if (s.fused) partial(3 * s.dt);      // qkv's bias gradient from the fused attention backward
      add(gq + scratch);                   // the attention backward
      touch(up_attn);
      free_now(scratch);
      drop(go + rows * 3 * s.dt * e + probs);  // and qkv, probs
      hold(rows * s.dt * e);                   // o: proj's weight gradient reads it
      add(col);                                // qkv's backward
      touch(up_bwd(d, 3 * s.dt));
      free_now(col - ga);
      hold(gq + (again > 0 ? again : kept));
      drop(again > 0 ? kept : 0);
      add(gx + (sends_half ? lr * d * e : 0) + (s.sp ? 4 * d * 4 : 0));  // norm1's backward
      if (split && s.sp) w.held += 4 * d * 4;  // ln_flat summed, added by the BackwardWeight
      return w;
    };
    bwd = walk(false).peak;
    const Walk w = walk(true);
    bwd_split = w.peak;
    p.weight_held = w.held;
    // The BackwardWeight's GEMMs, one at a time.
    p.weight_extra = std::max(up_weight(s.hid, d), up_weight(d, 3 * s.dt));
  }
  if (c.checkpoint) {
    p.saved = x;  // only the input; backward recomputes the rest
    p.forward_extra = (full - x) + y_out;
    p.backward_extra = (full_recomputed - x) + bwd;
    p.split_backward_extra = (full_recomputed - x) + bwd_split;
    // Block::backward recomputes run_forward: everything up to fc2's input (not fc2).
    for (const OpCost& o : std::vector<OpCost>(p.ops))
      if (o.phase == Phase::Forward && o.op.rfind("mlp.fc2", 0) != 0 && o.op != kSpTokensCopyOut) {
        OpCost r = o;
        r.phase = Phase::Recompute;
        p.ops.push_back(r);
      }
    for (const Collective& k : std::vector<Collective>(p.collectives))
      if (k.phase == Phase::Forward && k.op != "mlp.fc2") {
        Collective r = k;
        r.phase = Phase::Recompute;
        p.collectives.push_back(r);
      }
  } else {
    p.saved = full;
    p.forward_extra = y_out;
    p.backward_extra = bwd;
    p.split_backward_extra = bwd_split;
  }
  // nn::ComputeCopies: the block's weights and biases in the compute dtype through its forward
  // and its backward (1d and no tensor parallelism); kept from the forward for the backward
  // (Layer::keep_compute_copies) unless the block is checkpointed or ZeRO-3 frees the parameters.
  if (half && !l.nd()) {
    const int64_t copies =
        (3 * s.dt * d + d * s.dt + s.hid * d + d * s.hid + 3 * s.dt + d + s.hid + d) * e;
    if (!c.checkpoint && l.zero_stage != 3) {
      p.saved += copies;
    } else {
      p.forward_extra += copies;
      p.backward_extra += copies;
      p.split_backward_extra += copies;
    }
  }
  return p;
}

LayerPlan head_plan(const Shapes& s) {
  LayerPlan p;
  p.name = "head";
  const int64_t b = s.b, d = s.d, e = s.e;
  add_elementwise(p, "norm", b * d, 8, e);
  add_linear(p, "head", b, s.dt, s.k, e);
  p.input = s.lr * d * 4;
  // HeadCache: the class token t, its statistics, the normalised features z (sliced under tp).
  p.saved = b * d * 4 + 2 * b * 4 + b * s.dt * e;
  p.output = b * s.k * 4;
  p.forward_extra = s.tp ? b * d * e : 0;  // z before it is sliced
  p.grad_input = s.lr * d * 4;
  p.backward_extra = b * s.dt * e + (s.tp ? 2 * b * d * e : 0) + b * d * 4 + p.grad_input;
  // Split (nn::Head::backward, WeightGrads deferred): the classifier's weight gradient keeps z
  // (and dlogits, the caller's); the norm's gradients are fp32 partial sums.
  p.split_backward_extra = p.backward_extra + 2 * d * 4;
  p.weight_held = b * s.dt * e + 2 * d * 4;
  if (s.tp) {
    if (s.sp)  // by samples every rank's class tokens gathered, by tokens rank 0's summed
      p.collectives.push_back({s.sp_samples ? CollectiveKind::AllGather : CollectiveKind::AllReduce,
                               Group::Tp, s.T, b * d * 4, p.name, "class token", Phase::Forward});
    p.collectives.push_back({CollectiveKind::AllReduce, Group::Tp, s.T, b * s.k * 4, p.name,
                             "head logits", Phase::Forward});
    p.collectives.push_back({CollectiveKind::AllGather, Group::Tp, s.T, b * d * e, p.name,
                             "head input grad", Phase::Backward});
  }
  return p;
}

void add_nd_collective(LayerPlan& p, CollectiveKind k, const char* g, int size, int64_t bytes,
                       const std::string& op, Phase ph, int count = 1) {
  Collective col{k, Group::Tp, size, bytes, p.name, op, ph};
  col.subgroup = g;
  col.count = count;
  col.rotating_root = k == CollectiveKind::Broadcast && count == size;
  p.collectives.push_back(col);
}

// The collectives of a Linear(in, out) under 2d/2.5d/3d (nd_linear_fwd / nd_linear_bwd) on
// `rows` rows of this rank, its input in layout `orient`, in the compute dtype of e bytes.
// `grad_fp32`: the output gradient comes in fp32 (the residual stream's: fc2 and proj of a block),
// which nd_linear_bwd casts to the compute dtype.
void add_nd_linear(LayerPlan& p, const Layout& l, const std::string& op, int64_t rows, int64_t in,
                   int64_t out, int orient, Phase ph, int64_t e, bool grad_fp32 = false) {
  const NdDims nd = nd_dims(l);
  const int q = nd.q;
  const int64_t I = in / q, O = out / q;
  auto add = [&p](CollectiveKind k, const char* g, int size, int64_t bytes, const std::string& o,
                  Phase phase,
                  int count = 1) { add_nd_collective(p, k, g, size, bytes, o, phase, count); };
  if (l.tp_mode != "3d") {
    p.ops.push_back(summa_linear_copies(p.name, rows, I, O, q, ph, e, grad_fp32));
    if (ph != Phase::Backward) {
      // SUMMA: q steps, step t broadcasting the input block of row member t and the weight
      // block of column member t: q broadcasts each, every member the root once.
      add(CollectiveKind::Broadcast, "row", q, rows * I * e, op + " input blocks", ph, q);
      add(CollectiveKind::Broadcast, "col", q, O * I * e, op + " weight blocks", ph, q);
      return;
    }
    add(CollectiveKind::AllGather, "col", q, q * O * I * e, op + " weights", ph);
    add(CollectiveKind::ReduceScatter, "row", q, q * rows * I * e, op + " input grad", ph);
    add(CollectiveKind::AllGather, "row", q, q * rows * I * e, op + " inputs", ph);
    add(CollectiveKind::ReduceScatter, "col", q, q * O * I * 4, op + " weight grad", ph);
    if (l.tp_depth > 1)
      add(CollectiveKind::AllReduce, "depth", l.tp_depth, O * I * 4, op + " weight grad", ph);
    add(CollectiveKind::AllReduce, "col×depth", nd.chunks, O * 4, op + " bias grad", ph);
    return;
  }
  const char* gin = orient == 0 ? "input" : "output";
  const char* gout = orient == 0 ? "output" : "input";
  if (ph != Phase::Backward) {
    add(CollectiveKind::AllGather, gin, q, q * rows * I * e, op + " input", ph);
    add(CollectiveKind::AllGather, "weight", q, O * I * e, op + " weight", ph);
    add(CollectiveKind::ReduceScatter, gout, q, q * rows * O * e, op + " output", ph);
    return;
  }
  add(CollectiveKind::AllGather, gout, q, q * rows * O * e, op + " output grad", ph);
  add(CollectiveKind::AllGather, gin, q, q * rows * I * e, op + " input", ph);
  add(CollectiveKind::AllGather, "weight", q, O * I * e, op + " weight", ph);
  add(CollectiveKind::ReduceScatter, gin, q, q * rows * I * e, op + " input grad", ph);
  add(CollectiveKind::ReduceScatter, "weight", q, O * I * 4, op + " weight grad", ph);
  add(CollectiveKind::AllReduce, "weight", q, O * 4, op + " bias grad", ph);
}

// 2d/2.5d/3d: the collectives each layer issues (nn/tensor_parallel_nd.cpp, nn/vit.cpp) and the
// linears' FLOPs (a rank multiplies its rows by every input feature: q × the local block's).
void add_nd(std::vector<LayerPlan>& layers, const nn::ViTConfig& c, const Layout& l,
            const Shapes& s) {
  const NdDims nd = nd_dims(l);
  const int q = nd.q;
  const bool three = l.tp_mode == "3d";
  const int64_t e = s.e, bl = s.b, n = s.n, dq = s.d, kq = c.num_classes;
  auto add = [](LayerPlan& p, CollectiveKind k, const char* g, int size, int64_t bytes,
                const std::string& op,
                Phase ph) { add_nd_collective(p, k, g, size, bytes, op, ph); };
  const char* feature = three ? "output" : "row";
  const char* replica = three ? "input×weight" : "col×depth";
  const int replicas = nd.chunks;
  // The split LayerNorm (nd_layernorm_fwd / _bwd) reads its fp32 input more often than the
  // whole-row one the plan's norm ops are timed as: forward two row-sum passes before the
  // normalisation, backward a pass for the row sums (and the parameter gradients) before the
  // input gradient's (reading the input and the output gradient again).
  auto ln_fwd = [&](LayerPlan& p, int64_t rows, const std::string& op, Phase ph) {
    p.ops.push_back({p.name, kNdLnPasses, ph, 0.0, 2 * rows * dq * 4, 0});
    add(p, CollectiveKind::AllReduce, feature, q, rows * 4, op + " mean", ph);
    add(p, CollectiveKind::AllReduce, feature, q, rows * 4, op + " variance", ph);
  };
  auto ln_bwd = [&](LayerPlan& p, int64_t rows, const std::string& op) {
    p.ops.push_back({p.name, kNdLnPasses, Phase::Backward, 0.0, rows * dq * (4 + e), 0});
    add(p, CollectiveKind::AllReduce, feature, q, rows * 2 * 4, op + " grad sums", Phase::Backward);
  };
  auto linear = [&](LayerPlan& p, const std::string& op, int64_t rows, int64_t in, int64_t out,
                    int orient, Phase ph) {
    // fc2's and proj's output gradients are the residual stream's (fp32).
    const bool fp32_grad = op == "mlp.fc2" || op == "attn.proj";
    add_nd_linear(p, l, op, rows, in, out, orient, ph, e, fp32_grad);
  };
  const int64_t D = c.embed_dim, H = c.mlp_hidden(), R = bl * n;
  for (LayerPlan& p : layers) {
    for (OpCost& o : p.ops)
      if (o.op == "attn.qkv" || o.op == "attn.proj" || o.op == "mlp.fc1" || o.op == "mlp.fc2" ||
          o.op == "head")
        o.flops *= o.op == "head" ? 1 : q;
    if (p.name == "embedding") {
      const int64_t numel = dq + n * dq + dq * s.patch + dq;
      add(p, CollectiveKind::AllReduce, replica, replicas, numel * 4, "parameter gradients",
          Phase::Backward);
    } else if (p.name == "head") {
      ln_fwd(p, bl, "norm", Phase::Forward);
      add(p, CollectiveKind::AllReduce, feature, q, bl * kq * 4, "head logits", Phase::Forward);
      add(p, CollectiveKind::AllGather, replica, replicas, replicas * bl * kq * 4, "logits",
          Phase::Forward);
      ln_bwd(p, bl, "norm");
      add(p, CollectiveKind::AllReduce, replica, replicas, (kq * dq + kq + 2 * dq) * 4,
          "parameter gradients", Phase::Backward);
    } else {
      // Forward (and its recomputation under checkpointing) in Block's order.
      std::vector<Phase> fwd{Phase::Forward};
      if (c.checkpoint) fwd.push_back(Phase::Recompute);
      for (Phase ph : fwd) {
        ln_fwd(p, R, "norm1", ph);
        linear(p, "attn.qkv", R, D, 3 * D, 0, ph);
        linear(p, "attn.proj", R, D, D, 1, ph);
        ln_fwd(p, R, "norm2", ph);
        linear(p, "mlp.fc1", R, D, H, 0, ph);
        if (ph == Phase::Forward) linear(p, "mlp.fc2", R, H, D, 1, ph);  // not recomputed
      }
      linear(p, "mlp.fc2", R, H, D, 1, Phase::Backward);
      linear(p, "mlp.fc1", R, D, H, 0, Phase::Backward);
      ln_bwd(p, R, "norm2");
      linear(p, "attn.proj", R, D, D, 1, Phase::Backward);
      linear(p, "attn.qkv", R, D, 3 * D, 0, Phase::Backward);
      ln_bwd(p, R, "norm1");
      add(p, CollectiveKind::AllReduce, replica, replicas, 4 * dq * 4, "norm grads",
          Phase::Backward);
      // The largest gathered blocks beside the layer's own tensors (fc1 / fc2's inputs and
      // weights, q copies in a backward).
      p.forward_extra += 2 * (R * H / q * e + D / q * H / q * e);
      p.backward_extra += q * (R * H / q * e + D / q * H / q * 4) + R * H / q * e;
    }
  }
}

// Body::Linears: colossalai benchmark's MLP, depth × nn::ParallelLinear(d, d) on [b, n, d]
// (this rank's chunk under 2d/2.5d/3d): 1d alternates column (its backward all-reduces the input
// gradient) and row (its forward all-reduces the output), 2d/2.5d/3d run nd_linear_fwd/bwd with
// the input layout alternating (orient = index % 2).
std::vector<LayerPlan> linear_plans(const nn::ViTConfig& c, const Layout& l, const Shapes& s) {
  const int64_t d = c.embed_dim, R = s.b * s.n, e = s.e;
  const bool half_on_cpu = !l.gpu && l.precision != DType::F32;
  std::vector<LayerPlan> out;
  for (int64_t i = 0; i < c.depth; ++i) {
    LayerPlan p;
    p.name = fmt::format("layers.{}", i);
    const int orient = static_cast<int>(i % 2);
    int64_t in = d, o = d;  // this rank's input and output features
    if (l.nd()) {
      const NdDims nd = nd_dims(l);
      const int64_t q = nd.q;
      in = o = d / q;
      add_linear(p, "linear", R, in, o, e);
      for (OpCost& op : p.ops) op.flops *= static_cast<double>(q);
      p.parameter_numels = {o * (d / nd.in_cut), o};
      add_nd_linear(p, l, "linear", R, d, d, orient, Phase::Forward, e);
      add_nd_linear(p, l, "linear", R, d, d, orient, Phase::Backward, e);
      const int64_t I = in, O = o;
      if (l.tp_mode == "3d") {
        // Gathered input, weight (gathered and joined) and the partial output; backward: the
        // gathered output gradient and input, the weight, the staged input and weight gradients.
        p.forward_extra = q * R * I * e + 2 * O * I * e + q * R * O * e;
        p.backward_extra =
            q * R * O * e + 2 * q * R * I * e + 2 * O * I * e + 2 * O * I * 4 + R * I * e;
      } else {
        // SUMMA: two steps' input and weight blocks in flight and the fp32 sum; backward: the
        // column's weights, the staged input gradients, the row's inputs, the weight gradients.
        p.forward_extra = 2 * (R * I * e + O * I * e) + R * O * 4;
        p.backward_extra = q * (O * I * e + 2 * R * I * e + O * I * 4) + R * I * e;
      }
    } else if (l.tp > 1) {
      const int64_t T = l.tp;
      const bool column = orient == 0;
      in = column ? d : d / T;
      o = column ? d / T : d;
      add_linear(p, "linear", R, in, o, e);
      p.parameter_numels = {o * in, column ? o : d};
      Collective k{CollectiveKind::AllReduce,
                   Group::Tp,
                   l.tp,
                   R * d * e,
                   p.name,
                   column ? "input grad" : "output",
                   column ? Phase::Backward : Phase::Forward};
      p.collectives.push_back(k);
      // A half tensor is all-reduced in fp32 on the CPU.
      p.forward_extra = !column && half_on_cpu ? R * d * 4 : 0;
      p.backward_extra = R * in * e + (column && half_on_cpu ? R * d * 4 : 0);
    } else {
      add_linear(p, "linear", R, d, d, e);
      p.parameter_numels = {d * d, d};
      p.backward_extra = R * d * e;
    }
    if (e != 4) p.backward_extra += o * in * e;  // the weight in the compute dtype
    p.keeps_input = true;                        // LinearCache::x
    p.input = p.saved = p.grad_input = R * in * e;
    p.output = R * o * e;
    for (int64_t v : p.parameter_numels) p.parameters += v;
    p.parameter_decays = {1, 0};  // the weight decays, the bias does not
    out.push_back(std::move(p));
  }
  return out;
}

std::vector<LayerPlan> layer_plans(const nn::ViTConfig& c, const Layout& l, int64_t rows, int r) {
  const Shapes s = shapes_of(c, l, rows, r);
  if (l.body == Body::Linears) return linear_plans(c, l, s);
  auto numels = parameter_numels(c, l);
  const bool vit = l.body == Body::ViT;
  if (!vit) numels = {numels.begin() + 1, numels.end() - 1};  // the blocks'
  std::vector<LayerPlan> out;
  if (vit) out.push_back(embedding_plan(c, l, s));
  for (int64_t i = 0; i < c.depth; ++i) out.push_back(block_plan(c, l, s, i));
  if (vit) out.push_back(head_plan(s));
  if (l.nd()) {
    add_nd(out, c, l, s);
    if (vit) out.back().output = rows * s.k * 4;  // every rank gets the whole batch's logits
    // 2d/2.5d/3d: a split backward does all of it in the BackwardInput.
    for (LayerPlan& p : out) {
      p.split_backward_extra = p.backward_extra;
      p.weight_held = p.weight_extra = 0;
    }
  }
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].parameter_numels = numels[i];
    for (int64_t v : numels[i]) out[i].parameters += v;
    // The linear (and patch-projection) weights decay (nn/vit.cpp, nn/module.cpp): the
    // embedding's and the head's third parameter, a block's qkv, proj, fc1 and fc2 weights.
    const bool block = !vit || (i > 0 && i + 1 < out.size());
    out[i].parameter_decays.assign(numels[i].size(), 0);
    for (size_t k : block ? std::vector<size_t>{2, 4, 8, 10} : std::vector<size_t>{2})
      out[i].parameter_decays.at(k) = 1;
  }
  if (!vit) return out;
  // The loss: cross-entropy forward and backward over the logits (fp32).
  LayerPlan& h = out.back();
  h.ops.push_back(
      {"loss", "cross_entropy", Phase::Forward, 5.0 * rows * s.k, rows * s.k * 4, rows * 4});
  h.ops.push_back(
      {"loss", "cross_entropy", Phase::Backward, 3.0 * rows * s.k, rows * s.k * 4, rows * s.k * 4});
  return out;
}

// ------------------------------------------------------------------------------------------
}  // namespace

using detail::replay;

int64_t StepPlan::peak() const {
  int64_t p = 0;
  for (const RankPlan& r : stages) p = std::max(p, r.memory.peak);
  return p;
}

RankPlan plan_rank(const StepPlan& plan, int rank) {
  const Layout& l = plan.layout;
  CAI_CHECK(rank >= 0 && rank < l.world, "[plan] rank {} is outside the world of {}", rank,
            l.world);
  RankPlan r;
  r.rank = rank;
  // dist::ProcessMesh: tp fastest, then pp, dp outermost.
  r.tp_rank = rank % l.tp;
  r.pp_rank = (rank / l.tp) % l.pp;
  r.dp_rank = rank / (l.tp * l.pp);
  const auto all = layer_plans(plan.model, l, plan.micro_batch_rows, r.tp_rank);
  if (l.pp == 1) {
    for (int i = 0; i < static_cast<int>(all.size()); ++i) r.layers.push_back(i);
  } else {
    for (int c = 0; c < l.chunks; ++c) {
      const int vs = plan.schedule.virtual_stage(r.pp_rank, c);  // the style's placement
      for (int i = 0; i < plan.partition.num_layers(vs); ++i)
        r.layers.push_back(plan.partition.first_layer(vs) + i);
    }
    std::sort(r.layers.begin(), r.layers.end());
  }
  for (int i : r.layers) {
    r.layer_plans.push_back(all[i]);
    r.parameter_elements += all[i].parameters;
  }
  replay(plan, r);
  return r;
}

StepPlan make_plan(const nn::ViTConfig& model, const Layout& layout) {
  layout.validate(model);
  StepPlan p;
  p.model = model;
  p.layout = layout;
  p.dp = layout.dp();
  const int L = static_cast<int>(model.depth + 2);
  if (layout.pp == 1) {
    p.micro_batches = static_cast<int>(layout.gradient_accumulation);
    p.micro_batch_rows = layout.batch;
  } else {
    p.micro_batches = schedule::micro_batch_count(
        layout.batch, layout.num_microbatches, layout.microbatch_size, layout.pp, layout.pp_style);
    p.micro_batch_rows =
        schedule::micro_batch_slice(layout.batch, p.micro_batches, p.micro_batches - 1).second;
    for (int i = 0; i < p.micro_batches; ++i)
      p.micro_batch_rows = std::max(
          p.micro_batch_rows, schedule::micro_batch_slice(layout.batch, p.micro_batches, i).second);
    std::vector<int64_t> costs;
    for (const auto& ps : parameter_numels(model, layout)) {
      int64_t n = 0;
      for (int64_t v : ps) n += v;
      costs.push_back(n);
    }
    p.partition = schedule::partition_layers(L, layout.pp * layout.chunks, layout.partition, costs,
                                             layout.num_layers_per_stage);
    schedule::ScheduleOptions so;
    so.stages = layout.pp;
    so.micro_batches = p.micro_batches;
    so.chunks = layout.chunks;
    so.split_backward = layout.split_backward;
    schedule::set_zero_bubble_costs(so, model.checkpoint);  // as the executor's
    const Shapes s = shapes_of(model, layout, p.micro_batch_rows, 0);
    so.activation_bytes = s.lr * s.d * 4;
    p.schedule = schedule::make(layout.pp_style, so, p.partition);
    p.peak_micro_batches = schedule::validate_or_throw(p.schedule).peak_activations;
  }
  for (int st = 0; st < layout.pp; ++st) p.stages.push_back(plan_rank(p, st * layout.tp));
  return p;
}

int optimizer_slots(const Layout& l) {
  return detail::optimizer_slots(l);
}

double flops(const RankPlan& r) {
  double f = 0;
  for (const LayerPlan& l : r.layer_plans)
    for (const OpCost& o : l.ops)
      if (o.phase != Phase::OptimizerStep) f += o.flops;
  return f;
}

namespace {
std::string mib(int64_t b) {
  return fmt::format("{:.2f} MiB", static_cast<double>(b) / (1 << 20));
}
}  // namespace

std::string summary(const StepPlan& p) {
  const Layout& l = p.layout;
  std::string out = fmt::format(
      "# plan: {} processes = dp {} × pp {} × tp {}{}, ZeRO {}{}, {} micro-batch(es) of {} "
      "sample(s), {}{}\n",
      l.world, p.dp, l.pp, l.tp, l.sequence_parallel ? " (sequence parallel)" : "", l.zero_stage,
      l.cpu_offload ? " (cpu offload)" : "", p.micro_batches, p.micro_batch_rows,
      dtype_name(l.precision), p.model.checkpoint ? ", activation checkpointing" : "");
  for (const RankPlan& r : p.stages) {
    const Memory& m = r.memory;
    // Contiguous runs of the stage's layers ("0-1, 4-5": interleaved or ZB-V chunks).
    std::string runs;
    for (size_t i = 0; i < r.layers.size();) {
      size_t j = i;
      while (j + 1 < r.layers.size() && r.layers[j + 1] == r.layers[j] + 1) ++j;
      runs += fmt::format("{}{}-{}", runs.empty() ? "" : ", ", r.layers[i], r.layers[j]);
      i = j + 1;
    }
    const std::string who =
        l.pp > 1 ? fmt::format("stage {} (layers {})", r.pp_rank, runs) : std::string("every rank");
    out += fmt::format(
        "# memory per process, {}: parameters {}, gradients {}, ZeRO shards {}, optimizer state "
        "{}, buckets {}, input batches {}, activations {} ({} micro-batch(es) in flight), "
        "communication {}, transient {}, allocator {}: peak {} at {}{}; {:.3g} GFLOP per "
        "micro-batch\n",
        who, mib(m.parameters), mib(m.gradients), mib(m.shards), mib(m.optimizer_state),
        mib(m.buffers), mib(m.data), mib(m.activations), m.micro_batches_in_flight, mib(m.window),
        mib(m.transient), mib(m.allocator), mib(m.peak), m.peak_at,
        m.host ? fmt::format(" (host memory {}: fp32 values, gradients, optimizer state and pinned "
                             "staging)",
                             mib(m.host))
               : std::string(),
        flops(r) / 1e9);
  }
  return out;
}

}  // namespace cai::plan
