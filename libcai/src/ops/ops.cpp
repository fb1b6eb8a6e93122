#include "cai/ops/ops.h"

#include "cai/core/error.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/embed.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/linear.h"

// Calls kernels::cuda::fn or kernels::cpu::fn by the device of tensor t.
#define CAI_DISPATCH(t, fn, ...)             \
  do {                                       \
    if ((t).is_cuda())                       \
      ::cai::kernels::cuda::fn(__VA_ARGS__); \
    else                                     \
      ::cai::kernels::cpu::fn(__VA_ARGS__);  \
  } while (0)

namespace cai::ops {

namespace {
const float* f32(const Tensor& t) {
  return t.data<float>();
}
float* f32m(const Tensor& t) {
  return t.data<float>();
}
float* opt(Tensor* t) {
  return t ? t->data<float>() : nullptr;
}

void same_device(const char* op, const Tensor& a, const Tensor& b) {
  CAI_CHECK(a.device() == b.device(), "[{}] tensors on different devices: {} and {}", op, a.str(),
            b.str());
}
void f32_only(const char* op, const Tensor& t) {
  CAI_CHECK(t.dtype() == DType::F32, "[{}] expects fp32 tensors, got {}", op, t.str());
}
void check_grad(const char* op, const char* what, const Tensor* g, const Tensor& like) {
  if (!g) return;
  CAI_CHECK(g->shape() == like.shape() && g->device() == like.device(),
            "[{}] {} gradient {} does not match its parameter {}", op, what, g->str(), like.str());
}
int64_t rows_of(const Tensor& x) {
  return x.numel() / x.size(-1);
}
Shape with_last(const Shape& s, int64_t last) {
  Shape r = s;
  r.back() = last;
  return r;
}
}  // namespace

Tensor linear_fwd(const Tensor& x, const Tensor& w, const Tensor* b) {
  f32_only("linear", x);
  CAI_CHECK(w.dim() == 2, "[linear] weight must be 2-D [out, in], got {}", w.str());
  CAI_CHECK(x.dim() >= 1 && x.size(-1) == w.size(1),
            "[linear] input has {} features, weight expects {}", x.dim() ? x.size(-1) : 0,
            w.size(1));
  same_device("linear", x, w);
  if (b)
    CAI_CHECK(b->dim() == 1 && b->size(0) == w.size(0),
              "[linear] bias {} does not match {} output features", b->str(), w.size(0));
  const int64_t m = rows_of(x), k = w.size(1), n = w.size(0);
  Tensor y = Tensor::empty(with_last(x.shape(), n), DType::F32, x.device());
  CAI_DISPATCH(x, linear_fwd, f32(x), f32(w), b ? f32(*b) : nullptr, f32m(y), m, k, n);
  return y;
}

Tensor linear_bwd(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dw, Tensor* db,
                  bool need_dx) {
  const int64_t m = rows_of(x), k = w.size(1), n = w.size(0);
  CAI_CHECK(dy.shape() == with_last(x.shape(), n), "[linear] grad {} does not match output [{}]",
            dy.str(), fmt::join(with_last(x.shape(), n), ", "));
  check_grad("linear", "weight", dw, w);
  if (db) CAI_CHECK(db->numel() == n, "[linear] bias grad {} has not {} elements", db->str(), n);
  Tensor dx;
  if (need_dx) dx = Tensor::empty(x.shape(), DType::F32, x.device());
  CAI_DISPATCH(x, linear_bwd, f32(x), f32(w), f32(dy), need_dx ? f32m(dx) : nullptr, opt(dw),
               opt(db), m, k, n);
  return dx;
}

Tensor layernorm_fwd(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                     Tensor* mean, Tensor* rstd) {
  f32_only("layernorm", x);
  const int64_t d = x.size(-1), m = rows_of(x);
  CAI_CHECK(gamma.numel() == d && beta.numel() == d,
            "[layernorm] input has {} features, weight {} and bias {} expect {}", d, gamma.numel(),
            beta.numel(), gamma.numel());
  same_device("layernorm", x, gamma);
  Tensor y = Tensor::empty(x.shape(), DType::F32, x.device());
  *mean = Tensor::empty({m}, DType::F32, x.device());
  *rstd = Tensor::empty({m}, DType::F32, x.device());
  CAI_DISPATCH(x, layernorm_fwd, f32(x), f32(gamma), f32(beta), f32m(y), f32m(*mean), f32m(*rstd),
               m, d, eps);
  return y;
}

Tensor layernorm_bwd(const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                     const Tensor& dy, Tensor* dgamma, Tensor* dbeta) {
  CAI_CHECK(dy.shape() == x.shape(), "[layernorm] grad {} does not match input {}", dy.str(),
            x.str());
  check_grad("layernorm", "weight", dgamma, gamma);
  check_grad("layernorm", "bias", dbeta, gamma);
  const int64_t d = x.size(-1), m = rows_of(x);
  Tensor dx = Tensor::empty(x.shape(), DType::F32, x.device());
  CAI_DISPATCH(x, layernorm_bwd, f32(x), f32(gamma), f32(mean), f32(rstd), f32(dy), f32m(dx),
               opt(dgamma), opt(dbeta), m, d);
  return dx;
}

Tensor gelu_fwd(const Tensor& x) {
  f32_only("gelu", x);
  Tensor y = Tensor::empty(x.shape(), DType::F32, x.device());
  CAI_DISPATCH(x, gelu_fwd, f32(x), f32m(y), x.numel());
  return y;
}

Tensor gelu_bwd(const Tensor& x, const Tensor& dy) {
  CAI_CHECK(dy.shape() == x.shape(), "[gelu] grad {} does not match input {}", dy.str(), x.str());
  Tensor dx = Tensor::empty(x.shape(), DType::F32, x.device());
  CAI_DISPATCH(x, gelu_bwd, f32(x), f32(dy), f32m(dx), x.numel());
  return dx;
}

namespace {
void attention_dims(const Tensor& qkv, int64_t heads, int64_t* b, int64_t* n, int64_t* hd) {
  f32_only("attention", qkv);
  CAI_CHECK(qkv.dim() == 3 && qkv.size(2) % 3 == 0,
            "[attention] qkv must be [batch, tokens, 3·dim], got {}", qkv.str());
  const int64_t d = qkv.size(2) / 3;
  CAI_CHECK(heads >= 1 && d % heads == 0, "[attention] dim {} is not divisible by {} heads", d,
            heads);
  *b = qkv.size(0);
  *n = qkv.size(1);
  *hd = d / heads;
}
}  // namespace

Tensor attention_fwd(const Tensor& qkv, int64_t heads, Tensor* probs) {
  int64_t b, n, hd;
  attention_dims(qkv, heads, &b, &n, &hd);
  Tensor out = Tensor::empty({b, n, heads * hd}, DType::F32, qkv.device());
  *probs = Tensor::empty({b, heads, n, n}, DType::F32, qkv.device());
  CAI_DISPATCH(qkv, attention_fwd, f32(qkv), f32m(out), f32m(*probs), b, n, heads, hd);
  return out;
}

Tensor attention_bwd(const Tensor& qkv, const Tensor& probs, const Tensor& dout, int64_t heads) {
  int64_t b, n, hd;
  attention_dims(qkv, heads, &b, &n, &hd);
  CAI_CHECK(dout.shape() == Shape({b, n, heads * hd}),
            "[attention] grad {} does not match output [{}, {}, {}]", dout.str(), b, n, heads * hd);
  Tensor dqkv = Tensor::empty(qkv.shape(), DType::F32, qkv.device());
  CAI_DISPATCH(qkv, attention_bwd, f32(qkv), f32(probs), f32(dout), f32m(dqkv), b, n, heads, hd);
  return dqkv;
}

namespace {
void check_p(const char* op, float p) {
  CAI_CHECK(p >= 0.0f && p < 1.0f, "[{}] probability {} is outside [0, 1)", op, p);
}
}  // namespace

Tensor dropout_fwd(const Tensor& x, float p, RngKey k) {
  check_p("dropout", p);
  f32_only("dropout", x);
  Tensor y = Tensor::empty(x.shape(), DType::F32, x.device());
  CAI_DISPATCH(x, dropout_fwd, f32(x), f32m(y), x.numel(), p, k.seed, k.stream, k.offset);
  return y;
}

Tensor dropout_bwd(const Tensor& dy, float p, RngKey k) {
  check_p("dropout", p);
  Tensor dx = Tensor::empty(dy.shape(), DType::F32, dy.device());
  CAI_DISPATCH(dy, dropout_bwd, f32(dy), f32m(dx), dy.numel(), p, k.seed, k.stream, k.offset);
  return dx;
}

Tensor drop_path_fwd(const Tensor& x, float p, RngKey k) {
  check_p("drop_path", p);
  f32_only("drop_path", x);
  const int64_t b = x.size(0);
  Tensor y = Tensor::empty(x.shape(), DType::F32, x.device());
  CAI_DISPATCH(x, drop_path_fwd, f32(x), f32m(y), b, b ? x.numel() / b : 0, p, k.seed, k.stream,
               k.offset);
  return y;
}

Tensor drop_path_bwd(const Tensor& dy, float p, RngKey k) {
  check_p("drop_path", p);
  const int64_t b = dy.size(0);
  Tensor dx = Tensor::empty(dy.shape(), DType::F32, dy.device());
  CAI_DISPATCH(dy, drop_path_bwd, f32(dy), f32m(dx), b, b ? dy.numel() / b : 0, p, k.seed, k.stream,
               k.offset);
  return dx;
}

Tensor patch_embed_fwd(const Tensor& img, const Tensor& w, const Tensor& b, Tensor* patches) {
  f32_only("patch_embed", img);
  CAI_CHECK(img.dim() == 4, "[patch_embed] image must be [batch, channels, height, width], got {}",
            img.str());
  CAI_CHECK(w.dim() == 4 && w.size(2) == w.size(3),
            "[patch_embed] weight must be [dim, channels, patch, patch], got {}", w.str());
  const int64_t B = img.size(0), C = img.size(1), H = img.size(2), W = img.size(3), p = w.size(2);
  CAI_CHECK(w.size(1) == C, "[patch_embed] image has {} channels, weight expects {}", C, w.size(1));
  CAI_CHECK(H % p == 0 && W % p == 0, "[patch_embed] image {}x{} is not divisible by patch {}", H,
            W, p);
  const int64_t np = (H / p) * (W / p), row = C * p * p;
  *patches = Tensor::empty({B, np, row}, DType::F32, img.device());
  CAI_DISPATCH(img, patchify, f32(img), f32m(*patches), B, C, H, W, p);
  return linear_fwd(*patches, w.reshape({w.size(0), row}), &b);
}

void patch_embed_bwd(const Tensor& patches, const Tensor& w, const Tensor& dy, Tensor* dw,
                     Tensor* db) {
  const int64_t row = patches.size(-1);
  Tensor dw2 = dw ? dw->reshape({w.size(0), row}) : Tensor();
  linear_bwd(patches, w.reshape({w.size(0), row}), dy, dw ? &dw2 : nullptr, db, false);
}

Tensor cls_pos_fwd(const Tensor& tokens, const Tensor& cls, const Tensor& pos) {
  f32_only("cls_pos", tokens);
  CAI_CHECK(tokens.dim() == 3, "[cls_pos] tokens must be [batch, patches, dim], got {}",
            tokens.str());
  const int64_t B = tokens.size(0), np = tokens.size(1), d = tokens.size(2);
  CAI_CHECK(cls.numel() == d, "[cls_pos] class token {} does not have dim {}", cls.str(), d);
  CAI_CHECK(pos.numel() == (np + 1) * d,
            "[cls_pos] position embedding {} does not fit {} tokens of dim {}", pos.str(), np + 1,
            d);
  Tensor out = Tensor::empty({B, np + 1, d}, DType::F32, tokens.device());
  CAI_DISPATCH(tokens, cls_pos_fwd, f32(tokens), f32(cls), f32(pos), f32m(out), B, np, d);
  return out;
}

Tensor cls_pos_bwd(const Tensor& dout, Tensor* dcls, Tensor* dpos) {
  const int64_t B = dout.size(0), np = dout.size(1) - 1, d = dout.size(2);
  Tensor dt = Tensor::empty({B, np, d}, DType::F32, dout.device());
  CAI_DISPATCH(dout, cls_pos_bwd, f32(dout), f32m(dt), opt(dcls), opt(dpos), B, np, d);
  return dt;
}

Tensor select_token_fwd(const Tensor& x, int64_t index) {
  f32_only("select_token", x);
  CAI_CHECK(x.dim() == 3 && index >= 0 && index < x.size(1),
            "[select_token] token {} out of range for {}", index, x.str());
  Tensor out = Tensor::empty({x.size(0), x.size(2)}, DType::F32, x.device());
  CAI_DISPATCH(x, select_token_fwd, f32(x), f32m(out), x.size(0), x.size(1), x.size(2), index);
  return out;
}

Tensor select_token_bwd(const Tensor& dout, int64_t n, int64_t index) {
  Tensor dx = Tensor::empty({dout.size(0), n, dout.size(1)}, DType::F32, dout.device());
  CAI_DISPATCH(dout, select_token_bwd, f32(dout), f32m(dx), dout.size(0), n, dout.size(1), index);
  return dx;
}

namespace {
void ce_check(const Tensor& logits, const Tensor& labels, float smoothing) {
  f32_only("cross_entropy", logits);
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

Tensor cross_entropy_fwd(const Tensor& logits, const Tensor& labels, float smoothing) {
  ce_check(logits, labels, smoothing);
  Tensor losses = Tensor::empty({logits.size(0)}, DType::F32, logits.device());
  CAI_DISPATCH(logits, cross_entropy_fwd, f32(logits), labels.data<int32_t>(), f32m(losses),
               logits.size(0), logits.size(1), smoothing);
  return losses;
}

Tensor cross_entropy_bwd(const Tensor& logits, const Tensor& labels, float smoothing,
                         float weight) {
  ce_check(logits, labels, smoothing);
  Tensor d = Tensor::empty(logits.shape(), DType::F32, logits.device());
  CAI_DISPATCH(logits, cross_entropy_bwd, f32(logits), labels.data<int32_t>(), weight, f32m(d),
               logits.size(0), logits.size(1), smoothing);
  return d;
}

Tensor add(const Tensor& a, const Tensor& b) {
  CAI_CHECK(a.shape() == b.shape(), "[add] shapes differ: {} and {}", a.str(), b.str());
  same_device("add", a, b);
  Tensor y = Tensor::empty(a.shape(), DType::F32, a.device());
  CAI_DISPATCH(a, add, f32(a), f32(b), f32m(y), a.numel());
  return y;
}

void add_(Tensor& y, const Tensor& x) {
  axpy_(y, 1.0f, x);
}

void axpy_(Tensor& y, float alpha, const Tensor& x) {
  CAI_CHECK(y.numel() == x.numel(), "[axpy] sizes differ: {} and {}", y.str(), x.str());
  same_device("axpy", y, x);
  CAI_DISPATCH(y, axpy, alpha, f32(x), f32m(y), y.numel());
}

void scale_(Tensor& x, float alpha) {
  CAI_DISPATCH(x, scale, alpha, f32m(x), x.numel());
}
void fill_(Tensor& x, float value) {
  CAI_DISPATCH(x, fill, value, f32m(x), x.numel());
}

double sum_squares(const Tensor& x) {
  return x.is_cuda() ? kernels::cuda::sum_squares(f32(x), x.numel())
                     : kernels::cpu::sum_squares(f32(x), x.numel());
}

}  // namespace cai::ops
