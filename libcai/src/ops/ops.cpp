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

#include "ops_internal.h"

namespace cai::ops {

using namespace detail;  // ops_internal.h

// ---------------------------------------------------------------------------------------------
// Linear: the compute dtype is the input's. Half inputs use the weight (and bias) rounded to that
// dtype, fp32 accumulation, and fp32 weight/bias gradients (the master gradients).

Tensor linear_fwd(const Tensor& x, const Tensor& w, const Tensor* b) {
  return linear_fwd(x, w, b, x.dtype());
}

Tensor linear_fwd(const Tensor& x, const Tensor& w, const Tensor* b, DType out) {
  floating("linear", x);
  CAI_CHECK(w.dim() == 2, "[linear] weight must be 2-D [out, in], got {}", w.str());
  CAI_CHECK(x.dim() >= 1 && x.size(-1) == w.size(1),
            "[linear] input has {} features, weight expects {}", x.dim() ? x.size(-1) : 0,
            w.size(1));
  same_device("linear", x, w);
  if (b)
    CAI_CHECK(b->dim() == 1 && b->size(0) == w.size(0),
              "[linear] bias {} does not match {} output features", b->str(), w.size(0));
  const DType t = x.dtype();
  CAI_CHECK(out == t || out == DType::F32,
            "[linear] output dtype {} must be the input's ({}) or fp32", dtype_name(out),
            dtype_name(t));
  const int64_t m = rows_of(x), k = w.size(1), n = w.size(0);
  Tensor y = Tensor::empty(with_last(x.shape(), n), out, x.device());
  if (t == DType::F32) {
    f32_only("linear", w);
    CAI_DISPATCH(x, linear_fwd, f32(x), f32(w), b ? f32(*b) : nullptr, f32m(y), m, k, n);
    return y;
  }
  const Tensor wc = as(w, t);
  const Tensor bc = b ? as(*b, out) : Tensor();
  if (x.is_cuda()) {
    kernels::cuda::linear_fwd_t(kdt(t), x.raw(), wc.raw(), b ? bc.raw() : nullptr, kdt(out),
                                y.raw(), m, k, n);
    return y;
  }
  // CPU reference: fp32 math on the rounded operands.
  const Tensor bf = b ? up(bc) : Tensor();
  return as(linear_fwd(up(x), up(wc), b ? &bf : nullptr), out);
}

Tensor linear_fwd_residual(const Tensor& x, const Tensor& w, const Tensor* b, const Tensor& r) {
  floating("linear", x);
  CAI_CHECK(w.dim() == 2 && x.dim() >= 1 && x.size(-1) == w.size(1),
            "[linear] input {} and weight {}: expected [..., K] and [N, K]", x.str(), w.str());
  CAI_CHECK(r.shape() == with_last(x.shape(), w.size(0)) && r.dtype() == DType::F32,
            "[linear] residual {}: expected fp32 [{}]", r.str(),
            fmt::join(with_last(x.shape(), w.size(0)), ", "));
  same_device("linear", x, r);
  if (b) f32_only("linear", *b);
  const DType t = x.dtype();
  if (t == DType::F32 || !x.is_cuda()) return add(r, linear_fwd(x, w, b, DType::F32));
  same_device("linear", x, w);
  CAI_CHECK(b == nullptr || (b->dim() == 1 && b->size(0) == w.size(0)),
            "[linear] bias {} does not match {} output features", b ? b->str() : "", w.size(0));
  const int64_t m = rows_of(x), k = w.size(1), n = w.size(0);
  Tensor y = Tensor::empty(r.shape(), DType::F32, x.device());
  const Tensor wc = as(w, t);
  kernels::cuda::linear_fwd_residual_t(kdt(t), x.raw(), wc.raw(), b ? f32(*b) : nullptr, f32(r),
                                       f32m(y), m, k, n);
  return y;
}

Tensor linear_bwd(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dw, Tensor* db,
                  bool need_dx) {
  floating("linear", x);
  const int64_t m = rows_of(x), k = w.size(1), n = w.size(0);
  CAI_CHECK(dy.shape() == with_last(x.shape(), n), "[linear] grad {} does not match output [{}]",
            dy.str(), fmt::join(with_last(x.shape(), n), ", "));
  check_grad("linear", "weight", dw, w);
  if (db) {
    CAI_CHECK(db->numel() == n, "[linear] bias grad {} has not {} elements", db->str(), n);
    f32_only("linear", *db);
  }
  const DType t = x.dtype();
  Tensor dx;
  if (need_dx) dx = Tensor::empty(x.shape(), t, x.device());
  if (t == DType::F32) {
    f32_only("linear", w);
    const Tensor dyf = as(dy, DType::F32);
    CAI_DISPATCH(x, linear_bwd, f32(x), f32(w), f32(dyf), need_dx ? f32m(dx) : nullptr, opt(dw),
                 opt(db), m, k, n);
    return dx;
  }
  const Tensor wc = as(w, t), dyc = as(dy, t);
  if (x.is_cuda()) {
    kernels::cuda::linear_bwd_t(kdt(t), x.raw(), wc.raw(), dyc.raw(), need_dx ? dx.raw() : nullptr,
                                opt(dw), opt(db), m, k, n);
    return dx;
  }
  const Tensor dxf = linear_bwd(up(x), up(wc), up(dyc), dw, db, need_dx);
  return need_dx ? as(dxf, t) : dx;
}

Tensor linear_bwd_input(const Tensor& w, const Tensor& dy, DType t) {
  floating_dtype("linear", t);
  floating("linear", dy);
  CAI_CHECK(w.dim() == 2 && dy.dim() >= 1 && dy.size(-1) == w.size(0),
            "[linear] grad {} does not match weight {} ([out, in])", dy.str(), w.str());
  same_device("linear", w, dy);
  const int64_t k = w.size(1), n = w.size(0), m = n > 0 ? dy.numel() / n : 0;
  Tensor dx = Tensor::empty(with_last(dy.shape(), k), t, dy.device());
  if (t == DType::F32) {
    f32_only("linear", w);
    const Tensor dyf = as(dy, DType::F32);
    CAI_DISPATCH(dy, linear_bwd, nullptr, f32(w), f32(dyf), f32m(dx), nullptr, nullptr, m, k, n);
    return dx;
  }
  const Tensor wc = as(w, t), dyc = as(dy, t);
  if (dy.is_cuda()) {
    kernels::cuda::linear_bwd_t(kdt(t), nullptr, wc.raw(), dyc.raw(), dx.raw(), nullptr, nullptr, m,
                                k, n);
    return dx;
  }
  return as(linear_bwd_input(up(wc), up(dyc), DType::F32), t);
}

void linear_bwd_weight(const Tensor& x, const Tensor& dy, Tensor* dw, Tensor* db) {
  floating("linear", x);
  const int64_t m = rows_of(x), k = x.size(-1), n = dy.size(-1);
  CAI_CHECK(dy.shape() == with_last(x.shape(), n) && dy.device() == x.device(),
            "[linear] grad {} does not match input {}", dy.str(), x.str());
  if (dw) {
    CAI_CHECK(dw->shape() == Shape({n, k}) && dw->device() == x.device(),
              "[linear] weight gradient {} does not match [{}, {}]", dw->str(), n, k);
    f32_only("linear", *dw);
  }
  if (db) {
    CAI_CHECK(db->numel() == n, "[linear] bias grad {} has not {} elements", db->str(), n);
    f32_only("linear", *db);
  }
  const DType t = x.dtype();
  if (t == DType::F32) {
    const Tensor dyf = as(dy, DType::F32);
    CAI_DISPATCH(x, linear_bwd, f32(x), nullptr, f32(dyf), nullptr, opt(dw), opt(db), m, k, n);
    return;
  }
  const Tensor dyc = as(dy, t);
  if (x.is_cuda()) {
    kernels::cuda::linear_bwd_t(kdt(t), x.raw(), nullptr, dyc.raw(), nullptr, opt(dw), opt(db), m,
                                k, n);
    return;
  }
  linear_bwd_weight(up(x), up(dyc), dw, db);
}

// ---------------------------------------------------------------------------------------------
// LayerNorm: statistics and parameters in fp32; the input, output and gradients in any float type.

Tensor layernorm_fwd(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                     Tensor* mean, Tensor* rstd) {
  return layernorm_fwd(x, gamma, beta, eps, mean, rstd, x.dtype());
}

Tensor layernorm_fwd(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                     Tensor* mean, Tensor* rstd, DType out) {
  floating("layernorm", x);
  floating_dtype("layernorm", out);
  const int64_t d = x.size(-1), m = rows_of(x);
  CAI_CHECK(gamma.numel() == d && beta.numel() == d,
            "[layernorm] input has {} features, weight {} and bias {} expect {}", d, gamma.numel(),
            beta.numel(), gamma.numel());
  f32_only("layernorm", gamma);
  same_device("layernorm", x, gamma);
  Tensor y = Tensor::empty(x.shape(), out, x.device());
  *mean = Tensor::empty({m}, DType::F32, x.device());
  *rstd = Tensor::empty({m}, DType::F32, x.device());
  if (x.dtype() == DType::F32 && out == DType::F32) {
    CAI_DISPATCH(x, layernorm_fwd, f32(x), f32(gamma), f32(beta), f32m(y), f32m(*mean), f32m(*rstd),
                 m, d, eps);
  } else if (x.is_cuda()) {
    kernels::cuda::layernorm_fwd_t(kdt(x.dtype()), x.raw(), f32(gamma), f32(beta), kdt(out),
                                   y.raw(), f32m(*mean), f32m(*rstd), m, d, eps);
  } else {
    y = as(layernorm_fwd(up(x), gamma, beta, eps, mean, rstd), out);
  }
  return y;
}

namespace {
// The LayerNorm backward's operands: dy a float tensor of x's shape, the parameter gradients fp32
// of gamma's shape where given.
void check_layernorm_bwd(const Tensor& x, const Tensor& gamma, const Tensor& dy,
                         const Tensor* dgamma, const Tensor* dbeta) {
  floating("layernorm", dy);
  CAI_CHECK(dy.shape() == x.shape(), "[layernorm] grad {} does not match input {}", dy.str(),
            x.str());
  check_grad("layernorm", "weight", dgamma, gamma);
  check_grad("layernorm", "bias", dbeta, gamma);
}
}  // namespace

Tensor layernorm_bwd(const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                     const Tensor& dy, Tensor* dgamma, Tensor* dbeta) {
  floating("layernorm", x);
  check_layernorm_bwd(x, gamma, dy, dgamma, dbeta);
  const int64_t d = x.size(-1), m = rows_of(x);
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (x.dtype() == DType::F32 && dy.dtype() == DType::F32) {
    CAI_DISPATCH(x, layernorm_bwd, f32(x), f32(gamma), f32(mean), f32(rstd), f32(dy), f32m(dx),
                 opt(dgamma), opt(dbeta), m, d);
  } else if (x.is_cuda()) {
    kernels::cuda::layernorm_bwd_t(kdt(x.dtype()), x.raw(), f32(gamma), f32(mean), f32(rstd),
                                   kdt(dy.dtype()), dy.raw(), kdt(x.dtype()), dx.raw(), opt(dgamma),
                                   opt(dbeta), m, d);
  } else {
    dx = as(layernorm_bwd(up(x), gamma, mean, rstd, up(dy), dgamma, dbeta), x.dtype());
  }
  return dx;
}

Tensor layernorm_bwd_add(const Tensor& x, const Tensor& gamma, const Tensor& mean,
                         const Tensor& rstd, const Tensor& dy, const Tensor& residual,
                         Tensor* dgamma, Tensor* dbeta, DType half, Tensor* half_out, Tensor* dsum,
                         bool dsum_add) {
  CAI_CHECK(residual.shape() == x.shape() && residual.dtype() == x.dtype(),
            "[layernorm] residual {} must match input {} in shape and dtype", residual.str(),
            x.str());
  same_device("layernorm", x, residual);
  CAI_CHECK(!half_out || half == DType::BF16 || half == DType::F16,
            "[layernorm] the half copy's dtype {} must be bf16 or fp16", dtype_name(half));
  if (dsum) {
    CAI_CHECK(dsum->defined() && dsum->numel() == x.size(-1),
              "[layernorm] column sums {} must hold one value for each of the {} features",
              dsum->defined() ? dsum->str() : "(undefined)", x.size(-1));
    f32_only("layernorm", *dsum);
    same_device("layernorm", x, *dsum);
  }
  if (!x.is_cuda() || x.dtype() != DType::F32) {
    // The reference (and half residual streams): the three steps, then the column sums of what
    // the next GEMM takes, as its own bias gradient sums them (linear_bwd's db).
    Tensor dx = layernorm_bwd(x, gamma, mean, rstd, dy, dgamma, dbeta);
    add_(dx, residual);
    if (half_out) *half_out = as(dx, half);
    if (dsum) {
      const Tensor taken = as(half_out ? *half_out : dx, DType::F32);
      if (!dsum_add) ops::fill_(*dsum, 0.0f);
      const int64_t d = x.size(-1);
      if (taken.is_cuda())
        kernels::cuda::linear_bwd_t(kdt(DType::F32), nullptr, nullptr, taken.raw(), nullptr,
                                    nullptr, f32m(*dsum), rows_of(x), 1, d);
      else
        kernels::cpu::linear_bwd(nullptr, nullptr, f32(taken), nullptr, nullptr, f32m(*dsum),
                                 rows_of(x), 1, d);
    }
    return dx;
  }
  check_layernorm_bwd(x, gamma, dy, dgamma, dbeta);
  const int64_t d = x.size(-1), m = rows_of(x);
  Tensor dx = Tensor::empty(x.shape(), DType::F32, x.device());
  if (half_out) *half_out = Tensor::empty(x.shape(), half, x.device());
  kernels::cuda::layernorm_bwd_add_t(kdt(DType::F32), x.raw(), f32(gamma), f32(mean), f32(rstd),
                                     kdt(dy.dtype()), dy.raw(), kdt(DType::F32), dx.raw(),
                                     residual.raw(), kdt(half_out ? half : DType::BF16),
                                     half_out ? half_out->raw() : nullptr, opt(dgamma), opt(dbeta),
                                     dsum ? f32m(*dsum) : nullptr, dsum_add, m, d);
  return dx;
}

// ---------------------------------------------------------------------------------------------
// LayerNorm over a hidden dimension split across ranks. Half x and dy are converted to fp32 and
// the fp32 kernels run on either device (on the CPU that is the reference's rounding; results are
// rounded to their dtype at the end).

namespace {
// x's features on this rank (f); x must be a float tensor with at least one.
int64_t split_features(const Tensor& x) {
  floating("layernorm", x);
  CAI_CHECK(x.dim() >= 1 && x.size(-1) >= 1, "[layernorm] input {} has no features", x.str());
  return x.size(-1);
}
// A per-row fp32 statistic of x: one value per row, on x's device.
void check_row_stat(const char* what, const Tensor& t, const Tensor& x) {
  CAI_CHECK(t.defined() && t.numel() == rows_of(x),
            "[layernorm] {} {} must hold one value for each of the {} rows of input {}", what,
            t.str(), rows_of(x), x.str());
  f32_only("layernorm", t);
  same_device("layernorm", x, t);
}
// gamma (and beta) are this rank's f columns, fp32, on x's device.
void check_split_params(const Tensor& x, const Tensor& gamma, const Tensor* beta) {
  const int64_t f = x.size(-1);
  CAI_CHECK(gamma.defined() && gamma.numel() == f,
            "[layernorm] weight {} does not match the {} features of input {} on this rank",
            gamma.str(), f, x.str());
  f32_only("layernorm", gamma);
  same_device("layernorm", x, gamma);
  if (!beta) return;
  CAI_CHECK(beta->defined() && beta->numel() == f,
            "[layernorm] bias {} does not match the {} features of input {} on this rank",
            beta->str(), f, x.str());
  f32_only("layernorm", *beta);
  same_device("layernorm", x, *beta);
}
void check_features(int64_t features, int64_t f) {
  CAI_CHECK(features >= f, "[layernorm] {} features in all are fewer than this rank's {}", features,
            f);
}
void check_dy(const Tensor& dy, const Tensor& x) {
  floating("layernorm", dy);
  CAI_CHECK(dy.shape() == x.shape(), "[layernorm] grad {} does not match input {}", dy.str(),
            x.str());
  same_device("layernorm", x, dy);
}
}  // namespace

Tensor layernorm_row_sums(const Tensor& x, const Tensor& mean) {
  const int64_t f = split_features(x), m = rows_of(x);
  if (mean.defined()) check_row_stat("mean", mean, x);
  const Tensor xf = up(x);
  Tensor sums = Tensor::empty({m}, DType::F32, x.device());
  CAI_DISPATCH(x, layernorm_row_sums, f32(xf), mean.defined() ? f32(mean) : nullptr, f32m(sums), m,
               f);
  return sums;
}

Tensor layernorm_split_fwd(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                           const Tensor& mean, const Tensor& sqdev, int64_t features, float eps,
                           DType out, Tensor* rstd) {
  const int64_t f = split_features(x), m = rows_of(x);
  floating_dtype("layernorm", out);
  check_split_params(x, gamma, &beta);
  check_row_stat("mean", mean, x);
  check_row_stat("squared deviation sum", sqdev, x);
  check_features(features, f);
  const Tensor xf = up(x);
  Tensor y = Tensor::empty(x.shape(), DType::F32, x.device());
  Tensor rs = Tensor::empty({m}, DType::F32, x.device());
  CAI_DISPATCH(x, layernorm_split_fwd, f32(xf), f32(gamma), f32(beta), f32(mean), f32(sqdev),
               f32m(y), f32m(rs), m, f, features, eps);
  if (rstd) *rstd = rs;
  return as(y, out);
}

Tensor layernorm_split_bwd_sums(const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                const Tensor& rstd, const Tensor& dy, Tensor* dgamma,
                                Tensor* dbeta) {
  const int64_t f = split_features(x), m = rows_of(x);
  check_dy(dy, x);
  check_split_params(x, gamma, nullptr);
  check_row_stat("mean", mean, x);
  check_row_stat("rstd", rstd, x);
  check_grad("layernorm", "weight", dgamma, gamma);
  check_grad("layernorm", "bias", dbeta, gamma);
  const Tensor xf = up(x), dyf = up(dy);
  Tensor sums = Tensor::empty({m, 2}, DType::F32, x.device());
  CAI_DISPATCH(x, layernorm_split_bwd_sums, f32(xf), f32(gamma), f32(mean), f32(rstd), f32(dyf),
               f32m(sums), opt(dgamma), opt(dbeta), m, f);
  return sums;
}

Tensor layernorm_split_bwd(const Tensor& x, const Tensor& gamma, const Tensor& mean,
                           const Tensor& rstd, const Tensor& dy, const Tensor& sums,
                           int64_t features) {
  const int64_t f = split_features(x), m = rows_of(x);
  check_dy(dy, x);
  check_split_params(x, gamma, nullptr);
  check_row_stat("mean", mean, x);
  check_row_stat("rstd", rstd, x);
  CAI_CHECK(sums.defined() && sums.shape() == Shape({m, 2}),
            "[layernorm] row sums {} must be [{}, 2] for input {}", sums.str(), m, x.str());
  f32_only("layernorm", sums);
  same_device("layernorm", x, sums);
  check_features(features, f);
  const Tensor xf = up(x), dyf = up(dy);
  Tensor dx = Tensor::empty(x.shape(), DType::F32, x.device());
  CAI_DISPATCH(x, layernorm_split_bwd, f32(xf), f32(gamma), f32(mean), f32(rstd), f32(dyf),
               f32(sums), f32m(dx), m, f, features);
  return as(dx, x.dtype());
}

// ---------------------------------------------------------------------------------------------
// GELU, attention, dropout, drop-path: same dtype in and out; fp32 math.

Tensor gelu_fwd(const Tensor& x, Gelu kind) {
  floating("gelu", x);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (kind == Gelu::Tanh) {
    if (x.is_cuda())
      kernels::cuda::gelu_tanh_fwd_t(kdt(x.dtype()), x.raw(), y.raw(), x.numel());
    else if (x.dtype() == DType::F32)
      kernels::cpu::gelu_tanh_fwd(f32(x), f32m(y), x.numel());
    else
      y = as(gelu_fwd(up(x), kind), x.dtype());
  } else if (x.dtype() == DType::F32) {
    CAI_DISPATCH(x, gelu_fwd, f32(x), f32m(y), x.numel());
  } else if (x.is_cuda()) {
    kernels::cuda::gelu_fwd_t(kdt(x.dtype()), x.raw(), y.raw(), x.numel());
  } else {
    y = as(gelu_fwd(up(x)), x.dtype());
  }
  return y;
}

Tensor gelu_bwd(const Tensor& x, const Tensor& dy_in, Gelu kind) {
  floating("gelu", x);
  CAI_CHECK(dy_in.shape() == x.shape(), "[gelu] grad {} does not match input {}", dy_in.str(),
            x.str());
  const Tensor dy = as(dy_in, x.dtype());
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (kind == Gelu::Tanh) {
    if (x.is_cuda())
      kernels::cuda::gelu_tanh_bwd_t(kdt(x.dtype()), x.raw(), dy.raw(), dx.raw(), x.numel());
    else if (x.dtype() == DType::F32)
      kernels::cpu::gelu_tanh_bwd(f32(x), f32(dy), f32m(dx), x.numel());
    else
      dx = as(gelu_bwd(up(x), up(dy), kind), x.dtype());
  } else if (x.dtype() == DType::F32) {
    CAI_DISPATCH(x, gelu_bwd, f32(x), f32(dy), f32m(dx), x.numel());
  } else if (x.is_cuda()) {
    kernels::cuda::gelu_bwd_t(kdt(x.dtype()), x.raw(), dy.raw(), dx.raw(), x.numel());
  } else {
    dx = as(gelu_bwd(up(x), up(dy)), x.dtype());
  }
  return dx;
}

Tensor gelu_bwd_bias(const Tensor& x, const Tensor& dy_in, Gelu kind, Tensor* db, Tensor* y) {
  floating("gelu", x);
  CAI_CHECK(dy_in.shape() == x.shape(), "[gelu] grad {} does not match input {}", dy_in.str(),
            x.str());
  const int64_t n = x.dim() ? x.size(-1) : 1, m = x.numel() / std::max<int64_t>(n, 1);
  CAI_CHECK(db && db->numel() == n && db->device() == x.device(),
            "[gelu] bias gradient {} must hold the {} features of {}", db ? db->str() : "null", n,
            x.str());
  f32_only("gelu", *db);
  if (x.is_cuda()) {
    const Tensor dy = as(dy_in, x.dtype());
    Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
    if (y) *y = Tensor::empty(x.shape(), x.dtype(), x.device());
    kernels::cuda::gelu_bwd_bias_t(kdt(x.dtype()), kind == Gelu::Tanh, x.raw(), dy.raw(), dx.raw(),
                                   f32m(*db), m, n, y ? y->raw() : nullptr);
    return dx;
  }
  // The reference: the GELU's backward, then the column sums in double, row order; the output
  // again by the forward itself.
  Tensor dx = gelu_bwd(x, dy_in, kind);
  const auto v = up(dx).to_vector();
  float* b = f32m(*db);
  for (int64_t j = 0; j < n; ++j) {
    double acc = 0;
    for (int64_t i = 0; i < m; ++i) acc += v[i * n + j];
    b[j] += static_cast<float>(acc);
  }
  if (y) *y = gelu_fwd(x, kind);
  return dx;
}

Tensor linear_gelu_fwd(const Tensor& x, const Tensor& w, const Tensor& b, Tensor* pre) {
  if (x.is_cuda()) {
    floating("linear_gelu", x);
    CAI_CHECK(w.dim() == 2 && x.dim() >= 1 && x.size(-1) == w.size(1) && b.dim() == 1 &&
                  b.size(0) == w.size(0),
              "[linear_gelu] input {}, weight {} and bias {} do not fit [.., in], [out, in], [out]",
              x.str(), w.str(), b.str());
    same_device("linear_gelu", x, w);
    const DType t = x.dtype();
    const int64_t m = rows_of(x), k = w.size(1), n = w.size(0);
    const Tensor wc = as(w, t), bc = as(b, t);
    *pre = Tensor::empty(with_last(x.shape(), n), t, x.device());
    Tensor y = Tensor::empty(with_last(x.shape(), n), t, x.device());
    kernels::cuda::linear_gelu_fwd_t(kdt(t), x.raw(), wc.raw(), bc.raw(), pre->raw(), y.raw(), m, k,
                                     n);
    return y;
  }
  *pre = linear_fwd(x, w, &b);
  return gelu_fwd(*pre, Gelu::Tanh);
}

Tensor linear_dgelu_bwd(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& pre,
                        Tensor* dw, Tensor* db) {
  if (x.is_cuda()) {
    floating("linear_dgelu", x);
    const int64_t m = rows_of(x), k = w.size(1), n = w.size(0);
    CAI_CHECK(dy.shape() == with_last(x.shape(), n) && pre.shape() == x.shape() &&
                  pre.dtype() == x.dtype(),
              "[linear_dgelu] grad {} and pre-activation {} do not fit input {} and weight {}",
              dy.str(), pre.str(), x.str(), w.str());
    check_grad("linear_dgelu", "weight", dw, w);
    if (db)
      CAI_CHECK(db->numel() == n, "[linear_dgelu] bias grad {} has not {} elements", db->str(), n);
    const DType t = x.dtype();
    const Tensor wc = as(w, t), dyc = as(dy, t);
    Tensor dpre = Tensor::empty(x.shape(), t, x.device());
    kernels::cuda::linear_bwd_dgelu_t(kdt(t), x.raw(), wc.raw(), dyc.raw(), pre.raw(), dpre.raw(),
                                      opt(dw), opt(db), m, k, n);
    return dpre;
  }
  return gelu_bwd(pre, linear_bwd(x, w, dy, dw, db), Gelu::Tanh);
}

namespace {
void attention_dims(const Tensor& qkv, int64_t heads, int64_t* b, int64_t* n, int64_t* hd) {
  floating("attention", qkv);
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

// Half precision on a GPU runs the fused (flash) kernel where it supports the head size: it saves
// the fp32 log-sum-exp of each score row [b, h, n] instead of the probabilities [b, h, n, n].
Tensor attention_fwd(const Tensor& qkv, int64_t heads, Tensor* saved) {
  int64_t b, n, hd;
  attention_dims(qkv, heads, &b, &n, &hd);
  const DType t = qkv.dtype();
  Tensor out = Tensor::empty({b, n, heads * hd}, t, qkv.device());
  if (t == DType::F32) {
    *saved = Tensor::empty({b, heads, n, n}, t, qkv.device());
    CAI_DISPATCH(qkv, attention_fwd, f32(qkv), f32m(out), f32m(*saved), b, n, heads, hd);
  } else if (qkv.is_cuda() && kernels::cuda::flash_attention_supported(kdt(t), hd)) {
    *saved = Tensor::empty({b, heads, n}, DType::F32, qkv.device());
    kernels::cuda::flash_attention_fwd_t(kdt(t), qkv.raw(), out.raw(), f32m(*saved), b, n, heads,
                                         hd);
  } else if (qkv.is_cuda()) {
    *saved = Tensor::empty({b, heads, n, n}, t, qkv.device());
    kernels::cuda::attention_fwd_t(kdt(t), qkv.raw(), out.raw(), saved->raw(), b, n, heads, hd);
  } else {
    Tensor pf;
    out = as(attention_fwd(up(qkv), heads, &pf), t);
    *saved = as(pf, t);
  }
  return out;
}

bool attention_bwd_sums_bias(const Tensor& saved) {
  return saved.dim() == 3;
}

Tensor attention_bwd(const Tensor& qkv, const Tensor& out, const Tensor& saved,
                     const Tensor& dout_in, int64_t heads, Tensor* dbias) {
  int64_t b, n, hd;
  attention_dims(qkv, heads, &b, &n, &hd);
  CAI_CHECK(dout_in.shape() == Shape({b, n, heads * hd}),
            "[attention] grad {} does not match output [{}, {}, {}]", dout_in.str(), b, n,
            heads * hd);
  const DType t = qkv.dtype();
  const Tensor dout = as(dout_in, t);
  Tensor dqkv = Tensor::empty(qkv.shape(), t, qkv.device());
  if (saved.dim() == 3) {  // log-sum-exp from the fused forward
    CAI_CHECK(qkv.is_cuda() && t != DType::F32 && saved.dtype() == DType::F32 &&
                  saved.shape() == Shape({b, heads, n}) && out.shape() == dout.shape() &&
                  out.dtype() == t,
              "[attention] fused backward needs half qkv/out on a GPU and fp32 log-sum-exp "
              "[{}, {}, {}], got {}, {} and {}",
              b, heads, n, qkv.str(), out.str(), saved.str());
    if (dbias) {
      CAI_CHECK(dbias->dtype() == DType::F32 && dbias->numel() == 3 * heads * hd,
                "[attention] bias gradient {} must be fp32 with {} values", dbias->str(),
                3 * heads * hd);
      same_device("attention", qkv, *dbias);
    }
    kernels::cuda::flash_attention_bwd_t(kdt(t), qkv.raw(), out.raw(), f32(saved), dout.raw(),
                                         dqkv.raw(), b, n, heads, hd,
                                         dbias ? f32m(*dbias) : nullptr);
    return dqkv;
  }
  CAI_CHECK(!dbias,
            "[attention] the bias gradient is summed only by the fused GPU backward "
            "(attention_bwd_sums_bias)");
  CAI_CHECK(saved.dtype() == t && saved.shape() == Shape({b, heads, n, n}),
            "[attention] probabilities {} must be [{}, {}, {}, {}] in the dtype of qkv {}",
            saved.str(), b, heads, n, n, qkv.str());
  if (t == DType::F32)
    CAI_DISPATCH(qkv, attention_bwd, f32(qkv), f32(saved), f32(dout), f32m(dqkv), b, n, heads, hd);
  else if (qkv.is_cuda())
    kernels::cuda::attention_bwd_t(kdt(t), qkv.raw(), saved.raw(), dout.raw(), dqkv.raw(), b, n,
                                   heads, hd);
  else
    dqkv = as(attention_bwd(up(qkv), out, up(saved), up(dout), heads), t);
  return dqkv;
}

namespace {
void check_p(const char* op, float p) {
  CAI_CHECK(p >= 0.0f && p < 1.0f, "[{}] probability {} is outside [0, 1)", op, p);
}
// Dropout's forward and backward apply the same mask and scale; `fwd` picks the fp32 kernel.
Tensor dropout_any(const char* op, const Tensor& x, float p, RngKey k, bool fwd) {
  check_p(op, p);
  floating(op, x);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (k.row > 0) {
    constexpr auto kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    CAI_CHECK(k.row_stride >= k.row && k.row_stride <= kMax,
              "[{}] RngKey row_stride {} must be in [row, 2^63) with row {}", op, k.row_stride,
              k.row);
    const auto row = static_cast<int64_t>(k.row), stride = static_cast<int64_t>(k.row_stride);
    if (x.is_cuda())
      kernels::cuda::dropout_strided_t(kdt(x.dtype()), x.raw(), y.raw(), x.numel(), p, k.seed,
                                       k.stream, k.offset, row, stride);
    else if (x.dtype() == DType::F32)
      kernels::cpu::dropout_strided(f32(x), f32m(y), x.numel(), p, k.seed, k.stream, k.offset, row,
                                    stride);
    else
      y = as(dropout_any(op, up(x), p, k, fwd), x.dtype());
  } else if (x.dtype() == DType::F32) {
    if (fwd)
      CAI_DISPATCH(x, dropout_fwd, f32(x), f32m(y), x.numel(), p, k.seed, k.stream, k.offset);
    else
      CAI_DISPATCH(x, dropout_bwd, f32(x), f32m(y), x.numel(), p, k.seed, k.stream, k.offset);
  } else if (x.is_cuda()) {
    kernels::cuda::dropout_fwd_t(kdt(x.dtype()), x.raw(), y.raw(), x.numel(), p, k.seed, k.stream,
                                 k.offset);
  } else {
    y = as(dropout_any(op, up(x), p, k, fwd), x.dtype());
  }
  return y;
}
Tensor drop_path_any(const char* op, const Tensor& x, float p, RngKey k, bool fwd) {
  check_p(op, p);
  floating(op, x);
  const int64_t b = x.size(0), per = b ? x.numel() / b : 0;
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (x.dtype() == DType::F32) {
    if (fwd)
      CAI_DISPATCH(x, drop_path_fwd, f32(x), f32m(y), b, per, p, k.seed, k.stream, k.offset);
    else
      CAI_DISPATCH(x, drop_path_bwd, f32(x), f32m(y), b, per, p, k.seed, k.stream, k.offset);
  } else if (x.is_cuda()) {
    kernels::cuda::drop_path_fwd_t(kdt(x.dtype()), x.raw(), y.raw(), b, per, p, k.seed, k.stream,
                                   k.offset);
  } else {
    y = as(drop_path_any(op, up(x), p, k, fwd), x.dtype());
  }
  return y;
}
}  // namespace

Tensor dropout_fwd(const Tensor& x, float p, RngKey k) {
  return dropout_any("dropout", x, p, k, true);
}
Tensor dropout_bwd(const Tensor& dy, float p, RngKey k) {
  return dropout_any("dropout", dy, p, k, false);
}
Tensor drop_path_fwd(const Tensor& x, float p, RngKey k) {
  return drop_path_any("drop_path", x, p, k, true);
}
Tensor drop_path_bwd(const Tensor& dy, float p, RngKey k) {
  return drop_path_any("drop_path", dy, p, k, false);
}

}  // namespace cai::ops
