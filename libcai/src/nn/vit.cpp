#include "cai/nn/vit.h"

#include <array>
#include <cmath>
#include <cstring>
#include <optional>

#include "cai/core/error.h"
#include "cai/core/rng.h"

namespace cai::nn {

const char* backward_overlap_op(std::string_view layer_name, bool nd) {
  if (nd) return nullptr;
  if (layer_name == "embedding") return "cls_pos";
  if (layer_name.rfind("blocks.", 0) == 0) return "attn";
  return nullptr;
}

namespace {
// A layer's overlap point, reached here if it comes before the backward of `op`
// (backward_overlap_op): every op boundary of a backward asks, so that the executor and the
// simulator follow the one definition.
void overlap_before(const ForwardCtx& ctx, std::string_view layer, const char* op, bool nd) {
  if (!ctx.overlap_point || !*ctx.overlap_point) return;  // no data parallelism listening
  const char* at = backward_overlap_op(layer, nd);
  if (at && std::strcmp(at, op) == 0) (*ctx.overlap_point)();
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// Embedding

namespace {
struct EmbedCache : Cache {
  Tensor patches;
};
// Whether two [batch, tokens, features] tensors hold the same number of rows (sequence
// parallel: a kept part against the gathered whole).
bool same_rows(const Tensor& a, const Tensor& b) {
  return a.size(0) * a.size(1) == b.size(0) * b.size(1);
}

template <typename T>
T& cache_as(std::unique_ptr<Cache>& c, const std::string& layer) {
  T* p = dynamic_cast<T*>(c.get());
  CAI_CHECK(p, "[{}] backward called without a matching forward cache", layer);
  return *p;
}

// The replica gradient sums of the embedding, block and head backwards: the gradients of four
// parameters from this rank's tokens or samples are computed into one zeroed fp32 buffer
// (grad_buffer; parts[i] is the view shaped like ps[i]'s gradient), summed in one all-reduce
// (sum_grad_buffer: over `group` when given, else the whole tensor-parallel group), then added
// to the parameters' gradients (add_grad_buffer, which a work group may run later).
using GradParams = std::array<Parameter*, 4>;

Tensor grad_buffer(const GradParams& ps, Device device, Tensor* parts) {
  int64_t total = 0;
  for (Parameter* p : ps) total += p->grad.numel();
  Tensor flat = Tensor::zeros({total}, DType::F32, device);
  int64_t off = 0;
  for (int i = 0; i < 4; ++i) {
    parts[i] = flat.narrow(off, ps[i]->grad.numel()).reshape(ps[i]->grad.shape());
    off += ps[i]->grad.numel();
  }
  return flat;
}

Tensor sum_grad_buffer(TensorParallel& tp, const Tensor& flat, std::optional<TpGroup> group) {
  return group ? tp.all_reduce(*group, flat) : tp.all_reduce(flat);
}

void add_grad_buffer(const GradParams& ps, const Tensor& flat) {
  int64_t off = 0;
  for (Parameter* p : ps) {
    ops::add_(p->grad, flat.narrow(off, p->grad.numel()).reshape(p->grad.shape()));
    off += p->grad.numel();
  }
}
}  // namespace

Embedding::Embedding(const ViTConfig& c, TensorParallel* tp) : c_(c), tp_(tp) {
  const int64_t d = c.embed_dim, p = c.patch_size, n = c.num_patches() + 1;
  if (tp && tp->nd()) {
    // 2d/2.5d/3d: this rank's features of everything (its feature chunk of layout 0).
    proj.weight = make_sharded_parameter("patch_embed.proj.weight",
                                         tp->feature_spec({d, c.in_chans, p, p}, 0, 0), true);
    proj.bias = make_sharded_parameter("patch_embed.proj.bias", tp->feature_spec({d}, 0, 0), false);
    cls_token = make_sharded_parameter("cls_token", tp->feature_spec({1, 1, d}, 2, 0), false);
    pos_embed = make_sharded_parameter("pos_embed", tp->feature_spec({1, n, d}, 2, 0), false);
    return;
  }
  proj.weight = make_parameter("patch_embed.proj.weight", {d, c.in_chans, p, p}, true);
  proj.bias = make_parameter("patch_embed.proj.bias", {d}, false);
  cls_token = make_parameter("cls_token", {1, 1, d}, false);
  pos_embed = make_parameter("pos_embed", {1, n, d}, false);
}

Tensor Embedding::forward(const Tensor& img, std::unique_ptr<Cache>& cache, const ForwardCtx& ctx) {
  CAI_CHECK(img.dim() == 4 && img.size(1) == c_.in_chans && img.size(2) == c_.img_size &&
                img.size(3) == c_.img_size,
            "[embedding] expects images [batch, {}, {}, {}], got {}", c_.in_chans, c_.img_size,
            c_.img_size, img.str());
  auto cc = std::make_unique<EmbedCache>();
  const bool nd = tp_ && tp_->nd();
  // 2d/2.5d/3d: this rank's samples (its batch chunk of layout 0) and features.
  const auto [s0, s1] = nd ? tp_->batch_range(img.size(0), 0) : std::pair<int64_t, int64_t>{0, 0};
  const Tensor im = nd ? img.narrow(s0, s1 - s0) : img;
  Tensor t =
      ops::patch_embed_fwd(im, proj.weight.value, proj.bias.value, &cc->patches, compute_dtype);
  Tensor x = ops::cls_pos_fwd(t, cls_token.value, pos_embed.value);
  if (ctx.training && c_.drop_rate > 0) {
    if (nd) {
      ForwardCtx sub = ctx;
      sub.sample_offset += s0;
      const int64_t n = c_.num_patches() + 1, d = c_.embed_dim;
      const auto [f0, f1] = tp_->feature_slice(d, 0);
      x = ops::dropout_fwd(x, c_.drop_rate, sub.key_slice("pos_drop", n * d, f0, f1 - f0, d));
    } else {
      x = ops::dropout_fwd(x, c_.drop_rate, ctx.key("pos_drop", x.numel() / x.size(0)));
    }
  }
  cache = std::move(cc);
  // Sequence parallel: every rank embeds the whole batch and keeps its part (seq_part).
  if (tp_ && tp_->size() > 1 && tp_->sequence_parallel()) x = tp_->slice_tokens(x);
  return x;
}

Tensor Embedding::backward(const Tensor& dy, std::unique_ptr<Cache>& cache, const ForwardCtx& ctx) {
  auto& cc = cache_as<EmbedCache>(cache, "embedding");
  const bool nd = tp_ && tp_->nd();
  WeightGrads wg(ctx);
  // The last overlap point of a backward (1D path, as Block's): what the first block completed
  // runs beside the position and class-token gradients rather than after the backward.
  overlap_before(ctx, "embedding", "cls_pos", nd);
  // Sequence parallel and nd: the gradients of this rank's tokens / samples, summed over the
  // group (nd: the ranks holding the same features of the other samples).
  const bool sp = (tp_ && tp_->size() > 1 && tp_->sequence_parallel()) || nd;
  const GradParams ps = {&cls_token, &pos_embed, &proj.weight, &proj.bias};
  // The parameter gradients of dy into grads[] (the mask, the class token and position
  // embedding's sums, the patch projection's GEMM).
  auto param_grads = [this, nd](const Tensor& dy, const Tensor& patches, const ForwardCtx& ctx,
                                Tensor* grads) {
    const bool sp = (tp_ && tp_->size() > 1 && tp_->sequence_parallel()) || nd;
    Tensor g = sp && !nd ? tp_->pad_tokens(dy, c_.num_patches() + 1) : dy;
    if (ctx.training && c_.drop_rate > 0) {
      if (nd) {
        ForwardCtx sub = ctx;
        sub.sample_offset += tp_->layout(0).chunk * dy.size(0);
        const int64_t n = c_.num_patches() + 1, d = c_.embed_dim;
        const auto [f0, f1] = tp_->feature_slice(d, 0);
        g = ops::dropout_bwd(g, c_.drop_rate, sub.key_slice("pos_drop", n * d, f0, f1 - f0, d));
      } else {
        g = ops::dropout_bwd(g, c_.drop_rate, ctx.key("pos_drop", g.numel() / g.size(0)));
      }
    }
    Tensor dt = ops::cls_pos_bwd(g, &grads[0], &grads[1], patches.dtype());
    const int64_t row = patches.size(-1);
    overlap_before(ctx, "embedding", "patch_embed.proj", nd);
    Tensor dw = grads[2].reshape({grads[2].size(0), row});
    ops::linear_bwd_weight(patches, dt, &dw, &grads[3]);
  };
  if (!sp) {
    // Nothing flows back to the images: all of it is parameter gradients (split: all in W).
    ForwardCtx c = ctx;
    c.overlap_point = nullptr;
    wg.run([this, param_grads, dy, patches = cc.patches, c] {
      Tensor grads[4] = {cls_token.grad, pos_embed.grad, proj.weight.grad, proj.bias.grad};
      param_grads(dy, patches, c, grads);
    });
    wg.finish(cache);
    return Tensor();  // images need no gradient
  }
  // Sequence parallel: this rank's tokens give part of every parameter gradient; the parts are
  // computed into one buffer and summed over the group (in B: the collective stays there).
  Tensor grads[4];
  Tensor flat = grad_buffer(ps, dy.device(), grads);
  param_grads(dy, cc.patches, ctx, grads);
  flat = sum_grad_buffer(*tp_, flat,
                         nd ? std::optional<TpGroup>(tp_->layout(0).replica_group) : std::nullopt);
  wg.run([ps, flat] { add_grad_buffer(ps, flat); });
  wg.finish(cache);
  return Tensor();  // images need no gradient
}

void Embedding::collect(std::vector<Parameter*>& out) {
  out.push_back(&cls_token);
  out.push_back(&pos_embed);
  proj.collect(out);
}

// ---------------------------------------------------------------------------------------------
// Block

struct Block::Acts : Cache {
  Tensor x, mean1, rstd1, a, qkv, probs, o;  // attention half
  Tensor h, mean2, rstd2, b, f, m;           // MLP half (f: fc1 output, m: fc2 input)
  bool full = false;                         // false: only x kept (checkpointed)
  ComputeCopies::Kept copies;  // the forward's rounded weights, for the backward's GEMMs
};

Block::Block(const ViTConfig& c, int64_t index, float drop_path, TensorParallel* tp)
    : c_(c), prefix_("blocks." + std::to_string(index)), drop_path_(drop_path), tp_(tp) {
  const int64_t d = c.embed_dim, hid = c.mlp_hidden();
  const int T = tp ? tp->size() : 1, r = tp ? tp->rank() : 0;
  checkpoint = c.checkpoint;
  if (tp && tp->nd()) {
    c.validate_tensor_parallel(tp->mode(), T, tp->depth(), false);
    auto linear = [&](const std::string& n, int64_t in, int64_t out, int orient, int groups) {
      const auto [w, b] = tp->linear_specs(in, out, orient, groups);
      return Linear::sharded(prefix_ + n, in, out, w, b);
    };
    norm1 = LayerNorm(prefix_ + ".norm1", tp->feature_spec({d}, 0, 0));
    qkv = linear(".attn.qkv", d, 3 * d, 0, 3);
    proj = linear(".attn.proj", d, d, 1, 1);
    norm2 = LayerNorm(prefix_ + ".norm2", tp->feature_spec({d}, 0, 0));
    fc1 = linear(".mlp.fc1", d, hid, 0, 1);
    fc2 = linear(".mlp.fc2", hid, d, 1, 1);
    heads_ = c.num_heads / tp->q();
    hidden_ = hid / tp->q();
    return;
  }
  if (T > 1) c.validate_tensor_parallel(T, tp->sequence_parallel());
  norm1 = LayerNorm(prefix_ + ".norm1", d);
  qkv = Linear::column(prefix_ + ".attn.qkv", d, 3 * d, r, T, 3);  // whole heads of q, k, v
  proj = Linear::row(prefix_ + ".attn.proj", d, d, r, T);
  norm2 = LayerNorm(prefix_ + ".norm2", d);
  fc1 = Linear::column(prefix_ + ".mlp.fc1", d, hid, r, T);
  fc2 = Linear::row(prefix_ + ".mlp.fc2", hid, d, r, T);
  heads_ = c.num_heads / T;
  hidden_ = hid / T;
}

ForwardCtx Block::chunk_ctx(const ForwardCtx& ctx, int orient, int64_t samples) const {
  ForwardCtx sub = ctx;
  sub.sample_offset += tp_->layout(orient).chunk * samples;
  return sub;
}

ops::RngKey Block::nd_key(const ForwardCtx& ctx, const std::string& site, int orient,
                          int64_t samples, int64_t features) const {
  const int64_t n = c_.num_patches() + 1;
  const auto [f0, f1] = tp_->feature_slice(features, orient);
  return chunk_ctx(ctx, orient, samples).key_slice(site, n * features, f0, f1 - f0, features);
}

void Block::run_forward_nd(const Tensor& x, Acts& a, const ForwardCtx& ctx) {
  TensorParallel& tp = *tp_;
  const bool drop = ctx.training && c_.drop_rate > 0;
  const bool dpath = ctx.training && drop_path_ > 0;
  const int64_t bs = x.size(0), d = c_.embed_dim;
  a.x = x;
  a.a = nd_layernorm_fwd(tp, x, norm1, compute_dtype, &a.mean1, &a.rstd1);
  a.qkv = nd_linear_fwd(tp, a.a, qkv, 0);
  a.o = ops::attention_fwd(a.qkv, heads_, &a.probs);
  Tensor y = nd_linear_fwd(tp, a.o, proj, 1);
  if (drop)
    y = ops::dropout_fwd(y, c_.drop_rate, nd_key(ctx, prefix_ + ".attn.proj_drop", 0, bs, d));
  if (dpath)
    y = ops::drop_path_fwd(y, drop_path_, chunk_ctx(ctx, 0, bs).key(prefix_ + ".drop_path1", 1));
  a.h = ops::add(x, y);
  a.b = nd_layernorm_fwd(tp, a.h, norm2, compute_dtype, &a.mean2, &a.rstd2);
  a.f = nd_linear_fwd(tp, a.b, fc1, 0);
  a.m = ops::gelu_fwd(a.f, c_.act == "gelu_tanh" ? ops::Gelu::Tanh : ops::Gelu::Exact);
  if (drop)
    a.m = ops::dropout_fwd(a.m, c_.drop_rate,
                           nd_key(ctx, prefix_ + ".mlp.drop1", 1, a.m.size(0), c_.mlp_hidden()));
  a.full = true;
}

Tensor Block::backward_nd(const Tensor& dy, Acts& a, const ForwardCtx& ctx) {
  TensorParallel& tp = *tp_;
  const bool drop = ctx.training && c_.drop_rate > 0;
  const bool dpath = ctx.training && drop_path_ > 0;
  const int64_t bs = dy.size(0), d = c_.embed_dim;
  // The LayerNorms' gradients of this rank's samples, summed over the replica group at the end.
  const GradParams ln_params = {&norm2.weight, &norm2.bias, &norm1.weight, &norm1.bias};
  Tensor ln[4];
  Tensor ln_flat = grad_buffer(ln_params, dy.device(), ln);
  const auto kind = c_.act == "gelu_tanh" ? ops::Gelu::Tanh : ops::Gelu::Exact;

  Tensor g = dy;
  if (dpath)
    g = ops::drop_path_bwd(g, drop_path_, chunk_ctx(ctx, 0, bs).key(prefix_ + ".drop_path2", 1));
  if (drop) g = ops::dropout_bwd(g, c_.drop_rate, nd_key(ctx, prefix_ + ".mlp.drop2", 0, bs, d));
  Tensor gm = nd_linear_bwd(tp, a.m, fc2, g, 1);
  if (drop)
    gm = ops::dropout_bwd(gm, c_.drop_rate,
                          nd_key(ctx, prefix_ + ".mlp.drop1", 1, gm.size(0), c_.mlp_hidden()));
  Tensor gf = ops::gelu_bwd(a.f, gm, kind);
  Tensor gb = nd_linear_bwd(tp, a.b, fc1, gf, 0);
  Tensor gh = nd_layernorm_bwd(tp, a.h, norm2, a.mean2, a.rstd2, gb, &ln[0], &ln[1]);
  ops::add_(gh, dy);

  Tensor gy = gh;
  if (dpath)
    gy = ops::drop_path_bwd(gy, drop_path_, chunk_ctx(ctx, 0, bs).key(prefix_ + ".drop_path1", 1));
  if (drop)
    gy = ops::dropout_bwd(gy, c_.drop_rate, nd_key(ctx, prefix_ + ".attn.proj_drop", 0, bs, d));
  Tensor go = nd_linear_bwd(tp, a.o, proj, gy, 1);
  Tensor gq = ops::attention_bwd(a.qkv, a.o, a.probs, go, heads_);
  Tensor ga = nd_linear_bwd(tp, a.a, qkv, gq, 0);
  Tensor gx = nd_layernorm_bwd(tp, a.x, norm1, a.mean1, a.rstd1, ga, &ln[2], &ln[3]);
  ops::add_(gx, gh);
  add_grad_buffer(ln_params, sum_grad_buffer(tp, ln_flat, tp.layout(0).replica_group));
  return gx;
}

ForwardCtx Block::part_ctx(const ForwardCtx& ctx, const Tensor& local) const {
  if (!sp()) return ctx;
  const TensorParallel::SeqPart p = tp_->seq_part_of(local, c_.num_patches() + 1);
  ForwardCtx sub = ctx;
  if (p.by_samples) sub.sample_offset += p.s0;
  return sub;
}

ops::RngKey Block::resid_key(const ForwardCtx& ctx, const std::string& site,
                             const Tensor& local) const {
  const int64_t n = c_.num_patches() + 1, d = c_.embed_dim;
  if (!sp()) return ctx.key(site, n * d);
  const TensorParallel::SeqPart p = tp_->seq_part_of(local, n);
  if (p.by_samples) {
    ForwardCtx sub = ctx;
    sub.sample_offset += p.s0;
    return sub.key(site, n * d);
  }
  return ctx.key_slice(site, n * d, p.t0 * d, p.tokens() * d, n * d);
}

ops::RngKey Block::hidden_key(const ForwardCtx& ctx, const std::string& site) const {
  const int64_t n = c_.num_patches() + 1, hid = c_.mlp_hidden();
  if (hidden_ == hid) return ctx.key(site, n * hid);
  return ctx.key_slice(site, n * hid, tp_rank() * hidden_, hidden_, hid);
}

void Block::run_forward(const Tensor& x, Acts& a, const ForwardCtx& ctx, bool keep_gathered) {
  if (nd()) return run_forward_nd(x, a, ctx);
  const bool drop = ctx.training && c_.drop_rate > 0;
  const bool dpath = ctx.training && drop_path_ > 0;
  const int64_t n = c_.num_patches() + 1;
  a.x = x;
  // Residual stream x, h in fp32; the normalised inputs and everything up to the residual adds
  // in compute_dtype. Sequence parallel: x and h hold this rank's tokens; the normalised inputs
  // are gathered for the column-parallel GEMMs, and only this rank's tokens of them are kept
  // (backward gathers them again for the weight gradients, as Megatron-LM does).
  a.a = ops::layernorm_fwd(x, norm1.weight.value, norm1.bias.value, norm1.eps, &a.mean1, &a.rstd1,
                           compute_dtype);
  {
    const Tensor whole = sp() ? tp_->gather_tokens(a.a, n) : a.a;
    a.qkv = ops::linear_fwd(whole, qkv.w(), &qkv.b());
    if (keep_gathered) a.a = whole;
  }
  a.o = ops::attention_fwd(a.qkv, heads_, &a.probs);
  if (fused_residual(ctx)) {
    a.h = ops::linear_fwd_residual(a.o, proj.w(), &proj.bias.value, x);
  } else {
    Tensor y = row_linear_fwd(tp_, a.o, proj);
    if (drop) y = ops::dropout_fwd(y, c_.drop_rate, resid_key(ctx, prefix_ + ".attn.proj_drop", y));
    if (dpath)
      y = ops::drop_path_fwd(y, drop_path_, part_ctx(ctx, y).key(prefix_ + ".drop_path1", 1));
    a.h = ops::add(x, y);
  }
  a.b = ops::layernorm_fwd(a.h, norm2.weight.value, norm2.bias.value, norm2.eps, &a.mean2, &a.rstd2,
                           compute_dtype);
  {
    const Tensor whole = sp() ? tp_->gather_tokens(a.b, n) : a.b;
    if (c_.act == "gelu_tanh") {
      a.m = ops::linear_gelu_fwd(whole, fc1.w(), fc1.b(), &a.f);
    } else {
      a.f = ops::linear_fwd(whole, fc1.w(), &fc1.b());
      a.m = ops::gelu_fwd(a.f);
    }
    if (keep_gathered) a.b = whole;
  }
  if (drop) a.m = ops::dropout_fwd(a.m, c_.drop_rate, hidden_key(ctx, prefix_ + ".mlp.drop1"));
  a.full = true;
}

Tensor Block::forward(const Tensor& x, std::unique_ptr<Cache>& cache, const ForwardCtx& ctx) {
  const int64_t features = nd() ? c_.embed_dim / tp_->q() : c_.embed_dim;
  CAI_CHECK(x.dim() == 3 && x.size(2) == features,
            "[{}] expects tokens [batch, tokens, {}], got {}", prefix_, features, x.str());
  auto a = std::make_unique<Acts>();
  if (next && ctx.training && takes_dy_as_is(ctx)) {
    // This block runs here: the next one's dx comes back to it as fc2's output gradient.
    if (compute_dtype != DType::F32) next->send_half_dx_ = true;
    next->send_dx_sum_ = true;
  }
  // The weights in the compute dtype once for the block's GEMMs (1D and no tensor parallelism).
  std::optional<ComputeCopies> copies;
  if (!nd()) copies.emplace(compute_dtype, std::initializer_list<Linear*>{&qkv, &proj, &fc1, &fc2});
  run_forward(x, *a, ctx);
  Tensor y;
  if (nd()) {
    const int64_t bs = x.size(0);
    y = nd_linear_fwd(*tp_, a->m, fc2, 1);
    if (ctx.training && c_.drop_rate > 0)
      y = ops::dropout_fwd(y, c_.drop_rate,
                           nd_key(ctx, prefix_ + ".mlp.drop2", 0, bs, c_.embed_dim));
    if (ctx.training && drop_path_ > 0)
      y = ops::drop_path_fwd(y, drop_path_, chunk_ctx(ctx, 0, bs).key(prefix_ + ".drop_path2", 1));
  } else if (!fused_residual(ctx)) {
    y = row_linear_fwd(tp_, a->m, fc2);
    if (ctx.training && c_.drop_rate > 0)
      y = ops::dropout_fwd(y, c_.drop_rate, resid_key(ctx, prefix_ + ".mlp.drop2", y));
    if (ctx.training && drop_path_ > 0)
      y = ops::drop_path_fwd(y, drop_path_, part_ctx(ctx, y).key(prefix_ + ".drop_path2", 1));
  }
  Tensor out = y.defined() ? ops::add(a->h, y)
                           : ops::linear_fwd_residual(a->m, fc2.w(), &fc2.bias.value, a->h);
  // The GELU's output is made again by the backward (ViTConfig::gelu_recomputed).
  if (c_.gelu_recomputed(nd())) a->m = Tensor();
  if (checkpoint) {
    // Keep only the input; backward recomputes the rest with the same RNG keys.
    Tensor keep = a->x;
    *a = Acts{};
    a->x = keep;
  } else if (copies && ctx.training && keep_compute_copies) {
    a->copies = copies->keep();
  }
  cache = std::move(a);
  return out;
}

Tensor Block::backward(const Tensor& dy, std::unique_ptr<Cache>& cache, const ForwardCtx& ctx) {
  auto& a = cache_as<Acts>(cache, prefix_);
  std::optional<ComputeCopies> copies;
  if (!a.copies.empty())
    copies.emplace(a.copies);
  else if (!nd())
    copies.emplace(compute_dtype, std::initializer_list<Linear*>{&qkv, &proj, &fc1, &fc2});
  if (!a.full) run_forward(Tensor(a.x), a, ctx, true);
  if (nd()) {
    // 2d/2.5d/3d: a combined backward (the weight gradients are reduced inside); split: all in B.
    Tensor gx = backward_nd(dy, a, ctx);
    cache.reset();
    return gx;
  }
  // Split backward: the four weight GEMMs go to W with their inputs and output gradients; the
  // bias and LayerNorm gradients that fused passes of B make anyway go to W as partial sums.
  WeightGrads wg(ctx);
  const bool drop = ctx.training && c_.drop_rate > 0;
  const bool dpath = ctx.training && drop_path_ > 0;
  const int64_t n = c_.num_patches() + 1;
  // Sequence parallel: the LayerNorms see this rank's tokens only; their gradients are computed
  // apart and summed over the group at the end.
  Tensor ln_flat, ln[4];  // norm2 weight, bias, norm1 weight, bias
  const GradParams ln_params = {&norm2.weight, &norm2.bias, &norm1.weight, &norm1.bias};
  if (sp()) {
    ln_flat = grad_buffer(ln_params, dy.device(), ln);
  } else {
    for (int i = 0; i < 4; ++i) ln[i] = wg.into(*ln_params[i]);
  }

  // MLP half: out = h + dpath(drop(fc2(m)))
  // fc2's bias gradient: the column sums the next block made of g, when it made them.
  Tensor fc2_bias_sum;
  overlap_before(ctx, prefix_, "residual", false);
  overlap_before(ctx, prefix_, "mlp.fc2", false);
  Tensor g = half_dy(dy, a.f.dtype(), &fc2_bias_sum);
  if (!takes_dy_as_is(ctx)) fc2_bias_sum = Tensor();
  if (!g.defined() || !takes_dy_as_is(ctx)) g = dy;
  Parameter* fc2_db = fc2_bias_sum.defined() ? nullptr : &fc2.bias;
  if (dpath)
    g = ops::drop_path_bwd(g, drop_path_, part_ctx(ctx, g).key(prefix_ + ".drop_path2", 1));
  if (drop) g = ops::dropout_bwd(g, c_.drop_rate, resid_key(ctx, prefix_ + ".mlp.drop2", g));
  // Sequence parallel: fc2's output gradient gathered in the compute dtype its GEMMs take (cast
  // here, on this rank's part: half the bytes of gathering fp32 and casting the whole).
  if (sp() && g.dtype() != a.f.dtype()) g = g.to(a.f.dtype());
  if (sp()) g = tp_->gather_tokens(g, n);
  // Sequence parallel: fc1's input again whole (forward kept this rank's tokens), gathered
  // beside fc2's and the GELU's backward.
  const bool regather = sp() && !same_rows(a.b, g);
  std::optional<TensorParallel::TokenGather> b_whole;
  if (regather) b_whole = tp_->gather_tokens_start(a.b, n);
  const bool tanh = c_.act == "gelu_tanh";
  const bool lean = c_.recompute_gelu;
  // With model.recompute_gelu (`lean`), every tensor below is released as soon as nothing later
  // reads it (the Cache's included), so a block's backward holds a few of its working tensors at
  // a time, not all of them; without it they live to the end of the backward, as before (its
  // cost in img/s: docs/bench/h200-gelu-table). The plan's block_plan follows either. A deferred
  // weight gradient keeps what it reads by itself.
  Tensor gf;
  bool fc1_bias_done = false;
  if (!a.m.defined()) {
    // The GELU's output was not kept (ViTConfig::gelu_recomputed): fc2's input gradient, then
    // the GELU's backward makes it again in its own pass, for fc2's weight gradient.
    if (g.dtype() != a.f.dtype()) g = g.to(a.f.dtype());  // once for both of fc2's GEMMs
    Tensor gm = ops::linear_bwd_input(fc2.w(), g, a.f.dtype());
    Tensor fc1_db = wg.into(fc1.bias);
    Tensor m;
    overlap_before(ctx, prefix_, "mlp.act", false);
    gf = ops::gelu_bwd_bias(a.f, gm, ops::Gelu::Exact, &fc1_db, &m);
    fc1_bias_done = true;
    if (lean) gm = Tensor();
    if (lean) a.f = Tensor();
    wg.run([this, m, g, fc2_db] {
      ops::linear_bwd_weight(m, g, &fc2.weight.grad, fc2_db ? &fc2_db->grad : nullptr);
    });
  } else if (tanh && !drop) {  // fc2's input gradient through the GELU in one (the DGELU epilogue)
    if (wg.deferred()) {
      gf = ops::linear_dgelu_bwd(a.m, fc2.w(), g, a.f, nullptr, nullptr);
      wg.run([this, m = a.m, g, fc2_db] {
        ops::linear_bwd_weight(m, g, &fc2.weight.grad, fc2_db ? &fc2_db->grad : nullptr);
      });
    } else {
      gf = ops::linear_dgelu_bwd(a.m, fc2.w(), g, a.f, &fc2.weight.grad,
                                 fc2_db ? &fc2_db->grad : nullptr);
    }
    overlap_before(ctx, prefix_, "mlp.act", false);  // fused with fc2's input gradient
    if (lean) a.m = a.f = Tensor();
  } else {
    Tensor gm = linear_bwd(wg, a.m, fc2.w(), g, &fc2.weight, fc2_db);
    if (lean) a.m = Tensor();
    if (drop) gm = ops::dropout_bwd(gm, c_.drop_rate, hidden_key(ctx, prefix_ + ".mlp.drop1"));
    // fc1's bias gradient (the column sums of gf) from the GELU's backward pass itself.
    Tensor fc1_db = wg.into(fc1.bias);
    overlap_before(ctx, prefix_, "mlp.act", false);
    gf = ops::gelu_bwd_bias(a.f, gm, tanh ? ops::Gelu::Tanh : ops::Gelu::Exact, &fc1_db);
    fc1_bias_done = true;
    if (lean) a.f = Tensor();
  }
  if (!fc2_db) wg.run([this, fc2_bias_sum] { ops::add_(fc2.bias.grad, fc2_bias_sum); });
  g = Tensor();  // fc2's output gradient (a rounded copy or a masked one) is done with
  // A re-gathered input is waited for after fc1's input-gradient GEMM, at its weight GEMM.
  overlap_before(ctx, prefix_, "mlp.fc1", false);
  Tensor gb = column_linear_bwd(tp_, regather ? Tensor() : a.b, fc1, gf, !fc1_bias_done, &wg,
                                regather ? &*b_whole : nullptr);
  if (lean) gf = Tensor();
  if (lean) a.b = Tensor();
  if (lean) b_whole.reset();
  // The residual stream's gradient gh = norm2'(gb) + dy in one pass; when proj's backward reads
  // it unchanged (no drop-path, dropout or gather between), the same pass also writes the copy in
  // the compute dtype that proj's GEMMs take, and proj's bias gradient (the column sums of what
  // its backward takes).
  const bool half = a.o.dtype() == DType::BF16 || a.o.dtype() == DType::F16;
  const bool gy_as_is = !dpath && !drop && !sp();
  const bool half_gy = half && gy_as_is;
  Tensor gh_half, proj_db;
  if (gy_as_is) proj_db = wg.into(proj.bias);
  overlap_before(ctx, prefix_, "norm2", false);
  Tensor gh = ops::layernorm_bwd_add(a.h, norm2.weight.value, a.mean2, a.rstd2, gb, dy, &ln[0],
                                     &ln[1], a.o.dtype(), half_gy ? &gh_half : nullptr,
                                     gy_as_is ? &proj_db : nullptr);
  if (lean) gb = Tensor();
  if (lean) a.h = a.mean2 = a.rstd2 = Tensor();

  // Attention half: h = x + dpath(drop(proj(attn(qkv(norm1(x))))))
  Tensor gy = half_gy ? gh_half : gh;
  if (lean) gh_half = Tensor();
  if (dpath)
    gy = ops::drop_path_bwd(gy, drop_path_, part_ctx(ctx, gy).key(prefix_ + ".drop_path1", 1));
  if (drop)
    gy = ops::dropout_bwd(gy, c_.drop_rate, resid_key(ctx, prefix_ + ".attn.proj_drop", gy));
  if (sp() && gy.dtype() != a.o.dtype()) gy = gy.to(a.o.dtype());  // as fc2's above
  if (sp()) gy = tp_->gather_tokens(gy, n);
  // Sequence parallel: qkv's input again whole, gathered beside proj's and attention's backward.
  const bool regather_a = sp() && !same_rows(a.a, gy);
  std::optional<TensorParallel::TokenGather> a_whole;
  if (regather_a) a_whole = tp_->gather_tokens_start(a.a, n);
  overlap_before(ctx, prefix_, "attn.proj", false);
  Tensor go = linear_bwd(wg, a.o, proj.w(), gy, &proj.weight, gy_as_is ? nullptr : &proj.bias);
  if (lean) gy = Tensor();
  overlap_before(ctx, prefix_, "attn", false);
  // qkv's bias gradient from the fused attention backward (q: dQ's column sums from its own
  // pass; k: 0, v: dout's column sums, by the softmax's identities: flash_attention.cu).
  const bool qkv_fused_db = qkv.has_bias && ops::attention_bwd_sums_bias(a.probs);
  Tensor qkv_db = qkv_fused_db ? wg.into(qkv.bias) : Tensor();
  const DType out_dtype = a.o.dtype();
  Tensor gq = ops::attention_bwd(a.qkv, a.o, a.probs, go, heads_, qkv_fused_db ? &qkv_db : nullptr);
  if (lean) go = Tensor();
  if (lean) a.qkv = a.o = a.probs = Tensor();
  overlap_before(ctx, prefix_, "attn.qkv", false);
  Tensor ga = column_linear_bwd(tp_, regather_a ? Tensor() : a.a, qkv, gq, !qkv_fused_db, &wg,
                                regather_a ? &*a_whole : nullptr);
  if (lean) gq = Tensor();
  if (lean) a.a = Tensor();
  if (lean) a_whole.reset();
  // The block before this one takes gx rounded: from the same pass.
  const bool send = send_half_dx_ && half && !sp();
  const bool send_sum = send_dx_sum_ && !sp() && (send || !half);
  Tensor gx_half, gx_sum;
  if (send_sum) gx_sum = Tensor::empty({c_.embed_dim}, DType::F32, dy.device());
  overlap_before(ctx, prefix_, "norm1", false);
  Tensor gx = ops::layernorm_bwd_add(a.x, norm1.weight.value, a.mean1, a.rstd1, ga, gh, &ln[2],
                                     &ln[3], out_dtype, send ? &gx_half : nullptr,
                                     send_sum ? &gx_sum : nullptr, false);
  if (lean) ga = gh = Tensor();
  if (lean) a.x = a.mean1 = a.rstd1 = Tensor();
  if (send || send_sum) dx_ = gx, dx_half_ = gx_half, dx_sum_ = gx_sum;
  if (sp()) {
    ln_flat = sum_grad_buffer(*tp_, ln_flat, std::nullopt);
    wg.run([ln_params, ln_flat] { add_grad_buffer(ln_params, ln_flat); });
  }
  wg.finish(cache);
  return gx;
}

Tensor Block::half_dy(const Tensor& dy, DType t, Tensor* sum) {
  *sum = Tensor();
  if (!next) return Tensor();
  Tensor h;
  if (next->dx_.defined() && next->dx_.raw() == dy.raw() && next->dx_.shape() == dy.shape()) {
    if (next->dx_half_.defined() && next->dx_half_.dtype() == t) h = next->dx_half_;
    // The sums are of the copy when there is one, else of dy: what fc2's backward takes.
    if (next->dx_sum_.defined() && (next->dx_half_.defined() ? h.defined() : t == DType::F32))
      *sum = next->dx_sum_;
  }
  next->dx_ = next->dx_half_ = next->dx_sum_ = Tensor();
  return h;
}

void Block::collect(std::vector<Parameter*>& out) {
  norm1.collect(out);
  qkv.collect(out);
  proj.collect(out);
  norm2.collect(out);
  fc1.collect(out);
  fc2.collect(out);
}

// ---------------------------------------------------------------------------------------------
// Head: timm applies the final norm to every token and then takes the class token; normalising
// only the class token gives the same logits and gradients with less work.

namespace {
struct HeadCache : Cache {
  int64_t tokens = 0;
  Tensor t, mean, rstd, z;
  TensorParallel::SeqPart part;  // sequence parallel: the samples / tokens of this rank's input
};
}  // namespace

Head::Head(const ViTConfig& c, TensorParallel* tp) : c_(c), tp_(tp) {
  if (tp && tp->nd()) {
    // 2d/2.5d/3d: the norm and the classifier's input features cut by layout 0's features.
    norm = LayerNorm("norm", tp->feature_spec({c.embed_dim}, 0, 0));
    head = Linear::sharded("head", c.embed_dim, c.num_classes,
                           tp->feature_spec({c.num_classes, c.embed_dim}, 1, 0),
                           ShardSpec::split({c.num_classes}, 0, 1, 0, 1));
    return;
  }
  norm = LayerNorm("norm", c.embed_dim);
  const int T = tp ? tp->size() : 1, r = tp ? tp->rank() : 0;
  head = Linear::row("head", c.embed_dim, c.num_classes, r, T);
}

Tensor Head::forward(const Tensor& x, std::unique_ptr<Cache>& cache, const ForwardCtx&) {
  const int64_t features = tp_ && tp_->nd() ? c_.embed_dim / tp_->q() : c_.embed_dim;
  CAI_CHECK(x.dim() == 3 && x.size(2) == features,
            "[head] expects tokens [batch, tokens, {}], got {}", features, x.str());
  const bool tp = tp_ && tp_->size() > 1;
  auto hc = std::make_unique<HeadCache>();
  hc->tokens = x.size(1);
  if (tp && tp_->nd()) {
    // This rank's samples and features: partial logits summed over the feature group, then
    // every batch chunk's gathered over the replica group (the whole batch on every rank).
    const TensorParallel::Layout& l = tp_->layout(0);
    hc->t = ops::select_token_fwd(x, 0);
    hc->z = nd_layernorm_fwd(*tp_, hc->t, norm, compute_dtype, &hc->mean, &hc->rstd);
    Tensor logits = ops::linear_fwd(hc->z, head.weight.value,
                                    l.feature == 0 ? &head.bias.value : nullptr, DType::F32);
    logits = tp_->all_reduce(l.feature_group, logits);
    const int64_t n = logits.numel();
    Tensor all = tp_->all_gather(l.replica_group, logits, std::vector<int64_t>(l.chunks, n));
    cache = std::move(hc);
    return all.reshape({x.size(0) * l.chunks, c_.num_classes});
  }
  if (tp && tp_->sequence_parallel()) {
    hc->part = tp_->seq_part_of(x, c_.num_patches() + 1);
    if (hc->part.by_samples) {
      // Every rank's samples' class tokens, gathered in sample order.
      const Tensor mine = ops::select_token_fwd(x, 0);
      const int64_t each = mine.numel();
      hc->t = tp_->all_gather(TpGroup::All, mine, std::vector<int64_t>(tp_->size(), each))
                  .reshape({x.size(0) * tp_->size(), x.size(2)});
    } else {
      // The class token is rank 0's: shared with the group by a sum with zeros elsewhere.
      hc->t = tp_->rank() == 0 ? ops::select_token_fwd(x, 0)
                               : Tensor::zeros({x.size(0), x.size(2)}, x.dtype(), x.device());
      hc->t = tp_->all_reduce(hc->t);
    }
  } else {
    hc->t = ops::select_token_fwd(x, 0);
  }
  hc->z = ops::layernorm_fwd(hc->t, norm.weight.value, norm.bias.value, norm.eps, &hc->mean,
                             &hc->rstd, compute_dtype);
  // Logits in fp32 (the loss is computed in fp32). Tensor parallel: this rank's input features,
  // partial logits summed over the group, the bias added once.
  if (tp) hc->z = tp_->slice_features(hc->z);
  Tensor logits = ops::linear_fwd(hc->z, head.weight.value,
                                  !tp || tp_->rank() == 0 ? &head.bias.value : nullptr, DType::F32);
  if (tp) logits = tp_->all_reduce(logits);
  cache = std::move(hc);
  return logits;
}

Tensor Head::backward(const Tensor& dy, std::unique_ptr<Cache>& cache, const ForwardCtx& ctx) {
  auto& hc = cache_as<HeadCache>(cache, "head");
  const bool tp = tp_ && tp_->size() > 1;
  if (tp && tp_->nd()) {
    // This rank's samples of the logits' gradient; the parameter gradients of those samples
    // summed over the replica group in one all-reduce.
    const TensorParallel::Layout& l = tp_->layout(0);
    const int64_t bs = hc.t.size(0);
    CAI_CHECK(dy.dim() == 2 && dy.size(0) == bs * l.chunks,
              "[head] logits gradient {} does not match {} samples", dy.str(), bs * l.chunks);
    const Tensor dyc = dy.narrow(l.chunk * bs, bs);
    const GradParams ps = {&head.weight, &head.bias, &norm.weight, &norm.bias};
    Tensor g[4];
    const Tensor flat = grad_buffer(ps, dy.device(), g);
    Tensor gz = ops::linear_bwd(hc.z, head.weight.value, dyc, &g[0], &g[1]);
    Tensor gt = nd_layernorm_bwd(*tp_, hc.t, norm, hc.mean, hc.rstd, gz, &g[2], &g[3]);
    add_grad_buffer(ps, sum_grad_buffer(*tp_, flat, l.replica_group));
    Tensor gx = ops::select_token_bwd(gt, hc.tokens, 0);
    cache.reset();
    return gx;
  }
  // Split backward: the classifier's GEMM goes to W with z and dy, the norm's gradients as sums.
  WeightGrads wg(ctx);
  Tensor gz = linear_bwd(wg, hc.z, head.weight.value, dy, &head.weight, &head.bias);
  if (tp) gz = tp_->gather_features(gz);
  Tensor dgamma = wg.into(norm.weight), dbeta = wg.into(norm.bias);
  Tensor gt = ops::layernorm_bwd(hc.t, norm.weight.value, hc.mean, hc.rstd, gz, &dgamma, &dbeta);
  Tensor gx;
  const bool sp = tp && tp_->sequence_parallel();
  if (sp && hc.part.by_samples)  // this rank's samples' class tokens
    gx = ops::select_token_bwd(gt.narrow(hc.part.s0, hc.part.samples()), hc.tokens, 0);
  else if (sp && tp_->rank() != 0)  // by tokens: the class token is rank 0's
    gx = Tensor::zeros({gt.size(0), hc.tokens, gt.size(1)}, gt.dtype(), gt.device());
  else
    gx = ops::select_token_bwd(gt, hc.tokens, 0);
  wg.finish(cache);
  return gx;
}

void Head::collect(std::vector<Parameter*>& out) {
  norm.collect(out);
  head.collect(out);
}

// ---------------------------------------------------------------------------------------------
// ViT

ViT::ViT(const ViTConfig& c, std::shared_ptr<TensorParallel> tp) : c_(c), tp_(std::move(tp)) {
  c.validate();
  if (tp_)
    c.validate_tensor_parallel(tp_->mode(), tp_->size(), tp_->depth(), tp_->sequence_parallel());
  TensorParallel* t = tp_.get();
  layers_.push_back(std::make_unique<Embedding>(c, t));
  Block* prev = nullptr;
  for (int64_t i = 0; i < c.depth; ++i) {
    auto b = std::make_unique<Block>(c, i, c.block_drop_path(i), t);
    if (prev) prev->next = b.get();
    prev = b.get();
    layers_.push_back(std::move(b));
  }
  layers_.push_back(std::make_unique<Head>(c, t));
}

Shape ViT::residual_shape(int64_t batch) const {
  const int64_t n = c_.num_patches() + 1;
  if (tp_ && tp_->nd()) {
    const auto [s0, s1] = tp_->batch_range(batch, 0);
    const auto [f0, f1] = tp_->feature_slice(c_.embed_dim, 0);
    return {s1 - s0, n, f1 - f0};
  }
  if (!tp_ || tp_->size() == 1 || !tp_->sequence_parallel()) return {batch, n, c_.embed_dim};
  const TensorParallel::SeqPart p = tp_->my_seq_part(batch, n);
  return {p.samples(), p.tokens(), c_.embed_dim};
}

std::vector<Parameter*> ViT::parameters() {
  std::vector<Parameter*> out;
  for (auto& l : layers_) l->collect(out);
  return out;
}

Parameter& ViT::parameter(const std::string& name) {
  for (Parameter* p : parameters())
    if (p->name == name) return *p;
  fail("[vit] no parameter named '{}'", name);
}

void ViT::to(Device dev) {
  for (Parameter* p : parameters()) {
    if (p->value.defined()) p->value = p->value.to(dev);
    if (p->grad.defined()) p->grad = p->grad.to(dev);
  }
}

Device ViT::device() {
  for (Parameter* p : parameters())
    if (p->value.defined()) return p->value.device();
  return Device::cpu();
}

void ViT::set_compute_dtype(DType t) {
  CAI_CHECK(t == DType::F32 || t == DType::BF16 || t == DType::F16,
            "[vit] compute dtype {} must be fp32, bf16 or fp16", dtype_name(t));
  for (auto& l : layers_) l->compute_dtype = t;
}

DType ViT::compute_dtype() const {
  return layers_.front()->compute_dtype;
}

int64_t ViT::num_parameters() {
  int64_t n = 0;
  for (Parameter* p : parameters()) n += p->value.numel();
  return n;
}

void ViT::zero_grad() {
  std::vector<Tensor*> grads;
  for (Parameter* p : parameters()) grads.push_back(&p->grad);
  zero_all(grads);
}

void ViT::init(uint64_t seed) {
  for (Parameter* p : parameters()) init_parameter(*p, seed, c_);
}

void init_parameter(Parameter& p, uint64_t seed, const ViTConfig& c) {
  // A tensor-parallel shard: the whole parameter is drawn, then cut.
  Tensor v = p.shard.sharded() ? Tensor::zeros(p.shard.full) : p.value;
  const std::string& n = p.name;
  const uint64_t s = p.init_stream();
  auto ends_with = [&](const char* suf) {
    const std::string t(suf);
    return n.size() >= t.size() && n.compare(n.size() - t.size(), t.size(), t) == 0;
  };
  if (n == "cls_token") {
    rng::normal_(v, seed, s, 0.0f, 1e-6f);
  } else if (n == "pos_embed") {
    rng::trunc_normal_(v, seed, s, 0.0f, 0.02f, -2.0f, 2.0f);
  } else if (n.rfind("patch_embed.proj.", 0) == 0) {
    const int64_t fan_in = c.in_chans * c.patch_size * c.patch_size;
    const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
    rng::uniform_(v, seed, s, -bound, bound);
  } else if (n.find("norm") != std::string::npos) {
    ops::fill_(v, ends_with(".weight") ? 1.0f : 0.0f);
  } else if (ends_with(".weight")) {
    rng::trunc_normal_(v, seed, s, 0.0f, 0.02f, -2.0f, 2.0f);
  } else {
    v.zero_();
  }
  if (p.shard.sharded()) p.value.copy_from(shard_of(v, p.shard));
}

Tensor ViT::forward(const Tensor& img, std::vector<std::unique_ptr<Cache>>& caches,
                    const ForwardCtx& ctx, const LayerHooks* hooks) {
  caches.resize(layers_.size());
  Tensor x = img;
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer& l = *layers_[i];
    if (hooks && hooks->before_forward) hooks->before_forward(l);
    x = l.forward(x, caches[i], ctx);
    if (hooks && hooks->after_forward) hooks->after_forward(l);
  }
  return x;
}

void ViT::backward(const Tensor& dlogits, std::vector<std::unique_ptr<Cache>>& caches,
                   const ForwardCtx& ctx, const LayerHooks* hooks) {
  CAI_CHECK(caches.size() == layers_.size(), "[vit] backward needs {} caches, got {}",
            layers_.size(), caches.size());
  Tensor g = dlogits;
  ForwardCtx c = ctx;
  if (hooks && hooks->overlap_point) c.overlap_point = &hooks->overlap_point;
  for (size_t i = layers_.size(); i-- > 0;) {
    Layer& l = *layers_[i];
    if (hooks && hooks->before_backward) hooks->before_backward(l);
    g = l.backward(g, caches[i], c);
    if (hooks && hooks->after_backward) hooks->after_backward(l);
  }
}

}  // namespace cai::nn
