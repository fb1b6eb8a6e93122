// Ops on token streams and the rest: the patch embedding, class token and position embedding,
// token selection and copies, cross-entropy and the elementwise ops (split from ops.cpp).
#include "cai/ops/ops.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "cai/core/error.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/device.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/embed.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/linear.h"
#include "kernels/tokens.h"

#include "ops_internal.h"

namespace cai::ops {

using namespace detail;  // ops_internal.h

// ---------------------------------------------------------------------------------------------
// Embedding: patches and the patch GEMM in the compute dtype; the token stream from cls_pos on is
// fp32 (the residual stream).

Tensor patch_embed_fwd(const Tensor& img, const Tensor& w, const Tensor& b, Tensor* patches,
                       DType compute) {
  f32_only("patch_embed", img);
  floating_dtype("patch_embed", compute);
  CAI_CHECK(img.dim() == 4, "[patch_embed] image must be [batch, channels, height, width], got {}",
            img.str());
  CAI_CHECK(w.dim() == 4 && w.size(2) == w.size(3),
            "[patch_embed] weight must be [dim, channels, patch, patch], got {}", w.str());
  const int64_t B = img.size(0), C = img.size(1), H = img.size(2), W = img.size(3), p = w.size(2);
  CAI_CHECK(w.size(1) == C, "[patch_embed] image has {} channels, weight expects {}", C, w.size(1));
  CAI_CHECK(H % p == 0 && W % p == 0, "[patch_embed] image {}x{} is not divisible by patch {}", H,
            W, p);
  const int64_t np = (H / p) * (W / p), row = C * p * p;
  *patches = Tensor::empty({B, np, row}, compute, img.device());
  if (compute == DType::F32) {
    CAI_DISPATCH(img, patchify, f32(img), f32m(*patches), B, C, H, W, p);
  } else if (img.is_cuda()) {
    kernels::cuda::patchify_t(f32(img), kdt(compute), patches->raw(), B, C, H, W, p);
  } else {
    Tensor pf = Tensor::empty({B, np, row}, DType::F32, img.device());
    kernels::cpu::patchify(f32(img), f32m(pf), B, C, H, W, p);
    *patches = pf.to(compute);
  }
  return linear_fwd(*patches, w.reshape({w.size(0), row}), &b);
}

void patch_embed_bwd(const Tensor& patches, const Tensor& w, const Tensor& dy, Tensor* dw,
                     Tensor* db) {
  const int64_t row = patches.size(-1);
  Tensor dw2 = dw ? dw->reshape({w.size(0), row}) : Tensor();
  linear_bwd(patches, w.reshape({w.size(0), row}), dy, dw ? &dw2 : nullptr, db, false);
}

Tensor cls_pos_fwd(const Tensor& tokens, const Tensor& cls, const Tensor& pos) {
  floating("cls_pos", tokens);
  CAI_CHECK(tokens.dim() == 3, "[cls_pos] tokens must be [batch, patches, dim], got {}",
            tokens.str());
  const int64_t B = tokens.size(0), np = tokens.size(1), d = tokens.size(2);
  CAI_CHECK(cls.numel() == d, "[cls_pos] class token {} does not have dim {}", cls.str(), d);
  CAI_CHECK(pos.numel() == (np + 1) * d,
            "[cls_pos] position embedding {} does not fit {} tokens of dim {}", pos.str(), np + 1,
            d);
  Tensor out = Tensor::empty({B, np + 1, d}, DType::F32, tokens.device());
  if (tokens.dtype() == DType::F32)
    CAI_DISPATCH(tokens, cls_pos_fwd, f32(tokens), f32(cls), f32(pos), f32m(out), B, np, d);
  else if (tokens.is_cuda())
    kernels::cuda::cls_pos_fwd_t(kdt(tokens.dtype()), tokens.raw(), f32(cls), f32(pos), f32m(out),
                                 B, np, d);
  else
    out = cls_pos_fwd(up(tokens), cls, pos);
  return out;
}

Tensor cls_pos_bwd(const Tensor& dout, Tensor* dcls, Tensor* dpos, DType tokens_dtype) {
  f32_only("cls_pos", dout);
  floating_dtype("cls_pos", tokens_dtype);
  const int64_t B = dout.size(0), np = dout.size(1) - 1, d = dout.size(2);
  Tensor dt = Tensor::empty({B, np, d}, tokens_dtype, dout.device());
  if (tokens_dtype == DType::F32)
    CAI_DISPATCH(dout, cls_pos_bwd, f32(dout), f32m(dt), opt(dcls), opt(dpos), B, np, d);
  else if (dout.is_cuda())
    kernels::cuda::cls_pos_bwd_t(f32(dout), kdt(tokens_dtype), dt.raw(), opt(dcls), opt(dpos), B,
                                 np, d);
  else
    dt = as(cls_pos_bwd(dout, dcls, dpos, DType::F32), tokens_dtype);
  return dt;
}

Tensor select_token_fwd(const Tensor& x, int64_t index) {
  floating("select_token", x);
  CAI_CHECK(x.dim() == 3 && index >= 0 && index < x.size(1),
            "[select_token] token {} out of range for {}", index, x.str());
  Tensor out = Tensor::empty({x.size(0), x.size(2)}, x.dtype(), x.device());
  if (x.dtype() == DType::F32)
    CAI_DISPATCH(x, select_token_fwd, f32(x), f32m(out), x.size(0), x.size(1), x.size(2), index);
  else if (x.is_cuda())
    kernels::cuda::select_token_fwd_t(kdt(x.dtype()), x.raw(), out.raw(), x.size(0), x.size(1),
                                      x.size(2), index);
  else
    out = as(select_token_fwd(up(x), index), x.dtype());
  return out;
}

Tensor select_token_bwd(const Tensor& dout, int64_t n, int64_t index) {
  floating("select_token", dout);
  Tensor dx = Tensor::empty({dout.size(0), n, dout.size(1)}, dout.dtype(), dout.device());
  if (dout.dtype() == DType::F32)
    CAI_DISPATCH(dout, select_token_bwd, f32(dout), f32m(dx), dout.size(0), n, dout.size(1), index);
  else if (dout.is_cuda())
    kernels::cuda::select_token_bwd_t(kdt(dout.dtype()), dout.raw(), dx.raw(), dout.size(0), n,
                                      dout.size(1), index);
  else
    dx = as(select_token_bwd(up(dout), n, index), dout.dtype());
  return dx;
}

namespace {
void tokens_ranks_check(const char* op, const Tensor& full, const Tensor& staged, int ranks,
                        bool padded) {
  CAI_CHECK(full.defined() && staged.defined(), "[{}] full and staged must be defined", op);
  CAI_CHECK(full.dim() == 3, "[{}] full must be [B, N, F], got {}", op, full.str());
  CAI_CHECK(ranks >= 1 && full.size(1) >= ranks,
            "[{}] {} ranks need at least as many tokens, full is {}", op, ranks, full.str());
  const int64_t want =
      kernels::staged_numel(full.size(0), full.size(1), full.size(2), ranks, padded);
  CAI_CHECK(staged.numel() == want,
            "[{}] staged {} has {} elements; {} ({}) over {} ranks stages {}", op, staged.str(),
            staged.numel(), full.str(), padded ? "padded" : "packed", ranks, want);
  CAI_CHECK(full.dtype() == staged.dtype(), "[{}] full is {} but staged is {}", op,
            dtype_name(full.dtype()), dtype_name(staged.dtype()));
  same_device(op, full, staged);
}
}  // namespace

void tokens_from_ranks_(Tensor& full, const Tensor& staged, int ranks, bool padded) {
  tokens_ranks_check("tokens_from_ranks", full, staged, ranks, padded);
  const size_t es = dtype_size(full.dtype());
  const int64_t B = full.size(0), N = full.size(1), F = full.size(2);
  if (full.is_cuda())
    kernels::cuda::tokens_from_ranks(staged.raw(), full.raw(), es, B, N, F, ranks, padded);
  else
    kernels::cpu::tokens_from_ranks(staged.raw(), full.raw(), es, B, N, F, ranks, padded);
}

void tokens_to_ranks_(Tensor& staged, const Tensor& full, int ranks, bool padded) {
  tokens_ranks_check("tokens_to_ranks", full, staged, ranks, padded);
  const size_t es = dtype_size(full.dtype());
  const int64_t B = full.size(0), N = full.size(1), F = full.size(2);
  if (full.is_cuda())
    kernels::cuda::tokens_to_ranks(full.raw(), staged.raw(), es, B, N, F, ranks, padded);
  else
    kernels::cpu::tokens_to_ranks(full.raw(), staged.raw(), es, B, N, F, ranks, padded);
}

// Token ranges of [B, N, F] tensors: B rows of count·F elements, pitched N·F apart.
void copy_tokens_(Tensor& dst, int64_t dst_token, const Tensor& src, int64_t src_token,
                  int64_t count) {
  CAI_CHECK(dst.defined() && src.defined(), "[copy_tokens] dst and src must be defined");
  CAI_CHECK(dst.dim() == 3, "[copy_tokens] dst must be [B, N, F], got rank {} ({})", dst.dim(),
            dst.str());
  CAI_CHECK(src.dim() == 3, "[copy_tokens] src must be [B, N, F], got rank {} ({})", src.dim(),
            src.str());
  CAI_CHECK(dst.size(0) == src.size(0) && dst.size(2) == src.size(2),
            "[copy_tokens] dst {} and src {} differ in batch or features ([{}, :, {}] vs [{}, :, "
            "{}])",
            shape_str(dst.shape()), shape_str(src.shape()), dst.size(0), dst.size(2), src.size(0),
            src.size(2));
  CAI_CHECK(dst.dtype() == src.dtype(), "[copy_tokens] dst is {} but src is {}",
            dtype_name(dst.dtype()), dtype_name(src.dtype()));
  same_device("copy_tokens", dst, src);
  CAI_CHECK(count >= 0, "[copy_tokens] count {} is negative", count);
  const int64_t nd = dst.size(1), ns = src.size(1);
  CAI_CHECK(dst_token >= 0 && dst_token <= nd && count <= nd - dst_token,
            "[copy_tokens] dst tokens [{}, {}) are outside [0, {})", dst_token, dst_token + count,
            nd);
  CAI_CHECK(src_token >= 0 && src_token <= ns && count <= ns - src_token,
            "[copy_tokens] src tokens [{}, {}) are outside [0, {})", src_token, src_token + count,
            ns);
  const int64_t b = dst.size(0), f = dst.size(2);
  if (count == 0 || b == 0 || f == 0) return;
  const size_t es = dtype_size(dst.dtype());
  const size_t width = static_cast<size_t>(count * f) * es;
  const size_t dst_pitch = static_cast<size_t>(nd * f) * es;
  const size_t src_pitch = static_cast<size_t>(ns * f) * es;
  char* d = static_cast<char*>(dst.raw()) + static_cast<size_t>(dst_token * f) * es;
  const char* s = static_cast<const char*>(src.raw()) + static_cast<size_t>(src_token * f) * es;
  if (dst.is_cuda()) {
    kernels::cuda::copy_2d(d, dst_pitch, s, src_pitch, width, static_cast<size_t>(b));
  } else {
    for (int64_t i = 0; i < b; ++i) std::memcpy(d + i * dst_pitch, s + i * src_pitch, width);
  }
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy in fp32 (half logits are converted first, as autocast does).

namespace {
void ce_check(const Tensor& logits, const Tensor& labels, float smoothing) {
  floating("cross_entropy", logits);
  CAI_CHECK(logits.dim() == 2, "[cross_entropy] logits must be [batch, classes], got {}",
            logits.str());
  CAI_CHECK(labels.dtype() == DType::I32 && labels.numel() == logits.size(0),
            "[cross_entropy] labels {} must be int32 with one label per row of {}", labels.str(),
            logits.str());
  CAI_CHECK(smoothing >= 0.0f && smoothing < 1.0f,
            "[cross_entropy] label smoothing {} is outside [0, 1)", smoothing);
  same_device("cross_entropy", logits, labels);
}
}  // namespace

Tensor cross_entropy_fwd(const Tensor& logits_in, const Tensor& labels, float smoothing) {
  ce_check(logits_in, labels, smoothing);
  const Tensor logits = up(logits_in);
  Tensor losses = Tensor::empty({logits.size(0)}, DType::F32, logits.device());
  CAI_DISPATCH(logits, cross_entropy_fwd, f32(logits), labels.data<int32_t>(), f32m(losses),
               logits.size(0), logits.size(1), smoothing);
  return losses;
}

Tensor cross_entropy_bwd(const Tensor& logits_in, const Tensor& labels, float smoothing,
                         float weight) {
  ce_check(logits_in, labels, smoothing);
  const Tensor logits = up(logits_in);
  Tensor d = Tensor::empty(logits.shape(), DType::F32, logits.device());
  CAI_DISPATCH(logits, cross_entropy_bwd, f32(logits), labels.data<int32_t>(), weight, f32m(d),
               logits.size(0), logits.size(1), smoothing);
  return d;
}

void loss_metrics_(Tensor& sums, const Tensor& losses, const Tensor& logits_in,
                   const Tensor& labels) {
  ce_check(logits_in, labels, 0.0f);
  const Tensor logits = up(logits_in);
  CAI_CHECK(sums.dtype() == DType::F32 && sums.numel() == 2,
            "[loss_metrics] sums {} must be fp32 with 2 elements", sums.str());
  CAI_CHECK(losses.dtype() == DType::F32 && losses.numel() == logits.size(0),
            "[loss_metrics] losses {} must be fp32 with one value per row of {}", losses.str(),
            logits.str());
  same_device("loss_metrics", logits, sums);
  same_device("loss_metrics", logits, losses);
  CAI_DISPATCH(logits, loss_metrics, losses.data<float>(), f32(logits), labels.data<int32_t>(),
               logits.size(0), logits.size(1), sums.data<float>());
}

// ---------------------------------------------------------------------------------------------
// Elementwise.

Tensor add(const Tensor& a, const Tensor& b) {
  CAI_CHECK(a.shape() == b.shape(), "[add] shapes differ: {} and {}", a.str(), b.str());
  same_device("add", a, b);
  floating("add", a);
  floating("add", b);
  // fp32 when either operand is (the residual stream), else the operands' half type.
  const DType out = a.dtype() == DType::F32 || b.dtype() == DType::F32 ? DType::F32 : a.dtype();
  Tensor y = Tensor::empty(a.shape(), out, a.device());
  if (a.dtype() == DType::F32 && b.dtype() == DType::F32)
    CAI_DISPATCH(a, add, f32(a), f32(b), f32m(y), a.numel());
  else if (a.is_cuda())
    kernels::cuda::add_t(kdt(a.dtype()), a.raw(), kdt(b.dtype()), b.raw(), kdt(out), y.raw(),
                         a.numel());
  else
    y = as(add(up(a), up(b)), out);
  return y;
}

void add_(Tensor& y, const Tensor& x) {
  axpy_(y, 1.0f, x);
}

std::vector<Tensor> to_dtype(const std::vector<const Tensor*>& ts, DType t) {
  std::vector<Tensor> out(ts.size());
  // fp32 → half on a GPU: batched, kCastMulti tensors per launch.
  std::vector<size_t> batch;
  auto flush = [&] {
    if (batch.empty()) return;
    const float* src[kernels::cuda::kCastMulti];
    void* dst[kernels::cuda::kCastMulti];
    int64_t n[kernels::cuda::kCastMulti];
    for (size_t j = 0; j < batch.size(); ++j) {
      const Tensor& x = *ts[batch[j]];
      out[batch[j]] = Tensor::empty(x.shape(), t, x.device());
      src[j] = f32(x);
      dst[j] = out[batch[j]].raw();
      n[j] = x.numel();
    }
    kernels::cuda::cast_multi(static_cast<int>(batch.size()), src, kdt(t), dst, n);
    batch.clear();
  };
  for (size_t i = 0; i < ts.size(); ++i) {
    const Tensor& x = *ts[i];
    CAI_CHECK(x.defined(), "[to_dtype] tensor {} of {} is undefined", i, ts.size());
    if (x.is_cuda() && x.dtype() == DType::F32 && is_half(t)) {
      batch.push_back(i);
      if (batch.size() == static_cast<size_t>(kernels::cuda::kCastMulti)) flush();
    } else {
      out[i] = x.dtype() == t ? x : x.to(t);
    }
  }
  flush();
  return out;
}

void axpy_(Tensor& y, float alpha, const Tensor& x) {
  CAI_CHECK(y.numel() == x.numel(), "[axpy] sizes differ: {} and {}", y.str(), x.str());
  same_device("axpy", y, x);
  f32_only("axpy", y);
  floating("axpy", x);
  if (x.dtype() == DType::F32) {
    CAI_DISPATCH(y, axpy, alpha, f32(x), f32m(y), y.numel());
  } else if (y.is_cuda()) {
    kernels::cuda::axpy_t(alpha, kdt(x.dtype()), x.raw(), f32m(y), y.numel());
  } else {
    const Tensor xf = up(x);
    kernels::cpu::axpy(alpha, f32(xf), f32m(y), y.numel());
  }
}

void scale_(Tensor& x, float alpha) {
  f32_only("scale", x);
  CAI_DISPATCH(x, scale, alpha, f32m(x), x.numel());
}
void fill_(Tensor& x, float value) {
  f32_only("fill", x);
  CAI_DISPATCH(x, fill, value, f32m(x), x.numel());
}

double sum_squares(const Tensor& x) {
  f32_only("sum_squares", x);
  return x.is_cuda() ? kernels::cuda::sum_squares(f32(x), x.numel())
                     : kernels::cpu::sum_squares(f32(x), x.numel());
}

int64_t count_nonfinite(const Tensor& x) {
  f32_only("count_nonfinite", x);
  if (x.is_cuda()) return kernels::cuda::count_nonfinite(f32(x), x.numel());
  const float* p = f32(x);
  int64_t n = 0;
  for (int64_t i = 0; i < x.numel(); ++i) n += std::isfinite(p[i]) ? 0 : 1;
  return n;
}

}  // namespace cai::ops
