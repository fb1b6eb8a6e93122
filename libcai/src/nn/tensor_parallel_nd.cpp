// The layers' math of the 2d / 2.5d (SUMMA, Tesseract) and 3d tensor-parallel modes: linear and
// LayerNorm with explicit collectives (see cai/nn/tensor_parallel.h for the layouts).
#include "cai/core/error.h"
#include "cai/nn/tensor_parallel.h"
#include "cai/ops/ops.h"

namespace cai::nn {

namespace {

Shape with_last(Shape s, int64_t n) {
  s.back() = n;
  return s;
}

Shape with_first(Shape s, int64_t n) {
  s.front() = n;
  return s;
}

Tensor flat(const Tensor& t) {
  return t.reshape({t.numel()});
}

// The weight in the compute dtype (what SUMMA broadcasts and 3d gathers).
Tensor weight_as(const Linear& l, DType t) {
  return t == DType::F32 ? l.weight.value : l.weight.value.to(t);
}

// 3d: the weight group's blocks [q][out, in/q²] (member-major) <-> the block [out, in/q].
Tensor join_columns(const Tensor& parts, int q, int64_t out, int64_t in_part) {
  Tensor full = Tensor::empty({out, q * in_part, 1}, parts.dtype(), parts.device());
  for (int t = 0; t < q; ++t)
    ops::copy_tokens_(full, t * in_part,
                      parts.narrow(t * out * in_part, out * in_part).reshape({out, in_part, 1}), 0,
                      in_part);
  return full.reshape({out, q * in_part});
}

Tensor split_columns(const Tensor& full, int q) {
  const int64_t out = full.size(0), in_part = full.size(1) / q;
  Tensor parts = Tensor::empty({q * out * in_part}, full.dtype(), full.device());
  const Tensor f3 = full.reshape({out, q * in_part, 1});
  for (int t = 0; t < q; ++t) {
    Tensor dst = parts.narrow(t * out * in_part, out * in_part).reshape({out, in_part, 1});
    ops::copy_tokens_(dst, 0, f3, t * in_part, in_part);
  }
  return parts;
}

struct Groups3d {
  TpGroup in, out;
};
Groups3d groups_3d(int orient) {
  return orient == 0 ? Groups3d{TpGroup::Input, TpGroup::Output}
                     : Groups3d{TpGroup::Output, TpGroup::Input};
}

int member(TensorParallel& tp, TpGroup g) {
  return tp.group(g).rank();
}

}  // namespace

Tensor nd_linear_fwd(TensorParallel& tp, const Tensor& x, Linear& l, int orient) {
  const DType ct = x.dtype();
  const int q = tp.q();
  const Tensor w = weight_as(l, ct);
  CAI_CHECK(x.dim() >= 2, "[{}] expects [samples, ..., features], got {}", l.weight.name, x.str());
  if (tp.mode() != "3d") {
    // SUMMA: step t broadcasts X[·][t] along the row and W[t][·] along the column; the next
    // step's broadcasts are started before this step's multiply.
    const int a = member(tp, TpGroup::Row), b = member(tp, TpGroup::Col);
    auto start = [&](int t) {
      Tensor xb = a == t ? x : Tensor::empty(x.shape(), ct, x.device());
      Tensor wb = b == t ? w : Tensor::empty(w.shape(), ct, w.device());
      return std::make_pair(tp.broadcast_start(TpGroup::Row, xb, t),
                            tp.broadcast_start(TpGroup::Col, wb, t));
    };
    Tensor y;
    auto pending = start(0);
    for (int t = 0; t < q; ++t) {
      const Tensor xt = tp.finish(std::move(pending.first));
      const Tensor wt = tp.finish(std::move(pending.second));
      if (t + 1 < q) pending = start(t + 1);
      Tensor yt = ops::linear_fwd(xt, wt, t == 0 ? &l.bias.value : nullptr, DType::F32);
      if (t == 0)
        y = yt;
      else
        ops::add_(y, yt);
    }
    return ct == DType::F32 ? y : y.to(ct);
  }
  // 3d: gather the input over the input group (along the samples) and the weight over the
  // weight group, multiply, reduce-scatter the partial output over the output group.
  const Groups3d g = groups_3d(orient);
  const int64_t xn = x.numel(), wn = w.numel();
  const Tensor xg = tp.all_gather(g.in, x, std::vector<int64_t>(q, xn))
                        .reshape(with_first(x.shape(), q * x.size(0)));
  const Tensor wg = join_columns(tp.all_gather(TpGroup::Weight, w, std::vector<int64_t>(q, wn)), q,
                                 w.size(0), w.size(1));
  const Tensor yp = ops::linear_fwd(xg, wg, member(tp, g.out) == 0 ? &l.bias.value : nullptr, ct);
  const int64_t yn = yp.numel() / q;
  const Tensor y = tp.finish(tp.reduce_scatter_start(g.out, flat(yp), std::vector<int64_t>(q, yn)));
  return y.reshape(with_last(x.shape(), w.size(0)));
}

Tensor nd_linear_bwd(TensorParallel& tp, const Tensor& x, Linear& l, const Tensor& dy, int orient) {
  const DType ct = x.dtype();
  const int q = tp.q();
  const Tensor w = weight_as(l, ct);
  const Tensor g = dy.dtype() == ct ? dy : dy.to(ct);
  const int64_t xn = x.numel(), wn = w.numel();
  if (tp.mode() != "3d") {
    // Input gradient: dX[·][t] = Σ_a dY[·][a] · W[t][a]: every W[t][a] of the column, one
    // partial per t, reduce-scattered over the row (member t receives block t).
    const Tensor wall = tp.all_gather(TpGroup::Col, w, std::vector<int64_t>(q, wn));
    Tensor staged = Tensor::empty({q * xn}, ct, x.device());
    for (int t = 0; t < q; ++t) {
      const Tensor wt = wall.narrow(t * wn, wn).reshape(w.shape());
      Tensor dst = staged.narrow(t * xn, xn);
      dst.copy_from(flat(ops::linear_bwd(x, wt, g, nullptr, nullptr, true)));
    }
    auto dx = tp.reduce_scatter_start(TpGroup::Row, staged, std::vector<int64_t>(q, xn));
    // Weight gradient: dW[t][a] = Σ_b X[b][t]ᵀ · dY[b][a]: every X[·][t] of the row, one partial
    // per t, reduce-scattered over the column (member t holds W[t][a]), then summed over depth.
    const Tensor xall = tp.all_gather(TpGroup::Row, x, std::vector<int64_t>(q, xn));
    Tensor dws = Tensor::zeros({q * wn}, DType::F32, x.device());
    Tensor db = Tensor::zeros({w.size(0)}, DType::F32, x.device());
    for (int t = 0; t < q; ++t) {
      Tensor dwt = dws.narrow(t * wn, wn).reshape(w.shape());
      ops::linear_bwd(xall.narrow(t * xn, xn).reshape(x.shape()), w, g, &dwt,
                      t == 0 ? &db : nullptr, false);
    }
    Tensor dw = tp.finish(tp.reduce_scatter_start(TpGroup::Col, dws, std::vector<int64_t>(q, wn)));
    if (tp.depth() > 1) dw = tp.all_reduce(TpGroup::Depth, dw);
    ops::add_(l.weight.grad, dw.reshape(w.shape()));
    ops::add_(l.bias.grad, tp.all_reduce(TpGroup::ColDepth, db));
    return tp.finish(std::move(dx)).reshape(x.shape());
  }
  // 3d: gather the output gradient over the output group and the input over the input group;
  // the input gradient is reduce-scattered over the input group, the weight gradient over the
  // weight group, the bias gradient (the same on every output-group member) all-reduced over
  // the weight group.
  const Groups3d gr = groups_3d(orient);
  const Tensor gg = tp.all_gather(gr.out, g, std::vector<int64_t>(q, g.numel()))
                        .reshape(with_first(g.shape(), q * g.size(0)));
  const Tensor xg = tp.all_gather(gr.in, x, std::vector<int64_t>(q, xn))
                        .reshape(with_first(x.shape(), q * x.size(0)));
  const Tensor wg = join_columns(tp.all_gather(TpGroup::Weight, w, std::vector<int64_t>(q, wn)), q,
                                 w.size(0), w.size(1));
  const Tensor dxg = ops::linear_bwd(xg, wg, gg, nullptr, nullptr, true);
  auto dx = tp.reduce_scatter_start(gr.in, flat(dxg), std::vector<int64_t>(q, xn));
  Tensor dwg = Tensor::zeros(wg.shape(), DType::F32, x.device());
  Tensor db = Tensor::zeros({w.size(0)}, DType::F32, x.device());
  ops::linear_bwd(xg, wg, gg, &dwg, &db, false);
  const Tensor dw = tp.finish(
      tp.reduce_scatter_start(TpGroup::Weight, split_columns(dwg, q), std::vector<int64_t>(q, wn)));
  ops::add_(l.weight.grad, dw.reshape(w.shape()));
  ops::add_(l.bias.grad, tp.all_reduce(TpGroup::Weight, db));
  return tp.finish(std::move(dx)).reshape(x.shape());
}

Tensor nd_layernorm_fwd(TensorParallel& tp, const Tensor& x, const LayerNorm& ln, DType out,
                        Tensor* mean, Tensor* rstd) {
  const TpGroup fg = tp.layout(0).feature_group;
  const int64_t features = x.size(-1) * tp.layout(0).features;
  // Two passes, as the whole-row LayerNorm: the mean, then the squared deviations from it.
  Tensor m = tp.all_reduce(fg, ops::layernorm_row_sums(x, Tensor()));
  ops::scale_(m, 1.0f / static_cast<float>(features));
  const Tensor v = tp.all_reduce(fg, ops::layernorm_row_sums(x, m));
  *mean = m;
  return ops::layernorm_split_fwd(x, ln.weight.value, ln.bias.value, m, v, features, ln.eps, out,
                                  rstd);
}

Tensor nd_layernorm_bwd(TensorParallel& tp, const Tensor& x, const LayerNorm& ln,
                        const Tensor& mean, const Tensor& rstd, const Tensor& dy, Tensor* dgamma,
                        Tensor* dbeta) {
  const TpGroup fg = tp.layout(0).feature_group;
  const int64_t features = x.size(-1) * tp.layout(0).features;
  const Tensor sums = tp.all_reduce(
      fg, ops::layernorm_split_bwd_sums(x, ln.weight.value, mean, rstd, dy, dgamma, dbeta));
  return ops::layernorm_split_bwd(x, ln.weight.value, mean, rstd, dy, sums, features);
}

}  // namespace cai::nn
